#include "master/metadata_index.h"
#include "master/metadata_index_test_util.h"
#include "master/replica_key.h"
#include "master/tenant.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace hymcache {
namespace master {
namespace {

ObjectLocation E(uint64_t n) {
  ObjectLocation e;
  e.node_id = static_cast<uint32_t>(n % 7 + 1);
  e.region_id = static_cast<uint32_t>(n % 3);
  e.addr = n * 4096;
  e.length = n + 1;
  e.generation = n + 100;
  return e;
}

TEST_CASE("MetadataIndex inserts, finds, replaces and erases") {
  MetadataIndex index;
  CHECK(index.empty());
  CHECK_FALSE(index.Find("a").has_value());

  auto r = index.Upsert("a", E(1));
  REQUIRE(r.ok());
  CHECK_FALSE(r->has_value());
  CHECK(index.size() == 1);
  REQUIRE(index.Find("a").has_value());
  CHECK(*index.Find("a") == E(1));

  r = index.Upsert("a", E(2));
  REQUIRE(r.ok());
  REQUIRE(r->has_value());
  CHECK(**r == E(1));
  CHECK(*index.Find("a") == E(2));
  CHECK(index.size() == 1);

  auto gone = index.Erase("a");
  REQUIRE(gone.has_value());
  CHECK(*gone == E(2));
  CHECK_FALSE(index.Erase("a").has_value());
  CHECK(index.empty());
}

TEST_CASE("MetadataIndex keeps inline, boundary and long binary keys") {
  MetadataIndex index;
  std::string k31(31, '\0'), k32(32, '\xff'), k33(33, 'x'), k256(256, 'y');
  k32[5] = 0;
  k33[32] = 'z';
  REQUIRE(index.Upsert(k31, E(31)).ok());
  REQUIRE(index.Upsert(k32, E(32)).ok());
  REQUIRE(index.Upsert(k33, E(33)).ok());
  REQUIRE(index.Upsert(k256, E(256)).ok());
  CHECK(*index.Find(k31) == E(31));
  CHECK(*index.Find(k32) == E(32));
  CHECK(*index.Find(k33) == E(33));
  CHECK(*index.Find(k256) == E(256));
  CHECK_FALSE(index.Find(std::string(33, 'x')).has_value());
  CHECK_FALSE(index.Find(k32.substr(0, 31)).has_value());

  std::map<std::string, ObjectLocation> seen;
  index.ForEach([&](absl::string_view k, const ObjectLocation& e) {
    seen.emplace(std::string(k), e);
  });
  CHECK(seen.size() == 4);
  CHECK(seen[k256] == E(256));
  CHECK(index.Erase(k256).has_value());  // frees the out-of-line key
}

TEST_CASE("MetadataIndex rejects what it cannot store") {
  MetadataIndex index;
  CHECK(index.Upsert("", E(1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(index.Upsert(std::string(MetadataIndex::kMaxKeyBytes + 1, 'k'), E(1))
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  ObjectLocation big = E(1);
  big.length = MetadataIndex::kMaxLength + 1;
  CHECK(index.Upsert("k", big).status().code() ==
        absl::StatusCode::kInvalidArgument);
  big.length = MetadataIndex::kMaxLength;
  REQUIRE(index.Upsert("k", big).ok());
  CHECK(index.Find("k")->length == MetadataIndex::kMaxLength);
  CHECK(index.size() == 1);
}

TEST_CASE("MetadataIndex EraseIf removes matching entries") {
  MetadataIndex index;
  for (int i = 0; i < 1000; ++i) {
    std::string key = "key-" + std::to_string(i) + std::string(i % 50, 'p');
    REQUIRE(index.Upsert(key, E(i)).ok());
  }
  auto removed = index.EraseIf(
      [](absl::string_view, const ObjectLocation& e) { return e.node_id == 3; });
  CHECK(removed.size() > 100);
  CHECK(index.size() == 1000 - removed.size());
  for (auto& [k, e] : removed) {
    CHECK(e.node_id == 3);
    CHECK_FALSE(index.Find(k).has_value());
  }
  index.ForEach([](absl::string_view, const ObjectLocation& e) {
    CHECK(e.node_id != 3);
  });
}

TEST_CASE("MetadataIndex matches a std::map under random operations") {
  MetadataIndex index;
  std::map<std::string, ObjectLocation> model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50000; ++i) {
    std::string key = "k" + std::to_string(rng() % 3000);
    if (rng() % 4 == 0) key += std::string(40, 'L');  // out-of-line keys
    switch (rng() % 3) {
      case 0:
      case 1: {
        ObjectLocation e = E(rng() % 100000);
        auto r = index.Upsert(key, e);
        REQUIRE(r.ok());
        CHECK(r->has_value() == (model.count(key) == 1));
        model[key] = e;
        break;
      }
      case 2: {
        auto r = index.Erase(key);
        CHECK(r.has_value() == (model.erase(key) == 1));
        break;
      }
    }
  }
  REQUIRE(index.size() == model.size());
  for (auto& [k, e] : model) {
    auto f = index.Find(k);
    REQUIRE(f.has_value());
    CHECK(*f == e);
  }
  CHECK(index.MemoryBytes() > 0);
}

ObjectLocation OnNode(uint32_t node, uint64_t n) {
  ObjectLocation e = E(n);
  e.node_id = node;
  return e;
}

// Keys of `node` from the least recent end.
std::vector<std::string> Order(const MetadataIndex& index, uint32_t node) {
  std::vector<std::string> out;
  index.ForEachLeastRecent(
      node, [&](absl::string_view k, const ObjectLocation& e, uint32_t) {
        CHECK(e.node_id == node);
        out.emplace_back(k);
        return true;
      });
  return out;
}

using Keys = std::vector<std::string>;

TEST_CASE("MetadataIndex keeps an exact LRU list per node") {
  MetadataIndex index;
  CHECK(Order(index, 1).empty());
  for (const char* k : {"a", "b", "c"}) REQUIRE(index.Upsert(k, OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("x", OnNode(2, 2)).ok());
  CHECK(Order(index, 1) == Keys{"a", "b", "c"});
  CHECK(Order(index, 2) == Keys{"x"});

  // Touch moves to the most recent end and records the read tick.
  CHECK(index.Touch("a", 7));
  CHECK(Order(index, 1) == Keys{"b", "c", "a"});
  CHECK(*index.ReadTick("a") == 7);
  CHECK(*index.ReadTick("b") == 0);
  CHECK(index.Touch("a", 8));  // already most recent
  CHECK(Order(index, 1) == Keys{"b", "c", "a"});
  CHECK(*index.ReadTick("a") == 8);
  CHECK_FALSE(index.Touch("nope", 9));
  CHECK_FALSE(index.ReadTick("nope").has_value());

  // Replacing is a fresh insert: most recent, read tick cleared.
  REQUIRE(index.Upsert("b", OnNode(1, 5)).ok());
  CHECK(Order(index, 1) == Keys{"c", "a", "b"});
  REQUIRE(index.Touch("b", 3));
  REQUIRE(index.Upsert("b", OnNode(1, 6)).ok());
  CHECK(*index.ReadTick("b") == 0);
  // ... and moves lists when the node changes.
  REQUIRE(index.Upsert("c", OnNode(2, 5)).ok());
  CHECK(Order(index, 1) == Keys{"a", "b"});
  CHECK(Order(index, 2) == Keys{"x", "c"});

  // Erase unlinks from the middle and both ends.
  REQUIRE(index.Upsert("d", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("e", OnNode(1, 1)).ok());
  CHECK(Order(index, 1) == Keys{"a", "b", "d", "e"});
  CHECK(index.Erase("b").has_value());
  CHECK(Order(index, 1) == Keys{"a", "d", "e"});
  CHECK(index.Erase("a").has_value());
  CHECK(index.Erase("e").has_value());
  CHECK(Order(index, 1) == Keys{"d"});
  CHECK(index.Erase("d").has_value());
  CHECK(Order(index, 1).empty());
  // A reused record starts clean.
  REQUIRE(index.Upsert("f", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("g", OnNode(1, 1)).ok());
  CHECK(Order(index, 1) == Keys{"f", "g"});
  CHECK(*index.ReadTick("f") == 0);

  // The walk stops when fn returns false.
  int calls = 0;
  index.ForEachLeastRecent(2, [&](absl::string_view k, const ObjectLocation&,
                                  uint32_t) {
    ++calls;
    CHECK(k == "x");
    return false;
  });
  CHECK(calls == 1);
}

TEST_CASE("MetadataIndex: touching a chain tail-first leaves the head most recent") {
  MetadataIndex index;
  const Keys chain = {"k0", "k1", "k2", "k3"};
  for (const auto& k : chain) REQUIRE(index.Upsert(k, OnNode(1, 1)).ok());
  CHECK(Order(index, 1) == chain);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    REQUIRE(index.Touch(*it, 1));
  }
  CHECK(Order(index, 1) == Keys{"k3", "k2", "k1", "k0"});
}

TEST_CASE("MetadataIndex RebaseReadTicks lowers ticks and clears old ones") {
  MetadataIndex index;
  for (const char* k : {"a", "b", "c"}) REQUIRE(index.Upsert(k, OnNode(1, 1)).ok());
  REQUIRE(index.Touch("a", 100));
  REQUIRE(index.Touch("b", 1000));
  index.RebaseReadTicks(100);
  CHECK(*index.ReadTick("a") == 0);
  CHECK(*index.ReadTick("b") == 900);
  CHECK(*index.ReadTick("c") == 0);
  CHECK(Order(index, 1) == Keys{"c", "a", "b"});  // order untouched
}

TEST_CASE("MetadataIndex recency lists match a model under random operations") {
  MetadataIndex index;
  std::map<uint32_t, std::list<std::string>> model;  // least recent first
  std::map<std::string, uint32_t> node_of;
  std::map<std::string, uint32_t> tick_of;
  std::mt19937_64 rng(11);
  auto model_unlink = [&](const std::string& key) {
    auto& l = model[node_of[key]];
    l.erase(std::find(l.begin(), l.end(), key));
  };
  for (int i = 0; i < 20000; ++i) {
    std::string key = "k" + std::to_string(rng() % 500);
    if (rng() % 5 == 0) key += std::string(40, 'L');
    const bool present = node_of.count(key) == 1;
    switch (rng() % 6) {
      case 0:
      case 1: {
        const uint32_t node = static_cast<uint32_t>(rng() % 4 + 1);
        REQUIRE(index.Upsert(key, OnNode(node, rng() % 1000)).ok());
        if (present) model_unlink(key);
        model[node].push_back(key);
        node_of[key] = node;
        tick_of[key] = 0;
        break;
      }
      case 2:
      case 3: {
        const uint32_t tick = static_cast<uint32_t>(rng() % 1000 + 1);
        CHECK(index.Touch(key, tick) == present);
        if (present) {
          model_unlink(key);
          model[node_of[key]].push_back(key);
          tick_of[key] = tick;
        }
        break;
      }
      case 4: {
        CHECK(index.Erase(key).has_value() == present);
        if (present) {
          model_unlink(key);
          node_of.erase(key);
          tick_of.erase(key);
        }
        break;
      }
      case 5: {
        if (i % 50 != 0) break;
        const uint32_t node = static_cast<uint32_t>(rng() % 4 + 1);
        auto removed = index.EraseIf([&](absl::string_view k, const ObjectLocation& e) {
          return e.node_id == node && k.size() > 40;
        });
        for (auto& [k, e] : removed) {
          model_unlink(k);
          node_of.erase(k);
          tick_of.erase(k);
        }
        break;
      }
    }
  }
  for (uint32_t node = 1; node <= 4; ++node) {
    const auto& l = model[node];
    CHECK(Order(index, node) == Keys(l.begin(), l.end()));
  }
  for (const auto& [k, t] : tick_of) CHECK(*index.ReadTick(k) == t);
  CHECK(index.size() == node_of.size());
}

using index_test::Pick;
using index_test::Verdict;
using index_test::WalkEnd;

std::string ParentOf(const MetadataIndex& index, const std::string& key) {
  auto c = index.Chain(key);
  REQUIRE(c.has_value());
  return c->parent;
}

TEST_CASE("MetadataIndex links chains on one node, continuations below their parent") {
  MetadataIndex index;
  REQUIRE(index.Upsert("p", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("a1", OnNode(1, 1), "p").ok());
  REQUIRE(index.Upsert("a2", OnNode(1, 1), "a1").ok());
  REQUIRE(index.Upsert("b1", OnNode(1, 1), "p").ok());
  REQUIRE(index.Upsert("b2", OnNode(1, 1), "b1").ok());
  REQUIRE(index.Upsert("x", OnNode(1, 1)).ok());
  // A continuation shares the recency of the block it extends.
  CHECK(Order(index, 1) == Keys{"a2", "a1", "b2", "b1", "p", "x"});
  CHECK(index.Chain("p")->children == 2);
  CHECK(ParentOf(index, "p").empty());
  CHECK(ParentOf(index, "a2") == "a1");
  CHECK(index.Chain("a2")->children == 0);
  CHECK_FALSE(index.Chain("a2")->orphan);
  CHECK_FALSE(index.Chain("nope").has_value());

  // A parent on another node: a cross link; the child is a root of its
  // node's list, and its parent counts it apart. An absent parent makes a
  // root.
  REQUIRE(index.Upsert("q", OnNode(2, 1), "p").ok());
  CHECK(ParentOf(index, "q") == "p");
  CHECK(index.Chain("q")->cross);
  CHECK_FALSE(index.Chain("a1")->cross);
  CHECK(index.Chain("p")->children == 2);
  CHECK(index.Chain("p")->cross_children == 1);
  CHECK(Order(index, 2) == Keys{"q"});
  REQUIRE(index.Upsert("r", OnNode(1, 1), "nowhere").ok());
  CHECK(Order(index, 1).back() == "r");
  CHECK(index.Upsert("s", OnNode(1, 1), "s").status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Replacing a leaf moves its link.
  REQUIRE(index.Upsert("a2", OnNode(1, 1), "b2").ok());
  CHECK(index.Chain("a1")->children == 0);
  CHECK(index.Chain("b2")->children == 1);
  CHECK(ParentOf(index, "a2") == "b2");
  CHECK(Order(index, 1) == Keys{"a1", "a2", "b2", "b1", "p", "x", "r"});
  // Touch moves only the entry, never its links.
  REQUIRE(index.Touch("a2", 5));
  CHECK(ParentOf(index, "a2") == "b2");
  CHECK(index.Chain("b2")->children == 1);
}

TEST_CASE("MetadataIndex keeps every block less recent than its parent") {
  MetadataIndex index;
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("t1", OnNode(1, 1), "h").ok());
  REQUIRE(index.Upsert("t2", OnNode(1, 1), "t1").ok());
  REQUIRE(index.Upsert("u", OnNode(1, 1)).ok());
  REQUIRE(Order(index, 1) == Keys{"t2", "t1", "h", "u"});
  // A touched tail stays below its parent; a touched head takes only
  // itself to the most recent end.
  REQUIRE(index.Touch("t2", 1));
  CHECK(Order(index, 1) == Keys{"t2", "t1", "h", "u"});
  REQUIRE(index.Touch("h", 2));
  CHECK(Order(index, 1) == Keys{"t2", "t1", "u", "h"});
  REQUIRE(index.Touch("t1", 3));
  CHECK(Order(index, 1) == Keys{"t2", "u", "t1", "h"});
  CHECK(*index.ReadTick("t1") == 3);

  // A chain read in two calls (a pipelined Load), head first: ordered head
  // most recent, tail least, whatever the calls' order of touches.
  MetadataIndex chain;
  Keys c;
  for (int i = 0; i < 6; ++i) {
    c.push_back("c" + std::to_string(i));
    REQUIRE(chain.Upsert(c.back(), OnNode(1, 1), i ? c[i - 1] : "").ok());
    REQUIRE(chain.Upsert("x" + std::to_string(i), OnNode(1, 1)).ok());
  }
  CHECK(chain.TouchPrefix({c[0], c[1], c[2]}, 1) == 3);
  CHECK(chain.TouchPrefix({c[3], "missing", c[4], c[5]}, 2) == 3);
  Keys order = Order(chain, 1);
  CHECK(Keys(order.end() - 6, order.end()) ==
        Keys{c[5], c[4], c[3], c[2], c[1], c[0]});
  // Unrelated keys read together: the first ends up most recent.
  CHECK(chain.TouchPrefix({"x1", "x0"}, 3) == 2);
  order = Order(chain, 1);
  CHECK(Keys(order.end() - 2, order.end()) == Keys{"x0", "x1"});
}

TEST_CASE("MetadataIndex PickEvictions takes a chain's tail first, never a block with children") {
  MetadataIndex index;
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("t1", OnNode(1, 1), "h").ok());
  REQUIRE(index.Upsert("t2", OnNode(1, 1), "t1").ok());
  REQUIRE(index.Upsert("u", OnNode(1, 1)).ok());
  REQUIRE(index.Touch("h", 1));
  REQUIRE(index.Touch("t1", 1));
  REQUIRE(Order(index, 1) == Keys{"t2", "u", "t1", "h"});
  CHECK(Pick(index, 1, 1) == Keys{"t2"});
  CHECK(Pick(index, 1, 10) == Keys{"t2", "u", "t1", "h"});

  // A kept tail keeps its whole chain; a stop ends the walk.
  CHECK(Pick(index, 1, 10, [](absl::string_view k) {
          return k == "t2" ? Verdict::kKeep : Verdict::kEvict;
        }) == Keys{"u"});
  WalkEnd end;
  CHECK(Pick(index, 1, 10,
             [](absl::string_view k) {
               return k == "u" ? Verdict::kStop : Verdict::kEvict;
             },
             1000, &end) == Keys{"t2"});
  CHECK(end == WalkEnd::kStopped);
  CHECK(Pick(index, 1, 10, nullptr, 2, &end) == Keys{"t2", "u"});
  CHECK(end == WalkEnd::kScanLimit);
  CHECK(Pick(index, 1, 10, nullptr, 1000, &end).size() == 4);
  CHECK(end == WalkEnd::kListEnd);
  Pick(index, 1, 2, nullptr, 1000, &end);
  CHECK(end == WalkEnd::kEnough);
  CHECK(Pick(index, 9, 10, nullptr, 1000, &end).empty());
  CHECK(end == WalkEnd::kListEnd);

  // Two continuations of one prefix: the prefix goes after both.
  MetadataIndex branch;
  REQUIRE(branch.Upsert("p", OnNode(1, 1)).ok());
  REQUIRE(branch.Upsert("a", OnNode(1, 1), "p").ok());
  REQUIRE(branch.Upsert("b", OnNode(1, 1), "p").ok());
  REQUIRE(Order(branch, 1) == Keys{"a", "b", "p"});
  CHECK(Pick(branch, 1, 10) == Keys{"a", "b", "p"});
  CHECK(Pick(branch, 1, 10, [](absl::string_view k) {
          return k == "b" ? Verdict::kKeep : Verdict::kEvict;
        }) == Keys{"a"});
}

TEST_CASE(
    "MetadataIndex DemoteChain sends an ended chain's unshared tail to the "
    "least recent end") {
  // p is a prefix of two chains, a1-a2-a3 and b1; x and y are roots.
  MetadataIndex index;
  REQUIRE(index.Upsert("x", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("p", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("a1", OnNode(1, 1), "p").ok());
  REQUIRE(index.Upsert("a2", OnNode(1, 1), "a1").ok());
  REQUIRE(index.Upsert("a3", OnNode(1, 1), "a2").ok());
  REQUIRE(index.Upsert("b1", OnNode(1, 1), "p").ok());
  REQUIRE(index.Upsert("y", OnNode(1, 1)).ok());
  REQUIRE(Order(index, 1) == Keys{"x", "a3", "a2", "a1", "b1", "p", "y"});

  // Chain a ended: its own blocks go first, the shared p keeps its place.
  CHECK(index.DemoteChain(
            std::vector<absl::string_view>{"p", "a1", "a2", "a3"}) == 3);
  CHECK(Order(index, 1) == Keys{"a3", "a2", "a1", "x", "b1", "p", "y"});
  CHECK(Pick(index, 1, 3) == Keys{"a3", "a2", "a1"});
  // Again: nothing moves.
  CHECK(index.DemoteChain(
            std::vector<absl::string_view>{"p", "a1", "a2", "a3"}) == 0);
  // Read again, it moves back up (a Touch undoes a demotion).
  REQUIRE(index.TouchPrefix({"p", "a1", "a2", "a3"}, 1) == 4);
  CHECK(Order(index, 1) == Keys{"x", "b1", "y", "a3", "a2", "a1", "p"});

  // In runs, tail first, each ending with the head of the run before (as
  // a client sends a chain longer than one request): the same order.
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"a2", "a3"}) == 2);
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"p", "a1", "a2"}) ==
        1);
  CHECK(Order(index, 1) == Keys{"a3", "a2", "a1", "x", "b1", "y", "p"});

  // A tail already evicted: the walk starts at the last present key.
  REQUIRE(index.Erase("a3").has_value());
  REQUIRE(index.TouchPrefix({"p", "a1", "a2"}, 2) == 3);
  CHECK(index.DemoteChain(
            std::vector<absl::string_view>{"p", "a1", "a2", "a3"}) == 2);
  CHECK(Order(index, 1) == Keys{"a2", "a1", "x", "b1", "y", "p"});

  // Keys that are not one chain: only the last moves.
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"y", "b1"}) == 1);
  CHECK(Order(index, 1) == Keys{"b1", "a2", "a1", "x", "y", "p"});
  // A shared prefix alone (two children) moves nothing; nor absent keys.
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"p"}) == 0);
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"none", "nor"}) == 0);
  CHECK(Order(index, 1) == Keys{"b1", "a2", "a1", "x", "y", "p"});

  // A block whose chain goes on on another node keeps its place.
  REQUIRE(index.Upsert("c", OnNode(2, 1), "a2").ok());
  REQUIRE(index.Touch("a2", 3));
  const Keys before = Order(index, 1);
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"a1", "a2"}) == 0);
  CHECK(Order(index, 1) == before);
  CHECK(index.DemoteChain(std::vector<absl::string_view>{"a2", "c"}) == 0);
  CHECK(Order(index, 2) == Keys{"c"});
  CHECK(*index.ReadTick("a2") == 3);
}

