#include "common/rdma.h"

#include <errno.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace hymcache::rdma {
namespace {

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r returns the message (possibly not in buf).
  return absl::StrCat(strerror_r(err, buf, sizeof(buf)), " (errno ", err, ")");
}

// verbs calls return an errno value (ibv_modify_qp, ibv_post_send) or -1 with
// errno set (ibv_query_*); both are mapped here.
absl::Status VerbsError(absl::StatusCode code, absl::string_view what,
                        int ret) {
  int err = ret > 0 ? ret : errno;
  return absl::Status(code, absl::StrCat(what, ": ", ErrnoText(err)));
}

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EAGAIN:
      return absl::StatusCode::kResourceExhausted;
    case EINVAL:
      return absl::StatusCode::kInvalidArgument;
    case EPERM:
    case EACCES:
      return absl::StatusCode::kPermissionDenied;
    case ENODEV:
    case ENXIO:
    case ENOSYS:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// MTU in bytes <-> enum ibv_mtu (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5).
uint32_t MtuBytes(int mtu_enum) { return 128u << mtu_enum; }
ibv_mtu MtuEnum(uint32_t bytes) {
  int e = 1;
  while (e < 5 && MtuBytes(e) < bytes) ++e;
  return static_cast<ibv_mtu>(e);
}
bool ValidMtu(uint32_t bytes) {
  return bytes == 256 || bytes == 512 || bytes == 1024 || bytes == 2048 ||
         bytes == 4096;
}

bool IsIpv4Mapped(const uint8_t* g) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g, kPrefix, sizeof(kPrefix)) == 0;
}

void SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

absl::Status WcStatusToStatus(int wc_status, uint32_t vendor_err,
                              const OneSidedOp& op) {
  auto st = static_cast<ibv_wc_status>(wc_status);
  std::string msg = absl::StrCat(
      "rdma ", op.kind == OneSidedOp::Kind::kRead ? "READ" : "WRITE", " of ",
      op.length, " bytes at remote 0x", absl::Hex(op.remote_addr), " (rkey 0x",
      absl::Hex(op.rkey), "): ", ibv_wc_status_str(st), " (vendor_err 0x",
      absl::Hex(vendor_err), ")");
  switch (st) {
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_MW_BIND_ERR:
      return absl::PermissionDeniedError(msg);
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
      return absl::InvalidArgumentError(msg);
    default:
      // Retries exceeded, flushed, remote operation errors, fatal errors:
      // the connection is gone; the caller reconnects.
      return absl::UnavailableError(msg);
  }
}

constexpr char kMagic[4] = {'H', 'Q', 'P', '1'};
constexpr size_t kQpInfoSize = 4 + 4 + 4 + 2 + 16 + 4;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace

// ---------------------------------------------------------------- devices

std::vector<std::string> ListDevices() {
  std::vector<std::string> names;
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) return names;
  for (int i = 0; i < num; ++i) names.push_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

