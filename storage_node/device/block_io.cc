#include "storage_node/device/block_io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/thread.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

// Largest transfer handed to one pread/pwrite or SQE: Linux moves at most
// 0x7ffff000 bytes per call, and io_uring lengths are 32-bit. Longer requests
// are split and continue like a short transfer.
constexpr size_t kMaxChunk = size_t{1} << 30;

// Most entries io_uring_queue_init accepts (IORING_MAX_ENTRIES).
constexpr int kMaxQueueDepth = 32768;

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Whether the block device under `fd` (the device itself, or the one the
// file's filesystem is on) is bio-based: no blk-mq hardware queues, so it
// typically moves the bytes while the I/O is submitted (zram, brd, pmem;
// also dm and md, which pass I/Os on). False when unknown (no sysfs entry:
// tmpfs, overlay and other devices without a block device).
bool BioBasedDevice(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  const dev_t dev = S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev;
  const std::string dir =
      absl::StrCat("/sys/dev/block/", major(dev), ":", minor(dev));
  struct stat d;
  if (stat(dir.c_str(), &d) != 0) return false;
  // A partition's queues are its disk's (the parent directory).
  return stat((dir + "/mq").c_str(), &d) != 0 &&
         stat((dir + "/../mq").c_str(), &d) != 0;
}

// One Read or Write, owned by the engine from submission to completion.
struct Request {
  bool write = false;
  int fd = -1;
  uint64_t offset = 0;  // of the next byte to move
  uint8_t* buf = nullptr;
  size_t remaining = 0;
  BlockIo::Callback done;
  // Set when the request fails validation: the engine only delivers it, on
  // its own thread, as it delivers I/O results.
  absl::Status preset = absl::OkStatus();
  bool has_preset = false;
};

// Marks the engine threads of the BlockIo they belong to, so that Read/Write
// issued from a completion callback never blocks on backpressure (which only
// those threads can relieve).
thread_local const void* tls_engine = nullptr;

// Shared by both engines: the file, its size, and per-call validation.
class BlockIoBase : public BlockIo {
 public:
  BlockIoBase(int fd, uint64_t size, bool direct)
      : fd_(fd), size_(size), direct_(direct) {}
  ~BlockIoBase() override {
    if (owns_fd_) close(fd_);
  }

  void Read(uint64_t offset, void* buf, size_t len, Callback done) override {
    Submit(MakeRequest(false, offset, static_cast<uint8_t*>(buf), len,
                       std::move(done)));
  }
  void Write(uint64_t offset, const void* buf, size_t len,
             Callback done) override {
    // The buffer is only read; Request keeps one pointer type for both ops.
    Submit(MakeRequest(true, offset,
                       const_cast<uint8_t*>(static_cast<const uint8_t*>(buf)),
                       len, std::move(done)));
  }

  absl::Status Sync() override {
    while (fdatasync(fd_) != 0) {
      if (errno != EINTR) return ErrnoStatus(errno, "block io: fdatasync");
    }
    return absl::OkStatus();
  }

  uint64_t size() const override { return size_; }

 protected:
  // Takes ownership of `r` and eventually runs r->done exactly once on an
  // engine thread.
  virtual void Submit(Request* r) = 0;

  bool OnEngineThread() const { return tls_engine == this; }

  // Moves bytes with pread/pwrite until done; returns the outcome.
  static absl::Status RunSync(Request* r) {
    while (r->remaining > 0) {
      size_t n = std::min(r->remaining, kMaxChunk);
      ssize_t got = r->write ? pwrite(r->fd, r->buf, n, r->offset)
                             : pread(r->fd, r->buf, n, r->offset);
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoStatus(errno, r->write ? "block io: pwrite"
                                           : "block io: pread");
      }
      if (got == 0) {
        return absl::DataLossError(
            absl::StrCat("block io: short ", r->write ? "write" : "read",
                         " at offset ", r->offset, ", ", r->remaining,
                         " bytes left"));
      }
      Advance(r, static_cast<size_t>(got));
    }
    return absl::OkStatus();
  }

  static void Advance(Request* r, size_t n) {
    r->offset += n;
    r->buf += n;
    r->remaining -= n;
  }

  const int fd_;
  const uint64_t size_;
  const bool direct_;
  // Cleared when a failed engine start hands fd back to Open.
  bool owns_fd_ = true;

 private:
  Request* MakeRequest(bool write, uint64_t offset, uint8_t* buf, size_t len,
                       Callback done) const {
    auto* r = new Request;
    r->write = write;
    r->fd = fd_;
    r->offset = offset;
    r->buf = buf;
    r->remaining = len;
    r->done = std::move(done);
    absl::Status s = Check(offset, buf, len);
    if (!s.ok() || len == 0) {
      r->preset = std::move(s);
      r->has_preset = true;
    }
    return r;
  }

  absl::Status Check(uint64_t offset, const void* buf, size_t len) const {
    if (len > 0 && buf == nullptr) {
      return absl::InvalidArgumentError("block io: null buffer");
    }
    if (direct_) {
      if (offset % kAlignment != 0 || len % kAlignment != 0 ||
          reinterpret_cast<uintptr_t>(buf) % kAlignment != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block io: O_DIRECT needs offset, length and buffer aligned to ",
            kAlignment, " (offset ", offset, ", length ", len, ", buffer ",
            absl::Hex(reinterpret_cast<uintptr_t>(buf)), ")"));
      }
    }
    if (offset > size_ || len > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat("block io: [", offset, ", +",
                                                len, ") past the end at ",
                                                size_));
    }
    return absl::OkStatus();
  }
};

