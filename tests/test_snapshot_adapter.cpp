// Tests of the snapshot adapter (include/clm/model/snapshot_adapter.hpp) against a
// float64 reference written here with plain loops, on fresh random data (the
// seed is printed on failure): delta, inject in f32/f16/bf16, layer gating,
// inject_batch against per-sequence inject, safetensors files and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>  // getpid

#include "clm/detail/half.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "test_support.hpp"

namespace {

using clm_test::fresh_seed;
using clm_test::RawTensor;
using clm_test::raw_bytes;

using clm::ActDType;
using clm::StatusCode;

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

clm::SnapshotAdapterWeights random_weights(int hidden, int dim, std::mt19937& rng) {
  std::normal_distribution<float> nw(0.0f, 1.0f / std::sqrt(static_cast<float>(dim)));
  std::normal_distribution<float> nb(0.0f, 0.2f);
  clm::SnapshotAdapterWeights w;
  w.hidden = hidden;
  w.snapshot_dim = dim;
  w.weight.resize(sz(hidden) * sz(dim));
  for (float& v : w.weight) v = nw(rng);
  w.bias.resize(sz(hidden));
  for (float& v : w.bias) v = nb(rng);
  return w;
}

std::vector<float> random_snapshot(int dim, std::mt19937& rng) {  // unit length, like a projection's
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> s(sz(dim));
  double ss = 0.0;
  for (float& v : s) {
    v = n(rng);
    ss += static_cast<double>(v) * v;
  }
  for (float& v : s) v = static_cast<float>(v / std::sqrt(ss));
  return s;
}

// residual_scale * (W s + b), in double.
std::vector<double> reference_delta(const clm::SnapshotAdapterWeights& w, float scale, std::span<const float> s) {
  const std::size_t h = sz(w.hidden), d = sz(w.snapshot_dim);
  std::vector<double> out(h);
  for (std::size_t c = 0; c < h; ++c) {
    double acc = static_cast<double>(w.bias[c]);
    for (std::size_t k = 0; k < d; ++k) acc += static_cast<double>(w.weight[c * d + k]) * static_cast<double>(s[k]);
    out[c] = static_cast<double>(scale) * acc;
  }
  return out;
}

// Hidden states of any dtype, with their values as double.
struct States {
  ActDType dtype = ActDType::f32;
  std::int64_t rows = 0;
  int cols = 0;
  std::vector<float> f32;
  std::vector<std::uint16_t> half;

  clm::ActivationView view() {
    if (dtype == ActDType::f32) return {f32.data(), dtype, rows, cols};
    return {half.data(), dtype, rows, cols};
  }
  double at(std::size_t i) const {
    if (dtype == ActDType::f32) return f32[i];
    return dtype == ActDType::f16 ? clm::detail::f16_to_f32(half[i]) : clm::detail::bf16_to_f32(half[i]);
  }
  bool operator==(const States& o) const { return f32 == o.f32 && half == o.half; }
};

States random_states(ActDType dtype, std::int64_t rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 2.0f);
  States s{dtype, rows, cols, {}, {}};
  const std::size_t count = sz(rows) * sz(cols);
  for (std::size_t i = 0; i < count; ++i) {
    const float v = n(rng);
    if (dtype == ActDType::f32) s.f32.push_back(v);
    if (dtype == ActDType::f16) s.half.push_back(clm::detail::f32_to_f16(v));
    if (dtype == ActDType::bf16) s.half.push_back(clm::detail::f32_to_bf16(v));
  }
  return s;
}

double tolerance(ActDType dtype) { return dtype == ActDType::f32 ? 1e-5 : 1e-2; }

// after[r] == before[r] + delta for rows [r0, r1), relative to the row's scale.
void check_rows(const States& before, const States& after, std::int64_t r0, std::int64_t r1,
                const std::vector<double>& delta, double tol = 0.0) {
  if (tol == 0.0) tol = tolerance(before.dtype);
  const std::size_t h = sz(before.cols);
  for (auto r = sz(r0); r < sz(r1); ++r) {
    double scale = 0.0;
    for (std::size_t c = 0; c < h; ++c) scale = std::max(scale, std::abs(before.at(r * h + c) + delta[c]));
    for (std::size_t c = 0; c < h; ++c) {
      const double want = before.at(r * h + c) + delta[c];
      INFO("row " << r << ", channel " << c << ": got " << after.at(r * h + c) << ", want " << want);
      REQUIRE(std::abs(after.at(r * h + c) - want) <= tol * scale);
    }
  }
}

