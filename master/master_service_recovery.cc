// Recency across restarts: the commit time is stored with each object, and
// reads are written lazily: the index queues each object touched by a
// for_read lookup (once until written) and ReapExpired writes up to
// recency_batch of them per call (the read time, in a small record apart
// from the object), off the lookup path; the destructor writes the rest.
// At start-up each node's list is rebuilt from those times (a chain counts
// as recent as its most recent block; children below their parents), so a
// restart keeps the LRU order up to the last batch written; a kill -9
// loses at most the reads of the last moments. Leases are not durable:
// after a restart nothing is leased. Objects persisted by an older master
// (no time, no parent) load as the least recent, unlinked.

#include "master/master_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "master/index_snapshot.h"
#include "master/master_service_internal.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

using internal::DurableRegion;
using internal::PrintableKey;

// WARNING lines per bulk drop before switching to a summary.
constexpr int kMaxDropWarnings = 10;

}  // namespace

absl::Status MasterService::WriteSnapshot() {
  if (options_.snapshot_path.empty()) {
    return absl::FailedPreconditionError("no snapshot_path");
  }
  MutexLock w(&snapshot_mu_);
  const absl::Time start = clock_->Now();
  absl::StatusOr<uint64_t> bytes;
  uint64_t seq = 0;
  size_t objects = 0;
  {
    // Every store write happens under mu_ held exclusively, before the
    // change is applied in memory: with mu_ held the sequence number names
    // exactly the state of the index.
    ReaderMutexLock l(&mu_);
    if (taken_over_) {
      return absl::FailedPreconditionError(
          "this read-only view's index was taken over: no snapshot of it");
    }
    seq = store_->LatestSequence();
    if (seq == 0) {
      return absl::UnimplementedError("the store keeps no sequence numbers");
    }
    objects = index_->size();
    bytes = WriteIndexSnapshotTemp(options_.snapshot_path, seq, *index_);
  }
  if (!bytes.ok()) return bytes.status();
  absl::Status s = CommitIndexSnapshot(options_.snapshot_path);
  if (!s.ok()) return s;
  last_snapshot_ = clock_->Now();
  last_snapshot_sequence_ = seq;
  {
    MutexLock l(&mu_);
    ++counters_.index_snapshots;
  }
  LOG(INFO) << "index snapshot: " << objects << " objects at sequence " << seq
            << ", " << *bytes << " bytes in "
            << absl::FormatDuration(last_snapshot_ - start);
  return absl::OkStatus();
}

absl::Status MasterService::MaybeSnapshot() {
  const bool by_time = options_.snapshot_interval > absl::ZeroDuration();
  const bool by_changes = options_.snapshot_changes > 0;
  if (options_.snapshot_path.empty() || store_->read_only() ||
      !(by_time || by_changes)) {
    return absl::OkStatus();
  }
  {
    MutexLock w(&snapshot_mu_);
    const absl::Time now = clock_->Now();
    if (last_snapshot_ == absl::Time()) {
      last_snapshot_ = now;
      ReaderMutexLock l(&mu_);
      last_snapshot_sequence_ = loaded_snapshot_sequence_;
    }
    bool due = by_time && now - last_snapshot_ >= options_.snapshot_interval;
    if (!due && by_changes) {
      uint64_t objects = 0;
      uint64_t latest = 0;
      {
        ReaderMutexLock l(&mu_);
        objects = index_->size();
        latest = store_->LatestSequence();
      }
      due = latest > last_snapshot_sequence_ &&
            latest - last_snapshot_sequence_ >=
                std::max<uint64_t>(options_.snapshot_changes, objects / 2);
    }
    if (!due) return absl::OkStatus();
  }
  return WriteSnapshot();
}

MasterService::LoadPath MasterService::load_path() const {
  ReaderMutexLock l(&mu_);
  return load_path_;
}

