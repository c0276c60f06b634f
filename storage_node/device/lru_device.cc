#include "storage_node/device/lru_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kAlign = BlockIo::kAlignment;

// Waits for a group of BlockIo operations. Held by shared_ptr: each callback
// keeps it alive, so Wait() may return (and the waiter drop it) while the
// last callback is still unlocking.
class IoBatch : public std::enable_shared_from_this<IoBatch> {
 public:
  static std::shared_ptr<IoBatch> New() { return std::make_shared<IoBatch>(); }

  BlockIo::Callback Add() {
    {
      MutexLock l(&mu_);
      ++pending_;
    }
    return [self = shared_from_this()](absl::Status s) {
      self->Done(std::move(s));
    };
  }
  // Returns the first error.
  absl::Status Wait() {
    MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
    return status_;
  }

 private:
  void Done(absl::Status s) {
    MutexLock l(&mu_);
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    --pending_;
  }

  Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status LruCacheDeviceOptions::Validate() const {
  auto aligned = [](uint64_t v) { return v % kAlign == 0; };
  if (!aligned(capacity_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: capacity_bytes ", capacity_bytes, " is not a multiple of ",
        kAlign));
  }
  if (!aligned(data_offset)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: data_offset ", data_offset, " is not a multiple of ",
        kAlign));
  }
  if (line_bytes == 0 || !aligned(line_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: line_bytes ", line_bytes, " is not a positive multiple of ",
        kAlign));
  }
  if (cache_bytes < line_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: cache_bytes ", cache_bytes, " is less than one line of ",
        line_bytes));
  }
  if (max_concurrent_fills < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lru device: max_concurrent_fills ", max_concurrent_fills,
                     " (want >= 1)"));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: alignment ", alignment, " is not a power of two"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LruCacheDevice>> LruCacheDevice::Create(
    const LruCacheDeviceOptions& options, BlockIo* io) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  if (io == nullptr) {
    return absl::InvalidArgumentError("lru device: no BlockIo");
  }
  if (io->size() <= options.data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("lru device: data_offset ", options.data_offset,
                     " is beyond the tier of ", io->size(), " bytes"));
  }
  uint64_t capacity = options.capacity_bytes;
  if (capacity == 0) capacity = (io->size() - options.data_offset) / kAlign * kAlign;
  if (capacity == 0 || capacity > io->size() - options.data_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lru device: region of ", capacity, " bytes at offset ",
        options.data_offset, " does not fit the tier of ", io->size(),
        " bytes"));
  }
  const uint64_t num_lines = options.cache_bytes / options.line_bytes;
  const size_t bytes = num_lines * options.line_bytes;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    int e = errno;
    return absl::ResourceExhaustedError(absl::StrCat(
        "lru device: cannot map ", bytes, " bytes of cache: ", strerror(e)));
  }
  if (options.huge_pages && madvise(mem, bytes, MADV_HUGEPAGE) != 0) {
    VLOG(1) << "lru device: madvise(MADV_HUGEPAGE) failed: " << strerror(errno);
  }
  LOG(INFO) << "lru device: region " << options.region_id << " of " << capacity
            << " bytes, " << num_lines << " lines of " << options.line_bytes
            << " bytes, tier engine " << io->engine();
  return std::unique_ptr<LruCacheDevice>(
      new LruCacheDevice(options, io, capacity, static_cast<uint8_t*>(mem),
                         bytes, num_lines));
}

LruCacheDevice::LruCacheDevice(const LruCacheDeviceOptions& options,
                               BlockIo* io, uint64_t capacity, uint8_t* cache,
                               size_t cache_mapped, uint64_t num_lines)
    : options_(options),
      io_(io),
      capacity_(capacity),
      line_bytes_(options.line_bytes),
      num_lines_(num_lines),
      cache_(cache),
      cache_mapped_(cache_mapped) {
  MutexLock l(&mu_);
  slots_.resize(num_lines_);
  free_.reserve(num_lines_);
  for (uint64_t i = num_lines_; i > 0; --i) free_.push_back(static_cast<int>(i - 1));
  table_.reserve(num_lines_);
  stats_.capacity_bytes = capacity_;
}

