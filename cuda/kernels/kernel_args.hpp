// cuda/kernels/kernel_args.hpp: the plain arguments of the CUDA kernels (cuda/kernels/kernels.cuh)
// and their launch constants. No CUDA or clmcache includes: this is shared by
// the device code, the host glue (cuda_kernels.cpp, plan.cpp) and the CPU
// emulation test (tests/gpu/test_cuda_emulated.cpp).
#pragma once

#include <cstdint>

namespace clm::cuda::detail {

// Element types of the pool, numbered as clm::KvDType.
enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// ---- launch constants ------------------------------------------------------
inline constexpr int kDecodeThreads = 128;  // 4 warps
inline constexpr int kDecodeWarps = kDecodeThreads / 32;
inline constexpr int kDecodeTokensPerThread = 8;  // per tile: TILE = (threads / lanes per row) * 8
inline constexpr int kPrefillThreads = 128;
inline constexpr int kPrefillWarps = kPrefillThreads / 32;
inline constexpr int kPrefillRowsPerWarp = 4;
inline constexpr int kPrefillRows = kPrefillWarps * kPrefillRowsPerWarp;  // query rows per block
inline constexpr int kPrefillKeys = 32;                                   // keys per tile (one per lane)
inline constexpr int kWriteKvThreads = 128;
inline constexpr int kCopyThreads = 256;
inline constexpr int kCopyUnroll = 4;
inline constexpr int kCopyUnitsPerBlock = kCopyThreads * kCopyUnroll;  // 16-byte units
inline constexpr std::int64_t kMaxGridY = 65535;

struct Dims {
  unsigned x = 1, y = 1, z = 1;
};

// ---- decode (split-K) --------------------------------------------------------
// One unit of decode work: tokens [tok_begin, tok_end) of sequence `seq`,
// whose page ids start at indices[page_begin]. Each item gets its own
// partial output and log-sum-exp.
struct DecodeItem {
  std::int32_t seq;
  std::int32_t page_begin;
  std::int32_t tok_begin;
  std::int32_t tok_end;
};
static_assert(sizeof(DecodeItem) == 16);

struct DecodeArgs {
  const unsigned char* kv;   // pool base + layer * layer_bytes
  std::uint64_t page_bytes;  // stride between pages
  std::uint64_t v_offset;    // bytes from a page's K block to its V block
  std::int32_t page_size;
  std::int32_t page_shift;  // log2(page_size) when a power of two, else -1
  std::int32_t kv_heads;
  std::int32_t group;        // q heads per kv head
  std::int32_t num_q_heads;
  std::int32_t head_blocks;  // blocks per kv head (each takes heads_per_block q heads)
  float scale;
  const std::int32_t* indices;
  const DecodeItem* items;
  const float* q;        // [batch][num_q_heads][D]
  float* partial_out;    // [items][num_q_heads][D]
  float* partial_lse;    // [items][num_q_heads]
};

struct MergeArgs {
  const std::int32_t* merge_indptr;  // [batch + 1]: items of sequence i
  const float* partial_out;
  const float* partial_lse;
  float* out;  // [batch][num_q_heads][D]
  std::int32_t num_q_heads;
};

// ---- prefill -------------------------------------------------------------------
struct PrefillArgs {
  const unsigned char* kv;  // pool base + layer * layer_bytes
  std::uint64_t page_bytes;
  std::uint64_t v_offset;
  std::int32_t page_size;
  std::int32_t page_shift;
  std::int32_t kv_heads;
  std::int32_t group;
  std::int32_t num_q_heads;
  std::int32_t n_new;
  std::int32_t kv_len;
  std::int32_t window;  // 0: none
  float scale;
  const std::int32_t* pages;
  const float* q;  // [n_new][num_q_heads][D]
  float* out;
};

// ---- write_kv --------------------------------------------------------------------
struct WriteKvArgs {
  unsigned char* kv;  // pool base + layer * layer_bytes
  std::uint64_t page_bytes;
  std::uint64_t v_offset;
  std::int64_t page_size;
  std::int32_t row_elems;  // kv_heads * head_dim
  const std::int64_t* slots;
  const float* k;  // [n][kv_heads][head_dim]
  const float* v;
};

// ---- page copies -------------------------------------------------------------------
// Copies page pairs[2i] of src to page pairs[2i+1] of dst, 16 bytes at a time.
struct CopyArgs {
  const unsigned char* src;
  unsigned char* dst;
  std::uint64_t page_bytes;  // a multiple of 16
  std::uint64_t units;       // page_bytes / 16
  const std::int32_t* pairs;
};

}  // namespace clm::cuda::detail
