#include "client/direct_transport.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/frame_io.h"
#include "client/tcp_transport.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace hymcache {
namespace {

using frame_io::OpStatus;
using frame_io::RecvReceipts;
using frame_io::RecvResponse;
using frame_io::SendRequest;
using frame_io::ToOp;
using wire::FrameType;
using wire::OpDesc;

class DirectTransport : public Transport {
 public:
  DirectTransport(std::unique_ptr<DirectMover> mover,
                  const DirectTransportOptions& options)
      : mover_(std::move(mover)),
        options_(options),
        hints_(NewTcpTransport({.max_idle_per_peer = options.max_idle_per_peer})) {}

  absl::string_view name() const override { return mover_->name(); }

  absl::Status CanReach(const PeerInfo& peer) override {
    return mover_->Usable(peer);
  }

  absl::Status RegisterMemory(void* data, size_t size) override {
    return mover_->RegisterMemory(data, size);
  }
  absl::Status UnregisterMemory(void* data) override {
    return mover_->UnregisterMemory(data);
  }

  std::vector<absl::Status> Read(const PeerInfo& peer,
                                 absl::Span<const ReadOp> ops,
                                 absl::Time deadline) override {
    return ReadSession(peer, 0, ops, deadline);
  }

  // Never returns Aborted: ops the node had not staged yet are asked for
  // again until the deadline.
  std::vector<absl::Status> ReadSession(const PeerInfo& peer, uint64_t session,
                                        absl::Span<const ReadOp> ops,
                                        absl::Time deadline) override {
    std::vector<absl::Status> out(ops.size());
    size_t i = 0;
    while (i < ops.size()) {
      const size_t n = std::min<size_t>(ops.size() - i, wire::kMaxOps);
      absl::Span<absl::Status> st = absl::MakeSpan(out).subspan(i, n);
      for (absl::Status& x : st) x = absl::AbortedError("pending");
      absl::Status conn = ReadRound(peer, session, ops.subspan(i, n), st,
                                    deadline);
      if (!conn.ok()) {
        for (size_t k = i; k < ops.size(); ++k) {
          if (k >= i + n || out[k].code() == absl::StatusCode::kAborted) {
            out[k] = conn;
          }
        }
        return out;
      }
      // Served ops are done; an ABORTED suffix is asked for again.
      size_t done = 0;
      while (done < n && st[done].code() != absl::StatusCode::kAborted) ++done;
      if (done == 0) {
        // The node never aborts the first op; treat it as a failure.
        for (size_t k = i; k < ops.size(); ++k) {
          out[k] = absl::UnavailableError("storage node made no progress");
        }
        return out;
      }
      i += done;
    }
    return out;
  }

  std::vector<absl::Status> Write(const PeerInfo& peer,
                                  absl::Span<const WriteOp> ops,
                                  absl::Time deadline) override {
    if (!mover_->can_write()) return hints_->Write(peer, ops, deadline);
    std::vector<absl::Status> out(ops.size());
    for (size_t i = 0; i < ops.size(); i += wire::kMaxOps) {
      const size_t n = std::min<size_t>(ops.size() - i, wire::kMaxOps);
      absl::Status conn = WriteRound(peer, ops.subspan(i, n),
                                     absl::MakeSpan(out).subspan(i, n),
                                     deadline);
      if (!conn.ok()) {
        for (size_t k = i; k < ops.size(); ++k) {
          if (k >= i + n || out[k].ok()) out[k] = conn;
        }
        break;
      }
    }
    return out;
  }

  std::vector<absl::Status> Prefetch(const PeerInfo& peer, uint64_t session,
                                     absl::Span<const RemoteRef> refs,
                                     absl::Time deadline) override {
    return hints_->Prefetch(peer, session, refs, deadline);
  }

  std::vector<absl::Status> HintTurn(const PeerInfo& peer,
                                     absl::Span<const RemoteRef> refs,
                                     const wire::HintTimes& times,
                                     absl::Time deadline) override {
    return hints_->HintTurn(peer, refs, times, deadline);
  }

