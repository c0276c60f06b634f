#include "storage_node/dataplane/extent_table.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace hymcache::storage {

// All fields are guarded by the owning table's mu_.
struct ExtentTable::Extent {
  ExtentKey key;
  bool readable = false;    // committed and not invalidated
  bool writing = false;     // a WriteTicket is outstanding
  bool live = true;         // in its region's live map (else in retired_)
  bool superseded = false;  // a higher generation took over while writing
  bool cleared = false;     // dropped by Clear(): blocks no generation
  uint64_t pins = 0;
  uint64_t seq = 0;         // order of its BeginWrite in this table
};

namespace {

bool Overlaps(const ExtentKey& a, const ExtentKey& b) {
  return a.region_id == b.region_id && a.addr < b.addr + b.length &&
         b.addr < a.addr + a.length;
}

std::string Describe(const ExtentKey& k) {
  return absl::StrCat("region ", k.region_id, " addr ", k.addr, " length ",
                      k.length, " generation ", k.generation);
}

}  // namespace

// ---------------------------------------------------------------- handles

ExtentTable::ReadPin::ReadPin(ReadPin&& o) noexcept
    : table_(std::exchange(o.table_, nullptr)),
      extent_(std::exchange(o.extent_, nullptr)) {}

ExtentTable::ReadPin& ExtentTable::ReadPin::operator=(ReadPin&& o) noexcept {
  if (this != &o) {
    Release();
    table_ = std::exchange(o.table_, nullptr);
    extent_ = std::exchange(o.extent_, nullptr);
  }
  return *this;
}

void ExtentTable::ReadPin::Release() {
  if (extent_ == nullptr) return;
  table_->Unpin(extent_);
  extent_ = nullptr;
  table_ = nullptr;
}

ExtentTable::WriteTicket::WriteTicket(WriteTicket&& o) noexcept
    : table_(std::exchange(o.table_, nullptr)),
      extent_(std::exchange(o.extent_, nullptr)) {}

ExtentTable::WriteTicket& ExtentTable::WriteTicket::operator=(
    WriteTicket&& o) noexcept {
  if (this != &o) {
    Abort();
    table_ = std::exchange(o.table_, nullptr);
    extent_ = std::exchange(o.extent_, nullptr);
  }
  return *this;
}

absl::Status ExtentTable::WriteTicket::Commit() {
  if (extent_ == nullptr) {
    return absl::FailedPreconditionError("write ticket already finished");
  }
  absl::Status s = table_->Commit(extent_);
  extent_ = nullptr;
  table_ = nullptr;
  return s;
}

void ExtentTable::WriteTicket::Abort() {
  if (extent_ == nullptr) return;
  table_->Abort(extent_);
  extent_ = nullptr;
  table_ = nullptr;
}

// ---------------------------------------------------------------- table

absl::Status ExtentTableOptions::Validate() const {
  if (regions.empty()) {
    return absl::InvalidArgumentError("extent table: no regions");
  }
  std::set<uint32_t> ids;
  for (const RegionDescriptor& r : regions) {
    if (!ids.insert(r.region_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("extent table: duplicate region id ", r.region_id));
    }
    if (r.capacity_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("extent table: region ", r.region_id, " is empty"));
    }
  }
  if (drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("extent table: negative drain_timeout");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExtentTable>> ExtentTable::Create(
    const ExtentTableOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<ExtentTable>(new ExtentTable(options));
}

ExtentTable::ExtentTable(const ExtentTableOptions& options)
    : drain_timeout_(options.drain_timeout) {
  MutexLock l(&mu_);
  for (const RegionDescriptor& r : options.regions) {
    regions_[r.region_id].capacity = r.capacity_bytes;
  }
}

ExtentTable::~ExtentTable() {
  MutexLock l(&mu_);
  if (pins_ != 0 || writing_ != 0) {
    LOG(ERROR) << "extent table destroyed with " << pins_ << " read pins and "
               << writing_ << " writes outstanding";
  }
}

absl::StatusOr<ExtentTable::Region*> ExtentTable::FindRegion(
    const ExtentKey& key) {
  auto it = regions_.find(key.region_id);
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown region ", key.region_id));
  }
  RETURN_IF_ERROR(CheckRange(it->second.capacity, key.addr, key.length));
  return &it->second;
}

