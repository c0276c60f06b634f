// The gRPC MasterClient's lookups against the real master on loopback:
// over pooled LookupStreams (the default) they answer exactly as unary
// BatchLookups do, and the edges of a stream's life (refused credentials,
// a deadline mid-stream, a master that shuts down or restarts, a master
// without LookupStream) each end in the answer a unary call would give.
#include "client/grpc_master_client.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_stats.h"
#include "common/eventually.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/security.h"
#include "common/thread.h"
#include "common/wire.h"
#include "master/master_server.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace {

namespace pb = ::hymcache::v1;

constexpr int kStored = 24;  // keys "hit-0" .. "hit-23" are stored

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path p = std::filesystem::path(tmp ? tmp : "/tmp") /
                            ("grpc_master_client_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return (p / "db").string();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                       const std::string& token = "") {
  ChannelSecurity security;
  security.token = token;
  auto channel = CreateChannel(address, security);
  REQUIRE(channel.ok());
  return *channel;
}

std::unique_ptr<MasterClient> NewClient(const std::string& address,
                                        int idle_streams,
                                        const std::string& token = "") {
  GrpcMasterClientOptions o;
  o.idle_lookup_streams = idle_streams;
  return NewGrpcMasterClient(Channel(address, token), o);
}

std::string Hit(int i) { return absl::StrCat("hit-", i); }
std::string Miss(int i) { return absl::StrCat("miss-", i); }

// Registers a node and stores Hit(0..kStored-1) through `address`.
void Populate(const std::string& address, const std::string& node_token = "",
              const std::string& engine_token = "") {
  auto node = pb::MasterService::NewStub(Channel(address, node_token));
  pb::RegisterNodeRequest reg;
  reg.set_name("n1");
  reg.set_incarnation(1);
  reg.set_data_address("127.0.0.1:7000");
  reg.set_control_address("127.0.0.1:7001");
  pb::RegionInfo* region = reg.add_regions();
  region->set_capacity_bytes(uint64_t{1} << 30);
  region->set_alignment(4096);
  pb::RegisterNodeResponse reg_resp;
  {
    grpc::ClientContext ctx;
    REQUIRE(node->RegisterNode(&ctx, reg, &reg_resp).ok());
  }
  {
    grpc::ClientContext ctx;  // proves the key: the node is placeable
    pb::HeartbeatResponse hb;
    REQUIRE(node->Heartbeat(&ctx, master::ProvingHeartbeat(reg, reg_resp), &hb)
                .ok());
  }

  auto client = NewClient(address, 0, engine_token);
  PutStartArgs put;
  for (int i = 0; i < kStored; ++i) {
    put.keys.push_back(Hit(i));
    put.lengths.push_back(4096);
  }
  auto started = client->PutStart(put, absl::Now() + absl::Seconds(10));
  REQUIRE(started.ok());
  // The receipts the node (which holds no bytes here) would have given.
  const HmacSha256 node_key(reg_resp.node_key());
  std::vector<wire::Receipt> receipts;
  for (const PutSlot& slot : started->slots) {
    const ObjectLocation& l = slot.location;
    receipts.push_back(SignWriteReceipt(
        node_key, {l.node_id, l.region_id, l.addr, l.length, l.generation}));
  }
  REQUIRE(client
              ->PutCommit(started->put_id, {}, receipts,
                          absl::Now() + absl::Seconds(10))
              .ok());
}

// The master's counter `name` (GetStats; `token` an admin's).
double Stat(const std::string& address, const std::string& name,
            const std::string& token = "") {
  auto stub = pb::MasterService::NewStub(Channel(address, token));
  grpc::ClientContext ctx;
  pb::GetStatsResponse st;
  REQUIRE(stub->GetStats(&ctx, pb::GetStatsRequest(), &st).ok());
  return st.stats().at(name);
}

// Waits (up to 5 s) for the master's counter `name` to be `want`: the
// master notes a stream's end just after the caller has seen it.
void CheckStatBecomes(const std::string& address, const std::string& name,
                      double want, const std::string& token = "") {
  double v = 0;
  testing::Eventually(
      [&] {
        v = Stat(address, name, token);
        return v == want;
      },
      absl::Seconds(5));
  INFO(name);
  CHECK(v == want);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Hits and misses interleaved: Hit(first..), a miss after every third.
std::vector<std::string> Mixed(int first, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(i % 3 == 2 ? Miss(first + i) : Hit((first + i) % kStored));
  }
  return keys;
}