// ------------------------------------------------------------ thread pool

// `threads` workers pop requests from one queue and run pread/pwrite.
// Read/Write block while queue_depth requests are queued or running, except
// on a worker thread (from a callback), which never waits.
class ThreadPoolBlockIo final : public BlockIoBase {
 public:
  ThreadPoolBlockIo(int fd, uint64_t size, bool direct,
                    const BlockIoOptions& options)
      : BlockIoBase(fd, size, direct), depth_(options.queue_depth) {
    workers_.reserve(options.threads);
    for (int i = 0; i < options.threads; ++i) {
      workers_.emplace_back(absl::StrCat("blkio-", i), [this] { Work(); });
    }
  }

  ~ThreadPoolBlockIo() override {
    {
      MutexLock l(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    // Workers drain the queue before they exit.
    for (Thread& t : workers_) t.Join();
  }

  absl::string_view engine() const override { return "threadpool"; }

 protected:
  void Submit(Request* r) override {
    MutexLock l(&mu_);
    if (!OnEngineThread()) {
      while (outstanding_ >= depth_) cv_.Wait(&mu_);
    }
    ++outstanding_;
    queue_.push_back(r);
    cv_.SignalAll();
  }

 private:
  void Work() {
    tls_engine = this;
    for (;;) {
      Request* r;
      {
        MutexLock l(&mu_);
        while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
        if (queue_.empty()) return;
        r = queue_.front();
        queue_.pop_front();
      }
      absl::Status s = r->has_preset ? r->preset : RunSync(r);
      Callback done = std::move(r->done);
      delete r;
      done(std::move(s));
      MutexLock l(&mu_);
      --outstanding_;
      cv_.SignalAll();
    }
  }

  // Constant after construction.
  const int depth_;

  Mutex mu_;
  // Signalled on every queue push and every completion.
  CondVar cv_;
  std::deque<Request*> queue_ ABSL_GUARDED_BY(mu_);
  // Queued + running requests.
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Last: started after, and joined before, everything above is destroyed.
  std::vector<Thread> workers_;
};

// --------------------------------------------------------------- io_uring

// One ring of queue_depth entries. Any thread submits under mu_; one named
// thread reaps completions and runs callbacks. At most queue_depth requests
// are in the ring, so the SQ always has room and the CQ (2 x entries) cannot
// overflow. Read/Write block while the ring is full, except from a callback
// (the completion thread), whose requests wait in overflow_ instead.
class UringBlockIo final : public BlockIoBase {
 public:
  // Sentinel user_data of the NOP that stops the completion thread.
  static constexpr uint64_t kStop = ~uint64_t{0};

  static absl::StatusOr<std::unique_ptr<UringBlockIo>> Create(
      int fd, uint64_t size, bool direct, const BlockIoOptions& options) {
    using Submit = BlockIoOptions::Submit;
    const bool async = options.submit == Submit::kAsync ||
                       (options.submit == Submit::kAuto && BioBasedDevice(fd));
    auto io = std::unique_ptr<UringBlockIo>(
        new UringBlockIo(fd, size, direct, options.queue_depth, async));
    int rc = io_uring_queue_init(options.queue_depth, &io->ring_, 0);
    if (rc < 0) {
      io->owns_fd_ = false;  // Open keeps fd for the fallback
      return ErrnoStatus(-rc, "block io: io_uring_queue_init");
    }
    io->ring_ready_ = true;
    io->reaper_ = Thread("blkio-uring", [raw = io.get()] { raw->Reap(); });
    return io;
  }

  ~UringBlockIo() override {
    if (ring_ready_) {
      {
        MutexLock l(&mu_);
        while (in_ring_ > 0 || !overflow_.empty()) cv_.Wait(&mu_);
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        CHECK(sqe != nullptr) << "block io: no SQE for shutdown";
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kStop);
        SubmitLocked();
      }
      reaper_.Join();
      io_uring_queue_exit(&ring_);
    }
  }

  absl::string_view engine() const override { return "io_uring"; }
  bool async_submit() const override { return async_; }

 protected:
  void Submit(Request* r) override {
    MutexLock l(&mu_);
    if (OnEngineThread()) {
      if (in_ring_ >= depth_) {
        overflow_.push_back(r);
        return;
      }
    } else {
      while (in_ring_ >= depth_) cv_.Wait(&mu_);
    }
    ++in_ring_;
    PrepLocked(r);
    SubmitLocked();
  }

 private:
  UringBlockIo(int fd, uint64_t size, bool direct, int depth, bool async)
      : BlockIoBase(fd, size, direct), depth_(depth), async_(async) {}

  // Queues one SQE for `r` (a NOP for a preset outcome).
  void PrepLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    // in_ring_ <= depth_ = SQ entries, and submission empties the SQ.
    CHECK(sqe != nullptr) << "block io: io_uring SQ full";
    if (r->has_preset) {
      io_uring_prep_nop(sqe);
    } else {
      unsigned n = static_cast<unsigned>(std::min(r->remaining, kMaxChunk));
      if (r->write) {
        io_uring_prep_write(sqe, r->fd, r->buf, n, r->offset);
      } else {
        io_uring_prep_read(sqe, r->fd, r->buf, n, r->offset);
      }
      if (async_) sqe->flags |= IOSQE_ASYNC;
    }
    io_uring_sqe_set_data(sqe, r);
  }

