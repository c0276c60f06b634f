#include "common/leader_election.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace hymcache {

namespace {

// The share of the granted TTL a leader trusts (see the header comment).
constexpr double kTrustedShareOfTtl = 0.8;
// How often a ranking candidate re-reads the others' standings while it
// waits for one that has not ranked the vacancy yet.
constexpr absl::Duration kRankingPoll = absl::Milliseconds(10);

// A candidate's entry under StandingPrefix: "" while it stands by (present,
// not ranking), "<vacated epoch> <position> <group>" once it ranks the
// vacancy of the term of that epoch.
std::string EncodeStanding(int64_t vacated, const CandidateStanding& s) {
  return absl::StrCat(vacated, " ", s.position, " ", s.group);
}

struct RankedStanding {
  int64_t vacated = 0;  // 0: present, not ranking
  CandidateStanding standing;
};

std::optional<RankedStanding> DecodeStanding(absl::string_view value) {
  RankedStanding r;
  if (value.empty()) return r;
  std::vector<absl::string_view> parts =
      absl::StrSplit(value, absl::MaxSplits(' ', 2));
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &r.vacated) ||
      r.vacated <= 0 || !absl::SimpleAtoi(parts[1], &r.standing.position)) {
    return std::nullopt;
  }
  r.standing.group = std::string(parts[2]);
  return r;
}

// Whether candidate `a` (standing `as`) should lead before `b` (`bs`).
bool Outranks(const CandidateStanding& as, absl::string_view a,
              const CandidateStanding& bs, absl::string_view b) {
  if (as.group.empty()) return false;
  if (bs.group.empty()) return true;
  if (as.group != bs.group) return false;
  return as.position > bs.position || (as.position == bs.position && a < b);
}

// The leader key's value: the candidate, and the epoch base it campaigned
// with when that is not 0 (see "Epoch" in the header).
constexpr absl::string_view kBaseField = "\nepoch_base=";

std::string LeaderValue(const std::string& candidate, int64_t base) {
  if (base == 0) return candidate;
  return absl::StrCat(candidate, kBaseField, base);
}

LeaderInfo InfoOf(const mvccpb::KeyValue& kv) {
  LeaderInfo info;
  absl::string_view value = kv.value();
  int64_t base = 0;
  if (size_t at = value.find(kBaseField); at != absl::string_view::npos) {
    if (!absl::SimpleAtoi(value.substr(at + kBaseField.size()), &base) ||
        base < 0) {
      // Not written by an election: read it as a base of 0, like a value
      // without one.
      LOG(WARNING) << "election " << kv.key() << ": bad epoch base in "
                   << absl::CHexEscape(value);
      base = 0;
    }
    value = value.substr(0, at);
  }
  info.candidate = std::string(value);
  info.revision = kv.create_revision();
  info.epoch = base + kv.create_revision();
  info.lease = kv.lease();
  return info;
}

// The epoch base as etcd holds it (see "Epoch" in the header), read for a
// Txn that raises it.
struct EpochBase {
  std::string key;
  int64_t value = 0;         // absent: 0
  int64_t mod_revision = 0;  // absent: 0, as etcd compares it
  int64_t read_at = 0;       // the revision the read was answered at
};

absl::StatusOr<EpochBase> ReadEpochBase(EtcdClient* etcd,
                                        const std::string& election_key,
                                        absl::Time deadline) {
  EpochBase b;
  b.key = EpochBaseKey(election_key);
  etcdserverpb::RangeRequest read;
  read.set_key(b.key);
  auto r = etcd->Range(read, deadline);
  if (!r.ok()) return r.status();
  b.read_at = r->header().revision();
  if (r->kvs_size() > 0) {
    b.mod_revision = r->kvs(0).mod_revision();
    if (!absl::SimpleAtoi(r->kvs(0).value(), &b.value) || b.value < 0) {
      return absl::DataLossError(absl::StrCat(
          "election: ", b.key, " holds ", absl::CHexEscape(r->kvs(0).value()),
          ", not an epoch base"));
    }
  }
  return b;
}

// The base a Txn after `b` must write so that its term's epoch (the base
// plus the Txn's revision, which is above b.read_at) exceeds `floor`.
int64_t BaseAbove(const EpochBase& b, int64_t floor) {
  return std::max(b.value, floor - b.read_at);
}

