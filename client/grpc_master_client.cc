#include "client/grpc_master_client.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_stats.h"
#include "common/grpc_reconnect.h"
#include "common/grpc_status.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/status_reason.h"
#include "common/wire.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace {

namespace pb = ::hymcache::v1;

constexpr absl::Duration kAbortTimeout = absl::Seconds(2);

ObjectLocation FromProto(const pb::Location& l, const pb::Capability& c) {
  ObjectLocation o;
  o.node_id = l.node_id();
  o.region_id = l.region_id();
  o.addr = l.addr();
  o.length = l.length();
  o.generation = l.generation();
  o.capability.expires_unix_ms = c.expires_unix_ms();
  o.capability.rights = static_cast<uint8_t>(c.rights());
  absl::little_endian::Store64(o.capability.tag.data(), c.tag_lo());
  absl::little_endian::Store64(o.capability.tag.data() + 8, c.tag_hi());
  return o;
}

PeerInfo FromProto(const pb::NodeInfo& n) {
  PeerInfo p;
  p.node_id = n.node_id();
  p.data_address = n.data_address();
  for (const auto& [k, v] : n.transport_params()) p.params[k] = v;
  return p;
}

ObjectLocation FromRecord(const wire::LookupRecord& r) {
  ObjectLocation o;
  o.node_id = r.node_id;
  o.region_id = r.region_id;
  o.addr = r.addr;
  o.length = r.length;
  o.generation = r.generation;
  o.capability.expires_unix_ms = r.cap.expires_unix_ms;
  o.capability.rights = r.cap.rights;
  std::memcpy(o.capability.tag.data(), r.cap.tag, wire::kCapTagBytes);
  return o;
}

// A lookup request for `keys` into `req` (cleared first: a reused request
// keeps its key strings' memory). Asks for the packed answer.
void FillLookupRequest(absl::Span<const std::string> keys, LookupIntent intent,
                       const std::string& reader_host,
                       pb::BatchLookupRequest* req) {
  req->Clear();
  req->mutable_keys()->Reserve(static_cast<int>(keys.size()));
  for (const std::string& k : keys) req->add_keys(k);
  if (!reader_host.empty()) req->set_reader_host(reader_host);
  req->set_for_read(intent == LookupIntent::kRead ||
                    intent == LookupIntent::kNextTurn);
  req->set_next_turn(intent == LookupIntent::kNextTurn);
  req->set_ended(intent == LookupIntent::kEnded);
  req->set_exists_only(intent == LookupIntent::kExists);
  req->set_packed(true);
}

// The answer to `n` keys, packed or not (a master that predates packed
// answers sends results), into `out` (its vectors reused); Internal when
// it does not have one result each, or a packed record is malformed.
absl::Status FromProto(const pb::BatchLookupResponse& resp, size_t n,
                       LookupBatch* out) {
  out->found.assign(n, false);
  out->locations.resize(n);
  if (!resp.found_bits().empty()) {
    // An existence check's answer (exists_only): found, nothing else.
    const std::string& bits = resp.found_bits();
    if (bits.size() != (n + 7) / 8 || resp.results_size() != 0 ||
        !resp.packed_results().empty()) {
      return absl::InternalError("BatchLookup: master returned a short answer");
    }
    for (size_t i = 0; i < n; ++i) {
      out->found[i] = (static_cast<uint8_t>(bits[i / 8]) >> (i % 8)) & 1;
      out->locations[i] = ObjectLocation();
    }
  } else if (!resp.packed_results().empty()) {
    const std::string& p = resp.packed_results();
    if (resp.results_size() != 0 || p.size() != n * wire::kLookupRecordBytes) {
      return absl::InternalError("BatchLookup: master returned a short answer");
    }
    const auto* in = reinterpret_cast<const uint8_t*>(p.data());
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<wire::LookupRecord> r =
          wire::DecodeLookupRecord(in + i * wire::kLookupRecordBytes);
      if (!r.ok()) {
        return absl::InternalError(absl::StrCat(
            "BatchLookup: malformed answer: ", r.status().message()));
      }
      out->found[i] = r->node_id != 0;
      out->locations[i] = out->found[i] ? FromRecord(*r) : ObjectLocation();
    }
  } else {
    if (static_cast<size_t>(resp.results_size()) != n) {
      return absl::InternalError("BatchLookup: master returned a short answer");
    }
    for (size_t i = 0; i < n; ++i) {
      const pb::LookupResult& r = resp.results(static_cast<int>(i));
      out->found[i] = r.found();
      out->locations[i] = r.found() ? FromProto(r.location(), r.capability())
                                    : ObjectLocation();
    }
  }
  out->copy_prefix =
      std::min<uint32_t>(resp.copy_prefix_length(), static_cast<uint32_t>(n));
  out->nodes.clear();
  out->nodes.reserve(resp.nodes_size());
  for (const pb::NodeInfo& node : resp.nodes()) {
    out->nodes.push_back(FromProto(node));
  }
  return absl::OkStatus();
}