  absl::Status Release(const PeerInfo& peer, uint64_t session,
                       absl::Span<const RemoteRef> refs,
                       absl::Time deadline) override {
    return hints_->Release(peer, session, refs, deadline);
  }

 private:
  struct Conn {
    Socket sock;
    std::unique_ptr<DirectChannel> channel;
    // A release whose response has not been read yet (0: none): the next
    // exchange on this connection reads it first.
    uint64_t pending_release_id = 0;
    size_t pending_release_ops = 0;
  };

  // Reads the response of the connection's pending release, if any.
  static absl::Status DrainPending(Conn& c, absl::Time deadline) {
    if (c.pending_release_id == 0) return absl::OkStatus();
    bool started = false;
    auto rel = RecvResponse(c.sock, FrameType::kReleaseResponse,
                            c.pending_release_id, c.pending_release_ops,
                            deadline, &started);
    c.pending_release_id = 0;
    return rel.status();
  }

  // A pooled connection when `pooled_ok`, else a fresh one; sets *pooled.
  // `grant`: an op of the transfer, for a mover that must prove it may
  // open a channel.
  absl::StatusOr<Conn> Take(const PeerInfo& peer, const OpDesc& grant,
                            absl::Time deadline, bool pooled_ok, bool* pooled) {
    *pooled = false;
    if (pooled_ok) {
      MutexLock l(&mu_);
      auto it = idle_.find(peer.data_address);
      if (it != idle_.end() && !it->second.empty()) {
        Conn c = std::move(it->second.back());
        it->second.pop_back();
        *pooled = true;
        return c;
      }
    }
    RETURN_IF_ERROR(mover_->Usable(peer));
    Conn c;
    ASSIGN_OR_RETURN(c.sock, ConnectTcp(peer.data_address, deadline));
    ASSIGN_OR_RETURN(c.channel, mover_->Open(peer, c.sock, grant, deadline));
    return c;
  }

  void Give(const PeerInfo& peer, Conn c) {
    if (!c.channel->healthy()) return;
    MutexLock l(&mu_);
    auto& pool = idle_[peer.data_address];
    if (static_cast<int>(pool.size()) < options_.max_idle_per_peer) {
      pool.push_back(std::move(c));
    }
  }

  // A channel broke during Move: every op it carried failed (with Move's
  // status where it has one).
  static void FailMoved(const std::vector<absl::Status>& moved,
                        const std::vector<size_t>& seg_op,
                        absl::Span<absl::Status> st) {
    for (size_t k = 0; k < moved.size(); ++k) {
      st[seg_op[k]] = moved[k].ok()
                          ? absl::UnavailableError("direct transfer failed")
                          : moved[k];
    }
  }

  // Receives `n` AreaRefs.
  static absl::StatusOr<std::vector<wire::AreaRef>> RecvRefs(
      Socket& s, size_t n, absl::Time deadline) {
    std::vector<uint8_t> raw(n * wire::kAreaRefBytes);
    RETURN_IF_ERROR(RecvAll(s.fd(), raw.data(), raw.size(), deadline));
    std::vector<wire::AreaRef> refs(n);
    for (size_t i = 0; i < n; ++i) {
      refs[i] = wire::DecodeAreaRef(raw.data() + i * wire::kAreaRefBytes);
    }
    return refs;
  }

  struct Exchange {
    Conn conn;
    std::pair<wire::FrameHeader, std::vector<OpDesc>> resp;
    std::vector<wire::AreaRef> refs;
  };

