/* The C API from C (C11) against a real master and storage node:
 * tests/with_cluster.sh starts them on loopback and passes the master's
 * address. Round trips over TCP and shared memory, lookup, remove, stats,
 * stores (async handles), and the errors a C caller sees: bad arguments,
 * a dead master, buffers too small, deadlines.
 *
 *   c_api_test MASTER_ADDRESS
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <hymcache/hymcache.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;

#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: EXPECT(%s) failed (last error: '%s')\n", \
              __FILE__, __LINE__, #cond, hymcache_last_error());       \
      failures++;                                                      \
    }                                                                  \
  } while (0)

#define EXPECT_CODE(call, want)                                         \
  do {                                                                  \
    hymcache_code got_ = (call);                                        \
    if (got_ != (want)) {                                               \
      fprintf(stderr,                                                   \
              "%s:%d: %s\n  returned %s, want %s (last error: '%s')\n", \
              __FILE__, __LINE__, #call, hymcache_code_name(got_),      \
              hymcache_code_name(want), hymcache_last_error());         \
      failures++;                                                       \
    }                                                                   \
  } while (0)

#define REQUIRE_OK(call)                                                    \
  do {                                                                      \
    hymcache_code got_ = (call);                                            \
    if (got_ != HYMCACHE_OK) {                                              \
      fprintf(stderr, "%s:%d: %s\n  returned %s: %s\n", __FILE__, __LINE__, \
              #call, hymcache_code_name(got_), hymcache_last_error());      \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

enum { kBlocks = 8, kBlockTokens = 16, kMaxBlock = 80 * 1024 };

static double NowSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static hymcache_client* NewClient(const char* master, hymcache_transport t,
                                  int64_t default_timeout_ms) {
  hymcache_client_options o;
  hymcache_client_options_init(&o);
  const char* masters[1] = {master};
  o.master_addresses = masters;
  o.num_master_addresses = 1;
  o.transport = t;
  o.default_timeout_ms = default_timeout_ms;
  hymcache_client* c = NULL;
  REQUIRE_OK(hymcache_client_create(&o, &c));
  return c;
}

/* A loopback port nothing listens on (bound, then closed). */
static int ClosedPort(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("ClosedPort");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* A loopback listener that never accepts: connections hang in the backlog,
 * so a master call can only end by its deadline. Returns the fd. */
static int BlackHole(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 ||
      listen(fd, 16) != 0 || getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("BlackHole");
    exit(1);
  }
  *port = ntohs(a.sin_port);
  return fd;
}

/* The test's blocks: keys from a key builder, sizes that differ. */
typedef struct Blocks {
  uint8_t key_bytes[kBlocks + 2][HYMCACHE_BLOCK_KEY_SIZE];
  hymcache_key keys[kBlocks + 2];
  uint8_t* data[kBlocks + 2];
  size_t size[kBlocks + 2];
  hymcache_const_buffer in[kBlocks + 2];
} Blocks;

static void MakeBlocks(const char* model, Blocks* b) {
  hymcache_key_namespace ns;
  hymcache_key_namespace_init(&ns);
  ns.model = model;
  ns.dtype = "bf16";
  ns.layout = "c-test";
  hymcache_key_builder* kb = NULL;
  REQUIRE_OK(hymcache_key_builder_create(&ns, kBlockTokens, &kb));
  int32_t tokens[(kBlocks + 2) * kBlockTokens];
  for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); ++i) {
    tokens[i] = (int32_t)(i * 7 + 1);
  }
  size_t n = 0;
  /* The first kBlocks keys, then 2 more continuing the chain. */
  REQUIRE_OK(hymcache_block_keys(kb, tokens, kBlocks * kBlockTokens, NULL,
                                 &b->key_bytes[0][0], kBlocks, &n));
  EXPECT(n == kBlocks);
  REQUIRE_OK(hymcache_block_keys(
      kb, tokens + kBlocks * kBlockTokens, 2 * kBlockTokens + 3,
      b->key_bytes[kBlocks - 1], &b->key_bytes[kBlocks][0], 2, &n));
  EXPECT(n == 2);
  hymcache_key_builder_destroy(kb);
  for (int i = 0; i < kBlocks + 2; ++i) {
    b->keys[i].data = b->key_bytes[i];
    b->keys[i].size = HYMCACHE_BLOCK_KEY_SIZE;
    b->size[i] = 16 * 1024 + (size_t)i * 7919;
    b->data[i] = malloc(b->size[i]);
    for (size_t j = 0; j < b->size[i]; ++j) {
      b->data[i][j] = (uint8_t)(j * 31 + (size_t)i * 101 + (size_t)model[0]);
    }
    b->in[i].data = b->data[i];
    b->in[i].size = b->size[i];
  }
}

