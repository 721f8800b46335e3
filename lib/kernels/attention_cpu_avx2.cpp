// AVX2 + FMA + F16C attention kernels (see clm/detail/attention_cpu.hpp).
//
// Every function below is compiled for that target through a target pragma
// (the same as __attribute__((target("avx2,fma,f16c"))) on each), not with
// -mavx2 for the file: nothing outside this region, and no inline function of
// a header shared with other files, is built for AVX2 (attention_cpu_decode.hpp's
// are this file's own copies, in an anonymous namespace), so the library still
// runs on any x86-64; the drivers in attention_cpu_drivers.cpp call in here only after
// __builtin_cpu_supports.
//
// decode: memory-bound. Per block of 64 tokens: the K rows are read in address
//   order and scored against the q heads of their kv head (up to 8 dot
//   products in flight, summed horizontally together), an online softmax
//   updates the running max / sum, and each V row is read once into the
//   group's accumulators. Rows are software-prefetched 128 KiB ahead, paced
//   by the reads (attention_cpu_prefetch.hpp). KV is converted to f32 in
//   registers as it is loaded. The block walk is attention_cpu_decode.hpp's,
//   shared with the AVX-512 decode.
// prefill: compute-bound. A tile of queries x the q heads of one kv head (M
//   rows) runs over 32-key blocks: K is packed transposed into f32 [D][32] and
//   V into f32 [32][D], S = Q K^T and O = diag(alpha) O + P V use 6x16
//   register-blocked micro-kernels, masks are applied only to blocks that
//   straddle the diagonal or the window edge.
#include "clm/detail/attention_cpu.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CLM_AVX2_KERNELS 1
#else
#define CLM_AVX2_KERNELS 0
#endif

#if CLM_AVX2_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "attention_cpu_prefetch.hpp"      // PrefetchStream, which P V paces: this file's copy
#include "attention_cpu_prefill_pack.hpp"  // kKeyBlock, load8, the packing of a key block: this file's copies

namespace clm::detail {
namespace {

constexpr int kRowTile = 6;  // rows per prefill micro-kernel (attention_cpu_prefill.hpp)

// exp(x) for x <= 88 (Cephes' polynomial, ~1 ulp); exactly 0 below -87
// (where f32 exp would be subnormal), so masked -inf scores give 0. NaN stays NaN.
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);  // x second: a NaN x passes through
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
  return _mm256_andnot_ps(underflow, y);
}

// The 8 horizontal sums of a[0..7], as one vector (lane i = sum of a[i]).
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- decode -------------------------------------------------------------------
//
// The arithmetic of the block walk in attention_cpu_decode.hpp (which reads
// the rows, prefetches and hands out the sub-groups): scores, online
// softmax, acc += P V, 8 dot products or accumulators in flight.

// 16 consecutive elements of a KV row as two f32 vectors, in the "block
// layout" of DT: elements 0-7 and 8-15 for f32/f16; for bf16 the even
// elements and the odd ones (0,2,..,14 | 1,3,..,15: one 256-bit load, one
// shift, one and; no cross-lane widening). Decode keeps q and acc in the same
// layout (to_block_layout / from_block_layout), so the order cancels out.
template <KvDType DT>
inline void load16(const char* p, __m256& lo, __m256& hi) {
  if constexpr (DT == KvDType::bf16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    lo = load8<DT>(p);
    hi = load8<DT>(p + 8 * kBytes<DT>);
  }
}

