// The fixture the MasterService tests share (master_service*_test.cc): a
// Harness running a MasterService over a real RocksDB in TEST_TMPDIR with
// a FakeClock, and request builders. Nodes prove their keys as real ones
// do. Test-only; Catch2 assertions.
#pragma once

#include "master/master_service.h"

#include <algorithm>
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
#include "common/status_reason.h"
#include "common/test_log_capture.h"
#include "common/thread.h"
#include "common/wire.h"
#include "master/fake_metadata_store.h"
#include "master/master_test_util.h"
#include "master/metadata_store.h"
#include "master/proving_heartbeat.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace service_test {

namespace v1 = ::hymcache::v1;
using absl::StatusCode;

struct RegionSpec {
  uint32_t id;
  uint64_t capacity;
  uint32_t alignment = 64;
  bool persistent = false;
};

inline v1::RegisterNodeRequest NodeReq(const std::string& name,
                                       uint64_t incarnation,
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
inline std::map<std::string, std::string>& KeyByName() {
  static auto* m = new std::map<std::string, std::string>;
  return *m;
}
inline std::map<uint32_t, std::string>& NameById() {
  static auto* m = new std::map<uint32_t, std::string>;
  return *m;
}

inline absl::Time MasterNow(MasterService* svc) {
  Clock* c = svc->options().clock ? svc->options().clock : Clock::Real();
  return c->Now();
}

inline v1::NodeAuth AuthFor(MasterService* svc, const std::string& purpose,
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

inline absl::StatusOr<v1::HeartbeatResponse> Hb(MasterService* svc,
                                                v1::HeartbeatRequest req) {
  *req.mutable_auth() = AuthFor(svc, "heartbeat", NameById()[req.node_id()],
                                req.node_id(), req.incarnation());
  return svc->Heartbeat(req);
}

// RegisterNode with a proof of the name's key if one was issued, then the
// heartbeat a real node sends right after registering (it proves the key
// the answer carried; only then is the node placeable).
inline absl::StatusOr<v1::RegisterNodeResponse> Reg(
    MasterService* svc, v1::RegisterNodeRequest req) {
  *req.mutable_auth() =
      AuthFor(svc, "register", req.name(), 0, req.incarnation());
  auto r = svc->RegisterNode(req);
  if (!r.ok()) return r;
  KeyByName()[req.name()] = r->node_key();
  NameById()[r->node_id()] = req.name();
  v1::HeartbeatRequest hb;
  hb.set_node_id(r->node_id());
  hb.set_incarnation(req.incarnation());
  auto h = Hb(svc, hb);
  if (!h.ok()) return h.status();
  return r;
}

inline absl::StatusOr<v1::DeregisterNodeResponse> Dereg(
    MasterService* svc, v1::DeregisterNodeRequest req) {
  *req.mutable_auth() = AuthFor(svc, "deregister", NameById()[req.node_id()],
                                req.node_id(), req.incarnation());
  return svc->DeregisterNode(req);
}

inline v1::PutStartRequest PutReq(std::vector<std::string> keys,
                                  std::vector<uint64_t> lengths,
                                  uint32_t preferred = 0) {
  v1::PutStartRequest r;
  for (auto& k : keys) r.add_keys(k);
  for (auto l : lengths) r.add_lengths(l);
  r.set_preferred_node_id(preferred);
  return r;
}

// The write receipt node `start.node()` gives for slot `i` of `start`.
inline std::string ReceiptFor(const v1::PutStartResponse& start, int i) {
  return WriteReceiptFor(
      HmacSha256(KeyByName().at(NameById().at(start.node().node_id()))),
      start.slots(i).location());
}

// Adds to `req` the receipt of every slot `start` allocated, as a client
// that wrote them all does. Safe to call concurrently (reads only).
inline void AddReceipts(const v1::PutStartResponse& start,
                        v1::PutCommitRequest* req) {
  req->clear_receipts();
  for (int i = 0; i < start.slots_size(); ++i) {
    req->add_receipts(start.slots(i).state() == v1::SLOT_ALLOCATED
                          ? ReceiptFor(start, i)
                          : "");
  }
}

// Every object `svc` lists, one sorted line each: key, location, parent.
inline std::vector<std::string> Everything(MasterService* svc) {
  std::vector<std::string> out;
  uint64_t cursor = 0;
  bool more = true;
  while (more) {
    v1::ListObjectsResponse page;
    more = svc->ListObjects(0, &cursor, 100, &page);
    for (const auto& o : page.objects()) {
      out.push_back(absl::StrCat(o.key(), " ", o.location().ShortDebugString(),
                                 " parent=", o.parent_key()));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline v1::BatchLookupRequest LookupReq(std::vector<std::string> keys) {
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
  // Commits the put `start` began, with the receipts of every slot it
  // allocated (as a client that wrote them all), less `failed`.
  uint32_t Commit(const v1::PutStartResponse& start,
                  std::vector<uint32_t> failed = {}) {
    v1::PutCommitRequest req;
    req.set_put_id(start.put_id());
    for (auto f : failed) req.add_failed_indexes(f);
    AddReceipts(start, &req);
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
    Commit(r);
    return r.node().node_id();
  }
  // Stores copies (PutStartRequest.replica) of committed `keys` of `len`
  // bytes each and commits them all; returns the node used.
  uint32_t PutCopies(std::vector<std::string> keys, uint64_t len,
                     uint32_t preferred = 0) {
    v1::PutStartRequest req =
        PutReq(keys, std::vector<uint64_t>(keys.size(), len), preferred);
    req.set_replica(true);
    auto r = svc->PutStart(req);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    REQUIRE(Commit(*r) == keys.size());
    return r->node().node_id();
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
      CHECK(static_cast<size_t>(p.nodes(i).transport_params_size()) ==
            want.size());
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
    Commit(*r);
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
inline bool NoStrandedTail(const std::string& found) {
  return found.find("01") == std::string::npos;
}

// Eviction tests use one-region nodes of 64-byte alignment and 1000-byte
// objects (1024 bytes allocated), so a node of N * 1024 bytes holds N.
constexpr uint64_t kObj = 1000;
constexpr uint64_t kSlot = 1024;

}  // namespace service_test
}  // namespace master
}  // namespace hymcache
