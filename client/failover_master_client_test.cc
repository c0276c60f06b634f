// FailoverMasterClient over fakes: masters that refuse (standbys, dead
// masters) and a FakeMasterClient that leads.
#include "client/failover_master_client.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/testing/fake_master_client.h"
#include "common/fake_clock.h"
#include "common/mutex.h"
#include "common/status_reason.h"

namespace hymcache {
namespace {

// A master whose every call fails with `status()`; counts the calls.
class RefusingMaster final : public MasterClient {
 public:
  explicit RefusingMaster(absl::Status s) : status_(std::move(s)) {}
  void set_status(absl::Status s) {
    MutexLock l(&mu_);
    status_ = std::move(s);
  }
  int calls() const {
    MutexLock l(&mu_);
    return calls_;
  }

  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string>,
                                     LookupIntent, absl::Time) override {
    return Refuse();
  }
  std::unique_ptr<LookupStream> StartLookups(absl::Span<const std::string>,
                                             size_t, absl::Time) override {
    return std::make_unique<RefusedStream>(Refuse());
  }
  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs&,
                                         absl::Time) override {
    return Refuse();
  }
  absl::Status PutCommit(uint64_t, absl::Span<const uint32_t>,
                         absl::Span<const wire::Receipt>, absl::Time) override {
    return Refuse();
  }
  void PutAbortInBackground(uint64_t) override {}
  absl::Status ReportMissing(absl::Span<const std::string>,
                             absl::Span<const ObjectLocation>,
                             absl::Time) override {
    return Refuse();
  }
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string>,
                                           absl::Time) override {
    return Refuse();
  }
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string>,
                                           absl::Time) override {
    return Refuse();
  }
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport&, absl::Time) override {
    return Refuse();
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time) override {
    return Refuse();
  }

 private:
  class RefusedStream final : public LookupStream {
   public:
    explicit RefusedStream(absl::Status s) : s_(std::move(s)) {}
    bool has_next() const override { return true; }
    absl::StatusOr<const LookupBatch*> Next(bool) override { return s_; }
    void CancelRest() override {}

   private:
    absl::Status s_;
  };
  absl::Status Refuse() {
    MutexLock l(&mu_);
    ++calls_;
    return status_;
  }
  mutable Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// Forwards to a shared master (the fakes outlive the failover client's
// copies of them).
class Forward final : public MasterClient {
 public:
  explicit Forward(MasterClient* m) : m_(m) {}
  // Calls from now on go to `m`.
  void set(MasterClient* m) { m_ = m; }
  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> k,
                                     LookupIntent r, absl::Time d) override {
    return m_.load()->Lookup(k, r, d);
  }
  std::unique_ptr<LookupStream> StartLookups(absl::Span<const std::string> k,
                                             size_t c, absl::Time d) override {
    return m_.load()->StartLookups(k, c, d);
  }
  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs& a,
                                         absl::Time d) override {
    return m_.load()->PutStart(a, d);
  }
  absl::Status PutCommit(uint64_t p, absl::Span<const uint32_t> f,
                         absl::Span<const wire::Receipt> r,
                         absl::Time d) override {
    return m_.load()->PutCommit(p, f, r, d);
  }
  void PutAbortInBackground(uint64_t p) override {
    m_.load()->PutAbortInBackground(p);
  }
  absl::Status ReportMissing(absl::Span<const std::string> k,
                             absl::Span<const ObjectLocation> l,
                             absl::Time d) override {
    return m_.load()->ReportMissing(k, l, d);
  }
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> k,
                                           absl::Time d) override {
    return m_.load()->Remove(k, d);
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time d) override {
    return m_.load()->GetClusterStatus(d);
  }
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string> k,
                                           absl::Time d) override {
    return m_.load()->PrefixQuery(k, d);
  }
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& r, absl::Time d) override {
    return m_.load()->ReportEngineBlocks(r, d);
  }

 private:
  std::atomic<MasterClient*> m_;
};

