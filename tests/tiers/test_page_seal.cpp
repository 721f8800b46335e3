// The page seal (clm/tiers/page_seal.hpp): the model digest against OpenSSL's
// one-shot SHA-256, the signer against GMAC written from its definition
// (bitwise GF(2^128), itself checked against a published test vector and
// OpenSSL's GMAC) on fresh random data, page key scopes, and the deployment secret's sources and refusals
// (never echoing the secret).
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/tiers/page_seal.hpp"
#include "temp_dir.hpp"
#include "test_support.hpp"

namespace {

std::string write_file(const clm_test::TempDir& dir, const std::string& name, const std::string& bytes, mode_t mode) {
  const std::string path = dir.str() + "/" + name;
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  }
  REQUIRE(::chmod(path.c_str(), mode) == 0);
  return path;
}

using Bytes = std::vector<std::uint8_t>;

std::span<const std::byte> as_bytes(const Bytes& v) { return std::as_bytes(std::span(v.data(), v.size())); }

Bytes random_bytes(std::mt19937& rng, std::size_t n) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

// One AES-256 block, by OpenSSL's ECB (AES itself is trusted; what is built on it is checked).
Bytes aes_256_block(const Bytes& key, const Bytes& block) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  Bytes out(32);
  int n = 0, tail = 0;
  const bool ok = ctx && EVP_EncryptInit_ex(ctx, EVP_aes_256_ecb(), nullptr, key.data(), nullptr) == 1 &&
                  EVP_CIPHER_CTX_set_padding(ctx, 0) == 1 &&
                  EVP_EncryptUpdate(ctx, out.data(), &n, block.data(), 16) == 1 &&
                  EVP_EncryptFinal_ex(ctx, out.data() + n, &tail) == 1;
  EVP_CIPHER_CTX_free(ctx);
  REQUIRE(ok);
  REQUIRE(n == 16);
  out.resize(16);
  return out;
}

// X * Y in GF(2^128), bit by bit as NIST SP 800-38D's Algorithm 1 says.
Bytes gf128_multiply(const Bytes& x, const Bytes& y) {
  Bytes z(16, 0), v = y;
  for (int i = 0; i < 128; ++i) {
    if ((x[i / 8] >> (7 - i % 8)) & 1) {
      for (int b = 0; b < 16; ++b) z[b] ^= v[b];
    }
    const bool lsb = v[15] & 1;
    for (int b = 15; b > 0; --b) v[b] = static_cast<std::uint8_t>((v[b] >> 1) | (v[b - 1] << 7));
    v[0] >>= 1;
    if (lsb) v[0] ^= 0xe1;
  }
  return z;
}

// GMAC (GCM with nothing to encrypt) from its definition: T = E_K(IV || 1) ^ GHASH_H(A, lengths), H = E_K(0).
Bytes reference_gmac(const Bytes& key, const Bytes& iv, const Bytes& data) {
  const Bytes h = aes_256_block(key, Bytes(16, 0));
  Bytes y(16, 0);
  auto absorb = [&](const Bytes& block) {
    for (int b = 0; b < 16; ++b) y[b] ^= block[b];
    y = gf128_multiply(y, h);
  };
  for (std::size_t at = 0; at < data.size(); at += 16) {
    Bytes block(16, 0);
    std::copy(data.begin() + at, data.begin() + std::min(data.size(), at + 16), block.begin());
    absorb(block);
  }
  Bytes lengths(16, 0);
  const std::uint64_t bits = data.size() * 8;
  for (int b = 0; b < 8; ++b) lengths[7 - b] = static_cast<std::uint8_t>(bits >> (8 * b));
  absorb(lengths);
  Bytes j0 = iv;
  j0.insert(j0.end(), {0, 0, 0, 1});
  const Bytes mask = aes_256_block(key, j0);
  for (int b = 0; b < 16; ++b) y[b] ^= mask[b];
  return y;
}

// OpenSSL's GMAC through EVP_MAC.
Bytes openssl_gmac(const Bytes& key, const Bytes& iv, const Bytes& data) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "GMAC", nullptr);
  REQUIRE(mac != nullptr);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char cipher[] = "AES-256-GCM";
  Bytes iv_copy = iv;
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("cipher", cipher, 0),
                               OSSL_PARAM_construct_octet_string("iv", iv_copy.data(), iv_copy.size()),
                               OSSL_PARAM_construct_end()};
  Bytes out(16);
  std::size_t n = 0;
  const bool ok = ctx && EVP_MAC_init(ctx, key.data(), key.size(), params) == 1 &&
                  EVP_MAC_update(ctx, data.data(), data.size()) == 1 &&
                  EVP_MAC_final(ctx, out.data(), &n, out.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  REQUIRE(ok);
  REQUIRE(n == 16);
  return out;
}

}  // namespace

