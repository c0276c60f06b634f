// A real Prometheus server (Debian's /usr/bin/prometheus) scrapes a real
// master and a real hybrid storage node (in-process, loopback, port 0) every
// second; the test puts and loads data and asks Prometheus's HTTP API for the
// series that must have changed. A second case checks the shipped alert
// rules (promtool check rules / test rules) and that every metric name the
// rules and the Grafana dashboard use is one the daemons export.
//
// The prometheus package is a test dependency (`tools/setup.sh --test` installs it):
// without it these tests FAIL, they do not skip.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/eventually.h"
#include "common/net.h"
#include "master/master_server.h"
#include "storage_node/storage_node.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"

namespace hymcache {
namespace {

using ::hymcache::testing::ChildOptions;
using ::hymcache::testing::ChildProcess;
using ::hymcache::testing::Run;
using ::hymcache::testing::RunfilePath;
using ::hymcache::testing::RunResult;
using ::hymcache::testing::TempDir;
using json = nlohmann::json;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

// gRPC starts threads that trip absl's deadlock detector under load (as in
// storage_node_test).
const bool kNoDeadlockDetector = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

void RequireTool(const char* path) {
  INFO(path << " is missing: install Debian's prometheus package "
               "(tools/setup.sh --test does). This test needs the real binary and "
               "fails without it.");
  REQUIRE(access(path, X_OK) == 0);
}

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET over HTTP/1.0 (the server closes the connection after the answer).
absl::StatusOr<HttpResponse> HttpGet(const std::string& address,
                                     const std::string& target) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto s = ConnectTcp(address, deadline);
  if (!s.ok()) return s.status();
  const std::string req =
      absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  absl::Status sent = SendAll(s->fd(), req.data(), req.size(), deadline);
  if (!sent.ok()) return sent;
  std::string raw;
  char buf[16384];
  while (true) {
    pollfd p{s->fd(), POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      return absl::DeadlineExceededError("HTTP answer too slow");
    }
    const ssize_t n = recv(s->fd(), buf, sizeof(buf), 0);
    if (n < 0) return absl::UnavailableError("recv failed");
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  HttpResponse r;
  const size_t sp = raw.find(' ');
  const size_t end = raw.find("\r\n\r\n");
  if (sp == std::string::npos || end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("not HTTP: ", raw.substr(0, 100)));
  }
  r.status = std::atoi(raw.c_str() + sp + 1);
  r.body = raw.substr(end + 4);
  return r;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a program to completion (tests/child_process.h); its exit status
// and combined output, which `log` keeps for a failure's message.
std::pair<int, std::string> RunLogged(const std::vector<std::string>& argv,
                                      const std::string& log) {
  absl::StatusOr<RunResult> r =
      Run(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()),
          absl::Seconds(60));
  if (!r.ok()) return {-1, r.status().ToString()};
  std::ofstream(log) << r->output;
  return {WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1, r->output};
}

// A port nothing listens on (bound, then closed: Prometheus cannot pick
// port 0 and tell us).
int UnusedPort() {
  auto s = ListenTcp("127.0.0.1", 0);
  REQUIRE(s.ok());
  auto p = LocalPort(s->fd());
  REQUIRE(p.ok());
  return *p;
}

// A Prometheus server process, stopped (SIGTERM, then SIGKILL) on
// destruction.
class PrometheusServer {
 public:
  PrometheusServer(const std::string& dir,
                   const std::vector<std::pair<std::string, std::string>>& jobs)
      : dir_(dir) {
    std::ofstream cfg(dir + "/prometheus.yml");
    cfg << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "  evaluation_interval: 1s\nscrape_configs:\n";
    for (const auto& [job, target] : jobs) {
      cfg << "  - job_name: " << job << "\n    static_configs:\n"
          << "      - targets: ['" << target << "']\n";
    }
    cfg.close();
    log_ = dir + "/prometheus.log";
  }
  ~PrometheusServer() { Stop(); }

