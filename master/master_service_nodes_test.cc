// MasterService tests: registration, heartbeats, liveness, node keys and
// capabilities (master_service_nodes.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include "common/status_reason.h"
#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

// The capability the master returned for `loc`, checked as the node does.
absl::Status NodeChecks(const std::string& key, uint64_t incarnation,
                        const v1::Location& loc, const v1::Capability& cap,
                        uint8_t rights, absl::Time now) {
  CapabilityVerifier v(absl::Seconds(30));
  v.SetIdentity(loc.node_id(), incarnation, key);
  wire::OpDesc op;
  op.region_id = loc.region_id();
  op.addr = loc.addr();
  op.length = loc.length();
  op.generation = loc.generation();
  op.cap.expires_unix_ms = cap.expires_unix_ms();
  op.cap.rights = static_cast<uint8_t>(cap.rights());
  const uint64_t lo = cap.tag_lo(), hi = cap.tag_hi();  // little-endian
  std::memcpy(op.cap.tag, &lo, 8);
  std::memcpy(op.cap.tag + 8, &hi, 8);
  return v.Current().Check(op, rights, absl::ToUnixMillis(now));
}

TEST_CASE("RegisterNode assigns stable ids and validates requests") {
  Harness h("register");
  CHECK(h.Register("a", 1, {{0, 1 << 20}}) == 1);
  CHECK(h.Register("b", 1, {{0, 1 << 20}}, 7100) == 2);
  CHECK(h.Register("a", 1, {{0, 1 << 20}}) == 1);
  CHECK(h.Register("a", 2, {{0, 1 << 20}}) == 1);
  auto ok = Reg(h.svc.get(), NodeReq("c", 1, {{0, 4096}}));
  REQUIRE(ok.ok());
  CHECK(ok->heartbeat_interval_ms() == 1000);

  auto code = [&](const v1::RegisterNodeRequest& r) {
    return Reg(h.svc.get(), r).status().code();
  };
  CHECK(code(NodeReq("", 1, {{0, 4096}})) == StatusCode::kInvalidArgument);
  CHECK(code(NodeReq(std::string(129, 'n'), 1, {{0, 4096}})) ==
        StatusCode::kInvalidArgument);
  CHECK(code(NodeReq(std::string(128, 'n'), 1, {{0, 4096}})) == StatusCode::kOk);
  CHECK(code(NodeReq("x", 1, {})) == StatusCode::kInvalidArgument);
  std::vector<RegionSpec> many;
  for (uint32_t i = 0; i < 65; ++i) many.push_back({i, 4096});
  CHECK(code(NodeReq("x", 1, many)) == StatusCode::kInvalidArgument);
  many.pop_back();
  CHECK(code(NodeReq("x64", 1, many)) == StatusCode::kOk);
  CHECK(code(NodeReq("x", 1, {{0, 0}})) == StatusCode::kInvalidArgument);
  CHECK(code(NodeReq("x", 1, {{0, 4096, 0}})) == StatusCode::kInvalidArgument);
  CHECK(code(NodeReq("x", 1, {{0, 4096, 48}})) == StatusCode::kInvalidArgument);
  CHECK(code(NodeReq("x", 1, {{0, uint64_t{1} << 32, 1u << 31}})) ==
        StatusCode::kInvalidArgument);
  CHECK(code(NodeReq("x", 1, {{0, 1024, 4096}})) ==
        StatusCode::kInvalidArgument);
  CHECK(code(NodeReq("x", 1, {{3, 4096}, {3, 8192}})) ==
        StatusCode::kInvalidArgument);
  auto bad_addr = NodeReq("x", 1, {{0, 4096}});
  bad_addr.set_data_address("no-port");
  CHECK(code(bad_addr) == StatusCode::kInvalidArgument);
  bad_addr.set_data_address("host:0");
  CHECK(code(bad_addr) == StatusCode::kInvalidArgument);
  bad_addr.set_data_address("host:70000");
  CHECK(code(bad_addr) == StatusCode::kInvalidArgument);
  bad_addr = NodeReq("x", 1, {{0, 4096}});
  bad_addr.set_control_address("");
  CHECK(code(bad_addr) == StatusCode::kInvalidArgument);
  auto v6 = NodeReq("v6", 1, {{0, 4096}});
  v6.set_data_address("[::1]:9000");
  CHECK(code(v6) == StatusCode::kOk);
}

