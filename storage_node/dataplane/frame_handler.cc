#include "storage_node/dataplane/frame_handler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

// Longest a request whose capabilities fail waits for a registration in
// flight (CapabilityVerifier::WaitForIdentityChange).
constexpr absl::Duration kIdentityChangeWait = absl::Seconds(2);

storage::ExtentKey KeyOf(const wire::OpDesc& op) {
  return ExtentKey{op.region_id, op.addr, op.length, op.generation};
}

uint32_t WireStatus(const absl::Status& s) {
  return wire::ToWireCode(s.code());
}

using KeyLess = ExtentKeyLess;

// Whether `key` overlaps an entry of `held` (keyed by ExtentKey in KeyLess
// order). Walks back from the first entry past the key's end; entries are at
// most wire::kMaxObjectBytes long, so the walk stops that far before it.
template <typename Map>
bool OverlapsHeld(const Map& held, const ExtentKey& key) {
  const uint64_t end = key.addr + key.length;  // ValidateOps: no overflow
  auto it = held.lower_bound(ExtentKey{key.region_id, end, 0, 0});
  while (it != held.begin()) {
    --it;
    const ExtentKey& k = it->first;
    if (k.region_id != key.region_id) break;
    if (k.addr + k.length > key.addr) return true;  // k.addr < end
    if (k.addr + wire::kMaxObjectBytes <= key.addr) break;
  }
  return false;
}

// A write over what this connection itself holds (a write it began, an
// object it acquired) would wait for the connection's own hold to end, which
// cannot happen while the connection's one thread waits (it waited the
// extent table's drain timeout per op, far past io_timeout): refused at once.
template <typename Writes, typename Reads>
absl::Status CheckNotHeld(const Writes& writes, const Reads& reads,
                          const ExtentKey& key) {
  if (OverlapsHeld(writes, key) || OverlapsHeld(reads, key)) {
    return absl::FailedPreconditionError(
        "data plane: the write overlaps a write begun or an object acquired "
        "on this connection (commit or release it first)");
  }
  return absl::OkStatus();
}

// Ends the RDMA grants of `held` (keys of `grants`; `rdma` may be null: no
// queue pair, no grants) and forgets them.
void RevokeHolds(RdmaConnection* rdma,
                 std::map<ExtentKey, uint32_t, KeyLess>* grants,
                 absl::Span<const ExtentKey> held, absl::Time deadline) {
  if (rdma == nullptr || held.empty()) return;
  std::vector<uint32_t> keys;
  for (const ExtentKey& k : held) {
    auto it = grants->find(k);
    if (it == grants->end()) continue;
    keys.push_back(it->second);
    grants->erase(it);
  }
  rdma->Revoke(keys, deadline);
}

// Asks `rdma` for `ranges`, one per op ops[which[k]]: a granted op's key
// goes into its AreaRef and into `grants`; an op that cannot be granted gets
// the error as its status and an empty AreaRef. Returns the indexes of
// those ops, whose holds the caller lets go of.
std::vector<size_t> GrantHolds(RdmaConnection* rdma,
                               const std::vector<RdmaConnection::Range>& ranges,
                               const std::vector<size_t>& which,
                               absl::Time deadline,
                               std::vector<wire::OpDesc>& ops,
                               std::vector<wire::AreaRef>& refs,
                               std::map<ExtentKey, uint32_t, KeyLess>* grants) {
  std::vector<size_t> refused;
  if (ranges.empty()) return refused;
  std::vector<absl::StatusOr<uint32_t>> keys = rdma->Grant(ranges, deadline);
  for (size_t k = 0; k < which.size(); ++k) {
    wire::OpDesc& op = ops[which[k]];
    if (keys[k].ok()) {
      refs[which[k]].rkey = *keys[k];
      (*grants)[KeyOf(op)] = *keys[k];
      continue;
    }
    op.status = WireStatus(keys[k].status());
    refs[which[k]] = {};
    refused.push_back(which[k]);
  }
  return refused;
}

}  // namespace

// ---------------------------------------------------------------- Response

Response::~Response() {
  // Device views end before the extent pins that protect them.
  for (ReadView& v : views_) {
    if (v.data != nullptr) device_->ReleaseRead(v);
  }
  pins_.clear();
  staged_.clear();
}