absl::Status Available() {
  if (ListDevices().empty()) return absl::UnavailableError("no RDMA device");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Device>> Device::Open(
    const DeviceOptions& options) {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no RDMA device: ibv_get_device_list: ", ErrnoText(errno)));
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> list_owner(
      list, ibv_free_device_list);
  ibv_device* dev = nullptr;
  std::vector<std::string> names;
  for (int i = 0; i < num; ++i) {
    names.push_back(ibv_get_device_name(list[i]));
    if (dev == nullptr &&
        (options.device_name.empty() || options.device_name == names.back())) {
      dev = list[i];
    }
  }
  if (dev == nullptr) {
    if (names.empty()) return absl::UnavailableError("no RDMA device");
    return absl::UnavailableError(
        absl::StrCat("no RDMA device named '", options.device_name,
                     "' (have: ", absl::StrJoin(names, ", "), ")"));
  }

  std::unique_ptr<Device> d(new Device());
  d->name_ = ibv_get_device_name(dev);
  d->port_ = options.port;
  d->ctx_ = ibv_open_device(dev);
  if (d->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ibv_open_device(", d->name_, "): ", ErrnoText(errno)));
  }
  ibv_device_attr dattr;
  std::memset(&dattr, 0, sizeof(dattr));
  if (int r = ibv_query_device(d->ctx_, &dattr); r != 0) {
    return VerbsError(absl::StatusCode::kInternal,
                      absl::StrCat("ibv_query_device(", d->name_, ")"), r);
  }
  if (options.port < 1 || options.port > dattr.phys_port_cnt) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma device ", d->name_, " has no port ", options.port,
                     " (ports: 1..", int{dattr.phys_port_cnt}, ")"));
  }
  d->max_mr_size_ = dattr.max_mr_size;
  d->max_qp_wr_ = dattr.max_qp_wr;
  d->max_cqe_ = dattr.max_cqe;
  d->max_sge_ = dattr.max_sge;
  d->max_qp_rd_atom_ = dattr.max_qp_rd_atom;
  d->max_qp_init_rd_atom_ = dattr.max_qp_init_rd_atom;
  d->max_mw_ = dattr.max_mw;
  d->supports_windows_ =
      dattr.max_mw > 0 &&
      (dattr.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A |
                                 IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;

  ibv_port_attr pattr;
  std::memset(&pattr, 0, sizeof(pattr));
  if (int r = ibv_query_port(d->ctx_, options.port, &pattr); r != 0) {
    return VerbsError(absl::StatusCode::kInternal,
                      absl::StrCat("ibv_query_port(", d->name_, ")"), r);
  }
  if (pattr.state != IBV_PORT_ACTIVE) {
    return absl::UnavailableError(
        absl::StrCat("rdma device ", d->name_, " port ", options.port, " is ",
                     ibv_port_state_str(pattr.state), ", not ACTIVE"));
  }
  d->roce_ = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
  d->lid_ = pattr.lid;
  d->active_mtu_ = MtuBytes(pattr.active_mtu);
  d->max_msg_size_ = pattr.max_msg_sz;

  // GID selection.
  int gid_index = options.gid_index;
  if (gid_index >= pattr.gid_tbl_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma device ", d->name_, ": gid_index ", gid_index,
                     " beyond the GID table (", pattr.gid_tbl_len, ")"));
  }
  if (gid_index < 0) {
    gid_index = 0;
    if (d->roce_ && pattr.gid_tbl_len > 0) {
      std::vector<ibv_gid_entry> entries(pattr.gid_tbl_len);
      ssize_t n =
          ibv_query_gid_table(d->ctx_, entries.data(), entries.size(), 0);
      if (n < 0) {
        // Older kernels: one entry at a time (empty ones fail with ENODATA).
        n = 0;
        for (int i = 0; i < pattr.gid_tbl_len; ++i) {
          if (ibv_query_gid_ex(d->ctx_, options.port, i, &entries[n], 0) == 0) {
            ++n;
          }
        }
      }
      int first_v2 = -1, v4 = -1;
      for (ssize_t i = 0; i < n; ++i) {
        const ibv_gid_entry& e = entries[i];
        if (e.port_num != static_cast<uint32_t>(options.port) ||
            e.gid_type != IBV_GID_TYPE_ROCE_V2) {
          continue;
        }
        int idx = static_cast<int>(e.gid_index);
        if (first_v2 < 0 || idx < first_v2) first_v2 = idx;
        if (IsIpv4Mapped(e.gid.raw) && (v4 < 0 || idx < v4)) v4 = idx;
      }
      gid_index = v4 >= 0 ? v4 : (first_v2 >= 0 ? first_v2 : 0);
    }
  }
  d->gid_index_ = gid_index;
  ibv_gid gid;
  if (int r = ibv_query_gid(d->ctx_, options.port, gid_index, &gid); r != 0) {
    return VerbsError(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("ibv_query_gid(", d->name_, ", index ", gid_index, ")"),
        r);
  }
  std::memcpy(d->gid_.data(), gid.raw, 16);
  if (d->roce_ && d->gid_ == std::array<uint8_t, 16>{}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rdma device ", d->name_, ": GID index ", gid_index, " is empty"));
  }

  d->pd_ = ibv_alloc_pd(d->ctx_);
  if (d->pd_ == nullptr) {
    return VerbsError(CodeForErrno(errno),
                      absl::StrCat("ibv_alloc_pd(", d->name_, ")"), 0);
  }
  d->channel_ = ibv_create_comp_channel(d->ctx_);
  if (d->channel_ == nullptr) {
    return VerbsError(CodeForErrno(errno),
                      absl::StrCat("ibv_create_comp_channel(", d->name_, ")"),
                      0);
  }
  d->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->wake_fd_ < 0) {
    return VerbsError(absl::StatusCode::kResourceExhausted, "eventfd", 0);
  }
  SetNonBlocking(d->channel_->fd);
  SetNonBlocking(d->ctx_->async_fd);
  Device* p = d.get();
  absl::StatusOr<Thread> thread =
      Thread::Start("rdma-poll", [p] { p->PollLoop(); });
  if (!thread.ok()) return thread.status();
  d->poller_ = std::move(*thread);
  return d;
}

