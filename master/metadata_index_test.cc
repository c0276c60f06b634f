#include "master/metadata_index.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>

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

}  // namespace
}  // namespace master
}  // namespace hymcache
