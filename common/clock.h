// Clock: the source of time for leases, heartbeats and timeouts, injected so
// that tests control time instead of sleeping.
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace hymcache {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock. Never deleted.
  static Clock* Real();
};

// A clock that moves only when told to. Testonly in spirit; small enough to
// live beside the interface.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24))
      : now_(start) {}
  absl::Time Now() const override {
    MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
