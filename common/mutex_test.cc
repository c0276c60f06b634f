#include "common/mutex.h"

#include <catch2/catch.hpp>
#include <vector>

#include "common/thread.h"

namespace hymcache {
namespace {

TEST_CASE("Mutex serialises increments across threads") {
  Mutex mu;
  long counter = 0;
  {
    std::vector<Thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back("mutex-test", [&] {
        for (int j = 0; j < 20000; ++j) {
          MutexLock l(&mu);
          ++counter;
        }
      });
    }
  }
  MutexLock l(&mu);
  CHECK(counter == 80000);
}

TEST_CASE("CondVar hands data from one thread to another") {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  int data = 0;
  Thread producer("producer", [&] {
    data = 42;  // published by the unlock below
    MutexLock l(&mu);
    ready = true;
    cv.Signal();
  });
  {
    MutexLock l(&mu);
    while (!ready) cv.Wait(&mu);
  }
  CHECK(data == 42);
}

TEST_CASE("Await with deadline times out when the condition stays false") {
  Mutex mu;
  bool never = false;
  MutexLock l(&mu);
  bool ok = mu.AwaitWithDeadline(absl::Condition(&never),
                                 absl::Now() + absl::Milliseconds(20));
  CHECK_FALSE(ok);
}

}  // namespace
}  // namespace hymcache
