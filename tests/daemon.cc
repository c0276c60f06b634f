#include "tests/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hymcache::testing {

std::string RunfilePath(const std::string& rel) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return rel;
  return absl::StrCat(srcdir, "/", ws ? ws : "hymcache", "/", rel);
}

std::string TempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid(),
                                 "-", counter.fetch_add(1));
  mkdir(dir.c_str(), 0755);
  return dir;
}

Daemon::~Daemon() { Reset(); }

void Daemon::Reset() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  if (stdout_fd_ >= 0) {
    close(stdout_fd_);
    stdout_fd_ = -1;
  }
}

Daemon::Daemon(Daemon&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      stdout_fd_(std::exchange(o.stdout_fd_, -1)),
      ready_line_(std::move(o.ready_line_)) {}

Daemon& Daemon::operator=(Daemon&& o) noexcept {
  if (this != &o) {
    Reset();
    pid_ = std::exchange(o.pid_, -1);
    stdout_fd_ = std::exchange(o.stdout_fd_, -1);
    ready_line_ = std::move(o.ready_line_);
  }
  return *this;
}

namespace {

// In the child after fork: execs `binary` with `args` and environ + `env`.
[[noreturn]] void Exec(const std::string& binary,
                       const std::vector<std::string>& args,
                       const std::vector<std::string>& env) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  execve(binary.c_str(), argv.data(), envp.data());
  _exit(127);
}

}  // namespace

absl::StatusOr<Daemon> Daemon::Start(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     absl::Duration timeout,
                                     const std::vector<std::string>& env) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    dup2(pipefd[1], 1);
    Exec(binary, args, env);
  }
  close(pipefd[1]);
  Daemon d;
  d.pid_ = pid;
  d.stdout_fd_ = pipefd[0];
  absl::Time deadline = absl::Now() + timeout;
  std::string line;
  while (true) {
    int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(binary, " did not report ready: '", line, "'"));
    }
    pollfd p{d.stdout_fd_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char c;
    ssize_t n = read(d.stdout_fd_, &c, 1);
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat(binary, " exited before it was ready"));
    }
    if (c == '\n') break;
    line.push_back(c);
  }
  d.ready_line_ = line;
  return d;
}

absl::StatusOr<Daemon> Daemon::Spawn(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     const std::string& log_path) {
  const int log =
      open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("open ", log_path));
  pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::InternalError("fork");
  }
  if (pid == 0) {
    dup2(log, 1);
    dup2(log, 2);
    Exec(binary, args, {});
  }
  close(log);
  Daemon d;
  d.pid_ = pid;
  return d;
}

absl::StatusOr<int> Daemon::Stop(int sig, absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  kill(pid_, sig);
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    usleep(10000);
  }
  return absl::DeadlineExceededError("daemon did not exit");
}

bool Daemon::Alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

absl::StatusOr<RunResult> Run(const std::string& binary,
                              const std::vector<std::string>& args,
                              absl::Duration timeout) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    Exec(binary, args, {});
  }
  close(pipefd[1]);
  RunResult r;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  while (true) {
    int left =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  waitpid(pid, &r.status, 0);
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(binary, " did not exit: '", r.output, "'"));
  }
  return r;
}

std::string Field(const std::string& line, const std::string& key) {
  for (absl::string_view part : absl::StrSplit(line, ' ')) {
    if (absl::StartsWith(part, key + "=")) {
      return std::string(part.substr(key.size() + 1));
    }
  }
  return "";
}

absl::StatusOr<MasterProcess> MasterProcess::Start(
    const std::string& db_path, const std::string& listen,
    std::vector<std::string> extra) {
  std::vector<std::string> args = {"--db_path=" + db_path, "--listen=" + listen,
                                   "--logtostderr"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto d = Daemon::Start(RunfilePath("master/hymcache-master"), args);
  if (!d.ok()) return d.status();
  MasterProcess m;
  const std::string prefix = "hymcache-master listening on ";
  if (!absl::StartsWith(d->ready_line(), prefix)) {
    return absl::InternalError("unexpected master line: " + d->ready_line());
  }
  m.address = d->ready_line().substr(prefix.size());
  m.daemon = std::move(*d);
  return m;
}

absl::StatusOr<StorageProcess> StorageProcess::Start(
    const std::string& master, const std::string& name,
    std::vector<std::string> extra) {
  std::vector<std::string> args = {"--master=" + master, "--name=" + name,
                                   "--data_port=0", "--control_port=0",
                                   "--logtostderr"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto d = Daemon::Start(RunfilePath("storage_node/hymcache-storage"), args);
  if (!d.ok()) return d.status();
  StorageProcess s;
  s.data_address = Field(d->ready_line(), "data");
  s.control_address = Field(d->ready_line(), "control");
  if (s.data_address.empty() || s.control_address.empty()) {
    return absl::InternalError("unexpected storage line: " + d->ready_line());
  }
  s.daemon = std::move(*d);
  return s;
}

}  // namespace hymcache::testing