// Into `txn`: a compare that holds while the base is as `b` read it, and,
// in its success branch, the put of `base` where it differs.
void RaiseBaseInTxn(const EpochBase& b, int64_t base,
                    etcdserverpb::TxnRequest* txn) {
  etcdserverpb::Compare* same = txn->add_compare();
  same->set_key(b.key);
  same->set_target(etcdserverpb::Compare::MOD);
  same->set_result(etcdserverpb::Compare::EQUAL);
  same->set_mod_revision(b.mod_revision);
  if (base != b.value) {
    auto* raise = txn->add_success()->mutable_request_put();
    raise->set_key(b.key);
    raise->set_value(absl::StrCat(base));
  }
}

}  // namespace

absl::Status LeaderElectionOptions::Validate() const {
  if (etcd == nullptr) return absl::InvalidArgumentError("election: no etcd");
  if (key.empty()) return absl::InvalidArgumentError("election: empty key");
  if (candidate.empty()) {
    return absl::InvalidArgumentError("election: empty candidate");
  }
  if (candidate.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError("election: newline in candidate");
  }
  if (lease_ttl < absl::Seconds(1) ||
      absl::Ceil(lease_ttl, absl::Seconds(1)) != lease_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "election: lease_ttl must be whole seconds, at least 1 s (is ",
        absl::FormatDuration(lease_ttl), ")"));
  }
  if (retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("election: retry_interval must be > 0");
  }
  if (ranking_window < absl::ZeroDuration() ||
      ranking_patience < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "election: ranking_window and ranking_patience must be >= 0");
  }
  if (thread_name.empty()) {
    return absl::InvalidArgumentError("election: empty thread_name");
  }
  return absl::OkStatus();
}

etcdserverpb::Compare LeaderElection::FenceCompare(const std::string& key,
                                                   int64_t revision) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::CREATE);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_create_revision(revision);
  return c;
}

LeaderElection::LeaderElection(const LeaderElectionOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

absl::StatusOr<std::unique_ptr<LeaderElection>> LeaderElection::Create(
    const LeaderElectionOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto e = std::unique_ptr<LeaderElection>(new LeaderElection(options));
  LeaderElection* self = e.get();
  EtcdWatchOptions w;
  w.key = options.key;
  w.thread_name = options.thread_name + "-w";
  auto watcher = options.etcd->Watch(
      w, [self](absl::StatusOr<EtcdWatchBatch> b) { self->OnWatch(std::move(b)); });
  if (!watcher.ok()) return watcher.status();
  e->watcher_ = std::move(*watcher);
  auto thread = Thread::Start(options.thread_name, [self] { self->Run(); });
  if (!thread.ok()) return thread.status();
  e->thread_ = std::move(*thread);
  return e;
}

LeaderElection::~LeaderElection() {
  Resign();
  watcher_.reset();
}

void LeaderElection::Resign() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  thread_.Join();
}

void LeaderElection::FreezeForTest() {
  MutexLock l(&mu_);
  frozen_ = true;
  cv_.SignalAll();
}

bool LeaderElection::IsLeader() const {
  MutexLock l(&mu_);
  return leader_ && !key_changed_ && clock_->Now() < valid_until_;
}

std::optional<int64_t> LeaderElection::LeaderEpoch() const {
  MutexLock l(&mu_);
  if (leader_ && !key_changed_ && clock_->Now() < valid_until_) return epoch_;
  return std::nullopt;
}

std::optional<int64_t> LeaderElection::UnendedTermEpoch() const {
  MutexLock l(&mu_);
  if (leader_ || ending_) return epoch_;
  return std::nullopt;
}

std::optional<LeaderInfo> LeaderElection::ObservedLeader() const {
  MutexLock l(&mu_);
  return observed_;
}

LeaderElectionStats LeaderElection::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::Time LeaderElection::RealDeadline(absl::Time t) const {
  // Waits are cut to retry_interval so that a clock moved by a test is
  // noticed promptly.
  return absl::Now() +
         std::clamp(t - clock_->Now(), absl::ZeroDuration(),
                    options_.retry_interval);
}

