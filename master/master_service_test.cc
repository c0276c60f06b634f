#include "master/master_service.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/capability.h"
#include "common/fake_clock.h"
#include "common/test_log_capture.h"
#include "common/thread.h"
#include "common/wire.h"
#include "master/fake_metadata_store.h"
#include "master/metadata_store.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;
using absl::StatusCode;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path p =
      std::filesystem::path(tmp ? tmp : "/tmp") / ("master_service_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p.parent_path());
  return p.string();
}

struct RegionSpec {
  uint32_t id;
  uint64_t capacity;
  uint32_t alignment = 64;
  bool persistent = false;
};

v1::RegisterNodeRequest NodeReq(const std::string& name, uint64_t incarnation,
                                std::vector<RegionSpec> regions,
                                int port = 7000) {
  v1::RegisterNodeRequest r;
  r.set_name(name);
  r.set_incarnation(incarnation);
  r.set_data_address("127.0.0.1:" + std::to_string(port));
  r.set_control_address("127.0.0.1:" + std::to_string(port + 1));
  for (const auto& spec : regions) {
    auto* region = r.add_regions();
    region->set_region_id(spec.id);
    region->set_capacity_bytes(spec.capacity);
    region->set_alignment(spec.alignment);
    region->set_persistent(spec.persistent);
    region->set_device_kind("dram");
    region->set_numa_node(-1);
  }
  (*r.mutable_transport_params())["tcp"] = "yes";
  return r;
}

// The node keys the masters of these tests issued, by node name, and the
// name of each node id: the tests' nodes prove their keys as real ones do.
std::map<std::string, std::string>& KeyByName() {
  static auto* m = new std::map<std::string, std::string>;
  return *m;
}
std::map<uint32_t, std::string>& NameById() {
  static auto* m = new std::map<uint32_t, std::string>;
  return *m;
}

absl::Time MasterNow(MasterService* svc) {
  Clock* c = svc->options().clock ? svc->options().clock : Clock::Real();
  return c->Now();
}

v1::NodeAuth AuthFor(MasterService* svc, const std::string& purpose,
                     const std::string& name, uint32_t id,
                     uint64_t incarnation) {
  v1::NodeAuth a;
  auto k = KeyByName().find(name);
  if (k == KeyByName().end()) return a;
  a.set_unix_ms(absl::ToUnixMillis(MasterNow(svc)));
  a.set_proof(NodeProof(HmacSha256(k->second), purpose, name, id, incarnation,
                        a.unix_ms()));
  return a;
}

// RegisterNode with a proof of the name's key if one was issued.
absl::StatusOr<v1::RegisterNodeResponse> Reg(MasterService* svc,
                                             v1::RegisterNodeRequest req) {
  *req.mutable_auth() =
      AuthFor(svc, "register", req.name(), 0, req.incarnation());
  auto r = svc->RegisterNode(req);
  if (r.ok()) {
    KeyByName()[req.name()] = r->node_key();
    NameById()[r->node_id()] = req.name();
  }
  return r;
}

absl::StatusOr<v1::HeartbeatResponse> Hb(MasterService* svc,
                                         v1::HeartbeatRequest req) {
  *req.mutable_auth() = AuthFor(svc, "heartbeat", NameById()[req.node_id()],
                                req.node_id(), req.incarnation());
  return svc->Heartbeat(req);
}

absl::StatusOr<v1::DeregisterNodeResponse> Dereg(
    MasterService* svc, v1::DeregisterNodeRequest req) {
  *req.mutable_auth() = AuthFor(svc, "deregister", NameById()[req.node_id()],
                                req.node_id(), req.incarnation());
  return svc->DeregisterNode(req);
}

v1::PutStartRequest PutReq(std::vector<std::string> keys,
                           std::vector<uint64_t> lengths,
                           uint32_t preferred = 0) {
  v1::PutStartRequest r;
  for (auto& k : keys) r.add_keys(k);
  for (auto l : lengths) r.add_lengths(l);
  r.set_preferred_node_id(preferred);
  return r;
}

v1::BatchLookupRequest LookupReq(std::vector<std::string> keys) {
  v1::BatchLookupRequest r;
  for (auto& k : keys) r.add_keys(k);
  return r;
}

