#include "tools/bench/device_bench.h"

namespace hymcache::device_bench {

// ------------------------------------------------------------ raw

// With `writer_bytes_per_s` > 0, a "raw-writer" thread writes blocks at
// that rate into an area past the span while the passes read: what the
// device's own write work costs its reads (on a device whose work runs on
// the host's cores, such as zram, writes take CPU from reads; on an NVMe
// drive they share only its bandwidth).
absl::StatusOr<RawResult> RunRaw(const Config& cfg, double span_gib,
                                 uint64_t streams, double writer_bytes_per_s) {
  const std::string path = cfg.prefix + ".raw";
  RemoveFiles(path);
  const uint64_t span =
      static_cast<uint64_t>(span_gib * (1 << 30)) / cfg.block * cfg.block;
  constexpr uint64_t kWriterAreaBlocks = 64;
  const uint64_t writer_area =
      writer_bytes_per_s > 0 ? kWriterAreaBlocks * cfg.block : 0;
  auto io_or = BlockIo::Open(IoOptions(cfg, path, span + writer_area));
  if (!io_or.ok()) return Fail("raw: open " + path, io_or.status());
  std::unique_ptr<BlockIo> io = std::move(*io_or);
  const int depth = cfg.queue_depth;
  // Huge-page backed, as the devices' DRAM is: with 4 KiB pages each 1 MiB
  // O_DIRECT transfer is 256 scatter-gather segments, which costs this
  // virtio disk a large share of its bandwidth.
  HugeBuffer mem(static_cast<size_t>(depth) * cfg.block);
  if (mem.data() == nullptr) return absl::ResourceExhaustedError("raw: mmap");
  std::vector<uint8_t*> bufs;
  for (int i = 0; i < depth; ++i) bufs.push_back(mem.data() + i * cfg.block);
  // Write the span first: reading holes of a sparse file measures nothing.
  {
    Inflight inflight;
    uint64_t k = 0;
    for (uint64_t off = 0; off < span; off += cfg.block, ++k) {
      absl::Status s = inflight.WaitAtMost(depth - 1);
      if (!s.ok()) return Fail("raw: populate", s);
      uint8_t* b = bufs[k % depth];
      FillBlock(b, cfg.block, off);
      io->Write(off, b, cfg.block, inflight.Add());
    }
    absl::Status s = inflight.WaitAtMost(0);
    if (!s.ok()) return Fail("raw: populate", s);
    s = io->Sync();
    if (!s.ok()) return Fail("raw: sync", s);
  }
  DropPageCache(path);
  // Two passes; the result is their combined rate.
  double writer_mbps_sum = 0;
  double secs = 0;
  uint64_t bytes = 0;
  for (int pass = 0; pass < FLAGS_raw_passes; ++pass) {
    // `streams` sequential streams over equal parts of the span, queue_depth
    // reads in flight in all. Each completion issues the next chunk from its
    // callback, so the queue never waits for a thread to wake up.
    const uint64_t chunks = span / cfg.block;
    const uint64_t per_stream = chunks / streams;
    const uint64_t total = per_stream * streams;
    struct Chain {
      BlockIo* io;
      uint64_t block, per_stream, streams, total;
      std::atomic<uint64_t> next{0};
      Mutex mu;
      CondVar cv;
      int live ABSL_GUARDED_BY(mu) = 0;
      absl::Status status ABSL_GUARDED_BY(mu);
      // Issues chunk k (round-robin over the streams) into `buf`, then the
      // next unissued one from its completion.
      void Issue(uint8_t* buf) {
        const uint64_t k = next.fetch_add(1);
        if (k >= total) {
          MutexLock l(&mu);
          if (--live == 0) cv.SignalAll();
          return;
        }
        const uint64_t off = ((k % streams) * per_stream + k / streams) * block;
        io->Read(off, buf, block, [this, buf](absl::Status s) {
          if (!s.ok()) {
            MutexLock l(&mu);
            if (status.ok()) status = s;
          }
          Issue(buf);
        });
      }
    };
    auto chain = std::make_shared<Chain>();
    chain->io = io.get();
    chain->block = cfg.block;
    chain->per_stream = per_stream;
    chain->streams = streams;
    chain->total = total;
    // The writer's (at most 4) writes get ring slots of their own: reads
    // re-issued from completions would otherwise take every free slot.
    const int read_depth =
        writer_bytes_per_s > 0 ? std::max(1, depth - 4) : depth;
    const int n = static_cast<int>(std::min<uint64_t>(read_depth, total));
    {
      MutexLock l(&chain->mu);
      chain->live = n;
    }
    // The writer: one block every block / rate seconds, at most 4 in
    // flight, until the pass has read everything.
    std::atomic<bool> reading{true};
    uint64_t written = 0;
    absl::Status write_status;
    Thread writer;
    if (writer_bytes_per_s > 0) {
      writer = Thread("raw-writer", [&] {
        HugeBuffer wmem(4 * cfg.block);
        if (wmem.data() == nullptr) {
          write_status = absl::ResourceExhaustedError("raw-writer: mmap");
          return;
        }
        for (uint64_t i = 0; i < 4; ++i) {
          FillBlock(wmem.data() + i * cfg.block, cfg.block, span + i);
        }
        Inflight inflight;
        const absl::Duration every =
            absl::Seconds(cfg.block / writer_bytes_per_s);
        absl::Time due = absl::Now();
        while (reading.load()) {
          absl::Status st = inflight.WaitAtMost(3);
          if (!st.ok()) {
            write_status = st;
            break;
          }
          io->Write(span + (written % kWriterAreaBlocks) * cfg.block,
                    wmem.data() + (written % 4) * cfg.block, cfg.block,
                    inflight.Add());
          ++written;
          due += every;
          const absl::Time now = absl::Now();
          if (due > now) {
            absl::SleepFor(due - now);
          } else {
            due = now;  // fell behind: no burst to catch up
          }
        }
        absl::Status st = inflight.WaitAtMost(0);
        if (write_status.ok()) write_status = st;
      });
    }
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < n; ++i) chain->Issue(bufs[i]);
    {
      MutexLock l(&chain->mu);
      while (chain->live > 0) chain->cv.Wait(&chain->mu);
      if (!chain->status.ok()) return Fail("raw: read", chain->status);
    }
    const double read_secs = absl::ToDoubleSeconds(absl::Now() - t0);
    reading.store(false);
    writer.Join();
    if (!write_status.ok()) return Fail("raw: write", write_status);
    if (writer_bytes_per_s > 0) {
      writer_mbps_sum += written * cfg.block / read_secs / 1e6;
    }
    const double pass_secs = absl::ToDoubleSeconds(absl::Now() - t0);
    std::fprintf(stderr, "[raw] pass %d: %.2f GB/s\n", pass + 1,
                 total * cfg.block / pass_secs / 1e9);
    secs += pass_secs;
    bytes += total * cfg.block;
  }
  RawResult r;
  r.gbps = static_cast<double>(bytes) / secs / 1e9;
  r.writer_mbps = writer_mbps_sum / FLAGS_raw_passes;
  r.engine = std::string(io->engine()) + (io->async_submit() ? "+async" : "");
  io.reset();
  RemoveFiles(path);
  return r;
}

}  // namespace hymcache::device_bench
