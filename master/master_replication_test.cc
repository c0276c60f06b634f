// Standby replication as the master daemon runs it: a MasterServer with
// MasterOptions::replication serving a ReplicaFollower on its own port, a
// synchronous commit held until the standby holds it (or the sync timeout),
// the replication stats, and the standby's directory opened by a master.
#include "master/master_replication.h"
#include "master/proving_heartbeat.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "absl/time/clock.h"
#include "common/eventually.h"
#include "master/master_server.h"
#include "master/master_test_util.h"
#include "master/replica_follower.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;
using master::OneRegionNodeReq;
using master::ReplicationMode;
using master::TestDir;

struct Master {
  std::unique_ptr<MasterServer> server;
  std::unique_ptr<v1::MasterService::Stub> stub;

  explicit Master(const MasterOptions& o) {
    auto s = MasterServer::Create(o);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    server = std::move(s).value();
    stub = v1::MasterService::NewStub(grpc::CreateChannel(
        server->address(), grpc::InsecureChannelCredentials()));
  }

  v1::GetStatsResponse Stats() {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    REQUIRE(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
    return resp;
  }
  double Stat(const std::string& name) {
    v1::GetStatsResponse st = Stats();
    auto it = st.stats().find(name);
    return it == st.stats().end() ? -1 : it->second;
  }
  // The registered node's key: it signs the write receipts of Put.
  std::string node_key;

  // A follower on `dir` named `name`, once this leader counts it past its
  // copy.
  std::unique_ptr<master::ReplicaFollower> FollowedBy(const std::string& dir,
                                                      const std::string& name) {
    master::ReplicaFollowerOptions fo;
    fo.leader = server->address();
    fo.store.path = dir;
    fo.name = name;
    auto follower = master::ReplicaFollower::Create(fo);
    REQUIRE(follower.ok());
    REQUIRE(testing::Eventually(
        [&] { return Stat("replication_followers") == 1; }));
    return std::move(follower).value();
  }

  // Registers node "n" and proves its key with a heartbeat: it is
  // placeable, and node_key signs Put's receipts.
  void RegisterPlaceableNode() {
    v1::RegisterNodeResponse reg;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->RegisterNode(&ctx, OneRegionNodeReq("n"), &reg).ok());
      node_key = reg.node_key();
    }
    grpc::ClientContext ctx;
    v1::HeartbeatResponse hb;
    REQUIRE(
        stub->Heartbeat(
                &ctx, master::ProvingHeartbeat(OneRegionNodeReq("n"), reg), &hb)
            .ok());
  }

  // PutStart + PutCommit of one key; how long the commit took, and the
  // commit's answer in *answer (if given).
  absl::Duration Put(const std::string& key,
                     v1::PutCommitResponse* answer = nullptr) {
    v1::PutStartRequest put;
    put.add_keys(key);
    put.add_lengths(4096);
    v1::PutStartResponse started;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->PutStart(&ctx, put, &started).ok());
    }
    grpc::ClientContext ctx;
    v1::PutCommitRequest c;
    c.set_put_id(started.put_id());
    master::AddWriteReceipts(started, HmacSha256(node_key), &c);
    v1::PutCommitResponse resp;
    const absl::Time start = absl::Now();
    grpc::Status s = stub->PutCommit(&ctx, c, &resp);
    const absl::Duration took = absl::Now() - start;
    INFO(s.error_message());
    REQUIRE(s.ok());
    CHECK(resp.committed() == 1);
    if (answer != nullptr) *answer = resp;
    return took;
  }
};

// Stops `follower` and `leader`, then opens the follower's directory `dir`
// as a master does (its ordinary restart path): the objects it serves.
uint64_t StopAndOpen(Master* leader, master::ReplicaFollower* follower,
                     const std::string& dir) {
  REQUIRE(follower->Stop().ok());
  leader->server->Shutdown();
  MasterOptions so;
  so.db_path = dir;
  Master standby(so);
  return standby.Stats().object_count();
}

