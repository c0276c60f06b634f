#include "master/master_server.h"

#include <glog/logging.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/health_probe.h"
#include "common/metrics_exporter.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/stats.h"
#include "common/wire.h"
#include "master/cq_server.h"
#include "master/health_service.h"
#include "master/master_service.h"
#include "master/metadata_store.h"
#include "master/tenant.h"
#include "master/tenants.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

namespace {

// Who a caller is, for the per-caller limits (pending puts): its peer
// address without the port ("ipv4:10.0.0.7", "ipv6:[::1]"). One small
// function, so that an authenticated identity can replace it.
std::string CallerKey(const grpc::ServerContext* ctx) {
  std::string peer = ctx->peer();
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon != std::string::npos && colon != first) peer.resize(colon);
  return peer;
}

// A node identity bound to names (nodes= in the identities file) acts
// only as those nodes. An id the master does not know passes: the service
// answers it (NOT_FOUND, or a heartbeat's reregister).
absl::Status CheckNodeIdentity(const MasterService& service, const Identity& id,
                               uint32_t node_id, const char* method) {
  if (id.node_names.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> name = service.NodeName(node_id);
  if (!name.ok()) return absl::OkStatus();
  return CheckNodeName(id, *name, method);
}

// Large enough for max_batch_keys keys of max_key_bytes each plus framing.
constexpr int kMinMaxMessageBytes = 16 << 20;

}  // namespace

// The gRPC adapter: every method runs MasterService inline on the poller
// thread that received the call (master/cq_server.h; the work is in-memory
// plus at most one RocksDB batch write) and returns the call's status.
//
// Every method first checks the caller's identity (Admit): engines (and
// admins, for hymctl put/get) read and write blocks; admins list and
// remove; nodes register, heartbeat and reconcile.
// The RPC layer's stats, declared once (common/stats.h).
#define HYM_MASTER_RPC_STATS(COUNTER, GAUGE, DGAUGE)                         \
  COUNTER(lookups, "BatchLookup calls answered OK")                          \
  COUNTER(lookup_keys, "Keys of the BatchLookup calls answered OK")          \
  COUNTER(lookup_hits, "Keys found by BatchLookup")                          \
  COUNTER(lookup_prefix_hits, "Keys in the leading run of hits (what a Load reads)") \
  COUNTER(lookup_errors, "BatchLookup calls refused or failed")            \
  COUNTER(lookup_streams_opened, "LookupStream streams admitted")           \
  COUNTER(lookup_streams_refused,                                           \
          "LookupStream streams refused (caller, limit, shutdown)")         \
  GAUGE(lookup_streams_open, "LookupStream streams open now")
HYM_DECLARE_STATS(MasterRpcStats, MasterRpcCounters, HYM_MASTER_RPC_STATS);

class MasterRpcHandler final {
 public:
  MasterRpcHandler(MasterService* service, const Authenticator* auth,
                   TenantRegistry* tenants, uint32_t max_key_bytes,
                   uint32_t max_lookup_streams, Clock* clock)
      : service_(service),
        auth_(auth),
        tenants_(tenants),
        max_key_bytes_(max_key_bytes),
        max_lookup_streams_(max_lookup_streams),
        clock_(clock) {}

