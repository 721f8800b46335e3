// bench_cuda_clm: the CLM model side on this machine's GPU (clm/device/cuda_clm.hpp),
// one JSON object per figure (as the other benches):
//
//   src_head/...  DeviceSrcHead::score_async at hidden 4096 (inner 1024) over M
//                 sequences: the head's effective GEMM rate, 2*M*hidden*inner
//                 FLOP / time of the whole call (upload, masked mean, GEMM,
//                 fused bias+GELU+dot+sigmoid), vs cuBLAS's own rate for the
//                 same GEMM (cublasGemmEx, f32, same shape) measured in the same
//                 run, both timed over 20 back-to-back calls (as a decode loop
//                 enqueues them); target >= 0.6 for the decode shapes (one
//                 token per sequence). The one-call times (an event pair
//                 around each call, the host's enqueue cost included) are
//                 reported too. The prefill shape (8 x 512 tokens) is dominated by
//                 reading attn_out: its figure is the DRAM bytes the head must
//                 read (attn_out + W1) per second vs a device-to-device
//                 cudaMemcpy (read + write bytes); target >= 0.6.
//   adapter/...   DeviceSnapshotAdapter::apply (and inject = prepare + apply)
//                 over the hidden states: bytes read + written per second vs a
//                 device-to-device cudaMemcpy of the same bytes (read + write).
//
// Without a usable CUDA device it says SKIPPED on stderr and exits 0. With
// CLM_BENCH_MARKDOWN=<file> it also writes the figures as a markdown table.
// CLM_BENCH_SMOKE=1 shrinks every shape (a quick check of the program itself).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_cuda_common.hpp"
#include "clm/detail/half.hpp"
#include "clm/device/cuda_clm.hpp"
#include "clm/device/device_memory.hpp"

