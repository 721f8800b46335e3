// lib/tiers/page_seal.cpp: model digests, the page signer (AES-256-GMAC
// under a key per page) and the deployment secret (clm/tiers/page_seal.hpp),
// on OpenSSL 3's EVP interfaces.
#include "clm/tiers/page_seal.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

namespace clm {

namespace {

constexpr std::string_view kKeyIdLabel = "clmcache page keys";
constexpr std::string_view kMacKeyLabel = "clmcache page mac v1";
constexpr std::string_view kScopeLabel = "clmcache page scope v1";
constexpr std::size_t kMaxModelIdBytes = 4096;

struct MacCtxFree {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};
using MacCtx = std::unique_ptr<EVP_MAC_CTX, MacCtxFree>;

bool sha256(std::initializer_list<std::span<const std::uint8_t>> parts, Digest32& out) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1;
  for (const auto& part : parts) ok = ok && EVP_DigestUpdate(ctx, part.data(), part.size()) == 1;
  unsigned int length = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, out.data(), &length) == 1 && length == out.size();
  EVP_MD_CTX_free(ctx);
  return ok;
}

std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

// Fetched once: EVP_aes_256_*() in each init makes OpenSSL 3 look them up.
const EVP_CIPHER* aes_256_ecb() {
  static EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-ECB", nullptr);
  return cipher;
}
const EVP_CIPHER* aes_256_gcm() {
  static EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

// Feeds `bytes` to a GCM context as additional data, in pieces an int counts.
bool add_aad(EVP_CIPHER_CTX* ctx, std::span<const std::byte> bytes) {
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  for (std::size_t at = 0; at < bytes.size(); at += kPiece) {
    const std::size_t n = std::min(kPiece, bytes.size() - at);
    int written = 0;
    if (EVP_EncryptUpdate(ctx, nullptr, &written, reinterpret_cast<const unsigned char*>(bytes.data() + at),
                          static_cast<int>(n)) != 1) {
      return false;
    }
  }
  return true;
}

}  // namespace

// The HMAC context keyed once with the secret (for key ids), and K, the key
// that page keys derive from (wiped with the signer).
struct PageSigner::Impl {
  MacCtx keyed;
  Digest32 derive_key{};
  ~Impl() { OPENSSL_cleanse(derive_key.data(), derive_key.size()); }

  bool hmac(std::string_view label, Digest32& out) const {
    MacCtx ctx(EVP_MAC_CTX_dup(keyed.get()));
    std::size_t length = 0;
    return ctx && EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(label.data()), label.size()) == 1 &&
           EVP_MAC_final(ctx.get(), out.data(), &length, out.size()) == 1 && length == out.size();
  }
};

PageSigner::~PageSigner() = default;

Status PageSigner::create(std::string_view secret, std::unique_ptr<PageSigner>& out) {
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    return invalid_argument(
        fmt::format("page secret: {} bytes, must be {} to {}", secret.size(), kMinSecretBytes, kMaxSecretBytes));
  }
  if (!aes_256_ecb() || !aes_256_gcm()) return Status(StatusCode::internal, "page secret: libcrypto has no AES-256");
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!hmac) return Status(StatusCode::internal, "page secret: libcrypto has no HMAC");
  MacCtx ctx(EVP_MAC_CTX_new(hmac));
  EVP_MAC_free(hmac);  // the context holds its own reference
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
                               OSSL_PARAM_construct_end()};
  if (!ctx ||
      EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), params) != 1) {
    return Status(StatusCode::internal, "page secret: cannot set up HMAC-SHA256 in libcrypto");
  }
  std::unique_ptr<PageSigner> signer(new PageSigner());
  signer->impl_ = std::make_unique<Impl>();
  signer->impl_->keyed = std::move(ctx);
  if (!signer->impl_->hmac(kKeyIdLabel, signer->key_id_) ||
      !signer->impl_->hmac(kMacKeyLabel, signer->impl_->derive_key)) {
    return Status(StatusCode::internal, "page secret: HMAC-SHA256 failed in libcrypto");
  }
  out = std::move(signer);
  return {};
}

Status PageSigner::tag(std::span<const std::uint8_t, kPageNonceBytes> nonce, std::span<const std::byte> first,
                       std::span<const std::byte> second, std::array<std::uint8_t, kPageTagBytes>& out) const {
  // The page's key: two AES blocks of (le32(i) || nonce) under K.
  std::array<std::uint8_t, 32> blocks{};
  for (std::uint8_t i = 0; i < 2; ++i) {
    blocks[16 * i] = i;
    std::memcpy(blocks.data() + 16 * i + 4, nonce.data(), nonce.size());
  }
  std::array<std::uint8_t, 32> page_key{};
  CipherCtx derive(EVP_CIPHER_CTX_new());
  int written = 0, tail = 0;
  bool ok =
      derive && EVP_EncryptInit_ex2(derive.get(), aes_256_ecb(), impl_->derive_key.data(), nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_set_padding(derive.get(), 0) == 1 &&
      EVP_EncryptUpdate(derive.get(), page_key.data(), &written, blocks.data(), static_cast<int>(blocks.size())) == 1 &&
      written == static_cast<int>(page_key.size()) &&
      EVP_EncryptFinal_ex(derive.get(), page_key.data() + written, &tail) == 1;
  CipherCtx gmac(EVP_CIPHER_CTX_new());
  ok = ok && gmac && EVP_EncryptInit_ex2(gmac.get(), aes_256_gcm(), page_key.data(), nonce.data(), nullptr) == 1 &&
       add_aad(gmac.get(), first) && add_aad(gmac.get(), second) &&
       EVP_EncryptFinal_ex(gmac.get(), nullptr, &tail) == 1 &&
       EVP_CIPHER_CTX_ctrl(gmac.get(), EVP_CTRL_AEAD_GET_TAG, static_cast<int>(out.size()), out.data()) == 1;
  OPENSSL_cleanse(page_key.data(), page_key.size());
  if (!ok) return Status(StatusCode::internal, "page signature: AES-256-GMAC failed in libcrypto");
  return {};
}

Status PageSigner::sign(std::span<const std::byte> first, std::span<const std::byte> second, PageSignature& out) const {
  std::array<std::uint8_t, kPageNonceBytes> nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return Status(StatusCode::internal, "page signature: libcrypto has no randomness for a nonce");
  }
  std::array<std::uint8_t, kPageTagBytes> page_tag{};
  CLM_RETURN_IF_ERROR(tag(nonce, first, second, page_tag));
  std::memcpy(out.data(), nonce.data(), nonce.size());
  std::memcpy(out.data() + nonce.size(), page_tag.data(), page_tag.size());
  return {};
}

