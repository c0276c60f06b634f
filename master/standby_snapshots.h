// StandbySnapshots: index snapshots written by a standby master, so that the
// store it opens when elected loads from a recent snapshot plus the changes
// since instead of a scan (docs/ha.md, "A standby's snapshots").
//
// A leader writes its own snapshots (MasterServiceOptions::snapshot_changes);
// a standby has no service, only its follower's store. Every
// service.snapshot_changes leader sequences its follower applies (or half the
// index's objects, if more), this loads a read-only view of the store
// (MasterServer::PreloadIndex: itself from the last snapshot plus the
// changes since, when it can) and writes the view's index as the store's
// snapshot, at the sequence the view opened at. It runs on a thread of its
// own ("standby-snap"), off the standby's election loop.
//
// Thread safety: Stop and the destructor from the owner's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "master/master_server.h"

namespace hymcache {

struct StandbySnapshotsOptions {
  // The master's options: db_path, index_snapshots and
  // service.snapshot_changes (0, or index_snapshots off: Validate refuses).
  MasterOptions master;
  // The follower's applied leader sequence, 0 while it copies the leader's
  // store (no usable state). Called under the component's lock, never after
  // Stop returns.
  std::function<uint64_t()> applied;
  // How often `applied` is read. Default: 1 s.
  absl::Duration check_interval = absl::Seconds(1);
  // The thread's nice value (0..19): views load and snapshots are written
  // below the master's other threads. Default: 10.
  int nice = 10;

  absl::Status Validate() const;
};

class StandbySnapshots {
 public:
  // Starts the thread. InvalidArgument (Validate); ResourceExhausted if the
  // thread cannot start.
  static absl::StatusOr<std::unique_ptr<StandbySnapshots>> Start(
      const StandbySnapshotsOptions& options);
  // Stop(), then joins the thread (a view being loaded finishes first).
  ~StandbySnapshots();
  StandbySnapshots(const StandbySnapshots&) = delete;
  StandbySnapshots& operator=(const StandbySnapshots&) = delete;

  // No snapshot is started or written after it returns, and `applied` is
  // not called again. Waits for a snapshot being written (about 0.1 s per
  // million objects), not for a view being loaded: that one is dropped.
  void Stop();

  // Checks of `applied` made, snapshots written and failed, and the
  // sequence of the last one's view (0: none).
  struct Stats {
    uint64_t checks = 0;
    uint64_t written = 0;
    uint64_t failed = 0;
    uint64_t last_sequence = 0;
  };
  Stats GetStats() const;

 private:
  explicit StandbySnapshots(const StandbySnapshotsOptions& options);
  void Loop();
  // Loads a view and writes its snapshot unless stopped meanwhile; true if
  // one was written.
  bool Snapshot();

  const StandbySnapshotsOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The objects of the last view loaded (half of them: the next threshold).
  uint64_t objects_ ABSL_GUARDED_BY(mu_) = 0;
  Thread thread_;
};

}  // namespace hymcache
