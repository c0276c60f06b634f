#include "master/eviction_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace hymcache {
namespace master {

absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  if (name == "lru") return EvictionPolicy::kLru;
  if (name == "cost") return EvictionPolicy::kCost;
  return absl::InvalidArgumentError(
      absl::StrCat("eviction policy '", name, "' (want lru or cost)"));
}

absl::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kCost:
      return "cost";
  }
  return "unknown";
}

absl::Status EvictionCostOptions::Validate() const {
  if (pool < 1 || pool > 65536) {
    return absl::InvalidArgumentError("eviction_cost.pool must be 1..65536");
  }
  if (block_tokens < 1 || block_tokens > (uint32_t{1} << 20)) {
    return absl::InvalidArgumentError(
        "eviction_cost.block_tokens must be 1..2^20");
  }
  if (min_wait < absl::Milliseconds(1) || min_wait > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        "eviction_cost.min_wait must be 1 ms..1 h");
  }
  if (turn_horizon < absl::Seconds(1) || turn_horizon > absl::Hours(7 * 24)) {
    return absl::InvalidArgumentError(
        "eviction_cost.turn_horizon must be 1 s..7 days");
  }
  return absl::OkStatus();
}

namespace {

// Bin i holds gaps in [r^i, r^(i+1)) ms with r = sqrt(2) (bin 0 also the
// shorter ones), as hymsim's ReturnStats.
int BinOf(double ms, int bins) {
  if (ms <= 1) return 0;
  return std::min(bins - 1, static_cast<int>(2 * std::log2(ms)));
}

double MidOf(int bin) { return std::exp2((bin + 0.5) / 2); }

}  // namespace

void ReturnGaps::Observe(absl::Duration gap) {
  ++bins_[BinOf(absl::ToDoubleMilliseconds(gap), kBins)];
  ++count_;
}

ReturnGaps::Tail ReturnGaps::At(absl::Duration idle) const {
  if (count_ == 0) return {1.0, absl::ZeroDuration()};
  if (idle == absl::InfiniteDuration()) {
    // Past every gap: the pseudo-gap alone, at no finite excess known.
    return {0.5 / (count_ + 0.5), absl::InfiniteDuration()};
  }
  const double idle_ms = std::max(0.0, absl::ToDoubleMilliseconds(idle));
  double above = 0;  // gaps whose middle is past idle
  double total = 0;  // their sum
  for (int i = kBins - 1; i >= 0 && MidOf(i) > idle_ms; --i) {
    above += bins_[i];
    total += bins_[i] * MidOf(i);
  }
  const double c = above + 0.5;
  const double excess = total - above * idle_ms + 0.5 * std::max(idle_ms, 1.0);
  return {c / (count_ + 0.5), absl::Milliseconds(excess / c)};
}

double TurnRate::Probability() const {
  return (returned + 1.0) / (returned + not_returned + 2.0);
}

AwaitingTurns::AwaitingTurns(absl::Duration horizon, size_t max_marks)
    : horizon_(horizon), max_marks_(std::max<size_t>(max_marks, 1)) {}

uint64_t AwaitingTurns::Fingerprint(absl::string_view key) {
  return absl::Hash<absl::string_view>{}(key);
}

void AwaitingTurns::Await(absl::string_view key, absl::Time now,
                          TurnRate* rate) {
  const uint64_t fp = Fingerprint(key);
  auto it = marks_.find(fp);
  if (it != marks_.end()) {
    it->second.rate = rate;
    if (it->second.when == now) return;  // its entry in order_ stands
    it->second.when = now;               // the old entry goes stale
    order_.emplace_back(fp, now);
  } else {
    // Bounded: the oldest go first, forgotten (neither outcome).
    while (marks_.size() >= max_marks_) {
      const auto [old, when] = order_.front();
      auto live = marks_.find(old);
      if (live != marks_.end() && live->second.when == when) {
        marks_.erase(live);
      }
      order_.pop_front();
    }
    marks_.emplace(fp, Mark{now, rate});
    order_.emplace_back(fp, now);
  }
  if (order_.size() >= 2 * max_marks_) {
    // At least half are stale: keep one entry per live mark, in order (a
    // key resolved and hinted again at the same time has two that match).
    std::deque<std::pair<uint64_t, absl::Time>> live;
    absl::flat_hash_set<uint64_t> kept;
    for (const auto& entry : order_) {
      auto m = marks_.find(entry.first);
      if (m != marks_.end() && m->second.when == entry.second &&
          kept.insert(entry.first).second) {
        live.push_back(entry);
      }
    }
    order_.swap(live);
  }
}

TurnRate* AwaitingTurns::Take(absl::string_view key) {
  auto it = marks_.find(Fingerprint(key));
  if (it == marks_.end()) return nullptr;
  TurnRate* rate = it->second.rate;
  marks_.erase(it);
  return rate;
}

bool AwaitingTurns::Returned(absl::string_view key) {
  TurnRate* rate = Take(key);
  if (rate == nullptr) return false;
  ++rate->returned;
  return true;
}

bool AwaitingTurns::Ended(absl::string_view key) {
  TurnRate* rate = Take(key);
  if (rate == nullptr) return false;
  ++rate->not_returned;
  return true;
}

size_t AwaitingTurns::Expire(absl::Time now) {
  size_t expired = 0;
  while (!order_.empty() && order_.front().second + horizon_ <= now) {
    const auto [fp, when] = order_.front();
    auto it = marks_.find(fp);
    if (it != marks_.end() && it->second.when == when) {
      ++it->second.rate->not_returned;
      ++expired;
      marks_.erase(it);
    }
    order_.pop_front();
  }
  return expired;
}

ReturnLearner::ReturnLearner(absl::Duration turn_horizon, size_t max_tenants)
    : max_tenants_(max_tenants), awaiting_(turn_horizon, size_t{1} << 16) {}

TenantReturns& ReturnLearner::For(absl::string_view tenant) {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) {
    if (tenants_.size() >= max_tenants_) tenant = "";
    it = tenants_.try_emplace(std::string(tenant)).first;
  }
  return it->second;
}

const TenantReturns& ReturnLearner::Of(absl::string_view tenant) const {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) it = tenants_.find("");
  return it == tenants_.end() ? none_ : it->second;
}

double BlockPrefillWork(const EvictionCostOptions& options, uint32_t depth) {
  const double tokens = options.block_tokens;
  if (options.attention_tokens == 0) return tokens;
  return tokens * (1.0 + (depth + 0.5) * tokens /
                             static_cast<double>(options.attention_tokens));
}

double EvictionScore(const EvictionCostOptions& options, uint32_t depth,
                     uint64_t bytes, absl::Duration idle, bool ended,
                     const ReturnGaps& gaps, const TurnRate& turns) {
  if (ended) return 0;
  const ReturnGaps::Tail tail = gaps.At(idle);
  const double wait_s =
      absl::ToDoubleSeconds(std::max(tail.residual, options.min_wait));
  if (!std::isfinite(wait_s)) return 0;
  // Still coming back after `idle`: of the chains that return (p), those
  // whose gap is longer (S), among all not back yet (p S + 1 - p).
  double q = tail.survival;
  if (turns.known()) {
    const double p = turns.Probability();
    q = p * q / (p * q + (1.0 - p));
  }
  return BlockPrefillWork(options, depth) * q /
         (std::max<uint64_t>(bytes, 1) * wait_s);
}

}  // namespace master
}  // namespace hymcache
