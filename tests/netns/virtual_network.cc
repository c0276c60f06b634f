#include "tests/netns/virtual_network.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/child_process.h"

namespace hymcache::testing {
namespace {

constexpr char kPrefix[] = "hymnet-";
constexpr char kNetnsDir[] = "/run/netns/";
// A run holds an flock on kLockDir/<prefix>.lock while it lives.
constexpr char kLockDir[] = "/run/hymnet/";
// The NFQUEUE number of the latency fallback (one per host namespace).
constexpr uint16_t kQueueNum = 0;

// Whether this process has capability `bit` in its effective set
// (/proc/self/status CapEff).
bool HasCapability(int bit) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "CapEff:")) continue;
    const std::string hex(absl::StripAsciiWhitespace(line.substr(7)));
    return ((std::strtoull(hex.c_str(), nullptr, 16) >> bit) & 1) != 0;
  }
  return false;
}

// Runs `binary args`; Internal with its output unless it exits 0.
absl::Status RunOk(const std::string& binary,
                   const std::vector<std::string>& args,
                   absl::Duration timeout) {
  absl::StatusOr<RunResult> r = Run(binary, args, timeout);
  if (!r.ok()) return r.status();
  if (r->status != 0) {
    return absl::InternalError(
        absl::StrCat(binary, " ", absl::StrJoin(args, " "), ": ",
                     DescribeWaitStatus(r->status), ": ",
                     absl::StripAsciiWhitespace(r->output)));
  }
  return absl::OkStatus();
}

// SIGKILLs every process in namespace `name` (`ip netns pids`).
void KillProcessesIn(const VirtualNetworkOptions& o, const std::string& name) {
  absl::StatusOr<RunResult> r =
      Run(o.ip_binary, {"netns", "pids", name}, o.command_timeout);
  if (!r.ok() || r->status != 0) return;
  for (absl::string_view word :
       absl::StrSplit(r->output, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    int pid = 0;
    if (absl::SimpleAtoi(word, &pid) && pid > 1 && pid != getpid()) {
      kill(pid, SIGKILL);
    }
  }
}

// Deletes namespace `name` after killing what runs in it. Its links go
// with it.
void DeleteNetns(const VirtualNetworkOptions& o, const std::string& name) {
  KillProcessesIn(o, name);
  RunOk(o.ip_binary, {"netns", "delete", name}, o.command_timeout)
      .IgnoreError();  // already gone: nothing to do
}

}  // namespace

absl::Status VirtualNetworkOptions::Validate() const {
  if (hosts.empty()) {
    return absl::InvalidArgumentError("VirtualNetworkOptions: no hosts");
  }
  if (hosts.size() > 200) {
    return absl::InvalidArgumentError(
        "VirtualNetworkOptions: at most 200 hosts (one /24)");
  }
  std::set<std::string> names;
  for (const std::string& h : hosts) {
    if (h.empty() || !names.insert(h).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "VirtualNetworkOptions: host name '", h, "' is empty or repeated"));
    }
  }
  if (ip_binary.empty() || tc_binary.empty() || iptables_binary.empty()) {
    return absl::InvalidArgumentError(
        "VirtualNetworkOptions: ip_binary, tc_binary and iptables_binary are "
        "required");
  }
  if (absl::Status s = delayer.Validate(); !s.ok()) return s;
  if (command_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "VirtualNetworkOptions: command_timeout must be positive");
  }
  return absl::OkStatus();
}

ScopedNetns::~ScopedNetns() {
  if (original_fd_ < 0) return;
  // Back where the thread was; failing here would leave the thread on a
  // host that is about to be deleted, which only fails later calls.
  setns(original_fd_, CLONE_NEWNET);
  close(original_fd_);
}

