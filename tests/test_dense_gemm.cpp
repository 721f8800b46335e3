// clm::gemm_nt (clm/kernels/dense_gemm.hpp), unpacked and packed, against a float64
// reference on fresh random shapes and data, for every ISA this machine has;
// the packed form's promise that a row of c never depends on the other rows
// of a (bit for bit), and that no column outside the asked range is written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "clm/detail/attention_cpu.hpp"
#include "clm/kernels/dense_gemm.hpp"
#include "test_support.hpp"

namespace {

using clm::PackedWeight;
using clm::detail::CpuIsa;

struct Rng {
  std::mt19937 gen;
  explicit Rng(std::uint32_t seed) : gen(seed) {}
  int range(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  std::vector<float> vec(std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
    return v;
  }
};

struct IsaGuard {
  ~IsaGuard() { (void)clm::detail::set_cpu_isa(clm::detail::cpu_isa_best()); }
};

// |c - a.b| within f32 summation error: k roundings, each at most eps of the
// running magnitude, bounded by sum |a_i b_i|.
void check_against_reference(const std::vector<float>& a, std::int64_t m, std::int64_t k, const std::vector<float>& b,
                             std::int64_t n, const std::vector<float>& c, std::int64_t ldc, std::int64_t begin,
                             std::int64_t end, float sentinel) {
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float got = c[static_cast<std::size_t>(r * ldc + j)];
      if (j < begin || j >= end) {
        REQUIRE(got == sentinel);  // never written
        continue;
      }
      double exact = 0, magnitude = 0;
      for (std::int64_t i = 0; i < k; ++i) {
        const double p = double(a[static_cast<std::size_t>(r * k + i)]) * b[static_cast<std::size_t>(j * k + i)];
        exact += p;
        magnitude += std::fabs(p);
      }
      INFO("row " << r << " column " << j << " of " << n);
      REQUIRE(std::fabs(got - exact) <= double(k + 1) * eps * magnitude + 1e-30);
    }
  }
}

}  // namespace

TEST_CASE("gemm_nt: unpacked, with and without ldc, against float64", "[dense_gemm]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const std::int64_t m = rng.range(1, 40), k = rng.range(1, 200), n = rng.range(1, 70), pad = rng.range(0, 5);
    const auto a = rng.vec(static_cast<std::size_t>(m * k)), b = rng.vec(static_cast<std::size_t>(n * k));
    const float sentinel = 1234.5f;
    std::vector<float> c(static_cast<std::size_t>(m * (n + pad)), sentinel);
    if (pad == 0) {
      clm::gemm_nt(a.data(), m, k, b.data(), n, c.data());
    } else {
      clm::gemm_nt(a.data(), m, k, b.data(), n, c.data(), n + pad);
    }
    check_against_reference(a, m, k, b, n, c, n + pad, 0, n, sentinel);
  }
}

