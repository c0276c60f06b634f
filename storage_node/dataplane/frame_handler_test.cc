// FrameHandler without sockets: requests in, response frames out, over a
// real DRAM device, extent table and KV manager.
#include "storage_node/dataplane/frame_handler.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "common/test_capabilities.h"
#include "common/wire.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/dataplane/kv_manager.h"
#include "storage_node/device/dram_device.h"

namespace hymcache::storage {
namespace {

using wire::FrameType;
using wire::OpDesc;

constexpr uint64_t kCap = 4 << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

OpDesc Op(uint64_t addr, uint64_t len, uint64_t gen) {
  OpDesc op;
  op.addr = addr;
  op.length = len;
  op.generation = gen;
  return op;
}

absl::StatusCode Code(const OpDesc& op) {
  return wire::FromWireCode(op.status);
}

// A request of `type`; each op without a capability of its own gets one
// TestCapabilities signs for the rights `type` needs.
Request Req(FrameType type, std::vector<OpDesc> ops, uint64_t session = 0,
            uint64_t id = 7) {
  Request r;
  r.header.type = type;
  r.header.request_id = id;
  r.header.op_count = static_cast<uint16_t>(ops.size());
  if (wire::CarriesCapabilities(type)) {
    for (OpDesc& op : ops) {
      if (op.cap.rights == 0) {
        TestCapabilities::Get().SignOp(&op, TestCapabilities::RightsFor(type));
      }
    }
  }
  r.ops = std::move(ops);
  r.session = session;
  return r;
}

// What a client decodes of a response.
struct Decoded {
  wire::FrameHeader h;
  std::vector<OpDesc> ops;
  std::string payload;
};

Decoded Decode(const Response& r) {
  const std::string bytes = r.Flatten();
  REQUIRE(bytes.size() >= wire::kHeaderBytes);
  auto h = wire::DecodeHeader(reinterpret_cast<const uint8_t*>(bytes.data()));
  REQUIRE(h.ok());
  Decoded d;
  d.h = *h;
  size_t at = wire::kHeaderBytes;
  for (size_t i = 0; i < h->op_count; ++i, at += wire::kOpBytes) {
    REQUIRE(at + wire::kOpBytes <= bytes.size());
    d.ops.push_back(
        wire::DecodeOp(reinterpret_cast<const uint8_t*>(bytes.data()) + at));
  }
  d.payload = bytes.substr(at);
  REQUIRE(d.payload.size() == h->payload_bytes);
  return d;
}

struct Fixture {
  explicit Fixture(bool with_kv = true,
                   absl::Duration drain = absl::Seconds(5)) {
    DramDeviceOptions d;
    d.capacity_bytes = kCap;
    auto dev = DramDevice::Create(d);
    REQUIRE(dev.ok());
    device = std::move(*dev);
    ExtentTableOptions to;
    to.regions = device->Regions();
    to.drain_timeout = drain;
    auto t = ExtentTable::Create(to);
    REQUIRE(t.ok());
    extents = std::move(*t);
    if (with_kv) {
      KvManagerOptions ko;
      ko.device = device.get();
      ko.extents = extents.get();
      auto k = KvManager::Create(ko);
      REQUIRE(k.ok());
      kv = std::move(*k);
    }
    FrameHandlerOptions o;
    o.device = device.get();
    o.extents = extents.get();
    o.kv = kv.get();
    o.capabilities = TestCapabilities::Get().verifier();
    o.counters = &counters;
    auto h = FrameHandler::Create(o);
    REQUIRE(h.ok());
    handler = std::move(*h);
  }
  ~Fixture() {
    handler->EndConnection(&cs);
    handler->EndConnection(&other);
  }

