#include "storage_node/device/block_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/mutex.h"
#include "storage_node/device/faulty_block_io.h"

namespace hymcache::storage {
namespace {

using Engine = BlockIoOptions::Engine;

constexpr size_t kBlock = 64 << 10;
constexpr int kBlocks = 256;
constexpr uint64_t kSize = uint64_t{kBlock} * kBlocks;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

// Counts completions and remembers their statuses.
class Latch {
 public:
  BlockIo::Callback Callback(int slot) {
    return [this, slot](absl::Status s) {
      MutexLock l(&mu_);
      statuses_[slot] = std::move(s);
      ++done_;
      cv_.SignalAll();
    };
  }
  explicit Latch(int n) : statuses_(n) {}
  std::vector<absl::Status> Wait() {
    MutexLock l(&mu_);
    while (done_ < static_cast<int>(statuses_.size())) cv_.Wait(&mu_);
    return statuses_;
  }
  int done() {
    MutexLock l(&mu_);
    return done_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
};

// Opens `path` with O_DIRECT, or without it when the test filesystem refuses
// O_DIRECT (noted with WARN). Returns nullptr (and WARNs) when the engine is
// unavailable here.
std::unique_ptr<BlockIo> OpenFor(
    Engine engine, const std::string& path, uint64_t size = kSize,
    int depth = 64, BlockIoOptions::Submit submit = BlockIoOptions::Submit::kAuto) {
  BlockIoOptions o;
  o.submit = submit;
  o.path = path;
  o.size_bytes = size;
  o.engine = engine;
  o.queue_depth = depth;
  o.threads = 4;
  o.direct = true;
  auto io = BlockIo::Open(o);
  if (!io.ok() && io.status().code() == absl::StatusCode::kInvalidArgument) {
    WARN("O_DIRECT refused on TEST_TMPDIR (" << io.status().ToString()
                                             << "); testing with direct=false");
    o.direct = false;
    io = BlockIo::Open(o);
  }
  if (!io.ok() && io.status().code() == absl::StatusCode::kUnimplemented) {
    WARN("skipped: " << io.status().ToString());
    return nullptr;
  }
  REQUIRE(io.ok());
  return std::move(*io);
}

uint8_t Pattern(size_t block, size_t i) {
  return static_cast<uint8_t>(block * 131 + i * 7 + (i >> 12));
}

void RoundTrip(BlockIo& io, const std::string& path) {
  REQUIRE(io.size() == kSize);
  std::vector<AlignedBuffer> bufs;
  for (int b = 0; b < kBlocks; ++b) {
    bufs.push_back(AllocateAligned(kBlock));
    REQUIRE(bufs.back() != nullptr);
    for (size_t i = 0; i < kBlock; ++i) bufs.back()[i] = Pattern(b, i);
  }
  {
    Latch latch(kBlocks);
    // Shuffled offsets: block b goes to slot (b * 97) % kBlocks.
    for (int b = 0; b < kBlocks; ++b) {
      uint64_t off = static_cast<uint64_t>((b * 97) % kBlocks) * kBlock;
      io.Write(off, bufs[b].get(), kBlock, latch.Callback(b));
    }
    for (const absl::Status& s : latch.Wait()) REQUIRE(s.ok());
  }
  REQUIRE(io.Sync().ok());

  std::vector<AlignedBuffer> back;
  for (int b = 0; b < kBlocks; ++b) {
    back.push_back(AllocateAligned(kBlock));
    std::memset(back.back().get(), 0xEE, kBlock);
  }
  {
    Latch latch(kBlocks);
    for (int b = 0; b < kBlocks; ++b) {
      uint64_t off = static_cast<uint64_t>((b * 97) % kBlocks) * kBlock;
      io.Read(off, back[b].get(), kBlock, latch.Callback(b));
    }
    for (const absl::Status& s : latch.Wait()) REQUIRE(s.ok());
  }
  for (int b = 0; b < kBlocks; ++b) {
    INFO("block " << b);
    REQUIRE(std::memcmp(bufs[b].get(), back[b].get(), kBlock) == 0);
  }

  // The bytes really are in the file.
  int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<uint8_t> plain(kBlock);
  REQUIRE(pread(fd, plain.data(), kBlock, 5 * kBlock) ==
          static_cast<ssize_t>(kBlock));
  close(fd);
  int b5 = 0;  // the block written to slot 5
  while ((b5 * 97) % kBlocks != 5) ++b5;
  REQUIRE(std::memcmp(plain.data(), bufs[b5].get(), kBlock) == 0);
}

void BadRequests(BlockIo& io, bool direct) {
  auto buf = AllocateAligned(2 * BlockIo::kAlignment);
  REQUIRE(io.WriteSync(0, buf.get(), BlockIo::kAlignment).ok());
  REQUIRE(io.WriteSync(0, buf.get(), 0).ok());
  REQUIRE(io.ReadSync(io.size(), buf.get(), 0).ok());
  CHECK(io.ReadSync(io.size(), buf.get(), BlockIo::kAlignment).code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(io.WriteSync(io.size() - BlockIo::kAlignment, buf.get(),
                     2 * BlockIo::kAlignment)
            .code() == absl::StatusCode::kOutOfRange);
  CHECK(io.ReadSync(~uint64_t{0} - 4095, buf.get(), BlockIo::kAlignment)
            .code() == absl::StatusCode::kOutOfRange);
  CHECK(io.ReadSync(0, nullptr, BlockIo::kAlignment).code() ==
        absl::StatusCode::kInvalidArgument);
  if (direct) {
    CHECK(io.ReadSync(512, buf.get(), BlockIo::kAlignment).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(io.WriteSync(0, buf.get(), 100).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(io.WriteSync(0, buf.get() + 8, BlockIo::kAlignment).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  // Still healthy afterwards.
  REQUIRE(io.ReadSync(0, buf.get(), BlockIo::kAlignment).ok());
}

// Each callback issues the next write, with a queue depth of 1: a callback
// must never block on backpressure that only its own thread can relieve.
void ChainFromCallbacks(BlockIo& io) {
  constexpr int kChain = 64;
  auto buf = AllocateAligned(BlockIo::kAlignment);
  // One buffer per read: concurrent reads into one buffer would race.
  std::vector<AlignedBuffer> rbufs;
  for (int i = 0; i < kChain / 2; ++i) {
    rbufs.push_back(AllocateAligned(BlockIo::kAlignment));
  }
  std::memset(buf.get(), 0x5A, BlockIo::kAlignment);
  Latch latch(kChain);
  Latch reads(kChain / 2);
  std::function<void(int)> issue;
  issue = [&](int i) {
    io.Write(static_cast<uint64_t>(i) * BlockIo::kAlignment, buf.get(),
             BlockIo::kAlignment, [&, i](absl::Status s) {
               if (i + 1 < kChain) {
                 issue(i + 1);
                 // A second one, so the ring is over-full from a callback.
                 if (i % 2 == 0) {
                   io.Read(0, rbufs[i / 2].get(), BlockIo::kAlignment,
                           reads.Callback(i / 2));
                 }
               }
               latch.Callback(i)(std::move(s));
             });
  };
  issue(0);
  for (const absl::Status& s : latch.Wait()) REQUIRE(s.ok());
  for (const absl::Status& s : reads.Wait()) REQUIRE(s.ok());
}

void EngineSuite(Engine engine, const std::string& tag,
                 BlockIoOptions::Submit submit = BlockIoOptions::Submit::kAuto) {
  SECTION("round trip at queue depth") {
    std::string path = TmpPath(tag + "_rt");
    auto io = OpenFor(engine, path, kSize, 64, submit);
    if (io == nullptr) return;
    REQUIRE(FileSize(path) == kSize);
    RoundTrip(*io, path);
  }
  SECTION("bad requests fail through the callback") {
    std::string path = TmpPath(tag + "_bad");
    auto io = OpenFor(engine, path, kSize, 64, submit);
    if (io == nullptr) return;
    // OpenFor falls back to direct=false only when O_DIRECT is refused.
    int probe = open(path.c_str(), O_RDWR | O_DIRECT);
    bool direct = probe >= 0;
    if (probe >= 0) close(probe);
    BadRequests(*io, direct);
  }
  SECTION("callbacks may issue I/O at queue depth 1") {
    auto io = OpenFor(engine, TmpPath(tag + "_chain"), kSize, /*depth=*/1, submit);
    if (io == nullptr) return;
    ChainFromCallbacks(*io);
  }
  SECTION("destruction waits for in-flight I/O") {
    constexpr int kN = 128;
    Latch latch(kN);
    auto buf = AllocateAligned(kBlock);
    std::memset(buf.get(), 1, kBlock);
    {
      auto io = OpenFor(engine, TmpPath(tag + "_dtor"), kSize, 16, submit);
      if (io == nullptr) return;
      for (int i = 0; i < kN; ++i) {
        io->Write(uint64_t(i % kBlocks) * kBlock, buf.get(), kBlock,
                  latch.Callback(i));
      }
    }
    REQUIRE(latch.done() == kN);
  }
}

TEST_CASE("thread-pool engine", "[block_io]") {
  auto io = OpenFor(Engine::kThreadPool, TmpPath("tp_probe"));
  REQUIRE(io != nullptr);
  REQUIRE(io->engine() == "threadpool");
  io.reset();
  EngineSuite(Engine::kThreadPool, "tp");
}

TEST_CASE("io_uring engine", "[block_io]") {
  auto io = OpenFor(Engine::kIoUring, TmpPath("uring_probe"));
  if (io == nullptr) return;  // Unimplemented here: WARNed by OpenFor.
  REQUIRE(io->engine() == "io_uring");
  io.reset();
  EngineSuite(Engine::kIoUring, "uring");
}

TEST_CASE("io_uring engine, submission through the kernel's workers",
          "[block_io]") {
  // kAsync: what kAuto picks for bio-based devices (zram, brd, pmem),
  // which move the bytes while an I/O is submitted.
  using Submit = BlockIoOptions::Submit;
  auto io = OpenFor(Engine::kIoUring, TmpPath("uring_async_probe"), kSize, 64,
                    Submit::kAsync);
  if (io == nullptr) return;
  REQUIRE(io->async_submit());
  io = OpenFor(Engine::kIoUring, TmpPath("uring_inline_probe"), kSize, 64,
               Submit::kInline);
  REQUIRE_FALSE(io->async_submit());
  io.reset();
  EngineSuite(Engine::kIoUring, "uring_async", Submit::kAsync);
}

TEST_CASE("auto engine picks one that works", "[block_io]") {
  std::string path = TmpPath("auto_rt");
  auto io = OpenFor(Engine::kAuto, path);
  REQUIRE(io != nullptr);
  REQUIRE((io->engine() == "io_uring" || io->engine() == "threadpool"));
  RoundTrip(*io, path);
}

TEST_CASE("sizing: grows a file, never shrinks it", "[block_io]") {
  std::string path = TmpPath("sizing");
  {
    auto io = OpenFor(Engine::kThreadPool, path, 1 << 20);
    REQUIRE(FileSize(path) == (1u << 20));
  }
  {
    auto io = OpenFor(Engine::kThreadPool, path, 4 << 20);
    REQUIRE(FileSize(path) == (4u << 20));
  }
  {
    auto io = OpenFor(Engine::kThreadPool, path, 2 << 20);
    REQUIRE(io->size() == (2u << 20));
    REQUIRE(FileSize(path) == (4u << 20));
  }
}

TEST_CASE("sync wrappers and Sync", "[block_io]") {
  auto io = OpenFor(Engine::kAuto, TmpPath("sync"), 1 << 20);
  auto w = AllocateAligned(3 * BlockIo::kAlignment);
  auto r = AllocateAligned(3 * BlockIo::kAlignment);
  for (size_t i = 0; i < 3 * BlockIo::kAlignment; ++i) w[i] = uint8_t(i * 3);
  REQUIRE(io->WriteSync(8192, w.get(), 3 * BlockIo::kAlignment).ok());
  REQUIRE(io->Sync().ok());
  REQUIRE(io->ReadSync(8192, r.get(), 3 * BlockIo::kAlignment).ok());
  REQUIRE(std::memcmp(w.get(), r.get(), 3 * BlockIo::kAlignment) == 0);
}

TEST_CASE("invalid options are refused", "[block_io]") {
  BlockIoOptions good;
  good.path = TmpPath("opts");
  good.size_bytes = 1 << 20;
  good.direct = false;
  REQUIRE(good.Validate().ok());

  BlockIoOptions o = good;
  o.path.clear();
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.size_bytes = 0;
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.size_bytes = 4097;
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.queue_depth = 0;
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.engine = Engine::kThreadPool;
  o.threads = 0;
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.min_read_latency = absl::Microseconds(-1);
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.min_read_latency = absl::Seconds(2);
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kInvalidArgument);
  o = good;
  o.path = TmpPath("no/such/dir/file");
  CHECK(BlockIo::Open(o).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("BandwidthPacer keeps starts to the rate, with bounded credit",
          "[block_io]") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // 1 MB/s, 1 ms of credit.
  BandwidthPacer p(1000000, absl::Milliseconds(1));
  // Each 1000-byte transfer keeps the "device" busy for 1 ms; the first
  // two start at once (the second spends the 1 ms of credit).
  CHECK(p.Schedule(t0, 1000) == t0);
  CHECK(p.Schedule(t0, 1000) == t0);
  CHECK(p.Schedule(t0, 1000) == t0 + absl::Milliseconds(1));
  CHECK(p.Schedule(t0, 1000) == t0 + absl::Milliseconds(2));
  // Asked later than the device frees up: now.
  CHECK(p.Schedule(t0 + absl::Milliseconds(10), 1000) ==
        t0 + absl::Milliseconds(10));
  // A long idle earns at most 1 ms of credit: two back-to-back transfers
  // start at once, the third waits.
  const absl::Time t1 = t0 + absl::Seconds(5);
  CHECK(p.Schedule(t1, 1000) == t1);
  CHECK(p.Schedule(t1, 1000) == t1);
  CHECK(p.Schedule(t1, 1000) == t1 + absl::Milliseconds(1));
  // Over a long run the rate holds: 1000 transfers of 1000 bytes span ~1 s.
  const absl::Time t2 = t0 + absl::Seconds(20);
  absl::Time last;
  for (int i = 0; i < 1000; ++i) last = p.Schedule(t2, 1000);
  CHECK(last - t2 >= absl::Milliseconds(997));
  CHECK(last - t2 <= absl::Milliseconds(1000));
  // Unlimited: always now.
  BandwidthPacer none(0, absl::Milliseconds(1));
  CHECK(none.Schedule(t0, uint64_t{1} << 40) == t0);
  CHECK(none.Schedule(t0, uint64_t{1} << 40) == t0);
}

TEST_CASE("a bandwidth cap paces transfers and keeps them correct",
          "[block_io]") {
  BlockIoOptions o;
  o.path = TmpPath("paced");
  o.size_bytes = kSize;
  o.engine = Engine::kAuto;
  o.direct = false;  // correctness and pacing, not the disk
  o.max_read_bytes_per_s = 64 << 20;   // 64 MiB/s
  o.max_write_bytes_per_s = 64 << 20;
  auto io_or = BlockIo::Open(o);
  REQUIRE(io_or.ok());
  std::unique_ptr<BlockIo> io = std::move(*io_or);
  RoundTrip(*io, o.path);
  // 8 MiB of reads at 64 MiB/s take at least ~1/8 s (less 1 ms of credit),
  // whatever the disk does.
  constexpr int kN = 128;
  auto buf = AllocateAligned(kBlock * kN);
  Latch latch(kN);
  const absl::Time start = absl::Now();
  for (int i = 0; i < kN; ++i) {
    io->Read(uint64_t{kBlock} * i, buf.get() + kBlock * i, kBlock,
             latch.Callback(i));
  }
  for (const absl::Status& st : latch.Wait()) CHECK(st.ok());
  CHECK(absl::Now() - start >= absl::Milliseconds(120));
  // Destruction with transfers still waiting for their time issues them.
  Latch tail(kN);
  for (int i = 0; i < kN; ++i) {
    io->Read(uint64_t{kBlock} * i, buf.get() + kBlock * i, kBlock,
             tail.Callback(i));
  }
  io.reset();
  for (const absl::Status& st : tail.Wait()) CHECK(st.ok());
}

TEST_CASE("a minimum read latency delays completions, not their bytes",
          "[block_io]") {
  BlockIoOptions o;
  o.path = TmpPath("latency");
  o.size_bytes = kSize;
  o.engine = Engine::kAuto;
  o.direct = false;
  constexpr absl::Duration kLatency = absl::Milliseconds(30);
  o.min_read_latency = kLatency;
  auto io_or = BlockIo::Open(o);
  REQUIRE(io_or.ok());
  std::unique_ptr<BlockIo> io = std::move(*io_or);
  RoundTrip(*io, o.path);  // writes and reads back every block
  // Every read completes no sooner than kLatency after it was asked for (a
  // lower bound: it holds however slow the machine is), in any order.
  constexpr int kN = 16;
  auto buf = AllocateAligned(kBlock * kN);
  Mutex mu;
  std::vector<absl::Duration> took(kN);
  Latch latch(kN);
  for (int i = 0; i < kN; ++i) {
    const absl::Time asked = absl::Now();
    BlockIo::Callback done = latch.Callback(i);
    io->Read(uint64_t{kBlock} * i, buf.get() + kBlock * i, kBlock,
             [&, i, asked, done](absl::Status st) {
               {
                 MutexLock l(&mu);
                 took[i] = absl::Now() - asked;
               }
               done(std::move(st));
             });
  }
  for (const absl::Status& st : latch.Wait()) CHECK(st.ok());
  {
    MutexLock l(&mu);
    for (absl::Duration d : took) CHECK(d >= kLatency);
  }
  // Destruction with reads waiting for their time delivers them all before
  // it returns.
  Latch tail(kN);
  for (int i = 0; i < kN; ++i) {
    io->Read(uint64_t{kBlock} * i, buf.get() + kBlock * i, kBlock,
             tail.Callback(i));
  }
  io.reset();
  CHECK(tail.done() == kN);
  for (const absl::Status& st : tail.Wait()) CHECK(st.ok());
}

TEST_CASE("AllocateAligned rounds up and aligns", "[block_io]") {
  auto b = AllocateAligned(1);
  REQUIRE(b != nullptr);
  REQUIRE(reinterpret_cast<uintptr_t>(b.get()) % BlockIo::kAlignment == 0);
  b[BlockIo::kAlignment - 1] = 7;  // the whole rounded block is usable
}

TEST_CASE("FaultyBlockIo fails the chosen requests of a real BlockIo",
          "[block_io]") {
  BlockIoOptions o;
  o.path = TmpPath("faulty");
  o.size_bytes = kSize;
  o.direct = false;
  auto inner = BlockIo::Open(o);
  REQUIRE(inner.ok());
  FaultyBlockIo io(std::move(*inner));
  auto buf = AllocateAligned(kBlock);
  std::memset(buf.get(), 0x11, kBlock);
  REQUIRE(io.WriteSync(0, buf.get(), kBlock).ok());
  REQUIRE(io.WriteSync(kBlock, buf.get(), kBlock).ok());

  // A bad range: overlapping reads fail with DataLoss (as EIO does) and
  // leave unspecified bytes; the others read.
  io.FailReadsForTest(kBlock + 4096, 4096);
  absl::Status s = io.ReadSync(kBlock, buf.get(), kBlock);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(buf[0] == FaultyBlockIo::kScribble);
  REQUIRE(io.ReadSync(0, buf.get(), kBlock).ok());
  CHECK(buf[kBlock - 1] == 0x11);
  CHECK(io.FailedReadsForTest() == 1);

  // A failed write does not reach the file.
  io.FailWritesForTest(0, 4096, absl::ResourceExhaustedError("disk full"));
  std::memset(buf.get(), 0x22, kBlock);
  CHECK(io.WriteSync(0, buf.get(), 4096).code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(io.FailedWritesForTest() == 1);
  REQUIRE(io.ReadSync(0, buf.get(), 4096).ok());
  CHECK(buf[0] == 0x11);

  // Every third read, until cleared.
  io.ClearFaultsForTest();
  io.FailEveryNthReadForTest(3);
  int failed = 0;
  for (int i = 0; i < 9; ++i) {
    failed += io.ReadSync(kBlock, buf.get(), 4096).ok() ? 0 : 1;
  }
  CHECK(failed == 3);
  io.ClearFaultsForTest();
  REQUIRE(io.ReadSync(kBlock + 4096, buf.get(), 4096).ok());
  CHECK(buf[0] == 0x11);
  REQUIRE(io.Sync().ok());
}

}  // namespace
}  // namespace hymcache::storage
