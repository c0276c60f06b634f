// The C API's block keys against the C++ BlockKeyBuilder, and the argument
// and struct_size checks that need no cluster (the calls against real daemons
// are in tests/c_api_test.c).
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "client/block_key.h"
#include "hymcache/hymcache.h"

namespace hymcache {
namespace {

std::vector<std::string> CKeys(const hymcache_key_namespace& ns,
                               size_t block_tokens,
                               const std::vector<int32_t>& tokens,
                               const uint8_t* parent = nullptr) {
  hymcache_key_builder* b = nullptr;
  REQUIRE(hymcache_key_builder_create(&ns, block_tokens, &b) == HYMCACHE_OK);
  size_t n = 0;
  // Ask for the count first (capacity 0), then fill.
  hymcache_code code = hymcache_block_keys(b, tokens.data(), tokens.size(),
                                           parent, nullptr, 0, &n);
  REQUIRE(n == tokens.size() / block_tokens);
  REQUIRE(code == (n == 0 ? HYMCACHE_OK : HYMCACHE_OUT_OF_RANGE));
  std::vector<uint8_t> out(n * HYMCACHE_BLOCK_KEY_SIZE, 0xEE);
  size_t got = 0;
  REQUIRE(hymcache_block_keys(b, tokens.data(), tokens.size(), parent,
                              out.data(), n, &got) == HYMCACHE_OK);
  REQUIRE(got == n);
  hymcache_key_builder_destroy(b);
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) {
    keys.emplace_back(
        reinterpret_cast<const char*>(out.data() + i * HYMCACHE_BLOCK_KEY_SIZE),
        HYMCACHE_BLOCK_KEY_SIZE);
  }
  return keys;
}

TEST_CASE("C block keys are identical to BlockKeyBuilder's") {
  struct Case {
    const char* model;
    const char* dtype;
    const char* layout;
    int32_t tp_rank;
    int32_t tp_size;
    const char* salt;
    size_t block_tokens;
    size_t num_tokens;
  };
  const Case cases[] = {
      {"meta-llama/Llama-3.1-8B@5206a32", "bf16", "NHD/layers=32", 0, 1, "", 16,
       100},
      {"m", "fp8_e4m3", "HND", 3, 8, "tenant-a", 4, 9},
      {nullptr, nullptr, nullptr, 0, 1, nullptr, 512, 2048},
      {"", "", "", 1, 2, "lora:7", 1, 5},
      {"qwen", "bf16", "NHD", 0, 1, "x", 7, 6},  // no full block
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    INFO("model " << (c.model ? c.model : "(null)") << " block "
                  << c.block_tokens);
    hymcache_key_namespace cns;
    hymcache_key_namespace_init(&cns);
    cns.model = c.model;
    cns.dtype = c.dtype;
    cns.layout = c.layout;
    cns.tp_rank = c.tp_rank;
    cns.tp_size = c.tp_size;
    cns.salt = c.salt;
    KeyNamespace ns;
    ns.model = c.model ? c.model : "";
    ns.dtype = c.dtype ? c.dtype : "";
    ns.layout = c.layout ? c.layout : "";
    ns.tp_rank = c.tp_rank;
    ns.tp_size = c.tp_size;
    ns.salt = c.salt ? c.salt : "";
    std::vector<int32_t> tokens(c.num_tokens);
    for (auto& t : tokens) t = static_cast<int32_t>(rng());
    BlockKeyBuilder cpp(ns, c.block_tokens);
    const std::vector<std::string> want = cpp.Keys(tokens);
    CHECK(CKeys(cns, c.block_tokens, tokens) == want);

    // Continuing a chain from a parent key equals NextKey's chain.
    if (want.size() >= 2) {
      std::vector<int32_t> rest(tokens.begin() + c.block_tokens, tokens.end());
      auto cont = CKeys(cns, c.block_tokens, rest,
                        reinterpret_cast<const uint8_t*>(want[0].data()));
      CHECK(cont == std::vector<std::string>(want.begin() + 1, want.end()));
    }
  }
}

TEST_CASE("the C namespace defaults are the C++ KeyNamespace defaults") {
  hymcache_key_namespace cns;
  hymcache_key_namespace_init(&cns);
  std::vector<int32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 1);
  CHECK(CKeys(cns, 16, tokens) ==
        BlockKeyBuilder(KeyNamespace{}, 16).Keys(tokens));
}

