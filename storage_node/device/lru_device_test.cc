#include "storage_node/device/lru_device.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/thread.h"
#include "storage_node/device/block_io.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kLine = 64 << 10;          // small lines: many evictions
constexpr uint64_t kCacheLines = 8;
constexpr uint64_t kCapacity = 4 << 20;       // 64 lines: 8x the cache
constexpr uint64_t kDataOffset = 1 << 20;     // as CapacityTier::kHeaderBytes

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The real BlockIo on a file under TEST_TMPDIR (O_DIRECT where the
// filesystem allows it).
std::unique_ptr<BlockIo> OpenIo(const std::string& name) {
  BlockIoOptions o;
  o.path = TmpPath(name);
  std::remove(o.path.c_str());
  o.size_bytes = kDataOffset + kCapacity;
  o.queue_depth = 16;
  auto io = BlockIo::Open(o);
  if (!io.ok()) {
    WARN("O_DIRECT open failed (" << io.status().ToString()
                                  << "); retrying without O_DIRECT");
    o.direct = false;
    io = BlockIo::Open(o);
  }
  REQUIRE(io.ok());
  return std::move(*io);
}

std::unique_ptr<LruCacheDevice> MakeDevice(BlockIo* io,
                                           uint64_t lines = kCacheLines) {
  LruCacheDeviceOptions o;
  o.capacity_bytes = kCapacity;
  o.data_offset = kDataOffset;
  o.cache_bytes = lines * kLine;
  o.line_bytes = kLine;
  o.max_concurrent_fills = 4;
  auto d = LruCacheDevice::Create(o, io);
  REQUIRE(d.ok());
  return std::move(*d);
}

// The byte a write pattern `seed` puts at region address `a`.
uint8_t Pattern(uint64_t a, uint32_t seed) {
  uint64_t x = (a + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32);
  return static_cast<uint8_t>(x >> 56);
}

void WriteRange(LruCacheDevice* dev, uint64_t addr, uint64_t len,
                uint32_t seed) {
  auto w = dev->BeginWrite(0, addr, len, /*tag=*/seed);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < len; ++i) w->data[i] = Pattern(addr + i, seed);
  REQUIRE(dev->CommitWrite(*w).ok());
}

// Whether [addr, addr + len) reads back as pattern `seed`.
bool ReadMatches(LruCacheDevice* dev, uint64_t addr, uint64_t len,
                 uint32_t seed) {
  auto r = dev->AcquireRead(0, addr, len);
  if (!r.ok()) return false;
  bool ok = r->length == len;
  for (uint64_t i = 0; ok && i < len; ++i) {
    ok = r->data[i] == Pattern(addr + i, seed);
  }
  dev->ReleaseRead(*r);
  return ok;
}

TEST_CASE("LruCacheDevice describes one volatile hybrid-lru region",
          "[lru_device]") {
  auto io = OpenIo("lru_regions");
  auto dev = MakeDevice(io.get());
  auto regions = dev->Regions();
  REQUIRE(regions.size() == 1);
  CHECK(regions[0].region_id == 0);
  CHECK(regions[0].capacity_bytes == kCapacity);
  CHECK(regions[0].device_kind == "hybrid-lru");
  CHECK_FALSE(regions[0].persistent);
  CHECK(dev->num_lines() == kCacheLines);
  CHECK(dev->line_bytes() == kLine);
  CHECK(dev->RecoveredExtents().empty());
}

