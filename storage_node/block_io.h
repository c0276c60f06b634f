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
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
  virtual std::string_view engine() const = 0;

  // Blocking conveniences over Read/Write.
  absl::Status ReadSync(uint64_t offset, void* buf, size_t len);
  absl::Status WriteSync(uint64_t offset, const void* buf, size_t len);
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
