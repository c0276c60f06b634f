#include "storage_node/device/host_memory.h"

#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <linux/memfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 56;
constexpr size_t kMaxNameBytes = 200;

uint64_t PageSize() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uint64_t>(p) : 4096;
}

// The canonical code for a failed allocation-related system call.
absl::Status ErrnoStatus(int e, absl::string_view what) {
  std::string m = absl::StrCat(what, ": ", strerror(e));
  switch (e) {
    case ENOMEM:
    case ENOSPC:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case EOVERFLOW:
      return absl::ResourceExhaustedError(m);
    case EINVAL:
      return absl::InvalidArgumentError(m);
    case EPERM:
    case EACCES:
      return absl::PermissionDeniedError(m);
    default:
      return absl::InternalError(m);
  }
}

// Whether memory can be bound to NUMA node `node` (>= 0); else says why.
bool NumaUsable(int node, std::string* why) {
  if (numa_available() < 0) {
    *why = "NUMA is not available on this machine";
    return false;
  }
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

// Binds [mem, mem + bytes) to `node` (MPOL_BIND, as numa_alloc_onnode does).
// On a shmem mapping this sets the memfd's shared policy, which every
// mapping of it honours.
bool BindToNode(void* mem, uint64_t bytes, int node, std::string* why) {
  struct bitmask* mask = numa_allocate_nodemask();
  if (mask == nullptr) {
    *why = "cannot allocate a NUMA node mask";
    return false;
  }
  numa_bitmask_setbit(mask, static_cast<unsigned>(node));
  long rc = mbind(mem, bytes, MPOL_BIND, mask->maskp, mask->size + 1, 0);
  int e = errno;
  numa_bitmask_free(mask);
  if (rc != 0) {
    *why = absl::StrCat("mbind to NUMA node ", node, " failed: ", strerror(e));
    return false;
  }
  return true;
}

// Faults in the first page (a write: a read of private memory would map the
// shared zero page) and asks the kernel which node backs it; -1 if unknown.
int FirstPageNode(uint8_t* mem) {
  static_cast<volatile uint8_t*>(mem)[0] = 0;
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, mem, MPOL_F_NODE | MPOL_F_ADDR) != 0) {
    return -1;
  }
  return node;
}

// The selected value of a transparent_hugepage sysfs knob ("[never]" ->
// "never"), or "" if unreadable.
std::string ThpSetting(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  size_t open = line.find('[');
  size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

constexpr char kShmemThpKnob[] =
    "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
constexpr char kThpKnob[] = "/sys/kernel/mm/transparent_hugepage/enabled";
constexpr uint64_t kHugePage = uint64_t{2} << 20;

// Whether madvise(MADV_HUGEPAGE) gets huge pages for shared memory (memfds).
bool ShmemThpAllowed() {
  const std::string s = ThpSetting(kShmemThpKnob);
  return s == "always" || s == "within_size" || s == "advise" || s == "force";
}

// Whether madvise(MADV_HUGEPAGE) gets huge pages for private memory.
bool PrivateThpAllowed() {
  const std::string s = ThpSetting(kThpKnob);
  return s == "always" || s == "madvise";
}

// Free 2 MiB pages of the hugetlb pool (HugePages_Free when the default huge
// page size is 2 MiB), in bytes; 0 if none or unknown.
uint64_t FreeHugetlbBytes() {
  std::ifstream in("/proc/meminfo");
  uint64_t free_pages = 0, page_kib = 0;
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "HugePages_Free: %llu", &v) == 1) {
      free_pages = v;
    } else if (std::sscanf(line.c_str(), "Hugepagesize: %llu kB", &v) == 1) {
      page_kib = v;
    }
  }
  return page_kib * 1024 == kHugePage ? free_pages * kHugePage : 0;
}

void WarnSmallSharedPages(const std::string& name) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  LOG(WARNING) << "host memory " << name
               << ": shareable memory gets 4 KiB pages (" << kShmemThpKnob
               << " is '" << ThpSetting(kShmemThpKnob)
               << "' and the hugetlb pool has no room): every 1 MiB device "
                  "transfer then pins 256 pages and may be split, which costs "
                  "fast devices much of their bandwidth. Set the knob to "
                  "'advise' (the storage node does so itself when it may: "
                  "--shmem_huge_pages) or reserve 2 MiB pages (vm.nr_hugepages)";
}

}  // namespace

absl::Status HostMemoryOptions::Validate() const {
  if (bytes == 0) {
    return absl::InvalidArgumentError("host memory: bytes must be > 0");
  }
  if (bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host memory: ", bytes, " bytes is implausibly large (max 2^56)"));
  }
  if (numa_node < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host memory: numa_node ", numa_node, " (want >= -1)"));
  }
  if (name.size() > kMaxNameBytes || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host memory: name must be at most ", kMaxNameBytes,
        " bytes without NULs"));
  }
  return absl::OkStatus();
}

