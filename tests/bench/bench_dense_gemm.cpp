// bench_dense_gemm: clm::gemm_nt's packed form (clm::PackedWeight) against the
// unpacked form, the library's Eigen GEMM built for AVX2 + FMA, in the same
// run, one thread, on a decoder layer's shapes:
//   dense_gemm/<m>x<k>x<n>   c [m][n] = a [m][k] * w [n][k]^T for m rows of a
//                            (1: decode; 8: batched decode; 13 and 64: a
//                            cached prefix's new tokens, a short turn and a
//                            typical one; 512, 2048: full prefills),
//                            w cycling through 24 distinct weights (~69 MB for
//                            512 x 1408), so that they come from memory as a
//                            model's layers do, not from cache.
//   value: GFLOP/s (2 m n k per product); baseline: Eigen's, same inputs.
// Medians of 5 interleaved runs. CLM_BENCH_SMOKE=1: small sizes, 1 run.
#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_common.hpp"
#include "clm/kernels/dense_gemm.hpp"

namespace {

using namespace clm_bench;

void bench_shape(std::int64_t m, std::int64_t k, std::int64_t n, int weights, int runs, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> w(static_cast<std::size_t>(weights));
  std::vector<clm::PackedWeight> packed;
  for (auto& one : w) {
    one.resize(static_cast<std::size_t>(n * k));
    for (float& x : one) x = normal(rng);
    packed.emplace_back(one.data(), n, k);
  }
  std::vector<float> a(static_cast<std::size_t>(m * k)), c(static_cast<std::size_t>(m * n));
  for (float& x : a) x = normal(rng);
  // Enough products for ~20 ms of work at 50 GFLOP/s, at least one pass over the weights.
  const std::int64_t calls =
      std::max<std::int64_t>(weights, static_cast<std::int64_t>(1e9 / (2.0 * double(m * n * k))));
  const auto packed_pass = [&] {
    const auto start = Clock::now();
    for (std::int64_t i = 0; i < calls; ++i)
      clm::gemm_nt(a.data(), m, packed[static_cast<std::size_t>(i % weights)], c.data(), n);
    return seconds_since(start);
  };
  const auto eigen_pass = [&] {
    const auto start = Clock::now();
    for (std::int64_t i = 0; i < calls; ++i) {
      clm::gemm_nt(a.data(), m, k, w[static_cast<std::size_t>(i % weights)].data(), n, c.data());
    }
    return seconds_since(start);
  };
  const PairedMedians t = interleaved_medians(runs, packed_pass, eigen_pass);
  const double flops = 2.0 * double(m) * double(n) * double(k) * double(calls);
  print_figure("dense_gemm", fmt::format("{}x{}x{}", m, k, n), "packed_GFLOP_per_s", flops / t.part / 1e9, "GFLOP/s",
               "eigen_GFLOP_per_s", flops / t.baseline / 1e9);
}

}  // namespace

int main() {
  const bool smoke = clm_bench::smoke_run();
  std::mt19937 rng(2024);
  const int runs = smoke ? 1 : 5, weights = smoke ? 2 : 24;
  const std::vector<std::int64_t> rows =
      smoke ? std::vector<std::int64_t>{1, 7} : std::vector<std::int64_t>{1, 8, 13, 64, 512, 2048};
  // The tiny_llama default layer: 512 -> 1408 (an MLP's up), 1408 -> 512 (its down).
  for (const auto& [k, n] : {std::pair<std::int64_t, std::int64_t>{512, 1408}, {1408, 512}}) {
    for (std::int64_t m : rows) bench_shape(m, smoke ? k / 8 : k, smoke ? n / 8 : n, weights, runs, rng);
  }
  return 0;
}