namespace {

using clm_bench::check;
using clm_bench::device_alloc;
using clm_bench::gbps;
using clm_bench::memcpy_gbps;
using clm_bench::report;
using clm_bench::time_ms;
using clm_bench::time_ms_pipelined;

constexpr std::string_view kBench = "cuda_clm";

void check(cublasStatus_t err, const char* what) {
  if (err != CUBLAS_STATUS_SUCCESS) clm_bench::die(fmt::format("{}: {}", what, cublasGetStatusString(err)));
}

std::vector<float> uniform(std::size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Random activations in [-1, 1] in `dtype` (never constants: timings on
// uniform data can flatter the hardware).
void fill_activations(void* dst, clm::ActDType dtype, std::size_t n, std::mt19937_64& rng) {
  const std::vector<float> f = uniform(n, -1.0f, 1.0f, rng);
  if (dtype == clm::ActDType::f32) {
    check(cudaMemcpy(dst, f.data(), n * 4, cudaMemcpyHostToDevice), "upload");
    return;
  }
  std::vector<std::uint16_t> h(n);
  for (std::size_t i = 0; i < n; ++i) {
    h[i] = dtype == clm::ActDType::bf16 ? clm::detail::f32_to_bf16(f[i]) : clm::detail::f32_to_f16(f[i]);
  }
  check(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
}

constexpr int kPipelined = 20;  // back-to-back calls per timed run (head and its cuBLAS baseline alike)

std::int32_t g_hidden = 4096;
std::int32_t g_shrink = 1;

struct HeadShape {
  const char* label;
  std::int32_t batch;
  std::int32_t tokens_per_seq;
};

void bench_head(cudaStream_t stream, cublasHandle_t blas, double big_memcpy_gbps, clm::ActDType dtype,
                const HeadShape& s) {
  std::mt19937_64 rng(11);
  const std::int32_t hidden = g_hidden;
  const std::int32_t inner = hidden / 4;
  const std::int32_t batch = std::max(1, s.batch / g_shrink);
  const std::int32_t per = std::max(1, s.tokens_per_seq / g_shrink);
  const std::size_t tokens = static_cast<std::size_t>(batch) * per;
  clm::SrcHeadWeights w;
  w.hidden = hidden;
  w.w1 = uniform(static_cast<std::size_t>(inner) * hidden, -0.03f, 0.03f, rng);
  w.b1 = uniform(static_cast<std::size_t>(inner), -0.1f, 0.1f, rng);
  w.w2 = uniform(static_cast<std::size_t>(inner), -0.1f, 0.1f, rng);
  std::unique_ptr<clm::cuda::DeviceSrcHead> head;
  check(clm::cuda::DeviceSrcHead::create(0, w, clm::Gelu::tanh, head), "DeviceSrcHead::create");

  void* attn = device_alloc<unsigned char>(tokens * hidden * clm::kv_dtype_bytes(dtype));
  fill_activations(attn, dtype, tokens * hidden, rng);
  std::vector<std::int32_t> ids(tokens);
  for (std::size_t t = 0; t < tokens; ++t) ids[t] = static_cast<std::int32_t>(100 + t % 1000);
  auto* d_ids = device_alloc<std::int32_t>(tokens);
  check(cudaMemcpy(d_ids, ids.data(), tokens * 4, cudaMemcpyHostToDevice), "upload ids");
  std::vector<std::int32_t> indptr{0};
  for (std::int32_t b = 0; b < batch; ++b) indptr.push_back(indptr.back() + per);
  const std::vector<std::int32_t> special = {128000, 128001, 128009};
  auto* d_scores = device_alloc<float>(static_cast<std::size_t>(batch));
  const clm::ConstActivationView view{attn, dtype, static_cast<std::int64_t>(tokens), hidden};

  const auto score_async = [&] {
    check(head->score_async(view, d_ids, indptr, special, d_scores, stream), "score_async");
  };
  const double head_ms = time_ms_pipelined(stream, 3, 15, kPipelined, score_async);
  const double head_single_ms = time_ms(stream, 3, 30, score_async);
  check(head->check(stream), "check");
  std::vector<float> host_scores(static_cast<std::size_t>(batch));
  const double sync_ms =
      time_ms(stream, 2, 10, [&] { check(head->score(view, d_ids, indptr, special, host_scores, stream), "score"); });

  // cuBLAS alone at the same shape: Z^T [inner x batch] = W1 (T) x H^T, f32.
  auto* d_w1 = device_alloc<float>(w.w1.size());
  check(cudaMemcpy(d_w1, w.w1.data(), w.w1.size() * 4, cudaMemcpyHostToDevice), "upload w1");
  auto* d_h = device_alloc<float>(static_cast<std::size_t>(batch) * hidden);
  auto* d_z = device_alloc<float>(static_cast<std::size_t>(batch) * inner);
  fill_activations(d_h, clm::ActDType::f32, static_cast<std::size_t>(batch) * hidden, rng);  // means-like, not zeros
  check(cublasSetStream(blas, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const auto gemm = [&] {
    check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, inner, batch, hidden, &one, d_w1, CUDA_R_32F, hidden, d_h,
                       CUDA_R_32F, hidden, &zero, d_z, CUDA_R_32F, inner, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  const double gemm_ms = time_ms_pipelined(stream, 3, 15, kPipelined, gemm);
  const double gemm_single_ms = time_ms(stream, 3, 30, gemm);

  const double flop = 2.0 * batch * static_cast<double>(hidden) * inner;
  const std::string name =
      fmt::format("src_head/{}/{}/b{}/tok{}/h{}", s.label, clm::kv_dtype_name(dtype), batch, per, hidden);
  const bool decode = per == 1;
  report(kBench, name, "effective_gemm_TFLOPs", flop / (head_ms * 1e-3) / 1e12, "TFLOP/s", "cublas_gemm_TFLOPs",
         flop / (gemm_ms * 1e-3) / 1e12, decode ? 0.6 : 0);
  if (!decode) {
    const double bytes = static_cast<double>(tokens) * hidden * static_cast<double>(clm::kv_dtype_bytes(dtype)) +
                         static_cast<double>(w.w1.size()) * 4.0;
    report(kBench, name, "read_GBps(attn_out+W1)", gbps(bytes, head_ms), "GB/s", "d2d_memcpy_read_plus_write_GBps",
           big_memcpy_gbps, 0.6);
  }
  report(kBench, name, "us_per_score_async", head_ms * 1e3, "us", "us_cublas_gemm_alone", gemm_ms * 1e3);
  report(kBench, name, "us_per_score_async_one_call", head_single_ms * 1e3, "us", "us_cublas_gemm_alone_one_call",
         gemm_single_ms * 1e3);
  report(kBench, name, "us_per_score_sync", sync_ms * 1e3, "us", "us_per_score_async", head_ms * 1e3);
  for (void* p : {static_cast<void*>(d_w1), static_cast<void*>(d_h), static_cast<void*>(d_z), attn,
                  static_cast<void*>(d_ids), static_cast<void*>(d_scores)}) {
    cudaFree(p);
  }
}

struct AdapterShape {
  const char* label;
  std::int32_t batch;
  std::int32_t tokens_per_seq;
};

void bench_adapter(cudaStream_t stream, clm::ActDType dtype, const AdapterShape& s) {
  std::mt19937_64 rng(12);
  const std::int32_t hidden = g_hidden;
  const std::int32_t sdim = 256;
  const std::int32_t batch = std::max(1, s.batch / g_shrink);
  const std::int32_t per = std::max(1, s.tokens_per_seq / g_shrink);
  const std::size_t rows = static_cast<std::size_t>(batch) * per;
  clm::SnapshotAdapterWeights w;
  w.snapshot_dim = sdim;
  w.hidden = hidden;
  w.weight = uniform(static_cast<std::size_t>(hidden) * sdim, -0.05f, 0.05f, rng);
  w.bias = uniform(static_cast<std::size_t>(hidden), -0.05f, 0.05f, rng);
  clm::SnapshotAdapterConfig cfg;
  cfg.num_layers = 32;
  std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
  check(clm::cuda::DeviceSnapshotAdapter::create(0, w, cfg, adapter), "DeviceSnapshotAdapter::create");
  const std::size_t bytes = rows * hidden * clm::kv_dtype_bytes(dtype);
  void* hs = device_alloc<unsigned char>(bytes);
  fill_activations(hs, dtype, rows * hidden, rng);
  auto* snaps = device_alloc<float>(static_cast<std::size_t>(batch) * sdim);
  const std::vector<float> sv = uniform(static_cast<std::size_t>(batch) * sdim, -1.0f, 1.0f, rng);
  check(cudaMemcpy(snaps, sv.data(), sv.size() * 4, cudaMemcpyHostToDevice), "upload snapshots");
  std::vector<std::int32_t> indptr{0};
  for (std::int32_t b = 0; b < batch; ++b) indptr.push_back(indptr.back() + per);
  const clm::ActivationView view{hs, dtype, static_cast<std::int64_t>(rows), hidden};
  const std::int32_t layer = cfg.num_layers - 1;
  check(adapter->prepare(snaps, batch, stream), "prepare");
  const double apply_ms =
      time_ms(stream, 3, 30, [&] { check(adapter->apply(view, indptr, {}, layer, stream), "apply"); });
  const double inject_ms =
      time_ms(stream, 3, 30, [&] { check(adapter->inject(view, indptr, snaps, {}, layer, stream), "inject"); });
  const double copy_gbps = memcpy_gbps(stream, bytes, 3, 20);
  const std::string name =
      fmt::format("adapter/{}/{}/b{}/tok{}/h{}/s{}", s.label, clm::kv_dtype_name(dtype), batch, per, hidden, sdim);
  report(kBench, name, "apply_GBps", gbps(2.0 * static_cast<double>(bytes), apply_ms), "GB/s",
         "d2d_memcpy_same_bytes_GBps", copy_gbps, per > 1 ? 0.6 : 0);
  report(kBench, name, "inject_GBps", gbps(2.0 * static_cast<double>(bytes), inject_ms), "GB/s",
         "d2d_memcpy_same_bytes_GBps", copy_gbps);
  report(kBench, name, "us_per_apply", apply_ms * 1e3, "us", "us_d2d_memcpy_same_bytes",
         2.0 * static_cast<double>(bytes) / (copy_gbps * 1e9) * 1e6);
  cudaFree(hs);
  cudaFree(snaps);
}

}  // namespace

int main() {
  if (clm_bench::skip_without_device()) return 0;
  if (clm_bench::smoke_run()) {
    g_shrink = 8;
    g_hidden = 1024;
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t blas;
  check(cublasCreate(&blas), "cublasCreate");
  const double big_memcpy = memcpy_gbps(stream, (std::size_t{1} << 30) / static_cast<std::size_t>(g_shrink), 3, 20);

  const HeadShape heads[] = {{"decode", 64, 1}, {"decode", 512, 1}, {"prefill", 8, 512}};
  for (clm::ActDType dtype : {clm::ActDType::f32, clm::ActDType::bf16}) {
    for (const HeadShape& s : heads) bench_head(stream, blas, big_memcpy, dtype, s);
  }
  const AdapterShape adapters[] = {{"decode", 64, 1}, {"decode", 512, 1}, {"prefill", 8, 512}};
  for (clm::ActDType dtype : {clm::ActDType::f32, clm::ActDType::bf16}) {
    for (const AdapterShape& s : adapters) bench_adapter(stream, dtype, s);
  }
  cublasDestroy(blas);
  check(cudaStreamSynchronize(stream), "synchronize");
  cudaStreamDestroy(stream);
  clm_bench::write_markdown_if_asked();
  return 0;
}
