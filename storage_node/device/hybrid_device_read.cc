// HybridDevice's read path: AcquireRead (write buffer, staging window, or
// a bounce buffer on a staging miss), ReleaseRead, and the tier checksums
// that reads check (verify_reads).
#include "storage_node/device/hybrid_device.h"

#include <cstdlib>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {
using internal::kPage;
using internal::RoundDown;
using internal::RoundUp;

// ---------------------------------------------------------------- checksums

void HybridDevice::MarkCorruptLocked(uint64_t addr, uint64_t len, uint32_t crc) {
  // Not if a write replaced it since the read began: that object is not
  // this one.
  if (!checksums_.MarkCorrupt(addr, len, crc)) return;
  // Never recorded from now on; one in the running Record is forgotten
  // after that Record returns (the flusher makes every tier call).
  DropPendingRecordsLocked(addr, len);
  cv_.SignalAll();  // the flusher
}

void HybridDevice::CheckStagedLocked(Staged* s) {
  s->state = Staged::State::kChecking;
  ++s->waiters;  // keeps `s` and its window slot while mu_ is released
  const uint8_t* data = window_ + s->slot_off + (s->addr - s->span_start);
  const uint64_t len = s->len;
  mu_.Unlock();
  const uint32_t got = crc32c::Value(data, len);
  mu_.Lock();
  --s->waiters;
  ++stats_.verified_reads;
  if (got == s->crc) {
    s->state = Staged::State::kReady;
  } else {
    s->state = Staged::State::kFailed;
    s->corrupt = true;
    s->error = absl::DataLossError(absl::StrCat(
        "hybrid device: the object at ", s->addr, " (", s->len,
        " bytes) does not match its checksum on the capacity tier"));
    ++stats_.read_checksum_failures;
    ++stats_.checksum_failures;
    LOG(WARNING) << "hybrid device: the object at " << s->addr << " ("
                 << s->len << " bytes) staged from the capacity tier does not "
                 << "match its checksum (recorded " << std::hex << s->crc
                 << ", read " << got << std::dec
                 << "); refused until it is overwritten";
    staging_.Unkey(s);
    MarkCorruptLocked(s->addr, s->len, s->crc);
  }
  s->cv.SignalAll();
  MaybeFreeStagedLocked(s);  // may delete s
}

// ---------------------------------------------------------------- reads

HybridDevice::Entry* HybridDevice::FindBufferedLocked(uint64_t addr,
                                                      uint64_t len) {
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return nullptr;
  Entry* e = std::prev(it)->second;
  if (e->addr <= addr && addr + len <= e->addr + e->len) return e;
  return nullptr;
}

absl::StatusOr<ReadView> HybridDevice::AcquireRead(uint32_t region,
                                                   uint64_t addr,
                                                   uint64_t len) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  ReadView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;

  MutexLock l(&mu_);
  if (Entry* e = FindBufferedLocked(addr, len)) {
    ++e->pins;
    ++stats_.buffer_hits;
    ReadRec rec{ReadKind::kBuffer};
    rec.entry = e;
    AdmitReadLocked(&v, buffer_ + e->buf_off + (addr - e->addr), rec);
    return v;
  }
  if (Staged* s = staging_.Find(addr, len);
      s != nullptr && s->state != Staged::State::kQueued) {
    absl::StatusOr<bool> served = ReadStagedLocked(s, &v);
    if (!served.ok()) return served.status();
    if (*served) return v;
    // Failed or too slow: read it directly below.
  }
  return ReadMissLocked(v);
}

void HybridDevice::AdmitReadLocked(ReadView* v, const uint8_t* data,
                                   const ReadRec& rec) {
  v->data = data;
  v->cookie = next_id_++;
  reads_out_[v->cookie] = rec;
  ++stats_.device.reads;
  stats_.device.read_bytes += v->length;
  ++stats_.device.outstanding_reads;
}

absl::StatusOr<bool> HybridDevice::ReadStagedLocked(Staged* s, ReadView* v) {
  ++s->pins;  // keeps `s` alive, also while it is checked
  const absl::Time deadline = absl::Now() + options_.read_timeout;
  while (true) {
    if (s->state == Staged::State::kLoaded) {
      CheckStagedLocked(s);
      continue;
    }
    if (s->state != Staged::State::kLoading &&
        s->state != Staged::State::kChecking) {
      break;
    }
    // Counted as a waiter: the completion signals s->cv only when one
    // waits (a pin alone went unwoken until read_timeout).
    ++s->waiters;
    ++stats_.read_waiters;
    const bool timed_out = s->cv.WaitWithDeadline(&mu_, deadline);
    --stats_.read_waiters;
    --s->waiters;
    if (timed_out) break;
  }
  if (s->state == Staged::State::kReady) {
    ++stats_.staging_hits;
    ReadRec rec{ReadKind::kWindow};
    rec.staged = s;
    AdmitReadLocked(v, window_ + s->slot_off + (v->addr - s->span_start), rec);
    return true;
  }
  const bool corrupt = s->state == Staged::State::kFailed && s->corrupt;
  absl::Status error = s->error;
  --s->pins;
  MaybeFreeStagedLocked(s);
  if (corrupt) return error;
  return false;
}

