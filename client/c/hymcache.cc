// The C API (hymcache.h) over the C++ SDK (client/client.h,
// client/block_key.h): argument checks and conversions only; every call
// forwards to one SDK call. No C++ exception crosses the C boundary.
#include "hymcache/hymcache.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/block_key.h"
#include "client/client.h"
#include "client/options.h"
#include "common/build_info.h"
#include "common/cluster_stats.h"
#include "common/limits.h"
#include "common/status_macros.h"

struct hymcache_client {
  std::unique_ptr<hymcache::Client> impl;
};

struct hymcache_key_builder {
  hymcache::BlockKeyBuilder impl;
};

struct hymcache_store_handle {
  std::shared_ptr<hymcache::StoreHandle> handle;
  size_t num_keys = 0;
};

namespace hymcache {
namespace {

// The canonical codes are the same numbers on both sides.
static_assert(HYMCACHE_UNAUTHENTICATED ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));
static_assert(HYMCACHE_OUT_OF_RANGE ==
              static_cast<int>(absl::StatusCode::kOutOfRange));

std::string& LastError() {
  thread_local std::string message;
  return message;
}

hymcache_code Finish(const absl::Status& s) {
  LastError().assign(s.message().data(), s.message().size());
  return static_cast<hymcache_code>(s.code());
}

// Runs `fn` (returning absl::Status) and turns its status, or an exception
// (std::bad_alloc from a container), into a code and the thread's message.
template <typename Fn>
hymcache_code Guard(Fn&& fn) {
  try {
    return Finish(fn());
  } catch (const std::bad_alloc&) {
    return Finish(absl::ResourceExhaustedError("hymcache: out of memory"));
  } catch (const std::exception& e) {
    return Finish(absl::InternalError(absl::StrCat("hymcache: ", e.what())));
  } catch (...) {
    return Finish(absl::InternalError("hymcache: unknown exception"));
  }
}

absl::Status Null(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
}

// An absolute deadline for a call's timeout_ms (absl::InfinitePast() is the
// SDK's "the client's default").
absl::StatusOr<absl::Time> CallDeadline(int64_t timeout_ms) {
  if (timeout_ms == HYMCACHE_TIMEOUT_DEFAULT) return absl::InfinitePast();
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms ", timeout_ms, ": >= 0 or HYMCACHE_TIMEOUT_DEFAULT"));
  }
  return absl::Now() + absl::Milliseconds(timeout_ms);
}

