// Internal to cuda/: the host-side helpers that kernels/cuda_kernels.cpp and
// the CLM objects of model/ share over the CUDA runtime API (so does
// examples/tiny_llama's CUDA decoder): CUDA errors as clm::Status
// (cuda_error, CLM_CUDA_TRY, launch_status), the device check of create calls
// (check_usable_device), DeviceGuard::enter (device_guard.hpp's guard, which
// sets and restores the current device, with a Status),
// growable device buffers (reserve), a pinned buffer for copies back to the
// host (PinnedReadback) and a ring of pinned staging buffers that uploads
// host ranges with one copy (StagingRing).
// Host-only C++, no kernels; not installed.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/status.hpp"
#include "device/device_guard.hpp"

namespace clm::cuda::detail {

// `err`, which a call just returned, as a Status. The runtime also keeps it as
// the thread's last error: cleared here, since it is reported now, or the next
// cudaGetLastError (synchronize's check for asynchronous errors) would report
// a failed allocation again as a broken device. Sticky errors stay.
inline Status cuda_error(cudaError_t err, const char* what) {
  (void)cudaGetLastError();
  std::string text = fmt::format("{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return out_of_memory(std::move(text));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return unsupported(std::move(text));
    default:
      return {StatusCode::internal, std::move(text)};
  }
}

#define CLM_CUDA_TRY(call, what)                                                         \
  do {                                                                                   \
    cudaError_t clm_err_ = (call);                                                       \
    if (clm_err_ != cudaSuccess) return ::clm::cuda::detail::cuda_error(clm_err_, what); \
  } while (0)

// The result of a launch wrapper (launch.hpp, clm_launch.hpp): 0, a
// cudaError_t, or -1 for no kernel instance.
inline Status launch_status(int result, const char* what) {
  if (result == -1) return {StatusCode::internal, fmt::format("{}: no kernel instance for this configuration", what)};
  if (result != 0) return cuda_error(static_cast<cudaError_t>(result), what);
  return {};
}

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline std::size_t round16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

// unsupported unless `device` is a CUDA device this process can use.
inline Status check_usable_device(int device) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();  // clear
    return unsupported(fmt::format("no usable CUDA device: cudaGetDeviceCount: {}", cudaGetErrorString(err)));
  }
  if (device < 0 || device >= count) return unsupported(fmt::format("no CUDA device {} ({} present)", device, count));
  return {};
}

// A pinned host buffer that device-to-host copies land in; it only grows, and
// only after the stream's earlier copies into it have completed.
class PinnedReadback {
 public:
  PinnedReadback() = default;
  PinnedReadback(const PinnedReadback&) = delete;
  PinnedReadback& operator=(const PinnedReadback&) = delete;
  ~PinnedReadback() {
    if (data_) cudaFreeHost(data_);
  }
  // At least `bytes` (and 4 KiB); `what` names the allocation in errors.
  Status reserve(std::size_t bytes, cudaStream_t stream, const char* what) {
    if (capacity_ >= bytes) return {};
    CLM_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (data_) CLM_CUDA_TRY(cudaFreeHost(data_), "cudaFreeHost");
    data_ = nullptr;
    capacity_ = 0;
    const std::size_t capacity = std::max<std::size_t>(bytes, 4096);
    CLM_CUDA_TRY(cudaMallocHost(&data_, capacity), what);
    capacity_ = capacity;
    return {};
  }
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// DeviceGuard (device_guard.hpp) entered with its error as a Status.
inline Status DeviceGuard::enter(int device) {
  if (cudaError_t err = enter_device(device); err != cudaSuccess) return cuda_error(err, failed_call());
  return {};
}

// A device allocation that only grows (its owner frees it).
struct DeviceBuffer {
  void* pointer = nullptr;
  std::size_t capacity = 0;
};

// How reserve() grows a DeviceBuffer: to at least `minimum` bytes, and to
// bytes + bytes / 4 with `headroom` (else to exactly the bytes asked for).
struct GrowthPolicy {
  bool headroom = false;
  std::size_t minimum = std::size_t{1} << 16;
  const char* what = "cudaMalloc";  // names the cudaMalloc in errors
};

// Grows `b` to hold `bytes`; earlier work on `stream` (ordered after every
// earlier call) may still use the old allocation, so wait for it first.
inline Status reserve(DeviceBuffer& b, std::size_t bytes, cudaStream_t stream, const GrowthPolicy& policy) {
  if (b.capacity >= bytes) return {};
  CLM_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (b.pointer) CLM_CUDA_TRY(cudaFree(b.pointer), "cudaFree");
  b.pointer = nullptr;
  b.capacity = 0;
  const std::size_t grown = std::max(policy.headroom ? bytes + bytes / 4 : bytes, policy.minimum);
  CLM_CUDA_TRY(cudaMalloc(&b.pointer, grown), policy.what);
  b.capacity = grown;
  return {};
}

// A host range to upload; null data with nonzero bytes uploads zeros.
struct UploadPart {
  const void* data;
  std::size_t bytes;
};

// N pinned host buffers, used in turn, that calls fill and upload from; each
// is reused only after its previous upload has completed. Grown to at least
// `minimum` bytes. The owner calls create_events() once and release() (with
// its device current, after the uploads are done) before it goes.
template <std::size_t N>
class StagingRing {
 public:
  struct Staging {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t uploaded = nullptr;  // recorded after the upload from it
    bool pending = false;
  };

