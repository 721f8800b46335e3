// bench_kernels: the CPU attention kernels (clm/kernels/attention.hpp) against
// baselines measured in the same run, on all hardware threads. One JSON object
// per figure:
//   kernels/decode_{f32,bf16}_b8_8k   batch 8 x 8192-token contexts, 32 q / 8 kv heads, head_dim 128,
//                                     page_size 16, pages shuffled over the pool.
//                                     value: K+V bytes read / time; baseline: a STREAM-like read
//                                     of a 1 GiB buffer (all threads, AVX2 loads)
//   kernels/decode_f32_b1_64k         one 65536-token sequence: the flash-decoding split
//   kernels/prefill_{f32,bf16}_128_over_2048
//                                     128 new tokens over a 2048-token cached prefix, same heads.
//                                     value: useful GFLOP/s (4 * head_dim per visible query-key
//                                     pair and q head); baseline: Eigen's f32 GEMM on the same
//                                     matmuls (per kv head: [512 x 128] x [128 x 2176] and
//                                     [512 x 2176] x [2176 x 128]), the 8 heads split over the
//                                     same number of threads, each running Eigen single-threaded
//   kernels/prefill_{bf16,f32}_{2,8}_over_32k
//                                     a few new tokens (a new turn's first ones, a draft to verify)
//                                     over a 32768-token cached prefix, same heads: the automatic
//                                     route (one decode over the shared prefix) against the tiles
//                                     in the same run. value: prefix K+V bytes / time; baseline: the
//                                     same for the tiles route (ratio: the speed-up); a second
//                                     figure per case (_vs_read) against the STREAM-like read
//   kernels/{decode,prefill}_*_avx2   where the AVX-512 kernels run: the same cases on the AVX2 ones
//                                     (the prefill's Eigen baseline is AVX2 for both: Eigen built for
//                                     AVX-512 in the same program would break the one-definition rule)
// CLM_BENCH_SMOKE=1: the same cases at small sizes, one run each.
// Every figure is the median of 15 runs, kernel and baseline interleaved so
// that drift of a shared machine hits both alike. This file is compiled with
// -mavx2 -mfma (tests/bench/CMakeLists.txt), so Eigen's baseline uses the same
// ISA as the kernels' AVX2 dispatch; the library itself is not.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <Eigen/Dense>

#include "bench_common.hpp"
#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"
#include "clm/kernels/attention.hpp"
#include "read_pass.hpp"

namespace {

using clm_bench::check;
using clm_bench::Clock;
using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
using clm_bench::seconds_since;

constexpr std::string_view kBench = "kernels";
int g_runs = 15;  // 1 in a smoke run
int g_threads = 0;
constexpr std::int32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a;
  std::getline(f, a);
  return a;
}

// ---- baselines ------------------------------------------------------------------

// A STREAM-like read pass: every thread sums its share of a buffer far larger than the caches.
class ReadBandwidth {
 public:
  explicit ReadBandwidth(std::size_t bytes, int threads) : floats_(bytes / sizeof(float)), threads_(threads) {
    data_ = static_cast<float*>(std::aligned_alloc(64, floats_ * sizeof(float)));
    if (!data_) die("no memory for the read-bandwidth buffer");
    std::vector<std::thread> pool;  // first touch by the threads that read
    for (int t = 0; t < threads_; ++t) {
      pool.emplace_back([this, t] {
        const auto [b, e] = share(t);
        for (std::size_t i = b; i < e; ++i) data_[i] = static_cast<float>(i % 1021) + 1.0f;  // no two pages alike
      });
    }
    for (auto& t : pool) t.join();
  }
  ~ReadBandwidth() { std::free(data_); }
  std::size_t bytes() const { return floats_ * sizeof(float); }

  double seconds() {
    std::vector<float> sums(static_cast<std::size_t>(threads_));
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads_; ++t) {
      pool.emplace_back([this, t, &sums] {
        const auto [b, e] = share(t);
        sums[static_cast<std::size_t>(t)] = clm_bench::read_pass(data_ + b, e - b);
      });
    }
    for (auto& t : pool) t.join();
    const double s = seconds_since(start);
    if (std::accumulate(sums.begin(), sums.end(), 0.0f) <= 0.0f) die("read pass summed nothing");
    return s;
  }

 private:
  std::pair<std::size_t, std::size_t> share(int t) const {
    const std::size_t per = floats_ / static_cast<std::size_t>(threads_) / 64 * 64;
    const std::size_t b = per * static_cast<std::size_t>(t);
    return {b, t == threads_ - 1 ? floats_ : b + per};
  }

  std::size_t floats_;
  int threads_;
  float* data_ = nullptr;
};

