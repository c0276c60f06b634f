// End-to-end tests: the real hymcache-master and hymcache-storage binaries on
// loopback (port 0), driven through the client SDK and raw protocol calls.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/block_key.h"
#include "client/client.h"
#include "client/tcp_transport.h"
#include "common/eventually.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_reason.h"
#include "common/wire.h"
#include "proto/master.grpc.pb.h"
#include "proto/storage.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::Eventually;
using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;
namespace pb = ::hymcache::v1;

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

std::vector<std::string> Keys(size_t n, const std::string& model = "m") {
  KeyNamespace ns;
  ns.model = model;
  BlockKeyBuilder b(ns, 16);
  std::vector<int32_t> tokens(n * 16);
  std::iota(tokens.begin(), tokens.end(), 1);
  return b.Keys(tokens);
}

std::unique_ptr<Client> NewClient(const std::string& master,
                                  const std::string& host = "") {
  ClientOptions o;
  o.master_address = master;
  o.host = host;
  auto c = Client::Create(o);
  REQUIRE(c.ok());
  return std::move(*c);
}

// Waits until the master reports `alive` live nodes.
void WaitForNodes(Client& c, size_t alive) {
  absl::Status s = testing::WaitForLiveNodes(c, alive);
  INFO(s.ToString());
  REQUIRE(s.ok());
}

struct Blocks {
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
  std::vector<ConstBuffer> in() const {
    std::vector<ConstBuffer> v;
    for (const auto& d : data) v.push_back({d.data(), d.size()});
    return v;
  }
};

Blocks MakeBlocks(const std::vector<std::string>& keys,
                  const std::vector<size_t>& sizes, uint32_t seed) {
  Blocks b;
  b.keys = keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    b.data.push_back(Bytes(sizes[i % sizes.size()], seed + i));
  }
  return b;
}

// Gets every key into fresh buffers and checks the loaded prefix byte for byte.
LoadResult GetAndVerify(Client& c, const Blocks& b, size_t slack = 0) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<MutableBuffer> bufs;
  for (const auto& d : b.data) out.emplace_back(d.size() + slack, 0xEE);
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto r = c.Get(b.keys, bufs);
  REQUIRE(r.ok());
  REQUIRE(r->lengths.size() == r->loaded);
  for (size_t i = 0; i < r->loaded; ++i) {
    INFO("block " << i);
    REQUIRE(r->lengths[i] == b.data[i].size());
    REQUIRE(std::memcmp(out[i].data(), b.data[i].data(), b.data[i].size()) == 0);
  }
  return *r;
}

struct Cluster {
  std::string dir = TempDir("cluster");
  MasterProcess master;
  std::vector<StorageProcess> nodes;
  std::unique_ptr<Client> client;

  explicit Cluster(int n_nodes, std::vector<std::string> master_flags = {}) {
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0", master_flags);
    REQUIRE(m.ok());
    master = std::move(*m);
    for (int i = 0; i < n_nodes; ++i) AddNode(absl::StrCat("node-", i));
    client = NewClient(master.address);
    WaitForNodes(*client, nodes.size());
    for (const StorageProcess& n : nodes) WaitRegistered(n);
  }
  // The master lists a node alive as soon as it answers its registration;
  // the node applies the answer (its key, its generation ceiling) a moment
  // later, and refuses writes until then.
  static void WaitRegistered(const StorageProcess& n) {
    auto stub = v1::StorageControl::NewStub(grpc::CreateChannel(
        n.control_address, grpc::InsecureChannelCredentials()));
    const bool registered = Eventually(
        [&] {
          grpc::ClientContext ctx;
          v1::StorageStatsResponse stats;
          return stub->GetStats(&ctx, v1::StorageStatsRequest(), &stats).ok() &&
                 stats.registered();
        },
        absl::Seconds(30));
    if (!registered) {
      FAIL("node " << n.control_address << " never applied its registration");
    }
  }
  void AddNode(const std::string& name, const std::string& host = "") {
    std::vector<std::string> flags = {"--dram_bytes=268435456"};
    if (!host.empty()) flags.push_back("--host=" + host);
    auto s = StorageProcess::Start(master.address, name, flags);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    nodes.push_back(std::move(*s));
  }
};

// The master's counters (GetStats); fails the test if it does not answer.
std::map<std::string, double> Stats(const Cluster& c) {
  auto st = testing::MasterStats(c.master.address);
  INFO(st.status().ToString());
  REQUIRE(st.ok());
  return *st;
}

