#include "storage_node/device/hybrid_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <deque>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/fake_clock.h"
#include "common/crc32c.h"
#include "common/thread.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/faulty_block_io.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kCap = 8 * kKiB * kKiB;  // data area of the fake tier
constexpr uint64_t kHdr = CapacityTier::kHeaderBytes;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

uint8_t PatternByte(uint64_t pos, uint64_t seed) {
  uint64_t x = (pos + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

std::vector<uint8_t> Pattern(uint64_t addr, uint64_t len, uint64_t seed) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) v[i] = PatternByte(addr + i, seed);
  return v;
}

bool Matches(const uint8_t* p, uint64_t addr, uint64_t len, uint64_t seed) {
  for (uint64_t i = 0; i < len; ++i) {
    if (p[i] != PatternByte(addr + i, seed)) return false;
  }
  return true;
}

HybridDeviceOptions SmallOptions() {
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
    BlockIo* dev_io = faulty != nullptr ? static_cast<BlockIo*>(faulty.get())
                                        : io.get();
    auto t = std::make_unique<FakeCapacityTier>(dev_io, kCap,
                                                std::move(extents));
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

PrefetchHandle Prefetch(HybridDevice* d, uint64_t addr, uint64_t len) {
  auto h = d->PrefetchObject(0, addr, len);
  REQUIRE(h.ok());
  return *h;
}

// Polls `pred` until it holds; false after 20 s.
template <typename Pred>
bool WaitUntil(Pred pred) {
  const absl::Time deadline = Soon();
  while (!pred()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Whether every durable extent's bytes on the disk are its object's, for
// objects written with seed == tag: a record never claims bytes that were
// overwritten since.
bool DurableMatchesDisk(const Rig& rig) {
  for (const DurableExtent& e : rig.tier->ExtentsNowForTest()) {
    if (rig.io->CopyForTest(kHdr + e.addr, e.length) !=
        Pattern(e.addr, e.length, e.tag)) {
      return false;
    }
  }
  return true;
}

TEST_CASE("HybridDevice describes one persistent hybrid region") {
  Rig rig;
  auto regions = rig.dev->Regions();
  REQUIRE(regions.size() == 1);
  CHECK(regions[0].region_id == 0);
  CHECK(regions[0].capacity_bytes == kCap);
  CHECK(regions[0].alignment == 4096);
  CHECK(regions[0].device_kind == "hybrid");
  CHECK(regions[0].persistent);
  CHECK(rig.dev->RecoveredExtents().empty());
  CHECK(rig.dev->AcquireRead(1, 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(rig.dev->AcquireRead(0, kCap, 1).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(rig.dev->BeginWrite(0, 100, 10, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);  // unaligned
  CHECK(rig.dev->PrefetchObject(0, 0, 1 << 20).status().code() ==
        absl::StatusCode::kResourceExhausted);  // larger than the window
  HybridDeviceOptions bad = SmallOptions();
  bad.io_chunk_bytes = 1000;
  CHECK_FALSE(bad.Validate().ok());
}

TEST_CASE("HybridDevice exposes the staging window and write buffer as areas") {
  Rig rig;  // 128 KiB window, 128 KiB buffer
  const std::vector<MemoryArea> areas = rig.dev->Areas();
  REQUIRE(areas.size() == 2);
  const MemoryArea& staging = areas[0];
  const MemoryArea& buffer = areas[1];
  CHECK(staging.area_id == HybridDevice::kStagingAreaId);
  CHECK(staging.area_id == 1);
  CHECK(staging.kind == "staging");
  CHECK(staging.length == 128 * kKiB);
  CHECK(buffer.area_id == HybridDevice::kWriteBufferAreaId);
  CHECK(buffer.area_id == 2);
  CHECK(buffer.kind == "write_buffer");
  CHECK(buffer.length == 128 * kKiB);
  CHECK(staging.fd >= 0);
  CHECK(buffer.fd >= 0);
  CHECK(staging.fd != buffer.fd);
  CHECK((staging.base + staging.length <= buffer.base ||
         buffer.base + buffer.length <= staging.base));

  // A prefetch from the tier is staged in the window.
  rig.FillDisk(64 * kKiB, 40 * kKiB, 21);
  PrefetchHandle h = Prefetch(rig.dev.get(), 64 * kKiB, 40 * kKiB);
  auto p = rig.dev->PrefetchWait(h, Soon());
  REQUIRE(p.ok());
  auto in_window = LocateInAreas(areas, *p, 40 * kKiB);
  REQUIRE(in_window.ok());
  CHECK(in_window->first == HybridDevice::kStagingAreaId);
  // A same-host peer mapping the window's memfd sees the staged bytes.
  {
    const std::string path = "/proc/self/fd/" + std::to_string(staging.fd);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    void* m = mmap(nullptr, staging.length, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    CHECK(Matches(static_cast<uint8_t*>(m) + in_window->second, 64 * kKiB,
                  40 * kKiB, 21));
    munmap(m, staging.length);
    close(fd);
  }
  rig.dev->PrefetchRelease(h);

  // Writes land in the write buffer; a prefetch of a buffered object is
  // served from there.
  rig.io->PauseForTest();
  auto w = rig.dev->BeginWrite(0, 512 * kKiB, 20 * kKiB, 1);
  REQUIRE(w.ok());
  auto in_buffer = LocateInAreas(areas, w->data, w->length);
  REQUIRE(in_buffer.ok());
  CHECK(in_buffer->first == HybridDevice::kWriteBufferAreaId);
  std::vector<uint8_t> v = Pattern(512 * kKiB, 20 * kKiB, 22);
  std::memcpy(w->data, v.data(), v.size());
  REQUIRE(rig.dev->CommitWrite(*w).ok());
  PrefetchHandle hb = Prefetch(rig.dev.get(), 512 * kKiB, 20 * kKiB);
  auto pb = rig.dev->PrefetchWait(hb, Soon());
  REQUIRE(pb.ok());
  auto pb_where = LocateInAreas(areas, *pb, 20 * kKiB);
  REQUIRE(pb_where.ok());
  CHECK(pb_where->first == HybridDevice::kWriteBufferAreaId);
  CHECK(Matches(*pb, 512 * kKiB, 20 * kKiB, 22));
  rig.dev->PrefetchRelease(hb);
  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));

  // A staging miss reads into a bounce buffer, outside both areas.
  auto r = rig.dev->AcquireRead(0, 64 * kKiB, 40 * kKiB);
  REQUIRE(r.ok());
  CHECK(rig.dev->HybridStats().staging_misses == 1);
  CHECK(LocateInAreas(areas, r->data, r->length).status().code() ==
        absl::StatusCode::kNotFound);
  rig.dev->ReleaseRead(*r);
}

TEST_CASE("HybridDevice with shareable=false exposes private areas") {
  HybridDeviceOptions o = SmallOptions();
  o.shareable = false;
  Rig rig(o);
  const std::vector<MemoryArea> areas = rig.dev->Areas();
  REQUIRE(areas.size() == 2);
  CHECK(areas[0].fd == -1);
  CHECK(areas[1].fd == -1);
  auto w = rig.dev->BeginWrite(0, 0, 4 * kKiB, 1);
  REQUIRE(w.ok());
  CHECK(LocateInAreas(areas, w->data, w->length).ok());
  rig.dev->AbortWrite(*w);
}

TEST_CASE(
    "HybridDevice faults its window and buffer in at creation unless told not "
    "to") {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  auto resident = [&](const MemoryArea& a) {
    std::vector<unsigned char> vec((a.length + page - 1) / page);
    REQUIRE(mincore(a.base, a.length, vec.data()) == 0);
    return static_cast<uint64_t>(std::count_if(
        vec.begin(), vec.end(), [](unsigned char c) { return c & 1; }));
  };
  for (bool populate : {true, false}) {
    INFO("populate_memory " << populate);
    HybridDeviceOptions o = SmallOptions();
    o.staging_bytes = 4 << 20;
    o.write_buffer_bytes = 4 << 20;
    o.populate_memory = populate;
    Rig rig(o);
    const std::vector<MemoryArea> areas = rig.dev->Areas();
    REQUIRE(areas.size() == 2);
    for (const MemoryArea& a : areas) {
      INFO(a.kind);
      // Without: the first refill or write into fresh space allocates and
      // zeroes its page on the request's path.
      CHECK((resident(a) == a.length / page) == populate);
    }
  }
}

TEST_CASE("PrefetchWait and BeginWrite pointers always lie in an area") {
  Rig rig;
  const std::vector<MemoryArea> areas = rig.dev->Areas();
  rig.FillDisk(0, kCap, 23);
  std::mt19937_64 rng(7);
  int from_window = 0;
  int from_buffer = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t len = (1 + rng() % 8) * 4 * kKiB;
    const uint64_t addr = (rng() % ((kCap - len) / (4 * kKiB))) * 4 * kKiB;
    if (rng() % 3 == 0) {
      auto w = rig.dev->BeginWrite(0, addr, len, 100 + i);
      if (!w.ok()) {
        // The buffer is full for now; let the flusher drain it.
        CHECK(w.status().code() == absl::StatusCode::kResourceExhausted);
        REQUIRE(rig.dev->WaitFlushedForTest(Soon(), /*force=*/true));
        continue;
      }
      auto where = LocateInAreas(areas, w->data, w->length);
      REQUIRE(where.ok());
      CHECK(where->first == HybridDevice::kWriteBufferAreaId);
      std::vector<uint8_t> v = Pattern(addr, len, 23);
      std::memcpy(w->data, v.data(), len);
      REQUIRE(rig.dev->CommitWrite(*w).ok());
    } else {
      PrefetchHandle h = Prefetch(rig.dev.get(), addr, len);
      auto p = rig.dev->PrefetchWait(h, Soon());
      REQUIRE(p.ok());
      auto where = LocateInAreas(areas, *p, len);
      REQUIRE(where.ok());
      (where->first == HybridDevice::kStagingAreaId ? from_window
                                                    : from_buffer)++;
      CHECK(Matches(*p, addr, len, 23));
      rig.dev->PrefetchRelease(h);
    }
  }
  CHECK(from_window > 0);
}

TEST_CASE("Prefetch, wait, read from the window, release") {
  Rig rig;
  rig.FillDisk(64 * kKiB, 40 * kKiB, 1);
  PrefetchHandle h = Prefetch(rig.dev.get(), 64 * kKiB, 40 * kKiB);
  auto p = rig.dev->PrefetchWait(h, Soon());
  REQUIRE(p.ok());
  CHECK(Matches(*p, 64 * kKiB, 40 * kKiB, 1));
  // 40 KiB in 16 KiB chunks: three reads.
  CHECK(rig.io->ReadsForTest() == 3);

  auto r = rig.dev->AcquireRead(0, 64 * kKiB, 40 * kKiB);
  REQUIRE(r.ok());
  CHECK(r->data == *p);  // served from the window, no copy
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staging_hits == 1);
  CHECK(s.staging_misses == 0);
  CHECK(s.staged_bytes == 40 * kKiB);
  CHECK(s.refill_bytes == 40 * kKiB);
  CHECK(s.refill_bandwidth_bytes_per_s > 0);

  rig.dev->PrefetchRelease(h);
  // Still pinned by the read.
  CHECK(rig.dev->HybridStats().staged_bytes == 40 * kKiB);
  rig.dev->ReleaseRead(*r);
  s = rig.dev->HybridStats();
  CHECK(s.staged_bytes == 0);
  CHECK(s.staged_objects == 0);
  CHECK(s.device.outstanding_reads == 0);

  // Not staged any more: a miss through a bounce buffer, still correct.
  CHECK(rig.ReadMatches(64 * kKiB, 40 * kKiB, 1));
  CHECK(rig.dev->HybridStats().staging_misses == 1);

  // Unknown and double releases are counted, not fatal.
  rig.dev->PrefetchRelease(h);
  rig.dev->ReleaseRead(*r);
  CHECK(rig.dev->HybridStats().unknown_releases == 2);
  CHECK(rig.dev->PrefetchWait(h, Soon()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Waiters wake for their own object; a handle released mid-wait") {
  Rig rig;
  rig.FillDisk(0, 64 * kKiB, 3);
  rig.io->PauseForTest();
  PrefetchHandle a = Prefetch(rig.dev.get(), 0, 16 * kKiB);
  PrefetchHandle b = Prefetch(rig.dev.get(), 32 * kKiB, 16 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(2, absl::Seconds(10)));
  // Two threads wait for a, one for b (the same handle twice, as a caller
  // that races its own release would).
  std::atomic<int> a_ok{0};
  absl::Status b_status;
  Thread wa1("wait-a1", [&] {
    if (rig.dev->PrefetchWait(a, Soon()).ok()) ++a_ok;
  });
  Thread wa2("wait-a2", [&] {
    if (rig.dev->PrefetchWait(a, Soon()).ok()) ++a_ok;
  });
  Thread wb("wait-b", [&] { b_status = rig.dev->PrefetchWait(b, Soon()).status(); });
  REQUIRE(WaitUntil(
      [&] { return rig.dev->HybridStats().prefetch_waiters == 3; }));
  // b's handle goes away while its waiter sleeps: the staged object stays
  // alive until the waiter has looked again, which then finds no handle.
  rig.dev->PrefetchRelease(b);
  rig.io->ResumeForTest();
  wa1.Join();
  wa2.Join();
  wb.Join();
  CHECK(a_ok == 2);
  CHECK((b_status.ok() ||
         b_status.code() == absl::StatusCode::kInvalidArgument));
  auto p = rig.dev->PrefetchWait(a, Soon());
  REQUIRE(p.ok());
  CHECK(Matches(*p, 0, 16 * kKiB, 3));
  rig.dev->PrefetchRelease(a);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staged_objects == 0);
  CHECK(s.staged_bytes == 0);
}

TEST_CASE("A read of an object being staged wakes when the refill lands") {
  HybridDeviceOptions o = SmallOptions();
  o.read_timeout = absl::Seconds(10);
  Rig rig(o);
  rig.FillDisk(0, 32 * kKiB, 23);
  rig.io->PauseForTest();
  PrefetchHandle h = Prefetch(rig.dev.get(), 0, 32 * kKiB);
  absl::Duration took;
  bool matched = false;
  {
    Thread reader("test-read", [&] {
      const absl::Time start = absl::Now();
      auto r = rig.dev->AcquireRead(0, 0, 32 * kKiB);
      took = absl::Now() - start;
      if (r.ok()) {
        matched = Matches(r->data, 0, 32 * kKiB, 23);
        rig.dev->ReleaseRead(*r);
      }
    });
    REQUIRE(WaitUntil([&] { return rig.dev->HybridStats().read_waiters == 1; }));
    rig.io->ResumeForTest();
  }
  CHECK(matched);
  // Woken by the completion, not by read_timeout.
  CHECK(took < absl::Seconds(5));
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staging_hits == 1);
  CHECK(s.staging_misses == 0);
  CHECK(s.read_waiters == 0);
  rig.dev->PrefetchRelease(h);
}

TEST_CASE("A full window queues prefetches FIFO until space is released") {
  Rig rig;  // 128 KiB window
  rig.FillDisk(0, kCap / 2, 2);
  PrefetchHandle a = Prefetch(rig.dev.get(), 0, 64 * kKiB);
  PrefetchHandle b = Prefetch(rig.dev.get(), 1024 * kKiB, 32 * kKiB);
  PrefetchHandle c = Prefetch(rig.dev.get(), 2048 * kKiB, 64 * kKiB);
  // D would fit in the 32 KiB left, but waits behind C.
  PrefetchHandle d = Prefetch(rig.dev.get(), 3072 * kKiB, 16 * kKiB);
  REQUIRE(rig.dev->PrefetchWait(a, Soon()).ok());
  REQUIRE(rig.dev->PrefetchWait(b, Soon()).ok());
  // Neither C nor D holds window space (so neither has I/O): only A's and
  // B's 96 KiB are reserved, both are queued.
  CHECK(rig.dev->HybridStats().prefetch_queue_length == 2);
  CHECK(rig.dev->HybridStats().staged_bytes == 96 * kKiB);
  CHECK(rig.dev->PrefetchWait(c, absl::Now()).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(rig.dev->PrefetchWait(d, absl::Now()).status().code() ==
        absl::StatusCode::kDeadlineExceeded);

  rig.dev->PrefetchRelease(b);  // 64 KiB free: C starts, D still waits
  auto pc = rig.dev->PrefetchWait(c, Soon());
  REQUIRE(pc.ok());
  CHECK(Matches(*pc, 2048 * kKiB, 64 * kKiB, 2));
  CHECK(rig.dev->HybridStats().prefetch_queue_length == 1);
  CHECK(rig.dev->PrefetchWait(d, absl::Now()).status().code() ==
        absl::StatusCode::kDeadlineExceeded);

  rig.dev->PrefetchRelease(a);
  auto pd = rig.dev->PrefetchWait(d, Soon());
  REQUIRE(pd.ok());
  CHECK(Matches(*pd, 3072 * kKiB, 16 * kKiB, 2));
  rig.dev->PrefetchRelease(c);
  rig.dev->PrefetchRelease(d);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staged_bytes == 0);
  CHECK(s.prefetch_queue_length == 0);
  CHECK(s.prefetch_cancelled == 0);
}

TEST_CASE("Releasing ready handles that were never read frees their space") {
  Rig rig;
  rig.FillDisk(0, 512 * kKiB, 3);
  for (int round = 0; round < 5; ++round) {
    std::vector<PrefetchHandle> hs;
    for (uint64_t i = 0; i < 4; ++i) {
      hs.push_back(Prefetch(rig.dev.get(), i * 32 * kKiB, 32 * kKiB));
    }
    // Wait only for the last: the FIFO makes the others ready too.
    REQUIRE(rig.dev->PrefetchWait(hs.back(), Soon()).ok());
    for (const PrefetchHandle& h : hs) rig.dev->PrefetchRelease(h);
    CHECK(rig.dev->HybridStats().staged_bytes == 0);
  }
  CHECK(rig.dev->HybridStats().prefetch_cancelled == 0);
}

TEST_CASE("Cancelling queued and in-flight prefetches never reuses a busy slot") {
  HybridDeviceOptions o = SmallOptions();
  o.staging_bytes = 64 * kKiB;  // one object at a time
  Rig rig(o);
  rig.FillDisk(0, 512 * kKiB, 4);
  rig.io->PauseForTest();
  PrefetchHandle a = Prefetch(rig.dev.get(), 0, 64 * kKiB);
  PrefetchHandle b = Prefetch(rig.dev.get(), 128 * kKiB, 64 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(4, absl::Seconds(10)));  // A's chunks
  CHECK(rig.dev->HybridStats().prefetch_queue_length == 1);

  rig.dev->PrefetchRelease(b);  // queued: cancelled at once, no I/O
  CHECK(rig.dev->HybridStats().prefetch_queue_length == 0);
  CHECK(rig.dev->HybridStats().prefetch_cancelled == 1);

  PrefetchHandle c = Prefetch(rig.dev.get(), 256 * kKiB, 64 * kKiB);
  rig.dev->PrefetchRelease(a);  // in flight: its slot stays reserved
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.prefetch_cancelled == 2);
  CHECK(s.staged_bytes == 64 * kKiB);
  CHECK(s.prefetch_queue_length == 1);  // C still waits for A's I/O
  // The I/O is paused, so nothing completes behind the test's back: no
  // read was issued for B or C, and C is not ready.
  CHECK(rig.io->ReadsForTest() == 4);
  CHECK(rig.dev->PrefetchWait(c, absl::Now()).status().code() ==
        absl::StatusCode::kDeadlineExceeded);

  rig.io->ResumeForTest();
  auto pc = rig.dev->PrefetchWait(c, Soon());
  REQUIRE(pc.ok());
  // A's late reads did not land in C's slot.
  CHECK(Matches(*pc, 256 * kKiB, 64 * kKiB, 4));
  CHECK(rig.io->ReadsForTest() == 8);
  rig.dev->PrefetchRelease(c);
  rig.dev->PrefetchRelease(c);
  s = rig.dev->HybridStats();
  CHECK(s.staged_bytes == 0);
  CHECK(s.staged_objects == 0);
  CHECK(s.unknown_releases == 1);
}

TEST_CASE("Prefetches of the same object share one staged copy") {
  Rig rig;
  rig.FillDisk(96 * kKiB, 20 * kKiB, 5);
  PrefetchHandle h1 = Prefetch(rig.dev.get(), 96 * kKiB, 20 * kKiB);
  PrefetchHandle h2 = Prefetch(rig.dev.get(), 96 * kKiB, 20 * kKiB);
  CHECK(h1.id != h2.id);
  auto p1 = rig.dev->PrefetchWait(h1, Soon());
  auto p2 = rig.dev->PrefetchWait(h2, Soon());
  REQUIRE(p1.ok());
  REQUIRE(p2.ok());
  CHECK(*p1 == *p2);
  CHECK(rig.io->ReadsForTest() == 2);  // 20 KiB: two 16 KiB chunks, once
  CHECK(rig.dev->HybridStats().prefetch_shared == 1);
  rig.dev->PrefetchRelease(h1);
  CHECK(Matches(*p2, 96 * kKiB, 20 * kKiB, 5));
  CHECK(rig.dev->HybridStats().staged_bytes == 20 * kKiB);
  rig.dev->PrefetchRelease(h2);
  CHECK(rig.dev->HybridStats().staged_bytes == 0);
}

TEST_CASE("Writes: admit, refuse at once when full, read your write") {
  Rig rig;  // 128 KiB buffer
  rig.io->PauseForTest();  // nothing leaves the buffer
  auto w1 = rig.dev->BeginWrite(0, 0, 64 * kKiB, 11);
  auto w2 = rig.dev->BeginWrite(0, 64 * kKiB, 60 * kKiB + 1, 12);  // 64 KiB
  REQUIRE(w1.ok());
  REQUIRE(w2.ok());
  const absl::Time t0 = absl::Now();
  auto w3 = rig.dev->BeginWrite(0, 256 * kKiB, 4 * kKiB, 13);
  CHECK(absl::Now() - t0 < absl::Seconds(1));
  CHECK(w3.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(rig.dev->HybridStats().write_buffer_refusals == 1);
  CHECK(rig.dev->Stats().refused_writes == 1);

  rig.dev->AbortWrite(*w2);
  std::vector<uint8_t> v = Pattern(0, 64 * kKiB, 6);
  std::memcpy(w1->data, v.data(), v.size());
  REQUIRE(rig.dev->CommitWrite(*w1).ok());
  CHECK(rig.dev->CommitWrite(*w1).code() == absl::StatusCode::kInvalidArgument);

  // Readable from the buffer before any flush.
  auto r = rig.dev->AcquireRead(0, 0, 64 * kKiB);
  REQUIRE(r.ok());
  CHECK(Matches(r->data, 0, 64 * kKiB, 6));
  rig.dev->ReleaseRead(*r);
  // A sub-range of a buffered object is served too.
  CHECK(rig.ReadMatches(4 * kKiB, 100, 6));
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.buffer_hits == 2);
  CHECK(s.write_buffer_admits == 2);
  CHECK(s.device.aborted_writes == 1);
  CHECK(s.device.writes == 1);
  CHECK(s.unflushed_objects == 1);

  // A prefetch of a buffered object costs no I/O.
  const uint64_t reads_before = rig.io->ReadsForTest();
  PrefetchHandle h = Prefetch(rig.dev.get(), 0, 64 * kKiB);
  auto p = rig.dev->PrefetchWait(h, absl::Now());
  REQUIRE(p.ok());
  CHECK(Matches(*p, 0, 64 * kKiB, 6));
  CHECK(rig.io->ReadsForTest() == reads_before);
  CHECK(rig.dev->HybridStats().prefetch_from_buffer == 1);

  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  // The handle still sees the buffered bytes after the flush.
  CHECK(Matches(*p, 0, 64 * kKiB, 6));
  rig.dev->PrefetchRelease(h);
  s = rig.dev->HybridStats();
  CHECK(s.buffered_bytes == 0);
  CHECK(s.flushed_bytes == 64 * kKiB);
  CHECK(s.flush_lag == absl::ZeroDuration());
  // Now from the tier, byte for byte.
  CHECK(rig.io->CopyForTest(kHdr, 64 * kKiB) == v);
  CHECK(rig.ReadMatches(0, 64 * kKiB, 6));
  CHECK(rig.dev->HybridStats().staging_misses == 1);
}

TEST_CASE("Flushes go in commit order, merged, then recorded with the tags") {
  Rig rig;
  rig.FillDisk(1024 * kKiB, 16 * kKiB, 7);
  // Hold the flusher off with a foreground read in flight.
  rig.io->PauseForTest();
  PrefetchHandle hold = Prefetch(rig.dev.get(), 1024 * kKiB, 16 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(1, absl::Seconds(10)));
  rig.Put(512 * kKiB, 8 * kKiB, 103, 8);
  rig.Put(0, 8 * kKiB, 101, 8);
  rig.Put(8 * kKiB, 5000, 102, 8);  // contiguous with the previous one
  rig.Put(256 * kKiB, 4 * kKiB, 104, 8);
  CHECK(rig.io->WritesForTest() == 0);
  rig.dev->PrefetchRelease(hold);
  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));

  std::vector<uint64_t> write_offsets;
  for (const FakeBlockIo::Op& op : rig.io->LogForTest()) {
    if (op.write) write_offsets.push_back(op.offset - kHdr);
  }
  CHECK(write_offsets ==
        std::vector<uint64_t>{512 * kKiB, 0, 256 * kKiB});  // 0+8K merged
  // Forgotten ahead, one call per contiguous address range, in address
  // order.
  auto forgets = rig.tier->ForgetCallsForTest();
  REQUIRE(forgets.size() == 3);
  CHECK(forgets[0] == std::make_pair(uint64_t{0}, 16 * kKiB));
  CHECK(forgets[1] == std::make_pair(256 * kKiB, 4 * kKiB));
  CHECK(forgets[2] == std::make_pair(512 * kKiB, 8 * kKiB));
  auto recorded = rig.tier->RecordedForTest();
  REQUIRE(recorded.size() == 4);
  CHECK(recorded[0].tag == 103);
  CHECK(recorded[1].tag == 101);
  CHECK(recorded[2].tag == 102);
  CHECK(recorded[2].length == 5000);
  CHECK(recorded[3].tag == 104);
  CHECK(rig.io->CopyForTest(kHdr + 8 * kKiB, 5000) ==
        Pattern(8 * kKiB, 5000, 8));
  CHECK(rig.ReadMatches(8 * kKiB, 5000, 8));
  CHECK(rig.ReadMatches(512 * kKiB, 8 * kKiB, 8));
  CHECK(rig.dev->HybridStats().flushed_objects == 4);
}

TEST_CASE("Under reads, a flush waits for a whole batch; its writes grow with the fill") {
  FakeClock clock;
  HybridDeviceOptions o = SmallOptions();
  o.clock = &clock;
  Rig rig(o);  // 128 KiB buffer (watermark 96 KiB), 64 KiB batches, QD 8
  rig.FillDisk(1024 * kKiB, 16 * kKiB, 9);
  rig.io->PauseForTest();
  PrefetchHandle hold = Prefetch(rig.dev.get(), 1024 * kKiB, 16 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(1, absl::Seconds(10)));
  rig.Put(0, 32 * kKiB, 1, 10);
  clock.Advance(absl::Milliseconds(100));
  // The flusher has looked since: less than a batch waits and a read is in
  // flight, so no flush yet.
  REQUIRE(rig.dev->SettleFlusherForTest(Soon()));
  CHECK(rig.io->WritesForTest() == 0);
  CHECK(rig.dev->HybridStats().flush_ios == 0);
  CHECK(rig.dev->HybridStats().flush_lag == absl::Milliseconds(100));

  // A whole batch (64 KiB) waits: it starts at once, with ceil(8 x 50%) =
  // 4 write slots: all 4 chunks of 16 KiB in flight beside the read.
  rig.Put(64 * kKiB, 32 * kKiB, 2, 10);
  REQUIRE(rig.io->WaitPendingForTest(5, absl::Seconds(10)));
  CHECK(rig.io->WritesForTest() == 4);
  CHECK(rig.io->PendingForTest() == 5);

  // 96 KiB buffered (75%, the watermark): the next (partial) batch starts
  // too, and the fill allows ceil(8 x 75%) = 6 writes in flight.
  rig.Put(128 * kKiB, 32 * kKiB, 3, 10);
  REQUIRE(rig.io->WaitPendingForTest(7, absl::Seconds(10)));
  CHECK(rig.io->WritesForTest() == 6);
  CHECK(rig.io->PendingForTest() == 7);

  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(rig.dev->PrefetchWait(hold, Soon()).ok());
  rig.dev->PrefetchRelease(hold);
  CHECK(rig.ReadMatches(0, 32 * kKiB, 10));
  CHECK(rig.ReadMatches(128 * kKiB, 32 * kKiB, 10));
  CHECK(rig.dev->HybridStats().buffered_bytes == 0);
}

TEST_CASE("Under reads, a commit is flushed once it is flush_max_delay old, not before") {
  FakeClock clock;
  HybridDeviceOptions o = SmallOptions();
  o.clock = &clock;
  o.flush_max_delay = absl::Seconds(1);
  Rig rig(o);
  rig.FillDisk(1024 * kKiB, 16 * kKiB, 13);
  rig.io->PauseForTest();
  PrefetchHandle hold = Prefetch(rig.dev.get(), 1024 * kKiB, 16 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(1, absl::Seconds(10)));
  rig.Put(0, 16 * kKiB, 1, 14);
  clock.Advance(absl::Milliseconds(999));
  REQUIRE(rig.dev->SettleFlusherForTest(Soon()));
  CHECK(rig.io->WritesForTest() == 0);
  CHECK(rig.dev->HybridStats().flush_ios == 0);
  CHECK(rig.tier->ForgetCallsForTest().empty());
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(rig.dev->SettleFlusherForTest(Soon()));
  // Due now: forgotten over, then written (one 16 KiB write beside the
  // paused read).
  CHECK(rig.tier->ForgetCallsForTest().size() == 1);
  CHECK(rig.io->WritesForTest() == 1);
  CHECK(rig.io->PendingForTest() == 2);
  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(rig.dev->PrefetchWait(hold, Soon()).ok());
  rig.dev->PrefetchRelease(hold);
  CHECK(rig.ReadMatches(0, 16 * kKiB, 14));
  CHECK(rig.tier->RecordedForTest().size() == 1);
}

TEST_CASE("Flush errors keep objects readable and are retried") {
  Rig rig;
  rig.io->FailNextForTest(1);
  rig.Put(0, 16 * kKiB, 21, 11);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.flush_errors == 1);
  CHECK(s.flushed_objects == 1);
  CHECK(rig.ReadMatches(0, 16 * kKiB, 11));

  rig.tier->FailNextForTest(1);  // the Forget of the next batch
  rig.Put(64 * kKiB, 16 * kKiB, 22, 12);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  CHECK(rig.dev->HybridStats().flush_errors == 2);
  CHECK(rig.ReadMatches(64 * kKiB, 16 * kKiB, 12));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 2);
  CHECK(ext[1].tag == 22);

  // Failed Records are retried (after a backoff) until one succeeds; the
  // object stays readable from the tier meanwhile.
  rig.tier->SetRecordsFailForTest(true);
  rig.Put(128 * kKiB, 16 * kKiB, 23, 13);
  REQUIRE(WaitUntil([&] { return rig.dev->HybridStats().record_errors >= 3; }));
  CHECK(rig.dev->HybridStats().record_pending_objects == 1);
  CHECK(rig.ReadMatches(128 * kKiB, 16 * kKiB, 13));
  rig.tier->SetRecordsFailForTest(false);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 3);
  CHECK(ext[2].tag == 23);
}

