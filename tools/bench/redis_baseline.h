// The Redis baseline of the lookup benchmarks (lookup_bench --redis,
// ha_bench's mode "redis"): redis-server as a child process on a free
// loopback port, a minimal blocking RESP connection, and the stored keys.
//
// Thread safety: a Resp is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace hymcache::bench {

// A loopback port free right now (bind port 0, read it, close); -1 if none.
int FreePort();

// One blocking RESP connection: commands are appended to a send buffer,
// flushed, and their replies read in order (so several can be in flight:
// pipelining).
class Resp {
 public:
  Resp() = default;
  ~Resp();
  Resp(const Resp&) = delete;
  Resp& operator=(const Resp&) = delete;

  // Connects to 127.0.0.1:`port` (TCP_NODELAY); false on failure.
  bool Connect(int port);
  // Appends a command of `args` to the send buffer.
  void Add(const std::vector<absl::string_view>& args);
  // Writes the send buffer; false on a write error.
  bool Flush();
  // Reads one reply; returns the number of non-nil bulk strings in it
  // (an array's elements, or 1 for a status / bulk string), -1 on error.
  int64_t Read();

 private:
  bool Fill();
  bool Line(std::string* line);
  // After a "$len" line: skips the payload; false for nil ($-1).
  bool Bulk(const std::string& header);

  int fd_ = -1;
  std::string out_;
  std::string in_;
  size_t pos_ = 0;
};

// redis-server as a child process without persistence, stopped (SIGTERM,
// waited for) when destroyed.
class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts `binary` on a free loopback port, on CPU `cpu` alone when it
  // is 0 or more (taskset), and waits up to 10 s for it to answer PING.
  bool Start(const std::string& binary, int cpu = -1);
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

// Stores every key of `keys` with a 40-byte value (about a Location), 1000
// keys per MSET, pipelined; false on an error.
bool LoadRedis(int port, const std::vector<std::string>& keys);

// Load of MGETs of `batch` random keys of `keys` (already stored) on
// `threads` connections for `duration`, `depth` MGETs in flight on each
// (pipelined: a reply read, the next MGET sent; 1: one at a time, as
// redis-benchmark -P 1). What it counted.
struct MgetLoad {
  uint64_t calls = 0;
  uint64_t misses = 0;  // keys not found
  uint64_t errors = 0;  // connections that failed
  double seconds = 0;
};
MgetLoad RunMgets(int port, const std::vector<std::string>& keys, int batch,
                  int threads, int depth, double duration_s);

}  // namespace hymcache::bench