// Copies a caller's versioned struct (leading size_t struct_size) into
// *out: the fields within struct_size, zero past it. Fields past what this
// library knows must be zero (the kernel's copy_struct_from_user rule).
template <typename T>
absl::Status ReadVersioned(const T* in, size_t min_size, const char* what,
                           T* out) {
  static_assert(std::is_trivially_copyable<T>::value);
  std::memset(static_cast<void*>(out), 0, sizeof(T));
  if (in == nullptr) return Null(what);
  const size_t n = in->struct_size;
  if (n < min_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "->struct_size ", n, " is smaller than ", min_size,
                     " (use the *_init helper)"));
  }
  std::memcpy(static_cast<void*>(out), in, std::min(n, sizeof(T)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(T); i < n; ++i) {
    if (bytes[i] != 0) {
      return absl::UnimplementedError(absl::StrCat(
          what, " sets fields this library (", BuildInfo().version,
          ") does not know (struct_size ", n, " > ", sizeof(T), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Keys(const hymcache_key* keys,
                                              size_t n) {
  if (keys == nullptr && n > 0) return Null("keys");
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (keys[i].data == nullptr && keys[i].size > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "].data is NULL"));
    }
    out.emplace_back(static_cast<const char*>(keys[i].data), keys[i].size);
  }
  return out;
}

absl::StatusOr<ClientOptions> ToClientOptions(
    const hymcache_client_options* in) {
  hymcache_client_options o;
  RETURN_IF_ERROR(ReadVersioned(
      in, offsetof(hymcache_client_options, transport), "options", &o));
  // etcd_endpoints and cluster lie past what older callers' structs hold:
  // ReadVersioned left them NULL for those.
  const bool etcd = o.etcd_endpoints != nullptr && *o.etcd_endpoints != '\0';
  if (!etcd && (o.num_master_addresses == 0 || o.master_addresses == nullptr)) {
    return absl::InvalidArgumentError(
        "options->master_addresses: one address is required (or "
        "etcd_endpoints)");
  }
  if (o.num_master_addresses > 0 && o.master_addresses == nullptr) {
    return Null("master_addresses");
  }
  // Several masters (one leads; docs/ha.md) travel as ClientOptions'
  // comma-separated list.
  ClientOptions c;
  if (etcd) c.etcd_endpoints = o.etcd_endpoints;
  if (o.cluster != nullptr) c.cluster = o.cluster;
  for (size_t i = 0; i < o.num_master_addresses; ++i) {
    const char* a = o.master_addresses[i];
    if (a == nullptr) {
      return Null(absl::StrCat("master_addresses[", i, "]").c_str());
    }
    if (*a == '\0' || std::strchr(a, ',') != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options->master_addresses[", i, "]: '", a,
          "' is not one host:port"));
    }
    absl::StrAppend(&c.master_address, i == 0 ? "" : ",", a);
  }
  switch (o.transport) {
    case HYMCACHE_TRANSPORT_TCP:
      c.transport = TransportKind::kTcp;
      break;
    case HYMCACHE_TRANSPORT_SHM:
      c.transport = TransportKind::kShm;
      break;
    case HYMCACHE_TRANSPORT_RDMA:
      c.transport = TransportKind::kRdma;
      break;
    case HYMCACHE_TRANSPORT_AUTO:
      c.transport = TransportKind::kAuto;
      break;
    case HYMCACHE_TRANSPORT_INT32_:
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "options->transport: unknown value ", static_cast<int>(o.transport)));
  }
  if (o.default_timeout_ms < 0 || o.default_store_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        "options->default_timeout_ms and default_store_timeout_ms must be "
        ">= 0 (0: the default)");
  }
  if (o.default_timeout_ms > 0) {
    c.default_deadline = absl::Milliseconds(o.default_timeout_ms);
  }
  if (o.default_store_timeout_ms > 0) {
    c.default_store_deadline = absl::Milliseconds(o.default_store_timeout_ms);
  }
  if (o.auth_token != nullptr) c.auth_token = o.auth_token;
  if (o.tls_ca_file != nullptr) c.tls_ca_file = o.tls_ca_file;
  if (o.tls_cert_file != nullptr) c.tls_cert_file = o.tls_cert_file;
  if (o.tls_key_file != nullptr) c.tls_key_file = o.tls_key_file;
  if (o.tls_server_name != nullptr) c.tls_server_name = o.tls_server_name;
  if (o.rdma_device != nullptr) c.rdma_device = o.rdma_device;
  if (o.store_threads != 0) c.store_threads = o.store_threads;
  if (o.max_pending_stores != 0) c.max_pending_stores = o.max_pending_stores;
  if (o.master_connections != 0) c.master_connections = o.master_connections;
  if (o.location_cache_entries < 0) c.location_cache_entries = 0;
  if (o.location_cache_entries > 0) {
    c.location_cache_entries = static_cast<uint32_t>(o.location_cache_entries);
  }
  if (o.location_cache_ttl_ms != 0) {
    c.location_cache_ttl = absl::Milliseconds(o.location_cache_ttl_ms);
  }
  if (o.grpc_poll_strategy != nullptr) {
    c.grpc_poll_strategy = o.grpc_poll_strategy;
  }
  return c;
}

}  // namespace
}  // namespace hymcache

using hymcache::CallDeadline;
using hymcache::Guard;
using hymcache::Null;

extern "C" {

const char* hymcache_last_error(void) { return hymcache::LastError().c_str(); }

const char* hymcache_code_name(hymcache_code code) {
  // Indexed by code (absl::StatusCode's numbers).
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) ==
                HYMCACHE_UNAUTHENTICATED + 1);
  const int i = static_cast<int>(code);
  if (i < 0 || i > HYMCACHE_UNAUTHENTICATED) return "UNKNOWN_CODE";
  return kNames[i];
}

