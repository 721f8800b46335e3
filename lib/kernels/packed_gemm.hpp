// lib/kernels/packed_gemm.hpp (internal): the micro-kernels of clm::gemm_nt's packed
// form (clm/kernels/dense_gemm.hpp). A micro-kernel computes `rows` (1 to
// kPackedRowBlock) rows of a against one panel of b (kPanel columns), over
// all of k, and writes the panel's columns [from, to) (0 <= from < to <=
// kPanel) to c + from, c being the panel's first column. `prefetch`, when
// not null, is a panel the caller will need next: the micro-kernel asks for
// one of its cache lines into L2 per step of k (a panel has one line per
// step), so that reading it from memory overlaps this panel's arithmetic.
// lib/kernels/packed_gemm.cpp drives them.
#pragma once

#include <cstdint>

#include "clm/kernels/dense_gemm.hpp"

namespace clm::detail {

inline constexpr int kPackedRowBlock = 6;

using PackedMicroKernel = void (*)(const float* a, std::int64_t lda, int rows, const float* panel, std::int64_t k,
                                   float* c, std::int64_t ldc, int from, int to, const float* prefetch);

// AVX2 + FMA (lib/kernels/packed_gemm_avx2.cpp); call only where the CPU has them.
void packed_gemm_nt_avx2(const float* a, std::int64_t lda, int rows, const float* panel, std::int64_t k, float* c,
                         std::int64_t ldc, int from, int to, const float* prefetch);

}  // namespace clm::detail
