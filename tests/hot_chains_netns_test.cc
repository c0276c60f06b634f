// Issue 32's floors for hot chains on many hosts
// (tests/netns/virtual_network.h): 3 masters on 3 hosts (HA on a 3-member
// etcd on a host of its own, synchronous replication), 8 storage nodes on 8
// hosts and 4 engine hosts.
//
// The drain floor. Each engine stores its conversations (chains of 2-12
// blocks of 8 KiB, one Store each) and reads three in four of them (hot;
// the fourth is never read: cold). Then, while every engine loads its hot
// chains in a loop, hymctl (in-process, from the first master's host)
// drains storage node s0 with --copy=hot. Afterwards s0 is killed: every hot
// chain must still load whole, byte for byte, from the other nodes. The floor:
// 0 failed loads during the drain, and every hot chain of the drained node
// readable elsewhere afterwards.
//
// HYM_DRAIN_CHAINS sets the chains per engine: 100 by default (CI), more
// for the documented run:
//   bazel test -c opt //tests:hot_chains_netns_test --test_output=all
//     --test_arg='hymctl drain*' --test_env=HYM_DRAIN_CHAINS=400
//     --nocache_test_results
//     [--test_env=HYM_NETNS_LINK_LATENCY_US=250: 1 ms round trips]
//
// The hot-prefix floor. Two prefixes of 16 blocks that every session
// shares, one stored with StoreOptions::replicas 2 and one without, and on
// each engine host 24 sessions per prefix, each 4 blocks of its own after
// the prefix. Each storage host in turn is cut off (its link down) until
// the master finds it dead; every session then loads its chain, and the
// prefix's hit ratio (prefix blocks loaded over prefix blocks asked for) is
// compared with the one before the cut. The floor: with replicas 2, at
// most 2 points lower whichever host is lost. Run again with both prefixes
// stored without copies and the master's --auto_replica_branches=8: the
// first reads store copies of both, and the floor holds for both.
// Needs root for the namespaces; elsewhere it prints "NETNS SKIPPED: why"
// and passes.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/eventually.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tests/netns/virtual_network.h"
#include "tests/netns_daemons.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

using testing::Daemon;
using testing::VirtualNetwork;

constexpr int kStorageHosts = 8;
constexpr int kEngineHosts = 4;
constexpr size_t kBlock = 8 * 1024;
// 3 masters, etcd, the storage hosts, the engine hosts.
testing::NetnsLayout Layout() {
  return {.storage = kStorageHosts, .engines = kEngineHosts};
}
int MasterHost(int i) { return Layout().master_host(i); }
int StorageHost(int i) { return Layout().storage_host(i); }
int EngineHost(int i) { return Layout().engine_host(i); }

int ChainsPerEngine() {
  const char* v = std::getenv("HYM_DRAIN_CHAINS");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 100;
}

std::string BlockKey(int e, int c, int b) {
  return absl::StrCat("e", e, "-c", c, "-b", b);
}
std::vector<uint8_t> BlockBytes(int e, int c, int b) {
  std::vector<uint8_t> out(kBlock);
  std::mt19937 rng(static_cast<uint32_t>(e * 1000003 + c * 1009 + b));
  for (auto& x : out) x = static_cast<uint8_t>(rng());
  return out;
}
bool Hot(int c) { return c % 4 != 3; }

struct Engine {
  int id = 0;
  std::vector<int> blocks;  // per chain
  std::string error;
  // During the drain.
  std::atomic<int> loads{0}, failed{0}, wrong{0};

  // Loads chain `c` whole; false (and counted) if it is not.
  bool Load(Client& client, int c) {
    const int n = blocks[c];
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> got(n, std::vector<uint8_t>(kBlock));
    std::vector<MutableBuffer> bufs;
    for (int b = 0; b < n; ++b) {
      keys.push_back(BlockKey(id, c, b));
      bufs.push_back({got[b].data(), got[b].size()});
    }
    auto r = client.Load(keys, bufs);
    ++loads;
    bool whole = r.ok() && r->loaded == static_cast<size_t>(n);
    for (size_t b = 0; r.ok() && b < r->loaded; ++b) {
      if (got[b] != BlockBytes(id, c, static_cast<int>(b))) {
        ++wrong;
        whole = false;
      }
    }
    if (!whole) ++failed;
    return whole;
  }
};

