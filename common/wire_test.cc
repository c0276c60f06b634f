#include "common/wire.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

namespace hymcache::wire {
namespace {

std::vector<uint8_t> Header(const FrameHeader& h) {
  std::vector<uint8_t> b(kHeaderBytes);
  EncodeHeader(h, b.data());
  return b;
}

TEST_CASE("header and op round-trip") {
  FrameHeader h;
  h.type = FrameType::kWriteRequest;
  h.op_count = 3;
  h.request_id = 0x1122334455667788ull;
  h.payload_bytes = 12345;
  h.status = 7;
  auto b = Header(h);
  auto d = DecodeHeader(b.data());
  REQUIRE(d.ok());
  CHECK(d->type == FrameType::kWriteRequest);
  CHECK(d->op_count == 3);
  CHECK(d->request_id == h.request_id);
  CHECK(d->payload_bytes == 12345);
  CHECK(d->status == 7);

  OpDesc op{9, 3, 1ull << 40, 4096, 77};
  uint8_t ob[kOpBytes];
  EncodeOp(op, ob);
  OpDesc o = DecodeOp(ob);
  CHECK(o.region_id == 9);
  CHECK(o.status == 3);
  CHECK(o.addr == (1ull << 40));
  CHECK(o.length == 4096);
  CHECK(o.generation == 77);
}

TEST_CASE("hostile headers are rejected before anything is allocated") {
  FrameHeader h;
  h.type = FrameType::kReadRequest;
  h.op_count = 1;

  SECTION("bad magic") {
    auto b = Header(h);
    b[0] ^= 0xff;
    auto d = DecodeHeader(b.data());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("other version") {
    auto b = Header(h);
    b[4] = 1;  // version 1 had no capability table
    CHECK(DecodeHeader(b.data()).status().code() ==
          absl::StatusCode::kUnimplemented);
  }
  SECTION("unknown type") {
    auto b = Header(h);
    b[5] = 99;
    CHECK_FALSE(DecodeHeader(b.data()).ok());
    b[5] = 0;
    CHECK_FALSE(DecodeHeader(b.data()).ok());
  }
  SECTION("too many ops") {
    h.op_count = kMaxOps + 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.op_count = 0xffff;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("request with no ops") {
    h.op_count = 0;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("read request with a payload other than a session id") {
    h.payload_bytes = 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = kSessionBytes + 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = kSessionBytes;
    CHECK(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("session requests need a session id") {
    h.type = FrameType::kPrefetchRequest;
    h.payload_bytes = 0;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = kSessionBytes;
    CHECK(DecodeHeader(Header(h).data()).ok());
    h.op_count = 0;  // a prefetch names at least one object
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.type = FrameType::kReleaseRequest;  // a release may name none (all)
    CHECK(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = 16;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("direct-access frames") {
    h.type = FrameType::kAcquireRequest;
    h.payload_bytes = kSessionBytes;
    CHECK(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = 0;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.type = FrameType::kAcquireResponse;
    h.payload_bytes = h.op_count * kAreaRefBytes;
    CHECK(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes += 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    // Write responses carry one receipt per op, no more, no less.
    for (FrameType t :
         {FrameType::kWriteResponse, FrameType::kWriteCommitResponse}) {
      h.type = t;
      h.payload_bytes = h.op_count * kReceiptBytes;
      CHECK(DecodeHeader(Header(h).data()).ok());
      h.payload_bytes = 0;
      CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
      h.payload_bytes = h.op_count * kReceiptBytes + 1;
      CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    }
    h.type = FrameType::kWriteBeginRequest;
    h.payload_bytes = 0;
    CHECK(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = 8;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    // A connect request carries exactly one op (its grant); the response
    // none.
    h.type = FrameType::kRdmaConnectRequest;
    h.op_count = 1;
    h.payload_bytes = kMaxConnectBytes;
    CHECK(DecodeHeader(Header(h).data()).ok());
    CHECK(CarriesCapabilities(h.type));
    h.op_count = 0;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.op_count = 2;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.op_count = 1;
    h.payload_bytes = kMaxConnectBytes + 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.payload_bytes = 0;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.type = FrameType::kRdmaConnectResponse;
    h.payload_bytes = kMaxConnectBytes;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
    h.op_count = 0;
    CHECK(DecodeHeader(Header(h).data()).ok());
    CHECK_FALSE(CarriesCapabilities(h.type));
    uint8_t b[kAreaRefBytes];
    EncodeAreaRef({7, 0xA1B2C3D4u, 0x1122334455ull}, b);
    AreaRef r = DecodeAreaRef(b);
    CHECK(r.area == 7);
    CHECK(r.rkey == 0xA1B2C3D4u);
    CHECK(r.offset == 0x1122334455ull);
    CHECK(b[4] == 0xD4);  // the rkey's bytes sit where version 2 had zeros
  }
  SECTION("session ids round-trip") {
    uint8_t b[kSessionBytes];
    EncodeSession(0x0123456789abcdefull, b);
    CHECK(b[0] == 0xef);
    CHECK(DecodeSession(b) == 0x0123456789abcdefull);
  }
  SECTION("absurd write payload") {
    h.type = FrameType::kWriteRequest;
    h.payload_bytes = ~0ull;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("oversized error message") {
    h.type = FrameType::kError;
    h.op_count = 0;
    h.payload_bytes = kMaxErrorBytes + 1;
    CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  }
  SECTION("reserved bits") {
    auto b = Header(h);
    b[30] = 1;
    CHECK_FALSE(DecodeHeader(b.data()).ok());
  }
}

TEST_CASE("a think-time hint carries ops and exactly its times") {
  FrameHeader h;
  h.type = FrameType::kHintRequest;
  h.op_count = 2;
  h.payload_bytes = kHintTimesBytes;
  REQUIRE(DecodeHeader(Header(h).data()).ok());
  CHECK(CarriesCapabilities(FrameType::kHintRequest));
  h.payload_bytes = kSessionBytes + 1;
  CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  h.payload_bytes = kHintTimesBytes;
  h.op_count = 0;
  CHECK_FALSE(DecodeHeader(Header(h).data()).ok());
  // The answer: a status per op, no payload.
  h.type = FrameType::kHintResponse;
  h.op_count = 2;
  h.payload_bytes = 0;
  CHECK(DecodeHeader(Header(h).data()).ok());
  h.payload_bytes = 8;
  CHECK_FALSE(DecodeHeader(Header(h).data()).ok());

  uint8_t b[kHintTimesBytes];
  EncodeHintTimes(HintTimes{1500, 0xfffffffe}, b);
  const HintTimes t = DecodeHintTimes(b);
  CHECK(t.expected_in_ms == 1500);
  CHECK(t.hold_ms == 0xfffffffe);
}

TEST_CASE("op tables are checked against the header") {
  FrameHeader h;
  h.type = FrameType::kWriteRequest;
  h.op_count = 2;
  std::vector<OpDesc> ops = {{0, 0, 0, 100, 1}, {0, 0, 4096, 50, 2}};

  h.payload_bytes = 150;
  CHECK(ValidateOps(h, ops).ok());
  h.payload_bytes = 149;
  CHECK_FALSE(ValidateOps(h, ops).ok());  // truncated payload
  h.payload_bytes = 150;

  ops[1].length = 0;
  CHECK_FALSE(ValidateOps(h, ops).ok());
  ops[1].length = kMaxObjectBytes + 1;
  CHECK_FALSE(ValidateOps(h, ops).ok());
  ops[1].length = 50;
  ops[1].addr = UINT64_MAX - 10;
  CHECK_FALSE(ValidateOps(h, ops).ok());
  ops[1].addr = 0;

  // A read response counts only the ops that succeeded.
  h.type = FrameType::kReadResponse;
  ops[1].status = ToWireCode(absl::StatusCode::kNotFound);
  h.payload_bytes = 100;
  CHECK(ValidateOps(h, ops).ok());
  h.payload_bytes = 150;
  CHECK_FALSE(ValidateOps(h, ops).ok());

  // Op count must match.
  h.op_count = 3;
  CHECK_FALSE(ValidateOps(h, ops).ok());
}

TEST_CASE("status codes survive the wire; unknown ones become kUnknown") {
  CHECK(FromWireCode(ToWireCode(absl::StatusCode::kNotFound)) ==
        absl::StatusCode::kNotFound);
  CHECK(FromWireCode(12345) == absl::StatusCode::kUnknown);
}

TEST_CASE("lookup records round-trip; a malformed one is refused") {
  LookupRecord r;
  r.node_id = 7;
  r.region_id = 2;
  r.addr = 1ull << 40;
  r.length = 4096;
  r.generation = 991;
  r.cap.expires_unix_ms = 1'800'000'000'123;
  r.cap.rights = kCapRead;
  for (size_t i = 0; i < kCapTagBytes; ++i) r.cap.tag[i] = uint8_t(i + 1);
  uint8_t b[kLookupRecordBytes];
  EncodeLookupRecord(r, b);
  auto d = DecodeLookupRecord(b);
  REQUIRE(d.ok());
  CHECK(d->node_id == 7);
  CHECK(d->region_id == 2);
  CHECK(d->addr == (1ull << 40));
  CHECK(d->length == 4096);
  CHECK(d->generation == 991);
  CHECK(d->cap.expires_unix_ms == r.cap.expires_unix_ms);
  CHECK(d->cap.rights == kCapRead);
  CHECK(std::memcmp(d->cap.tag, r.cap.tag, kCapTagBytes) == 0);

  // Reserved capability bytes.
  b[32 + 12] = 1;
  CHECK(DecodeLookupRecord(b).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Not found: all zero, and nothing else set.
  EncodeLookupRecord(LookupRecord(), b);
  for (uint8_t x : b) CHECK(x == 0);
  d = DecodeLookupRecord(b);
  REQUIRE(d.ok());
  CHECK(d->node_id == 0);
  b[20] = 1;  // a length on a not-found record
  CHECK(DecodeLookupRecord(b).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hymcache::wire