std::vector<std::map<uint64_t, std::unique_ptr<ExtentTable::Extent>>::iterator>
ExtentTable::OverlappingLive(Region* region, uint64_t addr, uint64_t len) {
  std::vector<std::map<uint64_t, std::unique_ptr<Extent>>::iterator> out;
  const uint64_t end = addr + len;  // checked against capacity: no overflow
  auto it = region->live.lower_bound(addr);
  if (it != region->live.begin()) {
    auto prev = std::prev(it);
    const ExtentKey& k = prev->second->key;
    if (k.addr + k.length > addr) out.push_back(prev);
  }
  for (; it != region->live.end() && it->first < end; ++it) {
    out.push_back(it);
  }
  return out;
}

bool ExtentTable::RetiredBlocks(const ExtentKey& key) const {
  for (const auto& e : retired_) {
    if (!e->cleared && Overlaps(e->key, key) &&
        e->key.generation >= key.generation) {
      return true;
    }
  }
  return false;
}

void ExtentTable::Retire(Region* region, Extent* e) {
  auto it = region->live.find(e->key.addr);
  CHECK(it != region->live.end() && it->second.get() == e)
      << "extent table: live map out of sync";
  std::unique_ptr<Extent> owned = std::move(it->second);
  region->live.erase(it);
  e->live = false;
  if (e->readable) {
    e->readable = false;
    --readable_count_;
    readable_bytes_ -= e->key.length;
  }
  if (e->writing) {
    e->superseded = true;
    cv_.SignalAll();  // its writer may be waiting in BeginWrite
  }
  if (e->pins > 0 || e->writing) retired_.push_back(std::move(owned));
}

void ExtentTable::MaybeFreeRetired(Extent* e) {
  if (e->live || e->pins > 0 || e->writing) return;
  auto it = std::find_if(retired_.begin(), retired_.end(),
                         [e](const std::unique_ptr<Extent>& p) {
                           return p.get() == e;
                         });
  CHECK(it != retired_.end()) << "extent table: retired extent lost";
  retired_.erase(it);
  cv_.SignalAll();
}

absl::StatusOr<ExtentTable::ReadPin> ExtentTable::PinRead(const ExtentKey& key) {
  MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Region * region, FindRegion(key));
  auto it = region->live.find(key.addr);
  if (it == region->live.end() || !it->second->readable ||
      it->second->key.length != key.length ||
      it->second->key.generation != key.generation) {
    return absl::NotFoundError(
        absl::StrCat("object not on this node or its space was reused (",
                     Describe(key), ")"));
  }
  Extent* e = it->second.get();
  ++e->pins;
  ++pins_;
  return ReadPin(this, e);
}

