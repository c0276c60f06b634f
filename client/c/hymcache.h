/* HyMCache C API: the client SDK (client/client.h) for C, and for any
 * language that loads C libraries (libhymcache.so.1, pkg-config hymcache).
 *
 * A serving engine stores KV-cache blocks under prefix-chained keys and
 * loads the leading run of them back into its own buffers:
 *
 *   hymcache_client_options o;
 *   hymcache_client_options_init(&o);
 *   const char* masters[] = {"10.0.0.1:50051"};
 *   o.master_addresses = masters;
 *   o.num_master_addresses = 1;
 *   hymcache_client* c;
 *   if (hymcache_client_create(&o, &c) != HYMCACHE_OK)
 *     fprintf(stderr, "%s\n", hymcache_last_error());
 *   ...  hymcache_load(c, keys, buffers, n, HYMCACHE_TIMEOUT_DEFAULT, 0,
 *                      lengths, &result);   (blocks [0, result.loaded))
 *   ...  hymcache_store(c, new_keys, new_buffers, m, &parent,
 *                       HYMCACHE_TIMEOUT_DEFAULT, &store);
 *   hymcache_client_destroy(c);
 *
 * Errors. Every call that can fail returns a hymcache_code (the canonical
 * codes of absl::StatusCode, same numbers). The message of the last failing
 * call on the calling thread is hymcache_last_error(): a thread-local
 * string, valid until the next hymcache_* call on that thread. A call that
 * returns HYMCACHE_OK leaves "" there, except hymcache_load, which leaves
 * the reason it stopped early (hymcache_load_result.stop_code). The calls
 * that cannot fail (destroy/free, the *_init helpers, hymcache_last_error,
 * hymcache_code_name, hymcache_version) return void or a string.
 * Every call returns HYMCACHE_INVALID_ARGUMENT for a NULL pointer where one
 * is required, and HYMCACHE_RESOURCE_EXHAUSTED if memory runs out.
 *
 * Timeouts. Calls take `timeout_ms`, relative to the call: >= 0 bounds the
 * call (0: already expired), HYMCACHE_TIMEOUT_DEFAULT uses the client's
 * default (hymcache_client_options.default_timeout_ms; for stores,
 * default_store_timeout_ms). When a load's timeout passes it returns the
 * blocks it has; nothing writes into the caller's buffers after it returns.
 *
 * Ownership. Handles (hymcache_client, hymcache_key_builder,
 * hymcache_store_handle) are created by the library and freed by the matching
 * destroy/free call. Strings and arrays passed in are copied or used only
 * during the call, except store buffers (see hymcache_store). Returned strings
 * belong to the library.
 *
 * Thread safety. A hymcache_client and a hymcache_key_builder are safe for
 * concurrent use from many threads. A hymcache_store_handle may be polled and
 * waited on from many threads, but freed only once, when no other thread
 * uses it. Destroying a handle while another thread uses it is undefined.
 *
 * Versioning. The options structs start with `struct_size`: set it (the
 * *_init helpers do) to sizeof the struct your header declares. A library
 * reads only the fields within struct_size (later fields take their
 * defaults), so programs built against an older header keep working; fields
 * past what the library knows must be zero (HYMCACHE_UNIMPLEMENTED
 * otherwise).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Canonical error codes (absl::StatusCode, the same numbers). */
