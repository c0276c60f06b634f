// Unit tests of the client's read path (Load) and write path (Store) on
// fakes of its seams: no daemons, no sockets, no sleeps (an injected clock
// that the fake transport advances per op).
#include "client/client_impl.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/testing/fake_master_client.h"
#include "client/testing/fake_transport.h"
#include "common/eventually.h"
#include "common/status_reason.h"

namespace hymcache {
namespace {

constexpr size_t kLen = 1000;
constexpr uint8_t kUntouched = 0xEE;

ClientOptions TestOptions() {
  ClientOptions o;
  o.master_address = "fake-master:1";
  o.lookup_batch_keys = 4;
  o.read_batch_bytes = 4 * kLen;
  // These tests count the lookup path's calls; the location cache's own
  // cases below turn it on.
  o.location_cache_entries = 0;
  return o;
}

// A client on a fake master with nodes 1 and 2 and a fake transport that
// advances `clock` by `op_time` per op.
struct Rig {
  explicit Rig(ClientOptions o = TestOptions(),
               absl::Duration op_time = absl::ZeroDuration()) {
    REQUIRE(o.Validate().ok());
    master = std::make_shared<FakeMasterClient>();
    transport = std::make_shared<FakeTransport>(&clock, op_time);
    master->AddNode({1, "node-1:1", {}});
    master->AddNode({2, "node-2:1", {}});
    auto c = NewClientImpl(o, master, transport, &clock);
    REQUIRE(c.ok());
    client = std::move(*c);
  }

