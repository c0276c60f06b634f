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
// (Debian's iproute2); latency on a kernel without sch_netem also needs
// iptables and NFQUEUE (LinkShape). Without them Create says
// FailedPrecondition, which the tests report as one "NETNS SKIPPED: why" line.
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
#include "tests/netns/link_delayer.h"

namespace hymcache::testing {

struct VirtualNetworkOptions {
  // The hosts' names (for messages; hosts are addressed by index), at
  // least one. Required.
  std::vector<std::string> hosts;
  // iproute2's programs. Default: Debian's paths.
  std::string ip_binary = "/usr/sbin/ip";
  std::string tc_binary = "/usr/sbin/tc";
  // Queues packets to the latency fallback (LinkShape). Default: Debian's
  // iptables.
  std::string iptables_binary = "/usr/sbin/iptables";
  // The latency fallback's queues. Default: LinkDelayerOptions' defaults.
  LinkDelayerOptions delayer;
  // Bound on each ip / tc command. Default: 10 s.
  absl::Duration command_timeout = absl::Seconds(10);

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// Shaping of one host's link to the bridge, applied in both directions
// (what the host sends and what it receives): a packet between hosts X and
// Y is delayed by X's latency plus Y's, so with L on both a round trip
// takes 4 L.
//
// Latency is tc netem on both ends of the link (egress of the host's eth0
// and of the switch's end) where the kernel has sch_netem. Where it has not
// (tc: "Specified qdisc kind is unknown"), the host's namespace gets two
// iptables rules, `OUTPUT -o eth0` and `INPUT -i eth0` to NFQUEUE 0, and a
// LinkDelayer (link_delayer.h) holds each packet `latency` in userspace:
// IPv4 only (ARP goes undelayed), a full queue drops (counted in
// delayer_stats()), and the delayer's thread costs CPU per packet.
struct LinkShape {
  // Added one-way delay (tc netem, else LinkDelayer). Default: 0 (none).
  absl::Duration latency = absl::ZeroDuration();
  // Rate limit in bits per second (tc tbf; netem's rate with a latency).
  // Default: 0 (unlimited).
  uint64_t rate_bits_per_s = 0;
  // Delay through LinkDelayer even where the kernel has netem, and queue
  // packets through it even with a zero latency: what the delayer itself
  // costs (netns_bench --delayer). Default: false.
  bool through_delayer = false;
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

  // Shapes host i's link (LinkShape); a zero shape removes the shaping
  // (qdiscs, iptables rules, the host's delayer queue; the delayer's thread
  // ends with the last queue). Errors: FailedPrecondition (this kernel
  // lacks tbf, or has neither netem nor a usable NFQUEUE: the messages of
  // both), Internal.
  absl::Status ShapeLink(int host, const LinkShape& shape);
  // The latency fallback's counters (zeros before it was first used).
  LinkDelayerStats delayer_stats() const;
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
      : options_(options),
        prefix_(std::move(prefix)),
        queued_(options.hosts.size(), false) {}
  absl::Status Build();
  absl::Status Ip(const std::vector<std::string>& args) const;
  absl::Status Tc(const std::string& netns,
                  const std::vector<std::string>& args) const;
  // tbf (rate > 0) or the default qdisc on both ends of host i's link.
  absl::Status SetTbf(int host, uint64_t rate_bits_per_s);
  // netem on both ends of host i's link.
  absl::Status SetNetem(int host, const LinkShape& shape);
  // Host i's packets through the delayer, or no longer.
  absl::Status Queue(int host, absl::Duration latency);
  absl::Status Unqueue(int host);
  // `iptables op chain -o/-i eth0 -j NFQUEUE` in host i's namespace.
  absl::Status QueueRule(int host, const std::string& op,
                         const std::string& chain) const;
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
  // Set once tc said the kernel has no netem: tc's message.
  std::string netem_missing_;
  // The latency fallback, while a host is queued; the hosts whose iptables
  // rules are in.
  std::unique_ptr<LinkDelayer> delayer_;
  std::vector<bool> queued_;
  // Counters of delayers already stopped.
  LinkDelayerStats past_delayer_stats_;
};

}  // namespace hymcache::testing