  // Starts it and waits until /-/ready answers 200.
  void Start() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      address_ = absl::StrCat("127.0.0.1:", UnusedPort());
      ChildOptions o;
      o.log_path = log_;
      o.wait_for_ready_line = false;
      REQUIRE(
          process_
              .Start(kPrometheus,
                     {"--config.file=" + dir_ + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir_ + "/tsdb",
                      "--web.listen-address=" + address_, "--log.level=info"},
                     o)
              .ok());
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (absl::Now() < deadline) {
        // Exited (e.g. the port was taken meanwhile): retry.
        if (!process_.Alive()) break;
        auto r = HttpGet(address_, "/-/ready");
        if (r.ok() && r->status == 200) return;
        absl::SleepFor(absl::Milliseconds(50));
      }
      Stop();
    }
    FAIL("prometheus did not become ready; its log:\n" << Log());
  }

  // SIGTERM, then SIGKILL after 10 s.
  void Stop() {
    if (!process_.Alive()) return;
    if (!process_.Signal(SIGTERM, absl::Seconds(10)).ok()) {
      process_.Signal(SIGKILL, absl::Seconds(10)).status().IgnoreError();
    }
  }

  // The result vector of an instant query (/api/v1/query).
  json Query(const std::string& promql) {
    auto r = HttpGet(address_, "/api/v1/query?query=" + UrlEncode(promql));
    if (!r.ok() || r->status != 200) return json::array();
    json j = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("status", "") != "success") {
      return json::array();
    }
    return j["data"]["result"];
  }

  // Polls `promql` until it returns at least one series or `timeout`
  // passes; the last result.
  json WaitFor(const std::string& promql,
               absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    json r = Query(promql);
    while (r.empty() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(200));
      r = Query(promql);
    }
    return r;
  }

  std::string Log() const { return ReadFile(log_); }

 private:
  const std::string dir_;
  std::string log_;
  std::string address_;
  ChildProcess process_;
};

double Value(const json& series) {
  return std::stod(series["value"][1].get<std::string>());
}

// A master and a hybrid storage node, both serving /metrics on loopback.
struct Cluster {
  std::unique_ptr<MasterServer> master;
  std::unique_ptr<StorageNode> node;
  std::unique_ptr<Client> client;
};

Cluster StartCluster(const std::string& dir) {
  Cluster c;
  MasterOptions mo;
  mo.db_path = dir + "/master";
  mo.metrics_listen = "127.0.0.1:0";
  mo.build_version = "9.9.9-test";
  mo.build_commit = "abc123";
  mo.service.heartbeat_interval = absl::Milliseconds(200);
  auto master = MasterServer::Create(mo);
  REQUIRE(master.ok());
  c.master = std::move(*master);
  REQUIRE(!c.master->metrics_address().empty());

  StorageNodeOptions so;
  so.master_address = c.master->address();
  so.node_name = "prom-node";
  StorageNodeOptions::HybridDevice hybrid;
  hybrid.tier.path = dir + "/capacity.dat";
  hybrid.tier.capacity_bytes = 64 << 20;
  hybrid.tier.io.direct = false;  // whatever TEST_TMPDIR is
  hybrid.device.staging_bytes = 4 << 20;
  hybrid.device.write_buffer_bytes = 4 << 20;
  so.device = hybrid;
  so.expose_shm = false;
  so.shared_huge_pages = false;
  so.rdma = RdmaMode::kOff;
  so.metrics_listen = "127.0.0.1:0";
  so.build_version = "9.9.9-test";
  so.build_commit = "abc123";
  auto node = StorageNode::Create(so);
  REQUIRE(node.ok());
  c.node = std::move(*node);
  REQUIRE(!c.node->metrics_address().empty());
  REQUIRE(c.node->WaitRegistered(absl::Now() + absl::Seconds(20)));

  ClientOptions co;
  co.master_address = c.master->address();
  // PutAndLoad's 24 blocks of 64 KiB in two reads: a load that one read
  // takes sends no prefetch hint, and the staged-read series must move.
  co.read_batch_bytes = 1 << 20;
  auto client = Client::Create(co);
  REQUIRE(client.ok());
  c.client = std::move(*client);
  return c;
}

