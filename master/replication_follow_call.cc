#include "master/replication_follow_call.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace hymcache {
namespace master {

namespace v1 = ::hymcache::v1;

void ReplicationSource::StartOn(CqPoller* poller) {
  FollowCall::Request(this, poller);
}

ReplicationSource::FollowCall::FollowCall(ReplicationSource* source,
                                          CqPoller* poller)
    : source_(source),
      poller_(poller),
      db_(source->options_.store->db()),
      stream_(&ctx_) {}

void ReplicationSource::FollowCall::Request(ReplicationSource* source,
                                            CqPoller* poller) {
  auto* call = new FollowCall(source, poller);
  if (!poller->IfOpen([call, source, poller] {
        source->async_service_.RequestFollow(&call->ctx_, &call->stream_,
                                             poller->cq(), poller->cq(),
                                             &call->arrived_tag_);
      })) {
    delete call;
  }
}

void ReplicationSource::FollowCall::OnArrived(bool ok) {
  if (!ok) {  // the server shut down: the call never started
    delete this;
    return;
  }
  Request(source_, poller_);  // keep one call of the method requested
  if (source_->options_.authenticator != nullptr) {
    absl::StatusOr<Identity> id = source_->options_.authenticator->Check(
        ctx_, Role::kAdmin, "Replication.Follow");
    if (!id.ok()) {
      {
        MutexLock l(&source_->mu_);
        ++source_->counters_.streams_refused;
      }
      End(ToGrpcStatus(id.status()));
      return;
    }
  }
  follower_.peer = ctx_.peer();
  absl::StatusOr<uint64_t> id = source_->Join(&follower_, &ctx_, this);
  if (!id.ok()) {
    End(ToGrpcStatus(id.status()));
    return;
  }
  id_ = *id;
  joined_ = true;
  StartRead();
}

void ReplicationSource::FollowCall::StartRead() {
  reading_ = true;
  if (!poller_->IfOpen([this] { stream_.Read(&in_, &read_tag_); })) {
    reading_ = false;
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server stopped"));
  }
}

void ReplicationSource::FollowCall::Send() {
  out_.set_leader_time_us(absl::ToUnixMicros(source_->clock_->Now()));
  writing_ = true;
  if (!poller_->IfOpen([this] { stream_.Write(out_, &write_tag_); })) {
    writing_ = false;
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server stopped"));
  }
}

void ReplicationSource::FollowCall::OnRead(bool ok) {
  reading_ = false;
  if (phase_ == Phase::kEnding) {
    MaybeFinish();
    return;
  }
  if (!ok) {  // the follower closed its end, went away, or was cancelled
    End(grpc::Status(grpc::StatusCode::CANCELLED, phase_ == Phase::kFirst
                                                      ? "no first message"
                                                      : "the follower left"));
    return;
  }
  if (phase_ != Phase::kFirst) {
    source_->Acknowledge(&follower_, in_.applied_sequence());
    acked_ = std::max(acked_, in_.applied_sequence());
    if (acked_ >= sent_) WakeAlarmOnAck();
    StartRead();
    return;
  }
  const bool copy = !(in_.leader_db_id() == source_->db_id_ &&
                      WriteLogStartsAt(db_, in_.from_sequence() + 1));
  {
    MutexLock l(&source_->mu_);
    follower_.name = in_.follower();
    follower_.copying = copy;
    if (copy) ++source_->counters_.full_copies;
  }
  LOG(INFO) << "replication: " << in_.follower() << " (" << follower_.peer
            << ") follows from sequence " << in_.from_sequence()
            << " (on the poller)";
  const ReplicationSourceOptions& o = source_->options_;
  if (copy) {
    copy_ = std::make_unique<ReplicationCopyReader>(db_, o.copy_chunk_records,
                                                    o.copy_chunk_bytes);
    phase_ = Phase::kCopy;
  } else {
    log_ = std::make_unique<ReplicationLogReader>(db_, in_.from_sequence() + 1,
                                                  o.log_message_bytes);
    phase_ = Phase::kLog;
  }
  out_.Clear();
  out_.set_kind(v1::FollowResponse::START);
  out_.set_db_id(source_->db_id_);
  out_.set_copy(copy);
  Send();
  if (phase_ != Phase::kEnding) StartRead();  // the acknowledgements
}

void ReplicationSource::FollowCall::OnWritten(bool ok) {
  writing_ = false;
  if (phase_ == Phase::kEnding) {
    MaybeFinish();
    return;
  }
  if (!ok) {
    End(grpc::Status(grpc::StatusCode::CANCELLED,
                     "the follower's stream is closed"));
    return;
  }
  last_sent_ = absl::Now();
  Pump();
}

void ReplicationSource::FollowCall::OnAlarm(bool /*ok: fired, or cancelled*/) {
  AlarmKind kind;
  {
    MutexLock l(&wake_mu_);
    alarm_set_ = false;
    kind = alarm_kind_;
  }
  if (phase_ == Phase::kEnding) {
    MaybeFinish();
    return;
  }
  if (kind == AlarmKind::kBatch) batch_waited_ = true;
  if (kind == AlarmKind::kAck) ack_waited_ = true;
  if (!writing_) Pump();
}

void ReplicationSource::FollowCall::OnFinished(bool /*ok*/) { delete this; }

void ReplicationSource::FollowCall::Pump() {
  if (phase_ == Phase::kLog) {
    PumpLog();
    return;
  }
  // Phase::kCopy
  absl::StatusOr<bool> more = copy_->Next(&out_);
  if (!more.ok()) {
    End(ToGrpcStatus(more.status()));
    return;
  }
  if (*more) {
    Send();
    return;
  }
  const uint64_t at = copy_->sequence();
  {
    MutexLock l(&source_->mu_);
    source_->counters_.copy_records_sent += copy_->records();
  }
  copy_.reset();  // releases the snapshot
  LOG(INFO) << "replication: full copy at sequence " << at << " sent to "
            << follower_.name << " (" << follower_.peer << ")";
  log_ = std::make_unique<ReplicationLogReader>(
      db_, at + 1, source_->options_.log_message_bytes);
  phase_ = Phase::kLog;
  out_.Clear();
  out_.set_kind(v1::FollowResponse::COPY_END);
  out_.set_sequence(at);
  Send();
}

void ReplicationSource::FollowCall::PumpLog() {
  const ReplicationSourceOptions& o = source_->options_;
  const uint64_t seen = Wakes();
  if (log_->Behind()) {
    if (o.batch_delay > absl::ZeroDuration() && !batch_waited_) {
      bool waiting;
      {
        MutexLock l(&source_->mu_);
        waiting = source_->CommitWaitingLocked();
      }
      // Gather the writes until the delay has passed since the last message
      // (at once after a quiet spell: the delay bounds the messages' rate,
      // and adds nothing to a lone write).
      const absl::Time until = last_sent_ + o.batch_delay;
      if (!waiting && absl::Now() < until) {
        ArmAlarm(until, AlarmKind::kBatch, seen);
        return;
      }
    }
    // One message unacknowledged at a time (ack_wait): the writes of the
    // round trip go out together once the follower answers.
    if (o.ack_wait > absl::ZeroDuration() && !ack_waited_ && acked_ < sent_) {
      const absl::Time until = last_sent_ + o.ack_wait;
      if (absl::Now() < until) {
        ArmAlarm(until, AlarmKind::kAck, seen);
        return;
      }
    }
    batch_waited_ = false;
    ack_waited_ = false;
    absl::StatusOr<ReplicationLogReader::Fill> fill = log_->Next(&out_);
    if (!fill.ok()) {
      End(ToGrpcStatus(fill.status()));
      return;
    }
    if (*fill == ReplicationLogReader::Fill::kFilled) {
      sent_ = log_->next() - 1;
      source_->CountSent(&follower_, out_.batches_size(), sent_);
      Send();
      return;
    }
    if (*fill == ReplicationLogReader::Fill::kRetryLater) {
      ArmAlarm(absl::Now() + o.poll_interval, AlarmKind::kPoll, Wakes());
      return;
    }
  }
  const absl::Time now = absl::Now();
  if (now - last_sent_ >= o.heartbeat_interval) {
    out_.Clear();
    out_.set_kind(v1::FollowResponse::HEARTBEAT);
    out_.set_sequence(db_->GetLatestSequenceNumber());
    Send();
    return;
  }
  // Every write wakes the stream (the store's write listener); the poll is
  // a safety net.
  ArmAlarm(
      std::min(now + o.idle_poll_interval, last_sent_ + o.heartbeat_interval),
      AlarmKind::kPoll, seen);
}

uint64_t ReplicationSource::FollowCall::Wakes() {
  MutexLock l(&wake_mu_);
  return wakes_;
}

void ReplicationSource::FollowCall::ArmAlarm(absl::Time deadline,
                                             AlarmKind kind, uint64_t seen) {
  bool queued;
  {
    MutexLock l(&wake_mu_);
    if (kind == AlarmKind::kPoll && wakes_ != seen) deadline = absl::Now();
    alarm_set_ = true;
    alarm_kind_ = kind;
    alarm_cancelled_ = false;
    queued = poller_->IfOpen([this, deadline] {
      alarm_.Set(poller_->cq(), absl::ToChronoTime(deadline), &alarm_tag_);
    });
    if (!queued) alarm_set_ = false;
  }
  if (!queued) {
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server stopped"));
  }
}

void ReplicationSource::FollowCall::Wake(ReplicationSource::WakeReason why) {
  MutexLock l(&wake_mu_);
  ++wakes_;
  CancelAlarmLocked(why, /*acked=*/false);
}

void ReplicationSource::FollowCall::WakeAlarm(
    ReplicationSource::WakeReason why) {
  MutexLock l(&wake_mu_);
  CancelAlarmLocked(why, /*acked=*/false);
}

void ReplicationSource::FollowCall::WakeAlarmOnAck() {
  MutexLock l(&wake_mu_);
  CancelAlarmLocked(ReplicationSource::WakeReason::kWrite, /*acked=*/true);
}

void ReplicationSource::FollowCall::CancelAlarmLocked(
    ReplicationSource::WakeReason why, bool acked) {
  if (!alarm_set_ || alarm_cancelled_) return;
  bool ends = false;
  switch (alarm_kind_) {
    case AlarmKind::kPoll:
      ends = !acked;
      break;
    case AlarmKind::kBatch:
      ends = why != ReplicationSource::WakeReason::kWrite;
      break;
    case AlarmKind::kAck:
      ends = acked || why == ReplicationSource::WakeReason::kShutdown;
      break;
  }
  if (ends) {
    alarm_.Cancel();  // its event comes at once
    alarm_cancelled_ = true;
  }
}

void ReplicationSource::FollowCall::End(const grpc::Status& status) {
  if (phase_ == Phase::kEnding) return;
  phase_ = Phase::kEnding;
  end_status_ = status;
  if (joined_) {
    joined_ = false;
    source_->Leave(id_);  // no Wake comes after this
  }
  if (status.error_code() != grpc::StatusCode::CANCELLED) {
    LOG(WARNING) << "replication: stream to " << follower_.name << " ("
                 << follower_.peer << ") ended: " << status.error_message();
  }
  // Ends the Read (and a Write held by flow control); with neither, the
  // follower is told the status.
  if (reading_ || writing_) ctx_.TryCancel();
  WakeAlarm(ReplicationSource::WakeReason::kShutdown);
  MaybeFinish();
}

void ReplicationSource::FollowCall::MaybeFinish() {
  if (reading_ || writing_ || finishing_) return;
  {
    MutexLock l(&wake_mu_);
    if (alarm_set_) return;
  }
  finishing_ = true;
  if (!poller_->IfOpen([this] { stream_.Finish(end_status_, &finish_tag_); })) {
    delete this;
  }
}

}  // namespace master
}  // namespace hymcache
