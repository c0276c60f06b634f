// Testonly fakes of the capacity-tier seam:
//
//   * FakeBlockIo: a BlockIo over an in-memory "disk". Requests are checked
//     as the real engines check them (alignment, bounds) and completed in
//     submission order on the fake's own named thread ("fake-blockio"). The
//     bytes move when the request completes (not when it is submitted), so a
//     test that pauses completions sees exactly what a slow disk would.
//     Knobs: per-I/O latency, fail the next N I/Os, pause/resume completions.
//   * FakeCapacityTier: a CapacityTier over a BlockIo (not owned; usually a
//     FakeBlockIo, possibly wrapped in a FaultyBlockIo) with its durable
//     extents in a map. Construct a new one over the same
//     FakeBlockIo with the old one's ExtentsNowForTest() to model a restart.
//     Knobs: fail the next N Forget/Record calls, make Record calls fail, or
//     block them (pause/resume, let N through).
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "storage_node/device/block_io.h"
#include "storage_node/device/capacity_tier.h"

namespace hymcache::storage {

class FakeBlockIo final : public BlockIo {
 public:
  // One submitted request, as logged.
  struct Op {
    bool write = false;
    uint64_t offset = 0;
    size_t len = 0;
  };

  // `size_bytes` of zeroed disk.
  explicit FakeBlockIo(uint64_t size_bytes)
      : disk_(size_bytes, 0),
        thread_("fake-blockio", [this] { CompletionLoop(); }) {}
  ~FakeBlockIo() override {
    {
      MutexLock l(&mu_);
      stopping_ = true;
      paused_ = false;
      cv_.SignalAll();
    }
    thread_.Join();  // completes everything queued first
  }

  void Read(uint64_t offset, void* buf, size_t len, Callback done) override {
    Submit(false, offset, buf, len, std::move(done));
  }
  void Write(uint64_t offset, const void* buf, size_t len,
             Callback done) override {
    Submit(true, offset, const_cast<void*>(buf), len, std::move(done));
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  uint64_t size() const override { return disk_.size(); }
  absl::string_view engine() const override { return "fake"; }

  // ---- knobs
  // Each completion waits this long first.
  void SetLatencyForTest(absl::Duration d) {
    MutexLock l(&mu_);
    latency_ = d;
  }
  // The next `n` I/Os to complete fail with `status` (their bytes untouched).
  void FailNextForTest(int n, absl::Status status = absl::UnavailableError(
                                  "injected I/O error")) {
    MutexLock l(&mu_);
    fail_next_ = n;
    fail_status_ = std::move(status);
  }
  // While paused, submitted requests wait (uncompleted, bytes not moved).
  void PauseForTest() {
    MutexLock l(&mu_);
    paused_ = true;
  }
  void ResumeForTest() {
    MutexLock l(&mu_);
    paused_ = false;
    cv_.SignalAll();
  }

  // ---- observation
  // Requests submitted and not yet completed.
  int PendingForTest() const {
    MutexLock l(&mu_);
    return static_cast<int>(queue_.size()) + (completing_ ? 1 : 0);
  }
  // Waits until at least `n` requests are pending; false on timeout.
  bool WaitPendingForTest(int n, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock l(&mu_);
    while (static_cast<int>(queue_.size()) + (completing_ ? 1 : 0) < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return false;
    }
    return true;
  }
  // Every request submitted so far, in submission order.
  std::vector<Op> LogForTest() const {
    MutexLock l(&mu_);
    return log_;
  }
  uint64_t ReadsForTest() const { return Count(false); }
  uint64_t WritesForTest() const { return Count(true); }
  // Copies of / writes into the disk, bypassing the queue.
  std::vector<uint8_t> CopyForTest(uint64_t offset, size_t len) const {
    MutexLock l(&mu_);
    return std::vector<uint8_t>(disk_.begin() + offset,
                                disk_.begin() + offset + len);
  }
  void FillForTest(uint64_t offset, const void* data, size_t len) {
    MutexLock l(&mu_);
    std::memcpy(disk_.data() + offset, data, len);
  }

 private:
  struct Req {
    bool write;
    uint64_t offset;
    uint8_t* buf;
    size_t len;
    Callback done;
  };

  void Submit(bool write, uint64_t offset, void* buf, size_t len,
              Callback done) {
    MutexLock l(&mu_);
    log_.push_back(Op{write, offset, len});
    queue_.push_back(
        Req{write, offset, static_cast<uint8_t*>(buf), len, std::move(done)});
    cv_.SignalAll();
  }

  uint64_t Count(bool write) const {
    MutexLock l(&mu_);
    uint64_t n = 0;
    for (const Op& op : log_) n += op.write == write ? 1 : 0;
    return n;
  }

  absl::Status Validate(const Req& r) const {
    const uint64_t a = kAlignment;
    if (r.offset % a != 0 || r.len % a != 0 ||
        reinterpret_cast<uintptr_t>(r.buf) % a != 0 || r.len == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fake block io: unaligned request at ", r.offset,
                       " of ", r.len, " bytes"));
    }
    if (r.offset > disk_.size() || r.len > disk_.size() - r.offset) {
      return absl::OutOfRangeError(absl::StrCat(
          "fake block io: request at ", r.offset, " of ", r.len,
          " bytes beyond ", disk_.size()));
    }
    return absl::OkStatus();
  }

