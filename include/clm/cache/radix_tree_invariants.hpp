// clm/cache/radix_tree_invariants.hpp: RadixTree::check_invariants, out of
// the class: every derived quantity of the tree recounted from scratch and
// compared (lock counts, evictable/protected/cached sizes, heap membership
// and order, edges, page ownership, both tiers). Tests call it after each
// step; radix_tree.hpp includes this header at its end (include that one):
//
//   REQUIRE(tree.check_invariants().ok());
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/radix_tree.hpp"
#include "clm/status.hpp"

namespace clm {

inline Status RadixTree::check_invariants() const {
  auto broken = [](std::string what) { return Status(StatusCode::internal, "radix tree invariant: " + what); };
  std::vector<std::int32_t> lock_from_children(nodes_.size(), 0);
  std::vector<std::int32_t> children(nodes_.size(), 0);
  std::vector<std::int32_t> device_children(nodes_.size(), 0);
  std::vector<std::int32_t> host_children(nodes_.size(), 0);
  std::int64_t cached = 0, evictable = 0, locked = 0, live = 0, host_cached = 0;
  std::size_t owned_pages = 0, host_owned = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    if (!node.live) continue;
    ++live;
    if (node.parent < 0) {
      if (!node.on_device || node.on_host) return broken(fmt::format("root {} has tiers", i));
      continue;
    }
    const Node& up = nodes_[node.parent];
    if (!up.live) return broken(fmt::format("node {} has a dead parent", i));
    ++children[node.parent];
    device_children[node.parent] += node.on_device;
    host_children[node.parent] += node.on_host;
    lock_from_children[node.parent] += node.lock_ref;
    if (node.len <= 0 || node.len % page_size_) return broken(fmt::format("node {} has length {}", i, node.len));
    if (!node.on_device && !node.on_host) return broken(fmt::format("node {} is on no tier", i));
    if (node.on_host && !host_pool_) return broken(fmt::format("node {} has a host copy without a host tier", i));
    if (node.on_device && !up.on_device) return broken(fmt::format("device node {} under a host-only node", i));
    if (node.on_host && up.parent >= 0 && !up.on_host) {
      return broken(fmt::format("host copy of node {} under a node without one", i));
    }
    if (!node.on_device && node.lock_ref != 0) return broken(fmt::format("host-only node {} is locked", i));
    if (node.host_pins < 0 || (node.host_pins > 0 && !node.on_host)) return broken(fmt::format("node {} pins", i));
    if (node.on_host) {
      host_cached += node.len;
      for (std::size_t j = 0; j < page_count(node); ++j) {
        const std::int32_t p = host_pages_of(node)[j];
        if (!host_owns_page(p) || !host_pool_->is_allocated(p)) {
          return broken(fmt::format("host page {} of node {} not held", p, i));
        }
        ++host_owned;
      }
    }
    const bool host_member = node.host_heap_pos != detail::EvictionHeap::kAbsent;
    if (host_member != host_evictable(node)) return broken(fmt::format("node {} host heap membership", i));
    if (!node.on_device) continue;
    cached += node.len;
    (node.lock_ref > 0 ? locked : evictable) += node.len;
    for (std::size_t j = 0; j < page_count(node); ++j) {
      const std::int32_t p = pages_of(node)[j];
      if (!owns_page(p) || !pool_.is_allocated(p)) return broken(fmt::format("page {} of node {} not held", p, i));
      ++owned_pages;
    }
    const std::int32_t* first = node.data;
    const std::int32_t found = edges_.find(edge_key_of(node), [&](std::int32_t c) {
      return nodes_[c].parent == node.parent &&
             std::memcmp(nodes_[c].data, first, static_cast<std::size_t>(page_size_) * sizeof(std::int32_t)) == 0;
    });
    if (found != static_cast<std::int32_t>(i)) return broken(fmt::format("edge to node {} resolves to {}", i, found));
  }
  std::size_t owned_bits = 0;
  for (std::uint64_t word : owned_pages_) owned_bits += static_cast<std::size_t>(__builtin_popcountll(word));
  if (owned_bits != owned_pages)
    return broken(fmt::format("{} pages marked owned, {} in nodes", owned_bits, owned_pages));
  std::size_t host_bits = 0;
  for (std::uint64_t word : host_owned_pages_) host_bits += static_cast<std::size_t>(__builtin_popcountll(word));
  if (host_bits != host_owned)
    return broken(fmt::format("{} host pages marked owned, {} in nodes", host_bits, host_owned));
  if (host_cached != host_cached_) return broken(fmt::format("host cached {} vs {}", host_cached, host_cached_));
  std::size_t host_in_heap = 0;
  for (const Node& node : nodes_) host_in_heap += node.live && host_evictable(node);
  if (host_in_heap != host_heap_.size()) return broken("host heap size");
  if (!host_heap_.well_formed(HostHeapPositions{const_cast<std::vector<Node>*>(&nodes_)}))
    return broken("host heap order");
  bool host_keys_current = true;
  host_heap_.for_each([&](std::int32_t n, std::uint64_t key) {
    host_keys_current = host_keys_current && key == nodes_[n].last_access;
  });
  if (!host_keys_current) return broken("stale host heap key");
  if (edges_.size() != static_cast<std::size_t>(live - namespace_count_)) return broken("edge count");
  std::size_t in_heap = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    if (!node.live) continue;
    if (children[i] != node.num_children || device_children[i] != node.device_children ||
        host_children[i] != node.host_children) {
      return broken(fmt::format("node {} child counts", i));
    }
    if (node.parent >= 0 && node.lock_ref != node.own_locks + lock_from_children[i]) {
      return broken(fmt::format("node {} lock_ref {} != own {} + children {}", i, node.lock_ref, node.own_locks,
                                lock_from_children[i]));
    }
    const bool evictable_leaf = node.parent >= 0 && node.on_device && node.device_children == 0 && node.lock_ref == 0;
    if (evictable_leaf != (node.heap_pos != detail::EvictionHeap::kAbsent)) {
      return broken(fmt::format("node {} heap membership", i));
    }
    in_heap += evictable_leaf;
  }
  if (in_heap != heap_.size()) return broken("heap size");
  std::int64_t protected_segment = 0;
  std::size_t in_protected = 0;
  for (const Node& node : nodes_) {
    if (!node.live || !in_protected_segment(node)) continue;
    protected_segment += node.len;
    ++in_protected;
  }
  if (protected_segment != protected_segment_tokens_ || in_protected != protected_heap_.size()) {
    return broken("SLRU protected segment size");
  }
  if (!protected_heap_.well_formed(ProtectedPositions{const_cast<std::vector<Node>*>(&nodes_)})) {
    return broken("SLRU protected segment order");
  }
  bool protected_keys_current = true;
  protected_heap_.for_each([&](std::int32_t n, std::uint64_t key) {
    protected_keys_current = protected_keys_current && key == nodes_[n].last_access;
  });
  if (!protected_keys_current) return broken("stale SLRU key");
  if (!ghost_.well_formed()) return broken("ghost size");
  if (!heap_.well_formed(HeapPositions{const_cast<std::vector<Node>*>(&nodes_)})) return broken("heap order");
  bool keys_current = true;
  heap_.for_each([&](std::int32_t n, std::uint64_t key) { keys_current = keys_current && key == key_of(nodes_[n]); });
  if (!keys_current) return broken("stale heap key");
  if (cached != cached_ || evictable != evictable_ || locked != protected_) {
    return broken(fmt::format("sizes: cached {} vs {}, evictable {} vs {}, protected {} vs {}", cached, cached_,
                              evictable, evictable_, locked, protected_));
  }
  if (live != live_nodes_) return broken("live node count");
  if (root_names_.size() != static_cast<std::size_t>(namespace_count_)) return broken("namespace count");
  return {};
}

}  // namespace clm
