// capi/clm_kernels.cpp: the C ABI of the attention and KV kernels over the
// engine's pool (clm.h, "attention and KV kernels"). Conversion only: NULLs,
// struct sizes and lengths are checked here, spans are built from pointers and
// the caller's lengths, and the work is done by clm::write_kv,
// clm::paged_prefill_attention, ... (attention.hpp, host pools) or their
// clm::cuda versions (cuda_kernels.hpp, device pools, when built with CUDA).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "capi_internal.hpp"
#include "clm/kernels/attention.hpp"
#if CLM_HAVE_CUDA
#include "clm/device/cuda_kernels.hpp"
#endif

using namespace clm_capi;

namespace {

// Which kernels a pool's memory calls for.
enum class Backend { cpu, cuda };

clm_status backend_of(const clm::PagedKvPool& pool, const char* fn, Backend& out) {
  switch (pool.config().memory) {
    case clm::MemoryKind::host:
      out = Backend::cpu;
      return CLM_OK;
    case clm::MemoryKind::device:
#if CLM_HAVE_CUDA
      out = Backend::cuda;
      return CLM_OK;
#else
      return fail(CLM_ERR_UNSUPPORTED,
                  fmt::format("{}: the engine's pool is in device memory and this library was built without CUDA", fn));
#endif
    case clm::MemoryKind::none:
      break;
  }
  return fail(CLM_ERR_FAILED_PRECONDITION,
              fmt::format("{}: the engine's pool keeps no KV bytes (CLM_MEMORY_NONE): the host keeps its own KV", fn));
}

// A clm::Status as a clm_status whose message names the C function.
clm_status report_as(const char* fn, const clm::Status& s) {
  return s.ok() ? CLM_OK : fail(static_cast<clm_status>(s.code()), fmt::format("{}: {}", fn, s.message()));
}

// a * b * c, false when it overflows.
bool product(std::size_t a, std::size_t b, std::size_t c, std::size_t& out) {
  std::size_t ab = 0;
  return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, &out);
}

// The caller's length of an activation buffer must be rows x heads x head_dim.
clm_status check_len(const char* fn, const char* name, std::size_t len, const char* rows_name, std::size_t rows,
                     const char* heads_name, std::int32_t heads, std::int32_t head_dim) {
  std::size_t expected = 0;
  if (!product(rows, static_cast<std::size_t>(heads), static_cast<std::size_t>(head_dim), expected)) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: {} {} x {} {} x head_dim {} overflows", fn, rows_name, rows,
                                                      heads_name, heads, head_dim));
  }
  if (len != expected) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} is {} floats; {} {} x {} {} x head_dim {} need {}", fn, name, len, rows_name, rows,
                            heads_name, heads, head_dim, expected));
  }
  return CLM_OK;
}

// q and out of an attention call: [rows][num_q_heads][head_dim] floats each, non-null when non-empty.
clm_status check_q_and_out(const char* fn, const float* q, size_t q_len, const float* out, size_t out_len,
                           const char* rows_name, std::size_t rows, const clm::AttentionParams& p,
                           std::int32_t head_dim) {
  if (!q && q_len > 0) return null_argument(fn, "q (with q_len > 0)");
  if (!out && out_len > 0) return null_argument(fn, "out (with out_len > 0)");
  if (clm_status s = check_len(fn, "q_len", q_len, rows_name, rows, "num_q_heads", p.num_q_heads, head_dim)) return s;
  return check_len(fn, "out_len", out_len, rows_name, rows, "num_q_heads", p.num_q_heads, head_dim);
}

clm_attention_params default_params() {
  const clm::AttentionParams defaults;
  clm_attention_params p{};
  p.struct_size = sizeof p;
  p.layer = defaults.layer;
  p.num_q_heads = defaults.num_q_heads;
  p.softmax_scale = defaults.softmax_scale;
  p.sliding_window = defaults.sliding_window;
  p.num_threads = defaults.num_threads;
  p.stream = nullptr;
  return p;
}

// The caller's params (any known version) as clm::AttentionParams + stream.
clm_status read_params(const clm_attention_params* params, const char* fn, clm::AttentionParams& out, void*& stream) {
  if (!params) return null_argument(fn, "params (num_q_heads has no default)");
  if (clm_status s = check_struct_size<clm_attention_params>(params->struct_size, {kAttentionParamsV1}, fn)) return s;
  const clm_attention_params full = widen(params, params->struct_size, default_params());
  if (full.num_q_heads <= 0) {
    return fail(
        CLM_ERR_INVALID_ARGUMENT,
        fmt::format("{}: params->num_q_heads {} must be a positive multiple of kv_heads", fn, full.num_q_heads));
  }
  out.layer = full.layer;
  out.num_q_heads = full.num_q_heads;
  out.softmax_scale = full.softmax_scale;
  out.sliding_window = full.sliding_window;
  out.num_threads = full.num_threads;
  stream = full.stream;
  return CLM_OK;
}

