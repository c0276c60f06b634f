// StandbyConfirmer against standbys served by gRPC on loopback: a fake
// StandbyConfirm service whose applied sequence the test moves (the real
// one, a standing-by master, is exercised by tests/master_ha_test's
// confirmed takeover).
#include "client/standby_confirmer.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/awaited.h"
#include "common/mutex.h"
#include "common/status_reason.h"
#include "proto/master.pb.h"
#include "proto/replication.grpc.pb.h"

namespace hymcache {
namespace {

namespace pb = ::hymcache::v1;

// Answers WaitApplied once `applied` reaches the sequence (of database
// "db1"); FailedPrecondition for another database, as a standby does.
class FakeStandby final : public pb::StandbyConfirm::Service {
 public:
  FakeStandby() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeStandby() override {
    Set(~uint64_t{0});
    server_->Shutdown();
  }

  grpc::Status WaitApplied(grpc::ServerContext* ctx,
                           const pb::WaitAppliedRequest* req,
                           pb::WaitAppliedResponse* resp) override {
    MutexLock l(&mu_);
    ++calls_;
    if (req->db_id() != "db1") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "another database");
    }
    while (applied_ < req->sequence()) {
      if (ctx->IsCancelled() ||
          changed_.WaitWithDeadline(&mu_, absl::FromChrono(ctx->deadline()))) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "not yet");
      }
    }
    resp->set_applied_sequence(applied_);
    return grpc::Status::OK;
  }

  void Set(uint64_t applied) {
    MutexLock l(&mu_);
    applied_ = applied;
    changed_.SignalAll();
  }
  int calls() {
    MutexLock l(&mu_);
    return calls_;
  }

  std::string address;

 private:
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  CondVar changed_;
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<StandbyConfirmer> NewConfirmer() {
  auto c = StandbyConfirmer::Create(
      {.dial = [](const std::string& address)
           -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
        return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      }});
  REQUIRE(c.ok());
  return *c;
}

pb::PutCommitResponse Commit(uint64_t seq, std::vector<std::string> standbys,
                             const std::string& db = "db1") {
  pb::PutCommitResponse r;
  r.set_replication_sequence(seq);
  r.set_replication_db_id(db);
  for (std::string& s : standbys) r.add_confirm_with(std::move(s));
  return r;
}

// One commit's outcome.
class Outcome {
 public:
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status s) { status_.Set(std::move(s)); };
  }
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    return status_.WaitFor(timeout);
  }
  absl::Status status() const { return status_.Get(); }

 private:
  testing::Awaited<absl::Status> status_;
};

TEST_CASE("A commit naming no standby is confirmed at once") {
  auto confirmer = NewConfirmer();
  CHECK_FALSE(StandbyConfirmer::NeedsConfirm(pb::PutCommitResponse()));
  CHECK(
      confirmer->Confirm(pb::PutCommitResponse(), absl::InfiniteFuture()).ok());
  CHECK(confirmer->GetStats().waits_sent == 0);
}

TEST_CASE(
    "Commits are confirmed once every standby named holds them, one wait in "
    "flight per standby") {
  FakeStandby a, b;
  auto confirmer = NewConfirmer();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<std::unique_ptr<Outcome>> outcomes;
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    outcomes.push_back(std::make_unique<Outcome>());
    confirmer->ConfirmAsync(Commit(seq, {a.address, b.address}), deadline,
                            outcomes.back()->Callback());
  }
  a.Set(50);
  // b still holds nothing: no commit is confirmed.
  CHECK_FALSE(
      outcomes[0]->WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  b.Set(50);
  for (auto& o : outcomes) {
    REQUIRE(o->WaitForNotificationWithTimeout(absl::Seconds(60)));
    CHECK(o->status().ok());
  }
  // The first wait asked for 1; the rest were gathered behind it.
  CHECK(a.calls() <= 3);
  CHECK(b.calls() <= 3);
  const StandbyConfirmer::Stats st = confirmer->GetStats();
  CHECK(st.commits_confirmed == 50);
  CHECK(st.timeouts == 0);
  CHECK(st.unreachable == 0);
  // A sequence a standby already confirmed needs no call.
  const int calls = a.calls();
  CHECK(confirmer->Confirm(Commit(40, {a.address}), deadline).ok());
  CHECK(a.calls() == calls);
}

TEST_CASE(
    "A standby following another database fails the put with "
    "commit_not_confirmed") {
  FakeStandby a;
  a.Set(100);
  auto confirmer = NewConfirmer();
  const absl::Status s =
      confirmer->Confirm(Commit(5, {a.address}, "db-of-an-old-leader"),
                         absl::Now() + absl::Seconds(60));
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(ReasonOf(s) == StatusReason::kCommitNotConfirmed);
  CHECK(confirmer->GetStats().commits_not_confirmed == 1);
}

TEST_CASE(
    "A standby silent past the deadline or unreachable counts, as a sync "
    "leader counts its timeouts") {
  FakeStandby a;
  auto confirmer = NewConfirmer();
  // a never applies 7: the put is acknowledged at the deadline, counted.
  CHECK(confirmer
            ->Confirm(Commit(7, {a.address}),
                      absl::Now() + absl::Milliseconds(100))
            .ok());
  CHECK(confirmer->GetStats().timeouts == 1);
  // Nothing listens there.
  std::string gone;
  {
    FakeStandby b;
    gone = b.address;
  }
  CHECK(confirmer->Confirm(Commit(7, {gone}), absl::Now() + absl::Seconds(10))
            .ok());
  CHECK(confirmer->GetStats().unreachable == 1);
  CHECK(confirmer->GetStats().commits_confirmed == 2);
}

}  // namespace
}  // namespace hymcache
