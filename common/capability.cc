// SHA256_Init and friends: deprecated in OpenSSL 3 but the cheapest way to
// reuse a keyed state (a struct copy, no allocation).
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include "common/capability.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <openssl/rand.h>

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hymcache {
namespace {

using absl::little_endian::Store32;
using absl::little_endian::Store64;

// 53 bytes: with SHA-256's padding it fits one block, so a capability
// costs two compressions (the keyed blocks are precomputed).
constexpr char kCapDomain[4] = {'H', 'C', 'P', '1'};
constexpr size_t kCapMessageBytes = 53;

void CapMessage(const CapabilityScope& s, uint8_t out[kCapMessageBytes]) {
  std::memcpy(out, kCapDomain, 4);
  Store32(out + 4, s.node_id);
  Store32(out + 8, s.region_id);
  Store64(out + 12, s.incarnation);
  Store64(out + 20, s.addr);
  Store64(out + 28, s.length);
  Store64(out + 36, s.generation);
  Store64(out + 44, static_cast<uint64_t>(s.expires_unix_ms));
  out[52] = s.rights;
}

// 36 bytes (one block, as for capabilities), in its own domain, so that
// no capability tag is ever a receipt.
constexpr char kReceiptDomain[4] = {'H', 'W', 'R', '1'};
constexpr size_t kReceiptMessageBytes = 36;

void ReceiptMessage(const WriteReceiptScope& s,
                    uint8_t out[kReceiptMessageBytes]) {
  std::memcpy(out, kReceiptDomain, 4);
  Store32(out + 4, s.node_id);
  Store32(out + 8, s.region_id);
  Store64(out + 12, s.addr);
  Store64(out + 20, s.length);
  Store64(out + 28, s.generation);
}

}  // namespace

struct HmacSha256::State {
  SHA256_CTX inner;
  SHA256_CTX outer;
};

absl::StatusOr<std::string> NewNodeKey() {
  std::string key(kNodeKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()),
                 static_cast<int>(key.size())) != 1) {
    return absl::InternalError("RAND_bytes failed: no node key");
  }
  return key;
}

