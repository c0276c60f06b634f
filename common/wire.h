// The HyMCache data-plane protocol: a length-prefixed binary framing over TCP
// that moves object bytes between clients and storage nodes. It is not gRPC:
// payloads go straight between the socket and device memory or the caller's
// buffer, with no serialisation or extra copy.
//
// A connection carries one request at a time; the server answers each request
// before reading the next. Every frame is
//
//   FrameHeader (32 bytes, little-endian)
//      0  u32 magic          "HYMC" (0x434D5948)
//      4  u8  version        kVersion (1)
//      5  u8  type           FrameType
//      6  u16 op_count       number of OpDesc that follow, <= kMaxOps
//      8  u64 request_id     echoed in the response
//     16  u64 payload_bytes  bytes after the op table
//     24  u32 status         frame status (absl::StatusCode); 0 in requests
//     28  u32 reserved       0
//   OpDesc x op_count (32 bytes each)
//      0  u32 region_id
//      4  u32 status         per-op absl::StatusCode; 0 in requests
//      8  u64 addr           offset in the region
//     16  u64 length         1..kMaxObjectBytes
//     24  u64 generation     allocation generation from the master
//   payload (payload_bytes)
//
// Frame types and their payloads:
//   kReadRequest   ops to read; payload empty.
//   kReadResponse  the request's ops with a status each; payload = the bytes
//                  of every OK op, in op order (an op's bytes are `length`).
//   kWriteRequest  ops to write; payload = the bytes of every op in order
//                  (payload_bytes == sum of lengths).
//   kWriteResponse the request's ops with a status each; payload empty.
//   kError         op_count 0; status = code, payload = UTF-8 message
//                  (<= kMaxErrorBytes). The server closes the connection.
//   kPing/kPong    op_count 0, payload empty: liveness and version check.
//
// Read-path sessions (request-level prefetch). A client loading a request's
// blocks picks a random 64-bit session id and names, per node, the ordered
// list of that node's blocks it is about to read; the node stages them from
// its capacity tier into DRAM ahead of the reads and releases each one as it
// is read. The session id travels as an 8-byte little-endian payload:
//   kPrefetchRequest  ops = objects in read order (>= 1); payload = session
//                     id (payload_bytes == 8). Appends to the session's
//                     queue (creating it).
//   kPrefetchResponse the request's ops with a status each (OK: queued;
//                     NotFound: not on this node; ResourceExhausted: session
//                     or node limits); payload empty.
//   kReadRequest      with payload_bytes == 8 (the session id): ops the
//                     session prefetched are served from staging and released
//                     once sent; other ops are read as without a session.
//                     The node may answer a suffix of the ops ABORTED (not
//                     staged yet, no bytes sent): the client asks for them
//                     again. The first op is never ABORTED.
//   kReleaseRequest   ops = objects of the session to drop unread (op_count 0:
//                     all of them, ending the session: a cancelled load);
//                     payload = session id.
//   kReleaseResponse  the request's ops with a status each (NotFound: not in
//                     the session); payload empty.
//
// Every limit is checked on the 32-byte header before the receiver allocates
// or reads anything else; a frame that breaks one is answered with kError.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hymcache::wire {

inline constexpr uint32_t kMagic = 0x434D5948;  // "HYMC" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kOpBytes = 32;
// Most ops in one frame.
inline constexpr uint16_t kMaxOps = 1024;
// Largest object the data plane moves in one op (1 GiB).
inline constexpr uint64_t kMaxObjectBytes = uint64_t{1} << 30;
// Largest kError message.
inline constexpr uint64_t kMaxErrorBytes = 4096;

enum class FrameType : uint8_t {
  kReadRequest = 1,
  kReadResponse = 2,
  kWriteRequest = 3,
  kWriteResponse = 4,
  kError = 5,
  kPing = 6,
  kPong = 7,
  kPrefetchRequest = 8,
  kPrefetchResponse = 9,
  kReleaseRequest = 10,
  kReleaseResponse = 11,
};

// Bytes of the session id payload of session-scoped requests.
inline constexpr uint64_t kSessionBytes = 8;
void EncodeSession(uint64_t session, uint8_t out[kSessionBytes]);
uint64_t DecodeSession(const uint8_t in[kSessionBytes]);

struct FrameHeader {
  FrameType type = FrameType::kPing;
  uint16_t op_count = 0;
  uint64_t request_id = 0;
  uint64_t payload_bytes = 0;
  uint32_t status = 0;
};

struct OpDesc {
  uint32_t region_id = 0;
  uint32_t status = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
};

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]);

// Decodes and checks the magic, version, type and the limits that depend on
// the header alone (op count, payload size per type). Errors are
// InvalidArgument (malformed) or Unimplemented (other protocol version).
absl::StatusOr<FrameHeader> DecodeHeader(const uint8_t in[kHeaderBytes]);

void EncodeOp(const OpDesc& op, uint8_t out[kOpBytes]);
OpDesc DecodeOp(const uint8_t in[kOpBytes]);

// Checks a decoded op table against its header: every length in
// 1..kMaxObjectBytes, addr + length without overflow, and for a write request
// payload_bytes == sum of lengths; for a read response payload_bytes == sum
// of the OK ops' lengths.
absl::Status ValidateOps(const FrameHeader& h, absl::Span<const OpDesc> ops);

// Status <-> wire code. Unknown codes decode as kUnknown.
uint32_t ToWireCode(absl::StatusCode code);
absl::StatusCode FromWireCode(uint32_t code);

}  // namespace hymcache::wire
