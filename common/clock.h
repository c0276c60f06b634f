// Clock: the source of time for leases, heartbeats and timeouts, injected so
// that tests control time instead of sleeping (FakeClock, common/fake_clock.h).
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hymcache {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock. Never deleted.
  static Clock* Real();
};

}  // namespace hymcache