void check_rows_unchanged(const States& before, const States& after, std::int64_t r0, std::int64_t r1) {
  const std::size_t h = sz(before.cols);
  for (auto i = sz(r0) * h; i < sz(r1) * h; ++i) {
    INFO("element " << i);
    REQUIRE(before.at(i) == after.at(i));
  }
}

std::unique_ptr<clm::SnapshotAdapter> make_adapter(clm::SnapshotAdapterWeights w, clm::SnapshotAdapterConfig c) {
  std::unique_ptr<clm::SnapshotAdapter> a;
  const clm::Status s = clm::SnapshotAdapter::create(std::move(w), std::move(c), a);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(a);
  return a;
}

void require_invalid(const clm::Status& s) {
  INFO("status " << s.code_name() << ": " << s.message());
  REQUIRE(s.code() == StatusCode::invalid_argument);
  REQUIRE(!s.message().empty());
}

// ---- hand-built safetensors bytes --------------------------------------------------

clm::Status read_bytes(const std::vector<RawTensor>& tensors, clm::SnapshotAdapterWeights& out) {
  clm::SafetensorsFile file;
  const clm::Status s = clm::SafetensorsFile::parse(clm_test::safetensors_bytes(tensors), file);
  INFO(s.message());
  REQUIRE(s.ok());
  return clm::read_snapshot_adapter(file, out);
}

bool same(const clm::SnapshotAdapterWeights& a, const clm::SnapshotAdapterWeights& b) {
  return a.hidden == b.hidden && a.snapshot_dim == b.snapshot_dim && a.weight == b.weight && a.bias == b.bias;
}

}  // namespace

TEST_CASE("adapter: delta and inject match a float64 reference in f32, f16 and bf16") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int hidden, dim, tokens;
  };
  for (const Shape& sh : std::vector<Shape>{{8, 3, 1}, {64, 16, 7}, {1024, 128, 5}, {4096, 256, 3}, {4096, 384, 2}}) {
    INFO("hidden " << sh.hidden << ", dim " << sh.dim << ", tokens " << sh.tokens);
    const clm::SnapshotAdapterWeights w = random_weights(sh.hidden, sh.dim, rng);
    const float scale = std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    auto adapter = make_adapter(w, {32, {}, scale});
    CHECK(adapter->hidden() == sh.hidden);
    CHECK(adapter->snapshot_dim() == sh.dim);
    CHECK(adapter->residual_scale() == scale);
    const std::vector<float> snap = random_snapshot(sh.dim, rng);
    const std::vector<double> ref = reference_delta(w, scale, snap);

    std::vector<float> d(sz(sh.hidden));
    REQUIRE(adapter->delta(snap, d).ok());
    double max_ref = 0.0, max_err = 0.0;
    for (std::size_t c = 0; c < d.size(); ++c) {
      max_ref = std::max(max_ref, std::abs(ref[c]));
      max_err = std::max(max_err, std::abs(static_cast<double>(d[c]) - ref[c]));
    }
    INFO("max error " << max_err << ", max |delta| " << max_ref);
    CHECK(max_err <= 1e-5 * max_ref);

    for (ActDType dtype : {ActDType::f32, ActDType::f16, ActDType::bf16}) {
      INFO("dtype " << clm::kv_dtype_name(dtype));
      const States before = random_states(dtype, sh.tokens, sh.hidden, rng);
      States after = before;
      REQUIRE(adapter->inject(after.view(), snap, 31).ok());
      check_rows(before, after, 0, sh.tokens, ref);
    }
  }
}

