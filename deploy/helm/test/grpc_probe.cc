// grpc_probe: one gRPC health Check (grpc.health.v1), as the kubelet's
// `grpc:` probe makes it: plaintext, to HOST:PORT, for a service name ("" by
// default), with a timeout. chart_test.sh runs it against daemons started
// from the chart's rendered arguments.
//
//   grpc_probe HOST:PORT [SERVICE] [TIMEOUT_MS]
//
// Exit status: 0 SERVING, 1 answered but not SERVING, 2 no answer (refused,
// timed out, unknown service), 3 usage.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "common/health_probe.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: grpc_probe HOST:PORT [SERVICE] [TIMEOUT_MS]\n");
    return 3;
  }
  const std::string service = argc > 2 ? argv[2] : "";
  int timeout_ms = 1000;
  if (argc > 3 && (!absl::SimpleAtoi(argv[3], &timeout_ms) || timeout_ms <= 0)) {
    std::fprintf(stderr, "grpc_probe: bad TIMEOUT_MS '%s'\n", argv[3]);
    return 3;
  }
  absl::StatusOr<bool> serving = hymcache::CheckHealth(
      grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()),
      service, absl::Milliseconds(timeout_ms));
  if (!serving.ok()) {
    std::printf("%s: %s\n", argv[1], serving.status().ToString().c_str());
    return 2;
  }
  std::printf("%s: %s\n", argv[1], *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? 0 : 1;
}
