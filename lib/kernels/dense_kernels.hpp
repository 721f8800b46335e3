// lib/kernels/dense_kernels.hpp (internal): the CLM parts' dense math, written once
// as Eigen templates and compiled twice: by dense_gemm.cpp and src_head.cpp
// with the library's generic flags, and by eigen_avx2.cpp with Eigen renamed
// and built for AVX2 + FMA. The anonymous namespace gives each translation unit
// its own copy, so the two builds never merge at link time.
#pragma once

#include <cmath>
#include <cstdint>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // erf

namespace clm::detail {
namespace {

// c [m][n] = a [m][k] * b [n][k]^T, all row-major; m == 1 is a GEMV over b's
// rows (a decode step: bound by reading b).
template <int Unused = 0>
void gemm_nt_eigen(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
                   std::int64_t ldc) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrix> bm(b, n, k);
  if (m == 1) {
    const Eigen::Map<const Eigen::VectorXf> x(a, k);
    Eigen::Map<Eigen::VectorXf> out(c, n);
    out.noalias() = bm * x;
    return;
  }
  const Eigen::Map<const RowMatrix> am(a, m, k);
  Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>> out(c, m, n, Eigen::OuterStride<>(ldc));
  out.noalias() = am * bm.transpose();
}

// logits[b] = w2 . GELU(W1 means[b] + b1) + b2 for b < batch (all row-major).
// tanh_gelu: the tanh form; else the exact erf form. Both vectorised by Eigen
// (its float erf and tanh are accurate to a few ulp).
template <int Unused = 0>
void src_head_pooled_logits(const float* means, std::int64_t batch, std::int32_t hidden, const float* w1,
                            const float* b1, const float* w2, float b2, bool tanh_gelu, float* logits) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowArray = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int32_t inner = hidden / 4;
  const Eigen::Map<const Eigen::RowVectorXf> bias(b1, inner);
  const Eigen::Map<const Eigen::VectorXf> out_w(w2, inner);
  RowMatrix z(batch, inner);
  gemm_nt_eigen(means, batch, hidden, w1, inner, z.data(), inner);
  z.rowwise() += bias;
  RowArray g(batch, inner);
  if (tanh_gelu) {
    constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const auto x = z.array();
    g = 0.5f * x * (1.0f + (k * (x + 0.044715f * x.cube())).tanh());
  } else {
    constexpr float inv_sqrt2 = 0.7071067811865476f;
    const auto x = z.array();
    g = 0.5f * x * (1.0f + (x * inv_sqrt2).erf());
  }
  Eigen::Map<Eigen::VectorXf> out(logits, batch);
  out.noalias() = g.matrix() * out_w;
  out.array() += b2;
}

}  // namespace
}  // namespace clm::detail
