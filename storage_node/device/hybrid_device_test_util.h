// What the hybrid device's tests share (hybrid_device_test.cc: the staging
// window and the write buffer; hybrid_device_integrity_test.cc: streaming,
// concurrency, checksums, I/O errors and real capacity files): byte
// patterns, small options, a device over fake block I/O, and waits.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/eventually.h"
#include "common/fake_clock.h"
#include "common/thread.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/faulty_block_io.h"
#include "storage_node/device/hybrid_device.h"

namespace hymcache::storage::hybrid_test {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kCap = 8 * kKiB * kKiB;  // data area of the fake tier
inline constexpr uint64_t kHdr = CapacityTier::kHeaderBytes;

inline absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

inline uint8_t PatternByte(uint64_t pos, uint64_t seed) {
  uint64_t x =
      (pos + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

inline std::vector<uint8_t> Pattern(uint64_t addr, uint64_t len,
                                    uint64_t seed) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) v[i] = PatternByte(addr + i, seed);
  return v;
}

inline bool Matches(const uint8_t* p, uint64_t addr, uint64_t len,
                    uint64_t seed) {
  for (uint64_t i = 0; i < len; ++i) {
    if (p[i] != PatternByte(addr + i, seed)) return false;
  }
  return true;
}

inline HybridDeviceOptions SmallOptions() {
  HybridDeviceOptions o;
  o.staging_bytes = 128 * kKiB;
  o.write_buffer_bytes = 128 * kKiB;
  o.io_chunk_bytes = 16 * kKiB;
  o.io_queue_depth = 8;
  o.flush_batch_bytes = 64 * kKiB;
  o.flush_max_delay = absl::InfiniteDuration();
  o.flush_retry_initial = absl::Milliseconds(5);
  o.flush_retry_max = absl::Milliseconds(20);
  o.read_timeout = absl::Seconds(20);
  return o;
}

// A fake disk and a device over it. The disk outlives devices, so a test can
// "restart" the device over the same bytes. With `faults`, the device's I/O
// goes through a FaultyBlockIo over the disk.
struct Rig {
  explicit Rig(HybridDeviceOptions o = SmallOptions(), bool faults = false)
      : io(std::make_unique<FakeBlockIo>(kHdr + kCap)),
        faulty(faults ? std::make_unique<FaultyBlockIo>(io.get()) : nullptr) {
    Open(o);
  }
  void Open(HybridDeviceOptions o, std::vector<DurableExtent> extents = {}) {
    BlockIo* dev_io =
        faulty != nullptr ? static_cast<BlockIo*>(faulty.get()) : io.get();
    auto t =
        std::make_unique<FakeCapacityTier>(dev_io, kCap, std::move(extents));
    tier = t.get();
    auto d = HybridDevice::Create(o, std::move(t));
    REQUIRE(d.ok());
    dev = std::move(*d);
  }
  // Puts the pattern for (addr, len, seed) straight onto the disk.
  void FillDisk(uint64_t addr, uint64_t len, uint64_t seed) {
    std::vector<uint8_t> v = Pattern(addr, len, seed);
    io->FillForTest(kHdr + addr, v.data(), v.size());
  }
  // Writes the pattern through the device.
  void Put(uint64_t addr, uint64_t len, uint64_t gen, uint64_t seed) {
    auto w = dev->BeginWrite(0, addr, len, gen);
    REQUIRE(w.ok());
    std::vector<uint8_t> v = Pattern(addr, len, seed);
    std::memcpy(w->data, v.data(), len);
    REQUIRE(dev->CommitWrite(*w).ok());
  }
  bool ReadMatches(uint64_t addr, uint64_t len, uint64_t seed) {
    auto r = dev->AcquireRead(0, addr, len);
    REQUIRE(r.ok());
    bool ok = Matches(r->data, addr, len, seed);
    dev->ReleaseRead(*r);
    return ok;
  }

  std::unique_ptr<FakeBlockIo> io;
  std::unique_ptr<FaultyBlockIo> faulty;
  FakeCapacityTier* tier = nullptr;
  std::unique_ptr<HybridDevice> dev;  // last: destroyed first
};

inline PrefetchHandle Prefetch(HybridDevice* d, uint64_t addr, uint64_t len) {
  auto h = d->PrefetchObject(0, addr, len);
  REQUIRE(h.ok());
  return *h;
}

// Polls `pred` until it holds; false after 20 s.
template <typename Pred>
inline bool WaitUntil(Pred pred) {
  return testing::Eventually(pred, absl::Seconds(20));
}

// Whether every durable extent's bytes on the disk are its object's, for
// objects written with seed == tag: a record never claims bytes that were
// overwritten since.
inline bool DurableMatchesDisk(const Rig& rig) {
  for (const DurableExtent& e : rig.tier->ExtentsNowForTest()) {
    if (rig.io->CopyForTest(kHdr + e.addr, e.length) !=
        Pattern(e.addr, e.length, e.tag)) {
      return false;
    }
  }
  return true;
}

}  // namespace hymcache::storage::hybrid_test
