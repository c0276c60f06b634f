#include "storage_node/dataplane/rdma_plane.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/transport_params.h"
#include "glog/logging.h"

namespace hymcache::storage {

absl::StatusOr<std::unique_ptr<RdmaPlane>> RdmaPlane::Create(
    std::unique_ptr<rdma::Device> device,
    const std::vector<MemoryArea>& areas) {
  if (areas.empty()) {
    return absl::FailedPreconditionError(
        "rdma: the device exposes no memory for direct access");
  }
  std::unique_ptr<RdmaPlane> p(new RdmaPlane());
  for (const MemoryArea& a : areas) {
    if (a.length > device->max_mr_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rdma: area ", a.area_id, " (", a.kind, ") of ", a.length,
          " bytes exceeds the largest registration of ", device->name(), " (",
          device->max_mr_size(), " bytes); use smaller regions"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<rdma::MemoryRegion> mr,
                     device->Register(a.base, a.length, /*remote_write=*/true));
    absl::StrAppend(&p->areas_param_, p->areas_param_.empty() ? "" : ",",
                    a.area_id, ":", reinterpret_cast<uintptr_t>(a.base), ":",
                    a.length, ":", mr->rkey());
    p->regions_.push_back(std::move(mr));
  }
  LOG(INFO) << "rdma: registered " << areas.size() << " memory areas on "
            << device->name() << " (GID index " << device->gid_index()
            << ", MTU " << device->active_mtu() << ")";
  p->device_ = std::move(device);
  return p;
}

RdmaPlane::~RdmaPlane() {
  // Registrations end before the device closes.
  regions_.clear();
}

std::map<std::string, std::string> RdmaPlane::TransportParams() const {
  return {{kRdmaDeviceParam, device_->name()}, {kRdmaAreasParam, areas_param_}};
}

absl::StatusOr<std::pair<std::shared_ptr<void>, std::string>> RdmaPlane::Accept(
    std::string_view client_info) {
  ASSIGN_OR_RETURN(rdma::QpInfo remote, rdma::QpInfo::Decode(absl::string_view(
                                            client_info.data(), client_info.size())));
  ASSIGN_OR_RETURN(std::unique_ptr<rdma::QueuePair> qp,
                   rdma::QueuePair::Create(device_.get(), {}));
  RETURN_IF_ERROR(qp->Connect(remote));
  std::string mine = qp->local_info().Encode();
  return std::make_pair(std::shared_ptr<void>(std::move(qp)), std::move(mine));
}

}  // namespace hymcache::storage
