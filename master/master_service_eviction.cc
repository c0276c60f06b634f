// Eviction (making room on a full node): each node's committed objects are
// on an exact LRU list in the index, ordered so that a block is never more
// recent than its parent (a reader gets to a block only through its parent,
// so the parent's use is what counts). PutCommit puts a chain head at the
// most recent end and a continuation just below its parent: the new blocks
// share the recency of the chain they extend, whose blocks the Load before
// the Store has just touched. A for_read BatchLookup moves the heads among
// its hits to the most recent end (last key first) and each linked hit
// just below its parent, so a chain read head first, in one call or in a
// pipelined Load's several, ends up head most recent, tail least. Eviction
// removes only chain leaves, never a block with a child on the same node
// (a child on another node is removed with it, as an orphan):
// the walk from the least recent end takes a leaf, counting the children
// it took before as gone, and passes over a block that still has one
// (MetadataIndex::PickEvictions). With the order above the least recent
// blocks are leaves, the walk meets a chain's tail first and its head
// after the rest of the chain, so a chain shrinks from its tail and never
// loses its head while a tail survives. It passes over blocks only when
// something more recent below them must stay (a leased, pinned or kept
// tail). Why leaves rather than "a block with its whole subtree": an LRU
// head may carry thousands of descendants (a shared system prompt) that
// readers reach through it, more recent by construction; the subtree
// would evict recently used blocks and unbounded work in one PutStart.
// Leaves first keeps LRU order meaningful and the work bounded: at most
// max_evictions_per_put victims and max_eviction_scan objects looked at
// per PutStart, across its rounds.
// An object read (for_read lookup) within `read_lease` is never evicted:
// the walk stops at the first leased object (objects after it were mostly
// used even more recently). A commit does not grant a lease, so freshly
// written objects stay evictable. Pending puts' space is never evicted (it
// is not in the index), nor the keys that the PutStart itself reports as
// existing, nor its parent_key, nor any pending put's parent. Evictions are
// written to the store first (one batch), then applied to the index and
// allocators; the space is reused under a new, higher generation, so a
// reader holding an evicted location gets NotFound from the node, never
// other bytes.

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "master/master_service_internal.h"
#include "master/tenant.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::PrintableKey;

// Read ticks stay below this (LeaseTick moves the epoch forward).
constexpr int64_t kMaxLeaseTick = int64_t{1} << 31;

uint64_t RoundUp(uint64_t len, uint32_t alignment) {
  return (len + alignment - 1) & ~uint64_t{alignment - 1};
}

}  // namespace

uint32_t MasterService::LeaseTick(absl::Time now) {
  int64_t ms = absl::ToInt64Milliseconds(now - lease_epoch_) + 1;
  if (ms < 1) ms = 1;  // the clock went back past the epoch
  if (ms >= kMaxLeaseTick) {
    // Move the epoch so that `now` becomes tick lease + 2: ticks still
    // within the lease keep their distance to now (and stay > 0), older
    // ones drop to 0 or stay expired.
    const int64_t lease_ms = absl::ToInt64Milliseconds(options_.read_lease);
    const int64_t shift = ms - (lease_ms + 2);
    index_->RebaseReadTicks(static_cast<uint32_t>(
        std::min<int64_t>(shift, std::numeric_limits<uint32_t>::max())));
    lease_epoch_ += absl::Milliseconds(shift);
    ms -= shift;
    VLOG(1) << "read ticks rebased by " << shift << " ms";
  }
  return static_cast<uint32_t>(ms);
}

absl::Time MasterService::ReadTimeOfTick(uint32_t tick) const {
  return lease_epoch_ + absl::Milliseconds(tick > 0 ? int64_t{tick} - 1 : 0);
}

bool MasterService::IsLeased(uint32_t read_tick, uint32_t now_tick) const {
  if (read_tick == 0) return false;  // never read since written
  const int64_t age = int64_t{now_tick} - int64_t{read_tick};
  // |age|: a read "in the future" means the clock went back; treat it like
  // a read that far in the past instead of leasing it until the clock
  // catches up.
  return std::abs(age) < absl::ToInt64Milliseconds(options_.read_lease);
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
      end = PickEvictionsLocked(
          node_id, scan_budget, now_tick,
          [&](absl::string_view key, const ObjectLocation& e,
              uint32_t read_tick) ABSL_NO_THREAD_SAFETY_ANALYSIS {
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

MetadataIndex::WalkEnd MasterService::PickEvictionsLocked(
    uint32_t node_id, size_t max_scan, uint32_t now_tick,
    const std::function<MetadataIndex::Verdict(
        absl::string_view, const ObjectLocation&, uint32_t)>& judge,
    const std::function<bool(absl::string_view, const ObjectLocation&)>& take) {
  if (options_.eviction_policy != EvictionPolicy::kCost) {
    return index_->PickEvictions(node_id, max_scan, judge, take);
  }
  const EvictionCostOptions& cost = options_.eviction_cost;
  return index_->PickEvictionsScored(
      node_id, max_scan, cost.pool, judge,
      [&](const MetadataIndex::Candidate& c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        const TenantReturns& returns = returns_.Of(TenantOfKey(c.key));
        const absl::Duration idle =
            c.last_use_tick == 0 ? absl::InfiniteDuration()
                                 : absl::Milliseconds(std::max<int64_t>(
                                       0, int64_t{now_tick} - c.last_use_tick));
        return EvictionScore(cost, c.depth, c.entry.length, idle, c.ended,
                             returns.gaps, returns.turns);
      },
      take);
}

absl::Status MasterService::MakeRoomInTenant(
    const std::string& tenant, const TenantLimit& quota, uint64_t new_objects,
    uint64_t new_bytes, const absl::flat_hash_set<absl::string_view>& keep,
    absl::Time now) {
  MetadataIndex::TenantUsage used = index_->UsageOf(tenant);
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
    index_->PickEvictions(
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
    auto e = index_->Erase(key);
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

}  // namespace master
}  // namespace hymcache