// How long closing the idle LookupStreams may take (the master answers a
// half-close at once; a master that does not is cancelled after this).
constexpr absl::Duration kStreamCloseTimeout = absl::Seconds(1);
// After the master refused a new stream for its limit (max_lookup_streams),
// lookups that find no idle stream go unary for this long.
constexpr absl::Duration kStreamRefusedBackoff = absl::Seconds(1);

// One open LookupStream, used by one caller at a time and driven by that
// caller through the stream's own completion queue: no gRPC callback
// thread and no hand-off between threads on a message's way. A stream
// goes back to its pool only with no event pending; one that missed its
// caller's deadline or broke is cancelled and dead for good (a late answer
// can never be taken as another call's).
class PooledLookupStream {
 public:
  enum class Result { kOk, kDeadline, kBroken };

  // `connection`: the index of the master connection it runs on.
  explicit PooledLookupStream(size_t connection) : connection_(connection) {}
  PooledLookupStream(const PooledLookupStream&) = delete;
  PooledLookupStream& operator=(const PooledLookupStream&) = delete;

  ~PooledLookupStream() {
    if (rw_ != nullptr && !finished_) {
      Kill();
      Finish(absl::InfiniteFuture());  // completes at once once cancelled
    } else if (pending_ > 0) {
      Kill();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  size_t connection() const { return connection_; }

  // Opens the stream; false if that did not complete by `deadline` (the
  // stream is then dead: Finish tells why).
  bool Start(pb::MasterService::Stub* stub, absl::Time deadline) {
    rw_ = stub->PrepareAsyncLookupStream(&ctx_, &cq_);
    rw_->StartCall(this);
    ++pending_;
    return Settle(deadline) == Result::kOk;
  }

  // One lookup: writes `req`, reads its answer into `resp`. kDeadline: no
  // answer by `deadline`; kBroken: the stream ended (Finish tells why).
  // Either way the stream is dead.
  Result Call(const pb::BatchLookupRequest& req, pb::BatchLookupResponse* resp,
              absl::Time deadline) {
    if (dead_) return Result::kBroken;
    StartWrite(req, this);
    StartRead(resp, this);
    return Settle(deadline);
  }

  // The pipelined use (StreamedLookups): at most one write and one read
  // outstanding, each completing as an event with its `tag` (Poll).
  // `req` and `resp` must live until then.
  void StartWrite(const pb::BatchLookupRequest& req, void* tag) {
    rw_->Write(req, tag);
    ++pending_;
  }
  void StartRead(pb::BatchLookupResponse* resp, void* tag) {
    rw_->Read(resp, tag);
    ++pending_;
  }
  // The next event by `until`: false on timeout (nothing taken).
  bool Poll(absl::Time until, void** tag, bool* ok) {
    if (cq_.AsyncNext(tag, ok, absl::ToChronoTime(until)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return false;
    }
    --pending_;
    if (!*ok) dead_ = true;
    return true;
  }
  // Cancels the stream and takes every pending event: dead from now on.
  void Kill() {
    dead_ = true;
    ctx_.TryCancel();  // every pending event now comes, with !ok
    void* tag;
    bool ok;
    while (pending_ > 0 && cq_.Next(&tag, &ok)) --pending_;
  }
  // May go back to the pool: alive, nothing pending.
  bool reusable() const { return !dead_ && pending_ == 0; }
  bool dead() const { return dead_; }

  // Takes the pending events; kDeadline (cancelling the stream) if they
  // did not all come by `deadline`, kBroken if one failed.
  Result Settle(absl::Time deadline) {
    bool all_ok = true;
    while (pending_ > 0) {
      void* tag;
      bool ok = false;
      if (!Poll(deadline, &tag, &ok)) {
        Kill();
        return Result::kDeadline;
      }
      all_ok = all_ok && ok;
    }
    return all_ok ? Result::kOk : Result::kBroken;
  }

  // The status the stream ended with (REQUIRES: dead, nothing pending).
  // Waits for it until `deadline` (at once for a broken stream); CANCELLED
  // after that.
  grpc::Status Finish(absl::Time deadline) {
    if (!finished_) {
      finished_ = true;
      rw_->Finish(&status_, this);
      ++pending_;
      if (Settle(deadline) == Result::kDeadline) {
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            "LookupStream: cancelled");
      }
    }
    return status_;
  }

  // Closing without making each caller wait for its own: BeginClose
  // half-closes a live stream; EndClose waits for the master's answer
  // until `deadline`, then cancels.
  void BeginClose() {
    if (rw_ == nullptr || !reusable() || finished_) return;
    rw_->WritesDone(this);
    rw_->Finish(&status_, this);
    finished_ = true;
    pending_ += 2;
  }
  void EndClose(absl::Time deadline) { Settle(deadline); }

  // The lookup and answer of the stream's current caller (Call), kept
  // with the stream so that their memory (key strings, the answer's
  // buffers) is reused call after call.
  pb::BatchLookupRequest& request() { return request_; }
  pb::BatchLookupResponse& response() { return response_; }

 private:
  const size_t connection_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<pb::BatchLookupRequest,
                                                pb::BatchLookupResponse>>
      rw_;
  int pending_ = 0;        // events asked for and not yet taken
  bool dead_ = false;      // broken or cancelled: no more calls
  bool finished_ = false;  // Finish asked for
  grpc::Status status_;
  pb::BatchLookupRequest request_;
  pb::BatchLookupResponse response_;
};

class GrpcMasterClient : public MasterClient {
 public:
  // REQUIRES: !channels.empty().
  GrpcMasterClient(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                   const GrpcMasterClientOptions& options)
      : options_(options),
        stub_(pb::MasterService::NewStub(channels[0])),
        lookup_stubs_(NewStubs(channels)),
        streams_off_(options.idle_lookup_streams <= 0),
        idle_streams_(channels.size()),
        reconnector_(channels) {}

  ~GrpcMasterClient() override {
    // The idle streams end cleanly (half-close, the master's OK), all at
    // once; no caller holds one now.
    std::vector<std::unique_ptr<PooledLookupStream>> idle;
    {
      MutexLock l(&mu_);
      for (auto& pool : idle_streams_) {
        for (auto& s : pool) idle.push_back(std::move(s));
        pool.clear();
      }
      idle_count_ = 0;
    }
    for (auto& s : idle) s->BeginClose();
    const absl::Time close_by = absl::Now() + kStreamCloseTimeout;
    for (auto& s : idle) s->EndClose(close_by);
    idle.clear();
    // Background aborts and cancelled lookups reference this object: wait
    // for them (each is bounded by its deadline).
    MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return async_in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&done));
  }

  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> keys,
                                     LookupIntent intent,
                                     absl::Time deadline) override {
    // Already late: nothing is sent (as gRPC does for a unary call; with
    // the "poll" strategy, a stream's events may still be taken after the
    // deadline).
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("BatchLookup: Deadline Exceeded");
    }
    // Over a pooled stream, in its own request and answer; unary in
    // these when there is none (or it broke without an answer).
    std::unique_ptr<PooledLookupStream> stream = TakeStream(deadline);
    pb::BatchLookupRequest unary_req;
    pb::BatchLookupResponse unary_resp;
    pb::BatchLookupRequest* req =
        stream != nullptr ? &stream->request() : &unary_req;
    pb::BatchLookupResponse* resp =
        stream != nullptr ? &stream->response() : &unary_resp;
    FillLookupRequest(keys, intent, options_.reader_host, req);
    absl::Status answered;
    if (stream == nullptr ||
        !StreamLookup(stream.get(), *req, resp, deadline, &answered)) {
      answered = Unary(&pb::MasterService::Stub::BatchLookup, *req, resp,
                       deadline, "BatchLookup");
    }
    RETURN_IF_ERROR(answered);
    LookupBatch out;
    RETURN_IF_ERROR(FromProto(*resp, keys.size(), &out));
    // Answered over it and read: the stream may serve the next caller.
    if (stream != nullptr && stream->reusable())
      ReturnStream(std::move(stream));
    return out;
  }

  std::unique_ptr<LookupStream> StartLookups(absl::Span<const std::string> keys,
                                             size_t chunk_keys,
                                             absl::Time deadline) override;

  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs& args,
                                         absl::Time deadline) override {
    pb::PutStartRequest req;
    for (size_t i = 0; i < args.keys.size(); ++i) {
      req.add_keys(args.keys[i]);
      req.add_lengths(args.lengths[i]);
    }
    req.set_preferred_node_id(args.preferred_node_id);
    if (!args.parent_key.empty()) req.set_parent_key(args.parent_key);
    req.set_relocate_from_node(args.relocate_from_node);
    req.set_replica(args.replica);
    for (uint64_t g : args.copied_generations) req.add_copied_generations(g);
    uint64_t token = 0;
    while (token == 0) token = absl::Uniform<uint64_t>(absl::BitGen());
    req.set_put_token(token);
    pb::PutStartResponse resp;
    absl::Status called = Unary(&pb::MasterService::Stub::PutStart, req, &resp,
                                deadline, "PutStart");
    if (!called.ok()) {
      // The master may have started the put and its answer been lost (our
      // deadline passed first, the connection broke): end it by its token,
      // or its keys stay in progress, refused to every writer, until it
      // expires (the master's put_timeout, 30 s by default).
      if (AnswerMayBeLost(called)) AbortInBackground(0, token);
      return called;
    }
    PutStartReply out;
    out.put_id = resp.put_id();
    out.slots.resize(resp.slots_size());
    for (int i = 0; i < resp.slots_size(); ++i) {
      const pb::PutSlot& s = resp.slots(i);
      switch (s.state()) {
        case pb::SLOT_EXISTS:
          out.slots[i].state = PutSlotState::kExists;
          out.slots[i].location = FromProto(s.location(), s.capability());
          break;
        case pb::SLOT_NOT_ON_NODE:  // a relocation's or copy's: no write
          out.slots[i].state = PutSlotState::kExists;
          break;
        case pb::SLOT_IN_PROGRESS:
          out.slots[i].state = PutSlotState::kInProgress;
          break;
        default:
          out.slots[i].state = PutSlotState::kAllocated;
          out.slots[i].location = FromProto(s.location(), s.capability());
      }
    }
    out.node = FromProto(resp.node());
    out.replicas = resp.replicas();
    return out;
  }

  absl::Status PutCommit(uint64_t put_id,
                         absl::Span<const uint32_t> failed_indexes,
                         absl::Span<const wire::Receipt> receipts,
                         absl::Time deadline) override {
    pb::PutCommitRequest req;
    req.set_put_id(put_id);
    for (uint32_t i : failed_indexes) req.add_failed_indexes(i);
    for (const wire::Receipt& r : receipts) {
      req.add_receipts(reinterpret_cast<const char*>(r.tag),
                       wire::kReceiptBytes);
    }
    pb::PutCommitResponse resp;
    absl::Status committed = Unary(&pb::MasterService::Stub::PutCommit, req,
                                   &resp, deadline, "PutCommit");
    if (!committed.ok() || !StandbyConfirmer::NeedsConfirm(resp)) {
      return committed;
    }
    if (options_.confirmer == nullptr) {
      LOG_FIRST_N(WARNING, 1)
          << "master client: the leader asks commits to be confirmed with "
             "its standbys and this client has no confirmer: acknowledged "
             "unconfirmed";
      return committed;
    }
    return options_.confirmer->Confirm(
        resp, std::min(deadline, absl::Now() + options_.confirm_timeout));
  }

  void PutAbortInBackground(uint64_t put_id) override {
    if (put_id == 0) return;
    AbortInBackground(put_id, 0);
  }

  // Whether a failed call may have been carried out by the master, its
  // answer lost: anything but the master's own refusal.
  static bool AnswerMayBeLost(const absl::Status& s) {
    switch (s.code()) {
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kCancelled:
      case absl::StatusCode::kUnknown:
      case absl::StatusCode::kInternal:
      case absl::StatusCode::kAborted:
        return true;
      case absl::StatusCode::kUnavailable:
        // A standby's refusal carries a reason (not_leader, read_only);
        // a broken connection does not.
        return ReasonOf(s) == StatusReason::kNone;
      default:
        return false;
    }
  }

  // PutAbort of the put `put_id` or (put_id 0) the one PutStart sent with
  // `token`, not waited for.
  void AbortInBackground(uint64_t put_id, uint64_t token) {
    struct Call {
      grpc::ClientContext ctx;
      pb::PutAbortRequest req;
      pb::PutAbortResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->req.set_put_id(put_id);
    call->req.set_put_token(token);
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAbortTimeout));
    // The call's state dies with the callback, after gRPC let go of it.
    auto pin = std::make_shared<AsyncPin>(this, call);
    TsanRelease(call.get());
    Call* c = call.get();
    stub_->async()->PutAbort(&c->ctx, &c->req, &c->resp,
                             [pin = std::move(pin)](grpc::Status) {
                               TsanAcquire(pin->state.get());
                             });
  }

  absl::Status ReportMissing(absl::Span<const std::string> keys,
                             absl::Span<const ObjectLocation> locations,
                             absl::Time deadline) override {
    pb::ReportMissingRequest req;
    for (size_t i = 0; i < keys.size(); ++i) {
      req.add_keys(keys[i]);
      const ObjectLocation& l = locations[i];
      pb::Location* loc = req.add_locations();
      loc->set_node_id(l.node_id);
      loc->set_region_id(l.region_id);
      loc->set_addr(l.addr);
      loc->set_length(l.length);
      loc->set_generation(l.generation);
    }
    pb::ReportMissingResponse resp;
    return Unary(&pb::MasterService::Stub::ReportMissing, req, &resp,
                 deadline, "ReportMissing");
  }

  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> keys,
                                           absl::Time deadline) override {
    pb::RemoveRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    pb::RemoveResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::Remove, req, &resp,
                          deadline, "Remove"));
    return std::vector<bool>(resp.removed().begin(), resp.removed().end());
  }

  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string> keys,
                                           absl::Time deadline) override {
    pb::PrefixQueryRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    pb::PrefixQueryResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::PrefixQuery, req, &resp,
                          deadline, "PrefixQuery"));
    PrefixAnswer out;
    out.hit_prefix_length = resp.hit_prefix_length();
    for (const auto& n : resp.nodes()) {
      out.nodes.push_back({n.node_id(), n.longest_prefix(), n.blocks()});
    }
    for (const auto& e : resp.engines()) {
      out.engines.push_back({e.engine_id(), e.longest_prefix()});
    }
    return out;
  }

  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& report, absl::Time deadline) override {
    pb::ReportEngineBlocksRequest req;
    req.set_engine_id(report.engine_id);
    req.set_cleared(report.cleared);
    for (const std::string& k : report.removed) req.add_removed(k);
    for (const std::string& k : report.stored) req.add_stored(k);
    pb::ReportEngineBlocksResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::ReportEngineBlocks, req,
                          &resp, deadline, "ReportEngineBlocks"));
    return EngineBlocksReply{resp.blocks(), absl::Milliseconds(resp.ttl_ms())};
  }

  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time deadline) override {
    pb::GetStatsRequest req;
    pb::GetStatsResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::GetStats, req, &resp,
                          deadline, "GetStats"));
    ClusterStatus out;