  void SubmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0) return;
      if (rc == -EINTR || rc == -EAGAIN) continue;
      // The SQEs stay in the ring and go with the next submission.
      LOG(ERROR) << "block io: io_uring_submit: " << strerror(-rc);
      return;
    }
  }

  void Reap() {
    tls_engine = this;
    std::vector<std::pair<Request*, int>> batch;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc < 0) {
        if (rc != -EINTR && rc != -EAGAIN) {
          LOG(ERROR) << "block io: io_uring_wait_cqe: " << strerror(-rc);
        }
        continue;
      }
      bool stop = false;
      batch.clear();
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (cqe->user_data == kStop) {
          stop = true;
          continue;
        }
        batch.emplace_back(static_cast<Request*>(io_uring_cqe_get_data(cqe)),
                           cqe->res);
      }
      io_uring_cq_advance(&ring_, seen);
      for (auto& [r, res] : batch) Complete(r, res);
      if (stop) return;
    }
  }

  // Handles one CQE of `r`: resubmits the rest of a short transfer, or
  // delivers the outcome and frees the ring slot.
  void Complete(Request* r, int res) {
    absl::Status s;
    {
      // Also orders this thread after the submitter's writes to *r (the
      // hand-off through the kernel is invisible to TSan).
      MutexLock l(&mu_);
      if (r->has_preset) {
        s = r->preset;
      } else if (res == -EINTR || res == -EAGAIN) {
        PrepLocked(r);
        SubmitLocked();
        return;
      } else if (res < 0) {
        s = ErrnoStatus(-res, r->write ? "block io: write" : "block io: read");
      } else if (res == 0) {
        s = absl::DataLossError(
            absl::StrCat("block io: short ", r->write ? "write" : "read",
                         " at offset ", r->offset, ", ", r->remaining,
                         " bytes left"));
      } else {
        Advance(r, static_cast<size_t>(res));
        if (r->remaining > 0) {
          PrepLocked(r);
          SubmitLocked();
          return;
        }
      }
    }
    Callback done = std::move(r->done);
    delete r;
    done(std::move(s));
    MutexLock l(&mu_);
    if (!overflow_.empty()) {
      // The slot passes to the oldest request a callback queued.
      Request* next = overflow_.front();
      overflow_.pop_front();
      PrepLocked(next);
      SubmitLocked();
    } else {
      --in_ring_;
    }
    cv_.SignalAll();
  }

  // Constant after construction.
  const int depth_;
  const bool async_;
  io_uring ring_;  // SQ side under mu_; CQ side on the reaper thread only
  bool ring_ready_ = false;

  Mutex mu_;
  // Signalled whenever a ring slot frees.
  CondVar cv_;
  int in_ring_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Request*> overflow_ ABSL_GUARDED_BY(mu_);

  Thread reaper_;
};

