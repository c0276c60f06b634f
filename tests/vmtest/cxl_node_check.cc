// Checks the CXL NUMA node that tests/vmtest/run.sh cxl sets up: the node
// named by HYMCACHE_CXL_NODE has memory and no CPUs, memory allocated on it
// with libnuma really lands there (move_pages query), and it holds data.
//
//   bazel build -c opt //tests:vmtest_cxl_node_check
//   tests/vmtest/run.sh cxl "$(bazel info -c opt
//   bazel-bin)/tests/vmtest_cxl_node_check" [MiB]
//
// Without HYMCACHE_CXL_NODE it prints why and exits 0 (skipped).
// Output: "N passed, N failed".
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace {

double Seconds() {
  using C = std::chrono::steady_clock;
  return std::chrono::duration<double>(C::now().time_since_epoch()).count();
}

int Main(int argc, char** argv) {
  const char* env = getenv("HYMCACHE_CXL_NODE");
  if (env == nullptr || *env == '\0') {
    printf(
        "SKIP: HYMCACHE_CXL_NODE is not set (run under tests/vmtest/run.sh "
        "cxl)\n");
    return 0;
  }
  const int node = atoi(env);
  const size_t mib = argc > 1 ? strtoul(argv[1], nullptr, 10) : 128;
  const size_t size = mib << 20;
  int passed = 0, failed = 0;
  auto check = [&](bool ok, const char* what) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    ok ? ++passed : ++failed;
    return ok;
  };
  if (!check(numa_available() >= 0, "libnuma available")) {
    printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  long long free_bytes = 0;
  long long node_bytes = numa_node_size64(node, &free_bytes);
  bitmask* cpus = numa_allocate_cpumask();
  numa_node_to_cpus(node, cpus);
  unsigned ncpus = numa_bitmask_weight(cpus);
  numa_free_cpumask(cpus);
  printf("max node %d; node %d: %lld MiB (%lld MiB free), %u CPUs\n",
         numa_max_node(), node, node_bytes >> 20, free_bytes >> 20, ncpus);
  check(node > 0 && node <= numa_max_node(), "node number is a non-zero node");
  check(node_bytes >= static_cast<long long>(size),
        "node has room for the test");
  check(ncpus == 0, "node has no CPUs (memory-only, like a CXL expander)");

  auto* p = static_cast<uint64_t*>(numa_alloc_onnode(size, node));
  if (!check(p != nullptr, "numa_alloc_onnode")) {
    printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  const size_t words = size / sizeof(uint64_t);
  double t0 = Seconds();
  for (size_t i = 0; i < words; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
  double t1 = Seconds();
  size_t bad = 0;
  for (size_t i = 0; i < words; ++i) bad += p[i] != i * 0x9E3779B97F4A7C15ull;
  check(bad == 0, "pattern reads back");

  const long page = sysconf(_SC_PAGESIZE);
  const size_t pages = size / page;
  std::vector<void*> addrs(pages);
  std::vector<int> status(pages, -1);
  for (size_t i = 0; i < pages; ++i) {
    addrs[i] = reinterpret_cast<char*>(p) + i * page;
  }
  size_t on_node = 0;
  if (move_pages(0, pages, addrs.data(), nullptr, status.data(), 0) == 0) {
    for (int s : status) on_node += s == node;
  }
  printf("pages on node %d: %zu/%zu; first-touch write %.0f MB/s\n", node,
         on_node, pages, size / (t1 - t0) / 1e6);
  check(on_node == pages, "every page is on the CXL node");
  numa_free(p, size);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
