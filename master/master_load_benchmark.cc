// Start-up cost of the master: how long MasterService::Create takes to load
// a RocksDB metadata store of N committed objects, and the peak memory.
//
//   bazel run -c opt //master:master_load_benchmark -- --write
//   bazel run -c opt //master:master_load_benchmark
//   (--dir=/tmp/hym-master-load --entries=1000000 by default)
//
// --write (re)creates the store through the service's own API: one node,
// N objects of 64 KiB stored as chains of --chain blocks (one PutStart per
// chain, parent_key naming the previous chain's block for every other
// chain, 32-byte binary keys), then a read (for_read BatchLookup) of every
// other chain; the service is then closed as a daemon would be. Without
// --write only the load is timed. Prints per repetition (--reps, default 3)
// "load_seconds=..." (wall) and "load_cpu_seconds=..." (CPU time of the
// loading thread: the load runs on it, and this is the figure to compare
// on a busy machine), then "vm_hwm_mb=..." (peak resident memory of the
// process, so run the load without --write to see the load's own peak).
// First it prints "scan_seconds=..." for a bare MetadataStore::ForEachObject
// (the store's share of the load).
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "master/master_service.h"
#include "master/metadata_store.h"
#include "master/proving_heartbeat.h"
#include "proto/master.pb.h"

