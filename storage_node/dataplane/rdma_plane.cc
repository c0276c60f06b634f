#include "storage_node/dataplane/rdma_plane.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/transport_params.h"
#include "glog/logging.h"

namespace hymcache::storage {

const char* RdmaAccessName(RdmaAccess a) {
  switch (a) {
    case RdmaAccess::kWindows:
      return "memory windows per object";
    case RdmaAccess::kRegistrations:
      return "registrations per object";
    case RdmaAccess::kWholeArea:
      return "whole-area keys (trusted clients)";
  }
  return "?";
}

// One client's queue pair and the grants open on it. Used by one thread at
// a time (DataServer's connection owner).
class PlaneConnection : public RdmaConnection {
 public:
  struct AreaKeys {
    uintptr_t base;
    uint64_t length;
    const rdma::MemoryRegion* mr;  // window_mr or remote_mr
  };

  PlaneConnection(RdmaPlane* plane, RdmaAccess access,
                  std::vector<AreaKeys> areas,
                  std::unique_ptr<rdma::ProtectionDomain> pd,
                  std::unique_ptr<rdma::QueuePair> qp)
      : plane_(plane),
        access_(access),
        areas_(std::move(areas)),
        pd_(std::move(pd)),
        qp_(std::move(qp)) {}

  ~PlaneConnection() override {
    std::vector<uint32_t> keys;
    for (const auto& [k, w] : windows_) keys.push_back(k);
    for (const auto& [k, r] : registrations_) keys.push_back(k);
    Revoke(keys, absl::Now() + absl::Seconds(5));
    // Then the queue pair, then its protection domain.
    qp_.reset();
    pd_.reset();
  }

  std::vector<absl::StatusOr<uint32_t>> Grant(absl::Span<const Range> ranges,
                                              absl::Time deadline) override {
    std::vector<absl::StatusOr<uint32_t>> out(ranges.size(), 0u);
    std::vector<rdma::WindowOp> binds;
    std::vector<std::unique_ptr<rdma::MemoryWindow>> taken;
    std::vector<size_t> bind_index;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      const AreaKeys* a = Find(r.data, r.length);
      if (a == nullptr) {
        out[i] = absl::InternalError(
            "rdma: granted range outside the registered memory");
        continue;
      }
      switch (access_) {
        case RdmaAccess::kWholeArea:
          out[i] = a->mr->rkey();
          break;
        case RdmaAccess::kRegistrations: {
          void* p = const_cast<void*>(r.data);
          absl::StatusOr<std::unique_ptr<rdma::MemoryRegion>> mr =
              r.write ? plane_->device_->RegisterWriteOnly(p, r.length,
                                                           pd_.get())
                      : plane_->device_->Register(p, r.length,
                                                  /*remote_write=*/false,
                                                  pd_.get());
          if (!mr.ok()) {
            out[i] = mr.status();
            break;
          }
          const uint32_t key = (*mr)->rkey();
          registrations_[key] = std::move(*mr);
          out[i] = key;
          break;
        }
        case RdmaAccess::kWindows: {
          absl::StatusOr<std::unique_ptr<rdma::MemoryWindow>> w =
              plane_->TakeWindow();
          if (!w.ok()) {
            out[i] = w.status();
            break;
          }
          binds.push_back({rdma::WindowOp::Kind::kBind, w->get(), a->mr,
                           r.data, r.length, r.write});
          taken.push_back(std::move(*w));
          bind_index.push_back(i);
          break;
        }
      }
    }
    if (binds.empty()) return out;
    std::vector<absl::Status> st = qp_->ExecuteWindowOps(binds, deadline);
    for (size_t k = 0; k < binds.size(); ++k) {
      if (!st[k].ok()) {
        out[bind_index[k]] = st[k];
        // A window whose bind was posted is in an unknown state: destroyed
        // (that invalidates it); one never posted goes back.
        if (taken[k]->usable()) plane_->ReturnWindow(std::move(taken[k]));
        continue;
      }
      const uint32_t key = taken[k]->rkey();
      out[bind_index[k]] = key;
      windows_[key] = std::move(taken[k]);
    }
    return out;
  }

