// Client deadlines against a storage node that stalls mid-transfer: the call
// returns the blocks it finished, reports DeadlineExceeded, and never writes
// into the caller's buffers afterwards. The master is the real one
// (in-process); the storage node is a protocol-level fake that can stall,
// which no real node does on purpose.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/capability.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/thread.h"
#include "common/wire.h"
#include "master/master_server.h"
#include "master/proving_heartbeat.h"
#include "proto/master.grpc.pb.h"
#include "tests/daemon.h"

namespace hymcache {
namespace {

namespace pb = ::hymcache::v1;

// Answers writes with OK (discarding the bytes) and reads by sending the
// first `serve_ops` payloads (bytes = 'A' + op index) and then stalling.
class StallingNode {
 public:
  explicit StallingNode(int serve_ops) : serve_ops_(serve_ops) {
    auto ls = ListenTcp("127.0.0.1", 0);
    REQUIRE(ls.ok());
    listen_ = std::move(*ls);
    port_ = *LocalPort(listen_.fd());
    thread_ = Thread("stall-node", [this] { Serve(); });
  }
  ~StallingNode() {
    stop_ = true;
    shutdown(listen_.fd(), SHUT_RDWR);
    thread_.Join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // The identity the master gave this node: it signs write receipts with
  // its key, as a storage node does.
  void SetIdentity(uint32_t node_id, const std::string& key) {
    MutexLock l(&mu_);
    node_id_ = node_id;
    key_.emplace(key);
  }
  int reads_seen() const { return reads_.load(); }

 private:
  void Serve() {
    while (!stop_) {
      int fd = accept(listen_.fd(), nullptr, nullptr);
      if (fd < 0) return;
      Socket s(fd);
      while (!stop_ && Handle(fd)) {
      }
    }
  }
  bool Handle(int fd) {
    absl::Time dl = absl::Now() + absl::Seconds(10);
    uint8_t hb[wire::kHeaderBytes];
    if (!RecvAll(fd, hb, sizeof(hb), dl).ok()) return false;
    auto h = wire::DecodeHeader(hb);
    if (!h.ok()) return false;
    std::vector<uint8_t> table(h->op_count * wire::kOpBytes);
    if (!RecvAll(fd, table.data(), table.size(), dl).ok()) return false;
    if (h->type == wire::FrameType::kWriteRequest) {
      if (!Discard(fd, h->payload_bytes, dl).ok()) return false;
      h->type = wire::FrameType::kWriteResponse;
      h->payload_bytes = h->op_count * wire::kReceiptBytes;
      wire::EncodeHeader(*h, hb);
      std::string receipts;
      {
        MutexLock l(&mu_);
        for (size_t i = 0; i < h->op_count; ++i) {
          const wire::OpDesc op =
              wire::DecodeOp(table.data() + i * wire::kOpBytes);
          const wire::Receipt r = SignWriteReceipt(
              *key_,
              {node_id_, op.region_id, op.addr, op.length, op.generation});
          receipts.append(reinterpret_cast<const char*>(r.tag),
                          wire::kReceiptBytes);
        }
      }
      return SendAll(fd, hb, sizeof(hb), dl).ok() &&
             SendAll(fd, table.data(), table.size(), dl).ok() &&
             SendAll(fd, receipts.data(), receipts.size(), dl).ok();
    }
    ++reads_;
    uint64_t payload = 0;
    for (size_t i = 0; i < h->op_count; ++i) {
      payload += wire::DecodeOp(table.data() + i * wire::kOpBytes).length;
    }
    h->type = wire::FrameType::kReadResponse;
    h->payload_bytes = payload;
    wire::EncodeHeader(*h, hb);
    if (!SendAll(fd, hb, sizeof(hb), dl).ok() ||
        !SendAll(fd, table.data(), table.size(), dl).ok()) {
      return false;
    }
    for (int i = 0; i < h->op_count && i < serve_ops_; ++i) {
      auto op = wire::DecodeOp(table.data() + i * wire::kOpBytes);
      std::vector<char> bytes(op.length, static_cast<char>('A' + i));
      if (!SendAll(fd, bytes.data(), bytes.size(), dl).ok()) return false;
    }
    // Stall: hold the connection until the client gives up and closes it.
    char c;
    while (!stop_ && recv(fd, &c, 1, 0) > 0) {
    }
    return false;
  }

  const int serve_ops_;
  Mutex mu_;
  uint32_t node_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<HmacSha256> key_ ABSL_GUARDED_BY(mu_);
  Socket listen_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> reads_{0};
  Thread thread_;
};

TEST_CASE("Get past its deadline returns the finished blocks and writes nothing later") {
  MasterOptions mo;
  mo.db_path = testing::TempDir("deadline") + "/master";
  auto master = MasterServer::Create(mo);
  REQUIRE(master.ok());
  StallingNode node(/*serve_ops=*/2);

  // Register the fake node as a storage node.
  auto stub = pb::MasterService::NewStub(grpc::CreateChannel(
      (*master)->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    pb::RegisterNodeRequest req;
    req.set_name("stalling");
    req.set_incarnation(1);
    req.set_data_address(node.address());
    req.set_control_address(node.address());
    auto* r = req.add_regions();
    r->set_region_id(0);
    r->set_capacity_bytes(64 << 20);
    r->set_alignment(4096);
    r->set_device_kind("dram");
    pb::RegisterNodeResponse resp;
    REQUIRE(stub->RegisterNode(&ctx, req, &resp).ok());
    grpc::ClientContext hctx;  // proves the key: the node is placeable
    pb::HeartbeatResponse hb;
    REQUIRE(
        stub->Heartbeat(&hctx, master::ProvingHeartbeat(req, resp), &hb).ok());
    node.SetIdentity(resp.node_id(), resp.node_key());
  }

  ClientOptions co;
  co.master_address = (*master)->address();
  auto client = Client::Create(co);
  REQUIRE(client.ok());
  std::vector<std::string> keys = {"b0", "b1", "b2", "b3"};
  std::vector<std::vector<char>> src(4, std::vector<char>(1 << 20, 'x'));
  std::vector<ConstBuffer> in;
  for (auto& s : src) in.push_back({s.data(), s.size()});
  auto put = (*client)->Put(keys, in);
  REQUIRE(put.ok());
  INFO("first error: " << (put->errors.empty() ? absl::OkStatus()
                                               : put->errors[0]));
  REQUIRE(put->stored == 4);

  std::vector<std::vector<char>> dst(4, std::vector<char>(1 << 20, '.'));
  std::vector<MutableBuffer> out;
  for (auto& d : dst) out.push_back({d.data(), d.size()});
  CallOptions call;
  call.deadline = absl::Now() + absl::Milliseconds(500);
  absl::Time start = absl::Now();
  auto got = (*client)->Get(keys, out, call);
  absl::Duration took = absl::Now() - start;
  REQUIRE(got.ok());
  CHECK(got->hit_prefix == 4);
  CHECK(got->loaded == 2);
  CHECK(got->stop_reason.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took < absl::Seconds(5));
  CHECK(dst[0] == std::vector<char>(1 << 20, 'A'));
  CHECK(dst[1] == std::vector<char>(1 << 20, 'B'));
  // The unfinished buffers are untouched now and stay untouched.
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(dst[2] == std::vector<char>(1 << 20, '.'));
  CHECK(dst[3] == std::vector<char>(1 << 20, '.'));
  CHECK(node.reads_seen() == 1);
}

}  // namespace
}  // namespace hymcache
