#include "master/index_snapshot.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "master/metadata_index.h"

namespace hymcache {
namespace master {
namespace {

std::string TestPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

ObjectLocation At(uint32_t node, uint64_t n) {
  return ObjectLocation{node, static_cast<uint32_t>(n % 3), n * 4096, n + 1,
                    n + 100};
}

std::vector<std::string> Order(const MetadataIndex& index, uint32_t node) {
  std::vector<std::string> out;
  index.ForEachLeastRecent(node, [&](absl::string_view k, const ObjectLocation&,
                                     uint32_t) {
    out.emplace_back(k);
    return true;
  });
  return out;
}

// Everything observable: entries, per-node order, chain links, usage.
std::string Describe(const MetadataIndex& index, uint32_t nodes) {
  std::map<std::string, std::string> entries;
  index.ForEach([&](absl::string_view k, const ObjectLocation& e) {
    auto c = index.Chain(k);
    std::ostringstream o;
    o << e.node_id << "/" << e.region_id << "/" << e.addr << "/" << e.length
      << "/" << e.generation << " parent=" << c->parent
      << " cross=" << c->cross << " children=" << c->children << "+"
      << c->cross_children << " orphan=" << c->orphan;
    entries[std::string(k)] = o.str();
  });
  std::ostringstream o;
  for (const auto& [k, v] : entries) o << k << ": " << v << "\n";
  for (uint32_t n = 1; n <= nodes; ++n) {
    o << "node " << n << ":";
    for (const auto& k : Order(index, n)) o << " " << k;
    o << "\n";
  }
  for (const auto& [t, u] : index.AllTenantUsage()) {
    o << "tenant " << t << " " << u.objects << " " << u.bytes << "\n";
  }
  return o.str();
}

// A random index: chains on one node and across nodes, long keys, tenant
// keys, touches, replacements and erasures (orphans swept).
void Fill(MetadataIndex& index, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    std::string key = "k" + std::to_string(i);
    if (i % 7 == 0) key = std::string(40 + i % 50, 'L') + key;  // out of line
    if (i % 11 == 0) key = "t/acme/" + key;
    std::string parent;
    if (!keys.empty() && rng() % 2) parent = keys[rng() % keys.size()];
    const uint32_t node = 1 + static_cast<uint32_t>(rng() % 3);
    REQUIRE(index.Upsert(key, At(node, i), parent).ok());
    keys.push_back(key);
    if (rng() % 5 == 0) index.Touch(keys[rng() % keys.size()], 7);
    if (rng() % 13 == 0) index.Erase(keys[rng() % keys.size()]);
  }
  for (const auto& [k, e] : index.Orphans()) index.Erase(k);
  REQUIRE(index.ghost_count() == 0);
}

TEST_CASE("An index snapshot restores entries, chains and recency order") {
  const std::string path = TestPath("roundtrip.snap");
  MetadataIndex index;
  Fill(index, 3000, 1);
  REQUIRE(index.size() > 1000);
  auto bytes = WriteIndexSnapshotTemp(path, 12345, index);
  REQUIRE(bytes.ok());
  REQUIRE(CommitIndexSnapshot(path).ok());
  MetadataIndex back;
  // Alongside the restore, the entries' locations (the master builds its
  // allocators from them): every entry's, as the index holds it.
  // (On the reader's second thread: checked here once it returned.)
  std::vector<std::string> alongside;
  absl::Status walked = absl::UnknownError("not called");
  auto seq = ReadIndexSnapshot(path, &back, [&](absl::string_view stream) {
    walked = MetadataIndex::ForEachSnapshotLocation(
        stream, [&](const ObjectLocation& e) {
          alongside.push_back(absl::StrCat(e.node_id, "/", e.region_id, "/",
                                           e.addr, "/", e.length, "/",
                                           e.generation));
        });
  });
  REQUIRE(seq.ok());
  CHECK(walked.ok());
  CHECK(*seq == 12345u);
  CHECK(back.size() == index.size());
  std::vector<std::string> held;
  index.ForEach([&](absl::string_view, const ObjectLocation& e) {
    held.push_back(absl::StrCat(e.node_id, "/", e.region_id, "/", e.addr, "/",
                                e.length, "/", e.generation));
  });
  std::sort(alongside.begin(), alongside.end());
  std::sort(held.begin(), held.end());
  CHECK(alongside == held);
  CHECK(Describe(back, 3) == Describe(index, 3));
  // It works as an index afterwards: evictions walk the same chains.
  std::vector<std::string> a, b;
  auto judge = [](absl::string_view, const ObjectLocation&, uint32_t) {
    return MetadataIndex::Verdict::kEvict;
  };
  index.PickEvictions(2, 1 << 20, judge,
                      [&](absl::string_view k, const ObjectLocation&) {
                        a.emplace_back(k);
                        return true;
                      });
  back.PickEvictions(2, 1 << 20, judge,
                     [&](absl::string_view k, const ObjectLocation&) {
                       b.emplace_back(k);
                       return true;
                     });
  CHECK(a == b);
  REQUIRE(back.Upsert("new", At(1, 1), a.empty() ? "" : a.back()).ok());
  // An empty index round-trips too.
  MetadataIndex empty, empty_back;
  REQUIRE(WriteIndexSnapshotTemp(path, 0, empty).ok());
  REQUIRE(CommitIndexSnapshot(path).ok());
  REQUIRE(ReadIndexSnapshot(path, &empty_back).ok());
  CHECK(empty_back.empty());
}

TEST_CASE("A damaged or missing index snapshot is refused, leaving the index empty") {
  const std::string path = TestPath("damaged.snap");
  MetadataIndex none;
  CHECK(ReadIndexSnapshot(path + ".missing", &none).status().code() ==
        absl::StatusCode::kNotFound);
  MetadataIndex index;
  Fill(index, 500, 2);
  REQUIRE(WriteIndexSnapshotTemp(path, 9, index).ok());
  REQUIRE(CommitIndexSnapshot(path).ok());
  std::string file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& data) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << data;
  };
  std::mt19937_64 rng(3);
  for (int round = 0; round < 20; ++round) {
    std::string bad = file;
    if (round % 2 == 0) {
      bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    } else {
      bad.resize(rng() % bad.size());
    }
    write(bad);
    MetadataIndex back;
    bool called = false;
    auto seq = ReadIndexSnapshot(path, &back,
                                 [&](absl::string_view) { called = true; });
    CHECK(seq.status().code() == absl::StatusCode::kDataLoss);
    CHECK(back.empty());
    // Not with bytes that fail the checksum (a shorter file may fail
    // sooner, before any checksum).
    CHECK_FALSE(called);
  }
}

