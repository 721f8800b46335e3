// The stored page format (clm/tiers/page_file.hpp) and its checksum
// (clm/detail/fast_checksum.hpp): round trips on random pages, signed and
// not, every header bit flip, sampled payload bit flips, every truncation,
// foreign keys, layouts and models, unsigned and forged pages, all refused;
// the header's documented offsets read back by hand, the signature's place
// and tag; the checksum against a plain byte-wise reference
// and published xxHash64 digests.
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/detail/fast_checksum.hpp"
#include "clm/tiers/page_file.hpp"
#include "test_support.hpp"

namespace {

// xxHash64 as its specification reads, one byte at a time: a different path
// from the library's word loads and pointer walk.
std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
std::uint64_t read_bytes(const std::vector<std::uint8_t>& v, std::size_t at, int n) {
  std::uint64_t out = 0;
  for (int k = n - 1; k >= 0; --k) out = (out << 8) | v[at + static_cast<std::size_t>(k)];
  return out;
}
std::uint64_t reference_xxh64(const std::vector<std::uint8_t>& v, std::uint64_t seed) {
  const std::uint64_t p1 = 11400714785074694791ull, p2 = 14029467366897019727ull, p3 = 1609587929392839161ull,
                      p4 = 9650029242287828579ull, p5 = 2870177450012600261ull;
  auto round = [&](std::uint64_t acc, std::uint64_t lane) { return rotl(acc + lane * p2, 31) * p1; };
  const std::size_t n = v.size();
  std::size_t i = 0;
  std::uint64_t h = 0;
  if (n >= 32) {
    std::uint64_t acc[4] = {seed + p1 + p2, seed + p2, seed, seed - p1};
    while (i + 32 <= n) {
      for (int lane = 0; lane < 4; ++lane) acc[lane] = round(acc[lane], read_bytes(v, i + 8 * lane, 8));
      i += 32;
    }
    h = rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18);
    for (int lane = 0; lane < 4; ++lane) h = (h ^ round(0, acc[lane])) * p1 + p4;
  } else {
    h = seed + p5;
  }
  h += n;
  while (i + 8 <= n) {
    h = rotl(h ^ round(0, read_bytes(v, i, 8)), 27) * p1 + p4;
    i += 8;
  }
  if (i + 4 <= n) {
    h = rotl(h ^ (read_bytes(v, i, 4) * p1), 23) * p2 + p3;
    i += 4;
  }
  while (i < n) h = rotl(h ^ (v[i++] * p5), 11) * p1;
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  h *= p3;
  h ^= h >> 32;
  return h;
}

std::uint64_t checksum_of(const std::string& s, std::uint64_t seed = 0) {
  return clm::detail::fast_checksum(s.data(), s.size(), seed);
}

std::uint64_t read_le(const std::vector<std::byte>& v, std::size_t at, int n) {
  std::uint64_t out = 0;
  for (int k = 0; k < n; ++k) out |= static_cast<std::uint64_t>(v[at + static_cast<std::size_t>(k)]) << (8 * k);
  return out;
}

clm::PageLayout random_layout(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng); };
  return {pick(1, 8), pick(1, 3), pick(1, 4), pick(1, 16), static_cast<clm::KvDType>(pick(0, 2))};
}

clm::PageKey random_key(std::mt19937& rng) {
  clm::PageKey k;
  for (auto& b : k.bytes) b = static_cast<std::uint8_t>(rng());
  return k;
}

std::vector<std::byte> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

constexpr const char* kSecret = "a deployment secret, 32 bytes ok";

clm::PageSeal make_seal(const std::string& model, const std::string& secret = "") {
  clm::PageSeal seal;
  const clm::Status s = clm::PageSeal::create(model, secret, seal);
  INFO(s.message());
  REQUIRE(s.ok());
  return seal;
}

const clm::PageSeal& plain_seal() {
  static const clm::PageSeal seal = make_seal("model-a");
  return seal;
}

