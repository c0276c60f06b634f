// MasterService's on-call operations: draining a node (SetNodeDraining),
// relocating its objects (PutStart relocate_from_node) and inspecting a key
// (InspectKey).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/capability.h"
#include "common/fake_clock.h"
#include "master/fake_metadata_store.h"
#include "master/master_service.h"
#include "master/master_test_util.h"
#include "master/metadata_store.h"
#include "master/proving_heartbeat.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;
using absl::StatusCode;

constexpr uint64_t kCapacity = 1 << 20;

v1::RegisterNodeRequest NodeReq(const std::string& name, int port) {
  v1::RegisterNodeRequest r = OneRegionNodeReq(name, port, kCapacity);
  r.mutable_regions(0)->set_device_kind("dram");
  return r;
}

// A master over a real RocksDB store (or a fake one, for failures) with a
// FakeClock; restartable.
struct Harness {
  explicit Harness(const std::string& name, bool fake_store = false)
      : dir(TestDir(name)), fake(fake_store) {
    options.clock = &clock;
    Open();
  }
  void Open() {
    std::unique_ptr<MetadataStore> store;
    if (fake) {
      auto f = std::make_unique<FakeMetadataStore>();
      fake_store = f.get();
      store = std::move(f);
    } else {
      RocksDbMetadataStoreOptions so;
      so.path = dir;
      auto s = RocksDbMetadataStore::Create(so);
      REQUIRE(s.ok());
      store = std::move(s).value();
    }
    auto s = MasterService::Create(options, std::move(store));
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    svc = std::move(s).value();
  }
  void Restart() {
    svc.reset();
    Open();
  }
  v1::NodeAuth AuthFor(const std::string& purpose, const std::string& name,
                       uint32_t id) {
    v1::NodeAuth a;
    auto k = keys.find(name);
    if (k == keys.end()) return a;
    a.set_unix_ms(absl::ToUnixMillis(clock.Now()));
    a.set_proof(NodeProof(HmacSha256(k->second), purpose, name, id, 1,
                          a.unix_ms()));
    return a;
  }
  // Registers (or re-registers, proving the key) and reconciles if asked,
  // holding everything the master lists for the node.
  uint32_t Register(const std::string& name, int port) {
    v1::RegisterNodeRequest req = NodeReq(name, port);
    *req.mutable_auth() = AuthFor("register", name, 0);
    auto r = svc->RegisterNode(req);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    keys[name] = r->node_key();
    key_by_id[r->node_id()] = r->node_key();
    if (r->reconcile()) {
      google::protobuf::RepeatedPtrField<v1::Location> held;
      uint64_t cursor = 0;
      bool more = true;
      while (more) {
        v1::ListObjectsResponse page;
        more = svc->ListObjects(r->node_id(), &cursor, 100, &page);
        for (const auto& o : page.objects()) *held.Add() = o.location();
      }
      auto rec = svc->BeginReconcile(r->node_id(), 1);
      REQUIRE(rec.ok());
      REQUIRE((*rec)->Add(held).ok());
      REQUIRE(svc->FinishReconcile(std::move(*rec)).ok());
    }
    // The heartbeat a node sends right after registering: it proves the
    // key, and only then is the node placeable.
    v1::HeartbeatRequest hb;
    hb.set_node_id(r->node_id());
    hb.set_incarnation(1);
    *hb.mutable_auth() = AuthFor("heartbeat", name, r->node_id());
    REQUIRE(svc->Heartbeat(hb).ok());
    return r->node_id();
  }
  absl::StatusOr<v1::PutStartResponse> Start(const std::string& key,
                                             uint32_t preferred = 0,
                                             const std::string& parent = "") {
    v1::PutStartRequest r;
    r.add_keys(key);
    r.add_lengths(4096);
    r.set_preferred_node_id(preferred);
    r.set_parent_key(parent);
    return svc->PutStart(r);
  }
  // Puts and commits `keys` as one chain; returns the node used.
  uint32_t Put(std::vector<std::string> keys_in_chain, uint32_t preferred = 0,
               const std::string& parent = "") {
    v1::PutStartRequest r;
    for (const auto& k : keys_in_chain) {
      r.add_keys(k);
      r.add_lengths(4096);
    }
    r.set_preferred_node_id(preferred);
    r.set_parent_key(parent);
    auto s = svc->PutStart(r);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE(s->put_id() != 0);
    v1::PutCommitRequest c;
    c.set_put_id(s->put_id());
    AddWriteReceipts(*s, HmacSha256(key_by_id.at(s->node().node_id())), &c);
    REQUIRE(svc->PutCommit(c).ok());
    return s->node().node_id();
  }
  absl::StatusOr<v1::SetNodeDrainingResponse> Drain(const std::string& name,
                                                    bool draining) {
    v1::SetNodeDrainingRequest r;
    r.set_name(name);
    r.set_draining(draining);
    return svc->SetNodeDraining(r);
  }
  v1::NodeInfo Node(uint32_t id) {
    const v1::ListNodesResponse all = svc->ListNodes();
    for (const auto& n : all.nodes()) {
      if (n.node_id() == id) return n;
    }
    FAIL("no node " << id);
    return {};
  }
  v1::InspectKeyResponse Inspect(const std::string& key) {
    v1::InspectKeyRequest r;
    r.set_key(key);
    auto out = svc->InspectKey(r);
    INFO(out.status().ToString());
    REQUIRE(out.ok());
    return *out;
  }