void LeaderElection::Run() {
  while (true) {
    {
      MutexLock l(&mu_);
      if (stopping_) break;
      if (frozen_) {
        cv_.Wait(&mu_);
        continue;
      }
    }
    if (absl::Status r = RevokeEndedLease(); !r.ok()) {
      VLOG(1) << "election " << options_.key << ": " << r;
      MutexLock l(&mu_);
      if (!stopping_) {
        cv_.WaitWithDeadline(&mu_, absl::Now() + options_.retry_interval);
      }
      continue;
    }
    absl::Status s = Campaign();
    bool leader;
    {
      MutexLock l(&mu_);
      leader = leader_;
    }
    if (leader) {
      WithdrawStanding();  // a leader is no candidate
      Lead();
      // A term that ended without Resign: leave the next campaign to the
      // standbys (they saw the key go) for a retry interval.
      MutexLock l(&mu_);
      if (!stopping_) {
        cv_.WaitWithDeadline(&mu_, absl::Now() + options_.retry_interval);
      }
    } else if (s.ok()) {
      // Until the key is vacant and ranking says to campaign (a leader
      // that appears meanwhile is stood by for, not raced).
      do {
        StandBy();
      } while (!Rank());
    } else {
      VLOG(1) << "election " << options_.key << ": " << s;
      MutexLock l(&mu_);
      if (!stopping_) {
        cv_.WaitWithDeadline(&mu_, absl::Now() + options_.retry_interval);
      }
    }
  }
  WithdrawStanding();
  StepDown(absl::CancelledError("resigned"));
}

absl::Status LeaderElection::RevokeLeaderLease(const LeaderInfo& leader) {
  {
    MutexLock l(&mu_);
    // A leader named like this candidate but under a lease this object
    // never campaigned with is an earlier process of this candidate (a
    // restarted master on the address its predecessor led on).
    if (!observed_.has_value() || !(*observed_ == leader) ||
        leader.lease == 0 ||
        (leader.candidate == options_.candidate &&
         (leader.lease == lease_ || leader.lease == campaign_lease_))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "election ", options_.key, ": ", leader.candidate, " (epoch ",
          leader.epoch,
          ") is not the leader observed, or is this candidate's term"));
    }
  }
  absl::Status r = options_.etcd->LeaseRevoke(
      leader.lease,
      absl::Now() +
          std::min(options_.etcd->options().call_timeout, options_.lease_ttl));
  if (!r.ok() && r.code() != absl::StatusCode::kNotFound) return r;
  LOG(INFO) << "election " << options_.key << ": ended the term of "
            << leader.candidate << " (epoch " << leader.epoch
            << "): revoked its lease " << leader.lease << " (" << r << ")";
  MutexLock l(&mu_);
  if (r.ok()) ++stats_.leaders_revoked;
  return absl::OkStatus();
}

absl::Status LeaderElection::EndTermAbove(int64_t epoch) {
  if (epoch >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "election ", options_.key, ": epoch ", epoch, " is out of range"));
  }
  int64_t revision;
  {
    MutexLock l(&mu_);
    if (!leader_) {
      return absl::FailedPreconditionError(
          absl::StrCat("election ", options_.key, ": not leading"));
    }
    if (epoch <= epoch_) return absl::OkStatus();
    revision = revision_;
    highest_epoch_ = std::max(highest_epoch_, epoch);
  }
  EtcdClient* etcd = options_.etcd;
  const absl::Time deadline = absl::Now() + EtcdCallTimeout();
  auto read = ReadEpochBase(etcd, options_.key, deadline);
  if (!read.ok()) return read.status();
  const int64_t base = BaseAbove(*read, epoch);
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = FenceCompare(options_.key, revision);
  RaiseBaseInTxn(*read, base, &txn);
  txn.add_success()->mutable_request_delete_range()->set_key(options_.key);
  auto r = etcd->Txn(txn, deadline);
  if (!r.ok()) return r.status();
  if (!r->succeeded()) {
    return absl::AbortedError(absl::StrCat(
        "election ", options_.key,
        ": the term ended or the epoch base moved before it was raised"));
  }
  LOG(WARNING) << "election " << options_.key << ": " << options_.candidate
               << " ends its term to lead above epoch " << epoch
               << " (the epoch base is now " << base << ")";
  MutexLock l(&mu_);
  if (base != read->value) ++stats_.epoch_base_raises;
  // The term is over in etcd now: IsLeader() turns false at once, not when
  // the watch reports the deletion (a standby may win meanwhile).
  key_changed_ = true;
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status LeaderElection::RevokeEndedLease() {
  int64_t lease;
  {
    MutexLock l(&mu_);
    lease = unrevoked_lease_;
  }
  if (lease == 0) return absl::OkStatus();
  absl::Status r = options_.etcd->LeaseRevoke(
      lease, absl::Now() + std::min(options_.etcd->options().call_timeout,
                                    options_.lease_ttl));
  if (r.code() == absl::StatusCode::kUnavailable ||
      r.code() == absl::StatusCode::kDeadlineExceeded) {
    return r;  // etcd does not answer yet
  }
  // Revoked, or gone already (NotFound): either way the key is free.
  LOG(INFO) << "election " << options_.key << ": revoked the lease " << lease
            << " of an ended term: " << r;
  MutexLock l(&mu_);
  unrevoked_lease_ = 0;
  return absl::OkStatus();
}

