// TcpTransport against the real data server (DRAM device + extent table) on
// loopback: frames split past kMaxOps and max_read_frame_bytes, per-op
// errors stay per op, pooled connections closed by the server are replaced,
// and a dead peer fails fast.
#include "client/tcp_transport.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/wire.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/dataplane/extent_table.h"
#include "tests/signing_transport.h"

namespace hymcache {
namespace {

struct Server {
  std::unique_ptr<storage::DramDevice> device;
  std::unique_ptr<storage::ExtentTable> extents;
  std::unique_ptr<storage::DataServer> server;
  PeerInfo peer;

  explicit Server(absl::Duration idle = absl::Seconds(60)) {
    storage::DramDeviceOptions d;
    d.capacity_bytes = 64 << 20;
    d.huge_pages = false;
    auto dev = storage::DramDevice::Create(d);
    REQUIRE(dev.ok());
    device = std::move(*dev);
    storage::ExtentTableOptions e;
    e.regions = device->Regions();
    auto ext = storage::ExtentTable::Create(e);
    REQUIRE(ext.ok());
    extents = std::move(*ext);
    storage::DataServerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.capabilities = TestCapabilities::Get().verifier();
    o.idle_timeout = idle;
    auto s = storage::DataServer::Create(o);
    REQUIRE(s.ok());
    server = std::move(*s);
    peer.node_id = 1;
    peer.data_address = absl::StrCat("127.0.0.1:", server->port());
  }
};

TEST_CASE("batches larger than one frame round-trip; errors stay per op") {
  Server s;
  auto t = Signed(NewTcpTransport({}));
  constexpr size_t kOps = 2500;  // three frames
  constexpr size_t kLen = 1000;
  std::vector<uint8_t> src(kOps * kLen);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + i / kLen);
  std::vector<WriteOp> w;
  for (size_t i = 0; i < kOps; ++i) {
    w.push_back({{0, i * 4096, kLen, i + 1}, &src[i * kLen]});
  }
  auto ws = t->Write(s.peer, w, absl::Now() + absl::Seconds(30));
  for (size_t i = 0; i < kOps; ++i) REQUIRE(ws[i].ok());

  std::vector<uint8_t> dst(kOps * kLen, 0);
  std::vector<ReadOp> r;
  for (size_t i = 0; i < kOps; ++i) {
    r.push_back({{0, i * 4096, kLen, i + 1}, &dst[i * kLen]});
  }
  r[1500].src.generation = 99999;  // not the generation that was written
  auto rs = t->Read(s.peer, r, absl::Now() + absl::Seconds(30));
  for (size_t i = 0; i < kOps; ++i) {
    INFO("op " << i);
    if (i == 1500) {
      CHECK(rs[i].code() == absl::StatusCode::kNotFound);
      continue;
    }
    REQUIRE(rs[i].ok());
    REQUIRE(std::memcmp(&dst[i * kLen], &src[i * kLen], kLen) == 0);
  }
  // The untouched op's buffer was never written.
  for (size_t k = 0; k < kLen; ++k) REQUIRE(dst[1500 * kLen + k] == 0);
}

TEST_CASE("reads past max_read_frame_bytes split by bytes; errors stay per op") {
  Server s;
  TcpTransportOptions o;
  o.max_read_frame_bytes = 10000;
  auto t = Signed(NewTcpTransport(o));
  // 4000-byte ops two to a frame, and a 25000-byte op over the bound alone.
  std::vector<uint64_t> lens = {4000, 4000, 4000, 25000, 4000, 4000, 4000};
  std::vector<uint64_t> addr;
  uint64_t next = 0;
  for (uint64_t len : lens) {
    addr.push_back(next);
    next += (len + 4095) / 4096 * 4096;
  }
  std::vector<std::vector<uint8_t>> src;
  std::vector<WriteOp> w;
  for (size_t i = 0; i < lens.size(); ++i) {
    src.emplace_back(lens[i]);
    for (size_t k = 0; k < lens[i]; ++k) src[i][k] = static_cast<uint8_t>(i * 31 + k);
    w.push_back({{0, addr[i], lens[i], i + 1}, src[i].data()});
  }
  auto ws = t->Write(s.peer, w, absl::Now() + absl::Seconds(30));
  for (const auto& st : ws) REQUIRE(st.ok());

  std::vector<std::vector<uint8_t>> dst;
  std::vector<ReadOp> r;
  for (size_t i = 0; i < lens.size(); ++i) {
    dst.emplace_back(lens[i], 0);
    r.push_back({{0, addr[i], lens[i], i + 1}, dst[i].data()});
  }
  r[4].src.generation = 99999;  // not the generation that was written
  auto rs = t->Read(s.peer, r, absl::Now() + absl::Seconds(30));
  for (size_t i = 0; i < lens.size(); ++i) {
    INFO("op " << i);
    if (i == 4) {
      CHECK(rs[i].code() == absl::StatusCode::kNotFound);
      CHECK(dst[i] == std::vector<uint8_t>(lens[i], 0));
      continue;
    }
    REQUIRE(rs[i].ok());
    CHECK(dst[i] == src[i]);
  }
  CHECK(s.server->Stats().read_ops == lens.size() - 1);
  CHECK(s.server->Stats().accepted_connections == 1);  // in turn, one connection
}

TEST_CASE("a pooled connection the server closed while idle is replaced") {
  Server s(absl::Milliseconds(100));
  auto t = Signed(NewTcpTransport({}));
  std::vector<uint8_t> a(5000, 'a'), b(5000);
  std::vector<WriteOp> w = {{{0, 0, a.size(), 1}, a.data()}};
  REQUIRE(t->Write(s.peer, w, absl::Now() + absl::Seconds(5))[0].ok());
  absl::SleepFor(absl::Milliseconds(400));  // the server drops the idle connection
  std::vector<ReadOp> r = {{{0, 0, b.size(), 1}, b.data()}};
  auto st = t->Read(s.peer, r, absl::Now() + absl::Seconds(5));
  REQUIRE(st[0].ok());
  CHECK(a == b);
}

TEST_CASE("a dead peer fails every op fast") {
  PeerInfo dead;
  {
    Server s;
    dead = s.peer;
  }  // server gone; its port is closed
  auto t = Signed(NewTcpTransport({}));
  std::vector<uint8_t> b(100);
  std::vector<ReadOp> r(3, ReadOp{{0, 0, 100, 1}, b.data()});
  absl::Time start = absl::Now();
  auto st = t->Read(dead, r, absl::Now() + absl::Seconds(10));
  CHECK(absl::Now() - start < absl::Seconds(5));
  for (const auto& x : st) CHECK(x.code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hymcache