// The answer `keys` must get: where each stored key is, field by field
// (capabilities carry their own expiry, so they are not compared).
void CheckSame(const LookupBatch& a, const LookupBatch& b) {
  REQUIRE(a.found == b.found);
  REQUIRE(a.locations.size() == b.locations.size());
  for (size_t i = 0; i < a.found.size(); ++i) {
    if (!a.found[i]) continue;
    CHECK(a.locations[i].node_id == b.locations[i].node_id);
    CHECK(a.locations[i].region_id == b.locations[i].region_id);
    CHECK(a.locations[i].addr == b.locations[i].addr);
    CHECK(a.locations[i].length == b.locations[i].length);
    CHECK(a.locations[i].generation == b.locations[i].generation);
    CHECK(a.locations[i].capability.rights == b.locations[i].capability.rights);
  }
  REQUIRE(a.nodes.size() == b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    CHECK(a.nodes[i].node_id == b.nodes[i].node_id);
    CHECK(a.nodes[i].data_address == b.nodes[i].data_address);
  }
}

void CheckFound(const LookupBatch& b, const std::vector<std::string>& keys) {
  REQUIRE(b.found.size() == keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i]);
    CHECK(b.found[i] == (keys[i].rfind("hit-", 0) == 0));
  }
}

// Every answer of `lookups`, chunk after chunk, as one batch.
absl::StatusOr<LookupBatch> TakeAll(LookupStream* lookups) {
  LookupBatch all;
  while (lookups->has_next()) {
    absl::StatusOr<const LookupBatch*> b = lookups->Next(true);
    if (!b.ok()) return b.status();
    all.found.insert(all.found.end(), (*b)->found.begin(), (*b)->found.end());
    all.locations.insert(all.locations.end(), (*b)->locations.begin(),
                         (*b)->locations.end());
    for (const PeerInfo& n : (*b)->nodes) {
      if (all.nodes.empty()) all.nodes.push_back(n);  // one node here
    }
  }
  return all;
}

std::unique_ptr<MasterServer> StartMaster(const MasterOptions& o) {
  auto m = MasterServer::Create(o);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return std::move(m).value();
}

// A master with options `o` (its index under `name`) holding
// Hit(0..kStored-1).
std::unique_ptr<MasterServer> StartPopulated(const std::string& name,
                                             MasterOptions o = {}) {
  o.db_path = TestDir(name);
  auto master = StartMaster(o);
  Populate(master->address());
  return master;
}