TEST_CASE("adapter: only the configured layers inject") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotAdapterWeights w = random_weights(32, 8, rng);
  const std::vector<float> snap = random_snapshot(8, rng);

  SECTION("an explicit list, in any order") {
    auto adapter = make_adapter(w, {10, {6, 1, 9}, 0.3f});
    CHECK(adapter->layers() == std::vector<std::int32_t>{1, 6, 9});
    CHECK(adapter->num_layers() == 10);
    const std::vector<double> ref = reference_delta(w, 0.3f, snap);
    for (std::int32_t layer = 0; layer < 10; ++layer) {
      const bool injects = layer == 1 || layer == 6 || layer == 9;
      INFO("layer " << layer);
      CHECK(adapter->injects_at(layer) == injects);
      for (ActDType dtype : {ActDType::f32, ActDType::bf16}) {
        const States before = random_states(dtype, 4, 32, rng);
        States after = before;
        REQUIRE(adapter->inject(after.view(), snap, layer).ok());
        if (injects) {
          check_rows(before, after, 0, 4, ref);
          CHECK(!(after == before));
        } else {
          CHECK(after == before);
        }
      }
    }
    CHECK(!adapter->injects_at(-1));
    CHECK(!adapter->injects_at(10));
  }
  SECTION("the default: the last three layers, clamped to num_layers") {
    CHECK(make_adapter(w, {32, {}, 0.3f})->layers() == std::vector<std::int32_t>{29, 30, 31});
    CHECK(make_adapter(w, {2, {}, 0.3f})->layers() == std::vector<std::int32_t>{0, 1});
    CHECK(make_adapter(w, {1, {}, 0.3f})->layers() == std::vector<std::int32_t>{0});
    auto adapter = make_adapter(w, {32, {}, 0.3f});
    for (std::int32_t layer = 0; layer < 32; ++layer) CHECK(adapter->injects_at(layer) == (layer >= 29));
  }
  SECTION("residual_scale 0 injects nothing but the rounding of +0") {
    auto adapter = make_adapter(w, {4, {3}, 0.0f});
    const States before = random_states(ActDType::f32, 3, 32, rng);
    States after = before;
    REQUIRE(adapter->inject(after.view(), snap, 3).ok());
    CHECK(after == before);
  }
}

TEST_CASE("adapter: the f16 snapshot overload equals the f32 one on the decoded snapshot") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotAdapterWeights w = random_weights(128, 32, rng);
  auto adapter = make_adapter(w, {4, {2}, 0.5f});
  const std::vector<float> snap = random_snapshot(32, rng);
  std::vector<std::uint16_t> half(snap.size());
  std::vector<float> decoded(snap.size());
  for (std::size_t i = 0; i < snap.size(); ++i) {
    half[i] = clm::detail::f32_to_f16(snap[i]);
    decoded[i] = clm::detail::f16_to_f32(half[i]);
  }
  for (ActDType dtype : {ActDType::f32, ActDType::f16, ActDType::bf16}) {
    const States before = random_states(dtype, 5, 128, rng);
    States a = before, b = before;
    REQUIRE(adapter->inject(a.view(), std::span<const std::uint16_t>(half), 2).ok());
    REQUIRE(adapter->inject(b.view(), std::span<const float>(decoded), 2).ok());
    CHECK(a == b);
    check_rows(before, a, 0, 5, reference_delta(w, 0.5f, decoded));
    check_rows(before, a, 0, 5, reference_delta(w, 0.5f, snap), 1e-2);  // the f16 snapshot's own rounding
  }
}

TEST_CASE("adapter: inject_batch equals per-sequence inject") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (auto [hidden, dim] : {std::pair{16, 4}, std::pair{256, 64}, std::pair{4096, 256}}) {
    INFO("hidden " << hidden << ", dim " << dim);
    const clm::SnapshotAdapterWeights w = random_weights(hidden, dim, rng);
    auto adapter = make_adapter(w, {6, {0, 4}, 0.3f});
    // Ragged, with an empty sequence and sequences left alone (one with a NaN
    // snapshot: it is not read).
    const std::vector<int> lengths = {3, 0, 5, 1, 4, 2};
    const std::vector<std::uint8_t> apply = {1, 1, 0, 1, 7, 0};
    std::vector<std::int32_t> indptr = {0};
    for (int len : lengths) indptr.push_back(indptr.back() + len);
    std::vector<float> snaps;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::vector<float> s = random_snapshot(dim, rng);
      snaps.insert(snaps.end(), s.begin(), s.end());
    }
    snaps[2 * sz(dim) + 1] = kNaN;
    for (ActDType dtype : {ActDType::f32, ActDType::f16, ActDType::bf16}) {
      INFO("dtype " << clm::kv_dtype_name(dtype));
      const States before = random_states(dtype, indptr.back(), hidden, rng);
      States batched = before, single = before;
      const clm::Status s = adapter->inject_batch(batched.view(), indptr, snaps, apply, 4);
      INFO(s.message());
      REQUIRE(s.ok());
      for (std::size_t b = 0; b < lengths.size(); ++b) {
        const std::int64_t r0 = indptr[b], r1 = indptr[b + 1];
        if (apply[b] == 0) {
          check_rows_unchanged(before, batched, r0, r1);
          continue;
        }
        const std::span<const float> sb = std::span<const float>(snaps).subspan(b * sz(dim), sz(dim));
        const std::size_t h = sz(hidden);
        clm::ActivationView rows = single.view();
        rows.data = static_cast<char*>(rows.data) + sz(r0) * h * clm::kv_dtype_bytes(dtype);
        rows.rows = r1 - r0;
        REQUIRE(adapter->inject(rows, sb, 4).ok());
        const std::vector<double> ref = reference_delta(w, 0.3f, sb);
        check_rows(before, batched, r0, r1, ref);
        // Batched (GEMM) and single (GEMV) deltas differ by f32 rounding at most
        // (then one storage ulp), relative to the row's scale.
        for (auto r = sz(r0); r < sz(r1); ++r) {
          double scale = 0.0;
          for (std::size_t c = 0; c < h; ++c) scale = std::max(scale, std::abs(single.at(r * h + c)));
          const double tol = dtype == ActDType::f32 ? 1e-6 : (dtype == ActDType::f16 ? 1e-3 : 8e-3);
          for (std::size_t c = 0; c < h; ++c) {
            REQUIRE(std::abs(batched.at(r * h + c) - single.at(r * h + c)) <= tol * scale);
          }
        }
      }
      // A layer that does not inject leaves everything alone.
      States gated = before;
      REQUIRE(adapter->inject_batch(gated.view(), indptr, snaps, apply, 3).ok());
      CHECK(gated == before);
    }
  }
  // batch 0 is valid
  const clm::SnapshotAdapterWeights w = random_weights(8, 2, rng);
  auto adapter = make_adapter(w, {2, {}, 0.3f});
  const std::vector<std::int32_t> zero = {0};
  CHECK(adapter->inject_batch(clm::ActivationView::f32({}, 0, 8), zero, {}, {}, 1).ok());
}

