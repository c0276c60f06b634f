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
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "storage_node/device/block_io.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/security.h"
#include "common/thread.h"

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
class DataServer;
class ExtentTable;
class KvManager;
class RdmaPlane;
class ShmExport;
class CapacityTier;
class MemoryDevice;
}  // namespace storage

struct StorageNodeOptions {
  // The master's gRPC address, host:port. Required.
  std::string master_address;
  // Stable name of the node, reported to the master.
  // Default: "" = advertise_host:data_port
  std::string node_name;
  // Address the data plane and the control service bind to.
  // Default: "127.0.0.1"
  std::string listen_host = "127.0.0.1";
  // Data-plane TCP port; 0 picks a free port (see StorageNode::data_port()).
  // Default: 0
  int data_port = 0;
  // Control (gRPC) port; 0 picks a free port.
  // Default: 0
  int control_port = 0;
  // Host that clients and the master use to reach this node.
  // Default: "" = listen_host
  std::string advertise_host;
  // Capacity of the DRAM device in bytes.
  // Default: 1 GiB
  uint64_t dram_bytes = uint64_t{1} << 30;
  // NUMA node for the DRAM device; -1: the local node. An invalid node falls
  // back to unplaced memory with a warning.
  // Default: -1
  int numa_node = -1;
  // Allocation alignment of the region (a power of two), told to the master.
  // Hybrid devices need at least 4096 (O_DIRECT).
  // Default: 4096
  uint32_t alignment = 4096;