// A master over a real RocksDB in TEST_TMPDIR with a FakeClock; reopenable.
struct Harness {
  explicit Harness(
      const std::string& name,
      const std::function<void(MasterServiceOptions&)>& tweak = nullptr)
      : dir(TestDir(name)) {
    options.clock = &clock;
    options.node_timeout = absl::Seconds(10);
    options.put_timeout = absl::Seconds(30);
    // These tests fill small nodes from one caller (the limits have their
    // own tests in master_limits_test.cc).
    options.max_pending_share_per_caller = 1.0;
    if (tweak) tweak(options);
    Open();
  }
  void Open() {
    RocksDbMetadataStoreOptions so;
    so.path = dir;
    so.generation_block = 16;  // cross block boundaries in tests
    so.keep_wal_seconds = 3600;  // for restarts from an index snapshot
    auto store = RocksDbMetadataStore::Create(so);
    INFO(store.status().ToString());
    REQUIRE(store.ok());
    auto s = MasterService::Create(options, std::move(store).value());
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    svc = std::move(s).value();
  }
  void Restart() {
    svc.reset();
    Open();
  }
  // A kill -9: the store as it is on disk now (without what the destructor
  // would write) is what the next master finds.
  void CrashAndRestart() {
    const std::string copy = dir + "-crash" + std::to_string(++crashes);
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    svc.reset();  // writes into `dir`, which is left behind
    dir = copy;
    Open();
  }
  uint32_t Register(const std::string& name, uint64_t incarnation,
                    std::vector<RegionSpec> regions, int port = 7000) {
    auto r = Reg(svc.get(), NodeReq(name, incarnation, regions, port));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return r->node_id();
  }
  // Every object the master lists on `node_id`.
  std::vector<v1::Location> Listed(uint32_t node_id) {
    std::vector<v1::Location> out;
    uint64_t cursor = 0;
    bool more = true;
    while (more) {
      v1::ListObjectsResponse page;
      more = svc->ListObjects(node_id, &cursor, 3, &page);
      for (const auto& o : page.objects()) out.push_back(o.location());
    }
    return out;
  }
  // A reconciliation of `node_id` by a node holding exactly `held`.
  v1::ReconcileNodeResponse ReconcileWith(uint32_t node_id,
                                          uint64_t incarnation,
                                          const std::vector<v1::Location>& held) {
    auto r = svc->BeginReconcile(node_id, incarnation);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    google::protobuf::RepeatedPtrField<v1::Location> chunk(held.begin(),
                                                           held.end());
    REQUIRE((*r)->Add(chunk).ok());
    auto out = svc->FinishReconcile(std::move(*r));
    INFO(out.status().ToString());
    REQUIRE(out.ok());
    return *out;
  }
  // A node coming back after a master restart: registers again and
  // reconciles, holding everything the master lists for it.
  uint32_t Rejoin(const std::string& name, uint64_t incarnation,
                  std::vector<RegionSpec> regions, int port = 7000) {
    auto r = Reg(svc.get(), NodeReq(name, incarnation, regions, port));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    if (r->reconcile()) {
      ReconcileWith(r->node_id(), incarnation, Listed(r->node_id()));
    }
    return r->node_id();
  }
  v1::PutStartResponse Start(std::vector<std::string> keys,
                             std::vector<uint64_t> lengths,
                             uint32_t preferred = 0) {
    auto r = svc->PutStart(PutReq(keys, lengths, preferred));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return *r;
  }
  uint32_t Commit(uint64_t put_id, std::vector<uint32_t> failed = {}) {
    v1::PutCommitRequest req;
    req.set_put_id(put_id);
    for (auto f : failed) req.add_failed_indexes(f);
    auto r = svc->PutCommit(req);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return r->committed();
  }
  // Puts and commits `keys` of `len` bytes each; returns the node used.
  uint32_t Put(std::vector<std::string> keys, uint64_t len = 100,
               uint32_t preferred = 0) {
    auto r = Start(keys, std::vector<uint64_t>(keys.size(), len), preferred);
    REQUIRE(r.put_id() != 0);
    Commit(r.put_id());
    return r.node().node_id();
  }
  // A plain lookup. Asked packed too (it changes nothing), the answer must
  // be the same, record by record, capabilities included.
  v1::BatchLookupResponse Lookup(std::vector<std::string> keys) {
    auto r = svc->BatchLookup(LookupReq(keys));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    v1::BatchLookupRequest packed_req = LookupReq(keys);
    packed_req.set_packed(true);
    auto p = svc->BatchLookup(packed_req);
    REQUIRE(p.ok());
    CheckPackedSame(*r, *p);
    return *r;
  }
  static void CheckPackedSame(const v1::BatchLookupResponse& r,
                              const v1::BatchLookupResponse& p) {
    CHECK(p.results_size() == 0);
    CHECK(p.hit_prefix_length() == r.hit_prefix_length());
    REQUIRE(p.packed_results().size() ==
            r.results_size() * wire::kLookupRecordBytes);
    for (int i = 0; i < r.results_size(); ++i) {
      auto rec = wire::DecodeLookupRecord(
          reinterpret_cast<const uint8_t*>(p.packed_results().data()) +
          i * wire::kLookupRecordBytes);
      REQUIRE(rec.ok());
      const v1::LookupResult& want = r.results(i);
      INFO("key " << i);
      CHECK((rec->node_id != 0) == want.found());
      if (!want.found()) continue;
      CHECK(rec->node_id == want.location().node_id());
      CHECK(rec->region_id == want.location().region_id());
      CHECK(rec->addr == want.location().addr());
      CHECK(rec->length == want.location().length());
      CHECK(rec->generation == want.location().generation());
      CHECK(rec->cap.expires_unix_ms == want.capability().expires_unix_ms());
      CHECK(rec->cap.rights == want.capability().rights());
      CHECK(absl::little_endian::Load64(rec->cap.tag) ==
            want.capability().tag_lo());
      CHECK(absl::little_endian::Load64(rec->cap.tag + 8) ==
            want.capability().tag_hi());
    }
    REQUIRE(p.nodes_size() == r.nodes_size());
    for (int i = 0; i < r.nodes_size(); ++i) {
      CHECK(p.nodes(i).node_id() == r.nodes(i).node_id());
      CHECK(p.nodes(i).data_address() == r.nodes(i).data_address());
      const auto& want = r.nodes(i).transport_params();
      CHECK(p.nodes(i).transport_params_size() == want.size());
      for (const auto& [k, v] : p.nodes(i).transport_params()) {
        CHECK((want.count(k) == 1 && want.at(k) == v));
      }
    }
  }
  // A lookup before a read: touches and leases the hit prefix.
  v1::BatchLookupResponse Read(std::vector<std::string> keys) {
    v1::BatchLookupRequest req = LookupReq(keys);
    req.set_for_read(true);
    auto r = svc->BatchLookup(req);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return *r;
  }
  // '1' per key found, '0' per miss (a plain lookup: changes nothing).
  std::string Found(std::vector<std::string> keys) {
    std::string out;
    const v1::BatchLookupResponse got = Lookup(keys);
    for (const auto& r : got.results()) out += r.found() ? '1' : '0';
    return out;
  }
  // PutStart of `keys` (`len` bytes each) as the continuation of
  // `parent`'s chain.
  absl::StatusOr<v1::PutStartResponse> StartChild(
      std::vector<std::string> keys, uint64_t len, const std::string& parent,
      uint32_t preferred = 0) {
    v1::PutStartRequest req =
        PutReq(keys, std::vector<uint64_t>(keys.size(), len), preferred);
    req.set_parent_key(parent);
    return svc->PutStart(req);
  }
  // Puts and commits a chain continuation; returns the node used.
  uint32_t PutChild(std::vector<std::string> keys, uint64_t len,
                    const std::string& parent) {
    auto r = StartChild(keys, len, parent);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    REQUIRE(r->put_id() != 0);
    Commit(r->put_id());
    return r->node().node_id();
  }
  void Heartbeat(uint32_t id, uint64_t incarnation) {
    v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_incarnation(incarnation);
    auto r = Hb(svc.get(), req);
    REQUIRE(r.ok());
    REQUIRE_FALSE(r->reregister());
  }
  uint64_t UsedBytes(uint32_t node_id) {
    const v1::ListNodesResponse nodes = svc->ListNodes();
    for (const auto& n : nodes.nodes()) {
      if (n.node_id() == node_id) return n.used_bytes();
    }
    FAIL("node not listed");
    return 0;
  }