TEST_CASE("adapter: bad input gives invalid_argument and leaves the hidden states untouched") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotAdapterWeights w = random_weights(16, 4, rng);
  auto adapter = make_adapter(w, {8, {5, 7}, 0.3f});
  const std::vector<float> snap = random_snapshot(4, rng);
  const States base = random_states(ActDType::bf16, 6, 16, rng);
  const std::vector<std::int32_t> indptr = {0, 2, 6};
  std::vector<float> snaps = snap;
  snaps.insert(snaps.end(), snap.begin(), snap.end());
  const std::vector<std::uint8_t> apply = {1, 1};

  auto inject_refused = [&](std::span<const float> s, std::int32_t layer, std::int64_t rows = 6, int cols = 16) {
    States st = base;
    clm::ActivationView v = st.view();
    v.rows = rows;
    v.cols = cols;
    const clm::Status status = adapter->inject(v, s, layer);
    INFO(status.message());
    return status.code() == StatusCode::invalid_argument && !status.message().empty() && st == base;
  };
  auto batch_refused = [&](std::span<const std::int32_t> ip, std::span<const float> s, std::span<const std::uint8_t> ap,
                           std::int32_t layer) {
    States st = base;
    const clm::Status status = adapter->inject_batch(st.view(), ip, s, ap, layer);
    INFO(status.message());
    return status.code() == StatusCode::invalid_argument && !status.message().empty() && st == base;
  };

  // NaN / Inf snapshot, at an injecting layer and at one that does not inject
  for (float bad : {kNaN, kInf, -kInf}) {
    for (std::int32_t layer : {5, 2}) {
      std::vector<float> s = snap;
      s[2] = bad;
      INFO("bad " << bad << ", layer " << layer);
      CHECK(inject_refused(s, layer));
      std::vector<float> sb = snaps;
      sb[6] = bad;
      CHECK(batch_refused(indptr, sb, apply, layer));
      std::vector<float> d(16, -1.0f);
      require_invalid(adapter->delta(s, d));
      CHECK(d == std::vector<float>(16, -1.0f));
    }
  }
  {
    States st = base;
    std::vector<std::uint16_t> half = {0x3c00, 0x7e00, 0, 0};  // f16 NaN
    require_invalid(adapter->inject(st.view(), std::span<const std::uint16_t>(half), 5));
    half[1] = 0x7c00;  // +inf
    require_invalid(adapter->inject(st.view(), std::span<const std::uint16_t>(half), 5));
    require_invalid(adapter->inject(st.view(), std::span<const std::uint16_t>(half).first(3), 5));
    CHECK(st == base);
  }
  // sizes and layers
  CHECK(inject_refused(std::span<const float>(snap).first(3), 5));
  CHECK(inject_refused(std::vector<float>(5, 0.1f), 5));
  CHECK(inject_refused(snap, -1));
  CHECK(inject_refused(snap, 8));
  CHECK(inject_refused(snap, 5, 4, 24));  // cols != hidden
  CHECK(inject_refused(snap, 5, -1, 16));
  {
    States st = base;
    require_invalid(adapter->inject({nullptr, ActDType::f32, 2, 16}, snap, 5));
    require_invalid(adapter->inject({st.half.data(), static_cast<ActDType>(5), 6, 16}, snap, 5));
    CHECK(st == base);
  }
  std::vector<float> d(16, -1.0f);
  require_invalid(adapter->delta(std::span<const float>(snap).first(3), d));
  require_invalid(adapter->delta(snap, std::span<float>(d).first(15)));
  CHECK(d == std::vector<float>(16, -1.0f));
  // indptr, snapshots, apply
  CHECK(batch_refused({}, snaps, apply, 5));
  CHECK(batch_refused(std::vector<std::int32_t>{1, 2, 6}, snaps, apply, 5));
  CHECK(batch_refused(std::vector<std::int32_t>{0, 4, 2}, snaps, apply, 5));
  CHECK(batch_refused(std::vector<std::int32_t>{0, 2, 5}, snaps, apply, 5));
  CHECK(batch_refused(std::vector<std::int32_t>{0, 2, 7}, snaps, apply, 5));
  CHECK(batch_refused(std::vector<std::int32_t>{0, -1, 6}, snaps, apply, 5));
  CHECK(batch_refused(indptr, std::span<const float>(snaps).first(7), apply, 5));
  CHECK(batch_refused(indptr, snaps, std::vector<std::uint8_t>{1}, 5));
  CHECK(batch_refused(indptr, snaps, apply, 9));
  CHECK(batch_refused(indptr, snaps, apply, -2));
  // a delta that overflows f32
  clm::SnapshotAdapterWeights big = w;
  for (float& v : big.weight) v = 3.0e38f;
  auto big_adapter = make_adapter(big, {8, {5}, 1.0f});
  const std::vector<float> ones(4, 1.0f);
  States st = base;
  require_invalid(big_adapter->inject(st.view(), ones, 5));
  std::vector<float> ones2(8, 1.0f);
  require_invalid(big_adapter->inject_batch(st.view(), indptr, ones2, apply, 5));
  CHECK(st == base);
}

