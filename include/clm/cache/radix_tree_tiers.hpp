// clm/cache/radix_tree_tiers.hpp: RadixTree's host tier (L2), out of the
// class: the calls radix_tree.hpp declares under "tiers" (and documents
// there), and what keeps the two tiers consistent. radix_tree.hpp includes
// this header at its end; include that one. tiers/tier_manager.hpp drives
// these calls (copies, write policies, storage); in short:
//
//   clm::RadixTree tree(*pool, clm::EvictionPolicy::lru, NAN, &host_pool);
//   tree.set_write_back(copy);  // device eviction copies to the host first
//   clm::PrefixMatch hit;       // a match then also reports host-only pages:
//   CLM_RETURN_IF_ERROR(tree.match_prefix(prompt, ns, hit));  // hit.host_pages
//
// With a host pool, every node is on the device (L1), on the host (L2) or
// both. Two rules keep a match a single walk: a device node's parent is on
// the device, and a node with a host copy has a parent with one (the root
// counts as both). So the device part of any path comes first, then
// host-only nodes; and the host-backed part is a prefix too.
// - Device eviction drops a leaf's device pages; a node with a host copy
//   stays (host only). With set_write_back, a node without one is copied
//   to the host first (and its path above, for the second rule).
// - Host eviction (LRU) drops host copies nothing below has, that nothing
//   pins; a host-only node goes with its copy.
// - insert() lets matched host-only nodes take the caller's device pages
//   (a load-back); insert_host() gives matched nodes host copies and adds
//   host-only leaves (a backup, or pages fetched from storage).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/radix_tree.hpp"
#include "clm/status.hpp"

