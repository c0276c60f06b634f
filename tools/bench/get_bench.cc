// get_bench: GET throughput of HyMCache on one host against the limit of
// its data plane, measured side by side in one run:
//   --transport=tcp  vs a raw loopback TCP socket moving the same blocks;
//   --transport=shm  vs memcpy of the same blocks (same-host shared memory:
//                    the node's memory mapped into the client);
//   --transport=rdma vs the raw socket (needs an RDMA device, e.g. Soft-RoCE
//                    in tests/vmtest, where it measures correctness, not
//                    speed).
//
//   bazel run -c opt //tools/bench:get_bench -- --block_mib=16 --blocks=16 --rounds=8
//   bazel run -c opt //tools/bench:get_bench -- --transport=shm
//
// Starts an in-process master and storage node (DRAM device) on 127.0.0.1,
// stores `blocks` blocks, then times `rounds` Gets of all of them (one batch
// per Get). The baseline is one TCP stream on loopback where a server answers
// each 1-byte request with a block from memory: the same request/response
// shape with no protocol, index or bounds checks.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/net.h"
#include "common/thread.h"
#include "master/master_server.h"
#include "storage_node/storage_node.h"

DEFINE_uint64(block_mib, 16, "block size in MiB");
DEFINE_uint64(block_kib, 0, "block size in KiB (overrides --block_mib when set)");
DEFINE_int32(blocks, 16, "blocks per Get");
DEFINE_int32(rounds, 8, "timed Gets");
DEFINE_int32(trials, 3, "alternating trials of each measurement");
DEFINE_string(db_path, "", "master RocksDB dir (default: a temp dir)");
DEFINE_string(transport, "tcp", "client transport: tcp, shm, rdma or auto");

namespace hymcache {
namespace {

// One TCP stream: the client sends a 1-byte request, the server answers with
// the next block. Source and destination footprints match the GET run
// (`blocks` distinct blocks each side), so both pay the same memory traffic.
double RawSocketGBps(size_t block, int blocks, int rounds) {
  auto ls = ListenTcp("127.0.0.1", 0);
  if (!ls.ok()) return -1;
  int port = *LocalPort(ls->fd());
  std::vector<std::vector<char>> src(blocks, std::vector<char>(block, 'x'));
  Thread server("raw-server", [&] {
    int fd = accept(ls->fd(), nullptr, nullptr);
    Socket s(fd);
    TuneDataSocket(fd);
    char c;
    for (size_t i = 0; RecvAll(fd, &c, 1, absl::InfiniteFuture()).ok(); ++i) {
      const auto& b = src[i % src.size()];
      if (!SendAll(fd, b.data(), b.size(), absl::InfiniteFuture()).ok()) break;
    }
  });
  auto c = ConnectTcp(absl::StrCat("127.0.0.1:", port), absl::InfiniteFuture());
  std::vector<std::vector<char>> dst(blocks, std::vector<char>(block));
  auto one = [&](int i) {
    char r = 'r';
    SendAll(c->fd(), &r, 1, absl::InfiniteFuture()).IgnoreError();
    RecvAll(c->fd(), dst[i].data(), block, absl::InfiniteFuture()).IgnoreError();
  };
  for (int i = 0; i < blocks; ++i) one(i);  // warm up
  absl::Time t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < blocks; ++i) one(i);
  }
  double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  c->Close();
  server.Join();
  return static_cast<double>(block) * blocks * rounds / secs / 1e9;
}

// memcpy of `blocks` distinct blocks into `blocks` distinct buffers, the
// same footprint as the GET run.
double MemcpyGBps(size_t block, int blocks, int rounds) {
  std::vector<std::vector<char>> src(blocks, std::vector<char>(block, 'x'));
  std::vector<std::vector<char>> dst(blocks, std::vector<char>(block));
  for (int i = 0; i < blocks; ++i) memcpy(dst[i].data(), src[i].data(), block);
  absl::Time t0 = absl::Now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < blocks; ++i) {
      memcpy(dst[i].data(), src[i].data(), block);
    }
  }
  double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  volatile char sink = dst[blocks - 1][block - 1];
  (void)sink;
  return static_cast<double>(block) * blocks * rounds / secs / 1e9;
}

