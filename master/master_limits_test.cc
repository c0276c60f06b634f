// MasterService's resource limits: registration size caps, the number of
// node records and their removal, and each caller's pending puts.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/capability.h"
#include "common/fake_clock.h"
#include "master/fake_metadata_store.h"
#include "master/master_service.h"
#include "master/master_test_util.h"
#include "master/proving_heartbeat.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;
using absl::StatusCode;

constexpr uint64_t kCapacity = 1 << 20;

v1::RegisterNodeRequest NodeReq(const std::string& name, int port = 7000) {
  v1::RegisterNodeRequest r = OneRegionNodeReq(name, port, kCapacity);
  (*r.mutable_transport_params())["shm.host"] = "host/boot";
  return r;
}

v1::PutStartRequest PutReq(const std::string& key, uint64_t length,
                           uint32_t preferred = 0) {
  v1::PutStartRequest r;
  r.add_keys(key);
  r.add_lengths(length);
  r.set_preferred_node_id(preferred);
  return r;
}

struct Harness {
  explicit Harness(MasterServiceOptions o = MasterServiceOptions()) {
    o.clock = &clock;
    auto fake = std::make_unique<FakeMetadataStore>();
    store = fake.get();
    auto s = MasterService::Create(o, std::move(fake));
    REQUIRE(s.ok());
    svc = std::move(*s);
  }
  // The proof of a node's key (NodeAuth) for `purpose`, if one was issued.
  v1::NodeAuth AuthFor(const std::string& purpose, const std::string& name,
                       uint32_t id, uint64_t incarnation) {
    v1::NodeAuth a;
    auto k = keys.find(name);
    if (k == keys.end()) return a;
    a.set_unix_ms(absl::ToUnixMillis(clock.Now()));
    a.set_proof(NodeProof(HmacSha256(k->second), purpose, name, id,
                          incarnation, a.unix_ms()));
    return a;
  }
  // RegisterNode with the proof of the name's key.
  absl::StatusOr<v1::RegisterNodeResponse> Reg(v1::RegisterNodeRequest req) {
    *req.mutable_auth() = AuthFor("register", req.name(), 0, req.incarnation());
    auto r = svc->RegisterNode(req);
    if (r.ok()) {
      keys[req.name()] = r->node_key();
      names[r->node_id()] = req.name();
    }
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Hb(v1::HeartbeatRequest req) {
    *req.mutable_auth() = AuthFor("heartbeat", names[req.node_id()],
                                  req.node_id(), req.incarnation());
    return svc->Heartbeat(req);
  }
  // Reg, then the heartbeat a node sends right after registering (it
  // proves the key; only then is the node placeable).
  uint32_t Register(const std::string& name, int port = 7000) {
    auto r = Reg(NodeReq(name, port));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    v1::HeartbeatRequest hb;
    hb.set_node_id(r->node_id());
    hb.set_incarnation(NodeReq(name, port).incarnation());
    REQUIRE(Hb(hb).ok());
    return r->node_id();
  }
  // Commits the put `start` began, with the receipts of its node.
  void Commit(const v1::PutStartResponse& start) {
    v1::PutCommitRequest c;
    c.set_put_id(start.put_id());
    AddWriteReceipts(start,
                     HmacSha256(keys.at(names.at(start.node().node_id()))), &c);
    REQUIRE(svc->PutCommit(c).ok());
  }
  FakeClock clock;
  std::map<std::string, std::string> keys;  // node name -> key
  std::map<uint32_t, std::string> names;    // node id -> name
  FakeMetadataStore* store;
  std::unique_ptr<MasterService> svc;
};

absl::Status RegisterWith(Harness& h,
                          void (*tweak)(v1::RegisterNodeRequest&)) {
  v1::RegisterNodeRequest r = NodeReq("n");
  tweak(r);
  return h.svc->RegisterNode(r).status();
}

TEST_CASE("RegisterNode refuses oversized fields, naming them") {
  Harness h;
  struct Case {
    const char* what;
    void (*tweak)(v1::RegisterNodeRequest&);
  };
  const Case cases[] = {
      {"node name", [](v1::RegisterNodeRequest& r) {
         r.set_name(std::string(129, 'n'));
       }},
      {"data_address", [](v1::RegisterNodeRequest& r) {
         r.set_data_address(std::string(300, 'h') + ":1");
       }},
      {"control_address", [](v1::RegisterNodeRequest& r) {
         r.set_control_address(std::string(300, 'h') + ":1");
       }},
      {"transport_params 'x' of 15728640 bytes",
       [](v1::RegisterNodeRequest& r) {
         // One value of 15 MiB (as a hostile node sent).
         (*r.mutable_transport_params())["x"] = std::string(15 << 20, 'p');
       }},
      {"bytes in all", [](v1::RegisterNodeRequest& r) {
         (*r.mutable_transport_params())["a"] = std::string(3000, 'p');
         (*r.mutable_transport_params())["b"] = std::string(3000, 'p');
         (*r.mutable_transport_params())["c"] = std::string(3000, 'p');
       }},
      {"34 transport_params", [](v1::RegisterNodeRequest& r) {
         for (int i = 0; i < 33; ++i) {
           (*r.mutable_transport_params())["k" + std::to_string(i)] = "v";
         }
       }},
      {"transport_params key", [](v1::RegisterNodeRequest& r) {
         (*r.mutable_transport_params())[std::string(65, 'k')] = "v";
       }},
      {"65 regions", [](v1::RegisterNodeRequest& r) {
         for (uint32_t i = 1; i <= 64; ++i) {
           *r.add_regions() = r.regions(0);
           r.mutable_regions(static_cast<int>(i))->set_region_id(i);
         }
       }},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    absl::Status s = RegisterWith(h, c.tweak);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(c.what) != std::string::npos);
  }
  CHECK(h.svc->ListNodes().nodes_size() == 0);
  // At the caps: accepted.
  v1::RegisterNodeRequest r = NodeReq("n");
  r.set_name(std::string(128, 'n'));
  (*r.mutable_transport_params())["shm.host"] = std::string(4096, 'p');
  (*r.mutable_transport_params())["rdma.areas"] = std::string(4000, 'p');
  CHECK(h.svc->RegisterNode(r).ok());
  CHECK(h.svc->ListNodes().ByteSizeLong() < 10000);
}