#define HYM_COPY_GAUGE_(field, metric, help) out.field = resp.field();
#define HYM_COPY_COUNTER_(field) out.field = resp.field();
    HYM_CLUSTER_STATS(HYM_COPY_GAUGE_, HYM_COPY_COUNTER_)
#undef HYM_COPY_GAUGE_
#undef HYM_COPY_COUNTER_
    for (const pb::NodeInfo& n : resp.nodes()) {
      NodeStatus s;
      s.node_id = n.node_id();
      s.name = n.name();
      s.data_address = n.data_address();
      s.control_address = n.control_address();
      s.alive = n.alive();
      s.awaiting_reconcile = n.awaiting_reconcile();
      s.last_heartbeat_unix_ms = n.last_heartbeat_unix_ms();
      s.capacity_bytes = n.capacity_bytes();
      s.used_bytes = n.used_bytes();
      s.object_count = n.object_count();
      if (n.regions_size() > 0) s.device_kind = n.regions(0).device_kind();
      out.nodes.push_back(std::move(s));
    }
    return out;
  }

 private:
  friend class GrpcLookupStream;
  friend class StreamedLookups;

  // `req` over `stream` (from TakeStream): true with its status in
  // `*status` when the stream answered it (or its deadline passed, or the
  // master refused the message); false when the caller should make it a
  // unary BatchLookup instead: a master without LookupStream (streams are
  // then off for good), or a stream that broke without an answer (one left
  // over from a master that has restarted or shut down, or refused at the
  // master's stream limit), for which the unary call gives the
  // authoritative answer. The caller keeps the stream: ReturnStream once
  // it has read `*resp` if it is reusable (answered), else drops it.
  bool StreamLookup(PooledLookupStream* stream,
                    const pb::BatchLookupRequest& req,
                    pb::BatchLookupResponse* resp, absl::Time deadline,
                    absl::Status* status) {
    switch (stream->Call(req, resp, deadline)) {
      case PooledLookupStream::Result::kOk:
        *status = absl::OkStatus();
        return true;
      case PooledLookupStream::Result::kDeadline:
        *status = absl::DeadlineExceededError("BatchLookup: Deadline Exceeded");
        return true;
      case PooledLookupStream::Result::kBroken:
        break;
    }
    const grpc::Status why = stream->Finish(deadline);
    if (!IsAnswer(why)) return false;
    *status = FromGrpcStatus(why, "BatchLookup");
    return true;
  }

  // An idle stream, or a new one (dead if it did not start: its Finish
  // tells why); null when lookups go unary (streams off, or the master
  // refused a stream for its limit a moment ago and none is idle).
  // The stream comes from the calling thread's connection
  // (ConnectionOfThisThread).
  std::unique_ptr<PooledLookupStream> TakeStream(absl::Time deadline) {
    if (streams_off_.load(std::memory_order_relaxed)) return nullptr;
    const size_t connection = ConnectionOfThisThread();
    {
      MutexLock l(&mu_);
      auto& pool = idle_streams_[connection];
      if (!pool.empty()) {
        std::unique_ptr<PooledLookupStream> s = std::move(pool.back());
        pool.pop_back();
        --idle_count_;
        return s;
      }
      if (absl::Now() < no_new_streams_until_) return nullptr;
    }
    auto s = std::make_unique<PooledLookupStream>(connection);
    s->Start(lookup_stubs_[connection].get(), deadline);
    return s;
  }

  // The master connection whose streams this thread uses: the threads that
  // call this client are spread over the connections in the order they
  // first call (thread i of the process: connection i mod the count), so
  // that up to master_connections concurrent callers each have one of
  // their own (docs/performance.md: with gRPC's "poll" strategy a caller
  // then completes its own calls; common/grpc_polling.h).
  size_t ConnectionOfThisThread() const {
    if (lookup_stubs_.size() == 1) return 0;
    static std::atomic<uint32_t> next_thread{0};
    thread_local const uint32_t thread_index =
        next_thread.fetch_add(1, std::memory_order_relaxed);
    return thread_index % lookup_stubs_.size();
  }

  static std::vector<std::unique_ptr<pb::MasterService::Stub>> NewStubs(
      const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
    std::vector<std::unique_ptr<pb::MasterService::Stub>> stubs;
    for (const auto& c : channels)
      stubs.push_back(pb::MasterService::NewStub(c));
    return stubs;
  }

  // Whether `why`, the status a stream ended with before it answered a
  // lookup, is the master's answer to that lookup (as BatchLookup would
  // have answered it: a refusal). False: the stream failed, not the
  // lookup; ask with a unary BatchLookup, which answers with authority: a
  // master without LookupStream (UNIMPLEMENTED: streams are off from now
  // on), one at its stream limit (RESOURCE_EXHAUSTED: no new stream for a
  // while), a stream left over from a master that restarted or shut down.
  bool IsAnswer(const grpc::Status& why) {
    switch (why.error_code()) {
      case grpc::StatusCode::UNIMPLEMENTED:
        streams_off_.store(true, std::memory_order_relaxed);
        return false;
      case grpc::StatusCode::RESOURCE_EXHAUSTED: {
        MutexLock l(&mu_);
        no_new_streams_until_ = absl::Now() + kStreamRefusedBackoff;
        return false;
      }
      case grpc::StatusCode::OK:  // ended without answering: not a refusal
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::CANCELLED:
      case grpc::StatusCode::UNKNOWN:
      case grpc::StatusCode::INTERNAL:
        return false;
      default:
        return true;
    }
  }

  // A stream that answered goes back to the pool, or is closed when
  // idle_lookup_streams are idle already. REQUIRES: stream->reusable().
  void ReturnStream(std::unique_ptr<PooledLookupStream> stream) {
    {
      MutexLock l(&mu_);
      if (idle_count_ < static_cast<size_t>(options_.idle_lookup_streams)) {
        idle_streams_[stream->connection()].push_back(std::move(stream));
        ++idle_count_;
        return;
      }
    }
    stream->BeginClose();
    stream->EndClose(absl::Now() + kStreamCloseTimeout);
  }

  // One unary call of `method` with `deadline`; `what` names it in errors.
  template <typename Request, typename Response>
  absl::Status Unary(grpc::Status (pb::MasterService::Stub::*method)(
                         grpc::ClientContext*, const Request&, Response*),
                     const Request& req, Response* resp, absl::Time deadline,
                     const char* what) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status s = (stub_.get()->*method)(&ctx, req, resp);
    NoteStatus(s);
    return FromGrpcStatus(s, what);
  }

  // A call ended with `s`: UNAVAILABLE (no connection to the master) keeps
  // the connections connecting until they are back (ChannelReconnector:
  // under gRPC's "poll" strategy nothing else would until its backup
  // poller's next passes, seconds later).
  void NoteStatus(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      reconnector_.KickAll();
    }
  }

  // Held by an async call's callback functor: keeps the call's state (its
  // ClientContext) alive while gRPC uses it, and counts the call as done
  // only when gRPC destroys the functor. gRPC destroys it after its last use
  // of the call, so the destructor below never waits less than gRPC needs
  // (counting inside the callback let this object, its stub and the channel
  // go while gRPC was still finishing the call).
  struct AsyncPin {
    AsyncPin(GrpcMasterClient* client, std::shared_ptr<void> state)
        : client(client), state(std::move(state)) {
      MutexLock l(&client->mu_);
      ++client->async_in_flight_;
    }
    ~AsyncPin() {
      state.reset();  // first the call's state, then the count
      MutexLock l(&client->mu_);
      --client->async_in_flight_;
    }
    AsyncPin(const AsyncPin&) = delete;
    AsyncPin& operator=(const AsyncPin&) = delete;

    GrpcMasterClient* const client;
    std::shared_ptr<void> state;
  };

  const GrpcMasterClientOptions options_;
  // Unary and callback calls: the first connection.
  const std::unique_ptr<pb::MasterService::Stub> stub_;
  // LookupStreams: one stub per connection (GrpcMasterClientOptions).
  const std::vector<std::unique_ptr<pb::MasterService::Stub>> lookup_stubs_;

  // Lookups go as unary BatchLookups (idle_lookup_streams 0, or the master
  // answered LookupStream with UNIMPLEMENTED).
  std::atomic<bool> streams_off_;

  Mutex mu_;
  // Async calls (aborts, lookups) whose callback functors gRPC still holds.
  int async_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Open LookupStreams no caller holds, per connection, the most recently
  // used last; idle_count_ of them in all.
  std::vector<std::vector<std::unique_ptr<PooledLookupStream>>> idle_streams_
      ABSL_GUARDED_BY(mu_);
  size_t idle_count_ ABSL_GUARDED_BY(mu_) = 0;
  // The master refused a new stream for its limit: none is opened before.
  absl::Time no_new_streams_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  ChannelReconnector reconnector_;
};

