// DataServer: the storage node's TCP data plane, speaking the protocol of
// common/wire.h. Object bytes move straight between sockets and device memory
// (reads are sent from the pointers the MemoryDevice hands out, writes are
// received into them), checked against the ExtentTable.
//
// Threads: one event loop ("dp-poll") and a bounded pool of workers
// ("dp-work", started on demand up to worker_threads). A connection with no
// request in progress holds no thread: it waits in the loop's epoll set,
// which also gathers each request's fixed-size header. Once a header is
// complete the connection is handed to a worker, which serves that one
// request (op table, payload, response) and gives the connection back to
// the loop. A connection carries one request at a time.
//
// The server reads and writes the sockets; what each frame does is a
// FrameHandler's (frame_handler.h: request in, response frame out, no socket
// or thread), except kRdmaConnectRequest (HandleRdmaConnect, here).
//
// Limits, so that no peer can deny service to another (a peer is the
// client's IP address, see PeerKeyOf): at most max_connections open and
// max_connections_per_peer from one peer (beyond either, a new connection is
// answered with a kError frame (ResourceExhausted) and closed); at most
// max_requests_per_peer of one peer's requests served or queued for a
// worker at once (its further ready connections wait, without a thread,
// until one of its requests finishes; other peers' requests go first).
// Each request must complete within io_timeout of its header's first byte,
// so a stalled peer cannot hold a worker; a connection that waits longer
// than idle_timeout for its next request is closed (clients retry on a
// fresh connection). A connection's direct-access holds (acquired objects,
// begun writes, its RDMA queue pair) live as long as the connection.
//
// Per-op outcomes are reported in the response's op table (status codes of
// ExtentTable and MemoryDevice errors: NotFound for a stale or unknown read,
// FailedPrecondition for a stale write, OutOfRange/InvalidArgument for an
// address outside the region, ResourceExhausted when the device refuses a
// write, Unavailable when readers of reused space do not drain,
// PermissionDenied when the op's capability does not authorize it). A malformed
// frame, or a connection that breaks mid-request, ends the connection (with a
// best-effort kError); an interrupted write leaves nothing readable.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/stats.h"
#include "common/thread.h"
#include "common/wire.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/frame_handler.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

// Accepts RDMA connections for the data server (kRdmaConnectRequest): makes
// a queue pair connected to the client's and returns it, with the local
// queue-pair description to send back. Implemented by the storage node over
// the verbs layer (RdmaPlane); the data server knows nothing of verbs.
class RdmaAcceptor {
 public:
  virtual ~RdmaAcceptor() = default;
  // The connection lives as long as the TCP connection that asked for it.
  virtual absl::StatusOr<
      std::pair<std::unique_ptr<RdmaConnection>, std::string>>
  Accept(absl::string_view client_info) = 0;
};

struct DataServerOptions {
  // Address to listen on.
  // Default: "127.0.0.1"
  std::string host = "127.0.0.1";
  // TCP port; 0 picks a free port (see DataServer::port()).
  // Default: 0
  int port = 0;
  // Most connections open at once, idle or not. An idle connection holds a
  // descriptor and about 1 KiB, no thread; the process's descriptor limit
  // (RLIMIT_NOFILE) must allow this many plus the node's own.
  // Default: 8192
  int max_connections = 8192;
  // Most connections open at once from one peer address: one peer cannot
  // take every slot (above max_connections: no per-peer limit).
  // Default: 1024
  int max_connections_per_peer = 1024;
  // Most worker threads: requests served at once. Started on demand and kept
  // until shutdown.
  // Default: 256
  int worker_threads = 256;
  // Most requests of one peer address served or waiting for a worker at
  // once; further ready connections of that peer wait (without a thread)
  // for one of its requests to finish (above worker_threads: no per-peer
  // limit).
  // Default: 128
  int max_requests_per_peer = 128;
  // Send buffer of each connection (SO_SNDBUF): bounds the response bytes
  // in flight, so that a reader sharing a core with the connection's thread
  // copies them while they are still in the cache (see TuneDataSocket in
  // common/net.h). 0: the kernel's autotuning (up to net.ipv4.tcp_wmem's
  // maximum, 4 MiB by default).
  // Default: kDataSendBufferBytes (512 KiB)
  int send_buffer_bytes = kDataSendBufferBytes;
  // Bound on receiving and answering one request, from its header on.
  // Default: 30 s
  absl::Duration io_timeout = absl::Seconds(30);
  // A connection that waits longer than this for the next request header is
  // closed, freeing its slot (and its holds). absl::InfiniteDuration(): never.
  // Default: 60 s
  absl::Duration idle_timeout = absl::Seconds(60);
  // The memory and the extent record the server serves. Not owned; required;
  // must outlive the server.
  MemoryDevice* device = nullptr;
  ExtentTable* extents = nullptr;
  // Serves the read-path session frames (prefetch, release, session reads).
  // Not owned; optional (without it prefetch and release requests are
  // answered with per-op Unimplemented and session reads are plain reads);
  // must outlive the server.
  KvManager* kv = nullptr;
  // Serves kRdmaConnectRequest. Not owned; optional (without it RDMA
  // connects are refused with Unimplemented); must outlive the server.
  RdmaAcceptor* rdma = nullptr;
  // Checks every op's capability (common/wire.h, "Capabilities") against
  // the node's current identity before serving it. Not owned; required;
  // must outlive the server.
  const CapabilityVerifier* capabilities = nullptr;

  absl::Status Validate() const;
};

// The data server's stats (DataServerStats, DataServerCounters) are declared
// in frame_handler.h.

