#include "storage_node/dataplane/extent_table.h"

#include <atomic>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "common/thread.h"

namespace hymcache::storage {
namespace {

constexpr uint64_t kCap = 1 << 20;

std::unique_ptr<ExtentTable> MakeTable(
    absl::Duration drain = absl::Seconds(5)) {
  ExtentTableOptions o;
  RegionDescriptor r;
  r.region_id = 1;
  r.capacity_bytes = kCap;
  o.regions = {r};
  o.drain_timeout = drain;
  auto t = ExtentTable::Create(o);
  REQUIRE(t.ok());
  return std::move(*t);
}

ExtentKey Key(uint64_t addr, uint64_t len, uint64_t gen) {
  return ExtentKey{1, addr, len, gen};
}

absl::StatusCode PinCode(ExtentTable& t, const ExtentKey& k) {
  return t.PinRead(k).status().code();
}

void Store(ExtentTable& t, const ExtentKey& k) {
  auto w = t.BeginWrite(k);
  REQUIRE(w.ok());
  REQUIRE(w->Commit().ok());
}

// Waits (bounded) until `pred` holds; the table has no hooks to block on.
template <typename Pred>
bool Eventually(Pred pred) {
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred();
}

TEST_CASE("ExtentTable: committed writes are readable by exact key only") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 5));
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kOk);
  CHECK(PinCode(*t, Key(0, 100, 4)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(0, 100, 6)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(0, 99, 5)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(1, 99, 5)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(200, 10, 5)) == absl::StatusCode::kNotFound);
  ExtentTableStats s = t->Stats();
  CHECK(s.extents == 1);
  CHECK(s.bytes == 100);
  CHECK(s.pinned_reads == 0);
}

TEST_CASE("ExtentTable: a write in progress is not readable; abort leaves "
          "nothing") {
  auto t = MakeTable();
  {
    auto w = t->BeginWrite(Key(0, 100, 5));
    REQUIRE(w.ok());
    CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kNotFound);
    CHECK(t->Stats().writing == 1);
    w->Abort();
    w->Abort();  // idempotent
  }
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kNotFound);
  {
    auto w = t->BeginWrite(Key(0, 100, 6));
    REQUIRE(w.ok());
    // Destroyed without commit: aborted.
  }
  CHECK(PinCode(*t, Key(0, 100, 6)) == absl::StatusCode::kNotFound);
  ExtentTableStats s = t->Stats();
  CHECK(s.extents == 0);
  CHECK(s.writing == 0);
  // The space is free again for the same generation.
  Store(*t, Key(0, 100, 6));
  CHECK(PinCode(*t, Key(0, 100, 6)) == absl::StatusCode::kOk);
}

