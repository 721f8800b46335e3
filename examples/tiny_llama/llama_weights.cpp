// examples/tiny_llama/llama_weights.cpp: random init, and Hugging Face
// safetensors in and out (through the library's safetensors reader).
#include "llama_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "clm/io/safetensors.hpp"

namespace tiny_llama {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of tensor `tensor`: a standard normal by Box-Muller on two
// counter-derived uniforms, so no element depends on how many came before.
float gaussian(std::uint64_t seed, std::uint64_t tensor, std::uint64_t i) {
  const std::uint64_t base = splitmix64(seed ^ splitmix64(tensor * 0x100000001b3ull)) ^ (i * 2);
  const double u1 = (static_cast<double>(splitmix64(base) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(splitmix64(base + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

// Element i is a function of (seed, tensor, i) alone, so the threads may take
// contiguous shares of the tensor in any order.
void fill(std::vector<float>& w, std::size_t n, double std_dev, std::uint64_t seed, std::uint64_t& tensor,
          int threads) {
  w.resize(n);
  const std::uint64_t id = tensor++;
  const auto draw = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) w[i] = static_cast<float>(std_dev * gaussian(seed, id, i));
  };
  constexpr std::size_t kMinShare = std::size_t{1} << 16;  // below this a thread costs more than it draws
  const std::size_t shares = std::clamp<std::size_t>(n / kMinShare, 1, static_cast<std::size_t>(threads));
  std::vector<std::thread> helpers;
  helpers.reserve(shares);
  std::size_t next = 1;
  try {
    for (; next < shares; ++next) helpers.emplace_back(draw, n * next / shares, n * (next + 1) / shares);
  } catch (const std::system_error&) {  // no thread to be had: the shares left are this thread's
  }
  for (std::size_t s = next; s < shares; ++s) draw(n * s / shares, n * (s + 1) / shares);
  draw(0, n / shares);
  for (std::thread& t : helpers) t.join();
}

std::string layer_name(std::int32_t layer, const char* part) {
  return fmt::format("model.layers.{}.{}.weight", layer, part);
}

}  // namespace

void random_llama_weights(const LlamaConfig& c, std::uint64_t seed, LlamaWeights& out, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto h = static_cast<std::size_t>(c.hidden);
  const auto q = static_cast<std::size_t>(c.q_dim());
  const auto kv = static_cast<std::size_t>(c.kv_dim());
  const auto inter = static_cast<std::size_t>(c.intermediate);
  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  std::uint64_t tensor = 0;
  LlamaWeights w;
  fill(w.embed, vocab * h, 1.0, seed, tensor, threads);
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (LlamaLayerWeights& l : w.layers) {
    l.attn_norm.assign(h, 1.0f);
    l.mlp_norm.assign(h, 1.0f);
    fill(l.wq, q * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
    fill(l.wk, kv * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
    fill(l.wv, kv * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
    fill(l.wo, h * q, 1.0 / std::sqrt(double(q)), seed, tensor, threads);
    fill(l.w_gate, inter * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
    fill(l.w_up, inter * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
    fill(l.w_down, h * inter, 1.0 / std::sqrt(double(inter)), seed, tensor, threads);
  }
  w.final_norm.assign(h, 1.0f);
  if (!c.tie_word_embeddings) fill(w.lm_head, vocab * h, 1.0 / std::sqrt(double(h)), seed, tensor, threads);
  out = std::move(w);
}

clm::Status load_llama_weights(const std::string& path, const LlamaConfig& c, LlamaWeights& out) {
  CLM_RETURN_IF_ERROR(c.check());
  clm::SafetensorsFile file;
  CLM_RETURN_IF_ERROR(clm::SafetensorsFile::open(path, file));
  const std::int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate, vocab = c.vocab_size;
  LlamaWeights w;
  const auto get = [&](const std::string& name, std::initializer_list<std::int64_t> shape,
                       std::vector<float>& values) -> clm::Status {
    const std::vector<std::int64_t> dims(shape);
    clm::Status got = file.get_f32(name, dims, values);
    if (!got.ok()) return clm::Status(got.code(), fmt::format("{}: {}", path, got.message()));
    return {};
  };
  CLM_RETURN_IF_ERROR(get("model.embed_tokens.weight", {vocab, h}, w.embed));
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (std::int32_t i = 0; i < c.num_layers; ++i) {
    LlamaLayerWeights& l = w.layers[static_cast<std::size_t>(i)];
    CLM_RETURN_IF_ERROR(get(layer_name(i, "input_layernorm"), {h}, l.attn_norm));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "self_attn.q_proj"), {q, h}, l.wq));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "self_attn.k_proj"), {kv, h}, l.wk));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "self_attn.v_proj"), {kv, h}, l.wv));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "self_attn.o_proj"), {h, q}, l.wo));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "post_attention_layernorm"), {h}, l.mlp_norm));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "mlp.gate_proj"), {inter, h}, l.w_gate));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "mlp.up_proj"), {inter, h}, l.w_up));
    CLM_RETURN_IF_ERROR(get(layer_name(i, "mlp.down_proj"), {h, inter}, l.w_down));
  }
  if (file.find(layer_name(c.num_layers, "input_layernorm")) != nullptr) {
    return clm::invalid_argument(
        fmt::format("{}: has more layers than config.json's num_hidden_layers {}", path, c.num_layers));
  }
  CLM_RETURN_IF_ERROR(get("model.norm.weight", {h}, w.final_norm));
  if (!c.tie_word_embeddings) CLM_RETURN_IF_ERROR(get("lm_head.weight", {vocab, h}, w.lm_head));
  out = std::move(w);
  return {};
}

