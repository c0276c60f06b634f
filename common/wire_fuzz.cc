// Fuzzes the data-plane frame codec (common/wire.h) as a receiver meets it:
// the input is a byte stream of frames. For each 32-byte header the decoder
// accepts, checks that
//   - re-encoding the decoded header gives back exactly the bytes received
//     (nothing accepted is silently reinterpreted),
//   - the per-type limits hold (op count, payload size),
// and for each op table ValidateOps accepts, that every op has a length in
// 1..kMaxObjectBytes, an address that does not overflow and, for writes and
// read responses, that the payload is exactly the sum of the lengths. Ops,
// area references and session ids must survive an encode/decode round trip.
// The input's first 64 bytes are also read as a packed lookup record: one
// DecodeLookupRecord accepts must re-encode to exactly those bytes.
#include <cstring>
#include <vector>

#include "common/wire.h"
#include "fuzz/fuzz_input.h"

namespace hymcache::wire {
namespace {

bool IsRequest(FrameType t) {
  switch (t) {
    case FrameType::kReadRequest:
    case FrameType::kWriteRequest:
    case FrameType::kPrefetchRequest:
    case FrameType::kReleaseRequest:
    case FrameType::kAcquireRequest:
    case FrameType::kWriteBeginRequest:
    case FrameType::kWriteCommitRequest:
      return true;
    default:
      return false;
  }
}

void CheckHeader(const uint8_t* in, const FrameHeader& h) {
  uint8_t again[kHeaderBytes];
  EncodeHeader(h, again);
  FUZZ_CHECK(std::memcmp(in, again, kHeaderBytes) == 0)
      << "header does not re-encode to its bytes";
  FUZZ_CHECK(h.op_count <= kMaxOps) << h.op_count;
  if (IsRequest(h.type) && h.type != FrameType::kReleaseRequest) {
    FUZZ_CHECK(h.op_count > 0) << "request without ops accepted";
  }
  switch (h.type) {
    case FrameType::kReadRequest:
      FUZZ_CHECK(h.payload_bytes == 0 || h.payload_bytes == kSessionBytes);
      break;
    case FrameType::kPrefetchRequest:
    case FrameType::kReleaseRequest:
    case FrameType::kAcquireRequest:
      FUZZ_CHECK(h.payload_bytes == kSessionBytes);
      break;
    case FrameType::kWriteBeginRequest:
    case FrameType::kWriteCommitRequest:
    case FrameType::kPing:
    case FrameType::kPong:
      FUZZ_CHECK(h.payload_bytes == 0);
      break;
    case FrameType::kError:
      FUZZ_CHECK(h.op_count == 0 && h.payload_bytes <= kMaxErrorBytes);
      break;
    case FrameType::kRdmaConnectRequest:
      FUZZ_CHECK(h.op_count == 1 && h.payload_bytes > 0 &&
                 h.payload_bytes <= kMaxConnectBytes);
      break;
    case FrameType::kRdmaConnectResponse:
      FUZZ_CHECK(h.op_count == 0 && h.payload_bytes > 0 &&
                 h.payload_bytes <= kMaxConnectBytes);
      break;
    case FrameType::kAcquireResponse:
    case FrameType::kWriteBeginResponse:
      FUZZ_CHECK(h.payload_bytes == uint64_t{h.op_count} * kAreaRefBytes);
      break;
    default:
      FUZZ_CHECK(h.payload_bytes <= uint64_t{kMaxOps} * kMaxObjectBytes);
      break;
  }
  const absl::StatusCode code = FromWireCode(h.status);
  FUZZ_CHECK(ToWireCode(code) == h.status || code == absl::StatusCode::kUnknown)
      << h.status;
}

void CheckOps(const FrameHeader& h, const std::vector<OpDesc>& ops) {
  uint64_t sum = 0;
  for (const OpDesc& op : ops) {
    FUZZ_CHECK(op.length >= 1 && op.length <= kMaxObjectBytes) << op.length;
    FUZZ_CHECK(op.addr + op.length >= op.addr) << "address overflow accepted";
    if (h.type == FrameType::kWriteRequest ||
        (h.type == FrameType::kReadResponse && op.status == 0)) {
      sum += op.length;
    }
  }
  if (h.type == FrameType::kWriteRequest ||
      h.type == FrameType::kReadResponse) {
    FUZZ_CHECK(sum == h.payload_bytes)
        << "payload " << h.payload_bytes << " but ops sum to " << sum;
  }
}

}  // namespace
}  // namespace hymcache::wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hymcache::wire;  // NOLINT
  if (size >= kLookupRecordBytes) {
    absl::StatusOr<LookupRecord> r = DecodeLookupRecord(data);
    if (r.ok()) {
      uint8_t again[kLookupRecordBytes];
      EncodeLookupRecord(*r, again);
      FUZZ_CHECK(std::memcmp(data, again, kLookupRecordBytes) == 0)
          << "lookup record does not re-encode to its bytes";
    } else {
      FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument)
          << r.status();
    }
  }
  size_t pos = 0;
  while (size - pos >= kHeaderBytes) {
    const uint8_t* in = data + pos;
    pos += kHeaderBytes;
    absl::StatusOr<FrameHeader> h = DecodeHeader(in);
    if (!h.ok()) {
      FUZZ_CHECK(h.status().code() == absl::StatusCode::kInvalidArgument ||
                 h.status().code() == absl::StatusCode::kUnimplemented)
          << h.status();
      // A receiver closes the connection here; resynchronise one byte on
      // to keep exploring the rest of the input.
      pos -= kHeaderBytes - 1;
      continue;
    }
    CheckHeader(in, *h);
    std::vector<OpDesc> ops;
    for (size_t i = 0; i < h->op_count && size - pos >= kOpBytes; ++i) {
      const OpDesc op = DecodeOp(data + pos);
      uint8_t again[kOpBytes];
      EncodeOp(op, again);
      FUZZ_CHECK(std::memcmp(data + pos, again, kOpBytes) == 0);
      ops.push_back(op);
      pos += kOpBytes;
    }
    absl::Status s = ValidateOps(*h, ops);
    if (ops.size() != h->op_count) {
      FUZZ_CHECK(!s.ok()) << "short op table accepted";
      break;
    }
    if (s.ok()) CheckOps(*h, ops);
    // Payload: the bytes that follow, as far as the input goes. Area refs
    // and session ids must round-trip.
    const uint64_t payload =
        std::min<uint64_t>(h->payload_bytes, size - pos);
    if (h->type == FrameType::kAcquireResponse ||
        h->type == FrameType::kWriteBeginResponse) {
      for (uint64_t off = 0; off + kAreaRefBytes <= payload;
           off += kAreaRefBytes) {
        const AreaRef r = DecodeAreaRef(data + pos + off);
        uint8_t again[kAreaRefBytes];
        EncodeAreaRef(r, again);
        const AreaRef r2 = DecodeAreaRef(again);
        FUZZ_CHECK(r2.area == r.area && r2.offset == r.offset);
      }
    }
    if (payload == kSessionBytes) {
      const uint64_t session = DecodeSession(data + pos);
      uint8_t again[kSessionBytes];
      EncodeSession(session, again);
      FUZZ_CHECK(std::memcmp(again, data + pos, kSessionBytes) == 0);
    }
    pos += payload;
  }
  return 0;
}