TEST_CASE("Lookups over streams answer as unary BatchLookups do") {
  auto master = StartPopulated("same");
  const std::string address = master->address();
  auto streamed = NewClient(address, 4);
  auto unary = NewClient(address, 0);

  for (bool for_read : {false, true}) {
    for (int first : {0, 5, 17}) {
      INFO("for_read " << for_read << " first " << first);
      const std::vector<std::string> keys = Mixed(first, 12);
      const LookupIntent intent =
          for_read ? LookupIntent::kRead : LookupIntent::kPeek;
      auto s = streamed->Lookup(keys, intent, Soon());
      auto u = unary->Lookup(keys, intent, Soon());
      REQUIRE(s.ok());
      REQUIRE(u.ok());
      CheckFound(*s, keys);
      CheckSame(*s, *u);
    }
  }
  // All misses; and a refusal (a key too long) is the same refusal.
  const std::vector<std::string> misses = {Miss(1), Miss(2)};
  auto s = streamed->Lookup(misses, LookupIntent::kPeek, Soon());
  REQUIRE(s.ok());
  CHECK(s->found == std::vector<bool>{false, false});
  CHECK(s->nodes.empty());
  const std::vector<std::string> bad = {Hit(0), std::string(4096, 'x')};
  auto sb = streamed->Lookup(bad, LookupIntent::kPeek, Soon());
  auto ub = unary->Lookup(bad, LookupIntent::kPeek, Soon());
  CHECK(sb.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(sb.status() == ub.status());
  // The refusal ended that stream; the next lookup opens another.
  auto after = streamed->Lookup(Mixed(3, 6), LookupIntent::kRead, Soon());
  REQUIRE(after.ok());
  CheckFound(*after, Mixed(3, 6));

  // The streamed lookups went over streams, one at a time over one stream
  // (then a second after the refusal), and were counted as lookups.
  CHECK(Stat(address, "lookup_streams_opened") == 2);
  CheckStatBecomes(address, "lookup_streams_open", 1);
  CHECK(Stat(address, "lookups") == (6 + 1 + 1) + 6);
  CHECK(Stat(address, "lookup_errors") == 2);
  streamed.reset();  // closes its idle stream cleanly
  CheckStatBecomes(address, "lookup_streams_open", 0);
}

TEST_CASE(
    "An existence check finds what a lookup finds, over streams and unary, "
    "with no locations or nodes") {
  auto master = StartPopulated("exists");
  const std::string address = master->address();
  auto streamed = NewClient(address, 4);
  auto unary = NewClient(address, 0);
  for (int first : {0, 5, 17}) {
    INFO("first " << first);
    // 12 keys: the answer's bitmap spans two bytes.
    const std::vector<std::string> keys = Mixed(first, 12);
    auto peek = unary->Lookup(keys, LookupIntent::kPeek, Soon());
    REQUIRE(peek.ok());
    for (MasterClient* m : {streamed.get(), unary.get()}) {
      auto e = m->Lookup(keys, LookupIntent::kExists, Soon());
      REQUIRE(e.ok());
      CheckFound(*e, keys);
      CHECK(e->found == peek->found);
      CHECK(e->nodes.empty());
      for (const ObjectLocation& l : e->locations) CHECK(l.node_id == 0);
    }
  }
  // Counted as lookups, with their hits (three hits in Mixed(17, 12)...).
  const double hits_before = Stat(address, "lookup_hits");
  auto e =
      unary->Lookup({Hit(0), Miss(1), Hit(1)}, LookupIntent::kExists, Soon());
  REQUIRE(e.ok());
  CHECK(e->found == std::vector<bool>{true, false, true});
  CHECK(Stat(address, "lookup_hits") == hits_before + 2);
}

TEST_CASE(
    "A think-time hint's lookup reaches the master as one: its chain's next "
    "read is a returned turn") {
  MasterOptions o;
  o.service.eviction_policy = master::EvictionPolicy::kCost;
  auto master = StartPopulated("next_turn", o);
  const std::string address = master->address();
  for (size_t streams : {size_t{4}, size_t{0}}) {
    INFO("streams " << streams);
    auto client = NewClient(address, streams);
    const std::vector<std::string> chain = {Hit(0), Hit(1), Hit(2), Miss(3)};
    auto hint = client->Lookup(chain, LookupIntent::kNextTurn, Soon());
    REQUIRE(hint.ok());
    // A read for the lease, as kRead's: the stored prefix is found.
    CHECK(hint->found == std::vector<bool>{true, true, true, false});
    const double before = Stat(address, "turns_returned");
    // Not a return itself; the chain's next read is one.
    auto read = client->Lookup(chain, LookupIntent::kRead, Soon());
    REQUIRE(read.ok());
    CHECK(Stat(address, "turns_returned") == before + 1);
  }
  CHECK(Stat(address, "turns_not_returned") == 0);
}

TEST_CASE("A Load's pipelined lookups over a stream answer as unary ones") {
  auto master = StartPopulated("pipelined");
  const std::string address = master->address();
  auto streamed = NewClient(address, 4);
  auto unary = NewClient(address, 0);
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back(Hit(i));
  keys.push_back(Miss(0));
  keys.push_back(Hit(20));

  for (size_t chunk : {1, 3, 7, 22}) {
    INFO("chunk " << chunk);
    auto s = TakeAll(streamed->StartLookups(keys, chunk, Soon()).get());
    auto u = TakeAll(unary->StartLookups(keys, chunk, Soon()).get());
    REQUIRE(s.ok());
    REQUIRE(u.ok());
    CheckFound(*s, keys);
    CheckSame(*s, *u);
  }
  // One stream did all four, back in the pool after each.
  CHECK(Stat(address, "lookup_streams_opened") == 1);
  CHECK(Stat(address, "lookups") == 2 * (22 + 8 + 4 + 1));

  // Cancelled with answers outstanding: that stream is dropped.
  {
    auto lookups = streamed->StartLookups(keys, 2, Soon());
    auto first = lookups->Next(true);
    REQUIRE(first.ok());
    CHECK((*first)->found == std::vector<bool>{true, true});
    lookups->CancelRest();
    CHECK_FALSE(lookups->has_next());
  }
  auto after = streamed->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  REQUIRE(after.ok());
  CheckFound(*after, Mixed(0, 6));
  CHECK(Stat(address, "lookup_streams_opened") == 2);
}

TEST_CASE("A stream is checked as BatchLookup is: refused, and revoked") {
  MasterOptions o;
  o.db_path = TestDir("auth");
  const std::string engine = *NewToken(), admin = *NewToken(),
                    node = *NewToken(), other = *NewToken();
  o.auth_tokens_file = o.db_path + ".identities";
  auto write_identities = [&](bool with_engine) {
    std::ofstream f(o.auth_tokens_file);
    if (with_engine) {
      f << IdentityLine(Role::kEngine, "default", "engine", engine) << "\n";
    }
    f << IdentityLine(Role::kAdmin, "", "admin", admin) << "\n"
      << IdentityLine(Role::kNode, "", "node", node) << "\n";
  };
  write_identities(true);
  auto master = StartMaster(o);
  const std::string address = master->address();
  Populate(address, node, engine);

  auto good = NewClient(address, 4, engine);
  auto r = good->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  REQUIRE(r.ok());
  CheckFound(*r, Mixed(0, 6));

  auto unknown = NewClient(address, 4, other);
  auto u = unknown->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  CHECK(u.status().code() == absl::StatusCode::kUnauthenticated);
  auto as_node = NewClient(address, 4, node);
  auto n = as_node->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  CHECK(n.status().code() == absl::StatusCode::kPermissionDenied);
  // Refused when the stream opened, and not retried as unary calls.
  CHECK(Stat(address, "lookup_streams_refused", admin) == 2);
  CHECK(Stat(address, "lookup_errors", admin) == 0);

  // The engine's token revoked: its open stream stops working.
  CheckStatBecomes(address, "lookup_streams_open", 1, admin);
  write_identities(false);
  REQUIRE(master->ReloadIdentities().ok());
  auto revoked = good->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  CHECK(revoked.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(Stat(address, "lookup_errors", admin) == 1);
  CheckStatBecomes(address, "lookup_streams_open", 0, admin);
}

// Relays TCP connections to `target`; Pause() holds back the bytes coming
// from the target (a stalled network) until Resume().
class PausableRelay {
 public:
  explicit PausableRelay(std::string target) : target_(std::move(target)) {
    auto ls = ListenTcp("127.0.0.1", 0);
    REQUIRE(ls.ok());
    listen_ = std::move(*ls);
    port_ = *LocalPort(listen_.fd());
    accept_ = Thread("relay-accept", [this] { Accept(); });
  }
  ~PausableRelay() {
    {
      MutexLock l(&pause_mu_);  // wakes a pump waiting out a pause
      stop_ = true;
    }
    shutdown(listen_.fd(), SHUT_RDWR);
    accept_.Join();
    MutexLock l(&mu_);
    pumps_.clear();  // joins them (each sees stop_ within its poll period)
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Pause() {
    MutexLock l(&pause_mu_);
    paused_ = true;
  }
  void Resume() {
    MutexLock l(&pause_mu_);
    paused_ = false;
  }

 private:
  void Accept() {
    while (!stop_) {
      int fd = accept(listen_.fd(), nullptr, nullptr);
      if (fd < 0) return;
      auto client = std::make_shared<Socket>(fd);
      auto upstream = ConnectTcp(target_, absl::Now() + absl::Seconds(5));
      if (!upstream.ok()) continue;
      auto server = std::make_shared<Socket>(std::move(*upstream));
      MutexLock l(&mu_);
      pumps_.emplace_back("relay-up", [this, client, server] {
        Pump(client->fd(), server->fd(), false);
      });
      pumps_.emplace_back("relay-down", [this, client, server] {
        Pump(server->fd(), client->fd(), true);
      });
    }
  }
  void Pump(int from, int to, bool pausable) {
    char buf[16384];
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      // Checked once bytes are there: none is read after Pause() returns.
      if (pausable) {
        MutexLock l(&pause_mu_);
        auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pause_mu_) {
          return !paused_ || stop_;
        };
        pause_mu_.Await(absl::Condition(&go));
        if (stop_) return;
      }
      ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0 || !SendAll(to, buf, n, absl::Now() + absl::Seconds(5)).ok()) {
        shutdown(to, SHUT_RDWR);
        return;
      }
    }
  }

  const std::string target_;
  Socket listen_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  Mutex pause_mu_;
  bool paused_ ABSL_GUARDED_BY(pause_mu_) = false;
  Thread accept_;
  Mutex mu_;
  std::vector<Thread> pumps_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("A lookup past its deadline drops its stream; no late answer is "
          "taken for another lookup") {
  auto master = StartPopulated("deadline");
  PausableRelay relay(master->address());
  auto client = NewClient(relay.address(), 4);
  const std::vector<std::string> hits = {Hit(0), Hit(1), Hit(2)};
  const std::vector<std::string> misses = {Miss(0), Miss(1), Miss(2)};
  REQUIRE(client->Lookup(misses, LookupIntent::kPeek, Soon())
              .ok());  // a stream is open

  relay.Pause();
  const absl::Time start = absl::Now();
  auto late = client->Lookup(hits, LookupIntent::kPeek,
                             start + absl::Milliseconds(200));
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(3));
  relay.Resume();  // the answer to `hits` now arrives, on a cancelled stream

  for (int i = 0; i < 5; ++i) {
    auto r = client->Lookup(misses, LookupIntent::kPeek, Soon());
    REQUIRE(r.ok());
    CheckFound(*r, misses);
  }
  // The lookup really reached the master; its stream was dropped.
  CHECK(Stat(master->address(), "lookup_streams_opened") == 2);

  // The same for a Load's pipelined lookups.
  relay.Pause();
  {
    auto lookups = client->StartLookups(hits, 1, absl::Now() +
                                                     absl::Milliseconds(200));
    auto first = lookups->Next(true);
    CHECK(first.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  relay.Resume();
  auto r = TakeAll(client->StartLookups(misses, 1, Soon()).get());
  REQUIRE(r.ok());
  CheckFound(*r, misses);
  CHECK(Stat(master->address(), "lookup_streams_opened") == 3);
}

TEST_CASE("A lookup whose deadline has passed is not sent") {
  auto master = StartPopulated("already-late");
  const std::string address = master->address();
  auto client = NewClient(address, 4);
  REQUIRE(client->Lookup({Hit(0)}, LookupIntent::kPeek, Soon())
              .ok());  // a stream is idle
  const double before = Stat(address, "lookups");
  const absl::Time past = absl::Now() - absl::Seconds(1);
  for (int i = 0; i < 3; ++i) {
    CHECK(client->Lookup({Hit(0), Hit(1)}, LookupIntent::kRead, past)
              .status()
              .code() == absl::StatusCode::kDeadlineExceeded);
    auto lookups = client->StartLookups({Hit(0), Hit(1)}, 1, past);
    CHECK(lookups->Next(true).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
  }
  CHECK(Stat(address, "lookups") == before);
  // The idle stream was not spent on them.
  REQUIRE(client->Lookup({Hit(0)}, LookupIntent::kPeek, Soon()).ok());
  CHECK(Stat(address, "lookup_streams_opened") == 1);
}

TEST_CASE("Open streams do not hold up the master's shutdown; lookups "
          "follow a restarted master") {
  MasterOptions o;
  o.db_path = TestDir("restart");
  auto master = StartMaster(o);
  const std::string address = master->address();
  Populate(address);
  auto client = NewClient(address, 8);
  // Several open streams (concurrent callers), idle in the pool.
  std::atomic<int> failed{0};
  {
    std::vector<Thread> callers;
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back("caller", [&] {
        for (int i = 0; i < 20; ++i) {
          if (!client->Lookup(Mixed(i, 6), LookupIntent::kPeek, Soon()).ok())
            failed++;
        }
      });
    }
  }
  CHECK(failed == 0);
  REQUIRE(Stat(address, "lookup_streams_open") >= 1);

  // Without ending the streams, Shutdown would wait out its grace second.
  const absl::Time start = absl::Now();
  master->Shutdown();
  CHECK(absl::Now() - start < absl::Milliseconds(900));
  master.reset();
  auto down = client->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
  CHECK(down.status().code() == absl::StatusCode::kUnavailable);

  o.listen_address = address;  // the same port, the same index
  master = StartMaster(o);
  // Its node has not come back (its objects are misses until it does):
  // the answers are those of unary lookups now.
  auto unary = NewClient(address, 0);
  // The channel reconnects after its backoff (about a second).
  testing::Eventually(
      [&] {
        return client->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon()).ok();
      },
      absl::Seconds(10));
  for (int i = 0; i < 12; ++i) {  // more than the streams the pool held
    auto r = client->Lookup(Mixed(i, 6), LookupIntent::kRead, Soon());
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    auto u = unary->Lookup(Mixed(i, 6), LookupIntent::kRead, Soon());
    REQUIRE(u.ok());
    CheckSame(*r, *u);
  }
  CHECK(Stat(address, "lookup_streams_opened") >= 1);
  CHECK(Stat(address, "lookup_errors") == 0);
}

struct CallerTally {
  int wrong = 0;   // answers that were not the caller's own
  int failed = 0;  // lookups that failed
};

// `threads` threads each do `calls` lookups through `client` at once, for
// and not for read in turn. Each thread's keys have their own pattern (how
// many, where the misses fall), which tells its answers from the others'.
CallerTally LookupFromThreads(MasterClient* client, int threads, int calls) {
  std::atomic<int> wrong{0}, failed{0};
  {
    std::vector<Thread> callers;
    for (int t = 0; t < threads; ++t) {
      callers.emplace_back("caller", [&, t] {
        for (int i = 0; i < calls; ++i) {
          const std::vector<std::string> keys = Mixed(t * 7 + i, 1 + t);
          auto r = client->Lookup(
              keys, i % 2 == 0 ? LookupIntent::kRead : LookupIntent::kPeek,
              Soon());
          if (!r.ok()) {
            failed++;
            continue;
          }
          bool same = r->found.size() == keys.size();
          for (size_t k = 0; same && k < keys.size(); ++k) {
            same = r->found[k] == (keys[k].rfind("hit-", 0) == 0);
          }
          if (!same) wrong++;
        }
      });
    }
  }
  return {wrong.load(), failed.load()};
}

TEST_CASE("Many concurrent callers each get their own answers") {
  MasterOptions o;
  o.rpc_threads = 2;
  auto master = StartPopulated("concurrent", o);
  // A pool smaller than the callers: streams are opened and closed too.
  auto client = NewClient(master->address(), 2);
  const CallerTally tally = LookupFromThreads(client.get(), 8, 60);
  CHECK(tally.wrong == 0);
  CHECK(tally.failed == 0);
  CHECK(Stat(master->address(), "lookups") == 8 * 60);
  CheckStatBecomes(master->address(), "lookup_streams_open", 2);
}

// This process's established TCP connections to loopback port `port`, by
// local port (/proc/net/tcp and tcp6: gRPC dials 127.0.0.1 from an IPv6
// socket).
std::set<int> ConnectionsTo(int port) {
  std::set<int> local_ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      const size_t lc = local.rfind(':'), rc = remote.rfind(':');
      if (lc == std::string::npos || rc == std::string::npos) continue;
      if (state == "01" &&  // ESTABLISHED
          std::stoi(remote.substr(rc + 1), nullptr, 16) == port) {
        local_ports.insert(std::stoi(local.substr(lc + 1), nullptr, 16));
      }
    }
  }
  return local_ports;
}

