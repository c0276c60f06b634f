// The parts of device_bench (device_bench.cc says what it measures and
// how): the configuration and plumbing they share (device_bench_io.cc), the
// raw tier read (device_bench_raw.cc) and one device mode's turns
// (device_bench_modes.cc).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/capacity_tier.h"
#include "storage_node/device/host_memory.h"
#include "storage_node/device/hybrid_device.h"
#include "storage_node/device/lru_device.h"
#include "storage_node/device/memory_device.h"

// Flags defined in device_bench.cc that the parts read.
DECLARE_uint64(read_bps);
DECLARE_uint64(write_bps);
DECLARE_uint64(read_latency_us);
DECLARE_string(io_submit);
DECLARE_string(consume);
DECLARE_int32(raw_passes);
DECLARE_int32(settle_ms);
DECLARE_bool(drain_appends);
DECLARE_bool(keep_files);
DECLARE_uint64(hold_mib);

namespace hymcache::device_bench {

using storage::AlignedBuffer;
using storage::BlockIo;
using storage::BlockIoOptions;
using storage::CapacityTier;
using storage::CapacityTierOptions;
using storage::HybridDevice;
using storage::HybridDeviceOptions;
using storage::LruCacheDevice;
using storage::LruCacheDeviceOptions;
using storage::MemoryDevice;

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Config {
  int conversations = 4;
  uint64_t block = kMiB;
  uint64_t window = 128 * kMiB;
  uint64_t write_buffer = 32 * kMiB;
  int turns = 8;
  uint64_t blocks_per_conv = 0;  // at the last turn
  uint64_t append_blocks = 0;    // per conversation per turn
  uint64_t footprint = 0;        // bytes read at the last turn
  uint64_t writer_blocks = 0;    // writer area (cycled)
  uint64_t capacity = 0;         // data area of every device file
  int queue_depth = 64;
  BlockIoOptions::Engine engine = BlockIoOptions::Engine::kAuto;
  int prefetch_depth = 0;
  std::string prefix;
};

absl::Status Fail(const std::string& what, const absl::Status& s);

// Drops the file's page-cache pages. O_DIRECT bypasses the page cache, but a
// populate through a buffered path (or a previous run) must not help reads.
void DropPageCache(const std::string& path);

void RemoveFiles(const std::string& path);

std::string FsDescription(const std::string& path);

BlockIoOptions IoOptions(const Config& cfg, const std::string& path,
                         uint64_t size);

// Reusable barrier for the conversation threads.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    MutexLock l(&mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.SignalAll();
      return;
    }
    while (gen_ == gen) cv_.Wait(&mu_);
  }

 private:
  const int n_;
  Mutex mu_;
  CondVar cv_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t gen_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts outstanding BlockIo operations and the first error. The state is
// shared with the callbacks, so it outlives a completion that is still
// unlocking when the waiter returns.
class Inflight {
 public:
  BlockIo::Callback Add() {
    MutexLock l(&st_->mu);
    ++st_->pending;
    return [st = st_](absl::Status s) {
      MutexLock l(&st->mu);
      if (!s.ok() && st->status.ok()) st->status = s;
      --st->pending;
      st->cv.SignalAll();
    };
  }
  // Waits until at most `n` are outstanding; returns the first error.
  absl::Status WaitAtMost(int n) {
    MutexLock l(&st_->mu);
    while (st_->pending > n) st_->cv.Wait(&st_->mu);
    return st_->status;
  }

 private:
  struct State {
    Mutex mu;
    CondVar cv;
    int pending ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<State> st_ = std::make_shared<State>();
};

// Anonymous memory with transparent huge pages requested.
class HugeBuffer {
 public:
  explicit HugeBuffer(size_t len) : len_(len) {
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    madvise(m, len, MADV_HUGEPAGE);
    p_ = static_cast<uint8_t*>(m);
  }
  ~HugeBuffer() {
    if (p_ != nullptr) munmap(p_, len_);
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  uint8_t* data() const { return p_; }

 private:
  const size_t len_;
  uint8_t* p_ = nullptr;
};

// Block contents: the first 8 bytes name the block address (checked on
// read), the rest is a constant fill.
void FillBlock(uint8_t* p, uint64_t len, uint64_t addr);
bool BlockOk(const uint8_t* p, uint64_t addr);

// What a reader does with a block the device hands it (--consume): checks
// its header where it lies, or copies it out first. Returns whether the
// block is the one asked for.
bool Consume(const uint8_t* p, uint8_t* dst, uint64_t len, uint64_t addr);

struct RawResult {
  double gbps = 0;
  std::string engine;
  double writer_mbps = 0;  // the raw-writer's achieved rate, if it ran
};

// With `writer_bytes_per_s` > 0, a "raw-writer" thread writes blocks at
// that rate into an area past the span while the passes read: what the
// device's own write work costs its reads (on a device whose work runs on
// the host's cores, such as zram, writes take CPU from reads; on an NVMe
// drive they share only its bandwidth).
absl::StatusOr<RawResult> RunRaw(const Config& cfg, double span_gib,
                                 uint64_t streams,
                                 double writer_bytes_per_s = 0);

struct TurnResult {
  int turn = 0;
  uint64_t prefix_bytes = 0;  // read this turn, all conversations
  double read_gbps = 0;
  double hit_ratio = 0;
  double append_seconds = 0;
};

struct ModeResult {
  std::string name;
  std::vector<TurnResult> turns;
  double read_gbps = 0;     // all turns: bytes / read time
  double hit_ratio = 0;     // all turns
  uint64_t bad_blocks = 0;  // blocks that read back wrong
  uint64_t read_errors = 0;
  uint64_t append_refusals = 0;  // appends refused (retried)
  bool writer = false;
  double writer_mbps = 0;     // achieved, over the read phases
  double writer_seconds = 0;  // read phases the writer ran in
  uint64_t writer_refused = 0;
  uint64_t writer_writes = 0;
  // What the device did (staging modes): refill bandwidth while refills were
  // in flight, and the reads it kept in flight on average.
  double refill_gbps = 0;
  double read_qd = 0;
  std::string notes;
};

// Runs one device mode (staging or LRU, with or without the concurrent
// writer) over every turn.
absl::StatusOr<ModeResult> RunMode(const Config& cfg, const std::string& name,
                                   bool lru, uint64_t lru_line,
                                   double writer_bytes_per_s);

}  // namespace hymcache::device_bench
