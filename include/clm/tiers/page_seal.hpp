// clm/tiers/page_seal.hpp: what makes a stored KV page this model's and this
// deployment's. The model: the SHA-256 of the host's model id (its own
// fingerprint of weights + config), hashed into every page key and written in
// every page header, so two models of one layout sharing a store never serve
// each other's KV. The deployment: an optional secret, with which every page
// carries an HMAC-SHA256 (OpenSSL) over its header and payload, so that a
// writer without the secret cannot forge a page another instance serves.
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

// HMAC-SHA256 under one secret. Thread-safe: each call uses its own context.
class PageSigner {
 public:
  // invalid_argument for a secret under kMinSecretBytes or over kMaxSecretBytes.
  static Status create(std::string_view secret, std::unique_ptr<PageSigner>& out);
  ~PageSigner();
  PageSigner(const PageSigner&) = delete;
  PageSigner& operator=(const PageSigner&) = delete;

  static constexpr std::size_t kMinSecretBytes = 16;
  static constexpr std::size_t kMaxSecretBytes = 4096;

  // The MAC of the concatenation of `first` and `second`. internal only when
  // libcrypto fails (out of memory).
  Status mac(std::span<const std::byte> first, std::span<const std::byte> second, Digest32& out) const;
  // Whether `expected` (32 bytes) is that MAC, compared in constant time.
  Status verify(std::span<const std::byte> first, std::span<const std::byte> second,
                std::span<const std::byte> expected, bool& matches) const;
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
