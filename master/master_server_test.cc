#include "master/master_server.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/capability.h"
#include "common/eventually.h"
#include "common/fake_clock.h"
#include "common/grpc_status.h"
#include "common/status_reason.h"
#include "common/thread.h"
#include "master/master_service.h"
#include "master/master_test_util.h"
#include "master/proving_heartbeat.h"
#include "proto/grpc_health_v1.grpc.pb.h"
#include "proto/master.grpc.pb.h"

namespace hymcache {
namespace {

namespace v1 = ::hymcache::v1;
using master::OneRegionNodeReq;
using master::TestDir;
using testing::Eventually;

std::unique_ptr<v1::MasterService::Stub> Dial(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  return v1::MasterService::NewStub(channel);
}

TEST_CASE("MasterOptions validation") {
  MasterOptions o;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);  // db_path
  o.db_path = "/tmp/x";
  CHECK(o.Validate().ok());
  o.listen_address = "nonsense";
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.listen_address = "127.0.0.1:0";
  o.service.put_timeout = absl::ZeroDuration();
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  CHECK(MasterServer::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.service.put_timeout = absl::Seconds(30);
  CHECK(o.Validate().ok());
  o.service.read_lease = -absl::Seconds(1);  // the service's Validate()
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.service.read_lease = absl::Seconds(5);
  // The metrics endpoint follows protected mode.
  o.metrics_listen = "0.0.0.0:9451";
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.insecure = true;
  CHECK(o.Validate().ok());
  o.insecure = false;
  o.metrics_listen = "127.0.0.1";
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.metrics_listen = "127.0.0.1:0";
  CHECK(o.Validate().ok());
  o.rpc_threads = 0;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.rpc_threads = 65;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.rpc_threads = 64;
  CHECK(o.Validate().ok());
  o.max_lookup_streams = 0;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  o.max_lookup_streams = 1;
  CHECK(o.Validate().ok());
}

// Shutdown while lookups run from several threads, a health Watch is open
// and a ReconcileNode stream is half-sent: it returns (the Watch ends by
// itself, the stream is cancelled after the grace second), every lookup
// is answered or refused with a shutdown code, and nothing leaks (asan) or
// races (tsan). With two pollers, so calls live on both.
TEST_CASE("MasterServer shuts down with calls in flight") {
  MasterOptions o;
  o.db_path = TestDir("inflight");
  o.rpc_threads = 2;
  auto server = MasterServer::Create(o);
  REQUIRE(server.ok());
  const std::string address = (*server)->address();
  auto stub = Dial(address);
  v1::RegisterNodeResponse reg;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->RegisterNode(&ctx, OneRegionNodeReq("n"), &reg).ok());
  }

  // A reconcile stream that never sends its last message.
  grpc::ClientContext rctx;
  v1::ReconcileNodeResponse rresp;
  auto writer = stub->ReconcileNode(&rctx, &rresp);
  {
    v1::ReconcileNodeRequest first;
    first.set_node_id(reg.node_id());
    first.set_incarnation(1);
    REQUIRE(writer->Write(first));
  }
  // A health Watch.
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext wctx;
  grpc::health::v1::HealthCheckRequest wreq;
  auto watch = health->Watch(&wctx, wreq);
  grpc::health::v1::HealthCheckResponse w;
  REQUIRE(watch->Read(&w));
  CHECK(w.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  REQUIRE((*server)->HealthWatchersForTest() == 1);

  std::atomic<int> answered{0}, refused{0}, other{0};
  std::atomic<bool> stop{false};
  std::vector<Thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back("lookups", [&] {
      auto s = Dial(address);
      while (!stop.load()) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
        v1::BatchLookupRequest req;
        req.add_keys("k");
        v1::BatchLookupResponse resp;
        grpc::Status st = s->BatchLookup(&ctx, req, &resp);
        if (st.ok()) {
          ++answered;
        } else if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                   st.error_code() == grpc::StatusCode::CANCELLED) {
          ++refused;
          break;  // the server is going away
        } else {
          ++other;
        }
      }
    });
  }
  while (answered.load() < 20) std::this_thread::yield();
  const absl::Time start = absl::Now();
  (*server)->Shutdown();
  CHECK(absl::Now() - start < absl::Seconds(5));
  stop = true;
  for (Thread& t : clients) t.Join();
  CHECK(other.load() == 0);
  // The Watch heard NOT_SERVING, then its stream ended.
  REQUIRE(watch->Read(&w));
  CHECK(w.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  CHECK_FALSE(watch->Read(&w));
  watch->Finish().IgnoreError();
  // The reconcile stream was cut: nothing was judged.
  writer->WritesDone();
  CHECK_FALSE(writer->Finish().ok());
}

