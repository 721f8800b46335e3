// cuda/device/device_guard.hpp: DeviceGuard, the one way clmcache makes a CUDA
// device the calling thread's current device for the scope of a call and then
// restores the thread's own (the host's CUDA state is its own). Used by cuda/
// (through device_staging.hpp, which defines enter(), the Status form) and by
// lib/device/device_memory.cpp (enter_device(), the runtime's error).
// Host-only C++ over the CUDA runtime API; internal, not installed.
#pragma once

#include <cuda_runtime_api.h>

#include "clm/status.hpp"

namespace clm::cuda::detail {

// Makes `device` current for the calling thread for the scope of a call.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }

  // Makes `device` the calling thread's current device until the guard goes,
  // which makes the thread's own device current again (where it was another).
  // cudaSuccess, or the error of the call that failed (failed_call() names it:
  // "cudaGetDevice" or "cudaSetDevice"), cleared from the thread's last error
  // since the caller reports it: the thread's device is then as it was and
  // nothing is restored. A thread whose current device cudaGetDevice cannot
  // tell is refused, as the guard could not put it back. After a success,
  // later calls do nothing.
  cudaError_t enter_device(int device) {
    if (entered_) return cudaSuccess;
    if (cudaError_t err = cudaGetDevice(&previous_); err != cudaSuccess) return failed(err, "cudaGetDevice");
    if (previous_ != device) {
      if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return failed(err, "cudaSetDevice");
      restore_ = true;
    }
    entered_ = true;
    return cudaSuccess;
  }
  const char* failed_call() const { return failed_call_; }

  // enter_device() as a Status: cuda_error's, named by the call that failed.
  // Defined in device_staging.hpp, beside cuda_error.
  inline Status enter(int device);

 private:
  cudaError_t failed(cudaError_t err, const char* call) {
    (void)cudaGetLastError();  // clear
    failed_call_ = call;
    return err;
  }

  int previous_ = 0;
  bool entered_ = false;
  bool restore_ = false;
  const char* failed_call_ = nullptr;
};

}  // namespace clm::cuda::detail
