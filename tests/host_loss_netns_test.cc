// Issue 32's "a storage host killed" floor on many hosts
// (tests/netns/virtual_network.h): a master on one host, 4 storage nodes on
// 4 hosts and 2 engine hosts. The engines store conversations (chains of
// 1-6 turns, 1-4 blocks each, each turn's Store naming the previous turn's
// last key as parent), then load random chains in a loop, as engines do at
// each turn, checking every loaded byte. Mid-load one storage host's link
// is cut: the host is gone, its packets dropped silently (the worst case
// for a reader: no refusal, only silence). The loads go on until the
// master has declared the node dead and every loader has loaded again.
//
// The floor (no replicas yet, so no chain has a copy elsewhere):
//   - no load fails: every Load returns OK, within its deadline plus slack;
//   - 0 wrong bytes;
//   - a chain with no block on the lost host loads whole, before, during
//     and after the loss;
//   - once the master has declared the node dead, a chain that had a block
//     there loads exactly its blocks before the first one that was there
//     (a prefix hit; the rest is recomputed by the engine);
//   - before that, each engine's client waits for the silent node at most
//     about once: the load that waited marks it unresponsive
//     (ClientOptions::unresponsive_node_period, client/unresponsive_nodes.h)
//     and later loads count its blocks as misses at once.
// The time from the cut to the master's verdict and the slowest load in
// between are printed.
//
// Needs root for the namespaces; elsewhere it prints "NETNS SKIPPED: why"
// and passes.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/eventually.h"
#include "common/mutex.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/netns/virtual_network.h"
#include "tests/netns_daemons.h"

