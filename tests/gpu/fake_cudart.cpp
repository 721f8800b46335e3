// A fake CUDA runtime over host memory, for test_cuda_kernels_emulated: the
// functions clmcache (lib/device/device_memory.cpp, cuda/kernels/cuda_kernels.cpp) and the
// GPU test call, defined in the test executable so that they take precedence
// over libcudart. One "device" (0, 4 SMs; a test may ask for more with
// clm_fake_cuda_set_device_count, for the current device's bookkeeping). Device memory is malloc'd host
// memory (the emulated kernels read it); copies and launches complete at once,
// events and streams are tokens. It is strict where the real runtime is:
// device-to-device or host-to-device copies must stay inside one allocation,
// memory kinds must match the cudaMemcpyKind, unknown pointers are errors.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

namespace {

struct Range {
  std::size_t bytes;
  bool mapped;  // pinned host memory: device-accessible
};

struct Fake {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> device;  // base -> bytes
  std::map<std::uintptr_t, Range> pinned;        // cudaMallocHost / cudaHostRegister
  std::set<std::uintptr_t> malloc_host;          // which pinned ranges cudaMallocHost made
  std::set<void*> events, streams;
  int devices = 1;
  cudaError_t last = cudaSuccess;
  // Fault injection (clm_fake_cuda_fail_allocation): allocations to let
  // through before one fails; -1: none fails.
  long allocations_before_failure = -1;
  bool allocation_failed = false;
  // clm_fake_cuda_fail_get_device: what cudaGetDevice returns (cudaSuccess: the thread's device).
  cudaError_t get_device_error = cudaSuccess;
};

Fake& fake() {
  static Fake f;
  return f;
}
thread_local int t_current_device = 0;  // as in CUDA, each host thread has its own

cudaError_t fail(cudaError_t err) {
  fake().last = err;
  return err;
}

// One device or pinned allocation (the caller holds the mutex): whether it is
// the one to fail.
bool allocation_fails() {
  Fake& f = fake();
  if (f.allocations_before_failure < 0) return false;
  if (f.allocations_before_failure-- > 0) return false;
  f.allocation_failed = true;
  return true;
}

// The range [p, p + n) inside one entry of `m` (base -> size or Range)?
template <class Map>
typename Map::const_iterator containing(const Map& m, const void* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  std::size_t size;
  if constexpr (std::is_same_v<typename Map::mapped_type, Range>) {
    size = it->second.bytes;
  } else {
    size = it->second;
  }
  if (a >= it->first && a + n <= it->first + size && a + n >= a) return it;
  return m.end();
}

bool is_device(const void* p, std::size_t n) {
  return containing(fake().device, p, std::max<std::size_t>(n, 1)) != fake().device.end();
}
bool is_pinned(const void* p, std::size_t n) {
  return containing(fake().pinned, p, std::max<std::size_t>(n, 1)) != fake().pinned.end();
}

bool copy_allowed(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  if (n == 0) return true;
  const bool dd = is_device(dst, n), sd = is_device(src, n);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return dd && !is_device(src, 1);
    case cudaMemcpyDeviceToHost:
      return sd && !is_device(dst, 1);
    case cudaMemcpyDeviceToDevice:
      return dd && sd;
    case cudaMemcpyHostToHost:
      return !is_device(dst, 1) && !is_device(src, 1);
    case cudaMemcpyDefault:
      // a pointer that starts in device memory must stay inside its allocation
      return (dd || !is_device(dst, 1)) && (sd || !is_device(src, 1));
  }
  return false;
}

}  // namespace

