// ShmExport's credential checks on a real abstract Unix socket: who may map
// the node's memory (--shm_allowed_uids / --shm_allowed_gids).
#include "storage_node/dataplane/shm_export.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/fd_passing.h"
#include "storage_node/device/dram_device.h"

namespace hymcache::storage {
namespace {

// What the exporter answers this process: "denied\n" or the area list, and
// how many descriptors came with it.
std::pair<std::string, size_t> Ask(const ShmExport& ex) {
  auto s = ConnectUnixAbstract(ex.socket_name(),
                               absl::Now() + absl::Seconds(10));
  REQUIRE(s.ok());
  std::string payload;
  std::vector<int> fds;
  REQUIRE(RecvWithFds(s->fd(), &payload, &fds, absl::Now() + absl::Seconds(10))
              .ok());
  for (int fd : fds) close(fd);
  return {payload, fds.size()};
}

std::unique_ptr<ShmExport> Export(const MemoryDevice& dev,
                                  void (*tweak)(ShmExportOptions&)) {
  ShmExportOptions o;
  o.areas = dev.Areas();
  tweak(o);
  auto ex = ShmExport::Create(o);
  REQUIRE(ex.ok());
  return std::move(*ex);
}

TEST_CASE("ShmExport serves only the users and groups it allows") {
  DramDeviceOptions d;
  d.capacity_bytes = 1 << 20;
  auto dev = DramDevice::Create(d);
  REQUIRE(dev.ok());

  // By default the node's own user.
  auto ex = Export(**dev, [](ShmExportOptions&) {});
  auto got = Ask(*ex);
  CHECK(got.first != "denied\n");
  CHECK(got.second >= 1);

  // Neither own user nor root allowed, nothing listed: refused.
  ex = Export(**dev, [](ShmExportOptions& o) {
    o.allow_own_user = false;
    o.allow_root = false;
  });
  got = Ask(*ex);
  CHECK(got.first == "denied\n");
  CHECK(got.second == 0);
  CHECK(ex->refused() == 1);

  // Listed by uid, or by (primary) group.
  ex = Export(**dev, [](ShmExportOptions& o) {
    o.allow_own_user = false;
    o.allow_root = false;
    o.allowed_uids = {geteuid()};
  });
  CHECK(Ask(*ex).second >= 1);
  ex = Export(**dev, [](ShmExportOptions& o) {
    o.allow_own_user = false;
    o.allow_root = false;
    o.allowed_gids = {getegid()};
  });
  CHECK(Ask(*ex).second >= 1);
  // Another group only: refused.
  ex = Export(**dev, [](ShmExportOptions& o) {
    o.allow_own_user = false;
    o.allow_root = false;
    o.allowed_gids = {getegid() + 12345};
    o.allowed_uids = {geteuid() + 12345};
  });
  CHECK(Ask(*ex).first == "denied\n");
}

TEST_CASE("ShmExport::Allowed checks uid, primary and supplementary groups") {
  ShmExportOptions o;
  o.allow_own_user = true;
  o.allow_root = false;
  o.allowed_uids = {1001};
  o.allowed_gids = {2002};
  ucred c{};
  c.uid = 500;  // the node's user
  c.gid = 1;
  CHECK(ShmExport::Allowed(o, 500, c, {}));
  c.uid = 0;
  CHECK_FALSE(ShmExport::Allowed(o, 500, c, {}));
  c.uid = 1001;
  CHECK(ShmExport::Allowed(o, 500, c, {}));
  c.uid = 1002;
  CHECK_FALSE(ShmExport::Allowed(o, 500, c, {7, 8}));
  CHECK(ShmExport::Allowed(o, 500, c, {7, 2002}));
  c.gid = 2002;
  CHECK(ShmExport::Allowed(o, 500, c, {}));
}

}  // namespace
}  // namespace hymcache::storage