void Response::Encode(absl::Span<const uint8_t> small_payload) {
  header_.op_count = static_cast<uint16_t>(ops_.size());
  head_.resize(wire::kHeaderBytes + ops_.size() * wire::kOpBytes +
               small_payload.size());
  wire::EncodeHeader(header_, head_.data());
  for (size_t i = 0; i < ops_.size(); ++i) {
    wire::EncodeOp(ops_[i],
                   head_.data() + wire::kHeaderBytes + i * wire::kOpBytes);
  }
  if (!small_payload.empty()) {
    std::memcpy(head_.data() + wire::kHeaderBytes + ops_.size() * wire::kOpBytes,
                small_payload.data(), small_payload.size());
  }
  iov_.clear();
  iov_.push_back({head_.data(), head_.size()});
}

Response Response::Error(uint64_t request_id, const absl::Status& status) {
  absl::StatusCode code =
      status.ok() ? absl::StatusCode::kInternal : status.code();
  absl::string_view msg = status.message().substr(0, wire::kMaxErrorBytes);
  Response r;
  r.header_.type = wire::FrameType::kError;
  r.header_.request_id = request_id;
  r.header_.payload_bytes = msg.size();
  r.header_.status = wire::ToWireCode(code);
  r.Encode(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(msg.data()),
                               msg.size()));
  return r;
}

std::string Response::Flatten() const {
  std::string out;
  for (const iovec& v : iov_) {
    out.append(static_cast<const char*>(v.iov_base), v.iov_len);
  }
  return out;
}

Response FrameHandler::OpsResponse(wire::FrameType type, uint64_t request_id,
                                   std::vector<wire::OpDesc> ops) {
  Response r;
  r.header_.type = type;
  r.header_.request_id = request_id;
  r.ops_ = std::move(ops);
  r.Encode({});
  return r;
}

Response FrameHandler::AreaRefResponse(wire::FrameType type,
                                       uint64_t request_id,
                                       std::vector<wire::OpDesc> ops,
                                       const std::vector<wire::AreaRef>& refs) {
  std::vector<uint8_t> payload(ops.size() * wire::kAreaRefBytes);
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::EncodeAreaRef(refs[i], payload.data() + i * wire::kAreaRefBytes);
  }
  Response r;
  r.header_.type = type;
  r.header_.request_id = request_id;
  r.header_.payload_bytes = payload.size();
  r.ops_ = std::move(ops);
  r.Encode(payload);
  return r;
}

Response FrameHandler::ReceiptResponse(wire::FrameType type,
                                       uint64_t request_id,
                                       std::vector<wire::OpDesc> ops) const {
  std::vector<uint8_t> payload(ops.size() * wire::kReceiptBytes);
  const CapabilityVerifier::Snapshot id = options_.capabilities->Current();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].status != 0) continue;
    const wire::Receipt r = id.SignReceipt(ops[i]);
    std::memcpy(payload.data() + i * wire::kReceiptBytes, r.tag,
                wire::kReceiptBytes);
  }
  Response r;
  r.header_.type = type;
  r.header_.request_id = request_id;
  r.header_.payload_bytes = payload.size();
  r.ops_ = std::move(ops);
  r.Encode(payload);
  return r;
}

// ---------------------------------------------------------------- handler