TEST_CASE("a put longer than one master RPC is still one chain") {
  Cluster c(1);
  ClientOptions o;
  o.master_address = c.master.address;
  o.max_keys_per_rpc = 2;
  o.lookup_batch_keys = 2;
  auto client = Client::Create(o);
  REQUIRE(client.ok());
  auto keys = Keys(5, "chunked");
  Blocks b = MakeBlocks(keys, {4096}, 3);
  auto put = (*client)->Put(b.keys, b.in());
  REQUIRE(put.ok());
  REQUIRE(put->stored == 5);
  // The chunks link up: removing the second block takes every block after
  // it, across the chunk boundaries (the master cascades to unreachable
  // blocks).
  REQUIRE((*(*client)->Remove({keys[1]}))[0]);
  auto st = (*client)->GetClusterStatus();
  REQUIRE(st.ok());
  CHECK(st->object_count == 1);
  CHECK(GetAndVerify(**client, b).loaded == 1);
}

TEST_CASE("put, lookup and get round-trip byte for byte with prefix semantics") {
  Cluster c(1);
  auto keys = Keys(8);
  Blocks all = MakeBlocks(keys, {1, 4095, 4096, (1 << 20) + 7, 16 << 20, 3, 100000, 65536}, 7);

  Blocks first5;
  first5.keys.assign(keys.begin(), keys.begin() + 5);
  first5.data.assign(all.data.begin(), all.data.begin() + 5);
  auto put = c.client->Put(first5.keys, first5.in());
  REQUIRE(put.ok());
  CHECK(put->stored == 5);
  CHECK(put->failed == 0);

  auto look = c.client->BatchLookup(keys);
  REQUIRE(look.ok());
  CHECK(look->hit_prefix == 5);
  for (size_t i = 0; i < 8; ++i) CHECK(look->found[i] == (i < 5));
  CHECK(look->locations[4].length == (16u << 20));

  LoadResult got = GetAndVerify(*c.client, all, /*slack=*/3);
  CHECK(got.loaded == 5);
  CHECK(got.hit_prefix == 5);
  CHECK(got.stop_reason.code() == absl::StatusCode::kNotFound);

  // Storing again writes nothing.
  auto again = c.client->Put(first5.keys, first5.in());
  REQUIRE(again.ok());
  CHECK(again->skipped == 5);
  CHECK(again->stored == 0);

  // A hole: blocks 6 and 7 stored, block 5 not. The reusable prefix stays 5.
  Blocks tail;
  tail.keys = {keys[6], keys[7]};
  tail.data = {all.data[6], all.data[7]};
  REQUIRE(c.client->Put(tail.keys, tail.in())->stored == 2);
  CHECK(c.client->BatchLookup(keys)->hit_prefix == 5);
  CHECK(GetAndVerify(*c.client, all).loaded == 5);

  // Filling the hole makes the whole chain loadable.
  Blocks hole;
  hole.keys = {keys[5]};
  hole.data = {all.data[5]};
  REQUIRE(c.client->Put(hole.keys, hole.in())->stored == 1);
  got = GetAndVerify(*c.client, all);
  CHECK(got.loaded == 8);
  CHECK(got.stop_reason.ok());

  // A buffer too small stops the load there.
  {
    std::vector<std::vector<uint8_t>> out;
    std::vector<MutableBuffer> bufs;
    for (const auto& d : all.data) out.emplace_back(d.size());
    out[3].resize(10);
    for (auto& o : out) bufs.push_back({o.data(), o.size()});
    auto r = c.client->Get(keys, bufs);
    REQUIRE(r.ok());
    CHECK(r->loaded == 3);
    CHECK(r->stop_reason.code() == absl::StatusCode::kOutOfRange);
  }

  // Remove cuts the prefix.
  auto rm = c.client->Remove({keys[2]});
  REQUIRE(rm.ok());
  CHECK((*rm)[0]);
  CHECK_FALSE((*c.client->Remove({keys[2]}))[0]);
  CHECK(GetAndVerify(*c.client, all).loaded == 2);

  // Keys are namespaced: the same tokens under another model miss.
  CHECK(c.client->BatchLookup(Keys(8, "other-model"))->hit_prefix == 0);

  // The blocks after keys[2] in the chain it was put with (keys[3..4]) were
  // unreachable and went with it; keys[5..7] were put as chains of their own.
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  CHECK(st->object_count == 5);
  REQUIRE(st->nodes.size() == 1);
  CHECK(st->nodes[0].object_count == 5);
  CHECK(st->nodes[0].used_bytes > 0);
}

