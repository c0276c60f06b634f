#include "master/eviction_cost.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace hymcache {
namespace master {
namespace {

TEST_CASE("Eviction policies parse by name and say their name") {
  CHECK(*ParseEvictionPolicy("lru") == EvictionPolicy::kLru);
  CHECK(*ParseEvictionPolicy("cost") == EvictionPolicy::kCost);
  CHECK(ParseEvictionPolicy("lfu").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(EvictionPolicyName(EvictionPolicy::kCost) == "cost");
}

TEST_CASE("Eviction cost options refuse a zero pool, zero block or tiny wait") {
  EvictionCostOptions o;
  CHECK(o.Validate().ok());
  o.pool = 0;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o = EvictionCostOptions();
  o.block_tokens = 0;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o = EvictionCostOptions();
  o.min_wait = absl::Microseconds(10);
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A deeper block saves more prefill, in proportion to its position") {
  EvictionCostOptions o;
  o.block_tokens = 512;
  o.attention_tokens = 1024;
  // 512 tokens at context 256 (depth 0, the block's middle): 1.25x the
  // weights' work; at depth 3 (context 1,792): 2.75x.
  CHECK(BlockPrefillWork(o, 0) == Approx(512 * 1.25));
  CHECK(BlockPrefillWork(o, 3) == Approx(512 * 2.75));
  o.attention_tokens = 0;  // no position term
  CHECK(BlockPrefillWork(o, 0) == BlockPrefillWork(o, 100));
}

TEST_CASE("Return gaps give the share still to come back and how soon") {
  ReturnGaps g;
  // None seen: every chain may come back, no time known.
  CHECK(g.At(absl::Seconds(5)).survival == 1.0);
  CHECK(g.At(absl::Seconds(5)).residual == absl::ZeroDuration());
  for (int i = 0; i < 3; ++i) g.Observe(absl::Seconds(10));
  CHECK(g.count() == 3);
  // All three gaps lie in the bin [2^13 ms, 2^13.5 ms), counted at its
  // middle, 2^13.25 ms = 9.742 s; half a pseudo-gap at twice the idle time.
  const double mid = std::exp2(13.25) / 1000;
  ReturnGaps::Tail at9 = g.At(absl::Seconds(9));
  CHECK(at9.survival == Approx(1.0));
  CHECK(absl::ToDoubleSeconds(at9.residual) ==
        Approx((3 * mid - 3 * 9 + 0.5 * 9) / 3.5).epsilon(1e-6));
  ReturnGaps::Tail at3 = g.At(absl::Seconds(3));
  CHECK(at3.residual > at9.residual);  // farther from the next read
  // Past every gap: only the pseudo-gap is left.
  ReturnGaps::Tail at60 = g.At(absl::Seconds(60));
  CHECK(at60.survival == Approx(0.5 / 3.5));
  CHECK(g.At(absl::InfiniteDuration()).survival == Approx(0.5 / 3.5));
}

TEST_CASE("The score puts ended, never-read and far-off blocks first") {
  EvictionCostOptions o;
  ReturnGaps g;
  for (int i = 0; i < 3; ++i) g.Observe(absl::Seconds(10));
  const double soon = EvictionScore(o, 2, 4096, absl::Seconds(9), false, g);
  const double later = EvictionScore(o, 2, 4096, absl::Seconds(3), false, g);
  const double stale = EvictionScore(o, 2, 4096, absl::Seconds(60), false, g);
  CHECK(soon > later);
  CHECK(later > stale);
  CHECK(EvictionScore(o, 2, 4096, absl::Seconds(9), true, g) == 0);
  CHECK(EvictionScore(o, 2, 4096, absl::InfiniteDuration(), false, g) == 0);
  // Per byte: twice the bytes, half the score.
  CHECK(EvictionScore(o, 2, 8192, absl::Seconds(9), false, g) ==
        Approx(soon / 2));
  // Without gaps, position alone: deeper scores higher.
  ReturnGaps none;
  CHECK(EvictionScore(o, 5, 4096, absl::InfiniteDuration(), false, none) >
        EvictionScore(o, 0, 4096, absl::InfiniteDuration(), false, none));
}

}  // namespace
}  // namespace master
}  // namespace hymcache
