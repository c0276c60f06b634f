// Fuzzes MasterService's request handling with sequences of requests built
// from the input: RegisterNode, Heartbeat, DeregisterNode, PutStart,
// PutCommit, PutAbort, BatchLookup, Remove, ReportMissing, the
// reconciliation calls (BeginReconcile / StartReconcile + OpenReconcile,
// Reconciliation::Add, FinishReconcile), ListObjects, ListNodes, GetStats,
// ReapExpired, clock steps, metadata-store failures and master restarts
// (a new MasterService loading the same store). Each request is either built
// field by field (small pools of names, keys, ids so that requests meet the
// same objects) or parsed from raw bytes as a serialized proto, to reach
// every field combination the validators must refuse.
//
// Besides crashes, sanitizer reports and leaks, it checks after every step
// that the master's listings stay sound (a reader must never be sent to
// another object's bytes):
//   - no two committed objects overlap in a node's region; each lies inside
//     its region; generations are unique; every object's node is known;
//   - a PutStart's allocated slots overlap no committed object and carry
//     generations above every one issued before;
//   - a lookup hit names exactly the location ListObjects lists for the key.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fake_clock.h"
#include "common/wire.h"
#include "fuzz/fuzz_input.h"
#include "glog/logging.h"
#include "master/fake_metadata_store.h"
#include "master/master_service.h"
#include "master/replica_key.h"

namespace hymcache::master {
namespace {

using fuzz::FuzzInput;
namespace v1 = hymcache::v1;

// Forwards to a FakeMetadataStore that outlives the service, so that a
// "restart" can load the same store into a new MasterService.
class SharedStore : public MetadataStore {
 public:
  explicit SharedStore(FakeMetadataStore* s) : s_(s) {}
  absl::Status Apply(const MetadataMutation& m) override { return s_->Apply(m); }
  absl::StatusOr<uint64_t> NextGeneration() override {
    return s_->NextGeneration();
  }
  uint64_t GenerationCeiling() override { return s_->GenerationCeiling(); }
  absl::Status ForEachObject(
      const std::function<void(absl::string_view, const ObjectRecord&)>& fn)
      override {
    return s_->ForEachObject(fn);
  }
  absl::StatusOr<std::vector<v1::NodeInfo>> LoadNodes() override {
    return s_->LoadNodes();
  }

 private:
  FakeMetadataStore* const s_;
};

struct Listed {
  std::string key;
  v1::Location loc;
};

class Driver {
 public:
  explicit Driver(FuzzInput& in) : in_(in) {
    options_.clock = &clock_;
    options_.max_batch_keys = 64;
    options_.node_timeout = absl::Seconds(10);
    options_.heartbeat_interval = absl::Seconds(1);
    options_.put_timeout = absl::Seconds(30);
    // Its nodes write no bytes, so they give no write receipts: commits
    // are fuzzed as without node-confirmed commits (receipts have their own
    // tests in master_service_put_test).
    options_.require_write_receipts = false;
    options_.read_lease = absl::Seconds(5);
    options_.max_evictions_per_put = 1 + in_.Range(0, 63);
    options_.max_eviction_scan = 1 + in_.Range(0, 255);
    options_.max_reconcile_extents = 1 + in_.Range(0, 255);
    options_.max_unlisted_per_reconcile = 1 + in_.Range(0, 15);
    options_.recency_batch = in_.Range(0, 16);
    options_.auto_replica_branches = in_.Range(0, 2);
    options_.engine_caches.max_engines = in_.Range(0, 3);
    options_.engine_caches.max_blocks_per_engine = 1 + in_.Range(0, 7);
    // Drawn from the values above, so that older corpus entries read the
    // same: the cost policy on about half the runs.
    options_.eviction_policy = options_.recency_batch % 2 == 1
                                   ? EvictionPolicy::kCost
                                   : EvictionPolicy::kLru;
    options_.eviction_cost.pool = 1 + options_.max_evictions_per_put % 8;
    options_.eviction_cost.turn_horizon = absl::Seconds(20);
    Restart();
  }

  void Run() {
    for (int steps = 0; steps < 256 && !in_.empty() && service_ != nullptr;
         ++steps) {
      Step();
      CheckListings();
    }
  }

 private:
  // ---- pools