TEST_CASE("key builder argument checks") {
  hymcache_key_namespace ns;
  hymcache_key_namespace_init(&ns);
  hymcache_key_builder* b = nullptr;
  CHECK(hymcache_key_builder_create(&ns, 0, &b) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(std::string(hymcache_last_error()).find("block_tokens") !=
        std::string::npos);
  CHECK(b == nullptr);
  ns.tp_rank = 2;
  ns.tp_size = 2;
  CHECK(hymcache_key_builder_create(&ns, 16, &b) == HYMCACHE_INVALID_ARGUMENT);
  ns.tp_rank = 0;
  ns.struct_size = 8;
  CHECK(hymcache_key_builder_create(&ns, 16, &b) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(hymcache_key_builder_create(nullptr, 16, &b) ==
        HYMCACHE_INVALID_ARGUMENT);
  hymcache_key_namespace_init(&ns);
  REQUIRE(hymcache_key_builder_create(&ns, 4, &b) == HYMCACHE_OK);
  CHECK(std::string(hymcache_last_error()).empty());
  size_t n = 0;
  CHECK(hymcache_block_keys(b, nullptr, 4, nullptr, nullptr, 0, &n) ==
        HYMCACHE_INVALID_ARGUMENT);
  int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint8_t one[HYMCACHE_BLOCK_KEY_SIZE];
  CHECK(hymcache_block_keys(b, tokens, 8, nullptr, one, 1, &n) ==
        HYMCACHE_OUT_OF_RANGE);
  CHECK(n == 2);
  CHECK(hymcache_block_keys(b, tokens, 8, nullptr, one, 1, nullptr) ==
        HYMCACHE_INVALID_ARGUMENT);
  hymcache_key_builder_destroy(b);
  hymcache_key_builder_destroy(nullptr);
}

TEST_CASE("client options checks") {
  hymcache_client_options o;
  hymcache_client_options_init(&o);
  hymcache_client* c = reinterpret_cast<hymcache_client*>(&o);
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(c == nullptr);
  CHECK(std::string(hymcache_last_error()).find("master_addresses") !=
        std::string::npos);

  // Several masters, of which one leads (docs/ha.md): connects lazily.
  const char* two[] = {"127.0.0.1:1", "127.0.0.1:2"};
  o.master_addresses = two;
  o.num_master_addresses = 2;
  REQUIRE(hymcache_client_create(&o, &c) == HYMCACHE_OK);
  REQUIRE(c != nullptr);
  hymcache_client_destroy(c);
  c = nullptr;
  const char* one_bad[] = {"127.0.0.1:1", "no-port"};
  o.master_addresses = one_bad;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(c == nullptr);

  const char* bad[] = {"no-port"};
  o.master_addresses = bad;
  o.num_master_addresses = 1;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(std::string(hymcache_last_error()).find("master_address") !=
        std::string::npos);

  const char* good[] = {"127.0.0.1:1"};
  o.master_addresses = good;
  o.transport = static_cast<hymcache_transport>(42);
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  o.transport = HYMCACHE_TRANSPORT_TCP;
  o.default_timeout_ms = -5;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  o.default_timeout_ms = 0;
  o.tls_ca_file = "/nonexistent/ca.pem";
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_NOT_FOUND);
  CHECK(std::string(hymcache_last_error()).find("/nonexistent/ca.pem") !=
        std::string::npos);
  o.tls_ca_file = nullptr;
  o.master_connections = -1;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(std::string(hymcache_last_error()).find("master_connections") !=
        std::string::npos);
  o.master_connections = 4;
  o.grpc_poll_strategy = "epollex";
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(std::string(hymcache_last_error()).find("grpc_poll_strategy") !=
        std::string::npos);
  o.grpc_poll_strategy = "";
  o.location_cache_ttl_ms = -1;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(std::string(hymcache_last_error()).find("location_cache_ttl") !=
        std::string::npos);
  o.location_cache_ttl_ms = 60001;
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  o.location_cache_ttl_ms = 500;
  o.location_cache_entries = -1;  // off
  REQUIRE(hymcache_client_create(&o, &c) == HYMCACHE_OK);
  hymcache_client_destroy(c);
  o.location_cache_entries = 0;
  o.location_cache_ttl_ms = 0;
  REQUIRE(hymcache_client_create(&o, &c) == HYMCACHE_OK);
  hymcache_client_destroy(c);
  o.master_connections = 0;

  // A caller built against a newer header: unknown trailing fields must be
  // zero; an older, shorter struct takes defaults for what it lacks.
  struct Newer {
    hymcache_client_options base;
    int64_t future_field;
  } newer;
  std::memset(&newer, 0, sizeof(newer));
  newer.base = o;
  newer.base.struct_size = sizeof(newer);
  newer.future_field = 1;
  CHECK(hymcache_client_create(&newer.base, &c) == HYMCACHE_UNIMPLEMENTED);
  newer.future_field = 0;
  REQUIRE(hymcache_client_create(&newer.base, &c) == HYMCACHE_OK);
  hymcache_client_destroy(c);
  o.struct_size = offsetof(hymcache_client_options, transport);
  REQUIRE(hymcache_client_create(&o, &c) == HYMCACHE_OK);
  hymcache_client_destroy(c);
  o.struct_size = offsetof(hymcache_client_options, num_master_addresses);
  CHECK(hymcache_client_create(&o, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(hymcache_client_create(nullptr, &c) == HYMCACHE_INVALID_ARGUMENT);
  CHECK(hymcache_client_create(&o, nullptr) == HYMCACHE_INVALID_ARGUMENT);
  hymcache_client_destroy(nullptr);
}

TEST_CASE("code names and version") {
  CHECK(std::string(hymcache_code_name(HYMCACHE_OK)) == "OK");
  CHECK(std::string(hymcache_code_name(HYMCACHE_DEADLINE_EXCEEDED)) ==
        "DEADLINE_EXCEEDED");
  CHECK(std::string(hymcache_code_name(static_cast<hymcache_code>(99))) ==
        "UNKNOWN_CODE");
  CHECK(std::string(hymcache_code_name(HYMCACHE_UNAUTHENTICATED)) ==
        "UNAUTHENTICATED");
  CHECK(std::string(hymcache_code_name(static_cast<hymcache_code>(-1))) ==
        "UNKNOWN_CODE");
  CHECK(std::string(hymcache_version()).size() > 0);
}

}  // namespace
}  // namespace hymcache