namespace clm {

inline Status RadixTree::allocate_host_pages(std::span<std::int32_t> out) {
  if (!host_pool_) return failed_precondition("allocate_host_pages: the tree has no host tier");
  const auto need = static_cast<std::int32_t>(std::min<std::size_t>(out.size(), INT32_MAX));
  while (host_pool_->free_pages() < need && !host_heap_.empty()) {
    (void)evict_host_leaf(host_heap_.pop(host_heap_positions()));
  }
  return host_pool_->allocate(out);
}

inline Status RadixTree::insert_host(std::span<const std::int32_t> tokens, std::span<const std::int32_t> host_pages,
                                     std::int32_t first_page, const CacheNamespace& ns, InsertOutcome& out) {
  if (!host_pool_) return failed_precondition("insert_host: the tree has no host tier");
  CLM_RETURN_IF_ERROR(validate_length(tokens, "insert_host"));
  if (first_page < 0 || host_pages.empty() ||
      (static_cast<std::size_t>(first_page) + host_pages.size()) * static_cast<std::size_t>(page_size_) >
          tokens.size()) {
    return invalid_argument(fmt::format("insert_host: pages [{}, {}) of {} tokens are not whole pages of {}",
                                        first_page, static_cast<std::size_t>(first_page) + host_pages.size(),
                                        tokens.size(), page_size_));
  }
  const auto store_len = static_cast<std::int32_t>((static_cast<std::size_t>(first_page) + host_pages.size()) *
                                                   static_cast<std::size_t>(page_size_));
  const Walk walk = walk_down(find_namespace(ns), tokens.data(), store_len);
  const std::int32_t host_matched = matched_on(walk, &Node::on_host);
  if (host_matched < first_page * page_size_) {
    return failed_precondition(fmt::format("insert_host: only {} leading tokens have host copies, page {} starts at {}",
                                           host_matched, first_page, first_page * page_size_));
  }
  CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, static_cast<std::size_t>(walk.matched), "insert_host"));
  for (std::size_t k = 0; k < host_pages.size(); ++k) {
    const std::int32_t p = host_pages[k];
    if (!host_pool_->is_allocated(p) || host_owns_page(p)) {
      return invalid_argument(fmt::format("insert_host: host page {} at position {} is {}", p, k,
                                          !host_pool_->is_allocated(p) ? "not allocated" : "already cached"));
    }
  }
  {
    std::vector<std::int32_t> sorted(host_pages.begin(), host_pages.end());  // a throw here changes nothing
    std::sort(sorted.begin(), sorted.end());
    if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
      return invalid_argument(fmt::format("insert_host: host page {} is passed twice", *twice));
    }
  }
  // All or nothing, as insert(): the memory the call needs (node slots, edge
  // and heap room, the blocks of a split and of the new leaf, a namespace) is
  // taken before anything changes, so a std::bad_alloc leaves the tree and the
  // caller's pages as they were.
  reserve_for_new_nodes(2);
  if (const std::size_t need = host_heap_.size() + path_.size() + 2; need > host_heap_.capacity()) {
    host_heap_.reserve(std::max(need, host_heap_.capacity() + host_heap_.capacity() / 2));
  }
  const bool splits = walk.node >= 0 && walk.offset < nodes_[walk.node].len;
  PendingBlock split_block(*this, splits ? walk.offset : 0);
  PendingBlock leaf_block(*this, walk.matched < store_len ? store_len - walk.matched : 0);
  std::int32_t end = walk.node >= 0 ? walk.node : create_namespace(ns);

  // From here on nothing can fail.
  for (std::int32_t p : host_pages) set_host_owned(p, true);
  if (splits) {
    end = split(end, walk.offset, split_block.take());
    path_.back() = end;
  }
  std::int32_t at = 0;
  for (std::int32_t n : path_) {
    if (!nodes_[n].on_host) attach_host(n, host_pages.data() + (at / page_size_ - first_page));
    at += nodes_[n].len;
  }
  const auto duplicates =
      host_pages.first(static_cast<std::size_t>(std::max(0, host_matched / page_size_ - first_page)));
  for (std::int32_t p : duplicates) set_host_owned(p, false);
  (void)host_pool_->release(duplicates);
  if (walk.matched < store_len) {
    end = add_host_leaf(end, tokens.data() + walk.matched, host_pages.data() + (walk.matched / page_size_ - first_page),
                        store_len - walk.matched, leaf_block.take());
  }
  out = InsertOutcome{host_matched, store_len, ref(end)};
  return {};
}

inline Status RadixTree::host_pin(NodeRef ref) {
  CLM_RETURN_IF_ERROR(check_ref(ref, "host_pin"));
  Node& node = nodes_[ref.index];
  if (!node.on_host || node.parent < 0) {
    return failed_precondition(fmt::format("host_pin: node {} has no host copy", ref.index));
  }
  ++node.host_pins;
  refresh_host_heap(ref.index);
  return {};
}
inline Status RadixTree::host_unpin(NodeRef ref) {
  CLM_RETURN_IF_ERROR(check_ref(ref, "host_unpin"));
  Node& node = nodes_[ref.index];
  if (node.host_pins == 0) return failed_precondition(fmt::format("host_unpin: node {} is not pinned", ref.index));
  --node.host_pins;
  refresh_host_heap(ref.index);
  return {};
}

inline void RadixTree::coverage(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t& cached,
                                std::int32_t& host_backed) {
  cached = host_backed = 0;
  if (!validate_length(tokens, "coverage").ok()) return;
  const Walk walk = walk_down(find_namespace(ns), tokens.data(), static_cast<std::int32_t>(tokens.size()) - 1);
  cached = walk.matched;
  host_backed = matched_on(walk, &Node::on_host);
}