  // A kWriteRequest through the write stream; the ops' response.
  std::vector<OpDesc> Write(ConnState* c, std::vector<OpDesc> ops,
                            const std::vector<std::string>& bytes) {
    WriteStream w =
        handler->StartWrite(c, Req(FrameType::kWriteRequest, ops), Soon());
    REQUIRE(w.op_count() == bytes.size());
    for (size_t i = 0; i < w.op_count(); ++i) {
      REQUIRE(w.length(i) == bytes[i].size());
      uint8_t* dest = w.Begin(i);
      if (dest == nullptr) continue;  // refused: the bytes would be dropped
      std::memcpy(dest, bytes[i].data(), bytes[i].size());
      w.Commit(i);
    }
    Decoded d = Decode(w.Finish());
    CHECK(d.h.type == FrameType::kWriteResponse);
    return d.ops;
  }
  Decoded Read(ConnState* c, std::vector<OpDesc> ops, uint64_t session = 0) {
    Decoded d = Decode(handler->Handle(
        c, Req(FrameType::kReadRequest, std::move(ops), session), Soon()));
    CHECK(d.h.type == FrameType::kReadResponse);
    return d;
  }

  DataServerCounters counters;
  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<ExtentTable> extents;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<FrameHandler> handler;
  ConnState cs;     // the connection under test
  ConnState other;  // another connection
};

TEST_CASE("FrameHandler: Create validates its options") {
  FrameHandlerOptions o;
  CHECK(FrameHandler::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("FrameHandler answers a ping") {
  Fixture f;
  Request ping;
  ping.header.type = FrameType::kPing;
  ping.header.request_id = 42;
  Decoded p = Decode(f.handler->Handle(&f.cs, std::move(ping), Soon()));
  CHECK(p.h.type == FrameType::kPong);
  CHECK(p.h.request_id == 42);
}

TEST_CASE("FrameHandler: a read response points into device memory") {
  Fixture f;
  auto w = f.Write(&f.cs, {Op(0, 5, 1), Op(8192, 3, 2)}, {"hello", "abc"});
  REQUIRE(Code(w[0]) == absl::StatusCode::kOk);
  REQUIRE(Code(w[1]) == absl::StatusCode::kOk);
  CHECK(f.counters.Load().write_ops == 2);

  Response r = f.handler->Handle(
      &f.cs, Req(FrameType::kReadRequest, {Op(8192, 3, 2), Op(0, 5, 1)}),
      Soon());
  // Header + op table, then each object straight from the device's area (no
  // copy on the read path).
  REQUIRE(r.iov().size() == 3);
  const std::vector<MemoryArea> areas = f.device->Areas();
  for (size_t i = 1; i < r.iov().size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(r.iov()[i].iov_base);
    CHECK(LocateInAreas(areas, p, r.iov()[i].iov_len).ok());
  }
  Decoded d = Decode(r);
  CHECK(d.h.request_id == 7);
  CHECK(d.payload == "abchello");
  CHECK(f.counters.Load().read_ops == 2);
  CHECK(f.counters.Load().bytes_read == 8);
}

TEST_CASE("FrameHandler: reads of missing and stale objects are NotFound") {
  Fixture f;
  REQUIRE(Code(f.Write(&f.cs, {Op(0, 4, 5)}, {"data"})[0]) ==
          absl::StatusCode::kOk);
  Decoded d = f.Read(&f.cs, {Op(0, 4, 4), Op(0, 4, 5), Op(4096, 4, 5)});
  CHECK(Code(d.ops[0]) == absl::StatusCode::kNotFound);  // older generation
  CHECK(Code(d.ops[1]) == absl::StatusCode::kOk);
  CHECK(Code(d.ops[2]) == absl::StatusCode::kNotFound);  // never written
  CHECK(d.payload == "data");
  CHECK(f.counters.Load().stale_reads == 2);
  // Overwritten at a higher generation: the old one is gone.
  REQUIRE(Code(f.Write(&f.cs, {Op(0, 4, 6)}, {"newr"})[0]) ==
          absl::StatusCode::kOk);
  d = f.Read(&f.cs, {Op(0, 4, 5), Op(0, 4, 6)});
  CHECK(Code(d.ops[0]) == absl::StatusCode::kNotFound);
  CHECK(d.payload == "newr");
}

TEST_CASE("FrameHandler serves only ops their capabilities authorize") {
  Fixture f;
  REQUIRE(Code(f.Write(&f.cs, {Op(0, 4, 3)}, {"good"})[0]) ==
          absl::StatusCode::kOk);
  const TestCapabilities& caps = TestCapabilities::Get();
  OpDesc good = Op(0, 4, 3);
  OpDesc forged = good;
  caps.SignOp(&forged, wire::kCapRead);
  forged.cap.tag[0] ^= 1;
  OpDesc expired = good;
  expired.cap = caps.Sign(0, 0, 4, 3, wire::kCapRead,
                          -absl::Seconds(31));  // past the 30 s skew
  OpDesc write_cap = good;  // a write capability does not read
  caps.SignOp(&write_cap, wire::kCapWrite);
  OpDesc other_gen = good;  // signed for another generation
  other_gen.cap = caps.Sign(0, 0, 4, 4, wire::kCapRead);
  Decoded d = f.Read(&f.cs, {forged, good, expired, write_cap, other_gen});
  CHECK(Code(d.ops[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(d.ops[1]) == absl::StatusCode::kOk);
  CHECK(Code(d.ops[2]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(d.ops[3]) == absl::StatusCode::kPermissionDenied);
  CHECK(Code(d.ops[4]) == absl::StatusCode::kPermissionDenied);
  CHECK(d.payload == "good");
  CHECK(f.counters.Load().denied_ops == 4);

  // A write with a read capability: refused before any byte lands, and
  // the stored object is intact.
  OpDesc w = Op(0, 4, 9);
  caps.SignOp(&w, wire::kCapRead);
  auto wr = f.Write(&f.cs, {w}, {"evil"});
  CHECK(Code(wr[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(f.Read(&f.cs, {good}).payload == "good");

  // An acquire or a write reservation without a valid capability holds
  // nothing.
  Decoded a = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kAcquireRequest, {forged}), Soon()));
  CHECK(Code(a.ops[0]) == absl::StatusCode::kPermissionDenied);
  Decoded b = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteBeginRequest, {forged}), Soon()));
  CHECK(Code(b.ops[0]) == absl::StatusCode::kPermissionDenied);
  CHECK(f.cs.reads.empty());
  CHECK(f.cs.writes.empty());

  // Skipped checks (benchmarks): the forged one reads.
  f.handler->SetSkipCapabilityChecksForTest(true);
  CHECK(f.Read(&f.cs, {forged}).payload == "good");
}

TEST_CASE("FrameHandler: write begin, commit and abort") {
  Fixture f;
  const std::vector<MemoryArea> areas = f.device->Areas();
  auto begin = [&](std::vector<OpDesc> ops) {
    Decoded d = Decode(f.handler->Handle(
        &f.cs, Req(FrameType::kWriteBeginRequest, std::move(ops)), Soon()));
    CHECK(d.h.type == FrameType::kWriteBeginResponse);
    REQUIRE(d.payload.size() == d.ops.size() * wire::kAreaRefBytes);
    std::vector<wire::AreaRef> refs;
    for (size_t i = 0; i < d.ops.size(); ++i) {
      refs.push_back(wire::DecodeAreaRef(reinterpret_cast<const uint8_t*>(
          d.payload.data() + i * wire::kAreaRefBytes)));
    }
    return std::make_pair(d.ops, refs);
  };
  std::string receipts;  // of the last commit
  auto commit = [&](std::vector<OpDesc> ops) {
    Decoded d = Decode(f.handler->Handle(
        &f.cs, Req(FrameType::kWriteCommitRequest, std::move(ops)), Soon()));
    CHECK(d.h.type == FrameType::kWriteCommitResponse);
    receipts = d.payload;
    return d.ops;
  };
  auto place = [&](const wire::AreaRef& ref, const std::string& bytes) {
    for (const MemoryArea& a : areas) {
      if (a.area_id != ref.area) continue;
      REQUIRE(ref.offset + bytes.size() <= a.length);
      std::memcpy(a.base + ref.offset, bytes.data(), bytes.size());
      return;
    }
    FAIL("no such area");
  };

  auto [ops, refs] = begin({Op(0, 6, 1), Op(4096, 6, 1)});
  REQUIRE(Code(ops[0]) == absl::StatusCode::kOk);
  REQUIRE(Code(ops[1]) == absl::StatusCode::kOk);
  CHECK(f.cs.writes.size() == 2);
  // Begun twice on one connection; over its own reservation.
  auto again = begin({Op(0, 6, 1), Op(0, 8, 2)});
  CHECK(Code(again.first[0]) == absl::StatusCode::kAlreadyExists);
  CHECK(Code(again.first[1]) == absl::StatusCode::kFailedPrecondition);
  // Not readable before its commit.
  CHECK(Code(f.Read(&f.other, {Op(0, 6, 1)}).ops[0]) ==
        absl::StatusCode::kNotFound);

  place(refs[0], "commit");
  place(refs[1], "abort!");
  OpDesc abort = Op(4096, 6, 1);
  abort.status = wire::ToWireCode(absl::StatusCode::kCancelled);
  auto done = commit({Op(0, 6, 1), abort, Op(8192, 6, 1)});
  CHECK(Code(done[0]) == absl::StatusCode::kOk);
  CHECK(Code(done[1]) == absl::StatusCode::kCancelled);
  CHECK(Code(done[2]) == absl::StatusCode::kNotFound);  // never begun
  // A receipt for the committed write only.
  REQUIRE(receipts.size() == 3 * wire::kReceiptBytes);
  const TestCapabilities& caps = TestCapabilities::Get();
  CHECK(caps.IsReceipt(Op(0, 6, 1), receipts.substr(0, wire::kReceiptBytes)));
  CHECK(receipts.substr(wire::kReceiptBytes) ==
        std::string(2 * wire::kReceiptBytes, '\0'));
  CHECK(f.cs.writes.empty());
  Decoded r = f.Read(&f.other, {Op(0, 6, 1), Op(4096, 6, 1)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kNotFound);
  CHECK(r.payload == "commit");
  CHECK(f.counters.Load().direct_write_ops == 1);
  CHECK(f.counters.Load().shm_bytes_written == 6);
}

TEST_CASE("FrameHandler: a write stream that breaks off stores nothing") {
  Fixture f;
  {
    WriteStream w = f.handler->StartWrite(
        &f.cs, Req(FrameType::kWriteRequest, {Op(0, 4, 1), Op(4096, 4, 1)}),
        Soon());
    uint8_t* d = w.Begin(0);
    REQUIRE(d != nullptr);
    std::memcpy(d, "full", 4);
    w.Commit(0);
    d = w.Begin(1);
    REQUIRE(d != nullptr);
    std::memcpy(d, "ha", 2);  // the payload breaks off here
    w.Abort();
  }
  Decoded r = f.Read(&f.cs, {Op(0, 4, 1), Op(4096, 4, 1)});
  CHECK(Code(r.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(r.ops[1]) == absl::StatusCode::kNotFound);
  {
    // Dropped without Abort: the same.
    WriteStream w = f.handler->StartWrite(
        &f.cs, Req(FrameType::kWriteRequest, {Op(8192, 4, 1)}), Soon());
    REQUIRE(w.Begin(0) != nullptr);
  }
  CHECK(Code(f.Read(&f.cs, {Op(8192, 4, 1)}).ops[0]) ==
        absl::StatusCode::kNotFound);
  // The ranges are free again.
  auto w = f.Write(&f.cs, {Op(4096, 4, 2), Op(8192, 4, 2)}, {"abcd", "efgh"});
  CHECK(Code(w[0]) == absl::StatusCode::kOk);
  CHECK(Code(w[1]) == absl::StatusCode::kOk);
}

TEST_CASE("FrameHandler: prefetch, session read and release") {
  Fixture f;
  REQUIRE(Code(f.Write(&f.cs, {Op(0, 3, 1), Op(4096, 5, 2)},
                       {"abc", "defgh"})[1]) == absl::StatusCode::kOk);
  Decoded p = Decode(f.handler->Handle(
      &f.cs,
      Req(FrameType::kPrefetchRequest, {Op(0, 3, 1), Op(4096, 5, 2),
                                        Op(8192, 4, 1)}, 77),
      Soon()));
  CHECK(p.h.type == FrameType::kPrefetchResponse);
  CHECK(Code(p.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(p.ops[1]) == absl::StatusCode::kOk);
  CHECK(Code(p.ops[2]) == absl::StatusCode::kNotFound);
  CHECK(f.kv->Stats().staging_objects == 2);

  {
    Response r = f.handler->Handle(
        &f.cs, Req(FrameType::kReadRequest, {Op(0, 3, 1)}, 77), Soon());
    CHECK(Decode(r).payload == "abc");
    CHECK(f.counters.Load().staged_read_ops == 1);
    // Held until the response is gone (sent).
    CHECK(f.kv->Stats().staging_objects == 2);
  }
  CHECK(f.kv->Stats().staging_objects == 1);

  Decoded rel = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kReleaseRequest, {Op(4096, 5, 2), Op(0, 3, 1)}, 77),
      Soon()));
  CHECK(rel.h.type == FrameType::kReleaseResponse);
  CHECK(Code(rel.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(rel.ops[1]) == absl::StatusCode::kNotFound);  // read already
  CHECK(f.kv->Stats().staging_objects == 0);
}

TEST_CASE("FrameHandler without a KV manager refuses session frames") {
  Fixture f(/*with_kv=*/false);
  REQUIRE(Code(f.Write(&f.cs, {Op(0, 3, 1)}, {"abc"})[0]) ==
          absl::StatusCode::kOk);
  Decoded p = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kPrefetchRequest, {Op(0, 3, 1)}, 5), Soon()));
  CHECK(Code(p.ops[0]) == absl::StatusCode::kUnimplemented);
  Decoded a = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kAcquireRequest, {Op(0, 3, 1)}), Soon()));
  CHECK(Code(a.ops[0]) == absl::StatusCode::kUnimplemented);
  // A session read is a plain read.
  CHECK(f.Read(&f.cs, {Op(0, 3, 1)}, 5).payload == "abc");
}