TEST_CASE("The master keeps at most max_nodes records; dead ones can go") {
  MasterServiceOptions o;
  o.max_nodes = 2;
  Harness h(o);
  const uint32_t a = h.Register("a", 7000);
  h.Register("b", 7100);
  auto put = h.svc->PutStart(PutReq("on-a", 4096, a));
  REQUIRE(put.ok());
  h.Commit(*put);
  auto c = h.svc->RegisterNode(NodeReq("c", 7200));
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK(c.status().message().find("hymctl node forget") != std::string::npos);
  // Known names still re-register.
  CHECK(h.Reg(NodeReq("a", 7000)).ok());

  // An alive node cannot be forgotten; an unknown one is NotFound.
  v1::ForgetNodeRequest f;
  f.set_name("a");
  CHECK(h.svc->ForgetNode(f).status().code() ==
        StatusCode::kFailedPrecondition);
  v1::ForgetNodeRequest unknown;
  unknown.set_name("zz");
  CHECK(h.svc->ForgetNode(unknown).status().code() == StatusCode::kNotFound);

  // Dead (unseen for node_timeout): forgotten with its objects, durably.
  h.clock.Advance(o.node_timeout + absl::Seconds(1));
  auto gone = h.svc->ForgetNode(f);
  REQUIRE(gone.ok());
  CHECK(gone->node_id() == a);
  CHECK(gone->objects_removed() == 1);
  CHECK(h.svc->ListNodes().nodes_size() == 1);
  CHECK(h.store->LoadNodes()->size() == 1);
  v1::BatchLookupRequest l;
  l.add_keys("on-a");
  CHECK_FALSE(h.svc->BatchLookup(l)->results(0).found());
  CHECK(h.svc->counters().nodes_forgotten == 1);
  // Room for a new node; "a" coming back is a new node.
  h.Register("c", 7200);
  auto b2 = h.Reg(NodeReq("b", 7100));
  CHECK(b2.ok());
}

