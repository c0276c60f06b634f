#include "tools/demo/demo.h"

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/block_key.h"
#include "client/client.h"

namespace hymcache::demo {
namespace {

// The "KV" of a block: bytes derived from its key, so a load can be checked.
void FillBlock(const std::string& key, std::vector<uint8_t>& out) {
  uint64_t seed = 0;
  std::memcpy(&seed, key.data(), std::min<size_t>(8, key.size()));
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<uint8_t>(rng());
}

}  // namespace

absl::Status Run(const DemoOptions& o, std::ostream& out) {
  ClientOptions co;
  co.master_address = o.master_address;
  co.auth_token = o.token;
  co.tls_ca_file = o.tls_ca_file;
  // Shared memory with a node on this host, RDMA if present, else TCP.
  co.transport = TransportKind::kAuto;
  auto client_or = Client::Create(co);
  if (!client_or.ok()) return client_or.status();
  Client& client = **client_or;

  KeyNamespace ns;
  ns.model = "demo-model-7b";
  ns.dtype = "bf16";
  ns.layout = "NHD";
  BlockKeyBuilder keys(ns, o.block_tokens);

  std::vector<std::vector<int32_t>> prompts(o.conversations);
  std::mt19937 rng(2026);
  out << absl::StrFormat("%-5s %-5s %7s %6s %7s %7s %9s %9s %s\n", "turn", "conv",
                         "blocks", "hits", "loaded", "stored", "load MiB",
                         "load ms", "verified");
  uint64_t total_blocks = 0, total_loaded = 0, total_stored = 0;
  for (int t = 0; t < o.turns; ++t) {
    for (int c = 0; c < o.conversations; ++c) {
      auto& p = prompts[c];
      // Previous answer + new user message.
      for (int i = 0; i < (t == 0 ? o.tokens_per_turn : 2 * o.tokens_per_turn); ++i) {
        p.push_back(static_cast<int32_t>(rng() % 32000) + c * 100000);
      }
      std::vector<std::string> k = keys.Keys(p);
      std::vector<std::vector<uint8_t>> bufs(k.size(), std::vector<uint8_t>(o.block_bytes));
      std::vector<MutableBuffer> mb;
      for (auto& b : bufs) mb.push_back({b.data(), b.size()});
      absl::Time start = absl::Now();
      // The request's read path: lookup, prefetch hints, ordered reads.
      auto got = client.Load(k, mb);
      double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!got.ok()) return got.status();
      // Check every loaded block against its expected bytes.
      std::vector<uint8_t> expect(o.block_bytes);
      for (size_t i = 0; i < got->loaded; ++i) {
        FillBlock(k[i], expect);
        if (got->lengths[i] != o.block_bytes ||
            std::memcmp(expect.data(), bufs[i].data(), o.block_bytes) != 0) {
          return absl::DataLossError(absl::StrCat(
              "conversation ", c, " turn ", t, ": block ", i, " came back wrong"));
        }
      }
      // "Compute" the blocks that were not loaded and store them.
      std::vector<std::string> new_keys(k.begin() + got->loaded, k.end());
      std::vector<ConstBuffer> in;
      for (size_t i = got->loaded; i < k.size(); ++i) {
        FillBlock(k[i], bufs[i]);
        in.push_back({bufs[i].data(), bufs[i].size()});
      }
      size_t stored = 0;
      if (!new_keys.empty()) {
        // Stored asynchronously next to the prefix; an engine would go on
        // with the request and reuse the buffers once the store is done.
        StoreOptions so;
        if (got->loaded > 0) so.parent_key = k[got->loaded - 1];
        auto put = client.Store(new_keys, in, so)->Wait();
        if (!put.ok()) return put.status();
        stored = put->stored;
      }
      total_blocks += k.size();
      total_loaded += got->loaded;
      total_stored += stored;
      out << absl::StrFormat("%-5d %-5d %7d %6d %7d %7d %9.1f %9.2f %s\n", t + 1, c,
                             k.size(), got->hit_prefix, got->loaded, stored,
                             got->loaded * o.block_bytes / 1048576.0, ms, "ok");
    }
  }
  out << absl::StrFormat(
      "\n%d conversations x %d turns: %d blocks needed, %d loaded from HyMCache "
      "(%.0f%% prefix reuse), %d computed and stored; every loaded byte verified.\n",
      o.conversations, o.turns, total_blocks, total_loaded,
      total_blocks ? 100.0 * total_loaded / total_blocks : 0.0, total_stored);
  auto st = client.GetClusterStatus();
  if (st.ok()) {
    out << absl::StrFormat("cluster: %d objects, %.1f MiB stored on %d node(s)\n",
                           st->object_count, st->object_bytes / 1048576.0,
                           st->nodes.size());
  }
  return absl::OkStatus();
}

}  // namespace hymcache::demo
