// Liveness: a node is alive while it has registered with this master
// process, completed the reconciliation that registration asked for (if
// any), its last heartbeat (or registration) is within `node_timeout`, and
// it has not deregistered. After a restart no persisted node is alive until
// it registers again (its heartbeats are answered with reregister). Objects
// on nodes that are not alive are misses for BatchLookup and such nodes get
// no placements; PutStart writes their keys again elsewhere only once the
// node is dead (unseen for node_timeout, or deregistered): a node that is
// merely re-registering or reconciling keeps them (SLOT_EXISTS).

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/limits.h"
#include "common/net.h"
#include "common/status_reason.h"
#include "master/master_service_internal.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::DurableRegion;
using internal::PrintableKey;
using internal::ToProto;

// Registration size caps (documented in proto/master.proto).
constexpr size_t kMaxAddressBytes = 256;
constexpr int kMaxTransportParams = 32;
constexpr size_t kMaxTransportParamKeyBytes = 64;
constexpr size_t kMaxTransportParamValueBytes = 4096;
constexpr size_t kMaxTransportParamsBytes = 8192;
constexpr int kMaxRegions = 64;
constexpr uint32_t kMaxAlignment = uint32_t{1} << 30;

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

// RegisterNode's checks of the request alone (see RegisterNode's errors).
absl::Status ValidateRegistration(const v1::RegisterNodeRequest& request) {
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
  if (request.host().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("host of ", request.host().size(), " bytes (want at most ",
                     kMaxHostBytes, ")"));
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
  return absl::OkStatus();
}

}  // namespace

bool MasterService::MayComeBack(const Node& node, absl::Time now) const {
  return !node.deregistered && now - node.last_seen <= options_.node_timeout;
}

bool MasterService::IsAlive(const Node& node, absl::Time now) const {
  return node.registered && !node.needs_reconcile && !node.deregistered &&
         now - node.last_seen <= options_.node_timeout;
}

bool MasterService::IsReadable(const Node& node, absl::Time now) const {
  return node.registered && !node.deregistered &&
         now - node.last_seen <= options_.node_timeout;
}

bool MasterService::IsPlaceable(const Node& node, absl::Time now) const {
  // A node given a fresh key takes placements once it has proven it holds
  // it (its first heartbeat, sent right after it registers): until then the
  // answer carrying the key may still be on its way, and the node would
  // refuse the writes the key signs.
  return IsAlive(node, now) && node.key_confirmed && !node.info.draining();
}

