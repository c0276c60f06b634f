#include "master/master_service.h"

#include "master/tenant.h"

#include "absl/base/internal/endian.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "master/index_snapshot.h"
#include "common/net.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

constexpr size_t kMaxNodeNameBytes = 128;
// Registration size caps (documented in proto/master.proto).
constexpr size_t kMaxAddressBytes = 256;
constexpr int kMaxTransportParams = 32;
constexpr size_t kMaxTransportParamKeyBytes = 64;
constexpr size_t kMaxTransportParamValueBytes = 4096;
constexpr size_t kMaxTransportParamsBytes = 8192;
constexpr uint32_t kMaxNodesLimit = 65536;
constexpr int kMaxRegions = 64;
constexpr uint32_t kMaxAlignment = uint32_t{1} << 30;
constexpr uint32_t kMaxBatchKeysLimit = 65536;
// WARNING lines per bulk drop before switching to a summary.
constexpr int kMaxDropWarnings = 10;
constexpr absl::Duration kMaxReadLease = absl::Hours(24);
constexpr absl::Duration kMaxReconcileInterval = absl::Hours(24);
constexpr uint64_t kMaxReconcileExtentsLimit = uint64_t{1} << 28;
constexpr uint32_t kMaxUnlistedLimit = uint32_t{1} << 20;
// Extents in one ReconcileNode message.
constexpr int kMaxReconcileChunk = 65536;
// Index records compared per shared-lock hold during a reconciliation.
constexpr size_t kReconcileScanChunk = 65536;
// Read ticks stay below this (LeaseTick moves the epoch forward).
constexpr int64_t kMaxLeaseTick = int64_t{1} << 31;

// The one conversion of a location to its wire form.
void ToProto(const ObjectLocation& e, v1::Location* loc) {
  loc->set_node_id(e.node_id);
  loc->set_region_id(e.region_id);
  loc->set_addr(e.addr);
  loc->set_length(e.length);
  loc->set_generation(e.generation);
}

uint64_t RoundUp(uint64_t len, uint32_t alignment) {
  return (len + alignment - 1) & ~uint64_t{alignment - 1};
}

absl::Status ValidateAddress(const std::string& address, const char* what) {
  if (address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", address.size(), " bytes (want at most ",
                     kMaxAddressBytes, ")"));
  }
  auto hp = SplitHostPort(address);
  if (!hp.ok() || hp->second == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", absl::CHexEscape(address), "' is not host:port"));
  }
  return absl::OkStatus();
}

std::string PrintableKey(absl::string_view key) {
  if (key.size() > 64) key = key.substr(0, 64);
  return absl::CHexEscape(key);
}

absl::Status ValidateTransportParams(
    const google::protobuf::Map<std::string, std::string>& params) {
  if (params.size() > kMaxTransportParams) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.size(), " transport_params (want at most ",
                     kMaxTransportParams, ")"));
  }
  size_t total = 0;
  for (const auto& [key, value] : params) {
    if (key.empty() || key.size() > kMaxTransportParamKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transport_params key '", PrintableKey(key), "' of ", key.size(),
          " bytes (want 1..", kMaxTransportParamKeyBytes, ")"));
    }
    if (value.size() > kMaxTransportParamValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transport_params '", PrintableKey(key), "' of ", value.size(),
          " bytes (want at most ", kMaxTransportParamValueBytes, ")"));
    }
    total += key.size() + value.size();
  }
  if (total > kMaxTransportParamsBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport_params of ", total,
                     " bytes in all (want at most ", kMaxTransportParamsBytes,
                     ")"));
  }
  return absl::OkStatus();
}

// Registration fields of a region (used_bytes cleared).
v1::RegionInfo DurableRegion(const v1::RegionInfo& r) {
  v1::RegionInfo out = r;
  out.set_used_bytes(0);
  return out;
}

