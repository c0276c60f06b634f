// The master's eviction policies (MasterServiceOptions::eviction_policy):
// recency (LRU, the default) and the cost-aware score, which weighs what a
// block's presence saves against the bytes it takes.
//
// The cost score of an evictable leaf (docs/prefetch.md, "Cost-aware
// eviction in the master"):
//
//   work  = block_tokens * (1 + (depth + 1/2) * block_tokens / attn_tokens)
//           the prefill FLOPs the block saves, in units of one token's
//           weight FLOPs: a token's attention grows with its position, and
//           at attn_tokens (attention_tokens) of context it costs as much
//           as the weights
//   S, R  = the share of the tenant's observed return gaps longer than the
//           block's idle time, and their mean excess over it
//           (ReturnGaps::At): "still coming back, if it comes" and "how
//           soon"
//   p     = the tenant's turn-return rate (TurnRate): the share of its
//           chains hinted as awaiting a next turn that came back
//   Q     = p * S / (p * S + 1 - p): the chain still comes back, given that
//           it has not for its idle time (S alone while p is unknown)
//   score = work * Q / (bytes * max(R, min_wait))      0 when ended
//
// A block's idle time counts from its last read, or else its chain's last
// read above it (it was written after that read). A chain never read
// counts as idle past every gap seen: score 0 once the tenant has any (the
// walk compares only the least recent leaves, so such a chain was written
// long before the rest and never came back). Without gaps, S = 1 and R = 0:
// position and bytes alone.
//
// The lowest goes first. It is hymsim's `cost` score (tools/hymsim/hymsim/
// eviction.py) with what a master knows: no turn numbers and no readers
// per block. Turns it learns from think-time hints (next_turn lookups,
// Client::HintNextTurn; AwaitingTurns): a hinted chain read again came
// back, one ended or left past turn_horizon did not.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hymcache {
namespace master {

enum class EvictionPolicy {
  kLru,   // least recently used leaf first (plus ended chains first)
  kCost,  // lowest cost score among the `pool` least recent leaves first
};

// "lru" or "cost"; InvalidArgument otherwise.
absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name);
absl::string_view EvictionPolicyName(EvictionPolicy policy);

struct EvictionCostOptions {
  // Evictable leaves the walk compares before each choice, from the least
  // recent end (MetadataIndex::PickEvictionsScored). 1 is LRU. 1..65536.
  // Default: 64.
  uint32_t pool = 64;
  // Tokens per block, as the engines cut them. 1..2^20. Default: 512 (the
  // Mooncake trace's and hymbench's).
  uint32_t block_tokens = 512;
  // The context length at which a token's attention FLOPs equal its
  // weights' FLOPs: 2 * parameters / (4 * layers * hidden size), about
  // 49,600 for Qwen2.5-32B (hymsim's model). 0: every block saves the same
  // (no position term). Default: 49152.
  uint32_t attention_tokens = 49152;
  // Floor of a block's expected wait until its next read (one scheduling
  // quantum). 1 ms..1 h. Default: 1 s.
  absl::Duration min_wait = absl::Seconds(1);
  // How long a chain hinted as awaiting its next turn may wait for it: not
  // read again by then, it counts as not returned (TurnRate). 1 s..7 days.
  // Default: 30 min.
  absl::Duration turn_horizon = absl::Minutes(30);

  absl::Status Validate() const;
};

// One tenant's gaps between a chain's reads, learned online by the master
// from for_read lookups (the time since the chain's previous read), in
// bins of milliseconds spaced by a factor sqrt(2) (as hymsim's).
class ReturnGaps {
 public:
  void Observe(absl::Duration gap);
  uint64_t count() const { return count_; }

  struct Tail {
    double survival;          // share of gaps longer than the idle time
    absl::Duration residual;  // their mean excess over it
  };
  // At `idle`: each gap counted at its bin's geometric middle, plus half a
  // pseudo-gap at 2 * idle (so both stay defined past the longest gap);
  // {1, 0} while no gap has been seen.
  Tail At(absl::Duration idle) const;

 private:
  static constexpr int kBins = 80;  // 1 ms .. 2^40 ms
  std::array<uint64_t, kBins> bins_{};
  uint64_t count_ = 0;
};

// One tenant's turns: of its chains hinted as awaiting a next turn, how
// many came back and how many did not (AwaitingTurns).
struct TurnRate {
  uint64_t returned = 0;
  uint64_t not_returned = 0;

