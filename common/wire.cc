#include "common/wire.h"

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace hymcache::wire {
namespace {

using absl::little_endian::Load16;
using absl::little_endian::Load32;
using absl::little_endian::Load64;
using absl::little_endian::Store16;
using absl::little_endian::Store32;
using absl::little_endian::Store64;

bool KnownType(uint8_t t) {
  return t >= static_cast<uint8_t>(FrameType::kReadRequest) &&
         t <= static_cast<uint8_t>(FrameType::kHintResponse);
}

}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  Store32(out + 0, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(h.type);
  Store16(out + 6, h.op_count);
  Store64(out + 8, h.request_id);
  Store64(out + 16, h.payload_bytes);
  Store32(out + 24, h.status);
  Store32(out + 28, 0);
}

absl::StatusOr<FrameHeader> DecodeHeader(const uint8_t in[kHeaderBytes]) {
  uint32_t magic = Load32(in);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane: bad magic 0x", absl::Hex(magic),
                     " (not a HyMCache data-plane peer)"));
  }
  if (in[4] != kVersion) {
    return absl::UnimplementedError(
        absl::StrCat("data plane: protocol version ", in[4],
                     " not supported (this side speaks ", kVersion, ")"));
  }
  if (!KnownType(in[5])) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane: unknown frame type ", in[5]));
  }
  if (Load32(in + 28) != 0) {
    return absl::InvalidArgumentError("data plane: reserved header bits set");
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(in[5]);
  h.op_count = Load16(in + 6);
  h.request_id = Load64(in + 8);
  h.payload_bytes = Load64(in + 16);
  h.status = Load32(in + 24);
  if (h.op_count > kMaxOps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane: ", h.op_count, " ops in one frame (limit ", kMaxOps, ")"));
  }
  switch (h.type) {
    case FrameType::kReadRequest:
    case FrameType::kWriteRequest:
      if (h.op_count == 0) {
        return absl::InvalidArgumentError("data plane: request with no ops");
      }
      if (h.type == FrameType::kReadRequest && h.payload_bytes != 0 &&
          h.payload_bytes != kSessionBytes) {
        return absl::InvalidArgumentError(
            "data plane: read request payload is not a session id");
      }
      if (h.payload_bytes > uint64_t{kMaxOps} * kMaxObjectBytes) {
        return absl::InvalidArgumentError("data plane: payload too large");
      }
      break;
    case FrameType::kReadResponse:
      if (h.payload_bytes > uint64_t{kMaxOps} * kMaxObjectBytes) {
        return absl::InvalidArgumentError("data plane: payload too large");
      }
      break;
    case FrameType::kPrefetchRequest:
      if (h.op_count == 0) {
        return absl::InvalidArgumentError("data plane: prefetch with no ops");
      }
      [[fallthrough]];
    case FrameType::kReleaseRequest:
      if (h.payload_bytes != kSessionBytes) {
        return absl::InvalidArgumentError(
            "data plane: session request without a session id");
      }
      break;
    case FrameType::kHintRequest:
      if (h.op_count == 0 || h.payload_bytes != kHintTimesBytes) {
        return absl::InvalidArgumentError(
            "data plane: hint needs ops and its times");
      }
      break;
    case FrameType::kAcquireRequest:
      if (h.op_count == 0 || h.payload_bytes != kSessionBytes) {
        return absl::InvalidArgumentError(
            "data plane: acquire needs ops and a session id");
      }
      break;
    case FrameType::kWriteResponse:
    case FrameType::kWriteCommitResponse:
      if (h.payload_bytes != uint64_t{h.op_count} * kReceiptBytes) {
        return absl::InvalidArgumentError(
            "data plane: write response without one receipt per op");
      }
      break;
    case FrameType::kAcquireResponse:
    case FrameType::kWriteBeginResponse:
      if (h.payload_bytes != uint64_t{h.op_count} * kAreaRefBytes) {
        return absl::InvalidArgumentError(
            "data plane: malformed direct-access response");
      }
      break;
    case FrameType::kWriteBeginRequest:
    case FrameType::kWriteCommitRequest:
      if (h.op_count == 0 || h.payload_bytes != 0) {
        return absl::InvalidArgumentError(
            "data plane: direct write frames carry ops and no payload");
      }
      break;
    case FrameType::kRdmaConnectRequest:
      // Exactly one op: the grant that authorizes the queue pair.
      if (h.op_count != 1 || h.payload_bytes == 0 ||
          h.payload_bytes > kMaxConnectBytes) {
        return absl::InvalidArgumentError(
            "data plane: malformed RDMA connect request (wants one op, the "
            "grant, and a queue-pair description)");
      }
      break;
    case FrameType::kRdmaConnectResponse:
      if (h.op_count != 0 || h.payload_bytes == 0 ||
          h.payload_bytes > kMaxConnectBytes) {
        return absl::InvalidArgumentError(
            "data plane: malformed RDMA connect frame");
      }
      break;
    case FrameType::kPrefetchResponse:
    case FrameType::kReleaseResponse:
    case FrameType::kHintResponse:
    case FrameType::kPing:
    case FrameType::kPong:
      if (h.payload_bytes != 0) {
        return absl::InvalidArgumentError(
            "data plane: unexpected payload on a control frame");
      }
      break;
    case FrameType::kError:
      if (h.op_count != 0 || h.payload_bytes > kMaxErrorBytes) {
        return absl::InvalidArgumentError("data plane: malformed error frame");
      }
      break;
  }
  if ((h.type == FrameType::kPing || h.type == FrameType::kPong) &&
      h.op_count != 0) {
    return absl::InvalidArgumentError("data plane: ping with ops");
  }
  return h;
}

