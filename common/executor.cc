#include "common/executor.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hymcache {

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    const ExecutorOptions& options) {
  if (options.name.empty() || options.threads < 1 || options.max_tasks < 1) {
    return absl::InvalidArgumentError(
        "executor: a name, threads >= 1 and max_tasks >= 1 are required");
  }
  std::unique_ptr<Executor> ex(new Executor(options));
  Executor* p = ex.get();
  for (int i = 0; i < options.threads; ++i) {
    absl::StatusOr<Thread> t = Thread::Start(options.name, [p] { p->Work(); });
    if (!t.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "executor ", options.name, ": ", t.status().message()));
    }
    ex->threads_.push_back(std::move(*t));
  }
  return ex;
}

Executor::~Executor() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (Thread& t : threads_) t.Join();
}

bool Executor::TrySubmit(std::function<void()> task) {
  MutexLock l(&mu_);
  if (stopping_ || queue_.size() + running_ >= options_.max_tasks) {
    return false;
  }
  queue_.push_back(std::move(task));
  cv_.Signal();
  return true;
}

size_t Executor::pending() const {
  MutexLock l(&mu_);
  return queue_.size() + running_;
}

void Executor::Work() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock l(&mu_);
      while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
      // Drain the queue before stopping: queued work holds promises.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    MutexLock l(&mu_);
    --running_;
  }
}

}  // namespace hymcache
