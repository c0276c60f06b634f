// StorageNode: one HyMCache storage node. It owns a memory device (DRAM,
// hybrid DRAM+SSD or an LRU cache over SSD: storage_node/device/), the
// extent table that checks every access against the master's allocations,
// the data plane (storage_node/dataplane/: the TCP protocol of common/wire.h,
// plus same-host shared memory and RDMA for direct transfers) through which
// clients read and write object bytes, and a gRPC StorageControl service
// (stats). A background thread ("sn-heartbeat") registers the node with the
// master and keeps it alive with heartbeats; it re-registers when the master
// asks (or after the master was unreachable) and keeps retrying while the
// master is down.
//
// Every start is a new incarnation: DRAM contents start afresh, so the node
// announces a random 64-bit incarnation and the master drops whatever an
// earlier incarnation held (a hybrid device keeps the incarnation recorded
// in its capacity file, and with it its durable objects: node_key_path).
// Conversely, when a registration answer says the master no longer knows the
// node's objects (e.g. it lost its metadata), the node drops its extents.
// Every registration and heartbeat answer may carry a generation ceiling;
// writes claiming a higher generation are refused.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/daemon.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/security.h"
#include "common/thread.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/capacity_tier.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/device/hybrid_device.h"
#include "storage_node/device/lru_device.h"

namespace grpc {
class ClientContext;
class Server;
}  // namespace grpc

namespace hymcache::v1 {
class NodeAuth;
}  // namespace hymcache::v1

namespace hymcache {

class MetricsExporter;
class StatsVisitor;

namespace storage {
class RdmaPlane;
class ShmExport;
}  // namespace storage

// How the node uses RDMA (StorageNodeOptions::rdma).
enum class RdmaMode {
  kOff,   // TCP and shared memory only
  kAuto,  // an RDMA device if there is one, else TCP and shared memory only
  kOn,    // Create fails without an RDMA device
};
// "off", "auto", "on": the daemon's --rdma. Parse: InvalidArgument naming
// the choices.
const char* RdmaModeName(RdmaMode mode);
absl::StatusOr<RdmaMode> ParseRdmaMode(absl::string_view name);
// "auto", "io_uring", "threadpool": --io_engine.
const char* IoEngineName(storage::BlockIoOptions::Engine engine);
absl::StatusOr<storage::BlockIoOptions::Engine> ParseIoEngine(
    absl::string_view name);
// "auto", "inline", "async": --io_submit.
const char* IoSubmitName(storage::BlockIoOptions::Submit submit);
absl::StatusOr<storage::BlockIoOptions::Submit> ParseIoSubmit(
    absl::string_view name);

// The node's options are its parts' options (storage_node/device,
// storage_node/dataplane) plus its own: each default is stated once, in the
// part's struct (the daemon's flags take theirs from here). Fields a part's
// struct has but the node sets itself are marked "set by the node": values
// given there are ignored. The security and observability options are
// DaemonOptions (common/daemon.h), shared with the master:
//   auth_tokens_file: identities of the control service's callers (admins);
//     without it only a loopback listen_host unless `insecure`;
//   tls: the control service's server certificate (cert_file/key_file/
//     ca_file/require_client_cert) and the connection to the master
//     (ca_file verifies the master; cert_file/key_file are presented as the
//     client certificate; server_name overrides the master's expected name);
//   metrics_listen: series hymcache_storage_*; build_version/build_commit.
struct StorageNodeOptions : DaemonOptions {
  // The master's gRPC address, host:port; or several masters of which one
  // leads, comma-separated (docs/ha.md): the node follows the leader.
  // Required unless etcd_endpoints is given.
  std::string master_address;
  // Instead of (or besides) master_address: the etcd cluster the masters
  // campaign on, its client endpoints host:port, comma-separated. The node
  // reads who leads `cluster` (the key /hymcache/<cluster>/master/leader)
  // at start, watches it, and registers with the master it names after a
  // refusal or a master that does not answer (docs/ha.md). Default: "".
  std::string etcd_endpoints;
  // With etcd_endpoints: the cluster's name, as the masters' --cluster.
  // Default: "default".
  std::string cluster = "default";
  // Stable name of the node, reported to the master.
  // Default: "" = advertise_host:data.port
  std::string node_name;
  // Address the data plane and the control service bind to.
  // Default: "127.0.0.1"
  std::string listen_host = "127.0.0.1";
  // Control (gRPC) port; 0 picks a free port.
  // Default: 0
  int control_port = 0;
  // Host that clients and the master use to reach this node.
  // Default: "" = listen_host
  std::string advertise_host;
  // The machine the node runs on, as the master compares it with a
  // reader's (ClientOptions::host): of a block and its copy, one on the
  // reader's host serves it first. At most kMaxHostBytes.
  // Default: "" = DefaultHostName() ($HYM_HOST, else the hostname)
  std::string host;

