// Placement: PutStart puts all new slots of a request on one node. The
// preferred node is preferred_node_id if set (tried first while it has
// room), else the node holding parent_key (the block before keys[0] in its
// chain) if it is placeable, so a chain stays on one node. ChooseNodeLocked
// gathers the placeable nodes' fill, recent traffic, puts in flight and
// the tenant's bytes on each, and RankNodes (master/placement.h) orders
// them: the chain's node while within the spill margin, then by fill and
// load (or round robin). The first in that order with room takes the put;
// with no room anywhere, eviction runs on the preferred node (without one:
// the first in that order the caller may use).
//
// Chains: PutStart's parent_key is the block before keys[0] and keys[i+1]
// extends keys[i]. A block is reachable (an engine's Load, which uses the
// leading run of hits, gets to it) only through every block before it. At
// PutCommit each block is linked in the index to its parent (MetadataIndex:
// a 4-byte parent record number and a child count per entry), and the
// parent key is persisted with the object. A chain continued on another
// node (its parent's node was full or down) is cross-linked: eviction and
// recency on that node treat the block as a chain head, but losing its
// parent orphans it like any other descendant. Nothing unreachable is stored:
// PutStart refuses (FailedPrecondition) a parent_key that is neither committed
// nor being put, and PutCommit frees, instead of committing, a block whose
// parent is not committed by then (its write failed, or the parent was
// removed). A block whose parent is still in another pending put (two puts of
// one chain racing) is committed unlinked and linked when that parent commits
// (MetadataIndex::Adopt), or removed if its put ends without it. A put's
// parent is pinned (not evicted) until the put ends.

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/capability.h"
#include "common/status_reason.h"
#include "master/master_service_internal.h"
#include "master/replica_key.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::PrintableKey;
using internal::ToProto;

}  // namespace

