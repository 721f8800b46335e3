// examples/tiny_llama/tiny_llama_test_support.hpp: what test_tiny_llama and
// test_clm_loop share: a small model shape and an engine + model + generator.
//
//   const LlamaConfig c = tiny_llama_test::small_config(3);
//   tiny_llama_test::Stack s = tiny_llama_test::make_stack(c, weights, engine_config);
#pragma once

#include <memory>

#include <catch2/catch.hpp>

#include "generator.hpp"

namespace tiny_llama_test {

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

struct Stack {  // an engine, a model over it and a generator
  std::unique_ptr<clm::Engine> engine;
  std::unique_ptr<tiny_llama::LlamaModel> model;
  std::unique_ptr<tiny_llama::Generator> generator;
};

inline Stack make_stack(const tiny_llama::LlamaConfig& c, const tiny_llama::LlamaWeights& w, const clm::EngineConfig& e,
                        int threads = 2) {
  Stack s;
  const clm::Status created = clm::Engine::create(e, s.engine);
  INFO(created.message());
  REQUIRE(created.ok());
  const clm::Status made = tiny_llama::LlamaModel::create(c, w, *s.engine, {.threads = threads}, s.model);
  INFO(made.message());
  REQUIRE(made.ok());
  s.generator = std::make_unique<tiny_llama::Generator>(*s.model, tiny_llama::GeneratorOptions{});
  return s;
}

}  // namespace tiny_llama_test
