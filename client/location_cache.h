// LocationCache: where this client last found its keys, reused for a short
// while so that a Load of blocks it read a moment ago skips the master.
//
// A Load normally costs two round trips: a lookup at the master, then the
// read at the node. A block read again soon (a shared system prompt read
// by many requests, a hot prefix, a benchmark's re-reads) needs only the
// second. Each Load's lookups (for reading) fill the cache; a Load whose
// every key has a fresh entry reads straight from the nodes.
//
// Why a stale entry can never return another object's bytes: the node
// reads an extent only when the request names it exactly (region, address,
// length and allocation generation: ExtentTable::PinRead) and carries the
// master's capability for exactly that, unexpired. An extent evicted, freed
// or reused for another object has another generation or is gone; the node
// answers NotFound and the Load drops the entries and looks the keys up
// again. What a stale entry can return is the bytes of a key removed within
// the last `ttl` whose extent the node still holds: that key's own bytes
// (blocks are immutable under their key). docs/consistency.md.
//
// Why entries stay short-lived: a lookup for reading leases the blocks
// against eviction for the master's read_lease (5 s) and renews their
// recency; a read from the cache does neither. An entry lives at most `ttl`
// (default 1 s, below the lease), and never past 1 s before its
// capability expires, so the blocks a client keeps reading are looked up
// (leased, renewed) at least once per ttl.
//
// Bounded: at most `max_entries`; inserting into a full cache drops the
// expired entries, then arbitrary ones.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace hymcache {

class LocationCache {
 public:
  // An entry ends this long before its capability expires at the latest,
  // for clock differences between client and node.
  static constexpr absl::Duration kCapabilityMargin = absl::Seconds(1);

  // `max_entries` 0: caches nothing. `clock` is not owned.
  LocationCache(Clock* clock, size_t max_entries, absl::Duration ttl)
      : clock_(clock), max_entries_(max_entries), ttl_(ttl) {}

  bool enabled() const { return max_entries_ > 0; }

  // Remembers that keys[i] is at locations[i], for i < keys.size().
  // REQUIRES: locations.size() >= keys.size().
  void Insert(absl::Span<const std::string> keys,
              absl::Span<const ObjectLocation> locations);

  // Whether every key has a fresh entry; if so, fills `out` with their
  // locations in order. Counts a hit or a miss.
  bool FindAll(absl::Span<const std::string> keys,
               std::vector<ObjectLocation>* out);

  // Forgets `keys` (removed, or refused by their node).
  void Erase(absl::Span<const std::string> keys);

  // Loads answered from the cache, and those that were not (for tests and
  // stats); entries held now.
  uint64_t hits() const;
  uint64_t misses() const;
  size_t size() const;

 private:
  struct Entry {
    ObjectLocation location;
    absl::Time expires;
  };

  Clock* const clock_;
  const size_t max_entries_;
  const absl::Duration ttl_;

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
