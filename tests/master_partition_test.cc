// Issue 30's "partitioned old leader", on four hosts in network namespaces
// (tests/netns/virtual_network.h): etcd (1 member) on host E, master M1 on
// host A, master M2 on host B, a storage node and the test's client on host
// C. M1 leads; then only the link between A and E is cut (packets dropped
// silently, both ways): A still reaches B and C, and C reaches A. The
// client keeps putting through M1 alone during and after the cut. M1 must
// stop accepting writes within its lease (1 s: the gate closes 80% of the
// TTL after the last renewal it sent), M2 must lead with a larger epoch,
// no put begun after M2 leads may succeed through M1, and every put M1
// acknowledged must be readable, byte for byte, through M2 (the masters
// replicate synchronously, so a commit M1 made after M2's election, which
// M2 no longer follows, would be missing there). The times from the cut to
// M1's first refusal and to M2 leading are printed (docs/ha.md's failure
// table). M1, which never hears of M2, stays up read-only: writes refused
// with reason read_only.
//
// Needs root for the namespaces; elsewhere it prints "NETNS SKIPPED: why"
// and passes.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/etcd_client.h"
#include "common/eventually.h"
#include "common/grpc_status.h"
#include "common/health_probe.h"
#include "common/leader_election.h"
#include "common/status_reason.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/etcd_cluster.h"
#include "tests/netns/virtual_network.h"
#include "tests/netns_daemons.h"

