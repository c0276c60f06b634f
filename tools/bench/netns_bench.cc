// netns_bench: GETs and lookups across hosts against what the same link
// carries for a raw socket, side by side in one run (issue 32: "Lookups and
// GETs across hosts through the netns links stay at >= 0.8x of what the
// same links carry for a raw socket").
//
//   bazel run -c opt //tools/bench:netns_bench
//   bazel run -c opt //tools/bench:netns_bench -- --rate_mbit=10000
//   bazel run -c opt //tools/bench:netns_bench -- --latency_us=250  # 1 ms RTT
//
// Two hosts (tests/netns/virtual_network.h: network namespaces joined by
// veth pairs and a bridge): "server" runs the real master and a storage node
// (DRAM device) and the raw socket's server; "client" runs the HyMCache
// Client and the raw socket's client. Needs root; elsewhere it prints
// "netns: SKIPPED: why" and exits 0.
//
//   get   Client::Get of --blocks blocks per call (one batch), --rounds
//         calls, vs one raw TCP stream on which the server answers 1-byte
//         requests with the call's blocks, received into as many buffers,
//         in exchanges of at most 16 MiB as the TCP transport reads a batch
//         (no protocol, index or checks; the node's socket options, its
//         source memory on huge pages). GB/s, per block size of --block_kib.
//   lookup Client::BatchLookup of --lookup_keys keys (all stored), calls/s,
//         vs raw request/response round trips of the same sizes on one
//         stream (the server reads the request and answers with the
//         response's bytes): the bytes one BatchLookup moves each way on
//         the client's link (gRPC with its HTTP/2 framing), measured from
//         the link's counters less the packets' headers.
// Trials alternate the raw and the HyMCache form; the best of each is
// reported. --rate_mbit shapes both ends of each host's link (tc tbf).
// --latency_us delays each host's link both ways (tc netem, or the NFQUEUE
// delayer where the kernel has no netem: tests/netns/link_delayer.h); a
// packet crosses both hosts' links, so 250 us per host is 500 us each way,
// a 1 ms round trip. --delayer sends packets through the delayer even with
// no latency (its own cost).
// Last line: `netns: get1m_vs_raw=X.XX get16m_vs_raw=X.XX
// lookup32_vs_raw=X.XX` (the sizes as run).
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "common/cli.h"
#include "common/net.h"
#include "common/thread.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/netns/virtual_network.h"

DEFINE_string(block_kib, "1024,16384", "GET block sizes in KiB, comma list");
DEFINE_int32(blocks, 16, "blocks per Get");
DEFINE_int32(rounds, 8, "timed Gets per trial");
DEFINE_int32(lookup_keys, 32, "keys per BatchLookup");
DEFINE_int32(lookups, 2000, "timed BatchLookups per trial");
DEFINE_int32(trials, 5, "alternating trials; the best of each is reported");
DEFINE_uint64(rate_mbit, 0, "shape each host's link to this rate (0: none)");
DEFINE_uint64(latency_us, 0,
              "one-way delay added on each host's link (0: none); a packet "
              "between the hosts gets twice this");
DEFINE_bool(delayer, false,
            "delay in userspace (NFQUEUE) even where the kernel has netem, "
            "and even with --latency_us=0");
DEFINE_string(master_binary, "",
              "default: master/hymcache-master in the runfiles");
DEFINE_string(storage_binary, "",
              "default: storage_node/hymcache-storage in the runfiles");

