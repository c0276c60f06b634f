// MasterServer: the HyMCache master daemon in a library. It opens the
// RocksDB metadata store, rebuilds the in-memory state (MasterService),
// serves hymcache.v1.MasterService and grpc.health.v1 over gRPC on the
// completion-queue API (rpc_threads "master-rpc-N" threads, each polling its
// own queue and running the calls it receives inline; master/cq_server.h)
// and runs the "master-reaper" thread that frees expired pending puts.
//
// main.cc is a thin wrapper around it; integration tests and tools run it
// in-process:
//
//   MasterOptions options;
//   options.db_path = dir;                      // listen on 127.0.0.1:0
//   ASSIGN_OR_RETURN(auto master, MasterServer::Create(options));
//   Dial(master->address());
//   ...
//   master->Shutdown();                         // or let it go out of scope
//
// Thread safety: safe for concurrent use without external synchronization,
// except that Shutdown must not be called from an RPC thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/security.h"
#include "common/thread.h"

#include <vector>

namespace grpc {
class Server;
}  // namespace grpc

namespace hymcache {

class MetricsExporter;
class StatsVisitor;

namespace master {
class CqPoller;
class HealthService;
class MasterService;
class MasterRpcHandler;
class TenantRegistry;
}  // namespace master

struct MasterOptions {
  // gRPC host:port to listen on; port 0 picks a free port (see port()).
  // Default: "127.0.0.1:0".
  std::string listen_address = "127.0.0.1:0";
  // Threads serving the gRPC API ("master-rpc-N"), each polling its own
  // completion queue and running the calls it receives inline. One thread
  // has no hand-off between threads at all (gRPC 1.51's poller is shared:
  // with two or more, each event wakes another thread to poll next; see
  // docs/performance.md for BatchLookup at 1 and 2); a call that waits for
  // the disk (a PutCommit with sync_writes, a large ListObjects page)
  // holds up the others on its thread. 1..64. Default: 1.
  uint32_t rpc_threads = 1;
  // Directory of the RocksDB metadata store; its parent must exist. Only one
  // master may use it at a time. Required. Default: "".
  std::string db_path;
  // A storage node silent for this long is dead: its objects miss and it
  // gets no placements. Default: 10 s.
  absl::Duration node_timeout = absl::Seconds(10);
  // Heartbeat period told to nodes at registration; below node_timeout.
  // Default: 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Pending puts not committed within this are freed. Default: 30 s.
  absl::Duration put_timeout = absl::Seconds(30);
  // Most keys in one PutStart / BatchLookup / Remove. Default: 1024.
  uint32_t max_batch_keys = 1024;
  // Longest key in bytes. Default: 256.
  uint32_t max_key_bytes = 256;
  // Largest object in bytes. Default: 1 GiB.
  uint64_t max_object_bytes = uint64_t{1} << 30;
  // An object returned by a read (for_read BatchLookup) is not evicted for
  // this long afterwards. 0 disables the protection. 0..24 h. Default: 5 s.
  absl::Duration read_lease = absl::Seconds(5);
  // Lifetime of a read capability (see MasterServiceOptions). 1 s..1 h.
  // Default: 5 min.
  absl::Duration capability_lifetime = absl::Minutes(5);
  // Most objects one PutStart may evict from a full node to make room; 0
  // disables eviction (a full node refuses puts). Default: 4096.
  uint32_t max_evictions_per_put = 4096;
  // Period of each storage node's background reconciliation with the
  // master (anti-entropy; registration always reconciles). 0: none.
  // 0..24 h. Default: 60 s.
  absl::Duration reconcile_interval = absl::Seconds(60);
  // Resource limits (see MasterServiceOptions): node records kept; when a
  // dead node's record is forgotten; a caller's pending puts (share of a
  // node's capacity, slots). The caller of a PutStart is its peer address
  // (see MasterRpcHandler's CallerKey). Defaults: 1024, 7 days, 0.25, 65536.
  uint32_t max_nodes = 1024;
  absl::Duration forget_dead_nodes_after = absl::Hours(7 * 24);
  double max_pending_share_per_caller = 0.25;
  uint64_t max_pending_slots_per_caller = 65536;
  // fsync the metadata WAL on every write. Without it commits survive a
  // process crash (kill -9) but the last ones may be lost on power loss,
  // which a cache tolerates. Default: false.
  bool sync_writes = false;
  // Index snapshots (see MasterServiceOptions::snapshot_path) at
  // db_path + ".snapshot": written at shutdown and every
  // index_snapshot_interval (0: only at shutdown), loaded at start-up with
  // the store's changes since replayed from its write-ahead log, which is
  // kept for the purpose (twice the interval, at least an hour, at most
  // 1 GiB). Defaults: true, 10 min.
  bool index_snapshots = true;
  absl::Duration index_snapshot_interval = absl::Minutes(10);
  // Identities file (or directory) of the callers (common/security.h:
  // "role tenant name sha256:HEX | cert:NAME" lines). "" turns
  // authentication off: every caller is an admin, and only a loopback
  // listen_address is allowed unless `insecure`. Default: "".
  std::string auth_tokens_file;
  // Listen on a non-loopback address without identities. Default: false.
  bool insecure = false;
  // Per-tenant quotas (hymctl tenant set-quota), one "tenant max_objects
  // max_bytes" line each. Default: "" = db_path + ".quotas".
  std::string tenant_quotas_file;
  // TLS for the gRPC service (server certificate; client certificates
  // verified against tls.ca_file). Default: plaintext.
  TlsOptions tls;
  // Source of time for liveness and put expiry; not owned, must outlive the
  // server. Default: nullptr, meaning Clock::Real().
  Clock* clock = nullptr;
  // HOST:PORT serving Prometheus metrics (GET /metrics, series
  // hymcache_master_*; docs/operations.md); port 0 picks a free port (see
  // metrics_address()). "" serves none. A non-loopback host needs what
  // listen_address needs (identities or `insecure`). Default: "".
  std::string metrics_listen;
  // The build, exported as build_info{version, commit} = 1 (hymcache-master
  // passes its BuildInfo()). Default: "" (no build_info series).
  std::string build_version;
  std::string build_commit;

  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

class MasterServer {
 public:
  // Opens the store, loads it and starts serving. Errors: InvalidArgument
  // for bad options; the store's error (e.g. another master holds db_path);
  // Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MasterServer>> Create(
      const MasterOptions& options);
  // Calls Shutdown().
  ~MasterServer();
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  // The bound gRPC port.
  int port() const { return port_; }
  // "host:port" that clients dial: the listen host (127.0.0.1 for a wildcard
  // host such as 0.0.0.0 or [::]) and the bound port.
  std::string address() const { return address_; }
  // "host:port" of the Prometheus endpoint; "" without metrics_listen.
  const std::string& metrics_address() const { return metrics_address_; }