// The BatchLookup round trips of one Load: chunks of `chunk` keys, up to
// lookup_pipeline_depth in flight, answers taken in order. Calls still in
// flight when the stream is destroyed are cancelled; their state lives until
// their callbacks ran (the GrpcMasterClient waits for those).
class GrpcLookupStream : public LookupStream {
 public:
  GrpcLookupStream(GrpcMasterClient* client, absl::Span<const std::string> keys,
                   size_t chunk, absl::Time deadline)
      : client_(client),
        keys_(keys),
        deadline_(deadline),
        chunk_(chunk),
        nchunks_((keys.size() + chunk_ - 1) / chunk_),
        state_(std::make_shared<State>()) {
    state_->calls.resize(nchunks_);
    Launch();
  }
  ~GrpcLookupStream() override { CancelRest(); }

  bool has_next() const override { return !stopped_ && next_ < nchunks_; }

  absl::StatusOr<const LookupBatch*> Next(bool block) override {
    Call* c = state_->calls[next_].get();
    {
      MutexLock l(&state_->mu);
      while (!c->done) {
        if (!block) return nullptr;
        if (state_->cv.WaitWithDeadline(&state_->mu, deadline_) && !c->done) {
          return absl::DeadlineExceededError(
              "Load: lookup did not answer before the deadline");
        }
      }
    }
    const size_t n = ChunkSize(next_);
    ++next_;
    Launch();
    client_->NoteStatus(c->status);
    RETURN_IF_ERROR(FromGrpcStatus(c->status, "BatchLookup"));
    RETURN_IF_ERROR(FromProto(c->resp, n, &batch_));
    return &batch_;
  }

