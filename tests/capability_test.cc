// Data-plane capabilities and node keys end to end: the real master and
// storage daemons on loopback. A client can read or write only what the
// master granted, only until it expires, only on the node it was granted
// for, over TCP and shared memory; nobody but a node itself can
// re-register, deregister or impersonate it.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/direct_transport.h"
#include "client/tcp_transport.h"
#include "client/transport.h"
#include "common/wire.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;
namespace pb = ::hymcache::v1;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

struct Cluster {
  std::string dir = TempDir("caps");
  MasterProcess master;
  std::vector<StorageProcess> nodes;
  std::unique_ptr<Client> client;
  std::unique_ptr<pb::MasterService::Stub> stub;

  Cluster() {
    // Read capabilities live 3 s; the nodes allow no clock skew.
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0",
                                  {"--capability_lifetime_ms=3000"});
    REQUIRE(m.ok());
    master = std::move(*m);
    for (int i = 0; i < 2; ++i) {
      auto s = StorageProcess::Start(
          master.address, absl::StrCat("node-", i),
          {"--dram_bytes=67108864", "--capability_skew_ms=0"});
      INFO(s.status().ToString());
      REQUIRE(s.ok());
      nodes.push_back(std::move(*s));
    }
    ClientOptions o;
    o.master_address = master.address;
    auto c = Client::Create(o);
    REQUIRE(c.ok());
    client = std::move(*c);
    stub = pb::MasterService::NewStub(grpc::CreateChannel(
        master.address, grpc::InsecureChannelCredentials()));
    absl::Status alive = testing::WaitForLiveNodes(*client, 2);
    INFO(alive.ToString());
    REQUIRE(alive.ok());
    REQUIRE(Alive().size() == 2);
  }
  std::vector<pb::NodeInfo> Alive() {
    grpc::ClientContext ctx;
    pb::ListNodesResponse r;
    std::vector<pb::NodeInfo> out;
    if (!stub->ListNodes(&ctx, pb::ListNodesRequest(), &r).ok()) return out;
    for (const auto& n : r.nodes()) {
      if (n.alive()) out.push_back(n);
    }
    return out;
  }
  PeerInfo Peer(uint32_t node_id) {
    for (const auto& n : Alive()) {
      if (n.node_id() != node_id) continue;
      PeerInfo p{n.node_id(), n.data_address(), {}};
      for (const auto& [k, v] : n.transport_params()) p.params[k] = v;
      return p;
    }
    FAIL("node " << node_id << " not alive");
    return {};
  }
};

RemoteRef Ref(const ObjectLocation& l) {
  RemoteRef r{l.region_id, l.addr, l.length, l.generation};
  r.cap.expires_unix_ms = l.capability.expires_unix_ms;
  r.cap.rights = l.capability.rights;
  std::memcpy(r.cap.tag, l.capability.tag.data(), sizeof(r.cap.tag));
  return r;
}

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Gets `key` through the SDK; its bytes, or empty on a miss.
std::vector<uint8_t> Get(Client& c, const std::string& key, size_t len) {
  std::vector<uint8_t> out(len, 0xEE);
  std::vector<MutableBuffer> bufs = {{out.data(), out.size()}};
  auto r = c.Get({key}, bufs);
  REQUIRE(r.ok());
  if (r->loaded != 1) return {};
  return out;
}

