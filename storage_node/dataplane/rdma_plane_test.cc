// RdmaPlane with a real DataServer and a real RDMA device (Soft-RoCE in the
// QEMU guest of tests/vmtest): what a client's queue pair can reach of the
// node's memory in each access mode. A client holding object A reads A byte
// for byte with the key its acquire answered, and nothing else: not object B
// with A's key, not A with the area's published key, not A after its
// release, not A with another connection's key; a write reservation's key
// writes its destination only, and only until the commit.
//
// Without a device the test checks that none is reported and stops, unless
// HYMCACHE_REQUIRE_RDMA=1 (set by tests/vmtest/check.sh) makes that a
// failure.
#include "storage_node/dataplane/rdma_plane.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "common/rdma.h"
#include "common/test_capabilities.h"
#include "common/transport_params.h"
#include "common/wire.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"

namespace hymcache::storage {
namespace {

using wire::FrameType;
using wire::OpDesc;

constexpr uint64_t kObj = 8192;

bool RequireRdma() {
  const char* v = std::getenv("HYMCACHE_REQUIRE_RDMA");
  return v != nullptr && std::string(v) == "1";
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

OpDesc Op(uint64_t index, uint64_t gen) {
  OpDesc op;
  op.addr = index * kObj;
  op.length = kObj;
  op.generation = gen;
  return op;
}

struct Reply {
  wire::FrameHeader h;
  std::vector<OpDesc> ops;
  std::string payload;
};

void Send(int fd, FrameType type, const std::vector<OpDesc>& ops,
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
  if (wire::CarriesCapabilities(type)) {
    for (OpDesc op : ops) {
      TestCapabilities::Get().SignOp(&op, TestCapabilities::RightsFor(type));
      uint8_t c[wire::kCapBytes];
      wire::EncodeCapability(op.cap, c);
      buf.insert(buf.end(), c, c + sizeof(c));
    }
  }
  buf.insert(buf.end(), payload.begin(), payload.end());
  REQUIRE(SendAll(fd, buf.data(), buf.size(), Soon()).ok());
}

Reply Recv(int fd) {
  uint8_t hdr[wire::kHeaderBytes];
  REQUIRE(RecvAll(fd, hdr, sizeof(hdr), Soon()).ok());
  auto h = wire::DecodeHeader(hdr);
  REQUIRE(h.ok());
  Reply r;
  r.h = *h;
  std::vector<uint8_t> table(h->op_count * wire::kOpBytes);
  if (!table.empty()) REQUIRE(RecvAll(fd, table.data(), table.size(), Soon()).ok());
  for (size_t i = 0; i < h->op_count; ++i) {
    r.ops.push_back(wire::DecodeOp(table.data() + i * wire::kOpBytes));
  }
  r.payload.resize(h->payload_bytes);
  if (!r.payload.empty()) {
    REQUIRE(RecvAll(fd, r.payload.data(), r.payload.size(), Soon()).ok());
  }
  return r;
}

Reply Exchange(int fd, FrameType type, const std::vector<OpDesc>& ops,
               const std::string& payload) {
  Send(fd, type, ops, payload);
  Reply r = Recv(fd);
  REQUIRE(r.h.type != FrameType::kError);
  return r;
}

const std::string kNoSession(wire::kSessionBytes, '\0');

// The node: a DRAM device, its data server, the plane.
struct Node {
  Node() {
    DramDeviceOptions d;
    d.capacity_bytes = 1 << 20;
    device = std::move(*DramDevice::Create(d));
    ExtentTableOptions to;
    to.regions = device->Regions();
    extents = std::move(*ExtentTable::Create(to));
    KvManagerOptions ko;
    ko.device = device.get();
    ko.extents = extents.get();
    kv = std::move(*KvManager::Create(ko));
    auto dev = rdma::Device::Open({});
    REQUIRE(dev.ok());
    auto p = RdmaPlane::Create(std::move(*dev), device->Areas());
    REQUIRE(p.ok());
    plane = std::move(*p);
    DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.rdma = plane.get();
    o.capabilities = TestCapabilities::Get().verifier();
    server = std::move(*DataServer::Create(o));
  }
  ~Node() { server.reset(); }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(server->port());
  }
  // The area's base address and published key.
  std::pair<uint64_t, uint32_t> Area() const {
    std::string list = plane->TransportParams().at(kRdmaAreasParam);
    std::vector<std::string> f = absl::StrSplit(list, ':');
    REQUIRE(f.size() == 4);
    uint64_t base = 0;
    uint32_t key = 0;
    REQUIRE(absl::SimpleAtoi(f[1], &base));
    REQUIRE(absl::SimpleAtoi(f[3], &key));
    return {base, key};
  }

  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<RdmaPlane> plane;
  std::unique_ptr<DataServer> server;
};

// A client: its own device handle, a registered buffer, and per
// connection a queue pair connected through kRdmaConnectRequest.
struct Client {
  Client() {
    auto d = rdma::Device::Open({});
    REQUIRE(d.ok());
    dev = std::move(*d);
    buf.assign(4 * kObj, 0);
    auto m = dev->Register(buf.data(), buf.size(), /*remote_write=*/false);
    REQUIRE(m.ok());
    mr = std::move(*m);
  }
  ~Client() { mr.reset(); }

