#include "common/executor.h"

#include <catch2/catch.hpp>

#include <atomic>

#include "absl/synchronization/notification.h"

namespace hymcache {
namespace {

TEST_CASE("tasks run on the executor's threads, bounded by max_tasks") {
  auto ex = Executor::Create({.name = "test-exec", .threads = 2, .max_tasks = 3});
  REQUIRE(ex.ok());
  absl::Notification release;
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    REQUIRE((*ex)->TrySubmit([&] {
      release.WaitForNotification();
      ++ran;
    }));
  }
  // Two running, one queued: the fourth is refused at once.
  CHECK_FALSE((*ex)->TrySubmit([&] { ++ran; }));
  CHECK((*ex)->pending() == 3);
  release.Notify();
  ex->reset();  // runs what was queued, joins
  CHECK(ran == 3);
}

TEST_CASE("queued tasks run before the executor is destroyed") {
  std::atomic<int> ran{0};
  {
    auto ex = Executor::Create({.name = "test-exec", .threads = 1});
    REQUIRE(ex.ok());
    for (int i = 0; i < 100; ++i) REQUIRE((*ex)->TrySubmit([&] { ++ran; }));
  }
  CHECK(ran == 100);
}

TEST_CASE("bad executor options are refused") {
  CHECK_FALSE(Executor::Create({.name = "", .threads = 1}).ok());
  CHECK_FALSE(Executor::Create({.name = "x", .threads = 0}).ok());
  CHECK_FALSE(Executor::Create({.name = "x", .threads = 1, .max_tasks = 0}).ok());
}

}  // namespace
}  // namespace hymcache
