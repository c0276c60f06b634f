// hymcache-storage: the storage-node daemon. Flags become StorageNodeOptions;
// all logic lives in //storage_node:storage_node.
//
// Once serving it prints exactly one line to stdout:
//   hymcache-storage data=HOST:PORT control=HOST:PORT
// SIGTERM or SIGINT shuts it down gracefully (exit 0); SIGHUP re-reads
// --auth_tokens_file and the TLS files.
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <deque>
#include <iterator>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/bytes.h"
#include "common/cli.h"
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "common/net.h"
#include "common/security.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "storage_node/storage_node.h"

namespace {

using hymcache::StorageNodeOptions;

// Every default below comes from the options structs (the node's, and its
// parts' inside it), except where the daemon's differs from the library's
// (the master's address and the two ports).
const StorageNodeOptions& Defaults() {
  static const StorageNodeOptions* const d = new StorageNodeOptions;
  return *d;
}
const hymcache::storage::DramDeviceOptions& DramDefaults() {
  return *Defaults().dram();
}
const StorageNodeOptions::HybridDevice& HybridDefaults() {
  static const auto* const d = new StorageNodeOptions::HybridDevice;
  return *d;
}
int32_t Ms(absl::Duration d) {
  return static_cast<int32_t>(absl::ToInt64Milliseconds(d));
}
// A byte count as a flag default ("1G").
const char* Bytes(uint64_t n) {
  static auto* const kept = new std::deque<std::string>;  // outlives flags
  return kept->emplace_back(hymcache::FormatBytes(n)).c_str();
}

// --device's values: the alternatives of StorageNodeOptions::Device, in
// order.
constexpr const char* kDeviceNames[] = {"dram", "hybrid", "hybrid-lru"};
static_assert(std::size(kDeviceNames) ==
              std::variant_size_v<StorageNodeOptions::Device>);

}  // namespace

DEFINE_string(master, "127.0.0.1:50051",
              "Master gRPC address (host:port), or several masters of which "
              "one leads, comma-separated (docs/ha.md)");
DEFINE_string(etcd, "",
              "etcd endpoints HOST:PORT[,...]: register with the master that "
              "leads --cluster there and follow it (instead of --master, "
              "unless --master is given too; docs/ha.md)");
DEFINE_string(cluster, "default",
              "with --etcd: the cluster's name, as the masters' --cluster");
DEFINE_string(name, Defaults().node_name.c_str(),
              "Stable node name reported to the master (default: "
              "advertise_host:data_port).");
DEFINE_string(host, Defaults().host.c_str(),
              "The machine this node runs on, for the master to answer a "
              "reader on the same machine from this node's copy first "
              "(default: $HYM_HOST, else the hostname).");
DEFINE_string(listen_host, Defaults().listen_host.c_str(),
              "Address the data plane and control service bind to.");
DEFINE_int32(data_port, 50061, "Data-plane TCP port (0: pick a free port).");
DEFINE_int32(control_port, 50062, "Control gRPC port (0: pick a free port).");
DEFINE_string(advertise_host, Defaults().advertise_host.c_str(),
              "Host clients and the master use to reach this node (default: "
              "listen_host).");
DEFINE_string(dram_bytes, Bytes(DramDefaults().capacity_bytes),
              "DRAM device capacity: bytes, or with a K/M/G/T suffix "
              "(binary units), e.g. 256M.");
DEFINE_int32(numa_node, DramDefaults().numa_node,
             "NUMA node for the device's DRAM (-1: local).");
DEFINE_string(device, kDeviceNames[Defaults().device.index()],
              "Memory device: dram, hybrid (DRAM staging window + write "
              "buffer over a capacity file), or hybrid-lru (the same budget "
              "as a transparent LRU cache; a baseline).");
DEFINE_string(capacity_path, HybridDefaults().tier.path.c_str(),
              "Hybrid devices: capacity file or block device.");
DEFINE_string(capacity_bytes, "",
              "Hybrid devices: addressable capacity, e.g. 64G.");