absl::Status MasterService::Load() {
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  auto nodes = store_->LoadNodes();
  if (!nodes.ok()) return nodes.status();
  for (auto& info : *nodes) {
    Node node;
    node.last_seen = now;
    for (const auto& r : info.regions()) {
      auto alloc = RegionAllocator::Create({r.capacity_bytes(), r.alignment()});
      if (!alloc.ok()) {
        LOG(WARNING) << "node " << info.name() << " region " << r.region_id()
                     << " not usable: " << alloc.status();
        continue;
      }
      Region& region = node.regions[r.region_id()];
      region.info = DurableRegion(r);
      region.allocator = std::move(alloc).value();
    }
    const uint32_t id = info.node_id();
    if (id == 0 || nodes_.count(id) || node_by_name_.count(info.name())) {
      LOG(WARNING) << "ignoring persisted node record '" << info.name()
                   << "' with duplicate or zero id " << id;
      continue;
    }
    next_node_id_ = std::max(next_node_id_, id + 1);
    node_by_name_[info.name()] = id;
    // DeregisterNode persists alive = false: such a node stays dead until
    // it registers again.
    node.deregistered = !info.alive();
    if (!info.node_key().empty()) node.mac.emplace(info.node_key());
    node.info = std::move(info);
    nodes_.emplace(id, std::move(node));
  }

  // The fast path reserves each region's space in one ReserveAll after the
  // scan (a tree search per object was more than half of a restart). Only
  // a corrupt store (overlapping or out-of-range records) makes some region
  // refuse; then the load starts over on the careful path, which reserves
  // one object at a time and drops the ones that do not fit.
  std::vector<std::string> doomed;
  if (LoadSnapshotLocked(&doomed)) {
    load_path_ = LoadPath::kSnapshot;
  } else {
    load_path_ = LoadPath::kScan;
    absl::StatusOr<bool> loaded =
        LoadObjectsLocked(/*careful=*/false, &doomed);
    if (!loaded.ok()) return loaded.status();
    if (!*loaded) {
      LOG(WARNING) << "persisted objects overlap or leave their region: "
                      "loading them one at a time";
      ResetObjectsLocked();
      doomed.clear();
      load_path_ = LoadPath::kCarefulScan;
      loaded = LoadObjectsLocked(/*careful=*/true, &doomed);
      if (!loaded.ok()) return loaded.status();
    }
  }
  absl::Status s;
  if (!doomed.empty()) {
    LOG(WARNING) << "dropped " << doomed.size()
                 << " persisted objects that no longer fit their node";
    counters_.objects_dropped += doomed.size();
  }
  // Chains and recency order; objects whose chain lost a block go.
  const auto orphans = index_->FinishLoad();
  for (const auto& [key, e] : orphans) {
    FreeSpace(e.node_id, e.region_id, e.addr);
    CountObject(e, -1);
    doomed.push_back(key);
  }
  if (!orphans.empty()) {
    LOG(WARNING) << "dropped " << orphans.size()
                 << " persisted objects whose chain lost a block before them";
    counters_.orphans_removed += orphans.size();
  }
  if (!doomed.empty()) {
    s = store_->DeleteObjects(std::move(doomed));
    if (!s.ok()) return s;
  }
  LOG(INFO) << "master loaded " << nodes_.size() << " nodes and "
            << index_->size() << " objects";
  return absl::OkStatus();
}

void MasterService::ResetObjectsLocked() {
  index_->Clear();
  object_bytes_ = 0;
  for (auto& [id, node] : nodes_) {
    node.object_count = 0;
    for (auto& [region_id, region] : node.regions) {
      region.object_count = 0;
      region.allocator = std::move(
          RegionAllocator::Create({region.allocator->capacity(),
                                   region.allocator->alignment()})
              .value());
    }
  }
}

