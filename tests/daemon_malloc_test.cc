// The master runs with glibc's thread cache enlarged (common/
// malloc_tuning.h): started as a supervisor starts it, it re-executes
// itself once with GLIBC_TUNABLES set, in the same process, and serves. An
// operator's own tcache_count stands. Sanitizer builds do not re-execute.
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "tests/daemon.h"

namespace hymcache::testing {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kReexecs = false;
#else
constexpr bool kReexecs = true;
#endif

// GLIBC_TUNABLES in the environment of process `pid` (that of its current
// image), or nullopt. glibc (2.36) parses the variable in place in the
// process's initial environment, writing a NUL over each ':' between
// tunables (the process itself reads an intact copy): the pieces that
// follow, "glibc.*" ones, are joined again.
std::optional<std::string> TunablesOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  const std::string all((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
  std::optional<std::string> out;
  for (absl::string_view var : absl::StrSplit(all, '\0')) {
    if (!out.has_value()) {
      if (absl::ConsumePrefix(&var, "GLIBC_TUNABLES=")) out = std::string(var);
    } else if (absl::StartsWith(var, "glibc.")) {
      absl::StrAppend(&*out, ":", var);
    } else {
      break;
    }
  }
  return out;
}

// Starts a master with `env` added, waits until it serves, and returns its
// GLIBC_TUNABLES; the master is then stopped.
std::optional<std::string> MasterTunables(const std::vector<std::string>& env) {
  // Only `env`'s: none inherited from whoever runs the test.
  unsetenv("GLIBC_TUNABLES");
  auto d = Daemon::Start(RunfilePath("master/hymcache-master"),
                         {"--db_path=" + TempDir("master"),
                          "--listen=127.0.0.1:0", "--logtostderr"},
                         absl::Seconds(30), env);
  REQUIRE(d.ok());
  // It serves, as the process the test started (exec keeps the pid).
  REQUIRE(absl::StartsWith(d->ready_line(), "hymcache-master listening on "));
  std::optional<std::string> tunables = TunablesOf(d->pid());
  CHECK(d->Stop(SIGTERM).ok());
  return tunables;
}

TEST_CASE(
    "A master started without GLIBC_TUNABLES serves with "
    "tcache_count=512 in its environment") {
  const std::optional<std::string> t = MasterTunables({});
  if (kReexecs) {
    CHECK(t == "glibc.malloc.tcache_count=512");
  } else {
    CHECK_FALSE(t.has_value());
  }
}

TEST_CASE(
    "A master keeps the operator's other tunables and adds "
    "tcache_count") {
  const std::optional<std::string> t =
      MasterTunables({"GLIBC_TUNABLES=glibc.malloc.mxfast=0"});
  if (kReexecs) {
    CHECK(t == "glibc.malloc.mxfast=0:glibc.malloc.tcache_count=512");
  } else {
    CHECK(t == "glibc.malloc.mxfast=0");
  }
}

TEST_CASE("A master leaves the operator's tcache_count as it is") {
  CHECK(MasterTunables({"GLIBC_TUNABLES=glibc.malloc.tcache_count=7"}) ==
        "glibc.malloc.tcache_count=7");
}

}  // namespace
}  // namespace hymcache::testing
