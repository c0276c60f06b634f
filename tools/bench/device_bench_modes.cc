#include "tools/bench/device_bench.h"

namespace hymcache::device_bench {

namespace {

// ------------------------------------------------------------ devices

// The device under test plus how the harness reads from it.
class Target {
 public:
  virtual ~Target() = default;
  virtual MemoryDevice* device() = 0;
  // Reads the conversation's first `n` blocks starting at `base` in order,
  // copying each into `dst`. Accumulates hits/lookups and errors.
  virtual void ReadPrefix(uint64_t base, uint64_t n, uint8_t* dst,
                          uint64_t* hits, uint64_t* lookups, uint64_t* bad,
                          uint64_t* errors) = 0;
  // Device-level hit counters for the per-turn ratio (LRU) or 0/0 when the
  // harness counts itself (staging).
  virtual void DeviceHits(uint64_t* hits, uint64_t* lookups) const {
    *hits = 0;
    *lookups = 0;
  }
  // Touches all of the device's DRAM once by reading `n` blocks from `base`
  // (the not-yet-written writer area), untimed: the first touch of a
  // freshly mapped window (huge-page faults, compaction) is a start-up cost
  // of a long-running device, not part of its steady state.
  virtual absl::Status WarmUp(uint64_t base, uint64_t n) = 0;
  // Stages `n` blocks from `base` and holds them until ReleaseHeld (what
  // think-time hints nobody claims do to a staging window).
  virtual absl::Status Hold(uint64_t base, uint64_t n) {
    return absl::UnimplementedError("this device stages nothing to hold");
  }
  virtual void ReleaseHeld() {}
  // Makes everything written so far durable in the tier.
  virtual absl::Status Drain() = 0;
  virtual std::string Describe() const = 0;
  // Refill GB/s and average read queue depth; 0 when not a staging device.
  virtual void DeviceIo(double* refill_gbps, double* read_qd) const {
    *refill_gbps = 0;
    *read_qd = 0;
  }
};

class StagingTarget : public Target {
 public:
  StagingTarget(std::unique_ptr<HybridDevice> dev, const Config& cfg)
      : dev_(std::move(dev)), cfg_(cfg) {}
  MemoryDevice* device() override { return dev_.get(); }

  void ReadPrefix(uint64_t base, uint64_t n, uint8_t* dst, uint64_t* hits,
                  uint64_t* lookups, uint64_t* bad, uint64_t* errors) override {
    std::deque<storage::PrefetchHandle> pipe;
    uint64_t next = 0;
    for (uint64_t i = 0; i < n; ++i) {
      while (next < n &&
             pipe.size() < static_cast<size_t>(cfg_.prefetch_depth)) {
        auto h = dev_->PrefetchObject(0, base + next * cfg_.block, cfg_.block);
        if (!h.ok()) {
          if (pipe.empty()) {
            ++*errors;
            ++next;
            continue;
          }
          break;  // window full: wait for the head first
        }
        pipe.push_back(*h);
        ++next;
      }
      if (pipe.empty()) continue;
      const storage::PrefetchHandle h = pipe.front();
      pipe.pop_front();
      ++*lookups;
      // Already staged? (A deadline in the past only looks.)
      auto p = dev_->PrefetchWait(h, absl::InfinitePast());
      if (p.ok()) {
        ++*hits;
      } else if (p.status().code() == absl::StatusCode::kDeadlineExceeded) {
        p = dev_->PrefetchWait(h, absl::InfiniteFuture());
      }
      if (!p.ok()) {
        ++*errors;
      } else if (!Consume(*p, dst, cfg_.block, h.addr)) {
        ++*bad;
      }
      dev_->PrefetchRelease(h);
    }
  }

  absl::Status WarmUp(uint64_t base, uint64_t n) override {
    // All at once, so that the whole window is in use.
    std::vector<storage::PrefetchHandle> hs;
    absl::Status status;
    for (uint64_t i = 0; i < n; ++i) {
      auto h = dev_->PrefetchObject(0, base + i * cfg_.block, cfg_.block);
      if (!h.ok()) {
        status = h.status();
        break;
      }
      hs.push_back(*h);
    }
    for (const auto& h : hs) {
      auto p = dev_->PrefetchWait(h, absl::InfiniteFuture());
      if (!p.ok() && status.ok()) status = p.status();
    }
    for (const auto& h : hs) dev_->PrefetchRelease(h);
    return status;
  }

