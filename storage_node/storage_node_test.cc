#include "storage_node/storage_node.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/eventually.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/test_capabilities.h"
#include "common/thread.h"
#include "common/wire.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"

namespace hymcache {
namespace {

using testing::Eventually;

// Debian's Abseil is built with its mutex deadlock detector on. gRPC locks
// uninstrumented absl::Mutexes, so under TSan the detector's shared graph is
// reported as a race. The detector is a debugging aid; turn it off before
// gRPC starts (hymcache-storage does the same).
const bool kNoDeadlockDetector = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

// A port nothing listens on: bind one, then close it.
int UnusedPort() {
  auto s = ListenTcp("127.0.0.1", 0);
  REQUIRE(s.ok());
  auto p = LocalPort(s->fd());
  REQUIRE(p.ok());
  return *p;
}

StorageNodeOptions Options() {
  StorageNodeOptions o;
  o.master_address = "127.0.0.1:" + std::to_string(UnusedPort());
  o.dram()->capacity_bytes = 16 << 20;
  o.rpc_timeout = absl::Milliseconds(300);
  return o;
}

TEST_CASE("StorageNode comes up and serves with the master down") {
  StorageNodeOptions o = Options();
  o.node_name = "sn-test";
  auto node = StorageNode::Create(o);
  REQUIRE(node.ok());
  StorageNode& n = **node;
  CHECK(n.data_port() > 0);
  CHECK(n.control_port() > 0);
  CHECK(n.data_port() != n.control_port());
  CHECK(n.name() == "sn-test");
  CHECK(n.incarnation() != 0);
  CHECK(n.data_address() == "127.0.0.1:" + std::to_string(n.data_port()));
  CHECK_FALSE(n.registered());
  CHECK(n.node_id() == 0);
  CHECK_FALSE(n.WaitRegistered(absl::Now() + absl::Milliseconds(200)));

  // Data plane: ping.
  auto sock = ConnectTcp(n.data_address(), absl::Now() + absl::Seconds(5));
  REQUIRE(sock.ok());
  uint8_t hdr[wire::kHeaderBytes];
  wire::FrameHeader ping;
  ping.type = wire::FrameType::kPing;
  ping.request_id = 77;
  wire::EncodeHeader(ping, hdr);
  REQUIRE(SendAll(sock->fd(), hdr, sizeof(hdr), absl::Now() + absl::Seconds(5))
              .ok());
  REQUIRE(RecvAll(sock->fd(), hdr, sizeof(hdr), absl::Now() + absl::Seconds(5))
              .ok());
  auto pong = wire::DecodeHeader(hdr);
  REQUIRE(pong.ok());
  CHECK(pong->type == wire::FrameType::kPong);
  CHECK(pong->request_id == 77);

  // Control plane: stats.
  auto channel = grpc::CreateChannel(n.control_address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::StorageControl::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StorageStatsResponse stats;
  grpc::Status s = stub->GetStats(&ctx, v1::StorageStatsRequest(), &stats);
  REQUIRE(s.ok());
  CHECK(stats.name() == "sn-test");
  CHECK(stats.incarnation() == n.incarnation());
  CHECK_FALSE(stats.registered());
  REQUIRE(stats.regions_size() == 1);
  CHECK(stats.regions(0).capacity_bytes() == uint64_t{16} << 20);
  CHECK(stats.regions(0).device_kind() == "dram");
  CHECK(stats.regions(0).alignment() == 4096);
  CHECK(stats.open_connections() == 1);
  // Every stat by name: the data server's, the DRAM device's, the
  // prefetcher's; no hybrid device stats on a DRAM node.
  const auto& m = stats.device_stats();
  CHECK(m.at("open_connections") == 1);
  CHECK(m.at("capacity_bytes") == double{16 << 20});
  CHECK(m.count("shm_bytes_read") == 1);
  CHECK(m.count("prefetch_ready_reads") == 1);
  CHECK(m.count("read_seconds_count") == 1);
  CHECK(m.at("registered") == 0);
  CHECK(m.count("write_buffer_refusals") == 0);
  CHECK(n.metrics_address().empty());  // no metrics_listen

  absl::Time start = absl::Now();
  n.Shutdown();
  CHECK(absl::Now() - start < absl::Seconds(5));
  n.Wait();     // returns at once after Shutdown
  n.Shutdown();  // idempotent
}

TEST_CASE("StorageNode: a fresh incarnation every start") {
  StorageNodeOptions o = Options();
  auto a = StorageNode::Create(o);
  auto b = StorageNode::Create(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->incarnation() != (*b)->incarnation());
  // Default name: advertise host and data port.
  CHECK((*a)->name() == (*a)->data_address());
}

TEST_CASE("StorageNode: advertise_host is what the master is told") {
  StorageNodeOptions o = Options();
  o.advertise_host = "node7.example";
  auto n = StorageNode::Create(o);
  REQUIRE(n.ok());
  CHECK((*n)->data_address() ==
        "node7.example:" + std::to_string((*n)->data_port()));
  CHECK((*n)->control_address() ==
        "node7.example:" + std::to_string((*n)->control_port()));
}

TEST_CASE("StorageNode: Create fails on bad options or taken ports") {
  StorageNodeOptions o = Options();
  o.master_address = "";
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options();
  o.master_address = "no-port";
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options();
  o.dram()->alignment = 1000;
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options();
  o.dram()->capacity_bytes = 0;
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);

  auto taken = ListenTcp("127.0.0.1", 0);
  REQUIRE(taken.ok());
  int port = *LocalPort(taken->fd());
  o = Options();
  o.data.port = port;
  CHECK_FALSE(StorageNode::Create(o).ok());
  o = Options();
  o.control_port = port;
  CHECK_FALSE(StorageNode::Create(o).ok());
  o = Options();
  o.metrics_listen = absl::StrCat("127.0.0.1:", port);
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kUnavailable);
  o = Options();
  o.metrics_listen = "no-port";
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("StorageNodeOptions: Validate composes its parts' Validate") {
  StorageNodeOptions o = Options();
  REQUIRE(o.Validate().ok());
  // A master list, or etcd's endpoints (docs/ha.md), or both.
  o.master_address = "";
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.etcd_endpoints = "127.0.0.1:2379,http://127.0.0.1:2380";
  CHECK(o.Validate().ok());
  o.cluster = "a/b";
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.cluster = "prod";
  o.etcd_endpoints = "no-port";
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = Options();
  // The device's own checks.
  o.dram()->numa_node = -2;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = Options();
  StorageNodeOptions::HybridDevice hybrid;
  hybrid.tier.path = "/tmp/validate.cap";
  hybrid.tier.capacity_bytes = 64 << 20;
  o.device = hybrid;
  CHECK(absl::IsInvalidArgument(o.Validate()));  // no node_name
  o.node_name = "validate-node";
  CHECK(o.Validate().ok());
  o.hybrid()->device.flush_high_watermark = 2;
  absl::Status s = o.Validate();
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("flush_high_watermark") != absl::string_view::npos);
  o.hybrid()->device.flush_high_watermark = 0.5;
  o.hybrid()->tier.io.queue_depth = 0;  // the tier's I/O engine
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o.hybrid()->tier.io.queue_depth = 64;
  o.hybrid()->tier.capacity_bytes = 4095;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  // The LRU baseline: its capacity comes from the tier.
  o = Options();
  StorageNodeOptions::LruDevice lru;
  lru.tier.path = "/tmp/validate.cap";
  lru.tier.capacity_bytes = 64 << 20;
  lru.device.cache_bytes = 8 << 20;
  o.device = lru;
  CHECK(o.Validate().ok());
  o.lru()->device.cache_bytes = 4096;  // less than one line
  CHECK(absl::IsInvalidArgument(o.Validate()));
  // The data plane's and the prefetcher's settings.
  o = Options();
  o.data.max_requests_per_peer = 0;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = Options();
  o.prefetch.max_sessions = 0;
  CHECK(absl::IsInvalidArgument(o.Validate()));
  o = Options();
  o.rdma = static_cast<RdmaMode>(7);
  CHECK(absl::IsInvalidArgument(o.Validate()));
  // A name the master would refuse at registration (common/limits.h).
  o = Options();
  o.node_name = std::string(kMaxNodeNameBytes, 'n');
  CHECK(o.Validate().ok());
  o.node_name.push_back('n');
  s = o.Validate();
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("node_name") != absl::string_view::npos);
}

