// cuda/model/cuda_src_head.hpp: the inside of DeviceSrcHead
// (clm/device/cuda_clm.hpp), defined in cuda_clm.cpp, which CudaSrcSums
// (cuda_src_sums.cpp) also runs its steps through (the head's call order,
// scratch and finishing kernels), and the message of a record's error bits
// that both report. Internal to cuda/, not installed.
#pragma once

#include <span>
#include <string>

#include <fmt/format.h>

#include "model/clm_context.hpp"

namespace clm::cuda {

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
  DeviceBuffer sticky;              // ClmRecord: data errors of score_async calls not yet checked
  DeviceBuffer meta;                // per call: record, counters, special ids, indptr / items, splits
  DeviceBuffer scratch;             // per call: means, Z, logits, partial sums and counts, own scores
  DeviceBuffer pooled;              // score_pooled_async: record, Z, logits
  detail::PinnedReadback readback;  // ClmRecord, then scores (score())
  void* zero_record = nullptr;      // pinned, a zero ClmRecord (resets `sticky`)

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

namespace detail {

// The message of a record with error bits (CPU order: non-finite input first).
inline Status verdict_status(const ClmRecord& r, const char* what) {
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

}  // namespace detail

using detail::verdict_status;

}  // namespace clm::cuda
