// The leader's side of standby replication: the followers' bookkeeping and
// waiters, and the blocking stream. A stream served as a synchronous
// service runs on its gRPC handler thread: a full copy from a RocksDB
// snapshot when needed, then the write log from the snapshot's sequence
// (or the follower's) on (master/replication_log.h). A second thread per
// stream reads the follower's acknowledgements. The same stream on a
// completion-queue poller is in replication_follow_call.cc.
#include "master/replication_source.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/transaction_log.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/thread.h"
#include "master/replication_follow_call.h"
#include "master/replication_log.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

namespace {

// Most sent-but-unacknowledged batches remembered per follower for its lag
// time (beyond, the oldest ones, which set the lag, are kept).
constexpr size_t kMaxInFlight = 65536;

}  // namespace

absl::Status ReplicationSourceOptions::Validate() const {
  if (store == nullptr) {
    return absl::InvalidArgumentError("replication source: store is required");
  }
  if (copy_chunk_records == 0 || copy_chunk_bytes == 0 ||
      log_message_bytes == 0) {
    return absl::InvalidArgumentError(
        "replication source: copy chunks must be > 0");
  }
  if (poll_interval <= absl::ZeroDuration() ||
      idle_poll_interval <= absl::ZeroDuration() ||
      heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "replication source: poll and heartbeat intervals must be > 0");
  }
  if (absl::Status s = ValidateReplicationBatchDelay(
          batch_delay, "replication source: batch_delay");
      !s.ok()) {
    return s;
  }
  return ValidateReplicationBatchDelay(ack_wait,
                                       "replication source: ack_wait");
}

absl::Status ValidateReplicationBatchDelay(absl::Duration delay,
                                           absl::string_view what) {
  if (delay >= absl::ZeroDuration() && delay <= kMaxReplicationBatchDelay) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be within [0, ",
                   absl::FormatDuration(kMaxReplicationBatchDelay), "], not ",
                   absl::FormatDuration(delay)));
}

absl::StatusOr<std::unique_ptr<ReplicationSource>> ReplicationSource::Create(
    const ReplicationSourceOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  std::string id;
  rocksdb::Status rs = options.store->db()->GetDbIdentity(id);
  if (!rs.ok() || id.empty()) {
    return absl::InternalError(absl::StrCat(
        "replication source: the store has no identity: ", rs.ToString()));
  }
  if (options.store->db()->GetOptions().WAL_ttl_seconds == 0) {
    LOG(WARNING) << "replication source: the store keeps no write log "
                    "(keep_wal_seconds 0): a follower that falls behind by "
                    "more than the live log takes a full copy";
  }
  std::unique_ptr<ReplicationSource> source(
      new ReplicationSource(options, std::move(id)));
  absl::StatusOr<Thread> t = Thread::Start(
      "repl-deadline", [p = source.get()] { p->ExpireWaiters(); });
  if (!t.ok()) return t.status();
  source->deadline_thread_ = std::move(t).value();
  // Every write wakes the streams, not only the commits that notify.
  options.store->AddWriteListener(source.get(),
                                  [p = source.get()] { p->NotifyWrite(); });
  source->listening_.store(true);
  return source;
}

ReplicationSource::ReplicationSource(const ReplicationSourceOptions& options,
                                     std::string db_id)
    : options_(options),
      clock_(options.clock ? options.clock : Clock::Real()),
      db_id_(std::move(db_id)) {}

ReplicationSource::~ReplicationSource() { Shutdown(); }

uint64_t ReplicationSource::Latest() const {
  return options_.store->db()->GetLatestSequenceNumber();
}

void ReplicationSource::NotifyWrite() {
  {
    MutexLock l(&mu_);
    ++notified_;
    WakeCallsLocked(WakeReason::kWrite);
  }
  changed_.SignalAll();
}

bool ReplicationSource::CommitWaitingLocked() const {
  return !waiters_.empty() || sync_waiting_ > 0;
}

void ReplicationSource::WakeCallsLocked(WakeReason why) {
  for (const auto& [id, call] : calls_) call->Wake(why);
}

