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
using hybrid_internal::RoundDown;
using hybrid_internal::RoundUp;

// ---------------------------------------------------------------- window

void HybridDevice::UnkeyStagedLocked(Staged* s) {
  if (!s->keyed) return;
  auto it = staged_by_key_.find({s->addr, s->len});
  if (it != staged_by_key_.end() && it->second == s) staged_by_key_.erase(it);
  s->keyed = false;
}

void HybridDevice::MaybeFreeStagedLocked(Staged* s) {
  if (s->owners() == 0 && s->chunks_pending > 0) {
    read_q_.erase(std::remove_if(read_q_.begin(), read_q_.end(),
                                 [s](const IoReq& r) { return r.owner == s; }),
                  read_q_.end());
    s->chunks_pending = 0;
  }
  // The slot is never handed on while a read still writes into it.
  if (s->chunks_in_flight > 0) return;
  bool freed_space = false;
  if (s->has_slot && (s->owners() == 0 || s->state == Staged::State::kFailed)) {
    FreeSpaceLocked(window_alloc_.get(), s->slot_off);
    s->has_slot = false;
    freed_space = true;
  }
  if (s->owners() == 0) {
    UnkeyStagedLocked(s);
    if (s->state == Staged::State::kQueued) {
      auto it = std::find(window_fifo_.begin(), window_fifo_.end(), s);
      if (it != window_fifo_.end()) {
        // The head may be what blocked the rest.
        freed_space = freed_space || it == window_fifo_.begin();
        window_fifo_.erase(it);
      }
    }
    staged_.erase(s);  // deletes s
  }
  if (freed_space) PumpWindowLocked();
}

void HybridDevice::PumpWindowLocked() {
  if (stopping_) return;
  while (!window_fifo_.empty()) {
    Staged* s = window_fifo_.front();
    std::optional<uint64_t> off = window_alloc_->TryAllocate(s->span_len);
    if (!off) break;  // strict FIFO: later ones wait behind the head
    window_fifo_.pop_front();
    s->has_slot = true;
    s->slot_off = *off;
    s->state = Staged::State::kLoading;
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

void HybridDevice::InvalidateStagedLocked(uint64_t addr, uint64_t len) {
  if (staged_by_key_.empty()) return;
  const uint64_t from = addr > max_staged_span_ ? addr - max_staged_span_ : 0;
  const uint64_t end = addr + len;
  for (auto it = staged_by_key_.lower_bound({from, 0});
       it != staged_by_key_.end() && it->first.first < end;) {
    Staged* s = it->second;
    ++it;
    if (s->span_start < end && addr < s->span_start + s->span_len) {
      // Handles and reads holding it keep their (old) bytes.
      UnkeyStagedLocked(s);
    }
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
    } else if (auto it = staged_by_key_.find({addr, len});
               it != staged_by_key_.end()) {
      ++it->second->refs;
      rec.staged = it->second;
      ++stats_.prefetch_shared;
    } else {
      const TierSum* sum = FindSumLocked(addr, len);
      if (sum != nullptr && sum->corrupt) {
        ++stats_.corrupt_refusals;
        return absl::DataLossError(absl::StrCat(
            "hybrid device: the object at ", addr, " (", len,
            " bytes) failed its checksum on the capacity tier"));
      }
      auto owned = std::make_unique<Staged>();
      Staged* s = owned.get();
      s->addr = addr;
      s->len = len;
      s->span_start = span_start;
      s->span_len = span_len;
      s->refs = 1;
      s->keyed = true;
      if (sum != nullptr) {
        s->check = true;
        s->crc = sum->crc;
      }
      staged_[s] = std::move(owned);
      staged_by_key_[{addr, len}] = s;
      max_staged_span_ = std::max(max_staged_span_, span_len);
      window_fifo_.push_back(s);
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