  // The exchange that opens a round (acquire or write begin), whose
  // response carries one AreaRef per op. A pooled connection the node
  // closed while idle fails before any response byte: then the request is
  // sent again on a fresh connection (the node never saw it).
  absl::StatusOr<Exchange> FirstExchange(const PeerInfo& peer, FrameType type,
                                         FrameType want,
                                         absl::Span<const OpDesc> descs,
                                         uint64_t payload_bytes,
                                         absl::Span<const iovec> payload,
                                         absl::Time deadline) {
    absl::Status last;
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool pooled = false;
      ASSIGN_OR_RETURN(Conn c,
                       Take(peer, descs[0], deadline, attempt == 0, &pooled));
      const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
      bool started = false;
      // The request goes out before the previous release's answer is read:
      // the node answers in order, so both round trips overlap.
      absl::Status st = SendRequest(c.sock, type, descs, payload_bytes,
                                    payload, id, deadline);
      if (st.ok()) st = DrainPending(c, deadline);
      absl::StatusOr<std::pair<wire::FrameHeader, std::vector<OpDesc>>> resp;
      if (st.ok()) {
        resp = RecvResponse(c.sock, want, id, descs.size(), deadline, &started);
        st = resp.status();
      }
      if (st.ok()) {
        ASSIGN_OR_RETURN(std::vector<wire::AreaRef> refs,
                         RecvRefs(c.sock, descs.size(), deadline));
        return Exchange{std::move(c), *std::move(resp), std::move(refs)};
      }
      last = st;
      if (!(pooled && !started && st.code() == absl::StatusCode::kUnavailable)) {
        break;
      }
    }
    return last;
  }

  // Acquire, move, release for up to kMaxOps ops. Per-op results in `st`
  // (Aborted: not staged yet). Returns a connection failure, which the
  // ops without a result carry. A pooled connection found closed is not
  // retried: the node may have held objects for it (they are released).
  absl::Status ReadRound(const PeerInfo& peer, uint64_t session,
                         absl::Span<const ReadOp> ops,
                         absl::Span<absl::Status> st, absl::Time deadline) {
    std::vector<OpDesc> descs;
    descs.reserve(ops.size());
    for (const ReadOp& op : ops) descs.push_back(ToOp(op.src));
    uint8_t sid[wire::kSessionBytes];
    wire::EncodeSession(session, sid);
    const iovec payload[1] = {{sid, sizeof(sid)}};
    ASSIGN_OR_RETURN(
        Exchange ex,
        FirstExchange(peer, FrameType::kAcquireRequest,
                      FrameType::kAcquireResponse, descs, sizeof(sid), payload,
                      deadline));
    Conn& c = ex.conn;
    auto& resp = ex.resp;
    std::vector<wire::AreaRef>& refs = ex.refs;
    std::vector<DirectSegment> segs;
    std::vector<size_t> seg_op;
    std::vector<OpDesc> held;
    for (size_t i = 0; i < ops.size(); ++i) {
      const OpDesc& got = resp.second[i];
      if (got.addr != descs[i].addr || got.length != descs[i].length) {
        return absl::UnavailableError("storage node answered out of protocol");
      }
      st[i] = OpStatus(got, "read");
      if (!st[i].ok()) continue;
      segs.push_back(DirectSegment{false, refs[i].area, refs[i].offset,
                                   ops[i].dst, descs[i].length,
                                   refs[i].rkey});
      seg_op.push_back(i);
      held.push_back(descs[i]);
    }
    if (segs.empty()) {
      Give(peer, std::move(c));
      return absl::OkStatus();
    }
    std::vector<absl::Status> moved = c.channel->Move(segs, deadline);
    if (!c.channel->healthy()) {
      // Nothing is in flight any more (Move's contract); closing the
      // connection releases the holds.
      FailMoved(moved, seg_op, st);
      return absl::OkStatus();
    }
    // Release. The node drops a hold only on its release or when this
    // connection closes, so every hold lasted through the transfer that has
    // just finished: the bytes are the objects'. The release's response is
    // read by the next exchange on this connection (one round trip fewer
    // per transfer); if the connection dies first, closing it releases.
    const uint64_t rid = next_id_.fetch_add(1, std::memory_order_relaxed);
    absl::Status sent = SendRequest(c.sock, FrameType::kReleaseRequest, held,
                                    sizeof(sid), payload, rid, deadline);
    for (size_t k = 0; k < segs.size(); ++k) {
      if (!moved[k].ok()) st[seg_op[k]] = moved[k];
    }
    if (sent.ok()) {
      c.pending_release_id = rid;
      c.pending_release_ops = held.size();
      Give(peer, std::move(c));
    }
    return absl::OkStatus();
  }

