// clm/device/cuda_clm.hpp's DeviceSnapshotAdapter: the snapshot adapter's
// injection on the GPU, over the CUDA runtime, cuBLAS (the delta W s) and the
// kernels of clm_kernels.cu. Host validation first, as for the SRC head
// (cuda_clm.cpp; what they share is in clm_context.hpp). Plain C++;
// test_cuda_clm_emulated compiles it over the fake runtime, a fake cuBLAS and
// the CPU emulator.
#include "clm/device/cuda_clm.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "device/device_staging.hpp"
#include "model/clm_args.hpp"
#include "model/clm_context.hpp"
#include "model/clm_launch.hpp"

namespace clm::cuda {

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