TEST_CASE("FrameHandler: a connection's holds end with the connection") {
  // A short drain: a write over a held object gives up after it.
  Fixture f(/*with_kv=*/true, absl::Milliseconds(200));
  REQUIRE(Code(f.Write(&f.other, {Op(0, 4, 1)}, {"held"})[0]) ==
          absl::StatusCode::kOk);
  Decoded a = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kAcquireRequest, {Op(0, 4, 1)}), Soon()));
  CHECK(a.h.type == FrameType::kAcquireResponse);
  REQUIRE(Code(a.ops[0]) == absl::StatusCode::kOk);
  CHECK(f.cs.reads.size() == 1);
  CHECK(f.counters.Load().direct_acquired_ops == 1);
  // A reservation left open.
  Decoded b = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteBeginRequest, {Op(8192, 4, 1)}), Soon()));
  REQUIRE(Code(b.ops[0]) == absl::StatusCode::kOk);

  // While held, the object's space cannot be rewritten by another
  // connection.
  CHECK(Code(f.Write(&f.other, {Op(0, 4, 2)}, {"next"})[0]) ==
        absl::StatusCode::kUnavailable);

  f.handler->EndConnection(&f.cs);
  CHECK(f.cs.reads.empty());
  CHECK(f.cs.writes.empty());
  f.handler->EndConnection(&f.cs);  // idempotent
  // The hold is gone: the space is rewritten at once; the reservation was
  // aborted (nothing readable, and the range is free).
  auto w = f.Write(&f.other, {Op(0, 4, 2), Op(8192, 4, 2)}, {"next", "free"});
  CHECK(Code(w[0]) == absl::StatusCode::kOk);
  CHECK(Code(w[1]) == absl::StatusCode::kOk);
  CHECK(f.Read(&f.other, {Op(0, 4, 2), Op(8192, 4, 2)}).payload ==
        "nextfree");
}

