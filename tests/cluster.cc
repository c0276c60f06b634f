#include "tests/cluster.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/eventually.h"

namespace hymcache::testing {

absl::Status WaitForLiveNodes(Client& client, size_t alive,
                              const std::vector<std::string>& data_addresses,
                              absl::Duration timeout) {
  std::string seen = "no answer";
  const bool ok = Eventually(
      [&] {
        absl::StatusOr<ClusterStatus> st = client.GetClusterStatus();
        if (!st.ok()) {
          seen = st.status().ToString();
          return false;
        }
        size_t live = 0;
        seen.clear();
        for (const NodeStatus& n : st->nodes) {
          live += n.alive ? 1 : 0;
          absl::StrAppend(&seen, seen.empty() ? "" : ", ", n.name, "@",
                          n.data_address, n.alive ? " alive" : " dead");
        }
        if (live != alive) return false;
        for (const std::string& address : data_addresses) {
          bool found = false;
          for (const NodeStatus& n : st->nodes) {
            found = found || (n.alive && n.data_address == address);
          }
          if (!found) return false;
        }
        return true;
      },
      timeout);
  if (ok) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "the master never listed ", alive, " live nodes (last: ", seen, ")"));
}

TestCluster::TestCluster(const std::string& dir_name)
    : dir(TempDir(dir_name)) {}

absl::Status TestCluster::StartMaster(std::vector<std::string> flags) {
  absl::StatusOr<MasterProcess> m =
      MasterProcess::Start(dir + "/master", "127.0.0.1:0", std::move(flags));
  if (!m.ok()) return m.status();
  master = std::move(*m);
  return absl::OkStatus();
}

absl::Status TestCluster::AddNode(const std::string& name,
                                  std::vector<std::string> flags) {
  for (std::string& f : flags) {
    for (size_t at = f.find("$DIR"); at != std::string::npos;
         at = f.find("$DIR", at + dir.size())) {
      f.replace(at, 4, dir);
    }
  }
  absl::StatusOr<StorageProcess> s =
      StorageProcess::Start(master.address, name, std::move(flags));
  if (!s.ok()) return s.status();
  nodes.push_back(std::move(*s));
  return absl::OkStatus();
}

absl::Status TestCluster::Connect(ClientOptions options) {
  options.master_address = master.address;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
  if (!c.ok()) return c.status();
  client = std::move(*c);
  return absl::OkStatus();
}

absl::Status TestCluster::WaitAlive(absl::Duration timeout) {
  if (client == nullptr) {
    return absl::FailedPreconditionError("TestCluster: Connect first");
  }
  std::vector<std::string> addresses;
  for (const StorageProcess& n : nodes) addresses.push_back(n.data_address);
  return WaitForLiveNodes(*client, nodes.size(), addresses, timeout);
}

}  // namespace hymcache::testing