  absl::Status Hold(uint64_t base, uint64_t n) override {
    for (uint64_t i = 0; i < n; ++i) {
      auto h = dev_->PrefetchObject(0, base + i * cfg_.block, cfg_.block);
      if (!h.ok()) return h.status();
      held_.push_back(*h);
    }
    for (const auto& h : held_) {
      auto p = dev_->PrefetchWait(h, absl::InfiniteFuture());
      if (!p.ok()) return p.status();
    }
    return absl::OkStatus();
  }
  void ReleaseHeld() override {
    for (const auto& h : held_) dev_->PrefetchRelease(h);
    held_.clear();
  }

  absl::Status Drain() override {
    if (!dev_->WaitFlushedForTest(absl::Now() + absl::Minutes(5),
                                  /*force=*/true)) {
      return absl::DeadlineExceededError("hybrid device did not drain");
    }
    return absl::OkStatus();
  }

  void DeviceIo(double* refill_gbps, double* read_qd) const override {
    storage::HybridDeviceStats s = dev_->HybridStats();
    *refill_gbps = s.refill_bandwidth_bytes_per_s / 1e9;
    *read_qd = s.read_queue_depth_avg;
  }
  std::string Describe() const override {
    storage::HybridDeviceStats s = dev_->HybridStats();
    return absl::StrFormat(
        "window_pages=%s prefetches=%u shared=%u from_buffer=%u "
        "staging_misses=%u refill=%.2fGB@%.2fGB/s read_qd=%.1f "
        "flushed=%.2fGB flush_batches=%u "
        "recorded=%u in %u Records (%u failed) write_refusals=%u",
        s.staging_pages, s.device.prefetches, s.prefetch_shared,
        s.prefetch_from_buffer, s.staging_misses, s.refill_bytes / 1e9,
        s.refill_bandwidth_bytes_per_s / 1e9, s.read_queue_depth_avg,
        s.flushed_bytes / 1e9, s.flush_batches, s.recorded_objects,
        s.record_batches, s.record_errors, s.write_buffer_refusals);
  }

 private:
  std::unique_ptr<HybridDevice> dev_;
  const Config cfg_;
  std::vector<storage::PrefetchHandle> held_;
};

class LruTarget : public Target {
 public:
  LruTarget(std::unique_ptr<BlockIo> io, std::unique_ptr<LruCacheDevice> dev,
            const Config& cfg)
      : io_(std::move(io)), dev_(std::move(dev)), cfg_(cfg) {}
  ~LruTarget() override { dev_.reset(); }  // before its BlockIo
  MemoryDevice* device() override { return dev_.get(); }

  void ReadPrefix(uint64_t base, uint64_t n, uint8_t* dst, uint64_t*, uint64_t*,
                  uint64_t* bad, uint64_t* errors) override {
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t addr = base + i * cfg_.block;
      auto r = dev_->AcquireRead(0, addr, cfg_.block);
      if (!r.ok()) {
        ++*errors;
        continue;
      }
      const bool ok = Consume(r->data, dst, cfg_.block, addr);
      dev_->ReleaseRead(*r);
      if (!ok) ++*bad;
    }
  }
  void DeviceHits(uint64_t* hits, uint64_t* lookups) const override {
    storage::LruCacheStats s = dev_->CacheStats();
    *hits = s.hits;
    *lookups = s.hits + s.misses;
  }
  absl::Status WarmUp(uint64_t base, uint64_t n) override {
    for (uint64_t i = 0; i < n; ++i) {
      auto r = dev_->AcquireRead(0, base + i * cfg_.block, cfg_.block);
      if (!r.ok()) return r.status();
      dev_->ReleaseRead(*r);
    }
    return absl::OkStatus();
  }
  absl::Status Drain() override { return dev_->Flush(); }
  std::string Describe() const override {
    storage::LruCacheStats s = dev_->CacheStats();
    return absl::StrFormat(
        "lines=%u hits=%u misses=%u evictions=%u dirty_writebacks=%u "
        "tier_read=%.2fGB tier_write=%.2fGB",
        dev_->num_lines(), s.hits, s.misses, s.evictions, s.dirty_writebacks,
        s.tier_read_bytes / 1e9, s.tier_write_bytes / 1e9);
  }

