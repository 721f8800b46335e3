// examples/demo/main.cpp: `clm_demo`, the main job of `make demo`. A Debian
// support bot (scenario.hpp) served by the tiny_llama decoder over the
// engine, run twice in one process on identical work: the cache off (every
// prompt computed in full), then the cache on (device tier + host tier).
// While it runs, a progress bar; at the end, tables: prompt tokens and where
// the cached ones came from, TTFT p50/p99 and decode tokens/s for both runs,
// per turn, and the engine's metrics in the Prometheus text format. With CLM
// in the loop, what it reused (reuse_report.hpp): one line per snapshot the
// store served a request, the question asked <- the question whose snapshot
// it was, with their intents, the level, key and similarity, marked OTHER
// when the intents differ; then how many hits, and how many from another
// intent.
//
//   clm_demo [--users 12] [--turns 3] [--system-bytes 1536] [--max-new-tokens 16] [--threads 0]
//            [--device-tokens 4096] [--host-tokens 32768] [--weights F --config F] [--seed 1]
//            [--questions F]       the questions file (default: examples/demo/questions.tsv)
//            [--tokenizer F]       a Hugging Face tokenizer.json (Qwen3's: examples/tokenizer) instead of byte
//                                  tokens: the model's vocabulary is then the tokenizer's (randomly initialised
//                                  at that size), prompts are Qwen's ChatML, and a table compares each turn's
//                                  prompt tokens with the byte tokens of the same conversation; CLM in the
//                                  loop (which finds the question by the byte template) is refused with it
//            [--lexicons DIR]      words of the demo's domain added to the suffix keyer's built-in ones
//                                  (default: examples/demo/lexicon; "" for the built-ins alone)
//            [--clm-dir DIR]       CLM in the loop in the cached run, with DIR's trained parts
//            [--reuse-tsv F]       with --clm-dir: also write the reuse pairs (below) into F, as TSV
//            [--collect DIR]       only the cached run, CLM off, collecting CLM training data into DIR
//            [--temperature 0]     sampling (0: greedy)
//            [--src-threshold X]   the SRC gate's threshold in [0, 1] (default: the library's, from traffic)
//            [--timestamp-passes 1] after the tables, the scenario twice more with the cache on and the
//                                  time in every prompt (at the top of the system prompt, then at the
//                                  end of the user's message): hit rates side by side and where the
//                                  prompts split off (divergence_demo.hpp); 0: not (byte tokens only)
//            [--write-model-key F] only write what identifies the model (its config.json text and its
//                                  weights: the SHA-256 of the file, or the seed) into F: demo.sh
//                                  retrains the CLM parts when it differs from the one they were
//                                  trained for
//
// examples/demo/demo.sh runs --collect and train_clm.sh the first time, then
// the demo with --clm-dir (the trained parts are kept in the build folder).
// Exit status 0, or 2 with a message on stderr.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "byte_tokenizer.hpp"
#include "clm_collect.hpp"
#include "clm_loop.hpp"
#include "demo_run.hpp"
#include "divergence_demo.hpp"
#include "hf_tokenizer.hpp"
#include "reuse_report.hpp"

