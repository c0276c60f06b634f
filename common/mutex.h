// hymcache::Mutex, MutexLock, ReaderMutexLock and CondVar: absl::Mutex with
// ThreadSanitizer annotations.
//
// Why not absl::Mutex directly: Debian ships Abseil as an uninstrumented
// shared library, so under -fsanitize=thread the lock/unlock inside
// libabsl_synchronization.so is invisible and every guarded access is reported
// as a race. These wrappers forward to absl::Mutex and, in the tsan build
// (HYMCACHE_TSAN), tell TSan about each acquire and release. In every other
// build they compile to the absl calls. Thread-safety annotations
// (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED) work on these types as on
// absl::Mutex.
//
// Thread safety: as absl::Mutex.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#ifdef HYMCACHE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace hymcache {

// A hand-off through code TSan cannot see (Debian's uninstrumented gRPC
// running a callback on its own thread): everything a thread did before
// TsanRelease(p) happens before what another thread does after
// TsanAcquire(p). No-ops outside the tsan build.
inline void TsanRelease(void* p) {
#ifdef HYMCACHE_TSAN
  __tsan_release(p);
#else
  (void)p;
#endif
}
inline void TsanAcquire(void* p) {
#ifdef HYMCACHE_TSAN
  __tsan_acquire(p);
#else
  (void)p;
#endif
}

class CondVar;

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() {
#ifdef HYMCACHE_TSAN
    __tsan_mutex_create(this, 0);
#endif
  }
  ~Mutex() {
#ifdef HYMCACHE_TSAN
    __tsan_mutex_destroy(this, 0);
#endif
  }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    PreLock(0);
    mu_.Lock();
    PostLock(0);
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    PreUnlock(0);
    mu_.Unlock();
    PostUnlock(0);
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() {
    PreLock(kRead);
    mu_.ReaderLock();
    PostLock(kRead);
  }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() {
    PreUnlock(kRead);
    mu_.ReaderUnlock();
    PostUnlock(kRead);
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

  // Releases the mutex until `cond` is true, then re-acquires it.
  // REQUIRES: held exclusively.
  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    // absl releases and re-takes the lock inside Await and evaluates other
    // waiters' conditions there: keep TSan's ignore region open throughout.
    PreUnlock(0);
    mu_.Await(cond);
    PostUnlock(0);
    PreLock(0);
    PostLock(0);
  }
  // As Await, giving up at `deadline`. Returns whether `cond` holds.
  bool AwaitWithDeadline(const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    PreUnlock(0);
    bool ok = mu_.AwaitWithDeadline(cond, deadline);
    PostUnlock(0);
    PreLock(0);
    PostLock(0);
    return ok;
  }

 private:
  friend class CondVar;
#ifdef HYMCACHE_TSAN
  static constexpr unsigned kRead = __tsan_mutex_read_lock;
  void PreLock(unsigned f) { __tsan_mutex_pre_lock(this, f); }
  void PostLock(unsigned f) { __tsan_mutex_post_lock(this, f, 0); }
  void PreUnlock(unsigned f) { __tsan_mutex_pre_unlock(this, f); }
  void PostUnlock(unsigned f) { __tsan_mutex_post_unlock(this, f); }
#else
  static constexpr unsigned kRead = 1;
  void PreLock(unsigned) {}
  void PostLock(unsigned) {}
  void PreUnlock(unsigned) {}
  void PostUnlock(unsigned) {}
#endif

  mutable absl::Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Condition variable for hymcache::Mutex. Prefer Mutex::Await with an
// absl::Condition where the predicate is simple.
class CondVar {
 public:
  // REQUIRES: `mu` held exclusively.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    mu->PreUnlock(0);
    cv_.Wait(&mu->mu_);
    mu->PostUnlock(0);
    mu->PreLock(0);
    mu->PostLock(0);
  }
  // Returns true on timeout. REQUIRES: `mu` held exclusively.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    mu->PreUnlock(0);
    bool timed_out = cv_.WaitWithDeadline(&mu->mu_, deadline);
    mu->PostUnlock(0);
    mu->PreLock(0);
    mu->PostLock(0);
    return timed_out;
  }
  void Signal() { cv_.Signal(); }
  void SignalAll() { cv_.SignalAll(); }

 private:
  absl::CondVar cv_;
};

}  // namespace hymcache