struct Rig {
  Rig() {
    leader.AddNode({1, "node-1:1", {}});
    masters["a:1"] = &standby_a;
    masters["b:1"] = &dead_b;
    masters["c:1"] = &at_c;
  }
  // On `clock` (when given) with a 50 ms attempt timeout.
  std::unique_ptr<FailoverMasterClient> Make(
      std::vector<std::string> addresses,
      std::function<std::string()> leader_source = nullptr,
      FakeClock* clock = nullptr) {
    FailoverMasterClientOptions o;
    o.addresses = std::move(addresses);
    o.leader = std::move(leader_source);
    o.round_pause = absl::Milliseconds(1);
    if (clock != nullptr) {
      o.clock = clock;
      o.attempt_timeout = absl::Milliseconds(50);
    }
    o.connect = [this](const std::string& address)
        -> absl::StatusOr<std::unique_ptr<MasterClient>> {
      connected.push_back(address);
      auto it = masters.find(address);
      if (it == masters.end()) return absl::NotFoundError(address);
      return std::unique_ptr<MasterClient>(new Forward(it->second));
    };
    auto c = FailoverMasterClient::Create(std::move(o));
    REQUIRE(c.ok());
    return std::move(c).value();
  }

  // Commits `keys` (1 byte each) on the leader.
  void StoreOnLeader(const std::vector<std::string>& keys) {
    PutStartArgs args{keys, std::vector<uint64_t>(keys.size(), 1), 0, ""};
    auto put = leader.PutStart(args, absl::InfiniteFuture());
    REQUIRE(put.ok());
    REQUIRE(leader.PutCommit(put->put_id, {}, {}, absl::InfiniteFuture()).ok());
  }

  RefusingMaster standby_a{NotLeaderError("standing by", {"c:1", 7})};
  RefusingMaster dead_b{absl::UnavailableError("connection refused")};
  FakeMasterClient leader;
  Forward at_c{&leader};  // the master at c:1
  std::map<std::string, MasterClient*> masters;
  std::vector<std::string> connected;
};

const absl::Time kLater = absl::InfiniteFuture();

// What a lookup stream of `keys` (chunks of 2) through `c` found, every
// chunk required to arrive.
std::vector<bool> FoundByStream(FailoverMasterClient& c,
                                const std::vector<std::string>& keys,
                                absl::Time deadline) {
  auto stream = c.StartLookups(keys, 2, deadline);
  std::vector<bool> found;
  while (stream->has_next()) {
    auto b = stream->Next(true);
    REQUIRE(b.ok());
    REQUIRE(*b != nullptr);
    found.insert(found.end(), (*b)->found.begin(), (*b)->found.end());
  }
  return found;
}

TEST_CASE("A call refused by a standby goes to the leader it names") {
  Rig rig;
  // The leader is not even in the list: the hint brings it in.
  auto c = rig.Make({"a:1"});
  PutStartArgs args{{"k1"}, {100}, 0, ""};
  auto put = c->PutStart(args, kLater);
  REQUIRE(put.ok());
  REQUIRE(c->PutCommit(put->put_id, {}, {}, kLater).ok());
  CHECK(c->current_address() == "c:1");
  CHECK(c->highest_epoch() == 7);
  CHECK(rig.standby_a.calls() == 1);
  // Later calls go straight to the leader.
  auto found = c->Lookup({"k1"}, LookupIntent::kPeek, kLater);
  REQUIRE(found.ok());
  CHECK(found->found == std::vector<bool>{true});
  CHECK(rig.standby_a.calls() == 1);
}

// A leader source (an etcd LeaderObserver's stand-in) that gives its
// answers in turn, the last one from then on; counts the questions.
class Answers {
 public:
  explicit Answers(std::vector<std::string> answers)
      : answers_(std::move(answers)) {}
  std::function<std::string()> source() {
    return [this] {
      MutexLock l(&mu_);
      ++asked_;
      const std::string a = answers_.front();
      if (answers_.size() > 1) answers_.erase(answers_.begin());
      return a;
    };
  }
  int asked() const {
    MutexLock l(&mu_);
    return asked_;
  }

