// examples/tiny_llama/llama_config.cpp: config.json in and out (nlohmann-json).
#include "llama_config.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tiny_llama {

namespace {

// Ranges that keep every buffer size a model needs well inside int32 and memory.
constexpr std::int64_t kMaxDim = 1 << 16;
constexpr std::int64_t kMaxLayers = 256;
constexpr std::int64_t kMaxVocab = 1 << 20;
constexpr std::int64_t kMaxPosition = 1 << 20;

template <typename T>
clm::Status read_field(const nlohmann::json& json, const char* name, T& out, bool required) {
  const auto it = json.find(name);
  if (it == json.end() || it->is_null()) {
    return required ? clm::invalid_argument(fmt::format("config.json: \"{}\" is missing", name)) : clm::Status{};
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return clm::invalid_argument(fmt::format("config.json: \"{}\" must be a boolean", name));
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      return clm::invalid_argument(fmt::format("config.json: \"{}\" must be an integer", name));
    }
    const auto value = it->get<std::int64_t>();
    if (value < 0 || value > std::numeric_limits<T>::max()) {
      return clm::invalid_argument(fmt::format("config.json: \"{}\" = {} is out of range", name, value));
    }
    out = static_cast<T>(value);
  } else {
    if (!it->is_number()) return clm::invalid_argument(fmt::format("config.json: \"{}\" must be a number", name));
    out = it->get<T>();
  }
  return {};
}

}  // namespace

clm::Status LlamaConfig::check() const {
  const auto in_range = [](const char* name, std::int64_t value, std::int64_t hi) -> clm::Status {
    if (value < 1 || value > hi) {
      return clm::invalid_argument(fmt::format("llama config: {} = {} must be in [1, {}]", name, value, hi));
    }
    return {};
  };
  CLM_RETURN_IF_ERROR(in_range("vocab_size", vocab_size, kMaxVocab));
  CLM_RETURN_IF_ERROR(in_range("hidden_size", hidden, kMaxDim));
  CLM_RETURN_IF_ERROR(in_range("intermediate_size", intermediate, kMaxDim * 4));
  CLM_RETURN_IF_ERROR(in_range("num_hidden_layers", num_layers, kMaxLayers));
  CLM_RETURN_IF_ERROR(in_range("num_attention_heads", num_heads, 1024));
  CLM_RETURN_IF_ERROR(in_range("num_key_value_heads", num_kv_heads, 1024));
  CLM_RETURN_IF_ERROR(in_range("head_dim", head_dim, 1024));
  CLM_RETURN_IF_ERROR(in_range("max_position_embeddings", max_position, kMaxPosition));
  if (num_heads % num_kv_heads != 0) {
    return clm::invalid_argument(fmt::format(
        "llama config: num_attention_heads {} is not a multiple of num_key_value_heads {}", num_heads, num_kv_heads));
  }
  if (head_dim % 2 != 0) return clm::invalid_argument(fmt::format("llama config: head_dim {} is odd (RoPE)", head_dim));
  if (!(rms_norm_eps > 0.0f) || !(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return clm::invalid_argument("llama config: rms_norm_eps must be > 0 and rope_theta > 1");
  }
  return {};
}

clm::Status parse_llama_config(std::string_view text, LlamaConfig& out) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return clm::invalid_argument("config.json: not a JSON object");
  LlamaConfig c;
  CLM_RETURN_IF_ERROR(read_field(json, "vocab_size", c.vocab_size, true));
  CLM_RETURN_IF_ERROR(read_field(json, "hidden_size", c.hidden, true));
  CLM_RETURN_IF_ERROR(read_field(json, "intermediate_size", c.intermediate, true));
  CLM_RETURN_IF_ERROR(read_field(json, "num_hidden_layers", c.num_layers, true));
  CLM_RETURN_IF_ERROR(read_field(json, "num_attention_heads", c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  CLM_RETURN_IF_ERROR(read_field(json, "num_key_value_heads", c.num_kv_heads, false));
  if (c.num_heads < 1) return clm::invalid_argument("config.json: num_attention_heads must be >= 1");
  c.head_dim = c.hidden / c.num_heads;
  CLM_RETURN_IF_ERROR(read_field(json, "head_dim", c.head_dim, false));
  CLM_RETURN_IF_ERROR(read_field(json, "rms_norm_eps", c.rms_norm_eps, false));
  CLM_RETURN_IF_ERROR(read_field(json, "rope_theta", c.rope_theta, false));
  CLM_RETURN_IF_ERROR(read_field(json, "max_position_embeddings", c.max_position, false));
  CLM_RETURN_IF_ERROR(read_field(json, "tie_word_embeddings", c.tie_word_embeddings, false));
  CLM_RETURN_IF_ERROR(c.check());
  out = c;
  return {};
}

clm::Status load_llama_config(const std::string& path, LlamaConfig& out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return clm::io_error(fmt::format("cannot read {}", path));
  std::ostringstream text;
  text << file.rdbuf();
  clm::Status parsed = parse_llama_config(text.str(), out);
  if (!parsed.ok()) return clm::Status(parsed.code(), fmt::format("{}: {}", path, parsed.message()));
  return {};
}

std::string llama_config_json(const LlamaConfig& c) {
  const nlohmann::json json = {{"architectures", {"LlamaForCausalLM"}},
                               {"model_type", "llama"},
                               {"vocab_size", c.vocab_size},
                               {"hidden_size", c.hidden},
                               {"intermediate_size", c.intermediate},
                               {"num_hidden_layers", c.num_layers},
                               {"num_attention_heads", c.num_heads},
                               {"num_key_value_heads", c.num_kv_heads},
                               {"head_dim", c.head_dim},
                               {"rms_norm_eps", c.rms_norm_eps},
                               {"rope_theta", c.rope_theta},
                               {"max_position_embeddings", c.max_position},
                               {"tie_word_embeddings", c.tie_word_embeddings},
                               {"hidden_act", "silu"}};
  return json.dump(2) + "\n";
}

}  // namespace tiny_llama
