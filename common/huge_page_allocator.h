// HugePageAllocator: a standard allocator whose large blocks are mapped on
// their own and ask for transparent huge pages (madvise(MADV_HUGEPAGE),
// best effort: the system's setting decides). For big hash tables, whose
// accesses land anywhere in them: with 4 KiB pages nearly every one also
// misses the TLB, and in a virtual machine each such miss is a nested page
// walk. Restoring a 10 M-entry master spent most of its allocator rebuild
// in those misses (docs/performance.md).
//
// Blocks below kMinBytes come from operator new. Stateless: all instances
// are equal.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

namespace hymcache {

// Bytes HugePageAllocators have mapped and not unmapped, in this process
// (malloc's statistics do not see them: benchmarks of memory add them).
inline std::atomic<size_t> huge_page_mapped_bytes{0};

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  // Blocks of at least this many bytes are mapped (two huge pages: a
  // smaller one would gain little).
  static constexpr size_t kMinBytes = size_t{4} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMinBytes) {
      return static_cast<T*>(
          ::operator new(bytes, std::align_val_t(alignof(T))));
    }
    // Rounded up to whole huge pages; mmap aligns to a page, and the kernel
    // gives huge pages to the 2 MiB-aligned parts.
    void* p = ::mmap(nullptr, MapBytes(bytes), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, MapBytes(bytes), MADV_HUGEPAGE);
    huge_page_mapped_bytes.fetch_add(MapBytes(bytes),
                                     std::memory_order_relaxed);
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMinBytes) {
      ::operator delete(p, std::align_val_t(alignof(T)));
    } else {
      ::munmap(p, MapBytes(bytes));
      huge_page_mapped_bytes.fetch_sub(MapBytes(bytes),
                                       std::memory_order_relaxed);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }

 private:
  static size_t MapBytes(size_t bytes) {
    return (bytes + kHugePage - 1) & ~(kHugePage - 1);
  }
};

// Deletes an array of `n` trivially destructible T from a
// HugePageAllocator<T> (for std::unique_ptr<T[], HugePageDeleter<T>>).
template <typename T>
struct HugePageDeleter {
  size_t n = 0;
  void operator()(T* p) const { HugePageAllocator<T>().deallocate(p, n); }
};

}  // namespace hymcache
