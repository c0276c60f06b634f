// MasterService tests: PutStart / PutCommit / PutAbort, placement and chains
// (master_service_put.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "master/master_service_test_fixture.h"
#include "master/replica_key.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE("PutStart spreads calls across nodes and keeps each call on one") {
  // Round robin: turn by turn whatever the fill (load-aware placement, by
  // fill, is master_service_placement_test's).
  Harness h("spread", [](MasterServiceOptions& o) {
    o.placement.policy = PlacementPolicy::kRoundRobin;
  });
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}, {1, 1 << 20}});
  uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  std::vector<uint32_t> chosen;
  for (int call = 0; call < 6; ++call) {
    std::vector<std::string> keys;
    for (int i = 0; i < 8; ++i) {
      keys.push_back("c" + std::to_string(call) + "-" + std::to_string(i));
    }
    auto r = h.Start(keys, std::vector<uint64_t>(8, 1000));
    REQUIRE(r.put_id() != 0);
    REQUIRE(r.slots_size() == 8);
    std::set<std::pair<uint32_t, uint64_t>> addrs;
    std::set<uint64_t> generations;
    for (const auto& slot : r.slots()) {
      CHECK(slot.state() == v1::SLOT_ALLOCATED);
      CHECK(slot.location().node_id() == r.node().node_id());
      CHECK(slot.location().length() == 1000);
      CHECK(slot.location().addr() % 64 == 0);
      addrs.insert({slot.location().region_id(), slot.location().addr()});
      generations.insert(slot.location().generation());
    }
    CHECK(addrs.size() == 8);
    CHECK(generations.size() == 8);
    CHECK(r.node().data_address().size() > 0);
    CHECK(r.node().alive());
    CHECK(r.expires_unix_ms() ==
          absl::ToUnixMillis(h.clock.Now() + absl::Seconds(30)));
    chosen.push_back(r.node().node_id());
    h.Commit(r);
  }
  CHECK(chosen == std::vector<uint32_t>{a, b, a, b, a, b});

  // Node a has two regions: its slots used both.
  auto nodes = h.svc->ListNodes();
  const auto& na = nodes.nodes(0);
  REQUIRE(na.node_id() == a);
  CHECK(na.regions(0).used_bytes() > 0);
  CHECK(na.regions(1).used_bytes() > 0);
  CHECK(na.object_count() == 24u);
  CHECK(na.used_bytes() == 24u * 1024);
  CHECK(na.capacity_bytes() == 2 << 20);

  // The preferred node wins when alive and roomy.
  for (int i = 0; i < 3; ++i) {
    CHECK(h.Put({"pref" + std::to_string(i)}, 100, b) == b);
  }
  // Unknown preferred node.
  CHECK(h.svc->PutStart(PutReq({"z"}, {1}, 77)).status().code() ==
        StatusCode::kNotFound);
}

TEST_CASE("PutStart falls back when the preferred node is full") {
  Harness h("fallback");
  uint32_t small = h.Register("small", 1, {{0, 4096}});
  uint32_t big = h.Register("big", 1, {{0, 1 << 20}}, 7100);
  // Needs 3 x 2048: does not fit the small node in one call.
  auto r = h.Start({"x", "y", "z"}, {2000, 2000, 2000}, small);
  CHECK(r.node().node_id() == big);
  // Fits the small node: goes there.
  auto r2 = h.Start({"p", "q"}, {2000, 2000}, small);
  CHECK(r2.node().node_id() == small);
  // Now nothing fits the small node, and a 2 MiB request fits nowhere.
  auto none = h.svc->PutStart(PutReq({"huge"}, {2 << 20}));
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(none.status().message().find("room") != std::string::npos);
  CHECK(h.UsedBytes(small) == 4096);
  CHECK(h.UsedBytes(big) == 3 * 2048);
}

TEST_CASE("PutStart reports existing and in-progress keys") {
  Harness h("states");
  h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"done"});
  auto first = h.Start({"busy"}, {10});
  auto r = h.Start({"done", "busy", "new"}, {10, 10, 10});
  CHECK(r.slots(0).state() == v1::SLOT_EXISTS);
  CHECK(r.slots(0).location().length() == 100);
  CHECK(r.slots(1).state() == v1::SLOT_IN_PROGRESS);
  CHECK(r.slots(2).state() == v1::SLOT_ALLOCATED);
  CHECK(r.put_id() != 0);
  CHECK(r.put_id() != first.put_id());

  auto nothing = h.Start({"done", "busy"}, {10, 10});
  CHECK(nothing.put_id() == 0);
  CHECK(nothing.slots(0).state() == v1::SLOT_EXISTS);
  CHECK(nothing.slots(1).state() == v1::SLOT_IN_PROGRESS);
  CHECK_FALSE(nothing.has_node());
}