absl::Status ExtentTable::WaitToWriteLocked(const ExtentKey& key,
                                            Region* region, uint64_t seq,
                                            absl::Time deadline,
                                            std::list<Waiting>::iterator* me_io,
                                            LiveIterators* overlapping_out) {
  std::list<Waiting>::iterator& me = *me_io;
  LiveIterators& overlapping = *overlapping_out;
  while (true) {
    if (key.generation > generation_ceiling_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", key.generation,
          " was not issued by the master (ceiling ", generation_ceiling_,
          ")"));
    }
    if (me != waiting_.end() && me->cleared) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the master forgot this node's objects while the write waited (",
          Describe(key), ")"));
    }
    for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
      if (w == me || !Overlaps(w->key, key) ||
          w->key.generation < key.generation) {
        continue;
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "stale allocation: space was reused (", Describe(key),
          " was overtaken by a newer write)"));
    }
    overlapping = OverlappingLive(region, key.addr, key.length);
    bool busy = false;
    for (const auto& it : overlapping) {
      const ExtentKey& o = it->second->key;
      busy = busy || it->second->pins > 0;
      if (o.generation < key.generation) continue;
      if (o.generation == key.generation && o.addr == key.addr &&
          o.length == key.length) {
        return absl::FailedPreconditionError(absl::StrCat(
            "allocation already written or being written (", Describe(key),
            ")"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "stale allocation: space was reused (", Describe(key),
          " overlaps generation ", o.generation, ")"));
    }
    if (RetiredBlocks(key)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stale allocation: space was reused (", Describe(key), ")"));
    }
    for (const auto& r : retired_) {
      busy = busy || (Overlaps(r->key, key) && (r->pins > 0 || r->writing));
    }
    if (!busy) return absl::OkStatus();
    if (me == waiting_.end()) {
      me = waiting_.insert(waiting_.end(), Waiting{key, seq});
      cv_.SignalAll();  // an older waiting write gives way
      continue;
    }
    if (cv_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      // Timed out: unless the last look finds nothing blocking, give up.
      bool still = false;
      for (const auto& it : OverlappingLive(region, key.addr, key.length)) {
        still = still || it->second->pins > 0;
      }
      for (const auto& r : retired_) {
        still =
            still || (Overlaps(r->key, key) && (r->pins > 0 || r->writing));
      }
      if (still) {
        return absl::UnavailableError(absl::StrCat(
            "readers of the reused space did not finish within ",
            absl::FormatDuration(drain_timeout_), " (", Describe(key),
            "); the objects there are still readable"));
      }
    }
  }
}

absl::StatusOr<ExtentTable::WriteTicket> ExtentTable::BeginWrite(
    const ExtentKey& key, absl::Time until) {
  MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Region * region, FindRegion(key));
  // Readers of the older extents this write replaces (and of space earlier
  // writes retired) must finish before its bytes land. Wait for them while
  // changing nothing, so that a write that fails here (Unavailable, or a
  // check below once the wait lets another writer in) leaves every
  // readable object as it was. New readers may still pin them meanwhile.
  const absl::Time deadline = std::min(absl::Now() + drain_timeout_, until);
  const uint64_t seq = next_seq_++;
  LiveIterators overlapping;
  auto me = waiting_.end();
  // OK once nothing blocks the write (then `overlapping` is current).
  absl::Status waited =
      WaitToWriteLocked(key, region, seq, deadline, &me, &overlapping);
  if (me != waiting_.end()) {
    waiting_.erase(me);
    cv_.SignalAll();  // a lower waiting write may proceed or fail now
  }
  if (!waited.ok()) return waited;
  // Invalidate the older extents now (none is pinned): no read can pin
  // them any more. Only an older write still in progress there (superseded
  // now) is waited for below.
  for (const auto& it : overlapping) Retire(region, it->second.get());

  auto owned = std::make_unique<Extent>();
  Extent* e = owned.get();
  e->key = key;
  e->seq = seq;
  e->writing = true;
  region->live.emplace(key.addr, std::move(owned));
  ++writing_;

  auto busy = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& r : retired_) {
      if (Overlaps(r->key, key)) return true;
    }
    return false;
  };
  while (!e->superseded && busy()) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && busy()) break;
  }
  if (e->superseded) {
    const bool cleared = e->cleared;
    e->writing = false;
    --writing_;
    MaybeFreeRetired(e);
    if (cleared) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the master forgot this node's objects while the write waited (",
          Describe(key), ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "stale allocation: space was reused (", Describe(key),
        " was overtaken by a newer write)"));
  }
  if (busy()) {
    e->writing = false;
    --writing_;
    region->live.erase(key.addr);
    return absl::UnavailableError(absl::StrCat(
        "readers of the reused space did not finish within ",
        absl::FormatDuration(drain_timeout_), " or the request's deadline (",
        Describe(key), ")"));
  }
  return WriteTicket(this, e);
}

void ExtentTable::Unpin(Extent* e) {
  MutexLock l(&mu_);
  CHECK_GT(e->pins, 0u) << "extent table: unbalanced unpin";
  --e->pins;
  --pins_;
  // A write may be waiting for this object's readers (BeginWrite).
  if (e->pins == 0) cv_.SignalAll();
  MaybeFreeRetired(e);
}

