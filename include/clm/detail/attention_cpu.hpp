// clm/detail/attention_cpu.hpp: the inside of the CPU attention kernels
// (lib/kernels/attention_cpu*.cpp: the drivers, the ISA dispatch, the thread
// pool, the scalar, AVX2 and AVX-512 kernels):
// the per-ISA work units
// the drivers of clm/kernels/attention.hpp hand to threads, and switches for tests and
// benchmarks. Not part of the API.
//
// Dispatch: the first kernel call picks the best ISA this machine has
// (avx512f on top of avx2 + fma + f16c, else avx2 + fma + f16c, else scalar).
// The SIMD code is compiled with a per-function target (not -mavx2 or
// -mavx512f for the library), so the library runs on any x86-64 and on other
// architectures (scalar only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"

namespace clm::detail {

// avx512: the attention kernels in AVX-512F (the packed GEMM stays AVX2's).
// Each ISA includes the ones below it.
enum class CpuIsa : std::uint8_t { scalar = 0, avx2 = 1, avx512 = 2 };

const char* cpu_isa_name(CpuIsa isa);
CpuIsa cpu_isa_best();  // the best this machine supports
CpuIsa cpu_isa();       // the one in use
// Tests and benchmarks: force an ISA (unsupported if the machine lacks it).
Status set_cpu_isa(CpuIsa isa);
// Tests: tokens per flash-decoding chunk; 0 restores the automatic choice.
void set_decode_chunk_tokens(std::int32_t tokens);
// Tests and benchmarks: how a prefill of n_new >= 2 tokens runs: as the
// kernels choose, always in tiles, or (where a window leaves keys every new
// token sees) as one decode over the shared prefix plus each token's tail.
enum class PrefillRoute : std::uint8_t { automatic = 0, tiles = 1, decode = 2 };
void set_prefill_route(PrefillRoute route);
// The number of threads a kernel uses for `requested` (0 = all hardware threads).
int cpu_kernel_threads(int requested);

// The running max before any key, and the score of a masked key.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One layer of a host pool, as the kernels address it.
struct KvLayer {
  const char* base = nullptr;   // K block of page 0, this layer
  std::size_t page_stride = 0;  // page_bytes
  std::size_t v_offset = 0;     // from a K row to the V row of the same token and head
  std::size_t row_bytes = 0;    // one token, all kv heads: kv_heads * head_dim * E
  std::size_t head_bytes = 0;   // head_dim * E
  std::int32_t page_size = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  KvDType dtype = KvDType::f32;

  // K row of token t (head 0) of a sequence whose pages are `pages`.
  const char* token_row(const std::int32_t* pages, std::int64_t t) const {
    const std::int64_t page = pages[t / page_size];
    const std::int64_t row = t % page_size;
    return base + static_cast<std::size_t>(page) * page_stride + static_cast<std::size_t>(row) * row_bytes;
  }
};

struct AttnShape {
  std::int32_t num_q_heads = 0;
  std::int32_t group = 0;  // q heads per kv head
  float scale = 0.0f;      // softmax scale (resolved, > 0 or < 0, never 0)
};

// Tokens [begin, end) of one sequence, for every head: updates the running
// state (acc unnormalised [Hq][D], m = running max of scaled scores, l = sum
// of exp(score - m)). The caller initialises acc = 0, m = -inf, l = 0.
struct DecodeChunk {
  const float* q = nullptr;  // [Hq][D] of this sequence, unscaled
  const std::int32_t* pages = nullptr;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  float* acc = nullptr;
  float* m = nullptr;
  float* l = nullptr;
};

// Queries [q_begin, q_end) of the n_new new tokens, the q heads of one kv
// head: writes their rows of out.
struct PrefillTile {
  const float* q = nullptr;  // [n_new][Hq][D]
  float* out = nullptr;      // [n_new][Hq][D]
  const std::int32_t* pages = nullptr;
  std::int64_t kv_len = 0;
  std::int32_t n_new = 0;
  std::int32_t window = 0;  // 0: none
  std::int32_t kv_head = 0;
  std::int32_t q_begin = 0;
  std::int32_t q_end = 0;
};

// Calls f.template operator()<DT>() with the pool's dtype as a compile-time
// DT: the one switch from a dtype to the kernels' templates, e.g.
//   with_kv_dtype(kv.dtype, [&]<KvDType DT> { decode_blocks<DT>(kv, shape, chunk); });
template <class F>
void with_kv_dtype(KvDType dtype, F&& f) {
  switch (dtype) {
    case KvDType::f32:
      f.template operator()<KvDType::f32>();
      break;
    case KvDType::f16:
      f.template operator()<KvDType::f16>();
      break;
    case KvDType::bf16:
      f.template operator()<KvDType::bf16>();
      break;
  }
}

void decode_chunk_scalar(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk);
void prefill_tile_scalar(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile);

// AVX2 + FMA + F16C versions, for head_dim % 64 == 0. avx2_kernels_built() is
// false where they are not compiled in (not x86-64 GCC/Clang).
bool avx2_kernels_built();
void decode_chunk_avx2(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk);
void prefill_tile_avx2(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile);
inline constexpr std::int32_t kAvx2HeadDimMultiple = 64;

// AVX-512F decode and prefill (on top of the AVX2 set), for the same
// head_dim; false where they are not compiled in.
bool avx512_kernels_built();
void decode_chunk_avx512(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk);
void prefill_tile_avx512(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile);

// Per-thread scratch: `slot` names a buffer (0..7), 64-byte aligned, grown as
// needed and kept for the thread's life. Throws std::bad_alloc.
float* scratch_floats(int slot, std::size_t count);

}  // namespace clm::detail