absl::Status FrameHandlerOptions::Validate() const {
  if (device == nullptr || extents == nullptr) {
    return absl::InvalidArgumentError(
        "frame handler: device and extents are required");
  }
  if (capabilities == nullptr) {
    return absl::InvalidArgumentError(
        "frame handler: a capability verifier is required");
  }
  if (counters == nullptr) {
    return absl::InvalidArgumentError("frame handler: counters are required");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FrameHandler>> FrameHandler::Create(
    const FrameHandlerOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  return std::unique_ptr<FrameHandler>(new FrameHandler(options));
}

FrameHandler::FrameHandler(const FrameHandlerOptions& options)
    : options_(options),
      areas_(options.device->Areas()),
      counters_(*options.counters) {}

absl::Status FrameHandler::ParseHeader(const uint8_t hdr[wire::kHeaderBytes],
                                       wire::FrameHeader* h) {
  absl::StatusOr<wire::FrameHeader> d = wire::DecodeHeader(hdr);
  if (!d.ok()) {
    Add(counters_.protocol_errors, 1);
    *h = wire::FrameHeader();
    return d.status();
  }
  *h = *d;
  switch (h->type) {
    case wire::FrameType::kPing:
    case wire::FrameType::kReadRequest:
    case wire::FrameType::kWriteRequest:
    case wire::FrameType::kPrefetchRequest:
    case wire::FrameType::kReleaseRequest:
    case wire::FrameType::kHintRequest:
    case wire::FrameType::kAcquireRequest:
    case wire::FrameType::kWriteBeginRequest:
    case wire::FrameType::kWriteCommitRequest:
    case wire::FrameType::kRdmaConnectRequest:
      return absl::OkStatus();
    default:
      Add(counters_.protocol_errors, 1);
      return absl::InvalidArgumentError(absl::StrCat(
          "data plane: a storage node does not accept frame type ",
          static_cast<int>(h->type)));
  }
}

absl::Status FrameHandler::ParseOps(absl::Span<const uint8_t> table,
                                    Request* request) {
  const wire::FrameHeader& h = request->header;
  if (table.size() != OpTableBytes(h)) {
    Add(counters_.protocol_errors, 1);
    return absl::InvalidArgumentError("data plane: op table size mismatch");
  }
  std::vector<wire::OpDesc>& ops = request->ops;
  ops.resize(h.op_count);
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i] = wire::DecodeOp(table.data() + i * wire::kOpBytes);
  }
  absl::Status s = wire::ValidateOps(h, ops);
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return s;
  }
  // Only a commit's status field means something (commit or abort).
  if (h.type != wire::FrameType::kWriteCommitRequest) {
    for (wire::OpDesc& op : ops) op.status = 0;
  }
  return absl::OkStatus();
}

absl::Status FrameHandler::ParseCapabilities(absl::Span<const uint8_t> table,
                                             Request* request) {
  std::vector<wire::OpDesc>& ops = request->ops;
  absl::Status s;
  if (table.size() != ops.size() * wire::kCapBytes) {
    s = absl::InvalidArgumentError("size mismatch");
  }
  for (size_t i = 0; s.ok() && i < ops.size(); ++i) {
    absl::StatusOr<wire::Capability> c =
        wire::DecodeCapability(table.data() + i * wire::kCapBytes);
    if (c.ok()) {
      ops[i].cap = *c;
    } else {
      s = c.status();
    }
  }
  if (!s.ok()) {
    Add(counters_.protocol_errors, 1);
    return absl::Status(
        s.code(), absl::StrCat("bad capability table: ", s.message()));
  }
  return absl::OkStatus();
}

void FrameHandler::Authorize(Request* request, absl::Time deadline) {
  const wire::FrameHeader& h = request->header;
  std::vector<wire::OpDesc>& ops = request->ops;
  if (!wire::CarriesCapabilities(h.type) ||
      skip_capability_checks_for_test_.load(std::memory_order_relaxed)) {
    return;
  }
  uint8_t rights = h.type == wire::FrameType::kWriteRequest ||
                           h.type == wire::FrameType::kWriteBeginRequest
                       ? wire::kCapWrite
                       : wire::kCapRead;
  CapabilityVerifier::Snapshot id = options_.capabilities->Current();
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  auto check = [&](wire::OpDesc& op) {
    // A queue pair may be granted by a read or a write capability.
    if (h.type == wire::FrameType::kRdmaConnectRequest) {
      rights = op.cap.rights == wire::kCapWrite ? wire::kCapWrite
                                                : wire::kCapRead;
    }
    return id.Check(op, rights, now_ms);
  };
  std::vector<bool> failed(ops.size());
  bool denied = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    failed[i] = !check(ops[i]).ok();
    denied = denied || failed[i];
  }
  // A registration in flight: the master may already grant under the
  // identity it sets. Wait for it (bounded) and check the refused ops
  // once more.
  if (denied &&
      options_.capabilities->WaitForIdentityChange(
          id, std::min(deadline, absl::Now() + kIdentityChangeWait))) {
    id = options_.capabilities->Current();
  }
  for (size_t i = 0; denied && i < ops.size(); ++i) {
    if (!failed[i]) continue;
    wire::OpDesc& op = ops[i];
    absl::Status c = check(op);
    if (c.ok()) continue;
    op.status = WireStatus(c);
    Add(counters_.denied_ops, 1);
    Add(counters_.rejected_ops, 1);
    VLOG(1) << "data server: op refused: " << c;
  }
}