LruCacheDevice::~LruCacheDevice() {
  MutexLock l(&mu_);
  uint64_t dirty = 0;
  for (const Slot& s : slots_) dirty += s.dirty ? 1 : 0;
  if (dirty > 0) {
    LOG(WARNING) << "lru device: destroyed with " << dirty
                 << " dirty lines (not written back)";
  }
  if (!bounces_.empty() || !prefetches_pending_.empty()) {
    LOG(ERROR) << "lru device: destroyed with " << bounces_.size()
               << " bounce buffers and " << prefetches_pending_.size()
               << " prefetches outstanding";
  }
  munmap(cache_, cache_mapped_);
}

std::vector<RegionDescriptor> LruCacheDevice::Regions() const {
  RegionDescriptor r;
  r.region_id = options_.region_id;
  r.capacity_bytes = capacity_;
  r.alignment = options_.alignment;
  r.numa_node = -1;
  r.device_kind = "hybrid-lru";
  r.persistent = false;
  return {r};
}

absl::Status LruCacheDevice::Check(uint32_t region, uint64_t addr,
                                   uint64_t len) const {
  if (region != options_.region_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown region ", region, " (this device has region ",
                     options_.region_id, ")"));
  }
  return CheckRange(capacity_, addr, len);
}

uint64_t LruCacheDevice::LineLength(uint64_t line) const {
  const uint64_t start = line * line_bytes_;
  return std::min(line_bytes_, capacity_ - start);
}

bool LruCacheDevice::CanClaim(uint64_t first, uint64_t last, int need) const {
  if (need <= 0) return true;
  int found = static_cast<int>(free_.size());
  for (auto it = lru_.rbegin(); it != lru_.rend() && found < need; ++it) {
    const Slot& s = slots_[*it];
    if (s.pins == 0 && s.state == LineState::kValid &&
        (s.line < first || s.line > last)) {
      ++found;
    }
  }
  return found >= need;
}

int LruCacheDevice::TakeVictim(bool* dirty, uint64_t* old_line) {
  *dirty = false;
  if (!free_.empty()) {
    int slot = free_.back();
    free_.pop_back();
    return slot;
  }
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    Slot& s = slots_[*it];
    if (s.pins != 0 || s.state != LineState::kValid) continue;
    const int slot = *it;
    lru_.erase(s.lru);
    table_.erase(s.line);
    ++cache_stats_.evictions;
    if (s.dirty) {
      *dirty = true;
      *old_line = s.line;
      writing_back_.insert(s.line);
      s.dirty = false;
    }
    s.state = LineState::kFree;
    return slot;
  }
  return -1;  // CanClaim said there was one: not reached
}

void LruCacheDevice::Unpin(int slot) {
  Slot& s = slots_[slot];
  if (--s.pins > 0) return;
  if (s.state == LineState::kFailed) {
    s.state = LineState::kFree;
    s.dirty = false;
    free_.push_back(slot);
  }
  cv_.SignalAll();
}