Status PageSigner::verify(std::span<const std::byte> first, std::span<const std::byte> second,
                          std::span<const std::byte> stored, bool& matches) const {
  matches = false;
  if (stored.size() != kPageNonceBytes + kPageTagBytes) return {};
  std::array<std::uint8_t, kPageNonceBytes> nonce{};
  std::memcpy(nonce.data(), stored.data(), nonce.size());
  std::array<std::uint8_t, kPageTagBytes> computed{};
  CLM_RETURN_IF_ERROR(tag(nonce, first, second, computed));
  matches = CRYPTO_memcmp(computed.data(), stored.data() + kPageNonceBytes, computed.size()) == 0;
  return {};
}

Status PageSeal::create(std::string_view model_id, std::string_view secret, PageSeal& out) {
  if (model_id.empty()) return invalid_argument("model id: empty (the host's fingerprint of its weights and config)");
  if (model_id.size() > kMaxModelIdBytes) {
    return invalid_argument(fmt::format("model id: {} bytes, at most {}", model_id.size(), kMaxModelIdBytes));
  }
  PageSeal seal;
  if (!sha256({bytes_of(model_id)}, seal.model)) return Status(StatusCode::internal, "model id: SHA-256 failed");
  if (!secret.empty()) {
    std::unique_ptr<PageSigner> signer;
    CLM_RETURN_IF_ERROR(PageSigner::create(secret, signer));
    seal.signer = std::move(signer);
  }
  out = std::move(seal);
  return {};
}

Digest32 PageSeal::key_scope() const {
  const Digest32 none{};
  const Digest32& key_id = signer ? signer->key_id() : none;
  Digest32 scope;
  if (!sha256({bytes_of(kScopeLabel), model, key_id}, scope)) {
    // A wrong scope would share pages across models: refuse to go on, as
    // next_page_key does (libcrypto fails here only without memory).
    std::fputs("clmcache: PageSeal::key_scope: SHA-256 failed (libcrypto out of memory)\n", stderr);
    std::abort();
  }
  return scope;
}

Status read_secret_file(const std::string& path, std::string_view what, std::size_t max_bytes, std::string& out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return not_found(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return failed_precondition(fmt::format("{} {}: not a file", what, path));
  if ((st.st_mode & S_IROTH) != 0) {
    return failed_precondition(
        fmt::format("{} {}: readable by everyone (mode {:o}): chmod o-r it", what, path, st.st_mode & 0777));
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return invalid_argument(fmt::format("{} {}: {} bytes, at most {}", what, path, st.st_size, max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(fmt::format("{} {}: cannot read it", what, path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error(fmt::format("{} {}: cannot read it", what, path));
  out = std::move(bytes);
  return {};
}

Status load_page_secret(std::string_view file, std::string_view env_name, std::string& secret) {
  secret.clear();
  if (!file.empty() && !env_name.empty()) {
    return invalid_argument("page secret: both a file and an environment variable named (give one)");
  }
  std::string value;
  if (!file.empty()) {
    CLM_RETURN_IF_ERROR(
        read_secret_file(std::string(file), "page secret file", PageSigner::kMaxSecretBytes + 2, value));
    if (!value.empty() && value.back() == '\n') value.pop_back();
    if (!value.empty() && value.back() == '\r') value.pop_back();
  } else if (!env_name.empty()) {
    const char* from_env = std::getenv(std::string(env_name).c_str());
    if (!from_env || !*from_env)
      return not_found(fmt::format("page secret: environment variable {} is not set", env_name));
    value = from_env;
  } else {
    return {};
  }
  if (value.size() < PageSigner::kMinSecretBytes || value.size() > PageSigner::kMaxSecretBytes) {
    const std::size_t n = value.size();
    OPENSSL_cleanse(value.data(), value.size());
    return invalid_argument(fmt::format("page secret from {} {}: {} bytes, must be {} to {}",
                                        file.empty() ? "environment variable" : "file", file.empty() ? env_name : file,
                                        n, PageSigner::kMinSecretBytes, PageSigner::kMaxSecretBytes));
  }
  secret = std::move(value);
  return {};
}

}  // namespace clm