// Whether two region lists lay out the address space identically.
bool SameLayout(const google::protobuf::RepeatedPtrField<v1::RegionInfo>& a,
                const google::protobuf::RepeatedPtrField<v1::RegionInfo>& b) {
  if (a.size() != b.size()) return false;
  std::map<uint32_t, const v1::RegionInfo*> am;
  for (const auto& r : a) am[r.region_id()] = &r;
  for (const auto& r : b) {
    auto it = am.find(r.region_id());
    if (it == am.end()) return false;
    if (it->second->capacity_bytes() != r.capacity_bytes() ||
        it->second->alignment() != r.alignment()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status MasterServiceOptions::Validate() const {
  if (node_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node_timeout must be > 0");
  }
  if (heartbeat_interval <= absl::ZeroDuration() ||
      heartbeat_interval >= node_timeout) {
    return absl::InvalidArgumentError(
        "heartbeat_interval must be > 0 and below node_timeout");
  }
  if (absl::ToInt64Milliseconds(heartbeat_interval) >
      int64_t{std::numeric_limits<uint32_t>::max()}) {
    return absl::InvalidArgumentError("heartbeat_interval is too long");
  }
  if (put_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("put_timeout must be > 0");
  }
  if (max_batch_keys == 0 || max_batch_keys > kMaxBatchKeysLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_keys must be 1..", kMaxBatchKeysLimit));
  }
  if (max_key_bytes == 0 || max_key_bytes > MetadataIndex::kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_key_bytes must be 1..", MetadataIndex::kMaxKeyBytes));
  }
  if (max_object_bytes == 0 || max_object_bytes > MetadataIndex::kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_object_bytes must be 1..", MetadataIndex::kMaxLength));
  }
  if (read_lease < absl::ZeroDuration() || read_lease > kMaxReadLease) {
    return absl::InvalidArgumentError("read_lease must be 0..24h");
  }
  if (capability_lifetime < absl::Seconds(1) ||
      capability_lifetime > absl::Hours(1)) {
    return absl::InvalidArgumentError("capability_lifetime must be 1s..1h");
  }
  if (node_auth_window < absl::Seconds(1) ||
      node_auth_window > absl::Hours(1)) {
    return absl::InvalidArgumentError("node_auth_window must be 1s..1h");
  }
  if (reconcile_interval < absl::ZeroDuration() ||
      reconcile_interval > kMaxReconcileInterval) {
    return absl::InvalidArgumentError("reconcile_interval must be 0..24h");
  }
  if (max_reconcile_extents == 0 ||
      max_reconcile_extents > kMaxReconcileExtentsLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_reconcile_extents must be 1..", kMaxReconcileExtentsLimit));
  }
  if (max_unlisted_per_reconcile == 0 ||
      max_unlisted_per_reconcile > kMaxUnlistedLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_unlisted_per_reconcile must be 1..", kMaxUnlistedLimit));
  }
  if (max_eviction_scan == 0) {
    return absl::InvalidArgumentError("max_eviction_scan must be > 0");
  }
  if (max_nodes == 0 || max_nodes > kMaxNodesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_nodes must be 1..", kMaxNodesLimit));
  }
  if (snapshot_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("snapshot_interval must be >= 0");
  }
  if (forget_dead_nodes_after <= node_timeout) {
    return absl::InvalidArgumentError(
        "forget_dead_nodes_after must be > node_timeout");
  }
  if (!(max_pending_share_per_caller > 0 &&
        max_pending_share_per_caller <= 1)) {
    return absl::InvalidArgumentError(
        "max_pending_share_per_caller must be in (0, 1]");
  }
  if (max_pending_slots_per_caller == 0) {
    return absl::InvalidArgumentError(
        "max_pending_slots_per_caller must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MasterService>> MasterService::Create(
    const MasterServiceOptions& options, std::unique_ptr<MetadataStore> store) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  if (store == nullptr) {
    return absl::InvalidArgumentError("MasterService needs a MetadataStore");
  }
  std::unique_ptr<MasterService> service(
      new MasterService(options, std::move(store)));
  s = service->Load();
  if (!s.ok()) return s;
  return service;
}

MasterService::MasterService(const MasterServiceOptions& options,
                             std::unique_ptr<MetadataStore> store)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      store_(std::move(store)) {
  // Put ids are not durable: start at a random point so that a put id from
  // before a restart does not name a put of the new process.
  std::random_device rd;
  uint64_t start = (uint64_t{rd()} << 32) | 1;
  MutexLock l(&mu_);
  next_put_id_ = start;
  lease_epoch_ = clock_->Now();
  index_.TrackUsed(options_.recency_batch > 0);
}

MasterService::~MasterService() {
  {
    MutexLock l(&mu_);
    // Everything read since the last batch, in batches of a bounded size.
    while (index_.used_queued() > 0 &&
           PersistRecencyLocked(std::max<uint32_t>(options_.recency_batch,
                                                   1 << 16)) > 0) {
    }
  }
  // The next start-up loads this instead of scanning the store.
  if (!options_.snapshot_path.empty()) {
    absl::Status s = WriteSnapshot();
    if (!s.ok()) LOG(WARNING) << "no index snapshot at shutdown: " << s;
  }
}

absl::Status MasterService::WriteSnapshot() {
  if (options_.snapshot_path.empty()) {
    return absl::FailedPreconditionError("no snapshot_path");
  }
  MutexLock w(&snapshot_mu_);
  const absl::Time start = clock_->Now();
  absl::StatusOr<uint64_t> bytes;
  uint64_t seq = 0;
  size_t objects = 0;
  {
    // Every store write happens under mu_ held exclusively, before the
    // change is applied in memory: with mu_ held the sequence number names
    // exactly the state of the index.
    ReaderMutexLock l(&mu_);
    seq = store_->LatestSequence();
    if (seq == 0) {
      return absl::UnimplementedError("the store keeps no sequence numbers");
    }
    objects = index_.size();
    bytes = WriteIndexSnapshotTemp(options_.snapshot_path, seq, index_);
  }
  if (!bytes.ok()) return bytes.status();
  absl::Status s = CommitIndexSnapshot(options_.snapshot_path);
  if (!s.ok()) return s;
  last_snapshot_ = clock_->Now();
  LOG(INFO) << "index snapshot: " << objects << " objects at sequence " << seq
            << ", " << *bytes << " bytes in "
            << absl::FormatDuration(last_snapshot_ - start);
  return absl::OkStatus();
}

absl::Status MasterService::MaybeSnapshot() {
  if (options_.snapshot_path.empty() ||
      options_.snapshot_interval <= absl::ZeroDuration()) {
    return absl::OkStatus();
  }
  {
    MutexLock w(&snapshot_mu_);
    if (last_snapshot_ == absl::Time()) last_snapshot_ = clock_->Now();
    if (clock_->Now() - last_snapshot_ < options_.snapshot_interval) {
      return absl::OkStatus();
    }
  }
  return WriteSnapshot();
}

MasterService::LoadPath MasterService::load_path() const {
  ReaderMutexLock l(&mu_);
  return load_path_;
}

absl::Status MasterService::Load() {
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  auto nodes = store_->LoadNodes();
  if (!nodes.ok()) return nodes.status();
  for (auto& info : *nodes) {
    Node node;
    node.last_seen = now;
    for (const auto& r : info.regions()) {
      auto alloc = RegionAllocator::Create({r.capacity_bytes(), r.alignment()});
      if (!alloc.ok()) {
        LOG(WARNING) << "node " << info.name() << " region " << r.region_id()
                     << " not usable: " << alloc.status();
        continue;
      }
      Region& region = node.regions[r.region_id()];
      region.info = DurableRegion(r);
      region.allocator = std::move(alloc).value();
    }
    const uint32_t id = info.node_id();
    if (id == 0 || nodes_.count(id) || node_by_name_.count(info.name())) {
      LOG(WARNING) << "ignoring persisted node record '" << info.name()
                   << "' with duplicate or zero id " << id;
      continue;
    }
    next_node_id_ = std::max(next_node_id_, id + 1);
    node_by_name_[info.name()] = id;
    // DeregisterNode persists alive = false: such a node stays dead until
    // it registers again.
    node.deregistered = !info.alive();
    if (!info.node_key().empty()) node.mac.emplace(info.node_key());
    node.info = std::move(info);
    nodes_.emplace(id, std::move(node));
  }

  // The fast path reserves each region's space in one ReserveAll after the
  // scan (a tree search per object was more than half of a restart). Only
  // a corrupt store (overlapping or out-of-range records) makes some region
  // refuse; then the load starts over on the careful path, which reserves
  // one object at a time and drops the ones that do not fit.
  std::vector<std::string> doomed;
  if (LoadSnapshotLocked(&doomed)) {
    load_path_ = LoadPath::kSnapshot;
  } else {
    load_path_ = LoadPath::kScan;
    absl::StatusOr<bool> loaded =
        LoadObjectsLocked(/*careful=*/false, &doomed);
    if (!loaded.ok()) return loaded.status();
    if (!*loaded) {
      LOG(WARNING) << "persisted objects overlap or leave their region: "
                      "loading them one at a time";
      ResetObjectsLocked();
      doomed.clear();
      load_path_ = LoadPath::kCarefulScan;
      loaded = LoadObjectsLocked(/*careful=*/true, &doomed);
      if (!loaded.ok()) return loaded.status();
    }
  }
  absl::Status s;
  if (!doomed.empty()) {
    LOG(WARNING) << "dropped " << doomed.size()
                 << " persisted objects that no longer fit their node";
    counters_.objects_dropped += doomed.size();
  }
  // Chains and recency order; objects whose chain lost a block go.
  const auto orphans = index_.FinishLoad();
  for (const auto& [key, e] : orphans) {
    FreeSpace(e.node_id, e.region_id, e.addr);
    CountObject(e, -1);
    doomed.push_back(key);
  }
  if (!orphans.empty()) {
    LOG(WARNING) << "dropped " << orphans.size()
                 << " persisted objects whose chain lost a block before them";
    counters_.orphans_removed += orphans.size();
  }
  if (!doomed.empty()) {
    s = store_->DeleteObjects(std::move(doomed));
    if (!s.ok()) return s;
  }
  LOG(INFO) << "master loaded " << nodes_.size() << " nodes and "
            << index_.size() << " objects";
  return absl::OkStatus();
}

void MasterService::ResetObjectsLocked() {
  index_.Clear();
  object_bytes_ = 0;
  for (auto& [id, node] : nodes_) {
    node.object_count = 0;
    for (auto& [region_id, region] : node.regions) {
      region.object_count = 0;
      region.allocator = std::move(
          RegionAllocator::Create({region.allocator->capacity(),
                                   region.allocator->alignment()})
              .value());
    }
  }
}

bool MasterService::LoadSnapshotLocked(std::vector<std::string>* doomed) {
  if (options_.snapshot_path.empty()) return false;
  const absl::Time t_start = absl::Now();
  // Each known region's allocator, built from the snapshot's locations on
  // its reader's second thread while this one restores the index (at 10 M
  // objects they took a third of the restart after it). Used when the index
  // ends up holding exactly the snapshot's entries (no change since, no
  // orphan, every region known, no empty object); otherwise they are built
  // from the index below.
  struct Prebuilt {
    RegionAllocatorOptions options;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t bytes = 0;
    size_t count = 0;
    std::unique_ptr<RegionAllocator> allocator;
  };
  absl::flat_hash_map<uint64_t, Prebuilt> prebuilt;  // node << 32 | region
  for (const auto& [node_id, node] : nodes_) {
    for (const auto& [region_id, region] : node.regions) {
      prebuilt[(uint64_t{node_id} << 32) | region_id].options = {
          region.allocator->capacity(), region.allocator->alignment()};
    }
  }
  // Written by the reader's thread, read here after it returned.
  bool prebuilt_ok = true;
  auto build = [&prebuilt, &prebuilt_ok](absl::string_view stream) {
    uint64_t last_id = ~uint64_t{0};
    Prebuilt* last = nullptr;
    absl::Status s = MetadataIndex::ForEachSnapshotLocation(
        stream, [&](const ObjectLocation& e) {
          if (!prebuilt_ok) return;
          const uint64_t id = (uint64_t{e.node_id} << 32) | e.region_id;
          if (id != last_id) {
            auto it = prebuilt.find(id);
            if (it == prebuilt.end()) {
              prebuilt_ok = false;  // an unknown region: dropped below
              return;
            }
            last_id = id;
            last = &it->second;
          }
          if (e.length == 0) {
            prebuilt_ok = false;
            return;
          }
          last->ranges.emplace_back(e.addr, e.length);
          last->bytes += e.length;
        });
    if (!s.ok()) prebuilt_ok = false;
    for (auto& [id, pb] : prebuilt) {
      if (!prebuilt_ok) return;
      pb.count = pb.ranges.size();
      if (pb.count == 0) continue;
      absl::StatusOr<std::unique_ptr<RegionAllocator>> a =
          RegionAllocator::Create(pb.options);
      if (!a.ok() || !(*a)->ReserveAll(std::move(pb.ranges)).ok()) {
        prebuilt_ok = false;
        return;
      }
      pb.allocator = std::move(a).value();
    }
  };
  absl::StatusOr<uint64_t> seq =
      ReadIndexSnapshot(options_.snapshot_path, &index_, build);
  const absl::Time t_read = absl::Now();
  if (!seq.ok()) {
    if (!absl::IsNotFound(seq.status())) {
      LOG(WARNING) << "index snapshot not used: " << seq.status();
    }
    return false;
  }
  const size_t snapshot_entries = index_.size();
  // The changes since the snapshot, applied as the running master applied
  // them: puts (new or replacing, linked to their parent if present),
  // deletes (their descendants become orphans, removed below), later uses.
  const bool track = options_.recency_batch > 0;
  index_.TrackUsed(false);
  std::vector<std::pair<std::string, std::string>> linked;  // key, parent
  std::vector<std::pair<uint64_t, std::string>> uses;       // ms, key
  absl::Status bad;
  uint64_t changes = 0;
  absl::Status s = store_->ForEachObjectChangeSince(
      *seq, [&](const MetadataStore::ObjectChange& c)
                ABSL_NO_THREAD_SAFETY_ANALYSIS {
        ++changes;
        if (!bad.ok()) return;
        switch (c.kind) {
          case MetadataStore::ObjectChange::Kind::kPut: {
            const ObjectRecord& r = *c.record;
            auto up = index_.Upsert(c.key, r, r.parent_key);
            if (!up.ok()) {
              bad = up.status();
              return;
            }
            if (!r.parent_key.empty()) {
              linked.emplace_back(std::string(c.key), r.parent_key);
            }
            break;
          }
          case MetadataStore::ObjectChange::Kind::kDelete:
            index_.Erase(c.key);
            break;
          case MetadataStore::ObjectChange::Kind::kUse:
            uses.emplace_back(c.use_ms, std::string(c.key));
            break;
        }
      });
  if (s.ok()) s = bad;
  if (!s.ok()) {
    LOG(WARNING) << "index snapshot at sequence " << *seq
                 << " not used (scanning the store instead): " << s;
    ResetObjectsLocked();
    index_.TrackUsed(track);
    return false;
  }
  // A block committed before the block before it (racing puts of one
  // chain) is linked once both are in.
  for (const auto& [key, parent] : linked) {
    auto chain = index_.Chain(key);
    if (chain && chain->parent.empty() && index_.Find(parent)) {
      index_.Adopt(key, parent);
    }
  }
  std::stable_sort(uses.begin(), uses.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, key] : uses) index_.Touch(key, 0);
  index_.TrackUsed(track);
  const absl::Time t_replayed = absl::Now();

  // Per region: its objects' ranges, count and bytes, in one pass over the
  // index (entries come grouped by node, so the last region is cached).
  struct RegionLoad {
    Node* node = nullptr;
    Region* region = nullptr;  // nullptr: unknown node or region
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t bytes = 0;
  };
  absl::flat_hash_map<uint64_t, RegionLoad> regions;
  std::vector<std::string> gone;
  auto collect = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    regions.clear();
    gone.clear();
    uint64_t last_id = ~uint64_t{0};
    RegionLoad* last = nullptr;
    index_.ForEach([&](absl::string_view key, const ObjectLocation& e)
                       ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const uint64_t id = (uint64_t{e.node_id} << 32) | e.region_id;
      if (id != last_id) {
        auto [it, fresh] = regions.try_emplace(id);
        if (fresh) {
          auto n = nodes_.find(e.node_id);
          if (n != nodes_.end()) {
            auto r = n->second.regions.find(e.region_id);
            if (r != n->second.regions.end()) {
              it->second.node = &n->second;
              it->second.region = &r->second;
            }
          }
        }
        last_id = id;
        last = &it->second;
      }
      if (last->region == nullptr || e.length == 0) {
        gone.emplace_back(key);
        return;
      }
      last->ranges.emplace_back(e.addr, e.length);
      last->bytes += e.length;
    });
  };
  // Blocks whose chain lost a block go (a crash between a removal and the
  // removal of its orphans leaves them in the store).
  std::vector<std::string> dropped;
  const std::vector<std::pair<std::string, ObjectLocation>> orphans =
      index_.Orphans();
  if (prebuilt_ok && changes == 0 && orphans.empty()) {
    size_t count = 0;
    for (const auto& [id, pb] : prebuilt) count += pb.count;
    prebuilt_ok = count == index_.size();
  } else {
    prebuilt_ok = false;
  }
  if (prebuilt_ok) {
    // The index is the snapshot: its allocators are ready.
    for (auto& [id, pb] : prebuilt) {
      if (pb.count == 0) continue;
      Node& node = nodes_.at(static_cast<uint32_t>(id >> 32));
      Region& region = node.regions.at(static_cast<uint32_t>(id));
      region.allocator = std::move(pb.allocator);
      node.object_count += pb.count;
      region.object_count += pb.count;
      object_bytes_ += pb.bytes;
    }
    LOG(INFO) << "index snapshot at sequence " << *seq << ": "
              << snapshot_entries << " objects, no change since; read and "
              << "allocators built in " << (t_read - t_start) << ", "
              << (absl::Now() - t_start) << " in all";
    return true;
  }
  for (const auto& [key, e] : orphans) {
    index_.Erase(key);
    dropped.push_back(key);
  }
  collect();
  const absl::Time t_collected = absl::Now();
  if (!gone.empty()) {
    // Rare (a node record lost): they go with their descendants, and the
    // pass again without them.
    for (const std::string& key : gone) index_.Erase(key);
    dropped.insert(dropped.end(), gone.begin(), gone.end());
    for (const auto& [key, e] : index_.Orphans()) {
      index_.Erase(key);
      dropped.push_back(key);
    }
    collect();
  }
  gone = std::move(dropped);
  for (auto& [id, load] : regions) {
    if (load.region == nullptr) continue;
    const size_t n = load.ranges.size();
    absl::Status rs = load.region->allocator->ReserveAll(std::move(load.ranges));
    if (!rs.ok()) {
      LOG(WARNING) << "index snapshot at sequence " << *seq
                   << " not used (scanning the store instead): " << rs;
      ResetObjectsLocked();
      return false;
    }
    load.node->object_count += n;
    load.region->object_count += n;
    object_bytes_ += load.bytes;
  }
  for (std::string& key : gone) {
    if (doomed->size() < kMaxDropWarnings) {
      LOG(WARNING) << "dropping persisted object '" << PrintableKey(key)
                   << "': its node or region is unknown, or its chain lost "
                      "a block";
    }
    doomed->push_back(std::move(key));
  }
  LOG(INFO) << "index snapshot at sequence " << *seq << ": " << snapshot_entries
            << " objects, then " << changes << " changes replayed; read in "
            << (t_read - t_start) << ", changes in " << (t_replayed - t_read)
            << ", ranges in " << (t_collected - t_replayed)
            << ", allocators in " << (absl::Now() - t_collected);
  return true;
}

absl::StatusOr<bool> MasterService::LoadObjectsLocked(
    bool careful, std::vector<std::string>* doomed) {
  // Careless: each region's ranges, reserved after the scan.
  absl::flat_hash_map<RegionAllocator*,
                      std::vector<std::pair<uint64_t, uint64_t>>>
      ranges;
  absl::Status s = store_->ForEachObject([&](absl::string_view key,
                                             const ObjectRecord& r)
                                             ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::string why;
    auto n = nodes_.find(r.node_id);
    if (n == nodes_.end()) {
      why = absl::StrCat("node ", r.node_id, " is unknown");
    } else if (auto reg = n->second.regions.find(r.region_id);
               reg == n->second.regions.end()) {
      why = absl::StrCat("node ", r.node_id, " has no region ", r.region_id);
    } else if (key.empty() || key.size() > MetadataIndex::kMaxKeyBytes ||
               r.length == 0 || r.length > MetadataIndex::kMaxLength) {
      why = "key or length out of range";
    } else if (absl::Status rs =
                   careful ? reg->second.allocator->Reserve(r.addr, r.length)
                           : absl::OkStatus();
               !rs.ok()) {
      why = std::string(rs.message());
    } else {
      absl::Status up = index_.LoadEntry(key, r, r.parent_key, r.last_use_ms);
      if (up.ok()) {
        CountObject(r, +1);
        if (!careful) {
          ranges[reg->second.allocator.get()].emplace_back(r.addr, r.length);
        }
        return;
      }
      if (careful) reg->second.allocator->Free(r.addr).IgnoreError();
      why = std::string(up.message());
    }
    if (doomed->size() < kMaxDropWarnings) {
      LOG(WARNING) << "dropping persisted object '" << PrintableKey(key)
                   << "': " << why;
    }
    doomed->emplace_back(key);
  });
  if (!s.ok()) return s;
  for (auto& [allocator, region_ranges] : ranges) {
    if (!allocator->ReserveAll(std::move(region_ranges)).ok()) return false;
  }
  return true;
}