DEFINE_string(capacity_metadata_dir, HybridDefaults().tier.metadata_dir.c_str(),
              "Hybrid device: durable object record (default: "
              "capacity_path + .meta).");
DEFINE_bool(allow_overcommit, Defaults().allow_memory_overcommit,
            "Start even if the device's DRAM (--dram_bytes; hybrid devices: "
            "--staging_bytes + --write_buffer_bytes) exceeds the memory of "
            "--numa_node (or of the host), or the (sparse) capacity file is "
            "larger than the free space of its filesystem (warn instead of "
            "refusing; stores are refused once the filesystem is full).");
DEFINE_string(staging_bytes, Bytes(HybridDefaults().device.staging_bytes),
              "Hybrid devices: DRAM staging window.");
DEFINE_bool(populate_memory, HybridDefaults().device.populate_memory,
            "Hybrid devices: fault in the staging window and the write buffer "
            "at start-up (~0.1 s per GiB) instead of on the request path.");
DEFINE_string(write_buffer_bytes,
              Bytes(HybridDefaults().device.write_buffer_bytes),
              "Hybrid devices: DRAM write buffer.");
DEFINE_string(io_engine,
              hymcache::IoEngineName(HybridDefaults().tier.io.engine),
              "Hybrid devices: auto, io_uring or threadpool.");
DEFINE_int32(io_queue_depth, HybridDefaults().tier.io.queue_depth,
             "Hybrid devices: I/Os in flight.");
DEFINE_string(io_submit,
              hymcache::IoSubmitName(HybridDefaults().tier.io.submit),
              "Hybrid devices: how io_uring submits: inline (NVMe, virtio), "
              "async (through the kernel's workers, for devices that move the "
              "bytes inside submission: zram, brd, pmem) or auto (async for "
              "such bio-based devices).");
DEFINE_bool(
    io_direct, HybridDefaults().tier.io.direct,
    "Hybrid devices: O_DIRECT on the capacity file (off only for tmpfs).");
DEFINE_string(io_max_read_bytes_per_s,
              Bytes(HybridDefaults().tier.io.max_read_bytes_per_s),
              "Hybrid devices: pace capacity-file reads to this many bytes/s "
              "(e.g. 2G; 0: unpaced)");
DEFINE_string(io_max_write_bytes_per_s,
              Bytes(HybridDefaults().tier.io.max_write_bytes_per_s),
              "Hybrid devices: pace capacity-file writes to this many bytes/s "
              "(0: unpaced)");
DEFINE_bool(verify_on_open, HybridDefaults().device.verify_on_open,
            "Hybrid devices: verify every stored object's CRC32C when the "
            "capacity file is re-adopted (~0.4 s per GiB; corrupt objects "
            "are dropped)");
DEFINE_bool(verify_reads, HybridDefaults().device.verify_reads,
            "Hybrid devices: verify the CRC32C of every capacity-file read");
DEFINE_string(prefetch_window_bytes, Bytes(Defaults().prefetch.window_bytes),
              "Request-level prefetch: staged bytes a request may have ahead "
              "of its reads.");
DEFINE_int32(prefetch_session_timeout_ms,
             Ms(Defaults().prefetch.session_timeout),
             "A request that stops reading this long loses its staged "
             "objects (ms).");
DEFINE_double(prefetch_hint_share, Defaults().prefetch.hint_share,
              "Think-time hints: the share of the hybrid device's staging "
              "window they may hold staged (0: ignore hints).");
DEFINE_bool(prefetch_hints_when_idle, Defaults().prefetch.hints_when_idle,
            "Think-time hints: start refills from the capacity tier only "
            "while no request is loading from the node (false: also beside "
            "requests whose blocks are all issued).");
DEFINE_int32(prefetch_max_hint_hold_ms, Ms(Defaults().prefetch.max_hint_hold),
             "Think-time hints: the longest a hint holds its objects, from "
             "its arrival (ms).");
DEFINE_bool(shm, Defaults().expose_shm,
            "Let clients on this host map the device memory (shared-memory "
            "data plane).");