TEST_CASE("ExtentTable: region and bounds are checked") {
  auto t = MakeTable();
  CHECK(t->BeginWrite(ExtentKey{2, 0, 10, 1}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(t->BeginWrite(Key(kCap - 5, 10, 1)).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(t->BeginWrite(Key(UINT64_MAX - 2, 10, 1)).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(t->BeginWrite(Key(0, 0, 1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(PinCode(*t, ExtentKey{2, 0, 10, 1}) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(PinCode(*t, Key(kCap, 1, 1)) == absl::StatusCode::kOutOfRange);
  Store(*t, Key(kCap - 10, 10, 1));  // the last bytes are usable
}

TEST_CASE("ExtentTable: stale generations are refused") {
  auto t = MakeTable();
  Store(*t, Key(1000, 100, 5));
  // Lower generation, overlapping in various ways.
  CHECK(t->BeginWrite(Key(1000, 100, 4)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(t->BeginWrite(Key(950, 100, 4)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(t->BeginWrite(Key(1099, 1, 3)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(t->BeginWrite(Key(0, 4096, 1)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // Same generation again (a duplicate write).
  CHECK(t->BeginWrite(Key(1000, 100, 5)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // The refusals did not disturb the object.
  CHECK(PinCode(*t, Key(1000, 100, 5)) == absl::StatusCode::kOk);
  // Adjacent, not overlapping: any generation is fine.
  Store(*t, Key(900, 100, 1));
  Store(*t, Key(1100, 100, 2));
  CHECK(PinCode(*t, Key(900, 100, 1)) == absl::StatusCode::kOk);
  CHECK(PinCode(*t, Key(1100, 100, 2)) == absl::StatusCode::kOk);
  CHECK(t->Stats().extents == 3);
}

TEST_CASE("ExtentTable: reused space drops the older extents") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 5));
  Store(*t, Key(100, 100, 6));
  Store(*t, Key(300, 100, 2));
  auto w = t->BeginWrite(Key(50, 100, 7));  // overlaps gen 5 and gen 6
  REQUIRE(w.ok());
  // Invalidated at once, before the new bytes are committed.
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(100, 100, 6)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(50, 100, 7)) == absl::StatusCode::kNotFound);
  REQUIRE(w->Commit().ok());
  CHECK(PinCode(*t, Key(50, 100, 7)) == absl::StatusCode::kOk);
  CHECK(PinCode(*t, Key(300, 100, 2)) == absl::StatusCode::kOk);
  ExtentTableStats s = t->Stats();
  CHECK(s.extents == 2);
  CHECK(s.bytes == 200);
  CHECK(s.retired == 0);
}

TEST_CASE("ExtentTable: a write waits for readers of the reused space") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 5));
  auto pin = t->PinRead(Key(0, 100, 5));
  REQUIRE(pin.ok());
  CHECK(t->Stats().pinned_reads == 1);

  std::atomic<bool> began{false};
  absl::Status commit;
  Thread writer("writer", [&] {
    auto w = t->BeginWrite(Key(40, 100, 8));
    began = true;
    commit = w.ok() ? w->Commit() : w.status();
  });
  // The writer waits for the pin without changing anything: the old extent
  // stays readable until it proceeds.
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kOk);
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(began.load());
  CHECK(t->Stats().retired == 0);
  CHECK(t->Stats().writing == 0);
  pin->Release();
  writer.Join();
  CHECK(began.load());
  CHECK(commit.ok());
  CHECK(PinCode(*t, Key(40, 100, 8)) == absl::StatusCode::kOk);
  ExtentTableStats s = t->Stats();
  CHECK(s.retired == 0);
  CHECK(s.pinned_reads == 0);
  CHECK(s.extents == 1);
}

TEST_CASE("ExtentTable: a write fails with Unavailable if readers do not "
          "drain") {
  auto t = MakeTable(absl::Milliseconds(50));
  Store(*t, Key(0, 100, 5));
  auto pin = t->PinRead(Key(0, 100, 5));
  REQUIRE(pin.ok());
  CHECK(t->BeginWrite(Key(0, 100, 6)).status().code() ==
        absl::StatusCode::kUnavailable);
  // Nothing readable at the new generation, and the failed write did not
  // destroy the old object: it is still readable (it used to be dropped
  // before the write waited for its readers).
  CHECK(PinCode(*t, Key(0, 100, 6)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kOk);
  CHECK(t->Stats().writing == 0);
  CHECK(t->Stats().waiting_writes == 0);
  CHECK(t->Stats().extents == 1);
  pin->Release();
  CHECK(t->Stats().retired == 0);
  Store(*t, Key(0, 100, 7));
  CHECK(PinCode(*t, Key(0, 100, 7)) == absl::StatusCode::kOk);
}

TEST_CASE("ExtentTable: of two overlapping writes the lower generation "
          "loses") {
  auto t = MakeTable();
  auto w5 = t->BeginWrite(Key(0, 100, 5));
  REQUIRE(w5.ok());
  // Lower generation arriving later: refused at once.
  CHECK(t->BeginWrite(Key(50, 100, 3)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // Higher generation arriving later: takes over, waits for the bytes of
  // gen 5 to stop flowing, and gen 5's commit fails.
  std::optional<absl::StatusOr<ExtentTable::WriteTicket>> w7;
  Thread writer("writer", [&] { w7.emplace(t->BeginWrite(Key(50, 100, 7))); });
  REQUIRE(Eventually([&] { return t->Stats().retired == 1; }));
  absl::SleepFor(absl::Milliseconds(20));
  CHECK(t->Stats().writing == 2);
  CHECK(w5->Commit().code() == absl::StatusCode::kFailedPrecondition);
  writer.Join();
  REQUIRE(w7->ok());
  REQUIRE((*w7)->Commit().ok());
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(50, 100, 7)) == absl::StatusCode::kOk);
  ExtentTableStats s = t->Stats();
  CHECK(s.writing == 0);
  CHECK(s.retired == 0);
  CHECK(s.extents == 1);
}

TEST_CASE("ExtentTable: a waiting write overtaken by a newer one fails") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 5));
  auto pin = t->PinRead(Key(0, 100, 5));
  REQUIRE(pin.ok());
  absl::Status s7;
  Thread w7("w7", [&] { s7 = t->BeginWrite(Key(0, 100, 7)).status(); });
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  std::optional<absl::StatusOr<ExtentTable::WriteTicket>> w9;
  Thread w9t("w9", [&] { w9.emplace(t->BeginWrite(Key(0, 100, 9))); });
  // gen 7 gives up as soon as gen 9 takes over, without waiting for the pin.
  w7.Join();
  CHECK(s7.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  // A lower generation arriving while gen 9 waits is refused at once.
  CHECK(t->BeginWrite(Key(0, 100, 8)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kOk);
  pin->Release();
  w9t.Join();
  REQUIRE(w9->ok());
  REQUIRE((*w9)->Commit().ok());
  CHECK(PinCode(*t, Key(0, 100, 9)) == absl::StatusCode::kOk);
  CHECK(t->Stats().retired == 0);
}

TEST_CASE("ExtentTable: pins are counted and movable") {
  auto t = MakeTable();
  Store(*t, Key(0, 10, 1));
  auto a = t->PinRead(Key(0, 10, 1));
  auto b = t->PinRead(Key(0, 10, 1));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(t->Stats().pinned_reads == 2);
  ExtentTable::ReadPin moved = std::move(*a);
  CHECK_FALSE(a->valid());
  CHECK(moved.valid());
  moved.Release();
  moved.Release();
  CHECK(t->Stats().pinned_reads == 1);
  b->Release();
  CHECK(t->Stats().pinned_reads == 0);
}

TEST_CASE("ExtentTable: concurrent readers and writers stay consistent") {
  auto t = MakeTable(absl::Seconds(10));
  std::atomic<uint64_t> gen{1};
  std::vector<Thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back("writer", [&, w] {
      for (int i = 0; i < 300; ++i) {
        uint64_t g = gen.fetch_add(1);
        uint64_t addr = static_cast<uint64_t>((i * 37 + w * 11) % 16) * 64;
        auto tk = t->BeginWrite(Key(addr, 128, g));
        if (tk.ok()) tk->Commit().IgnoreError();
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back("reader", [&] {
      for (int i = 0; i < 2000; ++i) {
        uint64_t g = gen.load();
        for (uint64_t d = 0; d < 4 && d < g; ++d) {
          auto p = t->PinRead(Key(static_cast<uint64_t>(i % 16) * 64, 128, g - d));
          if (p.ok()) p->Release();
        }
      }
    });
  }
  for (auto& th : threads) th.Join();
  ExtentTableStats s = t->Stats();
  CHECK(s.writing == 0);
  CHECK(s.retired == 0);
  CHECK(s.pinned_reads == 0);
  CHECK(s.bytes == s.extents * 128);
}

TEST_CASE("ExtentTable: Clear drops every extent so low generations can "
          "write again") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 1000));
  Store(*t, Key(4096, 100, 2000));
  // Without Clear a restarted master's low generations are refused forever.
  CHECK(t->BeginWrite(Key(0, 100, 5)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  t->Clear();
  CHECK(PinCode(*t, Key(0, 100, 1000)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(4096, 100, 2000)) == absl::StatusCode::kNotFound);
  ExtentTableStats s = t->Stats();
  CHECK(s.extents == 0);
  CHECK(s.bytes == 0);
  CHECK(s.retired == 0);
  Store(*t, Key(0, 100, 5));
  Store(*t, Key(4096, 50, 6));
  CHECK(PinCode(*t, Key(0, 100, 5)) == absl::StatusCode::kOk);
  CHECK(t->Stats().extents == 2);
  t->Clear();  // idempotent on an emptied table
  t->Clear();
  CHECK(t->Stats().extents == 0);
}

TEST_CASE("ExtentTable: Clear lets pinned reads finish and fails writes in "
          "progress") {
  auto t = MakeTable(absl::Seconds(10));
  Store(*t, Key(0, 100, 1000));
  auto pin = t->PinRead(Key(0, 100, 1000));
  REQUIRE(pin.ok());
  auto w = t->BeginWrite(Key(4096, 100, 1001));
  REQUIRE(w.ok());
  t->Clear();
  ExtentTableStats s = t->Stats();
  CHECK(s.extents == 0);
  CHECK(s.retired == 2);  // the pinned and the written extent
  CHECK(s.pinned_reads == 1);
  CHECK(s.writing == 1);
  // The write in progress never becomes readable.
  absl::Status c = w->Commit();
  CHECK(c.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(PinCode(*t, Key(4096, 100, 1001)) == absl::StatusCode::kNotFound);
  // The cleared extent blocks no lower generation over the written space.
  Store(*t, Key(4096, 100, 3));
  // A new write over the pinned space waits for the reader, then succeeds:
  // the old bytes are not overwritten under it.
  std::atomic<bool> began{false};
  absl::Status commit;
  Thread writer("writer", [&] {
    auto nw = t->BeginWrite(Key(0, 100, 4));
    began = true;
    commit = nw.ok() ? nw->Commit() : nw.status();
  });
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(began.load());
  pin->Release();  // the pinned read finishes normally
  writer.Join();
  CHECK(commit.ok());
  CHECK(PinCode(*t, Key(0, 100, 4)) == absl::StatusCode::kOk);
  s = t->Stats();
  CHECK(s.extents == 2);
  CHECK(s.retired == 0);
  CHECK(s.pinned_reads == 0);
  CHECK(s.writing == 0);
}

TEST_CASE("ExtentTable: Clear also releases extents retired earlier") {
  auto t = MakeTable(absl::Seconds(10));
  Store(*t, Key(0, 100, 50));
  auto pin = t->PinRead(Key(0, 100, 50));
  REQUIRE(pin.ok());
  // gen 60 retires gen 50 and waits for its reader.
  absl::Status s60;
  Thread w60("w60", [&] {
    auto w = t->BeginWrite(Key(0, 100, 60));
    s60 = w.ok() ? w->Commit() : w.status();
  });
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  t->Clear();
  w60.Join();  // woken: the write was cleared while it waited
  CHECK(s60.code() == absl::StatusCode::kFailedPrecondition);
  // gen 50, still pinned, does not block a lower generation; the write
  // waits for the pin only.
  absl::Status s7;
  Thread w7("w7", [&] {
    auto w = t->BeginWrite(Key(0, 100, 7));
    s7 = w.ok() ? w->Commit() : w.status();
  });
  REQUIRE(Eventually([&] { return t->Stats().waiting_writes == 1; }));
  pin->Release();
  w7.Join();
  CHECK(s7.ok());
  CHECK(PinCode(*t, Key(0, 100, 7)) == absl::StatusCode::kOk);
  CHECK(t->Stats().retired == 0);
}

TEST_CASE("ExtentTable: writes above the generation ceiling are refused") {
  auto t = MakeTable();
  CHECK(t->generation_ceiling() == UINT64_MAX);
  Store(*t, Key(0, 10, 1u << 30));  // no ceiling by default
  t->SetGenerationCeiling(100);
  CHECK(t->generation_ceiling() == 100);
  absl::Status s = t->BeginWrite(Key(4096, 10, 101)).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()) ==
        "generation 101 was not issued by the master (ceiling 100)");
  CHECK(t->Stats().writing == 0);
  Store(*t, Key(4096, 10, 100));  // at the ceiling: fine
  CHECK(PinCode(*t, Key(4096, 10, 100)) == absl::StatusCode::kOk);
  // Reads of extents above the ceiling are not affected.
  CHECK(PinCode(*t, Key(0, 10, 1u << 30)) == absl::StatusCode::kOk);
  // Bad region and bounds are still reported as such.
  CHECK(t->BeginWrite(ExtentKey{2, 0, 10, 500}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // The ceiling moves both ways.
  t->SetGenerationCeiling(1000);
  Store(*t, Key(8192, 10, 500));
  t->SetGenerationCeiling(10);
  CHECK(t->BeginWrite(Key(12288, 10, 11)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("ExtentTable rejects bad options") {
  ExtentTableOptions o;
  CHECK(ExtentTable::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  RegionDescriptor r;
  r.region_id = 1;
  r.capacity_bytes = 10;
  o.regions = {r, r};
  CHECK(ExtentTable::Create(o).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ExtentTable: ClearStale keeps writes begun after the mark") {
  auto t = MakeTable();
  Store(*t, Key(0, 100, 50));      // held before re-registering
  auto pending = t->BeginWrite(Key(4096, 100, 51));  // begun before, too
  REQUIRE(pending.ok());
  const uint64_t mark = t->WriteSequence();
  Store(*t, Key(8192, 100, 3));    // placed by the master after registering
  Store(*t, Key(12288, 100, 900)); // a generation the master never issued
  auto late = t->BeginWrite(Key(16384, 100, 4));  // in progress, after
  REQUIRE(late.ok());

  t->ClearStale(mark, /*max_generation=*/100);
  CHECK(PinCode(*t, Key(0, 100, 50)) == absl::StatusCode::kNotFound);
  CHECK(pending->Commit().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(PinCode(*t, Key(8192, 100, 3)) == absl::StatusCode::kOk);
  CHECK(PinCode(*t, Key(12288, 100, 900)) == absl::StatusCode::kNotFound);
  CHECK(late->Commit().ok());
  CHECK(PinCode(*t, Key(16384, 100, 4)) == absl::StatusCode::kOk);
  // The cleared space takes lower generations again.
  Store(*t, Key(0, 100, 2));
  CHECK(PinCode(*t, Key(0, 100, 2)) == absl::StatusCode::kOk);
  CHECK(t->Stats().extents == 3);
}

}  // namespace
TEST_CASE("ExtentTable: ListReadable pages in address order; Drop removes exact extents only") {
  auto t = MakeTable();
  for (uint64_t i = 0; i < 10; ++i) Store(*t, Key(i * 4096, 100, i + 1));
  auto writing = t->BeginWrite(Key(20 * 4096, 100, 50));  // not readable
  REQUIRE(writing.ok());
  std::vector<ExtentKey> all;
  ExtentTable::Cursor c;
  int pages = 0;
  while (!c.done) {
    t->ListReadable(&c, 3, &all);
    ++pages;
  }
  CHECK(pages == 4);
  REQUIRE(all.size() == 10);
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].addr == i * 4096);
    CHECK(all[i].generation == i + 1);
  }
  // Drop: only the exact key, and a pinned reader keeps its bytes.
  CHECK_FALSE(t->Drop(Key(0, 100, 99)));
  CHECK_FALSE(t->Drop(Key(0, 200, 1)));
  CHECK_FALSE(t->Drop(Key(20 * 4096, 100, 50)));  // being written
  auto pin = t->PinRead(Key(4096, 100, 2));
  REQUIRE(pin.ok());
  CHECK(t->Drop(Key(0, 100, 1)));
  CHECK(t->Drop(Key(4096, 100, 2)));
  CHECK_FALSE(t->Drop(Key(4096, 100, 2)));
  CHECK(PinCode(*t, Key(0, 100, 1)) == absl::StatusCode::kNotFound);
  CHECK(PinCode(*t, Key(4096, 100, 2)) == absl::StatusCode::kNotFound);
  CHECK(t->Stats().extents == 8);
  pin->Release();
  // The space takes a new, higher generation.
  Store(*t, Key(0, 100, 60));
  CHECK(PinCode(*t, Key(0, 100, 60)) == absl::StatusCode::kOk);
  REQUIRE(writing->Commit().ok());
}

}  // namespace hymcache::storage
