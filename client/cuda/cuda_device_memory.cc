#include "client/cuda/cuda_device_memory.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hymcache {
namespace {

absl::Status FromCuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error for the next call
  const std::string msg =
      absl::StrCat("CUDA ", what, ": ", cudaGetErrorName(e), ": ",
                   cudaGetErrorString(e));
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// The memory at `p` must be device memory of `device` (or managed memory):
// a host pointer passed as device memory is refused, not copied.
absl::Status CheckDevicePointer(const void* p, int device) {
  cudaPointerAttributes attr{};
  absl::Status s = FromCuda(cudaPointerGetAttributes(&attr, p),
                            "cudaPointerGetAttributes");
  if (!s.ok()) return s;
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        "CUDA: a buffer passed as device memory is not device memory");
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA: a buffer passed as memory of device ", device,
                     " is on device ", attr.device));
  }
  return absl::OkStatus();
}

class CudaStream : public DeviceStream {
 public:
  CudaStream(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}
  ~CudaStream() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // nothing may still use the buffers
    cudaStreamDestroy(stream_);
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t size) override {
    return Copy(dst, src, size, cudaMemcpyHostToDevice, dst);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t size) override {
    return Copy(dst, src, size, cudaMemcpyDeviceToHost, src);
  }
  absl::Status Synchronize() override {
    absl::Status s = FromCuda(cudaSetDevice(device_), "cudaSetDevice");
    if (!s.ok()) return s;
    return FromCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  absl::Status Copy(void* dst, const void* src, size_t size,
                    cudaMemcpyKind kind, const void* device_side) {
    absl::Status s = FromCuda(cudaSetDevice(device_), "cudaSetDevice");
    if (!s.ok()) return s;
    s = CheckDevicePointer(device_side, device_);
    if (!s.ok()) return s;
    return FromCuda(cudaMemcpyAsync(dst, src, size, kind, stream_),
                    "cudaMemcpyAsync");
  }

  const int device_;
  const cudaStream_t stream_;
};

class CudaDeviceMemory : public DeviceMemory {
 public:
  absl::string_view name() const override { return "cuda"; }

  absl::StatusOr<void*> AllocatePinned(size_t size) override {
    void* p = nullptr;
    absl::Status s = FromCuda(cudaHostAlloc(&p, size, cudaHostAllocPortable),
                              "cudaHostAlloc");
    if (!s.ok()) return s;
    return p;
  }

  void FreePinned(void* p) override { cudaFreeHost(p); }

  absl::StatusOr<std::unique_ptr<DeviceStream>> NewStream(
      int device) override {
    int count = 0;
    absl::Status s =
        FromCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (!s.ok()) return s;
    if (device < 0 || device >= count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA: no device ", device, " (", count, " visible)"));
    }
    s = FromCuda(cudaSetDevice(device), "cudaSetDevice");
    if (!s.ok()) return s;
    cudaStream_t stream = nullptr;
    s = FromCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
    if (!s.ok()) return s;
    return std::unique_ptr<DeviceStream>(new CudaStream(device, stream));
  }
};

}  // namespace

std::unique_ptr<DeviceMemory> NewCudaDeviceMemory() {
  return std::make_unique<CudaDeviceMemory>();
}

}  // namespace hymcache
