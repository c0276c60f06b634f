// A small RAII layer over libibverbs for one-sided RDMA (READ / WRITE) on
// reliable-connected queue pairs. It is the verbs core under the RDMA data
// plane: it owns devices, memory registrations and queue pairs, turns every
// verbs failure into an absl::Status, and guarantees that after Execute
// returns, nothing the NIC was told to do still writes into local buffers.
//
// Connection set-up is out of band: each side creates a QueuePair, sends
// local_info().Encode() to the peer over any channel (TCP, gRPC), decodes the
// peer's with QpInfo::Decode, and calls Connect. rdma_cm is not used (it
// cannot resolve routes over `lo`, where Soft-RoCE tests run).
//
//   ASSIGN_OR_RETURN(auto dev, rdma::Device::Open({}));
//   ASSIGN_OR_RETURN(auto mr, dev->Register(buf, len, /*remote_write=*/true));
//   ASSIGN_OR_RETURN(auto qp, rdma::QueuePair::Create(dev.get(), {}));
//   ... exchange qp->local_info().Encode() with the peer ...
//   RETURN_IF_ERROR(qp->Connect(peer_info));
//   std::vector<absl::Status> st = qp->Execute(ops, absl::Now() + timeout);
//
// Memory windows (type 2): a range registered with RegisterForWindows has no
// remote access of its own; a MemoryWindow bound over part of it on one
// queue pair (ExecuteWindowOps, kBind) gives that queue pair's peer READ or
// WRITE access to exactly that part under the window's own rkey, until the
// window is invalidated (kInvalidate) or destroyed:
//
//   ASSIGN_OR_RETURN(auto mr, dev->RegisterForWindows(buf, len));
//   ASSIGN_OR_RETURN(auto mw, dev->AllocateWindow());
//   qp->ExecuteWindowOps({{WindowOp::Kind::kBind, mw.get(), mr.get(), p, n,
//                          /*remote_write=*/false}}, deadline);
//   ... send mw->rkey() to the peer; it READs [p, p + n) ...
//   qp->ExecuteWindowOps({{WindowOp::Kind::kInvalidate, mw.get()}}, deadline);
//
// Threading: each Device runs one named thread, "rdma-poll", that sleeps on
// the device's completion channel and its asynchronous-event fd. Every
// QueuePair has its own completion queue bound to that channel; the poller
// drains it and wakes the Execute call waiting on the queue pair's CondVar.
// Callers never poll. Lock order: Device::mu_ before QueuePair::mu_ (the
// poller takes both); QueuePair::exec_mu_ before Device::mu_.
//
// Lifetimes: a Device must outlive every MemoryRegion and QueuePair created
// from it.
//
// Thread safety: Device, MemoryRegion and QueuePair are safe for concurrent
// use without external synchronization. Execute calls on one QueuePair are
// serialized (one batch in flight per queue pair); use several queue pairs
// for parallelism.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "common/thread.h"

struct ibv_context;
struct ibv_pd;
struct ibv_mr;
struct ibv_mw;
struct ibv_cq;
struct ibv_qp;
struct ibv_comp_channel;
struct ibv_send_wr;
struct ibv_sge;

