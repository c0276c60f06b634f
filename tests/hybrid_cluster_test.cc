// The storage node with the software CXL hybrid device (staging window +
// write buffer over a capacity file) behind the real master and client:
// bytes verified with a footprint several times the window, refused writes,
// and restarts on the same capacity file (graceful and kill -9).
#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/eventually.h"
#include "grpcpp/grpcpp.h"
#include "proto/storage.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/daemon.h"
#include "tools/hymctl/fsck.h"

namespace hymcache {
namespace {

using testing::MasterProcess;
using testing::StorageProcess;
using testing::TempDir;

constexpr size_t kBlock = 1 << 20;

std::vector<uint8_t> BlockBytes(size_t i) {
  std::vector<uint8_t> b(kBlock);
  std::mt19937_64 rng(i * 7919 + 1);
  for (size_t k = 0; k < b.size(); k += 8) {
    uint64_t v = rng();
    std::memcpy(&b[k], &v, 8);
  }
  return b;
}

struct HybridCluster {
  std::string dir = TempDir("hybrid");
  MasterProcess master;
  StorageProcess node;
  std::unique_ptr<Client> client;

  explicit HybridCluster(std::vector<std::string> node_flags = {}) {
    auto m = MasterProcess::Start(dir + "/master", "127.0.0.1:0");
    REQUIRE(m.ok());
    master = std::move(*m);
    StartNode(std::move(node_flags));
    ClientOptions o;
    o.master_address = master.address;
    client = std::move(*Client::Create(o));
    WaitAlive();
  }
  void StartNode(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {
        "--device=hybrid", "--capacity_path=" + dir + "/capacity.dat",
        "--capacity_bytes=256M", "--staging_bytes=8M",
        "--write_buffer_bytes=4M", "--io_queue_depth=16"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto s = StorageProcess::Start(master.address, "hybrid-node", flags);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    node = std::move(*s);
  }
  void WaitAlive() {
    // Alive as the current process (a killed one stays "alive" on the
    // master until its heartbeats time out).
    absl::Status s = testing::WaitForLiveNodes(*client, 1, {node.data_address});
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  // Stores blocks [0, n) one request of 2 at a time, retrying refused writes
  // (the write buffer is small) until everything is stored.
  void StoreAll(const std::vector<std::string>& keys) {
    for (size_t i = 0; i < keys.size(); i += 2) {
      std::vector<std::string> k(keys.begin() + i,
                                 keys.begin() + std::min(keys.size(), i + 2));
      std::vector<std::vector<uint8_t>> data;
      std::vector<ConstBuffer> in;
      for (size_t j = 0; j < k.size(); ++j) data.push_back(BlockBytes(i + j));
      for (auto& d : data) in.push_back({d.data(), d.size()});
      absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (true) {
        auto r = client->Put(k, in);
        REQUIRE(r.ok());
        if (r->failed == 0) break;
        for (const auto& e : r->errors) {
          if (!e.ok()) {
            INFO(e.ToString());
            REQUIRE(e.code() == absl::StatusCode::kResourceExhausted);
          }
        }
        REQUIRE(absl::Now() < deadline);
        absl::SleepFor(absl::Milliseconds(20));  // let the flusher drain
      }
    }
  }
  // Loads all keys and checks every loaded block; returns how many loaded.
  size_t LoadAndVerify(const std::vector<std::string>& keys) {
    std::vector<std::vector<uint8_t>> out(keys.size(), std::vector<uint8_t>(kBlock));
    std::vector<MutableBuffer> bufs;
    for (auto& o : out) bufs.push_back({o.data(), o.size()});
    auto r = client->Get(keys, bufs);
    REQUIRE(r.ok());
    for (size_t i = 0; i < r->loaded; ++i) {
      INFO("block " << i);
      REQUIRE(out[i] == BlockBytes(i));
    }
    return r->loaded;
  }
};

std::vector<std::string> Keys(size_t n) {
  std::vector<std::string> k;
  for (size_t i = 0; i < n; ++i) k.push_back(absl::StrCat("hyb-", i));
  return k;
}

TEST_CASE("hybrid node serves a footprint 6x its staging window byte for byte") {
  HybridCluster c;
  auto keys = Keys(48);  // 48 MiB through an 8 MiB window, 4 MiB write buffer
  c.StoreAll(keys);
  CHECK(c.LoadAndVerify(keys) == keys.size());
  auto st = c.client->GetClusterStatus();
  REQUIRE(st.ok());
  CHECK(st->nodes[0].device_kind == "hybrid");
  CHECK(st->object_count == keys.size());
}

TEST_CASE("hybrid node restarted on the same capacity file serves its objects again") {
  HybridCluster c;
  auto keys = Keys(20);
  c.StoreAll(keys);
  // Graceful stop flushes the write buffer.
  auto stopped = c.node.daemon.Stop(SIGTERM);
  REQUIRE(stopped.ok());
  CHECK(WIFEXITED(*stopped));
  // The master crashes and restarts meanwhile: it must remember that the
  // node left (no placements on it) and keep its persistent objects.
  REQUIRE(c.master.daemon.Stop(SIGKILL).ok());
  auto m = MasterProcess::Start(c.dir + "/master", c.master.address);
  REQUIRE(m.ok());
  c.master = std::move(*m);
  auto st = c.client->GetClusterStatus();
  for (int i = 0; i < 100 && !st.ok(); ++i) {  // the client reconnects
    absl::SleepFor(absl::Milliseconds(50));
    st = c.client->GetClusterStatus();
  }
  REQUIRE(st.ok());
  REQUIRE(st->nodes.size() == 1);
  CHECK_FALSE(st->nodes[0].alive);
  c.StartNode();
  c.WaitAlive();
  CHECK(c.client->BatchLookup(keys)->hit_prefix == keys.size());
  CHECK(c.LoadAndVerify(keys) == keys.size());
}

TEST_CASE("hybrid node killed before flushing loses only unflushed objects, never bytes") {
  HybridCluster c;
  auto keys = Keys(12);
  c.StoreAll(keys);
  REQUIRE(c.node.daemon.Stop(SIGKILL).ok());
  c.StartNode();
  c.WaitAlive();
  // Whatever was flushed loads and is right; the rest are misses.
  size_t loaded = c.LoadAndVerify(keys);
  INFO("loaded " << loaded << " of " << keys.size());
  CHECK(loaded <= keys.size());
  // New writes work on the same space.
  auto more = Keys(16);
  std::vector<std::string> fresh(more.begin() + 12, more.end());
  std::vector<std::vector<uint8_t>> data;
  std::vector<ConstBuffer> in;
  for (size_t j = 0; j < fresh.size(); ++j) data.push_back(BlockBytes(100 + j));
  for (auto& d : data) in.push_back({d.data(), d.size()});
  auto r = c.client->Put(fresh, in);
  REQUIRE(r.ok());
  CHECK(r->stored + r->failed == fresh.size());
}

TEST_CASE("hybrid node killed with unflushed blocks: the master stops listing them and they can be stored again") {
  // Writes to the capacity file crawl (256 KiB/s), so the blocks stored
  // just before the kill are acknowledged from the write buffer only.
  HybridCluster c({"--io_max_write_bytes_per_s=256K"});
  auto keys = Keys(3);
  c.StoreAll(keys);
  REQUIRE(c.client->BatchLookup(keys)->hit_prefix == keys.size());
  REQUIRE(c.node.daemon.Stop(SIGKILL).ok());
  c.StartNode();
  c.WaitAlive();  // alive only once it has reconciled with the master

  // Every key the master lists is readable, byte for byte; the rest miss.
  size_t listed = 0;
  std::vector<std::string> lost;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto look = c.client->BatchLookup({keys[i]});
    REQUIRE(look.ok());
    if (look->hit_prefix == 0) {
      lost.push_back(keys[i]);
      continue;
    }
    ++listed;
    std::vector<uint8_t> out(kBlock);
    std::vector<MutableBuffer> buf = {{out.data(), out.size()}};
    auto r = c.client->Get({keys[i]}, buf);
    REQUIRE(r.ok());
    INFO("key " << keys[i] << ": " << r->stop_reason.ToString());
    CHECK(r->loaded == 1);
    const bool same = out == BlockBytes(i);
    CHECK(same);
  }
  INFO("listed " << listed << ", lost " << lost.size());
  CHECK(!lost.empty());  // the slow writer flushed at most part of them
  // The lost keys can be stored again (not "already stored" forever).
  std::vector<std::vector<uint8_t>> data;
  std::vector<ConstBuffer> in;
  for (size_t j = 0; j < lost.size(); ++j) data.push_back(BlockBytes(500 + j));
  for (auto& d : data) in.push_back({d.data(), d.size()});
  auto put = c.client->Put(lost, in);
  REQUIRE(put.ok());
  CHECK(put->stored == lost.size());
  CHECK(c.client->BatchLookup(lost)->hit_prefix == lost.size());
}

TEST_CASE("a SIGTERM'd hybrid node abandons a slow flush within its shutdown bound") {
  // The capacity file takes 512 KiB/s: 3 MiB of buffered blocks take 6 s
  // to flush. The node may flush for 500 ms, then abandons what it has not
  // issued (a device write in flight is waited for: 2 s each here, a few
  // milliseconds on a real device).
  HybridCluster c({"--io_max_write_bytes_per_s=512K",
                   "--shutdown_flush_timeout_ms=500", "--drain_timeout_ms=500"});
  auto keys = Keys(3);
  c.StoreAll(keys);
  const absl::Time start = absl::Now();
  auto status = c.node.daemon.Stop(SIGTERM, absl::Seconds(60));
  REQUIRE(status.ok());
  const absl::Duration took = absl::Now() - start;
  INFO("shutdown took " << absl::FormatDuration(took));
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  // rpc_timeout (2 s) + drain (0.5 s) + control (1 s) + flush (0.5 s),
  // with slack for a loaded machine.
  CHECK(took < absl::Seconds(15));
  // After the restart, whatever is listed is served; the rest can be
  // stored again.
  c.StartNode();
  c.WaitAlive();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (c.client->BatchLookup({keys[i]})->hit_prefix == 0) continue;
    std::vector<uint8_t> out(kBlock);
    std::vector<MutableBuffer> buf = {{out.data(), out.size()}};
    auto r = c.client->Get({keys[i]}, buf);
    REQUIRE(r.ok());
    CHECK(r->loaded == 1);
    const bool same = out == BlockBytes(i);
    CHECK(same);
  }
}

TEST_CASE("a byte flipped in the capacity file: the object is dropped at restart, never served, and fsck agrees") {
  HybridCluster c;
  auto keys = Keys(4);
  c.StoreAll(keys);
  auto look = c.client->BatchLookup(keys);
  REQUIRE(look.ok());
  REQUIRE(look->hit_prefix == keys.size());
  // A graceful stop flushes and records everything.
  REQUIRE(c.node.daemon.Stop(SIGTERM).ok());
  // Corrupt block 2 behind the node's back: data area starts after the
  // 1 MiB header.
  const uint64_t offset = (1 << 20) + look->locations[2].addr + 12345;
  const int fd = ::open((c.dir + "/capacity.dat").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b ^= 0x40;
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::close(fd);

  c.StartNode();
  c.WaitAlive();
  // The corrupt block is a miss (its listing was reconciled away), and so
  // is block 3 after it in the chain (unreachable, removed with it); the
  // others load byte for byte.
  for (size_t i = 0; i < keys.size(); ++i) {
    auto l = c.client->BatchLookup({keys[i]});
    REQUIRE(l.ok());
    CHECK(l->hit_prefix == (i >= 2 ? 0u : 1u));
    if (l->hit_prefix == 0) continue;
    std::vector<uint8_t> out(kBlock);
    std::vector<MutableBuffer> buf = {{out.data(), out.size()}};
    auto r = c.client->Get({keys[i]}, buf);
    REQUIRE(r.ok());
    CHECK(r->loaded == 1);
    const bool same = out == BlockBytes(i);
    CHECK(same);
  }
  hymctl::FsckOptions fo;
  fo.master_address = c.master.address;
  fo.settle = absl::Milliseconds(200);
  auto report = hymctl::RunFsck(fo);
  REQUIRE(report.ok());
  CHECK(report->clean());
  CHECK(report->checksum_failures == 1);
  CHECK(report->matched == keys.size() - 2);
}

TEST_CASE("an extent the master stopped listing is freed on the hybrid node for good, not adopted again at restart") {
  HybridCluster c;
  auto keys = Keys(4);
  c.StoreAll(keys);
  // Flushed and recorded; the master forgets block 3 (a chain leaf) while
  // the node keeps it.
  REQUIRE(c.node.daemon.Stop(SIGTERM).ok());
  c.StartNode();
  c.WaitAlive();
  auto removed = c.client->Remove({keys[3]});
  REQUIRE(removed.ok());
  REQUIRE((*removed)[0]);
  hymctl::FsckOptions fo;
  fo.master_address = c.master.address;
  fo.settle = absl::Milliseconds(200);
  fo.repair = true;
  auto report = hymctl::RunFsck(fo);
  REQUIRE(report.ok());
  CHECK(report->findings.size() == 1);  // the unlisted extent
  CHECK(report->remaining == 0);

  // Its record is gone too: the restarted node adopts three objects, and
  // its first reconciliation has nothing to free.
  REQUIRE(c.node.daemon.Stop(SIGTERM).ok());
  c.StartNode();
  c.WaitAlive();
  auto stub = v1::StorageControl::NewStub(grpc::CreateChannel(
      c.node.control_address, grpc::InsecureChannelCredentials()));
  v1::StorageStatsResponse stats;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    REQUIRE(stub->GetStats(&ctx, v1::StorageStatsRequest(), &stats).ok());
    if (stats.reconciliations() > 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(stats.reconciliations() > 0);
  CHECK(stats.reconcile_freed_extents() == 0);
  CHECK(stats.extents() == 3);
  fo.repair = false;
  report = hymctl::RunFsck(fo);
  REQUIRE(report.ok());
  CHECK(report->clean());
  CHECK(report->matched == 3);
  CHECK(c.LoadAndVerify({keys[0], keys[1], keys[2]}) == 3);
}

// One of the node's stats by name (StorageStatsResponse.device_stats; 0
// when absent).
double NodeStat(const std::string& control_address, const std::string& name) {
  auto stub = v1::StorageControl::NewStub(
      grpc::CreateChannel(control_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::StorageStatsResponse stats;
  REQUIRE(stub->GetStats(&ctx, v1::StorageStatsRequest(), &stats).ok());
  auto it = stats.device_stats().find(name);
  return it == stats.device_stats().end() ? 0 : it->second;
}

// Whether the node's stat `name` reaches `want` within 10 s (hints are
// sent in the client's background).
bool AwaitNodeStat(const std::string& control_address, const std::string& name,
                   double want) {
  return testing::Eventually(
      [&] { return NodeStat(control_address, name) == want; },
      absl::Seconds(10));
}

TEST_CASE(
    "a next-turn hint stages the conversation before its turn, which reads the "
    "staged copies") {
  HybridCluster c;  // 8 MiB window: hints may hold 4 MiB
  auto keys = Keys(24);
  c.StoreAll(keys);  // the first blocks are long out of the 4 MiB write buffer
  const std::string& ctl = c.node.control_address;
  const double refills = NodeStat(ctl, "refill_bytes");

  // A conversation of 3 blocks answered: the node stages it while idle, and
  // the next turn's read (one read: no prefetch list) takes the staged
  // copies, without reading the capacity tier again.
  std::vector<std::string> conv(keys.begin(), keys.begin() + 3);
  REQUIRE(c.client->HintNextTurn(conv).ok());
  REQUIRE(AwaitNodeStat(ctl, "prefetch_turn_hints_staged", 3));
  CHECK(NodeStat(ctl, "prefetch_turn_hint_bytes") == 3 * kBlock);
  // Staged counts at issue; the refills complete a moment later.
  REQUIRE(AwaitNodeStat(ctl, "refill_bytes", refills + 3 * kBlock));
  CHECK(c.LoadAndVerify(conv) == 3);
  CHECK(NodeStat(ctl, "prefetch_turn_hint_hits") == 3);
  CHECK(NodeStat(ctl, "prefetch_turn_hints_held") == 0);
  CHECK(NodeStat(ctl, "refill_bytes") == refills + 3 * kBlock);

  // A longer conversation: its turn's Load sends a prefetch list, whose
  // session joins the 4 hinted blocks staged; the other 2 are refilled.
  std::vector<std::string> longer(keys.begin() + 10, keys.begin() + 16);
  REQUIRE(c.client->HintNextTurn(longer).ok());
  REQUIRE(AwaitNodeStat(ctl, "prefetch_turn_hints_staged", 3 + 4));
  CHECK(NodeStat(ctl, "prefetch_turn_hints_held") == 6);  // 2 wait for room
  std::vector<std::vector<uint8_t>> out(longer.size(),
                                        std::vector<uint8_t>(kBlock));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto r = c.client->Load(longer, bufs);
  REQUIRE(r.ok());
  REQUIRE(r->loaded == longer.size());
  for (size_t i = 0; i < longer.size(); ++i)
    CHECK(out[i] == BlockBytes(10 + i));
  CHECK(NodeStat(ctl, "prefetch_turn_hint_hits") == 3 + 4);
  CHECK(NodeStat(ctl, "prefetch_turn_hint_late") == 2);
  CHECK(NodeStat(ctl, "prefetch_turn_hints_held") == 0);

  // A conversation that ended: its hints are dropped at once.
  std::vector<std::string> ended(keys.begin() + 20, keys.begin() + 22);
  REQUIRE(c.client->HintNextTurn(ended).ok());
  REQUIRE(AwaitNodeStat(ctl, "prefetch_turn_hints_held", 2));
  REQUIRE(c.client->HintConversationEnded(ended).ok());
  REQUIRE(AwaitNodeStat(ctl, "prefetch_turn_hints_cancelled", 2));
  CHECK(NodeStat(ctl, "prefetch_turn_hints_held") == 0);
  CHECK(NodeStat(ctl, "prefetch_turn_hint_bytes") == 0);
  CHECK(NodeStat(ctl, "prefetch_turn_hints_wasted") == 0);

  // Bad hints are refused by the client, never sent.
  CHECK(c.client->HintNextTurn({}).code() ==
        absl::StatusCode::kInvalidArgument);
  TurnHintOptions no_hold;
  no_hold.hold = absl::ZeroDuration();
  CHECK(c.client->HintNextTurn(conv, no_hold).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hymcache
