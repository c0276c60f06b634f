// A gRPC health probe (grpc.health.v1 Check) as a function: what
// grpc_health_probe does, for the daemons' own liveness checks and tools.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelInterface;
class Server;
}  // namespace grpc

namespace hymcache {

// The serving status `channel`'s server reports for `service` ("" for the
// server as a whole): true for SERVING, false for NOT_SERVING (it answers,
// but is not ready). Errors: the RPC's (e.g. Unavailable, DeadlineExceeded
// after `timeout`, NotFound for an unknown service).
absl::StatusOr<bool> CheckHealth(std::shared_ptr<grpc::ChannelInterface> channel,
                                 const std::string& service,
                                 absl::Duration timeout);

// Whether `server` answers a health Check within `timeout`, over an
// in-process channel (no network, no TLS, but the server's own threads):
// OK when it answers, SERVING or not; the RPC's error otherwise.
absl::Status CheckServerAnswers(grpc::Server* server, absl::Duration timeout);

}  // namespace hymcache