// Puts `n` blocks of 64 KiB, then loads and gets them back, checking bytes.
void PutAndLoad(Client& client, int n) {
  constexpr size_t kBlock = 64 << 10;
  std::vector<std::string> keys;
  std::vector<std::string> data;
  for (int i = 0; i < n; ++i) {
    keys.push_back(absl::StrCat("prom-key-", i));
    data.emplace_back(kBlock, static_cast<char>('a' + i % 26));
  }
  std::vector<ConstBuffer> in;
  for (const std::string& d : data) in.push_back({d.data(), d.size()});
  auto put = client.Put(keys, in);
  REQUIRE(put.ok());
  REQUIRE(put->stored == static_cast<size_t>(n));

  std::vector<std::string> out(n, std::string(kBlock, '\0'));
  std::vector<MutableBuffer> bufs;
  for (std::string& o : out) bufs.push_back({o.data(), o.size()});
  auto load = client.Load(keys, bufs);
  REQUIRE(load.ok());
  CHECK(load->loaded == static_cast<size_t>(n));
  auto get = client.Get(keys, bufs);
  REQUIRE(get.ok());
  CHECK(out == data);
  // A miss, for the hit ratio.
  std::vector<std::string> missing = {"prom-missing"};
  std::string m(kBlock, '\0');
  std::vector<MutableBuffer> mb = {{m.data(), m.size()}};
  REQUIRE(client.Get(missing, mb).ok());
}

TEST_CASE("a real Prometheus scrapes the master and a storage node and sees "
          "their series change under load") {
  RequireTool(kPrometheus);
  const std::string dir = TempDir("prometheus");
  Cluster c = StartCluster(dir);
  PrometheusServer prom(dir, {{"hymcache-master", c.master->metrics_address()},
                              {"hymcache-storage", c.node->metrics_address()}});
  prom.Start();

  // Both targets scraped, before any load: the counters are zero.
  INFO("prometheus log:\n" << prom.Log());
  REQUIRE(prom.WaitFor("up{job=\"hymcache-master\"} == 1").size() == 1);
  REQUIRE(prom.WaitFor("up{job=\"hymcache-storage\"} == 1").size() == 1);
  json before = prom.WaitFor("hymcache_storage_bytes_written_total");
  REQUIRE(before.size() == 1);
  CHECK(Value(before[0]) == 0);
  before = prom.WaitFor("hymcache_master_lookup_keys_total");
  REQUIRE(before.size() == 1);
  CHECK(Value(before[0]) == 0);
  json up = prom.WaitFor("hymcache_master_node_up{node=\"prom-node\"} == 1");
  CHECK(up.size() == 1);

  PutAndLoad(*c.client, 24);
  constexpr uint64_t kBytes = 24 * (64 << 10);
  EngineBlocksReport report;
  report.engine_id = "prom-engine";
  report.stored = {"prom-e0", "prom-e1", "prom-e2"};
  REQUIRE(c.client->ReportEngineBlocks(report).ok());

  // Every series below changed under the load (each was 0 before it).
  // (Each waits for the value the whole load reaches: a scrape may catch
  // it half-way.)
  json r = prom.WaitFor("hymcache_storage_bytes_written_total == " +
                        std::to_string(kBytes));
  REQUIRE(r.size() == 1);
  CHECK(r[0]["metric"]["job"] == "hymcache-storage");
  r = prom.WaitFor("hymcache_storage_tcp_bytes_written_total == " +
                   std::to_string(kBytes));
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_storage_bytes_read_total >= " +
                   std::to_string(2 * kBytes));
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_storage_device_write_buffer_admits_total >= 24");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_storage_prefetch_staged_reads_total > 0");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_storage_read_seconds_count > 0");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_node_used_bytes{node=\"prom-node\"} >= " +
                   std::to_string(kBytes));
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_node_objects{node=\"prom-node\"} == 24");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_tenant_objects{tenant=\"default\"} == 24");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_engines_reporting == 1");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_engine_blocks == 3");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_master_lookup_seconds_count > 0");
  CHECK(r.size() == 1);
  // The hit ratio is computable: some keys missed, most hit.
  r = prom.WaitFor(
      "hymcache_master_lookup_hits_total / hymcache_master_lookup_keys_total "
      "> 0.5 < 1");
  CHECK(r.size() == 1);
  // The capacity tier was written (the flusher runs in the background).
  r = prom.WaitFor("hymcache_storage_device_flushed_bytes_total > 0");
  CHECK(r.size() == 1);
  r = prom.WaitFor("hymcache_storage_device_flush_seconds_count > 0");
  CHECK(r.size() == 1);
  prom.Stop();
}

