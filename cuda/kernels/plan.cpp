// Host-side validation and planning for the CUDA kernels (see plan.hpp).
#include "plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace clm::cuda::detail {

namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMinAutoChunk = 256;   // tokens: below this the partial outputs cost more than they save
constexpr std::int64_t kAutoWaves = 8;        // auto split-K aims at this many waves of decode blocks

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Checks ids[i] in [0, num_pages) for i < count.
Status check_page_ids(std::span<const std::int32_t> ids, std::size_t count, std::int32_t num_pages, const char* what) {
  for (std::size_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= num_pages) {
      return invalid_argument(fmt::format("{}[{}] = {} is not a page id (the pool has {} pages)", what, i, ids[i], num_pages));
    }
  }
  return {};
}

}  // namespace

Status validate_view(const PagedKvView& kv, const char* what) {
  if (kv.base == nullptr) return invalid_argument(fmt::format("{}: the view has no memory (base is null)", what));
  if (kv.num_pages <= 0 || kv.page_size <= 0 || kv.num_layers <= 0 || kv.kv_heads <= 0 || kv.head_dim <= 0) {
    return invalid_argument(fmt::format(
        "{}: num_pages, page_size, num_layers, kv_heads and head_dim must be > 0, got {}, {}, {}, {}, {}", what,
        kv.num_pages, kv.page_size, kv.num_layers, kv.kv_heads, kv.head_dim));
  }
  if (kv.dtype != KvDType::f32 && kv.dtype != KvDType::f16 && kv.dtype != KvDType::bf16) {
    return invalid_argument(fmt::format("{}: unknown KV dtype {}", what, static_cast<int>(kv.dtype)));
  }
  std::uint64_t block = 0, layer = 0, page = 0, total = 0;
  const bool overflow =
      mul_overflows(static_cast<std::uint64_t>(kv.page_size) * static_cast<std::uint64_t>(kv.kv_heads),
                    static_cast<std::uint64_t>(kv.head_dim) * kv_dtype_bytes(kv.dtype), &block) ||
      mul_overflows(block, 2, &layer) || mul_overflows(layer, static_cast<std::uint64_t>(kv.num_layers), &page) ||
      mul_overflows(page, static_cast<std::uint64_t>(kv.num_pages), &total);
  if (overflow) return invalid_argument(fmt::format("{}: the pool's size overflows", what));
  if (kv.layer_bytes != layer || kv.page_bytes != page) {
    return invalid_argument(fmt::format(
        "{}: layer_bytes {} and page_bytes {} do not match the geometry (expected {} and {}: 2*T*H*D*E and "
        "num_layers*layer_bytes)",
        what, kv.layer_bytes, kv.page_bytes, layer, page));
  }
  if (reinterpret_cast<std::uintptr_t>(kv.base) > std::numeric_limits<std::uintptr_t>::max() - total) {
    return invalid_argument(fmt::format("{}: base + pool size overflows the address space", what));
  }
  return {};
}

Status check_device_kind(const PagedKvView& kv, const char* what) {
  switch (kv.memory) {
    case MemoryKind::device: return {};
    case MemoryKind::host:
      return unsupported(fmt::format("{}: the pool is in host memory; these are the CUDA kernels (see attention.hpp)", what));
    case MemoryKind::none:
      return failed_precondition(fmt::format("{}: the pool keeps no KV bytes (MemoryKind::none)", what));
  }
  return invalid_argument(fmt::format("{}: unknown memory kind {}", what, static_cast<int>(kv.memory)));
}

Status validate_kernel_view(const PagedKvView& kv, std::int32_t layer) {
  CLM_RETURN_IF_ERROR(check_device_kind(kv, "kv"));
  CLM_RETURN_IF_ERROR(validate_view(kv, "kv"));
  if (kv.head_dim != 64 && kv.head_dim != 128) {
    return unsupported(fmt::format("kv: head_dim {}: the CUDA attention kernels are built for 64 and 128", kv.head_dim));
  }
  if (reinterpret_cast<std::uintptr_t>(kv.base) % 16 != 0) {
    return invalid_argument("kv: the pool's base must be 16-byte aligned");
  }
  if (layer < 0 || layer >= kv.num_layers) {
    return invalid_argument(fmt::format("layer {} is out of range [0, {})", layer, kv.num_layers));
  }
  return {};
}