TEST_CASE("placement: one request on one node, successive requests spread") {
  Cluster c(2);
  auto keys = Keys(24);
  std::set<uint32_t> nodes_used;
  for (int r = 0; r < 6; ++r) {
    std::vector<std::string> k(keys.begin() + r * 4, keys.begin() + r * 4 + 4);
    Blocks b = MakeBlocks(k, {64 << 10}, r * 10);
    auto put = c.client->Put(b.keys, b.in());
    REQUIRE(put.ok());
    REQUIRE(put->stored == 4);
    auto look = c.client->BatchLookup(k);
    REQUIRE(look.ok());
    REQUIRE(look->hit_prefix == 4);
    for (const auto& l : look->locations) CHECK(l.node_id == put->node_id);
    nodes_used.insert(put->node_id);
    CHECK(GetAndVerify(*c.client, b).loaded == 4);
  }
  CHECK(nodes_used.size() == 2);
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  for (const auto& n : st->nodes) CHECK(n.object_count > 0);
}

TEST_CASE("master kill -9 and restart keeps every committed key readable") {
  Cluster c(1);
  auto keys = Keys(20);
  Blocks b = MakeBlocks(keys, {200 << 10, 3000}, 99);
  auto put = c.client->Put(b.keys, b.in());
  REQUIRE(put.ok());
  REQUIRE(put->stored == 20);

  REQUIRE(c.master.daemon.Stop(SIGKILL).ok());
  CHECK_FALSE(c.client->BatchLookup(keys).ok());  // master is down

  auto m = MasterProcess::Start(c.dir + "/master", c.master.address);
  REQUIRE(m.ok());
  c.master = std::move(*m);
  // The restarted master serves the node's objects once the node has
  // registered with it again and reconciled (within a heartbeat or two).
  WaitForNodes(*c.client, 1);
  auto look = c.client->BatchLookup(keys);
  REQUIRE(look.ok());
  CHECK(look->hit_prefix == 20);
  CHECK(GetAndVerify(*c.client, b).loaded == 20);

  // The node keeps heartbeating to the new master; new writes work and get
  // newer generations than anything before the crash.
  uint64_t max_gen = 0;
  for (const auto& l : look->locations) max_gen = std::max(max_gen, l.generation);
  auto more = Keys(24);
  Blocks b2 = MakeBlocks({more[20], more[21]}, {5000}, 5);
  REQUIRE(c.client->Put(b2.keys, b2.in())->stored == 2);
  auto l2 = c.client->BatchLookup(b2.keys);
  REQUIRE(l2.ok());
  for (const auto& l : l2->locations) CHECK(l.generation > max_gen);
  CHECK(GetAndVerify(*c.client, b2).loaded == 2);
}

TEST_CASE("a master that lost its database starts over cleanly") {
  Cluster c(1);
  auto keys = Keys(40);
  Blocks old_blocks = MakeBlocks({keys.begin(), keys.begin() + 20}, {100000}, 1);
  REQUIRE(c.client->Put(old_blocks.keys, old_blocks.in())->stored == 20);

  // The metadata is gone (disk replaced, directory wiped); the node keeps
  // running with the old objects' extents, whose generations are higher
  // than anything the new master will issue for a while.
  REQUIRE(c.master.daemon.Stop(SIGKILL).ok());
  std::string rm = "rm -rf '" + c.dir + "/master'";
  REQUIRE(system(rm.c_str()) == 0);
  auto m = MasterProcess::Start(c.dir + "/master", c.master.address);
  REQUIRE(m.ok());
  c.master = std::move(*m);
  WaitForNodes(*c.client, 1);

  CHECK(c.client->BatchLookup(old_blocks.keys)->hit_prefix == 0);
  // New objects land on the same space and read back intact.
  Blocks fresh = MakeBlocks({keys.begin() + 20, keys.end()}, {100000}, 2);
  auto put = c.client->Put(fresh.keys, fresh.in());
  REQUIRE(put.ok());
  CHECK(put->stored == 20);
  CHECK(GetAndVerify(*c.client, fresh).loaded == 20);
}

