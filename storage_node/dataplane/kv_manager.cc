#include "storage_node/dataplane/kv_manager.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache::storage {

// One object of a session's queue.
struct KvManager::Entry {
  enum class State { kQueued, kStaging, kReading };
  ExtentKey key;
  State state = State::kQueued;
  ExtentTable::ReadPin pin;  // kStaging, kReading
  PrefetchHandle handle;     // kStaging, kReading
};

struct KvManager::Session {
  // In read order; std::list keeps Entry pointers stable.
  std::list<Entry> entries;
  absl::flat_hash_map<ExtentKey, std::list<Entry>::iterator, KeyHash, KeyEq>
      by_key;
  uint64_t issued_bytes = 0;  // kStaging + kReading
  int reading = 0;
  absl::Time last_active;
};

size_t KvManager::KeyHash::operator()(const ExtentKey& k) const {
  return absl::HashOf(k.region_id, k.addr, k.length, k.generation);
}

absl::Status KvManagerOptions::Validate() const {
  if (window_bytes == 0) {
    return absl::InvalidArgumentError("kv manager: window_bytes must be > 0");
  }
  if (session_timeout <= absl::ZeroDuration() ||
      reap_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "kv manager: session_timeout and reap_interval must be > 0");
  }
  if (max_sessions < 1 || max_objects_per_session < 1) {
    return absl::InvalidArgumentError(
        "kv manager: max_sessions and max_objects_per_session must be >= 1");
  }
  if (!(hint_share >= 0 && hint_share <= 1) || max_hints < 1 ||
      max_hint_hold <= absl::ZeroDuration() || max_hint_refills < 1 ||
      hint_turn_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "kv manager: hint_share must be in [0, 1], max_hints and "
        "max_hint_refills >= 1, max_hint_hold and hint_turn_grace > 0");
  }
  if (device == nullptr || extents == nullptr) {
    return absl::InvalidArgumentError(
        "kv manager: device and extents are required");
  }
  return absl::OkStatus();
}

KvManager::StagedRead& KvManager::StagedRead::operator=(
    StagedRead&& o) noexcept {
  if (this != &o) {
    if (manager_ != nullptr) manager_->Finish(session_, entry_);
    manager_ = std::exchange(o.manager_, nullptr);
    session_ = o.session_;
    entry_ = std::exchange(o.entry_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    length_ = std::exchange(o.length_, 0);
  }
  return *this;
}

KvManager::StagedRead::~StagedRead() {
  if (manager_ != nullptr) manager_->Finish(session_, entry_);
}

absl::StatusOr<std::unique_ptr<KvManager>> KvManager::Create(
    const KvManagerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<KvManager> m(new KvManager(options));
  KvManager* p = m.get();
  absl::StatusOr<Thread> thread =
      Thread::Start("kv-reaper", [p] { p->ReapLoop(); });
  if (!thread.ok()) return thread.status();
  m->reaper_ = std::move(*thread);
  thread = Thread::Start("kv-hints", [p] { p->HintLoop(); });
  if (!thread.ok()) return thread.status();  // the destructor stops the reaper
  m->hinter_ = std::move(*thread);
  return m;
}

KvManager::KvManager(const KvManagerOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

KvManager::~KvManager() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    stop_cv_.SignalAll();
    hint_cv_.SignalAll();
  }
  reaper_.Join();
  hinter_.Join();
  MutexLock l(&mu_);
  while (!turn_hints_.empty())
    DropHintLocked(turn_hints_.begin()->second.get());
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  for (uint64_t id : ids) ReleaseAllLocked(id);
  if (!sessions_.empty()) {
    LOG(ERROR) << "kv manager: destroyed with reads in progress";
  }
}

void KvManager::ReapLoop() {
  while (true) {
    {
      MutexLock l(&mu_);
      const absl::Time until = absl::Now() + options_.reap_interval;
      while (!stopping_) {
        if (stop_cv_.WaitWithDeadline(&mu_, until)) break;
      }
      if (stopping_) return;
    }
    ReapExpired();
  }
}

