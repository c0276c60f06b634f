// The one conversion between a gRPC status and the project's error currency,
// both ways (STYLE.md: grpc::Status appears only in RPC adapter layers).
// absl and gRPC use the same canonical code numbers.
//
// The project's machine-readable payloads (type URLs under
// "type.hymcache.dev/": common/status_reason.h's reason and leader hint)
// cross with the status, in gRPC's binary error details
// (grpc-status-details-bin): "hymcache-payloads/1\n" then one
// "URL VALUE\n" line each. Payload values must hold no newline.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"

namespace hymcache {

inline constexpr absl::string_view kGrpcPayloadsMagic = "hymcache-payloads/1\n";
inline constexpr absl::string_view kHymcachePayloadPrefix =
    "type.hymcache.dev/";

// The payloads of `s` to send, "" when it has none of ours.
inline std::string EncodeStatusPayloads(const absl::Status& s) {
  std::string out;
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& value) {
    if (!absl::StartsWith(url, kHymcachePayloadPrefix)) return;
    std::string v(value);
    if (v.find('\n') != std::string::npos) return;
    absl::StrAppend(&out, url, " ", v, "\n");
  });
  return out.empty() ? out : absl::StrCat(kGrpcPayloadsMagic, out);
}

// Sets on `s` the payloads `details` carries (details of another format
// are ignored).
inline void DecodeStatusPayloads(absl::string_view details, absl::Status* s) {
  if (!absl::ConsumePrefix(&details, kGrpcPayloadsMagic)) return;
  for (absl::string_view line :
       absl::StrSplit(details, '\n', absl::SkipEmpty())) {
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos) continue;
    absl::string_view url = line.substr(0, space);
    if (!absl::StartsWith(url, kHymcachePayloadPrefix)) continue;
    s->SetPayload(url, absl::Cord(line.substr(space + 1)));
  }
}

// The same code; the message prefixed with "what: " when `what` is given.
inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   absl::string_view what = {}) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()),
                   what.empty() ? s.error_message()
                                : absl::StrCat(what, ": ", s.error_message()));
  DecodeStatusPayloads(s.error_details(), &out);
  return out;
}

// The same code, message and payloads, for a server's reply.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()), EncodeStatusPayloads(s));
}

}  // namespace hymcache
