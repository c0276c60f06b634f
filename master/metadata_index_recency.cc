// MetadataIndex: the per-node recency lists (chains kept below their
// parents), touches and read ticks, the eviction walks (PickEvictions and
// PickEvictionsScored), ended marks, orphans of ghosts, and the
// CollectUsed queue.
#include "master/metadata_index.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "master/metadata_index_internal.h"

namespace hymcache {
namespace master {

void MetadataIndex::LinkMostRecent(uint32_t i, uint32_t node_id) {
  LinkMostRecent(i, lists_[node_id]);
}

void MetadataIndex::LinkMostRecent(uint32_t i, List& list) {
  Record& l = record(i);
  l.prev = list.most;
  l.next = kNil;
  if (list.most != kNil) {
    record(list.most).next = i;
  } else {
    list.least = i;
  }
  list.most = i;
}

void MetadataIndex::LinkBelow(uint32_t i, uint32_t above, List& list) {
  Record& l = record(i);
  Record& a = record(above);
  l.next = above;
  l.prev = a.prev;
  if (a.prev != kNil) {
    record(a.prev).next = i;
  } else {
    list.least = i;
  }
  a.prev = i;
}

void MetadataIndex::LinkAbove(uint32_t i, uint32_t below, List& list) {
  const uint32_t above = record(below).next;
  if (above == kNil) {
    LinkMostRecent(i, list);
  } else {
    LinkBelow(i, above, list);
  }
}

void MetadataIndex::LinkLeastRecent(uint32_t i, List& list) {
  if (list.least == kNil) {
    LinkMostRecent(i, list);
  } else {
    LinkBelow(i, list.least, list);
  }
}

void MetadataIndex::Unlink(uint32_t i, uint32_t node_id) {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return;  // not linked (cannot happen)
  Unlink(i, it->second);
  if (it->second.least == kNil) lists_.erase(it);
}

void MetadataIndex::Unlink(uint32_t i, List& list) {
  Record& l = record(i);
  if (l.prev != kNil) {
    record(l.prev).next = l.next;
  } else {
    list.least = l.next;
  }
  if (l.next != kNil) {
    record(l.next).prev = l.prev;
  } else {
    list.most = l.prev;
  }
  l.prev = l.next = kNil;
}

bool MetadataIndex::Touch(absl::string_view key, uint32_t read_tick) {
  const uint32_t i = Lookup(key);
  if (i == kNil) return false;
  TouchRecord(i, read_tick);
  return true;
}

size_t MetadataIndex::TouchPrefix(const std::vector<absl::string_view>& keys,
                                  uint32_t read_tick) {
  std::vector<uint32_t> found;
  found.reserve(keys.size());
  for (absl::string_view key : keys) {
    const uint32_t i = Lookup(key);
    if (i != kNil) found.push_back(i);
  }
  TouchRecords(found, read_tick);
  return found.size();
}

uint32_t MetadataIndex::TouchRecords(absl::Span<const uint32_t> records,
                                     uint32_t read_tick) {
  uint32_t before = 0;
  for (uint32_t i : records) before = std::max(before, record(i).read_tick);
  for (auto i = records.rbegin(); i != records.rend(); ++i) {
    if (LocalParent(*i) == kNil) TouchRecord(*i, read_tick);
  }
  for (uint32_t i : records) {
    if (LocalParent(i) != kNil) TouchRecord(i, read_tick);
  }
  return before;
}

size_t MetadataIndex::DemoteChain(absl::Span<const absl::string_view> keys) {
  size_t moved = 0;
  uint32_t child = kNil;  // the entry below the next one up: moved or kept
  for (size_t k = keys.size(); k-- > 0;) {
    const uint32_t i = Lookup(keys[k]);
    if (i == kNil) {
      if (child == kNil) continue;  // the tail is gone already
      break;
    }
    if (cross_children_.contains(i)) break;  // the chain goes on elsewhere
    auto list = lists_.find(NodeOf(i));
    const Record& l = record(i);
    if (list == lists_.end() ||
        (l.prev == kNil && l.next == kNil && list->second.least != i)) {
      break;  // on no list (loading)
    }
    const uint32_t children = ChildCount(i);
    if (child == kNil) {
      // The last present key: a tail goes to the least recent end; one
      // child (the head of a run demoted before: a long chain comes in
      // runs, tail first, each ending with the next run's head) stays.
      if (children > 1) break;
      if (children == 0 && list->second.least != i) {
        Unlink(i, list->second);
        LinkLeastRecent(i, list->second);
        ++moved;
      }
      if (track_ended_) ended_.insert(i);
    } else {
      if (children != 1 || LocalParent(child) != i) break;
      if (record(child).next != i) {
        Unlink(i, list->second);
        LinkAbove(i, child, list->second);
        ++moved;
      }
      if (track_ended_) ended_.insert(i);
    }
    child = i;
  }
  return moved;
}

void MetadataIndex::TouchRecord(uint32_t i, uint32_t read_tick) {
  Record& l = record(i);
  // A linked entry goes just below its parent when the parent is on the
  // same list. (An orphan's parent may be a ghost, on no list: the orphan
  // is touched as a root.) A parent that is the entry's more recent
  // neighbour is on the list, so the common case reads no other record.
  const bool below_parent =
      !l.cross() && l.parent != kNil &&
      (l.next == l.parent || record(l.parent).has_key());
  if (!below_parent || l.next != l.parent) {
    const uint32_t node_id = NodeOf(i);
    auto list = lists_.find(node_id);
    if (list == lists_.end()) {
      LinkMostRecent(i, node_id);  // not linked (cannot happen)
    } else if (below_parent) {
      Unlink(i, list->second);
      LinkBelow(i, l.parent, list->second);
    } else if (list->second.most != i) {
      // Not the most recent, so the list keeps at least one other record.
      Unlink(i, list->second);
      LinkMostRecent(i, list->second);
    }
  }
  l.read_tick = read_tick;
  if (!ended_.empty()) ended_.erase(i);  // read again: not ended
  if (track_used_ && !l.used()) {
    l.set_used(true);
    used_.push_back(i);
  }
}

std::optional<uint32_t> MetadataIndex::ReadTick(absl::string_view key) const {
  const uint32_t i = Lookup(key);
  if (i == kNil) return std::nullopt;
  return record(i).read_tick;
}

void MetadataIndex::ForEachLeastRecent(
    uint32_t node_id,
    const std::function<bool(absl::string_view, const ObjectLocation&, uint32_t)>&
        fn) const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return;
  for (uint32_t i = it->second.least; i != kNil;) {
    const uint32_t next = record(i).next;
    if (!fn(KeyOf(i), EntryOf(i), record(i).read_tick)) return;
    i = next;
  }
}

MetadataIndex::WalkEnd MetadataIndex::PickEvictions(
    uint32_t node_id, size_t max_scan,
    const std::function<Verdict(absl::string_view, const ObjectLocation&,
                                uint32_t)>& judge,
    const std::function<bool(absl::string_view, const ObjectLocation&)>& take)
    const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return WalkEnd::kListEnd;
  // Children chosen so far, per parent; entries passed over because they
  // still had children (only after an Adopt are children more recent).
  absl::flat_hash_map<uint32_t, uint32_t> chosen_children;
  absl::flat_hash_set<uint32_t> deferred;
  size_t scanned = 0;
  for (uint32_t i = it->second.least; i != kNil; i = record(i).next) {
    if (scanned == max_scan) return WalkEnd::kScanLimit;
    ++scanned;
    const Verdict v = judge(KeyOf(i), EntryOf(i), record(i).read_tick);
    if (v == Verdict::kStop) return WalkEnd::kStopped;
    if (v == Verdict::kKeep) continue;
    const uint32_t children = ChildCount(i);
    if (children > 0) {
      auto c = chosen_children.find(i);
      if (c == chosen_children.end() || c->second < children) {
        deferred.insert(i);
        continue;
      }
    }
    // Choose i, then every deferred ancestor it was the last child of.
    for (uint32_t x = i;;) {
      if (!take(KeyOf(x), EntryOf(x))) return WalkEnd::kEnough;
      // A cross-linked parent is on another node's list: not this walk's.
      const uint32_t p = LocalParent(x);
      if (p == kNil) break;
      const uint32_t n = ++chosen_children[p];
      if (n < ChildCount(p) || deferred.erase(p) == 0) break;
      x = p;
    }
  }
  return WalkEnd::kListEnd;
}

