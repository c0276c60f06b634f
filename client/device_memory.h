// DeviceMemory: the client's seam to accelerator memory (CUDA device
// buffers), used by device-memory Loads and Stores (MemoryKind::kCudaDevice)
// through the pinned bounce pool (bounce_pool.h).
//
// Implementations:
//   cuda/cuda_device_memory.cc  the CUDA runtime (cudaHostAlloc,
//                               cudaMemcpyAsync, cudaStreamSynchronize),
//                               linked only under `bazel build --config=cuda`;
//   device_memory_none.cc       the default build: every call fails with
//                               FailedPrecondition "built without CUDA";
//   testing/fake_device_memory  "device" memory that is host memory behind
//                               opaque addresses, with copy counters and
//                               injectable failures (tests).
// NewDeviceMemory() (device_memory_select.h) returns the one the build
// selected; the choice never changes a public class (shared/STYLE.md).
//
// GPUDirect RDMA: where the NIC and driver can register device memory
// (nvidia-peermem), RDMA reads could land in device buffers directly and
// skip the pool; the transport's RegisterMemory is the seam for it
// (docs/data_planes.md, "GPU memory"). Today every device transfer goes
// through the pinned pool, which the transport registers once.
//
// Internal to the client library (not a public header of //client).
//
// Thread safety: a DeviceMemory is safe for concurrent use; a DeviceStream
// is used by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hymcache {

// An ordered queue of copies on one device (a CUDA stream). Copies are
// asynchronous: the memory they touch stays in use until Synchronize
// returns. Destroying a stream waits for its copies.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Queues a copy of `size` bytes from pinned host memory `src` to device
  // memory `dst`. An error here means the copy was not queued.
  virtual absl::Status CopyToDevice(void* dst, const void* src,
                                    size_t size) = 0;
  // Queues a copy from device memory `src` to pinned host memory `dst`.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t size) = 0;
  // Waits for every queued copy. Not OK: at least one of them failed (CUDA
  // reports the stream's first error, not which copy); treat every copy
  // since the last Synchronize as failed.
  virtual absl::Status Synchronize() = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // "cuda", "none", "fake".
  virtual absl::string_view name() const = 0;

  // Page-locked host memory of `size` bytes that devices copy from and to
  // asynchronously. Errors: FailedPrecondition (no device support),
  // ResourceExhausted.
  virtual absl::StatusOr<void*> AllocatePinned(size_t size) = 0;
  // REQUIRES: `p` came from AllocatePinned and no copy uses it.
  virtual void FreePinned(void* p) = 0;

  // A new stream on device `device`. Errors: FailedPrecondition (no device
  // support), InvalidArgument (no such device).
  virtual absl::StatusOr<std::unique_ptr<DeviceStream>> NewStream(
      int device) = 0;
};

// "Built without CUDA": every call fails with FailedPrecondition.
std::unique_ptr<DeviceMemory> NewNoDeviceMemory();

}  // namespace hymcache
