// cuda/model/clm_kernels.cuh: the device code of the CLM model side (clm/device/cuda_clm.hpp):
// the SRC head's masked mean and its fused finish (bias + GELU + dot with w2 +
// b2 + sigmoid), and the snapshot adapter's add. Compiled by nvcc in
// cuda/model/clm_kernels.cu and by the host compiler over the CPU emulator in
// tests/gpu/emulated_clm_launch.cpp (as kernels.cuh; see kernel_common.cuh).
// The GEMMs between them are cuBLAS's. Every index used here was checked on the
// host (cuda_clm.cpp).
#pragma once

#include "kernels/kernel_common.cuh"
#include "model/clm_args.hpp"

// ---- what these kernels need beyond kernel_common.cuh -----------------------------
#if defined(__CUDACC__)
namespace clm::cuda::detail {
CLM_DEVICE std::uint32_t clm_float_bits(float x) { return __float_as_uint(x); }
CLM_DEVICE std::uint32_t clm_atomic_add(std::uint32_t* p, std::uint32_t v) { return atomicAdd(p, v); }
CLM_DEVICE void clm_atomic_min(std::int32_t* p, std::int32_t v) { atomicMin(p, v); }
CLM_DEVICE void clm_atomic_or(std::int32_t* p, std::int32_t v) { atomicOr(p, v); }
CLM_DEVICE void clm_fence() { __threadfence(); }
// Loads that bypass L1: data other blocks wrote during this kernel.
CLM_DEVICE float clm_load_cg(const float* p) { return __ldcg(p); }
CLM_DEVICE std::int32_t clm_load_cg(const std::int32_t* p) { return __ldcg(reinterpret_cast<const int*>(p)); }
}  // namespace clm::cuda::detail
#else  // CPU emulation: blocks run one at a time, fibers switch only at barriers
namespace clm::cuda::detail {
inline std::uint32_t clm_float_bits(float x) { return std::bit_cast<std::uint32_t>(x); }
inline std::uint32_t clm_atomic_add(std::uint32_t* p, std::uint32_t v) {
  const std::uint32_t old = *p;
  *p = old + v;
  return old;
}
inline void clm_atomic_min(std::int32_t* p, std::int32_t v) { *p = *p < v ? *p : v; }
inline void clm_atomic_or(std::int32_t* p, std::int32_t v) { *p |= v; }
inline void clm_fence() {}
inline float clm_load_cg(const float* p) { return *p; }
inline std::int32_t clm_load_cg(const std::int32_t* p) { return *p; }
}  // namespace clm::cuda::detail
#endif