absl::Status ExtentTable::Commit(Extent* e) {
  MutexLock l(&mu_);
  e->writing = false;
  --writing_;
  if (!e->live) {
    const ExtentKey key = e->key;
    const bool cleared = e->cleared;
    MaybeFreeRetired(e);
    if (cleared) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the master forgot this node's objects while the object was being "
          "written (",
          Describe(key), ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "stale allocation: space was reused while the object was being "
        "written (",
        Describe(key), ")"));
  }
  e->readable = true;
  ++readable_count_;
  readable_bytes_ += e->key.length;
  return absl::OkStatus();
}

void ExtentTable::Abort(Extent* e) {
  MutexLock l(&mu_);
  e->writing = false;
  --writing_;
  if (!e->live) {
    MaybeFreeRetired(e);
    return;
  }
  auto rit = regions_.find(e->key.region_id);
  CHECK(rit != regions_.end());
  auto it = rit->second.live.find(e->key.addr);
  CHECK(it != rit->second.live.end() && it->second.get() == e);
  rit->second.live.erase(it);
}

void ExtentTable::SetGenerationCeiling(uint64_t ceiling) {
  MutexLock l(&mu_);
  generation_ceiling_ = ceiling;
}

uint64_t ExtentTable::generation_ceiling() const {
  MutexLock l(&mu_);
  return generation_ceiling_;
}

void ExtentTable::Clear() { ClearStale(kNoCeiling, kNoCeiling); }

uint64_t ExtentTable::WriteSequence() const {
  MutexLock l(&mu_);
  return next_seq_;
}

void ExtentTable::ClearStale(uint64_t before_seq, uint64_t max_generation) {
  MutexLock l(&mu_);
  auto stale = [&](const Extent* e) {
    return e->seq < before_seq || e->key.generation > max_generation;
  };
  // Extents retired earlier are dropped too: none may block a new write.
  for (auto& e : retired_) {
    if (stale(e.get())) e->cleared = true;
  }
  // Writes still waiting for readers fail (as writes in progress do).
  for (Waiting& w : waiting_) {
    if (w.seq < before_seq || w.key.generation > max_generation) {
      w.cleared = true;
      cv_.SignalAll();
    }
  }
  for (auto& entry : regions_) {
    Region& region = entry.second;
    for (auto it = region.live.begin(); it != region.live.end();) {
      Extent* e = it->second.get();
      ++it;  // Retire erases `e` from the map
      if (!stale(e)) continue;
      e->cleared = true;
      Retire(&region, e);  // frees it unless pinned or being written
    }
  }
}

bool ExtentTable::Drop(const ExtentKey& key) {
  MutexLock l(&mu_);
  auto r = regions_.find(key.region_id);
  if (r == regions_.end()) return false;
  auto it = r->second.live.find(key.addr);
  if (it == r->second.live.end()) return false;
  Extent* e = it->second.get();
  if (!e->readable || e->key.length != key.length ||
      e->key.generation != key.generation) {
    return false;
  }
  Retire(&r->second, e);  // frees it unless pinned
  return true;
}

void ExtentTable::ListReadable(Cursor* cursor, size_t max,
                               std::vector<ExtentKey>* out) const {
  MutexLock l(&mu_);
  if (cursor->done) return;
  size_t added = 0;
  for (auto r = regions_.lower_bound(cursor->region_id); r != regions_.end();
       ++r) {
    const uint64_t from = r->first == cursor->region_id ? cursor->addr : 0;
    for (auto it = r->second.live.lower_bound(from);
         it != r->second.live.end(); ++it) {
      if (added == max) {
        cursor->region_id = r->first;
        cursor->addr = it->first;
        return;
      }
      if (!it->second->readable) continue;
      out->push_back(it->second->key);
      ++added;
    }
  }
  cursor->done = true;
}

ExtentTableStats ExtentTable::Stats() const {
  MutexLock l(&mu_);
  ExtentTableStats s;
  s.extents = readable_count_;
  s.bytes = readable_bytes_;
  s.writing = writing_;
  s.retired = retired_.size();
  s.pinned_reads = pins_;
  s.waiting_writes = waiting_.size();
  return s;
}

}  // namespace hymcache::storage
