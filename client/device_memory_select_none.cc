#include "client/device_memory_select.h"

namespace hymcache {

std::unique_ptr<DeviceMemory> NewDeviceMemory() { return NewNoDeviceMemory(); }

}  // namespace hymcache
