// clm/device/cuda_clm.hpp's CudaSrcSums: the SRC tracker's running sums on
// the GPU (SrcTracker::step_device), over the CUDA runtime and the kernels of
// clm_kernels.cu, run in the order and scratch of the device SRC head
// (cuda_clm.cpp, cuda_src_head.hpp). Plain C++; test_cuda_clm_emulated
// compiles it over the fake runtime and the CPU emulator.
#include "clm/device/cuda_clm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "device/device_staging.hpp"
#include "model/clm_args.hpp"
#include "model/clm_context.hpp"
#include "model/clm_launch.hpp"
#include "model/cuda_src_head.hpp"

namespace clm::cuda {

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
  std::int32_t sums_hidden = 0;     // the row width of `sums`
  std::size_t sums_rows = 0;        // rows allocated
  double* sums = nullptr;           // [sums_rows][sums_hidden]
  DeviceBuffer meta;                // per step: record, special ids, indptr, rows, counts
  DeviceBuffer scratch;             // per step: means, Z, logits, scores, added
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
}  // namespace clm::cuda
