#include "storage_node/device/dram_device.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

// The bytes of each region (all of `region_bytes` but the last).
uint64_t RegionBytes(const DramDeviceOptions& o) {
  if (o.max_region_bytes == 0 || o.capacity_bytes <= o.max_region_bytes) {
    return o.capacity_bytes;
  }
  return o.max_region_bytes / o.alignment * o.alignment;
}

}  // namespace

absl::Status DramDeviceOptions::Validate() const {
  if (capacity_bytes == 0) {
    return absl::InvalidArgumentError("dram device: capacity_bytes must be > 0");
  }
  if (capacity_bytes > (uint64_t{1} << 56)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram device: capacity_bytes ", capacity_bytes,
                     " is implausibly large"));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dram device: alignment ", alignment, " is not a power of two"));
  }
  if (numa_node < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram device: numa_node ", numa_node, " (want >= -1)"));
  }
  if (max_region_bytes != 0 && max_region_bytes < alignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("dram device: max_region_bytes ", max_region_bytes,
                     " is below the alignment ", alignment));
  }
  const uint64_t each = RegionBytes(*this);
  const uint64_t count = (capacity_bytes + each - 1) / each;
  if (count > kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dram device: max_region_bytes ", max_region_bytes, " would split ",
        capacity_bytes, " bytes into ", count, " regions (max ", kMaxRegions,
        ")"));
  }
  if (count - 1 > std::numeric_limits<uint32_t>::max() - region_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dram device: region ids ", region_id, " + ", count,
        " regions overflow"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DramDevice>> DramDevice::Create(
    const DramDeviceOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;

  const uint64_t each = RegionBytes(options);
  std::vector<Region> regions;
  for (uint64_t off = 0; off < options.capacity_bytes; off += each) {
    Region r;
    r.id = options.region_id + static_cast<uint32_t>(regions.size());
    r.capacity = std::min(each, options.capacity_bytes - off);
    HostMemoryOptions m;
    m.bytes = r.capacity;
    m.numa_node = options.numa_node;
    m.huge_pages = options.huge_pages;
    m.shareable = options.shareable;
    m.name = absl::StrCat("hymcache-dram-region-", r.id);
    auto mem = HostMemory::Allocate(m);
    if (!mem.ok()) {
      return absl::Status(mem.status().code(),
                          absl::StrCat("dram device: region ", r.id, ": ",
                                       mem.status().message()));
    }
    r.memory = std::move(*mem);
    regions.push_back(std::move(r));
  }
  const HostMemory& first = *regions.front().memory;
  LOG(INFO) << "dram device: " << options.capacity_bytes << " bytes in "
            << regions.size() << " region(s) " << regions.front().id << ".."
            << regions.back().id << " of up to " << each << " bytes, "
            << (first.shareable() ? "shareable (memfd)" : "private")
            << ", NUMA node " << first.numa_node()
            << (first.numa_bound() ? " (bound)" : "");
  return std::unique_ptr<DramDevice>(
      new DramDevice(options, std::move(regions)));
}

DramDevice::DramDevice(const DramDeviceOptions& options,
                       std::vector<Region> regions)
    : options_(options), regions_(std::move(regions)) {}

DramDevice::~DramDevice() {
  if (outstanding_reads_.load() != 0 || outstanding_writes_.load() != 0) {
    LOG(ERROR) << "dram device destroyed with " << outstanding_reads_.load()
               << " reads and " << outstanding_writes_.load()
               << " writes outstanding";
  }
}

bool DramDevice::numa_allocated() const {
  for (const Region& r : regions_) {
    if (!r.memory->numa_bound()) return false;
  }
  return true;
}

std::vector<RegionDescriptor> DramDevice::Regions() const {
  std::vector<RegionDescriptor> out;
  for (const Region& region : regions_) {
    RegionDescriptor r;
    r.region_id = region.id;
    r.capacity_bytes = region.capacity;
    r.alignment = options_.alignment;
    r.numa_node = region.memory->numa_node();
    r.device_kind = "dram";
    r.persistent = false;
    out.push_back(r);
  }
  return out;
}

std::vector<MemoryArea> DramDevice::Areas() const {
  std::vector<MemoryArea> out;
  for (const Region& region : regions_) {
    MemoryArea a;
    a.area_id = region.id;
    a.base = region.memory->data();
    a.length = region.capacity;
    a.fd = region.memory->fd();
    a.kind = "region";
    out.push_back(a);
  }
  return out;
}

absl::StatusOr<uint8_t*> DramDevice::Locate(uint32_t region, uint64_t addr,
                                            uint64_t len) const {
  const uint32_t first = options_.region_id;
  if (region < first || region - first >= regions_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown region ", region, " (this device has ",
        regions_.size() == 1
            ? absl::StrCat("region ", first)
            : absl::StrCat("regions ", first, "..", regions_.back().id),
        ")"));
  }
  const Region& r = regions_[region - first];
  absl::Status s = CheckRange(r.capacity, addr, len);
  if (!s.ok()) return s;
  return r.memory->data() + addr;
}

