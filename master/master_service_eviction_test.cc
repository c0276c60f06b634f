// MasterService tests: LRU eviction, read leases and tenant quotas
// (master_service_eviction.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE("A full node evicts in least-recently-used order") {
  Harness h("evict_lru");
  const uint32_t a = h.Register("a", 1, {{0, 8 * kSlot}});
  for (int i = 0; i < 8; ++i) h.Put({"k" + std::to_string(i)}, kObj);
  CHECK(h.UsedBytes(a) == 8 * kSlot);
  // Fresh writes are evictable at once (a commit grants no lease): the
  // oldest write goes.
  CHECK(h.Put({"n0"}, kObj) == a);
  CHECK(h.Found({"k0", "k1"}) == "01");

  // Reads make k3 and k1 the most recent (k1 last).
  h.Read({"k3"});
  h.Read({"k1"});
  // A plain lookup changes nothing: k4 stays old.
  h.Lookup({"k4"});
  // A for_read lookup touches only the hit prefix: k5 after a miss is not.
  CHECK(h.Read({"k2", "missing", "k5"}).hit_prefix_length() == 1);
  h.clock.Advance(absl::Seconds(6));  // leases over
  h.Heartbeat(a, 1);
  // Order now, least recent first: k4 k5 k6 k7 n0 k3 k1 k2.
  h.Put({"n1"}, kObj);
  CHECK(h.Found({"k4", "k5", "k6"}) == "011");
  h.Put({"n2"}, kObj);
  h.Put({"n3"}, kObj);
  h.Put({"n4"}, kObj);
  CHECK(h.Found({"k5", "k6", "k7", "n0", "k3", "k1", "k2"}) == "0001111");
  h.Put({"n5"}, kObj);
  CHECK(h.Found({"n0", "k3", "k1", "k2"}) == "0111");
  h.Put({"n6"}, kObj);
  CHECK(h.Found({"k3", "k1", "k2"}) == "011");

  const auto c = h.svc->counters();
  CHECK(c.evicted_objects == 7);
  CHECK(c.evicted_bytes == 7 * kObj);
  const auto stats = h.svc->GetStats();
  CHECK(stats.evicted_objects() == 7);
  CHECK(stats.evicted_bytes() == 7 * kObj);
  CHECK(stats.object_count() == 8);
  CHECK(stats.object_bytes() == 8 * kObj);
  CHECK(stats.nodes(0).object_count() == 8);
  CHECK(h.UsedBytes(a) == 8 * kSlot);
}

TEST_CASE("Eviction takes a chain's tail before its head") {
  Harness h("evict_chain");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  // One commit of a chain: c3 extends c2 extends c1 extends c0.
  h.Put({"c0", "c1", "c2", "c3"}, kObj);
  h.Put({"x"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "x"}) == "11101");
  h.Put({"y"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "x", "y"}) == "11011");

  // A read of the chain touches it tail first too: afterwards c1 is older
  // than c0, and both are newer than x and y.
  h.Read({"c0", "c1"});
  h.clock.Advance(absl::Seconds(6));
  h.Heartbeat(a, 1);
  h.Put({"p"}, kObj);
  h.Put({"q"}, kObj);
  CHECK(h.Found({"c0", "c1", "x", "y", "p", "q"}) == "110011");
  h.Put({"r"}, kObj);
  CHECK(h.Found({"c0", "c1"}) == "10");
  h.Put({"s"}, kObj);
  CHECK(h.Found({"c0"}) == "0");
}

TEST_CASE("Evictions are logged at most once per 10 s, summed") {
  Harness h("evict_log");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  for (int i = 0; i < 4; ++i) h.Put({"k" + std::to_string(i)}, kObj);
  testing::LogCapture log;
  // A full node: every put evicts one object, 20 batches at once.
  for (int i = 0; i < 20; ++i) CHECK(h.Put({"n" + std::to_string(i)}, kObj) == a);
  CHECK(log.Count("to make room") == 1);
  CHECK(log.Count("evicted 1 objects (1000 bytes) to make room, in 1 batch;") ==
        1);
  h.clock.Advance(absl::Seconds(10));
  h.Heartbeat(a, 1);
  CHECK(h.Put({"last"}, kObj) == a);
  // The 19 batches after the first line and this one, in one line.
  CHECK(log.Count("to make room") == 2);
  CHECK(log.Count("evicted 20 objects (20000 bytes) to make room, in 20 "
                  "batches over the last 10s; the last from node") == 1);
}

