#include "master/record_table.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace hymcache {
namespace master {
namespace {

// The caller's side of a lookup: the hash and key of each record number
// (here a record's key is its number).
struct Keys {
  std::map<uint32_t, size_t> hash_of;

  void Insert(RecordTable& t, uint32_t r, size_t hash) {
    hash_of[r] = hash;
    t.Insert(hash, r);
  }
  void Erase(RecordTable& t, uint32_t r) {
    t.Erase(hash_of.at(r), r);
    hash_of.erase(r);
  }
  uint32_t Find(const RecordTable& t, uint32_t key) const {
    auto it = hash_of.find(key);
    const size_t hash = it == hash_of.end() ? HashOfMissing(key) : it->second;
    return t.Find(hash, [key](uint32_t r) { return r == key; });
  }
  static size_t HashOfMissing(uint32_t key) {
    return static_cast<size_t>(key) * 0x9e3779b97f4a7c15ull;
  }
};

TEST_CASE("An empty record table finds nothing") {
  RecordTable t(0);
  CHECK(t.size() == 0);
  CHECK(t.HasRoom());
  size_t calls = 0;
  CHECK(t.Find(12345, [&calls](uint32_t) {
          ++calls;
          return true;
        }) == RecordTable::kNone);
  CHECK(calls == 0);  // no slot holds a record, none is compared
}

TEST_CASE("A record table finds each record by its hash and the caller's "
          "comparison") {
  RecordTable t(1000);
  Keys keys;
  std::mt19937_64 rng(7);
  for (uint32_t r = 0; r < 1000; ++r) keys.Insert(t, r, rng());
  CHECK(t.size() == 1000);
  for (uint32_t r = 0; r < 1000; ++r) CHECK(keys.Find(t, r) == r);
  CHECK(keys.Find(t, 5000) == RecordTable::kNone);
}

TEST_CASE("A record table holds records whose hashes are all equal") {
  // One home group of 7 slots: the rest overflow into the groups after it,
  // and a lookup follows the overflow count there.
  RecordTable t(100);
  Keys keys;
  for (uint32_t r = 0; r < 40; ++r) keys.Insert(t, r, 42);
  for (uint32_t r = 0; r < 40; ++r) CHECK(keys.Find(t, r) == r);

  SECTION("erasing one leaves the others findable") {
    keys.Erase(t, 3);
    keys.Erase(t, 20);
    CHECK(t.size() == 38);
    CHECK(t.Find(42, [](uint32_t r) { return r == 3; }) == RecordTable::kNone);
    CHECK(t.Find(42, [](uint32_t r) { return r == 20; }) ==
          RecordTable::kNone);
    for (uint32_t r = 0; r < 40; ++r) {
      if (r != 3 && r != 20) CHECK(keys.Find(t, r) == r);
    }
  }
  SECTION("erasing all of them makes room for the same records again") {
    for (uint32_t r = 0; r < 40; ++r) keys.Erase(t, r);
    CHECK(t.size() == 0);
    for (uint32_t r = 0; r < 40; ++r) keys.Insert(t, r, 42);
    CHECK(t.size() == 40);
    for (uint32_t r = 0; r < 40; ++r) CHECK(keys.Find(t, r) == r);
  }
}

TEST_CASE("A record table's probe wraps from its last group to its first") {
  // 10 entries: 12 slots, two groups. The largest hash's home is the last
  // group; the eighth such record wraps into group 0.
  RecordTable t(10);
  Keys keys;
  const size_t last = ~size_t{0};
  for (uint32_t r = 0; r < 8; ++r) keys.Insert(t, r, last);
  for (uint32_t r = 0; r < 8; ++r) CHECK(keys.Find(t, r) == r);
  keys.Erase(t, 0);
  CHECK(keys.Find(t, 7) == 7);
  CHECK(keys.Find(t, 0) == RecordTable::kNone);
}

TEST_CASE("A record table fills to 7/8 of its slots before it needs a "
          "rebuild") {
  RecordTable t(0);  // one group of 7 slots: room for 6
  CHECK(t.MemoryBytes() == 36);
  Keys keys;
  uint32_t r = 0;
  for (; t.HasRoom(); ++r) keys.Insert(t, r, size_t{1000} + r);
  CHECK(r == 6);
  CHECK_FALSE(t.HasRoomFor(7));
  CHECK(t.HasRoomFor(6));
  CHECK(t.GrowTarget() == 6 + 6 / 4 + 7);

  RecordTable grown(t.GrowTarget());
  CHECK(grown.HasRoomFor(t.GrowTarget()));
  CHECK(grown.MemoryBytes() % 36 == 0);
  for (const auto& [rec, hash] : keys.hash_of) grown.Insert(hash, rec);
  for (uint32_t k = 0; k < r; ++k) CHECK(keys.Find(grown, k) == k);
}

TEST_CASE("A record table compares only records whose hash tag matches") {
  RecordTable t(100);
  // Same home group (the low 7 bits are the tag, the rest picks the
  // group), tags 1 and 2.
  t.Insert(0x100 | 1, 10);
  t.Insert(0x100 | 2, 20);
  std::vector<uint32_t> compared;
  CHECK(t.Find(0x100 | 2, [&compared](uint32_t r) {
          compared.push_back(r);
          return r == 20;
        }) == 20);
  CHECK(compared == std::vector<uint32_t>{20});
}

}  // namespace
}  // namespace master
}  // namespace hymcache