int VirtualNetwork::RemoveStaleRuns(const VirtualNetworkOptions& options) {
  // Runs (prefix "hymnet-PID-RAND-N") with namespaces or lock files.
  std::map<std::string, std::vector<std::string>> runs;
  if (DIR* dir = opendir(kNetnsDir)) {
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (!absl::StartsWith(name, kPrefix)) continue;
      std::vector<std::string> parts = absl::StrSplit(name, '-');
      if (parts.size() < 4) continue;
      runs[absl::StrJoin(parts.begin(), parts.begin() + 4, "-")].push_back(
          name);
    }
    closedir(dir);
  }
  if (DIR* dir = opendir(kLockDir)) {
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, ".lock")) {
        runs[name.substr(0, name.size() - 5)];  // maybe without namespaces
      }
    }
    closedir(dir);
  }
  int removed = 0;
  for (auto& [run, namespaces] : runs) {
    const std::string lock = absl::StrCat(kLockDir, run, ".lock");
    const int fd = open(lock.c_str(), O_RDWR | O_CLOEXEC);
    bool stale = false;
    if (fd >= 0) {
      // The owner holds its lock while it lives, whatever PID namespace
      // it is in.
      stale = flock(fd, LOCK_EX | LOCK_NB) == 0;
      if (stale) unlink(lock.c_str());
      close(fd);
    } else {
      // No lock file (it could not be created): the owner's pid decides.
      std::vector<std::string> parts = absl::StrSplit(run, '-');
      int pid = 0;
      stale = parts.size() >= 2 && absl::SimpleAtoi(parts[1], &pid) &&
              pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
    }
    if (!stale) continue;
    std::sort(namespaces.begin(), namespaces.end(), std::greater<>());
    for (const std::string& name : namespaces) DeleteNetns(options, name);
    removed += static_cast<int>(namespaces.size());
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<VirtualNetwork>> VirtualNetwork::Create(
    const VirtualNetworkOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  constexpr int kCapNetAdmin = 12, kCapSysAdmin = 21;
  if (!HasCapability(kCapNetAdmin) || !HasCapability(kCapSysAdmin)) {
    return absl::FailedPreconditionError(
        "network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN (root); "
        "this process lacks them");
  }
  for (const std::string* b : {&options.ip_binary, &options.tc_binary}) {
    if (access(b->c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(*b, " is missing (Debian's iproute2)"));
    }
  }
  RemoveStaleRuns(options);
  static std::atomic<int> runs{0};
  // The pid names the owner for people; the random part keeps runs in
  // separate PID namespaces (same small pids) apart.
  std::random_device rd;
  const std::string prefix =
      absl::StrCat(kPrefix, getpid(), "-", absl::Hex(rd(), absl::kZeroPad8),
                   "-", runs.fetch_add(1));
  auto net =
      std::unique_ptr<VirtualNetwork>(new VirtualNetwork(options, prefix));
  // The lock, taken under a temporary name and then renamed, so that no
  // other run ever finds it unlocked while this one lives.
  mkdir(kLockDir, 0755);  // may exist
  const std::string lock = absl::StrCat(kLockDir, prefix, ".lock");
  const std::string tmp = lock + ".tmp";
  net->lock_fd_ = open(tmp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (net->lock_fd_ >= 0 && flock(net->lock_fd_, LOCK_EX) == 0 &&
      rename(tmp.c_str(), lock.c_str()) == 0) {
    net->lock_path_ = lock;
  } else {
    unlink(tmp.c_str());  // other runs judge this one by its pid
  }
  // The first namespace tells whether namespaces work here at all.
  if (absl::Status s = net->Ip({"netns", "add", net->switch_netns()});
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a network namespace: ", s.message()));
  }
  net->created_.push_back(net->switch_netns());
  if (absl::Status s = net->Build(); !s.ok()) return s;  // destructor cleans
  return net;
}

VirtualNetwork::~VirtualNetwork() {
  // The delayer's thread ends before the namespaces (and their rules) go.
  delayer_.reset();
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    DeleteNetns(options_, *it);
  }
  if (!lock_path_.empty()) unlink(lock_path_.c_str());
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::Status VirtualNetwork::Ip(const std::vector<std::string>& args) const {
  return RunOk(options_.ip_binary, args, options_.command_timeout);
}

absl::Status VirtualNetwork::Tc(const std::string& netns,
                                const std::vector<std::string>& args) const {
  std::vector<std::string> a = {"-n", netns};
  a.insert(a.end(), args.begin(), args.end());
  return RunOk(options_.tc_binary, a, options_.command_timeout);
}

std::string VirtualNetwork::address(int host) const {
  return absl::StrCat("10.77.0.", host + 1);
}

std::string VirtualNetwork::netns_name(int host) const {
  return absl::StrCat(prefix_, "-", host);
}

std::string VirtualNetwork::netns_path(int host) const {
  return absl::StrCat(kNetnsDir, netns_name(host));
}

absl::Status VirtualNetwork::Build() {
  const std::string sw = switch_netns();
  // forward_delay 0: ports forward as soon as they are up (no STP here).
  for (const std::vector<std::string>& c :
       std::vector<std::vector<std::string>>{
           {"-n", sw, "link", "set", "lo", "up"},
           {"-n", sw, "link", "add", "br0", "type", "bridge", "forward_delay",
            "0"},
           {"-n", sw, "link", "set", "br0", "up"}}) {
    if (absl::Status s = Ip(c); !s.ok()) return s;
  }
  for (int i = 0; i < size(); ++i) {
    const std::string ns = netns_name(i);
    const std::string port = absl::StrCat("h", i);
    if (absl::Status s = Ip({"netns", "add", ns}); !s.ok()) return s;
    created_.push_back(ns);
    for (const std::vector<std::string>& c :
         std::vector<std::vector<std::string>>{
             {"-n", sw, "link", "add", port, "type", "veth", "peer", "name",
              "eth0", "netns", ns},
             {"-n", sw, "link", "set", port, "master", "br0"},
             {"-n", sw, "link", "set", port, "up"},
             {"-n", ns, "link", "set", "lo", "up"},
             {"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"},
             {"-n", ns, "link", "set", "eth0", "up"},
             // CutBetween redirects dropped packets to cut0, which stays
             // down, so the kernel frees them without telling the sender.
             {"-n", ns, "link", "add", "cut0", "type", "veth", "peer", "name",
              "cut1"}}) {
      if (absl::Status s = Ip(c); !s.ok()) return s;
    }
    if (absl::Status s = Tc(ns, {"qdisc", "add", "dev", "eth0", "clsact"});
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status VirtualNetwork::ShapeLink(int host, const LinkShape& shape) {
  if (host < 0 || host >= size()) return absl::OutOfRangeError("no such host");
  if (shape.latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ShapeLink: negative latency");
  }
  const bool delay = shape.latency > absl::ZeroDuration();
  if (delay && !shape.through_delayer && netem_missing_.empty()) {
    absl::Status s = SetNetem(host, shape);
    if (s.ok() || s.code() != absl::StatusCode::kFailedPrecondition) {
      if (s.ok()) return Unqueue(host);
      return s;
    }
    netem_missing_ = std::string(s.message());
  }
  if (absl::Status s = SetTbf(host, shape.rate_bits_per_s); !s.ok()) return s;
  if (delay || shape.through_delayer) return Queue(host, shape.latency);
  return Unqueue(host);
}

absl::Status VirtualNetwork::SetNetem(int host, const LinkShape& shape) {
  const std::pair<std::string, std::string> ends[] = {
      {netns_name(host), "eth0"}, {switch_netns(), absl::StrCat("h", host)}};
  for (const auto& [ns, dev] : ends) {
    std::vector<std::string> args = {
        "qdisc", "replace",
        "dev",   dev,
        "root",  "netem",
        "delay", absl::StrCat(absl::ToInt64Microseconds(shape.latency), "us")};
    if (shape.rate_bits_per_s > 0) {
      args.insert(args.end(),
                  {"rate", absl::StrCat(shape.rate_bits_per_s, "bit")});
    }
    if (absl::Status s = Tc(ns, args); !s.ok()) {
      // tc: "Specified qdisc kind is unknown." (no sch_netem).
      if (absl::StrContains(s.message(), "unknown")) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this kernel lacks the qdisc (sch_netem): ", s.message()));
      }
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status VirtualNetwork::SetTbf(int host, uint64_t rate_bits_per_s) {
  const std::pair<std::string, std::string> ends[] = {
      {netns_name(host), "eth0"}, {switch_netns(), absl::StrCat("h", host)}};
  for (const auto& [ns, dev] : ends) {
    if (rate_bits_per_s == 0) {
      // Back to the default qdisc; none installed is fine.
      Tc(ns, {"qdisc", "del", "dev", dev, "root"}).IgnoreError();
      continue;
    }
    // A burst of at least one 4 ms tick's worth (and 16 KiB).
    const uint64_t burst =
        std::max<uint64_t>(rate_bits_per_s / 8 / 250, 16 << 10);
    if (absl::Status s =
            Tc(ns, {"qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                    absl::StrCat(rate_bits_per_s, "bit"), "burst",
                    absl::StrCat(burst), "latency", "200ms"});
        !s.ok()) {
      if (absl::StrContains(s.message(), "unknown")) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this kernel lacks the qdisc (sch_tbf): ", s.message()));
      }
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status VirtualNetwork::QueueRule(int host, const std::string& op,
                                       const std::string& chain) const {
  return RunOk(options_.ip_binary,
               {"netns", "exec", netns_name(host), options_.iptables_binary,
                "-w", op, chain, chain == "INPUT" ? "-i" : "-o", "eth0", "-j",
                "NFQUEUE", "--queue-num", absl::StrCat(kQueueNum)},
               options_.command_timeout);
}

absl::Status VirtualNetwork::Queue(int host, absl::Duration latency) {
  // Why, when neither way to delay works.
  auto neither = [this](const absl::Status& s) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no way to add latency here: ",
        netem_missing_.empty() ? "netem not tried" : netem_missing_,
        "; and the NFQUEUE fallback: ", s.message()));
  };
  if (delayer_ == nullptr) {
    if (access(options_.iptables_binary.c_str(), X_OK) != 0) {
      return neither(absl::FailedPreconditionError(absl::StrCat(
          options_.iptables_binary, " is missing (Debian's iptables)")));
    }
    auto d = LinkDelayer::Create(options_.delayer);
    if (!d.ok()) return neither(d.status());
    delayer_ = std::move(d).value();
  }
  // The queue is bound before any rule feeds it: a rule without a
  // listener drops.
  if (absl::Status s = delayer_->Serve(netns_path(host), kQueueNum, latency);
      !s.ok()) {
    Unqueue(host).IgnoreError();  // only ends the thread, if idle
    return s.code() == absl::StatusCode::kFailedPrecondition ? neither(s) : s;
  }
  if (queued_[host]) return absl::OkStatus();
  for (const char* chain : {"OUTPUT", "INPUT"}) {
    if (absl::Status s = QueueRule(host, "-A", chain); !s.ok()) {
      queued_[host] = true;  // removes what went in
      Unqueue(host).IgnoreError();
      return neither(s);
    }
  }
  queued_[host] = true;
  return absl::OkStatus();
}

absl::Status VirtualNetwork::Unqueue(int host) {
  absl::Status result;
  if (queued_[host]) {
    // Rules out first: nothing is queued once the delayer lets go.
    for (const char* chain : {"OUTPUT", "INPUT"}) {
      absl::Status s = QueueRule(host, "-D", chain);
      if (result.ok()) result = s;
    }
    queued_[host] = false;
  }
  if (delayer_ == nullptr) return result;
  delayer_->Stop(netns_path(host), kQueueNum).IgnoreError();  // not served
  if (delayer_->queues() == 0) {
    // No shaped host left: the thread ends.
    past_delayer_stats_.Add(delayer_->stats());
    delayer_.reset();
  }
  return result;
}

LinkDelayerStats VirtualNetwork::delayer_stats() const {
  LinkDelayerStats s = past_delayer_stats_;
  if (delayer_ != nullptr) s.Add(delayer_->stats());
  return s;
}

absl::Status VirtualNetwork::CutLink(int host) {
  if (host < 0 || host >= size()) return absl::OutOfRangeError("no such host");
  return Ip(
      {"-n", switch_netns(), "link", "set", absl::StrCat("h", host), "down"});
}

absl::Status VirtualNetwork::RestoreLink(int host) {
  if (host < 0 || host >= size()) return absl::OutOfRangeError("no such host");
  return Ip(
      {"-n", switch_netns(), "link", "set", absl::StrCat("h", host), "up"});
}

absl::Status VirtualNetwork::SetDrop(int from, int to, bool on) {
  // One filter per peer, told apart by its priority.
  const std::string prio = absl::StrCat(100 + to);
  if (!on) {
    return Tc(netns_name(from),
              {"filter", "del", "dev", "eth0", "egress", "prio", prio});
  }
  return Tc(netns_name(from), {"filter", "add",
                               "dev",    "eth0",
                               "egress", "protocol",
                               "ip",     "prio",
                               prio,     "u32",
                               "match",  "ip",
                               "dst",    address(to) + "/32",
                               "action", "mirred",
                               "egress", "redirect",
                               "dev",    "cut0"});
}

absl::Status VirtualNetwork::CutBetween(int a, int b) {
  if (a < 0 || a >= size() || b < 0 || b >= size() || a == b) {
    return absl::OutOfRangeError("CutBetween: two different hosts");
  }
  if (absl::Status s = SetDrop(a, b, true); !s.ok()) return s;
  return SetDrop(b, a, true);
}

absl::Status VirtualNetwork::RestoreBetween(int a, int b) {
  if (a < 0 || a >= size() || b < 0 || b >= size() || a == b) {
    return absl::OutOfRangeError("RestoreBetween: two different hosts");
  }
  absl::Status first = SetDrop(a, b, false);
  absl::Status second = SetDrop(b, a, false);
  return first.ok() ? second : first;
}

absl::StatusOr<std::unique_ptr<ScopedNetns>> VirtualNetwork::EnterHost(
    int host) {
  if (host < 0 || host >= size()) return absl::OutOfRangeError("no such host");
  const int original = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (original < 0) {
    return absl::InternalError(
        absl::StrCat("open /proc/thread-self/ns/net: ", strerror(errno)));
  }
  const int target = open(netns_path(host).c_str(), O_RDONLY | O_CLOEXEC);
  if (target < 0) {
    close(original);
    return absl::InternalError(
        absl::StrCat("open ", netns_path(host), ": ", strerror(errno)));
  }
  const int r = setns(target, CLONE_NEWNET);
  const int err = errno;
  close(target);
  if (r != 0) {
    close(original);
    return absl::InternalError(absl::StrCat("setns: ", strerror(err)));
  }
  return std::unique_ptr<ScopedNetns>(new ScopedNetns(original));
}

}  // namespace hymcache::testing
