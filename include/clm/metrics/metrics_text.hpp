// clm/metrics/metrics_text.hpp: an Engine's metrics as Prometheus text (exposition
// format 0.0.4), what a host serves on GET /metrics, and the fixed-bucket
// histogram EngineMetrics keeps of eviction times.
//
//   std::string body = engine->metrics_text();  // format_metrics_text(engine->metrics())
//   // reply with Content-Type: clm::kMetricsContentType
//
//   # HELP clm_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.
//   # TYPE clm_prefix_cache_queries_total counter
//   clm_prefix_cache_queries_total 5120
//   ...
//   clm_cached_tokens_total{source="host"} 512
//
// Names (docs/metrics.md lists them all): every one starts with `clm_`, so a
// host's own metrics and those of other libraries in its registry never
// collide; counters end in `_total`, gauges do not; units are in the name
// (`_tokens`, `_pages`, `_bytes`, `_seconds`). As in vLLM, the prefix cache's
// queries and hits count prompt tokens, not requests. Every family is always
// present, zero when the engine has no snapshot store or tiers
// (`clm_component_enabled` says which it has), so dashboards see one set of
// series.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>

namespace clm {

struct EngineMetrics;  // engine/engine_metrics.hpp, which includes this header

// The Content-Type of format_metrics_text's output.
inline constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Durations in fixed buckets, upper bounds 100 ns .. 100 ms in 1-2-5 steps,
// then +Inf: fixed, so that recording is a search in 19 doubles and the
// histograms of many engines add up bucket by bucket. (Most evictions of a
// pool without tiers take under a microsecond.)
struct DurationHistogram {
  static constexpr std::array<double, 19> kBounds = {1e-7, 2e-7, 5e-7, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4,
                                                     2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1};
  // counts[i]: observations in (kBounds[i-1], kBounds[i]]; the last one, those above kBounds.back().
  std::array<std::uint64_t, kBounds.size() + 1> counts{};
  double sum_seconds = 0.0;

  void record(double seconds) {
    ++counts[static_cast<std::size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin())];
    sum_seconds += seconds;
  }
  std::uint64_t count() const { return std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}); }
};

// All of `metrics` in the exposition format, one family per counter or gauge
// (HELP and TYPE lines first), '\n' line ends.
std::string format_metrics_text(const EngineMetrics& metrics);

}  // namespace clm
