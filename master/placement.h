// Placement: which storage node takes a PutStart's new slots. MasterService
// (master_service_put.cc) gathers one PlacementCandidate per node that may
// take placements, RankNodes orders them, and the service allocates on the
// first in that order with room (evicting on the first the caller may use
// when none has room).
//
// Either way a node the caller names (preferred_node_id: its own host's
// node, say) is tried first while it has room.
//
// Load-aware (the default):
//   - A chain stays on its node (the node of the block before the put's
//     first key) while that node, with the put, stays within
//     (1 + chain_spill_over) of the cluster's mean fill after the put
//     (plus chain_spill_min_fill of its capacity); past
//     it the put spills to the best other node (the chain is cross-linked
//     there, see Chains in master_service_put.cc) and the chain's node is
//     tried last. So a long chain cannot pile up on one node: no node is
//     filled far beyond the mean by chains alone.
//   - Other puts (chain heads, spills) go to the node with the lowest score:
//     its fill after the put (used bytes, pending puts' included, over
//     capacity), plus load_weight for a node whose recent traffic (bytes
//     read by for_read lookups and bytes placed, decayed with
//     load_half_life) or puts in flight are above the cluster's mean (up to
//     load_weight at 4x the mean). Ties go round robin.
//   - A named tenant (master/tenant.h) whose bytes reach
//     tenant_share_min_bytes gets at most max_tenant_share_per_node of them
//     on one node: nodes over it come after the others (best effort: a put
//     is never refused for it; placements that had to ignore it are
//     counted).
// Round robin (kRoundRobin, the policy before load-aware placement): the
// chain's node first, then every other node in turn; kept for comparison
// (master_service_placement_test measures both).
//
// Imbalance (GetStats' placement_imbalance, hymctl status): the largest
// node's used bytes over the mean of the alive nodes'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace hymcache {
namespace master {

enum class PlacementPolicy { kLoadAware, kRoundRobin };

// "load_aware" or "round_robin". Errors: InvalidArgument naming both.
absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(absl::string_view name);
const char* PlacementPolicyName(PlacementPolicy policy);

struct PlacementOptions {
  PlacementPolicy policy = PlacementPolicy::kLoadAware;
  // How far (a share of the mean fill) a chain's node may be filled beyond
  // the cluster's mean before the chain continues elsewhere. 0..10.
  // Default: 0.1.
  double chain_spill_over = 0.1;
  // ...plus this share of the node's capacity, so that a cluster filled
  // little does not split chains over a few blocks (the spread matters
  // once nodes fill up). 0..1. Default: 0.02.
  double chain_spill_min_fill = 0.02;
  // Score added to a node at 4x the mean recent traffic or puts in flight
  // (in units of fill: 0.05 weighs like 5% of a node's capacity). 0..1.
  // Default: 0.05.
  double load_weight = 0.05;
  // Half-life of the recent-traffic average. 100 ms..1 h. Default: 10 s.
  absl::Duration load_half_life = absl::Seconds(10);
  // Most of one named tenant's bytes on one node, once the tenant holds
  // tenant_share_min_bytes. (0, 1]; 1: no limit. Default: 0.5, 1 GiB.
  double max_tenant_share_per_node = 0.5;
  uint64_t tenant_share_min_bytes = uint64_t{1} << 30;

  absl::Status Validate() const;
};

// A rate in bytes per second that decays with a half-life: an exponential
// moving average of what Add() was given. Not thread-safe.
class DecayingRate {
 public:
  void Add(uint64_t bytes, absl::Time now, absl::Duration half_life);
  double PerSecond(absl::Time now, absl::Duration half_life) const;

 private:
  // The decayed sum of bytes, as of `at_`.
  double sum_ = 0;
  absl::Time at_ = absl::InfinitePast();
};

// One node that may take the put (alive, proven, not draining).
struct PlacementCandidate {
  uint32_t node_id = 0;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // committed and pending allocations
  double traffic = 0;       // recent bytes per second read and placed
  uint32_t puts_in_flight = 0;
  uint64_t tenant_bytes = 0;  // the put's tenant's committed bytes on it
  bool chain_node = false;    // holds the block before the put's first key
  // The caller named it (PutStartRequest.preferred_node_id): tried first
  // whatever its fill, as the caller asked.
  bool requested = false;
  // Holds the other copy of one of the put's keys (a relocated block's
  // copy, a copy's block, master/replica_key.h): tried last, so that a
  // block and its copy land on one node only when no other node has room.
  bool holds_copy = false;
};

struct PlacementRanking {
  std::vector<size_t> order;  // indexes into the candidates, best first
  // The chain's node was passed over for being too full (tried last).
  bool chain_spilled = false;
  // Every node was over the tenant's share: ranked as if without it.
  bool tenant_share_ignored = false;
};

// Ranks `candidates` for a put of `put_bytes` by a tenant holding
// `tenant_bytes` committed bytes in all (`named_tenant`: false for the
// default tenant, which has no share limit). `round_robin_start`: the index
// ties (and kRoundRobin) start from.
PlacementRanking RankNodes(const PlacementOptions& options,
                           absl::Span<const PlacementCandidate> candidates,
                           uint64_t put_bytes, bool named_tenant,
                           uint64_t tenant_bytes, size_t round_robin_start);

// The largest of `used` over their mean; 1 when all are equal, 0 when
// `used` is empty or all zero.
double PlacementImbalance(absl::Span<const uint64_t> used);

// Which of a key's two readable copies (its block and the copy of a hot
// prefix, master/replica_key.h) serves one lookup's key: the node with the
// lower load, its recent traffic (a DecayingRate, as placement weighs it)
// plus the bytes this answer already sends it, counted as that traffic
// would count them. So one answer spreads a shared prefix over both nodes,
// and a node many readers already use is passed over. Ties go to the
// block. Not thread-safe; one per lookup.
class CopyChooser {
 public:
  CopyChooser(absl::Duration half_life, absl::Time now)
      : half_life_(half_life), now_(now) {}

  // One of a key's two readable places.
  struct Holder {
    uint32_t node = 0;
    const DecayingRate* traffic = nullptr;  // its node's reads
    bool on_reader_host = false;            // the reader's own machine
  };
  // Whether the copy serves rather than the block: the one on the reader's
  // host if only one is, else the less loaded (ties: the block).
  bool PrefersCopy(const Holder& copy, const Holder& block) const;
  // This answer sends `bytes` from `node`.
  void Served(uint32_t node, uint64_t bytes);

 private:
  double Load(uint32_t node, const DecayingRate& traffic) const;

  const absl::Duration half_life_;
  const absl::Time now_;
  std::vector<std::pair<uint32_t, uint64_t>> served_;  // few nodes
};

}  // namespace master
}  // namespace hymcache
