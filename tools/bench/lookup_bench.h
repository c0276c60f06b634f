// The parts of lookup_bench (lookup_bench.cc says what it measures and
// how) that its other files share: a row of results and how threads fill
// it (lookup_bench.cc), client processes (lookup_bench_processes.cc), and
// the Redis baseline (lookup_bench_redis.cc).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/grpc_master_client.h"
#include "client/master_client.h"
#include "common/grpc_polling.h"
#include "common/security.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "master/master_service.h"
#include "proto/master.grpc.pb.h"

// Flags defined in lookup_bench.cc that the parts read.
DECLARE_uint64(objects);
DECLARE_uint32(key_bytes);
DECLARE_double(seconds);
DECLARE_bool(packed);
DECLARE_bool(deadlock_detection);
DECLARE_string(client_poll_strategy);
DECLARE_string(redis_server);
DECLARE_bool(client_processes);

namespace hymcache::lookup_bench {

// Untimed calls per client thread before each measurement.
inline constexpr int kWarmupCalls = 20;

// How a lookup travels (--transports).
enum class Transport { kUnary, kStream, kStreamAsync, kSdk };

inline constexpr Transport kTransports[] = {
    Transport::kUnary, Transport::kStream, Transport::kStreamAsync,
    Transport::kSdk};

inline const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kUnary:
      return "unary";
    case Transport::kStream:
      return "stream";
    case Transport::kStreamAsync:
      return "stream_async";
    case Transport::kSdk:
      return "sdk";
  }
  return "?";
}

struct Row {
  int batch;
  int threads;
  bool for_read;
  Transport transport = Transport::kUnary;
  uint64_t calls = 0;
  uint64_t misses = 0;
  uint64_t errors = 0;
  double p50_us = 0;
  double p99_us = 0;
  double keys_per_s = 0;
  bool caps = true;  // capabilities signed
  // CPU time of the server process (master or redis-server) per call,
  // warm-up calls included; 0 when not known (--master_in_process).
  double server_cpu_us = 0;
};

// Calls, p50 / p99 and keys/s of `row` from the threads' call latencies.
void Summarize(const std::vector<std::vector<double>>& lat, double secs,
               Row* row);

// What a client's calls counted beside their latencies.
struct Tally {
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> errors{0};
};

// Runs `call(t)` (client t's next timed call, returning its microseconds)
// on `threads` threads named `name` for --seconds; fills the row's calls,
// percentiles and rate.
template <typename F>
void RunThreads(int threads, const char* name, F call, Row* row) {
  std::vector<std::vector<double>> lat(threads);
  const absl::Time start = absl::Now();
  {
    std::vector<Thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back(name, [&, t] {
        const absl::Time end = start + absl::Seconds(FLAGS_seconds);
        while (absl::Now() < end) lat[t].push_back(call(t));
      });
    }
  }
  Summarize(lat, absl::ToDoubleSeconds(absl::Now() - start), row);
}

// What a client process (--worker) reports after its timed calls, followed
// by `calls` doubles: each call's microseconds.
struct WorkerReport {
  uint64_t calls;
  uint64_t misses;
  uint64_t errors;
  double seconds;  // its timed span
};

// Reads or writes exactly `n` bytes; false on EOF or an error.
bool ReadAll(int fd, void* buf, size_t n);
bool WriteAll(int fd, const void* buf, size_t n);

// --client_processes: `threads` clients, each this program run again with
// --worker=`kind` and `worker_flags`, connected and warmed up before all
// start their timed calls together. Fills the row; false if a client could
// not start or report.
bool RunProcesses(int threads, const std::string& kind,
                  const std::vector<std::string>& worker_flags, Row* row,
                  Tally* tally);

// ------------------------------------------------------------ Redis baseline

// A loopback port free right now (bind port 0, read it, close).
int FreePort();

// One blocking RESP connection: sends commands, reads replies.
class Resp {
 public:
  ~Resp() {
    if (fd_ >= 0) close(fd_);
  }
  bool Connect(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
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
  // Appends a command of `args` to the send buffer.
  void Add(const std::vector<absl::string_view>& args) {
    absl::StrAppend(&out_, "*", args.size(), "\r\n");
    for (absl::string_view a : args) {
      absl::StrAppend(&out_, "$", a.size(), "\r\n");
      out_.append(a.data(), a.size());
      out_ += "\r\n";
    }
  }
  bool Flush() {
    size_t off = 0;
    while (off < out_.size()) {
      ssize_t n = write(fd_, out_.data() + off, out_.size() - off);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    out_.clear();
    return true;
  }
  // Reads one reply; returns the number of non-nil bulk strings in it
  // (an array's elements, or 1 for a status / bulk string), -1 on error.
  int64_t Read() {
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

 private:
  bool Fill() {
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
  bool Line(std::string* line) {
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
  // After a "$len" line: skips the payload; false for nil ($-1).
  bool Bulk(const std::string& header) {
    int64_t len = 0;
    if (!absl::SimpleAtoi(header.substr(1), &len) || len < 0) return false;
    while (in_.size() - pos_ < static_cast<size_t>(len) + 2) {
      if (!Fill()) return false;
    }
    pos_ += static_cast<size_t>(len) + 2;
    return true;
  }

  int fd_ = -1;
  std::string out_;
  std::string in_;
  size_t pos_ = 0;
};

// redis-server as a child process, stopped (SIGTERM, waited for) at the end.
struct RedisServer {
  pid_t pid = -1;
  int port = -1;
  ~RedisServer() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
  bool Start() {
    port = FreePort();
    if (port <= 0) return false;
    const std::string port_s = std::to_string(port);
    pid = fork();
    if (pid == 0) {
      execlp(FLAGS_redis_server.c_str(), FLAGS_redis_server.c_str(), "--port",
             port_s.c_str(), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
             "--protected-mode", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid < 0) return false;
    for (int i = 0; i < 200; ++i) {  // up to 10 s for it to listen
      Resp probe;
      if (probe.Connect(port)) {
        probe.Add({"PING"});
        if (probe.Flush() && probe.Read() == 1) return true;
      }
      usleep(50 * 1000);
    }
    return false;
  }
};

// One MGET of `batch` consecutive stored keys from a random start; its
// microseconds. Misses and failures go to `tally`.
double TimedMget(Resp* c, const std::vector<std::string>& keys, int batch,
                 std::mt19937_64& rng, Tally* tally);

// MGET rows for `batch` and `threads`, as Measure's for the master.
Row MeasureRedis(int port, const std::vector<std::string>& keys, int batch,
                 int threads);

// Stores every key with a 40-byte value, 1000 keys per MSET, pipelined.
bool LoadRedis(int port, const std::vector<std::string>& keys);

}  // namespace hymcache::lookup_bench