  // Tenants (master/tenant.h): the keys a caller sends name its own
  // tenant's key space. InvalidArgument for a key longer than the
  // configured limit, or one of the default tenant spelling a qualified key
  // (admins may: fsck hands back the keys ListObjects gave it).
  absl::Status CheckKeys(const Identity& id,
                         const google::protobuf::RepeatedPtrField<std::string>&
                             keys,
                         const char* method) const {
    for (const std::string& k : keys) {
      absl::Status s = CheckKey(id, k, method);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status CheckKey(const Identity& id, const std::string& k,
                        const char* method) const {
    if (k.size() > max_key_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          method, ": a key of ", k.size(), " bytes (at most ", max_key_bytes_,
          ")"));
    }
    if (id.role != Role::kAdmin && id.tenant == kDefaultTenantName &&
        IsQualifiedKey(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          method, ": a key begins with the reserved tenant marker"));
    }
    return absl::OkStatus();
  }
  // Whether the caller's keys are rewritten (a tenant other than default).
  static bool Rewrites(const Identity& id) {
    return id.tenant != kDefaultTenantName;
  }
  static void Qualify(const Identity& id, std::string* key) {
    if (id.role == Role::kAdmin && IsQualifiedKey(*key)) return;
    *key = QualifyKey(id.tenant, *key);
  }
  static void QualifyAll(const Identity& id,
                         google::protobuf::RepeatedPtrField<std::string>* keys) {
    for (std::string& k : *keys) Qualify(id, &k);
  }

  static constexpr Roles kEngine = Roles(Role::kEngine) | Role::kAdmin;
  static constexpr Roles kAdmin = Role::kAdmin;
  static constexpr Roles kNode = Role::kNode;

  // The caller, if it may call `method`; AnonymousAdmin() when
  // authentication is off.
  absl::StatusOr<Identity> Admit(grpc::ServerContext* ctx,
                                 Roles allowed, const char* method) const {
    if (auth_ == nullptr) return AnonymousAdmin();
    absl::StatusOr<Identity> id = auth_->Check(*ctx, allowed, method);
    if (!id.ok()) {
      LOG_EVERY_N(WARNING, 100)
          << "master: refused a call from " << ctx->peer() << ": "
          << id.status() << " (every 100th refusal logged)";
    }
    return id;
  }

  // Whose pending puts a PutStart counts against (the per-caller limits):
  // the identity when identities are configured, else the peer's address.
  std::string CallerKeyOf(const grpc::ServerContext* ctx,
                          const Identity& id) const {
    if (auth_ == nullptr) return CallerKey(ctx);
    return absl::StrCat("id:", id.tenant, "/", id.name);
  }

  // With identities, only the tenant that started a put may commit or
  // abort it (put ids are small integers anyone could guess).
  absl::Status OwnPut(const Identity& id, uint64_t put_id,
                      const char* method) const {
    if (auth_ == nullptr || tenants_->OwnsPut(put_id, id.tenant)) {
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(method, ": no pending put ",
                                            put_id, " of tenant '", id.tenant,
                                            "'"));
  }

  static grpc::Status Refuse(grpc::ServerContext* /*ctx*/,
                             const absl::Status& s) {
    return ToGrpcStatus(s);
  }


  template <typename Response>
  static grpc::Status Reply(grpc::ServerContext* /*ctx*/,
                            absl::StatusOr<Response> result,
                            Response* response) {
    if (result.ok()) *response = std::move(*result);
    return ToGrpcStatus(result.status());
  }

  grpc::Status RegisterNode(
      grpc::ServerContext* ctx, const v1::RegisterNodeRequest* req,
      v1::RegisterNodeResponse* resp) {
    auto id = Admit(ctx, kNode, "RegisterNode");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckNodeName(*id, req->name(), "RegisterNode");
        !s.ok()) {
      return Refuse(ctx, s);
    }
    return Reply(ctx, service_->RegisterNode(*req), resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) {
    auto id = Admit(ctx, kNode, "Heartbeat");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s =
            CheckNodeIdentity(*service_, *id, req->node_id(), "Heartbeat");
        !s.ok()) {
      return Refuse(ctx, s);
    }
    return Reply(ctx, service_->Heartbeat(*req), resp);
  }
  grpc::Status DeregisterNode(
      grpc::ServerContext* ctx, const v1::DeregisterNodeRequest* req,
      v1::DeregisterNodeResponse* resp) {
    auto id = Admit(ctx, kNode, "DeregisterNode");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s =
            CheckNodeIdentity(*service_, *id, req->node_id(), "DeregisterNode");
        !s.ok()) {
      return Refuse(ctx, s);
    }
    return Reply(ctx, service_->DeregisterNode(*req), resp);
  }
  grpc::Status ForgetNode(grpc::ServerContext* ctx,
                                       const v1::ForgetNodeRequest* req,
                                       v1::ForgetNodeResponse* resp) {
    auto id = Admit(ctx, kAdmin, "ForgetNode");
    if (!id.ok()) return Refuse(ctx, id.status());
    return Reply(ctx, service_->ForgetNode(*req), resp);
  }
  grpc::Status PutStart(grpc::ServerContext* ctx,
                                     const v1::PutStartRequest* req,
                                     v1::PutStartResponse* resp) {
    auto id = Admit(ctx, kEngine, "PutStart");
    if (!id.ok()) return Refuse(ctx, id.status());
    absl::Status s = CheckKeys(*id, req->keys(), "PutStart");
    if (s.ok()) s = CheckKey(*id, req->parent_key(), "PutStart");
    if (!s.ok()) return Refuse(ctx, s);
    const v1::PutStartRequest* r = req;
    v1::PutStartRequest qualified;
    if (Rewrites(*id)) {
      qualified = *req;
      QualifyAll(*id, qualified.mutable_keys());
      if (!qualified.parent_key().empty()) {
        Qualify(*id, qualified.mutable_parent_key());
      }
      r = &qualified;
    }
    // The service enforces the quota (evicting the tenant's own objects
    // first) under its lock, counting pending puts.
    const TenantQuota quota = tenants_->Quota(id->tenant);
    bool over_quota = false;
    absl::StatusOr<v1::PutStartResponse> out = service_->PutStart(
        *r, CallerKeyOf(ctx, *id),
        TenantLimit{quota.max_objects, quota.max_bytes}, &over_quota);
    if (over_quota) tenants_->CountQuotaRefusal(id->tenant);
    if (out.ok() && auth_ != nullptr) {
      tenants_->NotePut(out->put_id(), id->tenant,
                        absl::FromUnixMillis(out->expires_unix_ms()),
                        clock_->Now());
    }
    return Reply(ctx, std::move(out), resp);
  }
  grpc::Status PutCommit(grpc::ServerContext* ctx,
                                      const v1::PutCommitRequest* req,
                                      v1::PutCommitResponse* resp) {
    auto id = Admit(ctx, kEngine, "PutCommit");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = OwnPut(*id, req->put_id(), "PutCommit"); !s.ok()) {
      return Refuse(ctx, s);
    }
    absl::StatusOr<v1::PutCommitResponse> out = service_->PutCommit(*req);
    if (out.ok()) tenants_->ForgetPut(req->put_id());
    return Reply(ctx, std::move(out), resp);
  }
  grpc::Status PutAbort(grpc::ServerContext* ctx,
                                     const v1::PutAbortRequest* req,
                                     v1::PutAbortResponse* resp) {
    auto id = Admit(ctx, kEngine, "PutAbort");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = OwnPut(*id, req->put_id(), "PutAbort"); !s.ok()) {
      return Refuse(ctx, s);
    }
    absl::StatusOr<v1::PutAbortResponse> out = service_->PutAbort(*req);
    if (out.ok()) tenants_->ForgetPut(req->put_id());
    return Reply(ctx, std::move(out), resp);
  }
  grpc::Status BatchLookup(
      grpc::ServerContext* ctx, const v1::BatchLookupRequest* req,
      v1::BatchLookupResponse* resp) {
    return ToGrpcStatus(Lookup(ctx, *req, resp, "BatchLookup"));
  }
  // One BatchLookup by the caller of `ctx`: the unary call's and each
  // LookupStream message's work, checked and counted the same. `method`
  // names it in errors.
  absl::Status Lookup(grpc::ServerContext* ctx,
                      const v1::BatchLookupRequest& req,
                      v1::BatchLookupResponse* resp, const char* method) {
    auto caller = Admit(ctx, kEngine, method);
    if (!caller.ok()) {
      Add(rpc_stats_.lookup_errors);
      return caller.status();
    }
    const Identity& id = *caller;
    if (absl::Status s = CheckKeys(id, req.keys(), method); !s.ok()) {
      Add(rpc_stats_.lookup_errors);
      return s;
    }
    const absl::Time start = absl::Now();
    absl::Status s;
    if (!Rewrites(id)) {
      s = service_->BatchLookupInto(req, resp);
    } else {
      v1::BatchLookupRequest qualified = req;
      QualifyAll(id, qualified.mutable_keys());
      s = service_->BatchLookupInto(qualified, resp);
    }
    CountLookup(s, *resp, absl::Now() - start);
    return s;
  }

  // LookupStream bookkeeping (LookupStreamCall). Admits a new stream:
  // Admit's refusals, Unavailable once CancelLookupStreams ran,
  // ResourceExhausted beyond max_lookup_streams open.
  absl::Status OpenLookupStream(grpc::ServerContext* ctx) {
    absl::Status s = Admit(ctx, kEngine, "LookupStream").status();
    MutexLock l(&streams_mu_);
    if (!s.ok()) {
      // counted below
    } else if (streams_cancelled_) {
      s = absl::UnavailableError("LookupStream: the master is shutting down");
    } else if (open_streams_.size() >= max_lookup_streams_) {
      s = absl::ResourceExhaustedError(absl::StrCat(
          "LookupStream: ", max_lookup_streams_,
          " streams open (the master's max_lookup_streams); use BatchLookup"));
    } else {
      open_streams_.insert(ctx);
      Add(rpc_stats_.lookup_streams_opened);
      return s;
    }
    Add(rpc_stats_.lookup_streams_refused);
    return s;
  }
  // The stream OpenLookupStream admitted is over (before its ctx goes).
  void CloseLookupStream(grpc::ServerContext* ctx) {
    MutexLock l(&streams_mu_);
    open_streams_.erase(ctx);
  }
  // Ends every open stream (CANCELLED) and refuses new ones: an open
  // stream would otherwise hold the server's graceful shutdown to its
  // deadline. The streams' pollers finish them. Call before the server's
  // Shutdown.
  void CancelLookupStreams() {
    MutexLock l(&streams_mu_);
    streams_cancelled_ = true;
    for (grpc::ServerContext* ctx : open_streams_) ctx->TryCancel();
  }
  grpc::Status Remove(grpc::ServerContext* ctx,
                                   const v1::RemoveRequest* req,
                                   v1::RemoveResponse* resp) {
    auto id = Admit(ctx, kAdmin, "Remove");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckKeys(*id, req->keys(), "Remove"); !s.ok()) {
      return Refuse(ctx, s);
    }
    if (!Rewrites(*id)) return Reply(ctx, service_->Remove(*req), resp);
    v1::RemoveRequest qualified = *req;
    QualifyAll(*id, qualified.mutable_keys());
    return Reply(ctx, service_->Remove(qualified), resp);
  }
  grpc::Status BeginReconcile(
      grpc::ServerContext* ctx, const v1::BeginReconcileRequest* req,
      v1::BeginReconcileResponse* resp) {
    auto id = Admit(ctx, kNode, "BeginReconcile");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s =
            CheckNodeIdentity(*service_, *id, req->node_id(), "BeginReconcile");
        !s.ok()) {
      return Refuse(ctx, s);
    }
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

  grpc::Status ReportMissing(
      grpc::ServerContext* ctx, const v1::ReportMissingRequest* req,
      v1::ReportMissingResponse* resp) {
    auto id = Admit(ctx, kEngine, "ReportMissing");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckKeys(*id, req->keys(), "ReportMissing");
        !s.ok()) {
      return Refuse(ctx, s);
    }
    if (!Rewrites(*id)) return Reply(ctx, service_->ReportMissing(*req), resp);
    v1::ReportMissingRequest qualified = *req;
    QualifyAll(*id, qualified.mutable_keys());
    return Reply(ctx, service_->ReportMissing(qualified), resp);
  }

  grpc::Status ListNodes(grpc::ServerContext* ctx,
                                      const v1::ListNodesRequest* /*req*/,
                                      v1::ListNodesResponse* resp) {
    auto id = Admit(ctx, kAdmin, "ListNodes");
    if (!id.ok()) return Refuse(ctx, id.status());
    return Reply(ctx, absl::StatusOr<v1::ListNodesResponse>(
                          service_->ListNodes()),
                 resp);
  }
  grpc::Status ListTenants(grpc::ServerContext* ctx,
                                        const v1::ListTenantsRequest* req,
                                        v1::ListTenantsResponse* resp) {
    auto id = Admit(ctx, kAdmin, "ListTenants");
    if (!id.ok()) return Refuse(ctx, id.status());
    auto usage = service_->AllTenantUsage();
    std::map<std::string, v1::TenantInfo> rows;
    for (const auto& [t, u] : usage) {
      rows[t].set_objects(u.objects);
      rows[t].set_bytes(u.bytes);
    }
    for (const auto& [t, q] : tenants_->Quotas()) {
      rows[t].set_max_objects(q.max_objects);
      rows[t].set_max_bytes(q.max_bytes);
    }
    if (!req->tenant().empty()) rows[req->tenant()];  // even if empty
    const auto evictions = service_->QuotaEvictionsByTenant();
    v1::ListTenantsResponse out;
    for (auto& [t, info] : rows) {
      if (!req->tenant().empty() && t != req->tenant()) continue;
      info.set_tenant(t);
      info.set_quota_refusals(tenants_->QuotaRefusals(t));
      if (auto e = evictions.find(t); e != evictions.end()) {
        info.set_quota_evictions(e->second);
      }
      *out.add_tenants() = std::move(info);
    }
    return Reply(ctx, absl::StatusOr<v1::ListTenantsResponse>(std::move(out)),
                 resp);
  }
  grpc::Status SetTenantQuota(
      grpc::ServerContext* ctx, const v1::SetTenantQuotaRequest* req,
      v1::SetTenantQuotaResponse* resp) {
    auto id = Admit(ctx, kAdmin, "SetTenantQuota");
    if (!id.ok()) return Refuse(ctx, id.status());
    absl::Status s = tenants_->SetQuota(
        req->tenant(), TenantQuota{req->max_objects(), req->max_bytes()});
    if (s.ok()) {
      LOG(INFO) << "master: tenant '" << req->tenant() << "' quota set to "
                << req->max_objects() << " objects, " << req->max_bytes()
                << " bytes by '" << id->name << "'";
    }
    return Reply(ctx,
                 s.ok() ? absl::StatusOr<v1::SetTenantQuotaResponse>(
                              v1::SetTenantQuotaResponse())
                        : absl::StatusOr<v1::SetTenantQuotaResponse>(s),
                 resp);
  }
  grpc::Status SetNodeDraining(
      grpc::ServerContext* ctx, const v1::SetNodeDrainingRequest* req,
      v1::SetNodeDrainingResponse* resp) {
    auto id = Admit(ctx, kAdmin, "SetNodeDraining");
    if (!id.ok()) return Refuse(ctx, id.status());
    auto out = service_->SetNodeDraining(*req);
    if (out.ok() && out->changed()) {
      LOG(INFO) << "master: node '" << absl::CHexEscape(req->name()) << "' "
                << (req->draining() ? "drained" : "undrained") << " by '"
                << id->name << "'";
    }
    return Reply(ctx, std::move(out), resp);
  }
  grpc::Status InspectKey(grpc::ServerContext* ctx,
                                       const v1::InspectKeyRequest* req,
                                       v1::InspectKeyResponse* resp) {
    auto id = Admit(ctx, kAdmin, "InspectKey");
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckKey(*id, req->key(), "InspectKey"); !s.ok()) {
      return Refuse(ctx, s);
    }
    if (!Rewrites(*id)) return Reply(ctx, service_->InspectKey(*req), resp);
    v1::InspectKeyRequest qualified = *req;
    Qualify(*id, qualified.mutable_key());
    return Reply(ctx, service_->InspectKey(qualified), resp);
  }
  grpc::Status GetStats(grpc::ServerContext* ctx,
                                     const v1::GetStatsRequest* /*req*/,
                                     v1::GetStatsResponse* resp) {
    auto id = Admit(ctx, kAdmin, "GetStats");
    if (!id.ok()) return Refuse(ctx, id.status());
    v1::GetStatsResponse r = service_->GetStats();
    FlatStatsVisitor flat;
    VisitStats(&flat);
    service_->counters().Visit(&flat);
    for (const auto& [name, value] : flat.values()) {
      (*r.mutable_stats())[name] = value;
    }
    return Reply(ctx, absl::StatusOr<v1::GetStatsResponse>(std::move(r)),
                 resp);
  }

  // Requests every method's first call on `poller`'s queue (the streaming
  // ones included; see ReconcileCall and ListObjectsCall). Call on the
  // poller's thread. REQUIRES: this outlives the poller's drain.
  void StartOn(CqPoller* poller);

  MasterService* service() const { return service_; }
  v1::MasterService::AsyncService* async_service() { return &async_; }

  // The RPC layer's stats and the lookup latency histogram.
  void VisitStats(StatsVisitor* v) const {
    MasterRpcStats st = rpc_stats_.Load();
    {
      MutexLock l(&streams_mu_);
      st.lookup_streams_open = open_streams_.size();
    }
    st.Visit(v);
    v->Histogram("lookup_seconds",
                 "BatchLookup calls answered OK: time in the service",
                 lookup_latency_.Snapshot());
  }

 private:
  // Relaxed atomic adds and a lock-free histogram: nothing here serializes
  // lookups.
  void CountLookup(const absl::Status& s, const v1::BatchLookupResponse& r,
                   absl::Duration took) {
    if (!s.ok()) {
      Add(rpc_stats_.lookup_errors);
      return;
    }
    uint64_t keys = 0;
    uint64_t hits = 0;
    if (!r.packed_results().empty()) {
      const std::string& p = r.packed_results();
      keys = p.size() / wire::kLookupRecordBytes;
      for (size_t off = 0; off < p.size(); off += wire::kLookupRecordBytes) {
        hits += absl::little_endian::Load32(p.data() + off) != 0 ? 1 : 0;
      }
    } else {
      keys = static_cast<uint64_t>(r.results_size());
      for (const v1::LookupResult& x : r.results()) hits += x.found() ? 1 : 0;
    }
    Add(rpc_stats_.lookups);
    Add(rpc_stats_.lookup_keys, keys);
    Add(rpc_stats_.lookup_hits, hits);
    Add(rpc_stats_.lookup_prefix_hits, r.hit_prefix_length());
    lookup_latency_.Observe(took);
  }

  MasterService* const service_;
  const Authenticator* const auth_;  // null: authentication off
  TenantRegistry* const tenants_;
  const uint32_t max_key_bytes_;  // as the caller sends them
  const size_t max_lookup_streams_;
  Clock* const clock_;
  MasterRpcCounters rpc_stats_;
  LatencyHistogram lookup_latency_;
  mutable Mutex streams_mu_;
  bool streams_cancelled_ ABSL_GUARDED_BY(streams_mu_) = false;
  absl::flat_hash_set<grpc::ServerContext*> open_streams_
      ABSL_GUARDED_BY(streams_mu_);
  // Calls of each unary method a poller keeps requested: calls gRPC has
  // received beyond these wait unmatched, and a shutdown cancels those
  // (the matched ones run to the end). About 1 KiB each.
  static constexpr int kRequestsPerMethod = 8;

  v1::MasterService::AsyncService async_;
  // The UnaryMethods StartOn made (one per method and poller).
  Mutex methods_mu_;
  std::vector<std::shared_ptr<const void>> methods_
      ABSL_GUARDED_BY(methods_mu_);

  // Serves the unary method `request` / `handle` on `poller`.
  template <typename Req, typename Resp>
  void ServeUnary(
      CqPoller* poller,
      typename UnaryMethod<v1::MasterService::AsyncService, Req,
                           Resp>::RequestFn request,
      grpc::Status (MasterRpcHandler::*handle)(grpc::ServerContext*,
                                               const Req*, Resp*)) {
    using Method = UnaryMethod<v1::MasterService::AsyncService, Req, Resp>;
    auto method = std::make_shared<Method>(Method{
        &async_, request,
        [this, handle](grpc::ServerContext* ctx, const Req& req, Resp* resp) {
          return (this->*handle)(ctx, &req, resp);
        },
        poller});
    {
      MutexLock l(&methods_mu_);
      methods_.push_back(method);
    }
    for (int i = 0; i < kRequestsPerMethod; ++i) {
      UnaryCall<v1::MasterService::AsyncService, Req, Resp>::Request(
          method.get());
    }
  }
};

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
    auto id = handler_->Admit(&ctx_, MasterRpcHandler::kAdmin, "ListObjects");
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