namespace {

using tiny_llama_demo::RunReport;

int fail(const std::string& message) {
  std::fprintf(stderr, "clm_demo: %s\n", message.c_str());
  return 2;
}

struct DemoFlags {
  tiny_llama_demo::ScenarioOptions scenario;
  std::int32_t max_new_tokens = 16;
  std::int32_t max_batch = 32;
  int threads = 0;
  std::int32_t page_size = 16;
  std::int32_t device_tokens = 4096;
  std::int32_t host_tokens = 32768;
  std::string weights, config;
  std::uint64_t seed = 1;
  std::string clm_dir, collect_dir, model_key_path, reuse_tsv;
  std::string tokenizer;                     // a tokenizer.json; empty: byte tokens
  std::string lexicons = CLM_DEMO_LEXICONS;  // Debian's words: without them the keyer abstains on every question
  float src_threshold = -1.0f;               // < 0: the library's, from traffic
  bool timestamp_passes = true;
  float temperature = 0.0f;  // greedy: a random-weight model then falls into loops, the repeats CLM learns
};

// The store's default snapshot size, or half the hidden size of a smaller model.
std::int32_t snapshot_dim_for(const tiny_llama::LlamaConfig& config) {
  return std::min(clm::SnapshotStoreConfig{}.snapshot_dim, config.hidden / 2);
}

// A temporary folder for the run's snapshot store, removed at the end.
class TempStoreDir {
 public:
  TempStoreDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "clm-demo-store.XXXXXX").string();
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempStoreDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Stack {
  std::unique_ptr<clm::Engine> engine;
  std::unique_ptr<tiny_llama::LlamaModel> model;
  std::unique_ptr<tiny_llama::Generator> generator;
};

// The template's marker tokens: the byte tokenizer's, or a tokenizer's special ones.
std::vector<std::int32_t> special_token_ids(const clm_tokenizer::HfTokenizer* tokenizer) {
  if (tokenizer == nullptr) {
    return {tiny_llama::ByteTokenizer::kBeginOfText, tiny_llama::ByteTokenizer::kStartHeader,
            tiny_llama::ByteTokenizer::kEndHeader, tiny_llama::ByteTokenizer::kEndOfTurn};
  }
  std::vector<std::int32_t> ids;
  for (std::int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    if (tokenizer->is_special(id)) ids.push_back(id);
  }
  return ids;
}

clm::Status make_stack(const DemoFlags& flags, const tiny_llama::LlamaConfig& config,
                       const tiny_llama::LlamaWeights& weights, bool cached, const std::string& store_dir,
                       const clm_tokenizer::HfTokenizer* tokenizer, Stack& out) {
  clm::EngineConfig e;
  e.special_token_ids = special_token_ids(tokenizer);
  e.snapshot_store.path = store_dir;  // empty: no store
  e.snapshot_store.snapshot_dim = snapshot_dim_for(config);
  // The demo runs for a minute, not a day: a suffix is stored at its first sighting.
  e.snapshot_store.min_usage_threshold = 1;
  e.snapshot_store.keyer.lexicon_dir = flags.lexicons;
  e.src_gate.threshold_override = flags.src_threshold;
  // Without the cache, the pool holds only the running requests' pages: room for a full batch of long prompts.
  const std::int64_t tokens = cached ? flags.device_tokens : std::int64_t{flags.max_batch} * 4096;
  e.pool = tiny_llama::kv_pool_for(config, flags.page_size, tokens, clm::KvDType::bf16);
  if (cached && flags.host_tokens > 0) e.tiers.host_pages = flags.host_tokens / flags.page_size;
  e.divergence.context_tokens = 24;  // enough text either side of a split to read where it is
  CLM_RETURN_IF_ERROR(clm::Engine::create(e, out.engine));
  const tiny_llama::GeneratorOptions generator{.max_batch = flags.max_batch, .prefill_token_budget = 4096};
  CLM_RETURN_IF_ERROR(tiny_llama::LlamaModel::create(
      config, weights, *out.engine,
      {.threads = flags.threads, .workspace_rows = generator.prefill_token_budget + generator.max_batch}, out.model));
  out.generator = std::make_unique<tiny_llama::Generator>(*out.model, generator);
  return {};
}

struct Summary {
  std::int64_t requests = 0, prompt = 0, cached = 0, host = 0, storage = 0, generated = 0;
  std::vector<double> ttft_ms;
  double wall = 0;
};

Summary summarize(const RunReport& report) {
  Summary s;
  for (const auto& r : report.requests) {
    ++s.requests;
    s.prompt += r.result.prompt_tokens;
    s.cached += r.result.cached_tokens;
    s.host += r.result.host_tokens;
    s.storage += r.result.storage_tokens;
    s.generated += static_cast<std::int64_t>(r.result.tokens.size());
    s.ttft_ms.push_back(1e3 * r.result.ttft_seconds);
  }
  s.wall = report.wall_seconds;
  return s;
}

std::string thousands(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

void print_tables(const DemoFlags& flags, const tiny_llama::LlamaConfig& config, const tiny_llama_demo::Scenario& sc,
                  const RunReport& off_report, const RunReport& on_report, const clm::Engine& engine,
                  const tiny_llama::ClmLoop* clm_loop, const tiny_llama_demo::ReuseReport& reuse) {
  const Summary off = summarize(off_report), on = summarize(on_report);
  const std::string tokens = flags.tokenizer.empty()
                                 ? std::string("byte tokens")
                                 : fmt::format("tokens of {} (vocabulary {})", flags.tokenizer, config.vocab_size);
  std::printf(
      "\nDebian support bot: %zu users x %d turns = %lld requests; system prompt of %zu bytes of the Debian "
      "FAQ (English + Chinese), %s\n",
      sc.users.size(), flags.scenario.turns, static_cast<long long>(off.requests), sc.system_prompt.size(),
      tokens.c_str());
  std::printf(
      "model: Llama, %d layers, hidden %d, %d heads, %d KV heads, random weights; KV bf16 in pages of %d; "
      "cache on: device %d tokens + host %d tokens\n\n",
      config.num_layers, config.hidden, config.num_heads, config.num_kv_heads, flags.page_size, flags.device_tokens,
      flags.host_tokens);
  const auto row = [](const char* name, const std::string& a, const std::string& b) {
    std::printf("  %-34s %14s %14s\n", name, a.c_str(), b.c_str());
  };
  row("", "cache off", "cache on");
  row("prompt tokens", thousands(off.prompt), thousands(on.prompt));
  row("cached tokens, from the device", thousands(off.cached - off.host), thousands(on.cached - on.host));
  row("cached tokens, from the host tier", thousands(off.host - off.storage), thousands(on.host - on.storage));
  row("cached tokens, from storage", thousands(off.storage), thousands(on.storage));
  row("prompt tokens computed", thousands(off.prompt - off.cached), thousands(on.prompt - on.cached));
  row("TTFT p50 (ms)", fmt::format("{:.1f}", tiny_llama_demo::quantile(off.ttft_ms, 0.5)),
      fmt::format("{:.1f}", tiny_llama_demo::quantile(on.ttft_ms, 0.5)));
  row("TTFT p99 (ms)", fmt::format("{:.1f}", tiny_llama_demo::quantile(off.ttft_ms, 0.99)),
      fmt::format("{:.1f}", tiny_llama_demo::quantile(on.ttft_ms, 0.99)));
  row("generated tokens", thousands(off.generated), thousands(on.generated));
  row("tokens/s (generated / wall time)", fmt::format("{:.1f}", double(off.generated) / off.wall),
      fmt::format("{:.1f}", double(on.generated) / on.wall));
  row("wall time (s)", fmt::format("{:.2f}", off.wall), fmt::format("{:.2f}", on.wall));
  const double ideal = double(on.prompt) / double(std::max<std::int64_t>(1, on.prompt - on.cached));
  std::printf("\n  ideal prefill speedup (prompt tokens / computed): %.2fx; TTFT p50 speedup: %.2fx; wall: %.2fx\n",
              ideal, tiny_llama_demo::quantile(off.ttft_ms, 0.5) / tiny_llama_demo::quantile(on.ttft_ms, 0.5),
              off.wall / on.wall);

  std::printf("\nTTFT by turn (ms, p50)        cache off       cache on   cached share\n");
  for (std::int32_t turn = 0; turn < flags.scenario.turns; ++turn) {
    std::vector<double> a, b;
    std::int64_t prompt = 0, cached = 0;
    for (const auto& r : off_report.requests) {
      if (r.turn == turn) a.push_back(1e3 * r.result.ttft_seconds);
    }
    for (const auto& r : on_report.requests) {
      if (r.turn != turn) continue;
      b.push_back(1e3 * r.result.ttft_seconds);
      prompt += r.result.prompt_tokens;
      cached += r.result.cached_tokens;
    }
    std::printf("  turn %d                     %10.1f     %10.1f         %5.1f%%\n", turn + 1,
                tiny_llama_demo::quantile(a, 0.5), tiny_llama_demo::quantile(b, 0.5),
                prompt ? 100.0 * double(cached) / double(prompt) : 0.0);
  }
  if (!flags.tokenizer.empty()) {
    std::printf(
        "\nPrompt tokens by turn (sum over users, cached run): the tokenizer's against the byte tokens of the "
        "same\nconversation (its answers as the text they decode to)\n");
    std::printf("                 tokenizer    byte tokens   tokenizer / bytes\n");
    for (std::int32_t turn = 0; turn < flags.scenario.turns; ++turn) {
      std::int64_t real = 0, bytes = 0;
      for (const auto& r : on_report.requests) {
        if (r.turn != turn) continue;
        real += r.result.prompt_tokens;
        bytes += r.byte_prompt_tokens;
      }
      std::printf("  turn %d   %14s %14s   %17.3f\n", turn + 1, thousands(real).c_str(), thousands(bytes).c_str(),
                  bytes ? double(real) / double(bytes) : 0.0);
    }
  }
  if (clm_loop != nullptr) {
    std::printf("\nCLM in the loop (cached run; the cache-off run is the baseline, CLM off):\n%s",
                tiny_llama::format_clm_stats(clm_loop->stats()).c_str());
    std::int64_t repeated = 0, repeated_hits = 0, other = 0, other_hits = 0;
    for (const auto& r : on_report.requests) {
      const bool hit = r.result.clm.hits_exact + r.result.clm.hits_ann + r.result.clm.hits_fallback > 0;
      (r.question.repeated ? repeated : other) += 1;
      (r.question.repeated ? repeated_hits : other_hits) += hit ? 1 : 0;
    }
    std::printf("  requests with a snapshot hit: %lld of %lld repeated questions, %lld of %lld others\n",
                static_cast<long long>(repeated_hits), static_cast<long long>(repeated),
                static_cast<long long>(other_hits), static_cast<long long>(other));
    std::printf(
        "\nCLM reuse, per snapshot the store served: the question asked <- the question whose snapshot it was "
        "[intents]\n(level, key and version, best similarity, hits: forwards that got it)\n%s",
        tiny_llama_demo::format_reuse(reuse, flags.reuse_tsv).c_str());
  } else {
    std::printf("\nCLM in the loop: off (no trained parts given: --clm-dir)\n");
  }
  std::printf(
      "\nThe engine's metrics after the cached run (GET /metrics of examples/server serves the same text):\n\n");
  std::printf("%s", engine.metrics_text().c_str());
}

// The scenario once, cache on and CLM off, with a ClmCollector recording what
// clm_fit needs (train_clm.sh) into flags.collect_dir.
int collect(const DemoFlags& flags, const tiny_llama::LlamaConfig& config, const tiny_llama::LlamaWeights& weights,
            const tiny_llama_demo::Scenario& scenario, tiny_llama_demo::RunOptions run) {
  Stack stack;
  if (clm::Status s = make_stack(flags, config, weights, true, "", nullptr, stack); !s.ok()) return fail(s.message());
  std::unique_ptr<tiny_llama::ClmCollector> collector;
  tiny_llama::ClmCollectConfig collect_config;
  collect_config.snapshot_dim = snapshot_dim_for(config);
  if (clm::Status s =
          tiny_llama::ClmCollector::create(config, stack.engine->config().special_token_ids, collect_config, collector);
      !s.ok()) {
    return fail(s.message());
  }
  collector->install(*stack.model, *stack.generator);
  run.use_cache = true;
  run.label = "collecting CLM data";
  tiny_llama_demo::RunReport report;
  if (clm::Status s = tiny_llama_demo::run_scenario(*stack.generator, scenario, run, report); !s.ok()) {
    return fail(s.message());
  }
  collector->uninstall(*stack.model, *stack.generator);
  if (clm::Status s = collector->write(flags.collect_dir); !s.ok()) return fail(s.message());
  const tiny_llama::ClmCollectStats st = collector->stats();
  std::printf("collected %lld conversations, %lld feature rows, %lld hidden samples, %lld adapter pairs into %s\n",
              static_cast<long long>(st.conversations), static_cast<long long>(st.feature_rows),
              static_cast<long long>(st.hidden_samples), static_cast<long long>(st.adapter_pairs),
              flags.collect_dir.c_str());
  return 0;
}

// The SHA-256 of a file's bytes, in hex, or "" when it cannot be read.
std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return {};
  std::vector<char> chunk(std::size_t{1} << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got > 0 && EVP_DigestUpdate(ctx.get(), chunk.data(), got) != 1) return {};
  }
  if (in.bad()) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &size) != 1) return {};
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