Status validate_heads(const PagedKvView& kv, const AttentionParams& params) {
  if (params.num_q_heads <= 0 || params.num_q_heads % kv.kv_heads != 0) {
    return invalid_argument(fmt::format("num_q_heads {} must be a positive multiple of kv_heads {}", params.num_q_heads,
                                        kv.kv_heads));
  }
  if (params.num_q_heads > kMaxGridY) {
    return invalid_argument(fmt::format("num_q_heads {} exceeds the kernels' limit of {}", params.num_q_heads, kMaxGridY));
  }
  if (!std::isfinite(params.softmax_scale)) return invalid_argument("softmax_scale must be finite");
  if (params.sliding_window < 0) {
    return invalid_argument(fmt::format("sliding_window must be >= 0, got {}", params.sliding_window));
  }
  return {};
}

float effective_scale(const AttentionParams& params, std::int32_t head_dim) {
  return params.softmax_scale != 0.0f ? params.softmax_scale
                                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

std::int32_t page_shift(std::int32_t page_size) {
  if (page_size <= 0 || (page_size & (page_size - 1)) != 0) return -1;
  std::int32_t shift = 0;
  while ((1 << shift) < page_size) ++shift;
  return shift;
}

HeadBlocking choose_head_blocking(std::int32_t group) {
  HeadBlocking h;
  h.heads_per_block = 1;
  while (h.heads_per_block < group && h.heads_per_block < 8) h.heads_per_block *= 2;
  h.blocks_per_kv_head = static_cast<std::int32_t>(ceil_div(group, h.heads_per_block));
  return h;
}

std::int32_t decode_tile_tokens(KvDType dtype, std::int32_t head_dim) {
  const std::int32_t vec = 16 / static_cast<std::int32_t>(kv_dtype_bytes(dtype));
  const std::int32_t lanes = head_dim / vec;
  return kDecodeThreads / lanes * kDecodeTokensPerThread;
}

Status plan_decode(const PagedKvView& kv, const AttentionParams& params, std::span<const std::int32_t> indptr,
                   std::span<const std::int32_t> indices, std::span<const std::int32_t> last_page_len,
                   const DecodeTuning& tuning, DecodePlan& plan) {
  CLM_RETURN_IF_ERROR(validate_kernel_view(kv, 0));
  CLM_RETURN_IF_ERROR(validate_heads(kv, params));
  const std::size_t batch = last_page_len.size();
  if (batch >= static_cast<std::size_t>(kInt32Max)) return invalid_argument("decode: batch too large");
  if (indptr.size() != batch + 1) {
    return invalid_argument(fmt::format("decode: indptr has {} entries, expected batch + 1 = {} (last_page_len has {})",
                                        indptr.size(), batch + 1, batch));
  }
  if (indptr[0] != 0) return invalid_argument(fmt::format("decode: indptr[0] must be 0, got {}", indptr[0]));
  for (std::size_t i = 0; i < batch; ++i) {
    if (indptr[i + 1] <= indptr[i]) {
      return invalid_argument(fmt::format("decode: sequence {} has no pages (indptr[{}] = {}, indptr[{}] = {})", i, i,
                                          indptr[i], i + 1, indptr[i + 1]));
    }
  }
  const auto nnz = static_cast<std::size_t>(indptr[batch]);
  if (nnz > indices.size()) {
    return invalid_argument(fmt::format("decode: indptr[{}] = {} but indices has {} entries", batch, nnz, indices.size()));
  }
  CLM_RETURN_IF_ERROR(check_page_ids(indices, nnz, kv.num_pages, "decode: indices"));
  if (tuning.chunk_tokens < 0) return invalid_argument("decode: chunk_tokens must be >= 0");

  std::vector<std::int32_t> start(batch), len(batch);
  std::int64_t total = 0, longest = 0;
  for (std::size_t i = 0; i < batch; ++i) {
    const std::int32_t lpl = last_page_len[i];
    if (lpl < 1 || lpl > kv.page_size) {
      return invalid_argument(
          fmt::format("decode: last_page_len[{}] = {} is not in [1, page_size = {}]", i, lpl, kv.page_size));
    }
    const std::int64_t kv_len =
        static_cast<std::int64_t>(indptr[i + 1] - indptr[i] - 1) * kv.page_size + static_cast<std::int64_t>(lpl);
    if (kv_len > kMaxKvLen) {
      return invalid_argument(fmt::format("decode: sequence {} has {} tokens, more than the kernels' {}", i, kv_len, kMaxKvLen));
    }
    const std::int64_t first = params.sliding_window > 0 ? std::max<std::int64_t>(0, kv_len - params.sliding_window) : 0;
    start[i] = static_cast<std::int32_t>(first);
    len[i] = static_cast<std::int32_t>(kv_len);
    total += kv_len - first;
    longest = std::max(longest, kv_len - first);
  }

  plan = DecodePlan{};
  plan.num_pages = kv.num_pages;
  plan.page_size = kv.page_size;
  plan.kv_heads = kv.kv_heads;
  plan.head_dim = kv.head_dim;
  plan.dtype = kv.dtype;
  plan.num_q_heads = params.num_q_heads;
  plan.sliding_window = params.sliding_window;
  plan.batch = static_cast<std::int32_t>(batch);
  plan.group = params.num_q_heads / kv.kv_heads;
  plan.heads = choose_head_blocking(plan.group);
  plan.nnz = static_cast<std::int64_t>(nnz);

  std::int64_t chunk = tuning.chunk_tokens;
  if (chunk == 0) {
    const std::int64_t tile = decode_tile_tokens(kv.dtype, kv.head_dim);
    const std::int64_t blocks_per_item = static_cast<std::int64_t>(kv.kv_heads) * plan.heads.blocks_per_kv_head;
    const std::int64_t target_blocks = std::max<std::int64_t>(1, tuning.sm_count) *
                                       std::max<std::int64_t>(1, tuning.blocks_per_sm) * kAutoWaves;
    const std::int64_t target_items = std::max<std::int64_t>(1, ceil_div(target_blocks, blocks_per_item));
    const std::int64_t guess = std::max(kMinAutoChunk, ceil_div(std::max<std::int64_t>(total, 1), target_items));
    if (guess >= longest) {
      chunk = std::max<std::int64_t>(longest, 1);  // no split
    } else {
      // Even chunks for the longest sequence, whole tiles each.
      const std::int64_t pieces = ceil_div(longest, guess);
      chunk = ceil_div(ceil_div(longest, pieces), tile) * tile;
    }
  }
  plan.chunk_tokens = static_cast<std::int32_t>(std::min<std::int64_t>(chunk, kMaxKvLen));

  std::int64_t item_count = 0;
  for (std::size_t i = 0; i < batch; ++i) item_count += ceil_div(len[i] - start[i], plan.chunk_tokens);
  if (item_count > kInt32Max) {
    return invalid_argument(fmt::format("decode: {} work items (chunk_tokens {}) exceed the grid limit", item_count,
                                        plan.chunk_tokens));
  }
  plan.items.reserve(static_cast<std::size_t>(item_count));
  plan.merge_indptr.assign(batch + 1, 0);
  for (std::size_t i = 0; i < batch; ++i) {
    for (std::int64_t t = start[i]; t < len[i]; t += plan.chunk_tokens) {
      plan.items.push_back(DecodeItem{static_cast<std::int32_t>(i), indptr[i], static_cast<std::int32_t>(t),
                                      static_cast<std::int32_t>(std::min<std::int64_t>(t + plan.chunk_tokens, len[i]))});
    }
    plan.merge_indptr[i + 1] = static_cast<std::int32_t>(plan.items.size());
  }
  plan.decode_grid = Dims{static_cast<unsigned>(plan.items.size()),
                          static_cast<unsigned>(kv.kv_heads * plan.heads.blocks_per_kv_head), 1};
  plan.merge_grid = Dims{static_cast<unsigned>(batch), static_cast<unsigned>(params.num_q_heads), 1};
  return {};
}

Status check_decode_run(const DecodePlan& plan, const PagedKvView& kv, const AttentionParams& params) {
  CLM_RETURN_IF_ERROR(validate_kernel_view(kv, params.layer));
  CLM_RETURN_IF_ERROR(validate_heads(kv, params));
  if (kv.num_pages != plan.num_pages || kv.page_size != plan.page_size || kv.kv_heads != plan.kv_heads ||
      kv.head_dim != plan.head_dim || kv.dtype != plan.dtype) {
    return invalid_argument(fmt::format(
        "decode: the pool (num_pages {}, page_size {}, kv_heads {}, head_dim {}, {}) is not the geometry the batch was "
        "planned for (num_pages {}, page_size {}, kv_heads {}, head_dim {}, {})",
        kv.num_pages, kv.page_size, kv.kv_heads, kv.head_dim, kv_dtype_name(kv.dtype), plan.num_pages, plan.page_size,
        plan.kv_heads, plan.head_dim, kv_dtype_name(plan.dtype)));
  }
  if (params.num_q_heads != plan.num_q_heads || params.sliding_window != plan.sliding_window) {
    return invalid_argument(fmt::format(
        "decode: num_q_heads {} / sliding_window {} differ from the plan's {} / {}", params.num_q_heads,
        params.sliding_window, plan.num_q_heads, plan.sliding_window));
  }
  return {};
}

DecodeArgs make_decode_args(const DecodePlan& plan, const PagedKvView& kv, const AttentionParams& params,
                            const std::int32_t* indices, const DecodeItem* items, const float* q, float* partial_out,
                            float* partial_lse) {
  DecodeArgs a{};
  a.kv = static_cast<const unsigned char*>(kv.base) + static_cast<std::size_t>(params.layer) * kv.layer_bytes;
  a.page_bytes = kv.page_bytes;
  a.v_offset = kv.layer_bytes / 2;
  a.page_size = kv.page_size;
  a.page_shift = page_shift(kv.page_size);
  a.kv_heads = kv.kv_heads;
  a.group = plan.group;
  a.num_q_heads = plan.num_q_heads;
  a.head_blocks = plan.heads.blocks_per_kv_head;
  a.scale = effective_scale(params, kv.head_dim);
  a.indices = indices;
  a.items = items;
  a.q = q;
  a.partial_out = partial_out;
  a.partial_lse = partial_lse;
  return a;
}

MergeArgs make_merge_args(const DecodePlan& plan, const std::int32_t* merge_indptr, const float* partial_out,
                          const float* partial_lse, float* out) {
  return MergeArgs{merge_indptr, partial_out, partial_lse, out, plan.num_q_heads};
}

std::size_t decode_partial_floats(const DecodePlan& plan) {
  return plan.items.size() * static_cast<std::size_t>(plan.num_q_heads) * (static_cast<std::size_t>(plan.head_dim) + 1);
}

Status validate_prefill(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new,
                        std::span<const std::int32_t> pages, std::int32_t kv_len) {
  CLM_RETURN_IF_ERROR(validate_kernel_view(kv, params.layer));
  CLM_RETURN_IF_ERROR(validate_heads(kv, params));
  if (n_new < 0 || kv_len < n_new) {
    return invalid_argument(fmt::format("prefill: need 0 <= n_new <= kv_len, got n_new {}, kv_len {}", n_new, kv_len));
  }
  if (kv_len > kMaxKvLen) {
    return invalid_argument(fmt::format("prefill: kv_len {} exceeds the kernels' limit of {}", kv_len, kMaxKvLen));
  }
  const std::size_t needed = static_cast<std::size_t>(prefill_pages_used(kv, kv_len));
  if (pages.size() < needed) {
    return invalid_argument(fmt::format("prefill: {} tokens need {} pages of {}, got {}", kv_len, needed, kv.page_size,
                                        pages.size()));
  }
  CLM_RETURN_IF_ERROR(check_page_ids(pages, needed, kv.num_pages, "prefill: pages"));
  const std::int64_t rows = static_cast<std::int64_t>(n_new) * (params.num_q_heads / kv.kv_heads);
  if (rows > kInt32Max - kPrefillRows) {
    return invalid_argument(fmt::format("prefill: n_new * q heads per kv head = {} exceeds the kernel's limit", rows));
  }
  return {};
}

std::int32_t prefill_pages_used(const PagedKvView& kv, std::int32_t kv_len) {
  return static_cast<std::int32_t>(ceil_div(kv_len, kv.page_size));
}

Dims prefill_grid(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new) {
  const std::int64_t rows = static_cast<std::int64_t>(n_new) * (params.num_q_heads / kv.kv_heads);
  return Dims{static_cast<unsigned>(ceil_div(rows, kPrefillRows)), static_cast<unsigned>(kv.kv_heads), 1};
}

PrefillArgs make_prefill_args(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new,
                              std::int32_t kv_len, const std::int32_t* pages, const float* q, float* out) {
  PrefillArgs a{};
  a.kv = static_cast<const unsigned char*>(kv.base) + static_cast<std::size_t>(params.layer) * kv.layer_bytes;
  a.page_bytes = kv.page_bytes;
  a.v_offset = kv.layer_bytes / 2;
  a.page_size = kv.page_size;
  a.page_shift = page_shift(kv.page_size);
  a.kv_heads = kv.kv_heads;
  a.group = params.num_q_heads / kv.kv_heads;
  a.num_q_heads = params.num_q_heads;
  a.n_new = n_new;
  a.kv_len = kv_len;
  a.window = params.sliding_window;
  a.scale = effective_scale(params, kv.head_dim);
  a.pages = pages;
  a.q = q;
  a.out = out;
  return a;
}

Status validate_write_kv(const PagedKvView& kv, std::int32_t layer, std::span<const std::int64_t> slots) {
  CLM_RETURN_IF_ERROR(check_device_kind(kv, "write_kv: kv"));
  CLM_RETURN_IF_ERROR(validate_view(kv, "write_kv: kv"));
  if (reinterpret_cast<std::uintptr_t>(kv.base) % 16 != 0) {
    return invalid_argument("kv: the pool's base must be 16-byte aligned");
  }
  if (layer < 0 || layer >= kv.num_layers) {
    return invalid_argument(fmt::format("write_kv: layer {} is out of range [0, {})", layer, kv.num_layers));
  }
  if (static_cast<std::int64_t>(kv.kv_heads) * kv.head_dim > kInt32Max) {
    return invalid_argument("write_kv: kv_heads * head_dim exceeds int32");
  }
  if (slots.size() > static_cast<std::size_t>(kInt32Max)) return invalid_argument("write_kv: too many rows");
  const std::int64_t limit = static_cast<std::int64_t>(kv.num_pages) * kv.page_size;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= limit) {
      return invalid_argument(fmt::format("write_kv: slots[{}] = {} is not in [0, num_pages * page_size = {})", i,
                                          slots[i], limit));
    }
  }
  std::vector<std::int64_t> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    return invalid_argument(fmt::format("write_kv: slot {} is written twice", *dup));
  }
  return {};
}