absl::Status ReplicationSource::WaitReplicated(uint64_t seq,
                                               absl::Time deadline) {
  NotifyWrite();
  MutexLock l(&mu_);
  ++sync_waiting_;
  batch_cut_.SignalAll();
  WakeCallsLocked(WakeReason::kCommitWaiting);
  absl::Status s;
  for (;;) {
    if (shutdown_) {
      s = absl::UnavailableError("replication source shut down");
      break;
    }
    if (HeldLocked() >= seq) break;
    if (absl::Now() >= deadline) {
      s = absl::DeadlineExceededError(
          absl::StrCat("the standbys do not all hold sequence ", seq, " (",
                       followers_.size(), " following)"));
      break;
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
  --sync_waiting_;
  return s;
}

uint64_t ReplicationSource::HeldLocked() const {
  // The lowest acknowledgement of the followers past their copy: a sequence
  // is held once every such standby holds it, so whichever of them the
  // next election picks has every commit acknowledged to a client.
  bool any = false;
  uint64_t held = 0;
  for (const auto& [id, f] : followers_) {
    if (f->copying) continue;
    held = any ? std::min(held, f->acked) : f->acked;
    any = true;
  }
  return held;
}

std::vector<std::function<void(absl::Status)>>
ReplicationSource::TakeSatisfiedLocked(uint64_t held) {
  std::vector<std::function<void(absl::Status)>> out;
  auto end = waiters_by_seq_.upper_bound(held);
  for (auto it = waiters_by_seq_.begin(); it != end;) {
    auto w = waiters_.find(it->second);
    auto range = waiters_by_deadline_.equal_range(w->second.deadline);
    for (auto d = range.first; d != range.second; ++d) {
      if (d->second == it->second) {
        waiters_by_deadline_.erase(d);
        break;
      }
    }
    out.push_back(std::move(w->second.done));
    waiters_.erase(w);
    it = waiters_by_seq_.erase(it);
  }
  return out;
}

void ReplicationSource::OnReplicated(uint64_t seq, absl::Time deadline,
                                     std::function<void(absl::Status)> done) {
  NotifyWrite();
  absl::Status now;
  {
    MutexLock l(&mu_);
    if (shutdown_) {
      now = absl::UnavailableError("replication source shut down");
    } else if (HeldLocked() >= seq) {
      now = absl::OkStatus();
    } else {
      const uint64_t id = next_waiter_++;
      const bool earliest = waiters_by_deadline_.empty() ||
                            deadline < waiters_by_deadline_.begin()->first;
      waiters_by_seq_.emplace(seq, id);
      waiters_by_deadline_.emplace(deadline, id);
      waiters_.emplace(id, Waiter{seq, deadline, std::move(done)});
      if (earliest) deadlines_changed_.Signal();
      batch_cut_.SignalAll();
      WakeCallsLocked(WakeReason::kCommitWaiting);
      return;
    }
  }
  done(now);
}

size_t ReplicationSource::FollowersPastCopy() const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, f] : followers_) n += f->copying ? 0 : 1;
  return n;
}

std::vector<std::string> ReplicationSource::FollowerNamesPastCopy() const {
  std::vector<std::string> names;
  MutexLock l(&mu_);
  for (const auto& [id, f] : followers_) {
    if (f->copying ||
        std::find(names.begin(), names.end(), f->name) != names.end()) {
      continue;
    }
    names.push_back(f->name);
  }
  return names;
}