  FakeClock clock;
  std::shared_ptr<FakeMasterClient> master;
  std::shared_ptr<FakeTransport> transport;
  std::unique_ptr<Client> client;
};

struct Blocks {
  Blocks(size_t n, size_t first = 0) {
    for (size_t i = first; i < first + n; ++i) {
      keys.push_back(absl::StrCat("k", i));
      data.emplace_back(kLen);
      for (size_t j = 0; j < kLen; ++j) {
        data.back()[j] = static_cast<uint8_t>(i * 31 + j * 7 + 1);
      }
    }
  }
  std::vector<ConstBuffer> in() const {
    std::vector<ConstBuffer> b;
    for (const auto& d : data) b.push_back({d.data(), d.size()});
    return b;
  }
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> data;
};

PutResult StoreAll(Rig& rig, const Blocks& b, StoreOptions so = {}) {
  so.deadline = rig.clock.Now() + absl::Hours(1);
  auto r = rig.client->Store(b.keys, b.in(), so)->Wait();
  REQUIRE(r.ok());
  REQUIRE(r->stored == b.keys.size());
  return *r;
}

// Stores k0..k3 on node 1 and k4..k7 on node 2 (later puts go to node 2).
void StoreSplit(Rig& rig) {
  StoreAll(rig, Blocks(4));
  rig.master->SetDefaultNode(2);
  StoreAll(rig, Blocks(4, 4));
}

// Destination buffers, filled with kUntouched.
struct Out {
  explicit Out(size_t n, size_t len = kLen) : bytes(n, std::vector<uint8_t>(len, kUntouched)) {
    for (auto& b : bytes) bufs.push_back({b.data(), b.size()});
  }
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<MutableBuffer> bufs;
};

// Blocks [0, loaded) hold the stored bytes; blocks from `untouched` on
// (default: loaded) were not written. (Blocks in between were in a read
// batch after the one that failed: the transport may have filled them.)
void CheckLoaded(const Blocks& b, const Out& out, size_t loaded,
                 size_t untouched = SIZE_MAX) {
  if (untouched == SIZE_MAX) untouched = loaded;
  for (size_t i = 0; i < b.keys.size(); ++i) {
    INFO("block " << i);
    if (i < loaded) {
      REQUIRE(std::memcmp(out.bytes[i].data(), b.data[i].data(), kLen) == 0);
    } else if (i >= untouched) {
      REQUIRE(out.bytes[i] == std::vector<uint8_t>(out.bytes[i].size(), kUntouched));
    }
  }
}

TEST_CASE("Options: master connections and the gRPC poll strategy") {
  ClientOptions o = TestOptions();
  for (int n : {1, 8, 64}) {
    o.master_connections = n;
    CHECK(o.Validate().ok());
  }
  for (int n : {0, -1, 65}) {
    o.master_connections = n;
    CHECK(absl::IsInvalidArgument(o.Validate()));
  }
  o.master_connections = 4;
  CHECK(ClientOptions().grpc_poll_strategy == "auto");
  for (const char* s : {"", "auto", "poll", "epoll1"}) {
    o.grpc_poll_strategy = s;
    CHECK(o.Validate().ok());
  }
  for (const char* s : {"epollex", "POLL", "none"}) {
    o.grpc_poll_strategy = s;
    const absl::Status st = o.Validate();
    CHECK(absl::IsInvalidArgument(st));
    CHECK(st.message().find("grpc_poll_strategy") != absl::string_view::npos);
  }
}

TEST_CASE("Load reads every stored block byte for byte, in batches of read_batch_bytes") {
  Rig rig;
  Blocks b(10);
  StoreAll(rig, b);
  Out out(10);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->stop_reason.ok());
  CHECK(r->loaded == 10);
  CHECK(r->hit_prefix == 10);
  CHECK(r->bytes == 10 * kLen);
  CHECK(r->lengths == std::vector<uint64_t>(10, kLen));
  CheckLoaded(b, out, 10);
  CHECK(rig.transport->session_reads() == std::vector<size_t>{4, 4, 2});
  CHECK(rig.master->stream_chunk_keys() == std::vector<size_t>{4});
  CHECK(rig.transport->reads().empty());
  CHECK(rig.transport->prefetched() == 10);
  // Everything announced was read: nothing to release.
  rig.client.reset();
  CHECK(rig.transport->released_sessions().empty());
}

TEST_CASE("Load sends no hint when one read takes every block it found") {
  Rig rig;
  Blocks b(3);  // 3 blocks fit one read of read_batch_bytes (4)
  StoreAll(rig, b);
  SECTION("all of them stored: one lookup, one plain read") {
    Out out(3);
    auto r = rig.client->Load(b.keys, out.bufs);
    REQUIRE(r.ok());
    CHECK(r->stop_reason.ok());
    CHECK(r->loaded == 3);
    CHECK(r->bytes == 3 * kLen);
    CheckLoaded(b, out, 3);
    CHECK(rig.transport->prefetched() == 0);
    CHECK(rig.transport->reads() == std::vector<size_t>{3});
    CHECK(rig.transport->session_reads().empty());
  }
  SECTION("one key") {
    Out out(1);
    auto r = rig.client->Load({b.keys[1]}, {out.bufs[0]});
    REQUIRE(r.ok());
    CHECK(r->loaded == 1);
    CHECK(std::memcmp(out.bytes[0].data(), b.data[1].data(), kLen) == 0);
    CHECK(rig.transport->prefetched() == 0);
    CHECK(rig.transport->reads() == std::vector<size_t>{1});
  }
  SECTION("a miss after them") {
    Blocks more(5);  // k3, k4 never stored
    Out out(5);
    auto r = rig.client->Load(more.keys, out.bufs);
    REQUIRE(r.ok());
    CHECK(r->loaded == 3);
    CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
    CheckLoaded(more, out, 3);
    CHECK(rig.transport->prefetched() == 0);
    CHECK(rig.transport->reads() == std::vector<size_t>{3});
  }
  // Nothing was announced, so no session to end.
  rig.client.reset();
  CHECK(rig.transport->released_sessions().empty());
}

TEST_CASE("Load hints every block when they take more than one read") {
  Rig rig;
  Blocks b(5);  // 4 + 1 blocks: two reads
  StoreAll(rig, b);
  Out out(5);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 5);
  CheckLoaded(b, out, 5);
  CHECK(rig.transport->prefetched() == 5);
  CHECK(rig.transport->session_reads() == std::vector<size_t>{4, 1});
  CHECK(rig.transport->reads().empty());
}

TEST_CASE(
    "Load reads hinted blocks in the session and a last unhinted run plainly") {
  ClientOptions o = TestOptions();
  o.lookup_batch_keys = 2;
  Rig rig(o);
  Blocks b(4);
  StoreAll(rig, b);
  // The second lookup chunk arrives only after the first chunk's blocks
  // are read: they were hinted (more lookups were pending); the last two,
  // one read with nothing else left, are not.
  rig.master->SetLaterChunksLate(true);
  Out out(4);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 4);
  CheckLoaded(b, out, 4);
  CHECK(rig.transport->prefetched() == 2);
  CHECK(rig.transport->session_reads() == std::vector<size_t>{2});
  CHECK(rig.transport->reads() == std::vector<size_t>{2});
  rig.client.reset();
  CHECK(rig.transport->released_sessions().empty());
}