TEST_CASE("Objects read within the lease are never evicted") {
  Harness h("evict_lease");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  for (const char* k : {"a", "b", "c", "d"}) h.Put({k}, kObj);
  h.Read({"a", "b"});  // order now: c d b a; a and b leased
  h.Put({"e"}, kObj);
  h.Put({"f"}, kObj);
  CHECK(h.Found({"a", "b", "c", "d", "e", "f"}) == "110011");

  // Order: b a e f. The walk stops at b (leased) although e and f could go.
  auto refused = h.svc->PutStart(PutReq({"g"}, {kObj}));
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(refused.status().message().find("leased") != std::string::npos);
  CHECK(h.svc->counters().evicted_objects == 2);
  CHECK(h.svc->GetStats().pending_puts() == 0);
  CHECK(h.UsedBytes(a) == 4 * kSlot);

  // Everything leased.
  h.Read({"e", "f"});
  h.clock.Advance(absl::Milliseconds(4999));
  CHECK(h.svc->PutStart(PutReq({"g"}, {kObj})).status().code() ==
        StatusCode::kResourceExhausted);
  CHECK(h.Found({"a", "b", "e", "f"}) == "1111");
  // A lease lasts read_lease from the read: a and b (read first) expire,
  // e and f were read at the same instant here, so all four expire at 5 s.
  h.clock.Advance(absl::Milliseconds(1));
  CHECK(h.Put({"g"}, kObj) == a);
  CHECK(h.Found({"a", "b", "e", "f", "g"}) == "10111");  // b was least recent
  CHECK(h.svc->counters().evicted_objects == 3);
}

TEST_CASE("A tenant over its quota evicts its own least recently used objects first") {
  Harness h("tenant_quota");
  h.Register("a", 1, {{0, 64 * kSlot}});
  auto A = [](const std::string& k) { return QualifyKey("alpha", k); };
  auto B = [](const std::string& k) { return QualifyKey("beta", k); };
  const TenantLimit three{3, 0};
  auto put = [&](std::vector<std::string> keys, const TenantLimit& q,
                 bool* over = nullptr) {
    return h.svc->PutStart(PutReq(keys, std::vector<uint64_t>(keys.size(), kObj)),
                           "", q, over);
  };
  auto put_commit = [&](std::vector<std::string> keys, const TenantLimit& q) {
    auto r = put(keys, q);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    h.Commit(*r);
  };
  // Beta's objects are older than all of alpha's: a global LRU would take
  // them first.
  for (const char* k : {"b1", "b2", "b3"}) put_commit({B(k)}, {});
  for (const char* k : {"a1", "a2", "a3"}) put_commit({A(k)}, three);
  CHECK(h.svc->UsageOfTenant("alpha").objects == 3);

  // A fourth object of alpha: alpha's least recently used one goes.
  h.Read({A("a1")});
  h.clock.Advance(absl::Seconds(10));  // past the read lease
  bool over = true;
  auto r = put({A("a4")}, three, &over);
  REQUIRE(r.ok());
  CHECK_FALSE(over);
  h.Commit(*r);
  CHECK(h.Found({A("a1"), A("a2"), A("a3"), A("a4")}) == "1011");
  CHECK(h.Found({B("b1"), B("b2"), B("b3")}) == "111");
  CHECK(h.svc->counters().tenant_evicted_objects == 1);
  CHECK(h.svc->counters().evicted_objects == 1);

  // Pending puts count: two more pending leave room for none.
  auto p1 = put({A("a5"), A("a6")}, three);  // evicts two (a3, a4 or a1)
  REQUIRE(p1.ok());
  CHECK(h.svc->counters().tenant_evicted_objects == 3);
  CHECK(h.svc->QuotaEvictionsByTenant() ==
        absl::flat_hash_map<std::string, uint64_t>{{"alpha", 3}});
  over = false;
  auto refused = put({A("a7"), A("a8")}, three, &over);
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(refused.status().message().find("quota") != std::string::npos);
  CHECK(over);
  CHECK(h.svc->counters().puts_over_tenant_quota == 1);
  CHECK(h.svc->counters().tenant_evicted_objects == 3);  // planned: none went
  h.Commit(*p1);
  CHECK(h.svc->UsageOfTenant("alpha").objects == 3);

  // Leased objects stay: with all three read just now, nothing may go.
  h.Read({A("a5"), A("a6")});
  std::string last;
  for (const char* k : {"a1", "a2", "a3", "a4"}) {
    if (h.Found({A(k)}) == "1") last = A(k);
  }
  REQUIRE_FALSE(last.empty());
  h.Read({last});
  over = false;
  refused = put({A("a9")}, three, &over);
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(over);
  CHECK(h.svc->UsageOfTenant("alpha").objects == 3);

  // A byte quota, and a put larger than the quota by itself.
  const TenantLimit bytes{0, 2 * kObj};
  over = false;
  refused = put({B("b4"), B("b5"), B("b6")}, bytes, &over);
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(over);
  CHECK(h.Found({B("b1"), B("b2"), B("b3")}) == "111");
  auto ok = put({B("b4")}, bytes);  // beta holds 3: two of its own go
  REQUIRE(ok.ok());
  h.Commit(*ok);
  CHECK(h.Found({B("b1"), B("b2"), B("b3"), B("b4")}) == "0011");
  CHECK(h.svc->UsageOfTenant("beta").bytes == 2 * kObj);
  CHECK(h.svc->QuotaEvictionsByTenant() ==
        absl::flat_hash_map<std::string, uint64_t>{{"alpha", 3}, {"beta", 2}});
  // Other tenants never lost anything to alpha's or beta's quota.
  CHECK(h.svc->UsageOfTenant("alpha").objects == 3);
}

