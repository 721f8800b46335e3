// clm/device/cuda_clm.hpp over the CUDA runtime and cuBLAS: the device SRC head and
// snapshot adapter. Host validation first, then uploads through pinned
// staging buffers, cuBLAS GEMMs and the launches of clm_kernels.cu. Plain C++:
// the CUDA runtime and cuBLAS APIs are C APIs. (test_cuda_clm_emulated
// compiles this file over a fake runtime, a fake cuBLAS and the CPU emulator.)
#include "clm/device/cuda_clm.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "model/clm_args.hpp"
#include "clm_launch.hpp"
#include "device/device_staging.hpp"

namespace clm::cuda {

using detail::as_stream;
using detail::ClmRecord;
using detail::DeviceBuffer;
using detail::DeviceGuard;
using detail::Dims;
using detail::GrowthPolicy;
using detail::launch_status;
using detail::round16;

namespace {

Status cublas_error(cublasStatus_t err, const char* what) {
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

#define CLM_CUBLAS_TRY(call, what)                                                        \
  do {                                                                                    \
    cublasStatus_t clm_blas_err_ = (call);                                                \
    if (clm_blas_err_ != CUBLAS_STATUS_SUCCESS) return cublas_error(clm_blas_err_, what); \
  } while (0)

// A buffer the kernels read or write: device (or managed) memory of `device`,
// first and last byte in one allocation.
Status check_device_buffer(const void* pointer, std::size_t bytes, int device, std::string_view what) {
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

Status check_activations(const ConstActivationView& view, std::int32_t cols, const char* what, ActLayout& out) {
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
Status check_indptr(std::span<const std::int32_t> indptr, std::int64_t rows, const char* what) {
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

constexpr ClmRecord kFreshRecord{0,
                                 std::numeric_limits<std::int32_t>::max(),
                                 std::numeric_limits<std::int32_t>::max(),
                                 std::numeric_limits<std::int32_t>::max(),
                                 std::numeric_limits<std::int32_t>::max(),
                                 0u,
                                 0,
                                 0};
constexpr ClmRecord kZeroRecord{0, 0, 0, 0, 0, 0u, 0, 0};

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

bool all_finite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace

// ============================================================================
// DeviceSrcHead
// ============================================================================
struct DeviceSrcHead::Impl {
  DeviceContext ctx;
  std::int32_t hidden = 0;
  std::int32_t inner = 0;
  Gelu gelu = Gelu::tanh;
  float b2 = 0.0f;
  DeviceBuffer weights;  // w1 [inner][hidden] | b1 [inner] | w2 [inner]
  const float* w1 = nullptr;
  const float* b1 = nullptr;
  const float* w2 = nullptr;
  DeviceBuffer sticky;       // ClmRecord: data errors of score_async calls not yet checked
  DeviceBuffer meta;         // per call: record, counters, special ids, indptr / items, splits
  DeviceBuffer scratch;      // per call: means, Z, logits, partial sums and counts, own scores
  DeviceBuffer pooled;       // score_pooled_async: record, Z, logits
  detail::PinnedReadback readback;  // ClmRecord, then scores (score())
  void* zero_record = nullptr;  // pinned, a zero ClmRecord (resets `sticky`)

  Impl() { ctx.owned = {&weights, &sticky, &meta, &scratch, &pooled}; }
  ~Impl() {
    // ctx's destructor waits for the last call first; the pinned buffers are
    // only used by calls that have completed when they return (check, score).
    if (zero_record) cudaFreeHost(zero_record);
  }

  Status enqueue(const ConstActivationView& attn_out, const std::int32_t* token_ids,
                 std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids, float* scores,
                 bool user_scores, bool accumulate, void* stream);
  // Steps 2 and 3 of a score over means [batch][hidden] (device, f32): Z = H W1^T
  // into z [batch][inner], then bias + GELU + dot + b2 + sigmoid; `rec` is the
  // call's record (the earlier kernels' errors in it keep the scores unwritten).
  Status enqueue_finish(const float* means, std::size_t batch, float* z, float* logits, float* scores, ClmRecord* rec,
                        bool accumulate, void* stream);
  Status read_verdict(void* stream, std::span<float> scores_out);
};

namespace {

Status validate_head_weights(const SrcHeadWeights& w, Gelu gelu) {
  const std::int32_t hidden = w.hidden;
  if (hidden < 4 || hidden % 4 != 0) {
    return invalid_argument(fmt::format("DeviceSrcHead: hidden must be >= 4 and divisible by 4, got {}", hidden));
  }
  if (gelu != Gelu::tanh && gelu != Gelu::erf) return invalid_argument("DeviceSrcHead: unknown Gelu mode");
  const auto h = static_cast<std::size_t>(hidden);
  const std::size_t inner = h / 4;
  if (w.w1.size() != inner * h) {
    return invalid_argument(
        fmt::format("DeviceSrcHead: w1 must hold hidden/4 * hidden = {} floats, got {}", inner * h, w.w1.size()));
  }
  if (w.b1.size() != inner) {
    return invalid_argument(
        fmt::format("DeviceSrcHead: b1 must hold hidden/4 = {} floats, got {}", inner, w.b1.size()));
  }
  if (w.w2.size() != inner) {
    return invalid_argument(
        fmt::format("DeviceSrcHead: w2 must hold hidden/4 = {} floats, got {}", inner, w.w2.size()));
  }
  if (!all_finite(w.w1) || !all_finite(w.b1) || !all_finite(w.w2) || !std::isfinite(w.b2)) {
    return invalid_argument("DeviceSrcHead: the weights hold a NaN or Inf");
  }
  return {};
}

}  // namespace

DeviceSrcHead::DeviceSrcHead(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceSrcHead::~DeviceSrcHead() = default;
std::int32_t DeviceSrcHead::hidden() const { return impl_->hidden; }
std::int32_t DeviceSrcHead::inner() const { return impl_->inner; }
Gelu DeviceSrcHead::gelu() const { return impl_->gelu; }
int DeviceSrcHead::device() const { return impl_->ctx.device; }
std::size_t DeviceSrcHead::device_bytes() const { return impl_->ctx.device_bytes(); }

Status DeviceSrcHead::create(int device, const SrcHead& head, std::unique_ptr<DeviceSrcHead>& out) {
  return create(device, head.weights(), head.gelu(), out);
}

Status DeviceSrcHead::create(int device, const SrcHeadWeights& weights, Gelu gelu,
                             std::unique_ptr<DeviceSrcHead>& out) {
  CLM_RETURN_IF_ERROR(validate_head_weights(weights, gelu));
  auto impl = std::make_unique<Impl>();
  CLM_RETURN_IF_ERROR(impl->ctx.init(device));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(device));
  impl->hidden = weights.hidden;
  impl->inner = weights.hidden / 4;
  impl->gelu = gelu;
  impl->b2 = weights.b2;
  const std::size_t n1 = weights.w1.size();
  const std::size_t ni = weights.b1.size();
  std::vector<float> packed;
  packed.reserve(n1 + 2 * ni);
  packed.insert(packed.end(), weights.w1.begin(), weights.w1.end());
  packed.insert(packed.end(), weights.b1.begin(), weights.b1.end());
  packed.insert(packed.end(), weights.w2.begin(), weights.w2.end());
  CLM_RETURN_IF_ERROR(impl->ctx.upload_once(packed.data(), packed.size() * sizeof(float), impl->weights));
  impl->w1 = static_cast<const float*>(impl->weights.pointer);
  impl->b1 = impl->w1 + n1;
  impl->w2 = impl->b1 + ni;
  CLM_RETURN_IF_ERROR(impl->ctx.upload_once(&kZeroRecord, sizeof(ClmRecord), impl->sticky));
  CLM_CUDA_TRY(cudaMallocHost(&impl->zero_record, sizeof(ClmRecord)), "cudaMallocHost");
  std::memcpy(impl->zero_record, &kZeroRecord, sizeof(ClmRecord));
  out.reset(new DeviceSrcHead(std::move(impl)));
  return {};
}

Status DeviceSrcHead::Impl::enqueue(const ConstActivationView& attn_out, const std::int32_t* token_ids,
                                    std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids,
                                    float* scores, bool user_scores, bool accumulate, void* stream) {
  // ---- host checks: nothing reaches the device for a malformed call ----------------
  ActLayout layout;
  CLM_RETURN_IF_ERROR(check_activations(attn_out, hidden, "DeviceSrcHead::score: attn_out", layout));
  CLM_RETURN_IF_ERROR(check_indptr(indptr, attn_out.rows, "DeviceSrcHead::score"));
  const std::size_t batch = indptr.size() - 1;
  for (std::size_t b = 0; b < batch; ++b) {
    if (indptr[b + 1] == indptr[b]) {
      return invalid_argument(
          fmt::format("DeviceSrcHead::score: sequence {} has no non-special position to average (0 tokens)", b));
    }
  }
  if (batch == 0) return {};
  const auto tokens = static_cast<std::size_t>(attn_out.rows);
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(ctx.device));
  CLM_RETURN_IF_ERROR(
      check_device_buffer(attn_out.data, attn_out.bytes(), ctx.device, "DeviceSrcHead::score: attn_out"));
  CLM_RETURN_IF_ERROR(
      check_device_buffer(token_ids, tokens * sizeof(std::int32_t), ctx.device, "DeviceSrcHead::score: token_ids"));
  if (user_scores) {
    CLM_RETURN_IF_ERROR(check_device_buffer(scores, batch * sizeof(float), ctx.device, "DeviceSrcHead::score: scores"));
  }
  std::vector<std::int32_t> special(special_ids.begin(), special_ids.end());
  std::sort(special.begin(), special.end());
  special.erase(std::unique(special.begin(), special.end()), special.end());

  // ---- masked-mean work: one item per sequence, or parts of long sequences ----------
  const int col_tiles = static_cast<int>((hidden / layout.elems + detail::kMeanThreads - 1) / detail::kMeanThreads);
  // Aim at ~4 blocks per SM; parts of at least kMeanMinChunk tokens.
  const std::size_t wanted_items =
      std::max<std::size_t>(1, (static_cast<std::size_t>(ctx.sm_count) * 4 + col_tiles - 1) / col_tiles);
  const std::size_t chunk = std::max<std::size_t>(detail::kMeanMinChunk, (tokens + wanted_items - 1) / wanted_items);
  std::int32_t max_len = 0;
  for (std::size_t b = 0; b < batch; ++b) max_len = std::max(max_len, indptr[b + 1] - indptr[b]);
  std::vector<detail::MeanItem> items;
  std::vector<detail::MeanSplit> splits;
  if (static_cast<std::size_t>(max_len) > chunk) {
    for (std::size_t b = 0; b < batch; ++b) {
      const std::int32_t begin = indptr[b];
      const std::int32_t end = indptr[b + 1];
      const auto len = static_cast<std::size_t>(end - begin);
      if (len <= chunk) {
        items.push_back({static_cast<std::int32_t>(b), begin, end, -1});
        continue;
      }
      const std::size_t parts = (len + chunk - 1) / chunk;
      const std::size_t per = (len + parts - 1) / parts;  // equal parts
      const auto split = static_cast<std::int32_t>(splits.size());
      splits.push_back({static_cast<std::int32_t>(items.size()), static_cast<std::int32_t>(parts)});
      for (std::size_t p = 0; p < parts; ++p) {
        const auto t0 = static_cast<std::int32_t>(begin + static_cast<std::int32_t>(p * per));
        const auto t1 = static_cast<std::int32_t>(
            std::min<std::size_t>(static_cast<std::size_t>(begin) + (p + 1) * per, static_cast<std::size_t>(end)));
        items.push_back({static_cast<std::int32_t>(b), t0, t1, split});
      }
    }
  }
  const std::size_t n_items = items.empty() ? batch : items.size();

  CLM_RETURN_IF_ERROR(ctx.enter(guard, stream));
  // ---- upload: a fresh record, zero counters, special ids, indptr, items, splits ----
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(
      ctx.upload({{&kFreshRecord, sizeof(ClmRecord)},
                  {nullptr, splits.size() * static_cast<std::size_t>(col_tiles) * sizeof(std::uint32_t)},
                  {special.data(), special.size() * sizeof(std::int32_t)},
                  {indptr.data(), indptr.size() * sizeof(std::int32_t)},
                  {items.data(), items.size() * sizeof(detail::MeanItem)},
                  {splits.data(), splits.size() * sizeof(detail::MeanSplit)}},
                 meta, stream, at));
  auto* rec = static_cast<ClmRecord*>(at[0]);

  // ---- scratch: means [batch][hidden], Z [batch][inner], logits, partials, own scores
  const auto h = static_cast<std::size_t>(hidden);
  const std::size_t means_bytes = round16(batch * h * sizeof(float));
  const std::size_t z_bytes = round16(batch * static_cast<std::size_t>(inner) * sizeof(float));
  const std::size_t logits_bytes = round16(batch * sizeof(float));
  const std::size_t partial_bytes = items.empty() ? 0 : round16(n_items * h * sizeof(float));
  const std::size_t count_bytes =
      items.empty() ? 0 : round16(n_items * static_cast<std::size_t>(col_tiles) * sizeof(std::int32_t));
  const std::size_t own_scores_bytes = user_scores ? 0 : round16(batch * sizeof(float));
  CLM_RETURN_IF_ERROR(ctx.reserve(
      scratch, means_bytes + z_bytes + logits_bytes + partial_bytes + count_bytes + own_scores_bytes, stream));
  auto* base = static_cast<unsigned char*>(scratch.pointer);
  auto* means = reinterpret_cast<float*>(base);
  auto* z = reinterpret_cast<float*>(base + means_bytes);
  auto* logits = reinterpret_cast<float*>(base + means_bytes + z_bytes);
  auto* partial_sums = reinterpret_cast<float*>(base + means_bytes + z_bytes + logits_bytes);
  auto* partial_counts = reinterpret_cast<std::int32_t*>(base + means_bytes + z_bytes + logits_bytes + partial_bytes);
  if (!user_scores) {
    scores = reinterpret_cast<float*>(base + means_bytes + z_bytes + logits_bytes + partial_bytes + count_bytes);
  }

  // ---- 1. masked means ------------------------------------------------------------------
  detail::MaskedMeanArgs mean{};
  mean.x = static_cast<const unsigned char*>(attn_out.data);
  mean.row_bytes = layout.row_bytes;
  mean.cols = hidden;
  mean.col_tiles = col_tiles;
  mean.token_ids = token_ids;
  mean.special = static_cast<const std::int32_t*>(at[2]);
  mean.num_special = static_cast<std::int32_t>(special.size());
  mean.indptr = static_cast<const std::int32_t*>(at[3]);
  mean.items = static_cast<const detail::MeanItem*>(at[4]);
  mean.splits = static_cast<const detail::MeanSplit*>(at[5]);
  mean.means = means;
  mean.partial_sums = items.empty() ? nullptr : partial_sums;
  mean.partial_counts = items.empty() ? nullptr : partial_counts;
  mean.counters = static_cast<std::uint32_t*>(at[1]);
  mean.rec = rec;
  CLM_RETURN_IF_ERROR(launch_status(
      detail::launch_masked_mean(static_cast<int>(attn_out.dtype), layout.vec,
                                 Dims{static_cast<unsigned>(n_items), static_cast<unsigned>(col_tiles), 1}, mean,
                                 stream),
      "masked-mean kernel launch"));

  // ---- 2 and 3. the head on the means ---------------------------------------------------
  CLM_RETURN_IF_ERROR(enqueue_finish(means, batch, z, logits, scores, rec, accumulate, stream));
  if (!user_scores) {
    // score(): this call's record and scores come back with the sticky one.
    const std::size_t need = sizeof(ClmRecord) * 2 + batch * sizeof(float);
    CLM_RETURN_IF_ERROR(readback.reserve(need, as_stream(stream), "cudaMallocHost (readback)"));
    auto* rb = readback.data();
    CLM_CUDA_TRY(
        cudaMemcpyAsync(rb + sizeof(ClmRecord), rec, sizeof(ClmRecord), cudaMemcpyDeviceToHost, as_stream(stream)),
        "cudaMemcpyAsync (record)");
    CLM_CUDA_TRY(cudaMemcpyAsync(rb + 2 * sizeof(ClmRecord), scores, batch * sizeof(float), cudaMemcpyDeviceToHost,
                                 as_stream(stream)),
                 "cudaMemcpyAsync (scores)");
  }
  return ctx.end(stream);
}

Status DeviceSrcHead::Impl::enqueue_finish(const float* means, std::size_t batch, float* z, float* logits,
                                           float* scores, ClmRecord* rec, bool accumulate, void* stream) {
  // ---- 2. Z = H W1^T: column-major Z^T [inner x batch] = W1 (W1^T stored) x H^T ---------
  CLM_RETURN_IF_ERROR(ctx.bind(stream));
  CLM_RETURN_IF_ERROR(ctx.gemm(CUBLAS_OP_T, CUBLAS_OP_N, inner, static_cast<int>(batch), hidden, 1.0f, w1, hidden,
                               means, hidden, 0.0f, z, inner, "cublasGemmEx (SRC head H W1^T)"));

  // ---- 3. bias + GELU + dot + b2 + sigmoid; the last block publishes the scores ----------
  detail::HeadFinishArgs fin{};
  fin.z = z;
  fin.b1 = b1;
  fin.w2 = w2;
  fin.b2 = b2;
  fin.inner = inner;
  fin.batch = static_cast<std::int32_t>(batch);
  fin.accumulate = accumulate ? 1 : 0;
  fin.logits = logits;
  fin.scores = scores;
  fin.rec = rec;
  fin.sticky = static_cast<ClmRecord*>(sticky.pointer);
  CLM_RETURN_IF_ERROR(launch_status(
      detail::launch_head_finish(gelu == Gelu::erf, Dims{static_cast<unsigned>(batch), 1, 1}, fin, stream),
      "SRC head finish kernel launch"));
  return {};
}

namespace {

// The message of a record with error bits (CPU order: non-finite input first).
Status verdict_status(const ClmRecord& r, const char* what) {
  std::string more = r.calls_failed > 1 ? fmt::format(" (and {} more failed calls)", r.calls_failed - 1) : "";
  if (r.error & detail::kErrNonFinite) {
    return invalid_argument(fmt::format("{}: attn_out holds a NaN or Inf (token {}, sequence {}){}", what,
                                        r.nonfinite_token, r.nonfinite_seq, more));
  }
  if (r.error & detail::kErrEmpty) {
    return invalid_argument(
        fmt::format("{}: sequence {} has no non-special position to average (all its tokens are "
                    "special){}",
                    what, r.empty_seq, more));
  }
  if (r.error & detail::kErrLogit) {
    return invalid_argument(fmt::format("{}: sequence {} gives a non-finite logit (the activations overflow f32){}",
                                        what, r.logit_seq, more));
  }
  return {StatusCode::internal, fmt::format("{}: unknown device error bits {:#x}", what, r.error)};
}

}  // namespace

Status DeviceSrcHead::Impl::read_verdict(void* stream, std::span<float> scores_out) {
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(ctx.enter(guard, stream));
  CLM_RETURN_IF_ERROR(readback.reserve(sizeof(ClmRecord), as_stream(stream), "cudaMallocHost (readback)"));
  CLM_CUDA_TRY(
      cudaMemcpyAsync(readback.data(), sticky.pointer, sizeof(ClmRecord), cudaMemcpyDeviceToHost, as_stream(stream)),
      "cudaMemcpyAsync (status)");
  CLM_CUDA_TRY(
      cudaMemcpyAsync(sticky.pointer, zero_record, sizeof(ClmRecord), cudaMemcpyHostToDevice, as_stream(stream)),
      "cudaMemcpyAsync (status reset)");
  CLM_RETURN_IF_ERROR(ctx.end(stream));
  CLM_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  CLM_CUDA_TRY(cudaGetLastError(), "asynchronous error");
  ClmRecord sticky_record{};
  std::memcpy(&sticky_record, readback.data(), sizeof(ClmRecord));
  if (sticky_record.error != 0) return verdict_status(sticky_record, "DeviceSrcHead::score_async (checked)");
  if (scores_out.empty()) return {};
  ClmRecord call{};
  std::memcpy(&call, readback.data() + sizeof(ClmRecord), sizeof(ClmRecord));
  if (call.error != 0) return verdict_status(call, "DeviceSrcHead::score");
  std::memcpy(scores_out.data(), readback.data() + 2 * sizeof(ClmRecord), scores_out.size() * sizeof(float));
  return {};
}

Status DeviceSrcHead::score_async(const ConstActivationView& attn_out, const std::int32_t* token_ids,
                                  std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids,
                                  float* scores, void* stream) {
  return impl_->enqueue(attn_out, token_ids, indptr, special_ids, scores, /*user_scores=*/true, /*accumulate=*/true,
                        stream);
}

Status DeviceSrcHead::check(void* stream) { return impl_->read_verdict(stream, {}); }

Status DeviceSrcHead::score(const ConstActivationView& attn_out, const std::int32_t* token_ids,
                            std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids,
                            std::span<float> scores_out, void* stream) {
  if (indptr.empty()) return invalid_argument("DeviceSrcHead::score: indptr is empty (needs batch + 1 entries)");
  if (scores_out.size() != indptr.size() - 1) {
    return invalid_argument(fmt::format("DeviceSrcHead::score: scores_out has {} entries, indptr gives a batch of {}",
                                        scores_out.size(), indptr.size() - 1));
  }
  CLM_RETURN_IF_ERROR(impl_->enqueue(attn_out, token_ids, indptr, special_ids, nullptr, /*user_scores=*/false,
                                     /*accumulate=*/false, stream));
  if (scores_out.empty()) return check(stream);
  return impl_->read_verdict(stream, scores_out);
}

Status DeviceSrcHead::score_pooled_async(const float* means, std::int32_t batch, float* scores, void* stream) {
  Impl& m = *impl_;
  if (batch < 0) return invalid_argument(fmt::format("DeviceSrcHead::score_pooled_async: batch {} < 0", batch));
  if (batch == 0) return {};
  const auto b = static_cast<std::size_t>(batch);
  const auto h = static_cast<std::size_t>(m.hidden);
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(m.ctx.device));
  CLM_RETURN_IF_ERROR(
      check_device_buffer(means, b * h * sizeof(float), m.ctx.device, "DeviceSrcHead::score_pooled_async: means"));
  CLM_RETURN_IF_ERROR(
      check_device_buffer(scores, b * sizeof(float), m.ctx.device, "DeviceSrcHead::score_pooled_async: scores"));
  CLM_RETURN_IF_ERROR(m.ctx.enter(guard, stream));
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(m.ctx.upload({{&kFreshRecord, sizeof(ClmRecord)}}, m.meta, stream, at));
  const std::size_t z_bytes = round16(b * static_cast<std::size_t>(m.inner) * sizeof(float));
  CLM_RETURN_IF_ERROR(m.ctx.reserve(m.pooled, z_bytes + round16(b * sizeof(float)), stream));
  auto* z = static_cast<float*>(m.pooled.pointer);
  auto* logits = reinterpret_cast<float*>(static_cast<unsigned char*>(m.pooled.pointer) + z_bytes);
  CLM_RETURN_IF_ERROR(m.enqueue_finish(means, b, z, logits, scores, static_cast<ClmRecord*>(at[0]),
                                       /*accumulate=*/true, stream));
  return m.ctx.end(stream);
}

// ============================================================================
// CudaSrcSums
// ============================================================================
// The rows go to the kernel as the tracker wrote them.
static_assert(sizeof(SrcSumRows) == sizeof(detail::SumRows) &&
              offsetof(SrcSumRows, read) == offsetof(detail::SumRows, read) &&
              offsetof(SrcSumRows, write) == offsetof(detail::SumRows, write));
struct CudaSrcSums::Impl {
  int device = 0;
  std::shared_ptr<const SrcHead> seen_head;  // the head `head` was made from
  std::unique_ptr<DeviceSrcHead> head;
  std::int32_t sums_hidden = 0;  // the row width of `sums`
  std::size_t sums_rows = 0;     // rows allocated
  double* sums = nullptr;        // [sums_rows][sums_hidden]
  DeviceBuffer meta;             // per step: record, special ids, indptr, rows, counts
  DeviceBuffer scratch;          // per step: means, Z, logits, scores, added
  detail::PinnedReadback readback;  // record, added, scores

  ~Impl() {
    DeviceGuard guard;
    if (!guard.enter(device).ok()) return;
    // Every step waited for its work; a step that failed after launching may not have.
    if (head && head->impl_->ctx.has_last_call) cudaEventSynchronize(head->impl_->ctx.last_call);
    if (sums) cudaFree(sums);
    if (meta.pointer) cudaFree(meta.pointer);
    if (scratch.pointer) cudaFree(scratch.pointer);
  }

  // The device head of `h` (made again when the tracker's head changes); the
  // sums are dropped when the width changes (the tracker has reset every count).
  Status use_head(const std::shared_ptr<const SrcHead>& h, std::span<const SrcSumRows> rows) {
    if (h != seen_head) {
      std::unique_ptr<DeviceSrcHead> made;
      CLM_RETURN_IF_ERROR(DeviceSrcHead::create(device, *h, made));
      head = std::move(made);
      seen_head = h;
    }
    if (sums_hidden != h->hidden()) {
      for (const SrcSumRows& r : rows) {
        if (r.read >= 0) {
          return {StatusCode::internal,
                  fmt::format("CudaSrcSums::step: row {} was written at width {}, the head has {}", r.read, sums_hidden,
                              h->hidden())};
        }
      }
      if (sums) CLM_CUDA_TRY(cudaFree(sums), "cudaFree (SRC sums)");
      sums = nullptr;
      sums_rows = 0;
      sums_hidden = h->hidden();
    }
    return {};
  }

  // At least `rows` rows of sums, the committed ones kept.
  Status reserve_sums(std::size_t rows, void* stream) {
    if (sums_rows >= rows) return {};
    const std::size_t grown = std::max<std::size_t>(rows + rows / 4, 64);
    const std::size_t row_bytes = static_cast<std::size_t>(sums_hidden) * sizeof(double);
    CLM_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
    void* fresh = nullptr;
    CLM_CUDA_TRY(cudaMalloc(&fresh, grown * row_bytes), "cudaMalloc (SRC sums)");
    if (sums) {
      if (cudaError_t err = cudaMemcpy(fresh, sums, sums_rows * row_bytes, cudaMemcpyDeviceToDevice);
          err != cudaSuccess) {
        cudaFree(fresh);
        return detail::cuda_error(err, "cudaMemcpy (SRC sums)");
      }
      CLM_CUDA_TRY(cudaFree(sums), "cudaFree (SRC sums)");
    }
    sums = static_cast<double*>(fresh);
    sums_rows = grown;
    return {};
  }
};

CudaSrcSums::CudaSrcSums(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSrcSums::~CudaSrcSums() = default;
int CudaSrcSums::device() const { return impl_->device; }
std::size_t CudaSrcSums::device_bytes() const {
  const Impl& m = *impl_;
  return m.sums_rows * static_cast<std::size_t>(m.sums_hidden) * sizeof(double) + m.meta.capacity + m.scratch.capacity +
         (m.head ? m.head->device_bytes() : 0);
}

Status CudaSrcSums::create(int device, std::shared_ptr<CudaSrcSums>& out) {
  CLM_RETURN_IF_ERROR(detail::check_usable_device(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  out.reset(new CudaSrcSums(std::move(impl)));
  return {};
}

Status CudaSrcSums::step(const std::shared_ptr<const SrcHead>& head, std::span<const SrcSumRows> rows,
                         std::span<const std::int64_t> counts, const ConstActivationView& attn_out,
                         const std::int32_t* token_ids, std::span<const std::int32_t> indptr,
                         std::span<const std::int32_t> special_ids, std::span<std::int32_t> added_out,
                         std::span<float> scores_out, void* stream) {
  constexpr const char* kWhat = "src_step_device";
  Impl& m = *impl_;
  if (!head) return failed_precondition(fmt::format("{}: no SRC head", kWhat));
  // ---- host checks: nothing reaches the device for a malformed call ----------------
  ActLayout layout;
  CLM_RETURN_IF_ERROR(check_activations(attn_out, head->hidden(), "src_step_device: attn_out", layout));
  CLM_RETURN_IF_ERROR(check_indptr(indptr, attn_out.rows, kWhat));
  const std::size_t batch = indptr.size() - 1;
  if (rows.size() != batch || counts.size() != batch || added_out.size() != batch || scores_out.size() != batch) {
    return invalid_argument(
        fmt::format("{}: a batch of {} needs as many rows, counts, added and scores ({}, {}, {}, {})", kWhat, batch,
                    rows.size(), counts.size(), added_out.size(), scores_out.size()));
  }
  std::size_t rows_needed = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    if (rows[b].write < 0 || rows[b].read < -1 || rows[b].read == rows[b].write || counts[b] < 0 ||
        (rows[b].read < 0) != (counts[b] == 0)) {
      return invalid_argument(fmt::format("{}: sequence {} has sum rows {} -> {} after {} rows", kWhat, b, rows[b].read,
                                          rows[b].write, counts[b]));
    }
    rows_needed =
        std::max<std::size_t>(rows_needed, static_cast<std::size_t>(std::max(rows[b].read, rows[b].write)) + 1);
  }
  // Sorted and distinct, as the tracker keeps them: uploaded as they are.
  if (std::adjacent_find(special_ids.begin(), special_ids.end(), std::greater_equal<>()) != special_ids.end()) {
    return invalid_argument(fmt::format("{}: special_ids must be sorted and distinct", kWhat));
  }
  if (batch == 0) return {};
  const auto tokens = static_cast<std::size_t>(attn_out.rows);
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(m.device));
  CLM_RETURN_IF_ERROR(check_device_buffer(attn_out.data, attn_out.bytes(), m.device, "src_step_device: attn_out"));
  if (tokens > 0) {
    CLM_RETURN_IF_ERROR(
        check_device_buffer(token_ids, tokens * sizeof(std::int32_t), m.device, "src_step_device: token_ids"));
  }

  CLM_RETURN_IF_ERROR(m.use_head(head, rows));
  DeviceSrcHead::Impl& hd = *m.head->impl_;
  CLM_RETURN_IF_ERROR(m.reserve_sums(rows_needed, stream));
  CLM_RETURN_IF_ERROR(hd.ctx.enter(guard, stream));
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(hd.ctx.upload({{&kFreshRecord, sizeof(ClmRecord)},
                                     {special_ids.data(), special_ids.size() * sizeof(std::int32_t)},
                                     {indptr.data(), indptr.size() * sizeof(std::int32_t)},
                                     {rows.data(), batch * sizeof(SrcSumRows)},
                                     {counts.data(), batch * sizeof(std::int64_t)}},
                                    m.meta, stream, at));
  auto* rec = static_cast<ClmRecord*>(at[0]);
  const auto h = static_cast<std::size_t>(head->hidden());
  const std::size_t means_bytes = round16(batch * h * sizeof(float));
  const std::size_t z_bytes = round16(batch * static_cast<std::size_t>(hd.inner) * sizeof(float));
  const std::size_t vec_bytes = round16(batch * sizeof(float));
  CLM_RETURN_IF_ERROR(hd.ctx.reserve(m.scratch, means_bytes + z_bytes + 3 * vec_bytes, stream));
  auto* base = static_cast<unsigned char*>(m.scratch.pointer);
  auto* means = reinterpret_cast<float*>(base);
  auto* z = reinterpret_cast<float*>(base + means_bytes);
  auto* logits = reinterpret_cast<float*>(base + means_bytes + z_bytes);
  auto* scores = reinterpret_cast<float*>(base + means_bytes + z_bytes + vec_bytes);
  auto* added = reinterpret_cast<std::int32_t*>(base + means_bytes + z_bytes + 2 * vec_bytes);

  // ---- 1. the sums and means ------------------------------------------------------------
  detail::RunningSumArgs sum{};
  sum.x = static_cast<const unsigned char*>(attn_out.data);
  sum.row_bytes = layout.row_bytes;
  sum.cols = head->hidden();
  sum.num_special = static_cast<std::int32_t>(special_ids.size());
  sum.token_ids = token_ids;
  sum.special = static_cast<const std::int32_t*>(at[1]);
  sum.indptr = static_cast<const std::int32_t*>(at[2]);
  sum.rows = static_cast<const detail::SumRows*>(at[3]);
  sum.counts = static_cast<const std::int64_t*>(at[4]);
  sum.sums = m.sums;
  sum.means = means;
  sum.added = added;
  sum.rec = rec;
  const auto col_tiles = static_cast<unsigned>((h + detail::kMeanThreads - 1) / detail::kMeanThreads);
  CLM_RETURN_IF_ERROR(
      launch_status(detail::launch_running_sum(static_cast<int>(attn_out.dtype),
                                               Dims{static_cast<unsigned>(batch), col_tiles, 1}, sum, stream),
                    "running-sum kernel launch"));
  // ---- 2 and 3. the head on every mean (the host ignores those of empty sums) -----------
  CLM_RETURN_IF_ERROR(hd.enqueue_finish(means, batch, z, logits, scores, rec, /*accumulate=*/false, stream));
  // ---- the record, the counts and the scores come back together ---------------------------
  const std::size_t rb_added = sizeof(ClmRecord);
  const std::size_t rb_scores = rb_added + round16(batch * sizeof(std::int32_t));
  CLM_RETURN_IF_ERROR(
      m.readback.reserve(rb_scores + batch * sizeof(float), as_stream(stream), "cudaMallocHost (SRC readback)"));
  auto* rb = m.readback.data();
  CLM_CUDA_TRY(cudaMemcpyAsync(rb, rec, sizeof(ClmRecord), cudaMemcpyDeviceToHost, as_stream(stream)),
               "cudaMemcpyAsync (record)");
  CLM_CUDA_TRY(
      cudaMemcpyAsync(rb + rb_added, added, batch * sizeof(std::int32_t), cudaMemcpyDeviceToHost, as_stream(stream)),
      "cudaMemcpyAsync (counts)");
  CLM_CUDA_TRY(
      cudaMemcpyAsync(rb + rb_scores, scores, batch * sizeof(float), cudaMemcpyDeviceToHost, as_stream(stream)),
      "cudaMemcpyAsync (scores)");
  CLM_RETURN_IF_ERROR(hd.ctx.end(stream));
  CLM_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  CLM_CUDA_TRY(cudaGetLastError(), "asynchronous error");
  ClmRecord record{};
  std::memcpy(&record, rb, sizeof(ClmRecord));
  if (record.error != 0) return verdict_status(record, kWhat);
  std::memcpy(added_out.data(), rb + rb_added, batch * sizeof(std::int32_t));
  std::memcpy(scores_out.data(), rb + rb_scores, batch * sizeof(float));
  return {};
}

// ============================================================================
// DeviceSnapshotAdapter
// ============================================================================
struct DeviceSnapshotAdapter::Impl {
  DeviceContext ctx;
  std::int32_t snapshot_dim = 0;
  std::int32_t hidden = 0;
  std::int32_t num_layers = 0;
  float scale = 0.0f;
  std::vector<std::int32_t> layers;
  DeviceBuffer weights;  // W [hidden][snapshot_dim] | residual_scale * b [hidden]
  const float* w = nullptr;
  const float* scaled_bias = nullptr;
  DeviceBuffer delta;   // [batch][hidden] = residual_scale * W s
  DeviceBuffer record;  // ClmRecord of the last prepare (kErrDelta: its applies add nothing)
  DeviceBuffer meta;    // per apply: items
  std::int32_t prepared_batch = -1;
  void* readback = nullptr;  // pinned ClmRecord (check)

  Impl() { ctx.owned = {&weights, &delta, &record, &meta}; }
  ~Impl() {
    if (readback) cudaFreeHost(readback);  // check() waits for its copy: no work still uses it
  }

  // The host checks of apply / inject (everything but the prepared batch).
  Status check_call(const ActivationView& hs, std::span<const std::int32_t> indptr,
                    std::span<const std::uint8_t> apply_mask, std::int32_t layer, const char* what,
                    ActLayout& layout) const {
    CLM_RETURN_IF_ERROR(check_activations(hs, hidden, fmt::format("{}: hidden_states", what).c_str(), layout));
    CLM_RETURN_IF_ERROR(check_indptr(indptr, hs.rows, what));
    if (layer < 0 || layer >= num_layers) {
      return invalid_argument(fmt::format("{}: layer {} out of range [0, {})", what, layer, num_layers));
    }
    const std::size_t batch = indptr.size() - 1;
    if (!apply_mask.empty() && apply_mask.size() != batch) {
      return invalid_argument(
          fmt::format("{}: apply_mask has {} entries, indptr gives a batch of {}", what, apply_mask.size(), batch));
    }
    return {};
  }
};

DeviceSnapshotAdapter::DeviceSnapshotAdapter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceSnapshotAdapter::~DeviceSnapshotAdapter() = default;
const std::vector<std::int32_t>& DeviceSnapshotAdapter::layers() const { return impl_->layers; }
bool DeviceSnapshotAdapter::injects_at(std::int32_t layer) const {
  return std::binary_search(impl_->layers.begin(), impl_->layers.end(), layer);
}
std::int32_t DeviceSnapshotAdapter::hidden() const { return impl_->hidden; }
std::int32_t DeviceSnapshotAdapter::snapshot_dim() const { return impl_->snapshot_dim; }
float DeviceSnapshotAdapter::residual_scale() const { return impl_->scale; }
int DeviceSnapshotAdapter::device() const { return impl_->ctx.device; }
std::size_t DeviceSnapshotAdapter::device_bytes() const { return impl_->ctx.device_bytes(); }

Status DeviceSnapshotAdapter::create(int device, const SnapshotAdapterWeights& weights,
                                     const SnapshotAdapterConfig& config, std::unique_ptr<DeviceSnapshotAdapter>& out) {
  const char* what = "DeviceSnapshotAdapter";
  if (weights.snapshot_dim <= 0 || weights.hidden <= 0) {
    return invalid_argument(fmt::format("{}: snapshot_dim and hidden must be positive, got {} and {}", what,
                                        weights.snapshot_dim, weights.hidden));
  }
  const auto h = static_cast<std::size_t>(weights.hidden);
  const auto s = static_cast<std::size_t>(weights.snapshot_dim);
  if (weights.weight.size() != h * s) {
    return invalid_argument(fmt::format("{}: weight must hold hidden * snapshot_dim = {} floats, got {}", what, h * s,
                                        weights.weight.size()));
  }
  if (weights.bias.size() != h) {
    return invalid_argument(fmt::format("{}: bias must hold hidden = {} floats, got {}", what, h, weights.bias.size()));
  }
  if (!all_finite(weights.weight) || !all_finite(weights.bias)) {
    return invalid_argument(fmt::format("{}: the weights hold a NaN or Inf", what));
  }
  if (config.num_layers <= 0) {
    return invalid_argument(fmt::format("{}: num_layers must be positive, got {}", what, config.num_layers));
  }
  if (!std::isfinite(config.residual_scale))
    return invalid_argument(fmt::format("{}: residual_scale is not finite", what));
  std::vector<std::int32_t> layers = config.layers;
  if (layers.empty()) {
    for (std::int32_t l = std::max(0, config.num_layers - 3); l < config.num_layers; ++l) layers.push_back(l);
  }
  for (std::int32_t l : layers) {
    if (l < 0 || l >= config.num_layers) {
      return invalid_argument(fmt::format("{}: layer {} out of range [0, {})", what, l, config.num_layers));
    }
  }
  std::sort(layers.begin(), layers.end());
  if (const auto dup = std::adjacent_find(layers.begin(), layers.end()); dup != layers.end()) {
    return invalid_argument(fmt::format("{}: layer {} is listed twice", what, *dup));
  }

  auto impl = std::make_unique<Impl>();
  CLM_RETURN_IF_ERROR(impl->ctx.init(device));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(device));
  impl->snapshot_dim = weights.snapshot_dim;
  impl->hidden = weights.hidden;
  impl->num_layers = config.num_layers;
  impl->scale = config.residual_scale;
  impl->layers = std::move(layers);
  std::vector<float> packed(weights.weight.begin(), weights.weight.end());
  for (float b : weights.bias) {
    packed.push_back(static_cast<float>(static_cast<double>(config.residual_scale) * static_cast<double>(b)));
  }
  CLM_RETURN_IF_ERROR(impl->ctx.upload_once(packed.data(), packed.size() * sizeof(float), impl->weights));
  impl->w = static_cast<const float*>(impl->weights.pointer);
  impl->scaled_bias = impl->w + h * s;
  out.reset(new DeviceSnapshotAdapter(std::move(impl)));
  return {};
}

Status DeviceSnapshotAdapter::create(int device, const SnapshotAdapter& adapter,
                                     std::unique_ptr<DeviceSnapshotAdapter>& out) {
  SnapshotAdapterConfig config;
  config.num_layers = adapter.num_layers();
  config.layers = adapter.layers();
  config.residual_scale = adapter.residual_scale();
  return create(device, adapter.weights(), config, out);
}

std::int32_t DeviceSnapshotAdapter::num_layers() const { return impl_->num_layers; }

Status DeviceSnapshotAdapter::prepare(const float* snapshots, std::int32_t batch, void* stream) {
  Impl& a = *impl_;
  a.prepared_batch = -1;
  if (batch < 0) return invalid_argument(fmt::format("DeviceSnapshotAdapter::prepare: negative batch {}", batch));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(a.ctx.device));
  const auto b = static_cast<std::size_t>(batch);
  if (batch > 0) {
    CLM_RETURN_IF_ERROR(check_device_buffer(snapshots, b * static_cast<std::size_t>(a.snapshot_dim) * sizeof(float),
                                            a.ctx.device, "DeviceSnapshotAdapter::prepare: snapshots"));
  }
  CLM_RETURN_IF_ERROR(a.ctx.enter(guard, stream));
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(a.ctx.upload({{&kFreshRecord, sizeof(ClmRecord)}}, a.record, stream, at));
  if (batch > 0) {
    CLM_RETURN_IF_ERROR(a.ctx.reserve(a.delta, b * static_cast<std::size_t>(a.hidden) * sizeof(float), stream));
    CLM_RETURN_IF_ERROR(a.ctx.bind(stream));
    // column-major delta^T [hidden x batch] = scale * W (W^T stored) x S^T
    CLM_RETURN_IF_ERROR(a.ctx.gemm(CUBLAS_OP_T, CUBLAS_OP_N, a.hidden, batch, a.snapshot_dim, a.scale, a.w,
                                   a.snapshot_dim, snapshots, a.snapshot_dim, 0.0f,
                                   static_cast<float*>(a.delta.pointer), a.hidden, "cublasGemmEx (adapter W s)"));
    detail::AdapterCheckArgs args{};
    args.delta = static_cast<const float*>(a.delta.pointer);
    args.bias = a.scaled_bias;
    args.cols = a.hidden;
    args.rec = static_cast<ClmRecord*>(at[0]);
    CLM_RETURN_IF_ERROR(
        launch_status(detail::launch_adapter_check(Dims{static_cast<unsigned>(batch), 1, 1}, args, stream),
                      "adapter delta check kernel launch"));
  }
  CLM_RETURN_IF_ERROR(a.ctx.end(stream));
  a.prepared_batch = batch;
  return {};
}

Status DeviceSnapshotAdapter::apply(const ActivationView& hidden_states, std::span<const std::int32_t> indptr,
                                    std::span<const std::uint8_t> apply_mask, std::int32_t layer, void* stream) {
  Impl& a = *impl_;
  const char* what = "DeviceSnapshotAdapter::apply";
  ActLayout layout;
  CLM_RETURN_IF_ERROR(a.check_call(hidden_states, indptr, apply_mask, layer, what, layout));
  const std::size_t batch = indptr.size() - 1;
  if (a.prepared_batch < 0) return failed_precondition(fmt::format("{}: no prepare() before (or it failed)", what));
  if (static_cast<std::size_t>(a.prepared_batch) != batch) {
    return invalid_argument(
        fmt::format("{}: indptr gives a batch of {}, the last prepare() had {}", what, batch, a.prepared_batch));
  }
  if (!std::binary_search(a.layers.begin(), a.layers.end(), layer)) return {};
  // Items: chunks of at most kAddRowsPerItem rows of the sequences that apply.
  std::vector<detail::AddItem> items;
  for (std::size_t b = 0; b < batch; ++b) {
    if (!apply_mask.empty() && apply_mask[b] == 0) continue;
    for (std::int32_t r = indptr[b]; r < indptr[b + 1]; r += detail::kAddRowsPerItem) {
      items.push_back({static_cast<std::int32_t>(b), r, std::min(indptr[b + 1], r + detail::kAddRowsPerItem), 0});
    }
  }
  if (items.empty()) return {};
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(guard.enter(a.ctx.device));
  CLM_RETURN_IF_ERROR(check_device_buffer(hidden_states.data,
                                          hidden_states.elements() * kv_dtype_bytes(hidden_states.dtype), a.ctx.device,
                                          "DeviceSnapshotAdapter::apply: hidden_states"));
  CLM_RETURN_IF_ERROR(a.ctx.enter(guard, stream));
  std::vector<void*> at;
  CLM_RETURN_IF_ERROR(a.ctx.upload({{items.data(), items.size() * sizeof(detail::AddItem)}}, a.meta, stream, at));
  detail::AdapterAddArgs args{};
  args.x = static_cast<unsigned char*>(hidden_states.data);
  args.row_bytes = layout.row_bytes;
  args.cols = a.hidden;
  args.items = static_cast<const detail::AddItem*>(at[0]);
  args.delta = static_cast<const float*>(a.delta.pointer);
  args.bias = a.scaled_bias;
  args.refused = &static_cast<const ClmRecord*>(a.record.pointer)->error;
  const auto col_tiles =
      static_cast<unsigned>((a.hidden / layout.elems + detail::kAddThreads - 1) / detail::kAddThreads);
  CLM_RETURN_IF_ERROR(
      launch_status(detail::launch_adapter_add(static_cast<int>(hidden_states.dtype), layout.vec,
                                               Dims{static_cast<unsigned>(items.size()), col_tiles, 1}, args, stream),
                    "adapter add kernel launch"));
  return a.ctx.end(stream);
}

Status DeviceSnapshotAdapter::check(void* stream) {
  Impl& a = *impl_;
  const char* what = "DeviceSnapshotAdapter::check";
  if (a.prepared_batch < 0) return failed_precondition(fmt::format("{}: no prepare() before (or it failed)", what));
  DeviceGuard guard;
  CLM_RETURN_IF_ERROR(a.ctx.enter(guard, stream));
  if (a.readback == nullptr) CLM_CUDA_TRY(cudaMallocHost(&a.readback, sizeof(ClmRecord)), "cudaMallocHost (readback)");
  CLM_CUDA_TRY(
      cudaMemcpyAsync(a.readback, a.record.pointer, sizeof(ClmRecord), cudaMemcpyDeviceToHost, as_stream(stream)),
      "cudaMemcpyAsync (record)");
  CLM_RETURN_IF_ERROR(a.ctx.end(stream));
  CLM_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  CLM_CUDA_TRY(cudaGetLastError(), "asynchronous error");
  ClmRecord r{};
  std::memcpy(&r, a.readback, sizeof(ClmRecord));
  if (r.error & detail::kErrDelta) {
    return invalid_argument(
        fmt::format("DeviceSnapshotAdapter::prepare (checked): sequence {} gives a non-finite delta (its snapshot "
                    "holds a NaN or Inf, or W s overflows f32); the applies since added nothing",
                    r.nonfinite_seq));
  }
  if (r.error != 0) return {StatusCode::internal, fmt::format("{}: unknown device error bits {:#x}", what, r.error)};
  return {};
}

Status DeviceSnapshotAdapter::inject(const ActivationView& hidden_states, std::span<const std::int32_t> indptr,
                                     const float* snapshots, std::span<const std::uint8_t> apply_mask,
                                     std::int32_t layer, void* stream) {
  Impl& a = *impl_;
  ActLayout layout;
  CLM_RETURN_IF_ERROR(a.check_call(hidden_states, indptr, apply_mask, layer, "DeviceSnapshotAdapter::inject", layout));
  if (!injects_at(layer)) return {};  // nothing to add here; the last prepare() stays as it was
  CLM_RETURN_IF_ERROR(prepare(snapshots, static_cast<std::int32_t>(indptr.size() - 1), stream));
  return apply(hidden_states, indptr, apply_mask, layer, stream);
}

}  // namespace clm::cuda
