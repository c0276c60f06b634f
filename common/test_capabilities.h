// A fixed node identity and its capability signer, for tests and benchmarks
// that drive a storage node's DataServer without a master. Testonly.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "common/wire.h"

namespace hymcache {

class TestCapabilities {
 public:
  static constexpr uint32_t kNodeId = 1;
  static constexpr uint64_t kIncarnation = 1;

  TestCapabilities() : mac_(Key()), verifier_(absl::Seconds(30)) {
    verifier_.SetIdentity(kNodeId, kIncarnation, Key());
  }

  // One per process, for DataServerOptions::capabilities.
  static TestCapabilities& Get() {
    static auto* caps = new TestCapabilities;
    return *caps;
  }

  static std::string Key() { return std::string(kNodeKeyBytes, 'T'); }

  const CapabilityVerifier* verifier() const { return &verifier_; }

  // The master's capability for (region, addr, length, generation).
  wire::Capability Sign(uint32_t region_id, uint64_t addr, uint64_t length,
                        uint64_t generation, uint8_t rights,
                        absl::Duration lifetime = absl::Minutes(5)) const {
    CapabilityScope s;
    s.node_id = kNodeId;
    s.incarnation = kIncarnation;
    s.region_id = region_id;
    s.addr = addr;
    s.length = length;
    s.generation = generation;
    s.rights = rights;
    s.expires_unix_ms = absl::ToUnixMillis(absl::Now() + lifetime);
    return SignCapability(mac_, s);
  }
  // Whether `receipt` is this node's write receipt for `op`'s extent.
  bool IsReceipt(const wire::OpDesc& op, absl::string_view receipt) const {
    return IsWriteReceipt(
        mac_, {kNodeId, op.region_id, op.addr, op.length, op.generation},
        receipt);
  }
  // Sets op->cap for `rights`.
  void SignOp(wire::OpDesc* op, uint8_t rights) const {
    op->cap = Sign(op->region_id, op->addr, op->length, op->generation, rights);
  }
  // The rights a request of `type` needs.
  static uint8_t RightsFor(wire::FrameType type) {
    return type == wire::FrameType::kWriteRequest ||
                   type == wire::FrameType::kWriteBeginRequest
               ? wire::kCapWrite
               : wire::kCapRead;
  }

 private:
  HmacSha256 mac_;
  CapabilityVerifier verifier_;
};

}  // namespace hymcache
