// FrameHandler: what the data server does with each request frame of
// common/wire.h, without sockets or threads. It takes a decoded request and
// the connection's state (ConnState: the peer, the objects it holds, the
// writes it began) and returns the response frame as a gather list, whose
// payload entries point straight into device memory (reads are sent without a
// copy); a plain write request instead gets a WriteStream, which hands out
// each op's destination in device memory for the payload to be received
// into. DataServer (data_server.h) reads and writes the sockets, runs the
// event loop and the worker pool and enforces the connection limits around
// it; tests drive a FrameHandler directly.
//
// Per-op outcomes are reported in the response's op table (see
// DataServer). A request the handler refuses as a whole is answered with a
// kError Response (closes_connection()).
//
// Thread safety: the handler is safe for concurrent use; a ConnState is used
// by one thread at a time (whoever owns the connection).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/capability.h"
#include "common/stats.h"
#include "common/wire.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

// Every stat of the data server, declared once (common/stats.h): the live
// counters (DataServerCounters), the snapshot (DataServerStats) and the
// exported names (`hymctl stats`, Prometheus hymcache_storage_*).
#define HYM_DATA_SERVER_STATS(COUNTER, GAUGE, DGAUGE)                        \
  COUNTER(bytes_read, "Object bytes sent to readers over TCP")               \
  COUNTER(bytes_written, "Object bytes committed by writers (every plane)")  \
  COUNTER(read_ops, "Read ops answered OK over TCP")                         \
  COUNTER(write_ops, "Write ops committed (every plane)")                    \
  COUNTER(staged_read_ops, "Read ops served from a prefetched (staged) copy") \
  COUNTER(direct_acquired_ops, "Direct reads: objects held for a peer")     \
  COUNTER(direct_write_ops, "Direct writes committed")                       \
  COUNTER(shm_bytes_read, "Object bytes held for shared-memory readers")     \
  COUNTER(rdma_bytes_read, "Object bytes held for RDMA readers")             \
  COUNTER(tcp_bytes_written, "Object bytes committed over TCP")              \
  COUNTER(shm_bytes_written, "Object bytes committed through shared memory") \
  COUNTER(rdma_bytes_written, "Object bytes committed through RDMA")         \
  COUNTER(rdma_connections, "RDMA queue pairs accepted")                     \
  COUNTER(stale_reads, "Read ops answered NotFound")                         \
  COUNTER(rejected_ops, "Write ops not stored and reads failed other than NotFound") \
  COUNTER(accepted_connections, "Data connections accepted")                 \
  COUNTER(refused_connections, "Connections refused over a limit or for want of a worker") \
  COUNTER(peer_refused_connections, "Connections refused over max_connections_per_peer") \
  COUNTER(thread_start_failures, "Worker threads that could not be started") \
  COUNTER(deferred_requests, "Requests that waited for max_requests_per_peer") \
  COUNTER(idle_closed_connections, "Connections closed after idle_timeout")  \
  COUNTER(protocol_errors, "Malformed frames and broken requests")           \
  COUNTER(denied_ops, "Ops refused for their capability (also rejected)")    \
  GAUGE(open_connections, "Data connections open now")                       \
  GAUGE(worker_threads, "Data-plane worker threads started")                 \
  GAUGE(requests_in_progress, "Requests served or waiting for a worker")
HYM_DECLARE_STATS(DataServerStats, DataServerCounters, HYM_DATA_SERVER_STATS);