const char* hymcache_version(void) {
  return hymcache::BuildInfo().version.c_str();
}

void hymcache_client_options_init(hymcache_client_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

hymcache_code hymcache_client_create(const hymcache_client_options* options,
                                     hymcache_client** client) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    *client = nullptr;
    ASSIGN_OR_RETURN(hymcache::ClientOptions o,
                     hymcache::ToClientOptions(options));
    ASSIGN_OR_RETURN(std::unique_ptr<hymcache::Client> c,
                     hymcache::Client::Create(o));
    *client = new hymcache_client{std::move(c)};
    return absl::OkStatus();
  });
}

void hymcache_client_destroy(hymcache_client* client) { delete client; }

hymcache_code hymcache_lookup(hymcache_client* client, const hymcache_key* keys,
                              size_t num_keys, int64_t timeout_ms,
                              uint8_t* found, size_t* hit_prefix) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    hymcache::CallOptions call;
    ASSIGN_OR_RETURN(call.deadline, CallDeadline(timeout_ms));
    ASSIGN_OR_RETURN(hymcache::ExistsResult r, client->impl->Exists(k, call));
    if (found != nullptr) {
      for (size_t i = 0; i < num_keys; ++i) found[i] = r.found[i] ? 1 : 0;
    }
    if (hit_prefix != nullptr) *hit_prefix = r.hit_prefix;
    return absl::OkStatus();
  });
}

hymcache_code hymcache_load(hymcache_client* client, const hymcache_key* keys,
                            const hymcache_buffer* buffers, size_t num_keys,
                            int64_t timeout_ms, uint32_t flags,
                            uint64_t* lengths, hymcache_load_result* result) {
  absl::Status stop;
  hymcache_code code = Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    if (result == nullptr) return Null("result");
    std::memset(result, 0, sizeof(*result));
    if (buffers == nullptr && num_keys > 0) return Null("buffers");
    if ((flags & ~HYMCACHE_LOAD_NO_PREFETCH) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("flags: unknown bits ", flags));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    std::vector<hymcache::MutableBuffer> bufs(num_keys);
    for (size_t i = 0; i < num_keys; ++i) {
      if (buffers[i].data == nullptr && buffers[i].size > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("buffers[", i, "].data is NULL"));
      }
      bufs[i] = {buffers[i].data, buffers[i].size};
    }
    hymcache::LoadOptions lo;
    ASSIGN_OR_RETURN(lo.deadline, CallDeadline(timeout_ms));
    lo.prefetch = (flags & HYMCACHE_LOAD_NO_PREFETCH) == 0;
    ASSIGN_OR_RETURN(hymcache::LoadResult r, client->impl->Load(k, bufs, lo));
    result->loaded = r.loaded;
    result->hit_prefix = r.hit_prefix;
    result->bytes = r.bytes;
    result->stop_code = static_cast<hymcache_code>(r.stop_reason.code());
    if (lengths != nullptr) {
      std::copy(r.lengths.begin(), r.lengths.begin() + r.loaded, lengths);
    }
    stop = std::move(r.stop_reason);
    return absl::OkStatus();
  });
  if (code == HYMCACHE_OK) hymcache::Finish(stop);
  return code;
}

hymcache_code hymcache_store(hymcache_client* client, const hymcache_key* keys,
                             const hymcache_const_buffer* buffers,
                             size_t num_keys, const hymcache_key* parent_key,
                             int64_t timeout_ms,
                             hymcache_store_handle** store) {
  return Guard([&]() -> absl::Status {
    if (store == nullptr) return Null("store");
    *store = nullptr;
    if (client == nullptr) return Null("client");
    if (buffers == nullptr && num_keys > 0) return Null("buffers");
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    std::vector<hymcache::ConstBuffer> bufs(num_keys);
    for (size_t i = 0; i < num_keys; ++i) {
      bufs[i] = {buffers[i].data, buffers[i].size};
    }
    hymcache::StoreOptions so;
    ASSIGN_OR_RETURN(so.deadline, CallDeadline(timeout_ms));
    if (parent_key != nullptr) {
      ASSIGN_OR_RETURN(std::vector<std::string> p,
                       hymcache::Keys(parent_key, 1));
      so.parent_key = std::move(p[0]);
    }
    auto handle = std::make_unique<hymcache_store_handle>();
    handle->num_keys = num_keys;
    handle->handle = client->impl->Store(k, bufs, so);
    *store = handle.release();
    return absl::OkStatus();
  });
}

