// capi/clm_src.cpp: the C ABI of the SRC head (clm.h, "CLM suffix reuse"):
// loading or copying the head's weights into the engine, one SRC step (host or
// device activations), and the retrieval reports the breaker feeds on. Conversion only; the logic is in
// clm::SrcHead and clm::SrcTracker.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "capi_internal.hpp"
#include "clm/model/src_head.hpp"

using namespace clm_capi;

namespace {

clm_status gelu_of(int32_t gelu, const char* fn, clm::Gelu& out) {
  if (gelu != CLM_GELU_TANH && gelu != CLM_GELU_ERF) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: unknown gelu {} (CLM_GELU_TANH or CLM_GELU_ERF)", fn, gelu));
  }
  out = gelu == CLM_GELU_TANH ? clm::Gelu::tanh : clm::Gelu::erf;
  return CLM_OK;
}

clm_status install(clm_engine* engine, clm::SrcHeadWeights weights, clm::Gelu gelu) {
  std::unique_ptr<clm::SrcHead> head;
  if (clm_status s = report(clm::SrcHead::create(std::move(weights), gelu, head))) return s;
  engine->state->engine->set_src_head(std::shared_ptr<const clm::SrcHead>(std::move(head)));
  return CLM_OK;
}

constexpr int32_t kMaxHidden = 1 << 20;

// The checks and conversions both SRC steps share; `step` runs the engine's.
template <class Step>
clm_status src_step_call(const char* fn, clm_src_decision* decisions, clm_engine* engine, clm_seq* const* seqs,
                         size_t n_seqs, const void* attn_out, int32_t dtype, size_t n_rows, int32_t hidden,
                         const int32_t* token_ids, const int32_t* indptr, Step&& step) {
  if (!engine) return null_argument(fn, "engine");
  if (!decisions && n_seqs > 0) return null_argument(fn, "decisions");
  if (!indptr) return null_argument(fn, "indptr");
  if (!attn_out && n_rows > 0) return null_argument(fn, "attn_out");
  if (!token_ids && n_rows > 0) return null_argument(fn, "token_ids");
  if (dtype < CLM_DTYPE_F32 || dtype > CLM_DTYPE_BF16) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: unknown dtype {}", fn, dtype));
  }
  if (hidden < 1 || hidden > kMaxHidden) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: hidden {} is out of range", fn, hidden));
  }
  if (n_rows >= static_cast<size_t>(INT32_MAX) || n_seqs >= static_cast<size_t>(INT32_MAX)) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_rows or n_seqs is too large", fn));
  }
  std::vector<clm::SequenceId> ids;
  if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
  const clm::ConstActivationView view{attn_out, static_cast<clm::ActDType>(dtype), static_cast<std::int64_t>(n_rows),
                                      hidden};
  std::vector<clm::SrcDecision> out(n_seqs);
  if (clm_status s = report(step(*engine->state->engine, ids, view, std::span<const std::int32_t>(indptr, n_seqs + 1),
                                 std::span<clm::SrcDecision>(out)))) {
    return s;
  }
  for (size_t i = 0; i < n_seqs; ++i) {
    decisions[i] = clm_src_decision{out[i].score, out[i].threshold, out[i].scored, out[i].reuse, out[i].baseline, 0};
  }
  return CLM_OK;
}

}  // namespace

extern "C" {

clm_status clm_engine_load_src_head(clm_engine* engine, const char* path, int32_t gelu) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_load_src_head";
    if (!engine) return null_argument(fn, "engine");
    if (!path) return null_argument(fn, "path");
    std::optional<clm::Gelu> requested;
    if (gelu != CLM_GELU_FROM_FILE) {
      clm::Gelu mode;
      if (clm_status s = gelu_of(gelu, fn, mode)) return s;
      requested = mode;
    }
    clm::SrcHeadWeights weights;
    clm::Gelu mode;
    if (clm_status s = report(clm::load_src_head(std::string(path), requested, weights, mode))) return s;
    return install(engine, std::move(weights), mode);
  });
}

clm_status clm_engine_set_src_head(clm_engine* engine, int32_t hidden, const float* w1, const float* b1,
                                   const float* w2, float b2, int32_t gelu) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_set_src_head";
    if (!engine) return null_argument(fn, "engine");
    if (hidden < 4 || hidden % 4 != 0 || hidden > kMaxHidden) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: hidden must be a multiple of 4 in [4, {}], got {}", fn, kMaxHidden, hidden));
    }
    if (!w1) return null_argument(fn, "w1");
    if (!b1) return null_argument(fn, "b1");
    if (!w2) return null_argument(fn, "w2");
    clm::Gelu mode;
    if (clm_status s = gelu_of(gelu, fn, mode)) return s;
    const auto h = static_cast<std::size_t>(hidden);
    clm::SrcHeadWeights weights;
    weights.hidden = hidden;
    weights.w1.assign(w1, w1 + h / 4 * h);
    weights.b1.assign(b1, b1 + h / 4);
    weights.w2.assign(w2, w2 + h / 4);
    weights.b2 = b2;
    return install(engine, std::move(weights), mode);
  });
}

clm_status clm_engine_src_step(clm_src_decision* decisions, clm_engine* engine, clm_seq* const* seqs, size_t n_seqs,
                               const void* attn_out, int32_t dtype, size_t n_rows, int32_t hidden,
                               const int32_t* token_ids, const int32_t* indptr) {
  return guarded([&]() -> clm_status {
    return src_step_call("clm_engine_src_step", decisions, engine, seqs, n_seqs, attn_out, dtype, n_rows, hidden,
                         token_ids, indptr, [&](clm::Engine& e, auto ids, auto view, auto spans_indptr, auto out) {
                           return e.src_step(ids, view, {token_ids, n_rows}, spans_indptr, out);
                         });
  });
}

clm_status clm_engine_src_step_device(clm_src_decision* decisions, clm_engine* engine, clm_seq* const* seqs,
                                      size_t n_seqs, const void* attn_out, int32_t dtype, size_t n_rows, int32_t hidden,
                                      const int32_t* token_ids, const int32_t* indptr, void* stream) {
  return guarded([&]() -> clm_status {
#if CLM_HAVE_CUDA
    return src_step_call("clm_engine_src_step_device", decisions, engine, seqs, n_seqs, attn_out, dtype, n_rows, hidden,
                         token_ids, indptr, [&](clm::Engine& e, auto ids, auto view, auto spans_indptr, auto out) {
                           return e.src_step_device(ids, view, token_ids, spans_indptr, out, stream);
                         });
#else
    (void)decisions, (void)engine, (void)seqs, (void)n_seqs, (void)attn_out, (void)dtype, (void)n_rows, (void)hidden,
        (void)token_ids, (void)indptr, (void)stream;
    return fail(CLM_ERR_UNSUPPORTED, "clm_engine_src_step_device: this library was built without CUDA");
#endif
  });
}

clm_status clm_engine_report_retrieval(clm_engine* engine, clm_seq* const* seqs, size_t n_seqs, const uint8_t* found) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_report_retrieval";
    if (!engine) return null_argument(fn, "engine");
    if (!found && n_seqs > 0) return null_argument(fn, "found");
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
    return report(engine->state->engine->report_snapshot_retrieval(ids, {found, n_seqs}));
  });
}

}  // extern "C"