TEST_CASE("StorageNodeOptions: ShutdownBound counts a hybrid device's flush") {
  StorageNodeOptions o;
  CHECK(o.ShutdownBound() == absl::Seconds(13));
  o.device = StorageNodeOptions::HybridDevice();
  CHECK(o.ShutdownBound() == absl::Seconds(28));
}

TEST_CASE("StorageNodeOptions: the enums' names parse back; bad names say "
          "which are good") {
  for (RdmaMode m : {RdmaMode::kOff, RdmaMode::kAuto, RdmaMode::kOn}) {
    CHECK(*ParseRdmaMode(RdmaModeName(m)) == m);
  }
  using Engine = storage::BlockIoOptions::Engine;
  for (Engine e : {Engine::kAuto, Engine::kIoUring, Engine::kThreadPool}) {
    CHECK(*ParseIoEngine(IoEngineName(e)) == e);
  }
  using Submit = storage::BlockIoOptions::Submit;
  for (Submit m : {Submit::kAuto, Submit::kInline, Submit::kAsync}) {
    CHECK(*ParseIoSubmit(IoSubmitName(m)) == m);
  }
  CHECK(std::string(RdmaModeName(RdmaMode::kAuto)) == "auto");
  CHECK(std::string(IoEngineName(Engine::kIoUring)) == "io_uring");
  absl::StatusOr<RdmaMode> bad = ParseRdmaMode("maybe");
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message() == "rdma 'maybe' (want off, auto or on)");
  CHECK(ParseIoEngine("aio").status().message() ==
        "io_engine 'aio' (want auto, io_uring or threadpool)");
  CHECK(ParseIoSubmit("").status().message() ==
        "io_submit '' (want auto, inline or async)");
}

