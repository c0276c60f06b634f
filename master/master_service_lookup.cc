// Removing a block that has descendants: Remove of a middle block would
// strand the blocks after it, so Remove cascades: the requested keys go,
// then every block, on any node, whose chain passed through one of them
// (the "orphans"; counted in orphans_removed, not reported per key). The
// same sweep follows listings dropped by reconciliation (whose response
// then returns the orphans' extents as unlisted, so the node frees them in
// that round) and by read repair, node purges and re-registrations that
// drop objects, and runs in ReapExpired for any other path (a sweep costs
// a walk of the affected node's objects, and happens only when a removal
// left orphans).

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/limits.h"
#include "master/master_service_internal.h"
#include "master/replica_key.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::ToProto;

// Most shared-prefix blocks whose reader was asked for copies and may still
// be storing them (copies_asked_).
constexpr size_t kMaxCopyAsks = 4096;

// MetadataIndex::Prefetch of the keys from `begin` on, when `begin` starts
// a window of kPrefetchKeys: the caller's Finds of them follow.
void PrefetchWindow(const MetadataIndex& index,
                    const google::protobuf::RepeatedPtrField<std::string>& keys,
                    int begin) {
  constexpr int kWindow = static_cast<int>(MetadataIndex::kPrefetchKeys);
  if (begin % kWindow != 0) return;
  absl::string_view window[kWindow];
  const int n = std::min(keys.size() - begin, kWindow);
  for (int k = 0; k < n; ++k) window[k] = keys[begin + k];
  index.Prefetch(absl::MakeConstSpan(window, n));
}

}  // namespace

std::vector<std::pair<std::string, ObjectLocation>>
MasterService::SweepOrphansLocked() {
  if (index_->ghost_count() == 0) return {};
  auto orphans = index_->Orphans();
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
    auto e = index_->Erase(key);
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  counters_.orphans_removed += orphans.size();
  VLOG(1) << "removed " << orphans.size()
          << " objects whose chain lost a block before them";
  return orphans;
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
  auto e = index_->Find(request.key());
  if (!e) return response;
  response.set_found(true);
  v1::Location* loc = response.mutable_location();
  ToProto(*e, loc);
  auto n = nodes_.find(e->node_id);
  if (n != nodes_.end()) FillNodeInfo(n->second, now, response.mutable_node());
  const std::optional<uint32_t> tick = index_->ReadTick(request.key());
  if (tick && *tick > 0) {
    const absl::Time read = ReadTimeOfTick(*tick);
    response.set_last_read_unix_ms(absl::ToUnixMillis(read));
    if (read + options_.read_lease > now) {
      response.set_lease_expires_unix_ms(
          absl::ToUnixMillis(read + options_.read_lease));
    }
  }
  if (auto chain = index_->Chain(request.key())) {
    response.set_parent_key(chain->parent);
    response.set_parent_on_other_node(chain->cross);
    response.set_children(chain->children);
    response.set_cross_children(chain->cross_children);
    response.set_unreachable(chain->orphan);
  }
  return response;
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
  if (request.reader_host().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BatchLookup: reader_host of ", request.reader_host().size(),
        " bytes (want at most ", kMaxHostBytes, ")"));
  }
  if (request.for_read() && request.ended()) {
    return absl::InvalidArgumentError(
        "BatchLookup: a lookup for reading cannot end its chain (for_read "
        "with ended)");
  }
  if (request.next_turn() && !request.for_read()) {
    return absl::InvalidArgumentError(
        "BatchLookup: a think-time hint's lookup reads its chain (next_turn "
        "without for_read)");
  }
  if (request.exists_only()) {
    if (request.for_read() || request.ended()) {
      return absl::InvalidArgumentError(
          "BatchLookup: an existence check neither reads nor ends a chain "
          "(exists_only with for_read or ended)");
    }
    ReaderMutexLock l(&mu_);
    ExistsLocked(request, clock_->Now(), response);
    return absl::OkStatus();
  }
  response->mutable_results()->Reserve(request.keys_size());
  if (request.ended()) {
    MutexLock l(&mu_);
    LookupLocked(request, clock_->Now(), response);
    std::vector<absl::string_view> keys(request.keys().begin(),
                                        request.keys().end());
    counters_.ended_chain_blocks_demoted += index_->DemoteChain(keys);
    if (options_.eviction_policy == EvictionPolicy::kCost) {
      LearnReturnsLocked(request, 0, clock_->Now(), 0, 0);
    }
    return absl::OkStatus();
  }
  if (!request.for_read()) {
    ReaderMutexLock l(&mu_);
    LookupLocked(request, clock_->Now(), response);
    return absl::OkStatus();
  }
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint32_t> hit_records;
  std::vector<std::pair<uint32_t, uint64_t>> read_bytes;
  SharedPrefix shared;
  LookupLocked(request, now, response, &hit_records, &read_bytes,
               options_.auto_replica_branches > 0 ? &shared : nullptr);
  if (AskForCopiesLocked(shared, now)) {
    response->set_copy_prefix_length(shared.end);
    ++counters_.auto_copies_asked;
  }
  // What the caller is about to read, as each node's recent traffic
  // (placement weighs it, master/placement.h).
  for (const auto& [node_id, bytes] : read_bytes) {
    auto n = nodes_.find(node_id);
    if (n != nodes_.end()) {
      n->second.traffic.Add(bytes, now, options_.placement.load_half_life);
    }
  }
  // The chain head ends up most recent, each block just below the one
  // before it (MetadataIndex::TouchPrefix).
  const uint32_t tick = LeaseTick(now);
  const uint32_t before = index_->TouchRecords(hit_records, tick);
  if (options_.eviction_policy == EvictionPolicy::kCost) {
    LearnReturnsLocked(request, response->hit_prefix_length(), now, before,
                       tick);
  }
  return absl::OkStatus();
}

