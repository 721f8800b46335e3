// tests/kv_reference.hpp: the K/V rows a test's "model" computes, as a
// reference for every cached byte. Token t of a prompt under tenant `salt` has
// rows that are a function of (salt, tokens [0, t]), for every layer, K and V:
// whatever tier a cached page comes back from, its rows must be exactly those
// of the prompt admitting it, so a page of another prefix, another tenant, a
// half-written or a stale page fails the check. Only the standard library:
// the Engine's tests and the C ABI's (which see nothing but clm.h) share it;
// each says where a row lies in its pool with row(slot, layer, kv), a pointer
// to the `width` (kv_heads * head_dim) floats of that row.
//
//   auto row = [&](std::int64_t slot, int layer, int kv) -> float* { ... };
//   CHECK(clm_test::wrong_reference_rows(row, layers, width, salt, prompt, page_table, page_size, cached) == 0);
//   clm_test::write_reference_rows(row, layers, width, salt, prompt, cached, slots);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace clm_test {

// The hash of tenant `salt` and tokens [0, upto] of `tokens`.
inline std::uint64_t prefix_hash(std::string_view salt, std::span<const std::int32_t> tokens, std::size_t upto) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::uint64_t v) {
    h ^= v;
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  };
  for (char c : salt) mix(static_cast<unsigned char>(c));
  mix(0x5a17);
  for (std::size_t i = 0; i <= upto; ++i) mix(static_cast<std::uint32_t>(tokens[i]));
  return h;
}

// Element e of the K (kv 0) or V (kv 1) row in `layer` of the token whose prefix hash is h.
inline float kv_value(std::uint64_t h, int layer, int kv, int e) {
  std::uint64_t x = h ^ (static_cast<std::uint64_t>(layer) << 40) ^ (static_cast<std::uint64_t>(kv) << 32) ^
                    static_cast<std::uint64_t>(e);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<float>(x % 100000) / 1000.0f;
}

// The host's side after an admission: writes the rows of tokens first,
// first + 1, ... of `prompt` at slots[0], slots[1], ... (the uncached tokens).
template <class Row>
void write_reference_rows(Row&& row, int num_layers, int width, std::string_view salt,
                          std::span<const std::int32_t> prompt, std::size_t first,
                          std::span<const std::int64_t> slots) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::uint64_t h = prefix_hash(salt, prompt, first + i);
    for (int layer = 0; layer < num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        float* r = row(slots[i], layer, kv);
        for (int e = 0; e < width; ++e) r[e] = kv_value(h, layer, kv, e);
      }
    }
  }
}

// How many of the cached tokens [0, cached) of `prompt`, in the pages of
// `page_table`, have rows that differ from the reference (0 is right).
template <class Row>
int wrong_reference_rows(Row&& row, int num_layers, int width, std::string_view salt,
                         std::span<const std::int32_t> prompt, std::span<const std::int32_t> page_table,
                         std::int32_t page_size, std::int32_t cached) {
  int wrong = 0;
  for (std::int32_t t = 0; t < cached; ++t) {
    const std::int64_t slot =
        static_cast<std::int64_t>(page_table[static_cast<std::size_t>(t / page_size)]) * page_size + t % page_size;
    const std::uint64_t h = prefix_hash(salt, prompt, static_cast<std::size_t>(t));
    bool same = true;
    for (int layer = 0; layer < num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* r = row(slot, layer, kv);
        for (int e = 0; e < width; ++e) same = same && r[e] == kv_value(h, layer, kv, e);
      }
    }
    wrong += same ? 0 : 1;
  }
  return wrong;
}

}  // namespace clm_test
