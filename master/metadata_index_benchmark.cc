// Memory and latency of the master's metadata index, and of the master's
// locking path under a concurrent mix.
//
//   bazel run -c opt //master:metadata_index_benchmark
//   bazel run -c opt //master:metadata_index_benchmark --
//       --entries=100000000 --key_sizes=32
//   bazel run -c opt //master:metadata_index_benchmark --
//       --entries=0 --mix_threads=8
//
// Part 1, the index alone (MetadataIndex), for each key size in --key_sizes
// (default 32,64) at --entries (default 10,000,000; 100 M needs about 8 GB
// per key size of 32 bytes): N binary keys stored as chains of 16 blocks
// (each linked to the block before it) on 16 nodes, as the client stores
// them. Keys are generated from their number, so the benchmark itself holds
// no per-entry memory. Prints one line per key size:
//   bytes_per_entry   heap bytes per entry (mallinfo2 delta over the inserts)
//   estimated         MetadataIndex::MemoryBytes() / N
//   lookup32_us       a BatchLookup's index work: 32 random present keys
//                     (mean, p50 and p99 over batches)
//   miss32_us         32 absent keys
//   signed32_us       32 present keys, a capability signed after each
//                     Find (a packed BatchLookup's loop)
//   prefetched32_us   the same after MetadataIndex::Prefetch of the 32
//   touch32_us        a for_read BatchLookup's recency update of 32 keys
//   prefix16_us       TouchPrefix of one whole 16-block chain
//   upsert_erase_ns   one Upsert of a new key and its Erase
// With --naive, also the heap bytes per entry of a plain
// absl::flat_hash_map<std::string, ObjectLocation> (for comparison).
//
// Part 2, the master's locking path (--mix_threads, default 8; 0 skips it):
// a MasterService over a RocksDB store in a temporary directory, one node
// whose region holds --mix_objects (default 100,000) 64 KiB objects, filled
// first, then --mix_threads client threads for --mix_seconds (default 3)
// each issuing, at random: a for_read BatchLookup of 32 keys (80%), a put
// of a 4-block chain (PutStart + PutCommit; the region is full, so every put
// evicts least recent chains first) (15%), a Remove of one such chain (5%).
// No read leases (they would lease the whole region). Prints per operation
// kind the count and latency p50 / p99 / max in µs.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/capability.h"
#include "master/master_service.h"
#include "master/metadata_index.h"
#include "master/metadata_store.h"
#include "master/proving_heartbeat.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;
using Clock = std::chrono::steady_clock;

struct Flags {
  uint64_t entries = 10000000;
  std::vector<size_t> key_sizes = {32, 64};
  bool naive = false;
  int mix_threads = 8;
  uint64_t mix_objects = 100000;
  double mix_seconds = 3;
};
Flags g_flags;

size_t HeapInUse() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;  // arena chunks in use + mmapped chunks
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Key number i of `size` bytes (a multiple of 8) into `out`.
void MakeKey(uint64_t i, size_t size, char* out) {
  for (size_t w = 0; w < size / 8; ++w) {
    const uint64_t v = SplitMix(i * 8 + w);
    std::memcpy(out + w * 8, &v, 8);
  }
}
std::string Key(uint64_t i, size_t size) {
  std::string k(size, '\0');
  MakeKey(i, size, k.data());
  return k;
}

constexpr uint64_t kChain = 16;

// Entry i is block i % kChain of chain i / kChain; a chain is on one node.
ObjectLocation EntryFor(uint64_t i) {
  ObjectLocation e;
  e.node_id = static_cast<uint32_t>(i / kChain % 16 + 1);
  e.region_id = static_cast<uint32_t>(i % 2);
  e.addr = i * 65536;
  e.length = 65536;
  e.generation = i + 1;
  return e;
}

