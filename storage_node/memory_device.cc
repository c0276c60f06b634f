#include "storage_node/memory_device.h"

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

}  // namespace hymcache::storage
