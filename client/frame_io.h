// Request/response exchanges of the data-plane framing (common/wire.h) on a
// client's connection, shared by the transports. Internal to //client.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/transport.h"
#include "common/net.h"
#include "common/wire.h"

namespace hymcache::frame_io {

wire::OpDesc ToOp(const RemoteRef& r);

// Sends a request frame: header, op table, the ops' capabilities (for the
// types that carry them), then `payload` (payload_bytes in total).
absl::Status SendRequest(Socket& s, wire::FrameType type,
                         absl::Span<const wire::OpDesc> ops,
                         uint64_t payload_bytes,
                         absl::Span<const iovec> payload, uint64_t id,
                         absl::Time deadline);

// Receives the header and op table of the response to request `id`, which
// must be of type `want` with `op_count` ops; the caller receives the
// payload. A kError frame is returned as its status (the node closes the
// connection after it); anything out of protocol is Unavailable. Sets
// *response_started once any byte has arrived.
absl::StatusOr<std::pair<wire::FrameHeader, std::vector<wire::OpDesc>>>
RecvResponse(Socket& s, wire::FrameType want, uint64_t id, size_t op_count,
             absl::Time deadline, bool* response_started);

// Receives the payload of a write response (kWriteResponse,
// kWriteCommitResponse): one receipt per op, stored where `dst[i]` points
// (null: dropped). REQUIRES: dst.size() is the response's op count.
absl::Status RecvReceipts(Socket& s, absl::Span<wire::Receipt* const> dst,
                          absl::Time deadline);

// The per-op status of a response op as an absl::Status (`what` names the
// operation in the message).
absl::Status OpStatus(const wire::OpDesc& op, const char* what);

}  // namespace hymcache::frame_io
