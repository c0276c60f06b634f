/* HyMCache C quick start: key a conversation's KV blocks, store them, look
 * them up and load them back into the engine's buffers.
 *
 *   cc -std=c11 example.c $(pkg-config --cflags --libs hymcache) -o example
 *   ./example MASTER_HOST:PORT
 */
#define _POSIX_C_SOURCE 200809L

#include <hymcache/hymcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                     \
  do {                                                                  \
    hymcache_code code_ = (call);                                       \
    if (code_ != HYMCACHE_OK) {                                         \
      fprintf(stderr, "%s: %s: %s\n", #call, hymcache_code_name(code_), \
              hymcache_last_error());                                   \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

enum { kBlocks = 4, kBlockTokens = 16, kBlockBytes = 64 * 1024 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MASTER_HOST:PORT\n", argv[0]);
    return 2;
  }

  /* A client of the cluster whose master is argv[1]. */
  hymcache_client_options options;
  hymcache_client_options_init(&options);
  const char* masters[] = {argv[1]};
  options.master_addresses = masters;
  options.num_master_addresses = 1;
  options.transport = HYMCACHE_TRANSPORT_AUTO;
  hymcache_client* client;
  CHECK(hymcache_client_create(&options, &client));

  /* A fresh cluster: wait (up to 30 s) until a storage node is serving. */
  hymcache_cluster_stats stats = {.struct_size = sizeof(stats)};
  for (int i = 0; i < 600; ++i) {
    if (hymcache_cluster_stats_get(client, 1000, &stats) == HYMCACHE_OK &&
        stats.alive_nodes > 0) {
      break;
    }
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }

  /* Keys of the prompt's full blocks, in the model's namespace. */
  hymcache_key_namespace ns;
  hymcache_key_namespace_init(&ns);
  ns.model = "example-model@rev1";
  ns.dtype = "bf16";
  hymcache_key_builder* builder;
  CHECK(hymcache_key_builder_create(&ns, kBlockTokens, &builder));
  int32_t tokens[kBlocks * kBlockTokens];
  for (int i = 0; i < kBlocks * kBlockTokens; ++i) tokens[i] = 1000 + i;
  uint8_t key_bytes[kBlocks][HYMCACHE_BLOCK_KEY_SIZE];
  size_t num_keys;
  CHECK(hymcache_block_keys(builder, tokens, kBlocks * kBlockTokens, NULL,
                            &key_bytes[0][0], kBlocks, &num_keys));
  hymcache_key keys[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    keys[i] = (hymcache_key){key_bytes[i], HYMCACHE_BLOCK_KEY_SIZE};
  }

  /* The engine computed these blocks: store them in the background. */
  static uint8_t kv[kBlocks][kBlockBytes];
  hymcache_const_buffer in[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    memset(kv[i], 'a' + i, kBlockBytes);
    in[i] = (hymcache_const_buffer){kv[i], kBlockBytes};
  }
  hymcache_store_handle* store;
  CHECK(hymcache_store(client, keys, in, kBlocks, NULL,
                       HYMCACHE_TIMEOUT_DEFAULT, &store));
  hymcache_store_result stored;
  CHECK(hymcache_store_wait(store, HYMCACHE_TIMEOUT_DEFAULT, &stored, NULL));
  hymcache_store_free(store);

  /* The next turn: how much of the prefix is cached, then load it. */
  size_t hit_prefix;
  CHECK(hymcache_lookup(client, keys, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, NULL,
                        &hit_prefix));
  static uint8_t pool[kBlocks][kBlockBytes];
  hymcache_buffer out[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    out[i] = (hymcache_buffer){pool[i], kBlockBytes};
  }
  uint64_t lengths[kBlocks];
  hymcache_load_result loaded;
  CHECK(hymcache_load(client, keys, out, kBlocks, HYMCACHE_TIMEOUT_DEFAULT, 0,
                      lengths, &loaded));
  /* Blocks [loaded.loaded, kBlocks) would be recomputed by the engine. */
  int same = loaded.loaded == kBlocks && memcmp(pool, kv, sizeof(kv)) == 0;

  printf("stored %zu, hit prefix %zu, loaded %zu blocks (%llu bytes): %s\n",
         stored.stored, hit_prefix, loaded.loaded,
         (unsigned long long)loaded.bytes, same ? "identical" : "DIFFERENT");
  hymcache_key_builder_destroy(builder);
  hymcache_client_destroy(client);
  return same ? 0 : 1;
}
