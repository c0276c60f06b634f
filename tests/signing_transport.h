// A Transport that signs every op with TestCapabilities before handing it
// to the transport it wraps: for tests and benchmarks that drive the
// transports against a DataServer verifying TestCapabilities, without a
// master to hand out capabilities. Testonly.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/transport.h"
#include "common/test_capabilities.h"

namespace hymcache {

class SigningTransport : public Transport {
 public:
  explicit SigningTransport(std::unique_ptr<Transport> inner)
      : inner_(std::move(inner)) {}

  absl::string_view name() const override { return inner_->name(); }
  absl::Status CanReach(const PeerInfo& peer) override {
    return inner_->CanReach(peer);
  }
  absl::Status RegisterMemory(void* data, size_t size) override {
    return inner_->RegisterMemory(data, size);
  }
  absl::Status UnregisterMemory(void* data) override {
    return inner_->UnregisterMemory(data);
  }
  std::vector<absl::Status> Read(const PeerInfo& peer,
                                 absl::Span<const ReadOp> ops,
                                 absl::Time deadline) override {
    std::vector<ReadOp> s(ops.begin(), ops.end());
    for (ReadOp& op : s) Sign(&op.src, wire::kCapRead);
    return inner_->Read(peer, s, deadline);
  }
  std::vector<absl::Status> Prefetch(const PeerInfo& peer, uint64_t session,
                                     absl::Span<const RemoteRef> refs,
                                     absl::Time deadline) override {
    std::vector<RemoteRef> s(refs.begin(), refs.end());
    for (RemoteRef& r : s) Sign(&r, wire::kCapRead);
    return inner_->Prefetch(peer, session, s, deadline);
  }
  std::vector<absl::Status> ReadSession(const PeerInfo& peer, uint64_t session,
                                        absl::Span<const ReadOp> ops,
                                        absl::Time deadline) override {
    std::vector<ReadOp> s(ops.begin(), ops.end());
    for (ReadOp& op : s) Sign(&op.src, wire::kCapRead);
    return inner_->ReadSession(peer, session, s, deadline);
  }
  absl::Status Release(const PeerInfo& peer, uint64_t session,
                       absl::Span<const RemoteRef> refs,
                       absl::Time deadline) override {
    return inner_->Release(peer, session, refs, deadline);
  }
  std::vector<absl::Status> Write(const PeerInfo& peer,
                                  absl::Span<const WriteOp> ops,
                                  absl::Time deadline) override {
    std::vector<WriteOp> s(ops.begin(), ops.end());
    for (WriteOp& op : s) Sign(&op.dst, wire::kCapWrite);
    return inner_->Write(peer, s, deadline);
  }

 private:
  // Ops that already carry a capability (tests of refused ones) keep it.
  static void Sign(RemoteRef* r, uint8_t rights) {
    if (r->cap.rights != 0) return;
    r->cap = TestCapabilities::Get().Sign(r->region_id, r->addr, r->length,
                                          r->generation, rights);
  }

  std::unique_ptr<Transport> inner_;
};

inline std::unique_ptr<Transport> Signed(std::unique_ptr<Transport> t) {
  return std::make_unique<SigningTransport>(std::move(t));
}

}  // namespace hymcache