TEST_CASE("Load stops at a miss in the middle of a lookup chunk") {
  Rig rig;
  Blocks b(10);
  Blocks head(5), tail(4, 6);  // k5 is never stored
  StoreAll(rig, head);
  StoreAll(rig, tail);
  Out out(10);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 5);
  CHECK(r->hit_prefix == 5);
  CHECK(r->bytes == 5 * kLen);
  CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
  CheckLoaded(b, out, 5);
  // Chunks [k0..k3] and [k4..k7]; the third is never asked for.
  CHECK(rig.master->lookup_chunks_taken() == 2);
  CHECK(rig.master->streams_cancelled_early() == 1);
  CHECK(rig.transport->prefetched() == 5);
}

TEST_CASE("Load reads an aborted suffix again") {
  ClientOptions o = TestOptions();
  o.read_batch_bytes = 8 * kLen;
  Rig rig(o);
  Blocks b(9);  // two reads: hinted
  StoreAll(rig, b);
  rig.transport->AbortNextSessionReadAfter(3);
  Out out(9);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->stop_reason.ok());
  CHECK(r->loaded == 9);
  CHECK(r->bytes == 9 * kLen);
  CheckLoaded(b, out, 9);
  // Three served, five aborted and asked for again with the ninth.
  CHECK(rig.transport->session_reads() == std::vector<size_t>{8, 6});
}

TEST_CASE("Load returns the blocks read before a deadline in the middle of a batch") {
  ClientOptions o = TestOptions();
  o.read_batch_bytes = 6 * kLen;
  Rig rig(o, /*op_time=*/absl::Seconds(1));
  Blocks b(7);  // two reads: hinted
  StoreAll(rig, b);
  Out out(7);
  // Ops start at +0 s, +1 s, +2 s; the fourth, at +3 s, is past it.
  LoadOptions lo;
  lo.deadline = rig.clock.Now() + absl::Milliseconds(2500);
  auto r = rig.client->Load(b.keys, out.bufs, lo);
  REQUIRE(r.ok());
  CHECK(r->loaded == 3);
  CHECK(r->bytes == 3 * kLen);
  CHECK(r->hit_prefix == 7);
  CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
  CheckLoaded(b, out, 3);
  CHECK(rig.transport->session_reads() == std::vector<size_t>{6});
  // The four announced and not read are released on their node.
  rig.client.reset();
  CHECK(rig.transport->released_sessions().size() == 1);
}

TEST_CASE("Load stops at a node that died between the lookup and the read") {
  ClientOptions o = TestOptions();
  o.read_batch_bytes = 8 * kLen;
  Rig rig(o);
  Blocks b(8);
  StoreSplit(rig);
  REQUIRE(rig.master->Find("k3")->node_id == 1);
  REQUIRE(rig.master->Find("k4")->node_id == 2);
  rig.transport->KillNode(2);
  Out out(8);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 4);
  CHECK(r->bytes == 4 * kLen);
  CHECK(r->hit_prefix == 8);
  CHECK(r->stop_reason.code() == absl::StatusCode::kUnavailable);
  CheckLoaded(b, out, 4);
  // A node that is down is not a node that lost the objects: no read
  // repair. Both nodes are told to drop the session.
  rig.client.reset();
  CHECK(rig.master->reported_missing().empty());
  CHECK(rig.master->Find("k4").has_value());
  CHECK(rig.transport->released_sessions().size() == 2);
}

TEST_CASE(
    "A node that does not answer is skipped for unresponsive_node_period: "
    "its blocks are misses at once, then it is tried again") {
  ClientOptions o = TestOptions();
  o.read_batch_bytes = 8 * kLen;
  Rig rig(o);
  Blocks b(8);
  StoreSplit(rig);
  REQUIRE(rig.master->Find("k4")->node_id == 2);
  rig.transport->SilenceNode(2);
  LoadOptions lo;
  lo.prefetch = false;

  // The first load waits for node 2 until its deadline, with the blocks of
  // node 1 loaded.
  Out first(8);
  absl::Time start = rig.clock.Now();
  lo.deadline = start + absl::Seconds(2);
  auto r = rig.client->Load(b.keys, first.bufs, lo);
  REQUIRE(r.ok());
  CHECK(r->loaded == 4);
  CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(rig.clock.Now() - start == absl::Seconds(2));
  CheckLoaded(b, first, 4);
  const size_t reads = rig.transport->reads().size();

  // The next ones do not wait: node 2's blocks are misses at once.
  for (int i = 0; i < 3; ++i) {
    Out again(8);
    start = rig.clock.Now();
    lo.deadline = start + absl::Seconds(2);
    r = rig.client->Load(b.keys, again.bufs, lo);
    REQUIRE(r.ok());
    CHECK(r->loaded == 4);
    CHECK(r->stop_reason.code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StrContains(r->stop_reason.message(), "did not answer"));
    CHECK(rig.clock.Now() == start);
    CheckLoaded(b, again, 4);
  }
  CHECK(rig.transport->reads().size() == reads + 3);  // node 1's only

  // A Store that the master places on node 2 is not written, at once.
  Blocks more(2, 100);
  StoreOptions so;
  so.deadline = rig.clock.Now() + absl::Seconds(2);
  const size_t writes = rig.transport->writes().size();
  auto w = rig.client->Store(more.keys, more.in(), so)->Wait();
  REQUIRE(w.ok());
  CHECK(w->stored == 0);
  CHECK(w->failed == 2);
  CHECK(rig.transport->writes().size() == writes);
  CHECK_FALSE(rig.master->Find("k100").has_value());

  // After the period the node is tried again: it answers now.
  rig.transport->ReviveNode(2);
  rig.clock.Advance(o.unresponsive_node_period);
  Out back(8);
  lo.deadline = rig.clock.Now() + absl::Seconds(2);
  r = rig.client->Load(b.keys, back.bufs, lo);
  REQUIRE(r.ok());
  CHECK(r->loaded == 8);
  CheckLoaded(b, back, 8);
}