namespace clm::cuda::detail {

CLM_DEVICE bool clm_finite(float x) { return (clm_float_bits(x) & 0x7f800000u) != 0x7f800000u; }

CLM_DEVICE void unpack_one(KvBF16, std::uint32_t u, float* f) { f[0] = as_float(u << 16); }
CLM_DEVICE void unpack_one(KvF16, std::uint32_t u, float* f) { f[0] = f16x2_to_float2(u).x; }
CLM_DEVICE void unpack_one(KvF32, std::uint32_t u, float* f) { f[0] = as_float(u); }

// V consecutive elements of a row as f32: V == K::kVec is one 16-byte load
// (16-byte aligned), V == 1 one element (element aligned).
template <class K, int V>
CLM_DEVICE void load_chunk(const unsigned char* p, float* f) {
  if constexpr (V == K::kVec) {
    unpack(K{}, load16(p), f);
  } else {
    static_assert(V == 1);
    if constexpr (K::kBytes == 4) {
      f[0] = *reinterpret_cast<const float*>(p);
    } else {
      const std::uint32_t u = *reinterpret_cast<const std::uint16_t*>(p);
      unpack_one(K{}, u, f);
    }
  }
}

CLM_DEVICE std::uint32_t pack2(KvF16, float a, float b) {
  return static_cast<std::uint32_t>(float_to_f16_bits(a)) | (static_cast<std::uint32_t>(float_to_f16_bits(b)) << 16);
}
CLM_DEVICE std::uint32_t pack2(KvBF16, float a, float b) {
  return static_cast<std::uint32_t>(float_to_bf16_bits(a)) | (static_cast<std::uint32_t>(float_to_bf16_bits(b)) << 16);
}

// Stores V floats converted to K (round to nearest even), as load_chunk reads them.
template <class K, int V>
CLM_DEVICE void store_chunk(unsigned char* p, const float* f) {
  if constexpr (V == K::kVec) {
    U4 u;
    if constexpr (K::kBytes == 4) {
      u = U4{clm_float_bits(f[0]), clm_float_bits(f[1]), clm_float_bits(f[2]), clm_float_bits(f[3])};
    } else {
      u = U4{pack2(K{}, f[0], f[1]), pack2(K{}, f[2], f[3]), pack2(K{}, f[4], f[5]), pack2(K{}, f[6], f[7])};
    }
    store16(p, u);
  } else {
    static_assert(V == 1);
    store_elem(K{}, p, 0, f[0]);
  }
}

// Is `id` in the sorted list? (Every thread of a block searches the same id:
// the loads are broadcasts.)
CLM_DEVICE bool is_special_id(const std::int32_t* special, int n, std::int32_t id) {
  int lo = 0;
  int hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const std::int32_t v = special[mid];
    if (v == id) return true;
    if (v < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return false;
}

// ============================================================================
// Masked mean: grid = (items, col_tiles), block = kMeanThreads.
// Thread `tid` of column tile y owns the V columns starting at
// (y * kMeanThreads + tid) * V, and walks the item's tokens: every row is read
// (so that a NaN/Inf at a special position is caught too, as on the CPU), rows
// whose token id is special are not summed. Every thread counts the
// non-special tokens itself (same ids, same answer: no reduction needed).
// A whole sequence writes its mean; the parts of a split sequence write
// partial sums and counts, and the last part to finish (a counter per
// sequence and column tile) adds them up in part order, so the result does not
// depend on the order blocks run in.
// ============================================================================
template <class K, int V>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kMeanThreads) masked_mean_kernel(const MaskedMeanArgs a) {
  CLM_SHARED int s_last;
  const int tid = static_cast<int>(tid_x());
  const int tile = static_cast<int>(bid_y());
  const int item_index = static_cast<int>(bid_x());
  const int c0 = (tile * kMeanThreads + tid) * V;
  const bool active = c0 < a.cols;  // V divides cols (host)
  MeanItem it;
  if (a.items != nullptr) {
    it = a.items[item_index];
  } else {
    it = MeanItem{item_index, a.indptr[item_index], a.indptr[item_index + 1], -1};
  }

  float acc[V];
  CLM_UNROLL
  for (int e = 0; e < V; ++e) acc[e] = 0.0f;
  int count = 0;
  int bad_token = -1;
  const unsigned char* col = a.x + static_cast<std::size_t>(c0) * K::kBytes;
  // Tokens in groups of kMeanGroup: the ids are classified first, then the
  // group's row loads are issued together (independent loads in flight).
  constexpr int kMeanGroup = 4;
  for (int t0 = it.tok_begin; t0 < it.tok_end; t0 += kMeanGroup) {
    bool special[kMeanGroup];
    CLM_UNROLL
    for (int g = 0; g < kMeanGroup; ++g) {
      special[g] = t0 + g < it.tok_end ? is_special_id(a.special, a.num_special, a.token_ids[t0 + g]) : true;
      count += special[g] || t0 + g >= it.tok_end ? 0 : 1;
    }
    if (active) {
      float f[kMeanGroup][V];
      CLM_UNROLL
      for (int g = 0; g < kMeanGroup; ++g) {
        if (t0 + g < it.tok_end) {
          load_chunk<K, V>(col + static_cast<std::size_t>(t0 + g) * a.row_bytes, f[g]);
        } else {
          CLM_UNROLL
          for (int e = 0; e < V; ++e) f[g][e] = 0.0f;
        }
      }
      CLM_UNROLL
      for (int g = 0; g < kMeanGroup; ++g) {
        bool finite = true;
        CLM_UNROLL
        for (int e = 0; e < V; ++e) finite = finite && clm_finite(f[g][e]);
        if (!finite && bad_token < 0) bad_token = t0 + g;
        if (!special[g]) {
          CLM_UNROLL
          for (int e = 0; e < V; ++e) acc[e] += f[g][e];
        }
      }
    }
  }
  if (bad_token >= 0) {
    clm_atomic_min(&a.rec->nonfinite_token, bad_token);
    clm_atomic_min(&a.rec->nonfinite_seq, it.seq);
    clm_atomic_or(&a.rec->error, kErrNonFinite);
  }

  float* mean_row = a.means + static_cast<std::size_t>(it.seq) * a.cols + c0;
  if (it.split < 0) {
    if (active) {
      const float n = count > 0 ? static_cast<float>(count) : 1.0f;
      CLM_UNROLL
      for (int e = 0; e < V; ++e) mean_row[e] = acc[e] / n;  // 0 for an all-special sequence (flagged below)
    }
    if (count == 0 && tid == 0 && tile == 0) {
      clm_atomic_min(&a.rec->empty_seq, it.seq);
      clm_atomic_or(&a.rec->error, kErrEmpty);
    }
    return;
  }

  // ---- a part of a split sequence: partial sum, then the last part combines
  if (active) {
    float* part = a.partial_sums + static_cast<std::size_t>(item_index) * a.cols + c0;
    CLM_UNROLL
    for (int e = 0; e < V; ++e) part[e] = acc[e];
  }
  if (tid == 0) a.partial_counts[static_cast<std::size_t>(item_index) * a.col_tiles + tile] = count;
  clm_fence();  // this thread's partials are visible device-wide before the block is counted
  block_sync();
  const MeanSplit split = a.splits[it.split];
  if (tid == 0) {
    const std::uint32_t done = clm_atomic_add(&a.counters[static_cast<std::size_t>(it.split) * a.col_tiles + tile], 1u);
    s_last = done == static_cast<std::uint32_t>(split.parts - 1) ? 1 : 0;
  }
  block_sync();
  if (s_last == 0) return;  // block-uniform
  clm_fence();
  int total = 0;
  for (int p = 0; p < split.parts; ++p) {
    total += clm_load_cg(a.partial_counts + static_cast<std::size_t>(split.first_item + p) * a.col_tiles + tile);
  }
  if (active) {
    float sum[V];
    CLM_UNROLL
    for (int e = 0; e < V; ++e) sum[e] = 0.0f;
    for (int p = 0; p < split.parts; ++p) {
      const float* part = a.partial_sums + static_cast<std::size_t>(split.first_item + p) * a.cols + c0;
      CLM_UNROLL
      for (int e = 0; e < V; ++e) sum[e] += clm_load_cg(part + e);
    }
    const float n = total > 0 ? static_cast<float>(total) : 1.0f;
    CLM_UNROLL
    for (int e = 0; e < V; ++e) mean_row[e] = sum[e] / n;
  }
  if (total == 0 && tid == 0 && tile == 0) {
    clm_atomic_min(&a.rec->empty_seq, it.seq);
    clm_atomic_or(&a.rec->error, kErrEmpty);
  }
}

// ============================================================================
// Running sums: grid = (batch, col_tiles), block = kMeanThreads, thread `tid`
// of tile y owns column y * kMeanThreads + tid. The sum of a column runs over
// the sequence's rows in order, in f64, and the mean is sum * (1 / n) rounded
// to f32: the operations of SrcTracker::step on the CPU, in the same order, so
// the means match it bit for bit. Every row is checked for NaN/Inf, special
// ones too. Decode steps bring one row per sequence, so a block walks few.
// ============================================================================
template <class K>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kMeanThreads) running_sum_kernel(const RunningSumArgs a) {
  const int tid = static_cast<int>(tid_x());
  const int b = static_cast<int>(bid_x());
  const int c = static_cast<int>(bid_y()) * kMeanThreads + tid;
  const bool active = c < a.cols;
  const int begin = a.indptr[b];
  const int end = a.indptr[b + 1];
  const SumRows rows = a.rows[b];
  const std::int32_t read_row = rows.read;
  double acc = 0.0;
  if (active && read_row >= 0) acc = a.sums[static_cast<std::size_t>(read_row) * a.cols + c];
  int count = 0;
  int bad_token = -1;
  const unsigned char* col = a.x + static_cast<std::size_t>(c) * K::kBytes;
  for (int t = begin; t < end; ++t) {
    const bool special = is_special_id(a.special, a.num_special, a.token_ids[t]);
    count += special ? 0 : 1;
    if (!active) continue;
    float f[1];
    load_chunk<K, 1>(col + static_cast<std::size_t>(t) * a.row_bytes, f);
    if (!clm_finite(f[0]) && bad_token < 0) bad_token = t;
    if (!special) acc += static_cast<double>(f[0]);
  }
  if (bad_token >= 0) {
    clm_atomic_min(&a.rec->nonfinite_token, bad_token);
    clm_atomic_min(&a.rec->nonfinite_seq, b);
    clm_atomic_or(&a.rec->error, kErrNonFinite);
  }
  if (active) {
    a.sums[static_cast<std::size_t>(rows.write) * a.cols + c] = acc;
    const std::int64_t n = a.counts[b] + count;
    const double inv = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
    a.means[static_cast<std::size_t>(b) * a.cols + c] = static_cast<float>(acc * inv);
  }
  if (tid == 0 && bid_y() == 0) a.added[b] = count;
}

