// Page keys (clm/tiers/page_key.hpp) against an independent reference: the
// hashed bytes are built here by hand from the header's description and
// hashed with OpenSSL's one-shot SHA256() (the library goes through EVP), and
// one chain is pinned to digests computed outside C++ (Python's hashlib).
#include <openssl/sha.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/tiers/page_key.hpp"
#include "test_support.hpp"

namespace {

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  out.push_back(static_cast<unsigned char>(v & 0xFF));
  out.push_back(static_cast<unsigned char>((v >> 8) & 0xFF));
  out.push_back(static_cast<unsigned char>((v >> 16) & 0xFF));
  out.push_back(static_cast<unsigned char>((v >> 24) & 0xFF));
}

// The key as the header defines it, byte by byte.
clm::PageKey reference_key(const clm::PageKey& parent, const std::vector<std::int32_t>& page, const std::string& salt,
                           std::int32_t adapter, const clm::Digest32& scope) {
  std::vector<unsigned char> msg(parent.bytes.begin(), parent.bytes.end());
  put_u32(msg, static_cast<std::uint32_t>(page.size()));
  for (std::int32_t t : page) put_u32(msg, static_cast<std::uint32_t>(t));
  put_u32(msg, static_cast<std::uint32_t>(salt.size()));
  msg.insert(msg.end(), salt.begin(), salt.end());
  put_u32(msg, static_cast<std::uint32_t>(adapter));
  msg.insert(msg.end(), scope.begin(), scope.end());
  clm::PageKey key;
  SHA256(msg.data(), msg.size(), key.bytes.data());
  return key;
}

std::string reference_hex(const clm::PageKey& key) {
  std::string out;
  char buf[3];
  for (std::uint8_t b : key.bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

std::vector<clm::PageKey> chain(const std::vector<std::int32_t>& tokens, std::int32_t page_size, std::size_t pages,
                                const std::string& salt, std::int32_t adapter,
                                const clm::PageKey& parent = clm::PageKey::root(), const clm::Digest32& scope = {}) {
  std::vector<clm::PageKey> keys(pages);
  const clm::Status s =
      clm::chain_page_keys(parent, tokens, page_size, {.salt = salt, .adapter_id = adapter, .scope = scope}, keys);
  INFO(s.message());
  REQUIRE(s.ok());
  return keys;
}

}  // namespace

TEST_CASE("chain_page_keys equals SHA-256 of the documented bytes, page after page", "[tiers][page_key]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(std::numeric_limits<std::int32_t>::min(),
                                                    std::numeric_limits<std::int32_t>::max());
  for (int trial = 0; trial < 200; ++trial) {
    const std::int32_t page_size = std::uniform_int_distribution<std::int32_t>(1, 64)(rng);
    const std::size_t pages = std::uniform_int_distribution<std::size_t>(0, 8)(rng);
    const std::size_t extra = std::uniform_int_distribution<std::size_t>(0, static_cast<std::size_t>(page_size))(rng);
    std::vector<std::int32_t> tokens(pages * static_cast<std::size_t>(page_size) + extra);
    for (auto& t : tokens) t = token(rng);
    std::string salt(std::uniform_int_distribution<std::size_t>(0, 40)(rng), '\0');
    for (char& c : salt) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));  // any bytes, NUL too
    const std::int32_t adapter = token(rng);
    clm::PageKey parent;
    for (auto& b : parent.bytes) b = static_cast<std::uint8_t>(rng());
    if (trial % 3 == 0) parent = clm::PageKey::root();
    clm::Digest32 scope{};
    if (trial % 2 == 0) {
      for (auto& b : scope) b = static_cast<std::uint8_t>(rng());
    }

    const std::vector<clm::PageKey> keys = chain(tokens, page_size, pages, salt, adapter, parent, scope);
    clm::PageKey prev = parent;
    for (std::size_t p = 0; p < pages; ++p) {
      const std::vector<std::int32_t> page(tokens.begin() + static_cast<std::ptrdiff_t>(p) * page_size,
                                           tokens.begin() + static_cast<std::ptrdiff_t>(p + 1) * page_size);
      const clm::PageKey want = reference_key(prev, page, salt, adapter, scope);
      INFO("trial " << trial << " page " << p);
      REQUIRE(keys[p] == want);
      REQUIRE(keys[p].hex() == reference_hex(want));
      REQUIRE(clm::next_page_key(prev, page, {.salt = salt, .adapter_id = adapter, .scope = scope}) == want);
      prev = want;
    }
  }
}

TEST_CASE("a chain pinned to digests computed outside C++", "[tiers][page_key]") {
  // Python: k1 = sha256(bytes(32) + pack('<I', 4) + pack('<4i', 1, 2, 3, -4)
  //                     + pack('<I', 8) + b'tenant-7' + pack('<i', 3) + bytes(32)); k2 likewise over k1 and 5..8;
  // k1s with the scope bytes(range(32)) instead of bytes(32).
  const std::vector<std::int32_t> tokens = {1, 2, 3, -4, 5, 6, 7, 8};
  const auto keys = chain(tokens, 4, 2, "tenant-7", 3);
  CHECK(keys[0].hex() == "9156d1d85584ad2111abacca7574352c15f634773f252b6bd8182604462786c2");
  CHECK(keys[1].hex() == "a670ca34e295478651bafad2954e39bbbb5fb8dcc78d584980ad5f855a1feb3a");
  clm::Digest32 scope;
  for (std::size_t i = 0; i < scope.size(); ++i) scope[i] = static_cast<std::uint8_t>(i);
  const auto scoped = chain(tokens, 4, 1, "tenant-7", 3, clm::PageKey::root(), scope);
  CHECK(scoped[0].hex() == "5a483aafd92b77f2d27b13a3084ad396ca16d3165736ac046f83d0d66b95fad0");
  CHECK(clm::PageKey::root().hex() == std::string(64, '0'));
}