// Loads the index from options_.snapshot_path plus the store's changes
// since it, then the allocators (LoadSnapshotLocked). It owns the work of
// the snapshot reader's second thread: while this thread restores the
// index, that one builds each known region's allocator from the
// snapshot's locations (at 10 M objects they took a third of the restart
// after it). Those are used when the index ends up holding exactly the
// snapshot's entries (no change since, no orphan, every region known, no
// empty object); otherwise the allocators are built from the index.
// REQUIRES: the service's mu_ held exclusively for the loader's life. One
// Load per loader.
class MasterService::SnapshotLoader {
 public:
  explicit SnapshotLoader(MasterService* service) : service_(service) {}

  // As LoadSnapshotLocked.
  bool Load(std::vector<std::string>* doomed);

 private:
  // One region's allocator built from the snapshot (BuildAllocators).
  struct Prebuilt {
    RegionAllocatorOptions options;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t bytes = 0;
    size_t count = 0;
    std::unique_ptr<RegionAllocator> allocator;
  };
  // One region's objects in the loaded index (CollectRegions).
  struct RegionLoad {
    Node* node = nullptr;
    Region* region = nullptr;  // nullptr: unknown node or region
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t bytes = 0;
  };

  // An entry in prebuilt_ for each known region.
  void PlanPrebuilt() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);
  // Fills prebuilt_ from the snapshot's entry stream; runs on the
  // snapshot reader's second thread and touches nothing else.
  void BuildAllocators(absl::string_view stream);
  // Reads the snapshot into the index (empty before): false if there is
  // none or it is damaged.
  bool Read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);
  // Applies the store's changes since the snapshot as the running master
  // applied them: puts (new or replacing, linked to their parent if
  // present), deletes (their descendants become orphans), later uses.
  // False (the index and allocators reset) if the store cannot.
  bool ReplayChanges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);
  // Installs the prebuilt allocators if they describe the index exactly;
  // false if they do not.
  bool UsePrebuilt(bool orphans) ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);
  // Per region: its objects' ranges, count and bytes, in one pass over
  // the index (entries come grouped by node, so the last region is
  // cached); objects of an unknown region, or empty, into gone_.
  void CollectRegions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);
  // Drops `orphans` and the objects CollectRegions could not place (with
  // their descendants), then reserves every region's objects at once;
  // false (everything reset) if a region refuses.
  bool ReserveFromIndex(
      const std::vector<std::pair<std::string, ObjectLocation>>& orphans,
      std::vector<std::string>* doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_->mu_);

  MasterService* const service_;
  // By node << 32 | region. Written by the reader's thread, read here
  // after it returned (as is prebuilt_ok_).
  absl::flat_hash_map<uint64_t, Prebuilt> prebuilt_;
  bool prebuilt_ok_ = true;
  uint64_t seq_ = 0;               // the snapshot's store sequence
  size_t snapshot_entries_ = 0;    // objects in the snapshot
  uint64_t changes_ = 0;           // replayed
  absl::flat_hash_map<uint64_t, RegionLoad> regions_;
  std::vector<std::string> gone_;
  absl::Time t_start_, t_read_, t_replayed_;
};

bool MasterService::SnapshotLoader::Load(std::vector<std::string>* doomed) {
  service_->mu_.AssertHeld();
  t_start_ = absl::Now();
  PlanPrebuilt();
  if (!Read()) return false;
  if (!ReplayChanges()) return false;
  // Blocks whose chain lost a block go (a crash between a removal and the
  // removal of its orphans leaves them in the store).
  const std::vector<std::pair<std::string, ObjectLocation>> orphans =
      service_->index_->Orphans();
  if (UsePrebuilt(!orphans.empty())) {
    LOG(INFO) << "index snapshot at sequence " << seq_ << ": "
              << snapshot_entries_ << " objects, no change since; read and "
              << "allocators built in " << (t_read_ - t_start_) << ", "
              << (absl::Now() - t_start_) << " in all";
  } else if (!ReserveFromIndex(orphans, doomed)) {
    return false;
  }
  service_->loaded_snapshot_sequence_ = seq_;
  return true;
}

