// KV events and PrefixQuery (issue 32, "KV events and a prefix query for
// routers") against a real master and two storage nodes: an engine stores
// chains and removes some; subscribers follow WatchEvents over gRPC, one of
// them breaking its stream mid-way and resuming; a router built from the
// events alone answers the same longest prefixes as PrefixQuery; a
// subscriber behind a small buffer is told what it missed; hymctl events
// prints them.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/eventually.h"
#include "common/status_reason.h"
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/kv_events_testing.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

using testing::EventPosition;
using testing::TestCluster;

std::unique_ptr<v1::MasterService::Stub> Stub(const std::string& address) {
  return v1::MasterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// The master's latest event number.
uint64_t Latest(v1::MasterService::Stub& stub) {
  auto latest = testing::LatestEvent(stub);
  INFO(latest.status().ToString());
  REQUIRE(latest.ok());
  return *latest;
}

void Follow(v1::MasterService::Stub& stub, EventPosition* at, uint64_t until,
            size_t max, std::vector<v1::KvEvent>* out,
            std::vector<std::pair<uint64_t, uint64_t>>* missed = nullptr) {
  absl::Status s = testing::FollowEvents(stub, at, until, max, out, missed);
  INFO(s.ToString());
  REQUIRE(s.ok());
}

std::vector<std::vector<std::string>> Workload(Client& c, int chains,
                                               int blocks) {
  auto all = testing::StoreChainsRemoveSome(c, "", chains, blocks);
  INFO(all.status().ToString());
  REQUIRE(all.ok());
  return *std::move(all);
}

TEST_CASE(
    "A subscriber that breaks off and resumes sees every store and removal "
    "exactly once in commit order, and a router built from the events "
    "answers as PrefixQuery") {
  TestCluster c("kv_events");
  REQUIRE(c.StartMaster().ok());
  REQUIRE(c.AddNode("a", {"--dram_bytes=64M"}).ok());
  REQUIRE(c.AddNode("b", {"--dram_bytes=64M"}).ok());
  REQUIRE(c.Connect().ok());
  REQUIRE(c.WaitAlive().ok());
  auto stub = Stub(c.master.address);

  const int kChains = 30, kBlocks = 10;
  auto chains = Workload(*c.client, kChains, kBlocks);
  const uint64_t latest = Latest(*stub);

  // One subscriber reads everything in one stream...
  EventPosition whole;
  std::vector<v1::KvEvent> once;
  Follow(*stub, &whole, latest, SIZE_MAX, &once);
  // ...another in pieces of 50 events, reconnecting after each.
  EventPosition pieces;
  std::vector<v1::KvEvent> resumed;
  int reconnects = 0;
  while (pieces.after < latest) {
    Follow(*stub, &pieces, latest, 50, &resumed);
    ++reconnects;
  }
  INFO("latest " << latest << ", reconnects " << reconnects);
  CHECK(reconnects > 3);
  REQUIRE(once.size() == latest);
  REQUIRE(resumed.size() == once.size());
  for (size_t i = 0; i < once.size(); ++i) {
    CHECK(once[i].sequence() == i + 1);
    CHECK(resumed[i].sequence() == once[i].sequence());
    CHECK(resumed[i].key() == once[i].key());
    CHECK(resumed[i].kind() == once[i].kind());
  }

  // Every block stored once with its chain parent, before any removal of
  // it; every removed block (the removed middle blocks and their tails)
  // removed once.
  absl::Status checked = testing::CheckChainEvents(once, latest, chains);
  INFO(checked.ToString());
  CHECK(checked.ok());
  std::set<uint32_t> up;
  for (const v1::KvEvent& e : once) {
    if (e.kind() == v1::KvEvent::BLOCK_STORED) {
      CHECK(e.tier() == "dram");
      CHECK(e.tenant() == "default");
    } else if (e.kind() == v1::KvEvent::NODE_UP) {
      up.insert(e.node_id());
    }
  }
  CHECK(up.size() == 2);

  // The router: key -> node from the events alone.
  const std::map<std::string, uint32_t> where = testing::RouterView(once);
  int agree = 0, asked = 0;
  for (const auto& keys : chains) {
    auto same = testing::RouterAgrees(*stub, where, keys);
    REQUIRE(same.ok());
    agree += *same;
    ++asked;
  }
  INFO("router agrees with PrefixQuery on " << agree << " of " << asked);
  CHECK(agree == asked);

  // hymctl events prints the same events (JSON lines).
  hymctl::Options o;
  o.master_address = c.master.address;
  o.json = true;
  o.events.count = 5;
  std::ostringstream out, err;
  REQUIRE(hymctl::Run(o, {"events"}, out, err) == 0);
  std::vector<std::string> lines =
      absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  REQUIRE(lines.size() == 5);
  for (size_t i = 0; i < lines.size(); ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    CHECK(j["sequence"] == once[i].sequence());
    // Where a later --stream=ID --after=SEQ resumes.
    CHECK(j["stream_id"] == whole.stream);
  }
  // Text, resuming after the last event: nothing until new events come.
  o.json = false;
  o.events.count = 10;
  o.events.stream_id = whole.stream;
  o.events.after_sequence = latest;
  c.client->Remove({chains[1][0]}).IgnoreError();  // 10 removals
  std::ostringstream text;
  REQUIRE(hymctl::Run(o, {"events"}, text, err) == 0);
  CHECK(text.str().find("BLOCK_REMOVED") != std::string::npos);
  CHECK(text.str().find("ch1-0") != std::string::npos);
}

TEST_CASE("A subscriber behind the master's event buffer is told which "
          "events it missed, and PrefixQuery refuses bad chains") {
  TestCluster c("kv_events_missed");
  REQUIRE(c.StartMaster({"--event_log_capacity=16"}).ok());
  REQUIRE(c.AddNode("a", {"--dram_bytes=64M"}).ok());
  REQUIRE(c.Connect().ok());
  REQUIRE(c.WaitAlive().ok());
  auto stub = Stub(c.master.address);
  Workload(*c.client, 10, 6);
  const uint64_t latest = Latest(*stub);
  REQUIRE(latest > 16);
  EventPosition at{0, 0};
  std::vector<v1::KvEvent> got;
  std::vector<std::pair<uint64_t, uint64_t>> missed;
  Follow(*stub, &at, latest, SIZE_MAX, &got, &missed);
  REQUIRE(missed.size() == 1);
  CHECK(missed[0].first == 1);
  CHECK(missed[0].second == latest - 16);
  REQUIRE(got.size() == 16);
  CHECK(got.front().sequence() == latest - 15);
  CHECK(got.back().sequence() == latest);

  // No keys, a key too long: InvalidArgument, the master unharmed.
  grpc::ClientContext c1;
  v1::PrefixQueryResponse r;
  CHECK(stub->PrefixQuery(&c1, v1::PrefixQueryRequest(), &r).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  v1::PrefixQueryRequest long_key;
  long_key.add_keys(std::string(100000, 'k'));
  grpc::ClientContext c2;
  CHECK(stub->PrefixQuery(&c2, long_key, &r).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext c3;
  v1::PrefixQueryRequest ok;
  for (const auto& k : testing::EventChainKeys("", 1, 6)) ok.add_keys(k);
  REQUIRE(stub->PrefixQuery(&c3, ok, &r).ok());
  CHECK(r.hit_prefix_length() == 6);
  REQUIRE(r.nodes_size() == 1);
  CHECK(r.nodes(0).longest_prefix() == 6);
  CHECK(r.nodes(0).blocks() == 6);
}

TEST_CASE(
    "PrefixQuery answers per engine what each engine reports its own "
    "cache holds, a large report goes in parts, and an engine that "
    "stops reporting is forgotten") {
  TestCluster c("kv_events_engines");
  REQUIRE(c.StartMaster({"--engine_ttl_s=1", "--max_engines=2"}).ok());
  REQUIRE(c.AddNode("a", {"--dram_bytes=64M"}).ok());
  ClientOptions o;
  o.max_keys_per_rpc = 4;  // the 10-key report below goes in 3 calls
  o.lookup_batch_keys = 4;
  REQUIRE(c.Connect(o).ok());
  REQUIRE(c.WaitAlive().ok());
  const auto chain = testing::EventChainKeys("", 0, 10);
  // The store holds the first 3 blocks of the chain.
  std::vector<std::string> head(chain.begin(), chain.begin() + 3);
  std::vector<std::string> bytes(3, std::string(4096, 'x'));
  std::vector<ConstBuffer> bufs;
  for (const auto& b : bytes) bufs.push_back({b.data(), b.size()});
  REQUIRE(c.client->Put(head, bufs).ok());

  EngineBlocksReport all;
  all.engine_id = "engine-a";
  all.stored = chain;
  auto r = c.client->ReportEngineBlocks(all);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->blocks == 10);
  CHECK(r->ttl == absl::Seconds(1));
  EngineBlocksReport some;
  some.engine_id = "engine-b";
  some.stored = {chain[0], chain[1], chain[2], chain[3], chain[4], chain[5]};
  some.removed = {chain[4]};  // removals apply first: chain[4] stays
  REQUIRE(c.client->ReportEngineBlocks(some).ok());
  EngineBlocksReport drop;
  drop.engine_id = "engine-b";
  drop.removed = {chain[2]};
  REQUIRE(c.client->ReportEngineBlocks(drop)->blocks == 5);
  // The 4-key client takes at most 4 keys a query: a router asks with its
  // own client.
  CHECK(c.client->PrefixQuery(chain).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ClientOptions ro;
  ro.master_address = c.master.address;
  auto router = Client::Create(ro);
  REQUIRE(router.ok());

  auto p = (*router)->PrefixQuery(chain);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  CHECK(p->hit_prefix_length == 3);
  REQUIRE(p->nodes.size() == 1);
  CHECK(p->nodes[0].longest_prefix == 3);
  REQUIRE(p->engines.size() == 2);
  CHECK(p->engines[0].engine_id == "engine-a");
  CHECK(p->engines[0].longest_prefix == 10);
  CHECK(p->engines[1].engine_id == "engine-b");
  CHECK(p->engines[1].longest_prefix == 2);

  // A third engine is refused while both others are known, with a reason.
  EngineBlocksReport third;
  third.engine_id = "engine-c";
  auto full = c.client->ReportEngineBlocks(third);
  CHECK(full.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(full.status()) == StatusReason::kEnginesFull);
  // Bad ids and keys are refused, and nothing already reported is lost.
  EngineBlocksReport bad;
  CHECK(c.client->ReportEngineBlocks(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
  bad.engine_id = "engine-a";
  bad.stored = {std::string(100000, 'k')};
  CHECK(c.client->ReportEngineBlocks(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*router)->PrefixQuery(chain)->engines.size() == 2);

  // engine-a keeps reporting (an empty report keeps it known), engine-b
  // stops: within the TTL it is forgotten, and engine-c takes its place.
  EngineBlocksReport alive;
  alive.engine_id = "engine-a";
  CHECK(testing::Eventually([&] {
    if (!c.client->ReportEngineBlocks(alive).ok()) return false;
    auto q = (*router)->PrefixQuery(chain);
    return q.ok() && q->engines.size() == 1 &&
           q->engines[0].engine_id == "engine-a";
  }));
  CHECK(c.client->ReportEngineBlocks(third).ok());
}

}  // namespace
}  // namespace hymcache