hymcache_code hymcache_store_poll(const hymcache_store_handle* store,
                                  int* done) {
  return Guard([&]() -> absl::Status {
    if (store == nullptr) return Null("store");
    if (done == nullptr) return Null("done");
    *done = store->handle->Done() ? 1 : 0;
    return absl::OkStatus();
  });
}

hymcache_code hymcache_store_wait(hymcache_store_handle* store,
                                  int64_t timeout_ms,
                                  hymcache_store_result* result,
                                  uint8_t* outcomes) {
  absl::Status first_failure;
  hymcache_code code = Guard([&]() -> absl::Status {
    if (store == nullptr) return Null("store");
    absl::Time deadline = absl::InfiniteFuture();
    if (timeout_ms != HYMCACHE_TIMEOUT_DEFAULT) {
      ASSIGN_OR_RETURN(deadline, CallDeadline(timeout_ms));
    }
    ASSIGN_OR_RETURN(hymcache::PutResult r, store->handle->Wait(deadline));
    if (result != nullptr) {
      result->stored = r.stored;
      result->skipped = r.skipped;
      result->failed = r.failed;
      result->refused = r.refused;
      result->node_id = r.node_id;
    }
    for (size_t i = 0; i < r.outcomes.size() && i < store->num_keys; ++i) {
      if (outcomes != nullptr) {
        outcomes[i] = static_cast<uint8_t>(r.outcomes[i]);
      }
      if (first_failure.ok() && i < r.errors.size() && !r.errors[i].ok()) {
        first_failure = r.errors[i];
      }
    }
    return absl::OkStatus();
  });
  if (code == HYMCACHE_OK) {
    hymcache::LastError().assign(first_failure.message().data(),
                                 first_failure.message().size());
  }
  return code;
}

void hymcache_store_free(hymcache_store_handle* store) {
  if (store == nullptr) return;
  // The caller's buffers are free once this returns.
  store->handle->Wait(absl::InfiniteFuture()).status().IgnoreError();
  delete store;
}

hymcache_code hymcache_remove(hymcache_client* client, const hymcache_key* keys,
                              size_t num_keys, int64_t timeout_ms,
                              uint8_t* removed) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    hymcache::CallOptions call;
    ASSIGN_OR_RETURN(call.deadline, CallDeadline(timeout_ms));
    ASSIGN_OR_RETURN(std::vector<bool> r, client->impl->Remove(k, call));
    if (removed != nullptr) {
      for (size_t i = 0; i < num_keys && i < r.size(); ++i) {
        removed[i] = r[i] ? 1 : 0;
      }
    }
    return absl::OkStatus();
  });
}

hymcache_code hymcache_hint_next_turn(hymcache_client* client,
                                      const hymcache_key* keys, size_t num_keys,
                                      int64_t expected_in_ms, int64_t hold_ms) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    if (expected_in_ms < 0 || hold_ms < 0) {
      return absl::InvalidArgumentError(
          "hymcache_hint_next_turn: expected_in_ms and hold_ms must be >= 0");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    hymcache::TurnHintOptions o;
    o.expected_in = absl::Milliseconds(expected_in_ms);
    if (hold_ms > 0) o.hold = absl::Milliseconds(hold_ms);
    return client->impl->HintNextTurn(k, o);
  });
}

hymcache_code hymcache_hint_conversation_ended(hymcache_client* client,
                                               const hymcache_key* keys,
                                               size_t num_keys) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    return client->impl->HintConversationEnded(k);
  });
}

hymcache_code hymcache_register_memory(hymcache_client* client, void* data,
                                       size_t size) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    return client->impl->RegisterMemory(data, size);
  });
}

hymcache_code hymcache_unregister_memory(hymcache_client* client, void* data) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    return client->impl->UnregisterMemory(data);
  });
}