TEST_CASE(
    "An elected master refuses a node that has accepted a higher epoch, and "
    "says so once per registration") {
  std::vector<int64_t> behind;
  Harness h("epoch_behind", [&](MasterServiceOptions& o) {
    o.epoch = 7;
    o.on_epoch_behind = [&](int64_t e) { behind.push_back(e); };
  });
  v1::RegisterNodeRequest req = NodeReq("a", 1, {{0, 4096}});
  req.set_highest_master_epoch(9);
  auto refused = Reg(h.svc.get(), req);
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(refused.status()) == StatusReason::kMasterEpochBehind);
  CHECK(behind == std::vector<int64_t>{9});
  // Nothing was registered.
  CHECK(h.svc->ListNodes().nodes_size() == 0);
  // The same epoch, or a lower one, registers.
  req.set_highest_master_epoch(7);
  auto same = Reg(h.svc.get(), req);
  REQUIRE(same.ok());
  CHECK(same->master_epoch() == 7);
  CHECK(behind.size() == 1);

  // A master without an election (epoch 0) has nothing to compare: nodes
  // refuse it themselves if they must.
  Harness plain("epoch_behind_plain");
  req.set_highest_master_epoch(9);
  CHECK(Reg(plain.svc.get(), req).ok());
}

TEST_CASE("Heartbeat tracks liveness and asks unknown nodes to re-register") {
  Harness h("heartbeat");
  uint32_t a = h.Register("a", 5, {{0, 1 << 20}});
  v1::HeartbeatRequest req;
  req.set_node_id(99);
  req.set_incarnation(5);
  CHECK(Hb(h.svc.get(), req)->reregister());
  req.set_node_id(a);
  req.set_incarnation(6);
  CHECK(Hb(h.svc.get(), req)->reregister());

  h.clock.Advance(absl::Seconds(9));
  h.Heartbeat(a, 5);
  h.clock.Advance(absl::Seconds(9));
  CHECK(h.svc->ListNodes().nodes(0).alive());
  CHECK(h.svc->ListNodes().nodes(0).last_heartbeat_unix_ms() ==
        absl::ToUnixMillis(h.clock.Now() - absl::Seconds(9)));
  h.clock.Advance(absl::Seconds(2));
  CHECK_FALSE(h.svc->ListNodes().nodes(0).alive());
  h.Heartbeat(a, 5);  // a late heartbeat revives it
  CHECK(h.svc->ListNodes().nodes(0).alive());
}

TEST_CASE(
    "A node given a fresh key takes placements only after its first "
    "heartbeat") {
  Harness h("first-heartbeat");
  auto r = h.svc->RegisterNode(NodeReq("a", 1, {{0, 1 << 20}}));
  REQUIRE(r.ok());
  KeyByName()["a"] = r->node_key();
  NameById()[r->node_id()] = "a";
  // Listed, but not alive yet: the answer with its key may still be on its
  // way.
  CHECK_FALSE(h.svc->ListNodes().nodes(0).alive());
  auto refused = h.svc->PutStart(PutReq({"x"}, {1}));
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  h.Heartbeat(r->node_id(), 1);  // proves the key
  CHECK(h.svc->ListNodes().nodes(0).alive());
  CHECK(h.Put({"x"}) == r->node_id());

  // A registration that proves the key it already holds (a node coming
  // back, say to a new leader) is placeable at once.
  h.CrashAndRestart();
  auto back = Reg(h.svc.get(), NodeReq("a", 1, {{0, 1 << 20}}));
  REQUIRE(back.ok());
  h.ReconcileWith(back->node_id(), 1, h.Listed(back->node_id()));
  CHECK(h.Put({"y"}) == back->node_id());
}

TEST_CASE("A heartbeat tells a node whether an operator drained it") {
  Harness h("drain-heartbeat");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  v1::HeartbeatRequest req;
  req.set_node_id(a);
  req.set_incarnation(1);
  CHECK_FALSE(Hb(h.svc.get(), req)->draining());
  v1::SetNodeDrainingRequest drain;
  drain.set_name("a");
  drain.set_draining(true);
  REQUIRE(h.svc->SetNodeDraining(drain).ok());
  CHECK(Hb(h.svc.get(), req)->draining());
  drain.set_draining(false);
  REQUIRE(h.svc->SetNodeDraining(drain).ok());
  CHECK_FALSE(Hb(h.svc.get(), req)->draining());
}

