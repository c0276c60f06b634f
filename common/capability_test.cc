#include "common/capability.h"

#include <openssl/hmac.h>

#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/thread.h"

namespace hymcache {
namespace {

TEST_CASE("HmacSha256 matches RFC 4231 and OpenSSL's HMAC") {
  // RFC 4231 test case 2.
  HmacSha256 h("Jefe");
  const std::string msg = "what do ya want for nothing?";
  uint8_t out[32];
  h.Mac(msg.data(), msg.size(), out);
  const uint8_t want[32] = {
      0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
      0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
      0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  CHECK(std::memcmp(out, want, 32) == 0);
  // A long key (hashed first) agrees with OpenSSL's one-shot HMAC.
  const std::string key(131, '\xaa');
  HmacSha256 h2(key);
  h2.Mac(msg.data(), msg.size(), out);
  uint8_t ref[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), ref, &len);
  REQUIRE(len == 32);
  CHECK(std::memcmp(out, ref, 32) == 0);
  // Every message length around the one-block fast path (<= 55 bytes) and
  // past it, against OpenSSL's one-shot HMAC.
  std::string long_msg;
  for (int i = 0; i < 200; ++i) long_msg.push_back(static_cast<char>(i * 7));
  for (size_t n = 0; n <= long_msg.size(); ++n) {
    INFO("length " << n);
    h2.Mac(long_msg.data(), n, out);
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const uint8_t*>(long_msg.data()), n, ref, &len);
    CHECK(std::memcmp(out, ref, 32) == 0);
  }
}

TEST_CASE("NewNodeKey is random") {
  auto a = NewNodeKey();
  auto b = NewNodeKey();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->size() == kNodeKeyBytes);
  CHECK(*a != *b);
}

wire::OpDesc OpFor(const CapabilityScope& s, const wire::Capability& c) {
  wire::OpDesc op;
  op.region_id = s.region_id;
  op.addr = s.addr;
  op.length = s.length;
  op.generation = s.generation;
  op.cap = c;
  return op;
}

