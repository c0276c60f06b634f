// HybridDevice's flusher (the "hyb-flusher" thread): when a batch starts,
// Forgets, Records, retries, retiring written batches, and the test hooks
// that wait for it.
#include "storage_node/device/hybrid_device.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {

// ---------------------------------------------------------------- flusher

bool HybridDevice::FlushDueLocked(absl::Time now, absl::Time* wake) const {
  *wake = absl::InfiniteFuture();
  if (flush_queue_.empty()) return false;
  if (now < retry_after_) {
    *wake = retry_after_;
    return false;
  }
  absl::Duration recheck;
  if (flush_policy_.Due(FlushStateLocked(now), &recheck)) return true;
  if (recheck != absl::InfiniteDuration()) *wake = now + recheck;
  return false;
}

std::vector<HybridDevice::Entry*> HybridDevice::PickBatchLocked() const {
  // The rules are FlushBatchChooser's (flush_batch.h).
  std::vector<FlushExtent> writing;
  for (const auto& fb : pipeline_) {
    for (const Entry* o : fb->entries) {
      writing.push_back(FlushExtent{o->addr, o->buf_len});
    }
  }
  FlushBatchChooser chooser(options_.flush_batch_bytes, std::move(writing));
  std::vector<Entry*> batch;
  for (const auto& [seq, e] : flush_queue_) {
    const FlushBatchChooser::Verdict v = chooser.Offer(
        FlushCandidate{e->addr, e->buf_len, e->in_flight, e->forgotten});
    if (v == FlushBatchChooser::Verdict::kStop) break;
    if (v == FlushBatchChooser::Verdict::kTake) batch.push_back(e);
  }
  return batch;
}

bool HybridDevice::ForgetNeededLocked() const {
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->forgotten) return true;
  }
  return false;
}

absl::Status HybridDevice::ForgetQueuedLocked(bool all) {
  // Queued objects not forgotten yet, merged into contiguous address ranges:
  // a backlog (e.g. a burst of rewrites) then costs one synced tier write
  // per range instead of one per object. While reads are idle a sync costs
  // ~1 ms and every range is forgotten at once; under read load each one
  // waits behind the queued reads (tens of ms), so only the range holding
  // the oldest such object is forgotten, and its objects can be written
  // before the next range's sync. An object forgotten ahead of its flush is
  // merely absent after a crash, which is what an unflushed object is
  // anyway.
  std::vector<Entry*> todo;
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->forgotten) todo.push_back(e);
  }
  if (todo.empty()) return absl::OkStatus();
  const uint64_t oldest_addr = todo.front()->addr;  // flush_queue_ order
  std::sort(todo.begin(), todo.end(),
            [](const Entry* a, const Entry* b) { return a->addr < b->addr; });
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end)
  for (const Entry* e : todo) {
    if (!ranges.empty() && e->addr <= ranges.back().second) {
      ranges.back().second = std::max(ranges.back().second, e->addr + e->buf_len);
    } else {
      ranges.emplace_back(e->addr, e->addr + e->buf_len);
    }
  }
  if (!all) {
    for (const auto& r : ranges) {
      if (r.first <= oldest_addr && oldest_addr < r.second) {
        ranges = {r};
        break;
      }
    }
  }
  absl::Status status;
  mu_.Unlock();
  for (const auto& [begin, end] : ranges) {
    status = tier_->Forget(begin, end - begin);
    if (!status.ok()) break;
  }
  mu_.Lock();
  last_was_forget_ = true;
  if (!status.ok()) return status;
  // `todo` may have been superseded (and freed) meanwhile; objects queued
  // meanwhile inside a forgotten range are covered too (only this thread
  // records extents, and it recorded none since).
  for (auto& [seq, e] : flush_queue_) {
    for (const auto& [begin, end] : ranges) {
      if (begin <= e->addr && e->addr + e->buf_len <= end) {
        e->forgotten = true;
        break;
      }
    }
  }
  return absl::OkStatus();
}

