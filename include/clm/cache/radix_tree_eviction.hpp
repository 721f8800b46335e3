// clm/cache/radix_tree_eviction.hpp: how RadixTree frees device pages, out of
// the class: the leaf that gives up only its tail, dropping a leaf (written
// back to the host first with a host tier's write-back), the protected
// segment of slru and ghost_slru, and ghost_slru's memory of evicted
// prefixes. radix_tree.hpp includes this header at its end; include that one.
// The policies themselves are in eviction_policy.hpp and docs/eviction.md. In
// short:
//
//   std::int64_t freed = 0;
//   CLM_RETURN_IF_ERROR(tree.evict(tokens, &freed));  // leaves in the policy's order
#pragma once

#include <cstdint>
#include <functional>
#include <new>
#include <string_view>

#include "clm/cache/radix_tree.hpp"

namespace clm {

// Eviction needs `tokens` more from `leaf` (popped from the heap): when the
// leaf is longer by a page or more, its head becomes a node of its own that
// stays cached and the tail (`leaf`, now holding only the pages needed) goes.
// Why: a prefix is worth the run of cached pages from its start, so the head
// of a conversation still gives its next turn a hit; evicting the whole leaf
// would throw that away for room nobody asked for (docs/eviction.md). With a
// host tier whole leaves move down (a leaf's host copy is written whole). A
// split that cannot allocate changes nothing (split's strong guarantee), and
// the whole leaf goes instead: eviction never fails for memory.
inline std::int32_t RadixTree::split_off_tail(std::int32_t leaf, std::int64_t tokens) {
  const std::int32_t len = nodes_[leaf].len;
  // A page or more stays when the pages needed, rounded up, leave one: lengths
  // are whole pages, so when tokens <= len - page_size (which cannot overflow).
  if (host_pool_ || tokens > len - page_size_) return leaf;
  const auto tail = static_cast<std::int32_t>((tokens + page_size_ - 1) / page_size_ * page_size_);
  try {
    (void)split(leaf, len - tail);
  } catch (const std::bad_alloc&) {  // nothing changed: the whole leaf goes
  }
  return leaf;  // after the split: the tail
}

// Drops a device leaf's pages. A node with a host copy stays (on the host
// only); one without is written back first when the policy says so, or goes.
inline std::int64_t RadixTree::evict_leaf(std::int32_t n) {
  if (!nodes_[n].on_host && host_pool_ && write_back_copier_) (void)back_up_path(n);
  if (observer_) observer_->pages_removed(*this, n, RadixTreeObserver::Tier::device);
  Node& node = nodes_[n];
  const std::int32_t len = node.len;
  const std::int32_t* pages = pages_of(node);
  for (std::size_t j = 0; j < page_count(node); ++j) set_owned(pages[j], false);
  (void)pool_.release({pages, page_count(node)});  // the tree's own references: always valid
  const bool was_protected = in_protected_segment(node);
  leave_protected_segment(n);
  const std::int32_t parent = node.parent;
  if (node.on_host) {
    node.on_device = false;
  } else {  // a full leaf: host-only children need a host parent
    if (policy_ == EvictionPolicy::ghost_slru && !was_protected) remember_evicted(n);
    edges_.erase(edge_key_of(node), n);
    free_node(n);
    --nodes_[parent].num_children;
  }
  Node& up = nodes_[parent];
  if (--up.device_children == 0 && up.lock_ref == 0 && up.parent >= 0) {
    heap_.push(parent, key_of(up), heap_positions());
  }
  if (up.parent < 0) drop_namespace_if_unused(parent);
  cached_ -= len;
  evictable_ -= len;
  metrics_.evicted_tokens += static_cast<std::uint64_t>(len);
  ++metrics_.evictions;
  return len;
}

// SLRU: a hit moves a node into the protected segment (or to its MRU end).
inline void RadixTree::promote_to_protected(std::int32_t n) {
  Node& node = nodes_[n];
  if (in_protected_segment(node)) {
    protected_heap_.update(n, node.last_access, protected_positions());
  } else {
    protected_heap_.push(n, node.last_access, protected_positions());
    protected_segment_tokens_ += node.len;
  }
}

inline void RadixTree::leave_protected_segment(std::int32_t n) {
  if (!in_protected_segment(nodes_[n])) return;
  protected_heap_.remove(n, protected_positions());
  protected_segment_tokens_ -= nodes_[n].len;
}
// Overflow of the protected segment falls back to probation, at its MRU end.
inline void RadixTree::enforce_protected_cap() {
  while (protected_segment_tokens_ > protected_segment_cap_ && !protected_heap_.empty()) {
    const std::int32_t n = protected_heap_.pop(protected_positions());
    protected_segment_tokens_ -= nodes_[n].len;
    nodes_[n].last_access = tick_;
    refresh_heap_key(n);
    refresh_host_heap(n);
  }
}

// ghost_slru: names an evicted leaf by its parent and its first page, which
// is how the same prefix will hang when it is inserted again below the same
// parent. A parent node is its index and generation (a recycled slot does
// not match). A namespace root is its name instead: the tree drops a root
// once everything below it is evicted, and a tenant that comes back after
// that is exactly the one whose prefixes the ghost should recognise.
inline std::uint64_t RadixTree::ghost_key_of(const Node& node) const {
  const std::uint64_t page_hash = detail::hash_page(node.data, static_cast<std::size_t>(page_size_));
  const Node& up = nodes_[node.parent];
  std::uint64_t parent_id;
  if (up.parent >= 0) {
    parent_id = (std::uint64_t{up.generation} << 32) | static_cast<std::uint32_t>(node.parent);
  } else {
    const RootName& name = root_names_.at(node.parent);
    parent_id = std::hash<std::string_view>{}(*name.salt) ^
                (static_cast<std::uint64_t>(static_cast<std::uint32_t>(name.adapter_id)) * 0x9e3779b97f4a7c15ull) ^
                0x632be59bd9b4e019ull;  // a root's name never equals a node's (index, generation) by design
  }
  return detail::mix64(parent_id) ^ page_hash;
}
// Best effort: an eviction must not fail, and a forgotten ghost only costs
// the prefix its shortcut into the protected segment.
inline void RadixTree::remember_evicted(std::int32_t n) {
  try {
    ghost_.remember(ghost_key_of(nodes_[n]), nodes_[n].len);
  } catch (const std::bad_alloc&) {
  }
}

}  // namespace clm
