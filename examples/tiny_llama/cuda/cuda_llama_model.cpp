// examples/tiny_llama/cuda/cuda_llama_model.cpp: the CUDA decoder's host
// side: checks, weight upload, the forward's sequence of cuBLAS GEMMs, the
// library's CUDA attention and K/V writes, and the launches of
// llama_kernels.cu. Plain C++ over the CUDA runtime and cuBLAS C APIs (the
// emulated test compiles it over a fake runtime, a fake cuBLAS and the CPU
// emulator).
#include "cuda_llama_model.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/device/cuda_kernels.hpp"
#include "device/device_staging.hpp"  // cuda/: CUDA errors as Status, device buffers, pinned staging
#include "llama_launch.hpp"

namespace tiny_llama {

using clm::cuda::detail::as_stream;
using clm::cuda::detail::DeviceBuffer;
using clm::cuda::detail::DeviceGuard;
using clm::cuda::detail::GrowthPolicy;
using clm::cuda::detail::launch_status;
using cuda_detail::Dims;

namespace {

clm::Status cublas_error(cublasStatus_t err, const char* what) {
  std::string text = fmt::format("{}: {} ({})", what, cublasGetStatusString(err), cublasGetStatusName(err));
  switch (err) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return clm::out_of_memory(std::move(text));
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return clm::unsupported(std::move(text));
    default:
      return {clm::StatusCode::internal, std::move(text)};
  }
}

#define TINY_LLAMA_CUBLAS_TRY(call, what)                                           \
  do {                                                                              \
    const cublasStatus_t blas_err_ = (call);                                        \
    if (blas_err_ != CUBLAS_STATUS_SUCCESS) return cublas_error(blas_err_, (what)); \
  } while (0)

// Scratch grows with a quarter of headroom, so that a slowly growing batch
// does not reallocate every step.
constexpr GrowthPolicy kScratchGrowth{true, std::size_t{1} << 16, "cudaMalloc (tiny_llama scratch)"};

// One GEMM for q, k and v and one for gate and up, as the CPU decoder does:
// fewer launches, and each reads the normed rows once.
struct DeviceLayer {
  const float* attn_norm;
  const float* w_qkv;  // [q_dim + 2 kv_dim][hidden]: wq's rows, then wk's, then wv's
  const float* wo;
  const float* mlp_norm;
  const float* w_gate_up;  // [2 intermediate][hidden]: w_gate's rows, then w_up's
  const float* w_down;
};

bool attention_supports(std::int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace

struct CudaLlamaModel::Impl {
  LlamaConfig config;
  clm::Engine& engine;
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceBuffer blas_workspace;
  DeviceBuffer weights;  // every tensor, 256-byte aligned, and the RoPE table
  const float* embed = nullptr;
  const float* final_norm = nullptr;
  const float* lm_head = nullptr;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  std::vector<DeviceLayer> layers;
  std::unique_ptr<clm::cuda::Workspace> workspace;  // the library's attention and write_kv
  // The forward's row metadata goes up through two pinned buffers, used in turn.
  clm::cuda::detail::StagingRing<2> staging{std::size_t{1} << 14};
  DeviceBuffer meta;
  DeviceBuffer x, h, qkv, q, k, v, attn, o, gate_up, gate, last, logits, decode_q, decode_out;
  LayerObserver* observer = nullptr;
  // Host scratch, reused across calls.
  std::vector<std::int32_t> positions, last_rows, decode_rows;
  const void* decode_rows_on_device = nullptr;  // this forward's decode_rows, uploaded
  clm::PagedBatch decode;
  std::vector<float> host_rows;  // the observer's copies

  Impl(const LlamaConfig& c, clm::Engine& e) : config(c), engine(e) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  ~Impl() {
    DeviceGuard guard;
    if (!guard.enter(device).ok()) return;
    if (stream) cudaStreamSynchronize(stream);
    workspace.reset();
    if (blas) cublasDestroy(blas);
    for (DeviceBuffer* b : {&blas_workspace, &weights, &meta, &x, &h, &qkv, &q, &k, &v, &attn, &o, &gate_up, &gate,
                            &last, &logits, &decode_q, &decode_out}) {
      if (b->pointer) cudaFree(b->pointer);
    }
    staging.release();
    if (stream) cudaStreamDestroy(stream);
  }

  clm::Status init(const LlamaWeights& w) {
    device = engine.pool().config().device;
    int count = 0;
    if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
      cudaGetLastError();  // clear
      return clm::unsupported(fmt::format("tiny_llama: no usable CUDA device: {}", cudaGetErrorString(err)));
    }
    if (device < 0 || device >= count) {
      return clm::unsupported(fmt::format("tiny_llama: no CUDA device {} ({} present)", device, count));
    }
    DeviceGuard guard;
    CLM_RETURN_IF_ERROR(guard.enter(device));
    CLM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    CLM_RETURN_IF_ERROR(staging.create_events());
    CLM_RETURN_IF_ERROR(clm::cuda::Workspace::create(device, workspace));
    TINY_LLAMA_CUBLAS_TRY(cublasCreate(&blas), "cublasCreate");
    // f32 compute without TF32 (CUBLAS_DEFAULT_MATH), whatever the handle's
    // default: TF32's 10-bit mantissa would break the 1e-5 agreement of reuse
    // and recompute.
    TINY_LLAMA_CUBLAS_TRY(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    int major = 0;
    CLM_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    // cuBLAS's recommended user workspace: 32 MiB on Hopper, 4 MiB elsewhere.
    const std::size_t blas_bytes = major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
    CLM_CUDA_TRY(cudaMalloc(&blas_workspace.pointer, blas_bytes), "cudaMalloc (cuBLAS workspace)");
    blas_workspace.capacity = blas_bytes;
    TINY_LLAMA_CUBLAS_TRY(cublasSetStream(blas, stream), "cublasSetStream");
    TINY_LLAMA_CUBLAS_TRY(cublasSetWorkspace(blas, blas_workspace.pointer, blas_workspace.capacity),
                          "cublasSetWorkspace");
    return upload_weights(w);
  }

  // Every tensor into one allocation (synchronous: once, at create()).
  clm::Status upload_weights(const LlamaWeights& w) {
    std::vector<float> cos, sin;
    rope_table(config, cos, sin);
    std::vector<std::pair<const std::vector<float>*, const float**>> tensors;
    layers.resize(w.layers.size());
    // The fused projections' host copies live until the copies below are done.
    std::vector<std::vector<float>> fused(2 * w.layers.size());
    auto concat = [](std::vector<float>& out, std::initializer_list<const std::vector<float>*> parts) {
      for (const std::vector<float>* part : parts) out.insert(out.end(), part->begin(), part->end());
    };
    tensors.emplace_back(&w.embed, &embed);
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
      const LlamaLayerWeights& src = w.layers[l];
      DeviceLayer& dst = layers[l];
      concat(fused[2 * l], {&src.wq, &src.wk, &src.wv});
      concat(fused[2 * l + 1], {&src.w_gate, &src.w_up});
      const std::vector<float>& qkv_rows = fused[2 * l];
      const std::vector<float>& gate_up_rows = fused[2 * l + 1];
      for (auto [host, device_pointer] :
           {std::pair{&src.attn_norm, &dst.attn_norm}, std::pair{&qkv_rows, &dst.w_qkv}, std::pair{&src.wo, &dst.wo},
            std::pair{&src.mlp_norm, &dst.mlp_norm}, std::pair{&gate_up_rows, &dst.w_gate_up},
            std::pair{&src.w_down, &dst.w_down}}) {
        tensors.emplace_back(host, device_pointer);
      }
    }
    tensors.emplace_back(&w.final_norm, &final_norm);
    if (!w.lm_head.empty()) tensors.emplace_back(&w.lm_head, &lm_head);
    tensors.emplace_back(&cos, &rope_cos);
    tensors.emplace_back(&sin, &rope_sin);
    const auto aligned = [](std::size_t floats) { return (floats + 63) / 64 * 64; };  // 256 bytes
    std::size_t total = 0;
    for (const auto& t : tensors) total += aligned(t.first->size());
    CLM_CUDA_TRY(cudaMalloc(&weights.pointer, total * sizeof(float)), "cudaMalloc (tiny_llama weights)");
    weights.capacity = total * sizeof(float);
    std::size_t offset = 0;
    for (const auto& [host, device_pointer] : tensors) {
      float* at = static_cast<float*>(weights.pointer) + offset;
      CLM_CUDA_TRY(cudaMemcpy(at, host->data(), host->size() * sizeof(float), cudaMemcpyHostToDevice),
                   "cudaMemcpy (tiny_llama weights)");
      *device_pointer = at;
      offset += aligned(host->size());
    }
    if (w.lm_head.empty()) lm_head = embed;  // tied
    return {};
  }

  std::size_t device_bytes() const {
    std::size_t n = workspace ? workspace->device_bytes() : 0;
    for (const DeviceBuffer* b : {&blas_workspace, &weights, &meta, &x, &h, &qkv, &q, &k, &v, &attn, &o, &gate_up,
                                  &gate, &last, &logits, &decode_q, &decode_out}) {
      n += b->capacity;
    }
    return n;
  }

  clm::Status reserve(DeviceBuffer& b, std::int64_t rows, std::int64_t cols) {
    return clm::cuda::detail::reserve(b, static_cast<std::size_t>(rows * cols) * sizeof(float), stream, kScratchGrowth);
  }
  static float* at(DeviceBuffer& b, std::int64_t row = 0, std::int64_t cols = 0) {
    return static_cast<float*>(b.pointer) + row * cols;
  }

  // y [m][n] = x [m][k] * w [n][k]^T. cuBLAS is column-major: y^T = w . x^T,
  // with w read transposed (its rows are the k-vectors).
  clm::Status gemm(const float* x_rows, std::int64_t m, std::int64_t k_dim, const float* w, std::int64_t n, float* y,
                   const char* what) {
    const float one = 1.0f, zero = 0.0f;
    const int mi = static_cast<int>(m), ki = static_cast<int>(k_dim), ni = static_cast<int>(n);
    TINY_LLAMA_CUBLAS_TRY(
        cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &one, w, CUDA_R_32F, ki, x_rows, CUDA_R_32F, ki, &zero,
                     y, CUDA_R_32F, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
    return {};
  }

  clm::Status rms_norm(const float* in, std::int64_t rows, const float* weight, float* out) {
    const cuda_detail::RmsNormArgs args{in, weight, out, config.hidden, config.rms_norm_eps};
    return launch_status(cuda_detail::launch_rms_norm(Dims{static_cast<unsigned>(rows), 1, 1}, args, stream),
                         "tiny_llama RMSNorm kernel launch");
  }

  clm::Status add(float* into, const float* y, std::int64_t n) {
    const cuda_detail::AddArgs args{into, y, n};
    return launch_status(cuda_detail::launch_add(Dims{cuda_detail::elementwise_blocks(n), 1, 1}, args, stream),
                         "tiny_llama residual add kernel launch");
  }

  // The observer's slow path: rows to the host (and back, for after_layer).
  clm::Status download(const float* device_rows, std::int64_t count) {
    host_rows.resize(static_cast<std::size_t>(count));
    CLM_CUDA_TRY(cudaMemcpyAsync(host_rows.data(), device_rows, host_rows.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync (rows for the observer)");
    CLM_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return {};
  }

  clm::Status attention(std::int32_t layer, const ForwardBatch& b, const clm::PagedKvView& kv) {
    clm::AttentionParams params;
    params.layer = layer;
    params.num_q_heads = config.num_heads;
    const std::int64_t q_dim = config.q_dim();
    for (std::size_t i = 0; i < b.ids.size(); ++i) {
      const std::int32_t row = b.indptr[i], rows = b.indptr[i + 1] - row;
      if (rows == 1) continue;  // decode: below, all at once
      const std::int32_t kv_len = b.first_position[i] + rows;
      const auto pages = std::span(b.page_indices)
                             .subspan(static_cast<std::size_t>(b.page_indptr[i]),
                                      static_cast<std::size_t>(b.page_indptr[i + 1] - b.page_indptr[i]));
      CLM_RETURN_IF_ERROR(clm::cuda::paged_prefill_attention(*workspace, kv, params, at(q, row, q_dim), rows, pages,
                                                             kv_len, at(attn, row, q_dim), stream));
    }
    if (decode_rows.empty()) return {};
    // The decode kernels take their queries and outputs contiguous: gather the
    // decode rows' q, and scatter their outputs back.
    const auto count = static_cast<unsigned>(decode_rows.size());
    const auto* device_rows = static_cast<const std::int32_t*>(decode_rows_on_device);
    CLM_RETURN_IF_ERROR(launch_status(
        cuda_detail::launch_copy_rows(
            Dims{count, 1, 1}, {at(q), device_rows, at(decode_q), nullptr, static_cast<std::int32_t>(q_dim)}, stream),
        "tiny_llama row gather kernel launch"));
    CLM_RETURN_IF_ERROR(clm::cuda::decode_run(*workspace, kv, params, at(decode_q), at(decode_out), stream));
    return launch_status(
        cuda_detail::launch_copy_rows(
            Dims{count, 1, 1}, {at(decode_out), nullptr, at(attn), device_rows, static_cast<std::int32_t>(q_dim)},
            stream),
        "tiny_llama row scatter kernel launch");
  }

  clm::Status forward(const ForwardBatch& b, std::span<float> host_logits) {
    const clm::PagedKvPool& pool = engine.pool();
    CLM_RETURN_IF_ERROR(check_forward_batch(config, pool.config(), b, host_logits));
    const LlamaConfig& c = config;
    const std::int64_t rows = b.rows(), hidden = c.hidden, q_dim = c.q_dim(), kv_dim = c.kv_dim(),
                       inter = c.intermediate;
    const auto n = static_cast<std::int64_t>(b.ids.size());
    positions.resize(static_cast<std::size_t>(rows));
    last_rows.resize(static_cast<std::size_t>(n));
    decode_rows.clear();
    decode.indptr.assign(1, 0);
    decode.indices.clear();
    decode.last_page_len.clear();
    const std::int32_t page_size = pool.config().page_size;
    for (std::size_t i = 0; i < b.ids.size(); ++i) {
      const std::int32_t first_row = b.indptr[i], count = b.indptr[i + 1] - first_row;
      for (std::int32_t r = 0; r < count; ++r)
        positions[static_cast<std::size_t>(first_row + r)] = b.first_position[i] + r;
      last_rows[i] = b.indptr[i + 1] - 1;
      if (count != 1) continue;
      const auto first_page = static_cast<std::size_t>(b.page_indptr[i]);
      const auto pages = static_cast<std::size_t>(b.page_indptr[i + 1] - b.page_indptr[i]);
      decode.indices.insert(decode.indices.end(), b.page_indices.begin() + static_cast<std::ptrdiff_t>(first_page),
                            b.page_indices.begin() + static_cast<std::ptrdiff_t>(first_page + pages));
      decode.indptr.push_back(static_cast<std::int32_t>(decode.indices.size()));
      decode.last_page_len.push_back(b.first_position[i] + 1 - static_cast<std::int32_t>(pages - 1) * page_size);
      decode_rows.push_back(first_row);
    }

    DeviceGuard guard;
    CLM_RETURN_IF_ERROR(guard.enter(device));
    const clm::PagedKvView kv = clm::PagedKvView::of(pool);
    clm::AttentionParams params;
    params.num_q_heads = c.num_heads;
    // The decode plan validates its page tables before any layer writes K/V;
    // it serves every layer.
    if (!decode_rows.empty()) {
      CLM_RETURN_IF_ERROR(
          clm::cuda::decode_plan(*workspace, kv, params, decode.indptr, decode.indices, decode.last_page_len, stream));
    }
    for (DeviceBuffer* buffer : {&x, &h, &o}) CLM_RETURN_IF_ERROR(reserve(*buffer, rows, hidden));
    for (DeviceBuffer* buffer : {&q, &attn}) CLM_RETURN_IF_ERROR(reserve(*buffer, rows, q_dim));
    for (DeviceBuffer* buffer : {&k, &v}) CLM_RETURN_IF_ERROR(reserve(*buffer, rows, kv_dim));
    CLM_RETURN_IF_ERROR(reserve(qkv, rows, q_dim + 2 * kv_dim));
    CLM_RETURN_IF_ERROR(reserve(gate_up, rows, 2 * inter));
    CLM_RETURN_IF_ERROR(reserve(gate, rows, inter));
    CLM_RETURN_IF_ERROR(reserve(last, n, hidden));
    CLM_RETURN_IF_ERROR(reserve(logits, n, c.vocab_size));
    const auto decode_count = static_cast<std::int64_t>(decode_rows.size());
    if (decode_count > 0) {
      for (DeviceBuffer* buffer : {&decode_q, &decode_out}) CLM_RETURN_IF_ERROR(reserve(*buffer, decode_count, q_dim));
    }
    std::vector<void*> meta_at;
    CLM_RETURN_IF_ERROR(staging.upload({{b.tokens.data(), b.tokens.size() * sizeof(std::int32_t)},
                                        {positions.data(), positions.size() * sizeof(std::int32_t)},
                                        {last_rows.data(), last_rows.size() * sizeof(std::int32_t)},
                                        {decode_rows.data(), decode_rows.size() * sizeof(std::int32_t)}},
                                       meta, kScratchGrowth, stream, meta_at));
    const auto* tokens_on_device = static_cast<const std::int32_t*>(meta_at[0]);
    const auto* positions_on_device = static_cast<const std::int32_t*>(meta_at[1]);
    const auto* last_rows_on_device = static_cast<const std::int32_t*>(meta_at[2]);
    decode_rows_on_device = meta_at[3];

    const Dims per_row{static_cast<unsigned>(rows), 1, 1};
    CLM_RETURN_IF_ERROR(
        launch_status(cuda_detail::launch_embed(per_row, {embed, tokens_on_device, at(x), c.hidden}, stream),
                      "tiny_llama embedding kernel launch"));
    for (std::int32_t layer = 0; layer < c.num_layers; ++layer) {
      const DeviceLayer& w = layers[static_cast<std::size_t>(layer)];
      CLM_RETURN_IF_ERROR(rms_norm(at(x), rows, w.attn_norm, at(h)));
      CLM_RETURN_IF_ERROR(gemm(at(h), rows, hidden, w.w_qkv, q_dim + 2 * kv_dim, at(qkv), "cublasGemmEx (qkv_proj)"));
      CLM_RETURN_IF_ERROR(
          launch_status(cuda_detail::launch_split_qkv(per_row,
                                                      {at(qkv), positions_on_device, rope_cos, rope_sin, at(q), at(k),
                                                       at(v), c.num_heads, c.num_kv_heads, c.head_dim},
                                                      stream),
                        "tiny_llama q/k/v split (RoPE) kernel launch"));
      CLM_RETURN_IF_ERROR(clm::cuda::write_kv(*workspace, kv, layer, at(k), at(v), b.slots, stream));
      CLM_RETURN_IF_ERROR(attention(layer, b, kv));
      CLM_RETURN_IF_ERROR(gemm(at(attn), rows, q_dim, w.wo, hidden, at(o), "cublasGemmEx (o_proj)"));
      if (observer) {
        CLM_RETURN_IF_ERROR(download(at(o), rows * hidden));
        CLM_RETURN_IF_ERROR(observer->on_attention_output(layer, b, host_rows.data()));
      }
      CLM_RETURN_IF_ERROR(add(at(x), at(o), rows * hidden));
      CLM_RETURN_IF_ERROR(rms_norm(at(x), rows, w.mlp_norm, at(h)));
      CLM_RETURN_IF_ERROR(
          gemm(at(h), rows, hidden, w.w_gate_up, 2 * inter, at(gate_up), "cublasGemmEx (gate_up_proj)"));
      CLM_RETURN_IF_ERROR(launch_status(
          cuda_detail::launch_silu_mul(Dims{cuda_detail::elementwise_blocks(rows * inter), 1, 1},
                                       {at(gate_up), at(gate), rows * inter, static_cast<std::int32_t>(inter)}, stream),
          "tiny_llama SiLU kernel launch"));
      CLM_RETURN_IF_ERROR(gemm(at(gate), rows, inter, w.w_down, hidden, at(o), "cublasGemmEx (down_proj)"));
      CLM_RETURN_IF_ERROR(add(at(x), at(o), rows * hidden));
      if (observer) {
        CLM_RETURN_IF_ERROR(download(at(x), rows * hidden));
        CLM_RETURN_IF_ERROR(observer->after_layer(layer, b, host_rows.data()));
        // Pageable memory: the copy has left host_rows when the call returns.
        CLM_CUDA_TRY(
            cudaMemcpyAsync(at(x), host_rows.data(), host_rows.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (rows from the observer)");
      }
    }
    CLM_RETURN_IF_ERROR(
        launch_status(cuda_detail::launch_copy_rows(Dims{static_cast<unsigned>(n), 1, 1},
                                                    {at(x), last_rows_on_device, at(last), nullptr, c.hidden}, stream),
                      "tiny_llama last-row gather kernel launch"));
    CLM_RETURN_IF_ERROR(rms_norm(at(last), n, final_norm, at(last)));
    if (observer) {
      CLM_RETURN_IF_ERROR(download(at(last), n * hidden));
      CLM_RETURN_IF_ERROR(observer->on_final_hidden(b, host_rows.data()));
    }
    CLM_RETURN_IF_ERROR(gemm(at(last), n, hidden, lm_head, c.vocab_size, at(logits), "cublasGemmEx (lm_head)"));
    CLM_CUDA_TRY(cudaMemcpyAsync(host_logits.data(), at(logits), host_logits.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync (logits)");
    // Also where an error inside any kernel of the forward surfaces.
    CLM_CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize (forward)");
    return {};
  }
};

clm::Status CudaLlamaModel::create(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                                   const ModelOptions&, std::unique_ptr<CudaLlamaModel>& out) {
  const clm::PagedKvPoolConfig& pool = engine.pool().config();
  CLM_RETURN_IF_ERROR(check_decoder_setup(config, weights, pool));
  if (!attention_supports(config.head_dim)) {
    return clm::unsupported(
        fmt::format("tiny_llama: the CUDA attention kernels support head_dim 64 and 128; the model has head_dim {}",
                    config.head_dim));
  }
  if (pool.memory != clm::MemoryKind::device) {
    return clm::unsupported(
        fmt::format("tiny_llama: the CUDA decoder needs a device pool (MemoryKind::device); the "
                    "engine's pool is {} memory",
                    pool.memory == clm::MemoryKind::host ? "host" : "no"));
  }
  auto impl = std::make_unique<Impl>(config, engine);
  CLM_RETURN_IF_ERROR(impl->init(weights));
  out.reset(new CudaLlamaModel(std::move(impl)));
  return {};
}

CudaLlamaModel::CudaLlamaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaLlamaModel::~CudaLlamaModel() = default;

const LlamaConfig& CudaLlamaModel::config() const { return impl_->config; }
clm::Engine& CudaLlamaModel::engine() const { return impl_->engine; }
void CudaLlamaModel::set_observer(LayerObserver* observer) { impl_->observer = observer; }
std::size_t CudaLlamaModel::device_bytes() const { return impl_->device_bytes(); }

clm::Status CudaLlamaModel::forward(const ForwardBatch& batch, std::span<float> host_logits) {
  return impl_->forward(batch, host_logits);
}

}  // namespace tiny_llama