void MasterService::ReleasePut(uint64_t put_id, bool free_space) {
  auto it = pending_.find(put_id);
  if (it == pending_.end()) return;
  PendingPut put = std::move(it->second);
  pending_.erase(it);
  if (put.token != 0) pending_tokens_.erase(put.token);
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
    for (const std::string& child : children) index_->Adopt(child, key);
    return;
  }
  MetadataMutation m;
  for (std::string& child : children) {
    if (index_->Find(child)) m.delete_objects.push_back(std::move(child));
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) {
    LOG(WARNING) << "cannot remove " << m.delete_objects.size()
                 << " blocks whose parent was never committed: " << s;
    return;
  }
  for (const std::string& child : m.delete_objects) {
    auto e = index_->Erase(child);
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
    *why = absl::StrCat(who, " has ", pending_slots,
                        " objects in pending puts (limit ",
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
  if (auto n = nodes_.find(put.node_id); n != nodes_.end()) {
    uint32_t& in_flight = n->second.puts_in_flight;
    in_flight = delta > 0 ? in_flight + 1 : in_flight - std::min(in_flight, 1u);
  }
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

absl::Status MasterService::ValidatePutStart(
    const v1::PutStartRequest& request) const {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  if (request.lengths_size() != request.keys_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.keys_size(), " keys but ", request.lengths_size(), " lengths"));
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
  return absl::OkStatus();
}

absl::StatusOr<MasterService::PutPlan> MasterService::ClassifyPutKeysLocked(
    const v1::PutStartRequest& request, absl::Time now,
    v1::PutStartResponse* response) const {
  PutPlan plan;
  plan.preferred = request.preferred_node_id();
  plan.requested = plan.preferred != 0;
  if (plan.preferred != 0 && nodes_.count(plan.preferred) == 0) {
    return absl::NotFoundError(
        absl::StrCat("preferred node ", plan.preferred, " is unknown"));
  }
  plan.exclude = request.relocate_from_node();
  plan.replica = request.replica();
  if (plan.replica && plan.exclude != 0) {
    return absl::InvalidArgumentError(
        "PutStart: replica and relocate_from_node do not go together");
  }
  const auto& copied_generations = request.copied_generations();
  if (!copied_generations.empty() &&
      (!plan.replica || copied_generations.size() != request.keys_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PutStart: copied_generations (", copied_generations.size(),
        ") needs replica and one generation per key (", request.keys_size(),
        ")"));
  }
  if (plan.exclude != 0 && nodes_.count(plan.exclude) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "relocation: node ", plan.exclude, " (relocate_from_node) is unknown"));
  }
  if (plan.replica) {
    // The copies go to another node than the one the keys are on.
    for (const std::string& key : request.keys()) {
      if (auto e = index_->Find(key)) {
        plan.exclude = e->node_id;
        break;
      }
    }
  }
  if (plan.exclude != 0 || plan.replica) {
    plan.copied.assign(request.keys_size(), 0);
  }
  // Keys this call must not evict: its parent and the keys it reports as
  // existing (the caller relies on their locations).
  if (!request.parent_key().empty()) {
    plan.keep.insert(request.parent_key());
    auto e = index_->Find(request.parent_key());
    if (!e && !pending_keys_.contains(request.parent_key())) {
      // No reader could reach blocks after a missing one (see Chains).
      return absl::FailedPreconditionError(
          absl::StrCat("parent_key '", PrintableKey(request.parent_key()),
                       "' is not stored: the blocks after it would be "
                       "unreachable"));
    }
    if (plan.replica) {
      // After the copy of the block before: a chain's copies together.
      e = index_->Find(ReplicaKeyOf(request.parent_key()));
    }
    if (e && plan.preferred == 0 && e->node_id != plan.exclude) {
      auto n = nodes_.find(e->node_id);
      if (n != nodes_.end() && IsPlaceable(n->second, now)) {
        plan.preferred = e->node_id;
      }
    }
  }

  // Classify the keys.
  for (int i = 0; i < request.keys_size(); ++i) {
    v1::PutSlot* slot = response->add_slots();
    const std::string& key = request.keys(i);
    if (plan.replica) {
      // A copy of what is listed, of the caller's length, not there yet.
      auto e = index_->Find(key);
      if (!e || e->node_id != plan.exclude || e->length != request.lengths(i)) {
        slot->set_state(v1::SLOT_NOT_ON_NODE);
        continue;
      }
      const std::string copy = ReplicaKeyOf(key);
      if (pending_keys_.contains(copy)) {
        slot->set_state(v1::SLOT_IN_PROGRESS);
        continue;
      }
      if (auto c = index_->Find(copy)) {
        auto n = nodes_.find(c->node_id);
        if (n != nodes_.end() && MayComeBack(n->second, now)) {
          slot->set_state(v1::SLOT_EXISTS);
          ToProto(*c, slot->mutable_location());
          continue;
        }
      }
      // Stored again since the caller read the bytes it copies.
      if (!copied_generations.empty() && copied_generations[i] != 0 &&
          copied_generations[i] != e->generation) {
        slot->set_state(v1::SLOT_NOT_ON_NODE);
        continue;
      }
      plan.copied[i] = e->generation;
    } else if (pending_keys_.contains(key)) {
      slot->set_state(v1::SLOT_IN_PROGRESS);
      continue;
    } else if (plan.exclude != 0) {
      // Relocation: a copy of what the source node lists, nothing else.
      auto e = index_->Find(key);
      if (!e || e->node_id != plan.exclude) {
        slot->set_state(v1::SLOT_NOT_ON_NODE);
        continue;
      }
      plan.copied[i] = e->generation;
      if (index_->copy_count() > 0) {
        if (auto c = index_->Find(ReplicaKeyOf(key))) {
          plan.AvoidCopyNode(c->node_id);
        }
      }
    } else if (auto e = index_->Find(key)) {
      auto n = nodes_.find(e->node_id);
      // A node that is only briefly unavailable (re-registering after a
      // master restart, or reconciling) keeps its keys: storing one
      // elsewhere would replace it, and the blocks after it on that node
      // would be dropped with it.
      if (n != nodes_.end() && MayComeBack(n->second, now)) {
        slot->set_state(v1::SLOT_EXISTS);
        plan.keep.insert(key);
        v1::Location* loc = slot->mutable_location();
        ToProto(*e, loc);
        continue;
      }
      // Committed on a dead node: a miss for readers, so it may be written
      // again; the commit replaces the old entry.
    }
    slot->set_state(v1::SLOT_ALLOCATED);
    plan.to_allocate.push_back(i);
    plan.lengths.push_back(request.lengths(i));
    plan.total_bytes += request.lengths(i);
  }
  return plan;
}

