#include "common/grpc_polling.h"

#include <grpc/grpc.h>
#include <stdlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"

// gRPC's own name of the strategy it runs with (libgrpc exports it; no
// public header declares it).
const char* grpc_get_poll_strategy_name();

namespace hymcache {
namespace {

Mutex g_mu;
// The strategy SetGrpcPollStrategy last set ("" for none).
std::string g_set ABSL_GUARDED_BY(g_mu);

}  // namespace

absl::Status ValidateGrpcPollStrategy(absl::string_view strategy) {
  if (strategy == "epoll1" || strategy == "poll") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("gRPC poll strategy \"", strategy,
                   "\": expected \"epoll1\" or \"poll\""));
}

absl::Status SetGrpcPollStrategy(absl::string_view strategy) {
  if (absl::Status s = ValidateGrpcPollStrategy(strategy); !s.ok()) return s;
  MutexLock l(&g_mu);
  if (grpc_is_initialized()) {
    if (g_set == strategy) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "gRPC already runs in this process, with the poll strategy it "
        "started with; \"",
        strategy,
        "\" takes effect only before the process's first gRPC "
        "channel, server or completion queue"));
  }
  const std::string value(strategy);
  if (setenv("GRPC_POLL_STRATEGY", value.c_str(), 1) != 0) {
    return absl::InternalError("setenv(GRPC_POLL_STRATEGY) failed");
  }
  g_set = value;
  return absl::OkStatus();
}

void RestoreGrpcPollStrategyEnvironment() {
  MutexLock l(&g_mu);
  if (g_set.empty() || !grpc_is_initialized()) return;
  const char* now = getenv("GRPC_POLL_STRATEGY");
  if (now != nullptr && g_set == now) unsetenv("GRPC_POLL_STRATEGY");
}

std::string GrpcPollStrategyInUse() {
  if (!grpc_is_initialized()) return "";
  const char* name = grpc_get_poll_strategy_name();
  return name != nullptr ? name : "";
}

bool PreferGrpcPollStrategy(absl::string_view strategy) {
  {
    MutexLock l(&g_mu);
    // gRPC's own setting, read here only to leave it alone: whoever set it
    // (the operator, an earlier call) chose.
    if (grpc_is_initialized() || getenv("GRPC_POLL_STRATEGY") != nullptr) {
      return false;
    }
  }
  return SetGrpcPollStrategy(strategy).ok();
}

absl::Status ValidateGrpcPollStrategyChoice(absl::string_view choice) {
  if (choice == "auto" || choice.empty()) return absl::OkStatus();
  return ValidateGrpcPollStrategy(choice);
}

absl::Status ApplyGrpcPollStrategyChoice(absl::string_view choice,
                                         absl::string_view auto_strategy) {
  if (choice == "auto") {
    if (!auto_strategy.empty()) PreferGrpcPollStrategy(auto_strategy);
    return absl::OkStatus();
  }
  if (choice.empty()) return absl::OkStatus();
  return SetGrpcPollStrategy(choice);
}

}  // namespace hymcache