namespace hymcache::rdma {

// Names of the RDMA devices on this host (e.g. "rxe0", "mlx5_0"); empty when
// there are none or the kernel has no RDMA support. Never fails.
std::vector<std::string> ListDevices();

// OK when at least one RDMA device exists; Unavailable otherwise.
absl::Status Available();

struct DeviceOptions {
  // Device to open. Default: "" (the first device ListDevices reports).
  std::string device_name;
  // Port of the device used by queue pairs. Default: 1.
  int port = 1;
  // GID table index used to address queue pairs on RoCE (Ethernet link
  // layer). -1 picks automatically: the first RoCE v2 GID holding an
  // IPv4-mapped address (::ffff:a.b.c.d), else the first RoCE v2 GID, else
  // index 0. Soft-RoCE on `lo` has ::ffff:127.0.0.1 at index 1. Ignored on
  // InfiniBand, which routes by LID. Default: -1.
  int gid_index = -1;
};

class MemoryRegion;
class MemoryWindow;
class ProtectionDomain;
class QueuePair;

// An opened RDMA device: verbs context, one protection domain, and the
// "rdma-poll" completion thread. Every MemoryRegion and QueuePair of a Device
// share its protection domain, so any registered buffer can be used with any
// of its queue pairs.
class Device {
 public:
  // Opens the device, allocates the protection domain and starts the poller.
  // Errors: Unavailable ("no RDMA device") when no device exists or the named
  // one is absent, the port is not ACTIVE, or the device cannot be opened;
  // InvalidArgument for a bad port or GID index; Internal for other verbs
  // failures. Never crashes on a host without RDMA.
  static absl::StatusOr<std::unique_ptr<Device>> Open(
      const DeviceOptions& options);
  // Stops the poller and releases the device.
  // REQUIRES: every MemoryRegion and QueuePair of this device is destroyed.
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Registers [addr, addr + len) for local access and for remote RDMA READ,
  // and, if `remote_write`, remote RDMA WRITE, in the device's protection
  // domain or in `pd` (then only queue pairs of `pd` can use it). The memory is pinned until the
  // MemoryRegion is destroyed; the caller keeps ownership of it and must keep
  // it mapped that long.
  // Errors: InvalidArgument (null addr, len 0 or above max_mr_size());
  // ResourceExhausted / Internal when the kernel refuses (ENOMEM: locked
  // memory limit, see `ulimit -l`), with errno text.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(
      void* addr, size_t len, bool remote_write,
      ProtectionDomain* pd = nullptr);
  // As Register, but a peer may only WRITE the range (no remote READ).
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterWriteOnly(
      void* addr, size_t len, ProtectionDomain* pd = nullptr);
  // Registers [addr, addr + len) for local access and for binding memory
  // windows only: its own rkey gives a peer no access at all; windows bound
  // over parts of it do (QueuePair::ExecuteWindowOps).
  // Errors: FailedPrecondition when !supports_windows(); else as Register.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterForWindows(void* addr,
                                                                   size_t len);
  // Allocates an unbound type-2 memory window.
  // Errors: FailedPrecondition when !supports_windows(); ResourceExhausted /
  // Internal when the device refuses (more than max_mw() windows), with
  // errno text.
  absl::StatusOr<std::unique_ptr<MemoryWindow>> AllocateWindow();
  // Whether a window confines its peer to the window's range, as the IB
  // specification requires, or only to its region: binds a read window over
  // the first 4 KiB of an 8 KiB scratch region on a loopback queue pair and
  // reads the second 4 KiB through it. Soft-RoCE (rxe, Linux 6.1) checks a
  // window's key, queue pair, access and validity but only its region's
  // range: false there. Takes a few milliseconds.
  // Errors: FailedPrecondition when !supports_windows(); the verbs errors
  // of setting up the loopback pair, or a read inside the window refused.
  absl::StatusOr<bool> ProbeWindowBounds();
  // A protection domain of its own (see ProtectionDomain).
  absl::StatusOr<std::unique_ptr<ProtectionDomain>> AllocateProtectionDomain();

  // Device name, e.g. "rxe0".
  const std::string& name() const { return name_; }
  // Largest single registration the device allows (ibv_query_device).
  uint64_t max_mr_size() const { return max_mr_size_; }
  // Largest single RDMA message (one OneSidedOp) the port allows.
  uint32_t max_msg_size() const { return max_msg_size_; }
  // Port and GID index in use (the GID index after automatic selection).
  int port() const { return port_; }
  int gid_index() const { return gid_index_; }
  // Active path MTU of the port in bytes (256..4096).
  uint32_t active_mtu() const { return active_mtu_; }
  // Memory windows the device allows at once (0: none).
  int max_mw() const { return max_mw_; }
  // Whether the device has type-2 memory windows (max_mw() > 0 and the
  // MEM_WINDOW_TYPE_2A or _2B capability).
  bool supports_windows() const { return supports_windows_; }

 private:
  friend class QueuePair;
  Device() = default;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterWithAccess(
      void* addr, size_t len, int access, ibv_pd* pd);
  void PollLoop();
  void HandleCqEvents();
  void HandleAsyncEvents();
  void AddQueuePair(QueuePair* qp) ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveQueuePair(QueuePair* qp) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after Open.
  std::string name_;
  int port_ = 1;
  int gid_index_ = 0;
  bool roce_ = false;  // Ethernet link layer: address by GID.
  std::array<uint8_t, 16> gid_{};
  uint16_t lid_ = 0;
  uint32_t active_mtu_ = 1024;
  uint64_t max_mr_size_ = 0;
  uint32_t max_msg_size_ = 0;
  int max_qp_wr_ = 0;
  int max_cqe_ = 0;
  int max_sge_ = 0;
  int max_qp_rd_atom_ = 0;
  int max_qp_init_rd_atom_ = 0;
  int max_mw_ = 0;
  bool supports_windows_ = false;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  int wake_fd_ = -1;  // eventfd: tells the poller to exit.
  Thread poller_;

  // Protected by mu_. The poller holds mu_ while it touches a queue pair's
  // completion queue, so a queue pair removed from `qps_` is no longer used
  // by the poller.
  Mutex mu_;
  std::set<QueuePair*> qps_ ABSL_GUARDED_BY(mu_);
};