  // The memory device behind the node, one of:
  //   DramDeviceOptions: DRAM on numa_node (contents start afresh every
  //     start). max_region_bytes 0 means the RDMA device's registration
  //     limit when RDMA is on (else one region). Default: 1 GiB.
  //   HybridDevice: software CXL hybrid memory, a capacity file (tier) behind
  //     a DRAM staging window and write buffer (device). Persistent: a
  //     restarted node on the same file serves its flushed objects again.
  //     Requires node_name.
  //   LruDevice: the same capacity file and DRAM managed as a transparent
  //     write-back LRU cache (a baseline for comparison; not persistent).
  // Set by the node: region ids, shareable (expose_shm or RDMA),
  // tier.node_name, tier.io.path and size_bytes, and the LRU device's
  // capacity_bytes and data_offset (from its tier).
  struct HybridDevice {
    // capacity_path = tier.path, capacity_bytes (a positive multiple of
    // 4096), metadata_dir (Default: "" = path + ".meta"),
    // allow_overcommit (start even if the sparse capacity file is larger
    // than the free space of its filesystem, with a warning; without it
    // Create fails with ResourceExhausted), and the I/O engine (tier.io).
    storage::CapacityTierOptions tier;
    // HybridDeviceOptions' defaults, except shutdown_flush_timeout: 15 s
    // (see ShutdownBound). At shutdown, objects still buffered then are
    // abandoned (lost like in a crash: the master drops their listings
    // when the node reconciles after its restart).
    storage::HybridDeviceOptions device = DefaultDevice();

    static storage::HybridDeviceOptions DefaultDevice() {
      storage::HybridDeviceOptions d;
      d.shutdown_flush_timeout = absl::Seconds(15);
      return d;
    }
  };
  struct LruDevice {
    storage::CapacityTierOptions tier;
    storage::LruCacheDeviceOptions device;
  };
  using Device =
      std::variant<storage::DramDeviceOptions, HybridDevice, LruDevice>;
  // Default: DramDeviceOptions()
  Device device;
  // Start even if the device's DRAM (a DRAM device's capacity_bytes; a
  // hybrid device's staging_bytes + write_buffer_bytes; the LRU device's
  // cache_bytes) exceeds the physical memory of its NUMA node (or of the
  // host for -1), with a warning; without it Create fails with
  // ResourceExhausted.
  // Default: false
  bool allow_memory_overcommit = false;
  // When the device's memory is shareable (shm or RDMA) and shared memory
  // cannot get huge pages (Debian's default
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled is "never"), set that
  // knob to "advise" if permitted (it then gives huge pages only to shared
  // memory that asks, as the device's does), else warn. With 4 KiB pages a
  // hybrid device's staging window lost a third of a virtio disk's
  // bandwidth and three quarters of a fast device's (docs/hybrid_device.md).
  // Default: true
  bool shared_huge_pages = true;

  // The TCP data plane: port (0 picks a free port, see
  // StorageNode::data_port()), connection and request limits, send buffer,
  // io_timeout, idle_timeout. Set by the node: host (listen_host), device,
  // extents, kv, rdma, capabilities.
  storage::DataServerOptions data;
  // Request-level prefetch: window_bytes (staged bytes a request may have
  // ahead of its reads), session_timeout (a request that stops reading for
  // this long loses its staged objects), session limits, clock. Set by the
  // node: staging_capacity (a hybrid device's staging window; the others
  // stage nothing), device, extents.
  storage::KvManagerOptions prefetch;

  // Let clients on this host map the device memory (the shared-memory data
  // plane): publishes the device's memfd-backed areas to the master.
  // Default: true
  bool expose_shm = true;
  // Who besides the node's own user and root may map it (SO_PEERCRED /
  // SO_PEERGROUPS on the shared-memory socket): these users, and members of
  // these groups. A client that maps it can read all of the node's exposed
  // memory. Default: none.
  std::vector<uid_t> shm_allowed_uids;
  std::vector<gid_t> shm_allowed_gids;
  // RDMA data plane. Default: kAuto
  RdmaMode rdma = RdmaMode::kAuto;
  // RDMA device name ("" = the first). Default: ""
  std::string rdma_device;
  // On an RDMA device without type-2 memory windows that confine their
  // peer to their range (Soft-RoCE's do not): false registers each object
  // a client acquires or writes, for that client's queue pair alone; true
  // publishes whole-area keys instead (faster, but every client with a queue
  // pair can read and overwrite all of the node's exposed memory: trusted
  // clients only). Devices with such windows always grant per object
  // (storage_node/dataplane/rdma_plane.h). Default: false
  bool rdma_trusted_clients = false;

