// examples/demo/demo_run.hpp: drives a scenario (scenario.hpp) through a
// tiny_llama Generator, step by step: user u's first question arrives at
// step u * arrival_gap_steps, each next question as soon as the answer to the
// previous one is complete; every request is recorded with where its cached
// tokens came from and its time to first token. Shared by `make demo` and
// bench_e2e.
//
//   tiny_llama_demo::RunReport report;
//   CLM_RETURN_IF_ERROR(tiny_llama_demo::run_scenario(generator, scenario, {.use_cache = true}, report));
//   // report.requests[i].result.ttft_seconds, .cached_tokens, ...
//
// Answers are exactly max_new_tokens long (no stop token), so a run with the
// cache and one without see prompts of the same lengths, whatever the model
// samples: the comparison is between equal amounts of work.
//
// Conversations are byte tokens in the Llama-3-style template of
// byte_tokenizer.hpp, or, with RunOptions::tokenizer, a Hugging Face
// tokenizer's ids in Qwen's ChatML (examples/tokenizer); then each request
// also records how many byte tokens the same conversation would have been.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "generator.hpp"
#include "scenario.hpp"

namespace clm_tokenizer {
class HfTokenizer;
}

namespace tiny_llama_demo {

// Where a request's prompt says the time (a clock that moves a second a
// request): the prefix cache's third pitfall (docs/observability.md).
enum class Timestamp {
  none,
  system_top,  // "Current time: HH:MM:SS" opens the system prompt: every request differs from there on
  prompt_end,  // "(sent at HH:MM:SS)" ends the user's message: only the new message differs
};

struct RunOptions {
  bool use_cache = true;
  std::int32_t max_new_tokens = 24;
  float temperature = 0.8f;
  std::string label = "run";  // shown on the progress bar
  bool progress = true;       // a progress bar on stderr (a line per 10% when it is not a terminal)
  // Called for each request before it is submitted: a host's per-request
  // setup (e.g. the CLM suffix); may change the options.
  std::function<void(std::int32_t user, std::int32_t turn, const Question&, tiny_llama::GenerateOptions&)> prepare;
  // The conversations' tokenizer (outlives the run); null: the byte tokenizer.
  const clm_tokenizer::HfTokenizer* tokenizer = nullptr;
  Timestamp timestamp = Timestamp::none;  // byte tokens only
  std::string tenant;                     // GenerateOptions::tenant of every request
};

struct RequestRecord {
  std::int32_t user = 0;
  std::int32_t turn = 0;
  Question question;
  tiny_llama::GenerationResult result;
  // The same conversation's prompt in byte tokens (the answers so far as the
  // text they decode to): result.prompt_tokens when the run uses byte tokens.
  std::int64_t byte_prompt_tokens = 0;
};

struct RunReport {
  std::vector<RequestRecord> requests;  // in order of completion
  double wall_seconds = 0;
  std::int64_t steps = 0;
};

clm::Status run_scenario(tiny_llama::Generator& generator, const Scenario& scenario, const RunOptions& options,
                         RunReport& out);

// The p-quantile (0..1, nearest rank) of `values`; 0 when empty.
double quantile(std::vector<double> values, double p);

}  // namespace tiny_llama_demo
