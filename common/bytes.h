// Byte counts written by people: "1073741824", "1G", "256M", "64KiB", "2TB"
// (binary units: K = 1024).
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace hymcache {

// Parses `s` (surrounding spaces allowed) into *out; false if it is not a
// count with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (any
// case), or overflows.
bool ParseBytes(absl::string_view s, uint64_t* out);

}  // namespace hymcache