Device::~Device() {
  if (poller_.joinable()) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
      LOG(ERROR) << "rdma device " << name_
                 << ": cannot wake the poller: " << ErrnoText(errno);
    }
    poller_.Join();
  }
  {
    MutexLock l(&mu_);
    if (!qps_.empty()) {
      LOG(ERROR) << "rdma device " << name_ << " destroyed with " << qps_.size()
                 << " queue pairs alive";
    }
  }
  if (channel_ != nullptr && ibv_destroy_comp_channel(channel_) != 0) {
    LOG(ERROR) << "ibv_destroy_comp_channel(" << name_
               << "): " << ErrnoText(errno);
  }
  if (pd_ != nullptr) {
    if (int r = ibv_dealloc_pd(pd_); r != 0) {
      LOG(ERROR) << "ibv_dealloc_pd(" << name_
                 << "): " << ErrnoText(r > 0 ? r : errno)
                 << " (memory regions or queue pairs still alive?)";
    }
  }
  if (ctx_ != nullptr && ibv_close_device(ctx_) != 0) {
    LOG(ERROR) << "ibv_close_device(" << name_ << "): " << ErrnoText(errno);
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Device::PollLoop() {
  while (true) {
    pollfd fds[3] = {{channel_->fd, POLLIN, 0},
                     {ctx_->async_fd, POLLIN, 0},
                     {wake_fd_, POLLIN, 0}};
    int r = poll(fds, 3, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "rdma-poll(" << name_ << "): poll: " << ErrnoText(errno);
      return;
    }
    if (fds[2].revents != 0) return;
    if (fds[0].revents != 0) HandleCqEvents();
    if (fds[1].revents != 0) HandleAsyncEvents();
  }
}

void Device::HandleCqEvents() {
  while (true) {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    if (ibv_get_cq_event(channel_, &cq, &cq_ctx) != 0) return;  // EAGAIN
    // Until this event is acked, ibv_destroy_cq of `cq` blocks, so `cq` is
    // valid here; a queue pair still in qps_ is not being destroyed.
    MutexLock l(&mu_);
    auto it = qps_.find(static_cast<QueuePair*>(cq_ctx));
    if (it != qps_.end()) (*it)->OnCqEvent();
    ibv_ack_cq_events(cq, 1);
  }
}

void Device::HandleAsyncEvents() {
  while (true) {
    ibv_async_event ev;
    if (ibv_get_async_event(ctx_, &ev) != 0) return;  // EAGAIN
    {
      MutexLock l(&mu_);
      switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_PATH_MIG_ERR:
          for (QueuePair* qp : qps_) {
            if (qp->qp_ == ev.element.qp) {
              qp->OnFatalEvent(ibv_event_type_str(ev.event_type));
            }
          }
          break;
        case IBV_EVENT_CQ_ERR:
          for (QueuePair* qp : qps_) {
            if (qp->cq_ == ev.element.cq) {
              qp->OnFatalEvent(ibv_event_type_str(ev.event_type));
            }
          }
          break;
        case IBV_EVENT_DEVICE_FATAL:
        case IBV_EVENT_PORT_ERR:
          LOG(WARNING) << "rdma device " << name_ << ": "
                       << ibv_event_type_str(ev.event_type);
          if (ev.event_type == IBV_EVENT_DEVICE_FATAL) {
            for (QueuePair* qp : qps_) qp->OnFatalEvent("device fatal");
          }
          break;
        default:
          VLOG(1) << "rdma device " << name_ << ": async event "
                  << ibv_event_type_str(ev.event_type);
          break;
      }
    }
    ibv_ack_async_event(&ev);
  }
}

void Device::AddQueuePair(QueuePair* qp) {
  MutexLock l(&mu_);
  qps_.insert(qp);
}

void Device::RemoveQueuePair(QueuePair* qp) {
  MutexLock l(&mu_);
  qps_.erase(qp);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::Register(
    void* addr, size_t len, bool remote_write, ProtectionDomain* pd) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  if (remote_write) access |= IBV_ACCESS_REMOTE_WRITE;
  return RegisterWithAccess(addr, len, access,
                            pd != nullptr ? pd->pd_ : pd_);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterWriteOnly(
    void* addr, size_t len, ProtectionDomain* pd) {
  // Remote write needs local write.
  return RegisterWithAccess(addr, len,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                            pd != nullptr ? pd->pd_ : pd_);
}

absl::StatusOr<std::unique_ptr<ProtectionDomain>>
Device::AllocateProtectionDomain() {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  if (pd == nullptr) {
    return VerbsError(CodeForErrno(errno),
                      absl::StrCat("ibv_alloc_pd(", name_, ")"), 0);
  }
  return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(pd));
}

ProtectionDomain::~ProtectionDomain() {
  if (int r = ibv_dealloc_pd(pd_); r != 0) {
    LOG(ERROR) << "ibv_dealloc_pd: " << ErrnoText(r > 0 ? r : errno)
               << " (memory regions or queue pairs still alive?)";
  }
}