void MasterService::SnapshotLoader::PlanPrebuilt() {
  for (const auto& [node_id, node] : service_->nodes_) {
    for (const auto& [region_id, region] : node.regions) {
      prebuilt_[(uint64_t{node_id} << 32) | region_id].options = {
          region.allocator->capacity(), region.allocator->alignment()};
    }
  }
}

void MasterService::SnapshotLoader::BuildAllocators(
    absl::string_view stream) {
  uint64_t last_id = ~uint64_t{0};
  Prebuilt* last = nullptr;
  absl::Status s = MetadataIndex::ForEachSnapshotLocation(
      stream, [&](const ObjectLocation& e) {
        if (!prebuilt_ok_) return;
        const uint64_t id = (uint64_t{e.node_id} << 32) | e.region_id;
        if (id != last_id) {
          auto it = prebuilt_.find(id);
          if (it == prebuilt_.end()) {
            prebuilt_ok_ = false;  // an unknown region: dropped below
            return;
          }
          last_id = id;
          last = &it->second;
        }
        if (e.length == 0) {
          prebuilt_ok_ = false;
          return;
        }
        last->ranges.emplace_back(e.addr, e.length);
        last->bytes += e.length;
      });
  if (!s.ok()) prebuilt_ok_ = false;
  for (auto& [id, pb] : prebuilt_) {
    if (!prebuilt_ok_) return;
    pb.count = pb.ranges.size();
    if (pb.count == 0) continue;
    absl::StatusOr<std::unique_ptr<RegionAllocator>> a =
        RegionAllocator::Create(pb.options);
    if (!a.ok() || !(*a)->ReserveAll(std::move(pb.ranges)).ok()) {
      prebuilt_ok_ = false;
      return;
    }
    pb.allocator = std::move(a).value();
  }
}

bool MasterService::SnapshotLoader::Read() {
  absl::StatusOr<uint64_t> seq = ReadIndexSnapshot(
      service_->options_.snapshot_path, service_->index_.get(),
      [this](absl::string_view stream) { BuildAllocators(stream); });
  t_read_ = absl::Now();
  if (!seq.ok()) {
    if (!absl::IsNotFound(seq.status())) {
      LOG(WARNING) << "index snapshot not used: " << seq.status();
    }
    return false;
  }
  seq_ = *seq;
  snapshot_entries_ = service_->index_->size();
  return true;
}

bool MasterService::SnapshotLoader::ReplayChanges() {
  MetadataIndex& index = *service_->index_;
  const bool track = service_->options_.recency_batch > 0;
  index.TrackUsed(false);
  std::vector<std::pair<std::string, std::string>> linked;  // key, parent
  std::vector<std::pair<uint64_t, std::string>> uses;       // ms, key
  absl::Status bad;
  absl::Status s = service_->store_->ForEachObjectChangeSince(
      seq_, [&](const MetadataStore::ObjectChange& c)
                ABSL_NO_THREAD_SAFETY_ANALYSIS {
        ++changes_;
        if (!bad.ok()) return;
        switch (c.kind) {
          case MetadataStore::ObjectChange::Kind::kPut: {
            const ObjectRecord& r = *c.record;
            auto up = index.Upsert(c.key, r, r.parent_key);
            if (!up.ok()) {
              bad = up.status();
              return;
            }
            if (!r.parent_key.empty()) {
              linked.emplace_back(std::string(c.key), r.parent_key);
            }
            break;
          }
          case MetadataStore::ObjectChange::Kind::kDelete:
            index.Erase(c.key);
            break;
          case MetadataStore::ObjectChange::Kind::kUse:
            uses.emplace_back(c.use_ms, std::string(c.key));
            break;
        }
      });
  if (s.ok()) s = bad;
  if (!s.ok()) {
    LOG(WARNING) << "index snapshot at sequence " << seq_
                 << " not used (scanning the store instead): " << s;
    service_->ResetObjectsLocked();
    index.TrackUsed(track);
    return false;
  }
  // A block committed before the block before it (racing puts of one
  // chain) is linked once both are in. Adopt passes over a linked block at
  // once (Chain, which walks to the root, made this quadratic in a chain's
  // length).
  for (const auto& [key, parent] : linked) index.Adopt(key, parent);
  std::stable_sort(uses.begin(), uses.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ms, key] : uses) index.Touch(key, 0);
  index.TrackUsed(track);
  t_replayed_ = absl::Now();
  return true;
}

