// clm/model/src_gate.hpp: when an SRC score turns into a snapshot injection, and the
// breaker that stops a sequence from retrying a retrieval that keeps failing.
// Pure logic with no locks; SrcTracker (src_tracker.hpp) holds one gate state
// per running sequence.
//
//   clm::SrcGateConfig config;           // daily_requests = 10000 -> threshold 0.8
//   const float threshold = clm::src_threshold(config);
//   clm::SrcGateState state;
//   if (clm::src_gate_decide(config, threshold, score, state)) {
//     bool found = look_up_snapshot(...);
//     clm::src_gate_report(config, found, state);  // 3 failed hits in a row: baseline
//   }
//
// The threshold follows traffic: 0.8 + 0.05 * log10(daily_requests / 10000),
// clamped to [0.7, 0.95]. Busy services have more snapshots to match against,
// and can afford to be pickier; quiet ones take what they can get.
// The breaker: after `breaker_steps` consecutive steps of one sequence with a
// score above `breaker_score` whose snapshot retrieval failed, the sequence
// falls back to baseline mode (no injection) for the rest of its life: a head
// that is confidently wrong about one conversation should stop costing a
// lookup per step. A step that does not count (lower score, retrieval found,
// or no gate pass) ends the streak.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "clm/status.hpp"

namespace clm {

struct SrcGateConfig {
  double daily_requests = 10000.0;   // the service's expected traffic (requests/day), > 0
  float threshold_override = -1.0f;  // in [0, 1] to fix the threshold; < 0 = from daily_requests
  float breaker_score = 0.95f;       // scores above this whose retrieval fails count toward the breaker
  std::int32_t breaker_steps = 3;    // consecutive such steps that switch a sequence to baseline; >= 1
};

inline float src_threshold_for_traffic(double daily_requests) {
  if (!(daily_requests > 0.0)) return 0.7f;  // log10 of 0 or less: the bottom of the clamp
  const double t = 0.8 + 0.05 * std::log10(daily_requests / 10000.0);
  return static_cast<float>(std::clamp(t, 0.7, 0.95));
}

inline float src_threshold(const SrcGateConfig& config) {
  return config.threshold_override >= 0.0f ? config.threshold_override
                                           : src_threshold_for_traffic(config.daily_requests);
}

inline Status check_src_gate_config(const SrcGateConfig& config) {
  if (!(config.daily_requests > 0.0) || !std::isfinite(config.daily_requests)) {
    return invalid_argument("SrcGateConfig: daily_requests must be a finite number > 0");
  }
  if (std::isnan(config.threshold_override) || config.threshold_override > 1.0f) {
    return invalid_argument("SrcGateConfig: threshold_override must be in [0, 1], or < 0 for the default");
  }
  if (!(config.breaker_score >= 0.0f && config.breaker_score <= 1.0f)) {
    return invalid_argument("SrcGateConfig: breaker_score must be in [0, 1]");
  }
  if (config.breaker_steps < 1) {
    return invalid_argument("SrcGateConfig: breaker_steps must be >= 1, got " + std::to_string(config.breaker_steps));
  }
  return Status::success();
}

// One sequence's gate.
struct SrcGateState {
  std::int32_t failed_streak = 0;  // consecutive high-score steps whose retrieval failed
  bool baseline = false;           // the breaker tripped: never inject again
  bool awaiting_report = false;    // the last step passed the gate with a score above breaker_score
};

// Whether this step should look up a snapshot and inject it: the score passes
// the threshold and the sequence is not in baseline mode.
inline bool src_gate_decide(const SrcGateConfig& config, float threshold, float score, SrcGateState& state) {
  const bool pass = !state.baseline && score >= threshold;
  if (pass && score > config.breaker_score) {
    state.awaiting_report = true;  // counts only once its retrieval is reported failed
  } else {
    state.awaiting_report = false;
    state.failed_streak = 0;
  }
  return pass;
}

// The outcome of the lookup the last decide asked for. Returns true when this
// report tripped the breaker.
inline bool src_gate_report(const SrcGateConfig& config, bool found, SrcGateState& state) {
  if (!state.awaiting_report) {
    if (found) state.failed_streak = 0;
    return false;
  }
  state.awaiting_report = false;
  if (found) {
    state.failed_streak = 0;
    return false;
  }
  if (++state.failed_streak >= config.breaker_steps && !state.baseline) {
    state.baseline = true;
    return true;
  }
  return false;
}

}  // namespace clm
