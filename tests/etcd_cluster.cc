#include "tests/etcd_cluster.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/etcd_client.h"
#include "common/net.h"

namespace hymcache::testing {

namespace {

// A port nothing listens on now (bound, read back and released: etcd needs
// its peer ports before any member starts, so port 0 will not do).
absl::StatusOr<int> FreePort() {
  auto s = ListenTcp("127.0.0.1", 0);
  if (!s.ok()) return s.status();
  return LocalPort(s->fd());
}

// True once every thread of `pid` is stopped ('T' in /proc/pid/task/*/stat):
// kill(SIGSTOP) returns before the threads have all stopped, and a request
// sent right after could still be answered.
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  bool any = false;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;
    const char state = stat[paren + 2];
    if (state != 'T' && state != 't') return false;
    any = true;
  }
  return !ec && any;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(
    const EtcdClusterOptions& options) {
  // A port found free can be taken by another test's process before etcd
  // binds it ("bind: address already in use"; CI runs tests two at a
  // time): such a start is retried whole, on new ports.
  for (int attempt = 1;; ++attempt) {
    auto c = StartOnce(options);
    if (c.ok() || attempt == 3 ||
        !absl::StrContains(c.status().message(), "address already in use")) {
      return c;
    }
  }
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::StartOnce(
    const EtcdClusterOptions& options) {
  if (access(kEtcd, X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        kEtcd, " is missing: install Debian's etcd-server package "
               "(tools/setup.sh --test does). These tests need the real "
               "server and fail without it."));
  }
  if (options.members < 1) {
    return absl::InvalidArgumentError("etcd cluster: members < 1");
  }
  if (!options.member_hosts.empty() &&
      static_cast<int>(options.member_hosts.size()) != options.members) {
    return absl::InvalidArgumentError(
        "etcd cluster: member_hosts must name one host per member");
  }
  auto c = std::unique_ptr<EtcdCluster>(new EtcdCluster(options));
  const std::string dir = TempDir("etcd");
  c->dir_ = dir;
  std::vector<std::string> peers;
  for (int i = 0; i < options.members; ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    auto client_port = FreePort();
    if (!client_port.ok()) return client_port.status();
    auto peer_port = FreePort();
    if (!peer_port.ok()) return peer_port.status();
    const bool own = !options.member_hosts.empty();
    const std::string& host =
        own ? options.member_hosts[i].address : options.host;
    m.netns_path =
        own ? options.member_hosts[i].netns_path : options.netns_path;
    m.client = absl::StrCat(host, ":", *client_port);
    m.peer = absl::StrCat(host, ":", *peer_port);
    m.data_dir = absl::StrCat(dir, "/", m.name);
    m.log = absl::StrCat(dir, "/", m.name, ".log");
    peers.push_back(absl::StrCat(m.name, "=http://", m.peer));
    c->members_.push_back(std::move(m));
  }
  c->initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < options.members; ++i) {
    if (absl::Status s = c->Launch(i, true); !s.ok()) return s;
  }
  for (int i = 0; i < options.members; ++i) {
    if (absl::Status s = c->WaitServing(i); !s.ok()) return s;
  }
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (Member& m : members_) {
    if (m.daemon.running() && m.frozen) kill(m.daemon.pid(), SIGCONT);
    // Daemon's destructor SIGKILLs and reaps.
  }
  members_.clear();
  // Each member preallocates hundreds of MB: leave nothing behind.
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& m : members_) out.push_back(m.client);
  return out;
}

absl::Status EtcdCluster::Launch(int i, bool new_cluster) {
  Member& m = members_[i];
  std::vector<std::string> args = {
      "--name", m.name,
      "--data-dir", m.data_dir,
      "--listen-client-urls", absl::StrCat("http://", m.client),
      "--advertise-client-urls", absl::StrCat("http://", m.client),
      "--listen-peer-urls", absl::StrCat("http://", m.peer),
      "--initial-advertise-peer-urls", absl::StrCat("http://", m.peer),
      "--initial-cluster", initial_cluster_,
      "--initial-cluster-state", new_cluster ? "new" : "existing",
      "--initial-cluster-token", absl::StrCat("hym-test-", getpid()),
      "--heartbeat-interval",
      absl::StrCat(absl::ToInt64Milliseconds(options_.heartbeat)),
      "--election-timeout",
      absl::StrCat(absl::ToInt64Milliseconds(options_.election_timeout)),
      "--logger", "zap",
      "--log-level", "warn",
  };
  ChildOptions o;
  o.log_path = m.log;
  o.wait_for_ready_line = false;
  o.netns_path = m.netns_path;
  auto d = Daemon::Launch(kEtcd, args, o);
  if (!d.ok()) return d.status();
  m.daemon = std::move(*d);
  m.frozen = false;
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitServing(int i) {
  EtcdClientOptions o;
  o.endpoints = {members_[i].client};
  o.attempt_timeout = absl::Seconds(1);
  o.retry_pause = absl::Milliseconds(20);
  auto client = EtcdClient::Create(o);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + options_.ready_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    if (!members_[i].daemon.Alive()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", i, " exited; its log:\n", LogTail(i)));
    }
    etcdserverpb::RangeRequest r;
    r.set_key("health");
    auto resp = (*client)->Range(r, absl::Now() + absl::Seconds(2));
    if (resp.ok()) return absl::OkStatus();
    last = resp.status();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "etcd member ", i, " did not serve: ", last.ToString(), "; its log:\n",
      LogTail(i)));
}

absl::Status EtcdCluster::Kill(int i) {
  Member& m = members_[i];
  if (!m.daemon.running()) return absl::FailedPreconditionError("not running");
  if (m.frozen) kill(m.daemon.pid(), SIGCONT);
  m.frozen = false;
  auto s = m.daemon.Stop(SIGKILL);
  return s.ok() ? absl::OkStatus() : s.status();
}

absl::Status EtcdCluster::Restart(int i, bool wait) {
  if (members_[i].daemon.running()) {
    return absl::FailedPreconditionError("still running");
  }
  // The member's data directory holds its membership: the initial-cluster
  // flags are ignored.
  if (absl::Status s = Launch(i, false); !s.ok()) return s;
  return wait ? WaitServing(i) : absl::OkStatus();
}

absl::Status EtcdCluster::Freeze(int i) {
  Member& m = members_[i];
  if (!m.daemon.running()) return absl::FailedPreconditionError("not running");
  if (kill(m.daemon.pid(), SIGSTOP) != 0) return absl::InternalError("SIGSTOP");
  m.frozen = true;
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (!AllThreadsStopped(m.daemon.pid())) {
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd member ", i, " did not stop within 5 s"));
    }
    sched_yield();  // the kernel stops them within microseconds
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::Thaw(int i) {
  Member& m = members_[i];
  if (!m.daemon.running()) return absl::FailedPreconditionError("not running");
  if (kill(m.daemon.pid(), SIGCONT) != 0) return absl::InternalError("SIGCONT");
  m.frozen = false;
  return absl::OkStatus();
}

std::string EtcdCluster::LogTail(int i) const {
  std::ifstream in(members_[i].log);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

}  // namespace hymcache::testing