TEST_CASE("Over several connections each calling thread keeps to one") {
  auto master = StartPopulated("connections");
  const std::string& address = master->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const std::set<int> before = ConnectionsTo(port);
  constexpr int kConnections = 4;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < kConnections; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("test.connection", i);  // distinct: no shared connection
    auto channel = CreateChannel(address, ChannelSecurity(), args);
    REQUIRE(channel.ok());
    channels.push_back(*channel);
  }
  auto client = NewGrpcMasterClient(channels, GrpcMasterClientOptions());
  REQUIRE(client != nullptr);
  CHECK(NewGrpcMasterClient(std::vector<std::shared_ptr<grpc::Channel>>(),
                            GrpcMasterClientOptions()) == nullptr);
  // As many threads as connections, calling at once: each thread's
  // lookups take the same stream again, on a connection of its own.
  const CallerTally tally = LookupFromThreads(client.get(), kConnections, 40);
  CHECK(tally.wrong == 0);
  CHECK(tally.failed == 0);
  std::set<int> added;
  for (int p : ConnectionsTo(port)) {
    if (before.count(p) == 0) added.insert(p);
  }
  CHECK(added.size() == kConnections);
  CHECK(Stat(address, "lookup_streams_opened") == kConnections);
  CHECK(Stat(address, "lookups") == kConnections * 40);
}

