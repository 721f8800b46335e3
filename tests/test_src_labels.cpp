// Tests of the repeated-suffix labels (include/clm/model/src_labels.hpp) against a
// naive O(L^2 n) reference, on fresh random streams (seed printed on failure).
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "clm/model/src_labels.hpp"

namespace {

// The definition, literally: compare the n-gram ending at i with the one
// ending at every earlier j.
std::vector<std::uint8_t> naive_labels(const std::vector<std::int32_t>& t, const std::vector<std::uint8_t>& gen,
                                       int n) {
  const auto nn = static_cast<std::size_t>(n);
  std::vector<std::uint8_t> out(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (!gen[i]) {
      out[i] = clm::kLabelNotScored;
      continue;
    }
    out[i] = 0;
    if (i + 1 < nn) continue;
    for (std::size_t j = nn - 1; j < i && out[i] == 0; ++j) {
      bool same = true;
      for (std::size_t k = 0; k < nn && same; ++k) same = t[i - k] == t[j - k];
      if (same) out[i] = 1;
    }
  }
  return out;
}

struct Conversation {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> generated;
};

// Alternating prompt / generated turns over a small vocabulary, so repeats
// happen at every n tried; ids may be negative or large (the hash must cope).
Conversation random_conversation(std::size_t length, std::int32_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> pick(0, vocab - 1);
  std::uniform_int_distribution<std::size_t> turn(1, 12);
  const std::int32_t offset = std::uniform_int_distribution<std::int32_t>(-2, 1)(rng) * 1000000000;
  Conversation c;
  std::uint8_t gen = std::bernoulli_distribution(0.5)(rng) ? 1 : 0;
  while (c.tokens.size() < length) {
    const std::size_t len = std::min(turn(rng), length - c.tokens.size());
    for (std::size_t k = 0; k < len; ++k) {
      c.tokens.push_back(offset + pick(rng));
      c.generated.push_back(gen);
    }
    gen = static_cast<std::uint8_t>(1 - gen);
  }
  return c;
}

std::vector<std::uint8_t> label(const Conversation& c, int n) {
  std::vector<std::uint8_t> out(c.tokens.size(), 77);
  const clm::Status s = clm::label_repeated_suffixes(c.tokens, c.generated, n, out);
  INFO(s.message());
  REQUIRE(s.ok());
  return out;
}

}  // namespace

TEST_CASE("repeated-suffix labels match the naive definition") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::size_t ones = 0, zeros = 0;
  for (int n = 1; n <= 8; ++n) {
    for (std::int32_t vocab : {2, 3, 5, 20}) {
      for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{300}}) {
        INFO("n " << n << ", vocab " << vocab << ", length " << length);
        const Conversation c = random_conversation(length, vocab, rng);
        const std::vector<std::uint8_t> got = label(c, n);
        CHECK(got == naive_labels(c.tokens, c.generated, n));
        for (std::uint8_t v : got) {
          ones += v == 1;
          zeros += v == 0;
        }
      }
    }
  }
  // The streams exercised both outcomes (else the comparison proves little).
  CHECK(ones > 100);
  CHECK(zeros > 100);
}

TEST_CASE("repeated-suffix labels: the batch form labels each conversation alone") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int n : {1, 2, 4, 8}) {
    std::vector<Conversation> convs;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> generated, expected;
    std::vector<std::int64_t> indptr = {0};
    for (std::size_t length : {std::size_t{40}, std::size_t{0}, std::size_t{3}, std::size_t{150}, std::size_t{90}}) {
      const Conversation c = random_conversation(length, 4, rng);
      tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
      generated.insert(generated.end(), c.generated.begin(), c.generated.end());
      const std::vector<std::uint8_t> ref = naive_labels(c.tokens, c.generated, n);
      expected.insert(expected.end(), ref.begin(), ref.end());
      indptr.push_back(static_cast<std::int64_t>(tokens.size()));
    }
    std::vector<std::uint8_t> got(tokens.size(), 77);
    const clm::Status s = clm::label_repeated_suffixes_batch(tokens, generated, indptr, n, got);
    INFO("n " << n << ": " << s.message());
    REQUIRE(s.ok());
    CHECK(got == expected);
  }
}