// Eigen f32 GEMM on the matmuls of dense (unfused) attention at the prefill shape.
class EigenGemm {
 public:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  EigenGemm(int rows, int keys, int dim, int heads, int threads) : heads_(heads), threads_(threads) {
    for (int t = 0; t < threads; ++t) {
      q_.push_back(Matrix::Random(rows, dim));
      k_.push_back(Matrix::Random(keys, dim));
      v_.push_back(Matrix::Random(keys, dim));
      s_.push_back(Matrix(rows, keys));
      o_.push_back(Matrix(rows, dim));
    }
    flops_ = static_cast<double>(heads) * 2.0 * (2.0 * rows * keys * dim);
  }
  double flops() const { return flops_; }
  double seconds() {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads_; ++t) {
      pool.emplace_back([this, t] {
        const auto i = static_cast<std::size_t>(t);
        for (int h = t; h < heads_; h += threads_) {
          s_[i].noalias() = q_[i] * k_[i].transpose();
          o_[i].noalias() = s_[i] * v_[i];
        }
      });
    }
    for (auto& t : pool) t.join();
    return seconds_since(start);
  }

 private:
  int heads_, threads_;
  double flops_ = 0;
  std::vector<Matrix> q_, k_, v_, s_, o_;
};

// ---- kernels --------------------------------------------------------------------

struct Pool {
  std::unique_ptr<clm::PagedKvPool> pool;
  clm::PagedKvView view;
};