TEST_CASE("Beyond the master's stream limit, lookups go unary") {
  MasterOptions o;
  o.max_lookup_streams = 1;
  auto master = StartPopulated("limit", o);
  const std::string address = master->address();
  auto first = NewClient(address, 4);
  REQUIRE(first->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon())
              .ok());  // holds it
  auto second = NewClient(address, 4);
  for (int i = 0; i < 3; ++i) {
    auto r = second->Lookup(Mixed(i, 6), LookupIntent::kRead, Soon());
    REQUIRE(r.ok());
    CheckFound(*r, Mixed(i, 6));
  }
  // One refusal; the client then stays unary for a while.
  CHECK(Stat(address, "lookup_streams_refused") == 1);
  CHECK(Stat(address, "lookup_streams_opened") == 1);
  CHECK(Stat(address, "lookups") == 4);
}

// A master from before LookupStream: BatchLookup (passed on to a real
// master) and nothing else; gRPC answers LookupStream UNIMPLEMENTED. It
// also predates packed answers: it ignores the request's `packed` and
// answers with results. Or, `mangle`d, it answers packed, wrongly.
class OldMaster final : public pb::MasterService::Service {
 public:
  enum class Mangle { kNone, kExtra, kBadRecord };
  explicit OldMaster(const std::string& real, Mangle mangle = Mangle::kNone)
      : real_(pb::MasterService::NewStub(Channel(real))), mangle_(mangle) {}
  grpc::Status BatchLookup(grpc::ServerContext*,
                           const pb::BatchLookupRequest* req,
                           pb::BatchLookupResponse* resp) override {
    calls_++;
    if (req->packed()) packed_asks_++;
    pb::BatchLookupRequest forwarded = *req;
    forwarded.set_packed(mangle_ != Mangle::kNone);
    grpc::ClientContext ctx;
    grpc::Status s = real_->BatchLookup(&ctx, forwarded, resp);
    std::string* packed = resp->mutable_packed_results();
    if (mangle_ == Mangle::kExtra) {  // a well-formed record too many
      packed->append(wire::kLookupRecordBytes, '\0');
    }
    if (mangle_ == Mangle::kBadRecord && !packed->empty()) {
      (*packed)[packed->size() - 1 - wire::kCapTagBytes] = 1;  // reserved
    }
    return s;
  }
  int calls() const { return calls_.load(); }
  int packed_asks() const { return packed_asks_.load(); }