void LeaderElection::ObserveLocked(std::optional<LeaderInfo> leader,
                                   int64_t revision) {
  // The watch may have seen a later change (the key deleted, say) before
  // this answer, read earlier, was applied: keep the newer view.
  if (revision < observed_revision_) return;
  observed_revision_ = revision;
  observed_ = std::move(leader);
  if (observed_) {
    last_leader_epoch_ = observed_->epoch;
    highest_epoch_ = std::max(highest_epoch_, observed_->epoch);
  }
}

absl::Duration LeaderElection::EtcdCallTimeout() const {
  return std::min(options_.etcd->options().call_timeout, options_.lease_ttl);
}

bool LeaderElection::PutStanding(const std::string& value) {
  EtcdClient* etcd = options_.etcd;
  const absl::Time deadline = absl::Now() + EtcdCallTimeout();
  if (standing_lease_ == 0) {
    auto grant = etcd->LeaseGrant(options_.lease_ttl, deadline);
    if (!grant.ok()) {
      VLOG(1) << "election " << options_.key
              << ": standing: " << grant.status();
      return false;
    }
    standing_lease_ = grant->id();
  }
  etcdserverpb::PutRequest put;
  put.set_key(StandingPrefix(options_.key) + options_.candidate);
  put.set_value(value);
  put.set_lease(standing_lease_);
  auto p = etcd->Put(put, deadline);
  if (!p.ok()) {
    // The lease may be gone (expired while etcd was away): a new one next.
    VLOG(1) << "election " << options_.key << ": standing: " << p.status();
    WithdrawStanding();
    return false;
  }
  presence_renew_at_ = absl::Now() + options_.lease_ttl / 3;
  return true;
}

void LeaderElection::KeepPresence() {
  if (!options_.standing || absl::Now() < presence_renew_at_) return;
  if (standing_lease_ == 0) {
    if (!PutStanding("")) {
      presence_renew_at_ = absl::Now() + options_.retry_interval;
    }
    return;
  }
  auto k = options_.etcd->LeaseKeepAliveOnce(standing_lease_,
                                             absl::Now() + EtcdCallTimeout());
  if (k.ok()) {
    presence_renew_at_ = absl::Now() + options_.lease_ttl / 3;
    MutexLock l(&mu_);
    ++stats_.presence_renewals;
  } else {
    standing_lease_ = 0;  // expired, or etcd away: present again next time
    presence_renew_at_ = absl::Now() + options_.retry_interval;
  }
}

