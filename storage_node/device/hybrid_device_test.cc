// HybridDevice: the staging window (prefetch, wait, read, release) and the
// write buffer (admission, flushes, records, restarts).
#include "storage_node/device/hybrid_device.h"

#include "storage_node/device/hybrid_device_test_util.h"

namespace hymcache::storage::hybrid_test {
namespace {

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

}  // namespace
}  // namespace hymcache::storage::hybrid_test