TEST_CASE("While flushes fail, a full buffer's refusal says why") {
  Rig rig;  // 128 KiB buffer
  rig.io->FailNextForTest(1000000);  // every write fails (a full disk)
  for (int i = 0; i < 8; ++i) rig.Put(i * 16 * kKiB, 16 * kKiB, 30 + i, 30 + i);
  REQUIRE(WaitUntil([&] { return rig.dev->HybridStats().flush_errors > 0; }));
  auto w = rig.dev->BeginWrite(0, 512 * kKiB, 16 * kKiB, 99);
  REQUIRE(w.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(w.status().message().find("flushes to the capacity tier are failing") !=
        std::string::npos);
  // Nothing committed is lost meanwhile.
  CHECK(rig.ReadMatches(3 * 16 * kKiB, 16 * kKiB, 33));
  rig.io->FailNextForTest(0);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  CHECK(rig.ReadMatches(7 * 16 * kKiB, 16 * kKiB, 37));
  // Drained and healthy: a plain refusal no longer blames the flush.
  for (int i = 0; i < 8; ++i) rig.Put(i * 16 * kKiB, 16 * kKiB, 40 + i, 40 + i);
  rig.io->PauseForTest();
  auto again = rig.dev->BeginWrite(0, 1024 * kKiB, 128 * kKiB, 99);
  if (!again.ok()) {
    CHECK(again.status().message().find("failing") == std::string::npos);
  } else {
    rig.dev->AbortWrite(*again);
  }
  rig.io->ResumeForTest();
}

TEST_CASE("Refill and miss errors surface as Unavailable") {
  Rig rig;
  rig.io->FailNextForTest(1);
  PrefetchHandle h = Prefetch(rig.dev.get(), 0, 16 * kKiB);
  CHECK(rig.dev->PrefetchWait(h, Soon()).status().code() ==
        absl::StatusCode::kUnavailable);
  rig.dev->PrefetchRelease(h);
  rig.io->FailNextForTest(1);
  CHECK(rig.dev->AcquireRead(0, 0, 16 * kKiB).status().code() ==
        absl::StatusCode::kUnavailable);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.prefetch_errors == 1);
  CHECK(s.read_io_errors == 2);
  CHECK(s.staged_bytes == 0);
  CHECK(s.bounce_bytes == 0);
  // And it works again afterwards.
  rig.FillDisk(0, 16 * kKiB, 13);
  CHECK(rig.ReadMatches(0, 16 * kKiB, 13));
}

