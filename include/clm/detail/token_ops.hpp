// clm/detail/token_ops.hpp: the hot loops over token ids: validation, first
// mismatch, and the hash of a page of tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "clm/status.hpp"

namespace clm::detail {

// Index of the first negative id, or n when all are valid (ids live in [0, 2^31)).
inline std::size_t first_invalid_token(const std::int32_t* tokens, std::size_t n) {
  // OR of every id, 8 lanes at a time (GCC/Clang vector extension): the sign
  // bit survives iff some id is negative. At -O2 a scalar loop stays scalar.
  using Lanes = std::int32_t __attribute__((vector_size(32)));
  Lanes any_lanes = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes chunk;
    std::memcpy(&chunk, tokens + i, sizeof chunk);
    any_lanes |= chunk;
  }
  std::int32_t any_negative = 0;
  for (int lane = 0; lane < 8; ++lane) any_negative |= any_lanes[lane];
  for (; i < n; ++i) any_negative |= tokens[i];
  if (any_negative >= 0) return n;
  for (i = 0; i < n; ++i) {
    if (tokens[i] < 0) return i;
  }
  return n;
}

// invalid_argument naming `what` and the first id of tokens[from, end) outside
// [0, 2^31). The radix tree passes the length of the part it matched as
// `from`: that part equals cached ids, which are valid.
inline Status check_token_ids(std::span<const std::int32_t> tokens, std::size_t from, const char* what) {
  const std::size_t bad = from + first_invalid_token(tokens.data() + from, tokens.size() - from);
  if (bad != tokens.size()) {
    return invalid_argument(fmt::format("{}: token id {} at position {} is outside [0, 2^31)", what, tokens[bad], bad));
  }
  return {};
}

// Length of the common prefix of a[0, n) and b[0, n). Whole blocks go through
// memcmp, which libc runs with the widest vectors the CPU has.
inline std::size_t common_prefix(const std::int32_t* a, const std::int32_t* b, std::size_t n) {
  constexpr std::size_t kBlock = 64;
  std::size_t i = 0;
  while (n - i >= kBlock && std::memcmp(a + i, b + i, kBlock * sizeof(std::int32_t)) == 0) i += kBlock;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline std::uint64_t hash_page(const std::int32_t* tokens, std::size_t n) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
  for (std::size_t i = 0; i < n; ++i) {
    h = (h ^ static_cast<std::uint32_t>(tokens[i])) * 0x100000001b3ULL;
  }
  return mix64(h);
}

}  // namespace clm::detail