TEST_CASE(
    "A node is not held unresponsive for a deadline too short to answer in, "
    "nor with unresponsive_node_period zero") {
  for (const absl::Duration period : {absl::Seconds(5), absl::ZeroDuration()}) {
    ClientOptions o = TestOptions();
    o.unresponsive_node_period = period;
    Rig rig(o);
    Blocks b(4);
    StoreAll(rig, b);
    const uint32_t node = rig.master->Find("k0")->node_id;
    rig.transport->SilenceNode(node);
    LoadOptions lo;
    lo.prefetch = false;
    Out out(4);
    // 50 ms to answer is too little to judge the node by (kMinWait).
    lo.deadline = rig.clock.Now() + absl::Milliseconds(50);
    auto r = rig.client->Load(b.keys, out.bufs, lo);
    REQUIRE(r.ok());
    CHECK(r->loaded == 0);
    CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
    // Waiting 2 s marks it, unless the period is zero.
    lo.deadline = rig.clock.Now() + absl::Seconds(2);
    r = rig.client->Load(b.keys, out.bufs, lo);
    REQUIRE(r.ok());
    CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
    const size_t reads = rig.transport->reads().size();
    lo.deadline = rig.clock.Now() + absl::Seconds(2);
    r = rig.client->Load(b.keys, out.bufs, lo);
    REQUIRE(r.ok());
    CHECK(r->loaded == 0);
    if (period > absl::ZeroDuration()) {
      CHECK(r->stop_reason.code() == absl::StatusCode::kUnavailable);
      CHECK(rig.transport->reads().size() == reads);
    } else {
      CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
      CHECK(rig.transport->reads().size() == reads + 1);
    }
  }
  ClientOptions bad = TestOptions();
  bad.unresponsive_node_period = absl::Seconds(-1);
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Load reports an object its node no longer holds, and stops before it") {
  Rig rig;
  Blocks b(6);
  StoreAll(rig, b);
  const ObjectLocation lost = *rig.master->Find("k2");
  rig.transport->Forget(lost.node_id, lost.addr);
  Out out(6);
  LoadOptions lo;
  lo.prefetch = false;
  auto r = rig.client->Load(b.keys, out.bufs, lo);
  REQUIRE(r.ok());
  CHECK(r->loaded == 2);
  CHECK(r->bytes == 2 * kLen);
  CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
  CheckLoaded(b, out, 2, /*untouched=*/4);  // one batch of 4 blocks
  CHECK(rig.transport->reads() == std::vector<size_t>{4});
  CHECK(rig.transport->session_reads().empty());
  CHECK(rig.transport->prefetched() == 0);
  rig.client.reset();  // runs the background report
  auto reported = rig.master->reported_missing();
  REQUIRE(reported.size() == 1);
  CHECK(reported[0].first == "k2");
  CHECK(reported[0].second.addr == lost.addr);
  CHECK(reported[0].second.generation == lost.generation);
  CHECK_FALSE(rig.master->Find("k2").has_value());
  CHECK(rig.master->Find("k3").has_value());
}

