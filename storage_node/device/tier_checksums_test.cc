#include "storage_node/device/tier_checksums.h"

#include <catch2/catch.hpp>

#include <vector>

namespace hymcache::storage {
namespace {

constexpr uint64_t kKiB = 1024;

std::vector<uint64_t> Addrs(const std::vector<TierRange>& ranges) {
  std::vector<uint64_t> out;
  for (const TierRange& r : ranges) out.push_back(r.addr);
  return out;
}

TEST_CASE("Find matches exactly the object's address and length") {
  TierChecksums sums(/*verify_reads=*/true);
  sums.Adopt(8 * kKiB, 5000, 0xabc);
  const TierChecksum* s = sums.Find(8 * kKiB, 5000);
  REQUIRE(s != nullptr);
  CHECK(s->crc == 0xabc);
  CHECK_FALSE(s->corrupt);
  CHECK(sums.Find(8 * kKiB, 4096) == nullptr);  // another object there
  CHECK(sums.Find(12 * kKiB, 1000) == nullptr);  // inside it
  CHECK(sums.Find(0, 5000) == nullptr);
}

TEST_CASE("Without verify_reads no checksum is kept, but discards are forgotten") {
  TierChecksums sums(/*verify_reads=*/false);
  sums.Adopt(0, 4 * kKiB, 1);
  sums.Set(8 * kKiB, 4 * kKiB, 4 * kKiB, 1);
  CHECK(sums.size() == 0);
  CHECK(sums.Find(0, 4 * kKiB) == nullptr);
  CHECK_FALSE(sums.MarkCorrupt(0, 4 * kKiB, 1));
  CHECK_FALSE(sums.forget_queued());
  sums.QueueDiscard(TierRange{16 * kKiB, 4 * kKiB, /*exact=*/true, 7});
  REQUIRE(sums.forget_queued());
  const std::vector<TierRange> ranges = sums.StartForget();
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].exact);
  CHECK(ranges[0].tag == 7);
  const TierChecksums::ForgetCounts n = sums.FinishForget(/*ok=*/true);
  CHECK(n.discarded == 1);
  CHECK(n.corrupt == 0);
  CHECK_FALSE(sums.forget_queued());
}

TEST_CASE("Set replaces every checksum its span overlaps") {
  TierChecksums sums(/*verify_reads=*/true);
  sums.Set(0, 8 * kKiB, 8 * kKiB, 1);
  sums.Set(8 * kKiB, 4 * kKiB, 4 * kKiB, 2);
  sums.Set(16 * kKiB, 4 * kKiB, 4 * kKiB, 3);
  // 5000 bytes padded to 8 KiB, starting inside the first object.
  sums.Set(4 * kKiB, 5000, 8 * kKiB, 4);
  CHECK(sums.Find(0, 8 * kKiB) == nullptr);
  CHECK(sums.Find(8 * kKiB, 4 * kKiB) == nullptr);
  REQUIRE(sums.Find(4 * kKiB, 5000) != nullptr);
  CHECK(sums.Find(4 * kKiB, 5000)->crc == 4);
  REQUIRE(sums.Find(16 * kKiB, 4 * kKiB) != nullptr);  // untouched
  CHECK(sums.size() == 2);
}

TEST_CASE("A mismatch marks the object corrupt once and queues its forget") {
  TierChecksums sums(/*verify_reads=*/true);
  sums.Set(0, 4 * kKiB, 4 * kKiB, 0x11);
  CHECK_FALSE(sums.MarkCorrupt(0, 4 * kKiB, 0x22));  // not the object read
  CHECK_FALSE(sums.MarkCorrupt(0, 8 * kKiB, 0x11));  // unknown object
  CHECK_FALSE(sums.forget_queued());
  CHECK(sums.MarkCorrupt(0, 4 * kKiB, 0x11));
  CHECK(sums.Find(0, 4 * kKiB)->corrupt);
  CHECK_FALSE(sums.MarkCorrupt(0, 4 * kKiB, 0x11));  // already marked
  const std::vector<TierRange> ranges = sums.StartForget();
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].addr == 0);
  CHECK(ranges[0].length == 4 * kKiB);
  CHECK_FALSE(ranges[0].exact);
  CHECK(sums.FinishForget(/*ok=*/true).corrupt == 1);
  // Still refused: only a write (Erase) clears it.
  CHECK(sums.Find(0, 4 * kKiB)->corrupt);
  sums.Erase(0, 4 * kKiB);
  CHECK(sums.Find(0, 4 * kKiB) == nullptr);
}

TEST_CASE("A write voids the checksums it overlaps and cancels their queued forgets") {
  TierChecksums sums(/*verify_reads=*/true);
  sums.Set(0, 8 * kKiB, 8 * kKiB, 1);
  sums.Set(8 * kKiB, 4 * kKiB, 4 * kKiB, 2);
  sums.Set(32 * kKiB, 4 * kKiB, 4 * kKiB, 3);
  REQUIRE(sums.MarkCorrupt(0, 8 * kKiB, 1));
  REQUIRE(sums.MarkCorrupt(32 * kKiB, 4 * kKiB, 3));
  sums.QueueDiscard(TierRange{12 * kKiB, 4 * kKiB, true, 9});
  // Starts inside the first object (found through its predecessor) and
  // ends inside the discarded range.
  sums.Erase(4 * kKiB, 10 * kKiB);
  CHECK(sums.Find(0, 8 * kKiB) == nullptr);
  CHECK(sums.Find(8 * kKiB, 4 * kKiB) == nullptr);
  CHECK(sums.Find(32 * kKiB, 4 * kKiB) != nullptr);
  CHECK(Addrs(sums.StartForget()) == std::vector<uint64_t>{32 * kKiB});
}

TEST_CASE("A failed forget is queued again, except what a write cancelled meanwhile") {
  TierChecksums sums(/*verify_reads=*/true);
  sums.Set(0, 4 * kKiB, 4 * kKiB, 1);
  sums.Set(64 * kKiB, 4 * kKiB, 4 * kKiB, 2);
  REQUIRE(sums.MarkCorrupt(0, 4 * kKiB, 1));
  sums.QueueDiscard(TierRange{64 * kKiB, 4 * kKiB, true, 5});
  REQUIRE(sums.StartForget().size() == 2);
  CHECK_FALSE(sums.forget_queued());
  // While the call runs (without the device's lock): a write lands over the
  // first, and another object turns out corrupt.
  sums.Erase(0, 4 * kKiB);
  sums.Set(128 * kKiB, 4 * kKiB, 4 * kKiB, 3);
  REQUIRE(sums.MarkCorrupt(128 * kKiB, 4 * kKiB, 3));
  const TierChecksums::ForgetCounts n = sums.FinishForget(/*ok=*/false);
  CHECK(n.corrupt == 0);
  CHECK(n.discarded == 0);
  // The new one first, then the discard put back; the overwritten one not.
  CHECK(Addrs(sums.StartForget()) ==
        std::vector<uint64_t>{128 * kKiB, 64 * kKiB});
  const TierChecksums::ForgetCounts ok = sums.FinishForget(/*ok=*/true);
  CHECK(ok.corrupt == 1);
  CHECK(ok.discarded == 1);
  CHECK_FALSE(sums.forget_queued());
}

}  // namespace
}  // namespace hymcache::storage