// header + payload, as a backend stores it.
std::vector<std::byte> stored_value(const clm::PageKey& key, const clm::PageLayout& layout,
                                    const std::vector<std::byte>& payload, const clm::PageSeal& seal = plain_seal()) {
  clm::PageHeaderBytes header;
  REQUIRE(clm::encode_page_header(key, layout, seal, payload, header).ok());
  std::vector<std::byte> value(header.size() + payload.size());
  std::memcpy(value.data(), header.data(), header.size());
  if (!payload.empty()) std::memcpy(value.data() + header.size(), payload.data(), payload.size());
  return value;
}

clm::Status decode(const std::vector<std::byte>& value, const clm::PageKey& key, const clm::PageLayout& layout,
                   const clm::PageSeal& seal = plain_seal(), clm::PageFault* fault_out = nullptr) {
  std::span<const std::byte> payload;
  clm::PageFault fault = clm::PageFault::none;
  const clm::Status s = clm::decode_page(value, key, layout, seal, payload, fault);
  if (!s.ok()) REQUIRE(payload.data() == nullptr);  // untouched on refusal
  REQUIRE(s.ok() == (fault == clm::PageFault::none));
  if (fault_out) *fault_out = fault;
  return s;
}

// The checksum a writer without the secret can always recompute.
void rewrite_checksum(std::vector<std::byte>& value) {
  const std::uint64_t head = clm::detail::fast_checksum(value.data(), 144);
  const std::uint64_t sum = clm::detail::fast_checksum(value.data() + 152, value.size() - 152, head);
  for (int b = 0; b < 8; ++b) value[144 + static_cast<std::size_t>(b)] = static_cast<std::byte>(sum >> (8 * b));
}

}  // namespace

TEST_CASE("fast_checksum is xxHash64: published digests", "[tiers][checksum]") {
  std::string abc999, abcd1000;
  for (int i = 0; i < 999; ++i) abc999 += "abc";
  for (int i = 0; i < 1000; ++i) abcd1000 += "abcd";
  CHECK(checksum_of("") == 0xEF46DB3751D8E999ull);
  CHECK(checksum_of("a") == 0xD24EC4F1A98C6E5Bull);
  CHECK(checksum_of("abc") == 0x44BC2CF5AD770999ull);
  CHECK(checksum_of(abc999) == 0x933EB85613976467ull);
  CHECK(checksum_of(abcd1000) == 0x205219D38E8898BCull);
}

TEST_CASE("fast_checksum equals a plain byte-wise reference on every length and alignment", "[tiers][checksum]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> pool(1100);
  for (int trial = 0; trial < 3000; ++trial) {
    for (auto& b : pool) b = static_cast<std::uint8_t>(rng());
    // Every length 0..1000 once, then random ones; every alignment 0..15.
    const std::size_t length = trial <= 1000 ? static_cast<std::size_t>(trial) : rng() % 1001;
    const std::size_t offset = rng() % 16;
    const std::uint64_t hash_seed = trial % 4 == 0 ? 0 : rng();
    const std::vector<std::uint8_t> data(pool.begin() + static_cast<std::ptrdiff_t>(offset),
                                         pool.begin() + static_cast<std::ptrdiff_t>(offset + length));
    INFO("length " << length << " offset " << offset << " seed " << hash_seed);
    REQUIRE(clm::detail::fast_checksum(pool.data() + offset, length, hash_seed) == reference_xxh64(data, hash_seed));
  }
}