TEST_CASE("Dead nodes' objects miss and dead nodes get no placements") {
  Harness h("dead");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"x"}) == a);
  CHECK(h.Put({"y"}) == b);
  h.clock.Advance(absl::Seconds(8));
  h.Heartbeat(b, 1);
  h.clock.Advance(absl::Seconds(5));  // a: 13 s silent, b: 5 s

  auto l = h.Lookup({"x", "y"});
  CHECK_FALSE(l.results(0).found());
  CHECK(l.results(1).found());
  CHECK(l.hit_prefix_length() == 0);
  for (int i = 0; i < 3; ++i) {
    CHECK(h.Put({"z" + std::to_string(i)}, 100, a) == b);  // a is dead
  }
  auto stats = h.svc->GetStats();
  CHECK(stats.nodes_alive() == 1);
  CHECK(stats.nodes_dead() == 1);

  // A key on a dead node can be written again elsewhere; the old space is
  // freed at commit.
  uint64_t used_a = h.UsedBytes(a);
  auto again = h.Start({"x"}, {50});
  CHECK(again.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(again.node().node_id() == b);
  h.Commit(again);
  CHECK(h.UsedBytes(a) == used_a - 128);
  CHECK(h.Lookup({"x"}).results(0).location().node_id() == b);

  h.clock.Advance(absl::Seconds(20));  // everyone dead
  auto none = h.svc->PutStart(PutReq({"w"}, {1}));
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(none.status().message().find("no alive") != std::string::npos);
  h.Heartbeat(a, 1);
  CHECK(h.Put({"w"}) == a);
}

TEST_CASE(
    "Right after a restart a put waiting for the nodes to rejoin is "
    "Unavailable (retry), not refused, until node_timeout") {
  Harness h("rejoining");
  h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"x"});
  h.CrashAndRestart();
  // The node record is loaded but the node has not registered again.
  auto waiting = h.svc->PutStart(PutReq({"y"}, {1}));
  CHECK(waiting.status().code() == StatusCode::kUnavailable);
  CHECK(ReasonOf(waiting.status()) == StatusReason::kNodesRejoining);
  // Registered again, but its objects are not reconciled yet: still
  // waiting.
  auto back = Reg(h.svc.get(), NodeReq("a", 1, {{0, 1 << 20}}));
  REQUIRE(back.ok());
  REQUIRE(back->reconcile());
  waiting = h.svc->PutStart(PutReq({"y"}, {1}));
  CHECK(ReasonOf(waiting.status()) == StatusReason::kNodesRejoining);
  h.ReconcileWith(back->node_id(), 1, h.Listed(back->node_id()));
  CHECK(h.Put({"y"}) == back->node_id());

  // A node that does not come back within node_timeout is dead: refused.
  h.CrashAndRestart();
  CHECK(ReasonOf(h.svc->PutStart(PutReq({"z"}, {1})).status()) ==
        StatusReason::kNodesRejoining);
  h.clock.Advance(absl::Seconds(11));
  auto refused = h.svc->PutStart(PutReq({"z"}, {1}));
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(ReasonOf(refused.status()) == StatusReason::kNone);
}

