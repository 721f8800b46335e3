// clm/cache/radix_tree.hpp: the prefix cache. A radix tree over token ids that maps
// every cached prefix to the pages of a PagedKvPool (RadixAttention, with the
// semantics of SGLang's RadixCache for any page_size >= 1).
//
//   clm::RadixTree tree(*pool, clm::EvictionPolicy::lru);
//   clm::CacheNamespace ns{.salt = "tenant-42"};
//   clm::PrefixMatch hit;
//   CLM_RETURN_IF_ERROR(tree.match_prefix(prompt, ns, hit));  // hit.pages: reuse these
//   CLM_RETURN_IF_ERROR(tree.lock(hit.node));                 // not evictable while running
//   std::vector<int32_t> pages = hit.pages;                    // + fresh pages for the rest
//   ... tree.allocate_pages(...), compute K/V for prompt[hit.cached_tokens:] ...
//   clm::InsertOutcome done;
//   CLM_RETURN_IF_ERROR(tree.insert(prompt, pages, ns, done));
//   CLM_RETURN_IF_ERROR(tree.lock(done.node));
//   CLM_RETURN_IF_ERROR(tree.unlock(hit.node));
//
// Semantics:
// - match_prefix returns the longest cached prefix, a whole number of pages and
//   at most len-1 tokens (the last prompt token is always recomputed, for its
//   logits). When the match ends inside a node the node is split, so the
//   returned node covers exactly the match and can be locked.
// - insert stores the page-aligned part of `tokens` and takes ownership of its
//   pages. Pages of a part that was already cached are duplicates: the tree
//   releases them and writes its own page ids into `pages` in their place.
// - lock/unlock count along the path to the root; a locked node is never
//   evicted. evictable + protected == cached tokens at every moment.
// - evict frees unlocked leaves in the policy's order, incrementally (an
//   indexed heap kept up to date, no rebuild) and without recursion; the last
//   leaf it needs gives up only the pages still needed, from its tail (without
//   a host tier), so that its head still serves the prefix.
// - Each (cache salt, adapter id) pair is a namespace with its own root: no
//   match ever crosses namespaces.
// - Every call validates all of its input before it changes anything, and
//   reports errors as a Status; nothing is half-applied.
//
// Memory: per node ~56 bytes plus one malloc block of token ids and page ids
// (4 bytes a token + 4 bytes a page) plus 16-32 bytes in the edge table. Not
// thread-safe: the Engine serialises access.
//
// Files: the class is declared here, with the code of the device tier's
// calls (match, insert, locks, eviction); the rest is in the headers it
// includes, one concept each:
//   radix_tree_types.hpp       the values the calls take and return
//   radix_tree_nodes.hpp       the tree's shape: walks, namespaces, node blocks,
//                              splits, new leaves, an insert's page ownership
//   radix_tree_eviction.hpp    dropping device leaves: the tail split, the SLRU
//                              protected segment, the ghost
//   radix_tree_tiers.hpp       the host tier (L2): its rules and its calls
//   radix_tree_invariants.hpp  check_invariants, the full recount tests run
// Include this header only: it brings all of them.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/divergence.hpp"
#include "clm/cache/eviction_policy.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "clm/cache/radix_tree_types.hpp"
#include "clm/detail/child_edge_map.hpp"
#include "clm/detail/eviction_heap.hpp"
#include "clm/detail/ghost_list.hpp"
#include "clm/detail/token_ops.hpp"
#include "clm/status.hpp"

namespace clm {

namespace detail {
// Tests only: when set, asked before each node block is allocated; true makes
// that allocation fail as a failed malloc does (std::bad_alloc).
inline bool (*tree_block_allocation_fault)() = nullptr;
}  // namespace detail

class RadixTree {
 public:
  // A root made by a miss in a namespace never seen before stays until this
  // many later such misses, unless locked or inserted under first.
  static constexpr std::size_t kMissRoots = 64;

  // The pool must outlive the tree; the tree's page size is the pool's.
  // `protected_fraction` caps the protected segment of slru and ghost_slru (a
  // fraction of the pool's tokens, clamped to [0, 1]; NaN: the policy's
  // default); other policies ignore it. `ghost_memory`: ghost_slru remembers
  // evicted prefixes worth this many pool capacities (clamped to [0, 64]).
  // Engine::create refuses values out of range instead of clamping them.
  //
  // `host_pool`, when given, is the host tier (L2): a second pool of the same
  // page size whose pages hold copies of cached pages (tiers/tier_manager.hpp). A
  // node then lives on the device, on the host, or both (radix_tree_tiers.hpp).
  explicit RadixTree(PagedKvPool& pool, EvictionPolicy policy = EvictionPolicy::lru,
                     double protected_fraction = std::numeric_limits<double>::quiet_NaN(),
                     PagedKvPool* host_pool = nullptr, double ghost_memory = kDefaultGhostMemory)
      : pool_(pool),
        host_pool_(host_pool),
        page_words_(host_pool ? 2 : 1),
        page_size_(pool.page_size()),
        policy_(policy),
        segmented_(is_segmented(policy)),
        protected_segment_cap_(
            static_cast<std::int64_t>((std::isnan(protected_fraction) ? default_protected_fraction(policy)
                                                                      : std::clamp(protected_fraction, 0.0, 1.0)) *
                                      pool.num_pages() * pool.page_size())),
        owned_pages_((static_cast<std::size_t>(pool.num_pages()) + 63) / 64, 0),
        host_owned_pages_(host_pool ? (static_cast<std::size_t>(host_pool->num_pages()) + 63) / 64 : 0, 0) {
    if (policy == EvictionPolicy::ghost_slru) {
      const double memory =
          std::isnan(ghost_memory) ? kDefaultGhostMemory : std::clamp(ghost_memory, 0.0, kMaxGhostMemory);
      ghost_.set_capacity(static_cast<std::int64_t>(memory * pool.num_pages() * pool.page_size()));
    }
  }
  static double default_protected_fraction(EvictionPolicy policy) {
    return policy == EvictionPolicy::ghost_slru ? kDefaultGhostSlruProtectedFraction : kDefaultSlruProtectedFraction;
  }