void HybridDevice::FlusherLoop() {
  MutexLock l(&mu_);
  while (true) {
    // A SettleFlusherForTest request made before this pass's clock read.
    const uint64_t settle_seen = settle_requested_;
    const absl::Time now = clock_->Now();
    const bool past_deadline = stopping_ && absl::Now() >= stop_deadline_;
    if (stopping_ && pipeline_.empty() &&
        ((flush_queue_.empty() && record_pending_.empty() &&
          !checksums_.forget_queued()) ||
         past_deadline)) {
      break;
    }
    const bool busy = ForegroundBusyLocked();
    const bool retrying = now < retry_after_;
    absl::Time wake = absl::InfiniteFuture();
    const bool due = !past_deadline && FlushDueLocked(now, &wake);
    // 1. Start a batch of forgotten objects (no tier call).
    if (due && static_cast<int>(pipeline_.size()) < kMaxFlushBatchesInFlight) {
      std::vector<Entry*> batch = PickBatchLocked();
      if (!batch.empty()) {
        StartBatchLocked(std::move(batch));
        continue;
      }
    }
    // 2. A synced tier call: a Forget that lets objects be written (or, while
    // reads are idle and syncs are cheap, one ahead of time), or one Record
    // of every object written since the last one; when both are due they
    // alternate. While the buffer is under pressure (at the high watermark:
    // freeing space is what lets new writes in) Records wait until the
    // oldest pending one is record_max_delay old, so that a Record (tens of
    // ms under read load) does not hold up the next Forget.
    const bool forget_wanted =
        (due || (!busy && !retrying && !past_deadline)) && ForgetNeededLocked();
    bool record_due = !record_pending_.empty() && !retrying;
    if (record_due && PressureLocked() && !stopping_ && force_flush_ == 0) {
      absl::Time oldest = absl::InfiniteFuture();
      for (const auto& [addr, r] : record_pending_) {
        oldest = std::min(oldest, r.since);
      }
      if (now - oldest < options_.record_max_delay) {
        record_due = false;
        wake = std::min(wake, oldest + options_.record_max_delay);
      }
    }
    // Corrupt objects' records go first: they are few, and until forgotten
    // a restart without verify_on_open would adopt them again.
    if (checksums_.forget_queued() && !retrying && !past_deadline) {
      ForgetCorruptLocked();
      continue;
    }
    const bool record_first = record_due && last_was_forget_;
    if (forget_wanted && !record_first) {
      absl::Status forget = ForgetQueuedLocked(/*all=*/!busy);
      if (!forget.ok()) {
        ++stats_.flush_errors;
        last_flush_error_ = forget;
        LOG(WARNING) << "hybrid device: forgetting the extents of queued "
                        "objects failed (will retry in "
                     << absl::FormatDuration(backoff_) << "): " << forget;
        BackOffLocked();
      }
      continue;
    }
    if (record_due) {
      RecordPendingLocked();
      continue;
    }
    // 3. Nothing to do until a write completes, a commit arrives, reads go
    // idle, a retry or the shutdown deadline is due.
    if ((!record_pending_.empty() || checksums_.forget_queued()) && retrying) {
      wake = std::min(wake, retry_after_);
    }
    // `wake` is on clock_; the shutdown deadline and the wait are real time.
    absl::Time real_wake = absl::InfiniteFuture();
    if (wake != absl::InfiniteFuture()) {
      real_wake = absl::Now() + (wake - clock_->Now());
    }
    if (stopping_) real_wake = std::min(real_wake, stop_deadline_);
    if (settled_ != settle_seen) {
      settled_ = settle_seen;
      cv_.SignalAll();
    }
    cv_.WaitWithDeadline(&mu_, real_wake);
  }
}

bool HybridDevice::PressureLocked() const {
  return static_cast<double>(buffer_alloc_->used_bytes()) >=
         options_.flush_high_watermark * static_cast<double>(buffer_bytes_);
}

void HybridDevice::BackOffLocked() {
  retry_after_ = clock_->Now() + backoff_;
  backoff_ = std::min(backoff_ * 2, options_.flush_retry_max);
}

void HybridDevice::ResetBackoffLocked() {
  backoff_ = options_.flush_retry_initial;
  retry_after_ = absl::InfinitePast();
}

void HybridDevice::StartBatchLocked(std::vector<Entry*> batch) {
  for (Entry* e : batch) e->in_flight = true;
  auto owned = std::make_unique<FlushBatch>();
  FlushBatch* fb = owned.get();
  fb->entries = std::move(batch);
  pipeline_.push_back(std::move(owned));
  IssueBatchLocked(fb);  // fb may be retired (deleted) once this returns
}

void HybridDevice::ForgetCorruptLocked() {
  const std::vector<TierRange> ranges = checksums_.StartForget();
  mu_.Unlock();
  const absl::Status status = tier_->ForgetRanges(ranges);
  mu_.Lock();
  last_was_forget_ = true;
  // On failure the forgets are queued again, except those a write over
  // their range cancelled meanwhile.
  const TierChecksums::ForgetCounts forgot =
      checksums_.FinishForget(status.ok());
  if (status.ok()) {
    stats_.discarded_records_forgotten += forgot.discarded;
    stats_.corrupt_records_forgotten += forgot.corrupt;
  } else {
    LOG(WARNING) << "hybrid device: forgetting the records of "
                 << ranges.size() << " corrupt objects failed (will retry in "
                 << absl::FormatDuration(backoff_) << "): " << status;
    BackOffLocked();
  }
  cv_.SignalAll();
}