bool MasterService::SnapshotLoader::UsePrebuilt(bool orphans) {
  if (prebuilt_ok_ && changes_ == 0 && !orphans) {
    size_t count = 0;
    for (const auto& [id, pb] : prebuilt_) count += pb.count;
    prebuilt_ok_ = count == service_->index_->size();
  } else {
    prebuilt_ok_ = false;
  }
  if (!prebuilt_ok_) return false;
  // The index is the snapshot: its allocators are ready.
  for (auto& [id, pb] : prebuilt_) {
    if (pb.count == 0) continue;
    Node& node = service_->nodes_.at(static_cast<uint32_t>(id >> 32));
    Region& region = node.regions.at(static_cast<uint32_t>(id));
    region.allocator = std::move(pb.allocator);
    node.object_count += pb.count;
    region.object_count += pb.count;
    service_->object_bytes_ += pb.bytes;
  }
  return true;
}

void MasterService::SnapshotLoader::CollectRegions() {
  regions_.clear();
  gone_.clear();
  uint64_t last_id = ~uint64_t{0};
  RegionLoad* last = nullptr;
  service_->index_->ForEach(
      [&](absl::string_view key, const ObjectLocation& e)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {
            const uint64_t id = (uint64_t{e.node_id} << 32) | e.region_id;
            if (id != last_id) {
              auto [it, fresh] = regions_.try_emplace(id);
              if (fresh) {
                auto n = service_->nodes_.find(e.node_id);
                if (n != service_->nodes_.end()) {
                  auto r = n->second.regions.find(e.region_id);
                  if (r != n->second.regions.end()) {
                    it->second.node = &n->second;
                    it->second.region = &r->second;
                  }
                }
              }
              last_id = id;
              last = &it->second;
            }
            if (last->region == nullptr || e.length == 0) {
              gone_.emplace_back(key);
              return;
            }
            last->ranges.emplace_back(e.addr, e.length);
            last->bytes += e.length;
          });
}

bool MasterService::SnapshotLoader::ReserveFromIndex(
    const std::vector<std::pair<std::string, ObjectLocation>>& orphans,
    std::vector<std::string>* doomed) {
  MetadataIndex& index = *service_->index_;
  std::vector<std::string> dropped;
  for (const auto& [key, e] : orphans) {
    index.Erase(key);
    dropped.push_back(key);
  }
  CollectRegions();
  const absl::Time t_collected = absl::Now();
  if (!gone_.empty()) {
    // Rare (a node record lost): they go with their descendants, and the
    // pass again without them.
    for (const std::string& key : gone_) index.Erase(key);
    dropped.insert(dropped.end(), gone_.begin(), gone_.end());
    for (const auto& [key, e] : index.Orphans()) {
      index.Erase(key);
      dropped.push_back(key);
    }
    CollectRegions();
  }
  gone_ = std::move(dropped);
  for (auto& [id, load] : regions_) {
    if (load.region == nullptr) continue;
    const size_t n = load.ranges.size();
    absl::Status rs = load.region->allocator->ReserveAll(std::move(load.ranges));
    if (!rs.ok()) {
      LOG(WARNING) << "index snapshot at sequence " << seq_
                   << " not used (scanning the store instead): " << rs;
      service_->ResetObjectsLocked();
      return false;
    }
    load.node->object_count += n;
    load.region->object_count += n;
    service_->object_bytes_ += load.bytes;
  }
  for (std::string& key : gone_) {
    if (doomed->size() < kMaxDropWarnings) {
      LOG(WARNING) << "dropping persisted object '" << PrintableKey(key)
                   << "': its node or region is unknown, or its chain lost "
                      "a block";
    }
    doomed->push_back(std::move(key));
  }
  LOG(INFO) << "index snapshot at sequence " << seq_ << ": "
            << snapshot_entries_ << " objects, then " << changes_
            << " changes replayed; read in " << (t_read_ - t_start_)
            << ", changes in " << (t_replayed_ - t_read_) << ", ranges in "
            << (t_collected - t_replayed_) << ", allocators in "
            << (absl::Now() - t_collected);
  return true;
}

