#include "storage_node/device/flush_policy.h"

#include <algorithm>
#include <cmath>

namespace hymcache::storage {

double FlushPolicy::Fill(const FlushPolicyState& s) {
  if (s.buffer_bytes == 0) return 0;
  return std::min(1.0, static_cast<double>(s.buffer_used) /
                           static_cast<double>(s.buffer_bytes));
}

bool FlushPolicy::Due(const FlushPolicyState& s,
                      absl::Duration* recheck_after) const {
  *recheck_after = absl::InfiniteDuration();
  if (!s.any_waiting) return false;
  if (s.forced || !s.reads_busy) return true;
  if (s.unflushed_bytes >= o_.flush_batch_bytes) return true;
  if (Fill(s) >= o_.high_watermark) return true;
  if (o_.max_delay == absl::InfiniteDuration()) return false;
  if (s.oldest_waiting_age >= o_.max_delay) return true;
  *recheck_after = o_.max_delay - s.oldest_waiting_age;
  return false;
}

int FlushPolicy::WriteSlots(const FlushPolicyState& s) const {
  const int depth = std::max(1, o_.queue_depth);
  const int floor = s.reads_busy ? o_.depth_under_pressure : o_.depth_idle;
  const int proportional =
      static_cast<int>(std::ceil(static_cast<double>(depth) * Fill(s)));
  const int cap = std::max(1, depth * 3 / 4);
  return std::max(1, std::min(std::max(floor, proportional),
                              std::max(cap, floor)));
}

}  // namespace hymcache::storage