TEST_CASE("SnapshotAdapter::create refuses bad weights and configs") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotAdapterWeights good = random_weights(16, 4, rng);
  auto refused = [](clm::SnapshotAdapterWeights w, clm::SnapshotAdapterConfig c) {
    std::unique_ptr<clm::SnapshotAdapter> out;
    const clm::Status s = clm::SnapshotAdapter::create(std::move(w), std::move(c), out);
    INFO(s.message());
    return s.code() == StatusCode::invalid_argument && !s.message().empty() && !out;
  };
  const clm::SnapshotAdapterConfig cfg = {8, {}, 0.3f};
  auto with = [&](auto edit) {
    clm::SnapshotAdapterWeights w = good;
    edit(w);
    return w;
  };
  using W = clm::SnapshotAdapterWeights;
  CHECK(refused(with([](W& w) { w.hidden = 0; }), cfg));
  CHECK(refused(with([](W& w) { w.snapshot_dim = 0; }), cfg));
  CHECK(refused(with([](W& w) { w.snapshot_dim = 5; }), cfg));
  CHECK(refused(with([](W& w) { w.weight.pop_back(); }), cfg));
  CHECK(refused(with([](W& w) { w.bias.push_back(0.0f); }), cfg));
  CHECK(refused(with([](W& w) { w.weight[7] = kNaN; }), cfg));
  CHECK(refused(with([](W& w) { w.bias[0] = -kInf; }), cfg));
  CHECK(refused(good, {0, {}, 0.3f}));
  CHECK(refused(good, {-3, {}, 0.3f}));
  CHECK(refused(good, {8, {8}, 0.3f}));
  CHECK(refused(good, {8, {2, -1}, 0.3f}));
  CHECK(refused(good, {8, {3, 5, 3}, 0.3f}));
  CHECK(refused(good, {8, {}, kNaN}));
  CHECK(refused(good, {8, {}, kInf}));
  std::unique_ptr<clm::SnapshotAdapter> ok;
  CHECK(clm::SnapshotAdapter::create(good, {8, {0, 7}, -0.5f}, ok).ok());
}