absl::Status MasterService::ValidateKeys(
    const google::protobuf::RepeatedPtrField<std::string>& keys) const {
  if (keys.empty() || static_cast<uint32_t>(keys.size()) > options_.max_batch_keys) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys in one call (want 1..",
                     options_.max_batch_keys, ")"));
  }
  for (int i = 0; i < keys.size(); ++i) {
    if (keys[i].empty() || keys[i].size() > options_.max_key_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", i, " has ", keys[i].size(), " bytes (want 1..",
                       options_.max_key_bytes, ")"));
    }
  }
  return absl::OkStatus();
}

bool MasterService::MayComeBack(const Node& node, absl::Time now) const {
  return !node.deregistered && now - node.last_seen <= options_.node_timeout;
}

bool MasterService::IsAlive(const Node& node, absl::Time now) const {
  return node.registered && !node.needs_reconcile && !node.deregistered &&
         now - node.last_seen <= options_.node_timeout;
}

bool MasterService::IsPlaceable(const Node& node, absl::Time now) const {
  return IsAlive(node, now) && !node.info.draining();
}

bool MasterService::ProofValid(const Node& node, std::string_view purpose,
                               uint32_t node_id, uint64_t incarnation,
                               const v1::NodeAuth& auth,
                               absl::Time now) const {
  if (!node.mac || auth.proof().size() != kNodeProofBytes) return false;
  const int64_t skew = auth.unix_ms() - absl::ToUnixMillis(now);
  const int64_t window = absl::ToInt64Milliseconds(options_.node_auth_window);
  if (skew > window || skew < -window) return false;
  const std::string want = NodeProof(*node.mac, purpose, node.info.name(),
                                     node_id, incarnation, auth.unix_ms());
  return TagsEqual(reinterpret_cast<const uint8_t*>(want.data()),
                   reinterpret_cast<const uint8_t*>(auth.proof().data()),
                   kNodeProofBytes);
}

void MasterService::Grant(const Node& node, const v1::Location& loc,
                          uint8_t rights, absl::Time expiry,
                          v1::Capability* out) const {
  CapabilityScope scope;
  scope.node_id = loc.node_id();
  scope.region_id = loc.region_id();
  scope.addr = loc.addr();
  scope.length = loc.length();
  scope.generation = loc.generation();
  scope.rights = rights;
  scope.expires_unix_ms = absl::ToUnixMillis(expiry);
  wire::Capability cap;
  if (!Sign(node, scope, &cap)) return;
  out->set_expires_unix_ms(cap.expires_unix_ms);
  out->set_rights(rights);
  out->set_tag_lo(absl::little_endian::Load64(cap.tag));
  out->set_tag_hi(absl::little_endian::Load64(cap.tag + 8));
}

bool MasterService::Sign(const Node& node, CapabilityScope scope,
                         wire::Capability* out) const {
  if (!node.mac) return false;  // never for a registered node
  if (skip_capabilities_for_test_.load(std::memory_order_relaxed)) {
    return false;
  }
  scope.incarnation = node.info.incarnation();
  *out = SignCapability(*node.mac, scope);
  return true;
}

absl::StatusOr<std::string> MasterService::NodeName(uint32_t node_id) const {
  ReaderMutexLock l(&mu_);
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is unknown"));
  }
  return n->second.info.name();
}

absl::Status MasterService::CheckNodeAuth(uint32_t node_id,
                                          uint64_t incarnation,
                                          std::string_view purpose,
                                          const v1::NodeAuth& auth) const {
  ReaderMutexLock l(&mu_);
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is unknown"));
  }
  if (!ProofValid(n->second, purpose, node_id, incarnation, auth,
                  clock_->Now())) {
    return absl::PermissionDeniedError(absl::StrCat(
        std::string(purpose), " of node ", node_id, ": no valid proof of its node key"));
  }
  return absl::OkStatus();
}

void MasterService::FillNodeInfo(const Node& node, absl::Time now,
                                 v1::NodeInfo* out) const {
  *out = node.info;
  out->clear_node_key();
  out->clear_regions();
  uint64_t used = 0;
  uint64_t capacity = 0;
  for (const auto& [id, region] : node.regions) {
    v1::RegionInfo* r = out->add_regions();
    *r = region.info;
    r->set_used_bytes(region.allocator->used_bytes());
    used += region.allocator->used_bytes();
    capacity += region.info.capacity_bytes();
  }
  out->set_alive(IsAlive(node, now));
  out->set_awaiting_reconcile(node.registered && node.needs_reconcile &&
                              !node.deregistered);
  out->set_last_heartbeat_unix_ms(absl::ToUnixMillis(node.last_seen));
  out->set_object_count(node.object_count);
  out->set_used_bytes(used);
  out->set_capacity_bytes(capacity);
}

void MasterService::FillPeerInfo(const Node& node, v1::NodeInfo* out) const {
  out->set_node_id(node.info.node_id());
  out->set_name(node.info.name());
  out->set_incarnation(node.info.incarnation());
  out->set_data_address(node.info.data_address());
  *out->mutable_transport_params() = node.info.transport_params();
  out->set_alive(true);
}

uint32_t MasterService::LeaseTick(absl::Time now) {
  int64_t ms = absl::ToInt64Milliseconds(now - lease_epoch_) + 1;
  if (ms < 1) ms = 1;  // the clock went back past the epoch
  if (ms >= kMaxLeaseTick) {
    // Move the epoch so that `now` becomes tick lease + 2: ticks still
    // within the lease keep their distance to now (and stay > 0), older
    // ones drop to 0 or stay expired.
    const int64_t lease_ms = absl::ToInt64Milliseconds(options_.read_lease);
    const int64_t shift = ms - (lease_ms + 2);
    index_.RebaseReadTicks(static_cast<uint32_t>(
        std::min<int64_t>(shift, std::numeric_limits<uint32_t>::max())));
    lease_epoch_ += absl::Milliseconds(shift);
    ms -= shift;
    VLOG(1) << "read ticks rebased by " << shift << " ms";
  }
  return static_cast<uint32_t>(ms);
}

bool MasterService::IsLeased(uint32_t read_tick, uint32_t now_tick) const {
  if (read_tick == 0) return false;  // never read since written
  const int64_t age = int64_t{now_tick} - int64_t{read_tick};
  // |age|: a read "in the future" means the clock went back; treat it like
  // a read that far in the past instead of leasing it until the clock
  // catches up.
  return std::abs(age) < absl::ToInt64Milliseconds(options_.read_lease);
}

void MasterService::CountObject(const ObjectLocation& e, int delta) {
  auto n = nodes_.find(e.node_id);
  if (n == nodes_.end()) return;
  n->second.object_count += delta;
  auto r = n->second.regions.find(e.region_id);
  if (r != n->second.regions.end()) r->second.object_count += delta;
  if (delta > 0) {
    object_bytes_ += e.length;
  } else {
    object_bytes_ -= e.length;
  }
}

void MasterService::FreeSpace(uint32_t node_id, uint32_t region_id,
                              uint64_t addr) {
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) {
    LOG(DFATAL) << "free on unknown node " << node_id;
    return;
  }
  auto r = n->second.regions.find(region_id);
  if (r == n->second.regions.end()) {
    LOG(DFATAL) << "free on unknown region " << node_id << "/" << region_id;
    return;
  }
  absl::Status s = r->second.allocator->Free(addr);
  if (!s.ok()) {
    LOG(DFATAL) << "free of " << node_id << "/" << region_id << "@" << addr
                << ": " << s;
  }
}

void MasterService::ReleasePut(uint64_t put_id, bool free_space) {
  auto it = pending_.find(put_id);
  if (it == pending_.end()) return;
  PendingPut put = std::move(it->second);
  pending_.erase(it);
  CountCallerPending(put, -1);
  for (const PendingSlot& slot : put.slots) {
    if (free_space) FreeSpace(put.node_id, slot.region_id, slot.addr);
    pending_keys_.erase(slot.key);
    SettleWaitingChildrenLocked(slot.key, /*committed=*/false);
  }
  UnpinParent(put);
}

void MasterService::SettleWaitingChildrenLocked(const std::string& key,
                                                bool committed) {
  auto w = waiting_children_.find(key);
  if (w == waiting_children_.end()) return;
  std::vector<std::string> children = std::move(w->second);
  waiting_children_.erase(w);
  if (committed) {
    // A child on another node stays unlinked: a chain continued there.
    for (const std::string& child : children) index_.Adopt(child, key);
    return;
  }
  MetadataMutation m;
  for (std::string& child : children) {
    if (index_.Find(child)) m.delete_objects.push_back(std::move(child));
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) {
    LOG(WARNING) << "cannot remove " << m.delete_objects.size()
                 << " blocks whose parent was never committed: " << s;
    return;
  }
  for (const std::string& child : m.delete_objects) {
    auto e = index_.Erase(child);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  counters_.orphans_removed += m.delete_objects.size();
  SweepOrphansLocked();  // blocks linked below them
}

void MasterService::UnpinParent(const PendingPut& put) {
  if (put.parent_key.empty()) return;
  auto pin = pending_parents_.find(put.parent_key);
  if (pin != pending_parents_.end() && --pin->second == 0) {
    pending_parents_.erase(pin);
  }
}

std::vector<std::pair<std::string, ObjectLocation>>
MasterService::SweepOrphansLocked() {
  if (index_.ghost_count() == 0) return {};
  auto orphans = index_.Orphans();
  if (orphans.empty()) return {};
  MetadataMutation m;
  m.delete_objects.reserve(orphans.size());
  for (const auto& [key, e] : orphans) m.delete_objects.push_back(key);
  absl::Status s = store_->Apply(m);
  if (!s.ok()) {
    LOG(WARNING) << "cannot remove " << orphans.size()
                 << " objects whose chain lost a block (retried later): " << s;
    return {};
  }
  for (const auto& [key, entry] : orphans) {
    auto e = index_.Erase(key);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  counters_.orphans_removed += orphans.size();
  VLOG(1) << "removed " << orphans.size()
          << " objects whose chain lost a block before them";
  return orphans;
}

size_t MasterService::PersistRecencyLocked(size_t max) {
  if (max == 0) return 0;
  auto used = index_.CollectUsed(max);
  if (used.empty()) return 0;
  MetadataMutation m;
  m.object_uses.reserve(used.size());
  for (auto& [key, tick] : used) {
    // Tick t was read at lease_epoch_ + (t - 1) ms; a tick rebased to 0 is
    // older than the epoch.
    const absl::Time at =
        lease_epoch_ + absl::Milliseconds(tick > 0 ? int64_t{tick} - 1 : 0);
    m.object_uses.emplace_back(std::move(key),
                               static_cast<uint64_t>(absl::ToUnixMillis(at)));
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) {
    ++counters_.recency_write_failures;
    LOG(WARNING) << "cannot persist the last reads of " << used.size()
                 << " objects (a restart orders them by older uses): " << s;
    return 0;
  }
  counters_.recency_writes += used.size();
  return used.size();
}

void MasterService::CancelPutsOfNode(uint32_t node_id, bool free_space) {
  std::vector<uint64_t> doomed;
  for (const auto& [id, put] : pending_) {
    if (put.node_id == node_id) doomed.push_back(id);
  }
  for (uint64_t id : doomed) ReleasePut(id, free_space);
  counters_.puts_cancelled += doomed.size();
}

bool MasterService::CallerMayPut(absl::string_view caller, const Node& node,
                                 uint64_t slots, uint64_t bytes,
                                 std::string* why) const {
  uint64_t capacity = 0;
  for (const auto& [rid, region] : node.regions) {
    capacity += region.info.capacity_bytes();
  }
  const uint64_t byte_limit = static_cast<uint64_t>(
      static_cast<double>(capacity) * options_.max_pending_share_per_caller);
  uint64_t pending_slots = 0;
  uint64_t pending_bytes = 0;
  auto it = pending_by_caller_.find(caller);
  if (it != pending_by_caller_.end()) {
    pending_slots = it->second.slots;
    auto b = it->second.bytes_by_node.find(node.info.node_id());
    if (b != it->second.bytes_by_node.end()) pending_bytes = b->second;
  }
  const std::string who =
      caller.empty() ? std::string("this caller")
                     : absl::StrCat("caller ", absl::CHexEscape(caller));
  if (pending_slots + slots > options_.max_pending_slots_per_caller) {
    *why = absl::StrCat(
        who, " has ", pending_slots, " objects in pending puts (limit ",
        options_.max_pending_slots_per_caller,
        "); commit or abort them before starting more");
    return false;
  }
  if (options_.max_pending_share_per_caller < 1 &&
      pending_bytes + bytes > byte_limit) {
    *why = absl::StrCat(
        who, " has ", pending_bytes, " bytes in pending puts on node ",
        node.info.node_id(), "; ", bytes, " more would exceed its limit of ",
        byte_limit, " bytes (", options_.max_pending_share_per_caller * 100,
        "% of the node's capacity); commit or abort them before starting "
        "more");
    return false;
  }
  return true;
}

void MasterService::CountCallerPending(const PendingPut& put, int delta) {
  CallerPending& c = pending_by_caller_[put.caller];
  TenantPending& t = pending_by_tenant_[put.tenant];
  const uint64_t slots = put.slots.size();
  if (delta > 0) {
    c.slots += slots;
    c.bytes_by_node[put.node_id] += put.bytes;
    t.objects += slots;
    t.bytes += put.bytes;
    return;
  }
  t.objects -= std::min(t.objects, slots);
  t.bytes -= std::min(t.bytes, put.bytes);
  if (t.objects == 0 && t.bytes == 0) pending_by_tenant_.erase(put.tenant);
  c.slots -= std::min(c.slots, slots);
  auto b = c.bytes_by_node.find(put.node_id);
  if (b != c.bytes_by_node.end()) {
    b->second -= std::min(b->second, put.bytes);
    if (b->second == 0) c.bytes_by_node.erase(b);
  }
  if (c.slots == 0 && c.bytes_by_node.empty()) {
    pending_by_caller_.erase(put.caller);
  }
}

absl::StatusOr<uint64_t> MasterService::ForgetNodeLocked(uint32_t node_id) {
  Node& node = nodes_.at(node_id);
  std::vector<std::string> doomed;
  index_.ForEach([&](absl::string_view key, const ObjectLocation& e) {
    if (e.node_id == node_id) doomed.emplace_back(key);
  });
  MetadataMutation m;
  m.delete_objects = doomed;
  m.delete_nodes.push_back(node.info.name());
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;
  for (const std::string& key : doomed) {
    auto e = index_.Erase(key);
    if (e) CountObject(*e, -1);
  }
  // Its allocators go with it.
  CancelPutsOfNode(node_id, /*free_space=*/false);
  SweepOrphansLocked();
  LOG(INFO) << "forgot node " << node_id << " '" << node.info.name()
            << "' and its " << doomed.size() << " objects";
  node_by_name_.erase(node.info.name());
  nodes_.erase(node_id);
  ++counters_.nodes_forgotten;
  return doomed.size();
}

absl::StatusOr<uint32_t> MasterService::NodeIdByNameLocked(
    absl::string_view name) const {
  auto known = node_by_name_.find(name);
  if (known == node_by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no node named '", absl::CHexEscape(name), "'"));
  }
  return known->second;
}

absl::StatusOr<v1::ForgetNodeResponse> MasterService::ForgetNode(
    const v1::ForgetNodeRequest& request) {
  MutexLock l(&mu_);
  absl::StatusOr<uint32_t> known = NodeIdByNameLocked(request.name());
  if (!known.ok()) return known.status();
  const uint32_t id = *known;
  if (MayComeBack(nodes_.at(id), clock_->Now())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, " '", absl::CHexEscape(request.name()),
        "' was seen within the node timeout (",
        absl::FormatDuration(options_.node_timeout),
        "); stop it (or let it deregister) before forgetting it"));
  }
  auto removed = ForgetNodeLocked(id);
  if (!removed.ok()) return removed.status();
  v1::ForgetNodeResponse response;
  response.set_node_id(id);
  response.set_objects_removed(*removed);
  return response;
}

