// Issue 32's KV-event floors in the netns cluster (tests/netns): 3 HA
// masters on 3 hosts with etcd on a fourth (tests/netns_daemons.h
// StartMastersOn), 8 storage hosts and 4 engine hosts. Each engine stores
// chains of 10 blocks in turns of 3 and removes the middle block of every
// third chain (tests/kv_events_testing.h StoreChainsRemoveSome), while a
// router on a host of its own follows the leader's WatchEvents as they
// come, breaking its stream after every 100 events and resuming where it
// left off. Then: the router saw every store and removal exactly once, in
// commit order (the numbers 1..latest, nothing missed), and the key -> node
// view it built from the events alone answers every chain as PrefixQuery
// does (the floor: at least 99% of chains).
//
// HYM_EVENT_CHAINS sets the chains per engine: 40 by default (CI); the
// documented run:
//   bazel test -c opt //tests:kv_events_netns_test --test_output=all
//     --test_env=HYM_EVENT_CHAINS=250 --nocache_test_results
//     [--test_env=HYM_NETNS_LINK_LATENCY_US=250: 1 ms round trips]
// Needs root for the namespaces; elsewhere it prints "NETNS SKIPPED: why"
// and passes.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/eventually.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/kv_events_testing.h"
#include "tests/netns/virtual_network.h"
#include "tests/netns_daemons.h"

namespace hymcache {
namespace {

using testing::Eventually;
using testing::VirtualNetwork;

constexpr int kStorageHosts = 8;
constexpr int kEngineHosts = 4;
// 3 masters, etcd, the storage hosts, the engine hosts and the router's.
testing::NetnsLayout Layout() {
  return {
      .storage = kStorageHosts, .engines = kEngineHosts, .extra = {"router"}};
}
constexpr int kBlocks = 10;

int ChainsPerEngine() {
  const char* v = std::getenv("HYM_EVENT_CHAINS");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 40;
}

std::unique_ptr<v1::MasterService::Stub> Stub(const std::string& address) {
  return v1::MasterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

TEST_CASE(
    "On 8 storage hosts with 3 masters, a router following the leader's "
    "events across hosts, resuming every 100, sees each store and removal "
    "once in commit order and answers as PrefixQuery") {
  auto net_or = testing::NetworkOrSkip(Layout().HostNames());
  INFO(net_or.status().ToString());
  REQUIRE(net_or.ok());
  if (*net_or == nullptr) return;
  VirtualNetwork& net = **net_or;

  auto cluster =
      testing::StartClusterOn(net, Layout(), "kv_events_netns", {"--insecure"});
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  const std::string master = cluster->master;

  // The router, on its host: the leader is the master that streams events.
  auto in_router = net.EnterHost(Layout().extra_host(0));
  REQUIRE(in_router.ok());
  std::unique_ptr<v1::MasterService::Stub> leader;
  REQUIRE(Eventually(
      [&] {
        for (const std::string& a : cluster->masters.addresses) {
          auto stub = Stub(a);
          if (testing::LatestEvent(*stub).ok()) {
            leader = std::move(stub);
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30)));

  // The engines store and remove; the router follows meanwhile.
  const int chains = ChainsPerEngine();
  std::vector<std::vector<std::vector<std::string>>> stored(kEngineHosts);
  std::vector<std::string> errors(kEngineHosts);
  std::atomic<int> running{kEngineHosts};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int e = 0; e < kEngineHosts; ++e) {
    threads.emplace_back([&, e] {
      auto in = net.EnterHost(Layout().engine_host(e));
      absl::Status s = in.status();
      std::unique_ptr<Client> client;
      if (s.ok()) {
        ClientOptions co;
        co.master_address = master;
        auto c = Client::Create(co);
        s = c.status();
        if (s.ok()) client = std::move(*c);
      }
      if (s.ok()) s = testing::WaitForLiveNodes(*client, kStorageHosts);
      if (s.ok()) {
        auto all = testing::StoreChainsRemoveSome(
            *client, absl::StrCat("e", e, "-"), chains, kBlocks);
        s = all.status();
        if (s.ok()) stored[e] = *std::move(all);
      }
      if (!s.ok()) errors[e] = s.ToString();
      --running;
    });
  }
  testing::EventPosition at;
  std::vector<v1::KvEvent> events;
  std::vector<std::pair<uint64_t, uint64_t>> missed;
  int resumes = 0;
  // Live: pieces of 100 events while the engines run, a new stream from
  // the last event each time; a piece ends sooner (after 1 s) only when
  // fewer came.
  auto follow_to = [&](uint64_t until) {
    absl::Status s = testing::FollowEvents(*leader, &at, until, 100, &events,
                                           &missed, absl::Seconds(1));
    ++resumes;
    return s;
  };
  absl::Status followed;
  while (followed.ok() && running.load() > 0) followed = follow_to(UINT64_MAX);
  for (auto& t : threads) t.join();
  INFO(followed.ToString());
  REQUIRE(followed.ok());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (int e = 0; e < kEngineHosts; ++e) {
    INFO("engine " << e << ": " << errors[e]);
    REQUIRE(errors[e].empty());
  }
  auto latest = testing::LatestEvent(*leader);
  REQUIRE(latest.ok());
  while (followed.ok() && at.after < *latest) followed = follow_to(*latest);
  REQUIRE(followed.ok());
  CHECK(missed.empty());

  // Exactly once, in commit order, for every engine's chains together.
  std::vector<std::vector<std::string>> all_chains;
  for (int e = 0; e < kEngineHosts; ++e) {
    for (const auto& keys : stored[e]) all_chains.push_back(keys);
  }
  // Each engine's events alone (its chains, every third cut), renumbered
  // in their order, are its workload's; all together are 1..latest.
  for (int e = 0; e < kEngineHosts; ++e) {
    const std::string prefix = absl::StrCat("e", e, "-");
    std::vector<v1::KvEvent> own;
    for (const v1::KvEvent& ev : events) {
      if (ev.key().rfind(prefix, 0) == 0) {
        own.push_back(ev);
        own.back().set_sequence(own.size());
      }
    }
    absl::Status s = testing::CheckChainEvents(own, own.size(), stored[e]);
    INFO("engine " << e << ": " << s.ToString());
    CHECK(s.ok());
  }
  for (size_t i = 0; i < events.size(); ++i) {
    INFO("event " << i);
    REQUIRE(events[i].sequence() == i + 1);
  }
  CHECK(events.size() == *latest);

  // The router's answers against PrefixQuery, chain by chain.
  const std::map<std::string, uint32_t> where = testing::RouterView(events);
  size_t agree = 0;
  for (const auto& keys : all_chains) {
    auto same = testing::RouterAgrees(*leader, where, keys);
    REQUIRE(same.ok());
    agree += *same;
  }
  std::printf(
      "kv_events_netns: %d engines x %d chains of %d blocks in %.1f s: %zu "
      "events followed in %d pieces (missed %zu ranges); router agrees with "
      "PrefixQuery on %zu of %zu chains\n",
      kEngineHosts, chains, kBlocks, seconds, events.size(), resumes,
      missed.size(), agree, all_chains.size());
  CHECK(agree * 100 >= all_chains.size() * 99);
  CHECK(resumes > 3);
}

}  // namespace
}  // namespace hymcache