Response FrameHandler::Handle(ConnState* cs, Request request,
                              absl::Time deadline) {
  const wire::FrameHeader& h = request.header;
  std::vector<wire::OpDesc>& ops = request.ops;
  switch (h.type) {
    case wire::FrameType::kPing:
      return OpsResponse(wire::FrameType::kPong, h.request_id, {});
    case wire::FrameType::kWriteCommitRequest:
      // The status field says commit (0) or abort; no capabilities: only
      // writes this connection began are found.
      return HandleWriteCommit(h, ops, deadline, cs);
    case wire::FrameType::kReadRequest:
      Authorize(&request, deadline);
      return HandleRead(h, ops, request.session, deadline);
    case wire::FrameType::kAcquireRequest:
      Authorize(&request, deadline);
      return HandleAcquire(h, ops, request.session, deadline, cs);
    case wire::FrameType::kPrefetchRequest:
    case wire::FrameType::kReleaseRequest:
      Authorize(&request, deadline);
      return HandleSession(h, ops, request.session, deadline, cs);
    case wire::FrameType::kHintRequest:
      Authorize(&request, deadline);
      return HandleHint(h, ops, request.hint);
    case wire::FrameType::kWriteBeginRequest:
      Authorize(&request, deadline);
      return HandleWriteBegin(h, ops, deadline, cs);
    default:
      // kWriteRequest (StartWrite), kRdmaConnectRequest (the server's), and
      // what ParseHeader refuses.
      Add(counters_.protocol_errors, 1);
      return Response::Error(
          h.request_id,
          absl::InvalidArgumentError(absl::StrCat(
              "data plane: frame type ", static_cast<int>(h.type),
              " is not served here")));
  }
}

// ---------------------------------------------------------------- writes

WriteStream FrameHandler::StartWrite(ConnState* cs, Request request,
                                     absl::Time deadline) {
  Authorize(&request, deadline);
  return WriteStream(this, cs, request, deadline);
}

WriteStream::WriteStream(FrameHandler* handler, ConnState* cs,
                         const Request& request, absl::Time deadline)
    : handler_(handler),
      cs_(cs),
      request_id_(request.header.request_id),
      ops_(request.ops),
      deadline_(deadline) {}

uint8_t* WriteStream::Begin(size_t i) {
  MemoryDevice* device = handler_->options_.device;
  DataServerCounters& counters_ = handler_->counters_;
  wire::OpDesc& op = ops_[i];
  absl::Status held = op.status != 0
                          ? absl::Status(wire::FromWireCode(op.status),
                                         "refused (capability)")
                          : CheckNotHeld(cs_->writes, cs_->reads, KeyOf(op));
  absl::StatusOr<ExtentTable::WriteTicket> ticket =
      held.ok() ? handler_->options_.extents->BeginWrite(KeyOf(op), deadline_)
                : absl::StatusOr<ExtentTable::WriteTicket>(held);
  absl::Status st = ticket.status();
  WriteView view;
  if (st.ok()) {
    absl::StatusOr<WriteView> v =
        device->BeginWrite(op.region_id, op.addr, op.length, op.generation);
    if (v.ok()) {
      view = *v;
    } else {
      st = v.status();
      ticket->Abort();
    }
  }
  if (!st.ok()) {
    // Rejected: the caller skips its bytes to stay in step with the stream.
    if (op.status == 0) {
      op.status = WireStatus(st);
      Add(counters_.rejected_ops, 1);
    }
    return nullptr;
  }
  ticket_ = std::move(*ticket);
  view_ = view;
  begun_ = true;
  return view_.data;
}

void WriteStream::Commit(size_t i) {
  MemoryDevice* device = handler_->options_.device;
  DataServerCounters& counters_ = handler_->counters_;
  wire::OpDesc& op = ops_[i];
  begun_ = false;
  absl::Status st = device->CommitWrite(view_);
  if (st.ok()) {
    st = ticket_.Commit();
  } else {
    ticket_.Abort();
  }
  view_ = WriteView();
  if (st.ok()) {
    Add(counters_.write_ops, 1);
    Add(counters_.bytes_written, op.length);
    Add(counters_.tcp_bytes_written, op.length);
  } else {
    op.status = WireStatus(st);
    Add(counters_.rejected_ops, 1);
  }
}

void WriteStream::Abort() {
  if (!begun_) return;
  begun_ = false;
  handler_->options_.device->AbortWrite(view_);
  ticket_.Abort();
  view_ = WriteView();
}