  // The memory device behind the node.
  enum class Device {
    // dram_bytes of DRAM on numa_node (contents start afresh every start).
    kDram,
    // Software CXL hybrid memory: a capacity file (capacity_bytes, the
    // addressable space) behind a DRAM staging window (staging_bytes) and a
    // write buffer (write_buffer_bytes). Persistent: a restarted node on the
    // same file serves its flushed objects again. Requires node_name.
    kHybrid,
    // The same capacity file and DRAM budget managed as a transparent
    // write-back LRU cache (a baseline for comparison; not persistent).
    kHybridLru,
  };
  // Default: kDram
  Device device = Device::kDram;
  // Hybrid devices: capacity file or block device. Required for them.
  std::string capacity_path;
  // Hybrid devices: addressable bytes in the capacity file (multiple of
  // 4096). Required for them.
  uint64_t capacity_bytes = 0;
  // kHybrid: where the durable record of flushed objects lives.
  // Default: "" = capacity_path + ".meta"
  std::string capacity_metadata_dir;
  // Hybrid devices: start even if the capacity file (a sparse regular file)
  // is larger than the free space of its filesystem, with a warning; without
  // it Create fails with ResourceExhausted. Once such a filesystem is full,
  // flushes fail and stores are refused when the write buffer fills.
  // Default: false
  bool allow_capacity_overcommit = false;
  // Start even if the device's DRAM (dram_bytes for kDram; staging_bytes +
  // write_buffer_bytes for the hybrid devices) exceeds the physical memory
  // of numa_node (or of the host for -1), with a warning; without it Create
  // fails with ResourceExhausted.
  // Default: false
  bool allow_memory_overcommit = false;
  // Hybrid devices: DRAM staging window. Default: 256 MiB
  uint64_t staging_bytes = uint64_t{256} << 20;
  // Hybrid devices: DRAM write buffer (kHybridLru adds it to its cache).
  // Default: 64 MiB
  uint64_t write_buffer_bytes = uint64_t{64} << 20;
  // Hybrid devices: I/O engine ("auto", "io_uring", "threadpool") and queue
  // depth. Default: "auto", 64
  std::string io_engine = "auto";
  int io_queue_depth = 64;
  // Hybrid devices: how io_uring submits (BlockIoOptions::Submit: auto
  // detects devices that move the bytes inside submission, such as zram).
  // Default: kAuto
  storage::BlockIoOptions::Submit io_submit =
      storage::BlockIoOptions::Submit::kAuto;
  // Hybrid devices: open the capacity file with O_DIRECT. Turn off only on
  // filesystems without it (tmpfs). Default: true
  bool io_direct = true;
  // Hybrid devices: pace the capacity file's reads / writes to at most this
  // many bytes per second (emulates a slower device; tests use a slow
  // writer to keep objects in the write buffer). 0: unpaced. Default: 0
  uint64_t io_max_read_bytes_per_s = 0;
  uint64_t io_max_write_bytes_per_s = 0;
  // Hybrid devices: at start, verify every re-adopted object's CRC32C
  // against the capacity file (about 0.4 s per GiB stored; a torn or
  // corrupt object is dropped, never served). Default: true
  bool verify_on_open = true;
  // Hybrid devices: verify the CRC32C of every read from the capacity file
  // (a mismatch fails that object with DataLoss). Default: false
  bool verify_reads = false;
  // Request-level prefetch (KvManager): staged bytes a request may have
  // ahead of its reads. Default: 128 MiB
  uint64_t prefetch_window_bytes = uint64_t{128} << 20;
  // A request that stops reading for this long loses its staged objects.
  // Default: 5 s
  absl::Duration prefetch_session_timeout = absl::Seconds(5);
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
  // Where the node keeps the key the master issues at its first
  // registration (mode 0600), so that a restarted process proves it: with
  // the same incarnation (a hybrid device's re-adopted objects) it keeps
  // its objects, and it need not wait for the old process to time out.
  // Without the key a restarted node is refused while the master still
  // takes the old process for alive, then registers as a new node (its
  // objects purged). Default: "" = capacity_path + ".node_key" for kHybrid,
  // kept in memory only otherwise.
  std::string node_key_path;
  // A data-plane capability is accepted this long past its expiry by this
  // host's clock (clock skew between master and node). Default: 30 s
  absl::Duration capability_skew = absl::Seconds(30);
  // When the device's memory is shareable (shm or RDMA) and shared memory
  // cannot get huge pages (Debian's default
  // /sys/kernel/mm/transparent_hugepage/shmem_enabled is "never"), set that
  // knob to "advise" if permitted (it then gives huge pages only to shared
  // memory that asks, as the device's does), else warn. With 4 KiB pages a
  // hybrid device's staging window lost a third of a virtio disk's
  // bandwidth and three quarters of a fast device's (docs/hybrid_device.md).
  // Default: true
  bool shared_huge_pages = true;
  // RDMA data plane: "off"; "auto" (use an RDMA device if there is one, else
  // serve TCP and shared memory only); "on" (Create fails without one).
  // Default: "auto"
  std::string rdma = "auto";
  // RDMA device name ("" = the first). Default: ""
  std::string rdma_device;
  // DRAM device: most bytes per region (and so per RDMA registration); 0 =
  // the device's registration limit when RDMA is on, else one region.
  // Default: 0
  uint64_t max_region_bytes = 0;
  // Data-plane limits (see DataServerOptions): connections open at once, in
  // all and per peer address; worker threads; requests of one peer served
  // at once. An idle connection holds no thread.
  // Defaults: 8192, 1024, 256, 128
  int max_connections = 8192;
  int max_connections_per_peer = 1024;
  int data_worker_threads = 256;
  int max_requests_per_peer = 128;
  // Send buffer of each data-plane connection (see
  // DataServerOptions::send_buffer_bytes); 0: the kernel's autotuning.
  // Default: kDataSendBufferBytes (512 KiB)
  int data_send_buffer_bytes = kDataSendBufferBytes;
  // Bound on receiving and answering one data-plane request.
  // Default: 30 s
  absl::Duration io_timeout = absl::Seconds(30);
  // A data-plane connection idle (waiting for its next request) longer than
  // this is closed. absl::InfiniteDuration(): never.
  // Default: 60 s
  absl::Duration idle_timeout = absl::Seconds(60);
  // Graceful shutdown waits this long for data-plane requests in progress.
  // Default: 10 s
  absl::Duration drain_timeout = absl::Seconds(10);
  // Deadline of each RPC to the master (register, heartbeat, deregister).
  // Default: 2 s
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Hybrid devices: at shutdown, how long the write buffer may keep
  // flushing to the capacity file; objects still buffered then are
  // abandoned (lost like in a crash: the master drops their listings when
  // the node reconciles after its restart). Default: 15 s
  absl::Duration shutdown_flush_timeout = absl::Seconds(15);
  // Identities file (or directory) of the callers of the control service
  // (admins; common/security.h). "" turns authentication off, and then
  // only a loopback listen_host is allowed unless `insecure`. Default: "".
  std::string auth_tokens_file;
  // Listen on a non-loopback host without identities. Default: false.
  bool insecure = false;
  // TLS of the control service (cert_file/key_file/ca_file/
  // require_client_cert) and of the connection to the master (ca_file
  // verifies the master; cert_file/key_file are presented as the client
  // certificate; server_name overrides the master's expected name).
  // Default: plaintext.
  TlsOptions tls;
  // Bearer token (role node) sent to the master; "" sends none.
  // Default: "".
  std::string master_token;
  // HOST:PORT serving Prometheus metrics (GET /metrics, series
  // hymcache_storage_*; docs/operations.md); port 0 picks a free port (see
  // metrics_address()). "" serves none. A non-loopback host needs what
  // listen_host needs (identities or `insecure`). Default: "".
  std::string metrics_listen;
  // The build, exported as build_info{version, commit} = 1
  // (hymcache-storage passes its BuildInfo()). Default: "" (none).
  std::string build_version;
  std::string build_commit;
  // Shutdown() returns within about rpc_timeout (deregistration) +
  // drain_timeout (data-plane requests) + 1 s (control server) +
  // shutdown_flush_timeout (hybrid write buffer) + one synced RocksDB write:
  // 28 s with the defaults. Service managers must allow more (the systemd
  // unit's TimeoutStopSec and the Helm chart's terminationGracePeriodSeconds
  // are 45 s).
  absl::Duration ShutdownBound() const {
    return rpc_timeout + drain_timeout + absl::Seconds(1) +
           shutdown_flush_timeout;
  }

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
  // of Shutdown on (before the node deregisters and drains).
  bool ready() const;
  // Blocks until registered with the master or `deadline`; false on timeout
  // (or shutdown).
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
  // Re-reads the identities file (SIGHUP); on error the old identities
  // stay. OkStatus when authentication is off.
  absl::Status ReloadIdentities();

