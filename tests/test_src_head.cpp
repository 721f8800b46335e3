// Tests of the CPU SRC head (include/clm/model/src_head.hpp) against a float64
// reference written here with plain loops, on fresh random data (the seed is
// printed on failure).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "clm/model/src_head.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kEot = 128009;
constexpr int32_t kBos = 128000;
const std::vector<int32_t> kSpecial = {kEot, kBos, kEot};  // a duplicate on purpose

struct Batch {
  std::vector<float> attn;      // [total][hidden]
  std::vector<int32_t> ids;     // [total]
  std::vector<int32_t> indptr;  // [batch + 1]
  std::size_t batch() const { return indptr.size() - 1; }
};

bool is_special(int32_t id) {
  for (int32_t s : kSpecial) {
    if (s == id) return true;
  }
  return false;
}

clm::SrcHeadWeights random_weights(int32_t hidden, std::mt19937& rng) {
  const auto h = static_cast<std::size_t>(hidden);
  const std::size_t inner = h / 4;
  // Scaled so that z and the logit are O(1): the scores spread over (0, 1).
  std::normal_distribution<float> n1(0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
  std::normal_distribution<float> n2(0.0f, 1.5f / std::sqrt(static_cast<float>(inner)));
  std::normal_distribution<float> nb(0.0f, 0.3f);
  clm::SrcHeadWeights w;
  w.hidden = hidden;
  w.w1.resize(inner * h);
  for (float& v : w.w1) v = n1(rng);
  w.b1.resize(inner);
  for (float& v : w.b1) v = nb(rng);
  w.w2.resize(inner);
  for (float& v : w.w2) v = n2(rng);
  w.b2 = nb(rng);
  return w;
}

// Ragged batch; each sequence gets its own mean vector (so the sequences score
// differently), ~25% special positions and at least one non-special one.
Batch random_batch(int32_t hidden, const std::vector<int>& lengths, std::mt19937& rng) {
  const auto h = static_cast<std::size_t>(hidden);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, 127999);
  std::bernoulli_distribution special(0.25);
  Batch out;
  out.indptr.push_back(0);
  for (int len : lengths) {
    std::vector<float> mu(h);
    for (float& v : mu) v = n(rng);
    const int keep = std::uniform_int_distribution<int>(0, len - 1)(rng);
    for (int t = 0; t < len; ++t) {
      for (std::size_t c = 0; c < h; ++c) out.attn.push_back(mu[c] + 0.5f * n(rng));
      const bool sp = t != keep && special(rng);
      out.ids.push_back(sp ? kSpecial[static_cast<std::size_t>(t) % 2] : token(rng));
    }
    out.indptr.push_back(out.indptr.back() + len);
  }
  return out;
}

std::vector<double> reference(const clm::SrcHeadWeights& w, clm::Gelu gelu, const Batch& b) {
  const auto h = static_cast<std::size_t>(w.hidden);
  const std::size_t inner = h / 4;
  std::vector<double> scores;
  for (std::size_t s = 0; s < b.batch(); ++s) {
    std::vector<double> mean(h, 0.0);
    int count = 0;
    for (auto t = static_cast<std::size_t>(b.indptr[s]); t < static_cast<std::size_t>(b.indptr[s + 1]); ++t) {
      if (is_special(b.ids[t])) continue;
      for (std::size_t c = 0; c < h; ++c) mean[c] += static_cast<double>(b.attn[t * h + c]);
      ++count;
    }
    for (double& v : mean) v /= count;
    double logit = static_cast<double>(w.b2);
    for (std::size_t i = 0; i < inner; ++i) {
      double z = static_cast<double>(w.b1[i]);
      for (std::size_t c = 0; c < h; ++c) z += static_cast<double>(w.w1[i * h + c]) * mean[c];
      const double g = gelu == clm::Gelu::erf
                           ? 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)))
                           : 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
      logit += static_cast<double>(w.w2[i]) * g;
    }
    scores.push_back(1.0 / (1.0 + std::exp(-logit)));
  }
  return scores;
}