  // Where the node keeps the key the master issues at its first
  // registration (mode 0600), so that a restarted process proves it: with
  // the same incarnation (a hybrid device's re-adopted objects) it keeps
  // its objects, and it need not wait for the old process to time out.
  // Without the key a restarted node is refused while the master still
  // takes the old process for alive, then registers as a new node (its
  // objects purged). Default: "" = the capacity file's path + ".node_key"
  // for a HybridDevice, kept in memory only otherwise.
  std::string node_key_path;
  // A data-plane capability is accepted this long past its expiry by this
  // host's clock (clock skew between master and node). Default: 30 s
  absl::Duration capability_skew = absl::Seconds(30);
  // Graceful shutdown waits this long for data-plane requests in progress.
  // Default: 10 s
  absl::Duration drain_timeout = absl::Seconds(10);
  // Deadline of each RPC to the master (register, heartbeat, deregister).
  // Default: 2 s
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Bearer token (role node) sent to the master; "" sends none.
  // Default: "".
  std::string master_token;

  // The device's alternatives; null when it is another one.
  const storage::DramDeviceOptions* dram() const {
    return std::get_if<storage::DramDeviceOptions>(&device);
  }
  storage::DramDeviceOptions* dram() {
    return std::get_if<storage::DramDeviceOptions>(&device);
  }
  const HybridDevice* hybrid() const {
    return std::get_if<HybridDevice>(&device);
  }
  HybridDevice* hybrid() { return std::get_if<HybridDevice>(&device); }
  const LruDevice* lru() const { return std::get_if<LruDevice>(&device); }
  LruDevice* lru() { return std::get_if<LruDevice>(&device); }

  // Shutdown() returns within about rpc_timeout (deregistration) +
  // drain_timeout (data-plane requests) + 1 s (control server) + a hybrid
  // device's shutdown_flush_timeout (its write buffer) + one synced RocksDB
  // write: 28 s with a hybrid device's defaults. Service managers must allow
  // more (the systemd unit's TimeoutStopSec and the Helm chart's
  // terminationGracePeriodSeconds are 45 s).
  absl::Duration ShutdownBound() const {
    return rpc_timeout + drain_timeout + absl::Seconds(1) +
           (hybrid() != nullptr ? hybrid()->device.shutdown_flush_timeout
                                : absl::ZeroDuration());
  }

  // InvalidArgument naming the first bad field; composes the parts'
  // Validate() (with the fields the node sets filled in where a part
  // checks them at Create).
  absl::Status Validate() const;
};

class StorageNode {
 public:
  // Allocates the memory, binds both ports and starts serving; registration
  // with the master proceeds in the background (Create succeeds while the
  // master is down).
  // Errors: InvalidArgument (bad options), Unavailable (a port cannot be
  // bound), ResourceExhausted (memory cannot be allocated, or exceeds the
  // machine's, see allow_memory_overcommit; or the capacity
  // file does not fit the free space of its filesystem, see
  // allow_capacity_overcommit), FailedPrecondition (a capacity file of
  // another node or capacity).
  static absl::StatusOr<std::unique_ptr<StorageNode>> Create(
      const StorageNodeOptions& options);
  // Shutdown().
  ~StorageNode();
  StorageNode(const StorageNode&) = delete;
  StorageNode& operator=(const StorageNode&) = delete;

  int data_port() const { return data_port_; }
  int control_port() const { return control_port_; }
  // host:port as advertised to the master.
  const std::string& data_address() const { return data_address_; }
  const std::string& control_address() const { return control_address_; }
  // host:port of the Prometheus endpoint; "" without metrics_listen.
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& name() const { return name_; }
  uint64_t incarnation() const { return incarnation_; }
  // The id the master assigned; 0 until the first registration.
  uint32_t node_id() const;
  // Whether the node is currently registered with a reachable master.
  bool registered() const;
  // Registered with the master, and the reconciliation the registration
  // asked for is done (so the master's listings match what the node holds),
  // and not shutting down. The control port's gRPC health status
  // (grpc.health.v1, service "" and "hymcache.v1.StorageControl") follows
  // it, updated by the heartbeat thread within a heartbeat interval:
  // NOT_SERVING while starting and while the master does not know the node
  // (say it is unreachable), SERVING when ready, NOT_SERVING from the start
  // of Shutdown on (before the node deregisters and drains). The health
  // status is also NOT_SERVING while an operator drains the node (draining()),
  // which does not change ready(): a drained node still starts and serves
  // reads.
  bool ready() const;
  // The master's last heartbeat answer said an operator drained this node
  // (hymctl drain): no new placements come here.
  bool draining() const;
  // Blocks until registered with the master and past the first heartbeat
  // after it (which proves the node's key: the master places nothing here
  // before), or `deadline`; false on timeout (or shutdown).
  bool WaitRegistered(absl::Time deadline);

