// The one-sided transport over same-host shared memory against the real data
// server (DRAM and hybrid devices, extent table, prefetch manager) on
// loopback: direct writes and reads byte for byte, per-op errors, prefetch
// sessions, holds released, and the choice between shared memory and TCP.
#include "client/direct_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tcp_transport.h"
#include "common/eventually.h"
#include "common/fd_passing.h"
#include "common/net.h"
#include "common/transport_params.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/device/dram_device.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/device/fake_block_io.h"
#include "storage_node/device/hybrid_device.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/dataplane/local_data_plane.h"
#include "storage_node/dataplane/shm_export.h"
#include "tests/signing_transport.h"

namespace hymcache {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// A read's release reaches the node with the connection's next exchange or
// shortly after the read returns: the checks wait for it (Eventually).
using testing::Eventually;

struct Server {
  std::unique_ptr<storage::FakeBlockIo> io;  // hybrid only; outlives plane
  std::unique_ptr<storage::LocalDataPlane> plane;
  // Shortcuts into `plane`.
  storage::MemoryDevice* device;
  storage::ExtentTable* extents;
  storage::KvManager* kv;
  storage::DataServer* server;
  storage::ShmExport* shm_export;
  PeerInfo peer;

  explicit Server(std::unique_ptr<storage::MemoryDevice> dev,
                  std::unique_ptr<storage::FakeBlockIo> fake_io = nullptr)
      : io(std::move(fake_io)),
        plane(std::make_unique<storage::LocalDataPlane>(std::move(dev))),
        device(plane->device.get()),
        extents(plane->extents.get()),
        kv(plane->kv.get()),
        server(plane->server.get()),
        shm_export(plane->shm_export.get()) {
    peer.node_id = 1;
    peer.data_address = plane->data_address();
    for (auto& [k, v] : plane->transport_params()) peer.params[k] = v;
  }

  static Server Dram() {
    storage::DramDeviceOptions d;
    d.capacity_bytes = 64 << 20;
    d.huge_pages = false;
    return Server(std::move(*storage::DramDevice::Create(d)));
  }
};

std::vector<uint8_t> Pattern(size_t len, uint64_t seed) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) {
    v[i] = static_cast<uint8_t>((i * 131 + seed * 7919) ^ (i >> 9));
  }
  return v;
}