  struct Conn {
    Socket sock;
    std::unique_ptr<rdma::QueuePair> qp;
  };
  Conn Connect(const Node& node) {
    auto s = ConnectTcp(node.address(), Soon());
    REQUIRE(s.ok());
    Conn c{std::move(*s), nullptr};
    auto qp = rdma::QueuePair::Create(dev.get(), {});
    REQUIRE(qp.ok());
    Reply r = Exchange(c.sock.fd(), FrameType::kRdmaConnectRequest, {Op(0, 1)},
                       (*qp)->local_info().Encode());
    REQUIRE(r.h.type == FrameType::kRdmaConnectResponse);
    auto info = rdma::QpInfo::Decode(r.payload);
    REQUIRE(info.ok());
    REQUIRE((*qp)->Connect(*info).ok());
    c.qp = std::move(*qp);
    return c;
  }
  // One RDMA READ or WRITE of object `index` (node address `base` +
  // offset) through `key`, with buf[0, kObj) as the local side.
  absl::Status Move(Conn& c, bool write, uint64_t base, uint64_t index,
                    uint32_t key) {
    rdma::OneSidedOp op{write ? rdma::OneSidedOp::Kind::kWrite
                              : rdma::OneSidedOp::Kind::kRead,
                        buf.data(), mr->lkey(), base + index * kObj, key,
                        static_cast<uint32_t>(kObj)};
    return c.qp->Execute({op}, Soon())[0];
  }

