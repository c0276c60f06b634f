// RangeAllocator: hands out byte ranges of one address space [0, capacity).
// Shared by the master (RegionAllocator, master/allocator.h: the space of
// each storage-node region, for its placement decisions; the storage nodes
// only serve reads and writes at the offsets it chose) and the hybrid
// device (storage_node/device/hybrid_device.h: its staging window and its
// write buffer, 4 KiB alignment).
//
// Policy: every allocation starts at a multiple of the alignment and its
// length is rounded up to the alignment. Allocate picks the smallest free
// extent that fits (best fit, lowest offset on ties), Free coalesces with both
// neighbours, so freed space is reused and fragmentation stays bounded.
// Whether one allocation fits depends only on the largest free extent, not
// on the fit policy (which extents remain afterwards does: best fit keeps
// large extents whole); best fit finds its extent in O(log n) where first
// fit scans the free list.
// Reserve marks an exact range as allocated; the master uses it to rebuild the
// allocator from persisted objects after a restart.
//
// Only whole alignment units are usable: a capacity that is not a multiple of
// the alignment loses its tail (usable_capacity() tells how much is usable).
//
// Thread safety: not thread-safe; the owner serializes calls (MasterService
// under its lock, HybridDevice under its mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hymcache {

struct RangeAllocatorOptions {
  // Size of the address space in bytes. Must be > 0. Default: 0 (must be set).
  uint64_t capacity = 0;
  // Every allocation starts at a multiple of this and its length is rounded
  // up to it. A power of two. Default: 64.
  uint32_t alignment = 64;

  absl::Status Validate() const;
};

class RangeAllocator {
 public:
  // Errors: InvalidArgument if `options` is invalid.
  static absl::StatusOr<std::unique_ptr<RangeAllocator>> Create(
      const RangeAllocatorOptions& options);

  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;

  // Allocates `len` bytes (rounded up to the alignment) and returns the
  // aligned offset. Errors: InvalidArgument if len == 0; ResourceExhausted if
  // no free extent is large enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t len);
  // Allocate without building an error, for callers that retry as space is
  // freed (a full window is their normal state): nullopt when len == 0 or
  // no free extent is large enough.
  std::optional<uint64_t> TryAllocate(uint64_t len);

  // Releases the allocation that starts at `offset`. Errors: InvalidArgument
  // if `offset` is outside the region or misaligned; NotFound if no
  // allocation starts there (e.g. a double free). Nothing changes on error.
  absl::Status Free(uint64_t offset);

  // Marks [offset, offset + round_up(len)) as one allocation, as if Allocate
  // had returned `offset`. Errors: InvalidArgument if len == 0, `offset` is
  // misaligned or the range leaves the region; AlreadyExists if any byte of
  // the range is already allocated. Nothing changes on error.
  absl::Status Reserve(uint64_t offset, uint64_t len);

  // Marks every (offset, len) range of `ranges` (any order) as one
  // allocation, as Reserve of each would, in O(n log n) with sequential
  // memory access instead of a tree search per range: the master's restart
  // path. All or nothing. Errors: FailedPrecondition if the allocator already
  // holds an allocation; InvalidArgument (naming the first such range) as
  // Reserve for a range of length 0, misaligned or leaving the region;
  // AlreadyExists if two ranges overlap. Nothing changes on error.
  absl::Status ReserveAll(std::vector<std::pair<uint64_t, uint64_t>> ranges);

  // Whether the allocator could satisfy Allocate(len) right now.
  bool CanFit(uint64_t len) const;

  // Bytes in allocations (rounded lengths).
  uint64_t used_bytes() const { return used_bytes_; }
  // usable_capacity() - used_bytes().
  uint64_t free_bytes() const { return usable_capacity_ - used_bytes_; }
  // Size of the largest free extent (the largest Allocate that can succeed).
  uint64_t largest_free() const;
  uint64_t capacity() const { return capacity_; }
  uint64_t usable_capacity() const { return usable_capacity_; }
  uint32_t alignment() const { return alignment_; }
  size_t allocation_count() const { return allocated_.size(); }
  size_t free_extent_count() const { return free_by_offset_.size(); }

 private:
  explicit RangeAllocator(const RangeAllocatorOptions& options);

  // Rounds up to the alignment; `len` must be <= usable_capacity_.
  uint64_t RoundUp(uint64_t len) const {
    return (len + alignment_ - 1) & ~uint64_t{alignment_ - 1};
  }
  void AddFree(uint64_t offset, uint64_t len);
  void RemoveFree(std::map<uint64_t, uint64_t>::iterator it);

  // Constant after construction.
  const uint64_t capacity_;
  const uint32_t alignment_;
  const uint64_t usable_capacity_;

  // Free extents, disjoint and never adjacent (always coalesced).
  std::map<uint64_t, uint64_t> free_by_offset_;   // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
  // Allocations: offset -> rounded length.
  absl::flat_hash_map<uint64_t, uint64_t> allocated_;
  uint64_t used_bytes_ = 0;
};

}  // namespace hymcache