// An RDMA queue pair's grants, as a log: what is open (key -> range), and
// per revocation how many objects the KV manager still held and how many
// writes the device had committed.
class FakeRdma : public RdmaConnection {
 public:
  struct Log {
    std::map<uint32_t, Range> open;
    std::vector<uint32_t> revoked;
    std::vector<std::pair<uint64_t, uint64_t>> at_revoke;
    bool closed = false;
    bool fail_next_grant = false;
  };
  FakeRdma(Log* log, const Fixture* f) : log_(log), f_(f) {}
  ~FakeRdma() override {
    std::vector<uint32_t> keys;
    for (const auto& [k, r] : log_->open) keys.push_back(k);
    Revoke(keys, absl::Now());
    log_->closed = true;
  }
  std::vector<absl::StatusOr<uint32_t>> Grant(absl::Span<const Range> ranges,
                                              absl::Time) override {
    std::vector<absl::StatusOr<uint32_t>> out;
    for (const Range& r : ranges) {
      if (log_->fail_next_grant) {
        log_->fail_next_grant = false;
        out.push_back(absl::ResourceExhaustedError("out of windows"));
        continue;
      }
      log_->open[next_key_] = r;
      out.push_back(next_key_++);
    }
    return out;
  }
  void Revoke(absl::Span<const uint32_t> keys, absl::Time) override {
    for (uint32_t k : keys) {
      REQUIRE(log_->open.erase(k) == 1);  // granted, not revoked before
      log_->revoked.push_back(k);
      log_->at_revoke.push_back({f_->kv->Stats().staging_objects,
                                 f_->device->Stats().writes});
    }
  }

