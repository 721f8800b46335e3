// examples/demo/divergence_demo.hpp: the demo's divergence passes. The
// support bot's scenario runs again with the cache on, its prompts saying the
// time (a clock that moves a second a request): once at the top of the system
// prompt, once at the end of the user's message. A table puts the hit rates
// side by side with the run without a timestamp, and under it the first point
// of each run's divergence report (Engine::divergence_report), its context as
// text: where the prompts split off and how often a later request came back.
//
//   std::vector<tiny_llama_demo::TimestampPass> passes;
//   passes.push_back(tiny_llama_demo::timestamp_pass("no timestamp", report, *engine));
//   ...
//   tiny_llama_demo::print_timestamp_passes(passes);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "clm/engine.hpp"
#include "demo_run.hpp"

namespace tiny_llama_demo {

struct TimestampPass {
  std::string label;
  std::int64_t requests = 0, prompt_tokens = 0, cached_tokens = 0;
  clm::Status report_status;  // the divergence report's, when it could not be taken
  clm::DivergenceReport report;
  double hit_rate() const { return prompt_tokens ? double(cached_tokens) / double(prompt_tokens) : 0.0; }
};

// A finished run's counts and its engine's divergence report (the first point per tenant).
TimestampPass timestamp_pass(std::string label, const RunReport& run, clm::Engine& engine);

// Byte tokens as text a terminal shows: the template's markers by name, bytes
// that are not printable ASCII or UTF-8 as \xNN, line ends as \n.
std::string render_byte_tokens(std::span<const std::int32_t> tokens);

void print_timestamp_passes(const std::vector<TimestampPass>& passes);

}  // namespace tiny_llama_demo
