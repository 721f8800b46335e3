// clm/eviction_policy.hpp: which cached prefix the radix tree gives up first.
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
//   priority  the insert's priority (0-100), lowest first; ties by LRU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

namespace clm {

enum class EvictionPolicy : std::uint8_t { lru = 0, lfu = 1, slru = 2, priority = 3 };

inline const char* eviction_policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::lru: return "lru";
    case EvictionPolicy::lfu: return "lfu";
    case EvictionPolicy::slru: return "slru";
    case EvictionPolicy::priority: return "priority";
  }
  return "unknown";
}

inline std::optional<EvictionPolicy> parse_eviction_policy(std::string_view name) {
  for (EvictionPolicy p : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::slru, EvictionPolicy::priority}) {
    if (name == eviction_policy_name(p)) return p;
  }
  return std::nullopt;
}

inline constexpr int kMaxPriority = 100;
inline constexpr double kDefaultSlruProtectedFraction = 0.2;

// The eviction order key: smaller goes first. `tick` counts tree operations and
// stays far below 2^40 (a million operations a second for 12 days).
inline std::uint64_t eviction_key(EvictionPolicy policy, std::uint64_t last_access, std::uint32_t hits,
                                  std::uint8_t priority, bool in_protected_segment) {
  constexpr std::uint64_t kTickMask = (std::uint64_t{1} << 40) - 1;
  const std::uint64_t tick = last_access & kTickMask;
  switch (policy) {
    case EvictionPolicy::lru: return last_access;
    case EvictionPolicy::lfu: return (std::uint64_t{std::min<std::uint32_t>(hits, (1u << 23) - 1)} << 40) | tick;
    case EvictionPolicy::slru: return (std::uint64_t{in_protected_segment} << 63) | tick;
    case EvictionPolicy::priority: return (std::uint64_t{priority} << 56) | tick;
  }
  return last_access;
}

}  // namespace clm