MasterService::NodeChoice MasterService::ChooseNodeLocked(
    const PutPlan& plan, absl::string_view caller, absl::string_view tenant,
    absl::Time now) {
  // One node for the whole request, among those where the caller's pending
  // puts leave room for it (checked before anything is evicted), in the
  // order RankNodes gives (master/placement.h).
  NodeChoice c;
  const PlacementOptions& po = options_.placement;
  const bool named_tenant = tenant != kDefaultTenantName;
  std::vector<Node*> nodes;
  std::vector<PlacementCandidate> candidates;
  size_t round_robin_start = 0;
  for (auto& [id, node] : nodes_) {
    if (id == plan.exclude) continue;  // a relocation's source, a copy's block
    if (!IsAlive(node, now)) {
      if (!node.deregistered && (!node.registered || node.needs_reconcile) &&
          now - node.last_seen <= options_.node_timeout) {
        ++c.rejoining;
      }
      continue;
    }
    if (node.info.draining()) {
      ++c.draining;
      continue;
    }
    if (!IsPlaceable(node, now)) {
      ++c.unproven;
      continue;
    }
    ++c.alive;
    PlacementCandidate pc;
    pc.node_id = id;
    for (const auto& [rid, region] : node.regions) {
      pc.capacity_bytes += region.info.capacity_bytes();
      pc.used_bytes += region.allocator->used_bytes();
    }
    pc.traffic = node.traffic.PerSecond(now, po.load_half_life);
    pc.puts_in_flight = node.puts_in_flight;
    pc.tenant_bytes = named_tenant ? index_->TenantBytesOnNode(tenant, id) : 0;
    pc.chain_node = id == plan.preferred && !plan.requested;
    pc.requested = id == plan.preferred && plan.requested;
    pc.holds_copy = std::find(plan.copy_nodes.begin(), plan.copy_nodes.end(),
                              id) != plan.copy_nodes.end();
    if (id <= last_placed_node_) round_robin_start = candidates.size() + 1;
    nodes.push_back(&node);
    candidates.push_back(pc);
  }
  const PlacementRanking ranking = RankNodes(
      po, candidates, plan.total_bytes, named_tenant,
      named_tenant ? index_->UsageOf(tenant).bytes : 0, round_robin_start);
  c.chain_spilled = ranking.chain_spilled;
  c.tenant_share_ignored = ranking.tenant_share_ignored;
  for (size_t i : ranking.order) {
    Node& node = *nodes[i];
    if (!CallerMayPut(caller, node, plan.to_allocate.size(), plan.total_bytes,
                      &c.over_limit)) {
      continue;
    }
    // With no room anywhere, evict on the chain's (or requested) node: a
    // full cluster gains no balance from splitting the chain.
    if (c.target == nullptr || node.info.node_id() == plan.preferred) {
      c.target = &node;
    }
    if (TryAllocateOnNode(node, plan.lengths, &c.placed)) {
      c.chosen = &node;
      break;
    }
  }
  return c;
}

double MasterService::PlacementImbalanceLocked(absl::Time now) const {
  std::vector<uint64_t> used;
  for (const auto& [id, node] : nodes_) {
    if (!IsAlive(node, now)) continue;
    uint64_t u = 0;
    for (const auto& [rid, region] : node.regions) {
      u += region.allocator->used_bytes();
    }
    used.push_back(u);
  }
  return PlacementImbalance(used);
}

absl::StatusOr<MasterService::Node*> MasterService::EvictAndPlaceLocked(
    const PutPlan& plan, NodeChoice* choice, absl::Time now) {
  if (choice->chosen != nullptr) return choice->chosen;
  if (choice->alive == 0 && choice->rejoining > 0) {
    // Right after an election or a restart: the nodes come back within a
    // heartbeat or two; the caller retries instead of dropping the put.
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "no storage node has rejoined this master yet (", choice->rejoining,
            " known alive are re-registering or reconciling); retry shortly")),
        StatusReason::kNodesRejoining);
  }
  if (choice->alive == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no alive storage node to place ", plan.to_allocate.size(),
        " objects (", nodes_.size(), " nodes known",
        choice->draining > 0
            ? absl::StrCat(", ", choice->draining, " alive but draining")
            : "",
        choice->unproven > 0
            ? absl::StrCat(", ", choice->unproven,
                           " registered but not yet heartbeating")
            : "",
        ")"));
  }
  if (choice->target == nullptr) {
    ++counters_.puts_over_caller_limit;
    LOG_EVERY_N(WARNING, 1000) << "PutStart refused: " << choice->over_limit;
    return absl::ResourceExhaustedError(choice->over_limit);
  }
  std::string why;
  absl::StatusOr<bool> fit = EvictAndAllocate(
      *choice->target, plan.lengths, plan.keep, now, &choice->placed, &why);
  if (!fit.ok()) return fit.status();
  if (!*fit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no alive storage node has room for ", plan.to_allocate.size(),
        " objects totalling ", plan.total_bytes, " bytes; eviction on node ",
        choice->target->info.node_id(), ": ", why));
  }
  return choice->target;
}