std::unique_ptr<clm::SrcHead> make_head(const clm::SrcHeadWeights& w, clm::Gelu gelu) {
  std::unique_ptr<clm::SrcHead> head;
  const clm::Status s = clm::SrcHead::create(w, gelu, head);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(head);
  return head;
}

clm::Status run(const clm::SrcHead& head, const Batch& b, std::vector<float>& scores) {
  return head.score(b.attn, b.ids, b.indptr, kSpecial, scores);
}

void check_against_reference(const clm::SrcHeadWeights& w, clm::Gelu gelu, const Batch& b,
                             const std::vector<float>& scores) {
  const std::vector<double> ref = reference(w, gelu, b);
  REQUIRE(scores.size() == ref.size());
  for (std::size_t s = 0; s < ref.size(); ++s) {
    INFO("sequence " << s << ": got " << scores[s] << ", reference " << ref[s]);
    REQUIRE(std::isfinite(scores[s]));
    REQUIRE(scores[s] > 0.0f);
    REQUIRE(scores[s] < 1.0f);
    CHECK(std::abs(static_cast<double>(scores[s]) - ref[s]) <= 1e-5 * ref[s]);
  }
}

using clm_test::fresh_seed;

}  // namespace

TEST_CASE("SRC head matches a float64 reference on ragged batches") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int32_t hidden;
    std::vector<int> lengths;
  };
  const std::vector<Shape> shapes = {
      {4, {1, 3, 2}},
      {64, {1, 7, 33, 2, 15, 1, 40, 9, 4}},
      {256, {12, 1, 25, 3, 64, 8, 30}},
      {4096, {5, 17, 1}},
  };
  for (const Shape& shape : shapes) {
    for (clm::Gelu gelu : {clm::Gelu::tanh, clm::Gelu::erf}) {
      INFO("hidden " << shape.hidden << ", gelu " << (gelu == clm::Gelu::tanh ? "tanh" : "erf"));
      const clm::SrcHeadWeights w = random_weights(shape.hidden, rng);
      const Batch b = random_batch(shape.hidden, shape.lengths, rng);
      auto head = make_head(w, gelu);
      CHECK(head->hidden() == shape.hidden);
      CHECK(head->inner() == shape.hidden / 4);
      std::vector<float> scores(b.batch(), -1.0f);
      const clm::Status s = run(*head, b, scores);
      INFO(s.message());
      REQUIRE(s.ok());
      check_against_reference(w, gelu, b, scores);
    }
  }
}

TEST_CASE("SRC head: the two GELU modes differ, and the batch does not mix sequences") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SrcHeadWeights w = random_weights(64, rng);
  const Batch b = random_batch(64, {6, 9, 3, 20}, rng);
  auto tanh_head = make_head(w, clm::Gelu::tanh);
  auto erf_head = make_head(w, clm::Gelu::erf);
  std::vector<float> st(b.batch()), se(b.batch());
  REQUIRE(run(*tanh_head, b, st).ok());
  REQUIRE(run(*erf_head, b, se).ok());
  CHECK(st != se);
  // Each sequence alone scores as it does inside the batch: both as the float64
  // reference does (to 1e-5; the two sum in different orders).
  check_against_reference(w, clm::Gelu::tanh, b, st);
  for (std::size_t s = 0; s < b.batch(); ++s) {
    Batch one;
    const auto begin = static_cast<std::size_t>(b.indptr[s]), end = static_cast<std::size_t>(b.indptr[s + 1]);
    one.attn.assign(b.attn.begin() + static_cast<std::ptrdiff_t>(begin * 64),
                    b.attn.begin() + static_cast<std::ptrdiff_t>(end * 64));
    one.ids.assign(b.ids.begin() + static_cast<std::ptrdiff_t>(begin),
                   b.ids.begin() + static_cast<std::ptrdiff_t>(end));
    one.indptr = {0, static_cast<int32_t>(end - begin)};
    std::vector<float> single(1);
    REQUIRE(run(*tanh_head, one, single).ok());
    check_against_reference(w, clm::Gelu::tanh, one, single);
  }
}

