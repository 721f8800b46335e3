// tests/bench/bench_cuda_common.hpp: what the CUDA benchmark programs
// (bench_cuda_kernels, bench_cuda_clm) share on top of bench_common.hpp:
//
//   skip_without_device()  "<program>: SKIPPED (no usable CUDA device: ...)" on
//                          stderr where there is none; the bench then exits 0
// (with smoke_run() of bench_common.hpp, CLM_BENCH_SMOKE=1, a CUDA bench
// shrinks every shape and times each call once: a check of the program)
//   check(cudaError_t)     die on a failed CUDA runtime call
//   device_alloc           cudaMalloc of n T (at least 16 bytes)
//   time_ms, gbps          the median of event-timed runs on a stream; GB/s
//   time_ms_pipelined      the same per call, over back-to-back calls per run
//   memcpy_gbps            the device-to-device cudaMemcpy baseline
//   report                 print_figure, and a row kept for the markdown table
//                          that write_markdown_if_asked() writes to the file
//                          named by CLM_BENCH_MARKDOWN (tests/gpu/run.sh)
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "clm/device/device_memory.hpp"

namespace clm_bench {

inline void check(cudaError_t err, std::string_view what) {
  if (err != cudaSuccess) die(fmt::format("{}: {}", what, cudaGetErrorString(err)));
}

inline bool skip_without_device() {
  std::string reason;
  if (clm::cuda_device_count(&reason) > 0) return false;
  fmt::print(stderr, "{}: SKIPPED (no usable CUDA device: {})\n", program_name(), reason);
  return true;
}

// Device memory for `count` T (at least 16 bytes), freed with cudaFree.
template <class T>
T* device_alloc(std::size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(count * sizeof(T), 16)), "cudaMalloc");
  return static_cast<T*>(p);
}

inline double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

// Median time in ms of `runs` calls of f on `stream`, each timed with events,
// after `warmup` untimed calls.
template <class F>
double time_ms(cudaStream_t stream, int warmup, int runs, F&& f) {
  if (smoke_run()) {
    warmup = 0;
    runs = 1;
  }
  for (int i = 0; i < warmup; ++i) f();
  check(cudaStreamSynchronize(stream), "warmup");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(std::move(ms));
}

// Median time in ms per call of f when `per_run` calls go back to back
// between two events (as a decode loop enqueues them: the host's enqueue cost
// overlaps the device's work instead of leaving the device idle before each call).
template <class F>
double time_ms_pipelined(cudaStream_t stream, int warmup, int runs, int per_run, F&& f) {
  if (smoke_run()) per_run = 2;
  return time_ms(stream, warmup, runs,
                 [&] {
                   for (int i = 0; i < per_run; ++i) f();
                 }) /
         per_run;
}

// Device-to-device cudaMemcpy of `bytes` on `stream`: bytes read + written per
// second (GB/s), the median of `runs` after `warmup`.
inline double memcpy_gbps(cudaStream_t stream, std::size_t bytes, int warmup, int runs) {
  void* a = device_alloc<unsigned char>(bytes);
  void* b = device_alloc<unsigned char>(bytes);
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  const double ms = time_ms(stream, warmup, runs, [&] {
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  });
  cudaFree(a);
  cudaFree(b);
  return gbps(2.0 * static_cast<double>(bytes), ms);
}

// A reported figure, as the markdown table shows it.
struct Figure {
  std::string name, metric, unit, baseline_metric;
  double value, baseline;
  double target;  // ratio to reach; 0: none
};
inline std::vector<Figure> g_figures;

// print_figure, and the figure kept for write_markdown_if_asked.
inline void report(std::string_view bench, const std::string& name, const char* metric, double value, const char* unit,
                   const char* baseline_metric, double baseline, double target = 0) {
  print_figure(bench, name, metric, value, unit, baseline_metric, baseline);
  g_figures.push_back(Figure{name, metric, unit, baseline_metric, value, baseline, target});
}

// With CLM_BENCH_MARKDOWN=<file>: the reported figures as a markdown table there.
inline void write_markdown_if_asked() {
  const char* path = std::getenv("CLM_BENCH_MARKDOWN");
  if (!path) return;
  std::ofstream md(path);
  md << "| case | metric | value | baseline | ratio | target |\n|---|---|---:|---:|---:|---|\n";
  for (const Figure& f : g_figures) {
    const double r = ratio(f.value, f.baseline);
    md << "| " << f.name << " | " << f.metric << " | " << fmt::format("{:.2f} {}", f.value, f.unit) << " | "
       << fmt::format("{:.2f} ({})", f.baseline, f.baseline_metric) << " | " << fmt::format("{:.3f}", r) << " | "
       << (f.target > 0 ? fmt::format(">= {:.2f} {}", f.target, r >= f.target ? "met" : "**missed**") : "") << " |\n";
  }
}

}  // namespace clm_bench