static void FreeBlocks(Blocks* b) {
  for (int i = 0; i < kBlocks + 2; ++i) free(b->data[i]);
}

/* Loads blocks [0, n) into exact-size heap buffers (ASan sees any write
 * past them) and checks the loaded prefix byte for byte. Returns loaded. */
static size_t LoadAndVerify(hymcache_client* c, const Blocks* b, size_t n,
                            uint32_t flags, hymcache_code want_stop) {
  hymcache_buffer out[kBlocks + 2];
  uint64_t lengths[kBlocks + 2];
  for (size_t i = 0; i < n; ++i) {
    out[i].size = b->size[i];
    out[i].data = malloc(out[i].size);
    memset(out[i].data, 0xEE, out[i].size);
  }
  hymcache_load_result r;
  REQUIRE_OK(hymcache_load(c, b->keys, out, n, HYMCACHE_TIMEOUT_DEFAULT, flags,
                           lengths, &r));
  EXPECT(r.stop_code == want_stop);
  EXPECT((want_stop == HYMCACHE_OK) == (hymcache_last_error()[0] == '\0'));
  uint64_t bytes = 0;
  for (size_t i = 0; i < r.loaded; ++i) {
    EXPECT(lengths[i] == b->size[i]);
    EXPECT(memcmp(out[i].data, b->data[i], b->size[i]) == 0);
    bytes += lengths[i];
  }
  EXPECT(r.bytes == bytes);
  EXPECT(r.hit_prefix >= r.loaded);
  for (size_t i = 0; i < n; ++i) free(out[i].data);
  return r.loaded;
}