  // Whether any hinted turn has resolved (without hints the score's return
  // term is the gaps' alone).
  bool known() const { return returned + not_returned > 0; }
  // The probability that a hinted chain's next turn comes: (returned + 1)
  // / (returned + not_returned + 2).
  double Probability() const;
};

// What the cost score knows of one tenant's returns.
struct TenantReturns {
  ReturnGaps gaps;
  TurnRate turns;
};

// The chains awaiting their next turn, each by one key (the last one a
// next_turn lookup found; held as a 64-bit fingerprint) and when it was
// hinted, with the TurnRate its outcome counts in. A later read of that key
// is a return; an ended lookup of it, or its horizon without either, is
// not. A key hinted again before it resolves keeps one mark, from the
// later hint. At most max_marks at once: past it, the oldest are forgotten
// and count as neither.
class AwaitingTurns {
 public:
  AwaitingTurns(absl::Duration horizon, size_t max_marks);

  // `key` awaits its chain's next turn from `now`; its outcome counts in
  // `*rate`. REQUIRES: `rate` outlives the mark (it stays put).
  void Await(absl::string_view key, absl::Time now, TurnRate* rate);
  // A read of `key`: if it awaited a turn, one more return. True then.
  bool Returned(absl::string_view key);
  // An end of `key`'s chain: if it awaited a turn, one more that did not
  // come. True then.
  bool Ended(absl::string_view key);
  // The marks past their horizon at `now`: each one more turn that did not
  // come, and forgotten. Returns how many.
  size_t Expire(absl::Time now);

  bool empty() const { return marks_.empty(); }
  size_t size() const { return marks_.size(); }

 private:
  struct Mark {
    absl::Time when;
    TurnRate* rate;
  };
  static uint64_t Fingerprint(absl::string_view key);
  // The mark of `key`, taken out (nullptr: none).
  TurnRate* Take(absl::string_view key);

  const absl::Duration horizon_;
  const size_t max_marks_;
  absl::flat_hash_map<uint64_t, Mark> marks_;
  // (fingerprint, when) in the order hinted; an entry whose key is no
  // longer marked at that time is stale and skipped.
  std::deque<std::pair<uint64_t, absl::Time>> order_;
};

// What the cost policy learns of each tenant's returns: its gaps and turn
// rate (TenantReturns, at most max_tenants; further tenants share the ""
// entry) and the chains awaiting a turn (AwaitingTurns, at most 65,536).
// The master feeds it from its lookups (master_service_lookup.cc) and
// scores with Of() (master_service_eviction.cc).
class ReturnLearner {
 public:
  explicit ReturnLearner(absl::Duration turn_horizon,
                         size_t max_tenants = 1024);

  // A read of a chain of `tenant` last read `gap` ago.
  void ObserveGap(absl::string_view tenant, absl::Duration gap) {
    For(tenant).gaps.Observe(gap);
  }
  // `key`, of `tenant`, awaits its chain's next turn from `now`.
  void AwaitTurn(absl::string_view tenant, absl::string_view key,
                 absl::Time now) {
    awaiting_.Await(key, now, &For(tenant).turns);
  }
  AwaitingTurns& awaiting() { return awaiting_; }
  // `tenant`'s statistics (the shared entry's past max_tenants; empty ones
  // when none).
  const TenantReturns& Of(absl::string_view tenant) const;

 private:
  TenantReturns& For(absl::string_view tenant);

  const size_t max_tenants_;
  // Never erased, and a node map: awaiting_'s marks point into it.
  absl::node_hash_map<std::string, TenantReturns> tenants_;
  const TenantReturns none_;
  AwaitingTurns awaiting_;
};

// The prefill work a block at `depth` (blocks before it in its chain)
// saves, in units of one token's weight FLOPs (the file comment).
double BlockPrefillWork(const EvictionCostOptions& options, uint32_t depth);

// The cost score (the file comment); lower is evicted first. `idle`:
// absl::InfiniteDuration() when the chain was never read.
double EvictionScore(const EvictionCostOptions& options, uint32_t depth,
                     uint64_t bytes, absl::Duration idle, bool ended,
                     const ReturnGaps& gaps, const TurnRate& turns = {});

}  // namespace master
}  // namespace hymcache
