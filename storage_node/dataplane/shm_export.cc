#include "storage_node/dataplane/shm_export.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "common/transport_params.h"
#include "glog/logging.h"

namespace hymcache::storage {

absl::StatusOr<std::unique_ptr<ShmExport>> ShmExport::Create(
    const ShmExportOptions& options) {
  std::unique_ptr<ShmExport> e(new ShmExport());
  e->options_ = options;
  for (const MemoryArea& a : options.areas) {
    if (a.fd < 0) continue;
    // A read-only descriptor of the memfd: a client can map it PROT_READ
    // only.
    const std::string path = absl::StrCat("/proc/self/fd/", a.fd);
    int ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ro < 0) {
      return absl::InternalError(
          absl::StrCat("shm export: reopen ", path, " read-only: ", strerror(errno)));
    }
    e->fds_.push_back(ro);
    absl::StrAppend(&e->payload_, a.area_id, ":", a.length, "\n");
    absl::StrAppend(&e->areas_param_, e->areas_param_.empty() ? "" : ",",
                    a.area_id, ":", a.length);
  }
  if (e->fds_.empty()) {
    return absl::FailedPreconditionError(
        "shm export: the device has no shareable memory");
  }
  absl::BitGen gen;
  e->instance_ = absl::StrCat(absl::Uniform<uint64_t>(gen));
  e->name_ = options.socket_name.empty()
                 ? absl::StrCat("hymcache-shm-", getpid(), "-", e->instance_)
                 : options.socket_name;
  absl::StatusOr<Socket> l = ListenUnixAbstract(e->name_);
  if (!l.ok()) return l.status();
  e->listen_ = std::move(*l);
  e->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (e->stop_fd_ < 0) {
    return absl::InternalError(absl::StrCat("shm export: eventfd: ", strerror(errno)));
  }
  ShmExport* p = e.get();
  absl::StatusOr<Thread> thread =
      Thread::Start("shm-export", [p] { p->Loop(); });
  if (!thread.ok()) return thread.status();
  e->thread_ = std::move(*thread);
  LOG(INFO) << "shm export: " << e->fds_.size()
            << " memory areas for same-host clients on @" << e->name_;
  return e;
}

ShmExport::~ShmExport() {
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof(one)) < 0) {
      PLOG(ERROR) << "shm export: cannot stop its thread";
    }
    thread_.Join();
    close(stop_fd_);
  }
  for (int fd : fds_) close(fd);
}

std::map<std::string, std::string> ShmExport::TransportParams() const {
  return {{kShmHostParam, LocalHostIdentity()},
          {kShmSocketParam, name_},
          {kShmInstanceParam, instance_},
          {kShmAreasParam, areas_param_}};
}

uint64_t ShmExport::served() const { return served_.load(); }
uint64_t ShmExport::refused() const { return refused_.load(); }

void ShmExport::Loop() {
  while (true) {
    pollfd p[2] = {{listen_.fd(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int r = poll(p, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      PLOG(ERROR) << "shm export: poll";
      return;
    }
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    int fd = accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Socket conn(fd);
    Serve(fd);
  }
}

bool ShmExport::Allowed(const ShmExportOptions& options, uid_t me,
                        const ucred& cred, const std::vector<gid_t>& groups) {
  auto listed = [](const auto& list, auto v) {
    return std::find(list.begin(), list.end(), v) != list.end();
  };
  if (cred.uid == me && options.allow_own_user) return true;
  if (cred.uid == 0 && options.allow_root) return true;
  if (listed(options.allowed_uids, cred.uid)) return true;
  if (listed(options.allowed_gids, cred.gid)) return true;
  for (gid_t g : groups) {
    if (listed(options.allowed_gids, g)) return true;
  }
  return false;
}

void ShmExport::Serve(int fd) {
  absl::StatusOr<ucred> who = PeerCredentials(fd);
  if (!who.ok()) {
    refused_.fetch_add(1);
    return;
  }
  std::vector<gid_t> groups;
  if (!options_.allowed_gids.empty()) {
    absl::StatusOr<std::vector<gid_t>> g = PeerGroups(fd);
    if (g.ok()) {
      groups = *std::move(g);
    } else {
      LOG_EVERY_N(WARNING, 100) << "shm export: " << g.status()
                                << " (checking the primary group only)";
    }
  }
  if (!Allowed(options_, geteuid(), *who, groups)) {
    refused_.fetch_add(1);
    LOG_EVERY_N(WARNING, 100) << "shm export: refusing uid " << who->uid
                              << " gid " << who->gid << " (pid " << who->pid
                              << "): not in --shm_allowed_uids / "
                                 "--shm_allowed_gids";
    SendWithFds(fd, "denied\n", {}).IgnoreError();
    return;
  }
  absl::Status s = SendWithFds(fd, payload_, fds_);
  if (s.ok()) {
    served_.fetch_add(1);
  } else {
    VLOG(1) << "shm export: " << s;
  }
}

}  // namespace hymcache::storage