absl::StatusOr<v1::SetNodeDrainingResponse> MasterService::SetNodeDraining(
    const v1::SetNodeDrainingRequest& request) {
  MutexLock l(&mu_);
  absl::StatusOr<uint32_t> known = NodeIdByNameLocked(request.name());
  if (!known.ok()) return known.status();
  Node& node = nodes_.at(*known);
  v1::SetNodeDrainingResponse response;
  response.set_node_id(*known);
  response.set_object_count(node.object_count);
  if (node.info.draining() == request.draining()) return response;
  v1::NodeInfo changed = node.info;
  changed.set_draining(request.draining());
  absl::Status s = store_->PutNode(changed);
  if (!s.ok()) return s;
  node.info.set_draining(request.draining());
  response.set_changed(true);
  LOG(INFO) << "node " << *known << " '" << node.info.name() << "' "
            << (request.draining() ? "draining: no new placements"
                                   : "undrained: placements resume")
            << " (" << node.object_count << " objects)";
  return response;
}

absl::StatusOr<v1::InspectKeyResponse> MasterService::InspectKey(
    const v1::InspectKeyRequest& request) const {
  if (request.key().empty() || request.key().size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key of ", request.key().size(), " bytes (want 1..",
                     options_.max_key_bytes, ")"));
  }
  v1::InspectKeyResponse response;
  response.set_tenant(std::string(TenantOfKey(request.key())));
  ReaderMutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  response.set_put_in_progress(pending_keys_.contains(request.key()));
  auto e = index_.Find(request.key());
  if (!e) return response;
  response.set_found(true);
  v1::Location* loc = response.mutable_location();
  ToProto(*e, loc);
  auto n = nodes_.find(e->node_id);
  if (n != nodes_.end()) FillNodeInfo(n->second, now, response.mutable_node());
  const std::optional<uint32_t> tick = index_.ReadTick(request.key());
  if (tick && *tick > 0) {
    // As in PersistRecencyLocked: tick t was read at lease_epoch_ + t - 1 ms.
    const absl::Time read = lease_epoch_ + absl::Milliseconds(int64_t{*tick} - 1);
    response.set_last_read_unix_ms(absl::ToUnixMillis(read));
    if (read + options_.read_lease > now) {
      response.set_lease_expires_unix_ms(
          absl::ToUnixMillis(read + options_.read_lease));
    }
  }
  if (auto chain = index_.Chain(request.key())) {
    response.set_parent_key(chain->parent);
    response.set_parent_on_other_node(chain->cross);
    response.set_children(chain->children);
    response.set_cross_children(chain->cross_children);
    response.set_unreachable(chain->orphan);
  }
  return response;
}

absl::StatusOr<MasterService::Rebuild> MasterService::PlanRebuild(
    uint32_t node_id,
    const google::protobuf::RepeatedPtrField<v1::RegionInfo>& regions,
    const std::vector<uint32_t>& purge_regions, bool scan_index) const {
  Rebuild plan;
  for (const auto& r : regions) {
    auto alloc = RegionAllocator::Create({r.capacity_bytes(), r.alignment()});
    if (!alloc.ok()) return alloc.status();
    Region& region = plan.regions[r.region_id()];
    region.info = DurableRegion(r);
    region.allocator = std::move(alloc).value();
  }
  if (!scan_index) return plan;
  index_.ForEach([&](absl::string_view key, const ObjectLocation& e) {
    if (e.node_id != node_id) return;
    if (std::find(purge_regions.begin(), purge_regions.end(), e.region_id) !=
        purge_regions.end()) {
      plan.doomed.emplace_back(key);
      ++plan.purged;
      return;
    }
    auto r = plan.regions.find(e.region_id);
    if (r == plan.regions.end() ||
        !r->second.allocator->Reserve(e.addr, e.length).ok()) {
      plan.doomed.emplace_back(key);
      return;
    }
    ++r->second.object_count;
    ++plan.kept;
  });
  return plan;
}

