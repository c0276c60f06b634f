// Resource limits against hostile callers, with the real daemons on
// loopback: idle data connections, a flood of never-committed PutStarts,
// oversized and stale node registrations. A legitimate caller is served
// throughout, and the daemons' memory stays bounded.
#include <arpa/inet.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/block_key.h"
#include "client/client.h"
#include "common/eventually.h"
#include "common/net.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"
#include "tests/daemon.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

using testing::Eventually;
using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;
namespace pb = ::hymcache::v1;

// A field of /proc/PID/status ("VmRSS" in KiB, "Threads").
uint64_t ProcStatus(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream rest(line.substr(field.size() + 1));
    uint64_t v = 0;
    rest >> v;
    return v;
  }
  return 0;
}

void RaiseDescriptorLimit() {
  struct rlimit r;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &r) == 0);
  r.rlim_cur = r.rlim_max;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &r) == 0);
}

// A TCP connection from `source` (another peer address on loopback).
Socket ConnectFrom(const char* source, const std::string& to) {
  auto hp = SplitHostPort(to);
  REQUIRE(hp.ok());
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  Socket s(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, source, &a.sin_addr) == 1);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  sockaddr_in b{};
  b.sin_family = AF_INET;
  b.sin_port = htons(static_cast<uint16_t>(hp->second));
  REQUIRE(inet_pton(AF_INET, hp->first.c_str(), &b.sin_addr) == 1);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&b), sizeof(b)) == 0);
  return s;
}

std::vector<std::string> Keys(size_t n, const std::string& model) {
  KeyNamespace ns;
  ns.model = model;
  BlockKeyBuilder b(ns, 16);
  std::vector<int32_t> tokens(n * 16);
  std::iota(tokens.begin(), tokens.end(), 1);
  return b.Keys(tokens);
}

// Stores `n` blocks of 1 MiB under `model` and reads them back.
void PutAndGet(Client& c, const std::string& model, size_t n = 4) {
  std::vector<std::string> keys = Keys(n, model);
  std::vector<std::vector<uint8_t>> data;
  std::mt19937 rng(static_cast<uint32_t>(model.size()));
  for (size_t i = 0; i < n; ++i) {
    data.emplace_back(1 << 20);
    for (auto& x : data.back()) x = static_cast<uint8_t>(rng());
  }
  std::vector<ConstBuffer> in;
  for (const auto& d : data) in.push_back({d.data(), d.size()});
  auto put = c.Put(keys, in);
  INFO(put.status().ToString());
  REQUIRE(put.ok());
  REQUIRE(put->stored == n);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(1 << 20));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto got = c.Get(keys, bufs);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->loaded == n);
  for (size_t i = 0; i < n; ++i) CHECK(out[i] == data[i]);
}

// Bound on the master's RSS growth across the test. ASan keeps freed memory
// in its quarantine (256 MiB by default), which the parsed and refused
// registrations pass through.
#if defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kMasterGrowthKiB = 400 * 1024;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr uint64_t kMasterGrowthKiB = 400 * 1024;
#else
constexpr uint64_t kMasterGrowthKiB = 150 * 1024;
#endif
#else
constexpr uint64_t kMasterGrowthKiB = 150 * 1024;
#endif

