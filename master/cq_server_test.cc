// The completion-queue serving machinery (cq_server.h) and grpc.health.v1
// on it (health_service.h), through a real gRPC server on loopback.
#include "master/cq_server.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/eventually.h"
#include "common/health_probe.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "master/health_service.h"
#include "proto/grpc_health_v1.grpc.pb.h"

namespace hymcache::master {
namespace {

using ::hymcache::testing::Eventually;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A server whose only service is a HealthService, on `pollers` pollers.
class TestServer {
 public:
  explicit TestServer(int pollers) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                       &port_);
    b.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(
        nullptr));
    b.RegisterService(health_.service());
    std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
    for (int i = 0; i < pollers; ++i) cqs.push_back(b.AddCompletionQueue());
    server_ = b.BuildAndStart();
    REQUIRE(server_ != nullptr);
    for (auto& cq : cqs) {
      pollers_.push_back(std::make_unique<CqPoller>(std::move(cq)));
      CqPoller* p = pollers_.back().get();
      p->Start("test-rpc", [this, p] { health_.StartOn(p); });
    }
  }
  ~TestServer() { Shutdown(); }

  void Shutdown() {
    if (server_ == nullptr) return;
    health_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    for (auto& p : pollers_) p->ShutdownAndJoin();
    server_.reset();
  }

  HealthService& health() { return health_; }
  std::unique_ptr<Health::Stub> Stub() const {
    return Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_),
        grpc::InsecureChannelCredentials()));
  }

 private:
  int port_ = 0;
  HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<CqPoller>> pollers_;
};

grpc::Status Check(Health::Stub* stub, const std::string& service,
                   HealthCheckResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest req;
  req.set_service(service);
  return stub->Check(&ctx, req, resp);
}

TEST_CASE("health Check: the status of a known service, NOT_FOUND else") {
  TestServer s(1);
  auto stub = s.Stub();
  HealthCheckResponse r;
  REQUIRE(Check(stub.get(), "", &r).ok());
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
  CHECK(Check(stub.get(), "svc", &r).error_code() ==
        grpc::StatusCode::NOT_FOUND);

  s.health().SetServingStatus("svc", false);
  s.health().SetAllServing(true);
  REQUIRE(Check(stub.get(), "", &r).ok());
  CHECK(r.status() == HealthCheckResponse::SERVING);
  REQUIRE(Check(stub.get(), "svc", &r).ok());
  CHECK(r.status() == HealthCheckResponse::SERVING);
  s.health().SetServingStatus("svc", false);
  REQUIRE(Check(stub.get(), "svc", &r).ok());
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);

  s.health().Shutdown();
  s.health().SetAllServing(true);  // ignored from now on
  REQUIRE(Check(stub.get(), "", &r).ok());
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
}

TEST_CASE("health Watch: the status, each change, the end at shutdown") {
  TestServer s(2);
  s.health().SetServingStatus("svc", true);
  auto stub = s.Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  HealthCheckRequest req;
  req.set_service("svc");
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse r;
  REQUIRE(reader->Read(&r));
  CHECK(r.status() == HealthCheckResponse::SERVING);
  REQUIRE(Eventually([&] { return s.health().WatchersForTest() == 1; }));

  s.health().SetServingStatus("other", false);  // not this stream's
  s.health().SetServingStatus("svc", false);
  REQUIRE(reader->Read(&r));
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
  s.health().SetServingStatus("svc", true);
  REQUIRE(reader->Read(&r));
  CHECK(r.status() == HealthCheckResponse::SERVING);

  // An unknown service: SERVICE_UNKNOWN, then its status once known.
  grpc::ClientContext ctx2;
  req.set_service("later");
  auto reader2 = stub->Watch(&ctx2, req);
  REQUIRE(reader2->Read(&r));
  CHECK(r.status() == HealthCheckResponse::SERVICE_UNKNOWN);
  s.health().SetServingStatus("later", true);
  REQUIRE(reader2->Read(&r));
  CHECK(r.status() == HealthCheckResponse::SERVING);

  // Shutdown: both streams hear NOT_SERVING, then end.
  const absl::Time start = absl::Now();
  Thread stopper("stopper", [&] { s.Shutdown(); });
  REQUIRE(reader->Read(&r));
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
  CHECK_FALSE(reader->Read(&r));
  CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(reader2->Read(&r));
  CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
  CHECK_FALSE(reader2->Read(&r));
  reader2->Finish().IgnoreError();
  stopper.Join();
  // The streams ended by themselves: no wait for the 5 s grace period.
  CHECK(absl::Now() - start < absl::Seconds(4));
}

