#include "tests/netns_daemons.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

std::string NetnsMasters::address_list() const {
  return absl::StrJoin(addresses, ",");
}

absl::StatusOr<NetnsMasters> StartMastersOn(VirtualNetwork& net,
                                            const NetnsMastersOptions& o) {
  const int n = static_cast<int>(o.master_hosts.size());
  if (n == 0 || (n > 1 && o.etcd_host < 0 && !o.etcd_beside_masters) ||
      (o.etcd_beside_masters && n != 3)) {
    return absl::InvalidArgumentError(
        "StartMastersOn: one master, or HA masters with etcd's host (or "
        "three beside etcd's members)");
  }
  NetnsMasters out;
  std::vector<std::string> flags = o.flags;
  if (n > 1) {
    EtcdClusterOptions eo{.members = 3};
    if (o.etcd_beside_masters) {
      for (int host : o.master_hosts) {
        eo.member_hosts.push_back({net.address(host), net.netns_path(host)});
      }
    } else {
      eo.host = net.address(o.etcd_host);
      eo.netns_path = net.netns_path(o.etcd_host);
    }
    auto etcd = EtcdCluster::Start(eo);
    if (!etcd.ok()) return etcd.status();
    out.etcd = std::move(etcd).value();
    flags.insert(flags.end(), {"--cluster=" + o.cluster, "--lease_ttl_s=1",
                               "--replication=sync"});
  }
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> own = flags;
    if (out.etcd != nullptr) {
      // A three-host install lists the host's own etcd member first (as
      // docs/deployment.md says): a master's etcd calls and watch go to the
      // member beside it, not to one that may be on a lost host.
      std::vector<std::string> endpoints = out.etcd->endpoints();
      if (o.etcd_beside_masters) {
        std::rotate(endpoints.begin(), endpoints.begin() + i, endpoints.end());
        own.push_back("--etcd_move_raft_leader");
      }
      own.push_back("--etcd=" + absl::StrJoin(endpoints, ","));
    }
    auto m = StartMasterOn(net, o.master_hosts[i],
                           absl::StrCat(o.dir, "/master", i), own);
    if (!m.ok()) return m.status();
    out.addresses.push_back(m->address);
    out.masters.push_back(std::move(m).value());
  }
  return out;
}

std::vector<std::string> NetnsLayout::HostNames() const {
  std::vector<std::string> names;
  for (int i = 0; i < masters; ++i) names.push_back(absl::StrCat("m", i));
  names.push_back("etcd");
  for (int i = 0; i < storage; ++i) names.push_back(absl::StrCat("s", i));
  for (int i = 0; i < engines; ++i) names.push_back(absl::StrCat("e", i));
  names.insert(names.end(), extra.begin(), extra.end());
  return names;
}

absl::StatusOr<NetnsCluster> StartClusterOn(
    VirtualNetwork& net, const NetnsLayout& layout, const std::string& name,
    const std::vector<std::string>& master_flags,
    const std::vector<std::string>& storage_flags) {
  NetnsCluster c;
  {
    // etcd's members are reached from here while the masters start.
    auto in = net.EnterHost(layout.master_host(0));
    if (!in.ok()) return in.status();
    NetnsMastersOptions mo;
    for (int i = 0; i < layout.masters; ++i) {
      mo.master_hosts.push_back(layout.master_host(i));
    }
    mo.etcd_host = layout.etcd_host();
    mo.dir = TempDir(name);
    mo.cluster = name;
    mo.flags = master_flags;
    auto m = StartMastersOn(net, mo);
    if (!m.ok()) return m.status();
    c.masters = std::move(m).value();
  }
  c.master = c.masters.address_list();
  for (int i = 0; i < layout.storage; ++i) {
    auto d = StartStorageOn(net, layout.storage_host(i), c.master,
                            absl::StrCat("s", i), storage_flags);
    if (!d.ok()) return d.status();
    c.nodes.push_back(std::move(d).value());
  }
  return c;
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
