// clm/tiers/page_key.hpp: the name of one KV page in a storage tier (L3), a
// hash chain over the prefix the page ends: SHA-256 (OpenSSL libcrypto) of
// the parent page's key, the page's token ids, the cache salt, the adapter id
// and the scope (page_seal.hpp: the model, and the deployment's secret). Two
// pages share a key only when their whole prefix, tenant, adapter, model and
// secret are equal, so instances that share a store share exactly the
// prefixes they could share in one tree, and never across tenants or models.
//
//   clm::PageKey parent = clm::PageKey::root();     // before the first page
//   std::vector<clm::PageKey> keys(prompt.size() / page_size);
//   CLM_RETURN_IF_ERROR(clm::chain_page_keys(parent, prompt, page_size,
//                                            {.salt = "tenant-7", .adapter_id = 0,
//                                             .scope = seal.key_scope()}, keys));
//   std::string hex = keys[0].hex();                 // 64 lowercase hex digits
//
// Exact bytes hashed per page (little-endian): the 32-byte parent key, then
// u32 page_size, page_size x i32 token ids, u32 salt length, the salt bytes,
// i32 adapter id, the 32 scope bytes. The root key is 32 zero bytes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "clm/status.hpp"
#include "clm/tiers/page_seal.hpp"

namespace clm {

struct PageKey {
  std::array<std::uint8_t, 32> bytes{};

  static PageKey root() { return {}; }
  bool operator==(const PageKey&) const = default;
  std::string hex() const;
};

struct PageKeyNamespace {
  std::string_view salt;
  std::int32_t adapter_id = 0;
  Digest32 scope{};  // PageSeal::key_scope(); all zero only in tests of the chain itself
};

// The key of the page holding `page_tokens` (page_size ids) under `parent`.
PageKey next_page_key(const PageKey& parent, std::span<const std::int32_t> page_tokens, const PageKeyNamespace& ns);

// Keys of the first out.size() pages of `tokens` (which must hold at least
// out.size() * page_size ids), chained from `parent`. invalid_argument (and
// nothing written) when tokens are short or page_size < 1.
Status chain_page_keys(const PageKey& parent, std::span<const std::int32_t> tokens, std::int32_t page_size,
                       const PageKeyNamespace& ns, std::span<PageKey> out);

}  // namespace clm