Response WriteStream::Finish() {
  Abort();  // none begun (REQUIRES)
  return handler_->ReceiptResponse(wire::FrameType::kWriteResponse, request_id_,
                                   std::move(ops_));
}

// ---------------------------------------------------------------- the ops
// (moved from data_server.cc; socket-free)


Response FrameHandler::HandleSession(const wire::FrameHeader& h,
                                     std::vector<wire::OpDesc>& ops,
                                     uint64_t session, absl::Time deadline,
                                     ConnState* cs) {
  const bool prefetch = h.type == wire::FrameType::kPrefetchRequest;
  std::vector<absl::Status> st(ops.size());
  // A release ends this connection's holds first (direct reads); the rest
  // are dropped from the session's prefetch queue.
  std::vector<ExtentKey> keys;
  std::vector<size_t> index;
  std::vector<ExtentKey> held;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].status != 0) {  // refused (capability)
      st[i] = absl::Status(wire::FromWireCode(ops[i].status), "refused");
      continue;
    }
    const ExtentKey k = KeyOf(ops[i]);
    if (!prefetch && cs->reads.count(k) != 0 &&
        std::find_if(held.begin(), held.end(), [&](const ExtentKey& h) {
          return !KeyLess()(h, k) && !KeyLess()(k, h);
        }) == held.end()) {
      held.push_back(k);  // a repeated op goes on: NotFound, as before
      continue;
    }
    keys.push_back(k);
    index.push_back(i);
  }
  // The peer's access to the held objects ends before the holds do (then
  // their space may be reused).
  RevokeHolds(cs->rdma.get(), &cs->read_keys, held, deadline);
  for (const ExtentKey& k : held) cs->reads.erase(k);  // releases the object
  if (!keys.empty() || (!prefetch && ops.empty())) {
    std::vector<absl::Status> r;
    if (options_.kv == nullptr) {
      r.assign(keys.size(), absl::UnimplementedError(
                                "storage node: no prefetch manager"));
    } else if (prefetch) {
      r = options_.kv->Prefetch(session, keys);
    } else {
      r = options_.kv->Release(session, keys);
    }
    for (size_t k = 0; k < keys.size(); ++k) st[index[k]] = r[k];
  }
  for (size_t i = 0; i < ops.size(); ++i) ops[i].status = WireStatus(st[i]);
  return OpsResponse(prefetch ? wire::FrameType::kPrefetchResponse
                              : wire::FrameType::kReleaseResponse,
                     h.request_id, std::move(ops));
}

Response FrameHandler::HandleHint(const wire::FrameHeader& h,
                                  std::vector<wire::OpDesc>& ops,
                                  const wire::HintTimes& times) {
  std::vector<ExtentKey> keys;
  std::vector<size_t> index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].status != 0) continue;  // refused (capability)
    keys.push_back(KeyOf(ops[i]));
    index.push_back(i);
  }
  if (!keys.empty()) {
    std::vector<absl::Status> r;
    if (options_.kv == nullptr) {
      r.assign(keys.size(),
               absl::UnimplementedError("storage node: no prefetch manager"));
    } else {
      r = options_.kv->HintTurn(keys, absl::Milliseconds(times.expected_in_ms),
                                absl::Milliseconds(times.hold_ms));
    }
    for (size_t k = 0; k < keys.size(); ++k) {
      ops[index[k]].status = WireStatus(r[k]);
    }
  }
  return OpsResponse(wire::FrameType::kHintResponse, h.request_id,
                     std::move(ops));
}

