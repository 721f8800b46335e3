// clm/tiers/page_seal.hpp: what makes a stored KV page this model's and this
// deployment's. The model: the SHA-256 of the host's model id (its own
// fingerprint of weights + config), hashed into every page key and written in
// every page header, so two models of one layout sharing a store never serve
// each other's KV. The deployment: an optional secret, with which every page
// carries a MAC over its header and payload (AES-256-GMAC under a key of its
// own, below), so that a writer without the secret cannot forge a page
// another instance serves.
//
//   std::string secret;
//   CLM_RETURN_IF_ERROR(clm::load_page_secret("/etc/clm/page.key", "", secret));  // or ("", "CLM_PAGE_SECRET")
//   clm::PageSeal seal;
//   CLM_RETURN_IF_ERROR(clm::PageSeal::create("llama-3-8b@sha256:9f2c...", secret, seal));
//   PageKeyNamespace ns{.salt = "tenant-7", .adapter_id = 0, .scope = seal.key_scope()};
//   // encode_page_header / decode_page (page_file.hpp) take the seal.
//
// The secret is read from a file (never readable by everyone) or an
// environment variable, never from a URL, and is never printed. With a
// secret the page keys are chained under a scope derived from it too
// (HMAC(secret, "clmcache page keys")): instances with another secret, or
// none, never name the same pages, so they never refuse (and delete) each
// other's pages; and keys no longer reveal a hash of the tokens alone.
//
// Why GMAC and a key per page: HMAC-SHA256 runs at 1.8 GB/s a core here (with
// the SHA extensions), slower than reading a page from the page cache, so
// verifying would halve a fetch; GHASH runs at about 15 GB/s (AES-NI and
// carry-less multiply). GMAC must never see one nonce twice under one key, so
// no key signs two pages: each page draws a random 12-byte nonce N, and its
// key is AES-256_K(le32(0) || N) || AES-256_K(le32(1) || N), K =
// HMAC-SHA256(secret, "clmcache page mac v1") (the derivation of AES-GCM-SIV,
// RFC 8452); its tag is AES-256-GMAC(that key, iv = N, aad = the bytes).
// Two pages share a key only if their random nonces collide: about 2^48
// pages under one secret.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "clm/status.hpp"

namespace clm {

using Digest32 = std::array<std::uint8_t, 32>;
// A page's signature as stored: its 12-byte nonce, then its 16-byte tag.
inline constexpr std::size_t kPageNonceBytes = 12;
inline constexpr std::size_t kPageTagBytes = 16;
using PageSignature = std::array<std::uint8_t, kPageNonceBytes + kPageTagBytes>;

// Signs and checks pages under one secret (see above). Thread-safe: each
// call uses its own contexts.
class PageSigner {
 public:
  // invalid_argument for a secret under kMinSecretBytes or over kMaxSecretBytes.
  static Status create(std::string_view secret, std::unique_ptr<PageSigner>& out);
  ~PageSigner();
  PageSigner(const PageSigner&) = delete;
  PageSigner& operator=(const PageSigner&) = delete;

  static constexpr std::size_t kMinSecretBytes = 16;
  static constexpr std::size_t kMaxSecretBytes = 4096;

  // The signature of the concatenation of `first` and `second`, under a
  // fresh random nonce. internal only when libcrypto fails (no memory, no
  // randomness).
  Status sign(std::span<const std::byte> first, std::span<const std::byte> second, PageSignature& out) const;
  // Whether `stored` (kPageNonceBytes + kPageTagBytes) is a signature of that
  // concatenation: the tag under its nonce, compared in constant time. Any
  // other length does not match.
  Status verify(std::span<const std::byte> first, std::span<const std::byte> second, std::span<const std::byte> stored,
                bool& matches) const;
  // The tag of the concatenation under `nonce`: what sign and verify compute.
  Status tag(std::span<const std::uint8_t, kPageNonceBytes> nonce, std::span<const std::byte> first,
             std::span<const std::byte> second, std::array<std::uint8_t, kPageTagBytes>& out) const;
  // HMAC(secret, "clmcache page keys"): what page keys are scoped under.
  const Digest32& key_id() const { return key_id_; }

 private:
  PageSigner() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Digest32 key_id_{};
};

struct PageSeal {
  Digest32 model{};                          // SHA-256 of the model id
  std::shared_ptr<const PageSigner> signer;  // null: pages are neither signed nor may be

  // invalid_argument for an empty model id or one over 4096 bytes, or a bad
  // secret (see PageSigner::create); an empty secret: no signing.
  static Status create(std::string_view model_id, std::string_view secret, PageSeal& out);
  // The 32 bytes every page key of this seal is chained under (page_key.hpp):
  // SHA-256("clmcache page scope v1", model, signer's key id or 32 zeros).
  Digest32 key_scope() const;
};

// The deployment secret from a file (its bytes, one trailing newline
// dropped) or from the environment variable named `env_name`; both empty:
// `secret` is empty (no signing). invalid_argument when both are named;
// not_found for a missing file or an unset or empty variable;
// failed_precondition for a file that is not a regular file or that everyone
// may read; invalid_argument for a secret of the wrong length. Messages name
// the file or the variable, never the secret.
Status load_page_secret(std::string_view file, std::string_view env_name, std::string& secret);

// Reads a secret file (what load_page_secret and redis password_file share):
// a regular file that others may not read, at most `max_bytes` bytes. `what`
// opens every message ("redis password_file").
Status read_secret_file(const std::string& path, std::string_view what, std::size_t max_bytes, std::string& out);

}  // namespace clm