bool LeaderElection::Rank() {
  if (!options_.standing) return true;
  int64_t vacated;
  {
    MutexLock l(&mu_);
    if (stopping_ || frozen_) return true;
    if (observed_) return false;
    ++stats_.rankings;
    vacated = last_leader_epoch_;
  }
  const CandidateStanding mine = options_.standing();
  // Ranking is advice: an etcd error campaigns at once.
  if (vacated <= 0 || !PutStanding(EncodeStanding(vacated, mine))) return true;
  const std::string prefix = StandingPrefix(options_.key);
  const absl::Time window_end = absl::Now() + options_.ranking_window;
  std::string better;
  CandidateStanding best;
  while (true) {
    etcdserverpb::RangeRequest range;
    range.set_key(prefix);
    range.set_range_end(EtcdClient::PrefixEnd(prefix));
    auto all = options_.etcd->Range(range, absl::Now() + EtcdCallTimeout());
    if (!all.ok()) {
      VLOG(1) << "election " << options_.key << ": ranking: " << all.status();
      return true;
    }
    // Candidates present but not ranking this vacancy yet are waited for
    // until the window ends; the rest are compared now.
    bool waiting = false;
    better.clear();
    best = mine;
    for (const mvccpb::KeyValue& kv : all->kvs()) {
      absl::string_view name = kv.key();
      name.remove_prefix(std::min(prefix.size(), name.size()));
      if (name == options_.candidate) continue;
      std::optional<RankedStanding> theirs = DecodeStanding(kv.value());
      if (!theirs.has_value() || theirs->vacated > vacated) continue;
      if (theirs->vacated < vacated) {
        waiting = true;
        continue;
      }
      if (Outranks(theirs->standing, name, best,
                   better.empty() ? options_.candidate : better)) {
        better = std::string(name);
        best = theirs->standing;
      }
    }
    if (!waiting || absl::Now() >= window_end) break;
    MutexLock l(&mu_);
    const absl::Time until = std::min(window_end, absl::Now() + kRankingPoll);
    while (!stopping_ && !frozen_ && !observed_ && absl::Now() < until) {
      cv_.WaitWithDeadline(&mu_, until);
    }
    if (stopping_ || frozen_) return true;
    if (observed_) return false;
  }
  if (better.empty()) return true;
  LOG(INFO) << "election " << options_.key << ": " << options_.candidate
            << " (at " << mine.position << " of '" << mine.group
            << "') waits up to "
            << absl::FormatDuration(options_.ranking_patience) << " for "
            << better << " (at " << best.position
            << "), more up to date, to lead";
  MutexLock l(&mu_);
  ++stats_.yielded;
  const absl::Time until = absl::Now() + options_.ranking_patience;
  while (!stopping_ && !frozen_ && !observed_ && absl::Now() < until) {
    cv_.WaitWithDeadline(&mu_, until);
  }
  return stopping_ || frozen_ || !observed_;
}

void LeaderElection::WithdrawStanding() {
  if (standing_lease_ == 0) return;
  options_.etcd->LeaseRevoke(standing_lease_, absl::Now() + EtcdCallTimeout())
      .IgnoreError();  // else it expires with its TTL
  standing_lease_ = 0;
}

