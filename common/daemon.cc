#include "common/daemon.h"

#include <glog/logging.h>
#include <pthread.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_polling.h"
#include "common/stats.h"
#include "common/systemd.h"

namespace hymcache {

absl::Status DaemonOptions::Validate(absl::string_view daemon,
                                     absl::string_view listen_host) const {
  absl::Status s = tls.Validate();
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(daemon, ": ", s.message()));
  }
  const bool have_identities = !auth_tokens_file.empty();
  s = CheckProtectedMode(daemon, listen_host, have_identities, insecure);
  if (!s.ok()) return s;
  if (!metrics_listen.empty()) {
    s = CheckProtectedListen(absl::StrCat(daemon, ": metrics_listen"),
                             metrics_listen, have_identities, insecure);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void VisitBuildInfo(const DaemonOptions& options, StatsVisitor* v) {
  if (const std::string strategy = GrpcPollStrategyInUse(); !strategy.empty()) {
    const StatLabel poll[] = {{"strategy", strategy}};
    v->Gauge("grpc_poll_strategy",
             "1, labelled with how gRPC waits for I/O in this process "
             "(--grpc_poll_strategy)",
             1, poll);
  }
  if (options.build_version.empty()) return;
  const StatLabel build[] = {{"version", options.build_version},
                             {"commit", options.build_commit}};
  v->Gauge("build_info", "1, labelled with the build's version and commit", 1,
           build);
}

absl::StatusOr<std::unique_ptr<ServerSecurity>> ServerSecurity::Create(
    const DaemonOptions& options, std::string daemon,
    absl::string_view listen_host) {
  std::unique_ptr<ServerSecurity> security(
      new ServerSecurity(std::move(daemon)));
  const std::string& d = security->daemon_;
  if (!options.auth_tokens_file.empty()) {
    auto auth = Authenticator::Create(options.auth_tokens_file);
    if (!auth.ok()) return auth.status();
    security->auth_ = std::move(auth).value();
    LOG(INFO) << d << ": " << security->auth_->size() << " identities from "
              << options.auth_tokens_file;
    security->LogWarnings();
  } else if (IsLoopbackHost(listen_host)) {
    LOG(INFO) << d << ": protected mode (no identities configured): "
                      "listening on loopback only; every local caller is an "
                      "admin";
  } else {
    LOG(WARNING) << d << ": no identities and --insecure: anyone who can "
                         "reach "
                 << listen_host << " may call every method";
  }
  auto tls = ReloadableServerTls::Create(options.tls);
  if (!tls.ok()) return tls.status();
  security->tls_ = std::move(tls).value();
  return security;
}

std::shared_ptr<grpc::ServerCredentials> ServerSecurity::credentials() const {
  return tls_->credentials();
}

size_t ServerSecurity::identities() const {
  return auth_ == nullptr ? 0 : auth_->size();
}

void ServerSecurity::LogWarnings() const {
  // Warnings: what the table allows that an operator should know about
  // (e.g. node identities not bound to names); said at start and after
  // every reload, so a fix shows as their absence.
  for (const std::string& w : auth_->Warnings()) {
    LOG(WARNING) << daemon_ << ": " << w;
  }
}

absl::Status ServerSecurity::ReloadIdentities() {
  if (auth_ == nullptr) return absl::OkStatus();
  absl::Status s = auth_->Reload();
  if (s.ok()) {
    LOG(INFO) << daemon_ << ": reloaded " << auth_->size() << " identities";
    LogWarnings();
  } else {
    LOG(ERROR) << daemon_
               << ": identities not reloaded (the old ones stay): " << s;
  }
  return s;
}

absl::Status ServerSecurity::ReloadCertificates() {
  if (tls_ == nullptr) return absl::OkStatus();
  absl::Status s = tls_->Reload();
  if (!s.ok()) {
    LOG(ERROR) << daemon_
               << ": TLS certificates not reloaded (the old ones stay): " << s;
  } else if (tls_->reloads() != 0) {
    LOG(INFO) << daemon_
              << ": TLS certificates in force for new connections: reload "
              << tls_->reloads();
  }
  return s;
}

absl::Status ServerSecurity::Reload() {
  absl::Status identities = ReloadIdentities();
  absl::Status certificates = ReloadCertificates();
  return identities.ok() ? certificates : identities;
}

DaemonSignals::DaemonSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int DaemonSignals::WaitForStop(SystemdNotifier* notifier,
                               const std::string& serving_status,
                               const std::function<absl::Status()>& reload) {
  int sig = 0;
  while (true) {
    if (sigwait(&signals_, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    ++reloads_;
    absl::Status reloaded = reload();  // the reload logs its outcome
    if (notifier == nullptr) continue;
    notifier->Status(
        reloaded.ok()
            ? serving_status + "; identities reloaded"
            : "reload failed (the old identities and certificates stay): " +
                  reloaded.ToString());
  }
}

int ServeUntilStopped(
    DaemonSignals& signals, const std::string& starting_status,
    const std::string& stopping_status,
    const std::function<absl::StatusOr<ServingDaemon>()>& start) {
  std::atomic<const ServingDaemon*> serving{nullptr};
  auto notifier =
      SystemdNotifier::Create({.alive = [&serving](absl::Duration timeout) {
        const ServingDaemon* d = serving.load();
        return d == nullptr ? absl::OkStatus() : d->check_alive(timeout);
      }});
  notifier->Status(starting_status);
  absl::StatusOr<ServingDaemon> daemon = start();
  if (!daemon.ok()) {
    LOG(ERROR) << "cannot start: " << daemon.status();
    notifier->Status(daemon.status().ToString());
    return 1;
  }
  serving = &*daemon;
  notifier->Ready(daemon->status);
  const int sig =
      signals.WaitForStop(notifier.get(), daemon->status, daemon->reload);
  LOG(INFO) << "signal " << sig << ": shutting down";
  notifier->Stopping(stopping_status);
  serving = nullptr;
  notifier.reset();  // joins the watchdog thread before the server goes
  daemon->shutdown();
  return 0;
}

}  // namespace hymcache
