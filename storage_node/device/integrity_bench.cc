// integrity_bench: what the hybrid device's object checksums cost, on a real
// capacity file (O_DIRECT where the filesystem allows it).
//
//   bazel run -c opt //storage_node/device:integrity_bench -- --dir=/tmp --gib=2
//
// Phases, each printed on one line:
//   write   one writer commits --gib GiB of --object_kib objects as fast as
//           the write buffer admits them (a refusal waits 100 us and
//           retries), then waits until all of it is durable: the commit and
//           flush rates, and the time CommitWrite spent computing CRC32Cs
//           (its share, and the rate it checksums at);
//   record  --records times, on a separate small file: write an 8 MiB
//           batch, then CapacityTier::Record it; the fdatasync that Record
//           makes first and the synced RocksDB write, timed apart;
//   open    reopen the capacity file: verify_on_open reads and checks every
//           object; its time, in seconds per GiB;
//   reads   --readers threads read every object once from the tier
//           (staging misses), with verify_reads off and then on.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/crc32c.h"
#include "common/thread.h"
#include "gflags/gflags.h"
#include "storage_node/device/capacity_tier.h"
#include "storage_node/device/hybrid_device.h"

DEFINE_string(dir, "/tmp", "directory for the capacity files");
DEFINE_double(gib, 2, "GiB written (and verified, and read)");
DEFINE_uint64(object_kib, 1024, "object size in KiB");
DEFINE_uint64(write_buffer_mib, 64, "write buffer in MiB");
DEFINE_int32(records, 10, "timed Record calls");
DEFINE_int32(readers, 4, "reader threads of the read phase");

