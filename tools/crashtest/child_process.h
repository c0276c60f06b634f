// ChildProcess: one daemon run as a child process of the crash test, started
// from a binary path and arguments, killed and started again at will.
//
// The child's stdout is a pipe: Start waits for its first line (the daemons
// print one line once they serve: their bound addresses). Its stderr is
// appended to a log file, so a daemon's log spans all its restarts. The
// child dies with the thread that started it (PR_SET_PDEATHSIG), so a crash
// test that dies leaves no daemon behind; start and stop children from one
// long-lived thread.
//
// Thread safety: not thread-safe; one owner thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hymcache::crashtest {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILLs a running child
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `binary` with `args`, stderr appended to `log_path`, and waits up
  // to `timeout` for the first line on its stdout (ready_line()).
  // Errors: FailedPrecondition (a child is running), Internal (pipe, fork,
  // log file), Unavailable (the child exited before its line; the exit is
  // described), DeadlineExceeded (no line in time; the child is killed).
  absl::Status Start(const std::string& binary,
                     const std::vector<std::string>& args,
                     const std::string& log_path, absl::Duration timeout);

  // Sends `sig` and waits up to `timeout` for the child to exit. Returns its
  // wait status. Errors: FailedPrecondition (no child), DeadlineExceeded
  // (still running; it stays running).
  absl::StatusOr<int> Signal(int sig, absl::Duration timeout);

  // Whether the child runs. When it has exited, reaps it and keeps its wait
  // status for exit_status().
  bool Alive();

  const std::string& ready_line() const { return ready_line_; }
  pid_t pid() const { return pid_; }
  // Wait status of the last child that was reaped (-1 if none).
  int exit_status() const { return exit_status_; }

 private:
  void Reap(int status);
  void CloseStdout();

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int exit_status_ = -1;
  std::string ready_line_;
};

// Runs `binary` with `args` to completion, its stdout written to
// `stdout_path` (truncated first) and its stderr appended to `stderr_path`,
// and returns its wait status. Errors: Internal (fork, the files),
// DeadlineExceeded (still running after `timeout`: killed).
absl::StatusOr<int> RunCommand(const std::string& binary,
                               const std::vector<std::string>& args,
                               const std::string& stdout_path,
                               const std::string& stderr_path,
                               absl::Duration timeout);

// "exit 3", "signal 9 (Killed)", ... for a wait status.
std::string DescribeWaitStatus(int status);

}  // namespace hymcache::crashtest
