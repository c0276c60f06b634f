#include "tools/crashtest/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hymcache::crashtest {

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
                                 const std::string& log_path,
                                 absl::Duration timeout) {
  if (pid_ > 0) return absl::FailedPreconditionError("a child is running");
  ready_line_.clear();
  const int log_fd =
      open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(
        absl::StrCat("open ", log_path, ": ", strerror(errno)));
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are allowed in a threaded parent.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // dup2 clears close-on-exec on the new descriptors.
    dup2(pipefd[1], 1);
    dup2(log_fd, 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the parent died before prctl
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  close(log_fd);
  pid_ = pid;
  stdout_fd_ = pipefd[0];

  const absl::Time deadline = absl::Now() + timeout;
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
                       absl::FormatDuration(timeout), " (got '", line,
                       "'); see ", log_path));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return absl::InternalError("poll");
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
                       DescribeWaitStatus(status), "); see ", log_path));
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

absl::StatusOr<int> RunCommand(const std::string& binary,
                               const std::vector<std::string>& args,
                               const std::string& stdout_path,
                               const std::string& stderr_path,
                               absl::Duration timeout) {
  const int out_fd =
      open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    return absl::InternalError(
        absl::StrCat("open ", stdout_path, ": ", strerror(errno)));
  }
  const int err_fd = open(stderr_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    close(out_fd);
    return absl::InternalError(
        absl::StrCat("open ", stderr_path, ": ", strerror(errno)));
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    close(err_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(absl::StrCat(
          binary, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace hymcache::crashtest