static void WaitForNode(hymcache_client* c) {
  double deadline = NowSeconds() + 30;
  hymcache_cluster_stats st;
  for (;;) {
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    if (hymcache_cluster_stats_get(c, 2000, &st) == HYMCACHE_OK &&
        st.alive_nodes >= 1) {
      return;
    }
    if (NowSeconds() > deadline) {
      fprintf(stderr, "no live storage node after 30 s: %s\n",
              hymcache_last_error());
      exit(1);
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Store, lookup, load, partial loads, skip, chain continuation, remove. */
static void RoundTrip(const char* master, hymcache_transport t,
                      const char* model) {
  fprintf(stderr, "-- round trip (%s)\n", model);
  hymcache_client* c = NewClient(master, t, 0);
  Blocks b;
  MakeBlocks(model, &b);

  uint8_t found[kBlocks + 2];
  size_t hit = 99;
  REQUIRE_OK(hymcache_lookup(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT,
                             found, &hit));
  EXPECT(hit == 0);
  EXPECT(found[0] == 0 && found[kBlocks - 1] == 0);

  /* Nothing stored: a load stops at once with NOT_FOUND. */
  EXPECT(LoadAndVerify(c, &b, kBlocks, 0, HYMCACHE_NOT_FOUND) == 0);

  hymcache_store_handle* s = NULL;
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, kBlocks, NULL,
                            HYMCACHE_TIMEOUT_DEFAULT, &s));
  hymcache_store_result sr;
  uint8_t outcomes[kBlocks + 2];
  memset(outcomes, 0xFF, sizeof(outcomes));
  REQUIRE_OK(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, &sr, outcomes));
  EXPECT(sr.stored == kBlocks && sr.failed == 0 && sr.skipped == 0);
  EXPECT(sr.node_id != 0);
  for (int i = 0; i < kBlocks; ++i)
    EXPECT(outcomes[i] == HYMCACHE_STORE_STORED);
  int done = 0;
  REQUIRE_OK(hymcache_store_poll(s, &done));
  EXPECT(done == 1);
  /* Waiting again reports the same result. */
  hymcache_store_result again;
  REQUIRE_OK(hymcache_store_wait(s, 0, &again, NULL));
  EXPECT(again.stored == kBlocks);
  hymcache_store_free(s);

  REQUIRE_OK(hymcache_lookup(c, b.keys, kBlocks, 5000, found, &hit));
  EXPECT(hit == kBlocks);
  for (int i = 0; i < kBlocks; ++i) EXPECT(found[i] == 1);

  EXPECT(LoadAndVerify(c, &b, kBlocks, 0, HYMCACHE_OK) == kBlocks);
  EXPECT(LoadAndVerify(c, &b, kBlocks, HYMCACHE_LOAD_NO_PREFETCH,
                       HYMCACHE_OK) == kBlocks);
  /* One key past the stored ones: the leading run, then NOT_FOUND. */
  EXPECT(LoadAndVerify(c, &b, kBlocks + 1, 0, HYMCACHE_NOT_FOUND) == kBlocks);

  /* A buffer too small for its block: the blocks before it, OUT_OF_RANGE,
   * and nothing written past any buffer. */
  {
    hymcache_buffer out[kBlocks];
    for (int i = 0; i < kBlocks; ++i) {
      out[i].size = b.size[i] - (i == 3 ? 1 : 0);
      out[i].data = malloc(out[i].size);
    }
    hymcache_load_result r;
    REQUIRE_OK(hymcache_load(c, b.keys, out, kBlocks, HYMCACHE_TIMEOUT_DEFAULT,
                             0, NULL, &r));
    EXPECT(r.loaded == 3);
    EXPECT(r.stop_code == HYMCACHE_OUT_OF_RANGE);
    EXPECT(strlen(hymcache_last_error()) > 0);
    EXPECT(memcmp(out[2].data, b.data[2], b.size[2]) == 0);
    for (int i = 0; i < kBlocks; ++i) free(out[i].data);
  }

  /* Storing the same keys again skips them. */
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, kBlocks, NULL, 5000, &s));
  REQUIRE_OK(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, &sr, outcomes));
  EXPECT(sr.stored == 0 && sr.skipped == kBlocks);
  EXPECT(outcomes[0] == HYMCACHE_STORE_ALREADY_STORED);
  hymcache_store_free(s);

  /* The next turn's blocks, after their parent (the last loaded block). */
  REQUIRE_OK(hymcache_store(c, b.keys + kBlocks, b.in + kBlocks, 2,
                            &b.keys[kBlocks - 1], HYMCACHE_TIMEOUT_DEFAULT,
                            &s));
  REQUIRE_OK(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, &sr, NULL));
  EXPECT(sr.stored == 2);
  hymcache_store_free(s);
  EXPECT(LoadAndVerify(c, &b, kBlocks + 2, 0, HYMCACHE_OK) == kBlocks + 2);

  /* Remove block 5: the chain's reusable prefix is 5 blocks. */
  uint8_t removed[1] = {0};
  REQUIRE_OK(
      hymcache_remove(c, &b.keys[5], 1, HYMCACHE_TIMEOUT_DEFAULT, removed));
  EXPECT(removed[0] == 1);
  REQUIRE_OK(hymcache_lookup(c, b.keys, kBlocks + 2, HYMCACHE_TIMEOUT_DEFAULT,
                             found, &hit));
  EXPECT(hit == 5);
  EXPECT(found[5] == 0);
  EXPECT(LoadAndVerify(c, &b, kBlocks + 2, 0, HYMCACHE_NOT_FOUND) == 5);

  /* Registration: accepted (a no-op on TCP and shm), and checked. */
  void* pool = malloc(1 << 20);
  REQUIRE_OK(hymcache_register_memory(c, pool, 1 << 20));
  REQUIRE_OK(hymcache_unregister_memory(c, pool));
  EXPECT_CODE(hymcache_register_memory(c, NULL, 10), HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_register_memory(c, pool, 0), HYMCACHE_INVALID_ARGUMENT);
  free(pool);

  hymcache_cluster_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  REQUIRE_OK(hymcache_cluster_stats_get(c, HYMCACHE_TIMEOUT_DEFAULT, &st));
  EXPECT(st.alive_nodes >= 1 && st.nodes >= st.alive_nodes);
  EXPECT(st.object_count >= 5);
  EXPECT(st.capacity_bytes > 0 && st.used_bytes > 0);
  /* The fields appended later are filled too. */
  EXPECT(st.nodes_alive == st.alive_nodes);
  EXPECT(st.nodes_alive + st.nodes_dead == st.nodes);
  EXPECT(st.index_bytes_per_entry > 0);

  /* An engine's own cache, reported and answered beside the node's part
   * of the prefix (blocks 0..4 stored after the removal above). */
  char engine[64];
  snprintf(engine, sizeof(engine), "c-engine-%s", model);
  uint64_t held = 0;
  int64_t ttl_ms = 0;
  REQUIRE_OK(hymcache_report_engine_blocks(c, engine, 1, NULL, 0, b.keys, 3,
                                           HYMCACHE_TIMEOUT_DEFAULT, &held,
                                           &ttl_ms));
  EXPECT(held == 3 && ttl_ms > 0);
  REQUIRE_OK(hymcache_report_engine_blocks(c, engine, 0, &b.keys[2], 1, NULL, 0,
                                           HYMCACHE_TIMEOUT_DEFAULT, &held,
                                           NULL));
  EXPECT(held == 2);
  hymcache_node_prefix nodes[4];
  hymcache_engine_prefix engines[4];
  hymcache_prefix_answer pa;
  memset(&pa, 0, sizeof(pa));
  pa.struct_size = sizeof(pa);
  pa.nodes = nodes;
  pa.nodes_capacity = 4;
  pa.engines = engines;
  pa.engines_capacity = 4;
  REQUIRE_OK(
      hymcache_prefix_query(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, &pa));
  EXPECT(pa.hit_prefix_length == 5);
  EXPECT(pa.num_nodes >= 1 && nodes[0].blocks >= 1);
  EXPECT(pa.num_engines == 1);
  EXPECT(strcmp(engines[0].engine_id, engine) == 0);
  EXPECT(engines[0].longest_prefix == 2);
  /* No room asked for: the counts alone. */
  pa.nodes_capacity = 0;
  pa.nodes = NULL;
  pa.engines_capacity = 0;
  pa.engines = NULL;
  REQUIRE_OK(
      hymcache_prefix_query(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, &pa));
  EXPECT(pa.num_engines == 1);
  EXPECT_CODE(
      hymcache_report_engine_blocks(c, "", 0, NULL, 0, NULL, 0,
                                    HYMCACHE_TIMEOUT_DEFAULT, NULL, NULL),
      HYMCACHE_INVALID_ARGUMENT);
  pa.struct_size = 8;
  EXPECT_CODE(
      hymcache_prefix_query(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, &pa),
      HYMCACHE_INVALID_ARGUMENT);

  hymcache_client_destroy(c);
  FreeBlocks(&b);
}

