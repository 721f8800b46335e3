// clm/device/cuda_clm.hpp's DeviceSrcHead over the CUDA runtime and cuBLAS:
// the device SRC head. Host validation first, then uploads through pinned
// staging buffers, cuBLAS GEMMs and the launches of clm_kernels.cu. Plain C++:
// the CUDA runtime and cuBLAS APIs are C APIs. (test_cuda_clm_emulated
// compiles this file over a fake runtime, a fake cuBLAS and the CPU emulator.)
// Its running sums are in cuda_src_sums.cpp and the snapshot adapter in
// cuda_snapshot_adapter.cpp; what they share, in clm_context.hpp.
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
#include "model/cuda_src_head.hpp"

namespace clm::cuda {

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
}  // namespace clm::cuda
