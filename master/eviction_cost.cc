#include "master/eviction_cost.h"

#include <algorithm>
#include <cmath>

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

double BlockPrefillWork(const EvictionCostOptions& options, uint32_t depth) {
  const double tokens = options.block_tokens;
  if (options.attention_tokens == 0) return tokens;
  return tokens * (1.0 + (depth + 0.5) * tokens /
                             static_cast<double>(options.attention_tokens));
}

double EvictionScore(const EvictionCostOptions& options, uint32_t depth,
                     uint64_t bytes, absl::Duration idle, bool ended,
                     const ReturnGaps& gaps) {
  if (ended) return 0;
  const ReturnGaps::Tail tail = gaps.At(idle);
  const double wait_s =
      absl::ToDoubleSeconds(std::max(tail.residual, options.min_wait));
  if (!std::isfinite(wait_s)) return 0;
  return BlockPrefillWork(options, depth) * tail.survival /
         (std::max<uint64_t>(bytes, 1) * wait_s);
}

}  // namespace master
}  // namespace hymcache