  FakeClock clock;
  std::string dir;
  int crashes = 0;
  MasterServiceOptions options;
  std::unique_ptr<MasterService> svc;
};

// Whether `found` (Harness::Found over a chain's keys) is a run of hits then
// a run of misses: no block outlives the block before it.
bool NoStrandedTail(const std::string& found) {
  return found.find("01") == std::string::npos;
}

TEST_CASE("MasterServiceOptions validation") {
  MasterServiceOptions o;
  CHECK(o.Validate().ok());
  o.node_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.heartbeat_interval = absl::Seconds(20);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.put_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_batch_keys = 0;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_key_bytes = 70000;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o = MasterServiceOptions();
  o.max_object_bytes = uint64_t{1} << 50;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  CHECK(MasterService::Create(MasterServiceOptions(), nullptr).status().code() ==
        StatusCode::kInvalidArgument);
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

TEST_CASE("PutStart spreads calls across nodes and keeps each call on one") {
  Harness h("spread");
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
    h.Commit(r.put_id());
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

TEST_CASE("PutStart, BatchLookup and Remove validate their input") {
  Harness h("validate");
  h.Register("a", 1, {{0, 1 << 20}});
  auto put = [&](v1::PutStartRequest r) {
    return h.svc->PutStart(r).status().code();
  };
  CHECK(put(PutReq({}, {})) == StatusCode::kInvalidArgument);
  std::vector<std::string> too_many(1025, "k");
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i] += std::to_string(i);
  CHECK(put(PutReq(too_many, std::vector<uint64_t>(1025, 1))) ==
        StatusCode::kInvalidArgument);
  too_many.pop_back();
  CHECK(put(PutReq(too_many, std::vector<uint64_t>(1024, 1))) ==
        StatusCode::kOk);
  CHECK(put(PutReq({""}, {1})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({std::string(257, 'k')}, {1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({std::string(256, 'k')}, {1})) == StatusCode::kOk);
  CHECK(put(PutReq({"a", "b"}, {1})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {1, 2})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {0})) == StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {(uint64_t{1} << 30) + 1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a", "b", "a"}, {1, 1, 1})) ==
        StatusCode::kInvalidArgument);
  CHECK(put(PutReq({"a"}, {1}, 42)) == StatusCode::kNotFound);

  CHECK(h.svc->BatchLookup(LookupReq({})).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(h.svc->BatchLookup(LookupReq({"a", ""})).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(h.svc->BatchLookup(LookupReq({std::string(257, 'x')})).status().code() ==
        StatusCode::kInvalidArgument);
  v1::RemoveRequest rm;
  CHECK(h.svc->Remove(rm).status().code() == StatusCode::kInvalidArgument);
  rm.add_keys(std::string(300, 'x'));
  CHECK(h.svc->Remove(rm).status().code() == StatusCode::kInvalidArgument);
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
  CHECK(h.Commit(r.put_id(), {1, 3, 3}) == 1);
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

TEST_CASE("BatchLookup reports the hit prefix and the nodes referenced") {
  Harness h("lookup");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"b0", "b1"}) == a);
  CHECK(h.Put({"b2"}) == b);
  h.Put({"b4"});

  auto l = h.Lookup({"b0", "b1", "b2", "b3", "b4"});
  CHECK(l.hit_prefix_length() == 3);
  CHECK(l.results(4).found());
  CHECK(l.nodes_size() == 2);
  std::set<uint32_t> ids;
  for (const auto& n : l.nodes()) {
    ids.insert(n.node_id());
    CHECK(n.alive());
    CHECK(n.transport_params().at("tcp") == "yes");
  }
  CHECK(ids == std::set<uint32_t>{a, b});
  CHECK(h.Lookup({"nope", "b0"}).hit_prefix_length() == 0);
  auto only_a = h.Lookup({"b0", "b0"});  // duplicates are fine
  CHECK(only_a.hit_prefix_length() == 2);
  CHECK(only_a.nodes_size() == 1);
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
  h.Commit(again.put_id());
  CHECK(h.UsedBytes(a) == used_a - 128);
  CHECK(h.Lookup({"x"}).results(0).location().node_id() == b);

  h.clock.Advance(absl::Seconds(20));  // everyone dead
  auto none = h.svc->PutStart(PutReq({"w"}, {1}));
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK(none.status().message().find("no alive") != std::string::npos);
  h.Heartbeat(a, 1);
  CHECK(h.Put({"w"}) == a);
}

TEST_CASE("A node's commit still succeeds if it died meanwhile") {
  Harness h("diedmeanwhile");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto r = h.Start({"k"}, {10});
  h.clock.Advance(absl::Seconds(11));
  CHECK(h.Commit(r.put_id()) == 1);
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
    h.Commit(r.put_id());
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

  // No node is alive before it registers with the new process, and one
  // that kept its objects is not served before it reconciles.
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

TEST_CASE("Remove deletes objects durably and frees their space") {
  Harness h("remove");
  uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  for (const char* k : {"r1", "r2", "r3"}) h.Put({k});  // unrelated
  auto pending = h.Start({"p"}, {10});
  v1::RemoveRequest rm;
  rm.add_keys("r1");
  rm.add_keys("missing");
  rm.add_keys("r3");
  rm.add_keys("p");
  rm.add_keys("r1");
  auto r = h.svc->Remove(rm);
  REQUIRE(r.ok());
  REQUIRE(r->removed_size() == 5);
  CHECK(r->removed(0));
  CHECK_FALSE(r->removed(1));
  CHECK(r->removed(2));
  CHECK_FALSE(r->removed(3));
  CHECK_FALSE(r->removed(4));
  CHECK(h.UsedBytes(a) == 128 + 64);
  CHECK(h.Commit(pending.put_id()) == 1);
  h.Restart();
  h.Rejoin("a", 1, {{0, 1 << 20}});
  auto l = h.Lookup({"r1", "r2", "r3", "p"});
  CHECK_FALSE(l.results(0).found());
  CHECK(l.results(1).found());
  CHECK_FALSE(l.results(2).found());
  CHECK(l.results(3).found());
}

TEST_CASE("A failed store write changes nothing") {
  FakeClock clock;
  auto fake = std::make_unique<FakeMetadataStore>();
  FakeMetadataStore* store = fake.get();
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  o.clock = &clock;
  auto svc = MasterService::Create(o, std::move(fake));
  REQUIRE(svc.ok());
  MasterService& s = **svc;
  REQUIRE(Reg(&s, NodeReq("a", 1, {{0, 1 << 20}})).ok());
  auto put = s.PutStart(PutReq({"k1", "k2"}, {10, 10}));
  REQUIRE(put.ok());

  store->FailWritesForTest(absl::UnavailableError("disk on fire"));
  v1::PutCommitRequest c;
  c.set_put_id(put->put_id());
  CHECK(s.PutCommit(c).status().code() == StatusCode::kUnavailable);
  CHECK_FALSE(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
  CHECK(s.GetStats().pending_puts() == 1);
  CHECK(s.PutStart(PutReq({"k3"}, {10})).status().code() ==
        StatusCode::kUnavailable);  // no generation
  CHECK(s.GetStats().nodes(0).used_bytes() == 128);
  CHECK(Reg(&s, NodeReq("b", 1, {{0, 4096}})).status().code() ==
        StatusCode::kUnavailable);
  CHECK(s.ListNodes().nodes_size() == 1);

  store->FailWritesForTest(absl::OkStatus());
  auto ok = s.PutCommit(c);
  REQUIRE(ok.ok());
  CHECK(ok->committed() == 2);
  CHECK(store->object_count() == 2);
  CHECK(s.BatchLookup(LookupReq({"k1", "k2"}))->hit_prefix_length() == 2);

  store->FailWritesForTest(absl::UnavailableError("again"));
  v1::RemoveRequest rm;
  rm.add_keys("k1");
  CHECK(s.Remove(rm).status().code() == StatusCode::kUnavailable);
  CHECK(s.BatchLookup(LookupReq({"k1"}))->results(0).found());
}

TEST_CASE("Concurrent puts and lookups") {
  Harness h("concurrent");
  h.Register("a", 1, {{0, 64 << 20}});
  h.Register("b", 1, {{0, 64 << 20}}, 7100);
  {
    std::vector<Thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back("svc-test", [&h, t] {
        for (int i = 0; i < 200; ++i) {
          std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
          auto r = h.svc->PutStart(PutReq({key, key + "x"}, {100, 100}));
          if (!r.ok() || r->put_id() == 0) continue;
          v1::PutCommitRequest c;
          c.set_put_id(r->put_id());
          h.svc->PutCommit(c).IgnoreError();
          h.svc->BatchLookup(LookupReq({key, key + "x"})).IgnoreError();
          if (i % 10 == 0) h.svc->ReapExpired();
          if (i % 20 == 0) h.svc->GetStats();
        }
      });
    }
  }
  CHECK(h.svc->GetStats().object_count() == 4 * 200 * 2);
}

TEST_CASE("registration reports retained objects and a generation ceiling") {
  Harness h("retained");
  auto first = Reg(h.svc.get(), NodeReq("n1", 5, {{0, 1 << 20}}));
  REQUIRE(first.ok());
  CHECK_FALSE(first->objects_retained());  // a new node: nothing is known
  auto put = h.Start({"a", "b"}, {100, 100});
  h.Commit(put.put_id());
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
    h.Commit(p.put_id());
  }

  // A new incarnation of DRAM memory: nothing retained.
  auto fresh = Reg(h.svc.get(), NodeReq("n1", 6, {{0, 1 << 20}}));
  REQUIRE(fresh.ok());
  CHECK_FALSE(fresh->objects_retained());
  // Incarnation 0 is reserved.
  CHECK(Reg(h.svc.get(), NodeReq("n2", 0, {{0, 1 << 20}})).status().code() ==
        StatusCode::kInvalidArgument);
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
    h.Commit(p.put_id());
  }
  auto nodes = h.svc->ListNodes();
  for (const auto& n : nodes.nodes()) CHECK(n.alive() == (n.node_id() == b));
  // It comes back by registering again.
  CHECK(h.Register("a", 3, {{0, 1 << 20}}, 7000) == a);
}


// Eviction tests use one-region nodes of 64-byte alignment and 1000-byte
// objects (1024 bytes allocated), so a node of N * 1024 bytes holds N.
constexpr uint64_t kObj = 1000;
constexpr uint64_t kSlot = 1024;

TEST_CASE("MasterServiceOptions validates read_lease") {
  MasterServiceOptions o;
  o.max_pending_share_per_caller = 1.0;  // fills one node
  CHECK(o.read_lease == absl::Seconds(5));
  CHECK(o.max_evictions_per_put == 4096);
  o.read_lease = absl::ZeroDuration();
  CHECK(o.Validate().ok());
  o.read_lease = -absl::Milliseconds(1);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
  o.read_lease = absl::Hours(25);
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
}

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
    h.Commit(r->put_id());
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
  h.Commit(r->put_id());
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
  h.Commit(p1->put_id());
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
  h.Commit(ok->put_id());
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

TEST_CASE("PutStart places a chain's continuation on its parent's node") {
  Harness h("parent_place");
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
  h.Commit(r1.put_id());
  const v1::Location old_loc = r1.slots(0).location();
  auto r2 = h.Start({"new"}, {kObj});
  REQUIRE(r2.slots(0).state() == v1::SLOT_ALLOCATED);
  const v1::Location& new_loc = r2.slots(0).location();
  CHECK(new_loc.node_id() == old_loc.node_id());
  CHECK(new_loc.region_id() == old_loc.region_id());
  CHECK(new_loc.addr() == old_loc.addr());
  CHECK(new_loc.generation() > old_loc.generation());
  CHECK(h.Found({"old"}) == "0");
  h.Commit(r2.put_id());
  CHECK(h.Lookup({"new"}).results(0).location().generation() ==
        new_loc.generation());
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
  h.Commit(r.put_id());
  CHECK(h.Found({"a", "b", "c"}) == "101");
  // The pending put commits where it was told to.
  CHECK(h.Commit(pending.put_id()) == 2);
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
  h.Commit(r.put_id());
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

TEST_CASE("Remove of a middle block removes the blocks after it") {
  Harness h("remove_cascade");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Put({"c0", "c1", "c2", "c3"}, kObj, a) == a);
  CHECK(h.PutChild({"d2"}, kObj, "c1") == a);  // a second continuation
  CHECK(h.Put({"x"}, kObj, a) == a);
  CHECK(h.Put({"y"}, kObj, b) == b);
  v1::RemoveRequest rm;
  rm.add_keys("c1");
  auto r = h.svc->Remove(rm);
  REQUIRE(r.ok());
  REQUIRE(r->removed_size() == 1);
  CHECK(r->removed(0));
  CHECK(h.Found({"c0", "c1", "c2", "c3", "d2", "x", "y"}) == "1000011");
  CHECK(h.svc->counters().orphans_removed == 3);
  CHECK(h.UsedBytes(a) == 2 * kSlot);
  CHECK(h.svc->GetStats().object_count() == 3);
  h.Restart();
  h.Rejoin("a", 1, {{0, 1 << 20}});
  h.Rejoin("b", 1, {{0, 1 << 20}}, 7100);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "d2", "x", "y"}) == "1000011");
  CHECK(h.UsedBytes(a) == 2 * kSlot);

  // A block whose node refused it (read repair) takes its tail along.
  h.Put({"e0", "e1"}, kObj, a);
  const v1::BatchLookupResponse e0 = h.Lookup({"e0"});
  v1::ReportMissingRequest missing;
  missing.add_keys("e0");
  *missing.add_locations() = e0.results(0).location();
  REQUIRE(h.svc->ReportMissing(missing).ok());
  CHECK(h.Found({"e0", "e1", "c0", "x"}) == "0011");
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
  h.Commit(tail->put_id());
  auto back = h.StartChild({"c4"}, kObj, "c3", a);
  REQUIRE(back.ok());
  CHECK(back->node().node_id() == a);
  h.Commit(back->put_id());
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

