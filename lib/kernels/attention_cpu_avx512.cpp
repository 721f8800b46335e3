// AVX-512F attention kernels (see clm/detail/attention_cpu.hpp).
//
// decode: the AVX2 decode of attention_cpu_avx2.cpp at twice the width: the
//   same block walk (attention_cpu_decode.hpp: scores in address order,
//   online softmax, acc += P V), with 16 dot products in flight in QK and 16
//   accumulators in P V instead of 8, which AVX-512's 32 registers hold. A
//   64-byte load carries 32 bf16 elements, unpacked by one shift and one and
//   (even elements | odd elements), so each cache line costs a third of the
//   instructions of the AVX2 path.
// prefill: the AVX2 tile's walk and packing (attention_cpu_prefill.hpp,
//   attention_cpu_prefill_pack.hpp) with micro-kernels twice as wide: a
//   32-key block is two vectors, so up to 12 rows fit the registers (24
//   accumulators) against AVX2's 6.
//
// Compiled per function for AVX-512F (+ the AVX2 set) through a target pragma,
// not with -mavx512f for the file, and called only after
// __builtin_cpu_supports("avx512f") (lib/kernels/attention_cpu_isa.cpp).
#include "clm/detail/attention_cpu.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CLM_AVX512_KERNELS 1
#else
#define CLM_AVX512_KERNELS 0
#endif

#if CLM_AVX512_KERNELS

// GCC 12's AVX-512 intrinsics initialise their unused operands from themselves
// (_mm512_undefined_ps), which -Wmaybe-uninitialized reports wherever they are
// inlined (GCC bug 105593, fixed in 13): silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include "attention_cpu_prefetch.hpp"      // PrefetchStream, which P V paces: this file's copy
#include "attention_cpu_prefill_pack.hpp"  // kKeyBlock, kBytes, the packing of a key block: this file's copies

namespace clm::detail {
namespace {

constexpr int kLanes = 16;  // floats per vector; also dot products in flight

// 32 consecutive elements of a KV row as two f32 vectors, in the "block
// layout" of DT: elements 0-15 and 16-31 for f32 / f16; for bf16 the even
// elements and the odd ones (one 64-byte load, one shift, one and). q and acc
// are kept in the same layout (to_block_layout / from_block_layout).
template <KvDType DT>
inline void load32(const char* p, __m512& lo, __m512& hi) {
  if constexpr (DT == KvDType::bf16) {
    const __m512i x = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (DT == KvDType::f16) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 64);
  }
}

// In place, every 32 floats of x[0, n): out[i] = (first 16 | next 16)[index[i]]
// for the 32 indices of lo (outputs 0-15) and hi (outputs 16-31).
inline void permute32(float* x, std::size_t n, __m512i lo, __m512i hi) {
  for (std::size_t i = 0; i < n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i);
    const __m512 b = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(x + i, _mm512_permutex2var_ps(a, lo, b));
    _mm512_storeu_ps(x + i + 16, _mm512_permutex2var_ps(a, hi, b));
  }
}

// In place, n a multiple of 32: natural order -> block layout of DT, and back
// (for bf16: even elements | odd elements; element 2j + 1 is at 16 + j).
template <KvDType DT>
inline void to_block_layout(float* x, std::size_t n) {
  if constexpr (DT == KvDType::bf16) {
    permute32(x, n, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
              _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
  } else {
    (void)x;
    (void)n;
  }
}
template <KvDType DT>
inline void from_block_layout(float* x, std::size_t n) {
  if constexpr (DT == KvDType::bf16) {
    permute32(x, n, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
              _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
  } else {
    (void)x;
    (void)n;
  }
}

// exp(x) for x <= 88 (Cephes' polynomial, ~1 ulp; the AVX2 path's, 16 wide);
// exactly 0 below -87, so masked -inf scores give 0. NaN stays NaN.
inline __m512 exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);  // x second: a NaN x passes through
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(pow2));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), y);
}

