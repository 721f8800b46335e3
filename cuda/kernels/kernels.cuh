// cuda/kernels/kernels.cuh: the device code of clmcache_cuda. Compiled by nvcc in
// cuda/kernels/kernels.cu, and by the host compiler over the CPU emulator in
// tests/gpu/test_cuda_emulated.cpp (see kernel_common.cuh). Host validation
// and planning are in plan.cpp; every index used here was checked there.
//
// Layout reminders (paged_kv_pool.hpp): page p at base + p*page_bytes; the
// args' `kv` already points at the layer; K row (token slot t, kv head h) at
// + (t*H + h)*D*E; V block at + v_offset.
#pragma once

#include "kernels/kernel_common.cuh"

namespace clm::cuda::detail {

// ============================================================================
// Decode, split-K ("flash-decoding").
//
// grid  = (items, kv_heads * head_blocks), block = 128 threads.
// A block takes one work item (a chunk of one sequence) and one kv head, and
// G of the q heads that share that kv head (GQA: each K/V row is loaded once
// for G heads). A token row of D elements is read by kLanes = D / kVec threads,
// 16 bytes each; the block's 128 / kLanes "token groups" walk the chunk in
// tiles of kTile tokens, each thread holding 8 tokens of a tile:
//   1. load K of its 8 tokens, dot with the G pre-scaled q fragments, reduce
//      the kLanes partial dots by shuffles -> s_p[g][token]; issue V loads;
//   2. sync; warp w computes, for heads g = w, w+4, ..., the tile max, the new
//      running max m, p = exp(s - m) (in place), l = l*alpha + sum p;
//   3. sync; every thread rescales its accumulators by alpha and adds p * V
//      for its 8 tokens; sync (s_p is reused by the next tile).
// At the end the per-thread accumulators are summed over the token groups
// (shuffles within a warp, then shared memory across the 4 warps) and the
// normalised partial output O/l and lse = m + log(l) are written for this item.
// decode_merge_kernel combines the items of a sequence by their lse.
// ============================================================================
template <class K, int D, int G>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kDecodeThreads) decode_chunk_kernel(const DecodeArgs a) {
  constexpr int kVec = K::kVec;
  constexpr int kLanes = D / kVec;                  // threads per token row
  constexpr int kGroups = kDecodeThreads / kLanes;  // token groups per block
  constexpr int kPer = kDecodeTokensPerThread;      // tokens per thread per tile
  constexpr int kTile = kGroups * kPer;
  static_assert(D % kVec == 0 && kLanes <= 32 && 32 % kLanes == 0, "a token row must fit in one warp");
  static_assert(kTile % 32 == 0, "the softmax step gives each lane whole tile columns");

  CLM_SHARED float s_p[G][kTile];  // scores, then probabilities
  CLM_SHARED float s_m[G];         // running max (natural log units, scale applied)
  CLM_SHARED float s_l[G];         // running sum of exp(s - m)
  CLM_SHARED float s_alpha[G];     // rescale factor of the current tile
  CLM_SHARED float s_red[kDecodeWarps][G][D];

  const int tid = static_cast<int>(tid_x());
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int tg = tid / kLanes;  // token group
  const int lc = tid % kLanes;  // this thread's 16 bytes of the row: elements [lc*kVec, lc*kVec + kVec)
  const int item_index = static_cast<int>(bid_x());
  const DecodeItem item = a.items[item_index];
  const int kvh = static_cast<int>(bid_y()) / a.head_blocks;
  const int g0 = (static_cast<int>(bid_y()) % a.head_blocks) * G;
  const int gcount = imin(G, a.group - g0);  // >= 1 by construction of head_blocks
  const int qh0 = kvh * a.group + g0;

  float qv[G][kVec];
  CLM_UNROLL
  for (int g = 0; g < G; ++g) {
    if (g < gcount) {
      const float* qrow =
          a.q + (static_cast<std::size_t>(item.seq) * a.num_q_heads + (qh0 + g)) * D + lc * kVec;
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) qv[g][e] = qrow[e] * a.scale;
    } else {
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) qv[g][e] = 0.0f;
    }
  }
  float acc[G][kVec];
  CLM_UNROLL
  for (int g = 0; g < G; ++g) {
    CLM_UNROLL
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
  }
  if (tid < G) {  // first read after the first block_sync below
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }

  const std::size_t row_bytes = static_cast<std::size_t>(a.kv_heads) * D * K::kBytes;
  const std::size_t head_off =
      static_cast<std::size_t>(kvh) * D * K::kBytes + static_cast<std::size_t>(lc) * 16;

  // Byte offsets of this thread's 16 bytes of K for tile t0 (0 for tokens past
  // the chunk, which are not loaded). The page-id loads of the next tile are
  // issued while the current one is in its softmax step.
  std::size_t off[kPer];
  const auto tile_offsets = [&](int tile0) {
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) {
      const int t = tile0 + tg + kGroups * i;  // < tok_end + kTile: no int overflow (kv_len <= kMaxKvLen)
      off[i] = 0;
      if (t < item.tok_end) {
        const int page_idx = a.page_shift >= 0 ? (t >> a.page_shift) : (t / a.page_size);
        const int row = t - page_idx * a.page_size;
        const std::int32_t page = a.indices[item.page_begin + page_idx];
        off[i] = static_cast<std::size_t>(page) * a.page_bytes + static_cast<std::size_t>(row) * row_bytes + head_off;
      }
    }
  };
  U4 kr[kPer];
  const auto load_k = [&](int tile0) {
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) {
      kr[i] = tile0 + tg + kGroups * i < item.tok_end ? load16_ro(a.kv + off[i]) : U4{0u, 0u, 0u, 0u};
    }
  };
  tile_offsets(item.tok_begin);
  load_k(item.tok_begin);

  for (int t0 = item.tok_begin; t0 < item.tok_end; t0 += kTile) {
    bool valid[kPer];
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) valid[i] = t0 + tg + kGroups * i < item.tok_end;
    // ---- 1. scores of this thread's tokens (K was loaded by the previous iteration)
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) {
      float kf[kVec];
      unpack(K{}, kr[i], kf);
      float s[G];
      CLM_UNROLL
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
        CLM_UNROLL
        for (int e = 0; e < kVec; ++e) dot = fmaf(qv[g][e], kf[e], dot);
        s[g] = dot;
      }
      CLM_UNROLL
      for (int g = 0; g < G; ++g) {
        CLM_UNROLL
        for (int o = kLanes / 2; o > 0; o >>= 1) s[g] += shfl_xor(s[g], o);
      }
      if (lc == 0) {
        CLM_UNROLL
        for (int g = 0; g < G; ++g) s_p[g][tg + kGroups * i] = valid[i] ? s[g] : -INFINITY;
      }
    }
    // V loads go out before the softmax step, to overlap with it.
    U4 vr[kPer];
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) vr[i] = valid[i] ? load16_ro(a.kv + a.v_offset + off[i]) : U4{0u, 0u, 0u, 0u};
    tile_offsets(t0 + kTile);  // off[] of this tile is dead once V is requested
    block_sync();

    // ---- 2. online softmax statistics, one warp per head ------------------------
    // Token t0 is valid, so every tile has a finite score and m_new is finite.
    for (int g = warp; g < G; g += kDecodeWarps) {  // warp-uniform loop
      float mx = -INFINITY;
      for (int j = lane; j < kTile; j += 32) mx = fmaxf(mx, s_p[g][j]);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, shfl_xor(mx, o));
      const float m_old = s_m[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int j = lane; j < kTile; j += 32) {
        const float p = expf(s_p[g][j] - m_new);  // exp(-inf) = 0 for padding
        s_p[g][j] = p;
        sum += p;
      }
      for (int o = 16; o > 0; o >>= 1) sum += shfl_xor(sum, o);
      if (lane == 0) {  // after the shuffles: every lane has read s_m[g]
        const float alpha = expf(m_old - m_new);  // 0 on the first tile
        s_alpha[g] = alpha;
        s_l[g] = s_l[g] * alpha + sum;
        s_m[g] = m_new;
      }
    }
    block_sync();

    // ---- 3. accumulate p * V ----------------------------------------------------
    CLM_UNROLL
    for (int g = 0; g < G; ++g) {
      const float alpha = s_alpha[g];
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) acc[g][e] *= alpha;
    }
    CLM_UNROLL
    for (int i = 0; i < kPer; ++i) {
      if (valid[i]) {
        float vf[kVec];
        unpack(K{}, vr[i], vf);
        CLM_UNROLL
        for (int g = 0; g < G; ++g) {
          const float p = s_p[g][tg + kGroups * i];
          CLM_UNROLL
          for (int e = 0; e < kVec; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
        }
      }
    }
    load_k(t0 + kTile);  // next tile's K goes out before the barrier
    block_sync();  // s_p and s_alpha are rewritten by the next tile
  }

  // ---- reduce the token groups, write the partial output and lse ---------------
  CLM_UNROLL
  for (int o = kLanes; o < 32; o <<= 1) {  // token groups within a warp
    CLM_UNROLL
    for (int g = 0; g < G; ++g) {
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) acc[g][e] += shfl_xor(acc[g][e], o);
    }
  }
  if (lane < kLanes) {  // the first token group of each warp; lc == lane here
    CLM_UNROLL
    for (int g = 0; g < G; ++g) {
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) s_red[warp][g][lc * kVec + e] = acc[g][e];
    }
  }
  block_sync();
  for (int idx = tid; idx < G * D; idx += kDecodeThreads) {
    const int g = idx / D;
    const int d = idx % D;
    if (g < gcount) {
      float sum = 0.0f;
      CLM_UNROLL
      for (int w = 0; w < kDecodeWarps; ++w) sum += s_red[w][g][d];
      const float l = s_l[g];
      const std::size_t o = static_cast<std::size_t>(item_index) * a.num_q_heads + (qh0 + g);
      a.partial_out[o * D + d] = l > 0.0f ? sum / l : 0.0f;
      if (d == 0) a.partial_lse[o] = l > 0.0f ? s_m[g] + logf(l) : -INFINITY;
    }
  }
}

