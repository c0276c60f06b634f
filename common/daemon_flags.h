// The command-line flags of DaemonOptions (common/daemon.h), defined once
// for both daemons' main()s: --auth_tokens_file, --insecure, --tls_cert,
// --tls_key, --tls_ca, --tls_require_client_cert and --metrics_listen,
// their defaults taken from DaemonOptions. Link it only into a main()
// (flags are main's business, STYLE.md); a daemon's own flags stay in its
// main.cc. Being defined here, the flags show in a main's --help only in
// the groups (common/cli.h) that name them.
//
// Thread safety: call from main() before starting threads.
#pragma once

#include "common/daemon.h"

namespace hymcache {

// Sets `options`' DaemonOptions fields from the flags, and the build it
// reports from BuildInfo() (common/build_info.h). Leaves the others alone
// (tls.server_name among them: the storage node's own flag).
void DaemonOptionsFromFlags(DaemonOptions* options);

}  // namespace hymcache