  // Begin, move, commit for up to kMaxOps ops.
  absl::Status WriteRound(const PeerInfo& peer, absl::Span<const WriteOp> ops,
                          absl::Span<absl::Status> st, absl::Time deadline) {
    std::vector<OpDesc> descs;
    descs.reserve(ops.size());
    for (const WriteOp& op : ops) descs.push_back(ToOp(op.dst));
    bool started = false;
    ASSIGN_OR_RETURN(
        Exchange ex,
        FirstExchange(peer, FrameType::kWriteBeginRequest,
                      FrameType::kWriteBeginResponse, descs, 0, {}, deadline));
    Conn& c = ex.conn;
    auto& resp = ex.resp;
    std::vector<wire::AreaRef>& refs = ex.refs;
    std::vector<DirectSegment> segs;
    std::vector<size_t> seg_op;
    std::vector<OpDesc> begun;
    for (size_t i = 0; i < ops.size(); ++i) {
      st[i] = OpStatus(resp.second[i], "write");
      if (!st[i].ok()) continue;
      segs.push_back(DirectSegment{true, refs[i].area, refs[i].offset,
                                   const_cast<void*>(ops[i].src),
                                   descs[i].length, refs[i].rkey});
      seg_op.push_back(i);
      begun.push_back(descs[i]);
    }
    if (segs.empty()) {
      Give(peer, std::move(c));
      return absl::OkStatus();
    }
    std::vector<absl::Status> moved = c.channel->Move(segs, deadline);
    if (!c.channel->healthy()) {
      // Closing the connection aborts every begun write.
      FailMoved(moved, seg_op, st);
      return absl::OkStatus();
    }
    for (size_t k = 0; k < segs.size(); ++k) {
      // Non-zero status: abort this write.
      begun[k].status = moved[k].ok() ? 0 : wire::ToWireCode(moved[k].code());
    }
    const uint64_t cid = next_id_.fetch_add(1, std::memory_order_relaxed);
    RETURN_IF_ERROR(SendRequest(c.sock, FrameType::kWriteCommitRequest, begun,
                                0, {}, cid, deadline));
    ASSIGN_OR_RETURN(auto com,
                     RecvResponse(c.sock, FrameType::kWriteCommitResponse, cid,
                                  begun.size(), deadline, &started));
    std::vector<wire::Receipt*> receipts;
    receipts.reserve(segs.size());
    for (size_t i : seg_op) receipts.push_back(ops[i].receipt);
    RETURN_IF_ERROR(RecvReceipts(c.sock, receipts, deadline));
    for (size_t k = 0; k < segs.size(); ++k) {
      st[seg_op[k]] = !moved[k].ok() ? moved[k]
                                     : OpStatus(com.second[k], "write commit");
    }
    Give(peer, std::move(c));
    return absl::OkStatus();
  }

  const std::unique_ptr<DirectMover> mover_;
  const DirectTransportOptions options_;
  const std::unique_ptr<Transport> hints_;
  std::atomic<uint64_t> next_id_{1};

  Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Conn>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewDirectTransport(
    std::unique_ptr<DirectMover> mover, const DirectTransportOptions& options) {
  return std::make_unique<DirectTransport>(std::move(mover), options);
}

}  // namespace hymcache

namespace hymcache {
namespace {

class FirstReachableTransport : public Transport {
 public:
  explicit FirstReachableTransport(
      std::vector<std::unique_ptr<Transport>> candidates)
      : candidates_(std::move(candidates)) {}

