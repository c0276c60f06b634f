// MetadataIndex::PickEvictionsScored and the ended marks (TrackEnded): the
// eviction walk of the master's cost policy (master/eviction_cost.h).
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "master/metadata_index.h"
#include "master/metadata_index_test_util.h"

namespace hymcache {
namespace master {
namespace {

using index_test::Keys;
using index_test::Pick;
using index_test::PickScored;
using index_test::Verdict;
using index_test::WalkEnd;
using Candidate = MetadataIndex::Candidate;

ObjectLocation OnNode(uint32_t node, uint64_t n) {
  ObjectLocation e;
  e.node_id = node;
  e.region_id = 0;
  e.addr = n * 4096;
  e.length = 4096;
  e.generation = n + 1;
  return e;
}

TEST_CASE(
    "A scored walk with a pool of one, or equal scores, chooses what the LRU "
    "walk does") {
  // Random chains, branches and roots over two nodes, random touches: the
  // walks agree for every scan limit and count.
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    MetadataIndex index;
    Keys keys;
    for (int i = 0; i < 60; ++i) {
      const std::string key = "k" + std::to_string(i);
      std::string parent;
      if (!keys.empty() && rng() % 3 != 0) parent = keys[rng() % keys.size()];
      REQUIRE(index.Upsert(key, OnNode(1 + rng() % 2, i), parent).ok());
      keys.push_back(key);
      if (rng() % 4 == 0) index.Touch(keys[rng() % keys.size()], i + 1);
    }
    auto random_score = [&](const Candidate&) { return double(rng() % 100); };
    auto equal = [](const Candidate&) { return 1.0; };
    for (uint32_t node : {1u, 2u}) {
      for (size_t want : {1u, 5u, 100u}) {
        for (size_t scan : {3u, 40u, 1000u}) {
          auto keep_some = [](absl::string_view k) {
            return k.back() == '7' ? Verdict::kKeep : Verdict::kEvict;
          };
          const Keys lru = Pick(index, node, want, keep_some, scan);
          CHECK(PickScored(index, node, want, 1, random_score, keep_some,
                           scan) == lru);
          CHECK(PickScored(index, node, want, 64, equal, keep_some, scan) ==
                lru);
        }
      }
    }
  }
}

TEST_CASE("A scored walk chooses the pool's lowest, and only leaves") {
  MetadataIndex index;
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("t1", OnNode(1, 2), "h").ok());
  REQUIRE(index.Upsert("t2", OnNode(1, 3), "t1").ok());
  REQUIRE(index.Upsert("u", OnNode(1, 4)).ok());
  REQUIRE(index.Upsert("v", OnNode(1, 5)).ok());
  REQUIRE(Pick(index, 1, 10) == Keys{"t2", "t1", "h", "u", "v"});
  // t1 and h score lowest but have a child until t2 goes; each joins the
  // pool when its last child is chosen.
  const std::map<std::string, double> score = {
      {"h", 0}, {"t1", 0}, {"t2", 5}, {"u", 1}, {"v", 3}};
  auto by_key = [&](const Candidate& c) {
    return score.at(std::string(c.key));
  };
  CHECK(PickScored(index, 1, 10, 3, by_key) == Keys{"u", "v", "t2", "t1", "h"});
  CHECK(PickScored(index, 1, 1, 3, by_key) == Keys{"u"});
  // A pool of 2: u is chosen when v joins, not before.
  CHECK(PickScored(index, 1, 10, 2, by_key) == Keys{"u", "v", "t2", "t1", "h"});
  // Ties go to the less recent (a parent after its last child): with equal
  // scores, the LRU walk's choice.
  auto same = [](const Candidate&) { return 1.0; };
  CHECK(PickScored(index, 1, 10, 64, same) == Pick(index, 1, 10));