/* Bad arguments: INVALID_ARGUMENT with a message, nothing sent. */
static void BadArguments(const char* master) {
  fprintf(stderr, "-- bad arguments\n");
  hymcache_client* c = NewClient(master, HYMCACHE_TRANSPORT_TCP, 0);
  Blocks b;
  MakeBlocks("bad-args", &b);
  size_t hit = 0;
  hymcache_load_result r;
  hymcache_buffer out[1] = {{malloc(b.size[0]), b.size[0]}};

  EXPECT_CODE(hymcache_lookup(c, b.keys, 0, 1000, NULL, &hit),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT(strlen(hymcache_last_error()) > 0);
  EXPECT_CODE(hymcache_lookup(NULL, b.keys, 1, 1000, NULL, &hit),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_lookup(c, NULL, 1, 1000, NULL, &hit),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_lookup(c, b.keys, 1, -7, NULL, &hit),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT(strstr(hymcache_last_error(), "timeout_ms") != NULL);
  hymcache_key empty = {NULL, 0};
  EXPECT_CODE(hymcache_lookup(c, &empty, 1, 1000, NULL, &hit),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_load(c, b.keys, out, 1, 1000, 0, NULL, NULL),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_load(c, b.keys, NULL, 1, 1000, 0, NULL, &r),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_load(c, b.keys, out, 1, 1000, 0x80, NULL, &r),
              HYMCACHE_INVALID_ARGUMENT);
  hymcache_buffer null_data = {NULL, 100};
  EXPECT_CODE(hymcache_load(c, b.keys, &null_data, 1, 1000, 0, NULL, &r),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_load(c, b.keys, out, 0, 1000, 0, NULL, &r),
              HYMCACHE_INVALID_ARGUMENT);

  /* Store checks the call at once, the rest through the handle. */
  hymcache_store_handle* s = (hymcache_store_handle*)&hit;
  EXPECT_CODE(hymcache_store(c, b.keys, NULL, 1, NULL, 1000, &s),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT(s == NULL);
  hymcache_const_buffer zero = {b.data[0], 0};
  REQUIRE_OK(hymcache_store(c, b.keys, &zero, 1, NULL, 1000, &s));
  EXPECT_CODE(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, NULL, NULL),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT(strstr(hymcache_last_error(), "empty") != NULL);
  hymcache_store_free(s);
  EXPECT_CODE(hymcache_store_poll(NULL, NULL), HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_store_wait(NULL, 0, NULL, NULL),
              HYMCACHE_INVALID_ARGUMENT);
  hymcache_store_free(NULL);

  EXPECT_CODE(hymcache_remove(c, b.keys, 0, 1000, NULL),
              HYMCACHE_INVALID_ARGUMENT);

  /* Think-time hints: advice, accepted at once; bad ones refused. */
  REQUIRE_OK(hymcache_hint_next_turn(c, b.keys, 5, 3000, 0));
  REQUIRE_OK(hymcache_hint_conversation_ended(c, b.keys, 5));
  EXPECT_CODE(hymcache_hint_next_turn(c, b.keys, 0, 0, 0),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_hint_next_turn(c, b.keys, 5, -1, 0),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_hint_next_turn(NULL, b.keys, 5, 0, 0),
              HYMCACHE_INVALID_ARGUMENT);
  EXPECT_CODE(hymcache_hint_conversation_ended(c, NULL, 1),
              HYMCACHE_INVALID_ARGUMENT);
  hymcache_cluster_stats st;
  st.struct_size = 4;
  EXPECT_CODE(hymcache_cluster_stats_get(c, 1000, &st),
              HYMCACHE_INVALID_ARGUMENT);

  /* An older caller's shorter stats struct: only its fields are written. */
  struct {
    hymcache_cluster_stats s;
    uint64_t canary;
  } older;
  memset(&older, 0xAB, sizeof(older));
  older.s.struct_size = offsetof(hymcache_cluster_stats, capacity_bytes);
  REQUIRE_OK(hymcache_cluster_stats_get(c, HYMCACHE_TIMEOUT_DEFAULT, &older.s));
  EXPECT(older.s.alive_nodes >= 1);
  EXPECT(older.s.capacity_bytes == 0xABABABABABABABABull);

  free(out[0].data);
  hymcache_client_destroy(c);
  FreeBlocks(&b);
}

/* A master nobody listens for: UNAVAILABLE, quickly. */
static void DeadMaster(void) {
  fprintf(stderr, "-- dead master\n");
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ClosedPort());
  /* Create succeeds (connections are lazy). */
  hymcache_client* c = NewClient(addr, HYMCACHE_TRANSPORT_TCP, 5000);
  Blocks b;
  MakeBlocks("dead", &b);
  double t0 = NowSeconds();
  size_t hit = 0;
  EXPECT_CODE(
      hymcache_lookup(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, NULL, &hit),
      HYMCACHE_UNAVAILABLE);
  EXPECT(strlen(hymcache_last_error()) > 0);
  hymcache_buffer out[1] = {{malloc(b.size[0]), b.size[0]}};
  hymcache_load_result r;
  EXPECT_CODE(
      hymcache_load(c, b.keys, out, 1, HYMCACHE_TIMEOUT_DEFAULT, 0, NULL, &r),
      HYMCACHE_UNAVAILABLE);
  hymcache_store_handle* s = NULL;
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, 2, NULL, 3000, &s));
  EXPECT_CODE(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, NULL, NULL),
              HYMCACHE_UNAVAILABLE);
  hymcache_store_free(s);
  hymcache_cluster_stats st;
  st.struct_size = sizeof(st);
  EXPECT_CODE(hymcache_cluster_stats_get(c, HYMCACHE_TIMEOUT_DEFAULT, &st),
              HYMCACHE_UNAVAILABLE);
  /* Fails fast: well before the 5 s default timeout. */
  EXPECT(NowSeconds() - t0 < 4.5);
  free(out[0].data);
  hymcache_client_destroy(c);
  FreeBlocks(&b);
}

