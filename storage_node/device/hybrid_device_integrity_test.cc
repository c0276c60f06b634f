// HybridDevice under load and faults: a footprint many times the window,
// concurrent writers and readers, object checksums, read I/O errors,
// verify_reads, Discard, and real capacity files reopened.
#include "storage_node/device/hybrid_device.h"

#include "storage_node/device/hybrid_device_test_util.h"

namespace hymcache::storage::hybrid_test {
namespace {

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
      // A full write buffer refuses until the flusher has made room.
      decltype(rig.dev->BeginWrite(0, 0, 0, 0)) w;
      REQUIRE(WaitUntil([&] {
        w = rig.dev->BeginWrite(0, objs[i].addr, objs[i].len, i);
        REQUIRE((w.ok() ||
                 w.status().code() == absl::StatusCode::kResourceExhausted));
        return w.ok();
      }));
      std::vector<uint8_t> v = Pattern(objs[i].addr, objs[i].len, 50);
      std::memcpy(w->data, v.data(), v.size());
      REQUIRE(rig.dev->CommitWrite(*w).ok());
    }
  }
  // Keep up to 4 prefetches ahead of the reader.
  for (int pass = 0; pass < 2; ++pass) {
    std::deque<std::pair<Obj, PrefetchHandle>> ahead;
    size_t next = 0;
    size_t bad = 0;
    while (next < objs.size() || !ahead.empty()) {
      while (next < objs.size() && ahead.size() < 4) {
        ahead.emplace_back(objs[next], Prefetch(rig.dev.get(), objs[next].addr,
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

TEST_CASE(
    "A read I/O error fails only that object, wakes its waiters, and heals") {
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
    REQUIRE(WaitUntil(
        [&] { return rig.dev->HybridStats().prefetch_waiters == 3; }));
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

TEST_CASE(
    "With verify_reads, an I/O error is still Unavailable, not corruption") {
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

TEST_CASE(
    "Reads under failing I/O return the right bytes or an error, never a "
    "hang") {
  HybridDeviceOptions o = SmallOptions();
  o.verify_reads = true;
  o.staging_bytes = 64 * kKiB;
  o.max_bounce_bytes = 32 * kKiB;
  Rig rig(o, /*faults=*/true);
  constexpr uint64_t kObj = 12 * kKiB;
  constexpr int kObjs = 16;
  for (int i = 0; i < kObjs; ++i) {
    rig.Put(i * 16 * kKiB, kObj, i + 1, 130 + i);
    if (i % 8 == 7)
      REQUIRE(rig.dev->WaitFlushedForTest(Soon()));  // 128 KiB buffer
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
  for (int i = 0; i < kObjs; ++i)
    CHECK(rig.ReadMatches(i * 16 * kKiB, kObj, 130 + i));
}

TEST_CASE(
    "verify_reads: an object corrupted before its record is refused and never "
    "recorded") {
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

TEST_CASE(
    "Discard forgets a durable object's record and drops a buffered one") {
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
    REQUIRE(pwrite(fd, v.data(), len, kHdr + addr) ==
            static_cast<ssize_t>(len));
    REQUIRE(fdatasync(fd) == 0);
    close(fd);
  }
  std::vector<uint64_t> RecoveredGens() const {
    std::vector<uint64_t> g;
    for (const RecoveredExtent& e : dev->RecoveredExtents())
      g.push_back(e.generation);
    return g;
  }

  CapacityTierOptions tier;
  std::unique_ptr<HybridDevice> dev;
};

TEST_CASE(
    "Reopening a capacity file drops the object with a flipped byte and the "
    "torn one") {
  FileRig rig("hyb_reopen");
  rig.Open(SmallOptions());
  rig.Put(0, 20 * kKiB, 1, 151);
  rig.Put(64 * kKiB, 8 * kKiB + 123, 2, 152);  // a byte flipped below
  rig.Put(128 * kKiB, 40 * kKiB, 3, 153);      // torn below
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
}  // namespace hymcache::storage::hybrid_test