namespace hymcache {
namespace {

using testing::Daemon;
using testing::TempDir;
using testing::VirtualNetwork;

constexpr int kStorageHosts = 4;
constexpr int kEngineHosts = 2;
constexpr int kConversations = 24;  // per engine
constexpr size_t kBlock = 16 * 1024;
// The lost host: storage node s1.
constexpr int kLost = 1;
// Host indexes: 0 the master, 1..4 storage, 5..6 engines.
constexpr int kMasterHost = 0;
int StorageHost(int i) { return 1 + i; }
int EngineHost(int i) { return 1 + kStorageHosts + i; }
// A load's deadline; the master declares a node dead after 3 s of silence.
constexpr absl::Duration kLoadDeadline = absl::Seconds(2);
// How late past its deadline a load may return (a loaded machine, tsan).
constexpr absl::Duration kLoadSlack = absl::Seconds(3);
// Loads per loader after the master's verdict.
constexpr int kLoadsAfterVerdict = 40;

std::vector<uint8_t> BlockBytes(int e, int c, int b) {
  std::vector<uint8_t> out(kBlock);
  std::mt19937 rng(static_cast<uint32_t>(e * 1000003 + c * 1009 + b));
  for (auto& x : out) x = static_cast<uint8_t>(rng());
  return out;
}
std::string BlockKey(int e, int c, int b) {
  return absl::StrCat("loss-e", e, "-c", c, "-b", b);
}

// A stored chain: the node of each of its blocks.
struct Chain {
  int engine = 0;
  int conversation = 0;
  std::vector<uint32_t> nodes;
};

// Stores `kConversations` chains through `client`; each turn one Store.
absl::Status StoreChains(Client& client, int e, std::vector<Chain>* out) {
  std::mt19937 rng(91 + e);
  for (int c = 0; c < kConversations; ++c) {
    Chain chain;
    chain.engine = e;
    chain.conversation = c;
    const int turns = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int t = 0; t < turns; ++t) {
      const int first = static_cast<int>(chain.nodes.size());
      const int n = std::uniform_int_distribution<int>(1, 4)(rng);
      std::vector<std::string> keys;
      std::vector<std::vector<uint8_t>> data;
      std::vector<ConstBuffer> bufs;
      for (int b = first; b < first + n; ++b) {
        keys.push_back(BlockKey(e, c, b));
        data.push_back(BlockBytes(e, c, b));
      }
      for (const auto& d : data) bufs.push_back({d.data(), d.size()});
      StoreOptions o;
      o.deadline = absl::Now() + absl::Seconds(20);
      if (first > 0) o.parent_key = BlockKey(e, c, first - 1);
      auto r = client.Store(keys, bufs, o)->Wait(o.deadline);
      if (!r.ok()) return r.status();
      if (r->stored != keys.size()) {
        return absl::InternalError(
            absl::StrCat(r->stored, " of ", keys.size(), " stored"));
      }
      chain.nodes.insert(chain.nodes.end(), n, r->node_id);
    }
    out->push_back(std::move(chain));
  }
  return absl::OkStatus();
}

// What the loaders saw, in the phases of the run.
struct Tally {
  Mutex mu;
  int loads ABSL_GUARDED_BY(mu) = 0;
  int loads_after_verdict ABSL_GUARDED_BY(mu) = 0;
  int failed ABSL_GUARDED_BY(mu) = 0;  // a Load that returned an error
  int late ABSL_GUARDED_BY(mu) = 0;    // returned past deadline + slack
  int wrong_blocks ABSL_GUARDED_BY(mu) = 0;
  // A chain without a block on the lost host that did not load whole.
  int unaffected_short ABSL_GUARDED_BY(mu) = 0;
  // After the verdict: a chain that lost a block, loaded other than its
  // prefix before that block.
  int affected_wrong_prefix ABSL_GUARDED_BY(mu) = 0;
  int affected_loads ABSL_GUARDED_BY(mu) = 0;  // during and after the loss
  // Loads after the cut that took at least half their deadline.
  int slow_after_cut ABSL_GUARDED_BY(mu) = 0;
  absl::Duration slowest ABSL_GUARDED_BY(mu);
  std::string first_error ABSL_GUARDED_BY(mu);
};

struct Run {
  std::vector<Chain> chains;
  uint32_t lost_node = 0;
  std::atomic<bool> cut{false};
  std::atomic<bool> verdict{false};
  std::atomic<bool> stop{false};
  Tally tally;
};

// Loads random chains until run->stop, checking each as the floor says.
void LoadLoop(Client& client, int seed, Run* run) {
  std::mt19937 rng(seed);
  while (!run->stop.load()) {
    const bool after_verdict = run->verdict.load();
    const bool cut = run->cut.load();
    const Chain& chain = run->chains[rng() % run->chains.size()];
    const int n = static_cast<int>(chain.nodes.size());
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> got(n, std::vector<uint8_t>(kBlock));
    std::vector<MutableBuffer> bufs;
    for (int b = 0; b < n; ++b) {
      keys.push_back(BlockKey(chain.engine, chain.conversation, b));
      bufs.push_back({got[b].data(), got[b].size()});
    }
    int expected = n;  // blocks before the first on the lost host
    for (int b = 0; b < n; ++b) {
      if (chain.nodes[b] == run->lost_node) {
        expected = b;
        break;
      }
    }
    LoadOptions o;
    const absl::Time start = absl::Now();
    o.deadline = start + kLoadDeadline;
    auto r = client.Load(keys, bufs, o);
    const absl::Duration took = absl::Now() - start;
    MutexLock l(&run->tally.mu);
    Tally& t = run->tally;
    ++t.loads;
    if (after_verdict) ++t.loads_after_verdict;
    t.slowest = std::max(t.slowest, took);
    if (took > kLoadDeadline + kLoadSlack) ++t.late;
    if (cut && took >= kLoadDeadline / 2) ++t.slow_after_cut;
    if (!r.ok()) {
      ++t.failed;
      if (t.first_error.empty()) t.first_error = r.status().ToString();
      continue;
    }
    for (size_t b = 0; b < r->loaded; ++b) {
      if (got[b] !=
          BlockBytes(chain.engine, chain.conversation, static_cast<int>(b))) {
        ++t.wrong_blocks;
      }
    }
    if (expected == n) {
      if (r->loaded != static_cast<size_t>(n)) {
        ++t.unaffected_short;
        if (t.first_error.empty()) {
          t.first_error =
              absl::StrCat("an unaffected chain loaded ", r->loaded, " of ", n,
                           ": ", r->stop_reason.ToString());
        }
      }
    } else if (cut) {
      ++t.affected_loads;
      if (after_verdict && r->loaded != static_cast<size_t>(expected)) {
        ++t.affected_wrong_prefix;
        if (t.first_error.empty()) {
          t.first_error =
              absl::StrCat("a chain that lost block ", expected, " loaded ",
                           r->loaded, ": ", r->stop_reason.ToString());
        }
      }
    }
  }
}

// One run on fresh daemons: store, load, cut s1's link, check; the link is
// restored at the end. The engines' clients skip an unresponsive node for
// `period` (zero: never, as before the mark existed).
void RunLoss(VirtualNetwork& net, absl::Duration period) {
  INFO("unresponsive_node_period " << absl::FormatDuration(period));
  const std::string dir =
      TempDir(absl::StrCat("host_loss_netns_", absl::ToInt64Seconds(period)));
  auto m = testing::StartMasterOn(
      net, kMasterHost, dir + "/master",
      {"--insecure", "--node_timeout_ms=3000", "--heartbeat_interval_ms=500"});
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  const std::string master = m->address;
  std::vector<Daemon> nodes;
  for (int i = 0; i < kStorageHosts; ++i) {
    auto d = testing::StartStorageOn(net, StorageHost(i), master,
                                     absl::StrCat("s", i),
                                     {"--insecure", "--dram_bytes=64M"});
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    nodes.push_back(std::move(d).value());
  }

  // Each engine on its host, with its own Client: store, then load.
  Run run;
  std::vector<std::unique_ptr<Client>> clients(kEngineHosts);
  std::vector<std::vector<Chain>> stored(kEngineHosts);
  std::vector<std::string> errors(kEngineHosts);
  {
    std::vector<std::thread> threads;
    for (int e = 0; e < kEngineHosts; ++e) {
      threads.emplace_back([&, e] {
        auto in = net.EnterHost(EngineHost(e));
        if (!in.ok()) {
          errors[e] = in.status().ToString();
          return;
        }
        ClientOptions co;
        co.master_address = master;
        co.unresponsive_node_period = period;
        auto c = Client::Create(co);
        if (!c.ok()) {
          errors[e] = c.status().ToString();
          return;
        }
        clients[e] = std::move(c).value();
        if (absl::Status s =
                testing::WaitForLiveNodes(*clients[e], kStorageHosts);
            !s.ok()) {
          errors[e] = s.ToString();
          return;
        }
        if (absl::Status s = StoreChains(*clients[e], e, &stored[e]); !s.ok()) {
          errors[e] = s.ToString();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int e = 0; e < kEngineHosts; ++e) {
    INFO("engine " << e << ": " << errors[e]);
    REQUIRE(errors[e].empty());
    run.chains.insert(run.chains.end(), stored[e].begin(), stored[e].end());
  }

  // The lost node's id, from the master's view.
  auto in_main = net.EnterHost(EngineHost(0));
  REQUIRE(in_main.ok());
  ClientOptions co;
  co.master_address = master;
  auto observer = Client::Create(co);
  REQUIRE(observer.ok());
  auto status = (*observer)->GetClusterStatus();
  REQUIRE(status.ok());
  for (const NodeStatus& n : status->nodes) {
    if (n.name == absl::StrCat("s", kLost)) run.lost_node = n.node_id;
  }
  REQUIRE(run.lost_node != 0);
  int affected = 0;
  for (const Chain& c : run.chains) {
    for (uint32_t n : c.nodes) {
      if (n == run.lost_node) {
        ++affected;
        break;
      }
    }
  }
  std::printf("host_loss_netns: %zu chains, %d with a block on s%d\n",
              run.chains.size(), affected, kLost);
  REQUIRE(affected > 0);
  REQUIRE(affected < static_cast<int>(run.chains.size()));

  std::vector<std::thread> loaders;
  for (int e = 0; e < kEngineHosts; ++e) {
    loaders.emplace_back([&, e] {
      auto in = net.EnterHost(EngineHost(e));
      if (!in.ok()) return;
      LoadLoop(*clients[e], 7 + e, &run);
    });
  }
  auto loads = [&] {
    MutexLock l(&run.tally.mu);
    return run.tally.loads;
  };
  auto after_verdict = [&] {
    MutexLock l(&run.tally.mu);
    return run.tally.loads_after_verdict;
  };
  // Some loads with every host up, then the cut.
  CHECK(testing::Eventually([&] { return loads() >= 40; }, absl::Seconds(60)));
  const absl::Time cut_at = absl::Now();
  run.cut.store(true);
  REQUIRE(net.CutLink(StorageHost(kLost)).ok());
  // The master's verdict: the node is no longer alive.
  absl::Time verdict_at;
  const bool dead = testing::Eventually(
      [&] {
        auto st = (*observer)->GetClusterStatus();
        if (!st.ok()) return false;
        for (const NodeStatus& n : st->nodes) {
          if (n.node_id == run.lost_node && !n.alive) return true;
        }
        return false;
      },
      absl::Seconds(60));
  verdict_at = absl::Now();
  run.verdict.store(true);
  CHECK(dead);
  CHECK(testing::Eventually(
      [&] { return after_verdict() >= kLoadsAfterVerdict * kEngineHosts; },
      absl::Seconds(120)));
  run.stop.store(true);
  for (auto& t : loaders) t.join();

  MutexLock l(&run.tally.mu);
  const Tally& t = run.tally;
  std::printf(
      "host_loss_netns: unresponsive_node_period=%s loads=%d (after the "
      "verdict %d) failed=%d late=%d "
      "wrong_blocks=%d unaffected_short=%d affected_loads=%d "
      "affected_wrong_prefix=%d slow_after_cut=%d cut_to_verdict_ms=%lld "
      "slowest_load_ms=%lld\n",
      absl::FormatDuration(period).c_str(), t.loads, t.loads_after_verdict,
      t.failed, t.late, t.wrong_blocks, t.unaffected_short, t.affected_loads,
      t.affected_wrong_prefix, t.slow_after_cut,
      static_cast<long long>(absl::ToInt64Milliseconds(verdict_at - cut_at)),
      static_cast<long long>(absl::ToInt64Milliseconds(t.slowest)));
  INFO("first error: " << t.first_error);
  CHECK(t.failed == 0);
  CHECK(t.late == 0);
  CHECK(t.wrong_blocks == 0);
  CHECK(t.unaffected_short == 0);
  CHECK(t.affected_wrong_prefix == 0);
  CHECK(t.affected_loads > 0);
  // One load per client waits for the silent node (two if one was already
  // waiting on it when the cut came, as the mark is per call).
  if (period > absl::ZeroDuration()) {
    CHECK(t.slow_after_cut <= 2 * kEngineHosts);
  }
  REQUIRE(net.RestoreLink(StorageHost(kLost)).ok());
}

TEST_CASE(
    "A storage host lost mid-load: loads end as hits or prefix misses, never "
    "errors or wrong bytes, and only chains that had a block there lose "
    "blocks") {
  std::vector<std::string> hosts = {"master"};
  for (int i = 0; i < kStorageHosts; ++i) hosts.push_back(absl::StrCat("s", i));
  for (int i = 0; i < kEngineHosts; ++i) hosts.push_back(absl::StrCat("e", i));
  auto net = testing::NetworkOrSkip(hosts);
  INFO(net.status().ToString());
  REQUIRE(net.ok());
  if (*net == nullptr) return;
  // The client's default, then without the mark, side by side.
  RunLoss(**net, ClientOptions().unresponsive_node_period);
  RunLoss(**net, absl::ZeroDuration());
}

}  // namespace
}  // namespace hymcache