void MasterRpcHandler::StartOn(CqPoller* poller) {
  using S = v1::MasterService::AsyncService;
  ServeUnary(poller, &S::RequestRegisterNode, &MasterRpcHandler::RegisterNode);
  ServeUnary(poller, &S::RequestHeartbeat, &MasterRpcHandler::Heartbeat);
  ServeUnary(poller, &S::RequestDeregisterNode,
             &MasterRpcHandler::DeregisterNode);
  ServeUnary(poller, &S::RequestForgetNode, &MasterRpcHandler::ForgetNode);
  ServeUnary(poller, &S::RequestPutStart, &MasterRpcHandler::PutStart);
  ServeUnary(poller, &S::RequestPutCommit, &MasterRpcHandler::PutCommit);
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
  ReconcileCall::Request(this, poller);
  ListObjectsCall::Request(this, poller);
  for (int i = 0; i < kRequestsPerMethod; ++i) {
    LookupStreamCall::Request(this, poller);
  }
}

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
  if (rpc_threads < 1 || rpc_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("master: rpc_threads must be 1..64, not ", rpc_threads));
  }
  if (max_lookup_streams < 1 || max_lookup_streams > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master: max_lookup_streams must be 1..1000000, not ",
        max_lookup_streams));
  }
  absl::Status tls_ok = tls.Validate();
  if (!tls_ok.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master: ", tls_ok.message()));
  }
  absl::Status protected_mode = CheckProtectedMode(
      "master", hp->first, !auth_tokens_file.empty(), insecure);
  if (!protected_mode.ok()) return protected_mode;
  if (!metrics_listen.empty()) {
    protected_mode = CheckProtectedListen("master: metrics_listen",
                                          metrics_listen,
                                          !auth_tokens_file.empty(), insecure);
    if (!protected_mode.ok()) return protected_mode;
  }
  if (!service.snapshot_path.empty()) {
    return absl::InvalidArgumentError(
        "master: service.snapshot_path is derived from db_path (see "
        "index_snapshots); leave it empty");
  }
  absl::Status s = service.Validate();
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
  if (options.index_snapshots) {
    store_options.keep_wal_seconds = static_cast<uint64_t>(absl::ToInt64Seconds(
        std::max(2 * options.service.snapshot_interval, absl::Hours(1))));
  }
  auto store = master::RocksDbMetadataStore::Create(store_options);
  if (!store.ok()) return store.status();

  master::MasterServiceOptions so = options.service;
  // Keys of tenants other than the default carry a prefix (tenant.h); the
  // handler checks the length the caller sent against max_key_bytes.
  so.max_key_bytes = static_cast<uint32_t>(std::min<uint64_t>(
      master::MetadataIndex::kMaxKeyBytes,
      uint64_t{options.service.max_key_bytes} + master::kMaxTenantPrefixBytes));
  if (options.index_snapshots) so.snapshot_path = options.db_path + ".snapshot";
  auto service = master::MasterService::Create(so, std::move(store).value());
  if (!service.ok()) return service.status();

  std::unique_ptr<Authenticator> auth;
  if (!options.auth_tokens_file.empty()) {
    auto a = Authenticator::Create(options.auth_tokens_file);
    if (!a.ok()) return a.status();
    auth = std::move(a).value();
  }
  auto tls = ReloadableServerTls::Create(options.tls);
  if (!tls.ok()) return tls.status();

  auto tenants = master::TenantRegistry::Create(
      options.tenant_quotas_file.empty() ? options.db_path + ".quotas"
                                         : options.tenant_quotas_file);
  if (!tenants.ok()) return tenants.status();

  std::unique_ptr<MasterServer> server(new MasterServer);
  server->auth_ = std::move(auth);
  server->tls_ = std::move(tls).value();
  server->tenants_ = std::move(tenants).value();
  server->build_version_ = options.build_version;
  server->build_commit_ = options.build_commit;
  server->service_ = std::move(service).value();
  server->handler_ =
      std::make_unique<master::MasterRpcHandler>(
          server->service_.get(), server->auth_.get(), server->tenants_.get(),
          options.service.max_key_bytes, options.max_lookup_streams,
          options.service.clock != nullptr ? options.service.clock
                                           : Clock::Real());

  const int max_message = static_cast<int>(std::min<uint64_t>(
      INT32_MAX,
      std::max<uint64_t>(
          master::kMinMaxMessageBytes,
          uint64_t{options.service.max_batch_keys} *
                  (options.service.max_key_bytes + 16) +
              (1 << 20))));
  // grpc.health.v1 (NOT_SERVING until Create returns, and again from
  // Shutdown on) and server reflection on the same port. Health is our own
  // completion-queue service (gRPC's default one is a callback service);
  // reflection is a sync service, which gRPC serves from non-polling
  // queues beside ours. The reflection switch is process-wide and takes
  // effect for servers built afterwards.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  server->health_ = std::make_unique<master::HealthService>();
  server->health_->SetServingStatus(
      ::hymcache::v1::MasterService::service_full_name(), false);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, server->tls_->credentials(),
                           &port);
  // Without this, gRPC sets SO_REUSEPORT and a second master would bind the
  // same port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_message);
  // No default (callback) health service: ours is registered instead.
  builder.SetOption(
      std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.RegisterService(server->handler_->async_service());
  builder.RegisterService(server->health_->service());
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  for (uint32_t i = 0; i < options.rpc_threads; ++i) {
    cqs.push_back(builder.AddCompletionQueue());
  }
  server->server_ = builder.BuildAndStart();
  for (auto& cq : cqs) {
    server->pollers_.push_back(
        std::make_unique<master::CqPoller>(std::move(cq)));
  }
  if (server->server_ == nullptr || port == 0) {
    server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "master: cannot listen on ", options.listen_address));
  }
  server->port_ = port;
  for (size_t i = 0; i < server->pollers_.size(); ++i) {
    master::CqPoller* poller = server->pollers_[i].get();
    master::MasterRpcHandler* handler = server->handler_.get();
    master::HealthService* health = server->health_.get();
    poller->Start(absl::StrCat("master-rpc-", i), [poller, handler, health] {
      handler->StartOn(poller);
      health->StartOn(poller);
    });
  }
  std::string host = SplitHostPort(options.listen_address)->first;
  if (host == "0.0.0.0" || host == "::" || host == "*") host = "127.0.0.1";
  server->address_ = host.find(':') != std::string::npos
                         ? absl::StrCat("[", host, "]:", port)
                         : absl::StrCat(host, ":", port);

  MasterServer* raw = server.get();
  if (!options.metrics_listen.empty()) {
    MetricsExporterOptions mo;
    mo.listen_address = options.metrics_listen;
    mo.prefix = "hymcache_master_";
    mo.collect = [raw](StatsVisitor* v) { raw->VisitStats(v); };
    auto metrics = MetricsExporter::Create(mo);
    if (!metrics.ok()) {
      server->Shutdown();
      return metrics.status();
    }
    server->metrics_ = std::move(metrics).value();
    server->metrics_address_ = server->metrics_->address();
    LOG(INFO) << "master: metrics on http://" << server->metrics_address_
              << "/metrics";
  }
  const absl::Duration interval = std::clamp(
      options.service.put_timeout / 4, absl::Milliseconds(10),
      absl::Seconds(1));
  server->reaper_ =
      Thread("master-reaper", [raw, interval] { raw->ReaperLoop(interval); });
  LOG(INFO) << "master serving on " << server->address_ << " (db "
            << options.db_path << ", "
            << (options.tls.ServerEnabled()
                    ? (options.tls.require_client_cert ? "mutual TLS"
                                                       : "TLS")
                    : "plaintext")
            << ")";
  if (server->auth_ != nullptr) {
    LOG(INFO) << "master: " << server->auth_->size() << " identities from "
              << options.auth_tokens_file;
    for (const std::string& w : server->auth_->Warnings()) {
      LOG(WARNING) << "master: " << w;
    }
  } else if (!IsLoopbackHost(SplitHostPort(options.listen_address)->first)) {
    LOG(WARNING) << "master: no identities and --insecure: anyone who can "
                    "reach "
                 << options.listen_address << " may call every method";
  } else {
    LOG(INFO) << "master: protected mode (no identities configured): "
                 "serving loopback only; every local caller is an admin";
  }
  // Loaded and serving: health probes say so from now on.
  server->health_->SetAllServing(true);
  return server;
}