TEST_CASE("StorageNode: metrics_listen follows protected mode") {
  StorageNodeOptions o = Options();
  o.metrics_listen = "0.0.0.0:0";
  absl::Status s = o.Validate();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("metrics_listen") != absl::string_view::npos);
  o.insecure = true;
  CHECK(o.Validate().ok());
  o.insecure = false;
  o.metrics_listen = "[::1]:0";
  CHECK(o.Validate().ok());
  o.metrics_listen = "localhost:0";
  auto node = StorageNode::Create(o);
  REQUIRE(node.ok());
  CHECK(absl::StartsWith((*node)->metrics_address(), "127.0.0.1:"));
}

TEST_CASE("StorageNode: a capacity file larger than the free space is "
          "refused unless overcommit is allowed") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  struct statvfs vfs;
  REQUIRE(statvfs(dir.c_str(), &vfs) == 0);
  const uint64_t free_bytes =
      static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  StorageNodeOptions o = Options();
  StorageNodeOptions::HybridDevice hybrid;
  hybrid.tier.path = dir + "/overcommit.cap";
  hybrid.tier.capacity_bytes =
      (free_bytes + (uint64_t{1} << 40)) / 4096 * 4096;
  hybrid.tier.io.direct = false;  // whatever TEST_TMPDIR is
  hybrid.device.staging_bytes = 4 << 20;
  hybrid.device.write_buffer_bytes = 4 << 20;
  o.device = hybrid;
  o.node_name = "overcommit-node";
  o.expose_shm = false;
  o.shared_huge_pages = false;
  o.rdma = RdmaMode::kOff;
  const StorageNodeOptions::HybridDevice& h = *o.hybrid();
  auto refused = StorageNode::Create(o);
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  INFO(refused.status().ToString());
  CHECK(refused.status().message().find("free") != absl::string_view::npos);
  CHECK(refused.status().message().find(
            std::to_string(h.tier.capacity_bytes)) !=
        absl::string_view::npos);

  o.hybrid()->tier.allow_overcommit = true;
  auto node = StorageNode::Create(o);
  INFO(node.status().ToString());
  REQUIRE(node.ok());
  struct stat st;
  REQUIRE(stat(h.tier.path.c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) > h.tier.capacity_bytes);
  // Sparse: a few MiB at most are allocated.
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 < (uint64_t{16} << 20));
  (*node)->Shutdown();
}

