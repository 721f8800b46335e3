// tests/gpu/gpu_test_support.hpp: what the GPU test programs share
// (test_cuda_kernels.cpp, test_cuda_clm.cpp, test_cuda_llama.cpp and their
// *_emulated builds):
//
//   if (skip_without_gpu()) return;   // prints "SKIPPED (no usable CUDA device: ...)"
//   CLM_CUDA_OK(cudaMemcpy(...));      // a CUDA runtime call that must succeed
//   kFull                              // full shapes on a GPU; small on the emulator or with CLM_GPU_TEST_SMALL=1
//   REQUIRE_OK(status); REQUIRE_ERROR(status, StatusCode::invalid_argument, "part of the message");
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "clm/device/device_memory.hpp"
#include "clm/status.hpp"

namespace clm_test {

// Small shapes on the emulator, and on a GPU under CLM_GPU_TEST_SMALL=1
// (tests/gpu/run.sh's compute-sanitizer runs, 10-100x slower).
#ifdef CLM_TEST_EMULATED_GPU
inline const bool kFull = false;
#else
inline const bool kFull = std::getenv("CLM_GPU_TEST_SMALL") == nullptr;
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

// A clm::Status that must be ok (its code and message shown if not).
#define REQUIRE_OK(expr)                            \
  do {                                              \
    const clm::Status st_ = (expr);                 \
    INFO(st_.code_name() << ": " << st_.message()); \
    REQUIRE(st_.ok());                              \
  } while (0)

// Expects `code` and a message containing `part`.
#define REQUIRE_ERROR(expr, want_code, part)              \
  do {                                                    \
    const clm::Status st_ = (expr);                       \
    INFO(st_.code_name() << ": " << st_.message());       \
    REQUIRE(st_.code() == (want_code));                   \
    CHECK(st_.message().find(part) != std::string::npos); \
  } while (0)
