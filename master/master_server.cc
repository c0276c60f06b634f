#include "master/master_server.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/net.h"
#include "master/master_service.h"
#include "master/metadata_store.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

namespace {

// absl and gRPC use the same canonical code numbers.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Large enough for max_batch_keys keys of max_key_bytes each plus framing.
constexpr int kMinMaxMessageBytes = 16 << 20;

}  // namespace

// The gRPC adapter: every method runs MasterService inline on the callback
// thread (the work is in-memory plus at most one RocksDB batch write) and
// finishes the default reactor.
class MasterRpcHandler final : public v1::MasterService::CallbackService {
 public:
  explicit MasterRpcHandler(MasterService* service) : service_(service) {}


  template <typename Response>
  static grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                         absl::StatusOr<Response> result,
                                         Response* response) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpc(result.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* RegisterNode(
      grpc::CallbackServerContext* ctx, const v1::RegisterNodeRequest* req,
      v1::RegisterNodeResponse* resp) override {
    return Reply(ctx, service_->RegisterNode(*req), resp);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    return Reply(ctx, service_->Heartbeat(*req), resp);
  }
  grpc::ServerUnaryReactor* DeregisterNode(
      grpc::CallbackServerContext* ctx, const v1::DeregisterNodeRequest* req,
      v1::DeregisterNodeResponse* resp) override {
    return Reply(ctx, service_->DeregisterNode(*req), resp);
  }
  grpc::ServerUnaryReactor* PutStart(grpc::CallbackServerContext* ctx,
                                     const v1::PutStartRequest* req,
                                     v1::PutStartResponse* resp) override {
    return Reply(ctx, service_->PutStart(*req), resp);
  }
  grpc::ServerUnaryReactor* PutCommit(grpc::CallbackServerContext* ctx,
                                      const v1::PutCommitRequest* req,
                                      v1::PutCommitResponse* resp) override {
    return Reply(ctx, service_->PutCommit(*req), resp);
  }
  grpc::ServerUnaryReactor* PutAbort(grpc::CallbackServerContext* ctx,
                                     const v1::PutAbortRequest* req,
                                     v1::PutAbortResponse* resp) override {
    return Reply(ctx, service_->PutAbort(*req), resp);
  }
  grpc::ServerUnaryReactor* BatchLookup(
      grpc::CallbackServerContext* ctx, const v1::BatchLookupRequest* req,
      v1::BatchLookupResponse* resp) override {
    return Reply(ctx, service_->BatchLookup(*req), resp);
  }
  grpc::ServerUnaryReactor* Remove(grpc::CallbackServerContext* ctx,
                                   const v1::RemoveRequest* req,
                                   v1::RemoveResponse* resp) override {
    return Reply(ctx, service_->Remove(*req), resp);
  }
  grpc::ServerUnaryReactor* BeginReconcile(
      grpc::CallbackServerContext* ctx, const v1::BeginReconcileRequest* req,
      v1::BeginReconcileResponse* resp) override {
    absl::Status auth = service_->CheckNodeAuth(
        req->node_id(), req->incarnation(), "reconcile", req->auth());
    absl::StatusOr<uint64_t> epoch =
        auth.ok() ? service_->StartReconcile(req->node_id(), req->incarnation())
                  : absl::StatusOr<uint64_t>(auth);
    if (!epoch.ok()) {
      return Reply(ctx, absl::StatusOr<v1::BeginReconcileResponse>(
                            epoch.status()),
                   resp);
    }
    v1::BeginReconcileResponse r;
    r.set_epoch(*epoch);
    return Reply(ctx, absl::StatusOr<v1::BeginReconcileResponse>(std::move(r)),
                 resp);
  }

  grpc::ServerUnaryReactor* ReportMissing(
      grpc::CallbackServerContext* ctx, const v1::ReportMissingRequest* req,
      v1::ReportMissingResponse* resp) override {
    return Reply(ctx, service_->ReportMissing(*req), resp);
  }

  // Reads the node's extents chunk by chunk; compares at the end of the
  // stream (see MasterService::FinishReconcile).
  grpc::ServerReadReactor<v1::ReconcileNodeRequest>* ReconcileNode(
      grpc::CallbackServerContext* /*ctx*/,
      v1::ReconcileNodeResponse* resp) override {
    // gRPC never runs two callbacks of one reactor at once but hands them
    // between its threads through synchronization TSan cannot see (Debian's
    // gRPC is not instrumented): each callback starts with TsanAcquire(this)
    // and every StartRead/StartWrite/Finish is preceded by TsanRelease(this).
    class Reader final : public grpc::ServerReadReactor<v1::ReconcileNodeRequest> {
     public:
      Reader(MasterService* service, v1::ReconcileNodeResponse* resp)
          : service_(service), resp_(resp) {
        TsanRelease(this);
        StartRead(&req_);
      }
      void OnReadDone(bool ok) override {
        TsanAcquire(this);
        OnRead(ok);
      }
      void OnDone() override {
        TsanAcquire(this);
        delete this;
      }

     private:
      void OnRead(bool ok) {
        if (!ok) {  // the node finished its stream (or went away)
          if (r_ == nullptr) {
            TsanRelease(this);
            Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "ReconcileNode: empty stream"));
            return;
          }
          absl::StatusOr<v1::ReconcileNodeResponse> out =
              service_->FinishReconcile(std::move(r_));
          if (out.ok()) *resp_ = std::move(*out);
          TsanRelease(this);
          Finish(ToGrpc(out.status()));
          return;
        }
        if (r_ == nullptr) {
          absl::Status auth = service_->CheckNodeAuth(
              req_.node_id(), req_.incarnation(), "reconcile", req_.auth());
          auto r = auth.ok() ? service_->OpenReconcile(req_.node_id(),
                                                       req_.incarnation(),
                                                       req_.epoch())
                             : decltype(service_->OpenReconcile(0, 0, 0))(auth);
          if (!r.ok()) {
            TsanRelease(this);
            Finish(ToGrpc(r.status()));
            return;
          }
          r_ = std::move(*r);
        }
        absl::Status s = r_->Add(req_.extents());
        if (!s.ok()) {
          TsanRelease(this);
          Finish(ToGrpc(s));
          return;
        }
        req_.Clear();
        TsanRelease(this);
        StartRead(&req_);
      }

      MasterService* const service_;
      v1::ReconcileNodeResponse* const resp_;
      v1::ReconcileNodeRequest req_;
      std::unique_ptr<Reconciliation> r_;
    };
    return new Reader(service_, resp);
  }

  // Pages of the master's listings until the index has been walked.
  grpc::ServerWriteReactor<v1::ListObjectsResponse>* ListObjects(
      grpc::CallbackServerContext* /*ctx*/,
      const v1::ListObjectsRequest* req) override {
    class Writer final
        : public grpc::ServerWriteReactor<v1::ListObjectsResponse> {
     public:
      Writer(MasterService* service, const v1::ListObjectsRequest& req)
          : service_(service),
            node_id_(req.node_id()),
            page_(req.page_size() == 0
                      ? 4096
                      : std::min<uint32_t>(req.page_size(), 65536)) {
        Next();
      }
      void OnWriteDone(bool ok) override {
        TsanAcquire(this);
        if (ok) {
          Next();
        } else {
          TsanRelease(this);
          Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                              "ListObjects: stream broken"));
        }
      }
      void OnDone() override {
        TsanAcquire(this);
        delete this;
      }

     private:
      void Next() {
        resp_.Clear();
        while (more_ && resp_.objects_size() == 0) {
          more_ = service_->ListObjects(node_id_, &cursor_, page_, &resp_);
        }
        if (resp_.objects_size() == 0) {
          TsanRelease(this);
          Finish(grpc::Status::OK);
          return;
        }
        TsanRelease(this);
        StartWrite(&resp_);
      }

      MasterService* const service_;
      const uint32_t node_id_;
      const uint32_t page_;
      uint64_t cursor_ = 0;
      bool more_ = true;
      v1::ListObjectsResponse resp_;
    };
    return new Writer(service_, *req);
  }

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const v1::ListNodesRequest* /*req*/,
                                      v1::ListNodesResponse* resp) override {
    return Reply(ctx, absl::StatusOr<v1::ListNodesResponse>(
                          service_->ListNodes()),
                 resp);
  }
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* /*req*/,
                                     v1::GetStatsResponse* resp) override {
    return Reply(ctx, absl::StatusOr<v1::GetStatsResponse>(
                          service_->GetStats()),
                 resp);
  }

 private:
  MasterService* const service_;
};

}  // namespace master

