// Options for the HyMCache client SDK. See client.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hymcache {

// How object bytes move between this process and storage nodes.
enum class TransportKind {
  // Length-prefixed binary framing over TCP (works everywhere).
  kTcp,
  // Same-host shared memory: the node's memory is mapped into this process
  // and copied with loads and stores (the CXL-attached deployment). Nodes on
  // other hosts are unreachable.
  kShm,
  // One-sided RDMA READ/WRITE into registered memory (rdma-core verbs).
  // Client::Create fails with Unavailable on a host without an RDMA device.
  kRdma,
  // Per node: shared memory when the node is on this host, else RDMA when
  // both sides have it, else TCP.
  kAuto,
};

// The kind named "tcp", "shm", "rdma" or "auto" (flags, the Python package).
// Errors: InvalidArgument for any other name.
absl::StatusOr<TransportKind> ParseTransportKind(const std::string& name);

// The pinned host bounce pool that device-memory Loads and Stores
// (MemoryKind::kCudaDevice) go through. It is allocated (cudaHostAlloc) and
// registered with the transport on the first device call, then kept: a
// client that only moves host memory pins nothing.
struct DeviceOptions {
  // Bytes of one chunk: a Load or Store moves the keys that fit one chunk
  // per step, and a block larger than a chunk is not loaded (OutOfRange) or
  // stored (fails). Default: 16 MiB.
  uint64_t bounce_chunk_bytes = 16 << 20;
  // Chunks in the pool: its size is chunks x chunk bytes, and at most this
  // many groups are in flight over all calls at once (a Load holds up to
  // two: one being read while the other is copied to the device); a call
  // that finds none free waits, up to its deadline. >= 1. Default: 4.
  int bounce_chunks = 4;
};

struct ClientOptions {
  // gRPC address of the master, "host:port"; or several masters of which
  // one leads (docs/ha.md), comma-separated ("a:50051,b:50051,c:50051"):
  // each call goes to the leader, and a call a standby refuses (or one no
  // master answers) is sent again to the leader within its deadline.
  // Required unless etcd_endpoints is given.
  std::string master_address;
  // Instead of (or besides) master_address: the etcd cluster the masters
  // campaign on, its client endpoints "host:port" comma-separated
  // ("e1:2379,e2:2379,e3:2379"). The client reads who leads `cluster` from
  // etcd (the leader key /hymcache/<cluster>/master/leader, docs/ha.md),
  // watches it, and sends a call that the old leader refuses or does not
  // answer to the new one within the call's deadline. With master_address
  // too, those masters are tried first. Default: "" (no etcd).
  std::string etcd_endpoints;
  // With etcd_endpoints: the cluster's name, as the masters' --cluster.
  // Default: "default".
  std::string cluster = "default";

  // Bearer token presented to the master (role engine, or admin for
  // hymctl); "" sends none, as a master without identities expects.
  // docs/security.md. Default: "".
  std::string auth_token;
  // TLS towards the master: the CA that signed the master's certificate
  // (PEM file; enables TLS), an optional client certificate and key for
  // mutual TLS, and the name the master's certificate must carry when it is
  // not the host of master_address. Default: "" (plaintext).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;

  // Deadline of a call that is given none (now + this). When it passes, the
  // call returns what it has finished (Load: the blocks loaded so far) and
  // the engine recomputes the rest. Default: 10 s.
  absl::Duration default_deadline = absl::Seconds(10);
  // Deadline of a Store that is given none (now + this): how long its
  // buffers stay in use at most. Default: 2 s.
  absl::Duration default_store_deadline = absl::Seconds(2);

  // Data-plane transport. Default: kTcp.
  TransportKind transport = TransportKind::kTcp;

  // RDMA device to use ("" = the first one). Default: "".
  std::string rdma_device;
  // Idle data-plane connections kept per storage node for reuse (nodes
  // close connections idle for a minute). Default: 4.
  int max_idle_connections_per_node = 4;

  // Keys per master RPC; longer key lists are split. At most the master's
  // limit (1024 by default). Default: 1024.
  uint32_t max_keys_per_rpc = 1024;