// Caps the bandwidth of another BlockIo: transfers whose BandwidthPacer
// start time has come go straight to it; the others wait, in start-time
// order, for the "blkio-pace" thread. With a minimum read latency, a read
// that completes early waits on the same thread until its time.
class PacedBlockIo final : public BlockIo {
 public:
  PacedBlockIo(std::unique_ptr<BlockIo> inner, uint64_t read_bps,
               uint64_t write_bps, absl::Duration min_read_latency)
      : inner_(std::move(inner)),
        read_bps_(read_bps),
        write_bps_(write_bps),
        min_read_latency_(min_read_latency),
        read_pacer_(read_bps, kBurst),
        write_pacer_(write_bps, kBurst) {
    thread_ = Thread("blkio-pace", [this] { Loop(); });
  }
  ~PacedBlockIo() override {
    {
      MutexLock l(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    thread_.Join();  // issues what waits first and delivers what is late
    // Waits for in-flight I/O, whose completions (stopping_) are delivered
    // at once, while this object's members still exist.
    inner_.reset();
  }

  void Read(uint64_t offset, void* buf, size_t len, Callback done) override {
    if (min_read_latency_ > absl::ZeroDuration()) {
      const absl::Time due = absl::Now() + min_read_latency_;
      done = [this, due, done = std::move(done)](absl::Status st) mutable {
        Deliver(due, std::move(done), std::move(st));
      };
    }
    Pace(Op{false, offset, static_cast<uint8_t*>(buf), len, std::move(done)});
  }
  void Write(uint64_t offset, const void* buf, size_t len,
             Callback done) override {
    Pace(Op{true, offset,
            const_cast<uint8_t*>(static_cast<const uint8_t*>(buf)), len,
            std::move(done)});
  }
  absl::Status Sync() override { return inner_->Sync(); }
  uint64_t size() const override { return inner_->size(); }
  absl::string_view engine() const override { return inner_->engine(); }
  bool async_submit() const override { return inner_->async_submit(); }

 private:
  static constexpr absl::Duration kBurst = absl::Milliseconds(1);
  struct Op {
    bool write;
    uint64_t offset;
    uint8_t* buf;
    size_t len;
    Callback done;
  };

  struct Completion {
    Callback done;
    absl::Status status;
  };

  // A read's completion: now when its time has come (or the I/O is being
  // torn down), else queued for the pace thread.
  void Deliver(absl::Time due, Callback done, absl::Status st) {
    {
      MutexLock l(&mu_);
      if (!stopping_ && absl::Now() < due) {
        late_.emplace(due, Completion{std::move(done), std::move(st)});
        cv_.SignalAll();
        return;
      }
    }
    done(std::move(st));
  }

  void Pace(Op op) {
    {
      MutexLock l(&mu_);
      const uint64_t bps = op.write ? write_bps_ : read_bps_;
      if (bps > 0) {
        const absl::Time now = absl::Now();
        const absl::Time at =
            (op.write ? write_pacer_ : read_pacer_).Schedule(now, op.len);
        if (at > now) {
          waiting_.emplace(at, std::move(op));
          cv_.SignalAll();
          return;
        }
      }
    }
    Issue(std::move(op));
  }

  void Issue(Op op) {
    if (op.write) {
      inner_->Write(op.offset, op.buf, op.len, std::move(op.done));
    } else {
      inner_->Read(op.offset, op.buf, op.len, std::move(op.done));
    }
  }

  void Loop() {
    MutexLock l(&mu_);
    while (true) {
      if (waiting_.empty() && late_.empty()) {
        if (stopping_) return;
        cv_.Wait(&mu_);
        continue;
      }
      const absl::Time now = absl::Now();
      if (!late_.empty() && (stopping_ || late_.begin()->first <= now)) {
        Completion c = std::move(late_.begin()->second);
        late_.erase(late_.begin());
        mu_.Unlock();
        c.done(std::move(c.status));
        mu_.Lock();
        continue;
      }
      if (!waiting_.empty() &&
          (stopping_ || waiting_.begin()->first <= now)) {
        Op op = std::move(waiting_.begin()->second);
        waiting_.erase(waiting_.begin());
        mu_.Unlock();
        Issue(std::move(op));
        mu_.Lock();
        continue;
      }
      absl::Time next = absl::InfiniteFuture();
      if (!waiting_.empty()) next = std::min(next, waiting_.begin()->first);
      if (!late_.empty()) next = std::min(next, late_.begin()->first);
      cv_.WaitWithDeadline(&mu_, next);
    }
  }

  std::unique_ptr<BlockIo> inner_;  // reset first in the destructor
  const uint64_t read_bps_;
  const uint64_t write_bps_;
  const absl::Duration min_read_latency_;
  Mutex mu_;
  CondVar cv_;  // a new waiting transfer or early completion, or stopping
  BandwidthPacer read_pacer_ ABSL_GUARDED_BY(mu_);
  BandwidthPacer write_pacer_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, Op> waiting_ ABSL_GUARDED_BY(mu_);
  // Reads that completed before their minimum latency, by due time.
  std::multimap<absl::Time, Completion> late_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Thread thread_;  // last: starts after the members above exist
};

absl::Status CheckSize(int fd, const BlockIoOptions& options) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("block io: fstat ", options.path));
  }
  if (S_ISBLK(st.st_mode)) {
    uint64_t dev_bytes = 0;
    if (ioctl(fd, BLKGETSIZE64, &dev_bytes) != 0) {
      return ErrnoStatus(errno, absl::StrCat("block io: BLKGETSIZE64 ",
                                             options.path));
    }
    if (dev_bytes < options.size_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block io: device ", options.path, " has ", dev_bytes,
          " bytes, fewer than size_bytes ", options.size_bytes));
    }
    return absl::OkStatus();
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block io: ", options.path, " is neither a regular file nor a block "
        "device"));
  }
  if (static_cast<uint64_t>(st.st_size) < options.size_bytes) {
    // Grow (sparsely); never shrink, so a larger file keeps its tail.
    while (ftruncate(fd, static_cast<off_t>(options.size_bytes)) != 0) {
      if (errno != EINTR) {
        return ErrnoStatus(errno,
                           absl::StrCat("block io: ftruncate ", options.path));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BlockIoOptions::Validate() const {
  if (path.empty()) return absl::InvalidArgumentError("block io: empty path");
  if (size_bytes == 0 || size_bytes % BlockIo::kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block io: size_bytes ", size_bytes,
                     " must be a positive multiple of ", BlockIo::kAlignment));
  }
  if (size_bytes > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError("block io: size_bytes too large");
  }
  if (queue_depth <= 0 || queue_depth > kMaxQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block io: queue_depth ", queue_depth, " not in [1, ", kMaxQueueDepth,
        "]"));
  }
  if (min_read_latency < absl::ZeroDuration() ||
      min_read_latency > absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block io: min_read_latency ",
                     absl::FormatDuration(min_read_latency),
                     " not in [0, 1s]"));
  }
  if (engine != Engine::kIoUring && threads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block io: threads ", threads, " must be positive"));
  }
  switch (engine) {
    case Engine::kAuto:
    case Engine::kIoUring:
    case Engine::kThreadPool:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("block io: unknown engine");
}

