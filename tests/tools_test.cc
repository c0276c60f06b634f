// hymctl and the demo workload against real daemons.
#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "client/client.h"
#include "common/eventually.h"
#include "proto/master.grpc.pb.h"
#include "tests/daemon.h"
#include "tools/demo/demo.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;

int Ctl(const std::string& master, std::vector<std::string> args,
        std::string* out, bool json = false, bool hex = false) {
  hymctl::Options o;
  o.master_address = master;
  o.json = json;
  o.hex_keys = hex;
  std::ostringstream os, es;
  int rc = hymctl::Run(o, args, os, es);
  *out = os.str() + es.str();
  return rc;
}

struct Small {
  std::string dir = TempDir("tools");
  MasterProcess master;
  StorageProcess node;
  explicit Small(std::vector<std::string> master_flags = {}) {
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0",
                                  std::move(master_flags));
    REQUIRE(m.ok());
    master = std::move(*m);
    auto s = StorageProcess::Start(master.address, "tools-node", {"--dram_bytes=134217728"});
    REQUIRE(s.ok());
    node = std::move(*s);
    std::string out;
    for (int i = 0; i < 300; ++i) {
      if (Ctl(master.address, {"status"}, &out, true) == 0 &&
          nlohmann::json::parse(out)["nodes"].size() == 1 &&
          nlohmann::json::parse(out)["nodes"][0]["alive"] == true) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL("node never registered: " << out);
  }
};

TEST_CASE("hymctl status, put, get, lookup, rm") {
  Small c;
  std::string out;
  int rc = Ctl(c.master.address, {"status"}, &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("tools-node") != std::string::npos);
  CHECK(out.find("alive") != std::string::npos);

  std::string in_file = c.dir + "/in.bin", out_file = c.dir + "/out.bin";
  std::string payload(300000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31);
  std::ofstream(in_file, std::ios::binary) << payload;

  REQUIRE(Ctl(c.master.address, {"put", "greeting", in_file}, &out) == 0);
  CHECK(out.find("stored greeting") != std::string::npos);
  REQUIRE(Ctl(c.master.address, {"put", "greeting", in_file}, &out) == 0);
  CHECK(out.find("already stored") != std::string::npos);

  REQUIRE(Ctl(c.master.address, {"get", "greeting", out_file}, &out) == 0);
  std::ifstream got(out_file, std::ios::binary);
  std::string back((std::istreambuf_iterator<char>(got)), std::istreambuf_iterator<char>());
  CHECK(back == payload);

  REQUIRE(Ctl(c.master.address, {"lookup", "greeting", "absent"}, &out, true) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["hit_prefix"] == 1);
  CHECK(j["results"][0]["found"] == true);
  CHECK(j["results"][0]["length"] == payload.size());
  CHECK(j["results"][1]["found"] == false);

  // Hex keys name the same bytes.
  REQUIRE(Ctl(c.master.address, {"lookup", "6772656574696e67"}, &out, true, true) == 0);
  CHECK(nlohmann::json::parse(out)["hit_prefix"] == 1);
  CHECK(Ctl(c.master.address, {"lookup", "zz"}, &out, false, true) == 2);

  REQUIRE(Ctl(c.master.address, {"status"}, &out, true) == 0);
  j = nlohmann::json::parse(out);
  CHECK(j["objects"] == 1);
  // Every cluster stat under its name (common/cluster_stats.h).
  CHECK(j["object_count"] == 1);
  CHECK(j["nodes_alive"] == 1);
  CHECK(j["reconcile_unlisted_extents"] == 0);
  CHECK(j["nodes"][0]["used_bytes"].get<uint64_t>() >= payload.size());
  // One node holds everything: the largest over the mean is 1.
  CHECK(j["placement_imbalance"].get<double>() == 1.0);
  REQUIRE(Ctl(c.master.address, {"status"}, &out) == 0);
  CHECK(out.find("placement: imbalance 1.00") != std::string::npos);

  REQUIRE(Ctl(c.master.address, {"rm", "greeting"}, &out) == 0);
  CHECK(out.find("yes") != std::string::npos);
  CHECK(Ctl(c.master.address, {"get", "greeting", out_file}, &out) == 1);
  CHECK(out.find("not stored") != std::string::npos);

  // Per-node counters from the nodes' control services.
  REQUIRE(Ctl(c.master.address, {"stats"}, &out, true) == 0);
  j = nlohmann::json::parse(out);
  REQUIRE(j["nodes"].size() == 1);
  CHECK(j["nodes"][0]["write_ops"].get<uint64_t>() >= 1);
  CHECK(j["nodes"][0]["device"]["capacity_bytes"].get<double>() == 134217728.0);
  REQUIRE(Ctl(c.master.address, {"stats"}, &out) == 0);
  CHECK(out.find("device.capacity_bytes") != std::string::npos);

  // Usage errors.
  CHECK(Ctl(c.master.address, {}, &out) == 2);
  CHECK(Ctl(c.master.address, {"frobnicate"}, &out) == 2);
  CHECK(Ctl(c.master.address, {"put", "k"}, &out) == 2);
  CHECK(Ctl(c.master.address, {"put", "k", c.dir + "/missing"}, &out) == 1);
}