TEST_CASE("Bounce buffers are bounded") {
  HybridDeviceOptions o = SmallOptions();
  o.max_bounce_bytes = 64 * kKiB;
  Rig rig(o);
  rig.FillDisk(0, 256 * kKiB, 14);
  auto r1 = rig.dev->AcquireRead(0, 0, 48 * kKiB);
  REQUIRE(r1.ok());
  CHECK(rig.dev->AcquireRead(0, 64 * kKiB, 32 * kKiB).status().code() ==
        absl::StatusCode::kResourceExhausted);
  rig.dev->ReleaseRead(*r1);
  // Alone, even an object above the bound is readable.
  CHECK(rig.ReadMatches(0, 100 * kKiB, 14));
  CHECK(rig.dev->HybridStats().bounce_bytes == 0);
}

TEST_CASE("A write invalidates the staged copy of the space it reuses") {
  Rig rig;
  rig.FillDisk(0, 32 * kKiB, 15);
  PrefetchHandle old = Prefetch(rig.dev.get(), 0, 32 * kKiB);
  auto p = rig.dev->PrefetchWait(old, Soon());
  REQUIRE(p.ok());
  rig.Put(0, 32 * kKiB, 5, 16);
  CHECK(rig.ReadMatches(0, 32 * kKiB, 16));  // the new bytes
  CHECK(Matches(*p, 0, 32 * kKiB, 15));      // the old handle keeps its own
  rig.dev->PrefetchRelease(old);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  PrefetchHandle fresh = Prefetch(rig.dev.get(), 0, 32 * kKiB);
  auto q = rig.dev->PrefetchWait(fresh, Soon());
  REQUIRE(q.ok());
  CHECK(Matches(*q, 0, 32 * kKiB, 16));
  rig.dev->PrefetchRelease(fresh);
}

