// HybridDevice's write path: BeginWrite, CommitWrite, AbortWrite, Discard,
// and what a write does to buffered objects and pending records.
#include "storage_node/device/hybrid_device.h"

#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "glog/logging.h"
#include "storage_node/device/hybrid_device_internal.h"

namespace hymcache::storage {
using internal::kPage;
using internal::RoundUp;

// ---------------------------------------------------------------- writes

void HybridDevice::MaybeFreeEntryLocked(Entry* e) {
  if (e->writing || e->live || e->queued || e->in_flight || e->pins > 0) {
    return;
  }
  FreeBufferSpaceLocked(e->buf_off);
  entries_.erase(e->id);  // deletes e
}

void HybridDevice::Discard(uint32_t region, uint64_t addr, uint64_t len,
                           uint64_t tag) {
  if (!Check(region, addr, len).ok() || addr % kPage != 0) return;
  MutexLock l(&mu_);
  const uint64_t span = RoundUp(len);
  const uint64_t end = addr + span;
  // A write committed over the range since is newer: it replaces the object
  // (and its record) itself. One still being written needs no check: its
  // commit cancels the queued forget, and if it aborts the old object is
  // still the one to forget.
  auto it = live_.lower_bound(addr);
  if (it != live_.begin() && std::prev(it)->second->addr +
                                     std::prev(it)->second->buf_len > addr) {
    it = std::prev(it);
  }
  for (; it != live_.end() && it->first < end; ++it) {
    const Entry* e = it->second;
    if (e->addr != addr || e->len != len || e->tag != tag) return;
  }
  auto rit = record_pending_.lower_bound(addr);
  if (rit != record_pending_.begin() &&
      std::prev(rit)->first + std::prev(rit)->second.extent.length > addr) {
    rit = std::prev(rit);
  }
  for (; rit != record_pending_.end() && rit->first < end; ++rit) {
    const DurableExtent& x = rit->second.extent;
    if (x.addr != addr || x.length != len || x.tag != tag) return;
  }
  SupersedeLocked(addr, span);
  staging_.Invalidate(addr, span);
  // The checksum (verify_reads) stays: exact forgets leave a newer object
  // recorded there, and only a committed write replaces it.
  checksums_.QueueDiscard(TierRange{addr, len, /*exact=*/true, tag});
  ++stats_.discarded_objects;
  cv_.SignalAll();
}

void HybridDevice::SupersedeLocked(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  auto it = live_.lower_bound(addr);
  if (it != live_.begin()) {
    auto prev = std::prev(it);
    if (prev->second->addr + prev->second->buf_len > addr) it = prev;
  }
  while (it != live_.end() && it->first < end) {
    Entry* e = it->second;
    it = live_.erase(it);
    e->live = false;
    e->superseded = true;
    if (e->queued) ++stats_.superseded_writes;
    if (e->queued && !e->in_flight) {
      flush_queue_.erase(e->seq);
      e->queued = false;
    }
    MaybeFreeEntryLocked(e);
  }
  DropPendingRecordsLocked(addr, len);
}

void HybridDevice::DropPendingRecordsLocked(uint64_t addr, uint64_t len) {
  // The new object's flush forgets the range before writing it, but a
  // pending record of an old object there would be recorded after that
  // Forget, claiming bytes the new object overwrites. It is not durable
  // yet, so dropping it is all it takes (the old object is merely absent
  // after a crash, as the new one is until it is recorded).
  stats_.records_dropped += ErasePendingRecordsLocked(addr, len);
  // One in the running Record becomes durable anyway; the new object's
  // Forget, which comes after that Record returns, removes it again. Only
  // if that Record fails must it not come back.
  const uint64_t end = addr + len;
  for (PendingRecord& r : recording_) {
    if (r.extent.addr < end && addr < r.extent.addr + r.extent.length) {
      r.dropped = true;
    }
  }
}

int HybridDevice::ErasePendingRecordsLocked(uint64_t addr, uint64_t len) {
  const uint64_t end = addr + len;
  int n = 0;
  auto it = record_pending_.lower_bound(addr);
  if (it != record_pending_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.extent.length > addr) it = prev;
  }
  while (it != record_pending_.end() && it->first < end) {
    it = record_pending_.erase(it);
    ++n;
  }
  return n;
}

void HybridDevice::AddPendingRecordLocked(PendingRecord r) {
  // Pending records never overlap (see DropPendingRecordsLocked); stay safe
  // if that ever breaks: the newer object wins.
  if (ErasePendingRecordsLocked(r.extent.addr, r.extent.length) > 0) {
    LOG(DFATAL) << "hybrid device: overlapping pending records at "
                << r.extent.addr;
  }
  r.dropped = false;
  record_pending_[r.extent.addr] = r;
}

