// The gRPC MasterClient: proto conversion, lookups over a pool of open
// LookupStreams, the pipelined lookups of a Load, and background PutAborts
// on the master's MasterService.
//
// Internal to the client library.
//
// Thread safety: safe for concurrent use. The destructor waits for the
// asynchronous calls still in flight (each bounded by its deadline).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "client/master_client.h"
#include "client/standby_confirmer.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace hymcache {

struct GrpcMasterClientOptions {
  // Lookup round trips of one stream in flight at once (ClientOptions).
  int lookup_pipeline_depth = 4;
  // Lookup travels as a message over an open LookupStream (far cheaper per
  // call than a unary BatchLookup, docs/performance.md), each caller taking
  // an idle stream or opening one; at most this many idle streams are kept
  // open between calls. 0: every Lookup is a unary BatchLookup. A master
  // without LookupStream (UNIMPLEMENTED) gets unary calls from then on.
  int idle_lookup_streams = 16;
  // Sent with every lookup (BatchLookupRequest.reader_host; ClientOptions::
  // host). "": no preference.
  std::string reader_host;
  // Commits a leader with --replication=confirm answers are acknowledged
  // only once the standbys it names hold them (client/standby_confirmer.h),
  // waiting at most confirm_timeout (a standby silent that long counts as
  // a sync leader counts its timeout). Null: such commits are acknowledged
  // with the leader's answer (logged), as with --replication=async.
  std::shared_ptr<StandbyConfirmer> confirmer;
  absl::Duration confirm_timeout = absl::Milliseconds(500);
};

std::unique_ptr<MasterClient> NewGrpcMasterClient(
    std::shared_ptr<grpc::Channel> channel,
    const GrpcMasterClientOptions& options);

// Over several connections to the same master (channels made with distinct
// arguments, so that gRPC does not share one connection between them):
// each calling thread's LookupStreams run on one of them, thread i of the
// process on channels[i mod size]; every other call goes on channels[0].
// Null if `channels` is empty.
std::unique_ptr<MasterClient> NewGrpcMasterClient(
    const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const GrpcMasterClientOptions& options);

}  // namespace hymcache