// A protection domain besides the device's own: memory registered in it is
// reachable only through queue pairs created in it (QueuePairOptions::pd),
// e.g. one per client connection. Deallocated on destruction.
// REQUIRES: destroyed after every MemoryRegion and QueuePair created in it,
// and before its Device.
class ProtectionDomain {
 public:
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

 private:
  friend class Device;
  friend class QueuePair;
  explicit ProtectionDomain(ibv_pd* pd) : pd_(pd) {}
  ibv_pd* const pd_;
};

// A registered memory range. Deregisters on destruction.
// REQUIRES: destroyed before its Device.
class MemoryRegion {
 public:
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  // Key for local access (OneSidedOp::lkey).
  uint32_t lkey() const;
  // Key a peer uses to access this range (OneSidedOp::rkey on its side).
  uint32_t rkey() const;

 private:
  friend class Device;
  MemoryRegion(ibv_mr* mr, void* addr, size_t length)
      : mr_(mr), addr_(addr), length_(length) {}

  friend class QueuePair;
  ibv_mr* const mr_;
  void* const addr_;
  const size_t length_;
};

// A type-2 memory window: while bound (QueuePair::ExecuteWindowOps) it gives
// the peer of the queue pair it was bound on access to one range of a
// region registered with RegisterForWindows, under rkey(). Each bind gives
// it a new rkey (the key's low 8 bits change), so a key of an earlier
// binding does not work on a later one. Deallocated on destruction, which
// also invalidates it.
// REQUIRES: destroyed before its Device.
// Thread safety: not safe for concurrent use; used by one owner at a time.
class MemoryWindow {
 public:
  ~MemoryWindow();
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;

  // The key of the current (or, when unbound, of the last) binding.
  uint32_t rkey() const;
  // True between a successful kBind and the next kInvalidate.
  bool bound() const { return bound_; }
  // False after a bind or invalidation of this window failed: its state on
  // the device is then unknown, and the owner destroys it.
  bool usable() const { return usable_; }

 private:
  friend class Device;
  friend class QueuePair;
  explicit MemoryWindow(ibv_mw* mw) : mw_(mw) {}

  ibv_mw* const mw_;
  bool bound_ = false;
  bool usable_ = true;
};

// What a peer needs to connect its queue pair to ours. Exchanged out of band.
struct QpInfo {
  uint32_t qpn = 0;               // queue pair number (24 bits)
  uint32_t psn = 0;               // initial packet sequence number (24 bits)
  uint16_t lid = 0;               // port LID (InfiniBand; 0 on RoCE)
  std::array<uint8_t, 16> gid{};  // port GID (RoCE; may be 0 on InfiniBand)
  uint32_t mtu = 0;               // active path MTU in bytes: 256..4096

  // Fixed 34-byte little-endian encoding, versioned by a 4-byte magic:
  //   "HQP1" | qpn u32 | psn u32 | lid u16 | gid[16] | mtu u32
  std::string Encode() const;
  // Errors: InvalidArgument (wrong size or magic, qpn/psn above 24 bits, an
  // MTU that is not a power of two in 256..4096).
  static absl::StatusOr<QpInfo> Decode(absl::string_view bytes);

