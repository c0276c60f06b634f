// Test harnesses of whole clusters, the daemons started as real processes
// on loopback (tests/daemon.h), for the end-to-end tests under tests/ and
// the crash test (tools/crashtest):
//
// TestCluster: a master and storage nodes started as real daemons on
// loopback port 0 (tests/daemon.h), a client of the master, and the wait
// until the master lists the nodes alive, which every end-to-end test needs
// before its first store.
//
// RestartableCluster: daemons that can be SIGKILLed and started again with
// the same flags, ports and data (the crash test, consistency_repro).
//
// WaitForLiveNodes: the wait itself, for tests that start daemons their own
// way.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tests/child_process.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"

namespace hymcache::testing {

// Waits until the master `client` talks to lists exactly `alive` live
// storage nodes and, for each of `data_addresses`, a live node serving
// there (so a restarted node counts only once it is the new process).
// DeadlineExceeded after `timeout`, with what the master listed last.
absl::Status WaitForLiveNodes(
    Client& client, size_t alive,
    const std::vector<std::string>& data_addresses = {},
    absl::Duration timeout = absl::Seconds(30));

// The master's GetStats map (counters and gauges by name, as the metrics
// name them less their prefix), asked of `address` alone (no failover).
absl::StatusOr<std::map<std::string, double>> MasterStats(
    const std::string& address);

// A cluster for one test. Tests that add their own helpers derive from it;
// its members keep the names the tests use (dir, master, nodes, client).
// Steps return a Status so that the test REQUIREs each.
struct TestCluster {
  std::string dir;  // this cluster's files, under TEST_TMPDIR
  MasterProcess master;
  std::vector<StorageProcess> nodes;
  std::unique_ptr<Client> client;

  // A fresh directory TempDir(dir_name) for the cluster.
  explicit TestCluster(const std::string& dir_name);

  // Starts the master on 127.0.0.1:0 with its database in dir/master.
  absl::Status StartMaster(std::vector<std::string> flags = {});
  // Starts a storage node named `name` (appended to `nodes`); "$DIR" in a
  // flag is replaced by `dir`. Does not wait for it to register.
  absl::Status AddNode(const std::string& name,
                       std::vector<std::string> flags = {});
  // Creates `client` for the master (options.master_address is set here).
  absl::Status Connect(ClientOptions options = {});
  // WaitForLiveNodes for every node in `nodes`, at their data addresses.
  absl::Status WaitAlive(absl::Duration timeout = absl::Seconds(30));
};

// Path of `workspace_relative` (e.g. "master/hymcache-master") among the
// runfiles of the binary started as `argv0`, whether run by `bazel run`,
// `bazel test` or by hand; "" when it is not there. (RunfilePath serves
// tests, which always have TEST_SRCDIR.)
std::string BinaryRunfile(const char* argv0,
                          const std::string& workspace_relative);

// A storage node of a RestartableCluster.
struct StorageNodeSpec {
  enum class Device { kDram, kHybrid };
  // Stable node name (--name). Required, unique.
  std::string name;
  Device device = Device::kDram;
  // kDram: --dram_bytes. kHybrid: --capacity_bytes (a multiple of 4096) of a
  // capacity file in the cluster's work_dir. Default: 64 MiB.
  uint64_t bytes = 64 << 20;
  // kHybrid: --staging_bytes and --write_buffer_bytes. Default: 4 MiB, 2 MiB.
  uint64_t staging_bytes = 4 << 20;
  uint64_t write_buffer_bytes = 2 << 20;
};

struct RestartableClusterOptions {
  // The daemons' binaries. Required.
  std::string master_binary;
  std::string storage_binary;
  // Data of the daemons (master RocksDB, capacity files). Required; created.
  std::string work_dir;
  // One log file per daemon (stderr of all its runs): DIR/NAME.log.
  // Default: "" = work_dir.
  std::string log_dir;
  // Storage nodes. At least one.
  std::vector<StorageNodeSpec> nodes;
  // Masters. More than one: master HA through etcd (see RestartableCluster);
  // pass --lease_ttl_s and --replication in master_args. Default: 1.
  int masters = 1;
  // Extra flags for every master / storage-node run (e.g. a reconciliation
  // interval). Default: none.
  std::vector<std::string> master_args;
  std::vector<std::string> storage_args;
  // Restart storage nodes on the ports their first run picked (as a service
  // manager would); false: on new ports (port 0), which they report to the
  // master when they register. The master always keeps its port (clients
  // know it). Default: true.
  bool node_same_ports = true;
  // Bound on a daemon's start (its ready line). Default: 60 s.
  absl::Duration start_timeout = absl::Seconds(60);
  // A daemon that exits before it is ready (e.g. its port still held) is
  // started again up to this many times, `restart_retry_delay` apart.
  // Default: 10, 300 ms.
  int start_attempts = 10;
  absl::Duration restart_retry_delay = absl::Milliseconds(300);

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// A HyMCache master and storage nodes run as child processes of a test or
// of the crash test (tools/crashtest), on loopback, each of which can be
// SIGKILLed and started again with the same flags, ports and data (the
// master's RocksDB directory, a hybrid node's capacity file, the same node
// names), as an operator's service manager would restart them.
//
// Daemons 0..masters-1 are the masters ("master", "master1", ...); the
// storage nodes follow (from first_node()) in the order of
// RestartableClusterOptions::nodes. The first start binds port 0; restarts
// reuse the ports picked then, so clients and the master reach a restarted
// daemon at the address they know.
//
// With masters > 1 (master HA, docs/ha.md) the cluster first starts a
// 1-member etcd (tests/etcd_cluster.h, never killed) and runs every master
// with --etcd and --cluster=crashtest on its own --db_path; one leads, the
// others stand by. Nodes and clients get the list of masters.
//
// Thread safety: not thread-safe; one owner thread starts, kills and stops
// daemons (the children die with that thread: keep it alive until Stop).
// The accessors of constant fields (name, address) may be read from any
// thread once Create returned.
class RestartableCluster {
 public:
  // Starts the master, then every node. Errors: InvalidArgument (options),
  // or the first daemon that did not start.
  static absl::StatusOr<std::unique_ptr<RestartableCluster>> Create(
      const RestartableClusterOptions& options);
  ~RestartableCluster();  // SIGKILLs whatever still runs

