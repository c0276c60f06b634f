// ObjectLocation: where one committed object's bytes live. The master's one
// in-memory location type: the index stores it (MetadataIndex), the store
// persists it inside an ObjectRecord, and v1::Location carries it on the
// wire (MasterService converts in one place).
#pragma once

#include <cstdint>

namespace hymcache {
namespace master {

struct ObjectLocation {
  uint32_t node_id = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;    // offset in the region
  uint64_t length = 0;  // bytes
  uint64_t generation = 0;  // unique cluster-wide

  bool operator==(const ObjectLocation& o) const {
    return node_id == o.node_id && region_id == o.region_id &&
           addr == o.addr && length == o.length && generation == o.generation;
  }
  bool operator!=(const ObjectLocation& o) const { return !(*this == o); }
};

}  // namespace master
}  // namespace hymcache