TEST_CASE("A restarted device re-adopts its durable objects") {
  Rig rig;
  rig.Put(0, 12 * kKiB, 7, 17);
  rig.Put(1024 * kKiB, 100 * kKiB, 8, 18);
  rig.Put(0, 12 * kKiB, 9, 19);  // overwrites generation 7
  std::vector<DurableExtent> durable;
  rig.tier->SaveExtentsOnCloseForTest(&durable);
  rig.dev.reset();

  rig.Open(SmallOptions(), durable);
  CHECK(rig.tier->adopted());
  std::vector<RecoveredExtent> rec = rig.dev->RecoveredExtents();
  REQUIRE(rec.size() == 2);
  CHECK(rec[0].region_id == 0);
  CHECK(rec[0].addr == 0);
  CHECK(rec[0].length == 12 * kKiB);
  CHECK(rec[0].generation == 9);
  CHECK(rec[1].addr == 1024 * kKiB);
  CHECK(rec[1].length == 100 * kKiB);
  CHECK(rec[1].generation == 8);
  CHECK(rig.ReadMatches(0, 12 * kKiB, 19));
  CHECK(rig.ReadMatches(1024 * kKiB, 100 * kKiB, 18));
}

TEST_CASE("Destruction flushes what is buffered") {
  Rig rig;
  std::vector<DurableExtent> ext;
  rig.tier->SaveExtentsOnCloseForTest(&ext);
  rig.io->PauseForTest();  // nothing is flushed before the reset
  rig.Put(0, 8 * kKiB, 31, 20);
  rig.Put(64 * kKiB, 8 * kKiB, 32, 21);
  CHECK(rig.dev->HybridStats().unflushed_objects == 2);
  rig.io->ResumeForTest();
  rig.dev.reset();
  REQUIRE(ext.size() == 2);
  CHECK(ext[0].tag == 31);
  CHECK(ext[1].tag == 32);
  CHECK(rig.io->CopyForTest(kHdr, 8 * kKiB) == Pattern(0, 8 * kKiB, 20));
}