// The 16 horizontal sums of a[0..15], as one vector (lane i = sum of a[i]):
// a tree of in-lane then cross-lane shuffles, 45 instructions for 16 sums.
inline __m512 hsum16(const __m512* a) {
  // (1) pairs: per 128-bit lane [x0+x2, y0+y2, x1+x3, y1+y3].
  __m512 b[8];
  for (int k = 0; k < 8; ++k) {
    b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  }
  // (2) quads: per 128-bit lane, position j holds that lane's sum of a[4k + j].
  __m512 e[4];
  for (int k = 0; k < 4; ++k) {
    e[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // (3) across 128-bit lanes: [e0.L0+L1, e0.L2+L3, e1.L0+L1, e1.L2+L3], then the last step.
  __m512 f[2];
  for (int k = 0; k < 2; ++k) {
    f[k] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * k], e[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e[2 * k], e[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of SG q heads (q: [SG][dim], scaled, block layout) against ntok K
// rows (a multiple of 16 / SG): s[t][g].
template <KvDType DT, int SG>
inline void qk_group(const float* q, const char* const* krow, int ntok, int dim, float* s) {
  constexpr int TT = kLanes / SG;  // tokens per pass: TT * SG = 16 dot products in flight
  constexpr std::size_t E = kBytes<DT>;
  for (int t = 0; t < ntok; t += TT) {
    __m512 a[kLanes];
    for (int i = 0; i < kLanes; ++i) a[i] = _mm512_setzero_ps();
    for (int d = 0; d < dim; d += 32) {
      for (int tt = 0; tt < TT; ++tt) {
        __m512 k0, k1;
        load32<DT>(krow[t + tt] + static_cast<std::size_t>(d) * E, k0, k1);
        for (int g = 0; g < SG; ++g) {
          const float* qg = q + static_cast<std::ptrdiff_t>(g) * dim + d;
          a[tt * SG + g] = _mm512_fmadd_ps(_mm512_load_ps(qg), k0, a[tt * SG + g]);
          a[tt * SG + g] = _mm512_fmadd_ps(_mm512_load_ps(qg + 16), k1, a[tt * SG + g]);
        }
      }
    }
    _mm512_storeu_ps(s + t * SG, hsum16(a));
  }
}

// Online softmax over one block's scores s[t][g] (nt valid tokens): updates
// m and l, turns s into p, returns the rescale factors of acc in alpha.
template <int SG>
void softmax_update(float* s, int nt, float* m, float* l, float* alpha) {
  const int n = nt * SG;
  const int nv = (n + kLanes - 1) / kLanes;
  for (int i = n; i < nv * kLanes; ++i) s[i] = kNegInf;
  __m512 mx = _mm512_set1_ps(kNegInf);
  for (int v = 0; v < nv; ++v) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + kLanes * v));
  alignas(64) float lane[kLanes];
  _mm512_store_ps(lane, mx);
  for (int g = 0; g < SG; ++g) {
    float bm = kNegInf;
    for (int i = g; i < kLanes; i += SG) bm = std::max(bm, lane[i]);
    const float m_new = std::max(m[g], bm);
    alpha[g] = std::exp(m[g] - m_new);
    m[g] = m_new;
  }
  alignas(64) float pattern[kLanes];
  for (int i = 0; i < kLanes; ++i) pattern[i] = m[i % SG];
  const __m512 mv = _mm512_load_ps(pattern);
  __m512 sum = _mm512_setzero_ps();
  for (int v = 0; v < nv; ++v) {
    const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + kLanes * v), mv));
    _mm512_storeu_ps(s + kLanes * v, p);
    sum = _mm512_add_ps(sum, p);
  }
  _mm512_store_ps(lane, sum);
  for (int g = 0; g < SG; ++g) {
    float ls = 0.0f;
    for (int i = g; i < kLanes; i += SG) ls += lane[i];
    l[g] = l[g] * alpha[g] + ls;
  }
}