void ReplicationSource::ExpireWaiters() {
  for (;;) {
    std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> fired;
    {
      MutexLock l(&mu_);
      for (;;) {
        if (shutdown_) return;  // Shutdown answers the rest
        const absl::Time now = absl::Now();
        if (!waiters_by_deadline_.empty() &&
            waiters_by_deadline_.begin()->first <= now) {
          break;
        }
        deadlines_changed_.WaitWithDeadline(
            &mu_, waiters_by_deadline_.empty()
                      ? absl::InfiniteFuture()
                      : waiters_by_deadline_.begin()->first);
      }
      const absl::Time now = absl::Now();
      while (!waiters_by_deadline_.empty() &&
             waiters_by_deadline_.begin()->first <= now) {
        const uint64_t id = waiters_by_deadline_.begin()->second;
        waiters_by_deadline_.erase(waiters_by_deadline_.begin());
        auto w = waiters_.find(id);
        auto range = waiters_by_seq_.equal_range(w->second.seq);
        for (auto it = range.first; it != range.second; ++it) {
          if (it->second == id) {
            waiters_by_seq_.erase(it);
            break;
          }
        }
        fired.emplace_back(w->second.seq, std::move(w->second.done));
        waiters_.erase(w);
      }
    }
    for (auto& [seq, done] : fired) {
      done(absl::DeadlineExceededError(
          absl::StrCat("the standbys do not all hold sequence ", seq)));
    }
  }
}

void ReplicationSource::Shutdown() {
  // First, and without mu_: a write running the listener takes it.
  if (listening_.exchange(false)) options_.store->RemoveWriteListener(this);
  std::vector<std::function<void(absl::Status)>> waiting;
  {
    MutexLock l(&mu_);
    shutdown_ = true;
    for (const auto& [id, ctx] : contexts_) ctx->TryCancel();
    WakeCallsLocked(WakeReason::kShutdown);
    changed_.SignalAll();
    deadlines_changed_.SignalAll();
    batch_cut_.SignalAll();
    while (!followers_.empty()) changed_.Wait(&mu_);
    for (auto& [id, w] : waiters_) waiting.push_back(std::move(w.done));
    waiters_.clear();
    waiters_by_seq_.clear();
    waiters_by_deadline_.clear();
  }
  for (auto& done : waiting) {
    done(absl::UnavailableError("replication source shut down"));
  }
  deadline_thread_.Join();
}

ReplicationSource::Stats ReplicationSource::GetStats() const {
  const uint64_t latest = Latest();
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  Stats s = counters_;
  s.latest_sequence = latest;
  for (const auto& [id, f] : followers_) {
    FollowerStats fs;
    fs.name = f->name;
    fs.peer = f->peer;
    fs.acked_sequence = f->acked;
    fs.copying = f->copying;
    fs.lag_sequences = latest > f->acked ? latest - f->acked : 0;
    if (!f->in_flight.empty()) fs.lag_time = now - f->in_flight.front().second;
    s.followers.push_back(std::move(fs));
  }
  return s;
}

bool ReplicationSource::WaitForWrites(grpc::ServerContext* ctx, uint64_t next,
                                      absl::Time until) {
  MutexLock l(&mu_);
  for (;;) {
    if (shutdown_ || ctx->IsCancelled()) return false;
    if (Latest() >= next) return true;
    const absl::Time now = absl::Now();
    if (now >= until) return true;
    changed_.WaitWithDeadline(&mu_,
                              std::min(until, now + options_.poll_interval));
  }
}

void ReplicationSource::WaitToBatch(grpc::ServerContext* ctx,
                                    absl::Time last_sent) {
  if (options_.batch_delay <= absl::ZeroDuration()) return;
  const absl::Time until = last_sent + options_.batch_delay;
  if (absl::Now() >= until) return;
  MutexLock l(&mu_);
  while (!shutdown_ && !ctx->IsCancelled() && !CommitWaitingLocked()) {
    if (batch_cut_.WaitWithDeadline(&mu_, until)) break;  // timed out
  }
}

void ReplicationSource::WaitForAck(grpc::ServerContext* ctx, const Follower* f,
                                   uint64_t sent, absl::Time last_sent) {
  if (options_.ack_wait <= absl::ZeroDuration()) return;
  const absl::Time until = last_sent + options_.ack_wait;
  MutexLock l(&mu_);
  while (!shutdown_ && !ctx->IsCancelled() && f->acked < sent) {
    if (changed_.WaitWithDeadline(&mu_, until)) break;  // timed out
  }
}

