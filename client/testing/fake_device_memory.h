// FakeDeviceMemory: "device" memory for unit tests of the client's device
// path (testonly). Device buffers are host memory the fake owns, handed out
// as opaque addresses in a range no process maps (so code that read a
// device pointer as host memory would crash, not pass); only the fake's
// streams and *ForTest accessors reach them. Streams queue copies and run
// them at Synchronize, as a CUDA stream may; it counts copies, streams and
// pinned allocations, and injects failures.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/device_memory.h"
#include "common/mutex.h"

namespace hymcache {

class FakeDeviceMemory : public DeviceMemory {
 public:
  FakeDeviceMemory() = default;
  ~FakeDeviceMemory() override;

  // Device buffers.
  // A new device buffer of `size` bytes on `device` (zeroed).
  void* AllocateDeviceForTest(size_t size, int device = 0);
  std::vector<uint8_t> ReadDeviceForTest(const void* p, size_t size) const;
  void WriteDeviceForTest(void* p, const void* src, size_t size);

  // Failure injection.
  // The `n`-th copy queued from now on (0: the next) fails to be queued.
  void FailCopyEnqueue(size_t n, absl::Status s);
  // The next Synchronize of any stream fails with `s`; the copies queued on
  // that stream are dropped (none lands).
  void FailNextSync(absl::Status s);

  // Records.
  size_t copies_to_device() const;  // landed
  size_t copies_to_host() const;    // landed
  size_t syncs() const;
  size_t streams_created() const;
  size_t live_streams() const;
  size_t live_pinned() const;  // allocations not freed
  size_t pinned_allocations() const;
  // Most copies queued and not yet synchronized at once, over all streams.
  size_t max_unsynchronized() const;

  // DeviceMemory.
  absl::string_view name() const override { return "fake"; }
  absl::StatusOr<void*> AllocatePinned(size_t size) override;
  void FreePinned(void* p) override;
  absl::StatusOr<std::unique_ptr<DeviceStream>> NewStream(int device) override;

 private:
  class Stream;
  struct Copy {
    bool to_device = false;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t size = 0;
  };
  // The host bytes behind device address `p` (REQUIRES: [p, p+size) inside
  // one device buffer; a broken invariant aborts the test).
  uint8_t* Resolve(const void* p, size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Enqueue(std::vector<Copy>* queue, const Copy& c);
  absl::Status Sync(std::vector<Copy>* queue);
  void StreamGone();

  mutable Mutex mu_;
  uint64_t next_device_addr_ ABSL_GUARDED_BY(mu_) = 0xdead00000000ull;
  // Device address -> backing bytes.
  std::map<uint64_t, std::vector<uint8_t>> device_ ABSL_GUARDED_BY(mu_);
  std::map<void*, size_t> pinned_ ABSL_GUARDED_BY(mu_);
  size_t pinned_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<size_t, absl::Status> enqueue_failures_ ABSL_GUARDED_BY(mu_);
  size_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status sync_failure_ ABSL_GUARDED_BY(mu_);
  size_t to_device_ ABSL_GUARDED_BY(mu_) = 0;
  size_t to_host_ ABSL_GUARDED_BY(mu_) = 0;
  size_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  size_t streams_ ABSL_GUARDED_BY(mu_) = 0;
  size_t live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unsynced_ ABSL_GUARDED_BY(mu_) = 0;
  size_t max_unsynced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
