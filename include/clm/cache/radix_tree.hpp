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

#include "clm/detail/child_edge_map.hpp"
#include "clm/detail/eviction_heap.hpp"
#include "clm/detail/ghost_list.hpp"
#include "clm/detail/token_ops.hpp"
#include "clm/cache/eviction_policy.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "clm/status.hpp"

namespace clm {

namespace detail {
// Tests only: when set, asked before each node block is allocated; true makes
// that allocation fail as a failed malloc does (std::bad_alloc).
inline bool (*tree_block_allocation_fault)() = nullptr;
}  // namespace detail

// Requests that must never share cached pages: a tenant's cache salt, and the
// LoRA adapter the KV was computed with.
struct CacheNamespace {
  std::string_view salt;
  std::int32_t adapter_id = 0;
};

// A handle to a tree node. Stale handles (the node was evicted) are detected.
struct NodeRef {
  std::int32_t index = -1;
  std::uint32_t generation = 0;
  bool operator==(const NodeRef&) const = default;
};

struct PrefixMatch {
  std::int32_t cached_tokens = 0;   // page-aligned, <= len-1: the part on the device (L1)
  // Deepest matched node on the device: the namespace root on a miss. A miss
  // in a namespace never seen before creates that root; lock it (or insert)
  // before RadixTree::kMissRoots more such misses, or it may be gone.
  NodeRef node;
  std::vector<std::int32_t> pages;  // cached_tokens / page_size page ids
  // With a host tier: the tokens after cached_tokens whose pages are only in
  // host memory (L2), their host page ids, and the deepest such node.
  std::int32_t host_tokens = 0;
  std::vector<std::int32_t> host_pages;
  NodeRef host_node;
  // Leading tokens of the match that have a host copy (L2 or both).
  std::int32_t host_backed_tokens = 0;
};

// What RadixTree::peek_prefix finds: the tokens match_prefix would return,
// without its side effects.
struct PrefixPeek {
  std::int32_t cached_tokens = 0;    // on the device, page-aligned: match_prefix's cached_tokens
  std::int32_t unlocked_tokens = 0;  // of those, in nodes no sequence holds (evictable until locked)
  std::int32_t host_tokens = 0;      // past them, on the host only: match_prefix's host_tokens
};

struct InsertOutcome {
  std::int32_t cached_tokens = 0;  // leading tokens that were cached (in the tier inserted into) before the call
  std::int32_t stored_tokens = 0;  // page-aligned length now cached (<= tokens.size())
  NodeRef node;                    // node that ends at stored_tokens
};

struct RadixTreeMetrics {
  std::uint64_t match_calls = 0;
  std::uint64_t tokens_queried = 0;   // sum of match_prefix lengths
  std::uint64_t tokens_hit = 0;       // sum of cached_tokens returned
  std::uint64_t inserted_tokens = 0;  // tokens newly stored by insert
  std::uint64_t evicted_tokens = 0;
  std::uint64_t evictions = 0;  // leaves evicted
  std::int64_t cached_tokens = 0;
  std::int64_t evictable_tokens = 0;
  std::int64_t protected_tokens = 0;
  std::int64_t nodes = 0;  // excluding namespace roots
  std::int64_t namespaces = 0;
  std::int32_t pages_used = 0;
  std::int32_t pages_free = 0;
  std::size_t metadata_bytes = 0;  // tree bookkeeping, not KV
  // The host tier (L2), all zero without one.
  std::uint64_t host_tokens_hit = 0;      // tokens matched past the device part, on the host only
  std::uint64_t host_evicted_tokens = 0;  // host copies dropped for room
  std::uint64_t backed_up_tokens = 0;     // tokens given a host copy (write policies, fetches)
  std::uint64_t write_backs_dropped = 0;  // device evictions write-back could not copy (no host room, failed copy)
  std::int64_t host_cached_tokens = 0;    // tokens with a host copy
  std::int32_t host_pages_used = 0;
  std::int32_t host_pages_free = 0;
  double hit_rate() const { return tokens_queried ? double(tokens_hit) / double(tokens_queried) : 0.0; }
};

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
  // node then lives on the device, on the host, or both; see "Tiers" below.
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
  Status match_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, PrefixMatch& out) {
    CLM_RETURN_IF_ERROR(validate_length(tokens, "match_prefix"));
    const std::int32_t length = static_cast<std::int32_t>(tokens.size());
    const Walk walk = walk_down(find_namespace(ns), tokens.data(), length - 1);
    // The matched part equals cached ids, which are valid: check only the rest.
    CLM_RETURN_IF_ERROR(validate_ids(tokens, static_cast<std::size_t>(walk.matched), "match_prefix"));
    std::int32_t end = walk.node;
    if (end < 0) {
      end = create_namespace(ns);
      remember_miss_root(end);
    }
    if (walk.offset < nodes_[end].len) {
      end = split(end, walk.offset);
      path_.back() = end;
    }
    ++tick_;
    out.pages.clear();
    out.pages.reserve(static_cast<std::size_t>(walk.matched / page_size_));
    out.host_pages.clear();
    out.host_backed_tokens = 0;
    out.host_node = NodeRef{};
    std::int32_t device_end = path_.empty() ? end : nodes_[path_.front()].parent;  // the namespace root
    bool host_backed = true;
    // The path is device nodes, then host-only ones (a device node's parent is on the device).
    for (std::int32_t n : path_) {
      Node& node = nodes_[n];
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
  Status peek_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, PrefixPeek& out) const {
    CLM_RETURN_IF_ERROR(validate_length(tokens, "peek_prefix"));
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
    CLM_RETURN_IF_ERROR(validate_ids(tokens, static_cast<std::size_t>(walk.matched), "peek_prefix"));
    out = peek;
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
    CLM_RETURN_IF_ERROR(validate_ids(tokens, static_cast<std::size_t>(walk.matched), "insert"));
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

  // Takes out.size() host pages, dropping host copies (LRU) when short.
  // out_of_memory when pinned copies leave too little room (some may have
  // been dropped by then: they are copies).
  Status allocate_host_pages(std::span<std::int32_t> out) {
    if (!host_pool_) return failed_precondition("allocate_host_pages: the tree has no host tier");
    const auto need = static_cast<std::int32_t>(std::min<std::size_t>(out.size(), INT32_MAX));
    while (host_pool_->free_pages() < need && !host_heap_.empty()) {
      (void)evict_host_leaf(host_heap_.pop(host_heap_positions()));
    }
    return host_pool_->allocate(out);
  }

  // Host copies of the pages [first_page, first_page + host_pages.size()) of
  // `tokens`, whose earlier pages must have host copies already. Nodes that
  // have one keep theirs (the caller's page is released as a duplicate);
  // nodes without one take the caller's; pages past the tree become host-only
  // leaves. The tree takes every page on success, none on failure.
  Status insert_host(std::span<const std::int32_t> tokens, std::span<const std::int32_t> host_pages,
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
      return failed_precondition(
          fmt::format("insert_host: only {} leading tokens have host copies, page {} starts at {}", host_matched,
                      first_page, first_page * page_size_));
    }
    CLM_RETURN_IF_ERROR(validate_ids(tokens, static_cast<std::size_t>(walk.matched), "insert_host"));
    for (std::size_t k = 0; k < host_pages.size(); ++k) {
      const std::int32_t p = host_pages[k];
      if (!host_pool_->is_allocated(p) || host_owns_page(p)) {
        for (std::size_t u = 0; u < k; ++u) set_host_owned(host_pages[u], false);
        return invalid_argument(
            fmt::format("insert_host: host page {} at position {} is {}", p, k,
                        !host_pool_->is_allocated(p) ? "not allocated" : "already cached (or passed twice)"));
      }
      set_host_owned(p, true);
    }
    // From here on nothing can fail but the host's allocator.
    reserve_for_new_nodes(2);
    std::int32_t end = walk.node >= 0 ? walk.node : create_namespace(ns);
    if (walk.offset < nodes_[end].len) {
      end = split(end, walk.offset);
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
      end = add_host_leaf(end, tokens.data() + walk.matched,
                          host_pages.data() + (walk.matched / page_size_ - first_page), store_len - walk.matched);
    }
    out = InsertOutcome{host_matched, store_len, ref(end)};
    return {};
  }

  // Holds a node's host copy (and so those of its path) while its host pages
  // are read outside the tree's lock: a load-back or a write to storage.
  Status host_pin(NodeRef ref) {
    CLM_RETURN_IF_ERROR(check_ref(ref, "host_pin"));
    Node& node = nodes_[ref.index];
    if (!node.on_host || node.parent < 0) {
      return failed_precondition(fmt::format("host_pin: node {} has no host copy", ref.index));
    }
    ++node.host_pins;
    refresh_host_heap(ref.index);
    return {};
  }
  Status host_unpin(NodeRef ref) {
    CLM_RETURN_IF_ERROR(check_ref(ref, "host_unpin"));
    Node& node = nodes_[ref.index];
    if (node.host_pins == 0) return failed_precondition(fmt::format("host_unpin: node {} is not pinned", ref.index));
    --node.host_pins;
    refresh_host_heap(ref.index);
    return {};
  }

  // How far a match of `tokens` would reach (device and host, at most len-1
  // tokens) and how much of that has host copies. Changes nothing.
  void coverage(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t& cached,
                std::int32_t& host_backed) {
    cached = host_backed = 0;
    if (!validate_length(tokens, "coverage").ok()) return;
    const Walk walk = walk_down(find_namespace(ns), tokens.data(), static_cast<std::int32_t>(tokens.size()) - 1);
    cached = walk.matched;
    host_backed = matched_on(walk, &Node::on_host);
  }

  // Pins the host copy of the node that ends exactly `length` tokens into
  // `tokens` (splitting one there), whose pages must all have host copies:
  // what a fetch hangs its pages below. not_found when they do not.
  Status host_pin_prefix(std::span<const std::int32_t> tokens, const CacheNamespace& ns, std::int32_t length,
                         NodeRef& out) {
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

  // Device eviction writes nodes without a host copy back to the host first,
  // through `copy` (device pages -> host pages, same order), when set.
  using WriteBackCopy =
      std::function<Status(std::span<const std::int32_t> device_pages, std::span<const std::int32_t> host_pages)>;
  void set_write_back(WriteBackCopy copy) { write_back_copier_ = std::move(copy); }

  // Nodes given host copies by write-back since the last call (for storage).
  void take_backed_up(std::vector<NodeRef>& out) {
    out.swap(backed_up_);
    backed_up_.clear();
  }

  // The path of a live node: its tokens from the namespace root, its
  // namespace, and (with host copies along all of it) its host pages.
  Status node_path(NodeRef ref, std::vector<std::int32_t>& tokens, std::vector<std::int32_t>* host_pages,
                   std::string& salt, std::int32_t& adapter_id) const {
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

  // The deepest nodes of `ref`'s path (from the top, up to `ref`) that are on
  // the device without a host copy and were hit at least `min_hits` times:
  // what a write-through backs up. Returns their first page in the path and
  // their device pages; the caller locks `ref` while it copies.
  void backup_candidates(NodeRef ref, std::uint32_t min_hits, std::int32_t& first_page, NodeRef& last,
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
           scratch_.capacity() * sizeof(std::int32_t) + ghost_.memory_bytes() + namespace_bytes;
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
    bool on_device = true;  // pages_of() are pool pages the tree holds
    bool on_host = false;   // host_pages_of() are host-pool pages the tree holds
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
  void refresh_host_heap(std::int32_t n) {
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
  void set_host_owned(std::int32_t page, bool owned) {
    std::uint64_t& word = host_owned_pages_[static_cast<std::size_t>(page) >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (page & 63);
    word = owned ? (word | bit) : (word & ~bit);
  }
  bool host_owns_page(std::int32_t page) const {
    return host_pool_ && host_pool_->valid_id(page) &&
           (host_owned_pages_[static_cast<std::size_t>(page) >> 6] >> (page & 63) & 1);
  }

  // A host-only node takes device pages (owned already): it is on both tiers.
  void attach_device(std::int32_t n, const std::int32_t* pages) {
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
  }
  // A device-only node takes host pages (owned already).
  void attach_host(std::int32_t n, const std::int32_t* host_pages) {
    Node& node = nodes_[n];
    std::copy_n(host_pages, page_count(node), host_pages_of(node));
    node.on_host = true;
    host_cached_ += node.len;
    metrics_.backed_up_tokens += static_cast<std::uint64_t>(node.len);
    ++nodes_[node.parent].host_children;
    refresh_host_heap(node.parent);
    refresh_host_heap(n);
  }
  std::size_t page_count(const Node& node) const { return static_cast<std::size_t>(node.len / page_size_); }
  std::uint64_t key_of(const Node& node) const {
    return eviction_key(policy_, node.last_access, node.hits, node.priority, in_protected_segment(node), node.next_use);
  }
  // ghost_slru: names an evicted leaf by its parent and its first page, which
  // is how the same prefix will hang when it is inserted again below the same
  // parent. A parent node is its index and generation (a recycled slot does
  // not match). A namespace root is its name instead: the tree drops a root
  // once everything below it is evicted, and a tenant that comes back after
  // that is exactly the one whose prefixes the ghost should recognise.
  std::uint64_t ghost_key_of(const Node& node) const {
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
  void remember_evicted(std::int32_t n) {
    try {
      ghost_.remember(ghost_key_of(nodes_[n]), nodes_[n].len);
    } catch (const std::bad_alloc&) {
    }
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
  // Checks the ids from `from` on (those before it matched cached, valid ids).
  static Status validate_ids(std::span<const std::int32_t> tokens, std::size_t from, const char* what) {
    const std::size_t bad = from + detail::first_invalid_token(tokens.data() + from, tokens.size() - from);
    if (bad != tokens.size()) {
      return invalid_argument(
          fmt::format("{}: token id {} at position {} is outside [0, 2^31)", what, tokens[bad], bad));
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
  // Roots appear with the first valid call in a namespace and go when its
  // last node is evicted and no lock holds the root, so per-request salts do
  // not pile up.
  // Strong guarantee: a std::bad_alloc leaves every index as it was.
  std::int32_t create_namespace(const CacheNamespace& ns) {
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
  void remember_miss_root(std::int32_t root) noexcept {
    NodeRef& slot = miss_roots_[next_miss_root_];
    next_miss_root_ = (next_miss_root_ + 1) % miss_roots_.size();
    const bool still_that_root = slot.index >= 0 && nodes_[slot.index].live &&
                                 nodes_[slot.index].generation == slot.generation && nodes_[slot.index].parent < 0;
    if (still_that_root && slot.index != root) drop_namespace_if_unused(slot.index);
    slot = ref(root);
  }
  void drop_namespace_if_unused(std::int32_t root) {
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
  Walk walk_down(std::int32_t root, const std::int32_t* tokens, std::int32_t limit) {
    path_.clear();
    return walk_path(root, tokens, limit, [this](std::int32_t node, std::int32_t) { path_.push_back(node); });
  }

  // The walk itself, touching nothing: visit(node, tokens matched in it) for
  // each node below the root, in order (the last may match only its head).
  template <class Visit>
  Walk walk_path(std::int32_t root, const std::int32_t* tokens, std::int32_t limit, Visit&& visit) const {
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
  Status check_new_pages(std::span<const std::int32_t> pages, std::size_t from) {
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
  Status take_pages(const Walk& walk, std::int32_t device_matched, std::span<std::int32_t> pages) {
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
  void for_each_cached_run(const Walk& walk, Fn&& fn) const {
    std::size_t at = 0;
    for (std::int32_t n : path_) {
      const Node& node = nodes_[n];
      if (!node.on_device) break;  // host-only nodes follow the device ones
      const auto count = static_cast<std::size_t>((n == walk.node ? walk.offset : node.len) / page_size_);
      fn(at, pages_of(node), count);
      at += count;
    }
  }

  void set_owned(std::int32_t page, bool owned) {
    std::uint64_t& word = owned_pages_[static_cast<std::size_t>(page) >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (page & 63);
    word = owned ? (word | bit) : (word & ~bit);
  }

  // SLRU: a hit moves a node into the protected segment (or to its MRU end).
  void promote_to_protected(std::int32_t n) {
    Node& node = nodes_[n];
    if (in_protected_segment(node)) {
      protected_heap_.update(n, node.last_access, protected_positions());
    } else {
      protected_heap_.push(n, node.last_access, protected_positions());
      protected_segment_tokens_ += node.len;
    }
  }
  void refresh_protected_key(std::int32_t n) {
    if (in_protected_segment(nodes_[n])) protected_heap_.update(n, nodes_[n].last_access, protected_positions());
  }
  void leave_protected_segment(std::int32_t n) {
    if (!in_protected_segment(nodes_[n])) return;
    protected_heap_.remove(n, protected_positions());
    protected_segment_tokens_ -= nodes_[n].len;
  }
  // Overflow of the protected segment falls back to probation, at its MRU end.
  void enforce_protected_cap() {
    while (protected_segment_tokens_ > protected_segment_cap_ && !protected_heap_.empty()) {
      const std::int32_t n = protected_heap_.pop(protected_positions());
      protected_segment_tokens_ -= nodes_[n].len;
      nodes_[n].last_access = tick_;
      refresh_heap_key(n);
      refresh_host_heap(n);
    }
  }

  void refresh_heap_key(std::int32_t n) {
    if (nodes_[n].heap_pos != detail::EvictionHeap::kAbsent) heap_.update(n, key_of(nodes_[n]), heap_positions());
  }

  void reserve_for_new_nodes(std::size_t count) {
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

  std::int32_t new_node() {
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

  void free_node(std::int32_t n) {
    Node& node = nodes_[n];
    block_bytes_ -= block_size(node.data);
    std::free(node.data);
    node.data = nullptr;
    node.live = false;
    ++node.generation;
    --live_nodes_;
    free_nodes_.push_back(n);
  }

  std::int32_t* allocate_block(std::int32_t tokens) {
    const std::size_t words =
        static_cast<std::size_t>(tokens) + page_words_ * static_cast<std::size_t>(tokens / page_size_);
    const bool fault = detail::tree_block_allocation_fault && detail::tree_block_allocation_fault();
    auto* block = fault ? nullptr : static_cast<std::int32_t*>(std::malloc(words * sizeof(std::int32_t)));
    if (!block) throw std::bad_alloc();
    block_bytes_ += block_size(block);
    return block;
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

  // Splits node n so that its first `offset` tokens become a new parent node,
  // which is returned. Locks, access time, hits and priority are inherited.
  // `prefix`: the new node's block when the caller took it ahead (else null).
  // Strong guarantee: a std::bad_alloc changes nothing.
  std::int32_t split(std::int32_t n, std::int32_t offset, std::int32_t* prefix = nullptr) {
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
    if (host_pool_)
      std::memcpy(prefix + offset + prefix_pages, host_pages_of(node), prefix_pages * sizeof(std::int32_t));
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

  // Eviction needs `tokens` more from `leaf` (popped from the heap): when the
  // leaf is longer by a page or more, its head becomes a node of its own that
  // stays cached and the tail (`leaf`, now holding only the pages needed) goes.
  // Why: a prefix is worth the run of cached pages from its start, so the head
  // of a conversation still gives its next turn a hit; evicting the whole leaf
  // would throw that away for room nobody asked for (docs/eviction.md). With a
  // host tier whole leaves move down (a leaf's host copy is written whole). A
  // split that cannot allocate changes nothing (split's strong guarantee), and
  // the whole leaf goes instead: eviction never fails for memory.
  std::int32_t split_off_tail(std::int32_t leaf, std::int64_t tokens) {
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

  // `block`: the leaf's block when the caller took it ahead (else null).
  std::int32_t add_leaf(std::int32_t parent, const std::int32_t* tokens, const std::int32_t* pages, std::int32_t len,
                        std::uint8_t priority, std::int32_t* block = nullptr) {
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
    return n;
  }

  std::int32_t add_host_leaf(std::int32_t parent, const std::int32_t* tokens, const std::int32_t* host_pages,
                             std::int32_t len) {
    std::int32_t* block = allocate_block(len);
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
    return n;
  }

  // Write-back: copies device leaf n, and the nodes above it that have no host
  // copy, to the host. False (nothing changed) when the host has no room or
  // the copy fails: n is then evicted without a copy.
  bool back_up_path(std::int32_t n) {
    std::vector<std::int32_t> chain;  // bottom-up
    std::int32_t anchor = n;
    for (; nodes_[anchor].parent >= 0 && !nodes_[anchor].on_host; anchor = nodes_[anchor].parent)
      chain.push_back(anchor);
    std::size_t count = 0;
    for (std::int32_t c : chain) count += page_count(nodes_[c]);
    host_scratch_.resize(count);
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
    device_scratch_.clear();
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
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

  // Drops a device leaf's pages. A node with a host copy stays (on the host
  // only); one without is written back first when the policy says so, or goes.
  std::int64_t evict_leaf(std::int32_t n) {
    if (!nodes_[n].on_host && host_pool_ && write_back_copier_) (void)back_up_path(n);
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

  // Drops a host copy: a node on both tiers stays on the device; a host-only
  // node (no children: they would have host copies) goes.
  std::int64_t evict_host_leaf(std::int32_t n) {
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
};

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
