#include "client/location_cache.h"

#include <algorithm>

namespace hymcache {

void LocationCache::Insert(absl::Span<const std::string> keys,
                           absl::Span<const ObjectLocation> locations) {
  if (!enabled() || keys.empty()) return;
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const ObjectLocation& loc = locations[i];
    absl::Time expires = now + ttl_;
    if (loc.capability.expires_unix_ms != 0) {
      expires = std::min(expires,
                         absl::FromUnixMillis(loc.capability.expires_unix_ms) -
                             kCapabilityMargin);
    }
    if (expires <= now) continue;
    auto it = entries_.find(keys[i]);
    if (it != entries_.end()) {
      it->second = Entry{loc, expires};
      continue;
    }
    if (entries_.size() >= max_entries_) {
      absl::erase_if(entries_,
                     [now](const auto& e) { return e.second.expires <= now; });
      // Still full: any entry goes (each lives at most ttl anyway).
      if (entries_.size() >= max_entries_) entries_.erase(entries_.begin());
    }
    entries_.emplace(keys[i], Entry{loc, expires});
  }
}

bool LocationCache::FindAll(absl::Span<const std::string> keys,
                            std::vector<ObjectLocation>* out) {
  if (!enabled()) return false;
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  out->clear();
  out->reserve(keys.size());
  for (const std::string& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.expires <= now) {
      out->clear();
      ++misses_;
      return false;
    }
    out->push_back(it->second.location);
  }
  ++hits_;
  return true;
}

void LocationCache::Erase(absl::Span<const std::string> keys) {
  if (!enabled()) return;
  MutexLock l(&mu_);
  for (const std::string& key : keys) entries_.erase(key);
}

uint64_t LocationCache::hits() const {
  MutexLock l(&mu_);
  return hits_;
}

uint64_t LocationCache::misses() const {
  MutexLock l(&mu_);
  return misses_;
}

size_t LocationCache::size() const {
  MutexLock l(&mu_);
  return entries_.size();
}

}  // namespace hymcache
