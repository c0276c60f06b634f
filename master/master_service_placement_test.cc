// Placement through MasterService (master/placement.h): balance after many
// puts of chains of mixed lengths (load-aware beside round robin), chains
// kept on their node, traffic steering new chains away, a tenant's share of
// one node, and the imbalance gauge.
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// One PutStart of `keys` continuing the chain after `parent` ("": a new
// chain), committed with every receipt; returns the node used.
uint32_t PutChain(Harness& h, const std::vector<std::string>& keys,
                  const std::string& parent, uint64_t len) {
  v1::PutStartRequest req =
      PutReq(keys, std::vector<uint64_t>(keys.size(), len));
  req.set_parent_key(parent);
  auto r = h.svc->PutStart(req);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->put_id() != 0);
  h.Commit(*r);
  return r->node().node_id();
}

std::vector<uint64_t> UsedBytes(Harness& h) {
  std::vector<uint64_t> used;
  const v1::GetStatsResponse stats = h.svc->GetStats();
  for (const auto& n : stats.nodes()) {
    if (n.alive()) used.push_back(n.used_bytes());
  }
  return used;
}

struct ChainRun {
  double imbalance = 0;
  uint64_t continued = 0;  // puts continuing a chain
  uint64_t moved = 0;      // of those, placed off the chain's node
  uint64_t spilled = 0;    // the counter
};

// 10,000 puts from 64 conversations at a time, interleaved at random. A
// conversation runs a number of turns drawn from a heavy-tailed mix (most
// short, some very long) and each turn appends 1-8 blocks of 16 KiB; a new
// conversation replaces one that ended.
ChainRun RunChains(PlacementPolicy policy, uint32_t seed) {
  Harness h("placement_chains_" + std::string(PlacementPolicyName(policy)),
            [&](MasterServiceOptions& o) { o.placement.policy = policy; });
  for (int i = 0; i < 8; ++i) {
    h.Register("n" + std::to_string(i), 1, {{1, 256 * kMiB}}, 7000 + 2 * i);
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> blocks(1, 8);
  std::discrete_distribution<int> kind({60, 30, 10});  // short, mid, long
  auto turns = [&] {
    switch (kind(rng)) {
      case 0:
        return std::uniform_int_distribution<int>(1, 3)(rng);
      case 1:
        return std::uniform_int_distribution<int>(4, 15)(rng);
      default:
        return std::uniform_int_distribution<int>(16, 80)(rng);
    }
  };
  struct Conversation {
    std::string last;  // the chain's last key
    uint32_t node = 0;
    int left = 0;
    int id = 0;
    int next_block = 0;
  };
  int next_id = 0;
  std::vector<Conversation> live(64);
  for (auto& c : live) {
    c.id = next_id++;
    c.left = turns();
  }
  ChainRun run;
  for (int put = 0; put < 10000; ++put) {
    Conversation& c = live[rng() % live.size()];
    std::vector<std::string> keys;
    const int n = blocks(rng);
    for (int b = 0; b < n; ++b) {
      keys.push_back("c" + std::to_string(c.id) + "-" +
                     std::to_string(c.next_block++));
    }
    const uint32_t node = PutChain(h, keys, c.last, 16 * 1024);
    if (!c.last.empty()) {
      ++run.continued;
      if (node != c.node) ++run.moved;
    }
    c.node = node;
    c.last = keys.back();
    if (--c.left == 0) {
      c = Conversation();
      c.id = next_id++;
      c.left = turns();
    }
  }
  std::vector<uint64_t> used = UsedBytes(h);
  REQUIRE(used.size() == 8);
  run.imbalance = PlacementImbalance(used);
  run.spilled = h.svc->counters().placements_spilled;
  CHECK(h.svc->counters().placement_imbalance == Approx(run.imbalance));
  return run;
}

TEST_CASE(
    "After 10,000 puts of chains of mixed lengths on 8 nodes the largest "
    "node holds at most 1.15x the mean bytes, and chains mostly stay on "
    "their node") {
  const uint32_t seed = GENERATE(1u, 2u);
  const ChainRun aware = RunChains(PlacementPolicy::kLoadAware, seed);
  const ChainRun rr = RunChains(PlacementPolicy::kRoundRobin, seed);
  std::printf(
      "placement (seed %u, 10000 puts, 8 nodes): load_aware imbalance %.3f "
      "(%llu of %llu chain continuations moved, %llu spills); round_robin "
      "imbalance %.3f (%llu moved)\n",
      seed, aware.imbalance, static_cast<unsigned long long>(aware.moved),
      static_cast<unsigned long long>(aware.continued),
      static_cast<unsigned long long>(aware.spilled), rr.imbalance,
      static_cast<unsigned long long>(rr.moved));
  CHECK(aware.imbalance <= 1.15);
  CHECK(aware.imbalance <= rr.imbalance);
  // Round robin never moves a chain that has room; load-aware moves few.
  CHECK(rr.moved == 0);
  CHECK(aware.moved == aware.spilled);
  CHECK(aware.moved * 10 <= aware.continued);
}

TEST_CASE(
    "One long chain continues on another node once its own is filled "
    "past the margin, and is whole for a reader") {
  Harness h("placement_spill");
  h.Register("a", 1, {{1, 64 * kMiB}}, 7000);
  h.Register("b", 1, {{1, 64 * kMiB}}, 7002);
  std::vector<std::string> chain;
  std::string parent;
  std::map<uint32_t, int> blocks_on;
  for (int i = 0; i < 40; ++i) {
    const std::string k = "long" + std::to_string(i);
    ++blocks_on[PutChain(h, {k}, parent, kMiB)];
    chain.push_back(k);
    parent = k;
  }
  CHECK(blocks_on.size() == 2);
  CHECK(h.svc->counters().placements_spilled > 0);
  CHECK(h.svc->counters().placement_imbalance <= 1.15);
  // Every block is found, in order: the whole chain is one prefix.
  CHECK(h.Lookup(chain).hit_prefix_length() == chain.size());
}

TEST_CASE(
    "A node whose blocks are being read takes fewer new chains than "
    "an idle node of the same fill") {
  Harness h("placement_traffic");
  const uint32_t a = h.Register("a", 1, {{1, 64 * kMiB}}, 7000);
  const uint32_t b = h.Register("b", 1, {{1, 64 * kMiB}}, 7002);
  // Equal fill: one chain each.
  REQUIRE(PutChain(h, {"ha"}, "", kMiB) == a);
  REQUIRE(PutChain(h, {"hb"}, "", kMiB) == b);
  // Node a's block is read again and again (an engine's prefix loads).
  v1::BatchLookupRequest read = LookupReq({"ha"});
  read.set_for_read(true);
  for (int i = 0; i < 200; ++i) REQUIRE(h.svc->BatchLookup(read).ok());
  // New chains go to b until its fill outweighs a's traffic (the load term
  // is worth 5% of a node's capacity at 4x the mean traffic).
  int on_a = 0, on_b = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t n = PutChain(h, {"new" + std::to_string(i)}, "", kMiB / 4);
    (n == a ? on_a : on_b) += 1;
  }
  CHECK(on_b == 4);
  CHECK(on_a == 0);
}