absl::Status LeaderElection::Campaign() {
  // The grant's send time is read before the campaign counts, so that one
  // who sees the count (a test moving the clock) moves it after.
  const absl::Time sent = clock_->Now();
  {
    MutexLock l(&mu_);
    ++stats_.campaigns;
  }
  EtcdClient* etcd = options_.etcd;
  auto grant = etcd->LeaseGrant(options_.lease_ttl);
  if (!grant.ok()) return grant.status();
  const int64_t lease = grant->id();
  {
    // Before the Txn: the watch may show the key under this lease before
    // the Txn answers, and RevokeLeaderLease must not take it for an
    // earlier process's.
    MutexLock l(&mu_);
    campaign_lease_ = lease;
  }
  const absl::Duration ttl = absl::Seconds(grant->ttl());
  const absl::Time revoke_by =
      absl::Now() + std::min(etcd->options().call_timeout, options_.lease_ttl);

  // The epoch base (see "Epoch" in the header): etcd's, raised where this
  // candidate knows of a larger epoch than etcd's revision can pass.
  auto read = ReadEpochBase(etcd, options_.key, revoke_by);
  if (!read.ok()) {
    etcd->LeaseRevoke(lease, revoke_by).IgnoreError();
    return read.status();
  }
  int64_t floor = options_.epoch_floor ? options_.epoch_floor() : 0;
  {
    MutexLock l(&mu_);
    floor = std::max(floor, highest_epoch_);
  }
  const int64_t base = BaseAbove(*read, floor);

  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = FenceCompare(options_.key, 0);  // absent
  RaiseBaseInTxn(*read, base, &txn);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(options_.key);
  put->set_value(LeaderValue(options_.candidate, base));
  put->set_lease(lease);
  txn.add_failure()->mutable_request_range()->set_key(options_.key);
  auto r = etcd->Txn(txn);
  if (!r.ok()) {
    // Whether or not it applied, the lease ends the attempt.
    etcd->LeaseRevoke(lease, revoke_by).IgnoreError();
    return r.status();
  }
  int64_t epoch = 0;
  int64_t revision = 0;
  if (r->succeeded()) {
    revision = r->header().revision();
    epoch = base + revision;
    if (base != read->value) {
      LOG(WARNING) << "election " << options_.key << ": raised the epoch base"
                   << " from " << read->value << " to " << base
                   << " (etcd's revision " << revision
                   << " is below the epochs already used, up to " << floor
                   << ": was etcd recreated?)";
      MutexLock l(&mu_);
      ++stats_.epoch_base_raises;
    }
  } else {
    std::optional<LeaderInfo> holder;
    int64_t read_at = r->header().revision();
    if (r->responses_size() > 0 &&
        r->responses(0).response_range().kvs_size() > 0) {
      holder = InfoOf(r->responses(0).response_range().kvs(0));
      read_at = r->responses(0).response_range().kvs(0).mod_revision();
    }
    if (holder && holder->lease == lease) {
      // An earlier attempt of this Txn (retried on another endpoint)
      // applied: this candidate won.
      epoch = holder->epoch;
      revision = holder->revision;
    } else {
      etcd->LeaseRevoke(lease, revoke_by).IgnoreError();
      MutexLock l(&mu_);
      // etcd's revision now: below what was observed only if the etcd
      // cluster was recreated (revisions start over), and then nothing
      // observed before counts.
      if (r->header().revision() < observed_revision_) observed_revision_ = 0;
      // No holder: the key is vacant and the base moved since it was read
      // (another candidate won and its term is over already). Campaigning
      // again reads the new base.
      ObserveLocked(holder, read_at);
      return absl::OkStatus();
    }
  }
  absl::Time valid_until = sent + ttl * kTrustedShareOfTtl;
  absl::Time renew_at = sent + ttl / 3;
  if (clock_->Now() >= renew_at) {
    // The grant or the Txn took a good part of the TTL: etcd lost its
    // quorum while they were in flight and answered once it came back. The
    // lease itself runs from when etcd granted it (and its new raft leader
    // extends every lease), but the term's local deadline counts from when
    // the grant was sent and may be past already: renew once before the
    // term starts, so that it does not start ended (its holder would step
    // down at once, and a master exits when it loses a term it never
    // served). If etcd does not renew it, the attempt ends here.
    const absl::Time resent = clock_->Now();
    auto k = etcd->LeaseKeepAliveOnce(lease, revoke_by);
    if (!k.ok()) {
      etcd->LeaseRevoke(lease, revoke_by).IgnoreError();  // deletes the key
      return absl::UnavailableError(absl::StrCat(
          "won epoch ", epoch, " after ", absl::FormatDuration(resent - sent),
          " but could not renew the lease before its local deadline: ",
          k.status().ToString()));
    }
    valid_until = resent + absl::Seconds(k->ttl()) * kTrustedShareOfTtl;
    renew_at = resent + absl::Seconds(k->ttl()) / 3;
    MutexLock l(&mu_);
    ++stats_.renewals;
  }
  {
    MutexLock l(&mu_);
    leader_ = true;
    epoch_ = epoch;
    revision_ = revision;
    lease_ = lease;
    valid_until_ = valid_until;
    renew_at_ = renew_at;
    key_changed_ = false;
    ObserveLocked(LeaderInfo{.candidate = options_.candidate,
                             .epoch = epoch,
                             .revision = revision,
                             .lease = lease},
                  revision);
    ++stats_.terms_won;
  }
  LOG(INFO) << "election " << options_.key << ": " << options_.candidate
            << " leads at epoch " << epoch << " (lease " << lease << ", TTL "
            << absl::FormatDuration(ttl) << ")";
  if (options_.on_elected) options_.on_elected(epoch);
  return absl::OkStatus();
}

