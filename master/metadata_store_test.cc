#include "master/metadata_store.h"
#include "master/master_test_util.h"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <filesystem>
#include <map>
#include <string>

#include "master/fake_metadata_store.h"

namespace hymcache {
namespace master {
namespace {

std::unique_ptr<RocksDbMetadataStore> Open(const std::string& path,
                                           uint64_t block = 1 << 20,
                                           uint64_t keep_wal_seconds = 0) {
  RocksDbMetadataStoreOptions o;
  o.path = path;
  o.generation_block = block;
  o.keep_wal_seconds = keep_wal_seconds;
  auto s = RocksDbMetadataStore::Create(o);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(s).value();
}

std::map<std::string, ObjectRecord> AllObjects(MetadataStore* store) {
  std::map<std::string, ObjectRecord> out;
  REQUIRE(store
              ->ForEachObject([&](absl::string_view k, const ObjectRecord& r) {
                out.emplace(std::string(k), r);
              })
              .ok());
  return out;
}

TEST_CASE("ObjectRecord encoding round-trips and rejects garbage") {
  ObjectRecord r{7, 3, 1ull << 40, 12345, 99};
  auto d = DecodeObjectRecord(EncodeObjectRecord(r));
  REQUIRE(d.ok());
  CHECK(*d == r);
  r.last_use_ms = 1765000000123;
  r.parent_key = std::string("\x00parent\xff", 8);
  d = DecodeObjectRecord(EncodeObjectRecord(r));
  REQUIRE(d.ok());
  CHECK(*d == r);
  CHECK(DecodeObjectRecord("").status().code() == absl::StatusCode::kDataLoss);
  std::string bad = EncodeObjectRecord(r);
  bad[0] = 9;
  CHECK(DecodeObjectRecord(bad).status().code() ==
        absl::StatusCode::kDataLoss);
  bad = EncodeObjectRecord(r);
  bad.pop_back();  // the parent key's length disagrees
  CHECK(DecodeObjectRecord(bad).status().code() ==
        absl::StatusCode::kDataLoss);
}

// A value in the first format (what masters before parent keys wrote):
// version 1, node, region, addr, length, generation, little-endian.
std::string FormatOneValue(uint32_t node, uint32_t region, uint64_t addr,
                           uint64_t length, uint64_t generation) {
  std::string v(1, '\x01');
  auto put = [&v](uint64_t x, int bytes) {
    for (int i = 0; i < bytes; ++i) v.push_back(static_cast<char>(x >> (8 * i)));
  };
  put(node, 4);
  put(region, 4);
  put(addr, 8);
  put(length, 8);
  put(generation, 8);
  return v;
}

TEST_CASE("Object records of the first format still load") {
  auto d = DecodeObjectRecord(FormatOneValue(7, 3, 4096, 12345, 99));
  REQUIRE(d.ok());
  CHECK(*d == ObjectRecord{7, 3, 4096, 12345, 99});
  CHECK(d->parent_key.empty());
  CHECK(d->last_use_ms == 0);
  std::string longer = FormatOneValue(7, 3, 4096, 12345, 99) + "x";
  CHECK(DecodeObjectRecord(longer).status().code() ==
        absl::StatusCode::kDataLoss);

  // Written into RocksDB as an older master did, beside a new record.
  const std::string dir = TestDir("format1");
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(o, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    REQUIRE(db->Put(rocksdb::WriteOptions(), "oold",
                    FormatOneValue(1, 0, 64, 10, 5))
                .ok());
    REQUIRE(db->Close().ok());
  }
  auto store = Open(dir);
  ObjectRecord fresh{1, 0, 128, 10, 6};
  fresh.parent_key = "old";
  fresh.last_use_ms = 42;
  REQUIRE(store->PutObjects({{"new", fresh}}).ok());
  auto objs = AllObjects(store.get());
  REQUIRE(objs.size() == 2);
  CHECK(objs["old"] == ObjectRecord{1, 0, 64, 10, 5});
  CHECK(objs["new"] == fresh);
}

TEST_CASE("Later uses are kept apart from the objects and deleted with them") {
  auto check = [](MetadataStore* store) {
    ObjectRecord a{1, 0, 0, 10, 1};
    a.last_use_ms = 100;
    ObjectRecord b{1, 0, 64, 10, 2};
    b.last_use_ms = 200;
    REQUIRE(store->PutObjects({{"a", a}, {"b", b}}).ok());
    MetadataMutation uses;
    uses.object_uses = {{"a", 150}, {"b", 190}, {"gone", 1}};
    CHECK_FALSE(uses.empty());
    REQUIRE(store->Apply(uses).ok());
    auto objs = AllObjects(store);
    REQUIRE(objs.size() == 2);  // a use of no object is no object
    CHECK(objs["a"].last_use_ms == 150);  // the later of the two
    CHECK(objs["b"].last_use_ms == 200);
    // Deleting an object deletes its use: a new object of that key starts
    // from its own commit time.
    REQUIRE(store->DeleteObjects({"a"}).ok());
    a.last_use_ms = 120;
    REQUIRE(store->PutObjects({{"a", a}}).ok());
    CHECK(AllObjects(store)["a"].last_use_ms == 120);
  };
  SECTION("RocksDB") {
    const std::string dir = TestDir("uses");
    {
      auto store = Open(dir);
      check(store.get());
    }
    auto store = Open(dir);  // and across a reopen
    auto objs = AllObjects(store.get());
    CHECK(objs["a"].last_use_ms == 120);
    CHECK(objs["b"].last_use_ms == 200);
  }
  SECTION("fake") {
    FakeMetadataStore store;
    check(&store);
  }
}

// The changes ForEachObjectChangeSince reports, one line each.
std::vector<std::string> ChangesSince(MetadataStore* store, uint64_t after,
                                      absl::Status* status) {
  std::vector<std::string> out;
  *status = store->ForEachObjectChangeSince(
      after, [&](const MetadataStore::ObjectChange& c) {
        using K = MetadataStore::ObjectChange::Kind;
        std::string line = std::string(c.key);
        if (c.kind == K::kPut) {
          line += " put " + std::to_string(c.record->addr) + " parent=" +
                  c.record->parent_key;
        } else if (c.kind == K::kDelete) {
          line += " delete";
        } else {
          line += " use " + std::to_string(c.use_ms);
        }
        out.push_back(line);
      });
  return out;
}

TEST_CASE(
    "RocksDbMetadataStore calls each write listener after every write until it "
    "is removed") {
  auto store = Open(TestDir("write_listener"));
  int a = 0, b = 0;
  const int owner_a = 0, owner_b = 0;
  store->AddWriteListener(&owner_a, [&] { ++a; });
  store->AddWriteListener(&owner_b, [&] { ++b; });
  REQUIRE(store->PutObjects({{"x", ObjectRecord{1, 0, 0, 64, 1}}}).ok());
  MetadataMutation m;
  m.delete_objects.push_back("x");
  REQUIRE(store->Apply(m).ok());
  CHECK(a == 2);
  CHECK(b == 2);
  // Adding again replaces; removing one leaves the other.
  store->AddWriteListener(&owner_a, [&] { a += 10; });
  store->RemoveWriteListener(&owner_b);
  REQUIRE(store->PutObjects({{"y", ObjectRecord{1, 0, 0, 64, 2}}}).ok());
  CHECK(a == 12);
  CHECK(b == 2);
  store->RemoveWriteListener(&owner_a);
  store->RemoveWriteListener(&owner_a);  // none left: nothing happens
  REQUIRE(store->Apply(m).ok());
  CHECK(a == 12);
}

TEST_CASE("RocksDbMetadataStore replays the object changes after a sequence number") {
  const std::string dir = TestDir("changes");
  uint64_t mark = 0;
  {
    auto store = Open(dir, 16, /*keep_wal_seconds=*/3600);
    REQUIRE(store->PutObjects({{"a", ObjectRecord{1, 0, 0, 64, 1}},
                               {"b", ObjectRecord{1, 0, 64, 64, 2}}})
                .ok());
    mark = store->LatestSequence();
    CHECK(mark > 0);
    absl::Status s;
    CHECK(ChangesSince(store.get(), mark, &s).empty());
    CHECK(s.ok());
    ObjectRecord c{1, 0, 128, 64, 3};
    c.parent_key = "b";
    MetadataMutation m;
    m.put_objects.push_back({"c", c});
    m.delete_objects.push_back("a");
    m.object_uses.push_back({"b", 777});
    hymcache::v1::NodeInfo node;  // not an object change: not reported
    node.set_name("n");
    node.set_node_id(1);
    m.put_nodes.push_back(node);
    REQUIRE(store->Apply(m).ok());
    for (int i = 0; i < 40; ++i) {  // generation blocks in between
      REQUIRE(store->NextGeneration().ok());
    }
    REQUIRE(store->DeleteObjects({"c"}).ok());
    const std::vector<std::string> want = {
        "a delete", "c put 128 parent=b", "b use 777", "c delete"};
    CHECK(ChangesSince(store.get(), mark, &s) == want);
    CHECK(s.ok());
    CHECK(ChangesSince(store.get(), store->LatestSequence() + 5, &s).empty());
    CHECK(s.code() == absl::StatusCode::kNotFound);
  }
  {
    // After a reopen (which flushes the log into a table file and retires
    // the log): the kept log still has them.
    auto store = Open(dir, 16, /*keep_wal_seconds=*/3600);
    absl::Status s;
    auto changes = ChangesSince(store.get(), mark, &s);
    CHECK(s.ok());
    CHECK(changes == std::vector<std::string>{"a delete", "c put 128 parent=b",
                                              "b use 777", "c delete"});
    // From later sequence numbers: a suffix.
    auto tail = ChangesSince(store.get(), mark + 2, &s);
    CHECK(s.ok());
    CHECK(tail.size() < changes.size());
    CHECK(std::equal(tail.rbegin(), tail.rend(), changes.rbegin()));
  }
  {
    // Without keeping logs a reopen retires them: the changes are gone, and
    // the store says so rather than report some of them.
    auto store = Open(dir, 16, /*keep_wal_seconds=*/0);
    REQUIRE(store->PutObjects({{"d", ObjectRecord{1, 0, 192, 64, 9}}}).ok());
  }
  auto store = Open(dir, 16, /*keep_wal_seconds=*/0);
  absl::Status s;
  ChangesSince(store.get(), mark, &s);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  FakeMetadataStore fake;
  CHECK(fake.LatestSequence() == 0);
  ChangesSince(&fake, 0, &s);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("RocksDbMetadataStore rejects bad options") {
  CHECK(RocksDbMetadataStore::Create({}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  RocksDbMetadataStoreOptions o;
  o.path = TestDir("badopts");
  o.generation_block = 0;
  CHECK(RocksDbMetadataStore::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("RocksDbMetadataStore persists objects and nodes across reopen") {
  const std::string dir = TestDir("persist");
  {
    auto store = Open(dir);
    CHECK(AllObjects(store.get()).empty());
    REQUIRE(store->LoadNodes().ok());
    CHECK(store->LoadNodes()->empty());

    MetadataMutation m;
    std::string binary_key("\x00\x01\xff key", 8);
    m.put_objects.push_back({"a", ObjectRecord{1, 0, 0, 100, 5}});
    m.put_objects.push_back({"b", ObjectRecord{1, 2, 4096, 200, 6}});
    m.put_objects.push_back({binary_key, ObjectRecord{2, 0, 64, 1, 7}});
    hymcache::v1::NodeInfo node;
    node.set_node_id(1);
    node.set_name("node-a");
    node.set_incarnation(42);
    node.set_data_address("127.0.0.1:7000");
    node.set_control_address("127.0.0.1:7001");
    node.set_alive(false);            // durable: the deregistration mark
    node.set_object_count(3);         // not durable
    auto* region = node.add_regions();
    region->set_region_id(2);
    region->set_capacity_bytes(1 << 20);
    region->set_alignment(64);
    region->set_persistent(true);
    region->set_used_bytes(999);      // not durable
    (*node.mutable_transport_params())["shm"] = std::string("\x00path", 5);
    m.put_nodes.push_back(node);
    REQUIRE(store->Apply(m).ok());

    REQUIRE(store->DeleteObjects({"a", "missing"}).ok());
  }
  {
    auto store = Open(dir);
    auto objs = AllObjects(store.get());
    REQUIRE(objs.size() == 2);
    CHECK(objs["b"] == ObjectRecord{1, 2, 4096, 200, 6});
    CHECK(objs[std::string("\x00\x01\xff key", 8)] ==
          ObjectRecord{2, 0, 64, 1, 7});
    auto nodes = store->LoadNodes();
    REQUIRE(nodes.ok());
    REQUIRE(nodes->size() == 1);
    const auto& n = (*nodes)[0];
    CHECK(n.node_id() == 1);
    CHECK(n.name() == "node-a");
    CHECK(n.incarnation() == 42);
    CHECK(n.data_address() == "127.0.0.1:7000");
    CHECK(n.control_address() == "127.0.0.1:7001");
    CHECK_FALSE(n.alive());
    CHECK(n.object_count() == 0);
    REQUIRE(n.regions_size() == 1);
    CHECK(n.regions(0).region_id() == 2);
    CHECK(n.regions(0).persistent());
    CHECK(n.regions(0).used_bytes() == 0);
    CHECK(n.transport_params().at("shm") == std::string("\x00path", 5));

    // Overwrite a node record.
    hymcache::v1::NodeInfo n2 = n;
    n2.set_incarnation(43);
    REQUIRE(store->PutNode(n2).ok());
    REQUIRE(store->LoadNodes()->at(0).incarnation() == 43);

    // Delete it (and a missing one: not an error).
    MetadataMutation m;
    m.delete_nodes = {n.name(), "no-such-node"};
    REQUIRE(store->Apply(m).ok());
    CHECK(store->LoadNodes()->empty());
  }
}

TEST_CASE("RocksDbMetadataStore never repeats a generation across restarts") {
  const std::string dir = TestDir("generations");
  uint64_t last = 0;
  for (int round = 0; round < 4; ++round) {
    auto store = Open(dir, /*block=*/8);
    // Use fewer, exactly, and more than one block.
    int n = round * 7 + 1;
    for (int i = 0; i < n; ++i) {
      auto g = store->NextGeneration();
      REQUIRE(g.ok());
      CHECK(*g > last);
      last = *g;
    }
  }
  CHECK(last > 0);
}

TEST_CASE("RocksDbMetadataStore hands out generations of its term's range only") {
  const std::string dir = TestDir("generation_range");
  RocksDbMetadataStoreOptions o;
  o.path = dir;
  o.generation_block = 4;
  // Term 5: [5 << 32, 6 << 32); an empty store starts at the floor.
  o.generation_floor = uint64_t{5} << 32;
  o.generation_end = (uint64_t{5} << 32) + 6;
  {
    auto store = RocksDbMetadataStore::Create(o);
    REQUIRE(store.ok());
    for (uint64_t i = 0; i < 6; ++i) {
      auto g = (*store)->NextGeneration();
      REQUIRE(g.ok());
      CHECK(*g == o.generation_floor + i);
    }
    auto past = (*store)->NextGeneration();
    CHECK(past.status().code() == absl::StatusCode::kResourceExhausted);
  }
  // A later term on the same store starts at its own floor, above it all.
  o.generation_floor = uint64_t{9} << 32;
  o.generation_end = uint64_t{10} << 32;
  auto store = RocksDbMetadataStore::Create(o);
  REQUIRE(store.ok());
  auto g = (*store)->NextGeneration();
  REQUIRE(g.ok());
  CHECK(*g == uint64_t{9} << 32);
  // An end at or below the floor is refused.
  o.generation_end = o.generation_floor;
  CHECK(RocksDbMetadataStore::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "The generations a store reserved are read beside its open handle, and "
    "are 0 where no store is") {
  const std::string dir = TestDir("reserved_limit");
  auto none = ReadReservedGenerationLimit(dir + "/absent");
  REQUIRE(none.ok());
  CHECK(*none == 0);
  RocksDbMetadataStoreOptions o;
  o.path = dir;
  o.generation_block = 4;
  o.generation_floor = uint64_t{7} << 32;
  auto store = RocksDbMetadataStore::Create(o);
  REQUIRE(store.ok());
  // Open: the block reserved at open, then the next one.
  auto limit = ReadReservedGenerationLimit(dir);
  REQUIRE(limit.ok());
  CHECK(*limit == (uint64_t{7} << 32) + 4);
  for (int i = 0; i < 5; ++i) REQUIRE((*store)->NextGeneration().ok());
  limit = ReadReservedGenerationLimit(dir);
  REQUIRE(limit.ok());
  CHECK(*limit == (uint64_t{7} << 32) + 8);
  CHECK((*limit >> 32) == 7);  // the epoch its generations came from
}

TEST_CASE("RocksDbMetadataStore refuses a second open of the same directory") {
  const std::string dir = TestDir("locked");
  auto first = Open(dir);
  RocksDbMetadataStoreOptions o;
  o.path = dir;
  auto second = RocksDbMetadataStore::Create(o);
  CHECK_FALSE(second.ok());
}

TEST_CASE("RocksDbMetadataStore handles a large batch") {
  const std::string dir = TestDir("batch");
  auto store = Open(dir);
  std::vector<std::pair<std::string, ObjectRecord>> objs;
  std::vector<std::string> keys;
  for (int i = 0; i < 5000; ++i) {
    std::string key = "key-" + std::to_string(i);
    objs.push_back({key, ObjectRecord{1, 0, uint64_t(i) * 64, 64, uint64_t(i) + 1}});
    keys.push_back(key);
  }
  REQUIRE(store->PutObjects(objs).ok());
  CHECK(AllObjects(store.get()).size() == 5000);
  keys.resize(4000);
  REQUIRE(store->DeleteObjects(keys).ok());
  CHECK(AllObjects(store.get()).size() == 1000);
}

TEST_CASE("RocksDbMetadataStore on a full disk refuses writes, keeps reads") {
  // A 4 MiB tmpfs: needs root (or a user namespace allowing mounts).
  const std::string dir = TestDir("fulldisk");
  std::filesystem::create_directories(dir);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=4194304") != 0) {
    WARN("cannot mount a tmpfs (" << std::strerror(errno) << "); skipping");
    return;
  }
  struct Unmount {
    std::string d;
    ~Unmount() { umount2(d.c_str(), MNT_DETACH); }
  } unmount{dir};
  const std::string db = dir + "/db";
  {
    auto store = Open(db);
    // An empty store takes little room: no preallocated WAL or MANIFEST.
    uint64_t bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(db)) {
      if (e.is_regular_file()) bytes += e.file_size();
    }
    CHECK(bytes < (1 << 20));
    REQUIRE(store->PutObjects({{"kept", ObjectRecord{1, 0, 0, 10, 1}}}).ok());

    // Fill the filesystem.
    int fd = open((dir + "/filler").c_str(), O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(64 << 10, 'f');
    while (true) {
      ssize_t n = write(fd, chunk.data(), chunk.size());
      if (n < 0) break;
      if (n < static_cast<ssize_t>(chunk.size())) {
        chunk.resize(std::max<size_t>(1, chunk.size() / 2));
      }
    }
    close(fd);

    absl::Status s;
    for (int i = 0; i < 1000 && s.ok(); ++i) {
      s = store->PutObjects(
          {{"k" + std::to_string(i), ObjectRecord{1, 0, 4096, 10, 2}}});
    }
    INFO(s.ToString());
    REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
    CHECK(s.message().find("full") != absl::string_view::npos);
    CHECK(store->PutObjects({{"x", ObjectRecord{1, 0, 8192, 10, 3}}}).code() ==
          absl::StatusCode::kResourceExhausted);
    // Reads go on.
    CHECK(AllObjects(store.get()).count("kept") == 1);
    // Closing on the full disk must not crash.
  }
  REQUIRE(unlink((dir + "/filler").c_str()) == 0);
  auto store = Open(db);
  CHECK(AllObjects(store.get()).count("kept") == 1);
  CHECK(store->PutObjects({{"after", ObjectRecord{1, 0, 0, 10, 9}}}).ok());
}

TEST_CASE("FakeMetadataStore applies and fails on demand") {
  FakeMetadataStore store;
  REQUIRE(store.PutObjects({{"a", ObjectRecord{1, 0, 0, 1, 1}}}).ok());
  store.FailWritesForTest(absl::UnavailableError("disk gone"));
  CHECK(store.DeleteObjects({"a"}).code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE(store.NextGeneration().ok());
  store.FailWritesForTest(absl::OkStatus());
  CHECK(store.object_count() == 1);
  CHECK(*store.NextGeneration() == 1);
}

}  // namespace
}  // namespace master
}  // namespace hymcache
