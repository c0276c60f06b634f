// Thread: a named OS thread owned by the component that starts it, joined when
// the owner is destroyed. Every thread in HyMCache is one of these (or a gRPC
// callback thread), so `top -H` and gdb show who is who.
//
// Thread safety: Start/Join from the owning thread only.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace hymcache {

class Thread {
 public:
  Thread() = default;
  // Starts `fn` on a new thread named `name` (truncated to 15 characters).
  // Throws std::system_error when the OS refuses a thread: tests and tools
  // only; libraries and daemons use Start().
  Thread(std::string name, std::function<void()> fn);
  ~Thread() { Join(); }
  Thread(Thread&&) = default;
  Thread& operator=(Thread&& other) {
    Join();
    t_ = std::move(other.t_);
    return *this;
  }

  // Starts `fn` on a new thread named `name` (truncated to 15 characters).
  // ResourceExhausted, naming the thread and the reason, when it cannot
  // start (the process's thread or pid limit, no memory for a stack).
  static absl::StatusOr<Thread> Start(std::string name,
                                      std::function<void()> fn);

  // Waits for the thread to finish. Idempotent.
  void Join() {
    if (t_.joinable()) t_.join();
  }
  bool joinable() const { return t_.joinable(); }

 private:
  std::thread t_;
};

}  // namespace hymcache
