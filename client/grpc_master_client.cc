#include "client/grpc_master_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/mutex.h"
#include "common/status_macros.h"
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

// The answer to `n` keys; Internal when it does not have one result each.
absl::Status FromProto(const pb::BatchLookupResponse& resp, size_t n,
                       LookupBatch* out) {
  if (static_cast<size_t>(resp.results_size()) != n) {
    return absl::InternalError("BatchLookup: master returned a short answer");
  }
  out->found.resize(n);
  out->locations.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const pb::LookupResult& r = resp.results(static_cast<int>(i));
    out->found[i] = r.found();
    if (r.found()) out->locations[i] = FromProto(r.location(), r.capability());
  }
  out->nodes.reserve(resp.nodes_size());
  for (const pb::NodeInfo& node : resp.nodes()) {
    out->nodes.push_back(FromProto(node));
  }
  return absl::OkStatus();
}

class GrpcMasterClient : public MasterClient {
 public:
  GrpcMasterClient(std::shared_ptr<grpc::Channel> channel,
                   const GrpcMasterClientOptions& options)
      : options_(options), stub_(pb::MasterService::NewStub(channel)) {}

  ~GrpcMasterClient() override {
    // Background aborts and cancelled lookups reference this object: wait
    // for them (each is bounded by its deadline).
    MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return async_in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&done));
  }

  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> keys,
                                     bool for_read,
                                     absl::Time deadline) override {
    pb::BatchLookupRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    req.set_for_read(for_read);
    pb::BatchLookupResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::BatchLookup, req, &resp,
                          deadline, "BatchLookup"));
    LookupBatch out;
    RETURN_IF_ERROR(FromProto(resp, keys.size(), &out));
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
    pb::PutStartResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::PutStart, req, &resp,
                          deadline, "PutStart"));
    PutStartReply out;
    out.put_id = resp.put_id();
    out.slots.resize(resp.slots_size());
    for (int i = 0; i < resp.slots_size(); ++i) {
      const pb::PutSlot& s = resp.slots(i);
      switch (s.state()) {
        case pb::SLOT_EXISTS:
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
    return out;
  }

  absl::Status PutCommit(uint64_t put_id,
                         absl::Span<const uint32_t> failed_indexes,
                         absl::Time deadline) override {
    pb::PutCommitRequest req;
    req.set_put_id(put_id);
    for (uint32_t i : failed_indexes) req.add_failed_indexes(i);
    pb::PutCommitResponse resp;
    return Unary(&pb::MasterService::Stub::PutCommit, req, &resp, deadline,
                 "PutCommit");
  }

  void PutAbortInBackground(uint64_t put_id) override {
    if (put_id == 0) return;
    struct Call {
      grpc::ClientContext ctx;
      pb::PutAbortRequest req;
      pb::PutAbortResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->req.set_put_id(put_id);
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

  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time deadline) override {
    pb::GetStatsRequest req;
    pb::GetStatsResponse resp;
    RETURN_IF_ERROR(Unary(&pb::MasterService::Stub::GetStats, req, &resp,
                          deadline, "GetStats"));
    ClusterStatus out;
    out.object_count = resp.object_count();
    out.object_bytes = resp.object_bytes();
    out.pending_puts = resp.pending_puts();
    out.index_bytes_per_entry = resp.index_bytes_per_entry();
    out.evicted_objects = resp.evicted_objects();
    out.evicted_bytes = resp.evicted_bytes();
    out.reconciliations = resp.reconciliations();
    out.reconcile_dropped_listings = resp.reconcile_dropped_listings();
    out.read_repairs = resp.read_repairs();
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

  // One unary call of `method` with `deadline`; `what` names it in errors.
  template <typename Request, typename Response>
  absl::Status Unary(grpc::Status (pb::MasterService::Stub::*method)(
                         grpc::ClientContext*, const Request&, Response*),
                     const Request& req, Response* resp, absl::Time deadline,
                     const char* what) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    return FromGrpcStatus((stub_.get()->*method)(&ctx, req, resp), what);
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
  const std::unique_ptr<pb::MasterService::Stub> stub_;

  Mutex mu_;
  // Async calls (aborts, lookups) whose callback functors gRPC still holds.
  int async_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
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
    RETURN_IF_ERROR(FromGrpcStatus(c->status, "BatchLookup"));
    batch_ = LookupBatch();
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
      for (size_t i = begin; i < begin + ChunkSize(launched_); ++i) {
        c->req.add_keys(keys_[i]);
      }
      c->req.set_for_read(true);
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

std::unique_ptr<LookupStream> GrpcMasterClient::StartLookups(
    absl::Span<const std::string> keys, size_t chunk_keys,
    absl::Time deadline) {
  return std::make_unique<GrpcLookupStream>(this, keys, chunk_keys, deadline);
}

}  // namespace

std::unique_ptr<MasterClient> NewGrpcMasterClient(
    std::shared_ptr<grpc::Channel> channel,
    const GrpcMasterClientOptions& options) {
  return std::make_unique<GrpcMasterClient>(std::move(channel), options);
}

}  // namespace hymcache
