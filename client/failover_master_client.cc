#include "client/failover_master_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_reason.h"

namespace hymcache {

absl::Status FailoverMasterClientOptions::Validate() const {
  if (addresses.empty() && !leader) {
    return absl::InvalidArgumentError(
        "failover master client: no address and no leader source");
  }
  for (const std::string& a : addresses) {
    if (a.empty()) {
      return absl::InvalidArgumentError(
          "failover master client: an empty address");
    }
  }
  if (!connect) {
    return absl::InvalidArgumentError("failover master client: no connect");
  }
  if (round_pause < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "failover master client: round_pause must be >= 0");
  }
  if (attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "failover master client: attempt_timeout must be > 0");
  }
  return absl::OkStatus();
}

bool ShouldTryAnotherMaster(const absl::Status& s) {
  // CANCELLED too: this client never cancels a call whose answer it
  // returns (it cancels only streams and calls it has given up on), so a
  // CANCELLED answer is the server's: a master that closed with the call
  // taken, as a standby does at its port's hand-over to the elected server
  // beside it (master/master_ha.cc) or a master shutting down.
  // Not a commit the leader answered and its standbys did not confirm: the
  // leader did its part; another master does not know the put.
  if (ReasonOf(s) == StatusReason::kCommitNotConfirmed) return false;
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kCancelled;
}

absl::StatusOr<std::unique_ptr<FailoverMasterClient>>
FailoverMasterClient::Create(FailoverMasterClientOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<FailoverMasterClient> c(
      new FailoverMasterClient(std::move(options)));
  MutexLock l(&c->mu_);
  for (const std::string& a : c->options_.addresses) {
    if (c->IndexOf(a) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("failover master client: cannot connect ", a));
    }
  }
  return c;
}

int FailoverMasterClient::IndexOf(const std::string& address) {
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (masters_[i]->address == address) return static_cast<int>(i);
  }
  auto client = options_.connect(address);
  if (!client.ok() || *client == nullptr) return -1;
  auto m = std::make_unique<Master>();
  m->address = address;
  m->client = std::move(client).value();
  masters_.push_back(std::move(m));
  return static_cast<int>(masters_.size() - 1);
}

MasterClient* FailoverMasterClient::Current(size_t* index) {
  MutexLock l(&mu_);
  if (masters_.empty()) {
    // No list: the leader source names the first master.
    const std::string leader = options_.leader();
    if (leader.empty() || IndexOf(leader) < 0) return nullptr;
    current_ = 0;
  }
  *index = current_;
  return masters_[current_]->client.get();
}

bool FailoverMasterClient::several() const {
  MutexLock l(&mu_);
  return masters_.size() > 1 || static_cast<bool>(options_.leader);
}

bool FailoverMasterClient::Advance(size_t index, const absl::Status& failed,
                                   bool silent) {
  MutexLock l(&mu_);
  ++failovers_;
  const absl::Time now = clock_->Now();
  if (silent) {
    silent_ = index;
    silent_at_ = now;
  }
  if (index != current_) {
    // Another call moved on already: follow it, a round has not passed.
    return false;
  }
  // Right after a leader's host is lost the standbys still name it until
  // its lease runs out: no hint leads back to a master that just went
  // silent.
  const bool recently_silent = now - silent_at_ < kSilentMemory;
  auto usable = [&](int i) {
    return i >= 0 && !(recently_silent && static_cast<size_t>(i) == silent_);
  };
  int next = -1;
  if (std::optional<LeaderHint> hint = LeaderHintOf(failed);
      hint.has_value() && !hint->address.empty() &&
      hint->epoch >= highest_epoch_ &&
      hint->address != masters_[index]->address) {
    highest_epoch_ = hint->epoch;
    next = IndexOf(hint->address);
    if (!usable(next)) next = -1;
  }
  if (next < 0 && options_.leader) {
    const std::string leader = options_.leader();
    if (!leader.empty() && leader != masters_[index]->address) {
      next = IndexOf(leader);
      if (!usable(next)) next = -1;
    }
  }
  if (next < 0) {
    next = static_cast<int>((index + 1) % masters_.size());
    if (!usable(next) && masters_.size() > 2) {
      next = static_cast<int>((next + 1) % masters_.size());
    }
  }
  current_ = static_cast<size_t>(next);
  ++refusals_;
  if (refusals_ >= masters_.size()) {
    refusals_ = 0;
    return true;
  }
  return false;
}