  void Revoke(absl::Span<const uint32_t> keys, absl::Time deadline) override {
    std::vector<std::unique_ptr<rdma::MemoryWindow>> ws;
    for (uint32_t k : keys) {
      if (auto it = windows_.find(k); it != windows_.end()) {
        ws.push_back(std::move(it->second));
        windows_.erase(it);
      } else if (auto r = registrations_.find(k); r != registrations_.end()) {
        registrations_.erase(r);  // deregisters: no access from now on
      }
      // kWholeArea keys: nothing to close.
    }
    if (ws.empty()) return;
    std::vector<rdma::WindowOp> inv;
    for (auto& w : ws) inv.push_back({rdma::WindowOp::Kind::kInvalidate, w.get()});
    std::vector<absl::Status> st;
    if (qp_->healthy()) st = qp_->ExecuteWindowOps(inv, deadline);
    for (size_t k = 0; k < ws.size(); ++k) {
      if (k < st.size() && st[k].ok()) {
        plane_->ReturnWindow(std::move(ws[k]));
      }
      // Else: destroyed here, which invalidates it.
    }
  }

  rdma::QueuePair* qp() { return qp_.get(); }

 private:
  const AreaKeys* Find(const void* p, uint64_t len) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const AreaKeys& k : areas_) {
      if (a >= k.base && a - k.base <= k.length && len <= k.length - (a - k.base)) {
        return &k;
      }
    }
    return nullptr;
  }

  RdmaPlane* const plane_;
  const RdmaAccess access_;
  const std::vector<AreaKeys> areas_;
  std::unique_ptr<rdma::ProtectionDomain> pd_;  // kRegistrations
  std::unique_ptr<rdma::QueuePair> qp_;
  std::map<uint32_t, std::unique_ptr<rdma::MemoryWindow>> windows_;
  std::map<uint32_t, std::unique_ptr<rdma::MemoryRegion>> registrations_;
};

absl::StatusOr<std::unique_ptr<RdmaPlane>> RdmaPlane::Create(
    std::unique_ptr<rdma::Device> device, const std::vector<MemoryArea>& areas,
    const RdmaPlaneOptions& options) {
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
    auto area = std::make_unique<Area>();
    area->base = reinterpret_cast<uintptr_t>(a.base);
    area->length = a.length;
    p->areas_.push_back(std::move(area));
    p->area_ids_.push_back(a.area_id);
  }
  p->device_ = std::move(device);
  rdma::Device* d = p->device_.get();
  // Which access mode, and why.
  std::string why;
  RdmaAccess access;
  if (!d->supports_windows()) {
    why = absl::StrCat(d->name(), " has no type-2 memory windows (max_mw ",
                       d->max_mw(), ")");
  } else {
    absl::StatusOr<bool> bounded = d->ProbeWindowBounds();
    if (!bounded.ok()) {
      why = absl::StrCat("probing the memory windows of ", d->name(),
                         " failed: ", bounded.status().message());
    } else if (!*bounded) {
      why = absl::StrCat(
          d->name(),
          "'s memory windows do not confine their peer to the window's "
          "range (only to the registration's)");
    }
  }
  if (why.empty()) {
    access = RdmaAccess::kWindows;
  } else if (options.trusted_clients) {
    access = RdmaAccess::kWholeArea;
    LOG(WARNING) << "rdma: " << why
                 << "; --rdma_trusted_clients: publishing whole-area keys, so "
                    "every client with a queue pair can read and overwrite "
                    "all of this node's exposed memory";
  } else {
    access = RdmaAccess::kRegistrations;
    LOG(WARNING) << "rdma: " << why
                 << "; registering each acquired object's range per "
                    "connection instead (slower; --rdma_trusted_clients "
                    "allows whole-area keys)";
  }
  {
    MutexLock l(&p->mu_);
    RETURN_IF_ERROR(p->PrepareLocked(access));
    p->access_ = access;
  }
  LOG(INFO) << "rdma: " << areas.size() << " memory areas on " << d->name()
            << " (GID index " << d->gid_index() << ", MTU " << d->active_mtu()
            << "), remote access: " << RdmaAccessName(access);
  return p;
}

