// What the DataServer tests share (data_server_test.cc: frames, limits and
// shutdown; data_server_session_test.cc: prefetch sessions, hints and RDMA
// grants): a server over a DRAM device on loopback, and frames sent and read
// by hand.
#pragma once

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
#include "storage_node/dataplane/data_server.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/fake_memory_device.h"
#include "storage_node/device/hybrid_device.h"

namespace hymcache::storage::data_server_test {

using testing::Eventually;
using wire::FrameType;
using wire::OpDesc;

inline constexpr uint64_t kCap = 4 << 20;
inline constexpr uint32_t kRegion = 0;

struct Reply {
  wire::FrameHeader h;
  std::vector<OpDesc> ops;
  std::string payload;
};

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

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
inline void AppendCapabilities(FrameType type, const std::vector<OpDesc>& ops,
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

inline void SendFrame(int fd, FrameType type, uint64_t id,
                      const std::vector<OpDesc>& ops,
                      const std::string& payload, uint64_t payload_bytes) {
  std::vector<uint8_t> buf(wire::kHeaderBytes + ops.size() * wire::kOpBytes);
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = id;
  h.payload_bytes = payload_bytes;
  wire::EncodeHeader(h, buf.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i],
                   buf.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  AppendCapabilities(type, ops, &buf);
  buf.insert(buf.end(), payload.begin(), payload.end());
  REQUIRE(SendAll(fd, buf.data(), buf.size(), Soon()).ok());
}

inline absl::StatusOr<Reply> ReadReply(int fd) {
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

inline OpDesc Op(uint64_t addr, uint64_t len, uint64_t gen,
                 uint32_t region = kRegion) {
  OpDesc op;
  op.region_id = region;
  op.addr = addr;
  op.length = len;
  op.generation = gen;
  return op;
}

// Without Catch2 assertions: safe on any thread.
inline absl::StatusOr<Reply> Exchange(int fd, FrameType type,
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
    wire::EncodeOp(ops[i],
                   buf.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  AppendCapabilities(type, ops, &buf);
  buf.insert(buf.end(), payload.begin(), payload.end());
  absl::Status s = SendAll(fd, buf.data(), buf.size(), Soon());
  if (!s.ok()) return s;
  return ReadReply(fd);
}

inline Reply Write(int fd, const std::vector<OpDesc>& ops,
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

inline Reply Read(int fd, const std::vector<OpDesc>& ops, uint64_t id = 9) {
  SendFrame(fd, FrameType::kReadRequest, id, ops, "", 0);
  auto r = ReadReply(fd);
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kReadResponse);
  CHECK(r->h.request_id == id);
  REQUIRE(r->ops.size() == ops.size());
  REQUIRE(wire::ValidateOps(r->h, r->ops).ok());
  return *r;
}

inline absl::StatusCode Code(const OpDesc& op) {
  return wire::FromWireCode(op.status);
}

// True once the server has closed `fd` (EOF or reset).
inline bool PeerClosed(int fd) {
  char c;
  absl::Status s = RecvAll(fd, &c, 1, Soon());
  return !s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded;
}

inline void Ping(Fixture& f) {
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kPing, 42, {}, "", 0);
  auto r = ReadReply(s.fd());
  REQUIRE(r.ok());
  CHECK(r->h.type == FrameType::kPong);
  CHECK(r->h.request_id == 42);
}

}  // namespace hymcache::storage::data_server_test
