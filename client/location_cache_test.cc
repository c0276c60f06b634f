#include "client/location_cache.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fake_clock.h"

namespace hymcache {
namespace {

ObjectLocation At(uint64_t addr, int64_t cap_expires_unix_ms = 0) {
  ObjectLocation l;
  l.node_id = 1;
  l.addr = addr;
  l.length = 100;
  l.generation = addr + 7;
  l.capability.expires_unix_ms = cap_expires_unix_ms;
  return l;
}

TEST_CASE("LocationCache finds a key list only when every key is fresh") {
  FakeClock clock;
  LocationCache cache(&clock, 16, absl::Seconds(1));
  const std::vector<std::string> keys = {"a", "b", "c"};
  const std::vector<ObjectLocation> locs = {At(10), At(20), At(30)};
  cache.Insert(absl::MakeConstSpan(keys).first(2), locs);
  std::vector<ObjectLocation> out;
  CHECK_FALSE(cache.FindAll(keys, &out));
  CHECK(out.empty());
  REQUIRE(cache.FindAll(absl::MakeConstSpan(keys).first(2), &out));
  REQUIRE(out.size() == 2);
  CHECK(out[1].addr == 20);
  CHECK(out[1].generation == 27);
  cache.Insert(absl::MakeConstSpan(keys).subspan(2), {At(30)});
  CHECK(cache.FindAll(keys, &out));
  CHECK(cache.hits() == 2);
  CHECK(cache.misses() == 1);
  // An entry lives ttl.
  clock.Advance(absl::Milliseconds(999));
  CHECK(cache.FindAll(keys, &out));
  clock.Advance(absl::Milliseconds(1));
  CHECK_FALSE(cache.FindAll(keys, &out));
}

TEST_CASE(
    "LocationCache ends an entry a second before its capability expires") {
  FakeClock clock;
  LocationCache cache(&clock, 16, absl::Seconds(60));
  const int64_t now_ms = absl::ToUnixMillis(clock.Now());
  const std::vector<std::string> keys = {"soon", "late", "expired"};
  cache.Insert(keys, {At(1, now_ms + 3000), At(2, now_ms + 3'600'000),
                      At(3, now_ms + 1000)});
  std::vector<ObjectLocation> out;
  CHECK(cache.size() == 2);  // one that would end at once is not kept
  CHECK(cache.FindAll({keys[0]}, &out));
  clock.Advance(absl::Seconds(2));
  CHECK_FALSE(cache.FindAll({keys[0]}, &out));
  CHECK(cache.FindAll({keys[1]}, &out));
}

TEST_CASE("LocationCache holds at most max_entries, expired ones going first") {
  FakeClock clock;
  LocationCache cache(&clock, 4, absl::Seconds(1));
  std::vector<std::string> keys;
  std::vector<ObjectLocation> locs;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(absl::StrCat("old", i));
    locs.push_back(At(i));
  }
  cache.Insert(keys, locs);
  CHECK(cache.size() == 4);
  clock.Advance(absl::Milliseconds(500));
  cache.Insert({std::string("new0")}, {At(100)});
  CHECK(cache.size() == 4);  // one of the old ones made room
  clock.Advance(absl::Milliseconds(500));
  // The old ones expired: the next insert sweeps them all.
  cache.Insert({std::string("new1")}, {At(101)});
  CHECK(cache.size() == 2);
  std::vector<ObjectLocation> out;
  CHECK(cache.FindAll({std::string("new0"), std::string("new1")}, &out));
}

TEST_CASE(
    "LocationCache forgets erased keys, and with no entries caches nothing") {
  FakeClock clock;
  LocationCache cache(&clock, 16, absl::Seconds(1));
  cache.Insert({std::string("a"), std::string("b")}, {At(1), At(2)});
  cache.Erase({std::string("a")});
  std::vector<ObjectLocation> out;
  CHECK_FALSE(cache.FindAll({std::string("a")}, &out));
  CHECK(cache.FindAll({std::string("b")}, &out));

  LocationCache off(&clock, 0, absl::Seconds(1));
  CHECK_FALSE(off.enabled());
  off.Insert({std::string("a")}, {At(1)});
  CHECK(off.size() == 0);
  CHECK_FALSE(off.FindAll({std::string("a")}, &out));
}

}  // namespace
}  // namespace hymcache
