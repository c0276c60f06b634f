#include "master/standby_snapshots.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "master/master_service.h"

namespace hymcache {

absl::Status StandbySnapshotsOptions::Validate() const {
  if (!master.index_snapshots || master.service.snapshot_changes == 0) {
    return absl::InvalidArgumentError(
        "standby snapshots need index_snapshots and service.snapshot_changes "
        "> 0");
  }
  if (!applied) {
    return absl::InvalidArgumentError("standby snapshots need `applied`");
  }
  if (nice < 0 || nice > 19) {
    return absl::InvalidArgumentError("nice must be 0..19");
  }
  if (check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("check_interval must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StandbySnapshots>> StandbySnapshots::Start(
    const StandbySnapshotsOptions& options) {
  absl::Status s = options.Validate();
  if (!s.ok()) return s;
  std::unique_ptr<StandbySnapshots> out(new StandbySnapshots(options));
  StandbySnapshots* raw = out.get();
  auto thread = Thread::Start("standby-snap", [raw] { raw->Loop(); });
  if (!thread.ok()) return thread.status();
  out->thread_ = std::move(thread).value();
  return out;
}

StandbySnapshots::StandbySnapshots(const StandbySnapshotsOptions& options)
    : options_(options) {}

StandbySnapshots::~StandbySnapshots() {
  Stop();
  thread_.Join();
}

void StandbySnapshots::Stop() {
  MutexLock l(&mu_);
  stopping_ = true;
  cv_.SignalAll();
  while (writing_) cv_.Wait(&mu_);
}

StandbySnapshots::Stats StandbySnapshots::GetStats() const {
  MutexLock l(&mu_);
  return stats_;
}

void StandbySnapshots::Loop() {
  // Below the master's other threads (Linux: a thread's own nice value,
  // inherited by the load's helper threads): a view still loading when
  // this master is elected yields the cores to the elected master's load.
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)),
                    options_.nice) != 0) {
    PLOG(WARNING) << "standby snapshot: cannot lower the thread's priority";
  }
  uint64_t base = 0;  // applied when the last view was opened
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    base = options_.applied();
  }
  while (true) {
    uint64_t now = 0;
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      cv_.WaitWithDeadline(&mu_, absl::Now() + options_.check_interval);
      if (stopping_) return;
      now = options_.applied();
      ++stats_.checks;
      // Another leader's database (its sequences start over), or a copy.
      if (now < base) base = 0;
      const uint64_t due = std::max<uint64_t>(
          options_.master.service.snapshot_changes, objects_ / 2);
      if (now == 0 || now - base < due) continue;
    }
    // The view holds at least what was applied before it opened.
    if (Snapshot()) base = now;
  }
}

bool StandbySnapshots::Snapshot() {
  auto view = MasterServer::PreloadIndex(options_.master);
  if (!view.ok()) {
    LOG(WARNING) << "standby snapshot: cannot load a view of "
                 << options_.master.db_path << ": " << view.status();
    MutexLock l(&mu_);
    ++stats_.failed;
    return false;
  }
  const uint64_t objects = view->service->GetStats().object_count();
  {
    MutexLock l(&mu_);
    if (stopping_) return false;  // elected or shutting down: not ours now
    writing_ = true;
    objects_ = objects;
  }
  const absl::Time start = absl::Now();
  absl::Status s = view->service->WriteSnapshot();
  MutexLock l(&mu_);
  writing_ = false;
  cv_.SignalAll();
  if (!s.ok()) {
    LOG(WARNING) << "standby snapshot: not written: " << s;
    ++stats_.failed;
    return false;
  }
  ++stats_.written;
  stats_.last_sequence = view->sequence;
  LOG(INFO) << "standby snapshot: " << objects << " objects at sequence "
            << view->sequence << " (view loaded in "
            << absl::FormatDuration(view->took) << ", written in "
            << absl::FormatDuration(absl::Now() - start) << ")";
  return true;
}

}  // namespace hymcache
