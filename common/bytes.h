// Byte counts written by people: "1073741824", "1G", "256M", "64KiB", "2TB"
// (binary units: K = 1024).
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hymcache {

// Parses `s` (surrounding spaces allowed) into *out; false if it is not a
// count with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (any
// case), or overflows.
bool ParseBytes(absl::string_view s, uint64_t* out);

// `n` in the largest unit that divides it exactly ("1G", "256M", "1536K",
// "4095", "0"); ParseBytes reads it back.
std::string FormatBytes(uint64_t n);

}  // namespace hymcache
