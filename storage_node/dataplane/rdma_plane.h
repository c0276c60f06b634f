// RdmaPlane: the storage node's side of the RDMA data plane. Registers the
// device's exposed memory areas (MemoryDevice::Areas: the DRAM regions, the
// hybrid staging window and write buffer) with the RDMA NIC, publishes what a
// client needs (device, per area its remote address and length) as transport
// parameters, and accepts queue pairs over the TCP data plane (DataServer's
// RdmaAcceptor). The node's CPU takes no part in the transfers themselves:
// clients READ and WRITE the node's memory directly, under the holds of the
// direct-access frames (common/wire.h).
//
// What a client's queue pair can reach (RdmaAccess), chosen at Create:
//   kWindows        the areas are registered for local access and memory-
//                   window binding only; each granted acquire (write
//                   reservation) binds a type-2 window over exactly that
//                   object on that client's queue pair, READ (WRITE) only,
//                   and its key is answered with the AreaRef; release
//                   (commit, abort, connection end) invalidates it first.
//                   Chosen where the device has type-2 windows that confine
//                   their peer to their range (rdma::Device::
//                   ProbeWindowBounds).
//   kRegistrations  the same per-object grants as memory registrations of
//                   exactly the object's range, in a protection domain of
//                   the connection's own (so no other queue pair can use
//                   them), deregistered at release. Chosen where windows are
//                   missing or do not confine (Soft-RoCE checks a window's
//                   key, queue pair, access and validity but not its range),
//                   unless the clients are trusted. Costs a registration
//                   (page pinning) per object.
//   kWholeArea      each area registered once for remote READ and WRITE;
//                   every grant answers the area's key, so a queue pair
//                   reaches every registered byte. Only with
//                   RdmaPlaneOptions::trusted_clients (--rdma_trusted_clients)
//                   on a device without confining windows.
//
// Thread safety: safe for concurrent use; a RdmaConnection is used by one
// thread at a time (the data server's connection owner).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/rdma.h"
#include "storage_node/dataplane/data_server.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

enum class RdmaAccess { kWindows, kRegistrations, kWholeArea };
const char* RdmaAccessName(RdmaAccess a);

struct RdmaPlaneOptions {
  // Whether whole-area keys may be used on a device without type-2 memory
  // windows that confine their peer to their range (instead of per-object
  // registrations): every client with a queue pair can then read and write
  // all of the node's exposed memory. Default: false.
  bool trusted_clients = false;
};

class RdmaPlane : public RdmaAcceptor {
 public:
  // Chooses the access mode (above), registers every area of `areas` on
  // `device` (owned by the plane) and says at start which mode and why.
  // Errors: InvalidArgument when an area is larger than one registration
  // can cover (split the device's regions, DramDeviceOptions::
  // max_region_bytes); the device's registration errors.
  static absl::StatusOr<std::unique_ptr<RdmaPlane>> Create(
      std::unique_ptr<rdma::Device> device,
      const std::vector<MemoryArea>& areas,
      const RdmaPlaneOptions& options = {});
  ~RdmaPlane() override;

  // kRdmaDeviceParam and kRdmaAreasParam (an area's key is 0 unless
  // kWholeArea: clients use the key each grant answers).
  std::map<std::string, std::string> TransportParams() const;

  absl::StatusOr<std::pair<std::unique_ptr<RdmaConnection>, std::string>>
  Accept(absl::string_view client_info) override;

  RdmaAccess access() const;
  // Tests and benchmarks: the mode of connections accepted from now on
  // (kWindows needs a device with windows; bounds are not checked). Never
  // used by the node itself.
  absl::Status SetAccessForTest(RdmaAccess access);

 private:
  friend class PlaneConnection;
  struct Area {
    uintptr_t base = 0;
    uint64_t length = 0;
    // kWindows: registered for window binding. kWholeArea: for remote
    // READ and WRITE. Created on first use of the mode.
    std::unique_ptr<rdma::MemoryRegion> window_mr;
    std::unique_ptr<rdma::MemoryRegion> remote_mr;
  };

  RdmaPlane() = default;
  // Registers what `access` needs. REQUIRES: mu_ held.
  absl::Status PrepareLocked(RdmaAccess access)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free, unbound window (allocated when the pool is empty).
  absl::StatusOr<std::unique_ptr<rdma::MemoryWindow>> TakeWindow();
  void ReturnWindow(std::unique_ptr<rdma::MemoryWindow> w);

  std::unique_ptr<rdma::Device> device_;
  std::vector<std::unique_ptr<Area>> areas_;  // by base; constant after Create
  std::vector<uint32_t> area_ids_;

  mutable Mutex mu_;
  RdmaAccess access_ ABSL_GUARDED_BY(mu_) = RdmaAccess::kWindows;
  std::vector<std::unique_ptr<rdma::MemoryWindow>> free_windows_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache::storage