TEST_CASE("hymctl fsck finds and repairs listings and extents that disagree") {
  // Without node-confirmed commits (a cluster whose nodes predate write
  // receipts), so that a commit of bytes never written makes a listing no
  // node holds for fsck to find.
  Small c({"--require_write_receipts=false"});
  std::string out;
  REQUIRE(Ctl(c.master.address, {"fsck", "--settle=0.2"}, &out) == 0);
  INFO(out);
  CHECK(out.find("clean") != std::string::npos);

  // Five good objects.
  for (int i = 0; i < 5; ++i) {
    const std::string f = c.dir + "/obj" + std::to_string(i);
    std::ofstream(f) << std::string(5000 + i, static_cast<char>('a' + i));
    REQUIRE(Ctl(c.master.address, {"put", "good" + std::to_string(i), f}, &out) == 0);
  }
  // Listed but missing: committed, never written.
  auto stub = v1::MasterService::NewStub(
      grpc::CreateChannel(c.master.address, grpc::InsecureChannelCredentials()));
  v1::PutStartRequest start;
  start.add_keys("ghost");
  start.add_lengths(4096);
  v1::PutStartResponse slots;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->PutStart(&ctx, start, &slots).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::PutCommitRequest commit;
    commit.set_put_id(slots.put_id());
    v1::PutCommitResponse resp;
    REQUIRE(stub->PutCommit(&ctx, commit, &resp).ok());
  }
  // Present but unlisted: the master forgets a written object (the node
  // still holds its extent).
  REQUIRE(Ctl(c.master.address, {"rm", "good4"}, &out) == 0);

  REQUIRE(Ctl(c.master.address, {"fsck", "--settle=0.2"}, &out, true) == 1);
  auto j = nlohmann::json::parse(out);
  CHECK(j["consistent"] == false);
  CHECK(j["listed"] == 5);   // good0..3 + ghost
  CHECK(j["matched"] == 4);
  REQUIRE(j["findings"].size() == 2);
  std::set<std::string> kinds;
  for (const auto& f : j["findings"]) kinds.insert(f["kind"].get<std::string>());
  CHECK(kinds == std::set<std::string>{"listed_missing", "unlisted"});
  for (const auto& f : j["findings"]) {
    if (f["kind"] == "listed_missing") CHECK(f["key"] == "ghost");
  }

  // Repair: the ghost listing is dropped, the unlisted extent freed.
  REQUIRE(Ctl(c.master.address, {"fsck", "--repair", "--settle=0.2"}, &out, true) == 0);
  j = nlohmann::json::parse(out);
  CHECK(j["repair"]["listings_dropped"] == 1);
  CHECK(j["repair"]["nodes_reconciled"] == 1);
  CHECK(j["repair"]["remaining"] == 0);
  REQUIRE(Ctl(c.master.address, {"fsck", "--settle=0.2"}, &out) == 0);
  // The good objects are untouched; the ghost key can be stored for real.
  for (int i = 0; i < 4; ++i) {
    const std::string f = c.dir + "/back" + std::to_string(i);
    REQUIRE(Ctl(c.master.address, {"get", "good" + std::to_string(i), f}, &out) == 0);
    std::ifstream in(f);
    std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(got == std::string(5000 + i, static_cast<char>('a' + i)));
  }
  const std::string g = c.dir + "/ghost";
  std::ofstream(g) << std::string(4096, 'g');
  REQUIRE(Ctl(c.master.address, {"put", "ghost", g}, &out) == 0);
  CHECK(out.find("stored ghost") != std::string::npos);
}

