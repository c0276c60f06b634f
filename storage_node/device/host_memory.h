// HostMemory: one block of host DRAM that a memory device keeps object bytes
// in, allocated so that a data plane can expose it directly to peers:
//
//   * shareable (the default): a memfd mapped MAP_SHARED. A same-host process
//     handed the fd (SCM_RIGHTS, or /proc/<pid>/fd/<fd>) maps the very same
//     pages. The memfd is sealed against shrinking and growing, so no peer can
//     truncate it under the owner (which would turn the owner's accesses into
//     SIGBUS). The pages are shmem: /proc/meminfo counts them as Shmem, and a
//     cgroup charges each page to the process that first faults it in.
//   * private: anonymous memory (mmap MAP_PRIVATE), fd() == -1.
//
// Either kind can be registered with an RDMA NIC. Address space is reserved
// up front (MAP_NORESERVE); pages are faulted in by the first write to them,
// except the first page, which Allocate touches to learn where the kernel put
// it, or all of them at allocation with `populate`.
//
// NUMA: with numa_node >= 0 the whole block is bound (MPOL_BIND) to that node;
// for shareable memory the policy is the memfd's own shared policy, so pages
// faulted in through a peer's mapping land on the node too. A node that does
// not exist, is not usable by this process, or a machine without NUMA
// support, falls back to memory without a placement policy, with a warning.
// With numa_node == -1 the process's policy applies (by default: the node of
// the thread that first touches a page).
//
// Huge pages: huge_pages asks for 2 MiB pages, best effort; page_backing()
// says what the block got. Private memory gets transparent huge pages
// (madvise(MADV_HUGEPAGE)) when /sys/kernel/mm/transparent_hugepage/enabled
// is "always" or "madvise" (Debian's default). Shareable memory gets them
// only when .../shmem_enabled is "always", "within_size", "advise" or
// "force" (Debian's default is "never"); otherwise, if the hugetlb pool
// (vm.nr_hugepages of 2 MiB) has room for the whole block, a hugetlb memfd
// (pages reserved at allocation, size rounded up to 2 MiB); otherwise 4 KiB
// pages, with a warning. Page size matters for device I/O: an O_DIRECT
// transfer of 1 MiB into 4 KiB pages pins 256 pages and can exceed a
// device's segment limit (virtio-blk: 254), which cost the hybrid device's
// staging window a third of a virtio disk's bandwidth and three quarters of
// a fast device's (docs/hybrid_device.md). EnableSharedHugePages() sets the
// shmem knob to "advise" when permitted.
//
// Thread safety: the object is immutable after Allocate; accessors are safe
// from any thread. The bytes are the caller's to synchronize.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hymcache::storage {

// What backs a HostMemory's pages.
enum class PageBacking {
  kSmall,            // base pages (4 KiB)
  kTransparentHuge,  // transparent huge pages were asked for and are allowed
  kHugetlb,          // 2 MiB pages reserved from the hugetlb pool
};
// "4k", "thp" or "hugetlb-2m".
const char* PageBackingName(PageBacking b);

// Sets /sys/kernel/mm/transparent_hugepage/shmem_enabled to "advise" if it is
// "never" (a system-wide knob; "advise" gives huge pages only to shared
// mappings that ask for them with madvise). OK if shared memory can get
// transparent huge pages afterwards; PermissionDenied when the knob is not
// writable (not root, read-only sysfs), FailedPrecondition for "deny",
// Unavailable without THP support.
absl::Status EnableSharedHugePages();

// Physical memory of NUMA node `numa_node` (libnuma's numa_node_size64), or
// of the host (MemTotal in /proc/meminfo) for -1 or when NUMA is not
// available. Unavailable if it cannot be read.
absl::StatusOr<uint64_t> PhysicalMemoryBytes(int numa_node);

