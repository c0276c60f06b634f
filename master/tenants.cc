#include "master/tenants.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "master/tenant.h"

namespace hymcache::master {

namespace {

absl::Status ValidTenant(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantBytes ||
      tenant.find_first_of(" \t\r\n#") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant '", tenant, "': 1..", kMaxTenantBytes,
        " characters, no spaces or '#'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Create(
    const std::string& quota_path) {
  std::unique_ptr<TenantRegistry> r(new TenantRegistry(quota_path));
  if (quota_path.empty()) return r;
  std::error_code ec;
  if (!std::filesystem::exists(quota_path, ec)) return r;
  std::ifstream in(quota_path);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat(quota_path, ": cannot open"));
  }
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.empty() || f[0][0] == '#') continue;
    TenantQuota q;
    if ((f.size() != 3 && f.size() != 4) || !ValidTenant(f[0]).ok() ||
        !absl::SimpleAtoi(f[1], &q.max_objects) ||
        !absl::SimpleAtoi(f[2], &q.max_bytes) ||
        (f.size() == 4 &&
         (!absl::SimpleAtoi(f[3], &q.replicas) || q.replicas > 2))) {
      return absl::InvalidArgumentError(
          absl::StrCat(quota_path, ":", n,
                       ": expected 'tenant max_objects max_bytes [replicas]' "
                       "(replicas 0..2)"));
    }
    MutexLock l(&r->mu_);  // Not yet shared; taken for the analysis.
    r->quotas_[std::string(f[0])] = q;
  }
  return r;
}

absl::Status TenantRegistry::Save(
    const std::map<std::string, TenantQuota>& quotas) const {
  if (path_.empty()) return absl::OkStatus();
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "# tenant max_objects max_bytes (0: unlimited) replicas; hymctl "
           "tenant set-quota, set-replicas\n";
    for (const auto& [t, q] : quotas) {
      out << t << " " << q.max_objects << " " << q.max_bytes << " "
          << q.replicas << "\n";
    }
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(path_, ": rename failed"));
  }
  return absl::OkStatus();
}

absl::Status TenantRegistry::Update(
    absl::string_view tenant, const std::function<void(TenantQuota&)>& change) {
  absl::Status valid = ValidTenant(tenant);
  if (!valid.ok()) return valid;
  MutexLock l(&mu_);
  std::map<std::string, TenantQuota> next = quotas_;
  TenantQuota& q = next[std::string(tenant)];
  change(q);
  if (q.max_objects == 0 && q.max_bytes == 0 && q.replicas == 0) {
    next.erase(std::string(tenant));
  }
  absl::Status s = Save(next);
  if (!s.ok()) return s;
  quotas_ = std::move(next);
  return absl::OkStatus();
}

absl::Status TenantRegistry::SetQuota(absl::string_view tenant,
                                      const TenantQuota& quota) {
  return Update(tenant, [&](TenantQuota& q) {
    q.max_objects = quota.max_objects;
    q.max_bytes = quota.max_bytes;
  });
}

absl::Status TenantRegistry::SetReplicas(absl::string_view tenant,
                                         uint32_t replicas) {
  if (replicas > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas is ", replicas,
                     " (want 0..2: 2 keeps a copy of every "
                     "block on a second node)"));
  }
  return Update(tenant, [&](TenantQuota& q) { q.replicas = replicas; });
}

TenantQuota TenantRegistry::Quota(absl::string_view tenant) const {
  MutexLock l(&mu_);
  auto it = quotas_.find(std::string(tenant));
  return it == quotas_.end() ? TenantQuota() : it->second;
}

std::map<std::string, TenantQuota> TenantRegistry::Quotas() const {
  MutexLock l(&mu_);
  return quotas_;
}

void TenantRegistry::CountQuotaRefusal(absl::string_view tenant) {
  MutexLock l(&mu_);
  ++refusals_[std::string(tenant)];
}

uint64_t TenantRegistry::QuotaRefusals(absl::string_view tenant) const {
  MutexLock l(&mu_);
  auto it = refusals_.find(std::string(tenant));
  return it == refusals_.end() ? 0 : it->second;
}

absl::flat_hash_map<std::string, uint64_t> TenantRegistry::AllQuotaRefusals()
    const {
  MutexLock l(&mu_);
  return refusals_;
}

void TenantRegistry::NotePut(uint64_t put_id, absl::string_view tenant,
                             absl::Time expiry, absl::Time now) {
  MutexLock l(&mu_);
  puts_[put_id] = Put{std::string(tenant), expiry};
  if (puts_.size() < sweep_at_) return;
  // Puts neither committed nor aborted: the master freed them at expiry.
  for (auto it = puts_.begin(); it != puts_.end();) {
    auto next = std::next(it);
    if (it->second.expiry + absl::Minutes(1) < now) puts_.erase(it);
    it = next;
  }
  sweep_at_ = std::max<size_t>(1024, 2 * puts_.size());
}

bool TenantRegistry::OwnsPut(uint64_t put_id, absl::string_view tenant) const {
  MutexLock l(&mu_);
  auto it = puts_.find(put_id);
  return it != puts_.end() && it->second.tenant == tenant;
}

void TenantRegistry::ForgetPut(uint64_t put_id) {
  MutexLock l(&mu_);
  puts_.erase(put_id);
}

}  // namespace hymcache::master
