// tests/tiers/tiers_test_support.hpp: what the storage tier's tests share:
// random page keys, and page bytes that are a function of the key, so any
// thread (or process) can check a page it did not write.
//
//   const clm::PageKey key = clm_test::random_page_key(rng);
//   std::vector<std::byte> page = clm_test::page_bytes_of(key, layout);
//   CHECK(clm_test::page_matches(key, layout, buffer_slot));
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/tiers/page_key.hpp"
#include "clm/tiers/page_seal.hpp"
#include "clm/tiers/storage_backend.hpp"

namespace clm_test {

inline clm::PageKey random_page_key(std::mt19937_64& rng) {
  clm::PageKey key;
  for (auto& b : key.bytes) b = static_cast<std::uint8_t>(rng());
  return key;
}

// Pseudo-random bytes seeded by the key (and a variant, for "another payload
// under the same key").
inline std::vector<std::byte> page_bytes_of(const clm::PageKey& key, const clm::PageLayout& layout,
                                            std::uint64_t variant = 0) {
  std::uint64_t seed = variant * 0x9E3779B97F4A7C15ull;
  for (std::size_t i = 0; i < 8; ++i) seed ^= static_cast<std::uint64_t>(key.bytes[i]) << (8 * i);
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(layout.page_bytes());
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const std::uint64_t v = rng();
    for (int b = 0; b < 8; ++b) out[i + static_cast<std::size_t>(b)] = static_cast<std::byte>(v >> (8 * b));
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(rng());
  return out;
}

inline bool page_matches(const clm::PageKey& key, const clm::PageLayout& layout, std::span<const std::byte> slot,
                         std::uint64_t variant = 0) {
  const std::vector<std::byte> want = page_bytes_of(key, layout, variant);
  return std::equal(slot.begin(), slot.end(), want.begin(), want.end());
}

// The pages of `keys`, back to back, as set() takes them.
inline std::vector<std::byte> pages_of(std::span<const clm::PageKey> keys, const clm::PageLayout& layout,
                                       std::uint64_t variant = 0) {
  std::vector<std::byte> out;
  out.reserve(keys.size() * layout.page_bytes());
  for (const auto& key : keys) {
    const auto page = page_bytes_of(key, layout, variant);
    out.insert(out.end(), page.begin(), page.end());
  }
  return out;
}

// ---- what the backend tests share (Catch2 assertions inside) -------------------------
// The seal of the backend tests' pages: one model, no secret (`secret` signs).
inline clm::PageSeal test_seal(const std::string& model_id = "test-model", const std::string& secret = "") {
  clm::PageSeal seal;
  const clm::Status s = clm::PageSeal::create(model_id, secret, seal);
  INFO(s.message());
  REQUIRE(s.ok());
  return seal;
}

// A backend that must open.
inline std::unique_ptr<clm::StorageBackend> open_backend(const std::string& url, const clm::PageLayout& layout,
                                                         const clm::PageSeal& seal = test_seal()) {
  std::unique_ptr<clm::StorageBackend> backend;
  const clm::Status s = clm::open_storage_backend(url, layout, seal, backend);
  INFO(url << ": " << s.message());
  REQUIRE(s.ok());
  return backend;
}

inline std::vector<clm::PageKey> random_keys(std::mt19937_64& rng, std::size_t n) {
  std::vector<clm::PageKey> keys(n);
  for (auto& k : keys) k = random_page_key(rng);
  return keys;
}

// Stores the pages of `keys` (variant `variant`); all must be written.
inline void store(clm::StorageBackend& b, const std::vector<clm::PageKey>& keys, std::uint64_t variant = 0) {
  const std::vector<std::byte> pages = pages_of(keys, b.layout(), variant);
  std::vector<std::uint8_t> written(keys.size(), 7);
  const clm::Status s = b.set(keys, pages, written);
  INFO(s.message());
  REQUIRE(s.ok());
  for (std::uint8_t w : written) REQUIRE(w == 1);
}

// get() of `keys`; each found page is checked against its bytes.
inline std::vector<std::uint8_t> fetch(clm::StorageBackend& b, const std::vector<clm::PageKey>& keys,
                                       std::uint64_t variant = 0) {
  const std::size_t page = b.layout().page_bytes();
  std::vector<std::byte> buffer(keys.size() * page);
  std::vector<std::uint8_t> found(keys.size(), 7);
  const clm::Status s = b.get(keys, buffer, found);
  INFO(s.message());
  REQUIRE(s.ok());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(found[i] <= 1);
    if (found[i]) {
      INFO("page " << i);
      REQUIRE(page_matches(keys[i], b.layout(), std::span(buffer).subspan(i * page, page), variant));
    }
  }
  return found;
}

}  // namespace clm_test
