#include "storage_node/dram_device.h"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

size_t PageSize() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}

// Whether libnuma can place memory on `node` (-1: any node).
bool NumaUsable(int node, std::string* why) {
  if (numa_available() < 0) {
    *why = "NUMA is not available on this machine";
    return false;
  }
  if (node < 0) return true;
  if (node > numa_max_node()) {
    *why = absl::StrCat("NUMA node ", node, " does not exist (max node ",
                        numa_max_node(), ")");
    return false;
  }
  if (numa_all_nodes_ptr == nullptr ||
      !numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node))) {
    *why = absl::StrCat("NUMA node ", node, " is not usable by this process");
    return false;
  }
  return true;
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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DramDevice>> DramDevice::Create(
    const DramDeviceOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;

  const size_t page = PageSize();
  const size_t bytes = (options.capacity_bytes + page - 1) / page * page;

  void* mem = nullptr;
  bool numa_allocated = false;
  std::string why;
  if (NumaUsable(options.numa_node, &why)) {
    // Both calls only reserve address space with a placement policy; pages
    // are faulted in on first touch.
    mem = options.numa_node < 0 ? numa_alloc_local(bytes)
                                : numa_alloc_onnode(bytes, options.numa_node);
    if (mem != nullptr) {
      numa_allocated = true;
    } else {
      why = absl::StrCat("numa_alloc of ", bytes, " bytes failed");
    }
  }
  if (mem == nullptr) {
    LOG(WARNING) << "dram device: " << why
                 << "; falling back to anonymous mmap without NUMA placement";
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      return absl::ResourceExhaustedError(absl::StrCat(
          "dram device: cannot map ", bytes, " bytes: ", strerror(e)));
    }
    mem = m;
  }
  if (options.huge_pages && madvise(mem, bytes, MADV_HUGEPAGE) != 0) {
    VLOG(1) << "dram device: madvise(MADV_HUGEPAGE) failed: " << strerror(errno);
  }

  // Report where the memory actually is: touch the first page (only that
  // one) and ask the kernel which node backs it.
  int node = options.numa_node;
  if (numa_allocated) {
    static_cast<volatile uint8_t*>(mem)[0] = 0;
    int actual = -1;
    if (get_mempolicy(&actual, nullptr, 0, mem, MPOL_F_NODE | MPOL_F_ADDR) ==
        0) {
      node = actual;
    }
    if (options.numa_node >= 0 && node != options.numa_node) {
      LOG(WARNING) << "dram device: asked for NUMA node " << options.numa_node
                   << " but the kernel placed memory on node " << node;
    }
  }
  LOG(INFO) << "dram device: region " << options.region_id << " of "
            << options.capacity_bytes << " bytes"
            << (numa_allocated ? " via libnuma" : " via mmap")
            << ", NUMA node " << node;
  return std::unique_ptr<DramDevice>(new DramDevice(
      options, static_cast<uint8_t*>(mem), bytes, numa_allocated, node));
}

DramDevice::DramDevice(const DramDeviceOptions& options, uint8_t* base,
                       size_t mapped_bytes, bool numa_allocated, int numa_node)
    : options_(options),
      base_(base),
      mapped_bytes_(mapped_bytes),
      numa_allocated_(numa_allocated),
      numa_node_(numa_node) {}

DramDevice::~DramDevice() {
  if (outstanding_reads_.load() != 0 || outstanding_writes_.load() != 0) {
    LOG(ERROR) << "dram device destroyed with " << outstanding_reads_.load()
               << " reads and " << outstanding_writes_.load()
               << " writes outstanding";
  }
  if (numa_allocated_) {
    numa_free(base_, mapped_bytes_);
  } else {
    munmap(base_, mapped_bytes_);
  }
}

std::vector<RegionDescriptor> DramDevice::Regions() const {
  RegionDescriptor r;
  r.region_id = options_.region_id;
  r.capacity_bytes = options_.capacity_bytes;
  r.alignment = options_.alignment;
  r.numa_node = numa_node_;
  r.device_kind = "dram";
  r.persistent = false;
  return {r};
}

absl::Status DramDevice::Check(uint32_t region, uint64_t addr,
                               uint64_t len) const {
  if (region != options_.region_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown region ", region, " (this device has region ",
                     options_.region_id, ")"));
  }
  return CheckRange(options_.capacity_bytes, addr, len);
}

absl::StatusOr<ReadView> DramDevice::AcquireRead(uint32_t region, uint64_t addr,
                                                 uint64_t len) {
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
  reads_.fetch_add(1, std::memory_order_relaxed);
  read_bytes_.fetch_add(len, std::memory_order_relaxed);
  outstanding_reads_.fetch_add(1, std::memory_order_relaxed);
  ReadView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = base_ + addr;
  return v;
}

void DramDevice::ReleaseRead(const ReadView& view) {
  if (view.data == nullptr) return;
  outstanding_reads_.fetch_sub(1, std::memory_order_relaxed);
}

absl::StatusOr<WriteView> DramDevice::BeginWrite(uint32_t region, uint64_t addr,
                                                 uint64_t len,
                                                 uint64_t /*tag*/) {
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
  outstanding_writes_.fetch_add(1, std::memory_order_relaxed);
  WriteView v;
  v.region_id = region;
  v.addr = addr;
  v.length = len;
  v.data = base_ + addr;
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
  absl::Status s = Check(region, addr, len);
  if (!s.ok()) return s;
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
  absl::Status s = Check(handle.region_id, handle.addr, handle.length);
  if (!s.ok()) return s;
  return static_cast<const uint8_t*>(base_ + handle.addr);
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
