// clm/kernels/dense_gemm.hpp: C = A B^T in f32, the product of a layer's activations
// and its weights stored [out][in] (Hugging Face's nn.Linear layout). It is
// what the CLM parts run on, offered to hosts whose own layers are small
// (examples/tiny_llama): Eigen built for AVX2 + FMA when the CPU has them,
// else the library's generic Eigen build. One thread per call; a host that
// wants more splits the rows of A, or the rows of B (columns of C, written
// in place through `ldc`), between its threads.
//
//   // y [tokens][out] = x [tokens][in] * w [out][in]^T
//   clm::gemm_nt(x.data(), tokens, in, w.data(), out, y.data());
//   // columns [j0, j1) of y only: w's rows j0 .. j1-1, y's row stride `out`
//   clm::gemm_nt(x.data(), tokens, in, w.data() + j0 * in, j1 - j0, y.data() + j0, out);
//
// A weight used for many products is better packed once (PackedWeight):
// the product then streams it in order, fetching the next panels while it
// computes, and never repacks it: 1.2-2x the Eigen path's speed with 8 to 64
// rows (a cached prefix's new tokens, a decode batch), about the same with
// hundreds to thousands, one row bound by memory either way (docs/kernels.md).
//
//   clm::PackedWeight w_packed(w.data(), out, in);       // once, at load time
//   clm::gemm_nt(x.data(), tokens, w_packed, y.data(), out);
//   // columns [j0, j1) only (threads best take whole panels of kPanel columns)
//   clm::gemm_nt(x.data(), tokens, w_packed, y.data(), out, j0, j1);
//
// All arrays are row-major and dense; c must not overlap a or b. Sizes are not
// checked beyond what the pointers say: the caller owns the shapes.
#pragma once

#include <cstdint>
#include <vector>

namespace clm {

// c [m][n] = a [m][k] * b [n][k]^T; m == 1 is a GEMV over b's rows.
void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c);
// The same with c's rows `ldc` floats apart (ldc >= n).
void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
             std::int64_t ldc);

// b [n][k] laid out for gemm_nt's packed form: panels of kPanel rows of b
// (the last one zero-padded), each stored k-major, panel after panel.
// Every element of c is then summed over k in order, one fused multiply-add
// at a time, whatever the number of rows of a and whichever columns are
// asked: a row of c is the same, bit for bit, alone or in any batch (a
// prefix cache that recomputes only new rows changes no bit of the others).
class PackedWeight {
 public:
  static constexpr std::int64_t kPanel = 16;

  PackedWeight() = default;
  // Copies b [n][k] (n, k > 0) into the packed layout.
  PackedWeight(const float* b, std::int64_t n, std::int64_t k);

  std::int64_t n() const { return n_; }
  std::int64_t k() const { return k_; }
  std::int64_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  // Panel p: [k][kPanel] floats, rows p * kPanel .. of b.
  const float* panel(std::int64_t p) const { return data_.data() + p * k_ * kPanel; }
  std::size_t bytes() const { return data_.size() * sizeof(float); }

 private:
  std::int64_t n_ = 0, k_ = 0;
  std::vector<float> data_;
};

// c [m][j] = sum over i of a [m][i] * b [j][i], for columns j in [begin, end)
// (end = -1: b.n()); c's rows are `ldc` floats apart (ldc >= end), and no
// other column of c is written. a is [m][b.k()]. Single-threaded; AVX2 + FMA
// when the CPU has them.
void gemm_nt(const float* a, std::int64_t m, const PackedWeight& b, float* c, std::int64_t ldc, std::int64_t begin = 0,
             std::int64_t end = -1);

}  // namespace clm
