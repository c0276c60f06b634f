#include "master/metadata_index.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <list>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace hymcache {
namespace master {
namespace {

IndexEntry E(uint64_t n) {
  IndexEntry e;
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

  std::map<std::string, IndexEntry> seen;
  index.ForEach([&](absl::string_view k, const IndexEntry& e) {
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
  IndexEntry big = E(1);
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
      [](absl::string_view, const IndexEntry& e) { return e.node_id == 3; });
  CHECK(removed.size() > 100);
  CHECK(index.size() == 1000 - removed.size());
  for (auto& [k, e] : removed) {
    CHECK(e.node_id == 3);
    CHECK_FALSE(index.Find(k).has_value());
  }
  index.ForEach([](absl::string_view, const IndexEntry& e) {
    CHECK(e.node_id != 3);
  });
}

TEST_CASE("MetadataIndex matches a std::map under random operations") {
  MetadataIndex index;
  std::map<std::string, IndexEntry> model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50000; ++i) {
    std::string key = "k" + std::to_string(rng() % 3000);
    if (rng() % 4 == 0) key += std::string(40, 'L');  // out-of-line keys
    switch (rng() % 3) {
      case 0:
      case 1: {
        IndexEntry e = E(rng() % 100000);
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

IndexEntry OnNode(uint32_t node, uint64_t n) {
  IndexEntry e = E(n);
  e.node_id = node;
  return e;
}

// Keys of `node` from the least recent end.
std::vector<std::string> Order(const MetadataIndex& index, uint32_t node) {
  std::vector<std::string> out;
  index.ForEachLeastRecent(
      node, [&](absl::string_view k, const IndexEntry& e, uint32_t) {
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
  index.ForEachLeastRecent(2, [&](absl::string_view k, const IndexEntry&,
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
        auto removed = index.EraseIf([&](absl::string_view k, const IndexEntry& e) {
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

}  // namespace
}  // namespace master
}  // namespace hymcache
