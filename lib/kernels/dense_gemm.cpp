// C = A B^T (clm/kernels/dense_gemm.hpp): the AVX2 + FMA build when
// the CPU runs it, else Eigen with the library's generic flags.
#include "dense_gemm.hpp"

#include "dense_kernels.hpp"
#include "eigen_avx2.hpp"

namespace clm {

void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
             std::int64_t ldc) {
  if (detail::eigen_avx2_usable()) {
    detail::gemm_nt_avx2(a, m, k, b, n, c, ldc);
    return;
  }
  detail::gemm_nt_eigen(a, m, k, b, n, c, ldc);
}

void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c) {
  gemm_nt(a, m, k, b, n, c, n);
}

}  // namespace clm
