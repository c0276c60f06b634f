#include "common/range_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace hymcache {

absl::Status RangeAllocatorOptions::Validate() const {
  if (capacity == 0) {
    return absl::InvalidArgumentError("region capacity must be > 0");
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region alignment ", alignment, " is not a power of two"));
  }
  if (capacity < alignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("region capacity ", capacity,
                     " is smaller than its alignment ", alignment));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RangeAllocator>> RangeAllocator::Create(
    const RangeAllocatorOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  return std::unique_ptr<RangeAllocator>(new RangeAllocator(options));
}

RangeAllocator::RangeAllocator(const RangeAllocatorOptions& options)
    : capacity_(options.capacity),
      alignment_(options.alignment),
      usable_capacity_(options.capacity &
                       ~uint64_t{options.alignment - 1}) {
  AddFree(0, usable_capacity_);
}

void RangeAllocator::AddFree(uint64_t offset, uint64_t len) {
  free_by_offset_.emplace(offset, len);
  free_by_size_.emplace(len, offset);
}

void RangeAllocator::RemoveFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

bool RangeAllocator::CanFit(uint64_t len) const {
  if (len == 0 || len > usable_capacity_) return false;
  return largest_free() >= RoundUp(len);
}

uint64_t RangeAllocator::largest_free() const {
  if (free_by_size_.empty()) return 0;
  return free_by_size_.rbegin()->first;
}

absl::StatusOr<uint64_t> RangeAllocator::Allocate(uint64_t len) {
  if (len == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  if (len > usable_capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocation of ", len, " bytes exceeds region size ", usable_capacity_));
  }
  std::optional<uint64_t> offset = TryAllocate(len);
  if (!offset.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no free extent of ", RoundUp(len), " bytes (free ",
                     free_bytes(), ", largest extent ", largest_free(), ")"));
  }
  return *offset;
}

std::optional<uint64_t> RangeAllocator::TryAllocate(uint64_t len) {
  if (len == 0 || len > usable_capacity_) return std::nullopt;
  const uint64_t need = RoundUp(len);
  // Best fit: the smallest extent of length >= need, lowest offset on ties.
  auto fit = free_by_size_.lower_bound({need, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const uint64_t ext_len = fit->first;
  const uint64_t offset = fit->second;
  RemoveFree(free_by_offset_.find(offset));
  if (ext_len > need) AddFree(offset + need, ext_len - need);
  allocated_.emplace(offset, need);
  used_bytes_ += need;
  return offset;
}

absl::Status RangeAllocator::Free(uint64_t offset) {
  if (offset >= usable_capacity_ || (offset & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "free of offset ", offset, " outside the region or misaligned"));
  }
  auto a = allocated_.find(offset);
  if (a == allocated_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no allocation starts at offset ", offset));
  }
  uint64_t start = offset;
  uint64_t len = a->second;
  allocated_.erase(a);
  used_bytes_ -= len;

  // Coalesce with the following extent.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + len) {
    len += next->second;
    auto to_remove = next++;
    RemoveFree(to_remove);
  }
  // Coalesce with the preceding extent.
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      RemoveFree(prev);
    }
  }
  AddFree(start, len);
  return absl::OkStatus();
}

absl::Status RangeAllocator::Reserve(uint64_t offset, uint64_t len) {
  if (len == 0) return absl::InvalidArgumentError("cannot reserve 0 bytes");
  if ((offset & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve offset ", offset, " is not aligned to ", alignment_));
  }
  if (offset >= usable_capacity_ || len > usable_capacity_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve [", offset, ", +", len,
                     ") leaves the region of ", usable_capacity_, " bytes"));
  }
  const uint64_t need = RoundUp(len);
  if (need > usable_capacity_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserve [", offset, ", +", need,
                     ") leaves the region of ", usable_capacity_, " bytes"));
  }
  // The range must lie inside one free extent: the last extent starting at
  // or before `offset`.
  auto it = free_by_offset_.upper_bound(offset);
  if (it == free_by_offset_.begin()) {
    return absl::AlreadyExistsError(
        absl::StrCat("range at ", offset, " overlaps an allocation"));
  }
  --it;
  const uint64_t ext_start = it->first;
  const uint64_t ext_len = it->second;
  if (offset + need > ext_start + ext_len) {
    return absl::AlreadyExistsError(absl::StrCat(
        "range [", offset, ", +", need, ") overlaps an allocation"));
  }
  RemoveFree(it);
  if (offset > ext_start) AddFree(ext_start, offset - ext_start);
  if (offset + need < ext_start + ext_len) {
    AddFree(offset + need, ext_start + ext_len - offset - need);
  }
  allocated_.emplace(offset, need);
  used_bytes_ += need;
  return absl::OkStatus();
}