 private:
  Log* const log_;
  const Fixture* const f_;
  uint32_t next_key_ = 0x100;
};

std::vector<wire::AreaRef> Refs(const Decoded& d) {
  std::vector<wire::AreaRef> out;
  for (size_t at = 0; at < d.payload.size(); at += wire::kAreaRefBytes) {
    out.push_back(wire::DecodeAreaRef(
        reinterpret_cast<const uint8_t*>(d.payload.data()) + at));
  }
  return out;
}

TEST_CASE("FrameHandler: RDMA grants end before the holds they open") {
  Fixture f;
  REQUIRE(Code(f.Write(&f.other, {Op(0, 4, 1), Op(8192, 4, 1)},
                       {"aaaa", "bbbb"})[0]) == absl::StatusCode::kOk);
  FakeRdma::Log log;
  f.cs.rdma = std::make_unique<FakeRdma>(&log, &f);
  const uintptr_t base =
      reinterpret_cast<uintptr_t>(f.device->Areas()[0].base);

  // Each object acquired is granted for reading, exactly its range; its
  // key is in its AreaRef.
  Decoded a = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kAcquireRequest, {Op(0, 4, 1), Op(8192, 4, 1)}),
      Soon()));
  REQUIRE(Code(a.ops[0]) == absl::StatusCode::kOk);
  REQUIRE(Code(a.ops[1]) == absl::StatusCode::kOk);
  std::vector<wire::AreaRef> refs = Refs(a);
  REQUIRE(refs.size() == 2);
  REQUIRE(log.open.size() == 2);
  for (const wire::AreaRef& r : refs) {
    REQUIRE(log.open.count(r.rkey) == 1);
    CHECK(reinterpret_cast<uintptr_t>(log.open[r.rkey].data) ==
          base + r.offset);
    CHECK(log.open[r.rkey].length == 4);
    CHECK_FALSE(log.open[r.rkey].write);
  }
  CHECK(f.counters.Load().rdma_bytes_read == 8);

  // A release naming the first object twice revokes and releases it once,
  // while it is still held; the repeat is NotFound.
  Decoded rel = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kReleaseRequest, {Op(0, 4, 1), Op(0, 4, 1)}),
      Soon()));
  CHECK(Code(rel.ops[0]) == absl::StatusCode::kOk);
  CHECK(Code(rel.ops[1]) == absl::StatusCode::kNotFound);
  REQUIRE(log.revoked == std::vector<uint32_t>{refs[0].rkey});
  CHECK(log.at_revoke[0].first == 2);
  CHECK(f.cs.reads.size() == 1);
  CHECK(f.cs.read_keys.size() == 1);

  // An object whose grant fails is not held.
  log.fail_next_grant = true;
  Decoded failed = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kAcquireRequest, {Op(0, 4, 1)}), Soon()));
  CHECK(Code(failed.ops[0]) == absl::StatusCode::kResourceExhausted);
  CHECK(Refs(failed)[0].rkey == 0);
  CHECK(f.cs.reads.size() == 1);

  // A write reservation is granted for writing only, and revoked before
  // its commit.
  Decoded b = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteBeginRequest, {Op(16384, 4, 1)}), Soon()));
  REQUIRE(Code(b.ops[0]) == absl::StatusCode::kOk);
  const uint32_t wkey = Refs(b)[0].rkey;
  REQUIRE(log.open.count(wkey) == 1);
  CHECK(log.open[wkey].write);
  const uint64_t writes = f.device->Stats().writes;
  Decoded c = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteCommitRequest, {Op(16384, 4, 1)}), Soon()));
  CHECK(Code(c.ops[0]) == absl::StatusCode::kOk);
  REQUIRE(log.revoked.size() == 2);
  CHECK(log.revoked[1] == wkey);
  CHECK(log.at_revoke[1].second == writes);
  CHECK(f.device->Stats().writes == writes + 1);
  CHECK(f.counters.Load().rdma_bytes_written == 4);

  // A reservation whose grant fails is aborted.
  log.fail_next_grant = true;
  Decoded refused = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteBeginRequest, {Op(24576, 4, 1)}), Soon()));
  CHECK(Code(refused.ops[0]) == absl::StatusCode::kResourceExhausted);
  CHECK(f.cs.writes.empty());

  // The connection ends: the grants still open (the second object's, a
  // reservation's) end with the queue pair, before the holds do.
  Decoded d = Decode(f.handler->Handle(
      &f.cs, Req(FrameType::kWriteBeginRequest, {Op(32768, 4, 1)}), Soon()));
  REQUIRE(Code(d.ops[0]) == absl::StatusCode::kOk);
  REQUIRE(log.open.size() == 2);
  f.handler->EndConnection(&f.cs);
  CHECK(log.closed);
  CHECK(log.open.empty());
  REQUIRE(log.at_revoke.size() == 4);
  CHECK(log.at_revoke[2].first == 1);
  CHECK(log.at_revoke[3].first == 1);
  CHECK(f.cs.rdma == nullptr);
  CHECK(f.cs.reads.empty());
  CHECK(f.cs.writes.empty());
  CHECK(f.kv->Stats().staging_objects == 0);
}

