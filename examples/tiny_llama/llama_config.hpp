// examples/tiny_llama/llama_config.hpp: the shape of a Llama-architecture
// decoder, as Hugging Face's config.json spells it.
//
//   tiny_llama::LlamaConfig config;            // the demo's default: 4 layers, hidden 1024
//   CLM_RETURN_IF_ERROR(tiny_llama::load_llama_config("model/config.json", config));
//   CLM_RETURN_IF_ERROR(config.check());
//
// Fields read from config.json: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (default: the
// attention heads), head_dim (default hidden / heads), rms_norm_eps,
// rope_theta, max_position_embeddings, tie_word_embeddings. Others are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "clm/status.hpp"

namespace tiny_llama {

// The default is small enough for the demo on 2 cores (54M parameters) and has
// Llama's proportions (head_dim 128, MLP 3.5x the hidden size, 4 query heads
// per KV head), so that what a token costs is split between the GEMMs and
// attention over its context as in the models hosts serve. A narrower model
// (hidden 512, head_dim 64) spends a quarter of its prefill on attention over
// a 2,000-token context and shows less of what reuse saves (docs/end-to-end.md).
struct LlamaConfig {
  std::int32_t vocab_size = 384;  // the byte tokenizer's 256 bytes + specials, padded
  std::int32_t hidden = 1024;
  std::int32_t intermediate = 3584;
  std::int32_t num_layers = 4;
  std::int32_t num_heads = 8;
  std::int32_t num_kv_heads = 2;
  std::int32_t head_dim = 128;
  float rms_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  std::int32_t max_position = 8192;  // the context: prompt + output
  bool tie_word_embeddings = false;

  std::int32_t q_dim() const { return num_heads * head_dim; }
  std::int32_t kv_dim() const { return num_kv_heads * head_dim; }
  // invalid_argument naming the first field out of range or inconsistent.
  clm::Status check() const;
};

// Parses config.json text; on error `out` is unchanged.
clm::Status parse_llama_config(std::string_view json, LlamaConfig& out);
clm::Status load_llama_config(const std::string& path, LlamaConfig& out);
// The config.json text of `config` (what save_llama_weights writes beside the weights).
std::string llama_config_json(const LlamaConfig& config);

}  // namespace tiny_llama