// A stream of `n` one-byte keys "a", "b", ... on node 1 with the given
// parent positions.
std::string Stream(const std::vector<uint32_t>& parents) {
  std::string s(8, '\0');
  absl::little_endian::Store64(s.data(), parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    char e[2 + 1 + 36] = {};
    absl::little_endian::Store16(e, 1);
    e[2] = static_cast<char>('a' + i);
    absl::little_endian::Store32(e + 3, 1);                  // node
    absl::little_endian::Store64(e + 3 + 8, i * 64);         // addr
    absl::little_endian::Store64(e + 3 + 16, 64);            // length
    absl::little_endian::Store64(e + 3 + 24, i + 1);         // generation
    absl::little_endian::Store32(e + 3 + 32, parents[i]);
    s.append(e, sizeof(e));
  }
  return s;
}

TEST_CASE("MetadataIndex Restore refuses bad parents and loops") {
  constexpr uint32_t kNone = 0xffffffffu;
  {
    MetadataIndex index;
    REQUIRE(index.Restore(Stream({kNone, 0, 1})).ok());
    CHECK(Order(index, 1) == std::vector<std::string>{"a", "b", "c"});
    CHECK(index.Chain("c")->parent == "b");
    CHECK(index.Chain("a")->children == 1);
  }
  for (const auto& parents : std::vector<std::vector<uint32_t>>{
           {kNone, 5}, {0}, {1, 0}, {kNone, 2, 3, 1}}) {
    MetadataIndex index;
    CHECK(index.Restore(Stream(parents)).code() ==
          absl::StatusCode::kDataLoss);
    CHECK(index.empty());
  }
  MetadataIndex index;
  std::string twice = Stream({kNone, kNone});
  twice[8 + 2] = 'b';  // both keys "b"
  CHECK(index.Restore(twice).code() == absl::StatusCode::kDataLoss);
  CHECK(index.empty());
}

}  // namespace
}  // namespace master
}  // namespace hymcache
