// CPU attention and KV kernels over the paged pool (clm/kernels/attention.hpp).
//
// This file holds the entry points: validation first (attention_cpu_validate.hpp:
// nothing is read or written until every shape, page id, slot and head count
// has been checked), then the drivers that split the work into tasks
// (attention_cpu_drivers.cpp) on the thread pool (attention_cpu_threads.cpp),
// with the kernels of the ISA in use (attention_cpu_isa.cpp): the scalar ones
// (attention_cpu_scalar.cpp), the AVX2 ones (attention_cpu_avx2.cpp) or the
// AVX-512 ones (attention_cpu_avx512.cpp); see docs/kernels.md.
#include "clm/kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include <fmt/format.h>

#include "attention_cpu_drivers.hpp"
#include "attention_cpu_validate.hpp"
#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"

namespace clm {
namespace detail {
namespace {

KvLayer layer_of(const PagedKvView& kv, std::int32_t layer) {
  KvLayer l;
  const std::size_t e = kv_dtype_bytes(kv.dtype);
  l.base = static_cast<const char*>(kv.base) + static_cast<std::size_t>(layer) * kv.layer_bytes;
  l.page_stride = kv.page_bytes;
  l.row_bytes = static_cast<std::size_t>(kv.kv_heads) * static_cast<std::size_t>(kv.head_dim) * e;
  l.v_offset = static_cast<std::size_t>(kv.page_size) * l.row_bytes;
  l.head_bytes = static_cast<std::size_t>(kv.head_dim) * e;
  l.page_size = kv.page_size;
  l.kv_heads = kv.kv_heads;
  l.head_dim = kv.head_dim;
  l.dtype = kv.dtype;
  return l;
}

AttnShape shape_of(const PagedKvView& kv, const AttentionParams& p) {
  AttnShape s;
  s.num_q_heads = p.num_q_heads;
  s.group = p.num_q_heads / kv.kv_heads;
  s.scale = p.softmax_scale != 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  return s;
}

}  // namespace
}  // namespace detail

// ---- entry points ---------------------------------------------------------------------------

Status write_kv(const PagedKvView& kv, std::int32_t layer, const float* k, const float* v,
                std::span<const std::int64_t> slots) {
  constexpr const char* what = "write_kv";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_layer(kv, layer, what));
  if (slots.empty()) return {};
  if (k == nullptr || v == nullptr) return invalid_argument("write_kv: k and v must not be null");
  const std::int64_t slot_count = static_cast<std::int64_t>(kv.num_pages) * kv.page_size;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= slot_count) {
      return invalid_argument(
          fmt::format("write_kv: slot {} (token {}) is outside the pool [0, {})", slots[i], i, slot_count));
    }
  }
  const detail::KvLayer l = detail::layer_of(kv, layer);
  const std::size_t row = static_cast<std::size_t>(kv.kv_heads) * static_cast<std::size_t>(kv.head_dim);
  char* base = const_cast<char*>(l.base);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t page = slots[i] / kv.page_size;
    const std::int64_t r = slots[i] % kv.page_size;
    char* dk = base + static_cast<std::size_t>(page) * l.page_stride + static_cast<std::size_t>(r) * l.row_bytes;
    char* dv = dk + l.v_offset;
    const float* sk = k + i * row;
    const float* sv = v + i * row;
    switch (kv.dtype) {
      case KvDType::f32:
        std::memcpy(dk, sk, row * sizeof(float));
        std::memcpy(dv, sv, row * sizeof(float));
        break;
      case KvDType::f16:
      case KvDType::bf16: {
        const bool f16 = kv.dtype == KvDType::f16;
        for (std::size_t j = 0; j < row; ++j) {
          const std::uint16_t hk = f16 ? detail::f32_to_f16(sk[j]) : detail::f32_to_bf16(sk[j]);
          const std::uint16_t hv = f16 ? detail::f32_to_f16(sv[j]) : detail::f32_to_bf16(sv[j]);
          std::memcpy(dk + 2 * j, &hk, 2);
          std::memcpy(dv + 2 * j, &hv, 2);
        }
        break;
      }
    }
  }
  return {};
}

