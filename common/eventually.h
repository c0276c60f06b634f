// Tests only: Eventually() waits, with a deadline, for a condition that
// another thread or process makes true (instead of sleeping a fixed time).
#pragma once

#include <algorithm>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hymcache::testing {

// Polls `pred` until it holds and returns true; false if it still does not
// hold at the deadline `timeout` from now (checked once more then). Polls
// after 1 ms, then backs off to at most every `max_interval`, so a fast
// condition is seen at once and a slow one costs little CPU.
inline bool Eventually(const std::function<bool()>& pred,
                       absl::Duration timeout = absl::Seconds(20),
                       absl::Duration max_interval = absl::Milliseconds(50)) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration interval = absl::Milliseconds(1);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(std::min(interval, deadline - absl::Now()));
    interval = std::min(interval * 2, max_interval);
  }
  return pred();
}

}  // namespace hymcache::testing
