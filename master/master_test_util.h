// What the master's tests share beyond their own fixtures (the
// MasterService fixture, master_server_test, master_replication_test,
// master_admin_test, master_limits_test, metadata_store_test): a fresh
// directory for a store and a node's registration. Test-only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "proto/master.pb.h"

namespace hymcache::master {

// A fresh (removed, parent created) path `name` under TEST_TMPDIR, which
// Bazel gives each test target its own.
inline std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path p = std::filesystem::path(tmp ? tmp : "/tmp") / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p.parent_path());
  return p.string();
}

// The registration of node `name` (incarnation 1) serving data on
// 127.0.0.1:`port` and control on `port` + 1, with one region (id 0) of
// `capacity` bytes aligned to 4096.
inline ::hymcache::v1::RegisterNodeRequest OneRegionNodeReq(
    const std::string& name, int port = 7000,
    uint64_t capacity = uint64_t{1} << 30) {
  ::hymcache::v1::RegisterNodeRequest r;
  r.set_name(name);
  r.set_incarnation(1);
  r.set_data_address("127.0.0.1:" + std::to_string(port));
  r.set_control_address("127.0.0.1:" + std::to_string(port + 1));
  auto* region = r.add_regions();
  region->set_region_id(0);
  region->set_capacity_bytes(capacity);
  region->set_alignment(4096);
  return r;
}

}  // namespace hymcache::master