int Main() {
  size_t block = FLAGS_block_kib > 0 ? FLAGS_block_kib << 10 : FLAGS_block_mib << 20;
  TransportKind kind;
  if (FLAGS_transport == "tcp") {
    kind = TransportKind::kTcp;
  } else if (FLAGS_transport == "shm") {
    kind = TransportKind::kShm;
  } else if (FLAGS_transport == "rdma") {
    kind = TransportKind::kRdma;
  } else if (FLAGS_transport == "auto") {
    kind = TransportKind::kAuto;
  } else {
    fprintf(stderr, "bad --transport %s\n", FLAGS_transport.c_str());
    return 2;
  }
  const bool vs_memcpy = kind == TransportKind::kShm || kind == TransportKind::kAuto;
  const char* baseline = vs_memcpy ? "memcpy" : "raw loopback socket";
  std::string db = FLAGS_db_path.empty()
                       ? absl::StrCat("/tmp/hymcache-get-bench-", getpid())
                       : FLAGS_db_path;
  MasterOptions mo;
  mo.db_path = db;
  auto master = MasterServer::Create(mo);
  if (!master.ok()) {
    fprintf(stderr, "master: %s\n", master.status().ToString().c_str());
    return 1;
  }
  StorageNodeOptions so;
  so.master_address = (*master)->address();
  so.dram_bytes = block * FLAGS_blocks + (64 << 20);
  auto node = StorageNode::Create(so);
  if (!node.ok() || !(*node)->WaitRegistered(absl::Now() + absl::Seconds(10))) {
    fprintf(stderr, "storage node did not come up\n");
    return 1;
  }
  ClientOptions co;
  co.master_address = (*master)->address();
  co.transport = kind;
  auto client = Client::Create(co);
  if (!client.ok()) {
    fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> keys;
  std::vector<std::vector<char>> data(FLAGS_blocks, std::vector<char>(block));
  std::vector<ConstBuffer> in;
  std::vector<MutableBuffer> out;
  std::vector<std::vector<char>> dst(FLAGS_blocks, std::vector<char>(block));
  for (int i = 0; i < FLAGS_blocks; ++i) {
    keys.push_back(absl::StrCat("bench-", i));
    memset(data[i].data(), 'a' + i % 26, block);
    in.push_back({data[i].data(), block});
    out.push_back({dst[i].data(), block});
  }
  auto put = (*client)->Put(keys, in);
  if (!put.ok() || put->stored != keys.size()) {
    fprintf(stderr, "put failed\n");
    return 1;
  }
  (*client)->Get(keys, out).IgnoreError();  // warm up
  printf("block=%zu KiB blocks/get=%d rounds=%d trials=%d transport=%s\n",
         block >> 10, FLAGS_blocks, FLAGS_rounds, FLAGS_trials,
         FLAGS_transport.c_str());
  bool ok = true;
  double best_get = 0, best_raw = 0;
  for (int trial = 0; trial < FLAGS_trials; ++trial) {
    absl::Time t0 = absl::Now();
    size_t loaded = 0;
    for (int r = 0; r < FLAGS_rounds; ++r) {
      auto g = (*client)->Get(keys, out);
      if (g.ok()) loaded += g->loaded;
    }
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    double get = static_cast<double>(block) * loaded / secs / 1e9;
    ok = ok && loaded == static_cast<size_t>(FLAGS_rounds) * keys.size();
    for (int i = 0; i < FLAGS_blocks && ok; ++i) ok = dst[i] == data[i];
    double raw = vs_memcpy ? MemcpyGBps(block, FLAGS_blocks, FLAGS_rounds)
                           : RawSocketGBps(block, FLAGS_blocks, FLAGS_rounds);
    printf("trial %d: %s %6.2f GB/s, hymcache GET (%s) %6.2f GB/s (%.2fx)\n",
           trial, baseline, raw, FLAGS_transport.c_str(), get, get / raw);
    best_get = std::max(best_get, get);
    best_raw = std::max(best_raw, raw);
  }
  printf("best: %s %6.2f GB/s, hymcache GET (%s) %6.2f GB/s  (%.2fx)%s\n",
         baseline, best_raw, FLAGS_transport.c_str(), best_get,
         best_get / best_raw, ok ? "" : "  DATA MISMATCH");
  node->get()->Shutdown();
  master->get()->Shutdown();
  std::string rm = "rm -rf " + db;
  if (FLAGS_db_path.empty()) system(rm.c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return hymcache::Main();
}
