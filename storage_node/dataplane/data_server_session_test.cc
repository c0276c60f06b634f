// DataServer: prefetch sessions, think-time hints, and RDMA grants (a fake
// queue pair records what the server grants and revokes).
#include "storage_node/dataplane/data_server.h"

#include "storage_node/dataplane/data_server_test_util.h"

namespace hymcache::storage::data_server_test {
namespace {

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
      &io, kTierCap, std::vector<DurableExtent>{{0, kObj, 1}, {kObj, kObj, 2}});
  auto dev = HybridDevice::Create(ho, std::move(tier));
  REQUIRE(dev.ok());
  SessionFixture f(std::move(*dev));
  for (const RecoveredExtent& x : f.device->RecoveredExtents()) {
    auto t =
        f.extents->BeginWrite({x.region_id, x.addr, x.length, x.generation});
    REQUIRE(t.ok());
    REQUIRE(t->Commit().ok());
  }
  Socket s = f.Connect();
  Reply p =
      SessionFrame(s.fd(), FrameType::kPrefetchRequest, 3, {Op(0, kObj, 1)});
  REQUIRE(Code(p.ops[0]) == absl::StatusCode::kOk);
  // Object a is staged; b's staging is stuck (the disk is paused).
  auto* hybrid = static_cast<HybridDevice*>(f.device.get());
  REQUIRE(
      Eventually([&] { return hybrid->HybridStats().refill_bytes >= kObj; }));
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

// Found by //storage_node/dataplane:data_server_fuzz: a write overlapping what
// the same connection holds (a write it began, an object it acquired) waited
// the extent table's drain timeout (5 s) per op for a hold that only this
// connection's own thread could end.
TEST_CASE("a write over this connection's own holds is refused at once") {
  DataServerOptions o;
  o.io_timeout = absl::Seconds(30);
  Fixture f(o);
  Socket s = f.Connect();
  SendFrame(s.fd(), FrameType::kWriteBeginRequest, 1, {Op(0, 8192, 11)}, "", 0);
  auto begun = ReadReply(s.fd());
  REQUIRE(begun.ok());
  REQUIRE(begun->ops[0].status == 0);
  const absl::Time start = absl::Now();
  // Overlapping at a higher generation: as a direct write, then over TCP.
  SendFrame(s.fd(), FrameType::kWriteBeginRequest, 2, {Op(4096, 8192, 12)}, "",
            0);
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

TEST_CASE(
    "RDMA: each acquire and write reservation grants exactly its "
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
  Reply again =
      SessionFrame(fd, FrameType::kAcquireRequest, 0, {Op(0, 5000, 1)});
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
  Reply failed =
      SessionFrame(fd, FrameType::kAcquireRequest, 0, {Op(0, 5000, 1)});
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
  SendFrame(fd, FrameType::kWriteCommitRequest, 21, {Op(65536, 4096, 3)}, "",
            0);
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
  SendFrame(fd, FrameType::kWriteBeginRequest, 22, {Op(131072, 4096, 4)}, "",
            0);
  auto refused = ReadReply(fd);
  REQUIRE(refused.ok());
  CHECK(Code(refused->ops[0]) == absl::StatusCode::kResourceExhausted);
  SendFrame(fd, FrameType::kWriteCommitRequest, 23, {Op(131072, 4096, 4)}, "",
            0);
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
}  // namespace hymcache::storage::data_server_test