DEFINE_bool(shared_huge_pages, Defaults().shared_huge_pages,
            "Set /sys/kernel/mm/transparent_hugepage/shmem_enabled to "
            "'advise' when it is 'never' and the device memory is shared "
            "(shm or RDMA), so it gets huge pages (fast device I/O); false: "
            "leave it (4 KiB pages, with a warning).");
DEFINE_string(shm_allowed_uids, "",
              "Comma-separated users (numeric uids) besides the node's own "
              "and root that may map the device memory (shm data plane); "
              "such a client can read all of it.");
DEFINE_string(shm_allowed_gids, "",
              "Comma-separated groups (numeric gids): their members may map "
              "the device memory too.");
DEFINE_string(node_key_file, Defaults().node_key_path.c_str(),
              "Where the node keeps the key the master issues at its first "
              "registration (mode 0600), so that a restart proves it (and "
              "keeps a hybrid device's objects). Default: capacity_path + "
              ".node_key for --device=hybrid, memory only otherwise.");
DEFINE_int32(capability_skew_ms, Ms(Defaults().capability_skew),
             "Accept a data-plane capability this long past its expiry "
             "(clock skew between master and node).");
DEFINE_string(rdma, hymcache::RdmaModeName(Defaults().rdma),
              "RDMA data plane: off, auto (if a device exists) or on.");
DEFINE_string(rdma_device, Defaults().rdma_device.c_str(),
              "RDMA device name (default: the first).");
DEFINE_bool(rdma_trusted_clients, Defaults().rdma_trusted_clients,
            "On an RDMA device without memory windows that confine a client "
            "to one object (e.g. Soft-RoCE), publish whole-area keys instead "
            "of registering each object per connection: faster, but any "
            "client with a queue pair can read and overwrite all of this "
            "node's exposed memory. Trusted clients only.");
DEFINE_string(max_region_bytes, Bytes(DramDefaults().max_region_bytes),
              "DRAM device: most bytes per region / RDMA registration (0: "
              "the RDMA device's limit, or one region).");
DEFINE_uint32(alignment, DramDefaults().alignment,
              "Allocation alignment (power of two).");
DEFINE_int32(max_connections, Defaults().data.max_connections,
             "Most data-plane connections open at once (idle ones hold no "
             "thread).");
DEFINE_int32(max_connections_per_peer, Defaults().data.max_connections_per_peer,
             "Most data-plane connections open at once from one peer "
             "address.");
DEFINE_int32(data_worker_threads, Defaults().data.worker_threads,
             "Most data-plane worker threads (requests served at once).");
DEFINE_int32(max_requests_per_peer, Defaults().data.max_requests_per_peer,
             "Most data-plane requests of one peer address served at once.");
DEFINE_int32(data_send_buffer_bytes, Defaults().data.send_buffer_bytes,
             "Send buffer of each data-plane connection in bytes (0: the "
             "kernel's autotuning, up to net.ipv4.tcp_wmem's maximum).");
DEFINE_int32(io_timeout_ms, Ms(Defaults().data.io_timeout),
             "Bound on one data-plane request (ms).");
DEFINE_int32(idle_timeout_ms, Ms(Defaults().data.idle_timeout),
             "Close a data-plane connection idle this long (ms).");
DEFINE_int32(shutdown_flush_timeout_ms,
             Ms(HybridDefaults().device.shutdown_flush_timeout),
             "Hybrid devices: at shutdown, flush the write buffer for at most "
             "this long, then abandon what is left (ms)");
DEFINE_int32(
    drain_timeout_ms, Ms(Defaults().drain_timeout),
    "Graceful shutdown waits this long for requests in progress (ms).");
DEFINE_string(token_file, "",
              "file holding this node's bearer token (role node) for the "
              "master");
DEFINE_string(tls_server_name, Defaults().tls.server_name.c_str(),
              "name the master's certificate must carry (default: the host "
              "of --master)");

