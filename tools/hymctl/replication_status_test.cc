#include "tools/hymctl/replication_status.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

namespace hymcache::hymctl {
namespace {

TEST_CASE(
    "The replication line names the mode, each standby's lag and the "
    "overall lag") {
  const std::map<std::string, double> stats = {
      {"replication_mode{mode=\"confirm\"}", 1},
      {"replication_followers", 2},
      {"replication_copying", 1},
      {"replication_lag_sequences", 3},
      {"replication_lag_seconds", 0.0125},
      {"replication_lag_sequences{follower=\"10.0.0.2:50051\"}", 3},
      {"replication_lag_seconds{follower=\"10.0.0.2:50051\"}", 0.0125},
      {"replication_lag_sequences{follower=\"10.0.0.3:50051\"}", 40},
      {"objects", 7}};
  auto r = ParseReplicationStatus(stats);
  REQUIRE(r.has_value());
  CHECK(r->mode == "confirm");
  CHECK(r->followers == 2);
  CHECK(r->copying == 1);
  REQUIRE(r->standbys.size() == 2);
  CHECK(r->standbys[0].name == "10.0.0.2:50051");
  CHECK(r->standbys[0].lag_seconds == 0.0125);
  CHECK(r->standbys[1].lag_sequences == 40);
  CHECK(!r->standbys[1].lag_seconds.has_value());
  CHECK(FormatReplicationStatus(*r) ==
        "replication: confirm, 2 standbys following (10.0.0.2:50051 3 "
        "writes behind, 10.0.0.3:50051 40 writes behind), 1 copying; lag 3 "
        "writes, 0.013 s");
}

TEST_CASE(
    "A master without a replication mode has no replication line, and a "
    "leader without standbys says so") {
  CHECK(!ParseReplicationStatus(
             {{"objects", 7}, {"replication_lag_sequences", 9}})
             .has_value());
  // A mode gauge at 0 names no mode.
  CHECK(!ParseReplicationStatus({{"replication_mode{mode=\"async\"}", 0}})
             .has_value());
  auto alone = ParseReplicationStatus({{"replication_mode{mode=\"async\"}", 1},
                                       {"replication_followers", 0},
                                       {"replication_lag_sequences", 12}});
  REQUIRE(alone.has_value());
  CHECK(FormatReplicationStatus(*alone) ==
        "replication: async, 0 standbys following, 0 copying; lag 12 writes");
}

}  // namespace
}  // namespace hymcache::hymctl