TEST_CASE("Load reads what it has while later lookups are in flight") {
  ClientOptions o = TestOptions();
  o.lookup_batch_keys = 2;
  o.read_batch_bytes = kLen;
  Rig rig(o);
  Blocks b(6);
  StoreAll(rig, b);
  rig.master->SetLaterChunksLate(true);
  Out out(6);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 6);
  CHECK(r->bytes == 6 * kLen);
  CheckLoaded(b, out, 6);
  CHECK(rig.transport->session_reads() == std::vector<size_t>(6, 1));
  CHECK(rig.master->lookup_chunks_taken() == 3);
}

TEST_CASE("Load: a lookup that fails after the first chunk returns what was loaded") {
  Rig rig;
  Blocks b(10);
  StoreAll(rig, b);
  SECTION("second chunk") {
    rig.master->FailLookupChunk(1, absl::UnavailableError("master down"));
    Out out(10);
    auto r = rig.client->Load(b.keys, out.bufs);
    REQUIRE(r.ok());
    CHECK(r->loaded == 4);
    CHECK(r->bytes == 4 * kLen);
    CHECK(r->hit_prefix == 4);
    CHECK(r->stop_reason.code() == absl::StatusCode::kUnavailable);
    CheckLoaded(b, out, 4);
  }
  SECTION("first chunk: the call fails") {
    rig.master->FailLookupChunk(0, absl::UnavailableError("master down"));
    Out out(10);
    auto r = rig.client->Load(b.keys, out.bufs);
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
    CheckLoaded(b, out, 0);
  }
}

TEST_CASE("Load stops before a buffer too small for its block") {
  Rig rig;
  Blocks b(5);
  StoreAll(rig, b);
  Out out(5);
  out.bufs[3].size = kLen - 1;
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 3);
  CHECK(r->stop_reason.code() == absl::StatusCode::kOutOfRange);
  CheckLoaded(b, out, 3);
}

TEST_CASE("Get is Load without prefetch hints; Put is Store and wait") {
  Rig rig;
  Blocks b(6);
  auto put = rig.client->Put(b.keys, b.in());
  REQUIRE(put.ok());
  CHECK(put->stored == 6);
  CHECK(rig.transport->writes() == std::vector<size_t>{6});
  Out out(6);
  auto got = rig.client->Get(b.keys, out.bufs);
  REQUIRE(got.ok());
  CHECK(got->loaded == 6);
  CHECK(got->bytes == 6 * kLen);
  CheckLoaded(b, out, 6);
  CHECK(rig.transport->reads() == std::vector<size_t>{4, 2});
  CHECK(rig.transport->session_reads().empty());
  CHECK(rig.transport->prefetched() == 0);
  // Without hints, lookups of max_keys_per_rpc keys (no staging to start).
  CHECK(rig.master->stream_chunk_keys() == std::vector<size_t>{1024});
}

TEST_CASE("BatchLookup past its deadline fails without asking the master") {
  Rig rig;
  Blocks b(3);
  StoreAll(rig, b);
  CallOptions now;
  now.deadline = rig.clock.Now();  // a zero timeout
  auto late = rig.client->BatchLookup(b.keys, now);
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  // The same lookup with time left finds all three.
  now.deadline = rig.clock.Now() + absl::Seconds(1);
  auto look = rig.client->BatchLookup(b.keys, now);
  REQUIRE(look.ok());
  CHECK(look->hit_prefix == 3);
}

TEST_CASE("A Put given no deadline has the call default, a Store the store default") {
  ClientOptions o = TestOptions();
  o.default_deadline = absl::Seconds(10);
  o.default_store_deadline = absl::Milliseconds(1500);
  Rig rig(o, /*op_time=*/absl::Seconds(1));
  Blocks b(3), c(3, 3);
  auto put = rig.client->Put(b.keys, b.in());  // writes take 3 s < 10 s
  REQUIRE(put.ok());
  CHECK(put->stored == 3);
  auto store = rig.client->Store(c.keys, c.in(), {})->Wait();  // 3 s > 1.5 s
  REQUIRE(store.ok());
  CHECK(store->stored == 0);
  CHECK(store->failed == 3);
  CHECK(store->errors[2].code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("Store writes and commits new blocks and skips stored or in-progress ones") {
  Rig rig;
  Blocks first(5);
  StoreAll(rig, first);
  CHECK(rig.transport->writes() == std::vector<size_t>{5});
  REQUIRE(rig.master->commits().size() == 1);
  CHECK(rig.master->commits()[0].failed_indexes.empty());

  Blocks more(8);  // k0..k4 stored, k5 in progress elsewhere, k6 and k7 new
  rig.master->MarkInProgress("k5");
  auto r = rig.client->Store(more.keys, more.in(), {})->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 2);
  CHECK(r->skipped == 6);
  CHECK(r->failed == 0);
  CHECK(r->outcomes[0] == PutOutcome::kAlreadyStored);
  CHECK(r->outcomes[5] == PutOutcome::kInProgress);
  CHECK(r->outcomes[6] == PutOutcome::kStored);
  CHECK(r->node_id == 1);
  CHECK(rig.transport->writes() == std::vector<size_t>{5, 2});
  CHECK(rig.master->Find("k7").has_value());
  CHECK_FALSE(rig.master->Find("k5").has_value());
}

TEST_CASE("Store: no node has room, every block is refused and nothing is written") {
  Rig rig;
  rig.master->FailPutStart(absl::ResourceExhaustedError("no node has room"));
  Blocks b(4);
  auto r = rig.client->Store(b.keys, b.in(), {})->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 0);
  CHECK(r->failed == 4);
  CHECK(r->refused == 4);
  for (const absl::Status& e : r->errors) {
    CHECK(e.code() == absl::StatusCode::kResourceExhausted);
    CHECK(ReasonOf(e) == StatusReason::kNoRoom);
  }
  CHECK(rig.transport->writes().empty());
}

