// The completion-queue (async) serving machinery of the master's gRPC
// server: pollers, each one thread owning one ServerCompletionQueue and
// running every event of the calls requested on that queue inline, and a
// generic unary call.
//
// Why not gRPC's callback API: in gRPC 1.51 (Debian 12) the callback API
// runs every event on two internal "nexting" threads that hand the poller
// role to each other on every event (4.7 futex calls and 5.4 context
// switches per BatchLookup, docs/performance.md). A server whose only
// polling threads are these pollers, and whose calls live on the thread
// that requested them, has no such hand-off when it has one poller.
// Everything the server registers must then be async (a callback method
// anywhere brings the nexting threads back); sync methods (reflection) are
// fine: gRPC gives a server with async queues non-polling sync queues.
//
// Life of a call: the poller's thread requests it (a CqTag on the poller's
// queue), gRPC completes the tag there, and every later event of the call
// (write, read, finish) comes back to the same queue, so a call's state is
// only ever touched by one thread.
//
// Shutdown: grpc::Server::Shutdown first (in-flight calls finish or are
// cancelled), then CqPoller::ShutdownAndJoin, which shuts the queue down
// (IfOpen turns false: no new request or alarm reaches it) and waits for the
// thread to drain it; each call deletes itself on its last event.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "common/mutex.h"
#include "common/thread.h"

namespace hymcache {
namespace master {

// What every tag on a poller's queue is: Proceed runs on the poller's
// thread with the event's `ok`.
class CqTag {
 public:
  virtual void Proceed(bool ok) = 0;

 protected:
  ~CqTag() = default;
};

// A CqTag that calls a member function of its owner (a call with several
// events in flight at once: read or write, alarm, done).
template <typename Owner>
class MemberTag final : public CqTag {
 public:
  MemberTag(Owner* owner, void (Owner::*fn)(bool)) : owner_(owner), fn_(fn) {}
  void Proceed(bool ok) override { (owner_->*fn_)(ok); }

 private:
  Owner* const owner_;
  void (Owner::*const fn_)(bool);
};

// One completion queue and the thread that polls it.
//
// Thread safety: IfOpen from any thread; Start and ShutdownAndJoin from the
// owner (the server), once each, in that order.
class CqPoller {
 public:
  explicit CqPoller(std::unique_ptr<grpc::ServerCompletionQueue> cq)
      : cq_(std::move(cq)) {}
  ~CqPoller() { ShutdownAndJoin(); }
  CqPoller(const CqPoller&) = delete;
  CqPoller& operator=(const CqPoller&) = delete;

  grpc::ServerCompletionQueue* cq() { return cq_.get(); }

  // Runs `queue_work` (which queues work on cq(): a call request, an
  // alarm) unless the queue has been shut down. Returns whether it ran.
  // gRPC forbids queueing on a shut-down queue, hence the lock.
  template <typename F>
  bool IfOpen(F&& queue_work) {
    MutexLock l(&mu_);
    if (shut_down_) return false;
    queue_work();
    return true;
  }

  // Starts the thread `name`: runs `start` there (which requests the first
  // calls), then every event until the queue is shut down and drained.
  void Start(std::string name, std::function<void()> start);

  // Shuts the queue down and joins the thread once it has drained it.
  // REQUIRES: the server's Shutdown has returned (no new calls). Idempotent.
  void ShutdownAndJoin();

 private:
  void Loop();

  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  Thread thread_;

  Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// The unary method `Req -> Resp` of the generated async service `Service`
// served on one poller: `request` is the service's RequestXxx member,
// `handle` the handler, run inline on the poller's thread.
template <typename Service, typename Req, typename Resp>
struct UnaryMethod {
  using RequestFn = void (Service::*)(grpc::ServerContext*, Req*,
                                      grpc::ServerAsyncResponseWriter<Resp>*,
                                      grpc::CompletionQueue*,
                                      grpc::ServerCompletionQueue*, void*);
  using HandleFn =
      std::function<grpc::Status(grpc::ServerContext*, const Req&, Resp*)>;

  // Runs after `handle` when set: the call is answered (with what `handle`
  // returned, and `resp` as the hold leaves it) when `answer` runs, once,
  // from any thread, so a handler may hold its answer without blocking the
  // poller (a synchronous commit waits for a standby; a confirmed one adds
  // what the client confirms: master/master_replication.h). Null: answered
  // at once.
  using HoldFn = std::function<void(const grpc::Status& handled, Resp* resp,
                                    std::function<void()> answer)>;

  Service* service;
  RequestFn request;
  HandleFn handle;
  CqPoller* poller;
  HoldFn hold = nullptr;
};

// One call of a UnaryMethod, from its request to its finish.
template <typename Service, typename Req, typename Resp>
class UnaryCall final : public CqTag {
 public:
  using Method = UnaryMethod<Service, Req, Resp>;

  // Requests the method's next call on its poller's queue (nothing once
  // the queue is shut down). `method` must outlive the poller's drain.
  static void Request(const Method* method) {
    auto* call = new UnaryCall(method);
    if (!method->poller->IfOpen([call, method] {
          grpc::ServerCompletionQueue* cq = method->poller->cq();
          (method->service->*method->request)(&call->ctx_, &call->req_,
                                              &call->writer_, cq, cq, call);
        })) {
      delete call;
    }
  }

  void Proceed(bool ok) override {
    if (!ok || finishing_) {  // the server shut down, or the call is over
      delete this;
      return;
    }
    Request(method_);  // keep one request of the method outstanding
    finishing_ = true;
    status_ = method_->handle(&ctx_, req_, &resp_);
    if (method_->hold) {
      method_->hold(status_, &resp_, [this] { Answer(); });
    } else {
      Answer();
    }
  }

 private:
  explicit UnaryCall(const Method* method)
      : method_(method), writer_(&ctx_) {}
  ~UnaryCall() = default;

  // Sends status_ (and resp_); on the poller's thread, or on whichever
  // thread a hold's `answer` runs.
  void Answer() {
    // The queue may have been shut down meanwhile (the server stopping):
    // then nothing may be queued on it, and no event will come.
    if (!method_->poller->IfOpen([this] {
          if (status_.ok()) {
            writer_.Finish(resp_, status_, this);
          } else {
            writer_.FinishWithError(status_, this);
          }
        })) {
      delete this;
    }
  }

  const Method* const method_;
  grpc::ServerContext ctx_;
  Req req_;
  Resp resp_;
  grpc::ServerAsyncResponseWriter<Resp> writer_;
  grpc::Status status_;  // what handle returned
  bool finishing_ = false;
};

}  // namespace master
}  // namespace hymcache
