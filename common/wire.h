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
//      4  u8  version        kVersion (2; 1 had no capability table)
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
//   kWriteResponse the request's ops with a status each; payload = one write
//                  receipt (kReceiptBytes) per op, zero for failed ops: the
//                  node's signed word that the op's bytes landed, which the
//                  client carries to the master in PutCommit (see
//                  "Write receipts" below).
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
// Think-time hints (docs/prefetch.md): a conversation's blocks that its next
// turn will read, sent when its current turn is answered; the node stages
// them while its window is idle (KvManager::HintTurn). Advice only.
//   kHintRequest      ops = objects in read order (>= 1, read capabilities);
//                     payload = HintTimes (kHintTimesBytes): when the turn
//                     is expected and how long after that to hold the
//                     objects staged; a hold of 0 ends the objects' hints
//                     (the conversation ended).
//   kHintResponse     the request's ops with a status each (OK: accepted;
//                     ResourceExhausted: the node's hint limit; NotFound: an
//                     end hint for an object not hinted); payload empty.
//
// Direct access (one-sided data planes: RDMA, same-host shared memory). The
// bytes move between the client's buffers and the node's exposed memory
// areas (MemoryArea: the DRAM region, the hybrid staging window and write
// buffer) without the node's CPU; these frames, on one TCP connection that
// the client keeps for the whole exchange, pin and unpin the memory:
//   kAcquireRequest   ops = objects to read; payload = session id (0: none).
//                     The node stages each (through the session's prefetch
//                     queue when the session hinted it) and holds it for this
//                     connection until it is released.
//   kAcquireResponse  the ops with a status each; payload = one AreaRef (16
//                     bytes: u32 area, u32 rkey, u64 offset) per op, zero for
//                     failed ops. As for session reads, a suffix may be
//                     ABORTED (not staged yet; the first op never is).
//                     rkey: on a connection with an RDMA queue pair, the key
//                     that reaches exactly this object, READ only, from this
//                     queue pair (a memory window bound for it, or a
//                     registration of its range; on a node that trusts its
//                     clients, the area's key); valid until the object's
//                     release or the connection's end. 0 without a queue
//                     pair (shared memory). Nodes before this field sent 0
//                     (clients then use the area's published key).
//   kReleaseRequest   (above) with the acquired ops: ends their holds; per op
//                     OK when the hold lasted until now (the bytes read were
//                     the object's), NotFound otherwise.
//   kWriteBeginRequest ops = allocations to write; payload empty. The node
//                     reserves a destination for each (held for this
//                     connection; refused at once with ResourceExhausted when
//                     a hybrid write buffer is full).
//   kWriteBeginResponse the ops with a status each; payload = one AreaRef per
//                     op; its rkey (RDMA) reaches exactly the reserved
//                     destination, WRITE only, until its commit or abort.
//   kWriteCommitRequest ops = begun writes; an op's status field is 0 to
//                     commit it, non-zero to abort it. Payload empty.
//   kWriteCommitResponse the ops with a status each; payload = one write
//                     receipt per op (zero for failed or aborted ops), as for
//                     kWriteResponse.
//   kRdmaConnectRequest op_count 1: the grant, any object the master gave
//                     the client a read or write capability for on this node
//                     (capability table as for acquires); payload = the
//                     client's RDMA queue-pair description (<=
//                     kMaxConnectBytes). Without a valid grant the node
//                     answers kError PermissionDenied and creates no queue
//                     pair.
//   kRdmaConnectResponse op_count 0; payload = the node's queue-pair
//                     description. The node's queue pair lives as long as the
//                     connection.
// When a connection closes, its holds are released and its begun writes
// aborted (nothing becomes readable). A client must not close it while a
// one-sided transfer may still touch the held memory.
//
// Write receipts (node-confirmed commits, docs/ha.md): a write receipt is
// HMAC-SHA256 under the node's key (common/capability.h, SignWriteReceipt)
// over (node id, region, addr, length, generation) of one written op,
// truncated to kReceiptBytes. Only the node and the master hold the key, so
// a client cannot make one for bytes it never wrote; the generation makes
// each receipt good for exactly one allocation.
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
inline constexpr uint8_t kVersion = 2;
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
  kAcquireRequest = 12,
  kAcquireResponse = 13,
  kWriteBeginRequest = 14,
  kWriteBeginResponse = 15,
  kWriteCommitRequest = 16,
  kWriteCommitResponse = 17,
  kRdmaConnectRequest = 18,
  kRdmaConnectResponse = 19,
  kHintRequest = 20,
  kHintResponse = 21,
};