  std::string NodeName() {
    if (in_.Range(0, 15) == 0) return in_.String(140);
    return absl::StrCat("node-", in_.Range(0, 3));
  }
  std::string Key() {
    const uint8_t k = in_.U8();
    if (k < 200) return absl::StrCat("k", k % 24);
    if (k < 230 && !listed_.empty()) {
      return listed_[in_.Range(0, listed_.size() - 1)].key;
    }
    return in_.String(300);  // raw: empty, long, binary
  }
  // A machine's name: one of a few, or raw (empty, too long).
  std::string Host() {
    const uint8_t h = in_.U8();
    if (h < 230) return absl::StrCat("h", h % 3);
    return in_.String(300);
  }
  uint32_t NodeId() {
    const uint8_t k = in_.U8();
    if (k < 240) return k % 6;  // 0 (none) and the first few ids
    return in_.U32();
  }
  uint64_t Incarnation() {
    const uint8_t k = in_.U8();
    return k < 250 ? k % 4 : in_.U64();
  }
  uint64_t PutId() {
    const uint8_t k = in_.U8();
    if (k < 200 && !put_ids_.empty()) return put_ids_[k % put_ids_.size()];
    return k < 250 ? k % 8 : in_.U64();
  }
  uint64_t Length() {
    const uint8_t k = in_.U8();
    if (k < 200) return uint64_t{1} << (k % 20);  // 1 B .. 512 KiB
    if (k < 250) return 1 + in_.U32() % (uint64_t{1} << 20);
    return in_.U64();
  }
  v1::Location Location() {
    v1::Location loc;
    if (in_.Bool() && !listed_.empty()) {
      loc = listed_[in_.Range(0, listed_.size() - 1)].loc;
      switch (in_.Range(0, 5)) {  // a near miss
        case 0: loc.set_addr(loc.addr() + in_.Range(0, 4096)); break;
        case 1: loc.set_length(loc.length() + in_.Range(0, 4096)); break;
        case 2: loc.set_generation(loc.generation() + in_.Range(0, 3)); break;
        case 3: loc.set_region_id(in_.Range(0, 3)); break;
        default: break;
      }
      return loc;
    }
    loc.set_node_id(NodeId());
    loc.set_region_id(in_.Range(0, 3));
    loc.set_addr(in_.Bool() ? in_.U64() : in_.Range(0, 1 << 20));
    loc.set_length(Length());
    loc.set_generation(in_.Range(0, 300));
    return loc;
  }

  template <typename Proto>
  bool Raw(Proto* p) {
    if (in_.Range(0, 7) != 0) return false;
    // Errors are fine: whatever ParseFromString left is what gRPC would
    // hand over for a malformed message too (it refuses those itself).
    p->ParseFromString(in_.String(512));
    return true;
  }

  // ---- steps

