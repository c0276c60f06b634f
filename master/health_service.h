// grpc.health.v1.Health (Check and Watch) on the completion-queue API, for
// a server whose calls all run on CqPollers (master/cq_server.h): gRPC
// 1.51's default health service is a callback service, and one callback
// method starts the callback API's polling threads for the whole server.
//
// Semantics are those of gRPC's default service, which probes
// (grpc_health_probe, Kubernetes' gRPC probes, common/health_probe.h) and
// tests/health_test.cc rely on:
//   - Check: the status of a known service ("" is the server as a whole),
//     NOT_FOUND "service name unknown" for any other;
//   - Watch: the current status (SERVICE_UNKNOWN for an unknown service),
//     then each change, until the caller cancels;
//   - Shutdown: every service NOT_SERVING for good (later changes are
//     ignored); each Watch stream sends that, then ends UNAVAILABLE.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <map>
#include <set>
#include <string>

#include "common/mutex.h"
#include "master/cq_server.h"
#include "proto/grpc_health_v1.grpc.pb.h"

namespace hymcache {
namespace master {

class HealthService {
 public:
  // Knows service "" only, NOT_SERVING.
  HealthService();
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // For ServerBuilder::RegisterService; outlives the grpc::Server.
  grpc::Service* service() { return &async_; }

  // Sets one service's status (adding it if new); all of them for
  // SetAllServing. Ignored after Shutdown.
  void SetServingStatus(const std::string& service, bool serving);
  void SetAllServing(bool serving);
  // NOT_SERVING for every service from now on; Watch streams are told,
  // then end. Idempotent.
  void Shutdown();

  // Requests Check and Watch calls on `poller`'s queue. Call from the
  // poller's own thread (CqPoller::Start). REQUIRES: this outlives the
  // poller's drain.
  void StartOn(CqPoller* poller);

  // Watch streams open now (tests).
  size_t WatchersForTest() const;

 private:
  class WatchCall;
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  using CheckMethod =
      UnaryMethod<grpc::health::v1::Health::AsyncService,
                  grpc::health::v1::HealthCheckRequest,
                  grpc::health::v1::HealthCheckResponse>;

  grpc::Status Check(const grpc::health::v1::HealthCheckRequest& req,
                     grpc::health::v1::HealthCheckResponse* resp) const;
  // The status a Watch of `service` reports now.
  ServingStatus Current(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes every watcher to send its status if it changed (a watcher of
  // another service finds nothing to send).
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::health::v1::Health::AsyncService async_;

  mutable Mutex mu_;
  // Protected by mu_.
  std::map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<WatchCall*> watchers_ ABSL_GUARDED_BY(mu_);
  // One Check method per poller (StartOn), alive as long as this.
  std::map<CqPoller*, CheckMethod> check_methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace master
}  // namespace hymcache
