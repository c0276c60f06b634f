// KvManager: the storage node's request-level prefetcher. It turns the
// ordered block lists that clients announce for their requests ("sessions",
// see the read-path session frames of common/wire.h) into staging of those
// blocks from the device's capacity tier into its DRAM window, just ahead of
// the reads, and coordinates that across concurrent requests.
//
//   * Each session has an ordered queue of objects. Objects are issued to the
//     device (MemoryDevice::PrefetchObject) in queue order while the
//     session's staged-ahead bytes (issued, not yet read or released) stay
//     within its quota: window_bytes (default 128 MiB: 8 blocks of 16 MiB,
//     4 of 32 MiB), or, when staging_capacity is set, at most an equal share
//     of it: min(window_bytes, staging_capacity / active sessions). A session
//     always gets at least one object issued, so every session progresses.
//   * A read of a queued object (AcquireRead) waits for its staging (issuing
//     it at once if it was still queued) and FinishRead releases it and
//     issues the next objects of the session.
//   * Release drops objects unread (all of them: the load was cancelled).
//     A session with no activity for session_timeout is released the same
//     way by the "kv-reaper" thread, so a request that stops reading does
//     not hold staging space.
//   * Each staged object holds an ExtentTable read pin from issue to release,
//     so its space cannot be rewritten under it (a writer waits, then fails).
//     An object that is no longer readable when it is issued (evicted,
//     overwritten) is dropped from the queue; its read then gets NotFound.
//   * A hint for an object already in the session costs nothing; the same
//     object hinted by several sessions, or still in the write buffer, is
//     staged once by the device (shared copies, no I/O for the buffer).
//   * Think-time hints (HintTurn, kv_manager_hints.cc): the blocks a
//     conversation will read at its next turn, sent when its current turn
//     is answered. They are staged only while the window is idle (no
//     session waits for window space), soonest expected first, within
//     hint_share of the staging window; a session that needs the space
//     takes it back (the latest expected hint yields first and is staged
//     again later). A session prefetching a hinted object joins its staged
//     copy and the hint's hold ends; a hint nobody claims is released when
//     its hold runs out (counted as wasted).
//
// Thread safety: safe for concurrent use. StagedRead objects must be passed
// to FinishRead (or destroyed) before the manager is destroyed.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/stats.h"
#include "common/thread.h"
#include "storage_node/dataplane/extent_table.h"
#include "storage_node/device/memory_device.h"