TEST_CASE("Store: a whole-call failure of the first PutStart is the handle's error") {
  Rig rig;
  rig.master->FailPutStart(absl::UnavailableError("master down"));
  Blocks b(3);
  auto r = rig.client->Store(b.keys, b.in(), {})->Wait();
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(rig.transport->writes().empty());
}

TEST_CASE("Store: a node refusing one write commits the others") {
  Rig rig;
  Blocks b(5);
  rig.transport->FailNextWriteOp(2, absl::ResourceExhaustedError("write buffer full"));
  auto r = rig.client->Store(b.keys, b.in(), {})->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 4);
  CHECK(r->failed == 1);
  CHECK(r->refused == 1);
  CHECK(r->outcomes[2] == PutOutcome::kFailed);
  CHECK(r->errors[2].code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(r->errors[2]) == StatusReason::kNodeRefusedWrite);
  REQUIRE(rig.master->commits().size() == 1);
  CHECK(rig.master->commits()[0].failed_indexes == std::vector<uint32_t>{2});
  CHECK_FALSE(rig.master->Find("k2").has_value());
  // The chain is readable up to the hole.
  Out out(5);
  auto got = rig.client->Load(b.keys, out.bufs);
  REQUIRE(got.ok());
  CHECK(got->loaded == 2);
  CHECK(got->hit_prefix == 2);
  CheckLoaded(b, out, 2);
}

TEST_CASE("Store: a call over several PutStarts keeps the chunks committed before a failure") {
  ClientOptions o = TestOptions();
  o.max_keys_per_rpc = 4;
  Rig rig(o);
  rig.master->SetDefaultNode(2);
  rig.master->FailPutStart(absl::UnavailableError("master down"), /*from_call=*/1);
  Blocks b(10);
  auto r = rig.client->Store(b.keys, b.in(), {})->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 4);
  CHECK(r->failed == 6);
  CHECK(r->refused == 0);
  for (size_t i = 4; i < 10; ++i) {
    CHECK(r->errors[i].code() == absl::StatusCode::kUnavailable);
  }
  CHECK(rig.master->Find("k3").has_value());
  CHECK_FALSE(rig.master->Find("k4").has_value());
  // The second chunk named the first one's last key and node.
  auto starts = rig.master->put_starts();
  REQUIRE(starts.size() == 2);
  CHECK(starts[1].parent_key == "k3");
  CHECK(starts[1].preferred_node_id == 2);
  CHECK(starts[1].keys == std::vector<std::string>{"k4", "k5", "k6", "k7"});
}

TEST_CASE("Store: a deadline in the middle of the writes aborts the put") {
  Rig rig(TestOptions(), /*op_time=*/absl::Seconds(1));
  Blocks b(3);
  StoreOptions so;
  so.deadline = rig.clock.Now() + absl::Milliseconds(1500);  // 2 writes fit
  auto r = rig.client->Store(b.keys, b.in(), so)->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 0);
  CHECK(r->failed == 3);
  for (const absl::Status& e : r->errors) {
    CHECK(e.code() == absl::StatusCode::kDeadlineExceeded);
  }
  CHECK(rig.master->commits().empty());
  CHECK(rig.master->aborts().size() == 1);
  CHECK_FALSE(rig.master->Find("k0").has_value());
}

