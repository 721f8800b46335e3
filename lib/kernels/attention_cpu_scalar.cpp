// lib/kernels/attention_cpu_scalar.cpp: the scalar CPU attention kernels
// (decode_chunk_scalar, prefill_tile_scalar; clm/detail/attention_cpu.hpp):
// any machine, any head_dim; the reference the SIMD kernels of
// attention_cpu_avx2.cpp and attention_cpu_avx512.cpp are tested against.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"

namespace clm {
namespace detail {
namespace {

// ---- scalar kernels ---------------------------------------------------------------

template <KvDType DT>
inline float load1(const char* row, std::size_t i) {
  if constexpr (DT == KvDType::f32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  } else {
    std::uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return DT == KvDType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

template <KvDType DT>
void decode_chunk_scalar_t(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& c) {
  const std::size_t dim = static_cast<std::size_t>(kv.head_dim);
  const std::size_t group = static_cast<std::size_t>(shape.group);
  for (std::int64_t t = c.begin; t < c.end; ++t) {
    const char* token = kv.token_row(c.pages, t);
    for (std::size_t h = 0; h < static_cast<std::size_t>(kv.kv_heads); ++h) {
      const char* k = token + h * kv.head_bytes;
      const char* v = k + kv.v_offset;
      for (std::size_t hq = h * group; hq < (h + 1) * group; ++hq) {
        const float* q = c.q + hq * dim;
        float score = 0.0f;
        for (std::size_t d = 0; d < dim; ++d) score += q[d] * load1<DT>(k, d);
        score *= shape.scale;
        float* acc = c.acc + hq * dim;
        if (score > c.m[hq]) {
          const float alpha = std::exp(c.m[hq] - score);
          for (std::size_t d = 0; d < dim; ++d) acc[d] *= alpha;
          c.l[hq] *= alpha;
          c.m[hq] = score;
        }
        const float p = std::exp(score - c.m[hq]);
        c.l[hq] += p;
        for (std::size_t d = 0; d < dim; ++d) acc[d] += p * load1<DT>(v, d);
      }
    }
  }
}

template <KvDType DT>
void prefill_tile_scalar_t(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  const std::size_t dim = static_cast<std::size_t>(kv.head_dim);
  const std::size_t hq_count = static_cast<std::size_t>(shape.num_q_heads);
  const std::int64_t pos0 = tile.kv_len - tile.n_new;
  const std::size_t head_off = static_cast<std::size_t>(tile.kv_head) * kv.head_bytes;
  const std::int64_t span = tile.window > 0 ? std::min<std::int64_t>(tile.window, tile.kv_len) : tile.kv_len;
  float* scores = scratch_floats(0, static_cast<std::size_t>(span));
  float* acc = scratch_floats(1, dim);
  for (std::int32_t i = tile.q_begin; i < tile.q_end; ++i) {
    const std::int64_t pos = pos0 + i;
    const std::int64_t lo = tile.window > 0 ? std::max<std::int64_t>(0, pos - tile.window + 1) : 0;
    for (std::size_t g = 0; g < static_cast<std::size_t>(shape.group); ++g) {
      const std::size_t hq = static_cast<std::size_t>(tile.kv_head) * static_cast<std::size_t>(shape.group) + g;
      const float* q = tile.q + (static_cast<std::size_t>(i) * hq_count + hq) * dim;
      float mx = kNegInf;
      for (std::int64_t t = lo; t <= pos; ++t) {
        const char* k = kv.token_row(tile.pages, t) + head_off;
        float s = 0.0f;
        for (std::size_t d = 0; d < dim; ++d) s += q[d] * load1<DT>(k, d);
        s *= shape.scale;
        scores[t - lo] = s;
        mx = std::max(mx, s);
      }
      std::fill(acc, acc + dim, 0.0f);
      float sum = 0.0f;
      for (std::int64_t t = lo; t <= pos; ++t) {
        const float p = std::exp(scores[t - lo] - mx);
        sum += p;
        const char* v = kv.token_row(tile.pages, t) + head_off + kv.v_offset;
        for (std::size_t d = 0; d < dim; ++d) acc[d] += p * load1<DT>(v, d);
      }
      float* out = tile.out + (static_cast<std::size_t>(i) * hq_count + hq) * dim;
      for (std::size_t d = 0; d < dim; ++d) out[d] = acc[d] / sum;
    }
  }
}

}  // namespace

void decode_chunk_scalar(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  // The scalar kernel scales the scores, not q.
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { decode_chunk_scalar_t<DT>(kv, shape, chunk); });
}

void prefill_tile_scalar(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { prefill_tile_scalar_t<DT>(kv, shape, tile); });
}

}  // namespace detail
}  // namespace clm