TEST_CASE("LruCacheDevice refuses bad options and ranges", "[lru_device]") {
  auto io = OpenIo("lru_bad");
  LruCacheDeviceOptions o;
  o.line_bytes = 1000;
  CHECK(LruCacheDevice::Create(o, io.get()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = LruCacheDeviceOptions();
  o.cache_bytes = 4096;  // less than a line
  CHECK(LruCacheDevice::Create(o, io.get()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = LruCacheDeviceOptions();
  o.capacity_bytes = kCapacity + kLine;  // beyond the file
  CHECK(LruCacheDevice::Create(o, io.get()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LruCacheDevice::Create(LruCacheDeviceOptions(), nullptr)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);

  auto dev = MakeDevice(io.get());
  CHECK(dev->AcquireRead(1, 0, 10).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->AcquireRead(0, 0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->AcquireRead(0, kCapacity - 10, 11).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->BeginWrite(0, kCapacity, 1, 0).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(dev->PrefetchObject(0, kCapacity, 1).status().code() ==
        absl::StatusCode::kOutOfRange);
  PrefetchHandle bogus;
  bogus.id = 12345;
  CHECK(dev->PrefetchWait(bogus, absl::InfiniteFuture()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("LruCacheDevice round-trips a footprint larger than the cache",
          "[lru_device]") {
  auto io = OpenIo("lru_roundtrip");
  auto dev = MakeDevice(io.get());
  // Objects of 100 KiB straddle line boundaries, so most writes fill a line
  // partially (read-modify-write) and most reads gather two lines.
  constexpr uint64_t kObj = 100 << 10;
  const uint64_t objects = kCapacity / kObj;
  for (uint64_t i = 0; i < objects; ++i) WriteRange(dev.get(), i * kObj, kObj, 1);
  LruCacheStats s = dev->CacheStats();
  CHECK(s.evictions > 0);
  CHECK(s.dirty_writebacks > 0);  // the writes overflowed the cache

  // Everything reads back, most of it from the tier after eviction.
  for (uint64_t i = 0; i < objects; ++i) {
    INFO("object " << i);
    CHECK(ReadMatches(dev.get(), i * kObj, kObj, 1));
  }
  s = dev->CacheStats();
  CHECK(s.fills > kCacheLines);
  CHECK(s.tier_read_bytes == s.fills * kLine);

  // Overwrite a few bytes in the middle of a line long evicted: the rest of
  // the line survives (the partial write filled the line first).
  WriteRange(dev.get(), 5 * kLine + 123, 77, 2);
  CHECK(ReadMatches(dev.get(), 5 * kLine, 123, 1));
  CHECK(ReadMatches(dev.get(), 5 * kLine + 123, 77, 2));
  CHECK(ReadMatches(dev.get(), 5 * kLine + 200, kLine - 200, 1));

  // After Flush the tier itself holds the bytes, at data_offset + addr.
  REQUIRE(dev->Flush().ok());
  AlignedBuffer buf = AllocateAligned(kCapacity);
  REQUIRE(io->ReadSync(kDataOffset, buf.get(), kCapacity).ok());
  uint64_t wrong = 0;
  const uint64_t written = objects * kObj;
  for (uint64_t a = 0; a < written; ++a) {
    const bool second = a >= 5 * kLine + 123 && a < 5 * kLine + 200;
    if (buf[a] != Pattern(a, second ? 2 : 1)) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(dev->Stats().writes == objects + 1);
  CHECK(dev->Stats().outstanding_reads == 0);
  CHECK(dev->Stats().outstanding_writes == 0);
}

TEST_CASE("LruCacheDevice hits a small working set and misses a long scan",
          "[lru_device]") {
  auto io = OpenIo("lru_hits");
  auto dev = MakeDevice(io.get());

  // Four lines, read ten times: four cold misses, then only hits.
  for (int round = 0; round < 10; ++round) {
    for (uint64_t l = 0; l < 4; ++l) {
      auto r = dev->AcquireRead(0, l * kLine, kLine);
      REQUIRE(r.ok());
      dev->ReleaseRead(*r);
    }
  }
  LruCacheStats s = dev->CacheStats();
  CHECK(s.misses == 4);
  CHECK(s.hits == 36);
  CHECK(s.fills == 4);
  CHECK(s.hit_ratio() == Approx(0.9));

  // A scan of 32 lines (4x the cache), in order, three times: LRU evicts each
  // line just before it is needed again, so every access misses.
  auto scan = MakeDevice(io.get());
  for (int round = 0; round < 3; ++round) {
    for (uint64_t l = 0; l < 32; ++l) {
      auto r = scan->AcquireRead(0, l * kLine, kLine);
      REQUIRE(r.ok());
      scan->ReleaseRead(*r);
    }
  }
  s = scan->CacheStats();
  CHECK(s.hits == 0);
  CHECK(s.misses == 96);
  CHECK(s.evictions == 96 - kCacheLines);
  CHECK(s.dirty_writebacks == 0);  // clean lines are dropped, not written
  CHECK(s.hit_ratio() == 0.0);
}

TEST_CASE("LruCacheDevice whole-line writes skip the fill", "[lru_device]") {
  auto io = OpenIo("lru_whole");
  auto dev = MakeDevice(io.get());
  WriteRange(dev.get(), 3 * kLine, 2 * kLine, 7);
  LruCacheStats s = dev->CacheStats();
  CHECK(s.misses == 2);
  CHECK(s.fills == 0);
  CHECK(ReadMatches(dev.get(), 3 * kLine, 2 * kLine, 7));
  CHECK(dev->CacheStats().hits == 2);
}

TEST_CASE("LruCacheDevice prefetch reads through the cache", "[lru_device]") {
  auto io = OpenIo("lru_prefetch");
  auto dev = MakeDevice(io.get());
  WriteRange(dev.get(), 10000, 300000, 3);  // spans 5 lines
  auto h = dev->PrefetchObject(0, 10000, 300000);
  REQUIRE(h.ok());
  auto p = dev->PrefetchWait(*h, absl::InfiniteFuture());
  REQUIRE(p.ok());
  bool same = true;
  for (uint64_t i = 0; i < 300000; ++i) {
    same = same && (*p)[i] == Pattern(10000 + i, 3);
  }
  CHECK(same);
  // Waiting again hands back the same bytes.
  auto again = dev->PrefetchWait(*h, absl::InfiniteFuture());
  REQUIRE(again.ok());
  CHECK(*again == *p);
  dev->PrefetchRelease(*h);
  CHECK(dev->PrefetchWait(*h, absl::InfiniteFuture()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(dev->Stats().prefetches == 1);
}

TEST_CASE("LruCacheDevice abort discards the write", "[lru_device]") {
  auto io = OpenIo("lru_abort");
  auto dev = MakeDevice(io.get());
  WriteRange(dev.get(), 0, kLine, 4);
  auto w = dev->BeginWrite(0, 0, kLine, 5);
  REQUIRE(w.ok());
  std::memset(w->data, 0xAB, kLine);
  dev->AbortWrite(*w);
  CHECK(ReadMatches(dev.get(), 0, kLine, 4));
  CHECK(dev->Stats().aborted_writes == 1);
  CHECK(dev->Stats().outstanding_writes == 0);
}

TEST_CASE("LruCacheDevice concurrent readers and writers", "[lru_device]") {
  auto io = OpenIo("lru_concurrent");
  auto dev = MakeDevice(io.get());
  // The first half of the region holds pattern 1; readers check it while
  // writers rewrite objects of the second half (disjoint, as the extent
  // table guarantees) and force evictions with dirty write-backs.
  constexpr uint64_t kObj = 48 << 10;  // straddles lines
  const uint64_t half = kCapacity / 2;
  const uint64_t objects = half / kObj;
  for (uint64_t i = 0; i < objects; ++i) WriteRange(dev.get(), i * kObj, kObj, 1);

  constexpr int kReaders = 4;
  constexpr int kWriters = 2;
  std::atomic<int> bad{0};
  std::atomic<int> errors{0};
  {
    std::vector<Thread> threads;
    for (int t = 0; t < kReaders; ++t) {
      threads.emplace_back("lru-reader", [&, t] {
        // Every reader scans the same objects, so they race on the same
        // missing lines; some start in different places.
        for (int round = 0; round < 3; ++round) {
          for (uint64_t k = 0; k < objects; ++k) {
            const uint64_t i = (k + (t % 2) * objects / 2) % objects;
            auto r = dev->AcquireRead(0, i * kObj, kObj);
            if (!r.ok()) {
              ++errors;
              continue;
            }
            for (uint64_t b = 0; b < kObj; b += 997) {
              if (r->data[b] != Pattern(i * kObj + b, 1)) {
                ++bad;
                break;
              }
            }
            dev->ReleaseRead(*r);
          }
        }
      });
    }
    for (int t = 0; t < kWriters; ++t) {
      threads.emplace_back("lru-writer", [&, t] {
        for (int round = 0; round < 3; ++round) {
          for (uint64_t i = t; i < objects; i += kWriters) {
            const uint64_t addr = half + i * kObj;
            auto w = dev->BeginWrite(0, addr, kObj, 0);
            if (!w.ok()) {
              ++errors;
              continue;
            }
            for (uint64_t b = 0; b < kObj; ++b) {
              w->data[b] = Pattern(addr + b, 10 + round);
            }
            if (!dev->CommitWrite(*w).ok()) ++errors;
          }
        }
      });
    }
  }
  CHECK(bad == 0);
  CHECK(errors == 0);
  for (uint64_t i = 0; i < objects; ++i) {
    INFO("object " << i);
    CHECK(ReadMatches(dev.get(), half + i * kObj, kObj, 12));
  }
  LruCacheStats s = dev->CacheStats();
  // Two readers of one missing line share its fill.
  CHECK(s.fills <= s.misses);
  CHECK(s.dirty_writebacks > 0);
  CHECK(dev->Stats().outstanding_reads == 0);
  CHECK(dev->Stats().outstanding_writes == 0);
}

TEST_CASE("LruCacheDevice works with a single line", "[lru_device]") {
  auto io = OpenIo("lru_one_line");
  auto dev = MakeDevice(io.get(), /*lines=*/1);
  // An access over several lines goes one line at a time.
  WriteRange(dev.get(), 1000, 5 * kLine, 9);
  CHECK(ReadMatches(dev.get(), 1000, 5 * kLine, 9));
  std::vector<Thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back("lru-one", [&] {
      for (int k = 0; k < 20; ++k) {
        if (!ReadMatches(dev.get(), 1000 + k * 4096, 2 * kLine, 9)) ++bad;
      }
    });
  }
  for (Thread& t : threads) t.Join();
  CHECK(bad == 0);
}

}  // namespace
}  // namespace hymcache::storage
