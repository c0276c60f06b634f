// FakeClock: a Clock that moves only when told to, for tests (testonly, beside
// the Clock interface in common/clock.h).
//
// Thread safety: safe for concurrent use.
#pragma once

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace hymcache {

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
