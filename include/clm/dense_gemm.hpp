// clm/dense_gemm.hpp: C = A B^T in f32, the product of a layer's activations
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
// All arrays are row-major and dense; c must not overlap a or b. Sizes are not
// checked beyond what the pointers say: the caller owns the shapes.
#pragma once

#include <cstdint>

namespace clm {

// c [m][n] = a [m][k] * b [n][k]^T; m == 1 is a GEMV over b's rows.
void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c);
// The same with c's rows `ldc` floats apart (ldc >= n).
void gemm_nt(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
             std::int64_t ldc);

}  // namespace clm