TEST_CASE("A listing reconciled away takes the blocks after it; the node frees them at once") {
  Harness h("reconcile_cascade");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"c0", "c1", "c2", "c3"}, kObj);
  h.Put({"x"}, kObj);
  const v1::Location c1 = h.Lookup({"c1"}).results(0).location();
  const v1::Location c2 = h.Lookup({"c2"}).results(0).location();
  const v1::Location c3 = h.Lookup({"c3"}).results(0).location();
  // The node lost c1 (say, in a crash) but holds everything else.
  std::vector<v1::Location> held;
  for (const auto& loc : h.Listed(a)) {
    if (loc.generation() != c1.generation()) held.push_back(loc);
  }
  REQUIRE(held.size() == 4);
  const v1::ReconcileNodeResponse r = h.ReconcileWith(a, 1, held);
  CHECK(r.dropped_listings() == 1);
  CHECK(h.Found({"c0", "c1", "c2", "c3", "x"}) == "10001");
  CHECK(h.svc->counters().orphans_removed == 2);
  std::set<uint64_t> unlisted;
  for (const auto& loc : r.unlisted()) unlisted.insert(loc.generation());
  CHECK(unlisted == std::set<uint64_t>{c2.generation(), c3.generation()});
  CHECK(r.unlisted_count() == 2);
  CHECK(h.UsedBytes(a) == 2 * kSlot);
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
  CHECK(h.Commit(child->put_id()) == 1);
  CHECK(h.Found({"p", "p1"}) == "11");

  // A parent removed before the commit: its continuation is freed instead.
  auto orphan = h.StartChild({"r1", "r2"}, kObj, "r");
  REQUIRE(orphan.ok());
  v1::RemoveRequest rm;
  rm.add_keys("r");
  REQUIRE(h.svc->Remove(rm).ok());
  CHECK(h.Commit(orphan->put_id()) == 0);
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
  CHECK(h.Commit(y.put_id()) == 2);  // before the prefix: kept, unlinked
  CHECK(h.Commit(x.put_id()) == 3);  // now y3 is linked below s2
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
  CHECK(h.Commit(y2.put_id()) == 2);
  CHECK(h.Found({"z2", "z3"}) == "11");
  const uint64_t before = h.svc->counters().orphans_removed;
  CHECK(h.Commit(x2.put_id(), {1}) == 1);  // t1's write failed
  CHECK(h.Found({"t0", "t1", "z2", "z3"}) == "1000");
  CHECK(h.svc->counters().orphans_removed == before + 2);
  auto x3 = h.Start({"u0"}, {kObj});
  auto y3 = h.Start({"u0", "w1"}, {kObj, kObj});
  CHECK(h.Commit(y3.put_id()) == 1);
  v1::PutAbortRequest abort;
  abort.set_put_id(x3.put_id());
  REQUIRE(h.svc->PutAbort(abort).ok());
  CHECK(h.Found({"u0", "w1"}) == "00");
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