namespace hymcache {
namespace master {
namespace {

namespace v1 = ::hymcache::v1;

constexpr uint64_t kObjectBytes = 64 * 1024;

std::string KeyOf(uint64_t i) {
  std::mt19937_64 rng(i * 0x9e3779b97f4a7c15ull + 1);
  std::string k(32, '\0');
  for (int w = 0; w < 4; ++w) {
    uint64_t v = rng();
    std::memcpy(&k[w * 8], &v, 8);
  }
  return k;
}

// Set by --snapshot: the services use an index snapshot beside the store.
std::string g_snapshot;

std::unique_ptr<MetadataStore> OpenStore(const std::string& dir) {
  RocksDbMetadataStoreOptions so;
  so.path = dir;
  so.keep_wal_seconds = 3600;  // as MasterServer does with snapshots
  auto store = RocksDbMetadataStore::Create(so);
  if (!store.ok()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(),
                 store.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(store).value();
}

MasterServiceOptions ServiceOptions() {
  MasterServiceOptions o;
  o.node_timeout = absl::Hours(1);  // no heartbeats while writing
  o.max_batch_keys = 4096;
  o.read_lease = absl::ZeroDuration();
  // The master alone: its node holds no bytes and signs no receipts.
  o.require_write_receipts = false;
  o.snapshot_path = g_snapshot;
  return o;
}

void PutChains(MasterService* svc, uint64_t from, uint64_t to,
               uint64_t chain) {
  std::string parent = from > 0 ? KeyOf(from - 1) : "";
  for (uint64_t first = from; first < to; first += chain) {
    const uint64_t n = std::min(chain, to - first);
    v1::PutStartRequest put;
    for (uint64_t i = first; i < first + n; ++i) {
      put.add_keys(KeyOf(i));
      put.add_lengths(kObjectBytes);
    }
    // Every other chain continues the previous one.
    if ((first / chain) % 2 == 1) put.set_parent_key(parent);
    parent = KeyOf(first + n - 1);
    auto r = svc->PutStart(put);
    if (!r.ok()) {
      std::fprintf(stderr, "PutStart: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
    v1::PutCommitRequest commit;
    commit.set_put_id(r->put_id());
    if (!svc->PutCommit(commit).ok()) std::abort();
  }
}

void Write(const std::string& dir, uint64_t entries, uint64_t chain,
           uint64_t newer) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto svc = MasterService::Create(ServiceOptions(), OpenStore(dir));
  if (!svc.ok()) std::abort();
  v1::RegisterNodeRequest reg;
  reg.set_name("bench");
  reg.set_incarnation(1);
  reg.set_data_address("127.0.0.1:7000");
  reg.set_control_address("127.0.0.1:7001");
  auto* region = reg.add_regions();
  region->set_region_id(0);
  region->set_capacity_bytes(entries * kObjectBytes);
  region->set_alignment(4096);
  region->set_persistent(true);
  auto registered = (*svc)->RegisterNode(reg);
  if (!registered.ok()) std::abort();
  if (!(*svc)->Heartbeat(ProvingHeartbeat(reg, *registered)).ok()) std::abort();
  const auto start = std::chrono::steady_clock::now();
  PutChains(svc->get(), 0, entries, chain);
  for (uint64_t first = 0; first < entries; first += 2 * chain) {
    v1::BatchLookupRequest look;
    look.set_for_read(true);
    for (uint64_t i = first; i < std::min(first + chain, entries); ++i) {
      look.add_keys(KeyOf(i));
    }
    if (!(*svc)->BatchLookup(look).ok()) std::abort();
  }
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  std::printf("wrote entries=%llu chain=%llu in %.2f s\n",
              static_cast<unsigned long long>(entries),
              static_cast<unsigned long long>(chain), secs);
  std::string saved;
  if (!g_snapshot.empty() && newer > 0) {
    // A periodic snapshot, then `newer` more objects, then a kill -9: the
    // next start-up replays them from the store's log.
    if (!(*svc)->WriteSnapshot().ok()) std::abort();
    saved = g_snapshot + ".saved";
    std::filesystem::copy_file(
        g_snapshot, saved, std::filesystem::copy_options::overwrite_existing);
    PutChains(svc->get(), entries, entries + newer, chain);
    std::printf("then %llu more objects after the snapshot\n",
                static_cast<unsigned long long>(newer));
  }
  svc->reset();  // closes the store as a shutting-down daemon does
  if (!saved.empty()) {
    std::filesystem::rename(saved, g_snapshot);
  }
}

double ThreadCpuSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void Load(const std::string& dir, int reps) {
  {
    // The store's share: one scan that only counts.
    auto store = OpenStore(dir);
    const auto start = std::chrono::steady_clock::now();
    uint64_t n = 0;
    absl::Status s = store->ForEachObject(
        [&](absl::string_view, const ObjectRecord&) { ++n; });
    if (!s.ok()) std::abort();
    std::printf("scan_seconds=%.3f objects=%llu\n",
                std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - start)
                    .count(),
                static_cast<unsigned long long>(n));
  }
  for (int rep = 0; rep < reps; ++rep) {
    auto store = OpenStore(dir);
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuSeconds();
    auto svc = MasterService::Create(ServiceOptions(), std::move(store));
    const double cpu = ThreadCpuSeconds() - cpu_start;
    const double secs = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    if (!svc.ok()) {
      std::fprintf(stderr, "load: %s\n", svc.status().ToString().c_str());
      std::exit(1);
    }
    const char* path = "scan";
    switch ((*svc)->load_path()) {
      case MasterService::LoadPath::kSnapshot: path = "snapshot"; break;
      case MasterService::LoadPath::kCarefulScan: path = "careful"; break;
      case MasterService::LoadPath::kScan: break;
    }
    std::printf(
        "load_seconds=%.3f load_cpu_seconds=%.3f objects=%llu path=%s\n",
        secs, cpu,
        static_cast<unsigned long long>((*svc)->GetStats().object_count()),
        path);
    // Each repetition loads the same state: no snapshot at its close. (A
    // load that scanned writes one, for the next repetition.)
    if ((*svc)->load_path() == MasterService::LoadPath::kSnapshot) {
      const std::string keep = g_snapshot + ".keep";
      std::filesystem::copy_file(
          g_snapshot, keep, std::filesystem::copy_options::overwrite_existing);
      svc->reset();
      std::filesystem::rename(keep, g_snapshot);
    }
    std::fflush(stdout);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("vm_hwm_mb=%.0f\n", ru.ru_maxrss / 1024.0);
}

}  // namespace
}  // namespace master
}  // namespace hymcache

int main(int argc, char** argv) {
  std::string dir = "/tmp/hym-master-load";
  uint64_t entries = 1000000;
  uint64_t chain = 16;
  int reps = 3;
  bool write = false;
  uint64_t newer = 0;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--dir=", 6) == 0) {
      dir = a + 6;
    } else if (std::strncmp(a, "--entries=", 10) == 0) {
      entries = std::strtoull(a + 10, nullptr, 10);
    } else if (std::strncmp(a, "--chain=", 8) == 0) {
      chain = std::strtoull(a + 8, nullptr, 10);
    } else if (std::strncmp(a, "--reps=", 7) == 0) {
      reps = std::atoi(a + 7);
    } else if (std::strcmp(a, "--write") == 0) {
      write = true;
    } else if (std::strcmp(a, "--snapshot") == 0) {
      hymcache::master::g_snapshot = dir + ".snapshot";
    } else if (std::strncmp(a, "--newer=", 8) == 0) {
      newer = std::strtoull(a + 8, nullptr, 10);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a);
      return 2;
    }
  }
  if (entries == 0 || chain == 0 || chain > 4096) {
    std::fprintf(stderr, "--entries must be > 0, --chain 1..4096\n");
    return 2;
  }
  if (!hymcache::master::g_snapshot.empty()) {
    hymcache::master::g_snapshot = dir + ".snapshot";  // after --dir
  }
  if (write) hymcache::master::Write(dir, entries, chain, newer);
  hymcache::master::Load(dir, reps);
  return 0;
}