namespace hymcache {
namespace {

using testing::ChildOptions;
using testing::Daemon;
using testing::VirtualNetwork;

constexpr size_t kRecvPiece = size_t{1} << 20;
constexpr int kServer = 0;
constexpr int kClient = 1;

// The raw server: for each request on a connection, a header (request
// bytes, response bytes; 4 bytes each, host order), the request's bytes,
// then it answers with `response` bytes from memory.
void ServeRaw(int listen_fd) {
  // Sent from huge pages, as the node's DRAM device sends its blocks.
  constexpr size_t kSrc = size_t{16} << 20;
  std::unique_ptr<char, decltype(&free)> mem(
      static_cast<char*>(aligned_alloc(size_t{2} << 20, kSrc)), &free);
  madvise(mem.get(), kSrc, MADV_HUGEPAGE);
  std::memset(mem.get(), 'x', kSrc);
  const absl::Span<const char> src(mem.get(), kSrc);
  std::vector<char> req;
  for (;;) {
    int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    Socket s(fd);
    TuneDataSocket(fd, kDataSendBufferBytes);  // as the node's data plane
    uint32_t h[2];
    while (RecvAll(fd, h, sizeof(h), absl::InfiniteFuture()).ok()) {
      req.resize(h[0]);
      if (!RecvAll(fd, req.data(), h[0], absl::InfiniteFuture()).ok()) break;
      for (size_t left = h[1]; left > 0;) {
        const size_t n = std::min(left, src.size());
        if (!SendAll(fd, src.data(), n, absl::InfiniteFuture()).ok()) break;
        left -= n;
      }
    }
  }
}

// One raw stream from the client host: `calls` calls, each filling every
// buffer of `dst` with a `part`-byte piece, in exchanges of `per_exchange`
// pieces (a request of `req` bytes up, the exchange's pieces down).
// Returns the seconds they took.
double RawRoundTrips(const std::string& server, size_t req, size_t part,
                     std::vector<std::vector<char>>& dst, size_t per_exchange,
                     int calls) {
  auto c = ConnectTcp(server, absl::Now() + absl::Seconds(10));
  if (!c.ok()) return 0;
  TuneDataSocket(c->fd());
  std::vector<char> out(sizeof(uint32_t) * 2 + req, 'r');
  auto one = [&] {
    for (size_t first = 0; first < dst.size(); first += per_exchange) {
      const size_t n = std::min(per_exchange, dst.size() - first);
      const uint32_t h[2] = {static_cast<uint32_t>(req),
                             static_cast<uint32_t>(part * n)};
      std::memcpy(out.data(), h, sizeof(h));
      SendAll(c->fd(), out.data(), out.size(), absl::InfiniteFuture())
          .IgnoreError();
      for (size_t i = first; i < first + n; ++i) {
        for (size_t off = 0; off < part; off += kRecvPiece) {
          RecvAll(c->fd(), dst[i].data() + off,
                  std::min(kRecvPiece, part - off), absl::InfiniteFuture())
              .IgnoreError();
        }
      }
    }
  };
  one();  // warm
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < calls; ++i) one();
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

// The calling thread's network namespace's eth0 counters.
struct WireBytes {
  int64_t rx = 0, rx_packets = 0, tx = 0, tx_packets = 0;
  int64_t rx_payload() const { return rx - 66 * rx_packets; }
  int64_t tx_payload() const { return tx - 66 * tx_packets; }
};
WireBytes ReadWireBytes() {
  WireBytes w;
  std::ifstream f("/proc/thread-self/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos ||
        absl::StripAsciiWhitespace(line.substr(0, colon)) != "eth0") {
      continue;
    }
    std::vector<std::string> v =
        absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
    if (v.size() < 10) break;
    absl::SimpleAtoi(v[0], &w.rx);
    absl::SimpleAtoi(v[1], &w.rx_packets);
    absl::SimpleAtoi(v[8], &w.tx);
    absl::SimpleAtoi(v[9], &w.tx_packets);
  }
  return w;
}

// Starts `binary` (default: `runfile` in the runfiles) with `args`; says
// why on stderr when it does not come up.
absl::StatusOr<Daemon> LaunchDaemon(const char* what, const std::string& binary,
                                    const char* runfile,
                                    const std::vector<std::string>& args,
                                    const ChildOptions& options) {
  auto d = Daemon::Launch(
      binary.empty() ? testing::RunfilePath(runfile) : binary, args, options);
  if (!d.ok()) {
    std::fprintf(stderr, "netns_bench: %s: %s\n", what,
                 d.status().ToString().c_str());
  }
  return d;
}

struct Best {
  double raw = 0, hym = 0;
  void Keep(double r, double h) {
    raw = std::max(raw, r);
    hym = std::max(hym, h);
  }
  double ratio() const { return raw > 0 ? hym / raw : 0; }
};

int Run() {
  const absl::Time start = absl::Now();
  auto made = VirtualNetwork::Create({.hosts = {"server", "client"}});
  if (!made.ok()) {
    std::printf("netns: SKIPPED: %s\n", made.status().ToString().c_str());
    return made.status().code() == absl::StatusCode::kFailedPrecondition ? 0
                                                                         : 1;
  }
  VirtualNetwork& net = **made;
  if (FLAGS_rate_mbit > 0 || FLAGS_latency_us > 0 || FLAGS_delayer) {
    for (int h : {kServer, kClient}) {
      absl::Status s =
          net.ShapeLink(h, {.latency = absl::Microseconds(FLAGS_latency_us),
                            .rate_bits_per_s = FLAGS_rate_mbit * 1000000,
                            .through_delayer = FLAGS_delayer});
      if (!s.ok()) {
        std::fprintf(stderr, "netns_bench: shaping: %s\n",
                     s.ToString().c_str());
        return 1;
      }
    }
  }
  std::vector<uint64_t> sizes;
  for (absl::string_view v : absl::StrSplit(FLAGS_block_kib, ',')) {
    uint64_t kib = 0;
    if (!absl::SimpleAtoi(v, &kib) || kib == 0 || kib > 16384) {
      std::fprintf(stderr, "netns_bench: bad --block_kib %s\n",
                   FLAGS_block_kib.c_str());
      return 2;
    }
    sizes.push_back(kib << 10);
  }
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());