// ---- GELU and sigmoid, as lib/model/src_head.cpp computes them ---------------------------
CLM_DEVICE float gelu_tanh_f(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
CLM_DEVICE float gelu_erf_f(float x) {
  constexpr float inv_sqrt2 = 0.7071067811865476f;
  return 0.5f * x * (1.0f + erff(x * inv_sqrt2));
}
CLM_DEVICE float sigmoid_f(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// ============================================================================
// Finish: grid = (batch), block = kHeadThreads. Block b computes
// logit_b = sum_j GELU(z[b][j] + b1[j]) * w2[j] + b2 (threads stride over j,
// then shuffles within warps and shared memory across them, in a fixed order)
// and flags a non-finite one. The last block to finish (a counter in the call's
// record) writes every sigmoid(logit) to `scores` when the call found no error
// (mean kernel included), and otherwise writes none and, for score_async,
// merges the call's record into the sticky one.
// ============================================================================
template <int kGeluErf>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kHeadThreads) head_finish_kernel(const HeadFinishArgs a) {
  constexpr int kWarps = kHeadThreads / 32;
  CLM_SHARED float s_red[kWarps];
  CLM_SHARED int s_last;
  const int tid = static_cast<int>(tid_x());
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int b = static_cast<int>(bid_x());
  const float* zrow = a.z + static_cast<std::size_t>(b) * a.inner;
  float acc = 0.0f;
  for (int j = tid; j < a.inner; j += kHeadThreads) {
    const float x = zrow[j] + a.b1[j];
    float g;
    if constexpr (kGeluErf != 0) {
      g = gelu_erf_f(x);
    } else {
      g = gelu_tanh_f(x);
    }
    acc = fmaf(g, a.w2[j], acc);
  }
  for (int o = 16; o > 0; o >>= 1) acc += shfl_xor(acc, o);
  if (lane == 0) s_red[warp] = acc;
  block_sync();
  if (tid == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += s_red[w];
    const float logit = sum + a.b2;
    a.logits[b] = logit;
    if (!clm_finite(logit)) {
      clm_atomic_min(&a.rec->logit_seq, b);
      clm_atomic_or(&a.rec->error, kErrLogit);
    }
    clm_fence();
    const std::uint32_t done = clm_atomic_add(&a.rec->blocks_done, 1u);
    s_last = done == static_cast<std::uint32_t>(a.batch - 1) ? 1 : 0;
  }
  block_sync();
  if (s_last == 0) return;  // block-uniform
  clm_fence();
  const std::int32_t error = clm_load_cg(&a.rec->error);
  if (error == 0) {
    for (int i = tid; i < a.batch; i += kHeadThreads) a.scores[i] = sigmoid_f(clm_load_cg(a.logits + i));
    return;
  }
  if (tid == 0 && a.accumulate != 0) {
    ClmRecord* s = a.sticky;
    const ClmRecord r{error,
                      clm_load_cg(&a.rec->nonfinite_token),
                      clm_load_cg(&a.rec->nonfinite_seq),
                      clm_load_cg(&a.rec->empty_seq),
                      clm_load_cg(&a.rec->logit_seq),
                      0u,
                      0,
                      0};
    if (s->error == 0) {  // the first failed call since the host last read the record
      s->error = r.error;
      s->nonfinite_token = r.nonfinite_token;
      s->nonfinite_seq = r.nonfinite_seq;
      s->empty_seq = r.empty_seq;
      s->logit_seq = r.logit_seq;
    }
    s->calls_failed += 1;
  }
}

// ============================================================================
// Adapter delta check (after prepare's GEMM): grid = (batch), block =
// kAddThreads. A non-finite delta + bias of sequence b (a NaN/Inf snapshot, or
// W s overflowing f32) sets kErrDelta and min(nonfinite_seq, b); the adds of
// this prepare then add nothing, so the hidden states are never half-changed.
// ============================================================================
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kAddThreads) adapter_check_kernel(const AdapterCheckArgs a) {
  const int b = static_cast<int>(bid_x());
  const float* drow = a.delta + static_cast<std::size_t>(b) * a.cols;
  bool finite = true;
  for (int c = static_cast<int>(tid_x()); c < a.cols; c += kAddThreads)
    finite = finite && clm_finite(drow[c] + a.bias[c]);
  if (!finite) {
    clm_atomic_min(&a.rec->nonfinite_seq, b);
    clm_atomic_or(&a.rec->error, kErrDelta);
  }
}

