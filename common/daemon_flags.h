// The command-line flags of DaemonOptions (common/daemon.h), defined once
// for both daemons' main()s: --auth_tokens_file, --insecure, --tls_cert,
// --tls_key, --tls_ca, --tls_require_client_cert and --metrics_listen,
// their defaults taken from DaemonOptions, and --grpc_poll_strategy
// (ApplyGrpcPollStrategyFlag). Link it only into a main()
// (flags are main's business, STYLE.md); a daemon's own flags stay in its
// main.cc. Being defined here, the flags show in a main's --help only in
// the groups (common/cli.h) that name them.
//
// Thread safety: call from main() before starting threads.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/cli.h"
#include "common/daemon.h"

namespace hymcache {

// Sets `options`' DaemonOptions fields from the flags, and the build it
// reports from BuildInfo() (common/build_info.h). Leaves the others alone
// (tls.server_name among them: the storage node's own flag).
void DaemonOptionsFromFlags(DaemonOptions* options);

// The start of a daemon's main(), the same for both daemons: Abseil's
// mutex deadlock detector off (Debian builds Abseil with it on: a global
// lock-order graph updated on every absl::Mutex acquisition, gRPC's
// included; a debugging aid, too costly for the data path, which the tests
// keep); the command line parsed (ParseCommandLine, with daemon logging)
// with `options.groups` followed by the groups every daemon shares,
// "Security" (the flags above but --metrics_listen, which a daemon places
// itself, then `more_security_flags`), "gRPC" and "Logging"; then glog
// started.
void StartDaemonMain(CommandLineOptions options,
                     const std::vector<std::string>& more_security_flags,
                     int* argc, char*** argv);

// Sets gRPC's poll strategy from --grpc_poll_strategy (common/grpc_polling.h):
// "poll" or "epoll1" as named; "auto" (the default) leaves a strategy
// GRPC_POLL_STRATEGY names, else takes `auto_strategy` ("" for gRPC's own
// default, epoll1), the daemon's measured choice. Call right after
// StartDaemonMain, before any gRPC object. Errors: InvalidArgument naming
// the flag (for ExitForBadFlags).
absl::Status ApplyGrpcPollStrategyFlag(absl::string_view auto_strategy);

// A daemon's answer to flags it cannot use: "<program>: <message>" on
// stderr (where daemons log), then the exit status for bad usage, 2, which
// the systemd units do not restart on.
int ExitForBadFlags(absl::string_view program, const absl::Status& status);

}  // namespace hymcache