TEST_CASE("Buffer space is freed once the bytes land, before the Record") {
  Rig rig;  // 128 KiB buffer
  rig.tier->PauseRecordsForTest();
  rig.Put(0, 64 * kKiB, 41, 41);
  REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
  // The Record is still running, the buffer space is free already.
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.buffered_bytes == 0);
  CHECK(s.unflushed_objects == 0);
  CHECK(s.record_pending_objects == 1);
  CHECK(s.flushed_objects == 1);
  CHECK(s.recorded_objects == 0);
  CHECK(rig.tier->ExtentsNowForTest().empty());
  // A whole buffer's worth is admitted again.
  rig.Put(256 * kKiB, 128 * kKiB, 42, 42);
  // The written-but-unrecorded object is read from the tier, not the buffer,
  // both directly and through the window.
  CHECK(rig.ReadMatches(0, 64 * kKiB, 41));
  PrefetchHandle h = Prefetch(rig.dev.get(), 0, 64 * kKiB);
  auto p = rig.dev->PrefetchWait(h, Soon());
  REQUIRE(p.ok());
  CHECK(Matches(*p, 0, 64 * kKiB, 41));
  rig.dev->PrefetchRelease(h);
  s = rig.dev->HybridStats();
  CHECK(s.staging_misses == 1);
  CHECK(s.buffer_hits == 0);
  CHECK(s.prefetch_from_buffer == 0);

  rig.tier->ResumeRecordsForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 2);
  CHECK(ext[0].tag == 41);
  CHECK(ext[1].tag == 42);
  s = rig.dev->HybridStats();
  CHECK(s.recorded_objects == 2);
  CHECK(s.record_pending_objects == 0);
  CHECK(s.buffered_bytes == 0);
}

TEST_CASE("A pinned buffered copy keeps its space until released") {
  Rig rig;
  rig.tier->PauseRecordsForTest();
  rig.io->PauseForTest();
  rig.Put(0, 64 * kKiB, 43, 43);
  auto r = rig.dev->AcquireRead(0, 0, 64 * kKiB);  // a buffer hit
  REQUIRE(r.ok());
  rig.io->ResumeForTest();
  REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
  // On the tier now, but the reader still holds the buffered copy.
  CHECK(rig.dev->HybridStats().buffered_bytes == 64 * kKiB);
  CHECK(rig.dev->HybridStats().unflushed_objects == 0);
  CHECK(Matches(r->data, 0, 64 * kKiB, 43));
  rig.dev->ReleaseRead(*r);
  CHECK(rig.dev->HybridStats().buffered_bytes == 0);
  rig.tier->ResumeRecordsForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
}

TEST_CASE("Overwriting an object whose record is pending leaves no stale record") {
  // The retry backoff after a failed Record runs on this clock.
  FakeClock clock;
  HybridDeviceOptions o = SmallOptions();
  o.clock = &clock;
  Rig rig(o);
  int old_records_expected = 0;
  SECTION("the pending record is dropped") {
    rig.tier->SetRecordsFailForTest(true);
    rig.Put(0, 64 * kKiB, 1, 1);
    REQUIRE(WaitUntil([&] {
      HybridDeviceStats s = rig.dev->HybridStats();
      return s.record_pending_objects == 1 && s.buffered_bytes == 0 &&
             s.record_errors > 0;
    }));
    // Overwrite its middle and hold the new bytes in flight: a Record of
    // the old object from now on would claim bytes about to be replaced.
    rig.io->PauseForTest();
    rig.Put(16 * kKiB, 32 * kKiB, 2, 2);
    HybridDeviceStats s = rig.dev->HybridStats();
    CHECK(s.records_dropped == 1);
    CHECK(s.record_pending_objects == 0);
    rig.tier->SetRecordsFailForTest(false);
    // Past the backoff: the flusher forgets over the new object and issues
    // its write, and would Record anything still pending (a wrong Record)
    // before it waits again.
    clock.Advance(absl::Seconds(1));
    REQUIRE(rig.dev->SettleFlusherForTest(Soon()));
    REQUIRE(rig.io->WaitPendingForTest(1, absl::Seconds(10)));
    CHECK(static_cast<uint64_t>(rig.tier->RecordCallsForTest()) ==
          rig.dev->HybridStats().record_errors);
    rig.tier->PauseRecordsForTest();
    CHECK(DurableMatchesDisk(rig));
    rig.io->ResumeForTest();
    // The new object's Record: its bytes have landed.
    REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
    CHECK(DurableMatchesDisk(rig));
    rig.tier->ResumeRecordsForTest();
  }
  SECTION("the old object is in the Record running at the overwrite") {
    rig.tier->PauseRecordsForTest();
    rig.Put(0, 64 * kKiB, 1, 1);
    REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
    rig.Put(16 * kKiB, 32 * kKiB, 2, 2);
    rig.tier->AllowRecordsForTest(1);  // the old object becomes durable
    old_records_expected = 1;
    // Then the new one is forgotten over, written and recorded (blocked).
    REQUIRE(WaitUntil([&] { return rig.tier->RecordCallsForTest() == 2; }));
    REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
    CHECK(rig.tier->ExtentsNowForTest().empty());
    CHECK(DurableMatchesDisk(rig));
    rig.tier->ResumeRecordsForTest();
  }
  SECTION("a failed Record does not bring the overwritten one back") {
    rig.tier->PauseRecordsForTest();
    rig.tier->SetRecordsFailForTest(true);
    rig.Put(0, 64 * kKiB, 1, 1);
    REQUIRE(rig.tier->WaitRecordsBlockedForTest(1, absl::Seconds(10)));
    rig.Put(16 * kKiB, 32 * kKiB, 2, 2);
    rig.tier->AllowRecordsForTest(1);  // fails
    REQUIRE(WaitUntil([&] { return rig.dev->HybridStats().record_errors == 1; }));
    rig.tier->SetRecordsFailForTest(false);
    rig.tier->ResumeRecordsForTest();
  }
  clock.Advance(absl::Seconds(1));  // past any retry backoff
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].addr == 16 * kKiB);
  CHECK(ext[0].length == 32 * kKiB);
  CHECK(ext[0].tag == 2);
  CHECK(DurableMatchesDisk(rig));
  // The old object is recorded only by a Record that began before the
  // overwrite (the second section), never later.
  int records_of_old = 0;
  for (const DurableExtent& e : rig.tier->RecordedForTest()) {
    records_of_old += e.tag == 1 ? 1 : 0;
  }
  CHECK(records_of_old == old_records_expected);
  CHECK(rig.ReadMatches(16 * kKiB, 32 * kKiB, 2));
}