absl::StatusOr<uint64_t> ReplicationSource::Join(Follower* f,
                                                 grpc::ServerContext* ctx,
                                                 FollowCall* call) {
  MutexLock l(&mu_);
  if (shutdown_) return absl::UnavailableError("replication source shut down");
  const uint64_t id = next_id_++;
  followers_[id] = f;  // copying: counts for nothing yet
  contexts_[id] = ctx;
  if (call != nullptr) calls_[id] = call;
  ++counters_.streams_started;
  return id;
}

void ReplicationSource::Leave(uint64_t id) {
  std::vector<std::function<void(absl::Status)>> satisfied;
  {
    MutexLock l(&mu_);
    followers_.erase(id);
    contexts_.erase(id);
    calls_.erase(id);
    // The standbys left may all hold what this one had not acknowledged.
    satisfied = TakeSatisfiedLocked(HeldLocked());
  }
  changed_.SignalAll();
  for (auto& done : satisfied) done(absl::OkStatus());
}

void ReplicationSource::Acknowledge(Follower* f, uint64_t applied) {
  std::vector<std::function<void(absl::Status)>> satisfied;
  {
    MutexLock l(&mu_);
    f->copying = false;
    f->acked = std::max(f->acked, applied);
    while (!f->in_flight.empty() && f->in_flight.front().first <= f->acked) {
      f->in_flight.pop_front();
    }
    satisfied = TakeSatisfiedLocked(HeldLocked());
  }
  changed_.SignalAll();
  for (auto& done : satisfied) done(absl::OkStatus());
}

void ReplicationSource::CountSent(Follower* f, int batches, uint64_t last) {
  MutexLock l(&mu_);
  counters_.batches_sent += batches;
  ++counters_.messages_sent;
  if (f->in_flight.size() < kMaxInFlight) {
    f->in_flight.emplace_back(last, clock_->Now());
  }
}

// A write to the follower failed: it is gone (or the stream was cancelled).
#define RETURN_IF_FALSE(x)                                            \
  if (!(x)) {                                                         \
    return absl::CancelledError("the follower's stream is closed"); \
  }

// One follower's stream on the handler's thread.
class ReplicationSource::Stream {
 public:
  Stream(ReplicationSource* source, grpc::ServerContext* ctx,
         grpc::ServerReaderWriter<v1::FollowResponse, v1::FollowRequest>*
             stream,
         Follower* follower)
      : source_(source),
        ctx_(ctx),
        stream_(stream),
        follower_(follower),
        db_(source->options_.store->db()) {}

  absl::Status Serve(const v1::FollowRequest& first) {
    const bool copy = !(first.leader_db_id() == source_->db_id_ &&
                        WriteLogStartsAt(db_, first.from_sequence() + 1));
    v1::FollowResponse start;
    start.set_kind(v1::FollowResponse::START);
    start.set_db_id(source_->db_id_);
    start.set_copy(copy);
    {
      MutexLock l(&source_->mu_);
      follower_->copying = copy;
      if (copy) ++source_->counters_.full_copies;
    }
    RETURN_IF_FALSE(Send(start));
    uint64_t next = first.from_sequence() + 1;
    if (copy) {
      absl::StatusOr<uint64_t> at = Copy();
      if (!at.ok()) return at.status();
      next = *at + 1;
    }
    return StreamLog(next);
  }

 private:
  bool Send(v1::FollowResponse& m) {
    m.set_leader_time_us(absl::ToUnixMicros(source_->clock_->Now()));
    return stream_->Write(m);
  }

  // Streams a consistent copy of the database; returns its sequence.
  absl::StatusOr<uint64_t> Copy() {
    const ReplicationSourceOptions& o = source_->options_;
    ReplicationCopyReader copy(db_, o.copy_chunk_records, o.copy_chunk_bytes);
    v1::FollowResponse chunk;
    for (;;) {
      absl::StatusOr<bool> more = copy.Next(&chunk);
      if (!more.ok()) return more.status();
      if (!*more) break;
      RETURN_IF_FALSE(Send(chunk));
    }
    {
      MutexLock l(&source_->mu_);
      source_->counters_.copy_records_sent += copy.records();
    }
    v1::FollowResponse end;
    end.set_kind(v1::FollowResponse::COPY_END);
    end.set_sequence(copy.sequence());
    RETURN_IF_FALSE(Send(end));
    LOG(INFO) << "replication: full copy at sequence " << copy.sequence()
              << " sent to " << follower_->name << " (" << follower_->peer
              << ")";
    return copy.sequence();
  }

