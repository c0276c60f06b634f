// hymcache-master: the metadata and placement daemon.
//
//   hymcache-master --listen=0.0.0.0:50051 --db_path=/var/lib/hymcache/master
//
// Prints "hymcache-master listening on HOST:PORT" on stdout once serving
// (with --listen=...:0 the port is the one picked); stops cleanly on SIGTERM
// or SIGINT and exits 0.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/time/time.h"
#include "master/master_server.h"

DEFINE_string(listen, "127.0.0.1:50051",
              "gRPC host:port to serve on (port 0 picks a free port)");
DEFINE_string(db_path, "./hymcache-data/master",
              "RocksDB directory of the master's metadata (created if needed)");
DEFINE_int64(node_timeout_ms, 10000,
             "a storage node silent this long is dead");
DEFINE_int64(put_timeout_ms, 30000,
             "pending puts not committed within this are freed");
DEFINE_int64(heartbeat_interval_ms, 1000,
             "heartbeat period told to storage nodes");
DEFINE_int64(read_lease_ms, 5000,
             "an object returned to a reader is not evicted for this long "
             "(0: reads do not protect objects from eviction)");
DEFINE_int64(capability_lifetime_ms, 300000,
             "lifetime of the read capability handed out with each lookup "
             "hit (storage nodes accept it for their --capability_skew_ms "
             "longer); must exceed a client's call deadline plus the read "
             "lease");
DEFINE_uint32(max_evictions_per_put, 4096,
              "most objects one put may evict from a full node (0: never "
              "evict; a full node refuses puts)");
DEFINE_int64(reconcile_interval_ms, 60000,
             "period of each storage node's background reconciliation of its "
             "extents with the master's listings (0: only at registration)");
DEFINE_bool(sync_writes, false,
            "fsync the metadata WAL on every write (survives power loss)");

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;  // default for a daemon; --logtostderr=0 overrides
  gflags::SetUsageMessage("HyMCache master: metadata, placement, liveness");
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals in every thread (threads inherit the mask), then
  // wait for them synchronously below: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  hymcache::MasterOptions options;
  options.listen_address = FLAGS_listen;
  options.db_path = FLAGS_db_path;
  options.node_timeout = absl::Milliseconds(FLAGS_node_timeout_ms);
  options.put_timeout = absl::Milliseconds(FLAGS_put_timeout_ms);
  options.heartbeat_interval = absl::Milliseconds(FLAGS_heartbeat_interval_ms);
  options.read_lease = absl::Milliseconds(FLAGS_read_lease_ms);
  options.capability_lifetime =
      absl::Milliseconds(FLAGS_capability_lifetime_ms);
  options.max_evictions_per_put = FLAGS_max_evictions_per_put;
  options.sync_writes = FLAGS_sync_writes;
  options.reconcile_interval = absl::Milliseconds(FLAGS_reconcile_interval_ms);
  absl::Status valid = options.Validate();
  if (!valid.ok()) {
    LOG(ERROR) << valid;
    return 2;
  }

  std::error_code ec;
  std::filesystem::create_directories(FLAGS_db_path, ec);
  if (ec) {
    LOG(ERROR) << "cannot create " << FLAGS_db_path << ": " << ec.message();
    return 1;
  }
  auto server = hymcache::MasterServer::Create(options);
  if (!server.ok()) {
    LOG(ERROR) << "cannot start: " << server.status();
    return 1;
  }
  std::printf("hymcache-master listening on %s\n",
              (*server)->address().c_str());
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  LOG(INFO) << "signal " << sig << ": shutting down";
  (*server)->Shutdown();
  return 0;
}
