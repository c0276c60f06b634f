// HybridDevice's I/O engine: the read and write queues, what is issued
// when (IoPolicy, FlushPolicy's write slots), and every I/O completion.
#include "storage_node/device/hybrid_device.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {

// ---------------------------------------------------------------- I/O engine

bool HybridDevice::ForegroundBusyLocked() const {
  return reads_in_flight_ > 0 || !read_q_.empty();
}

void HybridDevice::QueueChunksLocked(IoReq proto, uint64_t span,
                                     std::deque<IoReq>* q) {
  for (uint64_t off = 0; off < span; off += options_.io_chunk_bytes) {
    IoReq r = proto;
    r.file_off = proto.file_off + off;
    r.buf = proto.buf + off;
    r.len = static_cast<size_t>(std::min(options_.io_chunk_bytes, span - off));
    q->push_back(r);
  }
}

void HybridDevice::RefillIoStartLocked() {
  if (refill_ios_++ == 0) refill_busy_since_ = absl::Now();
}

void HybridDevice::RefillIoEndLocked() {
  if (--refill_ios_ == 0) refill_busy_ += absl::Now() - refill_busy_since_;
}

int HybridDevice::FlushDepthLocked() const {
  // Runs on every I/O completion: only what WriteSlots reads (the fill and
  // the read pressure), not FlushStateLocked's walk of the queue.
  FlushPolicyState st;
  st.buffer_bytes = buffer_bytes_;
  st.buffer_used = buffer_alloc_->used_bytes();
  st.reads_busy = ForegroundBusyLocked();
  return flush_policy_.WriteSlots(st);
}

void HybridDevice::NoteDepthLocked() {
  const absl::Time now = absl::Now();
  if (reads_in_flight_ > 0) {
    const double dt = absl::ToDoubleSeconds(now - depth_since_);
    read_depth_integral_ += dt * reads_in_flight_;
    read_busy_seconds_ += dt;
  }
  depth_since_ = now;
}

FlushPolicyState HybridDevice::FlushStateLocked(absl::Time now) const {
  FlushPolicyState st;
  st.buffer_bytes = buffer_bytes_;
  st.buffer_used = buffer_alloc_->used_bytes();
  st.reads_busy = ForegroundBusyLocked();
  st.forced = stopping_ || force_flush_ > 0;
  // Enough of the queue to know whether a batch's worth is unflushed, and
  // the age of the oldest commit not being written yet.
  bool have_oldest = false;
  for (const auto& [seq, e] : flush_queue_) {
    if (!e->in_flight && !have_oldest) {
      st.oldest_waiting_age = now - e->commit_time;
      have_oldest = true;
    }
    st.unflushed_bytes += e->buf_len;
    if (st.unflushed_bytes >= options_.flush_batch_bytes) break;
  }
  st.any_waiting = have_oldest || st.unflushed_bytes >= options_.flush_batch_bytes;
  return st;
}

void HybridDevice::TakeIssuableLocked(std::vector<IoReq>* out) {
  NoteDepthLocked();
  IoQueueState q;
  q.reads_queued = static_cast<int>(std::min<size_t>(read_q_.size(), 1 << 30));
  q.writes_queued =
      static_cast<int>(std::min<size_t>(write_q_.size(), 1 << 30));
  q.reads_in_flight = reads_in_flight_;
  q.writes_in_flight = writes_in_flight_;
  q.write_slots = FlushDepthLocked();
  const IoIssue n = io_policy_.Next(q);
  for (int i = 0; i < n.reads; ++i) {
    IoReq r = read_q_.front();
    read_q_.pop_front();
    if (r.kind == IoReq::Kind::kRefill) {
      Staged* s = static_cast<Staged*>(r.owner);
      --s->chunks_pending;
      ++s->chunks_in_flight;
      RefillIoStartLocked();
    }
    ++reads_in_flight_;
    out->push_back(r);
  }
  for (int i = 0; i < n.writes; ++i) {
    out->push_back(write_q_.front());
    write_q_.pop_front();
    ++writes_in_flight_;
  }
}