TEST_CASE("Store: a failed commit stores nothing") {
  Rig rig;
  rig.master->FailPutCommit(absl::UnavailableError("master down"));
  Blocks b(3);
  auto r = rig.client->Store(b.keys, b.in(), {})->Wait();
  REQUIRE(r.ok());
  CHECK(r->stored == 0);
  CHECK(r->failed == 3);
  for (const absl::Status& e : r->errors) {
    CHECK(e.code() == absl::StatusCode::kUnavailable);
  }
}

TEST_CASE("Store: beyond max_pending_stores a store is skipped at once") {
  ClientOptions o = TestOptions();
  o.store_threads = 1;
  o.max_pending_stores = 2;
  Rig rig(o);
  rig.master->BlockPutStart();
  Blocks b1(2), b2(2, 2), b3(2, 4);
  auto h1 = rig.client->Store(b1.keys, b1.in(), {});
  auto h2 = rig.client->Store(b2.keys, b2.in(), {});
  auto h3 = rig.client->Store(b3.keys, b3.in(), {});
  REQUIRE(h3->Done());
  CHECK(h3->Wait().status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(h3->Wait().status()) == StatusReason::kStoreQueueFull);
  CHECK_FALSE(h2->Done());
  rig.master->UnblockPutStart();
  auto r1 = h1->Wait();
  auto r2 = h2->Wait();
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(r1->stored == 2);
  CHECK(r2->stored == 2);
  CHECK(rig.master->put_starts().size() == 2);
  CHECK_FALSE(rig.master->Find("k4").has_value());
}

TEST_CASE(
    "An ended conversation goes to the master tail first, in runs that overlap "
    "by a key") {
  ClientOptions o = TestOptions();
  o.max_keys_per_rpc = 4;
  Rig rig(o);
  Blocks b(10);
  StoreAll(rig, b);
  REQUIRE(rig.client->HintConversationEnded(b.keys).ok());
  // Each run ends with the head of the run sent before it: the master
  // (MetadataIndex::DemoteChain) walks up from there.
  using Run = std::vector<std::string>;
  REQUIRE(testing::Eventually(
      [&] { return rig.master->ended_chains().size() == 4; }));
  CHECK(rig.master->ended_chains() ==
        std::vector<Run>{{"k9"},
                         {"k6", "k7", "k8", "k9"},
                         {"k3", "k4", "k5", "k6"},
                         {"k0", "k1", "k2", "k3"}});
  // A next-turn hint ends nothing.
  REQUIRE(rig.client->HintNextTurn(b.keys).ok());
  REQUIRE(rig.client->HintConversationEnded({"k0"}).ok());
  REQUIRE(testing::Eventually(
      [&] { return rig.master->ended_chains().size() == 5; }));
  CHECK(rig.master->ended_chains().back() == Run{"k0"});
}

ClientOptions CachingOptions() {
  ClientOptions o = TestOptions();
  o.location_cache_entries = 64;
  o.location_cache_ttl = absl::Seconds(1);
  return o;
}

TEST_CASE(
    "Options: the location cache's ttl is 1 ms to 60 s; 0 entries turns it "
    "off") {
  ClientOptions o = TestOptions();
  CHECK(ClientOptions().location_cache_entries > 0);
  for (absl::Duration ttl : {absl::Milliseconds(1), absl::Seconds(60)}) {
    o.location_cache_ttl = ttl;
    CHECK(o.Validate().ok());
  }
  for (absl::Duration ttl :
       {absl::ZeroDuration(), absl::Microseconds(999), absl::Seconds(61)}) {
    o.location_cache_ttl = ttl;
    CHECK(absl::IsInvalidArgument(o.Validate()));
  }
}

TEST_CASE("A Load of keys found within the ttl reads them without a lookup") {
  Rig rig(CachingOptions());
  Blocks b(3);
  StoreAll(rig, b);
  for (bool prefetch : {false, true, false}) {
    Out out(3);
    LoadOptions lo;
    lo.prefetch = prefetch;
    auto r = rig.client->Load(b.keys, out.bufs, lo);
    REQUIRE(r.ok());
    CHECK(r->loaded == 3);
    CHECK(r->hit_prefix == 3);
    CHECK(r->bytes == 3 * kLen);
    CHECK(r->lengths == std::vector<uint64_t>(3, kLen));
    CHECK(r->stop_reason.ok());
    CheckLoaded(b, out, 3);
  }
  // One lookup (the first Load); one read each.
  CHECK(rig.master->stream_chunk_keys().size() == 1);
  CHECK(rig.transport->reads() == std::vector<size_t>{3, 3, 3});
  // A prefix of the keys, or one key more, is not all cached: looked up.
  Blocks more(4);
  StoreAll(rig, Blocks(1, 3));
  Out out(4);
  REQUIRE(rig.client->Load(more.keys, out.bufs).ok());
  CHECK(rig.master->stream_chunk_keys().size() == 2);
  // Past the ttl the keys are looked up again (and the master renews their
  // read lease).
  rig.clock.Advance(absl::Seconds(1));
  REQUIRE(rig.client->Load(b.keys, Out(3).bufs).ok());
  CHECK(rig.master->stream_chunk_keys().size() == 3);
}

