// lib/kernels/eigen_avx2.hpp (internal): the CLM parts' dense math built a second time,
// with Eigen compiled for AVX2 + FMA (eigen_avx2.cpp), for callers to pick at
// run time: the SRC head on pooled means (src_head.cpp), and C = A B^T for the
// snapshot projection and adapter (dense_gemm.hpp).
#pragma once

#include <cstdint>

namespace clm::detail {

// Whether the AVX2 build exists and this CPU runs it.
bool eigen_avx2_usable();

// c [m][n] = a [m][k] * b [n][k]^T, all row-major (m == 1: a GEMV over b's rows).
void gemm_nt_avx2(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
                  std::int64_t ldc);

// src_head_pooled_logits (dense_kernels.hpp) built for AVX2 + FMA.
void src_head_pooled_logits_avx2(const float* means, std::int64_t batch, std::int32_t hidden, const float* w1,
                                 const float* b1, const float* w2, float b2, bool tanh_gelu, float* logits);

}  // namespace clm::detail
