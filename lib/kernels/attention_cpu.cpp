// CPU attention and KV kernels over the paged pool (clm/kernels/attention.hpp).
//
// This file holds the entry points (validation first: nothing is read or
// written until every shape, page id, slot and head count has been checked),
// the drivers that split work into tasks, the thread pool that runs them, the
// ISA dispatch and the scalar kernels. The AVX2 kernels are in
// attention_cpu_avx2.cpp; see docs/kernels.md.
#include "clm/kernels/attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__unix__)
#include <unistd.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <fmt/format.h>

#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"

namespace clm {
namespace detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- threads --------------------------------------------------------------------

int hardware_threads() {
  static const int count = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      const int n = CPU_COUNT(&set);
      if (n > 0) return n;
    }
#endif
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
  }();
  return count;
}

// A fixed set of workers that run one parallel loop at a time; the calling
// thread takes part. A call that finds the pool busy (another host thread is
// in a kernel) runs its loop on its own thread rather than wait.
class ThreadPool {
 public:
  using Body = void (*)(void* context, std::int64_t task);

  static ThreadPool& instance() {
    static ThreadPool pool;
    return pool;
  }

  ~ThreadPool() {
    if (forked()) {  // the workers are the parent's: nothing to stop or join here
      new std::vector<std::thread>(std::move(workers_));  // never destroyed (joinable)
      return;
    }
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // Runs body(context, t) for every t in [0, tasks) on up to `threads`
  // threads. False if a task threw (the rest still ran).
  bool run(std::int64_t tasks, int threads, Body body, void* context) {
    if (tasks <= 0) return true;
    threads = static_cast<int>(std::min<std::int64_t>(threads, tasks));
    if (threads > 1 && forked()) threads = 1;  // a forked child has none of the workers
    std::unique_lock run_lock(run_mutex_, std::try_to_lock);
    if (threads > 1 && run_lock.owns_lock()) threads = 1 + ensure_workers(threads - 1);
    if (threads <= 1 || !run_lock.owns_lock()) {
      bool ok = true;
      for (std::int64_t t = 0; t < tasks; ++t) ok &= call(body, context, t);
      return ok;
    }
    {
      std::lock_guard lock(mutex_);
      body_ = body;
      context_ = context;
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      helpers_ = threads - 1;
      active_ = helpers_;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    return !failed_.load(std::memory_order_relaxed);
  }

 private:
  ThreadPool() = default;

  // True in a child forked after the workers started (they exist only in the
  // parent; its locks may be held). The child runs every loop on its own thread.
  // Reads no workers_: another thread may be adding workers (under run_mutex_).
  bool forked() const {
#if defined(__unix__)
    return started_.load(std::memory_order_acquire) && getpid() != owner_;
#else
    return false;
#endif
  }

  static bool call(Body body, void* context, std::int64_t task) {
    try {
      body(context, task);
      return true;
    } catch (...) {  // std::bad_alloc from scratch memory: reported as a Status
      return false;
    }
  }

  void work() {
    for (;;) {
      const std::int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= tasks_) return;
      if (!call(body_, context_, t)) failed_.store(true, std::memory_order_relaxed);
    }
  }

  // Starts workers up to `wanted` (or as many as the system gives); returns how many there are.
  int ensure_workers(int wanted) {
    wanted = std::min(wanted, hardware_threads() - 1);
    while (static_cast<int>(workers_.size()) < wanted) {
      try {
        const int index = static_cast<int>(workers_.size());
        workers_.emplace_back([this, index] { worker_loop(index); });
        started_.store(true, std::memory_order_release);
      } catch (...) {
        break;
      }
    }
    return std::min(wanted, static_cast<int>(workers_.size()));
  }

  void worker_loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= helpers_) continue;  // not needed for this loop
      }
      work();
      {
        std::lock_guard lock(mutex_);
        if (--active_ == 0) done_.notify_one();
      }
    }
  }

#if defined(__unix__)
  const pid_t owner_ = getpid();
#endif
  std::mutex run_mutex_;  // one loop at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;  // grown under run_mutex_
  std::atomic<bool> started_{false};  // workers_ is not empty
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  int helpers_ = 0;
  int active_ = 0;
  Body body_ = nullptr;
  void* context_ = nullptr;
  std::int64_t tasks_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<bool> failed_{false};
};