  ~RadixTree() {
    for (Node& node : nodes_) {
      if (!node.live) continue;
      if (node.parent >= 0 && node.on_device) (void)pool_.release({pages_of(node), page_count(node)});
      if (node.parent >= 0 && node.on_host) (void)host_pool_->release({host_pages_of(node), page_count(node)});
      std::free(node.data);
    }
  }
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  std::int32_t page_size() const { return page_size_; }
  EvictionPolicy policy() const { return policy_; }
  PagedKvPool& pool() const { return pool_; }
  PagedKvPool* host_pool() const { return host_pool_; }

  // ---- match ----------------------------------------------------------------
  // `what` names the call in errors (the Engine passes its own: "admit").
  Status match_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, PrefixMatch& out,
                      const char* what = "match_prefix") {
    CLM_RETURN_IF_ERROR(validate_length(tokens, what));
    const std::int32_t length = static_cast<std::int32_t>(tokens.size());
    const Walk walk = walk_down(find_namespace(ns), tokens.data(), length - 1);
    // The matched part equals cached ids, which are valid: check only the rest.
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, static_cast<std::size_t>(walk.matched), what));
    std::int32_t end = walk.node;
    if (end < 0) {
      end = create_namespace(ns);
      remember_miss_root(end);
    }
    // A branch point: a whole page of the prompt was left to compare and the
    // cached path went on (inside the node, or in children none of which matched).
    const bool split_off = divergence_.enabled() && walk.matched > 0 && length - 1 - walk.matched >= page_size_ &&
                           (walk.offset < nodes_[end].len || nodes_[end].num_children > 0);
    const bool inside = walk.offset < nodes_[end].len;
    if (inside) {
      end = split(end, walk.offset);
      path_.back() = end;
    }
    if (split_off) {
      // After a split the node's rest, from its first token, is the cached path the request left.
      const Node& rest = nodes_[walk.node];
      divergence_.record_split(ref(end), ns, walk.matched, tokens,
                               inside ? std::span<const std::int32_t>(rest.data, static_cast<std::size_t>(rest.len))
                                      : std::span<const std::int32_t>());
    }
    ++tick_;
    out.pages.clear();
    out.pages.reserve(static_cast<std::size_t>(walk.matched / page_size_));
    out.host_pages.clear();
    out.host_backed_tokens = 0;
    out.host_node = NodeRef{};
    std::int32_t device_end = path_.empty() ? end : nodes_[path_.front()].parent;  // the namespace root
    bool host_backed = true;
    std::int32_t passed_branch = -1;  // the deepest branch point the match went on past
    // The path is device nodes, then host-only ones (a device node's parent is on the device).
    for (std::int32_t n : path_) {
      Node& node = nodes_[n];
      if (node.num_children > 1 && n != path_.back()) passed_branch = n;
      node.last_access = tick_;
      // Saturates: a wrap to 0 would turn the hottest prefix into the coldest under LFU.
      if (node.hits < std::numeric_limits<std::uint32_t>::max()) ++node.hits;
      if (node.on_device) {
        out.pages.insert(out.pages.end(), pages_of(node), pages_of(node) + page_count(node));
        device_end = n;
        if (segmented_) promote_to_protected(n);
        refresh_heap_key(n);
      } else {
        out.host_pages.insert(out.host_pages.end(), host_pages_of(node), host_pages_of(node) + page_count(node));
        out.host_node = ref(n);
      }
      host_backed = host_backed && node.on_host;
      if (host_backed) out.host_backed_tokens += node.len;
      refresh_host_heap(n);
    }
    if (segmented_) enforce_protected_cap();
    if (divergence_.enabled()) {
      if (passed_branch >= 0) divergence_.record_hit(ref(passed_branch));
      metrics_.match_depth.record(walk.matched);
      if (split_off) ++metrics_.diverged_matches;
    }
    out.cached_tokens = static_cast<std::int32_t>(out.pages.size()) * page_size_;
    out.host_tokens = static_cast<std::int32_t>(out.host_pages.size()) * page_size_;
    out.node = ref(device_end);
    ++metrics_.match_calls;
    metrics_.tokens_queried += static_cast<std::uint64_t>(length);
    metrics_.tokens_hit += static_cast<std::uint64_t>(out.cached_tokens);
    metrics_.host_tokens_hit += static_cast<std::uint64_t>(out.host_tokens);
    return {};
  }

  // What match_prefix would find, touching nothing: no recency, no hit
  // counts, no split, no namespace created, no metrics. A scheduler asks this
  // before it admits a request, to see whether it fits (Engine::plan_admission),
  // so that a request waiting for room is not counted, or made hotter, on every
  // step it waits.
  Status peek_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, PrefixPeek& out,
                     const char* what = "peek_prefix") const {
    CLM_RETURN_IF_ERROR(validate_length(tokens, what));
    PrefixPeek peek;
    const Walk walk = walk_path(find_namespace(ns), tokens.data(), static_cast<std::int32_t>(tokens.size()) - 1,
                                [&](std::int32_t n, std::int32_t matched) {
                                  const Node& node = nodes_[n];
                                  if (!node.on_device) {
                                    peek.host_tokens += matched;
                                    return;
                                  }
                                  peek.cached_tokens += matched;
                                  if (node.lock_ref == 0) peek.unlocked_tokens += matched;
                                });
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, static_cast<std::size_t>(walk.matched), what));
    out = peek;
    return {};
  }

  // The deepest device node of `tokens`' cached prefix (whole pages of
  // tokens[0, length)), split there when the prefix ends inside a node, and
  // how many tokens it covers: what a pin locks (Engine::pin_prefix). No
  // recency, hit or metric is touched. cached_tokens 0 (and an empty `out`)
  // when nothing of it is on the device.
  Status device_prefix_node(std::span<const std::int32_t> tokens, const CacheNamespace& ns, NodeRef& out,
                            std::int32_t& cached_tokens, const char* what = "device_prefix_node") {
    CLM_RETURN_IF_ERROR(validate_length(tokens, what));
    out = NodeRef{};
    cached_tokens = 0;
    const std::int32_t root = find_namespace(ns);
    if (root < 0) return {};
    const std::int32_t whole = static_cast<std::int32_t>(tokens.size()) / page_size_ * page_size_;
    const Walk walk = walk_down(root, tokens.data(), whole);
    std::int32_t end = -1;
    for (std::int32_t n : path_) {
      if (!nodes_[n].on_device) break;  // a device node's parent is on the device
      end = n;
      cached_tokens += nodes_[n].len;
    }
    if (end < 0) return {};
    if (end == walk.node && walk.offset < nodes_[end].len) {
      cached_tokens -= nodes_[end].len - walk.offset;
      end = split(end, walk.offset);
    }
    out = ref(end);
    return {};
  }

  // Sets the priority of every node along `tokens`' cached prefix (whole
  // pages, device and host nodes) as insert's PriorityUpdate::set does,
  // touching no recency, hit count or metric: a host's word that the prefix
  // will (priority > 0) or will not (0) be asked for again. Under ghost_slru a
  // priority above 0 protects the nodes, as insert's does. `reached`: the
  // tokens of the prefix found cached (0 when none).
  Status set_prefix_priority(std::span<const std::int32_t> tokens, const CacheNamespace& ns, int priority,
                             std::int32_t& reached, const char* what = "set_prefix_priority") {
    CLM_RETURN_IF_ERROR(validate_length(tokens, what));
    if (priority < 0 || priority > kMaxPriority) {
      return invalid_argument(fmt::format("{}: priority must be in [0, {}], got {}", what, kMaxPriority, priority));
    }
    reached = 0;
    const std::int32_t root = find_namespace(ns);
    if (root < 0) return {};
    const std::int32_t whole = static_cast<std::int32_t>(tokens.size()) / page_size_ * page_size_;
    const Walk walk = walk_down(root, tokens.data(), whole);
    reached = walk.matched;
    const auto prio = static_cast<std::uint8_t>(priority);
    const bool host_vouches = policy_ == EvictionPolicy::ghost_slru && prio > 0;
    for (std::int32_t n : path_) {
      nodes_[n].priority = prio;
      if (host_vouches) {
        promote_to_protected(n);
      } else {
        refresh_protected_key(n);
      }
      refresh_heap_key(n);
      refresh_host_heap(n);
    }
    if (segmented_) enforce_protected_cap();
    return {};
  }

  // ---- insert ---------------------------------------------------------------
  // `pages` must hold at least tokens.size() / page_size ids; the tree takes the
  // first that many (pages past them stay the caller's). `priority` meets the
  // priorities already on the path as `update` says (eviction_policy.hpp).
  Status insert(std::span<const std::int32_t> tokens, std::span<std::int32_t> pages, const CacheNamespace& ns,
                InsertOutcome& out, int priority = 0, PriorityUpdate update = PriorityUpdate::raise) {
    CLM_RETURN_IF_ERROR(validate_length(tokens, "insert"));
    if (priority < 0 || priority > kMaxPriority) {
      return invalid_argument(fmt::format("insert: priority must be in [0, {}], got {}", kMaxPriority, priority));
    }
    if (!is_priority_update(static_cast<int>(update))) {
      return invalid_argument(
          fmt::format("insert: priority update must be raise (0) or set (1), got {}", static_cast<int>(update)));
    }
    const std::int32_t store_len = static_cast<std::int32_t>(tokens.size()) / page_size_ * page_size_;
    const std::size_t store_pages = static_cast<std::size_t>(store_len / page_size_);
    if (pages.size() < store_pages) {
      return invalid_argument(fmt::format("insert: {} tokens need {} pages of {} tokens, got {}", tokens.size(),
                                          store_pages, page_size_, pages.size()));
    }
    const Walk walk = walk_down(find_namespace(ns), tokens.data(), store_len);
    CLM_RETURN_IF_ERROR(detail::check_token_ids(tokens, static_cast<std::size_t>(walk.matched), "insert"));
    // Matched nodes that are only on the host take the caller's pages (a load-back, or a recompute).
    const std::int32_t device_matched = matched_on(walk, &Node::on_device);
    // Refused pages are refused before any room is reserved below, so that a
    // refused insert leaves no trace (not even a grown index).
    CLM_RETURN_IF_ERROR(
        check_new_pages(pages.first(store_pages), static_cast<std::size_t>(device_matched / page_size_)));

    // All or nothing: the memory the insert needs (node slots, edge and heap
    // room, the blocks of a split and of the new leaf) is taken before
    // anything changes, so a std::bad_alloc leaves the tree and the caller's
    // pages as they were.
    reserve_for_new_nodes(2);
    const bool splits = store_len > 0 && walk.node >= 0 && walk.offset < nodes_[walk.node].len;
    PendingBlock split_block(*this, splits ? walk.offset : 0);
    PendingBlock leaf_block(*this, walk.matched < store_len ? store_len - walk.matched : 0);
    CLM_RETURN_IF_ERROR(take_pages(walk, device_matched, pages.first(store_pages)));
    std::int32_t end = walk.node;
    if (end < 0) {
      try {
        end = create_namespace(ns);
      } catch (...) {  // a new namespace: take_pages only marked the pages as the tree's
        for (std::size_t k = 0; k < store_pages; ++k) set_owned(pages[k], false);
        throw;
      }
    }

    // From here on nothing can fail.
    if (store_len == 0) {
      out = InsertOutcome{0, 0, ref(end)};
      return {};
    }
    if (splits) {
      end = split(end, walk.offset, split_block.take());
      path_.back() = end;
    }
    ++tick_;
    const auto prio = static_cast<std::uint8_t>(priority);
    // ghost_slru: a priority above 0 is the host saying the prefix will be
    // asked for again; it is protected as if it had come back already.
    const bool host_vouches = policy_ == EvictionPolicy::ghost_slru && prio > 0;
    for (std::int32_t n : path_) {
      Node& node = nodes_[n];
      node.last_access = tick_;
      node.priority = update == PriorityUpdate::set ? prio : std::max(node.priority, prio);
      if (host_vouches) {
        promote_to_protected(n);  // a host-only node's key counts it once attach_device heaps it
      } else {
        refresh_protected_key(n);
      }
      refresh_heap_key(n);
      refresh_host_heap(n);
    }
    std::int32_t at = 0;
    for (std::int32_t n : path_) {
      if (!nodes_[n].on_device) attach_device(n, pages.data() + at / page_size_);
      at += nodes_[n].len;
    }
    if (walk.matched < store_len) {
      end = add_leaf(end, tokens.data() + walk.matched, pages.data() + walk.matched / page_size_,
                     store_len - walk.matched, prio, leaf_block.take());
    }
    if (policy_ == EvictionPolicy::ghost_slru) enforce_protected_cap();  // a prefix the ghost or the host admitted
    out = InsertOutcome{device_matched, store_len, ref(end)};
    return {};
  }

  // ---- locks ----------------------------------------------------------------
  Status lock(NodeRef ref) {
    CLM_RETURN_IF_ERROR(check_ref(ref, "lock"));
    if (!nodes_[ref.index].on_device) {
      return failed_precondition(fmt::format("lock: node {} is on the host only (load it first)", ref.index));
    }
    ++nodes_[ref.index].own_locks;
    for (std::int32_t n = ref.index; nodes_[n].parent >= 0; n = nodes_[n].parent) {
      Node& node = nodes_[n];
      if (node.lock_ref++ == 0) {
        evictable_ -= node.len;
        protected_ += node.len;
        if (node.heap_pos != detail::EvictionHeap::kAbsent) heap_.remove(n, heap_positions());
      }
    }
    return {};
  }

  Status unlock(NodeRef ref) {
    CLM_RETURN_IF_ERROR(check_ref(ref, "unlock"));
    if (nodes_[ref.index].own_locks == 0) {
      return failed_precondition(fmt::format("unlock: node {} is not locked (unlock without lock)", ref.index));
    }
    --nodes_[ref.index].own_locks;
    for (std::int32_t n = ref.index; nodes_[n].parent >= 0; n = nodes_[n].parent) {
      Node& node = nodes_[n];
      if (--node.lock_ref == 0) {
        evictable_ += node.len;
        protected_ -= node.len;
        if (node.device_children == 0) heap_.push(n, key_of(node), heap_positions());
      }
    }
    if (nodes_[ref.index].parent < 0) drop_namespace_if_unused(ref.index);
    return {};
  }

  // ---- eviction -------------------------------------------------------------
  // Frees at least `tokens` tokens (fewer only when fewer are evictable), whole
  // leaves in the policy's order, except that the last leaf it takes gives up
  // only the pages still needed, from its tail, when a page or more would stay.
  Status evict(std::int64_t tokens, std::int64_t* evicted = nullptr) {
    if (tokens < 0) return invalid_argument(fmt::format("evict: token count must be >= 0, got {}", tokens));
    std::int64_t freed = 0;
    while (freed < tokens && !heap_.empty()) {
      const std::int32_t leaf = heap_.pop(heap_positions());
      freed += evict_leaf(split_off_tail(leaf, tokens - freed));
    }
    if (evicted) *evicted = freed;
    return {};
  }

  // Allocates out.size() pages from the pool, evicting cached prefixes when it
  // is short. All or nothing: when the unlocked cache cannot make room, nothing
  // is evicted or allocated. (Pages a host retained with PagedKvPool::retain do
  // not return to the pool when evicted; then the eviction may stand and the
  // allocation still fail with out_of_memory.)
  Status allocate_pages(std::span<std::int32_t> out) {
    const std::int64_t need = static_cast<std::int64_t>(out.size());
    const std::int64_t free_pages = pool_.free_pages();
    if (need > free_pages) {
      const std::int64_t short_pages = need - free_pages;
      if (short_pages * page_size_ > evictable_) {
        return out_of_memory(fmt::format(
            "KV pool exhausted: {} pages needed, {} free, {} tokens evictable, {} tokens locked by running requests",
            need, free_pages, evictable_, protected_));
      }
      CLM_RETURN_IF_ERROR(evict(short_pages * page_size_));
    }
    return pool_.allocate(out);
  }

  // ---- tiers ----------------------------------------------------------------
  // With a host pool, every node is on the device (L1), on the host (L2) or
  // both: radix_tree_tiers.hpp has the rules that keep a match a single walk,
  // and the code of these calls.

  // Takes out.size() host pages, dropping host copies (LRU) when short.
  // out_of_memory when pinned copies leave too little room (some may have
  // been dropped by then: they are copies).
  Status allocate_host_pages(std::span<std::int32_t> out);

  // Host copies of the pages [first_page, first_page + host_pages.size()) of
  // `tokens`, whose earlier pages must have host copies already. Nodes that
  // have one keep theirs (the caller's page is released as a duplicate);
  // nodes without one take the caller's; pages past the tree become host-only
  // leaves. The tree takes every page on success, none on failure.
  Status insert_host(std::span<const std::int32_t> tokens, std::span<const std::int32_t> host_pages,
                     std::int32_t first_page, const CacheNamespace& ns, InsertOutcome& out);

  // Holds a node's host copy (and so those of its path) while its host pages
  // are read outside the tree's lock: a load-back or a write to storage.
  Status host_pin(NodeRef ref);
  Status host_unpin(NodeRef ref);

  // How far a match of `tokens` would reach (device and host, at most len-1
  // tokens) and how much of that has host copies. Changes nothing.
  void coverage(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t& cached,
                std::int32_t& host_backed);

  // What a storage fetch of `tokens` (whole pages, all of them: no len-1
  // cap) needs, in one walk: how far they are cached (any tier), how much of
  // that has host copies, and the nodes the match passes whole, from the top,
  // each with the tokens from the namespace root to its end (as
  // PathBelow::nodes: where the tier may know a prefix's page keys). Changes
  // nothing.
  void storage_coverage(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t& cached,
                        std::int32_t& host_backed, std::vector<std::pair<NodeRef, std::int32_t>>& whole) const;

  // Pins the host copy of the node that ends exactly `length` tokens into
  // `tokens` (splitting one there), whose pages must all have host copies:
  // what a fetch hangs its pages below. not_found when they do not.
  Status host_pin_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t length,
                         NodeRef& out);

  // Device eviction writes nodes without a host copy back to the host first,
  // through `copy` (device pages -> host pages, same order), when set.
  using WriteBackCopy =
      std::function<Status(std::span<const std::int32_t> device_pages, std::span<const std::int32_t> host_pages)>;
  void set_write_back(WriteBackCopy copy) { write_back_copier_ = std::move(copy); }

  // Nodes given host copies by write-back since the last call (for storage).
  void take_backed_up(std::vector<NodeRef>& out);

  // The path of a live node: its tokens from the namespace root, its
  // namespace, and (with host copies along all of it) its host pages.
  Status node_path(NodeRef ref, std::vector<std::int32_t>& tokens, std::vector<std::int32_t>* host_pages,
                   std::string& salt, std::int32_t& adapter_id) const;
  // The same, below the deepest node of the path (`ref` included) that
  // `known` accepts: a storage tier that knows the page keys of that node's
  // path hashes only the rest. Every node below it must have a host copy.
  Status node_path_below(NodeRef ref, const std::function<bool(NodeRef)>& known, PathBelow& out) const;

  // The deepest nodes of `ref`'s path (from the top, up to `ref`) that are on
  // the device without a host copy and were hit at least `min_hits` times:
  // what a write-through backs up. Returns their first page in the path and
  // their device pages; the caller locks `ref` while it copies.
  void backup_candidates(NodeRef ref, std::uint32_t min_hits, std::int32_t& first_page, NodeRef& last,
                         std::vector<std::int32_t>& device_pages) const;

  // ---- observers (KV events) --------------------------------------------------
  // Tells `observer` (nullptr: none; not owned) of every node whose pages
  // enter or leave a tier, from now on (RadixTreeObserver).
  void set_observer(RadixTreeObserver* observer) { observer_ = observer; }
  // A live node as an observer sees it (index: a node the observer was told
  // of, or one of its ancestors). O(1).
  NodeView node_view(std::int32_t index) const {
    const Node& node = nodes_[static_cast<std::size_t>(index)];
    const bool under_root = nodes_[static_cast<std::size_t>(node.parent)].parent < 0;
    return {{node.data, static_cast<std::size_t>(node.len)},
            ref(index),
            under_root ? -1 : node.parent,
            node.on_device,
            node.on_host};
  }
  // A live node's parent (-1 above a namespace root, which a node_view never
  // shows): for walks up from any node, a root included.
  std::int32_t node_parent(std::int32_t index) const { return nodes_[static_cast<std::size_t>(index)].parent; }
  // The namespace a live node is in: a walk up to its root, O(depth), so an
  // observer keeps what it learns (a node's namespace is its parent's).
  CacheNamespace node_namespace(std::int32_t index) const {
    std::int32_t root = index;
    while (nodes_[static_cast<std::size_t>(root)].parent >= 0) root = nodes_[static_cast<std::size_t>(root)].parent;
    const RootName& name = root_names_.at(root);
    return {*name.salt, name.adapter_id};
  }
  // Every live node (no namespace roots), each after its parent.
  void nodes_top_down(std::vector<std::int32_t>& out) const;

  // ---- belady (the replay tool's offline reference) ---------------------------
  // Sets the next use of every cached node on the path of `tokens` (whole
  // pages) in `ns`: a node's is next_use[its first page], the index of the
  // next request that will reach that page (kNeverUsedAgain: none). When a
  // node is split, its second half's next use becomes kNeverUsedAgain until a
  // request reaches it (an upper bound: the split was made by a request that
  // does not reach it).
  Status set_next_use(std::span<const std::int32_t> tokens, const CacheNamespace& ns,
                      std::span<const std::uint32_t> next_use) {
    if (policy_ != EvictionPolicy::belady) return failed_precondition("set_next_use: the policy is not belady");
    CLM_RETURN_IF_ERROR(validate_length(tokens, "set_next_use"));
    const auto pages = tokens.size() / static_cast<std::size_t>(page_size_);
    if (next_use.size() < pages) {
      return invalid_argument(fmt::format("set_next_use: {} pages of tokens, {} next uses", pages, next_use.size()));
    }
    (void)walk_down(find_namespace(ns), tokens.data(), static_cast<std::int32_t>(pages) * page_size_);
    std::size_t page = 0;
    for (std::int32_t n : path_) {
      nodes_[n].next_use = next_use[page];
      refresh_heap_key(n);
      page += page_count(nodes_[n]);
    }
    return {};
  }

  // ---- inspection -----------------------------------------------------------
  std::int64_t cached_tokens() const { return cached_; }
  std::int64_t evictable_tokens() const { return evictable_; }
  std::int64_t protected_tokens() const { return protected_; }
  // ghost_slru: tokens of the evicted prefixes the ghost remembers, and its cap.
  std::int64_t ghost_tokens() const { return ghost_.tokens(); }
  std::int64_t ghost_capacity() const { return ghost_.capacity(); }
  // slru, ghost_slru: tokens in the protected segment, and whether `ref`'s node is there.
  std::int64_t protected_segment_tokens() const { return protected_segment_tokens_; }
  bool in_protected_segment(NodeRef ref) const {
    return check_ref(ref, "in_protected_segment").ok() && in_protected_segment(nodes_[ref.index]);
  }
  bool owns_page(std::int32_t page) const {
    return pool_.valid_id(page) && (owned_pages_[static_cast<std::size_t>(page) >> 6] >> (page & 63) & 1);
  }

  // ---- divergence (cache/divergence.hpp) --------------------------------------
  // Branch points and the match-depth histogram: on by default. A new
  // configuration forgets every point (the counters in metrics() stay).
  Status set_divergence(const DivergenceConfig& config) {
    CLM_RETURN_IF_ERROR(check_divergence_config(config));
    divergence_.configure(config);
    return {};
  }
  const DivergenceConfig& divergence_config() const { return divergence_.config(); }
  // The branch points over the window ending now; `name_of_salt` names the
  // namespaces admitted without a tenant name (the Engine: the salt's digest).
  Status divergence_report(const DivergenceReportOptions& options,
                           const std::function<std::string(std::string_view)>& name_of_salt, DivergenceReport& out) {
    return divergence_.report(options, name_of_salt, out);
  }
  // Tests only: the sketch's clock (milliseconds).
  void set_divergence_clock(DivergenceSketch::Clock clock) { divergence_.set_clock(clock); }

  RadixTreeMetrics metrics() const {
    RadixTreeMetrics m = metrics_;
    m.cached_tokens = cached_;
    m.evictable_tokens = evictable_;
    m.protected_tokens = protected_;
    m.nodes = live_nodes_ - namespace_count_;
    m.namespaces = namespace_count_;
    m.pages_used = pool_.used_pages();
    m.pages_free = pool_.free_pages();
    m.metadata_bytes = metadata_bytes();
    m.host_cached_tokens = host_cached_;
    m.host_pages_used = host_pool_ ? host_pool_->used_pages() : 0;
    m.host_pages_free = host_pool_ ? host_pool_->free_pages() : 0;
    return m;
  }

  // Bytes the tree itself holds: node records, token/page blocks (as the
  // allocator sized them, with its per-block header), the edge table, the
  // eviction heap, the page-ownership bitmap and the namespace index.
  std::size_t metadata_bytes() const {
    // Hash-map nodes as malloc sizes them (payload + next pointer + cached
    // hash, rounded to 16, + 8), bucket arrays, and salts too long for SSO.
    constexpr std::size_t kSaltEntry = 64, kAdapterEntry = 96, kRootNameEntry = 48;
    std::size_t namespace_bytes = namespaces_.bucket_count() * sizeof(void*) +
                                  root_names_.bucket_count() * sizeof(void*) + root_names_.size() * kRootNameEntry;
    for (const auto& [adapter, salts] : namespaces_) {
      namespace_bytes += kAdapterEntry + salts.bucket_count() * sizeof(void*);
      for (const auto& [salt, root] : salts) {
        namespace_bytes += kSaltEntry;
        if (salt.capacity() > 15) namespace_bytes += malloc_usable_size(const_cast<char*>(salt.data())) + 8;
      }
    }
    return nodes_.capacity() * sizeof(Node) + free_nodes_.capacity() * sizeof(std::int32_t) + block_bytes_ +
           edges_.memory_bytes() + heap_.memory_bytes() + protected_heap_.memory_bytes() +
           owned_pages_.capacity() * sizeof(std::uint64_t) + host_heap_.memory_bytes() +
           host_owned_pages_.capacity() * sizeof(std::uint64_t) + backed_up_.capacity() * sizeof(NodeRef) +
           host_scratch_.capacity() * sizeof(std::int32_t) + path_.capacity() * sizeof(std::int32_t) +
           scratch_.capacity() * sizeof(std::int32_t) + ghost_.memory_bytes() + namespace_bytes +
           divergence_.memory_bytes();
  }

  // Recomputes every derived quantity from scratch and compares (for tests):
  // lock counts, evictable/protected/cached sizes, heap membership and order,
  // edges, page ownership.
  Status check_invariants() const;

 private:
  friend struct RadixTreeTestAccess;  // tests only: reach a node's state (tests/test_radix_tree.cpp)

  struct Node {
    std::int32_t* data = nullptr;  // [len token ids][len / page_size page ids]
    std::int32_t len = 0;          // tokens, a multiple of page_size
    std::int32_t parent = -1;      // -1: a namespace root
    std::int32_t num_children = 0;
    std::int32_t lock_ref = 0;   // locks on this node and its descendants
    std::int32_t own_locks = 0;  // locks taken on this node itself
    std::int32_t heap_pos = detail::EvictionHeap::kAbsent;
    std::int32_t protected_pos = detail::EvictionHeap::kAbsent;  // SLRU's protected segment
    std::uint32_t generation = 1;
    std::uint32_t hits = 0;  // matches that reached it, saturating at 2^32 - 1
    std::uint64_t last_access = 0;
    std::int32_t device_children = 0;  // children on the device
    std::int32_t host_children = 0;    // children with a host copy
    std::int32_t host_pins = 0;        // readers of its host pages (copies in flight)
    std::int32_t host_heap_pos = detail::EvictionHeap::kAbsent;
    std::uint8_t priority = 0;
    bool live = false;
    bool on_device = true;                     // pages_of() are pool pages the tree holds
    bool on_host = false;                      // host_pages_of() are host-pool pages the tree holds
    std::uint32_t next_use = kNeverUsedAgain;  // belady only (in the padding: the record stays 80 bytes)
  };
  struct HeapPositions {
    std::vector<Node>* nodes;
    std::int32_t& operator[](std::int32_t n) const { return (*nodes)[static_cast<std::size_t>(n)].heap_pos; }
  };
  struct Walk {
    std::int32_t node;     // deepest node reached (a namespace root when nothing matched)
    std::int32_t offset;   // tokens of `node` matched; < node.len when the match ends inside it
    std::int32_t matched;  // tokens matched in all
  };
  struct SaltHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using SaltIndex = std::unordered_map<std::string, std::int32_t, SaltHash, std::equal_to<>>;

  struct ProtectedPositions {
    std::vector<Node>* nodes;
    std::int32_t& operator[](std::int32_t n) const { return (*nodes)[static_cast<std::size_t>(n)].protected_pos; }
  };
  struct HostHeapPositions {
    std::vector<Node>* nodes;
    std::int32_t& operator[](std::int32_t n) const { return (*nodes)[static_cast<std::size_t>(n)].host_heap_pos; }
  };
  HeapPositions heap_positions() { return HeapPositions{&nodes_}; }
  HostHeapPositions host_heap_positions() { return HostHeapPositions{&nodes_}; }
  ProtectedPositions protected_positions() { return ProtectedPositions{&nodes_}; }
  static bool in_protected_segment(const Node& node) { return node.protected_pos != detail::EvictionHeap::kAbsent; }
  std::int32_t* pages_of(const Node& node) const { return node.data + node.len; }
  std::int32_t* host_pages_of(const Node& node) const { return node.data + node.len + page_count(node); }
  // Tokens of the last walk's nodes (from the top) that have `tier`.
  std::int32_t matched_on(const Walk& walk, bool Node::*tier) const {
    std::int32_t matched = 0;
    for (std::int32_t n : path_) {
      if (!(nodes_[n].*tier)) break;
      matched += n == walk.node ? walk.offset : nodes_[n].len;
    }
    return matched;
  }
  // A host-tier eviction candidate: a host copy no other host copy hangs
  // below, that nothing is reading.
  static bool host_evictable(const Node& node) {
    return node.parent >= 0 && node.on_host && node.host_children == 0 && node.host_pins == 0;
  }
  void set_host_owned(std::int32_t page, bool owned) {
    std::uint64_t& word = host_owned_pages_[static_cast<std::size_t>(page) >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (page & 63);
    word = owned ? (word | bit) : (word & ~bit);
  }
  bool host_owns_page(std::int32_t page) const {
    return host_pool_ && host_pool_->valid_id(page) &&
           (host_owned_pages_[static_cast<std::size_t>(page) >> 6] >> (page & 63) & 1);
  }

  std::size_t page_count(const Node& node) const { return static_cast<std::size_t>(node.len / page_size_); }
  std::uint64_t key_of(const Node& node) const {
    return eviction_key(policy_, node.last_access, node.hits, node.priority, in_protected_segment(node), node.next_use);
  }
  std::uint64_t edge_key_of(const Node& node) const {
    return detail::ChildEdgeMap::edge_key(node.parent,
                                          detail::hash_page(node.data, static_cast<std::size_t>(page_size_)));
  }
  NodeRef ref(std::int32_t n) const { return NodeRef{n, nodes_[n].generation}; }

  Status validate_length(std::span<const std::int32_t> tokens, const char* what) const {
    if (tokens.empty()) return invalid_argument(fmt::format("{}: empty token sequence", what));
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() - page_size_)) {
      return invalid_argument(fmt::format("{}: {} tokens is too long", what, tokens.size()));
    }
    return {};
  }

  Status check_ref(NodeRef r, const char* what) const {
    if (r.index < 0 || static_cast<std::size_t>(r.index) >= nodes_.size() || !nodes_[r.index].live ||
        nodes_[r.index].generation != r.generation) {
      return not_found(
          fmt::format("{}: node handle ({}, {}) does not name a live node (evicted?)", what, r.index, r.generation));
    }
    return {};
  }

  // The root of a namespace, or -1 when it has none (yet).
  std::int32_t find_namespace(const CacheNamespace& ns) const {
    auto salts = namespaces_.find(ns.adapter_id);
    if (salts == namespaces_.end()) return -1;
    auto it = salts->second.find(ns.salt);
    return it == salts->second.end() ? -1 : it->second;
  }

  void set_owned(std::int32_t page, bool owned) {
    std::uint64_t& word = owned_pages_[static_cast<std::size_t>(page) >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (page & 63);
    word = owned ? (word | bit) : (word & ~bit);
  }
  void refresh_protected_key(std::int32_t n) {
    if (in_protected_segment(nodes_[n])) protected_heap_.update(n, nodes_[n].last_access, protected_positions());
  }

  void refresh_heap_key(std::int32_t n) {
    if (nodes_[n].heap_pos != detail::EvictionHeap::kAbsent) heap_.update(n, key_of(nodes_[n]), heap_positions());
  }

  static std::size_t block_size(void* block) {
    return block ? malloc_usable_size(block) + sizeof(std::size_t) : 0;  // + the allocator's chunk header
  }

  // A node block taken ahead of a change, so that the change cannot fail
  // halfway: freed unless a node adopts it (take()).
  class PendingBlock {
   public:
    PendingBlock(RadixTree& tree, std::int32_t tokens)
        : tree_(tree), block_(tokens > 0 ? tree.allocate_block(tokens) : nullptr) {}
    ~PendingBlock() {
      if (!block_) return;
      tree_.block_bytes_ -= block_size(block_);
      std::free(block_);
    }
    PendingBlock(const PendingBlock&) = delete;
    PendingBlock& operator=(const PendingBlock&) = delete;
    std::int32_t* take() { return std::exchange(block_, nullptr); }

   private:
    RadixTree& tree_;
    std::int32_t* block_;
  };

  // ---- the tree's shape (radix_tree_nodes.hpp) ------------------------------
  std::int32_t create_namespace(const CacheNamespace& ns);
  void remember_miss_root(std::int32_t root) noexcept;
  void drop_namespace_if_unused(std::int32_t root);
  Walk walk_down(std::int32_t root, const std::int32_t* tokens, std::int32_t limit);
  template <class Visit>
  Walk walk_path(std::int32_t root, const std::int32_t* tokens, std::int32_t limit, Visit&& visit) const;
  Status check_new_pages(std::span<const std::int32_t> pages, std::size_t from);
  Status take_pages(const Walk& walk, std::int32_t device_matched, std::span<std::int32_t> pages);
  template <class Fn>
  void for_each_cached_run(const Walk& walk, Fn&& fn) const;
  void reserve_for_new_nodes(std::size_t count);
  std::int32_t new_node();
  void free_node(std::int32_t n);
  std::int32_t* allocate_block(std::int32_t tokens);
  std::int32_t split(std::int32_t n, std::int32_t offset, std::int32_t* prefix = nullptr);
  std::int32_t add_leaf(std::int32_t parent, const std::int32_t* tokens, const std::int32_t* pages, std::int32_t len,
                        std::uint8_t priority, std::int32_t* block = nullptr);

  // ---- device eviction (radix_tree_eviction.hpp) ------------------------------
  std::int32_t split_off_tail(std::int32_t leaf, std::int64_t tokens);
  std::int64_t evict_leaf(std::int32_t n);
  void promote_to_protected(std::int32_t n);
  void leave_protected_segment(std::int32_t n);
  void enforce_protected_cap();
  std::uint64_t ghost_key_of(const Node& node) const;
  void remember_evicted(std::int32_t n);

  // ---- the host tier (radix_tree_tiers.hpp) -----------------------------------
  void refresh_host_heap(std::int32_t n);
  void attach_device(std::int32_t n, const std::int32_t* pages);
  void attach_host(std::int32_t n, const std::int32_t* host_pages);
  // `block`: the leaf's, taken ahead (allocate_block(len)): nothing here allocates.
  std::int32_t add_host_leaf(std::int32_t parent, const std::int32_t* tokens, const std::int32_t* host_pages,
                             std::int32_t len, std::int32_t* block);
  bool back_up_path(std::int32_t n);
  std::int64_t evict_host_leaf(std::int32_t n);

  PagedKvPool& pool_;
  PagedKvPool* const host_pool_;
  const std::size_t page_words_;  // page-id arrays per node block: device, and host with a host tier
  const std::int32_t page_size_;
  const EvictionPolicy policy_;
  const bool segmented_;  // slru, ghost_slru: a protected segment
  std::vector<Node> nodes_;
  std::vector<std::int32_t> free_nodes_;
  detail::ChildEdgeMap edges_;
  detail::EvictionHeap heap_;
  detail::EvictionHeap protected_heap_;  // SLRU: protected nodes by last access
  const std::int64_t protected_segment_cap_;
  std::int64_t protected_segment_tokens_ = 0;
  detail::GhostList ghost_;                      // ghost_slru: recently evicted probationary leaves
  std::vector<std::uint64_t> owned_pages_;       // bit per pool page: held by the tree
  std::vector<std::uint64_t> host_owned_pages_;  // bit per host-pool page: held by the tree
  detail::EvictionHeap host_heap_;               // host copies that may go, by last access
  std::int64_t host_cached_ = 0;
  WriteBackCopy write_back_copier_;
  std::vector<NodeRef> backed_up_;
  RadixTreeObserver* observer_ = nullptr;
  std::vector<std::int32_t> host_scratch_;                  // scratch: a write-back's host pages
  std::vector<std::int32_t> device_scratch_;                // scratch: a write-back's device pages
  std::unordered_map<std::int32_t, SaltIndex> namespaces_;  // adapter id -> salt -> root
  struct RootName {
    std::int32_t adapter_id;
    const std::string* salt;  // the key in namespaces_ (map nodes do not move)
  };
  std::unordered_map<std::int32_t, RootName> root_names_;
  std::array<NodeRef, kMissRoots> miss_roots_{};  // roots made by misses (remember_miss_root)
  std::size_t next_miss_root_ = 0;
  std::vector<std::int32_t> path_;     // scratch: nodes of the last walk
  std::vector<std::int32_t> scratch_;  // scratch: duplicate pages of an insert
  std::uint64_t tick_ = 0;
  std::int64_t cached_ = 0;
  std::int64_t evictable_ = 0;
  std::int64_t protected_ = 0;
  std::int64_t live_nodes_ = 0;
  std::int64_t namespace_count_ = 0;
  std::size_t block_bytes_ = 0;
  RadixTreeMetrics metrics_;
  DivergenceSketch divergence_;
};

}  // namespace clm

// The rest of RadixTree's code, out of the class (the list at the top).
#include "clm/cache/radix_tree_eviction.hpp"
#include "clm/cache/radix_tree_invariants.hpp"
#include "clm/cache/radix_tree_nodes.hpp"
#include "clm/cache/radix_tree_tiers.hpp"