bool MasterService::LoadSnapshotLocked(std::vector<std::string>* doomed) {
  if (options_.snapshot_path.empty()) return false;
  SnapshotLoader loader(this);
  return loader.Load(doomed);
}

absl::StatusOr<bool> MasterService::LoadObjectsLocked(
    bool careful, std::vector<std::string>* doomed) {
  // Careless: each region's ranges, reserved after the scan.
  absl::flat_hash_map<RegionAllocator*,
                      std::vector<std::pair<uint64_t, uint64_t>>>
      ranges;
  absl::Status s = store_->ForEachObject([&](absl::string_view key,
                                             const ObjectRecord& r)
                                             ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::string why;
    auto n = nodes_.find(r.node_id);
    if (n == nodes_.end()) {
      why = absl::StrCat("node ", r.node_id, " is unknown");
    } else if (auto reg = n->second.regions.find(r.region_id);
               reg == n->second.regions.end()) {
      why = absl::StrCat("node ", r.node_id, " has no region ", r.region_id);
    } else if (key.empty() || key.size() > MetadataIndex::kMaxKeyBytes ||
               r.length == 0 || r.length > MetadataIndex::kMaxLength) {
      why = "key or length out of range";
    } else if (absl::Status rs =
                   careful ? reg->second.allocator->Reserve(r.addr, r.length)
                           : absl::OkStatus();
               !rs.ok()) {
      why = std::string(rs.message());
    } else {
      absl::Status up = index_->LoadEntry(key, r, r.parent_key, r.last_use_ms);
      if (up.ok()) {
        CountObject(r, +1);
        if (!careful) {
          ranges[reg->second.allocator.get()].emplace_back(r.addr, r.length);
        }
        return;
      }
      if (careful) reg->second.allocator->Free(r.addr).IgnoreError();
      why = std::string(up.message());
    }
    if (doomed->size() < kMaxDropWarnings) {
      LOG(WARNING) << "dropping persisted object '" << PrintableKey(key)
                   << "': " << why;
    }
    doomed->emplace_back(key);
  });
  if (!s.ok()) return s;
  for (auto& [allocator, region_ranges] : ranges) {
    if (!allocator->ReserveAll(std::move(region_ranges)).ok()) return false;
  }
  return true;
}

size_t MasterService::PersistRecencyLocked(size_t max) {
  if (max == 0) return 0;
  auto used = index_->CollectUsed(max);
  if (used.empty()) return 0;
  MetadataMutation m;
  m.object_uses.reserve(used.size());
  for (auto& [key, tick] : used) {
    const absl::Time at = ReadTimeOfTick(tick);
    m.object_uses.emplace_back(std::move(key),
                               static_cast<uint64_t>(absl::ToUnixMillis(at)));
  }
  absl::Status s = store_->Apply(m);
  if (!s.ok()) {
    ++counters_.recency_write_failures;
    LOG(WARNING) << "cannot persist the last reads of " << used.size()
                 << " objects (a restart orders them by older uses): " << s;
    return 0;
  }
  counters_.recency_writes += used.size();
  return used.size();
}

}  // namespace master
}  // namespace hymcache
