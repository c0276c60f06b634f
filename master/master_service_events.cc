// KV events and prefix queries for routers (docs/deployment.md, "KV
// events"): what a cache-aware router needs to know which blocks exist
// where.
//
// Events: every block committed (PutCommit) is a BLOCK_STORED event with
// its parent, node and tier; every key that leaves the index, however it
// goes (Remove, eviction, a tenant's quota, an orphaned tail, a
// reconciliation or read repair that drops it, its node purged or
// forgotten, a new copy replacing one on a dead node), is a BLOCK_REMOVED
// event, reported by MetadataIndex's removal listener as it goes; nodes
// registering or heartbeating again are NODE_UP, nodes found dead or
// deregistering NODE_DOWN. Events are appended under the service's lock,
// so their order is the order the changes were applied in. The EventLog
// (master/event_log.h) numbers and buffers them.
//
// PrefixQuery: the leading keys of a chain found on alive nodes, and per
// node the longest prefix it holds alone and how many of those blocks it
// holds; per engine that reports its own cache (ReportEngineBlocks,
// master/engine_caches.h), the leading keys that cache holds.

#include <algorithm>

#include "master/master_service.h"
#include "master/replica_key.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

void MasterService::EmitStoredLocked(const std::string& key,
                                     const std::string& parent,
                                     const ObjectLocation& e) const {
  if (events_->capacity() == 0) return;  // events off: no cost
  v1::KvEvent event;
  event.set_kind(v1::KvEvent::BLOCK_STORED);
  // A copy (master/replica_key.h) is its key stored on one more node.
  const bool copy = IsReplicaKey(key);
  event.set_key(std::string(copy ? PrimaryKeyOf(key) : key));
  event.set_parent_key(std::string(
      copy && IsReplicaKey(parent) ? PrimaryKeyOf(parent) : parent));
  event.set_node_id(e.node_id);
  if (auto n = nodes_.find(e.node_id); n != nodes_.end()) {
    if (auto r = n->second.regions.find(e.region_id);
        r != n->second.regions.end()) {
      event.set_tier(r->second.info.device_kind());
    }
  }
  event.set_tenant(std::string(TenantOfKey(key)));
  event.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  events_->Append(std::move(event));
}

void MasterService::EmitNode(v1::KvEvent::Kind kind, uint32_t node_id) const {
  if (events_->capacity() == 0) return;
  v1::KvEvent event;
  event.set_kind(kind);
  event.set_node_id(node_id);
  event.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  events_->Append(std::move(event));
}

void MasterService::ListenToIndexLocked() {
  if (events_->capacity() == 0) return;
  EventLog* log = events_.get();
  Clock* clock = clock_;
  index_->set_removal_listener(
      [log, clock](absl::string_view key, const ObjectLocation& at) {
        v1::KvEvent event;
        event.set_kind(v1::KvEvent::BLOCK_REMOVED);
        event.set_key(std::string(IsReplicaKey(key) ? PrimaryKeyOf(key) : key));
        event.set_node_id(at.node_id);
        event.set_tenant(std::string(TenantOfKey(key)));
        event.set_unix_ms(absl::ToUnixMillis(clock->Now()));
        log->Append(std::move(event));
      });
}

v1::WatchEventsResponse MasterService::WatchEvents(
    const v1::WatchEventsRequest& request) const {
  v1::WatchEventsResponse out;
  const size_t max =
      request.max_events() == 0
          ? 4096
          : std::min<size_t>(request.max_events(), 65536);
  events_->Read(request.stream_id(), request.after_sequence(), max, &out);
  return out;
}

absl::StatusOr<v1::PrefixQueryResponse> MasterService::PrefixQuery(
    const v1::PrefixQueryRequest& request) const {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  v1::PrefixQueryResponse out;
  const absl::Time now = clock_->Now();
  AnswerNodePrefixes(request, now, &out);
  // Engines' caches outside the service's lock (EngineCaches has its own).
  for (auto& [engine, n] : engine_caches_->LongestPrefixes(
           TenantOfKey(request.keys(0)), request.keys(), now)) {
    auto* ep = out.add_engines();
    ep->set_engine_id(std::move(engine));
    ep->set_longest_prefix(n);
  }
  return out;
}

void MasterService::AnswerNodePrefixes(const v1::PrefixQueryRequest& request,
                                       absl::Time now,
                                       v1::PrefixQueryResponse* out) const {
  ReaderMutexLock l(&mu_);
  // Per node: blocks held and the longest prefix held alone (a node's run
  // ends at the first key it does not hold).
  struct PerNode {
    uint32_t blocks = 0;
    uint32_t longest = 0;
    bool run = true;
  };
  std::map<uint32_t, PerNode> per_node;
  uint32_t hit = 0;
  for (const std::string& key : request.keys()) {
    auto e = index_->Find(key);
    if (!e) break;
    auto n = nodes_.find(e->node_id);
    if (n == nodes_.end() || !IsReadable(n->second, now)) break;
    // A node first seen here did not hold the keys before this one.
    PerNode& p = per_node.try_emplace(e->node_id, PerNode{0, 0, hit == 0})
                     .first->second;
    ++p.blocks;
    for (auto& [id, q] : per_node) {
      if (id != e->node_id) q.run = false;
    }
    if (p.run) p.longest = hit + 1;
    ++hit;
  }
  out->set_hit_prefix_length(hit);
  for (const auto& [id, p] : per_node) {
    auto* np = out->add_nodes();
    np->set_node_id(id);
    np->set_longest_prefix(p.longest);
    np->set_blocks(p.blocks);
  }
}

absl::StatusOr<v1::ReportEngineBlocksResponse>
MasterService::ReportEngineBlocks(
    absl::string_view tenant, const v1::ReportEngineBlocksRequest& request) {
  const size_t keys = request.removed_size() + request.stored_size();
  if (keys > options_.max_batch_keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReportEngineBlocks: ", keys, " keys in one report (at most ",
        options_.max_batch_keys, "; send a larger change as several)"));
  }
  for (const auto* list : {&request.removed(), &request.stored()}) {
    for (const std::string& k : *list) {
      if (k.empty() || k.size() > options_.max_key_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("ReportEngineBlocks: a key of ", k.size(),
                         " bytes (want 1..", options_.max_key_bytes, ")"));
      }
    }
  }
  EngineCaches::Report report;
  report.cleared = request.cleared();
  report.removed = &request.removed();
  report.stored = &request.stored();
  auto blocks =
      engine_caches_->Apply(tenant, request.engine_id(), report, clock_->Now());
  if (!blocks.ok()) return blocks.status();
  v1::ReportEngineBlocksResponse out;
  out.set_blocks(*blocks);
  out.set_ttl_ms(absl::ToInt64Milliseconds(options_.engine_caches.ttl));
  return out;
}

}  // namespace master
}  // namespace hymcache