Status paged_decode_attention(const PagedKvView& kv, const AttentionParams& params, const float* q,
                              std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                              std::span<const std::int32_t> last_page_len, float* out) {
  constexpr const char* what = "paged_decode_attention";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_params(kv, params, what));
  const std::size_t batch = last_page_len.size();
  if (indptr.size() != batch + 1) {
    return invalid_argument(
        fmt::format("{}: indptr has {} entries; {} sequences need {}", what, indptr.size(), batch, batch + 1));
  }
  // indptr first (non-negative, increasing, within indices), then the pages it names.
  for (std::size_t i = 0; i < batch; ++i) {
    if (indptr[i] < 0 || indptr[i + 1] <= indptr[i]) {
      return invalid_argument(fmt::format("{}: indptr[{}..{}] = {}, {}: every sequence needs >= 1 page", what, i, i + 1,
                                          indptr[i], indptr[i + 1]));
    }
  }
  if (batch == 0) return {};
  if (static_cast<std::size_t>(indptr[batch]) > indices.size()) {
    return invalid_argument(
        fmt::format("{}: indptr[{}] = {} is past the {} indices", what, batch, indptr[batch], indices.size()));
  }
  std::vector<detail::Sequence> seqs;
  try {
    seqs.resize(batch);
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of host memory", what));
  }
  for (std::size_t i = 0; i < batch; ++i) {
    if (last_page_len[i] < 1 || last_page_len[i] > kv.page_size) {
      return invalid_argument(fmt::format("{}: last_page_len[{}] = {} is outside [1, page_size {}]", what, i,
                                          last_page_len[i], kv.page_size));
    }
    for (std::int32_t j = indptr[i]; j < indptr[i + 1]; ++j) {
      CLM_RETURN_IF_ERROR(
          detail::check_page(kv, indices[static_cast<std::size_t>(j)], static_cast<std::size_t>(j), what));
    }
    const std::int64_t pages = static_cast<std::int64_t>(indptr[i + 1]) - indptr[i];
    const std::int64_t len = (pages - 1) * kv.page_size + last_page_len[i];
    seqs[i].pages = indices.data() + indptr[i];
    seqs[i].end = len;
    seqs[i].begin = params.sliding_window > 0 ? std::max<std::int64_t>(0, len - params.sliding_window) : 0;
  }
  const std::size_t count =
      batch * static_cast<std::size_t>(params.num_q_heads) * static_cast<std::size_t>(kv.head_dim);
  CLM_RETURN_IF_ERROR(detail::check_activations(q, out, count, what));
  return detail::decode(detail::layer_of(kv, params.layer), detail::shape_of(kv, params), q, seqs, out,
                        params.num_threads, what);
}

Status paged_prefill_attention(const PagedKvView& kv, const AttentionParams& params, const float* q, std::int32_t n_new,
                               std::span<const std::int32_t> pages, std::int32_t kv_len, float* out) {
  constexpr const char* what = "paged_prefill_attention";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_params(kv, params, what));
  if (n_new < 0 || kv_len < n_new) {
    return invalid_argument(fmt::format("{}: n_new {} must be in [0, kv_len {}]", what, n_new, kv_len));
  }
  if (n_new == 0) return {};
  const std::size_t needed = (static_cast<std::size_t>(kv_len) + static_cast<std::size_t>(kv.page_size) - 1) /
                             static_cast<std::size_t>(kv.page_size);
  if (pages.size() < needed) {
    return invalid_argument(fmt::format("{}: {} tokens of page size {} need {} pages, got {}", what, kv_len,
                                        kv.page_size, needed, pages.size()));
  }
  for (std::size_t j = 0; j < needed; ++j) CLM_RETURN_IF_ERROR(detail::check_page(kv, pages[j], j, what));
  const std::size_t count = static_cast<std::size_t>(n_new) * static_cast<std::size_t>(params.num_q_heads) *
                            static_cast<std::size_t>(kv.head_dim);
  CLM_RETURN_IF_ERROR(detail::check_activations(q, out, count, what));

  const detail::KvLayer layer = detail::layer_of(kv, params.layer);
  const detail::AttnShape shape = detail::shape_of(kv, params);
  if (detail::prefill_few_applies(layer, shape, n_new, kv_len, params.sliding_window)) {
    return detail::prefill_few(layer, shape, q, n_new, pages.data(), kv_len, params.sliding_window, out,
                               params.num_threads, what);
  }
  return detail::prefill_tiles(layer, shape, q, n_new, pages.data(), kv_len, params.sliding_window, out,
                               params.num_threads, what);
}