// The blocks of chain `c` of the drain test: 8 of 64 KiB, each's bytes its
// own.
std::vector<std::string> DrainChainKeys(int c) {
  std::vector<std::string> keys;
  for (int b = 0; b < 8; ++b) {
    keys.push_back("chain" + std::to_string(c) + "/b" + std::to_string(b));
  }
  return keys;
}
std::string DrainBlock(const std::string& key) {
  std::string bytes(64 << 10, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(key[i % key.size()] + i / 4096);
  }
  return bytes;
}
// Puts chain `c` (every block) with a plain Put.
absl::StatusOr<PutResult> PutDrainChain(Client* client, int c) {
  const std::vector<std::string> keys = DrainChainKeys(c);
  std::vector<std::string> bytes;
  for (const auto& k : keys) bytes.push_back(DrainBlock(k));
  std::vector<ConstBuffer> from;
  for (const auto& b : bytes) from.push_back({b.data(), b.size()});
  return client->Put(keys, from);
}
// Loads chain `c` whole and checks every byte; the blocks loaded.
size_t LoadDrainChain(Client* client, int c) {
  const std::vector<std::string> keys = DrainChainKeys(c);
  std::vector<std::string> got(keys.size(), std::string(64 << 10, '\0'));
  std::vector<MutableBuffer> into;
  for (std::string& g : got) into.push_back({g.data(), g.size()});
  auto r = client->Load(keys, into);
  if (!r.ok()) return 0;
  for (size_t b = 0; b < r->loaded; ++b) {
    if (got[b] != DrainBlock(keys[b])) return 0;  // wrong bytes
  }
  return r->loaded;
}

// A master and a Client; storage nodes (64 MiB) join one by one.
struct GrowingCluster {
  std::string dir;
  MasterProcess master;
  std::vector<StorageProcess> nodes;
  std::unique_ptr<Client> client;
  explicit GrowingCluster(const std::string& name,
                          std::vector<std::string> master_flags = {})
      : dir(TempDir(name)) {
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0",
                                  std::move(master_flags));
    REQUIRE(m.ok());
    master = std::move(*m);
    ClientOptions co;
    co.master_address = master.address;
    auto c = Client::Create(co);
    REQUIRE(c.ok());
    client = std::move(*c);
  }
  // Starts node `name` and waits until every node is alive; its node id.
  uint32_t AddNode(const std::string& name) {
    auto n =
        StorageProcess::Start(master.address, name, {"--dram_bytes=67108864"});
    REQUIRE(n.ok());
    nodes.push_back(std::move(*n));
    std::string out;
    REQUIRE(testing::Eventually([&] {
      return Ctl(master.address, {"status"}, &out, true) == 0 &&
             nlohmann::json::parse(out)["nodes_alive"] == nodes.size();
    }));
    const nlohmann::json status = nlohmann::json::parse(out);
    for (const auto& n : status["nodes"]) {
      if (n["name"] == name) return n["node_id"].get<uint32_t>();
    }
    FAIL("node " << name << " not listed: " << out);
    return 0;
  }
};