namespace hymcache::storage {

struct KvManagerOptions {
  // Staged bytes a session may have ahead of its reads.
  // Default: 128 MiB.
  uint64_t window_bytes = uint64_t{128} << 20;
  // The device's staging window, shared fairly among active sessions. 0: no
  // bound beyond window_bytes (DRAM devices: staging costs nothing).
  // Default: 0.
  uint64_t staging_capacity = 0;
  // A session with no prefetch, read or release for this long is released.
  // Default: 5 s.
  absl::Duration session_timeout = absl::Seconds(5);
  // Sessions at once; hints for new sessions beyond this are refused
  // (ResourceExhausted). Default: 4096.
  int max_sessions = 4096;
  // Objects queued in one session; hints beyond are refused.
  // Default: 65536.
  int max_objects_per_session = 65536;
  // How often the reaper looks for idle sessions and expired think-time
  // hints. Default: 250 ms.
  absl::Duration reap_interval = absl::Milliseconds(250);
  // Share of staging_capacity that think-time hints may hold staged, in
  // [0, 1]; 0 turns them off (hints are then accepted and ignored, as on a
  // device without a staging window). Default: 0.5.
  double hint_share = 0.5;
  // Think-time hinted objects held (queued or staged) at once; more are
  // refused (ResourceExhausted). Default: 65536.
  int max_hints = 65536;
  // Longest a hint holds its object from when it arrives (expected time
  // plus hold, cut to this). Default: 5 min.
  absl::Duration max_hint_hold = absl::Minutes(5);
  // How long after a read claims a think-time hint (its turn has come) the
  // hint's objects that turn has not read are released (unused): a turn's
  // load may take several prefetch lists and reads. > 0. Default: 2 s.
  absl::Duration hint_turn_grace = absl::Seconds(2);
  // Hinted objects being read from the capacity tier at once: a request
  // that arrives meanwhile shares the device with at most this many hint
  // refills. >= 1. Default: 2.
  int max_hint_refills = 2;
  // Think-time hints start refills only in idle device time: while no
  // request's prefetch session is open on the node. A request that arrives
  // then shares the device (and, where the capacity tier costs CPU, as
  // zram does, the cores) only with the refills already running, at most
  // max_hint_refills, never with new ones. False: refills also start beside
  // open sessions whose objects are all issued (they only yield window
  // space a session needs). Default: true.
  bool hints_when_idle = true;
  // Not owned; required; must outlive the manager.
  MemoryDevice* device = nullptr;
  ExtentTable* extents = nullptr;
  // Source of time for session timeouts. Not owned. Default: Clock::Real().
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

// The KV manager's stats, declared once (common/stats.h); exported with the
// prefix "prefetch_".
#define HYM_KV_MANAGER_STATS(COUNTER, GAUGE, DGAUGE)                           \
  GAUGE(sessions, "Active prefetch sessions")                                  \
  GAUGE(queued_objects, "Hinted objects not yet issued to the device")         \
  GAUGE(staging_objects, "Objects issued to the device, not yet read")         \
  GAUGE(staged_ahead_bytes, "Bytes of staging_objects")                        \
  COUNTER(hints, "Objects accepted into sessions")                             \
  COUNTER(duplicate_hints, "Hints of objects already in the session")          \
  COUNTER(refused_hints, "Hints over max_sessions or the per-session limit")   \
  COUNTER(staged_reads, "Reads served through a session")                      \
  COUNTER(ready_reads, "Session reads whose object was staged in time (hits)") \
  COUNTER(waited_reads,                                                        \
          "Session reads that waited for their object's staging")              \
  COUNTER(dropped_stale, "Objects not readable any more when issued")          \
  COUNTER(released_unread, "Objects dropped by Release or the reaper unread")  \
  COUNTER(expired_sessions, "Sessions released by the reaper")                 \
  GAUGE(turn_hints_held, "Think-time hinted objects queued or staged")         \
  GAUGE(turn_hint_bytes, "Bytes staged for think-time hints")                  \
  GAUGE(turn_hint_refills, "Hinted objects being read from the capacity tier") \
  COUNTER(turn_hints, "Objects hinted for a conversation's next turn")         \
  COUNTER(turn_hints_staged, "Think-time hinted objects staged")               \
  COUNTER(turn_hint_hits,                                                      \
          "Session prefetches that found their object staged by a hint")       \
  COUNTER(turn_hint_late,                                                      \
          "Session prefetches of a hinted object not staged yet")              \
  COUNTER(turn_hints_wasted, "Hinted objects staged, then expired unused")     \
  COUNTER(turn_hints_expired, "Hinted objects expired before being staged")    \
  COUNTER(turn_hints_yielded,                                                  \
          "Staged hinted objects that gave their space to a session")          \
  COUNTER(turn_hints_cancelled, "Hinted objects dropped by an end hint")       \
  COUNTER(turn_hints_unused, "Hinted objects their turn came without reading") \
  COUNTER(turn_hints_refused, "Think-time hints over max_hints")
HYM_DECLARE_STATS_STRUCT(KvManagerStats, HYM_KV_MANAGER_STATS);

class KvManager {
 private:
  struct Entry;
  struct Session;
  // A think-time hinted object (kv_manager_hints.cc).
  struct TurnHint {
    ExtentKey key;
    absl::Time due;
    absl::Time expires;
    uint64_t seq = 0;  // arrival order: read order among equal due times
    // The hints (HintTurn calls: batches, oldest first) holding this
    // object, each with the object's position in it: a shared prefix is
    // hinted by every conversation that continues it.
    struct Ref {
      uint64_t batch;
      uint32_t pos;
    };
    std::vector<Ref> batches;
    bool claimed = false;  // read at least once while hinted
    bool staged = false;
    bool ready = false;        // staged and its bytes in the window
    ExtentTable::ReadPin pin;  // staged
    PrefetchHandle handle;     // staged
  };