void HybridDevice::RecordPendingLocked() {
  recording_.clear();
  for (const auto& [addr, r] : record_pending_) recording_.push_back(r);
  record_pending_.clear();
  std::sort(recording_.begin(), recording_.end(),
            [](const PendingRecord& a, const PendingRecord& b) {
              return a.seq < b.seq;
            });
  std::vector<DurableExtent> extents;
  extents.reserve(recording_.size());
  for (const PendingRecord& r : recording_) extents.push_back(r.extent);
  mu_.Unlock();
  const absl::Status status = tier_->Record(extents);
  mu_.Lock();
  last_was_forget_ = false;
  if (status.ok()) {
    ++stats_.record_batches;
    stats_.recorded_objects += recording_.size();
    ResetBackoffLocked();
  } else {
    ++stats_.record_errors;
    LOG(WARNING) << "hybrid device: recording " << recording_.size()
                 << " flushed objects failed (they stay readable; will retry "
                 << "in " << absl::FormatDuration(backoff_) << "): " << status;
    for (const PendingRecord& r : recording_) {
      if (!r.dropped) AddPendingRecordLocked(r);
    }
    BackOffLocked();
  }
  recording_.clear();
  cv_.SignalAll();
}

void HybridDevice::IssueBatchLocked(FlushBatch* fb) {
  fb->issued = absl::Now();
  // Entry addr/len/buf fields are constant after BeginWrite. Objects
  // contiguous both in the tier and in the buffer are written as one run
  // (FlushRuns, flush_batch.h).
  std::vector<FlushRun> objects;
  objects.reserve(fb->entries.size());
  for (const Entry* e : fb->entries) {
    objects.push_back(FlushRun{e->addr, e->buf_off, e->buf_len});
  }
  for (const FlushRun& r : FlushRuns(objects)) {
    IoReq proto;
    proto.kind = IoReq::Kind::kFlush;
    proto.owner = fb;
    proto.file_off = CapacityTier::kHeaderBytes + r.addr;
    proto.buf = buffer_ + r.buf_off;
    const size_t before = write_q_.size();
    QueueChunksLocked(proto, r.len, &write_q_);
    fb->outstanding += static_cast<int>(write_q_.size() - before);
  }
  stats_.flush_ios += static_cast<uint64_t>(fb->outstanding);
  std::vector<IoReq> next;
  TakeIssuableLocked(&next);
  mu_.Unlock();
  Issue(&next);
  mu_.Lock();
}

void HybridDevice::RetireBatchLocked(FlushBatch* fb) {
  for (Entry* e : fb->entries) e->in_flight = false;
  if (fb->status.ok()) {
    flush_latency_.Observe(absl::Now() - fb->issued);
    // The bytes are on the tier: readers go there from now on, and the
    // buffer space is freed as soon as no reader or prefetch handle holds
    // the buffered copy. Only the record remains (RecordPendingLocked).
    ++stats_.flush_batches;
    for (Entry* e : fb->entries) {
      e->queued = false;
      flush_queue_.erase(e->seq);
      if (!e->superseded) {
        stats_.flushed_bytes += e->len;
        ++stats_.flushed_objects;
        if (options_.verify_reads && e->has_crc) {
          checksums_.Set(e->addr, e->len, e->buf_len, e->crc);
        }
        PendingRecord r;
        r.extent = DurableExtent{e->addr, e->len, e->tag, e->has_crc, e->crc};
        r.seq = e->seq;
        r.since = clock_->Now();
        AddPendingRecordLocked(r);
      }
      if (e->live) {
        live_.erase(e->addr);
        e->live = false;
      }
      MaybeFreeEntryLocked(e);
    }
    ResetBackoffLocked();
    last_flush_error_ = absl::OkStatus();
  } else {
    ++stats_.flush_errors;
    last_flush_error_ = fb->status;
    LOG(WARNING) << "hybrid device: writing " << fb->entries.size()
                 << " objects to the tier failed (kept in the write buffer, "
                 << "will retry in " << absl::FormatDuration(backoff_)
                 << "): " << fb->status;
    for (Entry* e : fb->entries) {
      if (e->superseded) {
        e->queued = false;
        flush_queue_.erase(e->seq);
        MaybeFreeEntryLocked(e);
      }
    }
    BackOffLocked();
  }
  auto it = std::find_if(pipeline_.begin(), pipeline_.end(),
                         [fb](const auto& p) { return p.get() == fb; });
  if (it != pipeline_.end()) pipeline_.erase(it);  // deletes fb
  cv_.SignalAll();
}

bool HybridDevice::WaitFlushedForTest(absl::Time deadline, bool force) {
  MutexLock l(&mu_);
  if (force) ++force_flush_;
  cv_.SignalAll();
  auto durable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return flush_queue_.empty() && record_pending_.empty() &&
           recording_.empty();
  };
  while (!durable()) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (force) --force_flush_;
  return durable();
}

bool HybridDevice::SettleFlusherForTest(absl::Time deadline) {
  MutexLock l(&mu_);
  const uint64_t want = ++settle_requested_;
  cv_.SignalAll();
  while (settled_ < want) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) return settled_ >= want;
  }
  return true;
}

}  // namespace hymcache::storage
