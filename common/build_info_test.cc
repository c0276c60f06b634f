#include "common/build_info.h"

#include <cctype>
#include <fstream>
#include <string>

#include "catch2/catch.hpp"

namespace hymcache {
namespace {

std::string ReadVersionFile() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  std::ifstream in(std::string(srcdir) + "/hymcache/VERSION");
  std::string line;
  std::getline(in, line);
  return line;
}

TEST_CASE("the stamp carries the VERSION file, a commit and a build time") {
  const BuildStamp& b = BuildInfo();
  CHECK(b.version == ReadVersionFile());
  // A checkout stamps the 40-hex commit (maybe "-dirty"); a tarball "unknown".
  const std::string& commit = b.git_commit;
  if (commit != "unknown") {
    REQUIRE(commit.size() >= 40);
    for (int i = 0; i < 40; ++i) {
      CHECK(std::isxdigit(static_cast<unsigned char>(commit[i])));
    }
    CHECK((commit.size() == 40 || commit.substr(40) == "-dirty"));
  }
  // e.g. 2026-12-01T19:16:45Z
  const std::string& t = b.build_time;
  REQUIRE(t.size() == 20);
  CHECK(t[4] == '-');
  CHECK(t[10] == 'T');
  CHECK(t[19] == 'Z');
}

TEST_CASE("VersionLine names the program, version, commit and build time") {
  const std::string line = VersionLine("hymcache-master");
  CHECK(line.rfind("hymcache-master " + BuildInfo().version, 0) ==
        0);
  CHECK(line.find(BuildInfo().git_commit) != std::string::npos);
  CHECK(line.find(BuildInfo().build_time) != std::string::npos);
}

}  // namespace
}  // namespace hymcache