  void CancelRest() override {
    stopped_ = true;
    MutexLock l(&state_->mu);
    for (size_t k = next_; k < launched_; ++k) {
      if (!state_->calls[k]->done) state_->calls[k]->ctx.TryCancel();
    }
  }

 private:
  struct Call {
    grpc::ClientContext ctx;
    pb::BatchLookupRequest req;
    pb::BatchLookupResponse resp;
    grpc::Status status;
    bool done = false;  // guarded by State::mu
  };
  struct State {
    Mutex mu;
    CondVar cv;
    // Filled by the Load's thread before each call starts.
    std::vector<std::unique_ptr<Call>> calls;
  };

  size_t ChunkSize(size_t k) const {
    return std::min(chunk_, keys_.size() - k * chunk_);
  }

  void Launch() {
    const size_t depth =
        static_cast<size_t>(client_->options_.lookup_pipeline_depth);
    while (!stopped_ && launched_ < nchunks_ && launched_ < next_ + depth) {
      auto call = std::make_unique<Call>();
      Call* c = call.get();
      const size_t begin = launched_ * chunk_;
      FillLookupRequest(keys_.subspan(begin, ChunkSize(launched_)),
                        LookupIntent::kRead, client_->options_.reader_host,
                        &c->req);
      c->ctx.set_deadline(absl::ToChronoTime(deadline_));
      state_->calls[launched_] = std::move(call);
      ++launched_;
      auto pin = std::make_shared<GrpcMasterClient::AsyncPin>(client_, state_);
      // The callback runs on a gRPC thread: publish the call's state to it.
      TsanRelease(c);
      client_->stub_->async()->BatchLookup(
          &c->ctx, &c->req, &c->resp,
          [state = state_.get(), c, pin = std::move(pin)](grpc::Status s) {
            TsanAcquire(c);
            MutexLock l(&state->mu);
            c->status = std::move(s);
            c->done = true;
            state->cv.SignalAll();
          });
    }
  }