TEST_CASE("a page round-trips, and its header holds what the format says where it says", "[tiers][page_file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::PageSeal signing = make_seal("model-a", kSecret);
  for (int trial = 0; trial < 100; ++trial) {
    const bool is_signed = trial % 2 == 1;
    const clm::PageSeal& seal = is_signed ? signing : plain_seal();
    const clm::PageLayout layout = random_layout(rng);
    REQUIRE(clm::check_page_layout(layout).ok());
    const clm::PageKey key = random_key(rng);
    const std::vector<std::byte> payload = random_bytes(rng, layout.page_bytes());
    const std::vector<std::byte> value = stored_value(key, layout, payload, seal);
    REQUIRE(value.size() == 152 + layout.page_bytes());

    std::span<const std::byte> back;
    clm::PageFault fault = clm::PageFault::damaged;
    const clm::Status s = clm::decode_page(value, key, layout, seal, back, fault);
    INFO(s.message());
    REQUIRE(s.ok());
    REQUIRE(fault == clm::PageFault::none);
    REQUIRE(back.data() == value.data() + 152);  // points into the value, no copy
    REQUIRE(std::equal(back.begin(), back.end(), payload.begin(), payload.end()));

    // Offsets by hand (little-endian).
    CHECK(std::memcmp(value.data(), "CLMKVPG1", 8) == 0);
    CHECK(read_le(value, 8, 4) == 3);
    CHECK(std::memcmp(value.data() + 12, key.bytes.data(), 32) == 0);
    CHECK(read_le(value, 44, 4) == static_cast<std::uint64_t>(layout.page_size));
    CHECK(read_le(value, 48, 4) == static_cast<std::uint64_t>(layout.num_layers));
    CHECK(read_le(value, 52, 4) == static_cast<std::uint64_t>(layout.kv_heads));
    CHECK(read_le(value, 56, 4) == static_cast<std::uint64_t>(layout.head_dim));
    CHECK(read_le(value, 60, 4) == static_cast<std::uint64_t>(layout.dtype));
    CHECK(read_le(value, 64, 8) == layout.page_bytes());
    // The model: SHA-256 of its id, by OpenSSL's one-shot digest.
    unsigned char model[32];
    unsigned int model_len = 0;
    REQUIRE(EVP_Digest("model-a", 7, model, &model_len, EVP_sha256(), nullptr) == 1);
    CHECK(std::memcmp(value.data() + 72, model, 32) == 0);
    CHECK(read_le(value, 104, 4) == (is_signed ? 1u : 0u));
    CHECK(read_le(value, 108, 4) == 0);
    // The signature: a nonce, then the GMAC tag over header 0..112 || payload under the page's key (the
    // signer's tag, itself checked against GMAC from its definition in test_page_seal); zeros unsigned.
    const auto* raw = reinterpret_cast<const std::uint8_t*>(value.data());
    std::array<std::uint8_t, 16> tag{};
    if (is_signed) {
      std::array<std::uint8_t, 12> nonce{};
      std::memcpy(nonce.data(), raw + 112, 12);
      CHECK(std::any_of(nonce.begin(), nonce.end(), [](std::uint8_t b) { return b != 0; }));
      REQUIRE(seal.signer->tag(nonce, std::span(value).first(112), std::span(value).subspan(152), tag).ok());
    } else {
      CHECK(std::all_of(raw + 112, raw + 124, [](std::uint8_t b) { return b == 0; }));
    }
    CHECK(std::memcmp(raw + 124, tag.data(), 16) == 0);
    CHECK(read_le(value, 140, 4) == 0);
    // checksum = xxh64(payload, seed = xxh64(header bytes 0..144)), by the reference.
    const std::vector<std::uint8_t> head(reinterpret_cast<const std::uint8_t*>(value.data()),
                                         reinterpret_cast<const std::uint8_t*>(value.data()) + 144);
    const std::vector<std::uint8_t> body(reinterpret_cast<const std::uint8_t*>(value.data()) + 152,
                                         reinterpret_cast<const std::uint8_t*>(value.data()) + value.size());
    CHECK(read_le(value, 144, 8) == reference_xxh64(body, reference_xxh64(head, 0)));
  }
}