// A stand-in for the master's node-liveness RPCs (the rest are
// unimplemented).
class FakeMaster final : public v1::MasterService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterNode(
      grpc::CallbackServerContext* ctx, const v1::RegisterNodeRequest* req,
      v1::RegisterNodeResponse* resp) override {
    MutexLock l(&mu_);
    ++registers_;
    // Every registration after the first proves the key this one issued.
    if (registers_ > 1 && !Proven(req->auth(), "register", req->name(), 0,
                                  req->incarnation())) {
      ++unproven_;
    }
    last_register_ = *req;
    reregister_ = false;
    resp->set_node_id(7);
    resp->set_node_key(TestCapabilities::Key());
    resp->set_heartbeat_interval_ms(20);
    resp->set_objects_retained(objects_retained_);
    resp->set_generation_ceiling(register_ceiling_);
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    MutexLock l(&mu_);
    ++heartbeats_;
    heartbeat_ok_ = req->node_id() == 7 &&
                    req->incarnation() == last_register_.incarnation() &&
                    Proven(req->auth(), "heartbeat", last_register_.name(), 7,
                           req->incarnation());
    resp->set_reregister(reregister_);
    resp->set_generation_ceiling(heartbeat_ceiling_);
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* DeregisterNode(
      grpc::CallbackServerContext* ctx, const v1::DeregisterNodeRequest* req,
      v1::DeregisterNodeResponse*) override {
    MutexLock l(&mu_);
    ++deregisters_;
    last_deregister_ = *req;
    return Done(ctx);
  }

  static bool Proven(const v1::NodeAuth& auth, const std::string& purpose,
                     const std::string& name, uint32_t id,
                     uint64_t incarnation) {
    return auth.proof() == NodeProof(HmacSha256(TestCapabilities::Key()),
                                     purpose, name, id, incarnation,
                                     auth.unix_ms());
  }
  int unproven_registrations() const {
    MutexLock l(&mu_);
    return unproven_;
  }

  // What the next RegisterNode answers say (0: no ceiling, as an old master).
  void SetRegisterReply(bool objects_retained, uint64_t ceiling) {
    MutexLock l(&mu_);
    objects_retained_ = objects_retained;
    register_ceiling_ = ceiling;
  }
  void SetHeartbeatCeiling(uint64_t ceiling) {
    MutexLock l(&mu_);
    heartbeat_ceiling_ = ceiling;
  }

  void AskReregister() {
    MutexLock l(&mu_);
    reregister_ = true;
  }
  int registers() const {
    MutexLock l(&mu_);
    return registers_;
  }
  int heartbeats() const {
    MutexLock l(&mu_);
    return heartbeats_;
  }
  bool heartbeat_ok() const {
    MutexLock l(&mu_);
    return heartbeat_ok_;
  }
  int deregisters() const {
    MutexLock l(&mu_);
    return deregisters_;
  }
  v1::RegisterNodeRequest last_register() const {
    MutexLock l(&mu_);
    return last_register_;
  }
  v1::DeregisterNodeRequest last_deregister() const {
    MutexLock l(&mu_);
    return last_deregister_;
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  mutable Mutex mu_;
  int registers_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  bool heartbeat_ok_ ABSL_GUARDED_BY(mu_) = false;
  int deregisters_ ABSL_GUARDED_BY(mu_) = 0;
  bool reregister_ ABSL_GUARDED_BY(mu_) = false;
  bool objects_retained_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t register_ceiling_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t heartbeat_ceiling_ ABSL_GUARDED_BY(mu_) = 0;
  v1::RegisterNodeRequest last_register_ ABSL_GUARDED_BY(mu_);
  v1::DeregisterNodeRequest last_deregister_ ABSL_GUARDED_BY(mu_);
  int unproven_ ABSL_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<grpc::Server> StartMaster(FakeMaster* service, int port,
                                          int* bound) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:" + std::to_string(port),
                     grpc::InsecureServerCredentials(), bound);
  b.RegisterService(service);
  return b.BuildAndStart();
}