absl::StatusOr<bool> Device::ProbeWindowBounds() {
  constexpr size_t kHalf = 4096;
  if (!supports_windows_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rdma device ", name_, " has no type-2 memory windows"));
  }
  std::vector<uint8_t> mem(2 * kHalf, 0x5a), dst(kHalf, 0);
  ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> mr,
                   RegisterForWindows(mem.data(), mem.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> dst_mr,
                   Register(dst.data(), dst.size(), /*remote_write=*/false));
  ASSIGN_OR_RETURN(std::unique_ptr<MemoryWindow> w, AllocateWindow());
  QueuePairOptions o;
  o.max_outstanding = 4;
  o.drain_timeout = absl::Seconds(2);
  ASSIGN_OR_RETURN(std::unique_ptr<QueuePair> a, QueuePair::Create(this, o));
  ASSIGN_OR_RETURN(std::unique_ptr<QueuePair> b, QueuePair::Create(this, o));
  RETURN_IF_ERROR(a->Connect(b->local_info()));
  RETURN_IF_ERROR(b->Connect(a->local_info()));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  RETURN_IF_ERROR(b->ExecuteWindowOps({{WindowOp::Kind::kBind, w.get(),
                                        mr.get(), mem.data(), kHalf, false}},
                                      deadline)[0]);
  auto read = [&](size_t offset) {
    OneSidedOp op{OneSidedOp::Kind::kRead, dst.data(), dst_mr->lkey(),
                  reinterpret_cast<uint64_t>(mem.data() + offset), w->rkey(),
                  static_cast<uint32_t>(kHalf)};
    return a->Execute({op}, deadline)[0];
  };
  if (absl::Status in = read(0); !in.ok()) {
    return absl::InternalError(absl::StrCat(
        "rdma device ", name_,
        ": a read inside a memory window was refused: ", in.message()));
  }
  const absl::Status outside = read(kHalf);
  // Nothing is in flight after Execute. The window goes first: a window
  // still bound holds its queue pair on some devices (rxe's destroy then
  // waits for it).
  w.reset();
  a.reset();
  b.reset();
  if (outside.ok()) return false;
  if (absl::IsPermissionDenied(outside)) return true;
  return absl::Status(outside.code(),
                      absl::StrCat("rdma device ", name_,
                                   ": probing memory-window bounds: ",
                                   outside.message()));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterForWindows(
    void* addr, size_t len) {
  if (!supports_windows_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rdma device ", name_, " has no type-2 memory windows (max_mw ",
        max_mw_, ")"));
  }
  // Local write: a window granting remote write needs it on its region.
  return RegisterWithAccess(addr, len,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, pd_);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Device::RegisterWithAccess(
    void* addr, size_t len, int access, ibv_pd* pd) {
  if (addr == nullptr || len == 0) {
    return absl::InvalidArgumentError(
        "rdma register: null address or zero length");
  }
  if (len > max_mr_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma register: ", len, " bytes exceed max_mr_size ",
                     max_mr_size_, " of ", name_));
  }
  ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  if (mr == nullptr) {
    int err = errno;
    return absl::Status(
        CodeForErrno(err),
        absl::StrCat(
            "ibv_reg_mr(", name_, ", ", len, " bytes): ", ErrnoText(err),
            err == ENOMEM ? " (locked-memory limit? see ulimit -l)" : ""));
  }
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(mr, addr, len));
}

absl::StatusOr<std::unique_ptr<MemoryWindow>> Device::AllocateWindow() {
  if (!supports_windows_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rdma device ", name_, " has no type-2 memory windows (max_mw ",
        max_mw_, ")"));
  }
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  if (mw == nullptr) {
    int err = errno;
    return absl::Status(CodeForErrno(err),
                        absl::StrCat("ibv_alloc_mw(", name_, ", type 2): ",
                                     ErrnoText(err)));
  }
  return std::unique_ptr<MemoryWindow>(new MemoryWindow(mw));
}

// ---------------------------------------------------------- memory regions

MemoryRegion::~MemoryRegion() {
  if (int r = ibv_dereg_mr(mr_); r != 0) {
    LOG(ERROR) << "ibv_dereg_mr: " << ErrnoText(r > 0 ? r : errno);
  }
}

uint32_t MemoryRegion::lkey() const { return mr_->lkey; }
uint32_t MemoryRegion::rkey() const { return mr_->rkey; }

// ---------------------------------------------------------- memory windows

MemoryWindow::~MemoryWindow() {
  if (int r = ibv_dealloc_mw(mw_); r != 0) {
    LOG(ERROR) << "ibv_dealloc_mw: " << ErrnoText(r > 0 ? r : errno);
  }
}

uint32_t MemoryWindow::rkey() const { return mw_->rkey; }

// ------------------------------------------------------------------ QpInfo

std::string QpInfo::Encode() const {
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, qpn);
  PutU32(&out, psn);
  out.push_back(static_cast<char>(lid));
  out.push_back(static_cast<char>(lid >> 8));
  out.append(reinterpret_cast<const char*>(gid.data()), gid.size());
  PutU32(&out, mtu);
  return out;
}

absl::StatusOr<QpInfo> QpInfo::Decode(absl::string_view b) {
  if (b.size() != kQpInfoSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("QpInfo: ", b.size(), " bytes, want ", kQpInfoSize));
  }
  if (std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("QpInfo: bad magic");
  }
  const char* p = b.data() + 4;
  QpInfo q;
  q.qpn = GetU32(p);
  q.psn = GetU32(p + 4);
  q.lid = static_cast<uint16_t>(static_cast<uint8_t>(p[8]) |
                                (static_cast<uint8_t>(p[9]) << 8));
  std::memcpy(q.gid.data(), p + 10, 16);
  q.mtu = GetU32(p + 26);
  if (q.qpn > 0xFFFFFF || q.psn > 0xFFFFFF) {
    return absl::InvalidArgumentError("QpInfo: qpn or psn above 24 bits");
  }
  if (!ValidMtu(q.mtu)) {
    return absl::InvalidArgumentError(absl::StrCat("QpInfo: bad MTU ", q.mtu));
  }
  return q;
}

