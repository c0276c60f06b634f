// Transport: how object bytes move between a client and storage nodes.
//
// The shape is one-sided from day one: "read <node, region, addr, len> into
// this caller-owned buffer" and "write this buffer to <node, region, addr>",
// batched. The TCP implementation asks the node to do it; an RDMA transport
// posts READ/WRITE work requests against the node's registered region; a
// same-host shared-memory transport copies from a mapping. Callers do not
// change between them.
//
// Internal to the client library (not a public header of //client).
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire.h"

namespace hymcache {

// How to reach one storage node.
struct PeerInfo {
  uint32_t node_id = 0;
  // TCP data plane "host:port".
  std::string data_address;
  // Transport-specific parameters published by the node (rdma, shm...).
  std::map<std::string, std::string> params;
};

// A span of node memory holding (part of) one allocation.
struct RemoteRef {
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  // The master's permission to read (lookup) or write (PutStart) exactly
  // this allocation; the node refuses an op without a valid one
  // (PermissionDenied).
  wire::Capability cap;
};

struct ReadOp {
  RemoteRef src;
  // Caller-owned, at least src.length bytes.
  void* dst = nullptr;
};

struct WriteOp {
  RemoteRef dst;
  // Caller-owned, src.length bytes; not modified.
  const void* src = nullptr;
  // Caller-owned, optional: where Write puts the node's write receipt for
  // this op when it succeeds (wire.h, "Write receipts"), for PutCommit.
  wire::Receipt* receipt = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual absl::string_view name() const = 0;

  // OK if this transport can reach `peer` (shared memory needs the same
  // host, RDMA a device on both sides); else why not. TCP reaches all.
  virtual absl::Status CanReach(const PeerInfo& peer) {
    return absl::OkStatus();
  }

  // Caller memory that transfers may use in place (RDMA registration); see
  // Client::RegisterMemory. Default: nothing to do.
  virtual absl::Status RegisterMemory(void* data, size_t size) {
    return absl::OkStatus();
  }
  virtual absl::Status UnregisterMemory(void* data) {
    return absl::OkStatus();
  }

  // Reads every op from `peer`, in order, into its caller-owned buffer.
  // Returns one status per op: OK (all bytes are in the buffer), NotFound
  // (the object is gone or its space was reused), DeadlineExceeded,
  // Unavailable (peer unreachable or failed mid-transfer), or another error.
  // After a transport failure the remaining ops carry that failure. When Read
  // returns, nothing writes into the buffers any more.
  virtual std::vector<absl::Status> Read(const PeerInfo& peer,
                                         absl::Span<const ReadOp> ops,
                                         absl::Time deadline) = 0;

  // Read-path sessions (request-level prefetch; see common/wire.h). A load
  // picks a random non-zero `session` id, announces the ordered objects it
  // will read from `peer` (Prefetch, may be called again to append), reads
  // them with ReadSession (each object is released on the node once read),
  // and drops what it will not read with Release (empty `refs`: all of
  // them, ending the session). Prefetch returns one status per ref (OK:
  // queued; NotFound: not on the node; a transport failure for all); hints
  // are advisory, a failed one only costs speed.
  virtual std::vector<absl::Status> Prefetch(const PeerInfo& peer,
                                             uint64_t session,
                                             absl::Span<const RemoteRef> refs,
                                             absl::Time deadline) = 0;
  // As Read; ops the session prefetched are served from their staged copies
  // and released on the node. A suffix of the ops may come back Aborted
  // (not staged yet, nothing written to their buffers): read them again.
  // The first op is never Aborted.
  virtual std::vector<absl::Status> ReadSession(const PeerInfo& peer,
                                                uint64_t session,
                                                absl::Span<const ReadOp> ops,
                                                absl::Time deadline) = 0;
  virtual absl::Status Release(const PeerInfo& peer, uint64_t session,
                               absl::Span<const RemoteRef> refs,
                               absl::Time deadline) = 0;

  // Think-time hint (see common/wire.h): `refs` (in read order) are likely
  // read again `times.expected_in_ms` from now; the node stages them while
  // idle and holds them `times.hold_ms` longer (0: ends their hints). One
  // status per ref, as Prefetch. Advice only. The default: Unimplemented
  // (a transport that does not carry hints).
  virtual std::vector<absl::Status> HintTurn(const PeerInfo& peer,
                                             absl::Span<const RemoteRef> refs,
                                             const wire::HintTimes& times,
                                             absl::Time deadline) {
    return std::vector<absl::Status>(
        refs.size(),
        absl::UnimplementedError("this transport carries no think-time hints"));
  }

  // Writes every op to `peer`. Statuses as for Read; an op that failed left
  // nothing readable at its destination. Each OK op's receipt (if it asks
  // for one) is the node's.
  virtual std::vector<absl::Status> Write(const PeerInfo& peer,
                                          absl::Span<const WriteOp> ops,
                                          absl::Time deadline) = 0;
};

}  // namespace hymcache