TEST_CASE("the data plane serves only what the master granted") {
  Cluster c;
  constexpr size_t kLen = 65536;
  const std::vector<uint8_t> data = Bytes(kLen, 1);
  auto put = c.client->Put({"k1"}, {{data.data(), data.size()}});
  REQUIRE(put.ok());
  REQUIRE(put->stored == 1);
  auto look = c.client->BatchLookup({"k1"});
  REQUIRE(look.ok());
  REQUIRE(look->found[0]);
  const ObjectLocation loc = look->locations[0];
  CHECK(loc.capability.rights == wire::kCapRead);
  const PeerInfo peer = c.Peer(loc.node_id);
  PeerInfo other;
  for (const auto& n : c.Alive()) {
    if (n.node_id() != loc.node_id) other = c.Peer(n.node_id());
  }
  REQUIRE(other.node_id != 0);

  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(NewTcpTransport({}));
  transports.push_back(NewDirectTransport(NewShmMover(), {}));
  for (auto& t : transports) {
    INFO("transport " << t->name());
    REQUIRE(t->CanReach(peer).ok());
    std::vector<uint8_t> buf(kLen);
    auto read = [&](const PeerInfo& p, RemoteRef r) {
      std::fill(buf.begin(), buf.end(), 0);
      return t->Read(p, {ReadOp{r, buf.data()}}, Soon())[0];
    };
    // As granted: the object's bytes.
    absl::Status s = read(peer, Ref(loc));
    REQUIRE(s.ok());
    CHECK(buf == data);
    // Forged tag.
    RemoteRef forged = Ref(loc);
    forged.cap.tag[3] ^= 0x40;
    CHECK(read(peer, forged).code() == absl::StatusCode::kPermissionDenied);
    // Expiry pushed out by the client.
    RemoteRef later = Ref(loc);
    later.cap.expires_unix_ms += 3600 * 1000;
    CHECK(read(peer, later).code() == absl::StatusCode::kPermissionDenied);
    // Another generation (a neighbour's allocation would need its own).
    RemoteRef gen = Ref(loc);
    gen.generation += 1;
    CHECK(read(peer, gen).code() == absl::StatusCode::kPermissionDenied);
    // Another address with the same capability.
    RemoteRef addr = Ref(loc);
    addr.addr += 4096;
    CHECK(read(peer, addr).code() == absl::StatusCode::kPermissionDenied);
    // No capability at all.
    RemoteRef none{loc.region_id, loc.addr, loc.length, loc.generation};
    CHECK(read(peer, none).code() == absl::StatusCode::kPermissionDenied);
    // The other node: not its key.
    if (t->CanReach(other).ok()) {
      CHECK(read(other, Ref(loc)).code() ==
            absl::StatusCode::kPermissionDenied);
    }
    // Nothing was handed out for any refused op.
    CHECK(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0; }));
  }

  // A read capability used for a write, and the write at generation + 1
  // over a live object that used to destroy it: refused, the object intact.
  auto tcp = NewTcpTransport({});
  const std::vector<uint8_t> junk(kLen, 0xEE);
  RemoteRef over = Ref(loc);
  CHECK(tcp->Write(peer, {WriteOp{over, junk.data()}}, Soon())[0].code() ==
        absl::StatusCode::kPermissionDenied);
  over.generation += 1;
  CHECK(tcp->Write(peer, {WriteOp{over, junk.data()}}, Soon())[0].code() ==
        absl::StatusCode::kPermissionDenied);
  // One write at a huge generation over the whole region: refused too.
  RemoteRef ceiling{loc.region_id, 0, 1 << 20, uint64_t{1} << 60};
  ceiling.cap.rights = wire::kCapWrite;
  ceiling.cap.expires_unix_ms = loc.capability.expires_unix_ms;
  std::vector<uint8_t> big(1 << 20, 0xEE);
  CHECK(tcp->Write(peer, {WriteOp{ceiling, big.data()}}, Soon())[0].code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(Get(*c.client, "k1", kLen) == data);
  // New puts still work.
  const std::vector<uint8_t> data2 = Bytes(kLen, 2);
  auto put2 = c.client->Put({"k2"}, {{data2.data(), data2.size()}});
  REQUIRE(put2.ok());
  CHECK(put2->stored == 1);
  CHECK(Get(*c.client, "k2", kLen) == data2);

  // Expired: 3 s of lifetime and no skew allowance on the node.
  absl::SleepFor(absl::FromUnixMillis(loc.capability.expires_unix_ms) +
                 absl::Milliseconds(200) - absl::Now());
  for (auto& t : transports) {
    INFO("transport " << t->name());
    std::vector<uint8_t> buf(kLen);
    CHECK(t->Read(peer, {ReadOp{Ref(loc), buf.data()}}, Soon())[0].code() ==
          absl::StatusCode::kPermissionDenied);
  }
  // A fresh lookup grants it again.
  CHECK(Get(*c.client, "k1", kLen) == data);
}