typedef enum hymcache_code {
  HYMCACHE_OK = 0,
  HYMCACHE_CANCELLED = 1,
  HYMCACHE_UNKNOWN = 2,
  HYMCACHE_INVALID_ARGUMENT = 3,
  HYMCACHE_DEADLINE_EXCEEDED = 4,
  HYMCACHE_NOT_FOUND = 5,
  HYMCACHE_ALREADY_EXISTS = 6,
  HYMCACHE_PERMISSION_DENIED = 7,
  HYMCACHE_RESOURCE_EXHAUSTED = 8,
  HYMCACHE_FAILED_PRECONDITION = 9,
  HYMCACHE_ABORTED = 10,
  HYMCACHE_OUT_OF_RANGE = 11,
  HYMCACHE_UNIMPLEMENTED = 12,
  HYMCACHE_INTERNAL = 13,
  HYMCACHE_UNAVAILABLE = 14,
  HYMCACHE_DATA_LOSS = 15,
  HYMCACHE_UNAUTHENTICATED = 16,
  /* Not a code: keeps the enum 32 bits wide, so that any int a caller
   * passes is a valid value of it (C and C++ agree on its size). */
  HYMCACHE_CODE_INT32_ = 0x7FFFFFFF
} hymcache_code;

/* The message of the last call on this thread that failed (or of the reason
 * a load stopped early); "" after a call that succeeded. Never NULL. Valid
 * until the next hymcache_* call on this thread. */
const char* hymcache_last_error(void);

/* "OK", "NOT_FOUND", ... ("UNKNOWN_CODE" for a number outside the enum).
 * A static string. */
const char* hymcache_code_name(hymcache_code code);

/* The library's release version, e.g. "0.1.0". A static string. */
const char* hymcache_version(void);

/* A timeout_ms meaning "the client's default". */
#define HYMCACHE_TIMEOUT_DEFAULT (-1)

/* ------------------------------------------------------------------------ */
/* Client                                                                   */

/* How block bytes move between this process and the storage nodes. */
typedef enum hymcache_transport {
  /* Length-prefixed framing over TCP (works everywhere). The default. */
  HYMCACHE_TRANSPORT_TCP = 0,
  /* Same-host shared memory: node memory is mapped into this process. */
  HYMCACHE_TRANSPORT_SHM = 1,
  /* One-sided RDMA READ/WRITE (rdma-core); creating the client fails with
   * HYMCACHE_UNAVAILABLE on a host without an RDMA device. */
  HYMCACHE_TRANSPORT_RDMA = 2,
  /* Per node: shared memory on this host, else RDMA, else TCP. */
  HYMCACHE_TRANSPORT_AUTO = 3,
  HYMCACHE_TRANSPORT_INT32_ = 0x7FFFFFFF /* not a transport (32-bit enum) */
} hymcache_transport;

/* Options of hymcache_client_create. Zero (or NULL) in any field but the
 * master addresses means its default. */