  GrpcMasterClient* const client_;
  const absl::Span<const std::string> keys_;
  const absl::Time deadline_;
  const size_t chunk_;
  const size_t nchunks_;
  const std::shared_ptr<State> state_;
  size_t next_ = 0;      // next chunk to take
  size_t launched_ = 0;  // chunks whose call started
  bool stopped_ = false;
  LookupBatch batch_;    // the answer Next returned last
};

// The lookups of one Load over one pooled LookupStream: the chunks'
// requests written lookup_pipeline_depth ahead of the answer taken, the
// answers read in order, all driven by the Load's thread in Next (the
// stream's own queue). If the stream breaks without the master refusing a
// lookup (a stream left over from a restarted master, an older master),
// the remaining chunks go as unary calls (GrpcLookupStream). The stream
// goes back to the pool when every answer has been taken; CancelRest with
// answers outstanding cancels it.
class StreamedLookups : public LookupStream {
 public:
  StreamedLookups(GrpcMasterClient* client,
                  std::unique_ptr<PooledLookupStream> stream,
                  absl::Span<const std::string> keys, size_t chunk,
                  absl::Time deadline)
      : client_(client),
        stream_(std::move(stream)),
        keys_(keys),
        deadline_(deadline),
        chunk_(chunk),
        nchunks_((keys.size() + chunk_ - 1) / chunk_),
        resps_(nchunks_) {
    Pump();
  }
  ~StreamedLookups() override { CancelRest(); }

