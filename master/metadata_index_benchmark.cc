// Memory and lookup cost of MetadataIndex with the client's key shape
// (32-byte binary SHA-256 prefix keys), stored as chains of 16 blocks (each
// linked to the block before it), 16 nodes.
//
//   bazel run -c opt //master:metadata_index_benchmark
//   bazel run -c opt //master:metadata_index_benchmark -- --entries=10000000
//
// First prints heap bytes per entry, measured as the mallinfo2() delta over
// N inserts ("bytes_per_entry=..."), and the same for the naive
// absl::flat_hash_map<std::string, IndexEntry> for comparison; then runs the
// Google Benchmark lookup cases (batches of 32 keys).
#include <malloc.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "master/metadata_index.h"

namespace hymcache {
namespace master {
namespace {

size_t g_entries = 1000000;

size_t HeapInUse() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;  // arena chunks in use + mmapped chunks
}

std::vector<std::string> MakeKeys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> keys(n, std::string(32, '\0'));
  for (auto& k : keys) {
    for (int i = 0; i < 4; ++i) {
      uint64_t v = rng();
      std::memcpy(&k[i * 8], &v, 8);
    }
  }
  return keys;
}

constexpr size_t kChain = 16;

// Entry i is block i % kChain of chain i / kChain; a chain is on one node.
IndexEntry EntryFor(size_t i) {
  IndexEntry e;
  e.node_id = static_cast<uint32_t>(i / kChain % 16 + 1);
  e.region_id = static_cast<uint32_t>(i % 2);
  e.addr = uint64_t{i} * 65536;
  e.length = 65536;
  e.generation = i + 1;
  return e;
}

// The key of the block before entry i in its chain ("" for a head).
absl::string_view ParentOf(const std::vector<std::string>& keys, size_t i) {
  return i % kChain == 0 ? absl::string_view() : keys[i - 1];
}

void MeasureMemory() {
  const std::vector<std::string> keys = MakeKeys(g_entries, 1);
  {
    size_t before = HeapInUse();
    auto* index = new MetadataIndex;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!index->Upsert(keys[i], EntryFor(i), ParentOf(keys, i)).ok()) {
        std::abort();
      }
    }
    size_t after = HeapInUse();
    double per = double(after - before) / double(keys.size());
    std::printf("entries=%zu key_bytes=32\n", keys.size());
    std::printf("bytes_per_entry=%.1f\n", per);
    std::printf("estimated_bytes_per_entry=%.1f (MetadataIndex::MemoryBytes)\n",
                double(index->MemoryBytes()) / double(keys.size()));
    delete index;
  }
  {
    size_t before = HeapInUse();
    auto* naive = new absl::flat_hash_map<std::string, IndexEntry>;
    for (size_t i = 0; i < keys.size(); ++i) naive->emplace(keys[i], EntryFor(i));
    size_t after = HeapInUse();
    std::printf("naive_flat_hash_map_string_bytes_per_entry=%.1f\n",
                double(after - before) / double(keys.size()));
    delete naive;
  }
  std::fflush(stdout);
}

// Shared fixture data for the lookup benchmarks, built once.
struct LookupData {
  std::vector<std::string> keys;
  std::vector<std::string> misses;
  MetadataIndex index;
  LookupData() : keys(MakeKeys(g_entries, 2)), misses(MakeKeys(4096, 3)) {
    index.Reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!index.Upsert(keys[i], EntryFor(i), ParentOf(keys, i)).ok()) {
        std::abort();
      }
    }
  }
};

LookupData& Data() {
  static LookupData* d = new LookupData;
  return *d;
}

// One BatchLookup's worth of index work: 32 random present keys. The probe
// keys are copied into one contiguous buffer read sequentially (as a request
// would be), so the timing is the index's own cache misses.
void BM_LookupBatch32Hits(benchmark::State& state) {
  LookupData& d = Data();
  std::mt19937_64 rng(4);
  constexpr size_t kProbes = 1 << 16;
  std::string probes(kProbes * 32, '\0');
  for (size_t i = 0; i < kProbes; ++i) {
    std::memcpy(&probes[i * 32], d.keys[rng() % d.keys.size()].data(), 32);
  }
  size_t next = 0;
  for (auto _ : state) {
    uint64_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      absl::string_view key(&probes[(next++ & (kProbes - 1)) * 32], 32);
      auto e = d.index.Find(key);
      sum += e ? e->generation : 0;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_LookupBatch32Hits);

void BM_LookupBatch32Misses(benchmark::State& state) {
  LookupData& d = Data();
  size_t next = 0;
  for (auto _ : state) {
    uint64_t found = 0;
    for (int i = 0; i < 32; ++i) {
      found += d.index.Find(d.misses[next++ % d.misses.size()]).has_value();
    }
    benchmark::DoNotOptimize(found);
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_LookupBatch32Misses);

// A for_read BatchLookup's recency update: 32 random present keys moved to
// the most recent end of their node's list.
// Probe keys as in BM_LookupBatch32Hits.
void BM_TouchBatch32(benchmark::State& state) {
  LookupData& d = Data();
  std::mt19937_64 rng(5);
  constexpr size_t kProbes = 1 << 16;
  std::string probes(kProbes * 32, '\0');
  for (size_t i = 0; i < kProbes; ++i) {
    std::memcpy(&probes[i * 32], d.keys[rng() % d.keys.size()].data(), 32);
  }
  size_t next = 0;
  uint32_t tick = 1;
  for (auto _ : state) {
    for (int i = 0; i < 32; ++i) {
      absl::string_view key(&probes[(next++ & (kProbes - 1)) * 32], 32);
      benchmark::DoNotOptimize(d.index.Touch(key, tick));
    }
    ++tick;
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_TouchBatch32);

// A for_read BatchLookup of one whole chain (16 blocks, head first).
void BM_TouchPrefix16(benchmark::State& state) {
  LookupData& d = Data();
  std::mt19937_64 rng(6);
  const size_t chains = std::max<size_t>(1, d.keys.size() / kChain);
  std::vector<absl::string_view> chain(kChain);
  uint32_t tick = 1;
  for (auto _ : state) {
    const size_t first = (rng() % chains) * kChain;
    for (size_t j = 0; j < kChain; ++j) {
      chain[j] = d.keys[std::min(first + j, d.keys.size() - 1)];
    }
    benchmark::DoNotOptimize(d.index.TouchPrefix(chain, tick++));
  }
  state.SetItemsProcessed(state.iterations() * kChain);
}
BENCHMARK(BM_TouchPrefix16);

void BM_UpsertErase(benchmark::State& state) {
  LookupData& d = Data();
  size_t next = 0;
  for (auto _ : state) {
    const std::string& k = d.misses[next++ % d.misses.size()];
    benchmark::DoNotOptimize(d.index.Upsert(k, EntryFor(next)).ok());
    benchmark::DoNotOptimize(d.index.Erase(k));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UpsertErase);

}  // namespace
}  // namespace master
}  // namespace hymcache

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--entries=", 10) == 0) {
      hymcache::master::g_entries = std::strtoull(argv[i] + 10, nullptr, 10);
      // Hide our flag from Google Benchmark.
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
  }
  if (hymcache::master::g_entries == 0) hymcache::master::g_entries = 1;
  hymcache::master::MeasureMemory();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
