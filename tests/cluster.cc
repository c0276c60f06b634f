#include "tests/cluster.h"

#include <grpcpp/grpcpp.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/eventually.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "proto/master.grpc.pb.h"

namespace hymcache::testing {
namespace {

absl::Status MakeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("mkdir ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// Replaces the value of "--flag=..." in `args`.
void SetFlag(std::vector<std::string>& args, const std::string& flag,
             const std::string& value) {
  for (std::string& a : args) {
    if (absl::StartsWith(a, flag + "=")) a = flag + "=" + value;
  }
}

absl::StatusOr<std::string> PortOf(const std::string& host_port) {
  auto hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  return absl::StrCat(hp->second);
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> MasterStats(
    const std::string& address) {
  auto stub = v1::MasterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetStatsResponse resp;
  absl::Status s =
      FromGrpcStatus(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp));
  if (!s.ok()) return s;
  return std::map<std::string, double>(resp.stats().begin(),
                                       resp.stats().end());
}

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

std::string BinaryRunfile(const char* argv0, const std::string& rel) {
  std::vector<std::string> roots;
  for (const char* env : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = getenv(env))
      roots.push_back(absl::StrCat(dir, "/hymcache/"));
  }
  roots.push_back(absl::StrCat(argv0, ".runfiles/hymcache/"));
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(self.string() + ".runfiles/hymcache/");
  for (const std::string& root : roots) {
    const std::string path = root + rel;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

absl::Status RestartableClusterOptions::Validate() const {
  if (master_binary.empty() || storage_binary.empty()) {
    return absl::InvalidArgumentError(
        "RestartableClusterOptions: master_binary and storage_binary are "
        "required");
  }
  if (work_dir.empty()) {
    return absl::InvalidArgumentError(
        "RestartableClusterOptions: work_dir is required");
  }
  if (nodes.empty()) {
    return absl::InvalidArgumentError(
        "RestartableClusterOptions: no storage nodes");
  }
  if (masters < 1) {
    return absl::InvalidArgumentError("RestartableClusterOptions: masters < 1");
  }
  std::set<std::string> names;
  for (int m = 0; m < masters; ++m) {
    names.insert(m == 0 ? "master" : absl::StrCat("master", m));
  }
  for (const StorageNodeSpec& n : nodes) {
    if (n.name.empty() || !names.insert(n.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("RestartableClusterOptions: node name '", n.name,
                       "' is empty or repeated"));
    }
    if (n.bytes == 0 || (n.device == StorageNodeSpec::Device::kHybrid &&
                         (n.bytes % 4096 != 0 || n.staging_bytes == 0 ||
                          n.write_buffer_bytes == 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RestartableClusterOptions: node '", n.name,
          "': bytes must be positive (hybrid: a multiple of 4096, with "
          "staging and write-buffer bytes)"));
    }
  }
  if (start_attempts < 1) {
    return absl::InvalidArgumentError(
        "RestartableClusterOptions: start_attempts < 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RestartableCluster>> RestartableCluster::Create(
    const RestartableClusterOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(MakeDir(options.work_dir));
  const std::string log_dir =
      options.log_dir.empty() ? options.work_dir : options.log_dir;
  RETURN_IF_ERROR(MakeDir(log_dir));
  std::unique_ptr<RestartableCluster> c(new RestartableCluster(options));

  c->masters_ = static_cast<size_t>(options.masters);
  std::vector<std::string> etcd_flags;
  if (options.masters > 1) {
    ASSIGN_OR_RETURN(c->etcd_, EtcdCluster::Start({.members = 1}));
    etcd_flags = {"--etcd=" + absl::StrJoin(c->etcd_->endpoints(), ","),
                  absl::StrCat("--cluster=", kHaCluster)};
  }
  std::vector<std::string> addresses;
  for (int m = 0; m < options.masters; ++m) {
    const std::string name = m == 0 ? "master" : absl::StrCat("master", m);
    auto master = std::make_unique<Daemon>();
    master->name = name;
    master->binary = options.master_binary;
    master->args = MasterArgs(options.work_dir + "/" + name, "127.0.0.1:0");
    master->args.insert(master->args.end(), etcd_flags.begin(),
                        etcd_flags.end());
    master->args.insert(master->args.end(), options.master_args.begin(),
                        options.master_args.end());
    master->log_path = log_dir + "/" + name + ".log";
    RETURN_IF_ERROR(c->StartDaemon(*master, /*first=*/true));
    addresses.push_back(master->address);
    c->daemons_.push_back(std::move(master));
  }
  c->master_address_ = absl::StrJoin(addresses, ",");

  for (const StorageNodeSpec& n : options.nodes) {
    auto d = std::make_unique<Daemon>();
    d->name = n.name;
    d->binary = options.storage_binary;
    d->capacity = n.bytes;
    d->args = StorageArgs(c->master_address_, n.name);
    d->args.insert(d->args.end(), {"--listen_host=127.0.0.1", "--rdma=off",
                                   "--shared_huge_pages=false"});
    if (n.device == StorageNodeSpec::Device::kDram) {
      d->args.push_back(absl::StrCat("--dram_bytes=", n.bytes));
      // As deployed: the node keeps its key, so that a restarted process
      // proves it and re-registers at once (a hybrid node keeps it beside
      // its capacity file by default).
      d->args.push_back("--node_key_file=" + options.work_dir + "/" + n.name +
                        ".node_key");
    } else {
      d->keeps_objects = true;
      d->args.push_back("--device=hybrid");
      d->args.push_back("--capacity_path=" + options.work_dir + "/" + n.name +
                        ".capacity");
      d->args.push_back(absl::StrCat("--capacity_bytes=", n.bytes));
      d->args.push_back(absl::StrCat("--staging_bytes=", n.staging_bytes));
      d->args.push_back(
          absl::StrCat("--write_buffer_bytes=", n.write_buffer_bytes));
      d->args.push_back("--io_queue_depth=16");
    }
    d->args.insert(d->args.end(), options.storage_args.begin(),
                   options.storage_args.end());
    d->log_path = log_dir + "/" + n.name + ".log";
    RETURN_IF_ERROR(c->StartDaemon(*d, /*first=*/true));
    c->daemons_.push_back(std::move(d));
  }
  return c;
}

RestartableCluster::~RestartableCluster() {
  // The daemons first (they die with their owner thread anyway), etcd last.
  daemons_.clear();
  etcd_.reset();
}

std::vector<std::string> RestartableCluster::etcd_endpoints() const {
  return etcd_ != nullptr ? etcd_->endpoints() : std::vector<std::string>();
}

absl::Status RestartableCluster::StartDaemon(Daemon& d, bool first) {
  absl::Status s;
  for (int attempt = 0; attempt < options_.start_attempts; ++attempt) {
    if (attempt > 0) {
      ++failed_starts_;
      absl::SleepFor(options_.restart_retry_delay);
    }
    ChildOptions o;
    o.log_path = d.log_path;
    o.ready_timeout = options_.start_timeout;
    // A crash test that dies leaves no daemon behind.
    o.die_with_starting_thread = true;
    s = d.process.Start(d.binary, d.args, o);
    // Only an early exit (e.g. a port in TIME_WAIT's hands) is worth a
    // retry; a daemon that hangs will hang again.
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable) break;
  }
  if (!s.ok()) return s;
  if (!first) return absl::OkStatus();
  const bool master = d.binary == options_.master_binary;
  if (!master && !options_.node_same_ports) return absl::OkStatus();
  const std::string& line = d.process.ready_line();
  if (master) {
    // An HA master stands by first; a plain one serves at once.
    constexpr absl::string_view kStandby = "hymcache-master standing by on ";
    if (absl::StartsWith(line, kStandby)) {
      d.address = line.substr(kStandby.size());
    } else {
      ASSIGN_OR_RETURN(d.address, ParseMasterReadyLine(line));
    }
    SetFlag(d.args, "--listen", d.address);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(StorageReadyLine addresses, ParseStorageReadyLine(line));
  absl::StatusOr<std::string> data_port = PortOf(addresses.data_address);
  absl::StatusOr<std::string> control_port = PortOf(addresses.control_address);
  if (!data_port.ok() || !control_port.ok()) {
    return absl::InternalError("unexpected storage line: " + line);
  }
  SetFlag(d.args, "--data_port", *data_port);
  SetFlag(d.args, "--control_port", *control_port);
  return absl::OkStatus();
}

int RestartableCluster::IndexOf(const std::string& name) const {
  for (size_t i = 0; i < daemons_.size(); ++i) {
    if (daemons_[i]->name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::Status RestartableCluster::Kill(size_t i) {
  Daemon& d = *daemons_[i];
  if (!d.process.Alive()) {
    return absl::FailedPreconditionError(d.name + " is not running");
  }
  return d.process.Signal(SIGKILL, absl::Seconds(30)).status();
}

absl::Status RestartableCluster::Restart(size_t i) {
  Daemon& d = *daemons_[i];
  if (d.process.Alive()) {
    return absl::FailedPreconditionError(d.name + " is running");
  }
  return StartDaemon(d, /*first=*/false);
}

bool RestartableCluster::Alive(size_t i, std::string* exit) {
  Daemon& d = *daemons_[i];
  const bool was_running = d.process.pid() > 0;
  if (d.process.Alive()) return true;
  if (was_running && exit != nullptr) {
    *exit = DescribeWaitStatus(d.process.exit_status());
  }
  return false;
}

absl::StatusOr<int> RestartableCluster::Terminate(size_t i,
                                                  absl::Duration timeout) {
  Daemon& d = *daemons_[i];
  if (!d.process.Alive()) {
    return absl::FailedPreconditionError(d.name + " is not running");
  }
  absl::StatusOr<int> st = d.process.Signal(SIGTERM, timeout);
  if (!st.ok()) {
    d.process.Signal(SIGKILL, absl::Seconds(30)).IgnoreError();
  }
  return st;
}

}  // namespace hymcache::testing
