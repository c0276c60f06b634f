// Build information stamped into every binary from Bazel's workspace status
// (tools/workspace_status.sh): the release version, the git commit and the
// build time. A build from a tarball without .git says "unknown".
//
// Only the generated stamp (//common:build_info_stamp) changes with each
// commit, so stamping never invalidates other actions; Bazel does not
// rebuild for a new build time alone, so build_time is the time the stamp
// was last regenerated.
//
// Thread safety: the values are constant; safe for concurrent use.
#pragma once

#include <string>

namespace hymcache {

struct BuildStamp {
  std::string version;     // e.g. "0.1.0", or "unknown"
  std::string git_commit;  // full hash, "-dirty" suffixed, or "unknown"
  std::string build_time;  // UTC, e.g. "2026-12-01T19:16:45Z", or "unknown"
};

// The stamp of this binary (for --version and a build-info metric).
const BuildStamp& BuildInfo();

// "PROGRAM VERSION (commit COMMIT, built BUILD_TIME)", one line.
std::string VersionLine(const std::string& program);

}  // namespace hymcache