TEST_CASE("a dead storage node's keys turn into misses") {
  Cluster c(2, {"--node_timeout_ms=1500"});
  auto keys = Keys(4);
  Blocks b = MakeBlocks(keys, {10000}, 3);
  auto put = c.client->Put(b.keys, b.in());
  REQUIRE(put.ok());
  REQUIRE(put->stored == 4);
  auto stored = c.client->Exists(keys);
  REQUIRE(stored.ok());
  CHECK(stored->hit_prefix == 4);
  CHECK(stored->found == std::vector<bool>(4, true));
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  // Find and kill the node holding the blocks.
  std::string victim_addr;
  for (const auto& n : st->nodes) {
    if (n.node_id == put->node_id) victim_addr = n.data_address;
  }
  bool killed = false;
  for (auto& n : c.nodes) {
    if (n.data_address == victim_addr) {
      REQUIRE(n.daemon.Stop(SIGKILL).ok());
      killed = true;
    }
  }
  REQUIRE(killed);

  // Before the master notices, a Get fails fast on the data plane and
  // reports what it has (nothing) instead of hanging.
  {
    std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(10000));
    std::vector<MutableBuffer> bufs;
    for (auto& o : out) bufs.push_back({o.data(), o.size()});
    auto r = c.client->Get(keys, bufs);
    if (r.ok()) CHECK(r->loaded == 0);
  }

  size_t hits = 4;
  CHECK(Eventually(
      [&] {
        auto look = c.client->BatchLookup(keys);
        REQUIRE(look.ok());
        hits = look->hit_prefix;
        return hits == 0;
      },
      absl::Seconds(15), absl::Milliseconds(100)));
  // An existence check agrees: the keys of a dead node are not stored.
  auto exists = c.client->Exists(keys);
  REQUIRE(exists.ok());
  CHECK(exists->hit_prefix == 0);
  CHECK(exists->found == std::vector<bool>(4, false));
  WaitForNodes(*c.client, 1);

  // New writes go to the surviving node.
  auto k2 = Keys(6);
  Blocks b2 = MakeBlocks({k2[4], k2[5]}, {777}, 1);
  auto p2 = c.client->Put(b2.keys, b2.in());
  REQUIRE(p2.ok());
  CHECK(p2->stored == 2);
  CHECK(p2->node_id != put->node_id);
  CHECK(GetAndVerify(*c.client, b2).loaded == 2);
}

TEST_CASE(
    "a location another client cached serves its own key's bytes or a miss, "
    "never the bytes of the key its space went to") {
  Cluster c(1);
  auto reader = NewClient(c.master.address);  // location cache on (default)
  auto keys = Keys(2, "reuse");
  Blocks first = MakeBlocks({keys[0]}, {4096}, 11);
  Blocks second = MakeBlocks({keys[1]}, {4096}, 99);
  REQUIRE(first.data[0] != second.data[0]);
  REQUIRE(c.client->Put(first.keys, first.in()).ok());
  REQUIRE(GetAndVerify(*reader, first).loaded == 1);  // cached from here on
  auto was = c.client->BatchLookup(first.keys);
  REQUIRE(was.ok());
  REQUIRE(was->hit_prefix == 1);

  // Another client removes the key and stores another of the same size:
  // the master gives it the freed space, with a newer generation.
  auto removed = c.client->Remove(first.keys);
  REQUIRE(removed.ok());
  REQUIRE((*removed)[0]);
  REQUIRE(c.client->Put(second.keys, second.in()).ok());
  auto now = c.client->BatchLookup(second.keys);
  REQUIRE(now.ok());
  REQUIRE(now->hit_prefix == 1);
  const ObjectLocation& old_loc = was->locations[0];
  const ObjectLocation& new_loc = now->locations[0];
  const bool reused = old_loc.node_id == new_loc.node_id &&
                      old_loc.region_id == new_loc.region_id &&
                      old_loc.addr == new_loc.addr;
  CHECK(new_loc.generation > old_loc.generation);

  // Within the ttl the reader's load of the removed key tries its cached
  // location: the node refuses it (the extent is the new key's now), the
  // reader looks the key up again and misses.
  std::vector<uint8_t> out(4096, 0xEE);
  auto r = reader->Get(first.keys, {MutableBuffer{out.data(), out.size()}});
  REQUIRE(r.ok());
  CHECK(out != second.data[0]);
  if (reused) {
    CHECK(r->loaded == 0);
    CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
  } else {
    // Not reused (an allocator change): at most the removed key's own
    // bytes, never the other key's.
    CHECK((r->loaded == 0 || out == first.data[0]));
  }
  INFO("reused " << reused);
  CHECK(reused);  // today's allocator gives the freed space back
  // The other key reads back intact through the same reader.
  CHECK(GetAndVerify(*reader, second).loaded == 1);
}

TEST_CASE("SIGTERM: the storage node drains, deregisters and exits 0") {
  Cluster c(1);
  auto keys = Keys(2);
  Blocks b = MakeBlocks(keys, {4096}, 11);
  REQUIRE(c.client->Put(b.keys, b.in())->stored == 2);
  auto status = c.nodes[0].daemon.Stop(SIGTERM);
  REQUIRE(status.ok());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  // Deregistered at once (no waiting for the node timeout): its DRAM
  // objects are gone.
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  REQUIRE(st->nodes.size() == 1);
  CHECK_FALSE(st->nodes[0].alive);
  CHECK(c.client->BatchLookup(keys)->hit_prefix == 0);
  // The master itself also stops cleanly.
  auto ms = c.master.daemon.Stop(SIGTERM);
  REQUIRE(ms.ok());
  CHECK(WIFEXITED(*ms));
  CHECK(WEXITSTATUS(*ms) == 0);
}