  std::unique_ptr<rdma::Device> dev;
  std::vector<uint8_t> buf;
  std::unique_ptr<rdma::MemoryRegion> mr;
};

// Acquires object `index` (generation `gen`) on `c`; its AreaRef.
wire::AreaRef Acquire(Client::Conn& c, uint64_t index, uint64_t gen) {
  Reply r = Exchange(c.sock.fd(), FrameType::kAcquireRequest, {Op(index, gen)},
                     kNoSession);
  REQUIRE(r.ops[0].status == 0);
  REQUIRE(r.payload.size() == wire::kAreaRefBytes);
  return wire::DecodeAreaRef(reinterpret_cast<const uint8_t*>(r.payload.data()));
}

std::string Tcp(const Node& node, uint64_t index, uint64_t gen) {
  auto s = ConnectTcp(node.address(), Soon());
  REQUIRE(s.ok());
  Reply r = Exchange(s->fd(), FrameType::kReadRequest, {Op(index, gen)}, "");
  REQUIRE(r.ops[0].status == 0);
  return r.payload;
}

void Check(RdmaAccess access, bool window_bounds) {
  Node node;
  if (access != node.plane->access()) {
    REQUIRE(node.plane->SetAccessForTest(access).ok());
  }
  INFO("access: " << RdmaAccessName(access));
  const auto [base, area_key] = node.Area();
  {
    auto s = ConnectTcp(node.address(), Soon());
    REQUIRE(s.ok());
    Reply w = Exchange(s->fd(), FrameType::kWriteRequest, {Op(0, 1), Op(1, 2)},
                       std::string(kObj, 'a') + std::string(kObj, 'b'));
    REQUIRE(w.ops[0].status == 0);
    REQUIRE(w.ops[1].status == 0);
  }
  const std::string a(kObj, 'a'), b(kObj, 'b');
  Client client;
  // Granted: A byte for byte with its key; the key is not the area's.
  Client::Conn c = client.Connect(node);
  const wire::AreaRef ref = Acquire(c, 0, 1);
  CHECK(base + ref.offset == base + 0);
  REQUIRE(ref.rkey != 0);
  REQUIRE(client.Move(c, false, base, 0, ref.rkey).ok());
  CHECK(std::memcmp(client.buf.data(), a.data(), kObj) == 0);
  if (access == RdmaAccess::kWholeArea) {
    // Trusted clients: the area's key reaches B too (what the other modes
    // prevent).
    CHECK(client.Move(c, false, base, 1, ref.rkey).ok());
    CHECK(std::memcmp(client.buf.data(), b.data(), kObj) == 0);
    return;
  }
  CHECK(area_key == 0);  // no whole-area key is published

  // Refused (each on a fresh connection: an access error breaks the
  // queue pair): B with A's key, unless the device does not confine windows
  // to their range; a WRITE with A's read key; A with the area's key.
  auto refused = [&](bool write, uint64_t index, bool use_area_key) {
    Client::Conn x = client.Connect(node);
    const wire::AreaRef r = Acquire(x, 0, 1);
    std::memset(client.buf.data(), 'X', kObj);
    return client.Move(x, write, base, index, use_area_key ? area_key : r.rkey);
  };
  absl::Status st = refused(false, 1, false);
  if (access == RdmaAccess::kWindows && !window_bounds) {
    WARN("this device's windows do not confine to their range: " << st);
    CHECK(st.ok());
  } else {
    CHECK(absl::IsPermissionDenied(st));
  }
  CHECK(absl::IsPermissionDenied(refused(true, 1, false)));
  CHECK(absl::IsPermissionDenied(refused(true, 0, false)));
  CHECK(absl::IsPermissionDenied(refused(false, 0, true)));
  CHECK(absl::IsPermissionDenied(refused(false, 1, true)));
  // A's key from another connection's queue pair.
  {
    Client::Conn other = client.Connect(node);
    CHECK(absl::IsPermissionDenied(client.Move(other, false, base, 0, ref.rkey)));
  }
  // Released: the key no longer works.
  Reply rel = Exchange(c.sock.fd(), FrameType::kReleaseRequest, {Op(0, 1)},
                       kNoSession);
  CHECK(rel.ops[0].status == 0);
  CHECK(absl::IsPermissionDenied(client.Move(c, false, base, 0, ref.rkey)));

  // A write reservation: its key writes the destination, byte for byte,
  // reads nothing, and stops working at the commit.
  Client::Conn wc = client.Connect(node);
  Reply begun = Exchange(wc.sock.fd(), FrameType::kWriteBeginRequest,
                         {Op(2, 3)}, "");
  REQUIRE(begun.ops[0].status == 0);
  const wire::AreaRef wref = wire::DecodeAreaRef(
      reinterpret_cast<const uint8_t*>(begun.payload.data()));
  REQUIRE(wref.rkey != 0);
  for (uint64_t i = 0; i < kObj; ++i) client.buf[i] = static_cast<uint8_t>(i * 7);
  const std::string c_bytes(client.buf.begin(), client.buf.begin() + kObj);
  REQUIRE(client.Move(wc, true, base, 2, wref.rkey).ok());
  Reply com = Exchange(wc.sock.fd(), FrameType::kWriteCommitRequest, {Op(2, 3)},
                       "");
  CHECK(com.ops[0].status == 0);
  CHECK(Tcp(node, 2, 3) == c_bytes);
  std::memset(client.buf.data(), 'Z', kObj);
  CHECK(absl::IsPermissionDenied(client.Move(wc, true, base, 2, wref.rkey)));
  CHECK(Tcp(node, 2, 3) == c_bytes);
  {
    Client::Conn r = client.Connect(node);
    Reply b2 = Exchange(r.sock.fd(), FrameType::kWriteBeginRequest, {Op(3, 4)},
                        "");
    REQUIRE(b2.ops[0].status == 0);
    const wire::AreaRef k = wire::DecodeAreaRef(
        reinterpret_cast<const uint8_t*>(b2.payload.data()));
    CHECK(absl::IsPermissionDenied(client.Move(r, false, base, 3, k.rkey)));
  }
  // Nothing the refused operations tried changed A or B.
  CHECK(Tcp(node, 0, 1) == a);
  CHECK(Tcp(node, 1, 2) == b);
}

TEST_CASE("RDMA: a client reaches exactly the objects it holds") {
  if (!rdma::Available().ok()) {
    REQUIRE_FALSE(RequireRdma());
    WARN("no RDMA device: " << rdma::Available());
    return;
  }
  auto dev = rdma::Device::Open({});
  REQUIRE(dev.ok());
  const bool windows = (*dev)->supports_windows();
  bool bounded = false;
  if (windows) {
    auto b = (*dev)->ProbeWindowBounds();
    REQUIRE(b.ok());
    bounded = *b;
  }
  dev->reset();
  SECTION("the mode the node picks") {
    Node node;
    CHECK(node.plane->access() == (bounded ? RdmaAccess::kWindows
                                           : RdmaAccess::kRegistrations));
  }
  SECTION("per-object registrations") {
    Check(RdmaAccess::kRegistrations, bounded);
  }
  SECTION("per-object memory windows") {
    if (!windows) return;
    Check(RdmaAccess::kWindows, bounded);
  }
  SECTION("whole-area keys (trusted clients)") {
    Check(RdmaAccess::kWholeArea, bounded);
  }
}

}  // namespace
}  // namespace hymcache::storage
