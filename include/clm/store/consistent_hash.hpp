// clm/store/consistent_hash.hpp: the ring that assigns a 64-bit key to one of
// N shards so that growing to N+1 shards moves only about 1/(N+1) of the keys
// (Karger et al., 1997). The snapshot store routes each key by it.
//
//   clm::ConsistentHashRing ring(16);
//   std::int32_t shard = ring.shard_of(key.group);   // 0..15
//
// Each shard owns `points_per_shard` pseudo-random points on the 64-bit
// circle; a key belongs to the first point at or after its mixed hash. The
// points of shard s do not depend on N, which is what keeps keys in place
// when a shard is added. 128 points per shard keep the largest shard within
// about 15% of the mean at 16 shards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace clm {

// splitmix64's finaliser: a bijection that spreads nearby inputs over the circle.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class ConsistentHashRing {
 public:
  explicit ConsistentHashRing(std::int32_t shards, std::int32_t points_per_shard = 128) {
    points_.reserve(static_cast<std::size_t>(shards) * static_cast<std::size_t>(points_per_shard));
    for (std::int32_t s = 0; s < shards; ++s) {
      for (std::int32_t p = 0; p < points_per_shard; ++p) {
        points_.emplace_back(mix64((static_cast<std::uint64_t>(s) << 32) | static_cast<std::uint32_t>(p)), s);
      }
    }
    std::sort(points_.begin(), points_.end());
  }

  std::int32_t shard_of(std::uint64_t key) const {
    const std::uint64_t h = mix64(key);
    auto it = std::lower_bound(points_.begin(), points_.end(), std::pair<std::uint64_t, std::int32_t>(h, 0));
    if (it == points_.end()) it = points_.begin();
    return it->second;
  }

 private:
  std::vector<std::pair<std::uint64_t, std::int32_t>> points_;  // (position, shard), sorted
};

}  // namespace clm