template <typename F>
bool parallel_for(std::int64_t tasks, int threads, F& f) {
  return ThreadPool::instance().run(
      tasks, threads, [](void* context, std::int64_t t) { (*static_cast<F*>(context))(t); }, &f);
}

// ---- per-thread scratch -----------------------------------------------------------

struct Scratch {
  static constexpr int kSlots = 8;
  float* data[kSlots] = {};
  std::size_t size[kSlots] = {};
  ~Scratch() {
    for (float* p : data) std::free(p);
  }
};
thread_local Scratch t_scratch;

// ---- dispatch ---------------------------------------------------------------------

std::atomic<int> g_isa{-1};
std::atomic<std::int32_t> g_decode_chunk{0};
std::atomic<int> g_prefill_route{0};  // a PrefillRoute

CpuIsa detect_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // F16C by CPUID (leaf 1, ecx bit 29): not every compiler's __builtin_cpu_supports
  // knows it. AVX2 implies the OS saves the YMM state F16C needs.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  if (avx2_kernels_built() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
    // (__builtin_cpu_supports also checks that the OS saves the YMM and ZMM state)
    if (avx512_kernels_built() && __builtin_cpu_supports("avx512f")) return CpuIsa::avx512;
    return CpuIsa::avx2;
  }
#endif
  return CpuIsa::scalar;
}

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

// ---- validation -------------------------------------------------------------------

Status check_view(const PagedKvView& kv, const char* what) {
  if (kv.memory == MemoryKind::device) {
    return unsupported(fmt::format("{}: the pool is in device memory; these are the CPU kernels", what));
  }
  if (kv.memory == MemoryKind::none) {
    return failed_precondition(fmt::format("{}: the pool keeps no KV bytes (MemoryKind::none)", what));
  }
  if (kv.memory != MemoryKind::host) return invalid_argument(fmt::format("{}: unknown memory kind", what));
  if (kv.dtype != KvDType::f32 && kv.dtype != KvDType::f16 && kv.dtype != KvDType::bf16) {
    return invalid_argument(fmt::format("{}: unknown KV dtype", what));
  }
  if (kv.base == nullptr) return invalid_argument(fmt::format("{}: the view has no base pointer", what));
  if (kv.num_pages <= 0 || kv.page_size <= 0 || kv.num_layers <= 0 || kv.kv_heads <= 0 || kv.head_dim <= 0) {
    return invalid_argument(fmt::format(
        "{}: num_pages, page_size, num_layers, kv_heads and head_dim must be > 0, got {}, {}, {}, {}, {}", what,
        kv.num_pages, kv.page_size, kv.num_layers, kv.kv_heads, kv.head_dim));
  }
  // The byte sizes must be those of the layout (paged_kv_pool.hpp), without overflow.
  std::size_t layer = 0, page = 0, total = 0;
  const bool overflow =
      __builtin_mul_overflow(static_cast<std::size_t>(kv.page_size) * static_cast<std::size_t>(kv.kv_heads),
                             static_cast<std::size_t>(kv.head_dim) * 2 * kv_dtype_bytes(kv.dtype), &layer) ||
      __builtin_mul_overflow(layer, static_cast<std::size_t>(kv.num_layers), &page) ||
      __builtin_mul_overflow(page, static_cast<std::size_t>(kv.num_pages), &total) ||
      total > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
  if (overflow) return invalid_argument(fmt::format("{}: the pool's size overflows", what));
  if (kv.layer_bytes != layer || kv.page_bytes != page) {
    return invalid_argument(fmt::format("{}: layer_bytes {} / page_bytes {} do not match the layout ({} / {})", what,
                                        kv.layer_bytes, kv.page_bytes, layer, page));
  }
  return {};
}

Status check_layer(const PagedKvView& kv, std::int32_t layer, const char* what) {
  if (layer < 0 || layer >= kv.num_layers) {
    return invalid_argument(fmt::format("{}: layer {} is outside [0, {})", what, layer, kv.num_layers));
  }
  return {};
}

Status check_params(const PagedKvView& kv, const AttentionParams& p, const char* what) {
  CLM_RETURN_IF_ERROR(check_layer(kv, p.layer, what));
  if (p.num_q_heads <= 0 || p.num_q_heads % kv.kv_heads != 0) {
    return invalid_argument(fmt::format("{}: num_q_heads {} is not a positive multiple of kv_heads {}", what,
                                        p.num_q_heads, kv.kv_heads));
  }
  if (!std::isfinite(p.softmax_scale)) {
    return invalid_argument(fmt::format("{}: softmax_scale {} is not finite", what, p.softmax_scale));
  }
  if (p.sliding_window < 0) {
    return invalid_argument(fmt::format("{}: sliding_window {} is negative", what, p.sliding_window));
  }
  if (p.num_threads < 0) return invalid_argument(fmt::format("{}: num_threads {} is negative", what, p.num_threads));
  return {};
}

