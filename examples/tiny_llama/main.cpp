// examples/tiny_llama/main.cpp: the `tiny_llama` command. Generates from a
// prompt (byte tokens, chat template) with a model from a .safetensors file +
// config.json, or the deterministic random init; or writes that random model.
//
//   tiny_llama [--weights model.safetensors --config config.json] [--prompt TEXT] [--system TEXT]
//              [--max-new-tokens N] [--temperature T] [--seed S] [--page-size P] [--threads N]
//              [--device cpu|cuda]
//   tiny_llama --save-random DIR   (DIR/model.safetensors + DIR/config.json)
//
// --device cuda puts the engine's KV pool in GPU memory and runs the CUDA
// decoder (built when clmcache was configured with CUDA); cpu (the default)
// keeps both on the host. Prints the answer, then one JSON line with the
// token counts and timings.
// Exit status 0, or 2 with a message on stderr.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "byte_tokenizer.hpp"
#include "generator.hpp"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "tiny_llama: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string weights_path, config_path, save_dir, prompt = "What is Debian?", system = "You are a helpful assistant.";
  tiny_llama::GenerateOptions options;
  options.max_new_tokens = 32;
  std::int32_t page_size = 16;
  int threads = 0;
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) return fail(fmt::format("{} needs a value (or is unknown)", flag));
    const std::string value = argv[++i];
    try {
      if (flag == "--weights")
        weights_path = value;
      else if (flag == "--config")
        config_path = value;
      else if (flag == "--save-random")
        save_dir = value;
      else if (flag == "--prompt")
        prompt = value;
      else if (flag == "--system")
        system = value;
      else if (flag == "--max-new-tokens")
        options.max_new_tokens = std::stoi(value);
      else if (flag == "--temperature")
        options.temperature = std::stof(value);
      else if (flag == "--seed")
        options.seed = std::stoull(value);
      else if (flag == "--page-size")
        page_size = std::stoi(value);
      else if (flag == "--threads")
        threads = std::stoi(value);
      else if (flag == "--device")
        device = value;
      else
        return fail(fmt::format("unknown flag {}", flag));
    } catch (const std::exception&) {
      return fail(fmt::format("{}: not a number: {}", flag, value));
    }
  }
  if (device != "cpu" && device != "cuda") return fail(fmt::format("--device: cpu or cuda, not {}", device));
  tiny_llama::LlamaConfig config;
  tiny_llama::LlamaWeights weights;
  if (clm::Status s = tiny_llama::load_or_init_llama(config_path, weights_path, 1, config, weights); !s.ok()) {
    return fail(s.message());
  }
  if (!save_dir.empty()) {
    clm::Status s =
        tiny_llama::save_llama_weights(save_dir + "/model.safetensors", config, weights, save_dir + "/config.json");
    if (!s.ok()) return fail(s.message());
    std::printf("wrote %s/model.safetensors and %s/config.json\n", save_dir.c_str(), save_dir.c_str());
    return 0;
  }
  clm::EngineConfig engine_config;
  engine_config.pool =
      tiny_llama::kv_pool_for(config, page_size, std::int64_t{config.max_position} * 2, clm::KvDType::f32);
  if (device == "cuda") engine_config.pool.memory = clm::MemoryKind::device;
  std::unique_ptr<clm::Engine> engine;
  if (clm::Status s = clm::Engine::create(engine_config, engine); !s.ok()) return fail(s.message());
  std::unique_ptr<tiny_llama::Decoder> model;  // make_decoder: by where the pool lives
  if (clm::Status s = tiny_llama::make_decoder(config, std::move(weights), *engine, {.threads = threads}, model);
      !s.ok()) {
    return fail(s.message());
  }
  tiny_llama::Generator generator(*model, {});
  options.stop_tokens = {tiny_llama::ByteTokenizer::kEndOfTurn};
  const auto tokens = tiny_llama::ByteTokenizer::apply_chat_template({{"system", system}, {"user", prompt}});
  tiny_llama::GenerationResult result;
  generator.submit(tokens, options, nullptr, [&](const tiny_llama::GenerationResult& r) { result = r; });
  if (clm::Status s = generator.run_until_idle(); !s.ok()) return fail(s.message());
  if (!result.status.ok()) return fail(result.status.message());
  std::printf("%s\n", tiny_llama::ByteTokenizer::decode(result.tokens).c_str());
  std::printf(
      "{\"prompt_tokens\":%d,\"generated_tokens\":%zu,\"finish_reason\":\"%s\",\"ttft_s\":%.6f,\"total_s\":%.6f}\n",
      result.prompt_tokens, result.tokens.size(), result.finish_reason.c_str(), result.ttft_seconds,
      result.total_seconds);
  return 0;
}