extern "C" {

// Test hook: how many devices the fake reports (1 unless asked).
void clm_fake_cuda_set_device_count(int count);
void clm_fake_cuda_set_device_count(int count) { fake().devices = count; }

// Test hook: how many streams are live (made and not destroyed).
long clm_fake_cuda_live_streams();
long clm_fake_cuda_live_streams() {
  std::lock_guard lock(fake().mutex);
  return static_cast<long>(fake().streams.size());
}

// Test hooks: the device or pinned allocation (cudaMalloc, cudaMallocHost,
// cudaHostAlloc) after `skip` more fails with cudaErrorMemoryAllocation, once
// (skip -1: none); whether it did; how many such allocations are live.
void clm_fake_cuda_fail_allocation(long skip);
int clm_fake_cuda_allocation_failed();
long clm_fake_cuda_live_allocations();
void clm_fake_cuda_fail_allocation(long skip) {
  std::lock_guard lock(fake().mutex);
  fake().allocations_before_failure = skip;
  fake().allocation_failed = false;
}
int clm_fake_cuda_allocation_failed() {
  std::lock_guard lock(fake().mutex);
  return fake().allocation_failed ? 1 : 0;
}
long clm_fake_cuda_live_allocations() {
  std::lock_guard lock(fake().mutex);
  return static_cast<long>(fake().device.size() + fake().malloc_host.size());
}

// Test hook: cudaGetDevice fails with `error` (a cudaError_t) until called
// again with 0 (as without a driver, where the thread's device is unknown).
void clm_fake_cuda_fail_get_device(int error);
void clm_fake_cuda_fail_get_device(int error) { fake().get_device_error = static_cast<cudaError_t>(error); }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = fake().devices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (fake().get_device_error != cudaSuccess) return fail(fake().get_device_error);
  *device = t_current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= fake().devices) return fail(cudaErrorInvalidDevice);
  t_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *value = attr == cudaDevAttrMultiProcessorCount ? 4 : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = fake().last;
  fake().last = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t error) {
  static char text[64];
  std::snprintf(text, sizeof(text), "fake CUDA error %d", static_cast<int>(error));
  return error == cudaSuccess ? "no error" : text;
}
const char* cudaGetErrorName(cudaError_t error) { return error == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  std::lock_guard lock(fake().mutex);
  if (allocation_fails()) return fail(cudaErrorMemoryAllocation);
  void* q = nullptr;
  if (posix_memalign(&q, 256, std::max<std::size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  fake().device[reinterpret_cast<std::uintptr_t>(q)] = std::max<std::size_t>(bytes, 1);
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::lock_guard lock(fake().mutex);
  if (p == nullptr) return cudaSuccess;
  if (fake().device.erase(reinterpret_cast<std::uintptr_t>(p)) != 1) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  std::lock_guard lock(fake().mutex);
  if (allocation_fails()) return fail(cudaErrorMemoryAllocation);
  void* q = nullptr;
  if (posix_memalign(&q, 256, std::max<std::size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  fake().pinned[reinterpret_cast<std::uintptr_t>(q)] = Range{std::max<std::size_t>(bytes, 1), true};
  fake().malloc_host.insert(reinterpret_cast<std::uintptr_t>(q));
  *p = q;
  return cudaSuccess;
}
// Pinned host memory with flags (lib/device/device_memory.cpp): the flags change
// nothing here, where host and "device" share one address space.
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard lock(fake().mutex);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (fake().malloc_host.erase(a) != 1) return fail(cudaErrorInvalidValue);
  fake().pinned.erase(a);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, std::size_t bytes, unsigned int flags) {
  std::lock_guard lock(fake().mutex);
  if (p == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  if (is_pinned(p, 1) || is_pinned(static_cast<char*>(p) + bytes - 1, 1))
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  if (is_device(p, 1)) return fail(cudaErrorInvalidValue);
  fake().pinned[reinterpret_cast<std::uintptr_t>(p)] = Range{bytes, (flags & cudaHostRegisterMapped) != 0};
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard lock(fake().mutex);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (fake().malloc_host.count(a) || fake().pinned.erase(a) != 1) return fail(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::lock_guard lock(fake().mutex);
  *attr = cudaPointerAttributes{};
  attr->type = cudaMemoryTypeUnregistered;
  attr->device = 0;
  if (is_device(p, 1)) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(p);
  } else if (auto it = containing(fake().pinned, p, 1); it != fake().pinned.end()) {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(p);
    attr->devicePointer = it->second.mapped ? const_cast<void*>(p) : nullptr;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  std::lock_guard lock(fake().mutex);
  if (!copy_allowed(dst, src, n, kind)) return fail(cudaErrorInvalidValue);
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  std::lock_guard lock(fake().mutex);
  if (stream != nullptr && !fake().streams.count(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (!copy_allowed(dst, src, n, kind)) return fail(cudaErrorInvalidValue);
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, std::size_t n) {
  std::lock_guard lock(fake().mutex);
  if (!is_device(p, n)) return fail(cudaErrorInvalidValue);
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  void* e = std::malloc(1);
  fake().events.insert(e);
  *event = static_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!fake().events.count(start) || !fake().events.count(end)) return fail(cudaErrorInvalidResourceHandle);
  *ms = 1.0f;  // the fake has no clock
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (fake().events.erase(event) != 1) return fail(cudaErrorInvalidResourceHandle);
  std::free(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!fake().events.count(event) || (stream && !fake().streams.count(stream)))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return fake().events.count(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (!fake().events.count(event) || (stream && !fake().streams.count(stream)))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  void* s = std::malloc(1);
  fake().streams.insert(s);
  *stream = static_cast<cudaStream_t>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (fake().streams.erase(stream) != 1) return fail(cudaErrorInvalidResourceHandle);
  std::free(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return stream == nullptr || fake().streams.count(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (stream != nullptr && !fake().streams.count(stream)) return fail(cudaErrorInvalidResourceHandle);
  *device = 0;
  return cudaSuccess;
}

}  // extern "C"