MetadataIndex::WalkEnd MetadataIndex::PickEvictionsScored(
    uint32_t node_id, size_t max_scan, size_t pool,
    const std::function<Verdict(absl::string_view, const ObjectLocation&,
                                uint32_t)>& judge,
    const std::function<double(const Candidate&)>& score,
    const std::function<bool(absl::string_view, const ObjectLocation&)>& take)
    const {
  auto it = lists_.find(node_id);
  if (it == lists_.end()) return WalkEnd::kListEnd;
  if (pool == 0) pool = 1;
  absl::flat_hash_map<uint32_t, uint32_t> chosen_children;
  // Deferred entries (with children not yet chosen) and their place in
  // the walk.
  absl::flat_hash_map<uint32_t, uint64_t> deferred;
  // The pool: (score, order, record); the lowest score first, then the
  // lowest order: an entry's place in the walk, or for a parent that joins
  // when its last child is chosen, the later of its place and that
  // child's order. That is the order PickEvictions chooses in, so with
  // equal scores the two walks choose the same.
  struct Pooled {
    double score;
    uint64_t order;
    uint32_t record;
    uint32_t depth;          // as in its Candidate
    uint32_t last_use_tick;  // as in its Candidate
    bool operator>(const Pooled& o) const {
      return std::tie(score, order, record) >
             std::tie(o.score, o.order, o.record);
    }
  };
  std::priority_queue<Pooled, std::vector<Pooled>, std::greater<Pooled>> heap;
  // Joins record i; `child`, when i joins because its last child was
  // chosen, saves the walk up the chain (a chain's blocks go tail first,
  // so walking from each would be quadratic in its length).
  auto join = [&](uint32_t i, uint64_t order, const Pooled* child) {
    Candidate c;
    c.key = KeyOf(i);
    c.entry = EntryOf(i);
    c.ended = ended_.contains(i);
    c.last_use_tick = record(i).read_tick;
    if (child != nullptr && child->depth > 0 &&
        child->depth < kMaxScoredDepth &&
        (c.last_use_tick != 0 || record(child->record).read_tick == 0)) {
      // The child's last use, when it had no read of its own, came from
      // above it: from i or above i, the same as i's.
      c.depth = child->depth - 1;
      if (c.last_use_tick == 0) c.last_use_tick = child->last_use_tick;
    } else {
      for (uint32_t p = record(i).parent;
           p != kNil && c.depth < kMaxScoredDepth; p = record(p).parent) {
        ++c.depth;
        if (c.last_use_tick == 0) c.last_use_tick = record(p).read_tick;
      }
    }
    heap.push(Pooled{score(c), order, i, c.depth, c.last_use_tick});
  };
  // Chooses the pool's lowest; false when `take` has enough.
  auto choose = [&]() -> bool {
    const Pooled top = heap.top();
    heap.pop();
    if (!take(KeyOf(top.record), EntryOf(top.record))) return false;
    // A cross-linked parent is on another node's list: not this walk's.
    const uint32_t p = LocalParent(top.record);
    if (p != kNil) {
      const uint32_t n = ++chosen_children[p];
      auto d = deferred.find(p);
      if (n >= ChildCount(p) && d != deferred.end()) {
        const uint64_t place = d->second;
        deferred.erase(d);
        join(p, std::max(place, top.order), &top);
      }
    }
    return true;
  };
  size_t scanned = 0;
  WalkEnd end = WalkEnd::kListEnd;
  for (uint32_t i = it->second.least; i != kNil; i = record(i).next) {
    if (scanned == max_scan) {
      end = WalkEnd::kScanLimit;
      break;
    }
    ++scanned;
    const Verdict v = judge(KeyOf(i), EntryOf(i), record(i).read_tick);
    if (v == Verdict::kStop) {
      end = WalkEnd::kStopped;
      break;
    }
    if (v == Verdict::kKeep) continue;
    const uint32_t children = ChildCount(i);
    if (children > 0) {
      auto c = chosen_children.find(i);
      if (c == chosen_children.end() || c->second < children) {
        deferred.emplace(i, scanned);
        continue;
      }
    }
    join(i, scanned, nullptr);
    while (heap.size() >= pool) {
      if (!choose()) return WalkEnd::kEnough;
    }
  }
  // The walk has ended: choose from what the pool holds.
  while (!heap.empty()) {
    if (!choose()) return WalkEnd::kEnough;
  }
  return end;
}