MasterServer::~MasterServer() { Shutdown(); }

void MasterServer::VisitStats(StatsVisitor* v) const {
  if (!build_version_.empty()) {
    const StatLabel build[] = {{"version", build_version_},
                               {"commit", build_commit_}};
    v->Gauge("build_info", "1, labelled with the build's version and commit",
             1, build);
  }
  handler_->VisitStats(v);
  const v1::GetStatsResponse st = service_->GetStats();
  v->Gauge("objects", "Committed objects listed", st.object_count());
  v->Gauge("object_bytes", "Bytes of committed objects", st.object_bytes());
  v->Gauge("puts_in_flight", "Pending puts (started, not committed)",
           st.pending_puts());
  v->Gauge("nodes_alive", "Storage nodes alive", st.nodes_alive());
  v->Gauge("nodes_dead", "Storage node records not alive", st.nodes_dead());
  v->Gauge("index_bytes_per_entry", "Heap bytes of the index per entry",
           st.index_bytes_per_entry());
  for (const v1::NodeInfo& n : st.nodes()) {
    const StatLabel node{"node", n.name()};
    const absl::Span<const StatLabel> l(&node, 1);
    v->Gauge("node_up", "1 if the node is alive (heartbeating, reconciled)",
             n.alive() ? 1 : 0, l);
    v->Gauge("node_capacity_bytes", "Bytes the node offers",
             n.capacity_bytes(), l);
    v->Gauge("node_used_bytes", "Bytes allocated on the node",
             n.used_bytes(), l);
    v->Gauge("node_objects", "Objects listed on the node", n.object_count(), l);
  }
  service_->counters().Visit(v);
  for (const auto& [tenant, u] : service_->AllTenantUsage()) {
    const StatLabel t{"tenant", tenant};
    const absl::Span<const StatLabel> l(&t, 1);
    v->Gauge("tenant_objects", "Committed objects of the tenant", u.objects, l);
    v->Gauge("tenant_bytes", "Bytes of the tenant's committed objects",
             u.bytes, l);
  }
  for (const auto& [tenant, n] : service_->QuotaEvictionsByTenant()) {
    const StatLabel t{"tenant", tenant};
    v->Counter("tenant_quota_evicted_objects",
               "Objects of the tenant evicted to keep it within its quota",
               n, absl::Span<const StatLabel>(&t, 1));
  }
  for (const auto& [tenant, n] : tenants_->AllQuotaRefusals()) {
    const StatLabel t{"tenant", tenant};
    v->Counter("tenant_quota_refused_puts",
               "PutStarts of the tenant refused for its quota", n,
               absl::Span<const StatLabel>(&t, 1));
  }
}