// Start-up sanity: whether `bytes` of DRAM for `what` (e.g. "--dram_bytes")
// fit PhysicalMemoryBytes(numa_node). Address space is reserved lazily, so
// a larger region would start and advertise capacity the host cannot back.
// ResourceExhausted with both numbers when it does not fit, unless
// `allow_overcommit` (then a warning is logged and OK returned). OK when
// the memory size cannot be read (a warning).
absl::Status CheckMemoryFits(uint64_t bytes, int numa_node,
                             bool allow_overcommit, const std::string& what);

struct HostMemoryOptions {
  // Bytes to reserve; must be > 0 and at most 2^56. Rounded up to the page
  // size.
  // Default: 0 (must be set)
  uint64_t bytes = 0;
  // NUMA node to bind the memory to; -1: no binding (the process's policy,
  // by default first touch). An unusable node falls back to no binding with
  // a warning.
  // Default: -1
  int numa_node = -1;
  // Ask for huge pages (best effort, see the file comment).
  // Default: true
  bool huge_pages = true;
  // Back the memory with a memfd that a same-host peer can map (fd() >= 0).
  // false: private anonymous memory (fd() == -1). If the kernel refuses
  // memfd_create as unsupported (ENOSYS, EPERM, EACCES), falls back to
  // private memory with a warning.
  // Default: true
  bool shareable = true;
  // Name of the memfd (shown as /memfd:<name> in /proc/<pid>/maps); also
  // used in log messages. At most 200 bytes.
  // Default: "hymcache"
  std::string name = "hymcache";
  // Fault every page in at allocation (after NUMA binding and the huge-page
  // advice, so they apply): madvise(MADV_POPULATE_WRITE), or on kernels
  // before 5.14 one write per page. No later access pays for allocating and
  // zeroing its page then (a 2 MiB page takes ~100 us to clear: done in an
  // I/O's submission or a request's first touch of fresh space, that
  // latency lands on the request), and the block is charged to this process
  // from the start. Takes about a memory-bandwidth pass over the block
  // (~0.1 s per GiB). ResourceExhausted when the pages cannot be had.
  // Default: false (pages are faulted in by their first write)
  bool populate = false;

  absl::Status Validate() const;
};

class HostMemory {
 public:
  // Errors: InvalidArgument for bad options; ResourceExhausted when the
  // address space or a file descriptor cannot be had (e.g. an absurd size);
  // other canonical codes for other system-call failures.
  static absl::StatusOr<std::unique_ptr<HostMemory>> Allocate(
      const HostMemoryOptions& options);
  // Unmaps the memory and closes the memfd. A peer that still maps it keeps
  // its pages alive until it unmaps them.
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // Start of the block: page aligned, zero-filled at allocation.
  uint8_t* data() const { return data_; }
  // Length of the block: options.bytes rounded up to the page size (2 MiB
  // for hugetlb backing).
  uint64_t size() const { return size_; }
  // The memfd holding the bytes (mapped at data(), offset 0), owned by this
  // object; -1 for private memory.
  int fd() const { return fd_; }
  bool shareable() const { return fd_ >= 0; }
  // The NUMA node the kernel placed the first page on; -1 if unknown (no
  // NUMA support).
  int numa_node() const { return numa_node_; }
  // Whether the block is bound to options.numa_node (false: no node was
  // asked for, or the node was unusable and the memory fell back).
  bool numa_bound() const { return numa_bound_; }
  // What backs the pages (kTransparentHuge: asked for and allowed; the
  // kernel still falls back to small pages when it cannot find 2 MiB).
  PageBacking page_backing() const { return backing_; }

 private:
  HostMemory(uint8_t* data, uint64_t size, int fd, int numa_node,
             bool numa_bound, PageBacking backing);

  // Constant after construction.
  uint8_t* const data_;
  const uint64_t size_;
  const int fd_;
  const int numa_node_;
  const bool numa_bound_;
  const PageBacking backing_;
};

}  // namespace hymcache::storage
