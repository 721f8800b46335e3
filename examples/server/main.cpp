// examples/server/main.cpp: the clm_server command, a small OpenAI-style
// chatbot backend over the tiny_llama decoder and the engine (server.hpp has
// the routes, tenants and limits), on 127.0.0.1 unless --host says otherwise.
//
//   clm_server [--port 8000] [--config config.json] [--weights model.safetensors] [--pool-tokens 32768]
//              [--host-tokens N [--storage URL --model-id ID]] [--kv-events ENDPOINT --model-id ID] ...
//   clm_server --server-config server.json      (the same flags as a JSON object)
//   clm_server --help                           (every flag, grouped: server_flags.cpp)
//
//   curl -s localhost:8000/v1/chat/completions -H 'Authorization: Bearer sk-...'   (with --api-keys)
//        -d '{"messages": [{"role": "user", "content": "What is Debian?"}], "max_tokens": 32}'
//
// The model: --weights + --config, or the deterministic random init of
// --config's shape (tiny_llama's default shape without --config). --port 0
// picks a free port. The first line on stdout is "listening on HOST:PORT"
// (and " (https)" with --tls-cert). On SIGTERM or SIGINT the server drains:
// new requests get 503 with Retry-After and /health turns 503, running and
// queued requests finish within --drain-grace (a second signal cuts it
// short), the rest are cancelled; then it checks the engine (its invariants,
// and no sequence left), prints one JSON line of final metrics ("drained":
// whether everything finished) and exits 0, or 3 when the check fails (a
// leaked page). Bad flags, keys or a model that does not load: exit 2.
//
// --kv-events publishes the cache's changes as vLLM's KV events on a ZeroMQ
// PUB socket for a cache-aware router (docs/fleet.md; "tcp://127.0.0.1:*"
// picks a port); it needs --model-id, the host's fingerprint of the weights
// (the block hashes name the model). The second line on stdout is then
// "kv events on ENDPOINT" (and " replay ENDPOINT" with --kv-events-replay).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "byte_tokenizer.hpp"
#include "clm_loop.hpp"
#include "generator.hpp"
#include "hf_tokenizer.hpp"
#include "server.hpp"
#include "server_flags.hpp"

namespace {

// The hex SHA-256 of a file's bytes.
clm::Status file_sha256(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return clm::io_error(fmt::format("cannot read {}", path));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    return clm::out_of_memory("SHA-256: no context");
  }
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    (void)EVP_DigestUpdate(ctx, buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  (void)EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  out.clear();
  for (unsigned int i = 0; i < length; ++i) out += fmt::format("{:02x}", digest[i]);
  return {};
}

int fail(const std::string& message) {
  std::fprintf(stderr, "clm_server: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  clm_server::ServerFlags flags;
  if (std::string error = clm_server::parse_server_flags(argc, argv, flags); !error.empty()) return fail(error);
  if (flags.help) {
    std::fputs(clm_server::server_usage().c_str(), stdout);
    return 0;
  }

  // Before any thread starts, so that every thread inherits the mask: the
  // signals then reach only the sigwait() below, never a worker mid-step.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not death

  clm_tokenizer::HfTokenizer tokenizer;
  if (!flags.tokenizer.empty()) {
    if (clm::Status s = clm_tokenizer::HfTokenizer::load(flags.tokenizer, tokenizer); !s.ok()) {
      return fail(fmt::format("--tokenizer {}: {}", flags.tokenizer, s.message()));
    }
  }
  tiny_llama::LlamaConfig config;
  tiny_llama::LlamaWeights weights;
  if (!tokenizer.loaded()) {
    if (clm::Status s = tiny_llama::load_or_init_llama(flags.config, flags.weights, 1, config, weights); !s.ok()) {
      return fail(s.message());
    }
  } else {
    // The model's vocabulary is the tokenizer's: one embedding and output row per token id.
    if (!flags.config.empty()) {
      if (clm::Status s = tiny_llama::load_llama_config(flags.config, config); !s.ok()) return fail(s.message());
    }
    config.vocab_size = tokenizer.vocab_size();
    const clm::Status s = flags.weights.empty() ? (tiny_llama::random_llama_weights(config, 1, weights), clm::Status{})
                                                : tiny_llama::load_llama_weights(flags.weights, config, weights);
    if (!s.ok()) return fail(s.message());
  }
  clm::EngineConfig engine_config = clm_server::engine_config_from(
      flags, tiny_llama::kv_pool_for(config, flags.page_size, flags.pool_tokens / flags.page_size * flags.page_size,
                                     clm::KvDType::f32));
  // The tokenizer decides what every token id means (and the vocabulary the
  // weights were made for): stored pages, KV events and snapshots name it
  // with the model, so instances with other tokenizers never share them.
  if (tokenizer.loaded() && !engine_config.model_id.empty()) {
    std::string digest;
    if (clm::Status s = file_sha256(flags.tokenizer, digest); !s.ok()) return fail(s.message());
    engine_config.model_id += "+tokenizer-sha256:" + digest;
  }
  // The store's snapshots: its default size, or half the hidden size of a
  // smaller model (as clm_demo trains them); the template's markers are not text.
  engine_config.snapshot_store.snapshot_dim = std::min(clm::SnapshotStoreConfig{}.snapshot_dim, config.hidden / 2);
  if (tokenizer.loaded()) {
    for (std::int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
      if (tokenizer.is_special(id)) engine_config.special_token_ids.push_back(id);
    }
  } else {
    engine_config.special_token_ids = {tiny_llama::ByteTokenizer::kBeginOfText, tiny_llama::ByteTokenizer::kStartHeader,
                                       tiny_llama::ByteTokenizer::kEndHeader, tiny_llama::ByteTokenizer::kEndOfTurn};
  }
  // CLM's events as JSON lines (the watch calls this under its lock, in order).
  std::ofstream clm_events;
  if (!flags.clm_events.empty()) {
    clm_events.open(flags.clm_events, std::ios::app);
    if (!clm_events) return fail(fmt::format("--clm-events: cannot open {} for appending", flags.clm_events));
    engine_config.clm_watch.on_line = [&clm_events](std::string_view line) {
      clm_events << line << '\n';
      clm_events.flush();
    };
  }
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
  std::unique_ptr<tiny_llama::ClmLoop> clm_loop;
  if (!flags.clm_dir.empty()) {
    if (tokenizer.loaded()) return fail("--clm-dir with --tokenizer: CLM in the loop reads the byte template");
    if (clm::Status s =
            tiny_llama::ClmLoop::create(*engine, config, tiny_llama::ClmFiles::in(flags.clm_dir), {}, clm_loop);
        !s.ok()) {
      return fail(fmt::format("--clm-dir {}: {}", flags.clm_dir, s.message()));
    }
    clm_loop->install(*model, generator);
  }
  generator.start();

  // A prompt must fit the model's context and, with its answer, the pool.
  const auto context = static_cast<std::int32_t>(std::min<std::int64_t>(config.max_position, flags.pool_tokens));
  clm_server::ApiKeys api_keys;
  if (!flags.api_keys.empty()) {
    if (std::string error = clm_server::ApiKeys::load(flags.api_keys, api_keys); !error.empty()) return fail(error);
  }
  clm_server::ChatServer server(generator, *engine,
                                {.limits = {.context_tokens = context, .default_max_tokens = flags.default_max_tokens},
                                 .max_body_bytes = static_cast<std::size_t>(flags.max_body_bytes),
                                 .http_threads = flags.http_threads,
                                 .max_pending_connections = flags.max_pending_connections,
                                 .model_name = flags.served_model_name,
                                 .host = flags.host,
                                 .tls_cert_file = flags.tls_cert,
                                 .tls_key_file = flags.tls_key,
                                 .request_timeout_s = flags.request_timeout_s,
                                 .max_request_timeout_s = flags.max_request_timeout_s,
                                 .body_timeout_s = flags.body_timeout_s,
                                 .header_timeout_s = flags.header_timeout_s,
                                 .max_waiting = static_cast<std::size_t>(flags.max_waiting),
                                 .retry_after_s = 5,
                                 .api_keys = flags.api_keys.empty() ? nullptr : &api_keys,
                                 .trust_x_tenant = flags.trust_x_tenant,
                                 .prefix_cache = flags.prefix_cache,
                                 .tokenizer = tokenizer.loaded() ? &tokenizer : nullptr,
                                 .hint_ttl_s = flags.hint_ttl_s,
                                 .clm = clm_loop != nullptr});
  int port = 0;
  if (clm::Status s = server.bind(flags.port, port); !s.ok()) return fail(s.message());
  std::printf("listening on %s:%d%s\n", flags.host.c_str(), port, flags.tls_cert.empty() ? "" : " (https)");
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
  // A drain: new requests get 503 and /health turns 503 at once; running ones
  // finish within the grace period. A second signal ends the wait.
  std::atomic<bool> drained{false};
  std::thread draining([&] {
    drained = server.drain(std::chrono::milliseconds(static_cast<std::int64_t>(flags.drain_grace_s * 1000)));
    kill(getpid(), SIGTERM);  // wake the sigwait below (drained, or the grace is over)
  });
  int second = 0;
  sigwait(&stop_signals, &second);
  const bool forced = !drained.load();
  server.shutdown();  // cancels what still runs
  draining.join();
  serving.join();

  engine->wait_for_tiers();  // stored pages land before exit, for the instances that share the storage
  nlohmann::ordered_json final_metrics = {
      {"event", "shutdown"}, {"signal", signal == SIGINT ? "SIGINT" : "SIGTERM"}, {"drained", !forced}};
  const nlohmann::ordered_json summary = clm_server::engine_summary_json(*engine);
  final_metrics.update(summary);
  const bool clean = summary["invariants"] == "ok" && summary["active_sequences"] == 0;
  std::printf("%s\n", final_metrics.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  if (!served) return fail("the listening socket failed");
  return clean ? 0 : 3;
}
