// cuda/kernels/plan.hpp: host-side validation and work planning for the CUDA kernels.
// Plain C++ (no CUDA): everything a kernel will index is checked here before
// any launch, and the same code drives the CPU emulation tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "clm/kernels/attention.hpp"
#include "clm/status.hpp"
#include "kernels/kernel_args.hpp"

namespace clm::cuda::detail {

// Largest sequence the kernels accept (keeps every token index, plus a tile,
// inside int32).
inline constexpr std::int64_t kMaxKvLen = std::int64_t{1} << 30;
// Prefill calls with at most this many new tokens run as a decode batch (one
// row per new token), whose split-K spreads a long prefix over the GPU.
inline constexpr std::int32_t kSmallPrefillRows = 8;

// The geometry of a view: > 0 sizes, a known dtype, byte sizes consistent with
// paged_kv_pool.hpp, and base + num_pages * page_bytes representable. `what`
// names the view in messages. Does not look at where the memory is.
Status validate_view(const PagedKvView& kv, const char* what);

// MemoryKind::device (host: unsupported, as the CPU kernels answer a device
// pool; none: failed_precondition).
Status check_device_kind(const PagedKvView& kv, const char* what);

// check_device_kind and validate_view, plus what the attention kernels need:
// head_dim 64 or 128, a 16-byte aligned base, and a layer in range.
Status validate_kernel_view(const PagedKvView& kv, std::int32_t layer);

// Head counts: num_q_heads > 0 and a multiple of kv_heads, within the grid
// limits; softmax_scale finite; sliding_window >= 0.
Status validate_heads(const PagedKvView& kv, const AttentionParams& params);

float effective_scale(const AttentionParams& params, std::int32_t head_dim);
std::int32_t page_shift(std::int32_t page_size);  // log2 when a power of two, else -1

// ---- decode ------------------------------------------------------------------
struct HeadBlocking {
  std::int32_t heads_per_block = 1;  // G: 1, 2, 4 or 8
  std::int32_t blocks_per_kv_head = 1;
};
HeadBlocking choose_head_blocking(std::int32_t group);

struct DecodeTuning {
  std::int32_t sm_count = 1;
  std::int32_t blocks_per_sm = 1;  // occupancy of the decode kernel instance
  std::int32_t chunk_tokens = 0;   // > 0: forced split-K chunk length
};

// Tokens per decode tile for a dtype and head_dim (see decode_chunk_kernel).
std::int32_t decode_tile_tokens(KvDType dtype, std::int32_t head_dim);

struct DecodePlan {
  // what it was planned for
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  KvDType dtype = KvDType::f32;
  std::int32_t num_q_heads = 0;
  std::int32_t sliding_window = 0;
  std::int32_t batch = 0;
  std::int32_t group = 0;
  HeadBlocking heads;
  std::int32_t chunk_tokens = 0;
  std::int64_t nnz = 0;  // indices[0, nnz) are used
  std::vector<DecodeItem> items;
  std::vector<std::int32_t> merge_indptr;  // [batch + 1]
  Dims decode_grid;
  Dims merge_grid;
};

// Checks a decode batch in FlashInfer's CSR form (see attention.hpp) and
// splits every sequence into chunks:
//   indptr.size() == last_page_len.size() + 1, indptr[0] == 0, each sequence
//   has >= 1 page, indptr.back() <= indices.size(), every used page id in
//   [0, num_pages), 1 <= last_page_len[i] <= page_size, kv_len <= kMaxKvLen.
// With a sliding window only the last `window` tokens of a sequence are planned.
Status plan_decode(const PagedKvView& kv, const AttentionParams& params, std::span<const std::int32_t> indptr,
                   std::span<const std::int32_t> indices, std::span<const std::int32_t> last_page_len,
                   const DecodeTuning& tuning, DecodePlan& plan);

// A planned batch may run on any view of the same geometry, any layer.
Status check_decode_run(const DecodePlan& plan, const PagedKvView& kv, const AttentionParams& params);

DecodeArgs make_decode_args(const DecodePlan& plan, const PagedKvView& kv, const AttentionParams& params,
                            const std::int32_t* indices, const DecodeItem* items, const float* q,
                            float* partial_out, float* partial_lse);
MergeArgs make_merge_args(const DecodePlan& plan, const std::int32_t* merge_indptr, const float* partial_out,
                          const float* partial_lse, float* out);
// Floats of partial output + lse the plan needs.
std::size_t decode_partial_floats(const DecodePlan& plan);

// ---- prefill -------------------------------------------------------------------
// 0 <= n_new <= kv_len <= kMaxKvLen, pages.size() >= ceil(kv_len / page_size)
// with those pages in range, n_new * group within int32.
Status validate_prefill(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new,
                        std::span<const std::int32_t> pages, std::int32_t kv_len);
std::int32_t prefill_pages_used(const PagedKvView& kv, std::int32_t kv_len);
Dims prefill_grid(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new);
PrefillArgs make_prefill_args(const PagedKvView& kv, const AttentionParams& params, std::int32_t n_new,
                              std::int32_t kv_len, const std::int32_t* pages, const float* q, float* out);

// ---- write_kv --------------------------------------------------------------------
// Every slot in [0, num_pages * page_size), no slot twice, at most INT32_MAX rows.
Status validate_write_kv(const PagedKvView& kv, std::int32_t layer, std::span<const std::int64_t> slots);
WriteKvArgs make_write_kv_args(const PagedKvView& kv, std::int32_t layer, const std::int64_t* slots,
                               const float* k, const float* v);

// ---- page copies -------------------------------------------------------------------
// Same page layout on both sides, equal lengths, ids in range, no destination
// page twice, and when both views share a base no page both read and written.
Status validate_copy(const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                     std::span<const std::int32_t> src_pages);

// q and out of `bytes` each must not overlap (as the CPU kernels require).
Status check_no_overlap(const void* q, const void* out, std::size_t bytes, const char* what);

struct CopyRun {  // pages [src, src + count) -> [dst, dst + count)
  std::int32_t src;
  std::int32_t dst;
  std::int32_t count;
};
std::vector<CopyRun> coalesce_runs(std::span<const std::int32_t> dst_pages, std::span<const std::int32_t> src_pages);

// The copy kernel needs page_bytes a multiple of 16 and at most 65535 blocks
// of 16 KiB per page.
bool copy_kernel_supports(std::size_t page_bytes);
Dims copy_grid(std::size_t pairs, std::size_t page_bytes);

}  // namespace clm::cuda::detail