// ------------------------------------------------------------ reconciliation

v1::Location At(uint32_t region, uint64_t addr, uint64_t length,
                uint64_t generation) {
  v1::Location l;
  l.set_region_id(region);
  l.set_addr(addr);
  l.set_length(length);
  l.set_generation(generation);
  return l;
}

TEST_CASE("Reconciliation drops listings a restarted node lost and frees what it holds unlisted") {
  Harness h("reconcile_lost");
  const std::vector<RegionSpec> regions = {{0, 1 << 20, 64, true}};
  const uint32_t a = h.Register("a", 9, regions);
  h.Put({"k0", "k1", "k2", "k3", "k4"}, 100);
  const uint64_t used = h.UsedBytes(a);
  auto listed = h.Listed(a);
  REQUIRE(listed.size() == 5);

  // The node crashes and comes back with the same incarnation (a hybrid
  // node re-adopting its capacity file) without k3 and k4 (lost from its
  // write buffer), plus an extent the master never committed.
  auto back = Reg(h.svc.get(), NodeReq("a", 9, regions));
  REQUIRE(back.ok());
  CHECK(back->objects_retained());
  CHECK(back->reconcile());
  // Not served until it has reconciled: neither reads nor placements.
  CHECK(h.Lookup({"k0"}).hit_prefix_length() == 0);
  CHECK(h.svc->PutStart(PutReq({"z"}, {64})).status().code() ==
        StatusCode::kResourceExhausted);

  // The put allocated in key order: k3 and k4 have the highest
  // generations.
  std::vector<v1::Location> held = listed;
  std::sort(held.begin(), held.end(), [](const auto& x, const auto& y) {
    return x.generation() < y.generation();
  });
  held.resize(3);
  const v1::Location stray = At(0, (1 << 20) - 4096, 100, 1000000);
  held.push_back(stray);
  auto r = h.ReconcileWith(a, 9, held);
  CHECK(r.listed() == 5);
  CHECK(r.held() == 4);
  CHECK(r.matched() == 3);
  CHECK(r.dropped_listings() == 2);
  CHECK(r.unlisted_count() == 1);
  REQUIRE(r.unlisted_size() == 1);
  CHECK(r.unlisted(0).generation() == stray.generation());
  CHECK(r.unlisted(0).addr() == stray.addr());

  // Served again; the lost keys are misses, their space is free, and they
  // can be stored again (no SLOT_EXISTS forever).
  CHECK(h.Found({"k0", "k1", "k2", "k3", "k4"}) == "11100");
  CHECK(h.UsedBytes(a) == used * 3 / 5);
  auto again = h.Start({"k3", "k4"}, {100, 100});
  CHECK(again.slots(0).state() == v1::SLOT_ALLOCATED);
  CHECK(again.slots(1).state() == v1::SLOT_ALLOCATED);
  auto c = h.svc->counters();
  CHECK(c.reconciliations == 1);
  CHECK(c.reconcile_dropped_listings == 2);
  CHECK(c.reconcile_unlisted_extents == 1);
  // Durable: a restart does not bring the dropped listings back.
  h.Restart();
  h.Rejoin("a", 9, regions);
  CHECK(h.Found({"k0", "k1", "k2", "k3", "k4"}) == "11100");
}