TEST_CASE("gemm_nt: packed weights, every ISA, column ranges and ldc, against float64", "[dense_gemm]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  IsaGuard guard;
  for (CpuIsa isa : clm_test::cpu_isas()) {
    REQUIRE(clm::detail::set_cpu_isa(isa).ok());
    INFO("isa " << clm::detail::cpu_isa_name(isa));
    for (int trial = 0; trial < 60; ++trial) {
      // Row counts around the 6-row block, column counts around the 16-column panel.
      const std::int64_t m = trial % 3 == 0 ? rng.range(1, 7) : rng.range(1, 70);
      const std::int64_t n = trial % 2 == 0 ? rng.range(1, 40) : rng.range(15, 17) * rng.range(1, 3);
      const std::int64_t k = rng.range(1, 300), pad = rng.range(0, 9);
      const auto a = rng.vec(static_cast<std::size_t>(m * k)), b = rng.vec(static_cast<std::size_t>(n * k));
      const PackedWeight packed(b.data(), n, k);
      REQUIRE(packed.n() == n);
      REQUIRE(packed.k() == k);
      REQUIRE(packed.panels() == (n + 15) / 16);
      // The layout: panel p holds rows p * 16 .. of b, k-major, zeros past n.
      for (std::int64_t j = 0; j < packed.panels() * PackedWeight::kPanel; ++j) {
        const std::int64_t i = rng.range(0, static_cast<int>(k - 1));
        const float stored = packed.panel(j / 16)[i * 16 + j % 16];
        REQUIRE(stored == (j < n ? b[static_cast<std::size_t>(j * k + i)] : 0.0f));
      }
      const float sentinel = -777.25f;
      const std::int64_t ldc = n + pad;
      std::vector<float> c(static_cast<std::size_t>(m * ldc), sentinel);
      std::int64_t begin = 0, end = n;
      if (trial % 4 == 1) {  // an arbitrary range, not aligned to panels
        begin = rng.range(0, static_cast<int>(n - 1));
        end = rng.range(static_cast<int>(begin + 1), static_cast<int>(n));
      }
      if (begin == 0 && end == n && trial % 2 == 0) {
        clm::gemm_nt(a.data(), m, packed, c.data(), ldc);  // end = -1: all of b
      } else {
        clm::gemm_nt(a.data(), m, packed, c.data(), ldc, begin, end);
      }
      check_against_reference(a, m, k, b, n, c, ldc, begin, end, sentinel);
    }
  }
}

TEST_CASE("gemm_nt: packed, a row of c is the same bit for bit alone, in any batch and any column split",
          "[dense_gemm]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  IsaGuard guard;
  for (CpuIsa isa : clm_test::cpu_isas()) {
    REQUIRE(clm::detail::set_cpu_isa(isa).ok());
    for (int trial = 0; trial < 10; ++trial) {
      const std::int64_t m = rng.range(2, 50), k = rng.range(16, 600), n = rng.range(17, 300);
      const auto a = rng.vec(static_cast<std::size_t>(m * k)), b = rng.vec(static_cast<std::size_t>(n * k));
      const PackedWeight packed(b.data(), n, k);
      std::vector<float> batch(static_cast<std::size_t>(m * n));
      clm::gemm_nt(a.data(), m, packed, batch.data(), n);
      // Columns split in two at a random panel, as threads do.
      const std::int64_t split = 16 * rng.range(0, static_cast<int>((n - 1) / 16));
      std::vector<float> halves(batch.size());
      clm::gemm_nt(a.data(), m, packed, halves.data(), n, 0, split);
      clm::gemm_nt(a.data(), m, packed, halves.data(), n, split, n);
      REQUIRE(halves == batch);
      for (std::int64_t r = 0; r < m; ++r) {
        std::vector<float> alone(static_cast<std::size_t>(n));
        clm::gemm_nt(a.data() + r * k, 1, packed, alone.data(), n);
        INFO("row " << r << " of " << m);
        REQUIRE(std::equal(alone.begin(), alone.end(), batch.begin() + r * n));
      }
    }
  }
}

TEST_CASE("gemm_nt: packed, nothing to do writes nothing", "[dense_gemm]") {
  const std::vector<float> b(16 * 8, 1.0f), a(8, 1.0f);
  const PackedWeight packed(b.data(), 16, 8);
  std::vector<float> c(16, -1.0f);
  clm::gemm_nt(a.data(), 0, packed, c.data(), 16);        // no rows
  clm::gemm_nt(a.data(), 1, packed, c.data(), 16, 5, 5);  // an empty range
  REQUIRE(std::all_of(c.begin(), c.end(), [](float x) { return x == -1.0f; }));
  const PackedWeight empty;
  REQUIRE(empty.n() == 0);
  REQUIRE(empty.panels() == 0);
  clm::gemm_nt(a.data(), 1, empty, c.data(), 16);
  REQUIRE(std::all_of(c.begin(), c.end(), [](float x) { return x == -1.0f; }));
}