  explicit StagingRing(std::size_t minimum) : minimum_(minimum) {}
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  Status create_events() {
    for (Staging& s : slots_) {
      CLM_CUDA_TRY(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming), "cudaEventCreate");
    }
    return {};
  }

  void release() {
    for (Staging& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.uploaded) cudaEventDestroy(s.uploaded);
      s = Staging{};
    }
  }

  // The next staging buffer, of >= bytes, its previous upload completed.
  Status acquire(std::size_t bytes, Staging*& out) {
    Staging& s = slots_[next_++ % slots_.size()];
    if (s.pending) {
      CLM_CUDA_TRY(cudaEventSynchronize(s.uploaded), "cudaEventSynchronize (staging)");
      s.pending = false;
    }
    if (s.capacity < bytes) {
      if (s.host) CLM_CUDA_TRY(cudaFreeHost(s.host), "cudaFreeHost");
      s.host = nullptr;
      s.capacity = 0;
      const std::size_t grown = std::max(bytes, minimum_);
      CLM_CUDA_TRY(cudaMallocHost(&s.host, grown), "cudaMallocHost (staging)");
      s.capacity = grown;
    }
    out = &s;
    return {};
  }

  // Uploads `parts`, each at a 16-byte aligned offset, into `dst` (grown by
  // `growth`) with one copy on `stream`; returns each part's device address
  // (null for an empty part). Nothing is staged or copied when all are empty.
  Status upload(std::initializer_list<UploadPart> parts, DeviceBuffer& dst, const GrowthPolicy& growth,
                cudaStream_t stream, std::vector<void*>& addresses) {
    std::size_t total = 0;
    for (const UploadPart& p : parts) total += round16(p.bytes);
    addresses.clear();
    if (total == 0) {
      addresses.assign(parts.size(), nullptr);
      return {};
    }
    CLM_RETURN_IF_ERROR(reserve(dst, total, stream, growth));
    Staging* s = nullptr;
    CLM_RETURN_IF_ERROR(acquire(total, s));
    std::size_t offset = 0;
    for (const UploadPart& p : parts) {
      auto* host = static_cast<unsigned char*>(s->host) + offset;
      if (p.bytes != 0) {
        if (p.data != nullptr) {
          std::memcpy(host, p.data, p.bytes);
        } else {
          std::memset(host, 0, p.bytes);
        }
      }
      addresses.push_back(p.bytes != 0 ? static_cast<unsigned char*>(dst.pointer) + offset : nullptr);
      offset += round16(p.bytes);
    }
    CLM_CUDA_TRY(cudaMemcpyAsync(dst.pointer, s->host, total, cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync (upload)");
    CLM_CUDA_TRY(cudaEventRecord(s->uploaded, stream), "cudaEventRecord");
    s->pending = true;
    return {};
  }

 private:
  std::array<Staging, N> slots_;
  unsigned next_ = 0;
  std::size_t minimum_;
};

}  // namespace clm::cuda::detail
