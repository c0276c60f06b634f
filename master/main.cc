// hymcache-master: the metadata and placement daemon.
//
//   hymcache-master --listen=0.0.0.0:50051 --db_path=/var/lib/hymcache/master
//
// Prints "hymcache-master listening on HOST:PORT" on stdout once serving
// (with --listen=...:0 the port is the one picked), then
// "hymcache-master metrics on HOST:PORT" with --metrics_listen; stops cleanly
// on SIGTERM or SIGINT and exits 0; SIGHUP re-reads --auth_tokens_file.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "common/malloc_tuning.h"
#include "master/main_ha.h"
#include "master/master_server.h"

namespace {

// Every default below comes from here (MasterOptions and, inside it,
// MasterServiceOptions), except where the daemon's differs from the
// library's (the listen address and the store's directory).
const hymcache::MasterOptions& Defaults() {
  static const hymcache::MasterOptions* const d = new hymcache::MasterOptions;
  return *d;
}
const hymcache::master::MasterServiceOptions& ServiceDefaults() {
  return Defaults().service;
}
int64_t Ms(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

DEFINE_string(listen, "127.0.0.1:50051",
              "gRPC host:port to serve on (port 0 picks a free port)");
DEFINE_uint32(rpc_threads, hymcache::MasterOptions().rpc_threads,
              "threads serving the gRPC API, each polling its own completion "
              "queue (1..64; docs/performance.md)");
DEFINE_uint32(max_lookup_streams, hymcache::MasterOptions().max_lookup_streams,
              "LookupStreams (BatchLookup over an open stream) open at once; "
              "callers beyond them use unary BatchLookups");
DEFINE_string(db_path, "./hymcache-data/master",
              "RocksDB directory of the master's metadata (created if needed)");
DEFINE_int64(node_timeout_ms, Ms(ServiceDefaults().node_timeout),
             "a storage node silent this long is dead");
DEFINE_int64(put_timeout_ms, Ms(ServiceDefaults().put_timeout),
             "pending puts not committed within this are freed");
DEFINE_bool(require_write_receipts, ServiceDefaults().require_write_receipts,
            "commit a put's slot only with its storage node's write receipt "
            "(node-confirmed commits, docs/ha.md); false only for "
            "benchmarks of the master alone and nodes older than receipts");
DEFINE_int64(heartbeat_interval_ms, Ms(ServiceDefaults().heartbeat_interval),
             "heartbeat period told to storage nodes");
DEFINE_int64(read_lease_ms, Ms(ServiceDefaults().read_lease),
             "an object returned to a reader is not evicted for this long "
             "(0: reads do not protect objects from eviction)");
DEFINE_int64(capability_lifetime_ms, Ms(ServiceDefaults().capability_lifetime),
             "lifetime of the read capability handed out with each lookup "
             "hit (storage nodes accept it for their --capability_skew_ms "
             "longer); must exceed a client's call deadline plus the read "
             "lease");
DEFINE_uint32(max_evictions_per_put, ServiceDefaults().max_evictions_per_put,
              "most objects one put may evict from a full node (0: never "
              "evict; a full node refuses puts)");
DEFINE_uint32(max_eviction_scan, ServiceDefaults().max_eviction_scan,
              "most objects one put's eviction walk looks at, victims and "
              "objects passed over (leased, pinned, with children) together");
DEFINE_string(eviction_policy,
              std::string(hymcache::master::EvictionPolicyName(
                  ServiceDefaults().eviction_policy)),
              "which objects a full node evicts first: lru (the least "
              "recently used chain tails) or cost (the lowest prefill time "
              "saved per byte among --eviction_cost_pool least recent "
              "tails; master/eviction_cost.h); chains whose conversation "
              "ended go first under both");
DEFINE_uint32(eviction_cost_pool, ServiceDefaults().eviction_cost.pool,
              "with --eviction_policy=cost: evictable tails compared per "
              "choice, from the least recent (1: LRU)");
DEFINE_uint32(eviction_cost_block_tokens,
              ServiceDefaults().eviction_cost.block_tokens,
              "with --eviction_policy=cost: tokens per block");
DEFINE_uint32(eviction_cost_attention_tokens,
              ServiceDefaults().eviction_cost.attention_tokens,
              "with --eviction_policy=cost: context length at which a "
              "token's attention FLOPs equal its weights' (2 x parameters "
              "/ (4 x layers x hidden size); 0: no position term)");
DEFINE_int64(eviction_cost_turn_horizon_ms,
             Ms(ServiceDefaults().eviction_cost.turn_horizon),
             "with --eviction_policy=cost: a chain hinted as awaiting its "
             "next turn (HintNextTurn) and not read again within this long "
             "counts as not returned (the tenant's turn-return rate)");
DEFINE_uint32(recency_batch, ServiceDefaults().recency_batch,
              "most object reads the reaper writes to the store per round, "
              "so that a restart keeps the eviction order (0: reads are not "
              "persisted; a restart orders objects by commit time)");
DEFINE_uint64(index_snapshot_changes, ServiceDefaults().snapshot_changes,
              "an index snapshot after this many store changes (or half the "
              "index, if more), besides every 10 min and at shutdown; a "
              "standby snapshots its follower's store alike (0: by time "
              "only)");
DEFINE_int64(reconcile_interval_ms, Ms(ServiceDefaults().reconcile_interval),
             "period of each storage node's background reconciliation of its "
             "extents with the master's listings (0: only at registration)");
DEFINE_uint32(max_nodes, ServiceDefaults().max_nodes,
              "most node records kept (alive or dead); forget dead ones with "
              "`hymctl node forget NAME`");
DEFINE_int64(forget_dead_nodes_after_s,
             absl::ToInt64Seconds(ServiceDefaults().forget_dead_nodes_after),
             "forget a node record (and its objects) unseen this long (s; "
             "0: never)");
DEFINE_double(max_pending_share_per_caller,
              ServiceDefaults().max_pending_share_per_caller,
              "most bytes of one caller's pending puts on a node, as a share "
              "of the node's capacity");
DEFINE_uint64(max_pending_slots_per_caller,
              ServiceDefaults().max_pending_slots_per_caller,
              "most objects in one caller's pending puts");
DEFINE_string(
    placement,
    hymcache::master::PlacementPolicyName(ServiceDefaults().placement.policy),
    "which node takes new puts: load_aware (fill, recent traffic, "
    "chains kept while within --placement_chain_spill_over) or "
    "round_robin");
DEFINE_double(placement_chain_spill_over,
              ServiceDefaults().placement.chain_spill_over,
              "a chain continues on another node once its node is filled "
              "this share beyond the cluster's mean");
DEFINE_double(placement_load_weight, ServiceDefaults().placement.load_weight,
              "weight of recent traffic and puts in flight against fill "
              "(fill units, reached at 4x the mean)");
DEFINE_double(max_tenant_share_per_node,
              ServiceDefaults().placement.max_tenant_share_per_node,
              "most of one named tenant's bytes on one node (best effort; "
              "1: no limit)");
DEFINE_uint64(tenant_share_min_bytes,
              ServiceDefaults().placement.tenant_share_min_bytes,
              "the tenant share limit applies from this many tenant bytes");
DEFINE_uint32(auto_replica_branches, ServiceDefaults().auto_replica_branches,
              "a read of a prefix that at least this many chains continue "
              "from (a shared system prompt) stores copies of it on a second "
              "node, where it has none (docs/deployment.md, \"Replicas of "
              "hot prefixes\"); 0: never");
DEFINE_uint64(event_log_capacity, ServiceDefaults().event_log_capacity,
              "KV events kept for WatchEvents subscribers (hymctl events, "
              "routers); 0: none");
DEFINE_uint32(max_engines, ServiceDefaults().engine_caches.max_engines,
              "engines whose own caches (ReportEngineBlocks: python -m "
              "hymcache.engine_blocks) the master keeps for PrefixQuery's "
              "answer per engine; 0: none");
DEFINE_uint32(max_engine_blocks,
              ServiceDefaults().engine_caches.max_blocks_per_engine,
              "keys kept per engine (the oldest reported go first)");
DEFINE_uint32(engine_ttl_s,
              absl::ToInt64Seconds(ServiceDefaults().engine_caches.ttl),
              "an engine not reported for this long is forgotten");
DEFINE_bool(sync_writes, Defaults().sync_writes,
            "fsync the metadata WAL on every write (survives power loss)");
DEFINE_string(etcd, "",
              "etcd client endpoints, HOST:PORT[,HOST:PORT...]: the master "
              "campaigns for leadership and serves only while elected, "
              "standing by (NOT_LEADER, health NOT_SERVING) otherwise; exits "
              "3 when its term ends (docs/ha.md). Empty: a single master");
DEFINE_string(cluster, "default",
              "with --etcd: the cluster's name (etcd keys under "
              "/hymcache/NAME/)");
DEFINE_string(advertise_address, "",
              "with --etcd: the address clients and nodes reach this master "
              "at, published while it leads (default: the listen address)");
DEFINE_int32(lease_ttl_s, 5,
             "with --etcd: the leadership lease, whole seconds: how long the "
             "cluster is without a leader after a leader dies");
DEFINE_bool(serve_reads_without_etcd,
            hymcache::HaMasterOptions().serve_reads_without_etcd,
            "with --etcd: a leader whose lease could not be renewed because "
            "etcd did not answer (no quorum, or cut off) keeps answering "
            "lookups, refusing writes (reason read_only), until an election "
            "decides again (docs/ha.md); false: it exits at once");
DEFINE_bool(preload_index, hymcache::HaMasterOptions().preload_index,
            "with --etcd and replication: a standby loads its index while "
            "it stands by, so that if elected before its follower applies "
            "anything (all masters restarted at once) it serves without "
            "loading again; costs the index's memory while standing by");

DEFINE_bool(end_dead_leader_terms,
            hymcache::HaMasterOptions().end_dead_leader_terms,
            "with --etcd: a master that finds the leader key naming its own "
            "address (an earlier process of it, restarted) revokes that "
            "lease at once; with replication, a standby whose stream from "
            "the leader broke and whose connect to the leader is refused "
            "(the leader's process is gone, its host up) revokes the "
            "leader's lease, so that a standby leads at once instead of "
            "after --lease_ttl_s (docs/ha.md); false: always wait for the "
            "lease");
DEFINE_bool(etcd_move_raft_leader,
            hymcache::HaMasterOptions().move_etcd_raft_leader,
            "with --etcd: the leading master keeps etcd's raft leadership "
            "off the member listed first in --etcd (in a three-host "
            "install, this host's own), so that losing one host never loses "
            "both leaders at once (docs/ha.md)");
DEFINE_int64(
    election_ranking_ms,
    absl::ToInt64Milliseconds(hymcache::HaMasterOptions().ranking_window),
    "with --etcd and replication: when the leader goes, each standby "
    "publishes how much of its store it holds and waits up to this long "
    "for the other standbys', so that the most up-to-date one leads "
    "(docs/ha.md; a lone standby does not wait). 0: the first standby "
    "to campaign leads");

DEFINE_string(replication, "",
              "standby replication (docs/ha.md): off, async (standbys follow "
              "the leader's store; a leader crash loses the standby's lag), "
              "sync (a PutCommit is answered once a standby holds it, or "
              "after --replication_sync_timeout_ms) or confirm (answered at "
              "once; the client acknowledges the put once the standbys say "
              "they hold it). Empty: async with --etcd, off without");
DEFINE_int64(replication_sync_timeout_ms,
             Ms(Defaults().replication_sync_timeout),
             "with --replication=sync: the longest a commit waits for a "
             "standby before it is answered anyway (counted in "
             "hymcache_master_replication_sync_timeouts_total)");
DEFINE_int64(replication_async_delay_ms,
             Ms(Defaults().replication_async_batch_delay),
             "with --replication=async: how long the stream to a standby "
             "gathers writes into one message (0..1000): up to this much "
             "more lag, i.e. more commits a leader crash may lose, for less "
             "leader CPU per write (docs/ha.md)");
DEFINE_int64(replication_confirm_delay_ms,
             Ms(Defaults().replication_confirm_batch_delay),
             "with --replication=confirm: the same for its stream (0..1000): "
             "up to this much more latency per put (the client waits for "
             "the standby) for less leader CPU per write (docs/ha.md)");
DEFINE_string(replication_token_file, "",
              "with --etcd: a file holding the admin token a standby presents "
              "to the leader to follow it (needed when the masters have "
              "--auth_tokens_file)");

namespace {

// The flags as MasterOptions, validated; INVALID_ARGUMENT naming the bad
// flag.
absl::Status OptionsFromFlags(hymcache::MasterOptions* options) {
  options->listen_address = FLAGS_listen;
  options->rpc_threads = FLAGS_rpc_threads;
  options->max_lookup_streams = FLAGS_max_lookup_streams;
  options->db_path = FLAGS_db_path;
  hymcache::master::MasterServiceOptions& so = options->service;
  so.node_timeout = absl::Milliseconds(FLAGS_node_timeout_ms);
  so.put_timeout = absl::Milliseconds(FLAGS_put_timeout_ms);
  so.require_write_receipts = FLAGS_require_write_receipts;
  so.heartbeat_interval = absl::Milliseconds(FLAGS_heartbeat_interval_ms);
  so.read_lease = absl::Milliseconds(FLAGS_read_lease_ms);
  so.capability_lifetime = absl::Milliseconds(FLAGS_capability_lifetime_ms);
  so.max_evictions_per_put = FLAGS_max_evictions_per_put;
  so.max_eviction_scan = FLAGS_max_eviction_scan;
  so.recency_batch = FLAGS_recency_batch;
  so.snapshot_changes = FLAGS_index_snapshot_changes;
  so.max_nodes = FLAGS_max_nodes;
  so.forget_dead_nodes_after =
      FLAGS_forget_dead_nodes_after_s == 0
          ? absl::InfiniteDuration()
          : absl::Seconds(FLAGS_forget_dead_nodes_after_s);
  so.max_pending_share_per_caller = FLAGS_max_pending_share_per_caller;
  so.max_pending_slots_per_caller = FLAGS_max_pending_slots_per_caller;
  so.reconcile_interval = absl::Milliseconds(FLAGS_reconcile_interval_ms);
  auto eviction = hymcache::master::ParseEvictionPolicy(FLAGS_eviction_policy);
  if (!eviction.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eviction_policy: ", eviction.status().message()));
  }
  so.eviction_policy = *eviction;
  so.eviction_cost.pool = FLAGS_eviction_cost_pool;
  so.eviction_cost.block_tokens = FLAGS_eviction_cost_block_tokens;
  so.eviction_cost.attention_tokens = FLAGS_eviction_cost_attention_tokens;
  so.eviction_cost.turn_horizon =
      absl::Milliseconds(FLAGS_eviction_cost_turn_horizon_ms);
  auto policy = hymcache::master::ParsePlacementPolicy(FLAGS_placement);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--placement: ", policy.status().message()));
  }
  so.placement.policy = *policy;
  so.placement.chain_spill_over = FLAGS_placement_chain_spill_over;
  so.placement.load_weight = FLAGS_placement_load_weight;
  so.auto_replica_branches = FLAGS_auto_replica_branches;
  so.placement.max_tenant_share_per_node = FLAGS_max_tenant_share_per_node;
  so.placement.tenant_share_min_bytes = FLAGS_tenant_share_min_bytes;
  so.event_log_capacity = FLAGS_event_log_capacity;
  so.engine_caches.max_engines = FLAGS_max_engines;
  so.engine_caches.max_blocks_per_engine = FLAGS_max_engine_blocks;
  so.engine_caches.ttl = absl::Seconds(FLAGS_engine_ttl_s);
  options->sync_writes = FLAGS_sync_writes;
  auto mode = hymcache::master::ParseReplicationMode(
      FLAGS_replication.empty() ? (FLAGS_etcd.empty() ? "off" : "async")
                                : FLAGS_replication);
  if (!mode.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replication: ", mode.status().message()));
  }
  options->replication = *mode;
  options->replication_sync_timeout =
      absl::Milliseconds(FLAGS_replication_sync_timeout_ms);
  options->replication_async_batch_delay =
      absl::Milliseconds(FLAGS_replication_async_delay_ms);
  options->replication_confirm_batch_delay =
      absl::Milliseconds(FLAGS_replication_confirm_delay_ms);
  hymcache::DaemonOptionsFromFlags(options);  // security, metrics, build
  return options->Validate();
}

}  // namespace

int main(int argc, char** argv) {
  // First, with main's argv as given: the re-executed image starts here
  // again with the tunables set (common/malloc_tuning.h).
  hymcache::ReexecWithDaemonMallocTunables(argv);
  hymcache::StartDaemonMain(
      {.program = "hymcache-master",
       .usage = "HyMCache master: metadata, placement, liveness.\n"
                "  hymcache-master --listen=HOST:PORT --db_path=DIR [flags]",
       .groups =
           {{"Serving", {"listen", "db_path", "sync_writes", "metrics_listen"}},
            {"High availability (docs/ha.md)",
             {"etcd", "cluster", "advertise_address", "lease_ttl_s",
              "serve_reads_without_etcd", "preload_index",
              "etcd_move_raft_leader", "election_ranking_ms",
              "end_dead_leader_terms", "replication",
              "replication_sync_timeout_ms", "replication_async_delay_ms",
              "replication_confirm_delay_ms", "replication_token_file"}},
            {"Nodes and placement",
             {"node_timeout_ms",
              "heartbeat_interval_ms",
              "put_timeout_ms",
              "read_lease_ms",
              "max_evictions_per_put",
              "max_eviction_scan",
              "eviction_policy",
              "eviction_cost_pool",
              "eviction_cost_block_tokens",
              "eviction_cost_attention_tokens",
              "eviction_cost_turn_horizon_ms",
              "recency_batch",
              "index_snapshot_changes",
              "reconcile_interval_ms",
              "capability_lifetime_ms",
              "require_write_receipts",
              "placement",
              "placement_chain_spill_over",
              "placement_load_weight",
              "max_tenant_share_per_node",
              "tenant_share_min_bytes",
              "auto_replica_branches",
              "event_log_capacity",
              "max_engines",
              "max_engine_blocks",
              "engine_ttl_s"}},
            {"Limits",
             {"max_nodes", "forget_dead_nodes_after_s",
              "max_pending_share_per_caller", "max_pending_slots_per_caller"}}},
       .main_file = __FILE__},
      {}, &argc, &argv);

  // Stop and reload signals are taken by WaitForStop below, and blocked in
  // every thread (threads inherit the mask): no work in a signal handler.
  // An elected master's election, follower and replication threads would
  // poll its clients' connections under epoll1 (docs/ha.md); a single
  // master keeps gRPC's default (the same lookup throughput, a lower p99).
  if (absl::Status s =
          hymcache::ApplyGrpcPollStrategyFlag(FLAGS_etcd.empty() ? "" : "poll");
      !s.ok()) {
    return hymcache::ExitForBadFlags("hymcache-master", s);
  }
  hymcache::DaemonSignals signals;
  hymcache::MasterOptions options;
  if (absl::Status s = OptionsFromFlags(&options); !s.ok()) {
    return hymcache::ExitForBadFlags("hymcache-master", s);
  }

  if (!FLAGS_etcd.empty()) {
    hymcache::HaMasterOptions ha;
    ha.etcd_endpoints = absl::StrSplit(FLAGS_etcd, ',', absl::SkipEmpty());
    ha.cluster = FLAGS_cluster;
    ha.advertise_address = FLAGS_advertise_address;
    ha.lease_ttl = absl::Seconds(FLAGS_lease_ttl_s);
    ha.serve_reads_without_etcd = FLAGS_serve_reads_without_etcd;
    ha.preload_index = FLAGS_preload_index;
    ha.end_dead_leader_terms = FLAGS_end_dead_leader_terms;
    ha.move_etcd_raft_leader = FLAGS_etcd_move_raft_leader;
    ha.ranking_window = absl::Milliseconds(FLAGS_election_ranking_ms);
    ha.master = options;
    if (!FLAGS_replication_token_file.empty()) {
      std::ifstream in(FLAGS_replication_token_file);
      std::string token;
      if (!std::getline(in, token)) {
        LOG(ERROR) << "cannot read --replication_token_file "
                   << FLAGS_replication_token_file;
        return 2;
      }
      ha.replication_security.token = token;
    }
    if (absl::Status v = ha.Validate(); !v.ok()) {
      LOG(ERROR) << v;
      return 2;
    }
    std::error_code dir_ec;
    std::filesystem::create_directories(FLAGS_db_path, dir_ec);
    return hymcache::RunHaMaster(ha, signals.signals());
  }

  // Under systemd (Type=notify): READY=1 once serving, STOPPING=1 at the
  // end, watchdog pings while the gRPC server answers (unconditional while
  // the store loads).
  return hymcache::ServeUntilStopped(
      signals, "loading " + FLAGS_db_path, "shutting down",
      [&]() -> absl::StatusOr<hymcache::ServingDaemon> {
        std::error_code ec;
        std::filesystem::create_directories(FLAGS_db_path, ec);
        if (ec) {
          return absl::InternalError("cannot create " + FLAGS_db_path + ": " +
                                     ec.message());
        }
        auto server = hymcache::MasterServer::Create(options);
        if (!server.ok()) return server.status();
        std::printf("hymcache-master listening on %s\n",
                    (*server)->address().c_str());
        if (!(*server)->metrics_address().empty()) {
          std::printf("hymcache-master metrics on %s\n",
                      (*server)->metrics_address().c_str());
        }
        std::fflush(stdout);
        const std::string status = "serving on " + (*server)->address();
        return hymcache::ServingDaemonOf(std::move(*server), status);
      });
}