void MetadataIndex::TrackEnded(bool on) {
  track_ended_ = on;
  if (!on) ended_ = {};
}

std::vector<std::pair<std::string, ObjectLocation>> MetadataIndex::Orphans()
    const {
  std::vector<std::pair<std::string, ObjectLocation>> out;
  if (ghost_count_ == 0) return out;
  // Per record: 0 unknown, 1 reachable, 2 orphan.
  std::vector<uint8_t> state(records_used_, 0);
  std::vector<uint32_t> path;
  // The lists to walk: the ghosts' nodes, then the nodes of orphans'
  // cross-linked children (their descendants there are orphans too).
  std::vector<uint32_t> nodes;
  absl::flat_hash_set<uint32_t> queued;
  for (const auto& [node_id, count] : ghosts_by_node_) {
    nodes.push_back(node_id);
    queued.insert(node_id);
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto list = lists_.find(nodes[n]);
    if (list == lists_.end()) continue;
    for (uint32_t i = list->second.least; i != kNil; i = record(i).next) {
      path.clear();
      uint32_t a = i;
      uint8_t verdict = 1;
      while (a != kNil) {
        if (state[a] != 0) {
          verdict = state[a];
          break;
        }
        if (IsGhost(a)) {
          verdict = 2;
          break;
        }
        path.push_back(a);
        a = record(a).parent;
      }
      for (uint32_t x : path) state[x] = verdict;
      if (verdict != 2) continue;
      out.emplace_back(std::string(KeyOf(i)), EntryOf(i));
      auto cross = cross_children_.find(i);
      if (cross == cross_children_.end()) continue;
      for (const auto& [node, count] : cross->second) {
        if (queued.insert(node).second) nodes.push_back(node);
      }
    }
  }
  return out;
}

