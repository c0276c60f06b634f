// TenantRegistry: what the master's RPC adapter knows about tenants beyond
// the keys (master/tenant.h): each tenant's quota, persisted in a small text
// file beside the metadata store, the tenant that started each pending put
// (so that no other tenant can commit or abort it), and per-tenant refusal
// counters.
//
// Quota file: one line per tenant, "tenant max_objects max_bytes [replicas]"
// (0: unlimited; replicas 0 when absent), rewritten whole (temporary file +
// rename) by SetQuota and SetReplicas.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace hymcache::master {

struct TenantQuota {
  uint64_t max_objects = 0;  // 0: unlimited
  uint64_t max_bytes = 0;    // 0: unlimited
  // Replication factor: 2, every block the tenant's clients store also
  // gets a copy on another node (master/replica_key.h); 0 or 1: none.
  // Not a limit, kept here as the tenant's other setting.
  uint32_t replicas = 0;
};

class TenantRegistry {
 public:
  // Reads `quota_path` if it exists ("" keeps quotas in memory only).
  // Errors: InvalidArgument naming the bad line; the file's read errors.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(
      const std::string& quota_path);

  // Sets `tenant`'s quota (max_objects and max_bytes; its replicas stay)
  // and rewrites the file; a tenant with all three 0 is dropped.
  // InvalidArgument for a bad tenant name; Internal if the file cannot be
  // written (the quota is then not changed).
  absl::Status SetQuota(absl::string_view tenant, const TenantQuota& quota);
  // The same for the replication factor alone (the quota stays).
  // InvalidArgument above 2.
  absl::Status SetReplicas(absl::string_view tenant, uint32_t replicas);
  TenantQuota Quota(absl::string_view tenant) const;
  std::map<std::string, TenantQuota> Quotas() const;

  // Counts a PutStart of `tenant` refused for its quota (MasterService
  // enforces quotas: MasterService::PutStart).
  void CountQuotaRefusal(absl::string_view tenant);
  uint64_t QuotaRefusals(absl::string_view tenant) const;
  // Every tenant's count (tenants without refusals are absent).
  absl::flat_hash_map<std::string, uint64_t> AllQuotaRefusals() const;

  // Pending puts: NotePut after a successful PutStart (entries past
  // `expiry` by a minute are swept as others are added); OwnsPut before a
  // commit or abort; ForgetPut after it.
  void NotePut(uint64_t put_id, absl::string_view tenant, absl::Time expiry,
               absl::Time now);
  bool OwnsPut(uint64_t put_id, absl::string_view tenant) const;
  void ForgetPut(uint64_t put_id);

 private:
  struct Put {
    std::string tenant;
    absl::Time expiry;
  };
  explicit TenantRegistry(std::string path) : path_(std::move(path)) {}
  absl::Status Save(const std::map<std::string, TenantQuota>& quotas) const;
  // Applies `change` to `tenant`'s entry, drops it if all zero, and saves.
  absl::Status Update(absl::string_view tenant,
                      const std::function<void(TenantQuota&)>& change);

  // Constant after Create.
  const std::string path_;

  mutable Mutex mu_;
  std::map<std::string, TenantQuota> quotas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> refusals_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Put> puts_ ABSL_GUARDED_BY(mu_);
  size_t sweep_at_ ABSL_GUARDED_BY(mu_) = 1024;
};

}  // namespace hymcache::master
