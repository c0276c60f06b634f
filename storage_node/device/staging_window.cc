#include "storage_node/device/staging_window.h"

#include <algorithm>
#include <optional>

#include "glog/logging.h"

namespace hymcache::storage {

StagedObject* StagingWindow::Find(uint64_t addr, uint64_t len) const {
  auto it = by_key_.find({addr, len});
  return it == by_key_.end() ? nullptr : it->second;
}

StagedObject* StagingWindow::Add(uint64_t addr, uint64_t len,
                                 uint64_t span_start, uint64_t span_len) {
  auto owned = std::make_unique<StagedObject>();
  StagedObject* s = owned.get();
  s->addr = addr;
  s->len = len;
  s->span_start = span_start;
  s->span_len = span_len;
  s->keyed = true;
  objects_[s] = std::move(owned);
  by_key_[{addr, len}] = s;
  max_span_ = std::max(max_span_, span_len);
  fifo_.push_back(s);
  return s;
}

StagedObject* StagingWindow::AdmitNext() {
  if (fifo_.empty()) return nullptr;
  StagedObject* s = fifo_.front();
  std::optional<uint64_t> off = space_->TryAllocate(s->span_len);
  if (!off) return nullptr;  // strict FIFO: later ones wait behind the head
  fifo_.pop_front();
  s->has_slot = true;
  s->slot_off = *off;
  s->state = StagedObject::State::kLoading;
  return s;
}

void StagingWindow::Unkey(StagedObject* s) {
  if (!s->keyed) return;
  auto it = by_key_.find({s->addr, s->len});
  if (it != by_key_.end() && it->second == s) by_key_.erase(it);
  s->keyed = false;
}

void StagingWindow::Invalidate(uint64_t addr, uint64_t len) {
  if (by_key_.empty()) return;
  const uint64_t from = addr > max_span_ ? addr - max_span_ : 0;
  const uint64_t end = addr + len;
  for (auto it = by_key_.lower_bound({from, 0});
       it != by_key_.end() && it->first.first < end;) {
    StagedObject* s = it->second;
    ++it;
    if (s->span_start < end && addr < s->span_start + s->span_len) {
      // Handles and reads holding it keep their (old) bytes.
      Unkey(s);
    }
  }
}

bool StagingWindow::Release(StagedObject* s) {
  // The slot is never handed on while a read still writes into it.
  if (s->chunks_in_flight > 0) return false;
  bool freed_space = false;
  if (s->has_slot &&
      (s->owners() == 0 || s->state == StagedObject::State::kFailed)) {
    const absl::Status st = space_->Free(s->slot_off);
    if (!st.ok()) {
      // A broken invariant (a slot freed twice): the space stays lost, the
      // device goes on.
      LOG(ERROR) << "hybrid device: freeing window space at " << s->slot_off
                 << ": " << st;
    }
    s->has_slot = false;
    freed_space = true;
  }
  if (s->owners() == 0) {
    Unkey(s);
    if (s->state == StagedObject::State::kQueued) {
      auto it = std::find(fifo_.begin(), fifo_.end(), s);
      if (it != fifo_.end()) {
        // The head may be what blocked the rest.
        freed_space = freed_space || it == fifo_.begin();
        fifo_.erase(it);
      }
    }
    objects_.erase(s);  // deletes s
  }
  return freed_space;
}

void StagingWindow::FailQueued() {
  for (StagedObject* s : fifo_) s->state = StagedObject::State::kFailed;
  fifo_.clear();
}

}  // namespace hymcache::storage