 private:
  std::unique_ptr<pb::MasterService::Stub> real_;
  const Mangle mangle_;
  std::atomic<int> calls_{0};
  std::atomic<int> packed_asks_{0};
};

// `service` served on a loopback port of its own; its address.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service,
                                    std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

// Passes PutStart and PutAbort on to a real master, but holds PutStart's
// answer until Release(): a master whose answer arrives after the caller's
// deadline.
class LateMaster final : public pb::MasterService::Service {
 public:
  explicit LateMaster(const std::string& real)
      : real_(pb::MasterService::NewStub(Channel(real))) {}
  grpc::Status PutStart(grpc::ServerContext*, const pb::PutStartRequest* req,
                        pb::PutStartResponse* resp) override {
    grpc::ClientContext ctx;
    grpc::Status s = real_->PutStart(&ctx, *req, resp);
    MutexLock l(&mu_);
    mu_.Await(absl::Condition(&released_));
    return s;
  }
  grpc::Status PutAbort(grpc::ServerContext*, const pb::PutAbortRequest* req,
                        pb::PutAbortResponse* resp) override {
    {
      MutexLock l(&mu_);
      aborts_.push_back(*req);
    }
    grpc::ClientContext ctx;
    return real_->PutAbort(&ctx, *req, resp);
  }
  void Release() {
    MutexLock l(&mu_);
    released_ = true;
  }
  std::vector<pb::PutAbortRequest> aborts() const {
    MutexLock l(&mu_);
    return aborts_;
  }