typedef struct hymcache_client_options {
  /* sizeof(hymcache_client_options); set by hymcache_client_options_init. */
  size_t struct_size;
  /* The masters' gRPC addresses, "host:port" each. Required: at least one,
   * unless etcd_endpoints is set (then optional: tried first).
   * With several (one leads, the others stand by: docs/ha.md) every call
   * goes to the leader, and a call a standby refuses, or that no master
   * answers, is sent again to the leader within its timeout. */
  const char* const* master_addresses;
  size_t num_master_addresses;
  /* Data plane. Default: HYMCACHE_TRANSPORT_TCP. */
  hymcache_transport transport;
  /* Timeout of a call given HYMCACHE_TIMEOUT_DEFAULT. Default: 10000. */
  int64_t default_timeout_ms;
  /* Timeout of a store given HYMCACHE_TIMEOUT_DEFAULT: how long its buffers
   * stay in use at most. Default: 2000. */
  int64_t default_store_timeout_ms;
  /* Bearer token presented to the master (docs/security.md). Default: none. */
  const char* auth_token;
  /* TLS towards the master: CA file (PEM; enables TLS), client certificate
   * and key for mutual TLS, and the name the master's certificate carries
   * when it is not the address's host. Default: plaintext. */
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_server_name;
  /* RDMA device name. Default: the first device. */
  const char* rdma_device;
  /* Threads that run stores ("hym-store"). Default: 2. */
  int32_t store_threads;
  /* Stores queued or running at once; a store beyond this completes at once
   * with HYMCACHE_RESOURCE_EXHAUSTED. Default: 64. */
  int32_t max_pending_stores;
  /* Connections to the master, 1..64, each opened when first used: the
   * process's lookup threads are spread over them (thread i on connection
   * i mod this), so that with the "poll" strategy each of up to this many
   * threads looking up at once completes its own lookups
   * (docs/performance.md). Default: 8. */
  int32_t master_connections;
  /* gRPC's poll strategy for this process: "auto" ("poll" unless gRPC
   * already runs in the process or GRPC_POLL_STRATEGY names one), "" (gRPC's
   * choice), "epoll1" or "poll" (set before gRPC starts in the process;
   * hymcache_client_create fails with HYMCACHE_FAILED_PRECONDITION if gRPC
   * already runs with another). Default (NULL): "auto". */
  const char* grpc_poll_strategy;
  /* Instead of (or besides) master_addresses: the etcd cluster the masters
   * campaign on (docs/ha.md), its client endpoints "host:port"
   * comma-separated. The client reads who leads `cluster` from etcd when it
   * is created (failing with HYMCACHE_UNAVAILABLE or
   * HYMCACHE_DEADLINE_EXCEEDED if etcd does not answer within
   * default_timeout_ms), then watches it: a call the old leader refuses or
   * does not answer goes to the new one within its timeout. Default
   * (NULL): no etcd. */
  const char* etcd_endpoints;
  /* With etcd_endpoints: the cluster's name, as the masters' --cluster.
   * Default (NULL): "default". */
  const char* cluster;
  /* Where recent loads found their keys: a load of keys this client found
   * within location_cache_ttl_ms reads from the nodes without asking the
   * master (a node refuses a location that went stale, and the load looks
   * its keys up again; docs/consistency.md). Entries held at most; a
   * negative value turns the cache off. Default (0): 16384. */
  int32_t location_cache_entries;
  /* How long an entry is used, 1..60000 ms. Default (0): 1000. */
  int64_t location_cache_ttl_ms;
} hymcache_client_options;

/* Zeroes *options (every field its default) and sets struct_size. */
void hymcache_client_options_init(hymcache_client_options* options);

typedef struct hymcache_client hymcache_client;

/* Creates a client and stores it in *client (freed by
 * hymcache_client_destroy). Connects lazily: succeeds while the master is
 * down; calls then fail with HYMCACHE_UNAVAILABLE until it is up.
 * Errors: INVALID_ARGUMENT (bad options: the message names the field),
 * UNIMPLEMENTED (unknown option fields),
 * UNAVAILABLE (RDMA requested without a device), FAILED_PRECONDITION
 * (grpc_poll_strategy cannot take effect), and the read error of a TLS
 * file that cannot be read. */
hymcache_code hymcache_client_create(const hymcache_client_options* options,
                                     hymcache_client** client);

/* Waits for the client's stores in flight (each bounded by its timeout),
 * then frees it. Store handles stay valid (and done) after it. NULL: no-op. */
void hymcache_client_destroy(hymcache_client* client);

/* Keys are byte strings (block keys are HYMCACHE_BLOCK_KEY_SIZE bytes). */
typedef struct hymcache_key {
  const void* data;
  size_t size;
} hymcache_key;

/* Caller-owned memory a load writes into. */
typedef struct hymcache_buffer {
  void* data;
  size_t size;
} hymcache_buffer;

/* Caller-owned memory a store reads from. */
typedef struct hymcache_const_buffer {
  const void* data;
  size_t size;
} hymcache_const_buffer;

/* Looks up keys[0, num_keys) in order. found (optional, num_keys entries):
 * 1 where the key is stored on a live node, else 0. hit_prefix (optional):
 * the number of leading keys found.
 * Errors: INVALID_ARGUMENT (no keys, an empty or oversized key),
 * UNAVAILABLE (master unreachable), DEADLINE_EXCEEDED. */
