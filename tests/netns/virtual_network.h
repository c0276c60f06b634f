// Test harness: several "hosts" on one machine, each a Linux network
// namespace with its own address, joined through a bridge, so that a test
// runs etcd, masters, storage nodes and clients on different hosts and cuts
// and restores the links between them (tests/netns/README.md).
//
//   namespace <prefix>-sw:  br0 (a bridge), h0 h1 ... (the switch ends)
//   namespace <prefix>-I:   lo, eth0 = 10.77.0.(I+1)/24 (the other end of hI)
//
// <prefix> is "hymnet-PID-RAND-N", and the run holds an flock on
// /run/hymnet/<prefix>.lock while it lives, so Create first removes what
// runs of dead processes left (their namespaces, the processes still in
// them), even runs from other PID namespaces; the subnet is private to the
// run's own bridge, so runs side by side do not collide. Deleting the
// namespaces removes every link, bridge and qdisc in them: the destructor
// kills whatever still runs in the hosts and deletes them, and a test that
// fails half-way leaves nothing once its VirtualNetwork is destroyed.
//
// Processes join a host through ChildOptions::netns_path =
// netns_path(host) (tests/child_process.h: setns before exec); the test's
// own thread can move onto a host with EnterHost (its client then talks
// from there).
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ip and tc
// (Debian's iproute2). Without them Create says FailedPrecondition, which
// the tests report as one "NETNS SKIPPED: why" line.
//
// Thread safety: not thread-safe; one test thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hymcache::testing {

struct VirtualNetworkOptions {
  // The hosts' names (for messages; hosts are addressed by index), at
  // least one. Required.
  std::vector<std::string> hosts;
  // iproute2's programs. Default: Debian's paths.
  std::string ip_binary = "/usr/sbin/ip";
  std::string tc_binary = "/usr/sbin/tc";
  // Bound on each ip / tc command. Default: 10 s.
  absl::Duration command_timeout = absl::Seconds(10);

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// Shaping of one host's link to the bridge, applied in both directions
// (egress of the host's eth0 and of the switch's end): a packet between
// hosts X and Y is delayed by X's latency plus Y's.
struct LinkShape {
  // Added one-way delay (tc netem). Default: 0 (none).
  absl::Duration latency = absl::ZeroDuration();
  // Rate limit in bits per second (tc tbf; netem's rate with a latency).
  // Default: 0 (unlimited).
  uint64_t rate_bits_per_s = 0;
};

// The calling thread inside a host's namespace until destroyed (then back
// where it was). Sockets keep the namespace they were created in; threads
// inherit their creator's, so enter before starting a gRPC client.
class ScopedNetns {
 public:
  ~ScopedNetns();
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

 private:
  friend class VirtualNetwork;
  explicit ScopedNetns(int original_fd) : original_fd_(original_fd) {}
  int original_fd_;
};

class VirtualNetwork {
 public:
  // Removes dead runs' namespaces, then builds the switch and the hosts.
  // Errors: InvalidArgument (options); FailedPrecondition (network
  // namespaces unavailable here: not root, no CAP_NET_ADMIN, no iproute2,
  // or `ip netns add` refused, e.g. in a sandbox); Internal (a later ip
  // command failed; what was built is removed).
  static absl::StatusOr<std::unique_ptr<VirtualNetwork>> Create(
      const VirtualNetworkOptions& options);
  // Kills every process left in the hosts and deletes every namespace.
  ~VirtualNetwork();

  int size() const { return static_cast<int>(options_.hosts.size()); }
  // Host i's address, "10.77.0.(i+1)".
  std::string address(int host) const;
  // Host i's namespace file, for ChildOptions::netns_path.
  std::string netns_path(int host) const;
  // Host i's namespace name (`ip netns` / `ip -n`).
  std::string netns_name(int host) const;
  const std::string& name(int host) const { return options_.hosts[host]; }

  // Shapes host i's link (LinkShape); a zero shape removes the shaping.
  // Errors: FailedPrecondition (this kernel lacks the qdisc: tc's message),
  // Internal.
  absl::Status ShapeLink(int host, const LinkShape& shape);
  // Takes host i's link down (the host reaches no one) / up again.
  absl::Status CutLink(int host);
  absl::Status RestoreLink(int host);
  // Silently drops every packet between hosts a and b, both ways (a tc
  // filter on each host's eth0 redirects them to a veth that is down);
  // both still reach every other host. Connections see a partition, not
  // an error. RestoreBetween removes the filters.
  absl::Status CutBetween(int a, int b);
  absl::Status RestoreBetween(int a, int b);

  // Moves the calling thread into host i's namespace until the result is
  // destroyed. Errors: Internal (open / setns).
  absl::StatusOr<std::unique_ptr<ScopedNetns>> EnterHost(int host);

  // Deletes the namespaces of runs whose owner process is gone (and kills
  // what still runs in them): runs whose lock no one holds, or, without a
  // lock file, whose pid does not exist. The number of namespaces deleted.
  // Create calls it.
  static int RemoveStaleRuns(const VirtualNetworkOptions& options);

 private:
  explicit VirtualNetwork(const VirtualNetworkOptions& options,
                          std::string prefix)
      : options_(options), prefix_(std::move(prefix)) {}
  absl::Status Build();
  absl::Status Ip(const std::vector<std::string>& args) const;
  absl::Status Tc(const std::string& netns,
                  const std::vector<std::string>& args) const;
  // The filter on host `from` that drops what it sends to `to`.
  absl::Status SetDrop(int from, int to, bool on);
  std::string switch_netns() const { return prefix_ + "-sw"; }

  const VirtualNetworkOptions options_;
  const std::string prefix_;
  // Namespaces created so far (deleted by the destructor, last first).
  std::vector<std::string> created_;
  // This run's lock (see RemoveStaleRuns), held until destruction.
  int lock_fd_ = -1;
  std::string lock_path_;
};

}  // namespace hymcache::testing
