// Test harness: a master and storage nodes started as real daemons on
// loopback port 0 (tests/daemon.h), a client of the master, and the wait
// until the master lists the nodes alive, which every end-to-end test needs
// before its first store.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tests/daemon.h"

namespace hymcache::testing {

// Waits until the master `client` talks to lists exactly `alive` live
// storage nodes and, for each of `data_addresses`, a live node serving
// there (so a restarted node counts only once it is the new process).
// DeadlineExceeded after `timeout`, with what the master listed last.
absl::Status WaitForLiveNodes(Client& client, size_t alive,
                              const std::vector<std::string>& data_addresses = {},
                              absl::Duration timeout = absl::Seconds(30));

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

}  // namespace hymcache::testing
