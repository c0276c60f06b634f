// ReplicationSource::FollowCall: one follower's stream served on a master's
// completion-queue poller (master/cq_server.h) instead of a handler thread.
// The same messages as the blocking stream (master/replication_log.h); what
// differs is how it waits:
//  - for the next message: the Write's event;
//  - for the follower's acknowledgements: a Read always outstanding, whose
//    event answers the commits now held (ReplicationSource::Acknowledge),
//    on the poller's thread;
//  - for writes, a batch delay, the follower's acknowledgement of the last
//    message (ack_wait), a heartbeat: a grpc::Alarm on the poller's queue,
//    which a write (NotifyWrite), a commit that waits (OnReplicated) or the
//    acknowledgement cancels, so that its event comes at once.
// At most one Write, one Read and one alarm are in flight; the call ends
// (Finish) once none is, and deletes itself at Finish's event.
//
// Thread safety: every method but Wake runs on the poller's thread.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "common/mutex.h"
#include "master/cq_server.h"
#include "master/replication_log.h"
#include "master/replication_source.h"
#include "proto/replication.grpc.pb.h"

namespace hymcache {
namespace master {

class ReplicationSource::FollowCall {
 public:
  // Requests the next Follow call on `poller`'s queue (nothing once the
  // queue is shut down).
  static void Request(ReplicationSource* source, CqPoller* poller);

  // Something to send (ReplicationSource::WakeReason says what each ends).
  // From any thread; REQUIRES the source's mu_ (the call is then still
  // registered, so alive).
  void Wake(ReplicationSource::WakeReason why);

 private:
  FollowCall(ReplicationSource* source, CqPoller* poller);
  ~FollowCall() = default;

  // Events.
  void OnArrived(bool ok);
  void OnRead(bool ok);
  void OnWritten(bool ok);
  void OnAlarm(bool ok);
  void OnFinished(bool ok);

  void StartRead();
  void Send();  // out_
  // The next message, or an alarm to wait for one.
  void Pump();
  void PumpLog();
  // What the alarm waits for.
  enum class AlarmKind {
    kPoll,   // writes, a heartbeat: any wake ends it
    kBatch,  // the batch delay: a commit waiting or shutdown ends it
    kAck,    // the acknowledgement (ack_wait): it, or shutdown, ends it
  };
  // Sets the alarm at `deadline`; at once instead if a write came since
  // the stream looked (`seen`, the wake count then) and it is kPoll.
  void ArmAlarm(absl::Time deadline, AlarmKind kind, uint64_t seen);
  uint64_t Wakes();
  // Ends the alarm now (its event comes at once) if `why` ends its kind.
  void WakeAlarm(ReplicationSource::WakeReason why);
  // The same for the follower's acknowledgement of the last message: ends
  // kAck only.
  void WakeAlarmOnAck();
  void CancelAlarmLocked(ReplicationSource::WakeReason why, bool acked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_);
  // Ends the stream with `status` (the follower is told it, unless gone).
  void End(const grpc::Status& status);
  // Finishes once no Write, Read or alarm is in flight.
  void MaybeFinish();

  enum class Phase { kFirst, kCopy, kLog, kEnding };

  ReplicationSource* const source_;
  CqPoller* const poller_;
  rocksdb::DB* const db_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<hymcache::v1::FollowResponse,
                                hymcache::v1::FollowRequest>
      stream_;
  MemberTag<FollowCall> arrived_tag_{this, &FollowCall::OnArrived};
  MemberTag<FollowCall> read_tag_{this, &FollowCall::OnRead};
  MemberTag<FollowCall> write_tag_{this, &FollowCall::OnWritten};
  MemberTag<FollowCall> alarm_tag_{this, &FollowCall::OnAlarm};
  MemberTag<FollowCall> finish_tag_{this, &FollowCall::OnFinished};

  // The poller's thread only.
  Phase phase_ = Phase::kFirst;
  Follower follower_;  // its fields under the source's mu_
  uint64_t id_ = 0;
  bool joined_ = false;
  hymcache::v1::FollowRequest in_;
  hymcache::v1::FollowResponse out_;
  std::unique_ptr<ReplicationCopyReader> copy_;
  std::unique_ptr<ReplicationLogReader> log_;
  bool reading_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  bool batch_waited_ = false;  // the batch delay passed: send now
  bool ack_waited_ = false;    // the acknowledgement came, or ack_wait passed
  // The last sequence sent in a log message, and the highest the follower
  // acknowledged (0: none yet; the first log message never waits).
  uint64_t sent_ = 0;
  uint64_t acked_ = 0;
  absl::Time last_sent_;
  grpc::Status end_status_;

  Mutex wake_mu_;
  grpc::Alarm alarm_;  // Set and Cancel under wake_mu_
  bool alarm_set_ ABSL_GUARDED_BY(wake_mu_) = false;
  AlarmKind alarm_kind_ ABSL_GUARDED_BY(wake_mu_) = AlarmKind::kPoll;
  bool alarm_cancelled_ ABSL_GUARDED_BY(wake_mu_) = false;
  uint64_t wakes_ ABSL_GUARDED_BY(wake_mu_) = 0;
};

}  // namespace master
}  // namespace hymcache