TEST_CASE("Reconciliation does not judge commits made while it ran, nor pending puts") {
  Harness h("reconcile_race");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"old"}, 100);
  auto old_loc = h.Listed(a);
  REQUIRE(old_loc.size() == 1);

  auto rec = h.svc->BeginReconcile(a, 1);
  REQUIRE(rec.ok());
  // The node listed its extents before these writes landed.
  auto fresh = h.Start({"fresh"}, {100});
  h.Commit(fresh.put_id());
  auto pending = h.Start({"pending"}, {100});
  // The node reports the pending put's extent (written, not committed yet)
  // and not "old".
  google::protobuf::RepeatedPtrField<v1::Location> chunk;
  const v1::Location& p = pending.slots(0).location();
  *chunk.Add() = At(p.region_id(), p.addr(), p.length(), p.generation());
  REQUIRE((*rec)->Add(chunk).ok());
  auto r = h.svc->FinishReconcile(std::move(*rec));
  REQUIRE(r.ok());
  CHECK(r->listed() == 2);
  CHECK(r->skipped_recent() == 1);
  CHECK(r->dropped_listings() == 1);  // "old"
  CHECK(r->unlisted_count() == 0);    // the pending extent is not freed
  CHECK(h.Found({"old", "fresh"}) == "01");
  CHECK(h.Commit(pending.put_id()) == 1);
  CHECK(h.Found({"pending"}) == "1");
}