TEST_CASE("calls past their deadline return what they have") {
  Cluster c(1);
  auto keys = Keys(3);
  Blocks b = MakeBlocks(keys, {1 << 20}, 5);
  REQUIRE(c.client->Put(b.keys, b.in())->stored == 3);
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(1 << 20));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  CallOptions late;
  late.deadline = absl::Now() - absl::Seconds(1);
  auto r = c.client->Get(keys, bufs, late);
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  auto p = c.client->Put(keys, b.in(), late);
  CHECK(p.status().code() == absl::StatusCode::kDeadlineExceeded);
}

// Node-confirmed commits (docs/ha.md): a PutCommit of a slot nobody wrote
// (a buggy or hostile client) carries no write receipt of the node, and the
// master refuses it: nothing is listed.
TEST_CASE("a commit of a slot nobody wrote is refused and lists nothing") {
  Cluster c(1);
  auto stub = pb::MasterService::NewStub(grpc::CreateChannel(
      c.master.address, grpc::InsecureChannelCredentials()));
  pb::PutStartRequest start;
  start.add_keys("never-written");
  start.add_lengths(8192);
  pb::PutStartResponse slots;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->PutStart(&ctx, start, &slots).ok());
  }
  REQUIRE(slots.slots(0).state() == pb::SLOT_ALLOCATED);
  {
    grpc::ClientContext ctx;
    pb::PutCommitRequest commit;
    commit.set_put_id(slots.put_id());
    pb::PutCommitResponse resp;
    grpc::Status s = stub->PutCommit(&ctx, commit, &resp);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(ReasonOf(FromGrpcStatus(s)) == StatusReason::kWriteReceiptInvalid);
  }
  CHECK(c.client->BatchLookup({"never-written"})->hit_prefix == 0);
  // The key is free to be stored (and committed with its receipt).
  Blocks b = MakeBlocks({"never-written"}, {8192}, 78);
  auto put = c.client->Put(b.keys, b.in());
  REQUIRE(put.ok());
  CHECK(put->stored == 1);
  CHECK(GetAndVerify(*c.client, b).loaded == 1);
}

// Without node-confirmed commits (--require_write_receipts=false, e.g.
// nodes older than receipts), a PutCommit of a slot nobody wrote lists a
// key the node cannot serve. The first reader's refusal drops the listing
// (read repair); the node's next reconciliation would too. (Read repair
// also covers a listing whose node lost its bytes.)
TEST_CASE(
    "a listed key its node does not hold is dropped by the first read and can "
    "be stored again") {
  Cluster c(1, {"--require_write_receipts=false"});
  auto channel = grpc::CreateChannel(c.master.address,
                                     grpc::InsecureChannelCredentials());
  auto stub = pb::MasterService::NewStub(channel);
  pb::PutStartRequest start;
  start.add_keys("never-written");
  start.add_lengths(8192);
  pb::PutStartResponse slots;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->PutStart(&ctx, start, &slots).ok());
  }
  REQUIRE(slots.slots(0).state() == pb::SLOT_ALLOCATED);
  {
    grpc::ClientContext ctx;
    pb::PutCommitRequest commit;
    commit.set_put_id(slots.put_id());
    pb::PutCommitResponse resp;
    REQUIRE(stub->PutCommit(&ctx, commit, &resp).ok());
  }
  REQUIRE(c.client->BatchLookup({"never-written"})->hit_prefix == 1);

  std::vector<uint8_t> out(8192);
  std::vector<MutableBuffer> buf = {{out.data(), out.size()}};
  auto r = c.client->Get({"never-written"}, buf);
  REQUIRE(r.ok());
  CHECK(r->loaded == 0);
  CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
  // The report is sent in the background.
  CHECK(Eventually(
      [&] { return c.client->BatchLookup({"never-written"})->hit_prefix == 0; },
      absl::Seconds(10)));
  Blocks b = MakeBlocks({"never-written"}, {8192}, 77);
  auto put = c.client->Put(b.keys, b.in());
  REQUIRE(put.ok());
  CHECK(put->stored == 1);
  CHECK(GetAndVerify(*c.client, b).loaded == 1);
}

