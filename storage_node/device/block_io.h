// BlockIo: asynchronous positional reads and writes on a storage node's
// capacity tier: a file or block device opened with O_DIRECT. The hybrid
// device (staging window + write buffer) and the LRU baseline both move their
// bytes through it, so they share the same I/O machinery and queue depth.
//
// Engines: io_uring (liburing) where the kernel allows it, else a named pool
// of threads doing pread/pwrite. Which one runs is a run-time choice
// (BlockIoOptions::engine), reported by engine().
//
// Alignment: with O_DIRECT every offset, length and buffer address must be a
// multiple of kAlignment; callers allocate buffers with AllocateAligned.
//
// Thread safety: safe for concurrent use. Completion callbacks run on the
// engine's own completion thread(s); they must be short and must not block
// or call back into Read/Write synchronously waiting for a result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hymcache::storage {

struct BlockIoOptions {
  enum class Engine { kAuto, kIoUring, kThreadPool };

  // File or block device. A regular file is created if missing and sized to
  // size_bytes. Required.
  std::string path;
  // Bytes of the capacity tier; a multiple of kAlignment. For a block device,
  // at most the device size. Required.
  uint64_t size_bytes = 0;
  // kAuto: io_uring if it initialises, else the thread pool. Default: kAuto.
  Engine engine = Engine::kAuto;
  // Most I/Os in flight (io_uring SQ depth; thread-pool queue bound).
  // Default: 64.
  int queue_depth = 64;
  // Threads of the thread-pool engine. Default: 4.
  int threads = 4;
  // Open with O_DIRECT (bypass the page cache). Turn off only for
  // filesystems without O_DIRECT support (tmpfs); such opens log a warning.
  // Default: true.
  bool direct = true;
  // Bandwidth caps in bytes per second for reads and for writes (0: none).
  // Transfers start no faster than the cap allows (BandwidthPacer: at most
  // 1 ms of idle credit), paced by a "blkio-pace" thread; the queue depth
  // still applies beneath. For a node that must leave a shared disk's
  // bandwidth to others, and for measuring a slower device on a fast one
  // (device_bench --read_bps).
  // Default: 0, 0.
  uint64_t max_read_bytes_per_s = 0;
  uint64_t max_write_bytes_per_s = 0;
  // Reads complete no sooner than this after they were asked for; a read
  // the device finished earlier is handed to its callback at that time by
  // the "blkio-pace" thread (0: as the device does). For measuring a device
  // with a higher access latency than the one at hand, e.g. a memory-backed
  // block device (zram: ~0 latency, its copy on the CPU) standing in for an
  // NVMe drive (~80-100 us per read): device_bench --read_latency_us.
  // Default: 0.
  absl::Duration min_read_latency = absl::ZeroDuration();
  // How the io_uring engine hands I/Os to the kernel.
  //   kInline: from the calling thread, io_uring's fast path for devices
  //     whose submission only queues the I/O (NVMe, virtio, SCSI: blk-mq).
  //   kAsync: through the kernel's io-wq workers (IOSQE_ASYNC), for devices
  //     that move the bytes inside submission (zram, brd, pmem and other
  //     bio-based memory devices). Inline, their copy would run on the
  //     submitting thread (a data-plane worker, the completion thread)
  //     under the engine's lock, one I/O at a time: the queue depth would
  //     buy nothing (docs/hybrid_device.md).
  //   kAuto: kAsync when the file's block device has no blk-mq hardware
  //     queues (no mq/ in its sysfs directory), else kInline.
  // Default: kAuto.
  enum class Submit { kAuto, kInline, kAsync };
  Submit submit = Submit::kAuto;

  absl::Status Validate() const;
};

class BlockIo {
 public:
  static constexpr size_t kAlignment = 4096;
  using Callback = std::function<void(absl::Status)>;

  // Errors: InvalidArgument (options), NotFound/PermissionDenied/Internal
  // (open), Unimplemented (engine explicitly requested but unavailable).
  static absl::StatusOr<std::unique_ptr<BlockIo>> Open(
      const BlockIoOptions& options);

  virtual ~BlockIo() = default;

  // Reads [offset, offset + len) into `buf`; `done` gets OK or the error
  // (a short read is DataLoss). REQUIRES: offset, len, buf aligned;
  // offset + len <= size(). Violations are reported through `done` as
  // InvalidArgument / OutOfRange, never a crash.
  virtual void Read(uint64_t offset, void* buf, size_t len, Callback done) = 0;
  // Writes `buf` to [offset, offset + len). As Read.
  virtual void Write(uint64_t offset, const void* buf, size_t len,
                     Callback done) = 0;
  // Makes completed writes durable (fdatasync).
  virtual absl::Status Sync() = 0;

  virtual uint64_t size() const = 0;
  // "io_uring" or "threadpool".
  virtual absl::string_view engine() const = 0;
  // Whether I/Os are submitted through the kernel's workers
  // (BlockIoOptions::Submit::kAsync, chosen or detected).
  virtual bool async_submit() const { return false; }

  // Blocking conveniences over Read/Write.
  absl::Status ReadSync(uint64_t offset, void* buf, size_t len);
  absl::Status WriteSync(uint64_t offset, const void* buf, size_t len);
};

// Schedules transfers so that they start no faster than `bytes_per_s`: the
// "device" is busy len / bytes_per_s after each start, and idle time earns
// at most `burst` of credit. Pure (the caller passes the time); not
// thread-safe.
class BandwidthPacer {
 public:
  BandwidthPacer(uint64_t bytes_per_s, absl::Duration burst)
      : bytes_per_s_(bytes_per_s), burst_(burst) {}
  // When a transfer of `len` bytes asked for at `now` may start (now, or
  // later when earlier transfers used the bandwidth).
  absl::Time Schedule(absl::Time now, uint64_t len);

 private:
  const uint64_t bytes_per_s_;
  const absl::Duration burst_;
  absl::Time free_at_ = absl::InfinitePast();
};

// Memory aligned to BlockIo::kAlignment (freed with free()).
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<uint8_t[], AlignedFree>;
// Returns nullptr-holding buffer on allocation failure. `len` is rounded up
// to kAlignment.
AlignedBuffer AllocateAligned(size_t len);

}  // namespace hymcache::storage
