#include "common/health_probe.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "common/grpc_status.h"
#include "proto/grpc_health_v1.grpc.pb.h"

namespace hymcache {

absl::StatusOr<bool> CheckHealth(std::shared_ptr<grpc::ChannelInterface> channel,
                                 const std::string& service,
                                 absl::Duration timeout) {
  using grpc::health::v1::HealthCheckResponse;
  grpc::health::v1::Health::Stub stub(std::move(channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub.Check(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s, "health check");
  return resp.status() == HealthCheckResponse::SERVING;
}

absl::Status CheckServerAnswers(grpc::Server* server, absl::Duration timeout) {
  std::shared_ptr<grpc::Channel> channel =
      server->InProcessChannel(grpc::ChannelArguments());
  absl::StatusOr<bool> r = CheckHealth(std::move(channel), "", timeout);
  return r.ok() ? absl::OkStatus() : r.status();
}

}  // namespace hymcache
