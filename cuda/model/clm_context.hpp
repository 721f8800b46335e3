// cuda/model/clm_context.hpp: what the CLM model side's objects on the GPU
// (clm/device/cuda_clm.hpp: the SRC head in cuda_clm.cpp, its running sums in
// cuda_src_sums.cpp, the snapshot adapter in cuda_snapshot_adapter.cpp) share
// on the host: cuBLAS errors as Status, the host checks of a call's device
// buffers, activations and indptr, the fresh and zero records, and the
// DeviceContext each object holds on its device. Plain C++ over the CUDA
// runtime and cuBLAS; internal to cuda/, not installed.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "clm/device/cuda_clm.hpp"
#include "device/device_staging.hpp"
#include "model/clm_args.hpp"

namespace clm::cuda::detail {

inline Status cublas_error(cublasStatus_t err, const char* what) {
  std::string text = fmt::format("{}: {} ({})", what, cublasGetStatusString(err), cublasGetStatusName(err));
  switch (err) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return out_of_memory(std::move(text));
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return unsupported(std::move(text));
    default:
      return {StatusCode::internal, std::move(text)};
  }
}

#define CLM_CUBLAS_TRY(call, what)                                                                             \
  do {                                                                                                         \
    cublasStatus_t clm_blas_err_ = (call);                                                                     \
    if (clm_blas_err_ != CUBLAS_STATUS_SUCCESS) return ::clm::cuda::detail::cublas_error(clm_blas_err_, what); \
  } while (0)

// A buffer the kernels read or write: device (or managed) memory of `device`,
// first and last byte in one allocation.
inline Status check_device_buffer(const void* pointer, std::size_t bytes, int device, std::string_view what) {
  if (pointer == nullptr) return invalid_argument(fmt::format("{}: null pointer", what));
  if (bytes == 0) return {};
  cudaPointerAttributes first{}, last{};
  CLM_CUDA_TRY(cudaPointerGetAttributes(&first, pointer), "cudaPointerGetAttributes");
  CLM_CUDA_TRY(cudaPointerGetAttributes(&last, static_cast<const unsigned char*>(pointer) + bytes - 1),
               "cudaPointerGetAttributes");
  const bool first_dev = first.type == cudaMemoryTypeDevice || first.type == cudaMemoryTypeManaged;
  const bool last_dev = last.type == cudaMemoryTypeDevice || last.type == cudaMemoryTypeManaged;
  if (!first_dev) {
    return invalid_argument(fmt::format("{}: must be device memory, got {} host memory", what,
                                        first.type == cudaMemoryTypeHost ? "pinned" : "pageable"));
  }
  if (!last_dev) {
    return invalid_argument(
        fmt::format("{}: its last byte (of {}) is not device memory (is the buffer too small?)", what, bytes));
  }
  if (first.type == cudaMemoryTypeDevice && (first.device != device || last.device != device)) {
    return invalid_argument(
        fmt::format("{}: memory of device {}, but the object is on device {}", what, first.device, device));
  }
  if (first.devicePointer != pointer ||
      static_cast<const unsigned char*>(last.devicePointer) - static_cast<const unsigned char*>(first.devicePointer) !=
          static_cast<std::ptrdiff_t>(bytes - 1)) {
    return invalid_argument(fmt::format("{}: its {} bytes are not one device allocation", what, bytes));
  }
  return {};
}

// The activations of a call: dtype, columns, alignment of the kernels' access.
struct ActLayout {
  bool vec = false;  // 16-byte chunks (rows and base 16-byte aligned), else one element per thread
  int elems = 1;     // elements per thread chunk
  std::size_t row_bytes = 0;
};