 public:
  // An object being read through its session. Move-only; pass it to
  // FinishRead once its bytes are sent (destroying it does the same).
  class StagedRead {
   public:
    StagedRead() = default;
    StagedRead(StagedRead&& o) noexcept { *this = std::move(o); }
    StagedRead& operator=(StagedRead&& o) noexcept;
    ~StagedRead();
    StagedRead(const StagedRead&) = delete;
    StagedRead& operator=(const StagedRead&) = delete;

    bool valid() const { return manager_ != nullptr; }
    const uint8_t* data() const { return data_; }
    uint64_t length() const { return length_; }

   private:
    friend class KvManager;
    KvManager* manager_ = nullptr;
    uint64_t session_ = 0;
    Entry* entry_ = nullptr;
    const uint8_t* data_ = nullptr;
    uint64_t length_ = 0;
  };

  // Starts the reaper. Errors: InvalidArgument for bad options,
  // ResourceExhausted if the thread cannot start.
  static absl::StatusOr<std::unique_ptr<KvManager>> Create(
      const KvManagerOptions& options);
  // Releases every session.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // Appends `objects` (in read order) to `session`'s queue, creating it, and
  // issues what its quota allows. Per object: OK (queued or staging),
  // NotFound (issued at once and not readable on this node), InvalidArgument
  // / OutOfRange (bad range), ResourceExhausted (session limits).
  std::vector<absl::Status> Prefetch(uint64_t session,
                                     absl::Span<const ExtentKey> objects);

  // Waits (up to `deadline`) until `key`, prefetched by `session`, is staged
  // and returns its bytes. NotFound if the session did not prefetch it (or
  // it was dropped): the caller reads it the ordinary way.
  // DeadlineExceeded / the device's error if staging did not finish; the
  // object is then released.
  absl::StatusOr<StagedRead> AcquireRead(uint64_t session, const ExtentKey& key,
                                         absl::Time deadline);

  // As AcquireRead, but never waits: Unavailable ("not staged yet") if the
  // object is still being staged, which leaves it queued in the session.
  // A reader holding staged objects must not wait for more (sessions
  // holding part of the window while waiting for the rest could starve
  // each other); it sends what it holds and asks again.
  absl::StatusOr<StagedRead> AcquireReadIfStaged(uint64_t session,
                                                 const ExtentKey& key);

  // Releases a read object and stages the session's next objects.
  void FinishRead(StagedRead read);

  // Drops `objects` of `session` unread; an empty list drops all of them and
  // ends the session. Objects being read are released when their read
  // finishes. Per object: OK or NotFound (not in the session).
  std::vector<absl::Status> Release(uint64_t session,
                                    absl::Span<const ExtentKey> objects);

  // Think-time hint: `objects` (in read order) are likely read by a request
  // `expected_in` from now (a conversation's next turn); stage them while
  // the window is idle and hold them until `expected_in + hold` from now
  // (at most max_hint_hold). Hinting an object again (another conversation
  // continuing a shared prefix, or the same one again) adds a hint: it is
  // staged by the earliest due time, held to the latest expiry, and ends
  // when every hint is claimed by a read or ended. A `hold` of zero or less
  // ends one hint of each of `objects` (the conversation ended). Advice only:
  // per object OK, or ResourceExhausted over max_hints, or NotFound (an end
  // hint for an object not hinted). An unreadable object is dropped when it
  // would be staged.
  std::vector<absl::Status> HintTurn(absl::Span<const ExtentKey> objects,
                                     absl::Duration expected_in,
                                     absl::Duration hold);

  // `objects` were just read outside any session (their device reads hold
  // them now): ends their think-time hints, counted as hits if they were
  // staged.
  void EndHintsOfReads(absl::Span<const ExtentKey> objects);

  // Releases sessions idle for session_timeout and think-time hints past
  // their hold; returns how many sessions. The reaper calls it every
  // reap_interval; tests with a FakeClock call it.
  int ReapExpired();

  KvManagerStats Stats() const;
  // Reports Stats() and the time session reads waited for staging
  // ("wait_seconds"), unprefixed.
  void VisitStats(StatsVisitor* v) const;

 private:
  struct KeyHash {
    size_t operator()(const ExtentKey& k) const;
  };
  struct KeyEq {
    bool operator()(const ExtentKey& a, const ExtentKey& b) const {
      return a.region_id == b.region_id && a.addr == b.addr &&
             a.length == b.length && a.generation == b.generation;
    }
  };