  void Step() {
    switch (in_.Range(0, 18)) {
      case 0:
      case 1: Register(); break;
      case 2: {
        v1::HeartbeatRequest r;
        if (!Raw(&r)) {
          r.set_node_id(NodeId());
          r.set_incarnation(Incarnation());
        }
        service_->Heartbeat(r).IgnoreError();
        break;
      }
      case 3: {
        v1::DeregisterNodeRequest r;
        if (!Raw(&r)) {
          r.set_node_id(NodeId());
          r.set_incarnation(Incarnation());
        }
        service_->DeregisterNode(r).IgnoreError();
        break;
      }
      case 4:
      case 5: PutStart(); break;
      case 6: {
        v1::PutCommitRequest r;
        if (!Raw(&r)) {
          r.set_put_id(PutId());
          for (int n = in_.Range(0, 3); n > 0; --n) {
            r.add_failed_indexes(in_.Range(0, 9) == 0 ? in_.U32()
                                                      : in_.Range(0, 8));
          }
        }
        service_->PutCommit(r).IgnoreError();
        break;
      }
      case 7: {
        v1::PutAbortRequest r;
        if (!Raw(&r)) r.set_put_id(PutId());
        service_->PutAbort(r).IgnoreError();
        break;
      }
      case 8: Lookup(); break;
      case 9: {
        v1::RemoveRequest r;
        if (!Raw(&r)) {
          for (int n = in_.Range(0, 6); n > 0; --n) r.add_keys(Key());
        }
        auto resp = service_->Remove(r);
        if (resp.ok()) FUZZ_CHECK(resp->removed_size() == r.keys_size());
        break;
      }
      case 10: {
        v1::ReportMissingRequest r;
        if (!Raw(&r)) {
          const int n = in_.Range(0, 4);
          for (int i = 0; i < n; ++i) r.add_keys(Key());
          const int m = in_.Range(0, 9) == 0 ? in_.Range(0, 5) : n;
          for (int i = 0; i < m; ++i) *r.add_locations() = Location();
        }
        auto resp = service_->ReportMissing(r);
        if (resp.ok()) FUZZ_CHECK(resp->dropped_size() == r.keys_size());
        break;
      }
      case 11: Reconcile(); break;
      case 12: {
        v1::ListObjectsResponse out;
        uint64_t cursor = in_.Range(0, 3) == 0 ? in_.U64() : 0;
        const uint32_t node = NodeId();
        for (int pages = 0; pages < 64; ++pages) {
          if (!service_->ListObjects(node, &cursor, 1 + in_.Range(0, 7),
                                     &out)) {
            break;
          }
        }
        break;
      }
      case 13: {
        service_->ListNodes();
        service_->GetStats();
        service_->counters();
        v1::InspectKeyRequest inspect;
        if (!Raw(&inspect)) inspect.set_key(Key());
        service_->InspectKey(inspect).IgnoreError();
        v1::SetNodeDrainingRequest drain;
        if (!Raw(&drain)) {
          drain.set_name(NodeName());
          drain.set_draining(in_.Bool());
        }
        service_->SetNodeDraining(drain).IgnoreError();
        break;
      }
      case 14: service_->ReapExpired(); break;
      case 15: clock_.Advance(absl::Milliseconds(in_.Range(0, 40000))); break;
      case 16:
        store_.FailWritesForTest(in_.Range(0, 3) == 0
                                     ? absl::UnavailableError("fuzz: store down")
                                     : absl::OkStatus());
        break;
      case 17: Restart(); break;
      case 18:
        EngineBlocks();
        break;
    }
  }

  // An engine's report, then a PrefixQuery: each engine answered holds at
  // most the chain's keys and its cap, and the engines come longest first.
  void EngineBlocks() {
    v1::ReportEngineBlocksRequest r;
    if (!Raw(&r)) {
      r.set_engine_id(in_.Range(0, 9) == 0
                          ? in_.String(140)
                          : absl::StrCat("e", in_.Range(0, 4)));
      r.set_cleared(in_.Range(0, 4) == 0);
      for (int n = in_.Range(0, 3); n > 0; --n) r.add_removed(Key());
      for (int n = in_.Range(0, 6); n > 0; --n) r.add_stored(Key());
    }
    auto resp = service_->ReportEngineBlocks("default", r);
    if (resp.ok()) {
      FUZZ_CHECK(resp->blocks() <=
                 options_.engine_caches.max_blocks_per_engine);
    }
    v1::PrefixQueryRequest q;
    if (!Raw(&q)) {
      for (int n = in_.Range(0, 6); n > 0; --n) q.add_keys(Key());
    }
    auto answer = service_->PrefixQuery(q);
    if (!answer.ok()) return;
    uint32_t last = UINT32_MAX;
    for (const auto& e : answer->engines()) {
      FUZZ_CHECK(e.longest_prefix() >= 1 &&
                 e.longest_prefix() <= static_cast<uint32_t>(q.keys_size()));
      FUZZ_CHECK(e.longest_prefix() <= last);
      last = e.longest_prefix();
    }
    FUZZ_CHECK(answer->engines_size() <=
               static_cast<int>(options_.engine_caches.max_engines));
  }

  void Restart() {
    service_.reset();
    auto s = MasterService::Create(options_,
                                   std::make_unique<SharedStore>(&store_));
    if (!s.ok()) {
      // Loading can fail only through the store (failure injection).
      FUZZ_CHECK(s.status().code() == absl::StatusCode::kUnavailable)
          << s.status();
      store_.FailWritesForTest(absl::OkStatus());
      s = MasterService::Create(options_,
                                std::make_unique<SharedStore>(&store_));
      FUZZ_CHECK(s.ok()) << s.status();
    }
    service_ = std::move(*s);
  }