void EncodeSession(uint64_t session, uint8_t out[kSessionBytes]) {
  Store64(out, session);
}

uint64_t DecodeSession(const uint8_t in[kSessionBytes]) { return Load64(in); }

void EncodeHintTimes(const HintTimes& t, uint8_t out[kHintTimesBytes]) {
  Store32(out, t.expected_in_ms);
  Store32(out + 4, t.hold_ms);
}

HintTimes DecodeHintTimes(const uint8_t in[kHintTimesBytes]) {
  return HintTimes{Load32(in), Load32(in + 4)};
}

void EncodeAreaRef(const AreaRef& r, uint8_t out[kAreaRefBytes]) {
  Store32(out, r.area);
  Store32(out + 4, r.rkey);
  Store64(out + 8, r.offset);
}

AreaRef DecodeAreaRef(const uint8_t in[kAreaRefBytes]) {
  AreaRef r;
  r.area = Load32(in);
  r.rkey = Load32(in + 4);
  r.offset = Load64(in + 8);
  return r;
}

bool CarriesCapabilities(FrameType type) {
  switch (type) {
    case FrameType::kReadRequest:
    case FrameType::kWriteRequest:
    case FrameType::kPrefetchRequest:
    case FrameType::kHintRequest:
    case FrameType::kAcquireRequest:
    case FrameType::kWriteBeginRequest:
    case FrameType::kRdmaConnectRequest:
      return true;
    default:
      return false;
  }
}

void EncodeCapability(const Capability& c, uint8_t out[kCapBytes]) {
  Store64(out, static_cast<uint64_t>(c.expires_unix_ms));
  out[8] = c.rights;
  std::memset(out + 9, 0, 7);
  std::memcpy(out + 16, c.tag, kCapTagBytes);
}

absl::StatusOr<Capability> DecodeCapability(const uint8_t in[kCapBytes]) {
  for (int i = 9; i < 16; ++i) {
    if (in[i] != 0) {
      return absl::InvalidArgumentError(
          "data plane: reserved capability bytes set");
    }
  }
  Capability c;
  c.expires_unix_ms = static_cast<int64_t>(Load64(in));
  c.rights = in[8];
  std::memcpy(c.tag, in + 16, kCapTagBytes);
  return c;
}

void EncodeLookupRecord(const LookupRecord& r,
                        uint8_t out[kLookupRecordBytes]) {
  Store32(out + 0, r.node_id);
  Store32(out + 4, r.region_id);
  Store64(out + 8, r.addr);
  Store64(out + 16, r.length);
  Store64(out + 24, r.generation);
  EncodeCapability(r.cap, out + 32);
}

absl::StatusOr<LookupRecord> DecodeLookupRecord(
    const uint8_t in[kLookupRecordBytes]) {
  LookupRecord r;
  r.node_id = Load32(in + 0);
  if (r.node_id == 0) {
    for (size_t i = 4; i < kLookupRecordBytes; ++i) {
      if (in[i] != 0) {
        return absl::InvalidArgumentError(
            "lookup record: a not-found record with bytes set");
      }
    }
    return r;
  }
  r.region_id = Load32(in + 4);
  r.addr = Load64(in + 8);
  r.length = Load64(in + 16);
  r.generation = Load64(in + 24);
  absl::StatusOr<Capability> cap = DecodeCapability(in + 32);
  if (!cap.ok()) {
    return absl::InvalidArgumentError(
        "lookup record: reserved capability bytes set");
  }
  r.cap = *cap;
  return r;
}

void EncodeOp(const OpDesc& op, uint8_t out[kOpBytes]) {
  Store32(out + 0, op.region_id);
  Store32(out + 4, op.status);
  Store64(out + 8, op.addr);
  Store64(out + 16, op.length);
  Store64(out + 24, op.generation);
}

OpDesc DecodeOp(const uint8_t in[kOpBytes]) {
  OpDesc op;
  op.region_id = Load32(in + 0);
  op.status = Load32(in + 4);
  op.addr = Load64(in + 8);
  op.length = Load64(in + 16);
  op.generation = Load64(in + 24);
  return op;
}

absl::Status ValidateOps(const FrameHeader& h, absl::Span<const OpDesc> ops) {
  if (ops.size() != h.op_count) {
    return absl::InvalidArgumentError("data plane: op count mismatch");
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpDesc& op = ops[i];
    if (op.length == 0 || op.length > kMaxObjectBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plane: op ", i, " length ", op.length,
                       " outside 1..", kMaxObjectBytes));
    }
    if (op.addr > UINT64_MAX - op.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plane: op ", i, " address overflows"));
    }
    bool counts = h.type == FrameType::kWriteRequest ||
                  (h.type == FrameType::kReadResponse && op.status == 0);
    if (counts) sum += op.length;  // <= kMaxOps * 2^30: cannot overflow
  }
  if ((h.type == FrameType::kWriteRequest ||
       h.type == FrameType::kReadResponse) &&
      sum != h.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane: payload is ", h.payload_bytes,
                     " bytes but the ops add up to ", sum));
  }
  return absl::OkStatus();
}

uint32_t ToWireCode(absl::StatusCode code) { return static_cast<uint32_t>(code); }

absl::StatusCode FromWireCode(uint32_t code) {
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

}  // namespace hymcache::wire