Response FrameHandler::HandleAcquire(const wire::FrameHeader& h,
                                     std::vector<wire::OpDesc>& ops,
                                     uint64_t session, absl::Time deadline,
                                     ConnState* cs) {
  std::vector<wire::AreaRef> refs(ops.size());
  if (options_.kv == nullptr || areas_.empty()) {
    for (auto& op : ops) {
      if (op.status != 0) continue;
      op.status = WireStatus(absl::UnimplementedError(
          "storage node: no direct access to this device's memory"));
    }
  } else {
    if (session == 0) {
      if (cs->own_session == 0) {
        // Distinct from clients' random ids in practice; only this
        // connection uses it.
        cs->own_session = (uint64_t{1} << 63) |
                          next_conn_session_.fetch_add(1, std::memory_order_relaxed);
      }
      session = cs->own_session;
    }
    bool holding = false;
    // RDMA: the objects newly held, whose ranges this queue pair's peer is
    // granted once the loop is done (one batch of window binds).
    std::vector<RdmaConnection::Range> grant;
    std::vector<size_t> granted;
    for (size_t i = 0; i < ops.size(); ++i) {
      wire::OpDesc& op = ops[i];
      if (op.status != 0) continue;  // refused (capability)
      const ExtentKey key = KeyOf(op);
      auto held = cs->reads.find(key);
      if (held != cs->reads.end()) {
        // Acquired again on this connection: the same hold.
        auto loc = LocateInAreas(areas_, held->second.data(), op.length);
        refs[i].area = loc->first;
        refs[i].offset = loc->second;
        if (auto k = cs->read_keys.find(key); k != cs->read_keys.end()) {
          refs[i].rkey = k->second;
        }
        holding = true;
        continue;
      }
      // Staged through the session: queued now unless the load hinted it
      // (a repeated hint costs nothing). Only a request holding nothing may
      // wait, as for session reads.
      absl::Status hint = options_.kv->Prefetch(session, {key})[0];
      if (!hint.ok()) {
        op.status = WireStatus(hint);
        if (hint.code() == absl::StatusCode::kNotFound) {
          Add(counters_.stale_reads, 1);
        } else {
          Add(counters_.rejected_ops, 1);
        }
        continue;
      }
      absl::StatusOr<KvManager::StagedRead> r =
          holding ? options_.kv->AcquireReadIfStaged(session, key)
                  : options_.kv->AcquireRead(session, key, deadline);
      if (holding && r.status().code() == absl::StatusCode::kUnavailable) {
        for (size_t k = i; k < ops.size(); ++k) {
          ops[k].status = WireStatus(absl::AbortedError("not staged yet"));
        }
        break;
      }
      if (!r.ok()) {
        op.status = WireStatus(r.status());
        Add(counters_.rejected_ops, 1);
        continue;
      }
      auto loc = LocateInAreas(areas_, r->data(), op.length);
      if (!loc.ok()) {
        op.status = WireStatus(absl::InternalError(
            "storage node: staged copy outside the exposed memory"));
        Add(counters_.rejected_ops, 1);
        continue;  // `r` releases
      }
      refs[i].area = loc->first;
      refs[i].offset = loc->second;
      if (cs->rdma != nullptr) {
        grant.push_back({r->data(), op.length, /*write=*/false});
        granted.push_back(i);
      }
      cs->reads.emplace(key, std::move(*r));
      holding = true;
      Add(counters_.direct_acquired_ops, 1);
      Add(cs->rdma != nullptr ? counters_.rdma_bytes_read
                              : counters_.shm_bytes_read,
          op.length);
    }
    // Not reachable: not held either.
    for (size_t i : GrantHolds(cs->rdma.get(), grant, granted, deadline, ops,
                               refs, &cs->read_keys)) {
      cs->reads.erase(KeyOf(ops[i]));
      Add(counters_.rejected_ops, 1);
    }
  }
  return AreaRefResponse(wire::FrameType::kAcquireResponse, h.request_id,
                         std::move(ops), refs);
}