TEST_CASE("Replication modes parse and print") {
  CHECK(*master::ParseReplicationMode("off") == ReplicationMode::kOff);
  CHECK(*master::ParseReplicationMode("async") == ReplicationMode::kAsync);
  CHECK(*master::ParseReplicationMode("sync") == ReplicationMode::kSync);
  CHECK(*master::ParseReplicationMode("confirm") == ReplicationMode::kConfirm);
  CHECK(std::string(master::ReplicationModeName(ReplicationMode::kConfirm)) ==
        "confirm");
  CHECK(master::ParseReplicationMode("yes").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(std::string(master::ReplicationModeName(ReplicationMode::kSync)) ==
        "sync");
  MasterOptions o;
  o.db_path = TestDir("validate");
  o.replication = ReplicationMode::kSync;
  o.replication_sync_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.replication_sync_timeout = absl::Milliseconds(500);
  CHECK(o.Validate().ok());
  o.replication = ReplicationMode::kAsync;
  for (absl::Duration bad :
       {absl::Milliseconds(-1), absl::Milliseconds(1001)}) {
    o.replication_async_batch_delay = bad;
    CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  }
  o.replication_async_batch_delay = absl::ZeroDuration();
  CHECK(o.Validate().ok());
  o.replication = ReplicationMode::kConfirm;
  o.replication_confirm_batch_delay = absl::Milliseconds(1001);
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.replication_confirm_batch_delay = absl::ZeroDuration();
  CHECK(o.Validate().ok());
  // The library's defaults, declared once.
  CHECK(MasterOptions().replication_async_batch_delay ==
        master::MasterReplicationOptions().async_batch_delay);
  CHECK(MasterOptions().replication_confirm_batch_delay ==
        master::MasterReplicationOptions().confirm_batch_delay);
}

TEST_CASE(
    "A confirmed commit is answered at once with its sequence, database and "
    "standbys, and names none while no standby follows") {
  MasterOptions o;
  o.db_path = TestDir("confirm-leader");
  o.replication = ReplicationMode::kConfirm;
  // Longer than the test: the answers below did not wait for the stream.
  o.replication_confirm_batch_delay = absl::Seconds(1);
  Master leader(o);
  leader.RegisterPlaceableNode();
  v1::PutCommitResponse alone;
  leader.Put("alone", &alone);
  CHECK(alone.confirm_with_size() == 0);
  CHECK(alone.replication_sequence() == 0);
  CHECK(leader.Stat("replication_sync_no_standby") == 1);
  CHECK(leader.Stat("replication_confirm_commits") == 0);

  const std::string standby_dir = TestDir("confirm-standby");
  std::unique_ptr<master::ReplicaFollower> follower =
      leader.FollowedBy(standby_dir, "standby-1:7000");
  v1::PutCommitResponse named;
  leader.Put("named", &named);
  REQUIRE(named.confirm_with_size() == 1);
  CHECK(named.confirm_with(0) == "standby-1:7000");
  CHECK(named.replication_sequence() > 0);
  CHECK(named.replication_sequence() <=
        leader.Stat("replication_latest_sequence"));
  CHECK(leader.Stat("replication_confirm_commits") == 1);
  // The sequence and database named are the ones the standby applies.
  REQUIRE(follower
              ->WaitApplied(named.replication_sequence(),
                            absl::Now() + absl::Seconds(30))
              .ok());
  CHECK(follower->GetStats().leader_db_id == named.replication_db_id());
  CHECK(StopAndOpen(&leader, follower.get(), standby_dir) == 2);
}

TEST_CASE(
    "A synchronous commit is answered once a standby holds it, and at once "
    "while no standby follows") {
  MasterOptions o;
  o.db_path = TestDir("leader");
  o.replication = ReplicationMode::kSync;
  // Longer than any commit here takes: a commit answered before it did not
  // wait for it.
  o.replication_sync_timeout = absl::Seconds(60);
  Master leader(o);
  v1::RegisterNodeResponse reg;
  {
    grpc::ClientContext ctx;
    REQUIRE(leader.stub->RegisterNode(&ctx, OneRegionNodeReq("n"), &reg).ok());
    leader.node_key = reg.node_key();
  }
  {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse hb;  // proves the key: the node is placeable
    REQUIRE(
        leader.stub
            ->Heartbeat(
                &ctx, master::ProvingHeartbeat(OneRegionNodeReq("n"), reg), &hb)
            .ok());
  }
  // No standby: nothing replicated; the commit is answered without waiting
  // for the timeout, and counted.
  CHECK(leader.Stat("replication_followers") == 0);
  CHECK(leader.Stat("replication_lag_sequences") ==
        leader.Stat("replication_latest_sequence"));
  CHECK(leader.Put("alone") < absl::Seconds(60));
  CHECK(leader.Stat("replication_sync_no_standby") == 1);
  CHECK(leader.Stat("replication_sync_timeouts") == 0);
  CHECK(leader.Stat("replication_sync_commits") == 0);

  // A standby on its own directory follows the leader's port.
  const std::string standby_dir = TestDir("standby");
  std::unique_ptr<master::ReplicaFollower> follower =
      leader.FollowedBy(standby_dir, "standby-1");
  // The per-standby series is there (its value moves with the writes).
  CHECK(leader.Stat("replication_lag_sequences{follower=\"standby-1\"}") >=
        0);
  const double messages = leader.Stat("replication_messages_sent");
  const double batches = leader.Stat("replication_batches_sent");
  leader.Put("held");
  CHECK(leader.Stat("replication_sync_commits") == 1);
  // The held commit went out in a log message (its batches counted).
  CHECK(leader.Stat("replication_messages_sent") > messages);
  CHECK(leader.Stat("replication_batches_sent") > batches);
  CHECK(leader.Stat("replication_sync_no_standby") == 1);
  CHECK(leader.Stat("replication_sync_timeouts") == 0);

  // The acknowledged commits are in the standby's directory, which a master
  // opens with its ordinary restart path.
  CHECK(StopAndOpen(&leader, follower.get(), standby_dir) == 2);
}

}  // namespace
}  // namespace hymcache
