#include "storage_node/device/tier_checksums.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace hymcache::storage {

const TierChecksum* TierChecksums::Find(uint64_t addr, uint64_t len) const {
  if (!verify_reads_) return nullptr;
  auto it = sums_.find(addr);
  if (it == sums_.end() || it->second.len != len) return nullptr;
  return &it->second;
}

void TierChecksums::Adopt(uint64_t addr, uint64_t len, uint32_t crc) {
  if (!verify_reads_) return;
  sums_[addr] = TierChecksum{len, crc, false};
}

void TierChecksums::Set(uint64_t addr, uint64_t len, uint64_t span,
                        uint32_t crc) {
  if (!verify_reads_) return;
  Erase(addr, span);
  sums_[addr] = TierChecksum{len, crc, false};
}

void TierChecksums::Erase(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  auto it = sums_.lower_bound(addr);
  if (it != sums_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.len > addr) it = prev;
  }
  while (it != sums_.end() && it->first < end) it = sums_.erase(it);
  auto overlaps = [addr, end](const Forget& f) {
    return f.range.addr < end && addr < f.range.addr + f.range.length;
  };
  queued_.erase(std::remove_if(queued_.begin(), queued_.end(), overlaps),
                queued_.end());
  for (Forget& f : forgetting_) {
    if (overlaps(f)) f.dropped = true;
  }
}

bool TierChecksums::MarkCorrupt(uint64_t addr, uint64_t len, uint32_t crc) {
  if (!verify_reads_) return false;
  auto it = sums_.find(addr);
  if (it == sums_.end() || it->second.len != len) return false;
  TierChecksum& sum = it->second;
  // Replaced by a write since the read began: that object is not this one.
  if (sum.crc != crc || sum.corrupt) return false;
  sum.corrupt = true;
  queued_.push_back(Forget{TierRange{addr, len, false, 0}, false, false});
  return true;
}

void TierChecksums::QueueDiscard(const TierRange& range) {
  queued_.push_back(Forget{range, true, false});
}

std::vector<TierRange> TierChecksums::StartForget() {
  forgetting_ = std::move(queued_);
  queued_.clear();
  std::vector<TierRange> ranges;
  ranges.reserve(forgetting_.size());
  for (const Forget& f : forgetting_) ranges.push_back(f.range);
  return ranges;
}

TierChecksums::ForgetCounts TierChecksums::FinishForget(bool ok) {
  ForgetCounts counts;
  for (const Forget& f : forgetting_) {
    if (ok) {
      ++(f.discarded ? counts.discarded : counts.corrupt);
    } else if (!f.dropped) {
      queued_.push_back(f);
    }
  }
  forgetting_.clear();
  return counts;
}

}  // namespace hymcache::storage
