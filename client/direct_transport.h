// DirectTransport: the Transport for one-sided data planes, where bytes move
// between the caller's buffers and a storage node's exposed memory areas
// (common/wire.h "Direct access") without the node's CPU: RDMA READ/WRITE
// (rdma_mover) or plain loads and stores through a same-host mapping
// (shm_mover). A DirectMover supplies the byte movement; this class runs the
// control exchanges around it on a TCP connection it keeps per transfer:
//
//   read:  kAcquireRequest -> move node area -> caller buffer -> kRelease
//          (holds end only by release or when the connection closes, so the
//          release's answer is read by the connection's next exchange)
//   write: kWriteBeginRequest -> move caller buffer -> node area ->
//          kWriteCommitRequest (failed moves are aborted)
//
// Prefetch hints and session releases go over plain TCP frames.
//
// Internal to the client library.
//
// Thread safety: safe for concurrent use; each call uses its own connection
// and channel.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/transport.h"
#include "common/net.h"
#include "common/transport_params.h"
#include "common/wire.h"

namespace hymcache {

// One contiguous piece of a one-sided transfer.
struct DirectSegment {
  // true: local -> node; false: node -> local.
  bool write = false;
  // Where in the node's exposed memory (MemoryArea id and offset).
  uint32_t area = 0;
  uint64_t offset = 0;
  // Caller memory, `length` bytes.
  void* local = nullptr;
  uint64_t length = 0;
  // RDMA: the key the node granted for exactly this object (AreaRef::rkey);
  // 0: the area's published key.
  uint32_t rkey = 0;
};

// One peer's one-sided data path, set up on a control connection.
class DirectChannel {
 public:
  virtual ~DirectChannel() = default;
  // Moves every segment; one status per segment. When Move returns, nothing
  // touches the segments' memory any more (after a failure the channel is
  // broken: healthy() is false and it is discarded).
  virtual std::vector<absl::Status> Move(absl::Span<const DirectSegment> segs,
                                         absl::Time deadline) = 0;
  virtual bool healthy() const = 0;
};

// How bytes move.
class DirectMover {
 public:
  virtual ~DirectMover() = default;
  virtual absl::string_view name() const = 0;
  // Whether channels can write node memory; if not, the transport writes
  // over TCP.
  virtual bool can_write() const { return true; }
  // Caller memory channels may use in place (Transport::RegisterMemory).
  virtual absl::Status RegisterMemory(void* data, size_t size) {
    return absl::OkStatus();
  }
  virtual absl::Status UnregisterMemory(void* data) {
    return absl::OkStatus();
  }
  // OK if this mover can reach `peer` (e.g. shared memory: the node is on
  // this host and publishes its areas); else why not (Unavailable).
  virtual absl::Status Usable(const PeerInfo& peer) = 0;
  // Sets up a channel on a fresh connection `ctrl` to the peer's data plane
  // (RDMA: exchanges queue pairs over it, presenting `grant`, an object of
  // the transfer about to start with its capability, which the node checks
  // before it creates a queue pair). The channel is used only with that
  // connection.
  virtual absl::StatusOr<std::unique_ptr<DirectChannel>> Open(
      const PeerInfo& peer, Socket& ctrl, const wire::OpDesc& grant,
      absl::Time deadline) = 0;
};

struct DirectTransportOptions {
  // Idle (connection, channel) pairs kept per peer. Default: 4.
  int max_idle_per_peer = 4;
};

std::unique_ptr<Transport> NewDirectTransport(
    std::unique_ptr<DirectMover> mover, const DirectTransportOptions& options);

// Same-host shared memory: maps the node's memfd-backed areas read-only
// (descriptors passed over the node's Unix socket after a credentials
// check, storage_node/dataplane/shm_export.h) and copies out with memcpy; writes go
// over TCP.
std::unique_ptr<DirectMover> NewShmMover();

// Per peer, the first of `candidates` that can reach it (Transport::
// CanReach), decided again when the peer's parameters change. Calls for a
// peer none can reach fail with the first candidate's reason.
std::unique_ptr<Transport> NewFirstReachableTransport(
    std::vector<std::unique_ptr<Transport>> candidates);

}  // namespace hymcache