TEST_CASE("A reconciliation superseded by another or by a re-registration changes nothing") {
  Harness h("reconcile_superseded");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  auto first = h.svc->BeginReconcile(a, 1);
  REQUIRE(first.ok());
  auto second = h.svc->BeginReconcile(a, 1);
  REQUIRE(second.ok());
  CHECK(h.svc->FinishReconcile(std::move(*first)).status().code() ==
        StatusCode::kAborted);
  REQUIRE(Reg(h.svc.get(), NodeReq("a", 1, {{0, 1 << 20}})).ok());
  CHECK(h.svc->FinishReconcile(std::move(*second)).status().code() ==
        StatusCode::kAborted);
  // Another incarnation or an unknown node cannot begin one.
  CHECK(h.svc->BeginReconcile(a, 2).status().code() ==
        StatusCode::kFailedPrecondition);
  CHECK(h.svc->BeginReconcile(99, 1).status().code() == StatusCode::kNotFound);
  // Nothing was dropped: the node still awaits a real reconciliation.
  auto r = h.ReconcileWith(a, 1, h.Listed(a));
  CHECK(r.matched() == 1);
  CHECK(h.Found({"k"}) == "1");
}

TEST_CASE("Reconciliation rejects bad extent reports and bounds their number") {
  Harness h("reconcile_bad", [](MasterServiceOptions& o) {
    o.max_reconcile_extents = 2;
  });
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  auto rec = h.svc->BeginReconcile(a, 1);
  REQUIRE(rec.ok());
  google::protobuf::RepeatedPtrField<v1::Location> dup;
  *dup.Add() = At(0, 0, 64, 5);
  *dup.Add() = At(0, 64, 64, 5);
  CHECK((*rec)->Add(dup).code() == StatusCode::kInvalidArgument);
  auto rec2 = h.svc->BeginReconcile(a, 1);
  google::protobuf::RepeatedPtrField<v1::Location> zero;
  *zero.Add() = At(0, 0, 0, 5);
  CHECK((*rec2)->Add(zero).code() == StatusCode::kInvalidArgument);
  auto rec3 = h.svc->BeginReconcile(a, 1);
  google::protobuf::RepeatedPtrField<v1::Location> many;
  for (int i = 1; i <= 3; ++i) *many.Add() = At(0, 64 * i, 64, i);
  CHECK((*rec3)->Add(many).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("A held extent with a listed generation but another range is no match") {
  Harness h("reconcile_mismatch");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  auto listed = h.Listed(a);
  REQUIRE(listed.size() == 1);
  v1::Location wrong = listed[0];
  wrong.set_addr(wrong.addr() + 4096);
  auto r = h.ReconcileWith(a, 1, {wrong});
  CHECK(r.matched() == 0);
  CHECK(r.dropped_listings() == 1);
  REQUIRE(r.unlisted_size() == 1);
  CHECK(r.unlisted(0).addr() == wrong.addr());
  CHECK(h.Found({"k"}) == "0");
}

TEST_CASE("ReportMissing drops a listing only at the exact reported location") {
  Harness h("report_missing");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  h.Put({"k"}, 100);
  h.Put({"other"}, 100);  // not a continuation of k
  auto look = h.Lookup({"k"});
  REQUIRE(look.results(0).found());
  v1::ReportMissingRequest req;
  req.add_keys("k");
  v1::Location stale = look.results(0).location();
  stale.set_generation(stale.generation() + 1000);
  *req.add_locations() = stale;
  auto r = h.svc->ReportMissing(req);
  REQUIRE(r.ok());
  CHECK_FALSE(r->dropped(0));
  CHECK(h.Found({"k"}) == "1");

  *req.mutable_locations(0) = look.results(0).location();
  req.add_keys("k");  // repeated: dropped once
  *req.add_locations() = look.results(0).location();
  r = h.svc->ReportMissing(req);
  REQUIRE(r.ok());
  CHECK(r->dropped(0));
  CHECK_FALSE(r->dropped(1));
  CHECK(h.Found({"k", "other"}) == "01");
  CHECK(h.svc->counters().read_repairs == 1);
  CHECK(h.Start({"k"}, {100}).slots(0).state() == v1::SLOT_ALLOCATED);
  (void)a;

  v1::ReportMissingRequest bad;
  bad.add_keys("k");
  CHECK(h.svc->ReportMissing(bad).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("ListObjects pages through every listing once, by node") {
  Harness h("list_objects");
  const uint32_t a = h.Register("a", 1, {{0, 1 << 20}});
  const uint32_t b = h.Register("b", 1, {{0, 1 << 20}}, 7100);
  for (int i = 0; i < 10; ++i) h.Put({"a" + std::to_string(i)}, 64, a);
  for (int i = 0; i < 7; ++i) h.Put({"b" + std::to_string(i)}, 64, b);
  h.svc->Remove([] {
    v1::RemoveRequest r;
    r.add_keys("a3");
    return r;
  }()).IgnoreError();
  CHECK(h.Listed(a).size() == 9);
  CHECK(h.Listed(b).size() == 7);
  CHECK(h.Listed(0).size() == 16);

  // Chain links are listed (fsck checks reachability with them).
  h.Put({"c0", "c1", "c2"}, 64, a);
  uint64_t cursor = 0;
  std::map<std::string, v1::ListedObject> chain;
  bool more = true;
  while (more) {
    v1::ListObjectsResponse page;
    more = h.svc->ListObjects(a, &cursor, 100, &page);
    for (const auto& o : page.objects()) chain[o.key()] = o;
  }
  CHECK(chain.at("c0").parent_key().empty());
  CHECK(chain.at("c1").parent_key() == "c0");
  CHECK(chain.at("c2").parent_key() == "c1");
  for (const auto& [k, o] : chain) CHECK_FALSE(o.unreachable());
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

}  // namespace
}  // namespace master
}  // namespace hymcache

namespace hymcache {
namespace master {
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
  h.Commit(put.put_id());
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
  h.Put({"k1"});  // placed there meanwhile, with capabilities under `key`
  REQUIRE(h.Found({"k1"}) == "1");

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
  CHECK(h.Listed(first->node_id()).size() == 1);  // kept, not purged

  // Once the node has proven the key (a heartbeat), a registration without
  // a proof is refused even with the nonce: the node has the key.
  KeyByName()["a"] = key;
  NameById()[first->node_id()] = "a";
  h.Heartbeat(first->node_id(), 5);
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

// ------------------------------------------------------- index snapshots

// Every object the master lists, one sorted line each: key, location,
// linked parent, orphan flag.
std::vector<std::string> Everything(MasterService* svc) {
  std::vector<std::string> out;
  uint64_t cursor = 0;
  bool more = true;
  while (more) {
    v1::ListObjectsResponse page;
    more = svc->ListObjects(0, &cursor, 100, &page);
    for (const auto& o : page.objects()) {
      const v1::Location& l = o.location();
      out.push_back(o.key() + " " + std::to_string(l.node_id()) + "/" +
                    std::to_string(l.region_id()) + "/" +
                    std::to_string(l.addr()) + "/" +
                    std::to_string(l.length()) + "/" +
                    std::to_string(l.generation()) + " parent=" +
                    o.parent_key());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
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
        h.Commit(r->put_id());
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

}  // namespace
}  // namespace master
}  // namespace hymcache
