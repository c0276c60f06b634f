// The one conversion of a gRPC status into the project's error currency
// (STYLE.md: grpc::Status appears only in RPC adapter layers).
#pragma once

#include <grpcpp/support/status.h>

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

}  // namespace hymcache