// In place, n a multiple of 16: natural order -> block layout of DT, and back.
template <KvDType DT>
inline void to_block_layout(float* x, std::size_t n) {
  if constexpr (DT == KvDType::bf16) {
    for (std::size_t i = 0; i < n; i += 16) {
      const __m256 a = _mm256_load_ps(x + i);                                          // 0..7
      const __m256 b = _mm256_load_ps(x + i + 8);                                      // 8..15
      const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20);                            // 0..3 | 8..11
      const __m256 hi = _mm256_permute2f128_ps(a, b, 0x31);                            // 4..7 | 12..15
      _mm256_store_ps(x + i, _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));      // 0 2 4 6 | 8 10 12 14
      _mm256_store_ps(x + i + 8, _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));  // 1 3 5 7 | 9 11 13 15
    }
  } else {
    (void)x;
    (void)n;
  }
}
template <KvDType DT>
inline void from_block_layout(float* x, std::size_t n) {
  if constexpr (DT == KvDType::bf16) {
    for (std::size_t i = 0; i < n; i += 16) {
      const __m256 even = _mm256_load_ps(x + i);
      const __m256 odd = _mm256_load_ps(x + i + 8);
      const __m256 lo = _mm256_unpacklo_ps(even, odd);  // 0 1 2 3 | 8 9 10 11
      const __m256 hi = _mm256_unpackhi_ps(even, odd);  // 4 5 6 7 | 12 13 14 15
      _mm256_store_ps(x + i, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_store_ps(x + i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  } else {
    (void)x;
    (void)n;
  }
}

// Scores of SG q heads (q: [SG][dim], scaled, block layout) against ntok K
// rows (a multiple of 8 / SG): s[t][g].
template <KvDType DT, int SG>
inline void qk_group(const float* q, const char* const* krow, int ntok, int dim, float* s) {
  constexpr int TT = 8 / SG;  // tokens per pass: TT * SG = 8 dot products in flight
  constexpr std::size_t E = kBytes<DT>;
  for (int t = 0; t < ntok; t += TT) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (int d = 0; d < dim; d += 16) {
      __m256 k0[TT], k1[TT];
      for (int tt = 0; tt < TT; ++tt) load16<DT>(krow[t + tt] + static_cast<std::size_t>(d) * E, k0[tt], k1[tt]);
      for (int g = 0; g < SG; ++g) {
        const float* qg = q + static_cast<std::ptrdiff_t>(g) * dim + d;
        const __m256 q0 = _mm256_load_ps(qg);
        const __m256 q1 = _mm256_load_ps(qg + 8);
        for (int tt = 0; tt < TT; ++tt) {
          a[tt * SG + g] = _mm256_fmadd_ps(q0, k0[tt], a[tt * SG + g]);
          a[tt * SG + g] = _mm256_fmadd_ps(q1, k1[tt], a[tt * SG + g]);
        }
      }
    }
    _mm256_storeu_ps(s + t * SG, hsum8(a));
  }
}

// Online softmax over one block's scores s[t][g] (nt valid tokens): updates
// m and l, turns s into p, returns the rescale factors of acc in alpha.
template <int SG>
void softmax_update(float* s, int nt, float* m, float* l, float* alpha) {
  const int n = nt * SG;
  const int nv = (n + 7) / 8;
  for (int i = n; i < nv * 8; ++i) s[i] = kNegInf;
  __m256 mx = _mm256_set1_ps(kNegInf);
  for (int v = 0; v < nv; ++v) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + 8 * v));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, mx);
  alignas(32) float pattern[8];
  for (int g = 0; g < SG; ++g) {
    float bm = kNegInf;
    for (int i = g; i < 8; i += SG) bm = std::max(bm, lane[i]);
    const float m_new = std::max(m[g], bm);
    alpha[g] = std::exp(m[g] - m_new);
    m[g] = m_new;
  }
  for (int i = 0; i < 8; ++i) pattern[i] = m[i % SG];
  const __m256 mv = _mm256_load_ps(pattern);
  __m256 sum = _mm256_setzero_ps();
  for (int v = 0; v < nv; ++v) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * v), mv));
    _mm256_storeu_ps(s + 8 * v, p);
    sum = _mm256_add_ps(sum, p);
  }
  _mm256_store_ps(lane, sum);
  for (int g = 0; g < SG; ++g) {
    float ls = 0.0f;
    for (int i = g; i < 8; i += SG) ls += lane[i];
    l[g] = l[g] * alpha[g] + ls;
  }
}