inline void RadixTree::storage_coverage(std::span<const std::int32_t> tokens, const CacheNamespace& ns,
                                        std::int32_t& cached, std::int32_t& host_backed,
                                        std::vector<std::pair<NodeRef, std::int32_t>>& whole) const {
  cached = host_backed = 0;
  whole.clear();
  bool on_host = true;  // host copies form a prefix: the host-backed part ends at the first node without one
  walk_path(find_namespace(ns), tokens.data(), static_cast<std::int32_t>(tokens.size()),
            [&](std::int32_t node, std::int32_t matched) {
              cached += matched;
              on_host = on_host && nodes_[node].on_host;
              if (on_host) host_backed += matched;
              if (matched == nodes_[node].len) whole.emplace_back(ref(node), cached);
            });
}

inline Status RadixTree::host_pin_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns,
                                         std::int32_t length, NodeRef& out) {
  if (length <= 0 || length % page_size_ != 0 || static_cast<std::size_t>(length) > tokens.size()) {
    return invalid_argument(
        fmt::format("host_pin_prefix: {} is not a whole number of pages of {} tokens", length, tokens.size()));
  }
  const Walk walk = walk_down(find_namespace(ns), tokens.data(), length);
  if (matched_on(walk, &Node::on_host) < length) {
    return not_found(fmt::format("host_pin_prefix: the first {} tokens have no host copies", length));
  }
  std::int32_t end = walk.node;
  if (walk.offset < nodes_[end].len) end = split(end, walk.offset);
  out = ref(end);
  ++nodes_[end].host_pins;
  refresh_host_heap(end);
  return {};
}

inline void RadixTree::take_backed_up(std::vector<NodeRef>& out) {
  out.swap(backed_up_);
  backed_up_.clear();
}

inline Status RadixTree::node_path_below(NodeRef ref, const std::function<bool(NodeRef)>& known, PathBelow& out) const {
  CLM_RETURN_IF_ERROR(check_ref(ref, "node_path_below"));
  std::vector<std::int32_t> chain;  // bottom-up, below the known node
  std::int32_t n = ref.index;
  for (; nodes_[n].parent >= 0 && !known(this->ref(n)); n = nodes_[n].parent) chain.push_back(n);
  out.above = nodes_[n].parent >= 0 ? this->ref(n) : NodeRef{};
  out.above_tokens = 0;
  std::int32_t root = n;
  for (; nodes_[root].parent >= 0; root = nodes_[root].parent) out.above_tokens += nodes_[root].len;
  out.tokens.clear();
  out.host_pages.clear();
  out.nodes.clear();
  std::int32_t end = out.above_tokens;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Node& node = nodes_[*it];
    if (!node.on_host) return failed_precondition(fmt::format("node_path_below: node {} has no host copy", *it));
    out.tokens.insert(out.tokens.end(), node.data, node.data + node.len);
    out.host_pages.insert(out.host_pages.end(), host_pages_of(node), host_pages_of(node) + page_count(node));
    end += node.len;
    out.nodes.emplace_back(this->ref(*it), end);
  }
  const RootName& name = root_names_.at(root);
  out.salt = *name.salt;
  out.adapter_id = name.adapter_id;
  return {};
}

inline Status RadixTree::node_path(NodeRef ref, std::vector<std::int32_t>& tokens,
                                   std::vector<std::int32_t>* host_pages, std::string& salt,
                                   std::int32_t& adapter_id) const {
  CLM_RETURN_IF_ERROR(check_ref(ref, "node_path"));
  std::vector<std::int32_t> chain;
  std::int32_t n = ref.index;
  for (; nodes_[n].parent >= 0; n = nodes_[n].parent) chain.push_back(n);
  tokens.clear();
  if (host_pages) host_pages->clear();
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Node& node = nodes_[*it];
    tokens.insert(tokens.end(), node.data, node.data + node.len);
    if (!host_pages) continue;
    if (!node.on_host) return failed_precondition(fmt::format("node_path: node {} has no host copy", *it));
    host_pages->insert(host_pages->end(), host_pages_of(node), host_pages_of(node) + page_count(node));
  }
  const RootName& name = root_names_.at(n);
  salt = *name.salt;
  adapter_id = name.adapter_id;
  return {};
}