// Latency percentiles of `samples` (sorted in place), in the samples' unit.
struct Percentiles {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};
Percentiles Summarize(std::vector<double>& samples) {
  Percentiles p;
  if (samples.empty()) return p;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double s : samples) sum += s;
  p.mean = sum / double(samples.size());
  p.p50 = samples[samples.size() / 2];
  p.p99 = samples[std::min(samples.size() - 1, samples.size() * 99 / 100)];
  p.max = samples.back();
  return p;
}

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// `probes` random keys of the first `n` (or, with `absent`, keys not
// stored) in one contiguous buffer, read sequentially as a request's keys
// would be, so timings are the index's own cache misses.
std::string ProbeKeys(uint64_t n, size_t key_size, size_t probes,
                      uint64_t seed, bool absent) {
  std::mt19937_64 rng(seed);
  std::string out(probes * key_size, '\0');
  for (size_t p = 0; p < probes; ++p) {
    const uint64_t i = absent ? n + 1 + rng() % (uint64_t{1} << 40) : rng() % n;
    MakeKey(i, key_size, &out[p * key_size]);
  }
  return out;
}

// Times `batches` calls of `fn(batch number)`, in µs per call.
template <typename Fn>
Percentiles TimeBatches(size_t batches, const Fn& fn) {
  std::vector<double> us;
  us.reserve(batches);
  for (size_t b = 0; b < batches; ++b) {
    const auto start = Clock::now();
    fn(b);
    us.push_back(Micros(Clock::now() - start));
  }
  return Summarize(us);
}

void IndexPart(size_t key_size) {
  const uint64_t n = g_flags.entries;
  std::string key(key_size, '\0');
  std::string parent(key_size, '\0');
  const size_t before = HeapInUse();
  auto index = std::make_unique<MetadataIndex>();
  const auto fill_start = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    MakeKey(i, key_size, key.data());
    absl::string_view p;
    if (i % kChain != 0) {
      MakeKey(i - 1, key_size, parent.data());
      p = parent;
    }
    if (!index->Upsert(key, EntryFor(i), p).ok()) std::abort();
  }
  const double fill_s =
      std::chrono::duration<double>(Clock::now() - fill_start).count();
  const size_t after = HeapInUse();
  const double per = double(after - before) / double(n);
  const double estimated = double(index->MemoryBytes()) / double(n);

  constexpr size_t kProbes = size_t{1} << 16;
  constexpr size_t kBatches = 20000;
  const std::string hits = ProbeKeys(n, key_size, kProbes, 4, false);
  const std::string misses = ProbeKeys(n, key_size, kProbes, 5, true);
  auto probe = [&](const std::string& buf, size_t k) {
    return absl::string_view(&buf[(k & (kProbes - 1)) * key_size], key_size);
  };
  uint64_t sum = 0;
  const Percentiles lookup = TimeBatches(kBatches, [&](size_t b) {
    for (size_t k = 0; k < 32; ++k) {
      auto e = index->Find(probe(hits, b * 32 + k));
      sum += e ? e->generation : 0;
    }
  });
  const Percentiles miss = TimeBatches(kBatches, [&](size_t b) {
    for (size_t k = 0; k < 32; ++k) {
      sum += index->Find(probe(misses, b * 32 + k)).has_value();
    }
  });
  // A packed BatchLookup's loop: a capability signed after each Find. The
  // signing keeps the CPU from reaching the next key's loads by itself;
  // then the same after MetadataIndex::Prefetch of the batch's keys, as
  // MasterService::LookupLocked does.
  const HmacSha256 mac(std::string(32, 'k'));
  auto signed_batches = [&](bool prefetch) {
    return TimeBatches(kBatches, [&](size_t b) {
      absl::string_view keys[32];
      for (size_t k = 0; k < 32; ++k) keys[k] = probe(hits, b * 32 + k);
      if (prefetch) index->Prefetch(keys);
      for (absl::string_view key : keys) {
        auto e = index->Find(key);
        if (!e) continue;
        CapabilityScope scope;
        scope.node_id = e->node_id;
        scope.addr = e->addr;
        scope.generation = e->generation;
        sum += SignCapability(mac, scope).tag[0];
      }
    });
  };
  const Percentiles signed32 = signed_batches(false);
  const Percentiles prefetched32 = signed_batches(true);
  const std::string touches = ProbeKeys(n, key_size, kProbes, 6, false);
  const Percentiles touch = TimeBatches(kBatches, [&](size_t b) {
    for (size_t k = 0; k < 32; ++k) {
      sum += index->Touch(probe(touches, b * 32 + k),
                          static_cast<uint32_t>(b + 1));
    }
  });
  std::mt19937_64 rng(7);
  std::vector<std::string> chain(kChain);
  std::vector<absl::string_view> views(kChain);
  const uint64_t chains = std::max<uint64_t>(1, n / kChain);
  // The chain's keys are made first; only TouchPrefix is timed.
  std::vector<double> prefix_us;
  prefix_us.reserve(kBatches);
  for (size_t b = 0; b < kBatches; ++b) {
    const uint64_t first = (rng() % chains) * kChain;
    for (uint64_t j = 0; j < kChain; ++j) {
      chain[j] = Key(std::min(first + j, n - 1), key_size);
      views[j] = chain[j];
    }
    const auto start = Clock::now();
    sum += index->TouchPrefix(views, static_cast<uint32_t>(b + 1));
    prefix_us.push_back(Micros(Clock::now() - start));
  }
  const Percentiles prefix16 = Summarize(prefix_us);
  constexpr size_t kChurn = 200000;
  const auto churn_start = Clock::now();
  for (size_t k = 0; k < kChurn; ++k) {
    const absl::string_view m = probe(misses, k);
    sum += index->Upsert(m, EntryFor(k)).ok();
    sum += index->Erase(m).has_value();
  }
  const double churn_ns =
      std::chrono::duration<double, std::nano>(Clock::now() - churn_start)
          .count() /
      double(kChurn);
  std::printf(
      "key_bytes=%zu entries=%llu bytes_per_entry=%.1f estimated=%.1f "
      "fill_s=%.1f lookup32_us(mean/p50/p99)=%.2f/%.2f/%.2f "
      "miss32_us=%.2f/%.2f/%.2f signed32_us=%.2f/%.2f/%.2f "
      "prefetched32_us=%.2f/%.2f/%.2f touch32_us=%.2f/%.2f/%.2f "
      "prefix16_us=%.2f/%.2f/%.2f upsert_erase_ns=%.0f (checksum %llu)\n",
      key_size, static_cast<unsigned long long>(n), per, estimated, fill_s,
      lookup.mean, lookup.p50, lookup.p99, miss.mean, miss.p50, miss.p99,
      signed32.mean, signed32.p50, signed32.p99, prefetched32.mean,
      prefetched32.p50, prefetched32.p99, touch.mean, touch.p50, touch.p99,
      prefix16.mean, prefix16.p50, prefix16.p99, churn_ns,
      static_cast<unsigned long long>(sum % 1000));
  std::fflush(stdout);
  index.reset();

  if (g_flags.naive) {
    const size_t nb = HeapInUse();
    auto naive = std::make_unique<absl::flat_hash_map<std::string, ObjectLocation>>();
    for (uint64_t i = 0; i < n; ++i) naive->emplace(Key(i, key_size), EntryFor(i));
    std::printf("key_bytes=%zu naive_flat_hash_map_string_bytes_per_entry=%.1f\n",
                key_size, double(HeapInUse() - nb) / double(n));
    std::fflush(stdout);
  }
}