// What both attention calls start with: the engine's pool and where it
// lives, and the caller's params (any known version) with the stream.
struct AttentionCall {
  const clm::PagedKvPool* pool = nullptr;
  Backend backend = Backend::cpu;
  clm::AttentionParams params;
  void* stream = nullptr;
};
clm_status begin_attention(const char* fn, const clm_engine* engine, const clm_attention_params* params,
                           AttentionCall& out) {
  if (!engine) return null_argument(fn, "engine");
  out.pool = &engine->state->engine->pool();
  if (clm_status s = backend_of(*out.pool, fn, out.backend)) return s;
  return read_params(params, fn, out.params, out.stream);
}

#if CLM_HAVE_CUDA
// One workspace per host thread and device (a Workspace is not thread-safe),
// created on first use and freed when the thread exits.
clm_status workspace_for(int device, const char* fn, clm::cuda::Workspace*& out) {
  thread_local std::vector<std::pair<int, std::unique_ptr<clm::cuda::Workspace>>> spaces;
  for (auto& [d, ws] : spaces) {
    if (d == device) {
      out = ws.get();
      return CLM_OK;
    }
  }
  std::unique_ptr<clm::cuda::Workspace> ws;
  if (clm_status s = report_as(fn, clm::cuda::Workspace::create(device, ws))) return s;
  out = ws.get();
  spaces.emplace_back(device, std::move(ws));
  return CLM_OK;
}
#endif

// Runs cpu() for a host pool, cuda(workspace) for a device pool (CUDA builds).
template <class Cpu, class Cuda>
clm_status dispatch([[maybe_unused]] Backend backend, [[maybe_unused]] const clm::PagedKvPool& pool, const char* fn,
                    Cpu&& cpu, [[maybe_unused]] Cuda&& cuda) {
#if CLM_HAVE_CUDA
  if (backend == Backend::cuda) {
    clm::cuda::Workspace* ws = nullptr;
    if (clm_status s = workspace_for(pool.config().device, fn, ws)) return s;
    return report_as(fn, cuda(*ws));
  }
#endif
  return report_as(fn, cpu());
}

// The caller's page buffer must hold n_pages whole pages.
clm_status check_page_buffer(const char* fn, const void* buffer, size_t buffer_len, const clm::PagedKvPool& pool,
                             size_t n_pages) {
  if (!buffer && n_pages > 0) return null_argument(fn, "buffer (with n_pages > 0)");
  std::size_t needed = 0;
  if (!product(n_pages, pool.page_bytes(), 1, needed) || buffer_len < needed) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: buffer_len {} is too small for {} pages of {} bytes", fn,
                                                      buffer_len, n_pages, pool.page_bytes()));
  }
  return CLM_OK;
}

// gather / scatter: the checks both share, then the CPU or CUDA copy between
// the engine's pool and the caller's buffer of whole pages.
template <class CpuCopy, class CudaCopy>
clm_status transfer_pages(const char* fn, const clm_engine* engine, const int32_t* pages, size_t n_pages,
                          const void* buffer, size_t buffer_len, CpuCopy cpu_copy, CudaCopy cuda_copy) {
  return guarded([&]() -> clm_status {
    if (!engine) return null_argument(fn, "engine");
    const clm::PagedKvPool& pool = engine->state->engine->pool();
    Backend backend = Backend::cpu;
    if (clm_status s = backend_of(pool, fn, backend)) return s;
    if (!pages && n_pages > 0) return null_argument(fn, "pages (with n_pages > 0)");
    if (clm_status s = check_page_buffer(fn, buffer, buffer_len, pool, n_pages)) return s;
    const clm::PagedKvView kv = clm::PagedKvView::of(pool);
    const std::span<const std::int32_t> ids(pages, n_pages);
    return dispatch(
        backend, pool, fn, [&] { return cpu_copy(kv, ids); }, [&](auto& ws) { return cuda_copy(ws, kv, ids); });
  });
}

}  // namespace