WriteKvArgs make_write_kv_args(const PagedKvView& kv, std::int32_t layer, const std::int64_t* slots, const float* k,
                               const float* v) {
  WriteKvArgs a{};
  a.kv = static_cast<unsigned char*>(kv.base) + static_cast<std::size_t>(layer) * kv.layer_bytes;
  a.page_bytes = kv.page_bytes;
  a.v_offset = kv.layer_bytes / 2;
  a.page_size = kv.page_size;
  a.row_elems = kv.kv_heads * kv.head_dim;
  a.slots = slots;
  a.k = k;
  a.v = v;
  return a;
}

Status validate_copy(const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                     std::span<const std::int32_t> src_pages) {
  for (const PagedKvView* v : {&dst, &src}) {
    if (v->memory == MemoryKind::none) return failed_precondition("copy: a pool keeps no KV bytes (MemoryKind::none)");
    if (v->memory != MemoryKind::host && v->memory != MemoryKind::device) return invalid_argument("copy: unknown memory kind");
  }
  CLM_RETURN_IF_ERROR(validate_view(dst, "copy: dst"));
  CLM_RETURN_IF_ERROR(validate_view(src, "copy: src"));
  if (dst.page_size != src.page_size || dst.num_layers != src.num_layers || dst.kv_heads != src.kv_heads ||
      dst.head_dim != src.head_dim || dst.dtype != src.dtype) {
    return invalid_argument(fmt::format(
        "copy: the pools' page layouts differ (page_size {}/{}, num_layers {}/{}, kv_heads {}/{}, head_dim {}/{}, {}/{})",
        dst.page_size, src.page_size, dst.num_layers, src.num_layers, dst.kv_heads, src.kv_heads, dst.head_dim,
        src.head_dim, kv_dtype_name(dst.dtype), kv_dtype_name(src.dtype)));
  }
  if (dst_pages.size() != src_pages.size()) {
    return invalid_argument(
        fmt::format("copy: {} destination pages for {} source pages", dst_pages.size(), src_pages.size()));
  }
  if (dst_pages.size() > static_cast<std::size_t>(kInt32Max)) return invalid_argument("copy: too many pages");
  CLM_RETURN_IF_ERROR(check_page_ids(dst_pages, dst_pages.size(), dst.num_pages, "copy: dst_pages"));
  CLM_RETURN_IF_ERROR(check_page_ids(src_pages, src_pages.size(), src.num_pages, "copy: src_pages"));
  std::vector<std::int32_t> d(dst_pages.begin(), dst_pages.end());
  std::sort(d.begin(), d.end());
  if (auto dup = std::adjacent_find(d.begin(), d.end()); dup != d.end()) {
    return invalid_argument(fmt::format("copy: destination page {} is written twice", *dup));
  }
  const auto dst_lo = reinterpret_cast<std::uintptr_t>(dst.base);
  const auto src_lo = reinterpret_cast<std::uintptr_t>(src.base);
  const std::uintptr_t dst_hi = dst_lo + dst.page_bytes * static_cast<std::size_t>(dst.num_pages);
  const std::uintptr_t src_hi = src_lo + src.page_bytes * static_cast<std::size_t>(src.num_pages);
  if (dst_lo == src_lo) {
    std::vector<std::int32_t> s(src_pages.begin(), src_pages.end());
    std::sort(s.begin(), s.end());
    std::vector<std::int32_t> both;
    std::set_intersection(d.begin(), d.end(), s.begin(), s.end(), std::back_inserter(both));
    if (!both.empty()) {
      return invalid_argument(fmt::format("copy: page {} is both read and written (same pool)", both.front()));
    }
  } else if (dst_lo < src_hi && src_lo < dst_hi) {
    return invalid_argument("copy: the source and destination views overlap");
  }
  return {};
}

