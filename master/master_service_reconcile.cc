// Reconciliation (the storage nodes are the truth about which bytes exist;
// the master's listings converge to them): a registration that keeps a
// node's listings (same incarnation: a restart of a persistent node, a
// master restart, a partition) asks the node to reconcile, and its objects
// are misses until it has. The node streams every readable extent it holds
// (BeginReconcile, Reconciliation::Add per chunk, FinishReconcile). Finish
// compares a chunk of the index at a time under the shared lock (a
// 1,000,000-object node does not stall lookups for the whole comparison),
// then applies the result under the exclusive lock: a listing the node does
// not hold exactly (region, addr, length, generation) is removed and its
// space freed, unless it changed meanwhile or was committed after
// BeginReconcile (the node's listing may have been taken before the write
// landed); a held extent the master neither
// lists nor has a pending put for is returned as unlisted for the node to
// free. No grace period is needed for the latter: every generation comes
// from this master's store, so an extent that is neither listed nor pending
// can never be committed (a PutCommit of an unknown put fails). Nodes also
// reconcile every `reconcile_interval` (anti-entropy), and a reader that a
// node refused reports the listing (ReportMissing), which drops it at once.

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "master/master_service_internal.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::ToProto;

// Extents in one ReconcileNode message.
constexpr int kMaxReconcileChunk = 65536;
// Index records compared per shared-lock hold during a reconciliation.
constexpr size_t kReconcileScanChunk = 65536;

// A reconciliation that lost the race with a newer one, a re-registration
// or a deregistration.
absl::Status Superseded(uint32_t node_id) {
  return absl::AbortedError(absl::StrCat(
      "reconciliation of node ", node_id,
      " was superseded (the node re-registered, left, or began another)"));
}

}  // namespace

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
  // The node is busy streaming its listing, not heartbeating (its
  // heartbeats and reconciliations share a thread): a proven call, so a
  // sign of life like a heartbeat, here and when the stream ends.
  node.last_seen = std::max(node.last_seen, clock_->Now());
  return ++node.reconcile_epoch;
}

bool MasterService::ReconcileSupersededLocked(const Reconciliation& r) const {
  auto n = nodes_.find(r.node_id_);
  return n == nodes_.end() || n->second.deregistered ||
         n->second.info.incarnation() != r.incarnation_ ||
         n->second.reconcile_epoch != r.epoch_;
}

absl::Status MasterService::CompareListings(Reconciliation* r,
                                            ReconcileScan* scan) {
  const uint32_t id = r->node_id_;
  for (uint32_t cursor = 0;;) {
    ReaderMutexLock l(&mu_);
    if (ReconcileSupersededLocked(*r)) return Superseded(id);
    const Node& node = nodes_.at(id);
    cursor = index_->ForEachFrom(
        cursor, kReconcileScanChunk,
        [&](absl::string_view key, const ObjectLocation& e)
            ABSL_NO_THREAD_SAFETY_ANALYSIS {
              if (e.node_id != id) return true;
              ++scan->listed;
              auto h = r->held_.find(e.generation);
              if (h != r->held_.end() && h->second.region_id == e.region_id &&
                  h->second.addr == e.addr && h->second.length == e.length) {
                ++scan->matched;
                r->held_.erase(h);
              } else if (node.committed_since_reconcile.contains(
                             e.generation)) {
                ++scan->skipped;
              } else {
                // Not held, or held with another range: the listing is
                // wrong (a mismatched extent stays in held_ and is freed
                // as unlisted).
                scan->candidates.emplace_back(std::string(key), e);
              }
              return true;
            });
    if (cursor >= index_->records_end()) break;
  }
  return absl::OkStatus();
}

uint64_t MasterService::AddUnlistedLocked(
    const Reconciliation& r, const Node& node,
    v1::ReconcileNodeResponse* response) const {
  const uint32_t id = r.node_id_;
  absl::flat_hash_set<uint64_t> pending_generations;
  for (const auto& [put_id, put] : pending_) {
    if (put.node_id != id) continue;
    for (const PendingSlot& slot : put.slots) {
      pending_generations.insert(slot.generation);
    }
  }
  uint64_t unlisted = 0;
  for (const auto& [generation, h] : r.held_) {
    if (pending_generations.contains(generation) ||
        node.committed_since_reconcile.contains(generation)) {
      continue;
    }
    ++unlisted;
    if (static_cast<uint32_t>(response->unlisted_size()) <
        options_.max_unlisted_per_reconcile) {
      v1::Location* loc = response->add_unlisted();
      ToProto(ObjectLocation{id, h.region_id, h.addr, h.length, generation},
              loc);
    }
  }
  return unlisted;
}

absl::StatusOr<v1::ReconcileNodeResponse> MasterService::FinishReconcile(
    std::unique_ptr<Reconciliation> r) {
  const uint32_t id = r->node_id_;
  // Phase 1: compare the listings with what the node holds, a chunk of the
  // index at a time under the shared lock, so lookups and commits proceed
  // in between. A listing committed after BeginReconcile is not judged (the
  // node may have listed its extents before the write landed); one that
  // changes between the chunks is checked again in phase 2.
  ReconcileScan scan;
  absl::Status compared = CompareListings(r.get(), &scan);
  if (!compared.ok()) return compared;
  const uint64_t listed = scan.listed, matched = scan.matched,
                 skipped = scan.skipped;

  // Phase 2, under the exclusive lock: drop the candidates that still name
  // the same object, and find the held extents neither listed nor pending.
  MutexLock l(&mu_);
  if (ReconcileSupersededLocked(*r)) return Superseded(id);
  Node& node = nodes_.at(id);
  v1::ReconcileNodeResponse response;
  response.set_held(r->held_.size() + matched);
  std::vector<std::string> doomed;
  for (const auto& [key, e] : scan.candidates) {
    auto now = index_->Find(key);
    if (now && *now == e &&
        !node.committed_since_reconcile.contains(e.generation)) {
      doomed.push_back(key);
    }
  }

  // Held extents neither listed nor pending.
  uint64_t unlisted = AddUnlistedLocked(*r, node, &response);

  if (!doomed.empty()) {
    absl::Status s = store_->DeleteObjects(doomed);
    if (!s.ok()) {
      node.reconciling = false;
      node.committed_since_reconcile.clear();
      return s;
    }
    for (const std::string& key : doomed) {
      auto e = index_->Erase(key);
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
  // Alive at once (placeable, and served if the listing took longer than
  // node_timeout to stream), rather than at the node's next heartbeat.
  node.last_seen = std::max(node.last_seen, clock_->Now());
  if (was_awaited || !doomed.empty() || unlisted > 0) {
    LOG(INFO) << "node " << id << " '" << node.info.name()
              << "' reconciled: listed " << listed << ", held "
              << response.held() << ", matched " << matched << ", dropped "
              << doomed.size() << " listings it does not hold, " << unlisted
              << " extents unlisted" << (was_awaited ? "; placing on it" : "");
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
    auto e = index_->Find(request.keys(i));
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
      auto e = index_->Erase(request.keys(i));
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

}  // namespace master
}  // namespace hymcache