  absl::string_view name() const override { return "auto"; }

  absl::Status CanReach(const PeerInfo& peer) override {
    return Pick(peer).status();
  }

  // Every candidate learns the memory (any of them may serve a node).
  absl::Status RegisterMemory(void* data, size_t size) override {
    for (size_t i = 0; i < candidates_.size(); ++i) {
      absl::Status s = candidates_[i]->RegisterMemory(data, size);
      if (!s.ok()) {
        for (size_t k = 0; k < i; ++k) {
          candidates_[k]->UnregisterMemory(data).IgnoreError();
        }
        return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status UnregisterMemory(void* data) override {
    absl::Status first;
    for (const auto& t : candidates_) {
      absl::Status s = t->UnregisterMemory(data);
      if (first.ok()) first = s;
    }
    return first;
  }

  std::vector<absl::Status> Read(const PeerInfo& peer,
                                 absl::Span<const ReadOp> ops,
                                 absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return std::vector<absl::Status>(ops.size(), t.status());
    return (*t)->Read(peer, ops, deadline);
  }
  std::vector<absl::Status> ReadSession(const PeerInfo& peer, uint64_t session,
                                        absl::Span<const ReadOp> ops,
                                        absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return std::vector<absl::Status>(ops.size(), t.status());
    return (*t)->ReadSession(peer, session, ops, deadline);
  }
  std::vector<absl::Status> Write(const PeerInfo& peer,
                                  absl::Span<const WriteOp> ops,
                                  absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return std::vector<absl::Status>(ops.size(), t.status());
    return (*t)->Write(peer, ops, deadline);
  }
  std::vector<absl::Status> Prefetch(const PeerInfo& peer, uint64_t session,
                                     absl::Span<const RemoteRef> refs,
                                     absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return std::vector<absl::Status>(refs.size(), t.status());
    return (*t)->Prefetch(peer, session, refs, deadline);
  }
  std::vector<absl::Status> HintTurn(const PeerInfo& peer,
                                     absl::Span<const RemoteRef> refs,
                                     const wire::HintTimes& times,
                                     absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return std::vector<absl::Status>(refs.size(), t.status());
    return (*t)->HintTurn(peer, refs, times, deadline);
  }
  absl::Status Release(const PeerInfo& peer, uint64_t session,
                       absl::Span<const RemoteRef> refs,
                       absl::Time deadline) override {
    auto t = Pick(peer);
    if (!t.ok()) return t.status();
    return (*t)->Release(peer, session, refs, deadline);
  }

 private:
  // Key of a peer's parameters: a node that restarts publishes new ones.
  static std::string ParamsKey(const PeerInfo& peer) {
    std::string k = peer.data_address;
    for (const auto& [name, value] : peer.params) {
      absl::StrAppend(&k, "|", name, "=", value);
    }
    return k;
  }

  absl::StatusOr<Transport*> Pick(const PeerInfo& peer) {
    const std::string key = ParamsKey(peer);
    {
      MutexLock l(&mu_);
      auto it = chosen_.find(peer.node_id);
      if (it != chosen_.end() && it->second.first == key) {
        return it->second.second;
      }
    }
    absl::Status first;
    for (const auto& t : candidates_) {
      absl::Status s = t->CanReach(peer);
      if (s.ok()) {
        MutexLock l(&mu_);
        chosen_[peer.node_id] = {key, t.get()};
        return t.get();
      }
      if (first.ok()) first = s;
    }
    return first.ok() ? absl::UnavailableError("no transport") : first;
  }

  const std::vector<std::unique_ptr<Transport>> candidates_;
  Mutex mu_;
  absl::flat_hash_map<uint32_t, std::pair<std::string, Transport*>> chosen_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewFirstReachableTransport(
    std::vector<std::unique_ptr<Transport>> candidates) {
  return std::make_unique<FirstReachableTransport>(std::move(candidates));
}

}  // namespace hymcache