  std::string dir;
  bool fake;
  FakeMetadataStore* fake_store = nullptr;
  FakeClock clock;
  MasterServiceOptions options;
  std::map<std::string, std::string> keys;  // node name -> node key
  std::map<uint32_t, std::string> key_by_id;  // node id -> key
  std::unique_ptr<MasterService> svc;
};

TEST_CASE("A drained node gets no new placements and keeps serving, across restarts") {
  Harness h("drain");
  const uint32_t a = h.Register("a", 7000);
  const uint32_t b = h.Register("b", 7100);
  CHECK(h.Put({"x"}, a) == a);

  auto d = h.Drain("a", true);
  REQUIRE(d.ok());
  CHECK(d->node_id() == a);
  CHECK(d->changed());
  CHECK(d->object_count() == 1);
  CHECK_FALSE(h.Drain("a", true)->changed());
  CHECK(h.Node(a).draining());
  CHECK(h.Node(a).alive());
  CHECK(h.svc->GetStats().nodes(0).draining());

  // Neither as the preferred node nor as the parent's node, nor by round
  // robin.
  CHECK(h.Put({"p"}, a) == b);
  CHECK(h.Put({"child"}, 0, "x") == b);
  for (int i = 0; i < 4; ++i) CHECK(h.Put({"rr" + std::to_string(i)}) == b);
  // Its object is still found, and still exists for a new put of its key.
  v1::BatchLookupRequest look;
  look.add_keys("x");
  auto found = h.svc->BatchLookup(look);
  REQUIRE(found.ok());
  CHECK(found->results(0).found());
  CHECK(found->results(0).location().node_id() == a);
  auto again = h.Start("x");
  REQUIRE(again.ok());
  CHECK(again->slots(0).state() == v1::SLOT_EXISTS);

  // Nothing placeable: refused, saying why.
  REQUIRE(h.Drain("b", true).ok());
  auto none = h.Start("nowhere");
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(none.status().message().find("2 alive but draining") !=
        std::string::npos);
  REQUIRE(h.Drain("b", false).ok());

  // A master restart and the node's re-registration keep the drain.
  h.Restart();
  CHECK(h.Node(a).draining());
  CHECK_FALSE(h.Node(b).draining());
  h.Register("a", 7000);
  h.Register("b", 7100);
  CHECK(h.Node(a).draining());
  CHECK(h.Node(a).alive());
  CHECK(h.Put({"after-restart"}, a) == b);
  found = h.svc->BatchLookup(look);
  REQUIRE(found.ok());
  CHECK(found->results(0).found());

  // Undrained: placements resume.
  auto u = h.Drain("a", false);
  REQUIRE(u.ok());
  CHECK(u->changed());
  CHECK_FALSE(h.Node(a).draining());
  CHECK(h.Put({"back"}, a) == a);
  h.Restart();
  CHECK_FALSE(h.Node(a).draining());

  CHECK(h.Drain("nope", true).status().code() == StatusCode::kNotFound);
}

