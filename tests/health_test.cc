// gRPC health checking (grpc.health.v1) and server reflection on the
// master's port and the storage node's control port, against the real
// daemons, with a probe built from the generated stubs (what
// grpc_health_probe and Kubernetes' gRPC probes send).
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <set>
#include <string>

#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "proto/master.grpc.pb.h"
#include "tests/daemon.h"
#include "tests/grpc_reflection_v1alpha.grpc.pb.h"

namespace hymcache::testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using Serving = HealthCheckResponse::ServingStatus;

std::shared_ptr<grpc::Channel> Dial(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// One Check, as a probe sends it: the status, or the RPC's error code.
struct Probe {
  grpc::StatusCode code;
  Serving status;
};
Probe Check(const std::string& address, const std::string& service) {
  auto stub = Health::NewStub(Dial(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  return {s.error_code(), resp.status()};
}

// A Watch stream: the current status, then each change.
class Watch {
 public:
  Watch(const std::string& address, const std::string& service)
      : stub_(Health::NewStub(Dial(address))) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    HealthCheckRequest req;
    req.set_service(service);
    reader_ = stub_->Watch(&ctx_, req);
  }
  ~Watch() { ctx_.TryCancel(); }
  // The next status; UNKNOWN once the stream has ended.
  Serving Next() {
    HealthCheckResponse resp;
    if (!reader_->Read(&resp)) return HealthCheckResponse::UNKNOWN;
    return resp.status();
  }

 private:
  std::unique_ptr<Health::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader_;
};

bool ExitedZero(absl::StatusOr<int> status) {
  return status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

TEST_CASE("master: SERVING once serving, NOT_SERVING from SIGTERM on") {
  auto m = MasterProcess::Start(TempDir("master"), "127.0.0.1:0");
  REQUIRE(m.ok());
  Probe all = Check(m->address, "");
  CHECK(all.code == grpc::StatusCode::OK);
  CHECK(all.status == HealthCheckResponse::SERVING);
  Probe svc = Check(m->address, "hymcache.v1.MasterService");
  CHECK(svc.code == grpc::StatusCode::OK);
  CHECK(svc.status == HealthCheckResponse::SERVING);
  CHECK(Check(m->address, "no.such.Service").code ==
        grpc::StatusCode::NOT_FOUND);

  Watch watch(m->address, "hymcache.v1.MasterService");
  CHECK(watch.Next() == HealthCheckResponse::SERVING);
  REQUIRE(kill(m->daemon.pid(), SIGTERM) == 0);
  // The watcher hears NOT_SERVING before the server goes away.
  CHECK(watch.Next() == HealthCheckResponse::NOT_SERVING);
  CHECK(ExitedZero(m->daemon.Stop(SIGTERM)));
}

TEST_CASE("storage node: NOT_SERVING until registered, SERVING, then "
          "NOT_SERVING from SIGTERM on") {
  auto m = MasterProcess::Start(TempDir("master"), "127.0.0.1:0",
                                {"--heartbeat_interval_ms=100"});
  REQUIRE(m.ok());
  // A master that does not answer: the node cannot register.
  REQUIRE(kill(m->daemon.pid(), SIGSTOP) == 0);
  auto s = StorageProcess::Start(m->address, "node-a",
                                 {"--dram_bytes=16M", "--rdma=off"});
  if (!s.ok()) kill(m->daemon.pid(), SIGCONT);
  REQUIRE(s.ok());
  Probe starting = Check(s->control_address, "");
  CHECK(starting.code == grpc::StatusCode::OK);
  CHECK(starting.status == HealthCheckResponse::NOT_SERVING);
  Watch watch(s->control_address, "hymcache.v1.StorageControl");
  CHECK(watch.Next() == HealthCheckResponse::NOT_SERVING);

  // The master answers: registration, reconciliation, SERVING.
  REQUIRE(kill(m->daemon.pid(), SIGCONT) == 0);
  CHECK(watch.Next() == HealthCheckResponse::SERVING);
  Probe ready = Check(s->control_address, "hymcache.v1.StorageControl");
  CHECK(ready.status == HealthCheckResponse::SERVING);

  // Shutting down: NOT_SERVING before it deregisters and drains.
  REQUIRE(kill(s->daemon.pid(), SIGTERM) == 0);
  CHECK(watch.Next() == HealthCheckResponse::NOT_SERVING);
  CHECK(ExitedZero(s->daemon.Stop(SIGTERM)));
  CHECK(ExitedZero(m->daemon.Stop(SIGTERM)));
}

TEST_CASE(
    "storage node: NOT_SERVING while an operator drains it, SERVING "
    "again once undrained") {
  auto m = MasterProcess::Start(TempDir("master"), "127.0.0.1:0",
                                {"--heartbeat_interval_ms=100"});
  REQUIRE(m.ok());
  auto s = StorageProcess::Start(m->address, "node-d",
                                 {"--dram_bytes=16M", "--rdma=off"});
  REQUIRE(s.ok());
  Watch watch(s->control_address, "");
  Serving now = watch.Next();
  if (now != HealthCheckResponse::SERVING) now = watch.Next();
  REQUIRE(now == HealthCheckResponse::SERVING);

  auto master = v1::MasterService::NewStub(Dial(m->address));
  auto drain = [&](bool draining) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::SetNodeDrainingRequest req;
    req.set_name("node-d");
    req.set_draining(draining);
    v1::SetNodeDrainingResponse resp;
    return master->SetNodeDraining(&ctx, req, &resp);
  };
  REQUIRE(drain(true).ok());
  CHECK(watch.Next() == HealthCheckResponse::NOT_SERVING);
  REQUIRE(drain(false).ok());
  CHECK(watch.Next() == HealthCheckResponse::SERVING);
  CHECK(ExitedZero(s->daemon.Stop(SIGTERM)));
  CHECK(ExitedZero(m->daemon.Stop(SIGTERM)));
}

using grpc::reflection::v1alpha::ServerReflection;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

// Asks `address` for its services and for the file defining `symbol`.
void CheckReflection(const std::string& address, const std::string& service,
                     const std::string& method) {
  auto stub = ServerReflection::NewStub(Dial(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&ctx);

  ServerReflectionRequest list;
  list.set_list_services("");
  REQUIRE(stream->Write(list));
  ServerReflectionResponse resp;
  REQUIRE(stream->Read(&resp));
  REQUIRE(resp.has_list_services_response());
  std::set<std::string> names;
  for (const auto& s : resp.list_services_response().service()) {
    names.insert(s.name());
  }
  CHECK(names.count(service) == 1);
  CHECK(names.count("grpc.health.v1.Health") == 1);
  CHECK(names.count("grpc.reflection.v1alpha.ServerReflection") == 1);

  ServerReflectionRequest file;
  file.set_file_containing_symbol(service);
  REQUIRE(stream->Write(file));
  REQUIRE(stream->Read(&resp));
  REQUIRE(resp.has_file_descriptor_response());
  bool found = false;
  for (const std::string& bytes :
       resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto fd;
    REQUIRE(fd.ParseFromString(bytes));
    for (const auto& svc : fd.service()) {
      if (fd.package() + "." + svc.name() != service) continue;
      for (const auto& m : svc.method()) found |= m.name() == method;
    }
  }
  CHECK(found);
  stream->WritesDone();
  CHECK(stream->Finish().ok());
}

TEST_CASE("reflection lists and describes the services of both ports") {
  auto m = MasterProcess::Start(TempDir("master"), "127.0.0.1:0");
  REQUIRE(m.ok());
  auto s = StorageProcess::Start(m->address, "node-r",
                                 {"--dram_bytes=16M", "--rdma=off"});
  REQUIRE(s.ok());
  CheckReflection(m->address, "hymcache.v1.MasterService", "PutStart");
  CheckReflection(s->control_address, "hymcache.v1.StorageControl",
                  "GetStats");
  CHECK(ExitedZero(s->daemon.Stop(SIGTERM)));
  CHECK(ExitedZero(m->daemon.Stop(SIGTERM)));
}

}  // namespace
}  // namespace hymcache::testing
