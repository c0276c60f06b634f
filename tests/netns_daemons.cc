#include "tests/netns_daemons.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hymcache::testing {

absl::StatusOr<std::unique_ptr<VirtualNetwork>> NetworkOrSkip(
    const std::vector<std::string>& hosts) {
  auto made = VirtualNetwork::Create({.hosts = hosts});
  if (made.status().code() == absl::StatusCode::kFailedPrecondition) {
    std::printf("NETNS SKIPPED: %s\n", made.status().ToString().c_str());
    std::fflush(stdout);
    return std::unique_ptr<VirtualNetwork>();
  }
  if (!made.ok()) return made;
  const char* latency = std::getenv("HYM_NETNS_LINK_LATENCY_US");
  int64_t us = 0;
  if (latency != nullptr && *latency != '\0' &&
      (!absl::SimpleAtoi(latency, &us) || us < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HYM_NETNS_LINK_LATENCY_US=", latency,
                     ": not a number of microseconds"));
  }
  if (us > 0) {
    for (int h = 0; h < (*made)->size(); ++h) {
      absl::Status shaped =
          (*made)->ShapeLink(h, {.latency = absl::Microseconds(us)});
      if (!shaped.ok()) return shaped;
    }
    std::printf("NETNS: every link delayed %lld us each way\n",
                static_cast<long long>(us));
    std::fflush(stdout);
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
