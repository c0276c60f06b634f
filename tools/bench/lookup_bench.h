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
#include "tools/bench/redis_baseline.h"

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

// The connection, server and loading: tools/bench/redis_baseline.h.
using bench::LoadRedis;
using bench::RedisServer;
using bench::Resp;

// One MGET of `batch` consecutive stored keys from a random start; its
// microseconds. Misses and failures go to `tally`.
double TimedMget(Resp* c, const std::vector<std::string>& keys, int batch,
                 std::mt19937_64& rng, Tally* tally);

// MGET rows for `batch` and `threads`, as Measure's for the master.
Row MeasureRedis(int port, const std::vector<std::string>& keys, int batch,
                 int threads);

}  // namespace hymcache::lookup_bench