TEST_CASE("SRC head: special positions are excluded from the mean") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t hidden = 64;
  const auto h = static_cast<std::size_t>(hidden);
  const clm::SrcHeadWeights w = random_weights(hidden, rng);
  Batch b = random_batch(hidden, {10, 14, 7}, rng);
  // Make sure sequence 1 has a special position and two non-special ones.
  const auto s1 = static_cast<std::size_t>(b.indptr[1]);
  b.ids[s1 + 2] = kEot;
  b.ids[s1 + 3] = 42;
  b.ids[s1 + 4] = 43;
  auto head = make_head(w, clm::Gelu::erf);
  std::vector<float> base(b.batch());
  REQUIRE(run(*head, b, base).ok());

  SECTION("changing a special position changes nothing") {
    Batch c = b;
    std::normal_distribution<float> n(0.0f, 50.0f);
    for (std::size_t t = 0; t < c.ids.size(); ++t) {
      if (!is_special(c.ids[t])) continue;
      for (std::size_t k = 0; k < h; ++k) c.attn[t * h + k] = n(rng);
    }
    std::vector<float> scores(c.batch());
    REQUIRE(run(*head, c, scores).ok());
    CHECK(scores == base);
  }
  SECTION("changing a non-special position changes that sequence's score only") {
    Batch c = b;
    std::normal_distribution<float> n(0.0f, 3.0f);
    for (std::size_t k = 0; k < h; ++k) c.attn[(s1 + 3) * h + k] += n(rng);
    std::vector<float> scores(c.batch());
    REQUIRE(run(*head, c, scores).ok());
    CHECK(scores[0] == base[0]);
    CHECK(scores[1] != base[1]);
    CHECK(scores[2] == base[2]);
    check_against_reference(w, clm::Gelu::erf, c, scores);
  }
  SECTION("marking a position special changes the score like the reference says") {
    Batch c = b;
    c.ids[s1 + 4] = kBos;
    std::vector<float> scores(c.batch());
    REQUIRE(run(*head, c, scores).ok());
    CHECK(scores[1] != base[1]);
    check_against_reference(w, clm::Gelu::erf, c, scores);
  }
}

TEST_CASE("SRC head: NaN and Inf give invalid_argument and leave scores untouched") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t hidden = 64;
  const clm::SrcHeadWeights w = random_weights(hidden, rng);
  const Batch b = random_batch(hidden, {5, 8, 2}, rng);
  auto head = make_head(w, clm::Gelu::tanh);
  const std::vector<float> sentinel(b.batch(), -7.0f);

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int trial = 0; trial < 4; ++trial) {
      Batch c = b;
      const auto at = std::uniform_int_distribution<std::size_t>(0, c.attn.size() - 1)(rng);
      c.attn[at] = bad;
      INFO("bad value " << bad << " at " << at);
      std::vector<float> scores = sentinel;
      const clm::Status s = run(*head, c, scores);
      CHECK(s.code() == clm::StatusCode::invalid_argument);
      CHECK(!s.message().empty());
      CHECK(scores == sentinel);
    }
  }
  SECTION("finite activations that overflow the f32 GEMM") {
    clm::SrcHeadWeights ones = w;
    for (float& v : ones.w1) v = 1.0f;  // z = 64 * 3e38 overflows to +inf
    auto big_head = make_head(ones, clm::Gelu::tanh);
    Batch c = b;
    for (float& v : c.attn) v = 3.0e38f;
    std::vector<float> scores = sentinel;
    const clm::Status s = run(*big_head, c, scores);
    INFO(s.message());
    CHECK(s.code() == clm::StatusCode::invalid_argument);
    CHECK(scores == sentinel);
  }
  SECTION("non-finite weights are refused by create") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (int which = 0; which < 4; ++which) {
      clm::SrcHeadWeights bad = w;
      if (which == 0) bad.w1[bad.w1.size() / 2] = nan;
      if (which == 1) bad.b1[1] = inf;
      if (which == 2) bad.w2[0] = -inf;
      if (which == 3) bad.b2 = nan;
      std::unique_ptr<clm::SrcHead> out;
      const clm::Status s = clm::SrcHead::create(bad, clm::Gelu::erf, out);
      INFO("which " << which);
      CHECK(s.code() == clm::StatusCode::invalid_argument);
      CHECK(!out);
    }
  }
}