namespace {

// The memfd of a shareable block: 2 MiB hugetlb pages when asked for huge
// pages, the shmem knob forbids transparent ones and the pool has room for
// the whole block (then `*size` grows to whole huge pages and `*backing`
// is kHugetlb), else ordinary shared pages; sealed against resizing. `*fd`
// stays -1 where memfds are not allowed (private memory instead).
absl::Status CreateMemfd(const HostMemoryOptions& options,
                         const std::string& name, uint64_t* size_io, int* fd_out,
                         PageBacking* backing_out) {
  uint64_t& size = *size_io;
  int& fd = *fd_out;
  PageBacking& backing = *backing_out;
  // Growing a file past RLIMIT_FSIZE raises SIGXFSZ, which kills the
  // process: refuse instead.
  struct rlimit fsize;
  if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
      size > fsize.rlim_cur) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host memory ", name, ": ", size,
        " bytes exceed the file size limit (RLIMIT_FSIZE ", fsize.rlim_cur,
        ")"));
  }
  // Huge pages for shared memory: transparent ones where the shmem knob
  // allows them, else reserved 2 MiB pages from the hugetlb pool if it
  // has room for the whole block, else 4 KiB pages.
  if (options.huge_pages && !ShmemThpAllowed()) {
    const uint64_t huge_size = (size + kHugePage - 1) / kHugePage * kHugePage;
    if (FreeHugetlbBytes() >= huge_size) {
      fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                          MFD_HUGETLB | MFD_HUGE_2MB);
      if (fd >= 0 && ftruncate(fd, static_cast<off_t>(huge_size)) == 0) {
        size = huge_size;
        backing = PageBacking::kHugetlb;
      } else if (fd >= 0) {
        close(fd);
        fd = -1;
      }
    }
  }
  if (fd < 0) fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    int e = errno;
    if (e != ENOSYS && e != EPERM && e != EACCES) {
      return ErrnoStatus(e, absl::StrCat("host memory ", name,
                                         ": memfd_create"));
    }
    LOG(WARNING) << "host memory " << name << ": memfd_create failed ("
                 << strerror(e)
                 << "); using private memory that peers cannot map";
  } else if (backing != PageBacking::kHugetlb &&
             ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    return ErrnoStatus(
        e, absl::StrCat("host memory ", name, ": ftruncate to ", size));
  }
  if (fd >= 0 && fcntl(fd, F_ADD_SEALS,
                       F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    LOG(WARNING) << "host memory " << name
                 << ": cannot seal the memfd against resizing ("
                 << strerror(errno)
                 << "); a peer that truncates it would crash this process";
  }
  return absl::OkStatus();
}