template <typename R, typename F>
R FailoverMasterClient::WithFailover(absl::Time deadline, bool per_attempt,
                                     F&& call) {
  while (true) {
    size_t index = 0;
    MasterClient* master = Current(&index);
    if (master == nullptr) {
      // No master known yet (the leader source names none: an election is
      // on, or etcd has not answered): wait for one within the deadline.
      const absl::Time now = clock_->Now();
      if (now >= deadline) {
        return R(absl::UnavailableError(
            "no master known to lead (the leader source names none)"));
      }
      absl::SleepFor(std::min(options_.round_pause, deadline - now));
      continue;
    }
    const absl::Time attempt_deadline =
        per_attempt
            ? std::min(deadline, clock_->Now() + options_.attempt_timeout)
            : deadline;
    R result = call(master, attempt_deadline);
    absl::Status s;
    if constexpr (std::is_same_v<R, absl::Status>) {
      s = result;
    } else {
      s = result.status();
    }
    if (s.ok()) {
      MutexLock l(&mu_);
      refusals_ = 0;
      return result;
    }
    const bool silent = per_attempt &&
                        s.code() == absl::StatusCode::kDeadlineExceeded &&
                        attempt_deadline < deadline;
    if ((!ShouldTryAnotherMaster(s) && !silent) || clock_->Now() >= deadline) {
      return result;
    }
    if (ReasonOf(s) == StatusReason::kNodesRejoining) {
      // The leader, just elected: its nodes rejoin it within a heartbeat
      // or two. Ask it again, not the others.
      absl::SleepFor(std::min(options_.round_pause, deadline - clock_->Now()));
      continue;
    }
    if (Advance(index, s, silent)) {
      // Every master refused once: nobody leads yet (an election is on).
      absl::SleepFor(std::min(options_.round_pause, deadline - clock_->Now()));
      if (clock_->Now() >= deadline) return result;
    }
  }
}

std::string FailoverMasterClient::current_address() const {
  MutexLock l(&mu_);
  if (masters_.empty()) return "";
  return masters_[current_]->address;
}

int64_t FailoverMasterClient::highest_epoch() const {
  MutexLock l(&mu_);
  return highest_epoch_;
}

uint64_t FailoverMasterClient::failovers() const {
  MutexLock l(&mu_);
  return failovers_;
}

absl::StatusOr<LookupBatch> FailoverMasterClient::Lookup(
    absl::Span<const std::string> keys, LookupIntent intent,
    absl::Time deadline) {
  return WithFailover<absl::StatusOr<LookupBatch>>(
      deadline, true, [&](MasterClient* m, absl::Time d) {
        return m->Lookup(keys, intent, d);
      });
}

// The current master's stream while it answers; chunk by chunk through
// Lookup (with failover) once it refused.
class FailoverMasterClient::Stream final : public LookupStream {
 public:
  // `inner`: the stream on master `index`, started with `inner_deadline`
  // (before `deadline` when another master could answer instead).
  Stream(FailoverMasterClient* parent, absl::Span<const std::string> keys,
         size_t chunk_keys, absl::Time deadline, size_t index,
         absl::Time inner_deadline, std::unique_ptr<LookupStream> inner)
      : parent_(parent),
        keys_(keys),
        chunk_keys_(std::max<size_t>(1, chunk_keys)),
        deadline_(deadline),
        index_(index),
        inner_deadline_(inner_deadline),
        inner_(std::move(inner)) {}

  bool has_next() const override {
    return !cancelled_ && next_ * chunk_keys_ < keys_.size();
  }

  absl::StatusOr<const LookupBatch*> Next(bool block) override {
    if (inner_ != nullptr) {
      absl::StatusOr<const LookupBatch*> r = inner_->Next(block);
      if (r.ok()) {
        if (*r != nullptr) ++next_;
        return r;
      }
      // The stream's attempt timeout passed (it is shorter than the
      // load's deadline): the rest is looked up chunk by chunk, each with
      // its own attempt and failover. A master that answered no chunk at
      // all (frozen, or its host lost: silence, no refusal) is passed over
      // as a unary call's is; one that answered some (a long load) is not.
      const bool timed_out =
          r.status().code() == absl::StatusCode::kDeadlineExceeded &&
          inner_deadline_ < deadline_;
      if (!ShouldTryAnotherMaster(r.status()) && !timed_out) return r;
      inner_->CancelRest();
      inner_.reset();
      if (timed_out && next_ == 0) {
        parent_->Advance(index_, r.status(), /*silent=*/true);
      }
    }
    absl::StatusOr<LookupBatch> b =
        parent_->Lookup(keys_.subspan(next_ * chunk_keys_, chunk_keys_),
                        LookupIntent::kRead, deadline_);
    if (!b.ok()) return b.status();
    batch_ = std::move(b).value();
    ++next_;
    return &batch_;
  }