absl::StatusOr<ReadView> DramDevice::AcquireRead(uint32_t region, uint64_t addr,
                                                 uint64_t len) {
  absl::StatusOr<uint8_t*> p = Locate(region, addr, len);
  if (!p.ok()) return p.status();
  reads_.fetch_add(1, std::memory_order_relaxed);
  read_bytes_.fetch_add(len, std::memory_order_relaxed);
  outstanding_reads_.fetch_add(1, std::memory_order_relaxed);
  ReadView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = *p;
  return v;
}

void DramDevice::ReleaseRead(const ReadView& view) {
  if (view.data == nullptr) return;
  outstanding_reads_.fetch_sub(1, std::memory_order_relaxed);
}

absl::StatusOr<WriteView> DramDevice::BeginWrite(uint32_t region, uint64_t addr,
                                                 uint64_t len,
                                                 uint64_t /*tag*/) {
  absl::StatusOr<uint8_t*> p = Locate(region, addr, len);
  if (!p.ok()) return p.status();
  outstanding_writes_.fetch_add(1, std::memory_order_relaxed);
  WriteView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = *p;
  return v;
}

absl::Status DramDevice::CommitWrite(const WriteView& view) {
  if (view.data == nullptr) {
    return absl::InvalidArgumentError("commit of an empty write view");
  }
  outstanding_writes_.fetch_sub(1, std::memory_order_relaxed);
  writes_.fetch_add(1, std::memory_order_relaxed);
  write_bytes_.fetch_add(view.length, std::memory_order_relaxed);
  return absl::OkStatus();
}

void DramDevice::AbortWrite(const WriteView& view) {
  if (view.data == nullptr) return;
  outstanding_writes_.fetch_sub(1, std::memory_order_relaxed);
  aborted_writes_.fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<PrefetchHandle> DramDevice::PrefetchObject(uint32_t region,
                                                          uint64_t addr,
                                                          uint64_t len) {
  absl::StatusOr<uint8_t*> p = Locate(region, addr, len);
  if (!p.ok()) return p.status();
  prefetches_.fetch_add(1, std::memory_order_relaxed);
  PrefetchHandle h;
  h.id = next_prefetch_id_.fetch_add(1, std::memory_order_relaxed);
  h.region_id = region;
  h.addr = addr;
  h.length = len;
  return h;
}

absl::StatusOr<const uint8_t*> DramDevice::PrefetchWait(
    const PrefetchHandle& handle, absl::Time /*deadline*/) {
  if (handle.id == 0) {
    return absl::InvalidArgumentError("not a prefetch handle");
  }
  absl::StatusOr<uint8_t*> p =
      Locate(handle.region_id, handle.addr, handle.length);
  if (!p.ok()) return p.status();
  return static_cast<const uint8_t*>(*p);
}

void DramDevice::PrefetchRelease(const PrefetchHandle& /*handle*/) {}

MemoryDeviceStats DramDevice::Stats() const {
  MemoryDeviceStats s;
  s.capacity_bytes = options_.capacity_bytes;
  s.reads = reads_.load(std::memory_order_relaxed);
  s.read_bytes = read_bytes_.load(std::memory_order_relaxed);
  s.writes = writes_.load(std::memory_order_relaxed);
  s.write_bytes = write_bytes_.load(std::memory_order_relaxed);
  s.aborted_writes = aborted_writes_.load(std::memory_order_relaxed);
  s.refused_writes = 0;
  s.prefetches = prefetches_.load(std::memory_order_relaxed);
  s.outstanding_reads = static_cast<uint64_t>(
      std::max<int64_t>(0, outstanding_reads_.load(std::memory_order_relaxed)));
  s.outstanding_writes = static_cast<uint64_t>(std::max<int64_t>(
      0, outstanding_writes_.load(std::memory_order_relaxed)));
  return s;
}

}  // namespace hymcache::storage
