// lib/tiers/page_key.cpp: page keys (clm/tiers/page_key.hpp), SHA-256 through
// OpenSSL's EVP interface: one digest context per chain, reset per page.
#include "clm/tiers/page_key.hpp"

#include <openssl/evp.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>

#include <fmt/format.h>

namespace clm {

namespace {

struct DigestCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using DigestCtx = std::unique_ptr<EVP_MD_CTX, DigestCtxFree>;

void le32(std::uint32_t v, unsigned char out[4]) {
  for (int b = 0; b < 4; ++b) out[b] = static_cast<unsigned char>(v >> (8 * b));
}

// SHA-256, fetched once: EVP_sha256() in each init makes OpenSSL 3 look the
// algorithm up again, under a read lock, for every page (a third of a page
// key's time in bench_events). Null only when libcrypto cannot allocate.
const EVP_MD* sha256() {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

// Hashes one page into `out` (see the header for the bytes); false only when
// libcrypto itself fails (out of memory).
bool hash_page(EVP_MD_CTX* ctx, const PageKey& parent, std::span<const std::int32_t> tokens, const PageKeyNamespace& ns,
               PageKey& out) {
  const EVP_MD* md = sha256();
  if (md == nullptr || EVP_DigestInit_ex(ctx, md, nullptr) != 1) return false;
  unsigned char word[4];
  bool ok = EVP_DigestUpdate(ctx, parent.bytes.data(), parent.bytes.size()) == 1;
  le32(static_cast<std::uint32_t>(tokens.size()), word);
  ok = ok && EVP_DigestUpdate(ctx, word, 4) == 1;
  if constexpr (std::endian::native == std::endian::little) {
    // The ids are already the little-endian bytes the key is defined over.
    ok = ok && EVP_DigestUpdate(ctx, tokens.data(), tokens.size() * sizeof(std::int32_t)) == 1;
  } else {
    for (std::size_t i = 0; ok && i < tokens.size(); ++i) {
      le32(static_cast<std::uint32_t>(tokens[i]), word);
      ok = EVP_DigestUpdate(ctx, word, 4) == 1;
    }
  }
  le32(static_cast<std::uint32_t>(ns.salt.size()), word);
  ok = ok && EVP_DigestUpdate(ctx, word, 4) == 1;
  ok = ok && EVP_DigestUpdate(ctx, ns.salt.data(), ns.salt.size()) == 1;
  le32(static_cast<std::uint32_t>(ns.adapter_id), word);
  ok = ok && EVP_DigestUpdate(ctx, word, 4) == 1;
  ok = ok && EVP_DigestUpdate(ctx, ns.scope.data(), ns.scope.size()) == 1;
  unsigned int length = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, out.bytes.data(), &length) == 1;
  return ok && length == out.bytes.size();
}

bool fits_u32(std::size_t n) { return n <= std::numeric_limits<std::uint32_t>::max(); }

}  // namespace

std::string PageKey::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * bytes.size(), '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return out;
}

PageKey next_page_key(const PageKey& parent, std::span<const std::int32_t> page_tokens, const PageKeyNamespace& ns) {
  PageKey key;
  DigestCtx ctx(EVP_MD_CTX_new());
  // This signature has no way to report a failure, and a wrong key would
  // share pages across prefixes; libcrypto fails here only when the host is
  // out of memory (or a page or salt has over 2^32 entries).
  if (!ctx || !fits_u32(page_tokens.size()) || !fits_u32(ns.salt.size()) ||
      !hash_page(ctx.get(), parent, page_tokens, ns, key)) {
    std::fputs("clmcache: next_page_key: SHA-256 failed (libcrypto out of memory)\n", stderr);
    std::abort();
  }
  return key;
}

Status chain_page_keys(const PageKey& parent, std::span<const std::int32_t> tokens, std::int32_t page_size,
                       const PageKeyNamespace& ns, std::span<PageKey> out) {
  if (page_size < 1)
    return invalid_argument(fmt::format("chain_page_keys: page_size {}, must be at least 1", page_size));
  const auto page = static_cast<std::size_t>(page_size);
  if (out.size() > tokens.size() / page) {
    return invalid_argument(fmt::format("chain_page_keys: {} pages of {} tokens asked, but only {} tokens given",
                                        out.size(), page_size, tokens.size()));
  }
  if (!fits_u32(ns.salt.size())) return invalid_argument("chain_page_keys: salt over 2^32 bytes");
  if (out.empty()) return {};
  DigestCtx ctx(EVP_MD_CTX_new());
  if (!ctx) return out_of_memory("chain_page_keys: cannot allocate a digest context");
  // Checked above: `out` is written only past this point. libcrypto fails
  // only without memory, and then `out` is partly written (and internal).
  const PageKey* prev = &parent;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!hash_page(ctx.get(), *prev, tokens.subspan(i * page, page), ns, out[i])) {
      return Status(StatusCode::internal, "chain_page_keys: SHA-256 failed in libcrypto");
    }
    prev = &out[i];
  }
  return {};
}

}  // namespace clm