absl::StatusOr<v1::PutStartResponse> MasterService::PutStart(
    const v1::PutStartRequest& request, absl::string_view caller,
    const TenantLimit& quota, bool* over_quota) {
  absl::Status s = ValidatePutStart(request);
  if (!s.ok()) return s;

  v1::PutStartResponse response;
  MutexLock l(&mu_);
  if (request.put_token() != 0 &&
      pending_tokens_.contains(request.put_token())) {
    return absl::AlreadyExistsError(
        absl::StrCat("PutStart: put_token ", request.put_token(),
                     " already names a pending put"));
  }
  const absl::Time now = clock_->Now();
  absl::StatusOr<PutPlan> plan = ClassifyPutKeysLocked(request, now, &response);
  if (!plan.ok()) return plan.status();
  if (plan->to_allocate.empty()) return response;

  const std::string tenant(TenantOfKey(request.keys(0)));
  if (quota.limited()) {
    const uint64_t refused = counters_.puts_over_tenant_quota;
    absl::Status room =
        MakeRoomInTenant(tenant, quota, plan->to_allocate.size(),
                         plan->total_bytes, plan->keep, now);
    if (over_quota != nullptr) {
      *over_quota = counters_.puts_over_tenant_quota != refused;
    }
    if (!room.ok()) return room;
  }

  NodeChoice choice = ChooseNodeLocked(*plan, caller, tenant, now);
  absl::StatusOr<Node*> chosen = EvictAndPlaceLocked(*plan, &choice, now);
  if (!chosen.ok()) return chosen.status();
  (*chosen)->traffic.Add(plan->total_bytes, now,
                         options_.placement.load_half_life);
  if (choice.chain_spilled && (*chosen)->info.node_id() != plan->preferred) {
    ++counters_.placements_spilled;
  }
  if (choice.tenant_share_ignored) ++counters_.placements_over_tenant_share;
  const std::vector<std::pair<uint32_t, uint64_t>>& placed = choice.placed;
  const uint32_t node_id = (*chosen)->info.node_id();

  PendingPut put;
  put.caller = std::string(caller);
  put.tenant = tenant;
  put.bytes = plan->total_bytes;
  put.node_id = node_id;
  put.key_count = static_cast<uint32_t>(request.keys_size());
  put.parent_key = request.parent_key();
  put.expiry = now + options_.put_timeout;
  put.token = request.put_token();
  put.relocate_from = plan->replica ? 0 : plan->exclude;
  put.replica = plan->replica;
  put.slots.reserve(plan->to_allocate.size());
  for (size_t j = 0; j < plan->to_allocate.size(); ++j) {
    auto gen = store_->NextGeneration();
    if (!gen.ok()) {
      for (const auto& [rid, addr] : placed) FreeSpace(node_id, rid, addr);
      return gen.status();
    }
    const int i = plan->to_allocate[j];
    PendingSlot slot{static_cast<uint32_t>(i),
                     request.keys(i),
                     i == 0 ? request.parent_key() : request.keys(i - 1),
                     placed[j].first,
                     placed[j].second,
                     request.lengths(i),
                     *gen};
    if (plan->replica) {
      // The copy links to the copy of the block before it, where that is
      // stored or being stored; else it heads a chain of copies.
      slot.key = ReplicaKeyOf(slot.key);
      slot.parent = slot.parent.empty() ? "" : ReplicaKeyOf(slot.parent);
      if (!slot.parent.empty() && !index_->Find(slot.parent) &&
          !pending_keys_.contains(slot.parent) &&
          (put.slots.empty() || put.slots.back().key != slot.parent)) {
        slot.parent.clear();
      }
      slot.copied_generation = plan->copied[i];
    } else if (plan->exclude != 0) {
      // A relocated block keeps the parent it is linked to.
      slot.parent = index_->ParentOf(slot.key);
      slot.copied_generation = plan->copied[i];
    }
    v1::Location* loc = response.mutable_slots(i)->mutable_location();
    ToProto(slot.location(node_id), loc);
    Grant(**chosen, *loc, wire::kCapWrite, put.expiry,
          response.mutable_slots(i)->mutable_capability());
    put.slots.push_back(std::move(slot));
  }
  const uint64_t put_id = next_put_id_++;
  if (next_put_id_ == 0) next_put_id_ = 1;
  for (const PendingSlot& slot : put.slots) pending_keys_[slot.key] = put_id;
  if (!put.parent_key.empty()) ++pending_parents_[put.parent_key];
  response.set_expires_unix_ms(absl::ToUnixMillis(put.expiry));
  CountCallerPending(put, +1);
  if (put.token != 0) pending_tokens_[put.token] = put_id;
  pending_.emplace(put_id, std::move(put));
  last_placed_node_ = node_id;
  response.set_put_id(put_id);
  FillNodeInfo(**chosen, now, response.mutable_node());
  return response;
}

