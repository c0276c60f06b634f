#include "master/health_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include <grpcpp/alarm.h>

namespace hymcache {
namespace master {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream. Its events (request, write, wake-up alarm, done,
// finish) all come to its poller's queue, so only that thread runs them;
// the alarm is set by whichever thread changes a status, under the
// service's lock. The call deletes itself once its finish and done events
// have come back and no alarm is pending.
class HealthService::WatchCall {
 public:
  static void Request(HealthService* health, CqPoller* poller) {
    auto* call = new WatchCall(health, poller);
    // Done fires once the call has started and then ended (finished or
    // cancelled); never for a request the server refuses at shutdown.
    call->ctx_.AsyncNotifyWhenDone(&call->done_tag_);
    if (!poller->IfOpen([call, health, poller] {
          health->async_.RequestWatch(&call->ctx_, &call->req_,
                                      &call->writer_, poller->cq(),
                                      poller->cq(), &call->request_tag_);
        })) {
      delete call;
    }
  }

  // From any thread, under the service's lock: send the status if it
  // changed, on the call's own thread.
  void WakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    if (alarm_ != nullptr) return;  // a wake-up is pending already
    auto alarm = std::make_unique<grpc::Alarm>();
    if (poller_->IfOpen([&] {
          alarm->Set(poller_->cq(), std::chrono::system_clock::now(),
                     &alarm_tag_);
        })) {
      alarm_ = std::move(alarm);
    }
  }

 private:
  WatchCall(HealthService* health, CqPoller* poller)
      : health_(health), poller_(poller), writer_(&ctx_) {}

  void OnRequest(bool ok) {
    if (!ok) {  // shutting down: the call never started
      delete this;
      return;
    }
    Request(health_, poller_);  // keep one Watch request outstanding
    {
      MutexLock l(&health_->mu_);
      health_->watchers_.insert(this);
    }
    Send();
  }

  // Writes the status if it differs from the last one sent; ends the
  // stream once the service has shut down and said so.
  void Send() {
    ServingStatus now;
    bool end;
    {
      MutexLock l(&health_->mu_);
      now = health_->Current(req_.service());
      end = health_->shut_down_;
    }
    if (sent_ && now == last_) {
      if (end) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "health service shut down"));
      }
      return;
    }
    sent_ = true;
    last_ = now;
    resp_.set_status(now);
    writing_ = true;
    writer_.Write(resp_, &write_tag_);
  }

  void OnWrite(bool ok) {
    writing_ = false;
    if (!ok || done_) {  // the caller went away
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch ended"));
    } else {
      Send();
    }
    MaybeDelete();
  }

  void OnAlarm(bool /*ok*/) {
    std::unique_ptr<grpc::Alarm> fired;
    {
      MutexLock l(&health_->mu_);
      fired = std::move(alarm_);
    }
    if (!writing_ && !finishing_ && !done_) Send();
    MaybeDelete();
  }

  void OnDone(bool /*ok*/) {
    done_ = true;
    if (!writing_ && !finishing_) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch ended"));
    }
    MaybeDelete();
  }

  void OnFinish(bool /*ok*/) {
    finished_ = true;
    MaybeDelete();
  }

  void Finish(const grpc::Status& status) {
    if (finishing_) return;
    {
      MutexLock l(&health_->mu_);
      health_->watchers_.erase(this);
      if (alarm_ != nullptr) alarm_->Cancel();  // comes back at once
    }
    finishing_ = true;
    writer_.Finish(status, &finish_tag_);
  }

  void MaybeDelete() {
    if (!finished_ || !done_) return;
    {
      MutexLock l(&health_->mu_);
      if (alarm_ != nullptr) return;  // OnAlarm deletes
    }
    delete this;
  }

  HealthService* const health_;
  CqPoller* const poller_;
  grpc::ServerContext ctx_;
  HealthCheckRequest req_;
  HealthCheckResponse resp_;
  grpc::ServerAsyncWriter<HealthCheckResponse> writer_;
  MemberTag<WatchCall> request_tag_{this, &WatchCall::OnRequest};
  MemberTag<WatchCall> write_tag_{this, &WatchCall::OnWrite};
  MemberTag<WatchCall> alarm_tag_{this, &WatchCall::OnAlarm};
  MemberTag<WatchCall> done_tag_{this, &WatchCall::OnDone};
  MemberTag<WatchCall> finish_tag_{this, &WatchCall::OnFinish};
  // The poller's thread only.
  bool sent_ = false;
  ServingStatus last_ = HealthCheckResponse::UNKNOWN;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  bool done_ = false;
  // A pending wake-up; null when none.
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(health_->mu_);
};

HealthService::HealthService() {
  MutexLock l(&mu_);
  serving_[""] = false;
}

void HealthService::SetServingStatus(const std::string& service,
                                     bool serving) {
  MutexLock l(&mu_);
  if (shut_down_) return;
  serving_[service] = serving;
  NotifyLocked();
}

void HealthService::SetAllServing(bool serving) {
  MutexLock l(&mu_);
  if (shut_down_) return;
  for (auto& [name, s] : serving_) s = serving;
  NotifyLocked();
}

void HealthService::Shutdown() {
  MutexLock l(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, s] : serving_) s = false;
  NotifyLocked();
}

size_t HealthService::WatchersForTest() const {
  MutexLock l(&mu_);
  return watchers_.size();
}

void HealthService::NotifyLocked() {
  for (WatchCall* w : watchers_) w->WakeLocked();
}

HealthService::ServingStatus HealthService::Current(
    const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
}

grpc::Status HealthService::Check(const HealthCheckRequest& req,
                                  HealthCheckResponse* resp) const {
  MutexLock l(&mu_);
  auto it = serving_.find(req.service());
  if (it == serving_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown");
  }
  resp->set_status(it->second ? HealthCheckResponse::SERVING
                              : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

void HealthService::StartOn(CqPoller* poller) {
  const CheckMethod* check;
  {
    MutexLock l(&mu_);
    check = &check_methods_
                 .emplace(poller,
                          CheckMethod{
                              &async_,
                              &grpc::health::v1::Health::AsyncService::
                                  RequestCheck,
                              [this](grpc::ServerContext*,
                                     const HealthCheckRequest& req,
                                     HealthCheckResponse* resp) {
                                return Check(req, resp);
                              },
                              poller})
                 .first->second;
  }
  UnaryCall<grpc::health::v1::Health::AsyncService, HealthCheckRequest,
            HealthCheckResponse>::Request(check);
  WatchCall::Request(this, poller);
}

}  // namespace master
}  // namespace hymcache
