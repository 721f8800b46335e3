// tests/gpu/gpu_test_support.hpp: what the GPU test programs share
// (test_cuda_kernels.cpp, test_cuda_clm.cpp, and their *_emulated builds):
//
//   if (skip_without_gpu()) return;   // prints "SKIPPED (no usable CUDA device: ...)"
//   CLM_CUDA_OK(cudaMemcpy(...));      // a CUDA runtime call that must succeed
//   kFull                              // full shapes on a GPU; small ones on the emulator
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <iostream>
#include <string>

#include "clm/device_memory.hpp"

namespace clm_test {

#ifdef CLM_TEST_EMULATED_GPU
inline constexpr bool kFull = false;
#else
inline constexpr bool kFull = true;
#endif

// True (after saying why) where no usable CUDA device is present.
inline bool skip_without_gpu() {
  std::string reason;
  if (clm::cuda_device_count(&reason) > 0) return false;
  std::cout << "SKIPPED (no usable CUDA device: " << reason << ")\n";
  return true;
}

}  // namespace clm_test

#define CLM_CUDA_OK(call) REQUIRE((call) == cudaSuccess)
