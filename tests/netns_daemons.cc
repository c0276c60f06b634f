#include "tests/netns_daemons.h"

#include <cstdio>
#include <utility>

namespace hymcache::testing {

absl::StatusOr<std::unique_ptr<VirtualNetwork>> NetworkOrSkip(
    const std::vector<std::string>& hosts) {
  auto made = VirtualNetwork::Create({.hosts = hosts});
  if (made.status().code() == absl::StatusCode::kFailedPrecondition) {
    std::printf("NETNS SKIPPED: %s\n", made.status().ToString().c_str());
    std::fflush(stdout);
    return std::unique_ptr<VirtualNetwork>();
  }
  return made;
}

absl::StatusOr<NetnsMaster> StartMasterOn(
    VirtualNetwork& net, int host, const std::string& db_path,
    const std::vector<std::string>& extra) {
  ChildOptions o;
  o.netns_path = net.netns_path(host);
  std::vector<std::string> args = MasterArgs(db_path, net.address(host) + ":0");
  args.push_back("--logtostderr");
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<Daemon> d =
      Daemon::Launch(RunfilePath("master/hymcache-master"), args, o);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::string> address = ParseMasterReadyLine(d->ready_line());
  if (!address.ok()) return address.status();
  return NetnsMaster{std::move(d).value(), *address};
}

absl::StatusOr<Daemon> StartStorageOn(VirtualNetwork& net, int host,
                                      const std::string& master,
                                      const std::string& name,
                                      const std::vector<std::string>& extra) {
  ChildOptions o;
  o.netns_path = net.netns_path(host);
  std::vector<std::string> args = StorageArgs(master, name);
  args.push_back("--listen_host=" + net.address(host));
  args.push_back("--logtostderr");
  args.insert(args.end(), extra.begin(), extra.end());
  return Daemon::Launch(RunfilePath("storage_node/hymcache-storage"), args, o);
}

}  // namespace hymcache::testing
