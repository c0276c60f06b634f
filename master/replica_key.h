// Replicas of hot prefixes (docs/deployment.md, "Replicas of hot
// prefixes"): a second copy of a committed block on another node, stored
// by its writer (StoreOptions::replicas) for a prefix many sessions share.
//
// A copy is an object of its own in the index, under the block's key with
// kReplicaSuffix appended: so it has its own location, generation,
// capability, chain links (to the copy of its parent, where there is one),
// place in its node's eviction order, and counts against its node's
// capacity and its tenant's quota (the suffix keeps the tenant prefix) like
// any other block. A lookup of a key whose node is not readable (dead, or
// its listing gone while the lookup's prefix still holds) answers with the
// copy, if the copy's node is readable. Removing a key removes its copy;
// storing a key again over one on a dead node drops its copy (the new bytes
// may differ); a copy is committed only over the listing it copied. No
// caller may name a key ending with the suffix (InvalidArgument).
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace hymcache::master {

// "\xff" "HYMREP" "\x01": a random binary key ends with it with
// probability 2^-64.
inline constexpr absl::string_view kReplicaSuffix("\xffHYMREP\x01", 8);

inline bool IsReplicaKey(absl::string_view key) {
  return key.size() > kReplicaSuffix.size() &&
         key.substr(key.size() - kReplicaSuffix.size()) == kReplicaSuffix;
}

// The key under which `key`'s copy is stored.
inline std::string ReplicaKeyOf(absl::string_view key) {
  std::string out;
  out.reserve(key.size() + kReplicaSuffix.size());
  out.append(key.data(), key.size());
  out.append(kReplicaSuffix.data(), kReplicaSuffix.size());
  return out;
}

// The key a copy is of. REQUIRES: IsReplicaKey(replica).
inline absl::string_view PrimaryKeyOf(absl::string_view replica) {
  return replica.substr(0, replica.size() - kReplicaSuffix.size());
}

}  // namespace hymcache::master