absl::StatusOr<v1::RegisterNodeResponse> MasterService::RegisterNode(
    const v1::RegisterNodeRequest& request) {
  if (request.name().empty() || request.name().size() > kMaxNodeNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node name of ", request.name().size(),
                     " bytes (want 1..", kMaxNodeNameBytes, ")"));
  }
  absl::Status s = ValidateAddress(request.data_address(), "data_address");
  if (!s.ok()) return s;
  s = ValidateAddress(request.control_address(), "control_address");
  if (!s.ok()) return s;
  if (request.incarnation() == 0) {
    return absl::InvalidArgumentError("incarnation must be nonzero");
  }
  if (request.registration_nonce().size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "registration_nonce of ", request.registration_nonce().size(),
        " bytes (want at most 64)"));
  }
  s = ValidateTransportParams(request.transport_params());
  if (!s.ok()) return s;
  if (request.regions().empty() || request.regions_size() > kMaxRegions) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.regions_size(), " regions (want 1..", kMaxRegions,
                     ")"));
  }
  absl::flat_hash_set<uint32_t> region_ids;
  for (const auto& r : request.regions()) {
    if (!region_ids.insert(r.region_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("region id ", r.region_id(), " appears twice"));
    }
    const uint32_t a = r.alignment();
    if (a == 0 || (a & (a - 1)) != 0 || a > kMaxAlignment) {
      return absl::InvalidArgumentError(
          absl::StrCat("region ", r.region_id(), ": alignment ", a,
                       " is not a power of two <= 1 GiB"));
    }
    if (r.capacity_bytes() == 0 || r.capacity_bytes() < a) {
      return absl::InvalidArgumentError(
          absl::StrCat("region ", r.region_id(), ": capacity ",
                       r.capacity_bytes(), " must be > 0 and >= alignment ",
                       a));
    }
  }

  v1::NodeInfo info;
  info.set_name(request.name());
  info.set_incarnation(request.incarnation());
  info.set_data_address(request.data_address());
  info.set_control_address(request.control_address());
  for (const auto& r : request.regions()) *info.add_regions() = DurableRegion(r);
  *info.mutable_transport_params() = request.transport_params();
  // Persisted: false once the node deregisters (see DeregisterNode).
  info.set_alive(true);

  v1::RegisterNodeResponse response;
  response.set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  response.set_generation_ceiling(store_->GenerationCeiling());
  response.set_reconcile_interval_ms(static_cast<uint32_t>(std::min<int64_t>(
      absl::ToInt64Milliseconds(options_.reconcile_interval),
      std::numeric_limits<uint32_t>::max())));

  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  auto known = node_by_name_.find(request.name());
  if (known == node_by_name_.end()) {
    if (next_node_id_ == 0) {
      return absl::ResourceExhaustedError("node ids exhausted");
    }
    if (nodes_.size() >= options_.max_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the master keeps at most ", options_.max_nodes,
          " node records; remove dead ones with `hymctl node forget NAME`"));
    }
    const uint32_t id = next_node_id_;
    info.set_node_id(id);
    auto plan = PlanRebuild(id, info.regions(), {}, /*scan_index=*/false);
    if (!plan.ok()) return plan.status();
    auto key = NewNodeKey();
    if (!key.ok()) return key.status();
    info.set_node_key(*key);
    s = store_->PutNode(info);
    if (!s.ok()) return s;
    ++next_node_id_;
    Node& node = nodes_[id];
    node.mac.emplace(*key);
    node.key_confirmed = false;
    node.registration_nonce = request.registration_nonce();
    response.set_node_key(*key);
    node.info = std::move(info);
    node.last_seen = now;
    node.registered = true;
    node.regions = std::move(plan->regions);
    node_by_name_[request.name()] = id;
    response.set_node_id(id);
    LOG(INFO) << "registered node " << id << " '" << request.name()
              << "' incarnation " << request.incarnation() << " at "
              << request.data_address();
    return response;
  }

  const uint32_t id = known->second;
  Node& node = nodes_.at(id);
  info.set_node_id(id);
  // An operator's drain outlives the node's restarts (hymctl undrain ends
  // it).
  info.set_draining(node.info.draining());
  // Only the holder of the name's key keeps or takes over its identity.
  const bool proven = ProofValid(node, "register", 0, request.incarnation(),
                                 request.auth(), now);
  bool takeover = false;
  // The same registration again: its answer (the key) never reached the
  // node. Answer it the same way; nothing the node held is lost.
  const bool repeat =
      !proven && node.mac && !node.key_confirmed && node.registered &&
      !node.deregistered && node.info.incarnation() == request.incarnation() &&
      !request.registration_nonce().empty() &&
      request.registration_nonce() == node.registration_nonce;
  if (repeat) {
    LOG(INFO) << "node " << id << " '" << request.name()
              << "' registers again before proving its key: answering as "
                 "before (its last answer was lost)";
  }
  if (!proven && !repeat && node.mac) {
    if (MayComeBack(node, now)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "node '", request.name(), "' is registered and alive: registering "
          "it again needs a proof of its node key (or wait until it has "
          "missed heartbeats for ",
          absl::FormatDuration(options_.node_timeout), ")"));
    }
    takeover = true;  // a new node under the old name: nothing it held
  }
  std::string key = node.info.node_key();
  if (takeover || key.empty()) {  // key.empty(): trusted on first use
    auto k = NewNodeKey();
    if (!k.ok()) return k.status();
    key = *std::move(k);
  }
  info.set_node_key(key);
  response.set_node_key(key);
  const bool new_incarnation =
      takeover || node.info.incarnation() != request.incarnation();
  const bool new_layout = !SameLayout(node.info.regions(), request.regions());
  if (!new_incarnation && !new_layout) {
    // Same memory, same layout: a node coming back after a timeout or a
    // master restart. Keep everything, refresh addresses.
    s = store_->PutNode(info);
    if (!s.ok()) return s;
    node.info = std::move(info);
    node.mac.emplace(key);
    node.key_confirmed = proven;
    node.registration_nonce = request.registration_nonce();
    for (const auto& r : node.info.regions()) {
      auto region = node.regions.find(r.region_id());
      if (region != node.regions.end()) region->second.info = r;
    }
    node.last_seen = now;
    node.deregistered = false;
    MarkRegistered(node, /*retained=*/true);
    response.set_node_id(id);
    response.set_objects_retained(true);
    response.set_reconcile(node.needs_reconcile);
    LOG(INFO) << "node " << id << " '" << request.name() << "' re-registered"
              << (node.needs_reconcile
                      ? absl::StrCat("; serving its ", node.object_count,
                                     " objects once it reconciles")
                      : "");
    return response;
  }

  std::vector<uint32_t> purge_regions;
  if (new_incarnation) {
    // A new incarnation means the node's memory started afresh (DRAM after a
    // restart, a re-formatted capacity file): nothing it held is there.
    for (const auto& [rid, region] : node.regions) purge_regions.push_back(rid);
  }
  auto plan = PlanRebuild(id, info.regions(), purge_regions);
  if (!plan.ok()) return plan.status();
  MetadataMutation m;
  m.delete_objects = plan->doomed;
  m.put_nodes.push_back(info);
  s = store_->Apply(m);
  if (!s.ok()) return s;

  // The old allocators are replaced: pending puts' space goes with them.
  CancelPutsOfNode(id, /*free_space=*/false);
  for (const std::string& key : plan->doomed) {
    auto e = index_.Erase(key);
    if (e) CountObject(*e, -1);
  }
  counters_.objects_purged += plan->purged;
  counters_.objects_dropped += plan->doomed.size() - plan->purged;
  if (plan->doomed.size() > plan->purged) {
    LOG(WARNING) << "node " << id << " '" << request.name() << "': dropped "
                 << plan->doomed.size() - plan->purged
                 << " objects that no longer fit its new regions";
  }
  node.info = std::move(info);
  node.mac.emplace(key);
  node.key_confirmed = proven;
  node.registration_nonce = request.registration_nonce();
  node.regions = std::move(plan->regions);
  node.object_count = plan->kept;
  node.last_seen = now;
  node.deregistered = false;
  MarkRegistered(node, /*retained=*/!new_incarnation);
  SweepOrphansLocked();  // chains that lost a dropped object
  response.set_node_id(id);
  response.set_objects_retained(!new_incarnation);
  response.set_reconcile(node.needs_reconcile);
  LOG(INFO) << "node " << id << " '" << request.name() << "' re-registered"
            << (takeover ? " by a new node (no proof of the old one's key)"
                : new_incarnation ? " with a new incarnation"
                                  : "")
            << (new_layout ? " with new regions" : "") << "; purged "
            << plan->purged << " objects, kept " << plan->kept;
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> MasterService::Heartbeat(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  MutexLock l(&mu_);
  auto n = nodes_.find(request.node_id());
  // A node this process has not seen register (a master restart) registers
  // again, so that it learns whether to reconcile.
  if (n == nodes_.end() || n->second.deregistered || !n->second.registered ||
      n->second.info.incarnation() != request.incarnation()) {
    response.set_reregister(true);
    return response;
  }
  const absl::Time now = clock_->Now();
  if (!ProofValid(n->second, "heartbeat", request.node_id(),
                  request.incarnation(), request.auth(), now)) {
    return absl::PermissionDeniedError(
        absl::StrCat("heartbeat of node ", request.node_id(),
                     ": no valid proof of its node key"));
  }
  n->second.last_seen = now;
  n->second.key_confirmed = true;
  if (n->second.reported_dead) {
    LOG(INFO) << "node " << request.node_id() << " '"
              << n->second.info.name() << "' heartbeats again: alive";
    n->second.reported_dead = false;
  }
  response.set_generation_ceiling(store_->GenerationCeiling());
  response.set_reconcile(n->second.needs_reconcile);
  return response;
}

absl::StatusOr<v1::DeregisterNodeResponse> MasterService::DeregisterNode(
    const v1::DeregisterNodeRequest& request) {
  MutexLock l(&mu_);
  auto n = nodes_.find(request.node_id());
  if (n == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(), " is unknown"));
  }
  Node& node = n->second;
  if (!ProofValid(node, "deregister", request.node_id(),
                  request.incarnation(), request.auth(), clock_->Now())) {
    return absl::PermissionDeniedError(
        absl::StrCat("deregistration of node ", request.node_id(),
                     ": no valid proof of its node key"));
  }
  if (node.info.incarnation() != request.incarnation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", request.node_id(), " has incarnation ",
                     node.info.incarnation(), ", not ", request.incarnation()));
  }
  // Objects in memory that dies with the node's process.
  std::vector<std::string> doomed;
  index_.ForEach([&](absl::string_view key, const ObjectLocation& e)
                     ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (e.node_id != node.info.node_id()) return;
    auto r = node.regions.find(e.region_id);
    if (r != node.regions.end() && !r->second.info.persistent()) {
      doomed.emplace_back(key);
    }
  });
  // One batch: the purge, and the node record marked not alive so that a
  // restarted master keeps it dead instead of placing puts on it.
  MetadataMutation m;
  m.delete_objects = doomed;
  v1::NodeInfo gone = node.info;
  gone.set_alive(false);
  m.put_nodes.push_back(std::move(gone));
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;
  for (const std::string& key : doomed) {
    auto e = index_.Erase(key);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  counters_.objects_purged += doomed.size();
  CancelPutsOfNode(node.info.node_id(), /*free_space=*/true);
  SweepOrphansLocked();  // chains that reached into the purged regions
  node.deregistered = true;
  LOG(INFO) << "node " << node.info.node_id() << " '" << node.info.name()
            << "' deregistered; purged " << doomed.size() << " objects";
  return v1::DeregisterNodeResponse();
}

bool MasterService::TryAllocateOnNode(
    Node& node, const std::vector<uint64_t>& lengths,
    std::vector<std::pair<uint32_t, uint64_t>>* out) {
  out->clear();
  for (uint64_t len : lengths) {
    // The region with the most free space that can hold the slot.
    Region* best = nullptr;
    uint32_t best_id = 0;
    for (auto& [rid, region] : node.regions) {
      if (!region.allocator->CanFit(len)) continue;
      if (best == nullptr ||
          region.allocator->free_bytes() > best->allocator->free_bytes()) {
        best = &region;
        best_id = rid;
      }
    }
    absl::StatusOr<uint64_t> addr =
        best ? best->allocator->Allocate(len)
             : absl::StatusOr<uint64_t>(absl::ResourceExhaustedError(""));
    if (!addr.ok()) {
      for (const auto& [rid, a] : *out) {
        node.regions.at(rid).allocator->Free(a).IgnoreError();
      }
      out->clear();
      return false;
    }
    out->emplace_back(best_id, *addr);
  }
  return true;
}

absl::StatusOr<bool> MasterService::EvictAndAllocate(
    Node& node, const std::vector<uint64_t>& lengths,
    const absl::flat_hash_set<absl::string_view>& keep, absl::Time now,
    std::vector<std::pair<uint32_t, uint64_t>>* out, std::string* why) {
  const uint32_t node_id = node.info.node_id();
  if (options_.max_evictions_per_put == 0) {
    *why = "eviction is disabled";
    return false;
  }
  // A lower bound of the bytes the put needs and what the node has free.
  // If the put cannot fit even the empty node, evicting is pointless.
  uint32_t min_alignment = std::numeric_limits<uint32_t>::max();
  uint64_t usable = 0;
  uint64_t free = 0;
  for (const auto& [rid, region] : node.regions) {
    min_alignment = std::min(min_alignment, region.allocator->alignment());
    usable += region.allocator->usable_capacity();
    free += region.allocator->free_bytes();
  }
  uint64_t need = 0;
  for (uint64_t len : lengths) {
    bool fits_a_region = false;
    for (const auto& [rid, region] : node.regions) {
      const RegionAllocator& a = *region.allocator;
      if (RoundUp(len, a.alignment()) <= a.usable_capacity()) {
        fits_a_region = true;
        break;
      }
    }
    if (!fits_a_region) {
      *why = absl::StrCat("an object of ", len, " bytes exceeds every region");
      return false;
    }
    need += RoundUp(len, min_alignment);
  }
  if (need > usable) {
    *why = absl::StrCat("the put needs ", need, " bytes, more than the node's ",
                        usable);
    return false;
  }

  // Rounds: the first takes the least recently used objects until their
  // bytes plus the free bytes cover `need` (if even all evictable objects
  // cannot, nothing is evicted). If fragmentation still defeats the
  // allocator, further rounds evict 1, 2, 4, ... more objects, so the
  // rounds (store writes) stay O(log cap) and at most about as many extra
  // objects go as were needed.
  const uint32_t now_tick = LeaseTick(now);
  uint32_t evicted = 0;
  size_t scanned = 0;     // objects the walks looked at, all rounds
  size_t round_size = 1;  // objects in the next round after the first
  while (true) {
    const bool first = evicted == 0;
    std::vector<std::pair<std::string, ObjectLocation>> victims;
    uint64_t reclaim = 0;
    const size_t budget = options_.max_evictions_per_put - evicted;
    const size_t scan_budget = options_.max_eviction_scan - scanned;
    MetadataIndex::WalkEnd end = MetadataIndex::WalkEnd::kEnough;
    if (budget > 0 && scan_budget > 0) {
      end = index_.PickEvictions(
          node_id, scan_budget,
          [&](absl::string_view key, const ObjectLocation& e, uint32_t read_tick)
              ABSL_NO_THREAD_SAFETY_ANALYSIS {
                ++scanned;
                if (keep.contains(key) || pending_parents_.contains(key)) {
                  return MetadataIndex::Verdict::kKeep;
                }
                if (IsLeased(read_tick, now_tick)) {
                  return MetadataIndex::Verdict::kStop;
                }
                if (node.regions.count(e.region_id) == 0) {
                  return MetadataIndex::Verdict::kKeep;  // not in an allocator
                }
                return MetadataIndex::Verdict::kEvict;
              },
          [&](absl::string_view key, const ObjectLocation& e)
              ABSL_NO_THREAD_SAFETY_ANALYSIS {
                victims.emplace_back(std::string(key), e);
                reclaim += RoundUp(
                    e.length,
                    node.regions.at(e.region_id).allocator->alignment());
                if (victims.size() >= budget) return false;
                if (first) return free + reclaim < need;
                return victims.size() < round_size;
              });
    }
    if (victims.empty() || (first && free + reclaim < need)) {
      switch (end) {
        case MetadataIndex::WalkEnd::kStopped:
          *why = "the least recently used objects are leased by reads";
          break;
        case MetadataIndex::WalkEnd::kScanLimit:
          *why = absl::StrCat(
              "the eviction walk looked at ", options_.max_eviction_scan,
              " objects (chain blocks with children, pinned or leased ones "
              "are passed over)");
          break;
        case MetadataIndex::WalkEnd::kEnough:
          *why = absl::StrCat("more than ", options_.max_evictions_per_put,
                              " evictions would be needed");
          break;
        case MetadataIndex::WalkEnd::kListEnd:
          *why = "not enough evictable objects";
          break;
      }
      if (evicted > 0) {
        absl::StrAppend(why, " (", evicted, " objects evicted, the rest ",
                        "fragmented)");
      }
      return false;
    }
    absl::Status s = EvictObjects(node_id, victims);
    if (!s.ok()) return s;
    evicted += victims.size();
    free += reclaim;
    if (TryAllocateOnNode(node, lengths, out)) return true;
    if (!first) round_size *= 2;
  }
}