TEST_CASE("Objects become visible only at commit; failures are freed") {
  Harness h("commit");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto r = h.Start({"k0", "k1", "k2", "k3"}, {100, 200, 300, 400});
  CHECK(h.Lookup({"k0", "k1"}).results(0).found() == false);
  CHECK(h.UsedBytes(a) == 128 + 256 + 320 + 448);

  // Out-of-range index: rejected, nothing changes.
  v1::PutCommitRequest bad;
  bad.set_put_id(r.put_id());
  bad.add_failed_indexes(1);
  bad.add_failed_indexes(4);
  CHECK(h.svc->PutCommit(bad).status().code() == StatusCode::kInvalidArgument);
  CHECK(h.UsedBytes(a) == 128 + 256 + 320 + 448);
  CHECK(h.svc->GetStats().pending_puts() == 1);

  // k1 and k3 failed. k2 extends k1: no reader could reach it, so it is
  // freed too.
  CHECK(h.Commit(r, {1, 3, 3}) == 1);
  auto l = h.Lookup({"k0", "k1", "k2", "k3"});
  CHECK(l.results(0).found());
  CHECK_FALSE(l.results(1).found());
  CHECK_FALSE(l.results(2).found());
  CHECK_FALSE(l.results(3).found());
  CHECK(l.results(0).location().length() == 100);
  CHECK(l.results(0).location().generation() ==
        r.slots(0).location().generation());
  CHECK(h.UsedBytes(a) == 128);
  CHECK(h.svc->counters().commits_unreachable == 1);

  // Committing twice: the put is gone.
  v1::PutCommitRequest again;
  again.set_put_id(r.put_id());
  auto st = h.svc->PutCommit(again).status();
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK(st.message().find("expired or unknown") != std::string::npos);
  again.set_put_id(12345);
  CHECK(h.svc->PutCommit(again).status().code() == StatusCode::kNotFound);

  // Failed keys may be put again.
  auto retry = h.Start({"k1", "k3"}, {10, 10});
  CHECK(retry.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(retry.slots(1).state() == v1::SLOT_ALLOCATED);

  // Abort frees.
  v1::PutAbortRequest abort;
  abort.set_put_id(retry.put_id());
  REQUIRE(h.svc->PutAbort(abort).ok());
  CHECK(h.svc->PutAbort(abort).status().code() == StatusCode::kNotFound);
  CHECK(h.UsedBytes(a) == 128);
  CHECK(h.svc->GetStats().pending_puts() == 0);
}

TEST_CASE("A node's commit still succeeds if it died meanwhile") {
  Harness h("diedmeanwhile");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto r = h.Start({"k"}, {10});
  h.clock.Advance(absl::Seconds(11));
  CHECK(h.Commit(r) == 1);
  CHECK_FALSE(h.Lookup({"k"}).results(0).found());
  h.Heartbeat(a, 1);
  CHECK(h.Lookup({"k"}).results(0).found());
}

TEST_CASE("Expired puts are reaped and cannot be committed") {
  Harness h("reap");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto r1 = h.Start({"a1", "a2"}, {100, 100});
  h.clock.Advance(absl::Seconds(20));
  h.Heartbeat(a, 1);
  auto r2 = h.Start({"b1"}, {100});
  CHECK(h.svc->ReapExpired() == 0);
  h.clock.Advance(absl::Seconds(11));  // r1 expired, r2 not
  h.Heartbeat(a, 1);
  CHECK(h.svc->ReapExpired() == 1);
  CHECK(h.svc->GetStats().pending_puts() == 1);
  CHECK(h.UsedBytes(a) == 128);
  v1::PutCommitRequest c;
  c.set_put_id(r1.put_id());
  CHECK(h.svc->PutCommit(c).status().code() == StatusCode::kNotFound);
  // The keys are free for a new put.
  auto r3 = h.Start({"a1"}, {100});
  CHECK(r3.slots(0).state() == v1::SLOT_ALLOCATED);

  // Commit after expiry but before the reaper ran: NOT_FOUND and freed.
  h.clock.Advance(absl::Seconds(31));
  c.set_put_id(r2.put_id());
  CHECK(h.svc->PutCommit(c).status().code() == StatusCode::kNotFound);
  CHECK(h.svc->ReapExpired() == 1);  // r3
  CHECK(h.UsedBytes(a) == 0);
  CHECK(h.svc->counters().puts_expired == 3);
}

TEST_CASE(
    "A put whose answer was lost ends by its token, freeing its keys at once") {
  Harness h("token");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  v1::PutStartRequest req = PutReq({"k1", "k2"}, {100, 100});
  req.set_put_token(0xfeedbeef);
  auto started = h.svc->PutStart(req);
  REQUIRE(started.ok());
  CHECK(h.Start({"k1"}, {100}).slots(0).state() == v1::SLOT_IN_PROGRESS);
  // The same token again (a PutStart retried): refused, the first stays.
  auto again = h.svc->PutStart(req);
  CHECK(again.status().code() == StatusCode::kAlreadyExists);
  CHECK(h.svc->GetStats().pending_puts() == 1);

  // The caller never saw put_id: it aborts by the token.
  v1::PutAbortRequest abort;
  abort.set_put_token(0xfeedbeef);
  REQUIRE(h.svc->PutAbort(abort).ok());
  CHECK(h.svc->GetStats().pending_puts() == 0);
  CHECK(h.UsedBytes(a) == 0);
  CHECK(h.svc->PutAbort(abort).status().code() == StatusCode::kNotFound);
  auto next = h.Start({"k1", "k2"}, {100, 100});
  CHECK(next.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(next.slots(1).state() == v1::SLOT_ALLOCATED);

  // A token is free again once its put ends (committed here).
  v1::PutStartRequest third = PutReq({"k4"}, {100});
  third.set_put_token(7);
  auto t1 = h.svc->PutStart(third);
  REQUIRE(t1.ok());
  h.Commit(*t1);
  third.set_keys(0, "k5");
  CHECK(h.svc->PutStart(third).ok());
  abort.set_put_token(7);
  REQUIRE(h.svc->PutAbort(abort).ok());
  CHECK(h.Lookup({"k4"}).results(0).found());
}

TEST_CASE("PutStart places a chain's continuation on its parent's node") {
  // Round robin keeps a chain on its node however full; load-aware
  // placement keeps it within a margin (master_service_placement_test).
  Harness h("parent_place", [](MasterServiceOptions& o) {
    o.placement.policy = PlacementPolicy::kRoundRobin;
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"p0"}, kObj, b) == b);
  // Round robin alone would alternate a, b, a, ...
  std::string parent = "p0";
  for (int i = 1; i <= 4; ++i) {
    std::string k1 = "p" + std::to_string(i) + "a";
    std::string k2 = "p" + std::to_string(i) + "b";
    CHECK(h.PutChild({k1, k2}, kObj, parent) == b);
    parent = k2;
  }
  // An explicit preferred node wins over the parent.
  CHECK(h.StartChild({"q"}, kObj, parent, a)->node().node_id() == a);
  // An unknown parent: the blocks after it could never be reached.
  auto orphan = h.StartChild({"r0"}, kObj, "nowhere");
  CHECK(orphan.status().code() == StatusCode::kFailedPrecondition);
  CHECK(h.svc->GetStats().pending_puts() == 1);  // only q's
  // A parent on a dead node is no hint.
  h.clock.Advance(absl::Seconds(11));
  h.Heartbeat(a, 1);
  CHECK(h.PutChild({"s"}, kObj, parent) == a);
  // A parent key longer than any key is refused.
  CHECK(h.StartChild({"t"}, kObj, std::string(257, 'k')).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("A full parent node falls back to a node with room before evicting") {
  Harness h("parent_full");
  const uint32_t a = h.Register("a", 1, {{0, 2 * kSlot}});
  const uint32_t b = h.Register("b", 1, {{0, 2 * kSlot}}, 7100);
  h.Put({"p", "x"}, kObj, a);  // a is full
  // The continuation of p goes to b, which has room: nothing is evicted.
  CHECK(h.PutChild({"c1"}, kObj, "p") == b);
  CHECK(h.svc->counters().evicted_objects == 0);
  CHECK(h.Found({"p", "x"}) == "11");
  h.Put({"y"}, kObj, b);  // b full too
  // Now eviction happens on the parent's node, not on b. The p-x commit
  // left x (its tail) least recent: x goes.
  CHECK(h.PutChild({"c2"}, kObj, "p") == a);
  CHECK(h.Found({"p", "x", "c1", "y", "c2"}) == "10111");
  // Order on a: p c2. p is least recent but is this put's parent: kept.
  CHECK(h.PutChild({"c3"}, kObj, "p") == a);
  CHECK(h.Found({"p", "c2", "c3"}) == "101");
  CHECK(h.svc->counters().evicted_objects == 2);
  CHECK(h.Found({"c1", "y"}) == "11");  // b untouched
}

TEST_CASE("A pending put's parent stays; blocks after a vanished parent are not committed") {
  Harness h("pending_parent",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 4 * kSlot}});
  h.Put({"p"}, kObj);
  h.Put({"q"}, kObj);
  h.Put({"r"}, kObj);
  auto child = h.StartChild({"p1"}, kObj, "p");  // node now full
  REQUIRE(child.ok());
  // p is the least recent, but a pending put continues it: q goes.
  h.Put({"s"}, kObj);
  CHECK(h.Found({"p", "q", "r", "s"}) == "1011");
  CHECK(h.Commit(*child) == 1);
  CHECK(h.Found({"p", "p1"}) == "11");

  // A parent removed before the commit: its continuation is freed instead.
  auto orphan = h.StartChild({"r1", "r2"}, kObj, "r");
  REQUIRE(orphan.ok());
  v1::RemoveRequest rm;
  rm.add_keys("r");
  REQUIRE(h.svc->Remove(rm).ok());
  CHECK(h.Commit(*orphan) == 0);
  CHECK(h.Found({"r", "r1", "r2"}) == "000");
  CHECK(h.svc->counters().commits_unreachable == 2);
  // Nor may a put continue a parent that is not stored.
  CHECK(h.StartChild({"r3"}, kObj, "r").status().code() ==
        StatusCode::kFailedPrecondition);
  CHECK(h.svc->GetStats().pending_puts() == 0);
}

TEST_CASE("Two puts of one chain racing: later blocks wait for the earlier ones") {
  Harness h("evict_race",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 8 * kSlot}});
  // Two requests with the same prefix store at once: the second finds the
  // prefix in progress and puts only its own continuation.
  auto x = h.Start({"s0", "s1", "s2"}, {kObj, kObj, kObj});
  auto y = h.Start({"s0", "s1", "s2", "y3", "y4"},
                   {kObj, kObj, kObj, kObj, kObj});
  REQUIRE(y.slots(2).state() == v1::SLOT_IN_PROGRESS);
  REQUIRE(y.slots(3).state() == v1::SLOT_ALLOCATED);
  CHECK(h.Commit(y) == 2);  // before the prefix: kept, unlinked
  CHECK(h.Commit(x) == 3);  // now y3 is linked below s2
  const std::vector<std::string> chain = {"s0", "s1", "s2", "y3", "y4"};
  CHECK(h.Found(chain) == "11111");
  for (int i = 0; i < 8; ++i) {
    h.Put({"n" + std::to_string(i)}, kObj);
    INFO("after put " << i << ": " << h.Found(chain));
    CHECK(NoStrandedTail(h.Found(chain)));
  }
  CHECK(h.Found(chain) == "00000");

  // If the earlier put ends without the prefix, the waiting blocks go.
  auto x2 = h.Start({"t0", "t1"}, {kObj, kObj});
  auto y2 = h.Start({"t0", "t1", "z2", "z3"}, {kObj, kObj, kObj, kObj});
  CHECK(h.Commit(y2) == 2);
  CHECK(h.Found({"z2", "z3"}) == "11");
  const uint64_t before = h.svc->counters().orphans_removed;
  CHECK(h.Commit(x2, {1}) == 1);  // t1's write failed
  CHECK(h.Found({"t0", "t1", "z2", "z3"}) == "1000");
  CHECK(h.svc->counters().orphans_removed == before + 2);
  auto x3 = h.Start({"u0"}, {kObj});
  auto y3 = h.Start({"u0", "w1"}, {kObj, kObj});
  CHECK(h.Commit(y3) == 1);
  v1::PutAbortRequest abort;
  abort.set_put_id(x3.put_id());
  REQUIRE(h.svc->PutAbort(abort).ok());
  CHECK(h.Found({"u0", "w1"}) == "00");
}