// The trained CLM parts fit one model: its shape and its weights (a file's
// bytes, wherever it lies, or the random init of a seed).
int write_model_key(const DemoFlags& flags, const clm_tokenizer::HfTokenizer* tokenizer) {
  tiny_llama::LlamaConfig config;
  if (!flags.config.empty()) {
    if (clm::Status s = tiny_llama::load_llama_config(flags.config, config); !s.ok()) return fail(s.message());
  }
  if (tokenizer != nullptr) config.vocab_size = tokenizer->vocab_size();
  std::string weights = fmt::format("random init, seed {}", flags.seed);
  if (!flags.weights.empty()) {
    const std::string digest = file_sha256(flags.weights);
    if (digest.empty()) return fail(fmt::format("cannot read the weights file '{}'", flags.weights));
    weights = fmt::format("file with SHA-256 {}", digest);
  }
  std::ofstream out(flags.model_key_path, std::ios::trunc);
  out << tiny_llama::llama_config_json(config) << "\nweights: " << weights << "\n";
  out.close();
  return out ? 0 : fail(fmt::format("cannot write '{}'", flags.model_key_path));
}

}  // namespace

int main(int argc, char** argv) {
  DemoFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) return fail(fmt::format("{} needs a value (or is unknown)", flag));
    const std::string value = argv[++i];
    try {
      if (flag == "--users")
        flags.scenario.users = std::stoi(value);
      else if (flag == "--turns")
        flags.scenario.turns = std::stoi(value);
      else if (flag == "--system-bytes")
        flags.scenario.system_bytes = std::stoi(value);
      else if (flag == "--faq-en")
        flags.scenario.faq_en = value;
      else if (flag == "--faq-zh")
        flags.scenario.faq_zh = value;
      else if (flag == "--questions")
        flags.scenario.questions = value;
      else if (flag == "--reuse-tsv")
        flags.reuse_tsv = value;
      else if (flag == "--lexicons")
        flags.lexicons = value;
      else if (flag == "--tokenizer")
        flags.tokenizer = value;
      else if (flag == "--max-new-tokens")
        flags.max_new_tokens = std::stoi(value);
      else if (flag == "--max-batch")
        flags.max_batch = std::stoi(value);
      else if (flag == "--threads")
        flags.threads = std::stoi(value);
      else if (flag == "--page-size")
        flags.page_size = std::stoi(value);
      else if (flag == "--device-tokens")
        flags.device_tokens = std::stoi(value);
      else if (flag == "--host-tokens")
        flags.host_tokens = std::stoi(value);
      else if (flag == "--weights")
        flags.weights = value;
      else if (flag == "--config")
        flags.config = value;
      else if (flag == "--clm-dir")
        flags.clm_dir = value;
      else if (flag == "--temperature")
        flags.temperature = std::stof(value);
      else if (flag == "--src-threshold")
        flags.src_threshold = std::stof(value);
      else if (flag == "--collect")
        flags.collect_dir = value;
      else if (flag == "--write-model-key")
        flags.model_key_path = value;
      else if (flag == "--timestamp-passes")
        flags.timestamp_passes = std::stoi(value) != 0;
      else if (flag == "--seed")
        flags.seed = std::stoull(value);
      else
        return fail(fmt::format("unknown flag {}", flag));
    } catch (const std::exception&) {
      return fail(fmt::format("{}: not a number: {}", flag, value));
    }
  }
  if (flags.page_size < 1 || flags.device_tokens < flags.page_size || flags.max_batch < 1) {
    return fail("--page-size, --device-tokens and --max-batch must be positive (device tokens >= a page)");
  }
  clm_tokenizer::HfTokenizer hf_tokenizer;
  const clm_tokenizer::HfTokenizer* tokenizer = nullptr;
  if (!flags.tokenizer.empty()) {
    if (!flags.clm_dir.empty() || !flags.collect_dir.empty()) {
      return fail(
          "--tokenizer with --clm-dir or --collect: CLM in the loop finds the question by the byte "
          "template's headers, so it runs with byte tokens only");
    }
    if (clm::Status s = clm_tokenizer::HfTokenizer::load(flags.tokenizer, hf_tokenizer); !s.ok()) {
      return fail(fmt::format("--tokenizer: {}: {}", s.code_name(), s.message()));
    }
    tokenizer = &hf_tokenizer;
  }
  if (!flags.model_key_path.empty()) return write_model_key(flags, tokenizer);
  tiny_llama_demo::Scenario scenario;
  if (clm::Status s = tiny_llama_demo::make_scenario(flags.scenario, scenario); !s.ok()) return fail(s.message());
  tiny_llama::LlamaConfig config;
  tiny_llama::LlamaWeights weights;
  if (tokenizer == nullptr) {
    if (clm::Status s = tiny_llama::load_or_init_llama(flags.config, flags.weights, flags.seed, config, weights);
        !s.ok()) {
      return fail(s.message());
    }
  } else {
    // The model's vocabulary is the tokenizer's: its embedding and output rows, one per token id.
    if (!flags.config.empty()) {
      if (clm::Status s = tiny_llama::load_llama_config(flags.config, config); !s.ok()) return fail(s.message());
    }
    config.vocab_size = tokenizer->vocab_size();
    if (!flags.weights.empty()) {
      if (clm::Status s = tiny_llama::load_llama_weights(flags.weights, config, weights); !s.ok()) {
        return fail(
            fmt::format("{} (with --tokenizer the weights need a vocabulary of {})", s.message(), config.vocab_size));
      }
    } else {
      tiny_llama::random_llama_weights(config, flags.seed, weights, flags.threads);
    }
  }
  tiny_llama_demo::RunOptions run;
  run.tokenizer = tokenizer;
  run.max_new_tokens = flags.max_new_tokens;
  run.temperature = flags.temperature;
  run.tenant = "debian-support";
  if (!flags.collect_dir.empty()) return collect(flags, config, weights, scenario, run);

  RunReport off_report, on_report;
  {
    Stack off;
    if (clm::Status s = make_stack(flags, config, weights, false, "", tokenizer, off); !s.ok()) {
      return fail(s.message());
    }
    run.use_cache = false;
    run.label = "cache off (baseline)";
    if (clm::Status s = tiny_llama_demo::run_scenario(*off.generator, scenario, run, off_report); !s.ok()) {
      return fail(s.message());
    }
  }
  TempStoreDir store;
  const bool with_clm = !flags.clm_dir.empty();
  if (with_clm && store.path().empty()) return fail("cannot make a temporary folder for the snapshot store");
  Stack on;
  if (clm::Status s = make_stack(flags, config, weights, true, with_clm ? store.path() : "", tokenizer, on); !s.ok()) {
    return fail(s.message());
  }
  std::unique_ptr<tiny_llama::ClmLoop> clm_loop;
  if (with_clm) {
    const tiny_llama::ClmFiles files = tiny_llama::ClmFiles::in(flags.clm_dir);
    if (clm::Status s = tiny_llama::ClmLoop::create(*on.engine, config, files, {}, clm_loop); !s.ok()) {
      return fail(fmt::format("CLM parts in {}: {} (demo.sh trains them: delete the folder to retrain)", flags.clm_dir,
                              s.message()));
    }
    clm_loop->install(*on.model, *on.generator);
    run.prepare = [](std::int32_t, std::int32_t, const tiny_llama_demo::Question&, tiny_llama::GenerateOptions& o) {
      o.use_clm = true;  // the suffix: the question (the prompt's last user message)
    };
  }
  run.use_cache = true;
  run.label = with_clm ? "cache on, CLM on" : "cache on";
  if (clm::Status s = tiny_llama_demo::run_scenario(*on.generator, scenario, run, on_report); !s.ok()) {
    return fail(s.message());
  }
  on.engine->wait_for_tiers();
  if (clm::Status s = on.engine->check_invariants(); !s.ok()) return fail(s.message());
  const tiny_llama_demo::ReuseReport reuse = tiny_llama_demo::reuse_report(on_report);
  if (clm_loop && !flags.reuse_tsv.empty()) {
    if (clm::Status s = tiny_llama_demo::write_reuse_tsv(reuse, flags.reuse_tsv); !s.ok()) return fail(s.message());
  }
  print_tables(flags, config, scenario, off_report, on_report, *on.engine, clm_loop.get(), reuse);
  if (clm_loop) clm_loop->uninstall(*on.model, *on.generator);
  if (flags.timestamp_passes && tokenizer == nullptr) {
    std::vector<tiny_llama_demo::TimestampPass> passes;
    passes.push_back(tiny_llama_demo::timestamp_pass("no timestamp (the run above)", on_report, *on.engine));
    using tiny_llama_demo::Timestamp;
    for (const auto& [where, label] : {std::pair{Timestamp::system_top, "time at the top of the system prompt"},
                                       std::pair{Timestamp::prompt_end, "time at the end of the message"}}) {
      Stack stack;
      if (clm::Status s = make_stack(flags, config, weights, true, "", nullptr, stack); !s.ok())
        return fail(s.message());
      run.timestamp = where;
      run.prepare = nullptr;
      run.label = label;
      RunReport report;
      if (clm::Status s = tiny_llama_demo::run_scenario(*stack.generator, scenario, run, report); !s.ok()) {
        return fail(s.message());
      }
      passes.push_back(tiny_llama_demo::timestamp_pass(label, report, *stack.engine));
    }
    tiny_llama_demo::print_timestamp_passes(passes);
  }
  return 0;
}