 private:
  std::unique_ptr<pb::MasterService::Stub> real_;
  mutable Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<pb::PutAbortRequest> aborts_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE(
    "A put whose PutStart answer misses the caller's deadline is aborted by "
    "its token, freeing its keys at once") {
  auto master = StartPopulated("late");
  LateMaster late(master->address());
  std::string late_address;
  std::unique_ptr<grpc::Server> server = Serve(&late, &late_address);
  auto client = NewClient(late_address, 0);
  PutStartArgs put;
  put.keys = {"late-0", "late-1"};
  put.lengths = {4096, 4096};
  auto started = client->PutStart(put, absl::Now() + absl::Milliseconds(300));
  CHECK(started.status().code() == absl::StatusCode::kDeadlineExceeded);
  late.Release();

  // The client named the put by the token its PutStart carried (it never
  // saw the put id), and the master ended it: without that, the keys would
  // be in progress for every writer until the put expired (30 s).
  REQUIRE(testing::Eventually([&] { return late.aborts().size() == 1; }));
  CHECK(late.aborts()[0].put_id() == 0);
  CHECK(late.aborts()[0].put_token() != 0);
  auto stub = pb::MasterService::NewStub(Channel(master->address()));
  REQUIRE(testing::Eventually([&] {
    grpc::ClientContext ctx;
    pb::GetStatsResponse st;
    return stub->GetStats(&ctx, pb::GetStatsRequest(), &st).ok() &&
           st.pending_puts() == 0;
  }));
  auto direct = NewClient(master->address(), 0);
  auto again = direct->PutStart(put, Soon());
  REQUIRE(again.ok());
  for (const PutSlot& slot : again->slots) {
    CHECK(slot.state == PutSlotState::kAllocated);
  }
  client.reset();
  server->Shutdown();
}

TEST_CASE("A master without LookupStream gets unary BatchLookups") {
  auto master = StartPopulated("old");
  OldMaster old(master->address());
  std::string old_address;
  std::unique_ptr<grpc::Server> server = Serve(&old, &old_address);

  auto client = NewClient(old_address, 4);
  auto direct = NewClient(master->address(), 4);
  // A Load's lookups: the stream fails, the chunks go unary.
  auto all = TakeAll(client->StartLookups(Mixed(0, 6), 2, Soon()).get());
  REQUIRE(all.ok());
  CheckFound(*all, Mixed(0, 6));
  CHECK(old.calls() == 3);
  for (int i = 0; i < 5; ++i) {
    // Answered with results (not packed): the same answer as the packed
    // one the master gives this client's version.
    auto r = client->Lookup(
        Mixed(i, 6), i % 2 == 0 ? LookupIntent::kRead : LookupIntent::kPeek,
        Soon());
    REQUIRE(r.ok());
    CheckFound(*r, Mixed(i, 6));
    auto d = direct->Lookup(
        Mixed(i, 6), i % 2 == 0 ? LookupIntent::kRead : LookupIntent::kPeek,
        Soon());
    REQUIRE(d.ok());
    CheckSame(*r, *d);
  }
  CHECK(old.calls() == 3 + 5);
  CHECK(old.packed_asks() == 3 + 5);  // asked for, and done without
  CHECK(Stat(master->address(), "lookup_streams_opened") == 1);  // direct's
  client.reset();
  server->Shutdown();
}

// Answers GetStats with a distinct value in every cluster stat.
class StatsMaster final : public pb::MasterService::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext*, const pb::GetStatsRequest*,
                        pb::GetStatsResponse* resp) override {
    uint64_t v = 100;
#define HYM_SET_GAUGE_(field, metric, help) resp->set_##field(++v);
#define HYM_SET_COUNTER_(field) resp->set_##field(++v);
    HYM_CLUSTER_STATS(HYM_SET_GAUGE_, HYM_SET_COUNTER_)
#undef HYM_SET_GAUGE_
#undef HYM_SET_COUNTER_
    pb::NodeInfo* n = resp->add_nodes();
    n->set_name("n1");
    n->set_alive(true);
    return grpc::Status::OK;
  }
};