void HybridDevice::FreeBufferSpaceLocked(uint64_t off) {
  const absl::Status st = buffer_alloc_->Free(off);
  if (!st.ok()) {
    // A broken invariant (a slot freed twice): the space stays lost, the
    // device goes on.
    LOG(ERROR) << "hybrid device: freeing buffer space at " << off << ": "
               << st;
  }
}

void HybridDevice::Issue(std::vector<IoReq>* reqs) {
  for (const IoReq& r : *reqs) {
    auto done = [this, r](absl::Status s) { OnIoDone(r, std::move(s)); };
    if (r.write()) {
      io_->Write(r.file_off, r.buf, r.len, std::move(done));
    } else {
      io_->Read(r.file_off, r.buf, r.len, std::move(done));
    }
  }
  reqs->clear();
}

void HybridDevice::OnIoDone(const IoReq& req, absl::Status status) {
  callbacks_running_.fetch_add(1);
  std::vector<IoReq> next;
  uint8_t* free_buf = nullptr;
  {
    MutexLock l(&mu_);
    NoteDepthLocked();
    if (req.write()) {
      --writes_in_flight_;
    } else {
      --reads_in_flight_;
    }
    switch (req.kind) {
      case IoReq::Kind::kRefill: {
        Staged* s = static_cast<Staged*>(req.owner);
        --s->chunks_in_flight;
        RefillIoEndLocked();
        stats_.refill_bytes += req.len;
        if (!status.ok()) {
          ++stats_.read_io_errors;
          if (s->error.ok()) s->error = status;
          // Chunks not issued yet are pointless now.
          if (s->chunks_pending > 0) {
            read_q_.erase(std::remove_if(read_q_.begin(), read_q_.end(),
                                         [s](const IoReq& r) {
                                           return r.owner == s;
                                         }),
                          read_q_.end());
            s->chunks_pending = 0;
          }
        }
        if (s->chunks_in_flight == 0 && s->chunks_pending == 0 &&
            s->state == Staged::State::kLoading) {
          if (s->error.ok()) {
            // A consumer checks it (CheckStagedLocked), not this thread.
            s->state = s->check ? Staged::State::kLoaded : Staged::State::kReady;
          } else {
            s->state = Staged::State::kFailed;
            ++stats_.prefetch_errors;
            LOG(WARNING) << "hybrid device: staging [" << s->addr << ", +"
                         << s->len << ") failed: " << s->error;
            staging_.Unkey(s);
          }
          if (s->waiters > 0) s->cv.SignalAll();
        }
        MaybeFreeStagedLocked(s);
        break;
      }
      case IoReq::Kind::kMiss: {
        MissRead* m = static_cast<MissRead*>(req.owner);
        if (!status.ok() && m->status.ok()) {
          ++stats_.read_io_errors;
          m->status = status;
        }
        if (--m->outstanding == 0) {
          if (m->abandoned) {
            free_buf = m->buf;
            bounce_bytes_ -= m->span_len;
            delete m;
          } else {
            m->cv.SignalAll();
          }
        }
        break;
      }
      case IoReq::Kind::kFlush: {
        FlushBatch* b = static_cast<FlushBatch*>(req.owner);
        if (!status.ok() && b->status.ok()) b->status = status;
        if (--b->outstanding == 0) RetireBatchLocked(b);  // deletes b
        break;
      }
    }
    TakeIssuableLocked(&next);
    // The flusher (and destruction) care about a retired batch (signalled
    // there), reads going idle (a flush may be due now) and, when stopping,
    // every completion. Readers wait on their own object's CondVar.
    if (stopping_ || (!req.write() && !ForegroundBusyLocked() &&
                      !flush_queue_.empty())) {
      cv_.SignalAll();
    }
  }
  free(free_buf);
  Issue(&next);
  callbacks_running_.fetch_sub(1);  // the last touch of `this`
}

}  // namespace hymcache::storage