  // The cluster on the server host.
  const std::string dir = testing::TempDir("netns_bench");
  // Removed on the way out, after the daemons below have stopped.
  struct RemoveDir {
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
    std::string path;
  } remove_dir{dir};
  ChildOptions on_server;
  on_server.netns_path = net.netns_path(kServer);
  std::vector<std::string> margs =
      testing::MasterArgs(dir + "/master", net.address(kServer) + ":0");
  margs.push_back("--insecure");
  auto m = LaunchDaemon("master", FLAGS_master_binary, "master/hymcache-master",
                        margs, on_server);
  if (!m.ok()) return 1;
  auto master = testing::ParseMasterReadyLine(m->ready_line());
  if (!master.ok()) return 1;
  std::vector<std::string> sargs = testing::StorageArgs(*master, "server-node");
  sargs.push_back("--insecure");
  sargs.push_back("--listen_host=" + net.address(kServer));
  sargs.push_back(absl::StrCat(
      "--dram_bytes=",
      (largest * FLAGS_blocks * 2 + (uint64_t{64} << 20)) >> 20, "M"));
  auto node = LaunchDaemon("node", FLAGS_storage_binary,
                           "storage_node/hymcache-storage", sargs, on_server);
  if (!node.ok()) return 1;
  // The raw server's socket in the server host; its thread ends when the
  // socket is shut down, on every way out of here.
  std::string raw_address;
  Socket listener;
  {
    auto in = net.EnterHost(kServer);
    if (!in.ok()) return 1;
    auto ls = ListenTcp(net.address(kServer), 0);
    if (!ls.ok()) return 1;
    listener = std::move(*ls);
    raw_address =
        absl::StrCat(net.address(kServer), ":", *LocalPort(listener.fd()));
  }
  struct RawServer {
    explicit RawServer(int fd)
        : fd(fd), thread("raw-server", [fd] { ServeRaw(fd); }) {}
    ~RawServer() {
      shutdown(fd, SHUT_RDWR);
      thread.Join();
    }
    int fd;
    Thread thread;
  } raw_server(listener.fd());

