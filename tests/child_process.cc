#include "tests/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hymcache::testing {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

// Forks and execs `binary` with `args` and this process's environment plus
// `env`. In the child, `out_fd` and `err_fd` (when >= 0) become stdout and
// stderr; with `die_with_thread`, the child gets SIGKILL when the calling
// thread exits; with `netns_fd` >= 0 it joins that network namespace (exit
// 125 if it cannot). Returns the child's pid.
absl::StatusOr<pid_t> Launch(const std::string& binary,
                             const std::vector<std::string>& args,
                             const std::vector<std::string>& env, int out_fd,
                             int err_fd, bool die_with_thread,
                             int netns_fd = -1) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // In a namespace, the child's exec (or its failure) is waited for: a
  // child still on its way into the namespace when the namespace is
  // deleted (VirtualNetwork's end kills what `ip netns pids` lists) would
  // join it anyway through its descriptor and escape the kill.
  int exec_pipe[2] = {-1, -1};
  if (netns_fd >= 0 && pipe2(exec_pipe, O_CLOEXEC) != 0) return Errno("pipe");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (exec_pipe[0] >= 0) {
      close(exec_pipe[0]);
      close(exec_pipe[1]);
    }
    return Errno("fork");
  }
  if (pid == 0) {
    // dup2 clears close-on-exec on the new descriptors.
    if (out_fd >= 0) dup2(out_fd, 1);
    if (err_fd >= 0) dup2(err_fd, 2);
    if (die_with_thread) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);  // the parent died before prctl
    }
    if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) _exit(125);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (exec_pipe[0] >= 0) {
    close(exec_pipe[1]);
    // End of file: the child exec'd (the pipe closed on exec) or exited.
    char c;
    while (read(exec_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    close(exec_pipe[0]);
  }
  return pid;
}

// Waits up to `timeout` for `pid` to exit; its wait status. SIGKILLs it
// (and reaps it) when the time is up: DeadlineExceeded.
absl::StatusOr<int> WaitOrKill(pid_t pid, const std::string& binary,
                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(absl::StrCat(
          binary, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  CloseStdout();
}

void ChildProcess::CloseStdout() {
  if (stdout_fd_ >= 0) {
    close(stdout_fd_);
    stdout_fd_ = -1;
  }
}

void ChildProcess::Reap(int status) {
  pid_ = -1;
  exit_status_ = status;
  CloseStdout();
}

absl::Status ChildProcess::Start(const std::string& binary,
                                 const std::vector<std::string>& args,
                                 const ChildOptions& options) {
  if (pid_ > 0) return absl::FailedPreconditionError("a child is running");
  ready_line_.clear();
  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(),
                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return Errno(absl::StrCat("open ", options.log_path));
  }
  int netns_fd = -1;
  if (!options.netns_path.empty()) {
    netns_fd = open(options.netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns_fd < 0) {
      if (log_fd >= 0) close(log_fd);
      return Errno(absl::StrCat("open ", options.netns_path));
    }
  }
  int pipefd[2] = {-1, -1};
  if (options.wait_for_ready_line && pipe2(pipefd, O_CLOEXEC) != 0) {
    if (log_fd >= 0) close(log_fd);
    if (netns_fd >= 0) close(netns_fd);
    return Errno("pipe");
  }
  absl::StatusOr<pid_t> pid =
      Launch(binary, args, options.env,
             options.wait_for_ready_line ? pipefd[1] : log_fd, log_fd,
             options.die_with_starting_thread, netns_fd);
  if (pipefd[1] >= 0) close(pipefd[1]);
  if (log_fd >= 0) close(log_fd);
  if (netns_fd >= 0) close(netns_fd);
  if (!pid.ok()) {
    if (pipefd[0] >= 0) close(pipefd[0]);
    return pid.status();
  }
  pid_ = *pid;
  stdout_fd_ = pipefd[0];
  if (!options.wait_for_ready_line) return absl::OkStatus();

  const std::string see_log =
      options.log_path.empty() ? "" : absl::StrCat("; see ", options.log_path);
  const absl::Time deadline = absl::Now() + options.ready_timeout;
  std::string line;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      Reap(status);
      return absl::DeadlineExceededError(
          absl::StrCat(binary, " printed no ready line within ",
                       absl::FormatDuration(options.ready_timeout), " (got '",
                       line, "')", see_log));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return Errno("poll");
    if (r <= 0) continue;
    char c;
    const ssize_t n = read(stdout_fd_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      waitpid(pid_, &status, 0);
      Reap(status);
      return absl::UnavailableError(
          absl::StrCat(binary, " exited before it was ready (",
                       DescribeWaitStatus(status), ")", see_log));
    }
    if (c == '\n') break;
    line.push_back(c);
  }
  ready_line_ = std::move(line);
  return absl::OkStatus();
}

absl::StatusOr<int> ChildProcess::Signal(int sig, absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child running");
  kill(pid_, sig);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      Reap(status);
      return status;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " did not exit within ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

bool ChildProcess::Alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    Reap(status);
    return false;
  }
  return true;
}

absl::StatusOr<RunResult> Run(const std::string& binary,
                              const std::vector<std::string>& args,
                              absl::Duration timeout) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return Errno("pipe");
  absl::StatusOr<pid_t> pid =
      Launch(binary, args, {}, pipefd[1], pipefd[1], false);
  close(pipefd[1]);
  if (!pid.ok()) {
    close(pipefd[0]);
    return pid.status();
  }
  RunResult r;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      timed_out = true;
      kill(*pid, SIGKILL);
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    const int n_ready =
        poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n_ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  waitpid(*pid, &r.status, 0);
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(binary, " did not exit: '", r.output, "'"));
  }
  return r;
}

absl::StatusOr<int> RunCommand(const std::string& binary,
                               const std::vector<std::string>& args,
                               const std::string& stdout_path,
                               const std::string& stderr_path,
                               absl::Duration timeout) {
  const int out_fd =
      open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) return Errno(absl::StrCat("open ", stdout_path));
  const int err_fd = open(stderr_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    close(out_fd);
    return Errno(absl::StrCat("open ", stderr_path));
  }
  absl::StatusOr<pid_t> pid =
      Launch(binary, args, {}, out_fd, err_fd, /*die_with_thread=*/true);
  close(out_fd);
  close(err_fd);
  if (!pid.ok()) return pid.status();
  return WaitOrKill(*pid, binary, timeout);
}

}  // namespace hymcache::testing