TEST_CASE("A renewed read extends the lease") {
  Harness h("evict_renew");
  const uint32_t a = h.Register("a", 1, {{0, 2 * kSlot}});
  h.Put({"a"}, kObj);
  h.Put({"b"}, kObj);
  h.Read({"a", "b"});
  h.clock.Advance(absl::Seconds(4));
  h.Read({"b"});  // b's lease runs 4 s longer than a's
  h.clock.Advance(absl::Seconds(2));
  h.Heartbeat(a, 1);
  CHECK(h.Put({"c"}, kObj) == a);  // a's lease is over
  CHECK(h.Found({"a", "b"}) == "01");
  CHECK(h.svc->PutStart(PutReq({"d"}, {kObj})).status().code() ==
        StatusCode::kResourceExhausted);  // order b c: b still leased
  h.clock.Advance(absl::Seconds(3));
  h.Heartbeat(a, 1);
  h.Put({"d"}, kObj);
  CHECK(h.Found({"b", "c", "d"}) == "011");
}

TEST_CASE("read_lease = 0 leaves reads evictable but still recent") {
  Harness h("evict_nolease",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 2 * kSlot}});
  h.Put({"a"}, kObj);
  h.Put({"b"}, kObj);
  h.Read({"a"});
  h.Put({"c"}, kObj);
  CHECK(h.Found({"a", "b", "c"}) == "101");
  h.Read({"a"});
  h.Put({"d"}, kObj);
  CHECK(h.Found({"a", "c", "d"}) == "101");
}

TEST_CASE("Leases survive the read tick base moving (no wrap-around)") {
  Harness h("evict_ticks");
  const uint32_t a = h.Register("a", 1, {{0, 2 * kSlot}});
  h.Put({"a"}, kObj);
  h.Put({"b"}, kObj);
  h.Read({"a"});
  // 2^32 ms later a 32-bit millisecond tick would equal a's read tick and
  // lease it again.
  h.clock.Advance(absl::Milliseconds(int64_t{1} << 32));
  h.Heartbeat(a, 1);
  h.Read({"b"});  // b: now the most recent and leased; order a b
  CHECK(h.Put({"c"}, kObj) == a);
  CHECK(h.Found({"a", "b", "c"}) == "011");
  // b's lease holds across the move of the base, then ends.
  CHECK(h.svc->PutStart(PutReq({"d"}, {kObj})).status().code() ==
        StatusCode::kResourceExhausted);  // order b c
  h.clock.Advance(absl::Hours(600));  // another base move
  h.Heartbeat(a, 1);
  h.Read({"c"});
  CHECK(h.Put({"d"}, kObj) == a);  // b (lease long over) goes, not c
  CHECK(h.Found({"b", "c", "d"}) == "011");
}

TEST_CASE("Without a preferred node eviction happens on the next node in turn") {
  Harness h("evict_rr");
  const uint32_t a = h.Register("a", 1, {{0, 1 * kSlot}});
  const uint32_t b = h.Register("b", 1, {{0, 1 * kSlot}}, 7100);
  const uint32_t first = h.Put({"k0"}, kObj);
  const uint32_t second = h.Put({"k1"}, kObj);
  CHECK(first != second);
  // Both full: evictions alternate like placements.
  CHECK(h.Put({"k2"}, kObj) == first);
  CHECK(h.Put({"k3"}, kObj) == second);
  CHECK(h.Found({"k0", "k1", "k2", "k3"}) == "0011");
  CHECK(std::set<uint32_t>{first, second} == std::set<uint32_t>{a, b});
}

TEST_CASE("Evicted space is reused under a higher generation") {
  Harness h("evict_generation");
  h.Register("a", 1, {{0, 1 * kSlot}});
  auto r1 = h.Start({"old"}, {kObj});
  h.Commit(r1);
  const v1::Location old_loc = r1.slots(0).location();
  auto r2 = h.Start({"new"}, {kObj});
  REQUIRE(r2.slots(0).state() == v1::SLOT_ALLOCATED);
  const v1::Location& new_loc = r2.slots(0).location();
  CHECK(new_loc.node_id() == old_loc.node_id());
  CHECK(new_loc.region_id() == old_loc.region_id());
  CHECK(new_loc.addr() == old_loc.addr());
  CHECK(new_loc.generation() > old_loc.generation());
  CHECK(h.Found({"old"}) == "0");
  h.Commit(r2);
  CHECK(h.Lookup({"new"}).results(0).location().generation() ==
        new_loc.generation());
}

