#include "common/build_info.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

// Defined in the generated build_info_stamp.cc (see common/BUILD).
extern "C" const char kHymcacheStampVersion[];
extern "C" const char kHymcacheStampGitCommit[];
extern "C" const char kHymcacheStampBuildTimestamp[];

namespace hymcache {
namespace {

std::string OrUnknown(const char* s) {
  return (s == nullptr || *s == '\0') ? "unknown" : s;
}

// BUILD_TIMESTAMP is seconds since the epoch.
std::string FormatBuildTime(const char* stamp) {
  int64_t seconds = 0;
  if (stamp == nullptr || !absl::SimpleAtoi(stamp, &seconds) || seconds <= 0) {
    return "unknown";
  }
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(seconds),
                          absl::UTCTimeZone());
}

}  // namespace

const BuildStamp& BuildInfo() {
  static const BuildStamp* stamp = new BuildStamp{
      OrUnknown(kHymcacheStampVersion), OrUnknown(kHymcacheStampGitCommit),
      FormatBuildTime(kHymcacheStampBuildTimestamp)};
  return *stamp;
}

std::string VersionLine(const std::string& program) {
  const BuildStamp& b = BuildInfo();
  return absl::StrCat(program, " ", b.version, " (commit ", b.git_commit,
                      ", built ", b.build_time, ")");
}

}  // namespace hymcache