bool MasterService::ProofValid(const Node& node, absl::string_view purpose,
                               uint32_t node_id, uint64_t incarnation,
                               const v1::NodeAuth& auth, absl::Time now) const {
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
                                          absl::string_view purpose,
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
  // A node given a fresh key counts as alive once it has proven it (its
  // first heartbeat, right after it registers): from then on it takes
  // placements too, so a caller that waits for alive nodes can put at once.
  out->set_alive(IsAlive(node, now) && node.key_confirmed);
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

absl::StatusOr<uint64_t> MasterService::ForgetNodeLocked(uint32_t node_id) {
  Node& node = nodes_.at(node_id);
  std::vector<std::string> doomed;
  index_->ForEach([&](absl::string_view key, const ObjectLocation& e) {
    if (e.node_id == node_id) doomed.emplace_back(key);
  });
  MetadataMutation m;
  m.delete_objects = doomed;
  m.delete_nodes.push_back(node.info.name());
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;
  for (const std::string& key : doomed) {
    auto e = index_->Erase(key);
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
  index_->ForEach([&](absl::string_view key, const ObjectLocation& e) {
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
  absl::Status s = ValidateRegistration(request);
  if (!s.ok()) return s;
  if (options_.epoch != 0 && request.highest_master_epoch() > options_.epoch) {
    // This term is below one the node has seen: nothing it answers would be
    // taken. Its leader key is what must move (HaMaster), not the node.
    if (options_.on_epoch_behind) {
      options_.on_epoch_behind(request.highest_master_epoch());
    }
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "RegisterNode: node '", request.name(),
                          "' has accepted master "
                          "epoch ",
                          request.highest_master_epoch(),
                          ", above this master's ", options_.epoch,
                          " (etcd recreated?): this master ends its term so "
                          "that the next leader's epoch is above it")),
                      StatusReason::kMasterEpochBehind);
  }

  v1::NodeInfo info;
  info.set_name(request.name());
  info.set_incarnation(request.incarnation());
  info.set_data_address(request.data_address());
  info.set_control_address(request.control_address());
  info.set_host(request.host());
  for (const auto& r : request.regions()) *info.add_regions() = DurableRegion(r);
  *info.mutable_transport_params() = request.transport_params();
  // Persisted: false once the node deregisters (see DeregisterNode).
  info.set_alive(true);

  v1::RegisterNodeResponse response;
  response.set_master_epoch(options_.epoch);
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
    s = RegisterNewNodeLocked(request, std::move(info), now, &response);
    if (!s.ok()) return s;
    return response;
  }

  const uint32_t id = known->second;
  Node& node = nodes_.at(id);
  info.set_node_id(id);
  // An operator's drain outlives the node's restarts (hymctl undrain ends
  // it).
  info.set_draining(node.info.draining());
  absl::StatusOr<NodeIdentity> who = DecideTakeoverLocked(id, node, request, now);
  if (!who.ok()) return who.status();
  info.set_node_key(who->key);
  response.set_node_key(who->key);
  const bool new_incarnation =
      who->takeover || node.info.incarnation() != request.incarnation();
  const bool new_layout = !SameLayout(node.info.regions(), request.regions());
  if (!new_incarnation && !new_layout) {
    // Same memory, same layout: a node coming back after a timeout or a
    // master restart. Keep everything, refresh addresses.
    s = store_->PutNode(info);
    if (!s.ok()) return s;
    node.info = std::move(info);
    node.mac.emplace(who->key);
    node.key_confirmed = who->proven;
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
                                     " objects, placing on it once it "
                                     "reconciles")
                      : "");
    return response;
  }
  s = RebuildRegionsLocked(id, node, request, std::move(info), *who,
                           new_incarnation, now, &response);
  if (!s.ok()) return s;
  return response;
}

absl::Status MasterService::RegisterNewNodeLocked(
    const v1::RegisterNodeRequest& request, v1::NodeInfo info, absl::Time now,
    v1::RegisterNodeResponse* response) {
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
  absl::Status s = store_->PutNode(info);
  if (!s.ok()) return s;
  ++next_node_id_;
  Node& node = nodes_[id];
  node.mac.emplace(*key);
  node.key_confirmed = false;
  node.registration_nonce = request.registration_nonce();
  response->set_node_key(*key);
  node.info = std::move(info);
  node.last_seen = now;
  node.registered = true;
  node.regions = std::move(plan->regions);
  node_by_name_[request.name()] = id;
  response->set_node_id(id);
  LOG(INFO) << "registered node " << id << " '" << request.name()
            << "' incarnation " << request.incarnation() << " at "
            << request.data_address();
  return absl::OkStatus();
}

absl::StatusOr<MasterService::NodeIdentity>
MasterService::DecideTakeoverLocked(uint32_t id, const Node& node,
                                    const v1::RegisterNodeRequest& request,
                                    absl::Time now) const {
  NodeIdentity who;
  // Only the holder of the name's key keeps or takes over its identity.
  who.proven = ProofValid(node, "register", 0, request.incarnation(),
                          request.auth(), now);
  // The same registration again: its answer (the key) never reached the
  // node. Answer it the same way; nothing the node held is lost.
  const bool repeat =
      !who.proven && node.mac && !node.key_confirmed && node.registered &&
      !node.deregistered && node.info.incarnation() == request.incarnation() &&
      !request.registration_nonce().empty() &&
      request.registration_nonce() == node.registration_nonce;
  if (repeat) {
    LOG(INFO) << "node " << id << " '" << request.name()
              << "' registers again before proving its key: answering as "
                 "before (its last answer was lost)";
  }
  if (!who.proven && !repeat && node.mac) {
    if (MayComeBack(node, now)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "node '", request.name(), "' is registered and alive: registering "
          "it again needs a proof of its node key (or wait until it has "
          "missed heartbeats for ",
          absl::FormatDuration(options_.node_timeout), ")"));
    }
    who.takeover = true;  // a new node under the old name: nothing it held
  }
  who.key = node.info.node_key();
  if (who.takeover || who.key.empty()) {  // empty: trusted on first use
    auto k = NewNodeKey();
    if (!k.ok()) return k.status();
    who.key = *std::move(k);
  }
  return who;
}