  // Graceful: stops heartbeating and deregisters from the master first
  // (bounded by rpc_timeout) so that it places nothing new here, then stops
  // accepting data-plane connections and lets requests in progress finish
  // (bounded by drain_timeout), then stops every other thread and server.
  // Idempotent; concurrent callers wait for the first to finish.
  void Shutdown();
  // Blocks until Shutdown() has finished.
  void Wait();
  // Whether the control port's gRPC server answers a health check within
  // `timeout` (the systemd watchdog's test; common/health_probe.h).
  // REQUIRES: not concurrently with or after Shutdown().
  absl::Status CheckAlive(absl::Duration timeout);
  // Re-reads the identities file and the control service's TLS files
  // (SIGHUP) for new connections; on error the old ones stay (logged; see
  // ServerSecurity, common/daemon.h). The node's own channel to the master
  // keeps the client certificate it started with. OkStatus with neither.
  absl::Status ReloadIdentities() { return security_->ReloadIdentities(); }
  absl::Status ReloadCertificates() { return security_->ReloadCertificates(); }
  absl::Status Reload() { return security_->Reload(); }

  // While set, the data plane does not check capabilities (benchmarks
  // measuring what checking them costs). Never set outside tests and
  // benchmarks.
  void SetSkipCapabilityChecksForTest(bool skip);
  // The RDMA data plane, or nullptr (tests and benchmarks: its
  // SetAccessForTest).
  storage::RdmaPlane* rdma_plane_for_test() { return rdma_.get(); }

 private:
  // The channel and stub to the master (not client/master_client.h's
  // MasterClient: the node speaks the master's node-facing RPCs).
  struct MasterLink;
  class ControlService;

  explicit StorageNode(const StorageNodeOptions& options);
  // Create's steps, in order; each fills in its members from options_.
  // The incarnation, the registration nonce and the node key (if kept).
  absl::Status InitIdentity();
  // The RDMA NIC (if any), the memory device and the RDMA data plane.
  absl::Status OpenDevice();
  // The extent table, with the objects a persistent device recovered.
  absl::Status OpenExtentTable();
  // The KV manager, the shm export (if any) and the data server; sets the
  // data address and the node's name.
  absl::Status StartDataPlane(const std::string& advertise);
  // The identities file (if any) the control service checks, and its TLS.
  absl::Status LoadSecurity();
  // The gRPC control service (TLS, health, reflection).
  absl::Status StartControlService(const std::string& advertise);
  // /metrics, if metrics_listen is set.
  absl::Status StartMetrics();
  // The channel to the master.
  absl::Status ConnectMaster();
  // Every stat of the node: the data server's, the device's (under
  // `device_prefix`), the KV manager's (under "prefetch_") and the node's
  // own. GetStats uses no device prefix, the Prometheus series "device_".
  void VisitStats(StatsVisitor* v, const std::string& device_prefix) const;

  void HeartbeatLoop();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Register();
  // An answer from a master of epoch `epoch` (master_epoch): Unavailable
  // (not_leader) when it is below the highest seen, a deposed leader's
  // (docs/ha.md), and the node moves on to another master. 0 (a master
  // without an election) always passes.
  absl::Status CheckMasterEpoch(int64_t epoch);
  // Returns whether the master asked for a new registration.
  absl::StatusOr<bool> Heartbeat(uint32_t node_id);
  // What the last heartbeat answer said: the master serves read-only.
  bool MasterReadOnly() ABSL_LOCKS_EXCLUDED(mu_);
  void Deregister(uint32_t node_id);
  // Applies a ceiling from the master to the extent table; 0 is ignored.
  void ApplyGenerationCeiling(uint64_t ceiling);
  // A proof of the node key for the master call `purpose` (empty before
  // the node has a key).
  hymcache::v1::NodeAuth Auth(absl::string_view purpose,
                              uint32_t node_id) const;
  // Stores a key the master issued (in node_key_path_, if any).
  void SaveNodeKey(const std::string& key);
  // Sleeps for `d` or until shutdown starts; false on shutdown.
  bool SleepUnlessStopping(absl::Duration d);
  // Runs `call` with a fresh context that Shutdown can cancel.
  // `timeout` 0 means rpc_timeout.
  template <typename Fn>
  absl::Status CallMaster(Fn call,
                          absl::Duration timeout = absl::ZeroDuration());
  // The timeout of a registration or a heartbeat: with several masters
  // kAttemptAmongMasters (at most rpc_timeout), else 0 (rpc_timeout).
  absl::Duration AttemptTimeout() const;
  // Streams the extent table to the master (ReconcileNode) and frees the
  // extents it reports unlisted.
  absl::Status Reconcile(uint32_t node_id);
  // Reconciles if the master asked for it or the anti-entropy period has
  // passed (heartbeat thread).
  void MaybeReconcile();

