// The DeviceMemory this build links: CUDA under --config=cuda
// (cuda/cuda_device_memory.cc), else one that refuses device buffers with
// FailedPrecondition (device_memory_none.cc). Chosen by the //client:
// device_memory_select target's select() on --define=hymcache_cuda=1.
//
// Internal to the client library.
#pragma once

#include <memory>

#include "client/device_memory.h"

namespace hymcache {

std::unique_ptr<DeviceMemory> NewDeviceMemory();

}  // namespace hymcache
