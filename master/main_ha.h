// hymcache-master's flow with --etcd (main_ha.cc).
#pragma once

#include <signal.h>

#include "master/master_ha.h"

namespace hymcache {

// Runs an HaMaster until a stop signal (returns 0) or the end of its term
// (returns 3); SIGHUP reloads identities and certificates. `stop_signals`
// (SIGTERM, SIGINT, SIGHUP) are blocked in every thread.
int RunHaMaster(const HaMasterOptions& options, const sigset_t& stop_signals);

}  // namespace hymcache