// ------------------------------------------------------------- queue pairs

absl::StatusOr<std::unique_ptr<QueuePair>> QueuePair::Create(
    Device* device, const QueuePairOptions& options) {
  if (device == nullptr) {
    return absl::InvalidArgumentError("rdma queue pair: no device");
  }
  if (options.max_outstanding < 1 || options.max_sge < 1 ||
      options.signal_interval < 0 || options.max_rd_atomic < 1 ||
      options.ack_timeout < 0 || options.ack_timeout > 31 ||
      options.retry_count < 0 || options.retry_count > 7 ||
      options.drain_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "rdma queue pair: max_outstanding, max_sge, max_rd_atomic >= 1; "
        "signal_interval >= 0; ack_timeout 0..31; retry_count 0..7; "
        "drain_timeout > 0");
  }
  if (options.max_sge > device->max_sge_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma queue pair: max_sge ", options.max_sge, " > ",
                     device->max_sge_, " of ", device->name_));
  }
  std::unique_ptr<QueuePair> q(new QueuePair(device, options));
  QueuePairOptions& o = q->options_;
  // One send-queue slot and one CQ entry beyond max_outstanding for the
  // drain marker; one more CQ entry for slack.
  o.max_outstanding = std::min(
      {o.max_outstanding, device->max_qp_wr_ - 1, device->max_cqe_ - 2});
  if (o.max_outstanding < 1) {
    return absl::InternalError("rdma queue pair: device limits too small");
  }
  q->signal_interval_ = o.signal_interval > 0
                            ? o.signal_interval
                            : std::max(1, o.max_outstanding / 4);
  q->max_rd_atomic_ =
      std::max(1, std::min(o.max_rd_atomic, device->max_qp_init_rd_atom_));
  q->max_dest_rd_atomic_ =
      std::max(1, std::min(o.max_rd_atomic, device->max_qp_rd_atom_));

  q->cq_ = ibv_create_cq(device->ctx_, o.max_outstanding + 2, q.get(),
                         device->channel_, 0);
  if (q->cq_ == nullptr) {
    return VerbsError(CodeForErrno(errno), "ibv_create_cq", 0);
  }
  ibv_qp_init_attr init;
  std::memset(&init, 0, sizeof(init));
  init.qp_context = q.get();
  init.send_cq = q->cq_;
  init.recv_cq = q->cq_;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = o.max_outstanding + 1;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = o.max_sge;
  init.cap.max_recv_sge = 1;
  q->qp_ = ibv_create_qp(o.pd != nullptr ? o.pd->pd_ : device->pd_, &init);
  if (q->qp_ == nullptr) {
    return VerbsError(CodeForErrno(errno), "ibv_create_qp", 0);
  }
  ibv_qp_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = device->port_;
  attr.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (int r = ibv_modify_qp(
          q->qp_, &attr,
          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      r != 0) {
    return VerbsError(CodeForErrno(r), "ibv_modify_qp(INIT)", r);
  }
  std::random_device rd;
  q->local_.qpn = q->qp_->qp_num;
  q->local_.psn = rd() & 0xFFFFFF;
  q->local_.lid = device->lid_;
  q->local_.gid = device->gid_;
  q->local_.mtu = device->active_mtu_;
  device->AddQueuePair(q.get());
  if (ibv_req_notify_cq(q->cq_, 0) != 0) {
    return VerbsError(absl::StatusCode::kInternal, "ibv_req_notify_cq", 0);
  }
  return q;
}

QueuePair::~QueuePair() { Destroy(); }

void QueuePair::Destroy() {
  // After this the poller no longer touches cq_ / qp_.
  device_->RemoveQueuePair(this);
  if (qp_ != nullptr) {
    if (int r = ibv_destroy_qp(qp_); r != 0) {
      LOG(ERROR) << "ibv_destroy_qp: " << ErrnoText(r > 0 ? r : errno);
    }
    qp_ = nullptr;
  }
  if (cq_ != nullptr) {
    if (int r = ibv_destroy_cq(cq_); r != 0) {
      LOG(ERROR) << "ibv_destroy_cq: " << ErrnoText(r > 0 ? r : errno);
    }
    cq_ = nullptr;
  }
  MutexLock l(&mu_);
  if (state_ != State::kBroken) {
    state_ = State::kBroken;
    broken_reason_ = "queue pair destroyed";
  }
  cv_.SignalAll();
}

bool QueuePair::healthy() const {
  MutexLock l(&mu_);
  return state_ == State::kConnected;
}