TEST_CASE(
    "A daemon reports the gRPC poll strategy it runs with: the "
    "flag's, else the environment's, else its default") {
  const std::string dir = TempDir("poll_strategy");
  struct Variant {
    std::vector<std::string> flags;
    std::vector<std::string> env;
    std::string want;
  };
  // A single master's default is gRPC's (an elected one's, poll, is
  // checked in HaMasterExports).
  const Variant variants[] = {
      {{}, {}, "epoll1"},
      {{"--grpc_poll_strategy=poll"}, {}, "poll"},
      {{}, {"GRPC_POLL_STRATEGY=poll"}, "poll"},
      {{"--grpc_poll_strategy=epoll1"}, {"GRPC_POLL_STRATEGY=poll"}, "epoll1"},
  };
  int i = 0;
  for (const Variant& v : variants) {
    const std::string metrics = absl::StrCat("127.0.0.1:", UnusedPort());
    std::vector<std::string> args = {absl::StrCat("--db_path=", dir, "/m", i++),
                                     "--listen=127.0.0.1:0", "--logtostderr",
                                     "--metrics_listen=" + metrics};
    args.insert(args.end(), v.flags.begin(), v.flags.end());
    auto d = testing::Daemon::Start(RunfilePath("master/hymcache-master"), args,
                                    absl::Seconds(30), v.env);
    REQUIRE(d.ok());
    auto r = HttpGet(metrics, "/metrics");
    REQUIRE(r.ok());
    INFO(r->body);
    CHECK(absl::StrContains(
        r->body, absl::StrCat("hymcache_master_grpc_poll_strategy{strategy=\"",
                              v.want, "\"} 1")));
    CHECK(d->Stop(SIGTERM).ok());
  }
}