TEST_CASE("Re-registering with a new incarnation purges every region") {
  Harness h("incarnation");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}, {1, 1 << 20, 64, true}});
  // Fill both regions.
  std::vector<std::string> keys;
  for (int i = 0; i < 16; ++i) keys.push_back("k" + std::to_string(i));
  h.Put(keys, 1000);
  auto pending = h.Start({"p"}, {10});
  auto l = h.Lookup(keys);
  int volatile_count = 0;
  for (const auto& r : l.results()) volatile_count += r.location().region_id() == 0;
  REQUIRE(volatile_count > 0);
  REQUIRE(volatile_count < 16);

  // Same incarnation: nothing purged.
  CHECK(h.Register("a", 1, {{0, 1 << 20}, {1, 1 << 20, 64, true}}) == a);
  CHECK(h.svc->GetStats().object_count() == 16);
  CHECK(h.svc->GetStats().pending_puts() == 1);

  // New incarnation: the node's memory started afresh (DRAM restarted, or a
  // persistent capacity file was re-formatted): every region is purged.
  CHECK(h.Register("a", 2, {{0, 1 << 20}, {1, 1 << 20, 64, true}}) == a);
  auto after = h.Lookup(keys);
  for (int i = 0; i < 16; ++i) CHECK_FALSE(after.results(i).found());
  CHECK(h.svc->GetStats().object_count() == 0);
  CHECK(h.svc->GetStats().pending_puts() == 0);
  CHECK(h.svc->counters().objects_purged == 16u);
  auto node = h.svc->ListNodes().nodes(0);
  CHECK(node.incarnation() == 2);
  CHECK(node.regions(0).used_bytes() == 0);
  CHECK(node.regions(1).used_bytes() == 0);
  v1::PutCommitRequest c;
  c.set_put_id(pending.put_id());
  CHECK(h.svc->PutCommit(c).status().code() == StatusCode::kNotFound);

  // The purge is durable.
  h.Restart();
  CHECK(h.svc->GetStats().object_count() == 0);
  // Every heartbeat to the new process is answered "register again"; after
  // that, heartbeats of the registered incarnation are accepted.
  v1::HeartbeatRequest hb;
  hb.set_node_id(a);
  hb.set_incarnation(1);
  CHECK(Hb(h.svc.get(), hb)->reregister());
  hb.set_incarnation(2);
  CHECK(Hb(h.svc.get(), hb)->reregister());
  h.Register("a", 2, {{0, 4096}, {1, 4096}});
  hb.set_incarnation(1);
  CHECK(Hb(h.svc.get(), hb)->reregister());
  h.Heartbeat(a, 2);
}

TEST_CASE("Re-registering with new regions rebuilds the allocators") {
  Harness h("regions");
  h.Register("a", 1, {{0, 1 << 20}, {1, 1 << 20}});
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) keys.push_back("k" + std::to_string(i));
  for (const auto& k : keys) h.Put({k}, 4096);  // unrelated objects
  auto l = h.Lookup(keys);
  // Region 1 disappears; region 0 stays: region-1 objects are dropped.
  h.Rejoin("a", 1, {{0, 1 << 20}});
  auto after = h.Lookup(keys);
  int kept = 0;
  for (int i = 0; i < 8; ++i) {
    bool in0 = l.results(i).location().region_id() == 0;
    CHECK(after.results(i).found() == in0);
    kept += in0;
  }
  CHECK(kept > 0);
  auto node = h.svc->ListNodes().nodes(0);
  REQUIRE(node.regions_size() == 1);
  CHECK(node.regions(0).used_bytes() == uint64_t(kept) * 4096);
  CHECK(node.object_count() == uint64_t(kept));
  // Shrinking region 0 below the objects' offsets drops them too.
  h.Rejoin("a", 1, {{0, 4096}});
  CHECK(h.svc->GetStats().object_count() <= 1);
  CHECK(h.svc->GetStats().object_bytes() ==
        h.svc->GetStats().object_count() * 4096);
}

TEST_CASE("DeregisterNode kills the node and purges volatile objects") {
  Harness h("deregister");
  uint32_t a = h.Register("a", 7, {{0, 1 << 20}});
  uint32_t b = h.Register("b", 7, {{0, 1 << 20, 64, true}}, 7100);
  CHECK(h.Put({"x"}) == a);
  CHECK(h.Put({"y"}) == b);
  auto pending = h.Start({"p"}, {10}, a);
  REQUIRE(pending.node().node_id() == a);

  v1::DeregisterNodeRequest d;
  d.set_node_id(a);
  d.set_incarnation(8);
  CHECK(Dereg(h.svc.get(), d).status().code() ==
        StatusCode::kFailedPrecondition);
  d.set_node_id(99);
  CHECK(Dereg(h.svc.get(), d).status().code() == StatusCode::kNotFound);
  d.set_node_id(a);
  d.set_incarnation(7);
  REQUIRE(Dereg(h.svc.get(), d).ok());
  CHECK_FALSE(h.svc->ListNodes().nodes(0).alive());
  CHECK(h.UsedBytes(a) == 0);
  CHECK(h.svc->GetStats().pending_puts() == 0);
  v1::HeartbeatRequest hb;
  hb.set_node_id(a);
  hb.set_incarnation(7);
  CHECK(Hb(h.svc.get(), hb)->reregister());
  CHECK(h.Put({"z"}) == b);

  d.set_node_id(b);
  REQUIRE(Dereg(h.svc.get(), d).ok());
  CHECK_FALSE(h.Lookup({"y"}).results(0).found());  // dead
  CHECK(h.Rejoin("b", 7, {{0, 1 << 20, 64, true}}, 7100) == b);
  CHECK(h.Lookup({"y"}).results(0).found());  // persistent: kept
  CHECK(h.Register("a", 7, {{0, 1 << 20}}) == a);
  CHECK_FALSE(h.Lookup({"x"}).results(0).found());
}