  // Masters + storage nodes.
  size_t size() const { return daemons_.size(); }
  // Number of masters; daemon index of the first storage node.
  size_t masters() const { return masters_; }
  size_t first_node() const { return masters_; }
  bool is_master(size_t i) const { return i < masters_; }
  // Master `i`'s address (as its ready line named it).
  const std::string& address(size_t i) const { return daemons_[i]->address; }
  // The etcd endpoints (HA: masters() > 1); empty otherwise.
  std::vector<std::string> etcd_endpoints() const;
  // The etcd cluster name the masters campaign under (HA).
  static constexpr char kHaCluster[] = "crashtest";
  // "master" or the node's name.
  const std::string& name(size_t i) const { return daemons_[i]->name; }
  const std::string& log_path(size_t i) const { return daemons_[i]->log_path; }
  // Every master's address, comma-separated (what clients and nodes get).
  const std::string& master_address() const { return master_address_; }
  // Process id of daemon `i` (-1 when it is not running).
  pid_t pid(size_t i) const { return daemons_[i]->process.pid(); }
  // Index of the daemon named `name`, or -1.
  int IndexOf(const std::string& name) const;
  // Capacity in bytes the node offers (its spec's bytes); 0 for the master.
  uint64_t capacity_bytes(size_t i) const { return daemons_[i]->capacity; }
  // Whether the node keeps its objects across a restart (a hybrid node's
  // capacity file); a DRAM node starts empty, and the master purges what it
  // listed there when it registers again.
  bool keeps_objects(size_t i) const { return daemons_[i]->keeps_objects; }

  // SIGKILLs daemon `i` and reaps it. Errors: FailedPrecondition if it is
  // not running.
  absl::Status Kill(size_t i);
  // Starts daemon `i` again with its flags and ports (but see
  // node_same_ports), retrying a start that fails early (see
  // RestartableClusterOptions). Errors: FailedPrecondition if it is running;
  // the last start's error.
  absl::Status Restart(size_t i);
  // Whether daemon `i` runs; when it exited by itself, reaps it and
  // describes how in `*exit` (if not null).
  bool Alive(size_t i, std::string* exit = nullptr);
  // The wait status of daemon `i`'s last run once Alive() found it exited
  // (-1 before).
  int exit_status(size_t i) const { return daemons_[i]->process.exit_status(); }
  // Failed start attempts so far (each retried).
  int failed_starts() const { return failed_starts_; }

  // SIGTERMs daemon `i` and waits up to `timeout`. Returns its wait status.
  // Errors: FailedPrecondition (not running), DeadlineExceeded (then it is
  // SIGKILLed).
  absl::StatusOr<int> Terminate(size_t i, absl::Duration timeout);

 private:
  struct Daemon {
    std::string name;
    std::string binary;
    std::vector<std::string> args;  // ports fixed after the first start
    std::string log_path;
    uint64_t capacity = 0;
    bool keeps_objects = false;
    std::string address;  // masters: host:port
    ChildProcess process;
  };

  explicit RestartableCluster(const RestartableClusterOptions& options)
      : options_(options) {}
  // Starts `d` (retrying early exits) and, on its first start, fixes its
  // ports in its args from the ready line.
  absl::Status StartDaemon(Daemon& d, bool first);

  const RestartableClusterOptions options_;
  size_t masters_ = 1;
  std::unique_ptr<EtcdCluster> etcd_;  // HA only
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::string master_address_;
  int failed_starts_ = 0;
};

}  // namespace hymcache::testing
