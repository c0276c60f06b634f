// consistency_repro: deterministic reproductions of consistency defects the
// crash test (tools/crashtest) found, with real daemons and the real SDK;
// both are fixed on main and consistency_repro_test keeps them fixed. Each
// case prints what it saw and exits 1 when the defect shows, 0 when it does
// not (2: the setup failed).
//
//   bazel run //tools/crashtest:consistency_repro -- --case=lost_commit
//   bazel run //tools/crashtest:consistency_repro -- --case=orphaned_subtree
//
// lost_commit (fixed by 791d3ab: a node refuses writes until it has
//   registered): a DRAM node is SIGKILLed and restarted on its ports (as a
//   service manager does) but cannot reach the master yet. The master still
//   lists the node's old incarnation as alive and places a Put there; the
//   new process accepted the write and the master committed it, so the
//   client was told "stored". When the node then registered (a new
//   incarnation), the master purged every listing of the node, that one
//   included, and the node freed the bytes: nothing crashed after the
//   commit, and the key was gone.
// orphaned_subtree (fixed by a756405: the blocks after a key stored again
//   elsewhere stay, as roots still reached through the key): a chain
//   [p, c1..c8] is stored on node X. X stalls (SIGSTOP, like a long pause or
//   a partition) past the node timeout and is marked dead; meanwhile p alone
//   is stored again, on node Y. The commit replaced p's entry, which made
//   the old entry's children on X orphans, and the master removed c1..c8,
//   although a reader reaches them through p's key once X is back. X came
//   back having never crashed, and the chain was cut after p.

#include <gflags/gflags.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/cli.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/thread.h"
#include "tests/cluster.h"

DEFINE_string(case, "lost_commit", "lost_commit or orphaned_subtree");
DEFINE_string(work_dir, "", "daemon data and logs (default: a temp dir)");
DEFINE_string(master_binary, "", "hymcache-master (default: from runfiles)");
DEFINE_string(storage_binary, "", "hymcache-storage (default: from runfiles)");

namespace hymcache::crashtest {
namespace {

// A TCP forwarder from a loopback port to `target` that can be cut (no
// listener, live connections closed) and restored on the same port.
class Proxy {
 public:
  Proxy() = default;
  ~Proxy() { Cut(); }

  // Connections accepted before a target is set are dropped.
  void set_target(const std::string& target) {
    MutexLock lock(&mu_);
    target_ = target;
  }

  absl::Status Open(int port) {
    auto l = ListenTcp("127.0.0.1", port);
    if (!l.ok()) return l.status();
    auto p = LocalPort(l->fd());
    if (!p.ok()) return p.status();
    port_ = *p;
    {
      MutexLock lock(&mu_);
      open_ = true;
    }
    listener_ = std::move(*l);
    acceptor_ = Thread("proxy-accept", [this] { AcceptLoop(); });
    return absl::OkStatus();
  }
  void Cut() {
    {
      MutexLock lock(&mu_);
      open_ = false;
      for (int fd : live_) shutdown(fd, SHUT_RDWR);
    }
    acceptor_.Join();
    pumps_.clear();  // joins
    listener_.Close();
    MutexLock lock(&mu_);
    live_.clear();
  }
  int port() const { return port_; }

 private:
  bool IsOpen() {
    MutexLock lock(&mu_);
    return open_;
  }
  void AcceptLoop() {
    while (IsOpen()) {
      pollfd p{listener_.fd(), POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      Socket in(accept(listener_.fd(), nullptr, nullptr));
      if (!in.valid()) continue;
      std::string target;
      {
        MutexLock lock(&mu_);
        target = target_;
      }
      if (target.empty()) continue;
      auto out = ConnectTcp(target, absl::Now() + absl::Seconds(2));
      if (!out.ok()) continue;
      auto pair = std::make_shared<std::pair<Socket, Socket>>(std::move(in),
                                                              std::move(*out));
      {
        MutexLock lock(&mu_);
        live_.push_back(pair->first.fd());
        live_.push_back(pair->second.fd());
      }
      pumps_.emplace_back("proxy-pump", [this, pair] { Pump(*pair); });
    }
  }
  // Stops tracking a connection's descriptors (they close with it), so
  // that Cut never shuts down a number reused by another socket.
  void Forget(const int fds[2]) {
    MutexLock lock(&mu_);
    for (int k = 0; k < 2; ++k) {
      live_.erase(std::remove(live_.begin(), live_.end(), fds[k]), live_.end());
    }
  }
  void Pump(std::pair<Socket, Socket>& s) {
    const int fds[2] = {s.first.fd(), s.second.fd()};
    char buf[16384];
    while (IsOpen()) {
      pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (p[k].revents == 0) continue;
        const ssize_t n = read(fds[k], buf, sizeof(buf));
        if (n <= 0 ||
            !SendAll(fds[1 - k], buf, n, absl::Now() + absl::Seconds(5)).ok()) {
          Forget(fds);
          return;
        }
      }
    }
    Forget(fds);
  }

