#include "storage_node/dataplane/data_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/string_view.h"
#include "common/eventually.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/test_capabilities.h"
#include "common/thread.h"
#include "common/wire.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/fake_memory_device.h"
#include "storage_node/device/hybrid_device.h"

namespace hymcache::storage {
namespace {

using testing::Eventually;
using wire::FrameType;
using wire::OpDesc;

constexpr uint64_t kCap = 4 << 20;
constexpr uint32_t kRegion = 0;

struct Reply {
  wire::FrameHeader h;
  std::vector<OpDesc> ops;
  std::string payload;
};

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A server over `device` with a fresh extent table.
struct Fixture {
  explicit Fixture(std::unique_ptr<MemoryDevice> dev,
                   DataServerOptions o = DataServerOptions(),
                   absl::Duration drain = absl::Seconds(5)) {
    device = std::move(dev);
    ExtentTableOptions to;
    to.regions = device->Regions();
    to.drain_timeout = drain;
    auto t = ExtentTable::Create(to);
    REQUIRE(t.ok());
    extents = std::move(*t);
    o.device = device.get();
    o.extents = extents.get();
    if (o.capabilities == nullptr) {
      o.capabilities = TestCapabilities::Get().verifier();
    }
    auto s = DataServer::Create(o);
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  explicit Fixture(DataServerOptions o = DataServerOptions())
      : Fixture(MakeDram(), o) {}

  static std::unique_ptr<MemoryDevice> MakeDram() {
    DramDeviceOptions d;
    d.capacity_bytes = kCap;
    auto dev = DramDevice::Create(d);
    REQUIRE(dev.ok());
    return std::move(*dev);
  }

  Socket Connect() {
    auto s = ConnectTcp("127.0.0.1:" + std::to_string(server->port()), Soon());
    REQUIRE(s.ok());
    return std::move(*s);
  }

  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<DataServer> server;
};

// The capability table of a request of `type`: each op's own capability if
// it has one (tests of refused ones), else one TestCapabilities signs.
void AppendCapabilities(FrameType type, const std::vector<OpDesc>& ops,
                        std::vector<uint8_t>* buf) {
  if (!wire::CarriesCapabilities(type)) return;
  for (OpDesc op : ops) {
    if (op.cap.rights == 0) {
      TestCapabilities::Get().SignOp(&op, TestCapabilities::RightsFor(type));
    }
    uint8_t c[wire::kCapBytes];
    wire::EncodeCapability(op.cap, c);
    buf->insert(buf->end(), c, c + sizeof(c));
  }
}

void SendFrame(int fd, FrameType type, uint64_t id,
               const std::vector<OpDesc>& ops, const std::string& payload,
               uint64_t payload_bytes) {
  std::vector<uint8_t> buf(wire::kHeaderBytes + ops.size() * wire::kOpBytes);
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = id;
  h.payload_bytes = payload_bytes;
  wire::EncodeHeader(h, buf.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], buf.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  AppendCapabilities(type, ops, &buf);
  buf.insert(buf.end(), payload.begin(), payload.end());
  REQUIRE(SendAll(fd, buf.data(), buf.size(), Soon()).ok());
}

absl::StatusOr<Reply> ReadReply(int fd) {
  uint8_t hdr[wire::kHeaderBytes];
  absl::Status s = RecvAll(fd, hdr, sizeof(hdr), Soon());
  if (!s.ok()) return s;
  auto h = wire::DecodeHeader(hdr);
  if (!h.ok()) return h.status();
  Reply r;
  r.h = *h;
  std::vector<uint8_t> table(h->op_count * wire::kOpBytes);
  if (!table.empty()) {
    s = RecvAll(fd, table.data(), table.size(), Soon());
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < h->op_count; ++i) {
    r.ops.push_back(wire::DecodeOp(table.data() + i * wire::kOpBytes));
  }
  r.payload.resize(h->payload_bytes);
  if (h->payload_bytes > 0) {
    s = RecvAll(fd, r.payload.data(), r.payload.size(), Soon());
    if (!s.ok()) return s;
  }
  return r;
}

OpDesc Op(uint64_t addr, uint64_t len, uint64_t gen, uint32_t region = kRegion) {
  OpDesc op;
  op.region_id = region;
  op.addr = addr;
  op.length = len;
  op.generation = gen;
  return op;
}

// Without Catch2 assertions: safe on any thread.
absl::StatusOr<Reply> Exchange(int fd, FrameType type,
                               const std::vector<OpDesc>& ops,
                               const std::string& payload) {
  std::vector<uint8_t> buf(wire::kHeaderBytes + ops.size() * wire::kOpBytes);
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = 1;
  h.payload_bytes = payload.size();
  wire::EncodeHeader(h, buf.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], buf.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  AppendCapabilities(type, ops, &buf);
  buf.insert(buf.end(), payload.begin(), payload.end());
  absl::Status s = SendAll(fd, buf.data(), buf.size(), Soon());
  if (!s.ok()) return s;
  return ReadReply(fd);
}

Reply Write(int fd, const std::vector<OpDesc>& ops,
            const std::vector<std::string>& bytes, uint64_t id = 7) {
  std::string payload;
  for (const auto& b : bytes) payload += b;
  SendFrame(fd, FrameType::kWriteRequest, id, ops, payload, payload.size());
  auto r = ReadReply(fd);
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kWriteResponse);
  CHECK(r->h.request_id == id);
  REQUIRE(r->ops.size() == ops.size());
  return *r;
}

Reply Read(int fd, const std::vector<OpDesc>& ops, uint64_t id = 9) {
  SendFrame(fd, FrameType::kReadRequest, id, ops, "", 0);
  auto r = ReadReply(fd);
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kReadResponse);
  CHECK(r->h.request_id == id);
  REQUIRE(r->ops.size() == ops.size());
  REQUIRE(wire::ValidateOps(r->h, r->ops).ok());
  return *r;
}

absl::StatusCode Code(const OpDesc& op) { return wire::FromWireCode(op.status); }

// True once the server has closed `fd` (EOF or reset).
bool PeerClosed(int fd) {
  char c;
  absl::Status s = RecvAll(fd, &c, 1, Soon());
  return !s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded;
}

void Ping(Fixture& f) {
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kPing, 42, {}, "", 0);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kPong);
  CHECK(r->h.request_id == 42);
}

TEST_CASE("DataServer answers ping") {
  Fixture f;
  Ping(f);
  Ping(f);
}