hymcache_code hymcache_cluster_stats_get(hymcache_client* client,
                                         int64_t timeout_ms,
                                         hymcache_cluster_stats* stats) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    if (stats == nullptr) return Null("stats");
    constexpr size_t kMin = offsetof(hymcache_cluster_stats, alive_nodes);
    const size_t n = stats->struct_size;
    if (n < kMin) {
      return absl::InvalidArgumentError(
          absl::StrCat("stats->struct_size ", n, " is smaller than ", kMin));
    }
    hymcache::CallOptions call;
    ASSIGN_OR_RETURN(call.deadline, CallDeadline(timeout_ms));
    ASSIGN_OR_RETURN(hymcache::ClusterStatus st,
                     client->impl->GetClusterStatus(call));
    hymcache_cluster_stats out;
    std::memset(&out, 0, sizeof(out));
    out.struct_size = n;
    for (const auto& node : st.nodes) {
      ++out.nodes;
      out.alive_nodes += node.alive ? 1 : 0;
      out.capacity_bytes += node.capacity_bytes;
      out.used_bytes += node.used_bytes;
    }
    // Every cluster stat by name (common/cluster_stats.h): a stat added
    // there without a field here does not compile.
#define HYM_C_GAUGE_(field, metric, help) out.field = st.field;
#define HYM_C_COUNTER_(field) out.field = st.field;
    HYM_CLUSTER_STATS(HYM_C_GAUGE_, HYM_C_COUNTER_)
#undef HYM_C_GAUGE_
#undef HYM_C_COUNTER_
    std::memcpy(stats, &out, std::min(n, sizeof(out)));
    return absl::OkStatus();
  });
}

static_assert(HYMCACHE_MAX_ENGINE_ID == hymcache::kMaxEngineIdBytes);

hymcache_code hymcache_prefix_query(hymcache_client* client,
                                    const hymcache_key* keys, size_t num_keys,
                                    int64_t timeout_ms,
                                    hymcache_prefix_answer* answer) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    if (answer == nullptr) return Null("answer");
    if (answer->struct_size < sizeof(hymcache_prefix_answer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("answer->struct_size ", answer->struct_size,
                       " is smaller than ", sizeof(hymcache_prefix_answer)));
    }
    if ((answer->nodes == nullptr && answer->nodes_capacity > 0) ||
        (answer->engines == nullptr && answer->engines_capacity > 0)) {
      return Null("answer->nodes or answer->engines");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> k,
                     hymcache::Keys(keys, num_keys));
    hymcache::CallOptions call;
    ASSIGN_OR_RETURN(call.deadline, CallDeadline(timeout_ms));
    ASSIGN_OR_RETURN(hymcache::PrefixAnswer a,
                     client->impl->PrefixQuery(k, call));
    answer->hit_prefix_length = a.hit_prefix_length;
    answer->num_nodes = a.nodes.size();
    for (size_t i = 0; i < a.nodes.size() && i < answer->nodes_capacity; ++i) {
      answer->nodes[i] = {a.nodes[i].node_id, a.nodes[i].longest_prefix,
                          a.nodes[i].blocks};
    }
    answer->num_engines = a.engines.size();
    for (size_t i = 0; i < a.engines.size() && i < answer->engines_capacity;
         ++i) {
      hymcache_engine_prefix& e = answer->engines[i];
      std::memset(e.engine_id, 0, sizeof(e.engine_id));
      std::memcpy(
          e.engine_id, a.engines[i].engine_id.data(),
          std::min(a.engines[i].engine_id.size(), sizeof(e.engine_id) - 1));
      e.longest_prefix = a.engines[i].longest_prefix;
    }
    return absl::OkStatus();
  });
}

