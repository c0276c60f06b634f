// Helpers shared by the files that implement MasterService
// (master_service*.cc). Private to the //master:master_service target.
#pragma once

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "master/object_location.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {
namespace internal {

namespace v1 = ::hymcache::v1;

// The one conversion of a location to its wire form.
inline void ToProto(const ObjectLocation& e, v1::Location* loc) {
  loc->set_node_id(e.node_id);
  loc->set_region_id(e.region_id);
  loc->set_addr(e.addr);
  loc->set_length(e.length);
  loc->set_generation(e.generation);
}

inline std::string PrintableKey(absl::string_view key) {
  if (key.size() > 64) key = key.substr(0, 64);
  return absl::CHexEscape(key);
}

// Registration fields of a region (used_bytes cleared).
inline v1::RegionInfo DurableRegion(const v1::RegionInfo& r) {
  v1::RegionInfo out = r;
  out.set_used_bytes(0);
  return out;
}

}  // namespace internal
}  // namespace master
}  // namespace hymcache
