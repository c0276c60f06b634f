#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cluster_stats.h"
#include "master/master_service_internal.h"
#include "master/replica_key.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

constexpr uint32_t kMaxNodesLimit = 65536;
constexpr uint32_t kMaxBatchKeysLimit = 65536;
constexpr absl::Duration kMaxReadLease = absl::Hours(24);
constexpr uint32_t kMaxAutoReplicaBranches = 65536;
constexpr absl::Duration kMaxReconcileInterval = absl::Hours(24);
constexpr uint64_t kMaxReconcileExtentsLimit = uint64_t{1} << 28;
constexpr uint32_t kMaxUnlistedLimit = uint32_t{1} << 20;

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
  if (auto_replica_branches > kMaxAutoReplicaBranches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auto_replica_branches must be 0..", kMaxAutoReplicaBranches));
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
  if (absl::Status s = eviction_cost.Validate(); !s.ok()) return s;
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
  if (event_log_capacity > (size_t{1} << 24)) {
    return absl::InvalidArgumentError("event_log_capacity must be 0..2^24");
  }
  if (absl::Status s = engine_caches.Validate(); !s.ok()) return s;
  return placement.Validate();
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
  MutexLock l(&service->mu_);
  service->ListenToIndexLocked();
  return service;
}

absl::StatusOr<std::unique_ptr<MasterService>> MasterService::CreatePreloaded(
    const MasterServiceOptions& options, std::unique_ptr<MetadataStore> store,
    std::unique_ptr<MasterService> preloaded) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  if (store == nullptr) {
    return absl::InvalidArgumentError("MasterService needs a MetadataStore");
  }
  if (preloaded == nullptr) {
    return absl::InvalidArgumentError(
        "CreatePreloaded needs a preloaded service");
  }
  std::unique_ptr<MasterService> service(
      new MasterService(options, std::move(store)));
  {
    MasterService* from = preloaded.get();
    MutexLock a(&from->mu_);
    MutexLock b(&service->mu_);
    // What Load fills (master_service_recovery.cc), and the time its read
    // ticks count from.
    service->load_path_ = from->load_path_;
    service->nodes_ = std::move(from->nodes_);
    service->node_by_name_ = std::move(from->node_by_name_);
    service->next_node_id_ = from->next_node_id_;
    service->index_ = std::move(from->index_);
    from->index_ = std::make_unique<MetadataIndex>();
    from->taken_over_ = true;
    service->index_->TrackUsed(options.recency_batch > 0);
    service->index_->TrackEnded(options.eviction_policy ==
                                EvictionPolicy::kCost);
    service->object_bytes_ = from->object_bytes_;
    service->counters_.objects_dropped = from->counters_.objects_dropped;
    service->counters_.orphans_removed = from->counters_.orphans_removed;
    service->lease_epoch_ = from->lease_epoch_;
    const absl::Time now = service->clock_->Now();
    for (auto& [id, node] : service->nodes_) node.last_seen = now;
    service->ListenToIndexLocked();
    LOG(INFO) << "master took over a preloaded index: "
              << service->nodes_.size() << " nodes and "
              << service->index_->size() << " objects";
  }
  preloaded.reset();
  return service;
}

MasterService::MasterService(const MasterServiceOptions& options,
                             std::unique_ptr<MetadataStore> store)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      store_(std::move(store)),
      events_(std::make_unique<EventLog>(options.event_log_capacity)),
      engine_caches_(std::make_unique<EngineCaches>(options.engine_caches)),
      index_(std::make_unique<MetadataIndex>()) {
  // Put ids are not durable: start at a random point so that a put id from
  // before a restart does not name a put of the new process.
  std::random_device rd;
  uint64_t start = (uint64_t{rd()} << 32) | 1;
  MutexLock l(&mu_);
  next_put_id_ = start;
  lease_epoch_ = clock_->Now();
  index_->TrackUsed(options_.recency_batch > 0);
  index_->TrackEnded(options_.eviction_policy == EvictionPolicy::kCost);
}

MasterService::~MasterService() {
  // A read-only view (a standby's preloaded index, taken over or dropped)
  // writes nothing: a snapshot of it could name a state the store no
  // longer has, or (taken over) an empty one.
  if (store_->read_only()) return;
  {
    MutexLock l(&mu_);
    // Everything read since the last batch, in batches of a bounded size.
    while (index_->used_queued() > 0 &&
           PersistRecencyLocked(
               std::max<uint32_t>(options_.recency_batch, 1 << 16)) > 0) {
    }
  }
  // The next start-up loads this instead of scanning the store.
  if (!options_.snapshot_path.empty()) {
    absl::Status s = WriteSnapshot();
    if (!s.ok()) LOG(WARNING) << "no index snapshot at shutdown: " << s;
  }
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
    if (IsReplicaKey(keys[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key ", i, " ends with the suffix reserved for replicas"));
    }
  }
  return absl::OkStatus();
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
        !IsReadable(node, now)) {
      LOG(WARNING) << "node " << id << " '" << node.info.name()
                   << "' missed its heartbeats for "
                   << absl::FormatDuration(
                          absl::Trunc(now - node.last_seen, absl::Seconds(1)))
                   << ": dead; its " << node.object_count
                   << " objects miss and it gets no placements until it "
                      "returns";
      node.reported_dead = true;
      EmitNode(v1::KvEvent::NODE_DOWN, id);
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

absl::flat_hash_map<std::string, uint64_t>
MasterService::QuotaEvictionsByTenant() const {
  ReaderMutexLock l(&mu_);
  return quota_evictions_by_tenant_;
}

MetadataIndex::TenantUsage MasterService::UsageOfTenant(
    absl::string_view tenant) const {
  MutexLock l(&mu_);
  return index_->UsageOf(tenant);
}

absl::flat_hash_map<std::string, MetadataIndex::TenantUsage>
MasterService::AllTenantUsage() const {
  MutexLock l(&mu_);
  return index_->AllTenantUsage();
}

v1::GetStatsResponse MasterService::GetStats() const {
  v1::GetStatsResponse response;
  response.set_master_epoch(options_.epoch);
  ReaderMutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  response.set_object_count(index_->size());
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
  response.set_index_bytes_per_entry(
      index_->empty() ? 0 : index_->MemoryBytes() / index_->size());
  // The gauges above are computed one by one; the counters of the list
  // (common/cluster_stats.h) are copied by name.
#define HYM_GAUGE_SET_ABOVE_(field, metric, help)
#define HYM_COPY_COUNTER_(field) response.set_##field(counters_.field);
  HYM_CLUSTER_STATS(HYM_GAUGE_SET_ABOVE_, HYM_COPY_COUNTER_)
#undef HYM_GAUGE_SET_ABOVE_
#undef HYM_COPY_COUNTER_
  return response;
}

MasterServiceCounters MasterService::counters() const {
  ReaderMutexLock l(&mu_);
  MasterServiceCounters c = counters_;
  c.placement_imbalance = PlacementImbalanceLocked(clock_->Now());
  return c;
}

}  // namespace master
}  // namespace hymcache