  // Constant after Create.
  const StorageNodeOptions options_;
  // The LRU baseline device's capacity tier (it does not own it).
  std::unique_ptr<storage::CapacityTier> lru_tier_;
  std::unique_ptr<storage::MemoryDevice> device_;
  std::unique_ptr<storage::ExtentTable> extents_;
  std::unique_ptr<storage::KvManager> kv_;    // before data_server_
  std::unique_ptr<storage::RdmaPlane> rdma_;  // before data_server_
  std::unique_ptr<storage::ShmExport> shm_export_;
  // Set at every registration; checks every data-plane op.
  std::unique_ptr<CapabilityVerifier> capabilities_;  // before data_server_
  std::unique_ptr<storage::DataServer> data_server_;
  // Identities and TLS credentials; outlives control_server_.
  std::unique_ptr<ServerSecurity> security_;
  std::unique_ptr<ControlService> control_service_;
  std::unique_ptr<grpc::Server> control_server_;  // after control_service_
  std::unique_ptr<MasterLink> master_;
  int data_port_ = 0;
  int control_port_ = 0;
  std::string data_address_;
  std::string control_address_;
  std::string metrics_address_;
  std::string name_;
  std::string host_;  // StorageNodeOptions::host, resolved
  // Sent with every registration (RegisterNodeRequest.registration_nonce).
  std::string registration_nonce_;
  uint64_t incarnation_ = 0;
  // options_.node_key_path resolved ("": none).
  std::string node_key_path_;
  // Published to clients through the master (RegisterNodeRequest).
  std::map<std::string, std::string> transport_params_;
  Thread heartbeat_;
  // Serves /metrics; destroyed first by Shutdown (its scrapes read the
  // members above).
  std::unique_ptr<MetricsExporter> metrics_;

  mutable Mutex mu_;
  uint32_t node_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The highest master_epoch seen (CheckMasterEpoch).
  int64_t highest_master_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The key the master issued ("" before the first registration, unless
  // read from node_key_path_).
  std::string node_key_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  // A heartbeat succeeded since the last registration (WaitRegistered).
  bool heartbeat_since_registration_ ABSL_GUARDED_BY(mu_) = false;
  // As the master's last heartbeat answer said (draining()).
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // The master's last heartbeat answer said it serves read-only (it lost
  // etcd): the heartbeat loop looks for a leader among the other masters.
  bool master_read_only_ ABSL_GUARDED_BY(mu_) = false;
  // Register() timed out and left its identity change open: the master may
  // have registered this node and be signing capabilities with a key whose
  // answer was lost. Data-plane requests that fail their capability check
  // keep waiting for the next attempt (which gets the same key back: the
  // master re-answers an unconfirmed registration) instead of being
  // refused. Carried over one attempt at most. Heartbeat thread only.
  bool identity_change_carried_ = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  // The master asked for a reconciliation (registration or heartbeat), or
  // the last one returned only part of the unlisted extents.
  bool reconcile_due_ ABSL_GUARDED_BY(mu_) = false;
  // The registration asked for a reconciliation not yet done: not ready.
  bool reconcile_before_ready_ ABSL_GUARDED_BY(mu_) = false;
  // Anti-entropy period told by the master (0: none) and the next round.
  absl::Duration reconcile_interval_ ABSL_GUARDED_BY(mu_);
  absl::Time next_reconcile_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t reconciliations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reconcile_freed_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_reconcile_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_done_ ABSL_GUARDED_BY(mu_) = false;
  // The master RPC in flight, cancelled by Shutdown.
  grpc::ClientContext* rpc_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace hymcache