/* Several masters (docs/ha.md): the first one listed is down, calls go on
 * to the next; an empty address in the list is refused. */
static void SeveralMasters(const char* master) {
  fprintf(stderr, "-- several masters\n");
  char dead[64];
  snprintf(dead, sizeof(dead), "127.0.0.1:%d", ClosedPort());
  hymcache_client_options o;
  hymcache_client_options_init(&o);
  const char* masters[2] = {dead, master};
  o.master_addresses = masters;
  o.num_master_addresses = 2;
  o.default_timeout_ms = 5000;
  hymcache_client* c = NULL;
  REQUIRE_OK(hymcache_client_create(&o, &c));
  WaitForNode(c);
  Blocks b;
  MakeBlocks("several-masters", &b);
  hymcache_store_handle* s = NULL;
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, 2, NULL, 5000, &s));
  REQUIRE_OK(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, NULL, NULL));
  hymcache_store_free(s);
  size_t hit = 0;
  REQUIRE_OK(hymcache_lookup(c, b.keys, 2, HYMCACHE_TIMEOUT_DEFAULT, NULL, &hit));
  EXPECT(hit == 2);
  hymcache_client_destroy(c);
  FreeBlocks(&b);

  const char* bad[2] = {master, ""};
  o.master_addresses = bad;
  c = NULL;
  EXPECT_CODE(hymcache_client_create(&o, &c), HYMCACHE_INVALID_ARGUMENT);
  EXPECT(c == NULL);
}