TEST_CASE("StorageNode registers, heartbeats, re-registers and deregisters") {
  FakeMaster master;
  int port = 0;
  auto server = StartMaster(&master, 0, &port);
  REQUIRE(server != nullptr);

  StorageNodeOptions o = Options();
  o.master_address = "127.0.0.1:" + std::to_string(port);
  auto created = StorageNode::Create(o);
  REQUIRE(created.ok());
  StorageNode& n = **created;
  REQUIRE(n.WaitRegistered(absl::Now() + absl::Seconds(20)));
  CHECK(n.node_id() == 7);
  v1::RegisterNodeRequest reg = master.last_register();
  CHECK(reg.name() == n.name());
  CHECK(reg.incarnation() == n.incarnation());
  CHECK(reg.data_address() == n.data_address());
  CHECK(reg.control_address() == n.control_address());
  REQUIRE(reg.regions_size() == 1);
  CHECK(reg.regions(0).capacity_bytes() == o.dram()->capacity_bytes);
  CHECK(reg.regions(0).device_kind() == "dram");
  CHECK_FALSE(reg.regions(0).persistent());

  CHECK(Eventually([&] { return master.heartbeats() >= 3; }));
  CHECK(master.heartbeat_ok());

  // The master forgot the node.
  master.AskReregister();
  CHECK(Eventually([&] { return master.registers() >= 2; }));
  CHECK(Eventually([&] { return n.registered(); }));

  // The master goes away and comes back on the same port.
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  server->Wait();
  server.reset();
  CHECK(Eventually([&] { return !n.registered(); }));
  int registers_before = master.registers();
  int again = 0;
  server = StartMaster(&master, port, &again);
  REQUIRE(server != nullptr);
  CHECK(Eventually([&] { return master.registers() > registers_before; }));
  CHECK(n.WaitRegistered(absl::Now() + absl::Seconds(20)));

  n.Shutdown();
  CHECK(master.deregisters() == 1);
  CHECK(master.last_deregister().node_id() == 7);
  CHECK(master.last_deregister().incarnation() == n.incarnation());
  CHECK(FakeMaster::Proven(master.last_deregister().auth(), "deregister",
                           n.name(), 7, n.incarnation()));
  CHECK(master.unproven_registrations() == 0);
  CHECK_FALSE(n.registered());
  server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// ---------------------------------------------------------------- data plane

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

wire::OpDesc Op(uint64_t addr, uint64_t len, uint64_t gen) {
  wire::OpDesc op;
  op.region_id = 0;
  op.addr = addr;
  op.length = len;
  op.generation = gen;
  return op;
}

// The incarnation of the node the data-plane tests below talk to (its id is
// the FakeMaster's 7, its key TestCapabilities::Key()).
uint64_t g_incarnation = 0;

// Sends a one-op request with the master's capability for it; for a write,
// the first `sent` bytes of `data` (all by default).
void SendRequest(int fd, wire::FrameType type, const wire::OpDesc& op,
                 const std::string& data, size_t sent = std::string::npos) {
  std::vector<uint8_t> buf(wire::kHeaderBytes + wire::kOpBytes +
                           wire::kCapBytes);
  wire::FrameHeader h;
  h.type = type;
  h.op_count = 1;
  h.request_id = 1;
  h.payload_bytes = type == wire::FrameType::kWriteRequest ? op.length : 0;
  wire::EncodeHeader(h, buf.data());
  wire::EncodeOp(op, buf.data() + wire::kHeaderBytes);
  CapabilityScope scope;
  scope.node_id = 7;
  scope.incarnation = g_incarnation;
  scope.region_id = op.region_id;
  scope.addr = op.addr;
  scope.length = op.length;
  scope.generation = op.generation;
  scope.rights = TestCapabilities::RightsFor(type);
  scope.expires_unix_ms = absl::ToUnixMillis(Soon());
  wire::EncodeCapability(
      SignCapability(HmacSha256(TestCapabilities::Key()), scope),
      buf.data() + wire::kHeaderBytes + wire::kOpBytes);
  buf.insert(buf.end(), data.begin(),
             data.begin() + static_cast<ptrdiff_t>(std::min(sent, data.size())));
  REQUIRE(SendAll(fd, buf.data(), buf.size(), Soon()).ok());
}

// The status of the op of a one-op response, and its payload.
std::pair<absl::StatusCode, std::string> RecvResponse(int fd) {
  uint8_t hdr[wire::kHeaderBytes];
  REQUIRE(RecvAll(fd, hdr, sizeof(hdr), Soon()).ok());
  auto h = wire::DecodeHeader(hdr);
  REQUIRE(h.ok());
  REQUIRE(h->op_count == 1);
  uint8_t op[wire::kOpBytes];
  REQUIRE(RecvAll(fd, op, sizeof(op), Soon()).ok());
  std::string payload(h->payload_bytes, '\0');
  if (!payload.empty()) {
    REQUIRE(RecvAll(fd, payload.data(), payload.size(), Soon()).ok());
  }
  return {wire::FromWireCode(wire::DecodeOp(op).status), payload};
}

absl::StatusCode WriteCode(int fd, uint64_t addr, uint64_t gen,
                           const std::string& data) {
  SendRequest(fd, wire::FrameType::kWriteRequest, Op(addr, data.size(), gen),
              data);
  return RecvResponse(fd).first;
}

std::pair<absl::StatusCode, std::string> ReadObject(int fd, uint64_t addr,
                                                    uint64_t len, uint64_t gen) {
  SendRequest(fd, wire::FrameType::kReadRequest, Op(addr, len, gen), "");
  return RecvResponse(fd);
}

struct Cluster {
  Cluster() {
    server = StartMaster(&master, 0, &port);
    REQUIRE(server != nullptr);
  }
  ~Cluster() {
    node.reset();
    server->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  StorageNode& Start(StorageNodeOptions o = Options()) {
    o.master_address = "127.0.0.1:" + std::to_string(port);
    auto created = StorageNode::Create(o);
    REQUIRE(created.ok());
    node = std::move(*created);
    REQUIRE(node->WaitRegistered(absl::Now() + absl::Seconds(20)));
    g_incarnation = node->incarnation();
    return *node;
  }
  Socket Connect() {
    auto s = ConnectTcp(node->data_address(), Soon());
    REQUIRE(s.ok());
    return std::move(*s);
  }
  // Has the master ask for a new registration and waits until the node has
  // taken the answer in.
  void Reregister() {
    const int before = master.registers();
    master.AskReregister();
    REQUIRE(Eventually([&] { return master.registers() > before; }));
    // registered() turned false before the RegisterNode call and turns true
    // after its answer has been applied.
    REQUIRE(node->WaitRegistered(absl::Now() + absl::Seconds(20)));
  }
  // Waits until the node has applied at least one heartbeat answer given
  // after this call.
  void AwaitHeartbeat() {
    const int before = master.heartbeats();
    // The node sends a heartbeat only after handling the previous answer.
    REQUIRE(Eventually([&] { return master.heartbeats() >= before + 2; }));
  }

  FakeMaster master;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<StorageNode> node;
};

TEST_CASE("StorageNode drops its extents when the master does not retain "
          "its objects") {
  Cluster c;
  c.master.SetRegisterReply(/*objects_retained=*/true, /*ceiling=*/10000);
  c.Start();
  Socket s = c.Connect();
  REQUIRE(WriteCode(s.fd(), 0, 1000, "old-data") == absl::StatusCode::kOk);

  // A master that still knows the node's objects: they stay.
  c.Reregister();
  auto r = ReadObject(s.fd(), 0, 8, 1000);
  CHECK(r.first == absl::StatusCode::kOk);
  CHECK(r.second == "old-data");

  // The master lost its metadata and restarted: its generations start low.
  c.master.SetRegisterReply(/*objects_retained=*/false, /*ceiling=*/100);
  c.Reregister();
  CHECK(ReadObject(s.fd(), 0, 8, 1000).first == absl::StatusCode::kNotFound);
  // The old generation no longer refuses new writes over its space.
  CHECK(WriteCode(s.fd(), 0, 5, "new-data") == absl::StatusCode::kOk);
  r = ReadObject(s.fd(), 0, 8, 5);
  CHECK(r.first == absl::StatusCode::kOk);
  CHECK(r.second == "new-data");
}

TEST_CASE("StorageNode refuses writes above the master's generation "
          "ceiling") {
  Cluster c;
  c.master.SetRegisterReply(/*objects_retained=*/false, /*ceiling=*/100);
  c.master.SetHeartbeatCeiling(0);  // not sent: keep the last ceiling
  c.Start();
  c.AwaitHeartbeat();
  Socket s = c.Connect();
  CHECK(WriteCode(s.fd(), 0, 101, "bogus") ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(ReadObject(s.fd(), 0, 5, 101).first == absl::StatusCode::kNotFound);
  CHECK(WriteCode(s.fd(), 0, 100, "fine") == absl::StatusCode::kOk);

  // Heartbeats raise it.
  c.master.SetHeartbeatCeiling(1000);
  c.AwaitHeartbeat();
  CHECK(WriteCode(s.fd(), 4096, 500, "later") == absl::StatusCode::kOk);
  CHECK(WriteCode(s.fd(), 8192, 1001, "bogus") ==
        absl::StatusCode::kFailedPrecondition);
  // And may lower it.
  c.master.SetHeartbeatCeiling(600);
  c.AwaitHeartbeat();
  CHECK(WriteCode(s.fd(), 8192, 700, "bogus") ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("StorageNode deregisters before draining the data plane") {
  Cluster c;
  c.master.SetRegisterReply(/*objects_retained=*/true, /*ceiling=*/1000);
  StorageNodeOptions o = Options();
  o.drain_timeout = absl::Seconds(60);  // longer than Eventually waits
  StorageNode& n = c.Start(o);
  Socket a = c.Connect();
  Socket b = c.Connect();
  // A write in progress on `a`: header and half of the payload.
  SendRequest(a.fd(), wire::FrameType::kWriteRequest, Op(0, 8, 50), "12345678",
              4);
  // Once it has begun, a lower generation over its space is refused (before
  // that, the lower one is accepted and then superseded: harmless).
  REQUIRE(Eventually([&] {
    return WriteCode(b.fd(), 0, 49, "xxxxxxxx") ==
           absl::StatusCode::kFailedPrecondition;
  }));

  Thread stopper("stopper", [&] { n.Shutdown(); });
  // The master hears of the leave while the request is still in progress.
  CHECK(Eventually([&] { return c.master.deregisters() == 1; }));
  CHECK_FALSE(n.registered());
  // The request in progress still completes.
  REQUIRE(SendAll(a.fd(), "5678", 4, Soon()).ok());
  CHECK(RecvResponse(a.fd()).first == absl::StatusCode::kOk);
  stopper.Join();
  CHECK(c.master.deregisters() == 1);
  n.Shutdown();  // idempotent
  CHECK(c.master.deregisters() == 1);
}

}  // namespace
}  // namespace hymcache