  void CompletionLoop() {
    while (true) {
      Req r;
      absl::Duration latency;
      {
        MutexLock l(&mu_);
        while (!stopping_ && (queue_.empty() || paused_)) cv_.Wait(&mu_);
        if (queue_.empty()) return;  // stopping with nothing left
        r = std::move(queue_.front());
        queue_.pop_front();
        completing_ = true;
        latency = latency_;
      }
      if (latency > absl::ZeroDuration()) absl::SleepFor(latency);
      absl::Status s;
      {
        MutexLock l(&mu_);
        s = Validate(r);
        if (s.ok() && fail_next_ > 0) {
          --fail_next_;
          s = fail_status_;
        }
        if (s.ok()) {
          if (r.write) {
            std::memcpy(disk_.data() + r.offset, r.buf, r.len);
          } else {
            std::memcpy(r.buf, disk_.data() + r.offset, r.len);
          }
        }
      }
      r.done(s);
      {
        MutexLock l(&mu_);
        completing_ = false;
        cv_.SignalAll();
      }
    }
  }

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<uint8_t> disk_ ABSL_GUARDED_BY(mu_);
  std::deque<Req> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Op> log_ ABSL_GUARDED_BY(mu_);
  absl::Duration latency_ ABSL_GUARDED_BY(mu_);
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_status_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool completing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Thread thread_;  // last: starts after the members above exist
};

// A CapacityTier whose data area is the BlockIo's bytes from kHeaderBytes on
// and whose durable extents live in a map.
class FakeCapacityTier final : public CapacityTier {
 public:
  // `io` (not owned) must hold kHeaderBytes + capacity_bytes. `extents`: the
  // durable extents as of "Open" (adopted() is true when non-empty or
  // `adopted`).
  FakeCapacityTier(BlockIo* io, uint64_t capacity_bytes,
                   std::vector<DurableExtent> extents = {},
                   bool adopted = false, uint64_t incarnation = 1)
      : io_(io),
        capacity_(capacity_bytes),
        incarnation_(incarnation),
        adopted_(adopted || !extents.empty()),
        at_open_(extents) {
    for (const DurableExtent& e : extents) now_[e.addr] = e;
  }

  ~FakeCapacityTier() override {
    MutexLock l(&mu_);
    if (save_on_close_ != nullptr) {
      save_on_close_->clear();
      for (const auto& [addr, e] : now_) save_on_close_->push_back(e);
    }
  }

  uint64_t incarnation() const override { return incarnation_; }
  bool adopted() const override { return adopted_; }
  uint64_t capacity_bytes() const override { return capacity_; }
  BlockIo* io() override { return io_; }
  std::vector<DurableExtent> Extents() const override { return at_open_; }