// Faults in every page of [data, + size), which nothing uses yet.
absl::Status Populate(uint8_t* data, uint64_t size, uint64_t page,
                      const std::string& name) {
  const absl::Time start = absl::Now();
  if (madvise(data, size, MADV_POPULATE_WRITE) != 0) {
    const int e = errno;
    if (e != EINVAL) {
      // ENOMEM (no memory, or the cgroup's limit), EFAULT/EHWPOISON.
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory ", name, ": cannot fault in ", size,
                       " bytes: ", strerror(e)));
    }
    // Before Linux 5.14: touch each page. Safe only because nothing else
    // uses the block yet (it is all zeros: writing a zero changes nothing).
    volatile uint8_t* p = data;
    for (uint64_t off = 0; off < size; off += page) p[off] = 0;
  }
  VLOG(1) << "host memory " << name << ": faulted in " << size << " bytes in "
          << absl::FormatDuration(absl::Now() - start);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostMemory>> HostMemory::Allocate(
    const HostMemoryOptions& options) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  const std::string name = options.name.empty() ? "hymcache" : options.name;
  const uint64_t page = PageSize();
  const uint64_t small_size = (options.bytes + page - 1) / page * page;

  uint64_t size = small_size;
  int fd = -1;
  PageBacking backing = PageBacking::kSmall;
  if (options.shareable) {
    absl::Status s = CreateMemfd(options, name, &size, &fd, &backing);
    if (!s.ok()) return s;
  }

  // Hugetlb pages are reserved at mmap (no MAP_NORESERVE): a pool that runs
  // dry later would otherwise turn a first touch into SIGBUS.
  void* mem = MAP_FAILED;
  if (backing == PageBacking::kHugetlb) {
    mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
      // The pool emptied meanwhile: ordinary shared pages instead.
      close(fd);
      size = small_size;
      backing = PageBacking::kSmall;
      fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return ErrnoStatus(e, absl::StrCat("host memory ", name,
                                           ": memfd of ", size, " bytes"));
      }
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    }
  }
  if (mem == MAP_FAILED) {
    mem = fd >= 0 ? mmap(nullptr, size, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_NORESERVE, fd, 0)
                  : mmap(nullptr, size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  if (mem == MAP_FAILED) {
    int e = errno;
    if (fd >= 0) close(fd);
    return ErrnoStatus(e, absl::StrCat("host memory ", name, ": cannot map ",
                                       size, " bytes"));
  }

  bool bound = false;
  if (options.numa_node >= 0) {
    std::string why;
    bound = NumaUsable(options.numa_node, &why) &&
            BindToNode(mem, size, options.numa_node, &why);
    if (!bound) {
      LOG(WARNING) << "host memory " << name << ": " << why
                   << "; falling back to memory without NUMA placement";
    }
  }
  if (options.huge_pages && backing != PageBacking::kHugetlb) {
    if (madvise(mem, size, MADV_HUGEPAGE) != 0) {
      VLOG(1) << "host memory " << name
              << ": madvise(MADV_HUGEPAGE) failed: " << strerror(errno);
    } else if (fd >= 0 ? ShmemThpAllowed() : PrivateThpAllowed()) {
      backing = PageBacking::kTransparentHuge;
    }
    if (fd >= 0 && backing == PageBacking::kSmall) WarnSmallSharedPages(name);
  }

  auto* data = static_cast<uint8_t*>(mem);
  if (options.populate) {
    absl::Status s = Populate(data, size, page, name);
    if (!s.ok()) {
      munmap(mem, size);
      if (fd >= 0) close(fd);
      return s;
    }
  }
  const int node = FirstPageNode(data);
  if (bound && node != options.numa_node) {
    LOG(WARNING) << "host memory " << name << ": asked for NUMA node "
                 << options.numa_node << " but the kernel placed memory on node "
                 << node;
  }
  VLOG(1) << "host memory " << name << ": " << size << " bytes, "
          << (fd >= 0 ? "shareable memfd" : "private") << ", "
          << PageBackingName(backing) << " pages, NUMA node " << node
          << (bound ? " (bound)" : "");
  return std::unique_ptr<HostMemory>(
      new HostMemory(data, size, fd, node, bound, backing));
}

HostMemory::HostMemory(uint8_t* data, uint64_t size, int fd, int numa_node,
                       bool numa_bound, PageBacking backing)
    : data_(data),
      size_(size),
      fd_(fd),
      numa_node_(numa_node),
      numa_bound_(numa_bound),
      backing_(backing) {}

const char* PageBackingName(PageBacking b) {
  switch (b) {
    case PageBacking::kSmall:
      return "4k";
    case PageBacking::kTransparentHuge:
      return "thp";
    case PageBacking::kHugetlb:
      return "hugetlb-2m";
  }
  return "unknown";
}

absl::StatusOr<uint64_t> PhysicalMemoryBytes(int numa_node) {
  if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node()) {
    const long long size = numa_node_size64(numa_node, nullptr);
    if (size > 0) return static_cast<uint64_t>(size);
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return absl::UnavailableError("cannot read MemTotal from /proc/meminfo");
}

absl::Status CheckMemoryFits(uint64_t bytes, int numa_node,
                             bool allow_overcommit, const std::string& what) {
  absl::StatusOr<uint64_t> physical = PhysicalMemoryBytes(numa_node);
  if (!physical.ok()) {
    LOG(WARNING) << "storage node: cannot check " << what << " against the "
                 << "machine's memory: " << physical.status();
    return absl::OkStatus();
  }
  if (bytes <= *physical) return absl::OkStatus();
  const bool on_node = numa_node >= 0 && numa_available() >= 0 &&
                       numa_node <= numa_max_node();
  const std::string numbers = absl::StrCat(
      what, " asks for ", bytes, " bytes of DRAM, but ",
      on_node ? absl::StrCat("NUMA node ", numa_node) : std::string("the host"),
      " has ", *physical, " bytes (",
      on_node ? "numa_node_size64" : "MemTotal", ")");
  if (allow_overcommit) {
    LOG(WARNING) << "storage node: overcommitted: " << numbers
                 << "; the kernel may kill the node once it fills";
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "storage node: not enough memory: ", numbers, ". Lower ", what,
      ", or start anyway with --allow_overcommit"));
}

absl::Status EnableSharedHugePages() {
  const std::string s = ThpSetting(kShmemThpKnob);
  if (s.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "host memory: ", kShmemThpKnob, " is missing or unreadable"));
  }
  if (ShmemThpAllowed()) return absl::OkStatus();
  if (s == "deny") {
    return absl::FailedPreconditionError(absl::StrCat(
        "host memory: ", kShmemThpKnob, " is 'deny' (left alone)"));
  }
  {
    std::ofstream out(kShmemThpKnob);
    out << "advise\n";
    out.flush();
    if (!out) {
      return absl::PermissionDeniedError(absl::StrCat(
          "host memory: cannot set ", kShmemThpKnob, " to 'advise' (it is '",
          s, "'): ", strerror(errno)));
    }
  }
  if (!ShmemThpAllowed()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "host memory: ", kShmemThpKnob, " stayed '", ThpSetting(kShmemThpKnob),
        "' after writing 'advise'"));
  }
  LOG(WARNING) << "host memory: set " << kShmemThpKnob << " from '" << s
               << "' to 'advise' (huge pages only for memory that asks for "
                  "them, as the device's shareable DRAM does)";
  return absl::OkStatus();
}

HostMemory::~HostMemory() {
  if (munmap(data_, size_) != 0) {
    LOG(ERROR) << "host memory: munmap of " << size_
               << " bytes failed: " << strerror(errno);
  }
  if (fd_ >= 0) close(fd_);
}

}  // namespace hymcache::storage