Response FrameHandler::HandleWriteBegin(const wire::FrameHeader& h,
                                        std::vector<wire::OpDesc>& ops,
                                        absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  std::vector<wire::AreaRef> refs(ops.size());
  std::vector<RdmaConnection::Range> grant;
  std::vector<size_t> granted;
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::OpDesc& op = ops[i];
    if (op.status != 0) continue;  // refused (capability)
    const ExtentKey key = KeyOf(op);
    absl::Status st;
    if (areas_.empty()) {
      st = absl::UnimplementedError(
          "storage node: no direct access to this device's memory");
    } else if (cs->writes.count(key) != 0) {
      st = absl::AlreadyExistsError("write already begun on this connection");
    } else {
      st = CheckNotHeld(cs->writes, cs->reads, key);
    }
    absl::StatusOr<ExtentTable::WriteTicket> ticket =
        st.ok() ? options_.extents->BeginWrite(key, deadline)
                : absl::StatusOr<ExtentTable::WriteTicket>(st);
    WriteView view;
    if (ticket.ok()) {
      absl::StatusOr<WriteView> v =
          device->BeginWrite(op.region_id, op.addr, op.length, op.generation);
      if (v.ok()) {
        auto loc = LocateInAreas(areas_, v->data, op.length);
        if (loc.ok()) {
          view = *v;
          refs[i].area = loc->first;
          refs[i].offset = loc->second;
        } else {
          device->AbortWrite(*v);
          st = absl::UnimplementedError(
              "storage node: write destination outside the exposed memory");
        }
      } else {
        st = v.status();
      }
    } else {
      st = ticket.status();
    }
    if (!st.ok()) {
      op.status = WireStatus(st);
      Add(counters_.rejected_ops, 1);
      continue;  // `ticket` aborts
    }
    if (cs->rdma != nullptr) {
      grant.push_back({view.data, op.length, /*write=*/true});
      granted.push_back(i);
    }
    cs->writes.emplace(key, ConnState::WriteHold{std::move(*ticket), view});
  }
  // Each reserved destination is opened, for writing only, to this queue
  // pair's peer; one that cannot be is aborted.
  for (size_t i : GrantHolds(cs->rdma.get(), grant, granted, deadline, ops,
                             refs, &cs->write_keys)) {
    auto it = cs->writes.find(KeyOf(ops[i]));
    device->AbortWrite(it->second.view);
    it->second.ticket.Abort();
    cs->writes.erase(it);
    Add(counters_.rejected_ops, 1);
  }
  return AreaRefResponse(wire::FrameType::kWriteBeginResponse, h.request_id,
                         std::move(ops), refs);
}

Response FrameHandler::HandleWriteCommit(const wire::FrameHeader& h,
                                         std::vector<wire::OpDesc>& ops,
                                         absl::Time deadline, ConnState* cs) {
  MemoryDevice* device = options_.device;
  {
    // The peer's write access ends before the bytes are committed (or the
    // space given back): nothing changes a committed object.
    std::vector<ExtentKey> held;
    for (const wire::OpDesc& op : ops) held.push_back(KeyOf(op));
    RevokeHolds(cs->rdma.get(), &cs->write_keys, held, deadline);
  }
  for (wire::OpDesc& op : ops) {
    const bool commit = op.status == 0;
    auto it = cs->writes.find(KeyOf(op));
    if (it == cs->writes.end()) {
      op.status = WireStatus(
          absl::NotFoundError("no write begun for this allocation"));
      continue;
    }
    ConnState::WriteHold hold = std::move(it->second);
    cs->writes.erase(it);
    absl::Status st;
    if (!commit) {
      device->AbortWrite(hold.view);
      hold.ticket.Abort();
      st = absl::CancelledError("write aborted by the client");
    } else {
      st = device->CommitWrite(hold.view);
      if (st.ok()) {
        st = hold.ticket.Commit();
      } else {
        hold.ticket.Abort();
      }
    }
    op.status = WireStatus(st);
    if (st.ok()) {
      Add(counters_.direct_write_ops, 1);
      Add(counters_.write_ops, 1);
      Add(counters_.bytes_written, op.length);
      Add(cs->rdma != nullptr ? counters_.rdma_bytes_written
                              : counters_.shm_bytes_written,
          op.length);
    } else if (commit) {
      Add(counters_.rejected_ops, 1);
    }
  }
  return ReceiptResponse(wire::FrameType::kWriteCommitResponse, h.request_id,
                         std::move(ops));
}

void FrameHandler::EndConnection(ConnState* cs) {
  // The queue pair's grants end (and the queue pair with them) before the
  // holds do.
  cs->rdma.reset();
  cs->read_keys.clear();
  cs->write_keys.clear();
  for (auto& [key, hold] : cs->writes) {
    options_.device->AbortWrite(hold.view);
    hold.ticket.Abort();
  }
  cs->writes.clear();
  cs->reads.clear();  // releases the held objects
  if (cs->own_session != 0 && options_.kv != nullptr) {
    options_.kv->Release(cs->own_session, {});
  }
}

