// TEST-ONLY: a fake cuBLAS for test_cuda_clm_emulated. It defines the few
// cuBLAS entry points cuda/model/cuda_*.cpp call, in the test executable (which
// does not link libcublas), over fake_cudart.cpp's "device" memory (host
// memory): cublasGemmEx is a plain CPU GEMM (f32 in, f64 accumulation, f32
// out), column-major as cuBLAS, for CUDA_R_32F with CUBLAS_COMPUTE_32F only,
// anything else is CUBLAS_STATUS_NOT_SUPPORTED. It checks what the real
// library would reject (bad handle, dimensions, leading dimensions) and that
// every operand lies inside one fake device allocation. Never linked into the
// library.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>

namespace {

struct FakeHandle {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

std::set<FakeHandle*>& handles() {
  static std::set<FakeHandle*> h;
  return h;
}

FakeHandle* get(cublasHandle_t handle) {
  auto* h = reinterpret_cast<FakeHandle*>(handle);
  return handles().count(h) ? h : nullptr;
}

// Inside one fake device allocation? (fake_cudart.cpp answers through the
// runtime API, as for any caller.)
bool on_device(const void* p, std::size_t bytes) {
  if (bytes == 0) return true;
  cudaPointerAttributes first{}, last{};
  if (cudaPointerGetAttributes(&first, p) != cudaSuccess) return false;
  if (cudaPointerGetAttributes(&last, static_cast<const char*>(p) + bytes - 1) != cudaSuccess) return false;
  return first.type == cudaMemoryTypeDevice && last.type == cudaMemoryTypeDevice;
}

// Bytes spanned by a column-major rows x cols matrix with leading dimension ld.
std::size_t span_bytes(int rows, int cols, int ld) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(rows)) * 4;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  auto* h = new FakeHandle;
  handles().insert(h);
  *handle = reinterpret_cast<cublasHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  FakeHandle* h = get(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  handles().erase(h);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  FakeHandle* h = get(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = stream;
  h->workspace = nullptr;  // as the real one: back to the default pool
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  FakeHandle* h = get(handle);
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes != 0 && !on_device(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return get(handle) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_FAKE_ERROR";
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "success" : "fake cuBLAS error";
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                         cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t) {
  if (!get(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = transa == CUBLAS_OP_T;
  const bool tb = transb == CUBLAS_OP_T;
  if ((transa != CUBLAS_OP_N && !ta) || (transb != CUBLAS_OP_N && !tb)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int b_rows = tb ? n : k, b_cols = tb ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!on_device(A, span_bytes(a_rows, a_cols, lda)) || !on_device(B, span_bytes(b_rows, b_cols, ldb)) ||
      !on_device(C, span_bytes(m, n, ldc))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float al = *static_cast<const float*>(alpha);
  const float be = *static_cast<const float*>(beta);
  const auto* a = static_cast<const float*>(A);
  const auto* b = static_cast<const float*>(B);
  auto* c = static_cast<float*>(C);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const float av = ta ? a[static_cast<std::size_t>(i) * lda + p] : a[static_cast<std::size_t>(p) * lda + i];
        const float bv = tb ? b[static_cast<std::size_t>(p) * ldb + j] : b[static_cast<std::size_t>(j) * ldb + p];
        sum += static_cast<double>(av) * static_cast<double>(bv);
      }
      float& out = c[static_cast<std::size_t>(j) * ldc + i];
      const double prev = be == 0.0f ? 0.0 : static_cast<double>(be) * static_cast<double>(out);  // beta 0: C not read
      out = static_cast<float>(static_cast<double>(al) * sum + prev);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