// One client's RDMA queue pair as the data server sees it (made by an
// RdmaAcceptor, data_server.h; kept in the connection's ConnState): what the
// peer may reach of the node's memory. The node's memory has no remote access
// of its own (except on a node that trusts its clients with whole areas,
// RdmaPlane); each granted acquire or write reservation opens exactly its
// object's range to this queue pair's peer, and its release, commit, abort
// or the connection's end closes it again before the range can be reused.
class RdmaConnection {
 public:
  struct Range {
    const void* data = nullptr;
    uint64_t length = 0;
    // RDMA WRITE access (a write reservation); else READ (an acquire).
    bool write = false;
  };
  // Ends every grant still open (Revoke), then the queue pair.
  virtual ~RdmaConnection() = default;
  // Opens each range to the peer (READ, or WRITE if `write`, nothing else)
  // and returns the key the peer addresses it with (RDMA rkey), or why not
  // (ResourceExhausted: out of windows or registrations; the queue pair's
  // errors). A range must lie inside one exposed memory area.
  virtual std::vector<absl::StatusOr<uint32_t>> Grant(
      absl::Span<const Range> ranges, absl::Time deadline) = 0;
  // Closes the grants of `keys` (each returned by Grant and not revoked
  // since). When Revoke returns, the peer can no longer reach their memory
  // (a grant that cannot be closed in order is destroyed, which closes it
  // too). Never fails.
  virtual void Revoke(absl::Span<const uint32_t> keys, absl::Time deadline) = 0;
};

// ExtentKey order, for the maps of a ConnState.
struct ExtentKeyLess {
  bool operator()(const ExtentKey& a, const ExtentKey& b) const {
    return std::tie(a.region_id, a.addr, a.length, a.generation) <
           std::tie(b.region_id, b.addr, b.length, b.generation);
  }
};

// A connection's state: who it is, and its direct-access holds (objects held
// for one-sided reads, destinations reserved for one-sided writes, the RDMA
// queue pair). Lives as long as the connection and must be ended with
// FrameHandler::EndConnection before it is destroyed.
struct ConnState {
  struct WriteHold {
    ExtentTable::WriteTicket ticket;
    WriteView view;
  };
  using KeyLess = ExtentKeyLess;
  // The peer key (DataServer::PeerKeyOf), for logs.
  std::string peer;
  std::map<ExtentKey, KvManager::StagedRead, KeyLess> reads;
  std::map<ExtentKey, WriteHold, KeyLess> writes;
  // Session for acquires that name none (0 until first needed).
  uint64_t own_session = 0;
  // The RDMA queue pair (set by the server's kRdmaConnectRequest handling),
  // and the key of each hold's grant on it (every hold of `reads` and
  // `writes` has one while `rdma` is set).
  std::unique_ptr<RdmaConnection> rdma;
  std::map<ExtentKey, uint32_t, KeyLess> read_keys;
  std::map<ExtentKey, uint32_t, KeyLess> write_keys;
};

// A decoded request (FrameHandler::ParseHeader, ParseOps, ParseCapabilities
// and, for reads, prefetches, releases and acquires, the session id).
struct Request {
  wire::FrameHeader header;
  // Statuses 0, except in a kWriteCommitRequest (0: commit, else abort).
  std::vector<wire::OpDesc> ops;
  // The session id payload (0: none).
  uint64_t session = 0;
  // kHintRequest's payload.
  wire::HintTimes hint;
};

// A response frame ready to send: iov()[0] is the header, the op table and
// any small payload (AreaRefs, an error message); further entries are the
// objects of a read, in device memory. The memory they point to stays valid,
// and the objects held, until the Response is destroyed (after sending).
class Response {
 public:
  Response() = default;
  Response(Response&&) = default;
  Response& operator=(Response&&) = delete;
  Response(const Response&) = delete;
  Response& operator=(const Response&) = delete;
  // Ends the holds (device views, then extent pins, then staged copies).
  ~Response();

  // A kError frame for `status` (Internal if OK), message truncated to
  // wire::kMaxErrorBytes.
  static Response Error(uint64_t request_id, const absl::Status& status);

  const wire::FrameHeader& header() const { return header_; }
  // Ops of the response (as encoded in the op table).
  const std::vector<wire::OpDesc>& ops() const { return ops_; }
  // A kError frame: the server sends it (best effort) and closes the
  // connection.
  bool closes_connection() const {
    return header_.type == wire::FrameType::kError;
  }
  // Non-empty.
  const std::vector<iovec>& iov() const { return iov_; }
  // The whole frame in one buffer (tests; the server sends iov()).
  std::string Flatten() const;