namespace hymcache::storage {
namespace {

double Gb(uint64_t bytes) { return static_cast<double>(bytes) / 1e9; }

bool DirectWorks(const std::string& dir) {
  const std::string probe = dir + "/integrity_bench.probe";
  int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0;
}

void Remove(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::filesystem::remove_all(path + ".meta", ec);
}

CapacityTierOptions TierOptions(const std::string& path, uint64_t capacity) {
  CapacityTierOptions t;
  t.path = path;
  t.capacity_bytes = capacity;
  t.node_name = "integrity-bench";
  t.io.direct = DirectWorks(FLAGS_dir);
  t.allow_overcommit = true;
  return t;
}

std::unique_ptr<HybridDevice> OpenDevice(const CapacityTierOptions& t,
                                         const HybridDeviceOptions& h) {
  auto tier = CapacityTier::Open(t);
  if (!tier.ok()) {
    std::fprintf(stderr, "open %s: %s\n", t.path.c_str(),
                 tier.status().ToString().c_str());
    std::exit(1);
  }
  auto dev = HybridDevice::Create(h, std::move(*tier));
  if (!dev.ok()) {
    std::fprintf(stderr, "device: %s\n", dev.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*dev);
}

// Reads every object once through `readers` threads; GB/s.
double ReadAll(HybridDevice* dev, uint64_t objects, uint64_t obj, int readers,
               std::atomic<int>* errors) {
  std::atomic<uint64_t> next{0};
  const absl::Time start = absl::Now();
  {
    std::vector<std::unique_ptr<Thread>> threads;
    for (int i = 0; i < readers; ++i) {
      threads.push_back(std::make_unique<Thread>("bench-read", [&] {
        for (uint64_t k = next++; k < objects; k = next++) {
          auto r = dev->AcquireRead(0, k * obj, obj);
          if (!r.ok()) {
            ++*errors;
            continue;
          }
          dev->ReleaseRead(*r);
        }
      }));
    }
  }
  return Gb(objects * obj) / absl::ToDoubleSeconds(absl::Now() - start);
}

// What a synced Record costs after a batch's fdatasync (FLAGS_records
// rounds on their own capacity file); false on an I/O error.
bool MeasureRecord() {
  const std::string rpath = FLAGS_dir + "/integrity_bench_rec.cap";
  Remove(rpath);
  const uint64_t batch = 8 << 20;
  auto tier = CapacityTier::Open(TierOptions(rpath, FLAGS_records * batch));
  if (!tier.ok()) return false;
  AlignedBuffer buf = AllocateAligned(batch);
  std::memset(buf.get(), 0x5C, batch);
  const uint32_t crc = crc32c::Value(buf.get(), batch);
  absl::Duration sync_total, record_total;
  for (int i = 0; i < FLAGS_records; ++i) {
    const uint64_t addr = static_cast<uint64_t>(i) * batch;
    if (!(*tier)->io()->WriteSync(CapacityTier::kHeaderBytes + addr, buf.get(),
                                  batch).ok()) {
      return false;
    }
    const absl::Time r0 = absl::Now();
    if (!(*tier)->io()->Sync().ok()) return false;
    const absl::Time r1 = absl::Now();
    // Record syncs again (nothing is dirty now): ~ the RocksDB write.
    if (!(*tier)->Record({DurableExtent{addr, batch, 1, true, crc}}).ok()) {
      return false;
    }
    const absl::Time r2 = absl::Now();
    sync_total += r1 - r0;
    record_total += r2 - r1;
  }
  std::printf("record  fdatasync after an 8 MiB batch %.2f ms, then Record "
              "(synced RocksDB write) %.2f ms (means of %d)\n",
              absl::ToDoubleMilliseconds(sync_total) / FLAGS_records,
              absl::ToDoubleMilliseconds(record_total) / FLAGS_records,
              FLAGS_records);
  tier->reset();
  Remove(rpath);
  return true;
}

int Run() {
  const uint64_t obj = FLAGS_object_kib << 10;
  const uint64_t objects =
      static_cast<uint64_t>(FLAGS_gib * (1 << 30)) / obj;
  const uint64_t total = objects * obj;
  const uint64_t capacity = (total + (64 << 20)) / 4096 * 4096;
  const std::string path = FLAGS_dir + "/integrity_bench.cap";
  Remove(path);
  const CapacityTierOptions t = TierOptions(path, capacity);
  std::printf("integrity_bench: %s (%s), %.2f GiB of %llu KiB objects, "
              "crc32c %s\n",
              path.c_str(), t.io.direct ? "O_DIRECT" : "buffered",
              FLAGS_gib, static_cast<unsigned long long>(FLAGS_object_kib),
              crc32c::Implementation());

  HybridDeviceOptions h;
  h.staging_bytes = 64 << 20;
  h.write_buffer_bytes = FLAGS_write_buffer_mib << 20;
  h.max_bounce_bytes = 256 << 20;

  // ---- write
  auto dev = OpenDevice(t, h);
  std::vector<uint8_t> pattern(obj);
  for (uint64_t i = 0; i < obj; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + 7);
  uint64_t refusals = 0;
  const absl::Time w0 = absl::Now();
  for (uint64_t k = 0; k < objects; ++k) {
    auto w = dev->BeginWrite(0, k * obj, obj, k + 1);
    if (!w.ok()) {
      ++refusals;
      absl::SleepFor(absl::Microseconds(100));
      --k;
      continue;
    }
    std::memcpy(w->data, pattern.data(), obj);
    std::memcpy(w->data, &k, sizeof(k));  // objects differ
    if (!dev->CommitWrite(*w).ok()) return 1;
  }
  const absl::Time w1 = absl::Now();
  if (!dev->WaitFlushedForTest(absl::Now() + absl::Minutes(10), true)) {
    std::fprintf(stderr, "flush did not finish\n");
    return 1;
  }
  const absl::Time w2 = absl::Now();
  HybridDeviceStats s = dev->HybridStats();
  const double flush_s = absl::ToDoubleSeconds(w2 - w0);
  const double crc_s = s.commit_checksum_seconds;
  std::printf("write   committed %.2f GB/s, durable %.2f GB/s (%.2f s, %llu "
              "refusals); CommitWrite checksumming %.3f s = %.1f%% of the "
              "time to durable, %.2f GB/s\n",
              Gb(total) / absl::ToDoubleSeconds(w1 - w0), Gb(total) / flush_s,
              flush_s, static_cast<unsigned long long>(refusals), crc_s,
              100 * crc_s / flush_s, crc_s > 0 ? Gb(total) / crc_s : 0);
  dev.reset();

  // ---- record
  if (!MeasureRecord()) return 1;

  // ---- open
  dev = OpenDevice(t, h);
  s = dev->HybridStats();
  std::printf("open    verified %llu objects, %.2f GB in %.3f s: %.2f GB/s, "
              "%.3f s per GiB; %llu dropped\n",
              static_cast<unsigned long long>(s.open_verified_objects),
              Gb(s.open_verified_bytes), s.open_verify_seconds,
              s.open_verify_seconds > 0
                  ? Gb(s.open_verified_bytes) / s.open_verify_seconds
                  : 0,
              s.open_verify_seconds /
                  (static_cast<double>(s.open_verified_bytes) / (1 << 30)),
              static_cast<unsigned long long>(s.open_dropped_objects));

  // ---- reads
  std::atomic<int> errors{0};
  const double plain = ReadAll(dev.get(), objects, obj, FLAGS_readers, &errors);
  dev.reset();
  h.verify_on_open = false;
  h.verify_reads = true;
  dev = OpenDevice(t, h);
  const double checked = ReadAll(dev.get(), objects, obj, FLAGS_readers, &errors);
  s = dev->HybridStats();
  std::printf("reads   %d readers: %.2f GB/s unchecked, %.2f GB/s with "
              "verify_reads (%llu checked, %llu mismatches, %d errors)\n",
              FLAGS_readers, plain, checked,
              static_cast<unsigned long long>(s.verified_reads),
              static_cast<unsigned long long>(s.read_checksum_failures),
              errors.load());
  dev.reset();
  Remove(path);
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hymcache::storage

int main(int argc, char** argv) {
  hymcache::ParseCommandLine({.program = "integrity_bench",
                              .usage = "integrity_bench: what the hybrid "
                                       "device's object checksums cost, on a "
                                       "real capacity file",
                              .main_file = __FILE__},
                             &argc, &argv);
  return hymcache::storage::Run();
}