inline Status check_activations(const ConstActivationView& view, std::int32_t cols, const char* what, ActLayout& out) {
  CLM_RETURN_IF_ERROR(check_activation_view(view, cols, what));
  if (view.rows > std::numeric_limits<std::int32_t>::max()) {
    return invalid_argument(fmt::format("{}: {} rows, at most 2^31 - 1", what, view.rows));
  }
  const std::size_t elem = kv_dtype_bytes(view.dtype);
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  if (address % elem != 0) return invalid_argument(fmt::format("{}: data is not aligned to its element size", what));
  out.row_bytes = static_cast<std::size_t>(cols) * elem;
  out.vec = address % 16 == 0 && out.row_bytes % 16 == 0;
  out.elems = out.vec ? static_cast<int>(16 / elem) : 1;
  return {};
}

// indptr of a ragged batch over `rows` rows.
inline Status check_indptr(std::span<const std::int32_t> indptr, std::int64_t rows, const char* what) {
  if (indptr.empty()) return invalid_argument(fmt::format("{}: indptr is empty (needs batch + 1 entries)", what));
  if (indptr.size() - 1 > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return invalid_argument(fmt::format("{}: batch too large", what));
  }
  if (indptr[0] != 0) return invalid_argument(fmt::format("{}: indptr[0] must be 0", what));
  for (std::size_t b = 1; b < indptr.size(); ++b) {
    if (indptr[b] < indptr[b - 1]) return invalid_argument(fmt::format("{}: indptr decreases at {}", what, b));
  }
  if (indptr.back() != rows) {
    return invalid_argument(
        fmt::format("{}: indptr ends at {}, the activations have {} rows", what, indptr.back(), rows));
  }
  return {};
}

inline constexpr ClmRecord kFreshRecord{0,
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::max(),
                                        0u,
                                        0,
                                        0};
inline constexpr ClmRecord kZeroRecord{0, 0, 0, 0, 0, 0u, 0, 0};

// ============================================================================
// What both objects hold on their device: a cuBLAS handle and its workspace,
// pinned staging buffers for the per-call uploads, growable device buffers,
// and the event that orders calls.
// ============================================================================
class DeviceContext {
 public:
  int device = 0;
  int sm_count = 1;
  cublasHandle_t blas = nullptr;
  DeviceBuffer blas_workspace;
  cudaStream_t bound_stream = nullptr;
  bool bound = false;
  detail::StagingRing<4> staging{std::size_t{1} << 14};
  cudaEvent_t last_call = nullptr;
  bool has_last_call = false;
  std::vector<DeviceBuffer*> owned;  // freed by the destructor

