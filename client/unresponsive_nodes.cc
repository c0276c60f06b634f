#include "client/unresponsive_nodes.h"

#include <glog/logging.h>

namespace hymcache {

void UnresponsiveNodes::Observe(uint32_t node, absl::Time started,
                                const absl::Status& first) {
  if (period_ <= absl::ZeroDuration()) return;
  const absl::Time now = clock_->Now();
  const bool silent =
      absl::IsDeadlineExceeded(first) && now - started >= kMinWait;
  MutexLock l(&mu_);
  if (!silent) {
    // It answered, refused, or had too little time to.
    until_.erase(node);
    return;
  }
  auto [it, fresh] = until_.try_emplace(node, now + period_);
  if (!fresh) {
    if (it->second > now) return;  // already marked
    it->second = now + period_;
  }
  ++marked_;
  LOG(WARNING) << "storage node " << node << " did not answer ("
               << first.message() << "); its blocks count as misses for "
               << absl::FormatDuration(period_);
}

bool UnresponsiveNodes::Skip(uint32_t node) {
  if (period_ <= absl::ZeroDuration()) return false;
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  auto it = until_.find(node);
  if (it == until_.end()) return false;
  if (it->second <= now) {
    until_.erase(it);  // tried again by this call
    return false;
  }
  ++skipped_;
  return true;
}

uint64_t UnresponsiveNodes::skipped() const {
  MutexLock l(&mu_);
  return skipped_;
}

uint64_t UnresponsiveNodes::marked() const {
  MutexLock l(&mu_);
  return marked_;
}

}  // namespace hymcache
