// clm/detail/fast_checksum.hpp: a fast 64-bit integrity checksum for
// megabyte-sized buffers (storage tier pages, clm/tiers/page_file.hpp). It is
// xxHash64 (four 64-bit lanes over 32-byte stripes, then the tail, then an
// avalanche), so it runs at memory speed where a byte-at-a-time FNV does not.
// An integrity check against torn or flipped bytes, not a cryptographic hash.
//
//   const std::uint64_t header_sum = clm::detail::fast_checksum(header.data(), header.size());
//   const std::uint64_t sum = clm::detail::fast_checksum(payload.data(), payload.size(), header_sum);
//
// Chaining through the seed, as above, checks two buffers that do not lie
// together without copying them into one. Bytes are read as little-endian
// words, so the value is the same on every host.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace clm::detail {

inline constexpr std::uint64_t kChecksumP1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kChecksumP2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kChecksumP3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kChecksumP4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kChecksumP5 = 0x27D4EB2F165667C5ull;

inline std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);  // one unaligned load; no alignment assumed
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline std::uint32_t load_le32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}

inline std::uint64_t checksum_round(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * kChecksumP2;
  acc = std::rotl(acc, 31);
  return acc * kChecksumP1;
}
inline std::uint64_t checksum_merge(std::uint64_t acc, std::uint64_t lane_acc) {
  acc ^= checksum_round(0, lane_acc);
  return acc * kChecksumP1 + kChecksumP4;
}

inline std::uint64_t fast_checksum(const void* data, std::size_t size, std::uint64_t seed = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  std::uint64_t h;
  if (size >= 32) {
    // Four independent lanes: the multiplies of one stripe overlap in the pipeline.
    std::uint64_t v1 = seed + kChecksumP1 + kChecksumP2;
    std::uint64_t v2 = seed + kChecksumP2;
    std::uint64_t v3 = seed;
    std::uint64_t v4 = seed - kChecksumP1;
    const unsigned char* const last_stripe = end - 32;
    do {
      v1 = checksum_round(v1, load_le64(p));
      v2 = checksum_round(v2, load_le64(p + 8));
      v3 = checksum_round(v3, load_le64(p + 16));
      v4 = checksum_round(v4, load_le64(p + 24));
      p += 32;
    } while (p <= last_stripe);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = checksum_merge(h, v1);
    h = checksum_merge(h, v2);
    h = checksum_merge(h, v3);
    h = checksum_merge(h, v4);
  } else {
    h = seed + kChecksumP5;
  }
  h += static_cast<std::uint64_t>(size);
  // The tail: 8-byte words, then at most one 4-byte word, then single bytes.
  for (; end - p >= 8; p += 8) h = std::rotl(h ^ checksum_round(0, load_le64(p)), 27) * kChecksumP1 + kChecksumP4;
  if (end - p >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(load_le32(p)) * kChecksumP1), 23) * kChecksumP2 + kChecksumP3;
    p += 4;
  }
  for (; p < end; ++p) h = std::rotl(h ^ (static_cast<std::uint64_t>(*p) * kChecksumP5), 11) * kChecksumP1;
  // Avalanche: every input bit reaches every output bit.
  h ^= h >> 33;
  h *= kChecksumP2;
  h ^= h >> 29;
  h *= kChecksumP3;
  h ^= h >> 32;
  return h;
}

}  // namespace clm::detail