TEST_CASE("DataServer round trip") {
  Fixture f;
  Socket s = f.Connect();
  std::string data(10000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  Reply w = Write(s.fd(), {Op(8192, data.size(), 3)}, {data});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kOk);
  // The node's write receipt for exactly this extent and generation.
  REQUIRE(w.payload.size() == wire::kReceiptBytes);
  CHECK(TestCapabilities::Get().IsReceipt(Op(8192, data.size(), 3), w.payload));
  CHECK_FALSE(
      TestCapabilities::Get().IsReceipt(Op(8192, data.size(), 4), w.payload));
  Reply r = Read(s.fd(), {Op(8192, data.size(), 3)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(r.payload == data);
  DataServerStats st = f.server->Stats();
  CHECK(st.write_ops == 1);
  CHECK(st.read_ops == 1);
  CHECK(st.bytes_written == data.size());
  CHECK(st.bytes_read == data.size());
  CHECK(st.tcp_bytes_written == data.size());
  CHECK(st.shm_bytes_written + st.rdma_bytes_written == 0);
  CHECK(st.open_connections == 1);
  // The same stats by name, with the read latency histogram (observed
  // once the reply is sent: the reader may see the reply first).
  auto by_name = [&] {
    FlatStatsVisitor flat;
    f.server->VisitStats(&flat);
    return std::map<std::string, double>(flat.values().begin(),
                                         flat.values().end());
  };
  CHECK(Eventually([&] { return by_name().at("read_seconds_count") == 1; }));
  const std::map<std::string, double> m = by_name();
  CHECK(m.at("bytes_read") == data.size());
  CHECK(m.at("tcp_bytes_written") == data.size());
  CHECK(m.at("open_connections") == 1);
  CHECK(m.at("read_seconds_count") == 1);
}

TEST_CASE("DataServer serves only ops its capabilities authorize") {
  Fixture f;
  Socket s = f.Connect();
  const TestCapabilities& caps = TestCapabilities::Get();
  std::string a(5000, 'a'), b(5000, 'b');
  REQUIRE(Code(Write(s.fd(), {Op(0, a.size(), 3)}, {a}).ops[0]) ==
          absl::StatusCode::kOk);

  // Per op: a valid one is served beside refused ones.
  OpDesc good = Op(0, a.size(), 3);
  OpDesc forged = good;
  caps.SignOp(&forged, wire::kCapRead);
  forged.cap.tag[0] ^= 1;
  OpDesc expired = good;
  expired.cap = caps.Sign(0 + kRegion, 0, a.size(), 3, wire::kCapRead,
                          -absl::Seconds(31));  // past the 30 s skew
  OpDesc write_cap = good;
  caps.SignOp(&write_cap, wire::kCapWrite);
  OpDesc other_gen = good;
  caps.SignOp(&other_gen, wire::kCapRead);
  other_gen.generation = 4;
  Reply r = Read(s.fd(), {forged, good, expired, write_cap, other_gen});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[2]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(r.ops[3]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(r.ops[4]) == absl::StatusCode::kPermissionDenied);
  CHECK(r.payload == a);

  // Another node's capability (same key, other identity).
  CapabilityVerifier other(absl::Seconds(30));
  other.SetIdentity(TestCapabilities::kNodeId + 1,
                    TestCapabilities::kIncarnation, TestCapabilities::Key());
  OpDesc signed_good = good;
  caps.SignOp(&signed_good, wire::kCapRead);
  CHECK(other.Current()
            .Check(signed_good, wire::kCapRead, absl::ToUnixMillis(absl::Now()))
            .code() == absl::StatusCode::kPermissionDenied);

  // A read capability used for a write over the live object, at its
  // generation + 1: refused, its bytes skipped (the connection stays in
  // step), the object untouched.
  OpDesc over = Op(0, b.size(), 4);
  caps.SignOp(&over, wire::kCapRead);
  OpDesc fresh = Op(1 << 20, b.size(), 5);  // granted: written
  Reply w = Write(s.fd(), {over, fresh}, {b, b});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(w.ops[1]) == absl::StatusCode::kOk);
  r = Read(s.fd(), {Op(0, a.size(), 3), Op(1 << 20, b.size(), 5)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kOk);
  CHECK(r.payload == a + b);
  CHECK(f.server->Stats().denied_ops == 5);
}

TEST_CASE("DataServer: ops arriving during a registration wait for its identity") {
  // The master lists a node a moment before the node has applied the
  // registration's answer; a client's capabilities under it must not be
  // refused in that moment.
  CapabilityVerifier v(absl::Seconds(30));
  DataServerOptions o;
  o.capabilities = &v;
  Fixture f(Fixture::MakeDram(), o);
  Socket s = f.Connect();
  v.BeginIdentityChange();
  std::string a(4096, 'a');
  SendFrame(s.fd(), FrameType::kWriteRequest, 7, {Op(0, a.size(), 3)}, a,
            a.size());
  // The server holds the write while the registration is in flight...
  REQUIRE(Eventually([&] { return v.identity_waiters() == 1; }));
  // ...and serves it once the answer is applied.
  v.SetIdentity(TestCapabilities::kNodeId, TestCapabilities::kIncarnation,
                TestCapabilities::Key());
  auto w = ReadReply(s.fd());
  REQUIRE(w.ok());
  REQUIRE(w->ops.size() == 1);
  CHECK(Code(w->ops[0]) == absl::StatusCode::kOk);
  Reply r = Read(s.fd(), {Op(0, a.size(), 3)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(r.payload == a);
  CHECK(f.server->Stats().denied_ops == 0);
  // With no registration in flight a forged capability is refused at once.
  OpDesc forged = Op(0, a.size(), 3);
  TestCapabilities::Get().SignOp(&forged, wire::kCapRead);
  forged.cap.tag[0] ^= 1;
  const absl::Time t0 = absl::Now();
  r = Read(s.fd(), {forged});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(absl::Now() - t0 < absl::Seconds(1));
}

TEST_CASE("DataServer: an RDMA queue pair needs a granted object") {
  // This server has no RDMA plane: a valid grant gets as far as that
  // (Unimplemented); a missing, forged, expired or wrong-rights grant is
  // refused before (PermissionDenied), and every refusal closes.
  Fixture f;
  const TestCapabilities& caps = TestCapabilities::Get();
  const std::string qp_info(64, 'q');
  auto connect = [&](std::vector<OpDesc> ops) {
    Socket s = f.Connect();
    SendFrame(s.fd(), FrameType::kRdmaConnectRequest, 3, ops, qp_info,
              qp_info.size());
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    REQUIRE(r->h.type == FrameType::kError);
    CHECK(PeerClosed(s.fd()));
    INFO(std::string(r->payload.begin(), r->payload.end()));
    return wire::FromWireCode(r->h.status);
  };
  OpDesc good = Op(0, 4096, 3);  // signed by SendFrame: a read grant
  CHECK(connect({good}) == absl::StatusCode::kUnimplemented);
  OpDesc write_grant = good;
  caps.SignOp(&write_grant, wire::kCapWrite);
  CHECK(connect({write_grant}) == absl::StatusCode::kUnimplemented);
  OpDesc forged = good;
  caps.SignOp(&forged, wire::kCapRead);
  forged.cap.tag[3] ^= 0x40;
  CHECK(connect({forged}) == absl::StatusCode::kPermissionDenied);
  OpDesc expired = good;
  expired.cap = caps.Sign(kRegion, 0, 4096, 3, wire::kCapRead,
                          -absl::Seconds(31));
  CHECK(connect({expired}) == absl::StatusCode::kPermissionDenied);
  OpDesc other_object = good;
  caps.SignOp(&other_object, wire::kCapRead);
  other_object.addr = 8192;
  CHECK(connect({other_object}) == absl::StatusCode::kPermissionDenied);
  // The old, unauthenticated form (no op) is malformed.
  CHECK(connect({}) == absl::StatusCode::kInvalidArgument);
  CHECK(f.server->Stats().denied_ops == 3);
  Ping(f);
}

TEST_CASE("DataServer: a failed write over a live object leaves it readable") {
  // The defect: a write at generation + 1 over a live object dropped it
  // before waiting for its readers, so a write that then failed (readers
  // did not drain) destroyed it anyway.
  Fixture f(Fixture::MakeDram(), DataServerOptions(), absl::Milliseconds(100));
  Socket s = f.Connect();
  std::string a(8192, 'a'), b(8192, 'b');
  REQUIRE(Code(Write(s.fd(), {Op(0, a.size(), 3)}, {a}).ops[0]) ==
          absl::StatusCode::kOk);
  auto pin = f.extents->PinRead(ExtentKey{kRegion, 0, a.size(), 3});
  REQUIRE(pin.ok());  // a reader in progress
  Reply w = Write(s.fd(), {Op(0, b.size(), 4)}, {b});  // granted
  CHECK(Code(w.ops[0]) == absl::StatusCode::kUnavailable);
  Reply r = Read(s.fd(), {Op(0, a.size(), 3)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(r.payload == a);
  pin->Release();
  // Once the reader is done the write goes through.
  CHECK(Code(Write(s.fd(), {Op(0, b.size(), 4)}, {b}).ops[0]) ==
        absl::StatusCode::kOk);
  r = Read(s.fd(), {Op(0, a.size(), 3), Op(0, b.size(), 4)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kNotFound);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kOk);
  CHECK(r.payload == b);
}

TEST_CASE("DataServer batches ops and reports each op's status") {
  Fixture f;
  Socket s = f.Connect();
  Reply w = Write(s.fd(), {Op(0, 3, 1), Op(4096, 5, 2), Op(8192, 4, 3)},
                  {"abc", "defgh", "ijkl"});
  for (const OpDesc& op : w.ops) CHECK(Code(op) == absl::StatusCode::kOk);

  // Wrong generation in the middle: NotFound, and its bytes are left out.
  Reply r = Read(s.fd(), {Op(0, 3, 1), Op(4096, 5, 9), Op(8192, 4, 3),
                          Op(4096, 5, 2)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kNotFound);
  CHECK(Code(r.ops[2]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[3]) == absl::StatusCode::kOk);
  CHECK(r.ops[1].length == 5);  // length stays as requested
  CHECK(r.payload == "abcijkldefgh");
  CHECK(f.server->Stats().stale_reads == 1);

  // Space reused by a newer generation: the old location reads NotFound.
  Reply w2 = Write(s.fd(), {Op(0, 2, 10)}, {"zz"});
  CHECK(Code(w2.ops[0]) == absl::StatusCode::kOk);
  Reply r2 = Read(s.fd(), {Op(0, 3, 1), Op(0, 2, 10)});
  CHECK(Code(r2.ops[0]) == absl::StatusCode::kNotFound);
  CHECK(r2.payload == "zz");
  // And a late write of the old generation is refused as stale.
  Reply w3 = Write(s.fd(), {Op(0, 3, 1)}, {"old"});
  CHECK(Code(w3.ops[0]) == absl::StatusCode::kFailedPrecondition);
  CHECK(Read(s.fd(), {Op(0, 2, 10)}).payload == "zz");
}

TEST_CASE("DataServer rejects ops outside the region and stays in step") {
  Fixture f;
  Socket s = f.Connect();
  Reply w = Write(s.fd(),
                  {Op(kCap - 2, 4, 1), Op(0, 4, 2, /*region=*/5), Op(64, 4, 3)},
                  {"AAAA", "BBBB", "CCCC"});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kOutOfRange);
  CHECK(Code(w.ops[1]) == absl::StatusCode::kInvalidArgument);
  CHECK(Code(w.ops[2]) == absl::StatusCode::kOk);
  Reply r = Read(s.fd(), {Op(kCap, 1, 1), Op(0, 4, 2, 5), Op(64, 4, 3)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOutOfRange);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kInvalidArgument);
  CHECK(r.payload == "CCCC");
  DataServerStats st = f.server->Stats();
  CHECK(st.rejected_ops == 4);
  CHECK(st.write_ops == 1);
}

TEST_CASE("DataServer reports a refused device write and carries on") {
  auto dev = std::make_unique<FakeMemoryDevice>(kCap);
  FakeMemoryDevice* fake = dev.get();
  Fixture f(std::move(dev));
  Socket s = f.Connect();
  fake->SetRefuseWritesForTest(true);
  Reply w = Write(s.fd(), {Op(0, 4, 1)}, {"full"});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kResourceExhausted);
  fake->SetRefuseWritesForTest(false);
  fake->SetFailCommitsForTest(true);
  w = Write(s.fd(), {Op(0, 4, 1)}, {"fail"});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kUnavailable);
  fake->SetFailCommitsForTest(false);
  CHECK(Code(Read(s.fd(), {Op(0, 4, 1)}).ops[0]) ==
        absl::StatusCode::kNotFound);
  w = Write(s.fd(), {Op(0, 4, 1)}, {"good"});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kOk);
  CHECK(Read(s.fd(), {Op(0, 4, 1)}).payload == "good");
  CHECK(fake->Stats().outstanding_writes == 0);
  // Read views are released just after the response is sent.
  CHECK(Eventually([&] { return fake->Stats().outstanding_reads == 0; }));
}

TEST_CASE("DataServer answers a garbage header with kError and closes") {
  Fixture f;
  {
    Socket s = f.Connect();
    std::string junk(wire::kHeaderBytes, 'G');
    REQUIRE(SendAll(s.fd(), junk.data(), junk.size(), Soon()).ok());
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
    CHECK(wire::FromWireCode(r->h.status) == absl::StatusCode::kInvalidArgument);
    CHECK(r->payload.find("magic") != std::string::npos);
    CHECK(PeerClosed(s.fd()));
  }
  {
    // A response frame type from a client.
    Socket s = f.Connect();
    SendFrame(s.fd(), FrameType::kPong, 5, {}, "", 0);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
    CHECK(PeerClosed(s.fd()));
  }
  {
    // Payload that does not add up to the ops' lengths.
    Socket s = f.Connect();
    SendFrame(s.fd(), FrameType::kWriteRequest, 5, {Op(0, 4, 1)}, "abcdefgh", 8);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
    CHECK(PeerClosed(s.fd()));
  }
  {
    // Op with zero length.
    Socket s = f.Connect();
    SendFrame(s.fd(), FrameType::kReadRequest, 5, {Op(0, 0, 1)}, "", 0);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
  }
  CHECK(f.server->Stats().protocol_errors >= 4);
  Ping(f);
}

TEST_CASE("DataServer: a truncated write leaves nothing readable") {
  Fixture f;
  {
    Socket s = f.Connect();
    // Promise 100 bytes, send 50, then stop sending.
    SendFrame(s.fd(), FrameType::kWriteRequest, 5, {Op(0, 100, 1)},
              std::string(50, 'q'), 100);
    ::shutdown(s.fd(), SHUT_WR);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
    CHECK(wire::FromWireCode(r->h.status) == absl::StatusCode::kUnavailable);
    CHECK(PeerClosed(s.fd()));
  }
  {
    // A truncated header.
    Socket s = f.Connect();
    REQUIRE(SendAll(s.fd(), "HYMC", 4, Soon()).ok());
    ::shutdown(s.fd(), SHUT_WR);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
  }
  Socket s = f.Connect();
  CHECK(Code(Read(s.fd(), {Op(0, 100, 1)}).ops[0]) ==
        absl::StatusCode::kNotFound);
  CHECK(f.extents->Stats().writing == 0);
  // The allocation can still be written afterwards.
  Reply w = Write(s.fd(), {Op(0, 100, 1)}, {std::string(100, 'r')});
  CHECK(Code(w.ops[0]) == absl::StatusCode::kOk);
}

TEST_CASE("DataServer: a stalled peer times out") {
  DataServerOptions o;
  o.io_timeout = absl::Milliseconds(200);
  Fixture f(o);
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kWriteRequest, 5, {Op(0, 100, 1)},
            std::string(10, 'q'), 100);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kError);
  CHECK(wire::FromWireCode(r->h.status) ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(PeerClosed(s.fd()));
  CHECK(f.extents->Stats().writing == 0);
  Ping(f);
}

TEST_CASE("DataServer refuses connections beyond max_connections") {
  DataServerOptions o;
  o.max_connections = 1;
  Fixture f(o);
  Socket a = f.Connect();
  SendFrame(a.fd(), FrameType::kPing, 1, {}, "", 0);
  REQUIRE(ReadReply(a.fd()).ok());  // `a` is being served
  Socket b = f.Connect();
  auto r = ReadReply(b.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kError);
  CHECK(wire::FromWireCode(r->h.status) ==
        absl::StatusCode::kResourceExhausted);
  CHECK(f.server->Stats().refused_connections == 1);
  a.Close();
  // Once `a` is gone there is room again.
  CHECK(Eventually([&] {
    Socket c = f.Connect();
    SendFrame(c.fd(), FrameType::kPing, 2, {}, "", 0);
    auto p = ReadReply(c.fd());
    return p.ok() && p->h.type == FrameType::kPong;
  }));
}

TEST_CASE("DataServer closes connections idle beyond idle_timeout") {
  CHECK(DataServerOptions().max_connections == 8192);
  CHECK(DataServerOptions().idle_timeout == absl::Seconds(60));
  DataServerOptions o;
  o.idle_timeout = absl::Milliseconds(300);
  o.max_connections = 1;
  Fixture f(o);
  Socket idle = f.Connect();
  SendFrame(idle.fd(), FrameType::kPing, 1, {}, "", 0);
  REQUIRE(ReadReply(idle.fd()).ok());
  // Never sends again: closed once idle_timeout passes, freeing the slot.
  absl::Time start = absl::Now();
  CHECK(PeerClosed(idle.fd()));
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(Eventually([&] { return f.server->Stats().open_connections == 0; }));
  CHECK(f.server->Stats().idle_closed_connections == 1);

  // A connection that keeps sending requests stays open past idle_timeout.
  Socket busy = f.Connect();
  for (int i = 0; i < 8; ++i) {
    SendFrame(busy.fd(), FrameType::kPing, 10 + i, {}, "", 0);
    auto r = ReadReply(busy.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kPong);
    absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(f.server->Stats().idle_closed_connections == 1);
  CHECK(f.server->Stats().refused_connections == 0);
}

TEST_CASE("DataServer rejects a non-positive idle_timeout") {
  auto dev = Fixture::MakeDram();
  ExtentTableOptions to;
  to.regions = dev->Regions();
  auto t = ExtentTable::Create(to);
  REQUIRE(t.ok());
  DataServerOptions o;
  o.device = dev.get();
  o.extents = t->get();
  o.capabilities = TestCapabilities::Get().verifier();
  o.idle_timeout = absl::ZeroDuration();
  CHECK(DataServer::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.idle_timeout = absl::InfiniteDuration();  // never times out
  auto s = DataServer::Create(o);
  REQUIRE(s.ok());
  Socket c = *ConnectTcp("127.0.0.1:" + std::to_string((*s)->port()), Soon());
  SendFrame(c.fd(), FrameType::kPing, 1, {}, "", 0);
  CHECK(ReadReply(c.fd()).ok());
}

TEST_CASE("DataServer serves with a bounded or an autotuned send buffer") {
  {
    auto dev = Fixture::MakeDram();
    ExtentTableOptions to;
    to.regions = dev->Regions();
    auto t = ExtentTable::Create(to);
    REQUIRE(t.ok());
    DataServerOptions o;
    o.device = dev.get();
    o.extents = t->get();
    o.capabilities = TestCapabilities::Get().verifier();
    o.send_buffer_bytes = -1;
    CHECK(DataServer::Create(o).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  for (int send_buffer : {0, 16 << 10, kDataSendBufferBytes}) {
    INFO("send_buffer_bytes " << send_buffer);
    DataServerOptions o;
    o.send_buffer_bytes = send_buffer;
    Fixture f(o);
    Socket s = f.Connect();
    // Larger than any of the buffers: the response is sent in many turns.
    std::string a(2 << 20, 'a'), b(1 << 20, 'b');
    Reply w = Write(s.fd(), {Op(0, a.size(), 1), Op(a.size(), b.size(), 2)},
                    {a, b});
    REQUIRE(Code(w.ops[0]) == absl::StatusCode::kOk);
    REQUIRE(Code(w.ops[1]) == absl::StatusCode::kOk);
    Reply r = Read(s.fd(), {Op(0, a.size(), 1), Op(a.size(), b.size(), 2)});
    CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
    CHECK(Code(r.ops[1]) == absl::StatusCode::kOk);
    CHECK(r.payload == a + b);
  }
}

TEST_CASE("DataServer survives failing to start a worker thread") {
  Fixture f;
  f.server->SetFailThreadStartsForTest(true);
  // Accepted (an idle connection needs no thread), but no worker can be
  // started for its request: refused, and the bookkeeping undone.
  for (int i = 0; i < 3; ++i) {
    Socket s = f.Connect();
    SendFrame(s.fd(), FrameType::kPing, 1, {}, "", 0);
    auto r = ReadReply(s.fd());
    REQUIRE(r.ok());
    CHECK(r->h.type == FrameType::kError);
    CHECK(wire::FromWireCode(r->h.status) ==
          absl::StatusCode::kResourceExhausted);
    CHECK(r->payload.find("cannot start a thread") != std::string::npos);
    CHECK(PeerClosed(s.fd()));
  }
  REQUIRE(Eventually([&] { return f.server->Stats().open_connections == 0; }));
  DataServerStats st = f.server->Stats();
  CHECK(st.thread_start_failures == 3);
  CHECK(st.refused_connections == 3);
  CHECK(st.worker_threads == 0);
  CHECK(st.requests_in_progress == 0);
  f.server->SetFailThreadStartsForTest(false);
  Ping(f);
  CHECK(f.server->Stats().worker_threads == 1);
  // Once one worker runs, a failure to start another only delays requests.
  f.server->SetFailThreadStartsForTest(true);
  Ping(f);
  f.server->Shutdown(absl::Seconds(5));
  CHECK(f.server->Stats().open_connections == 0);
}

TEST_CASE("DataServer shuts down promptly with an idle connection") {
  Fixture f;
  Socket idle = f.Connect();
  SendFrame(idle.fd(), FrameType::kPing, 1, {}, "", 0);
  REQUIRE(ReadReply(idle.fd()).ok());
  absl::Time start = absl::Now();
  f.server->Shutdown(absl::Seconds(10));
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK(PeerClosed(idle.fd()));
  CHECK(f.server->Stats().open_connections == 0);
  // No longer accepting.
  auto c = ConnectTcp("127.0.0.1:" + std::to_string(f.server->port()), Soon());
  if (c.ok()) CHECK(PeerClosed(c->fd()));
  f.server->Shutdown(absl::Seconds(1));  // idempotent
}

TEST_CASE("DataServer finishes a request in progress during shutdown") {
  Fixture f;
  Socket s = f.Connect();
  // Send the header and half the payload, then shut down, then the rest.
  SendFrame(s.fd(), FrameType::kWriteRequest, 5, {Op(0, 8, 1)}, "1234", 8);
  REQUIRE(Eventually([&] { return f.extents->Stats().writing == 1; }));
  Thread stopper("stopper", [&] { f.server->Shutdown(absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(SendAll(s.fd(), "5678", 4, Soon()).ok());
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kWriteResponse);
  CHECK(Code(r->ops[0]) == absl::StatusCode::kOk);
  stopper.Join();
  CHECK(f.extents->Stats().extents == 1);
}

TEST_CASE("DataServer: drain timeout breaks a stalled request") {
  Fixture f;
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kWriteRequest, 5, {Op(0, 8, 1)}, "1234", 8);
  REQUIRE(Eventually([&] { return f.extents->Stats().writing == 1; }));
  absl::Time start = absl::Now();
  f.server->Shutdown(absl::Milliseconds(100));
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(f.extents->Stats().writing == 0);
  CHECK(f.extents->Stats().extents == 0);
}

TEST_CASE("DataServer serves many connections at once") {
  Fixture f;
  std::vector<Thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back("client", [&, t] {
      auto s = ConnectTcp("127.0.0.1:" + std::to_string(f.server->port()),
                          Soon());
      if (!s.ok()) return;
      for (int i = 0; i < 20; ++i) {
        uint64_t addr = static_cast<uint64_t>(t) * 65536 + i * 1024;
        uint64_t gen = static_cast<uint64_t>(t) * 1000 + i + 1;
        std::string data(1000, static_cast<char>('a' + t));
        auto w = Exchange(s->fd(), FrameType::kWriteRequest,
                          {Op(addr, data.size(), gen)}, data);
        auto r = Exchange(s->fd(), FrameType::kReadRequest,
                          {Op(addr, data.size(), gen)}, "");
        if (w.ok() && w->ops.size() == 1 &&
            Code(w->ops[0]) == absl::StatusCode::kOk && r.ok() &&
            r->payload == data) {
          ++good;
        }
      }
    });
  }
  for (auto& th : threads) th.Join();
  CHECK(good.load() == 80);
}

// ------------------------------------------------------------ limits

// A connection from `source` (a loopback address other than 127.0.0.1 is
// another peer to the server).
Socket ConnectFrom(const char* source, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  Socket s(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, source, &a.sin_addr) == 1);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(inet_pton(AF_INET, "127.0.0.1", &to.sin_addr) == 1);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
  return s;
}

bool Pong(int fd, uint64_t id) {
  SendFrame(fd, FrameType::kPing, id, {}, "", 0);
  auto r = ReadReply(fd);
  return r.ok() && r->h.type == FrameType::kPong && r->h.request_id == id;
}

TEST_CASE("DataServer: idle connections hold no thread") {
  Fixture f;
  std::vector<Socket> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(f.Connect());
  // Each served once, then idle again.
  for (int i = 0; i < 300; i += 10) CHECK(Pong(idle[i].fd(), i + 1));
  REQUIRE(Eventually([&] { return f.server->Stats().open_connections == 300; }));
  REQUIRE(Eventually(
      [&] { return f.server->Stats().requests_in_progress == 0; }));
  // One request at a time: a handful of workers, never one per connection
  // served (30) or open (300). A worker that has sent its answer but not yet
  // gone back to waiting is not idle, so the next ping may start another:
  // under TSan on a busy machine 5 were seen, hence the slack.
  CHECK(f.server->Stats().worker_threads <= 8);
  Ping(f);
}

TEST_CASE("DataServer limits connections per peer") {
  CHECK(DataServerOptions().max_connections_per_peer == 1024);
  DataServerOptions o;
  o.max_connections = 4;
  o.max_connections_per_peer = 2;
  Fixture f(o);
  Socket a1 = ConnectFrom("127.0.0.2", f.server->port());
  Socket a2 = ConnectFrom("127.0.0.2", f.server->port());
  CHECK(Pong(a1.fd(), 1));
  CHECK(Pong(a2.fd(), 2));
  Socket a3 = ConnectFrom("127.0.0.2", f.server->port());
  auto r = ReadReply(a3.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kError);
  CHECK(wire::FromWireCode(r->h.status) ==
        absl::StatusCode::kResourceExhausted);
  CHECK(r->payload.find("from 127.0.0.2") != std::string::npos);
  CHECK(f.server->Stats().peer_refused_connections == 1);
  // Another peer still gets in.
  Socket b = f.Connect();
  CHECK(Pong(b.fd(), 3));
  CHECK(f.server->Stats().refused_connections == 1);
  // Options are checked.
  o.max_connections_per_peer = 0;
  o.device = f.device.get();
  o.extents = f.extents.get();
  CHECK(DataServer::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("DataServer: a peer's stalled requests do not hold up another's") {
  DataServerOptions o;
  o.worker_threads = 2;
  o.max_requests_per_peer = 1;
  Fixture f(o);
  // Peer A stalls a write mid-payload: it holds a worker.
  Socket a1 = ConnectFrom("127.0.0.2", f.server->port());
  SendFrame(a1.fd(), FrameType::kWriteRequest, 5, {Op(0, 8, 1)}, "1234", 8);
  REQUIRE(Eventually([&] { return f.extents->Stats().writing == 1; }));
  // Its next request waits for it (no second worker for A)...
  Socket a2 = ConnectFrom("127.0.0.2", f.server->port());
  SendFrame(a2.fd(), FrameType::kPing, 6, {}, "", 0);
  REQUIRE(Eventually([&] { return f.server->Stats().deferred_requests == 1; }));
  // ...while peer B is served at once.
  Socket b = f.Connect();
  for (int i = 0; i < 5; ++i) CHECK(Pong(b.fd(), 10 + i));
  // A's write completes, then its deferred ping is answered.
  REQUIRE(SendAll(a1.fd(), "5678", 4, Soon()).ok());
  auto w = ReadReply(a1.fd());
  REQUIRE(w.ok());
  CHECK(w->h.type == FrameType::kWriteResponse);
  auto p = ReadReply(a2.fd());
  REQUIRE(p.ok());
  CHECK(p->h.type == FrameType::kPong);
  CHECK(Eventually(
      [&] { return f.server->Stats().requests_in_progress == 0; }));
}

TEST_CASE("DataServer: a header trickled byte by byte holds no worker") {
  DataServerOptions o;
  o.worker_threads = 1;
  o.max_requests_per_peer = 1;
  o.io_timeout = absl::Milliseconds(300);
  Fixture f(o);
  Socket slow = f.Connect();
  REQUIRE(SendAll(slow.fd(), "\x01", 1, Soon()).ok());
  Socket b = ConnectFrom("127.0.0.2", f.server->port());
  CHECK(Pong(b.fd(), 1));  // the only worker is free
  // The header never completes: an error once io_timeout passes.
  auto r = ReadReply(slow.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kError);
  CHECK(wire::FromWireCode(r->h.status) ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(PeerClosed(slow.fd()));
}

// ------------------------------------------------------------ sessions

std::string SessionPayload(uint64_t session) {
  std::string p(wire::kSessionBytes, '\0');
  wire::EncodeSession(session, reinterpret_cast<uint8_t*>(p.data()));
  return p;
}

Reply SessionFrame(int fd, FrameType type, uint64_t session,
                   const std::vector<OpDesc>& ops) {
  SendFrame(fd, type, 11, ops, SessionPayload(session), wire::kSessionBytes);
  auto r = ReadReply(fd);
  REQUIRE(r.ok());
  REQUIRE(r->ops.size() == ops.size());
  return *r;
}

// A server with a KvManager over `device`.
struct SessionFixture {
  explicit SessionFixture(std::unique_ptr<MemoryDevice> dev,
                          uint64_t staging_capacity = 0) {
    device = std::move(dev);
    ExtentTableOptions to;
    to.regions = device->Regions();
    extents = std::move(*ExtentTable::Create(to));
    KvManagerOptions ko;
    ko.device = device.get();
    ko.extents = extents.get();
    ko.staging_capacity = staging_capacity;
    kv = std::move(*KvManager::Create(ko));
    DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.capabilities = TestCapabilities::Get().verifier();
    server = std::move(*DataServer::Create(o));
  }
  Socket Connect() {
    auto s = ConnectTcp("127.0.0.1:" + std::to_string(server->port()), Soon());
    REQUIRE(s.ok());
    return std::move(*s);
  }
  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<DataServer> server;
};

TEST_CASE("DataServer serves prefetch, session reads and release") {
  SessionFixture f(Fixture::MakeDram());
  Socket s = f.Connect();
  Reply w = Write(s.fd(), {Op(0, 3, 1), Op(4096, 5, 2), Op(8192, 4, 3)},
                  {"abc", "defgh", "ijkl"});
  for (const OpDesc& op : w.ops) REQUIRE(Code(op) == absl::StatusCode::kOk);

  Reply p = SessionFrame(s.fd(), FrameType::kPrefetchRequest, 77,
                         {Op(0, 3, 1), Op(4096, 5, 9), Op(8192, 4, 3)});
  CHECK(p.h.type == FrameType::kPrefetchResponse);
  CHECK(Code(p.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(p.ops[1]) == absl::StatusCode::kNotFound);  // stale generation
  CHECK(Code(p.ops[2]) == absl::StatusCode::kOk);
  CHECK(f.kv->Stats().staging_objects == 2);

  // A session read: the prefetched object from staging, and an object the
  // session did not prefetch the ordinary way.
  SendFrame(s.fd(), FrameType::kReadRequest, 12, {Op(0, 3, 1), Op(4096, 5, 2)},
            SessionPayload(77), wire::kSessionBytes);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kReadResponse);
  CHECK(Code(r->ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r->ops[1]) == absl::StatusCode::kOk);
  CHECK(r->payload == "abcdefgh");
  CHECK(f.server->Stats().staged_read_ops == 1);
  // The read object is released once the response is sent.
  CHECK(Eventually([&] { return f.kv->Stats().staging_objects == 1; }));

  // Cancel: release everything of the session (no ops).
  Reply rel = SessionFrame(s.fd(), FrameType::kReleaseRequest, 77, {});
  CHECK(rel.h.type == FrameType::kReleaseResponse);
  CHECK(f.kv->Stats().sessions == 0);
  CHECK(f.kv->Stats().released_unread == 1);
  // Releasing an unknown session's object: NotFound per op.
  rel = SessionFrame(s.fd(), FrameType::kReleaseRequest, 77, {Op(0, 3, 1)});
  CHECK(Code(rel.ops[0]) == absl::StatusCode::kNotFound);

  // A prefetch without its session id is malformed: kError, closed.
  SendFrame(s.fd(), FrameType::kPrefetchRequest, 13, {Op(0, 3, 1)}, "", 0);
  auto e = ReadReply(s.fd());
  REQUIRE(e.ok());
  CHECK(e->h.type == FrameType::kError);
  CHECK(PeerClosed(s.fd()));
}

Reply HintFrame(int fd, const std::vector<OpDesc>& ops, wire::HintTimes t) {
  std::string p(wire::kHintTimesBytes, '\0');
  wire::EncodeHintTimes(t, reinterpret_cast<uint8_t*>(p.data()));
  SendFrame(fd, FrameType::kHintRequest, 21, ops, p, wire::kHintTimesBytes);
  auto r = ReadReply(fd);
  REQUIRE(r.ok());
  REQUIRE(r->h.type == FrameType::kHintResponse);
  REQUIRE(r->ops.size() == ops.size());
  return *r;
}

TEST_CASE("DataServer passes authorized think-time hints to its KV manager") {
  SessionFixture f(Fixture::MakeDram(), /*staging_capacity=*/1 << 20);
  Socket s = f.Connect();
  Reply w = Write(s.fd(), {Op(0, 3, 1), Op(4096, 5, 2)}, {"abc", "defgh"});
  for (const OpDesc& op : w.ops) REQUIRE(Code(op) == absl::StatusCode::kOk);

  OpDesc forged = Op(4096, 5, 2);
  TestCapabilities::Get().SignOp(&forged, wire::kCapRead);
  forged.cap.tag[0] ^= 1;
  Reply h = HintFrame(s.fd(), {Op(0, 3, 1), forged}, {0, 5000});
  CHECK(Code(h.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(h.ops[1]) == absl::StatusCode::kPermissionDenied);
  KvManagerStats st = f.kv->Stats();
  CHECK(st.turn_hints == 1);
  CHECK(st.turn_hints_staged == 1);

  // A plain read of the hinted object ends its hint (read staged).
  Reply r = Read(s.fd(), {Op(0, 3, 1)});
  CHECK(r.payload == "abc");
  st = f.kv->Stats();
  CHECK(st.turn_hint_hits == 1);
  CHECK(st.turn_hints_held == 0);

  // An end hint (hold 0) of an object not hinted: NotFound.
  h = HintFrame(s.fd(), {Op(4096, 5, 2)}, {0, 0});
  CHECK(Code(h.ops[0]) == absl::StatusCode::kNotFound);

  // A hint without its times is malformed: kError, closed.
  SendFrame(s.fd(), FrameType::kHintRequest, 22, {Op(0, 3, 1)},
            SessionPayload(1) + "x", wire::kSessionBytes + 1);
  auto e = ReadReply(s.fd());
  REQUIRE(e.ok());
  CHECK(e->h.type == FrameType::kError);
  CHECK(PeerClosed(s.fd()));
}

TEST_CASE("DataServer without a prefetch manager answers Unimplemented") {
  Fixture f;
  Socket s = f.Connect();
  Reply w = Write(s.fd(), {Op(0, 3, 1)}, {"abc"});
  Reply p = SessionFrame(s.fd(), FrameType::kPrefetchRequest, 5, {Op(0, 3, 1)});
  CHECK(Code(p.ops[0]) == absl::StatusCode::kUnimplemented);
  CHECK(Code(HintFrame(s.fd(), {Op(0, 3, 1)}, {0, 1000}).ops[0]) ==
        absl::StatusCode::kUnimplemented);
  // Session reads are plain reads.
  SendFrame(s.fd(), FrameType::kReadRequest, 12, {Op(0, 3, 1)},
            SessionPayload(5), wire::kSessionBytes);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->payload == "abc");
}

TEST_CASE("a session read holding a staged object never waits for another") {
  constexpr uint64_t kObj = 64 << 10;
  constexpr uint64_t kTierCap = 4 << 20;
  FakeBlockIo io(CapacityTier::kHeaderBytes + kTierCap);
  std::string a(kObj, 'a'), b(kObj, 'b');
  io.FillForTest(CapacityTier::kHeaderBytes, a.data(), a.size());
  io.FillForTest(CapacityTier::kHeaderBytes + kObj, b.data(), b.size());
  HybridDeviceOptions ho;
  ho.staging_bytes = 1 << 20;
  ho.write_buffer_bytes = 1 << 20;
  ho.io_chunk_bytes = kObj;
  auto tier = std::make_unique<FakeCapacityTier>(
      &io, kTierCap,
      std::vector<DurableExtent>{{0, kObj, 1}, {kObj, kObj, 2}});
  auto dev = HybridDevice::Create(ho, std::move(tier));
  REQUIRE(dev.ok());
  SessionFixture f(std::move(*dev));
  for (const RecoveredExtent& x : f.device->RecoveredExtents()) {
    auto t = f.extents->BeginWrite({x.region_id, x.addr, x.length, x.generation});
    REQUIRE(t.ok());
    REQUIRE(t->Commit().ok());
  }
  Socket s = f.Connect();
  Reply p = SessionFrame(s.fd(), FrameType::kPrefetchRequest, 3, {Op(0, kObj, 1)});
  REQUIRE(Code(p.ops[0]) == absl::StatusCode::kOk);
  // Object a is staged; b's staging is stuck (the disk is paused).
  auto* hybrid = static_cast<HybridDevice*>(f.device.get());
  REQUIRE(Eventually([&] { return hybrid->HybridStats().refill_bytes >= kObj; }));
  io.PauseForTest();
  // Resume the disk whatever happens below, or the fixture never drains.
  struct Resume {
    FakeBlockIo* io;
    ~Resume() { io->ResumeForTest(); }
  } resume{&io};
  p = SessionFrame(s.fd(), FrameType::kPrefetchRequest, 3, {Op(kObj, kObj, 2)});
  REQUIRE(Code(p.ops[0]) == absl::StatusCode::kOk);

  SendFrame(s.fd(), FrameType::kReadRequest, 12,
            {Op(0, kObj, 1), Op(kObj, kObj, 2)}, SessionPayload(3),
            wire::kSessionBytes);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(Code(r->ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r->ops[1]) == absl::StatusCode::kAborted);  // asked again later
  CHECK(r->payload == a);

  io.ResumeForTest();
  SendFrame(s.fd(), FrameType::kReadRequest, 13, {Op(kObj, kObj, 2)},
            SessionPayload(3), wire::kSessionBytes);
  r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(Code(r->ops[0]) == absl::StatusCode::kOk);
  CHECK(r->payload == b);
  CHECK(Eventually([&] { return f.kv->Stats().sessions == 0; }));
  CHECK(f.server->Stats().staged_read_ops == 2);
}

// Found by //storage_node/dataplane:data_server_fuzz: a write overlapping what the same
// connection holds (a write it began, an object it acquired) waited the
// extent table's drain timeout (5 s) per op for a hold that only this
// connection's own thread could end.
TEST_CASE("a write over this connection's own holds is refused at once") {
  DataServerOptions o;
  o.io_timeout = absl::Seconds(30);
  Fixture f(o);
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kWriteBeginRequest, 1, {Op(0, 8192, 11)}, "",
            0);
  auto begun = ReadReply(s.fd());
  REQUIRE(begun.ok());
  REQUIRE(begun->ops[0].status == 0);
  const absl::Time start = absl::Now();
  // Overlapping at a higher generation: as a direct write, then over TCP.
  SendFrame(s.fd(), FrameType::kWriteBeginRequest, 2, {Op(4096, 8192, 12)},
            "", 0);
  auto again = ReadReply(s.fd());
  REQUIRE(again.ok());
  CHECK(again->ops[0].status ==
        wire::ToWireCode(absl::StatusCode::kFailedPrecondition));
  SendFrame(s.fd(), FrameType::kWriteRequest, 3, {Op(0, 16, 13)},
            std::string(16, 'x'), 16);
  auto tcp = ReadReply(s.fd());
  REQUIRE(tcp.ok());
  CHECK(tcp->ops[0].status ==
        wire::ToWireCode(absl::StatusCode::kFailedPrecondition));
  CHECK(absl::Now() - start < absl::Seconds(2));
  // The begun write is intact and commits.
  SendFrame(s.fd(), FrameType::kWriteCommitRequest, 4, {Op(0, 8192, 11)}, "",
            0);
  auto committed = ReadReply(s.fd());
  REQUIRE(committed.ok());
  CHECK(committed->ops[0].status == 0);
}

}  // namespace
}  // namespace hymcache::storage

namespace hymcache::storage {
namespace {

// RDMA without hardware: a fake queue pair that records what the server
// grants and revokes, and checks at each revocation that the hold it
// protects has not ended yet (the range cannot have been reused).
struct GrantLog {
  Mutex mu;
  struct Grant {
    uintptr_t data;
    uint64_t length;
    bool write;
  };
  std::map<uint32_t, Grant> open ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> revoked ABSL_GUARDED_BY(mu);
  // Per revocation: the objects still held (KvManager staging_objects)
  // and the device's writes committed at that moment.
  std::vector<std::pair<uint64_t, uint64_t>> at_revoke ABSL_GUARDED_BY(mu);
  bool connection_closed ABSL_GUARDED_BY(mu) = false;
  uint64_t reads_at_close ABSL_GUARDED_BY(mu) = 0;
  uint32_t next_key ABSL_GUARDED_BY(mu) = 0x100;
  bool fail_next_grant ABSL_GUARDED_BY(mu) = false;
  int bad_revokes ABSL_GUARDED_BY(mu) = 0;
  MemoryDevice* device = nullptr;
  KvManager* kv = nullptr;
};

class FakeRdmaConnection : public RdmaConnection {
 public:
  explicit FakeRdmaConnection(GrantLog* log) : log_(log) {}
  ~FakeRdmaConnection() override {
    std::vector<uint32_t> keys;
    {
      MutexLock l(&log_->mu);
      for (const auto& [k, g] : log_->open) keys.push_back(k);
    }
    Revoke(keys, absl::Now());
    MutexLock l(&log_->mu);
    log_->connection_closed = true;
    log_->reads_at_close = log_->kv->Stats().staging_objects;
  }
  std::vector<absl::StatusOr<uint32_t>> Grant(absl::Span<const Range> ranges,
                                              absl::Time) override {
    std::vector<absl::StatusOr<uint32_t>> out;
    MutexLock l(&log_->mu);
    for (const Range& r : ranges) {
      if (log_->fail_next_grant) {
        log_->fail_next_grant = false;
        out.push_back(absl::ResourceExhaustedError("out of windows"));
        continue;
      }
      const uint32_t k = log_->next_key++;
      log_->open[k] = {reinterpret_cast<uintptr_t>(r.data), r.length, r.write};
      out.push_back(k);
    }
    return out;
  }
  void Revoke(absl::Span<const uint32_t> keys, absl::Time) override {
    MutexLock l(&log_->mu);
    const MemoryDeviceStats st = log_->device->Stats();
    const uint64_t held = log_->kv->Stats().staging_objects;
    for (uint32_t k : keys) {
      // Granted, not revoked before (no Catch macros off the test thread).
      if (log_->open.erase(k) != 1) log_->bad_revokes++;
      log_->revoked.push_back(k);
      log_->at_revoke.push_back({held, st.writes});
    }
  }

 private:
  GrantLog* const log_;
};

class FakeRdmaAcceptor : public RdmaAcceptor {
 public:
  explicit FakeRdmaAcceptor(GrantLog* log) : log_(log) {}
  absl::StatusOr<std::pair<std::unique_ptr<RdmaConnection>, std::string>>
  Accept(absl::string_view client_info) override {
    if (client_info != "client-qp") {
      return absl::InvalidArgumentError("bad queue-pair description");
    }
    return std::make_pair(
        std::unique_ptr<RdmaConnection>(new FakeRdmaConnection(log_)),
        std::string("node-qp"));
  }

 private:
  GrantLog* const log_;
};

std::vector<wire::AreaRef> Refs(const Reply& r) {
  std::vector<wire::AreaRef> out;
  for (size_t i = 0; i * wire::kAreaRefBytes < r.payload.size(); ++i) {
    out.push_back(wire::DecodeAreaRef(reinterpret_cast<const uint8_t*>(
        r.payload.data() + i * wire::kAreaRefBytes)));
  }
  return out;
}

// A DRAM device, its extent table and KV manager, and a data server whose
// RDMA grants go to a FakeRdmaAcceptor that records them in `log`.
struct RdmaRig {
  RdmaRig() {
    auto dev = Fixture::MakeDram();
    log.device = dev.get();
    device = std::move(dev);
    ExtentTableOptions to;
    to.regions = device->Regions();
    extents = std::move(*ExtentTable::Create(to));
    KvManagerOptions ko;
    ko.device = device.get();
    ko.extents = extents.get();
    kv = std::move(*KvManager::Create(ko));
    log.kv = kv.get();
    DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.rdma = &acceptor;
    o.capabilities = TestCapabilities::Get().verifier();
    server = std::move(*DataServer::Create(o));
  }

  GrantLog log;
  FakeRdmaAcceptor acceptor{&log};
  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<DataServer> server;  // last: stopped first
};

// Writes the two objects the RDMA test acquires ((0, 5000) and (8192,
// 3000)), then connects the connection's RDMA plane.
void WriteTwoAndConnectRdma(int fd) {
  Reply w = Write(fd, {Op(0, 5000, 1), Op(8192, 3000, 2)},
                  {std::string(5000, 'a'), std::string(3000, 'b')});
  REQUIRE(Code(w.ops[0]) == absl::StatusCode::kOk);
  REQUIRE(Code(w.ops[1]) == absl::StatusCode::kOk);
  SendFrame(fd, FrameType::kRdmaConnectRequest, 2, {Op(0, 5000, 1)},
            "client-qp", 9);
  auto conn = ReadReply(fd);
  REQUIRE(conn.ok());
  REQUIRE(conn->h.type == FrameType::kRdmaConnectResponse);
  CHECK(conn->payload == "node-qp");
}

TEST_CASE("RDMA: each acquire and write reservation grants exactly its "
          "object, revoked before its hold ends") {
  RdmaRig rig;
  GrantLog& log = rig.log;
  MemoryDevice* const device = rig.device.get();
  KvManager* const kv = rig.kv.get();
  const MemoryArea area = device->Areas()[0];
  auto at = [&](const wire::AreaRef& r) {
    return reinterpret_cast<uintptr_t>(area.base) + r.offset;
  };

  auto sock =
      ConnectTcp("127.0.0.1:" + std::to_string(rig.server->port()), Soon());
  REQUIRE(sock.ok());
  const int fd = sock->fd();
  WriteTwoAndConnectRdma(fd);

  // Acquire both: one read grant each, over exactly the object, its key in
  // the AreaRef.
  Reply acq = SessionFrame(fd, FrameType::kAcquireRequest, 0,
                           {Op(0, 5000, 1), Op(8192, 3000, 2)});
  REQUIRE(Code(acq.ops[0]) == absl::StatusCode::kOk);
  REQUIRE(Code(acq.ops[1]) == absl::StatusCode::kOk);
  std::vector<wire::AreaRef> refs = Refs(acq);
  REQUIRE(refs.size() == 2);
  {
    MutexLock l(&log.mu);
    REQUIRE(log.open.size() == 2);
    for (int i = 0; i < 2; ++i) {
      REQUIRE(log.open.count(refs[i].rkey) == 1);
      const GrantLog::Grant& g = log.open[refs[i].rkey];
      CHECK(g.data == at(refs[i]));
      CHECK(g.length == acq.ops[i].length);
      CHECK_FALSE(g.write);
    }
  }
  // Acquired again on the connection: the same hold, the same key.
  Reply again = SessionFrame(fd, FrameType::kAcquireRequest, 0, {Op(0, 5000, 1)});
  REQUIRE(Code(again.ops[0]) == absl::StatusCode::kOk);
  CHECK(Refs(again)[0].rkey == refs[0].rkey);
  {
    MutexLock l(&log.mu);
    CHECK(log.open.size() == 2);
  }

  // Release the first: its grant is revoked while it is still held.
  Reply rel = SessionFrame(fd, FrameType::kReleaseRequest, 0, {Op(0, 5000, 1)});
  CHECK(Code(rel.ops[0]) == absl::StatusCode::kOk);
  {
    MutexLock l(&log.mu);
    REQUIRE(log.revoked.size() == 1);
    CHECK(log.revoked[0] == refs[0].rkey);
    CHECK(log.at_revoke[0].first == 2);  // both objects still acquired
  }
  CHECK(kv->Stats().staging_objects == 1);

  // A grant that fails: the object is not held either.
  {
    MutexLock l(&log.mu);
    log.fail_next_grant = true;
  }
  Reply failed = SessionFrame(fd, FrameType::kAcquireRequest, 0, {Op(0, 5000, 1)});
  CHECK(Code(failed.ops[0]) == absl::StatusCode::kResourceExhausted);
  CHECK(Refs(failed)[0].rkey == 0);
  CHECK(kv->Stats().staging_objects == 1);

  // A write reservation: a write-only grant of exactly the destination,
  // revoked before the commit.
  SendFrame(fd, FrameType::kWriteBeginRequest, 20, {Op(65536, 4096, 3)}, "", 0);
  auto begun = ReadReply(fd);
  REQUIRE(begun.ok());
  REQUIRE(Code(begun->ops[0]) == absl::StatusCode::kOk);
  const wire::AreaRef wref = Refs(*begun)[0];
  const uint64_t writes_before = device->Stats().writes;
  {
    MutexLock l(&log.mu);
    REQUIRE(log.open.count(wref.rkey) == 1);
    CHECK(log.open[wref.rkey].write);
    CHECK(log.open[wref.rkey].data == at(wref));
    CHECK(log.open[wref.rkey].length == 4096);
  }
  SendFrame(fd, FrameType::kWriteCommitRequest, 21, {Op(65536, 4096, 3)}, "", 0);
  auto committed = ReadReply(fd);
  REQUIRE(committed.ok());
  CHECK(Code(committed->ops[0]) == absl::StatusCode::kOk);
  CHECK(device->Stats().writes == writes_before + 1);
  {
    MutexLock l(&log.mu);
    REQUIRE(log.revoked.size() == 2);
    CHECK(log.revoked[1] == wref.rkey);
    CHECK(log.at_revoke[1].second == writes_before);  // not committed yet
  }

  // A failed write grant aborts the reservation.
  {
    MutexLock l(&log.mu);
    log.fail_next_grant = true;
  }
  SendFrame(fd, FrameType::kWriteBeginRequest, 22, {Op(131072, 4096, 4)}, "", 0);
  auto refused = ReadReply(fd);
  REQUIRE(refused.ok());
  CHECK(Code(refused->ops[0]) == absl::StatusCode::kResourceExhausted);
  SendFrame(fd, FrameType::kWriteCommitRequest, 23, {Op(131072, 4096, 4)}, "", 0);
  auto none = ReadReply(fd);
  REQUIRE(none.ok());
  CHECK(Code(none->ops[0]) == absl::StatusCode::kNotFound);

  // Closing the connection: the remaining grant ends before the hold does.
  sock->Close();
  CHECK(Eventually([&] {
    MutexLock l(&log.mu);
    return log.connection_closed;
  }));
  CHECK(Eventually([&] { return kv->Stats().staging_objects == 0; }));
  MutexLock l(&log.mu);
  CHECK(log.open.empty());
  CHECK(log.reads_at_close == 1);
  CHECK(log.revoked.size() == 3);
  CHECK(log.bad_revokes == 0);
}

}  // namespace
}  // namespace hymcache::storage
