#include "common/malloc_tuning.h"

#include "catch2/catch.hpp"

namespace hymcache {
namespace {

TEST_CASE(
    "A daemon's GLIBC_TUNABLES gets tcache_count=512 when unset or "
    "empty") {
  CHECK(DaemonMallocTunables(nullptr) == "glibc.malloc.tcache_count=512");
  CHECK(DaemonMallocTunables("") == "glibc.malloc.tcache_count=512");
}

TEST_CASE(
    "A daemon's GLIBC_TUNABLES keeps the operator's other tunables and "
    "adds tcache_count after them") {
  CHECK(DaemonMallocTunables("glibc.malloc.mxfast=0") ==
        "glibc.malloc.mxfast=0:glibc.malloc.tcache_count=512");
  CHECK(DaemonMallocTunables(
            "glibc.malloc.tcache_count_extra=1:glibc.pthread.rseq=0") ==
        "glibc.malloc.tcache_count_extra=1:glibc.pthread.rseq=0:"
        "glibc.malloc.tcache_count=512");
}

TEST_CASE(
    "A daemon's GLIBC_TUNABLES is left alone when it names a "
    "tcache_count, whatever its value") {
  CHECK_FALSE(DaemonMallocTunables("glibc.malloc.tcache_count=7").has_value());
  CHECK_FALSE(
      DaemonMallocTunables("glibc.malloc.mxfast=0:glibc.malloc.tcache_count=0")
          .has_value());
  CHECK_FALSE(DaemonMallocTunables("glibc.malloc.tcache_count").has_value());
}

}  // namespace
}  // namespace hymcache
