#include "common/grpc_polling.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

namespace hymcache {
namespace {

// The cases run in this order in one process, where gRPC has not started
// before the second.
TEST_CASE("an unknown strategy is refused and nothing is set") {
  REQUIRE(grpc_is_initialized() == 0);
  CHECK(SetGrpcPollStrategy("epollex").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(SetGrpcPollStrategy("").code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateGrpcPollStrategy("poll").ok());
  CHECK(ValidateGrpcPollStrategy("epoll1").ok());
}

TEST_CASE("a preferred strategy is set only where nothing chose one") {
  REQUIRE(grpc_is_initialized() == 0);
  REQUIRE(getenv("GRPC_POLL_STRATEGY") == nullptr);
  CHECK(PreferGrpcPollStrategy("poll"));
  CHECK(std::string(getenv("GRPC_POLL_STRATEGY")) == "poll");
  // Named in the environment now: another preference changes nothing.
  CHECK_FALSE(PreferGrpcPollStrategy("epoll1"));
  CHECK(std::string(getenv("GRPC_POLL_STRATEGY")) == "poll");
}

TEST_CASE("the strategy set before gRPC starts is the one it runs with") {
  REQUIRE(grpc_is_initialized() == 0);
  CHECK(GrpcPollStrategyInUse() == "");
  REQUIRE(SetGrpcPollStrategy("poll").ok());

  int port = 0;
  grpc::CallbackGenericService unimplemented;  // answers UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&unimplemented);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  CHECK(channel->WaitForConnected(std::chrono::system_clock::now() +
                                  std::chrono::seconds(10)));
  CHECK(GrpcPollStrategyInUse() == "poll");

  // Running now: the same strategy again is fine, another is refused.
  CHECK(SetGrpcPollStrategy("poll").ok());
  CHECK(SetGrpcPollStrategy("epoll1").code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(GrpcPollStrategyInUse() == "poll");
  // Taken back from the environment (child processes choose their own);
  // gRPC keeps it.
  REQUIRE(getenv("GRPC_POLL_STRATEGY") != nullptr);
  RestoreGrpcPollStrategyEnvironment();
  CHECK(getenv("GRPC_POLL_STRATEGY") == nullptr);
  CHECK(GrpcPollStrategyInUse() == "poll");
  CHECK(SetGrpcPollStrategy("poll").ok());
  // Nor does a preference once gRPC runs.
  CHECK_FALSE(PreferGrpcPollStrategy("epoll1"));
  CHECK(GrpcPollStrategyInUse() == "poll");
  server->Shutdown();
}

}  // namespace
}  // namespace hymcache
