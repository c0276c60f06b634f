#include "common/daemon_flags.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/build_info.h"
#include "common/grpc_polling.h"

namespace {

// The defaults of every flag below.
const hymcache::DaemonOptions& Defaults() {
  static const hymcache::DaemonOptions* const d = new hymcache::DaemonOptions;
  return *d;
}

}  // namespace

DEFINE_string(auth_tokens_file, Defaults().auth_tokens_file.c_str(),
              "identities file or directory of the daemon's gRPC callers "
              "(docs/security.md; a storage node's are its control service's "
              "admins); re-read on SIGHUP. Empty: no authentication, "
              "loopback only");
DEFINE_bool(insecure, Defaults().insecure,
            "without --auth_tokens_file, listen on a non-loopback address "
            "anyway (every caller is an admin)");
DEFINE_string(tls_cert, Defaults().tls.cert_file.c_str(),
              "PEM server certificate chain (enables TLS; a storage node "
              "also presents it to the master as its client certificate); "
              "re-read on SIGHUP");
DEFINE_string(tls_key, Defaults().tls.key_file.c_str(),
              "PEM private key of --tls_cert");
DEFINE_string(tls_ca, Defaults().tls.ca_file.c_str(),
              "PEM CA certificates that verify client certificates (a "
              "storage node's also verify the master, and enable TLS "
              "towards it)");
DEFINE_bool(tls_require_client_cert, Defaults().tls.require_client_cert,
            "refuse TLS clients without a certificate signed by --tls_ca");
DEFINE_string(grpc_poll_strategy, "auto",
              "how gRPC waits for I/O in this daemon (common/grpc_polling.h): "
              "poll (a thread polls only its own calls' connections), "
              "epoll1 (gRPC's default: any waiting thread polls every "
              "connection and hands completions over), or auto: the "
              "GRPC_POLL_STRATEGY environment variable if set, else poll "
              "for a master with --etcd (its election and replication "
              "threads would poll its clients' connections: +25-35 us per "
              "lookup, docs/ha.md), else epoll1");
DEFINE_string(metrics_listen, Defaults().metrics_listen.c_str(),
              "HOST:PORT serving Prometheus metrics on /metrics (port 0 "
              "picks a free port; empty: none). Non-loopback only with "
              "--auth_tokens_file or --insecure");

namespace hymcache {

void DaemonOptionsFromFlags(DaemonOptions* options) {
  options->auth_tokens_file = FLAGS_auth_tokens_file;
  options->insecure = FLAGS_insecure;
  options->tls.cert_file = FLAGS_tls_cert;
  options->tls.key_file = FLAGS_tls_key;
  options->tls.ca_file = FLAGS_tls_ca;
  options->tls.require_client_cert = FLAGS_tls_require_client_cert;
  options->metrics_listen = FLAGS_metrics_listen;
  options->build_version = BuildInfo().version;
  options->build_commit = BuildInfo().git_commit;
}

void StartDaemonMain(CommandLineOptions options,
                     const std::vector<std::string>& more_security_flags,
                     int* argc, char*** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  FlagGroup security{"Security (docs/security.md)",
                     {"auth_tokens_file", "insecure", "tls_cert", "tls_key",
                      "tls_ca", "tls_require_client_cert"}};
  security.flags.insert(security.flags.end(), more_security_flags.begin(),
                        more_security_flags.end());
  options.groups.push_back(std::move(security));
  options.groups.push_back(
      {"Logging (stderr by default: journald)",
       {"log_dir", "logtostderr", "v", "vmodule", "minloglevel"}});
  options.groups.push_back({"gRPC", {"grpc_poll_strategy"}});
  options.daemon_logging = true;
  ParseCommandLine(options, argc, argv);
  google::InitGoogleLogging((*argv)[0]);
}

absl::Status ApplyGrpcPollStrategyFlag(absl::string_view auto_strategy) {
  absl::Status s =
      ApplyGrpcPollStrategyChoice(FLAGS_grpc_poll_strategy, auto_strategy);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("--grpc_poll_strategy: ", s.message()));
}

int ExitForBadFlags(absl::string_view program, const absl::Status& status) {
  std::cerr << program << ": " << status.message() << "\n";
  return 2;
}

}  // namespace hymcache
