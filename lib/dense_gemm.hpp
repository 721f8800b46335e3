// lib/dense_gemm.hpp (internal): C = A B^T in f32 for the CLM parts (snapshot
// projection and adapter), through Eigen built for AVX2 + FMA when the CPU has
// them (eigen_avx2.cpp), else the library's generic Eigen build.
#pragma once

#include <cstdint>

namespace clm::detail {

// c [m][n] = a [m][k] * b [n][k]^T, all row-major and dense; m == 1 is a GEMV
// over b's rows. c must not overlap a or b.
void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c);

}  // namespace clm::detail