namespace {

constexpr char kBadTierBytes[] =
    "bad --capacity_bytes, --staging_bytes or --write_buffer_bytes (want e.g. "
    "64G, 256M)";

// A hybrid device's or the LRU baseline's capacity file from the flags;
// INVALID_ARGUMENT naming the bad flag.
absl::Status TierFromFlags(hymcache::storage::CapacityTierOptions* tier) {
  tier->path = FLAGS_capacity_path;
  tier->metadata_dir = FLAGS_capacity_metadata_dir;
  tier->allow_overcommit = FLAGS_allow_overcommit;
  if (!hymcache::ParseBytes(FLAGS_capacity_bytes, &tier->capacity_bytes)) {
    return absl::InvalidArgumentError(kBadTierBytes);
  }
  tier->io.queue_depth = FLAGS_io_queue_depth;
  tier->io.direct = FLAGS_io_direct;
  auto engine = hymcache::ParseIoEngine(FLAGS_io_engine);
  auto submit = hymcache::ParseIoSubmit(FLAGS_io_submit);
  for (const absl::Status& parsed : {engine.status(), submit.status()}) {
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --", parsed.message()));
    }
  }
  tier->io.engine = *engine;
  tier->io.submit = *submit;
  if (!hymcache::ParseBytes(FLAGS_io_max_read_bytes_per_s,
                            &tier->io.max_read_bytes_per_s) ||
      !hymcache::ParseBytes(FLAGS_io_max_write_bytes_per_s,
                            &tier->io.max_write_bytes_per_s)) {
    return absl::InvalidArgumentError(
        "bad --io_max_read_bytes_per_s or --io_max_write_bytes_per_s (want "
        "e.g. 2G, 0)");
  }
  return absl::OkStatus();
}

// --device and the flags of the device it names; INVALID_ARGUMENT naming
// the bad flag.
absl::Status DeviceFromFlags(StorageNodeOptions::Device* device) {
  const auto* name =
      std::find_if(std::begin(kDeviceNames), std::end(kDeviceNames),
                   [](const char* n) { return FLAGS_device == n; });
  if (name == std::end(kDeviceNames)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --device '", FLAGS_device, "' (want dram, hybrid or hybrid-lru)"));
  }
  if (name == &kDeviceNames[0]) {
    hymcache::storage::DramDeviceOptions dram;
    if (!hymcache::ParseBytes(FLAGS_dram_bytes, &dram.capacity_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --dram_bytes '", FLAGS_dram_bytes,
                       "' (want e.g. 1073741824, 256M, 1G)"));
    }
    if (!hymcache::ParseBytes(FLAGS_max_region_bytes, &dram.max_region_bytes)) {
      return absl::InvalidArgumentError("bad --max_region_bytes");
    }
    dram.numa_node = FLAGS_numa_node;
    dram.alignment = FLAGS_alignment;
    *device = dram;
    return absl::OkStatus();
  }
  if (FLAGS_alignment < 4096) {
    return absl::InvalidArgumentError(
        "a hybrid device needs --alignment >= 4096");
  }
  uint64_t staging = 0;
  uint64_t write_buffer = 0;
  hymcache::storage::CapacityTierOptions tier;
  if (!hymcache::ParseBytes(FLAGS_staging_bytes, &staging) ||
      !hymcache::ParseBytes(FLAGS_write_buffer_bytes, &write_buffer)) {
    return absl::InvalidArgumentError(kBadTierBytes);
  }
  if (absl::Status s = TierFromFlags(&tier); !s.ok()) return s;
  if (name == &kDeviceNames[1]) {
    StorageNodeOptions::HybridDevice hybrid;
    hybrid.tier = tier;
    hybrid.device.staging_bytes = staging;
    hybrid.device.write_buffer_bytes = write_buffer;
    hybrid.device.numa_node = FLAGS_numa_node;
    hybrid.device.populate_memory = FLAGS_populate_memory;
    hybrid.device.io_queue_depth = FLAGS_io_queue_depth;
    hybrid.device.verify_on_open = FLAGS_verify_on_open;
    hybrid.device.verify_reads = FLAGS_verify_reads;
    hybrid.device.shutdown_flush_timeout =
        absl::Milliseconds(FLAGS_shutdown_flush_timeout_ms);
    *device = hybrid;
    return absl::OkStatus();
  }
  StorageNodeOptions::LruDevice lru;
  lru.tier = tier;
  // The hybrid device's DRAM budget, as one cache.
  lru.device.cache_bytes = staging + write_buffer;
  lru.device.max_concurrent_fills = FLAGS_io_queue_depth;
  lru.device.alignment = FLAGS_alignment;
  *device = lru;
  return absl::OkStatus();
}