TEST_CASE(
    "MasterServer serves metrics when asked; a taken metrics port "
    "fails Create") {
  MasterOptions o;
  o.db_path = TestDir("metrics");
  CHECK((*MasterServer::Create(o))->metrics_address().empty());
  o.metrics_listen = "127.0.0.1:0";
  auto server = MasterServer::Create(o);
  REQUIRE(server.ok());
  CHECK(absl::StartsWith((*server)->metrics_address(), "127.0.0.1:"));
  MasterOptions o2;
  o2.db_path = TestDir("metrics2");
  o2.metrics_listen = (*server)->metrics_address();
  CHECK(MasterServer::Create(o2).status().code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE(
    "A gate that refuses writes lets lookups, heartbeats, listings and stats "
    "through and refuses every write with its status") {
  // What an HA master does read-only (master/master_ha.h): the gate is told
  // whether each call reads or writes.
  std::atomic<bool> read_only{false};
  std::atomic<int> reads{0}, writes{0}, probes{0};
  MasterOptions o;
  o.db_path = TestDir("gate");
  o.gate = [&](CallAccess access) {
    (access == CallAccess::kRead    ? reads
     : access == CallAccess::kWrite ? writes
                                    : probes)
        .fetch_add(1);
    if (read_only.load() && access != CallAccess::kRead) {
      return WithReason(absl::UnavailableError("read-only"),
                        StatusReason::kReadOnly);
    }
    return absl::OkStatus();
  };
  auto created = MasterServer::Create(o);
  REQUIRE(created.ok());
  std::unique_ptr<MasterServer> server = std::move(created).value();
  auto stub = Dial(server->address());
  v1::RegisterNodeResponse reg;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->RegisterNode(&ctx, OneRegionNodeReq("n1"), &reg).ok());
  }
  CHECK(writes.load() == 1);
  read_only = true;

  auto refused = [](const grpc::Status& g) {
    absl::Status s = FromGrpcStatus(g);
    INFO(s.ToString());
    return s.code() == absl::StatusCode::kUnavailable &&
           ReasonOf(s) == StatusReason::kReadOnly;
  };
  // Reads pass.
  {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse hb;
    CHECK(stub->Heartbeat(&ctx,
                          master::ProvingHeartbeat(OneRegionNodeReq("n1"), reg),
                          &hb)
              .ok());
    // It tells the node, which then looks for a leader elsewhere.
    CHECK(hb.read_only());
    CHECK(probes.load() >= 1);
  }
  {
    grpc::ClientContext ctx;
    v1::BatchLookupRequest req;
    req.add_keys("k");
    v1::BatchLookupResponse resp;
    CHECK(stub->BatchLookup(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    CHECK(stub->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::ListNodesResponse resp;
    CHECK(stub->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
    CHECK(resp.nodes_size() == 1);
  }
  CHECK(reads.load() == 4);
  // Every write gets the gate's refusal.
  {
    grpc::ClientContext ctx;
    v1::PutStartRequest req;
    req.add_keys("k");
    req.add_lengths(4096);
    v1::PutStartResponse resp;
    CHECK(refused(stub->PutStart(&ctx, req, &resp)));
  }
  {
    grpc::ClientContext ctx;
    v1::PutCommitRequest req;
    req.set_put_id(1);
    v1::PutCommitResponse resp;
    CHECK(refused(stub->PutCommit(&ctx, req, &resp)));
  }
  {
    grpc::ClientContext ctx;
    v1::RemoveRequest req;
    req.add_keys("k");
    v1::RemoveResponse resp;
    CHECK(refused(stub->Remove(&ctx, req, &resp)));
  }
  {
    grpc::ClientContext ctx;
    v1::ReportMissingRequest req;
    v1::ReportMissingResponse resp;
    CHECK(refused(stub->ReportMissing(&ctx, req, &resp)));
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterNodeResponse resp;
    CHECK(refused(stub->RegisterNode(&ctx, OneRegionNodeReq("n2"), &resp)));
  }
  {
    grpc::ClientContext ctx;
    v1::SetTenantQuotaRequest req;
    req.set_tenant("t");
    v1::SetTenantQuotaResponse resp;
    CHECK(refused(stub->SetTenantQuota(&ctx, req, &resp)));
  }
  CHECK(writes.load() == 7);
  CHECK(reads.load() == 4);
}

TEST_CASE("MasterServer serves the master API over gRPC") {
  MasterOptions o;
  o.db_path = TestDir("serve");
  auto created = MasterServer::Create(o);
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  std::unique_ptr<MasterServer> server = std::move(created).value();
  CHECK(server->port() > 0);
  CHECK(server->address() == "127.0.0.1:" + std::to_string(server->port()));
  auto stub = Dial(server->address());

  v1::RegisterNodeResponse reg;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->RegisterNode(&ctx, OneRegionNodeReq("n1"), &reg).ok());
    CHECK(reg.node_id() == 1);
    CHECK(reg.heartbeat_interval_ms() == 1000);
  }
  {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse hb;  // proves the key: the node is placeable
    REQUIRE(stub->Heartbeat(
                    &ctx, master::ProvingHeartbeat(OneRegionNodeReq("n1"), reg),
                    &hb)
                .ok());
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterNodeRequest bad = OneRegionNodeReq("");
    v1::RegisterNodeResponse resp;
    grpc::Status s = stub->RegisterNode(&ctx, bad, &resp);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("name") != std::string::npos);
  }

  // A maximal batch: 1024 keys of 256 bytes.
  v1::PutStartRequest put;
  for (int i = 0; i < 1024; ++i) {
    std::string key(256, 'k');
    key.replace(0, std::to_string(i).size(), std::to_string(i));
    put.add_keys(key);
    put.add_lengths(4096);
  }
  v1::PutStartResponse started;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub->PutStart(&ctx, put, &started);
    INFO(s.error_message());
    REQUIRE(s.ok());
    CHECK(started.slots_size() == 1024);
    CHECK(started.node().node_id() == reg.node_id());
  }
  {
    grpc::ClientContext ctx;
    v1::PutCommitRequest c;
    c.set_put_id(started.put_id());
    c.add_failed_indexes(1023);
    master::AddWriteReceipts(started, HmacSha256(reg.node_key()), &c);
    v1::PutCommitResponse resp;
    REQUIRE(stub->PutCommit(&ctx, c, &resp).ok());
    CHECK(resp.committed() == 1023);
  }
  {
    grpc::ClientContext ctx;
    v1::PutCommitRequest c;
    c.set_put_id(started.put_id());
    v1::PutCommitResponse resp;
    grpc::Status s = stub->PutCommit(&ctx, c, &resp);
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(s.error_message().find("expired or unknown") != std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::BatchLookupRequest l;
    for (const auto& k : put.keys()) l.add_keys(k);
    v1::BatchLookupResponse resp;
    REQUIRE(stub->BatchLookup(&ctx, l, &resp).ok());
    CHECK(resp.hit_prefix_length() == 1023);
    CHECK(resp.nodes_size() == 1);
    // Every key's result, in order, at the place its put was given.
    REQUIRE(resp.results_size() == 1024);
    for (int i = 0; i < 1023; ++i) {
      INFO(i);
      REQUIRE(resp.results(i).found());
      CHECK(resp.results(i).location().length() == 4096);
      CHECK(resp.results(i).location().addr() ==
            started.slots(i).location().addr());
    }
    CHECK_FALSE(resp.results(1023).found());
  }
  {
    // A refused lookup (one key too many) answers nothing but its error.
    grpc::ClientContext ctx;
    v1::BatchLookupRequest l;
    for (const auto& k : put.keys()) l.add_keys(k);
    l.add_keys("one more");
    v1::BatchLookupResponse resp;
    grpc::Status s = stub->BatchLookup(&ctx, l, &resp);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(resp.results_size() == 0);
  }
  {
    // The lookup counters, by name (the master's Prometheus series).
    grpc::ClientContext ctx;
    v1::GetStatsResponse st;
    REQUIRE(stub->GetStats(&ctx, v1::GetStatsRequest(), &st).ok());
    CHECK(st.stats().at("lookups") == 1);
    CHECK(st.stats().at("lookup_errors") == 1);
    CHECK(st.stats().at("lookup_keys") == 1024);
    CHECK(st.stats().at("lookup_hits") == 1023);
    CHECK(st.stats().at("lookup_prefix_hits") == 1023);
    CHECK(st.stats().at("lookup_seconds_count") == 1);
    CHECK(st.stats().at("evicted_objects") == 0);
  }
  {
    grpc::ClientContext ctx;
    v1::PutStartRequest none;
    none.add_keys("x");
    none.add_lengths(1);
    none.set_preferred_node_id(99);
    v1::PutStartResponse resp;
    CHECK(stub->PutStart(&ctx, none, &resp).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    REQUIRE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    CHECK(stats.object_count() == 1023);
    CHECK(stats.nodes_alive() == 1);
    grpc::ClientContext ctx2;
    v1::ListNodesResponse nodes;
    REQUIRE(stub->ListNodes(&ctx2, v1::ListNodesRequest(), &nodes).ok());
    CHECK(nodes.nodes(0).object_count() == 1023);
    grpc::ClientContext ctx3;
    v1::HeartbeatRequest hb;
    hb.set_node_id(reg.node_id());
    hb.set_incarnation(1);
    v1::HeartbeatResponse hbr;
    // Without a proof of the node's key: refused.
    CHECK(stub->Heartbeat(&ctx3, hb, &hbr).error_code() ==
          grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext ctx3b;
    hb.mutable_auth()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
    hb.mutable_auth()->set_proof(NodeProof(HmacSha256(reg.node_key()),
                                           "heartbeat", "n1", reg.node_id(), 1,
                                           hb.auth().unix_ms()));
    REQUIRE(stub->Heartbeat(&ctx3b, hb, &hbr).ok());
    CHECK_FALSE(hbr.reregister());
    grpc::ClientContext ctx4;
    v1::RemoveRequest rm;
    // The chain's last committed block (the put's last write failed).
    rm.add_keys(put.keys(put.keys_size() - 2));
    v1::RemoveResponse rmr;
    REQUIRE(stub->Remove(&ctx4, rm, &rmr).ok());
    CHECK(rmr.removed(0));
  }

  // A second master cannot open the same store.
  MasterOptions o2 = o;
  CHECK_FALSE(MasterServer::Create(o2).ok());

  // Wait returns once another thread shuts down; Shutdown is idempotent.
  {
    Thread stopper("stopper", [&] { server->Shutdown(); });
    server->Wait();
  }
  server->Shutdown();

  // Restart on the same store (and port).
  MasterOptions o3 = o;
  o3.listen_address = "127.0.0.1:" + std::to_string(server->port());
  server.reset();
  auto again = MasterServer::Create(o3);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  auto stub2 = Dial((*again)->address());
  grpc::ClientContext ctx;
  v1::GetStatsResponse stats;
  REQUIRE(stub2->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  CHECK(stats.object_count() == 1022);

  // The port is taken now: a third server on it fails cleanly.
  MasterOptions o4;
  o4.db_path = TestDir("other");
  o4.listen_address = o3.listen_address;
  CHECK(MasterServer::Create(o4).status().code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("MasterServer's reaper frees expired puts") {
  FakeClock clock;
  MasterOptions o;
  o.db_path = TestDir("reaper");
  o.service.clock = &clock;
  o.service.put_timeout = absl::Milliseconds(40);  // reaper runs every 10 ms
  auto server = MasterServer::Create(o);
  REQUIRE(server.ok());
  auto stub = Dial((*server)->address());
  v1::RegisterNodeResponse reg;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->RegisterNode(&ctx, OneRegionNodeReq("n"), &reg).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse hb;  // proves the key: the node is placeable
    REQUIRE(stub->Heartbeat(&ctx,
                            master::ProvingHeartbeat(OneRegionNodeReq("n"), reg,
                                                     clock.Now()),
                            &hb)
                .ok());
  }
  {
    grpc::ClientContext ctx;
    v1::PutStartRequest put;
    put.add_keys("k");
    put.add_lengths(10);
    v1::PutStartResponse resp;
    REQUIRE(stub->PutStart(&ctx, put, &resp).ok());
    REQUIRE(resp.put_id() != 0);
  }
  auto pending_puts = [&] {
    grpc::ClientContext ctx;
    v1::GetStatsResponse stats;
    REQUIRE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats.pending_puts();
  };
  CHECK(pending_puts() == 1);
  clock.Advance(absl::Seconds(1));
  // The reaper thread (real time) frees it.
  CHECK(Eventually([&] { return pending_puts() == 0; }, absl::Seconds(5)));
}

}  // namespace
}  // namespace hymcache