  explicit KvManager(const KvManagerOptions& options);

  void ReapLoop();
  uint64_t QuotaLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Issues queued objects of `s` within its quota.
  void PumpLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PumpAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pins and starts staging `e`; false (and `*why`) if it is not readable.
  bool IssueLocked(Session* s, Entry* e, absl::Status* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees `e` (device handle, pin) and removes it from `s`.
  void DropLocked(Session* s, Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every entry not being read; ends the session when none is left.
  void ReleaseAllLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Think-time hints (kv_manager_hints.cc). Stages queued hints, soonest
  // expected first, while no session waits and the hint budget has room.
  void PumpHintsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a session issues `key`: unstages hints (latest expected first)
  // until the window has room for it, unless a hint holds `key` itself.
  void MakeRoomForSessionLocked(const ExtentKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a session issued `key` (sharing a staged copy), or a plain read
  // read it: counts the hit (or late), and if `key` is among the last
  // objects of a hint (batch), that hint's turn has come: it ends
  // hint_turn_grace later (batch_ends_).
  void ClaimHintLocked(const ExtentKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The turn of `batch` has been read: its objects the turn did not read
  // are not needed (turn_hints_unused); ends their hints of that batch.
  void EndBatchLocked(uint64_t batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `batch` from `h` (and `h`'s key from the batch); drops `h` when
  // no batch holds it any more.
  void RemoveBatchLocked(TurnHint* h, uint64_t batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unstages `h` (device handle, pin) and queues it again.
  void UnstageHintLocked(TurnHint* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unstages or unqueues `h` and forgets it.
  void DropHintLocked(TurnHint* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops hints whose hold ran out by `now`, and the unread objects of
  // batches whose turn came hint_turn_grace ago.
  void ExpireHintsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t HintBudget() const;
  // Marks staged hints whose refill finished (a probe of the device).
  void ProbeHintsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "kv-hints": while hint refills are in flight, notices their end and
  // stages the next hints (the refills are paced by max_hint_refills).
  void HintLoop();
  void EraseIfEmptyLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(uint64_t session, Entry* e);
  absl::StatusOr<StagedRead> Acquire(uint64_t session, const ExtentKey& key,
                                     absl::Time deadline, bool wait);

  // Constant after construction.
  const KvManagerOptions options_;
  Clock* const clock_;
  // Time session reads waited for their object's staging (waited_reads).
  LatencyHistogram wait_latency_;
  Thread reaper_;
  Thread hinter_;

  mutable Mutex mu_;
  CondVar stop_cv_;
  // Signalled when a hint refill starts (and on stop): wakes "kv-hints".
  CondVar hint_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
  // Session entries not issued yet (requests waiting for the window), and
  // the bytes sessions have issued: what think-time hints must leave
  // alone.
  uint64_t session_queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t session_issued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Think-time hints by object; the unstaged ones by (due, arrival), the
  // staged ones likewise (the latest due yields its space first).
  absl::flat_hash_map<ExtentKey, std::unique_ptr<TurnHint>, KeyHash, KeyEq>
      turn_hints_ ABSL_GUARDED_BY(mu_);
  using HintOrder = std::set<std::tuple<absl::Time, uint64_t, TurnHint*>>;
  HintOrder hint_queue_ ABSL_GUARDED_BY(mu_);
  HintOrder hint_staged_ ABSL_GUARDED_BY(mu_);
  uint64_t next_hint_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Each HintTurn call's objects still hinted by it, and how many it had.
  struct HintBatch {
    absl::flat_hash_set<ExtentKey, KeyHash, KeyEq> left;
    uint32_t size = 0;
  };
  absl::flat_hash_map<uint64_t, HintBatch> hint_batches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_hint_batch_ ABSL_GUARDED_BY(mu_) = 1;
  // Batches whose turn came, and when their unread objects go.
  absl::flat_hash_map<uint64_t, absl::Time> batch_ends_ ABSL_GUARDED_BY(mu_);
  uint64_t hint_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Staged hints not ready yet (refills in flight; max_hint_refills).
  std::vector<TurnHint*> hints_loading_ ABSL_GUARDED_BY(mu_);
  KvManagerStats counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hymcache::storage