absl::Status LruCacheDevice::Access(uint64_t addr, uint64_t len, uint8_t* buf,
                                    bool write) {
  const uint64_t first = addr / line_bytes_;
  const uint64_t last = (addr + len - 1) / line_bytes_;
  const uint64_t batch = std::min<uint64_t>(
      static_cast<uint64_t>(options_.max_concurrent_fills), num_lines_);
  for (uint64_t b = first; b <= last; b += batch) {
    absl::Status s =
        AccessLines(b, std::min(last, b + batch - 1), addr, len, buf, write);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// What one AccessLines call holds: the lines of [first, last] it pinned
// (slot_of), those it put in the table (claimed: misses) and fills, and
// the dirty victims it writes back first.
struct LruCacheDevice::LineBatch {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint8_t* buf = nullptr;
  bool write = false;
  size_t n = 0;
  std::vector<int> slot_of;
  std::vector<bool> fill;     // we fill it
  std::vector<bool> claimed;  // we put it in the table (a miss)
  struct WriteBack {
    int slot;
    uint64_t line;
  };
  std::vector<WriteBack> writebacks;
};

void LruCacheDevice::SpanOf(const LineBatch& b, uint64_t line, uint64_t* lo,
                            uint64_t* hi) const {
  const uint64_t start = line * line_bytes_;
  *lo = std::max(b.addr, start) - start;
  *hi = std::min(b.addr + b.len, start + LineLength(line)) - start;
}

absl::Status LruCacheDevice::AccessLines(uint64_t first, uint64_t last,
                                         uint64_t addr, uint64_t len,
                                         uint8_t* buf, bool write) {
  LineBatch b;
  b.first = first;
  b.last = last;
  b.addr = addr;
  b.len = len;
  b.buf = buf;
  b.write = write;
  b.n = static_cast<size_t>(last - first + 1);
  b.slot_of.assign(b.n, -1);
  b.fill.assign(b.n, false);
  b.claimed.assign(b.n, false);
  {
    MutexLock l(&mu_);
    absl::Status claimed = PinLinesLocked(&b);
    if (!claimed.ok()) return claimed;
  }
  WriteBackVictims(b);
  absl::Status filled = FillLines(&b);
  if (!filled.ok()) return filled;

  // Every line is pinned and readable (or ours alone): move the bytes.
  for (size_t i = 0; i < b.n; ++i) {
    const uint64_t line = first + i;
    uint64_t lo, hi;
    SpanOf(b, line, &lo, &hi);
    uint8_t* mem = SlotData(b.slot_of[i]) + lo;
    uint8_t* p = buf + (line * line_bytes_ + lo - addr);
    if (write) {
      std::memcpy(mem, p, hi - lo);
    } else {
      std::memcpy(p, mem, hi - lo);
    }
  }

  MutexLock l(&mu_);
  for (size_t i = 0; i < b.n; ++i) {
    Slot& s = slots_[b.slot_of[i]];
    if (write) {
      s.dirty = true;
      if (b.claimed[i] && !b.fill[i]) lost_.erase(first + i);
    }
    Unpin(b.slot_of[i]);
  }
  return absl::OkStatus();
}

absl::Status LruCacheDevice::PinLinesLocked(LineBatch* b) {
  const uint64_t first = b->first;
  const uint64_t last = b->last;
  const bool write = b->write;
  const size_t n = b->n;
  std::vector<int>& slot_of = b->slot_of;
  // Wait (holding no pins) until every line of the batch is either in the
  // table or claimable: not being written back, with enough victims.
  for (;;) {
    int need = 0;
    bool busy = false;
    for (uint64_t line = first; line <= last; ++line) {
      if (table_.contains(line)) continue;
      if (writing_back_.contains(line)) {
        busy = true;
        break;
      }
      ++need;
    }
    if (!busy && CanClaim(first, last, need)) break;
    cv_.Wait(&mu_);
  }
  // A line lost in a failed write-back reads as DataLoss until a write
  // replaces it whole. Checked before anything is pinned or claimed.
  for (uint64_t line = first; line <= last; ++line) {
    if (table_.contains(line) || !lost_.contains(line)) continue;
    uint64_t lo, hi;
    SpanOf(*b, line, &lo, &hi);
    if (!write || lo != 0 || hi != LineLength(line)) {
      return absl::DataLossError(absl::StrCat(
          "lru device: line ", line, " was lost in a failed write-back"));
    }
  }
  // Pin the hits first so that claiming the misses cannot evict them.
  for (size_t i = 0; i < n; ++i) {
    auto it = table_.find(first + i);
    if (it == table_.end()) continue;
    Slot& s = slots_[it->second];
    ++s.pins;
    lru_.splice(lru_.begin(), lru_, s.lru);
    slot_of[i] = it->second;
    ++cache_stats_.hits;
  }
  for (size_t i = 0; i < n; ++i) {
    if (slot_of[i] >= 0) continue;
    const uint64_t line = first + i;
    uint64_t lo, hi;
    SpanOf(*b, line, &lo, &hi);
    const bool whole = write && lo == 0 && hi == LineLength(line);
    bool dirty = false;
    uint64_t old_line = 0;
    const int slot = TakeVictim(&dirty, &old_line);
    CHECK_GE(slot, 0) << "lru device: no victim after CanClaim";
    if (dirty) b->writebacks.push_back({slot, old_line});
    Slot& s = slots_[slot];
    s.line = line;
    // A line a write covers whole needs no fill. It is readable at once:
    // nobody else may touch its bytes until the write commits (the caller
    // guarantees no overlap), and marking it valid means no access ever
    // waits on a line whose owner may itself be waiting.
    s.state = whole ? LineState::kValid : LineState::kFilling;
    s.dirty = false;
    s.pins = 1;
    lru_.push_front(slot);
    s.lru = lru_.begin();
    table_[line] = slot;
    slot_of[i] = slot;
    b->claimed[i] = true;
    b->fill[i] = !whole;
    ++cache_stats_.misses;
  }
  return absl::OkStatus();
}

void LruCacheDevice::WriteBackVictims(const LineBatch& b) {
  // Dirty victims go back to the tier before their slots are refilled: the
  // foreground pays for them.
  const std::vector<LineBatch::WriteBack>& writebacks = b.writebacks;
  if (writebacks.empty()) return;
  auto wb_batch = IoBatch::New();
  for (const LineBatch::WriteBack& wb : writebacks) {
    io_->Write(options_.data_offset + wb.line * line_bytes_,
               SlotData(wb.slot), LineLength(wb.line), wb_batch->Add());
  }
  absl::Status s = wb_batch->Wait();
  MutexLock l(&mu_);
  for (const LineBatch::WriteBack& wb : writebacks) {
    writing_back_.erase(wb.line);
    if (s.ok()) {
      ++cache_stats_.dirty_writebacks;
      cache_stats_.tier_write_bytes += LineLength(wb.line);
    } else {
      ++cache_stats_.io_errors;
      lost_.insert(wb.line);
    }
  }
  if (!s.ok()) {
    LOG(ERROR) << "lru device: write-back of " << writebacks.size()
               << " lines failed, their data is lost: " << s;
  }
  cv_.SignalAll();
}

absl::Status LruCacheDevice::FillLines(LineBatch* b) {
  const uint64_t first = b->first;
  const uint64_t last = b->last;
  const size_t n = b->n;
  const std::vector<int>& slot_of = b->slot_of;
  const std::vector<bool>& fill = b->fill;
  const std::vector<bool>& claimed = b->claimed;
  absl::Status status;
  // Fill the misses, all at once.
  size_t fills = 0;
  auto fill_batch = IoBatch::New();
  for (size_t i = 0; i < n; ++i) {
    if (!fill[i]) continue;
    const uint64_t line = first + i;
    io_->Read(options_.data_offset + line * line_bytes_, SlotData(slot_of[i]),
              LineLength(line), fill_batch->Add());
    ++fills;
  }
  if (fills > 0) status = fill_batch->Wait();

  MutexLock l(&mu_);
  if (fills > 0) {
    if (status.ok()) {
      cache_stats_.fills += fills;
      for (size_t i = 0; i < n; ++i) {
        if (!fill[i]) continue;
        cache_stats_.tier_read_bytes += LineLength(first + i);
        slots_[slot_of[i]].state = LineState::kValid;
      }
    } else {
      cache_stats_.io_errors += fills;
      LOG(WARNING) << "lru device: fill of lines [" << first << ", " << last
                   << "] failed: " << status;
      status = absl::UnavailableError(
          absl::StrCat("lru device: tier read failed: ", status.message()));
    }
    cv_.SignalAll();
  }
  // On failure every line we claimed leaves the table.
  auto fail_claimed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < n; ++i) {
      if (!claimed[i]) continue;
      Slot& s = slots_[slot_of[i]];
      s.state = LineState::kFailed;
      table_.erase(first + i);
      lru_.erase(s.lru);
    }
    for (size_t i = 0; i < n; ++i) Unpin(slot_of[i]);
    return status;
  };
  if (!status.ok()) return fail_claimed();
  // Hits another access is still filling: wait for them.
  for (size_t i = 0; i < n; ++i) {
    if (claimed[i]) continue;
    Slot* s = &slots_[slot_of[i]];
    while (s->state == LineState::kFilling) cv_.Wait(&mu_);
    if (s->state == LineState::kFailed) {
      status = absl::UnavailableError(absl::StrCat(
          "lru device: fill of line ", first + i, " failed"));
    }
  }
  if (!status.ok()) return fail_claimed();
  return absl::OkStatus();
}