 private:
  mutable Mutex mu_;
  std::vector<std::string> answers_ ABSL_GUARDED_BY(mu_);
  int asked_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_CASE(
    "With only a leader source a call waits until it names a leader and "
    "follows it past a dead one") {
  Rig rig;
  // No leader yet (an election is on), then the dead master, then the
  // leader.
  Answers answers({"", "", "b:1", "c:1"});
  auto c = rig.Make({}, answers.source());
  CHECK(c->current_address() == "");
  auto status = c->GetClusterStatus(kLater);
  REQUIRE(status.ok());
  CHECK(c->current_address() == "c:1");
  CHECK(rig.connected == std::vector<std::string>{"b:1", "c:1"});
  CHECK(rig.dead_b.calls() == 1);
  CHECK(answers.asked() == 4);
  // Later calls go straight to the leader.
  REQUIRE(c->Lookup({"k"}, LookupIntent::kPeek, kLater).ok());
  CHECK(answers.asked() == 4);
}

TEST_CASE(
    "With only a leader source that names no leader a call fails UNAVAILABLE "
    "at its deadline") {
  Rig rig;
  Answers answers({""});
  auto c = rig.Make({}, answers.source());
  const absl::Time deadline = absl::Now() + absl::Milliseconds(30);
  auto r = c->Lookup({"k"}, LookupIntent::kPeek, deadline);
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() >= deadline);
  CHECK(answers.asked() >= 2);
  // A stream waits the same way (chunk by chunk through Lookup).
  const std::vector<std::string> keys = {"k"};
  auto stream = c->StartLookups(keys, 1, absl::Now() + absl::Milliseconds(5));
  CHECK(stream->Next(true).status().code() == absl::StatusCode::kUnavailable);
  // Nothing to abort with no master.
  c->PutAbortInBackground(1);
}

TEST_CASE("A master that does not answer is passed over for the next one") {
  Rig rig;
  auto c = rig.Make({"b:1", "c:1"});
  auto status = c->GetClusterStatus(kLater);
  REQUIRE(status.ok());
  CHECK(c->current_address() == "c:1");
  CHECK(rig.dead_b.calls() == 1);
  CHECK(c->failovers() == 1);
}

TEST_CASE(
    "A call a master's server cancelled (it closed with the call taken) goes "
    "to the next master") {
  Rig rig;
  rig.standby_a.set_status(absl::CancelledError("server shutting down"));
  auto c = rig.Make({"a:1", "c:1"});
  auto status = c->GetClusterStatus(kLater);
  REQUIRE(status.ok());
  CHECK(c->current_address() == "c:1");
  CHECK(rig.standby_a.calls() == 1);
  CHECK(c->failovers() == 1);
}

TEST_CASE("An error that is not UNAVAILABLE is the caller's, with no failover") {
  Rig rig;
  rig.standby_a.set_status(absl::PermissionDeniedError("no"));
  auto c = rig.Make({"a:1", "c:1"});
  auto r = c->Remove({"k"}, kLater);
  CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(c->current_address() == "a:1");
  CHECK(c->failovers() == 0);
}

TEST_CASE(
    "A leader whose nodes are rejoining it is asked again, not passed over") {
  Rig rig;
  rig.standby_a.set_status(WithReason(
      absl::UnavailableError("no storage node has rejoined this master yet"),
      StatusReason::kNodesRejoining));
  auto c = rig.Make({"a:1", "c:1"});
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  PutStartArgs args{{"k1"}, {100}, 0, ""};
  auto put = c->PutStart(args, deadline);
  CHECK(ReasonOf(put.status()) == StatusReason::kNodesRejoining);
  CHECK(rig.standby_a.calls() >= 2);  // asked again after each pause
  CHECK(c->current_address() == "a:1");
  CHECK(c->failovers() == 0);
}

