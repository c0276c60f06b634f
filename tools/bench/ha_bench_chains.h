// The callback-API load of ha_bench (ha_bench.cc says what it measures):
// chains of puts (--put_depth) and of lookups (--lookup_depth), each one
// slot of a client thread's calls in flight.
//
// Thread safety: a chain's callbacks run on gRPC's threads one at a time,
// so its fields need no lock; read them after its `done` ran.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/standby_confirmer.h"
#include "common/capability.h"
#include "proto/master.grpc.pb.h"

namespace hymcache::bench {

// How long a put waits for its standbys' confirmation (the SDK's default,
// GrpcMasterClientOptions::confirm_timeout).
inline constexpr absl::Duration kConfirmTimeout = absl::Milliseconds(500);

// Puts of `keys_per_put` 4 KiB keys "<prefix><n>-<k>" one after another on
// `stub` (PutStart, then PutCommit with the node's receipts signed with
// `node_key`, then, when the answer names standbys, the confirmation
// through `confirmer`, as the SDK counts a put) until `end`, then calls
// `done` as its last act.
class PutChain {
 public:
  PutChain(v1::MasterService::Stub* stub, const HmacSha256* node_key,
           StandbyConfirmer* confirmer, int keys_per_put, std::string prefix,
           absl::Time end, std::function<void()> done);

  void Start() { Next(); }

  uint64_t puts = 0;
  uint64_t failures = 0;
  std::vector<std::string> keys;      // of the puts that counted
  std::vector<absl::Duration> times;  // PutStart to counted, per put

 private:
  void Next();
  void OnStarted(const grpc::Status& st);
  void OnCommitted(const grpc::Status& st);
  void OnConfirmed(bool ok);

  v1::MasterService::Stub* const stub_;
  const HmacSha256* const node_key_;
  StandbyConfirmer* const confirmer_;
  const int keys_per_put_;
  const std::string prefix_;
  const absl::Time end_;
  const std::function<void()> done_;
  uint64_t n_ = 0;
  absl::Time started_;
  v1::PutStartRequest start_req_;
  v1::PutStartResponse start_resp_;
  std::unique_ptr<grpc::ClientContext> start_ctx_;
  v1::PutCommitRequest commit_req_;
  v1::PutCommitResponse commit_resp_;
  std::unique_ptr<grpc::ClientContext> commit_ctx_;
};

// A BatchLookup of `batch` keys picked from `keys` (not empty) by `rng`
// into `req` (cleared first); it asks for packed answers when `packed`, as
// the SDK always does (client/grpc_master_client.cc).
void FillLookup(const std::vector<std::string>& keys, int batch, bool packed,
                std::mt19937_64* rng, v1::BatchLookupRequest* req);

// The keys `resp` did not find: its zero packed records (node_id 0), or
// its results not found.
uint64_t MissesOf(const v1::BatchLookupResponse& resp);

// BatchLookups of `batch` random keys of `keys` (not empty; it outlives
// the chain), packed or not (FillLookup), one after another on `stub`
// until `end`, then calls `done` as its last act.
class LookupChain {
 public:
  LookupChain(v1::MasterService::Stub* stub,
              const std::vector<std::string>* keys, int batch, bool packed,
              uint64_t seed, absl::Time end, std::function<void()> done);

  void Start() { Next(); }

  uint64_t lookups = 0;
  uint64_t misses = 0;
  uint64_t failures = 0;
  std::string first_error;

 private:
  void Next();
  void OnAnswered(const grpc::Status& st);

  v1::MasterService::Stub* const stub_;
  const std::vector<std::string>* const keys_;
  const int batch_;
  const bool packed_;
  std::mt19937_64 rng_;
  const absl::Time end_;
  const std::function<void()> done_;
  v1::BatchLookupRequest req_;
  v1::BatchLookupResponse resp_;
  std::unique_ptr<grpc::ClientContext> ctx_;
};

}  // namespace hymcache::bench