  // While set, the data plane does not check capabilities (benchmarks
  // measuring what checking them costs). Never set outside tests and
  // benchmarks.
  void SetSkipCapabilityChecksForTest(bool skip);

 private:
  struct MasterClient;
  class ControlService;

  explicit StorageNode(const StorageNodeOptions& options);
  // Every stat of the node: the data server's, the device's (under
  // `device_prefix`), the KV manager's (under "prefetch_") and the node's
  // own. GetStats uses no device prefix, the Prometheus series "device_".
  void VisitStats(StatsVisitor* v, const std::string& device_prefix) const;

  void HeartbeatLoop();
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Register();
  // Returns whether the master asked for a new registration.
  absl::StatusOr<bool> Heartbeat(uint32_t node_id);
  void Deregister(uint32_t node_id);
  // Applies a ceiling from the master to the extent table; 0 is ignored.
  void ApplyGenerationCeiling(uint64_t ceiling);
  // A proof of the node key for the master call `purpose` (empty before
  // the node has a key).
  hymcache::v1::NodeAuth Auth(std::string_view purpose, uint32_t node_id)
      const;
  // Stores a key the master issued (in node_key_path_, if any).
  void SaveNodeKey(const std::string& key);
  // Sleeps for `d` or until shutdown starts; false on shutdown.
  bool SleepUnlessStopping(absl::Duration d);
  // Runs `call` with a fresh context that Shutdown can cancel.
  // `timeout` 0 means rpc_timeout.
  template <typename Fn>
  absl::Status CallMaster(Fn call,
                          absl::Duration timeout = absl::ZeroDuration());
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
  std::unique_ptr<storage::KvManager> kv_;  // before data_server_
  std::unique_ptr<storage::RdmaPlane> rdma_;  // before data_server_
  std::unique_ptr<storage::ShmExport> shm_export_;
  // Set at every registration; checks every data-plane op.
  std::unique_ptr<CapabilityVerifier> capabilities_;  // before data_server_
  std::unique_ptr<storage::DataServer> data_server_;
  std::unique_ptr<Authenticator> auth_;  // null: authentication off
  std::unique_ptr<ControlService> control_service_;
  std::unique_ptr<grpc::Server> control_server_;  // after control_service_
  std::unique_ptr<MasterClient> master_;
  int data_port_ = 0;
  int control_port_ = 0;
  std::string data_address_;
  std::string control_address_;
  std::string metrics_address_;
  std::string name_;
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
  // The key the master issued ("" before the first registration, unless
  // read from node_key_path_).
  std::string node_key_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
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
