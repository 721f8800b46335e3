// lib/kernels/attention_cpu_decode.hpp: the block walk of the SIMD decode kernels
// (attention_cpu_avx2.cpp, attention_cpu_avx512.cpp), written once for both.
//
// Per block of 64 tokens: (A) in address order, `step` tokens at a time (every
// kv head of a token is one contiguous row), the scores of every q head; (B)
// per kv head, the online softmax update; (C) per kv head, acc += P V, the V
// rows read head-major from L2. The chunk's rows reach L2 through one
// prefetch stream (attention_cpu_prefetch.hpp) that the walk paces evenly
// through both phases (with ~2 FMAs per byte the core by itself keeps too few
// misses in flight). The arithmetic is the ISA's: each kernel file defines, in
// clm::detail's anonymous namespace and before including this,
//
//   constexpr int kDecodeDots = 8;  // dot products in flight in QK
//   template <KvDType DT> void load_q(float* qs, const float* q, std::size_t n, float scale);
//   template <KvDType DT> void to_block_layout(float* x, std::size_t n);
//   template <KvDType DT> void from_block_layout(float* x, std::size_t n);
//   template <KvDType DT, int SG> void qk_group(const float* q, const char* const* krow, int ntok, int dim,
//                                               float* s);
//   template <KvDType DT, int SG> void softmax_pv(float* s, int nt, const char* const* vrow, int dim,
//                                                 float* acc, float* m, float* l, PrefetchStream& pf);
//
// (softmax_pv calls pf.pace() with the bytes of V it reads, every
// PrefetchStream::kPaceRows rows) then
// includes this inside its target-pragma region and calls
// decode_blocks_for(kv, shape, chunk): the walk is compiled for its ISA and
// inlines its kernels; the anonymous namespace gives each file its own copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention_cpu_prefetch.hpp"
#include "clm/detail/attention_cpu.hpp"

namespace clm::detail {
namespace {

constexpr int kDecodeBlock = 64;  // tokens per block

// The q heads of a kv head in sub-groups of 8, 4, 2, 1 (a group of 6 is 4 + 2).
inline int subgroup(int left) { return left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1; }

template <KvDType DT>
void decode_blocks(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  const int dim = kv.head_dim;
  const std::size_t d = static_cast<std::size_t>(dim);
  const int heads = kv.kv_heads;
  const int group = shape.group;
  const std::size_t hq_d = static_cast<std::size_t>(shape.num_q_heads) * d;
  float* qs = scratch_floats(0, hq_d);
  // Scores: the sub-group of SG q heads from hq0 owns [hq0 * 64, (hq0 + SG) * 64), as [t][g].
  float* s = scratch_floats(1, static_cast<std::size_t>(shape.num_q_heads) * kDecodeBlock + kDecodeDots);
  load_q<DT>(qs, chunk.q, hq_d, shape.scale);
  to_block_layout<DT>(chunk.acc, hq_d);  // (zeros, or the state of an earlier call)

  // Tokens per step of phase A: kDecodeDots / (the smallest sub-group), so that
  // every sub-group keeps kDecodeDots dot products in flight. 64 is a multiple of it.
  int min_sg = 8;
  for (int g0 = 0; g0 < group; g0 += subgroup(group - g0)) min_sg = subgroup(group - g0);
  const int step = kDecodeDots / min_sg;

  const char* rows[kDecodeBlock];
  const char* krow[kDecodeDots];
  const char* vrow[kDecodeBlock];
  PrefetchStream pf(kv, chunk.pages, chunk.begin, chunk.end, kDecodeBlock);
  const auto head_bytes = static_cast<std::int64_t>(kv.head_bytes);
  for (std::int64_t b = chunk.begin; b < chunk.end; b += kDecodeBlock) {
    const int nt = static_cast<int>(std::min<std::int64_t>(kDecodeBlock, chunk.end - b));
    const int padded = (nt + step - 1) / step * step;
    for (int i = 0; i < nt; ++i) rows[i] = kv.token_row(chunk.pages, b + i);

    // (A) in address order: `step` token rows (every head) at a time; rows
    // past the end of the block stand in as its last row, their scores dropped.
    for (int t = 0; t < padded; t += step) {
      const std::int64_t reading = std::min(step, nt - t) * head_bytes;
      for (int h = 0; h < heads; ++h) {
        pf.consume(reading);  // this step's K of head h, with as many lines sent ahead
        pf.catch_up();
        const std::size_t off = static_cast<std::size_t>(h) * kv.head_bytes;
        for (int i = 0; i < step; ++i) krow[i] = rows[std::min(t + i, nt - 1)] + off;
        for (int g0 = 0; g0 < group;) {
          const int sg = subgroup(group - g0);
          const std::size_t hq0 =
              static_cast<std::size_t>(h) * static_cast<std::size_t>(group) + static_cast<std::size_t>(g0);
          const float* q = qs + hq0 * d;
          float* sc = s + hq0 * kDecodeBlock + static_cast<std::size_t>(t * sg);
          switch (sg) {
            case 8:
              qk_group<DT, 8>(q, krow, step, dim, sc);
              break;
            case 4:
              qk_group<DT, 4>(q, krow, step, dim, sc);
              break;
            case 2:
              qk_group<DT, 2>(q, krow, step, dim, sc);
              break;
            default:
              qk_group<DT, 1>(q, krow, step, dim, sc);
              break;
          }
          g0 += sg;
        }
      }
    }

    // (B, C) per kv head and sub-group: softmax update, then P V, which paces
    // the stream by the V it reads, kPaceRows at a time (a second sub-group's
    // pass over the same rows finds the stream at its limit).
    for (int h = 0; h < heads; ++h) {
      const std::size_t off = static_cast<std::size_t>(h) * kv.head_bytes + kv.v_offset;
      for (int i = 0; i < nt; ++i) vrow[i] = rows[i] + off;
      pf.consume(nt * head_bytes);
      for (int g0 = 0; g0 < group;) {
        const int sg = subgroup(group - g0);
        const std::size_t hq0 =
            static_cast<std::size_t>(h) * static_cast<std::size_t>(group) + static_cast<std::size_t>(g0);
        float* sc = s + hq0 * kDecodeBlock;
        float* acc = chunk.acc + hq0 * d;
        float* m = chunk.m + hq0;
        float* l = chunk.l + hq0;
        switch (sg) {
          case 8:
            softmax_pv<DT, 8>(sc, nt, vrow, dim, acc, m, l, pf);
            break;
          case 4:
            softmax_pv<DT, 4>(sc, nt, vrow, dim, acc, m, l, pf);
            break;
          case 2:
            softmax_pv<DT, 2>(sc, nt, vrow, dim, acc, m, l, pf);
            break;
          default:
            softmax_pv<DT, 1>(sc, nt, vrow, dim, acc, m, l, pf);
            break;
        }
        g0 += sg;
      }
      pf.catch_up();
    }
  }
  from_block_layout<DT>(chunk.acc, hq_d);
}

// The entry point: the walk for the pool's dtype.
inline void decode_blocks_for(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { decode_blocks<DT>(kv, shape, chunk); });
}

}  // namespace
}  // namespace clm::detail