  // Re-reads the identities file (SIGHUP). On error the old identities stay.
  // OkStatus when authentication is off.
  absl::Status ReloadIdentities();

  // Stops serving (in-flight calls get up to 1 s to finish), joins the
  // reaper and closes the store. Idempotent; later calls return at once.
  // The gRPC health status (grpc.health.v1, service "" and
  // "hymcache.v1.MasterService") turns NOT_SERVING first; it is SERVING
  // from the end of Create until then. (The port is bound only after the
  // store is loaded: a probe during loading is refused.)
  void Shutdown();
  // Blocks until Shutdown() has completed.
  void Wait();

  // Whether the gRPC server answers a health check within `timeout` (the
  // systemd watchdog's test; common/health_probe.h). REQUIRES: not
  // concurrently with or after Shutdown().
  absl::Status CheckAlive(absl::Duration timeout);

  // Open grpc.health.v1 Watch streams (tests). REQUIRES: before Shutdown.
  size_t HealthWatchersForTest() const;

  // The service behind the RPCs, for in-process tests. Null after Shutdown.
  master::MasterService* ServiceForTest() { return service_.get(); }

 private:
  MasterServer() = default;
  void ReaperLoop(absl::Duration interval);
  // Every master stat (the Prometheus series, unprefixed): the RPC layer's,
  // the service's counters and gauges, per node and per tenant.
  void VisitStats(StatsVisitor* v) const;

  // Constant after Create.
  int port_ = 0;
  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<Authenticator> auth_;  // null: authentication off
  std::unique_ptr<master::TenantRegistry> tenants_;
  std::unique_ptr<master::MasterService> service_;
  std::unique_ptr<master::MasterRpcHandler> handler_;
  std::unique_ptr<master::HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  // One per rpc_threads; drained after server_ shuts down.
  std::vector<std::unique_ptr<master::CqPoller>> pollers_;
  Thread reaper_;
  // Serves /metrics; destroyed first by Shutdown (scrapes read service_).
  std::unique_ptr<MetricsExporter> metrics_;
  // MasterOptions::build_version / build_commit.
  std::string build_version_;
  std::string build_commit_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache
