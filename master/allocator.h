// RegionAllocator: the master's allocator of one storage-node region's
// space is the shared RangeAllocator (common/range_allocator.h, best fit,
// tested there); these names keep the master's code unchanged.
#pragma once

#include "common/range_allocator.h"

namespace hymcache {
namespace master {

using RegionAllocatorOptions = ::hymcache::RangeAllocatorOptions;
using RegionAllocator = ::hymcache::RangeAllocator;

}  // namespace master
}  // namespace hymcache