TEST_CASE("FrameHandler decodes and refuses malformed frames") {
  Fixture f;
  uint8_t hdr[wire::kHeaderBytes];
  wire::FrameHeader h;
  h.type = FrameType::kReadResponse;  // a response is no request
  h.request_id = 3;
  wire::EncodeHeader(h, hdr);
  wire::FrameHeader got;
  absl::Status s = f.handler->ParseHeader(hdr, &got);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(got.request_id == 3);
  std::memset(hdr, 0xAB, sizeof(hdr));
  CHECK(!f.handler->ParseHeader(hdr, &got).ok());

  // An op table whose length is 0.
  Request r;
  r.header.type = FrameType::kReadRequest;
  r.header.op_count = 1;
  std::vector<uint8_t> table(FrameHandler::OpTableBytes(r.header));
  wire::EncodeOp(Op(0, 0, 1), table.data());
  CHECK(f.handler->ParseOps(table, &r).code() ==
        absl::StatusCode::kInvalidArgument);
  wire::EncodeOp(Op(0, 4, 1), table.data());
  REQUIRE(f.handler->ParseOps(table, &r).ok());
  std::vector<uint8_t> caps(wire::kCapBytes, 0xFF);  // reserved bytes set
  CHECK(f.handler->ParseCapabilities(caps, &r).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(f.counters.Load().protocol_errors == 4);

  // Frames Handle does not serve are answered kError (the connection
  // closes).
  Response e = f.handler->Handle(&f.cs, Req(FrameType::kWriteRequest, {}),
                                 Soon());
  CHECK(e.closes_connection());
  Decoded d = Decode(e);
  CHECK(d.h.type == FrameType::kError);
  CHECK(wire::FromWireCode(d.h.status) == absl::StatusCode::kInvalidArgument);
  CHECK(!d.payload.empty());
}

}  // namespace
}  // namespace hymcache::storage
