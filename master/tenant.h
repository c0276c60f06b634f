// Tenants partition the master's key space (docs/security.md, "Tenants").
//
// The tenant comes from the caller's identity, never from the request: the
// master's RPC adapter qualifies every key a caller sends with the caller's
// tenant before MasterService sees it, so tenant A's lookups, puts and
// removes can only ever name A's keys. The default tenant's keys are stored
// as sent (existing data, the quickstart); every other tenant's key is
//
//   kTenantMarker (8 bytes) | tenant length (1 byte) | tenant | key
//
// A key of the default tenant that begins with kTenantMarker is refused
// (except from admins, who may name any tenant's qualified key, as fsck's
// listings do), so no caller can spell another tenant's key.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hymcache::master {

// "\xff" "HYMTNT" "\x00": a random binary key starts with it with
// probability 2^-64.
inline constexpr absl::string_view kTenantMarker("\xffHYMTNT\0", 8);
inline constexpr absl::string_view kDefaultTenantName = "default";
// Longest tenant name (Authenticator allows 64).
inline constexpr size_t kMaxTenantBytes = 64;
// Most bytes a qualified key adds to the key the caller sent.
inline constexpr size_t kMaxTenantPrefixBytes =
    kTenantMarker.size() + 1 + kMaxTenantBytes;

// Whether `key` carries a tenant prefix (is a qualified key).
inline bool IsQualifiedKey(absl::string_view key) {
  return key.size() > kTenantMarker.size() &&
         key.substr(0, kTenantMarker.size()) == kTenantMarker;
}

// `key` in `tenant`'s key space. REQUIRES: tenant.size() <= kMaxTenantBytes.
inline std::string QualifyKey(absl::string_view tenant, absl::string_view key) {
  if (tenant.empty() || tenant == kDefaultTenantName) return std::string(key);
  std::string out;
  out.reserve(kTenantMarker.size() + 1 + tenant.size() + key.size());
  out.append(kTenantMarker.data(), kTenantMarker.size());
  out.push_back(static_cast<char>(static_cast<uint8_t>(tenant.size())));
  out.append(tenant.data(), tenant.size());
  out.append(key.data(), key.size());
  return out;
}

// The tenant whose key space `key` is in ("default" for unqualified keys
// and for malformed prefixes).
inline absl::string_view TenantOfKey(absl::string_view key) {
  if (!IsQualifiedKey(key)) return kDefaultTenantName;
  const size_t len = static_cast<uint8_t>(key[kTenantMarker.size()]);
  if (len == 0 || key.size() < kTenantMarker.size() + 1 + len) {
    return kDefaultTenantName;
  }
  return key.substr(kTenantMarker.size() + 1, len);
}

}  // namespace hymcache::master