// grid = (batch, num_q_heads), block = D threads: one output row per block.
template <int D>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(D) decode_merge_kernel(const MergeArgs a) {
  const int seq = static_cast<int>(bid_x());
  const int h = static_cast<int>(bid_y());
  const int d = static_cast<int>(tid_x());
  const int begin = a.merge_indptr[seq];
  const int end = a.merge_indptr[seq + 1];
  float m = -INFINITY;
  for (int i = begin; i < end; ++i) m = fmaxf(m, a.partial_lse[static_cast<std::size_t>(i) * a.num_q_heads + h]);
  float num = 0.0f;
  float den = 0.0f;
  if (m != -INFINITY) {
    for (int i = begin; i < end; ++i) {
      const std::size_t o = static_cast<std::size_t>(i) * a.num_q_heads + h;
      const float w = expf(a.partial_lse[o] - m);
      num = fmaf(w, a.partial_out[o * D + d], num);
      den += w;
    }
  }
  a.out[(static_cast<std::size_t>(seq) * a.num_q_heads + h) * D + d] = den > 0.0f ? num / den : 0.0f;
}

// ============================================================================
// Prefill: causal (optionally sliding-window) attention of the last n_new
// tokens of a sequence over its pages.
//
// grid = (ceil(n_new * group / 16), kv_heads), block = 128 threads.
// Rows are (token, q head of the group) pairs, token-major, so a block's 16
// rows share one kv head and a narrow range of positions. Per key tile of 32
// tokens the block converts K and V to f32 in shared memory (K rows padded to
// D+1 floats: lane j reads key j's column without bank conflicts). Each warp
// owns 4 rows: lane j scores key j, the warp reduces max and sum by shuffles,
// and lane l accumulates output dims l, l+32, ... with p_j broadcast by shuffles.
// Shared memory: 16*D + 32*(D+1) + 32*D floats (41 KiB at D = 128).
// ============================================================================
template <class K, int D>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kPrefillThreads) prefill_kernel(const PrefillArgs a) {
  constexpr int kVec = K::kVec;
  constexpr int kChunks = D / kVec;  // 16-byte chunks per row
  constexpr int kPerLane = D / 32;
  constexpr int R = kPrefillRowsPerWarp;
  static_assert(D % 32 == 0 && D % kVec == 0);

  CLM_SHARED float s_q[kPrefillRows][D];
  CLM_SHARED float s_k[kPrefillKeys][D + 1];
  CLM_SHARED float s_v[kPrefillKeys][D];

  const int tid = static_cast<int>(tid_x());
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int kvh = static_cast<int>(bid_y());
  const int rows_total = a.n_new * a.group;  // fits int32 (checked on the host)
  const int row0 = static_cast<int>(bid_x()) * kPrefillRows;
  const int base_pos = a.kv_len - a.n_new;  // position of new token 0

  for (int idx = tid; idx < kPrefillRows * D; idx += kPrefillThreads) {
    const int r = idx / D;
    const int d = idx % D;
    const int row = row0 + r;
    float x = 0.0f;
    if (row < rows_total) {
      const int i = row / a.group;
      const int g = row % a.group;
      x = a.q[(static_cast<std::size_t>(i) * a.num_q_heads + (kvh * a.group + g)) * D + d] * a.scale;
    }
    s_q[r][d] = x;
  }

  int pos[R];  // position of each of this warp's rows, -1 past the end
  CLM_UNROLL
  for (int r = 0; r < R; ++r) {
    const int row = row0 + warp * R + r;
    pos[r] = row < rows_total ? base_pos + row / a.group : -1;
  }
  const int last_row = imin(row0 + kPrefillRows, rows_total) - 1;
  const int hi = base_pos + last_row / a.group;  // last key any row of the block sees
  const int lo = a.window > 0 ? imax(0, base_pos + row0 / a.group - a.window + 1) : 0;

  float m[R];
  float l[R];
  float acc[R][kPerLane];
  CLM_UNROLL
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    CLM_UNROLL
    for (int k = 0; k < kPerLane; ++k) acc[r][k] = 0.0f;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(a.kv_heads) * D * K::kBytes;
  const std::size_t head_off = static_cast<std::size_t>(kvh) * D * K::kBytes;

  for (int j0 = lo; j0 <= hi; j0 += kPrefillKeys) {
    for (int u = tid; u < kPrefillKeys * kChunks; u += kPrefillThreads) {
      const int j = u / kChunks;
      const int c = u % kChunks;
      const int t = j0 + j;
      float kf[kVec];
      float vf[kVec];
      if (t <= hi) {
        const int page_idx = a.page_shift >= 0 ? (t >> a.page_shift) : (t / a.page_size);
        const int row = t - page_idx * a.page_size;
        const std::size_t off = static_cast<std::size_t>(a.pages[page_idx]) * a.page_bytes +
                                static_cast<std::size_t>(row) * row_bytes + head_off +
                                static_cast<std::size_t>(c) * 16;
        unpack(K{}, load16_ro(a.kv + off), kf);
        unpack(K{}, load16_ro(a.kv + a.v_offset + off), vf);
      } else {
        CLM_UNROLL
        for (int e = 0; e < kVec; ++e) kf[e] = vf[e] = 0.0f;
      }
      CLM_UNROLL
      for (int e = 0; e < kVec; ++e) {
        s_k[j][c * kVec + e] = kf[e];
        s_v[j][c * kVec + e] = vf[e];
      }
    }
    block_sync();  // also publishes s_q on the first tile

    CLM_UNROLL
    for (int r = 0; r < R; ++r) {
      if (pos[r] < 0) continue;  // warp-uniform
      const int t = j0 + lane;
      const float* qrow = s_q[warp * R + r];
      const float* krow = s_k[lane];
      float s = 0.0f;
      CLM_UNROLL
      for (int d = 0; d < D; ++d) s = fmaf(qrow[d], krow[d], s);
      const bool ok = t <= pos[r] && (a.window == 0 || t > pos[r] - a.window);
      s = ok ? s : -INFINITY;
      float mx = s;
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, shfl_xor(mx, o));
      if (mx == -INFINITY) continue;  // warp-uniform: no key of this tile is visible to the row
      const float m_new = fmaxf(m[r], mx);
      const float alpha = expf(m[r] - m_new);  // 0 while m[r] is -inf
      const float p = ok ? expf(s - m_new) : 0.0f;
      float psum = p;
      for (int o = 16; o > 0; o >>= 1) psum += shfl_xor(psum, o);
      l[r] = l[r] * alpha + psum;
      m[r] = m_new;
      CLM_UNROLL
      for (int k = 0; k < kPerLane; ++k) acc[r][k] *= alpha;
      for (int j = 0; j < kPrefillKeys; ++j) {
        const float pj = shfl_idx(p, j);
        CLM_UNROLL
        for (int k = 0; k < kPerLane; ++k) acc[r][k] = fmaf(pj, s_v[j][lane + 32 * k], acc[r][k]);
      }
    }
    block_sync();  // the next tile overwrites s_k / s_v
  }

  CLM_UNROLL
  for (int r = 0; r < R; ++r) {
    if (pos[r] < 0) continue;
    const int row = row0 + warp * R + r;
    const int i = row / a.group;
    const int g = row % a.group;
    float* orow = a.out + (static_cast<std::size_t>(i) * a.num_q_heads + (kvh * a.group + g)) * D;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    CLM_UNROLL
    for (int k = 0; k < kPerLane; ++k) orow[lane + 32 * k] = acc[r][k] * inv;
  }
}