// Where an acquired object or a write destination lies in the node's
// exposed memory (payload of kAcquireResponse / kWriteBeginResponse).
inline constexpr size_t kAreaRefBytes = 16;
struct AreaRef {
  uint32_t area = 0;
  // RDMA key of exactly this object's range (see kAcquireResponse); 0: none.
  uint32_t rkey = 0;
  uint64_t offset = 0;
};
void EncodeAreaRef(const AreaRef& r, uint8_t out[kAreaRefBytes]);
AreaRef DecodeAreaRef(const uint8_t in[kAreaRefBytes]);

// Largest RDMA connect payload.
inline constexpr uint64_t kMaxConnectBytes = 1024;

// The payload of kHintRequest: u32 expected_in_ms, u32 hold_ms (little
// endian).
inline constexpr uint64_t kHintTimesBytes = 8;
struct HintTimes {
  uint32_t expected_in_ms = 0;
  uint32_t hold_ms = 0;
};
void EncodeHintTimes(const HintTimes& t, uint8_t out[kHintTimesBytes]);
HintTimes DecodeHintTimes(const uint8_t in[kHintTimesBytes]);

// Bytes of the session id payload of session-scoped requests.
inline constexpr uint64_t kSessionBytes = 8;
void EncodeSession(uint64_t session, uint8_t out[kSessionBytes]);
uint64_t DecodeSession(const uint8_t in[kSessionBytes]);

// Bytes of one write receipt (kWriteResponse / kWriteCommitResponse).
inline constexpr size_t kReceiptBytes = 16;
struct Receipt {
  uint8_t tag[kReceiptBytes] = {};
};

// Bytes of one capability table entry.
inline constexpr size_t kCapBytes = 32;
// Bytes of a capability's MAC tag (HMAC-SHA256 truncated).
inline constexpr size_t kCapTagBytes = 16;
inline constexpr uint8_t kCapRead = 1;
inline constexpr uint8_t kCapWrite = 2;

// The authorization of one op (see "Capabilities" above). Not part of the
// 32-byte op encoding: requests carry it in their capability table.
struct Capability {
  int64_t expires_unix_ms = 0;
  uint8_t rights = 0;
  uint8_t tag[kCapTagBytes] = {};
};
void EncodeCapability(const Capability& c, uint8_t out[kCapBytes]);
// Errors: InvalidArgument (reserved bytes set).
absl::StatusOr<Capability> DecodeCapability(const uint8_t in[kCapBytes]);

// Packed lookup answers (master -> client; not a frame: the bytes of
// BatchLookupResponse.packed_results in proto/master.proto, asked for with
// BatchLookupRequest.packed). One record per key, in request order, 64
// bytes, little-endian:
//    0  u32 node_id        0: the key was not found (the record is all 0)
//    4  u32 region_id
//    8  u64 addr
//   16  u64 length
//   24  u64 generation
//   32  capability         kCapBytes, as a capability table entry
// Fixed width, so neither side allocates per key.
inline constexpr size_t kLookupRecordBytes = 64;
struct LookupRecord {
  uint32_t node_id = 0;  // 0: not found
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  Capability cap;
};
void EncodeLookupRecord(const LookupRecord& r, uint8_t out[kLookupRecordBytes]);
// Errors: InvalidArgument (a not-found record with other bytes set,
// reserved capability bytes set).
absl::StatusOr<LookupRecord> DecodeLookupRecord(
    const uint8_t in[kLookupRecordBytes]);

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
  // Requests of the types that CarriesCapabilities: the op's entry of the
  // capability table. Unused elsewhere.
  Capability cap;
};

// Whether frames of `type` carry a capability table after the op table.
bool CarriesCapabilities(FrameType type);

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
