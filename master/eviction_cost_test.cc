#include "master/eviction_cost.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

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
  o = EvictionCostOptions();
  o.turn_horizon = absl::Milliseconds(500);
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.turn_horizon = absl::Hours(24 * 8);
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

TEST_CASE(
    "A turn-return rate is unknown until a turn resolves, then smoothed") {
  TurnRate t;
  CHECK_FALSE(t.known());
  t.not_returned = 1;
  CHECK(t.known());
  CHECK(t.Probability() == Approx(1.0 / 3));
  t.returned = 7;
  CHECK(t.Probability() == Approx(8.0 / 10));
}

TEST_CASE("A hinted chain resolves once: a read or an end, else its horizon") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  AwaitingTurns turns(absl::Seconds(10), 100);
  TurnRate one, other;
  turns.Await("a", t0, &one);
  turns.Await("b", t0 + absl::Seconds(1), &one);
  turns.Await("c", t0 + absl::Seconds(2), &other);
  turns.Await("d", t0 + absl::Seconds(3), &other);
  CHECK(turns.size() == 4);
  CHECK(turns.Returned("b"));
  CHECK_FALSE(turns.Returned("b"));  // once
  CHECK_FALSE(turns.Ended("b"));
  CHECK_FALSE(turns.Returned("never hinted"));
  CHECK(turns.Ended("d"));
  CHECK(one.returned == 1);
  CHECK(other.not_returned == 1);
  CHECK(turns.Expire(t0 + absl::Seconds(9)) == 0);
  // a's horizon passes; b is resolved already (its entry is skipped).
  CHECK(turns.Expire(t0 + absl::Seconds(11)) == 1);
  CHECK(one.not_returned == 1);
  CHECK(turns.size() == 1);
  // Hinted again, c's horizon starts again.
  turns.Await("c", t0 + absl::Seconds(8), &other);
  CHECK(turns.Expire(t0 + absl::Seconds(13)) == 0);
  CHECK(turns.Expire(t0 + absl::Seconds(18)) == 1);
  CHECK(other.not_returned == 2);
  CHECK(other.returned == 0);
  CHECK(turns.empty());
}

TEST_CASE(
    "Awaiting turns are bounded: past the bound the oldest are forgotten") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  AwaitingTurns turns(absl::Seconds(10), 4);
  TurnRate rate;
  for (int i = 0; i < 10; ++i) {
    turns.Await("k" + std::to_string(i), t0 + absl::Milliseconds(i), &rate);
    CHECK(turns.size() <= 4);
  }
  CHECK_FALSE(turns.Returned("k5"));  // forgotten: neither outcome
  CHECK(turns.Returned("k6"));
  // Hinting one key over and over keeps the queue bounded too, and the
  // others stay.
  for (int i = 0; i < 100; ++i) {
    turns.Await("k9", t0 + absl::Milliseconds(i), &rate);
  }
  // Resolved and hinted again at the same time: one mark, expiring once.
  CHECK(turns.Returned("k8"));
  turns.Await("k8", t0 + absl::Milliseconds(99), &rate);
  CHECK(turns.Expire(t0 + absl::Seconds(20)) == 3);  // k7, k8, k9
  CHECK(rate.returned == 2);
  CHECK(rate.not_returned == 3);
  CHECK(turns.empty());
}

TEST_CASE("Returns are learned per tenant; past max_tenants they share one") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ReturnLearner learner(absl::Seconds(10), /*max_tenants=*/2);
  CHECK(learner.Of("a").gaps.count() == 0);  // unknown: empty
  learner.ObserveGap("a", absl::Seconds(3));
  learner.AwaitTurn("b", "b/k", t0);
  learner.AwaitTurn("c", "c/k", t0);  // the third tenant: the shared entry
  CHECK(learner.awaiting().Returned("b/k"));
  CHECK(learner.awaiting().Ended("c/k"));
  CHECK(learner.Of("a").gaps.count() == 1);
  CHECK(learner.Of("b").turns.returned == 1);
  CHECK(learner.Of("c").turns.not_returned == 1);  // read from ""
  CHECK(learner.Of("d").turns.not_returned == 1);
  CHECK(learner.Of("a").turns.known() == false);
}

TEST_CASE("A tenant whose turns seldom come back scores its blocks lower") {
  EvictionCostOptions o;
  ReturnGaps g;
  for (int i = 0; i < 3; ++i) g.Observe(absl::Seconds(10));
  TurnRate unknown;
  TurnRate often{/*returned=*/9, /*not_returned=*/1};
  TurnRate seldom{/*returned=*/1, /*not_returned=*/9};
  const auto score = [&](absl::Duration idle, const TurnRate& t) {
    return EvictionScore(o, 2, 4096, idle, false, g, t);
  };
  // Unknown: the gap term alone, as before any hint.
  CHECK(score(absl::Seconds(3), unknown) ==
        EvictionScore(o, 2, 4096, absl::Seconds(3), false, g));
  CHECK(score(absl::Seconds(3), often) > score(absl::Seconds(3), seldom));
  // Both still order by the time to the next read.
  CHECK(score(absl::Seconds(9), seldom) > score(absl::Seconds(3), seldom));
  // Without gaps (S = 1) the return term is the rate itself.
  ReturnGaps none;
  CHECK(EvictionScore(o, 0, 4096, absl::Seconds(1), false, none, seldom) ==
        Approx(EvictionScore(o, 0, 4096, absl::Seconds(1), false, none) *
               seldom.Probability()));
  CHECK(EvictionScore(o, 2, 4096, absl::Seconds(9), true, g, often) == 0);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
