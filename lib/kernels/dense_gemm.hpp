// lib/kernels/dense_gemm.hpp (internal): the library's own C = A B^T is the public
// clm::gemm_nt (clm/kernels/dense_gemm.hpp); the CLM parts call it by this name.
#pragma once

#include "clm/kernels/dense_gemm.hpp"

namespace clm::detail {

using ::clm::gemm_nt;

}  // namespace clm::detail
