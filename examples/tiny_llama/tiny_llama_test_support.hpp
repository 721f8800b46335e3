// examples/tiny_llama/tiny_llama_test_support.hpp: what the decoder tests
// share (test_tiny_llama, test_clm_loop, and the CUDA decoder's
// tests/gpu/test_cuda_llama.cpp): a small model shape, an engine + decoder +
// generator, and the equality proof's machinery (conversations run with the
// cache and recomputed without it, every step's logits compared).
//
//   const LlamaConfig c = tiny_llama_test::small_config(3);
//   tiny_llama_test::Stack s = tiny_llama_test::make_stack(c, weights, engine_config(c, 16, 4096));
//   const auto results = tiny_llama_test::generate(s, {prompt}, {options});
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "byte_tokenizer.hpp"
#include "decoder.hpp"
#include "generator.hpp"

namespace tiny_llama_test {

using tiny_llama::ByteTokenizer;
using tiny_llama::GenerateOptions;
using tiny_llama::GenerationResult;
using tiny_llama::LlamaConfig;

// Hidden 64, 4 heads over 2 KV heads of 16: seconds per test, GQA included.
inline tiny_llama::LlamaConfig small_config(std::int32_t num_layers) {
  tiny_llama::LlamaConfig c;
  c.vocab_size = 300;
  c.hidden = 64;
  c.intermediate = 160;
  c.num_layers = num_layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position = 2048;
  return c;
}

// A host pool of f32 KV (set e.pool.memory for a device one).
inline clm::EngineConfig engine_config(const LlamaConfig& c, std::int32_t page_size, std::int32_t pool_tokens) {
  clm::EngineConfig e;
  e.pool = tiny_llama::kv_pool_for(c, page_size, pool_tokens, clm::KvDType::f32);
  return e;
}

struct Stack {  // an engine, a decoder over it (make_decoder: by where the pool lives) and a generator
  std::unique_ptr<clm::Engine> engine;
  std::unique_ptr<tiny_llama::Decoder> model;
  std::unique_ptr<tiny_llama::Generator> generator;
};

inline Stack make_stack(const tiny_llama::LlamaConfig& c, const tiny_llama::LlamaWeights& w, const clm::EngineConfig& e,
                        int threads = 2, std::int64_t workspace_rows = 0) {
  Stack s;
  const clm::Status created = clm::Engine::create(e, s.engine);
  INFO(created.message());
  REQUIRE(created.ok());
  const clm::Status made =
      tiny_llama::make_decoder(c, w, *s.engine, {.threads = threads, .workspace_rows = workspace_rows}, s.model);
  INFO(made.message());
  REQUIRE(made.ok());
  s.generator = std::make_unique<tiny_llama::Generator>(*s.model, tiny_llama::GeneratorOptions{});
  return s;
}

// Runs requests to completion together (continuous batching), in order of
// submission; the engine's invariants hold after each request and at the end.
inline std::vector<GenerationResult> generate(Stack& s, const std::vector<std::vector<std::int32_t>>& prompts,
                                              const std::vector<GenerateOptions>& options) {
  std::vector<GenerationResult> results(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    s.generator->submit(prompts[i], options[i], nullptr, [&s, &results, i](const GenerationResult& r) {
      results[i] = r;
      // The request's pages are published or released by now.
      const clm::Status invariants = s.engine->check_invariants();
      INFO(invariants.message());
      REQUIRE(invariants.ok());
    });
  }
  const clm::Status ran = s.generator->run_until_idle();
  REQUIRE(ran.ok());
  for (const GenerationResult& r : results) {
    INFO(r.status.message());
    REQUIRE(r.status.ok());
  }
  const clm::Status invariants = s.engine->check_invariants();
  INFO(invariants.message());
  REQUIRE(invariants.ok());
  return results;
}

inline double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// ---- conversations ----------------------------------------------------------
struct Conversation {
  std::string salt;
  std::vector<std::int32_t> history;  // every token so far, answers included
};

inline std::vector<std::int32_t> random_text(std::mt19937& rng, int min_len, int max_len) {
  std::uniform_int_distribution<int> len(min_len, max_len), byte(0, 255);
  std::vector<std::int32_t> out(static_cast<std::size_t>(len(rng)));
  for (auto& t : out) t = byte(rng);
  return out;
}

// Turn after turn over interleaved conversations: the cached run answers, then a
// full recompute (no cache, a fresh engine) answers the same prompts; every
// step's logits must agree. Returns the cached run's results.
struct EqualityRun {
  std::int64_t cached_tokens = 0, host_tokens = 0, storage_tokens = 0, prompt_tokens = 0;
  double worst_error = 0;
};

inline void expect_same(const GenerationResult& cached, const GenerationResult& recomputed, std::int32_t vocab,
                        EqualityRun& run) {
  REQUIRE(cached.tokens == recomputed.tokens);
  REQUIRE(cached.logits.size() == recomputed.logits.size());
  for (std::size_t step = 0; step < cached.tokens.size(); ++step) {
    const std::size_t at = step * static_cast<std::size_t>(vocab);
    const double error = relative_error(std::span(cached.logits).subspan(at, static_cast<std::size_t>(vocab)),
                                        std::span(recomputed.logits).subspan(at, static_cast<std::size_t>(vocab)));
    run.worst_error = std::max(run.worst_error, error);
    INFO("step " << step << " relative error " << error);
    REQUIRE(error <= 1e-5);
  }
}

inline EqualityRun run_conversations(Stack& cached, Stack& baseline, std::uint32_t seed, int tenants, int conversations,
                                     int turns, const std::vector<std::int32_t>& system_prompt) {
  std::mt19937 rng(seed);
  const std::int32_t vocab = cached.model->config().vocab_size;
  std::vector<Conversation> convs;
  for (int i = 0; i < conversations; ++i) {
    Conversation conv{fmt::format("tenant-{}", i % tenants), {ByteTokenizer::kBeginOfText}};
    conv.history.insert(conv.history.end(), system_prompt.begin(), system_prompt.end());
    convs.push_back(std::move(conv));
  }
  EqualityRun run;
  for (int turn = 0; turn < turns; ++turn) {
    // A few conversations at once, so that prefill and decode rows share batches.
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<GenerateOptions> cached_options, baseline_options;
    for (Conversation& conv : convs) {
      ByteTokenizer::append_header("user", conv.history);
      const auto question = random_text(rng, 5, 40);
      conv.history.insert(conv.history.end(), question.begin(), question.end());
      conv.history.push_back(ByteTokenizer::kEndOfTurn);
      ByteTokenizer::append_header("assistant", conv.history);
      prompts.push_back(conv.history);
      GenerateOptions o;
      o.max_new_tokens = std::uniform_int_distribution<int>(1, 12)(rng);
      o.temperature = turn % 2 == 0 ? 0.0f : 0.8f;
      o.seed = rng();
      o.cache_salt = conv.salt;
      o.keep_logits = true;
      cached_options.push_back(o);
      o.use_cache = false;
      baseline_options.push_back(o);
    }
    const auto with_cache = generate(cached, prompts, cached_options);
    const auto recomputed = generate(baseline, prompts, baseline_options);
    for (std::size_t i = 0; i < convs.size(); ++i) {
      INFO("turn " << turn << " conversation " << i);
      REQUIRE(recomputed[i].cached_tokens == 0);
      expect_same(with_cache[i], recomputed[i], vocab, run);
      run.cached_tokens += with_cache[i].cached_tokens;
      run.host_tokens += with_cache[i].host_tokens;
      run.storage_tokens += with_cache[i].storage_tokens;
      run.prompt_tokens += with_cache[i].prompt_tokens;
      // The answer (minus the last token, whose K/V were never computed) ends the turn.
      auto& h = convs[i].history;
      h.insert(h.end(), with_cache[i].tokens.begin(), with_cache[i].tokens.end());
      h.push_back(ByteTokenizer::kEndOfTurn);
    }
  }
  return run;
}

}  // namespace tiny_llama_test
