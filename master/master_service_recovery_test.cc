// MasterService tests: restarts: store scans, index snapshots, recency across
// restarts (master_service_recovery.cc).
// The shared Harness is in master_service_test_fixture.h.

#include <catch2/catch.hpp>

#include <filesystem>

#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE("Restart keeps committed objects and nodes, not pending puts") {
  Harness h("restart");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  uint32_t b = h.Register("b", 1, {{0, 1 << 20, 64, true}}, 7100);
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back("key" + std::to_string(i));
  uint64_t max_generation = 0;
  for (int i = 0; i < 40; i += 4) {
    auto r = h.Start({keys[i], keys[i + 1], keys[i + 2], keys[i + 3]},
                     {100, 200, 300, 400});
    for (const auto& s : r.slots()) {
      max_generation = std::max(max_generation, s.location().generation());
    }
    h.Commit(r);
  }
  auto pending = h.Start({"pending1", "pending2"}, {64, 64});
  for (const auto& s : pending.slots()) {
    max_generation = std::max(max_generation, s.location().generation());
  }
  uint64_t used_a = h.UsedBytes(a) - 128 * (pending.node().node_id() == a);
  uint64_t used_b = h.UsedBytes(b) - 128 * (pending.node().node_id() == b);
  auto before = h.Lookup(keys);

  h.clock.Advance(absl::Seconds(100));  // long downtime
  h.Restart();

  // No node is served before it registers with the new process.
  CHECK(h.Lookup(keys).hit_prefix_length() == 0);
  CHECK(h.svc->GetStats().nodes_alive() == 0);
  v1::HeartbeatRequest stale_hb;
  stale_hb.set_node_id(a);
  stale_hb.set_incarnation(1);
  CHECK(Hb(h.svc.get(), stale_hb)->reregister());
  auto back = Reg(h.svc.get(), NodeReq("a", 1, {{0, 1 << 20}}));
  REQUIRE(back.ok());
  CHECK(back->objects_retained());
  CHECK(back->reconcile());
  CHECK(Hb(h.svc.get(), stale_hb)->reconcile());
  CHECK(h.svc->GetStats().nodes_alive() == 0);
  CHECK(h.svc->ListNodes().nodes(0).awaiting_reconcile());
  // One that kept its objects serves them while it reconciles (a lookup
  // right after a master restart hits), but takes no placement yet.
  {
    auto during = h.Lookup(keys);
    int on_a = 0;
    for (int i = 0; i < 40; ++i) {
      const bool mine = before.results(i).location().node_id() == a;
      CHECK(during.results(i).found() == mine);
      if (mine) {
        ++on_a;
        CHECK(during.results(i).location().SerializeAsString() ==
              before.results(i).location().SerializeAsString());
      }
    }
    CHECK(on_a > 0);
    CHECK(ReasonOf(h.svc->PutStart(PutReq({"y"}, {1})).status()) ==
          StatusReason::kNodesRejoining);
  }
  h.ReconcileWith(a, 1, h.Listed(a));
  CHECK_FALSE(Hb(h.svc.get(), stale_hb)->reconcile());
  CHECK(h.Rejoin("b", 1, {{0, 1 << 20, 64, true}}, 7100) == b);

  auto after = h.Lookup(keys);
  CHECK(after.hit_prefix_length() == 40);
  for (int i = 0; i < 40; ++i) {
    CHECK(after.results(i).location().SerializeAsString() ==
          before.results(i).location().SerializeAsString());
  }
  CHECK(h.Lookup({"pending1"}).results(0).found() == false);
  CHECK(h.UsedBytes(a) == used_a);
  CHECK(h.UsedBytes(b) == used_b);
  auto stats = h.svc->GetStats();
  CHECK(stats.object_count() == 40);
  CHECK(stats.object_bytes() == 10 * 1000);
  CHECK(stats.pending_puts() == 0);
  CHECK(stats.nodes_alive() == 2);
  CHECK(stats.index_bytes_per_entry() > 0);
  CHECK(h.svc->ListNodes().nodes(1).regions(0).persistent());

  v1::PutCommitRequest c;
  c.set_put_id(pending.put_id());
  CHECK(h.svc->PutCommit(c).status().code() == StatusCode::kNotFound);

  // Ids and generations continue; freed pending space is reusable.
  CHECK(h.Register("c", 1, {{0, 1 << 20}}, 7200) == 3);
  CHECK(h.Register("a", 1, {{0, 1 << 20}}) == a);
  auto r = h.Start({"pending1", "fresh"}, {64, 64});
  for (const auto& s : r.slots()) {
    CHECK(s.state() == v1::SLOT_ALLOCATED);
    CHECK(s.location().generation() > max_generation);
  }

  // Nodes that do not heartbeat after the restart die after node_timeout.
  h.clock.Advance(absl::Seconds(11));
  CHECK(h.Lookup(keys).hit_prefix_length() == 0);
}