  bool has_next() const override {
    if (fallback_ != nullptr) return fallback_->has_next();
    return !stopped_ && next_ < nchunks_;
  }

  absl::StatusOr<const LookupBatch*> Next(bool block) override {
    if (fallback_ != nullptr) return fallback_->Next(block);
    if (stream_ == nullptr || !has_next()) {
      return absl::FailedPreconditionError("Load: no lookup answers left");
    }
    while (answered_ <= next_) {
      if (stream_->dead()) return Broken(block);
      void* tag;
      bool ok = false;
      if (!stream_->Poll(block ? deadline_ : absl::UnixEpoch(), &tag, &ok)) {
        if (!block) return nullptr;  // not arrived yet
        stopped_ = true;
        stream_->Kill();
        stream_.reset();
        return absl::DeadlineExceededError(
            "Load: lookup did not answer before the deadline");
      }
      if (tag == &write_tag_) {
        writing_ = false;
      } else {
        reading_ = false;
        if (ok) ++answered_;
      }
      if (ok) Pump();
    }
    const size_t k = next_++;
    Pump();
    if (next_ == nchunks_) {
      // Every answer taken: only a write's event may be pending (its
      // answer came first). The stream goes back to the pool.
      if (stream_->Settle(deadline_) == PooledLookupStream::Result::kOk) {
        client_->ReturnStream(std::move(stream_));
      } else {
        stream_.reset();
      }
    }
    absl::Status s = FromProto(resps_[k], ChunkSize(k), &batch_);
    resps_[k].Clear();
    RETURN_IF_ERROR(s);
    return &batch_;
  }