Response FrameHandler::HandleRead(const wire::FrameHeader& h,
                                  std::vector<wire::OpDesc>& ops,
                                  uint64_t session, absl::Time deadline) {
  MemoryDevice* device = options_.device;
  std::vector<ExtentTable::ReadPin> pins(ops.size());
  std::vector<ReadView> views(ops.size());
  std::vector<KvManager::StagedRead> staged(ops.size());
  uint64_t payload = 0;
  uint64_t ok_ops = 0;
  uint64_t staged_ops = 0;
  bool holding = false;  // a staged object of this request is held
  std::vector<ExtentKey> plain_reads;  // read without a session
  for (size_t i = 0; i < ops.size(); ++i) {
    wire::OpDesc& op = ops[i];
    if (op.status != 0) continue;  // refused (capability)
    if (session != 0 && options_.kv != nullptr) {
      // Prefetched by the session: its staged copy. Only a request holding
      // no staged object waits for one; otherwise the rest of the request
      // is answered ABORTED (asked again), so that requests holding part of
      // the window never wait for each other. Anything not prefetched (not
      // hinted, dropped as stale) is read the ordinary way below.
      absl::StatusOr<KvManager::StagedRead> r =
          holding ? options_.kv->AcquireReadIfStaged(session, KeyOf(op))
                  : options_.kv->AcquireRead(session, KeyOf(op), deadline);
      if (holding && r.status().code() == absl::StatusCode::kUnavailable) {
        for (size_t k = i; k < ops.size(); ++k) {
          ops[k].status = WireStatus(absl::AbortedError("not staged yet"));
        }
        break;
      }
      if (r.ok()) {
        holding = true;
        staged[i] = std::move(*r);
        payload += op.length;
        ++ok_ops;
        ++staged_ops;
        continue;
      }
      if (r.status().code() != absl::StatusCode::kNotFound) {
        op.status = WireStatus(r.status());
        Add(counters_.rejected_ops, 1);
        if (r.status().code() == absl::StatusCode::kDataLoss) {
          options_.extents->Drop(KeyOf(op));  // as below
        }
        continue;
      }
    }
    absl::StatusOr<ExtentTable::ReadPin> pin =
        options_.extents->PinRead(KeyOf(op));
    if (!pin.ok()) {
      op.status = WireStatus(pin.status());
      if (pin.status().code() == absl::StatusCode::kNotFound) {
        Add(counters_.stale_reads, 1);
      } else {
        Add(counters_.rejected_ops, 1);
      }
      continue;
    }
    absl::StatusOr<ReadView> view =
        device->AcquireRead(op.region_id, op.addr, op.length);
    if (!view.ok()) {
      op.status = WireStatus(view.status());
      Add(counters_.rejected_ops, 1);
      // The object's bytes are gone for good (a checksum mismatch): forget
      // it, so the master's next reconciliation drops its listing (the
      // reader reports it at once).
      if (view.status().code() == absl::StatusCode::kDataLoss) {
        options_.extents->Drop(KeyOf(op));
      }
      continue;  // `pin` releases
    }
    pins[i] = std::move(*pin);
    views[i] = *view;
    payload += op.length;
    ++ok_ops;
    if (options_.kv != nullptr) plain_reads.push_back(KeyOf(op));
  }
  // A think-time hinted object read without a session (a load small enough
  // for one read sends no prefetch list) was read from its staged copy:
  // its hint is done.
  if (!plain_reads.empty()) options_.kv->EndHintsOfReads(plain_reads);

  Response r;
  r.header_.type = wire::FrameType::kReadResponse;
  r.header_.request_id = h.request_id;
  r.header_.payload_bytes = payload;
  r.ops_ = std::move(ops);
  r.Encode({});
  r.iov_.reserve(r.ops_.size() + 1);
  for (size_t i = 0; i < r.ops_.size(); ++i) {
    if (staged[i].valid()) {
      r.iov_.push_back({const_cast<uint8_t*>(staged[i].data()),
                        static_cast<size_t>(staged[i].length())});
      continue;
    }
    if (views[i].data == nullptr) continue;
    r.iov_.push_back({const_cast<uint8_t*>(views[i].data),
                      static_cast<size_t>(views[i].length)});
  }
  // Counted before sending so that a client that has its answer sees them.
  Add(counters_.read_ops, ok_ops);
  Add(counters_.staged_read_ops, staged_ops);
  Add(counters_.bytes_read, payload);
  // Held until the response is sent (~Response: device views end before
  // the extent pins that protect them; then the staged copies are released
  // on the node, and the sessions stage their next objects).
  r.device_ = device;
  r.views_ = std::move(views);
  r.pins_ = std::move(pins);
  r.staged_ = std::move(staged);
  return r;
}

}  // namespace hymcache::storage