TEST_CASE("A cached location its node no longer holds is looked up again") {
  Rig rig(CachingOptions());
  Blocks b(4);
  StoreAll(rig, b);
  REQUIRE(rig.client->Load(b.keys, Out(4).bufs).ok());
  REQUIRE(rig.master->stream_chunk_keys().size() == 1);
  const ObjectLocation lost = *rig.master->Find("k2");
  rig.transport->Forget(lost.node_id, lost.addr);
  Out out(4);
  auto r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  // The cached read was refused; the lookup path read again and reported
  // the block the node lost.
  CHECK(rig.master->stream_chunk_keys().size() == 2);
  CHECK(r->loaded == 2);
  CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
  CheckLoaded(b, out, 2, /*untouched=*/4);  // one read of all 4, twice
  rig.client.reset();                       // runs the background report
  auto reported = rig.master->reported_missing();
  REQUIRE(reported.size() == 1);
  CHECK(reported[0].first == "k2");
}

TEST_CASE("A cached location on a node that died falls back to a lookup") {
  Rig rig(CachingOptions());
  Blocks b(2);
  StoreAll(rig, b);
  REQUIRE(rig.client->Load(b.keys, Out(2).bufs).ok());
  rig.transport->KillNode(1);
  auto r = rig.client->Load(b.keys, Out(2).bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 0);
  CHECK(r->stop_reason.code() == absl::StatusCode::kUnavailable);
  CHECK(rig.master->stream_chunk_keys().size() == 2);
  // The entries went with the failure: the next Load looks up too.
  rig.transport->ReviveNode(1);
  Out out(2);
  r = rig.client->Load(b.keys, out.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 2);
  CheckLoaded(b, out, 2);
  CHECK(rig.master->stream_chunk_keys().size() == 3);
}

TEST_CASE("A Remove drops the client's cached locations of its keys") {
  Rig rig(CachingOptions());
  Blocks b(2);
  StoreAll(rig, b);
  REQUIRE(rig.client->Load(b.keys, Out(2).bufs).ok());
  REQUIRE(rig.client->Remove({b.keys[1]}, {}).ok());
  auto r = rig.client->Load(b.keys, Out(2).bufs);
  REQUIRE(r.ok());
  CHECK(rig.master->stream_chunk_keys().size() == 2);
  CHECK(r->loaded == 1);
  CHECK(r->stop_reason.code() == absl::StatusCode::kNotFound);
}

TEST_CASE(
    "A cached Load into a buffer too small reports it as the lookup path "
    "does") {
  Rig rig(CachingOptions());
  Blocks b(2);
  StoreAll(rig, b);
  REQUIRE(rig.client->Load(b.keys, Out(2).bufs).ok());
  Out small(2, kLen - 1);
  auto r = rig.client->Load(b.keys, small.bufs);
  REQUIRE(r.ok());
  CHECK(r->loaded == 0);
  CHECK(r->stop_reason.code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE(
    "A cached Load of a node that does not answer returns the blocks before "
    "it at the deadline") {
  ClientOptions o = CachingOptions();
  o.read_batch_bytes = 8 * kLen;
  Rig rig(o);
  Blocks b(8);
  StoreSplit(rig);
  REQUIRE(rig.client->Get(b.keys, Out(8).bufs).ok());
  REQUIRE(rig.master->stream_chunk_keys().size() == 1);
  rig.transport->SilenceNode(2);
  Out out(8);
  LoadOptions lo;
  lo.prefetch = false;  // two nodes: a hinted Load looks up
  lo.deadline = rig.clock.Now() + absl::Seconds(5);
  auto r = rig.client->Load(b.keys, out.bufs, lo);
  REQUIRE(r.ok());
  CHECK(r->loaded == 4);
  CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
  CheckLoaded(b, out, 4);
  // No lookup after the deadline; the silent node's entries are gone.
  CHECK(rig.master->stream_chunk_keys().size() == 1);
  rig.transport->ReviveNode(2);
  REQUIRE(rig.client->Get(b.keys, Out(8).bufs).ok());
  CHECK(rig.master->stream_chunk_keys().size() == 2);
}

}  // namespace
}  // namespace hymcache
