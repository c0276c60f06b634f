#include "client/cuda/cuda_device_memory.h"
#include "client/device_memory_select.h"

namespace hymcache {

std::unique_ptr<DeviceMemory> NewDeviceMemory() {
  return NewCudaDeviceMemory();
}

}  // namespace hymcache
