// The glibc allocator's settings a daemon runs with.
//
// glibc keeps up to 7 freed chunks per size class in each thread's cache
// (tcache) by default; a freed chunk beyond that goes to the arena's bins,
// under its lock, with coalescing (`_int_free`, `unlink_chunk`,
// `malloc_consolidate`). A master's request path allocates and frees many
// small objects per call (gRPC's call state and slices, protobuf messages,
// closures), so with the default most frees take that path. With 512
// chunks per class the master's CPU per BatchLookup fell by 15% and per put
// by 9%, with the same peak resident memory (docs/performance.md, "glibc's
// thread cache"). Only the environment (GLIBC_TUNABLES, read when a program
// starts) sets the tcache's size, so the master re-executes itself once
// with it set (ReexecWithDaemonMallocTunables, first in its main()). The
// storage node, whose bytes live in its regions and buffers, keeps glibc's
// defaults: not measured.
//
// An operator's own glibc.malloc.tcache_count in GLIBC_TUNABLES stands
// (glibc.malloc.tcache_count=7 restores glibc's default). Sanitizer builds
// replace the allocator and do not re-execute.
#pragma once

#include <optional>
#include <string>

namespace hymcache {

// Chunks per size class in each thread's cache (glibc.malloc.tcache_count).
inline constexpr int kDaemonTcacheCount = 512;

// The GLIBC_TUNABLES value for a daemon, given the environment's (`current`,
// null when unset): `current` with glibc.malloc.tcache_count=
// kDaemonTcacheCount appended, or nullopt when `current` names a
// tcache_count already (nothing to change).
std::optional<std::string> DaemonMallocTunables(const char* current);

// Called first in a daemon's main(), with main's argv as given: if
// DaemonMallocTunables has something to add, sets GLIBC_TUNABLES and executes
// /proc/self/exe with the same arguments (same process id, so a supervisor sees
// no change; systemd's NOTIFY_SOCKET and the rest of the environment are kept).
// Returns when there is nothing to add, in a sanitizer build, in a
// secure-execution start (AT_SECURE: glibc would erase the tunable again),
// or when the exec fails: then the daemon runs with glibc's defaults, having
// said why on stderr.
void ReexecWithDaemonMallocTunables(char** argv);

}  // namespace hymcache