TEST_CASE(
    "A service that takes over an index preloaded read-only beside the "
    "writer serves exactly what a fresh load of the store would") {
  Harness h("preload");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  std::vector<std::string> keys;
  for (int i = 0; i < 24; ++i) keys.push_back("key" + std::to_string(i));
  for (int i = 0; i < 24; i += 4) {
    h.Commit(h.Start({keys[i], keys[i + 1], keys[i + 2], keys[i + 3]},
                     {100, 200, 300, 400}, i % 8 == 0 ? a : b));
  }
  // A kill -9 with the writer still open: two copies of the directory as
  // it is on disk, one to preload and take over, one to load afresh.
  const std::string taken = h.dir + "-taken";
  const std::string fresh = h.dir + "-fresh";
  for (const std::string& d : {taken, fresh}) {
    std::filesystem::remove_all(d);
    std::filesystem::copy(h.dir, d, std::filesystem::copy_options::recursive);
  }
  RocksDbMetadataStoreOptions so;
  so.path = taken;
  so.keep_wal_seconds = 3600;
  so.generation_block = 16;
  // The writer that the read-only view sits beside (a standby's follower).
  auto writer = RocksDbMetadataStore::Create(so);
  REQUIRE(writer.ok());
  RocksDbMetadataStoreOptions ro = so;
  ro.read_only = true;
  auto view = RocksDbMetadataStore::Create(ro);
  INFO(view.status().ToString());
  REQUIRE(view.ok());
  // Read-only: every write refused, generations too, nothing changed.
  MetadataMutation m;
  m.delete_objects.push_back("key0");
  absl::Status refused = (*view)->Apply(m);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*view)->NextGeneration().status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // The view sees the database as the writer left it when it opened
  // (after the writer's own generation reservation).
  const uint64_t view_sequence = (*view)->opened_sequence();
  CHECK(view_sequence == (*writer)->LatestSequence());
  CHECK(view_sequence > (*writer)->opened_sequence());
  // With a snapshot path (it loads from one if there is one): a view must
  // never write one, neither when dropped nor once taken over (it would
  // name an empty index at the view's sequence).
  MasterServiceOptions po = h.options;
  po.snapshot_path = taken + ".snapshot";
  auto preloaded = MasterService::Create(po, std::move(*view));
  INFO(preloaded.status().ToString());
  REQUIRE(preloaded.ok());
  writer->reset();

  auto store = RocksDbMetadataStore::Create(so);
  REQUIRE(store.ok());
  CHECK((*store)->opened_sequence() == view_sequence);
  auto taken_over = MasterService::CreatePreloaded(h.options, std::move(*store),
                                                   std::move(*preloaded));
  INFO(taken_over.status().ToString());
  REQUIRE(taken_over.ok());
  CHECK_FALSE(std::filesystem::exists(po.snapshot_path));
  so.path = fresh;
  auto fresh_store = RocksDbMetadataStore::Create(so);
  REQUIRE(fresh_store.ok());
  auto loaded = MasterService::Create(h.options, std::move(*fresh_store));
  REQUIRE(loaded.ok());

  // The same objects, nodes and counts.
  CHECK(Everything(taken_over->get()) == Everything(loaded->get()));
  CHECK(Everything(taken_over->get()).size() == 24);
  auto st = (*taken_over)->GetStats();
  auto want = (*loaded)->GetStats();
  CHECK(st.object_count() == want.object_count());
  CHECK(st.object_bytes() == want.object_bytes());
  CHECK((*taken_over)->ListNodes().SerializeAsString() ==
        (*loaded)->ListNodes().SerializeAsString());

  // And it works as a loaded one: the nodes come back and reconcile, the
  // objects are served, new puts land beside the old ones (the
  // allocators came along: no overlap) with newer generations.
  h.svc = std::move(*taken_over);
  h.dir = taken;
  CHECK(h.Rejoin("a", 1, {{0, 1 << 20}}) == a);
  CHECK(h.Rejoin("b", 1, {{0, 1 << 20}}, 7100) == b);
  CHECK(h.Lookup(keys).hit_prefix_length() == 24);
  const uint64_t used = h.UsedBytes(a) + h.UsedBytes(b);
  auto more = h.Start({"new0", "new1"}, {500, 500});
  REQUIRE(more.put_id() != 0);
  h.Commit(more);
  CHECK(h.UsedBytes(a) + h.UsedBytes(b) == used + 1024);  // 64-aligned
  CHECK(h.Lookup({"new0", "new1"}).hit_prefix_length() == 2);
  CHECK(Everything(h.svc.get()).size() == 26);
}

