// lib/kernels/attention_cpu_drivers.cpp: the CPU attention drivers
// (attention_cpu_drivers.hpp): they split a validated call into tasks (chunks
// of a decode, tiles of a prefill), run them on the thread pool
// (attention_cpu_threads.hpp) with the kernels of the ISA in use, and merge
// the results; nothing is written to `out` until nothing can fail. The
// switches of the decode's chunk size and the prefill's route
// (clm/detail/attention_cpu.hpp) are here too. See docs/kernels.md.
#include "attention_cpu_drivers.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "attention_cpu_threads.hpp"

namespace clm {
namespace detail {
namespace {

std::atomic<std::int32_t> g_decode_chunk{0};
std::atomic<int> g_prefill_route{0};  // a PrefillRoute

// The SIMD kernels' level for this layer: scalar when the ISA is missing or
// head_dim is not a multiple of 64.
CpuIsa simd_for(const KvLayer& kv) { return kv.head_dim % kAvx2HeadDimMultiple == 0 ? cpu_isa() : CpuIsa::scalar; }

// One ISA's kernels: the drivers below pick them here, and nowhere else.
struct IsaKernels {
  void (*decode_chunk)(const KvLayer&, const AttnShape&, const DecodeChunk&);
  void (*prefill_tile)(const KvLayer&, const AttnShape&, const PrefillTile&);
};
const IsaKernels& kernels_for(CpuIsa isa) {
  static constexpr IsaKernels kScalar{decode_chunk_scalar, prefill_tile_scalar};
  static constexpr IsaKernels kAvx2{decode_chunk_avx2, prefill_tile_avx2};
  static constexpr IsaKernels kAvx512{decode_chunk_avx512, prefill_tile_avx512};
  switch (isa) {
    case CpuIsa::avx512:
      return kAvx512;
    case CpuIsa::avx2:
      return kAvx2;
    case CpuIsa::scalar:
      break;
  }
  return kScalar;
}

// ---- decode driver ------------------------------------------------------------------

constexpr std::int64_t kMinChunk = 256;          // tokens: below this a split costs more than it gains
constexpr std::size_t kParallelBytes = 1 << 20;  // KV bytes below which one thread is faster

// 64-byte aligned floats (the kernels load their state with aligned loads).
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete (p, std::align_val_t{64}); }
};
using AlignedFloats = std::unique_ptr<float, AlignedDelete>;
AlignedFloats aligned_floats(std::size_t count) {  // throws std::bad_alloc
  return AlignedFloats(
      static_cast<float*>(::operator new (std::max<std::size_t>(count, 16) * sizeof(float), std::align_val_t{64})));
}

// The floats of one query's running state (acc [Hq][D], m [Hq], l [Hq]),
// rounded up to 64 bytes.
std::size_t decode_state_floats(const KvLayer& kv, const AttnShape& shape) {
  const std::size_t hq = static_cast<std::size_t>(shape.num_q_heads);
  return (hq * static_cast<std::size_t>(kv.head_dim) + 2 * hq + 15) / 16 * 16;
}

// out [seq][Hq][D] = attention of each sequence's query over its keys
// [begin, end) (begin < end); lse, when not null, [seq][Hq] = the log of the
// softmax denominator, max + log(sum exp(score - max)), for a caller that
// merges more keys in.
Status decode_impl(const KvLayer& kv, const AttnShape& shape, const float* q, const std::vector<Sequence>& seqs,
                   float* out, float* lse, int requested_threads, const char* what) {
  const std::size_t dim = static_cast<std::size_t>(kv.head_dim);
  const std::size_t hq = static_cast<std::size_t>(shape.num_q_heads);
  const std::size_t state = decode_state_floats(kv, shape);

  std::int64_t tokens = 0;
  for (const Sequence& s : seqs) tokens += s.end - s.begin;
  int threads = cpu_kernel_threads(requested_threads);
  if (static_cast<std::size_t>(tokens) * kv.row_bytes * 2 < kParallelBytes) threads = 1;

  std::int64_t chunk = g_decode_chunk.load(std::memory_order_relaxed);
  if (chunk <= 0) {
    // About 4 chunks per thread over the whole batch: long sequences are split
    // (flash-decoding), a batch of many short ones is not.
    chunk = threads == 1 ? std::numeric_limits<std::int64_t>::max()
                         : std::max<std::int64_t>(kMinChunk, (tokens + 4 * threads - 1) / (4 * threads));
  }

  // Each task is one chunk of one sequence, with a state (acc, m, l) of its own.
  struct Task {
    std::int32_t seq;
    std::int64_t begin, end;
  };
  std::vector<Task> tasks;
  std::vector<std::int64_t> first_task(seqs.size() + 1, 0);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const std::int64_t len = seqs[i].end - seqs[i].begin;
    const std::int64_t n = len > 0 ? 1 + (len - 1) / chunk : 0;
    first_task[i] = static_cast<std::int64_t>(tasks.size());
    for (std::int64_t c = 0; c < n; ++c) {
      const std::int64_t b = seqs[i].begin + c * chunk;
      tasks.push_back({static_cast<std::int32_t>(i), b, b + std::min(chunk, seqs[i].end - b)});
    }
  }
  first_task[seqs.size()] = static_cast<std::int64_t>(tasks.size());
  // Nothing is written to `out` until nothing can fail: the chunks' states are
  // taken here, the first pass (which may take the kernels' thread scratch)
  // writes only them, and the second, which allocates nothing, writes `out`.
  const AlignedFloats state_storage = aligned_floats(tasks.size() * state);
  float* const states = state_storage.get();