TEST_CASE(
    "hymctl drain --copy moves a node's hot chains elsewhere under load, and "
    "they outlive it") {
  GrowingCluster cluster("drain_copy");
  cluster.AddNode("old");
  // Six chains on the old node, the only one yet; chains 0-2 are read
  // (hot), 3-5 never.
  REQUIRE(testing::Eventually([&] {
    auto put = PutDrainChain(cluster.client.get(), 0);
    return put.ok() && put->stored == 8;
  }));
  for (int c = 1; c < 6; ++c) {
    auto put = PutDrainChain(cluster.client.get(), c);
    REQUIRE(put.ok());
    REQUIRE(put->stored == 8);
  }
  for (int c = 0; c < 3; ++c)
    REQUIRE(LoadDrainChain(cluster.client.get(), c) == 8);
  const uint32_t new_id = cluster.AddNode("new");

  // Readers load the hot chains throughout the drain.
  std::atomic<bool> stop{false};
  std::atomic<int> loads{0}, failed_loads{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (int c = 0; c < 3; ++c) {
        ++loads;
        if (LoadDrainChain(cluster.client.get(), c) != 8) ++failed_loads;
      }
    }
  });
  hymctl::Options o;
  o.master_address = cluster.master.address;
  o.json = true;
  o.drain_copy = "hot";
  o.hot_within_seconds = 600;
  std::ostringstream os, es;
  const int rc = hymctl::Run(o, {"drain", "old"}, os, es);
  // Loads after the copy too: the listings now name the new node.
  const int loads_at_copy = loads.load();
  REQUIRE(
      testing::Eventually([&] { return loads.load() > loads_at_copy + 6; }));
  stop = true;
  reader.join();
  INFO(os.str() << es.str());
  REQUIRE(rc == 0);
  auto j = nlohmann::json::parse(os.str());
  CHECK(j["copy"]["listed"] == 48);
  CHECK(j["copy"]["chosen"] == 24);
  CHECK(j["copy"]["copied"] == 24);
  CHECK(j["copy"]["copied_bytes"] == 24 * (64 << 10));
  CHECK(j["copy"]["let_go"] == 24);
  CHECK(j["copy"]["failed"] == 0);
  CHECK(j["objects"] == 24);
  CHECK(loads.load() > 6);
  CHECK(failed_loads.load() == 0);

  // The old node leaves (killed): the hot chains are all still there, on
  // the new node; the cold ones were let go.
  REQUIRE(cluster.nodes[0].daemon.Stop(SIGKILL).ok());
  for (int c = 0; c < 3; ++c) {
    INFO("chain " << c);
    auto look = cluster.client->BatchLookup(DrainChainKeys(c));
    REQUIRE(look.ok());
    CHECK(look->hit_prefix == 8);
    for (const auto& l : look->locations) CHECK(l.node_id == new_id);
    CHECK(LoadDrainChain(cluster.client.get(), c) == 8);
  }
}

TEST_CASE("hymctl rebalance moves the hottest chains onto a node that joined") {
  GrowingCluster cluster("rebalance");
  cluster.AddNode("first");
  // Eight chains of 512 KiB on the only node; chains 4-7 are read last
  // (the hottest).
  for (int c = 0; c < 8; ++c) {
    REQUIRE(testing::Eventually([&] {
      auto put = PutDrainChain(cluster.client.get(), c);
      return put.ok() && put->stored + put->skipped == 8;
    }));
  }
  for (int c = 0; c < 8; ++c)
    REQUIRE(LoadDrainChain(cluster.client.get(), c) == 8);
  std::string out;
  CHECK(Ctl(cluster.master.address, {"rebalance"}, &out) == 0);
  CHECK(out.find("balanced") != std::string::npos);

  cluster.AddNode("second");
  REQUIRE(Ctl(cluster.master.address, {"rebalance"}, &out, true) == 0);
  INFO(out);
  const nlohmann::json j = nlohmann::json::parse(out);
  REQUIRE(j["moved"].size() == 1);
  CHECK(j["moved"][0]["name"] == "first");
  CHECK(j["moved"][0]["copy"]["copied"] == 32);  // half: four chains
  CHECK(j["moved"][0]["copy"]["failed"] == 0);
  CHECK(j["moved"][0]["copy"]["max_bytes_reached"] == true);
  const uint32_t first_id = j["moved"][0]["node_id"].get<uint32_t>();
  // The hottest four moved, whole; every chain still loads.
  for (int c = 0; c < 8; ++c) {
    INFO("chain " << c);
    auto look = cluster.client->BatchLookup(DrainChainKeys(c));
    REQUIRE(look.ok());
    REQUIRE(look->hit_prefix == 8);
    for (const auto& l : look->locations) {
      CHECK((l.node_id == first_id) == (c < 4));
    }
    CHECK(LoadDrainChain(cluster.client.get(), c) == 8);
  }
  REQUIRE(Ctl(cluster.master.address, {"rebalance"}, &out, true) == 0);
  CHECK(nlohmann::json::parse(out)["moved"].empty());
}