TEST_CASE("Restart drops objects that no longer fit their node") {
  const std::string dir = TestDir("restart_drop");
  FakeClock clock;
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  o.clock = &clock;
  {
    RocksDbMetadataStoreOptions so;
    so.path = dir;
    auto store = RocksDbMetadataStore::Create(so);
    REQUIRE(store.ok());
    hymcache::v1::NodeInfo n;
    n.set_node_id(4);
    n.set_name("n4");
    n.set_incarnation(1);
    n.set_alive(true);  // registered, not deregistered
    n.set_data_address("h:1");
    n.set_control_address("h:2");
    auto* r = n.add_regions();
    r->set_region_id(0);
    r->set_capacity_bytes(4096);
    r->set_alignment(64);
    MetadataMutation m;
    m.put_nodes.push_back(n);
    m.put_objects.push_back({"ok", ObjectRecord{4, 0, 0, 100, 1}});
    m.put_objects.push_back({"overlap", ObjectRecord{4, 0, 64, 100, 2}});
    m.put_objects.push_back({"outside", ObjectRecord{4, 0, 4096, 64, 3}});
    m.put_objects.push_back({"noregion", ObjectRecord{4, 9, 0, 64, 4}});
    m.put_objects.push_back({"nonode", ObjectRecord{5, 0, 0, 64, 5}});
    REQUIRE((*store)->Apply(m).ok());
  }
  for (int round = 0; round < 2; ++round) {
    RocksDbMetadataStoreOptions so;
    so.path = dir;
    auto store = RocksDbMetadataStore::Create(so);
    REQUIRE(store.ok());
    auto svc = MasterService::Create(o, std::move(store).value());
    REQUIRE(svc.ok());
    // Keys load in order: "ok" reserves [0, 128), so "overlap" at 64 is
    // dropped, as are the entries of a missing node, region or range. The
    // drop is durable: the second round loads only "ok".
    CHECK((*svc)->GetStats().object_count() == 1u);
    CHECK((*svc)->counters().objects_dropped == (round == 0 ? 4u : 0u));
    // Served once its node registers with this process and reconciles.
    CHECK_FALSE((*svc)->BatchLookup(LookupReq({"ok"}))->results(0).found());
    auto back = Reg((*svc).get(), NodeReq("n4", 1, {{0, 4096}}));
    REQUIRE(back.ok());
    REQUIRE(back->reconcile());
    auto rec = (*svc)->BeginReconcile(4, 1);
    REQUIRE(rec.ok());
    google::protobuf::RepeatedPtrField<v1::Location> held;
    v1::Location* ok = held.Add();
    ok->set_addr(0);
    ok->set_length(100);
    ok->set_generation(1);
    REQUIRE((*rec)->Add(held).ok());
    REQUIRE((*svc)->FinishReconcile(std::move(*rec)).ok());
    CHECK((*svc)->BatchLookup(LookupReq({"ok"}))->results(0).found());
    // The next id continues after the persisted one.
    auto r = Reg((*svc).get(), NodeReq("new" + std::to_string(round), 1,
                                          {{0, 4096}}));
    REQUIRE(r.ok());
    CHECK(r->node_id() == uint32_t(5 + round));
  }
}

