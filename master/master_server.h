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
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/daemon.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "master/master_replication.h"
#include "master/master_service.h"

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
class MasterRpcHandler;
class TenantRegistry;
}  // namespace master

// What an RPC does, as MasterOptions::gate sees it. kRead answers from the
// index and memory and changes nothing durable: lookups (their capabilities
// are read-only), heartbeats, listings, stats. kWrite is every other call
// (and any call not marked): puts, removals, registrations, reconciliation,
// administration.
// kWriteProbe: whether a write would be admitted now, asked by a read that
// reports it (a heartbeat's read_only); not a refusal of its own.
enum class CallAccess { kRead, kWrite, kWriteProbe };

// The security and observability options (DaemonOptions, common/daemon.h):
// auth_tokens_file (the callers' identities; without it only a loopback
// listen_address unless insecure), tls (the gRPC service's), metrics_listen
// (series hymcache_master_*), build_version / build_commit.
struct MasterOptions : DaemonOptions {
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
  // LookupStreams (BatchLookup over an open stream) open at once; a stream
  // beyond them is refused (RESOURCE_EXHAUSTED) and its caller uses unary
  // BatchLookups. Each holds a call (a few KiB) for as long as its caller
  // keeps it open. 1..1000000. Default: 4096.
  uint32_t max_lookup_streams = 4096;
  // Directory of the RocksDB metadata store; its parent must exist. Only one
  // master may use it at a time. Required. Default: "".
  std::string db_path;
  // The metadata service behind the RPCs (master/master_service.h):
  // liveness, put expiry, request limits, read leases, capabilities,
  // eviction, reconciliation, node and caller limits, the clock (also the
  // RPC layer's), the snapshot period. Its defaults are the master's. Two
  // fields read differently here:
  //   service.max_key_bytes is the longest key a caller may send; the
  //     service gets room beyond it for a tenant's prefix (tenant.h).
  //   service.snapshot_path is the server's to set (db_path + ".snapshot"
  //     with index_snapshots); Validate refuses one set here.
  // The caller of a PutStart (max_pending_*_per_caller) is its peer address
  // (see MasterRpcHandler's CallerKey).
  master::MasterServiceOptions service;
  // fsync the metadata WAL on every write. Without it commits survive a
  // process crash (kill -9) but the last ones may be lost on power loss,
  // which a cache tolerates. Default: false.
  bool sync_writes = false;
  // Index snapshots (see MasterServiceOptions::snapshot_path) at
  // db_path + ".snapshot": written at shutdown and every
  // service.snapshot_interval (0: only at shutdown), loaded at start-up with
  // the store's changes since replayed from its write-ahead log, which is
  // kept for the purpose (twice the interval, at least an hour, at most
  // 1 GiB). Default: true.
  bool index_snapshots = true;
  // Per-tenant quotas (hymctl tenant set-quota), one "tenant max_objects
  // max_bytes" line each. Default: "" = db_path + ".quotas".
  std::string tenant_quotas_file;
  // High availability (master/master_ha.h, docs/ha.md). A gate asked
  // before every RPC of hymcache.v1.MasterService (reads and writes, unary
  // and streams, after the caller's identity is checked), told whether the
  // call reads or writes: a call it refuses gets its status (a leader that
  // lost its lease refuses writes, with kNotLeader or kReadOnly, so nothing
  // is written after the term ended). It runs on RPC threads and must be
  // fast and non-blocking. Default: none (every call passes).
  std::function<absl::Status(CallAccess)> gate;
  // The range of generations this master hands out
  // (RocksDbMetadataStoreOptions::generation_floor / generation_end): an
  // elected master's term's range. Default: 0, 0 (no bound).
  uint64_t generation_floor = 0;
  uint64_t generation_end = 0;
  // Standby replication (master/master_replication.h, docs/ha.md): kAsync
  // and kSync serve hymcache.v1.Replication on the same port (standbys
  // follow the store; followers need an admin identity) and keep the
  // store's write log at least an hour; kSync also answers each PutCommit
  // only once a standby holds it or after replication_sync_timeout.
  // Default: kOff.
  master::ReplicationMode replication = master::ReplicationMode::kOff;
  // kSync: the longest a commit waits for a standby
  // (MasterReplicationOptions::sync_timeout, and its default).
  absl::Duration replication_sync_timeout =
      master::MasterReplicationOptions().sync_timeout;
  // kAsync: how long the stream to a standby gathers writes into one
  // message (MasterReplicationOptions::async_batch_delay, and its default).
  absl::Duration replication_async_batch_delay =
      master::MasterReplicationOptions().async_batch_delay;
  // kConfirm: the same for its stream
  // (MasterReplicationOptions::confirm_batch_delay, and its default).
  absl::Duration replication_confirm_batch_delay =
      master::MasterReplicationOptions().confirm_batch_delay;
  // More stats for /metrics and GetStats (HaMaster adds its leadership's).
  // Called on scrape and GetStats threads. Default: none.
  std::function<void(StatsVisitor*)> extra_stats;
  // Bind listen_address with SO_REUSEPORT, beside a server that holds it
  // already: an elected HaMaster starts serving while its standby server
  // still listens, then closes that, so that clients never find the port
  // closed. Otherwise a second server on the port is refused. Default:
  // false.
  bool reuse_port = false;
  // An index loaded ahead (MasterServer::PreloadIndex, by a standby): Create
  // calls it with the sequence number its store opened at, and takes over
  // the service it returns instead of loading the store
  // (MasterService::CreatePreloaded). It returns null unless that service
  // was loaded at exactly that sequence. Default: none (Create loads).
  std::function<std::unique_ptr<master::MasterService>(uint64_t sequence)>
      take_preloaded;