  const IsaKernels& kernels = kernels_for(simd_for(kv));
  auto run_chunk = [&](std::int64_t t) {
    const Task& task = tasks[static_cast<std::size_t>(t)];
    float* st = states + static_cast<std::size_t>(t) * state;
    DecodeChunk c;
    c.q = q + static_cast<std::size_t>(task.seq) * hq * dim;
    c.pages = seqs[static_cast<std::size_t>(task.seq)].pages;
    c.begin = task.begin;
    c.end = task.end;
    c.acc = st;
    c.m = st + hq * dim;
    c.l = c.m + hq;
    std::fill(c.acc, c.acc + hq * dim, 0.0f);
    std::fill(c.m, c.m + hq, kNegInf);
    std::fill(c.l, c.l + hq, 0.0f);
    kernels.decode_chunk(kv, shape, c);
  };
  if (!parallel_for(static_cast<std::int64_t>(tasks.size()), threads, run_chunk)) {
    return out_of_memory(fmt::format("{}: no memory for kernel scratch", what));
  }

  // Merge the chunks of each sequence by log-sum-exp (one chunk: acc / l):
  //   M = max_c m_c,  out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c.
  auto merge = [&](std::int64_t t) {
    const std::size_t i = static_cast<std::size_t>(t);
    const std::int64_t p0 = first_task[i];
    const std::int64_t p1 = first_task[i + 1];
    float* o = out + i * hq * dim;
    for (std::size_t h = 0; h < hq; ++h) {
      float mx = kNegInf;
      for (std::int64_t p = p0; p < p1; ++p) {
        mx = std::max(mx, states[static_cast<std::size_t>(p) * state + hq * dim + h]);
      }
      float denom = 0.0f;
      float* oh = o + h * dim;
      std::fill(oh, oh + dim, 0.0f);
      for (std::int64_t p = p0; p < p1; ++p) {
        const float* st = states + static_cast<std::size_t>(p) * state;
        const float w = std::exp(st[hq * dim + h] - mx);
        denom += w * st[hq * dim + hq + h];
        const float* acc = st + h * dim;
        for (std::size_t d = 0; d < dim; ++d) oh[d] += w * acc[d];
      }
      const float inv = 1.0f / denom;
      for (std::size_t d = 0; d < dim; ++d) oh[d] *= inv;
      if (lse != nullptr) lse[i * hq + h] = mx + std::log(denom);
    }
  };
  const int merge_threads = tasks.size() * state * sizeof(float) < kParallelBytes ? 1 : threads;
  if (!parallel_for(static_cast<std::int64_t>(seqs.size()), merge_threads, merge)) {
    return Status(StatusCode::internal, fmt::format("{}: the merge failed", what));  // it allocates nothing
  }
  return {};
}

}  // namespace

// The kernels report no error but memory; the API never throws.
Status decode(const KvLayer& kv, const AttnShape& shape, const float* q, const std::vector<Sequence>& seqs, float* out,
              int requested_threads, const char* what) {
  try {
    return decode_impl(kv, shape, q, seqs, out, nullptr, requested_threads, what);
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of host memory", what));
  }
}