 private:
  std::unique_ptr<BlockIo> io_;
  std::unique_ptr<LruCacheDevice> dev_;
  const Config cfg_;
};

absl::StatusOr<std::unique_ptr<Target>> MakeStaging(const Config& cfg,
                                                    const std::string& path) {
  CapacityTierOptions t;
  t.path = path;
  t.capacity_bytes = cfg.capacity;
  t.node_name = "device-bench";
  t.io = IoOptions(cfg, path, 0);
  auto tier = CapacityTier::Open(t);
  if (!tier.ok()) return Fail("open capacity tier " + path, tier.status());
  HybridDeviceOptions o;
  o.staging_bytes = cfg.window;
  o.write_buffer_bytes = cfg.write_buffer;
  o.io_chunk_bytes = std::min<uint64_t>(cfg.block, kMiB);
  o.io_queue_depth = cfg.queue_depth;
  auto dev = HybridDevice::Create(o, std::move(*tier));
  if (!dev.ok()) return Fail("create hybrid device", dev.status());
  return std::unique_ptr<Target>(new StagingTarget(std::move(*dev), cfg));
}

absl::StatusOr<std::unique_ptr<Target>> MakeLru(const Config& cfg,
                                                const std::string& path,
                                                uint64_t line_bytes) {
  // Same file layout as the capacity tier: data area after its header.
  auto io = BlockIo::Open(
      IoOptions(cfg, path, CapacityTier::kHeaderBytes + cfg.capacity));
  if (!io.ok()) return Fail("open " + path, io.status());
  LruCacheDeviceOptions o;
  o.capacity_bytes = cfg.capacity;
  o.data_offset = CapacityTier::kHeaderBytes;
  o.cache_bytes = cfg.window + cfg.write_buffer;
  o.line_bytes = line_bytes;
  o.max_concurrent_fills = cfg.queue_depth;
  auto dev = LruCacheDevice::Create(o, io->get());
  if (!dev.ok()) return Fail("create lru device", dev.status());
  return std::unique_ptr<Target>(
      new LruTarget(std::move(*io), std::move(*dev), cfg));
}

// Writes one block through the device's write path; retries while the
// device refuses (counted in *refusals). Returns the commit status.
absl::Status WriteBlock(MemoryDevice* dev, uint64_t addr, uint64_t len,
                        uint64_t tag, uint64_t* refusals) {
  for (;;) {
    auto w = dev->BeginWrite(0, addr, len, tag);
    if (w.ok()) {
      FillBlock(w->data, len, addr);
      return dev->CommitWrite(*w);
    }
    if (w.status().code() != absl::StatusCode::kResourceExhausted) {
      return w.status();
    }
    ++*refusals;
    absl::SleepFor(absl::Microseconds(200));
  }
}

// The concurrent writer: one block every block/rate seconds into the writer
// area while active (the turns' read phases), refused writes skipped and
// counted. Starts paused.
class Writer {
 public:
  Writer(MemoryDevice* dev, const Config& cfg, double bytes_per_s)
      : dev_(dev),
        cfg_(cfg),
        interval_(absl::Seconds(cfg.block / bytes_per_s)) {
    thread_ = Thread("bench-writer", [this] { Loop(); });
  }
  ~Writer() { Stop(); }
  void Stop() {
    Pause();
    {
      MutexLock l(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    thread_.Join();
  }
  void Resume() {
    MutexLock l(&mu_);
    if (active_) return;
    active_ = true;
    active_since_ = absl::Now();
    cv_.SignalAll();
  }
  // A write already started finishes (and counts).
  void Pause() {
    MutexLock l(&mu_);
    if (!active_) return;
    active_ = false;
    active_time_ += absl::Now() - active_since_;
  }
  uint64_t writes() {
    MutexLock l(&mu_);
    return writes_;
  }
  uint64_t refused() {
    MutexLock l(&mu_);
    return refused_;
  }
  // Over the time it was active.
  double achieved_mbps() {
    MutexLock l(&mu_);
    const double secs = absl::ToDoubleSeconds(active_time_);
    return secs > 0 ? writes_ * static_cast<double>(cfg_.block) / secs / 1e6
                    : 0;
  }
  double active_seconds() {
    MutexLock l(&mu_);
    return absl::ToDoubleSeconds(active_time_);
  }

 private:
  void Loop() {
    const uint64_t area = cfg_.blocks_per_conv * cfg_.conversations;
    absl::Time next = absl::InfinitePast();
    for (uint64_t k = 0;; ++k) {
      {
        MutexLock l(&mu_);
        while (!stop_ && (!active_ || absl::Now() < next)) {
          if (active_) {
            cv_.WaitWithDeadline(&mu_, next);
          } else {
            cv_.Wait(&mu_);
            next = absl::Now();  // a read phase starts the schedule afresh
          }
        }
        if (stop_) return;
      }
      next += interval_;
      const uint64_t addr = (area + k % cfg_.writer_blocks) * cfg_.block;
      auto w = dev_->BeginWrite(0, addr, cfg_.block, k + 1);
      if (!w.ok()) {
        MutexLock l(&mu_);
        if (w.status().code() == absl::StatusCode::kResourceExhausted) {
          ++refused_;
        } else {
          ++errors_;
        }
        continue;
      }
      FillBlock(w->data, cfg_.block, addr);
      absl::Status s = dev_->CommitWrite(*w);
      MutexLock l(&mu_);
      if (s.ok()) {
        ++writes_;
      } else {
        ++errors_;
      }
      // A writer that fell behind does not burst to catch up.
      next = std::max(next, absl::Now() - interval_);
    }
  }

  MemoryDevice* const dev_;
  const Config cfg_;
  const absl::Duration interval_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time active_since_ ABSL_GUARDED_BY(mu_);
  absl::Duration active_time_ ABSL_GUARDED_BY(mu_);
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  Thread thread_;
};

}  // namespace

absl::StatusOr<ModeResult> RunMode(const Config& cfg, const std::string& name,
                                   bool lru, uint64_t lru_line,
                                   double writer_bytes_per_s) {
  const std::string path = cfg.prefix + "." + name;
  RemoveFiles(path);
  auto target_or = lru ? MakeLru(cfg, path, lru_line) : MakeStaging(cfg, path);
  if (!target_or.ok()) return target_or.status();
  std::unique_ptr<Target> target = std::move(*target_or);
  MemoryDevice* dev = target->device();
  ModeResult res;
  res.name = name;

  // Populate the whole footprint through the write path, make it durable.
  const absl::Time p0 = absl::Now();
  uint64_t refusals = 0;
  for (uint64_t b = 0; b < cfg.blocks_per_conv * cfg.conversations; ++b) {
    absl::Status s = WriteBlock(dev, b * cfg.block, cfg.block, 1, &refusals);
    if (!s.ok()) return Fail(name + ": populate", s);
  }
  absl::Status s = target->Drain();
  if (!s.ok()) return Fail(name + ": drain", s);
  const double populate_secs = absl::ToDoubleSeconds(absl::Now() - p0);
  const absl::Time w0 = absl::Now();
  const uint64_t dram_blocks = lru ? (cfg.window + cfg.write_buffer) / cfg.block
                                   : cfg.window / cfg.block;
  s = target->WarmUp(cfg.blocks_per_conv * cfg.conversations * cfg.block,
                     std::min(dram_blocks, cfg.writer_blocks));
  if (!s.ok()) return Fail(name + ": warm-up", s);
  const double warm_secs = absl::ToDoubleSeconds(absl::Now() - w0);
  // Staging modes only: the LRU cache stages nothing ahead to hold.
  const uint64_t hold_blocks =
      lru ? 0 : std::min(FLAGS_hold_mib * kMiB / cfg.block, cfg.writer_blocks);
  if (hold_blocks > 0) {
    s = target->Hold(cfg.blocks_per_conv * cfg.conversations * cfg.block,
                     hold_blocks);
    if (!s.ok()) return Fail(name + ": hold", s);
  }
  DropPageCache(path);
  absl::SleepFor(absl::Milliseconds(FLAGS_settle_ms));
  std::fprintf(stderr,
               "[%s] populated %.2f GB in %.1f s; warm-up (touch the DRAM "
               "once) %.2f s\n",
               name.c_str(),
               cfg.blocks_per_conv * cfg.conversations * cfg.block / 1e9,
               populate_secs, warm_secs);

  std::unique_ptr<Writer> writer;
  if (writer_bytes_per_s > 0) {
    writer = std::make_unique<Writer>(dev, cfg, writer_bytes_per_s);
    res.writer = true;
  }

  const int c = cfg.conversations;
  Barrier barrier(c + 1);
  struct PerConv {
    uint64_t hits = 0, lookups = 0, bad = 0, errors = 0, refusals = 0;
  };
  std::vector<PerConv> per(c);
  std::vector<std::vector<absl::Time>> read_end(cfg.turns,
                                                std::vector<absl::Time>(c));
  std::atomic<bool> failed{false};
  {
    std::vector<Thread> threads;
    for (int i = 0; i < c; ++i) {
      threads.emplace_back("bench-conv", [&, i] {
        AlignedBuffer dst = storage::AllocateAligned(cfg.block);
        const uint64_t base = i * cfg.blocks_per_conv * cfg.block;
        for (int t = 1; t <= cfg.turns; ++t) {
          barrier.Wait();  // turn start
          target->ReadPrefix(base, t * cfg.append_blocks, dst.get(),
                             &per[i].hits, &per[i].lookups, &per[i].bad,
                             &per[i].errors);
          read_end[t - 1][i] = absl::Now();
          barrier.Wait();  // reads done
          if (t < cfg.turns) {
            // Append the next blocks of the conversation (new KV).
            for (uint64_t b = t * cfg.append_blocks;
                 b < (t + 1) * cfg.append_blocks; ++b) {
              absl::Status ws = WriteBlock(dev, base + b * cfg.block, cfg.block,
                                           t + 1, &per[i].refusals);
              if (!ws.ok()) failed = true;
            }
          }
          barrier.Wait();  // appends done
        }
      });
    }
    double total_secs = 0;
    uint64_t total_bytes = 0, total_hits = 0, total_lookups = 0;
    for (int t = 1; t <= cfg.turns; ++t) {
      uint64_t h0 = 0, l0 = 0, dh0 = 0, dl0 = 0;
      for (const PerConv& p : per) {
        h0 += p.hits;
        l0 += p.lookups;
      }
      target->DeviceHits(&dh0, &dl0);
      const absl::Time t0 = absl::Now();
      if (writer) writer->Resume();  // writes only while the turn reads
      barrier.Wait();
      barrier.Wait();
      if (writer) writer->Pause();
      absl::Time t1 = t0;
      for (absl::Time e : read_end[t - 1]) t1 = std::max(t1, e);
      const absl::Time a0 = absl::Now();
      barrier.Wait();
      if (FLAGS_drain_appends && t < cfg.turns) {
        absl::Status ds = target->Drain();
        if (!ds.ok()) failed = true;
      }
      TurnResult tr;
      tr.turn = t;
      tr.prefix_bytes = t * cfg.append_blocks * cfg.block * c;
      const double secs = absl::ToDoubleSeconds(t1 - t0);
      tr.read_gbps = tr.prefix_bytes / secs / 1e9;
      tr.append_seconds = absl::ToDoubleSeconds(absl::Now() - a0);
      uint64_t h1 = 0, l1 = 0, dh1 = 0, dl1 = 0;
      for (const PerConv& p : per) {
        h1 += p.hits;
        l1 += p.lookups;
      }
      target->DeviceHits(&dh1, &dl1);
      uint64_t hits = (h1 - h0) + (dh1 - dh0);
      uint64_t lookups = (l1 - l0) + (dl1 - dl0);
      tr.hit_ratio = lookups ? static_cast<double>(hits) / lookups : 0;
      total_secs += secs;
      total_bytes += tr.prefix_bytes;
      total_hits += hits;
      total_lookups += lookups;
      std::fprintf(stderr,
                   "[%s] turn %d: read %.2f GB (%.1fx window) at %.2f GB/s, "
                   "hit ratio %.3f, appends%s %.2f s\n",
                   name.c_str(), t, tr.prefix_bytes / 1e9,
                   static_cast<double>(tr.prefix_bytes) / cfg.window,
                   tr.read_gbps, tr.hit_ratio,
                   FLAGS_drain_appends ? " and drain" : "", tr.append_seconds);
      res.turns.push_back(tr);
    }
    res.read_gbps = total_bytes / total_secs / 1e9;
    res.hit_ratio =
        total_lookups ? static_cast<double>(total_hits) / total_lookups : 0;
  }
  if (writer) {
    writer->Stop();
    res.writer_writes = writer->writes();
    res.writer_refused = writer->refused();
    res.writer_mbps = writer->achieved_mbps();
    res.writer_seconds = writer->active_seconds();
  }
  for (const PerConv& p : per) {
    res.bad_blocks += p.bad;
    res.read_errors += p.errors;
    res.append_refusals += p.refusals;
  }
  if (failed) return absl::InternalError(name + ": an append failed");
  target->ReleaseHeld();
  res.notes = target->Describe();
  target->DeviceIo(&res.refill_gbps, &res.read_qd);
  std::fprintf(stderr, "[%s] %s\n", name.c_str(), res.notes.c_str());
  writer.reset();
  target.reset();
  if (!FLAGS_keep_files) RemoveFiles(path);
  return res;
}

}  // namespace hymcache::device_bench