  // A stop ends the walk; the pool it has is still chosen from, lowest
  // first. So does the scan limit.
  WalkEnd end;
  CHECK(PickScored(
            index, 1, 10, 64, by_key,
            [](absl::string_view k) {
              return k == "v" ? Verdict::kStop : Verdict::kEvict;
            },
            1000, &end) == Keys{"u", "t2", "t1", "h"});
  CHECK(end == WalkEnd::kStopped);
  CHECK(PickScored(index, 1, 10, 64, by_key, nullptr, 4, &end) ==
        Keys{"u", "t2", "t1", "h"});
  CHECK(end == WalkEnd::kScanLimit);
  PickScored(index, 1, 2, 64, by_key, nullptr, 1000, &end);
  CHECK(end == WalkEnd::kEnough);
}

TEST_CASE("A scored candidate carries its depth and its chain's last read") {
  MetadataIndex index;
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("t1", OnNode(1, 2), "h").ok());
  REQUIRE(index.Upsert("t2", OnNode(1, 3), "t1").ok());
  REQUIRE(index.Upsert("x", OnNode(2, 4), "t2").ok());  // cross-linked
  REQUIRE(index.Upsert("r", OnNode(1, 5)).ok());
  REQUIRE(index.Touch("h", 40));
  REQUIRE(index.Touch("t1", 40));
  std::map<std::string, Candidate> seen;
  auto record = [&](const Candidate& c) {
    seen[std::string(c.key)] = c;
    return 0.0;
  };
  PickScored(index, 1, 10, 64, record);
  PickScored(index, 2, 10, 64, record);
  // t2 was written after its chain's last read: it shares t1's.
  CHECK(seen["t2"].depth == 2);
  CHECK(seen["t2"].last_use_tick == 40);
  CHECK(seen["x"].depth == 3);
  CHECK(seen["x"].last_use_tick == 40);
  // t1 and h join when their child goes: the same as a walk from each.
  CHECK(seen["t1"].depth == 1);
  CHECK(seen["t1"].last_use_tick == 40);
  CHECK(seen["h"].depth == 0);
  CHECK(seen["h"].last_use_tick == 40);
  CHECK(seen["r"].last_use_tick == 0);  // never read
  CHECK(seen["x"].entry.node_id == 2);
  for (const auto& [k, c] : seen) CHECK_FALSE(c.ended);

  // A tail read on its own (tick 50) above an unread block: the block
  // above still takes its own chain's last read, not the tail's.
  MetadataIndex other;
  REQUIRE(other.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(other.Upsert("t1", OnNode(1, 2), "h").ok());
  REQUIRE(other.Upsert("t2", OnNode(1, 3), "t1").ok());
  REQUIRE(other.Touch("h", 40));
  REQUIRE(other.Touch("t2", 50));
  seen.clear();
  PickScored(other, 1, 10, 64, record);
  CHECK(seen["t2"].last_use_tick == 50);
  CHECK(seen["t1"].last_use_tick == 40);
  CHECK(seen["t1"].depth == 1);
}

TEST_CASE("Ended marks last until a read, a replacement or an erase") {
  MetadataIndex index;
  auto chain = [&](const std::string& p) {
    REQUIRE(index.Upsert(p + "0", OnNode(1, 1)).ok());
    REQUIRE(index.Upsert(p + "1", OnNode(1, 2), p + "0").ok());
    REQUIRE(index.Upsert(p + "2", OnNode(1, 3), p + "1").ok());
  };
  chain("a");
  const std::vector<absl::string_view> a = {"a0", "a1", "a2"};
  // Not tracked: demoting marks nothing.
  index.DemoteChain(a);
  CHECK(index.ended_count() == 0);
  index.TrackEnded(true);
  index.DemoteChain(a);
  CHECK(index.ended_count() == 3);
  std::map<std::string, bool> ended;
  auto record = [&](const Candidate& c) {
    ended[std::string(c.key)] = c.ended;
    return 0.0;
  };
  PickScored(index, 1, 10, 64, record);
  CHECK(ended ==
        std::map<std::string, bool>{{"a0", true}, {"a1", true}, {"a2", true}});
  REQUIRE(index.Touch("a0", 5));  // it came back after all
  CHECK(index.ended_count() == 2);
  REQUIRE(index.Upsert("a1", OnNode(1, 9), "a0").ok());  // a new entry
  CHECK(index.ended_count() == 1);
  CHECK(index.Erase("a2").has_value());
  CHECK(index.ended_count() == 0);
  chain("b");
  index.DemoteChain({"b0", "b1", "b2"});
  CHECK(index.ended_count() == 3);
  index.TrackEnded(false);
  CHECK(index.ended_count() == 0);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