  // InvalidArgument naming the first bad field (the service's included).
  absl::Status Validate() const;
};

// What MasterServer::PreloadIndex loaded.
struct PreloadedIndex {
  // The loaded service (over a read-only view of the store: it cannot
  // write). Its state is for MasterService::CreatePreloaded only.
  std::unique_ptr<master::MasterService> service;
  // The database's sequence number it was loaded at.
  uint64_t sequence = 0;
  absl::Duration took;
};

class MasterServer {
 public:
  // Opens the store, loads it and starts serving. Errors: InvalidArgument
  // for bad options; the store's error (e.g. another master holds db_path);
  // Unavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MasterServer>> Create(
      const MasterOptions& options);
  // Loads the index of options.db_path as Create would, from a read-only
  // view of the database (it may be open for writing elsewhere in this
  // process, as a standby's follower holds it), for a later Create to take
  // over (MasterOptions::take_preloaded) if the database has not changed
  // since. Errors: the store's (no database there yet: the store's
  // InvalidArgument or NotFound), or the load's; a load that would have to
  // write (objects it drops) fails with FailedPrecondition.
  static absl::StatusOr<PreloadedIndex> PreloadIndex(
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

  // Re-reads the identities file and the TLS files (SIGHUP) for
  // connections made from now on; on error the old ones stay (logged; see
  // ServerSecurity, common/daemon.h). OkStatus with neither.
  absl::Status ReloadIdentities() { return security_->ReloadIdentities(); }
  absl::Status ReloadCertificates() { return security_->ReloadCertificates(); }
  absl::Status Reload() { return security_->Reload(); }

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

  // The service behind the RPCs, for lookup_bench's in-process master (it
  // turns capabilities off and on between rows). Null after Shutdown.
  master::MasterService* ServiceForTest() { return service_.get(); }

 private:
  MasterServer() = default;
  // Create's steps after the service is open, in order. StartRpc builds the
  // gRPC server (health and reflection on the same port) and starts the
  // pollers; StartMetrics the /metrics exporter, if configured. Each shuts
  // the server down on failure.
  absl::Status StartRpc(const MasterOptions& options);
  absl::Status StartMetrics(const MasterOptions& options);
  // The serving banner and the security warnings.
  void LogServing(const MasterOptions& options) const;
  void ReaperLoop(absl::Duration interval);
  // Every master stat (the Prometheus series, unprefixed): the RPC layer's,
  // the service's counters and gauges, per node and per tenant.
  void VisitStats(StatsVisitor* v) const;

  // Constant after Create.
  int port_ = 0;
  std::string address_;
  std::string metrics_address_;
  // Identities and TLS credentials; outlives server_.
  std::unique_ptr<ServerSecurity> security_;
  std::unique_ptr<master::TenantRegistry> tenants_;
  std::unique_ptr<master::MasterService> service_;
  // Over service_'s store; null without replication. Shut down before
  // server_.
  std::unique_ptr<master::MasterReplication> replication_;
  std::unique_ptr<master::MasterRpcHandler> handler_;
  std::unique_ptr<master::HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  // One per rpc_threads; drained after server_ shuts down.
  std::vector<std::unique_ptr<master::CqPoller>> pollers_;
  Thread reaper_;
  // Serves /metrics; destroyed first by Shutdown (scrapes read service_).
  std::unique_ptr<MetricsExporter> metrics_;
  // What MasterOptions says of the daemon (build_info).
  DaemonOptions daemon_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache
