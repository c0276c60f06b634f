#include "client/tcp_transport.h"

#include "absl/strings/string_view.h"
#include "client/frame_io.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/wire.h"

namespace hymcache {
namespace {

using wire::FrameHeader;
using wire::FrameType;
using wire::OpDesc;

using frame_io::RecvReceipts;
using frame_io::RecvResponse;
using frame_io::SendRequest;
using frame_io::ToOp;

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TcpTransportOptions& options)
      : options_(options) {}

  absl::string_view name() const override { return "tcp"; }

  std::vector<absl::Status> Read(const PeerInfo& peer,
                                 absl::Span<const ReadOp> ops,
                                 absl::Time deadline) override {
    return ReadSession(peer, 0, ops, deadline);
  }

  std::vector<absl::Status> ReadSession(const PeerInfo& peer,
                                        uint64_t session,
                                        absl::Span<const ReadOp> ops,
                                        absl::Time deadline) override {
    // Session reads are not split by bytes: a frame may answer a suffix
    // Aborted (not staged yet), and the next frame would read past that gap.
    // Their callers bound them already (ClientOptions::read_batch_bytes).
    return InFrames(peer, ops,
                    session == 0 ? options_.max_read_frame_bytes : 0,
                    deadline,
                    [this, session](Socket& s, absl::Span<const ReadOp> o,
                                    absl::Span<absl::Status> st,
                                    absl::Time d, bool* started) {
                      return ReadFrame(s, session, o, st, d, started);
                    });
  }

  std::vector<absl::Status> Prefetch(const PeerInfo& peer, uint64_t session,
                                     absl::Span<const RemoteRef> refs,
                                     absl::Time deadline) override {
    return InFrames(peer, refs, /*max_frame_bytes=*/0, deadline,
                    [this, session](Socket& s, absl::Span<const RemoteRef> r,
                                    absl::Span<absl::Status> st,
                                    absl::Time d, bool* started) {
                      return SessionFrame(s, FrameType::kPrefetchRequest,
                                          session, r, st, d, started);
                    });
  }

  absl::Status Release(const PeerInfo& peer, uint64_t session,
                       absl::Span<const RemoteRef> refs,
                       absl::Time deadline) override {
    if (refs.empty()) {
      // One frame with no ops: release everything.
      std::vector<absl::Status> st;
      return RunBatch(peer, deadline, absl::MakeSpan(st),
                      [&](Socket& s, absl::Span<absl::Status> out,
                          bool* started) {
                        return SessionFrame(s, FrameType::kReleaseRequest,
                                            session, refs, out, deadline,
                                            started);
                      });
    }
    std::vector<absl::Status> st = InFrames(
        peer, refs, /*max_frame_bytes=*/0, deadline,
        [this, session](Socket& s, absl::Span<const RemoteRef> r,
                        absl::Span<absl::Status> out, absl::Time d,
                        bool* started) {
          return SessionFrame(s, FrameType::kReleaseRequest, session, r, out,
                              d, started);
        });
    for (const absl::Status& s : st) {
      // NotFound: already read or dropped by the node; nothing to release.
      if (!s.ok() && s.code() != absl::StatusCode::kNotFound) return s;
    }
    return absl::OkStatus();
  }

  std::vector<absl::Status> HintTurn(const PeerInfo& peer,
                                     absl::Span<const RemoteRef> refs,
                                     const wire::HintTimes& times,
                                     absl::Time deadline) override {
    uint8_t payload[wire::kHintTimesBytes];
    wire::EncodeHintTimes(times, payload);
    return InFrames(peer, refs, /*max_frame_bytes=*/0, deadline,
                    [this, &payload](Socket& s, absl::Span<const RemoteRef> r,
                                     absl::Span<absl::Status> st, absl::Time d,
                                     bool* started) {
                      return ControlFrame(s, FrameType::kHintRequest,
                                          FrameType::kHintResponse, payload, r,
                                          st, d, started);
                    });
  }

  std::vector<absl::Status> Write(const PeerInfo& peer,
                                  absl::Span<const WriteOp> ops,
                                  absl::Time deadline) override {
    return InFrames(peer, ops, /*max_frame_bytes=*/0, deadline,
                    [this](Socket& s, absl::Span<const WriteOp> o,
                           absl::Span<absl::Status> st, absl::Time d,
                           bool* started) {
                      return WriteFrame(s, o, st, d, started);
                    });
  }

 private:
  // Sends `ops` in frames of at most wire::kMaxOps ops and, when
  // `max_frame_bytes` > 0, at most that many payload bytes (a larger op goes
  // alone), one exchange per frame in turn (`frame` runs one exchange).
  // After a connection failure the remaining frames are not tried: they
  // carry that failure.
  template <typename Op, typename Frame>
  std::vector<absl::Status> InFrames(const PeerInfo& peer,
                                     absl::Span<const Op> ops,
                                     uint64_t max_frame_bytes,
                                     absl::Time deadline, Frame frame) {
    std::vector<absl::Status> out(ops.size());
    size_t i = 0;
    while (i < ops.size()) {
      size_t n = std::min<size_t>(ops.size() - i, wire::kMaxOps);
      if (max_frame_bytes > 0) {
        uint64_t bytes = PayloadBytes(ops[i]);
        size_t k = 1;
        while (k < n && bytes + PayloadBytes(ops[i + k]) <= max_frame_bytes) {
          bytes += PayloadBytes(ops[i + k]);
          ++k;
        }
        n = k;
      }
      absl::Status conn =
          RunBatch(peer, deadline, absl::MakeSpan(out).subspan(i, n),
                   [&](Socket& s, absl::Span<absl::Status> st,
                       bool* response_started) {
                     return frame(s, ops.subspan(i, n), st, deadline,
                                  response_started);
                   });
      i += n;
      if (!conn.ok()) {
        for (size_t k = i; k < ops.size(); ++k) out[k] = conn;
        break;
      }
    }
    return out;
  }

  static uint64_t PayloadBytes(const ReadOp& op) { return op.src.length; }
  static uint64_t PayloadBytes(const RemoteRef&) { return 0; }
  static uint64_t PayloadBytes(const WriteOp& op) { return op.dst.length; }

  // Runs one frame exchange on a pooled or new connection. A pooled
  // connection the peer closed while idle fails before any response byte
  // arrives; then the frame is retried once on a fresh connection (the peer
  // never saw it, so this cannot apply anything twice). Returns OK when the
  // exchange completed (per-op results are in `statuses`), else the
  // connection failure, which every unfinished op also carries.
  template <typename Fn>
  absl::Status RunBatch(const PeerInfo& peer, absl::Time deadline,
                absl::Span<absl::Status> statuses, Fn&& fn) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool pooled = false;
      auto sock = Take(peer.data_address, deadline, &pooled);
      if (!sock.ok()) {
        for (auto& s : statuses) s = sock.status();
        return sock.status();
      }
      bool response_started = false;
      absl::Status st = fn(*sock, statuses, &response_started);
      if (st.ok()) {
        Give(peer.data_address, std::move(*sock));
        return st;
      }
      // The connection is in an unknown state: drop it.
      if (pooled && !response_started &&
          st.code() == absl::StatusCode::kUnavailable && attempt == 0) {
        continue;
      }
      // Ops not completed before the failure carry it.
      for (auto& s : statuses) {
        if (ReasonOf(s) == StatusReason::kNotAttempted) {
          s = st;
        }
      }
      return st;
    }
    return absl::InternalError("unreachable");
  }

  // What every op of an exchange holds until its answer arrives; ops still
  // holding it when the exchange fails take the exchange's error.
  static absl::Status NotAttempted() {
    return WithReason(absl::AbortedError("not attempted"),
                      StatusReason::kNotAttempted);
  }

  // A prefetch or release exchange. Returns OK when the connection is still
  // in sync (reusable).
  absl::Status SessionFrame(Socket& s, FrameType type, uint64_t session,
                            absl::Span<const RemoteRef> refs,
                            absl::Span<absl::Status> statuses,
                            absl::Time deadline, bool* response_started) {
    uint8_t sid[wire::kSessionBytes];
    wire::EncodeSession(session, sid);
    const FrameType want = type == FrameType::kPrefetchRequest
                               ? FrameType::kPrefetchResponse
                               : FrameType::kReleaseResponse;
    return ControlFrame(s, type, want, sid, refs, statuses, deadline,
                        response_started);
  }

  // A request of `refs` with a small `payload`, answered by a `want` frame
  // with a status per ref. Returns OK when the connection is still in sync
  // (reusable).
  absl::Status ControlFrame(Socket& s, FrameType type, FrameType want,
                            absl::Span<uint8_t> payload,
                            absl::Span<const RemoteRef> refs,
                            absl::Span<absl::Status> statuses,
                            absl::Time deadline, bool* response_started) {
    std::vector<OpDesc> descs;
    descs.reserve(refs.size());
    for (const RemoteRef& r : refs) descs.push_back(ToOp(r));
    for (auto& st : statuses) st = NotAttempted();
    uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    std::vector<iovec> iov = {{payload.data(), payload.size()}};
    RETURN_IF_ERROR(
        SendRequest(s, type, descs, payload.size(), iov, id, deadline));
    auto resp = RecvResponse(s, want, id, refs.size(), deadline,
                             response_started);
    if (!resp.ok()) return resp.status();
    for (size_t i = 0; i < refs.size(); ++i) {
      uint32_t code = resp->second[i].status;
      statuses[i] = code == 0 ? absl::OkStatus()
                              : absl::Status(wire::FromWireCode(code),
                                             "storage node refused the hint");
    }
    return absl::OkStatus();
  }

  // Returns OK when the connection is still in sync (reusable).
  absl::Status ReadFrame(Socket& s, uint64_t session,
                         absl::Span<const ReadOp> ops,
                         absl::Span<absl::Status> statuses,
                         absl::Time deadline, bool* response_started) {
    std::vector<OpDesc> descs;
    descs.reserve(ops.size());
    for (const ReadOp& op : ops) descs.push_back(ToOp(op.src));
    for (auto& st : statuses) st = NotAttempted();
    uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    uint8_t sid[wire::kSessionBytes];
    wire::EncodeSession(session, sid);
    std::vector<iovec> payload;
    if (session != 0) payload.push_back({sid, sizeof(sid)});
    RETURN_IF_ERROR(SendRequest(s, FrameType::kReadRequest, descs,
                                session != 0 ? sizeof(sid) : 0, payload, id,
                                deadline));
    auto resp = RecvResponse(s, FrameType::kReadResponse, id, ops.size(),
                             deadline, response_started);
    if (!resp.ok()) return resp.status();
    auto& got = resp->second;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (got[i].length != descs[i].length || got[i].addr != descs[i].addr) {
        return absl::UnavailableError("storage node answered out of protocol");
      }
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      if (got[i].status != 0) {
        absl::StatusCode code = wire::FromWireCode(got[i].status);
        statuses[i] = absl::Status(
            code, absl::StrCat("storage node refused read of region ",
                               descs[i].region_id, " addr ", descs[i].addr,
                               " generation ", descs[i].generation));
        continue;
      }
      absl::Status st =
          RecvAll(s.fd(), ops[i].dst, descs[i].length, deadline);
      if (!st.ok()) return st;
      statuses[i] = absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status WriteFrame(Socket& s, absl::Span<const WriteOp> ops,
                          absl::Span<absl::Status> statuses,
                          absl::Time deadline, bool* response_started) {
    std::vector<OpDesc> descs;
    std::vector<iovec> iov;
    uint64_t payload = 0;
    for (const WriteOp& op : ops) {
      descs.push_back(ToOp(op.dst));
      iov.push_back({const_cast<void*>(op.src), op.dst.length});
      payload += op.dst.length;
    }
    for (auto& st : statuses) st = NotAttempted();
    uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    RETURN_IF_ERROR(SendRequest(s, FrameType::kWriteRequest, descs,
                                       payload, iov, id, deadline));
    auto resp = RecvResponse(s, FrameType::kWriteResponse, id, ops.size(),
                             deadline, response_started);
    if (!resp.ok()) return resp.status();
    std::vector<wire::Receipt*> receipts;
    receipts.reserve(ops.size());
    for (const WriteOp& op : ops) receipts.push_back(op.receipt);
    RETURN_IF_ERROR(RecvReceipts(s, receipts, deadline));
    for (size_t i = 0; i < ops.size(); ++i) {
      uint32_t code = resp->second[i].status;
      statuses[i] =
          code == 0 ? absl::OkStatus()
                    : absl::Status(wire::FromWireCode(code),
                                   absl::StrCat("storage node refused write of region ",
                                                descs[i].region_id, " addr ",
                                                descs[i].addr));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Socket> Take(const std::string& address, absl::Time deadline,
                              bool* pooled) {
    {
      MutexLock l(&mu_);
      auto it = idle_.find(address);
      if (it != idle_.end() && !it->second.empty()) {
        Socket s = std::move(it->second.back());
        it->second.pop_back();
        *pooled = true;
        return s;
      }
    }
    *pooled = false;
    return ConnectTcp(address, deadline);
  }

  void Give(const std::string& address, Socket s) {
    MutexLock l(&mu_);
    auto& pool = idle_[address];
    if (static_cast<int>(pool.size()) < options_.max_idle_per_peer) {
      pool.push_back(std::move(s));
    }
  }

  const TcpTransportOptions options_;
  std::atomic<uint64_t> next_id_{1};

  Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Socket>> idle_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewTcpTransport(const TcpTransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace hymcache
