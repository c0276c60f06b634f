#include "client/frame_io.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hymcache::frame_io {

wire::OpDesc ToOp(const RemoteRef& r) {
  wire::OpDesc op;
  op.region_id = r.region_id;
  op.addr = r.addr;
  op.length = r.length;
  op.generation = r.generation;
  op.cap = r.cap;
  return op;
}

absl::Status SendRequest(Socket& s, wire::FrameType type,
                         absl::Span<const wire::OpDesc> ops,
                         uint64_t payload_bytes,
                         absl::Span<const iovec> payload, uint64_t id,
                         absl::Time deadline) {
  wire::FrameHeader h;
  h.type = type;
  h.op_count = static_cast<uint16_t>(ops.size());
  h.request_id = id;
  h.payload_bytes = payload_bytes;
  const bool caps = wire::CarriesCapabilities(type);
  const size_t table = ops.size() * wire::kOpBytes;
  std::vector<uint8_t> head(wire::kHeaderBytes + table +
                            (caps ? ops.size() * wire::kCapBytes : 0));
  wire::EncodeHeader(h, head.data());
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeOp(ops[i], head.data() + wire::kHeaderBytes + i * wire::kOpBytes);
    if (caps) {
      wire::EncodeCapability(ops[i].cap, head.data() + wire::kHeaderBytes +
                                             table + i * wire::kCapBytes);
    }
  }
  std::vector<iovec> iov;
  iov.reserve(1 + payload.size());
  iov.push_back({head.data(), head.size()});
  iov.insert(iov.end(), payload.begin(), payload.end());
  return SendAllV(s.fd(), iov.data(), static_cast<int>(iov.size()), deadline);
}

absl::StatusOr<std::pair<wire::FrameHeader, std::vector<wire::OpDesc>>>
RecvResponse(Socket& s, wire::FrameType want, uint64_t id, size_t op_count,
             absl::Time deadline, bool* response_started) {
  uint8_t hb[wire::kHeaderBytes];
  bool got_any = false;
  absl::Status st = RecvAll(s.fd(), hb, sizeof(hb), deadline, &got_any);
  if (got_any) *response_started = true;
  if (!st.ok()) return st;
  auto h = wire::DecodeHeader(hb);
  if (!h.ok()) {
    return absl::UnavailableError(
        absl::StrCat("bad response from storage node: ", h.status().message()));
  }
  if (h->type == wire::FrameType::kError) {
    std::string msg(h->payload_bytes, '\0');
    RETURN_IF_ERROR(RecvAll(s.fd(), msg.data(), msg.size(), deadline));
    absl::StatusCode code = wire::FromWireCode(h->status);
    if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
    return absl::Status(code, absl::StrCat("storage node: ", msg));
  }
  if (h->type != want || h->request_id != id || h->op_count != op_count) {
    return absl::UnavailableError("storage node answered out of protocol");
  }
  std::vector<uint8_t> table(op_count * wire::kOpBytes);
  RETURN_IF_ERROR(RecvAll(s.fd(), table.data(), table.size(), deadline));
  std::vector<wire::OpDesc> ops(op_count);
  for (size_t i = 0; i < op_count; ++i) {
    ops[i] = wire::DecodeOp(table.data() + i * wire::kOpBytes);
  }
  absl::Status v = wire::ValidateOps(*h, ops);
  if (!v.ok()) {
    return absl::UnavailableError(
        absl::StrCat("bad response from storage node: ", v.message()));
  }
  return std::make_pair(*h, std::move(ops));
}

absl::Status RecvReceipts(Socket& s, absl::Span<wire::Receipt* const> dst,
                          absl::Time deadline) {
  std::vector<uint8_t> payload(dst.size() * wire::kReceiptBytes);
  RETURN_IF_ERROR(RecvAll(s.fd(), payload.data(), payload.size(), deadline));
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i] == nullptr) continue;
    std::memcpy(dst[i]->tag, payload.data() + i * wire::kReceiptBytes,
                wire::kReceiptBytes);
  }
  return absl::OkStatus();
}

absl::Status OpStatus(const wire::OpDesc& op, const char* what) {
  if (op.status == 0) return absl::OkStatus();
  return absl::Status(wire::FromWireCode(op.status),
                      absl::StrCat("storage node refused ", what, " of region ",
                                   op.region_id, " addr ", op.addr,
                                   " generation ", op.generation));
}

}  // namespace hymcache::frame_io
