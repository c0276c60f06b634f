// hymcache-storage: the storage-node daemon. Flags become StorageNodeOptions;
// all logic lives in //storage_node:storage_node.
//
// Once serving it prints exactly one line to stdout:
//   hymcache-storage data=HOST:PORT control=HOST:PORT
// SIGTERM or SIGINT shuts it down gracefully (exit 0).
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <iostream>
#include <string>

#include "common/bytes.h"
#include "common/build_info.h"
#include "common/cli.h"
#include "common/systemd.h"
#include "common/net.h"
#include "common/security.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "storage_node/storage_node.h"

DEFINE_string(master, "127.0.0.1:50051", "Master gRPC address (host:port).");
DEFINE_string(name, "",
              "Stable node name reported to the master (default: "
              "advertise_host:data_port).");
DEFINE_string(listen_host, "127.0.0.1",
              "Address the data plane and control service bind to.");
DEFINE_int32(data_port, 50061, "Data-plane TCP port (0: pick a free port).");
DEFINE_int32(control_port, 50062, "Control gRPC port (0: pick a free port).");
DEFINE_string(advertise_host, "",
              "Host clients and the master use to reach this node (default: "
              "listen_host).");
DEFINE_string(dram_bytes, "1G",
              "DRAM device capacity: bytes, or with a K/M/G/T suffix "
              "(binary units), e.g. 256M.");
DEFINE_int32(numa_node, -1, "NUMA node for the device's DRAM (-1: local).");
DEFINE_string(device, "dram",
              "Memory device: dram, hybrid (DRAM staging window + write "
              "buffer over a capacity file), or hybrid-lru (the same budget "
              "as a transparent LRU cache; a baseline).");
DEFINE_string(capacity_path, "",
              "Hybrid devices: capacity file or block device.");
DEFINE_string(capacity_bytes, "",
              "Hybrid devices: addressable capacity, e.g. 64G.");
DEFINE_string(capacity_metadata_dir, "",
              "Hybrid device: durable object record (default: "
              "capacity_path + .meta).");
DEFINE_bool(allow_overcommit, false,
            "Start even if the device's DRAM (--dram_bytes; hybrid devices: "
            "--staging_bytes + --write_buffer_bytes) exceeds the memory of "
            "--numa_node (or of the host), or the (sparse) capacity file is "
            "larger than the free space of its filesystem (warn instead of "
            "refusing; stores are refused once the filesystem is full).");
DEFINE_string(staging_bytes, "256M", "Hybrid devices: DRAM staging window.");
DEFINE_string(write_buffer_bytes, "64M", "Hybrid devices: DRAM write buffer.");
DEFINE_string(io_engine, "auto", "Hybrid devices: auto, io_uring or threadpool.");
DEFINE_int32(io_queue_depth, 64, "Hybrid devices: I/Os in flight.");
DEFINE_string(io_submit, "auto",
              "Hybrid devices: how io_uring submits: inline (NVMe, virtio), "
              "async (through the kernel's workers, for devices that move the "
              "bytes inside submission: zram, brd, pmem) or auto (async for "
              "such bio-based devices).");
DEFINE_bool(io_direct, true,
            "Hybrid devices: O_DIRECT on the capacity file (off only for tmpfs).");
DEFINE_string(io_max_read_bytes_per_s, "0",
              "Hybrid devices: pace capacity-file reads to this many bytes/s "
              "(e.g. 2G; 0: unpaced)");
DEFINE_string(io_max_write_bytes_per_s, "0",
              "Hybrid devices: pace capacity-file writes to this many bytes/s "
              "(0: unpaced)");
DEFINE_bool(verify_on_open, true,
            "Hybrid devices: verify every stored object's CRC32C when the "
            "capacity file is re-adopted (~0.4 s per GiB; corrupt objects "
            "are dropped)");
DEFINE_bool(verify_reads, false,
            "Hybrid devices: verify the CRC32C of every capacity-file read");
DEFINE_string(prefetch_window_bytes, "128M",
              "Request-level prefetch: staged bytes a request may have ahead "
              "of its reads.");
DEFINE_int32(prefetch_session_timeout_ms, 5000,
             "A request that stops reading this long loses its staged "
             "objects (ms).");
DEFINE_bool(shm, true,
            "Let clients on this host map the device memory (shared-memory "
            "data plane).");
