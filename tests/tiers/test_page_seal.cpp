// The page seal (clm/tiers/page_seal.hpp): the model digest against OpenSSL's
// one-shot SHA-256, the signer against the one-shot HMAC() on fresh random
// data, page key scopes, and the deployment secret's sources and refusals
// (never echoing the secret).
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

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

std::span<const std::byte> as_bytes(const std::vector<std::uint8_t>& v) {
  return std::as_bytes(std::span(v.data(), v.size()));
}

}  // namespace

TEST_CASE("a seal's model is the SHA-256 of the model id, and its signer is HMAC-SHA256", "[tiers][seal]") {
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

    std::vector<std::uint8_t> first(rng() % 300), second(rng() % 5000);
    for (auto& b : first) b = static_cast<std::uint8_t>(rng());
    for (auto& b : second) b = static_cast<std::uint8_t>(rng());
    clm::Digest32 mac;
    REQUIRE(seal.signer->mac(as_bytes(first), as_bytes(second), mac).ok());
    std::vector<std::uint8_t> joined = first;
    joined.insert(joined.end(), second.begin(), second.end());
    unsigned char want[32];
    unsigned int want_len = 0;
    REQUIRE(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), joined.data(), joined.size(), want,
                 &want_len) != nullptr);
    CHECK(std::memcmp(mac.data(), want, 32) == 0);
    bool matches = false;
    REQUIRE(seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(want)), matches).ok());
    CHECK(matches);
    want[rng() % 32] ^= static_cast<unsigned char>(1u << (rng() % 8));
    REQUIRE(seal.signer->verify(as_bytes(first), as_bytes(second), std::as_bytes(std::span(want)), matches).ok());
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
