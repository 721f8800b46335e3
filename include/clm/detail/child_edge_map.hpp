// clm/detail/child_edge_map.hpp: one flat hash table holding every parent ->
// child edge of a radix tree, keyed by (parent, first page of the child).
//
// One table for the whole tree instead of a map per node: a node needs no
// child container at all (8 bytes a slot, at most half full), and a root with
// 100k children costs the same O(1) as a node with one. Open addressing with
// linear probing and backward-shift deletion, so there are no tombstones. A
// slot keeps 32 bits of the edge's 64-bit hash (which also pick its home
// slot) and the child; callers confirm a candidate by comparing the parent and
// the first page, so colliding hashes never join different prefixes.
#pragma once

#include <cstdint>
#include <vector>

#include "clm/detail/token_ops.hpp"

namespace clm::detail {

class ChildEdgeMap {
 public:
  static std::uint64_t edge_key(std::int32_t parent, std::uint64_t page_hash) {
    return mix64(page_hash ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(parent)) << 1));
  }

  // Calls is_match(child) for each child stored under `key`, returning the
  // first child it accepts, or -1.
  template <class IsMatch>
  std::int32_t find(std::uint64_t key, IsMatch&& is_match) const {
    if (slots_.empty()) return -1;
    const std::uint32_t tag = tag_of(key);
    for (std::size_t i = tag & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.child < 0) return -1;
      if (slot.tag == tag && is_match(slot.child)) return slot.child;
    }
  }

  // Makes room for `extra` more edges, so that later inserts cannot allocate.
  void reserve(std::size_t extra) {
    std::size_t needed = (size_ + extra) * 2;
    if (needed <= slots_.size()) return;
    std::size_t capacity = slots_.empty() ? 16 : slots_.size();  // a power of two, at most 2^32
    while (capacity < needed) capacity *= 2;
    rehash(capacity);
  }

  void insert(std::uint64_t key, std::int32_t child) {
    reserve(1);
    const std::uint32_t tag = tag_of(key);
    std::size_t i = tag & mask_;
    while (slots_[i].child >= 0) i = (i + 1) & mask_;
    slots_[i] = Slot{tag, child};
    ++size_;
  }

  // Points the edge that leads to `old_child` at `new_child` (same key).
  bool replace(std::uint64_t key, std::int32_t old_child, std::int32_t new_child) {
    std::size_t i = locate(key, old_child);
    if (i == kNone) return false;
    slots_[i].child = new_child;
    return true;
  }

  bool erase(std::uint64_t key, std::int32_t child) {
    std::size_t hole = locate(key, child);
    if (hole == kNone) return false;
    // Backward shift: move later entries of the probe run into the hole when
    // their home slot lies at or before it (cyclically).
    for (std::size_t i = (hole + 1) & mask_; slots_[i].child >= 0; i = (i + 1) & mask_) {
      std::size_t home = slots_[i].tag & mask_;
      if (((i - home) & mask_) >= ((i - hole) & mask_)) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole].child = -1;
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }
  std::size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    std::uint32_t tag = 0;
    std::int32_t child = -1;  // -1: empty
  };
  static std::uint32_t tag_of(std::uint64_t key) { return static_cast<std::uint32_t>(key >> 32); }
  static constexpr std::size_t kNone = ~std::size_t{0};

  std::size_t locate(std::uint64_t key, std::int32_t child) const {
    if (slots_.empty()) return kNone;
    const std::uint32_t tag = tag_of(key);
    for (std::size_t i = tag & mask_; slots_[i].child >= 0; i = (i + 1) & mask_) {
      if (slots_[i].tag == tag && slots_[i].child == child) return i;
    }
    return kNone;
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Slot& slot : old) {
      if (slot.child < 0) continue;
      std::size_t i = slot.tag & mask_;
      while (slots_[i].child >= 0) i = (i + 1) & mask_;
      slots_[i] = slot;
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace clm::detail
