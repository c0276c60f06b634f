#include "storage_node/storage_node.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "common/net.h"
#include "common/wire.h"
#include "common/mutex.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"

namespace hymcache {
namespace {

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
  o.dram_bytes = 16 << 20;
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
  o.alignment = 1000;
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o = Options();
  o.dram_bytes = 0;
  CHECK(StorageNode::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);

  auto taken = ListenTcp("127.0.0.1", 0);
  REQUIRE(taken.ok());
  int port = *LocalPort(taken->fd());
  o = Options();
  o.data_port = port;
  CHECK_FALSE(StorageNode::Create(o).ok());
  o = Options();
  o.control_port = port;
  CHECK_FALSE(StorageNode::Create(o).ok());
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
    last_register_ = *req;
    reregister_ = false;
    resp->set_node_id(7);
    resp->set_heartbeat_interval_ms(20);
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    MutexLock l(&mu_);
    ++heartbeats_;
    heartbeat_ok_ = req->node_id() == 7 &&
                    req->incarnation() == last_register_.incarnation();
    resp->set_reregister(reregister_);
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
  v1::RegisterNodeRequest last_register_ ABSL_GUARDED_BY(mu_);
  v1::DeregisterNodeRequest last_deregister_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::Server> StartMaster(FakeMaster* service, int port,
                                          int* bound) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:" + std::to_string(port),
                     grpc::InsecureServerCredentials(), bound);
  b.RegisterService(service);
  return b.BuildAndStart();
}

template <typename Pred>
bool Eventually(Pred pred) {
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
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
  CHECK(reg.regions(0).capacity_bytes() == o.dram_bytes);
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
  CHECK_FALSE(n.registered());
  server->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace hymcache