void MetadataIndex::TrackUsed(bool on) {
  if (!on) {
    for (size_t k = used_head_; k < used_.size(); ++k) {
      const uint32_t i = used_[k];
      if (i < records_used_) record(i).set_used(false);
    }
    used_.clear();
    used_.shrink_to_fit();
    used_head_ = 0;
  }
  track_used_ = on;
}

std::vector<std::pair<std::string, uint32_t>> MetadataIndex::CollectUsed(
    size_t max) {
  std::vector<std::pair<std::string, uint32_t>> out;
  while (out.size() < max && used_head_ < used_.size()) {
    const uint32_t i = used_[used_head_++];
    Record& l = record(i);
    if (!l.used() || !l.has_key()) continue;
    l.set_used(false);
    out.emplace_back(std::string(KeyOf(i)), l.read_tick);
  }
  if (used_head_ == used_.size()) {
    used_.clear();
    if (used_.capacity() > (size_t{1} << 16)) used_.shrink_to_fit();
    used_head_ = 0;
  } else if (used_head_ > (size_t{1} << 12) && used_head_ > used_.size() / 2) {
    used_.erase(used_.begin(), used_.begin() + used_head_);
    used_head_ = 0;
  }
  return out;
}

void MetadataIndex::RebaseReadTicks(uint32_t shift) {
  for (uint32_t i = 0; i < records_used_; ++i) {
    uint32_t& t = record(i).read_tick;
    t = t > shift ? t - shift : 0;
  }
}

}  // namespace master
}  // namespace hymcache
