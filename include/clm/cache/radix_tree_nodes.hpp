// clm/cache/radix_tree_nodes.hpp: the shape of RadixTree, out of the class:
// namespaces and their roots, the walk down the tree a page at a time, node
// records and their token/page blocks, splits, new leaves, and the page
// ownership an insert settles. radix_tree.hpp includes this header at its
// end; include that one (its top comment shows the tree in use). In short, a
// walk is how every call finds a prompt's cached prefix:
//
//   const Walk walk = walk_down(find_namespace(ns), tokens.data(), limit);
//   // path_: the nodes below the root; walk.matched: the tokens they cover;
//   // a match ending inside a node is split there (split) before it is used
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "clm/cache/radix_tree.hpp"
#include "clm/status.hpp"

namespace clm {

// Roots appear with the first valid call in a namespace and go when its
// last node is evicted and no lock holds the root, so per-request salts do
// not pile up.
// Strong guarantee: a std::bad_alloc leaves every index as it was.
inline std::int32_t RadixTree::create_namespace(const CacheNamespace& ns) {
  reserve_for_new_nodes(1);
  // The slot new_node() will take (room reserved: it cannot throw).
  const std::int32_t root = free_nodes_.empty() ? static_cast<std::int32_t>(nodes_.size()) : free_nodes_.back();
  auto [salts, new_adapter] = namespaces_.try_emplace(ns.adapter_id);
  try {
    auto [it, inserted] = salts->second.emplace(std::string(ns.salt), root);
    try {
      root_names_.emplace(root, RootName{ns.adapter_id, &it->first});
    } catch (...) {
      salts->second.erase(it);
      throw;
    }
  } catch (...) {
    if (new_adapter) namespaces_.erase(salts);
    throw;
  }
  const std::int32_t made = new_node();
  assert(made == root);
  (void)made;
  ++namespace_count_;
  return root;
}
// A miss in a namespace never seen before creates its root, so that the
// caller can lock it; a caller that never does (a probe, an abandoned
// lookup) would leave it behind for good, one per unseen salt. So the last
// kMissRoots such roots are remembered, and the oldest goes when another
// comes unless something was inserted under it or locked it meanwhile.
inline void RadixTree::remember_miss_root(std::int32_t root) noexcept {
  NodeRef& slot = miss_roots_[next_miss_root_];
  next_miss_root_ = (next_miss_root_ + 1) % miss_roots_.size();
  const bool still_that_root = slot.index >= 0 && nodes_[slot.index].live &&
                               nodes_[slot.index].generation == slot.generation && nodes_[slot.index].parent < 0;
  if (still_that_root && slot.index != root) drop_namespace_if_unused(slot.index);
  slot = ref(root);
}
inline void RadixTree::drop_namespace_if_unused(std::int32_t root) {
  const Node& node = nodes_[root];
  if (node.num_children > 0 || node.own_locks > 0) return;
  auto name = root_names_.find(root);
  auto salts = namespaces_.find(name->second.adapter_id);
  salts->second.erase(salts->second.find(*name->second.salt));
  if (salts->second.empty()) namespaces_.erase(salts);
  root_names_.erase(name);
  free_node(root);
  --namespace_count_;
}

// Follows `tokens[0, limit)` down from `root` a page at a time; path_ gets the
// nodes visited below the root.
inline RadixTree::Walk RadixTree::walk_down(std::int32_t root, const std::int32_t* tokens, std::int32_t limit) {
  path_.clear();
  return walk_path(root, tokens, limit, [this](std::int32_t node, std::int32_t) { path_.push_back(node); });
}

// The walk itself, touching nothing: visit(node, tokens matched in it) for
// each node below the root, in order (the last may match only its head).
template <class Visit>
RadixTree::Walk RadixTree::walk_path(std::int32_t root, const std::int32_t* tokens, std::int32_t limit,
                                     Visit&& visit) const {
  if (root < 0) return Walk{-1, 0, 0};  // a namespace not seen yet
  const auto page = static_cast<std::size_t>(page_size_);
  std::int32_t node = root;
  std::int32_t pos = 0;
  while (limit - pos >= page_size_) {
    const std::int32_t* query = tokens + pos;
    const std::uint64_t key = detail::ChildEdgeMap::edge_key(node, detail::hash_page(query, page));
    const std::int32_t child = edges_.find(key, [&](std::int32_t c) {
      return nodes_[c].parent == node && std::memcmp(nodes_[c].data, query, page * sizeof(std::int32_t)) == 0;
    });
    if (child < 0) break;
    const Node& c = nodes_[child];
    const auto comparable = static_cast<std::size_t>(std::min(c.len, limit - pos));
    const std::size_t common = page + detail::common_prefix(c.data + page, query + page, comparable - page);
    const auto matched = static_cast<std::int32_t>(common / page * page);
    visit(child, matched);
    pos += matched;
    if (matched < c.len) return Walk{child, matched, pos};
    node = child;
  }
  return Walk{node, nodes_[node].len, pos};
}

// The pages from `from` on must be allocated, not the tree's, and each
// passed once: checked by marking them and unmarking them all again.
inline Status RadixTree::check_new_pages(std::span<const std::int32_t> pages, std::size_t from) {
  for (std::size_t k = from; k < pages.size(); ++k) {
    const std::int32_t p = pages[k];
    if (!pool_.is_allocated(p) || owns_page(p)) {
      for (std::size_t u = from; u < k; ++u) set_owned(pages[u], false);
      return invalid_argument(
          fmt::format("insert: page {} at position {} is {}", p, k,
                      !pool_.is_allocated(p) ? "not allocated" : "already cached (or passed twice)"));
    }
    set_owned(p, true);
  }
  for (std::size_t k = from; k < pages.size(); ++k) set_owned(pages[k], false);
  return {};
}

// Validates the caller's pages for an insert and settles their ownership
// (the new ones, from the cached part's end on, passed check_new_pages):
// pages of the already-cached part that are not the tree's own are
// duplicates, released (and replaced by the tree's ids in `pages`); the rest
// become the tree's. Changes nothing when it fails.
inline Status RadixTree::take_pages(const Walk& walk, std::int32_t device_matched, std::span<std::int32_t> pages) {
  const std::size_t cached_pages = static_cast<std::size_t>(device_matched / page_size_);
  // Usually the caller passes back the pages its match returned: one memcmp
  // per node finds that, and there is nothing to release or copy.
  bool has_duplicates = false;
  for_each_cached_run(walk, [&](std::size_t at, const std::int32_t* tree_pages, std::size_t count) {
    has_duplicates = has_duplicates || std::memcmp(pages.data() + at, tree_pages, count * sizeof(std::int32_t));
  });
  scratch_.clear();
  if (has_duplicates) {
    Status bad;
    for_each_cached_run(walk, [&](std::size_t at, const std::int32_t* tree_pages, std::size_t count) {
      for (std::size_t j = 0; j < count && bad.ok(); ++j) {
        const std::int32_t p = pages[at + j];
        if (p == tree_pages[j]) continue;
        if (!pool_.is_allocated(p) || owns_page(p)) {
          bad = invalid_argument(fmt::format("insert: page {} at position {} is {}", p, at + j,
                                             owns_page(p) ? "already cached under another prefix" : "not allocated"));
        }
        scratch_.push_back(p);
      }
    });
    CLM_RETURN_IF_ERROR(bad);
  }
  // The new pages passed check_new_pages: allocated, not the tree's, distinct.
  for (std::size_t k = cached_pages; k < pages.size(); ++k) set_owned(pages[k], true);
  if (!has_duplicates) return {};
  // Duplicates are released only now, once the new pages are known good.
  bool clash = false;
  for (std::int32_t p : scratch_) clash = clash || owns_page(p);
  Status released = clash ? invalid_argument("insert: a page is passed both as a duplicate and as a new page")
                          : pool_.release(scratch_);
  if (!released.ok()) {
    for (std::size_t u = cached_pages; u < pages.size(); ++u) set_owned(pages[u], false);
    return released;
  }
  for_each_cached_run(walk, [&](std::size_t at, const std::int32_t* tree_pages, std::size_t count) {
    std::copy_n(tree_pages, count, pages.begin() + static_cast<std::ptrdiff_t>(at));
  });
  return {};
}

// Calls fn(position in the caller's page table, the tree's page ids, count)
// for each device node of the last walk, over the part the walk matched.
template <class Fn>
void RadixTree::for_each_cached_run(const Walk& walk, Fn&& fn) const {
  std::size_t at = 0;
  for (std::int32_t n : path_) {
    const Node& node = nodes_[n];
    if (!node.on_device) break;  // host-only nodes follow the device ones
    const auto count = static_cast<std::size_t>((n == walk.node ? walk.offset : node.len) / page_size_);
    fn(at, pages_of(node), count);
    at += count;
  }
}

inline void RadixTree::reserve_for_new_nodes(std::size_t count) {
  // Geometric growth (x1.5: this is most of the tree's overhead beyond the
  // token ids); reserve() alone allocates exactly what it is asked.
  auto grow = [](std::size_t need, std::size_t capacity) { return std::max(need, capacity + capacity / 2); };
  if (free_nodes_.size() < count && nodes_.size() + count > nodes_.capacity()) {
    nodes_.reserve(grow(nodes_.size() + count, nodes_.capacity()));
  }
  // A slot for every node on the free list, so that eviction (free_node)
  // never allocates.
  if (free_nodes_.capacity() < nodes_.capacity()) free_nodes_.reserve(nodes_.capacity());
  edges_.reserve(count);
  if (heap_.size() + count > heap_.capacity()) heap_.reserve(grow(heap_.size() + count, heap_.capacity()));
  if (segmented_ && protected_heap_.size() + count > protected_heap_.capacity()) {
    protected_heap_.reserve(grow(protected_heap_.size() + count, protected_heap_.capacity()));
  }
}

inline std::int32_t RadixTree::new_node() {
  std::int32_t n;
  if (!free_nodes_.empty()) {
    n = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    n = static_cast<std::int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& node = nodes_[n];
  const std::uint32_t generation = node.generation;
  node = Node{};
  node.generation = generation;
  node.live = true;
  ++live_nodes_;
  return n;
}

inline void RadixTree::free_node(std::int32_t n) {
  Node& node = nodes_[n];
  block_bytes_ -= block_size(node.data);
  std::free(node.data);
  node.data = nullptr;
  node.live = false;
  ++node.generation;
  --live_nodes_;
  free_nodes_.push_back(n);
}

inline std::int32_t* RadixTree::allocate_block(std::int32_t tokens) {
  const std::size_t words =
      static_cast<std::size_t>(tokens) + page_words_ * static_cast<std::size_t>(tokens / page_size_);
  const bool fault = detail::tree_block_allocation_fault && detail::tree_block_allocation_fault();
  auto* block = fault ? nullptr : static_cast<std::int32_t*>(std::malloc(words * sizeof(std::int32_t)));
  if (!block) throw std::bad_alloc();
  block_bytes_ += block_size(block);
  return block;
}

// Splits node n so that its first `offset` tokens become a new parent node,
// which is returned. Locks, access time, hits and priority are inherited.
// `prefix`: the new node's block when the caller took it ahead (else null).
// Strong guarantee: a std::bad_alloc changes nothing.
inline std::int32_t RadixTree::split(std::int32_t n, std::int32_t offset, std::int32_t* prefix) {
  reserve_for_new_nodes(1);
  if (!prefix) prefix = allocate_block(offset);
  const std::int32_t m = new_node();
  Node& node = nodes_[n];
  Node& mid = nodes_[m];
  const std::int32_t old_len = node.len;
  const std::int32_t rest = old_len - offset;
  std::memcpy(prefix, node.data, static_cast<std::size_t>(offset) * sizeof(std::int32_t));
  const auto prefix_pages = static_cast<std::size_t>(offset / page_size_);
  std::memcpy(prefix + offset, pages_of(node), prefix_pages * sizeof(std::int32_t));
  if (host_pool_) std::memcpy(prefix + offset + prefix_pages, host_pages_of(node), prefix_pages * sizeof(std::int32_t));
  mid.data = prefix;
  mid.len = offset;
  mid.parent = node.parent;
  mid.num_children = 1;
  mid.lock_ref = node.lock_ref;
  mid.hits = node.hits;
  mid.last_access = node.last_access;
  mid.priority = node.priority;
  // belady: the request that splits the node reaches mid, not the rest, so the
  // rest's next use is unknown here: taken as never until a request reaches it
  // (set_next_use). Keeping the old value would keep it forever: it is a
  // request already past.
  mid.next_use = node.next_use;
  if (policy_ == EvictionPolicy::belady) {
    node.next_use = kNeverUsedAgain;
    refresh_heap_key(n);
  }
  // Both halves keep the node's tiers; its host pins stay below, where they protect mid too.
  mid.on_device = node.on_device;
  mid.on_host = node.on_host;
  mid.device_children = node.on_device ? 1 : 0;
  mid.host_children = node.on_host ? 1 : 0;
  if (in_protected_segment(node)) protected_heap_.push(m, mid.last_access, protected_positions());
  edges_.replace(edge_key_of(node), n, m);

  // The suffix moves to the front of n's own block, which then shrinks.
  std::int32_t* data = node.data;
  const auto old_pages = static_cast<std::size_t>(old_len / page_size_);
  const auto rest_pages = static_cast<std::size_t>(rest / page_size_);
  std::memmove(data, data + offset, static_cast<std::size_t>(rest) * sizeof(std::int32_t));
  std::memmove(data + rest, data + old_len + prefix_pages, rest_pages * sizeof(std::int32_t));
  if (host_pool_) {
    std::memmove(data + rest + rest_pages, data + old_len + old_pages + prefix_pages,
                 rest_pages * sizeof(std::int32_t));
  }
  block_bytes_ -= block_size(data);
  const std::size_t words = static_cast<std::size_t>(rest) + page_words_ * rest_pages;
  if (auto* shrunk = static_cast<std::int32_t*>(std::realloc(data, words * sizeof(std::int32_t)))) data = shrunk;
  block_bytes_ += block_size(data);
  node.data = data;
  node.len = rest;
  node.parent = m;
  edges_.insert(edge_key_of(node), n);
  return m;
}

// `block`: the leaf's block when the caller took it ahead (else null).
inline std::int32_t RadixTree::add_leaf(std::int32_t parent, const std::int32_t* tokens, const std::int32_t* pages,
                                        std::int32_t len, std::uint8_t priority, std::int32_t* block) {
  if (!block) block = allocate_block(len);
  const std::int32_t n = new_node();
  Node& leaf = nodes_[n];
  std::memcpy(block, tokens, static_cast<std::size_t>(len) * sizeof(std::int32_t));
  std::memcpy(block + len, pages, static_cast<std::size_t>(len / page_size_) * sizeof(std::int32_t));
  leaf.data = block;
  leaf.len = len;
  leaf.parent = parent;
  leaf.last_access = tick_;
  leaf.priority = priority;
  Node& up = nodes_[parent];
  if (up.heap_pos != detail::EvictionHeap::kAbsent) heap_.remove(parent, heap_positions());
  ++up.num_children;
  ++up.device_children;
  edges_.insert(edge_key_of(leaf), n);
  // ghost_slru: a prefix evicted not long ago comes back: it has proved it
  // returns (the ghost forgets it either way); or the host said it will.
  if (policy_ == EvictionPolicy::ghost_slru) {
    const bool remembered = ghost_.forget(ghost_key_of(leaf));
    if (remembered || priority > 0) promote_to_protected(n);
  }
  heap_.push(n, key_of(leaf), heap_positions());
  cached_ += len;
  evictable_ += len;
  metrics_.inserted_tokens += static_cast<std::uint64_t>(len);
  if (observer_) observer_->pages_stored(*this, n, RadixTreeObserver::Tier::device);
  return n;
}

inline void RadixTree::nodes_top_down(std::vector<std::int32_t>& out) const {
  out.clear();
  std::vector<std::pair<std::int32_t, std::int32_t>> by_depth;  // (depth, index)
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    if (!node.live || node.parent < 0) continue;
    std::int32_t depth = 0;
    for (std::int32_t up = node.parent; nodes_[static_cast<std::size_t>(up)].parent >= 0;
         up = nodes_[static_cast<std::size_t>(up)].parent) {
      ++depth;
    }
    by_depth.emplace_back(depth, static_cast<std::int32_t>(i));
  }
  std::sort(by_depth.begin(), by_depth.end());
  out.reserve(by_depth.size());
  for (const auto& [depth, index] : by_depth) out.push_back(index);
}

}  // namespace clm