absl::Status MasterOptions::Validate() const {
  if (db_path.empty()) {
    return absl::InvalidArgumentError("master: db_path is required");
  }
  auto hp = SplitHostPort(listen_address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master: listen_address: ", hp.status().message()));
  }
  master::MasterServiceOptions so;
  so.node_timeout = node_timeout;
  so.heartbeat_interval = heartbeat_interval;
  so.put_timeout = put_timeout;
  so.max_batch_keys = max_batch_keys;
  so.max_key_bytes = max_key_bytes;
  so.max_object_bytes = max_object_bytes;
  so.read_lease = read_lease;
  so.capability_lifetime = capability_lifetime;
  so.max_evictions_per_put = max_evictions_per_put;
  so.reconcile_interval = reconcile_interval;
  absl::Status s = so.Validate();
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("master: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MasterServer>> MasterServer::Create(
    const MasterOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;

  master::RocksDbMetadataStoreOptions store_options;
  store_options.path = options.db_path;
  store_options.sync_writes = options.sync_writes;
  auto store = master::RocksDbMetadataStore::Create(store_options);
  if (!store.ok()) return store.status();

  master::MasterServiceOptions so;
  so.node_timeout = options.node_timeout;
  so.heartbeat_interval = options.heartbeat_interval;
  so.put_timeout = options.put_timeout;
  so.max_batch_keys = options.max_batch_keys;
  so.max_key_bytes = options.max_key_bytes;
  so.max_object_bytes = options.max_object_bytes;
  so.read_lease = options.read_lease;
  so.capability_lifetime = options.capability_lifetime;
  so.max_evictions_per_put = options.max_evictions_per_put;
  so.reconcile_interval = options.reconcile_interval;
  so.clock = options.clock;
  auto service = master::MasterService::Create(so, std::move(store).value());
  if (!service.ok()) return service.status();

  std::unique_ptr<MasterServer> server(new MasterServer);
  server->service_ = std::move(service).value();
  server->handler_ =
      std::make_unique<master::MasterRpcHandler>(server->service_.get());

  const int max_message = static_cast<int>(std::min<uint64_t>(
      INT32_MAX,
      std::max<uint64_t>(
          master::kMinMaxMessageBytes,
          uint64_t{options.max_batch_keys} * (options.max_key_bytes + 16) +
              (1 << 20))));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address,
                           grpc::InsecureServerCredentials(), &port);
  // Without this, gRPC sets SO_REUSEPORT and a second master would bind the
  // same port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.RegisterService(server->handler_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    if (server->server_) server->server_->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "master: cannot listen on ", options.listen_address));
  }
  server->port_ = port;
  std::string host = SplitHostPort(options.listen_address)->first;
  if (host == "0.0.0.0" || host == "::" || host == "*") host = "127.0.0.1";
  server->address_ = host.find(':') != std::string::npos
                         ? absl::StrCat("[", host, "]:", port)
                         : absl::StrCat(host, ":", port);

  const absl::Duration interval = std::clamp(
      options.put_timeout / 4, absl::Milliseconds(10), absl::Seconds(1));
  MasterServer* raw = server.get();
  server->reaper_ =
      Thread("master-reaper", [raw, interval] { raw->ReaperLoop(interval); });
  LOG(INFO) << "master serving on " << server->address_ << " (db "
            << options.db_path << ")";
  return server;
}

MasterServer::~MasterServer() { Shutdown(); }

void MasterServer::ReaperLoop(absl::Duration interval) {
  while (true) {
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      cv_.WaitWithDeadline(&mu_, absl::Now() + interval);
      if (stopping_) return;
    }
    service_->ReapExpired();
  }
}

void MasterServer::Shutdown() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
  reaper_.Join();
  server_.reset();
  handler_.reset();
  service_.reset();  // closes RocksDB
  LOG(INFO) << "master on " << address_ << " stopped";
  MutexLock l(&mu_);
  stopped_ = true;
  cv_.SignalAll();
}

void MasterServer::Wait() {
  MutexLock l(&mu_);
  while (!stopped_) cv_.Wait(&mu_);
}

}  // namespace hymcache
