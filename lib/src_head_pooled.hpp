// lib/src_head_pooled.hpp (internal): the SRC head on pooled means, as one
// Eigen template included by two translation units: src_head.cpp (the
// library's generic flags) and eigen_avx2.cpp (Eigen renamed and
// built for AVX2 + FMA). The anonymous namespace gives each its own copy, so
// the two builds never merge at link time. Include after <Eigen/Core> and
// <unsupported/Eigen/SpecialFunctions> (for erf).
#pragma once

#include <cmath>
#include <cstdint>

namespace clm::detail {
namespace {

// logits[b] = w2 . GELU(W1 means[b] + b1) + b2 for b < batch (all row-major).
// tanh_gelu: the tanh form; else the exact erf form. Both vectorised by Eigen
// (its float erf and tanh are accurate to a few ulp).
template <int Unused = 0>
void src_head_pooled_logits(const float* means, std::int64_t batch, std::int32_t hidden, const float* w1,
                            const float* b1, const float* w2, float b2, bool tanh_gelu, float* logits) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowArray = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int32_t inner = hidden / 4;
  const Eigen::Map<const RowMatrix> w(w1, inner, hidden);
  const Eigen::Map<const Eigen::RowVectorXf> bias(b1, inner);
  const Eigen::Map<const Eigen::VectorXf> out_w(w2, inner);
  RowMatrix z(batch, inner);
  if (batch == 1) {  // one decode step of one sequence: a GEMV, bound by reading W1
    const Eigen::Map<const Eigen::VectorXf> x(means, hidden);
    z.row(0).noalias() = (w * x).transpose();
  } else {
    const Eigen::Map<const RowMatrix> x(means, batch, hidden);
    z.noalias() = x * w.transpose();
  }
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