/* Deadlines: an expired timeout against the live master, and a master that
 * never answers. */
static void Deadlines(const char* master) {
  fprintf(stderr, "-- deadlines\n");
  hymcache_client* live = NewClient(master, HYMCACHE_TRANSPORT_TCP, 0);
  Blocks b;
  MakeBlocks("deadline", &b);
  size_t hit = 0;
  EXPECT_CODE(hymcache_lookup(live, b.keys, kBlocks, 0, NULL, &hit),
              HYMCACHE_DEADLINE_EXCEEDED);
  hymcache_client_destroy(live);

  int port = 0;
  int fd = BlackHole(&port);
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
  /* The client's default timeout applies to calls given none. */
  hymcache_client* c = NewClient(addr, HYMCACHE_TRANSPORT_TCP, 300);
  double t0 = NowSeconds();
  EXPECT_CODE(
      hymcache_lookup(c, b.keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, NULL, &hit),
      HYMCACHE_DEADLINE_EXCEEDED);
  double took = NowSeconds() - t0;
  EXPECT(took >= 0.25 && took < 5);
  hymcache_buffer out[1] = {{malloc(b.size[0]), b.size[0]}};
  hymcache_load_result r;
  t0 = NowSeconds();
  EXPECT_CODE(hymcache_load(c, b.keys, out, 1, 200, 0, NULL, &r),
              HYMCACHE_DEADLINE_EXCEEDED);
  took = NowSeconds() - t0;
  EXPECT(took >= 0.15 && took < 5);
  /* A store bounded by 1.5 s (room for a slow machine between the calls):
   * waiting 0 ms first finds it running. */
  hymcache_store_handle* s = NULL;
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, 2, NULL, 1500, &s));
  int done = 1;
  REQUIRE_OK(hymcache_store_poll(s, &done));
  EXPECT(done == 0);
  EXPECT_CODE(hymcache_store_wait(s, 0, NULL, NULL),
              HYMCACHE_DEADLINE_EXCEEDED);
  EXPECT_CODE(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, NULL, NULL),
              HYMCACHE_DEADLINE_EXCEEDED);
  REQUIRE_OK(hymcache_store_poll(s, &done));
  EXPECT(done == 1);
  hymcache_store_free(s);
  /* A store still running when its client goes: destroy waits for it, and
   * the handle stays valid (and done). */
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, 2, NULL, 200, &s));
  hymcache_client_destroy(c);
  REQUIRE_OK(hymcache_store_poll(s, &done));
  EXPECT(done == 1);
  hymcache_store_free(s);
  free(out[0].data);
  close(fd);
  FreeBlocks(&b);
}

