// The master's streaming RPCs on the completion queues (master/cq_server.h):
// Reconcile, LookupStream, ListObjects and WatchEvents, and
// MasterRpcHandler::StartOn, which requests every method's first call on a
// poller.
#include <grpcpp/alarm.h>

#include <memory>
#include <utility>

#include "absl/time/clock.h"

#include "master/master_rpc_handler.h"

namespace hymcache {
namespace master {

// What the streaming calls below share: one object per call, which asks
// its poller for the next call of its method as soon as it is matched, and
// is deleted when its Finish completes. Derived provides, privately (with
// StreamCall<Derived> a friend):
//   Derived(MasterRpcHandler*, CqPoller*);
//   void RequestOn(v1::MasterService::AsyncService*,
//                  grpc::ServerCompletionQueue*);  // asks for one call
//   void Start();          // the call has arrived
//   void Step(bool ok);    // each later event, until Finishing()
//   void Finished() {}     // optional: just before deletion
template <typename Derived>
class StreamCall : public CqTag {
 public:
  static void Request(MasterRpcHandler* handler, CqPoller* poller) {
    auto* call = new Derived(handler, poller);
    if (!poller->IfOpen([call, handler, poller] {
          call->RequestOn(handler->async_service(), poller->cq());
        })) {
      delete call;
    }
  }

  void Proceed(bool ok) final {
    Derived* const self = static_cast<Derived*>(this);
    if (!started_) {
      if (!ok) {  // shutting down: the call never started
        delete self;
        return;
      }
      started_ = true;
      Request(handler_, poller_);
      self->Start();
      return;
    }
    if (finishing_) {
      self->Finished();
      delete self;
      return;
    }
    self->Step(ok);
  }

 protected:
  StreamCall(MasterRpcHandler* handler, CqPoller* poller)
      : handler_(handler), poller_(poller) {}
  ~StreamCall() = default;
  // The next event is the end of the stream's Finish: call just before it.
  void Finishing() { finishing_ = true; }
  void Finished() {}
  // Starts an op of the call (`op` queues it; its event comes to this
  // object) unless the poller's queue has been shut down (the server
  // stopping): nothing may be queued then, and no event would come, so the
  // call ends here. Call it last: the object may be gone after it.
  template <typename F>
  void StartOp(F&& op) {
    if (poller_->IfOpen(std::forward<F>(op))) return;
    Derived* const self = static_cast<Derived*>(this);
    self->Finished();
    delete self;
  }

  MasterRpcHandler* const handler_;
  CqPoller* const poller_;
  grpc::ServerContext ctx_;

 private:
  bool started_ = false;
  bool finishing_ = false;
};

// One ReconcileNode stream (client streaming) on a poller: reads the
// node's extents chunk by chunk; compares at the end of the stream (see
// MasterService::FinishReconcile).
class ReconcileCall final : public StreamCall<ReconcileCall> {
 private:
  friend class StreamCall<ReconcileCall>;

  ReconcileCall(MasterRpcHandler* handler, CqPoller* poller)
      : StreamCall(handler, poller), reader_(&ctx_) {}
  ~ReconcileCall() = default;