namespace {

// Sorts `v` by offset (first): an LSD radix sort, 16 bits a pass, over
// the offsets' significant bits. A restart sorts every object's range of a
// region: 10 M took about a second with std::sort, whose pivots the
// allocation order defeats (it fell back to heapsort).
void SortByOffset(std::vector<std::pair<uint64_t, uint64_t>>* v) {
  if (v->size() < 4096) {
    std::sort(v->begin(), v->end());
    return;
  }
  uint64_t max = 0;
  for (const auto& r : *v) max = std::max(max, r.first);
  std::vector<std::pair<uint64_t, uint64_t>> tmp(v->size());
  std::vector<size_t> count(size_t{1} << 16);
  for (int shift = 0; shift < 64 && (max >> shift) != 0; shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (const auto& r : *v) ++count[(r.first >> shift) & 0xffff];
    if (count[(max >> shift) & 0xffff] == v->size()) continue;  // one digit
    size_t sum = 0;
    for (size_t& c : count) {
      const size_t n = c;
      c = sum;
      sum += n;
    }
    for (const auto& r : *v) tmp[count[(r.first >> shift) & 0xffff]++] = r;
    v->swap(tmp);
  }
}

}  // namespace

absl::Status RangeAllocator::ReserveAll(
    std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  if (!allocated_.empty()) {
    return absl::FailedPreconditionError(
        "ReserveAll needs an allocator without allocations");
  }
  for (auto& [offset, len] : ranges) {
    if (len == 0) return absl::InvalidArgumentError("cannot reserve 0 bytes");
    if ((offset & (alignment_ - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reserve offset ", offset, " is not aligned to ", alignment_));
    }
    if (offset >= usable_capacity_ || len > usable_capacity_ - offset ||
        RoundUp(len) > usable_capacity_ - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("reserve [", offset, ", +", len,
                       ") leaves the region of ", usable_capacity_, " bytes"));
    }
    len = RoundUp(len);
  }
  SortByOffset(&ranges);
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].first + ranges[i - 1].second > ranges[i].first) {
      return absl::AlreadyExistsError(absl::StrCat(
          "range [", ranges[i].first, ", +", ranges[i].second,
          ") overlaps an allocation"));
    }
  }
  // The free extents are the gaps, found in address order: each goes at
  // the end of free_by_offset_ (a hinted insert, no search).
  free_by_offset_.clear();
  free_by_size_.clear();
  allocated_.reserve(ranges.size());
  uint64_t cursor = 0;
  constexpr size_t kAhead = 8;  // the table's misses overlap
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i + kAhead < ranges.size())
      allocated_.prefetch(ranges[i + kAhead].first);
    const auto& [offset, len] = ranges[i];
    if (offset > cursor) {
      free_by_offset_.emplace_hint(free_by_offset_.end(), cursor,
                                   offset - cursor);
      free_by_size_.emplace(offset - cursor, cursor);
    }
    allocated_.emplace(offset, len);
    used_bytes_ += len;
    cursor = offset + len;
  }
  if (cursor < usable_capacity_) {
    free_by_offset_.emplace_hint(free_by_offset_.end(), cursor,
                                 usable_capacity_ - cursor);
    free_by_size_.emplace(usable_capacity_ - cursor, cursor);
  }
  return absl::OkStatus();
}

}  // namespace hymcache