TEST_CASE("After a crash only recorded objects are recovered") {
  HybridDeviceOptions o = SmallOptions();
  o.shutdown_flush_timeout = absl::ZeroDuration();  // no flush on the way out
  Rig rig(o);
  rig.Put(0, 16 * kKiB, 1, 1);
  rig.Put(512 * kKiB, 16 * kKiB, 2, 2);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(rig.tier->ExtentsNowForTest().size() == 2);

  rig.tier->SetRecordsFailForTest(true);
  rig.Put(1024 * kKiB, 16 * kKiB, 3, 3);  // new
  rig.Put(0, 16 * kKiB, 4, 4);            // over a recorded one
  REQUIRE(WaitUntil([&] {
    HybridDeviceStats s = rig.dev->HybridStats();
    return s.record_pending_objects == 2 && s.buffered_bytes == 0;
  }));
  // Written, not recorded: served from the tier with the right bytes.
  CHECK(rig.ReadMatches(1024 * kKiB, 16 * kKiB, 3));
  CHECK(rig.ReadMatches(0, 16 * kKiB, 4));
  CHECK(rig.dev->HybridStats().buffer_hits == 0);
  CHECK(rig.dev->HybridStats().staging_misses == 2);

  std::vector<DurableExtent> durable;
  rig.tier->SaveExtentsOnCloseForTest(&durable);
  rig.dev.reset();  // the records never make it
  rig.Open(o, durable);
  std::vector<RecoveredExtent> rec = rig.dev->RecoveredExtents();
  REQUIRE(rec.size() == 1);
  CHECK(rec[0].addr == 512 * kKiB);
  CHECK(rec[0].length == 16 * kKiB);
  CHECK(rec[0].generation == 2);
  CHECK(rig.ReadMatches(512 * kKiB, 16 * kKiB, 2));
}

TEST_CASE("A footprint many times the window streams through correctly") {
  HybridDeviceOptions o = SmallOptions();
  o.staging_bytes = 96 * kKiB;
  Rig rig(o);
  rig.io->SetLatencyForTest(absl::Microseconds(50));
  // Objects of 1..40 KiB at 4 KiB-aligned addresses, ~1.5 MiB in all.
  std::mt19937_64 rng(42);
  struct Obj {
    uint64_t addr, len;
  };
  std::vector<Obj> objs;
  uint64_t addr = 0;
  while (addr < 1536 * kKiB) {
    uint64_t len = 1 + rng() % (40 * kKiB);
    objs.push_back({addr, len});
    addr += (len + 4095) / 4096 * 4096;
  }
  // Half written through the device, half already on the disk.
  for (size_t i = 0; i < objs.size(); ++i) {
    if (i % 2 == 0) {
      rig.FillDisk(objs[i].addr, objs[i].len, 50);
    } else {
      while (true) {
        auto w = rig.dev->BeginWrite(0, objs[i].addr, objs[i].len, i);
        if (!w.ok()) {
          REQUIRE(w.status().code() == absl::StatusCode::kResourceExhausted);
          absl::SleepFor(absl::Milliseconds(1));
          continue;
        }
        std::vector<uint8_t> v = Pattern(objs[i].addr, objs[i].len, 50);
        std::memcpy(w->data, v.data(), v.size());
        REQUIRE(rig.dev->CommitWrite(*w).ok());
        break;
      }
    }
  }
  // Keep up to 4 prefetches ahead of the reader.
  for (int pass = 0; pass < 2; ++pass) {
    std::deque<std::pair<Obj, PrefetchHandle>> ahead;
    size_t next = 0;
    size_t bad = 0;
    while (next < objs.size() || !ahead.empty()) {
      while (next < objs.size() && ahead.size() < 4) {
        ahead.emplace_back(objs[next],
                           Prefetch(rig.dev.get(), objs[next].addr,
                                    objs[next].len));
        ++next;
      }
      auto [obj, h] = ahead.front();
      ahead.pop_front();
      auto p = rig.dev->PrefetchWait(h, Soon());
      REQUIRE(p.ok());
      if (!Matches(*p, obj.addr, obj.len, 50)) ++bad;
      auto r = rig.dev->AcquireRead(0, obj.addr, obj.len);
      REQUIRE(r.ok());
      if (!Matches(r->data, obj.addr, obj.len, 50)) ++bad;
      rig.dev->PrefetchRelease(h);
      rig.dev->ReleaseRead(*r);
    }
    CHECK(bad == 0);
  }
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staged_bytes == 0);
  CHECK(s.staging_misses == 0);
  CHECK(s.device.outstanding_reads == 0);
  CHECK(s.refill_bytes > 2 * o.staging_bytes);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  CHECK(rig.tier->ExtentsNowForTest().size() == objs.size() / 2);
}

TEST_CASE("Concurrent writers, prefetchers and missing readers agree") {
  HybridDeviceOptions o = SmallOptions();
  o.write_buffer_bytes = 64 * kKiB;
  o.staging_bytes = 64 * kKiB;
  o.max_bounce_bytes = 32 * kKiB;
  o.flush_max_delay = absl::Milliseconds(5);
  Rig rig(o);
  rig.io->SetLatencyForTest(absl::Microseconds(20));
  constexpr uint64_t kObj = 12 * kKiB;
  constexpr int kObjs = 24;
  // Region 1: prefetched; region 2: read directly. Both prefilled.
  rig.FillDisk(2048 * kKiB, kObjs * 16 * kKiB, 70);
  rig.FillDisk(4096 * kKiB, kObjs * 16 * kKiB, 71);
  std::atomic<int> bad{0};
  std::atomic<int> refused{0};

  // Each writer owns its addresses, so no write overlaps another access.
  auto writer = [&](uint64_t base, uint64_t seed0) {
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kObjs; ++i) {
        const uint64_t addr = base + i * 16 * kKiB;
        const uint64_t seed = seed0 + round;
        auto w = rig.dev->BeginWrite(0, addr, kObj, round * 100 + i + 1);
        if (!w.ok()) {
          ++refused;
          if (w.status().code() != absl::StatusCode::kResourceExhausted) ++bad;
          absl::SleepFor(absl::Microseconds(200));
          --i;
          continue;
        }
        std::vector<uint8_t> v = Pattern(addr, kObj, seed);
        std::memcpy(w->data, v.data(), kObj);
        if (!rig.dev->CommitWrite(*w).ok()) ++bad;
        auto r = rig.dev->AcquireRead(0, addr, kObj);
        if (!r.ok()) {
          if (r.status().code() != absl::StatusCode::kResourceExhausted) ++bad;
          continue;
        }
        if (!Matches(r->data, addr, kObj, seed)) ++bad;
        rig.dev->ReleaseRead(*r);
      }
    }
  };
  auto prefetcher = [&] {
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kObjs; i += 2) {
        const uint64_t a0 = 2048 * kKiB + i * 16 * kKiB;
        auto h0 = rig.dev->PrefetchObject(0, a0, kObj);
        auto h1 = rig.dev->PrefetchObject(0, a0 + 16 * kKiB, kObj);
        if (!h0.ok() || !h1.ok()) {
          ++bad;
          return;
        }
        for (auto* h : {&*h0, &*h1}) {
          auto p = rig.dev->PrefetchWait(*h, Soon());
          if (!p.ok() || !Matches(*p, h->addr, kObj, 70)) ++bad;
          rig.dev->PrefetchRelease(*h);
        }
      }
    }
  };
  auto reader = [&] {
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kObjs; ++i) {
        const uint64_t addr = 4096 * kKiB + i * 16 * kKiB;
        auto r = rig.dev->AcquireRead(0, addr, kObj);
        if (!r.ok()) {
          if (r.status().code() != absl::StatusCode::kResourceExhausted) ++bad;
          continue;
        }
        if (!Matches(r->data, addr, kObj, 71)) ++bad;
        rig.dev->ReleaseRead(*r);
      }
    }
  };
  {
    Thread w1("test-w1", [&] { writer(0, 80); });
    Thread w2("test-w2", [&] { writer(1024 * kKiB, 90); });
    Thread p("test-p", prefetcher);
    Thread r("test-r", reader);
  }
  CHECK(bad.load() == 0);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  for (int i = 0; i < kObjs; ++i) {
    CHECK(rig.ReadMatches(i * 16 * kKiB, kObj, 82));
    CHECK(rig.ReadMatches(1024 * kKiB + i * 16 * kKiB, kObj, 92));
  }
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.staged_bytes == 0);
  CHECK(s.bounce_bytes == 0);
  CHECK(s.buffered_bytes == 0);
  CHECK(s.device.outstanding_reads == 0);
  CHECK(s.device.outstanding_writes == 0);
  CHECK(s.unknown_releases == 0);
  CHECK(rig.tier->ExtentsNowForTest().size() == 2 * kObjs);
}

// ------------------------------------------------------ checksums, I/O errors

TEST_CASE("Flushed objects carry the CRC32C of their bytes in their records") {
  Rig rig;
  rig.Put(0, 5000, 1, 101);  // not a whole page: the padding is not summed
  rig.Put(64 * kKiB, 16 * kKiB, 2, 102);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 2);
  for (const DurableExtent& e : ext) {
    INFO("object at " << e.addr);
    CHECK(e.checksummed);
    std::vector<uint8_t> want = Pattern(e.addr, e.length, 100 + e.tag);
    CHECK(e.crc32c == crc32c::Value(want.data(), want.size()));
  }
  CHECK(rig.dev->HybridStats().commit_checksum_seconds > 0);
}