DEFINE_bool(shared_huge_pages, true,
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
DEFINE_string(node_key_file, "",
              "Where the node keeps the key the master issues at its first "
              "registration (mode 0600), so that a restart proves it (and "
              "keeps a hybrid device's objects). Default: capacity_path + "
              ".node_key for --device=hybrid, memory only otherwise.");
DEFINE_int32(capability_skew_ms, 30000,
             "Accept a data-plane capability this long past its expiry "
             "(clock skew between master and node).");
DEFINE_string(rdma, "auto",
              "RDMA data plane: off, auto (if a device exists) or on.");
DEFINE_string(rdma_device, "", "RDMA device name (default: the first).");
DEFINE_string(max_region_bytes, "0",
              "DRAM device: most bytes per region / RDMA registration (0: "
              "the RDMA device's limit, or one region).");
DEFINE_uint32(alignment, 4096, "Allocation alignment (power of two).");
DEFINE_int32(max_connections, 8192,
             "Most data-plane connections open at once (idle ones hold no "
             "thread).");
DEFINE_int32(max_connections_per_peer, 1024,
             "Most data-plane connections open at once from one peer "
             "address.");
DEFINE_int32(data_worker_threads, 256,
             "Most data-plane worker threads (requests served at once).");
DEFINE_int32(max_requests_per_peer, 128,
             "Most data-plane requests of one peer address served at once.");
DEFINE_int32(data_send_buffer_bytes, hymcache::kDataSendBufferBytes,
             "Send buffer of each data-plane connection in bytes (0: the "
             "kernel's autotuning, up to net.ipv4.tcp_wmem's maximum).");
DEFINE_int32(io_timeout_ms, 30000, "Bound on one data-plane request (ms).");
DEFINE_int32(idle_timeout_ms, 60000,
             "Close a data-plane connection idle this long (ms).");
DEFINE_int32(shutdown_flush_timeout_ms, 15000,
             "Hybrid devices: at shutdown, flush the write buffer for at most "
             "this long, then abandon what is left (ms)");
DEFINE_int32(drain_timeout_ms, 10000,
             "Graceful shutdown waits this long for requests in progress (ms).");
DEFINE_string(auth_tokens_file, "",
              "identities file or directory of the control service's callers "
              "(admins; docs/security.md); re-read on SIGHUP. Empty: no "
              "authentication, loopback only");
DEFINE_string(metrics_listen, "",
              "HOST:PORT serving Prometheus metrics on /metrics (port 0 "
              "picks a free port; empty: none). Non-loopback only with "
              "--auth_tokens_file or --insecure");
DEFINE_bool(insecure, false,
            "without --auth_tokens_file, listen on a non-loopback host anyway");
DEFINE_string(token_file, "",
              "file holding this node's bearer token (role node) for the "
              "master");
DEFINE_string(tls_cert, "",
              "PEM certificate chain: the control service's server "
              "certificate and the client certificate towards the master");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert");
DEFINE_string(tls_ca, "",
              "PEM CA certificates: verify the master and client "
              "certificates (enables TLS towards the master)");
DEFINE_bool(tls_require_client_cert, false,
            "control service: refuse TLS clients without a certificate "
            "signed by --tls_ca");
DEFINE_string(tls_server_name, "",
              "name the master's certificate must carry (default: the host "
              "of --master)");

int main(int argc, char** argv) {
  // Debian's Abseil is built with the mutex deadlock detector on: a global
  // lock-order graph updated on every absl::Mutex acquisition (gRPC's too).
  // It is a debugging aid, too costly for the data path.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  hymcache::ParseCommandLine(
      {.program = "hymcache-storage",
       .usage = "HyMCache storage node: serves KV blocks from DRAM/CXL "
                "memory or a hybrid device.\n"
                "  hymcache-storage --master=HOST:PORT [--dram_bytes=1G] "
                "[flags]",
       .groups =
           {{"Master and addresses",
             {"master", "name", "listen_host", "advertise_host", "data_port",
              "control_port"}},
            {"Memory device",
             {"device", "dram_bytes", "numa_node", "allow_overcommit",
              "alignment", "max_region_bytes", "shared_huge_pages"}},
            {"Hybrid device (--device=hybrid, hybrid-lru)",
             {"capacity_path", "capacity_bytes", "capacity_metadata_dir",
              "staging_bytes", "write_buffer_bytes", "io_engine",
              "io_queue_depth", "io_direct", "io_max_read_bytes_per_s",
              "io_max_write_bytes_per_s", "verify_on_open", "verify_reads",
              "shutdown_flush_timeout_ms"}},
            {"Prefetch",
             {"prefetch_window_bytes", "prefetch_session_timeout_ms"}},
            {"Data planes",
             {"shm", "shm_allowed_uids", "shm_allowed_gids", "rdma",
              "rdma_device", "max_connections", "max_connections_per_peer",
              "data_worker_threads", "max_requests_per_peer",
              "data_send_buffer_bytes", "io_timeout_ms", "idle_timeout_ms",
              "drain_timeout_ms"}},
            {"Security (docs/security.md)",
             {"auth_tokens_file", "insecure", "token_file", "node_key_file",
              "capability_skew_ms", "tls_cert", "tls_key", "tls_ca",
              "tls_require_client_cert", "tls_server_name"}},
            {"Logging (stderr by default: journald)",
             {"log_dir", "logtostderr", "v", "vmodule", "minloglevel"}}},
       .main_file = __FILE__,
       .daemon_logging = true},
      &argc, &argv);
  google::InitGoogleLogging(argv[0]);
  // Every data-plane connection holds a descriptor: allow as many as the
  // hard limit does (the soft limit is often 1024).
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      LOG(WARNING) << "cannot raise the descriptor limit: " << strerror(errno);
    }
  }

  hymcache::StorageNodeOptions options;
  options.master_address = FLAGS_master;
  options.node_name = FLAGS_name;
  options.listen_host = FLAGS_listen_host;
  options.data_port = FLAGS_data_port;
  options.control_port = FLAGS_control_port;
  options.advertise_host = FLAGS_advertise_host;
  if (!hymcache::ParseBytes(FLAGS_dram_bytes, &options.dram_bytes)) {
    std::cerr << "hymcache-storage: bad --dram_bytes '" << FLAGS_dram_bytes
              << "' (want e.g. 1073741824, 256M, 1G)\n";
    return 2;
  }
  options.numa_node = FLAGS_numa_node;
  options.allow_memory_overcommit = FLAGS_allow_overcommit;
  if (FLAGS_device == "dram") {
    options.device = hymcache::StorageNodeOptions::Device::kDram;
  } else if (FLAGS_device == "hybrid") {
    options.device = hymcache::StorageNodeOptions::Device::kHybrid;
  } else if (FLAGS_device == "hybrid-lru") {
    options.device = hymcache::StorageNodeOptions::Device::kHybridLru;
  } else {
    std::cerr << "hymcache-storage: bad --device '" << FLAGS_device
              << "' (want dram, hybrid or hybrid-lru)\n";
    return 2;
  }
  if (FLAGS_device != "dram") {
    options.capacity_path = FLAGS_capacity_path;
    options.capacity_metadata_dir = FLAGS_capacity_metadata_dir;
    options.allow_capacity_overcommit = FLAGS_allow_overcommit;
    if (!hymcache::ParseBytes(FLAGS_capacity_bytes, &options.capacity_bytes) ||
        !hymcache::ParseBytes(FLAGS_staging_bytes, &options.staging_bytes) ||
        !hymcache::ParseBytes(FLAGS_write_buffer_bytes, &options.write_buffer_bytes)) {
      std::cerr << "hymcache-storage: bad --capacity_bytes, --staging_bytes or "
                   "--write_buffer_bytes (want e.g. 64G, 256M)\n";
      return 2;
    }
    options.io_engine = FLAGS_io_engine;
    options.io_queue_depth = FLAGS_io_queue_depth;
    if (FLAGS_io_submit == "auto") {
      options.io_submit = hymcache::storage::BlockIoOptions::Submit::kAuto;
    } else if (FLAGS_io_submit == "inline") {
      options.io_submit = hymcache::storage::BlockIoOptions::Submit::kInline;
    } else if (FLAGS_io_submit == "async") {
      options.io_submit = hymcache::storage::BlockIoOptions::Submit::kAsync;
    } else {
      std::cerr << "hymcache-storage: bad --io_submit '" << FLAGS_io_submit
                << "' (want auto, inline or async)\n";
      return 2;
    }
    options.io_direct = FLAGS_io_direct;
    options.verify_on_open = FLAGS_verify_on_open;
    options.verify_reads = FLAGS_verify_reads;
    if (!hymcache::ParseBytes(FLAGS_io_max_read_bytes_per_s,
                              &options.io_max_read_bytes_per_s) ||
        !hymcache::ParseBytes(FLAGS_io_max_write_bytes_per_s,
                              &options.io_max_write_bytes_per_s)) {
      std::cerr << "hymcache-storage: bad --io_max_read_bytes_per_s or "
                   "--io_max_write_bytes_per_s (want e.g. 2G, 0)\n";
      return 2;
    }
  }
  if (!hymcache::ParseBytes(FLAGS_prefetch_window_bytes,
                  &options.prefetch_window_bytes) ||
      options.prefetch_window_bytes == 0) {
    std::cerr << "hymcache-storage: bad --prefetch_window_bytes (want e.g. "
                 "128M)\n";
    return 2;
  }
  options.prefetch_session_timeout =
      absl::Milliseconds(FLAGS_prefetch_session_timeout_ms);
  options.expose_shm = FLAGS_shm;
  options.node_key_path = FLAGS_node_key_file;
  for (auto [flag, out] :
       {std::pair{&FLAGS_shm_allowed_uids, &options.shm_allowed_uids},
        std::pair{&FLAGS_shm_allowed_gids, &options.shm_allowed_gids}}) {
    for (absl::string_view id :
         absl::StrSplit(*flag, ',', absl::SkipWhitespace())) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(id, &v)) {
        std::cerr << "hymcache-storage: bad id '" << id
                  << "' in --shm_allowed_uids/--shm_allowed_gids (numeric)\n";
        return 2;
      }
      out->push_back(v);
    }
  }
  options.capability_skew = absl::Milliseconds(FLAGS_capability_skew_ms);
  options.shared_huge_pages = FLAGS_shared_huge_pages;
  options.rdma = FLAGS_rdma;
  options.rdma_device = FLAGS_rdma_device;
  if (!hymcache::ParseBytes(FLAGS_max_region_bytes, &options.max_region_bytes)) {
    std::cerr << "hymcache-storage: bad --max_region_bytes\n";
    return 2;
  }
  options.alignment = FLAGS_alignment;
  options.max_connections = FLAGS_max_connections;
  options.max_connections_per_peer = FLAGS_max_connections_per_peer;
  options.data_worker_threads = FLAGS_data_worker_threads;
  options.max_requests_per_peer = FLAGS_max_requests_per_peer;
  options.data_send_buffer_bytes = FLAGS_data_send_buffer_bytes;
  options.io_timeout = absl::Milliseconds(FLAGS_io_timeout_ms);
  options.idle_timeout = absl::Milliseconds(FLAGS_idle_timeout_ms);
  options.drain_timeout = absl::Milliseconds(FLAGS_drain_timeout_ms);
  options.auth_tokens_file = FLAGS_auth_tokens_file;
  options.insecure = FLAGS_insecure;
  options.metrics_listen = FLAGS_metrics_listen;
  options.build_version = hymcache::BuildInfo().version;
  options.build_commit = hymcache::BuildInfo().git_commit;
  options.tls.cert_file = FLAGS_tls_cert;
  options.tls.key_file = FLAGS_tls_key;
  options.tls.ca_file = FLAGS_tls_ca;
  options.tls.require_client_cert = FLAGS_tls_require_client_cert;
  options.tls.server_name = FLAGS_tls_server_name;
  if (!FLAGS_token_file.empty()) {
    auto token = hymcache::ReadTokenFile(FLAGS_token_file);
    if (!token.ok()) {
      std::cerr << "hymcache-storage: --token_file: " << token.status().message()
                << "\n";
      return 2;
    }
    options.master_token = *token;
  }
  options.shutdown_flush_timeout =
      absl::Milliseconds(FLAGS_shutdown_flush_timeout_ms);
  absl::Status valid = options.Validate();
  if (!valid.ok()) {
    std::cerr << "hymcache-storage: " << valid.message() << "\n";
    return 2;
  }

  // Block the shutdown signals before any thread starts, so that every
  // thread inherits the mask and only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Under systemd (Type=notify): READY=1 once the ports serve (registration
  // with the master follows in the background; the control port's gRPC
  // health says when the node is ready), STOPPING=1 at the end, watchdog
  // pings while the control server answers. After the signal mask: its
  // thread inherits it.
  std::atomic<hymcache::StorageNode*> serving{nullptr};
  auto notifier = hymcache::SystemdNotifier::Create(
      {.alive = [&serving](absl::Duration timeout) {
        hymcache::StorageNode* n = serving.load();
        return n == nullptr ? absl::OkStatus() : n->CheckAlive(timeout);
      }});
  notifier->Status("opening the memory device");
  auto node = hymcache::StorageNode::Create(options);
  if (!node.ok()) {
    LOG(ERROR) << "cannot start the storage node: " << node.status();
    notifier->Status(node.status().ToString());
    return 1;
  }
  std::cout << "hymcache-storage data=" << (*node)->data_address()
            << " control=" << (*node)->control_address();
  if (!(*node)->metrics_address().empty()) {
    std::cout << " metrics=" << (*node)->metrics_address();
  }
  std::cout << std::endl;
  serving = node->get();
  const std::string serving_status =
      "serving data=" + (*node)->data_address() +
      " control=" + (*node)->control_address() + "; master " + FLAGS_master;
  notifier->Ready(serving_status);

  int sig = 0;
  while (true) {
    if (sigwait(&stop_signals, &sig) != 0) continue;
    if (sig != SIGHUP) break;
    absl::Status reloaded = (*node)->ReloadIdentities();  // logged too
    absl::Status certs = (*node)->ReloadCertificates();   // logged too
    if (reloaded.ok()) reloaded = certs;
    notifier->Status(
        reloaded.ok()
            ? serving_status + "; identities reloaded"
            : "reload failed (the old identities and certificates stay): " +
                  reloaded.ToString());
  }
  LOG(INFO) << "received signal " << sig << "; shutting down";
  notifier->Stopping("shutting down: deregistering, draining");
  serving = nullptr;
  notifier.reset();  // joins the watchdog thread before the node goes
  (*node)->Shutdown();
  node->reset();
  return 0;
}
