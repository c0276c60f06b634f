// Tests only: Awaited<T> holds the value another thread hands over once (a
// callback's answer) and lets the test wait for it with a deadline. Our
// Mutex, not absl::Notification: the sanitizers see through it.
#pragma once

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace hymcache::testing {

template <typename T>
class Awaited {
 public:
  // Hands the value over (the first time; later calls are ignored).
  void Set(T value) {
    MutexLock l(&mu_);
    if (done_) return;
    value_ = std::move(value);
    done_ = true;
    set_.SignalAll();
  }
  // Whether it has been handed over.
  bool Done() const {
    MutexLock l(&mu_);
    return done_;
  }
  // Waits up to `timeout` for it; whether it has been handed over.
  bool WaitFor(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock l(&mu_);
    while (!done_ && !set_.WaitWithDeadline(&mu_, deadline)) {
    }
    return done_;
  }
  // The value (default-constructed until handed over).
  T Get() const {
    MutexLock l(&mu_);
    return value_;
  }

 private:
  mutable Mutex mu_;
  mutable CondVar set_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  T value_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace hymcache::testing