void LeaderElection::Lead() {
  EtcdClient* etcd = options_.etcd;
  absl::Time renew_at;
  int64_t lease, revision;
  {
    MutexLock l(&mu_);
    lease = lease_;
    revision = revision_;
    renew_at = renew_at_;
  }
  while (true) {
    absl::Time valid_until;
    {
      MutexLock l(&mu_);
      while (!stopping_ && !key_changed_ && clock_->Now() < valid_until_ &&
             (frozen_ || clock_->Now() < renew_at)) {
        cv_.WaitWithDeadline(
            &mu_, RealDeadline(frozen_ ? valid_until_
                                       : std::min(renew_at, valid_until_)));
      }
      if (stopping_) return;  // Run steps down
      valid_until = valid_until_;
    }
    bool key_changed;
    {
      MutexLock l(&mu_);
      key_changed = key_changed_;
    }
    if (key_changed) {
      StepDown(absl::AbortedError("the leader key was deleted or replaced"));
      return;
    }
    if (clock_->Now() >= valid_until) {
      StepDown(absl::DeadlineExceededError(
          "the lease was not renewed within its TTL"));
      return;
    }
    const absl::Time sent = clock_->Now();
    const absl::Time call_deadline = absl::Now() + (valid_until - sent);
    auto r = etcd->LeaseKeepAliveOnce(lease, call_deadline);
    if (r.ok()) {
      // The key must still be the one this term created (someone may have
      // deleted it, and the watch may be stuck on a frozen member).
      auto kv = etcd->Get(options_.key, call_deadline);
      if (kv.ok() &&
          (!kv->has_value() || (*kv)->create_revision() != revision)) {
        StepDown(absl::AbortedError("the leader key was deleted or replaced"));
        return;
      }
      MutexLock l(&mu_);
      ++stats_.renewals;
      valid_until_ = std::max(
          valid_until_, sent + absl::Seconds(r->ttl()) * kTrustedShareOfTtl);
      renew_at = sent + absl::Seconds(r->ttl()) / 3;
    } else if (r.status().code() == absl::StatusCode::kNotFound) {
      StepDown(r.status());
      return;
    } else {
      MutexLock l(&mu_);
      ++stats_.renewal_failures;
      renew_at = clock_->Now() + options_.retry_interval;
      VLOG(1) << "election " << options_.key << ": renewal failed: "
              << r.status();
    }
  }
}

void LeaderElection::StandBy() {
  while (true) {
    const absl::Time recheck_at =
        absl::Now() + std::max(options_.lease_ttl / 2, options_.retry_interval);
    while (true) {
      // Present among the candidates (ranking: renewed every TTL/3).
      KeepPresence();
      const absl::Time wake = options_.standing
                                  ? std::min(recheck_at, presence_renew_at_)
                                  : recheck_at;
      MutexLock l(&mu_);
      // The watch clears observed_ when it sees the key deleted.
      while (!stopping_ && !frozen_ && observed_ && absl::Now() < wake) {
        cv_.WaitWithDeadline(&mu_, wake);
      }
      if (stopping_ || frozen_ || !observed_) return;
      if (absl::Now() >= recheck_at) break;
    }
    // No word from the watch for a while (it may be stuck on a frozen
    // member): read the key.
    auto kv = options_.etcd->Get(options_.key);
    if (!kv.ok()) continue;
    MutexLock l(&mu_);
    if (!kv->has_value()) {
      observed_.reset();
      return;
    }
    ObserveLocked(InfoOf(**kv), (*kv)->mod_revision());
  }
}

void LeaderElection::StepDown(const absl::Status& why) {
  int64_t epoch, lease;
  bool frozen;
  {
    MutexLock l(&mu_);
    if (!leader_) return;
    leader_ = false;
    ending_ = true;
    epoch = epoch_;
    lease = lease_;
    lease_ = 0;
    frozen = frozen_;
    if (observed_ && observed_->epoch == epoch) observed_.reset();
    ++stats_.terms_lost;
  }
  LOG(WARNING) << "election " << options_.key << ": " << options_.candidate
               << " stops leading at epoch " << epoch << ": " << why;
  if (options_.on_lost) options_.on_lost(epoch, why);
  {
    MutexLock l(&mu_);
    ending_ = false;
  }
  if (!frozen) {
    // So that a standby need not wait for the TTL. When etcd does not
    // answer (no quorum), the key outlives the term, and etcd's new raft
    // leader extends every lease by a TTL when the quorum returns: the
    // revocation is retried before the next campaign (RevokeEndedLease),
    // so that the cluster elects a leader as soon as etcd answers.
    absl::Status r = options_.etcd->LeaseRevoke(
        lease, absl::Now() + std::min(options_.etcd->options().call_timeout,
                                      options_.lease_ttl));
    if (r.code() == absl::StatusCode::kUnavailable ||
        r.code() == absl::StatusCode::kDeadlineExceeded) {
      MutexLock l(&mu_);
      unrevoked_lease_ = lease;
    }
  }
}