  absl::Status Forget(uint64_t addr, uint64_t length) override {
    MutexLock l(&mu_);
    forget_calls_.emplace_back(addr, length);
    if (fail_next_ > 0) {
      --fail_next_;
      return absl::UnavailableError("injected metadata error");
    }
    EraseOverlapping(addr, length);
    return absl::OkStatus();
  }
  absl::Status ForgetRanges(absl::Span<const TierRange> ranges) override {
    MutexLock l(&mu_);
    for (const TierRange& r : ranges) forget_calls_.emplace_back(r.addr, r.length);
    if (fail_next_ > 0) {
      --fail_next_;
      return absl::UnavailableError("injected metadata error");
    }
    for (const TierRange& r : ranges) {
      if (r.exact) {
        auto it = now_.find(r.addr);
        if (it == now_.end() || it->second.length != r.length ||
            it->second.tag != r.tag) {
          continue;
        }
      }
      EraseOverlapping(r.addr, r.length);
    }
    return absl::OkStatus();
  }
  absl::Status Record(absl::Span<const DurableExtent> extents) override {
    MutexLock l(&mu_);
    ++record_calls_;
    if (records_paused_) {
      ++records_blocked_;
      cv_.SignalAll();
      while (records_paused_ && record_permits_ == 0) cv_.Wait(&mu_);
      if (records_paused_) --record_permits_;
      --records_blocked_;
      cv_.SignalAll();
    }
    if (records_fail_) {
      return absl::UnavailableError("injected metadata error (records)");
    }
    if (fail_next_ > 0) {
      --fail_next_;
      return absl::UnavailableError("injected metadata error");
    }
    for (const DurableExtent& e : extents) {
      EraseOverlapping(e.addr, e.length);
      now_[e.addr] = e;
      recorded_.push_back(e);
    }
    return absl::OkStatus();
  }

  // ---- test hooks
  // The next `n` Forget/Record calls fail.
  void FailNextForTest(int n) {
    MutexLock l(&mu_);
    fail_next_ = n;
  }
  // While paused, Record calls block (before changing anything) until
  // resumed or let through by AllowRecordsForTest; Forget is unaffected.
  void PauseRecordsForTest() {
    MutexLock l(&mu_);
    records_paused_ = true;
    record_permits_ = 0;
  }
  void ResumeRecordsForTest() {
    MutexLock l(&mu_);
    records_paused_ = false;
    cv_.SignalAll();
  }
  // While paused: lets `n` more Record calls (blocked or future) through.
  void AllowRecordsForTest(int n) {
    MutexLock l(&mu_);
    record_permits_ += n;
    cv_.SignalAll();
  }
  // Waits until exactly `n` Record calls are blocked; false on timeout.
  bool WaitRecordsBlockedForTest(int n, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock l(&mu_);
    while (records_blocked_ != n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return false;
    }
    return true;
  }
  // While set, every Record fails (Unavailable) without changing anything;
  // Forget is unaffected.
  void SetRecordsFailForTest(bool fail) {
    MutexLock l(&mu_);
    records_fail_ = fail;
  }
  // Record calls so far (including failed and blocked ones).
  int RecordCallsForTest() const {
    MutexLock l(&mu_);
    return record_calls_;
  }
  // The durable extents now (what a reopened tier would report).
  std::vector<DurableExtent> ExtentsNowForTest() const {
    MutexLock l(&mu_);
    std::vector<DurableExtent> out;
    for (const auto& [addr, e] : now_) out.push_back(e);
    return out;
  }
  // When this tier is destroyed (e.g. with the device that owns it), its
  // durable extents are copied to `*out` (which must outlive the tier).
  void SaveExtentsOnCloseForTest(std::vector<DurableExtent>* out) {
    MutexLock l(&mu_);
    save_on_close_ = out;
  }
  // Every extent passed to Record, in order.
  std::vector<DurableExtent> RecordedForTest() const {
    MutexLock l(&mu_);
    return recorded_;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ForgetCallsForTest() const {
    MutexLock l(&mu_);
    return forget_calls_;
  }

 private:
  void EraseOverlapping(uint64_t addr, uint64_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = now_.begin(); it != now_.end();) {
      const DurableExtent& e = it->second;
      if (e.addr < addr + length && addr < e.addr + e.length) {
        it = now_.erase(it);
      } else {
        ++it;
      }
    }
  }

  BlockIo* const io_;
  const uint64_t capacity_;
  const uint64_t incarnation_;
  const bool adopted_;
  const std::vector<DurableExtent> at_open_;

  mutable Mutex mu_;
  CondVar cv_;
  std::map<uint64_t, DurableExtent> now_ ABSL_GUARDED_BY(mu_);
  std::vector<DurableExtent> recorded_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> forget_calls_ ABSL_GUARDED_BY(mu_);
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<DurableExtent>* save_on_close_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool records_paused_ ABSL_GUARDED_BY(mu_) = false;
  int record_permits_ ABSL_GUARDED_BY(mu_) = 0;
  int records_blocked_ ABSL_GUARDED_BY(mu_) = 0;
  bool records_fail_ ABSL_GUARDED_BY(mu_) = false;
  int record_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache::storage