Status copy_pages(const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                  std::span<const std::int32_t> src_pages) {
  constexpr const char* what = "copy_pages";
  CLM_RETURN_IF_ERROR(detail::check_view(dst, what));
  CLM_RETURN_IF_ERROR(detail::check_view(src, what));
  if (dst.dtype != src.dtype || dst.page_size != src.page_size || dst.num_layers != src.num_layers ||
      dst.kv_heads != src.kv_heads || dst.head_dim != src.head_dim) {
    return invalid_argument(
        "copy_pages: the two pools have different layouts (dtype, page_size, layers, heads, head_dim)");
  }
  if (dst_pages.size() != src_pages.size()) {
    return invalid_argument(
        fmt::format("copy_pages: {} destination pages for {} source pages", dst_pages.size(), src_pages.size()));
  }
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {
    CLM_RETURN_IF_ERROR(detail::check_page(dst, dst_pages[i], i, "copy_pages (destination)"));
    CLM_RETURN_IF_ERROR(detail::check_page(src, src_pages[i], i, "copy_pages (source)"));
  }
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {  // in order: a later pair sees an earlier copy
    char* d = static_cast<char*>(dst.base) + static_cast<std::size_t>(dst_pages[i]) * dst.page_bytes;
    const char* s = static_cast<const char*>(src.base) + static_cast<std::size_t>(src_pages[i]) * src.page_bytes;
    if (d != s) std::memmove(d, s, dst.page_bytes);
  }
  return {};
}

Status gather_pages(void* buffer, const PagedKvView& src, std::span<const std::int32_t> pages) {
  CLM_RETURN_IF_ERROR(detail::check_view(src, "gather_pages"));
  for (std::size_t i = 0; i < pages.size(); ++i)
    CLM_RETURN_IF_ERROR(detail::check_page(src, pages[i], i, "gather_pages"));
  if (pages.empty()) return {};
  if (buffer == nullptr) return invalid_argument("gather_pages: buffer must not be null");
  char* out = static_cast<char*>(buffer);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    std::memcpy(out + i * src.page_bytes,
                static_cast<const char*>(src.base) + static_cast<std::size_t>(pages[i]) * src.page_bytes,
                src.page_bytes);
  }
  return {};
}

Status scatter_pages(const PagedKvView& dst, std::span<const std::int32_t> pages, const void* buffer) {
  CLM_RETURN_IF_ERROR(detail::check_view(dst, "scatter_pages"));
  for (std::size_t i = 0; i < pages.size(); ++i)
    CLM_RETURN_IF_ERROR(detail::check_page(dst, pages[i], i, "scatter_pages"));
  if (pages.empty()) return {};
  if (buffer == nullptr) return invalid_argument("scatter_pages: buffer must not be null");
  const char* in = static_cast<const char*>(buffer);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    std::memcpy(static_cast<char*>(dst.base) + static_cast<std::size_t>(pages[i]) * dst.page_bytes,
                in + i * dst.page_bytes, dst.page_bytes);
  }
  return {};
}

}  // namespace clm