// Part 2.

constexpr uint64_t kObjectBytes = 64 * 1024;
constexpr uint64_t kMixChain = 4;

std::unique_ptr<MetadataStore> OpenStore(const std::string& dir) {
  RocksDbMetadataStoreOptions so;
  so.path = dir;
  auto store = RocksDbMetadataStore::Create(so);
  if (!store.ok()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(),
                 store.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(store).value();
}

// A put of the chain of keys [first, first + kMixChain); false if refused.
bool PutChain(MasterService* svc, uint64_t first) {
  v1::PutStartRequest put;
  for (uint64_t i = first; i < first + kMixChain; ++i) {
    put.add_keys(Key(i, 32));
    put.add_lengths(kObjectBytes);
  }
  auto r = svc->PutStart(put);
  if (!r.ok()) return false;
  v1::PutCommitRequest commit;
  commit.set_put_id(r->put_id());
  return svc->PutCommit(commit).ok();
}

// A service over a fresh store in `dir` with one node ("bench") whose one
// region holds mix_objects objects, filled with chains; *filled: the key
// numbers used.
std::unique_ptr<MasterService> OpenMixService(const std::string& dir,
                                              uint64_t* filled) {
  MasterServiceOptions o;
  o.node_timeout = absl::Hours(1);  // no heartbeats in the benchmark
  o.max_batch_keys = 4096;
  // No read leases: with 5 s of them, the lookups below would lease the
  // whole region and refuse the puts instead of evicting.
  o.read_lease = absl::ZeroDuration();
  // The master alone: its node holds no bytes and signs no receipts.
  o.require_write_receipts = false;
  auto svc_or = MasterService::Create(o, OpenStore(dir));
  if (!svc_or.ok()) {
    std::fprintf(stderr, "master: %s\n", svc_or.status().ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<MasterService> svc = std::move(svc_or).value();
  v1::RegisterNodeRequest reg;
  reg.set_name("bench");
  reg.set_incarnation(1);
  reg.set_data_address("127.0.0.1:7000");
  reg.set_control_address("127.0.0.1:7001");
  auto* region = reg.add_regions();
  region->set_region_id(0);
  region->set_capacity_bytes(g_flags.mix_objects * kObjectBytes);
  region->set_alignment(4096);
  auto registered = svc->RegisterNode(reg);
  if (!registered.ok()) std::abort();
  if (!svc->Heartbeat(ProvingHeartbeat(reg, *registered)).ok()) std::abort();
  *filled = g_flags.mix_objects / kMixChain * kMixChain;
  for (uint64_t first = 0; first < *filled; first += kMixChain) {
    if (!PutChain(svc.get(), first)) std::abort();
  }
  return svc;
}

// What one mix thread measured (latencies in µs).
struct MixSamples {
  std::vector<double> lookup, put, remove;
  uint64_t lookup_hits = 0, lookup_keys = 0, put_refused = 0;

  void Add(const MixSamples& s) {
    lookup.insert(lookup.end(), s.lookup.begin(), s.lookup.end());
    put.insert(put.end(), s.put.begin(), s.put.end());
    remove.insert(remove.end(), s.remove.begin(), s.remove.end());
    lookup_hits += s.lookup_hits;
    lookup_keys += s.lookup_keys;
    put_refused += s.put_refused;
  }
};

// One mix thread until `stop`: 80% lookups of 32 keys, 15% chain puts, 5%
// chain removes. Key numbers come from `next_key`; lookups and removes pick
// among the most recent mix_objects of them (some evicted meanwhile:
// misses).
void MixThread(MasterService* svc, uint64_t seed,
               std::atomic<uint64_t>* next_key, const std::atomic<bool>* stop,
               MixSamples* s) {
  std::mt19937_64 rng(seed);
  while (!stop->load(std::memory_order_relaxed)) {
    const uint64_t top = next_key->load(std::memory_order_relaxed);
    const uint64_t span = std::min<uint64_t>(top, g_flags.mix_objects);
    const unsigned dice = rng() % 100;
    if (dice < 80) {
      v1::BatchLookupRequest look;
      look.set_for_read(true);
      for (int k = 0; k < 32; ++k) {
        look.add_keys(Key(top - 1 - rng() % span, 32));
      }
      const auto start = Clock::now();
      auto r = svc->BatchLookup(look);
      s->lookup.push_back(Micros(Clock::now() - start));
      if (!r.ok()) std::abort();
      for (const auto& res : r->results()) s->lookup_hits += res.found();
      s->lookup_keys += 32;
    } else if (dice < 95) {
      const uint64_t first = next_key->fetch_add(kMixChain);
      const auto start = Clock::now();
      const bool ok = PutChain(svc, first);
      s->put.push_back(Micros(Clock::now() - start));
      s->put_refused += !ok;
    } else {
      // One whole chain, tail first (a chain's middle would leave
      // orphans for the master to sweep: a walk of the node's list).
      v1::RemoveRequest remove;
      const uint64_t first = (top - 1 - rng() % span) / kMixChain * kMixChain;
      for (uint64_t k = kMixChain; k > 0; --k) {
        remove.add_keys(Key(first + k - 1, 32));
      }
      const auto start = Clock::now();
      auto r = svc->Remove(remove);
      s->remove.push_back(Micros(Clock::now() - start));
      if (!r.ok()) std::abort();
    }
  }
}

// False (and why, on stderr) if the mix measured nothing: no operations
// ran, or every put was refused.
bool MixPart() {
  const std::string dir = "/tmp/hym-index-bench-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  uint64_t filled = 0;
  std::unique_ptr<MasterService> svc = OpenMixService(dir, &filled);
  std::atomic<uint64_t> next_key{filled};
  std::atomic<bool> stop{false};
  std::vector<MixSamples> samples(g_flags.mix_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < g_flags.mix_threads; ++t) {
    threads.emplace_back(MixThread, svc.get(), uint64_t{100} + t, &next_key,
                         &stop, &samples[t]);
  }
  std::this_thread::sleep_for(
      std::chrono::duration<double>(g_flags.mix_seconds));
  stop = true;
  for (auto& th : threads) th.join();
  MixSamples all;
  for (const MixSamples& s : samples) all.Add(s);
  const v1::GetStatsResponse stats = svc->GetStats();
  auto line = [&](const char* what, std::vector<double>& v) {
    const size_t count = v.size();
    const Percentiles p = Summarize(v);
    std::printf("mix threads=%d op=%s count=%zu per_s=%.0f p50_us=%.1f "
                "p99_us=%.1f max_us=%.1f\n",
                g_flags.mix_threads, what, count,
                double(count) / g_flags.mix_seconds, p.p50, p.p99, p.max);
  };
  line("batch_lookup32_for_read", all.lookup);
  line("put_chain4", all.put);
  line("remove4", all.remove);
  std::printf("mix objects=%llu lookup_hit_ratio=%.3f puts_refused=%llu "
              "objects_now=%llu\n",
              static_cast<unsigned long long>(g_flags.mix_objects),
              all.lookup_keys ? double(all.lookup_hits) / all.lookup_keys : 0,
              static_cast<unsigned long long>(all.put_refused),
              static_cast<unsigned long long>(stats.object_count()));
  std::fflush(stdout);
  svc.reset();
  std::filesystem::remove_all(dir);
  const size_t ops = all.lookup.size() + all.put.size() + all.remove.size();
  if (ops == 0) {
    std::fprintf(stderr, "mix: no operation completed in %.3f s\n",
                 g_flags.mix_seconds);
    return false;
  }
  if (!all.put.empty() && all.put_refused == all.put.size()) {
    std::fprintf(stderr, "mix: every one of %zu puts was refused\n",
                 all.put.size());
    return false;
  }
  return true;
}

bool ParseFlag(const char* arg) {
  absl::string_view a(arg);
  auto value = [&](absl::string_view name, absl::string_view* out) {
    if (!absl::ConsumePrefix(&a, name)) return false;
    *out = a;
    return true;
  };
  absl::string_view v;
  if (value("--entries=", &v)) return absl::SimpleAtoi(v, &g_flags.entries);
  if (value("--mix_threads=", &v)) {
    return absl::SimpleAtoi(v, &g_flags.mix_threads) && g_flags.mix_threads >= 0;
  }
  if (value("--mix_objects=", &v)) {
    return absl::SimpleAtoi(v, &g_flags.mix_objects) &&
           g_flags.mix_objects >= kMixChain;
  }
  if (value("--mix_seconds=", &v)) {
    return absl::SimpleAtod(v, &g_flags.mix_seconds) && g_flags.mix_seconds > 0;
  }
  if (value("--key_sizes=", &v)) {
    g_flags.key_sizes.clear();
    for (absl::string_view s : absl::StrSplit(v, ',')) {
      size_t size;
      if (!absl::SimpleAtoi(s, &size) || size == 0 || size % 8 != 0 ||
          size > 256) {
        return false;
      }
      g_flags.key_sizes.push_back(size);
    }
    return true;
  }
  if (a == "--naive") return g_flags.naive = true;
  return false;
}

}  // namespace
}  // namespace master
}  // namespace hymcache

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!hymcache::master::ParseFlag(argv[i])) {
      std::fprintf(stderr,
                   "bad flag %s\nflags: --entries=N (0: no index part) "
                   "--key_sizes=32,64 (multiples of 8) --naive "
                   "--mix_threads=N (0: no mix) --mix_objects=N "
                   "--mix_seconds=S\n",
                   argv[i]);
      return 2;
    }
  }
  using hymcache::master::g_flags;
  if (g_flags.entries == 0 && g_flags.mix_threads <= 0) {
    std::fprintf(stderr, "--entries=0 and --mix_threads=0: nothing to measure\n");
    return 2;
  }
  if (g_flags.entries > 0) {
    for (size_t size : g_flags.key_sizes) hymcache::master::IndexPart(size);
  }
  if (g_flags.mix_threads > 0 && !hymcache::master::MixPart()) return 1;
  return 0;
}