absl::Time BandwidthPacer::Schedule(absl::Time now, uint64_t len) {
  if (bytes_per_s_ == 0) return now;
  free_at_ = std::max(free_at_, now - burst_);
  const absl::Time start = std::max(now, free_at_);
  free_at_ += absl::Seconds(static_cast<double>(len) /
                            static_cast<double>(bytes_per_s_));
  return start;
}

absl::StatusOr<std::unique_ptr<BlockIo>> BlockIo::Open(
    const BlockIoOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  if (options.max_read_bytes_per_s > 0 || options.max_write_bytes_per_s > 0 ||
      options.min_read_latency > absl::ZeroDuration()) {
    BlockIoOptions unpaced = options;
    unpaced.max_read_bytes_per_s = 0;
    unpaced.max_write_bytes_per_s = 0;
    unpaced.min_read_latency = absl::ZeroDuration();
    ASSIGN_OR_RETURN(std::unique_ptr<BlockIo> inner, Open(unpaced));
    return std::unique_ptr<BlockIo>(std::make_unique<PacedBlockIo>(
        std::move(inner), options.max_read_bytes_per_s,
        options.max_write_bytes_per_s, options.min_read_latency));
  }
  int flags = O_RDWR | O_CREAT | O_CLOEXEC;
  if (options.direct) flags |= O_DIRECT;
  int fd;
  do {
    fd = open(options.path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == EINVAL && options.direct) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block io: open ", options.path,
          " with O_DIRECT: the filesystem refuses it (tmpfs?); set "
          "direct = false to go through the page cache"));
    }
    return ErrnoStatus(errno, absl::StrCat("block io: open ", options.path));
  }
  if (!options.direct) {
    LOG(WARNING) << "block io: " << options.path
                 << " opened without O_DIRECT; I/O goes through the page cache";
  }
  absl::Status s = CheckSize(fd, options);
  if (!s.ok()) {
    close(fd);
    return s;
  }

  using Engine = BlockIoOptions::Engine;
  if (options.engine != Engine::kThreadPool) {
    auto uring = UringBlockIo::Create(fd, options.size_bytes, options.direct,
                                      options);
    if (uring.ok()) return std::unique_ptr<BlockIo>(std::move(*uring));
    if (options.engine == Engine::kIoUring) {
      close(fd);
      return absl::UnimplementedError(absl::StrCat(
          "block io: io_uring unavailable: ", uring.status().message()));
    }
    LOG(WARNING) << "block io: io_uring unavailable ("
                 << uring.status().message()
                 << "); falling back to the thread pool";
  }
  return std::unique_ptr<BlockIo>(std::make_unique<ThreadPoolBlockIo>(
      fd, options.size_bytes, options.direct, options));
}