// ============================================================================
// Adapter add: grid = (items, col_tiles), block = kAddThreads. Thread `tid` of
// column tile y owns V columns; it loads delta + bias for them once, then adds
// them to each of the item's rows (at most kAddRowsPerItem rows of one
// sequence), rounding to the view's dtype. Nothing at all when the prepare's
// check refused the deltas.
// ============================================================================
template <class K, int V>
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kAddThreads) adapter_add_kernel(const AdapterAddArgs a) {
  if (*a.refused != 0) return;  // grid-uniform
  const AddItem it = a.items[bid_x()];
  const int c0 = (static_cast<int>(bid_y()) * kAddThreads + static_cast<int>(tid_x())) * V;
  if (c0 >= a.cols) return;
  float d[V];
  const float* drow = a.delta + static_cast<std::size_t>(it.seq) * a.cols + c0;
  CLM_UNROLL
  for (int e = 0; e < V; ++e) d[e] = drow[e] + a.bias[c0 + e];
  unsigned char* col = a.x + static_cast<std::size_t>(c0) * K::kBytes;
  for (int r = it.row_begin; r < it.row_end; ++r) {
    unsigned char* p = col + static_cast<std::size_t>(r) * a.row_bytes;
    float f[V];
    load_chunk<K, V>(p, f);
    CLM_UNROLL
    for (int e = 0; e < V; ++e) f[e] += d[e];
    store_chunk<K, V>(p, f);
  }
}