TEST_CASE("snapshot adapter safetensors: round trip and a hand-built file") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotAdapterWeights w = random_weights(24, 6, rng);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("clm_test_snapshot_adapter_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  REQUIRE(clm::write_snapshot_adapter(path, w).ok());
  clm::SnapshotAdapterWeights back;
  const clm::Status rs = clm::read_snapshot_adapter(path, back);
  INFO(rs.message());
  REQUIRE(rs.ok());
  CHECK(same(back, w));
  std::filesystem::remove(path);
  clm::SnapshotAdapterWeights broken = w;
  broken.bias.pop_back();
  require_invalid(clm::write_snapshot_adapter(path, broken));
  CHECK(!std::filesystem::exists(path));
  CHECK(clm::read_snapshot_adapter(path, back).code() == StatusCode::io_error);

  // hidden 3, dim 2: weight BF16, bias F16, plus a tensor to ignore.
  const std::vector<float> weight = {1.0f, -0.5f, 0.25f, 2.0f, 0.0f, -3.0f};  // exact in bf16 and f16
  const std::vector<float> bias = {0.5f, -1.0f, 0.125f};
  std::vector<std::uint16_t> wb, bh;
  for (float v : weight) wb.push_back(clm::detail::f32_to_bf16(v));
  for (float v : bias) bh.push_back(clm::detail::f32_to_f16(v));
  const RawTensor tw = {"adapter.weight", "BF16", {3, 2}, raw_bytes(wb)};
  const RawTensor tb = {"adapter.bias", "F16", {3}, raw_bytes(bh)};
  const RawTensor other = {"snapshot.mean", "F32", {1}, raw_bytes(std::vector<float>{1.0f})};
  clm::SnapshotAdapterWeights hand;
  REQUIRE(read_bytes({other, tw, tb}, hand).ok());
  CHECK(hand.hidden == 3);
  CHECK(hand.snapshot_dim == 2);
  CHECK(hand.weight == weight);
  CHECK(hand.bias == bias);
  auto adapter = make_adapter(hand, {1, {}, 2.0f});
  std::vector<float> d(3);
  REQUIRE(adapter->delta(std::vector<float>{1.0f, 2.0f}, d).ok());
  CHECK(d ==
        std::vector<float>{2.0f * (1.0f - 1.0f + 0.5f), 2.0f * (0.25f + 4.0f - 1.0f), 2.0f * (0.0f - 6.0f + 0.125f)});

  // bad files
  clm::SnapshotAdapterWeights sentinel;
  sentinel.hidden = 77;
  auto refused = [&](const std::vector<RawTensor>& tensors, const std::string& mentions) {
    clm::SnapshotAdapterWeights out = sentinel;
    const clm::Status s = read_bytes(tensors, out);
    INFO(s.code_name() << ": " << s.message());
    return s.code() == StatusCode::invalid_argument && s.message().find(mentions) != std::string::npos &&
           same(out, sentinel);
  };
  CHECK(refused({tb}, "adapter.weight"));
  CHECK(refused({tw}, "adapter.bias"));
  CHECK(refused({{"adapter.weight", "F64", {3, 2}, raw_bytes(std::vector<double>(6, 1.0))}, tb}, "F64"));
  CHECK(refused({tw, {"adapter.bias", "I16", {3}, raw_bytes(std::vector<std::int16_t>(3, 1))}}, "I16"));
  CHECK(refused({{"adapter.weight", "BF16", {6}, raw_bytes(wb)}, tb}, "adapter.weight"));
  CHECK(refused({{"adapter.weight", "BF16", {1, 3, 2}, raw_bytes(wb)}, tb}, "adapter.weight"));
  CHECK(refused({{"adapter.weight", "BF16", {2, 3}, raw_bytes(wb)}, tb}, "adapter.bias"));  // bias [3] != hidden 2
  CHECK(refused({tw, {"adapter.bias", "F16", {1, 3}, raw_bytes(bh)}}, "adapter.bias"));
  CHECK(refused({{"adapter.weight", "F32", {0, 2}, {}}, {"adapter.bias", "F32", {0}, {}}}, "adapter.weight"));
  std::vector<std::uint16_t> nan_w = wb;
  nan_w[4] = 0x7fc0;  // bf16 NaN
  CHECK(refused({{"adapter.weight", "BF16", {3, 2}, raw_bytes(nan_w)}, tb}, "adapter.weight"));
  std::vector<std::uint16_t> inf_b = bh;
  inf_b[2] = 0xfc00;  // f16 -inf
  CHECK(refused({tw, {"adapter.bias", "F16", {3}, raw_bytes(inf_b)}}, "adapter.bias"));
}