TEST_CASE(
    "a prefix many sessions continue from is copied to a second node by a "
    "read, and outlives its node") {
  Cluster c(2, {"--node_timeout_ms=1500", "--auto_replica_branches=3"});
  auto stats = [&] { return Stats(c); };
  // A shared prefix, and three sessions' own blocks after it.
  const std::vector<std::string> prefix = {"sys-0", "sys-1", "sys-2", "sys-3"};
  const Blocks shared = MakeBlocks(prefix, {8192}, 11);
  auto put = c.client->Put(shared.keys, shared.in());
  REQUIRE(put.ok());
  REQUIRE(put->stored == 4);
  std::vector<Blocks> sessions;
  for (int s = 0; s < 3; ++s) {
    const Blocks own = MakeBlocks(
        {absl::StrCat("session-", s, "-0"), absl::StrCat("session-", s, "-1")},
        {8192}, 100 + 10 * s);
    StoreOptions o;
    o.parent_key = prefix.back();
    auto r = c.client->Store(own.keys, own.in(), o)->Wait();
    REQUIRE(r.ok());
    REQUIRE(r->stored == 2);
    Blocks whole = shared;
    whole.keys.insert(whole.keys.end(), own.keys.begin(), own.keys.end());
    whole.data.insert(whole.data.end(), own.data.begin(), own.data.end());
    sessions.push_back(std::move(whole));
  }
  CHECK(stats()["auto_copies_asked"] == 0);

  // One session's read: the master asks it for copies of the prefix, and
  // the client stores them in the background.
  CHECK(GetAndVerify(*c.client, sessions[0]).loaded == 6);
  CHECK(stats()["auto_copies_asked"] == 1);
  CHECK(Eventually([&] { return stats()["replicas_stored"] == 4; },
                   absl::Seconds(10)));
  // Copied: the next reader is not asked.
  CHECK(GetAndVerify(*c.client, sessions[1]).loaded == 6);
  CHECK(stats()["auto_copies_asked"] == 1);

  // The prefix's node dies: every session still reads the prefix, byte for
  // byte, from its copies (its own blocks went with the node).
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  bool killed = false;
  for (const auto& n : st->nodes) {
    if (n.node_id != put->node_id) continue;
    for (auto& node : c.nodes) {
      if (node.data_address == n.data_address) {
        REQUIRE(node.daemon.Stop(SIGKILL).ok());
        killed = true;
      }
    }
  }
  REQUIRE(killed);
  for (const Blocks& session : sessions) {
    CHECK(
        Eventually([&] { return GetAndVerify(*c.client, session).loaded >= 4; },
                   absl::Seconds(15)));
  }
}

TEST_CASE(
    "a shared prefix spread over two nodes is copied whole, each block off "
    "its own node, and outlives either node") {
  Cluster c(2, {"--node_timeout_ms=1500", "--auto_replica_branches=3"});
  auto stats = [&] { return Stats(c); };
  auto stub = pb::MasterService::NewStub(grpc::CreateChannel(
      c.master.address, grpc::InsecureChannelCredentials()));
  auto drain = [&](const std::string& name, bool on) {
    grpc::ClientContext ctx;
    pb::SetNodeDrainingRequest req;
    req.set_name(name);
    req.set_draining(on);
    pb::SetNodeDrainingResponse resp;
    REQUIRE(stub->SetNodeDraining(&ctx, req, &resp).ok());
  };
  auto node_name = [&](uint32_t id) {
    auto st = c.client->GetClusterStatus();
    REQUIRE(st.ok());
    for (const auto& n : st->nodes) {
      if (n.node_id == id) return n.name;
    }
    FAIL("no node " << id);
    return std::string();
  };
  // The prefix's first half on one node; that node drains, so the second
  // half (chained on the first) goes to the other: the chain spilled.
  const Blocks first = MakeBlocks({"spill-0", "spill-1"}, {8192}, 21);
  auto put = c.client->Put(first.keys, first.in());
  REQUIRE(put.ok());
  REQUIRE(put->stored == 2);
  const std::string first_node = node_name(put->node_id);
  drain(first_node, true);
  const Blocks second = MakeBlocks({"spill-2", "spill-3"}, {8192}, 22);
  StoreOptions chained;
  chained.parent_key = "spill-1";
  auto r = c.client->Store(second.keys, second.in(), chained)->Wait();
  REQUIRE(r.ok());
  REQUIRE(r->stored == 2);
  REQUIRE(r->node_id != put->node_id);
  drain(first_node, false);
  Blocks prefix = first;
  prefix.keys.insert(prefix.keys.end(), second.keys.begin(), second.keys.end());
  prefix.data.insert(prefix.data.end(), second.data.begin(), second.data.end());
  std::vector<Blocks> sessions;
  for (int s = 0; s < 3; ++s) {
    const Blocks own =
        MakeBlocks({absl::StrCat("spill-session-", s)}, {8192}, 200 + s);
    StoreOptions o;
    o.parent_key = prefix.keys.back();
    auto w = c.client->Store(own.keys, own.in(), o)->Wait();
    REQUIRE(w.ok());
    REQUIRE(w->stored == 1);
    Blocks whole = prefix;
    whole.keys.push_back(own.keys[0]);
    whole.data.push_back(own.data[0]);
    sessions.push_back(std::move(whole));
  }

  // A read asks for copies of the 4 shared blocks: all 4 are stored, the
  // first two off the first node and the last two off the second.
  CHECK(GetAndVerify(*c.client, sessions[0]).loaded == 5);
  CHECK(stats()["auto_copies_asked"] == 1);
  CHECK(Eventually([&] { return stats()["replicas_stored"] == 4; },
                   absl::Seconds(10)));

  // Either node dies: the prefix is read whole, byte for byte.
  REQUIRE(c.nodes[0].daemon.Stop(SIGKILL).ok());
  CHECK(Eventually([&] { return GetAndVerify(*c.client, prefix).loaded == 4; },
                   absl::Seconds(15)));
}