Status check_no_overlap(const void* q, const void* out, std::size_t bytes, const char* what) {
  const auto qa = reinterpret_cast<std::uintptr_t>(q);
  const auto oa = reinterpret_cast<std::uintptr_t>(out);
  if (qa < oa + bytes && oa < qa + bytes) return invalid_argument(fmt::format("{}: out overlaps q", what));
  return {};
}

std::vector<CopyRun> coalesce_runs(std::span<const std::int32_t> dst_pages, std::span<const std::int32_t> src_pages) {
  std::vector<CopyRun> runs;
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {
    if (!runs.empty()) {
      CopyRun& r = runs.back();
      if (static_cast<std::int64_t>(r.src) + r.count == src_pages[i] &&
          static_cast<std::int64_t>(r.dst) + r.count == dst_pages[i]) {
        ++r.count;
        continue;
      }
    }
    runs.push_back(CopyRun{src_pages[i], dst_pages[i], 1});
  }
  return runs;
}

bool copy_kernel_supports(std::size_t page_bytes) {
  if (page_bytes % 16 != 0) return false;
  const std::size_t blocks = (page_bytes / 16 + kCopyUnitsPerBlock - 1) / kCopyUnitsPerBlock;
  return blocks <= static_cast<std::size_t>(kMaxGridY);
}

Dims copy_grid(std::size_t pairs, std::size_t page_bytes) {
  const std::size_t blocks = (page_bytes / 16 + kCopyUnitsPerBlock - 1) / kCopyUnitsPerBlock;
  return Dims{static_cast<unsigned>(pairs), static_cast<unsigned>(blocks), 1};
}

}  // namespace clm::cuda::detail
