// examples/tiny_llama/sampling.hpp: how the generator picks each token from
// the model's logits: OpenAI's presence and frequency penalties over the
// tokens generated so far, then greedy (temperature 0) or a draw from the
// softmax at the temperature, cut to vLLM's top_k and OpenAI's top_p
// (nucleus) first.
//
//   tiny_llama::SamplingParams p{.temperature = 0.7f, .top_p = 0.9f, .top_k = 40};
//   std::int32_t token = tiny_llama::sample_token(logits, generated_so_far, p, uniform_0_1);
//
// All in double. With top_p 1, top_k 0 and no penalties a draw is the
// inverse CDF over ids in ascending order, and greedy takes the lowest id
// among equal maxima, so a given `u` always picks the same token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <unordered_map>
#include <vector>

namespace tiny_llama {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy
  float top_p = 1.0f;              // (0, 1]: the smallest set of most likely tokens whose mass reaches it
  std::int32_t top_k = 0;          // 0: every token; k: the k most likely (ties: lower id first)
  float presence_penalty = 0.0f;   // [-2, 2], subtracted once from every token already generated
  float frequency_penalty = 0.0f;  // [-2, 2], subtracted per time it was generated
};

// `u` in [0, 1): the draw (unused when greedy).
inline std::int32_t sample_token(std::span<const float> logits, std::span<const std::int32_t> generated,
                                 const SamplingParams& p, double u) {
  const std::size_t vocab = logits.size();
  std::vector<double> z(logits.begin(), logits.end());
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<std::int32_t, int> counts;
    for (std::int32_t t : generated) ++counts[t];
    for (const auto& [token, count] : counts) {
      if (token < 0 || static_cast<std::size_t>(token) >= vocab) continue;
      z[static_cast<std::size_t>(token)] -=
          static_cast<double>(p.frequency_penalty) * static_cast<double>(count) + p.presence_penalty;
    }
  }
  if (p.temperature == 0.0f) {
    return static_cast<std::int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  }
  const double top = *std::max_element(z.begin(), z.end());
  std::vector<double> weights(vocab);
  for (std::size_t i = 0; i < vocab; ++i) weights[i] = std::exp((z[i] - top) / p.temperature);
  const bool cut_k = p.top_k > 0 && static_cast<std::size_t>(p.top_k) < vocab;
  if (cut_k || p.top_p < 1.0f) {
    // Most likely first (lower id first among equals): keep a prefix, zero the rest.
    std::vector<std::int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int32_t a, std::int32_t b) { return weights[a] > weights[b]; });
    std::size_t keep = cut_k ? static_cast<std::size_t>(p.top_k) : vocab;
    if (p.top_p < 1.0f) {
      double mass = 0.0;
      for (std::size_t i = 0; i < keep; ++i) mass += weights[order[i]];
      double running = 0.0;
      for (std::size_t i = 0; i < keep; ++i) {
        running += weights[order[i]];
        if (running >= p.top_p * mass) {
          keep = i + 1;
          break;
        }
      }
    }
    for (std::size_t i = keep; i < vocab; ++i) weights[order[i]] = 0.0;
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  double left = u * total;
  std::int32_t last_kept = 0;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (weights[i] == 0.0) continue;
    last_kept = static_cast<std::int32_t>(i);
    left -= weights[i];
    if (left < 0.0) return last_kept;
  }
  return last_kept;  // rounding at the top end
}

}  // namespace tiny_llama
