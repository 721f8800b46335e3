// The AVX2 + FMA micro-kernel of clm::gemm_nt's packed form (lib/kernels/packed_gemm.hpp).
//
// Compiled for that target through a target pragma, like attention_cpu_avx2.cpp:
// nothing outside this region is built for AVX2, and the driver calls in only
// after the CPU said it has AVX2 and FMA.
//
// rows x 16 outputs live in 2 * rows ymm registers (12 at 6 rows). Per step of
// k: two loads of the panel (16 floats, contiguous), one broadcast per row of
// a, two FMAs per row. The accumulators are only ever touched in fully
// unrolled loops, so the compiler keeps them in registers (a loop it cannot
// unroll makes GCC spill all twelve to the stack on every step, at a quarter
// of the speed).
#include "packed_gemm.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#include <cstring>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace clm::detail {
namespace {

template <int R, bool kPrefetch>
void micro_kernel(const float* a, std::int64_t lda, const float* panel, std::int64_t k, float* c, std::int64_t ldc,
                  int from, int to, const float* prefetch) {
  static_assert(PackedWeight::kPanel == 16, "two ymm registers per row, one cache line per step of k");
  __m256 lo[R], hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < k; ++i) {
    if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(prefetch + i * 16), _MM_HINT_T1);
    const __m256 w_lo = _mm256_loadu_ps(panel + i * 16), w_hi = _mm256_loadu_ps(panel + i * 16 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * lda + i);
      lo[r] = _mm256_fmadd_ps(x, w_lo, lo[r]);
      hi[r] = _mm256_fmadd_ps(x, w_hi, hi[r]);
    }
  }
  if (from == 0 && to == 16) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(c + r * ldc, lo[r]);
      _mm256_storeu_ps(c + r * ldc + 8, hi[r]);
    }
    return;
  }
  alignas(32) float tail[R][16];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(tail[r], lo[r]);
    _mm256_store_ps(tail[r] + 8, hi[r]);
  }
  for (int r = 0; r < R; ++r) {
    std::memcpy(c + r * ldc + from, tail[r] + from, static_cast<std::size_t>(to - from) * sizeof(float));
  }
}

}  // namespace

void packed_gemm_nt_avx2(const float* a, std::int64_t lda, int rows, const float* panel, std::int64_t k, float* c,
                         std::int64_t ldc, int from, int to, const float* prefetch) {
  using Kernel =
      void (*)(const float*, std::int64_t, const float*, std::int64_t, float*, std::int64_t, int, int, const float*);
  static constexpr Kernel kByRows[2][kPackedRowBlock] = {
      {&micro_kernel<1, false>, &micro_kernel<2, false>, &micro_kernel<3, false>, &micro_kernel<4, false>,
       &micro_kernel<5, false>, &micro_kernel<6, false>},
      {&micro_kernel<1, true>, &micro_kernel<2, true>, &micro_kernel<3, true>, &micro_kernel<4, true>,
       &micro_kernel<5, true>, &micro_kernel<6, true>}};
  kByRows[prefetch != nullptr][rows - 1](a, lda, panel, k, c, ldc, from, to, prefetch);
}

}  // namespace clm::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