absl::Status MasterService::MakeRoomInTenant(
    const std::string& tenant, const TenantLimit& quota, uint64_t new_objects,
    uint64_t new_bytes, const absl::flat_hash_set<absl::string_view>& keep,
    absl::Time now) {
  MetadataIndex::TenantUsage used = index_.UsageOf(tenant);
  auto p = pending_by_tenant_.find(tenant);
  const TenantPending pending =
      p == pending_by_tenant_.end() ? TenantPending{} : p->second;
  const uint64_t objects = used.objects + pending.objects + new_objects;
  const uint64_t bytes = used.bytes + pending.bytes + new_bytes;
  const uint64_t over_objects =
      quota.max_objects != 0 && objects > quota.max_objects
          ? objects - quota.max_objects
          : 0;
  const uint64_t over_bytes =
      quota.max_bytes != 0 && bytes > quota.max_bytes ? bytes - quota.max_bytes
                                                      : 0;
  if (over_objects == 0 && over_bytes == 0) return absl::OkStatus();
  auto refuse = [&](absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++counters_.puts_over_tenant_quota;
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant '", tenant, "' quota: ", used.objects, " objects / ",
        used.bytes, " bytes stored and ", pending.objects, " / ",
        pending.bytes, " in pending puts; ", new_objects, " / ", new_bytes,
        " more would exceed max_objects ", quota.max_objects, " / max_bytes ",
        quota.max_bytes, " (0: unlimited): ", why));
  };
  if ((quota.max_objects != 0 &&
       pending.objects + new_objects > quota.max_objects) ||
      (quota.max_bytes != 0 && pending.bytes + new_bytes > quota.max_bytes)) {
    return refuse("its pending puts and this one alone exceed it");
  }
  if (options_.max_evictions_per_put == 0) return refuse("eviction is disabled");

  // Plan: the tenant's least recently used objects, node by node, until
  // the excess is covered; evict only if it is.
  const uint32_t now_tick = LeaseTick(now);
  std::map<uint32_t, std::vector<std::pair<std::string, ObjectLocation>>> victims;
  uint64_t got_objects = 0;
  uint64_t got_bytes = 0;
  size_t chosen = 0;
  auto covered = [&] {
    return got_objects >= over_objects && got_bytes >= over_bytes;
  };
  for (const auto& entry : nodes_) {
    const uint32_t node_id = entry.first;
    const Node& node = entry.second;
    if (covered() || chosen >= options_.max_evictions_per_put) break;
    index_.PickEvictions(
        node_id, options_.max_eviction_scan,
        [&](absl::string_view key, const ObjectLocation& e, uint32_t read_tick)
            ABSL_NO_THREAD_SAFETY_ANALYSIS {
              if (TenantOfKey(key) != tenant || keep.contains(key) ||
                  pending_parents_.contains(key) ||
                  IsLeased(read_tick, now_tick) ||
                  node.regions.count(e.region_id) == 0) {
                return MetadataIndex::Verdict::kKeep;
              }
              return MetadataIndex::Verdict::kEvict;
            },
        [&](absl::string_view key, const ObjectLocation& e)
            ABSL_NO_THREAD_SAFETY_ANALYSIS {
              victims[node_id].emplace_back(std::string(key), e);
              ++got_objects;
              got_bytes += e.length;
              ++chosen;
              return !covered() && chosen < options_.max_evictions_per_put;
            });
  }
  if (!covered()) {
    return refuse(absl::StrCat(
        "evicting its own least recently used objects would free only ",
        got_objects, " objects / ", got_bytes,
        " bytes (chain blocks with children, leased, pinned or this put's "
        "own blocks stay; at most ",
        options_.max_evictions_per_put, " per put)"));
  }
  for (const auto& [node_id, list] : victims) {
    absl::Status evicted = EvictObjects(node_id, list);
    if (!evicted.ok()) return evicted;
    counters_.tenant_evicted_objects += list.size();
    quota_evictions_by_tenant_[tenant] += list.size();
  }
  LOG_EVERY_N(INFO, 100) << "master: evicted " << got_objects << " objects ("
                         << got_bytes << " bytes) of tenant '" << tenant
                         << "' to keep it within its quota";
  return absl::OkStatus();
}

absl::Status MasterService::EvictObjects(
    uint32_t node_id,
    const std::vector<std::pair<std::string, ObjectLocation>>& victims) {
  MetadataMutation m;
  m.delete_objects.reserve(victims.size());
  for (const auto& [key, e] : victims) m.delete_objects.push_back(key);
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;
  uint64_t bytes = 0;
  for (const auto& [key, entry] : victims) {
    auto e = index_.Erase(key);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
    bytes += e->length;
    VLOG(2) << "evicted '" << PrintableKey(key) << "' from node " << node_id
            << " (" << e->length << " bytes, generation " << e->generation
            << ")";
  }
  counters_.evicted_objects += victims.size();
  counters_.evicted_bytes += bytes;
  VLOG(1) << "evicted " << victims.size() << " objects (" << bytes
          << " bytes) from node " << node_id << " to make room";
  // One line per kEvictionLogPeriod at most, summing the batches since.
  constexpr absl::Duration kEvictionLogPeriod = absl::Seconds(10);
  EvictionLog& log = eviction_log_;
  ++log.batches;
  log.objects += victims.size();
  log.bytes += bytes;
  const absl::Time now = clock_->Now();
  if (now - log.last_line >= kEvictionLogPeriod) {
    LOG(INFO) << "evicted " << log.objects << " objects (" << log.bytes
              << " bytes) to make room, in " << log.batches
              << (log.batches == 1 ? " batch" : " batches")
              << (log.last_line == absl::InfinitePast()
                      ? std::string()
                      : absl::StrCat(" over the last ",
                                     absl::FormatDuration(absl::Trunc(
                                         now - log.last_line, absl::Seconds(1)))))
              << "; the last from node " << node_id;
    log = EvictionLog{};
    log.last_line = now;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PutStartResponse> MasterService::PutStart(
    const v1::PutStartRequest& request, absl::string_view caller,
    const TenantLimit& quota, bool* over_quota) {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  if (request.lengths_size() != request.keys_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.keys_size(), " keys but ",
                     request.lengths_size(), " lengths"));
  }
  for (int i = 0; i < request.lengths_size(); ++i) {
    uint64_t len = request.lengths(i);
    if (len == 0 || len > options_.max_object_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("length ", i, " is ", len, " (want 1..",
                       options_.max_object_bytes, ")"));
    }
  }
  if (request.parent_key().size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("parent_key has ", request.parent_key().size(),
                     " bytes (want 0..", options_.max_key_bytes, ")"));
  }
  {
    absl::flat_hash_set<absl::string_view> seen;
    for (int i = 0; i < request.keys_size(); ++i) {
      if (!seen.insert(request.keys(i)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("key ", i, " '", PrintableKey(request.keys(i)),
                         "' appears more than once"));
      }
    }
    if (seen.contains(request.parent_key())) {
      return absl::InvalidArgumentError(
          absl::StrCat("parent_key '", PrintableKey(request.parent_key()),
                       "' is one of the keys"));
    }
  }

  v1::PutStartResponse response;
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  uint32_t preferred = request.preferred_node_id();
  if (preferred != 0 && nodes_.count(preferred) == 0) {
    return absl::NotFoundError(
        absl::StrCat("preferred node ", preferred, " is unknown"));
  }
  // Keys this call must not evict: its parent and the keys it reports as
  // existing (the caller relies on their locations).
  absl::flat_hash_set<absl::string_view> keep;
  if (!request.parent_key().empty()) {
    keep.insert(request.parent_key());
    auto e = index_.Find(request.parent_key());
    if (!e && !pending_keys_.contains(request.parent_key())) {
      // No reader could reach blocks after a missing one (see Chains).
      return absl::FailedPreconditionError(
          absl::StrCat("parent_key '", PrintableKey(request.parent_key()),
                       "' is not stored: the blocks after it would be "
                       "unreachable"));
    }
    if (e && preferred == 0) {
      auto n = nodes_.find(e->node_id);
      if (n != nodes_.end() && IsPlaceable(n->second, now)) {
        preferred = e->node_id;
      }
    }
  }

  // Classify the keys.
  std::vector<int> to_allocate;
  std::vector<uint64_t> lengths;
  uint64_t total_bytes = 0;
  for (int i = 0; i < request.keys_size(); ++i) {
    v1::PutSlot* slot = response.add_slots();
    const std::string& key = request.keys(i);
    if (pending_keys_.contains(key)) {
      slot->set_state(v1::SLOT_IN_PROGRESS);
      continue;
    }
    if (auto e = index_.Find(key)) {
      auto n = nodes_.find(e->node_id);
      // A node that is only briefly unavailable (re-registering after a
      // master restart, or reconciling) keeps its keys: storing one
      // elsewhere would replace it, and the blocks after it on that node
      // would be dropped with it.
      if (n != nodes_.end() && MayComeBack(n->second, now)) {
        slot->set_state(v1::SLOT_EXISTS);
        keep.insert(key);
        v1::Location* loc = slot->mutable_location();
        ToProto(*e, loc);
        continue;
      }
      // Committed on a dead node: a miss for readers, so it may be written
      // again; the commit replaces the old entry.
    }
    slot->set_state(v1::SLOT_ALLOCATED);
    to_allocate.push_back(i);
    lengths.push_back(request.lengths(i));
    total_bytes += request.lengths(i);
  }
  if (to_allocate.empty()) return response;

  const std::string tenant(TenantOfKey(request.keys(0)));
  if (quota.limited()) {
    const uint64_t refused = counters_.puts_over_tenant_quota;
    absl::Status room = MakeRoomInTenant(tenant, quota, to_allocate.size(),
                                         total_bytes, keep, now);
    if (over_quota != nullptr) {
      *over_quota = counters_.puts_over_tenant_quota != refused;
    }
    if (!room.ok()) return room;
  }

  // Choose one node for the whole request, among those where the caller's
  // pending puts leave room for it (checked before anything is evicted).
  std::vector<std::pair<uint32_t, uint64_t>> placed;
  Node* chosen = nullptr;
  Node* target = nullptr;  // where to evict if no node has room
  std::string over_limit;  // why the caller may not put on some node
  auto caller_may_put = [&](const Node& n) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return CallerMayPut(caller, n, to_allocate.size(), total_bytes,
                        &over_limit);
  };
  if (preferred != 0) {
    Node& p = nodes_.at(preferred);
    if (IsPlaceable(p, now) && caller_may_put(p)) {
      target = &p;
      if (TryAllocateOnNode(p, lengths, &placed)) chosen = &p;
    }
  }
  size_t alive = 0;
  size_t draining = 0;  // alive, but drained by an operator
  if (chosen == nullptr && !nodes_.empty()) {
    auto start = nodes_.upper_bound(last_placed_node_);
    auto it = start;
    for (size_t tried = 0; tried < nodes_.size(); ++tried, ++it) {
      if (it == nodes_.end()) it = nodes_.begin();
      if (!IsAlive(it->second, now)) continue;
      if (it->second.info.draining()) {
        ++draining;
        continue;
      }
      ++alive;
      if (!caller_may_put(it->second)) continue;
      if (target == nullptr) target = &it->second;
      if (it->first == preferred) continue;  // already tried
      if (TryAllocateOnNode(it->second, lengths, &placed)) {
        chosen = &it->second;
        break;
      }
    }
  }
  if (chosen == nullptr) {
    if (alive == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no alive storage node to place ", to_allocate.size(),
          " objects (", nodes_.size(), " nodes known",
          draining > 0 ? absl::StrCat(", ", draining, " alive but draining")
                       : "",
          ")"));
    }
    if (target == nullptr) {
      ++counters_.puts_over_caller_limit;
      LOG_EVERY_N(WARNING, 1000)
          << "PutStart refused: " << over_limit;
      return absl::ResourceExhaustedError(over_limit);
    }
    std::string why;
    absl::StatusOr<bool> fit =
        EvictAndAllocate(*target, lengths, keep, now, &placed, &why);
    if (!fit.ok()) return fit.status();
    if (!*fit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no alive storage node has room for ", to_allocate.size(),
          " objects totalling ", total_bytes, " bytes; eviction on node ",
          target->info.node_id(), ": ", why));
    }
    chosen = target;
  }
  const uint32_t node_id = chosen->info.node_id();

  PendingPut put;
  put.caller = std::string(caller);
  put.tenant = tenant;
  put.bytes = total_bytes;
  put.node_id = node_id;
  put.key_count = static_cast<uint32_t>(request.keys_size());
  put.parent_key = request.parent_key();
  put.expiry = now + options_.put_timeout;
  put.slots.reserve(to_allocate.size());
  for (size_t j = 0; j < to_allocate.size(); ++j) {
    auto gen = store_->NextGeneration();
    if (!gen.ok()) {
      for (const auto& [rid, addr] : placed) FreeSpace(node_id, rid, addr);
      return gen.status();
    }
    const int i = to_allocate[j];
    PendingSlot slot{static_cast<uint32_t>(i),
                     request.keys(i),
                     i == 0 ? request.parent_key() : request.keys(i - 1),
                     placed[j].first,
                     placed[j].second,
                     request.lengths(i),
                     *gen};
    v1::Location* loc = response.mutable_slots(i)->mutable_location();
    ToProto(slot.location(node_id), loc);
    Grant(*chosen, *loc, wire::kCapWrite, put.expiry,
          response.mutable_slots(i)->mutable_capability());
    put.slots.push_back(std::move(slot));
  }
  const uint64_t put_id = next_put_id_++;
  if (next_put_id_ == 0) next_put_id_ = 1;
  for (const PendingSlot& slot : put.slots) pending_keys_[slot.key] = put_id;
  if (!put.parent_key.empty()) ++pending_parents_[put.parent_key];
  response.set_expires_unix_ms(absl::ToUnixMillis(put.expiry));
  CountCallerPending(put, +1);
  pending_.emplace(put_id, std::move(put));
  last_placed_node_ = node_id;
  response.set_put_id(put_id);
  FillNodeInfo(*chosen, now, response.mutable_node());
  return response;
}