Status check_page(const PagedKvView& kv, std::int32_t page, std::size_t index, const char* what) {
  if (page < 0 || page >= kv.num_pages) {
    return invalid_argument(
        fmt::format("{}: page id {} (entry {}) is outside the pool [0, {})", what, page, index, kv.num_pages));
  }
  return {};
}

// Queries must be finite (a NaN would spread silently through the softmax),
// and out must not overlap q.
Status check_activations(const float* q, float* out, std::size_t count, const char* what) {
  if (q == nullptr || out == nullptr) return invalid_argument(fmt::format("{}: q and out must not be null", what));
  const auto qa = reinterpret_cast<std::uintptr_t>(q);
  const auto oa = reinterpret_cast<std::uintptr_t>(out);
  const std::uintptr_t bytes = count * sizeof(float);
  if (qa < oa + bytes && oa < qa + bytes) return invalid_argument(fmt::format("{}: out overlaps q", what));
  // One vectorisable pass over the exponent bits (all ones: inf or NaN), then
  // a search for the culprit only when there is one.
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, q + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (bad == 0) return {};
  for (std::size_t i = 0; i < count; ++i) {
    if (!std::isfinite(q[i])) {
      return invalid_argument(fmt::format("{}: q[{}] is {} (queries must be finite)", what, i, q[i]));
    }
  }
  return {};
}

KvLayer layer_of(const PagedKvView& kv, std::int32_t layer) {
  KvLayer l;
  const std::size_t e = kv_dtype_bytes(kv.dtype);
  l.base = static_cast<const char*>(kv.base) + static_cast<std::size_t>(layer) * kv.layer_bytes;
  l.page_stride = kv.page_bytes;
  l.row_bytes = static_cast<std::size_t>(kv.kv_heads) * static_cast<std::size_t>(kv.head_dim) * e;
  l.v_offset = static_cast<std::size_t>(kv.page_size) * l.row_bytes;
  l.head_bytes = static_cast<std::size_t>(kv.head_dim) * e;
  l.page_size = kv.page_size;
  l.kv_heads = kv.kv_heads;
  l.head_dim = kv.head_dim;
  l.dtype = kv.dtype;
  return l;
}

AttnShape shape_of(const PagedKvView& kv, const AttentionParams& p) {
  AttnShape s;
  s.num_q_heads = p.num_q_heads;
  s.group = p.num_q_heads / kv.kv_heads;
  s.scale = p.softmax_scale != 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  return s;
}

// The SIMD kernels' level for this layer: scalar when the ISA is missing or
// head_dim is not a multiple of 64.
CpuIsa simd_for(const KvLayer& kv) {
  return kv.head_dim % kAvx2HeadDimMultiple == 0 ? cpu_isa() : CpuIsa::scalar;
}

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

struct Sequence {
  const std::int32_t* pages;
  std::int64_t begin;  // first visible key (sliding window)
  std::int64_t end;    // kv_len
};

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

// The kernels report no error but memory; the API never throws.
Status decode(const KvLayer& kv, const AttnShape& shape, const float* q, const std::vector<Sequence>& seqs,
              float* out, int requested_threads, const char* what) {
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

Status prefill_few(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                   const std::int32_t* pages, std::int64_t kv_len, std::int32_t window, float* out, int threads,
                   const char* what) {
  try {
    return prefill_few_impl(kv, shape, q, n_new, pages, kv_len, window, out, threads, what);
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of host memory", what));
  }
}

}  // namespace

// ---- detail API -------------------------------------------------------------------------

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::scalar:
      break;
  }
  return "scalar";
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = detect_isa();
  return best;
}

CpuIsa cpu_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(cpu_isa_best());
    g_isa.store(isa, std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(isa);
}

Status set_cpu_isa(CpuIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(cpu_isa_best())) {
    return unsupported(fmt::format("set_cpu_isa: this machine (or build) has no {} (best: {})", cpu_isa_name(isa),
                                   cpu_isa_name(cpu_isa_best())));
  }
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return {};
}