// acc[g] = alpha[g] acc[g] + sum_t p[t * stride + g] v[t] for NG q heads (1,
// 2, 4 or 8), 16 accumulators a pass: 64 columns a pass (4 vectors a head)
// for up to 4 heads, fewer heads than 4 splitting the tokens over 4 / NG sets
// of accumulators; 32 columns (2 vectors a head) for 8 heads, so that each V
// row is unpacked once for all 8.
template <KvDType DT, int NG>
void pv_rows(const float* p, int stride, int nt, const char* const* vrow, int dim, float* acc, const float* alpha,
             PrefetchStream& pf) {
  constexpr std::size_t E = kBytes<DT>;
  constexpr int VH = NG == 8 ? 2 : 4;       // vectors a head per pass
  constexpr int TS = NG == 8 ? 1 : 4 / NG;  // token sets
  constexpr int kCols = VH * kLanes;        // columns per pass
  for (int d0 = 0; d0 < dim; d0 += kCols) {
    __m512 o[TS][NG][VH];
    for (int g = 0; g < NG; ++g) {
      const __m512 al = _mm512_set1_ps(alpha[g]);
      for (int c = 0; c < VH; ++c) {
        o[0][g][c] = _mm512_mul_ps(_mm512_load_ps(acc + static_cast<std::ptrdiff_t>(g) * dim + d0 + 16 * c), al);
        for (int ts = 1; ts < TS; ++ts) o[ts][g][c] = _mm512_setzero_ps();
      }
    }
    auto add_row = [&](int t, __m512(&os)[NG][VH]) {
      const char* vr = vrow[t] + static_cast<std::size_t>(d0) * E;
      __m512 pb[NG];
      for (int g = 0; g < NG; ++g) pb[g] = _mm512_set1_ps(p[t * stride + g]);
      for (int c = 0; c < VH / 2; ++c) {
        __m512 v0, v1;
        load32<DT>(vr + static_cast<std::size_t>(32 * c) * E, v0, v1);
        for (int g = 0; g < NG; ++g) {
          os[g][2 * c] = _mm512_fmadd_ps(pb[g], v0, os[g][2 * c]);
          os[g][2 * c + 1] = _mm512_fmadd_ps(pb[g], v1, os[g][2 * c + 1]);
        }
      }
    };
    int t = 0;
    for (; t + TS <= nt; t += TS) {
      if (t % PrefetchStream::kPaceRows == 0) pf.pace(PrefetchStream::kPaceRows * kCols * static_cast<std::int64_t>(E));
      for (int ts = 0; ts < TS; ++ts) add_row(t + ts, o[ts]);
    }
    for (; t < nt; ++t) add_row(t, o[0]);
    for (int ts = 1; ts < TS; ++ts) {
      for (int g = 0; g < NG; ++g) {
        for (int c = 0; c < VH; ++c) o[0][g][c] = _mm512_add_ps(o[0][g][c], o[ts][g][c]);
      }
    }
    for (int g = 0; g < NG; ++g) {
      for (int c = 0; c < VH; ++c)
        _mm512_store_ps(acc + static_cast<std::ptrdiff_t>(g) * dim + d0 + 16 * c, o[0][g][c]);
    }
  }
}

template <KvDType DT, int SG>
void softmax_pv(float* s, int nt, const char* const* vrow, int dim, float* acc, float* m, float* l,
                PrefetchStream& pf) {
  float alpha[SG];
  softmax_update<SG>(s, nt, m, l, alpha);
  pv_rows<DT, SG>(s, SG, nt, vrow, dim, acc, alpha, pf);
}

// ---- prefill ------------------------------------------------------------------
//
// What attention_cpu_prefill.hpp's tile walk calls.

constexpr int kRowTile = 12;  // rows per micro-kernel: 24 accumulators, 2 vectors of K or V, a broadcast