TEST_CASE(
    "A relocation moves a drained node's chains elsewhere, links and all, and "
    "only what is still there") {
  Harness h("relocate");
  const uint32_t a = h.Register("a", 7000);
  const uint32_t b = h.Register("b", 7100);
  // A chain c0..c3 on a, a branch x after c1 on a, and the chain continued
  // on b (y after c3: a cross link).
  REQUIRE(h.Put({"c0", "c1", "c2", "c3"}, a) == a);
  REQUIRE(h.Put({"x"}, a, "c1") == a);
  REQUIRE(h.Put({"y"}, b, "c3") == b);
  REQUIRE(h.Put({"gone"}, a) == a);
  REQUIRE(h.Drain("a", true).ok());

  auto relocate = [&](std::vector<std::string> keys,
                      const std::string& parent) {
    v1::PutStartRequest r;
    for (const auto& k : keys) {
      r.add_keys(k);
      r.add_lengths(4096);
    }
    r.set_parent_key(parent);
    r.set_relocate_from_node(a);
    return h.svc->PutStart(r);
  };
  auto commit = [&](const v1::PutStartResponse& s) {
    v1::PutCommitRequest c;
    c.set_put_id(s.put_id());
    AddWriteReceipts(s, HmacSha256(h.key_by_id.at(s.node().node_id())), &c);
    auto done = h.svc->PutCommit(c);
    INFO(done.status().ToString());
    REQUIRE(done.ok());
    return done->committed();
  };
  const uint64_t gen_c1 = h.Inspect("c1").location().generation();

  // Head first, as hymctl drain --copy does. Keys not on a are skipped.
  auto s = relocate({"c0", "c1", "c2", "c3", "y", "never"}, "");
  REQUIRE(s.ok());
  CHECK(s->node().node_id() == b);
  for (int i = 0; i < 4; ++i) CHECK(s->slots(i).state() == v1::SLOT_ALLOCATED);
  CHECK(s->slots(4).state() == v1::SLOT_NOT_ON_NODE);
  CHECK(s->slots(5).state() == v1::SLOT_NOT_ON_NODE);
  // Until the commit, readers are sent to a.
  CHECK(h.Inspect("c1").location().node_id() == a);
  auto g = relocate({"gone"}, "");
  REQUIRE(g.ok());
  // The same keys cannot be relocated twice at once.
  auto twice = relocate({"c0"}, "");
  REQUIRE(twice.ok());
  CHECK(twice->slots(0).state() == v1::SLOT_IN_PROGRESS);

  CHECK(commit(*s) == 4);
  for (const char* k : {"c0", "c1", "c2", "c3"}) {
    INFO(k);
    const v1::InspectKeyResponse i = h.Inspect(k);
    CHECK(i.location().node_id() == b);
    CHECK_FALSE(i.unreachable());
  }
  CHECK(h.Inspect("c1").location().generation() != gen_c1);
  // The links stay: c2 under c1 on b, x (still on a) under c1 across
  // nodes, y now under c3 on its own node.
  CHECK(h.Inspect("c2").parent_key() == "c1");
  CHECK_FALSE(h.Inspect("c2").parent_on_other_node());
  CHECK(h.Inspect("x").parent_key() == "c1");
  CHECK(h.Inspect("x").parent_on_other_node());
  CHECK(h.Inspect("y").parent_key() == "c3");
  CHECK_FALSE(h.Inspect("y").parent_on_other_node());
  CHECK(h.Inspect("c1").cross_children() == 1);
  CHECK(h.svc->counters().objects_relocated == 4);
  // a keeps x and gone; its space for the others is freed.
  CHECK(h.Node(a).object_count() == 2);
  CHECK(h.Node(a).used_bytes() == 2 * 4096);

  // Removed before its copy commits: the copy is dropped, not resurrected.
  v1::RemoveRequest rm;
  rm.add_keys("gone");
  REQUIRE(h.svc->Remove(rm).ok());
  CHECK(commit(*g) == 0);
  CHECK(h.svc->counters().relocations_skipped == 1);
  CHECK_FALSE(h.Inspect("gone").found());
  const uint64_t b_used = h.Node(b).used_bytes();

  // Durable: a restart lists the same.
  h.Restart();
  h.Register("a", 7000);
  h.Register("b", 7100);
  CHECK(h.Inspect("c3").location().node_id() == b);
  CHECK(h.Inspect("y").parent_key() == "c3");
  CHECK(h.Inspect("x").parent_key() == "c1");
  CHECK(h.Node(b).used_bytes() == b_used);
  // Removing c1 still takes everything after it, wherever it is.
  rm.clear_keys();
  rm.add_keys("c1");
  REQUIRE(h.svc->Remove(rm).ok());
  for (const char* k : {"c2", "c3", "x", "y"})
    CHECK_FALSE(h.Inspect(k).found());
  CHECK(h.Inspect("c0").found());

  // A relocation from an unknown node is refused; with nowhere else to go,
  // nothing is allocated.
  v1::PutStartRequest bad;
  bad.add_keys("c0");
  bad.add_lengths(4096);
  bad.set_relocate_from_node(99);
  CHECK(h.svc->PutStart(bad).status().code() == StatusCode::kNotFound);
  REQUIRE(h.Put({"z"}, a) == b);  // a drains: z is on b
  REQUIRE(h.Drain("a", false).ok());
  REQUIRE(h.Drain("b", true).ok());
  bad.set_relocate_from_node(b);
  bad.set_keys(0, "z");
  auto to_a = h.svc->PutStart(bad);
  REQUIRE(to_a.ok());
  CHECK(to_a->node().node_id() == a);
  REQUIRE(h.Drain("a", true).ok());
  bad.set_keys(0, "c0");
  auto nowhere = h.svc->PutStart(bad);
  CHECK(nowhere.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("A drain that cannot be written changes nothing") {
  Harness h("drain_fail", /*fake_store=*/true);
  const uint32_t a = h.Register("a", 7000);
  h.fake_store->FailWritesForTest(absl::UnavailableError("disk gone"));
  CHECK(h.Drain("a", true).status().code() == StatusCode::kUnavailable);
  h.fake_store->FailWritesForTest(absl::OkStatus());
  CHECK_FALSE(h.Node(a).draining());
  CHECK(h.Put({"k"}) == a);
}

TEST_CASE("InspectKey: location, node state, last read, lease, chain, tenant") {
  Harness h("inspect");
  h.options.read_lease = absl::Seconds(5);
  const uint32_t a = h.Register("a", 7000);
  h.Register("b", 7100);
  CHECK(h.Put({"c0", "c1", "c2"}, a) == a);

  v1::InspectKeyResponse r = h.Inspect("c1");
  CHECK(r.found());
  CHECK(r.location().node_id() == a);
  CHECK(r.location().length() == 4096);
  CHECK(r.location().generation() > 0);
  CHECK(r.node().node_id() == a);
  CHECK(r.node().name() == "a");
  CHECK(r.node().alive());
  CHECK(r.node().node_key().empty());  // never sent
  CHECK(r.parent_key() == "c0");
  CHECK_FALSE(r.parent_on_other_node());
  CHECK(r.children() == 1);
  CHECK_FALSE(r.unreachable());
  CHECK(r.tenant() == "default");
  CHECK(r.last_read_unix_ms() == 0);
  CHECK(r.lease_expires_unix_ms() == 0);
  CHECK_FALSE(r.put_in_progress());
  CHECK(h.Inspect("c0").parent_key().empty());
  CHECK(h.Inspect("c2").children() == 0);

  // A read: recent use and a lease, which runs out.
  h.clock.Advance(absl::Seconds(3));
  const int64_t read_ms = absl::ToUnixMillis(h.clock.Now());
  v1::BatchLookupRequest read;
  read.add_keys("c0");
  read.add_keys("c1");
  read.set_for_read(true);
  REQUIRE(h.svc->BatchLookup(read).ok());
  r = h.Inspect("c1");
  CHECK(r.last_read_unix_ms() == read_ms);
  CHECK(r.lease_expires_unix_ms() == read_ms + 5000);
  h.clock.Advance(absl::Seconds(6));
  r = h.Inspect("c1");
  CHECK(r.last_read_unix_ms() == read_ms);
  CHECK(r.lease_expires_unix_ms() == 0);

  // A chain continued on another node (its parent's node drained).
  REQUIRE(h.Drain("a", true).ok());
  h.Put({"c3"}, 0, "c2");
  r = h.Inspect("c3");
  CHECK(r.parent_key() == "c2");
  CHECK(r.parent_on_other_node());
  CHECK(h.Inspect("c2").cross_children() == 1);
  CHECK(h.Inspect("c2").node().draining());

  // A pending put; a tenant's key; a missing key.
  auto pending = h.Start("pending");
  REQUIRE(pending.ok());
  r = h.Inspect("pending");
  CHECK_FALSE(r.found());
  CHECK(r.put_in_progress());
  const std::string qualified = QualifyKey("acme", "k");
  h.Put({qualified});
  CHECK(h.Inspect(qualified).tenant() == "acme");
  CHECK(h.Inspect(qualified).found());
  CHECK_FALSE(h.Inspect("absent").found());
  v1::InspectKeyRequest empty;
  CHECK(h.svc->InspectKey(empty).status().code() ==
        StatusCode::kInvalidArgument);

  // A dead node's key is a miss for lookups, but InspectKey finds it.
  h.clock.Advance(h.options.node_timeout + absl::Seconds(1));
  v1::BatchLookupRequest look;
  look.add_keys("c0");
  CHECK_FALSE(h.svc->BatchLookup(look)->results(0).found());
  r = h.Inspect("c0");
  CHECK(r.found());
  CHECK_FALSE(r.node().alive());
}

}  // namespace
}  // namespace master
}  // namespace hymcache