  void RequestOn(v1::MasterService::AsyncService* service,
                 grpc::ServerCompletionQueue* cq) {
    service->RequestReconcileNode(&ctx_, &reader_, cq, cq, this);
  }
  void Start() {
    auto id = handler_->Admit(&ctx_, MasterRpcHandler::kNode, "ReconcileNode");
    if (!id.ok()) {
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    caller_ = *std::move(id);
    StartRead();
  }
  void Step(bool ok) { OnRead(ok); }

  void StartRead() {
    StartOp([this] { reader_.Read(&req_, this); });
  }
  void Finish(const grpc::Status& s) {
    r_.reset();
    Finishing();
    StartOp([this, &s] {
      if (s.ok()) {
        reader_.Finish(resp_, s, this);
      } else {
        reader_.FinishWithError(s, this);
      }
    });
  }

  void OnRead(bool ok) {
    MasterService* const service = handler_->service();
    if (!ok) {  // the node finished its stream (or went away)
      if (r_ == nullptr) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "ReconcileNode: empty stream"));
        return;
      }
      if (!last_) {
        // Cancelled, past its deadline, broken, or a message that did
        // not parse: gRPC reports all of these as the end of the stream.
        // The extents so far are not all the node holds.
        Finish(grpc::Status(grpc::StatusCode::ABORTED,
                            "ReconcileNode: the stream ended before its "
                            "last message; nothing was judged"));
        return;
      }
      absl::StatusOr<v1::ReconcileNodeResponse> out =
          service->FinishReconcile(std::move(r_));
      if (out.ok()) resp_ = std::move(*out);
      Finish(ToGrpcStatus(out.status()));
      return;
    }
    if (r_ == nullptr) {
      absl::Status auth =
          CheckNodeIdentity(*service, caller_, req_.node_id(), "ReconcileNode");
      if (auth.ok()) {
        auth = service->CheckNodeAuth(req_.node_id(), req_.incarnation(),
                                      "reconcile", req_.auth());
      }
      auto r = auth.ok() ? service->OpenReconcile(req_.node_id(),
                                                  req_.incarnation(),
                                                  req_.epoch())
                         : decltype(service->OpenReconcile(0, 0, 0))(auth);
      if (!r.ok()) {
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      r_ = std::move(*r);
    }
    if (last_) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "ReconcileNode: a message after the last one"));
      return;
    }
    absl::Status s = r_->Add(req_.extents());
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    last_ = req_.last();
    req_.Clear();
    StartRead();
  }

  Identity caller_;  // set once admitted
  v1::ReconcileNodeRequest req_;
  v1::ReconcileNodeResponse resp_;
  grpc::ServerAsyncReader<v1::ReconcileNodeResponse, v1::ReconcileNodeRequest>
      reader_;
  std::unique_ptr<Reconciliation> r_;
  bool last_ = false;  // the node's final message has arrived
};

// One LookupStream (bidirectional) on a poller: each request message is
// answered as BatchLookup answers it (MasterRpcHandler::LookupAs), inline
// on the poller's thread, one message at a time: read, look up, write,
// read again. The first refusal or failure finishes the stream with its
// status; the caller's end of the stream (or a cancel) finishes it OK.
class LookupStreamCall final : public StreamCall<LookupStreamCall> {
 private:
  friend class StreamCall<LookupStreamCall>;

  LookupStreamCall(MasterRpcHandler* handler, CqPoller* poller)
      : StreamCall(handler, poller), stream_(&ctx_) {}
  ~LookupStreamCall() = default;

  void RequestOn(v1::MasterService::AsyncService* service,
                 grpc::ServerCompletionQueue* cq) {
    service->RequestLookupStream(&ctx_, &stream_, cq, cq, this);
  }
  void Start() {
    absl::Status open = handler_->OpenLookupStream(&ctx_);
    if (!open.ok()) {
      Finish(ToGrpcStatus(open));
      return;
    }
    open_ = true;
    StartRead();
  }
  void Step(bool ok) {
    if (!writing_) {
      if (!ok) {  // the caller closed its end, went away, or cancelled
        Finish(grpc::Status::OK);
        return;
      }
      OnRequest();
      return;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "LookupStream: stream broken"));
      return;
    }
    StartRead();
  }
  void Finished() {
    if (open_) handler_->CloseLookupStream(&ctx_);
  }

  void StartRead() {
    writing_ = false;
    req_.Clear();
    StartOp([this] { stream_.Read(&req_, this); });
  }
  void OnRequest() {
    // Every message is checked, answered and counted as a BatchLookup
    // call is (and refused in its words): a token revoked (the identities
    // reloaded) since the stream opened stops working.
    // Filled in place: the results cleared from the previous answer are
    // reused. (Not an arena: protobuf 3.21's arena destructor of a map
    // field, NodeInfo's transport_params, crashes on Reset.)
    resp_.Clear();
    absl::Status s = handler_->Lookup(&ctx_, req_, &resp_, "BatchLookup");
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    writing_ = true;
    StartOp([this] { stream_.Write(resp_, this); });
  }
  void Finish(const grpc::Status& s) {
    Finishing();
    StartOp([this, &s] { stream_.Finish(s, this); });
  }

  v1::BatchLookupRequest req_;
  v1::BatchLookupResponse resp_;
  grpc::ServerAsyncReaderWriter<v1::BatchLookupResponse,
                                v1::BatchLookupRequest>
      stream_;
  bool writing_ = false;  // the event awaited is a Write's (else a Read's)
  bool open_ = false;     // OpenLookupStream admitted it
};