// S[r][0..kKeyBlock) = Q[r] . KT, MR rows.
template <int MR>
void qk_kernel(const float* q, const float* kt, float* s, int dim) {
  static_assert(kKeyBlock == 2 * kLanes);
  __m512 c[MR][2];
  for (int r = 0; r < MR; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  const float* k = kt;
  for (int d = 0; d < dim; ++d, k += kKeyBlock) {
    const __m512 k0 = _mm512_load_ps(k);
    const __m512 k1 = _mm512_load_ps(k + kLanes);
    for (int r = 0; r < MR; ++r) {
      const __m512 b = _mm512_set1_ps(q[static_cast<std::ptrdiff_t>(r) * dim + d]);
      c[r][0] = _mm512_fmadd_ps(b, k0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(b, k1, c[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_store_ps(s + r * kKeyBlock, c[r][0]);
    _mm512_store_ps(s + r * kKeyBlock + kLanes, c[r][1]);
  }
}

// O[r] = alpha[r] * O[r] + sum_{k < nk} P[r][k] * Vp[k], MR rows, 32 columns a pass.
template <int MR>
void pv_kernel(const float* p, const float* vp, float* o, const float* alpha, int dim, int nk) {
  for (int c0 = 0; c0 < dim; c0 += 2 * kLanes) {
    __m512 c[MR][2];
    for (int r = 0; r < MR; ++r) {
      const __m512 al = _mm512_set1_ps(alpha[r]);
      float* row = o + static_cast<std::ptrdiff_t>(r) * dim + c0;
      c[r][0] = _mm512_mul_ps(_mm512_load_ps(row), al);
      c[r][1] = _mm512_mul_ps(_mm512_load_ps(row + kLanes), al);
    }
    const float* v = vp + c0;
    for (int k = 0; k < nk; ++k, v += dim) {
      const __m512 v0 = _mm512_load_ps(v);
      const __m512 v1 = _mm512_load_ps(v + kLanes);
      for (int r = 0; r < MR; ++r) {
        const __m512 b = _mm512_set1_ps(p[r * kKeyBlock + k]);
        c[r][0] = _mm512_fmadd_ps(b, v0, c[r][0]);
        c[r][1] = _mm512_fmadd_ps(b, v1, c[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      float* row = o + static_cast<std::ptrdiff_t>(r) * dim + c0;
      _mm512_store_ps(row, c[r][0]);
      _mm512_store_ps(row + kLanes, c[r][1]);
    }
  }
}

// Online softmax of one row of S (in place: S becomes P).
inline void softmax_row(float* s, float& m, float& l, float& alpha) {
  const __m512 s0 = _mm512_load_ps(s);
  const __m512 s1 = _mm512_load_ps(s + kLanes);
  const float m_new = std::max(m, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  if (m_new == kNegInf) {  // every key so far masked: nothing to add
    alpha = 1.0f;
    _mm512_store_ps(s, _mm512_setzero_ps());
    _mm512_store_ps(s + kLanes, _mm512_setzero_ps());
    return;
  }
  alpha = std::exp(m - m_new);
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 p0 = exp16(_mm512_sub_ps(s0, mv));
  const __m512 p1 = exp16(_mm512_sub_ps(s1, mv));
  _mm512_store_ps(s, p0);
  _mm512_store_ps(s + kLanes, p1);
  l = l * alpha + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  m = m_new;
}

// ---- decode ---------------------------------------------------------------------
//
// What attention_cpu_decode.hpp's block walk calls besides the kernels above.
constexpr int kDecodeDots = kLanes;
template <KvDType DT>
void load_q(float* qs, const float* q, std::size_t n, float scale) {
  const __m512 sv = _mm512_set1_ps(scale);
  for (std::size_t i = 0; i < n; i += kLanes) _mm512_store_ps(qs + i, _mm512_mul_ps(_mm512_loadu_ps(q + i), sv));
  to_block_layout<DT>(qs, n);
}

}  // namespace
}  // namespace clm::detail

#include "attention_cpu_decode.hpp"   // the decode's block walk over the kernels above, compiled for AVX-512 here
#include "attention_cpu_prefill.hpp"  // the prefill's tile walk, likewise

namespace clm::detail {
void decode_chunk_avx512(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  decode_blocks_for(kv, shape, chunk);
}
void prefill_tile_avx512(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  prefill_tile_for(kv, shape, tile);
}

}  // namespace clm::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace clm::detail {
bool avx512_kernels_built() { return true; }
}  // namespace clm::detail

#else  // !CLM_AVX512_KERNELS

#include <cstdlib>

namespace clm::detail {
bool avx512_kernels_built() { return false; }
void decode_chunk_avx512(const KvLayer&, const AttnShape&, const DecodeChunk&) { std::abort(); }
void prefill_tile_avx512(const KvLayer&, const AttnShape&, const PrefillTile&) { std::abort(); }
}  // namespace clm::detail

#endif