  // The client host: this thread, its Client and their threads.
  auto in = net.EnterHost(kClient);
  if (!in.ok()) return 1;
  ClientOptions co;
  co.master_address = *master;
  co.transport = TransportKind::kTcp;
  auto client = Client::Create(co);
  if (!client.ok() || !testing::WaitForLiveNodes(**client, 1).ok()) {
    std::fprintf(stderr, "netns_bench: no cluster\n");
    return 1;
  }
  Client& c = **client;
  std::string shaped;
  if (FLAGS_rate_mbit > 0) {
    absl::StrAppend(&shaped, ", links shaped to ", FLAGS_rate_mbit, " Mbit/s");
  }
  if (FLAGS_latency_us > 0 || FLAGS_delayer) {
    absl::StrAppend(&shaped, ", ", FLAGS_latency_us, " us per host link (",
                    FLAGS_latency_us * 4, " us RTT)");
  }
  std::printf("netns: client %s -> server %s%s\n", net.address(kClient).c_str(),
              net.address(kServer).c_str(), shaped.c_str());
  std::printf("%-10s %12s %12s %8s\n", "what", "raw", "hymcache", "ratio");
  std::string last = "netns:";
  int bad = 0;

  for (uint64_t size : sizes) {
    std::vector<std::string> keys;
    std::vector<std::vector<char>> src(FLAGS_blocks,
                                       std::vector<char>(size, 'k'));
    std::vector<std::vector<char>> dst(FLAGS_blocks, std::vector<char>(size));
    std::vector<ConstBuffer> in_bufs;
    std::vector<MutableBuffer> out_bufs;
    for (int i = 0; i < FLAGS_blocks; ++i) {
      keys.push_back(absl::StrCat("netns-get-", size, "-", i));
      in_bufs.push_back({src[i].data(), size});
      out_bufs.push_back({dst[i].data(), size});
    }
    // Stored a block per call: the master bounds one caller's pending puts
    // on a node (25% of its capacity).
    for (int i = 0; i < FLAGS_blocks; ++i) {
      StoreOptions so;
      so.deadline = absl::Now() + absl::Seconds(60);
      auto stored = c.Store({keys[i]}, {in_bufs[i]}, so)->Wait(so.deadline);
      if (!stored.ok() || stored->stored != 1) {
        std::fprintf(
            stderr, "netns_bench: store of a %llu-byte block failed: %s\n",
            static_cast<unsigned long long>(size),
            stored.ok() ? "not stored" : stored.status().ToString().c_str());
        return 1;
      }
    }
    Best best;
    for (int t = 0; t < FLAGS_trials; ++t) {
      // As the TCP transport reads a batch: exchanges of at most 16 MiB
      // (TcpTransportOptions::max_read_frame_bytes).
      const double raw_s =
          RawRoundTrips(raw_address, 1, size, dst,
                        std::max<uint64_t>(1, (16 << 20) / size), FLAGS_rounds);
      const absl::Time t0 = absl::Now();
      size_t loaded = 0;
      for (int r = 0; r < FLAGS_rounds; ++r) {
        auto got = c.Get(keys, out_bufs);
        if (got.ok()) loaded += got->loaded;
      }
      const double hym_s = absl::ToDoubleSeconds(absl::Now() - t0);
      // Every byte of every block is the stored one (the raw trial before
      // filled them with 'x').
      bool exact = loaded == keys.size() * FLAGS_rounds;
      for (const auto& d : dst) {
        exact = exact && std::all_of(d.begin(), d.end(),
                                     [](char ch) { return ch == 'k'; });
      }
      if (!exact) ++bad;
      const double bytes =
          static_cast<double>(size) * FLAGS_blocks * FLAGS_rounds;
      best.Keep(raw_s > 0 ? bytes / raw_s / 1e9 : 0, bytes / hym_s / 1e9);
    }
    const std::string name = size >= (1 << 20)
                                 ? absl::StrCat("get", size >> 20, "m")
                                 : absl::StrCat("get", size >> 10, "k");
    std::printf("%-10s %9.2f GB/s %7.2f GB/s %7.2fx\n", name.c_str(), best.raw,
                best.hym, best.ratio());
    absl::StrAppend(&last, " ", name,
                    "_vs_raw=", absl::StrFormat("%.2f", best.ratio()));
  }

