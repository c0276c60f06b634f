#include "master/placement.h"

#include <catch2/catch.hpp>
#include <vector>

namespace hymcache {
namespace master {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

PlacementCandidate Node(uint32_t id, uint64_t used, uint64_t capacity = kGiB) {
  PlacementCandidate c;
  c.node_id = id;
  c.used_bytes = used;
  c.capacity_bytes = capacity;
  return c;
}

std::vector<uint32_t> Ids(const std::vector<PlacementCandidate>& c,
                          const PlacementRanking& r) {
  std::vector<uint32_t> out;
  for (size_t i : r.order) out.push_back(c[i].node_id);
  return out;
}

TEST_CASE("Placement options outside their ranges are refused by name") {
  PlacementOptions o;
  CHECK(o.Validate().ok());
  o.chain_spill_over = -0.1;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = PlacementOptions();
  o.chain_spill_min_fill = 1.5;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = PlacementOptions();
  o.load_weight = 2;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = PlacementOptions();
  o.max_tenant_share_per_node = 0;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = PlacementOptions();
  o.load_half_life = absl::Milliseconds(1);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  CHECK(ParsePlacementPolicy("round_robin").value() ==
        PlacementPolicy::kRoundRobin);
  CHECK(ParsePlacementPolicy("load_aware").value() ==
        PlacementPolicy::kLoadAware);
  auto bad = ParsePlacementPolicy("random");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message().find("load_aware or round_robin") !=
        absl::string_view::npos);
}

TEST_CASE("A put goes to the emptiest node; equal nodes take turns") {
  PlacementOptions o;
  std::vector<PlacementCandidate> c = {Node(1, 300), Node(2, 100),
                                       Node(3, 200)};
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)) ==
        std::vector<uint32_t>{2, 3, 1});
  std::vector<PlacementCandidate> equal = {Node(1, 0), Node(2, 0), Node(3, 0)};
  CHECK(Ids(equal, RankNodes(o, equal, 10, false, 0, 1)) ==
        std::vector<uint32_t>{2, 3, 1});
  CHECK(Ids(equal, RankNodes(o, equal, 10, false, 0, 3)) ==
        std::vector<uint32_t>{1, 2, 3});
}

TEST_CASE(
    "Fill is relative to capacity: a node twice as large takes twice "
    "the bytes") {
  PlacementOptions o;
  std::vector<PlacementCandidate> c = {Node(1, 150, 1000), Node(2, 250, 2000)};
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)).front() == 2);
}

TEST_CASE(
    "A chain stays on its node within the spill margin and moves to "
    "the emptiest node beyond it") {
  PlacementOptions o;
  o.chain_spill_over = 0.1;
  o.chain_spill_min_fill = 0;
  // Mean fill after a 10-byte put: (1050 + 1000 + 950 + 10) / 3000.
  std::vector<PlacementCandidate> c = {Node(1, 1050, 3000), Node(2, 1000, 3000),
                                       Node(3, 950, 3000)};
  c[0].chain_node = true;
  PlacementRanking kept = RankNodes(o, c, 10, false, 0, 0);
  CHECK(Ids(c, kept) == std::vector<uint32_t>{1, 3, 2});
  CHECK_FALSE(kept.chain_spilled);
  c[0].used_bytes = 1300;  // > 1.1 x the mean
  PlacementRanking spilled = RankNodes(o, c, 10, false, 0, 0);
  CHECK(Ids(c, spilled) == std::vector<uint32_t>{3, 2, 1});
  CHECK(spilled.chain_spilled);
  // Round robin keeps the chain's node first whatever its fill.
  o.policy = PlacementPolicy::kRoundRobin;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 1)) ==
        std::vector<uint32_t>{1, 2, 3});
}

TEST_CASE(
    "Among nodes of equal fill the one with more recent traffic or "
    "more puts in flight comes last") {
  PlacementOptions o;
  std::vector<PlacementCandidate> c = {Node(1, 100), Node(2, 100),
                                       Node(3, 100)};
  c[0].traffic = 9e9;
  c[1].traffic = 1e6;
  c[2].traffic = 1e6;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)) ==
        std::vector<uint32_t>{2, 3, 1});
  c[0].traffic = 1e6;
  c[1].puts_in_flight = 40;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)) ==
        std::vector<uint32_t>{1, 3, 2});
  // The load term is bounded: a much emptier node still wins.
  c[1].used_bytes = 0;
  c[0].used_bytes = kGiB / 4;
  c[2].used_bytes = kGiB / 4;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)).front() == 2);
}