// ---- dispatch: f receives the kernel instance; -1 when none matches -----------
using MaskedMeanKernel = void (*)(MaskedMeanArgs);
using HeadFinishKernel = void (*)(HeadFinishArgs);
using RunningSumKernel = void (*)(RunningSumArgs);
using AdapterAddKernel = void (*)(AdapterAddArgs);
using AdapterCheckKernel = void (*)(AdapterCheckArgs);

template <class K, class F>
int masked_mean_by_vec(bool vec, F& f) {
  return vec ? f(static_cast<MaskedMeanKernel>(&masked_mean_kernel<K, K::kVec>))
             : f(static_cast<MaskedMeanKernel>(&masked_mean_kernel<K, 1>));
}
template <class F>
int with_masked_mean_kernel(int dtype, bool vec, F&& f) {
  switch (dtype) {
    case kF32:
      return masked_mean_by_vec<KvF32>(vec, f);
    case kF16:
      return masked_mean_by_vec<KvF16>(vec, f);
    case kBF16:
      return masked_mean_by_vec<KvBF16>(vec, f);
    default:
      return -1;
  }
}
template <class F>
int with_running_sum_kernel(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      return f(static_cast<RunningSumKernel>(&running_sum_kernel<KvF32>));
    case kF16:
      return f(static_cast<RunningSumKernel>(&running_sum_kernel<KvF16>));
    case kBF16:
      return f(static_cast<RunningSumKernel>(&running_sum_kernel<KvBF16>));
    default:
      return -1;
  }
}
template <class F>
int with_head_finish_kernel(int gelu_erf, F&& f) {
  return gelu_erf ? f(static_cast<HeadFinishKernel>(&head_finish_kernel<1>))
                  : f(static_cast<HeadFinishKernel>(&head_finish_kernel<0>));
}
template <class K, class F>
int adapter_add_by_vec(bool vec, F& f) {
  return vec ? f(static_cast<AdapterAddKernel>(&adapter_add_kernel<K, K::kVec>))
             : f(static_cast<AdapterAddKernel>(&adapter_add_kernel<K, 1>));
}
template <class F>
int with_adapter_add_kernel(int dtype, bool vec, F&& f) {
  switch (dtype) {
    case kF32:
      return adapter_add_by_vec<KvF32>(vec, f);
    case kF16:
      return adapter_add_by_vec<KvF16>(vec, f);
    case kBF16:
      return adapter_add_by_vec<KvBF16>(vec, f);
    default:
      return -1;
  }
}

}  // namespace clm::cuda::detail
