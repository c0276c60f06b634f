#include "common/thread.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "catch2/catch.hpp"

namespace hymcache {
namespace {

TEST_CASE("Thread::Start runs the function on a thread of that name") {
  std::string name;
  absl::StatusOr<Thread> t = Thread::Start("a-long-thread-name-here", [&] {
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    name = buf;
  });
  REQUIRE(t.ok());
  CHECK(t->joinable());
  t->Join();
  CHECK_FALSE(t->joinable());
  CHECK(name == "a-long-thread-n");
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// Bytes of address space this process maps now.
uint64_t MappedBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST_CASE("Thread::Start is ResourceExhausted when the OS refuses a thread") {
  // In a child whose address space has no room for another thread's stack
  // (RLIMIT_NPROC does not bind root; RLIMIT_AS does).
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct rlimit stack;
    getrlimit(RLIMIT_STACK, &stack);
    struct rlimit as;
    as.rlim_cur = as.rlim_max = MappedBytes() + (1 << 20);
    if (setrlimit(RLIMIT_AS, &as) != 0) _exit(10);
    // glibc reuses the stacks of joined threads: start blocked threads until
    // the cached ones are used up and a new stack is needed.
    absl::Notification release;
    std::vector<Thread> running;
    absl::Status refused;
    for (int i = 0; i < 64 && refused.ok(); ++i) {
      absl::StatusOr<Thread> t = Thread::Start("refused", [&] {
        release.WaitForNotification();
      });
      if (t.ok()) {
        running.push_back(std::move(*t));
      } else {
        refused = t.status();
      }
    }
    release.Notify();
    for (Thread& t : running) t.Join();
    if (refused.ok()) _exit(11);
    const bool named = refused.message().find("cannot start thread refused") !=
                       std::string::npos;
    _exit(absl::IsResourceExhausted(refused) && named ? 0 : 12);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

}  // namespace
}  // namespace hymcache