RdmaPlane::~RdmaPlane() {
  // Windows and registrations end before the device closes.
  MutexLock l(&mu_);
  free_windows_.clear();
  areas_.clear();
}

absl::Status RdmaPlane::PrepareLocked(RdmaAccess access) {
  for (auto& a : areas_) {
    void* base = reinterpret_cast<void*>(a->base);
    if (access == RdmaAccess::kWindows && a->window_mr == nullptr) {
      ASSIGN_OR_RETURN(a->window_mr,
                       device_->RegisterForWindows(base, a->length));
    }
    if (access == RdmaAccess::kWholeArea && a->remote_mr == nullptr) {
      ASSIGN_OR_RETURN(a->remote_mr,
                       device_->Register(base, a->length, /*remote_write=*/true));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> RdmaPlane::TransportParams() const {
  std::string param;
  MutexLock l(&mu_);
  for (size_t i = 0; i < areas_.size(); ++i) {
    const Area& a = *areas_[i];
    const uint32_t key = access_ == RdmaAccess::kWholeArea ? a.remote_mr->rkey() : 0;
    absl::StrAppend(&param, param.empty() ? "" : ",", area_ids_[i], ":",
                    a.base, ":", a.length, ":", key);
  }
  return {{kRdmaDeviceParam, device_->name()}, {kRdmaAreasParam, param}};
}

RdmaAccess RdmaPlane::access() const {
  MutexLock l(&mu_);
  return access_;
}

absl::Status RdmaPlane::SetAccessForTest(RdmaAccess access) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(PrepareLocked(access));
  access_ = access;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<rdma::MemoryWindow>> RdmaPlane::TakeWindow() {
  {
    MutexLock l(&mu_);
    if (!free_windows_.empty()) {
      std::unique_ptr<rdma::MemoryWindow> w = std::move(free_windows_.back());
      free_windows_.pop_back();
      return w;
    }
  }
  return device_->AllocateWindow();
}

void RdmaPlane::ReturnWindow(std::unique_ptr<rdma::MemoryWindow> w) {
  if (w == nullptr || w->bound() || !w->usable()) return;  // destroyed
  MutexLock l(&mu_);
  free_windows_.push_back(std::move(w));
}

absl::StatusOr<std::pair<std::unique_ptr<RdmaConnection>, std::string>>
RdmaPlane::Accept(absl::string_view client_info) {
  ASSIGN_OR_RETURN(rdma::QpInfo remote,
                   rdma::QpInfo::Decode(absl::string_view(client_info.data(),
                                                          client_info.size())));
  RdmaAccess access;
  std::vector<PlaneConnection::AreaKeys> keys;
  {
    MutexLock l(&mu_);
    access = access_;
    for (const auto& a : areas_) {
      keys.push_back({a->base, a->length,
                      access == RdmaAccess::kWindows     ? a->window_mr.get()
                      : access == RdmaAccess::kWholeArea ? a->remote_mr.get()
                                                         : nullptr});
    }
  }
  std::unique_ptr<rdma::ProtectionDomain> pd;
  rdma::QueuePairOptions qo;
  if (access == RdmaAccess::kRegistrations) {
    // Its own protection domain: its registrations are reachable only
    // through its queue pair.
    ASSIGN_OR_RETURN(pd, device_->AllocateProtectionDomain());
    qo.pd = pd.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<rdma::QueuePair> qp,
                   rdma::QueuePair::Create(device_.get(), qo));
  RETURN_IF_ERROR(qp->Connect(remote));
  std::string mine = qp->local_info().Encode();
  std::unique_ptr<RdmaConnection> c(new PlaneConnection(
      this, access, std::move(keys), std::move(pd), std::move(qp)));
  return std::make_pair(std::move(c), std::move(mine));
}

}  // namespace hymcache::storage