  bool operator==(const QpInfo& o) const {
    return qpn == o.qpn && psn == o.psn && lid == o.lid && gid == o.gid &&
           mtu == o.mtu;
  }
};

// One RDMA operation: READ copies `length` bytes from the peer's
// [remote_addr, +length) (registered there, `rkey`) into local [local,
// +length) (registered here, `lkey`); WRITE copies the other way.
struct OneSidedOp {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kRead;
  void* local = nullptr;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

// A memory-window operation on a queue pair (QueuePair::ExecuteWindowOps).
// kBind binds `window` (unbound, usable) over [addr, addr + length) of
// `region` (registered with RegisterForWindows; the range inside it; length
// >= 1), giving the queue pair's peer RDMA READ access, or with
// `remote_write` RDMA WRITE access (and no READ). kInvalidate ends the
// binding of `window` (bound): its rkey no longer works, on completion.
struct WindowOp {
  enum class Kind { kBind, kInvalidate };
  Kind kind = Kind::kBind;
  MemoryWindow* window = nullptr;
  const MemoryRegion* region = nullptr;
  const void* addr = nullptr;
  uint64_t length = 0;
  bool remote_write = false;
};

struct QueuePairOptions {
  // Protection domain of the queue pair; nullptr: the device's. Not owned;
  // must outlive the queue pair. Default: nullptr.
  ProtectionDomain* pd = nullptr;
  // Most work requests in flight at once; Execute posts more as earlier ones
  // complete. Clamped to the device's limit. Default: 128.
  int max_outstanding = 128;
  // Scatter/gather entries per work request (OneSidedOp uses one).
  // Default: 1.
  int max_sge = 1;
  // A completion is requested for every `signal_interval`-th work request and
  // for the last one posted at a time; fewer completions mean fewer poller
  // wake-ups. 0 picks max(1, max_outstanding / 4). Default: 0.
  int signal_interval = 0;
  // RDMA READs in flight per queue pair (initiator and responder depth),
  // clamped to the device's limits. Both ends must use the same value.
  // Default: 16.
  int max_rd_atomic = 16;
  // Local ACK timeout exponent: 4.096 us * 2^ack_timeout before a retry.
  // Default: 14 (67 ms).
  int ack_timeout = 14;
  // Transport retries before a work request fails with "retry exceeded"
  // (peer unreachable). Default: 7.
  int retry_count = 7;
  // After a failure or a missed deadline, how long Execute waits for the
  // flushed completions of the broken queue pair. If they do not come, the
  // queue pair is destroyed (which also stops the NIC from touching the
  // buffers). Default: 5 s.
  absl::Duration drain_timeout = absl::Seconds(5);
};

// One reliable-connected queue pair with its own completion queue.
// States: created (Connect not yet called) -> connected -> broken. A broken
// queue pair stays broken: the caller creates a new one and reconnects (both
// ends: an error usually puts the peer's queue pair into the error state too,
// which the peer notices on its next Execute).
class QueuePair {
 public:
  // Creates the queue pair and moves it to INIT.
  // Errors: InvalidArgument (bad options); ResourceExhausted / Internal from
  // verbs, with errno text.
  static absl::StatusOr<std::unique_ptr<QueuePair>> Create(
      Device* device, const QueuePairOptions& options);
  // REQUIRES: no Execute in progress.
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  // Our end's connection data, to send to the peer.
  QpInfo local_info() const { return local_; }

  // Connects to the peer's queue pair (INIT -> RTR -> RTS), using the smaller
  // of the two MTUs. Call once.
  // Errors: FailedPrecondition (already connected or broken);
  // InvalidArgument / Internal from ibv_modify_qp, with errno text.
  absl::Status Connect(const QpInfo& remote);

