// MasterServer's operations while it serves: its metrics (VisitStats) and
// health hooks. (The SIGHUP reloads are ServerSecurity's, common/daemon.h.)
#include "master/master_server.h"

#include "common/cluster_stats.h"
#include "common/stats.h"
#include "master/health_service.h"
#include "master/master_rpc_handler.h"
#include "master/master_service.h"
#include "master/tenants.h"

namespace hymcache {

void MasterServer::VisitStats(StatsVisitor* v) const {
  VisitBuildInfo(daemon_, v);
  handler_->VisitStats(v);
  const v1::GetStatsResponse st = service_->GetStats();
  // The cluster gauges (common/cluster_stats.h); its counters are the
  // service's, visited below.
#define HYM_VISIT_GAUGE_(field, metric, help) \
  v->Gauge(#metric, help, static_cast<double>(st.field()));
#define HYM_COUNTER_VISITED_BELOW_(field)
  HYM_CLUSTER_STATS(HYM_VISIT_GAUGE_, HYM_COUNTER_VISITED_BELOW_)
#undef HYM_VISIT_GAUGE_
#undef HYM_COUNTER_VISITED_BELOW_
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
  const auto [engines, engine_blocks] = service_->EngineCacheSizes();
  v->Gauge("engines_reporting",
           "Engines whose own caches the master keeps (ReportEngineBlocks "
           "within the engine TTL)",
           static_cast<double>(engines));
  v->Gauge("engine_blocks", "Keys the master keeps for engines' own caches",
           static_cast<double>(engine_blocks));
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

size_t MasterServer::HealthWatchersForTest() const {
  return health_->WatchersForTest();
}

}  // namespace hymcache
