// C = A B^T for the CLM parts (lib/dense_gemm.hpp): the AVX2 + FMA build when
// the CPU runs it, else Eigen with the library's generic flags.
#include "dense_gemm.hpp"

#include <Eigen/Core>

#include "eigen_avx2.hpp"

namespace clm::detail {

void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c) {
  if (eigen_avx2_usable()) {
    gemm_nt_avx2(a, m, k, b, n, c);
    return;
  }
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrix> bm(b, n, k);
  if (m == 1) {
    const Eigen::Map<const Eigen::VectorXf> x(a, k);
    Eigen::Map<Eigen::VectorXf> out(c, n);
    out.noalias() = bm * x;
    return;
  }
  const Eigen::Map<const RowMatrix> am(a, m, k);
  Eigen::Map<RowMatrix> out(c, m, n);
  out.noalias() = am * bm.transpose();
}

}  // namespace clm::detail
