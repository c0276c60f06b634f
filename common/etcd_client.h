// EtcdClient: a client of etcd's v3 gRPC API (proto/etcd_rpc.proto, the
// subset HyMCache uses: KV Range/Put/DeleteRange/Txn, leases, watches) over
// several endpoints of one etcd cluster, with failover between them.
//
// Every call has a deadline (the caller's, or now + call_timeout). Within it
// the call goes to the endpoint that answered last; when that endpoint does
// not answer (UNAVAILABLE: refused, reset, or etcd's "no leader" / "request
// timed out"; or no answer within attempt_timeout) the next endpoint is
// tried, round after round with a short pause, until the deadline. Errors
// are absl::Status with gRPC's (= absl's) canonical code and etcd's message:
//   UNAVAILABLE / DEADLINE_EXCEEDED  no endpoint answered in time (etcd
//                                    unreachable, quorum lost);
//   NOT_FOUND                        e.g. "etcdserver: requested lease not
//                                    found";
//   OUT_OF_RANGE                     a revision compacted away;
//   INVALID_ARGUMENT, FAILED_PRECONDITION, ...  as etcd answers.
// A mutation retried on another endpoint after UNAVAILABLE or a timeout may
// have been applied by the first one too (etcd does not deduplicate): make
// writes conditional (Txn compares) where applying twice matters.
//
// Watch() starts an EtcdWatcher: a named thread holding one Watch stream,
// which resumes on the next endpoint after the revision it last delivered
// when the stream breaks or goes silent (a second thread probes it), so a
// watcher sees every event once and in order
// (unless the revisions it missed were compacted: then it reports
// OUT_OF_RANGE and carries on from the compaction).
//
// Not yet: TLS and etcd authentication (the tests and the quickstart run
// etcd on loopback without them); add them to EtcdClientOptions when HA
// ships to a real deployment.
//
// Thread safety: EtcdClient is safe for concurrent use without external
// synchronization; calls block the calling thread (synchronous gRPC) and
// never call back. An EtcdWatcher's callback runs on its own thread, one
// batch at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/thread.h"
#include "proto/etcd_mvccpb.pb.h"
#include "proto/etcd_rpc.grpc.pb.h"
#include "proto/etcd_rpc.pb.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace hymcache {

class ChannelReconnector;
class EtcdWatcher;

struct EtcdClientOptions {
  // etcd's client URLs as host:port (an "http://" prefix is accepted and
  // dropped). Required: at least one. Members of one cluster.
  std::vector<std::string> endpoints;
  // Deadline of a call whose caller gives none. Default: 5 s.
  absl::Duration call_timeout = absl::Seconds(5);
  // How long one endpoint gets before the next is tried. Default: 1 s.
  absl::Duration attempt_timeout = absl::Seconds(1);
  // Pause after every endpoint failed once, before the next round.
  // Default: 50 ms.
  absl::Duration retry_pause = absl::Milliseconds(50);

  // InvalidArgument for no endpoints, an empty or malformed endpoint, or a
  // non-positive duration.
  absl::Status Validate() const;
};

// One revision's worth of watch events (or several), in revision order.
struct EtcdWatchBatch {
  std::vector<mvccpb::Event> events;
  // The store's revision when etcd sent the batch.
  int64_t revision = 0;
};

struct EtcdWatchOptions {
  // The key watched, or the range [key, range_end) (EtcdClient::PrefixEnd).
  std::string key;
  std::string range_end;
  // First revision reported; 0: changes from now on. Default: 0.
  int64_t start_revision = 0;
  // The watcher thread's name (its prober's: the same, "-p" appended).
  // Default: "hym-etcd-watch".
  std::string thread_name = "hym-etcd-watch";
  // How often the stream is probed (a progress request, which etcd
  // answers): a stream that heard nothing for 3 probes is dropped and the
  // watch resumes on another member. Catches a member that is frozen or
  // cut off with its connection still up. Default: 1 s.
  absl::Duration probe_interval = absl::Seconds(1);
};

// Gets each batch of events, or OUT_OF_RANGE when events were compacted
// away before they could be delivered (the watcher then continues from the
// compaction revision: re-read the state). Runs on the watcher's thread;
// must not destroy the watcher.
using EtcdWatchCallback = std::function<void(absl::StatusOr<EtcdWatchBatch>)>;

class EtcdClient {
 public:
  // A deadline argument's default: now + options.call_timeout.
  static constexpr absl::Time kDefaultDeadline = absl::InfinitePast();