extern "C" {

clm_status clm_attention_params_init(clm_attention_params* params, size_t struct_size) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_attention_params_init";
    if (!params) return null_argument(fn, "params");
    if (clm_status s = check_struct_size<clm_attention_params>(struct_size, {kAttentionParamsV1}, fn)) return s;
    clm_attention_params defaults = default_params();
    defaults.struct_size = static_cast<uint32_t>(struct_size);
    std::memcpy(static_cast<void*>(params), &defaults, struct_size);  // only the fields the caller's version has
    return CLM_OK;
  });
}

clm_status clm_engine_write_kv(clm_engine* engine, int32_t layer, const int64_t* slots, size_t n_slots, const float* k,
                               const float* v, size_t kv_len, void* stream) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_write_kv";
    if (!engine) return null_argument(fn, "engine");
    const clm::PagedKvPool& pool = engine->state->engine->pool();
    Backend backend = Backend::cpu;
    if (clm_status s = backend_of(pool, fn, backend)) return s;
    if (!slots && n_slots > 0) return null_argument(fn, "slots (with n_slots > 0)");
    if (!k && kv_len > 0) return null_argument(fn, "k (with kv_len > 0)");
    if (!v && kv_len > 0) return null_argument(fn, "v (with kv_len > 0)");
    const clm::PagedKvPoolConfig& c = pool.config();
    if (clm_status s = check_len(fn, "kv_len", kv_len, "n_slots", n_slots, "kv_heads", c.kv_heads, c.head_dim)) {
      return s;
    }
    const clm::PagedKvView kv = clm::PagedKvView::of(pool);
    const std::span<const std::int64_t> slot_span(slots, n_slots);
    return dispatch(
        backend, pool, fn, [&] { return clm::write_kv(kv, layer, k, v, slot_span); },
        [&]([[maybe_unused]] auto& ws) {
#if CLM_HAVE_CUDA
          return clm::cuda::write_kv(ws, kv, layer, k, v, slot_span, stream);
#else
          (void)stream;
          return clm::Status{};
#endif
        });
  });
}

clm_status clm_engine_paged_prefill_attention(float* out, size_t out_len, const clm_engine* engine,
                                              const clm_attention_params* params, const float* q, size_t q_len,
                                              int32_t n_new, const int32_t* pages, size_t n_pages, int32_t kv_len) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_paged_prefill_attention";
    AttentionCall call;
    if (clm_status s = begin_attention(fn, engine, params, call)) return s;
    const clm::PagedKvPool& pool = *call.pool;
    const clm::AttentionParams& p = call.params;
    if (n_new < 0 || kv_len < n_new) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_new {} must be in [0, kv_len {}]", fn, n_new, kv_len));
    }
    if (clm_status s = check_q_and_out(fn, q, q_len, out, out_len, "n_new", static_cast<std::size_t>(n_new), p,
                                       pool.config().head_dim)) {
      return s;
    }
    if (!pages && n_pages > 0) return null_argument(fn, "pages (with n_pages > 0)");
    const clm::PagedKvView kv = clm::PagedKvView::of(pool);
    const std::span<const std::int32_t> page_span(pages, n_pages);
    return dispatch(
        call.backend, pool, fn, [&] { return clm::paged_prefill_attention(kv, p, q, n_new, page_span, kv_len, out); },
        [&]([[maybe_unused]] auto& ws) {
#if CLM_HAVE_CUDA
          return clm::cuda::paged_prefill_attention(ws, kv, p, q, n_new, page_span, kv_len, out, call.stream);
#else
          return clm::Status{};
#endif
        });
  });
}

clm_status clm_engine_paged_decode_attention(float* out, size_t out_len, const clm_engine* engine,
                                             const clm_attention_params* params, const float* q, size_t q_len,
                                             const int32_t* indptr, const int32_t* indices, size_t n_indices,
                                             const int32_t* last_page_len, size_t n_seqs) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_paged_decode_attention";
    AttentionCall call;
    if (clm_status s = begin_attention(fn, engine, params, call)) return s;
    const clm::PagedKvPool& pool = *call.pool;
    const clm::AttentionParams& p = call.params;
    if (n_seqs >= static_cast<size_t>(INT32_MAX)) {  // indptr holds int32 offsets
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_seqs {} is too large", fn, n_seqs));
    }
    if (!indptr) return null_argument(fn, "indptr (it has n_seqs + 1 entries)");
    if (!indices && n_indices > 0) return null_argument(fn, "indices (with n_indices > 0)");
    if (!last_page_len && n_seqs > 0) return null_argument(fn, "last_page_len (with n_seqs > 0)");
    if (clm_status s = check_q_and_out(fn, q, q_len, out, out_len, "n_seqs", n_seqs, p, pool.config().head_dim)) {
      return s;
    }
    const clm::PagedKvView kv = clm::PagedKvView::of(pool);
    const std::span<const std::int32_t> indptr_span(indptr, n_seqs + 1);
    const std::span<const std::int32_t> indices_span(indices, n_indices);
    const std::span<const std::int32_t> last_span(last_page_len, n_seqs);
    return dispatch(
        call.backend, pool, fn,
        [&] { return clm::paged_decode_attention(kv, p, q, indptr_span, indices_span, last_span, out); },
        [&]([[maybe_unused]] auto& ws) {
#if CLM_HAVE_CUDA
          return clm::cuda::paged_decode_attention(ws, kv, p, q, indptr_span, indices_span, last_span, out,
                                                   call.stream);
#else
          return clm::Status{};
#endif
        });
  });
}

