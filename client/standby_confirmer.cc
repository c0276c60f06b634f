#include "client/standby_confirmer.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_reason.h"
#include "proto/master.pb.h"
#include "proto/replication.grpc.pb.h"

namespace hymcache {

namespace pb = ::hymcache::v1;

// One commit: answered once every standby it names has answered.
struct StandbyConfirmer::Join {
  std::atomic<int> remaining{0};
  Mutex mu;
  absl::Status result ABSL_GUARDED_BY(mu);
  std::function<void(absl::Status)> done;
};

// One standby, for one leader database.
struct StandbyConfirmer::Target {
  std::string address;
  std::string db_id;
  std::unique_ptr<pb::StandbyConfirm::Stub> stub;  // null: dial failed
  absl::Status dial_error;
  // The highest sequence it said it holds.
  uint64_t confirmed = 0;
  bool in_flight = false;
  // The latest deadline of the commits waiting (the next call's).
  absl::Time latest_deadline = absl::InfinitePast();
  std::multimap<uint64_t, std::shared_ptr<Join>> waiting;
};

struct StandbyConfirmer::Call {
  Target* target = nullptr;
  uint64_t sequence = 0;
  grpc::ClientContext ctx;
  pb::WaitAppliedRequest req;
  pb::WaitAppliedResponse resp;
};

absl::Status StandbyConfirmerOptions::Validate() const {
  if (!dial) {
    return absl::InvalidArgumentError("standby confirmer: dial is required");
  }
  return absl::OkStatus();
}

StandbyConfirmer::StandbyConfirmer(const StandbyConfirmerOptions& options)
    : options_(options) {}

absl::StatusOr<std::shared_ptr<StandbyConfirmer>> StandbyConfirmer::Create(
    const StandbyConfirmerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::shared_ptr<StandbyConfirmer>(new StandbyConfirmer(options));
}

StandbyConfirmer::~StandbyConfirmer() {
  // The channels close here, on the owner's thread: gRPC frees its callback
  // queue twice when the last reference to a channel goes on that queue's
  // own thread.
  MutexLock l(&mu_);
  stopping_ = true;
  while (in_flight_ > 0) idle_.Wait(&mu_);
}

bool StandbyConfirmer::NeedsConfirm(const pb::PutCommitResponse& resp) {
  return resp.confirm_with_size() > 0;
}

StandbyConfirmer::Target* StandbyConfirmer::TargetLocked(
    const std::string& address, const std::string& db_id) {
  std::string key = absl::StrCat(address, "\n", db_id);
  auto it = targets_.find(key);
  if (it != targets_.end()) return it->second.get();
  // A failover leaves the old database's targets idle: drop them once they
  // pile up (each a channel), never one with a call in flight.
  if (targets_.size() >= 64) {
    for (auto t = targets_.begin(); t != targets_.end();) {
      if (!t->second->in_flight && t->second->waiting.empty()) {
        targets_.erase(t++);
      } else {
        ++t;
      }
    }
  }
  auto t = std::make_unique<Target>();
  t->address = address;
  t->db_id = db_id;
  auto channel = options_.dial(address);
  if (channel.ok()) {
    t->stub = pb::StandbyConfirm::NewStub(*channel);
  } else {
    t->dial_error = channel.status();
  }
  Target* raw = t.get();
  targets_.emplace(std::move(key), std::move(t));
  return raw;
}

void StandbyConfirmer::ConfirmAsync(const pb::PutCommitResponse& resp,
                                    absl::Time deadline,
                                    std::function<void(absl::Status)> done) {
  if (resp.confirm_with_size() == 0) {
    done(absl::OkStatus());
    return;
  }
  auto join = std::make_shared<Join>();
  join->remaining.store(resp.confirm_with_size(), std::memory_order_relaxed);
  join->done = std::move(done);
  const uint64_t seq = resp.replication_sequence();
  std::vector<std::pair<std::shared_ptr<Join>, absl::Status>> now;
  std::vector<Call*> send;
  {
    MutexLock l(&mu_);
    for (const std::string& address : resp.confirm_with()) {
      Target* t = TargetLocked(address, resp.replication_db_id());
      if (t->stub == nullptr) {
        now.emplace_back(
            join, absl::UnavailableError(absl::StrCat(
                      "standby ", address, ": ", t->dial_error.message())));
        continue;
      }
      if (t->confirmed >= seq) {
        now.emplace_back(join, absl::OkStatus());
        continue;
      }
      t->waiting.emplace(seq, join);
      t->latest_deadline = std::max(t->latest_deadline, deadline);
      if (Call* c = NextCallLocked(t); c != nullptr) send.push_back(c);
    }
  }
  for (auto& [j, s] : now) Answer(j, s);
  for (Call* c : send) Send(c);
}

absl::Status StandbyConfirmer::Confirm(const pb::PutCommitResponse& resp,
                                       absl::Time deadline) {
  // A Mutex, not absl::Notification: the sanitizers see through ours.
  Mutex mu;
  CondVar answered;
  bool done = false;
  absl::Status out;
  ConfirmAsync(resp, deadline, [&](absl::Status s) {
    MutexLock l(&mu);
    out = std::move(s);
    done = true;
    answered.SignalAll();
  });
  MutexLock l(&mu);
  while (!done) answered.Wait(&mu);
  return out;
}

StandbyConfirmer::Call* StandbyConfirmer::NextCallLocked(Target* t) {
  if (t->in_flight || t->waiting.empty() || stopping_) return nullptr;
  auto* c = new Call;
  c->target = t;
  c->sequence = t->waiting.rbegin()->first;
  c->req.set_db_id(t->db_id);
  c->req.set_sequence(c->sequence);
  c->ctx.set_deadline(absl::ToChronoTime(t->latest_deadline));
  t->in_flight = true;
  ++in_flight_;
  ++stats_.waits_sent;
  return c;
}

void StandbyConfirmer::Send(Call* c) {
  c->target->stub->async()->WaitApplied(
      &c->ctx, &c->req, &c->resp,
      [this, c](grpc::Status status) { OnDone(c, status); });
}

void StandbyConfirmer::OnDone(Call* c, const grpc::Status& status) {
  std::vector<std::pair<std::shared_ptr<Join>, absl::Status>> answered;
  Call* next = nullptr;
  absl::Status per_commit;
  {
    MutexLock l(&mu_);
    Target* t = c->target;
    t->in_flight = false;
    uint64_t upto = c->sequence;
    if (status.ok()) {
      t->confirmed =
          std::max({t->confirmed, c->resp.applied_sequence(), c->sequence});
      upto = t->confirmed;
    } else {
      per_commit = FromGrpcStatus(
          status, absl::StrCat("standby ", t->address, " WaitApplied"));
    }
    for (auto it = t->waiting.begin();
         it != t->waiting.end() && it->first <= upto;) {
      answered.emplace_back(std::move(it->second), per_commit);
      it = t->waiting.erase(it);
    }
    if (stopping_) {  // no next call: answered as if it were unreachable
      for (auto& [seq, join] : t->waiting) {
        answered.emplace_back(std::move(join),
                              absl::CancelledError("standby confirmer closed"));
      }
      t->waiting.clear();
    }
    if (t->waiting.empty()) t->latest_deadline = absl::InfinitePast();
    next = NextCallLocked(t);
  }
  delete c;
  for (auto& [j, s] : answered) Answer(j, s);
  if (next != nullptr) Send(next);
  // The last touch of `this`: the destructor may run once it is released.
  MutexLock l(&mu_);
  if (--in_flight_ == 0) idle_.SignalAll();
}

void StandbyConfirmer::Answer(const std::shared_ptr<Join>& join,
                              const absl::Status& status) {
  // What this standby's answer means for the commit.
  absl::Status mine;
  switch (status.code()) {
    case absl::StatusCode::kOk:
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      // It follows another leader database, or leads itself now (elected,
      // maybe without the commit): the commit may be lost.
      mine = WithReason(
          absl::UnavailableError(absl::StrCat(
              "commit not confirmed (store it again): ", status.message())),
          StatusReason::kCommitNotConfirmed);
      break;
    case absl::StatusCode::kDeadlineExceeded: {
      MutexLock l(&mu_);
      ++stats_.timeouts;
      break;
    }
    default: {
      MutexLock l(&mu_);
      ++stats_.unreachable;
      break;
    }
  }
  if (!mine.ok()) {
    MutexLock l(&join->mu);
    if (join->result.ok()) join->result = mine;
  }
  if (join->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  absl::Status result;
  {
    MutexLock l(&join->mu);
    result = join->result;
  }
  {
    MutexLock l(&mu_);
    if (result.ok()) {
      ++stats_.commits_confirmed;
    } else {
      ++stats_.commits_not_confirmed;
    }
  }
  join->done(std::move(result));
}

StandbyConfirmer::Stats StandbyConfirmer::GetStats() const {
  MutexLock l(&mu_);
  return stats_;
}

}  // namespace hymcache