TEST_CASE("SRC head: bad shapes give invalid_argument") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t hidden = 16;
  const clm::SrcHeadWeights w = random_weights(hidden, rng);

  SECTION("create") {
    auto refused = [](clm::SrcHeadWeights bad) {
      std::unique_ptr<clm::SrcHead> out;
      const clm::Status s = clm::SrcHead::create(std::move(bad), clm::Gelu::tanh, out);
      INFO(s.message());
      return s.code() == clm::StatusCode::invalid_argument && !out;
    };
    for (int32_t bad_hidden : {0, -4, 2, 6, 18}) {
      clm::SrcHeadWeights bad = w;
      bad.hidden = bad_hidden;
      INFO("hidden " << bad_hidden);
      CHECK(refused(bad));
    }
    clm::SrcHeadWeights bad = w;
    bad.w1.pop_back();
    CHECK(refused(bad));
    bad = w;
    bad.b1.push_back(0.0f);
    CHECK(refused(bad));
    bad = w;
    bad.w2.clear();
    CHECK(refused(bad));
    bad = w;
    bad.w1.resize(w.w1.size() * 4);  // [hidden][hidden] instead of [hidden/4][hidden]
    CHECK(refused(bad));
  }

  SECTION("score") {
    auto head = make_head(w, clm::Gelu::tanh);
    const Batch b = random_batch(hidden, {3, 4}, rng);
    const std::vector<float> sentinel(2, -7.0f);
    auto refused = [&](std::span<const float> attn, std::span<const int32_t> ids, std::span<const int32_t> indptr,
                       std::size_t n_scores) {
      std::vector<float> scores(n_scores, -7.0f);
      const clm::Status s = head->score(attn, ids, indptr, kSpecial, scores);
      INFO(s.message());
      return s.code() == clm::StatusCode::invalid_argument && !s.message().empty() &&
             scores == std::vector<float>(n_scores, -7.0f);
    };
    std::vector<float> scores = sentinel;
    REQUIRE(head->score(b.attn, b.ids, b.indptr, kSpecial, scores).ok());

    // attn_out not a multiple of hidden
    CHECK(refused(std::span<const float>(b.attn).first(b.attn.size() - 1), b.ids, b.indptr, 2));
    // token_ids size
    CHECK(refused(b.attn, std::span<const int32_t>(b.ids).first(b.ids.size() - 1), b.indptr, 2));
    // indptr: empty, not from 0, decreasing, wrong end, past the end
    CHECK(refused(b.attn, b.ids, {}, 0));
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{1, 4, 7}, 2));
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{0, 5, 4, 7}, 3));
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{0, 3, 6}, 2));
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{0, 3, 8}, 2));
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{0, -1, 7}, 2));
    // scores size
    CHECK(refused(b.attn, b.ids, b.indptr, 1));
    CHECK(refused(b.attn, b.ids, b.indptr, 3));
    // an empty sequence
    CHECK(refused(b.attn, b.ids, std::vector<int32_t>{0, 3, 3, 7}, 3));
    // a sequence whose positions are all special
    std::vector<int32_t> ids = b.ids;
    for (std::size_t t = 3; t < 7; ++t) ids[t] = (t % 2) ? kEot : kBos;
    CHECK(refused(b.attn, ids, b.indptr, 2));
    // ... which is fine once the specials are not masked
    std::vector<float> two(2);
    CHECK(head->score(b.attn, ids, b.indptr, {}, two).ok());
    // batch 0 is valid and writes nothing
    std::vector<int32_t> zero = {0};
    CHECK(head->score(std::span<const float>{}, {}, zero, kSpecial, {}).ok());
  }
}

namespace {

void append_u16(std::vector<std::byte>& data, const std::vector<std::uint16_t>& values) {
  for (std::uint16_t v : values) {
    data.push_back(static_cast<std::byte>(v & 0xFF));
    data.push_back(static_cast<std::byte>(v >> 8));
  }
}

}  // namespace