TEST_CASE(
    "A named tenant's share of one node is limited once it holds "
    "enough bytes; the default tenant has no share limit") {
  PlacementOptions o;
  o.max_tenant_share_per_node = 0.5;
  o.tenant_share_min_bytes = 1000;
  std::vector<PlacementCandidate> c = {Node(1, 0), Node(2, 5000),
                                       Node(3, 6000)};
  c[0].tenant_bytes = 3000;  // of 4000: the put would make it > 50%
  c[1].tenant_bytes = 1000;
  PlacementRanking r = RankNodes(o, c, 100, true, 4000, 0);
  CHECK(Ids(c, r) == std::vector<uint32_t>{2, 3, 1});
  CHECK_FALSE(r.tenant_share_ignored);
  // The default tenant: by fill alone.
  CHECK(Ids(c, RankNodes(o, c, 100, false, 4000, 0)).front() == 1);
  // Below the tenant's minimum: by fill alone.
  CHECK(Ids(c, RankNodes(o, c, 100, true, 800, 0)).front() == 1);
  // Every node over the share (one node only holds it all): ignored.
  std::vector<PlacementCandidate> two = {Node(1, 0), Node(2, 0)};
  two[0].tenant_bytes = 4000;
  two[1].tenant_bytes = 4000;
  PlacementRanking all = RankNodes(o, two, 4000, true, 8000, 0);
  CHECK(all.tenant_share_ignored);
  CHECK(all.order.size() == 2);
}

TEST_CASE(
    "A decaying rate follows a steady rate and halves per half-life "
    "once the traffic stops") {
  DecayingRate r;
  const absl::Duration h = absl::Seconds(10);
  absl::Time t = absl::FromUnixSeconds(1000);
  CHECK(r.PerSecond(t, h) == 0);
  for (int i = 0; i < 1000; ++i) {
    t += absl::Milliseconds(100);
    r.Add(1000, t, h);  // 10,000 B/s
  }
  CHECK(r.PerSecond(t, h) == Approx(10000).epsilon(0.05));
  CHECK(r.PerSecond(t + h, h) == Approx(5000).epsilon(0.05));
  // A time before the last Add does not grow the sum.
  r.Add(0, t - absl::Seconds(5), h);
  CHECK(r.PerSecond(t, h) == Approx(10000).epsilon(0.05));
}

TEST_CASE("Imbalance is the largest over the mean") {
  CHECK(PlacementImbalance({}) == 0);
  CHECK(PlacementImbalance({0, 0}) == 0);
  CHECK(PlacementImbalance({5, 5, 5}) == 1);
  CHECK(PlacementImbalance({1, 1, 4}) == Approx(2.0));
}

TEST_CASE(
    "A node holding a relocated block's copy is tried last, under either "
    "policy") {
  PlacementOptions o;
  std::vector<PlacementCandidate> c = {Node(1, 0), Node(2, 500), Node(3, 900)};
  c[0].holds_copy = true;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)) ==
        std::vector<uint32_t>{2, 3, 1});
  // Even when it holds the chain.
  c[0].chain_node = true;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)).back() == 1);
  o.policy = PlacementPolicy::kRoundRobin;
  CHECK(Ids(c, RankNodes(o, c, 10, false, 0, 0)) ==
        std::vector<uint32_t>{2, 3, 1});
}

TEST_CASE(
    "The less loaded of a key's two nodes serves it, and one answer spreads "
    "a prefix over both") {
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Duration half_life = absl::Seconds(10);
  DecayingRate idle, busy;
  busy.Add(64 << 20, now - absl::Seconds(1), half_life);
  using H = CopyChooser::Holder;
  {
    CopyChooser chooser(half_life, now);
    CHECK(chooser.PrefersCopy(H{2, &idle}, H{1, &busy}));
    CHECK_FALSE(chooser.PrefersCopy(H{2, &busy}, H{1, &idle}));
    CHECK_FALSE(chooser.PrefersCopy(H{2, &idle}, H{1, &idle}));  // ties
  }
  // Equal traffic: what this answer already sends decides, key by key.
  CopyChooser chooser(half_life, now);
  int from_copy = 0;
  for (int key = 0; key < 8; ++key) {
    const bool copy = chooser.PrefersCopy(H{2, &idle}, H{1, &idle});
    from_copy += copy;
    chooser.Served(copy ? 2 : 1, 4096);
  }
  CHECK(from_copy == 4);
  // A busy node takes none of a short prefix.
  CopyChooser spread(half_life, now);
  for (int key = 0; key < 8; ++key) {
    CHECK(spread.PrefersCopy(H{2, &idle}, H{1, &busy}));
    spread.Served(2, 4096);
  }
}

TEST_CASE(
    "The holder on the reader's own host serves a key before a less loaded "
    "one elsewhere; with both or neither there, load decides") {
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Duration half_life = absl::Seconds(10);
  DecayingRate idle, busy;
  busy.Add(64 << 20, now - absl::Seconds(1), half_life);
  using H = CopyChooser::Holder;
  CopyChooser chooser(half_life, now);
  CHECK(chooser.PrefersCopy(H{2, &busy, true}, H{1, &idle, false}));
  CHECK_FALSE(chooser.PrefersCopy(H{2, &idle, false}, H{1, &busy, true}));
  CHECK(chooser.PrefersCopy(H{2, &idle, true}, H{1, &busy, true}));
  CHECK_FALSE(chooser.PrefersCopy(H{2, &busy, true}, H{1, &idle, true}));
  // However much this answer already sends from it.
  for (int key = 0; key < 8; ++key) {
    CHECK(chooser.PrefersCopy(H{2, &idle, true}, H{1, &idle, false}));
    chooser.Served(2, 1 << 20);
  }
}

}  // namespace
}  // namespace master
}  // namespace hymcache
