// RdmaPlane: the storage node's side of the RDMA data plane. Registers the
// device's exposed memory areas (MemoryDevice::Areas: the DRAM regions, the
// hybrid staging window and write buffer) with the RDMA NIC, publishes what a
// client needs (device, per area its remote address, length and rkey) as
// transport parameters, and accepts queue pairs over the TCP data plane
// (DataServer's RdmaAcceptor). The node's CPU takes no part in the transfers
// themselves: clients READ and WRITE the registered memory directly, under
// the holds of the direct-access frames (common/wire.h).
//
// Thread safety: safe for concurrent use.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rdma.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

class RdmaPlane : public RdmaAcceptor {
 public:
  // Registers every area of `areas` on `device` (owned by the plane).
  // Errors: InvalidArgument when an area is larger than one registration
  // can cover (split the device's regions, DramDeviceOptions::
  // max_region_bytes); the device's registration errors.
  static absl::StatusOr<std::unique_ptr<RdmaPlane>> Create(
      std::unique_ptr<rdma::Device> device,
      const std::vector<MemoryArea>& areas);
  ~RdmaPlane() override;

  // kRdmaDeviceParam and kRdmaAreasParam.
  std::map<std::string, std::string> TransportParams() const;

  absl::StatusOr<std::pair<std::shared_ptr<void>, std::string>> Accept(
      std::string_view client_info) override;

 private:
  RdmaPlane() = default;

  std::unique_ptr<rdma::Device> device_;
  std::vector<std::unique_ptr<rdma::MemoryRegion>> regions_;
  std::string areas_param_;
};

}  // namespace hymcache::storage