TEST_CASE("Pending puts and the call's existing keys are never evicted") {
  Harness h("evict_pending");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  auto pending = h.Start({"p1", "p2"}, {kObj, kObj});
  h.Put({"a"}, kObj);
  h.Put({"b"}, kObj);
  // Room for 2 more only by evicting a and b; 3 cannot fit without
  // touching the pending space: refused, and nothing is evicted.
  auto three = h.svc->PutStart(PutReq({"x", "y", "z"}, {kObj, kObj, kObj}));
  CHECK(three.status().code() == StatusCode::kResourceExhausted);
  CHECK(h.svc->counters().evicted_objects == 0);
  CHECK(h.Found({"a", "b"}) == "11");
  // "a" is the least recent, but this call reports it as existing: b goes.
  auto r = h.Start({"a", "c"}, {kObj, kObj});
  CHECK(r.slots(0).state() == v1::SLOT_EXISTS);
  CHECK(r.slots(1).state() == v1::SLOT_ALLOCATED);
  h.Commit(r);
  CHECK(h.Found({"a", "b", "c"}) == "101");
  // The pending put commits where it was told to.
  CHECK(h.Commit(pending) == 2);
  auto got = h.Lookup({"p1", "p2"});
  CHECK(got.hit_prefix_length() == 2);
  CHECK(got.results(0).location().SerializeAsString() ==
        pending.slots(0).location().SerializeAsString());
  CHECK(h.UsedBytes(a) == 4 * kSlot);
}

TEST_CASE("Eviction with mixed object sizes frees just enough") {
  Harness h("evict_sizes");
  const uint32_t a = h.Register("a", 1, {{0, 8192}});
  // Allocated: a 1024 @0, b 3008 @1024, c 2048 @4032, d 2048 @6080; 64 free.
  h.Put({"a"}, 1000);
  h.Put({"b"}, 3000);
  h.Put({"c"}, 2000);
  h.Put({"d"}, 2000);
  CHECK(h.UsedBytes(a) == 8128);
  // 4032 bytes: a and b (adjacent, 4032 together) suffice.
  auto r = h.Start({"e"}, {4000});
  CHECK(r.slots(0).location().addr() == 0);
  h.Commit(r);
  CHECK(h.Found({"a", "b", "c", "d", "e"}) == "00111");
  CHECK(h.svc->counters().evicted_objects == 2);
  CHECK(h.svc->counters().evicted_bytes == 4000);
  // A small object fits the 64 free bytes: no eviction.
  h.Put({"tiny"}, 10);
  CHECK(h.svc->counters().evicted_objects == 2);
  CHECK(h.Found({"c", "d", "e", "tiny"}) == "1111");
}

TEST_CASE("Eviction evicts more when the freed space is fragmented") {
  Harness h("evict_fragmented");
  const uint32_t a = h.Register("a", 1, {{0, 8192}});
  for (const char* k : {"a", "b", "c", "d"}) h.Put({k}, 2048);  // @0 2048 4096 6144
  h.Read({"b"});
  h.Read({"d"});
  h.clock.Advance(absl::Seconds(6));
  h.Heartbeat(a, 1);
  // Order a c b d. 4096 bytes: a + c free enough bytes but not adjacent;
  // one more (b) joins them.
  auto r = h.Start({"e"}, {4096});
  CHECK(r.slots(0).location().addr() == 0);
  CHECK(h.Found({"a", "b", "c", "d"}) == "0001");
  CHECK(h.svc->counters().evicted_objects == 3);
}

TEST_CASE("Eviction is capped per PutStart and plans before it evicts") {
  Harness h("evict_cap", [](MasterServiceOptions& o) {
    o.max_evictions_per_put = 2;
  });
  h.Register("a", 1, {{0, 4 * kSlot}});
  for (const char* k : {"a", "b", "c", "d"}) h.Put({k}, kObj);
  auto big = h.svc->PutStart(PutReq({"x", "y", "z"}, {kObj, kObj, kObj}));
  CHECK(big.status().code() == StatusCode::kResourceExhausted);
  CHECK(h.svc->counters().evicted_objects == 0);
  CHECK(h.Found({"a", "b", "c", "d"}) == "1111");
  // Larger than the node: refused without evicting.
  auto huge = h.svc->PutStart(PutReq({"h"}, {8 * kSlot}));
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(h.svc->counters().evicted_objects == 0);
  h.Put({"x", "y"}, kObj);
  CHECK(h.Found({"a", "b", "c", "d", "x", "y"}) == "001111");
}

