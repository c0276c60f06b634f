// MetadataIndex: packing a location into a record (shared shapes,
// 48-bit addr and generation, the wide_ fallback) and the packed child
// count.
#include "master/metadata_index.h"

#include <tuple>

#include "master/metadata_index_internal.h"

namespace hymcache {
namespace master {

uint32_t MetadataIndex::NodeOf(uint32_t i) const {
  const uint32_t s = record(i).shape();
  if (s == Record::kWideShape) {
    auto it = wide_.find(i);
    return it == wide_.end() ? 0 : it->second.node_id;
  }
  return shapes_[s].node_id;
}

ObjectLocation MetadataIndex::EntryOf(uint32_t i) const {
  const Record& r = record(i);
  const uint32_t s = r.shape();
  if (s == Record::kWideShape) {
    auto it = wide_.find(i);
    return it == wide_.end() ? ObjectLocation() : it->second;
  }
  const Shape& shape = shapes_[s];
  ObjectLocation e;
  e.node_id = shape.node_id;
  e.region_id = shape.region_id;
  e.addr = r.addr();
  e.length = shape.length;
  e.generation = r.generation();
  return e;
}

uint32_t MetadataIndex::ChildCount(uint32_t i) const {
  const uint32_t k = record(i).kids();
  if (k < Record::kManyKids) return k;
  auto it = many_children_.find(i);
  return it == many_children_.end() ? 0 : it->second;
}

void MetadataIndex::AddChild(uint32_t i) {
  Record& r = record(i);
  const uint32_t k = r.kids();
  if (k + 1 < Record::kManyKids) {
    r.set_kids(k + 1);
  } else if (k + 1 == Record::kManyKids) {
    r.set_kids(Record::kManyKids);
    many_children_[i] = k + 1;
  } else {
    ++many_children_[i];
  }
}

void MetadataIndex::RemoveChild(uint32_t i) {
  Record& r = record(i);
  const uint32_t k = r.kids();
  if (k < Record::kManyKids) {
    if (k > 0) r.set_kids(k - 1);
    return;
  }
  auto it = many_children_.find(i);
  if (it == many_children_.end()) return;  // cannot happen
  if (--it->second < Record::kManyKids) {
    r.set_kids(it->second);
    many_children_.erase(it);
  }
}

uint32_t MetadataIndex::LocalParent(uint32_t i) const {
  const Record& r = record(i);
  return r.cross() ? kNil : r.parent;
}

uint32_t MetadataIndex::AcquireShape(const ObjectLocation& e) {
  auto [it, fresh] =
      shape_ids_.try_emplace(std::make_tuple(e.node_id, e.region_id, e.length),
                             Record::kWideShape);
  if (!fresh) {
    ++shapes_[it->second].refs;
    return it->second;
  }
  uint32_t s;
  if (!free_shapes_.empty()) {
    s = free_shapes_.back();
    free_shapes_.pop_back();
  } else if (shapes_.size() < max_shapes_) {
    s = static_cast<uint32_t>(shapes_.size());
    shapes_.emplace_back();
  } else {
    shape_ids_.erase(it);
    return Record::kWideShape;
  }
  shapes_[s] = Shape{e.node_id, e.region_id, e.length, 1};
  it->second = s;
  return s;
}

void MetadataIndex::ReleaseShape(uint32_t s) {
  Shape& shape = shapes_[s];
  if (--shape.refs > 0) return;
  shape_ids_.erase(std::make_tuple(shape.node_id, shape.region_id,
                                   shape.length));
  free_shapes_.push_back(s);
}

void MetadataIndex::SetLocation(uint32_t i, const ObjectLocation& e) {
  ReleaseLocation(i);
  Record& r = record(i);
  constexpr uint64_t kPacked = uint64_t{1} << 48;
  uint32_t s = Record::kWideShape;
  if (e.addr < kPacked && e.generation < kPacked) s = AcquireShape(e);
  r.set_shape(s);
  if (s == Record::kWideShape) {
    wide_[i] = e;
    r.set_addr_generation(0, 0);
  } else {
    r.set_addr_generation(e.addr, e.generation);
  }
}

void MetadataIndex::ReleaseLocation(uint32_t i) {
  Record& r = record(i);
  const uint32_t s = r.shape();
  if (s == Record::kWideShape) {
    wide_.erase(i);  // none for a free record
  } else {
    ReleaseShape(s);
  }
  r.set_shape(Record::kWideShape);
}

}  // namespace master
}  // namespace hymcache