TEST_CASE("CapabilityVerifier accepts exactly what was signed") {
  const std::string key(32, 'k');
  HmacSha256 mac(key);
  CapabilityScope s;
  s.node_id = 7;
  s.incarnation = 99;
  s.region_id = 1;
  s.addr = 4096;
  s.length = 65536;
  s.generation = 12;
  s.rights = wire::kCapRead;
  s.expires_unix_ms = 1'000'000;
  const wire::Capability cap = SignCapability(mac, s);

  CapabilityVerifier v(absl::Seconds(30));
  // No identity yet: refused.
  CHECK(v.Current().Check(OpFor(s, cap), wire::kCapRead, 0).code() ==
        absl::StatusCode::kPermissionDenied);
  v.SetIdentity(7, 99, key);
  const auto snap = v.Current();
  CHECK(snap.Check(OpFor(s, cap), wire::kCapRead, 999'000).ok());
  // Within the skew allowance after expiry, and not beyond it.
  CHECK(snap.Check(OpFor(s, cap), wire::kCapRead, 1'029'000).ok());
  CHECK(snap.Check(OpFor(s, cap), wire::kCapRead, 1'031'000).code() ==
        absl::StatusCode::kPermissionDenied);
  // A read capability used for a write.
  CHECK(snap.Check(OpFor(s, cap), wire::kCapWrite, 999'000).code() ==
        absl::StatusCode::kPermissionDenied);
  // Rights flipped by the client: the tag no longer matches.
  wire::Capability flipped = cap;
  flipped.rights = wire::kCapWrite;
  CHECK(snap.Check(OpFor(s, flipped), wire::kCapWrite, 999'000).code() ==
        absl::StatusCode::kPermissionDenied);
  // Expiry extended by the client.
  wire::Capability later = cap;
  later.expires_unix_ms += 1'000'000;
  CHECK(snap.Check(OpFor(s, later), wire::kCapRead, 1'500'000).code() ==
        absl::StatusCode::kPermissionDenied);
  // Another generation, address, length, region.
  for (int field = 0; field < 4; ++field) {
    wire::OpDesc op = OpFor(s, cap);
    if (field == 0) op.generation += 1;
    if (field == 1) op.addr += 4096;
    if (field == 2) op.length += 1;
    if (field == 3) op.region_id += 1;
    CHECK(snap.Check(op, wire::kCapRead, 999'000).code() ==
          absl::StatusCode::kPermissionDenied);
  }
  // A forged tag.
  wire::Capability forged = cap;
  forged.tag[0] ^= 1;
  CHECK(snap.Check(OpFor(s, forged), wire::kCapRead, 999'000).code() ==
        absl::StatusCode::kPermissionDenied);
  // Another node (id or incarnation) with the same key; another key.
  CapabilityVerifier other(absl::Seconds(30));
  other.SetIdentity(8, 99, key);
  CHECK(!other.Current().Check(OpFor(s, cap), wire::kCapRead, 999'000).ok());
  other.SetIdentity(7, 100, key);
  CHECK(!other.Current().Check(OpFor(s, cap), wire::kCapRead, 999'000).ok());
  other.SetIdentity(7, 99, std::string(32, 'x'));
  CHECK(!other.Current().Check(OpFor(s, cap), wire::kCapRead, 999'000).ok());
}

TEST_CASE("A check that fails during a registration waits for its identity") {
  const std::string key(32, 'k');
  HmacSha256 mac(key);
  CapabilityScope s;
  s.node_id = 3;
  s.incarnation = 5;
  s.length = 4096;
  s.generation = 1;
  s.rights = wire::kCapRead;
  s.expires_unix_ms = absl::ToUnixMillis(absl::Now() + absl::Minutes(5));
  const wire::Capability cap = SignCapability(mac, s);
  const int64_t now = absl::ToUnixMillis(absl::Now());

  CapabilityVerifier v(absl::Seconds(30));
  // Nothing in flight: no wait, nothing new.
  CapabilityVerifier::Snapshot before = v.Current();
  CHECK_FALSE(v.WaitForIdentityChange(before, absl::InfiniteFuture()));

  // A registration in flight: a refused check waits until it is applied,
  // then passes under the new identity.
  v.BeginIdentityChange();
  before = v.Current();
  CHECK_FALSE(before.Check(OpFor(s, cap), wire::kCapRead, now).ok());
  bool changed = false;
  Thread waiter("id-waiter", [&] {
    changed = v.WaitForIdentityChange(before, absl::InfiniteFuture());
  });
  v.SetIdentity(3, 5, key);
  waiter.Join();
  CHECK(changed);
  CHECK(v.Current().Check(OpFor(s, cap), wire::kCapRead, now).ok());

  // A registration that fails: the wait ends with nothing new.
  v.BeginIdentityChange();
  before = v.Current();
  Thread waiter2("id-waiter2", [&] {
    changed = v.WaitForIdentityChange(before, absl::InfiniteFuture());
  });
  v.AbandonIdentityChange();
  waiter2.Join();
  CHECK_FALSE(changed);

  // One that never ends: the wait is bounded by its deadline.
  v.BeginIdentityChange();
  CHECK_FALSE(v.WaitForIdentityChange(v.Current(),
                                      absl::Now() + absl::Milliseconds(20)));
  v.AbandonIdentityChange();
}

TEST_CASE(
    "A write receipt verifies for exactly its node, extent and generation") {
  const std::string key(kNodeKeyBytes, 'k');
  HmacSha256 mac(key);
  CapabilityVerifier v(absl::Seconds(1));
  v.SetIdentity(7, 3, key);
  wire::OpDesc op;
  op.region_id = 2;
  op.addr = 4096;
  op.length = 100;
  op.generation = 55;
  const wire::Receipt r = v.Current().SignReceipt(op);
  const std::string tag(reinterpret_cast<const char*>(r.tag),
                        wire::kReceiptBytes);
  WriteReceiptScope s{7, 2, 4096, 100, 55};
  CHECK(IsWriteReceipt(mac, s, tag));
  // Any other field, key or length of tag: no.
  for (int f = 0; f < 5; ++f) {
    WriteReceiptScope other = s;
    switch (f) {
      case 0:
        other.node_id = 8;
        break;
      case 1:
        other.region_id = 3;
        break;
      case 2:
        other.addr = 8192;
        break;
      case 3:
        other.length = 101;
        break;
      case 4:
        other.generation = 56;
        break;
    }
    CHECK_FALSE(IsWriteReceipt(mac, other, tag));
  }
  CHECK_FALSE(
      IsWriteReceipt(HmacSha256(std::string(kNodeKeyBytes, 'x')), s, tag));
  CHECK_FALSE(IsWriteReceipt(mac, s, tag.substr(0, 15)));
  CHECK_FALSE(IsWriteReceipt(mac, s, ""));
  // A node with no identity signs nothing valid.
  CapabilityVerifier none(absl::Seconds(1));
  const wire::Receipt z = none.Current().SignReceipt(op);
  CHECK_FALSE(IsWriteReceipt(
      mac, s,
      std::string(reinterpret_cast<const char*>(z.tag), wire::kReceiptBytes)));
}

TEST_CASE("Capability wire encoding round-trips and checks reserved bytes") {
  wire::Capability c;
  c.expires_unix_ms = 123456789;
  c.rights = wire::kCapWrite;
  for (size_t i = 0; i < wire::kCapTagBytes; ++i) c.tag[i] = uint8_t(i * 7);
  uint8_t b[wire::kCapBytes];
  wire::EncodeCapability(c, b);
  auto d = wire::DecodeCapability(b);
  REQUIRE(d.ok());
  CHECK(d->expires_unix_ms == c.expires_unix_ms);
  CHECK(d->rights == c.rights);
  CHECK(std::memcmp(d->tag, c.tag, wire::kCapTagBytes) == 0);
  b[10] = 1;
  CHECK(!wire::DecodeCapability(b).ok());
}

TEST_CASE("NodeProof binds every field") {
  HmacSha256 k(std::string(32, 'a'));
  const std::string p = NodeProof(k, "heartbeat", "n1", 3, 4, 5);
  CHECK(p.size() == kNodeProofBytes);
  CHECK(p == NodeProof(k, "heartbeat", "n1", 3, 4, 5));
  CHECK(p != NodeProof(k, "deregister", "n1", 3, 4, 5));
  CHECK(p != NodeProof(k, "heartbeat", "n2", 3, 4, 5));
  CHECK(p != NodeProof(k, "heartbeat", "n1", 4, 4, 5));
  CHECK(p != NodeProof(k, "heartbeat", "n1", 3, 5, 5));
  CHECK(p != NodeProof(k, "heartbeat", "n1", 3, 4, 6));
  CHECK(p != NodeProof(HmacSha256(std::string(32, 'b')), "heartbeat", "n1", 3,
                       4, 5));
}

}  // namespace
}  // namespace hymcache