// ---- prefill of a few new tokens ------------------------------------------------------------
//
// A few new tokens over a long cached prefix (a new turn's first tokens, a
// speculative draft to verify): the tile path would convert and pack the
// whole prefix for each tile of a handful of rows. Instead the keys every new
// token sees go through the decode, once, with the n_new * group q rows of a
// kv head as one group (each K/V row read once, split along the prefix over
// the threads); then each token's own few keys (the causal tail, and with a
// window the keys that only the earlier tokens still see) continue its
// softmax from there, with the same kernel.

// When that beats the tile path (docs/kernels.md, "Prefill of a few new
// tokens"): up to 8 q rows per kv head (n_new * group) always; up to 32 when
// the prefix's K/V is past a typical L3 (the tiles then wait on memory, the
// decode's prefetched pass does not); more rows run faster in the tiles'
// register blocks.
constexpr std::int64_t kFewPrefillRows = 8;
constexpr std::int64_t kFewPrefillRowsFromMemory = 32;
constexpr std::size_t kFewPrefillMemoryBytes = std::size_t{32} << 20;

// Whether paged_prefill_attention takes prefill_few: always for one new token
// (then a plain decode step); for more, a window (if any) that still leaves
// keys every new token sees, and the rows above (or what set_prefill_route
// forces).
bool prefill_few_applies(const KvLayer& kv, const AttnShape& shape, std::int32_t n_new, std::int64_t kv_len,
                         std::int32_t window) {
  if (n_new == 1) return true;  // a decode step: a long prefix split over the threads, whatever the route
  if (window > 0 && window < n_new) return false;
  switch (static_cast<PrefillRoute>(g_prefill_route.load(std::memory_order_relaxed))) {
    case PrefillRoute::tiles:
      return false;
    case PrefillRoute::decode:
      return true;
    case PrefillRoute::automatic:
      break;
  }
  const std::int64_t rows = static_cast<std::int64_t>(n_new) * shape.group;
  const std::int64_t keys = window > 0 ? std::min<std::int64_t>(window, kv_len) : kv_len;
  const std::size_t bytes = static_cast<std::size_t>(keys) * kv.row_bytes * 2;
  return rows <= kFewPrefillRows || (rows <= kFewPrefillRowsFromMemory && bytes >= kFewPrefillMemoryBytes);
}

namespace {

Status prefill_few_impl(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                        const std::int32_t* pages, std::int64_t kv_len, std::int32_t window, float* out, int threads,
                        const char* what) {
  const std::size_t dim = static_cast<std::size_t>(kv.head_dim);
  const std::size_t hq = static_cast<std::size_t>(shape.num_q_heads);
  const std::size_t group = static_cast<std::size_t>(shape.group);
  const std::size_t n = static_cast<std::size_t>(n_new);
  const std::int64_t first = kv_len - n_new;  // position of new token 0
  // New token i (position first + i) sees keys [begin(i), first + i + 1).
  auto begin_of = [&](std::int64_t i) {
    return window > 0 ? std::max<std::int64_t>(0, first + i + 1 - window) : std::int64_t{0};
  };
  const std::int64_t common_begin = begin_of(n_new - 1);  // the keys all of them see
  const std::int64_t common_end = first + 1;

  // The wide decode: q head (h, i, g) = new token i's q head h * group + g, so
  // that the decode's q head h' reads kv head h' / (n_new * group) = h.
  const AttnShape wide{static_cast<std::int32_t>(n * hq), static_cast<std::int32_t>(n * group), shape.scale};
  std::vector<float> q_wide(n * hq * dim), out_wide(n * hq * dim), lse(n * hq);
  auto wide_row = [&](std::size_t i, std::size_t head) {  // head: a q head of new token i
    return (head / group * n + i) * group + head % group;
  };
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t head = 0; head < hq; ++head) {
      std::memcpy(&q_wide[wide_row(i, head) * dim], q + (i * hq + head) * dim, dim * sizeof(float));
    }
  }
  const std::vector<Sequence> common{{pages, common_begin, common_end}};
  CLM_RETURN_IF_ERROR(decode_impl(kv, wide, q_wide.data(), common, out_wide.data(), lse.data(), threads, what));

  // Each token's state after the common keys, as the chunk kernels keep it:
  // m = lse, l = 1, acc = the normalised output (acc / l at m = lse).
  const std::size_t state = decode_state_floats(kv, shape);
  const AlignedFloats states = aligned_floats(n * state);
  const IsaKernels& kernels = kernels_for(simd_for(kv));
  for (std::size_t i = 0; i < n; ++i) {
    float* acc = states.get() + i * state;
    float* m = acc + hq * dim;
    float* l = m + hq;
    for (std::size_t head = 0; head < hq; ++head) {
      std::memcpy(acc + head * dim, &out_wide[wide_row(i, head) * dim], dim * sizeof(float));
      m[head] = lse[wide_row(i, head)];
      l[head] = 1.0f;
    }
    DecodeChunk c;
    c.q = q + i * hq * dim;
    c.pages = pages;
    c.acc = acc;
    c.m = m;
    c.l = l;
    const auto token = static_cast<std::int64_t>(i);
    for (const auto& [b, e] : {std::pair{begin_of(token), common_begin}, std::pair{common_end, first + token + 1}}) {
      if (b >= e) continue;
      c.begin = b;
      c.end = e;
      kernels.decode_chunk(kv, shape, c);
    }
  }
  // Nothing could fail past this point: only now is out written.
  for (std::size_t i = 0; i < n; ++i) {
    const float* acc = states.get() + i * state;
    const float* l = acc + hq * dim + hq;
    for (std::size_t head = 0; head < hq; ++head) {
      const float inv = 1.0f / l[head];
      float* o = out + (i * hq + head) * dim;
      for (std::size_t d = 0; d < dim; ++d) o[d] = acc[head * dim + d] * inv;
    }
  }
  return {};
}

}  // namespace

