// examples/tiny_llama/decoder.cpp: the batch builder and the checks every
// decoder shares (CPU and CUDA alike, so that both refuse the same input).
#include "decoder.hpp"

#include <cmath>

#include <fmt/format.h>

namespace tiny_llama {

void ForwardBatch::add(clm::SequenceId id, std::span<const std::int32_t> new_tokens, std::int32_t first,
                       std::span<const std::int64_t> new_slots, std::span<const std::int32_t> page_table) {
  ids.push_back(id);
  tokens.insert(tokens.end(), new_tokens.begin(), new_tokens.end());
  indptr.push_back(static_cast<std::int32_t>(tokens.size()));
  first_position.push_back(first);
  slots.insert(slots.end(), new_slots.begin(), new_slots.end());
  page_indices.insert(page_indices.end(), page_table.begin(), page_table.end());
  page_indptr.push_back(static_cast<std::int32_t>(page_indices.size()));
}

clm::Status check_decoder_setup(const LlamaConfig& config, const LlamaWeights& weights,
                                const clm::PagedKvPoolConfig& pool) {
  CLM_RETURN_IF_ERROR(config.check());
  if (pool.num_layers != config.num_layers || pool.kv_heads != config.num_kv_heads ||
      pool.head_dim != config.head_dim) {
    return clm::invalid_argument(fmt::format(
        "tiny_llama: the engine's pool has {} layers, {} KV heads, head_dim {}; the model needs {}, {}, {}",
        pool.num_layers, pool.kv_heads, pool.head_dim, config.num_layers, config.num_kv_heads, config.head_dim));
  }
  const auto h = static_cast<std::size_t>(config.hidden);
  const auto inter = static_cast<std::size_t>(config.intermediate);
  const auto expect = [](const std::vector<float>& w, std::size_t n, const char* name) -> clm::Status {
    if (w.size() != n)
      return clm::invalid_argument(fmt::format("tiny_llama: {} has {} values, not {}", name, w.size(), n));
    return {};
  };
  CLM_RETURN_IF_ERROR(expect(weights.embed, static_cast<std::size_t>(config.vocab_size) * h, "embed"));
  if (weights.layers.size() != static_cast<std::size_t>(config.num_layers)) {
    return clm::invalid_argument(
        fmt::format("tiny_llama: {} layers of weights, config says {}", weights.layers.size(), config.num_layers));
  }
  for (const LlamaLayerWeights& l : weights.layers) {
    const auto q = static_cast<std::size_t>(config.q_dim()), kv = static_cast<std::size_t>(config.kv_dim());
    CLM_RETURN_IF_ERROR(expect(l.attn_norm, h, "input_layernorm"));
    CLM_RETURN_IF_ERROR(expect(l.wq, q * h, "q_proj"));
    CLM_RETURN_IF_ERROR(expect(l.wk, kv * h, "k_proj"));
    CLM_RETURN_IF_ERROR(expect(l.wv, kv * h, "v_proj"));
    CLM_RETURN_IF_ERROR(expect(l.wo, h * q, "o_proj"));
    CLM_RETURN_IF_ERROR(expect(l.mlp_norm, h, "post_attention_layernorm"));
    CLM_RETURN_IF_ERROR(expect(l.w_gate, inter * h, "gate_proj"));
    CLM_RETURN_IF_ERROR(expect(l.w_up, inter * h, "up_proj"));
    CLM_RETURN_IF_ERROR(expect(l.w_down, h * inter, "down_proj"));
  }
  CLM_RETURN_IF_ERROR(expect(weights.final_norm, h, "norm"));
  CLM_RETURN_IF_ERROR(expect(weights.output_matrix(), static_cast<std::size_t>(config.vocab_size) * h, "lm_head"));
  return {};
}

clm::Status check_forward_batch(const LlamaConfig& config, const clm::PagedKvPoolConfig& pool, const ForwardBatch& b,
                                std::span<const float> logits) {
  const std::size_t n = b.ids.size();
  if (n == 0) return clm::invalid_argument("forward: an empty batch");
  if (b.indptr.size() != n + 1 || b.first_position.size() != n || b.page_indptr.size() != n + 1) {
    return clm::invalid_argument(
        fmt::format("forward: {} sequences need {} row offsets, {} positions and {} page "
                    "table offsets; got {}, {} and {}",
                    n, n + 1, n, n + 1, b.indptr.size(), b.first_position.size(), b.page_indptr.size()));
  }
  if (b.indptr[0] != 0 || b.page_indptr[0] != 0) return clm::invalid_argument("forward: offsets must start at 0");
  const std::int64_t page_size = pool.page_size;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t rows = std::int64_t{b.indptr[i + 1]} - b.indptr[i];
    if (rows < 1) return clm::invalid_argument(fmt::format("forward: sequence {} brings no rows", i));
    const std::int64_t end = std::int64_t{b.first_position[i]} + rows;
    if (b.first_position[i] < 0 || end > config.max_position) {
      return clm::invalid_argument(fmt::format(
          "forward: sequence {} reaches position {}, past the context of {} tokens", i, end, config.max_position));
    }
    const std::int64_t pages = std::int64_t{b.page_indptr[i + 1]} - b.page_indptr[i];
    if (pages != (end + page_size - 1) / page_size) {
      return clm::invalid_argument(
          fmt::format("forward: sequence {} has {} tokens but {} pages of {}", i, end, pages, page_size));
    }
  }
  const auto rows = static_cast<std::size_t>(b.indptr[n]);
  if (b.tokens.size() != rows || b.slots.size() != rows) {
    return clm::invalid_argument(fmt::format("forward: {} rows need as many tokens and slots; got {} and {}", rows,
                                             b.tokens.size(), b.slots.size()));
  }
  if (b.page_indices.size() != static_cast<std::size_t>(b.page_indptr[n])) {
    return clm::invalid_argument(fmt::format("forward: the page table offsets end at {}, but there are {} page ids",
                                             b.page_indptr[n], b.page_indices.size()));
  }
  for (std::size_t r = 0; r < rows; ++r) {
    if (b.tokens[r] < 0 || b.tokens[r] >= config.vocab_size) {
      return clm::invalid_argument(fmt::format("forward: token {} at row {} is outside the vocabulary [0, {})",
                                               b.tokens[r], r, config.vocab_size));
    }
  }
  // Ids the kernels would reach through: checked here, before the first layer
  // writes anything, rather than by each kernel call mid-forward.
  for (std::size_t p = 0; p < b.page_indices.size(); ++p) {
    if (b.page_indices[p] < 0 || b.page_indices[p] >= pool.num_pages) {
      return clm::invalid_argument(fmt::format("forward: page id {} at page table entry {} is outside the pool [0, {})",
                                               b.page_indices[p], p, pool.num_pages));
    }
  }
  const std::int64_t slots = std::int64_t{pool.num_pages} * page_size;
  for (std::size_t r = 0; r < rows; ++r) {
    if (b.slots[r] < 0 || b.slots[r] >= slots) {
      return clm::invalid_argument(
          fmt::format("forward: slot {} of row {} is outside the pool [0, {})", b.slots[r], r, slots));
    }
  }
  if (logits.size() != n * static_cast<std::size_t>(config.vocab_size)) {
    return clm::invalid_argument(
        fmt::format("forward: logits hold {} values, {} sequences need {}", logits.size(), n, n * config.vocab_size));
  }
  return {};
}

void rope_table(const LlamaConfig& config, std::vector<float>& cos, std::vector<float>& sin) {
  const std::int32_t half = config.head_dim / 2;
  cos.resize(static_cast<std::size_t>(config.max_position) * static_cast<std::size_t>(half));
  sin.resize(cos.size());
  for (std::int32_t p = 0; p < config.max_position; ++p) {
    for (std::int32_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(config.rope_theta, -2.0 * i / config.head_dim);
      const double angle = p * inv_freq;
      cos[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace tiny_llama