void set_decode_chunk_tokens(std::int32_t tokens) { g_decode_chunk.store(std::max(0, tokens)); }

void set_prefill_route(PrefillRoute route) { g_prefill_route.store(static_cast<int>(route)); }

int cpu_kernel_threads(int requested) {
  const int hw = hardware_threads();
  return requested <= 0 ? hw : std::min(requested, hw);
}

float* scratch_floats(int slot, std::size_t count) {
  Scratch& s = t_scratch;
  const std::size_t i = static_cast<std::size_t>(slot);
  if (s.size[i] < count) {
    const std::size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::free(s.data[i]);
    s.data[i] = static_cast<float*>(p);
    s.size[i] = bytes / sizeof(float);
  }
  return s.data[i];
}

void decode_chunk_scalar(const KvLayer& kv, const AttnShape& shape, const DecodeChunk& chunk) {
  // The scalar kernel scales the scores, not q.
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { decode_chunk_scalar_t<DT>(kv, shape, chunk); });
}

void prefill_tile_scalar(const KvLayer& kv, const AttnShape& shape, const PrefillTile& tile) {
  with_kv_dtype(kv.dtype, [&]<KvDType DT> { prefill_tile_scalar_t<DT>(kv, shape, tile); });
}

}  // namespace detail

// ---- entry points ---------------------------------------------------------------------------

Status write_kv(const PagedKvView& kv, std::int32_t layer, const float* k, const float* v,
                std::span<const std::int64_t> slots) {
  constexpr const char* what = "write_kv";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_layer(kv, layer, what));
  if (slots.empty()) return {};
  if (k == nullptr || v == nullptr) return invalid_argument("write_kv: k and v must not be null");
  const std::int64_t slot_count = static_cast<std::int64_t>(kv.num_pages) * kv.page_size;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= slot_count) {
      return invalid_argument(
          fmt::format("write_kv: slot {} (token {}) is outside the pool [0, {})", slots[i], i, slot_count));
    }
  }
  const detail::KvLayer l = detail::layer_of(kv, layer);
  const std::size_t row = static_cast<std::size_t>(kv.kv_heads) * static_cast<std::size_t>(kv.head_dim);
  char* base = const_cast<char*>(l.base);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t page = slots[i] / kv.page_size;
    const std::int64_t r = slots[i] % kv.page_size;
    char* dk = base + static_cast<std::size_t>(page) * l.page_stride + static_cast<std::size_t>(r) * l.row_bytes;
    char* dv = dk + l.v_offset;
    const float* sk = k + i * row;
    const float* sv = v + i * row;
    switch (kv.dtype) {
      case KvDType::f32:
        std::memcpy(dk, sk, row * sizeof(float));
        std::memcpy(dv, sv, row * sizeof(float));
        break;
      case KvDType::f16:
      case KvDType::bf16: {
        const bool f16 = kv.dtype == KvDType::f16;
        for (std::size_t j = 0; j < row; ++j) {
          const std::uint16_t hk = f16 ? detail::f32_to_f16(sk[j]) : detail::f32_to_bf16(sk[j]);
          const std::uint16_t hv = f16 ? detail::f32_to_f16(sv[j]) : detail::f32_to_bf16(sv[j]);
          std::memcpy(dk + 2 * j, &hk, 2);
          std::memcpy(dv + 2 * j, &hv, 2);
        }
        break;
      }
    }
  }
  return {};
}