  DeviceContext() = default;
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Status init(int dev) {
    CLM_RETURN_IF_ERROR(detail::check_usable_device(dev));
    device = dev;
    DeviceGuard guard;
    CLM_RETURN_IF_ERROR(guard.enter(device));
    CLM_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    sm_count = std::max(sm_count, 1);
    int major = 0;
    CLM_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    CLM_RETURN_IF_ERROR(staging.create_events());
    CLM_CUDA_TRY(cudaEventCreateWithFlags(&last_call, cudaEventDisableTiming), "cudaEventCreate");
    CLM_CUBLAS_TRY(cublasCreate(&blas), "cublasCreate");
    // f32 compute without TF32 (the CPU head's accuracy), whatever the handle's default.
    CLM_CUBLAS_TRY(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    // cuBLAS's recommended user workspace: 32 MiB on Hopper, 4 MiB elsewhere.
    const std::size_t ws_bytes = major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
    CLM_CUDA_TRY(cudaMalloc(&blas_workspace.pointer, ws_bytes), "cudaMalloc (cuBLAS workspace)");
    blas_workspace.capacity = ws_bytes;
    return {};
  }

  ~DeviceContext() {
    DeviceGuard guard;
    if (!guard.enter(device).ok()) return;
    if (has_last_call) cudaEventSynchronize(last_call);  // every call waits for the previous one
    if (blas) cublasDestroy(blas);
    if (blas_workspace.pointer) cudaFree(blas_workspace.pointer);
    for (DeviceBuffer* b : owned) {
      if (b->pointer) cudaFree(b->pointer);
    }
    staging.release();
    if (last_call) cudaEventDestroy(last_call);
  }

  // The device, the stream's device, and the order after the previous call.
  Status enter(DeviceGuard& guard, void* stream) {
    CLM_RETURN_IF_ERROR(guard.enter(device));
    if (stream != nullptr) {
      int stream_device = -1;
      CLM_CUDA_TRY(cudaStreamGetDevice(as_stream(stream), &stream_device), "cudaStreamGetDevice");
      if (stream_device != device) {
        return invalid_argument(
            fmt::format("the stream belongs to device {}, the object to device {}", stream_device, device));
      }
    }
    if (has_last_call) CLM_CUDA_TRY(cudaStreamWaitEvent(as_stream(stream), last_call, 0), "cudaStreamWaitEvent");
    return {};
  }
  Status end(void* stream) {
    CLM_CUDA_TRY(cudaEventRecord(last_call, as_stream(stream)), "cudaEventRecord");
    has_last_call = true;
    return {};
  }

  // cuBLAS runs on `stream` with our workspace (cublasSetStream resets it).
  Status bind(void* stream) {
    if (bound && bound_stream == as_stream(stream)) return {};
    CLM_CUBLAS_TRY(cublasSetStream(blas, as_stream(stream)), "cublasSetStream");
    CLM_CUBLAS_TRY(cublasSetWorkspace(blas, blas_workspace.pointer, blas_workspace.capacity), "cublasSetWorkspace");
    bound_stream = as_stream(stream);
    bound = true;
    return {};
  }

  // Device buffers grow with a quarter of headroom (at least 64 KiB).
  static constexpr GrowthPolicy kGrowth{true, std::size_t{1} << 16, "cudaMalloc (CLM scratch)"};
  Status reserve(DeviceBuffer& b, std::size_t bytes, void* stream) {
    return detail::reserve(b, bytes, as_stream(stream), kGrowth);
  }

  // Uploads `parts` (each at a 16-byte aligned offset; null data: zeros) into
  // `dst` with one copy; returns each part's device address.
  Status upload(std::initializer_list<detail::UploadPart> parts, DeviceBuffer& dst, void* stream,
                std::vector<void*>& at) {
    return staging.upload(parts, dst, kGrowth, as_stream(stream), at);
  }

  // A device copy of host data, made once (synchronous).
  Status upload_once(const void* host, std::size_t bytes, DeviceBuffer& dst) {
    CLM_CUDA_TRY(cudaMalloc(&dst.pointer, std::max<std::size_t>(bytes, 16)), "cudaMalloc (weights)");
    dst.capacity = std::max<std::size_t>(bytes, 16);
    if (bytes != 0) CLM_CUDA_TRY(cudaMemcpy(dst.pointer, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
    return {};
  }

  std::size_t device_bytes() const {
    std::size_t n = blas_workspace.capacity;
    for (const DeviceBuffer* b : owned) n += b->capacity;
    return n;
  }

  // Column-major C[m x n] = alpha op(A) op(B) + beta C, all f32, f32 compute.
  Status gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc, const char* what) {
    CLM_CUBLAS_TRY(cublasGemmEx(blas, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, c,
                                CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   what);
    return {};
  }
};

inline bool all_finite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace clm::cuda::detail

namespace clm::cuda {

// The names the objects' code uses unqualified.
using detail::ActLayout;
using detail::all_finite;
using detail::as_stream;
using detail::check_activations;
using detail::check_device_buffer;
using detail::check_indptr;
using detail::ClmRecord;
using detail::DeviceBuffer;
using detail::DeviceContext;
using detail::DeviceGuard;
using detail::Dims;
using detail::GrowthPolicy;
using detail::kFreshRecord;
using detail::kZeroRecord;
using detail::launch_status;
using detail::round16;

}  // namespace clm::cuda
