#include "tools/bench/redis_baseline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/thread.h"

namespace hymcache::bench {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

Resp::~Resp() {
  if (fd_ >= 0) close(fd_);
}

bool Resp::Connect(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd_);
    fd_ = -1;
    return false;
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return true;
}

void Resp::Add(const std::vector<absl::string_view>& args) {
  absl::StrAppend(&out_, "*", args.size(), "\r\n");
  for (absl::string_view a : args) {
    absl::StrAppend(&out_, "$", a.size(), "\r\n");
    out_.append(a.data(), a.size());
    out_ += "\r\n";
  }
}

bool Resp::Flush() {
  size_t off = 0;
  while (off < out_.size()) {
    ssize_t n = write(fd_, out_.data() + off, out_.size() - off);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  out_.clear();
  return true;
}

int64_t Resp::Read() {
  std::string line;
  if (!Line(&line) || line.empty()) return -1;
  int64_t n = 0;
  switch (line[0]) {
    case '+':
    case ':':
      return 1;
    case '$':
      return Bulk(line) ? 1 : 0;
    case '*': {
      if (!absl::SimpleAtoi(line.substr(1), &n)) return -1;
      int64_t found = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (!Line(&line) || line.empty() || line[0] != '$') return -1;
        found += Bulk(line) ? 1 : 0;
      }
      return found;
    }
    default:
      return -1;
  }
}

bool Resp::Fill() {
  if (pos_ > 0) {
    in_.erase(0, pos_);
    pos_ = 0;
  }
  char buf[1 << 16];
  ssize_t n = read(fd_, buf, sizeof(buf));
  if (n <= 0) return false;
  in_.append(buf, static_cast<size_t>(n));
  return true;
}

bool Resp::Line(std::string* line) {
  for (;;) {
    size_t eol = in_.find("\r\n", pos_);
    if (eol != std::string::npos) {
      line->assign(in_, pos_, eol - pos_);
      pos_ = eol + 2;
      return true;
    }
    if (!Fill()) return false;
  }
}

bool Resp::Bulk(const std::string& header) {
  int64_t len = 0;
  if (!absl::SimpleAtoi(header.substr(1), &len) || len < 0) return false;
  while (in_.size() - pos_ < static_cast<size_t>(len) + 2) {
    if (!Fill()) return false;
  }
  pos_ += static_cast<size_t>(len) + 2;
  return true;
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
}

bool RedisServer::Start(const std::string& binary, int cpu) {
  port_ = FreePort();
  if (port_ <= 0) return false;
  const std::string port_s = std::to_string(port_);
  const std::string cpu_s = std::to_string(cpu);
  pid_ = fork();
  if (pid_ == 0) {
    // Its log (warnings only) goes to stdout: not into the bench's report.
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);
    if (cpu >= 0) {
      // taskset execs redis-server: the pid stays the server's.
      execlp("taskset", "taskset", "-c", cpu_s.c_str(), binary.c_str(),
             "--port", port_s.c_str(), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
             "--protected-mode", "no", static_cast<char*>(nullptr));
    } else {
      execlp(binary.c_str(), binary.c_str(), "--port", port_s.c_str(), "--bind",
             "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize",
             "no", "--loglevel", "warning", "--protected-mode", "no",
             static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  if (pid_ < 0) return false;
  for (int i = 0; i < 200; ++i) {  // up to 10 s for it to listen
    Resp probe;
    if (probe.Connect(port_)) {
      probe.Add({"PING"});
      if (probe.Flush() && probe.Read() == 1) return true;
    }
    usleep(50 * 1000);
  }
  return false;
}

bool LoadRedis(int port, const std::vector<std::string>& keys) {
  Resp c;
  if (!c.Connect(port)) return false;
  const std::string value(40, 'v');
  size_t sent = 0;
  for (size_t start = 0; start < keys.size(); start += 1000) {
    std::vector<absl::string_view> args = {"MSET"};
    for (size_t i = start; i < std::min(keys.size(), start + 1000); ++i) {
      args.push_back(keys[i]);
      args.push_back(value);
    }
    c.Add(args);
    ++sent;
  }
  if (!c.Flush()) return false;
  for (size_t i = 0; i < sent; ++i) {
    if (c.Read() != 1) return false;
  }
  return true;
}

MgetLoad RunMgets(int port, const std::vector<std::string>& keys, int batch,
                  int threads, int depth, double duration_s) {
  MgetLoad load;
  if (keys.empty() || batch <= 0 || threads <= 0) return load;
  depth = std::max(depth, 1);
  std::atomic<uint64_t> calls{0}, misses{0}, errors{0};
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(duration_s);
  {
    std::vector<Thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back(absl::StrCat("redis-load-", t), [&, t] {
        Resp c;
        if (!c.Connect(port)) {
          errors.fetch_add(1);
          return;
        }
        std::mt19937_64 rng(1000 + t);
        std::uniform_int_distribution<size_t> pick(0, keys.size() - 1);
        auto send = [&] {
          std::vector<absl::string_view> args = {"MGET"};
          for (int k = 0; k < batch; ++k) args.push_back(keys[pick(rng)]);
          c.Add(args);
          return c.Flush();
        };
        int in_flight = 0;
        for (; in_flight < depth; ++in_flight) {
          if (!send()) {
            errors.fetch_add(1);
            return;
          }
        }
        while (in_flight > 0) {
          const int64_t found = c.Read();
          --in_flight;
          if (found < 0) {
            errors.fetch_add(1);
            return;
          }
          calls.fetch_add(1, std::memory_order_relaxed);
          if (found != batch) misses.fetch_add(batch - found);
          if (absl::Now() < end) {
            if (!send()) {
              errors.fetch_add(1);
              return;
            }
            ++in_flight;
          }
        }
      });
    }
  }
  load.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  load.calls = calls.load();
  load.misses = misses.load();
  load.errors = errors.load();
  return load;
}

}  // namespace hymcache::bench
