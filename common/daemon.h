// The plumbing both daemons (hymcache-master, hymcache-storage) compose, so
// that it is written once and cannot drift between them:
//
//   DaemonOptions   the security and observability options of a serving
//                   daemon (identities, protected mode, TLS, the metrics
//                   endpoint, the build it reports) and their Validate();
//                   MasterOptions and StorageNodeOptions derive from it
//                   (RocksDB's Options : DBOptions).
//   ServerSecurity  the identities (Authenticator) and the reloadable TLS
//                   credentials built from DaemonOptions, re-read together
//                   on SIGHUP; what was loaded (with the identities'
//                   warnings), or why not, is logged either way.
//   VisitBuildInfo  the build_info{version, commit} and
//                   grpc_poll_strategy{strategy} gauges.
//   DaemonSignals   main()'s signal loop: SIGTERM/SIGINT stop, SIGHUP
//                   reloads, received synchronously (sigwait) and told to
//                   systemd (common/systemd.h) as the unit's status line.
//   ServeUntilStopped  main()'s serving life under systemd: start, READY=1,
//                   watchdog pings while the server answers, reloads, and
//                   STOPPING=1 and shutdown on a stop signal.
//
//   int main() {
//     DaemonSignals signals;              // before any thread starts
//     return ServeUntilStopped(signals, "starting", "shutting down", [&] {
//       ASSIGN_OR_RETURN(auto server, Server::Create(options));
//       printf(<the ready line>);
//       return ServingDaemonOf(std::move(server), "serving on ...");
//     });
//   }
//
// Thread safety: DaemonOptions is a value. ServerSecurity is safe for
// concurrent use without external synchronization (calls are checked while
// a reload replaces the tables). DaemonSignals belongs to main()'s thread.
#pragma once

