#include "master/standby_confirm_waits.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_reason.h"

namespace hymcache {
namespace master {

absl::Status StandbyConfirmWaitsOptions::Validate() const {
  if (!applied || !wait_applied) {
    return absl::InvalidArgumentError(
        "standby confirm: applied and wait_applied are required");
  }
  if (max_waiting == 0) {
    return absl::InvalidArgumentError(
        "standby confirm: max_waiting must be positive");
  }
  if (deadline_slice <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "standby confirm: deadline_slice must be positive");
  }
  return absl::OkStatus();
}

StandbyConfirmWaits::StandbyConfirmWaits(
    const StandbyConfirmWaitsOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<StandbyConfirmWaits>>
StandbyConfirmWaits::Create(const StandbyConfirmWaitsOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<StandbyConfirmWaits> w(new StandbyConfirmWaits(options));
  StandbyConfirmWaits* raw = w.get();
  auto thread = Thread::Start("standby-confirm", [raw] { raw->Run(); });
  if (!thread.ok()) return thread.status();
  w->thread_ = std::move(thread).value();
  return w;
}

StandbyConfirmWaits::~StandbyConfirmWaits() { Shutdown(); }

bool StandbyConfirmWaits::Answerable(const Question& q,
                                     const StandbyApplied& st, absl::Time now,
                                     absl::Status* answer) {
  if (!st.following || st.db_id != q.db_id) {
    *answer = WithReason(
        absl::FailedPreconditionError(
            st.following
                ? "standby: it follows another leader database than the "
                  "commit's (a failover came between)"
                : "standby: it does not follow a leader past a full copy"),
        StatusReason::kCommitNotConfirmed);
    return true;
  }
  if (st.sequence >= q.sequence) {
    *answer = absl::OkStatus();
    return true;
  }
  if (st.final) {
    *answer = WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "standby: elected holding sequence ", st.sequence, ", not ",
            q.sequence, " (the commit was lost with the old leader)")),
        StatusReason::kCommitNotConfirmed);
    return true;
  }
  if (now >= q.deadline) {
    *answer = absl::DeadlineExceededError(
        absl::StrCat("standby: sequence ", q.sequence, " not applied (at ",
                     st.sequence, ")"));
    return true;
  }
  return false;
}

void StandbyConfirmWaits::Wait(const std::string& db_id, uint64_t sequence,
                               absl::Time deadline, Done done) {
  Question q{db_id, sequence, deadline, std::move(done)};
  const StandbyApplied st = options_.applied();
  absl::Status answer;
  if (Answerable(q, st, absl::Now(), &answer)) {
    q.done(std::move(answer), st.sequence);
    return;
  }
  {
    MutexLock l(&mu_);
    if (!stopping_ && waiting_ < options_.max_waiting) {
      open_.push_back(std::move(q));
      ++waiting_;
      asked_.Signal();
      return;
    }
    answer = stopping_ ? WithReason(absl::FailedPreconditionError(
                                        "standby: no longer standing by"),
                                    StatusReason::kCommitNotConfirmed)
                       : absl::ResourceExhaustedError(
                             absl::StrCat("standby: ", options_.max_waiting,
                                          " confirmations already waiting"));
  }
  q.done(std::move(answer), st.sequence);
}

void StandbyConfirmWaits::Run() {
  for (;;) {
    std::vector<Question> questions;
    {
      MutexLock l(&mu_);
      while (!stopping_ && open_.empty()) asked_.Wait(&mu_);
      if (stopping_) return;
      questions.swap(open_);
    }
    const StandbyApplied st = options_.applied();
    const absl::Time now = absl::Now();
    std::vector<Question> keep;
    std::vector<std::pair<Question, absl::Status>> ready;
    absl::Time earliest = absl::InfiniteFuture();
    for (Question& q : questions) {
      absl::Status answer;
      if (Answerable(q, st, now, &answer)) {
        ready.emplace_back(std::move(q), std::move(answer));
      } else {
        earliest = std::min(earliest, q.deadline);
        keep.push_back(std::move(q));
      }
    }
    {
      MutexLock l(&mu_);
      waiting_ -= ready.size();  // before the answers: waiting() agrees
    }
    // Each answer handed over whole: this thread keeps no reference to it.
    for (auto& [q, answer] : ready) q.done(std::move(answer), st.sequence);
    ready.clear();
    if (keep.empty()) continue;
    {
      MutexLock l(&mu_);
      // Questions asked meanwhile stay after these; order does not matter.
      for (Question& q : keep) open_.push_back(std::move(q));
      if (stopping_) continue;  // answered by Shutdown's sweep below
    }
    options_.wait_applied(st.sequence,
                          std::min(earliest, now + options_.deadline_slice));
  }
}

void StandbyConfirmWaits::Shutdown() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    asked_.SignalAll();
  }
  thread_.Join();
  std::vector<Question> questions;
  {
    MutexLock l(&mu_);
    questions.swap(open_);
    waiting_ = 0;
  }
  const absl::Status gone = WithReason(
      absl::FailedPreconditionError("standby: no longer standing by"),
      StatusReason::kCommitNotConfirmed);
  for (Question& q : questions) q.done(gone, 0);
}

size_t StandbyConfirmWaits::waiting() const {
  MutexLock l(&mu_);
  return waiting_;
}

}  // namespace master
}  // namespace hymcache
