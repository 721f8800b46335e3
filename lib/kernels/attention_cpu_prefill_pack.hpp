// lib/kernels/attention_cpu_prefill_pack.hpp: what the prefill tiles of the SIMD
// kernel files (attention_cpu_avx2.cpp, attention_cpu_avx512.cpp) share ahead
// of their micro-kernels: the key block, a KV row read as f32 (load8), and the
// packing of one block of keys, K transposed into f32 [D][kKeyBlock] and V
// into f32 [kKeyBlock][D], so that the micro-kernels read both contiguously.
// AVX2 + F16C code: each kernel file includes this inside its target-pragma
// region, and the anonymous namespace gives each file its own copy.
//
//   pack_kt<DT>(krow, dim, kt);      // kKeyBlock rows, all valid
//   pack_v<DT>(vrow, nb, dim, vp);   // the nb valid rows
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "clm/detail/attention_cpu.hpp"

namespace clm::detail {
namespace {

constexpr int kKeyBlock = 32;  // keys per prefill block

template <KvDType DT>
constexpr std::size_t kBytes = DT == KvDType::f32 ? 4 : 2;

// 8 consecutive elements of a KV row, as f32.
template <KvDType DT>
inline __m256 load8(const char* p) {
  if constexpr (DT == KvDType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (DT == KvDType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline void transpose8(__m256* r) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
  const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
  const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
  const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
  const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// KT[d][j] = K row j, element d (f32), for kKeyBlock rows (all valid).
template <KvDType DT>
void pack_kt(const char* const* krow, int dim, float* kt) {
  constexpr std::size_t E = kBytes<DT>;
  for (int j0 = 0; j0 < kKeyBlock; j0 += 8) {
    for (int d0 = 0; d0 < dim; d0 += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = load8<DT>(krow[j0 + j] + static_cast<std::size_t>(d0) * E);
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(kt + static_cast<std::ptrdiff_t>(d0 + j) * kKeyBlock + j0, r[j]);
    }
  }
}

// Vp[j][:] = V row j (f32), for the nb valid rows.
template <KvDType DT>
void pack_v(const char* const* vrow, int nb, int dim, float* vp) {
  constexpr std::size_t E = kBytes<DT>;
  for (int j = 0; j < nb; ++j) {
    if constexpr (DT == KvDType::f32) {
      std::memcpy(vp + static_cast<std::ptrdiff_t>(j) * dim, vrow[j], static_cast<std::size_t>(dim) * 4);
    } else {
      for (int d = 0; d < dim; d += 8) {
        _mm256_store_ps(vp + static_cast<std::ptrdiff_t>(j) * dim + d,
                        load8<DT>(vrow[j] + static_cast<std::size_t>(d) * E));
      }
    }
  }
}

}  // namespace
}  // namespace clm::detail