#include <signal.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security.h"

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace hymcache {

class StatsVisitor;
class SystemdNotifier;

// What every serving daemon is told about its callers and its metrics.
struct DaemonOptions {
  // Identities file (or directory) of the daemon's gRPC callers
  // (common/security.h: "role tenant name sha256:HEX | cert:NAME" lines),
  // re-read on SIGHUP. "" turns authentication off: every caller is an
  // admin, and only a loopback listen address is allowed unless
  // `insecure`. Default: "".
  std::string auth_tokens_file;
  // Listen on a non-loopback address without identities. Default: false.
  bool insecure = false;
  // TLS of the daemon's gRPC service (server certificate; client
  // certificates verified against tls.ca_file), re-read on SIGHUP. A
  // daemon that also calls out (a storage node to its master) uses the
  // same files as its client side (see StorageNodeOptions). Default:
  // plaintext.
  TlsOptions tls;
  // HOST:PORT serving Prometheus metrics (GET /metrics; docs/operations.md);
  // port 0 picks a free port. "" serves none. A non-loopback host needs
  // what the listen address needs (identities or `insecure`). Default: "".
  std::string metrics_listen;
  // The build, exported as build_info{version, commit} = 1 (the daemons
  // pass their BuildInfo()). Default: "" (no build_info series).
  std::string build_version;
  std::string build_commit;

  // InvalidArgument, its message starting with `daemon` ("master"): bad
  // TLS options, a non-loopback `listen_host` or metrics_listen without
  // identities or `insecure` (protected mode), a metrics_listen that is
  // not HOST:PORT.
  // (The daemons' own Validate() calls it; theirs hides it by name.)
  absl::Status Validate(absl::string_view daemon,
                        absl::string_view listen_host) const;
};

// build_info{version, commit} = 1, when options.build_version is set; and
// grpc_poll_strategy{strategy} = 1 once gRPC runs in the process
// (GrpcPollStrategyInUse, common/grpc_polling.h: what --grpc_poll_strategy
// chose).
void VisitBuildInfo(const DaemonOptions& options, StatsVisitor* v);

// A serving daemon's identities and TLS credentials: loaded from
// DaemonOptions at start, reloaded on SIGHUP. A reload that fails keeps
// what was in force; every outcome is logged, prefixed with the daemon's
// name, with the identities file's warnings (Authenticator::Warnings) at
// start and after each reload.
class ServerSecurity {
 public:
  // Reads the identities (none without auth_tokens_file) and the TLS
  // files, and logs what was loaded, or protected mode (loopback
  // `listen_host`), or a warning that anyone may call (`insecure`).
  // Errors: those of Authenticator::Create and ReloadableServerTls::Create.
  static absl::StatusOr<std::unique_ptr<ServerSecurity>> Create(
      const DaemonOptions& options, std::string daemon,
      absl::string_view listen_host);
  ServerSecurity(const ServerSecurity&) = delete;
  ServerSecurity& operator=(const ServerSecurity&) = delete;

  // Checks callers' credentials; null when authentication is off. Owned by
  // this object and valid as long as it is.
  const Authenticator* authenticator() const { return auth_.get(); }
  // For ServerBuilder::AddListeningPort: insecure without TLS; with TLS,
  // every new connection gets the material of the last good reload.
  std::shared_ptr<grpc::ServerCredentials> credentials() const;

  // Re-reads the identities file. On error the old identities stay (the
  // error is returned and logged). OkStatus when authentication is off.
  absl::Status ReloadIdentities();
  // Re-reads the TLS certificate, key and CA files for new connections
  // (open ones keep theirs). A file that does not read or parse, or a key
  // that does not match, keeps the old ones (returned and logged).
  // OkStatus without TLS.
  absl::Status ReloadCertificates();
  // Both (SIGHUP): each is attempted; the first error is returned.
  absl::Status Reload();

  // Identities in force (0 with authentication off).
  size_t identities() const;

 private:
  explicit ServerSecurity(std::string daemon) : daemon_(std::move(daemon)) {}
  // The identities' warnings, one WARNING each.
  void LogWarnings() const;

  // Constant after Create.
  const std::string daemon_;
  std::unique_ptr<Authenticator> auth_;  // null: authentication off
  std::unique_ptr<ReloadableServerTls> tls_;
};

// The signals a daemon stops on (SIGTERM, SIGINT) and reloads on (SIGHUP).
// The constructor blocks them in the calling thread, and so in every thread
// started from it afterwards (threads inherit the mask), so that only
// WaitForStop receives them: no work runs in a signal handler. It also
// ignores SIGPIPE (a peer that goes away is an error, not death). Create it
// in main() before any thread starts (the systemd watchdog's included).
class DaemonSignals {
 public:
  DaemonSignals();
  DaemonSignals(const DaemonSignals&) = delete;
  DaemonSignals& operator=(const DaemonSignals&) = delete;

  // Waits for a stop signal and returns it. On each SIGHUP first calls
  // `reload` and tells `notifier` (may be null) the outcome as the unit's
  // status: `serving_status` + "; identities reloaded", or "reload failed
  // (the old identities and certificates stay): ERROR".
  int WaitForStop(SystemdNotifier* notifier, const std::string& serving_status,
                  const std::function<absl::Status()>& reload);

  // SIGHUPs handled by WaitForStop so far.
  uint64_t reloads() const { return reloads_; }

  // The signals blocked (SIGTERM, SIGINT, SIGHUP), for a caller that waits
  // for them itself (master/main_ha.cc polls them between election checks).
  const sigset_t& signals() const { return signals_; }

 private:
  sigset_t signals_;
  uint64_t reloads_ = 0;
};

// A started server as ServeUntilStopped drives it.
struct ServingDaemon {
  // The unit's status line while it serves (and after a reload).
  std::string status;
  // Asked before each watchdog ping (the server's CheckAlive).
  std::function<absl::Status(absl::Duration timeout)> check_alive;
  // On each SIGHUP (the server's Reload: identities and certificates).
  std::function<absl::Status()> reload;
  // On a stop signal, after STOPPING=1 and the watchdog's end.
  std::function<void()> shutdown;
};

// A ServingDaemon over `server`, a type with CheckAlive(absl::Duration),
// Reload() and Shutdown() (MasterServer, StorageNode); it owns the server,
// which goes when the ServingDaemon does.
template <typename Server>
ServingDaemon ServingDaemonOf(std::unique_ptr<Server> server,
                              std::string status) {
  std::shared_ptr<Server> s = std::move(server);
  return ServingDaemon{
      std::move(status),
      [s](absl::Duration timeout) { return s->CheckAlive(timeout); },
      [s] { return s->Reload(); }, [s] { s->Shutdown(); }};
}

// main()'s serving life, the same for both daemons, under systemd
// (Type=notify) or not: tells `starting_status`, runs `start` (which
// creates the server and prints the daemon's ready line), then READY=1
// with the server's status; pings the watchdog while check_alive passes
// (always while `start` runs); reloads on SIGHUP (DaemonSignals::
// WaitForStop); on SIGTERM/SIGINT, STOPPING=1 with `stopping_status`, the
// watchdog joined, then shutdown. Call it after `signals` exists (the
// watchdog thread inherits the mask). Returns main()'s exit code: 1 when
// `start` fails (logged, and told as the unit's status), else 0.
int ServeUntilStopped(
    DaemonSignals& signals, const std::string& starting_status,
    const std::string& stopping_status,
    const std::function<absl::StatusOr<ServingDaemon>()>& start);

}  // namespace hymcache
