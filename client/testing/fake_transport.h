// FakeTransport: storage nodes' memory in a map, for unit tests of the
// client (testonly). Writes keep the bytes at <node, region, addr> with
// their generation; reads copy them back (NotFound when absent or of
// another generation). It checks each op's capability against the one
// FakeMasterClient grants (PermissionDenied otherwise), and records calls.
//
// With a Clock, every op first checks its deadline (DeadlineExceeded for it
// and the rest of the call, as a real transport does) and then advances the
// clock by op_time, so a test puts the deadline in the middle of a batch
// without sleeping.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/transport.h"
#include "common/fake_clock.h"
#include "common/mutex.h"

namespace hymcache {

class FakeTransport : public Transport {
 public:
  // `clock` (not owned; may be null: no deadlines) is advanced by `op_time`
  // per op when it is a FakeClock.
  explicit FakeTransport(FakeClock* clock = nullptr,
                         absl::Duration op_time = absl::ZeroDuration())
      : clock_(clock), op_time_(op_time) {}

  // Failure injection.
  // Every op to `node_id` fails with Unavailable (the node died).
  void KillNode(uint32_t node_id);
  // Every call to `node_id` is answered by nothing: it takes until its
  // deadline (the clock is advanced there) and fails with DeadlineExceeded
  // (the node's host was lost).
  void SilenceNode(uint32_t node_id);
  // `node_id` answers again (undoes KillNode and SilenceNode).
  void ReviveNode(uint32_t node_id);
  // The object at <node, addr> is gone (a node that lost it).
  void Forget(uint32_t node_id, uint64_t addr);
  // The next ReadSession answers Aborted for its ops after the first `n`
  // (n >= 1: the first op is never Aborted), writing nothing for them.
  void AbortNextSessionReadAfter(size_t n);
  // Op `op` of the next Write fails with `s` (nothing kept for it).
  void FailNextWriteOp(size_t op, absl::Status s);

  // Records.
  // Ops per Read / ReadSession / Write call, in order.
  std::vector<size_t> reads() const;
  std::vector<size_t> session_reads() const;
  std::vector<size_t> writes() const;
  // Refs announced by Prefetch, and sessions released.
  size_t prefetched() const;
  // Memory registered (RegisterMemory) and not unregistered: start -> size;
  // and how many registrations there were.
  std::map<const void*, size_t> registered() const;
  size_t registrations() const;
  std::vector<uint64_t> released_sessions() const;

  // Transport.
  absl::string_view name() const override { return "fake"; }
  absl::Status RegisterMemory(void* data, size_t size) override;
  absl::Status UnregisterMemory(void* data) override;
  std::vector<absl::Status> Read(const PeerInfo& peer,
                                 absl::Span<const ReadOp> ops,
                                 absl::Time deadline) override;
  std::vector<absl::Status> Prefetch(const PeerInfo& peer, uint64_t session,
                                     absl::Span<const RemoteRef> refs,
                                     absl::Time deadline) override;
  std::vector<absl::Status> ReadSession(const PeerInfo& peer, uint64_t session,
                                        absl::Span<const ReadOp> ops,
                                        absl::Time deadline) override;
  absl::Status Release(const PeerInfo& peer, uint64_t session,
                       absl::Span<const RemoteRef> refs,
                       absl::Time deadline) override;
  std::vector<absl::Status> Write(const PeerInfo& peer,
                                  absl::Span<const WriteOp> ops,
                                  absl::Time deadline) override;

 private:
  using Where = std::tuple<uint32_t, uint32_t, uint64_t>;  // node, region, addr
  struct Object {
    uint64_t generation = 0;
    std::vector<uint8_t> bytes;
  };

  std::vector<absl::Status> ReadLocked(const PeerInfo& peer,
                                       absl::Span<const ReadOp> ops,
                                       size_t abort_after, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK, or DeadlineExceeded when the clock has reached `deadline`; then
  // advances the clock by op_time.
  absl::Status Tick(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a silent node: the clock advanced to `deadline`, DeadlineExceeded;
  // else OK.
  absl::Status Silence(const PeerInfo& peer, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FakeClock* const clock_;
  const absl::Duration op_time_;

  mutable Mutex mu_;
  std::map<Where, Object> memory_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> dead_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> silent_ ABSL_GUARDED_BY(mu_);
  size_t abort_after_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none
  std::map<size_t, absl::Status> write_failures_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> reads_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> session_reads_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> writes_ ABSL_GUARDED_BY(mu_);
  size_t prefetched_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const void*, size_t> registered_ ABSL_GUARDED_BY(mu_);
  size_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache
