// examples/server/main.cpp: the clm_server command, a small OpenAI-style
// chatbot backend over the tiny_llama decoder and the engine (server.hpp has
// the routes), on 127.0.0.1 only.
//
//   clm_server [--port 8000] [--threads N] [--http-threads 16] [--page-size 16] [--pool-tokens 32768]
//              [--weights model.safetensors] [--config config.json] [--max-batch 32]
//              [--default-max-tokens 256] [--max-body-bytes 1048576]
//              [--model-id ID] [--kv-events ENDPOINT [--kv-events-replay ENDPOINT] [--kv-events-topic TOPIC]
//               [--kv-events-batch-ms 10] [--kv-events-buffer 10000] [--kv-events-dp-rank 0]]
//
//   curl -s localhost:8000/v1/chat/completions -H 'X-Tenant: acme'
//        -d '{"messages": [{"role": "user", "content": "What is Debian?"}], "max_tokens": 32}'
//
// The model: --weights + --config, or the deterministic random init of
// --config's shape (tiny_llama's default shape without --config). --port 0
// picks a free port. The first line on stdout is "listening on
// 127.0.0.1:PORT". On SIGTERM or SIGINT the server stops accepting, cancels
// what runs, checks the engine (its invariants, and no sequence left), prints
// one JSON line of final metrics and exits 0, or 3 when the check fails (a
// leaked page). Bad flags or a model that does not load: exit 2.
//
// --kv-events publishes the cache's changes as vLLM's KV events on a ZeroMQ
// PUB socket for a cache-aware router (docs/fleet.md; "tcp://127.0.0.1:*"
// picks a port); it needs --model-id, the host's fingerprint of the weights
// (the block hashes name the model). The second line on stdout is then
// "kv events on ENDPOINT" (and " replay ENDPOINT" with --kv-events-replay).
#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "clm/events/kv_events_config.hpp"
#include "generator.hpp"
#include "server.hpp"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "clm_server: %s\n", message.c_str());
  return 2;
}

struct Flags {
  int port = 8000;
  int threads = 0;  // the model's compute threads; 0 = the hardware's
  int http_threads = 16;
  std::int32_t page_size = 16;
  std::int64_t pool_tokens = 32768;
  std::string weights, config;
  std::int32_t max_batch = 32;
  std::int32_t default_max_tokens = 256;
  std::int64_t max_body_bytes = 1 << 20;
  std::string model_id;
  clm::KvEventsConfig kv_events;  // enabled by --kv-events
};

std::string parse_flags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) return fmt::format("{} needs a value (or is unknown)", flag);
    const std::string value = argv[++i];
    try {
      std::size_t used = value.size();
      if (flag == "--port") {
        f.port = std::stoi(value, &used);
      } else if (flag == "--threads") {
        f.threads = std::stoi(value, &used);
      } else if (flag == "--http-threads") {
        f.http_threads = std::stoi(value, &used);
      } else if (flag == "--page-size") {
        f.page_size = std::stoi(value, &used);
      } else if (flag == "--pool-tokens") {
        f.pool_tokens = std::stoll(value, &used);
      } else if (flag == "--weights") {
        f.weights = value;
      } else if (flag == "--config") {
        f.config = value;
      } else if (flag == "--max-batch") {
        f.max_batch = std::stoi(value, &used);
      } else if (flag == "--default-max-tokens") {
        f.default_max_tokens = std::stoi(value, &used);
      } else if (flag == "--max-body-bytes") {
        f.max_body_bytes = std::stoll(value, &used);
      } else if (flag == "--model-id") {
        f.model_id = value;
      } else if (flag == "--kv-events") {
        f.kv_events.enabled = true;
        f.kv_events.endpoint = value;
      } else if (flag == "--kv-events-replay") {
        f.kv_events.replay_endpoint = value;
      } else if (flag == "--kv-events-topic") {
        f.kv_events.topic = value;
      } else if (flag == "--kv-events-batch-ms") {
        f.kv_events.batch_interval_ms = std::stoi(value, &used);
      } else if (flag == "--kv-events-buffer") {
        f.kv_events.buffer_batches = std::stoi(value, &used);
      } else if (flag == "--kv-events-dp-rank") {
        f.kv_events.data_parallel_rank = std::stoi(value, &used);
      } else {
        return fmt::format("unknown flag {}", flag);
      }
      if (used != value.size()) return fmt::format("{}: not a number: {}", flag, value);
    } catch (const std::exception&) {
      return fmt::format("{}: not a number: {}", flag, value);
    }
  }
  if (f.port < 0 || f.port > 65535) return fmt::format("--port must be in [0, 65535], got {}", f.port);
  if (f.threads < 0) return fmt::format("--threads must be >= 0, got {}", f.threads);
  if (f.http_threads < 1) return fmt::format("--http-threads must be >= 1, got {}", f.http_threads);
  if (f.page_size < 1) return fmt::format("--page-size must be >= 1, got {}", f.page_size);
  if (f.pool_tokens < f.page_size || f.pool_tokens / f.page_size > (std::int64_t{1} << 30)) {
    return fmt::format("--pool-tokens must hold at least one page and at most 2^30 pages, got {}", f.pool_tokens);
  }
  if (f.max_batch < 1) return fmt::format("--max-batch must be >= 1, got {}", f.max_batch);
  if (f.default_max_tokens < 1) return fmt::format("--default-max-tokens must be >= 1, got {}", f.default_max_tokens);
  if (f.max_body_bytes < 1) return fmt::format("--max-body-bytes must be >= 1, got {}", f.max_body_bytes);
  const bool kv_flag = !f.kv_events.replay_endpoint.empty() || !f.kv_events.topic.empty() ||
                       f.kv_events.batch_interval_ms != clm::KvEventsConfig{}.batch_interval_ms ||
                       f.kv_events.buffer_batches != clm::KvEventsConfig{}.buffer_batches ||
                       f.kv_events.data_parallel_rank != 0;
  if (kv_flag && !f.kv_events.enabled) return "the --kv-events-* flags need --kv-events ENDPOINT";
  if (f.kv_events.enabled && f.model_id.empty()) {
    return "--kv-events needs --model-id (the host's fingerprint of its weights, e.g. their SHA-256): "
           "the block hashes name the model";
  }
  // The rest (endpoints ZeroMQ refuses, a long topic, sizes under 1) the engine names.
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (std::string error = parse_flags(argc, argv, flags); !error.empty()) return fail(error);

  // Before any thread starts, so that every thread inherits the mask: the
  // signals then reach only the sigwait() below, never a worker mid-step.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not death

  tiny_llama::LlamaConfig config;
  tiny_llama::LlamaWeights weights;
  if (clm::Status s = tiny_llama::load_or_init_llama(flags.config, flags.weights, 1, config, weights); !s.ok()) {
    return fail(s.message());
  }
  clm::EngineConfig engine_config;
  engine_config.pool = tiny_llama::kv_pool_for(
      config, flags.page_size, flags.pool_tokens / flags.page_size * flags.page_size, clm::KvDType::f32);
  engine_config.model_id = flags.model_id;
  engine_config.kv_events = flags.kv_events;
  std::unique_ptr<clm::Engine> engine;
  if (clm::Status s = clm::Engine::create(engine_config, engine); !s.ok()) return fail(s.message());
  std::unique_ptr<tiny_llama::LlamaModel> model;
  const tiny_llama::GeneratorOptions generator_options{.max_batch = flags.max_batch};
  if (clm::Status s = tiny_llama::LlamaModel::create(
          config, std::move(weights), *engine,
          {.threads = flags.threads,
           .workspace_rows = generator_options.prefill_token_budget + generator_options.max_batch},
          model);
      !s.ok()) {
    return fail(s.message());
  }
  tiny_llama::Generator generator(*model, generator_options);
  generator.start();

  // A prompt must fit the model's context and, with its answer, the pool.
  const auto context = static_cast<std::int32_t>(std::min<std::int64_t>(config.max_position, flags.pool_tokens));
  clm_server::ChatServer server(generator, *engine,
                                {.limits = {.context_tokens = context, .default_max_tokens = flags.default_max_tokens},
                                 .max_body_bytes = static_cast<std::size_t>(flags.max_body_bytes),
                                 .http_threads = flags.http_threads});
  int port = 0;
  if (clm::Status s = server.bind(flags.port, port); !s.ok()) return fail(s.message());
  std::printf("listening on 127.0.0.1:%d\n", port);
  if (engine->kv_events_enabled()) {
    const std::string replay = engine->kv_events_replay_endpoint();
    std::printf("kv events on %s%s\n", engine->kv_events_endpoint().c_str(),
                replay.empty() ? "" : (" replay " + replay).c_str());
  }
  std::fflush(stdout);

  bool served = true;
  std::thread serving([&] {
    served = server.serve();
    if (!served) kill(getpid(), SIGTERM);  // wake the sigwait below
  });
  int signal = 0;
  sigwait(&stop_signals, &signal);
  server.shutdown();
  serving.join();

  const clm::Status invariants = engine->check_invariants();
  const clm::EngineMetrics m = engine->metrics();
  const bool clean = invariants.ok() && m.active_sequences == 0;
  const nlohmann::ordered_json final_metrics = {{"event", "shutdown"},
                                                {"signal", signal == SIGINT ? "SIGINT" : "SIGTERM"},
                                                {"invariants", invariants.ok() ? "ok" : invariants.message()},
                                                {"active_sequences", m.active_sequences},
                                                {"admitted", m.admitted},
                                                {"finished", m.finished},
                                                {"aborted", m.aborted},
                                                {"rejected", m.rejected},
                                                {"prefix_cache_queries_tokens", m.cache.tokens_queried},
                                                {"prefix_cache_hit_tokens", m.cache.tokens_hit},
                                                {"cached_tokens", m.cache.cached_tokens},
                                                {"pages_used", m.cache.pages_used},
                                                {"pages_free", m.cache.pages_free},
                                                {"kv_events_published", m.kv_events.published_events}};
  std::printf("%s\n", final_metrics.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  if (!served) return fail("the listening socket failed");
  return clean ? 0 : 3;
}