int KvManager::ReapExpired() {
  MutexLock l(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> expired;
  for (const auto& [id, s] : sessions_) {
    // A session being read is not idle (the data server bounds a read).
    if (s->reading == 0 && now - s->last_active >= options_.session_timeout) {
      expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    VLOG(1) << "kv manager: session " << id << " idle for "
            << absl::FormatDuration(options_.session_timeout)
            << "; releasing its staged objects";
    ReleaseAllLocked(id);
  }
  counters_.expired_sessions += expired.size();
  ExpireHintsLocked(now);
  PumpHintsLocked();
  return static_cast<int>(expired.size());
}

uint64_t KvManager::QuotaLocked() const {
  uint64_t quota = options_.window_bytes;
  if (options_.staging_capacity > 0 && !sessions_.empty()) {
    quota = std::min<uint64_t>(quota,
                               options_.staging_capacity / sessions_.size());
  }
  return quota;
}

bool KvManager::IssueLocked(Session* s, Entry* e, absl::Status* why) {
  MakeRoomForSessionLocked(e->key);
  absl::StatusOr<ExtentTable::ReadPin> pin = options_.extents->PinRead(e->key);
  if (!pin.ok()) {
    *why = pin.status();
    return false;
  }
  absl::StatusOr<PrefetchHandle> h = options_.device->PrefetchObject(
      e->key.region_id, e->key.addr, e->key.length);
  if (!h.ok()) {
    *why = h.status();
    return false;  // `pin` releases
  }
  e->pin = std::move(*pin);
  e->handle = *h;
  e->state = Entry::State::kStaging;
  s->issued_bytes += e->key.length;
  session_issued_bytes_ += e->key.length;
  --session_queued_;
  // The session shares the hint's staged copy now; the hint is claimed.
  ClaimHintLocked(e->key);
  return true;
}

void KvManager::PumpLocked(Session* s) {
  const uint64_t quota = QuotaLocked();
  for (auto it = s->entries.begin(); it != s->entries.end();) {
    Entry& e = *it;
    ++it;  // `e` may be dropped below
    if (e.state != Entry::State::kQueued) continue;
    if (s->issued_bytes > 0 && s->issued_bytes + e.key.length > quota) break;
    absl::Status why;
    if (!IssueLocked(s, &e, &why)) {
      VLOG(1) << "kv manager: dropping a hinted object: " << why;
      ++counters_.dropped_stale;
      DropLocked(s, &e);
    }
  }
}

void KvManager::PumpAllLocked() {
  for (auto& [id, s] : sessions_) PumpLocked(s.get());
}

void KvManager::DropLocked(Session* s, Entry* e) {
  if (e->state != Entry::State::kQueued) {
    options_.device->PrefetchRelease(e->handle);
    e->pin.Release();
    s->issued_bytes -= e->key.length;
    session_issued_bytes_ -= e->key.length;
  } else {
    --session_queued_;
  }
  auto it = s->by_key.find(e->key);
  if (it != s->by_key.end()) {
    std::list<Entry>::iterator pos = it->second;
    s->by_key.erase(it);
    s->entries.erase(pos);
  }
}

void KvManager::ReleaseAllLocked(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session* s = it->second.get();
  for (auto e = s->entries.begin(); e != s->entries.end();) {
    Entry& entry = *e;
    ++e;
    // An object being read is released when its read finishes.
    if (entry.state == Entry::State::kReading) continue;
    ++counters_.released_unread;
    DropLocked(s, &entry);
  }
  EraseIfEmptyLocked(id);
}

void KvManager::EraseIfEmptyLocked(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second->entries.empty()) return;
  sessions_.erase(it);
  // Fewer sessions share the staging window: the others may stage more.
  PumpAllLocked();
}

std::vector<absl::Status> KvManager::Prefetch(
    uint64_t session, absl::Span<const ExtentKey> objects) {
  std::vector<absl::Status> out(objects.size());
  MutexLock l(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      counters_.refused_hints += objects.size();
      for (auto& st : out) {
        st = absl::ResourceExhaustedError(absl::StrCat(
            "storage node: too many prefetch sessions (limit ",
            options_.max_sessions, ")"));
      }
      return out;
    }
    it = sessions_.emplace(session, std::make_unique<Session>()).first;
  }
  Session* s = it->second.get();
  s->last_active = clock_->Now();
  for (size_t i = 0; i < objects.size(); ++i) {
    const ExtentKey& k = objects[i];
    if (s->by_key.contains(k)) {
      ++counters_.duplicate_hints;
      continue;
    }
    if (static_cast<int>(s->entries.size()) >=
        options_.max_objects_per_session) {
      ++counters_.refused_hints;
      out[i] = absl::ResourceExhaustedError(
          absl::StrCat("storage node: more than ",
                       options_.max_objects_per_session,
                       " objects queued in one prefetch session"));
      continue;
    }
    s->entries.push_back(Entry{});
    auto pos = std::prev(s->entries.end());
    pos->key = k;
    s->by_key.emplace(k, pos);
    ++session_queued_;
    ++counters_.hints;
  }
  // The quota depends on the number of sessions: a new session shrinks the
  // others' share, which they honour as their staged objects are read.
  PumpLocked(s);
  // Objects issued now that turned out unreadable were dropped.
  for (size_t i = 0; i < objects.size(); ++i) {
    if (!out[i].ok()) continue;
    if (!s->by_key.contains(objects[i])) {
      out[i] = absl::NotFoundError(
          "storage node: object not readable here (gone or reused)");
    }
  }
  EraseIfEmptyLocked(session);
  PumpHintsLocked();
  return out;
}

absl::StatusOr<KvManager::StagedRead> KvManager::AcquireRead(
    uint64_t session, const ExtentKey& key, absl::Time deadline) {
  return Acquire(session, key, deadline, /*wait=*/true);
}

absl::StatusOr<KvManager::StagedRead> KvManager::AcquireReadIfStaged(
    uint64_t session, const ExtentKey& key) {
  return Acquire(session, key, absl::InfinitePast(), /*wait=*/false);
}

