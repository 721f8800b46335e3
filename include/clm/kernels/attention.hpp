// clm/kernels/attention.hpp: attention and KV kernels over the paged pool, on the CPU
// (lib/kernels/attention_cpu.cpp). The CUDA versions have the same shapes
// (include/clm/device/cuda_kernels.hpp). A host that brings its own weights calls
// these instead of writing paged kernels:
//
//   clm::PagedKvView kv = clm::PagedKvView::of(engine->pool());
//   // after admit: write the K/V of the uncached prompt tokens
//   CLM_RETURN_IF_ERROR(clm::write_kv(kv, layer, k, v, admission.slots));
//   // prefill: the new tokens attend causally to the cached prefix + themselves
//   CLM_RETURN_IF_ERROR(clm::paged_prefill_attention(kv, params, q, n_new, admission.page_table, kv_len, out));
//   // decode: one query per sequence, a ragged batch in FlashInfer's CSR form
//   CLM_RETURN_IF_ERROR(clm::paged_decode_attention(kv, params, q, batch.indptr, batch.indices,
//                                                   batch.last_page_len, out));
//
// Shapes (row-major, f32 activations; KV in the pool's dtype, f32/f16/bf16):
//   q, out (decode)   [batch][num_q_heads][head_dim]
//   q, out (prefill)  [n_new][num_q_heads][head_dim]  (the last n_new tokens of the sequence)
//   k, v (write_kv)   [n_tokens][kv_heads][head_dim]
// Grouped-query attention: q head h reads kv head h / (num_q_heads / kv_heads).
// Every kernel validates shapes, page ids and head counts first and returns a
// Status; none reads or writes outside the pool or the caller's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"

namespace clm {

// How a kernel sees a pool's bytes (see paged_kv_pool.hpp for the layout).
struct PagedKvView {
  void* base = nullptr;
  KvDType dtype = KvDType::f32;
  MemoryKind memory = MemoryKind::host;
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int32_t num_layers = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::size_t page_bytes = 0;
  std::size_t layer_bytes = 0;

  static PagedKvView of(const PagedKvPool& pool) {
    const PagedKvPoolConfig& c = pool.config();
    return PagedKvView{pool.data(), c.dtype,       c.memory,         c.num_pages,        c.page_size,
                       c.num_layers, c.kv_heads,   c.head_dim,       pool.page_bytes(), pool.layer_bytes()};
  }
};

struct AttentionParams {
  std::int32_t layer = 0;
  std::int32_t num_q_heads = 0;  // a multiple of kv_heads
  float softmax_scale = 0.0f;    // 0: 1/sqrt(head_dim)
  std::int32_t sliding_window = 0;  // > 0: a query at position p sees keys in (p - window, p]
  std::int32_t num_threads = 0;     // CPU: 0 = all hardware threads
};

// Scatters new K/V rows into their slots (slot = page * page_size + row),
// converting f32 to the pool's dtype.
Status write_kv(const PagedKvView& kv, std::int32_t layer, const float* k, const float* v,
                std::span<const std::int64_t> slots);

// One query token per sequence over its pages (the query is the sequence's
// last token). Long sequences are split into chunks processed in parallel and
// merged by log-sum-exp (flash-decoding).
Status paged_decode_attention(const PagedKvView& kv, const AttentionParams& params, const float* q,
                              std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                              std::span<const std::int32_t> last_page_len, float* out);

// Causal attention of the last n_new tokens of a sequence of kv_len tokens
// (whose K/V, the cached prefix and the new ones, are all in `pages`).
Status paged_prefill_attention(const PagedKvView& kv, const AttentionParams& params, const float* q,
                               std::int32_t n_new, std::span<const std::int32_t> pages, std::int32_t kv_len,
                               float* out);

// Copies whole pages (all layers) between two pools of the same layout.
Status copy_pages(const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                  std::span<const std::int32_t> src_pages);
// Packs pages into a contiguous buffer of pages.size() * page_bytes, and back.
Status gather_pages(void* buffer, const PagedKvView& src, std::span<const std::int32_t> pages);
Status scatter_pages(const PagedKvView& dst, std::span<const std::int32_t> pages, const void* buffer);

}  // namespace clm