TEST_CASE("a reader is served from the copy on its own host's node") {
  Cluster c(0);
  c.AddNode("node-a", "host-a");
  c.AddNode("node-b", "host-b");
  WaitForNodes(*c.client, 2);
  for (const StorageProcess& n : c.nodes) Cluster::WaitRegistered(n);
  const Blocks b = MakeBlocks({"h0", "h1", "h2", "h3"}, {8192}, 21);
  StoreOptions o;
  o.replicas = 2;
  auto stored = c.client->Store(b.keys, b.in(), o)->Wait();
  REQUIRE(stored.ok());
  REQUIRE(stored->stored == 4);
  REQUIRE(stored->replicated == 4);
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  std::map<std::string, uint32_t> node_of_host;
  for (const auto& n : st->nodes) {
    node_of_host[n.data_address == c.nodes[0].data_address ? "host-a"
                                                           : "host-b"] =
        n.node_id;
  }
  REQUIRE(node_of_host.size() == 2);
  for (const std::string host : {"host-a", "host-b"}) {
    INFO(host);
    auto reader = NewClient(c.master.address, host);
    auto found = reader->BatchLookup(b.keys);
    REQUIRE(found.ok());
    REQUIRE(found->hit_prefix == 4);
    for (const ObjectLocation& l : found->locations) {
      CHECK(l.node_id == node_of_host[host]);
    }
    CHECK(GetAndVerify(*reader, b).loaded == 4);
  }
}