  // Lookups: keys stored as one chain of small blocks.
  std::vector<std::string> lkeys;
  std::vector<char> small(4096, 'l');
  std::vector<ConstBuffer> lbufs;
  for (int i = 0; i < FLAGS_lookup_keys; ++i) {
    lkeys.push_back(absl::StrCat("netns-lookup-", i, "-0123456789abcdef"));
    lbufs.push_back({small.data(), small.size()});
  }
  StoreOptions so;
  so.deadline = absl::Now() + absl::Seconds(30);
  auto stored = c.Store(lkeys, lbufs, so)->Wait(so.deadline);
  auto sample = c.BatchLookup(lkeys);  // also warms the lookup path
  if (!stored.ok() || !sample.ok() ||
      sample->hit_prefix != static_cast<size_t>(FLAGS_lookup_keys)) {
    std::fprintf(stderr, "netns_bench: lookup keys not stored\n");
    return 1;
  }
  // What one call moves each way, as measured on the client host's link
  // (its eth0 counters over `calibrate` calls, less 66 bytes of Ethernet,
  // IP and TCP headers per packet): gRPC's request and answer with their
  // HTTP/2 framing, which the raw round trips then move as plain bytes.
  const int calibrate = 200;
  const WireBytes w0 = ReadWireBytes();
  for (int i = 0; i < calibrate; ++i) c.BatchLookup(lkeys).IgnoreError();
  const WireBytes w1 = ReadWireBytes();
  const size_t req_bytes =
      std::max<int64_t>(1, (w1.tx_payload() - w0.tx_payload()) / calibrate);
  const size_t resp_bytes =
      std::max<int64_t>(1, (w1.rx_payload() - w0.rx_payload()) / calibrate);
  Best lookups;
  std::vector<std::vector<char>> ldst(1, std::vector<char>(resp_bytes));
  for (int t = 0; t < FLAGS_trials; ++t) {
    const double raw_s = RawRoundTrips(raw_address, req_bytes, resp_bytes, ldst,
                                       1, FLAGS_lookups);
    const absl::Time t0 = absl::Now();
    int ok = 0;
    for (int i = 0; i < FLAGS_lookups; ++i) ok += c.BatchLookup(lkeys).ok();
    const double hym_s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (ok != FLAGS_lookups) ++bad;
    lookups.Keep(raw_s > 0 ? FLAGS_lookups / raw_s : 0, FLAGS_lookups / hym_s);
  }
  std::printf(
      "%-10s %7.0f calls/s %5.0f calls/s %6.2fx   (%zu B up, %zu B down)\n",
      absl::StrCat("lookup", FLAGS_lookup_keys).c_str(), lookups.raw,
      lookups.hym, lookups.ratio(), req_bytes, resp_bytes);
  absl::StrAppend(&last, " lookup", FLAGS_lookup_keys,
                  "_vs_raw=", absl::StrFormat("%.2f", lookups.ratio()));

  const testing::LinkDelayerStats d = net.delayer_stats();
  if (d.packets > 0) {
    std::printf(
        "delayer: %llu packets in %llu verdicts, at most %.0f us late, "
        "%llu dropped (queue full), %llu notice overruns; its thread used "
        "%.1f s of CPU in %.1f s\n",
        static_cast<unsigned long long>(d.packets),
        static_cast<unsigned long long>(d.verdict_batches),
        absl::ToDoubleMicroseconds(d.max_lateness),
        static_cast<unsigned long long>(d.kernel_dropped),
        static_cast<unsigned long long>(d.receive_overruns),
        absl::ToDoubleSeconds(d.thread_cpu),
        absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (bad > 0) {
    std::fprintf(stderr, "netns_bench: %d trials lost or got wrong data\n",
                 bad);
    return 1;
  }
  std::printf("%s\n", last.c_str());
  return 0;
}

}  // namespace
}  // namespace hymcache

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "netns_bench",
       .usage = "netns_bench: GETs and lookups across network-namespace hosts "
                "vs a raw socket on the same link",
       .main_file = __FILE__},
      &argc, &argv);
  return hymcache::Run();
}
