// StandbyConfirmWaits: a standby master's side of commits the client
// confirms (--replication=confirm; docs/ha.md "Commits the client
// confirms"). The leader answers a PutCommit at once with the store
// sequence it reached and the standbys past their full copy; the client
// then asks each of them (StandbyConfirm.WaitApplied, proto/replication.proto)
// to answer once its store holds that sequence. This object keeps those
// questions until the standby's follower (master/replica_follower.h) has
// applied the sequence, the question's deadline passes, or the standby
// stops standing by, and answers each once.
//
// One named thread ("standby-confirm") waits for the follower while
// questions are open; a question already answerable is answered on the
// caller's thread. The leader does no work for it.
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {
namespace master {

// What the standby's store holds now.
struct StandbyApplied {
  // It follows a leader database past a full copy (else nothing below
  // counts).
  bool following = false;
  // It will apply nothing more: it stopped following to lead (elected).
  // What it holds is what the new leader's store holds, and a sequence
  // beyond it is refused at once.
  bool final = false;
  // That database's identity and the last of its sequences applied.
  std::string db_id;
  uint64_t sequence = 0;
};

struct StandbyConfirmWaitsOptions {
  // The store's state now. Required; cheap, non-blocking.
  std::function<StandbyApplied()> applied;
  // Blocks until the store has applied past sequence `seen`, or until
  // `deadline` (whichever is first; returning early is harmless). Required.
  std::function<void(uint64_t seen, absl::Time deadline)> wait_applied;
  // Questions open at once; more are refused (ResourceExhausted): the
  // service checks no identity. Default: 65536.
  size_t max_waiting = 65536;
  // The longest the thread waits for the follower before it looks at the
  // questions' deadlines again (a question asked while it waits with an
  // earlier deadline is answered at most this late). Default: 5 ms.
  absl::Duration deadline_slice = absl::Milliseconds(5);
  absl::Status Validate() const;
};

class StandbyConfirmWaits {
 public:
  // `status` OK with the applied sequence, or the refusal (see Wait).
  using Done = std::function<void(absl::Status status, uint64_t applied)>;

  // Errors: InvalidArgument (Validate); ResourceExhausted if the thread
  // cannot start.
  static absl::StatusOr<std::unique_ptr<StandbyConfirmWaits>> Create(
      const StandbyConfirmWaitsOptions& options);
  // Shutdown().
  ~StandbyConfirmWaits();
  StandbyConfirmWaits(const StandbyConfirmWaits&) = delete;
  StandbyConfirmWaits& operator=(const StandbyConfirmWaits&) = delete;

  // Answers `done` once: OK when the store holds `sequence` of leader
  // database `db_id`; FailedPrecondition (reason commit_not_confirmed) at
  // once when it does not follow that database past a full copy (another
  // leader's, or none), when it holds less and will apply nothing more
  // (StandbyApplied::final), and when the standby stops standing by
  // (Shutdown) before it does; DeadlineExceeded at `deadline`;
  // ResourceExhausted beyond max_waiting. Runs `done` on the caller's thread
  // when the answer is known at once, else on the "standby-confirm" thread:
  // keep it short and non-blocking.
  void Wait(const std::string& db_id, uint64_t sequence, absl::Time deadline,
            Done done);

  // Answers every open question (FailedPrecondition, as above) and every
  // later one, and joins the thread. Idempotent.
  void Shutdown();

  // Questions open now.
  size_t waiting() const;

 private:
  struct Question {
    std::string db_id;
    uint64_t sequence = 0;
    absl::Time deadline;
    Done done;
  };
  explicit StandbyConfirmWaits(const StandbyConfirmWaitsOptions& options);
  void Run();
  // Whether `q` can be answered given what the store holds at `now`, and
  // then *answer.
  static bool Answerable(const Question& q, const StandbyApplied& st,
                         absl::Time now, absl::Status* answer);

  // Constant after construction.
  const StandbyConfirmWaitsOptions options_;
  Thread thread_;
  mutable Mutex mu_;
  CondVar asked_;  // a question, or shutdown
  std::vector<Question> open_ ABSL_GUARDED_BY(mu_);
  // Questions not yet answered: open_ and those the thread is looking at.
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace master
}  // namespace hymcache
