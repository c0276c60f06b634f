// transport_bench: the data planes alone (no master, no lookups) against the
// limit of what they move, side by side in one run:
//   tcp: Transport::Read from an in-process data server (DRAM device) over
//        loopback vs one raw loopback TCP stream answering each 1-byte
//        request with the same blocks;
//   shm: the shared-memory transport (acquire, memcpy from the node's memfd
//        mapping, release) vs memcpy of the same blocks.
// Same footprint on both sides: `batch` distinct blocks per request, copied
// into `batch` distinct destination buffers.
//
//   bazel run -c opt //tools/bench:transport_bench
//   bazel run -c opt //tools/bench:transport_bench -- --block_kib=256 --batch=32
//
// Without --block_kib/--batch it runs the matrix 16 MiB and 256 KiB blocks x
// batches of 1 and 32.
//
// There is no master: the bench signs each op's capability itself with
// TestCapabilities, whose key the in-process data server verifies (as a
// master signs them at PutStart and lookup). It exits 1 if any
// configuration measured nothing (a write or read refused, data that does
// not match), so a data plane that rots fails its smoke test.
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
#include "client/direct_transport.h"
#include "client/tcp_transport.h"
#include "common/cli.h"
#include "common/net.h"
#include "common/test_capabilities.h"
#include "common/thread.h"
#include "common/transport_params.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/local_data_plane.h"
#include "storage_node/device/dram_device.h"

DEFINE_uint64(block_kib, 0, "block size in KiB (0: the matrix)");
DEFINE_int32(batch, 0, "blocks per request (0: the matrix)");
DEFINE_double(seconds, 1.0, "time per measurement");
DEFINE_int32(trials, 3, "alternating trials; the best of each is reported");

