// tests/bench/read_pass.hpp: the memory-read baseline of the CPU benches
// (bench_kernels, bench_clm; both built with -mavx2): the sum of n floats,
// read with four independent AVX2 accumulators so the loads, not the adds,
// set the pace. The caller keeps the sum, so the read cannot be optimised away.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <numeric>

namespace clm_bench {

inline float read_pass(const float* p, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = std::accumulate(lanes, lanes + 8, 0.0f);
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace clm_bench
