// ChannelReconnector under gRPC's "poll" strategy with its backup poller
// off: there, once a channel lost its server, nothing but a waiting call
// polls its next connection attempt, and a Kick must carry it through.
#include "common/grpc_reconnect.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/eventually.h"
#include "common/grpc_polling.h"

namespace hymcache {
namespace {

// A server answering UNIMPLEMENTED.
struct TestServer {
  ~TestServer() {
    // No call to wait for (and under "poll" the client, which nothing
    // polls, would not answer the goodbye in time).
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
  grpc::CallbackGenericService service;  // outlives the server
  std::unique_ptr<grpc::Server> server;
};

// A TestServer on `address` ("127.0.0.1:0": any port, written to `*port`).
std::unique_ptr<TestServer> StartServer(const std::string& address, int* port) {
  auto s = std::make_unique<TestServer>();
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&s->service);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  s->server = builder.BuildAndStart();
  REQUIRE(s->server != nullptr);
  REQUIRE(*port > 0);
  return s;
}

// A channel of its own (distinct arguments: no connection shared with
// another test's), retrying every 100-200 ms once its server is gone.
std::shared_ptr<grpc::Channel> NewChannel(int port, int id) {
  grpc::ChannelArguments args;
  args.SetInt("test.channel", id);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

bool Connect(grpc::Channel* channel) {
  return channel->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::seconds(20));
}

// Takes channel's server away and waits until the channel has failed a
// connection attempt to its port (TRANSIENT_FAILURE): from there on, under
// "poll", its retries proceed only while something polls it.
void LoseServer(grpc::Channel* channel, std::unique_ptr<TestServer> server) {
  server.reset();
  // Waiting polls the channel: it sees the connection close.
  channel->WaitForStateChange(
      GRPC_CHANNEL_READY,
      std::chrono::system_clock::now() + std::chrono::seconds(20));
  REQUIRE(testing::Eventually(
      [&] {
        return channel->GetState(/*try_to_connect=*/true) ==
               GRPC_CHANNEL_TRANSIENT_FAILURE;
      },
      absl::Seconds(20)));
}

// Runs first, before gRPC starts in this process.
TEST_CASE("the process runs gRPC's poll strategy, backup poller off") {
  REQUIRE(grpc_is_initialized() == 0);
  REQUIRE(setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", 1) == 0);
  REQUIRE(SetGrpcPollStrategy("poll").ok());
}

TEST_CASE("a kicked channel reconnects to its restarted server") {
  int port = 0;
  auto server = StartServer("127.0.0.1:0", &port);
  auto channel = NewChannel(port, 1);
  REQUIRE(Connect(channel.get()));
  ChannelReconnector reconnector({channel});
  reconnector.Kick(0);  // READY: nothing to watch
  CHECK(reconnector.watching() == 0);

  LoseServer(channel.get(), std::move(server));
  int again = 0;
  server = StartServer("127.0.0.1:" + std::to_string(port), &again);
  REQUIRE(again == port);
  reconnector.Kick(0);
  reconnector.Kick(0);  // once is enough; a second changes nothing
  // Without the kicks gRPC 1.51 connects after about 10 s (its connect
  // attempt waits out a timer), with them in about 0.1 s.
  CHECK(testing::Eventually(
      [&] { return channel->GetState(false) == GRPC_CHANNEL_READY; },
      absl::Seconds(5)));
  // READY: the watch ends (within a slice).
  CHECK(testing::Eventually([&] { return reconnector.watching() == 0; },
                            absl::Seconds(5)));
}

TEST_CASE("a reconnector goes while its channel has no server") {
  int port = 0;
  auto server = StartServer("127.0.0.1:0", &port);
  auto channel = NewChannel(port, 2);
  REQUIRE(Connect(channel.get()));
  auto reconnector = std::make_unique<ChannelReconnector>(
      std::vector<std::shared_ptr<grpc::Channel>>{channel});
  LoseServer(channel.get(), std::move(server));
  reconnector->KickAll();
  reconnector->Kick(7);  // out of range: ignored
  CHECK(reconnector->watching() == 1);
  // Its watch ends within a slice; the channel lives on.
  reconnector.reset();
  CHECK(channel->GetState(false) != GRPC_CHANNEL_READY);
}

}  // namespace
}  // namespace hymcache
