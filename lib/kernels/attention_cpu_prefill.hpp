// lib/kernels/attention_cpu_prefill.hpp: the tile walk of the SIMD prefill kernels
// (attention_cpu_avx2.cpp, attention_cpu_avx512.cpp), written once for both.
//
// A tile of queries x the q heads of one kv head (M rows) runs over blocks of
// kKeyBlock keys: each block is packed (attention_cpu_prefill_pack.hpp), then
// S = Q K^T, the online softmax of each row, and O = diag(alpha) O + P V run on
// register-blocked micro-kernels of up to kRowTile rows; masks are applied
// only to blocks that straddle the diagonal or the window edge. The
// arithmetic is the ISA's: each kernel file defines, in clm::detail's
// anonymous namespace and before including this,
//
//   constexpr int kRowTile = 6;  // rows per micro-kernel
//   template <int MR> void qk_kernel(const float* q, const float* kt, float* s, int dim);
//   template <int MR> void pv_kernel(const float* p, const float* vp, float* o, const float* alpha, int dim,
//                                    int nk);
//   void softmax_row(float* s, float& m, float& l, float& alpha);
//
// then includes this inside its target-pragma region and calls
// prefill_tile_for(kv, shape, tile).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention_cpu_prefill_pack.hpp"
#include "clm/detail/attention_cpu.hpp"

namespace clm::detail {
namespace {

// The micro-kernels for mr rows (1 <= mr <= MR), by a compile-time count.
template <int MR = kRowTile>
void qk_tile(int mr, const float* q, const float* kt, float* s, int dim) {
  if constexpr (MR > 1) {
    if (mr < MR) return qk_tile<MR - 1>(mr, q, kt, s, dim);
  }
  qk_kernel<MR>(q, kt, s, dim);
}
template <int MR = kRowTile>
void pv_tile(int mr, const float* p, const float* vp, float* o, const float* alpha, int dim, int nk) {
  if constexpr (MR > 1) {
    if (mr < MR) return pv_tile<MR - 1>(mr, p, vp, o, alpha, dim, nk);
  }
  pv_kernel<MR>(p, vp, o, alpha, dim, nk);
}

template <KvDType DT>
void prefill_tile(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  const int dim = kv.head_dim;
  const int group = shape.group;
  const int nq = tile.q_end - tile.q_begin;
  const int rows = nq * group;
  const std::size_t d = static_cast<std::size_t>(dim);
  const std::size_t row_stride = static_cast<std::size_t>(shape.num_q_heads) * d;  // one token's q heads
  const std::size_t group_floats = static_cast<std::size_t>(group) * d;

  float* qs = scratch_floats(0, static_cast<std::size_t>(rows) * d);
  float* o = scratch_floats(1, static_cast<std::size_t>(rows) * d);
  float* s = scratch_floats(2, static_cast<std::size_t>(rows) * kKeyBlock);
  float* kt = scratch_floats(3, d * kKeyBlock);
  float* vp = scratch_floats(4, d * kKeyBlock);
  float* ml = scratch_floats(5, 3 * static_cast<std::size_t>(rows));
  float* m = ml;
  float* l = ml + rows;
  float* alpha = ml + 2 * rows;

  // Rows r = i * group + g: query q_begin + i, q head kv_head * group + g.
  const __m256 scale = _mm256_set1_ps(shape.scale);
  for (int i = 0; i < nq; ++i) {
    const float* src = tile.q + static_cast<std::size_t>(tile.q_begin + i) * row_stride +
                       static_cast<std::size_t>(tile.kv_head) * group_floats;
    float* dst = qs + static_cast<std::size_t>(i) * group_floats;
    for (std::size_t j = 0; j < group_floats; j += 8)
      _mm256_store_ps(dst + j, _mm256_mul_ps(_mm256_loadu_ps(src + j), scale));
  }
  std::memset(o, 0, static_cast<std::size_t>(rows) * d * sizeof(float));
  for (int r = 0; r < rows; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }

  const std::int64_t pos0 = tile.kv_len - tile.n_new;
  const std::int64_t first_pos = pos0 + tile.q_begin;
  const std::int64_t last_pos = pos0 + tile.q_end - 1;
  const std::int64_t key_begin = tile.window > 0 ? std::max<std::int64_t>(0, first_pos - tile.window + 1) : 0;
  const std::int64_t key_end = last_pos + 1;
  const std::size_t head_off = static_cast<std::size_t>(tile.kv_head) * kv.head_bytes;
  const char* krow[kKeyBlock];
  const char* vrow[kKeyBlock];

  for (std::int64_t kb = key_begin; kb < key_end; kb += kKeyBlock) {
    const int nb = static_cast<int>(std::min<std::int64_t>(kKeyBlock, key_end - kb));
    for (int j = 0; j < nb; ++j) krow[j] = kv.token_row(tile.pages, kb + j) + head_off;
    for (int j = nb; j < kKeyBlock; ++j) krow[j] = krow[nb - 1];
    for (int j = 0; j < nb; ++j) vrow[j] = krow[j] + kv.v_offset;
    pack_kt<DT>(krow, dim, kt);
    pack_v<DT>(vrow, nb, dim, vp);

    for (int r0 = 0; r0 < rows; r0 += kRowTile) {
      qk_tile(std::min(kRowTile, rows - r0), qs + static_cast<std::size_t>(r0) * d, kt,
              s + static_cast<std::size_t>(r0) * kKeyBlock, dim);
    }
    const bool unmasked =
        nb == kKeyBlock && kb + nb - 1 <= first_pos && (tile.window <= 0 || kb >= last_pos - tile.window + 1);
    if (!unmasked) {
      for (int i = 0; i < nq; ++i) {
        const std::int64_t pos = first_pos + i;
        const std::int64_t lo = tile.window > 0 ? pos - tile.window + 1 : 0;
        for (int g = 0; g < group; ++g) {
          float* row = s + static_cast<std::size_t>(i * group + g) * kKeyBlock;
          for (int j = 0; j < kKeyBlock; ++j) {
            const std::int64_t key = kb + j;
            if (j >= nb || key > pos || key < lo) row[j] = kNegInf;
          }
        }
      }
    }
    for (int r = 0; r < rows; ++r) softmax_row(s + static_cast<std::size_t>(r) * kKeyBlock, m[r], l[r], alpha[r]);
    for (int r0 = 0; r0 < rows; r0 += kRowTile) {
      pv_tile(std::min(kRowTile, rows - r0), s + static_cast<std::size_t>(r0) * kKeyBlock, vp,
              o + static_cast<std::size_t>(r0) * d, alpha + r0, dim, nb);
    }
  }

  for (int i = 0; i < nq; ++i) {
    float* dst = tile.out + static_cast<std::size_t>(tile.q_begin + i) * row_stride +
                 static_cast<std::size_t>(tile.kv_head) * group_floats;
    for (int g = 0; g < group; ++g) {
      const int r = i * group + g;
      const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
      const float* src = o + static_cast<std::size_t>(r) * d;
      for (int j = 0; j < dim; j += 8) {
        _mm256_storeu_ps(dst + static_cast<std::size_t>(g) * d + j, _mm256_mul_ps(_mm256_load_ps(src + j), inv));
      }
    }
  }
}

// The entry point: the walk for the pool's dtype.
inline void prefill_tile_for(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { prefill_tile<DT>(kv, shape, tile); });
}

}  // namespace
}  // namespace clm::detail