HmacSha256::HmacSha256(absl::string_view key) {
  uint8_t block[SHA256_CBLOCK] = {};
  if (key.size() > SHA256_CBLOCK) {
    SHA256(reinterpret_cast<const uint8_t*>(key.data()), key.size(), block);
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  auto st = std::make_shared<State>();
  uint8_t pad[SHA256_CBLOCK];
  for (size_t i = 0; i < SHA256_CBLOCK; ++i) pad[i] = block[i] ^ 0x36;
  SHA256_Init(&st->inner);
  SHA256_Update(&st->inner, pad, sizeof(pad));
  for (size_t i = 0; i < SHA256_CBLOCK; ++i) pad[i] = block[i] ^ 0x5c;
  SHA256_Init(&st->outer);
  SHA256_Update(&st->outer, pad, sizeof(pad));
  state_ = std::move(st);
  OPENSSL_cleanse(block, sizeof(block));
  OPENSSL_cleanse(pad, sizeof(pad));
}

namespace {

// The 32-byte digest of a SHA-256 state after its last block.
void StoreDigest(const SHA256_CTX& c, uint8_t out[SHA256_DIGEST_LENGTH]) {
  for (int i = 0; i < 8; ++i) absl::big_endian::Store32(out + 4 * i, c.h[i]);
}

// `len` (<= kOneBlockMessage) bytes after one keyed block, padded to the
// last block as SHA-256 pads: 0x80, zeros, the bit length (big-endian).
constexpr size_t kOneBlockMessage = SHA256_CBLOCK - 9;
void LastBlock(const void* data, size_t len, uint8_t block[SHA256_CBLOCK]) {
  std::memset(block, 0, SHA256_CBLOCK);
  std::memcpy(block, data, len);
  block[len] = 0x80;
  absl::big_endian::Store64(block + SHA256_CBLOCK - 8,
                            uint64_t{SHA256_CBLOCK + len} * 8);
}

}  // namespace

void HmacSha256::Mac(const void* data, size_t len, uint8_t out[32]) const {
  if (len <= kOneBlockMessage) {
    // One compression each for the inner and the outer hash, without
    // SHA256_Update/Final's buffering (a capability's message fits).
    uint8_t block[SHA256_CBLOCK];
    LastBlock(data, len, block);
    SHA256_CTX c = state_->inner;
    SHA256_Transform(&c, block);
    uint8_t ih[SHA256_DIGEST_LENGTH];
    StoreDigest(c, ih);
    LastBlock(ih, sizeof(ih), block);
    c = state_->outer;
    SHA256_Transform(&c, block);
    StoreDigest(c, out);
    return;
  }
  SHA256_CTX c = state_->inner;
  uint8_t ih[SHA256_DIGEST_LENGTH];
  SHA256_Update(&c, data, len);
  SHA256_Final(ih, &c);
  c = state_->outer;
  SHA256_Update(&c, ih, sizeof(ih));
  SHA256_Final(out, &c);
}

wire::Capability SignCapability(const HmacSha256& key,
                                const CapabilityScope& scope) {
  uint8_t msg[kCapMessageBytes];
  CapMessage(scope, msg);
  uint8_t mac[SHA256_DIGEST_LENGTH];
  key.Mac(msg, sizeof(msg), mac);
  wire::Capability c;
  c.expires_unix_ms = scope.expires_unix_ms;
  c.rights = scope.rights;
  std::memcpy(c.tag, mac, wire::kCapTagBytes);
  return c;
}

wire::Receipt SignWriteReceipt(const HmacSha256& key,
                               const WriteReceiptScope& scope) {
  uint8_t msg[kReceiptMessageBytes];
  ReceiptMessage(scope, msg);
  uint8_t mac[SHA256_DIGEST_LENGTH];
  key.Mac(msg, sizeof(msg), mac);
  wire::Receipt r;
  std::memcpy(r.tag, mac, wire::kReceiptBytes);
  return r;
}

bool IsWriteReceipt(const HmacSha256& key, const WriteReceiptScope& scope,
                    absl::string_view receipt) {
  if (receipt.size() != wire::kReceiptBytes) return false;
  const wire::Receipt want = SignWriteReceipt(key, scope);
  return TagsEqual(want.tag, reinterpret_cast<const uint8_t*>(receipt.data()),
                   wire::kReceiptBytes);
}

bool TagsEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

std::string NodeProof(const HmacSha256& key, absl::string_view purpose,
                      absl::string_view name, uint32_t node_id,
                      uint64_t incarnation, int64_t unix_ms) {
  std::string msg = "hymcache-node-proof-v1";
  msg.push_back('\0');
  msg.append(purpose.data(), purpose.size());
  msg.push_back('\0');
  uint8_t n[8];
  Store64(n, name.size());
  msg.append(reinterpret_cast<const char*>(n), 8);
  msg.append(name.data(), name.size());
  uint8_t f[20];
  Store32(f, node_id);
  Store64(f + 4, incarnation);
  Store64(f + 12, static_cast<uint64_t>(unix_ms));
  msg.append(reinterpret_cast<const char*>(f), sizeof(f));
  std::string out(kNodeProofBytes, '\0');
  key.Mac(msg.data(), msg.size(), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void CapabilityVerifier::SetIdentity(uint32_t node_id, uint64_t incarnation,
                                     absl::string_view key) {
  auto id = std::make_shared<const Snapshot::Identity>(
      Snapshot::Identity{node_id, incarnation, HmacSha256(key)});
  MutexLock l(&mu_);
  id_ = std::move(id);
  changing_ = 0;
  changed_.SignalAll();
}

void CapabilityVerifier::BeginIdentityChange() {
  MutexLock l(&mu_);
  ++changing_;
}

void CapabilityVerifier::AbandonIdentityChange() {
  MutexLock l(&mu_);
  if (changing_ > 0) --changing_;
  changed_.SignalAll();
}

bool CapabilityVerifier::WaitForIdentityChange(const Snapshot& seen,
                                               absl::Time deadline) const {
  MutexLock l(&mu_);
  ++waiters_;
  while (changing_ > 0 && id_ == seen.id_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  --waiters_;
  return id_ != seen.id_;
}

int CapabilityVerifier::identity_waiters() const {
  MutexLock l(&mu_);
  return waiters_;
}

bool CapabilityVerifier::HasIdentity() const {
  MutexLock l(&mu_);
  return id_ != nullptr;
}

CapabilityVerifier::Snapshot CapabilityVerifier::Current() const {
  Snapshot s;
  s.skew_ms_ = absl::ToInt64Milliseconds(skew_);
  MutexLock l(&mu_);
  s.id_ = id_;
  return s;
}

absl::Status CapabilityVerifier::Snapshot::Check(const wire::OpDesc& op,
                                                 uint8_t rights,
                                                 int64_t now_unix_ms) const {
  if (id_ == nullptr) {
    return absl::PermissionDeniedError(
        "storage node is not registered: it cannot verify capabilities yet");
  }
  if (op.cap.rights != rights) {
    return absl::PermissionDeniedError(absl::StrCat(
        "capability grants ",
        op.cap.rights == wire::kCapRead    ? "read"
        : op.cap.rights == wire::kCapWrite ? "write"
                                           : "nothing",
        ", the op needs ", rights == wire::kCapRead ? "read" : "write"));
  }
  CapabilityScope s;
  s.node_id = id_->node_id;
  s.incarnation = id_->incarnation;
  s.region_id = op.region_id;
  s.addr = op.addr;
  s.length = op.length;
  s.generation = op.generation;
  s.rights = rights;
  s.expires_unix_ms = op.cap.expires_unix_ms;
  const wire::Capability want = SignCapability(id_->mac, s);
  if (!TagsEqual(want.tag, op.cap.tag, wire::kCapTagBytes)) {
    return absl::PermissionDeniedError(
        "capability does not match this node, object and generation "
        "(forged, another node's, or for another allocation)");
  }
  // After the tag: the expiry is then the master's.
  if (op.cap.expires_unix_ms < now_unix_ms - skew_ms_) {
    return absl::PermissionDeniedError(absl::StrCat(
        "capability expired ", now_unix_ms - op.cap.expires_unix_ms,
        " ms ago; look the object up again"));
  }
  return absl::OkStatus();
}

wire::Receipt CapabilityVerifier::Snapshot::SignReceipt(
    const wire::OpDesc& op) const {
  if (id_ == nullptr) return wire::Receipt();
  WriteReceiptScope s;
  s.node_id = id_->node_id;
  s.region_id = op.region_id;
  s.addr = op.addr;
  s.length = op.length;
  s.generation = op.generation;
  return SignWriteReceipt(id_->mac, s);
}

}  // namespace hymcache
