// Executor: a named, bounded pool of threads running queued tasks. Every
// background thread of the client library belongs to one (stores, releases
// of cancelled prefetches), so work is bounded and visible by name in
// debuggers and `top -H`.
//
//   auto ex = Executor::Create({.name = "hym-store", .threads = 2});
//   if (!(*ex)->TrySubmit([] { ... })) { /* queue full: skip the work */ }
//
// Thread safety: safe for concurrent use. The destructor runs every task
// already queued, then joins the threads.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {

struct ExecutorOptions {
  // Thread name (at most 15 characters are kept). Required.
  std::string name;
  // Worker threads. Default: 1.
  int threads = 1;
  // Most tasks queued or running; TrySubmit refuses beyond. Default: 1024.
  size_t max_tasks = 1024;
};

class Executor {
 public:
  // Errors: InvalidArgument (no name, threads < 1, max_tasks < 1),
  // ResourceExhausted (a thread cannot be started).
  static absl::StatusOr<std::unique_ptr<Executor>> Create(
      const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; false (and `task` is dropped) when max_tasks are queued
  // or running, or the executor is shutting down. Never blocks.
  bool TrySubmit(std::function<void()> task);

  // Tasks queued or running.
  size_t pending() const;

 private:
  explicit Executor(const ExecutorOptions& options) : options_(options) {}
  void Work();

  const ExecutorOptions options_;
  std::vector<Thread> threads_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache
