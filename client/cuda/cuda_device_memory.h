// The CUDA runtime behind DeviceMemory (client/device_memory.h): pinned
// memory from cudaHostAlloc, copies with cudaMemcpyAsync on a
// non-blocking stream of the buffers' device, completion with
// cudaStreamSynchronize; CUDA errors become absl::Status (Internal, or
// InvalidArgument for a bad device or pointer, ResourceExhausted for
// memory). Linked only under `bazel build --config=cuda`.
//
// Internal to the client library. Thread safety: as DeviceMemory.
#pragma once

#include <memory>

#include "client/device_memory.h"

namespace hymcache {

std::unique_ptr<DeviceMemory> NewCudaDeviceMemory();

}  // namespace hymcache