TEST_CASE("registration reports retained objects and a generation ceiling") {
  Harness h("retained");
  auto first = Reg(h.svc.get(), NodeReq("n1", 5, {{0, 1 << 20}}));
  REQUIRE(first.ok());
  CHECK_FALSE(first->objects_retained());  // a new node: nothing is known
  auto put = h.Start({"a", "b"}, {100, 100});
  h.Commit(put);
  uint64_t max_gen = 0;
  for (const auto& slot : put.slots()) {
    max_gen = std::max(max_gen, slot.location().generation());
  }
  CHECK(first->generation_ceiling() >= max_gen);

  // Same incarnation coming back (e.g. after a master restart): retained.
  h.Restart();
  auto again = Reg(h.svc.get(), NodeReq("n1", 5, {{0, 1 << 20}}));
  REQUIRE(again.ok());
  CHECK(again->objects_retained());
  CHECK(again->reconcile());
  CHECK(again->generation_ceiling() >= max_gen);
  h.ReconcileWith(again->node_id(), 5, h.Listed(again->node_id()));
  v1::HeartbeatRequest hb;
  hb.set_node_id(again->node_id());
  hb.set_incarnation(5);
  auto hr = Hb(h.svc.get(), hb);
  REQUIRE(hr.ok());
  CHECK_FALSE(hr->reregister());
  CHECK(hr->generation_ceiling() >= max_gen);
  // Every generation issued after a restart stays under the ceiling the
  // node was told, even across generation blocks.
  for (int i = 0; i < 40; ++i) {
    auto p = h.Start({"k" + std::to_string(i)}, {64});
    CHECK(p.slots(0).location().generation() <= Hb(h.svc.get(), hb)->generation_ceiling());
    h.Commit(p);
  }

  // A new incarnation of DRAM memory: nothing retained.
  auto fresh = Reg(h.svc.get(), NodeReq("n1", 6, {{0, 1 << 20}}));
  REQUIRE(fresh.ok());
  CHECK_FALSE(fresh->objects_retained());
  // Incarnation 0 is reserved.
  CHECK(Reg(h.svc.get(), NodeReq("n2", 0, {{0, 1 << 20}})).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("A node that misses its heartbeats is logged once per outage") {
  Harness h("dead_log");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  const uint32_t b = h.Register("b", 2, {{0, 4 * kSlot}}, 7001);
  testing::LogCapture log;
  h.svc->ReapExpired();
  CHECK(log.Count("missed its heartbeats") == 0);
  h.clock.Advance(absl::Seconds(6));
  h.Heartbeat(a, 1);
  h.clock.Advance(absl::Seconds(6));  // b silent for 12 s, a for 6 s
  h.svc->ReapExpired();
  h.svc->ReapExpired();
  CHECK(log.Count("missed its heartbeats") == 1);
  CHECK(log.Count("node " + std::to_string(b) + " 'b' missed its heartbeats "
                  "for 12s: dead") == 1);
  // Back: one line, and a later outage is logged again.
  h.Heartbeat(b, 2);
  CHECK(log.Count("'b' heartbeats again: alive") == 1);
  h.clock.Advance(absl::Seconds(11));
  h.svc->ReapExpired();
  CHECK(log.Count("'b' missed its heartbeats") == 2);
  CHECK(log.Count("'a' missed its heartbeats") == 1);
}

TEST_CASE("Lookups and puts carry capabilities for exactly their location") {
  Harness h("caps", [](MasterServiceOptions& o) {
    o.capability_lifetime = absl::Minutes(2);
  });
  const uint32_t a = h.Register("a", 3, {{0, 1 << 20}});
  const std::string key = KeyByName()["a"];
  REQUIRE(key.size() == kNodeKeyBytes);
  // Never published.
  const v1::ListNodesResponse listed = h.svc->ListNodes();
  for (const auto& n : listed.nodes()) CHECK(n.node_key().empty());
  auto put = h.Start({"k1"}, {100});
  REQUIRE(put.slots(0).state() == v1::SLOT_ALLOCATED);
  const auto& slot = put.slots(0);
  CHECK(NodeChecks(key, 3, slot.location(), slot.capability(), wire::kCapWrite,
                   h.clock.Now())
            .ok());
  CHECK(slot.capability().expires_unix_ms() == put.expires_unix_ms());
  // A write capability is no read capability.
  CHECK(NodeChecks(key, 3, slot.location(), slot.capability(), wire::kCapRead,
                   h.clock.Now())
            .code() == StatusCode::kPermissionDenied);
  h.Commit(put);
  const v1::BatchLookupResponse got = h.Lookup({"k1"});
  REQUIRE(got.results(0).found());
  const auto& r = got.results(0);
  CHECK(NodeChecks(key, 3, r.location(), r.capability(), wire::kCapRead,
                   h.clock.Now())
            .ok());
  CHECK(r.capability().expires_unix_ms() ==
        absl::ToUnixMillis(h.clock.Now() + absl::Minutes(2)));
  // Another generation, or the other incarnation, is refused.
  v1::Location other = r.location();
  other.set_generation(other.generation() + 1);
  CHECK(NodeChecks(key, 3, other, r.capability(), wire::kCapRead,
                   h.clock.Now())
            .code() == StatusCode::kPermissionDenied);
  CHECK(NodeChecks(key, 4, r.location(), r.capability(), wire::kCapRead,
                   h.clock.Now())
            .code() == StatusCode::kPermissionDenied);
  // Expired (past the node's 30 s skew allowance).
  CHECK(NodeChecks(key, 3, r.location(), r.capability(), wire::kCapRead,
                   h.clock.Now() + absl::Minutes(2) + absl::Seconds(31))
            .code() == StatusCode::kPermissionDenied);
  (void)a;
}

TEST_CASE("A registration whose answer was lost is answered again, with the same key, to the same process only") {
  Harness h("lost-answer");
  v1::RegisterNodeRequest req = NodeReq("a", 5, {{0, 1 << 20}});
  req.set_registration_nonce(std::string(32, 'n'));
  auto first = h.svc->RegisterNode(req);  // its answer never arrives
  REQUIRE(first.ok());
  const std::string key = first->node_key();
  // Nothing is placed there meanwhile: the node has not proven the key.
  CHECK(h.svc->PutStart(PutReq({"k1"}, {1})).status().code() ==
        StatusCode::kResourceExhausted);

  // Another process with the published name and incarnation: a missing or
  // different nonce is refused, as any registration without a proof.
  v1::RegisterNodeRequest other = NodeReq("a", 5, {{0, 1 << 20}}, 6666);
  CHECK(h.svc->RegisterNode(other).status().code() ==
        StatusCode::kPermissionDenied);
  other.set_registration_nonce(std::string(32, 'x'));
  CHECK(h.svc->RegisterNode(other).status().code() ==
        StatusCode::kPermissionDenied);
  v1::RegisterNodeRequest long_nonce = req;
  long_nonce.set_registration_nonce(std::string(65, 'n'));
  CHECK(h.svc->RegisterNode(long_nonce).status().code() ==
        StatusCode::kInvalidArgument);

  // The same process retries: the same node, the same key, nothing lost.
  auto again = h.svc->RegisterNode(req);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(again->node_id() == first->node_id());
  CHECK(again->node_key() == key);
  CHECK(again->objects_retained());

  // Once the node has proven the key (a heartbeat), it takes placements,
  // and a registration without a proof is refused even with the nonce: the
  // node has the key.
  KeyByName()["a"] = key;
  NameById()[first->node_id()] = "a";
  h.Heartbeat(first->node_id(), 5);
  h.Put({"k1"});
  REQUIRE(h.Found({"k1"}) == "1");
  CHECK(h.svc->RegisterNode(req).status().code() ==
        StatusCode::kPermissionDenied);
  CHECK(h.Listed(first->node_id()).size() == 1);
}

TEST_CASE("Only the holder of a node's key keeps, leaves or takes its name") {
  Harness h("impostor");
  const uint32_t a = h.Register("a", 5, {{0, 1 << 20}});
  h.Put({"k1"});
  const std::string key = KeyByName()["a"];

  // An impostor with the published name and incarnation and its own data
  // address: refused while the node is alive; the objects stay pointed at it.
  v1::RegisterNodeRequest fake = NodeReq("a", 5, {{0, 1 << 20}}, 6666);
  auto r = h.svc->RegisterNode(fake);
  CHECK(r.status().code() == StatusCode::kPermissionDenied);
  fake.mutable_auth()->set_unix_ms(absl::ToUnixMillis(h.clock.Now()));
  fake.mutable_auth()->set_proof(std::string(kNodeProofBytes, 'x'));
  CHECK(h.svc->RegisterNode(fake).status().code() ==
        StatusCode::kPermissionDenied);
  // A new incarnation without the key: refused too (it would purge).
  CHECK(h.svc->RegisterNode(NodeReq("a", 6, {{0, 1 << 20}}, 6666))
            .status()
            .code() == StatusCode::kPermissionDenied);
  CHECK(h.Found({"k1"}) == "1");
  CHECK(h.svc->ListNodes().nodes(0).data_address() == "127.0.0.1:7000");

  // Heartbeat and deregistration without the proof, or with a stale one.
  v1::HeartbeatRequest hb;
  hb.set_node_id(a);
  hb.set_incarnation(5);
  CHECK(h.svc->Heartbeat(hb).status().code() == StatusCode::kPermissionDenied);
  v1::DeregisterNodeRequest d;
  d.set_node_id(a);
  d.set_incarnation(5);
  CHECK(h.svc->DeregisterNode(d).status().code() ==
        StatusCode::kPermissionDenied);
  v1::DeregisterNodeRequest old = d;
  *old.mutable_auth() = AuthFor(h.svc.get(), "deregister", "a", a, 5);
  h.clock.Advance(absl::Minutes(6));  // beyond node_auth_window
  h.Heartbeat(a, 5);
  CHECK(h.svc->DeregisterNode(old).status().code() ==
        StatusCode::kPermissionDenied);
  // A heartbeat's proof is no deregistration's.
  v1::DeregisterNodeRequest wrong = d;
  *wrong.mutable_auth() = AuthFor(h.svc.get(), "heartbeat", "a", a, 5);
  CHECK(h.svc->DeregisterNode(wrong).status().code() ==
        StatusCode::kPermissionDenied);
  CHECK(h.Found({"k1"}) == "1");

  // The real node re-registers with its proof: same key, objects kept.
  auto back = Reg(h.svc.get(), NodeReq("a", 5, {{0, 1 << 20}}));
  REQUIRE(back.ok());
  CHECK(back->objects_retained());
  CHECK(back->node_key() == key);

  // The key survives a master restart: a proof is accepted after it, and
  // the name is still refused to an impostor (every node counts as alive
  // from the load for node_timeout).
  h.CrashAndRestart();
  CHECK(h.svc->RegisterNode(NodeReq("a", 5, {{0, 1 << 20}}, 6666))
            .status()
            .code() == StatusCode::kPermissionDenied);
  back = Reg(h.svc.get(), NodeReq("a", 5, {{0, 1 << 20}}));
  REQUIRE(back.ok());
  CHECK(back->objects_retained());
  CHECK(back->node_key() == key);

  // Once the node is gone, a new node may take the name, but not its
  // objects: they are purged, and it gets a new key.
  h.clock.Advance(absl::Seconds(11));
  auto taken = h.svc->RegisterNode(NodeReq("a", 5, {{0, 1 << 20}}, 6666));
  REQUIRE(taken.ok());
  CHECK_FALSE(taken->objects_retained());
  CHECK(taken->node_key() != key);
  CHECK(h.Found({"k1"}) == "0");
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