TEST_CASE("A read I/O error fails only that object, wakes its waiters, and heals") {
  Rig rig(SmallOptions(), /*faults=*/true);
  const uint64_t a = 0, b = 64 * kKiB, len = 32 * kKiB;
  rig.FillDisk(a, len, 111);
  rig.FillDisk(b, len, 112);
  // A bad sector inside A.
  rig.faulty->FailReadsForTest(kHdr + a + 16 * kKiB, 4 * kKiB);

  // Three prefetchers of A share one staged copy and wait for it; the
  // refill fails while they wait.
  rig.io->PauseForTest();
  std::vector<PrefetchHandle> ha;
  for (int i = 0; i < 3; ++i) ha.push_back(Prefetch(rig.dev.get(), a, len));
  PrefetchHandle hb = Prefetch(rig.dev.get(), b, len);
  std::atomic<int> unavailable{0};
  {
    std::vector<std::unique_ptr<Thread>> waiters;
    for (int i = 0; i < 3; ++i) {
      waiters.push_back(std::make_unique<Thread>("test-wait", [&, i] {
        auto p = rig.dev->PrefetchWait(ha[i], Soon());
        if (p.status().code() == absl::StatusCode::kUnavailable) ++unavailable;
      }));
    }
    REQUIRE(WaitUntil([&] { return rig.dev->HybridStats().prefetch_waiters == 3; }));
    rig.io->ResumeForTest();
  }
  CHECK(unavailable.load() == 3);
  auto pb = rig.dev->PrefetchWait(hb, Soon());
  REQUIRE(pb.ok());
  CHECK(Matches(*pb, b, len, 112));
  for (const PrefetchHandle& h : ha) rig.dev->PrefetchRelease(h);
  rig.dev->PrefetchRelease(hb);

  // A staging miss of A fails too; B is served.
  auto ra = rig.dev->AcquireRead(0, a, len);
  CHECK(ra.status().code() == absl::StatusCode::kUnavailable);
  CHECK(rig.ReadMatches(b, len, 112));
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.prefetch_errors == 1);
  CHECK(s.read_io_errors == 2);
  CHECK(s.staged_bytes == 0);
  CHECK(s.bounce_bytes == 0);
  CHECK(s.checksum_failures == 0);
  CHECK(rig.faulty->FailedReadsForTest() == 2);

  // Not remembered: once the disk reads again, so does A.
  rig.faulty->ClearFaultsForTest();
  CHECK(rig.ReadMatches(a, len, 111));
  PrefetchHandle again = Prefetch(rig.dev.get(), a, len);
  auto p = rig.dev->PrefetchWait(again, Soon());
  REQUIRE(p.ok());
  CHECK(Matches(*p, a, len, 111));
  rig.dev->PrefetchRelease(again);
}

TEST_CASE("With verify_reads, an I/O error is still Unavailable, not corruption") {
  HybridDeviceOptions o = SmallOptions();
  o.verify_reads = true;
  Rig rig(o, /*faults=*/true);
  rig.Put(0, 20 * kKiB, 1, 121);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  rig.faulty->FailReadsForTest(kHdr, 4 * kKiB);
  CHECK(rig.dev->AcquireRead(0, 0, 20 * kKiB).status().code() ==
        absl::StatusCode::kUnavailable);
  PrefetchHandle h = Prefetch(rig.dev.get(), 0, 20 * kKiB);
  CHECK(rig.dev->PrefetchWait(h, Soon()).status().code() ==
        absl::StatusCode::kUnavailable);
  rig.dev->PrefetchRelease(h);
  rig.faulty->ClearFaultsForTest();
  CHECK(rig.ReadMatches(0, 20 * kKiB, 121));
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.checksum_failures == 0);
  CHECK(s.corrupt_refusals == 0);
  CHECK(s.verified_reads == 1);
}

TEST_CASE("Reads under failing I/O return the right bytes or an error, never a hang") {
  HybridDeviceOptions o = SmallOptions();
  o.verify_reads = true;
  o.staging_bytes = 64 * kKiB;
  o.max_bounce_bytes = 32 * kKiB;
  Rig rig(o, /*faults=*/true);
  constexpr uint64_t kObj = 12 * kKiB;
  constexpr int kObjs = 16;
  for (int i = 0; i < kObjs; ++i) {
    rig.Put(i * 16 * kKiB, kObj, i + 1, 130 + i);
    if (i % 8 == 7) REQUIRE(rig.dev->WaitFlushedForTest(Soon()));  // 128 KiB buffer
  }
  rig.io->SetLatencyForTest(absl::Microseconds(20));
  rig.faulty->FailEveryNthReadForTest(3);
  std::atomic<int> bad{0}, served{0}, failed{0};
  auto check = [&](absl::Status st) {
    if (st.code() == absl::StatusCode::kUnavailable) {
      ++failed;
    } else if (st.code() != absl::StatusCode::kResourceExhausted) {
      ++bad;  // anything else (DataLoss included) is wrong here
    }
  };
  auto prefetcher = [&](int first) {
    for (int round = 0; round < 4; ++round) {
      for (int i = first; i < kObjs; i += 2) {
        const uint64_t addr = i * 16 * kKiB;
        auto h = rig.dev->PrefetchObject(0, addr, kObj);
        if (!h.ok()) {
          check(h.status());
          continue;
        }
        auto p = rig.dev->PrefetchWait(*h, Soon());
        if (p.ok()) {
          if (!Matches(*p, addr, kObj, 130 + i)) ++bad;
          ++served;
        } else {
          check(p.status());
        }
        rig.dev->PrefetchRelease(*h);
      }
    }
  };
  auto reader = [&] {
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < kObjs; ++i) {
        const uint64_t addr = i * 16 * kKiB;
        auto r = rig.dev->AcquireRead(0, addr, kObj);
        if (!r.ok()) {
          check(r.status());
          continue;
        }
        if (!Matches(r->data, addr, kObj, 130 + i)) ++bad;
        ++served;
        rig.dev->ReleaseRead(*r);
      }
    }
  };
  {
    Thread p0("test-p0", [&] { prefetcher(0); });
    Thread p1("test-p1", [&] { prefetcher(1); });
    Thread r("test-r", reader);
  }
  CHECK(bad.load() == 0);
  CHECK(served.load() > 0);
  CHECK(failed.load() > 0);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.read_io_errors > 0);
  CHECK(s.checksum_failures == 0);
  CHECK(s.staged_bytes == 0);
  CHECK(s.bounce_bytes == 0);
  CHECK(s.device.outstanding_reads == 0);
  rig.faulty->ClearFaultsForTest();
  for (int i = 0; i < kObjs; ++i) CHECK(rig.ReadMatches(i * 16 * kKiB, kObj, 130 + i));
}

TEST_CASE("verify_reads: an object corrupted before its record is refused and never recorded") {
  HybridDeviceOptions o = SmallOptions();
  o.verify_reads = true;
  Rig rig(o);
  rig.tier->SetRecordsFailForTest(true);
  rig.Put(0, 16 * kKiB, 5, 140);
  rig.Put(64 * kKiB, 16 * kKiB, 6, 141);
  REQUIRE(WaitUntil([&] {
    HybridDeviceStats s = rig.dev->HybridStats();
    return s.record_pending_objects == 2 && s.buffered_bytes == 0;
  }));
  const uint8_t junk[3] = {1, 2, 3};
  rig.io->FillForTest(kHdr + 100, junk, sizeof(junk));
  CHECK(rig.dev->AcquireRead(0, 0, 16 * kKiB).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(rig.ReadMatches(64 * kKiB, 16 * kKiB, 141));
  rig.tier->SetRecordsFailForTest(false);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(WaitUntil(
      [&] { return rig.dev->HybridStats().corrupt_records_forgotten == 1; }));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].tag == 6);
  for (const DurableExtent& e : rig.tier->RecordedForTest()) CHECK(e.tag != 5);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.read_checksum_failures == 1);
  CHECK(s.checksum_failures == 1);
  CHECK(s.verified_reads == 2);
}

TEST_CASE("Discard forgets a durable object's record and drops a buffered one") {
  Rig rig;
  rig.Put(0, 16 * kKiB, 5, 150);
  rig.Put(64 * kKiB, 16 * kKiB, 6, 151);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(rig.tier->ExtentsNowForTest().size() == 2);

  // Another tag, or another extent at the address: a newer object; its
  // record is kept.
  rig.dev->Discard(0, 0, 16 * kKiB, 4);
  rig.dev->Discard(0, 0, 8 * kKiB, 5);
  // The recorded object with its tag: its record is durably forgotten.
  rig.dev->Discard(0, 64 * kKiB, 16 * kKiB, 6);
  REQUIRE(WaitUntil(
      [&] { return rig.dev->HybridStats().discarded_records_forgotten == 3; }));
  auto ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].tag == 5);

  // A buffered object (its flush held off by a read in flight): dropped
  // from the buffer, never written nor recorded.
  rig.io->PauseForTest();
  PrefetchHandle hold = Prefetch(rig.dev.get(), 512 * kKiB, 16 * kKiB);
  REQUIRE(rig.io->WaitPendingForTest(1, absl::Seconds(10)));
  rig.Put(128 * kKiB, 16 * kKiB, 7, 152);
  rig.dev->Discard(0, 128 * kKiB, 16 * kKiB, 7);
  rig.dev->PrefetchRelease(hold);
  rig.io->ResumeForTest();
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  REQUIRE(WaitUntil(
      [&] { return rig.dev->HybridStats().discarded_records_forgotten == 4; }));
  for (const DurableExtent& e : rig.tier->RecordedForTest()) CHECK(e.tag != 7);
  ext = rig.tier->ExtentsNowForTest();
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].tag == 5);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.discarded_objects == 4);
  CHECK(s.buffered_bytes == 0);
  CHECK(rig.ReadMatches(0, 16 * kKiB, 150));

  // A write committed over a discarded range before its forget runs
  // cancels the forget: the new object stays recorded.
  rig.dev->Discard(0, 0, 16 * kKiB, 5);
  rig.Put(0, 16 * kKiB, 8, 153);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  bool found = false;
  for (const DurableExtent& e : rig.tier->ExtentsNowForTest()) {
    if (e.tag == 8) found = true;
  }
  CHECK(found);
  CHECK(rig.ReadMatches(0, 16 * kKiB, 153));
}