Status paged_decode_attention(const PagedKvView& kv, const AttentionParams& params, const float* q,
                              std::span<const std::int32_t> indptr, std::span<const std::int32_t> indices,
                              std::span<const std::int32_t> last_page_len, float* out) {
  constexpr const char* what = "paged_decode_attention";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_params(kv, params, what));
  const std::size_t batch = last_page_len.size();
  if (indptr.size() != batch + 1) {
    return invalid_argument(
        fmt::format("{}: indptr has {} entries; {} sequences need {}", what, indptr.size(), batch, batch + 1));
  }
  // indptr first (non-negative, increasing, within indices), then the pages it names.
  for (std::size_t i = 0; i < batch; ++i) {
    if (indptr[i] < 0 || indptr[i + 1] <= indptr[i]) {
      return invalid_argument(fmt::format("{}: indptr[{}..{}] = {}, {}: every sequence needs >= 1 page", what, i,
                                          i + 1, indptr[i], indptr[i + 1]));
    }
  }
  if (batch == 0) return {};
  if (static_cast<std::size_t>(indptr[batch]) > indices.size()) {
    return invalid_argument(
        fmt::format("{}: indptr[{}] = {} is past the {} indices", what, batch, indptr[batch], indices.size()));
  }
  std::vector<detail::Sequence> seqs;
  try {
    seqs.resize(batch);
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of host memory", what));
  }
  for (std::size_t i = 0; i < batch; ++i) {
    if (last_page_len[i] < 1 || last_page_len[i] > kv.page_size) {
      return invalid_argument(fmt::format("{}: last_page_len[{}] = {} is outside [1, page_size {}]", what, i,
                                          last_page_len[i], kv.page_size));
    }
    for (std::int32_t j = indptr[i]; j < indptr[i + 1]; ++j) {
      CLM_RETURN_IF_ERROR(detail::check_page(kv, indices[static_cast<std::size_t>(j)], static_cast<std::size_t>(j), what));
    }
    const std::int64_t pages = static_cast<std::int64_t>(indptr[i + 1]) - indptr[i];
    const std::int64_t len = (pages - 1) * kv.page_size + last_page_len[i];
    seqs[i].pages = indices.data() + indptr[i];
    seqs[i].end = len;
    seqs[i].begin = params.sliding_window > 0 ? std::max<std::int64_t>(0, len - params.sliding_window) : 0;
  }
  const std::size_t count =
      batch * static_cast<std::size_t>(params.num_q_heads) * static_cast<std::size_t>(kv.head_dim);
  CLM_RETURN_IF_ERROR(detail::check_activations(q, out, count, what));
  return detail::decode(detail::layer_of(kv, params.layer), detail::shape_of(kv, params), q, seqs, out,
                        params.num_threads, what);
}

Status paged_prefill_attention(const PagedKvView& kv, const AttentionParams& params, const float* q,
                               std::int32_t n_new, std::span<const std::int32_t> pages, std::int32_t kv_len,
                               float* out) {
  constexpr const char* what = "paged_prefill_attention";
  CLM_RETURN_IF_ERROR(detail::check_view(kv, what));
  CLM_RETURN_IF_ERROR(detail::check_params(kv, params, what));
  if (n_new < 0 || kv_len < n_new) {
    return invalid_argument(fmt::format("{}: n_new {} must be in [0, kv_len {}]", what, n_new, kv_len));
  }
  if (n_new == 0) return {};
  const std::size_t needed = (static_cast<std::size_t>(kv_len) + static_cast<std::size_t>(kv.page_size) - 1) /
                             static_cast<std::size_t>(kv.page_size);
  if (pages.size() < needed) {
    return invalid_argument(fmt::format("{}: {} tokens of page size {} need {} pages, got {}", what, kv_len,
                                        kv.page_size, needed, pages.size()));
  }
  for (std::size_t j = 0; j < needed; ++j) CLM_RETURN_IF_ERROR(detail::check_page(kv, pages[j], j, what));
  const std::size_t count =
      static_cast<std::size_t>(n_new) * static_cast<std::size_t>(params.num_q_heads) * static_cast<std::size_t>(kv.head_dim);
  CLM_RETURN_IF_ERROR(detail::check_activations(q, out, count, what));

  const detail::KvLayer layer = detail::layer_of(kv, params.layer);
  const detail::AttnShape shape = detail::shape_of(kv, params);
  if (detail::prefill_few_applies(layer, shape, n_new, kv_len, params.sliding_window)) {
    return detail::prefill_few(layer, shape, q, n_new, pages.data(), kv_len, params.sliding_window, out,
                               params.num_threads, what);
  }

  // Tasks: (kv head, tile of queries); a tile has ~128 rows (queries x group).
  // Every task converts and packs each block of keys it reads, so tiles are
  // split only until there are two tasks a thread: a few new rows over a
  // long cached prefix (equal work per tile) then pack the prefix once per
  // kv head and tile, not four times as often.
  int threads = detail::cpu_kernel_threads(params.num_threads);
  const std::int64_t span = params.sliding_window > 0 ? std::min(params.sliding_window, kv_len) : kv_len;
  const double flops = 4.0 * n_new * static_cast<double>(span) * params.num_q_heads * kv.head_dim;
  if (flops < 4e6) threads = 1;
  const std::int32_t heads = kv.kv_heads;
  std::int32_t tile = std::clamp(128 / shape.group, 1, 128);
  while (tile > 8 && static_cast<std::int64_t>(heads) * ((n_new + tile - 1) / tile) < 2 * threads) tile /= 2;
  const std::int32_t tiles = (n_new + tile - 1) / tile;
  const detail::IsaKernels& kernels = detail::kernels_for(detail::simd_for(layer));
  auto run_tile = [&](std::int64_t t) {
    // Later tiles see more keys: hand them out first.
    const std::int32_t index = tiles - 1 - static_cast<std::int32_t>(t / heads);
    detail::PrefillTile pt;
    pt.q = q;
    pt.out = out;
    pt.pages = pages.data();
    pt.kv_len = kv_len;
    pt.n_new = n_new;
    pt.window = params.sliding_window;
    pt.kv_head = static_cast<std::int32_t>(t % heads);
    pt.q_begin = index * tile;
    pt.q_end = std::min(n_new, pt.q_begin + tile);
    kernels.prefill_tile(layer, shape, pt);
  };
  bool ok = false;
  try {
    ok = detail::parallel_for(static_cast<std::int64_t>(tiles) * heads, threads, run_tile);
  } catch (const std::bad_alloc&) {
  }
  if (!ok) return out_of_memory(fmt::format("{}: no memory for kernel scratch", what));
  return {};
}