void MasterService::LearnReturnsLocked(const v1::BatchLookupRequest& request,
                                       uint32_t hits, absl::Time now,
                                       uint32_t before, uint32_t tick) {
  counters_.turns_not_returned += returns_.awaiting().Expire(now);
  if (request.ended()) {
    // Those it names will not come back.
    for (const std::string& key : request.keys()) {
      if (returns_.awaiting().empty()) break;
      if (returns_.awaiting().Ended(key)) ++counters_.turns_not_returned;
    }
    return;
  }
  if (request.next_turn()) {
    // The conversation answered; its chain, as far as stored, awaits the
    // next turn. Not a return: the hint follows the turn's own read.
    if (hits > 0) {
      const std::string& last = request.keys(hits - 1);
      returns_.AwaitTurn(TenantOfKey(last), last, now);
    }
    return;
  }
  if (before != 0 && before < tick) {
    // The chain came back after this long: the tenant's return gaps
    // (master/eviction_cost.h).
    returns_.ObserveGap(TenantOfKey(request.keys(0)),
                        absl::Milliseconds(int64_t{tick} - before));
  }
  // A turn that came back: a read of the key its hint marked (found or
  // not: an evicted tail still came back).
  for (const std::string& key : request.keys()) {
    if (returns_.awaiting().empty()) break;
    if (returns_.awaiting().Returned(key)) ++counters_.turns_returned;
  }
}

bool MasterService::AskForCopiesLocked(const SharedPrefix& shared,
                                       absl::Time now) {
  if (shared.end == 0 || shared.first_uncopied >= shared.end) return false;
  // One reader at a time per block: the first one asked stores the copies
  // within a put's lifetime, or the next reader is asked.
  auto [it, fresh] = copies_asked_.try_emplace(shared.block);
  if (!fresh && it->second > now) return false;
  it->second = now + options_.put_timeout;
  if (fresh && copies_asked_.size() > kMaxCopyAsks) {
    // Bounded: lapsed asks go (each lasts a put_timeout, so they are few
    // unless many prefixes are read at once; then the oldest are dropped
    // too, and at worst a prefix is asked for twice).
    absl::erase_if(copies_asked_,
                   [&](const auto& a) { return a.second <= now; });
    while (copies_asked_.size() > kMaxCopyAsks) {
      auto victim = copies_asked_.begin();
      if (victim->first == shared.block) ++victim;
      copies_asked_.erase(victim);
    }
  }
  return true;
}

