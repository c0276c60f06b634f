// The request-level read path end to end: Client::Load with prefetch hints
// and Client::Store against the real master and hybrid storage nodes
// (staging window + write buffer over capacity files): loads across two
// nodes, chain placement, deadline expiry mid-load, concurrent requests
// sharing one window, refused writes and mixed object sizes.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/thread.h"
#include "proto/storage.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;

constexpr size_t kMiB = 1 << 20;

// Deterministic contents of block `i` of namespace `ns`, `len` bytes.
std::vector<uint8_t> Bytes(const std::string& ns, size_t i, size_t len) {
  std::vector<uint8_t> b(len);
  std::mt19937_64 rng(std::hash<std::string>()(ns) ^ (i * 0x9E3779B97F4A7C15ull));
  for (size_t k = 0; k < len; k += 8) {
    uint64_t v = rng();
    std::memcpy(&b[k], &v, std::min<size_t>(8, len - k));
  }
  return b;
}

std::vector<std::string> Keys(const std::string& ns, size_t from, size_t to) {
  std::vector<std::string> k;
  for (size_t i = from; i < to; ++i) k.push_back(absl::StrCat(ns, "/", i));
  return k;
}

struct Cluster : testing::TestCluster {
  explicit Cluster(int n, std::vector<std::string> node_flags = {},
                   ClientOptions co = {})
      : TestCluster("load") {
    REQUIRE(StartMaster().ok());
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> flags = {
          "--device=hybrid",
          absl::StrCat("--capacity_path=", dir, "/cap", i, ".dat"),
          "--capacity_bytes=512M", "--staging_bytes=8M",
          "--write_buffer_bytes=32M", "--io_queue_depth=16",
          "--prefetch_window_bytes=4M"};
      flags.insert(flags.end(), node_flags.begin(), node_flags.end());
      absl::Status s = AddNode(absl::StrCat("node", i), flags);
      INFO(s.ToString());
      REQUIRE(s.ok());
    }
    REQUIRE(Connect(co).ok());
    absl::Status alive = WaitAlive();
    INFO(alive.ToString());
    REQUIRE(alive.ok());
  }

  std::map<std::string, double> NodeStats(int i) {
    auto channel = grpc::CreateChannel(nodes[i].control_address,
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::StorageControl::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::StorageStatsRequest req;
    v1::StorageStatsResponse resp;
    grpc::Status s = stub->GetStats(&ctx, req, &resp);
    REQUIRE(s.ok());
    return std::map<std::string, double>(resp.device_stats().begin(),
                                         resp.device_stats().end());
  }

  // Waits until node i has no prefetch session and nothing staged.
  void WaitStagingFree(int i) {
    for (int k = 0; k < 200; ++k) {
      auto st = NodeStats(i);
      if (st["prefetch_sessions"] == 0 && st["staged_bytes"] == 0) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    auto st = NodeStats(i);
    FAIL("node " << i << " still holds staging: sessions "
                 << st["prefetch_sessions"] << ", staged bytes "
                 << st["staged_bytes"]);
  }

  // Stores blocks of `ns` [from, to) as one request with Store, waits for
  // it and retries refused keys (the write buffer is bounded) so that the
  // test's data is complete. Returns the node the first try used.
  uint32_t StoreAll(const std::string& ns, size_t from, size_t to,
                    size_t len, const std::string& parent = "") {
    std::vector<std::string> keys = Keys(ns, from, to);
    std::vector<std::vector<uint8_t>> data;
    for (size_t i = from; i < to; ++i) data.push_back(Bytes(ns, i, len));
    std::vector<ConstBuffer> in;
    for (auto& d : data) in.push_back({d.data(), d.size()});
    uint32_t node = 0;
    absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (true) {
      StoreOptions so;
      so.parent_key = parent;
      so.deadline = absl::Now() + absl::Seconds(10);
      auto h = client->Store(keys, in, so);
      auto r = h->Wait();
      REQUIRE(h->Done());
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      if (node == 0) node = r->node_id;
      if (r->failed == 0) return node;
      for (const auto& e : r->errors) {
        if (!e.ok()) {
          INFO(e.ToString());
          REQUIRE(e.code() == absl::StatusCode::kResourceExhausted);
        }
      }
      REQUIRE(r->refused == r->failed);
      REQUIRE(absl::Now() < give_up);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  struct Loaded {
    LoadResult result;
    std::vector<std::vector<uint8_t>> out;
  };
  Loaded Load(const std::vector<std::string>& keys, size_t buf_len,
              LoadOptions lo = {}) {
    Loaded l;
    l.out.assign(keys.size(), std::vector<uint8_t>(buf_len, 0xEE));
    std::vector<MutableBuffer> bufs;
    for (auto& o : l.out) bufs.push_back({o.data(), o.size()});
    auto r = client->Load(keys, bufs, lo);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    l.result = *r;
    return l;
  }
};

TEST_CASE("Load prefetches a request's blocks across two hybrid nodes") {
  ClientOptions co;
  co.lookup_batch_keys = 4;  // 24 keys: six pipelined lookup round trips
  Cluster c(2, {}, co);
  // Two requests' blocks: round-robin placement puts them on both nodes.
  uint32_t a = c.StoreAll("two", 0, 12, kMiB);
  uint32_t b = c.StoreAll("two", 12, 24, kMiB);
  REQUIRE(a != b);

  auto l = c.Load(Keys("two", 0, 24), kMiB);
  CHECK(l.result.loaded == 24);
  CHECK(l.result.hit_prefix == 24);
  CHECK(l.result.bytes == 24 * kMiB);
  CHECK(l.result.stop_reason.ok());
  for (size_t i = 0; i < 24; ++i) {
    INFO("block " << i);
    REQUIRE(l.out[i] == Bytes("two", i, kMiB));
  }
  // Every block went through a prefetch session on its node, and nothing
  // stays staged afterwards.
  double staged_reads = 0;
  for (int i = 0; i < 2; ++i) {
    auto st = c.NodeStats(i);
    CHECK(st["prefetch_staged_reads"] == 12);
    staged_reads += st["prefetch_staged_reads"];
    c.WaitStagingFree(i);
  }
  CHECK(staged_reads == 24);

  // A miss ends the prefix: the blocks after it are not loaded.
  std::vector<std::string> keys = Keys("two", 0, 6);
  keys.push_back("two/absent");
  keys.push_back("two/7");
  auto m = c.Load(keys, kMiB);
  CHECK(m.result.loaded == 6);
  CHECK(m.result.hit_prefix == 6);
  CHECK(m.result.stop_reason.code() == absl::StatusCode::kNotFound);
  CHECK(m.out[7] == std::vector<uint8_t>(kMiB, 0xEE));

  // (Its last run of blocks, when the lookups end after the first ones are
  // read, may be read plainly: one read with nothing after it to stage.)
  const double staged_before = c.NodeStats(0)["prefetch_staged_reads"] +
                               c.NodeStats(1)["prefetch_staged_reads"];
  CHECK(staged_before >= 24 + 4);
  CHECK(staged_before <= 24 + 6);

  // Without prefetch the same bytes come back through plain reads.
  LoadOptions off;
  off.prefetch = false;
  auto p = c.Load(Keys("two", 0, 24), kMiB, off);
  CHECK(p.result.loaded == 24);
  for (size_t i = 0; i < 24; ++i) REQUIRE(p.out[i] == Bytes("two", i, kMiB));
  CHECK(c.NodeStats(0)["prefetch_staged_reads"] +
            c.NodeStats(1)["prefetch_staged_reads"] ==
        staged_before);
}

TEST_CASE(
    "a Load that one read takes reads its blocks plainly, without a session") {
  Cluster c(1);
  c.StoreAll("one", 0, 3, kMiB);
  auto l = c.Load(Keys("one", 0, 3), kMiB);  // 3 MiB: one 4 MiB read
  CHECK(l.result.loaded == 3);
  CHECK(l.result.stop_reason.ok());
  for (size_t i = 0; i < 3; ++i) REQUIRE(l.out[i] == Bytes("one", i, kMiB));
  auto st = c.NodeStats(0);
  CHECK(st["prefetch_staged_reads"] == 0);
  CHECK(st["prefetch_sessions"] == 0);
}

TEST_CASE("Store places a chain's new blocks on its prefix's node") {
  Cluster c(2);
  uint32_t head = c.StoreAll("chain", 0, 4, kMiB);
  // Without a parent the next request would go to the other node (the
  // emptier one); with the prefix's last key as parent it joins the chain
  // (16 MiB on a 512 MiB node stays within placement's spill margin).
  for (int turn = 1; turn <= 3; ++turn) {
    uint32_t n = c.StoreAll("chain", turn * 4, turn * 4 + 4, kMiB,
                            absl::StrCat("chain/", turn * 4 - 1));
    CHECK(n == head);
  }
  auto found = c.client->BatchLookup(Keys("chain", 0, 16));
  REQUIRE(found.ok());
  CHECK(found->hit_prefix == 16);
  for (const auto& loc : found->locations) CHECK(loc.node_id == head);
  auto other = c.StoreAll("other", 0, 2, kMiB);
  CHECK(other != head);
}

TEST_CASE("a Load past its deadline returns what it has and frees staging") {
  Cluster c(1, {"--staging_bytes=4M", "--prefetch_window_bytes=2M"});
  const size_t n = 96;
  c.StoreAll("slow", 0, n, kMiB);
  LoadOptions lo;
  lo.deadline = absl::Now() + absl::Milliseconds(15);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(kMiB, 0xEE));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto r = c.client->Load(Keys("slow", 0, n), bufs, lo);
  // 96 MiB cannot move in 15 ms: the load is cut short (or, on a very slow
  // machine, even its first lookup is late).
  if (!r.ok()) {
    CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  } else {
    CHECK(r->loaded < n);
    CHECK(r->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
    for (size_t i = 0; i < r->loaded; ++i) {
      REQUIRE(out[i] == Bytes("slow", i, kMiB));
    }
  }
  // Nothing writes into the caller's buffers after Load returned.
  std::vector<std::vector<uint8_t>> snapshot = out;
  absl::SleepFor(absl::Milliseconds(300));
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == snapshot[i]);
  // The cancelled session's staging is released on the node.
  c.WaitStagingFree(0);
  // And the node serves a complete load afterwards.
  auto full = c.Load(Keys("slow", 0, n), kMiB);
  CHECK(full.result.loaded == n);
  for (size_t i = 0; i < n; i += 7) REQUIRE(full.out[i] == Bytes("slow", i, kMiB));
}

TEST_CASE("concurrent requests share one node's staging window") {
  Cluster c(1, {"--staging_bytes=8M", "--prefetch_window_bytes=4M"});
  const int kRequests = 4;
  const size_t kBlocks = 16;
  for (int r = 0; r < kRequests; ++r) {
    c.StoreAll(absl::StrCat("conc", r), 0, kBlocks, kMiB);
  }
  std::vector<LoadResult> results(kRequests);
  std::vector<char> intact(kRequests, 0);  // not vector<bool>: one byte each
  std::vector<Thread> threads;
  for (int r = 0; r < kRequests; ++r) {
    threads.emplace_back("load", [&, r] {
      const std::string ns = absl::StrCat("conc", r);
      std::vector<std::vector<uint8_t>> out(kBlocks, std::vector<uint8_t>(kMiB));
      std::vector<MutableBuffer> bufs;
      for (auto& o : out) bufs.push_back({o.data(), o.size()});
      for (int round = 0; round < 3; ++round) {
        auto res = c.client->Load(Keys(ns, 0, kBlocks), bufs);
        if (!res.ok()) return;
        results[r] = *res;
        bool ok = res->loaded == kBlocks;
        for (size_t i = 0; ok && i < kBlocks; ++i) ok = out[i] == Bytes(ns, i, kMiB);
        intact[r] = ok ? 1 : 0;
        if (!ok) return;
      }
    });
  }
  for (auto& t : threads) t.Join();
  for (int r = 0; r < kRequests; ++r) {
    INFO("request " << r << ": " << results[r].stop_reason.ToString());
    CHECK(intact[r]);
  }
  auto st = c.NodeStats(0);
  CHECK(st["prefetch_staged_reads"] == kRequests * kBlocks * 3);
  CHECK(st["staging_misses"] == 0);
  c.WaitStagingFree(0);
}

TEST_CASE("Store is opportunistic: refused writes are skipped, not retried") {
  Cluster c(1, {"--write_buffer_bytes=3M", "--staging_bytes=4M"});
  std::vector<std::string> keys = Keys("refuse", 0, 8);
  // Block 5 (4 MiB) can never fit the 3 MiB write buffer; the others may
  // be refused too when the flusher has not drained the buffer yet.
  auto size = [](size_t i) { return i == 5 ? 4 * kMiB : kMiB; };
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < 8; ++i) data.push_back(Bytes("refuse", i, size(i)));
  std::vector<ConstBuffer> in;
  for (auto& d : data) in.push_back({d.data(), d.size()});
  auto h = c.client->Store(keys, in);
  auto r = h->Wait(absl::Now() + absl::Seconds(30));
  REQUIRE(r.ok());
  CHECK(r->outcomes[5] == PutOutcome::kFailed);
  CHECK(r->errors[5].code() == absl::StatusCode::kResourceExhausted);
  CHECK(r->refused >= 1);
  CHECK(r->stored + r->refused == 8);
  CHECK(r->failed == r->refused);
  size_t stored_prefix = 0;
  while (stored_prefix < 8 && r->outcomes[stored_prefix] == PutOutcome::kStored) {
    ++stored_prefix;
  }
  CHECK(stored_prefix <= 5);
  auto l = c.Load(keys, 4 * kMiB);
  CHECK(l.result.loaded == stored_prefix);
  for (size_t i = 0; i < l.result.loaded; ++i) {
    std::vector<uint8_t> got(l.out[i].begin(), l.out[i].begin() + size(i));
    REQUIRE(got == Bytes("refuse", i, size(i)));
  }

  // A store queue that is full refuses at once instead of blocking.
  ClientOptions co;
  co.master_address = c.master.address;
  co.store_threads = 1;
  co.max_pending_stores = 1;
  auto small = Client::Create(co);
  REQUIRE(small.ok());
  std::vector<std::shared_ptr<StoreHandle>> handles;
  for (int i = 0; i < 8; ++i) {
    handles.push_back((*small)->Store({keys[0]}, {in[0]}));
  }
  int queue_full = 0;
  for (auto& hh : handles) {
    auto res = hh->Wait(absl::Now() + absl::Seconds(30));
    if (!res.ok()) {
      CHECK(res.status().code() == absl::StatusCode::kResourceExhausted);
      ++queue_full;
    }
  }
  CHECK(queue_full > 0);
  // Bad arguments complete the handle with an error at once.
  auto bad = c.client->Store({"x"}, {});
  REQUIRE(bad->Done());
  CHECK(bad->Wait().status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("objects of different sizes share a node") {
  Cluster c(1);
  // Two "models" with different block sizes, including odd lengths.
  const std::vector<size_t> sizes = {4096, 100 * 1024 + 3, kMiB, 3 * kMiB + 1};
  for (size_t s = 0; s < sizes.size(); ++s) {
    c.StoreAll(absl::StrCat("model", s), 0, 5, sizes[s]);
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    const std::string ns = absl::StrCat("model", s);
    // Buffers larger than the objects: lengths report the real sizes.
    auto l = c.Load(Keys(ns, 0, 5), sizes[s] + 100);
    REQUIRE(l.result.loaded == 5);
    for (size_t i = 0; i < 5; ++i) {
      CHECK(l.result.lengths[i] == sizes[s]);
      std::vector<uint8_t> got(l.out[i].begin(), l.out[i].begin() + sizes[s]);
      REQUIRE(got == Bytes(ns, i, sizes[s]));
    }
  }
  // A buffer too small for its object stops the load there.
  auto small = c.Load(Keys("model3", 0, 5), kMiB);
  CHECK(small.result.loaded == 0);
  CHECK(small.result.stop_reason.code() == absl::StatusCode::kOutOfRange);
  c.WaitStagingFree(0);
}

}  // namespace
}  // namespace hymcache
