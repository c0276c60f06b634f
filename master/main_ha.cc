// hymcache-master with --etcd: the process around an HaMaster
// (master/master_ha.h). Part of the hymcache-master binary, apart from
// main.cc so that the plain master's flow stays as it was.
//
// Prints "hymcache-master standing by on HOST:PORT" once the port is bound
// (the first line, as a plain master's "listening on" is), then
// "hymcache-master listening on HOST:PORT epoch=N" when elected and
// serving. Exits 0 on SIGTERM/SIGINT (resigning: a standby takes over at
// once), 3 when its term ends (deposed, or elected but unable to serve):
// the supervisor restarts it as a standby. A term that ends because etcd
// does not answer turns read-only instead (--serve_reads_without_etcd; the
// supervisor's status line says so) until an election decides: it leads
// again, or exits 3.
#include "master/main_ha.h"

#include <glog/logging.h>
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <string>
#include <utility>

#include "common/systemd.h"
#include "master/master_ha.h"

namespace hymcache {

int RunHaMaster(const HaMasterOptions& options, const sigset_t& stop_signals) {
  std::atomic<HaMaster*> running{nullptr};
  auto notifier = SystemdNotifier::Create(
      {.alive = [&running](absl::Duration timeout) {
        HaMaster* m = running.load();
        return m == nullptr ? absl::OkStatus() : m->CheckAlive(timeout);
      }});
  auto ha = HaMaster::Create(options);
  if (!ha.ok()) {
    LOG(ERROR) << "cannot start: " << ha.status();
    notifier->Status(ha.status().ToString());
    return 1;
  }
  std::printf("hymcache-master standing by on %s\n", (*ha)->address().c_str());
  std::fflush(stdout);
  running = ha->get();
  // Ready as a standby: it answers (NOT_SERVING, NOT_LEADER) and campaigns.
  notifier->Ready("standing by on " + (*ha)->address());

  bool announced = false;
  std::string status;  // the last one sent to the supervisor
  int sig = 0;
  int code = 0;
  while (true) {
    if (std::optional<int64_t> epoch = (*ha)->ServingEpoch()) {
      if (!announced) {
        std::printf("hymcache-master listening on %s epoch=%lld\n",
                    (*ha)->address().c_str(), static_cast<long long>(*epoch));
        std::fflush(stdout);
        announced = true;
      }
      std::string now = (*ha)->read_only()
                            ? "read-only (the term of epoch " +
                                  std::to_string(*epoch) +
                                  " ended without etcd) on " + (*ha)->address()
                            : "leading (epoch " + std::to_string(*epoch) +
                                  ") on " + (*ha)->address();
      if (now != status) {
        notifier->Status(now);
        status = std::move(now);
      }
    }
    if ((*ha)->finished()) {
      LOG(ERROR) << "master HA: " << (*ha)->finish_reason()
                 << "; exiting (the supervisor starts a standby again)";
      code = 3;
      break;
    }
    // Signals, polled with the state: 20 ms is the most this adds to
    // noticing an election or a lost term (the gate itself is immediate).
    struct timespec wait = {0, 20 * 1000 * 1000};
    sig = sigtimedwait(&stop_signals, nullptr, &wait);
    if (sig < 0) continue;
    if (sig == SIGHUP) {
      absl::Status reloaded = (*ha)->Reload();
      if (!reloaded.ok()) LOG(WARNING) << "reload failed: " << reloaded;
      continue;
    }
    LOG(INFO) << "signal " << sig << ": resigning and shutting down";
    break;
  }
  notifier->Stopping("shutting down");
  running = nullptr;
  notifier.reset();
  (*ha)->Shutdown();
  return code;
}

}  // namespace hymcache