TEST_CASE("the GMAC reference meets the published test vector and OpenSSL's own GMAC", "[tiers][seal]") {
  // McGrew and Viega's GCM test case 13: AES-256, zero key and IV, nothing to authenticate.
  const Bytes zero_key(32, 0), zero_iv(12, 0);
  const Bytes want = {0x53, 0x0f, 0x8a, 0xfb, 0xc7, 0x45, 0x36, 0xb9, 0xa9, 0x63, 0xb4, 0xf1, 0xc4, 0xcb, 0x73, 0x8b};
  CHECK(reference_gmac(zero_key, zero_iv, {}) == want);
  // Non-empty data, against OpenSSL's GMAC (EVP_MAC), a path the signer does not take.
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const Bytes key = random_bytes(rng, 32), iv = random_bytes(rng, 12), data = random_bytes(rng, rng() % 700);
    CHECK(reference_gmac(key, iv, data) == openssl_gmac(key, iv, data));
  }
}

TEST_CASE("a seal's model is the SHA-256 of the model id, and its signer GMAC under a key per nonce", "[tiers][seal]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    std::string model(1 + rng() % 200, '\0');
    for (char& c : model) c = static_cast<char>(rng());  // any bytes
    std::string secret(16 + rng() % 100, '\0');
    for (char& c : secret) c = static_cast<char>(rng());
    clm::PageSeal seal;
    REQUIRE(clm::PageSeal::create(model, secret, seal).ok());
    unsigned char digest[32];
    unsigned int digest_len = 0;
    REQUIRE(EVP_Digest(model.data(), model.size(), digest, &digest_len, EVP_sha256(), nullptr) == 1);
    CHECK(std::memcmp(seal.model.data(), digest, 32) == 0);
    REQUIRE(seal.signer != nullptr);

    const Bytes first = random_bytes(rng, rng() % 300), second = random_bytes(rng, rng() % 5000);
    clm::PageSignature signature{}, again{};
    REQUIRE(seal.signer->sign(as_bytes(first), as_bytes(second), signature).ok());
    REQUIRE(seal.signer->sign(as_bytes(first), as_bytes(second), again).ok());
    CHECK(std::memcmp(signature.data(), again.data(), clm::kPageNonceBytes) != 0);  // a fresh nonce each time

    // By hand: K = HMAC-SHA256(secret, label); the page key = AES_K(le32(0) || N) || AES_K(le32(1) || N).
    const std::string label = "clmcache page mac v1";
    unsigned char derive_key[32];
    unsigned int derive_len = 0;
    REQUIRE(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                 reinterpret_cast<const unsigned char*>(label.data()), label.size(), derive_key,
                 &derive_len) != nullptr);
    const Bytes nonce(signature.begin(), signature.begin() + clm::kPageNonceBytes);
    Bytes page_key;
    for (std::uint8_t i = 0; i < 2; ++i) {
      Bytes block(16, 0);
      block[0] = i;
      std::copy(nonce.begin(), nonce.end(), block.begin() + 4);
      const Bytes out = aes_256_block(Bytes(derive_key, derive_key + 32), block);
      page_key.insert(page_key.end(), out.begin(), out.end());
    }
    Bytes joined = first;
    joined.insert(joined.end(), second.begin(), second.end());
    const Bytes want = reference_gmac(page_key, nonce, joined);
    CHECK(Bytes(signature.begin() + clm::kPageNonceBytes, signature.end()) == want);

    bool matches = false;
    REQUIRE(seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(signature)), matches).ok());
    CHECK(matches);
    REQUIRE(seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(again)), matches).ok());
    CHECK(matches);
    clm::PageSignature flipped = signature;
    flipped[rng() % flipped.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));  // nonce or tag
    REQUIRE(seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(flipped)), matches).ok());
    CHECK_FALSE(matches);
    REQUIRE(
        seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(signature)).first(27), matches)
            .ok());
    CHECK_FALSE(matches);  // a short signature never matches
    if (!second.empty()) {
      Bytes changed = second;
      changed[rng() % changed.size()] ^= 1;
      REQUIRE(
          seal.signer->verify(as_bytes(first), as_bytes(changed), std::as_bytes(std::span(signature)), matches).ok());
      CHECK_FALSE(matches);
    }
    // Another secret's signer never accepts it.
    std::string other_secret = secret;
    other_secret[rng() % other_secret.size()] ^= 1;
    clm::PageSeal other;
    REQUIRE(clm::PageSeal::create(model, other_secret, other).ok());
    REQUIRE(other.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(signature)), matches).ok());
    CHECK_FALSE(matches);
  }
}