  int port_ = 0;
  Socket listener_;
  Thread acceptor_;
  std::vector<Thread> pumps_;
  Mutex mu_;
  std::string target_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> live_ ABSL_GUARDED_BY(mu_);
};

// Waits until node `name` is alive with a heartbeat after `after`.
bool WaitAlive(Client& client, const std::string& name, absl::Time after,
               bool alive = true) {
  for (int i = 0; i < 300; ++i) {
    auto st = client.GetClusterStatus();
    if (st.ok()) {
      for (const NodeStatus& n : st->nodes) {
        if (n.name != name) continue;
        if (!alive && !n.alive) return true;
        if (alive && n.alive &&
            n.last_heartbeat_unix_ms > absl::ToUnixMillis(after)) {
          return true;
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

std::vector<char> Block(char c) { return std::vector<char>(20000, c); }

int Fail(const std::string& why) {
  std::cerr << "setup failed: " << why << "\n";
  return 2;
}

int LostCommit(testing::RestartableClusterOptions o) {
  Proxy proxy;
  if (absl::Status s = proxy.Open(0); !s.ok()) return Fail(s.ToString());
  o.master_args.push_back("--node_timeout_ms=30000");
  o.nodes = {{"n", testing::StorageNodeSpec::Device::kDram, 64 << 20}};
  o.storage_args.push_back(absl::StrCat("--master=127.0.0.1:", proxy.port()));
  auto cluster = testing::RestartableCluster::Create(o);
  if (!cluster.ok()) return Fail(cluster.status().ToString());
  testing::RestartableCluster& c = **cluster;
  proxy.set_target(c.master_address());
  auto client = Client::Create({.master_address = c.master_address()});
  if (!client.ok()) return Fail(client.status().ToString());
  if (!WaitAlive(**client, "n", absl::InfinitePast()))
    return Fail("n not alive");
  // The master lists the node alive once it answered the registration; the
  // node keeps its key a moment later. A restart before that cannot prove
  // the key and waits out the node timeout.
  const std::string key_file = o.work_dir + "/n.node_key";
  for (int i = 0; i < 1000 && ::access(key_file.c_str(), F_OK) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }

  // The node crashes and is restarted on its ports, but cannot reach the
  // master for now.
  proxy.Cut();
  if (absl::Status s = c.Kill(1); !s.ok()) return Fail(s.ToString());
  if (absl::Status s = c.Restart(1); !s.ok()) return Fail(s.ToString());
  std::cout << "node n SIGKILLed and restarted on its ports; it cannot "
               "reach the master yet\n";

  const std::vector<std::string> keys = {"k"};
  std::vector<char> data = Block('k');
  std::vector<ConstBuffer> in = {{data.data(), data.size()}};
  auto put = (*client)->Put(keys, in);
  if (!put.ok()) return Fail("Put: " + put.status().ToString());
  const bool stored = put->outcomes[0] == PutOutcome::kStored;
  std::cout << "Put(k): "
            << (stored ? "stored" : "not stored: " + put->errors[0].ToString())
            << " on node " << put->node_id << "\n";

  // The node reaches the master again (it was never killed after the Put).
  const absl::Time restored = absl::Now();
  if (absl::Status s = proxy.Open(proxy.port()); !s.ok())
    return Fail(s.ToString());
  if (!WaitAlive(**client, "n", restored)) return Fail("n did not come back");
  absl::SleepFor(absl::Seconds(3));
  auto look = (*client)->BatchLookup(keys);
  if (!look.ok()) return Fail("BatchLookup: " + look.status().ToString());
  std::cout << "after node n registered: k is "
            << (look->found[0] ? "listed" : "NOT listed") << "\n";
  if (stored && !look->found[0]) {
    std::cout << "DEFECT: a Put acknowledged as stored is gone, and nothing "
                 "crashed after it (see "
              << c.log_path(1) << ", 'does not retain this node's objects')\n";
    return 1;
  }
  std::cout << "not reproduced\n";
  return 0;
}

int OrphanedSubtree(testing::RestartableClusterOptions o) {
  o.master_args.push_back("--node_timeout_ms=2000");
  o.master_args.push_back("--v=1");  // logs the orphan sweep
  o.nodes = {{"a", testing::StorageNodeSpec::Device::kDram, 64 << 20},
             {"b", testing::StorageNodeSpec::Device::kDram, 64 << 20}};
  auto cluster = testing::RestartableCluster::Create(o);
  if (!cluster.ok()) return Fail(cluster.status().ToString());
  testing::RestartableCluster& c = **cluster;
  auto client = Client::Create({.master_address = c.master_address()});
  if (!client.ok()) return Fail(client.status().ToString());
  if (!WaitAlive(**client, "a", absl::InfinitePast()) ||
      !WaitAlive(**client, "b", absl::InfinitePast())) {
    return Fail("nodes not alive");
  }

  // One chain, one Put: all of it on one node X.
  std::vector<std::string> chain = {"p"};
  for (int i = 1; i <= 8; ++i) chain.push_back(absl::StrCat("c", i));
  std::vector<std::vector<char>> data;
  std::vector<ConstBuffer> in;
  for (size_t i = 0; i < chain.size(); ++i) data.push_back(Block('a' + i));
  for (auto& d : data) in.push_back({d.data(), d.size()});
  auto put = (*client)->Put(chain, in);
  if (!put.ok() || put->stored != chain.size()) return Fail("chain not stored");
  auto st = (*client)->GetClusterStatus();
  if (!st.ok()) return Fail(st.status().ToString());
  std::string x;
  for (const NodeStatus& n : st->nodes) {
    if (n.node_id == put->node_id) x = n.name;
  }
  const size_t xi = static_cast<size_t>(c.IndexOf(x));
  std::cout << "chain p, c1..c8 stored on node " << x << "\n";

  // X stalls past the node timeout; meanwhile p alone is stored again.
  kill(c.pid(xi), SIGSTOP);
  if (!WaitAlive(**client, x, absl::InfinitePast(), /*alive=*/false)) {
    kill(c.pid(xi), SIGCONT);
    return Fail(x + " never marked dead");
  }
  std::vector<ConstBuffer> p_in = {in[0]};
  auto again = (*client)->Put({chain[0]}, p_in);
  std::cout << x << " stalled (SIGSTOP) and marked dead; Put(p) again: "
            << (again.ok() && again->stored == 1 ? "stored" : "not stored")
            << " on node " << (again.ok() ? again->node_id : 0) << "\n";
  const absl::Time resumed = absl::Now();
  kill(c.pid(xi), SIGCONT);
  if (!WaitAlive(**client, x, resumed)) return Fail(x + " did not come back");
  absl::SleepFor(absl::Seconds(3));

  auto look = (*client)->BatchLookup(chain);
  if (!look.ok()) return Fail("BatchLookup: " + look.status().ToString());
  size_t children = 0;
  for (size_t i = 1; i < chain.size(); ++i) children += look->found[i] ? 1 : 0;
  std::cout << x << " resumed (it never crashed); listed: p "
            << (look->found[0] ? "yes" : "no") << ", c1..c8 " << children
            << " of 8\n";
  if (look->found[0] && children < 8) {
    std::cout << "DEFECT: storing p on another node removed the blocks "
                 "after it on "
              << x << ", which a reader still reaches through p (see "
              << c.log_path(0) << ", 'whose chain lost a block')\n";
    return 1;
  }
  std::cout << "not reproduced\n";
  return 0;
}

}  // namespace
}  // namespace hymcache::crashtest

int main(int argc, char** argv) {
  hymcache::ParseCommandLine(
      {.program = "consistency_repro",
       .usage = "consistency_repro: deterministic reproductions of consistency "
                "defects the crash test found",
       .main_file = __FILE__},
      &argc, &argv);
  signal(SIGPIPE, SIG_IGN);
  using hymcache::testing::BinaryRunfile;
  hymcache::testing::RestartableClusterOptions o;
  o.master_binary = FLAGS_master_binary.empty()
                        ? BinaryRunfile(argv[0], "master/hymcache-master")
                        : FLAGS_master_binary;
  o.storage_binary =
      FLAGS_storage_binary.empty()
          ? BinaryRunfile(argv[0], "storage_node/hymcache-storage")
          : FLAGS_storage_binary;
  o.work_dir = FLAGS_work_dir.empty()
                   ? absl::StrCat("/tmp/hymcache-repro-", getpid())
                   : FLAGS_work_dir;
  o.nodes = {{"placeholder"}};  // each case sets its nodes
  int rc = 2;
  if (FLAGS_case == "lost_commit") {
    rc = hymcache::crashtest::LostCommit(o);
  } else if (FLAGS_case == "orphaned_subtree") {
    rc = hymcache::crashtest::OrphanedSubtree(o);
  } else {
    std::cerr << "unknown --case " << FLAGS_case << "\n";
  }
  std::cout << "logs in " << o.work_dir << "\n";
  return rc;
}