TEST_CASE("shared memory: direct writes and reads round-trip byte for byte") {
  Server s = Server::Dram();
  REQUIRE_FALSE(s.device->Areas().empty());
  auto t = Signed(NewDirectTransport(NewShmMover(), {}));
  REQUIRE(t->CanReach(s.peer).ok());

  constexpr size_t kOps = 1500;  // two frames
  constexpr size_t kLen = 10000;
  std::vector<std::vector<uint8_t>> src;
  std::vector<WriteOp> w;
  for (size_t i = 0; i < kOps; ++i) src.push_back(Pattern(kLen, i));
  for (size_t i = 0; i < kOps; ++i) {
    w.push_back({{0, i * 16384, kLen, i + 1}, src[i].data()});
  }
  auto ws = t->Write(s.peer, w, Soon());
  for (size_t i = 0; i < kOps; ++i) REQUIRE(ws[i].ok());
  // The mapping is read-only: writes went over TCP.
  CHECK(s.server->Stats().direct_write_ops == 0);
  CHECK(s.server->Stats().write_ops == kOps);

  std::vector<std::vector<uint8_t>> dst(kOps, std::vector<uint8_t>(kLen, 0));
  std::vector<ReadOp> r;
  for (size_t i = 0; i < kOps; ++i) {
    r.push_back({{0, i * 16384, kLen, i + 1}, dst[i].data()});
  }
  r[700].src.generation = 99999;  // stale
  auto rs = t->Read(s.peer, r, Soon());
  for (size_t i = 0; i < kOps; ++i) {
    INFO("op " << i);
    if (i == 700) {
      CHECK(rs[i].code() == absl::StatusCode::kNotFound);
      CHECK(dst[i] == std::vector<uint8_t>(kLen, 0));
      continue;
    }
    REQUIRE(rs[i].ok());
    REQUIRE(dst[i] == src[i]);
  }
  CHECK(s.server->Stats().direct_acquired_ops == kOps - 1);
  // Every hold ends: nothing pinned, no session left.
  CHECK(Eventually([&] { return s.extents->Stats().pinned_reads == 0; }));
  CHECK(Eventually([&] { return s.kv->Stats().sessions == 0; }));

  // A write over a reused range with a stale generation is refused and
  // changes nothing readable.
  std::vector<uint8_t> junk = Pattern(kLen, 4242);
  auto stale = t->Write(s.peer, {{{0, 0, kLen, 1}, junk.data()}}, Soon());
  CHECK(stale[0].code() == absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> back(kLen);
  auto again = t->Read(s.peer, {{{0, 0, kLen, 1}, back.data()}}, Soon());
  REQUIRE(again[0].ok());
  CHECK(back == src[0]);
}

TEST_CASE("shared memory: prefetch sessions serve direct reads") {
  Server s = Server::Dram();
  auto t = Signed(NewDirectTransport(NewShmMover(), {}));
  std::vector<uint8_t> a = Pattern(1 << 20, 1), b = Pattern(1 << 20, 2);
  auto ws = t->Write(s.peer,
                     {{{0, 0, a.size(), 1}, a.data()},
                      {{0, 1 << 20, b.size(), 2}, b.data()}},
                     Soon());
  REQUIRE(ws[0].ok());
  REQUIRE(ws[1].ok());
  const uint64_t session = 0xabcdef;
  std::vector<RemoteRef> refs = {{0, 0, a.size(), 1}, {0, 1 << 20, b.size(), 2}};
  auto ps = t->Prefetch(s.peer, session, refs, Soon());
  CHECK(ps[0].ok());
  CHECK(ps[1].ok());
  CHECK(s.kv->Stats().staging_objects == 2);
  std::vector<uint8_t> x(a.size()), y(b.size());
  auto rs = t->ReadSession(s.peer, session,
                           {{refs[0], x.data()}, {refs[1], y.data()}}, Soon());
  REQUIRE(rs[0].ok());
  REQUIRE(rs[1].ok());
  CHECK(x == a);
  CHECK(y == b);
  // Read and released: the session is gone.
  CHECK(Eventually([&] { return s.kv->Stats().sessions == 0; }));
  CHECK(s.kv->Stats().staged_reads == 2);
}

TEST_CASE("shared memory over the hybrid device's window and write buffer") {
  constexpr uint64_t kCap = 16 << 20;
  auto io = std::make_unique<storage::FakeBlockIo>(
      storage::CapacityTier::kHeaderBytes + kCap);
  storage::HybridDeviceOptions ho;
  ho.staging_bytes = 2 << 20;
  ho.write_buffer_bytes = 2 << 20;
  ho.io_chunk_bytes = 256 << 10;
  auto tier = std::make_unique<storage::FakeCapacityTier>(io.get(), kCap);
  auto dev = storage::HybridDevice::Create(ho, std::move(tier));
  REQUIRE(dev.ok());
  Server s(std::move(*dev), std::move(io));
  auto t = Signed(NewDirectTransport(NewShmMover(), {}));
  // 8 MiB through a 2 MiB write buffer: write in small batches, retrying
  // refusals while the flusher drains.
  constexpr size_t kObj = 512 << 10;
  constexpr size_t kN = 16;
  std::vector<std::vector<uint8_t>> src;
  for (size_t i = 0; i < kN; ++i) src.push_back(Pattern(kObj, 100 + i));
  size_t refused = 0;
  for (size_t i = 0; i < kN; ++i) {
    const bool written = Eventually([&] {
      auto ws = t->Write(s.peer, {{{0, i * kObj, kObj, i + 1}, src[i].data()}},
                         Soon());
      if (ws[0].ok()) return true;
      REQUIRE(ws[0].code() == absl::StatusCode::kResourceExhausted);
      ++refused;
      return false;
    });
    REQUIRE(written);
  }
  INFO("refused " << refused);
  // Read everything back (most from the tier through the 2 MiB window).
  std::vector<std::vector<uint8_t>> dst(kN, std::vector<uint8_t>(kObj));
  std::vector<ReadOp> r;
  for (size_t i = 0; i < kN; ++i) {
    r.push_back({{0, i * kObj, kObj, i + 1}, dst[i].data()});
  }
  auto rs = t->Read(s.peer, r, Soon());
  for (size_t i = 0; i < kN; ++i) {
    INFO("object " << i << ": " << rs[i].ToString());
    REQUIRE(rs[i].ok());
    REQUIRE(dst[i] == src[i]);
  }
  CHECK(Eventually([&] { return s.kv->Stats().sessions == 0; }));
  CHECK(Eventually([&] { return s.extents->Stats().pinned_reads == 0; }));
}

TEST_CASE("shared memory is used only for nodes on this host") {
  Server s = Server::Dram();
  PeerInfo remote = s.peer;
  remote.params[kShmHostParam] = "another-host/0000";
  auto shm = Signed(NewDirectTransport(NewShmMover(), {}));
  CHECK(shm->CanReach(remote).code() == absl::StatusCode::kUnavailable);
  PeerInfo bare = s.peer;
  bare.params.clear();
  CHECK(shm->CanReach(bare).code() == absl::StatusCode::kUnavailable);

  // The auto choice: shared memory where possible, TCP otherwise.
  std::vector<std::unique_ptr<Transport>> c;
  c.push_back(Signed(NewDirectTransport(NewShmMover(), {})));
  c.push_back(Signed(NewTcpTransport({})));
  auto t = NewFirstReachableTransport(std::move(c));
  std::vector<uint8_t> a = Pattern(4096, 9);
  REQUIRE(t->Write(s.peer, {{{0, 0, a.size(), 1}, a.data()}}, Soon())[0].ok());
  std::vector<uint8_t> x(a.size());
  REQUIRE(t->Read(s.peer, {{{0, 0, a.size(), 1}, x.data()}}, Soon())[0].ok());
  CHECK(s.server->Stats().direct_acquired_ops == 1);  // shared memory served it
  CHECK(s.server->Stats().shm_bytes_read == a.size());
  CHECK(s.server->Stats().rdma_bytes_read == 0);
  std::fill(x.begin(), x.end(), 0);
  REQUIRE(t->Read(remote, {{{0, 0, a.size(), 1}, x.data()}}, Soon())[0].ok());
  CHECK(x == a);
  CHECK(s.server->Stats().direct_acquired_ops == 1);  // TCP served this one
  CHECK(s.server->Stats().read_ops == 1);
  CHECK(s.server->Stats().bytes_read == a.size());

  // Shared memory only: a node elsewhere is unreachable, not a crash.
  std::vector<std::unique_ptr<Transport>> only;
  only.push_back(Signed(NewDirectTransport(NewShmMover(), {})));
  auto strict = NewFirstReachableTransport(std::move(only));
  auto rs = strict->Read(remote, {{{0, 0, a.size(), 1}, x.data()}}, Soon());
  CHECK(rs[0].code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("shared memory is handed out read-only, and only to allowed users") {
  Server s = Server::Dram();
  std::vector<uint8_t> a = Pattern(4096, 3);
  auto tcp = Signed(NewTcpTransport({}));
  REQUIRE(tcp->Write(s.peer, {{{0, 0, a.size(), 1}, a.data()}}, Soon())[0].ok());

  // What a client receives: read-only descriptors. Mapping one writable
  // fails; mapping it read-only shows the node's bytes.
  auto sock = ConnectUnixAbstract(s.shm_export->socket_name(), Soon());
  REQUIRE(sock.ok());
  std::string payload;
  std::vector<int> fds;
  REQUIRE(RecvWithFds(sock->fd(), &payload, &fds, Soon()).ok());
  REQUIRE(fds.size() == s.device->Areas().size());
  for (int fd : fds) {
    CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
    CHECK(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) ==
          MAP_FAILED);
  }
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fds[0], 0);
  REQUIRE(ro != MAP_FAILED);
  CHECK(std::memcmp(ro, a.data(), a.size()) == 0);
  munmap(ro, 4096);
  for (int fd : fds) close(fd);
  CHECK(Eventually([&] { return s.shm_export->served() == 1; }));

  // A user the node does not allow gets nothing: the transport reports it.
  storage::ShmExportOptions so;
  so.areas = s.device->Areas();
  so.allow_own_user = false;
  so.allow_root = false;
  auto strict = std::move(*storage::ShmExport::Create(so));
  PeerInfo peer = s.peer;
  for (auto& [k, v] : strict->TransportParams()) peer.params[k] = v;
  auto t = Signed(NewDirectTransport(NewShmMover(), {}));
  std::vector<uint8_t> x(a.size());
  auto rs = t->Read(peer, {{{0, 0, a.size(), 1}, x.data()}}, Soon());
  CHECK(rs[0].code() == absl::StatusCode::kPermissionDenied);
  CHECK(x == std::vector<uint8_t>(a.size(), 0));
  CHECK(Eventually([&] { return strict->refused() == 1; }));
}

TEST_CASE("a dead node fails direct transfers with Unavailable") {
  auto t = Signed(NewDirectTransport(NewShmMover(), {}));
  PeerInfo peer;
  {
    Server s = Server::Dram();
    peer = s.peer;
    std::vector<uint8_t> a = Pattern(4096, 9);
    REQUIRE(t->Write(peer, {{{0, 0, a.size(), 1}, a.data()}}, Soon())[0].ok());
  }
  std::vector<uint8_t> x(4096);
  auto rs = t->Read(peer, {{{0, 0, 4096, 1}, x.data()}},
                    absl::Now() + absl::Seconds(5));
  CHECK_FALSE(rs[0].ok());
  CHECK(x == std::vector<uint8_t>(4096, 0));
}

}  // namespace
}  // namespace hymcache
