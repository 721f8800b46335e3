// clm/cache/eviction_policy.hpp: which cached prefix the radix tree gives up first.
//
// Every policy orders the unlocked leaves by one 64-bit key, smallest evicted
// first; the key is computed from what the tree records per node: the tick of
// its last access (every match or insert that covers it), how many matches hit
// it, and the priority it was inserted with.
//
//   lru       last access, oldest first.
//   lfu       hits, fewest first; ties by last access.
//   slru      segmented LRU: a node enters a probationary segment; a hit moves
//             it to a protected segment, capped at a fraction of the pool
//             (default 0.2: on the Mooncake trace it beats LRU at 100k, 1M
//             and 3M tokens, where the textbook 0.8 loses at 3M), whose least recently used nodes fall back to
//             probation when it overflows. Probationary leaves go first, LRU
//             inside each segment: scans of one-off prompts cannot flush the
//             prefixes that are really shared, and stale ones still age out.
//   priority  the priority of the inserts (0-100; a node keeps the highest
//             of those that covered it, or with PriorityUpdate::set the
//             latest), lowest first; ties by LRU.
//   ghost_slru  SLRU with a large protected segment (default 0.9) and a ghost:
//             leaves evicted from probation are remembered (their parent
//             node, or namespace at the top, and first page; not their KV)
//             until evictions worth `ghost_memory` pool capacities (default
//             4) have followed; a prefix that comes back while remembered is
//             admitted straight into the protected segment. New prefixes stay
//             probationary, so they never displace prefixes that proved they
//             return; on the Mooncake trace this keeps the conversations whose
//             next turn comes minutes later, which LRU has flushed by then
//             (docs/eviction.md). A host that knows a prefix will be asked
//             for again soon (a conversation whose next turn is coming)
//             inserts it with a priority above 0: it is protected at once,
//             as if it had come back, and priorities order the leaves before
//             the segments do, as in `priority`. All zero (the default),
//             this is the order above.
//   belady    offline reference, replay tool only: the leaf whose next use is
//             farthest goes first (the caller supplies next uses, see
//             RadixTree::set_next_use). Engine and the C ABI refuse it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

namespace clm {

enum class EvictionPolicy : std::uint8_t { lru = 0, lfu = 1, slru = 2, priority = 3, ghost_slru = 4, belady = 5 };

inline const char* eviction_policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::lru: return "lru";
    case EvictionPolicy::lfu: return "lfu";
    case EvictionPolicy::slru: return "slru";
    case EvictionPolicy::priority: return "priority";
    case EvictionPolicy::ghost_slru:
      return "ghost_slru";
    case EvictionPolicy::belady:
      return "belady";
  }
  return "unknown";
}

inline std::optional<EvictionPolicy> parse_eviction_policy(std::string_view name) {
  for (EvictionPolicy p : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::slru, EvictionPolicy::priority,
                           EvictionPolicy::ghost_slru, EvictionPolicy::belady}) {
    if (name == eviction_policy_name(p)) return p;
  }
  return std::nullopt;
}

inline constexpr int kMaxPriority = 100;

// How an insert's priority meets the priority of the cached nodes on its path.
//   raise  each node keeps the highest priority any insert gave it (the
//          default): a shared system prompt inserted once at a high priority
//          stays there whatever the conversations below it are inserted with.
//   set    every node on the path takes this insert's priority: the host's
//          latest word on the prefix, for a hint that expires. A conversation
//          inserted with priority 1 because its next turn is expected, and
//          then inserted again with 0 when that turn came and no other is
//          expected, drops back to 0 along its whole prefix; under raise it
//          would keep 1 and hold room nobody will ask for (docs/eviction.md).
enum class PriorityUpdate : std::uint8_t { raise = 0, set = 1 };

// Whether `value` names a PriorityUpdate: raw values come through the C ABI's
// int32_t, and a cast to the enum alone would wrap 256 to raise.
inline bool is_priority_update(std::int64_t value) { return value == 0 || value == 1; }

inline const char* priority_update_name(PriorityUpdate update) {
  return update == PriorityUpdate::set ? "set" : "raise";
}

inline std::optional<PriorityUpdate> parse_priority_update(std::string_view name) {
  if (name == "raise") return PriorityUpdate::raise;
  if (name == "set") return PriorityUpdate::set;
  return std::nullopt;
}

inline constexpr double kDefaultSlruProtectedFraction = 0.2;
// ghost_slru: a protected segment of 0.9 leaves probation a tenth of the pool,
// room for the running requests' new prefixes to get their first hit; the
// ghost remembers evictions worth 4 pool capacities, on the Mooncake trace
// about the think time of a conversation at 1M-3M tokens (docs/eviction.md).
inline constexpr double kDefaultGhostSlruProtectedFraction = 0.9;
inline constexpr double kDefaultGhostMemory = 4.0;
inline constexpr double kMaxGhostMemory = 64.0;

// Segmented policies: a probationary and a protected segment.
inline bool is_segmented(EvictionPolicy policy) {
  return policy == EvictionPolicy::slru || policy == EvictionPolicy::ghost_slru;
}
// The next use a belady node has before the replay supplies one: never.
inline constexpr std::uint32_t kNeverUsedAgain = 0xffffffffu;

// The eviction order key: smaller goes first. `tick` counts tree operations and
// stays far below 2^40 (a million operations a second for 12 days).
inline std::uint64_t eviction_key(EvictionPolicy policy, std::uint64_t last_access, std::uint32_t hits,
                                  std::uint8_t priority, bool in_protected_segment,
                                  std::uint32_t next_use = kNeverUsedAgain) {
  constexpr std::uint64_t kTickMask = (std::uint64_t{1} << 40) - 1;
  const std::uint64_t tick = last_access & kTickMask;
  switch (policy) {
    case EvictionPolicy::lru: return last_access;
    case EvictionPolicy::lfu: return (std::uint64_t{std::min<std::uint32_t>(hits, (1u << 23) - 1)} << 40) | tick;
    case EvictionPolicy::slru:
      return (std::uint64_t{in_protected_segment} << 63) | tick;
    // Priority (7 bits), then the segment, then LRU.
    case EvictionPolicy::ghost_slru:
      return (std::uint64_t{priority} << 56) | (std::uint64_t{in_protected_segment} << 55) | tick;
    case EvictionPolicy::priority: return (std::uint64_t{priority} << 56) | tick;
    // Farthest next use first; ties by LRU.
    case EvictionPolicy::belady:
      return (std::uint64_t{kNeverUsedAgain - next_use} << 32) | (tick & 0xffffffffu);
  }
  return last_access;
}

}  // namespace clm