clm_status clm_engine_copy_pages(clm_engine* dst, const int32_t* dst_pages, const clm_engine* src,
                                 const int32_t* src_pages, size_t n_pages, void* stream) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_copy_pages";
    if (!dst) return null_argument(fn, "dst");
    if (!src) return null_argument(fn, "src");
    const clm::PagedKvPool& dst_pool = dst->state->engine->pool();
    const clm::PagedKvPool& src_pool = src->state->engine->pool();
    Backend dst_backend = Backend::cpu;
    Backend src_backend = Backend::cpu;
    if (clm_status s = backend_of(dst_pool, fn, dst_backend)) return s;
    if (clm_status s = backend_of(src_pool, fn, src_backend)) return s;
    if (!dst_pages && n_pages > 0) return null_argument(fn, "dst_pages (with n_pages > 0)");
    if (!src_pages && n_pages > 0) return null_argument(fn, "src_pages (with n_pages > 0)");
    const clm::PagedKvView dst_view = clm::PagedKvView::of(dst_pool);
    const clm::PagedKvView src_view = clm::PagedKvView::of(src_pool);
    const std::span<const std::int32_t> dst_span(dst_pages, n_pages);
    const std::span<const std::int32_t> src_span(src_pages, n_pages);
#if CLM_HAVE_CUDA
    if (dst_backend == Backend::cuda || src_backend == Backend::cuda) {
      const clm::PagedKvPool& device_pool = dst_backend == Backend::cuda ? dst_pool : src_pool;
      clm::cuda::Workspace* ws = nullptr;
      if (clm_status s = workspace_for(device_pool.config().device, fn, ws)) return s;
      return report_as(fn, clm::cuda::copy_pages(*ws, dst_view, dst_span, src_view, src_span, stream));
    }
#else
    (void)stream;
#endif
    return report_as(fn, clm::copy_pages(dst_view, dst_span, src_view, src_span));
  });
}

clm_status clm_engine_gather_pages(void* buffer, size_t buffer_len, const clm_engine* engine, const int32_t* pages,
                                   size_t n_pages, void* stream) {
  return transfer_pages(
      "clm_engine_gather_pages", engine, pages, n_pages, buffer, buffer_len,
      [&](const clm::PagedKvView& kv, std::span<const std::int32_t> ids) { return clm::gather_pages(buffer, kv, ids); },
      [&]([[maybe_unused]] auto& ws, [[maybe_unused]] const clm::PagedKvView& kv,
          [[maybe_unused]] std::span<const std::int32_t> ids) {
#if CLM_HAVE_CUDA
        return clm::cuda::gather_pages(ws, buffer, kv, ids, stream);
#else
        (void)stream;
        return clm::Status{};
#endif
      });
}

clm_status clm_engine_scatter_pages(clm_engine* engine, const int32_t* pages, size_t n_pages, const void* buffer,
                                    size_t buffer_len, void* stream) {
  return transfer_pages(
      "clm_engine_scatter_pages", engine, pages, n_pages, buffer, buffer_len,
      [&](const clm::PagedKvView& kv, std::span<const std::int32_t> ids) {
        return clm::scatter_pages(kv, ids, buffer);
      },
      [&]([[maybe_unused]] auto& ws, [[maybe_unused]] const clm::PagedKvView& kv,
          [[maybe_unused]] std::span<const std::int32_t> ids) {
#if CLM_HAVE_CUDA
        return clm::cuda::scatter_pages(ws, kv, ids, buffer, stream);
#else
        (void)stream;
        return clm::Status{};
#endif
      });
}

}  // extern "C"