uint64_t LruCacheDevice::NewBounce(uint64_t addr, uint64_t len,
                                   uint8_t** data) {
  Bounce b;
  b.addr = addr;
  b.len = len;
  b.data.reset(new uint8_t[len]);
  *data = b.data.get();
  MutexLock l(&mu_);
  const uint64_t id = next_id_++;
  bounces_.emplace(id, std::move(b));
  return id;
}

absl::StatusOr<ReadView> LruCacheDevice::AcquireRead(uint32_t region,
                                                     uint64_t addr,
                                                     uint64_t len) {
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
  uint8_t* data = nullptr;
  const uint64_t id = NewBounce(addr, len, &data);
  s = Access(addr, len, data, /*write=*/false);
  MutexLock l(&mu_);
  if (!s.ok()) {
    bounces_.erase(id);
    return s;
  }
  ++stats_.reads;
  stats_.read_bytes += len;
  ++stats_.outstanding_reads;
  ReadView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = data;
  v.cookie = id;
  return v;
}

void LruCacheDevice::ReleaseRead(const ReadView& view) {
  if (view.data == nullptr) return;
  MutexLock l(&mu_);
  if (bounces_.erase(view.cookie) == 0) {
    LOG(ERROR) << "lru device: release of an unknown read view";
    return;
  }
  --stats_.outstanding_reads;
}