TEST_CASE("Nodes dead for forget_dead_nodes_after are forgotten") {
  MasterServiceOptions o;
  o.forget_dead_nodes_after = absl::Hours(1);
  Harness h(o);
  h.Register("old", 7000);
  h.Register("live", 7100);
  h.clock.Advance(absl::Minutes(59));
  h.svc->ReapExpired();
  CHECK(h.svc->ListNodes().nodes_size() == 2);
  v1::HeartbeatRequest hb;
  hb.set_node_id(2);
  hb.set_incarnation(1);
  REQUIRE(h.Hb(hb).ok());
  h.clock.Advance(absl::Minutes(2));
  h.svc->ReapExpired();
  auto nodes = h.svc->ListNodes();
  REQUIRE(nodes.nodes_size() == 1);
  CHECK(nodes.nodes(0).name() == "live");
  CHECK(h.svc->counters().nodes_forgotten == 1);
  o.forget_dead_nodes_after = o.node_timeout;
  CHECK(o.Validate().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("One caller's pending puts cannot fill a node") {
  MasterServiceOptions o;  // 25% of a node per caller
  Harness h(o);
  const uint32_t n = h.Register("n");
  // The flooding caller: never commits.
  int started = 0;
  absl::Status refused;
  for (int i = 0; i < 1000; ++i) {
    auto p = h.svc->PutStart(PutReq("flood" + std::to_string(i), 4096),
                             "ipv4:10.0.0.66");
    if (!p.ok()) {
      refused = p.status();
      break;
    }
    ++started;
  }
  CHECK(started == kCapacity / 4 / 4096);
  CHECK(refused.code() == StatusCode::kResourceExhausted);
  CHECK(refused.message().find("ipv4:10.0.0.66") != std::string::npos);
  CHECK(refused.message().find("pending puts") != std::string::npos);
  CHECK(h.svc->counters().puts_over_caller_limit == 1);
  // Another caller still puts.
  auto other = h.svc->PutStart(PutReq("legit", 8192), "ipv4:10.0.0.7");
  REQUIRE(other.ok());
  CHECK(other->node().node_id() == n);
  h.Commit(*other);
  // Once the flood's puts expire, the flooder may put again.
  h.clock.Advance(o.put_timeout + absl::Seconds(1));
  CHECK(h.svc->ReapExpired() == static_cast<size_t>(started));
  v1::HeartbeatRequest hb;
  hb.set_node_id(n);
  hb.set_incarnation(1);
  REQUIRE(h.Hb(hb).ok());
  auto again = h.svc->PutStart(PutReq("after", 4096), "ipv4:10.0.0.66");
  REQUIRE(again.ok());
  // Committed and aborted puts give their share back.
  h.Commit(*again);
  for (int i = 0; i < started; ++i) {
    auto p = h.svc->PutStart(PutReq("more" + std::to_string(i), 4096),
                             "ipv4:10.0.0.66");
    REQUIRE(p.ok());
    v1::PutAbortRequest a;
    a.set_put_id(p->put_id());
    REQUIRE(h.svc->PutAbort(a).ok());
  }
}

TEST_CASE("A caller's pending slots are capped") {
  MasterServiceOptions o;
  o.max_pending_slots_per_caller = 3;
  Harness h(o);
  h.Register("n");
  for (int i = 0; i < 3; ++i) {
    REQUIRE(h.svc->PutStart(PutReq("k" + std::to_string(i), 100), "me").ok());
  }
  auto p = h.svc->PutStart(PutReq("k3", 100), "me");
  CHECK(p.status().code() == StatusCode::kResourceExhausted);
  CHECK(p.status().message().find("limit 3") != std::string::npos);
  CHECK(h.svc->PutStart(PutReq("k3", 100), "you").ok());
}

}  // namespace
}  // namespace master
}  // namespace hymcache
