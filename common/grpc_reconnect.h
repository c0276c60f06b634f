// ChannelReconnector: carries gRPC channels' connection attempts through
// while no call is waiting on them.
//
// gRPC advances a connection attempt (the TCP connect, the HTTP/2
// handshake) only while some thread polls the channel's sockets. With its
// "epoll1" strategy every thread waiting on any completion queue polls every
// socket of the process, so an attempt always proceeds. With "poll"
// (common/grpc_polling.h) only a thread waiting on a call of that channel
// polls them, and calls fail at once (UNAVAILABLE) while the channel is in
// TRANSIENT_FAILURE: after a master restart nothing polls the new attempt
// but gRPC's backup poller, every 5 s, and each stage of the attempt waits
// for one of its passes (about 9 s in all, measured; never with the backup
// poller off). An engine recomputes for that long.
//
// A caller whose call failed for want of a connection calls Kick(); while
// the channel is then connecting (CONNECTING, or TRANSIENT_FAILURE between
// attempts) a thread of this object waits on the channel's state
// (Channel::NotifyOnStateChange), which polls the channel's sockets and so
// carries the attempts through. A READY channel is not watched: the
// callers' own threads poll it, and nothing else takes their completions;
// nor is an IDLE one (the next call connects it and waits on the attempt).
//
// Under any strategy but "poll" (GrpcPollStrategyInUse when constructed)
// Kick does nothing: there the watch is not needed, and it made "epoll1"
// clients reconnect later (up to the 1 s backoff rather than at the next
// call: measured, not explained).
//
// Thread safety: Kick is safe from any thread. The destructor waits for the
// watch in flight, at most kWatchSlice.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {

class ChannelReconnector {
 public:
  // How long one wait on a channel's state lasts before the state is read
  // again (and the longest the destructor waits).
  static constexpr absl::Duration kWatchSlice = absl::Milliseconds(200);

  explicit ChannelReconnector(
      std::vector<std::shared_ptr<grpc::Channel>> channels);
  ~ChannelReconnector();
  ChannelReconnector(const ChannelReconnector&) = delete;
  ChannelReconnector& operator=(const ChannelReconnector&) = delete;

  // Channel `i` (of those given) may have lost its connection: unless it is
  // READY, keep it connecting until it is. Cheap when the channel is READY
  // or already watched. Out of range: ignored.
  void Kick(size_t i);
  // Kick(i) for every channel.
  void KickAll();

  // Channels being watched now (tests).
  size_t watching() const;

 private:
  // Reads channel i's state (asking it to connect) and, unless READY, waits
  // for it to change on cq_. REQUIRES: !watching_[i], !stopping_.
  void WatchLocked(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();

  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  const bool active_;  // under the "poll" strategy
  grpc::CompletionQueue cq_;

  mutable Mutex mu_;
  std::vector<bool> watching_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // watches queued on cq_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool cq_shut_ ABSL_GUARDED_BY(mu_) = false;
  // Started by the first watch ("grpc-reconnect").
  Thread thread_ ABSL_GUARDED_BY(mu_);
  bool thread_failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hymcache