absl::StatusOr<v1::PutCommitResponse> MasterService::PutCommit(
    const v1::PutCommitRequest& request) {
  MutexLock l(&mu_);
  auto it = pending_.find(request.put_id());
  if (it == pending_.end()) {
    return absl::NotFoundError(
        absl::StrCat("put ", request.put_id(), " expired or unknown"));
  }
  if (clock_->Now() > it->second.expiry) {
    ReleasePut(request.put_id(), /*free_space=*/true);
    ++counters_.puts_expired;
    return absl::NotFoundError(
        absl::StrCat("put ", request.put_id(), " expired or unknown"));
  }
  PendingPut& put = it->second;
  absl::flat_hash_set<uint32_t> failed;
  for (uint32_t idx : request.failed_indexes()) {
    if (idx >= put.key_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("failed index ", idx, " out of range (put has ",
                       put.key_count, " keys)"));
    }
    failed.insert(idx);
  }

  // The slots to commit, in chain order: a slot whose parent is neither
  // committed nor committed by this put would be unreachable.
  const absl::Time now = clock_->Now();
  std::vector<const PendingSlot*> to_commit;
  std::vector<const PendingSlot*> waiting;  // parent in another pending put
  uint32_t unreachable = 0;
  {
    absl::flat_hash_set<absl::string_view> committing;
    for (const PendingSlot& slot : put.slots) {
      if (failed.contains(slot.index)) continue;
      if (!slot.parent.empty() && !committing.contains(slot.parent) &&
          !index_.Find(slot.parent)) {
        auto other = pending_keys_.find(slot.parent);
        if (other == pending_keys_.end() || other->second == request.put_id()) {
          ++unreachable;
          continue;
        }
        waiting.push_back(&slot);
      }
      committing.insert(slot.key);
      to_commit.push_back(&slot);
    }
  }
  MetadataMutation m;
  for (const PendingSlot* slot : to_commit) {
    ObjectRecord record{slot->location(put.node_id)};
    record.last_use_ms = static_cast<uint64_t>(absl::ToUnixMillis(now));
    record.parent_key = slot->parent;
    m.put_objects.emplace_back(slot->key, std::move(record));
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;  // nothing changed; the put stays pending

  // A reconciliation of the node that began before this commit may have
  // listed the node's extents before these writes landed: it must not
  // judge them.
  if (auto n = nodes_.find(put.node_id);
      n != nodes_.end() && n->second.reconciling) {
    for (const PendingSlot* slot : to_commit) {
      n->second.committed_since_reconcile.insert(slot->generation);
    }
  }
  // In chain order: each block links to its parent (committed before it)
  // and goes just below it in recency, so the tail is the least recent.
  uint32_t committed = 0;
  size_t next = 0;
  for (const PendingSlot& slot : put.slots) {
    pending_keys_.erase(slot.key);
    if (next == to_commit.size() || to_commit[next] != &slot) {
      FreeSpace(put.node_id, slot.region_id, slot.addr);
      continue;
    }
    ++next;
    const ObjectLocation e = slot.location(put.node_id);
    auto old = index_.Upsert(slot.key, e, slot.parent);
    if (!old.ok()) {
      // Keys and lengths were validated at PutStart.
      LOG(DFATAL) << "index rejected committed key: " << old.status();
      FreeSpace(put.node_id, slot.region_id, slot.addr);
      continue;
    }
    if (old->has_value()) {
      // Replaced an entry on a dead node.
      const ObjectLocation& o = **old;
      FreeSpace(o.node_id, o.region_id, o.addr);
      CountObject(o, -1);
    }
    CountObject(e, +1);
    ++committed;
  }
  counters_.commits_unreachable += unreachable;
  for (const PendingSlot* slot : waiting) {
    waiting_children_[slot->parent].push_back(slot->key);
  }
  // Blocks of other puts waiting for these; the put's keys that were not
  // committed leave theirs unreachable.
  next = 0;
  for (const PendingSlot& slot : put.slots) {
    const bool ok = next < to_commit.size() && to_commit[next] == &slot;
    if (ok) ++next;
    SettleWaitingChildrenLocked(slot.key, ok);
  }
  // A replaced entry's children (on the dead node) lost their chain:
  // ReapExpired removes them.
  UnpinParent(put);
  CountCallerPending(put, -1);
  pending_.erase(it);
  v1::PutCommitResponse response;
  response.set_committed(committed);
  return response;
}

absl::StatusOr<v1::PutAbortResponse> MasterService::PutAbort(
    const v1::PutAbortRequest& request) {
  MutexLock l(&mu_);
  if (!pending_.contains(request.put_id())) {
    return absl::NotFoundError(
        absl::StrCat("put ", request.put_id(), " expired or unknown"));
  }
  ReleasePut(request.put_id(), /*free_space=*/true);
  return v1::PutAbortResponse();
}

size_t MasterService::ReapExpired() {
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> expired;
  for (const auto& [id, put] : pending_) {
    if (now > put.expiry) expired.push_back(id);
  }
  for (uint64_t id : expired) ReleasePut(id, /*free_space=*/true);
  counters_.puts_expired += expired.size();
  if (!expired.empty()) {
    LOG(INFO) << "reaped " << expired.size() << " expired puts";
  }
  PersistRecencyLocked(options_.recency_batch);
  SweepOrphansLocked();
  // One line when a registered node goes silent (its objects miss now).
  for (auto& [id, node] : nodes_) {
    if (node.registered && !node.deregistered && !node.reported_dead &&
        !IsAlive(node, now)) {
      LOG(WARNING) << "node " << id << " '" << node.info.name()
                   << "' missed its heartbeats for "
                   << absl::FormatDuration(
                          absl::Trunc(now - node.last_seen, absl::Seconds(1)))
                   << ": dead; its " << node.object_count
                   << " objects miss and it gets no placements until it "
                      "returns";
      node.reported_dead = true;
    }
  }
  if (options_.forget_dead_nodes_after != absl::InfiniteDuration()) {
    std::vector<uint32_t> forgotten;
    for (const auto& [id, node] : nodes_) {
      if (now - node.last_seen > options_.forget_dead_nodes_after) {
        forgotten.push_back(id);
      }
    }
    for (uint32_t id : forgotten) {
      auto removed = ForgetNodeLocked(id);
      if (!removed.ok()) {
        LOG(WARNING) << "cannot forget node " << id
                     << " (dead too long): " << removed.status();
      }
    }
  }
  return expired.size();
}

absl::StatusOr<v1::BatchLookupResponse> MasterService::BatchLookup(
    const v1::BatchLookupRequest& request) {
  v1::BatchLookupResponse response;
  absl::Status s = BatchLookupInto(request, &response);
  if (!s.ok()) return s;
  return response;
}

absl::Status MasterService::BatchLookupInto(
    const v1::BatchLookupRequest& request, v1::BatchLookupResponse* response) {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  response->mutable_results()->Reserve(request.keys_size());
  if (!request.for_read()) {
    ReaderMutexLock l(&mu_);
    LookupLocked(request, clock_->Now(), response);
    return absl::OkStatus();
  }
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint32_t> hit_records;
  LookupLocked(request, now, response, &hit_records);
  // The chain head ends up most recent, each block just below the one
  // before it (MetadataIndex::TouchPrefix).
  const uint32_t tick = LeaseTick(now);
  index_.TouchRecords(hit_records, tick);
  return absl::OkStatus();
}

uint32_t MasterService::LookupLocked(const v1::BatchLookupRequest& request,
                                     absl::Time now,
                                     v1::BatchLookupResponse* out,
                                     std::vector<uint32_t>* hit_records) const {
  v1::BatchLookupResponse& response = *out;
  std::vector<const Node*> referenced;
  bool prefix = true;
  uint32_t hit_prefix = 0;
  const absl::Time cap_expiry = now + options_.capability_lifetime;
  const int64_t cap_expiry_ms = absl::ToUnixMillis(cap_expiry);
  const bool packed = request.packed();
  uint8_t* records = nullptr;
  if (packed) {
    std::string* bytes = response.mutable_packed_results();
    bytes->assign(request.keys_size() * wire::kLookupRecordBytes, '\0');
    records = reinterpret_cast<uint8_t*>(bytes->data());
  }
  if (hit_records != nullptr) hit_records->reserve(request.keys_size());
  for (int i = 0; i < request.keys_size(); ++i) {
    v1::LookupResult* result = packed ? nullptr : response.add_results();
    uint32_t record;
    auto e = index_.Find(request.keys(i), &record);
    const Node* node = nullptr;
    if (e) {
      auto n = nodes_.find(e->node_id);
      if (n != nodes_.end() && IsAlive(n->second, now)) node = &n->second;
    }
    if (node == nullptr) {
      prefix = false;
      continue;  // not found: a zero record, an empty result
    }
    if (packed) {
      CapabilityScope scope;
      scope.node_id = e->node_id;
      scope.region_id = e->region_id;
      scope.addr = e->addr;
      scope.length = e->length;
      scope.generation = e->generation;
      scope.rights = wire::kCapRead;
      scope.expires_unix_ms = cap_expiry_ms;
      wire::LookupRecord r{scope.node_id, scope.region_id, scope.addr,
                           scope.length, scope.generation};
      Sign(*node, scope, &r.cap);
      wire::EncodeLookupRecord(r, records + i * wire::kLookupRecordBytes);
    } else {
      result->set_found(true);
      v1::Location* loc = result->mutable_location();
      ToProto(*e, loc);
      Grant(*node, *loc, wire::kCapRead, cap_expiry,
            result->mutable_capability());
    }
    if (prefix) {
      ++hit_prefix;
      if (hit_records != nullptr) hit_records->push_back(record);
    }
    if (std::find(referenced.begin(), referenced.end(), node) ==
        referenced.end()) {
      referenced.push_back(node);
    }
  }
  response.set_hit_prefix_length(hit_prefix);
  for (const Node* node : referenced) {
    FillPeerInfo(*node, response.add_nodes());
  }
  return hit_prefix;
}

absl::StatusOr<v1::RemoveResponse> MasterService::Remove(
    const v1::RemoveRequest& request) {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  MetadataMutation m;
  for (const std::string& key : request.keys()) {
    if (index_.Find(key)) m.delete_objects.push_back(key);
  }
  s = store_->Apply(m);
  if (!s.ok()) return s;
  v1::RemoveResponse response;
  for (const std::string& key : request.keys()) {
    auto e = index_.Erase(key);
    response.add_removed(e.has_value());
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  SweepOrphansLocked();  // the removed blocks' descendants
  return response;
}

void MasterService::MarkRegistered(Node& node, bool retained) {
  node.registered = true;
  node.reported_dead = false;  // registration logs its own line
  // A reconciliation that began before this registration described the
  // node's previous life: superseded.
  ++node.reconcile_epoch;
  node.reconciling = false;
  node.committed_since_reconcile.clear();
  // The node may no longer hold what we list for it (a crash lost its
  // write buffer, a partition outlived puts): serve it once it has told us.
  node.needs_reconcile = retained && node.object_count > 0;
}

absl::Status Reconciliation::Add(
    const google::protobuf::RepeatedPtrField<v1::Location>& extents) {
  if (extents.size() > kMaxReconcileChunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        extents.size(), " extents in one message (want at most ",
        kMaxReconcileChunk, ")"));
  }
  if (held_.size() + extents.size() > max_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "reconciliation of node ", node_id_, " reports more than ", max_,
        " extents (max_reconcile_extents)"));
  }
  for (const v1::Location& e : extents) {
    if (e.generation() == 0 || e.length() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extent at region ", e.region_id(), " addr ", e.addr(),
          " has generation ", e.generation(), " and length ", e.length(),
          " (want both > 0)"));
    }
    if (!held_.emplace(e.generation(), Held{e.region_id(), e.addr(),
                                            e.length()})
             .second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "generation ", e.generation(), " reported twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Reconciliation>> MasterService::BeginReconcile(
    uint32_t node_id, uint64_t incarnation) {
  absl::StatusOr<uint64_t> epoch = StartReconcile(node_id, incarnation);
  if (!epoch.ok()) return epoch.status();
  return OpenReconcile(node_id, incarnation, *epoch);
}

absl::StatusOr<std::unique_ptr<Reconciliation>> MasterService::OpenReconcile(
    uint32_t node_id, uint64_t incarnation, uint64_t epoch) {
  ReaderMutexLock l(&mu_);
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is unknown"));
  }
  const Node& node = n->second;
  if (node.deregistered || !node.registered ||
      node.info.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node_id, " is not registered with incarnation ",
        incarnation, "; register first"));
  }
  if (epoch == 0 || node.reconcile_epoch != epoch || !node.reconciling) {
    return absl::AbortedError(absl::StrCat(
        "reconciliation ", epoch, " of node ", node_id,
        " is not the current one; begin again"));
  }
  auto r = std::make_unique<Reconciliation>();
  r->node_id_ = node_id;
  r->incarnation_ = incarnation;
  r->epoch_ = epoch;
  r->max_ = options_.max_reconcile_extents;
  return r;
}

absl::StatusOr<uint64_t> MasterService::StartReconcile(uint32_t node_id,
                                                       uint64_t incarnation) {
  MutexLock l(&mu_);
  auto n = nodes_.find(node_id);
  if (n == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is unknown"));
  }
  Node& node = n->second;
  if (node.deregistered || !node.registered ||
      node.info.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node_id, " is not registered with incarnation ",
        incarnation, "; register first"));
  }
  node.reconciling = true;
  node.committed_since_reconcile.clear();
  return ++node.reconcile_epoch;
}

absl::StatusOr<v1::ReconcileNodeResponse> MasterService::FinishReconcile(
    std::unique_ptr<Reconciliation> r) {
  const uint32_t id = r->node_id_;
  auto superseded = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    auto n = nodes_.find(id);
    return n == nodes_.end() || n->second.deregistered ||
           n->second.info.incarnation() != r->incarnation_ ||
           n->second.reconcile_epoch != r->epoch_;
  };
  auto aborted = [&] {
    return absl::AbortedError(absl::StrCat(
        "reconciliation of node ", id,
        " was superseded (the node re-registered, left, or began another)"));
  };

  // Phase 1: compare the listings with what the node holds, a chunk of the
  // index at a time under the shared lock, so lookups and commits proceed
  // in between. A listing committed after BeginReconcile is not judged (the
  // node may have listed its extents before the write landed); one that
  // changes between the chunks is checked again in phase 2.
  std::vector<std::pair<std::string, ObjectLocation>> candidates;
  uint64_t listed = 0, matched = 0, skipped = 0;
  for (uint32_t cursor = 0;;) {
    ReaderMutexLock l(&mu_);
    if (superseded()) return aborted();
    const Node& node = nodes_.at(id);
    cursor = index_.ForEachFrom(
        cursor, kReconcileScanChunk,
        [&](absl::string_view key, const ObjectLocation& e)
            ABSL_NO_THREAD_SAFETY_ANALYSIS {
              if (e.node_id != id) return true;
              ++listed;
              auto h = r->held_.find(e.generation);
              if (h != r->held_.end() && h->second.region_id == e.region_id &&
                  h->second.addr == e.addr && h->second.length == e.length) {
                ++matched;
                r->held_.erase(h);
              } else if (node.committed_since_reconcile.contains(
                             e.generation)) {
                ++skipped;
              } else {
                // Not held, or held with another range: the listing is
                // wrong (a mismatched extent stays in held_ and is freed
                // as unlisted).
                candidates.emplace_back(std::string(key), e);
              }
              return true;
            });
    if (cursor >= index_.records_end()) break;
  }

  // Phase 2, under the exclusive lock: drop the candidates that still name
  // the same object, and find the held extents neither listed nor pending.
  MutexLock l(&mu_);
  if (superseded()) return aborted();
  Node& node = nodes_.at(id);
  v1::ReconcileNodeResponse response;
  response.set_held(r->held_.size() + matched);
  std::vector<std::string> doomed;
  for (const auto& [key, e] : candidates) {
    auto now = index_.Find(key);
    if (now && *now == e &&
        !node.committed_since_reconcile.contains(e.generation)) {
      doomed.push_back(key);
    }
  }

  // Held extents neither listed nor pending.
  absl::flat_hash_set<uint64_t> pending_generations;
  for (const auto& [put_id, put] : pending_) {
    if (put.node_id != id) continue;
    for (const PendingSlot& slot : put.slots) {
      pending_generations.insert(slot.generation);
    }
  }
  uint64_t unlisted = 0;
  for (const auto& [generation, h] : r->held_) {
    if (pending_generations.contains(generation) ||
        node.committed_since_reconcile.contains(generation)) {
      continue;
    }
    ++unlisted;
    if (static_cast<uint32_t>(response.unlisted_size()) <
        options_.max_unlisted_per_reconcile) {
      v1::Location* loc = response.add_unlisted();
      ToProto(ObjectLocation{id, h.region_id, h.addr, h.length, generation},
              loc);
    }
  }

  if (!doomed.empty()) {
    absl::Status s = store_->DeleteObjects(doomed);
    if (!s.ok()) {
      node.reconciling = false;
      node.committed_since_reconcile.clear();
      return s;
    }
    for (const std::string& key : doomed) {
      auto e = index_.Erase(key);
      if (!e) continue;
      FreeSpace(e->node_id, e->region_id, e->addr);
      CountObject(*e, -1);
    }
    // Blocks after a dropped one are unreachable: they go too, and the
    // node frees them in this round.
    for (const auto& [key, e] : SweepOrphansLocked()) {
      if (e.node_id != id) continue;
      ++unlisted;
      if (static_cast<uint32_t>(response.unlisted_size()) <
          options_.max_unlisted_per_reconcile) {
        v1::Location* loc = response.add_unlisted();
        ToProto(e, loc);  // e.node_id == id
      }
    }
  }
  response.set_listed(listed);
  response.set_matched(matched);
  response.set_dropped_listings(doomed.size());
  response.set_unlisted_count(unlisted);
  response.set_skipped_recent(skipped);
  counters_.reconciliations++;
  counters_.reconcile_dropped_listings += doomed.size();
  counters_.reconcile_unlisted_extents += unlisted;
  node.reconciling = false;
  node.committed_since_reconcile.clear();
  const bool was_awaited = node.needs_reconcile;
  node.needs_reconcile = false;
  if (was_awaited || !doomed.empty() || unlisted > 0) {
    LOG(INFO) << "node " << id << " '" << node.info.name()
              << "' reconciled: listed " << listed << ", held "
              << response.held() << ", matched " << matched
              << ", dropped " << doomed.size()
              << " listings it does not hold, " << unlisted
              << " extents unlisted" << (was_awaited ? "; serving it" : "");
  }
  return response;
}

absl::StatusOr<v1::ReportMissingResponse> MasterService::ReportMissing(
    const v1::ReportMissingRequest& request) {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  if (request.locations_size() != request.keys_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.keys_size(), " keys but ",
                     request.locations_size(), " locations"));
  }
  MutexLock l(&mu_);
  std::vector<bool> drop(request.keys_size(), false);
  std::vector<std::string> doomed;
  for (int i = 0; i < request.keys_size(); ++i) {
    const v1::Location& loc = request.locations(i);
    auto e = index_.Find(request.keys(i));
    if (e && e->node_id == loc.node_id() && e->region_id == loc.region_id() &&
        e->addr == loc.addr() && e->length == loc.length() &&
        e->generation == loc.generation()) {
      drop[i] = true;
      doomed.push_back(request.keys(i));
    }
  }
  if (!doomed.empty()) {
    s = store_->DeleteObjects(doomed);
    if (!s.ok()) return s;
  }
  v1::ReportMissingResponse response;
  uint64_t dropped = 0;
  for (int i = 0; i < request.keys_size(); ++i) {
    if (drop[i]) {
      auto e = index_.Erase(request.keys(i));
      if (e) {
        FreeSpace(e->node_id, e->region_id, e->addr);
        CountObject(*e, -1);
        ++dropped;
      } else {
        drop[i] = false;  // a repeated key: dropped once
      }
    }
    response.add_dropped(drop[i]);
  }
  counters_.read_repairs += dropped;
  SweepOrphansLocked();  // the blocks after a dropped one
  if (dropped > 0) {
    LOG(INFO) << "read repair: dropped " << dropped
              << " listings that their node refused to serve";
  }
  return response;
}

bool MasterService::ListObjects(uint32_t node_id, uint64_t* cursor,
                                size_t max,
                                v1::ListObjectsResponse* out) const {
  ReaderMutexLock l(&mu_);
  const uint64_t begin = std::min<uint64_t>(*cursor, index_.records_end());
  // Visit at most a few pages' worth of records per call when filtering by
  // node, so one call never walks the whole index under the lock.
  const size_t budget = node_id == 0 ? max : max * 16;
  size_t added = 0;
  const uint32_t next = index_.ForEachFrom(
      static_cast<uint32_t>(begin), budget,
      [&](absl::string_view key, const ObjectLocation& e) {
        if (node_id != 0 && e.node_id != node_id) return true;
        if (added == max) return false;
        v1::ListedObject* o = out->add_objects();
        o->set_key(std::string(key));
        if (auto chain = index_.Chain(key)) {
          o->set_parent_key(std::move(chain->parent));
          o->set_unreachable(chain->orphan);
        }
        v1::Location* loc = o->mutable_location();
        ToProto(e, loc);
        ++added;
        return true;
      });
  *cursor = next;
  return next < index_.records_end();
}

v1::ListNodesResponse MasterService::ListNodes() const {
  v1::ListNodesResponse response;
  ReaderMutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    FillNodeInfo(node, now, response.add_nodes());
  }
  return response;
}

absl::flat_hash_map<std::string, uint64_t>
MasterService::QuotaEvictionsByTenant() const {
  ReaderMutexLock l(&mu_);
  return quota_evictions_by_tenant_;
}

MetadataIndex::TenantUsage MasterService::UsageOfTenant(
    absl::string_view tenant) const {
  MutexLock l(&mu_);
  return index_.UsageOf(tenant);
}

absl::flat_hash_map<std::string, MetadataIndex::TenantUsage>
MasterService::AllTenantUsage() const {
  MutexLock l(&mu_);
  return index_.AllTenantUsage();
}

v1::GetStatsResponse MasterService::GetStats() const {
  v1::GetStatsResponse response;
  ReaderMutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  response.set_object_count(index_.size());
  response.set_object_bytes(object_bytes_);
  response.set_pending_puts(pending_.size());
  uint64_t alive = 0;
  for (const auto& [id, node] : nodes_) {
    v1::NodeInfo* info = response.add_nodes();
    FillNodeInfo(node, now, info);
    if (info->alive()) ++alive;
  }
  response.set_nodes_alive(alive);
  response.set_nodes_dead(nodes_.size() - alive);
  response.set_evicted_objects(counters_.evicted_objects);
  response.set_evicted_bytes(counters_.evicted_bytes);
  response.set_reconciliations(counters_.reconciliations);
  response.set_reconcile_dropped_listings(
      counters_.reconcile_dropped_listings);
  response.set_reconcile_unlisted_extents(
      counters_.reconcile_unlisted_extents);
  response.set_read_repairs(counters_.read_repairs);
  response.set_index_bytes_per_entry(
      index_.empty() ? 0 : index_.MemoryBytes() / index_.size());
  return response;
}

MasterServiceCounters MasterService::counters() const {
  ReaderMutexLock l(&mu_);
  return counters_;
}

}  // namespace master
}  // namespace hymcache