 private:
  friend class FrameHandler;
  // Encodes header_ and ops_ (and `small_payload`) into head_.
  void Encode(absl::Span<const uint8_t> small_payload);

  wire::FrameHeader header_;
  std::vector<wire::OpDesc> ops_;
  std::vector<uint8_t> head_;
  std::vector<iovec> iov_;
  // What a read response's payload entries point into.
  MemoryDevice* device_ = nullptr;
  std::vector<ReadView> views_;
  std::vector<ExtentTable::ReadPin> pins_;
  std::vector<KvManager::StagedRead> staged_;
};

class FrameHandler;

// The payload sink of a kWriteRequest: for each op in order, Begin(i)
// reserves where its bytes go (or says to drop them), the caller puts the
// op's `length` bytes there, and Commit(i) makes the object readable; then
// Finish() gives the response. If the payload breaks off, Abort() ends the op
// in progress (nothing becomes readable) and the connection is closed.
// Destroying the stream aborts an op begun and not committed.
class WriteStream {
 public:
  WriteStream(WriteStream&&) = default;
  WriteStream& operator=(WriteStream&&) = delete;
  ~WriteStream() { Abort(); }

  size_t op_count() const { return ops_.size(); }
  // Bytes of op `i`'s payload.
  uint64_t length(size_t i) const { return ops_[i].length; }
  // Reserves op `i`'s destination: `length(i)` bytes to receive into, or
  // nullptr when the op is refused (its status says why) and its bytes are
  // to be read and dropped. REQUIRES: ops in order, each once; the previous
  // op committed (or refused).
  uint8_t* Begin(size_t i);
  // Op `i`'s bytes are in place: commits it. REQUIRES: Begin(i) returned
  // non-null.
  void Commit(size_t i);
  // Ends the op begun, if any: nothing of it becomes readable. Idempotent.
  void Abort();
  // The kWriteResponse, with each op's status and each written op's
  // receipt. REQUIRES: every op begun
  // and committed or refused.
  Response Finish();

 private:
  friend class FrameHandler;
  WriteStream(FrameHandler* handler, ConnState* cs, const Request& request,
              absl::Time deadline);

  FrameHandler* handler_;
  ConnState* cs_;
  uint64_t request_id_;
  std::vector<wire::OpDesc> ops_;
  absl::Time deadline_;
  // The op begun and not committed.
  bool begun_ = false;
  ExtentTable::WriteTicket ticket_;
  WriteView view_;
};

struct FrameHandlerOptions {
  // The memory and the extent record served. Not owned; required; must
  // outlive the handler.
  MemoryDevice* device = nullptr;
  ExtentTable* extents = nullptr;
  // Serves the read-path session frames (DataServerOptions::kv). Not owned;
  // optional; must outlive the handler.
  KvManager* kv = nullptr;
  // Checks every op's capability. Not owned; required; must outlive the
  // handler.
  const CapabilityVerifier* capabilities = nullptr;
  // Where the handler counts. Not owned; required; must outlive the handler.
  DataServerCounters* counters = nullptr;

  absl::Status Validate() const;
};

