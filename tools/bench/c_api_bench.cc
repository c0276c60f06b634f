// Per-call cost of the C API's hymcache_load against the C++ SDK's
// Client::Load doing the same: the same blocks (--blocks x --block_kib, by
// default 32 x 256 KiB) loaded into the same buffers from a real master and
// storage node (child processes on loopback), for each transport in
// --transports. Prints microseconds per call (median and mean of the calls,
// alternating call by call) side by side, and the C API's extra cost.
//
//   bazel run -c opt //tools/bench:c_api_bench -- --calls=500
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/cli.h"
#include "hymcache/hymcache.h"
#include "tests/daemon.h"

DEFINE_int32(blocks, 32, "blocks per load");
DEFINE_int32(block_kib, 256, "block size in KiB");
DEFINE_int32(calls, 500, "timed loads of each API, alternating");
DEFINE_string(transports, "tcp,shm", "comma-separated: tcp, shm");

namespace hymcache {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

int Run() {
  if (FLAGS_blocks < 1 || FLAGS_block_kib < 1 || FLAGS_calls < 1) {
    fprintf(stderr, "--blocks, --block_kib and --calls must be at least 1\n");
    return 2;
  }
  std::string dir = testing::TempDir("c_api_bench");
  auto master = testing::MasterProcess::Start(dir + "/master", "127.0.0.1:0");
  if (!master.ok()) {
    fprintf(stderr, "master: %s\n", master.status().ToString().c_str());
    return 1;
  }
  auto node = testing::StorageProcess::Start(master->address, "bench-node",
                                             {"--dram_bytes=256M"});
  if (!node.ok()) {
    fprintf(stderr, "storage: %s\n", node.status().ToString().c_str());
    return 1;
  }

  const size_t n = FLAGS_blocks;
  const size_t block = static_cast<size_t>(FLAGS_block_kib) << 10;
  KeyNamespace ns;
  ns.model = "c_api_bench";
  std::vector<int32_t> tokens(n * 16);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::vector<std::string> keys = BlockKeyBuilder(ns, 16).Keys(tokens);
  std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(block));
  for (size_t i = 0; i < n; ++i) std::fill(data[i].begin(), data[i].end(), i);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(block));

  std::vector<hymcache_key> ckeys(n);
  std::vector<hymcache_buffer> cbufs(n);
  std::vector<MutableBuffer> bufs(n);
  for (size_t i = 0; i < n; ++i) {
    ckeys[i] = {keys[i].data(), keys[i].size()};
    cbufs[i] = {out[i].data(), out[i].size()};
    bufs[i] = {out[i].data(), out[i].size()};
  }
  std::vector<uint64_t> lengths(n);

  printf(
      "%zu x %d KiB per load, %d loads of each API alternating; "
      "median (mean) us per call\n",
      n, FLAGS_block_kib, FLAGS_calls);
  printf("%-9s %18s %18s %12s %8s\n", "transport", "C++ Load",
         "C hymcache_load", "C - C++ us", "C/C++");
  bool stored = false;
  const std::vector<std::string> transports =
      absl::StrSplit(FLAGS_transports, ',');
  for (const std::string& t : transports) {
    ClientOptions o;
    o.master_address = master->address;
    hymcache_client_options co;
    hymcache_client_options_init(&co);
    const char* masters[] = {master->address.c_str()};
    co.master_addresses = masters;
    co.num_master_addresses = 1;
    if (t == "tcp") {
      o.transport = TransportKind::kTcp;
      co.transport = HYMCACHE_TRANSPORT_TCP;
    } else if (t == "shm") {
      o.transport = TransportKind::kShm;
      co.transport = HYMCACHE_TRANSPORT_SHM;
    } else {
      fprintf(stderr, "unknown transport %s\n", t.c_str());
      return 2;
    }
    auto cpp = Client::Create(o);
    hymcache_client* c = nullptr;
    if (!cpp.ok() || hymcache_client_create(&co, &c) != HYMCACHE_OK) {
      fprintf(stderr, "client: %s %s\n", cpp.status().ToString().c_str(),
              hymcache_last_error());
      return 1;
    }
    if (!stored) {
      std::vector<ConstBuffer> in(n);
      for (size_t i = 0; i < n; ++i) in[i] = {data[i].data(), block};
      // A fresh node registers within a second or two.
      absl::Time give_up = absl::Now() + absl::Seconds(30);
      for (;;) {
        auto r = (*cpp)->Put(keys, in);
        if (r.ok() && r->stored == n) break;
        if (absl::Now() > give_up) {
          fprintf(stderr, "could not store the blocks: %s\n",
                  r.ok() ? "refused" : r.status().ToString().c_str());
          return 1;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
      stored = true;
    }
    auto one_cpp = [&]() {
      auto r = (*cpp)->Load(keys, bufs);
      return r.ok() && r->loaded == n;
    };
    auto one_c = [&]() {
      hymcache_load_result r;
      return hymcache_load(c, ckeys.data(), cbufs.data(), n,
                           HYMCACHE_TIMEOUT_DEFAULT, 0, lengths.data(),
                           &r) == HYMCACHE_OK &&
             r.loaded == n;
    };
    // One call, timed; a short load ends the benchmark.
    auto time_us = [&](auto&& fn) -> double {
      absl::Time t0 = absl::Now();
      if (!fn()) {
        fprintf(stderr, "a load came back short\n");
        exit(1);
      }
      return absl::ToDoubleMicroseconds(absl::Now() - t0);
    };
    // Warm up both (connections, staging), then alternate call by call so
    // that drift in the machine's load hits both alike.
    for (int i = 0; i < 10; ++i) {
      time_us(one_cpp);
      time_us(one_c);
    }
    std::vector<double> cpp_us, c_us;
    for (int i = 0; i < FLAGS_calls; ++i) {
      cpp_us.push_back(time_us(one_cpp));
      c_us.push_back(time_us(one_c));
    }
    if (std::memcmp(out[n - 1].data(), data[n - 1].data(), block) != 0) {
      fprintf(stderr, "loaded bytes differ\n");
      return 1;
    }
    const double a = Median(cpp_us), b = Median(c_us);
    printf("%-9s %9.1f (%6.1f) %9.1f (%6.1f) %12.1f %8.3f\n", t.c_str(), a,
           Mean(cpp_us), b, Mean(c_us), b - a, b / a);
    hymcache_client_destroy(c);
  }
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "c_api_bench",
       .usage = "c_api_bench: the C API's hymcache_load against the C++ SDK's "
                "Client::Load, per call, against real daemons",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Run();
}
