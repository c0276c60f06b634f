#include "storage_node/device/memory_device.h"

#include "absl/strings/str_cat.h"

namespace hymcache::storage {

absl::Status CheckRange(uint64_t capacity, uint64_t addr, uint64_t len) {
  if (len == 0) {
    return absl::InvalidArgumentError("empty range");
  }
  if (addr > capacity || len > capacity - addr) {
    return absl::OutOfRangeError(
        absl::StrCat("range [", addr, ", +", len, ") outside the region of ",
                     capacity, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> LocateInAreas(
    const std::vector<MemoryArea>& areas, const uint8_t* p, uint64_t len) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  for (const MemoryArea& a : areas) {
    const auto base = reinterpret_cast<uintptr_t>(a.base);
    if (addr >= base && addr - base <= a.length &&
        len <= a.length - (addr - base)) {
      return std::make_pair(a.area_id, static_cast<uint64_t>(addr - base));
    }
  }
  return absl::NotFoundError("memory not in any exposed area");
}

}  // namespace hymcache::storage
