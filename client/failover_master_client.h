// A MasterClient over several masters of which one leads (docs/ha.md): each
// call goes to the master that answered last; a call refused with
// UNAVAILABLE (a standby's or a deposed leader's kNotLeader, a master that
// is down) is sent again, within the caller's deadline, to the leader the
// refusal names (common/status_reason.h: LeaderHintOf), else to the next
// master of the list, round after round. Answers from a master that point
// to a leader of an epoch below the highest seen are not followed.
//
// A master that does not answer within attempt_timeout is passed over the
// same way (except for PutCommit). An UNAVAILABLE with reason
// kNodesRejoining (a leader whose nodes have not rejoined it yet, right
// after its election) is asked again after round_pause instead.
//
// A lookup stream (StartLookups) runs on the current master, within the
// attempt timeout when another master could answer; when one of its chunks
// is refused so, or not answered by then, that chunk and the rest are
// looked up one by one through Lookup (with the same failover).
//
// A PutCommit or PutAbort after a failover reaches a master that never
// started the put: it fails (NOT_FOUND) and the store is lost, as a
// store is when its master restarts.
//
// Internal to the client library.
//
// Thread safety: safe for concurrent use.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/master_client.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace hymcache {

struct FailoverMasterClientOptions {
  // The masters' addresses, "host:port". Required: at least one, unless
  // `leader` is given (then the first call goes where it points, waiting
  // within the call's deadline while it names none).
  std::vector<std::string> addresses;
  // Makes the client of one master (called once per address, also for a
  // leader address learned from a refusal). Required.
  std::function<absl::StatusOr<std::unique_ptr<MasterClient>>(
      const std::string& address)>
      connect;
  // Where the leader is now, when the caller knows better than the list
  // (an etcd LeaderObserver): "" when unknown. Asked before each retry.
  // Default: none.
  std::function<std::string()> leader;
  // Pause after every master refused once, before the next round.
  // Default: 50 ms.
  absl::Duration round_pause = absl::Milliseconds(50);
  // How long one master gets to answer a call before the next is tried
  // (a master frozen or cut off answers nothing; a leader answers in
  // milliseconds). Not for PutCommit, which only the master that started
  // the put can answer, nor for the calls of a lookup stream. Default: 1 s.
  absl::Duration attempt_timeout = absl::Seconds(1);
  // The time that deadlines and attempt timeouts are measured against (the
  // pause between rounds is slept in real time). Not owned; must outlive
  // the client. Default: nullptr (Clock::Real()).
  Clock* clock = nullptr;

  // InvalidArgument for neither address nor `leader`, or no `connect`.
  absl::Status Validate() const;
};

// Whether `s` (a master's answer) says to try another master: UNAVAILABLE,
// or CANCELLED (the server closed with the call taken: this client never
// cancels a call whose answer it returns).
bool ShouldTryAnotherMaster(const absl::Status& s);

class FailoverMasterClient final : public MasterClient {
 public:
  // Connects every address (gRPC connects lazily: nothing is dialled here).
  static absl::StatusOr<std::unique_ptr<FailoverMasterClient>> Create(
      FailoverMasterClientOptions options);
  ~FailoverMasterClient() override = default;

  // The address calls go to now ("" before the first master is known).
  std::string current_address() const;
  // The highest leader epoch a refusal named (0: none).
  int64_t highest_epoch() const;
  // Calls sent again to another master since Create.
  uint64_t failovers() const;

  HYMCACHE_MASTER_CLIENT_OVERRIDES

 private:
  class Stream;
  struct Master {
    std::string address;
    std::unique_ptr<MasterClient> client;
  };

  explicit FailoverMasterClient(FailoverMasterClientOptions options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

  // The master calls go to now; nullptr while none is known (no list, and
  // the leader source names none).
  MasterClient* Current(size_t* index);
  // `failed` (the master at `index`) refused a call, or did not answer it
  // in time (`silent`): moves to the leader it names, or the leader the
  // caller's `leader` names, or the next one; for kSilentMemory after a
  // master went silent, none of these leads back to it. Returns whether a
  // whole round has passed without an answer.
  bool Advance(size_t index, const absl::Status& failed, bool silent = false);
  // How long a master that went silent is passed over by hints.
  // (A master's lease outlives its host's loss by up to 1.5 s, and the
  // standbys name it until they see the lease end, about 0.5 s later; the
  // first attempt on it ends 1 s after the loss at the earliest. A live
  // leader wrongly taken for silent is not asked for this long.)
  static constexpr absl::Duration kSilentMemory = absl::Milliseconds(1500);
  // Whether a call could go to another master than the current one.
  bool several() const;
  // Index of `address`, connecting it if new; -1 if it cannot be.
  int IndexOf(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs `call(master, attempt_deadline)` on the current master, then on
  // others while it is refused (or, with `per_attempt`, does not answer
  // by its attempt deadline) and `deadline` allows.
  template <typename R, typename F>
  R WithFailover(absl::Time deadline, bool per_attempt, F&& call);

  const FailoverMasterClientOptions options_;
  Clock* const clock_;

  mutable Mutex mu_;
  // Masters are only ever added (their clients outlive the calls on them).
  std::vector<std::unique_ptr<Master>> masters_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  // The master that last went silent, and when (Advance).
  size_t silent_ ABSL_GUARDED_BY(mu_) = SIZE_MAX;
  absl::Time silent_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Consecutive refusals since the last answer.
  size_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t highest_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failovers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hymcache