TEST_CASE("GetClusterStatus carries every cluster stat the master sends") {
  StatsMaster fake;
  std::string address;
  std::unique_ptr<grpc::Server> server = Serve(&fake, &address);
  auto client = NewClient(address, 0);
  auto st = client->GetClusterStatus(Soon());
  REQUIRE(st.ok());
  REQUIRE(st->nodes.size() == 1);
  CHECK(st->nodes[0].name == "n1");
  // In the list's order, each its own value: none dropped or crossed.
  CHECK(st->object_count == 101);
  CHECK(st->nodes_alive == 104);
  CHECK(st->evicted_objects == 107);
  CHECK(st->reconcile_unlisted_extents == 111);
  CHECK(st->read_repairs == 112);
  uint64_t want = 100;
#define HYM_CHECK_GAUGE_(field, metric, help) \
  CHECK(st->field == ++want);
#define HYM_CHECK_COUNTER_(field) CHECK(st->field == ++want);
  HYM_CLUSTER_STATS(HYM_CHECK_GAUGE_, HYM_CHECK_COUNTER_)
#undef HYM_CHECK_GAUGE_
#undef HYM_CHECK_COUNTER_
  client.reset();
  server->Shutdown();
}

TEST_CASE("A malformed packed answer is an error, never another key's") {
  auto master = StartPopulated("mangled");
  for (auto mangle :
       {OldMaster::Mangle::kExtra, OldMaster::Mangle::kBadRecord}) {
    OldMaster bad(master->address(), mangle);
    std::string address;
    std::unique_ptr<grpc::Server> server = Serve(&bad, &address);
    auto client = NewClient(address, 4);
    auto r = client->Lookup(Mixed(0, 6), LookupIntent::kPeek, Soon());
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kInternal);
    auto all = TakeAll(client->StartLookups(Mixed(0, 6), 3, Soon()).get());
    CHECK(all.status().code() == absl::StatusCode::kInternal);
    CHECK(bad.calls() >= 2);  // the second, a Load's first chunk
    client.reset();
    server->Shutdown();
  }
}

}  // namespace
}  // namespace hymcache