TEST_CASE("A key on a node re-registering after a master restart is not stored again, so its chain survives") {
  Harness h("rejoin_keeps_chain");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"head", "mid", "tail"}, 100, a);
  h.Restart();
  // The node has not registered with the new process: misses, but a
  // client that re-stores the head must not replace it (which would drop
  // the blocks after it on the node).
  CHECK(h.Found({"head"}) == "0");
  auto again = h.Start({"head"}, {100});
  CHECK(again.slots(0).state() == v1::SLOT_EXISTS);
  CHECK(h.Rejoin("a", 1, {{0, 1 << 20}}) == a);
  CHECK(h.Found({"head", "mid", "tail"}) == "111");
  // Once the node is dead for good, its keys may be stored elsewhere.
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  h.clock.Advance(absl::Seconds(11));
  v1::HeartbeatRequest hb;
  hb.set_node_id(b);
  hb.set_incarnation(1);
  REQUIRE_FALSE(Hb(h.svc.get(), hb)->reregister());
  auto moved = h.Start({"head"}, {100});
  CHECK(moved.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(moved.node().node_id() == b);
}

TEST_CASE("A commit lists slots only with their node's write receipts") {
  Harness h("receipts");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto refused = [&](const v1::PutCommitRequest& req) {
    auto st = h.svc->PutCommit(req).status();
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kPermissionDenied);
    CHECK(ReasonOf(st) == StatusReason::kWriteReceiptInvalid);
    // Nothing listed, the put ended, its space free.
    const v1::BatchLookupResponse l = h.Lookup({"k0", "k1"});
    for (const auto& res : l.results()) CHECK_FALSE(res.found());
    CHECK(h.svc->GetStats().pending_puts() == 0);
    CHECK(h.UsedBytes(a) == 0);
  };
  // No receipts at all: a client committing what it never wrote.
  auto r = h.Start({"k0", "k1"}, {100, 100});
  v1::PutCommitRequest none;
  none.set_put_id(r.put_id());
  refused(none);
  CHECK(h.svc->counters().commits_refused_receipt == 1);
  // Unknown after the refusal.
  CHECK(h.svc->PutCommit(none).status().code() == StatusCode::kNotFound);

  // One slot's receipt given for both.
  r = h.Start({"k0", "k1"}, {100, 100});
  v1::PutCommitRequest swapped;
  swapped.set_put_id(r.put_id());
  swapped.add_receipts(ReceiptFor(r, 0));
  swapped.add_receipts(ReceiptFor(r, 0));
  refused(swapped);

  // A receipt of an earlier allocation of the same key (another
  // generation), and one signed with another node's key.
  r = h.Start({"k0"}, {100});
  const std::string earlier = ReceiptFor(r, 0);
  REQUIRE(h.svc
              ->PutAbort([&] {
                v1::PutAbortRequest ab;
                ab.set_put_id(r.put_id());
                return ab;
              }())
              .ok());
  auto again = h.Start({"k0"}, {100});
  REQUIRE(again.slots(0).location().generation() !=
          r.slots(0).location().generation());
  v1::PutCommitRequest stale;
  stale.set_put_id(again.put_id());
  stale.add_receipts(earlier);
  refused(stale);
  h.Register("b", 1, {{0, 1 << 20}}, 7100);
  r = h.Start({"k0"}, {100}, a);
  REQUIRE(r.node().node_id() == a);
  v1::PutCommitRequest other;
  other.set_put_id(r.put_id());
  other.add_receipts(
      WriteReceiptFor(HmacSha256(KeyByName().at("b")), r.slots(0).location()));
  refused(other);
  CHECK(h.svc->counters().commits_refused_receipt == 4);

  // A failed slot needs none; the written one its own.
  r = h.Start({"k0", "k1"}, {100, 100}, a);
  v1::PutCommitRequest good;
  good.set_put_id(r.put_id());
  good.add_failed_indexes(1);
  good.add_receipts(ReceiptFor(r, 0));
  auto ok = h.svc->PutCommit(good);
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  CHECK(ok->committed() == 1);
  auto l = h.Lookup({"k0", "k1"});
  CHECK(l.results(0).found());
  CHECK_FALSE(l.results(1).found());
}