TEST_CASE("key scopes: one per model and secret, the same in every instance", "[tiers][seal]") {
  auto scope = [](const std::string& model, const std::string& secret) {
    clm::PageSeal seal;
    REQUIRE(clm::PageSeal::create(model, secret, seal).ok());
    return seal.key_scope();
  };
  const std::string s1 = "first deployment secret", s2 = "second deployment secret";
  const clm::Digest32 scopes[] = {scope("a", ""), scope("b", ""), scope("a", s1), scope("a", s2), scope("b", s1)};
  for (std::size_t i = 0; i < std::size(scopes); ++i) {
    for (std::size_t j = i + 1; j < std::size(scopes); ++j) CHECK(scopes[i] != scopes[j]);
  }
  CHECK(scope("a", s1) == scopes[2]);  // deterministic: two instances with one secret share pages
  CHECK(scope("a", "") == scopes[0]);
}

TEST_CASE("PageSeal refuses an empty or oversized model id and a secret of the wrong length", "[tiers][seal]") {
  clm::PageSeal seal;
  CHECK(clm::PageSeal::create("", "", seal).code() == clm::StatusCode::invalid_argument);
  CHECK(clm::PageSeal::create(std::string(4097, 'm'), "", seal).code() == clm::StatusCode::invalid_argument);
  CHECK(clm::PageSeal::create(std::string(4096, 'm'), "", seal).ok());
  const clm::Status short_secret = clm::PageSeal::create("m", "fifteen bytes!!", seal);
  CHECK(short_secret.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(short_secret.message(), !Catch::Contains("fifteen"));
  CHECK(clm::PageSeal::create("m", std::string(4097, 's'), seal).code() == clm::StatusCode::invalid_argument);
  CHECK(clm::PageSeal::create("m", std::string(16, 's'), seal).ok());
}

TEST_CASE("the page secret comes from a private file or an environment variable, never echoed", "[tiers][seal]") {
  clm_test::TempDir dir("seal");
  const std::string secret = "s3cret-of-the-deployment-0123456789";
  std::string got;

  const std::string good = write_file(dir, "good.key", secret + "\n", 0600);
  REQUIRE(clm::load_page_secret(good, "", got).ok());
  CHECK(got == secret);  // one trailing newline dropped
  const std::string crlf = write_file(dir, "crlf.key", secret + "\r\n", 0640);
  REQUIRE(clm::load_page_secret(crlf, "", got).ok());
  CHECK(got == secret);

  struct Refusal {
    std::string file, env;
    clm::StatusCode code;
    const char* names;
  };
  const std::string open_file = write_file(dir, "open.key", secret, 0644);
  const std::string short_file = write_file(dir, "short.key", "s3cret-short", 0600);
  ::unsetenv("CLM_TEST_PAGE_SECRET_UNSET");
  const Refusal refusals[] = {
      {open_file, "", clm::StatusCode::failed_precondition, "readable by everyone"},
      {dir.str() + "/missing.key", "", clm::StatusCode::not_found, "missing.key"},
      {dir.str(), "", clm::StatusCode::failed_precondition, "not a file"},
      {short_file, "", clm::StatusCode::invalid_argument, "short.key"},
      {good, "CLM_TEST_PAGE_SECRET", clm::StatusCode::invalid_argument, "both"},
      {"", "CLM_TEST_PAGE_SECRET_UNSET", clm::StatusCode::not_found, "CLM_TEST_PAGE_SECRET_UNSET"},
  };
  for (const Refusal& r : refusals) {
    got = "untouched";
    const clm::Status s = clm::load_page_secret(r.file, r.env, got);
    INFO(r.file << " / " << r.env << ": " << s.message());
    CHECK(s.code() == r.code);
    CHECK_THAT(s.message(), Catch::Contains(r.names));
    CHECK_THAT(s.message(), !Catch::Contains("s3cret"));
    CHECK(got.empty());
  }

  ::setenv("CLM_TEST_PAGE_SECRET", secret.c_str(), 1);
  REQUIRE(clm::load_page_secret("", "CLM_TEST_PAGE_SECRET", got).ok());
  CHECK(got == secret);
  ::setenv("CLM_TEST_PAGE_SECRET", "s3cret", 1);
  const clm::Status short_env = clm::load_page_secret("", "CLM_TEST_PAGE_SECRET", got);
  CHECK(short_env.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(short_env.message(), !Catch::Contains("s3cret"));
  ::unsetenv("CLM_TEST_PAGE_SECRET");
  REQUIRE(clm::load_page_secret("", "", got).ok());  // neither: no signing
  CHECK(got.empty());
}