// acc[g] = alpha[g] acc[g] + sum_t p[t * stride + g] v[t] for NG q heads
// (NG in 1, 2, 4: 8 accumulators of NG x 16 / NG columns), V rows read in
// place, acc in block layout.
template <KvDType DT, int NG>
void pv_rows(const float* p, int stride, int nt, const char* const* vrow, int dim, float* acc, const float* alpha,
             PrefetchStream& pf) {
  constexpr std::size_t E = kBytes<DT>;
  constexpr int NB = 4 / NG;  // 16-column blocks per pass
  for (int d0 = 0; d0 < dim; d0 += 16 * NB) {
    __m256 o[NG][2 * NB];
    for (int g = 0; g < NG; ++g) {
      const __m256 al = _mm256_set1_ps(alpha[g]);
      for (int c = 0; c < 2 * NB; ++c) {
        o[g][c] = _mm256_mul_ps(_mm256_load_ps(acc + static_cast<std::ptrdiff_t>(g) * dim + d0 + 8 * c), al);
      }
    }
    for (int t = 0; t < nt; ++t) {
      if (t % PrefetchStream::kPaceRows == 0)
        pf.pace(PrefetchStream::kPaceRows * 16 * NB * static_cast<std::int64_t>(E));
      const char* vr = vrow[t] + static_cast<std::size_t>(d0) * E;
      __m256 pb[NG];
      for (int g = 0; g < NG; ++g) pb[g] = _mm256_set1_ps(p[t * stride + g]);
      for (int c = 0; c < NB; ++c) {
        __m256 v0, v1;
        load16<DT>(vr + static_cast<std::size_t>(16 * c) * E, v0, v1);
        for (int g = 0; g < NG; ++g) {
          o[g][2 * c] = _mm256_fmadd_ps(pb[g], v0, o[g][2 * c]);
          o[g][2 * c + 1] = _mm256_fmadd_ps(pb[g], v1, o[g][2 * c + 1]);
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      for (int c = 0; c < 2 * NB; ++c)
        _mm256_store_ps(acc + static_cast<std::ptrdiff_t>(g) * dim + d0 + 8 * c, o[g][c]);
    }
  }
}

template <KvDType DT, int SG>
void softmax_pv(float* s, int nt, const char* const* vrow, int dim, float* acc, float* m, float* l,
                PrefetchStream& pf) {
  float alpha[SG];
  softmax_update<SG>(s, nt, m, l, alpha);
  if constexpr (SG == 8) {  // two passes of 4: 16 accumulators would not fit in registers
    pv_rows<DT, 4>(s, 8, nt, vrow, dim, acc, alpha, pf);
    pv_rows<DT, 4>(s + 4, 8, nt, vrow, dim, acc + 4 * dim, alpha + 4, pf);
  } else {
    pv_rows<DT, SG>(s, SG, nt, vrow, dim, acc, alpha, pf);
  }
}

// What attention_cpu_decode.hpp's block walk calls besides the kernels above.
constexpr int kDecodeDots = 8;
template <KvDType DT>
void load_q(float* qs, const float* q, std::size_t n, float scale) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (std::size_t i = 0; i < n; i += 8) _mm256_store_ps(qs + i, _mm256_mul_ps(_mm256_loadu_ps(q + i), sv));
  to_block_layout<DT>(qs, n);
}

// ---- prefill ------------------------------------------------------------------

// S[r][0..kKeyBlock) = Q[r] . KT, MR rows.
template <int MR>
void qk_kernel(const float* q, const float* kt, float* s, int dim) {
  for (int n0 = 0; n0 < kKeyBlock; n0 += 16) {
    __m256 c[MR][2];
    for (int r = 0; r < MR; ++r) c[r][0] = c[r][1] = _mm256_setzero_ps();
    const float* k = kt + n0;
    for (int d = 0; d < dim; ++d, k += kKeyBlock) {
      const __m256 k0 = _mm256_load_ps(k);
      const __m256 k1 = _mm256_load_ps(k + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 b = _mm256_broadcast_ss(q + static_cast<std::ptrdiff_t>(r) * dim + d);
        c[r][0] = _mm256_fmadd_ps(b, k0, c[r][0]);
        c[r][1] = _mm256_fmadd_ps(b, k1, c[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      _mm256_store_ps(s + r * kKeyBlock + n0, c[r][0]);
      _mm256_store_ps(s + r * kKeyBlock + n0 + 8, c[r][1]);
    }
  }
}

// O[r] = alpha[r] * O[r] + sum_{k < nk} P[r][k] * Vp[k], MR rows.
template <int MR>
void pv_kernel(const float* p, const float* vp, float* o, const float* alpha, int dim, int nk) {
  for (int c0 = 0; c0 < dim; c0 += 16) {
    __m256 c[MR][2];
    for (int r = 0; r < MR; ++r) {
      const __m256 al = _mm256_set1_ps(alpha[r]);
      c[r][0] = _mm256_mul_ps(_mm256_load_ps(o + static_cast<std::ptrdiff_t>(r) * dim + c0), al);
      c[r][1] = _mm256_mul_ps(_mm256_load_ps(o + static_cast<std::ptrdiff_t>(r) * dim + c0 + 8), al);
    }
    const float* v = vp + c0;
    for (int k = 0; k < nk; ++k, v += dim) {
      const __m256 v0 = _mm256_load_ps(v);
      const __m256 v1 = _mm256_load_ps(v + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 b = _mm256_broadcast_ss(p + r * kKeyBlock + k);
        c[r][0] = _mm256_fmadd_ps(b, v0, c[r][0]);
        c[r][1] = _mm256_fmadd_ps(b, v1, c[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      _mm256_store_ps(o + static_cast<std::ptrdiff_t>(r) * dim + c0, c[r][0]);
      _mm256_store_ps(o + static_cast<std::ptrdiff_t>(r) * dim + c0 + 8, c[r][1]);
    }
  }
}

// Online softmax of one row of S (in place: S becomes P).
inline void softmax_row(float* s, float& m, float& l, float& alpha) {
  __m256 mx = _mm256_load_ps(s);
  for (int j = 8; j < kKeyBlock; j += 8) mx = _mm256_max_ps(mx, _mm256_load_ps(s + j));
  const float m_new = std::max(m, hmax8(mx));
  if (m_new == kNegInf) {  // every key so far masked: nothing to add
    alpha = 1.0f;
    for (int j = 0; j < kKeyBlock; j += 8) _mm256_store_ps(s + j, _mm256_setzero_ps());
    return;
  }
  alpha = std::exp(m - m_new);
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < kKeyBlock; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s + j), mv));
    _mm256_store_ps(s + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  l = l * alpha + hsum(sum);
  m = m_new;
}

}  // namespace
}  // namespace clm::detail

#include "attention_cpu_decode.hpp"   // the decode's block walk over the kernels above, compiled for AVX2 here
#include "attention_cpu_prefill.hpp"  // the prefill's tile walk, likewise

namespace clm::detail {
void decode_chunk_avx2(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  decode_blocks_for(kv, shape, chunk);
}

void prefill_tile_avx2(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  prefill_tile_for(kv, shape, tile);
}

}  // namespace clm::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace clm::detail {
bool avx2_kernels_built() { return true; }
}  // namespace clm::detail

#else  // !CLM_AVX2_KERNELS

#include <cstdlib>

namespace clm::detail {
bool avx2_kernels_built() { return false; }
void decode_chunk_avx2(const KvLayer&, const AttnShape&, const DecodeChunk&) { std::abort(); }
void prefill_tile_avx2(const KvLayer&, const AttnShape&, const PrefillTile&) { std::abort(); }
}  // namespace clm::detail

#endif