TEST_CASE("every header bit flip and sampled payload bit flips are refused", "[tiers][page_file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::PageLayout layout{16, 2, 4, 32, clm::KvDType::f16};
  const clm::PageKey key = random_key(rng);
  const clm::PageSeal signing = make_seal("model-a", kSecret);
  for (const clm::PageSeal* seal : {&plain_seal(), &signing}) {
    const std::vector<std::byte> value = stored_value(key, layout, random_bytes(rng, layout.page_bytes()), *seal);
    REQUIRE(decode(value, key, layout, *seal).ok());
    std::vector<std::size_t> bits;
    for (std::size_t bit = 0; bit < 152 * 8; ++bit) bits.push_back(bit);
    bits.push_back(152 * 8);               // the payload's first bit
    bits.push_back(value.size() * 8 - 1);  // and its last
    for (int i = 0; i < 3000; ++i) bits.push_back(152 * 8 + rng() % (layout.page_bytes() * 8));
    for (std::size_t bit : bits) {
      std::vector<std::byte> flipped = value;
      flipped[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      INFO("signed " << (seal->signer != nullptr) << " bit " << bit);
      const clm::Status s = decode(flipped, key, layout, *seal);
      REQUIRE(s.code() == clm::StatusCode::invalid_argument);
    }
  }
}

TEST_CASE("every truncation and an extension are refused", "[tiers][page_file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::PageLayout layout{4, 1, 2, 8, clm::KvDType::bf16};
  const clm::PageKey key = random_key(rng);
  const std::vector<std::byte> value = stored_value(key, layout, random_bytes(rng, layout.page_bytes()));
  for (std::size_t n = 0; n < value.size(); ++n) {
    // A copy of exactly n bytes, so ASan sees any read past the end.
    const std::vector<std::byte> cut(value.begin(), value.begin() + static_cast<std::ptrdiff_t>(n));
    INFO("length " << n);
    REQUIRE(decode(cut, key, layout).code() == clm::StatusCode::invalid_argument);
  }
  std::vector<std::byte> longer = value;
  longer.push_back(std::byte{0});
  CHECK(decode(longer, key, layout).code() == clm::StatusCode::invalid_argument);
}

TEST_CASE("a page of another key or layout is refused, naming what differs", "[tiers][page_file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::PageLayout layout{8, 2, 2, 16, clm::KvDType::f16};
  const clm::PageKey key = random_key(rng);
  const std::vector<std::byte> value = stored_value(key, layout, random_bytes(rng, layout.page_bytes()));

  clm::PageKey other = key;
  other.bytes[31] ^= 1;
  const clm::Status wrong_key = decode(value, other, layout);
  CHECK(wrong_key.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(wrong_key.message(), Catch::Contains("key"));

  struct Variant {
    clm::PageLayout layout;
    const char* field;
  };
  const Variant variants[] = {
      {{16, 2, 2, 16, clm::KvDType::f16}, "page_size"}, {{8, 3, 2, 16, clm::KvDType::f16}, "num_layers"},
      {{8, 2, 1, 16, clm::KvDType::f16}, "kv_heads"},   {{8, 2, 2, 8, clm::KvDType::f16}, "head_dim"},
      {{8, 2, 2, 16, clm::KvDType::bf16}, "dtype"},     {{8, 2, 2, 16, clm::KvDType::f32}, "dtype"},
      {{4, 2, 2, 32, clm::KvDType::f16}, "page_size"},  // same page_bytes, other shape
  };
  for (const Variant& v : variants) {
    const clm::Status s = decode(value, key, v.layout);
    INFO(v.field << ": " << s.message());
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK_THAT(s.message(), Catch::Contains(v.field));
  }
  // A value that is all zeros, or random, of the right size: bad magic.
  const std::vector<std::byte> zeros(value.size());
  CHECK_THAT(decode(zeros, key, layout).message(), Catch::Contains("magic"));
  for (int i = 0; i < 200; ++i) {
    const std::vector<std::byte> junk = random_bytes(rng, rng() % (value.size() + 100));
    CHECK(decode(junk, key, layout).code() == clm::StatusCode::invalid_argument);
  }
}

TEST_CASE("another model's page, an unsigned page and a forged one are refused, each with its fault",
          "[tiers][page_file]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::PageLayout layout{4, 2, 2, 16, clm::KvDType::bf16};
  const clm::PageKey key = random_key(rng);
  const std::vector<std::byte> payload = random_bytes(rng, layout.page_bytes());
  const clm::PageSeal model_a = make_seal("model-a"), model_b = make_seal("model-b");
  const clm::PageSeal a_signed = make_seal("model-a", kSecret);
  const clm::PageSeal a_other_secret = make_seal("model-a", "another secret of the same size");
  auto fault_of = [&](const std::vector<std::byte>& value, const clm::PageSeal& reader) {
    clm::PageFault fault = clm::PageFault::none;
    const clm::Status s = decode(value, key, layout, reader, &fault);
    INFO(s.message());
    CHECK(s.code() == (fault == clm::PageFault::none ? clm::StatusCode::ok : clm::StatusCode::invalid_argument));
    return fault;
  };
  const std::vector<std::byte> plain = stored_value(key, layout, payload, model_a);
  const std::vector<std::byte> sealed = stored_value(key, layout, payload, a_signed);
  CHECK(fault_of(plain, model_a) == clm::PageFault::none);
  CHECK(fault_of(sealed, a_signed) == clm::PageFault::none);
  CHECK(fault_of(plain, model_b) == clm::PageFault::foreign_model);  // same key, layout and bytes: another model
  CHECK(fault_of(sealed, model_b) == clm::PageFault::foreign_model);
  CHECK(fault_of(plain, a_signed) == clm::PageFault::unsigned_page);  // signing required
  CHECK(fault_of(sealed, model_a) == clm::PageFault::forged);         // no secret to check it with
  CHECK(fault_of(sealed, a_other_secret) == clm::PageFault::forged);  // another deployment's secret

  // A writer without the secret: it changes the payload (or the model) and
  // recomputes the public checksum; the signature gives it away.
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::byte> forged = sealed;
    const std::size_t at = 152 + rng() % layout.page_bytes();
    forged[at] ^= static_cast<std::byte>(1 + rng() % 255);
    rewrite_checksum(forged);
    CHECK(fault_of(forged, a_signed) == clm::PageFault::forged);
  }
  // ... or drops the signature: unsigned, where the reader requires one.
  std::vector<std::byte> stripped = sealed;
  std::memset(stripped.data() + 104, 0, 4);
  std::memset(stripped.data() + 112, 0, 32);
  rewrite_checksum(stripped);
  CHECK(fault_of(stripped, a_signed) == clm::PageFault::unsigned_page);
  CHECK(fault_of(stripped, model_a) == clm::PageFault::none);  // which is a valid unsigned page, for unsigned readers
  // ... or copies another page's signature onto its bytes.
  const std::vector<std::byte> other = stored_value(key, layout, random_bytes(rng, layout.page_bytes()), a_signed);
  std::vector<std::byte> spliced = other;
  std::memcpy(spliced.data() + 112, sealed.data() + 112, 32);
  rewrite_checksum(spliced);
  CHECK(fault_of(spliced, a_signed) == clm::PageFault::forged);
  // A format-1 page (before models) is refused and named.
  std::vector<std::byte> old = plain;
  old[8] = std::byte{1};
  rewrite_checksum(old);
  clm::PageFault fault = clm::PageFault::none;
  const clm::Status s = decode(old, key, layout, model_a, &fault);
  CHECK(fault == clm::PageFault::damaged);
  CHECK_THAT(s.message(), Catch::Contains("format 1"));
  // So is a format-2 page (signed with HMAC-SHA256, before per-page GMAC keys).
  std::vector<std::byte> format2 = sealed;
  format2[8] = std::byte{2};
  rewrite_checksum(format2);
  const clm::Status s2 = decode(format2, key, layout, a_signed, &fault);
  CHECK(fault == clm::PageFault::damaged);
  CHECK_THAT(s2.message(), Catch::Contains("format 2"));
  // A signed page whose reserved bytes after the tag were set (outside what the tag covers) is refused too.
  std::vector<std::byte> reserved = sealed;
  reserved[141] = std::byte{1};
  rewrite_checksum(reserved);
  CHECK(fault_of(reserved, a_signed) == clm::PageFault::damaged);
}

TEST_CASE("check_page_layout refuses layouts no page can have", "[tiers][page_file]") {
  const clm::PageLayout good{16, 32, 8, 128, clm::KvDType::f16};
  CHECK(clm::check_page_layout(good).ok());
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  const clm::PageLayout bad[] = {
      {0, 32, 8, 128, clm::KvDType::f16},
      {16, 0, 8, 128, clm::KvDType::f16},
      {16, 32, -1, 128, clm::KvDType::f16},
      {16, 32, 8, 0, clm::KvDType::f16},
      {16, 32, 8, 128, static_cast<clm::KvDType>(7)},
      {big, big, big, big, clm::KvDType::f32},  // page_bytes() would overflow
      {1024, 64, 64, 256, clm::KvDType::f32},   // 8 GiB pages
  };
  for (const auto& layout : bad) {
    const clm::Status s = clm::check_page_layout(layout);
    INFO(s.message());
    CHECK(s.code() == clm::StatusCode::invalid_argument);
  }
}