TEST_CASE(
    "A tenant's replication factor gives every block its clients store a copy "
    "that outlives the block's node") {
  GrowingCluster cluster("tenant_replicas", {"--node_timeout_ms=2000",
                                             "--heartbeat_interval_ms=500"});
  cluster.AddNode("n1");
  cluster.AddNode("n2");
  std::string out;
  CHECK(Ctl(cluster.master.address, {"tenant", "set-replicas", "default", "3"},
            &out) == 1);
  REQUIRE(Ctl(cluster.master.address,
              {"tenant", "set-replicas", "default", "2"}, &out) == 0);
  REQUIRE(Ctl(cluster.master.address, {"tenant", "list"}, &out, true) == 0);
  CHECK(nlohmann::json::parse(out)["tenants"][0]["replicas"] == 2);

  // A plain Put: the client makes the copies because the master says so.
  const std::vector<std::string> keys = DrainChainKeys(0);
  auto put = PutDrainChain(cluster.client.get(), 0);
  REQUIRE(put.ok());
  CHECK(put->stored == keys.size());
  CHECK(put->replicated == keys.size());
  // The node holding the blocks dies: the copies serve the whole chain.
  auto look = cluster.client->BatchLookup(keys);
  REQUIRE(look.ok());
  REQUIRE(look->hit_prefix == keys.size());
  const uint32_t holder = look->locations[0].node_id;
  REQUIRE(Ctl(cluster.master.address, {"status"}, &out, true) == 0);
  int victim = -1;
  const nlohmann::json status = nlohmann::json::parse(out);
  for (const auto& n : status["nodes"]) {
    if (n["node_id"] == holder) victim = n["name"] == "n1" ? 0 : 1;
  }
  REQUIRE(victim >= 0);
  REQUIRE(cluster.nodes[victim].daemon.Stop(SIGKILL).ok());
  REQUIRE(testing::Eventually([&] {
    return Ctl(cluster.master.address, {"status"}, &out, true) == 0 &&
           nlohmann::json::parse(out)["nodes_alive"] == 1;
  }));
  look = cluster.client->BatchLookup(keys);
  REQUIRE(look.ok());
  CHECK(look->hit_prefix == keys.size());
  for (const auto& l : look->locations) CHECK(l.node_id != holder);
  CHECK(LoadDrainChain(cluster.client.get(), 0) == 8);
}

TEST_CASE("the demo workload reuses prefixes and verifies every byte") {
  Small c;
  demo::DemoOptions o;
  o.master_address = c.master.address;
  o.conversations = 2;
  o.turns = 3;
  o.block_tokens = 64;
  o.tokens_per_turn = 128;
  o.block_bytes = 64 << 10;
  std::ostringstream out;
  absl::Status s = demo::Run(o, out);
  INFO(out.str());
  REQUIRE(s.ok());
  // Turn 1 stores 2 blocks per conversation, turn 2 reuses them and adds 4,
  // turn 3 reuses 6 and adds 4: 2*(0+2+6) = 16 of 2*(2+6+10) = 36 loaded.
  CHECK(out.str().find("36 blocks needed, 16 loaded") != std::string::npos);
}

}  // namespace
}  // namespace hymcache