// A counter of the masters' (the leader's: only it counts puts and reads;
// standbys that answer GetStats count 0), -1 when none answers.
double Counter(const testing::NetnsCluster& c, const std::string& name) {
  double most = -1;
  for (const std::string& a : c.masters.addresses) {
    auto st = testing::MasterStats(a);
    if (st.ok()) most = std::max(most, (*st)[name]);
  }
  return most;
}
testing::NetnsCluster StartCluster(
    VirtualNetwork& net, const std::string& name,
    const std::vector<std::string>& master_flags) {
  auto c = testing::StartClusterOn(net, Layout(), name, master_flags);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

TEST_CASE(
    "hymctl drain --copy=hot on 8 storage hosts under load: no load fails, "
    "and every hot chain of the drained node loads from the others after it "
    "is gone") {
  auto net_or = testing::NetworkOrSkip(Layout().HostNames());
  INFO(net_or.status().ToString());
  REQUIRE(net_or.ok());
  if (*net_or == nullptr) return;
  VirtualNetwork& net = **net_or;
  testing::NetnsCluster cluster =
      StartCluster(net, "drain_netns", {"--insecure"});
  const std::string master = cluster.master;
  std::vector<Daemon>& nodes = cluster.nodes;

  // Each engine on its host stores its chains, then reads the hot ones.
  const int chains = ChainsPerEngine();
  std::vector<Engine> engines(kEngineHosts);
  std::vector<std::unique_ptr<Client>> clients(kEngineHosts);
  std::vector<std::thread> threads;
  for (int e = 0; e < kEngineHosts; ++e) {
    threads.emplace_back([&, e] {
      Engine& en = engines[e];
      en.id = e;
      auto in = net.EnterHost(EngineHost(e));
      if (!in.ok()) {
        en.error = in.status().ToString();
        return;
      }
      ClientOptions co;
      co.master_address = master;
      auto c = Client::Create(co);
      if (!c.ok()) {
        en.error = c.status().ToString();
        return;
      }
      clients[e] = std::move(*c);
      if (absl::Status s =
              testing::WaitForLiveNodes(*clients[e], kStorageHosts);
          !s.ok()) {
        en.error = s.ToString();
        return;
      }
      std::mt19937 rng(31 + e);
      for (int k = 0; k < chains; ++k) {
        const int n = std::uniform_int_distribution<int>(2, 12)(rng);
        std::vector<std::string> keys;
        std::vector<std::vector<uint8_t>> data;
        std::vector<ConstBuffer> bufs;
        for (int b = 0; b < n; ++b) {
          keys.push_back(BlockKey(e, k, b));
          data.push_back(BlockBytes(e, k, b));
        }
        for (const auto& d : data) bufs.push_back({d.data(), d.size()});
        auto r = clients[e]->Put(keys, bufs);
        if (!r.ok() || r->stored != keys.size()) {
          en.error = r.ok() ? "not every block stored" : r.status().ToString();
          return;
        }
        en.blocks.push_back(n);
      }
      for (int k = 0; k < chains; ++k) {
        if (Hot(k) && !en.Load(*clients[e], k)) {
          en.error =
              absl::StrCat("chain ", k, " did not load before the drain");
          return;
        }
      }
      en.loads = en.failed = en.wrong = 0;
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (const Engine& en : engines) {
    INFO("engine " << en.id << ": " << en.error);
    REQUIRE(en.error.empty());
  }

  // Which hot chains have blocks on s0 (the node to drain).
  auto on_engine = net.EnterHost(EngineHost(0));
  REQUIRE(on_engine.ok());
  auto st = clients[0]->GetClusterStatus();
  REQUIRE(st.ok());
  uint32_t s0 = 0;
  for (const auto& n : st->nodes) {
    if (n.name == "s0") s0 = n.node_id;
  }
  REQUIRE(s0 != 0);
  int hot_on_s0 = 0, blocks_on_s0 = 0;
  for (Engine& en : engines) {
    for (int k = 0; k < chains; ++k) {
      std::vector<std::string> keys;
      for (int b = 0; b < en.blocks[k]; ++b)
        keys.push_back(BlockKey(en.id, k, b));
      auto look = clients[0]->BatchLookup(keys);
      REQUIRE(look.ok());
      bool on = false;
      for (const auto& l : look->locations) {
        if (l.node_id == s0) {
          on = true;
          ++blocks_on_s0;
        }
      }
      if (on && Hot(k)) ++hot_on_s0;
    }
  }
  REQUIRE(hot_on_s0 > 0);
  on_engine->reset();

  // Engines load their hot chains in a loop while s0 is drained.
  std::atomic<bool> stop{false};
  for (int e = 0; e < kEngineHosts; ++e) {
    threads.emplace_back([&, e] {
      auto in = net.EnterHost(EngineHost(e));
      if (!in.ok()) return;
      while (!stop.load()) {
        for (int k = 0; k < chains && !stop.load(); ++k) {
          if (Hot(k)) engines[e].Load(*clients[e], k);
        }
      }
    });
  }
  std::string copy_out;
  int rc = -1;
  absl::Duration took;
  {
    auto in = net.EnterHost(MasterHost(0));
    REQUIRE(in.ok());
    hymctl::Options o;
    o.master_address = master;
    o.json = true;
    o.drain_copy = "hot";
    o.timeout_seconds = 300;
    std::ostringstream os, es;
    const absl::Time start = absl::Now();
    rc = hymctl::Run(o, {"drain", "s0"}, os, es);
    took = absl::Now() - start;
    copy_out = os.str() + es.str();
  }
  stop = true;
  for (auto& t : threads) t.join();
  INFO(copy_out);
  REQUIRE(rc == 0);
  const nlohmann::json j =
      nlohmann::json::parse(copy_out.substr(0, copy_out.find('\n')));
  int loads = 0, failed = 0, wrong = 0;
  for (const Engine& en : engines) {
    loads += en.loads;
    failed += en.failed;
    wrong += en.wrong;
  }
  CHECK(failed == 0);
  CHECK(wrong == 0);
  CHECK(j["copy"]["failed"] == 0);
  CHECK(j["copy"]["copied"].get<int>() > 0);

  // s0 leaves (killed): every hot chain loads whole from the others.
  REQUIRE(nodes[0].Stop(SIGKILL).ok());
  int hot_loaded = 0, hot_missing = 0;
  {
    auto in = net.EnterHost(EngineHost(1));
    REQUIRE(in.ok());
    for (Engine& en : engines) {
      en.failed = en.wrong = 0;
      for (int k = 0; k < chains; ++k) {
        if (!Hot(k)) continue;
        if (en.Load(*clients[1], k)) {
          ++hot_loaded;
        } else {
          ++hot_missing;
        }
      }
      CHECK(en.wrong == 0);
    }
  }
  CHECK(hot_missing == 0);
  std::printf(
      "drain_netns: %d chains (%d hot) on %d storage hosts; s0 held %d blocks, "
      "%d hot chains; drain --copy=hot took %.2f s: %s; %d loads during it, "
      "%d failed, %d wrong; after s0 was killed %d of %d hot chains loaded "
      "whole\n",
      chains * kEngineHosts, chains * kEngineHosts * 3 / 4, kStorageHosts,
      blocks_on_s0, hot_on_s0, absl::ToDoubleSeconds(took),
      j["copy"].dump().c_str(), loads, failed, wrong, hot_loaded,
      hot_loaded + hot_missing);
}

// The hot-prefix case's blocks: 8 KiB from the key.
std::vector<uint8_t> KeyBytes(const std::string& key) {
  std::vector<uint8_t> out(kBlock);
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(key)));
  for (auto& x : out) x = static_cast<uint8_t>(rng());
  return out;
}
constexpr int kPrefixBlocks = 16;
constexpr int kOwnBlocks = 4;
constexpr int kSessions = 24;  // per prefix and engine
std::string PrefixKey(char prefix, int b) {
  return absl::StrCat(std::string(1, prefix), "-b", b);
}
std::vector<std::string> SessionKeys(char prefix, int e, int s) {
  std::vector<std::string> keys;
  for (int b = 0; b < kPrefixBlocks; ++b) keys.push_back(PrefixKey(prefix, b));
  for (int b = 0; b < kOwnBlocks; ++b) {
    keys.push_back(
        absl::StrCat("e", e, "-", std::string(1, prefix), s, "-b", b));
  }
  return keys;
}

// Blocks asked for and loaded, by part of the chain.
struct HitCount {
  int prefix_asked = 0, prefix_loaded = 0, own_asked = 0, own_loaded = 0;
  int wrong = 0;
  double PrefixRatio() const {
    return prefix_asked == 0 ? 0 : 100.0 * prefix_loaded / prefix_asked;
  }
  double OwnRatio() const {
    return own_asked == 0 ? 0 : 100.0 * own_loaded / own_asked;
  }
  void Add(const HitCount& o) {
    prefix_asked += o.prefix_asked;
    prefix_loaded += o.prefix_loaded;
    own_asked += o.own_asked;
    own_loaded += o.own_loaded;
    wrong += o.wrong;
  }
};

// The hot-prefix runs. Written: P stored with replicas 2, Q without. Auto:
// both stored without, and the master's --auto_replica_branches has their
// first reads store copies of them.
enum class Copies { kWritten, kAuto };
void HotPrefixRun(Copies copies) {
  const bool automatic = copies == Copies::kAuto;
  auto net_or = testing::NetworkOrSkip(Layout().HostNames());
  INFO(net_or.status().ToString());
  REQUIRE(net_or.ok());
  if (*net_or == nullptr) return;
  VirtualNetwork& net = **net_or;
  std::vector<std::string> flags = {"--insecure", "--node_timeout_ms=2000",
                                    "--heartbeat_interval_ms=500"};
  if (automatic) flags.push_back("--auto_replica_branches=8");
  testing::NetnsCluster cluster = StartCluster(
      net, automatic ? "auto_replica_netns" : "replica_netns", flags);
  const std::string master = cluster.master;

  // One client per engine host, made on it.
  std::vector<std::unique_ptr<Client>> clients(kEngineHosts);
  std::vector<std::string> errors(kEngineHosts);
  auto on_engines = [&](const std::function<void(int e)>& fn) {
    std::vector<std::thread> threads;
    for (int e = 0; e < kEngineHosts; ++e) {
      threads.emplace_back([&, e] {
        auto in = net.EnterHost(EngineHost(e));
        if (!in.ok()) {
          errors[e] = in.status().ToString();
          return;
        }
        fn(e);
      });
    }
    for (auto& t : threads) t.join();
    for (int e = 0; e < kEngineHosts; ++e) {
      INFO("engine " << e << ": " << errors[e]);
      REQUIRE(errors[e].empty());
    }
  };
  auto store = [](Client& client, const std::vector<std::string>& keys,
                  const std::string& parent, uint32_t replicas) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<ConstBuffer> bufs;
    for (const auto& k : keys) data.push_back(KeyBytes(k));
    for (const auto& d : data) bufs.push_back({d.data(), d.size()});
    StoreOptions o;
    o.parent_key = parent;
    o.replicas = replicas;
    o.deadline = absl::Now() + absl::Seconds(10);
    return client.Store(keys, bufs, o)->Wait();
  };
  on_engines([&](int e) {
    ClientOptions co;
    co.master_address = master;
    auto c = Client::Create(co);
    if (!c.ok()) {
      errors[e] = c.status().ToString();
      return;
    }
    clients[e] = std::move(*c);
    if (absl::Status s = testing::WaitForLiveNodes(*clients[e], kStorageHosts);
        !s.ok()) {
      errors[e] = s.ToString();
    }
  });
  // The two prefixes: P with a copy of every block (unless automatic), Q
  // without.
  const auto written_copies = [&](char prefix) {
    return !automatic && prefix == 'P';
  };
  {
    auto in = net.EnterHost(EngineHost(0));
    REQUIRE(in.ok());
    for (const char prefix : {'P', 'Q'}) {
      std::vector<std::string> keys;
      for (int b = 0; b < kPrefixBlocks; ++b)
        keys.push_back(PrefixKey(prefix, b));
      auto r = store(*clients[0], keys, "", written_copies(prefix) ? 2 : 1);
      REQUIRE(r.ok());
      REQUIRE(r->stored == keys.size());
      CHECK(r->replicated == (written_copies(prefix) ? keys.size() : 0u));
    }
  }
  on_engines([&](int e) {
    for (const char prefix : {'P', 'Q'}) {
      for (int s = 0; s < kSessions; ++s) {
        std::vector<std::string> keys = SessionKeys(prefix, e, s);
        keys.erase(keys.begin(), keys.begin() + kPrefixBlocks);
        auto r =
            store(*clients[e], keys, PrefixKey(prefix, kPrefixBlocks - 1), 1);
        if (!r.ok() || r->stored != keys.size()) {
          errors[e] = "a session's blocks were not stored";
          return;
        }
      }
    }
  });
  // Every session loads its chain once; the counts per prefix.
  auto measure = [&](HitCount* p, HitCount* q) {
    std::vector<HitCount> per(2 * kEngineHosts);
    on_engines([&](int e) {
      for (const char prefix : {'P', 'Q'}) {
        HitCount& h = per[2 * e + (prefix == 'P' ? 0 : 1)];
        for (int s = 0; s < kSessions; ++s) {
          const std::vector<std::string> keys = SessionKeys(prefix, e, s);
          std::vector<std::vector<uint8_t>> got(keys.size(),
                                                std::vector<uint8_t>(kBlock));
          std::vector<MutableBuffer> bufs;
          for (auto& g : got) bufs.push_back({g.data(), g.size()});
          auto r = clients[e]->Load(keys, bufs);
          const size_t loaded = r.ok() ? r->loaded : 0;
          for (size_t b = 0; b < loaded; ++b) {
            if (got[b] != KeyBytes(keys[b])) ++h.wrong;
          }
          h.prefix_asked += kPrefixBlocks;
          h.own_asked += kOwnBlocks;
          h.prefix_loaded +=
              static_cast<int>(std::min<size_t>(loaded, kPrefixBlocks));
          h.own_loaded += static_cast<int>(
              loaded > kPrefixBlocks ? loaded - kPrefixBlocks : 0);
        }
      }
    });
    *p = HitCount();
    *q = HitCount();
    for (int e = 0; e < kEngineHosts; ++e) {
      p->Add(per[2 * e]);
      q->Add(per[2 * e + 1]);
    }
  };
  HitCount base_p, base_q;
  measure(&base_p, &base_q);
  CHECK(base_p.PrefixRatio() == 100);
  CHECK(base_q.PrefixRatio() == 100);
  if (automatic) {
    // Those reads had the master ask for copies of both prefixes (each is
    // continued by 96 sessions): their readers store them in the
    // background.
    auto in = net.EnterHost(EngineHost(0));
    REQUIRE(in.ok());
    double stored = 0, asked = 0;
    CHECK(testing::Eventually(
        [&] {
          stored = Counter(cluster, "replicas_stored");
          asked = Counter(cluster, "auto_copies_asked");
          return stored >= 2 * kPrefixBlocks;
        },
        absl::Seconds(30)));
    std::printf(
        "replica_netns: automatic copies stored %.0f, reads asked %.0f\n",
        stored, asked);
  }

  // Where the prefixes' blocks and P's copies are.
  auto node_alive = [&](const std::string& name, bool alive) {
    auto in = net.EnterHost(EngineHost(0));
    return in.ok() && testing::Eventually(
                          [&] {
                            auto st = clients[0]->GetClusterStatus();
                            if (!st.ok()) return false;
                            for (const auto& n : st->nodes) {
                              if (n.name == name) return n.alive == alive;
                            }
                            return false;
                          },
                          absl::Seconds(30));
  };
  {
    auto in = net.EnterHost(EngineHost(0));
    REQUIRE(in.ok());
    auto st = clients[0]->GetClusterStatus();
    REQUIRE(st.ok());
    for (const char prefix : {'P', 'Q'}) {
      auto look = clients[0]->BatchLookup({PrefixKey(prefix, 0)});
      REQUIRE(look.ok());
      REQUIRE(look->hit_prefix == 1);
      for (const auto& n : st->nodes) {
        if (n.node_id == look->locations[0].node_id) {
          std::printf("replica_netns: prefix %c is on %s\n", prefix,
                      n.name.c_str());
        }
      }
    }
  }
  std::printf(
      "replica_netns: host lost | P (%s) prefix hit %% | Q (%s) prefix hit "
      "%% | own blocks hit %% | wrong bytes\n",
      automatic ? "automatic copies" : "replicas 2",
      automatic ? "automatic copies" : "none");
  for (int i = 0; i < kStorageHosts; ++i) {
    const std::string name = absl::StrCat("s", i);
    INFO("host " << name);
    REQUIRE(net.CutLink(StorageHost(i)).ok());
    REQUIRE(node_alive(name, false));
    HitCount p, q;
    measure(&p, &q);
    REQUIRE(net.RestoreLink(StorageHost(i)).ok());
    REQUIRE(node_alive(name, true));
    std::printf("replica_netns: %s | %.1f | %.1f | %.1f | %d\n", name.c_str(),
                p.PrefixRatio(), q.PrefixRatio(),
                (p.OwnRatio() + q.OwnRatio()) / 2, p.wrong + q.wrong);
    CHECK(p.wrong + q.wrong == 0);
    CHECK(base_p.PrefixRatio() - p.PrefixRatio() <= 2.0);
    if (automatic) CHECK(base_q.PrefixRatio() - q.PrefixRatio() <= 2.0);
  }
}

TEST_CASE(
    "A prefix every session shares, stored with replicas 2: losing any one "
    "storage host lowers its hit ratio by at most 2 points; without replicas "
    "losing its host loses it") {
  HotPrefixRun(Copies::kWritten);
}

TEST_CASE(
    "A prefix every session shares, copied by its first reads "
    "(auto_replica_branches); losing any one storage host lowers its hit "
    "ratio by at most 2 points") {
  HotPrefixRun(Copies::kAuto);
}

}  // namespace
}  // namespace hymcache