namespace {

// Outcome of one Read/Write for the blocking wrappers.
struct SyncWaiter {
  Mutex mu;
  CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);

  BlockIo::Callback Callback() {
    return [this](absl::Status s) {
      MutexLock l(&mu);
      status = std::move(s);
      done = true;
      cv.Signal();
    };
  }
  absl::Status Wait() {
    MutexLock l(&mu);
    while (!done) cv.Wait(&mu);
    return status;
  }
};

}  // namespace

absl::Status BlockIo::ReadSync(uint64_t offset, void* buf, size_t len) {
  SyncWaiter w;
  Read(offset, buf, len, w.Callback());
  return w.Wait();
}

absl::Status BlockIo::WriteSync(uint64_t offset, const void* buf, size_t len) {
  SyncWaiter w;
  Write(offset, buf, len, w.Callback());
  return w.Wait();
}

void AlignedFree::operator()(void* p) const { free(p); }

AlignedBuffer AllocateAligned(size_t len) {
  size_t rounded = (len + BlockIo::kAlignment - 1) / BlockIo::kAlignment *
                   BlockIo::kAlignment;
  if (rounded == 0) rounded = BlockIo::kAlignment;
  void* p = nullptr;
  if (posix_memalign(&p, BlockIo::kAlignment, rounded) != 0) {
    return AlignedBuffer(nullptr);
  }
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

}  // namespace hymcache::storage