// ============================================================================
// write_kv: grid = (n tokens), block = 128 threads; thread e converts and stores
// elements e, e+128, ... of the token's K and V rows.
// ============================================================================
template <class K>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kWriteKvThreads) write_kv_kernel(const WriteKvArgs a) {
  const std::size_t n = bid_x();
  const std::int64_t slot = a.slots[n];
  const std::int64_t page = slot / a.page_size;
  const std::int64_t row = slot - page * a.page_size;
  unsigned char* k_row = a.kv + static_cast<std::size_t>(page) * a.page_bytes +
                         static_cast<std::size_t>(row) * static_cast<std::size_t>(a.row_elems) * K::kBytes;
  unsigned char* v_row = k_row + a.v_offset;
  const float* k = a.k + n * static_cast<std::size_t>(a.row_elems);
  const float* v = a.v + n * static_cast<std::size_t>(a.row_elems);
  for (int e = static_cast<int>(tid_x()); e < a.row_elems; e += kWriteKvThreads) {
    store_elem(K{}, k_row, e, k[e]);
    store_elem(K{}, v_row, e, v[e]);
  }
}

// ============================================================================
// Page copy: grid = (pairs, ceil(units / 1024)), block = 256 threads; each
// thread moves up to 4 16-byte units (loads first, then stores, to keep
// several transactions in flight: the source may be host memory over PCIe).
// ============================================================================
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kCopyThreads) copy_pages_kernel(const CopyArgs a) {
  const std::size_t pair = bid_x();
  const std::int64_t src_page = a.pairs[2 * pair];
  const std::int64_t dst_page = a.pairs[2 * pair + 1];
  const unsigned char* src = a.src + static_cast<std::size_t>(src_page) * a.page_bytes;
  unsigned char* dst = a.dst + static_cast<std::size_t>(dst_page) * a.page_bytes;
  const std::uint64_t first = static_cast<std::uint64_t>(bid_y()) * kCopyUnitsPerBlock + tid_x();
  U4 r[kCopyUnroll];
  CLM_UNROLL
  for (int u = 0; u < kCopyUnroll; ++u) {
    const std::uint64_t unit = first + static_cast<std::uint64_t>(u) * kCopyThreads;
    r[u] = unit < a.units ? load16(src + unit * 16) : U4{0u, 0u, 0u, 0u};
  }
  CLM_UNROLL
  for (int u = 0; u < kCopyUnroll; ++u) {
    const std::uint64_t unit = first + static_cast<std::uint64_t>(u) * kCopyThreads;
    if (unit < a.units) store16(dst + unit * 16, r[u]);
  }
}