  void CancelRest() override {
    cancelled_ = true;
    if (inner_ != nullptr) inner_->CancelRest();
  }

 private:
  FailoverMasterClient* const parent_;
  const absl::Span<const std::string> keys_;
  const size_t chunk_keys_;
  const absl::Time deadline_;
  const size_t index_;
  const absl::Time inner_deadline_;
  std::unique_ptr<LookupStream> inner_;
  size_t next_ = 0;  // chunks taken
  bool cancelled_ = false;
  LookupBatch batch_;
};

std::unique_ptr<LookupStream> FailoverMasterClient::StartLookups(
    absl::Span<const std::string> keys, size_t chunk_keys,
    absl::Time deadline) {
  size_t index = 0;
  MasterClient* master = Current(&index);
  // With another master to ask, the stream gets the attempt timeout, as a
  // unary call does.
  const absl::Time inner_deadline =
      several() ? std::min(deadline, clock_->Now() + options_.attempt_timeout)
                : deadline;
  // Without a master yet, chunk by chunk through Lookup (which waits for
  // one).
  return std::make_unique<Stream>(
      this, keys, chunk_keys, deadline, index, inner_deadline,
      master == nullptr
          ? nullptr
          : master->StartLookups(keys, chunk_keys, inner_deadline));
}

absl::StatusOr<PutStartReply> FailoverMasterClient::PutStart(
    const PutStartArgs& args, absl::Time deadline) {
  return WithFailover<absl::StatusOr<PutStartReply>>(
      deadline, true,
      [&](MasterClient* m, absl::Time d) { return m->PutStart(args, d); });
}

absl::Status FailoverMasterClient::PutCommit(
    uint64_t put_id, absl::Span<const uint32_t> failed_indexes,
    absl::Span<const wire::Receipt> receipts, absl::Time deadline) {
  return WithFailover<absl::Status>(
      deadline, false, [&](MasterClient* m, absl::Time d) {
        return m->PutCommit(put_id, failed_indexes, receipts, d);
      });
}

void FailoverMasterClient::PutAbortInBackground(uint64_t put_id) {
  size_t index = 0;
  // No master: none started the put.
  if (MasterClient* master = Current(&index); master != nullptr) {
    master->PutAbortInBackground(put_id);
  }
}

absl::Status FailoverMasterClient::ReportMissing(
    absl::Span<const std::string> keys,
    absl::Span<const ObjectLocation> locations, absl::Time deadline) {
  return WithFailover<absl::Status>(
      deadline, true, [&](MasterClient* m, absl::Time d) {
        return m->ReportMissing(keys, locations, d);
      });
}

absl::StatusOr<std::vector<bool>> FailoverMasterClient::Remove(
    absl::Span<const std::string> keys, absl::Time deadline) {
  return WithFailover<absl::StatusOr<std::vector<bool>>>(
      deadline, true,
      [&](MasterClient* m, absl::Time d) { return m->Remove(keys, d); });
}

absl::StatusOr<ClusterStatus> FailoverMasterClient::GetClusterStatus(
    absl::Time deadline) {
  return WithFailover<absl::StatusOr<ClusterStatus>>(
      deadline, true,
      [&](MasterClient* m, absl::Time d) { return m->GetClusterStatus(d); });
}

absl::StatusOr<PrefixAnswer> FailoverMasterClient::PrefixQuery(
    absl::Span<const std::string> keys, absl::Time deadline) {
  return WithFailover<absl::StatusOr<PrefixAnswer>>(
      deadline, true,
      [&](MasterClient* m, absl::Time d) { return m->PrefixQuery(keys, d); });
}

// A report is a set change: applying it twice leaves the same set.
absl::StatusOr<EngineBlocksReply> FailoverMasterClient::ReportEngineBlocks(
    const EngineBlocksReport& report, absl::Time deadline) {
  return WithFailover<absl::StatusOr<EngineBlocksReply>>(
      deadline, true, [&](MasterClient* m, absl::Time d) {
        return m->ReportEngineBlocks(report, d);
      });
}

}  // namespace hymcache