class DataServer {
 public:
  // Binds the listening socket and starts accepting.
  // Errors: InvalidArgument for bad options, Unavailable if the address
  // cannot be bound, Internal if the server's event descriptors cannot be
  // created.
  static absl::StatusOr<std::unique_ptr<DataServer>> Create(
      const DataServerOptions& options);
  // Shutdown(absl::Seconds(10)).
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  // The bound port.
  int port() const { return port_; }

  // Graceful: closes the listening socket, closes idle connections at once,
  // lets requests in progress finish until `drain_timeout` passes (then
  // breaks their connections), and joins every thread. Idempotent; a second
  // caller waits for the first to finish.
  void Shutdown(absl::Duration drain_timeout);

  DataServerStats Stats() const;
  // Reports Stats() and the read latency histogram ("read_seconds").
  void VisitStats(StatsVisitor* v) const;

  // While `fail` is set, starting a worker thread fails as it does at the
  // process's thread limit (Thread::Start is ResourceExhausted).
  void SetFailThreadStartsForTest(bool fail) {
    fail_thread_starts_for_test_.store(fail, std::memory_order_relaxed);
  }
  // While set, capabilities are not checked (for measuring what checking
  // them costs: tools/bench/get_bench). Never set outside tests and
  // benchmarks.
  void SetSkipCapabilityChecksForTest(bool skip) {
    handler_->SetSkipCapabilityChecksForTest(skip);
  }

  // The peer key of an address (limits are per key): its IP address as
  // text (an IPv4-mapped IPv6 address as IPv4), without the port. A small
  // function so that a later identity (a tenant) can replace it.
  static std::string PeerKeyOf(const struct sockaddr_storage& addr);

 private:
  struct Conn;
  // Per peer key: its connections and requests.
  struct Peer {
    int conns = 0;
    int requests = 0;  // served or queued for a worker
    std::deque<Conn*> deferred;  // ready, over max_requests_per_peer
  };

  DataServer(const DataServerOptions& options, Socket listen, int port,
             int epoll_fd, int stop_fd, int wake_fd);

  // The event loop: accepts, gathers request headers of idle connections,
  // closes idle ones, hands ready ones to workers.
  void Loop();
  void Accept();
  // The loop owns `c` (idle): reads what has arrived of its header.
  void ReadHeader(Conn* c);
  // `c`'s header is complete: queue it for a worker (or defer it).
  void Dispatch(Conn* c);
  // Starts a worker if none is idle and the pool may grow; false if the
  // pool is empty and cannot start one.
  bool MaybeStartWorkerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work();
  // Serves `c`'s request (and those that follow at once); then gives `c`
  // back to the loop, or closes it.
  void Serve(Conn* c);
  // A request of `c`'s peer finished: its next deferred connection (if
  // any) is queued.
  void FinishRequestLocked(Conn* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `c` waits in the epoll set for its next request (or the rest of its
  // header). REQUIRES: `c` is not idle; mu_ not held.
  void ReturnToLoop(Conn* c);
  // Ends `c`'s holds, closes and frees it. REQUIRES: the caller owns `c`
  // (the loop for an idle connection, a worker for a busy one).
  void CloseConn(Conn* c);
  // The loop's timer for `c` (idle or header deadline).
  void SetTimerLocked(Conn* c, absl::Time when)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearTimerLocked(Conn* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Arm(Conn* c);

  // Serves one request whose header is in `hdr` (reading the rest of it,
  // sending the response); false: close the connection. The frames
  // themselves are handled by handler_.
  bool HandleRequest(int fd, const uint8_t* hdr, absl::Time deadline,
                     ConnState* cs);
  // Receives a kWriteRequest's payload into `w`, then sends its response.
  bool HandleWrite(int fd, uint64_t request_id, WriteStream w,
                   absl::Time deadline);
  // `grant`: the request's one op, its status set by the capability check.
  bool HandleRdmaConnect(int fd, const wire::FrameHeader& h,
                         const wire::OpDesc& grant, absl::Time deadline,
                         ConnState* cs);
  // Sends `response`; false: close the connection (a kError, or the send
  // failed).
  bool SendResponse(int fd, Response response, absl::Time deadline);
  void SendError(int fd, uint64_t request_id, const absl::Status& status);

  // Constant after construction.
  const DataServerOptions options_;
  const int port_;
  const int epoll_fd_;
  const int stop_fd_;  // eventfd: readable once shutdown starts
  const int wake_fd_;  // eventfd: the loop's earliest timer moved
  Socket listen_;      // used by the loop thread only
  Thread loop_;

  DataServerCounters counters_;
  // Serves the frames; counts in counters_.
  std::unique_ptr<FrameHandler> handler_;
  // Read-op service time, frame header to reply sent (TCP reads).
  LatencyHistogram read_latency_;
  std::atomic<bool> fail_thread_starts_for_test_{false};

  mutable Mutex mu_;
  CondVar work_cv_;  // a connection was queued for a worker; stopping
  CondVar done_cv_;  // a request finished; shutdown finished
  // Every open connection, by id (the epoll data).
  std::map<uint64_t, std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::deque<Conn*> ready_ ABSL_GUARDED_BY(mu_);  // for the workers
  // Idle connections' deadlines (idle_timeout, or io_timeout of a partial
  // header), for the loop.
  std::set<std::pair<absl::Time, uint64_t>> timers_ ABSL_GUARDED_BY(mu_);
  // When the loop wakes up at the latest (it sleeps in epoll_wait until).
  absl::Time loop_wait_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<Thread> workers_ ABSL_GUARDED_BY(mu_);
  int idle_workers_ ABSL_GUARDED_BY(mu_) = 0;
  int requests_ ABSL_GUARDED_BY(mu_) = 0;  // served or queued, all peers
  uint64_t next_conn_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  bool workers_exit_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache::storage
