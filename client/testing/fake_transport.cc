#include "client/testing/fake_transport.h"

#include <cstring>
#include <utility>

#include "client/testing/fake_master_client.h"
#include "common/wire.h"

namespace hymcache {
namespace {

// Whether `cap` is what the fake master grants for `ref` on `node_id`.
bool Permits(uint32_t node_id, const RemoteRef& ref, uint8_t right) {
  ObjectLocation l;
  l.node_id = node_id;
  l.region_id = ref.region_id;
  l.addr = ref.addr;
  l.length = ref.length;
  l.generation = ref.generation;
  const ObjectCapability want = FakeCapability(l, right);
  return ref.cap.rights == right &&
         std::memcmp(ref.cap.tag, want.tag.data(), sizeof(ref.cap.tag)) == 0;
}

}  // namespace

void FakeTransport::KillNode(uint32_t node_id) {
  MutexLock l(&mu_);
  dead_.insert(node_id);
}

void FakeTransport::SilenceNode(uint32_t node_id) {
  MutexLock l(&mu_);
  silent_.insert(node_id);
}

void FakeTransport::ReviveNode(uint32_t node_id) {
  MutexLock l(&mu_);
  dead_.erase(node_id);
  silent_.erase(node_id);
}

absl::Status FakeTransport::Silence(const PeerInfo& peer, absl::Time deadline) {
  if (silent_.count(peer.node_id) == 0) return absl::OkStatus();
  if (clock_ != nullptr && clock_->Now() < deadline) {
    clock_->Advance(deadline - clock_->Now());
  }
  return absl::DeadlineExceededError("fake transport: the node is silent");
}

void FakeTransport::Forget(uint32_t node_id, uint64_t addr) {
  MutexLock l(&mu_);
  for (auto it = memory_.begin(); it != memory_.end();) {
    if (std::get<0>(it->first) == node_id && std::get<2>(it->first) == addr) {
      it = memory_.erase(it);
    } else {
      ++it;
    }
  }
}

void FakeTransport::AbortNextSessionReadAfter(size_t n) {
  MutexLock l(&mu_);
  abort_after_ = n < 1 ? 1 : n;
}

void FakeTransport::FailNextWriteOp(size_t op, absl::Status s) {
  MutexLock l(&mu_);
  write_failures_[op] = std::move(s);
}

std::vector<size_t> FakeTransport::reads() const {
  MutexLock l(&mu_);
  return reads_;
}

std::vector<size_t> FakeTransport::session_reads() const {
  MutexLock l(&mu_);
  return session_reads_;
}

std::vector<size_t> FakeTransport::writes() const {
  MutexLock l(&mu_);
  return writes_;
}

size_t FakeTransport::prefetched() const {
  MutexLock l(&mu_);
  return prefetched_;
}

std::vector<uint64_t> FakeTransport::released_sessions() const {
  MutexLock l(&mu_);
  return released_;
}

absl::Status FakeTransport::Tick(absl::Time deadline) {
  if (clock_ == nullptr) return absl::OkStatus();
  if (clock_->Now() >= deadline) {
    return absl::DeadlineExceededError("fake transport: deadline");
  }
  clock_->Advance(op_time_);
  return absl::OkStatus();
}

std::vector<absl::Status> FakeTransport::ReadLocked(
    const PeerInfo& peer, absl::Span<const ReadOp> ops, size_t abort_after,
    absl::Time deadline) {
  std::vector<absl::Status> out(ops.size());
  // A transport failure: the rest carry it.
  absl::Status failure = Silence(peer, deadline);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (failure.ok() && dead_.count(peer.node_id) > 0) {
      failure = absl::UnavailableError("fake transport: node is down");
    }
    if (failure.ok() && abort_after > 0 && i >= abort_after) {
      out[i] = absl::AbortedError("fake transport: not staged yet");
      continue;
    }
    if (failure.ok()) failure = Tick(deadline);
    if (!failure.ok()) {
      out[i] = failure;
      continue;
    }
    const ReadOp& op = ops[i];
    if (!Permits(peer.node_id, op.src, wire::kCapRead)) {
      out[i] = absl::PermissionDeniedError("fake transport: capability");
      continue;
    }
    auto it = memory_.find({peer.node_id, op.src.region_id, op.src.addr});
    if (it == memory_.end() || it->second.generation != op.src.generation ||
        it->second.bytes.size() != op.src.length) {
      out[i] = absl::NotFoundError("fake transport: no such object");
      continue;
    }
    std::memcpy(op.dst, it->second.bytes.data(), op.src.length);
  }
  return out;
}