  void Register() {
    v1::RegisterNodeRequest r;
    if (!Raw(&r)) {
      r.set_name(NodeName());
      r.set_incarnation(Incarnation());
      const uint8_t a = in_.U8();
      r.set_data_address(a < 240 ? absl::StrCat("127.0.0.1:", 7000 + a % 4)
                                 : in_.String(80));
      r.set_control_address(a < 240 ? "127.0.0.1:8000" : in_.String(80));
      const int regions = in_.Range(0, 15) == 0 ? in_.Range(0, 70)
                                                : in_.Range(1, 3);
      for (int i = 0; i < regions; ++i) {
        v1::RegionInfo* g = r.add_regions();
        g->set_region_id(in_.Range(0, 3));
        const uint8_t c = in_.U8();
        g->set_capacity_bytes(c < 240 ? uint64_t{1} << (12 + c % 10)
                                      : in_.U64());
        const uint8_t al = in_.U8();
        g->set_alignment(al < 240 ? 1u << (al % 13) : in_.U32());
        g->set_numa_node(-1);
        g->set_device_kind(in_.Bool() ? "dram" : "hybrid");
        g->set_persistent(in_.Bool());
      }
      if (in_.Range(0, 7) == 0) {
        (*r.mutable_transport_params())[in_.String(16)] = in_.String(64);
      }
      if (in_.Range(0, 3) == 0) r.set_host(Host());
    }
    service_->RegisterNode(r).IgnoreError();
  }

  void PutStart() {
    v1::PutStartRequest r;
    if (!Raw(&r)) {
      const int n = in_.Range(0, 15) == 0 ? in_.Range(0, 70) : in_.Range(1, 6);
      for (int i = 0; i < n; ++i) {
        r.add_keys(Key());
        r.add_lengths(Length());
      }
      if (in_.Range(0, 9) == 0) r.add_lengths(Length());  // count mismatch
      if (in_.Range(0, 3) == 0) r.set_preferred_node_id(NodeId());
      if (in_.Bool()) r.set_parent_key(Key());
      if (in_.Range(0, 4) == 0) {
        // Copies of listed keys, naming the generations they copy: the
        // listed one, none (0), another, or a count that does not match.
        r.set_replica(true);
        if (in_.Bool()) {
          std::map<std::string, uint64_t> listed;
          for (const Listed& l : listed_) listed[l.key] = l.loc.generation();
          for (const std::string& key : r.keys()) {
            const uint8_t g = in_.U8();
            auto it = listed.find(key);
            r.add_copied_generations(g < 160 && it != listed.end() ? it->second
                                     : g < 220                     ? 0
                                                                   : in_.U64());
          }
          if (in_.Range(0, 9) == 0) r.add_copied_generations(in_.U64());
        }
      }
    }
    uint64_t max_gen = 0;
    for (const Listed& l : listed_) {
      max_gen = std::max<uint64_t>(max_gen, l.loc.generation());
    }
    max_gen = std::max(max_gen, max_issued_);
    auto resp = service_->PutStart(r);
    if (!resp.ok()) return;
    FUZZ_CHECK(resp->slots_size() == r.keys_size());
    if (resp->put_id() != 0) {
      FUZZ_CHECK(!resp->node().draining())
          << "placed on draining node " << resp->node().node_id();
    }
    if (resp->put_id() != 0) put_ids_.push_back(resp->put_id());
    Listings();
    for (const v1::PutSlot& slot : resp->slots()) {
      if (slot.state() != v1::SLOT_ALLOCATED) continue;
      const v1::Location& a = slot.location();
      FUZZ_CHECK(a.generation() > max_gen)
          << "generation " << a.generation() << " not above " << max_gen;
      max_issued_ = std::max<uint64_t>(max_issued_, a.generation());
      FUZZ_CHECK(a.length() > 0);
      for (const Listed& l : listed_) {
        FUZZ_CHECK(!Overlap(a, l.loc))
            << "new slot " << a.ShortDebugString() << " overlaps committed '"
            << l.key << "' " << l.loc.ShortDebugString();
      }
    }
  }

