// The one-sided data planes end to end: the real master and storage binaries
// (DRAM and hybrid devices) with clients on the shared-memory, RDMA and auto
// transports. Store and Load byte for byte, with the node's counters showing
// which plane moved the bytes.
//
// RDMA needs a device: on a host without one the RDMA cases check that RDMA
// is reported unavailable (client and node) and stop there. Inside the
// QEMU guest of tests/vmtest (Soft-RoCE), HYMCACHE_REQUIRE_RDMA=1 makes a
// missing device a failure. HYMCACHE_NUMA_NODE=N (or HYMCACHE_CXL_NODE, set
// by the vmtest cxl mode) places the shared-memory DRAM node's memory on NUMA
// node N: a client then loads and stores CXL memory with plain copies.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/net.h"
#include "common/rdma.h"
#include "common/wire.h"
#include "common/thread.h"
#include "proto/storage.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;

bool RequireRdma() {
  const char* v = std::getenv("HYMCACHE_REQUIRE_RDMA");
  return v != nullptr && std::string(v) == "1";
}

// O_DIRECT on the capacity file, unless the test's directory is on tmpfs
// (as inside the vmtest guest), which refuses it.
std::string DirectIoFlag() {
  struct statfs fs;
  const char* dir = std::getenv("TEST_TMPDIR");
  if (dir != nullptr && statfs(dir, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    return "--io_direct=false";
  }
  return "--io_direct=true";
}

// HYMCACHE_NUMA_NODE, else the CXL node the vmtest cxl mode announces.
int NumaNode() {
  const char* v = std::getenv("HYMCACHE_NUMA_NODE");
  if (v == nullptr) v = std::getenv("HYMCACHE_CXL_NODE");
  return v == nullptr ? -1 : std::atoi(v);
}

std::vector<uint8_t> Bytes(size_t i, size_t len) {
  std::vector<uint8_t> b(len);
  std::mt19937_64 rng(i * 0x9E3779B97F4A7C15ull + 17);
  for (size_t k = 0; k < len; k += 8) {
    uint64_t v = rng();
    std::memcpy(&b[k], &v, std::min<size_t>(8, len - k));
  }
  return b;
}

std::map<std::string, double> NodeStats(const StorageProcess& node,
                                        v1::StorageStatsResponse* full = nullptr) {
  auto stub = v1::StorageControl::NewStub(grpc::CreateChannel(
      node.control_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StorageStatsRequest req;
  v1::StorageStatsResponse resp;
  REQUIRE(stub->GetStats(&ctx, req, &resp).ok());
  if (full != nullptr) *full = resp;
  return {resp.device_stats().begin(), resp.device_stats().end()};
}

struct Cluster {
  std::string dir = TempDir("direct");
  MasterProcess master;
  StorageProcess node;

  explicit Cluster(std::vector<std::string> node_flags) {
    // One trusted caller stores most of a small node in one Store.
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0",
                                  {"--max_pending_share_per_caller=1"});
    REQUIRE(m.ok());
    master = std::move(*m);
    // "$DIR" in a flag: this cluster's directory.
    for (std::string& f : node_flags) {
      size_t at = f.find("$DIR");
      if (at != std::string::npos) f.replace(at, 4, dir);
    }
    auto s = StorageProcess::Start(master.address, "direct-node", node_flags);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    node = std::move(*s);
  }

  // The capacity files and databases go with the cluster (the vmtest guest
  // keeps TEST_TMPDIR in RAM).
  ~Cluster() {
    if (node.daemon.running()) node.daemon.Stop(SIGKILL).IgnoreError();
    if (master.daemon.running()) master.daemon.Stop(SIGKILL).IgnoreError();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  std::unique_ptr<Client> NewClient(TransportKind kind) {
    ClientOptions o;
    o.master_address = master.address;
    o.transport = kind;
    auto c = Client::Create(o);
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    absl::Status alive = testing::WaitForLiveNodes(**c, 1, {node.data_address});
    INFO(alive.ToString());
    REQUIRE(alive.ok());
    return std::move(*c);
  }
};

// Stores n blocks of `len` through `client` (retrying refusals of a full
// write buffer), loads them back and checks every byte.
// How RoundTrip registers its buffers (Client::RegisterMemory): not at all;
// registered where registration is a no-op (shared memory, TCP); registered
// and pinned (RDMA moves them in place; overlaps and double unregistration
// are refused).
enum class Reg { kNone, kNoop, kPinned };

void RoundTrip(Client& client, const std::string& ns, size_t n, size_t len,
               Reg reg = Reg::kNone) {
  const bool register_memory = reg != Reg::kNone;
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(absl::StrCat(ns, "/", i));
    data.push_back(Bytes(i, len));
  }
  if (register_memory) {
    for (auto& d : data) REQUIRE(client.RegisterMemory(d.data(), d.size()).ok());
    if (reg == Reg::kPinned) {
      // Overlapping a registration is refused.
      CHECK(client.RegisterMemory(data[0].data() + 1, 10).code() ==
            absl::StatusCode::kInvalidArgument);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (true) {
      ConstBuffer in{data[i].data(), data[i].size()};
      StoreOptions so;
      so.deadline = absl::Now() + absl::Seconds(20);
      if (i > 0) so.parent_key = keys[i - 1];
      auto r = client.Store({keys[i]}, {in}, so)->Wait();
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      if (r->stored == 1) break;
      INFO(r->errors[0].ToString());
      REQUIRE(r->refused == 1);
      REQUIRE(absl::Now() < give_up);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(len));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  if (register_memory) {
    for (auto& o : out) REQUIRE(client.RegisterMemory(o.data(), o.size()).ok());
  }
  for (bool prefetch : {true, false}) {
    LoadOptions lo;
    lo.prefetch = prefetch;
    lo.deadline = absl::Now() + absl::Seconds(60);
    auto l = client.Load(keys, bufs, lo);
    REQUIRE(l.ok());
    INFO(l->stop_reason.ToString());
    REQUIRE(l->loaded == n);
    for (size_t i = 0; i < n; ++i) {
      INFO("block " << i);
      REQUIRE(out[i] == data[i]);
      std::fill(out[i].begin(), out[i].end(), 0);
    }
  }
  if (register_memory) {
    for (auto& d : data) CHECK(client.UnregisterMemory(d.data()).ok());
    for (auto& o : out) CHECK(client.UnregisterMemory(o.data()).ok());
    if (reg == Reg::kPinned) {
      CHECK(client.UnregisterMemory(out[0].data()).code() ==
            absl::StatusCode::kNotFound);
    }
  }
}

TEST_CASE("shared memory: DRAM node, bytes move through the mapping") {
  std::vector<std::string> flags = {"--device=dram", "--dram_bytes=256M",
                                    "--rdma=off"};
  if (NumaNode() >= 0) flags.push_back(absl::StrCat("--numa_node=", NumaNode()));
  Cluster c(flags);
  auto client = c.NewClient(TransportKind::kShm);
  RoundTrip(*client, "shm-dram", 24, (1 << 20) + 12345);
  // Registration is a no-op for shared memory, and harmless.
  RoundTrip(*client, "shm-dram-reg", 2, 4096, Reg::kNoop);
  v1::StorageStatsResponse full;
  auto st = NodeStats(c.node, &full);
  CHECK(st["direct_write_ops"] == 0);  // read-only mapping: writes over TCP
  CHECK(full.write_ops() == 26);
  CHECK(st["direct_acquired_ops"] == 52);
  CHECK(full.read_ops() == 0);  // no bytes went over TCP
  CHECK(full.bytes_read() == 0);
  if (NumaNode() >= 0) {
    REQUIRE(full.regions_size() >= 1);
    CHECK(full.regions(0).numa_node() == NumaNode());
  }
}

TEST_CASE("shared memory: hybrid node, staging window and write buffer") {
  Cluster c({"--device=hybrid", "--capacity_path=$DIR/c.dat",
             "--capacity_bytes=256M", "--staging_bytes=8M",
             "--write_buffer_bytes=8M", "--rdma=off", DirectIoFlag()});
  auto client = c.NewClient(TransportKind::kAuto);  // same host: shm
  RoundTrip(*client, "shm-hybrid", 40, 1 << 20);
  auto st = NodeStats(c.node);
  CHECK(st["direct_write_ops"] == 0);
  CHECK(st["direct_acquired_ops"] == 80);
  // Releases reach the node just after each read returns.
  bool released = false;
  for (int i = 0; i < 200 && !released; ++i) {
    released = NodeStats(c.node)["prefetch_sessions"] == 0;
    if (!released) absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(released);
}

TEST_CASE("a node without shared memory is reached over TCP by auto") {
  Cluster c({"--device=dram", "--dram_bytes=64M", "--shm=false", "--rdma=off"});
  auto client = c.NewClient(TransportKind::kAuto);
  RoundTrip(*client, "tcp", 8, 100000);
  auto st = NodeStats(c.node);
  CHECK(st["direct_write_ops"] == 0);
  CHECK(st["direct_acquired_ops"] == 0);
  // Shared memory only: the node is unreachable, reported, not a crash.
  auto shm = c.NewClient(TransportKind::kShm);
  std::vector<uint8_t> b(100000);
  MutableBuffer buf{b.data(), b.size()};
  auto l = shm->Load({"tcp/0"}, {buf});
  REQUIRE(l.ok());
  CHECK(l->loaded == 0);
  CHECK(l->stop_reason.code() == absl::StatusCode::kUnavailable);
}

// Asks the node at `data_address` for a queue pair with a grant whose
// capability is forged; returns the status of its answer.
absl::StatusCode ForgedRdmaConnect(const std::string& data_address) {
  auto dev = rdma::Device::Open({});
  REQUIRE(dev.ok());
  auto qp = rdma::QueuePair::Create(dev->get(), {});
  REQUIRE(qp.ok());
  const std::string info = (*qp)->local_info().Encode();
  wire::OpDesc grant;
  grant.region_id = 0;
  grant.addr = 0;
  grant.length = 4096;
  grant.generation = 1;
  grant.cap.rights = wire::kCapRead;
  grant.cap.expires_unix_ms = absl::ToUnixMillis(absl::Now() + absl::Minutes(5));
  std::memset(grant.cap.tag, 0x5A, sizeof(grant.cap.tag));
  wire::FrameHeader h;
  h.type = wire::FrameType::kRdmaConnectRequest;
  h.op_count = 1;
  h.request_id = 1;
  h.payload_bytes = info.size();
  std::string frame(wire::kHeaderBytes + wire::kOpBytes + wire::kCapBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(frame.data());
  wire::EncodeHeader(h, p);
  wire::EncodeOp(grant, p + wire::kHeaderBytes);
  wire::EncodeCapability(grant.cap, p + wire::kHeaderBytes + wire::kOpBytes);
  frame += info;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto s = ConnectTcp(data_address, deadline);
  REQUIRE(s.ok());
  REQUIRE(SendAll(s->fd(), frame.data(), frame.size(), deadline).ok());
  uint8_t hb[wire::kHeaderBytes];
  REQUIRE(RecvAll(s->fd(), hb, sizeof(hb), deadline).ok());
  auto r = wire::DecodeHeader(hb);
  REQUIRE(r.ok());
  CHECK(r->type == wire::FrameType::kError);
  return wire::FromWireCode(r->status);
}

TEST_CASE("RDMA: one-sided reads and writes, or reported unavailable") {
  const bool have = rdma::Available().ok();
  if (!have) {
    REQUIRE_FALSE(RequireRdma());
    // The client reports RDMA unavailable instead of crashing...
    ClientOptions o;
    o.master_address = "127.0.0.1:1";
    o.transport = TransportKind::kRdma;
    auto c = Client::Create(o);
    CHECK(c.status().code() == absl::StatusCode::kUnavailable);
    // ... and so does a node asked for it.
    auto m = MasterProcess::Start(TempDir("nordma") + "/master", "127.0.0.1:0");
    REQUIRE(m.ok());
    auto s = StorageProcess::Start(m->address, "rdma-node",
                                   {"--device=dram", "--dram_bytes=64M", "--rdma=on"});
    CHECK_FALSE(s.ok());
    WARN("no RDMA device on this host: RDMA data plane not exercised ("
         << rdma::Available().message() << ")");
    return;
  }
  for (const char* device : {"dram", "hybrid"}) {
    INFO(device);
    std::vector<std::string> flags = {absl::StrCat("--device=", device),
                                      "--rdma=on", "--shm=false"};
    if (std::string(device) == "dram") {
      flags.push_back("--dram_bytes=128M");
      // Several registrations: no object may straddle two.
      flags.push_back("--max_region_bytes=16M");
    } else {
      flags.push_back("--capacity_path=$DIR/c.dat");
      // Room for the 12 MiB blocks of the registered round trip.
      flags.insert(flags.end(), {"--capacity_bytes=256M", "--staging_bytes=48M",
                                 "--write_buffer_bytes=48M", DirectIoFlag()});
    }
    Cluster c(flags);
    auto client = c.NewClient(TransportKind::kRdma);
    RoundTrip(*client, absl::StrCat("rdma-", device), 20, (1 << 20) + 4096);
    // Engine-owned buffers registered: moved in place, 12 MiB blocks (more
    // than one 8 MiB Soft-RoCE message each, within one 16 MiB region).
    RoundTrip(*client, absl::StrCat("rdma-reg-", device), 3, 12 << 20,
              Reg::kPinned);
    auto st = NodeStats(c.node);
    CHECK(st["rdma_enabled"] == 1);
    CHECK(st["rdma_connections"] >= 1);
    // No queue pair without a capability the master issued for an object
    // on this node.
    CHECK(ForgedRdmaConnect(c.node.data_address) ==
          absl::StatusCode::kPermissionDenied);
    CHECK(NodeStats(c.node)["rdma_connections"] == st["rdma_connections"]);
    CHECK(st["direct_write_ops"] == 23);
    CHECK(st["direct_acquired_ops"] == 46);
    // The same round trip over TCP against the same RDMA-enabled node.
    auto tcp = c.NewClient(TransportKind::kTcp);
    RoundTrip(*tcp, absl::StrCat("tcp-", device), 10, (1 << 20) + 4096);
    CHECK(NodeStats(c.node)["direct_write_ops"] == 23);
  }
}

// Kills the storage node while a Load of many blocks is moving them: the
// Load ends with an error, every block it reports loaded is right, and
// nothing crashes.
void KillMidTransfer(TransportKind kind, std::vector<std::string> flags,
                     const std::string& ns) {
  Cluster c(flags);
  auto client = c.NewClient(kind);
  constexpr size_t kN = 48;
  constexpr size_t kLen = 4 << 20;
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < kN; ++i) {
    keys.push_back(absl::StrCat(ns, "/", i));
    data.push_back(Bytes(i + 1000, kLen));
  }
  for (auto& d : data) in.push_back({d.data(), d.size()});
  auto put = client->Store(keys, in, {.deadline = absl::Now() + absl::Seconds(60)})->Wait();
  REQUIRE(put.ok());
  REQUIRE(put->stored == kN);

  std::vector<std::vector<uint8_t>> out(kN, std::vector<uint8_t>(kLen, 0xEE));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  absl::StatusOr<LoadResult> result;
  Thread loader("loader", [&] {
    LoadOptions lo;
    lo.deadline = absl::Now() + absl::Seconds(60);
    result = client->Load(keys, bufs, lo);
  });
  // Kill as soon as bytes start moving (by TCP or by holds for direct
  // copies).
  for (int i = 0; i < 20000; ++i) {
    v1::StorageStatsResponse full;
    auto st = NodeStats(c.node, &full);
    if (full.bytes_read() > 0 || st["direct_acquired_ops"] > 0) break;
    absl::SleepFor(absl::Microseconds(500));
  }
  REQUIRE(c.node.daemon.Stop(SIGKILL).ok());
  loader.Join();
  REQUIRE(result.ok());
  // For the log: how far the load got before the node died.
  std::printf("kill mid-transfer [%s]: loaded %zu of %zu blocks: %s\n",
              ns.c_str(), result->loaded, kN,
              result->stop_reason.ToString().c_str());
  INFO("loaded " << result->loaded << " of " << kN << ": "
                 << result->stop_reason.ToString());
  if (result->loaded < kN) {
    CHECK_FALSE(result->stop_reason.ok());
  }
  for (size_t i = 0; i < result->loaded; ++i) {
    INFO("block " << i);
    REQUIRE(out[i] == data[i]);
  }
  // A new Load fails cleanly: the node is gone.
  auto again = client->Load(keys, bufs, {.deadline = absl::Now() + absl::Seconds(20)});
  if (again.ok()) {
    CHECK(again->loaded < kN);
    for (size_t i = 0; i < again->loaded; ++i) REQUIRE(out[i] == data[i]);
  }
}

TEST_CASE("a storage node killed mid-transfer: errors, never wrong bytes") {
  SECTION("tcp") {
    KillMidTransfer(TransportKind::kTcp,
                    {"--device=dram", "--dram_bytes=256M", "--rdma=off"}, "kill-tcp");
  }
  SECTION("shm") {
    KillMidTransfer(TransportKind::kShm,
                    {"--device=dram", "--dram_bytes=256M", "--rdma=off"}, "kill-shm");
  }
  SECTION("rdma") {
    if (!rdma::Available().ok()) {
      REQUIRE_FALSE(RequireRdma());
      return;
    }
    KillMidTransfer(TransportKind::kRdma,
                    {"--device=dram", "--dram_bytes=256M", "--rdma=on", "--shm=false"},
                    "kill-rdma");
  }
}

}  // namespace
}  // namespace hymcache