absl::Status MasterService::CheckReceipts(
    const PendingPut& put, const absl::flat_hash_set<uint32_t>& failed,
    const v1::PutCommitRequest& request) const {
  auto n = nodes_.find(put.node_id);
  if (n == nodes_.end() || !n->second.mac) {
    // PutStart placed on a keyed node; one gone since cancelled its puts.
    return WithReason(absl::PermissionDeniedError(absl::StrCat(
                          "PutCommit: node ", put.node_id,
                          " has no key to check write receipts with")),
                      StatusReason::kWriteReceiptInvalid);
  }
  const HmacSha256& key = *n->second.mac;
  for (const PendingSlot& slot : put.slots) {
    if (failed.contains(slot.index)) continue;
    WriteReceiptScope scope;
    scope.node_id = put.node_id;
    scope.region_id = slot.region_id;
    scope.addr = slot.addr;
    scope.length = slot.length;
    scope.generation = slot.generation;
    const bool given = static_cast<int>(slot.index) < request.receipts_size();
    if (!given || !IsWriteReceipt(key, scope, request.receipts(slot.index))) {
      return WithReason(
          absl::PermissionDeniedError(absl::StrCat(
              "PutCommit: key ", PrintableKey(slot.key), " (index ", slot.index,
              ") has ",
              given && !request.receipts(slot.index).empty() ? "a wrong" : "no",
              " write receipt from node ", put.node_id, " (region ",
              slot.region_id, " addr ", slot.addr, " generation ",
              slot.generation,
              "): the node never confirmed those bytes; nothing committed")),
          StatusReason::kWriteReceiptInvalid);
    }
  }
  return absl::OkStatus();
}

void MasterService::SlotsToCommitLocked(
    uint64_t put_id, const PendingPut& put,
    const absl::flat_hash_set<uint32_t>& failed,
    std::vector<const PendingSlot*>* to_commit,
    std::vector<const PendingSlot*>* waiting, uint32_t* unreachable) const {
  absl::flat_hash_set<absl::string_view> committing;
  for (const PendingSlot& slot : put.slots) {
    if (failed.contains(slot.index)) continue;
    if (!slot.parent.empty() && !committing.contains(slot.parent) &&
        !index_->Find(slot.parent)) {
      auto other = pending_keys_.find(slot.parent);
      if (other == pending_keys_.end() || other->second == put_id) {
        ++*unreachable;
        continue;
      }
      waiting->push_back(&slot);
    }
    committing.insert(slot.key);
    to_commit->push_back(&slot);
  }
}