  void Lookup() {
    v1::BatchLookupRequest r;
    if (!Raw(&r)) {
      for (int n = in_.Range(0, 8); n > 0; --n) r.add_keys(Key());
      r.set_for_read(in_.Bool());
      r.set_packed(in_.Bool());
      if (!r.for_read()) r.set_ended(in_.Bool());
      // A think-time hint's lookup (drawn from the key count: see above).
      r.set_next_turn(r.for_read() && r.keys_size() % 3 == 1);
      if (in_.Range(0, 3) == 0) r.set_reader_host(Host());
    }
    auto resp = service_->BatchLookup(r);
    if (!resp.ok()) return;
    FUZZ_CHECK(resp->hit_prefix_length() <= uint32_t(r.keys_size()));
    FUZZ_CHECK(resp->copy_prefix_length() <= resp->hit_prefix_length());
    if (r.exists_only()) {
      // A raw request's existence check: a bitmap, nothing else (packed or
      // not: there are no records to pack).
      FUZZ_CHECK(resp->found_bits().size() == size_t(r.keys_size() + 7) / 8);
      FUZZ_CHECK(resp->results_size() == 0);
      FUZZ_CHECK(resp->packed_results().empty());
      return;
    }
    if (r.packed()) Unpack(&*resp, r.keys_size());
    FUZZ_CHECK(resp->results_size() == r.keys_size());
    Listings();
    std::map<std::string, v1::Location> by_key;
    for (const Listed& l : listed_) by_key[l.key] = l.loc;
    for (int i = 0; i < resp->results_size(); ++i) {
      const v1::LookupResult& res = resp->results(i);
      if (i < int(resp->hit_prefix_length())) FUZZ_CHECK(res.found());
      if (!res.found()) continue;
      // The key's listing or its copy's (master/replica_key.h).
      auto it = by_key.find(r.keys(i));
      auto copy = by_key.find(ReplicaKeyOf(r.keys(i)));
      FUZZ_CHECK(it != by_key.end() || copy != by_key.end())
          << "hit for an unlisted key";
      const std::string got = res.location().SerializeAsString();
      FUZZ_CHECK(
          (it != by_key.end() && it->second.SerializeAsString() == got) ||
          (copy != by_key.end() && copy->second.SerializeAsString() == got))
          << "lookup " << res.location().ShortDebugString()
          << " is neither the key's listing nor its copy's";
    }
  }

  // A packed answer (BatchLookupRequest.packed) as the results it packs:
  // exactly one well-formed record per key, and no results beside them.
  static void Unpack(v1::BatchLookupResponse* resp, int keys) {
    FUZZ_CHECK(resp->results_size() == 0) << "results beside packed ones";
    const std::string p = resp->packed_results();
    FUZZ_CHECK(p.size() == size_t(keys) * wire::kLookupRecordBytes)
        << p.size() << " packed bytes for " << keys << " keys";
    for (size_t off = 0; off < p.size(); off += wire::kLookupRecordBytes) {
      auto rec = wire::DecodeLookupRecord(
          reinterpret_cast<const uint8_t*>(p.data()) + off);
      FUZZ_CHECK(rec.ok()) << rec.status();
      v1::LookupResult* res = resp->add_results();
      if (rec->node_id == 0) continue;
      res->set_found(true);
      v1::Location* loc = res->mutable_location();
      loc->set_node_id(rec->node_id);
      loc->set_region_id(rec->region_id);
      loc->set_addr(rec->addr);
      loc->set_length(rec->length);
      loc->set_generation(rec->generation);
    }
  }

  void Reconcile() {
    const uint32_t node = NodeId();
    const uint64_t inc = Incarnation();
    absl::StatusOr<std::unique_ptr<Reconciliation>> rec;
    if (in_.Bool()) {
      rec = service_->BeginReconcile(node, inc);
    } else {
      auto epoch = service_->StartReconcile(node, inc);
      if (!epoch.ok()) return;
      const uint64_t e = in_.Range(0, 7) == 0 ? in_.U64() : *epoch;
      if (in_.Range(0, 7) == 0) Step();  // something happens meanwhile
      if (service_ == nullptr) return;
      rec = service_->OpenReconcile(node, inc, e);
    }
    if (!rec.ok()) return;
    // The node's extents: mostly what the master lists for it, some
    // missing, some altered, some unknown.
    Listings();
    for (int chunks = in_.Range(1, 3); chunks > 0; --chunks) {
      v1::ReconcileNodeRequest msg;
      if (!Raw(&msg)) {
        for (const Listed& l : listed_) {
          if (l.loc.node_id() != node || in_.Range(0, 5) == 0) continue;
          v1::Location* e = msg.add_extents();
          *e = l.loc;
          e->clear_node_id();
        }
        for (int n = in_.Range(0, 3); n > 0; --n) {
          *msg.add_extents() = Location();
        }
      }
      if (!(*rec)->Add(msg.extents()).ok()) return;
    }
    if (in_.Range(0, 7) == 0) Step();
    if (service_ == nullptr) return;
    auto resp = service_->FinishReconcile(std::move(*rec));
    if (resp.ok()) {
      FUZZ_CHECK(resp->unlisted_size() <= int(resp->unlisted_count()));
      FUZZ_CHECK(resp->unlisted_size() <=
                 int(options_.max_unlisted_per_reconcile));
    }
  }