  // Sends the log from `next` on, until the stream ends.
  absl::Status StreamLog(uint64_t next) {
    ReplicationLogReader log(db_, next, source_->options_.log_message_bytes);
    absl::Time last_sent = absl::Now();
    uint64_t sent = 0;  // the last sequence sent in a log message
    v1::FollowResponse m;
    for (;;) {
      if (!log.Behind()) {
        if (!source_->WaitForWrites(
                ctx_, log.next(),
                last_sent + source_->options_.heartbeat_interval)) {
          return absl::CancelledError("stream ended");
        }
        if (!log.Behind()) {
          v1::FollowResponse hb;
          hb.set_kind(v1::FollowResponse::HEARTBEAT);
          hb.set_sequence(db_->GetLatestSequenceNumber());
          RETURN_IF_FALSE(Send(hb));
          last_sent = absl::Now();
          continue;
        }
      }
      source_->WaitToBatch(ctx_, last_sent);
      for (;;) {
        source_->WaitForAck(ctx_, follower_, sent, last_sent);
        absl::StatusOr<ReplicationLogReader::Fill> fill = log.Next(&m);
        if (!fill.ok()) return fill.status();
        if (*fill == ReplicationLogReader::Fill::kRetryLater) {
          absl::SleepFor(source_->options_.poll_interval);
        }
        if (*fill != ReplicationLogReader::Fill::kFilled) break;
        sent = log.next() - 1;
        source_->CountSent(follower_, m.batches_size(), sent);
        RETURN_IF_FALSE(Send(m));
        last_sent = absl::Now();
      }
    }
  }
#undef RETURN_IF_FALSE

  ReplicationSource* const source_;
  grpc::ServerContext* const ctx_;
  grpc::ServerReaderWriter<v1::FollowResponse, v1::FollowRequest>* const
      stream_;
  Follower* const follower_;
  rocksdb::DB* const db_;
};

grpc::Status ReplicationSource::Follow(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::FollowResponse, v1::FollowRequest>* stream) {
  if (options_.authenticator != nullptr) {
    absl::StatusOr<Identity> id =
        options_.authenticator->Check(*ctx, Role::kAdmin, "Replication.Follow");
    if (!id.ok()) {
      MutexLock l(&mu_);
      ++counters_.streams_refused;
      return ToGrpcStatus(id.status());
    }
  }
  Follower f;
  f.peer = ctx->peer();
  absl::StatusOr<uint64_t> id = Join(&f, ctx, /*call=*/nullptr);
  if (!id.ok()) return ToGrpcStatus(id.status());
  v1::FollowRequest first;
  if (!stream->Read(&first)) {
    Leave(*id);
    return grpc::Status(grpc::StatusCode::CANCELLED, "no first message");
  }
  {
    MutexLock l(&mu_);
    f.name = first.follower();
  }
  absl::StatusOr<Thread> acks = Thread::Start("repl-acks", [&] {
    v1::FollowRequest ack;
    while (stream->Read(&ack)) Acknowledge(&f, ack.applied_sequence());
  });
  absl::Status s;
  if (acks.ok()) {
    LOG(INFO) << "replication: " << f.name << " (" << f.peer
              << ") follows from sequence " << first.from_sequence();
    s = Stream(this, ctx, stream, &f).Serve(first);
    ctx->TryCancel();  // ends the acknowledgements' Read
    acks->Join();
  } else {
    s = acks.status();
  }
  Leave(*id);
  if (!absl::IsCancelled(s)) {
    LOG(WARNING) << "replication: stream to " << f.name << " ended: " << s;
  }
  return ToGrpcStatus(s);
}

}  // namespace master
}  // namespace hymcache