absl::Status QueuePair::Connect(const QpInfo& remote) {
  MutexLock el(&exec_mu_);
  {
    MutexLock l(&mu_);
    if (state_ != State::kInit) {
      return absl::FailedPreconditionError(
          state_ == State::kConnected
              ? "rdma queue pair: already connected"
              : absl::StrCat("rdma queue pair broken: ", broken_reason_));
    }
  }
  if (!ValidMtu(remote.mtu) || remote.qpn > 0xFFFFFF || remote.psn > 0xFFFFFF) {
    return absl::InvalidArgumentError("rdma connect: malformed peer QpInfo");
  }
  auto fail = [this](absl::Status st) {
    MutexLock l(&mu_);
    state_ = State::kBroken;
    broken_reason_ = std::string(st.message());
    return st;
  };
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = MtuEnum(std::min(local_.mtu, remote.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = max_dest_rd_atomic_;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = device_->port_;
  if (device_->roce_) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
    a.ah_attr.grh.sgid_index = device_->gid_index_;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = 0;
    a.ah_attr.grh.flow_label = 0;
  }
  if (int r = ibv_modify_qp(
          qp_, &a,
          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      r != 0) {
    return fail(VerbsError(CodeForErrno(r), "ibv_modify_qp(RTR)", r));
  }
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = options_.ack_timeout;
  a.retry_cnt = options_.retry_count;
  a.rnr_retry = 7;
  a.sq_psn = local_.psn;
  a.max_rd_atomic = max_rd_atomic_;
  if (int r = ibv_modify_qp(qp_, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC);
      r != 0) {
    return fail(VerbsError(CodeForErrno(r), "ibv_modify_qp(RTS)", r));
  }
  MutexLock l(&mu_);
  state_ = State::kConnected;
  return absl::OkStatus();
}

void QueuePair::OnCqEvent() {
  // Arm first, then drain: a completion that lands after the last poll
  // raises a new event.
  if (ibv_req_notify_cq(cq_, 0) != 0) {
    LOG(ERROR) << "ibv_req_notify_cq: " << ErrnoText(errno);
  }
  ibv_wc wc[32];
  MutexLock l(&mu_);
  int n;
  while ((n = ibv_poll_cq(cq_, 32, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      done_seq_ = std::max(done_seq_, wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS && error_seq_ == 0) {
        error_seq_ = wc[i].wr_id;
        error_wc_status_ = wc[i].status;
        error_vendor_err_ = wc[i].vendor_err;
      }
    }
  }
  if (n < 0 && state_ != State::kBroken) {
    state_ = State::kBroken;
    broken_reason_ = "ibv_poll_cq failed";
  }
  cv_.SignalAll();
}

void QueuePair::OnFatalEvent(const char* what) {
  MutexLock l(&mu_);
  if (state_ != State::kBroken) {
    state_ = State::kBroken;
    broken_reason_ = absl::StrCat("async event: ", what);
  }
  cv_.SignalAll();
}

void QueuePair::BreakAndDrain(absl::string_view why) {
  uint64_t target;
  uint64_t marker;
  {
    MutexLock l(&mu_);
    if (state_ != State::kBroken) {
      state_ = State::kBroken;
      broken_reason_ = std::string(why);
    }
    target = next_seq_ - 1;
    marker = next_seq_++;
  }
  if (qp_ == nullptr) return;  // already destroyed: nothing in flight
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_ERR;
  if (int r = ibv_modify_qp(qp_, &a, IBV_QP_STATE); r != 0) {
    LOG(WARNING) << "rdma: ibv_modify_qp(ERR): " << ErrnoText(r);
  }
  // In the error state every outstanding work request completes (flushed),
  // in order; a signaled marker posted now completes last.
  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = marker;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.num_sge = 0;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, &wr, &bad) == 0) target = marker;
  absl::Time drain_deadline = absl::Now() + options_.drain_timeout;
  bool drained;
  {
    MutexLock l(&mu_);
    while (done_seq_ < target) {
      if (cv_.WaitWithDeadline(&mu_, drain_deadline)) break;
    }
    drained = done_seq_ >= target;
  }
  if (!drained) {
    LOG(ERROR) << "rdma: queue pair " << local_.qpn << " did not drain within "
               << options_.drain_timeout << "; destroying it";
    Destroy();
  }
}

std::vector<absl::Status> QueuePair::Execute(absl::Span<const OneSidedOp> ops,
                                             absl::Time deadline) {
  MutexLock el(&exec_mu_);
  const size_t n = ops.size();
  std::vector<absl::Status> out(n);
  if (n == 0) return out;
  if (absl::Status st = CheckConnected(); !st.ok()) {
    std::fill(out.begin(), out.end(), st);
    return out;
  }
  // Validate everything before posting anything.
  size_t bad_op = n;
  for (size_t i = 0; i < n; ++i) {
    const OneSidedOp& op = ops[i];
    if ((op.local == nullptr && op.length > 0) ||
        op.length > device_->max_msg_size_) {
      out[i] = absl::InvalidArgumentError(absl::StrCat(
          "rdma op ", i, ": null local buffer or length ", op.length,
          " above max_msg_size ", device_->max_msg_size_));
      if (bad_op == n) bad_op = i;
    }
  }
  if (bad_op != n) {
    for (size_t i = 0; i < n; ++i) {
      if (out[i].ok()) {
        out[i] = absl::InvalidArgumentError(absl::StrCat(
            "not posted: op ", bad_op, " of the batch is invalid"));
      }
    }
    return out;
  }
  if (absl::Now() >= deadline) {
    std::fill(
        out.begin(), out.end(),
        absl::DeadlineExceededError("rdma: deadline passed before posting"));
    return out;
  }

  return Run(
      n,
      [&](size_t i, ibv_send_wr* wr, ibv_sge* sg) {
        const OneSidedOp& op = ops[i];
        sg->addr = reinterpret_cast<uintptr_t>(op.local);
        sg->length = op.length;
        sg->lkey = op.lkey;
        wr->sg_list = sg;
        wr->num_sge = 1;
        wr->opcode = op.kind == OneSidedOp::Kind::kRead ? IBV_WR_RDMA_READ
                                                        : IBV_WR_RDMA_WRITE;
        wr->wr.rdma.remote_addr = op.remote_addr;
        wr->wr.rdma.rkey = op.rkey;
      },
      [&](size_t i, int wc_status, uint32_t vendor_err) {
        return WcStatusToStatus(wc_status, vendor_err, ops[i]);
      },
      deadline);
}

std::vector<absl::Status> QueuePair::ExecuteWindowOps(
    absl::Span<const WindowOp> ops, absl::Time deadline) {
  MutexLock el(&exec_mu_);
  const size_t n = ops.size();
  std::vector<absl::Status> out(n);
  if (n == 0) return out;
  if (absl::Status st = CheckConnected(); !st.ok()) {
    std::fill(out.begin(), out.end(), st);
    return out;
  }
  // Validate everything before posting anything.
  size_t bad_op = n;
  for (size_t i = 0; i < n; ++i) {
    const WindowOp& op = ops[i];
    const char* why = nullptr;
    if (op.window == nullptr || !op.window->usable()) {
      why = "no window, or a window that is no longer usable";
    } else if (op.kind == WindowOp::Kind::kInvalidate) {
      if (!op.window->bound()) why = "the window is not bound";
    } else if (op.window->bound()) {
      why = "the window is already bound";
    } else if (op.region == nullptr || op.length == 0 ||
               reinterpret_cast<uintptr_t>(op.addr) <
                   reinterpret_cast<uintptr_t>(op.region->addr()) ||
               reinterpret_cast<uintptr_t>(op.addr) -
                       reinterpret_cast<uintptr_t>(op.region->addr()) >
                   op.region->length() ||
               op.length > op.region->length() -
                               (reinterpret_cast<uintptr_t>(op.addr) -
                                reinterpret_cast<uintptr_t>(
                                    op.region->addr()))) {
      why = "the range is empty or not inside the region";
    }
    if (why != nullptr) {
      out[i] = absl::InvalidArgumentError(
          absl::StrCat("rdma window op ", i, ": ", why));
      if (bad_op == n) bad_op = i;
    }
  }
  if (bad_op != n) {
    for (size_t i = 0; i < n; ++i) {
      if (out[i].ok()) {
        out[i] = absl::InvalidArgumentError(absl::StrCat(
            "not posted: op ", bad_op, " of the batch is invalid"));
      }
    }
    return out;
  }
  if (absl::Now() >= deadline) {
    std::fill(
        out.begin(), out.end(),
        absl::DeadlineExceededError("rdma: deadline passed before posting"));
    return out;
  }
  // The key each bind gives its window (the current one's low 8 bits
  // incremented), applied when the bind completes.
  std::vector<uint32_t> new_rkey(n);
  for (size_t i = 0; i < n; ++i) {
    new_rkey[i] = ibv_inc_rkey(ops[i].window->mw_->rkey);
  }
  out = Run(
      n,
      [&](size_t i, ibv_send_wr* wr, ibv_sge*) {
        const WindowOp& op = ops[i];
        wr->num_sge = 0;
        if (op.kind == WindowOp::Kind::kInvalidate) {
          wr->opcode = IBV_WR_LOCAL_INV;
          wr->invalidate_rkey = op.window->mw_->rkey;
          return;
        }
        wr->opcode = IBV_WR_BIND_MW;
        wr->bind_mw.mw = op.window->mw_;
        wr->bind_mw.rkey = new_rkey[i];
        wr->bind_mw.bind_info.mr = op.region->mr_;
        wr->bind_mw.bind_info.addr = reinterpret_cast<uintptr_t>(op.addr);
        wr->bind_mw.bind_info.length = op.length;
        wr->bind_mw.bind_info.mw_access_flags =
            op.remote_write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
      },
      [&](size_t i, int wc_status, uint32_t vendor_err) {
        const WindowOp& op = ops[i];
        std::string msg = absl::StrCat(
            "rdma ",
            op.kind == WindowOp::Kind::kBind ? "memory window bind"
                                             : "memory window invalidation",
            " (rkey 0x", absl::Hex(op.window->mw_->rkey), "): ",
            ibv_wc_status_str(static_cast<ibv_wc_status>(wc_status)),
            " (vendor_err 0x", absl::Hex(vendor_err), ")");
        switch (static_cast<ibv_wc_status>(wc_status)) {
          case IBV_WC_MW_BIND_ERR:
          case IBV_WC_LOC_PROT_ERR:
          case IBV_WC_LOC_ACCESS_ERR:
            return absl::PermissionDeniedError(msg);
          default:
            return absl::UnavailableError(msg);
        }
      },
      deadline);
  for (size_t i = 0; i < n; ++i) {
    MemoryWindow* w = ops[i].window;
    if (!out[i].ok()) {
      w->usable_ = false;
    } else if (ops[i].kind == WindowOp::Kind::kBind) {
      // The provider does not track a type-2 window's key; the next bind
      // and invalidation name it by the key of this one.
      w->mw_->rkey = new_rkey[i];
      w->bound_ = true;
    } else {
      w->bound_ = false;
    }
  }
  return out;
}

absl::Status QueuePair::CheckConnected() const {
  MutexLock l(&mu_);
  if (state_ == State::kConnected) return absl::OkStatus();
  return absl::FailedPreconditionError(
      state_ == State::kInit
          ? std::string("rdma queue pair not connected")
          : absl::StrCat("rdma queue pair broken: ", broken_reason_));
}

std::vector<absl::Status> QueuePair::Run(
    size_t n, absl::FunctionRef<void(size_t, ibv_send_wr*, ibv_sge*)> fill,
    absl::FunctionRef<absl::Status(size_t, int, uint32_t)> error,
    absl::Time deadline) {
  std::vector<absl::Status> out(n);
  const uint64_t max_out = options_.max_outstanding;
  const size_t chunk_cap = std::min<size_t>(n, max_out);
  std::vector<ibv_send_wr> wrs(chunk_cap);
  std::vector<ibv_sge> sges(chunk_cap);
  uint64_t base;
  {
    MutexLock l(&mu_);
    base = next_seq_;
  }
  size_t posted = 0;
  bool failed = false;
  bool timed_out = false;
  std::string why;
  while (true) {
    size_t room = 0;
    {
      MutexLock l(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (error_seq_ != 0 || state_ != State::kConnected) return true;
        uint64_t last = base + posted - 1;  // highest posted seq
        if (posted == n) return done_seq_ >= last;
        return last - done_seq_ < max_out;
      };
      while (!ready()) {
        if (cv_.WaitWithDeadline(&mu_, deadline) && !ready()) {
          timed_out = true;
          break;
        }
      }
      if (error_seq_ != 0 || state_ != State::kConnected) {
        failed = true;
        why = state_ != State::kConnected
                  ? broken_reason_
                  : std::string("a work request completed with an error");
        break;
      }
      if (timed_out) {
        failed = true;
        why = "deadline exceeded with work requests in flight";
        break;
      }
      if (posted == n) break;  // all done
      if (absl::Now() >= deadline) {
        timed_out = true;
        failed = true;
        why = "deadline exceeded with work requests in flight";
        break;
      }
      room = max_out - (base + posted - 1 - done_seq_);
    }
    const size_t cnt = std::min(room, n - posted);
    for (size_t j = 0; j < cnt; ++j) {
      const uint64_t seq = base + posted + j;
      ibv_send_wr& wr = wrs[j];
      std::memset(&wr, 0, sizeof(wr));
      std::memset(&sges[j], 0, sizeof(sges[j]));
      fill(posted + j, &wr, &sges[j]);
      wr.wr_id = seq;
      wr.next = j + 1 < cnt ? &wrs[j + 1] : nullptr;
      if (j + 1 == cnt || seq % signal_interval_ == 0) {
        wr.send_flags = IBV_SEND_SIGNALED;
      }
    }
    {
      MutexLock l(&mu_);
      next_seq_ = base + posted + cnt;
    }
    ibv_send_wr* bad = nullptr;
    int r = ibv_post_send(qp_, wrs.data(), &bad);
    if (r != 0) {
      size_t ok = bad != nullptr ? static_cast<size_t>(bad - wrs.data()) : 0;
      posted += ok;
      failed = true;
      why = absl::StrCat("ibv_post_send: ", ErrnoText(r));
      MutexLock l(&mu_);
      next_seq_ = base + posted;
      break;
    }
    posted += cnt;
  }

  if (failed) BreakAndDrain(why);

  MutexLock l(&mu_);
  const bool flush_only =
      error_seq_ != 0 && error_wc_status_ == IBV_WC_WR_FLUSH_ERR;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t seq = base + i;
    if (i < posted && seq <= done_seq_ &&
        (error_seq_ == 0 || seq < error_seq_)) {
      continue;  // OK
    }
    if (i < posted && error_seq_ == seq && !(flush_only && timed_out)) {
      out[i] = error(i, error_wc_status_, error_vendor_err_);
    } else if (timed_out) {
      out[i] = absl::DeadlineExceededError(
          absl::StrCat("rdma op ", i, " not completed by the deadline"));
    } else if (error_seq_ != 0 && seq > error_seq_ && !flush_only) {
      out[i] =
          absl::AbortedError(absl::StrCat("rdma op ", i, " not executed: op ",
                                          error_seq_ - base, " failed first"));
    } else {
      out[i] = absl::UnavailableError(
          absl::StrCat("rdma op ", i, " not completed: ", why));
    }
  }
  return out;
}

}  // namespace hymcache::rdma
