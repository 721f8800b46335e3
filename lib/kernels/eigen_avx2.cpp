// The CLM parts' dense math (lib/kernels/eigen_avx2.hpp) through Eigen built for
// AVX2 + FMA, in a library that must still run on any x86-64.
//
// How, and why this way: the file is compiled with the library's generic flags,
// and only the region that includes Eigen is switched to AVX2 + FMA by a
// target pragma. GCC's pragma does not define __AVX2__ / __FMA__, which Eigen
// reads to choose its packet size, so they are defined by hand for that
// region. Eigen's namespace is renamed (ClmEigenAvx2) so that none of these
// AVX2 instantiations can merge, at link time, with the generic ones of the
// same templates elsewhere (an ODR merge could run AVX2 code on a CPU without
// it). Every standard header Eigen uses is included first, outside the region,
// so no std:: inline function is compiled for AVX2; the test
// eigen_avx2_isolation (tests/check_eigen_avx2_isolation.sh) checks the object. Callers check
// eigen_avx2_usable() first.
#include "eigen_avx2.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__)
#define CLM_EIGEN_AVX2 1
#else
#define CLM_EIGEN_AVX2 0
#endif

#if CLM_EIGEN_AVX2

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iosfwd>
#include <limits>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>  // (Eigen's Parallelizer.h includes these three)

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define __SSE3__ 1
#define __SSSE3__ 1
#define __SSE4_1__ 1
#define __SSE4_2__ 1
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define Eigen ClmEigenAvx2
#include "dense_kernels.hpp"
#undef Eigen
#undef __SSE3__
#undef __SSSE3__
#undef __SSE4_1__
#undef __SSE4_2__
#undef __AVX__
#undef __AVX2__
#undef __FMA__

namespace clm::detail {

static_assert(ClmEigenAvx2::internal::packet_traits<float>::size == 8, "Eigen did not take the AVX path");

void gemm_nt_avx2(const float* a, std::int64_t m, std::int64_t k, const float* b, std::int64_t n, float* c,
                  std::int64_t ldc) {
  gemm_nt_eigen(a, m, k, b, n, c, ldc);
}

void src_head_pooled_logits_avx2(const float* means, std::int64_t batch, std::int32_t hidden, const float* w1,
                                 const float* b1, const float* w2, float b2, bool tanh_gelu, float* logits) {
  src_head_pooled_logits(means, batch, hidden, w1, b1, w2, b2, tanh_gelu, logits);
}

}  // namespace clm::detail

#pragma GCC pop_options

namespace clm::detail {

bool eigen_avx2_usable() {
  static const bool usable = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return usable;
}

}  // namespace clm::detail

#else  // no separate AVX2 build: the generic path is used (or the whole build is AVX2 already)

// Never called (eigen_avx2_usable() is false), but referenced: a compiler
// that does not fold the check away (clang at -O1) still links.
namespace clm::detail {
bool eigen_avx2_usable() { return false; }
void gemm_nt_avx2(const float*, std::int64_t, std::int64_t, const float*, std::int64_t, float*, std::int64_t) {}
void src_head_pooled_logits_avx2(const float*, std::int64_t, std::int32_t, const float*, const float*, const float*,
                                 float, bool, float*) {}
}  // namespace clm::detail

#endif