TEST_CASE("max_evictions_per_put = 0 never evicts") {
  Harness h("evict_off", [](MasterServiceOptions& o) {
    o.max_evictions_per_put = 0;
  });
  h.Register("a", 1, {{0, 1 * kSlot}});
  h.Put({"a"}, kObj);
  CHECK(h.svc->PutStart(PutReq({"b"}, {kObj})).status().code() ==
        StatusCode::kResourceExhausted);
  CHECK(h.Found({"a"}) == "1");
}

TEST_CASE("A failed eviction write evicts nothing") {
  FakeClock clock;
  auto fake = std::make_unique<FakeMetadataStore>();
  FakeMetadataStore* store = fake.get();
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  o.clock = &clock;
  auto svc = MasterService::Create(o, std::move(fake));
  REQUIRE(svc.ok());
  MasterService& s = **svc;
  REQUIRE(Reg(&s, NodeReq("a", 1, {{0, kSlot}})).ok());
  auto put = s.PutStart(PutReq({"k1"}, {kObj}));
  REQUIRE(put.ok());
  v1::PutCommitRequest c;
  c.set_put_id(put->put_id());
  AddReceipts(*put, &c);
  REQUIRE(s.PutCommit(c).ok());
  store->FailWritesForTest(absl::UnavailableError("disk on fire"));
  CHECK(s.PutStart(PutReq({"k2"}, {kObj})).status().code() ==
        StatusCode::kUnavailable);
  CHECK(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
  CHECK(s.counters().evicted_objects == 0);
  CHECK(store->object_count() == 1);
  store->FailWritesForTest(absl::OkStatus());
  REQUIRE(s.PutStart(PutReq({"k2"}, {kObj})).ok());
  CHECK_FALSE(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
  CHECK(store->object_count() == 0);
}

TEST_CASE("Concurrent puts, reads and evictions") {
  Harness h("evict_concurrent");
  h.Register("a", 1, {{0, 64 * kSlot}});
  h.Register("b", 1, {{0, 64 * kSlot}}, 7100);
  // Per thread, per stored key: its parent and the node it went to.
  struct Stored {
    std::string parent;
    uint32_t node;
  };
  std::vector<std::map<std::string, Stored>> stored(4);
  {
    std::vector<Thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back("svc-test", [&h, &stored, t] {
        // Conversations of 10 turns; a refused turn starts a new one.
        std::string parent;
        for (int i = 0; i < 300; ++i) {
          if (i % 10 == 0) parent.clear();
          std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
          v1::PutStartRequest req = PutReq({key, key + "x"}, {kObj, kObj});
          req.set_parent_key(parent);
          auto r = h.svc->PutStart(req);
          if (r.ok() && r->put_id() != 0) {
            stored[t][key] = {parent, r->node().node_id()};
            stored[t][key + "x"] = {key, r->node().node_id()};
            v1::PutCommitRequest c;
            c.set_put_id(r->put_id());
            AddReceipts(*r, &c);
            h.svc->PutCommit(c).IgnoreError();
          }
          std::vector<std::string> keys = {key, key + "x"};
          if (!parent.empty()) keys.insert(keys.begin(), parent);
          v1::BatchLookupRequest look = LookupReq(keys);
          look.set_for_read(i % 2 == 0);
          h.svc->BatchLookup(look).IgnoreError();
          parent = r.ok() ? key + "x" : "";
          if (i % 37 == 5) {
            v1::RemoveRequest rm;  // a middle block: its tail goes too
            rm.add_keys(key);
            h.svc->Remove(rm).IgnoreError();
          }
          if (i % 50 == 0) {
            h.clock.Advance(absl::Seconds(6));
            for (uint32_t id : {1u, 2u}) {
              v1::HeartbeatRequest hb;
              hb.set_node_id(id);
              hb.set_incarnation(1);
              Hb(h.svc.get(), hb).IgnoreError();
            }
          }
          if (i % 20 == 0) h.svc->GetStats();
          if (i % 25 == 0) h.svc->ReapExpired();
        }
      });
    }
  }
  const auto stats = h.svc->GetStats();
  CHECK(stats.object_count() <= 128);
  CHECK(stats.evicted_objects() > 0);
  CHECK(stats.object_count() + stats.evicted_objects() <= 4 * 300 * 2);
  // No block outlived the block before it on its node.
  for (const auto& per_thread : stored) {
    for (const auto& [key, s] : per_thread) {
      if (s.parent.empty() || h.Found({key}) == "0") continue;
      auto p = per_thread.find(s.parent);
      REQUIRE(p != per_thread.end());
      if (p->second.node != s.node) continue;  // continued on another node
      INFO(key << " outlived its parent " << s.parent);
      CHECK(h.Found({s.parent}) == "1");
    }
  }
}

TEST_CASE("Eviction never strands a tail of a chain stored turn by turn") {
  // The reported defect: a full 8 x 1 MiB node, read lease 0, chains grown
  // one block per turn (read the prefix, store the next block).
  Harness h("evict_turns",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint32_t a = h.Register("a", 1, {{0, 8 * kMiB}});
  std::map<std::string, std::vector<std::string>> chains = {{"A", {}},
                                                            {"B", {}}};
  for (int turn = 0; turn < 4; ++turn) {
    for (auto& [name, chain] : chains) {
      const std::string key = name + std::to_string(turn);
      if (chain.empty()) {
        h.Put({key}, kMiB);
      } else {
        REQUIRE(h.Read(chain).hit_prefix_length() == chain.size());
        h.PutChild({key}, kMiB, chain.back());
      }
      chain.push_back(key);
      h.clock.Advance(absl::Seconds(1));
    }
  }
  REQUIRE(h.UsedBytes(a) == 8 * kMiB);
  // New conversations push them out one block at a time.
  for (int i = 0; i < 8; ++i) {
    h.Put({"n" + std::to_string(i)}, kMiB);
    for (const auto& [name, chain] : chains) {
      const std::string found = h.Found(chain);
      INFO("after " << i + 1 << " evictions chain " << name << ": " << found);
      CHECK(NoStrandedTail(found));
    }
  }
  CHECK(h.svc->counters().evicted_objects == 8);
  CHECK(h.Found(chains["A"]) == "0000");
  CHECK(h.Found(chains["B"]) == "0000");
}

TEST_CASE("Two continuations of one prefix go before the prefix") {
  Harness h("evict_branches",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 6 * kSlot}});
  h.Put({"p0", "p1"}, kObj);
  REQUIRE(h.Read({"p0", "p1"}).hit_prefix_length() == 2);
  h.PutChild({"a1", "a2"}, kObj, "p1");
  REQUIRE(h.Read({"p0", "p1"}).hit_prefix_length() == 2);
  h.PutChild({"b1"}, kObj, "p1");
  h.Put({"x"}, kObj);
  const std::vector<std::string> branch_a = {"p0", "p1", "a1", "a2"};
  const std::vector<std::string> branch_b = {"p0", "p1", "b1"};
  for (int i = 0; i < 6; ++i) {
    h.Put({"n" + std::to_string(i)}, kObj);
    INFO("after " << i + 1 << " evictions: " << h.Found(branch_a) << " "
                  << h.Found(branch_b));
    CHECK(NoStrandedTail(h.Found(branch_a)));
    CHECK(NoStrandedTail(h.Found(branch_b)));
  }
  // Both branches (the older first), then the prefix, then x.
  CHECK(h.Found({"p0", "p1", "a1", "a2", "b1", "x"}) == "000000");
}

