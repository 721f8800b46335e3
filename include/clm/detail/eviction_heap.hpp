// clm/detail/eviction_heap.hpp: an indexed binary min-heap of evictable leaves.
//
// The tree keeps it up to date as leaves appear, get locked or touched, so an
// eviction pops the next victim in O(log n); SGLang instead rebuilds a heap over
// every leaf on each evict() call. Each node records its slot in the heap
// (`positions[node]`), which makes removal and re-keying O(log n) too.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace clm::detail {

class EvictionHeap {
 public:
  static constexpr std::int32_t kAbsent = -1;

  // `positions` is indexed by node id and owned by the caller (it lives in the
  // node records); the heap writes each member's slot into it.
  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  void reserve(std::size_t n) { entries_.reserve(n); }
  std::size_t capacity() const { return entries_.capacity(); }

  template <class Positions>
  void push(std::int32_t node, std::uint64_t key, Positions positions) {
    entries_.push_back({key, node});
    sift_up(entries_.size() - 1, positions);
  }

  template <class Positions>
  void remove(std::int32_t node, Positions positions) {
    std::size_t at = static_cast<std::size_t>(positions[node]);
    positions[node] = kAbsent;
    Entry last = entries_.back();
    entries_.pop_back();
    if (at == entries_.size()) return;
    entries_[at] = last;
    positions[last.node] = static_cast<std::int32_t>(at);
    sift_down(sift_up(at, positions), positions);
  }

  template <class Positions>
  void update(std::int32_t node, std::uint64_t key, Positions positions) {
    std::size_t at = static_cast<std::size_t>(positions[node]);
    entries_[at].key = key;
    sift_down(sift_up(at, positions), positions);
  }

  template <class Positions>
  std::int32_t pop(Positions positions) {
    std::int32_t node = entries_.front().node;
    remove(node, positions);
    return node;
  }

  std::size_t memory_bytes() const { return entries_.capacity() * sizeof(Entry); }

  // For invariant checks: the heap property and the recorded positions.
  template <class Positions>
  bool well_formed(const Positions positions) const {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (positions[entries_[i].node] != static_cast<std::int32_t>(i)) return false;
      if (i > 0 && entries_[(i - 1) / 2].key > entries_[i].key) return false;
    }
    return true;
  }
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Entry& e : entries_) fn(e.node, e.key);
  }

 private:
  struct Entry {
    std::uint64_t key;
    std::int32_t node;
  };

  template <class Positions>
  std::size_t sift_up(std::size_t at, Positions positions) {
    Entry moving = entries_[at];
    while (at > 0) {
      std::size_t parent = (at - 1) / 2;
      if (entries_[parent].key <= moving.key) break;
      entries_[at] = entries_[parent];
      positions[entries_[at].node] = static_cast<std::int32_t>(at);
      at = parent;
    }
    entries_[at] = moving;
    positions[moving.node] = static_cast<std::int32_t>(at);
    return at;
  }

  template <class Positions>
  void sift_down(std::size_t at, Positions positions) {
    Entry moving = entries_[at];
    const std::size_t n = entries_.size();
    for (;;) {
      std::size_t child = 2 * at + 1;
      if (child >= n) break;
      if (child + 1 < n && entries_[child + 1].key < entries_[child].key) ++child;
      if (entries_[child].key >= moving.key) break;
      entries_[at] = entries_[child];
      positions[entries_[at].node] = static_cast<std::int32_t>(at);
      at = child;
    }
    entries_[at] = moving;
    positions[moving.node] = static_cast<std::int32_t>(at);
  }

  std::vector<Entry> entries_;
};

}  // namespace clm::detail