TEST_CASE("a page's key depends on every earlier page, the salt, the adapter and the scope", "[tiers][page_key]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr std::int32_t kPage = 16;
  std::vector<std::int32_t> tokens(3 * kPage);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % 50000);
  const auto base = chain(tokens, kPage, 3, "tenant", 0);
  REQUIRE(base[0] != base[1]);
  REQUIRE(base[1] != base[2]);

  // One token of page 1 changed: every key from page 1 on changes, though pages 2 and 3 are the same.
  for (int trial = 0; trial < 20; ++trial) {
    auto changed = tokens;
    const auto at = static_cast<std::size_t>(rng() % kPage);
    changed[at] += 1 + static_cast<std::int32_t>(rng() % 100);
    const auto keys = chain(changed, kPage, 3, "tenant", 0);
    CHECK(keys[0] != base[0]);
    CHECK(keys[1] != base[1]);
    CHECK(keys[2] != base[2]);
  }
  // A change in page 3 leaves pages 1 and 2 alone.
  auto late = tokens;
  late[2 * kPage + 5] ^= 1;
  const auto late_keys = chain(late, kPage, 3, "tenant", 0);
  CHECK(late_keys[0] == base[0]);
  CHECK(late_keys[1] == base[1]);
  CHECK(late_keys[2] != base[2]);

  // Salt and adapter: each variant gives keys of its own, on every page.
  const std::vector<std::pair<std::string, std::int32_t>> namespaces = {
      {"", 0}, {"a", 0}, {"ab", 0}, {"b", 0}, {"tenant", 1}, {"tenant", -1}, {"tenant", 2}, {"tenant ", 0}};
  std::vector<std::vector<clm::PageKey>> all = {base};
  for (const auto& [salt, adapter] : namespaces) all.push_back(chain(tokens, kPage, 3, salt, adapter));
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      for (std::size_t p = 0; p < 3; ++p) {
        INFO("namespaces " << i << " and " << j << ", page " << p);
        CHECK(all[i][p] != all[j][p]);
      }
    }
  }
  // The scope (model and secret, page_seal.hpp): two models, or a secret and none, never share a page.
  clm::PageSeal model_a, model_b, model_a_signed;
  REQUIRE(clm::PageSeal::create("model-a", "", model_a).ok());
  REQUIRE(clm::PageSeal::create("model-b", "", model_b).ok());
  REQUIRE(clm::PageSeal::create("model-a", "a deployment secret of some length", model_a_signed).ok());
  const auto a = chain(tokens, kPage, 3, "tenant", 0, clm::PageKey::root(), model_a.key_scope());
  const auto b = chain(tokens, kPage, 3, "tenant", 0, clm::PageKey::root(), model_b.key_scope());
  const auto a_signed = chain(tokens, kPage, 3, "tenant", 0, clm::PageKey::root(), model_a_signed.key_scope());
  for (std::size_t p = 0; p < 3; ++p) {
    CHECK(a[p] != b[p]);
    CHECK(a[p] != a_signed[p]);
    CHECK(a[p] != base[p]);
  }
  CHECK(chain(tokens, kPage, 3, "tenant", 0, clm::PageKey::root(), model_a.key_scope()) == a);
  // Deterministic: the same input twice gives the same keys.
  CHECK(chain(tokens, kPage, 3, "tenant", 0) == base);
}

TEST_CASE("bad input is refused and leaves the output untouched", "[tiers][page_key]") {
  const std::vector<std::int32_t> tokens(40, 7);
  clm::PageKey sentinel;
  sentinel.bytes.fill(0xAB);
  auto refused = [&](std::span<const std::int32_t> t, std::int32_t page_size, std::size_t pages) {
    std::vector<clm::PageKey> out(pages, sentinel);
    const clm::Status s = clm::chain_page_keys(clm::PageKey::root(), t, page_size, {.salt = "s"}, out);
    INFO(s.message());
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK_FALSE(s.message().empty());
    for (const auto& k : out) CHECK(k == sentinel);
  };
  refused(tokens, 16, 3);          // 48 tokens needed, 40 given
  refused(tokens, 41, 1);          // one page longer than the tokens
  refused(tokens, 0, 1);           // page_size 0
  refused(tokens, -16, 1);         // negative page_size
  refused({}, 1, 1);               // no tokens at all
  refused(tokens, 0, 0);           // page_size 0 even for no pages
  std::vector<clm::PageKey> none;  // nothing asked: fine
  CHECK(clm::chain_page_keys(clm::PageKey::root(), tokens, 16, {}, none).ok());
  std::vector<clm::PageKey> two(2);  // exactly enough tokens: fine
  CHECK(clm::chain_page_keys(clm::PageKey::root(), tokens, 20, {}, two).ok());
}