TEST_CASE("health Watch: a stream the caller cancels is forgotten") {
  TestServer s(1);
  auto stub = s.Stub();
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    HealthCheckRequest req;
    auto reader = stub->Watch(&ctx, req);
    HealthCheckResponse r;
    REQUIRE(reader->Read(&r));
    CHECK(r.status() == HealthCheckResponse::NOT_SERVING);
    ctx.TryCancel();
    CHECK_FALSE(reader->Read(&r));
  }
  CHECK(Eventually([&] { return s.health().WatchersForTest() == 0; }));
  // A change after the cancels reaches nobody and breaks nothing.
  s.health().SetAllServing(true);
  HealthCheckResponse r;
  REQUIRE(Check(stub.get(), "", &r).ok());
  CHECK(r.status() == HealthCheckResponse::SERVING);
}

// A unary method whose handler waits for the test: Shutdown while calls are
// in the handler and queued behind it. The one in the handler and every
// one the server had accepted finish OK; none is lost or leaked (asan), no
// race (tsan).
TEST_CASE("UnaryCall: Shutdown drains the calls in flight") {
  Health::AsyncService service;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  b.RegisterService(&service);
  auto poller = std::make_unique<CqPoller>(b.AddCompletionQueue());
  auto server = b.BuildAndStart();
  REQUIRE(server != nullptr);

  Mutex mu;
  CondVar cv;
  bool release = false;
  int entered = 0;
  using Method =
      UnaryMethod<Health::AsyncService, HealthCheckRequest, HealthCheckResponse>;
  Method check{&service, &Health::AsyncService::RequestCheck,
               [&](grpc::ServerContext*, const HealthCheckRequest& req,
                   HealthCheckResponse* resp) {
                 MutexLock l(&mu);
                 ++entered;
                 cv.SignalAll();
                 while (!release) cv.Wait(&mu);
                 resp->set_status(req.service() == "x"
                                      ? HealthCheckResponse::SERVING
                                      : HealthCheckResponse::NOT_SERVING);
                 return grpc::Status::OK;
               },
               poller.get()};
  poller->Start("test-rpc", [&] {
    UnaryCall<Health::AsyncService, HealthCheckRequest,
              HealthCheckResponse>::Request(&check);
  });

  auto stub = Health::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  constexpr int kCalls = 4;
  std::vector<grpc::StatusCode> codes(kCalls, grpc::StatusCode::UNKNOWN);
  std::vector<HealthCheckResponse::ServingStatus> statuses(kCalls);
  std::vector<Thread> clients;
  for (int i = 0; i < kCalls; ++i) {
    clients.emplace_back("client", [&, i] {
      HealthCheckResponse r;
      codes[i] = Check(stub.get(), "x", &r).error_code();
      statuses[i] = r.status();
    });
  }
  {
    MutexLock l(&mu);
    while (entered == 0) cv.Wait(&mu);  // one call is in the handler
  }
  Thread stopper("stopper", [&] {
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
  });
  {
    MutexLock l(&mu);
    release = true;
    cv.SignalAll();
  }
  stopper.Join();
  poller->ShutdownAndJoin();
  for (Thread& t : clients) t.Join();
  int ok = 0;
  for (int i = 0; i < kCalls; ++i) {
    // Started (matched to a request) before the shutdown: answered.
    // Received but not yet matched: CANCELLED (gRPC's async server at
    // shutdown). Arrived after: UNAVAILABLE.
    if (codes[i] == grpc::StatusCode::OK) {
      ++ok;
      CHECK(statuses[i] == HealthCheckResponse::SERVING);
    } else {
      CHECK((codes[i] == grpc::StatusCode::UNAVAILABLE ||
             codes[i] == grpc::StatusCode::CANCELLED));
    }
  }
  CHECK(ok >= 1);
  MutexLock l(&mu);
  CHECK(entered == ok);
}

TEST_CASE("CqPoller: IfOpen runs nothing once the queue is shut down") {
  grpc::ServerBuilder b;
  Health::AsyncService service;
  b.RegisterService(&service);
  CqPoller poller(b.AddCompletionQueue());
  auto server = b.BuildAndStart();
  REQUIRE(server != nullptr);
  int ran = 0;
  CHECK(poller.IfOpen([&] { ++ran; }));
  server->Shutdown();
  poller.ShutdownAndJoin();
  CHECK_FALSE(poller.IfOpen([&] { ++ran; }));
  CHECK(ran == 1);
}

}  // namespace
}  // namespace hymcache::master