TEST_CASE("SRC head over f16 and bf16 attention outputs stays within 1e-2 of the float64 reference") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int32_t hidden : {64, 1024}) {
    const clm::SrcHeadWeights w = random_weights(hidden, rng);
    const Batch b = random_batch(hidden, {3, 17, 1, 40}, rng);
    auto head = make_head(w, clm::Gelu::tanh);
    const std::vector<double> ref = reference(w, clm::Gelu::tanh, b);
    for (clm::ActDType dtype : {clm::ActDType::f16, clm::ActDType::bf16}) {
      INFO("hidden " << hidden << ", dtype " << clm::kv_dtype_name(dtype));
      const std::vector<std::uint16_t> half = clm_test::to_half(b.attn, dtype);
      const clm::ConstActivationView view{half.data(), dtype, static_cast<std::int64_t>(b.ids.size()), hidden};
      std::vector<float> scores(b.batch(), -1.0f);
      const clm::Status s = head->score(view, b.ids, b.indptr, kSpecial, scores);
      INFO(s.message());
      REQUIRE(s.ok());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        INFO("sequence " << i << ": " << scores[i] << " vs " << ref[i]);
        CHECK(std::abs(static_cast<double>(scores[i]) - ref[i]) <= 1e-2 * ref[i]);
      }
    }
    // A NaN in a half-precision input is refused too.
    std::vector<std::uint16_t> half = clm_test::to_half(b.attn, clm::ActDType::bf16);
    half[half.size() / 2] = 0x7fc0;  // bf16 quiet NaN
    const clm::ConstActivationView view{half.data(), clm::ActDType::bf16, static_cast<std::int64_t>(b.ids.size()),
                                        hidden};
    std::vector<float> scores(b.batch(), -1.0f);
    CHECK(head->score(view, b.ids, b.indptr, kSpecial, scores).code() == clm::StatusCode::invalid_argument);
    CHECK(scores == std::vector<float>(b.batch(), -1.0f));
  }
}

TEST_CASE("SRC head: score_pooled on the means equals score on the rows") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t hidden = 256;
  const auto h = static_cast<std::size_t>(hidden);
  const clm::SrcHeadWeights w = random_weights(hidden, rng);
  const Batch b = random_batch(hidden, {5, 1, 12}, rng);
  auto head = make_head(w, clm::Gelu::erf);
  std::vector<float> means(b.batch() * h, 0.0f);
  for (std::size_t s = 0; s < b.batch(); ++s) {
    std::vector<double> acc(h, 0.0);
    int count = 0;
    for (auto t = static_cast<std::size_t>(b.indptr[s]); t < static_cast<std::size_t>(b.indptr[s + 1]); ++t) {
      if (is_special(b.ids[t])) continue;
      for (std::size_t c = 0; c < h; ++c) acc[c] += b.attn[t * h + c];
      ++count;
    }
    for (std::size_t c = 0; c < h; ++c) means[s * h + c] = static_cast<float>(acc[c] / count);
  }
  std::vector<float> pooled(b.batch()), direct(b.batch());
  REQUIRE(head->score_pooled(means, pooled).ok());
  REQUIRE(run(*head, b, direct).ok());
  // Both against float64 at the head's accuracy (1e-5), not against each other
  // at a tighter bound: the two sum in different orders, and each is 1e-6 off
  // the reference at times (seed 1005590228: -1.1e-6 and +3.6e-7).
  check_against_reference(w, clm::Gelu::erf, b, pooled);
  check_against_reference(w, clm::Gelu::erf, b, direct);
  // batch 1 takes the GEMV path: the same answer as inside a batch, as near the reference.
  std::vector<float> one(1);
  REQUIRE(head->score_pooled(std::span<const float>(means).subspan(h, h), one).ok());
  const std::vector<double> ref = reference(w, clm::Gelu::erf, b);
  CHECK(std::abs(static_cast<double>(one[0]) - ref[1]) <= 1e-5 * ref[1]);
  // Wrong sizes and NaN are refused, scores untouched.
  std::vector<float> out(2, -1.0f);
  CHECK(head->score_pooled(means, out).code() == clm::StatusCode::invalid_argument);
  means[3] = std::numeric_limits<float>::infinity();
  std::vector<float> out3(3, -1.0f);
  CHECK(head->score_pooled(means, out3).code() == clm::StatusCode::invalid_argument);
  CHECK(out3 == std::vector<float>(3, -1.0f));
}