TEST_CASE("only a node can re-register, deregister or heartbeat as itself") {
  Cluster c;
  constexpr size_t kLen = 65536;
  const std::vector<uint8_t> data = Bytes(kLen, 3);
  auto put = c.client->Put({"k1"}, {{data.data(), data.size()}});
  REQUIRE(put.ok());
  REQUIRE(put->stored == 1);
  auto look = c.client->BatchLookup({"k1"});
  REQUIRE(look.ok());
  pb::NodeInfo victim;
  for (const auto& n : c.Alive()) {
    if (n.node_id() == look->locations[0].node_id) victim = n;
  }
  REQUIRE(victim.node_id() != 0);

  // The impostor: the published name and incarnation, its own data address.
  pb::RegisterNodeRequest fake;
  fake.set_name(victim.name());
  fake.set_incarnation(victim.incarnation());
  fake.set_data_address("127.0.0.1:1");
  fake.set_control_address("127.0.0.1:2");
  *fake.mutable_regions() = victim.regions();
  for (auto& r : *fake.mutable_regions()) r.clear_used_bytes();
  {
    grpc::ClientContext ctx;
    pb::RegisterNodeResponse resp;
    grpc::Status s = c.stub->RegisterNode(&ctx, fake, &resp);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(resp.node_key().empty());
  }
  {  // A new incarnation (it would purge the node's objects).
    grpc::ClientContext ctx;
    pb::RegisterNodeResponse resp;
    fake.set_incarnation(victim.incarnation() + 1);
    CHECK(c.stub->RegisterNode(&ctx, fake, &resp).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // Deregistration and heartbeats without the node's key.
    grpc::ClientContext ctx;
    pb::DeregisterNodeRequest d;
    d.set_node_id(victim.node_id());
    d.set_incarnation(victim.incarnation());
    pb::DeregisterNodeResponse resp;
    CHECK(c.stub->DeregisterNode(&ctx, d, &resp).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx2;
    pb::HeartbeatRequest hb;
    hb.set_node_id(victim.node_id());
    hb.set_incarnation(victim.incarnation());
    hb.mutable_auth()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
    hb.mutable_auth()->set_proof(std::string(32, 'x'));
    pb::HeartbeatResponse hr;
    CHECK(c.stub->Heartbeat(&ctx2, hb, &hr).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx3;
    pb::BeginReconcileRequest br;
    br.set_node_id(victim.node_id());
    br.set_incarnation(victim.incarnation());
    pb::BeginReconcileResponse brr;
    CHECK(c.stub->BeginReconcile(&ctx3, br, &brr).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  // The node keeps its address, is still alive, and serves its bytes.
  bool alive = false;
  for (const auto& n : c.Alive()) {
    if (n.node_id() == victim.node_id()) {
      alive = true;
      CHECK(n.data_address() == victim.data_address());
      CHECK(n.node_key().empty());
    }
  }
  CHECK(alive);
  CHECK(Get(*c.client, "k1", kLen) == data);
  // Its own heartbeats still work: every node heartbeats again after now.
  const int64_t since = absl::ToUnixMillis(absl::Now());
  bool beat = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       !beat && absl::Now() < deadline;) {
    const std::vector<pb::NodeInfo> alive = c.Alive();
    beat = alive.size() == 2;
    for (const auto& n : alive) {
      beat = beat && n.last_heartbeat_unix_ms() > since;
    }
    if (!beat) absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(beat);
}

}  // namespace
}  // namespace hymcache