absl::Status MasterServer::ReloadIdentities() {
  if (auth_ == nullptr) return absl::OkStatus();
  absl::Status s = auth_->Reload();
  if (s.ok()) {
    LOG(INFO) << "master: reloaded " << auth_->size() << " identities";
    for (const std::string& w : auth_->Warnings()) {
      LOG(WARNING) << "master: " << w;
    }
  } else {
    LOG(ERROR) << "master: identities not reloaded (the old ones stay): "
               << s;
  }
  return s;
}

absl::Status MasterServer::ReloadCertificates() {
  absl::Status s = tls_->Reload();
  if (!s.ok()) {
    LOG(ERROR) << "master: TLS certificates not reloaded (the old ones "
                  "stay): "
               << s;
  } else if (tls_->reloads() != 0) {
    LOG(INFO) << "master: TLS certificates in force for new connections: "
                 "reload "
              << tls_->reloads();
  }
  return s;
}

void MasterServer::ReaperLoop(absl::Duration interval) {
  while (true) {
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      cv_.WaitWithDeadline(&mu_, absl::Now() + interval);
      if (stopping_) return;
    }
    service_->ReapExpired();
    absl::Status s = service_->MaybeSnapshot();
    if (!s.ok()) LOG(WARNING) << "index snapshot not written: " << s;
  }
}