void LeaderElection::OnWatch(absl::StatusOr<EtcdWatchBatch> batch) {
  MutexLock l(&mu_);
  if (!batch.ok()) {
    // Compacted: events were missed. The leader re-reads the key at its
    // next renewal; a standby at its next recheck.
    cv_.SignalAll();
    return;
  }
  for (const mvccpb::Event& ev : batch->events) {
    const bool newer_than_term = ev.kv().mod_revision() > revision_;
    if (ev.type() == mvccpb::Event::DELETE) {
      if (!leader_ || newer_than_term) {
        ObserveLocked(std::nullopt, ev.kv().mod_revision());
        key_changed_ = true;
      }
    } else {
      if (leader_ && !newer_than_term) continue;  // this term's own creation
      if (leader_ && ev.kv().create_revision() == revision_) continue;
      ObserveLocked(InfoOf(ev.kv()), ev.kv().mod_revision());
      key_changed_ = true;
    }
  }
  cv_.SignalAll();
}

// ---------------------------------------------------------------- observers

absl::StatusOr<std::optional<LeaderInfo>> ReadLeader(EtcdClient* etcd,
                                                     const std::string& key,
                                                     absl::Time deadline) {
  auto kv = etcd->Get(key, deadline);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<LeaderInfo>();
  return std::optional<LeaderInfo>(InfoOf(**kv));
}

absl::StatusOr<std::unique_ptr<LeaderObserver>> LeaderObserver::Create(
    EtcdClient* etcd, const std::string& key, Callback on_change) {
  if (key.empty()) return absl::InvalidArgumentError("observer: empty key");
  auto o = std::unique_ptr<LeaderObserver>(
      new LeaderObserver(etcd, key, std::move(on_change)));
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  auto r = etcd->Range(req);
  if (!r.ok()) return r.status();
  std::optional<LeaderInfo> leader;
  if (r->kvs_size() > 0) leader = InfoOf(r->kvs(0));
  o->Update(leader);
  if (o->on_change_) o->on_change_(leader);
  EtcdWatchOptions w;
  w.key = key;
  w.start_revision = r->header().revision() + 1;
  w.thread_name = "hym-leader-obs";
  LeaderObserver* self = o.get();
  auto watcher = etcd->Watch(w, [self](absl::StatusOr<EtcdWatchBatch> b) {
    self->OnWatch(std::move(b));
  });
  if (!watcher.ok()) return watcher.status();
  o->watcher_ = std::move(*watcher);
  return o;
}

LeaderObserver::~LeaderObserver() { watcher_.reset(); }

std::optional<LeaderInfo> LeaderObserver::current() const {
  MutexLock l(&mu_);
  return current_;
}

int64_t LeaderObserver::highest_epoch() const {
  MutexLock l(&mu_);
  return highest_epoch_;
}

void LeaderObserver::Update(const std::optional<LeaderInfo>& leader) {
  MutexLock l(&mu_);
  current_ = leader;
  if (leader) highest_epoch_ = std::max(highest_epoch_, leader->epoch);
}

void LeaderObserver::OnWatch(absl::StatusOr<EtcdWatchBatch> batch) {
  if (!batch.ok()) {
    // Events were compacted away: read the key afresh.
    auto leader = ReadLeader(etcd_, key_);
    if (!leader.ok()) {
      LOG(WARNING) << "leader observer " << key_ << ": " << leader.status();
      return;
    }
    Update(*leader);
    if (on_change_) on_change_(*leader);
    return;
  }
  for (const mvccpb::Event& ev : batch->events) {
    std::optional<LeaderInfo> leader;
    if (ev.type() == mvccpb::Event::PUT) leader = InfoOf(ev.kv());
    Update(leader);
    if (on_change_) on_change_(leader);
  }
}

}  // namespace hymcache