// Every data-plane connection holds a descriptor: allow as many as the
// hard limit does (the soft limit is often 1024).
void RaiseDescriptorLimit() {
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      LOG(WARNING) << "cannot raise the descriptor limit: " << strerror(errno);
    }
  }
}

// Translates the flags into `options` and validates them; INVALID_ARGUMENT
// when a flag or the options are bad.
absl::Status OptionsFromFlags(hymcache::StorageNodeOptions* options) {
  options->master_address = FLAGS_master;
  options->etcd_endpoints = FLAGS_etcd;
  options->cluster = FLAGS_cluster;
  if (!FLAGS_etcd.empty() &&
      gflags::GetCommandLineFlagInfoOrDie("master").is_default) {
    // etcd names the masters: no default address beside it.
    options->master_address.clear();
  }
  options->node_name = FLAGS_name;
  options->host = FLAGS_host;
  options->listen_host = FLAGS_listen_host;
  options->control_port = FLAGS_control_port;
  options->advertise_host = FLAGS_advertise_host;
  if (absl::Status s = DeviceFromFlags(&options->device); !s.ok()) return s;
  options->allow_memory_overcommit = FLAGS_allow_overcommit;
  options->shared_huge_pages = FLAGS_shared_huge_pages;

  hymcache::storage::DataServerOptions& data = options->data;
  data.port = FLAGS_data_port;
  data.max_connections = FLAGS_max_connections;
  data.max_connections_per_peer = FLAGS_max_connections_per_peer;
  data.worker_threads = FLAGS_data_worker_threads;
  data.max_requests_per_peer = FLAGS_max_requests_per_peer;
  data.send_buffer_bytes = FLAGS_data_send_buffer_bytes;
  data.io_timeout = absl::Milliseconds(FLAGS_io_timeout_ms);
  data.idle_timeout = absl::Milliseconds(FLAGS_idle_timeout_ms);

  if (!hymcache::ParseBytes(FLAGS_prefetch_window_bytes,
                            &options->prefetch.window_bytes) ||
      options->prefetch.window_bytes == 0) {
    return absl::InvalidArgumentError(
        "bad --prefetch_window_bytes (want e.g. 128M)");
  }
  options->prefetch.session_timeout =
      absl::Milliseconds(FLAGS_prefetch_session_timeout_ms);
  options->prefetch.hint_share = FLAGS_prefetch_hint_share;
  options->prefetch.hints_when_idle = FLAGS_prefetch_hints_when_idle;
  options->prefetch.max_hint_hold =
      absl::Milliseconds(FLAGS_prefetch_max_hint_hold_ms);

  options->expose_shm = FLAGS_shm;
  for (auto [flag, out] :
       {std::pair{&FLAGS_shm_allowed_uids, &options->shm_allowed_uids},
        std::pair{&FLAGS_shm_allowed_gids, &options->shm_allowed_gids}}) {
    for (absl::string_view id :
         absl::StrSplit(*flag, ',', absl::SkipWhitespace())) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(id, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bad id '", id,
            "' in --shm_allowed_uids/--shm_allowed_gids (numeric)"));
      }
      out->push_back(v);
    }
  }
  absl::StatusOr<hymcache::RdmaMode> rdma = hymcache::ParseRdmaMode(FLAGS_rdma);
  if (!rdma.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --", rdma.status().message()));
  }
  options->rdma = *rdma;
  options->rdma_device = FLAGS_rdma_device;
  options->rdma_trusted_clients = FLAGS_rdma_trusted_clients;
  options->node_key_path = FLAGS_node_key_file;
  options->capability_skew = absl::Milliseconds(FLAGS_capability_skew_ms);
  options->drain_timeout = absl::Milliseconds(FLAGS_drain_timeout_ms);
  hymcache::DaemonOptionsFromFlags(options);  // security, metrics, build
  options->tls.server_name = FLAGS_tls_server_name;
  if (!FLAGS_token_file.empty()) {
    auto token = hymcache::ReadTokenFile(FLAGS_token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file: ", token.status().message()));
    }
    options->master_token = *token;
  }
  return options->Validate();
}

}  // namespace

