// hymctl's tables: sizes, ages and node states as its commands print them,
// and rows as aligned columns.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/common.pb.h"

namespace hymcache::hymctl {

// "512 B", "1.5 KiB", "12.0 MiB".
std::string Human(uint64_t bytes);
// Prints rows as aligned columns.
void Table(std::ostream& out,
           const std::vector<std::vector<std::string>>& rows);
// Bytes in at most 5 characters: 512B, 1.5K, 12K, 123M (binary units).
std::string ShortBytes(uint64_t bytes);
// An age in at most 5 characters: 0.4s, 12s, 5m, 3h, 2d.
std::string ShortAge(absl::Duration d);
// A node's state as status, top and inspect show it.
std::string NodeState(const hymcache::v1::NodeInfo& n);
// Fits 80 columns in the narrow status table.
std::string NarrowState(const hymcache::v1::NodeInfo& n);
// The device kind of its first region ("" for none).
std::string DeviceKind(const hymcache::v1::NodeInfo& n);

}  // namespace hymcache::hymctl