hymcache_code hymcache_lookup(hymcache_client* client, const hymcache_key* keys,
                              size_t num_keys, int64_t timeout_ms,
                              uint8_t* found, size_t* hit_prefix);

/* hymcache_load flags. */
/* Plain reads: no prefetch hints to the nodes, and each lookup round trip
 * carries up to 1024 keys (the C++ SDK's Get). */
#define HYMCACHE_LOAD_NO_PREFETCH 1u

typedef struct hymcache_load_result {
  /* Blocks [0, loaded) are in the caller's buffers, complete. */
  size_t loaded;
  /* Leading keys the master reported stored (>= loaded). */
  size_t hit_prefix;
  /* Bytes loaded (sum of the loaded blocks' lengths). */
  uint64_t bytes;
  /* Why loading stopped before the last key (message in
   * hymcache_last_error()): NOT_FOUND (a miss), DEADLINE_EXCEEDED,
   * UNAVAILABLE (node unreachable), OUT_OF_RANGE (a buffer too small for
   * its block). HYMCACHE_OK when every block was loaded. */
  hymcache_code stop_code;
} hymcache_load_result;

/* A request's read path: looks keys[0, num_keys) up, tells the nodes the
 * order of their blocks so that they stage them ahead (unless
 * HYMCACHE_LOAD_NO_PREFETCH), and reads the leading run of stored blocks
 * into buffers[i] (one per key). lengths (optional, num_keys entries):
 * the byte length of each loaded block, written for [0, loaded). On the
 * timeout it returns what it has; nothing writes into `buffers` after it
 * returns. `result` is required.
 * Errors (whole call; a short load is HYMCACHE_OK with stop_code set):
 * INVALID_ARGUMENT (no keys, NULL arrays, unknown flags), UNAVAILABLE or
 * DEADLINE_EXCEEDED from the master before anything was loaded. */
hymcache_code hymcache_load(hymcache_client* client, const hymcache_key* keys,
                            const hymcache_buffer* buffers, size_t num_keys,
                            int64_t timeout_ms, uint32_t flags,
                            uint64_t* lengths, hymcache_load_result* result);

typedef struct hymcache_store_handle hymcache_store_handle;

/* Stores a request's new blocks in the background and returns at once with
 * a handle in *store (freed by hymcache_store_free). Opportunistic: a write
 * a node refuses (no room) is skipped and reported, never retried. keys are
 * one chain in order; parent_key (optional) is the key of the block before
 * keys[0] (the last block of the prefix the engine loaded), so that the new
 * blocks go to its node. Keys are copied; the buffers' memory must stay
 * valid and unchanged until the store is done (hymcache_store_poll, or
 * hymcache_store_wait returning anything but DEADLINE_EXCEEDED, or
 * hymcache_store_free). timeout_ms bounds the whole store.
 * Errors at the call: INVALID_ARGUMENT (NULL arrays). Everything else
 * (empty buffers, no keys, master unreachable, the queue full) is reported
 * by hymcache_store_wait. */
hymcache_code hymcache_store(hymcache_client* client, const hymcache_key* keys,
                             const hymcache_const_buffer* buffers,
                             size_t num_keys, const hymcache_key* parent_key,
                             int64_t timeout_ms, hymcache_store_handle** store);

/* Per key outcome of a store. */
typedef enum hymcache_store_outcome {
  HYMCACHE_STORE_STORED = 0,         /* written and committed by this store */
  HYMCACHE_STORE_ALREADY_STORED = 1, /* already stored: nothing written */
  HYMCACHE_STORE_IN_PROGRESS = 2,    /* another writer is storing it */
  HYMCACHE_STORE_FAILED = 3,         /* not stored (refused, timeout, ...) */
  HYMCACHE_STORE_OUTCOME_INT32_ = 0x7FFFFFFF /* not an outcome */
} hymcache_store_outcome;

