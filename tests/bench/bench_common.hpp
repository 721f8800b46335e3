// tests/bench/bench_common.hpp: what the benchmark programs of tests/bench share
// (header-only, no CUDA; bench_cuda_common.hpp adds the GPU side): timing with
// a steady clock, the median of a sample, interleaved part/baseline medians,
// die/check for fatal errors, smoke_run (CLM_BENCH_SMOKE=1), and
// print_figure, the one JSON line each figure is printed as:
//
//   {"bench":"kernels","case":"decode_f32_b8_8k","metric":"kv_read_GB_per_s","value":41.2345,"unit":"GB/s",
//    "baseline_metric":"stream_read_GB_per_s","baseline":52.0112,"ratio":0.7928}
//
// value and baseline are printed with {:.6g}, ratio = value / baseline with
// {:.4f} (0 where the baseline is 0). Messages on stderr start with the
// program's name ("bench_kernels: ..."), as glibc's program_invocation_short_name
// gives it.
#pragma once

#include <algorithm>
#include <cerrno>  // program_invocation_short_name (glibc, _GNU_SOURCE)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "clm/status.hpp"

namespace clm_bench {

using Clock = std::chrono::steady_clock;

// A switch in the environment: set to anything but "" or "0" (as
// tests/bench/report.sh reads CLM_BENCH_SMOKE).
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

// CLM_BENCH_SMOKE=1: a quick run of the program itself (ctest, the report's
// smoke test): small shapes, one run each; its figures mean little.
inline bool smoke_run() { return env_flag("CLM_BENCH_SMOKE"); }

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The median of `values`: the middle one, or the mean of the middle two for an
// even count (NaN for none).
inline double median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// The name messages on stderr start with: the executable's file name.
inline const char* program_name() { return program_invocation_short_name; }

// "<program>: <what>" on stderr, then exit 1.
[[noreturn]] inline void die(std::string_view what) {
  fmt::print(stderr, "{}: {}\n", program_name(), what);
  std::exit(1);
}
inline void check(const clm::Status& s) {
  if (!s.ok()) die(s.message());
}
// The same, naming the call that failed and the status code.
inline void check(const clm::Status& s, std::string_view what) {
  if (!s.ok()) die(fmt::format("{}: {}: {}", what, s.code_name(), s.message()));
}

// The medians, in seconds, of `runs` interleaved pairs of part() and
// baseline() (each returns the seconds it measured), after one warm-up pair:
// interleaving makes the drift of a shared machine hit both alike.
struct PairedMedians {
  double part;
  double baseline;
};
template <class Part, class Baseline>
PairedMedians interleaved_medians(int runs, Part&& part, Baseline&& baseline) {
  std::vector<double> part_s, base_s;
  for (int r = 0; r <= runs; ++r) {
    const double p = part();
    const double b = baseline();
    if (r == 0) continue;  // warm-up
    part_s.push_back(p);
    base_s.push_back(b);
  }
  return {median(std::move(part_s)), median(std::move(base_s))};
}

inline double ratio(double value, double baseline) { return baseline != 0 ? value / baseline : 0.0; }

// One figure as one JSON line on stdout (flushed, so that a bench that dies
// later still leaves what it has measured).
inline void print_figure(std::string_view bench, std::string_view bench_case, std::string_view metric, double value,
                         std::string_view unit, std::string_view baseline_metric, double baseline) {
  fmt::print(
      "{{\"bench\":\"{}\",\"case\":\"{}\",\"metric\":\"{}\",\"value\":{:.6g},\"unit\":\"{}\","
      "\"baseline_metric\":\"{}\",\"baseline\":{:.6g},\"ratio\":{:.4f}}}\n",
      bench, bench_case, metric, value, unit, baseline_metric, baseline, ratio(value, baseline));
  std::fflush(stdout);
}

}  // namespace clm_bench