Status prefill_few(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                   const std::int32_t* pages, std::int64_t kv_len, std::int32_t window, float* out, int threads,
                   const char* what) {
  try {
    return prefill_few_impl(kv, shape, q, n_new, pages, kv_len, window, out, threads, what);
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of host memory", what));
  }
}

// ---- prefill in tiles -----------------------------------------------------------------------

Status prefill_tiles(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                     const std::int32_t* pages, std::int32_t kv_len, std::int32_t window, float* out,
                     int requested_threads, const char* what) {
  // Tasks: (kv head, tile of queries); a tile has ~128 rows (queries x group).
  // Every task converts and packs each block of keys it reads, so tiles are
  // split only until there are two tasks a thread: a few new rows over a
  // long cached prefix (equal work per tile) then pack the prefix once per
  // kv head and tile, not four times as often.
  int threads = cpu_kernel_threads(requested_threads);
  const std::int64_t span = window > 0 ? std::min(window, kv_len) : kv_len;
  const double flops = 4.0 * n_new * static_cast<double>(span) * shape.num_q_heads * kv.head_dim;
  if (flops < 4e6) threads = 1;
  const std::int32_t heads = kv.kv_heads;
  std::int32_t tile = std::clamp(128 / shape.group, 1, 128);
  while (tile > 8 && static_cast<std::int64_t>(heads) * ((n_new + tile - 1) / tile) < 2 * threads) tile /= 2;
  const std::int32_t tiles = (n_new + tile - 1) / tile;
  const IsaKernels& kernels = kernels_for(simd_for(kv));
  auto run_tile = [&](std::int64_t t) {
    // Later tiles see more keys: hand them out first.
    const std::int32_t index = tiles - 1 - static_cast<std::int32_t>(t / heads);
    PrefillTile pt;
    pt.q = q;
    pt.out = out;
    pt.pages = pages;
    pt.kv_len = kv_len;
    pt.n_new = n_new;
    pt.window = window;
    pt.kv_head = static_cast<std::int32_t>(t % heads);
    pt.q_begin = index * tile;
    pt.q_end = std::min(n_new, pt.q_begin + tile);
    kernels.prefill_tile(kv, shape, pt);
  };
  bool ok = false;
  try {
    ok = parallel_for(static_cast<std::int64_t>(tiles) * heads, threads, run_tile);
  } catch (const std::bad_alloc&) {
  }
  if (!ok) return out_of_memory(fmt::format("{}: no memory for kernel scratch", what));
  return {};
}

void set_decode_chunk_tokens(std::int32_t tokens) { g_decode_chunk.store(std::max(0, tokens)); }

void set_prefill_route(PrefillRoute route) { g_prefill_route.store(static_cast<int>(route)); }

}  // namespace detail
}  // namespace clm
