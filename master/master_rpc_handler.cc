// The MasterRpcHandler methods that log (glog stays out of headers).
#include <glog/logging.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "master/master_rpc_handler.h"

namespace hymcache {
namespace master {

absl::StatusOr<Identity> MasterRpcHandler::Admit(grpc::ServerContext* ctx,
                                                 Roles allowed,
                                                 const char* method,
                                                 CallAccess access) const {
  absl::StatusOr<Identity> id = AnonymousAdmin();
  if (auth_ != nullptr) {
    id = auth_->Check(*ctx, allowed, method);
    if (!id.ok()) {
      LOG_EVERY_N(WARNING, 100)
          << "master: refused a call from " << ctx->peer() << ": "
          << id.status() << " (every 100th refusal logged)";
      return id;
    }
  }
  if (gate_) {
    absl::Status open = gate_(access);
    if (!open.ok()) return open;
  }
  return id;
}

grpc::Status MasterRpcHandler::SetTenantQuota(
    grpc::ServerContext* ctx, const v1::SetTenantQuotaRequest* req,
    v1::SetTenantQuotaResponse* resp) {
  auto id = Admit(ctx, kAdmin, "SetTenantQuota");
  if (!id.ok()) return Refuse(ctx, id.status());
  absl::Status s = req->set_replicas()
                       ? tenants_->SetReplicas(req->tenant(), req->replicas())
                       : tenants_->SetQuota(
                             req->tenant(),
                             TenantQuota{req->max_objects(), req->max_bytes()});
  if (s.ok() && req->set_replicas()) {
    LOG(INFO) << "master: tenant '" << req->tenant() << "' replicas set to "
              << req->replicas() << " by '" << id->name << "'";
  } else if (s.ok()) {
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

grpc::Status MasterRpcHandler::SetNodeDraining(
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

}  // namespace master
}  // namespace hymcache