// ---------------------------------------------- over a real capacity file

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// A hybrid device over a real capacity file and extent record (RocksDB).
struct FileRig {
  explicit FileRig(const std::string& name) {
    tier.path = TmpPath(name);
    tier.capacity_bytes = kCap;
    tier.node_name = "node-crc";
    tier.io.queue_depth = 8;
    const std::string probe = tier.path + ".probe";
    int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    tier.io.direct = fd >= 0;
    if (fd >= 0) close(fd);
    unlink(probe.c_str());
  }
  void Open(const HybridDeviceOptions& o) {
    dev.reset();
    auto t = CapacityTier::Open(tier);
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    auto d = HybridDevice::Create(o, std::move(*t));
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    dev = std::move(*d);
  }
  void Put(uint64_t addr, uint64_t len, uint64_t gen, uint64_t seed) {
    auto w = dev->BeginWrite(0, addr, len, gen);
    REQUIRE(w.ok());
    std::vector<uint8_t> v = Pattern(addr, len, seed);
    std::memcpy(w->data, v.data(), len);
    REQUIRE(dev->CommitWrite(*w).ok());
  }
  absl::Status Read(uint64_t addr, uint64_t len, uint64_t seed) {
    auto r = dev->AcquireRead(0, addr, len);
    if (!r.ok()) return r.status();
    const bool ok = Matches(r->data, addr, len, seed);
    dev->ReleaseRead(*r);
    return ok ? absl::OkStatus() : absl::InternalError("wrong bytes");
  }
  // Overwrites file bytes behind the device's back.
  void Scribble(uint64_t addr, uint64_t len, uint8_t byte) {
    int fd = open(tier.path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::vector<uint8_t> v(len, byte);
    REQUIRE(pwrite(fd, v.data(), len, kHdr + addr) == static_cast<ssize_t>(len));
    REQUIRE(fdatasync(fd) == 0);
    close(fd);
  }
  std::vector<uint64_t> RecoveredGens() const {
    std::vector<uint64_t> g;
    for (const RecoveredExtent& e : dev->RecoveredExtents()) g.push_back(e.generation);
    return g;
  }

  CapacityTierOptions tier;
  std::unique_ptr<HybridDevice> dev;
};

TEST_CASE("Reopening a capacity file drops the object with a flipped byte and the torn one") {
  FileRig rig("hyb_reopen");
  rig.Open(SmallOptions());
  rig.Put(0, 20 * kKiB, 1, 151);
  rig.Put(64 * kKiB, 8 * kKiB + 123, 2, 152);   // a byte flipped below
  rig.Put(128 * kKiB, 40 * kKiB, 3, 153);       // torn below
  rig.Put(256 * kKiB, 4 * kKiB, 4, 154);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  rig.dev.reset();

  {
    int fd = open(rig.tier.path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t byte = 0;
    REQUIRE(pread(fd, &byte, 1, kHdr + 64 * kKiB + 5000) == 1);
    byte ^= 0x01;
    REQUIRE(pwrite(fd, &byte, 1, kHdr + 64 * kKiB + 5000) == 1);
    REQUIRE(fdatasync(fd) == 0);
    close(fd);
  }
  // Torn: the record is there, the tail of the bytes never landed.
  rig.Scribble(128 * kKiB + 24 * kKiB, 16 * kKiB, 0);

  rig.Open(SmallOptions());
  CHECK(rig.RecoveredGens() == std::vector<uint64_t>{1, 4});
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.open_verified_objects == 2);
  CHECK(s.open_verified_bytes == 24 * kKiB);
  CHECK(s.open_dropped_objects == 2);
  CHECK(s.checksum_failures == 2);
  CHECK(s.open_unchecked_objects == 0);
  CHECK(rig.Read(0, 20 * kKiB, 151).ok());
  CHECK(rig.Read(256 * kKiB, 4 * kKiB, 154).ok());
  rig.dev.reset();

  // Their records are gone for good: not adopted even unchecked.
  HybridDeviceOptions unchecked = SmallOptions();
  unchecked.verify_on_open = false;
  rig.Open(unchecked);
  CHECK(rig.RecoveredGens() == std::vector<uint64_t>{1, 4});
  CHECK(rig.dev->HybridStats().open_unchecked_objects == 2);
  CHECK(rig.dev->HybridStats().open_verified_objects == 0);
}

TEST_CASE("verify_reads catches bytes changed behind the device's back") {
  HybridDeviceOptions o = SmallOptions();
  o.verify_reads = true;
  FileRig rig("hyb_verify_reads");
  rig.Open(o);
  const uint64_t a = 0, b = 64 * kKiB, c = 128 * kKiB, d = 192 * kKiB;
  rig.Put(a, 20 * kKiB, 1, 161);
  rig.Put(b, 12 * kKiB, 2, 162);
  rig.Put(c, 8 * kKiB, 3, 163);
  rig.Put(d, 16 * kKiB, 4, 164);
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  // D was staged and read fine, then evicted (released).
  {
    auto h = rig.dev->PrefetchObject(0, d, 16 * kKiB);
    REQUIRE(h.ok());
    auto p = rig.dev->PrefetchWait(*h, Soon());
    REQUIRE(p.ok());
    CHECK(Matches(*p, d, 16 * kKiB, 164));
    rig.dev->PrefetchRelease(*h);
  }
  rig.Scribble(a + 8 * kKiB, 4 * kKiB, 0x5A);
  rig.Scribble(b + 4 * kKiB, 4 * kKiB, 0);
  rig.Scribble(d + 12 * kKiB, 4 * kKiB, 0xA5);

  // A staging miss, a refill, and a refill of a once-staged object: each
  // fails with DataLoss, and the object is refused from then on.
  CHECK(rig.Read(a, 20 * kKiB, 161).code() == absl::StatusCode::kDataLoss);
  auto hb = rig.dev->PrefetchObject(0, b, 12 * kKiB);
  REQUIRE(hb.ok());
  CHECK(rig.dev->PrefetchWait(*hb, Soon()).status().code() ==
        absl::StatusCode::kDataLoss);
  rig.dev->PrefetchRelease(*hb);
  auto hd = rig.dev->PrefetchObject(0, d, 16 * kKiB);
  REQUIRE(hd.ok());
  CHECK(rig.dev->PrefetchWait(*hd, Soon()).status().code() ==
        absl::StatusCode::kDataLoss);
  rig.dev->PrefetchRelease(*hd);
  HybridDeviceStats s = rig.dev->HybridStats();
  CHECK(s.read_checksum_failures == 3);
  CHECK(s.checksum_failures == 3);
  CHECK(s.staged_bytes == 0);
  CHECK(s.bounce_bytes == 0);

  CHECK(rig.Read(a, 20 * kKiB, 161).code() == absl::StatusCode::kDataLoss);
  CHECK(rig.dev->PrefetchObject(0, b, 12 * kKiB).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(rig.dev->HybridStats().corrupt_refusals == 2);
  CHECK(rig.dev->HybridStats().read_checksum_failures == 3);
  // The others are served.
  CHECK(rig.Read(c, 8 * kKiB, 163).ok());

  // A new object over A is readable, from the buffer and from the tier.
  rig.Put(a, 20 * kKiB, 10, 165);
  CHECK(rig.Read(a, 20 * kKiB, 165).ok());
  REQUIRE(rig.dev->WaitFlushedForTest(Soon()));
  CHECK(rig.Read(a, 20 * kKiB, 165).ok());
  REQUIRE(WaitUntil(
      [&] { return rig.dev->HybridStats().corrupt_records_forgotten >= 2; }));

  // The corrupt objects' records were forgotten: a restart without any
  // verification adopts only the good ones.
  rig.dev.reset();
  HybridDeviceOptions plain = SmallOptions();
  plain.verify_on_open = false;
  rig.Open(plain);
  CHECK(rig.RecoveredGens() == std::vector<uint64_t>{10, 3});
  CHECK(rig.Read(a, 20 * kKiB, 165).ok());
}

}  // namespace
}  // namespace hymcache::storage