absl::StatusOr<KvManager::StagedRead> KvManager::Acquire(
    uint64_t session, const ExtentKey& key, absl::Time deadline, bool wait) {
  Entry* e = nullptr;
  PrefetchHandle handle;
  {
    MutexLock l(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      return absl::NotFoundError("kv manager: no such prefetch session");
    }
    Session* s = it->second.get();
    auto k = s->by_key.find(key);
    if (k == s->by_key.end() || k->second->state == Entry::State::kReading) {
      return absl::NotFoundError("kv manager: object not prefetched");
    }
    e = &*k->second;
    s->last_active = clock_->Now();
    if (e->state == Entry::State::kQueued) {
      // Read ahead of the quota (out of order, or the quota is full of
      // objects the client skipped): it is needed now.
      absl::Status why;
      if (!IssueLocked(s, e, &why)) {
        ++counters_.dropped_stale;
        DropLocked(s, e);
        EraseIfEmptyLocked(session);
        return absl::NotFoundError(
            absl::StrCat("kv manager: object not readable: ", why.message()));
      }
    }
    e->state = Entry::State::kReading;
    ++s->reading;
    handle = e->handle;
  }
  // The entry cannot go away while kReading: Release and the reaper leave it.
  // Probe first: staged already (a hit), or wait for it (timed).
  absl::StatusOr<const uint8_t*> data =
      options_.device->PrefetchWait(handle, absl::InfinitePast());
  bool waited = false;
  if (wait && !data.ok() &&
      data.status().code() == absl::StatusCode::kDeadlineExceeded) {
    waited = true;
    const absl::Time start = clock_->Now();
    data = options_.device->PrefetchWait(handle, deadline);
    wait_latency_.Observe(clock_->Now() - start);
  }
  if (!wait && !data.ok() &&
      data.status().code() == absl::StatusCode::kDeadlineExceeded) {
    // Still staging: leave it to a later read.
    MutexLock l(&mu_);
    auto it = sessions_.find(session);
    CHECK(it != sessions_.end()) << "kv manager: read of a vanished session";
    e->state = Entry::State::kStaging;
    --it->second->reading;
    return absl::UnavailableError("kv manager: object not staged yet");
  }
  StagedRead r;
  r.manager_ = this;
  r.session_ = session;
  r.entry_ = e;
  if (!data.ok()) {
    Finish(session, e);
    r.manager_ = nullptr;
    return data.status();
  }
  r.data_ = *data;
  r.length_ = key.length;
  {
    MutexLock l(&mu_);
    ++counters_.staged_reads;
    ++(waited ? counters_.waited_reads : counters_.ready_reads);
  }
  return r;
}

void KvManager::FinishRead(StagedRead read) {
  // `read` finishes when it goes out of scope.
}

void KvManager::Finish(uint64_t session, Entry* e) {
  MutexLock l(&mu_);
  auto it = sessions_.find(session);
  CHECK(it != sessions_.end()) << "kv manager: read of a vanished session";
  Session* s = it->second.get();
  --s->reading;
  s->last_active = clock_->Now();
  DropLocked(s, e);
  PumpLocked(s);
  EraseIfEmptyLocked(session);
  PumpHintsLocked();
}

std::vector<absl::Status> KvManager::Release(
    uint64_t session, absl::Span<const ExtentKey> objects) {
  std::vector<absl::Status> out(objects.size());
  MutexLock l(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    for (auto& st : out) {
      st = absl::NotFoundError("kv manager: no such prefetch session");
    }
    return out;
  }
  if (objects.empty()) {
    ReleaseAllLocked(session);
    PumpHintsLocked();
    return out;
  }
  Session* s = it->second.get();
  s->last_active = clock_->Now();
  for (size_t i = 0; i < objects.size(); ++i) {
    auto k = s->by_key.find(objects[i]);
    if (k == s->by_key.end()) {
      out[i] = absl::NotFoundError("kv manager: object not in the session");
      continue;
    }
    Entry* e = &*k->second;
    // An object being read is released when its read finishes.
    if (e->state == Entry::State::kReading) continue;
    ++counters_.released_unread;
    DropLocked(s, e);
  }
  PumpLocked(s);
  EraseIfEmptyLocked(session);
  PumpHintsLocked();
  return out;
}

KvManagerStats KvManager::Stats() const {
  MutexLock l(&mu_);
  KvManagerStats st = counters_;
  st.sessions = sessions_.size();
  for (const auto& [id, s] : sessions_) {
    for (const Entry& e : s->entries) {
      if (e.state == Entry::State::kQueued) {
        ++st.queued_objects;
      } else {
        ++st.staging_objects;
      }
    }
    st.staged_ahead_bytes += s->issued_bytes;
  }
  st.turn_hints_held = turn_hints_.size();
  st.turn_hint_bytes = hint_bytes_;
  st.turn_hint_refills = hints_loading_.size();
  return st;
}

void KvManager::VisitStats(StatsVisitor* v) const {
  Stats().Visit(v);
  v->Histogram("wait_seconds",
               "Time session reads waited for their object's staging",
               wait_latency_.Snapshot());
}

}  // namespace hymcache::storage