TEST_CASE(
    "A named tenant's bytes are spread so that no node holds more "
    "than its share, while the default tenant's chains stay put") {
  Harness h("placement_tenant", [](MasterServiceOptions& o) {
    o.placement.max_tenant_share_per_node = 0.5;
    o.placement.tenant_share_min_bytes = 4 * kMiB;
  });
  for (int i = 0; i < 4; ++i) {
    h.Register("n" + std::to_string(i), 1, {{1, 256 * kMiB}}, 7000 + 2 * i);
  }
  // The default tenant fills nodes unevenly (one long chain on one node).
  std::string parent;
  for (int i = 0; i < 20; ++i) {
    const std::string k = "d" + std::to_string(i);
    PutChain(h, {k}, parent, kMiB);
    parent = k;
  }
  // Tenant "t" puts one long chain: kept on its node only up to the share.
  std::map<uint32_t, uint64_t> by_node;
  parent.clear();
  for (int i = 0; i < 64; ++i) {
    const std::string k = QualifyKey("t", "k" + std::to_string(i));
    by_node[PutChain(h, {k}, parent, kMiB)] += kMiB;
    parent = k;
  }
  uint64_t most = 0;
  for (const auto& [node, bytes] : by_node) most = std::max(most, bytes);
  INFO("tenant t on " << by_node.size() << " nodes, most " << most);
  CHECK(most <= 32 * kMiB + kMiB);
  CHECK(by_node.size() >= 2);
  CHECK(h.svc->counters().placements_over_tenant_share == 0);
}

TEST_CASE(
    "Round robin, kept for comparison, places new chains on each node "
    "in turn and keeps a chain on its node") {
  Harness h("placement_rr", [](MasterServiceOptions& o) {
    o.placement.policy = PlacementPolicy::kRoundRobin;
  });
  const uint32_t a = h.Register("a", 1, {{1, 64 * kMiB}}, 7000);
  const uint32_t b = h.Register("b", 1, {{1, 64 * kMiB}}, 7002);
  const uint32_t first = PutChain(h, {"x0"}, "", 4 * kMiB);
  const uint32_t second = PutChain(h, {"y0"}, "", kMiB);
  CHECK(first != second);
  // The chain after x0 stays on x0's node however full it gets.
  std::string parent = "x0";
  for (int i = 1; i < 8; ++i) {
    const std::string k = "x" + std::to_string(i);
    CHECK(PutChain(h, {k}, parent, 4 * kMiB) == first);
    parent = k;
  }
  CHECK((first == a || first == b));
  CHECK(h.svc->counters().placements_spilled == 0);
  CHECK(h.svc->counters().placement_imbalance > 1.5);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
