#include "master/standby_confirm_waits.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/awaited.h"
#include "common/mutex.h"
#include "common/status_reason.h"

namespace hymcache {
namespace master {
namespace {

// A follower's state the test moves by hand; wait_applied blocks on it as
// the real follower's WaitApplied does.
class FakeStore {
 public:
  StandbyConfirmWaitsOptions Options() {
    StandbyConfirmWaitsOptions o;
    o.applied = [this] {
      MutexLock l(&mu_);
      return state_;
    };
    o.wait_applied = [this](uint64_t seen, absl::Time deadline) {
      MutexLock l(&mu_);
      while (state_.sequence <= seen && absl::Now() < deadline) {
        changed_.WaitWithDeadline(&mu_, deadline);
      }
    };
    return o;
  }
  void Set(bool following, const std::string& db, uint64_t seq,
           bool final = false) {
    MutexLock l(&mu_);
    state_ = {following, final, db, seq};
    changed_.SignalAll();
  }

 private:
  Mutex mu_;
  CondVar changed_;
  StandbyApplied state_ ABSL_GUARDED_BY(mu_);
};

// One question's answer: its status and the sequence the standby held.
class Answer {
 public:
  StandbyConfirmWaits::Done Callback() {
    return [this](absl::Status s, uint64_t applied) {
      answer_.Set({std::move(s), applied});
    };
  }
  bool HasBeenNotified() const { return answer_.Done(); }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    return answer_.WaitFor(timeout);
  }
  absl::Status status() const { return answer_.Get().first; }
  uint64_t applied() const { return answer_.Get().second; }

 private:
  testing::Awaited<std::pair<absl::Status, uint64_t>> answer_;
};

// A StandbyConfirmWaits over `o` (which must be valid).
std::unique_ptr<StandbyConfirmWaits> NewWaits(
    const StandbyConfirmWaitsOptions& o) {
  auto waits = StandbyConfirmWaits::Create(o);
  REQUIRE(waits.ok());
  return std::move(waits).value();
}

// Asks `waits` for `sequence` of `db` with a deadline far beyond the test.
void Ask(StandbyConfirmWaits* waits, const std::string& db, uint64_t sequence,
         Answer* answer) {
  waits->Wait(db, sequence, absl::Now() + absl::Seconds(30),
              answer->Callback());
}

TEST_CASE("a confirmation is answered once the standby applies its sequence") {
  FakeStore store;
  store.Set(true, "db1", 10);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  Answer held, later;
  Ask(waits.get(), "db1", 10, &held);
  REQUIRE(held.HasBeenNotified());  // at once, on this thread
  CHECK(held.status().ok());
  Ask(waits.get(), "db1", 15, &later);
  CHECK_FALSE(later.HasBeenNotified());
  store.Set(true, "db1", 14);
  CHECK_FALSE(later.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  store.Set(true, "db1", 16);
  REQUIRE(later.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(later.status().ok());
  CHECK(later.applied() >= 15);
}

TEST_CASE("a confirmation of another leader database is refused at once") {
  FakeStore store;
  store.Set(true, "db2", 100);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  Answer other, copying;
  Ask(waits.get(), "db1", 5, &other);
  REQUIRE(other.HasBeenNotified());
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(other.status()) == StatusReason::kCommitNotConfirmed);
  store.Set(false, "", 0);
  Ask(waits.get(), "db2", 5, &copying);
  REQUIRE(copying.HasBeenNotified());
  CHECK(ReasonOf(copying.status()) == StatusReason::kCommitNotConfirmed);
}

TEST_CASE(
    "a waiting confirmation is refused when the follower moves to another "
    "database") {
  FakeStore store;
  store.Set(true, "db1", 1);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  Answer a;
  Ask(waits.get(), "db1", 50, &a);
  store.Set(true, "db9", 60);
  REQUIRE(a.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(ReasonOf(a.status()) == StatusReason::kCommitNotConfirmed);
}

TEST_CASE(
    "an elected standby confirms what its store holds and refuses the rest at "
    "once") {
  FakeStore store;
  store.Set(true, "db1", 1);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  Answer waiting, held, beyond;
  Ask(waits.get(), "db1", 50, &waiting);
  store.Set(true, "db1", 40, /*final=*/true);  // stopped following to lead
  REQUIRE(waiting.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(ReasonOf(waiting.status()) == StatusReason::kCommitNotConfirmed);
  Ask(waits.get(), "db1", 40, &held);
  REQUIRE(held.HasBeenNotified());
  CHECK(held.status().ok());
  Ask(waits.get(), "db1", 41, &beyond);
  REQUIRE(beyond.HasBeenNotified());
  CHECK(ReasonOf(beyond.status()) == StatusReason::kCommitNotConfirmed);
}

TEST_CASE(
    "a confirmation not applied by its deadline answers DeadlineExceeded") {
  FakeStore store;
  store.Set(true, "db1", 1);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  Answer a;
  waits->Wait("db1", 50, absl::Now() + absl::Milliseconds(20), a.Callback());
  REQUIRE(a.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(a.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(waits->waiting() == 0);
}

TEST_CASE("shutdown answers the open confirmations and refuses later ones") {
  FakeStore store;
  store.Set(true, "db1", 1);
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(store.Options());
  std::vector<std::unique_ptr<Answer>> open;
  for (int i = 0; i < 8; ++i) {
    open.push_back(std::make_unique<Answer>());
    Ask(waits.get(), "db1", 100 + i, open.back().get());
  }
  waits->Shutdown();
  for (const auto& a : open) {
    REQUIRE(a->HasBeenNotified());
    CHECK(a->status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(ReasonOf(a->status()) == StatusReason::kCommitNotConfirmed);
  }
  Answer after;
  Ask(waits.get(), "db1", 100, &after);
  REQUIRE(after.HasBeenNotified());
  CHECK(after.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "confirmations beyond max_waiting are refused with ResourceExhausted") {
  FakeStore store;
  store.Set(true, "db1", 1);
  StandbyConfirmWaitsOptions o = store.Options();
  o.max_waiting = 2;
  std::unique_ptr<StandbyConfirmWaits> waits = NewWaits(o);
  Answer a, b, c;
  Ask(waits.get(), "db1", 10, &a);
  Ask(waits.get(), "db1", 10, &b);
  Ask(waits.get(), "db1", 10, &c);
  REQUIRE(c.HasBeenNotified());
  CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
  store.Set(true, "db1", 10);
  REQUIRE(a.WaitForNotificationWithTimeout(absl::Seconds(30)));
  REQUIRE(b.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(a.status().ok());
  CHECK(b.status().ok());
}

}  // namespace
}  // namespace master
}  // namespace hymcache