void MasterService::ExistsLocked(const v1::BatchLookupRequest& request,
                                 absl::Time now,
                                 v1::BatchLookupResponse* out) const {
  std::string* bits = out->mutable_found_bits();
  bits->assign((request.keys_size() + 7) / 8, '\0');
  bool prefix = true;
  uint32_t hit_prefix = 0;
  for (int i = 0; i < request.keys_size(); ++i) {
    PrefetchWindow(*index_, request.keys(), i);
    auto e = index_->Find(request.keys(i));
    bool found = false;
    if (e) {
      auto n = nodes_.find(e->node_id);
      found = n != nodes_.end() && IsReadable(n->second, now);
    }
    if (!found && (e || prefix)) {
      uint32_t record;
      found = ReadableCopyLocked(request.keys(i), now, &record).has_value();
    }
    if (!found) {
      prefix = false;
      continue;
    }
    (*bits)[i / 8] = static_cast<char>((*bits)[i / 8] | (1 << (i % 8)));
    if (prefix) ++hit_prefix;
  }
  out->set_hit_prefix_length(hit_prefix);
}

uint32_t MasterService::LookupLocked(
    const v1::BatchLookupRequest& request, absl::Time now,
    v1::BatchLookupResponse* out, std::vector<uint32_t>* hit_records,
    std::vector<std::pair<uint32_t, uint64_t>>* read_bytes_by_node,
    SharedPrefix* shared) const {
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
  // Only a cluster holding copies (master/replica_key.h) looks for them.
  const bool copies = index_->copy_count() > 0;
  CopyChooser chooser(options_.placement.load_half_life, now);
  const std::string& reader_host = request.reader_host();
  auto on_reader_host = [&reader_host](const Node& n) {
    return !reader_host.empty() && n.info.host() == reader_host;
  };
  for (int i = 0; i < request.keys_size(); ++i) {
    v1::LookupResult* result = packed ? nullptr : response.add_results();
    PrefetchWindow(*index_, request.keys(), i);
    uint32_t record;
    auto e = index_->Find(request.keys(i), &record);
    const bool block_found = e.has_value();
    const uint32_t block_record = record;
    bool has_copy = false;
    const Node* node = nullptr;
    if (e) {
      auto n = nodes_.find(e->node_id);
      if (n != nodes_.end() && IsReadable(n->second, now)) node = &n->second;
    }
    uint32_t also_record = 0;  // the other copy's, read too: kept as recent
    bool also = false;
    if (copies && (e || prefix)) {
      uint32_t copy_record;
      if (auto c = ReadableCopyLocked(request.keys(i), now, &copy_record)) {
        has_copy = true;
        const Node* copy_node = &nodes_.at(c->node_id);
        if (node == nullptr) {
          // Its node is not readable (or, while the prefix holds, it is
          // gone): the copy answers.
          e = c;
          node = copy_node;
          record = copy_record;
        } else if (chooser.PrefersCopy(
                       {c->node_id, &copy_node->traffic,
                        on_reader_host(*copy_node)},
                       {e->node_id, &node->traffic, on_reader_host(*node)})) {
          // Both readable: the less loaded node serves this key.
          also_record = record;
          also = true;
          e = c;
          node = copy_node;
          record = copy_record;
        } else {
          also_record = copy_record;
          also = true;
        }
      }
    }
    if (node == nullptr) {
      prefix = false;
      continue;  // not found: a zero record, an empty result
    }
    if (copies) chooser.Served(e->node_id, e->length);
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
      if (shared != nullptr) {
        if (!has_copy && shared->first_uncopied == SharedPrefix::kNone) {
          shared->first_uncopied = hit_prefix;
        }
        if (block_found &&
            index_->Branches(block_record) >= options_.auto_replica_branches) {
          shared->end = hit_prefix + 1;
          shared->block = request.keys(i);
        }
      }
      ++hit_prefix;
      if (hit_records != nullptr) {
        hit_records->push_back(record);
        if (also) hit_records->push_back(also_record);
      }
      if (read_bytes_by_node != nullptr) {
        auto r =
            std::find_if(read_bytes_by_node->begin(), read_bytes_by_node->end(),
                         [&](const auto& p) { return p.first == e->node_id; });
        if (r == read_bytes_by_node->end()) {
          read_bytes_by_node->emplace_back(e->node_id, e->length);
        } else {
          r->second += e->length;
        }
      }
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

std::optional<ObjectLocation> MasterService::ReadableCopyLocked(
    absl::string_view key, absl::Time now, uint32_t* record) const {
  auto c = index_->Find(ReplicaKeyOf(key), record);
  if (!c) return std::nullopt;
  auto n = nodes_.find(c->node_id);
  if (n == nodes_.end() || !IsReadable(n->second, now)) return std::nullopt;
  return c;
}

absl::StatusOr<v1::RemoveResponse> MasterService::Remove(
    const v1::RemoveRequest& request) {
  absl::Status s = ValidateKeys(request.keys());
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  MetadataMutation m;
  std::vector<std::string> copies;  // the keys' copies (replica_key.h)
  for (const std::string& key : request.keys()) {
    if (index_->Find(key)) m.delete_objects.push_back(key);
    std::string copy = ReplicaKeyOf(key);
    if (index_->Find(copy)) {
      m.delete_objects.push_back(copy);
      copies.push_back(std::move(copy));
    }
  }
  s = store_->Apply(m);
  if (!s.ok()) return s;
  v1::RemoveResponse response;
  for (const std::string& key : request.keys()) {
    auto e = index_->Erase(key);
    response.add_removed(e.has_value());
    if (!e) continue;
    FreeSpace(e->node_id, e->region_id, e->addr);
    CountObject(*e, -1);
  }
  for (const std::string& copy : copies) {
    if (auto e = index_->Erase(copy)) {
      FreeSpace(e->node_id, e->region_id, e->addr);
      CountObject(*e, -1);
    }
  }
  SweepOrphansLocked();  // the removed blocks' descendants
  return response;
}

bool MasterService::ListObjects(uint32_t node_id, uint64_t* cursor,
                                size_t max,
                                v1::ListObjectsResponse* out) const {
  ReaderMutexLock l(&mu_);
  const uint64_t begin = std::min<uint64_t>(*cursor, index_->records_end());
  // Visit at most a few pages' worth of records per call when filtering by
  // node, so one call never walks the whole index under the lock.
  const size_t budget = node_id == 0 ? max : max * 16;
  size_t added = 0;
  const uint32_t next =
      index_->ForEachFrom(static_cast<uint32_t>(begin), budget,
                          [&](absl::string_view key, const ObjectLocation& e) {
                            if (node_id != 0 && e.node_id != node_id)
                              return true;
                            if (added == max) return false;
                            v1::ListedObject* o = out->add_objects();
                            o->set_key(std::string(key));
                            if (auto chain = index_->Chain(key)) {
                              o->set_parent_key(std::move(chain->parent));
                              o->set_unreachable(chain->orphan);
                            }
                            v1::Location* loc = o->mutable_location();
                            ToProto(e, loc);
                            const std::optional<uint32_t> tick =
                                index_->ReadTick(key);
                            if (tick && *tick > 0) {
                              o->set_last_read_unix_ms(
                                  absl::ToUnixMillis(ReadTimeOfTick(*tick)));
                            }
                            ++added;
                            return true;
                          });
  *cursor = next;
  return next < index_->records_end();
}

}  // namespace master
}  // namespace hymcache