absl::StatusOr<ReadView> HybridDevice::ReadMissLocked(ReadView v) {
  const uint64_t addr = v.addr;
  const uint64_t len = v.length;
  const uint64_t span_start = RoundDown(addr);
  const uint64_t span_len = RoundUp(addr + len) - span_start;
  // Staging miss. Known to be corrupt: refused without I/O.
  const TierChecksum* sum = checksums_.Find(addr, len);
  if (sum != nullptr && sum->corrupt) {
    ++stats_.corrupt_refusals;
    return absl::DataLossError(absl::StrCat(
        "hybrid device: the object at ", addr, " (", len,
        " bytes) failed its checksum on the capacity tier"));
  }

  // Staging miss: read into a bounce buffer.
  if (bounce_bytes_ > 0 && bounce_bytes_ + span_len > options_.max_bounce_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hybrid device: too many staging-miss bounce buffers (",
        bounce_bytes_, " bytes outstanding)"));
  }
  uint8_t* buf = static_cast<uint8_t*>(aligned_alloc(kPage, span_len));
  if (buf == nullptr) {
    return absl::ResourceExhaustedError(
        "hybrid device: cannot allocate a bounce buffer");
  }
  bounce_bytes_ += span_len;
  ++stats_.staging_misses;
  MissRead* m = new MissRead;
  m->buf = buf;
  m->span_start = span_start;
  m->span_len = span_len;
  if (sum != nullptr) {
    m->check = true;
    m->crc = sum->crc;
  }
  IoReq proto;
  proto.kind = IoReq::Kind::kMiss;
  proto.owner = m;
  proto.file_off = CapacityTier::kHeaderBytes + span_start;
  proto.buf = buf;
  const size_t before = read_q_.size();
  QueueChunksLocked(proto, span_len, &read_q_);
  m->outstanding = static_cast<int>(read_q_.size() - before);
  std::vector<IoReq> next;
  TakeIssuableLocked(&next);
  mu_.Unlock();
  Issue(&next);
  mu_.Lock();
  const absl::Time deadline = absl::Now() + options_.read_timeout;
  while (m->outstanding > 0) {
    if (m->cv.WaitWithDeadline(&mu_, deadline) && m->outstanding > 0) {
      m->abandoned = true;  // the last completion frees it
      return absl::UnavailableError(absl::StrCat(
          "hybrid device: tier read of [", addr, ", +", len,
          ") timed out after ", absl::FormatDuration(options_.read_timeout)));
    }
  }
  bool corrupt = false;
  if (m->status.ok() && m->check) {
    // Only this thread holds `m` now (no chunk is outstanding).
    mu_.Unlock();
    const uint32_t got = crc32c::Value(buf + (addr - span_start), len);
    mu_.Lock();
    ++stats_.verified_reads;
    if (got != m->crc) {
      corrupt = true;
      ++stats_.read_checksum_failures;
      ++stats_.checksum_failures;
      LOG(WARNING) << "hybrid device: the object at " << addr << " (" << len
                   << " bytes) read from the capacity tier does not match its "
                      "checksum (recorded "
                   << std::hex << m->crc << ", read " << got << std::dec
                   << "); refused until it is overwritten";
      MarkCorruptLocked(addr, len, m->crc);
    }
  }
  if (corrupt || !m->status.ok()) {
    absl::Status s =
        corrupt ? absl::DataLossError(absl::StrCat(
                      "hybrid device: the object at ", addr, " (", len,
                      " bytes) does not match its checksum on the capacity "
                      "tier"))
                : absl::UnavailableError(absl::StrCat(
                      "hybrid device: tier read of [", addr, ", +", len,
                      ") failed: ", m->status.ToString()));
    bounce_bytes_ -= span_len;
    delete m;
    free(buf);
    return s;
  }
  ReadRec rec{ReadKind::kBounce};
  rec.miss = m;
  AdmitReadLocked(&v, buf + (addr - span_start), rec);
  return v;
}

void HybridDevice::ReleaseRead(const ReadView& view) {
  std::vector<IoReq> next;
  uint8_t* free_buf = nullptr;
  {
    MutexLock l(&mu_);
    auto it = reads_out_.find(view.cookie);
    if (it == reads_out_.end()) {
      ++stats_.unknown_releases;
      return;
    }
    ReadRec rec = it->second;
    reads_out_.erase(it);
    --stats_.device.outstanding_reads;
    switch (rec.kind) {
      case ReadKind::kBuffer:
        --rec.entry->pins;
        MaybeFreeEntryLocked(rec.entry);
        break;
      case ReadKind::kWindow:
        --rec.staged->pins;
        MaybeFreeStagedLocked(rec.staged);
        break;
      case ReadKind::kBounce:
        free_buf = rec.miss->buf;
        bounce_bytes_ -= rec.miss->span_len;
        delete rec.miss;
        break;
    }
    TakeIssuableLocked(&next);
  }
  free(free_buf);
  Issue(&next);
}

}  // namespace hymcache::storage