// ---- dispatch: f receives the kernel instance; -1 when none matches -----------
using DecodeKernel = void (*)(DecodeArgs);
using MergeKernel = void (*)(MergeArgs);
using PrefillKernel = void (*)(PrefillArgs);
using WriteKvKernel = void (*)(WriteKvArgs);

template <class K, int D, class F>
int decode_by_heads(int heads_per_block, F& f) {
  switch (heads_per_block) {
    case 1: return f(static_cast<DecodeKernel>(&decode_chunk_kernel<K, D, 1>));
    case 2: return f(static_cast<DecodeKernel>(&decode_chunk_kernel<K, D, 2>));
    case 4: return f(static_cast<DecodeKernel>(&decode_chunk_kernel<K, D, 4>));
    case 8: return f(static_cast<DecodeKernel>(&decode_chunk_kernel<K, D, 8>));
    default: return -1;
  }
}
template <class K, class F>
int decode_by_dim(int head_dim, int heads_per_block, F& f) {
  if (head_dim == 64) return decode_by_heads<K, 64>(heads_per_block, f);
  if (head_dim == 128) return decode_by_heads<K, 128>(heads_per_block, f);
  return -1;
}
template <class F>
int with_decode_kernel(int dtype, int head_dim, int heads_per_block, F&& f) {
  switch (dtype) {
    case kF32: return decode_by_dim<KvF32>(head_dim, heads_per_block, f);
    case kF16: return decode_by_dim<KvF16>(head_dim, heads_per_block, f);
    case kBF16: return decode_by_dim<KvBF16>(head_dim, heads_per_block, f);
    default: return -1;
  }
}
template <class F>
int with_merge_kernel(int head_dim, F&& f) {
  if (head_dim == 64) return f(static_cast<MergeKernel>(&decode_merge_kernel<64>));
  if (head_dim == 128) return f(static_cast<MergeKernel>(&decode_merge_kernel<128>));
  return -1;
}
template <class K, class F>
int prefill_by_dim(int head_dim, F& f) {
  if (head_dim == 64) return f(static_cast<PrefillKernel>(&prefill_kernel<K, 64>));
  if (head_dim == 128) return f(static_cast<PrefillKernel>(&prefill_kernel<K, 128>));
  return -1;
}
template <class F>
int with_prefill_kernel(int dtype, int head_dim, F&& f) {
  switch (dtype) {
    case kF32: return prefill_by_dim<KvF32>(head_dim, f);
    case kF16: return prefill_by_dim<KvF16>(head_dim, f);
    case kBF16: return prefill_by_dim<KvBF16>(head_dim, f);
    default: return -1;
  }
}
template <class F>
int with_write_kv_kernel(int dtype, F&& f) {
  switch (dtype) {
    case kF32: return f(static_cast<WriteKvKernel>(&write_kv_kernel<KvF32>));
    case kF16: return f(static_cast<WriteKvKernel>(&write_kv_kernel<KvF16>));
    case kBF16: return f(static_cast<WriteKvKernel>(&write_kv_kernel<KvBF16>));
    default: return -1;
  }
}

}  // namespace clm::cuda::detail