  // ---- checks

  static bool Overlap(const v1::Location& a, const v1::Location& b) {
    if (a.node_id() != b.node_id() || a.region_id() != b.region_id()) {
      return false;
    }
    return a.addr() < b.addr() + b.length() && b.addr() < a.addr() + a.length();
  }

  void Listings() {
    listed_.clear();
    v1::ListObjectsResponse out;
    uint64_t cursor = 0;
    while (service_->ListObjects(0, &cursor, 4096, &out)) {
    }
    for (const v1::ListedObject& o : out.objects()) {
      listed_.push_back({o.key(), o.location()});
    }
  }

  void CheckListings() {
    if (service_ == nullptr) return;
    Listings();
    std::map<std::pair<uint32_t, uint32_t>, uint64_t> capacity;
    const v1::ListNodesResponse nodes = service_->ListNodes();
    for (const v1::NodeInfo& n : nodes.nodes()) {
      for (const v1::RegionInfo& g : n.regions()) {
        capacity[{n.node_id(), g.region_id()}] = g.capacity_bytes();
      }
    }
    std::set<uint64_t> gens;
    std::set<std::string> keys;
    // (node, region, addr) -> end
    std::map<std::tuple<uint32_t, uint32_t, uint64_t>, uint64_t> ranges;
    for (const Listed& l : listed_) {
      const v1::Location& a = l.loc;
      FUZZ_CHECK(keys.insert(l.key).second) << "key listed twice";
      FUZZ_CHECK(gens.insert(a.generation()).second)
          << "generation " << a.generation() << " listed twice";
      auto cap = capacity.find({a.node_id(), a.region_id()});
      FUZZ_CHECK(cap != capacity.end())
          << "object '" << l.key << "' on an unknown node or region "
          << a.ShortDebugString();
      FUZZ_CHECK(a.length() > 0 && a.addr() + a.length() >= a.addr() &&
                 a.addr() + a.length() <= cap->second)
          << "object outside its region: " << a.ShortDebugString();
      ranges[{a.node_id(), a.region_id(), a.addr()}] = a.addr() + a.length();
    }
    FUZZ_CHECK(ranges.size() == listed_.size())
        << "two objects at one address";
    const std::tuple<uint32_t, uint32_t, uint64_t>* prev = nullptr;
    uint64_t prev_end = 0;
    for (const auto& [at, end] : ranges) {
      if (prev != nullptr && std::get<0>(*prev) == std::get<0>(at) &&
          std::get<1>(*prev) == std::get<1>(at)) {
        FUZZ_CHECK(std::get<2>(at) >= prev_end)
            << "objects overlap on node " << std::get<0>(at) << " region "
            << std::get<1>(at) << " at " << std::get<2>(at);
      }
      prev = &at;
      prev_end = end;
    }
  }

  FuzzInput& in_;
  FakeClock clock_;
  FakeMetadataStore store_;
  MasterServiceOptions options_;
  std::unique_ptr<MasterService> service_;
  std::vector<uint64_t> put_ids_;
  std::vector<Listed> listed_;
  uint64_t max_issued_ = 0;
};

}  // namespace
}  // namespace hymcache::master

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // The service logs every registration; keep the fuzzer's output readable.
  FLAGS_minloglevel = 2;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hymcache::fuzz::FuzzInput in(data, size);
  hymcache::master::Driver d(in);
  d.Run();
  return 0;
}