  // Keys per lookup round trip of Load with prefetch hints: the first round
  // trip carries this many so that staging and reads start early; later
  // ones are issued concurrently (lookup_pipeline_depth in flight). A Load
  // without hints (Get) looks up max_keys_per_rpc keys per round trip.
  // 1..max_keys_per_rpc. Default: 32.
  uint32_t lookup_batch_keys = 32;
  // Lookup round trips of one Load in flight at once. 1..64. Default: 4.
  int lookup_pipeline_depth = 4;
  // TCP connections to the master. Lookups of the process's calling
  // threads are spread over them (thread i on connection i mod this), so
  // that with the "poll" strategy (grpc_poll_strategy) up to this many
  // threads calling at once each complete their own lookups, with no
  // hand-off between threads (docs/performance.md). They connect when
  // first used: a process whose lookups come from one thread opens one.
  // 1..64. Default: 8.
  int master_connections = 8;
  // gRPC's poll strategy for this process (common/grpc_polling.h):
  //   "auto"   "poll" unless gRPC already runs in this process or the
  //            GRPC_POLL_STRATEGY environment variable names a strategy
  //            (then that one stays): the cheaper per lookup when several
  //            threads call at once, each on a connection of its own
  //            (master_connections), and as cheap from one thread;
  //   ""       gRPC's choice (epoll1 on Linux, or GRPC_POLL_STRATEGY);
  //   "poll", "epoll1"  that one. It takes effect only if this process has
  //            not started gRPC yet: Client::Create fails with
  //            FailedPrecondition otherwise (unless an earlier Client set
  //            the same strategy).
  // Default: "auto". The variable is taken back from the environment once
  // gRPC runs, so processes this one starts do not inherit it. Under "poll"
  // a channel's connection attempts advance only while a thread polls it;
  // after a call finds no master, the client keeps its connections
  // connecting itself (common/grpc_reconnect.h), so they come back from a
  // restarted master as fast as with epoll1 (docs/performance.md).
  std::string grpc_poll_strategy = "auto";
  // Most bytes read from a node in one data-plane request of Load (a block
  // larger than this is read alone). Default: 4 MiB.
  uint64_t read_batch_bytes = 4 << 20;
  // Where this client last found its keys, reused so that a Load of
  // blocks it read within location_cache_ttl skips the master and only
  // reads from the node (client/location_cache.h: the node's exact-extent
  // and capability checks make a stale entry a refused read, never another
  // object's bytes; the Load then looks the keys up again). Entries held at
  // most; 0 turns the cache off. Default: 16384 (a few MiB).
  uint32_t location_cache_entries = 16384;
  // How long an entry is used, at most (also never past 1 s before its
  // read capability expires). Keep it below the master's read_lease (5 s),
  // which a lookup renews and a cached read does not. 1 ms..60 s.
  // Default: 1 s.
  absl::Duration location_cache_ttl = absl::Seconds(1);
  // How long a storage node that did not answer is skipped
  // (client/unresponsive_nodes.h): a call that waited for it until its
  // deadline marks it, and for this long the
  // client's Loads treat its blocks as misses at once, and its Stores and
  // hints skip it, instead of each waiting for its deadline until the
  // master declares the node dead. Zero: never skipped. Default: 5 s.
  absl::Duration unresponsive_node_period = absl::Seconds(5);
  // Threads that run asynchronous Stores ("hym-store"). Default: 2.
  int store_threads = 2;
  // Stores queued or running at once; a Store beyond this fails at once
  // with ResourceExhausted (skipped, never blocking). Default: 64.
  int max_pending_stores = 64;
  // Think-time hints (Client::HintNextTurn, HintConversationEnded) queued
  // or running at once; one beyond is dropped (ResourceExhausted).
  // Default: 64.
  int max_pending_hints = 64;
  // Copies the master asks a read for (a prefix that many sessions share,
  // its --auto_replica_branches; docs/deployment.md, "Replicas of hot
  // prefixes"): after such a Load into host memory, the client stores
  // copies of the blocks it read up to the shared one, from the bytes it
  // read, as a background Store (best effort, never delaying the Load),
  // when they come to at most this many bytes. 0: never. Default: 64 MiB.
  uint64_t max_auto_copy_bytes = uint64_t{64} << 20;
  // The machine this client runs on, sent with its lookups
  // (BatchLookupRequest.reader_host): of a block and its copy, the one on a
  // storage node of this host (its --host) serves first. At most 253 bytes.
  // Default: "" = $HYM_HOST, else the hostname.
  std::string host;
  // Device-memory buffers (LoadOptions::memory, StoreOptions::memory).
  DeviceOptions device;
  // Checks every field; InvalidArgument names the bad one.
  absl::Status Validate() const;
  // master_address split at commas (empty entries dropped).
  std::vector<std::string> MasterAddresses() const;
  // etcd_endpoints split at commas (empty entries dropped).
  std::vector<std::string> EtcdEndpoints() const;
};

}  // namespace hymcache
