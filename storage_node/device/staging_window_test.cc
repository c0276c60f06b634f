#include "storage_node/device/staging_window.h"

#include <catch2/catch.hpp>

#include <memory>

namespace hymcache::storage {
namespace {

constexpr uint64_t kKiB = 1024;
using State = StagedObject::State;

std::unique_ptr<StagingWindow> Window(uint64_t bytes) {
  auto space = RangeAllocator::Create({bytes, 4 * kKiB});
  REQUIRE(space.ok());
  return std::make_unique<StagingWindow>(std::move(*space));
}

// A prefetch of a page-aligned object: Add plus the handle's reference.
StagedObject* Prefetch(StagingWindow* w, uint64_t addr, uint64_t len) {
  StagedObject* s = w->Add(addr, len, addr, (len + 4095) / 4096 * 4096);
  ++s->refs;
  return s;
}

TEST_CASE("A staged copy is found by exactly its address and length") {
  auto w = Window(64 * kKiB);
  StagedObject* s = Prefetch(w.get(), 8 * kKiB, 5000);
  CHECK(w->Find(8 * kKiB, 5000) == s);
  CHECK(w->Find(8 * kKiB, 4096) == nullptr);
  CHECK(w->Find(0, 5000) == nullptr);
  CHECK(s->state == State::kQueued);
  CHECK(w->objects() == 1);
  CHECK(w->queued() == 1);
}

TEST_CASE("Queued objects get window space in strict FIFO order") {
  auto w = Window(32 * kKiB);
  StagedObject* a = Prefetch(w.get(), 0, 24 * kKiB);
  StagedObject* b = Prefetch(w.get(), 64 * kKiB, 16 * kKiB);
  StagedObject* c = Prefetch(w.get(), 128 * kKiB, 4 * kKiB);
  CHECK(w->AdmitNext() == a);
  CHECK(a->state == State::kLoading);
  CHECK(a->has_slot);
  CHECK(w->used_bytes() == 24 * kKiB);
  // b does not fit; c would, but waits behind b.
  CHECK(w->AdmitNext() == nullptr);
  CHECK(b->state == State::kQueued);
  CHECK(c->state == State::kQueued);
  CHECK(w->queued() == 2);
  // The handle of `a` lets go once its bytes are in: its space is free.
  a->state = State::kReady;
  --a->refs;
  CHECK(w->Release(a));
  CHECK(w->objects() == 2);
  CHECK(w->Find(0, 24 * kKiB) == nullptr);
  CHECK(w->AdmitNext() == b);
  CHECK(w->AdmitNext() == c);
  CHECK(w->AdmitNext() == nullptr);
  CHECK(w->used_bytes() == 20 * kKiB);
  CHECK(w->queued() == 0);
}

TEST_CASE("Releasing the blocked head of the queue lets the next one in") {
  auto w = Window(32 * kKiB);
  StagedObject* a = Prefetch(w.get(), 0, 32 * kKiB);
  REQUIRE(w->AdmitNext() == a);
  StagedObject* b = Prefetch(w.get(), 64 * kKiB, 8 * kKiB);
  Prefetch(w.get(), 128 * kKiB, 8 * kKiB);
  REQUIRE(w->AdmitNext() == nullptr);
  // The head is cancelled while queued: no space freed, but the head left.
  --b->refs;
  CHECK(w->Release(b));
  CHECK(w->queued() == 1);
  // One behind the head is cancelled: nothing new can start.
  StagedObject* d = Prefetch(w.get(), 256 * kKiB, 4 * kKiB);
  --d->refs;
  CHECK_FALSE(w->Release(d));
  CHECK(w->queued() == 1);
}

TEST_CASE("An object keeps its slot while a read still lands in it") {
  auto w = Window(16 * kKiB);
  StagedObject* s = Prefetch(w.get(), 0, 16 * kKiB);
  REQUIRE(w->AdmitNext() == s);
  s->chunks_in_flight = 1;
  --s->refs;  // cancelled while loading
  CHECK_FALSE(w->Release(s));
  CHECK(w->used_bytes() == 16 * kKiB);
  CHECK(w->objects() == 1);
  s->chunks_in_flight = 0;  // the chunk landed
  CHECK(w->Release(s));
  CHECK(w->used_bytes() == 0);
  CHECK(w->objects() == 0);
}

TEST_CASE("A failed object gives back its space while its owners hold it") {
  auto w = Window(16 * kKiB);
  StagedObject* s = Prefetch(w.get(), 0, 16 * kKiB);
  REQUIRE(w->AdmitNext() == s);
  s->state = State::kFailed;
  w->Unkey(s);
  CHECK(w->Release(s));
  CHECK_FALSE(s->has_slot);
  CHECK(w->used_bytes() == 0);
  CHECK(w->objects() == 1);  // the handle still holds it
  CHECK(w->Find(0, 16 * kKiB) == nullptr);
  --s->refs;
  CHECK_FALSE(w->Release(s));  // nothing more to free
  CHECK(w->objects() == 0);
}

TEST_CASE("A write unkeys the staged copies whose pages it overlaps") {
  auto w = Window(256 * kKiB);
  StagedObject* big = Prefetch(w.get(), 0, 64 * kKiB);
  StagedObject* mid = Prefetch(w.get(), 64 * kKiB, 4 * kKiB);
  StagedObject* far = Prefetch(w.get(), 128 * kKiB, 4 * kKiB);
  // Overlaps the end of `big` (which starts a whole span before it) only.
  w->Invalidate(60 * kKiB, 4 * kKiB);
  CHECK(w->Find(0, 64 * kKiB) == nullptr);
  CHECK_FALSE(big->keyed);
  CHECK(w->Find(64 * kKiB, 4 * kKiB) == mid);
  CHECK(w->Find(128 * kKiB, 4 * kKiB) == far);
  CHECK(w->objects() == 3);  // their handles keep them
  // A new copy of the same object is a different one.
  StagedObject* again = Prefetch(w.get(), 0, 64 * kKiB);
  CHECK(again != big);
  CHECK(w->Find(0, 64 * kKiB) == again);
}

TEST_CASE("Destruction fails every queued object") {
  auto w = Window(8 * kKiB);
  StagedObject* a = Prefetch(w.get(), 0, 8 * kKiB);
  StagedObject* b = Prefetch(w.get(), 8 * kKiB, 8 * kKiB);
  REQUIRE(w->AdmitNext() == a);
  w->FailQueued();
  CHECK(a->state == State::kLoading);
  CHECK(b->state == State::kFailed);
  CHECK(w->queued() == 0);
}

}  // namespace
}  // namespace hymcache::storage