inline void RadixTree::backup_candidates(NodeRef ref, std::uint32_t min_hits, std::int32_t& first_page, NodeRef& last,
                                         std::vector<std::int32_t>& device_pages) const {
  device_pages.clear();
  last = NodeRef{};
  first_page = 0;
  if (!host_pool_ || !check_ref(ref, "backup").ok()) return;
  std::vector<std::int32_t> chain;
  for (std::int32_t n = ref.index; nodes_[n].parent >= 0; n = nodes_[n].parent) chain.push_back(n);
  std::int32_t at = 0;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Node& node = nodes_[*it];
    if (node.on_host) {
      at += node.len;
      continue;
    }
    if (!node.on_device || node.hits < min_hits) break;
    if (device_pages.empty()) first_page = at / page_size_;
    device_pages.insert(device_pages.end(), pages_of(node), pages_of(node) + page_count(node));
    last = this->ref(*it);
  }
}

// ---- what keeps the tiers consistent -----------------------------------------

inline void RadixTree::refresh_host_heap(std::int32_t n) {
  if (!host_pool_) return;
  const Node& node = nodes_[n];
  const bool member = node.host_heap_pos != detail::EvictionHeap::kAbsent;
  if (host_evictable(node)) {
    if (member) {
      host_heap_.update(n, node.last_access, host_heap_positions());
    } else {
      host_heap_.push(n, node.last_access, host_heap_positions());
    }
  } else if (member) {
    host_heap_.remove(n, host_heap_positions());
  }
}

// A host-only node takes device pages (owned already): it is on both tiers.
inline void RadixTree::attach_device(std::int32_t n, const std::int32_t* pages) {
  Node& node = nodes_[n];
  std::copy_n(pages, page_count(node), pages_of(node));
  node.on_device = true;
  cached_ += node.len;
  evictable_ += node.len;  // a host-only node is never locked
  metrics_.inserted_tokens += static_cast<std::uint64_t>(node.len);
  Node& up = nodes_[node.parent];
  if (up.heap_pos != detail::EvictionHeap::kAbsent) heap_.remove(node.parent, heap_positions());
  ++up.device_children;
  if (node.device_children == 0) heap_.push(n, key_of(node), heap_positions());
  if (observer_) observer_->pages_stored(*this, n, RadixTreeObserver::Tier::device);
}
// A device-only node takes host pages (owned already).
inline void RadixTree::attach_host(std::int32_t n, const std::int32_t* host_pages) {
  Node& node = nodes_[n];
  std::copy_n(host_pages, page_count(node), host_pages_of(node));
  node.on_host = true;
  host_cached_ += node.len;
  metrics_.backed_up_tokens += static_cast<std::uint64_t>(node.len);
  ++nodes_[node.parent].host_children;
  refresh_host_heap(node.parent);
  refresh_host_heap(n);
  if (observer_) observer_->pages_stored(*this, n, RadixTreeObserver::Tier::host);
}

inline std::int32_t RadixTree::add_host_leaf(std::int32_t parent, const std::int32_t* tokens,
                                             const std::int32_t* host_pages, std::int32_t len, std::int32_t* block) {
  const std::int32_t n = new_node();
  Node& leaf = nodes_[n];
  const auto pages = static_cast<std::size_t>(len / page_size_);
  std::memcpy(block, tokens, static_cast<std::size_t>(len) * sizeof(std::int32_t));
  std::fill_n(block + len, pages, -1);  // no device pages
  std::memcpy(block + len + pages, host_pages, pages * sizeof(std::int32_t));
  leaf.data = block;
  leaf.len = len;
  leaf.parent = parent;
  leaf.last_access = tick_;
  leaf.on_device = false;
  leaf.on_host = true;
  ++nodes_[parent].num_children;
  ++nodes_[parent].host_children;
  edges_.insert(edge_key_of(leaf), n);
  refresh_host_heap(parent);
  refresh_host_heap(n);
  host_cached_ += len;
  metrics_.backed_up_tokens += static_cast<std::uint64_t>(len);
  if (observer_) observer_->pages_stored(*this, n, RadixTreeObserver::Tier::host);
  return n;
}

