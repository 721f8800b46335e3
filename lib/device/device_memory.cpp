// Device allocation for PagedKvPool over the CUDA runtime (when built with it).
#include "clm/device/device_memory.hpp"

#include <fmt/format.h>

#if CLM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "device/device_guard.hpp"  // cuda/: the device guard cuda/ uses too
#endif

namespace clm {

#if CLM_HAVE_CUDA
int cuda_device_count(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver, not NoDevice.
    if (reason) *reason = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(err));
    return 0;
  }
  if (count == 0 && reason) *reason = "no CUDA device";
  return count;
}

Status device_allocate(std::size_t bytes, int device, void** out) {
  *out = nullptr;
  std::string reason;
  if (cuda_device_count(&reason) <= device || device < 0) {
    return unsupported(fmt::format("no CUDA device {}: {}", device, reason));
  }
  // `device` is the calling thread's current device for the guard's life,
  // then the one the thread had again: the host's CUDA state is its own.
  cuda::detail::DeviceGuard current;
  if (cudaError_t err = current.enter_device(device); err != cudaSuccess) {
    return unsupported(fmt::format("{} for device {}: {}", current.failed_call(), device, cudaGetErrorString(err)));
  }
  if (cudaError_t err = cudaMalloc(out, bytes); err != cudaSuccess) {
    *out = nullptr;
    (void)cudaGetLastError();  // reported here: not again by the host's next cudaGetLastError
    return out_of_memory(fmt::format("cudaMalloc({} bytes): {}", bytes, cudaGetErrorString(err)));
  }
  return {};
}

void device_free(void* pointer, int device) {
  if (!pointer) return;
  cuda::detail::DeviceGuard current;
  (void)current.enter_device(device);  // if it fails, freed from the thread's current device
  cudaFree(pointer);
}

Status pinned_host_allocate(std::size_t bytes, void** out) {
  *out = nullptr;
  std::string reason;
  if (cuda_device_count(&reason) <= 0) return unsupported(fmt::format("pinned host memory: {}", reason));
  if (cudaError_t err = cudaHostAlloc(out, bytes, cudaHostAllocPortable | cudaHostAllocMapped); err != cudaSuccess) {
    *out = nullptr;
    (void)cudaGetLastError();  // reported here: not again by the host's next cudaGetLastError
    return out_of_memory(fmt::format("cudaHostAlloc({} bytes): {}", bytes, cudaGetErrorString(err)));
  }
  return {};
}

void pinned_host_free(void* pointer) {
  if (pointer) cudaFreeHost(pointer);
}
#else
int cuda_device_count(std::string* reason) {
  if (reason) *reason = "clmcache was built without CUDA";
  return 0;
}

Status device_allocate(std::size_t, int, void** out) {
  *out = nullptr;
  return unsupported("device memory: clmcache was built without CUDA");
}

void device_free(void*, int) {}

Status pinned_host_allocate(std::size_t, void** out) {
  *out = nullptr;
  return unsupported("pinned host memory: clmcache was built without CUDA");
}

void pinned_host_free(void*) {}
#endif

}  // namespace clm
