// ChildProcess and Run: the one way tests, harnesses and the crash test
// start other programs (the daemons, hymctl, hymbench, etcd, Prometheus).
//
// A ChildProcess is started from a binary path and arguments and can be
// signalled, reaped and started again. By default Start waits for the
// child's first stdout line (the daemons print one once they serve: their
// bound addresses); stderr goes to a log file, or stays this process's.
// Run and RunCommand run a program to completion under a deadline.
//
// Everything the child needs (argv, envp, descriptors) is built before
// fork: between fork and exec a threaded parent may only make
// async-signal-safe calls.
//
// Thread safety: a ChildProcess is not thread-safe (one owner thread); Run,
// RunCommand and DescribeWaitStatus are safe from any thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hymcache::testing {

struct ChildOptions {
  // Added to the child's environment, "NAME=VALUE" each. Default: none.
  std::vector<std::string> env;
  // The child's stderr is appended to this file (so a daemon's log spans
  // its restarts); with wait_for_ready_line false its stdout too.
  // Default: "" = this process's stderr (and stdout).
  std::string log_path;
  // Wait for the first line on the child's stdout (ready_line()). false:
  // return once it is started; the caller checks readiness its own way.
  // Default: true.
  bool wait_for_ready_line = true;
  // Bound on that wait; then the child is killed. Default: 30 s.
  absl::Duration ready_timeout = absl::Seconds(30);
  // The child gets SIGKILL when the thread that started it exits
  // (PR_SET_PDEATHSIG), so a harness that dies leaves no child behind;
  // start and stop such children from one long-lived thread.
  // Default: false.
  bool die_with_starting_thread = false;
  // The network namespace the child runs in: a namespace file such as
  // /run/netns/NAME (a host of tests/netns/virtual_network.h). It is opened
  // before fork; the child joins it (setns) before exec. Default: "" = this
  // process's namespace.
  std::string netns_path;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILLs and reaps a running child
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `binary` with `args` as `options` say.
  // Errors: FailedPrecondition (a child is running), Internal (pipe, fork,
  // log file, the netns file; a child that cannot join the namespace exits
  // 125), Unavailable (the child exited before its ready line; the
  // exit is described), DeadlineExceeded (no line in time; the child is
  // killed).
  absl::Status Start(const std::string& binary,
                     const std::vector<std::string>& args,
                     const ChildOptions& options = {});

  // Sends `sig` and waits up to `timeout` for the child to exit. Returns its
  // wait status. Errors: FailedPrecondition (no child), DeadlineExceeded
  // (still running; it stays running).
  absl::StatusOr<int> Signal(int sig, absl::Duration timeout);

  // Whether the child runs. When it has exited, reaps it and keeps its wait
  // status for exit_status().
  bool Alive();

  const std::string& ready_line() const { return ready_line_; }
  // -1 when no child runs.
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

// A finished run of a binary: its exit status (waitpid form) and what it
// wrote to stdout and stderr (interleaved).
struct RunResult {
  int status = 0;
  std::string output;
};

// Runs `binary` with `args` to completion, capturing its output.
// Errors: Internal (pipe, fork), DeadlineExceeded (still running after
// `timeout`: killed; the message has its output so far).
absl::StatusOr<RunResult> Run(const std::string& binary,
                              const std::vector<std::string>& args,
                              absl::Duration timeout = absl::Seconds(30));

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

}  // namespace hymcache::testing
