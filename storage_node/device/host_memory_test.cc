#include "storage_node/device/host_memory.h"

#include <fcntl.h>
#include <numa.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace hymcache::storage {
namespace {

uint64_t Page() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

std::unique_ptr<HostMemory> MustAllocate(const HostMemoryOptions& o) {
  auto m = HostMemory::Allocate(o);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return std::move(*m);
}

// Collects what is written to stderr (fd 2; glog before InitGoogleLogging)
// while it is alive.
class StderrCapture {
 public:
  StderrCapture() {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") +
            "/host_memory_test_stderr." + std::to_string(getpid());
    fflush(stderr);
    saved_ = dup(2);
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(saved_ >= 0);
    REQUIRE(fd >= 0);
    dup2(fd, 2);
    close(fd);
  }
  ~StderrCapture() {
    Restore();
    unlink(path_.c_str());
  }
  std::string Text() {
    Restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

TEST_CASE("HostMemory allocates zeroed, page-rounded private memory") {
  HostMemoryOptions o;
  o.bytes = Page() + 1;
  o.shareable = false;
  o.name = "hm-private";
  auto m = MustAllocate(o);
  CHECK(m->size() == 2 * Page());
  CHECK(m->fd() == -1);
  CHECK_FALSE(m->shareable());
  CHECK_FALSE(m->numa_bound());
  CHECK(reinterpret_cast<uintptr_t>(m->data()) % Page() == 0);
  for (uint64_t i = 0; i < m->size(); i += 512) CHECK(m->data()[i] == 0);
  std::memset(m->data(), 0xab, m->size());
  CHECK(m->data()[m->size() - 1] == 0xab);
}

// Pages of [p, + len) in memory now (mincore: for a memfd, its page cache).
uint64_t ResidentPages(const uint8_t* p, uint64_t len) {
  std::vector<unsigned char> vec((len + Page() - 1) / Page());
  REQUIRE(mincore(const_cast<uint8_t*>(p), len, vec.data()) == 0);
  return static_cast<uint64_t>(std::count_if(
      vec.begin(), vec.end(), [](unsigned char c) { return c & 1; }));
}

TEST_CASE("HostMemory with populate has every page in memory from the start") {
  for (bool shareable : {true, false}) {
    INFO("shareable " << shareable);
    HostMemoryOptions o;
    o.bytes = 8 << 20;
    o.shareable = shareable;
    o.name = "hm-populate";
    auto lazy = MustAllocate(o);
    const uint64_t pages = lazy->size() / Page();
    // Only the first page (touched to learn its NUMA node), or the huge
    // page holding it.
    CHECK(ResidentPages(lazy->data(), lazy->size()) < pages);
    o.populate = true;
    auto eager = MustAllocate(o);
    CHECK(ResidentPages(eager->data(), eager->size()) == pages);
    // Still zero-filled and writable.
    for (uint64_t i = 0; i < eager->size(); i += 4096)
      REQUIRE(eager->data()[i] == 0);
    std::memset(eager->data(), 0x5a, eager->size());
    CHECK(eager->data()[eager->size() - 1] == 0x5a);
  }
}

TEST_CASE("HostMemory shareable memory is visible through a second mapping") {
  HostMemoryOptions o;
  o.bytes = 1 << 20;
  o.name = "hm-shared";
  auto m = MustAllocate(o);
  REQUIRE(m->shareable());
  REQUIRE(m->fd() >= 0);
  CHECK(m->size() == (1u << 20));
  CHECK((fcntl(m->fd(), F_GETFD) & FD_CLOEXEC) != 0);

  // A peer process would open the fd it was handed; /proc/self/fd is the
  // same path through the kernel.
  const std::string path = "/proc/self/fd/" + std::to_string(m->fd());
  int fd2 = open(path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd2 >= 0);
  struct stat st;
  REQUIRE(fstat(fd2, &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == m->size());
  void* p = mmap(nullptr, m->size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
  REQUIRE(p != MAP_FAILED);
  auto* peer = static_cast<uint8_t*>(p);
  CHECK(peer != m->data());

  std::memcpy(m->data() + 4096, "owner", 5);
  CHECK(std::memcmp(peer + 4096, "owner", 5) == 0);
  std::memcpy(peer + m->size() - 4, "peer", 4);
  CHECK(std::memcmp(m->data() + m->size() - 4, "peer", 4) == 0);

  // Sealed: a peer cannot shrink (or grow) the memory under the owner.
  CHECK(ftruncate(fd2, 0) != 0);
  CHECK(errno == EPERM);
  CHECK(ftruncate(fd2, static_cast<off_t>(2 * m->size())) != 0);

  // The owner's destruction closes its fd; the peer's mapping stays valid.
  const int owner_fd = m->fd();
  m.reset();
  CHECK(fcntl(owner_fd, F_GETFD) == -1);
  CHECK(std::memcmp(peer + 4096, "owner", 5) == 0);
  munmap(p, 1 << 20);
  close(fd2);
}

TEST_CASE("HostMemory places memory on NUMA node 0") {
  for (bool shareable : {true, false}) {
    INFO("shareable " << shareable);
    HostMemoryOptions o;
    o.bytes = 4 << 20;
    o.numa_node = 0;
    o.shareable = shareable;
    auto m = MustAllocate(o);
    if (numa_available() < 0) {
      // No NUMA support: the fallback, with the node unknown.
      CHECK_FALSE(m->numa_bound());
      continue;
    }
    CHECK(m->numa_bound());
    CHECK(m->numa_node() == 0);
    m->data()[m->size() - 1] = 1;
  }
  if (numa_available() >= 0 && numa_max_node() == 0) {
    // One node: unbound memory is on node 0 too.
    HostMemoryOptions o;
    o.bytes = 1 << 20;
    auto m = MustAllocate(o);
    CHECK_FALSE(m->numa_bound());
    CHECK(m->numa_node() == 0);
  }
}

TEST_CASE("HostMemory falls back with a warning on an unusable NUMA node") {
  for (bool shareable : {true, false}) {
    INFO("shareable " << shareable);
    HostMemoryOptions o;
    o.bytes = 1 << 20;
    o.numa_node = 4000;
    o.shareable = shareable;
    o.name = "hm-bad-node";
    StderrCapture capture;
    auto m = HostMemory::Allocate(o);
    const std::string err = capture.Text();
    INFO(err);
    REQUIRE(m.ok());
    CHECK_FALSE((*m)->numa_bound());
    CHECK((*m)->shareable() == shareable);
    CHECK(err.find("hm-bad-node") != std::string::npos);
    CHECK(err.find("falling back") != std::string::npos);
    (*m)->data()[0] = 7;
    CHECK((*m)->data()[0] == 7);
  }
}

TEST_CASE("HostMemory refuses bad options and absurd sizes without crashing") {
  HostMemoryOptions o;
  o.bytes = 0;
  CHECK(HostMemory::Allocate(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.bytes = std::numeric_limits<uint64_t>::max();
  CHECK(HostMemory::Allocate(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.bytes = 4096;
  o.numa_node = -2;
  CHECK(HostMemory::Allocate(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  o.numa_node = -1;
  o.name = std::string(300, 'x');
  CHECK(HostMemory::Allocate(o).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // 32 PiB passes validation but exceeds any process's address space.
  for (bool shareable : {true, false}) {
    INFO("shareable " << shareable);
    HostMemoryOptions big;
    big.bytes = uint64_t{1} << 55;
    big.shareable = shareable;
    auto m = HostMemory::Allocate(big);
    INFO(m.status().ToString());
    CHECK(m.status().code() == absl::StatusCode::kResourceExhausted);
  }
}

// The selected value of a THP sysfs knob, or "" if unreadable.
std::string Knob(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return "";
  size_t a = line.find('['), b = line.find(']');
  if (a == std::string::npos || b == std::string::npos) return "";
  return line.substr(a + 1, b - a - 1);
}

bool SetKnob(const char* path, const std::string& v) {
  std::ofstream out(path);
  out << v << "\n";
  out.flush();
  return static_cast<bool>(out) && Knob(path) == v;
}

constexpr char kShmemKnob[] =
    "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

TEST_CASE("HostMemory reports its page backing as the THP knobs allow") {
  const std::string thp = Knob("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string shmem = Knob(kShmemKnob);
  for (bool shareable : {false, true}) {
    INFO("shareable " << shareable << " enabled=" << thp << " shmem=" << shmem);
    HostMemoryOptions o;
    o.bytes = 8 << 20;
    o.shareable = shareable;
    auto m = MustAllocate(o);
    const bool allowed =
        shareable ? (shmem == "always" || shmem == "within_size" ||
                     shmem == "advise" || shmem == "force")
                  : (thp == "always" || thp == "madvise");
    if (allowed) {
      CHECK(m->page_backing() == PageBacking::kTransparentHuge);
    } else {
      // 4 KiB, or a hugetlb memfd if the pool has room for it.
      CHECK(m->page_backing() != PageBacking::kTransparentHuge);
    }
    o.huge_pages = false;
    CHECK(MustAllocate(o)->page_backing() == PageBacking::kSmall);
  }
  CHECK(std::string(PageBackingName(PageBacking::kSmall)) == "4k");
  CHECK(std::string(PageBackingName(PageBacking::kHugetlb)) == "hugetlb-2m");
}

TEST_CASE("EnableSharedHugePages turns 'never' into 'advise'") {
  const std::string before = Knob(kShmemKnob);
  if (before.empty() || before == "deny" || !SetKnob(kShmemKnob, "never")) {
    WARN("cannot set " << kShmemKnob << " here (not root, or read-only); "
                                        "skipped");
    return;
  }
  HostMemoryOptions o;
  o.bytes = 4 << 20;
  o.shareable = true;
  {
    // Never: no transparent huge pages for shared memory.
    auto m = MustAllocate(o);
    CHECK(m->page_backing() != PageBacking::kTransparentHuge);
  }
  absl::Status s = EnableSharedHugePages();
  CHECK(s.ok());
  CHECK(Knob(kShmemKnob) == "advise");
  CHECK(MustAllocate(o)->page_backing() == PageBacking::kTransparentHuge);
  // Already allowed: nothing to change.
  CHECK(EnableSharedHugePages().ok());
  CHECK(Knob(kShmemKnob) == "advise");
  // Leave the machine as it was.
  SetKnob(kShmemKnob, before);
}

TEST_CASE("PhysicalMemoryBytes: the host's MemTotal, a node's size") {
  auto host = PhysicalMemoryBytes(-1);
  REQUIRE(host.ok());
  // sysconf agrees with /proc/meminfo's MemTotal (to the page).
  const uint64_t pages = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  CHECK(*host <= pages + 4096);
  CHECK(*host + (uint64_t{64} << 20) >= pages);
  if (numa_available() >= 0) {
    auto node0 = PhysicalMemoryBytes(0);
    REQUIRE(node0.ok());
    CHECK(*node0 > 0);
    CHECK(*node0 <= *host + (uint64_t{64} << 20));
  }
}

TEST_CASE("CheckMemoryFits refuses more DRAM than the host or node has") {
  auto host = PhysicalMemoryBytes(-1);
  REQUIRE(host.ok());
  CHECK(CheckMemoryFits(uint64_t{1} << 30, -1, false, "--dram_bytes").ok());
  CHECK(CheckMemoryFits(*host, -1, false, "--dram_bytes").ok());
  absl::Status s = CheckMemoryFits(*host + 1, -1, false, "--dram_bytes");
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.message().find("--dram_bytes") != std::string::npos);
  CHECK(s.message().find("--allow_overcommit") != std::string::npos);
  CHECK(s.message().find(std::to_string(*host)) != std::string::npos);
  // 1 TiB, as an operator might mistype.
  CHECK(!CheckMemoryFits(uint64_t{1} << 40, -1, false, "--dram_bytes").ok());
  CHECK(CheckMemoryFits(uint64_t{1} << 40, -1, true, "--dram_bytes").ok());
  if (numa_available() >= 0) {
    const uint64_t node0 = *PhysicalMemoryBytes(0);
    absl::Status n = CheckMemoryFits(node0 + 1, 0, false, "--dram_bytes");
    CHECK(n.code() == absl::StatusCode::kResourceExhausted);
    CHECK(n.message().find("NUMA node 0") != std::string::npos);
  }
}

}  // namespace
}  // namespace hymcache::storage
