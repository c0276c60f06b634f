// How gRPC waits for I/O in this process: its poll strategy.
//
// gRPC fixes the strategy when it starts in a process (its first channel,
// server or completion queue), from the GRPC_POLL_STRATEGY environment
// variable; on Linux its default is "epoll1". Measured with
// tools/bench/lookup_bench (docs/performance.md), the strategy decides how
// cheap a lookup is when several threads of one process call the master:
//   - "epoll1": one thread of the process polls every connection and hands
//     each completion to the thread waiting for it (a futex wake and a
//     context switch per call once several threads wait);
//   - "poll": each thread waiting on a completion queue polls the
//     connections of its own calls and completes them itself. With a
//     connection per calling thread (ClientOptions::master_connections) no
//     completion changes threads.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hymcache {

// OK for "epoll1" and "poll", the strategies set here; InvalidArgument
// otherwise.
absl::Status ValidateGrpcPollStrategy(absl::string_view strategy);

// Makes gRPC use `strategy` in this process when it starts. Call it before
// any gRPC object exists and before other threads read the environment (it
// sets GRPC_POLL_STRATEGY, which gRPC reads then).
// Errors: InvalidArgument for a name ValidateGrpcPollStrategy refuses;
// FailedPrecondition when gRPC already runs in this process, unless this
// function set the same strategy before it started.
absl::Status SetGrpcPollStrategy(absl::string_view strategy);

// Once gRPC runs (it read the strategy when it started): takes back the
// GRPC_POLL_STRATEGY that SetGrpcPollStrategy put in the environment, so
// that processes this one starts (daemons, workers) choose their own. No-op
// if gRPC does not run yet or the variable was not set here.
void RestoreGrpcPollStrategyEnvironment();

// The strategy gRPC runs with in this process ("epoll1", "poll", ...); ""
// while gRPC does not run.
std::string GrpcPollStrategyInUse();

// OK for a configured choice ApplyGrpcPollStrategyChoice takes: "auto",
// "" or a strategy ValidateGrpcPollStrategy accepts.
absl::Status ValidateGrpcPollStrategyChoice(absl::string_view choice);

// A configured choice (ClientOptions::grpc_poll_strategy, the daemons'
// --grpc_poll_strategy) applied: "auto" is
// PreferGrpcPollStrategy(auto_strategy) (nothing where auto_strategy is
// ""), "" leaves gRPC's default, any other name is SetGrpcPollStrategy's.
// Errors: those of SetGrpcPollStrategy.
absl::Status ApplyGrpcPollStrategyChoice(absl::string_view choice,
                                         absl::string_view auto_strategy);

// SetGrpcPollStrategy's default form: sets `strategy` (which
// ValidateGrpcPollStrategy accepts) unless something chose already, i.e.
// gRPC runs in this process or its environment names a strategy
// (GRPC_POLL_STRATEGY, the operator's choice, or an earlier call's).
// Returns whether it set it.
bool PreferGrpcPollStrategy(absl::string_view strategy);

}  // namespace hymcache