// One ListObjects stream (server streaming) on a poller: pages of the
// master's listings until the index has been walked.
class ListObjectsCall final : public StreamCall<ListObjectsCall> {
 private:
  friend class StreamCall<ListObjectsCall>;

  ListObjectsCall(MasterRpcHandler* handler, CqPoller* poller)
      : StreamCall(handler, poller), writer_(&ctx_) {}
  ~ListObjectsCall() = default;

  void RequestOn(v1::MasterService::AsyncService* service,
                 grpc::ServerCompletionQueue* cq) {
    service->RequestListObjects(&ctx_, &req_, &writer_, cq, cq, this);
  }
  void Start() {
    auto id = handler_->Admit(&ctx_, MasterRpcHandler::kAdmin, "ListObjects",
                              CallAccess::kRead);
    if (!id.ok()) {
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    page_ = req_.page_size() == 0
                ? 4096
                : std::min<uint32_t>(req_.page_size(), 65536);
    Next();
  }
  void Step(bool ok) {  // a page's Write completed
    if (ok) {
      Next();
    } else {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "ListObjects: stream broken"));
    }
  }

  void Next() {
    resp_.Clear();
    while (more_ && resp_.objects_size() == 0) {
      more_ = handler_->service()->ListObjects(req_.node_id(), &cursor_,
                                               page_, &resp_);
    }
    if (resp_.objects_size() == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    StartOp([this] { writer_.Write(resp_, this); });
  }
  void Finish(const grpc::Status& s) {
    Finishing();
    StartOp([this, &s] { writer_.Finish(s, this); });
  }

  v1::ListObjectsRequest req_;
  v1::ListObjectsResponse resp_;
  grpc::ServerAsyncWriter<v1::ListObjectsResponse> writer_;
  uint32_t page_ = 0;
  uint64_t cursor_ = 0;
  bool more_ = true;
};

// One WatchEvents stream (server streaming, admins only) on a poller:
// writes the master's KV events from the requested position on (see
// MasterService::WatchEvents), a batch per message; when caught up it
// looks again every kPoll (a grpc::Alarm on the poller's queue, so no
// thread waits), and sends an empty message with the latest sequence
// every kKeepAlive so that a subscriber that went away is noticed.
class WatchEventsCall final : public StreamCall<WatchEventsCall> {
 private:
  friend class StreamCall<WatchEventsCall>;
  static constexpr absl::Duration kPoll = absl::Milliseconds(20);
  static constexpr absl::Duration kKeepAlive = absl::Seconds(5);

  WatchEventsCall(MasterRpcHandler* handler, CqPoller* poller)
      : StreamCall(handler, poller), writer_(&ctx_) {}
  ~WatchEventsCall() = default;