TEST_CASE("repeated-suffix labels: edge cases") {
  SECTION("an n-gram seen only in the prompt counts, a prompt position is not scored") {
    const std::vector<std::int32_t> t = {5, 6, 7, 1, 5, 6, 7, 6, 7};
    const std::vector<std::uint8_t> g = {0, 0, 0, 0, 1, 1, 1, 1, 1};
    std::vector<std::uint8_t> out(t.size());
    REQUIRE(clm::label_repeated_suffixes(t, g, 2, out).ok());
    const std::vector<std::uint8_t> expected = {255, 255, 255, 255, 0, 1, 1, 0, 1};
    CHECK(out == expected);
    CHECK(out == naive_labels(t, g, 2));
  }
  SECTION("overlapping occurrences count") {
    const std::vector<std::int32_t> t = {3, 3, 3, 3};
    const std::vector<std::uint8_t> g = {1, 1, 1, 1};
    std::vector<std::uint8_t> out(t.size());
    REQUIRE(clm::label_repeated_suffixes(t, g, 2, out).ok());
    CHECK(out == std::vector<std::uint8_t>{0, 0, 1, 1});
  }
  SECTION("n longer than the conversation: every generated position is 0") {
    const std::vector<std::int32_t> t = {1, 1, 1};
    const std::vector<std::uint8_t> g = {0, 1, 1};
    std::vector<std::uint8_t> out(t.size());
    REQUIRE(clm::label_repeated_suffixes(t, g, 4, out).ok());
    CHECK(out == std::vector<std::uint8_t>{255, 0, 0});
    REQUIRE(clm::label_repeated_suffixes(t, g, 2147483647, out).ok());
    CHECK(out == std::vector<std::uint8_t>{255, 0, 0});
  }
  SECTION("empty input") {
    CHECK(clm::label_repeated_suffixes({}, {}, 3, {}).ok());
    const std::vector<std::int64_t> zero = {0};
    CHECK(clm::label_repeated_suffixes_batch({}, {}, zero, 3, {}).ok());
  }
}

TEST_CASE("repeated-suffix labels: bad arguments give invalid_argument and leave labels untouched") {
  const std::vector<std::int32_t> t = {1, 2, 1, 2};
  const std::vector<std::uint8_t> g = {1, 1, 1, 1};
  std::vector<std::uint8_t> out(4, 77);
  const std::vector<std::uint8_t> untouched(4, 77);
  auto refused = [&](const clm::Status& s) {
    INFO(s.message());
    return s.code() == clm::StatusCode::invalid_argument && !s.message().empty() && out == untouched;
  };
  CHECK(refused(clm::label_repeated_suffixes(t, g, 0, out)));
  CHECK(refused(clm::label_repeated_suffixes(t, g, -2, out)));
  CHECK(refused(clm::label_repeated_suffixes(std::span(t).first(3), g, 2, out)));
  CHECK(refused(clm::label_repeated_suffixes(t, std::span(g).first(3), 2, out)));
  CHECK(refused(clm::label_repeated_suffixes(t, g, 2, std::span(out).first(3))));
  const std::vector<std::uint8_t> g2 = {1, 2, 0, 1};
  CHECK(refused(clm::label_repeated_suffixes(t, g2, 2, out)));

  const std::vector<std::vector<std::int64_t>> bad_indptrs = {{}, {1, 4}, {0, 3, 2, 4}, {0, 3}, {0, 2, 5}};
  for (const auto& indptr : bad_indptrs) {
    INFO("indptr size " << indptr.size());
    CHECK(refused(clm::label_repeated_suffixes_batch(t, g, indptr, 2, out)));
  }
  const std::vector<std::int64_t> ok = {0, 2, 4};
  CHECK(refused(clm::label_repeated_suffixes_batch(t, g, ok, 0, out)));
  REQUIRE(clm::label_repeated_suffixes_batch(t, g, ok, 2, out).ok());
  CHECK(out == std::vector<std::uint8_t>{0, 0, 0, 0});  // each half alone has no repeat
}