// Write-back: copies device leaf n, and the nodes above it that have no host
// copy, to the host. False (nothing changed) when the host has no room, the
// copy fails or there is no memory for the bookkeeping: n is then evicted
// without a copy. It runs inside an eviction, so all the memory it needs is
// taken before anything changes: a std::bad_alloc here drops the copy and
// never leaves an eviction half done.
inline bool RadixTree::back_up_path(std::int32_t n) {
  std::vector<std::int32_t> chain;  // bottom-up
  std::int32_t anchor = n;
  try {
    for (; nodes_[anchor].parent >= 0 && !nodes_[anchor].on_host; anchor = nodes_[anchor].parent) {
      chain.push_back(anchor);
    }
    std::size_t count = 0;
    for (std::int32_t c : chain) count += page_count(nodes_[c]);
    host_scratch_.resize(count);
    device_scratch_.clear();
    device_scratch_.reserve(count);
    backed_up_.reserve(backed_up_.size() + 1);
    // Each attached node may enter the host heap, and its parent too.
    if (const std::size_t need = host_heap_.size() + chain.size() + 1; need > host_heap_.capacity()) {
      host_heap_.reserve(std::max(need, host_heap_.capacity() + host_heap_.capacity() / 2));
    }
  } catch (const std::bad_alloc&) {
    ++metrics_.write_backs_dropped;
    return false;
  }
  const bool pin = nodes_[anchor].parent >= 0;  // making room must not drop the copy we hang below
  if (pin) {
    ++nodes_[anchor].host_pins;
    refresh_host_heap(anchor);
  }
  const Status room = allocate_host_pages(host_scratch_);
  if (pin) {
    --nodes_[anchor].host_pins;
    refresh_host_heap(anchor);
  }
  if (!room.ok()) {
    ++metrics_.write_backs_dropped;
    return false;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // within the capacity reserved above
    const Node& node = nodes_[*it];
    device_scratch_.insert(device_scratch_.end(), pages_of(node), pages_of(node) + page_count(node));
  }
  if (!write_back_copier_(device_scratch_, host_scratch_).ok()) {
    (void)host_pool_->release(host_scratch_);
    ++metrics_.write_backs_dropped;
    return false;
  }
  std::size_t at = 0;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const std::size_t pages = page_count(nodes_[*it]);
    for (std::size_t j = 0; j < pages; ++j) set_host_owned(host_scratch_[at + j], true);
    attach_host(*it, host_scratch_.data() + at);
    at += pages;
  }
  backed_up_.push_back(ref(n));
  return true;
}

// Drops a host copy: a node on both tiers stays on the device; a host-only
// node (no children: they would have host copies) goes.
inline std::int64_t RadixTree::evict_host_leaf(std::int32_t n) {
  if (observer_) observer_->pages_removed(*this, n, RadixTreeObserver::Tier::host);
  Node& node = nodes_[n];
  const std::int32_t len = node.len;
  const std::int32_t* pages = host_pages_of(node);
  for (std::size_t j = 0; j < page_count(node); ++j) set_host_owned(pages[j], false);
  (void)host_pool_->release({pages, page_count(node)});
  node.on_host = false;
  const std::int32_t parent = node.parent;
  if (!node.on_device) {
    edges_.erase(edge_key_of(node), n);
    free_node(n);
    --nodes_[parent].num_children;
  }
  --nodes_[parent].host_children;
  refresh_host_heap(parent);
  if (nodes_[parent].parent < 0) drop_namespace_if_unused(parent);
  host_cached_ -= len;
  metrics_.host_evicted_tokens += static_cast<std::uint64_t>(len);
  return len;
}

}  // namespace clm