std::vector<absl::Status> FakeTransport::Read(const PeerInfo& peer,
                                              absl::Span<const ReadOp> ops,
                                              absl::Time deadline) {
  MutexLock l(&mu_);
  reads_.push_back(ops.size());
  return ReadLocked(peer, ops, 0, deadline);
}

std::vector<absl::Status> FakeTransport::ReadSession(
    const PeerInfo& peer, uint64_t session, absl::Span<const ReadOp> ops,
    absl::Time deadline) {
  MutexLock l(&mu_);
  session_reads_.push_back(ops.size());
  const size_t abort_after = abort_after_;
  abort_after_ = 0;
  return ReadLocked(peer, ops, abort_after, deadline);
}

std::vector<absl::Status> FakeTransport::Prefetch(
    const PeerInfo& peer, uint64_t session, absl::Span<const RemoteRef> refs,
    absl::Time deadline) {
  MutexLock l(&mu_);
  prefetched_ += refs.size();
  if (absl::Status s = Silence(peer, deadline); !s.ok()) {
    return std::vector<absl::Status>(refs.size(), s);
  }
  if (dead_.count(peer.node_id) > 0) {
    return std::vector<absl::Status>(
        refs.size(), absl::UnavailableError("fake transport: node is down"));
  }
  return std::vector<absl::Status>(refs.size(), absl::OkStatus());
}

absl::Status FakeTransport::Release(const PeerInfo& peer, uint64_t session,
                                    absl::Span<const RemoteRef> refs,
                                    absl::Time deadline) {
  MutexLock l(&mu_);
  released_.push_back(session);
  if (dead_.count(peer.node_id) > 0) {
    return absl::UnavailableError("fake transport: node is down");
  }
  return absl::OkStatus();
}

std::vector<absl::Status> FakeTransport::Write(const PeerInfo& peer,
                                               absl::Span<const WriteOp> ops,
                                               absl::Time deadline) {
  MutexLock l(&mu_);
  writes_.push_back(ops.size());
  std::map<size_t, absl::Status> failures = std::move(write_failures_);
  write_failures_.clear();
  std::vector<absl::Status> out(ops.size());
  absl::Status failure = Silence(peer, deadline);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (failure.ok() && dead_.count(peer.node_id) > 0) {
      failure = absl::UnavailableError("fake transport: node is down");
    }
    if (failure.ok()) failure = Tick(deadline);
    if (!failure.ok()) {
      out[i] = failure;
      continue;
    }
    if (auto f = failures.find(i); f != failures.end()) {
      out[i] = f->second;
      continue;
    }
    const WriteOp& op = ops[i];
    if (!Permits(peer.node_id, op.dst, wire::kCapWrite)) {
      out[i] = absl::PermissionDeniedError("fake transport: capability");
      continue;
    }
    const auto* src = static_cast<const uint8_t*>(op.src);
    memory_[{peer.node_id, op.dst.region_id, op.dst.addr}] =
        Object{op.dst.generation,
               std::vector<uint8_t>(src, src + op.dst.length)};
  }
  return out;
}

std::map<const void*, size_t> FakeTransport::registered() const {
  MutexLock l(&mu_);
  return registered_;
}

size_t FakeTransport::registrations() const {
  MutexLock l(&mu_);
  return registrations_;
}

absl::Status FakeTransport::RegisterMemory(void* data, size_t size) {
  MutexLock l(&mu_);
  if (data == nullptr || size == 0 || registered_.count(data) != 0) {
    return absl::InvalidArgumentError("fake: bad registration");
  }
  registered_[data] = size;
  ++registrations_;
  return absl::OkStatus();
}

absl::Status FakeTransport::UnregisterMemory(void* data) {
  MutexLock l(&mu_);
  if (registered_.erase(data) != 1) {
    return absl::NotFoundError("fake: not registered");
  }
  return absl::OkStatus();
}

}  // namespace hymcache