absl::StatusOr<WriteView> LruCacheDevice::BeginWrite(uint32_t region,
                                                     uint64_t addr,
                                                     uint64_t len,
                                                     uint64_t /*tag*/) {
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
  uint8_t* data = nullptr;
  const uint64_t id = NewBounce(addr, len, &data);
  {
    MutexLock l(&mu_);
    ++stats_.outstanding_writes;
  }
  WriteView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = data;
  v.cookie = id;
  return v;
}

absl::Status LruCacheDevice::CommitWrite(const WriteView& view) {
  if (view.data == nullptr) {
    return absl::InvalidArgumentError("commit of an empty write view");
  }
  {
    MutexLock l(&mu_);
    auto it = bounces_.find(view.cookie);
    if (it == bounces_.end() || it->second.data.get() != view.data) {
      return absl::InvalidArgumentError("commit of an unknown write view");
    }
  }
  absl::Status s = Access(view.addr, view.length, view.data, /*write=*/true);
  MutexLock l(&mu_);
  bounces_.erase(view.cookie);
  --stats_.outstanding_writes;
  if (!s.ok()) return s;
  ++stats_.writes;
  stats_.write_bytes += view.length;
  return absl::OkStatus();
}

void LruCacheDevice::AbortWrite(const WriteView& view) {
  if (view.data == nullptr) return;
  MutexLock l(&mu_);
  if (bounces_.erase(view.cookie) == 0) {
    LOG(ERROR) << "lru device: abort of an unknown write view";
    return;
  }
  --stats_.outstanding_writes;
  ++stats_.aborted_writes;
}

absl::StatusOr<PrefetchHandle> LruCacheDevice::PrefetchObject(uint32_t region,
                                                              uint64_t addr,
                                                              uint64_t len) {
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  PrefetchHandle h;
  h.id = next_id_++;
  h.region_id = region;
  h.addr = addr;
  h.length = len;
  prefetches_pending_.emplace(h.id, h);
  ++stats_.prefetches;
  return h;
}

absl::StatusOr<const uint8_t*> LruCacheDevice::PrefetchWait(
    const PrefetchHandle& handle, absl::Time deadline) {
  {
    MutexLock l(&mu_);
    if (!prefetches_pending_.contains(handle.id)) {
      return absl::InvalidArgumentError("lru device: unknown prefetch handle");
    }
    auto it = bounces_.find(handle.id);
    if (it != bounces_.end()) return it->second.data.get();
  }
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError("lru device: prefetch deadline passed");
  }
  Bounce b;
  b.addr = handle.addr;
  b.len = handle.length;
  b.data.reset(new uint8_t[handle.length]);
  absl::Status s = Access(handle.addr, handle.length, b.data.get(), false);
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  if (!prefetches_pending_.contains(handle.id)) {
    return absl::InvalidArgumentError("lru device: prefetch released");
  }
  auto [it, inserted] = bounces_.emplace(handle.id, std::move(b));
  return static_cast<const uint8_t*>(it->second.data.get());
}

void LruCacheDevice::PrefetchRelease(const PrefetchHandle& handle) {
  MutexLock l(&mu_);
  prefetches_pending_.erase(handle.id);
  bounces_.erase(handle.id);
}

MemoryDeviceStats LruCacheDevice::Stats() const {
  MutexLock l(&mu_);
  return stats_;
}

LruCacheStats LruCacheDevice::CacheStats() const {
  MutexLock l(&mu_);
  return cache_stats_;
}

void LruCacheDevice::VisitStats(StatsVisitor* v) const {
  Stats().Visit(v);
  const LruCacheStats s = CacheStats();
  PrefixedStatsVisitor lru(v, "lru_");
  s.Visit(&lru);
  lru.Gauge("hit_ratio", "hits / (hits + misses) since start", s.hit_ratio());
}

absl::Status LruCacheDevice::Flush() {
  // Pin every dirty valid line, write them all back, mark them clean.
  std::vector<int> slots;
  {
    MutexLock l(&mu_);
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      Slot& s = slots_[i];
      if (s.state == LineState::kValid && s.dirty) {
        ++s.pins;
        s.dirty = false;  // a write during the write-back sets it again
        slots.push_back(i);
      }
    }
  }
  absl::Status status;
  const size_t step = static_cast<size_t>(options_.max_concurrent_fills);
  for (size_t b = 0; b < slots.size(); b += step) {
    const size_t e = std::min(slots.size(), b + step);
    auto batch = IoBatch::New();
    uint64_t bytes = 0;
    for (size_t k = b; k < e; ++k) {
      uint64_t line;
      {
        MutexLock l(&mu_);
        line = slots_[slots[k]].line;
      }
      bytes += LineLength(line);
      io_->Write(options_.data_offset + line * line_bytes_, SlotData(slots[k]),
                 LineLength(line), batch->Add());
    }
    absl::Status s = batch->Wait();
    MutexLock l(&mu_);
    if (s.ok()) {
      cache_stats_.tier_write_bytes += bytes;
    } else {
      ++cache_stats_.io_errors;
      for (size_t k = b; k < e; ++k) slots_[slots[k]].dirty = true;
      if (status.ok()) status = s;
    }
  }
  MutexLock l(&mu_);
  for (int slot : slots) Unpin(slot);
  return status;
}

}  // namespace hymcache::storage
