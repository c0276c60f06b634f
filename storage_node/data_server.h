// DataServer: the storage node's TCP data plane, speaking the protocol of
// common/wire.h. Object bytes move straight between sockets and device memory
// (reads are sent from the pointers the MemoryDevice hands out, writes are
// received into them), checked against the ExtentTable.
//
// Threads: one acceptor ("dp-accept") and one thread per connection
// ("dp-conn"), at most max_connections of them; a connection beyond that, or
// one whose thread cannot be started (thread or pid limit), is answered with
// a kError frame (ResourceExhausted) and closed. A connection carries one
// request at a time. Each request must complete within io_timeout of its
// header arriving, so a stalled peer cannot hold a thread; a connection that
// waits longer than idle_timeout for its next request is closed (clients
// retry on a fresh connection).
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
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/thread.h"
#include "common/wire.h"
#include "storage_node/extent_table.h"
#include "storage_node/kv_manager.h"
#include "storage_node/memory_device.h"

namespace hymcache::storage {

// Accepts RDMA connections for the data server (kRdmaConnectRequest): makes
// a queue pair connected to the client's and returns it, with the local
// queue-pair description to send back. Implemented by the storage node over
// the verbs layer; the data server knows nothing of verbs.
class RdmaAcceptor {
 public:
  virtual ~RdmaAcceptor() = default;
  // The first member keeps the queue pair alive; it is dropped when the TCP
  // connection that asked for it closes.
  virtual absl::StatusOr<std::pair<std::shared_ptr<void>, std::string>> Accept(
      std::string_view client_info) = 0;
};

struct DataServerOptions {
  // Address to listen on.
  // Default: "127.0.0.1"
  std::string host = "127.0.0.1";
  // TCP port; 0 picks a free port (see DataServer::port()).
  // Default: 0
  int port = 0;
  // Most connections served at once (each holds a thread).
  // Default: 1024
  int max_connections = 1024;
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
  // closed, freeing its thread and its slot. absl::InfiniteDuration(): never.
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

struct DataServerStats {
  uint64_t bytes_read = 0;        // object bytes sent to readers
  uint64_t bytes_written = 0;     // object bytes committed by writers
  uint64_t read_ops = 0;          // read ops answered OK
  uint64_t write_ops = 0;         // write ops committed
  uint64_t staged_read_ops = 0;   // of read_ops, served from a session's
                                  // prefetched (staged) copy
  uint64_t acquired_ops = 0;      // direct reads: objects held for a peer
  uint64_t direct_write_ops = 0;  // direct writes committed
  uint64_t rdma_connections = 0;  // RDMA queue pairs accepted
  uint64_t stale_reads = 0;       // read ops answered NotFound
  uint64_t rejected_ops = 0;      // write ops not stored + reads failed
                                  // other than NotFound
  uint64_t open_connections = 0;
  uint64_t accepted_connections = 0;
  uint64_t refused_connections = 0;  // over max_connections, or no thread
  uint64_t thread_start_failures = 0;  // connection threads not started
  uint64_t idle_closed_connections = 0;  // closed after idle_timeout
  uint64_t protocol_errors = 0;      // malformed frames, broken requests
  uint64_t denied_ops = 0;  // ops refused for their capability (also in
                            // rejected_ops)
};

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

  // While `fail` is set, starting a connection thread fails as it does at
  // the process's thread limit (std::system_error).
  void SetFailThreadStartsForTest(bool fail) {
    fail_thread_starts_for_test_.store(fail, std::memory_order_relaxed);
  }
  // While set, capabilities are not checked (for measuring what checking
  // them costs: tools/bench/get_bench). Never set outside tests and
  // benchmarks.
  void SetSkipCapabilityChecksForTest(bool skip) {
    skip_capability_checks_for_test_.store(skip, std::memory_order_relaxed);
  }

 private:
  struct Conn {
    Socket sock;
    Thread thread;
    bool done = false;  // guarded by mu_
  };

  DataServer(const DataServerOptions& options, Socket listen, int port,
             int stop_fd, int reap_fd);

  void AcceptLoop();
  void Accept();
  // Starts the thread serving `c`. Errors: ResourceExhausted if the thread
  // cannot be created.
  absl::Status StartConnThread(Conn* c);
  // Joins and frees the connections whose threads have finished.
  void Reap();
  void ServeConnection(Conn* conn);
  // Serves one request whose header is in `hdr`; false: close the connection.
  // What a connection holds for direct access (defined in the .cc).
  struct ConnState;
  bool HandleRequest(int fd, const uint8_t* hdr, absl::Time deadline,
                     ConnState* cs);
  bool HandleAcquire(int fd, const wire::FrameHeader& h,
                     std::vector<wire::OpDesc>& ops, uint64_t session,
                     absl::Time deadline, ConnState* cs);
  bool HandleWriteBegin(int fd, const wire::FrameHeader& h,
                        std::vector<wire::OpDesc>& ops, absl::Time deadline,
                        ConnState* cs);
  bool HandleWriteCommit(int fd, const wire::FrameHeader& h,
                         std::vector<wire::OpDesc>& ops, absl::Time deadline,
                         ConnState* cs);
  bool HandleRdmaConnect(int fd, const wire::FrameHeader& h,
                         absl::Time deadline, ConnState* cs);
  // Ends a connection's holds and begun writes.
  void EndConnState(ConnState* cs);
  // `session` 0: no session.
  bool HandleRead(int fd, const wire::FrameHeader& h,
                  std::vector<wire::OpDesc>& ops, uint64_t session,
                  absl::Time deadline);
  // kPrefetchRequest and kReleaseRequest.
  bool HandleSession(int fd, const wire::FrameHeader& h,
                     std::vector<wire::OpDesc>& ops, uint64_t session,
                     absl::Time deadline, ConnState* cs);
  bool HandleWrite(int fd, const wire::FrameHeader& h,
                   std::vector<wire::OpDesc>& ops, absl::Time deadline);
  void SendError(int fd, uint64_t request_id, const absl::Status& status);

  // Constant after construction.
  const DataServerOptions options_;
  const std::vector<MemoryArea> areas_;  // options_.device->Areas()
  const int port_;
  const int stop_fd_;  // eventfd: readable once shutdown starts
  const int reap_fd_;  // eventfd: a connection thread finished
  Socket listen_;      // used by the acceptor thread only
  Thread acceptor_;

  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> read_ops_{0};
  std::atomic<uint64_t> write_ops_{0};
  std::atomic<uint64_t> staged_read_ops_{0};
  std::atomic<uint64_t> acquired_ops_{0};
  std::atomic<uint64_t> direct_write_ops_{0};
  std::atomic<uint64_t> rdma_connections_{0};
  std::atomic<uint64_t> next_conn_session_{1};
  std::atomic<uint64_t> stale_reads_{0};
  std::atomic<uint64_t> rejected_ops_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> protocol_errors_{0};
  std::atomic<uint64_t> thread_start_failures_{0};
  std::atomic<uint64_t> idle_closed_{0};
  std::atomic<uint64_t> denied_ops_{0};
  std::atomic<bool> fail_thread_starts_for_test_{false};
  std::atomic<bool> skip_capability_checks_for_test_{false};

  mutable Mutex mu_;
  CondVar cv_;  // a connection finished; shutdown finished
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache::storage