int main(int argc, char** argv) {
  hymcache::StartDaemonMain(
      {.program = "hymcache-storage",
       .usage = "HyMCache storage node: serves KV blocks from DRAM/CXL "
                "memory or a hybrid device.\n"
                "  hymcache-storage --master=HOST:PORT [--dram_bytes=1G] "
                "[flags]",
       .groups = {{"Master and addresses",
                   {"master", "name", "host", "listen_host", "advertise_host",
                    "data_port", "control_port", "metrics_listen"}},
                  {"Memory device",
                   {"device", "dram_bytes", "numa_node", "allow_overcommit",
                    "alignment", "max_region_bytes", "shared_huge_pages"}},
                  {"Hybrid device (--device=hybrid, hybrid-lru)",
                   {"capacity_path", "capacity_bytes", "capacity_metadata_dir",
                    "staging_bytes", "write_buffer_bytes", "populate_memory",
                    "io_engine", "io_queue_depth", "io_direct",
                    "io_max_read_bytes_per_s", "io_max_write_bytes_per_s",
                    "verify_on_open", "verify_reads",
                    "shutdown_flush_timeout_ms"}},
                  {"Prefetch",
                   {"prefetch_window_bytes", "prefetch_session_timeout_ms",
                    "prefetch_hint_share", "prefetch_hints_when_idle",
                    "prefetch_max_hint_hold_ms"}},
                  {"Data planes",
                   {"shm", "shm_allowed_uids", "shm_allowed_gids", "rdma",
                    "rdma_device", "max_connections",
                    "max_connections_per_peer", "data_worker_threads",
                    "max_requests_per_peer", "data_send_buffer_bytes",
                    "io_timeout_ms", "idle_timeout_ms", "drain_timeout_ms"}}},
       .main_file = __FILE__},
      {"token_file", "node_key_file", "capability_skew_ms", "tls_server_name"},
      &argc, &argv);
  RaiseDescriptorLimit();
  // gRPC's default unless chosen: the node's gRPC is its control service
  // and its master channel, off the data path.
  if (absl::Status s = hymcache::ApplyGrpcPollStrategyFlag(""); !s.ok()) {
    return hymcache::ExitForBadFlags("hymcache-storage", s);
  }

  hymcache::StorageNodeOptions options;
  if (absl::Status s = OptionsFromFlags(&options); !s.ok()) {
    return hymcache::ExitForBadFlags("hymcache-storage", s);
  }

  // Stop and reload signals are taken by WaitForStop below, and blocked in
  // every thread (threads inherit the mask): no work in a signal handler.
  hymcache::DaemonSignals signals;

  // Under systemd (Type=notify): READY=1 once the ports serve (registration
  // with the master follows in the background; the control port's gRPC
  // health says when the node is ready), STOPPING=1 at the end, watchdog
  // pings while the control server answers.
  return hymcache::ServeUntilStopped(
      signals, "opening the memory device",
      "shutting down: deregistering, draining",
      [&]() -> absl::StatusOr<hymcache::ServingDaemon> {
        auto node = hymcache::StorageNode::Create(options);
        if (!node.ok()) return node.status();
        std::cout << "hymcache-storage data=" << (*node)->data_address()
                  << " control=" << (*node)->control_address();
        if (!(*node)->metrics_address().empty()) {
          std::cout << " metrics=" << (*node)->metrics_address();
        }
        std::cout << std::endl;
        const std::string status = "serving data=" + (*node)->data_address() +
                                   " control=" + (*node)->control_address() +
                                   "; master " + FLAGS_master;
        return hymcache::ServingDaemonOf(std::move(*node), status);
      });
}