// Series names an elected master exports on top of a single master's: two
// masters with --etcd (a 1-member etcd) and async replication, scraped at
// the leader once its standby follows past its full copy (the lag series
// exist only then). A standby serves no metrics.
std::set<std::string> HaMasterExports(const std::string& dir) {
  auto etcd = testing::EtcdCluster::Start({.members = 1});
  REQUIRE(etcd.ok());
  std::vector<testing::Daemon> masters;
  std::vector<std::string> metrics;
  for (int i = 0; i < 2; ++i) {
    metrics.push_back(absl::StrCat("127.0.0.1:", UnusedPort()));
    auto d = testing::Daemon::Start(
        RunfilePath("master/hymcache-master"),
        {absl::StrCat("--db_path=", dir, "/ha", i), "--listen=127.0.0.1:0",
         "--logtostderr", "--etcd=" + (*etcd)->endpoint(0),
         "--cluster=promtest", "--lease_ttl_s=2", "--replication=async",
         "--metrics_listen=" + metrics.back()});
    REQUIRE(d.ok());
    masters.push_back(std::move(*d));
  }
  std::string body;
  const bool followed = testing::Eventually(
      [&] {
        for (const std::string& addr : metrics) {
          auto r = HttpGet(addr, "/metrics");
          if (r.ok() && r->status == 200 &&
              absl::StrContains(r->body,
                                "\nhymcache_master_replication_lag_seconds ")) {
            body = r->body;
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30));
  INFO(body);
  REQUIRE(followed);
  // An elected master polls on "poll" by default (--grpc_poll_strategy).
  CHECK(absl::StrContains(
      body, "\nhymcache_master_grpc_poll_strategy{strategy=\"poll\"} 1"));
  std::set<std::string> exported;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    exported.insert(std::string(line.substr(0, line.find_first_of("{ "))));
  }
  for (testing::Daemon& m : masters) m.Stop(SIGTERM).IgnoreError();
  return exported;
}

// Every `hymcache_*` name in `text`.
std::set<std::string> MetricNames(const std::string& text) {
  std::set<std::string> out;
  static const std::regex kName("hymcache_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    out.insert(it->str());
  }
  return out;
}

TEST_CASE("the alert rules pass promtool and every metric name the rules and "
          "the dashboard use is exported") {
  RequireTool(kPromtool);
  const std::string dir = TempDir("promtool");
  const std::string alerts = RunfilePath("deploy/monitoring/alerts.yml");
  const std::string alerts_test =
      RunfilePath("deploy/monitoring/alerts_test.yml");
  const std::string dashboard =
      RunfilePath("deploy/monitoring/grafana-dashboard.json");

  auto [rc, out] =
      RunLogged({kPromtool, "check", "rules", alerts}, dir + "/check.log");
  INFO(out);
  CHECK(rc == 0);
  std::tie(rc, out) =
      RunLogged({kPromtool, "test", "rules", alerts_test}, dir + "/test.log");
  INFO(out);
  CHECK(rc == 0);

  // Series the daemons export, with a node registered and data stored.
  Cluster c = StartCluster(dir);
  PutAndLoad(*c.client, 4);
  std::set<std::string> exported;
  for (const std::string& addr :
       {c.master->metrics_address(), c.node->metrics_address()}) {
    auto r = HttpGet(addr, "/metrics");
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    // The build, as a labelled constant.
    CHECK(absl::StrContains(r->body, "build_info{"));
    CHECK(absl::StrContains(r->body, "version=\"9.9.9-test\""));
    CHECK(absl::StrContains(r->body, "commit=\"abc123\""));
    for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
      if (line.empty() || line[0] == '#') continue;
      exported.insert(
          std::string(line.substr(0, line.find_first_of("{ "))));
    }
  }
  REQUIRE(exported.count("hymcache_master_lookups_total") == 1);
  REQUIRE(exported.count("hymcache_storage_bytes_read_total") == 1);
  // The HA alerts' series (leadership changes, replication lag).
  const std::set<std::string> ha = HaMasterExports(dir);
  REQUIRE(ha.count("hymcache_master_leader_changes_total") == 1);
  REQUIRE(ha.count("hymcache_master_replication_followers") == 1);
  exported.insert(ha.begin(), ha.end());

  const json dash = json::parse(ReadFile(dashboard));
  CHECK(dash["panels"].size() > 10);
  std::set<std::string> used = MetricNames(ReadFile(alerts));
  CHECK(used.size() >= 8);
  std::string exprs;
  for (const json& p : dash["panels"]) {
    for (const json& t : p["targets"]) exprs += t["expr"].get<std::string>() + "\n";
  }
  const std::set<std::string> in_dashboard = MetricNames(exprs);
  CHECK(in_dashboard.size() >= 20);
  used.insert(in_dashboard.begin(), in_dashboard.end());
  for (const std::string& name : used) {
    INFO("used by the rules or the dashboard, not exported: " << name);
    CHECK(exported.count(name) == 1);
  }
}

}  // namespace
}  // namespace hymcache