typedef struct hymcache_store_result {
  size_t stored;
  size_t skipped; /* ALREADY_STORED + IN_PROGRESS */
  size_t failed;
  /* Of `failed`, keys refused for lack of room (no node had space). */
  size_t refused;
  /* The node the (last chunk of) stored blocks went to; 0 if none. */
  uint32_t node_id;
} hymcache_store_result;

/* *done = 1 when the store has finished (its buffers are free), else 0. */
hymcache_code hymcache_store_poll(const hymcache_store_handle* store,
                                  int* done);

/* Waits up to timeout_ms (0: just checks; HYMCACHE_TIMEOUT_DEFAULT: until
 * the store finishes, which its own timeout bounds) and reports the
 * result: counts in *result (optional) and, in outcomes (optional,
 * num_keys entries of hymcache_store_outcome), each key's outcome. The
 * first per-key failure's message is in hymcache_last_error().
 * Errors: DEADLINE_EXCEEDED (still running; the store goes on), or the
 * store's whole-call error: INVALID_ARGUMENT (no keys, an empty buffer or
 * key), UNAVAILABLE or DEADLINE_EXCEEDED (master), RESOURCE_EXHAUSTED (the
 * client's store queue was full: nothing stored). Running out of room is
 * not an error: those keys are FAILED and counted in `refused`. */
hymcache_code hymcache_store_wait(hymcache_store_handle* store,
                                  int64_t timeout_ms,
                                  hymcache_store_result* result,
                                  uint8_t* outcomes);

/* Waits for the store to finish (so its buffers are free when this returns;
 * bounded by the store's timeout) and frees the handle. NULL: no-op. */
void hymcache_store_free(hymcache_store_handle* store);

/* Removes keys. removed (optional, num_keys entries): 1 where the key was
 * stored. The blocks after a removed one in its chain go too.
 * Errors: INVALID_ARGUMENT, UNAVAILABLE, DEADLINE_EXCEEDED. */
hymcache_code hymcache_remove(hymcache_client* client, const hymcache_key* keys,
                              size_t num_keys, int64_t timeout_ms,
                              uint8_t* removed);

/* Think-time hints (docs/prefetch.md). Advice only: each returns at once
 * and its work runs in the background; it never fails or delays a load or
 * store.
 * hymcache_hint_next_turn: keys are a conversation's chain, in order, just
 * answered; its next turn is expected in about expected_in_ms (0: unknown)
 * and the nodes hold the staged blocks hold_ms past that (0: the default,
 * 60 s). Hybrid nodes stage the chain while idle, so the turn loads it from
 * DRAM.
 * hymcache_hint_conversation_ended: the conversation will not come back.
 * Errors: INVALID_ARGUMENT (no keys, an empty or oversized key, a negative
 * time), RESOURCE_EXHAUSTED (the client's hints in flight are at their
 * limit: this one is dropped). */
hymcache_code hymcache_hint_next_turn(hymcache_client* client,
                                      const hymcache_key* keys, size_t num_keys,
                                      int64_t expected_in_ms, int64_t hold_ms);
hymcache_code hymcache_hint_conversation_ended(hymcache_client* client,
                                               const hymcache_key* keys,
                                               size_t num_keys);

/* Registers engine-owned memory [data, data + size) (e.g. a KV pool) for
 * direct transfers: RDMA reads land in it and writes leave from it without a
 * copy through the transport's bounce buffer. It stays pinned and must stay
 * mapped until hymcache_unregister_memory(data). Accepted and a no-op on the
 * TCP and shared-memory planes (their copies need no registration).
 * Errors: INVALID_ARGUMENT (NULL, empty, overlapping a registration),
 * RESOURCE_EXHAUSTED (the locked-memory limit). */
hymcache_code hymcache_register_memory(hymcache_client* client, void* data,
                                       size_t size);

/* Errors: NOT_FOUND if `data` does not start a registration. */
hymcache_code hymcache_unregister_memory(hymcache_client* client, void* data);