TEST_CASE("SRC head weights: write/read round trip, and a hand-built f16 file") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SrcHeadWeights w = random_weights(32, rng);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("test_src_head_" + std::to_string(seed) + ".safetensors")).string();
  const clm::Gelu written_gelu = seed % 2 == 0 ? clm::Gelu::erf : clm::Gelu::tanh;
  REQUIRE(clm::write_src_head(path, w, written_gelu, {{"written_by", "test_src_head"}}).ok());
  clm::SafetensorsFile written;
  REQUIRE(clm::SafetensorsFile::open(path, written).ok());
  clm::SrcHeadWeights back;
  const clm::Status s = clm::read_src_head(written, back);
  INFO(s.message());
  REQUIRE(s.ok());
  std::optional<clm::Gelu> back_gelu;
  REQUIRE(clm::read_src_head_gelu(written, back_gelu).ok());
  CHECK(back_gelu == written_gelu);
  CHECK(written.metadata().at("written_by") == "test_src_head");
  // A "gelu" entry of the host's that contradicts the head is refused, and nothing is written.
  const std::string conflicting = path + ".conflict";
  const std::map<std::string, std::string> wrong = {{"gelu", written_gelu == clm::Gelu::erf ? "tanh" : "erf"}};
  CHECK(clm::write_src_head(conflicting, w, written_gelu, wrong).code() == clm::StatusCode::invalid_argument);
  CHECK(!std::ifstream(conflicting).good());
  std::remove(path.c_str());
  CHECK(back.hidden == w.hidden);
  CHECK(back.w1 == w.w1);
  CHECK(back.b1 == w.b1);
  CHECK(back.w2 == w.w2);
  CHECK(back.b2 == w.b2);

  // hidden 4: w1 [1, 4] f16, b1 [1] bf16, w2 [1, 1] f32, b2 [] f32: every accepted form.
  const std::vector<float> w1 = {0.5f, -1.25f, 2.0f, 0.75f};
  std::vector<std::byte> data;
  append_u16(data, clm_test::to_half(w1, clm::ActDType::f16));        // 0..8
  append_u16(data, clm_test::to_half({0.25f}, clm::ActDType::bf16));  // 8..10
  data.resize(12);                                                    // pad to 12 for the f32s
  const float w2 = -1.5f, b2 = 0.125f;
  for (float v : {w2, b2}) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    data.insert(data.end(), p, p + 4);
  }  // w2 12..16, b2 16..20
  const std::string json = R"({"src_head.w1":{"dtype":"F16","shape":[1,4],"data_offsets":[0,8]},)"
                           R"("src_head.b1":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
                           R"("src_head.w2":{"dtype":"F32","shape":[1,1],"data_offsets":[12,16]},)"
                           R"("src_head.b2":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})";
  clm::SafetensorsFile file;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes(json, data), file).ok());
  clm::SrcHeadWeights hand;
  const clm::Status hs = clm::read_src_head(file, hand);
  INFO(hs.message());
  REQUIRE(hs.ok());
  CHECK(hand.hidden == 4);
  CHECK(hand.w1 == w1);
  CHECK(hand.b1 == std::vector<float>{0.25f});
  CHECK(hand.w2 == std::vector<float>{w2});
  CHECK(hand.b2 == b2);
  std::optional<clm::Gelu> no_gelu = clm::Gelu::tanh;
  REQUIRE(clm::read_src_head_gelu(file, no_gelu).ok());
  CHECK(!no_gelu.has_value());  // a file that does not say
  for (const auto& [value, want] : std::map<std::string, std::optional<clm::Gelu>>{
           {"erf", clm::Gelu::erf}, {"tanh", clm::Gelu::tanh}, {"relu", std::nullopt}, {"ERF", std::nullopt}}) {
    INFO("gelu metadata " << value);
    const std::string with_meta = R"({"__metadata__":{"gelu":")" + value + R"("},)" + json.substr(1);
    clm::SafetensorsFile meta_file;
    REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes(with_meta, data), meta_file).ok());
    std::optional<clm::Gelu> got;
    const clm::Status gs = clm::read_src_head_gelu(meta_file, got);
    if (want) {
      REQUIRE(gs.ok());
      CHECK(got == want);
    } else {
      CHECK(gs.code() == clm::StatusCode::invalid_argument);
      CHECK(gs.message().find(value) != std::string::npos);
    }
  }
  auto head = make_head(hand, clm::Gelu::erf);
  // One token [1, 0, 0, 0]: z = 0.5 + 0.25; logit = -1.5 * GELU(0.75) + 0.125.
  const std::vector<float> row = {1.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> ids = {7}, indptr = {0, 1};
  std::vector<float> score(1);
  REQUIRE(head->score(row, ids, indptr, {}, score).ok());
  const double z = 0.75, g = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
  CHECK(std::abs(score[0] - 1.0 / (1.0 + std::exp(-(-1.5 * g + 0.125)))) < 1e-6);

  // Wrong shapes, a wrong dtype and a NaN are refused with the tensor named.
  const std::string bad_shape = R"({"src_head.w1":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
                                R"("src_head.b1":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
                                R"("src_head.w2":{"dtype":"F32","shape":[1,1],"data_offsets":[12,16]},)"
                                R"("src_head.b2":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})";
  clm::SafetensorsFile f2;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes(bad_shape, data), f2).ok());
  clm::SrcHeadWeights untouched = hand;
  clm::Status e = clm::read_src_head(f2, untouched);
  CHECK(e.code() == clm::StatusCode::invalid_argument);
  CHECK(untouched.w1 == w1);
  const std::string bad_dtype = R"({"src_head.w1":{"dtype":"I16","shape":[1,4],"data_offsets":[0,8]},)"
                                R"("src_head.b1":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
                                R"("src_head.w2":{"dtype":"F32","shape":[1,1],"data_offsets":[12,16]},)"
                                R"("src_head.b2":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})";
  clm::SafetensorsFile f3;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes(bad_dtype, data), f3).ok());
  e = clm::read_src_head(f3, untouched);
  CHECK(e.code() == clm::StatusCode::invalid_argument);
  CHECK(e.message().find("src_head.w1") != std::string::npos);
  std::vector<std::byte> nan_data = data;
  nan_data[0] = std::byte{0x00};
  nan_data[1] = std::byte{0x7e};  // f16 NaN in w1[0]
  clm::SafetensorsFile f4;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes(json, nan_data), f4).ok());
  CHECK(clm::read_src_head(f4, untouched).code() == clm::StatusCode::invalid_argument);
  clm::SafetensorsFile empty;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes("{}", {}), empty).ok());
  CHECK(clm::read_src_head(empty, untouched).code() == clm::StatusCode::not_found);
  CHECK(clm::read_src_head(std::string("/nonexistent/head.safetensors"), untouched).code() ==
        clm::StatusCode::io_error);
}

TEST_CASE("activation views whose size overflows are refused before anything reads them") {
  const clm::ConstActivationView huge{nullptr, clm::ActDType::f32, std::int64_t{1} << 62, 4};
  CHECK(clm::check_activation_view(huge, 4, "huge").code() == clm::StatusCode::invalid_argument);
  const clm::ConstActivationView huge_half{nullptr, clm::ActDType::bf16, std::int64_t{1} << 61, 4};
  CHECK(clm::check_activation_view(huge_half, 4, "huge").code() == clm::StatusCode::invalid_argument);
  std::mt19937 rng(fresh_seed());
  auto head = make_head(random_weights(4, rng), clm::Gelu::tanh);
  std::vector<float> scores(1, -1.0f);
  const std::vector<int32_t> ids = {1}, indptr = {0, 1};
  CHECK(head->score(huge, ids, indptr, {}, scores).code() == clm::StatusCode::invalid_argument);
  CHECK(scores[0] == -1.0f);
  // A view that fits still passes.
  const std::vector<float> one(4, 0.5f);
  CHECK(clm::check_activation_view({one.data(), clm::ActDType::f32, 1, 4}, 4, "one").ok());
}