Pool make_pool(std::int32_t pages, clm::KvDType dtype) {
  clm::PagedKvPoolConfig c;
  c.num_pages = pages;
  c.page_size = kPageSize;
  c.num_layers = 1;
  c.kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.dtype = dtype;
  c.memory = clm::MemoryKind::host;
  Pool p;
  check(clm::PagedKvPool::create(c, p.pool));
  // Random values in [-1, 1) (xorshift: filling 512 MiB with <random> takes seconds).
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<float>(static_cast<std::int64_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  };
  if (dtype == clm::KvDType::f32) {
    auto* f = static_cast<float*>(p.pool->data());
    for (std::size_t i = 0; i < p.pool->storage_bytes() / 4; ++i) f[i] = next();
  } else {
    auto* h = static_cast<std::uint16_t*>(p.pool->data());
    for (std::size_t i = 0; i < p.pool->storage_bytes() / 2; ++i) {
      h[i] = dtype == clm::KvDType::bf16 ? clm::detail::f32_to_bf16(next()) : clm::detail::f32_to_f16(next());
    }
  }
  p.view = clm::PagedKvView::of(*p.pool);
  return p;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Pages [0, n) in random order: a pool that has been in use, no two pages adjacent.
std::vector<std::int32_t> shuffled_pages(std::int32_t n, std::mt19937& rng) {
  std::vector<std::int32_t> pages(static_cast<std::size_t>(n));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  return pages;
}

clm::AttentionParams bench_params() {
  clm::AttentionParams params;
  params.num_q_heads = kQHeads;
  params.num_threads = g_threads;
  return params;
}

void bench_decode(const Pool& p, const std::string& name, int batch, std::int32_t tokens, ReadBandwidth& stream,
                  std::mt19937& rng) {
  const std::int32_t pages_per_seq = tokens / kPageSize;
  const std::vector<std::int32_t> ids = shuffled_pages(p.view.num_pages, rng);
  std::vector<std::int32_t> indptr{0}, indices, last;
  for (int b = 0; b < batch; ++b) {
    indices.insert(indices.end(), ids.begin() + static_cast<std::ptrdiff_t>(b) * pages_per_seq,
                   ids.begin() + static_cast<std::ptrdiff_t>(b + 1) * pages_per_seq);
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
    last.push_back(kPageSize);
  }
  const auto q = random_floats(static_cast<std::size_t>(batch) * kQHeads * kHeadDim, rng);
  std::vector<float> out(q.size());
  const clm::AttentionParams params = bench_params();
  const double bytes = static_cast<double>(batch) * tokens * kKvHeads * kHeadDim * 2.0 *
                       static_cast<double>(clm::kv_dtype_bytes(p.view.dtype));
  check(clm::paged_decode_attention(p.view, params, q.data(), indptr, indices, last, out.data()));  // warm-up
  std::vector<double> kernel, base;
  for (int run = 0; run < g_runs; ++run) {
    const auto start = Clock::now();
    check(clm::paged_decode_attention(p.view, params, q.data(), indptr, indices, last, out.data()));
    kernel.push_back(seconds_since(start));
    base.push_back(stream.seconds());
  }
  print_figure(kBench, name, "kv_read_GB_per_s", bytes / median(kernel) / 1e9, "GB/s", "stream_read_GB_per_s",
               static_cast<double>(stream.bytes()) / median(base) / 1e9);
}

// A few new tokens over a long prefix: the automatic route (for these sizes
// the decode over the shared prefix) and the tiles, interleaved.
void bench_few_prefill(const Pool& p, const std::string& name, std::int32_t new_tokens, ReadBandwidth& stream,
                       std::mt19937& rng) {
  using clm::detail::PrefillRoute;
  const std::int32_t len = p.view.num_pages * kPageSize;
  const std::vector<std::int32_t> pages = shuffled_pages(p.view.num_pages, rng);
  const auto q = random_floats(static_cast<std::size_t>(new_tokens) * kQHeads * kHeadDim, rng);
  std::vector<float> out(q.size());
  const clm::AttentionParams params = bench_params();
  const double bytes = static_cast<double>(len - new_tokens + 1) * kKvHeads * kHeadDim * 2.0 *
                       static_cast<double>(clm::kv_dtype_bytes(p.view.dtype));
  auto run = [&](PrefillRoute route) {
    clm::detail::set_prefill_route(route);
    const auto start = Clock::now();
    check(clm::paged_prefill_attention(p.view, params, q.data(), new_tokens, pages, len, out.data()));
    return seconds_since(start);
  };
  run(PrefillRoute::automatic);  // warm-up
  run(PrefillRoute::tiles);
  std::vector<double> automatic, tiles, base;
  for (int r = 0; r < g_runs; ++r) {
    automatic.push_back(run(PrefillRoute::automatic));
    tiles.push_back(run(PrefillRoute::tiles));
    base.push_back(stream.seconds());
  }
  clm::detail::set_prefill_route(PrefillRoute::automatic);
  const double value = bytes / median(automatic) / 1e9;
  print_figure(kBench, name, "kv_read_GB_per_s", value, "GB/s", "tiles_route_kv_read_GB_per_s",
               bytes / median(tiles) / 1e9);
  print_figure(kBench, name + "_vs_read", "kv_read_GB_per_s", value, "GB/s", "stream_read_GB_per_s",
               static_cast<double>(stream.bytes()) / median(base) / 1e9);
}

void bench_prefill(clm::KvDType dtype, const std::string& name, std::int32_t new_tokens, std::int32_t prefix,
                   EigenGemm& gemm, std::mt19937& rng) {
  const std::int32_t len = prefix + new_tokens;
  Pool p = make_pool(len / kPageSize, dtype);
  const std::vector<std::int32_t> pages = shuffled_pages(len / kPageSize, rng);
  const auto q = random_floats(static_cast<std::size_t>(new_tokens) * kQHeads * kHeadDim, rng);
  std::vector<float> out(q.size());
  const clm::AttentionParams params = bench_params();
  double pairs = 0;  // visible (query, key) pairs
  for (int i = 0; i < new_tokens; ++i) pairs += prefix + i + 1;
  const double flops = pairs * kQHeads * 4.0 * kHeadDim;
  check(clm::paged_prefill_attention(p.view, params, q.data(), new_tokens, pages, len, out.data()));  // warm-up
  std::vector<double> kernel, base;
  for (int run = 0; run < g_runs; ++run) {
    const auto start = Clock::now();
    check(clm::paged_prefill_attention(p.view, params, q.data(), new_tokens, pages, len, out.data()));
    kernel.push_back(seconds_since(start));
    base.push_back(gemm.seconds());
  }
  print_figure(kBench, name, "GFLOP_per_s", flops / median(kernel) / 1e9, "GFLOP/s", "eigen_gemm_GFLOP_per_s",
               gemm.flops() / median(base) / 1e9);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) die("this benchmark is built for AVX2 + FMA");
  // CLM_BENCH_THREADS=n: kernels and baselines on n threads (default: all).
  const char* env = std::getenv("CLM_BENCH_THREADS");
  const int threads = clm::detail::cpu_kernel_threads(env ? std::atoi(env) : 0);
  g_threads = threads;
  Eigen::setNbThreads(1);
  std::fprintf(stderr, "bench_kernels: %d threads, kernels %s, load average %s\n", threads,
               clm::detail::cpu_isa_name(clm::detail::cpu_isa()), load_average().c_str());
  std::mt19937 rng(12345);
  // CLM_BENCH_SMOKE=1: one run of each case at small sizes (a check of the program).
  const bool smoke = clm_bench::smoke_run();
  if (smoke) g_runs = 1;
  const int batch = smoke ? 2 : 8;
  const std::int32_t context = smoke ? 1024 : 8192, long_context = smoke ? 2048 : 65536;
  // Where the AVX-512 kernels run, the AVX2 ones are measured too (cases
  // suffixed _avx2), against the same baseline.
  std::vector<clm::detail::CpuIsa> isas{clm::detail::cpu_isa()};
  if (isas[0] == clm::detail::CpuIsa::avx512) isas.push_back(clm::detail::CpuIsa::avx2);
  {
    ReadBandwidth stream(std::size_t{1} << (smoke ? 26 : 30), threads);
    for (clm::KvDType dtype : {clm::KvDType::f32, clm::KvDType::bf16}) {
      // 8 x 8192 tokens x 8 heads x 128 x 2 (K, V) x 4 B = 512 MiB for f32, one layer.
      const Pool p = make_pool(batch * context / kPageSize, dtype);
      for (clm::detail::CpuIsa isa : isas) {
        check(clm::detail::set_cpu_isa(isa));
        const std::string suffix = isa == isas[0] ? "" : fmt::format("_{}", clm::detail::cpu_isa_name(isa));
        bench_decode(p, fmt::format("decode_{}_b8_8k{}", clm::kv_dtype_name(dtype), suffix), batch, context, stream,
                     rng);
        if (dtype == clm::KvDType::f32) bench_decode(p, "decode_f32_b1_64k" + suffix, 1, long_context, stream, rng);
      }
      check(clm::detail::set_cpu_isa(isas[0]));
    }
    // 32768 tokens x 8 heads x 128 x 2 (K, V) x 2 B = 128 MiB for bf16, past any L3.
    const std::int32_t few_prefix = smoke ? 2048 : 32768;
    for (clm::KvDType dtype : {clm::KvDType::bf16, clm::KvDType::f32}) {
      const Pool p = make_pool(few_prefix / kPageSize, dtype);
      for (std::int32_t n : {2, 8}) {
        if (dtype == clm::KvDType::f32 && n == 2) continue;
        bench_few_prefill(p, fmt::format("prefill_{}_{}_over_32k", clm::kv_dtype_name(dtype), n), n, stream, rng);
      }
    }
  }
  const std::int32_t prefill_new = smoke ? 32 : 128, prefill_prefix = smoke ? 256 : 2048;
  EigenGemm gemm(4 * prefill_new, prefill_prefix + prefill_new, kHeadDim, kKvHeads, threads);
  for (clm::KvDType dtype : {clm::KvDType::f32, clm::KvDType::bf16}) {
    for (clm::detail::CpuIsa isa : isas) {
      check(clm::detail::set_cpu_isa(isa));
      const std::string suffix = isa == isas[0] ? "" : fmt::format("_{}", clm::detail::cpu_isa_name(isa));
      bench_prefill(dtype, fmt::format("prefill_{}_128_over_2048{}", clm::kv_dtype_name(dtype), suffix), prefill_new,
                    prefill_prefix, gemm, rng);
    }
    check(clm::detail::set_cpu_isa(isas[0]));
  }
  std::fprintf(stderr, "bench_kernels: load average at the end %s\n", load_average().c_str());
  return 0;
}
