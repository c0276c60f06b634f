// StandbySnapshots (master/standby_snapshots.h): a standby's snapshots of a
// store another handle writes, as its follower does, and a master elected
// on that store loading from them.

#include "master/standby_snapshots.h"

#include <atomic>
#include <filesystem>

#include "common/eventually.h"
#include "master/master_service_test_fixture.h"

namespace hymcache {
namespace master {
namespace service_test {
namespace {

TEST_CASE(
    "A standby snapshots its store every snapshot_changes applied, and the "
    "master elected on that store loads from the snapshot and the changes "
    "since") {
  // The follower's side: a store written through a service of its own
  // (which writes no snapshot), open while the standby reads it.
  Harness h("standby_snapshots");
  h.Register("a", 1, {{0, 1 << 24}});
  for (int i = 0; i < 30; ++i) h.Put({absl::StrCat("k", i)}, kObj);
  const std::string snapshot = h.dir + ".snapshot";

  std::atomic<uint64_t> applied{5};
  StandbySnapshotsOptions o;
  o.master.db_path = h.dir;
  o.master.service.snapshot_changes = 10;
  o.applied = [&applied] { return applied.load(); };
  o.check_interval = absl::Milliseconds(5);
  auto made = StandbySnapshots::Start(o);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  StandbySnapshots& snaps = **made;
  auto checks_pass = [&](uint64_t n) {
    const uint64_t from = snaps.GetStats().checks;
    return testing::Eventually(
        [&] { return snaps.GetStats().checks >= from + n; });
  };

  // Fewer than snapshot_changes applied since it started: none.
  REQUIRE(checks_pass(3));
  CHECK(snaps.GetStats().written == 0);
  CHECK_FALSE(std::filesystem::exists(snapshot));
  applied = 15;
  REQUIRE(testing::Eventually([&] { return snaps.GetStats().written == 1; }));
  CHECK(std::filesystem::exists(snapshot));
  CHECK(snaps.GetStats().last_sequence > 0);
  // Then half the index (15 objects) more: 5 are not enough, 15 are.
  applied = 20;
  REQUIRE(checks_pass(3));
  CHECK(snaps.GetStats().written == 1);
  applied = 30;
  REQUIRE(testing::Eventually([&] { return snaps.GetStats().written == 2; }));
  CHECK(snaps.GetStats().failed == 0);

  // Writes after it, then the election: no snapshot after Stop, whatever
  // is applied.
  for (int i = 30; i < 40; ++i) h.Put({absl::StrCat("k", i)}, kObj);
  h.Put({"chained"}, kObj);
  snaps.Stop();
  applied = 1000;
  made->reset();
  const std::vector<std::string> before = Everything(h.svc.get());
  REQUIRE(before.size() == 41);

  // The follower closes its store; the elected master opens it with the
  // snapshot beside it: loaded from it plus the 11 puts since.
  h.svc.reset();
  RocksDbMetadataStoreOptions so;
  so.path = h.dir;
  so.keep_wal_seconds = 3600;
  auto store = RocksDbMetadataStore::Create(so);
  REQUIRE(store.ok());
  MasterServiceOptions mo = h.options;
  mo.snapshot_path = snapshot;
  auto elected = MasterService::Create(mo, std::move(store).value());
  INFO(elected.status().ToString());
  REQUIRE(elected.ok());
  CHECK((*elected)->load_path() == MasterService::LoadPath::kSnapshot);
  CHECK(Everything(elected->get()) == before);
}

TEST_CASE("StandbySnapshotsOptions refuse what cannot work") {
  StandbySnapshotsOptions o;
  o.master.db_path = TestDir("standby_snapshots_options");
  o.applied = [] { return uint64_t{0}; };
  CHECK(o.Validate().ok());
  StandbySnapshotsOptions bad = o;
  bad.master.service.snapshot_changes = 0;
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.master.index_snapshots = false;
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.applied = nullptr;
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.nice = 20;
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.check_interval = absl::ZeroDuration();
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace service_test
}  // namespace master
}  // namespace hymcache