TEST_CASE("a deregistered node stays dead across a master restart") {
  Harness h("dereg_restart");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}}, 7000);
  uint32_t b = h.Register("b", 2, {{0, 1 << 20}}, 7100);
  v1::DeregisterNodeRequest d;
  d.set_node_id(a);
  d.set_incarnation(1);
  REQUIRE(Dereg(h.svc.get(), d).ok());
  h.Restart();
  CHECK(h.Rejoin("b", 2, {{0, 1 << 20}}, 7100) == b);
  // Every placement goes to b; a is reported dead.
  for (int i = 0; i < 4; ++i) {
    auto p = h.Start({"x" + std::to_string(i)}, {64});
    CHECK(p.node().node_id() == b);
    h.Commit(p);
  }
  auto nodes = h.svc->ListNodes();
  for (const auto& n : nodes.nodes()) CHECK(n.alive() == (n.node_id() == b));
  // It comes back by registering again.
  CHECK(h.Register("a", 3, {{0, 1 << 20}}, 7000) == a);
}

TEST_CASE("Evicted objects stay gone after a restart") {
  Harness h("evict_restart");
  const uint32_t a = h.Register("a", 1, {{0, 4 * kSlot}});
  h.Put({"c0", "c1", "c2", "c3"}, kObj);
  h.Put({"x", "y"}, kObj);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "x", "y"}) == "110011");
  h.Restart();
  CHECK(h.Rejoin("a", 1, {{0, 4 * kSlot}}) == a);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "x", "y"}) == "110011");
  CHECK(h.UsedBytes(a) == 4 * kSlot);
  CHECK(h.svc->GetStats().object_count() == 4);
  // Counters are per process.
  CHECK(h.svc->counters().evicted_objects == 0);
  // And the rebuilt index can evict again (load order).
  h.Put({"z"}, kObj);
  CHECK(h.svc->GetStats().object_count() == 4);
  CHECK(h.svc->counters().evicted_objects == 1);
}

TEST_CASE("A restart keeps the recency order, chains included") {
  Harness h("recency_restart",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 6 * kSlot}});
  auto tick = [&h] { h.clock.Advance(absl::Seconds(1)); };
  h.Put({"k0", "k1", "k2"}, kObj);
  tick();
  h.Put({"a"}, kObj);
  tick();
  h.Put({"b"}, kObj);
  tick();
  h.Read({"k0", "k1", "k2"});
  tick();
  h.Read({"a"});
  tick();
  h.Put({"c"}, kObj);
  tick();
  // Least recent first: b, the chain (tail first), a, c. Key order (what a
  // master without persisted recency loads in) is a, b, c, k0, k1, k2.
  h.Restart();
  h.Rejoin("a", 1, {{0, 6 * kSlot}});
  CHECK(h.svc->counters().orphans_removed == 0);
  const std::vector<std::string> all = {"b", "k0", "k1", "k2", "a", "c"};
  const std::vector<std::string> expect = {"011111", "011011", "010011",
                                           "000011", "000001", "000000"};
  for (int i = 0; i < 6; ++i) {
    h.Put({"n" + std::to_string(i)}, kObj);
    INFO("after " << i + 1 << " evictions");
    CHECK(h.Found(all) == expect[i]);
  }
}

TEST_CASE("Reads written by ReapExpired survive a kill -9") {
  Harness h("recency_crash",
            [](MasterServiceOptions& o) { o.read_lease = absl::ZeroDuration(); });
  h.Register("a", 1, {{0, 3 * kSlot}});
  for (const char* k : {"a", "b", "c"}) {
    h.Put({k}, kObj);
    h.clock.Advance(absl::Seconds(1));
  }
  h.Read({"a"});
  h.svc->ReapExpired();  // writes a's read
  CHECK(h.svc->counters().recency_writes == 1);
  h.clock.Advance(absl::Seconds(1));
  h.Read({"b"});  // not written before the crash: lost
  h.CrashAndRestart();
  h.Rejoin("a", 1, {{0, 3 * kSlot}});
  // Order now: b c a (b's read lost, a's kept).
  h.Put({"d"}, kObj);
  CHECK(h.Found({"a", "b", "c"}) == "101");
  h.Put({"e"}, kObj);
  CHECK(h.Found({"a", "b", "c"}) == "100");
}