class FrameHandler {
 public:
  // Errors: InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<FrameHandler>> Create(
      const FrameHandlerOptions& options);
  FrameHandler(const FrameHandler&) = delete;
  FrameHandler& operator=(const FrameHandler&) = delete;

  // ---- decoding (the server reads each part off the socket)

  // Decodes a request header: InvalidArgument/Unimplemented as
  // wire::DecodeHeader, InvalidArgument for a frame type a storage node does
  // not accept. Counts a protocol error on failure.
  // `h` is filled in as far as decoded (its request_id for the kError).
  absl::Status ParseHeader(const uint8_t hdr[wire::kHeaderBytes],
                           wire::FrameHeader* h);
  // Bytes of the op table that follows `h` (then, if
  // wire::CarriesCapabilities, op_count * wire::kCapBytes of capabilities).
  static size_t OpTableBytes(const wire::FrameHeader& h) {
    return size_t{h.op_count} * wire::kOpBytes;
  }
  // Decodes and validates `h`'s op table into request->ops (statuses
  // cleared but for a kWriteCommitRequest's). InvalidArgument for a bad
  // table; counts a protocol error on failure.
  absl::Status ParseOps(absl::Span<const uint8_t> table, Request* request);
  // Decodes the capability table into request->ops[i].cap.
  // InvalidArgument for a bad entry; counts a protocol error on failure.
  absl::Status ParseCapabilities(absl::Span<const uint8_t> table,
                                 Request* request);

  // ---- handling

  // Checks every op's capability against the node's identity (for requests
  // that carry them); an op not authorized gets its status
  // (PermissionDenied, ...) and is skipped by the handlers. May wait until
  // `deadline` (at most a few seconds) for a registration in flight. Done by
  // Handle and StartWrite; public for kRdmaConnectRequest, which the server
  // handles itself.
  void Authorize(Request* request, absl::Time deadline);
  // kPing, kReadRequest, kPrefetchRequest, kReleaseRequest,
  // kAcquireRequest, kWriteBeginRequest, kWriteCommitRequest: authorizes the
  // ops and serves them. `deadline`: the request's (staging waits, write
  // drains). A kError Response for other types.
  Response Handle(ConnState* cs, Request request, absl::Time deadline);
  // kWriteRequest: authorizes the ops; the stream receives the payload.
  WriteStream StartWrite(ConnState* cs, Request request, absl::Time deadline);
  // Ends a connection's holds and begun writes (and its queue pair).
  // Idempotent.
  void EndConnection(ConnState* cs);

  // While set, capabilities are not checked (DataServer's
  // SetSkipCapabilityChecksForTest).
  void SetSkipCapabilityChecksForTest(bool skip) {
    skip_capability_checks_for_test_.store(skip, std::memory_order_relaxed);
  }

 private:
  friend class WriteStream;
  explicit FrameHandler(const FrameHandlerOptions& options);

  // A response of `ops` with an empty payload.
  static Response OpsResponse(wire::FrameType type, uint64_t request_id,
                              std::vector<wire::OpDesc> ops);
  // A response of `ops` whose payload is one AreaRef per op.
  static Response AreaRefResponse(wire::FrameType type, uint64_t request_id,
                                  std::vector<wire::OpDesc> ops,
                                  const std::vector<wire::AreaRef>& refs);
  // A write response (kWriteResponse, kWriteCommitResponse) of `ops`: its
  // payload is one write receipt per op, signed under the node's current
  // identity for each OK op, zero for the others.
  Response ReceiptResponse(wire::FrameType type, uint64_t request_id,
                           std::vector<wire::OpDesc> ops) const;

  Response HandleRead(const wire::FrameHeader& h,
                      std::vector<wire::OpDesc>& ops, uint64_t session,
                      absl::Time deadline);
  // kPrefetchRequest and kReleaseRequest.
  // kHintRequest: think-time hints to the KV manager.
  Response HandleHint(const wire::FrameHeader& h,
                      std::vector<wire::OpDesc>& ops,
                      const wire::HintTimes& times);
  Response HandleSession(const wire::FrameHeader& h,
                         std::vector<wire::OpDesc>& ops, uint64_t session,
                         absl::Time deadline, ConnState* cs);
  Response HandleAcquire(const wire::FrameHeader& h,
                         std::vector<wire::OpDesc>& ops, uint64_t session,
                         absl::Time deadline, ConnState* cs);
  Response HandleWriteBegin(const wire::FrameHeader& h,
                            std::vector<wire::OpDesc>& ops,
                            absl::Time deadline, ConnState* cs);
  Response HandleWriteCommit(const wire::FrameHeader& h,
                             std::vector<wire::OpDesc>& ops,
                             absl::Time deadline, ConnState* cs);

  const FrameHandlerOptions options_;
  const std::vector<MemoryArea> areas_;  // options_.device->Areas()
  DataServerCounters& counters_;
  std::atomic<uint64_t> next_conn_session_{1};
  std::atomic<bool> skip_capability_checks_for_test_{false};
};

}  // namespace hymcache::storage