/* Many threads on one client; the last error is per thread. */
typedef struct ThreadArg {
  hymcache_client* client;
  const Blocks* blocks;
  int fail_on_purpose;
  int errors;
} ThreadArg;

static void* LoadThread(void* p) {
  ThreadArg* a = p;
  for (int round = 0; round < 5; ++round) {
    if (a->fail_on_purpose) {
      size_t hit = 0;
      if (hymcache_lookup(a->client, a->blocks->keys, 0, 1000, NULL, &hit) !=
              HYMCACHE_INVALID_ARGUMENT ||
          strlen(hymcache_last_error()) == 0) {
        a->errors++;
      }
      continue;
    }
    if (LoadAndVerify(a->client, a->blocks, kBlocks, 0, HYMCACHE_OK) !=
            kBlocks ||
        hymcache_last_error()[0] != '\0') {
      a->errors++;
    }
  }
  return NULL;
}

static void Concurrent(const char* master) {
  fprintf(stderr, "-- concurrent\n");
  hymcache_client* c = NewClient(master, HYMCACHE_TRANSPORT_TCP, 0);
  Blocks b;
  MakeBlocks("concurrent", &b);
  hymcache_store_handle* s = NULL;
  REQUIRE_OK(hymcache_store(c, b.keys, b.in, kBlocks, NULL,
                            HYMCACHE_TIMEOUT_DEFAULT, &s));
  hymcache_store_result sr;
  REQUIRE_OK(hymcache_store_wait(s, HYMCACHE_TIMEOUT_DEFAULT, &sr, NULL));
  EXPECT(sr.stored == kBlocks);
  hymcache_store_free(s);
  enum { kThreads = 4 };
  pthread_t t[kThreads];
  ThreadArg args[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    args[i].client = c;
    args[i].blocks = &b;
    args[i].fail_on_purpose = i == 0;
    args[i].errors = 0;
    pthread_create(&t[i], NULL, LoadThread, &args[i]);
  }
  for (int i = 0; i < kThreads; ++i) {
    pthread_join(t[i], NULL);
    EXPECT(args[i].errors == 0);
  }
  hymcache_client_destroy(c);
  FreeBlocks(&b);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MASTER_ADDRESS\n", argv[0]);
    return 2;
  }
  const char* master = argv[1];
  fprintf(stderr, "libhymcache %s, master %s\n", hymcache_version(), master);
  hymcache_client* c = NewClient(master, HYMCACHE_TRANSPORT_TCP, 0);
  WaitForNode(c);
  hymcache_client_destroy(c);

  RoundTrip(master, HYMCACHE_TRANSPORT_TCP, "tcp-model");
  RoundTrip(master, HYMCACHE_TRANSPORT_SHM, "shm-model");
  BadArguments(master);
  DeadMaster();
  SeveralMasters(master);
  Deadlines(master);
  Concurrent(master);
  if (failures > 0) {
    fprintf(stderr, "FAILED: %d expectations\n", failures);
    return 1;
  }
  fprintf(stderr, "PASSED\n");
  return 0;
}
