// Test harness: a real etcd cluster (Debian's /usr/bin/etcd, etcd-server
// 3.4) of one or more members on loopback, data under TEST_TMPDIR, started
// and stopped as child processes (tests/daemon.h). Members can be killed,
// restarted (same data and ports), frozen (SIGSTOP) and thawed, to test
// what HyMCache does when etcd fails.
//
// etcd is a test dependency (tools/setup.sh --test installs it): without it
// Start fails with a message saying so; tests REQUIRE it, they never skip.
//
// Thread safety: none; one test thread drives it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/daemon.h"

namespace hymcache::testing {

struct EtcdClusterOptions {
  // Members. Default: 3.
  int members = 3;
  // etcd's raft timings: short, so that a new raft leader is elected within
  // about a second of the old one's death; long enough for a loaded 2-core
  // machine. (etcd's minimum lease TTL is 1.5 election timeouts, in whole
  // seconds: 1 s with these.) Default: 50 ms / 500 ms.
  absl::Duration heartbeat = absl::Milliseconds(50);
  absl::Duration election_timeout = absl::Milliseconds(500);
  // How long Start and Restart wait for the members to serve. Default: 30 s.
  absl::Duration ready_timeout = absl::Seconds(30);
  // The address every member listens on (clients and peers), and the
  // network namespace the members run in (ChildOptions::netns_path), e.g.
  // a host of tests/netns/virtual_network.h; the calling thread must reach
  // `host` (Start waits for the members through it). Ports are picked free
  // on this process's loopback (a fresh namespace has them all free).
  // Default: "127.0.0.1", "" (this process's namespace).
  std::string host = "127.0.0.1";
  std::string netns_path;
  // Instead of `host` and `netns_path`: member i listens on
  // member_hosts[i].address in member_hosts[i].netns_path (members on hosts
  // of their own, as a three-host install runs them). Either empty or one
  // per member. Default: empty.
  struct MemberHost {
    std::string address;
    std::string netns_path;
  };
  std::vector<MemberHost> member_hosts;
};

class EtcdCluster {
 public:
  static constexpr char kEtcd[] = "/usr/bin/etcd";

  // Starts every member and waits until each answers a linearizable read.
  // Errors: FailedPrecondition when /usr/bin/etcd is missing; Unavailable /
  // DeadlineExceeded when the cluster does not form (its logs are in the
  // message).
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(
      const EtcdClusterOptions& options = {});
  // Thaws and kills every member.
  ~EtcdCluster();

  int size() const { return static_cast<int>(members_.size()); }
  // Member i's client endpoint, "HOST:PORT".
  const std::string& endpoint(int i) const { return members_[i].client; }
  // Every member's client endpoint.
  std::vector<std::string> endpoints() const;

  // SIGKILL member i (its data stays).
  absl::Status Kill(int i);
  // Starts a killed member again on its data and ports; waits until it
  // serves when `wait` (which needs a quorum with it).
  absl::Status Restart(int i, bool wait = true);
  // SIGSTOP / SIGCONT member i: it keeps its sockets but answers nothing.
  // Freeze returns once every thread of the member has stopped
  // (DeadlineExceeded after 5 s).
  absl::Status Freeze(int i);
  absl::Status Thaw(int i);

  // The tail of member i's log (for failure messages).
  std::string LogTail(int i) const;

 private:
  // One try of Start, on ports picked now.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> StartOnce(
      const EtcdClusterOptions& options);
  struct Member {
    std::string name, client, peer, data_dir, log, netns_path;
    Daemon daemon;
    bool frozen = false;
  };
  explicit EtcdCluster(const EtcdClusterOptions& options)
      : options_(options) {}
  absl::Status Launch(int i, bool new_cluster);
  // Waits until member i answers a linearizable Range.
  absl::Status WaitServing(int i);

  const EtcdClusterOptions options_;
  std::string initial_cluster_;
  std::vector<Member> members_;
  std::string dir_;  // removed with the cluster
};

}  // namespace hymcache::testing