  void RequestOn(v1::MasterService::AsyncService* service,
                 grpc::ServerCompletionQueue* cq) {
    service->RequestWatchEvents(&ctx_, &req_, &writer_, cq, cq, this);
  }
  void Start() {
    auto id = handler_->Admit(&ctx_, MasterRpcHandler::kAdmin, "WatchEvents",
                              CallAccess::kRead);
    if (!id.ok()) {
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    last_write_ = absl::Now();
    Next();
  }
  void Step(bool ok) {
    if (waiting_) {  // the alarm fired (or was cancelled at shutdown)
      waiting_ = false;
      Next();
      return;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "WatchEvents: stream broken"));
      return;
    }
    Next();
  }

  void Next() {
    resp_ = handler_->service()->WatchEvents(req_);
    const bool news = resp_.events_size() > 0 || resp_.missed_to() != 0;
    if (!news && absl::Now() - last_write_ < kKeepAlive) {
      waiting_ = true;
      StartOp([this] {
        alarm_.Set(poller_->cq(), absl::ToChronoTime(absl::Now() + kPoll),
                   this);
      });
      return;
    }
    // The next read resumes after what this message carries.
    req_.set_stream_id(resp_.stream_id());
    if (resp_.events_size() > 0) {
      req_.set_after_sequence(resp_.events(resp_.events_size() - 1).sequence());
    } else if (resp_.missed_to() != 0) {
      req_.set_after_sequence(resp_.missed_to());
    }
    last_write_ = absl::Now();
    StartOp([this] { writer_.Write(resp_, this); });
  }
  void Finish(const grpc::Status& s) {
    Finishing();
    StartOp([this, &s] { writer_.Finish(s, this); });
  }

  v1::WatchEventsRequest req_;
  v1::WatchEventsResponse resp_;
  grpc::ServerAsyncWriter<v1::WatchEventsResponse> writer_;
  grpc::Alarm alarm_;
  bool waiting_ = false;
  absl::Time last_write_;
};

void MasterRpcHandler::StartOn(CqPoller* poller) {
  using S = v1::MasterService::AsyncService;
  ServeUnary(poller, &S::RequestRegisterNode, &MasterRpcHandler::RegisterNode);
  ServeUnary(poller, &S::RequestHeartbeat, &MasterRpcHandler::Heartbeat);
  ServeUnary(poller, &S::RequestDeregisterNode,
             &MasterRpcHandler::DeregisterNode);
  ServeUnary(poller, &S::RequestForgetNode, &MasterRpcHandler::ForgetNode);
  ServeUnary(poller, &S::RequestPutStart, &MasterRpcHandler::PutStart);
  // A commit that succeeded is answered when after_commit says (a
  // synchronous commit: once a standby holds it), with what it adds.
  UnaryMethod<S, v1::PutCommitRequest, v1::PutCommitResponse>::HoldFn
      commit_hold = nullptr;
  if (after_commit_) {
    commit_hold = [this](const grpc::Status& handled,
                         v1::PutCommitResponse* resp,
                         std::function<void()> answer) {
      if (!handled.ok()) {
        answer();
        return;
      }
      after_commit_(resp, std::move(answer));
    };
  }
  ServeUnary(poller, &S::RequestPutCommit, &MasterRpcHandler::PutCommit,
             std::move(commit_hold));
  ServeUnary(poller, &S::RequestPutAbort, &MasterRpcHandler::PutAbort);
  ServeUnary(poller, &S::RequestBatchLookup, &MasterRpcHandler::BatchLookup);
  ServeUnary(poller, &S::RequestRemove, &MasterRpcHandler::Remove);
  ServeUnary(poller, &S::RequestListNodes, &MasterRpcHandler::ListNodes);
  ServeUnary(poller, &S::RequestGetStats, &MasterRpcHandler::GetStats);
  ServeUnary(poller, &S::RequestBeginReconcile,
             &MasterRpcHandler::BeginReconcile);
  ServeUnary(poller, &S::RequestReportMissing,
             &MasterRpcHandler::ReportMissing);
  ServeUnary(poller, &S::RequestListTenants, &MasterRpcHandler::ListTenants);
  ServeUnary(poller, &S::RequestSetTenantQuota,
             &MasterRpcHandler::SetTenantQuota);
  ServeUnary(poller, &S::RequestSetNodeDraining,
             &MasterRpcHandler::SetNodeDraining);
  ServeUnary(poller, &S::RequestInspectKey, &MasterRpcHandler::InspectKey);
  ServeUnary(poller, &S::RequestPrefixQuery, &MasterRpcHandler::PrefixQuery);
  ServeUnary(poller, &S::RequestReportEngineBlocks,
             &MasterRpcHandler::ReportEngineBlocks);
  ReconcileCall::Request(this, poller);
  ListObjectsCall::Request(this, poller);
  WatchEventsCall::Request(this, poller);
  for (int i = 0; i < kRequestsPerMethod; ++i) {
    LookupStreamCall::Request(this, poller);
  }
}
}  // namespace master
}  // namespace hymcache
