// clm/cache/radix_tree_types.hpp: the values RadixTree's calls take and give
// back: the namespace a request's prefixes live in (CacheNamespace), a handle
// to a node (NodeRef), what a match finds (PrefixMatch, PrefixPeek), what an
// insert stored (InsertOutcome), the tree's counters (RadixTreeMetrics), and
// what an observer of its tiers is told (RadixTreeObserver, NodeView).
// radix_tree.hpp includes this header and shows them in use:
//
//   clm::PrefixMatch hit;
//   CLM_RETURN_IF_ERROR(tree.match_prefix(prompt, {.salt = "tenant-42"}, hit));
//   // hit.pages: the cached prefix's pages; hit.node: lock it while it runs
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clm {

// Requests that must never share cached pages: a tenant's cache salt, and the
// LoRA adapter the KV was computed with.
struct CacheNamespace {
  std::string_view salt;
  std::int32_t adapter_id = 0;
  // The tenant's name for reports (cache/divergence.hpp), as the host gives
  // it; not part of the namespace: requests with one salt share pages
  // whatever names they carry.
  std::string_view tenant = {};
};

// A handle to a tree node. Stale handles (the node was evicted) are detected.
struct NodeRef {
  std::int32_t index = -1;
  std::uint32_t generation = 0;
  bool operator==(const NodeRef&) const = default;
};

// The part of a node's path below an ancestor (RadixTree::node_path_below):
// what a storage tier that knows that ancestor's page keys still has to hash.
struct PathBelow {
  NodeRef above;                         // the ancestor (index -1: none, the path starts at the namespace root)
  std::int32_t above_tokens = 0;         // tokens from the namespace root to its end
  std::vector<std::int32_t> tokens;      // the path's tokens below it
  std::vector<std::int32_t> host_pages;  // their host pages, page for page
  // The path's nodes below it, from the top, each with the tokens from the
  // namespace root to its end.
  std::vector<std::pair<NodeRef, std::int32_t>> nodes;
  std::string salt;  // the namespace
  std::int32_t adapter_id = 0;
};

// One node as an observer sees it (RadixTree::node_view): its tokens (whole
// pages), its place and its tiers; its namespace is RadixTree::node_namespace.
// Valid until the tree changes.
struct NodeView {
  std::span<const std::int32_t> tokens;
  NodeRef ref;
  std::int32_t parent = -1;  // a node's index, or -1 when the node hangs from its namespace root
  bool on_device = false, on_host = false;
};

class RadixTree;

// Told of every node whose pages enter or leave a tier, in the order the tree
// changes, while it changes (RadixTree::set_observer). KV events
// (clm/events/) are built from these calls. The calls come with the tree's
// caller's lock held, must not throw, and must not call back into the tree
// but for its const reads.
class RadixTreeObserver {
 public:
  enum class Tier : std::uint8_t { device, host };
  virtual ~RadixTreeObserver() = default;
  // All of node `index`'s pages are now on `tier`.
  virtual void pages_stored(const RadixTree& tree, std::int32_t index, Tier tier) noexcept = 0;
  // All of node `index`'s pages are about to leave `tier`; the node is whole during the call.
  virtual void pages_removed(const RadixTree& tree, std::int32_t index, Tier tier) noexcept = 0;
};

struct PrefixMatch {
  std::int32_t cached_tokens = 0;  // page-aligned, <= len-1: the part on the device (L1)
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

// Where matches end, in tokens from the prompt's start: a histogram in powers
// of two, so a dashboard sees the depth a workload's prompts break at.
struct MatchDepthHistogram {
  // Upper bounds: 0 (nothing matched), 16, 32, ..., 2^20 tokens, then +Inf.
  static constexpr std::size_t kFinite = 18;
  static constexpr std::int64_t bound(std::size_t i) { return i == 0 ? 0 : std::int64_t{8} << i; }
  std::array<std::uint64_t, kFinite + 1> counts{};  // counts[i]: in (bound(i-1), bound(i)]; the last: above
  std::uint64_t sum_tokens = 0;

  void record(std::int32_t depth) {
    const auto d = static_cast<std::uint32_t>(depth);
    const std::size_t i =
        d == 0 ? 0
               : std::min<std::size_t>(
                     kFinite, static_cast<std::size_t>(std::max(4U, static_cast<unsigned>(std::bit_width(d - 1)))) - 3);
    ++counts[i];
    sum_tokens += d;
  }
};

struct RadixTreeMetrics {
  std::uint64_t match_calls = 0;
  std::uint64_t tokens_queried = 0;   // sum of match_prefix lengths
  std::uint64_t tokens_hit = 0;       // sum of cached_tokens returned
  std::uint64_t inserted_tokens = 0;  // tokens newly stored by insert
  std::uint64_t evicted_tokens = 0;
  std::uint64_t evictions = 0;  // leaves evicted
  // Where matches end (with divergence counting on: RadixTree::set_divergence),
  // and how many ended at a branch point: a whole page of the prompt left
  // unmatched while the cached path went on (cache/divergence.hpp).
  MatchDepthHistogram match_depth;
  std::uint64_t diverged_matches = 0;
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

}  // namespace clm
