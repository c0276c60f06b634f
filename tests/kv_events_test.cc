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
#include "proto/master.grpc.pb.h"
#include "tests/cluster.h"
#include "tools/hymctl/hymctl.h"

namespace hymcache {
namespace {

using testing::TestCluster;

std::unique_ptr<v1::MasterService::Stub> Stub(const std::string& address) {
  return v1::MasterService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Where a subscriber is in the stream.
struct Position {
  uint64_t stream = 0;
  uint64_t after = 0;
};

// Reads events after *at until the one numbered `until` or `max` events,
// then drops the stream (a subscriber going away); appends them to *out
// and the missed ranges to *missed; moves *at.
void Follow(v1::MasterService::Stub& stub, Position* at, uint64_t until,
            size_t max, std::vector<v1::KvEvent>* out,
            std::vector<std::pair<uint64_t, uint64_t>>* missed = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::WatchEventsRequest req;
  req.set_stream_id(at->stream);
  req.set_after_sequence(at->after);
  req.set_max_events(7);  // several messages
  auto reader = stub.WatchEvents(&ctx, req);
  v1::WatchEventsResponse resp;
  size_t got = 0;
  while (got < max && at->after < until && reader->Read(&resp)) {
    at->stream = resp.stream_id();
    if (resp.missed_to() != 0) {
      if (missed != nullptr) {
        missed->emplace_back(resp.missed_from(), resp.missed_to());
      }
      at->after = resp.missed_to();
    }
    for (const v1::KvEvent& e : resp.events()) {
      out->push_back(e);
      at->after = e.sequence();
      if (++got == max) break;
    }
  }
  ctx.TryCancel();
  reader->Finish();
}

uint64_t Latest(v1::MasterService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::WatchEventsRequest req;
  req.set_max_events(1);
  auto reader = stub.WatchEvents(&ctx, req);
  v1::WatchEventsResponse resp;
  REQUIRE(reader->Read(&resp));
  ctx.TryCancel();
  reader->Finish();
  return resp.latest_sequence();
}

std::vector<std::string> ChainKeys(int chain, int blocks) {
  std::vector<std::string> keys;
  for (int b = 0; b < blocks; ++b) keys.push_back(absl::StrCat("ch", chain, "-", b));
  return keys;
}

// Stores chains 0..chains-1 (each in turns of 3 blocks after the previous
// turn's last), removes a middle block of every third chain (its tail goes
// with it). Returns each chain's keys.
std::vector<std::vector<std::string>> Workload(Client& c, int chains,
                                               int blocks) {
  std::vector<std::vector<std::string>> all;
  const std::string data(4096, 'x');
  for (int ch = 0; ch < chains; ++ch) {
    std::vector<std::string> keys = ChainKeys(ch, blocks);
    for (int b = 0; b < blocks; b += 3) {
      std::vector<std::string> turn(keys.begin() + b,
                                    keys.begin() + std::min(b + 3, blocks));
      std::vector<ConstBuffer> bufs(turn.size(), {data.data(), data.size()});
      StoreOptions o;
      o.deadline = absl::Now() + absl::Seconds(10);
      if (b > 0) o.parent_key = keys[b - 1];
      auto r = c.Store(turn, bufs, o)->Wait(o.deadline);
      REQUIRE(r.ok());
      REQUIRE(r->stored == turn.size());
    }
    all.push_back(keys);
  }
  for (int ch = 0; ch < chains; ch += 3) {
    auto r = c.Remove({all[ch][blocks / 2]});
    REQUIRE(r.ok());
  }
  return all;
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
  Position whole;
  std::vector<v1::KvEvent> once;
  Follow(*stub, &whole, latest, SIZE_MAX, &once);
  // ...another in pieces of 50 events, reconnecting after each.
  Position pieces;
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

  // Every block stored once, before any removal of it; every removed block
  // (the removed middle blocks and their tails) removed once.
  std::map<std::string, int> stored, removed;
  std::set<uint32_t> up;
  for (const v1::KvEvent& e : once) {
    if (e.kind() == v1::KvEvent::BLOCK_STORED) {
      CHECK(removed.count(e.key()) == 0);
      ++stored[e.key()];
      CHECK(e.tier() == "dram");
      CHECK(e.tenant() == "default");
    } else if (e.kind() == v1::KvEvent::BLOCK_REMOVED) {
      CHECK(stored.count(e.key()) == 1);
      ++removed[e.key()];
    } else if (e.kind() == v1::KvEvent::NODE_UP) {
      up.insert(e.node_id());
    }
  }
  CHECK(up.size() == 2);
  CHECK(stored.size() == static_cast<size_t>(kChains * kBlocks));
  for (const auto& [k, n] : stored) CHECK(n == 1);
  size_t want_removed = 0;
  for (int ch = 0; ch < kChains; ch += 3) {
    for (int b = kBlocks / 2; b < kBlocks; ++b) {
      ++want_removed;
      CHECK(removed[chains[ch][b]] == 1);
    }
  }
  CHECK(removed.size() == want_removed);
  // A chain's parent is the block before it.
  for (const v1::KvEvent& e : once) {
    if (e.kind() != v1::KvEvent::BLOCK_STORED) continue;
    const auto dash = e.key().rfind('-');
    const int b = std::stoi(e.key().substr(dash + 1));
    CHECK(e.parent_key() ==
          (b == 0 ? "" : e.key().substr(0, dash + 1) + std::to_string(b - 1)));
  }

  // The router: key -> node from the events alone.
  std::map<std::string, uint32_t> where;
  for (const v1::KvEvent& e : once) {
    if (e.kind() == v1::KvEvent::BLOCK_STORED) where[e.key()] = e.node_id();
    if (e.kind() == v1::KvEvent::BLOCK_REMOVED) where.erase(e.key());
  }
  int agree = 0, asked = 0;
  for (const auto& keys : chains) {
    v1::PrefixQueryRequest req;
    for (const auto& k : keys) req.add_keys(k);
    grpc::ClientContext ctx;
    v1::PrefixQueryResponse resp;
    REQUIRE(stub->PrefixQuery(&ctx, req, &resp).ok());
    // The router's answer.
    uint32_t hit = 0;
    std::map<uint32_t, std::pair<uint32_t, uint32_t>> per;  // longest, blocks
    std::set<uint32_t> broke;
    for (const auto& k : keys) {
      auto w = where.find(k);
      if (w == where.end()) break;
      auto& p = per[w->second];
      ++p.second;
      for (auto& [id, q] : per) {
        if (id != w->second) broke.insert(id);
      }
      if (!broke.count(w->second)) p.first = hit + 1;
      ++hit;
    }
    bool same = resp.hit_prefix_length() == hit &&
                static_cast<size_t>(resp.nodes_size()) == per.size();
    for (const auto& n : resp.nodes()) {
      auto p = per.find(n.node_id());
      same = same && p != per.end() && p->second.first == n.longest_prefix() &&
             p->second.second == n.blocks();
    }
    agree += same;
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
  Position at{0, 0};
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
  for (const auto& k : ChainKeys(1, 6)) ok.add_keys(k);
  REQUIRE(stub->PrefixQuery(&c3, ok, &r).ok());
  CHECK(r.hit_prefix_length() == 6);
  REQUIRE(r.nodes_size() == 1);
  CHECK(r.nodes(0).longest_prefix() == 6);
  CHECK(r.nodes(0).blocks() == 6);
}

}  // namespace
}  // namespace hymcache
