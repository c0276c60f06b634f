#include "common/malloc_tuning.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace hymcache {

namespace {

constexpr absl::string_view kTcacheCount = "glibc.malloc.tcache_count";

}  // namespace

std::optional<std::string> DaemonMallocTunables(const char* current) {
  const absl::string_view now = current == nullptr ? "" : current;
  // GLIBC_TUNABLES is NAME=VALUE pairs separated by ':'.
  for (absl::string_view pair : absl::StrSplit(now, ':', absl::SkipEmpty())) {
    const absl::string_view name = pair.substr(0, pair.find('='));
    if (name == kTcacheCount) return std::nullopt;
  }
  const std::string ours = absl::StrCat(kTcacheCount, "=", kDaemonTcacheCount);
  if (now.empty()) return ours;
  return absl::StrCat(now, ":", ours);
}

void ReexecWithDaemonMallocTunables(char** argv) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  (void)argv;
  return;
#else
  // A secure-execution start (setuid, setgid, file capabilities): glibc
  // erases the malloc tunables from the new image's environment, so the
  // image would find nothing and execute again, for ever.
  if (getauxval(AT_SECURE) != 0) return;
  const std::optional<std::string> tunables =
      DaemonMallocTunables(std::getenv("GLIBC_TUNABLES"));
  if (!tunables.has_value()) return;
  // Once: the new image finds its tcache_count in the environment.
  if (setenv("GLIBC_TUNABLES", tunables->c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  const int err = errno;
  std::cerr << (argv[0] != nullptr ? argv[0] : "daemon")
            << ": running with glibc's default thread cache: cannot "
               "re-execute /proc/self/exe with GLIBC_TUNABLES="
            << *tunables << ": " << std::strerror(err) << "\n";
#endif
}

}  // namespace hymcache
