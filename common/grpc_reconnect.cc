#include "common/grpc_reconnect.h"

#include <cstdint>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_polling.h"
#include "glog/logging.h"

namespace hymcache {

ChannelReconnector::ChannelReconnector(
    std::vector<std::shared_ptr<grpc::Channel>> channels)
    : channels_(std::move(channels)),
      active_(GrpcPollStrategyInUse() == "poll"),
      watching_(channels_.size(), false) {}

ChannelReconnector::~ChannelReconnector() {
  Thread thread;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    // No watch is queued after this; the last one to finish shuts the
    // queue down when some are still queued (Run).
    if (pending_ == 0 && !cq_shut_) {
      cq_shut_ = true;
      cq_.Shutdown();
    }
    thread = std::move(thread_);
  }
  if (thread.joinable()) {
    thread.Join();
  } else {
    // No thread ever ran: drain the (empty) queue, as gRPC requires before
    // its destruction.
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
}

void ChannelReconnector::Kick(size_t i) {
  if (!active_ || i >= channels_.size()) return;
  // Not connecting: nothing to do, and no lock taken.
  const grpc_connectivity_state state = channels_[i]->GetState(false);
  if (state != GRPC_CHANNEL_CONNECTING &&
      state != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    return;
  }
  MutexLock l(&mu_);
  if (stopping_ || watching_[i] || thread_failed_) return;
  if (!thread_.joinable()) {
    absl::StatusOr<Thread> t =
        Thread::Start("grpc-reconnect", [this] { Run(); });
    if (!t.ok()) {
      // gRPC's own backup poller still reconnects, later.
      LOG(WARNING) << "no reconnect thread: " << t.status();
      thread_failed_ = true;
      return;
    }
    thread_ = std::move(*t);
  }
  WatchLocked(i);
}

void ChannelReconnector::KickAll() {
  for (size_t i = 0; i < channels_.size(); ++i) Kick(i);
}

size_t ChannelReconnector::watching() const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (bool w : watching_) n += w ? 1 : 0;
  return n;
}

void ChannelReconnector::WatchLocked(size_t i) {
  // Not asking the channel to connect: a call that finds it IDLE does so
  // and polls the attempt itself (the attempt's backoff is gRPC's).
  const grpc_connectivity_state state = channels_[i]->GetState(false);
  if (state != GRPC_CHANNEL_CONNECTING &&
      state != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    return;
  }
  watching_[i] = true;
  ++pending_;
  channels_[i]->NotifyOnStateChange(
      state, absl::ToChronoTime(absl::Now() + kWatchSlice), &cq_,
      reinterpret_cast<void*>(static_cast<uintptr_t>(i)));
}

void ChannelReconnector::Run() {
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
    const size_t i = reinterpret_cast<uintptr_t>(tag);
    MutexLock l(&mu_);
    --pending_;
    watching_[i] = false;
    if (!stopping_) {
      WatchLocked(i);  // again, unless READY now
    } else if (pending_ == 0 && !cq_shut_) {
      cq_shut_ = true;
      cq_.Shutdown();
    }
  }
}

}  // namespace hymcache