  // Errors: InvalidArgument (Validate). Does not connect: the first call
  // does.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(
      const EtcdClientOptions& options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // etcd's KV service, as documented in proto/etcd_rpc.proto.
  absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request,
      absl::Time deadline = kDefaultDeadline);
  absl::StatusOr<etcdserverpb::PutResponse> Put(
      const etcdserverpb::PutRequest& request,
      absl::Time deadline = kDefaultDeadline);
  absl::StatusOr<etcdserverpb::DeleteRangeResponse> DeleteRange(
      const etcdserverpb::DeleteRangeRequest& request,
      absl::Time deadline = kDefaultDeadline);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request,
      absl::Time deadline = kDefaultDeadline);

  // Leases. `ttl` is rounded up to whole seconds (etcd's unit); etcd may
  // grant more (its minimum TTL; the response says).
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(
      absl::Duration ttl, absl::Time deadline = kDefaultDeadline);
  // NOT_FOUND when the lease does not exist (expired, revoked).
  absl::Status LeaseRevoke(int64_t lease,
                           absl::Time deadline = kDefaultDeadline);
  // One renewal of `lease` on a LeaseKeepAlive stream opened for it.
  // NOT_FOUND when the lease no longer exists (etcd answers TTL <= 0).
  absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> LeaseKeepAliveOnce(
      int64_t lease, absl::Time deadline = kDefaultDeadline);
  // The lease's remaining TTL (-1 when it does not exist, as etcd says).
  absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse> LeaseTimeToLive(
      int64_t lease, bool keys = false,
      absl::Time deadline = kDefaultDeadline);

  // The key's current value (a linearizable read), or nullopt when absent.
  absl::StatusOr<std::optional<mvccpb::KeyValue>> Get(
      const std::string& key, absl::Time deadline = kDefaultDeadline);

  // Starts watching (see EtcdWatcher). Errors: InvalidArgument (empty key),
  // ResourceExhausted (no thread). The client must outlive the watcher.
  absl::StatusOr<std::unique_ptr<EtcdWatcher>> Watch(
      const EtcdWatchOptions& options, EtcdWatchCallback callback);

  // The range_end that makes [prefix, range_end) every key starting with
  // `prefix` ("\0" for an empty prefix: every key).
  static std::string PrefixEnd(const std::string& prefix);

  const EtcdClientOptions& options() const { return options_; }
  // Index (in options().endpoints) of the endpoint calls go to first.
  size_t preferred_endpoint() const;
  // Cluster.MemberList (any member, with failover).
  absl::StatusOr<etcdserverpb::MemberListResponse> MemberList(
      absl::Time deadline = kDefaultDeadline);
  // Maintenance.Status of options.endpoints[index] alone (no failover): its
  // member ID (header.member_id) and the raft leader's as it sees it
  // (leader). InvalidArgument for an index out of range.
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(
      size_t index, absl::Time deadline = kDefaultDeadline);
  // Maintenance.MoveLeader sent to options.endpoints[index] alone, which
  // must be the raft leader (else etcd refuses): it hands its leadership to
  // member `target`. etcd then restarts every lease's TTL, as at any raft
  // leader change.
  absl::Status MoveLeader(size_t index, uint64_t target,
                          absl::Time deadline = kDefaultDeadline);

  // Calls that moved on to another endpoint (for tests and metrics).
  uint64_t failovers() const;

 private:
  friend class EtcdWatcher;
  struct Endpoint {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  };
  // One attempt on one endpoint: fills the response, returns gRPC's status.
  using Attempt = std::function<absl::Status(const Endpoint&,
                                             grpc::ClientContext*)>;

  explicit EtcdClient(const EtcdClientOptions& options);
  // Runs `attempt` with failover until `deadline` (see the file comment).
  absl::Status Call(const char* what, absl::Time deadline,
                    const Attempt& attempt);
  // One attempt on endpoint `index` only, within `deadline`.
  absl::Status CallOne(const char* what, size_t index, absl::Time deadline,
                       const Attempt& attempt);
  absl::Time Deadline(absl::Time deadline) const;
  // The endpoint after `failed` becomes the preferred one (unless another
  // thread moved it already) and its channel is kept connecting.
  void Failover(size_t failed);

  const EtcdClientOptions options_;
  std::vector<Endpoint> endpoints_;
  std::unique_ptr<ChannelReconnector> reconnector_;

  mutable Mutex mu_;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failovers_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Watch stream kept open by a named thread until the watcher is destroyed
// (EtcdClient::Watch). Destroying it cancels the stream and joins the
// thread; no callback runs after the destructor returns.
//
// Thread safety: connected() is safe from any thread.
class EtcdWatcher {
 public:
  ~EtcdWatcher();
  EtcdWatcher(const EtcdWatcher&) = delete;
  EtcdWatcher& operator=(const EtcdWatcher&) = delete;

  // Whether etcd confirmed the watch on the current stream.
  bool connected() const;
  // The next revision the watcher will report (0 until the first stream).
  int64_t next_revision() const;

 private:
  friend class EtcdClient;
  EtcdWatcher(EtcdClient* client, EtcdWatchOptions options,
              EtcdWatchCallback callback);
  void Run();
  // One stream on endpoint `index` until it breaks or Stop; whether etcd
  // accepted the watch on it.
  bool RunStream(size_t index);
  // The prober's loop (EtcdWatchOptions::probe_interval).
  void Probe();

  using Stream = grpc::ClientReaderWriterInterface<etcdserverpb::WatchRequest,
                                                   etcdserverpb::WatchResponse>;

  EtcdClient* const client_;
  const EtcdWatchOptions options_;
  const EtcdWatchCallback callback_;
  Thread thread_;
  Thread prober_;

  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The open stream; once etcd confirmed the watch the prober writes to it
  // (outside mu_, with probing_ set; the stream outlives the write).
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  // When the open stream last delivered anything.
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // The stream's context while one is open (TryCancel on destruction).
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  CondVar cv_;
};

}  // namespace hymcache