clm::Status load_or_init_llama(const std::string& config_path, const std::string& weights_path, std::uint64_t seed,
                               LlamaConfig& config, LlamaWeights& weights) {
  LlamaConfig c;
  if (!config_path.empty()) CLM_RETURN_IF_ERROR(load_llama_config(config_path, c));
  LlamaWeights w;
  if (weights_path.empty()) {
    random_llama_weights(c, seed, w);
  } else {
    CLM_RETURN_IF_ERROR(load_llama_weights(weights_path, c, w));
  }
  config = c;
  weights = std::move(w);
  return {};
}

clm::Status save_llama_weights(const std::string& path, const LlamaConfig& c, const LlamaWeights& w,
                               const std::string& config_path) {
  CLM_RETURN_IF_ERROR(c.check());
  std::vector<clm::TensorToWrite> tensors;
  const auto add = [&](std::string name, std::vector<std::int64_t> shape, const std::vector<float>& values) {
    tensors.push_back({std::move(name), clm::TensorDType::f32, std::move(shape), std::as_bytes(std::span(values))});
  };
  const std::int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate, vocab = c.vocab_size;
  add("model.embed_tokens.weight", {vocab, h}, w.embed);
  for (std::int32_t i = 0; i < c.num_layers; ++i) {
    const LlamaLayerWeights& l = w.layers[static_cast<std::size_t>(i)];
    add(layer_name(i, "input_layernorm"), {h}, l.attn_norm);
    add(layer_name(i, "self_attn.q_proj"), {q, h}, l.wq);
    add(layer_name(i, "self_attn.k_proj"), {kv, h}, l.wk);
    add(layer_name(i, "self_attn.v_proj"), {kv, h}, l.wv);
    add(layer_name(i, "self_attn.o_proj"), {h, q}, l.wo);
    add(layer_name(i, "post_attention_layernorm"), {h}, l.mlp_norm);
    add(layer_name(i, "mlp.gate_proj"), {inter, h}, l.w_gate);
    add(layer_name(i, "mlp.up_proj"), {inter, h}, l.w_up);
    add(layer_name(i, "mlp.down_proj"), {h, inter}, l.w_down);
  }
  add("model.norm.weight", {h}, w.final_norm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {vocab, h}, w.lm_head);
  CLM_RETURN_IF_ERROR(clm::write_safetensors(path, tensors, {{"format", "pt"}}));
  if (!config_path.empty()) {
    std::ofstream file(config_path, std::ios::binary | std::ios::trunc);
    file << llama_config_json(c);
    if (!file.flush()) return clm::io_error(fmt::format("cannot write {}", config_path));
  }
  return {};
}

}  // namespace tiny_llama