namespace hymcache {
namespace {

// Runs `one` (which moves `bytes`) repeatedly for about FLAGS_seconds.
template <typename Fn>
double Rate(uint64_t bytes, Fn one) {
  one();  // warm up
  int n = 0;
  absl::Time t0 = absl::Now();
  absl::Duration spent;
  do {
    one();
    ++n;
    spent = absl::Now() - t0;
  } while (spent < absl::Seconds(FLAGS_seconds));
  return static_cast<double>(bytes) * n / absl::ToDoubleSeconds(spent) / 1e9;
}

struct Node {
  explicit Node(uint64_t bytes) {
    storage::DramDeviceOptions d;
    d.capacity_bytes = bytes;
    plane = std::make_unique<storage::LocalDataPlane>(
        storage::DramDevice::Create(d).value());
    peer.node_id = 1;
    peer.data_address = plane->data_address();
    for (auto& [k, v] : plane->transport_params()) peer.params[k] = v;
  }
  std::unique_ptr<storage::LocalDataPlane> plane;
  PeerInfo peer;
};

// Prints one row; false (and why, on stderr) if the data plane refused an
// op or returned other bytes than were written.
bool RunOne(size_t block, int batch) {
  Node node(block * batch + (1 << 20));
  auto tcp = NewTcpTransport({});
  auto shm = NewDirectTransport(NewShmMover(), {});
  std::vector<std::vector<char>> src(batch, std::vector<char>(block));
  std::vector<std::vector<char>> dst(batch, std::vector<char>(block));
  std::vector<WriteOp> w;
  std::vector<ReadOp> r;
  const uint64_t stride = (block + 4095) / 4096 * 4096;
  for (int i = 0; i < batch; ++i) {
    memset(src[i].data(), 'a' + i % 26, block);
    RemoteRef ref{0, i * stride, block, static_cast<uint64_t>(i + 1)};
    // What the master would hand out: a write capability at PutStart, a
    // read capability at lookup. Signed once, outside the timed loops (a
    // client never signs). Valid for a day: longer than any run.
    const TestCapabilities& caps = TestCapabilities::Get();
    RemoteRef wref = ref;
    wref.cap = caps.Sign(ref.region_id, ref.addr, ref.length, ref.generation,
                         wire::kCapWrite, absl::Hours(24));
    RemoteRef rref = ref;
    rref.cap = caps.Sign(ref.region_id, ref.addr, ref.length, ref.generation,
                         wire::kCapRead, absl::Hours(24));
    w.push_back({wref, src[i].data()});
    r.push_back({rref, dst[i].data()});
  }
  const absl::Time far = absl::InfiniteFuture();
  for (const absl::Status& s : tcp->Write(node.peer, w, far)) {
    if (!s.ok()) {
      fprintf(stderr, "%zu KiB x %d: write: %s\n", block >> 10, batch,
              s.ToString().c_str());
      return false;
    }
  }
  // One untimed read on each transport first, so a refused read is
  // reported as such rather than as a rate.
  for (Transport* t : {tcp.get(), shm.get()}) {
    for (const absl::Status& s : t->Read(node.peer, r, far)) {
      if (!s.ok()) {
        fprintf(stderr, "%zu KiB x %d: %s read: %s\n", block >> 10, batch,
                std::string(t->name()).c_str(), s.ToString().c_str());
        return false;
      }
    }
  }
  // Raw socket: a server answering each 1-byte request with the next block,
  // with the data server's socket options.
  auto ls = ListenTcp("127.0.0.1", 0);
  int port = *LocalPort(ls->fd());
  Thread raw_server("raw-server", [&] {
    int fd = accept(ls->fd(), nullptr, nullptr);
    Socket s(fd);
    TuneDataSocket(fd, storage::DataServerOptions().send_buffer_bytes);
    char c;
    for (size_t i = 0; RecvAll(fd, &c, 1, far).ok(); ++i) {
      const auto& b = src[i % src.size()];
      if (!SendAll(fd, b.data(), b.size(), far).ok()) break;
    }
  });
  auto raw = ConnectTcp(absl::StrCat("127.0.0.1:", port), far);
  const uint64_t bytes = static_cast<uint64_t>(block) * batch;
  bool ok = true;
  double best[4] = {0, 0, 0, 0};
  for (int t = 0; t < FLAGS_trials; ++t) {
    double v[4];
    v[0] = Rate(bytes, [&] {
      for (int i = 0; i < batch; ++i) {
        char q = 'r';
        SendAll(raw->fd(), &q, 1, far).IgnoreError();
        RecvAll(raw->fd(), dst[i].data(), block, far).IgnoreError();
      }
    });
    v[1] = Rate(bytes, [&] {
      for (const absl::Status& s : tcp->Read(node.peer, r, far)) ok &= s.ok();
    });
    v[2] = Rate(bytes, [&] {
      for (int i = 0; i < batch; ++i) memcpy(dst[i].data(), src[i].data(), block);
    });
    v[3] = Rate(bytes, [&] {
      for (const absl::Status& s : shm->Read(node.peer, r, far)) ok &= s.ok();
    });
    for (int k = 0; k < 4; ++k) best[k] = std::max(best[k], v[k]);
  }
  for (int i = 0; i < batch && ok; ++i) ok = dst[i] == src[i];
  printf("%8zu KiB x %2d | raw socket %6.2f  tcp %6.2f  (%.2fx) | memcpy %6.2f  shm %6.2f  (%.2fx)%s\n",
         block >> 10, batch, best[0], best[1], best[1] / best[0], best[2],
         best[3], best[3] / best[2], ok ? "" : "  DATA MISMATCH");
  raw->Close();
  raw_server.Join();
  if (!ok) {
    fprintf(stderr, "%zu KiB x %d: a timed read failed or returned other "
            "bytes\n", block >> 10, batch);
  }
  return ok;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine({.program = "transport_bench",
                              .usage = "transport_bench: the data planes alone "
                                       "against the limit of what they move",
                              .main_file = __FILE__},
                             &argc, &argv);
  if (FLAGS_trials < 1 || FLAGS_seconds <= 0 || FLAGS_batch < 0) {
    fprintf(stderr, "--trials must be at least 1, --seconds above 0\n");
    return 2;
  }
  printf("GB/s, best of %d alternating trials of %.1f s each\n", FLAGS_trials,
         FLAGS_seconds);
  std::vector<size_t> blocks = {size_t{16} << 20, size_t{256} << 10};
  std::vector<int> batches = {1, 32};
  if (FLAGS_block_kib > 0) blocks = {FLAGS_block_kib << 10};
  if (FLAGS_batch > 0) batches = {FLAGS_batch};
  int failed = 0;
  for (size_t b : blocks) {
    for (int n : batches) failed += hymcache::RunOne(b, n) ? 0 : 1;
  }
  if (failed > 0) {
    fprintf(stderr, "transport_bench: %d of %zu configurations failed\n",
            failed, blocks.size() * batches.size());
    return 1;
  }
  return 0;
}
