// TenantRegistry: quotas and replication factors persisted in the quota
// file (master/tenants.h).
#include "master/tenants.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>

#include "master/master_test_util.h"

namespace hymcache {
namespace master {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

TEST_CASE(
    "Quotas and replication factors survive a restart, each set apart from the "
    "other") {
  const std::string path = TestDir("tenants-quotas");
  {
    auto r = TenantRegistry::Create(path);
    REQUIRE(r.ok());
    REQUIRE((*r)->SetQuota("acme", TenantQuota{10, 1000}).ok());
    REQUIRE((*r)->SetReplicas("acme", 2).ok());
    REQUIRE((*r)->SetReplicas("beta", 2).ok());
    // A quota leaves the factor, and the factor the quota.
    REQUIRE((*r)->SetQuota("acme", TenantQuota{20, 2000, /*replicas=*/0}).ok());
    CHECK((*r)->Quota("acme").replicas == 2);
    CHECK((*r)->Quota("acme").max_objects == 20);
    CHECK((*r)->SetReplicas("acme", 3).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK((*r)->Quota("acme").replicas == 2);
  }
  CHECK(Slurp(path).find("acme 20 2000 2\n") != std::string::npos);
  auto again = TenantRegistry::Create(path);
  REQUIRE(again.ok());
  CHECK((*again)->Quota("acme").max_bytes == 2000);
  CHECK((*again)->Quota("acme").replicas == 2);
  CHECK((*again)->Quota("beta").replicas == 2);
  CHECK((*again)->Quota("beta").max_objects == 0);
  // All three 0: the tenant goes.
  REQUIRE((*again)->SetReplicas("beta", 0).ok());
  CHECK((*again)->Quotas().count("beta") == 0);

  // A file from before replication factors (three fields) still reads; a
  // factor above 2 does not.
  { std::ofstream(path) << "# old\nold 5 500\n"; }
  auto old = TenantRegistry::Create(path);
  REQUIRE(old.ok());
  CHECK((*old)->Quota("old").max_objects == 5);
  CHECK((*old)->Quota("old").replicas == 0);
  { std::ofstream(path) << "bad 5 500 3\n"; }
  CHECK(TenantRegistry::Create(path).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
