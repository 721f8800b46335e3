// lib/kernels/attention_cpu_validate.hpp: the checks of the CPU attention
// entry points (attention_cpu.cpp), which run before anything is read or
// written: the pool view, the layer, the attention parameters, page ids and
// the activations. Internal to lib/kernels (the anonymous namespace keeps them
// the entry points' own, inlined as before); not installed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "clm/kernels/attention.hpp"

namespace clm::detail {
namespace {

Status check_view(const PagedKvView& kv, const char* what) {
  if (kv.memory == MemoryKind::device) {
    return unsupported(fmt::format("{}: the pool is in device memory; these are the CPU kernels", what));
  }
  if (kv.memory == MemoryKind::none) {
    return failed_precondition(fmt::format("{}: the pool keeps no KV bytes (MemoryKind::none)", what));
  }
  if (kv.memory != MemoryKind::host) return invalid_argument(fmt::format("{}: unknown memory kind", what));
  if (kv.dtype != KvDType::f32 && kv.dtype != KvDType::f16 && kv.dtype != KvDType::bf16) {
    return invalid_argument(fmt::format("{}: unknown KV dtype", what));
  }
  if (kv.base == nullptr) return invalid_argument(fmt::format("{}: the view has no base pointer", what));
  if (kv.num_pages <= 0 || kv.page_size <= 0 || kv.num_layers <= 0 || kv.kv_heads <= 0 || kv.head_dim <= 0) {
    return invalid_argument(
        fmt::format("{}: num_pages, page_size, num_layers, kv_heads and head_dim must be > 0, got {}, {}, {}, {}, {}",
                    what, kv.num_pages, kv.page_size, kv.num_layers, kv.kv_heads, kv.head_dim));
  }
  // The byte sizes must be those of the layout (paged_kv_pool.hpp), without overflow.
  std::size_t layer = 0, page = 0, total = 0;
  const bool overflow =
      __builtin_mul_overflow(static_cast<std::size_t>(kv.page_size) * static_cast<std::size_t>(kv.kv_heads),
                             static_cast<std::size_t>(kv.head_dim) * 2 * kv_dtype_bytes(kv.dtype), &layer) ||
      __builtin_mul_overflow(layer, static_cast<std::size_t>(kv.num_layers), &page) ||
      __builtin_mul_overflow(page, static_cast<std::size_t>(kv.num_pages), &total) ||
      total > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
  if (overflow) return invalid_argument(fmt::format("{}: the pool's size overflows", what));
  if (kv.layer_bytes != layer || kv.page_bytes != page) {
    return invalid_argument(fmt::format("{}: layer_bytes {} / page_bytes {} do not match the layout ({} / {})", what,
                                        kv.layer_bytes, kv.page_bytes, layer, page));
  }
  return {};
}

Status check_layer(const PagedKvView& kv, std::int32_t layer, const char* what) {
  if (layer < 0 || layer >= kv.num_layers) {
    return invalid_argument(fmt::format("{}: layer {} is outside [0, {})", what, layer, kv.num_layers));
  }
  return {};
}

Status check_params(const PagedKvView& kv, const AttentionParams& p, const char* what) {
  CLM_RETURN_IF_ERROR(check_layer(kv, p.layer, what));
  if (p.num_q_heads <= 0 || p.num_q_heads % kv.kv_heads != 0) {
    return invalid_argument(
        fmt::format("{}: num_q_heads {} is not a positive multiple of kv_heads {}", what, p.num_q_heads, kv.kv_heads));
  }
  if (!std::isfinite(p.softmax_scale)) {
    return invalid_argument(fmt::format("{}: softmax_scale {} is not finite", what, p.softmax_scale));
  }
  if (p.sliding_window < 0) {
    return invalid_argument(fmt::format("{}: sliding_window {} is negative", what, p.sliding_window));
  }
  if (p.num_threads < 0) return invalid_argument(fmt::format("{}: num_threads {} is negative", what, p.num_threads));
  return {};
}

Status check_page(const PagedKvView& kv, std::int32_t page, std::size_t index, const char* what) {
  if (page < 0 || page >= kv.num_pages) {
    return invalid_argument(
        fmt::format("{}: page id {} (entry {}) is outside the pool [0, {})", what, page, index, kv.num_pages));
  }
  return {};
}

// Queries must be finite (a NaN would spread silently through the softmax),
// and out must not overlap q.
Status check_activations(const float* q, float* out, std::size_t count, const char* what) {
  if (q == nullptr || out == nullptr) return invalid_argument(fmt::format("{}: q and out must not be null", what));
  const auto qa = reinterpret_cast<std::uintptr_t>(q);
  const auto oa = reinterpret_cast<std::uintptr_t>(out);
  const std::uintptr_t bytes = count * sizeof(float);
  if (qa < oa + bytes && oa < qa + bytes) return invalid_argument(fmt::format("{}: out overlaps q", what));
  // One vectorisable pass over the exponent bits (all ones: inf or NaN), then
  // a search for the culprit only when there is one.
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, q + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (bad == 0) return {};
  for (std::size_t i = 0; i < count; ++i) {
    if (!std::isfinite(q[i])) {
      return invalid_argument(fmt::format("{}: q[{}] is {} (queries must be finite)", what, i, q[i]));
    }
  }
  return {};
}

}  // namespace
}  // namespace clm::detail