typedef struct hymcache_cluster_stats {
  /* sizeof(hymcache_cluster_stats), set by the caller: the library fills
   * the fields within it. */
  size_t struct_size;
  uint32_t nodes;       /* storage nodes the master knows */
  uint32_t alive_nodes; /* of them, alive and serving */
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  uint64_t object_count;
  uint64_t object_bytes;
  /* Objects the master evicted to make room, since it started. */
  uint64_t evicted_objects;
  uint64_t evicted_bytes;
  /* Fields added later are appended below (a caller's struct_size says
   * which it has). The master's other cluster stats, by their names in
   * GetStats: puts started and not committed; its node records alive and
   * not (alive_nodes and nodes above count the same records); heap bytes of
   * its index per entry; and since it started: node reconciliations, the
   * listings they removed, the unlisted extents they handed back to nodes,
   * and listings dropped by read repair. */
  uint64_t pending_puts;
  uint64_t nodes_alive;
  uint64_t nodes_dead;
  uint64_t index_bytes_per_entry;
  uint64_t reconciliations;
  uint64_t reconcile_dropped_listings;
  uint64_t reconcile_unlisted_extents;
  uint64_t read_repairs;
} hymcache_cluster_stats;

/* The cluster's nodes and objects, from the master. `stats->struct_size`
 * must be set. Errors: INVALID_ARGUMENT (struct_size too small),
 * UNAVAILABLE, DEADLINE_EXCEEDED. */
hymcache_code hymcache_cluster_stats_get(hymcache_client* client,
                                         int64_t timeout_ms,
                                         hymcache_cluster_stats* stats);

/* ------------------------------------------------------------------------ */
/* Routers and engines' own caches (docs/deployment.md, "KV events")        */

/* One storage node's part of a prefix: the leading keys all on it, and how
 * many keys of the hit prefix it holds. */
typedef struct hymcache_node_prefix {
  uint32_t node_id;
  uint32_t longest_prefix;
  uint32_t blocks;
} hymcache_node_prefix;

/* Longest engine id (hymcache_report_engine_blocks), in bytes. */
#define HYMCACHE_MAX_ENGINE_ID 128

/* One engine's part: the leading keys its own cache holds. */
typedef struct hymcache_engine_prefix {
  char engine_id[HYMCACHE_MAX_ENGINE_ID + 1]; /* NUL-terminated */
  uint32_t longest_prefix;
} hymcache_engine_prefix;

typedef struct hymcache_prefix_answer {
  /* sizeof(hymcache_prefix_answer), set by the caller. */
  size_t struct_size;
  /* Leading keys stored on alive nodes (what a load would read). */
  uint32_t hit_prefix_length;
  /* Caller's arrays (NULL with capacity 0: not wanted). The library writes
   * at most *_capacity entries and sets num_* to how many there are (which
   * may be more). Nodes by node_id; engines longest prefix first. */
  hymcache_node_prefix* nodes;
  size_t nodes_capacity;
  size_t num_nodes;
  hymcache_engine_prefix* engines;
  size_t engines_capacity;
  size_t num_engines;
} hymcache_prefix_answer;

/* For routers: how much of the chain keys[0..num_keys) (keys[i+1] extends
 * keys[i]; at most the client's max_keys_per_rpc) is cached, per storage
 * node and per engine that reports its own cache (engines of this client's
 * tenant). `answer->struct_size` must be set.
 * Errors: INVALID_ARGUMENT (no keys, too many, an empty or oversized key,
 * struct_size too small), UNAVAILABLE, DEADLINE_EXCEEDED. */
hymcache_code hymcache_prefix_query(hymcache_client* client,
                                    const hymcache_key* keys, size_t num_keys,
                                    int64_t timeout_ms,
                                    hymcache_prefix_answer* answer);