TEST_CASE("Hostile callers do not deny service to a legitimate one") {
  RaiseDescriptorLimit();
  const std::string dir = TempDir("limits");
  auto m = MasterProcess::Start(
      dir + "/master", "127.0.0.1:0",
      {"--node_timeout_ms=1500", "--heartbeat_interval_ms=300"});
  REQUIRE(m.ok());
  const std::string v4 = m->address;
  auto n = StorageProcess::Start(v4, "node-0", {"--dram_bytes=64M"});
  REQUIRE(n.ok());
  ClientOptions co;
  co.master_address = v4;
  auto client = Client::Create(co);
  REQUIRE(client.ok());
  Client& c = **client;
  REQUIRE(Eventually([&] {
    auto st = c.GetClusterStatus();
    return st.ok() && st->nodes.size() == 1 && st->nodes[0].alive;
  }));
  PutAndGet(c, "warm-up");
  const pid_t master_pid = m->daemon.pid();
  const pid_t node_pid = n->daemon.pid();
  const uint64_t master_rss = ProcStatus(master_pid, "VmRSS");
  const uint64_t node_rss = ProcStatus(node_pid, "VmRSS");
  const uint64_t node_threads = ProcStatus(node_pid, "Threads");
  REQUIRE(master_rss > 0);
  REQUIRE(node_threads > 0);

  // 1. 1,100 idle data connections from another peer (127.0.0.2): the
  // node holds no thread for them, keeps its per-peer limit (1,024), and
  // a legitimate GET is served.
  auto control = pb::StorageControl::NewStub(grpc::CreateChannel(
      n->control_address, grpc::InsecureChannelCredentials()));
  auto open_connections = [&]() -> uint64_t {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::StorageStatsResponse r;
    if (!control->GetStats(&ctx, pb::StorageStatsRequest(), &r).ok()) return 0;
    return r.open_connections();
  };
  {
    std::vector<Socket> idle;
    for (int i = 0; i < 1100; ++i) {
      idle.push_back(ConnectFrom("127.0.0.2", n->data_address));
    }
    CHECK(Eventually([&] { return open_connections() >= 1024; }));
    PutAndGet(c, "beside-idle-connections");
    const uint64_t threads = ProcStatus(node_pid, "Threads");
    std::cerr << "resource_limits_test: node threads " << node_threads
              << " -> " << threads << " with " << open_connections()
              << " data connections open\n";
    CHECK(threads < node_threads + 32);
  }

  // 2. A flood of never-committed PutStarts from another caller
  // (127.0.0.2): refused once it holds a quarter of the node; the
  // legitimate caller still puts.
  Socket hostile_sock = ConnectFrom("127.0.0.2", v4);
  auto hostile = pb::MasterService::NewStub(grpc::CreateInsecureChannelFromFd(
      v4, dup(hostile_sock.fd())));
  hostile_sock.Close();
  grpc::Status refused;
  int started = 0;
  for (int i = 0; i < 200 && refused.ok(); ++i) {
    pb::PutStartRequest req;
    for (int k = 0; k < 64; ++k) {
      req.add_keys(absl::StrCat("flood-", i, "-", k));
      req.add_lengths(4096);
    }
    grpc::ClientContext ctx;
    pb::PutStartResponse resp;
    refused = hostile->PutStart(&ctx, req, &resp);
    if (refused.ok()) ++started;
  }
  INFO(refused.error_message());
  CHECK(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(refused.error_message().find("pending puts") != std::string::npos);
  // A quarter of 64 MiB in puts of 256 KiB.
  CHECK(started >= 60);
  CHECK(started <= 64);
  PutAndGet(c, "beside-a-put-flood");

  // 3. Oversized registrations are refused; ListNodes stays answerable.
  for (int i = 0; i < 5; ++i) {
    pb::RegisterNodeRequest req;
    req.set_name(absl::StrCat("fake-", i));
    req.set_incarnation(1);
    req.set_data_address("127.0.0.1:1");
    req.set_control_address("127.0.0.1:2");
    auto* r = req.add_regions();
    r->set_capacity_bytes(1 << 20);
    r->set_alignment(4096);
    (*req.mutable_transport_params())["x"] = std::string(15 << 20, 'p');
    grpc::ClientContext ctx;
    pb::RegisterNodeResponse resp;
    grpc::Status s = hostile->RegisterNode(&ctx, req, &resp);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("transport_params") != std::string::npos);
  }
  auto st = c.GetClusterStatus();
  REQUIRE(st.ok());
  CHECK(st->nodes.size() == 1);

  // 4. A node record that stops heartbeating is removed by an admin (not
  // while it may come back: once it is not alive it was unseen for the
  // node timeout). It heartbeats once, as a node does right after it
  // registers (until then it is not listed alive).
  {
    pb::RegisterNodeRequest req;
    req.set_name("ghost");
    req.set_incarnation(1);
    req.set_data_address("127.0.0.1:1");
    req.set_control_address("127.0.0.1:2");
    auto* r = req.add_regions();
    r->set_capacity_bytes(1 << 20);
    r->set_alignment(4096);
    grpc::ClientContext ctx;
    pb::RegisterNodeResponse resp;
    REQUIRE(hostile->RegisterNode(&ctx, req, &resp).ok());
    grpc::ClientContext hctx;
    pb::HeartbeatResponse hb;
    REQUIRE(hostile->Heartbeat(&hctx, master::ProvingHeartbeat(req, resp), &hb)
                .ok());
  }
  hymctl::Options ho;
  ho.master_address = v4;
  std::ostringstream out, err;
  CHECK(hymctl::Run(ho, {"node", "forget", "node-0"}, out, err) == 1);
  CHECK(err.str().find("FAILED_PRECONDITION") != std::string::npos);
  REQUIRE(Eventually([&] {
    auto s = c.GetClusterStatus();
    if (!s.ok()) return false;
    for (const auto& node : s->nodes) {
      if (node.name == "ghost") return !node.alive;
    }
    return false;
  }));
  out.str("");
  err.str("");
  CHECK(hymctl::Run(ho, {"node", "forget", "ghost"}, out, err) == 0);
  CHECK(out.str().find("forgot node") != std::string::npos);
  st = c.GetClusterStatus();
  REQUIRE(st.ok());
  CHECK(st->nodes.size() == 1);

  // Memory stayed bounded (generous: the master parsed 75 MiB of hostile
  // registrations; the node accepted 1,100 connections).
  const uint64_t master_after = ProcStatus(master_pid, "VmRSS");
  const uint64_t node_after = ProcStatus(node_pid, "VmRSS");
  std::cerr << "resource_limits_test: master RSS " << master_rss << " -> "
            << master_after << " KiB; node RSS " << node_rss << " -> "
            << node_after << " KiB; " << started << " flood puts started\n";
  CHECK(master_after < master_rss + kMasterGrowthKiB);
  CHECK(node_after < node_rss + 96 * 1024);
  CHECK(m->daemon.Alive());
  CHECK(n->daemon.Alive());
}

}  // namespace
}  // namespace hymcache