  // Posts all `ops` (chained work requests, `max_outstanding` at most in
  // flight, selectively signaled) and waits for them to complete or for
  // `deadline`. Returns one status per op, in order:
  //   OK                  the transfer completed;
  //   PermissionDenied    remote or local access / protection error (bad
  //                       rkey, range outside the peer's region, lkey);
  //   InvalidArgument     the op is malformed (then nothing is posted and the
  //                       queue pair stays healthy), or the peer rejected it;
  //   Unavailable         transport failure (retries exceeded, peer queue pair
  //                       in error, queue pair broken earlier);
  //   Aborted             not executed because an earlier op failed;
  //   DeadlineExceeded    not completed by `deadline`.
  //   FailedPrecondition  not connected, or already broken.
  // If `deadline` has passed before anything is posted, every op gets
  // DeadlineExceeded and the queue pair stays healthy. On a completion
  // error, a post failure or the deadline, the queue pair is moved to the
  // error state and drained (every flushed completion collected) BEFORE
  // returning, so nothing writes into local buffers after Execute returns;
  // the queue pair is then broken (healthy() is false).
  // Calls on one queue pair are serialized.
  std::vector<absl::Status> Execute(absl::Span<const OneSidedOp> ops,
                                    absl::Time deadline);

  // Posts memory-window binds and invalidations (work requests on this
  // queue pair's send queue) and waits for them as Execute does, with the
  // same per-op statuses (a malformed op: InvalidArgument, nothing posted;
  // a bind the device refuses: PermissionDenied, and the queue pair is
  // broken). On OK a bound window has its new rkey and bound() is true; an
  // invalidated one is unbound. A window whose op did not complete OK is
  // no longer usable(): destroy it (that invalidates it).
  std::vector<absl::Status> ExecuteWindowOps(absl::Span<const WindowOp> ops,
                                             absl::Time deadline);

  // True after a successful Connect until the queue pair breaks (an Execute
  // failure, or a fatal asynchronous event from the device).
  bool healthy() const;

 private:
  friend class Device;
  QueuePair(Device* device, const QueuePairOptions& options)
      : device_(device), options_(options) {}
  // Poller side: drains the CQ and wakes Execute. REQUIRES: device_->mu_.
  void OnCqEvent() ABSL_LOCKS_EXCLUDED(mu_);
  // Poller side: a fatal async event for this queue pair.
  void OnFatalEvent(const char* what) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the QP to ERR, posts a marker and waits for every outstanding
  // completion; destroys the QP if that takes longer than drain_timeout.
  void BreakAndDrain(absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Posts `n` work requests built by `fill` (chained, at most
  // max_outstanding in flight) and waits; the status of a failed one comes
  // from `error`. The body of Execute and ExecuteWindowOps.
  // REQUIRES: connected; the ops validated.
  std::vector<absl::Status> Run(
      size_t n, absl::FunctionRef<void(size_t, ibv_send_wr*, ibv_sge*)> fill,
      absl::FunctionRef<absl::Status(size_t, int, uint32_t)> error,
      absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // FailedPrecondition unless connected.
  absl::Status CheckConnected() const ABSL_LOCKS_EXCLUDED(mu_);
  // Unregisters from the device and destroys the QP and CQ. Idempotent.
  void Destroy() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after Create.
  Device* const device_;
  QueuePairOptions options_;  // clamped in Create
  QpInfo local_;
  int signal_interval_ = 1;
  int max_rd_atomic_ = 1;
  int max_dest_rd_atomic_ = 1;

  // Serializes Execute; held for the whole call.
  Mutex exec_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Set in Create, cleared by Destroy (under exec_mu_ or in the destructor).
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;

  // Protected by mu_. Work requests carry wr_id = a sequence number that
  // grows for the life of the queue pair. Completions arrive in posting
  // order, so a completion for `seq` means every earlier work request has
  // finished too.
  mutable Mutex mu_;
  CondVar cv_;
  enum class State { kInit, kConnected, kBroken };
  State state_ ABSL_GUARDED_BY(mu_) = State::kInit;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t done_seq_ ABSL_GUARDED_BY(mu_) = 0;    // highest completed seq
  uint64_t error_seq_ ABSL_GUARDED_BY(mu_) = 0;   // first failed seq; 0: none
  int error_wc_status_ ABSL_GUARDED_BY(mu_) = 0;  // its ibv_wc_status
  uint32_t error_vendor_err_ ABSL_GUARDED_BY(mu_) = 0;
  std::string broken_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache::rdma