TEST_CASE("MetadataIndex Adopt links a block committed before its parent") {
  MetadataIndex index;
  REQUIRE(index.Upsert("y5", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("y6", OnNode(1, 1), "y5").ok());
  REQUIRE(index.Upsert("s4", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("z", OnNode(2, 1)).ok());
  CHECK_FALSE(index.Adopt("y5", "nope"));
  CHECK_FALSE(index.Adopt("y6", "s4"));  // not a root
  CHECK(index.Adopt("y5", "s4"));
  CHECK(ParentOf(index, "y5") == "s4");
  CHECK(index.Chain("s4")->children == 1);
  CHECK_FALSE(index.Adopt("s4", "y6"));  // would be a cycle
  CHECK(Order(index, 1) == Keys{"y6", "y5", "s4"});
  // On another node: cross-linked, and it stays where it is in its list.
  CHECK(index.Adopt("z", "s4"));
  CHECK(index.Chain("z")->cross);
  CHECK(index.Chain("s4")->children == 1);
  CHECK(index.Chain("s4")->cross_children == 1);
  CHECK(Order(index, 2) == Keys{"z"});
  CHECK(Order(index, 1) == Keys{"y6", "y5", "s4"});

  // Adopting a block more recent than its new parent leaves its tail above
  // it; the eviction walk still takes the tail, then the block, then the
  // parent.
  MetadataIndex late;
  REQUIRE(late.Upsert("p", OnNode(1, 1)).ok());
  REQUIRE(late.Upsert("c", OnNode(1, 1)).ok());
  REQUIRE(late.Upsert("d", OnNode(1, 1), "c").ok());
  REQUIRE(late.Adopt("c", "p"));
  REQUIRE(Order(late, 1) == Keys{"c", "p", "d"});
  CHECK(Pick(late, 1, 10) == Keys{"d", "c", "p"});
  CHECK(Pick(late, 1, 2) == Keys{"d", "c"});
}

TEST_CASE("MetadataIndex: a chain continued on another node is orphaned with its head") {
  MetadataIndex index;
  index.TrackUsed(true);
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("t1", OnNode(2, 1), "h").ok());   // node 1 was full
  REQUIRE(index.Upsert("t2", OnNode(2, 1), "t1").ok());
  REQUIRE(index.Upsert("u", OnNode(3, 1), "t2").ok());   // and node 2 too
  REQUIRE(index.Upsert("y", OnNode(2, 1)).ok());
  // Per node, h and t2 are leaves: eviction and recency stay per node.
  CHECK(index.Chain("h")->children == 0);
  CHECK(index.Chain("h")->cross_children == 1);
  CHECK(Pick(index, 1, 10) == Keys{"h"});
  CHECK(Order(index, 2) == Keys{"t2", "t1", "y"});
  // A cross-linked block touched is a root of its list: most recent.
  REQUIRE(index.Touch("t1", 5));
  CHECK(Order(index, 2) == Keys{"t2", "y", "t1"});
  CHECK(index.CollectUsed(10).size() == 1);  // clears the used bit only
  CHECK(index.Chain("t1")->cross);

  // Evicting (or losing) the head orphans the tails on the other nodes.
  REQUIRE(index.Erase("h").has_value());
  CHECK(index.ghost_count() == 1);
  CHECK(index.Chain("t1")->orphan);
  CHECK(index.Chain("u")->orphan);
  std::set<std::string> orphans;
  for (auto& [k, e] : index.Orphans()) orphans.insert(k);
  CHECK(orphans == std::set<std::string>{"t1", "t2", "u"});
  for (const auto& k : orphans) REQUIRE(index.Erase(k).has_value());
  CHECK(index.ghost_count() == 0);
  CHECK(index.Orphans().empty());
  CHECK(index.size() == 1);

  // A key stored again (elsewhere) keeps its children on every node,
  // linked to it: the key is still listed, so readers still reach them.
  REQUIRE(index.Upsert("h", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("c1", OnNode(1, 1), "h").ok());
  REQUIRE(index.Upsert("c2", OnNode(2, 1), "h").ok());
  REQUIRE(index.Upsert("h", OnNode(2, 1)).ok());
  CHECK(index.Chain("c1")->cross);
  CHECK_FALSE(index.Chain("c2")->cross);
  CHECK(index.Chain("h")->children == 1);
  CHECK(index.Chain("h")->cross_children == 1);
  CHECK(index.Orphans().empty());
  REQUIRE(index.Erase("h").has_value());
  std::set<std::string> lost;
  for (auto& [k, e] : index.Orphans()) lost.insert(k);
  CHECK(lost == std::set<std::string>{"c1", "c2"});
  for (const auto& k : lost) REQUIRE(index.Erase(k).has_value());
  CHECK(index.ghost_count() == 0);
}

TEST_CASE("MetadataIndex: erasing a block with children leaves orphans until they go") {
  MetadataIndex index;
  REQUIRE(index.Upsert("a", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("b", OnNode(1, 1), "a").ok());
  REQUIRE(index.Upsert("c", OnNode(1, 1), "b").ok());
  REQUIRE(index.Upsert("d", OnNode(1, 1), "c").ok());
  REQUIRE(index.Upsert("x", OnNode(2, 1)).ok());
  CHECK(index.Orphans().empty());

  REQUIRE(index.Erase("b").has_value());
  CHECK(index.ghost_count() == 1);
  CHECK(index.size() == 4);
  CHECK(index.Chain("a")->children == 0);  // the parent is free to go
  CHECK(index.Chain("c")->orphan);
  CHECK(index.Chain("d")->orphan);
  CHECK(ParentOf(index, "c").empty());
  CHECK_FALSE(index.Find("b").has_value());
  std::set<std::string> orphans;
  for (auto& [k, e] : index.Orphans()) orphans.insert(k);
  CHECK(orphans == std::set<std::string>{"c", "d"});
  // Erasing the orphans (here parents first) frees every ghost.
  REQUIRE(index.Erase("c").has_value());
  CHECK(index.ghost_count() == 1);  // b freed, c now a ghost holding d
  REQUIRE(index.Erase("d").has_value());
  CHECK(index.ghost_count() == 0);
  CHECK(index.Orphans().empty());
  CHECK(Order(index, 1) == Keys{"a"});

  // Replacing a key that has children (stored again on another node): the
  // key is still listed, so its children stay reachable through it, linked
  // to it across nodes now, not orphans.
  REQUIRE(index.Upsert("b", OnNode(1, 2), "a").ok());
  REQUIRE(index.Upsert("c", OnNode(1, 3), "b").ok());
  auto old = index.Upsert("b", OnNode(2, 4));
  REQUIRE(old.ok());
  CHECK(**old == OnNode(1, 2));
  CHECK(index.ghost_count() == 0);
  CHECK_FALSE(index.Chain("c")->orphan);
  CHECK(ParentOf(index, "c") == "b");
  CHECK(index.Chain("c")->cross);
  CHECK(index.Chain("b")->children == 0);
  CHECK(index.Chain("b")->cross_children == 1);
  CHECK(index.Chain("a")->children == 0);
  CHECK(*index.Find("b") == OnNode(2, 4));
  CHECK(index.Orphans().empty());
  CHECK(index.size() == 4);  // c stays
  // Stored again on c's node: a same-node link, c just below it.
  REQUIRE(index.Upsert("b", OnNode(1, 5)).ok());
  CHECK_FALSE(index.Chain("c")->cross);
  CHECK(index.Chain("b")->children == 1);
  CHECK(index.Chain("b")->cross_children == 0);
  CHECK(Order(index, 1) == Keys{"a", "c", "b"});
  // Losing it later orphans c.
  REQUIRE(index.Erase("b").has_value());
  CHECK(index.Chain("c")->orphan);
  // A key stored again under its own descendant: a root, not a cycle.
  REQUIRE(index.Upsert("b", OnNode(1, 6), "a").ok());
  REQUIRE(index.Upsert("c", OnNode(1, 7), "b").ok());
  REQUIRE(index.Upsert("b", OnNode(2, 8), "c").ok());
  CHECK(ParentOf(index, "b").empty());
  CHECK(ParentOf(index, "c") == "b");
}

TEST_CASE("MetadataIndex CollectUsed hands out each touched entry once") {
  MetadataIndex index;
  for (const char* k : {"a", "b", "c"}) REQUIRE(index.Upsert(k, OnNode(1, 1)).ok());
  REQUIRE(index.Touch("a", 1));  // not tracked yet
  CHECK(index.CollectUsed(10).empty());
  index.TrackUsed(true);
  REQUIRE(index.Touch("a", 2));
  REQUIRE(index.Touch("b", 3));
  REQUIRE(index.Touch("a", 4));
  CHECK(index.used_queued() == 2);
  using Used = std::vector<std::pair<std::string, uint32_t>>;
  CHECK(index.CollectUsed(1) == Used{{"a", 4}});
  CHECK(index.CollectUsed(10) == Used{{"b", 3}});
  CHECK(index.CollectUsed(10).empty());
  // Erased entries are skipped; a reused record starts unqueued.
  REQUIRE(index.Touch("c", 5));
  REQUIRE(index.Touch("a", 6));
  REQUIRE(index.Erase("c").has_value());
  REQUIRE(index.Upsert("d", OnNode(1, 1)).ok());
  CHECK(index.CollectUsed(10) == Used{{"a", 6}});
  REQUIRE(index.Touch("d", 7));
  index.TrackUsed(false);
  CHECK(index.used_queued() == 0);
  REQUIRE(index.Touch("d", 8));
  CHECK(index.CollectUsed(10).empty());
}

TEST_CASE("MetadataIndex LoadEntry/FinishLoad rebuild chains, recency and drop broken chains") {
  MetadataIndex index;
  struct L {
    const char* key;
    uint32_t node;
    const char* parent;
    uint64_t last_use;
  };
  // Children before parents, and across nodes.
  const std::vector<L> loads = {
      {"x2", 1, "x1", 7},  {"x1", 1, "x0", 50},   {"o2", 1, "o1", 60},
      {"w", 2, "y1", 1},   {"y1", 1, "y0", 21},   {"z", 1, "", 30},
      {"o1", 1, "gone", 40}, {"y0", 1, "", 20},   {"x0", 1, "", 5},
      {"old", 1, "", 0},
  };
  for (const L& l : loads) {
    REQUIRE(index.LoadEntry(l.key, OnNode(l.node, 1), l.parent, l.last_use).ok());
  }
  CHECK(index.LoadEntry("z", OnNode(1, 1), "", 1).code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(index.Find("x2").has_value());
  std::set<std::string> dropped;
  for (auto& [k, e] : index.FinishLoad()) dropped.insert(k);
  CHECK(dropped == std::set<std::string>{"o1", "o2"});
  CHECK(index.size() == 8);
  CHECK(index.ghost_count() == 0);
  // A chain is as recent as its most recent block (x: 50); children below
  // their parents.
  CHECK(Order(index, 1) == Keys{"old", "x2", "y1", "y0", "z", "x1", "x0"});
  CHECK(Order(index, 2) == Keys{"w"});
  CHECK(ParentOf(index, "x2") == "x1");
  CHECK(ParentOf(index, "x1") == "x0");
  CHECK(ParentOf(index, "w") == "y1");  // across nodes
  CHECK(index.Chain("w")->cross);
  CHECK(index.Chain("y1")->cross_children == 1);
  CHECK(index.Chain("y0")->children == 1);
  CHECK(Pick(index, 1, 10) == Keys{"old", "x2", "y1", "y0", "z", "x1", "x0"});
  // The index works as usual afterwards.
  REQUIRE(index.Upsert("x3", OnNode(1, 1), "x2").ok());
  CHECK(index.Chain("x2")->children == 1);
}

TEST_CASE("MetadataIndex: touching an orphan whose parent is a ghost keeps the list whole") {
  MetadataIndex index;
  REQUIRE(index.Upsert("a", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("b", OnNode(1, 1), "a").ok());
  REQUIRE(index.Upsert("c", OnNode(1, 1), "b").ok());
  REQUIRE(index.Upsert("z", OnNode(1, 1)).ok());
  REQUIRE(index.Erase("b").has_value());  // b: a ghost; c: an orphan
  REQUIRE(index.Touch("c", 5));          // as a root: most recent
  CHECK(Order(index, 1) == Keys{"a", "z", "c"});
  auto orphans = index.Orphans();
  REQUIRE(orphans.size() == 1);
  CHECK(orphans[0].first == "c");
  REQUIRE(index.Erase("c").has_value());
  CHECK(index.ghost_count() == 0);
  CHECK(Order(index, 1) == Keys{"a", "z"});
}

TEST_CASE("MetadataIndex Clear leaves an index as new, mid-load too") {
  MetadataIndex index;
  index.TrackUsed(true);
  const std::string long_key(100, 'L');
  REQUIRE(index.Upsert("a", OnNode(1, 1)).ok());
  REQUIRE(index.Upsert("b", OnNode(1, 1), "a").ok());
  REQUIRE(index.Upsert(long_key, OnNode(2, 1), "a").ok());  // cross link
  REQUIRE(index.Touch("b", 3));
  CHECK(index.Erase("a").has_value());  // b and long_key: orphans
  CHECK(index.ghost_count() == 1);
  index.Clear();
  CHECK(index.empty());
  CHECK(index.ghost_count() == 0);
  CHECK(index.used_queued() == 0);
  CHECK(index.UsageOf("default").objects == 0);
  CHECK_FALSE(index.Find("b").has_value());
  CHECK(Order(index, 1).empty());
  // A load interrupted by Clear starts over cleanly.
  REQUIRE(index.LoadEntry("x", OnNode(1, 1), "", 1).ok());
  index.Clear();
  REQUIRE(index.LoadEntry("x", OnNode(1, 1), "", 1).ok());
  REQUIRE(index.LoadEntry(long_key, OnNode(1, 1), "x", 2).ok());
  CHECK(index.FinishLoad().empty());
  CHECK(Order(index, 1) == Keys{long_key, "x"});
  REQUIRE(index.Touch("x", 4));
  CHECK(index.used_queued() == 1);  // TrackUsed stays on
}

TEST_CASE("MetadataIndex chains stay consistent under random operations") {
  MetadataIndex index;
  std::mt19937_64 rng(23);
  std::vector<std::string> live;
  bool saw_cross = false;
  auto key = [&](uint64_t n) { return "k" + std::to_string(n); };
  for (int i = 0; i < 20000; ++i) {
    const std::string k = key(rng() % 400);
    const uint32_t node = static_cast<uint32_t>(rng() % 2 + 1);
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {
        const std::string parent = rng() % 4 == 0 ? "" : key(rng() % 400);
        if (parent == k) break;
        REQUIRE(index.Upsert(k, OnNode(node, 1), parent).ok());
        if (index.Chain(k)->cross) saw_cross = true;
        break;
      }
      case 3:
        if (rng() % 2) {
          index.Touch(k, 1);
        } else {
          index.TouchPrefix({k, key(rng() % 400), key(rng() % 400)}, 2);
        }
        break;
      case 4:
        index.Erase(k);
        break;
      case 5: {
        // Evict a few in the order chosen: creates a ghost only for a
        // victim with children on another node (it may free some, taking
        // orphans).
        size_t ghosts = index.ghost_count();
        for (const std::string& v : Pick(index, node, rng() % 8 + 1)) {
          const auto c = index.Chain(v);
          REQUIRE(c.has_value());
          CHECK(c->children == 0);
          if (c->cross_children > 0) ++ghosts;
          REQUIRE(index.Erase(v).has_value());
        }
        CHECK(index.ghost_count() <= ghosts);
        break;
      }
      case 6:
        if (i % 100 == 0) {
          for (auto& [o, e] : index.Orphans()) REQUIRE(index.Erase(o).has_value());
          CHECK(index.ghost_count() == 0);
        }
        break;
      case 7: {
        // An ended chain: k and up to 5 of its ancestors, head first, or
        // a run of it.
        Keys chain{k};
        for (auto c = index.Chain(k);
             c && !c->parent.empty() && chain.size() < 6;
             c = index.Chain(c->parent)) {
          chain.insert(chain.begin(), c->parent);
        }
        if (rng() % 2 && chain.size() > 2) chain.pop_back();
        std::vector<absl::string_view> views(chain.begin(), chain.end());
        index.DemoteChain(views);
        break;
      }
    }
  }
  // Every block is less recent than its parent.
  for (uint32_t node = 1; node <= 2; ++node) {
    std::map<std::string, size_t> pos;
    for (const auto& k : Order(index, node)) pos.emplace(k, pos.size());
    for (const auto& [k, at] : pos) {
      const auto c = index.Chain(k);
      if (!c->parent.empty() && !c->cross) CHECK(at < pos.at(c->parent));
    }
  }
  // Child counts match the parent links.
  std::map<std::string, uint32_t> children, cross_children;
  index.ForEach([&](absl::string_view k, const ObjectLocation& e) {
    const auto c = index.Chain(k);
    if (c->parent.empty()) return;
    const bool same = index.Find(c->parent)->node_id == e.node_id;
    CHECK(c->cross == !same);
    ++(same ? children : cross_children)[c->parent];
  });
  CHECK(saw_cross);
  index.ForEach([&](absl::string_view k, const ObjectLocation&) {
    CHECK(index.Chain(k)->children == children[std::string(k)]);
    CHECK(index.Chain(k)->cross_children == cross_children[std::string(k)]);
  });
  for (auto& [o, e] : index.Orphans()) REQUIRE(index.Erase(o).has_value());
  CHECK(index.ghost_count() == 0);
  CHECK(index.Orphans().empty());
}

TEST_CASE("MetadataIndex counts objects and bytes per tenant") {
  MetadataIndex index;
  const std::string a1 = QualifyKey("acme", "k1");
  const std::string a2 = QualifyKey("acme", "k2");
  const std::string b1 = QualifyKey("blue", "k1");
  CHECK(TenantOfKey(a1) == "acme");
  CHECK(TenantOfKey("k1") == kDefaultTenantName);
  CHECK(QualifyKey("default", "k1") == "k1");
  REQUIRE(index.Upsert("k1", E(10)).ok());  // default tenant: length 11
  REQUIRE(index.Upsert(a1, E(1)).ok());     // 2 bytes
  REQUIRE(index.Upsert(a2, E(2), a1).ok());  // 3 bytes, a child of a1
  REQUIRE(index.Upsert(b1, E(4)).ok());     // 5 bytes
  CHECK(index.UsageOf("acme").objects == 2);
  CHECK(index.UsageOf("acme").bytes == 5);
  CHECK(index.UsageOf("blue").bytes == 5);
  CHECK(index.UsageOf("default").objects == 1);
  CHECK(index.UsageOf("default").bytes == 11);
  CHECK(index.UsageOf("nobody").objects == 0);
  // Replacing changes the bytes; erasing a parent (a ghost stays for its
  // child) and then the child count once each.
  REQUIRE(index.Upsert(a2, E(20), a1).ok());  // 21 bytes
  CHECK(index.UsageOf("acme").bytes == 23);
  CHECK(index.Erase(a1).has_value());
  CHECK(index.UsageOf("acme").objects == 1);
  CHECK(index.UsageOf("acme").bytes == 21);
  CHECK(index.Erase(a2).has_value());
  CHECK(index.UsageOf("acme").objects == 0);
  auto all = index.AllTenantUsage();
  CHECK(all.size() == 2);
  CHECK(all.count("blue") == 1);
  CHECK(all.count("default") == 1);
}

TEST_CASE("MetadataIndex keeps locations that do not pack, and frees shapes") {
  // At most 3 packed (node, region, length) shapes: the 4th and later are
  // stored apart, as are addresses and generations of 48 bits or more.
  MetadataIndex index(3);
  std::map<std::string, ObjectLocation> model;
  auto put = [&](const std::string& key, ObjectLocation e,
                 const std::string& parent = "") {
    REQUIRE(index.Upsert(key, e, parent).ok());
    model[key] = e;
  };
  ObjectLocation wide_addr = OnNode(1, 1);
  wide_addr.addr = (uint64_t{1} << 48) + 64;
  ObjectLocation wide_gen = OnNode(1, 2);
  wide_gen.generation = ~uint64_t{0};
  ObjectLocation edge = OnNode(1, 3);
  edge.addr = (uint64_t{1} << 48) - 1;
  edge.generation = (uint64_t{1} << 48) - 1;
  put("a", wide_addr);
  put("g", wide_gen, "a");
  put("e", edge, "g");
  for (int n = 0; n < 8; ++n) {
    ObjectLocation e = OnNode(static_cast<uint32_t>(n % 3 + 1), 0);
    e.region_id = static_cast<uint32_t>(n);  // 8 shapes: 5 of them wide
    e.length = 4096 + n;
    put("s" + std::to_string(n), e, n > 0 ? "s" + std::to_string(n - 1) : "");
  }
  for (const auto& [k, e] : model) CHECK(*index.Find(k) == e);
  CHECK(index.Chain("e")->parent == "g");
  CHECK(index.Chain("g")->parent == "a");
  CHECK_FALSE(index.Chain("g")->cross);
  // Moving a wide entry to a packed location and back; erasing frees the
  // shapes for others.
  put("a", OnNode(1, 5));
  put("a", wide_addr);
  for (int n = 0; n < 8; ++n) {
    const std::string k = "s" + std::to_string(n);
    if (n % 2 == 0) {
      REQUIRE(index.Erase(k).has_value());
      model.erase(k);
    }
  }
  for (int n = 8; n < 12; ++n) {
    ObjectLocation e = OnNode(2, 0);
    e.length = 100 + n;
    put("t" + std::to_string(n), e);
  }
  for (const auto& [k, e] : model) CHECK(*index.Find(k) == e);
  CHECK(index.size() == model.size());
  // Order and recency work the same for wide entries.
  index.Touch("a", 9);
  CHECK(Order(index, 1).back() == "a");
  CHECK(*index.ReadTick("a") == 9);
  // Erasing s0, s2, ... left ghosts: their orphans go.
  for (auto& [o, e] : index.Orphans()) {
    REQUIRE(index.Erase(o).has_value());
    model.erase(o);
  }
  // A snapshot round trip keeps them.
  std::string stream;
  REQUIRE(index.Save([&](absl::string_view piece) {
                 stream.append(piece.data(), piece.size());
                 return absl::OkStatus();
               }).ok());
  MetadataIndex restored(2);
  REQUIRE(restored.Restore(stream).ok());
  for (const auto& [k, e] : model) CHECK(*restored.Find(k) == e);
  CHECK(restored.Chain("e")->parent == "g");
}

TEST_CASE("MetadataIndex counts many children per block") {
  MetadataIndex index;
  REQUIRE(index.Upsert("p", OnNode(1, 1)).ok());
  for (int n = 0; n < 20; ++n) {
    REQUIRE(index.Upsert("c" + std::to_string(n), OnNode(1, 1), "p").ok());
    CHECK(index.Chain("p")->children == static_cast<uint32_t>(n + 1));
  }
  // Not a leaf until its last child goes.
  for (int n = 0; n < 20; ++n) {
    const Keys picked = Pick(index, 1, static_cast<size_t>(20 - n));
    CHECK(std::find(picked.begin(), picked.end(), "p") == picked.end());
    CHECK(Pick(index, 1, 100).back() == "p");
    REQUIRE(index.Erase("c" + std::to_string(n)).has_value());
    CHECK(index.Chain("p")->children == static_cast<uint32_t>(19 - n));
  }
  CHECK(Pick(index, 1, 100) == Keys{"p"});
  // A parent with many children erased: a ghost until they all go.
  for (int n = 0; n < 10; ++n) {
    REQUIRE(index.Upsert("d" + std::to_string(n), OnNode(1, 1), "p").ok());
  }
  REQUIRE(index.Erase("p").has_value());
  CHECK(index.ghost_count() == 1);
  CHECK(index.Orphans().size() == 10);
  for (auto& [o, e] : index.Orphans()) REQUIRE(index.Erase(o).has_value());
  CHECK(index.ghost_count() == 0);
  CHECK(index.empty());
}

TEST_CASE("MetadataIndex hash table stays whole through growth and churn") {
  MetadataIndex index;
  std::set<uint64_t> live;
  std::mt19937_64 rng(99);
  auto key = [](uint64_t n) {
    std::string k(32, '\0');
    for (int w = 0; w < 4; ++w) {
      const uint64_t v = n * 0x9e3779b97f4a7c15ull + uint64_t(w);
      std::memcpy(&k[w * 8], &v, 8);
    }
    return k;
  };
  for (int round = 0; round < 4; ++round) {
    // Grow to 20,000, then erase most (deleted slots pile up), repeat.
    while (live.size() < 20000) {
      const uint64_t n = rng() % 1000000;
      REQUIRE(index.Upsert(key(n), OnNode(1, n)).ok());
      live.insert(n);
    }
    for (auto it = live.begin(); it != live.end();) {
      if (rng() % 8 != 0) {
        REQUIRE(index.Erase(key(*it)).has_value());
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    REQUIRE(index.size() == live.size());
    for (uint64_t n : live) REQUIRE(index.Find(key(n)).has_value());
    for (int k = 0; k < 1000; ++k) {
      const uint64_t n = rng() % 1000000;
      CHECK(index.Find(key(n)).has_value() == (live.count(n) == 1));
    }
  }
  index.Reserve(100000);
  for (uint64_t n : live) REQUIRE(index.Find(key(n)).has_value());
}

TEST_CASE("MetadataIndex Prefetch of any keys changes nothing") {
  MetadataIndex index;
  const std::string long_key(200, 'k');  // kept out of line
  std::vector<std::string> keys = {"a", "absent", "", long_key};
  for (int i = 0; i < 100; ++i) keys.push_back("n" + std::to_string(i));
  std::vector<absl::string_view> views(keys.begin(), keys.end());
  index.Prefetch(views);  // an empty index
  index.Prefetch({});
  REQUIRE(index.Upsert("a", E(1)).ok());
  REQUIRE(index.Upsert(long_key, E(2), "a").ok());
  for (int i = 0; i < 100; i += 2) {
    REQUIRE(index.Upsert("n" + std::to_string(i), E(10 + i)).ok());
  }
  REQUIRE(index.Erase("n0").has_value());  // an erased slot
  const size_t size = index.size();
  // More keys than kPrefetchKeys: the first ones are taken.
  index.Prefetch(views);
  index.Prefetch(absl::MakeConstSpan(views).subspan(60));
  CHECK(index.size() == size);
  CHECK(index.Find("a")->generation == E(1).generation);
  CHECK(index.Find(long_key)->generation == E(2).generation);
  CHECK_FALSE(index.Find("n0").has_value());
  CHECK_FALSE(index.Find("n1").has_value());
  CHECK(index.Find("n98")->generation == E(108).generation);
  CHECK_FALSE(index.Find("absent").has_value());
}

TEST_CASE(
    "The index counts its copies through every insert, erase and restore") {
  MetadataIndex index;
  CHECK(index.copy_count() == 0);
  REQUIRE(index.Upsert("a", E(1)).ok());
  REQUIRE(index.Upsert(ReplicaKeyOf("a"), E(2)).ok());
  REQUIRE(index.Upsert("b", E(3), "a").ok());
  REQUIRE(index.Upsert(ReplicaKeyOf("b"), E(4), ReplicaKeyOf("a")).ok());
  CHECK(index.copy_count() == 2);
  // A copy stored again is still one copy.
  REQUIRE(index.Upsert(ReplicaKeyOf("b"), E(5), ReplicaKeyOf("a")).ok());
  CHECK(index.copy_count() == 2);

  std::string stream;
  REQUIRE(index
              .Save([&](absl::string_view piece) {
                stream.append(piece.data(), piece.size());
                return absl::OkStatus();
              })
              .ok());
  MetadataIndex restored;
  REQUIRE(restored.Restore(stream).ok());
  CHECK(restored.copy_count() == 2);

  REQUIRE(index.Erase(ReplicaKeyOf("b")).has_value());
  CHECK(index.copy_count() == 1);
  REQUIRE(index.Erase("a").has_value());  // its copy stays
  CHECK(index.copy_count() == 1);
  index.Clear();
  CHECK(index.copy_count() == 0);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
