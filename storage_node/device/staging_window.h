// StagingWindow: the hybrid device's staging window as bookkeeping, without
// the bytes or the I/O. It owns every staged object (StagedObject), finds
// them by (addr, len) so that prefetches of one object share one staged copy,
// hands out window space (best fit, 4 KiB pages: RangeAllocator) to queued
// objects in strict FIFO order (back-pressure: later prefetches wait behind
// the head even when they would fit), frees an object's space once nothing
// holds it and no read still lands in it, and forgets the staged copies a
// write overlaps (Invalidate). Released space is reused at once.
//
// The device does the rest (hybrid_device_prefetch.cc): it reads an admitted
// object into its slot in io_chunk_bytes chunks, waits, checks checksums and
// counts; the I/O fields of StagedObject are its own.
//
// Pure logic: no I/O, no threads, no clock (staging_window_test.cc drives it
// directly). Not internally synchronized: HybridDevice owns one and calls it
// only with its mutex held (ABSL_GUARDED_BY(mu_) there; hybrid_device.h
// says why the device keeps one mutex). StagedObject's fields and CondVar
// are guarded by that mutex too.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "common/range_allocator.h"

namespace hymcache::storage {

// An object staged (or being staged, or waiting for window space).
struct StagedObject {
  // kLoaded: the bytes are in but their checksum is not checked yet
  // (verify_reads); kChecking: a consumer is checking it.
  enum class State { kQueued, kLoading, kLoaded, kChecking, kReady, kFailed };
  uint64_t addr = 0;
  uint64_t len = 0;
  uint64_t span_start = 0;  // addr rounded down to a page
  uint64_t span_len = 0;    // whole pages covering the object
  State state = State::kQueued;
  int refs = 0;  // prefetch handles
  int pins = 0;  // reads
  bool keyed = false;     // findable by (addr, len)
  bool has_slot = false;  // holds window space
  uint64_t slot_off = 0;
  // The device's I/O and checks.
  int chunks_pending = 0;    // in the read queue, not issued
  int chunks_in_flight = 0;  // issued, not completed
  int waiters = 0;           // threads waiting for it to be ready
  bool check = false;        // verify_reads and its checksum is known
  uint32_t crc = 0;          // the expected CRC32C
  bool corrupt = false;      // failed: checksum mismatch (else: I/O error)
  absl::Status error;
  // Signalled when state becomes kReady or kFailed: only the threads
  // waiting for this object wake up, not every reader on every I/O.
  CondVar cv;
  int owners() const { return refs + pins + waiters; }
};

class StagingWindow {
 public:
  // `space`: the window's space (its capacity is the window's size).
  explicit StagingWindow(std::unique_ptr<RangeAllocator> space)
      : space_(std::move(space)) {}
  StagingWindow(const StagingWindow&) = delete;
  StagingWindow& operator=(const StagingWindow&) = delete;

  // The staged copy of exactly (addr, len) new prefetches and reads share,
  // in any state, or null.
  StagedObject* Find(uint64_t addr, uint64_t len) const;

  // A new staged copy of (addr, len), covering the pages [span_start,
  // + span_len), findable by Find, queued at the FIFO's tail (kQueued, no
  // owners yet: the caller adds its reference). Replaces an earlier copy as
  // the one Find returns. REQUIRES: span_len <= the window's size.
  StagedObject* Add(uint64_t addr, uint64_t len, uint64_t span_start,
                    uint64_t span_len);

  // The FIFO's head if window space for it is free now: it leaves the queue
  // with its slot (has_slot, slot_off) and becomes kLoading. Null when the
  // queue is empty or the head does not fit (nothing behind it starts).
  StagedObject* AdmitNext();

  // Makes `s` unfindable: new prefetches and reads no longer share it;
  // those holding it keep it.
  void Unkey(StagedObject* s);

  // Unkeys the staged copies whose pages overlap [addr, addr + len) (a write
  // replaces their bytes).
  void Invalidate(uint64_t addr, uint64_t len);

  // Called when an owner let go of `s`, its I/O ended or it failed. Unless a
  // chunk is still in flight into its slot: frees its space once nothing
  // owns it or it failed, and when nothing owns it, removes it from the
  // FIFO and deletes it. Returns whether space was freed or the FIFO's head
  // left (queued objects may fit now: AdmitNext).
  // REQUIRES: the caller dropped its queued chunks first (chunks_pending 0
  // if nothing owns it).
  bool Release(StagedObject* s);

  // Destruction: every queued object fails (kFailed) and leaves the FIFO.
  void FailQueued();

  uint64_t capacity_bytes() const { return space_->capacity(); }
  uint64_t used_bytes() const { return space_->used_bytes(); }
  // Objects alive (findable, unkeyed with owners, or queued).
  size_t objects() const { return objects_.size(); }
  // Objects waiting for window space.
  size_t queued() const { return fifo_.size(); }

 private:
  const std::unique_ptr<RangeAllocator> space_;
  // Staged copies findable by (addr, len).
  std::map<std::pair<uint64_t, uint64_t>, StagedObject*> by_key_;
  // Every StagedObject alive.
  std::map<StagedObject*, std::unique_ptr<StagedObject>> objects_;
  std::deque<StagedObject*> fifo_;
  uint64_t max_span_ = 0;  // high-water mark of span_len (Invalidate)
};

}  // namespace hymcache::storage