uint32_t MasterService::SkipChangedCopiesLocked(
    PendingPut* put, absl::flat_hash_set<uint32_t>* failed) const {
  if (put->relocate_from == 0 && !put->replica) return 0;
  uint32_t skipped = 0;
  for (PendingSlot& slot : put->slots) {
    if (failed->contains(slot.index)) continue;
    auto e = index_->Find(put->replica ? PrimaryKeyOf(slot.key)
                                       : absl::string_view(slot.key));
    if (!e || e->generation != slot.copied_generation ||
        (!put->replica && e->node_id != put->relocate_from)) {
      // Removed, evicted or stored again since PutStart: its copy is stale.
      failed->insert(slot.index);
      ++skipped;
      continue;
    }
    if (!put->replica) slot.parent = index_->ParentOf(slot.key);  // as now
  }
  return skipped;
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
      return absl::InvalidArgumentError(absl::StrCat("failed index ", idx,
                                                     " out of range (put has ",
                                                     put.key_count, " keys)"));
    }
    failed.insert(idx);
  }
  if (options_.require_write_receipts) {
    absl::Status r = CheckReceipts(put, failed, request);
    if (!r.ok()) {
      // A client that commits what it did not write (a bug, or hostile):
      // nothing of the put becomes visible, and its space is freed.
      ReleasePut(request.put_id(), /*free_space=*/true);
      ++counters_.commits_refused_receipt;
      LOG_EVERY_N(WARNING, 100) << "PutCommit refused: " << r;
      return r;
    }
  }

  // A relocation or a replica copies only listings that are still the ones
  // PutStart saw.
  const uint32_t skipped = SkipChangedCopiesLocked(&put, &failed);

  // The slots to commit, in chain order: a slot whose parent is neither
  // committed nor committed by this put would be unreachable.
  const absl::Time now = clock_->Now();
  std::vector<const PendingSlot*> to_commit;
  std::vector<const PendingSlot*> waiting;  // parent in another pending put
  uint32_t unreachable = 0;
  SlotsToCommitLocked(request.put_id(), put, failed, &to_commit, &waiting,
                      &unreachable);
  MetadataMutation m;
  for (const PendingSlot* slot : to_commit) {
    ObjectRecord record{slot->location(put.node_id)};
    record.last_use_ms = static_cast<uint64_t>(absl::ToUnixMillis(now));
    record.parent_key = slot->parent;
    m.put_objects.emplace_back(slot->key, std::move(record));
  }
  // A key stored anew (not moved, not a copy) may have new bytes: a copy of
  // its earlier bytes goes (master/replica_key.h).
  const size_t first_stale_copy = m.delete_objects.size();
  if (put.relocate_from == 0 && !put.replica) {
    for (const PendingSlot* slot : to_commit) {
      std::string copy = ReplicaKeyOf(slot->key);
      if (index_->Find(copy)) m.delete_objects.push_back(std::move(copy));
    }
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) return s;  // nothing changed; the put stays pending
  for (size_t k = first_stale_copy; k < m.delete_objects.size(); ++k) {
    if (auto gone = index_->Erase(m.delete_objects[k])) {
      FreeSpace(gone->node_id, gone->region_id, gone->addr);
      CountObject(*gone, -1);
    }
  }

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
    auto old = index_->Upsert(slot.key, e, slot.parent);
    if (!old.ok()) {
      // Keys and lengths were validated at PutStart.
      LOG(DFATAL) << "index rejected committed key: " << old.status();
      FreeSpace(put.node_id, slot.region_id, slot.addr);
      continue;
    }
    if (old->has_value()) {
      // Replaced an entry on a dead node, or relocated one.
      const ObjectLocation& o = **old;
      FreeSpace(o.node_id, o.region_id, o.addr);
      CountObject(o, -1);
      if (put.relocate_from != 0) ++counters_.objects_relocated;
    }
    if (put.replica) ++counters_.replicas_stored;
    CountObject(e, +1);
    EmitStoredLocked(slot.key, slot.parent, e);
    ++committed;
  }
  counters_.commits_unreachable += unreachable;
  counters_.relocations_skipped += skipped;
  if (m.delete_objects.size() > first_stale_copy) SweepOrphansLocked();
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
  if (put.token != 0) pending_tokens_.erase(put.token);
  pending_.erase(it);
  v1::PutCommitResponse response;
  response.set_committed(committed);
  return response;
}

absl::StatusOr<v1::PutAbortResponse> MasterService::PutAbort(
    const v1::PutAbortRequest& request) {
  MutexLock l(&mu_);
  uint64_t put_id = request.put_id();
  if (put_id == 0 && request.put_token() != 0) {
    auto t = pending_tokens_.find(request.put_token());
    if (t == pending_tokens_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "put with token ", request.put_token(), " expired or unknown"));
    }
    put_id = t->second;
  }
  if (!pending_.contains(put_id)) {
    return absl::NotFoundError(
        absl::StrCat("put ", put_id, " expired or unknown"));
  }
  ReleasePut(put_id, /*free_space=*/true);
  return v1::PutAbortResponse();
}

}  // namespace master
}  // namespace hymcache