TEST_CASE(
    "An ended conversation's own blocks are evicted first, not the prefix it "
    "shares") {
  Harness h("evict_ended", [](MasterServiceOptions& o) {
    o.read_lease = absl::ZeroDuration();
  });
  const uint32_t a = h.Register("a", 1, {{0, 7 * kSlot}});
  // A system prompt s shared by conversations A and B, and an older
  // conversation x.
  h.Put({"x0", "x1"}, kObj);
  h.clock.Advance(absl::Seconds(1));
  h.Put({"s"}, kObj);
  h.PutChild({"a1", "a2"}, kObj, "s");
  REQUIRE(h.Read({"s"}).hit_prefix_length() == 1);
  h.PutChild({"b1", "b2"}, kObj, "s");
  REQUIRE(h.UsedBytes(a) == 7 * kSlot);

  // A ended. The answer is a plain lookup's; for_read with ended is refused.
  v1::BatchLookupRequest ended = LookupReq({"s", "a1", "a2"});
  ended.set_ended(true);
  auto r = h.svc->BatchLookup(ended);
  REQUIRE(r.ok());
  CHECK(r->hit_prefix_length() == 3);
  CHECK(h.svc->counters().ended_chain_blocks_demoted == 2);
  ended.set_for_read(true);
  CHECK(h.svc->BatchLookup(ended).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // New puts take A's blocks, tail first, before the older x; then x; the
  // shared s stays while B is stored.
  h.Put({"n0"}, kObj);
  CHECK(h.Found({"s", "a1", "a2", "x0", "x1"}) == "11011");
  h.Put({"n1"}, kObj);
  CHECK(h.Found({"s", "a1", "a2", "x0", "x1"}) == "10011");
  h.Put({"n2"}, kObj);
  CHECK(h.Found({"x0", "x1", "s", "b1", "b2"}) == "10111");
  CHECK(h.svc->counters().evicted_objects == 3);
}

TEST_CASE(
    "Under the cost policy a full node evicts the chain whose next read is "
    "farthest off, not the least recent") {
  Harness h("evict_cost", [](MasterServiceOptions& o) {
    o.read_lease = absl::Seconds(1);
    o.eviction_policy = EvictionPolicy::kCost;
  });
  const uint32_t a = h.Register("a", 1, {{0, 3 * kSlot}});
  auto advance = [&](absl::Duration d) {  // heartbeats every 3 s at most
    for (; d > absl::ZeroDuration(); d -= absl::Seconds(3)) {
      h.clock.Advance(std::min(d, absl::Seconds(3)));
      h.Heartbeat(a, 1);
    }
  };
  // g comes back every 12 s: the tenant's return gaps are all about 12 s.
  h.Put({"g"}, kObj);
  h.Put({"p"}, kObj);
  h.Put({"q"}, kObj);
  for (int i = 0; i < 4; ++i) {
    if (i > 0) advance(absl::Seconds(12));
    REQUIRE(h.Read({"g"}).hit_prefix_length() == 1);
  }
  // t = 37: p read; t = 43: q read; t = 46: a put needs room. LRU would
  // take g (read at 36), then p. With gaps of 12 s, g and p are due in
  // two or three seconds, q in about nine: q goes.
  advance(absl::Seconds(1));
  h.Read({"p"});
  advance(absl::Seconds(6));
  h.Read({"q"});
  advance(absl::Seconds(3));
  h.Put({"n"}, kObj);
  CHECK(h.Found({"g", "p", "q", "n"}) == "1101");

  // An ended chain still goes first: p, though it would be back within
  // seconds.
  v1::BatchLookupRequest ended = LookupReq({"p"});
  ended.set_ended(true);
  REQUIRE(h.svc->BatchLookup(ended).ok());
  h.Put({"m"}, kObj);
  CHECK(h.Found({"g", "p", "n", "m"}) == "1011");
  CHECK(h.svc->counters().evicted_objects == 2);
}

TEST_CASE(
    "Under the cost policy a chain loses its tail first, and a shallow block "
    "goes before a deep one") {
  Harness h("evict_cost_chain", [](MasterServiceOptions& o) {
    o.read_lease = absl::ZeroDuration();
    o.eviction_policy = EvictionPolicy::kCost;
  });
  h.Register("a", 1, {{0, 4 * kSlot}});
  h.Put({"c0", "c1", "c2", "c3"}, kObj);
  // The chain's tail is the only evictable block (the others have a child).
  h.Put({"n0"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "n0"}) == "11101");
  // No gaps learned yet: position alone. c2 saves more prefill than n0, a
  // chain head, though n0 is the more recent.
  h.Put({"n1"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "n0", "n1"}) == "11101");
  CHECK(h.svc->counters().evicted_objects == 2);
}

