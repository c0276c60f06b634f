#include "common/range_allocator.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <optional>
#include <random>
#include <vector>

namespace hymcache {
namespace {

std::unique_ptr<RangeAllocator> Make(uint64_t capacity, uint32_t alignment) {
  auto a = RangeAllocator::Create({capacity, alignment});
  REQUIRE(a.ok());
  return std::move(a).value();
}

TEST_CASE("RangeAllocator rejects bad options") {
  CHECK(RangeAllocator::Create({0, 64}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RangeAllocator::Create({4096, 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RangeAllocator::Create({4096, 48}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RangeAllocator::Create({32, 64}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("RangeAllocator aligns and rounds allocations") {
  auto a = Make(4096, 64);
  auto x = a->Allocate(1);
  auto y = a->Allocate(65);
  auto z = a->Allocate(64);
  REQUIRE(x.ok());
  REQUIRE(y.ok());
  REQUIRE(z.ok());
  CHECK(*x == 0);
  CHECK(*y == 64);
  CHECK(*z == 192);
  CHECK(a->used_bytes() == 256);
  CHECK(a->free_bytes() == 4096 - 256);
  CHECK(a->largest_free() == 4096 - 256);
  CHECK(a->Allocate(0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("RangeAllocator ignores an unaligned capacity tail") {
  auto a = Make(1000, 256);
  CHECK(a->usable_capacity() == 768);
  CHECK(a->free_bytes() == 768);
  CHECK(a->Allocate(768).ok());
  CHECK(a->Allocate(1).status().code() ==
        absl::StatusCode::kResourceExhausted);
}

TEST_CASE("RangeAllocator exhausts and reuses freed space") {
  auto a = Make(1024, 256);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 4; ++i) {
    auto o = a->Allocate(200);
    REQUIRE(o.ok());
    offs.push_back(*o);
  }
  CHECK(a->free_bytes() == 0);
  CHECK(a->largest_free() == 0);
  auto full = a->Allocate(1);
  CHECK(full.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(a->Allocate(uint64_t{1} << 40).status().code() ==
        absl::StatusCode::kResourceExhausted);

  REQUIRE(a->Free(offs[2]).ok());
  auto again = a->Allocate(256);
  REQUIRE(again.ok());
  CHECK(*again == offs[2]);
}

TEST_CASE("RangeAllocator best fit and coalescing under fragmentation") {
  auto a = Make(16 * 64, 64);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 16; ++i) {
    auto o = a->Allocate(64);
    REQUIRE(o.ok());
    offs.push_back(*o);
  }
  // Free every other unit: 8 holes of 64 bytes, none adjacent.
  for (int i = 0; i < 16; i += 2) REQUIRE(a->Free(offs[i]).ok());
  CHECK(a->free_bytes() == 8 * 64);
  CHECK(a->largest_free() == 64);
  CHECK(a->free_extent_count() == 8);
  CHECK(a->Allocate(128).status().code() ==
        absl::StatusCode::kResourceExhausted);

  // Freeing unit 1 merges holes 0,1,2 into one 192-byte extent.
  REQUIRE(a->Free(offs[1]).ok());
  CHECK(a->largest_free() == 192);
  CHECK(a->free_extent_count() == 7);
  // Make a 128-byte hole at units 4..5 (merging with hole 4... then 6).
  REQUIRE(a->Free(offs[5]).ok());  // merges 4,5,6 -> 192 bytes at 256
  CHECK(a->free_extent_count() == 6);

  // Best fit: a 64-byte request takes a 64-byte hole, not a 192-byte one.
  auto small = a->Allocate(64);
  REQUIRE(small.ok());
  CHECK(*small == offs[8]);
  // A 192-byte request takes the lowest of the two 192-byte extents.
  auto big = a->Allocate(150);
  REQUIRE(big.ok());
  CHECK(*big == 0);

  // Free everything: one extent covering the region again.
  REQUIRE(a->Free(*big).ok());
  REQUIRE(a->Free(*small).ok());
  for (int i = 3; i < 16; i += 2) {
    if (i == 5) continue;
    REQUIRE(a->Free(offs[i]).ok());
  }
  CHECK(a->used_bytes() == 0);
  CHECK(a->free_extent_count() == 1);
  CHECK(a->largest_free() == 16 * 64);
  CHECK(a->allocation_count() == 0);
}

TEST_CASE("RangeAllocator rejects bad frees without changing state") {
  auto a = Make(4096, 64);
  auto x = a->Allocate(100);
  REQUIRE(x.ok());
  CHECK(a->Free(4096).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Free(1 << 30).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Free(*x + 1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Free(*x + 64).code() == absl::StatusCode::kNotFound);
  CHECK(a->used_bytes() == 128);
  REQUIRE(a->Free(*x).ok());
  CHECK(a->Free(*x).code() == absl::StatusCode::kNotFound);  // double free
  CHECK(a->used_bytes() == 0);
  CHECK(a->free_extent_count() == 1);
}

TEST_CASE("RangeAllocator rebuilds from Reserve") {
  auto a = Make(4096, 64);
  REQUIRE(a->Reserve(128, 100).ok());  // [128, 256)
  REQUIRE(a->Reserve(1024, 64).ok());  // [1024, 1088)
  REQUIRE(a->Reserve(0, 128).ok());    // [0, 128): adjacent, still separate
  CHECK(a->used_bytes() == 128 + 128 + 64);
  CHECK(a->allocation_count() == 3);

  CHECK(a->Reserve(192, 64).code() == absl::StatusCode::kAlreadyExists);
  CHECK(a->Reserve(960, 128).code() == absl::StatusCode::kAlreadyExists);
  CHECK(a->Reserve(100, 64).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Reserve(4032, 65).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Reserve(8192, 64).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Reserve(256, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->Reserve(0, ~uint64_t{0}).code() ==
        absl::StatusCode::kInvalidArgument);

  // New allocations avoid the reserved ranges.
  auto x = a->Allocate(700);
  REQUIRE(x.ok());
  CHECK(*x == 256);  // [256, 960) is the best fit for 704 bytes
  REQUIRE(a->Free(128).ok());
  REQUIRE(a->Free(0).ok());
  auto y = a->Allocate(256);
  REQUIRE(y.ok());
  CHECK(*y == 0);
}

TEST_CASE("RangeAllocator ReserveAll matches Reserve one range at a time") {
  std::mt19937_64 rng(7);
  auto one = Make(1 << 20, 512);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  // Random disjoint ranges: allocate, then free a third of them.
  auto scratch = Make(1 << 20, 512);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 400; ++i) {
    auto o = scratch->Allocate(1 + rng() % 4000);
    if (o.ok()) offsets.push_back(*o);
  }
  for (uint64_t o : offsets) {
    if (rng() % 3 == 0) continue;
    uint64_t len = 1 + rng() % 512;  // within the first alignment unit
    ranges.emplace_back(o, len);
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  for (auto [o, l] : ranges) REQUIRE(one->Reserve(o, l).ok());
  auto all = Make(1 << 20, 512);
  REQUIRE(all->ReserveAll(ranges).ok());
  CHECK(all->used_bytes() == one->used_bytes());
  CHECK(all->allocation_count() == one->allocation_count());
  CHECK(all->free_extent_count() == one->free_extent_count());
  CHECK(all->largest_free() == one->largest_free());
  // Both then place and free alike.
  for (int i = 0; i < 2000; ++i) {
    uint64_t len = 1 + rng() % 6000;
    auto x = one->Allocate(len);
    auto y = all->Allocate(len);
    REQUIRE(x.ok() == y.ok());
    if (x.ok()) REQUIRE(*x == *y);
  }
  for (auto [o, l] : ranges) {
    REQUIRE(one->Free(o).ok());
    REQUIRE(all->Free(o).ok());
  }
  CHECK(all->used_bytes() == one->used_bytes());
  CHECK(all->free_extent_count() == one->free_extent_count());
}

TEST_CASE("RangeAllocator ReserveAll refuses bad input unchanged") {
  auto a = Make(4096, 64);
  using R = std::vector<std::pair<uint64_t, uint64_t>>;
  CHECK(a->ReserveAll(R{{0, 64}, {64, 65}, {128, 64}}).code() ==
        absl::StatusCode::kAlreadyExists);  // 65 rounds up to 128
  CHECK(a->ReserveAll(R{{0, 64}, {100, 64}}).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(a->ReserveAll(R{{4032, 65}}).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(a->ReserveAll(R{{64, 0}}).code() == absl::StatusCode::kInvalidArgument);
  CHECK(a->allocation_count() == 0);
  CHECK(a->free_extent_count() == 1);
  CHECK(a->largest_free() == 4096);
  REQUIRE(a->ReserveAll(R{}).ok());
  REQUIRE(a->ReserveAll(R{{4032, 64}, {0, 64}}).ok());
  CHECK(a->used_bytes() == 128);
  CHECK(a->largest_free() == 4096 - 128);
  CHECK(a->ReserveAll(R{{128, 64}}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(a->allocation_count() == 2);
}

TEST_CASE("RangeAllocator TryAllocate agrees with CanFit and Allocate") {
  auto a = Make(64 * 4096, 4096);  // the hybrid device's window: 4 KiB pages
  CHECK_FALSE(a->TryAllocate(0).has_value());
  CHECK_FALSE(a->TryAllocate(64 * 4096 + 1).has_value());
  std::vector<uint64_t> offs;
  for (int i = 0; i < 16; ++i) {
    std::optional<uint64_t> o = a->TryAllocate(4 * 4096);
    REQUIRE(o.has_value());
    offs.push_back(*o);
  }
  // Full: nothing fits and nothing changes.
  CHECK_FALSE(a->CanFit(4096));
  CHECK_FALSE(a->TryAllocate(4096).has_value());
  CHECK(a->used_bytes() == 64 * 4096);
  // Free every other one: 8 holes of 16 KiB, none of 20 KiB: whether a
  // request fits depends only on the largest hole, not on the free total.
  for (size_t i = 0; i < offs.size(); i += 2) REQUIRE(a->Free(offs[i]).ok());
  CHECK(a->largest_free() == 4 * 4096);
  CHECK_FALSE(a->CanFit(5 * 4096));
  CHECK_FALSE(a->TryAllocate(5 * 4096).has_value());
  CHECK(a->used_bytes() == 32 * 4096);
  // A partial page rounds up to a whole one and lands in a hole.
  std::optional<uint64_t> small = a->TryAllocate(100);
  REQUIRE(small.has_value());
  CHECK(*small % 4096 == 0);
  CHECK(a->used_bytes() == 33 * 4096);
  REQUIRE(a->Free(*small).ok());
  CHECK(a->Free(*small).code() == absl::StatusCode::kNotFound);
  // Freeing a neighbour coalesces: 48 KiB fits again.
  REQUIRE(a->Free(offs[1]).ok());
  CHECK(a->largest_free() == 12 * 4096);
  std::optional<uint64_t> big = a->TryAllocate(12 * 4096);
  REQUIRE(big.has_value());
  CHECK(*big == offs[0]);
}

TEST_CASE("RangeAllocator survives a random workload") {
  auto a = Make(1 << 20, 512);
  std::mt19937_64 rng(42);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  uint64_t expect_used = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t len = 1 + rng() % 20000;
      const bool fits = a->CanFit(len);
      absl::StatusOr<uint64_t> o = absl::ResourceExhaustedError("");
      if (i % 2 == 0) {
        o = a->Allocate(len);
      } else if (std::optional<uint64_t> t = a->TryAllocate(len)) {
        o = *t;
      }
      REQUIRE(o.ok() == fits);
      if (!o.ok()) {
        REQUIRE(o.status().code() == absl::StatusCode::kResourceExhausted);
        continue;
      }
      REQUIRE(*o % 512 == 0);
      uint64_t rounded = (len + 511) / 512 * 512;
      for (auto& [off, l] : live) {
        REQUIRE((*o + rounded <= off || off + l <= *o));
      }
      live.emplace_back(*o, rounded);
      expect_used += rounded;
    } else {
      size_t k = rng() % live.size();
      REQUIRE(a->Free(live[k].first).ok());
      expect_used -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    }
    REQUIRE(a->used_bytes() == expect_used);
  }
  for (auto& [off, l] : live) REQUIRE(a->Free(off).ok());
  CHECK(a->free_extent_count() == 1);
  CHECK(a->largest_free() == (1 << 20));
}

TEST_CASE("RangeAllocator ReserveAll of many ranges matches Reserve") {
  // Enough ranges for ReserveAll's radix sort (offsets of 3 digits of 16
  // bits) over a wide region.
  std::mt19937_64 rng(11);
  constexpr uint64_t kUnit = 4096;
  constexpr uint64_t kCapacity = uint64_t{1} << 42;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  uint64_t at = 0;
  while (ranges.size() < 300000) {
    at += kUnit * (rng() % 3);  // gaps of 0, 1 or 2 units
    const uint64_t units = 1 + rng() % 4;
    ranges.emplace_back(at, units * kUnit - rng() % kUnit);
    at += units * kUnit + (ranges.size() % 50000 == 0 ? (kCapacity >> 3) : 0);
  }
  REQUIRE(at < kCapacity);
  std::shuffle(ranges.begin(), ranges.end(), rng);
  auto one = Make(kCapacity, kUnit);
  for (auto [o, l] : ranges) REQUIRE(one->Reserve(o, l).ok());
  auto all = Make(kCapacity, kUnit);
  REQUIRE(all->ReserveAll(ranges).ok());
  CHECK(all->used_bytes() == one->used_bytes());
  CHECK(all->allocation_count() == one->allocation_count());
  CHECK(all->free_extent_count() == one->free_extent_count());
  CHECK(all->largest_free() == one->largest_free());
  for (int i = 0; i < 1000; ++i) {
    const uint64_t len = 1 + rng() % (8 * kUnit);
    auto x = one->Allocate(len);
    auto y = all->Allocate(len);
    REQUIRE(x.ok() == y.ok());
    if (x.ok()) REQUIRE(*x == *y);
  }
  for (size_t i = 0; i < ranges.size(); i += 7) {
    REQUIRE(one->Free(ranges[i].first).ok());
    REQUIRE(all->Free(ranges[i].first).ok());
  }
  CHECK(all->used_bytes() == one->used_bytes());
  CHECK(all->free_extent_count() == one->free_extent_count());

  // A range inside another (unaligned: refused as such), or one at the
  // same offset (overlapping), whatever the order.
  auto overlap = ranges;
  overlap.emplace_back(overlap[12345].first + kUnit / 2, 1);
  std::shuffle(overlap.begin(), overlap.end(), rng);
  auto bad = Make(kCapacity, kUnit);
  CHECK(bad->ReserveAll(overlap).code() == absl::StatusCode::kInvalidArgument);
  auto twice = ranges;
  twice.emplace_back(ranges[777].first, kUnit);  // aligned, same offset
  std::shuffle(twice.begin(), twice.end(), rng);
  auto dup = Make(kCapacity, kUnit);
  CHECK(dup->ReserveAll(twice).code() == absl::StatusCode::kAlreadyExists);
  CHECK(dup->allocation_count() == 0);
}

}  // namespace
}  // namespace hymcache