Status copy_pages(const PagedKvView& dst, std::span<const std::int32_t> dst_pages, const PagedKvView& src,
                  std::span<const std::int32_t> src_pages) {
  constexpr const char* what = "copy_pages";
  CLM_RETURN_IF_ERROR(detail::check_view(dst, what));
  CLM_RETURN_IF_ERROR(detail::check_view(src, what));
  if (dst.dtype != src.dtype || dst.page_size != src.page_size || dst.num_layers != src.num_layers ||
      dst.kv_heads != src.kv_heads || dst.head_dim != src.head_dim) {
    return invalid_argument("copy_pages: the two pools have different layouts (dtype, page_size, layers, heads, head_dim)");
  }
  if (dst_pages.size() != src_pages.size()) {
    return invalid_argument(
        fmt::format("copy_pages: {} destination pages for {} source pages", dst_pages.size(), src_pages.size()));
  }
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {
    CLM_RETURN_IF_ERROR(detail::check_page(dst, dst_pages[i], i, "copy_pages (destination)"));
    CLM_RETURN_IF_ERROR(detail::check_page(src, src_pages[i], i, "copy_pages (source)"));
  }
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {  // in order: a later pair sees an earlier copy
    char* d = static_cast<char*>(dst.base) + static_cast<std::size_t>(dst_pages[i]) * dst.page_bytes;
    const char* s = static_cast<const char*>(src.base) + static_cast<std::size_t>(src_pages[i]) * src.page_bytes;
    if (d != s) std::memmove(d, s, dst.page_bytes);
  }
  return {};
}

Status gather_pages(void* buffer, const PagedKvView& src, std::span<const std::int32_t> pages) {
  CLM_RETURN_IF_ERROR(detail::check_view(src, "gather_pages"));
  for (std::size_t i = 0; i < pages.size(); ++i) CLM_RETURN_IF_ERROR(detail::check_page(src, pages[i], i, "gather_pages"));
  if (pages.empty()) return {};
  if (buffer == nullptr) return invalid_argument("gather_pages: buffer must not be null");
  char* out = static_cast<char*>(buffer);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    std::memcpy(out + i * src.page_bytes,
                static_cast<const char*>(src.base) + static_cast<std::size_t>(pages[i]) * src.page_bytes, src.page_bytes);
  }
  return {};
}

Status scatter_pages(const PagedKvView& dst, std::span<const std::int32_t> pages, const void* buffer) {
  CLM_RETURN_IF_ERROR(detail::check_view(dst, "scatter_pages"));
  for (std::size_t i = 0; i < pages.size(); ++i) CLM_RETURN_IF_ERROR(detail::check_page(dst, pages[i], i, "scatter_pages"));
  if (pages.empty()) return {};
  if (buffer == nullptr) return invalid_argument("scatter_pages: buffer must not be null");
  const char* in = static_cast<const char*>(buffer);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    std::memcpy(static_cast<char*>(dst.base) + static_cast<std::size_t>(pages[i]) * dst.page_bytes,
                in + i * dst.page_bytes, dst.page_bytes);
  }
  return {};
}

}  // namespace clm