  void CancelRest() override {
    stopped_ = true;
    if (fallback_ != nullptr) fallback_->CancelRest();
    if (stream_ == nullptr) return;
    if (stream_->reusable()) {
      client_->ReturnStream(std::move(stream_));
    } else {
      stream_->Kill();
      stream_.reset();
    }
  }

 private:
  size_t ChunkSize(size_t k) const {
    return std::min(chunk_, keys_.size() - k * chunk_);
  }

  // The stream ended before chunk next_'s answer. The master's refusal of
  // a lookup is the answer; otherwise the rest goes as unary calls.
  absl::StatusOr<const LookupBatch*> Broken(bool block) {
    stream_->Settle(deadline_);  // the other event, if any, comes at once
    const grpc::Status why = stream_->Finish(deadline_);
    stream_.reset();
    if (client_->IsAnswer(why)) {
      stopped_ = true;
      return FromGrpcStatus(why, "BatchLookup");
    }
    fallback_ = std::make_unique<GrpcLookupStream>(
        client_, keys_.subspan(next_ * chunk_), chunk_, deadline_);
    return fallback_->Next(block);
  }

  // Starts the next write (one at a time, up to the pipeline depth ahead
  // of the answer taken) and the next read (one at a time).
  void Pump() {
    if (stopped_ || stream_ == nullptr || stream_->dead()) return;
    const size_t depth =
        static_cast<size_t>(client_->options_.lookup_pipeline_depth);
    if (!writing_ && written_ < nchunks_ && written_ < next_ + depth) {
      FillLookupRequest(keys_.subspan(written_ * chunk_, ChunkSize(written_)),
                        LookupIntent::kRead, client_->options_.reader_host,
                        &req_);
      stream_->StartWrite(req_, &write_tag_);
      writing_ = true;
      ++written_;
    }
    if (!reading_ && answered_ < written_) {
      stream_->StartRead(&resps_[answered_], &read_tag_);
      reading_ = true;
    }
  }

  GrpcMasterClient* const client_;
  std::unique_ptr<PooledLookupStream> stream_;
  const absl::Span<const std::string> keys_;
  const absl::Time deadline_;
  const size_t chunk_;
  const size_t nchunks_;
  std::vector<pb::BatchLookupResponse> resps_;  // per chunk, as read
  pb::BatchLookupRequest req_;                  // the write in flight
  char write_tag_ = 0, read_tag_ = 0;           // their events' tags
  bool writing_ = false, reading_ = false;      // a write / read in flight
  size_t written_ = 0;   // chunks whose request was written (or is being)
  size_t answered_ = 0;  // chunks whose answer was read
  size_t next_ = 0;      // next chunk to take
  bool stopped_ = false;
  std::unique_ptr<GrpcLookupStream> fallback_;  // the rest, unary
  LookupBatch batch_;  // the answer Next returned last
};

std::unique_ptr<LookupStream> GrpcMasterClient::StartLookups(
    absl::Span<const std::string> keys, size_t chunk_keys,
    absl::Time deadline) {
  // Already late: unary calls, which gRPC fails at once (DeadlineExceeded)
  // without sending them.
  std::unique_ptr<PooledLookupStream> stream =
      absl::Now() < deadline ? TakeStream(deadline) : nullptr;
  if (stream == nullptr) {
    return std::make_unique<GrpcLookupStream>(this, keys, chunk_keys,
                                              deadline);
  }
  return std::make_unique<StreamedLookups>(this, std::move(stream), keys,
                                           chunk_keys, deadline);
}

}  // namespace

std::unique_ptr<MasterClient> NewGrpcMasterClient(
    std::shared_ptr<grpc::Channel> channel,
    const GrpcMasterClientOptions& options) {
  return std::make_unique<GrpcMasterClient>(
      std::vector<std::shared_ptr<grpc::Channel>>{std::move(channel)}, options);
}

std::unique_ptr<MasterClient> NewGrpcMasterClient(
    const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const GrpcMasterClientOptions& options) {
  if (channels.empty()) return nullptr;
  return std::make_unique<GrpcMasterClient>(channels, options);
}

}  // namespace hymcache
