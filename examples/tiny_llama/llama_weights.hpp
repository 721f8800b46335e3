// examples/tiny_llama/llama_weights.hpp: the weights of a Llama decoder in f32,
// read from a .safetensors file with Hugging Face's tensor names, or made by a
// deterministic random init when a host has none (the demo's default).
//
//   tiny_llama::LlamaWeights weights;
//   CLM_RETURN_IF_ERROR(tiny_llama::load_llama_weights("model.safetensors", config, weights));
//   // or: tiny_llama::random_llama_weights(config, /*seed=*/1, weights);
//
// Names (Hugging Face LlamaForCausalLM; F32, F16 or BF16, converted to f32):
//   model.embed_tokens.weight                      [vocab][hidden]
//   model.layers.{i}.input_layernorm.weight        [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight  q [heads*hd][hidden], k/v [kv_heads*hd][hidden],
//                                                     o [hidden][heads*hd]
//   model.layers.{i}.post_attention_layernorm.weight  [hidden]
//   model.layers.{i}.mlp.{gate,up}_proj.weight     [intermediate][hidden]
//   model.layers.{i}.mlp.down_proj.weight          [hidden][intermediate]
//   model.norm.weight                              [hidden]
//   lm_head.weight                                 [vocab][hidden] (absent when tie_word_embeddings)
// A missing tensor, a shape that disagrees with the config, or a NaN/Inf
// weight is invalid_argument (not_found for a missing one) naming the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clm/status.hpp"
#include "llama_config.hpp"

namespace tiny_llama {

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wq;         // [q_dim][hidden]
  std::vector<float> wk;         // [kv_dim][hidden]
  std::vector<float> wv;         // [kv_dim][hidden]
  std::vector<float> wo;         // [hidden][q_dim]
  std::vector<float> mlp_norm;   // [hidden]
  std::vector<float> w_gate;     // [intermediate][hidden]
  std::vector<float> w_up;       // [intermediate][hidden]
  std::vector<float> w_down;     // [hidden][intermediate]
};

struct LlamaWeights {
  std::vector<float> embed;  // [vocab][hidden]
  std::vector<LlamaLayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab][hidden]; empty when tied to embed
  const std::vector<float>& output_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

// Gaussian init scaled by fan-in (std 1/sqrt(in); embeddings std 1; norms 1),
// so that activations and logits are O(1) and attention is far from uniform,
// from a counter-based generator: the same (config, seed) gives the same
// weights on every machine, whatever `threads` draws them (0: the
// hardware's threads; the default model's 54M draws take seconds on one).
void random_llama_weights(const LlamaConfig& config, std::uint64_t seed, LlamaWeights& out, int threads = 0);

// Reads and checks every tensor against `config`; on error `out` is unchanged.
clm::Status load_llama_weights(const std::string& path, const LlamaConfig& config, LlamaWeights& out);

// A host's model: the config.json at config_path (empty: LlamaConfig's
// defaults), then the weights at weights_path (empty: random_llama_weights
// with `seed`). On error the outputs are unchanged.
clm::Status load_or_init_llama(const std::string& config_path, const std::string& weights_path, std::uint64_t seed,
                               LlamaConfig& config, LlamaWeights& weights);

// Writes `weights` as F32 under the names above (and config.json beside it
// when config_path is not empty).
clm::Status save_llama_weights(const std::string& path, const LlamaConfig& config, const LlamaWeights& weights,
                               const std::string& config_path = {});

}  // namespace tiny_llama