// Raw requests: every malformed one gets a clear error; the daemons stay up
// and nothing already committed is lost.
TEST_CASE("malformed requests get errors while the daemons stay up") {
  Cluster c(1);
  auto keys = Keys(3);
  Blocks b = MakeBlocks(keys, {8192}, 21);
  REQUIRE(c.client->Put(b.keys, b.in())->stored == 3);

  auto channel = grpc::CreateChannel(c.master.address,
                                     grpc::InsecureChannelCredentials());
  auto stub = pb::MasterService::NewStub(channel);
  auto call_put = [&](const pb::PutStartRequest& req) {
    grpc::ClientContext ctx;
    pb::PutStartResponse resp;
    return stub->PutStart(&ctx, req, &resp).error_code();
  };
  SECTION("master rejects bad puts and lookups") {
    pb::PutStartRequest req;
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // no keys
    req.add_keys(std::string(300, 'k'));
    req.add_lengths(10);
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // key too long
    req.set_keys(0, "");
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // empty key
    req.set_keys(0, "ok-key");
    req.set_lengths(0, 0);
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // zero length
    req.set_lengths(0, uint64_t{1} << 40);
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // oversized length
    req.set_lengths(0, 10);
    req.add_lengths(20);
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // count mismatch
    req.clear_lengths();
    req.add_lengths(10);
    req.add_keys("ok-key");
    req.add_lengths(10);
    CHECK(call_put(req) == grpc::INVALID_ARGUMENT);  // duplicate key
    pb::PutStartRequest unknown;
    unknown.add_keys("x");
    unknown.add_lengths(10);
    unknown.set_preferred_node_id(999);
    CHECK(call_put(unknown) == grpc::NOT_FOUND);  // unknown node
    pb::PutStartRequest huge;
    huge.add_keys("y");
    huge.add_lengths(uint64_t{1} << 30);  // larger than the node
    CHECK(call_put(huge) == grpc::RESOURCE_EXHAUSTED);
    pb::PutStartRequest many;
    for (int i = 0; i < 5000; ++i) {
      many.add_keys(absl::StrCat("k", i));
      many.add_lengths(1);
    }
    CHECK(call_put(many) == grpc::INVALID_ARGUMENT);  // batch too large

    {
      grpc::ClientContext ctx;
      pb::PutCommitRequest r;
      r.set_put_id(123456789);
      pb::PutCommitResponse resp;
      CHECK(stub->PutCommit(&ctx, r, &resp).error_code() == grpc::NOT_FOUND);
    }
    {
      grpc::ClientContext ctx;
      pb::BatchLookupRequest r;
      pb::BatchLookupResponse resp;
      CHECK(stub->BatchLookup(&ctx, r, &resp).error_code() ==
            grpc::INVALID_ARGUMENT);
    }
    {
      grpc::ClientContext ctx;
      pb::RegisterNodeRequest r;
      r.set_name("bad");
      r.set_data_address("no-port");
      pb::RegisterNodeResponse resp;
      CHECK(stub->RegisterNode(&ctx, r, &resp).error_code() ==
            grpc::INVALID_ARGUMENT);
    }
    {
      grpc::ClientContext ctx;
      pb::HeartbeatRequest r;
      r.set_node_id(4242);
      pb::HeartbeatResponse resp;
      auto s = stub->Heartbeat(&ctx, r, &resp);
      CHECK((!s.ok() || resp.reregister()));
    }
  }
  SECTION("storage node rejects hostile data-plane frames") {
    const std::string& addr = c.nodes[0].data_address;
    auto deadline = [] { return absl::Now() + absl::Seconds(5); };
    // Garbage bytes: an error frame, then the connection closes.
    {
      auto s = ConnectTcp(addr, deadline());
      REQUIRE(s.ok());
      std::string junk(64, 'Z');
      REQUIRE(SendAll(s->fd(), junk.data(), junk.size(), deadline()).ok());
      uint8_t h[wire::kHeaderBytes];
      REQUIRE(RecvAll(s->fd(), h, sizeof(h), deadline()).ok());
      auto hdr = wire::DecodeHeader(h);
      REQUIRE(hdr.ok());
      CHECK(hdr->type == wire::FrameType::kError);
    }
    // A header announcing 65535 ops: refused before anything is allocated.
    {
      auto s = ConnectTcp(addr, deadline());
      REQUIRE(s.ok());
      uint8_t h[wire::kHeaderBytes];
      wire::FrameHeader fh;
      fh.type = wire::FrameType::kReadRequest;
      fh.op_count = 1;
      wire::EncodeHeader(fh, h);
      h[6] = 0xff;
      h[7] = 0xff;
      REQUIRE(SendAll(s->fd(), h, sizeof(h), deadline()).ok());
      REQUIRE(RecvAll(s->fd(), h, sizeof(h), deadline()).ok());
      CHECK(wire::DecodeHeader(h)->type == wire::FrameType::kError);
    }
    // A write whose payload is cut off mid-way: nothing becomes readable.
    {
      auto s = ConnectTcp(addr, deadline());
      REQUIRE(s.ok());
      uint8_t buf[wire::kHeaderBytes + wire::kOpBytes];
      wire::FrameHeader fh;
      fh.type = wire::FrameType::kWriteRequest;
      fh.op_count = 1;
      fh.payload_bytes = 1 << 20;
      wire::EncodeHeader(fh, buf);
      wire::OpDesc op;
      op.addr = 200 << 20;
      op.length = 1 << 20;
      op.generation = 1ull << 60;
      wire::EncodeOp(op, buf + wire::kHeaderBytes);
      REQUIRE(SendAll(s->fd(), buf, sizeof(buf), deadline()).ok());
      std::string half(1000, 'h');
      REQUIRE(SendAll(s->fd(), half.data(), half.size(), deadline()).ok());
    }
    // Reads with a wrong generation, an unknown region or out of bounds
    // get per-op errors, not bytes.
    auto look = c.client->BatchLookup(keys);
    REQUIRE(look.ok());
    auto t = NewTcpTransport({});
    PeerInfo peer{look->locations[0].node_id, addr, {}};
    std::vector<uint8_t> sink(1 << 20);
    const ObjectLocation& l = look->locations[0];
    std::vector<ReadOp> ops = {
        {{l.region_id, l.addr, l.length, l.generation + 1000}, sink.data()},
        {{l.region_id + 7, l.addr, l.length, l.generation}, sink.data()},
        {{l.region_id, uint64_t{1} << 40, 4096, l.generation}, sink.data()},
        {{l.region_id, 200 << 20, 1 << 20, 1ull << 60}, sink.data()},
    };
    auto st = t->Read(peer, ops, deadline());
    for (const auto& s : st) CHECK_FALSE(s.ok());
  }
  // Both daemons are still up and everything committed is intact.
  CHECK(c.master.daemon.Alive());
  CHECK(c.nodes[0].daemon.Alive());
  CHECK(GetAndVerify(*c.client, b).loaded == 3);
}

}  // namespace
}  // namespace hymcache
