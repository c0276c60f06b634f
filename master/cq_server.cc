#include "master/cq_server.h"

namespace hymcache {
namespace master {

void CqPoller::Start(std::string name, std::function<void()> start) {
  thread_ = Thread(std::move(name), [this, start = std::move(start)] {
    start();
    Loop();
  });
}

void CqPoller::Loop() {
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) static_cast<CqTag*>(tag)->Proceed(ok);
}

void CqPoller::ShutdownAndJoin() {
  {
    MutexLock l(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cq_->Shutdown();
  }
  if (thread_.joinable()) {
    thread_.Join();
  } else {
    // Never started: drain the queue here (tags requested before Start).
    Loop();
  }
}

}  // namespace master
}  // namespace hymcache
