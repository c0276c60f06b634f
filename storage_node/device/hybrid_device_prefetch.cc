// HybridDevice's staging window and prefetches: PrefetchObject,
// PrefetchWait, PrefetchRelease, and the window's space and FIFO.
#include "storage_node/device/hybrid_device.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {
using internal::RoundDown;
using internal::RoundUp;

// ---------------------------------------------------------------- window

void HybridDevice::MaybeFreeStagedLocked(Staged* s) {
  if (s->owners() == 0 && s->chunks_pending > 0) {
    read_q_.erase(std::remove_if(read_q_.begin(), read_q_.end(),
                                 [s](const IoReq& r) { return r.owner == s; }),
                  read_q_.end());
    s->chunks_pending = 0;
  }
  if (staging_.Release(s)) PumpWindowLocked();  // may have deleted s
}

void HybridDevice::PumpWindowLocked() {
  if (stopping_) return;
  // Strict FIFO: AdmitNext stops at a head that does not fit.
  while (Staged* s = staging_.AdmitNext()) {
    IoReq proto;
    proto.kind = IoReq::Kind::kRefill;
    proto.owner = s;
    proto.file_off = CapacityTier::kHeaderBytes + s->span_start;
    proto.buf = window_ + s->slot_off;
    const size_t before = read_q_.size();
    QueueChunksLocked(proto, s->span_len, &read_q_);
    s->chunks_pending = static_cast<int>(read_q_.size() - before);
  }
}

absl::StatusOr<PrefetchHandle> HybridDevice::PrefetchObject(uint32_t region,
                                                            uint64_t addr,
                                                            uint64_t len) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  const uint64_t span_start = RoundDown(addr);
  const uint64_t span_len = RoundUp(addr + len) - span_start;
  if (span_len > window_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hybrid device: object of ", len, " bytes is larger than the ",
        window_bytes_, "-byte staging window"));
  }
  PrefetchHandle h;
  h.region_id = region;
  h.addr = addr;
  h.length = len;
  std::vector<IoReq> next;
  {
    MutexLock l(&mu_);
    h.id = next_id_++;
    ++stats_.device.prefetches;
    HandleRec rec;
    rec.addr = addr;
    rec.len = len;
    if (Entry* e = FindBufferedLocked(addr, len)) {
      ++e->pins;
      rec.entry = e;
      ++stats_.prefetch_from_buffer;
    } else if (Staged* shared = staging_.Find(addr, len)) {
      ++shared->refs;
      rec.staged = shared;
      ++stats_.prefetch_shared;
    } else {
      const TierChecksum* sum = checksums_.Find(addr, len);
      if (sum != nullptr && sum->corrupt) {
        ++stats_.corrupt_refusals;
        return absl::DataLossError(absl::StrCat(
            "hybrid device: the object at ", addr, " (", len,
            " bytes) failed its checksum on the capacity tier"));
      }
      // Queued at the window's FIFO tail, findable by (addr, len).
      Staged* s = staging_.Add(addr, len, span_start, span_len);
      s->refs = 1;
      if (sum != nullptr) {
        s->check = true;
        s->crc = sum->crc;
      }
      rec.staged = s;
      PumpWindowLocked();
      TakeIssuableLocked(&next);
    }
    handles_[h.id] = rec;
  }
  Issue(&next);
  return h;
}

absl::StatusOr<const uint8_t*> HybridDevice::PrefetchWait(
    const PrefetchHandle& handle, absl::Time deadline) {
  MutexLock l(&mu_);
  while (true) {
    auto it = handles_.find(handle.id);
    if (it == handles_.end() || it->second.addr != handle.addr ||
        it->second.len != handle.length || handle.region_id != 0) {
      return absl::InvalidArgumentError("hybrid device: unknown prefetch handle");
    }
    const HandleRec& rec = it->second;
    if (rec.entry != nullptr) {
      return static_cast<const uint8_t*>(buffer_ + rec.entry->buf_off +
                                         (handle.addr - rec.entry->addr));
    }
    Staged* s = rec.staged;
    if (s->state == Staged::State::kLoaded) {
      // The handle keeps `s` alive while it is checked; looked up again
      // afterwards, as the handle may be released meanwhile.
      CheckStagedLocked(s);
      continue;
    }
    if (s->state == Staged::State::kReady) {
      return static_cast<const uint8_t*>(window_ + s->slot_off +
                                         (s->addr - s->span_start));
    }
    if (s->state == Staged::State::kFailed) {
      if (s->corrupt) return s->error;
      return absl::UnavailableError(absl::StrCat(
          "hybrid device: staging failed: ", s->error.message()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          s->state == Staged::State::kQueued
              ? "hybrid device: prefetch still waiting for window space"
          : s->state == Staged::State::kChecking
              ? "hybrid device: prefetch still checking its checksum"
              : "hybrid device: prefetch still reading");
    }
    // `waiters` keeps `s` alive while this thread waits on its CondVar,
    // even if the handle is released meanwhile (looked up again below).
    ++s->waiters;
    ++stats_.prefetch_waiters;
    s->cv.WaitWithDeadline(&mu_, deadline);
    --stats_.prefetch_waiters;
    --s->waiters;
    MaybeFreeStagedLocked(s);
  }
}

void HybridDevice::PrefetchRelease(const PrefetchHandle& handle) {
  std::vector<IoReq> next;
  {
    MutexLock l(&mu_);
    auto it = handles_.find(handle.id);
    if (it == handles_.end() || it->second.addr != handle.addr ||
        it->second.len != handle.length) {
      ++stats_.unknown_releases;
      VLOG(1) << "hybrid device: release of unknown prefetch " << handle.id;
      return;
    }
    HandleRec rec = it->second;
    handles_.erase(it);
    if (rec.entry != nullptr) {
      --rec.entry->pins;
      MaybeFreeEntryLocked(rec.entry);
    } else {
      Staged* s = rec.staged;
      --s->refs;
      if (s->owners() == 0 && (s->state == Staged::State::kQueued ||
                               s->state == Staged::State::kLoading)) {
        ++stats_.prefetch_cancelled;
      }
      MaybeFreeStagedLocked(s);
    }
    TakeIssuableLocked(&next);
    // A cancelled refill may leave the reads idle: a flush may be due.
    if (!ForegroundBusyLocked() && !flush_queue_.empty()) cv_.SignalAll();
  }
  Issue(&next);
}

}  // namespace hymcache::storage