void MasterServer::Shutdown() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  metrics_.reset();  // no scrape runs past this point
  // NOT_SERVING first (Watch callers hear it, then their streams end), and
  // for good: later status changes are ignored.
  if (health_) health_->Shutdown();
  // Open LookupStreams end now (they would hold Shutdown to its deadline).
  if (handler_) handler_->CancelLookupStreams();
  if (server_) {
    // In-flight calls get a second to finish, then are cancelled; the
    // pollers keep running them meanwhile.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
  // Each poller drains its queue (every call's last event deletes it) and
  // its thread ends: what the handlers did happens before the teardown.
  for (auto& p : pollers_) p->ShutdownAndJoin();
  reaper_.Join();
  server_.reset();
  pollers_.clear();
  handler_.reset();
  health_.reset();
  service_.reset();  // closes RocksDB
  LOG(INFO) << "master on " << address_ << " stopped";
  MutexLock l(&mu_);
  stopped_ = true;
  cv_.SignalAll();
}

size_t MasterServer::HealthWatchersForTest() const {
  return health_->WatchersForTest();
}

absl::Status MasterServer::CheckAlive(absl::Duration timeout) {
  return CheckServerAnswers(server_.get(), timeout);
}

void MasterServer::Wait() {
  MutexLock l(&mu_);
  while (!stopped_) cv_.Wait(&mu_);
}

}  // namespace hymcache