namespace hymcache {
namespace {

using testing::ChildOptions;
using testing::Daemon;
using testing::EtcdCluster;
using testing::Eventually;
using testing::RunfilePath;
using testing::TempDir;
using testing::VirtualNetwork;

constexpr char kCluster[] = "partition";
enum Host { kE = 0, kA = 1, kB = 2, kC = 3 };

std::shared_ptr<grpc::Channel> Dial(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// GetStats's map from `address` (no failover).
absl::StatusOr<std::map<std::string, double>> StatsOf(
    const std::string& address) {
  auto stub = v1::MasterService::NewStub(Dial(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::GetStatsRequest req;
  v1::GetStatsResponse resp;
  absl::Status s = FromGrpcStatus(stub->GetStats(&ctx, req, &resp));
  if (!s.ok()) return s;
  return std::map<std::string, double>(resp.stats().begin(),
                                       resp.stats().end());
}

struct Master {
  Daemon daemon;
  std::string address;
};

// An HA master on `host`, listening on the host's address.
Master StartMaster(VirtualNetwork& net, int host, const std::string& db,
                   const std::string& etcd) {
  ChildOptions o;
  o.netns_path = net.netns_path(host);
  auto d = Daemon::Launch(
      RunfilePath("master/hymcache-master"),
      {"--db_path=" + db, "--listen=" + net.address(host) + ":0",
       "--logtostderr", "--etcd=" + etcd, absl::StrCat("--cluster=", kCluster),
       "--lease_ttl_s=1", "--node_timeout_ms=3000", "--replication=sync",
       // A host address, not loopback: no identities
       // in this test (docs/security.md).
       "--insecure"},
      o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  const std::string prefix = "hymcache-master standing by on ";
  INFO(d->ready_line());
  REQUIRE(absl::StartsWith(d->ready_line(), prefix));
  Master m;
  m.address = d->ready_line().substr(prefix.size());
  m.daemon = std::move(d).value();
  return m;
}

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Whether every key of `keys` loads through `c` with exactly `data`'s bytes.
bool AllIntact(Client& c, const std::vector<std::string>& keys,
               const std::vector<std::vector<uint8_t>>& data,
               std::string* why) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<MutableBuffer> bufs;
  for (const auto& d : data) out.emplace_back(d.size(), 0xEE);
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto r = c.Get(keys, bufs);
  if (!r.ok()) {
    *why = r.status().ToString();
    return false;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= r->loaded || r->lengths[i] != data[i].size() ||
        std::memcmp(out[i].data(), data[i].data(), data[i].size()) != 0) {
      *why = absl::StrCat("key ", keys[i], " missing or wrong (loaded ",
                          r->loaded, " of ", keys.size(), ")");
      return false;
    }
  }
  return true;
}

TEST_CASE(
    "A leader cut off from etcd but not from nodes and clients stops accepting "
    "writes within its lease and commits nothing after the new leader is "
    "elected") {
  auto made = testing::NetworkOrSkip({"etcd", "a", "b", "c"});
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  if (*made == nullptr) return;
  VirtualNetwork& net = **made;
  // The test itself (its etcd client, its Clients and their gRPC threads)
  // lives on host C from here on.
  auto on_c = net.EnterHost(kC);
  REQUIRE(on_c.ok());

  auto etcd_made = EtcdCluster::Start({.members = 1,
                                       .host = net.address(kE),
                                       .netns_path = net.netns_path(kE)});
  INFO(etcd_made.status().ToString());
  REQUIRE(etcd_made.ok());
  std::unique_ptr<EtcdCluster> etcd = std::move(etcd_made).value();
  auto etcd_client = EtcdClient::Create({.endpoints = etcd->endpoints()});
  REQUIRE(etcd_client.ok());
  auto leader = [&]() -> std::optional<LeaderInfo> {
    auto l = ReadLeader(etcd_client->get(), MasterLeaderKey(kCluster),
                        absl::Now() + absl::Seconds(1));
    if (!l.ok()) return std::nullopt;
    return *l;
  };

  const std::string dir = TempDir("master_partition");
  Master m1 = StartMaster(net, kA, dir + "/m1", etcd->endpoint(0));
  LeaderInfo first;
  REQUIRE(Eventually([&] {
    auto l = leader();
    if (!l || l->candidate != m1.address) return false;
    first = *l;
    auto h = CheckHealth(Dial(m1.address), "", absl::Seconds(1));
    return h.ok() && *h;
  }));
  Master m2 = StartMaster(net, kB, dir + "/m2", etcd->endpoint(0));
  // M2 follows M1's store (past its full copy) before any put: each
  // commit is then answered once M2 holds it.
  REQUIRE(Eventually([&] {
    auto st = StatsOf(m1.address);
    return st.ok() && (*st)["replication_followers"] >= 1;
  }));

  ChildOptions on_host_c;
  on_host_c.netns_path = net.netns_path(kC);
  auto node = Daemon::Launch(
      RunfilePath("storage_node/hymcache-storage"),
      {"--master=" + m1.address + "," + m2.address, "--name=n1",
       "--data_port=0", "--control_port=0", "--listen_host=" + net.address(kC),
       "--insecure", "--logtostderr"},
      on_host_c);
  INFO(node.status().ToString());
  REQUIRE(node.ok());

  // Puts go to M1 only; reads afterwards through both masters.
  ClientOptions m1_only;
  m1_only.master_address = m1.address;
  auto via_m1 = Client::Create(m1_only);
  REQUIRE(via_m1.ok());
  REQUIRE(testing::WaitForLiveNodes(**via_m1, 1).ok());

  struct Put {
    std::string key;
    std::vector<uint8_t> data;
    absl::Time began, answered;
    bool acknowledged = false;
    std::string error;  // why not acknowledged
  };
  std::vector<Put> puts;
  uint32_t seed = 1;
  auto PutOne = [&](absl::Duration deadline) {
    Put p;
    p.key = absl::StrCat("k-", puts.size());
    p.data = Bytes(4096 + 64 * (puts.size() % 16), seed++);
    p.began = absl::Now();
    const ConstBuffer in{p.data.data(), p.data.size()};
    auto r = (*via_m1)->Put({p.key}, {in},
                            CallOptions{.deadline = p.began + deadline});
    p.answered = absl::Now();
    p.acknowledged = r.ok() && r->stored == 1;
    if (!p.acknowledged) {
      p.error = !r.ok()             ? r.status().ToString()
                : r->errors.empty() ? "not stored"
                                    : r->errors[0].ToString();
    }
    puts.push_back(std::move(p));
    return puts.back().acknowledged;
  };
  for (int i = 0; i < 8; ++i) REQUIRE(PutOne(absl::Seconds(5)));

  // Cut A from E only.
  const absl::Time cut = absl::Now();
  REQUIRE(net.CutBetween(kA, kE).ok());
  std::optional<absl::Time> m2_leads;
  LeaderInfo second;
  // Put through M1 until M2 has led for 2 s (each attempt bounded by 1 s,
  // the lease); watch etcd and M2's health meanwhile.
  const bool settled = Eventually(
      [&] {
        PutOne(absl::Seconds(1));
        if (!m2_leads) {
          auto l = leader();
          if (l && l->candidate == m2.address) {
            auto h = CheckHealth(Dial(m2.address), "", absl::Seconds(1));
            if (h.ok() && *h) {
              m2_leads = absl::Now();
              second = *l;
            }
          }
        }
        return m2_leads && absl::Now() > *m2_leads + absl::Seconds(2);
      },
      absl::Seconds(30), absl::Milliseconds(20));
  REQUIRE(settled);

  // M1's last acknowledgement after the cut, and the first refusal after
  // it (from then on M1 refused every put: when it stopped accepting
  // writes). An earlier failure (a slow attempt) does not count.
  std::optional<absl::Time> first_refusal, last_ack;
  std::string refusal;
  size_t acked_after_cut = 0, attempts_after_cut = 0;
  for (const Put& p : puts) {
    if (p.began < cut) continue;
    ++attempts_after_cut;
    if (p.acknowledged) {
      ++acked_after_cut;
      last_ack = p.answered;
      first_refusal.reset();
    } else if (!first_refusal) {
      first_refusal = p.answered;
      refusal = p.error;
    }
  }
  REQUIRE(first_refusal.has_value());
  const double refuse_ms = absl::ToDoubleMilliseconds(*first_refusal - cut);
  const double lead_ms = absl::ToDoubleMilliseconds(*m2_leads - cut);
  std::printf(
      "master_partition_test: A cut from E; M1's first refused put after "
      "%.0f ms, last acknowledged put answered at %.0f ms (%zu of %zu puts "
      "after the cut acknowledged); M2 leads (health SERVING, epoch %lld > "
      "%lld) after %.0f ms (lease TTL 1 s); the first refusal: %s\n",
      refuse_ms, last_ack ? absl::ToDoubleMilliseconds(*last_ack - cut) : 0.0,
      acked_after_cut, attempts_after_cut, static_cast<long long>(second.epoch),
      static_cast<long long>(first.epoch), lead_ms, refusal.c_str());
  std::fflush(stdout);

  CHECK(second.epoch > first.epoch);
  // Within its lease: nothing begun a TTL after the cut is acknowledged.
  for (const Put& p : puts) {
    if (p.began >= cut + absl::Seconds(1)) {
      INFO(p.key << " began " << absl::ToDoubleMilliseconds(p.began - cut)
                 << " ms after the cut");
      CHECK_FALSE(p.acknowledged);
    }
    if (p.acknowledged) CHECK(p.answered < *m2_leads);
  }
  CHECK(*first_refusal < cut + absl::Seconds(1) + absl::Milliseconds(500));
  // M1 cannot reach etcd, so it never learns of M2's term: its own ended
  // without an answer from etcd, so it stays up read-only (docs/ha.md,
  // "etcd faults"), answering lookups and refusing every write with reason
  // read_only. (With --serve_reads_without_etcd=false it would exit 3.)
  {
    auto stub = v1::MasterService::NewStub(Dial(m1.address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::PutStartRequest req;
    req.add_keys("after-the-partition");
    req.add_lengths(4096);
    v1::PutStartResponse resp;
    absl::Status s = FromGrpcStatus(stub->PutStart(&ctx, req, &resp));
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(ReasonOf(s) == StatusReason::kReadOnly);
    CHECK(m1.daemon.Alive());
  }

  // Every acknowledged put reads back intact through M2, and M2 takes new
  // puts.
  ClientOptions both;
  both.master_address = m1.address + "," + m2.address;
  auto via_both = Client::Create(both);
  REQUIRE(via_both.ok());
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
  for (const Put& p : puts) {
    if (!p.acknowledged) continue;
    keys.push_back(p.key);
    data.push_back(p.data);
  }
  std::string why;
  const bool intact =
      Eventually([&] { return AllIntact(**via_both, keys, data, &why); },
                 absl::Seconds(20));
  INFO(keys.size() << " acknowledged puts; " << why);
  CHECK(intact);
  const std::vector<uint8_t> after = Bytes(8192, 999);
  auto p =
      (*via_both)->Put({"after"}, {ConstBuffer{after.data(), after.size()}});
  REQUIRE(p.ok());
  CHECK(p->stored == 1);
}

}  // namespace
}  // namespace hymcache