TEST_CASE(
    "Under the cost policy a tenant whose hinted turns seldom come back loses "
    "its blocks first") {
  // One run per policy: LRU takes the least recent block, the cost policy
  // the block of the tenant whose turns do not come back.
  for (const EvictionPolicy policy :
       {EvictionPolicy::kLru, EvictionPolicy::kCost}) {
    CAPTURE(EvictionPolicyName(policy));
    Harness h(absl::StrCat("evict_turns_", EvictionPolicyName(policy)),
              [&](MasterServiceOptions& o) {
                o.read_lease = absl::ZeroDuration();
                o.eviction_policy = policy;
                o.eviction_cost.turn_horizon = absl::Seconds(10);
              });
    const uint32_t a = h.Register("a", 1, {{0, 3 * kSlot}});
    const std::string ax = QualifyKey("ta", "x"), by = QualifyKey("tb", "y");
    const std::string ac = QualifyKey("ta", "c"), bc = QualifyKey("tb", "c");
    const std::string bd = QualifyKey("tb", "d"), be = QualifyKey("tb", "e");
    auto hint = [&](const std::string& key) {
      v1::BatchLookupRequest r = LookupReq({key});
      r.set_for_read(true);
      r.set_next_turn(true);
      auto got = h.svc->BatchLookup(r);
      REQUIRE(got.ok());
      REQUIRE(got->hit_prefix_length() == 1);
    };
    // One chain per tenant answers a turn. tb's comes back, ta's does not
    // within the horizon. Then both are removed.
    h.Put({ax}, kObj);
    h.Put({by}, kObj);
    hint(ax);
    hint(by);
    REQUIRE(h.Read({by}).hit_prefix_length() == 1);
    for (int i = 0; i < 4; ++i) {  // 12 s, heartbeats every 3 s
      h.clock.Advance(absl::Seconds(3));
      h.Heartbeat(a, 1);
    }
    v1::RemoveRequest remove;
    remove.add_keys(ax);
    remove.add_keys(by);
    REQUIRE(h.svc->Remove(remove).ok());
    // ta's block is read after tb's: LRU evicts tb's.
    h.Put({bc}, kObj);
    h.Put({ac}, kObj);
    REQUIRE(h.Read({bc}).hit_prefix_length() == 1);
    h.clock.Advance(absl::Seconds(1));
    REQUIRE(h.Read({ac}).hit_prefix_length() == 1);
    h.Put({bd}, kObj);
    h.Put({be}, kObj);
    if (policy == EvictionPolicy::kCost) {
      CHECK(h.svc->counters().turns_returned == 1);
      CHECK(h.svc->counters().turns_not_returned == 1);
      CHECK(h.Found({ac, bc, bd, be}) == "0111");
    } else {
      CHECK(h.svc->counters().turns_returned == 0);
      CHECK(h.Found({ac, bc, bd, be}) == "1011");
    }
  }
}