TEST_CASE("recency_batch bounds the reads written per ReapExpired; 0 writes none") {
  Harness h("recency_batch",
            [](MasterServiceOptions& o) { o.recency_batch = 2; });
  h.Register("a", 1, {{0, 1 << 20}});
  for (const char* k : {"a", "b", "c"}) h.Put({k}, kObj);
  h.Read({"a", "b", "c"});
  h.Read({"a"});
  h.svc->ReapExpired();
  CHECK(h.svc->counters().recency_writes == 2);
  h.svc->ReapExpired();
  CHECK(h.svc->counters().recency_writes == 3);
  h.svc->ReapExpired();
  CHECK(h.svc->counters().recency_writes == 3);

  Harness off("recency_off",
              [](MasterServiceOptions& o) { o.recency_batch = 0; });
  off.Register("a", 1, {{0, 1 << 20}});
  off.Put({"a"}, kObj);
  off.Read({"a"});
  off.svc->ReapExpired();
  CHECK(off.svc->counters().recency_writes == 0);
  MasterServiceOptions bad;
  bad.max_eviction_scan = 0;
  CHECK(bad.Validate().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("A restart from an index snapshot plus the store's newer changes keeps every entry") {
  const std::string snap = TestDir("snapshot_file") + ".snap";
  Harness h("snapshot_restart", [&](MasterServiceOptions& o) {
    o.snapshot_path = snap;
    o.read_lease = absl::ZeroDuration();
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}, {1, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  std::vector<std::string> keys;
  // Chains of four; every other one continues the chain before it, some
  // on the other node (cross links).
  auto put_chains = [&](const std::string& prefix, int n) {
    std::string parent;
    for (int c = 0; c < n; ++c) {
      std::vector<std::string> chain;
      for (int k = 0; k < 4; ++k) {
        chain.push_back(prefix + std::to_string(c) + "/" + std::to_string(k));
      }
      const uint32_t preferred = c % 3 == 0 ? b : a;
      if (c % 2 == 1) {
        auto r = h.StartChild(chain, kObj, parent, preferred);
        REQUIRE(r.ok());
        h.Commit(*r);
      } else {
        h.Put(chain, kObj, preferred);
      }
      parent = chain.back();
      keys.insert(keys.end(), chain.begin(), chain.end());
    }
  };
  put_chains("old", 20);
  h.Read({"old0/0", "old0/1"});
  h.svc->ReapExpired();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kScan);
  // A periodic snapshot, kept aside: the crash below happens after it.
  REQUIRE(h.svc->WriteSnapshot().ok());
  const std::string saved = snap + ".saved";
  std::filesystem::copy_file(snap, saved);

  // Changes after the snapshot: new chains (some continuing old ones),
  // removals of middle blocks (their tails go as orphans), blocks stored
  // again at a new place, reads written by ReapExpired.
  put_chains("new", 10);
  h.PutChild({"cont0", "cont1"}, kObj, "old4/3");
  v1::RemoveRequest rm;
  rm.add_keys("old6/1");
  rm.add_keys("new2/2");
  REQUIRE(h.svc->Remove(rm).ok());
  v1::RemoveRequest rm2;
  rm2.add_keys("old8/3");
  REQUIRE(h.svc->Remove(rm2).ok());
  h.Put({"old8/3"}, kObj);  // back, elsewhere
  h.Read({"old10/0", "old10/1"});
  h.svc->ReapExpired();
  const std::vector<std::string> before = Everything(h.svc.get());
  REQUIRE(before.size() > 100);

  // kill -9: the store as on disk, and the periodic snapshot.
  const std::string copy = h.dir + "-crash";
  std::filesystem::copy(h.dir, copy, std::filesystem::copy_options::recursive);
  h.svc.reset();  // writes a fresh snapshot: put the old one back
  std::filesystem::copy_file(saved, snap,
                             std::filesystem::copy_options::overwrite_existing);
  h.dir = copy;
  const std::string reference = copy + "-scan";
  std::filesystem::copy(copy, reference,
                        std::filesystem::copy_options::recursive);
  h.Open();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kSnapshot);
  CHECK(Everything(h.svc.get()) == before);
  CHECK(h.svc->counters().objects_dropped == 0);

  // A scan of the same store (no snapshot) loads the same.
  {
    RocksDbMetadataStoreOptions so;
    so.path = reference;
    auto store = RocksDbMetadataStore::Create(so);
    REQUIRE(store.ok());
    MasterServiceOptions o = h.options;
    o.snapshot_path.clear();
    auto scanned = MasterService::Create(o, std::move(store).value());
    REQUIRE(scanned.ok());
    CHECK((*scanned)->load_path() == MasterService::LoadPath::kScan);
    CHECK(Everything(scanned->get()) == before);
    CHECK((*scanned)->GetStats().object_count() ==
          h.svc->GetStats().object_count());
  }

  // Served once the nodes are back; space accounting carries on.
  h.Rejoin("a", 1, {{0, 1 << 20}, {1, 1 << 20}});
  h.Rejoin("b", 1, {{0, 1 << 20}}, 7100);
  std::vector<std::string> listed;
  for (const std::string& line : before) {
    listed.push_back(line.substr(0, line.find(' ')));
  }
  CHECK(h.Found(listed) == std::string(listed.size(), '1'));
  CHECK(h.Found({"old6/2", "old6/3", "new2/3"}) == "000");
  const uint64_t used_a = h.UsedBytes(a);
  h.Put({"after"}, kObj, a);
  CHECK(h.UsedBytes(a) == used_a + kSlot);

  // A clean restart loads the shutdown's snapshot with nothing to replay
  // (its allocators built from the snapshot beside the index); a damaged
  // one is passed over for a scan. Both account space and place the next
  // objects alike.
  auto space = [](MasterService* svc) {
    std::vector<std::string> out;
    const v1::GetStatsResponse st = svc->GetStats();
    out.push_back(absl::StrCat(st.object_count(), " ", st.object_bytes()));
    const v1::ListNodesResponse nodes = svc->ListNodes();
    for (const auto& n : nodes.nodes()) {
      out.push_back(absl::StrCat(n.node_id(), ": ", n.used_bytes(), " ",
                                 n.object_count()));
      for (const auto& r : n.regions()) {
        out.push_back(absl::StrCat(" ", r.region_id(), ": ", r.used_bytes()));
      }
    }
    return out;
  };
  auto place = [&](const std::string& key) {
    h.Rejoin("a", 1, {{0, 1 << 20}, {1, 1 << 20}});
    h.Rejoin("b", 1, {{0, 1 << 20}}, 7100);
    auto r = h.Start({key}, {kObj}, a);
    REQUIRE(r.slots_size() == 1);
    return absl::StrCat(r.slots(0).location().node_id(), "/",
                        r.slots(0).location().region_id(), "/",
                        r.slots(0).location().addr());
  };
  const std::vector<std::string> space_before = space(h.svc.get());
  h.Restart();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kSnapshot);
  const std::vector<std::string> now = Everything(h.svc.get());
  CHECK(now.size() == before.size() + 1);
  CHECK(space(h.svc.get()) == space_before);
  const std::string placed = place("probe");
  h.svc.reset();
  {
    std::fstream f(snap, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\xff');
  }
  h.Open();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kScan);
  CHECK(Everything(h.svc.get()) == now);
  CHECK(space(h.svc.get()) == space_before);
  CHECK(place("probe") == placed);
}

TEST_CASE(
    "Snapshots follow the store's changes, so a kill -9 leaves a recent one to "
    "restart from") {
  const std::string snap = TestDir("snapshot_changes_file") + ".snap";
  Harness h("snapshot_changes", [&](MasterServiceOptions& o) {
    o.snapshot_path = snap;
    o.snapshot_interval = absl::ZeroDuration();  // by changes only
    o.snapshot_changes = 10;
  });
  h.Register("a", 1, {{0, 1 << 24}});
  auto written = [&] { return h.svc->counters().index_snapshots; };
  int next = 0;
  // Puts one object at a time, each followed by the upkeep's check, until
  // a snapshot is written or `most` puts; returns the puts made.
  auto put_until_snapshot = [&](int most) {
    const uint64_t before = written();
    int puts = 0;
    while (written() == before && puts < most) {
      h.Put({"k" + std::to_string(next++)}, kObj);
      ++puts;
      REQUIRE(h.svc->MaybeSnapshot().ok());
    }
    return puts;
  };

  // A young store: fewer changes than snapshot_changes.
  REQUIRE(h.svc->MaybeSnapshot().ok());
  CHECK(written() == 0);
  CHECK_FALSE(std::filesystem::exists(snap));
  // Every commit is at least one change: due within 10 puts.
  CHECK(put_until_snapshot(10) <= 10);
  CHECK(written() == 1);
  CHECK(std::filesystem::exists(snap));
  REQUIRE(h.svc->MaybeSnapshot().ok());
  CHECK(written() == 1);  // nothing since

  // Past twice snapshot_changes objects, the next waits for half as many
  // changes as the index holds objects: 20 puts are not enough at 200.
  while (h.svc->GetStats().object_count() < 200) put_until_snapshot(1000);
  const uint64_t at_200 = written();
  CHECK(put_until_snapshot(20) == 20);
  CHECK(written() == at_200);
  put_until_snapshot(400);
  CHECK(written() == at_200 + 1);

  // A few puts after it, then a kill -9: the store as on disk and the
  // snapshot the upkeep wrote (the destructor writes a fresh one).
  for (int i = 0; i < 3; ++i) h.Put({"late" + std::to_string(i)}, kObj);
  const std::vector<std::string> before = Everything(h.svc.get());
  const std::string saved = snap + ".saved";
  std::filesystem::copy_file(snap, saved,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string copy = h.dir + "-crash";
  std::filesystem::copy(h.dir, copy, std::filesystem::copy_options::recursive);
  h.svc.reset();
  std::filesystem::copy_file(saved, snap,
                             std::filesystem::copy_options::overwrite_existing);
  h.dir = copy;
  h.Open();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kSnapshot);
  CHECK(Everything(h.svc.get()) == before);
  // It counts from the snapshot it loaded: three puts since are not due.
  REQUIRE(h.svc->MaybeSnapshot().ok());
  CHECK(h.svc->counters().index_snapshots == 0);

  // Loaded by a scan (no snapshot file), it counts from sequence 0 and
  // writes one at its first upkeep.
  const std::string again = h.dir + "-again";
  std::filesystem::copy(h.dir, again, std::filesystem::copy_options::recursive);
  h.svc.reset();
  std::filesystem::remove(snap);
  h.dir = again;
  h.Open();
  CHECK(h.svc->load_path() == MasterService::LoadPath::kScan);
  REQUIRE(h.svc->MaybeSnapshot().ok());
  CHECK(h.svc->counters().index_snapshots == 1);
  CHECK(std::filesystem::exists(snap));

  // By time only (snapshot_changes 0), none without the interval.
  Harness t("snapshot_by_time", [&](MasterServiceOptions& o) {
    o.snapshot_path = TestDir("snapshot_by_time_file") + ".snap";
    o.snapshot_interval = absl::Minutes(10);
    o.snapshot_changes = 0;
  });
  t.Register("a", 1, {{0, 1 << 20}});
  for (int i = 0; i < 30; ++i) t.Put({"t" + std::to_string(i)}, kObj);
  REQUIRE(t.svc->MaybeSnapshot().ok());
  CHECK(t.svc->counters().index_snapshots == 0);
  t.clock.Advance(absl::Minutes(10));
  REQUIRE(t.svc->MaybeSnapshot().ok());
  CHECK(t.svc->counters().index_snapshots == 1);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
