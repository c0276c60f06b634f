// Data-plane capabilities and node keys (docs/security.md).
//
// At registration the master gives each storage node a random 32-byte key
// (NewNodeKey) and keeps it (persisted with the node record). With it:
//   * the master signs a capability for every location it hands out
//     (BatchLookup: read, PutStart: write): HMAC-SHA256 over (node id,
//     incarnation, region, addr, length, generation, rights, expiry),
//     truncated to 128 bits; the node verifies it on every data-plane op
//     (CapabilityVerifier) before touching the object;
//   * the node proves it holds the key on its control RPCs (heartbeat,
//     deregistration, reconciliation, re-registration) with NodeProof, an
//     HMAC over the call and the caller's wall-clock time.
//
// Thread safety: HmacSha256 is immutable after construction and safe for
// concurrent use; CapabilityVerifier is safe for concurrent use without
// external synchronization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/wire.h"

namespace hymcache {

inline constexpr size_t kNodeKeyBytes = 32;
inline constexpr size_t kNodeProofBytes = 32;

// A new random node key of kNodeKeyBytes (OpenSSL RAND_bytes).
// Errors: Internal if the generator fails.
absl::StatusOr<std::string> NewNodeKey();

// HMAC-SHA256 (RFC 2104) under one key, with the key's inner and outer
// blocks hashed once at construction, so a short message costs two SHA-256
// compressions plus the message's.
class HmacSha256 {
 public:
  explicit HmacSha256(absl::string_view key);
  void Mac(const void* data, size_t len, uint8_t out[32]) const;

 private:
  struct State;  // the hashed inner and outer key blocks
  std::shared_ptr<const State> state_;
};

// What one capability authorizes.
struct CapabilityScope {
  uint32_t node_id = 0;
  uint64_t incarnation = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  uint8_t rights = 0;  // wire::kCapRead or wire::kCapWrite
  int64_t expires_unix_ms = 0;
};

// Signs `scope` with the node's key.
wire::Capability SignCapability(const HmacSha256& key,
                                const CapabilityScope& scope);

// What one write receipt confirms: the node `node_id` holds `length`
// bytes at (region_id, addr) written under allocation `generation`
// (wire.h, "Write receipts"). The node signs one for every write it
// completes; the master checks it at PutCommit against the slot it placed.
struct WriteReceiptScope {
  uint32_t node_id = 0;
  uint32_t region_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
};

// Signs `scope` with the node's key.
wire::Receipt SignWriteReceipt(const HmacSha256& key,
                               const WriteReceiptScope& scope);

// Whether `receipt` (any length; only wire::kReceiptBytes is ever valid) is
// the node key's receipt for exactly `scope`. Constant time in the tag.
bool IsWriteReceipt(const HmacSha256& key, const WriteReceiptScope& scope,
                    absl::string_view receipt);

// Constant-time comparison of `n` bytes.
bool TagsEqual(const uint8_t* a, const uint8_t* b, size_t n);

// Proof that the caller holds a node's key, for the master's node RPCs.
// `purpose` names the RPC ("register", "heartbeat", ...); node_id is 0 for
// a registration.
std::string NodeProof(const HmacSha256& key, absl::string_view purpose,
                      absl::string_view name, uint32_t node_id,
                      uint64_t incarnation, int64_t unix_ms);

// The storage node's side: checks each data-plane op against its current
// identity (node id, incarnation, key), set at every registration.
class CapabilityVerifier {
 public:
  // `skew`: how long past its expiry (by this host's clock) a capability is
  // still accepted, for clock differences between master and node.
  explicit CapabilityVerifier(absl::Duration skew) : skew_(skew) {}

  // From now on verifies against this identity (a registration). Ends an
  // identity change begun by BeginIdentityChange.
  void SetIdentity(uint32_t node_id, uint64_t incarnation,
                   absl::string_view key);
  // Whether an identity is set.
  bool HasIdentity() const;

  // One request's view of the identity: verifies its ops without locking.
  class Snapshot {
   public:
    // OK if `op.cap` authorizes `rights` on exactly op's object at
    // `now_unix_ms`. Errors: PermissionDenied (no identity yet, wrong
    // rights, forged or other node's, other object's or generation's,
    // expired).
    absl::Status Check(const wire::OpDesc& op, uint8_t rights,
                       int64_t now_unix_ms) const;
    // The write receipt for `op` (written to its extent) under this
    // identity; all zero without one (no master has registered the node:
    // every write was refused anyway).
    wire::Receipt SignReceipt(const wire::OpDesc& op) const;

   private:
    friend class CapabilityVerifier;
    struct Identity {
      uint32_t node_id;
      uint64_t incarnation;
      HmacSha256 mac;
    };
    std::shared_ptr<const Identity> id_;
    int64_t skew_ms_ = 0;
  };
  Snapshot Current() const;

  // A registration is in flight. The master lists the node (and signs
  // capabilities under the identity the registration sets) a moment before
  // its answer reaches the node, so a capability that fails meanwhile may
  // be valid under the coming identity: WaitForIdentityChange waits it out.
  void BeginIdentityChange();
  // The registration failed: the identity stays as it was.
  void AbandonIdentityChange();
  // If an identity change is in flight, waits until it ends or `deadline`.
  // Returns whether a new identity was set since `seen` (a Snapshot taken
  // before the failed check), i.e. whether checking again may succeed.
  bool WaitForIdentityChange(const Snapshot& seen,
                             absl::Time deadline) const;
  // Threads in WaitForIdentityChange now (for tests).
  int identity_waiters() const;

 private:
  const absl::Duration skew_;
  mutable Mutex mu_;
  mutable CondVar changed_;
  std::shared_ptr<const Snapshot::Identity> id_ ABSL_GUARDED_BY(mu_);
  // Registrations in flight (BeginIdentityChange not yet ended).
  int changing_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int waiters_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