absl::Status MasterService::RebuildRegionsLocked(
    uint32_t id, Node& node, const v1::RegisterNodeRequest& request,
    v1::NodeInfo info, const NodeIdentity& who, bool new_incarnation,
    absl::Time now, v1::RegisterNodeResponse* response) {
  const bool new_layout = !SameLayout(node.info.regions(), request.regions());
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
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;

  // The old allocators are replaced: pending puts' space goes with them.
  CancelPutsOfNode(id, /*free_space=*/false);
  for (const std::string& key : plan->doomed) {
    auto e = index_->Erase(key);
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
  node.mac.emplace(who.key);
  node.key_confirmed = who.proven;
  node.registration_nonce = request.registration_nonce();
  node.regions = std::move(plan->regions);
  node.object_count = plan->kept;
  node.last_seen = now;
  node.deregistered = false;
  MarkRegistered(node, /*retained=*/!new_incarnation);
  SweepOrphansLocked();  // chains that lost a dropped object
  response->set_node_id(id);
  response->set_objects_retained(!new_incarnation);
  response->set_reconcile(node.needs_reconcile);
  LOG(INFO) << "node " << id << " '" << request.name() << "' re-registered"
            << (who.takeover ? " by a new node (no proof of the old one's key)"
                : new_incarnation ? " with a new incarnation"
                                  : "")
            << (new_layout ? " with new regions" : "") << "; purged "
            << plan->purged << " objects, kept " << plan->kept;
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> MasterService::Heartbeat(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  response.set_master_epoch(options_.epoch);
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
  const bool first_proof = !n->second.key_confirmed;
  n->second.key_confirmed = true;
  if (n->second.reported_dead) {
    LOG(INFO) << "node " << request.node_id() << " '"
              << n->second.info.name() << "' heartbeats again: alive";
    n->second.reported_dead = false;
    EmitNode(v1::KvEvent::NODE_UP, request.node_id());
  } else if (first_proof) {
    // A node given a fresh key is alive (placeable) from its first proof.
    EmitNode(v1::KvEvent::NODE_UP, request.node_id());
  }
  response.set_generation_ceiling(store_->GenerationCeiling());
  response.set_reconcile(n->second.needs_reconcile);
  response.set_draining(n->second.info.draining());
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
  index_->ForEach([&](absl::string_view key,
                      const ObjectLocation& e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
    auto e = index_->Erase(key);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  counters_.objects_purged += doomed.size();
  CancelPutsOfNode(node.info.node_id(), /*free_space=*/true);
  SweepOrphansLocked();  // chains that reached into the purged regions
  node.deregistered = true;
  EmitNode(v1::KvEvent::NODE_DOWN, node.info.node_id());
  LOG(INFO) << "node " << node.info.node_id() << " '" << node.info.name()
            << "' deregistered; purged " << doomed.size() << " objects";
  return v1::DeregisterNodeResponse();
}

void MasterService::MarkRegistered(Node& node, bool retained) {
  node.registered = true;
  // A node with a fresh key comes up at its first proof (Heartbeat).
  if (node.key_confirmed) EmitNode(v1::KvEvent::NODE_UP, node.info.node_id());
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

v1::ListNodesResponse MasterService::ListNodes() const {
  v1::ListNodesResponse response;
  ReaderMutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    FillNodeInfo(node, now, response.add_nodes());
  }
  return response;
}

}  // namespace master
}  // namespace hymcache