TEST_CASE("With no leader anywhere the call fails at its deadline") {
  Rig rig;
  rig.standby_a.set_status(NotLeaderError("no leader", {}));
  auto c = rig.Make({"a:1", "b:1"});
  const absl::Time deadline = absl::Now() + absl::Milliseconds(100);
  auto r = c->Lookup({"k"}, LookupIntent::kPeek, deadline);
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() >= deadline);
  // Both were tried, round after round.
  CHECK(rig.standby_a.calls() >= 2);
  CHECK(rig.dead_b.calls() >= 2);
}

TEST_CASE("A refusal naming a leader of an older epoch is not followed") {
  Rig rig;
  auto c = rig.Make({"a:1", "c:1"});
  REQUIRE(c->Lookup({"k"}, LookupIntent::kPeek, kLater)
              .ok());  // epoch 7 learned via a:1
  CHECK(c->highest_epoch() == 7);
  // The master at c now refuses, naming a stale leader (b, epoch 3): the
  // client goes round the list instead, and never to b.
  RefusingMaster stale(NotLeaderError("deposed", {"b:1", 3}));
  rig.at_c.set(&stale);
  auto r = c->Lookup({"k"}, LookupIntent::kPeek,
                     absl::Now() + absl::Milliseconds(50));
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(stale.calls() >= 1);
  CHECK(std::count(rig.connected.begin(), rig.connected.end(), "b:1") == 0);
  CHECK(rig.dead_b.calls() == 0);
  CHECK(c->highest_epoch() == 7);
}

TEST_CASE("A lookup stream whose master refuses goes on chunk by chunk") {
  Rig rig;
  rig.StoreOnLeader({"k1", "k2", "k3"});
  auto c = rig.Make({"a:1"});
  CHECK(FoundByStream(*c, {"k1", "k2", "k3"}, kLater) ==
        std::vector<bool>{true, true, true});
  CHECK(c->current_address() == "c:1");
}

// A master that answers nothing: every call waits for its deadline, which
// on `clock` takes no real time (the call moves the clock to the deadline).
class SilentMaster final : public MasterClient {
 public:
  explicit SilentMaster(FakeClock* clock) : clock_(clock) {}
  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string>,
                                     LookupIntent, absl::Time d) override {
    return Wait(d);
  }
  std::unique_ptr<LookupStream> StartLookups(absl::Span<const std::string>,
                                             size_t, absl::Time d) override {
    return std::make_unique<SilentStream>(this, d);
  }
  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs&,
                                         absl::Time d) override {
    return Wait(d);
  }
  absl::Status PutCommit(uint64_t, absl::Span<const uint32_t>,
                         absl::Span<const wire::Receipt>,
                         absl::Time d) override {
    return Wait(d);
  }
  void PutAbortInBackground(uint64_t) override {}
  absl::Status ReportMissing(absl::Span<const std::string>,
                             absl::Span<const ObjectLocation>,
                             absl::Time d) override {
    return Wait(d);
  }
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string>,
                                           absl::Time d) override {
    return Wait(d);
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time d) override {
    return Wait(d);
  }
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string>,
                                           absl::Time d) override {
    return Wait(d);
  }
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport&, absl::Time d) override {
    return Wait(d);
  }

 private:
  // A stream whose answers never come: each Next waits for the deadline.
  class SilentStream final : public LookupStream {
   public:
    SilentStream(SilentMaster* m, absl::Time d) : m_(m), d_(d) {}
    bool has_next() const override { return true; }
    absl::StatusOr<const LookupBatch*> Next(bool) override {
      return m_->Wait(d_);
    }
    void CancelRest() override {}

   private:
    SilentMaster* const m_;
    const absl::Time d_;
  };
  // What a gRPC call to a frozen server does.
  absl::Status Wait(absl::Time deadline) {
    const absl::Time now = clock_->Now();
    if (deadline > now) clock_->Advance(deadline - now);
    return absl::DeadlineExceededError("Deadline Exceeded");
  }

  FakeClock* const clock_;
};

