// The one conversion between a gRPC status and the project's error currency,
// both ways (STYLE.md: grpc::Status appears only in RPC adapter layers).
// absl and gRPC use the same canonical code numbers.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hymcache {

// The same code; the message prefixed with "what: " when `what` is given.
inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   absl::string_view what = {}) {
  if (s.ok()) return absl::OkStatus();
  if (what.empty()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        s.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// The same code and message, for a server's reply.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace hymcache