TEST_CASE("Without require_write_receipts a commit needs no receipts") {
  Harness h("no_receipts",
            [](MasterServiceOptions& o) { o.require_write_receipts = false; });
  h.Register("a", 1, {{0, 1 << 20}});
  auto r = h.Start({"k0"}, {100});
  v1::PutCommitRequest c;
  c.set_put_id(r.put_id());
  auto ok = h.svc->PutCommit(c);
  REQUIRE(ok.ok());
  CHECK(ok->committed() == 1);
  CHECK(h.Lookup({"k0"}).results(0).found());
  CHECK(h.svc->counters().commits_refused_receipt == 0);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE(
    "A replica is a copy on another node that lookups use when the key's node "
    "is gone, and that goes with the key") {
  Harness h("replica", [](MasterServiceOptions& o) {
    o.placement.policy = PlacementPolicy::kRoundRobin;
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  REQUIRE(h.Put({"k0", "k1", "k2"}, kObj, a) == a);
  auto replica = [&](std::vector<std::string> keys, const std::string& parent,
                     uint64_t len = kObj) {
    v1::PutStartRequest r =
        PutReq(keys, std::vector<uint64_t>(keys.size(), len));
    r.set_parent_key(parent);
    r.set_replica(true);
    return h.svc->PutStart(r);
  };
  // Not committed, or of another length: nothing to copy.
  auto none = replica({"nope"}, "");
  REQUIRE(none.ok());
  CHECK(none->slots(0).state() == v1::SLOT_NOT_ON_NODE);
  auto wrong = replica({"k0"}, "", kObj + 1);
  REQUIRE(wrong.ok());
  CHECK(wrong->slots(0).state() == v1::SLOT_NOT_ON_NODE);
  // The copies go to the other node, in two puts of the chain.
  auto first = replica({"k0"}, "");
  REQUIRE(first.ok());
  CHECK(first->node().node_id() == b);
  CHECK(h.Commit(*first) == 1);
  auto rest = replica({"k1", "k2"}, "k0");
  REQUIRE(rest.ok());
  CHECK(rest->node().node_id() == b);
  CHECK(h.Commit(*rest) == 2);
  CHECK(h.svc->counters().replicas_stored == 3);
  auto again = replica({"k0", "k1"}, "");
  REQUIRE(again.ok());
  CHECK(again->slots(0).state() == v1::SLOT_EXISTS);
  CHECK(again->slots(1).state() == v1::SLOT_EXISTS);
  CHECK(h.UsedBytes(b) == 3 * 1024);
  // A caller cannot name a copy.
  CHECK(h.svc->PutStart(PutReq({"k0" + std::string(kReplicaSuffix)}, {kObj}))
            .status()
            .code() == StatusCode::kInvalidArgument);
  CHECK(h.svc->BatchLookup(LookupReq({"k0" + std::string(kReplicaSuffix)}))
            .status()
            .code() == StatusCode::kInvalidArgument);

  // While a and b are both alive, one answer spreads the chain over both
  // (CopyChooser), and a read keeps both copies of what it read as recent.
  auto look = h.Lookup({"k0", "k1", "k2"});
  CHECK(look.hit_prefix_length() == 3);
  std::set<uint32_t> serving;
  for (const auto& r : look.results()) serving.insert(r.location().node_id());
  CHECK(serving == std::set<uint32_t>{a, b});
  h.clock.Advance(absl::Seconds(1));
  CHECK(h.Read({"k0", "k1", "k2"}).hit_prefix_length() == 3);
  for (const std::string& key : {std::string("k1"), ReplicaKeyOf("k1")}) {
    v1::InspectKeyRequest inspect;
    inspect.set_key(key);
    auto got = h.svc->InspectKey(inspect);
    REQUIRE(got.ok());
    CHECK(got->last_read_unix_ms() == absl::ToUnixMillis(h.clock.Now()));
  }
  // a dies: the copies answer, whole chain.
  h.clock.Advance(absl::Seconds(11));
  h.Heartbeat(b, 1);
  look = h.Lookup({"k0", "k1", "k2"});
  CHECK(look.hit_prefix_length() == 3);
  for (const auto& r : look.results()) CHECK(r.location().node_id() == b);
  v1::BatchLookupRequest exists = LookupReq({"k0", "k1", "k2", "nope"});
  exists.set_exists_only(true);
  auto bits = h.svc->BatchLookup(exists);
  REQUIRE(bits.ok());
  CHECK(bits->hit_prefix_length() == 3);

  // Removing a key removes its copy, and the blocks after it theirs.
  v1::RemoveRequest rm;
  rm.add_keys("k1");
  REQUIRE(h.svc->Remove(rm).ok());
  CHECK(h.Found({"k0", "k1", "k2"}) == "100");
  CHECK(h.UsedBytes(b) == 1024);
  // Stored anew (a is dead): the new bytes win, the old copy goes.
  CHECK(h.Put({"k0"}, kObj, b) == b);
  std::vector<std::string> listed = Everything(h.svc.get());
  CHECK(listed.size() == 1);  // k0 alone, no copy
  // A copy whose key changes before its commit is not committed.
  const uint32_t c = h.Register("c", 1, {{0, 1 << 20}}, 7200);
  auto stale = replica({"k0"}, "");
  REQUIRE(stale.ok());
  CHECK(stale->node().node_id() == c);
  rm.set_keys(0, "k0");
  REQUIRE(h.svc->Remove(rm).ok());
  CHECK(h.Commit(*stale) == 0);
  CHECK(h.svc->counters().relocations_skipped == 1);
  CHECK(Everything(h.svc.get()).empty());
  // Not a replica and a relocation at once.
  v1::PutStartRequest both = PutReq({"k0"}, {kObj});
  both.set_replica(true);
  both.set_relocate_from_node(a);
  CHECK(h.svc->PutStart(both).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A reader is answered from the copy on its own host, and a host too long "
    "is refused") {
  Harness h("reader_host");
  auto on_host = [&](const std::string& name, const std::string& host,
                     int port) {
    v1::RegisterNodeRequest req = NodeReq(name, 1, {{0, 1 << 20}}, port);
    req.set_host(host);
    auto r = Reg(h.svc.get(), req);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return r->node_id();
  };
  const uint32_t a = on_host("a", "host-a", 7000);
  const uint32_t b = on_host("b", "host-b", 7100);
  REQUIRE(h.Put({"k0", "k1", "k2", "k3"}, kObj, a) == a);
  REQUIRE(h.PutCopies({"k0", "k1", "k2", "k3"}, kObj, b) == b);
  auto served_from = [&](const std::string& reader) {
    v1::BatchLookupRequest req = LookupReq({"k0", "k1", "k2", "k3"});
    req.set_reader_host(reader);
    auto r = h.svc->BatchLookup(req);
    REQUIRE(r.ok());
    REQUIRE(r->hit_prefix_length() == 4);
    std::set<uint32_t> nodes;
    for (const auto& x : r->results()) nodes.insert(x.location().node_id());
    return nodes;
  };
  CHECK(served_from("host-b") == std::set<uint32_t>{b});
  CHECK(served_from("host-a") == std::set<uint32_t>{a});
  CHECK(served_from("elsewhere") == std::set<uint32_t>{a, b});  // by load
  CHECK(served_from("") == std::set<uint32_t>{a, b});
  // The host is kept with the node, and both limits hold.
  v1::ListNodesResponse nodes = h.svc->ListNodes();
  for (const auto& n : nodes.nodes()) {
    CHECK(n.host() == (n.node_id() == a ? "host-a" : "host-b"));
  }
  v1::BatchLookupRequest long_reader = LookupReq({"k0"});
  long_reader.set_reader_host(std::string(kMaxHostBytes + 1, 'h'));
  CHECK(h.svc->BatchLookup(long_reader).status().code() ==
        StatusCode::kInvalidArgument);
  v1::RegisterNodeRequest long_node = NodeReq("c", 1, {{0, 1 << 20}}, 7200);
  long_node.set_host(std::string(kMaxHostBytes + 1, 'h'));
  CHECK(Reg(h.svc.get(), long_node).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE(
    "A copy names the generation its bytes were read at: a key stored again "
    "since gets no copy") {
  Harness h("copied_generation");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  REQUIRE(h.Put({"k0"}, kObj, a) == a);
  const uint64_t read_at = h.Lookup({"k0"}).results(0).location().generation();
  // Removed and stored again after the reader read it: a new generation.
  v1::RemoveRequest rm;
  rm.add_keys("k0");
  REQUIRE(h.svc->Remove(rm).ok());
  REQUIRE(h.Put({"k0"}, kObj, a) == a);
  const uint64_t now_at = h.Lookup({"k0"}).results(0).location().generation();
  REQUIRE(now_at != read_at);
  auto copy_of = [&](std::vector<uint64_t> generations, bool replica = true) {
    v1::PutStartRequest r = PutReq({"k0"}, {kObj});
    r.set_replica(replica);
    for (uint64_t g : generations) r.add_copied_generations(g);
    return h.svc->PutStart(r);
  };
  auto stale = copy_of({read_at});
  REQUIRE(stale.ok());
  CHECK(stale->slots(0).state() == v1::SLOT_NOT_ON_NODE);
  CHECK(stale->put_id() == 0);
  // The count must match the keys, and only copies name generations.
  CHECK(copy_of({now_at, now_at}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(copy_of({now_at}, /*replica=*/false).status().code() ==
        StatusCode::kInvalidArgument);
  // The listed generation, or none named, is copied.
  auto fresh = copy_of({now_at});
  REQUIRE(fresh.ok());
  CHECK(fresh->slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(fresh->node().node_id() == b);
  REQUIRE(h.Commit(*fresh) == 1);
  auto again = copy_of({0});
  REQUIRE(again.ok());
  CHECK(again->slots(0).state() == v1::SLOT_EXISTS);
}

TEST_CASE(
    "A relocated block goes to another node than its copy's while one has "
    "room") {
  Harness h("relocate_past_copy");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  const uint32_t c = h.Register("c", 1, {{0, 1 << 20}}, 7200);
  REQUIRE(h.Put({"k0", "k1"}, kObj, a) == a);
  REQUIRE(h.PutCopies({"k0", "k1"}, kObj, b) == b);
  // c is the fuller node: without the copy on b, b would take the move.
  REQUIRE(h.Put({"filler"}, 8 * kObj, c) == c);
  v1::PutStartRequest move = PutReq({"k0", "k1"}, {kObj, kObj});
  move.set_relocate_from_node(a);
  auto moved = h.svc->PutStart(move);
  REQUIRE(moved.ok());
  CHECK(moved->node().node_id() == c);
  REQUIRE(h.Commit(*moved) == 2);
  // Block on c, copy on b: either one lost, the chain is still read whole.
  h.clock.Advance(absl::Seconds(11));
  h.Heartbeat(b, 1);
  CHECK(h.Found({"k0", "k1"}) == "11");
  // With only the copy's node left, the move still goes there: a block
  // next to its copy beats a block lost with a drained node.
  const uint32_t d = h.Register("d", 1, {{0, 1 << 20}}, 7300);
  h.Heartbeat(d, 1);
  REQUIRE(h.Put({"k2"}, kObj, d) == d);
  REQUIRE(h.PutCopies({"k2"}, kObj, b) == b);
  move = PutReq({"k2"}, {kObj});
  move.set_relocate_from_node(d);
  moved = h.svc->PutStart(move);
  REQUIRE(moved.ok());
  CHECK(moved->node().node_id() == b);
}

TEST_CASE(
    "A read of a prefix that many chains continue from asks its reader for "
    "copies, one reader per put_timeout, until the prefix has them") {
  Harness h("auto_copies", [](MasterServiceOptions& o) {
    o.auto_replica_branches = 3;
    o.node_timeout = absl::Hours(1);
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  REQUIRE(h.Put({"p0", "p1"}, kObj, a) == a);
  auto branch = [&](const std::string& key, uint32_t node) {
    v1::PutStartRequest r = PutReq({key}, {kObj}, node);
    r.set_parent_key("p1");
    auto s = h.svc->PutStart(r);
    REQUIRE(s.ok());
    REQUIRE(h.Commit(*s) == 1);
  };
  branch("s0", a);
  branch("s1", a);
  auto asked = [&](std::vector<std::string> keys) {
    return h.Read(keys).copy_prefix_length();
  };
  // Two chains continue from p1: not shared enough.
  CHECK(asked({"p0", "p1", "s0"}) == 0);
  // A third, on another node (a cross link counts as well).
  branch("s2", b);
  CHECK(asked({"p0", "p1", "s2"}) == 2);
  CHECK(h.svc->counters().auto_copies_asked == 1);
  // That reader stores them; until then, or put_timeout, no other is asked.
  CHECK(asked({"p0", "p1", "s1"}) == 0);
  // Plain lookups and existence checks are never asked.
  CHECK(h.Lookup({"p0", "p1"}).copy_prefix_length() == 0);
  h.clock.Advance(absl::Seconds(31));
  CHECK(asked({"p0", "p1"}) == 2);  // the first reader did not: another
  CHECK(h.svc->counters().auto_copies_asked == 2);
  // Copies of the prefix: no one is asked again.
  CHECK(h.PutCopies({"p0", "p1"}, kObj) == b);
  h.clock.Advance(absl::Seconds(31));
  CHECK(asked({"p0", "p1", "s0"}) == 0);
  CHECK(h.svc->counters().auto_copies_asked == 2);
  // A read whose hit prefix stops before the shared block is not asked.
  CHECK(asked({"p0", "nope", "p1"}) == 0);
}

TEST_CASE("Without auto_replica_branches no read is asked for copies") {
  Harness h("auto_copies_off");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Register("b", 1, {{0, 1 << 20}}, 7100);
  REQUIRE(h.Put({"p0"}, kObj, a) == a);
  for (int s = 0; s < 8; ++s) h.PutChild({absl::StrCat("t", s)}, kObj, "p0");
  CHECK(h.Read({"p0", "t0"}).copy_prefix_length() == 0);
  CHECK(h.svc->counters().auto_copies_asked == 0);
  MasterServiceOptions bad;
  bad.auto_replica_branches = 65537;
  CHECK(absl::IsInvalidArgument(bad.Validate()));
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