TEST_CASE(
    "Under the cost policy a hinted chain that ends counts as not returned, "
    "once") {
  Harness h("evict_turns_ended", [](MasterServiceOptions& o) {
    o.eviction_policy = EvictionPolicy::kCost;
  });
  h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"c0", "c1", "c2"}, kObj);
  // The hint names the chain; it is marked at its last stored block (c2).
  v1::BatchLookupRequest hint = LookupReq({"c0", "c1", "c2", "c3"});
  hint.set_for_read(true);
  hint.set_next_turn(true);
  auto got = h.svc->BatchLookup(hint);
  REQUIRE(got.ok());
  REQUIRE(got->hit_prefix_length() == 3);
  h.clock.Advance(absl::Seconds(2));
  // A read of the chain's head alone is not its turn coming back.
  h.Read({"c0"});
  CHECK(h.svc->counters().turns_returned == 0);
  v1::BatchLookupRequest ended = LookupReq({"c0", "c1", "c2"});
  ended.set_ended(true);
  REQUIRE(h.svc->BatchLookup(ended).ok());
  CHECK(h.svc->counters().turns_not_returned == 1);
  // Resolved once: the chain read again later is no return.
  h.Read({"c0", "c1", "c2"});
  CHECK(h.svc->counters().turns_returned == 0);

  // next_turn needs for_read.
  v1::BatchLookupRequest bad = LookupReq({"c0"});
  bad.set_next_turn(true);
  CHECK(h.svc->BatchLookup(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A chain continued on another node loses its tail there with its head") {
  Harness h("cross_node_chain");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"c0", "c1"}, kObj, a) == a);
  // The chain goes on on b (say a was full), then on a again.
  auto tail = h.StartChild({"c2", "c3"}, kObj, "c1", b);
  REQUIRE(tail.ok());
  CHECK(tail->node().node_id() == b);
  h.Commit(*tail);
  auto back = h.StartChild({"c4"}, kObj, "c3", a);
  REQUIRE(back.ok());
  CHECK(back->node().node_id() == a);
  h.Commit(*back);
  CHECK(h.Put({"y"}, kObj, b) == b);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "c4", "y"}) == "111111");
  // The restarted master links them again from the persisted parents.
  h.Restart();
  h.Rejoin("a", 1, {{0, 1 << 20}});
  h.Rejoin("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "c4", "y"}) == "111111");

  // Node a lost c1: reconciling a drops it, and every block after it, on
  // both nodes, goes (a frees c4 in this round; b in its next one).
  const v1::Location c1 = h.Lookup({"c1"}).results(0).location();
  std::vector<v1::Location> held;
  for (const auto& loc : h.Listed(a)) {
    if (loc.generation() != c1.generation()) held.push_back(loc);
  }
  const v1::ReconcileNodeResponse r = h.ReconcileWith(a, 1, held);
  CHECK(r.dropped_listings() == 1);
  CHECK(r.unlisted_count() == 1);  // c4, on a
  CHECK(h.Found({"c0", "c1", "c2", "c3", "c4", "y"}) == "100001");
  CHECK(h.svc->counters().orphans_removed == 3);
  CHECK(h.UsedBytes(b) == kSlot);
  CHECK(h.UsedBytes(a) == kSlot);
}

TEST_CASE("The eviction walk is bounded by max_eviction_scan") {
  Harness h("evict_scan", [](MasterServiceOptions& o) {
    o.read_lease = absl::ZeroDuration();
    o.max_eviction_scan = 3;
  });
  h.Register("a", 1, {{0, 4 * kSlot}});
  h.Put({"c0", "c1", "c2"}, kObj);
  h.Put({"x"}, kObj);
  // The call's existing tail keeps its chain: the walk passes over c2 c1
  // c0 and stops before x.
  auto r = h.svc->PutStart(PutReq({"c2", "y"}, {kObj, kObj}));
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("max_eviction_scan") == std::string::npos);
  CHECK(r.status().message().find("looked at 3 objects") != std::string::npos);
  CHECK(h.svc->counters().evicted_objects == 0);
  // Without the kept tail the same walk evicts it first.
  h.Put({"y"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "x", "y"}) == "11011");
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