absl::StatusOr<WriteView> HybridDevice::BeginWrite(uint32_t region,
                                                   uint64_t addr, uint64_t len,
                                                   uint64_t tag) {
  absl::Status st = Check(region, addr, len);
  if (!st.ok()) return st;
  if (addr % kPage != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hybrid device: write address ", addr, " is not 4 KiB aligned"));
  }
  const uint64_t buf_len = RoundUp(len);
  MutexLock l(&mu_);
  std::optional<uint64_t> off;
  if (buf_len <= buffer_bytes_ && !stopping_) off = buffer_alloc_->TryAllocate(buf_len);
  if (!off) {
    ++stats_.write_buffer_refusals;
    ++stats_.device.refused_writes;
    // While flushes fail (e.g. a full filesystem), say why the buffer does
    // not drain.
    const bool failing = !last_flush_error_.ok();
    return absl::ResourceExhaustedError(absl::StrCat(
        "write buffer full (", buffer_alloc_->used_bytes(), " of ", buffer_bytes_,
        " bytes in use; object of ", len, " bytes)",
        failing ? absl::StrCat("; flushes to the capacity tier are failing: ",
                               last_flush_error_.message())
                : std::string()));
  }
  // The caller has drained readers of the old objects in this range.
  SupersedeLocked(addr, buf_len);
  staging_.Invalidate(addr, buf_len);
  auto owned = std::make_unique<Entry>();
  Entry* e = owned.get();
  e->id = next_id_++;
  e->addr = addr;
  e->len = len;
  e->tag = tag;
  e->buf_off = *off;
  e->buf_len = buf_len;
  entries_[e->id] = std::move(owned);
  // The padding is flushed with the object: make it deterministic.
  if (buf_len > len) std::memset(buffer_ + *off + len, 0, buf_len - len);
  ++stats_.write_buffer_admits;
  ++stats_.device.outstanding_writes;
  WriteView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = buffer_ + *off;
  v.cookie = e->id;
  return v;
}

absl::Status HybridDevice::CommitWrite(const WriteView& view) {
  MutexLock l(&mu_);
  auto it = entries_.find(view.cookie);
  if (it == entries_.end() || !it->second->writing ||
      it->second->committing || it->second->addr != view.addr ||
      it->second->len != view.length) {
    ++stats_.unknown_releases;
    return absl::InvalidArgumentError("hybrid device: unknown write view");
  }
  Entry* e = it->second.get();
  // The object's CRC32C, while its bytes are likely still in this core's
  // cache, on the writer's thread (not the one flusher), outside mu_. The
  // entry cannot be freed while `writing`; `committing` turns away a
  // concurrent Commit or Abort of the same view.
  e->committing = true;
  const uint8_t* data = buffer_ + e->buf_off;
  const uint64_t len = e->len;
  mu_.Unlock();
  const absl::Time crc_start = absl::Now();
  const uint32_t crc = crc32c::Value(data, len);
  const absl::Duration crc_took = absl::Now() - crc_start;
  mu_.Lock();
  e->committing = false;
  e->crc = crc;
  e->has_crc = true;
  stats_.commit_checksum_seconds += absl::ToDoubleSeconds(crc_took);
  e->writing = false;
  --stats_.device.outstanding_writes;
  ++stats_.device.writes;
  stats_.device.write_bytes += e->len;
  // A prefetch may have staged the old bytes since BeginWrite.
  SupersedeLocked(e->addr, e->buf_len);
  staging_.Invalidate(e->addr, e->buf_len);
  // The old objects' bytes on the tier are being replaced (not at
  // BeginWrite: an aborted write leaves them, corrupt ones still refused).
  checksums_.Erase(e->addr, e->buf_len);
  e->live = true;
  live_[e->addr] = e;
  e->queued = true;
  e->seq = next_seq_++;
  e->commit_time = clock_->Now();
  flush_queue_[e->seq] = e;
  cv_.SignalAll();
  return absl::OkStatus();
}

void HybridDevice::AbortWrite(const WriteView& view) {
  MutexLock l(&mu_);
  auto it = entries_.find(view.cookie);
  if (it == entries_.end() || !it->second->writing) {
    ++stats_.unknown_releases;
    return;
  }
  Entry* e = it->second.get();
  if (e->committing) {
    ++stats_.unknown_releases;
    return;
  }
  e->writing = false;
  --stats_.device.outstanding_writes;
  ++stats_.device.aborted_writes;
  MaybeFreeEntryLocked(e);
}

}  // namespace hymcache::storage
