// bench_cuda_kernels: the CUDA kernels of clm/device/cuda_kernels.hpp on this
// machine's GPU, one JSON object per figure (as the other benches):
//
//   decode/...  achieved bandwidth (K/V bytes read / time of decode_run) vs the
//               device-to-device cudaMemcpy bandwidth measured in the same run
//               (bytes read + bytes written, i.e. the DRAM traffic); target >= 0.75
//   copy_...    host<->device page copies (copy_pages, random pages) vs one
//               plain cudaMemcpy of the same bytes between the same pinned
//               host memory and device memory; target >= 0.70
//
// Without a usable CUDA device it says so on stderr and exits 0. With
// CLM_BENCH_MARKDOWN=<file> it also writes the figures as a markdown table.
// CLM_BENCH_SMOKE=1 shrinks every shape (a quick check of the program itself).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_cuda_common.hpp"
#include "clm/detail/half.hpp"
#include "clm/device/cuda_kernels.hpp"
#include "clm/device/device_memory.hpp"

namespace {

using clm_bench::check;
using clm_bench::device_alloc;
using clm_bench::die;
using clm_bench::gbps;
using clm_bench::report;
using clm_bench::time_ms;

constexpr std::string_view kBench = "cuda_kernels";

clm::PagedKvView make_view(void* base, clm::MemoryKind memory, std::int32_t num_pages, std::int32_t page_size,
                           std::int32_t num_layers, std::int32_t kv_heads, std::int32_t head_dim, clm::KvDType dtype) {
  clm::PagedKvView v;
  v.base = base;
  v.memory = memory;
  v.dtype = dtype;
  v.num_pages = num_pages;
  v.page_size = page_size;
  v.num_layers = num_layers;
  v.kv_heads = kv_heads;
  v.head_dim = head_dim;
  v.layer_bytes = 2 * static_cast<std::size_t>(page_size) * kv_heads * head_dim * clm::kv_dtype_bytes(dtype);
  v.page_bytes = v.layer_bytes * static_cast<std::size_t>(num_layers);
  return v;
}

// CLM_BENCH_SMOKE=1: everything 64x smaller.
std::int32_t g_shrink = 1;

struct DecodeShape {
  const char* label;
  clm::KvDType dtype;
  std::int32_t head_dim, q_heads, kv_heads, batch, context;
  double target;
};

void bench_decode(clm::cuda::Workspace& ws, cudaStream_t stream, void* pool_memory, std::size_t pool_bytes,
                  double memcpy_gbps, const DecodeShape& s) {
  constexpr std::int32_t kPageSize = 16;
  const std::int32_t pages_per_seq = s.context / g_shrink / kPageSize;
  const std::int32_t num_pages = s.batch * pages_per_seq;
  const clm::PagedKvView kv =
      make_view(pool_memory, clm::MemoryKind::device, num_pages, kPageSize, 1, s.kv_heads, s.head_dim, s.dtype);
  if (kv.page_bytes * static_cast<std::size_t>(num_pages) > pool_bytes) die("decode pool too small");
  // Pages of all sequences shuffled over the pool, as after a while of serving.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(42);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::int32_t> indptr{0}, last_page_len;
  for (std::int32_t b = 0; b < s.batch; ++b) {
    indptr.push_back((b + 1) * pages_per_seq);
    last_page_len.push_back(kPageSize);
  }
  clm::AttentionParams params;
  params.num_q_heads = s.q_heads;
  const std::size_t n = static_cast<std::size_t>(s.batch) * s.q_heads * s.head_dim;
  std::vector<float> q(n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : q) x = u(rng);
  float* dq = device_alloc<float>(n);
  float* dout = device_alloc<float>(n);
  check(cudaMemcpy(dq, q.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload q");
  check(clm::cuda::decode_plan(ws, kv, params, indptr, ids, last_page_len, stream), "decode_plan");
  const double ms =
      time_ms(stream, 3, 20, [&] { check(clm::cuda::decode_run(ws, kv, params, dq, dout, stream), "decode_run"); });
  const double kv_bytes = static_cast<double>(s.batch) * (s.context / g_shrink) * s.kv_heads * s.head_dim * 2.0 *
                          static_cast<double>(clm::kv_dtype_bytes(s.dtype));
  const std::string name = fmt::format("decode/{}/{}/b{}/ctx{}/hq{}/hkv{}/d{}", s.label, clm::kv_dtype_name(s.dtype),
                                       s.batch, s.context / g_shrink, s.q_heads, s.kv_heads, s.head_dim);
  report(kBench, name, "achieved_bandwidth_GBps", gbps(kv_bytes, ms), "GB/s", "d2d_memcpy_read_plus_write_GBps",
         memcpy_gbps, s.target);
  report(kBench, name, "us_per_decode_run", ms * 1e3, "us", "us_at_memcpy_bandwidth",
         kv_bytes / (memcpy_gbps * 1e9) * 1e6);
  // The plan (host validation, split, upload) once per step, for scale.
  const double plan_ms = time_ms(stream, 1, 5, [&] {
    check(clm::cuda::decode_plan(ws, kv, params, indptr, ids, last_page_len, stream), "decode_plan");
  });
  report(kBench, name, "us_per_decode_plan", plan_ms * 1e3, "us", "us_per_decode_run", ms * 1e3);
  cudaFree(dq);
  cudaFree(dout);
}

struct CopyShape {
  const char* label;
  std::int32_t num_layers;  // page bytes = layers * 64 KiB (16 tokens, 8 kv heads, D 128, bf16)
  std::int32_t pages;       // pages copied per call
};

void bench_copy(clm::cuda::Workspace& ws, cudaStream_t stream, unsigned char* host, void* device, std::size_t bytes,
                const CopyShape& s) {
  const clm::PagedKvView like =
      make_view(nullptr, clm::MemoryKind::host, 1, 16, s.num_layers, 8, 128, clm::KvDType::bf16);
  const auto pool_pages = static_cast<std::int32_t>(bytes / like.page_bytes);
  const std::int32_t copied = std::max(1, s.pages / g_shrink);
  if (pool_pages < 2 * copied) die("copy pools too small");
  const clm::PagedKvView hv =
      make_view(host, clm::MemoryKind::host, pool_pages, 16, s.num_layers, 8, 128, clm::KvDType::bf16);
  const clm::PagedKvView dv =
      make_view(device, clm::MemoryKind::device, pool_pages, 16, s.num_layers, 8, 128, clm::KvDType::bf16);
  std::mt19937_64 rng(7);
  std::vector<std::int32_t> a(static_cast<std::size_t>(pool_pages)), b(static_cast<std::size_t>(pool_pages));
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  a.resize(static_cast<std::size_t>(copied));
  b.resize(static_cast<std::size_t>(copied));
  const std::size_t moved = like.page_bytes * static_cast<std::size_t>(copied);
  const double h2d_plain = time_ms(stream, 1, 5, [&] {
    check(cudaMemcpyAsync(device, host, moved, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  });
  const double d2h_plain = time_ms(stream, 1, 5, [&] {
    check(cudaMemcpyAsync(host, device, moved, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  });
  using clm::cuda::CopyMethod;
  for (CopyMethod method : {CopyMethod::automatic, CopyMethod::memcpy, CopyMethod::kernel}) {
    const char* mname = method == CopyMethod::automatic ? "auto" : method == CopyMethod::memcpy ? "memcpy" : "kernel";
    clm::cuda::CopyOptions options;
    options.method = method;
    const double h2d = time_ms(
        stream, 1, 5, [&] { check(clm::cuda::copy_pages(ws, dv, b, hv, a, stream, options), "copy_pages h2d"); });
    const double d2h = time_ms(
        stream, 1, 5, [&] { check(clm::cuda::copy_pages(ws, hv, a, dv, b, stream, options), "copy_pages d2h"); });
    const double target = method == CopyMethod::automatic ? 0.70 : 0;
    report(kBench, fmt::format("copy_h2d/{}/page={}KiB/pages={}/{}", s.label, like.page_bytes / 1024, copied, mname),
           "bandwidth_GBps", gbps(static_cast<double>(moved), h2d), "GB/s", "plain_cudaMemcpy_GBps",
           gbps(static_cast<double>(moved), h2d_plain), target);
    report(kBench, fmt::format("copy_d2h/{}/page={}KiB/pages={}/{}", s.label, like.page_bytes / 1024, copied, mname),
           "bandwidth_GBps", gbps(static_cast<double>(moved), d2h), "GB/s", "plain_cudaMemcpy_GBps",
           gbps(static_cast<double>(moved), d2h_plain), target);
  }
}

// Fills `bytes` of device memory with random bf16 values in [-1, 1]: finite
// read as bf16, as f16 (|x| < 2) and as f32 (a bf16 high half), and never a
// constant (timings on uniform data can flatter the hardware). A 64 MiB random
// block, repeated.
void fill_random_kv(void* device, std::size_t bytes) {
  const std::size_t block = std::min<std::size_t>(bytes, std::size_t{64} << 20);
  std::vector<std::uint16_t> values(block / 2);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::uint16_t& v : values) v = clm::detail::f32_to_bf16(u(rng));
  for (std::size_t at = 0; at < bytes; at += block) {
    check(cudaMemcpy(static_cast<unsigned char*>(device) + at, values.data(), std::min(block, bytes - at),
                     cudaMemcpyHostToDevice),
          "upload random K/V");
  }
}

}  // namespace

int main() {
  if (clm_bench::skip_without_device()) return 0;
  if (clm_bench::smoke_run()) g_shrink = 64;
  std::unique_ptr<clm::cuda::Workspace> ws;
  check(clm::cuda::Workspace::create(0, ws), "Workspace::create");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // ---- device-to-device cudaMemcpy: the bandwidth baseline --------------------
  const std::size_t copy_bytes = (std::size_t{1} << 30) / static_cast<std::size_t>(g_shrink);
  const double memcpy_gbps = clm_bench::memcpy_gbps(stream, copy_bytes, 2, 10);

  // ---- decode -----------------------------------------------------------------------
  // One pool buffer for all shapes: 32 x 32k tokens x 8 kv heads x 128 x bf16 x (K + V) = 4 GiB.
  const std::size_t pool_bytes = std::size_t{32} * 32768 * 8 * 128 * 2 * 2 / static_cast<std::size_t>(g_shrink);
  void* pool = device_alloc<unsigned char>(pool_bytes);
  fill_random_kv(pool, pool_bytes);
  const DecodeShape shapes[] = {
      {"main", clm::KvDType::bf16, 128, 32, 8, 32, 32768, 0.75}, {"f16", clm::KvDType::f16, 128, 32, 8, 32, 32768, 0},
      {"d64", clm::KvDType::bf16, 64, 32, 8, 32, 32768, 0},      {"gqa8", clm::KvDType::bf16, 128, 64, 8, 32, 32768, 0},
      {"mha", clm::KvDType::bf16, 128, 8, 8, 32, 32768, 0},      {"f32", clm::KvDType::f32, 128, 32, 8, 16, 32768, 0},
      {"ctx4k", clm::KvDType::bf16, 128, 32, 8, 32, 4096, 0},
  };
  for (const DecodeShape& s : shapes) bench_decode(*ws, stream, pool, pool_bytes, memcpy_gbps, s);
  cudaFree(pool);

  // ---- host <-> device page copies ------------------------------------------------------
  // each side; half of it is copied (2 MiB pages: at least 4 of them in smoke mode)
  const std::size_t pool_copy_bytes =
      std::max<std::size_t>((std::size_t{1} << 30) / static_cast<std::size_t>(g_shrink), std::size_t{8} << 20);
  auto* host = static_cast<unsigned char*>(std::aligned_alloc(4096, pool_copy_bytes));
  if (!host) die("host allocation");
  std::memset(host, 0x3c, pool_copy_bytes);
  check(clm::cuda::pin_host_memory(host, pool_copy_bytes), "pin_host_memory");
  void* device = device_alloc<unsigned char>(pool_copy_bytes);
  const CopyShape copies[] = {{"1layer", 1, 8192}, {"32layers", 32, 256}, {"4layers", 4, 1024}};
  for (const CopyShape& c : copies) bench_copy(*ws, stream, host, device, pool_copy_bytes, c);
  check(clm::cuda::unpin_host_memory(host), "unpin_host_memory");
  std::free(host);
  cudaFree(device);

  check(clm::cuda::synchronize(stream), "synchronize");
  cudaStreamDestroy(stream);
  clm_bench::write_markdown_if_asked();
  return 0;
}