hymcache_code hymcache_report_engine_blocks(
    hymcache_client* client, const char* engine_id, int cleared,
    const hymcache_key* removed, size_t num_removed, const hymcache_key* stored,
    size_t num_stored, int64_t timeout_ms, uint64_t* blocks_out,
    int64_t* ttl_ms_out) {
  return Guard([&]() -> absl::Status {
    if (client == nullptr) return Null("client");
    if (engine_id == nullptr) return Null("engine_id");
    hymcache::EngineBlocksReport r;
    r.engine_id = engine_id;
    r.cleared = cleared != 0;
    ASSIGN_OR_RETURN(r.removed, hymcache::Keys(removed, num_removed));
    ASSIGN_OR_RETURN(r.stored, hymcache::Keys(stored, num_stored));
    hymcache::CallOptions call;
    ASSIGN_OR_RETURN(call.deadline, CallDeadline(timeout_ms));
    ASSIGN_OR_RETURN(hymcache::EngineBlocksReply reply,
                     client->impl->ReportEngineBlocks(r, call));
    if (blocks_out != nullptr) *blocks_out = reply.blocks;
    if (ttl_ms_out != nullptr)
      *ttl_ms_out = absl::ToInt64Milliseconds(reply.ttl);
    return absl::OkStatus();
  });
}

void hymcache_key_namespace_init(hymcache_key_namespace* ns) {
  if (ns == nullptr) return;
  std::memset(ns, 0, sizeof(*ns));
  ns->struct_size = sizeof(*ns);
  ns->tp_size = 1;
}

hymcache_code hymcache_key_builder_create(const hymcache_key_namespace* ns,
                                          size_t block_tokens,
                                          hymcache_key_builder** builder) {
  return Guard([&]() -> absl::Status {
    if (builder == nullptr) return Null("builder");
    *builder = nullptr;
    hymcache_key_namespace in;
    RETURN_IF_ERROR(hymcache::ReadVersioned(ns, sizeof(in), "namespace", &in));
    if (block_tokens == 0) {
      return absl::InvalidArgumentError("block_tokens must be > 0");
    }
    if (in.tp_size < 1 || in.tp_rank < 0 || in.tp_rank >= in.tp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace: tp_rank ", in.tp_rank, " / tp_size ",
                       in.tp_size, ": need 0 <= tp_rank < tp_size"));
    }
    hymcache::KeyNamespace k;
    if (in.model != nullptr) k.model = in.model;
    if (in.dtype != nullptr) k.dtype = in.dtype;
    if (in.layout != nullptr) k.layout = in.layout;
    k.tp_rank = in.tp_rank;
    k.tp_size = in.tp_size;
    if (in.salt != nullptr) k.salt = in.salt;
    *builder =
        new hymcache_key_builder{hymcache::BlockKeyBuilder(k, block_tokens)};
    return absl::OkStatus();
  });
}

void hymcache_key_builder_destroy(hymcache_key_builder* builder) {
  delete builder;
}

hymcache_code hymcache_block_keys(const hymcache_key_builder* builder,
                                  const int32_t* tokens, size_t num_tokens,
                                  const uint8_t* parent, uint8_t* keys_out,
                                  size_t keys_capacity, size_t* num_keys) {
  return Guard([&]() -> absl::Status {
    if (builder == nullptr) return Null("builder");
    if (num_keys == nullptr) return Null("num_keys");
    if (tokens == nullptr && num_tokens > 0) return Null("tokens");
    const size_t block = builder->impl.block_tokens();
    const size_t count = num_tokens / block;
    *num_keys = count;
    if (count > keys_capacity) {
      return absl::OutOfRangeError(absl::StrCat(num_tokens, " tokens make ",
                                                count, " keys; room for ",
                                                keys_capacity));
    }
    if (keys_out == nullptr && count > 0) return Null("keys_out");
    absl::Span<const int32_t> t(tokens, num_tokens);
    std::vector<std::string> keys;
    if (parent == nullptr) {
      keys = builder->impl.Keys(t);
    } else {
      std::string p(reinterpret_cast<const char*>(parent),
                    HYMCACHE_BLOCK_KEY_SIZE);
      for (size_t i = 0; i < count; ++i) {
        p = builder->impl.NextKey(p, t.subspan(i * block, block));
        keys.push_back(p);
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].size() != HYMCACHE_BLOCK_KEY_SIZE) {
        return absl::InternalError("block key of unexpected size");
      }
      std::memcpy(keys_out + i * HYMCACHE_BLOCK_KEY_SIZE, keys[i].data(),
                  HYMCACHE_BLOCK_KEY_SIZE);
    }
    return absl::OkStatus();
  });
}

}  // extern "C"