TEST_CASE("A master that answers nothing is passed over after the attempt timeout") {
  Rig rig;
  FakeClock clock;
  SilentMaster frozen(&clock);
  rig.masters["f:1"] = &frozen;
  auto c = rig.Make({"f:1", "c:1"}, nullptr, &clock);
  const absl::Time start = clock.Now();
  auto put = c->PutStart({{"k"}, {10}, 0, ""}, start + absl::Seconds(30));
  REQUIRE(put.ok());
  // The silent master had its attempt timeout, no more, before c:1 answered.
  CHECK(clock.Now() - start == absl::Milliseconds(50));
  CHECK(c->current_address() == "c:1");
  // A PutCommit is not moved on by silence: only its master can answer.
  rig.at_c.set(&frozen);
  const absl::Time commit_deadline = clock.Now() + absl::Milliseconds(200);
  CHECK(c->PutCommit(put->put_id, {}, {}, commit_deadline).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(clock.Now() == commit_deadline);
  CHECK(c->current_address() == "c:1");
}

TEST_CASE(
    "A lookup stream on a master that answers nothing is passed over after the "
    "attempt timeout, and the lookups after it go to the next master") {
  Rig rig;
  rig.StoreOnLeader({"k1", "k2", "k3"});
  FakeClock clock;
  SilentMaster frozen(&clock);  // a leader whose host was lost
  rig.masters["f:1"] = &frozen;
  auto c = rig.Make({"f:1", "c:1"}, nullptr, &clock);
  auto found_all = [&](absl::Time deadline) {
    return FoundByStream(*c, {"k1", "k2", "k3"}, deadline) ==
           std::vector<bool>{true, true, true};
  };
  const absl::Time start = clock.Now();
  CHECK(found_all(start + absl::Seconds(30)));
  // The silent master had its attempt timeout, not the load's deadline.
  CHECK(clock.Now() - start == absl::Milliseconds(50));
  CHECK(c->current_address() == "c:1");
  // The next load's stream goes to c:1 at once.
  CHECK(found_all(clock.Now() + absl::Seconds(30)));
  CHECK(clock.Now() - start == absl::Milliseconds(50));
}

TEST_CASE(
    "A standby's hint naming the master that just went silent is not followed "
    "back to it") {
  Rig rig;
  FakeClock clock;
  SilentMaster lost(&clock);  // the leader whose host was lost
  // Until the lost leader's lease runs out the standby still names it.
  RefusingMaster stale(NotLeaderError("standing by", {"f:1", 7}));
  rig.masters["f:1"] = &lost;
  rig.masters["s:1"] = &stale;
  auto c = rig.Make({"f:1", "s:1", "c:1"}, nullptr, &clock);
  const absl::Time start = clock.Now();
  auto put = c->PutStart({{"k"}, {10}, 0, ""}, start + absl::Seconds(30));
  REQUIRE(put.ok());
  // One attempt timeout on the lost master, none more.
  CHECK(clock.Now() - start == absl::Milliseconds(50));
  CHECK(c->current_address() == "c:1");
  CHECK(stale.calls() == 1);
}

// A master whose lookup stream answers its first chunk, then nothing (a
// long load on a busy leader); every other call goes to `m`.
class StallsAfterFirstChunk final : public MasterClient {
 public:
  StallsAfterFirstChunk(MasterClient* m, FakeClock* clock)
      : m_(m), clock_(clock) {}
  absl::StatusOr<LookupBatch> Lookup(absl::Span<const std::string> k,
                                     LookupIntent r, absl::Time d) override {
    return m_->Lookup(k, r, d);
  }
  std::unique_ptr<LookupStream> StartLookups(absl::Span<const std::string> k,
                                             size_t c, absl::Time d) override {
    return std::make_unique<Stream>(this, k, c, d);
  }
  absl::StatusOr<PutStartReply> PutStart(const PutStartArgs& a,
                                         absl::Time d) override {
    return m_->PutStart(a, d);
  }
  absl::Status PutCommit(uint64_t p, absl::Span<const uint32_t> f,
                         absl::Span<const wire::Receipt> r,
                         absl::Time d) override {
    return m_->PutCommit(p, f, r, d);
  }
  void PutAbortInBackground(uint64_t p) override {
    m_->PutAbortInBackground(p);
  }
  absl::Status ReportMissing(absl::Span<const std::string> k,
                             absl::Span<const ObjectLocation> l,
                             absl::Time d) override {
    return m_->ReportMissing(k, l, d);
  }
  absl::StatusOr<std::vector<bool>> Remove(absl::Span<const std::string> k,
                                           absl::Time d) override {
    return m_->Remove(k, d);
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus(absl::Time d) override {
    return m_->GetClusterStatus(d);
  }
  absl::StatusOr<PrefixAnswer> PrefixQuery(absl::Span<const std::string> k,
                                           absl::Time d) override {
    return m_->PrefixQuery(k, d);
  }
  absl::StatusOr<EngineBlocksReply> ReportEngineBlocks(
      const EngineBlocksReport& r, absl::Time d) override {
    return m_->ReportEngineBlocks(r, d);
  }

 private:
  class Stream final : public LookupStream {
   public:
    Stream(StallsAfterFirstChunk* m, absl::Span<const std::string> k, size_t c,
           absl::Time d)
        : m_(m), keys_(k), chunk_(c), deadline_(d) {}
    bool has_next() const override { return true; }
    absl::StatusOr<const LookupBatch*> Next(bool) override {
      if (answered_) {
        const absl::Time now = m_->clock_->Now();
        if (deadline_ > now) m_->clock_->Advance(deadline_ - now);
        return absl::DeadlineExceededError("Deadline Exceeded");
      }
      answered_ = true;
      auto b = m_->m_->Lookup(keys_.subspan(0, chunk_), LookupIntent::kRead,
                              deadline_);
      if (!b.ok()) return b.status();
      batch_ = std::move(b).value();
      return &batch_;
    }
    void CancelRest() override {}

   private:
    StallsAfterFirstChunk* const m_;
    const absl::Span<const std::string> keys_;
    const size_t chunk_;
    const absl::Time deadline_;
    bool answered_ = false;
    LookupBatch batch_;
  };
  MasterClient* const m_;
  FakeClock* const clock_;
};

TEST_CASE(
    "A lookup stream that answered a chunk before its attempt timeout goes on "
    "chunk by chunk on the same master; a long load is not silence") {
  Rig rig;
  rig.StoreOnLeader({"k1", "k2", "k3"});
  FakeClock clock;
  StallsAfterFirstChunk busy(&rig.leader, &clock);
  rig.masters["x:1"] = &busy;
  auto c = rig.Make({"x:1", "c:1"}, nullptr, &clock);
  CHECK(
      FoundByStream(*c, {"k1", "k2", "k3"}, clock.Now() + absl::Seconds(30)) ==
      std::vector<bool>{true, true, true});
  CHECK(c->current_address() == "x:1");
  CHECK(c->failovers() == 0);
}

TEST_CASE("With one master a silent lookup stream has the whole deadline") {
  Rig rig;
  FakeClock clock;
  SilentMaster frozen(&clock);
  rig.masters["f:1"] = &frozen;
  auto c = rig.Make({"f:1"}, nullptr, &clock);
  const std::vector<std::string> keys = {"k1"};
  const absl::Time deadline = clock.Now() + absl::Seconds(2);
  auto stream = c->StartLookups(keys, 2, deadline);
  CHECK(stream->Next(true).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(clock.Now() == deadline);
}

TEST_CASE("Options without an address or a connect function are refused") {
  CHECK(FailoverMasterClient::Create({}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  FailoverMasterClientOptions o;
  o.addresses = {"a:1"};
  CHECK(FailoverMasterClient::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hymcache
