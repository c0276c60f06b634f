// MasterRpcHandler: the gRPC adapter's unary methods, one per RPC of
// v1.MasterService, and the stats of the RPC layer. Private to the
// //master:master_server target: master_server.cc owns it,
// master_rpc_streams.cc serves its streaming methods, master_rpc_handler.cc
// holds the methods that log.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_set.h"
#include "absl/numeric/bits.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/security.h"
#include "common/stats.h"
#include "common/status_reason.h"
#include "common/wire.h"
#include "master/cq_server.h"
#include "master/master_server.h"
#include "master/master_service.h"
#include "master/tenant.h"
#include "master/tenants.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

// Who a caller is, for the per-caller limits (pending puts): its peer
// address without the port ("ipv4:10.0.0.7", "ipv6:[::1]"). One small
// function, so that an authenticated identity can replace it.
inline std::string CallerKey(const grpc::ServerContext* ctx) {
  std::string peer = ctx->peer();
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon != std::string::npos && colon != first) peer.resize(colon);
  return peer;
}

// A node identity bound to names (nodes= in the identities file) acts
// only as those nodes. An id the master does not know passes: the service
// answers it (NOT_FOUND, or a heartbeat's reregister).
inline absl::Status CheckNodeIdentity(const MasterService& service,
                                      const Identity& id, uint32_t node_id,
                                      const char* method) {
  if (id.node_names.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> name = service.NodeName(node_id);
  if (!name.ok()) return absl::OkStatus();
  return CheckNodeName(id, *name, method);
}

// The gRPC adapter: every method runs MasterService inline on the poller
// thread that received the call (master/cq_server.h; the work is in-memory
// plus at most one RocksDB batch write) and returns the call's status.
//
// Every method first checks the caller's identity (Admit): engines (and
// admins, for hymctl put/get) read and write blocks; admins list and
// remove; nodes register, heartbeat and reconcile.
// The RPC layer's stats, declared once (common/stats.h).
#define HYM_MASTER_RPC_STATS(COUNTER, GAUGE, DGAUGE)                \
  COUNTER(lookups, "BatchLookup calls answered OK")                 \
  COUNTER(lookup_keys, "Keys of the BatchLookup calls answered OK") \
  COUNTER(lookup_hits, "Keys found by BatchLookup")                 \
  COUNTER(lookup_prefix_hits,                                       \
          "Keys in the leading run of hits (what a Load reads)")    \
  COUNTER(lookup_errors, "BatchLookup calls refused or failed")     \
  COUNTER(lookup_streams_opened, "LookupStream streams admitted")   \
  COUNTER(lookup_streams_refused,                                   \
          "LookupStream streams refused (caller, limit, shutdown)") \
  GAUGE(lookup_streams_open, "LookupStream streams open now")
HYM_DECLARE_STATS(MasterRpcStats, MasterRpcCounters, HYM_MASTER_RPC_STATS);

// What the server around the handler adds to its calls (each optional).
struct MasterRpcHooks {
  // MasterOptions::gate: asked by Admit before every call.
  std::function<absl::Status(CallAccess)> gate;
  // Runs after every PutCommit that succeeded; the commit is answered when
  // `answer` runs (once, from any thread), e.g. once a standby holds it
  // (master/master_replication.h), with `resp` as it then is (the hook may
  // add to it until it calls `answer`). Must not block. Null: answered at
  // once.
  std::function<void(v1::PutCommitResponse* resp, std::function<void()> answer)>
      after_commit;
  // More stats for GetStats's map (and the server's /metrics).
  std::function<void(StatsVisitor*)> extra_stats;
};

class MasterRpcHandler final {
 public:
  MasterRpcHandler(MasterService* service, const Authenticator* auth,
                   TenantRegistry* tenants, uint32_t max_key_bytes,
                   uint32_t max_lookup_streams, Clock* clock,
                   MasterRpcHooks hooks = {})
      : service_(service),
        auth_(auth),
        tenants_(tenants),
        max_key_bytes_(max_key_bytes),
        max_lookup_streams_(max_lookup_streams),
        clock_(clock),
        gate_(std::move(hooks.gate)),
        after_commit_(std::move(hooks.after_commit)),
        extra_stats_(std::move(hooks.extra_stats)) {}

  // Tenants (master/tenant.h): the keys a caller sends name its own
  // tenant's key space. InvalidArgument for a key longer than the
  // configured limit, or one of the default tenant spelling a qualified key
  // (admins may: fsck hands back the keys ListObjects gave it).
  absl::Status CheckKeys(
      const Identity& id,
      const google::protobuf::RepeatedPtrField<std::string>& keys,
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
      return absl::InvalidArgumentError(
          absl::StrCat(method, ": a key of ", k.size(), " bytes (at most ",
                       max_key_bytes_, ")"));
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
  static void QualifyAll(
      const Identity& id,
      google::protobuf::RepeatedPtrField<std::string>* keys) {
    for (std::string& k : *keys) Qualify(id, &k);
  }

  static constexpr Roles kEngine = Roles(Role::kEngine) | Role::kAdmin;
  static constexpr Roles kAdmin = Role::kAdmin;
  static constexpr Roles kNode = Role::kNode;

  // The caller, if it may call `method` and the gate (MasterOptions::gate)
  // lets calls that do `access` through; AnonymousAdmin() when
  // authentication is off. Only calls that change nothing durable pass
  // kRead (a master that lost etcd serves them: docs/ha.md).
  absl::StatusOr<Identity> Admit(grpc::ServerContext* ctx, Roles allowed,
                                 const char* method,
                                 CallAccess access = CallAccess::kWrite) const;

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
    return absl::NotFoundError(absl::StrCat(method, ": no pending put ", put_id,
                                            " of tenant '", id.tenant, "'"));
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

  grpc::Status RegisterNode(grpc::ServerContext* ctx,
                            const v1::RegisterNodeRequest* req,
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
    auto id = Admit(ctx, kNode, "Heartbeat", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s =
            CheckNodeIdentity(*service_, *id, req->node_id(), "Heartbeat");
        !s.ok()) {
      return Refuse(ctx, s);
    }
    grpc::Status answered = Reply(ctx, service_->Heartbeat(*req), resp);
    // A read-only master says so: the node looks for a leader elsewhere.
    if (answered.ok() && gate_ &&
        ReasonOf(gate_(CallAccess::kWriteProbe)) == StatusReason::kReadOnly) {
      resp->set_read_only(true);
    }
    return answered;
  }
  grpc::Status DeregisterNode(grpc::ServerContext* ctx,
                              const v1::DeregisterNodeRequest* req,
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
    const bool relocation = req->relocate_from_node() != 0;
    if (relocation && auth_ != nullptr && id->role != Role::kAdmin) {
      return Refuse(ctx, absl::PermissionDeniedError(
                             "PutStart: relocate_from_node (moving other "
                             "callers' objects) needs an admin token"));
    }
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
    // A relocation replaces objects already counted: no quota.
    const TenantQuota quota =
        relocation ? TenantQuota{} : tenants_->Quota(id->tenant);
    bool over_quota = false;
    absl::StatusOr<v1::PutStartResponse> out = service_->PutStart(
        *r, CallerKeyOf(ctx, *id),
        TenantLimit{quota.max_objects, quota.max_bytes}, &over_quota);
    if (over_quota) tenants_->CountQuotaRefusal(id->tenant);
    if (out.ok() && !relocation && !req->replica()) {
      // The tenant's replication factor, for the client to make the copies.
      out->set_replicas(quota.replicas);
    }
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
    // A commit refused for its receipts ended the put too.
    if (out.ok() ||
        ReasonOf(out.status()) == StatusReason::kWriteReceiptInvalid) {
      tenants_->ForgetPut(req->put_id());
    }
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
  grpc::Status BatchLookup(grpc::ServerContext* ctx,
                           const v1::BatchLookupRequest* req,
                           v1::BatchLookupResponse* resp) {
    return ToGrpcStatus(Lookup(ctx, *req, resp, "BatchLookup"));
  }
  // One BatchLookup by the caller of `ctx`: the unary call's and each
  // LookupStream message's work, checked and counted the same. `method`
  // names it in errors.
  absl::Status Lookup(grpc::ServerContext* ctx,
                      const v1::BatchLookupRequest& req,
                      v1::BatchLookupResponse* resp, const char* method) {
    auto caller = Admit(ctx, kEngine, method, CallAccess::kRead);
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
    CountLookup(s, static_cast<uint64_t>(req.keys_size()), *resp,
                absl::Now() - start);
    return s;
  }

  // LookupStream bookkeeping (LookupStreamCall). Admits a new stream:
  // Admit's refusals, Unavailable once CancelLookupStreams ran,
  // ResourceExhausted beyond max_lookup_streams open.
  absl::Status OpenLookupStream(grpc::ServerContext* ctx) {
    absl::Status s =
        Admit(ctx, kEngine, "LookupStream", CallAccess::kRead).status();
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
  grpc::Status Remove(grpc::ServerContext* ctx, const v1::RemoveRequest* req,
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
  grpc::Status BeginReconcile(grpc::ServerContext* ctx,
                              const v1::BeginReconcileRequest* req,
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
      return Reply(ctx,
                   absl::StatusOr<v1::BeginReconcileResponse>(epoch.status()),
                   resp);
    }
    v1::BeginReconcileResponse r;
    r.set_epoch(*epoch);
    return Reply(ctx, absl::StatusOr<v1::BeginReconcileResponse>(std::move(r)),
                 resp);
  }

  grpc::Status ReportMissing(grpc::ServerContext* ctx,
                             const v1::ReportMissingRequest* req,
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
    auto id = Admit(ctx, kAdmin, "ListNodes", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    return Reply(ctx,
                 absl::StatusOr<v1::ListNodesResponse>(service_->ListNodes()),
                 resp);
  }
  grpc::Status ListTenants(grpc::ServerContext* ctx,
                           const v1::ListTenantsRequest* req,
                           v1::ListTenantsResponse* resp) {
    auto id = Admit(ctx, kAdmin, "ListTenants", CallAccess::kRead);
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
      rows[t].set_replicas(q.replicas);
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
  grpc::Status SetTenantQuota(grpc::ServerContext* ctx,
                              const v1::SetTenantQuotaRequest* req,
                              v1::SetTenantQuotaResponse* resp);
  grpc::Status SetNodeDraining(grpc::ServerContext* ctx,
                               const v1::SetNodeDrainingRequest* req,
                               v1::SetNodeDrainingResponse* resp);
  grpc::Status InspectKey(grpc::ServerContext* ctx,
                          const v1::InspectKeyRequest* req,
                          v1::InspectKeyResponse* resp) {
    auto id = Admit(ctx, kAdmin, "InspectKey", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckKey(*id, req->key(), "InspectKey"); !s.ok()) {
      return Refuse(ctx, s);
    }
    if (!Rewrites(*id)) return Reply(ctx, service_->InspectKey(*req), resp);
    v1::InspectKeyRequest qualified = *req;
    Qualify(*id, qualified.mutable_key());
    return Reply(ctx, service_->InspectKey(qualified), resp);
  }
  grpc::Status PrefixQuery(grpc::ServerContext* ctx,
                           const v1::PrefixQueryRequest* req,
                           v1::PrefixQueryResponse* resp) {
    auto id = Admit(ctx, kEngine, "PrefixQuery", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    if (absl::Status s = CheckKeys(*id, req->keys(), "PrefixQuery"); !s.ok()) {
      return Refuse(ctx, s);
    }
    if (!Rewrites(*id)) return Reply(ctx, service_->PrefixQuery(*req), resp);
    v1::PrefixQueryRequest qualified = *req;
    QualifyAll(*id, qualified.mutable_keys());
    return Reply(ctx, service_->PrefixQuery(qualified), resp);
  }
  // Changes nothing durable (kRead): engines' caches are advice the leader
  // keeps in memory, and each reporter resends its set to a new leader.
  grpc::Status ReportEngineBlocks(grpc::ServerContext* ctx,
                                  const v1::ReportEngineBlocksRequest* req,
                                  v1::ReportEngineBlocksResponse* resp) {
    auto id = Admit(ctx, kEngine, "ReportEngineBlocks", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    for (const auto* keys : {&req->removed(), &req->stored()}) {
      if (absl::Status s = CheckKeys(*id, *keys, "ReportEngineBlocks");
          !s.ok()) {
        return Refuse(ctx, s);
      }
    }
    if (!Rewrites(*id)) {
      return Reply(ctx, service_->ReportEngineBlocks(id->tenant, *req), resp);
    }
    v1::ReportEngineBlocksRequest qualified = *req;
    QualifyAll(*id, qualified.mutable_removed());
    QualifyAll(*id, qualified.mutable_stored());
    return Reply(ctx, service_->ReportEngineBlocks(id->tenant, qualified),
                 resp);
  }
  grpc::Status GetStats(grpc::ServerContext* ctx,
                        const v1::GetStatsRequest* /*req*/,
                        v1::GetStatsResponse* resp) {
    auto id = Admit(ctx, kAdmin, "GetStats", CallAccess::kRead);
    if (!id.ok()) return Refuse(ctx, id.status());
    v1::GetStatsResponse r = service_->GetStats();
    FlatStatsVisitor flat;
    VisitStats(&flat);
    service_->counters().Visit(&flat);
    for (const auto& [name, value] : flat.values()) {
      (*r.mutable_stats())[name] = value;
    }
    return Reply(ctx, absl::StatusOr<v1::GetStatsResponse>(std::move(r)), resp);
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
    if (extra_stats_) extra_stats_(v);
  }

 private:
  // Relaxed atomic adds and a lock-free histogram: nothing here serializes
  // lookups.
  void CountLookup(const absl::Status& s, uint64_t keys,
                   const v1::BatchLookupResponse& r, absl::Duration took) {
    if (!s.ok()) {
      Add(rpc_stats_.lookup_errors);
      return;
    }
    uint64_t hits = 0;
    if (!r.found_bits().empty()) {
      for (char byte : r.found_bits()) {
        hits += absl::popcount(static_cast<uint8_t>(byte));
      }
    } else if (!r.packed_results().empty()) {
      const std::string& p = r.packed_results();
      for (size_t off = 0; off < p.size(); off += wire::kLookupRecordBytes) {
        hits += absl::little_endian::Load32(p.data() + off) != 0 ? 1 : 0;
      }
    } else {
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
  // MasterRpcHooks; null: none.
  const std::function<absl::Status(CallAccess)> gate_;
  const std::function<void(v1::PutCommitResponse*, std::function<void()>)>
      after_commit_;
  const std::function<void(StatsVisitor*)> extra_stats_;
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

  // Serves the unary method `request` / `handle` on `poller`; `hold` as
  // UnaryMethod's.
  template <typename Req, typename Resp>
  void ServeUnary(CqPoller* poller,
                  typename UnaryMethod<v1::MasterService::AsyncService, Req,
                                       Resp>::RequestFn request,
                  grpc::Status (MasterRpcHandler::*handle)(grpc::ServerContext*,
                                                           const Req*, Resp*),
                  typename UnaryMethod<v1::MasterService::AsyncService, Req,
                                       Resp>::HoldFn hold = nullptr) {
    using Method = UnaryMethod<v1::MasterService::AsyncService, Req, Resp>;
    auto method = std::make_shared<Method>(Method{
        &async_, request,
        [this, handle](grpc::ServerContext* ctx, const Req& req, Resp* resp) {
          return (this->*handle)(ctx, &req, resp);
        },
        poller, std::move(hold)});
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

}  // namespace master
}  // namespace hymcache