/* For an engine's reporter: what engine_id's own cache (its GPU's prefix
 * cache) gained and lost since its last report, applied in this order:
 * every key dropped (cleared != 0), then `removed`, then `stored` (sent in
 * several calls when long). engine_id: 1..HYMCACHE_MAX_ENGINE_ID bytes,
 * unique within the tenant. Report at least every *ttl_ms_out, or the
 * master forgets the engine; a report with no keys keeps it known. When
 * *blocks_out (the keys the master now holds for it; optional) differs
 * from the reporter's own count, resend the whole set (cleared, every
 * key). Errors: INVALID_ARGUMENT (a bad id or key), RESOURCE_EXHAUSTED
 * (reason engines_full: the master keeps as many engines as it may),
 * FAILED_PRECONDITION (engine_reports_off), UNAVAILABLE,
 * DEADLINE_EXCEEDED. */
hymcache_code hymcache_report_engine_blocks(
    hymcache_client* client, const char* engine_id, int cleared,
    const hymcache_key* removed, size_t num_removed, const hymcache_key* stored,
    size_t num_stored, int64_t timeout_ms, uint64_t* blocks_out,
    int64_t* ttl_ms_out);

/* ------------------------------------------------------------------------ */
/* Block keys                                                               */

/* Bytes of a block key. */
#define HYMCACHE_BLOCK_KEY_SIZE 32

/* Everything that makes KV bytes differ; two namespaces never share a key.
 * NULL strings are "". */
typedef struct hymcache_key_namespace {
  /* sizeof(hymcache_key_namespace); set by hymcache_key_namespace_init. */
  size_t struct_size;
  /* Model name and revision, e.g. "meta-llama/Llama-3.1-8B@5206a32". */
  const char* model;
  /* KV element type, e.g. "bf16". */
  const char* dtype;
  /* Block layout, e.g. "NHD/layers=32/heads=8/dim=128". */
  const char* layout;
  /* Tensor-parallel rank and size: 0 <= tp_rank < tp_size. */
  int32_t tp_rank;
  int32_t tp_size;
  /* Anything else that must separate caches (tenant, adapter, salt). */
  const char* salt;
} hymcache_key_namespace;

/* Zeroes *ns, sets struct_size and tp_size = 1 (the C++ KeyNamespace's
 * defaults). */
void hymcache_key_namespace_init(hymcache_key_namespace* ns);

typedef struct hymcache_key_builder hymcache_key_builder;

/* A builder of prefix-chained block keys of `block_tokens` tokens each,
 * identical to the C++ BlockKeyBuilder(ns, block_tokens) (client/
 * block_key.h). Errors: INVALID_ARGUMENT (block_tokens 0, tp_rank/tp_size
 * out of range, struct_size too small). */
hymcache_code hymcache_key_builder_create(const hymcache_key_namespace* ns,
                                          size_t block_tokens,
                                          hymcache_key_builder** builder);

/* NULL: no-op. */
void hymcache_key_builder_destroy(hymcache_key_builder* builder);

/* The keys of every FULL block of tokens[0, num_tokens) (a trailing partial
 * block gets none), HYMCACHE_BLOCK_KEY_SIZE bytes each, back to back in
 * keys_out, which holds room for keys_capacity keys; *num_keys = how many.
 * parent (optional, HYMCACHE_BLOCK_KEY_SIZE bytes) continues a chain: the
 * first key follows it, as BlockKeyBuilder::NextKey(parent, ...) does, so
 * that a conversation's next turn keys only its new tokens.
 * Errors: OUT_OF_RANGE (keys_capacity too small; *num_keys = the keys
 * needed, nothing written), INVALID_ARGUMENT (NULL tokens with
 * num_tokens > 0). */
hymcache_code hymcache_block_keys(const hymcache_key_builder* builder,
                                  const int32_t* tokens, size_t num_tokens,
                                  const uint8_t* parent, uint8_t* keys_out,
                                  size_t keys_capacity, size_t* num_keys);

#ifdef __cplusplus
} /* extern "C" */
#endif
