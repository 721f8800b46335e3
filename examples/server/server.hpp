// examples/server/server.hpp: clm_server's HTTP side (cpp-httplib) over one
// tiny_llama::Generator and its Engine: routes, streaming, tenants, limits,
// drain and the server's own metrics. main.cpp owns the model and the signals.
//
//   clm_server::ChatServer server(generator, engine, {.limits = {.context_tokens = 8192}});
//   int port = 0;
//   CLM_RETURN_IF_ERROR(server.bind(0, port));  // options.host (127.0.0.1), any free port
//   std::thread serving([&] { server.serve(); });
//   ...
//   server.drain(std::chrono::seconds(30));  // SIGTERM: finish what runs, 503 the rest
//   server.shutdown();                       // stop accepting, cancel what runs, release the handlers
//   serving.join();
//
// Routes:
//   POST /v1/chat/completions  OpenAI-style (chat_api.hpp); "stream": true
//                              answers with server-sent events
//   GET  /v1/models            the served model
//   GET  /metrics              Prometheus text: the engine's metrics_text()
//                              and the clm_server_* families below
//   GET  /health, /health/ready  200 {"status":"ok"}; 503 {"status":"draining"}
//                              once a drain starts (readiness: take me out)
//   GET  /health/live          200 while the process serves (liveness)
//   GET  /debug/engine         the engine's invariants and counts (JSON); with
//                              API keys, for admin keys only
// Other paths are 404, other methods on these paths 405, bodies over
// max_body_bytes 413; every error has OpenAI's {"error": {...}} shape.
//
// Tenants: with API keys (api_keys.hpp) the bearer token names the tenant, and
// a missing or unknown token is 401; without, every request is the default
// tenant "". The tenant is the request's cache salt, so tenants never share
// cached pages. X-Tenant is honoured only with trust_x_tenant (a gateway in
// front that authenticated the client sets it; with API keys too, it names a
// tenant within the key's); otherwise a request that sends it is refused.
//
// Limits: a request's deadline is request_timeout_s, or its X-Request-Timeout
// header (seconds, at most max_request_timeout_s); past it the generation is
// cancelled and the answer is 504 (in a stream: an error event). A body that
// has not arrived within body_timeout_s is 408. More than max_waiting
// requests queued for the generator: 429 with Retry-After (as is a key over
// its rate limit). A client that leaves cancels its request, streamed or not.
//
// Threads: httplib's handler threads submit to the generator, whose loop
// thread runs on_token / on_done; each request hands its text over through
// its own mutex and condition variable, and nothing calls into the generator
// while holding one. A stream whose client has gone (a write fails, or the
// socket is closed) makes on_token return false: the generator cancels the
// request and releases its pages; a non-streamed request's handler watches
// its socket while it waits and cancels the same way. A connection that sends
// no complete request head within header_timeout_s (a byte a second) is
// closed (ConnectionWatchdog, connections.hpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_keys.hpp"
#include "chat_api.hpp"
#include "clm/engine.hpp"
#include "generator.hpp"
#include "hf_tokenizer.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace clm_server {

class ConnectionWatchdog;

struct ServerOptions {
  RequestLimits limits;
  std::size_t max_body_bytes = std::size_t{1} << 20;
  int http_threads = 16;                    // connections served at once (each request waits for its answer)
  int max_pending_connections = 64;         // accepted, waiting for a thread; past it accepting pauses
  std::string model_name = "tiny-llama";    // what GET /v1/models lists
  std::string host = "127.0.0.1";           // the address to listen on
  std::string tls_cert_file, tls_key_file;  // both given: HTTPS (PEM files)
  double request_timeout_s = 600;           // a request's deadline unless it asks for another ...
  double max_request_timeout_s = 3600;      // ... with X-Request-Timeout, up to this
  double body_timeout_s = 30;               // the whole body must arrive within this: 408
  double header_timeout_s = 10;             // a request head (and a TLS handshake) within this, else closed
  std::size_t max_waiting = 256;            // requests queued for the generator; past it 429
  double retry_after_s = 5;                 // what a 503 while draining (and a full queue's 429) tell clients
  const ApiKeys* api_keys = nullptr;        // nullptr: no keys (every request is tenant "")
  bool trust_x_tenant = false;
  bool prefix_cache = true;  // false: requests neither reuse nor publish cached pages
  // A Hugging Face tokenizer (--tokenizer): prompts are its ChatML template,
  // answers stop at its <|im_end|>. nullptr: the byte tokenizer's template.
  const clm_tokenizer::HfTokenizer* tokenizer = nullptr;
  double hint_ttl_s = 120;  // how long a continuing conversation keeps its priority after an answer
  bool clm = false;         // a ClmLoop is installed: every request uses CLM in the loop
};

// The engine's invariants and counts as one JSON object (GET /debug/engine,
// and clm_server's last line at shutdown).
nlohmann::ordered_json engine_summary_json(const clm::Engine& engine);
// The CLM watch's report (GET /debug/cache): low-SRC keys and the last events.
nlohmann::ordered_json clm_anomalies_json(const clm::ClmAnomalyReport& report);

class ChatServer {
 public:
  ChatServer(tiny_llama::Generator& generator, clm::Engine& engine, const ServerOptions& options);
  ~ChatServer();  // shuts down first
  ChatServer(const ChatServer&) = delete;
  ChatServer& operator=(const ChatServer&) = delete;

  // Binds options.host:port (0: a free port) and sets bound_port; an
  // invalid_argument when the TLS certificate or key does not load.
  clm::Status bind(int port, int& bound_port);
  // Serves until shutdown(); false when the listening socket failed.
  bool serve();
  // Stops accepting (new requests get 503), stops the generator (cancelling
  // what runs and waits), so serve() returns once the handlers have answered.
  // Call it from another thread than serve()'s; calls after the first do nothing.
  void shutdown();
  // Starts a drain: new requests get 503 with Retry-After and /health turns
  // 503, while running and queued requests go on; returns once none is left
  // (true) or `grace` has passed (false; shutdown() then cancels the rest).
  bool drain(std::chrono::milliseconds grace);
  bool draining() const { return draining_.load(); }

  // The engine's metrics_text() followed by the server's families.
  std::string metrics_text() const;

 private:
  // A divergence report as JSON, each point's context as ids and as the tokenizer's text.
  nlohmann::ordered_json divergence_json(const clm::DivergenceReport& report) const;
  void handle_chat(const httplib::Request& request, httplib::Response& response,
                   const httplib::ContentReader& content_reader);
  // Queues a request unless draining or shut down; nullopt: answer 503.
  std::optional<std::uint64_t> submit(std::vector<std::int32_t> prompt, tiny_llama::GenerateOptions options,
                                      tiny_llama::TokenCallback on_token, tiny_llama::DoneCallback on_done);
  // The request's tenant (its cache salt) and whether its key is an admin's;
  // an error (401, 400, 429) when it may not go on.
  std::optional<ApiError> authenticate(const httplib::Request& request, std::string& salt, bool& admin);
  void reply_refusal(httplib::Response& response, const ApiError& error);
  // A pin a request asks for: its first `tokens` prompt tokens, for `ttl`;
  // `param` names the field that asked (in errors and X-Clm-Pins).
  struct PlannedPin {
    std::size_t tokens = 0;
    std::chrono::milliseconds ttl{};
    std::string param;
  };
  // 400 when the pins would not fit the engine's pin budget now (or the cache is off).
  std::optional<ApiError> check_pin_budget(const std::vector<PlannedPin>& pins) const;
  // The conversation's hint key (tenant, name) when its client says it will
  // continue; empty when not; a 400 for a malformed header or a missing name.
  std::optional<ApiError> conversation_hint_key(const httplib::Request& request, const ChatRequest& chat,
                                                const std::string& tenant, std::string& key) const;
  // The adapter id the generator caches this server's requests under (CLM's
  // own with a ClmLoop, generator.hpp): pins and hints must name the same.
  std::int32_t cache_adapter() const { return options_.clm ? tiny_llama::kClmAdapterId : 0; }
  void apply_hint(const std::string& key, const std::vector<std::int32_t>& prompt,
                  const std::vector<std::int32_t>& answer, const std::string& tenant);
  // The prompt of `messages` with the server's tokenizer (and, with
  // add_generation_prompt, the assistant's header); a 400 when the text
  // cannot be encoded.
  std::optional<ApiError> template_prompt(const std::vector<tiny_llama::ChatMessage>& messages,
                                          bool add_generation_prompt, std::vector<std::int32_t>& out) const;
  // Pins each under the tenant's salt; what became of them (the X-Clm-Pins header).
  std::string apply_pins(const std::vector<PlannedPin>& pins, const std::vector<std::int32_t>& tokens,
                         const std::string& tenant);
  void count_response(const std::string& path, int status);
  void count_generation(const tiny_llama::GenerationResult& result);
  void count_disconnect();
  std::string next_completion_id();

  tiny_llama::Generator& generator_;
  clm::Engine& engine_;
  ServerOptions options_;
  const std::int64_t started_unix_ = static_cast<std::int64_t>(std::time(nullptr));  // /v1/models' "created"
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<ConnectionWatchdog> watchdog_;  // set by bind()

  std::mutex accepting_mutex_;  // submit() and serve() against shutdown() and drain()
  bool accepting_ = true;
  bool shut_down_ = false;
  std::atomic<bool> draining_{false};
  bool bound_ = false;
  std::atomic<bool> serving_{false};

  const std::uint32_t id_prefix_;
  std::atomic<std::uint64_t> next_id_{1};

  // A Prometheus histogram of seconds: counts per bucket (and +Inf), and their sum.
  struct Histogram {
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;  // bounds.size() + 1
    double sum = 0.0;
    explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
    void observe(double seconds);
    void append_text(std::string& out, std::string_view name) const;
  };
  mutable std::mutex metrics_mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> responses_;  // (path, status) -> count
  std::map<std::string, std::uint64_t> finished_;                   // generations by finish reason
  std::uint64_t streams_ = 0;
  std::uint64_t disconnects_ = 0;
  std::uint64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  std::uint64_t cached_device_tokens_ = 0, cached_host_tokens_ = 0, cached_storage_tokens_ = 0;
  std::uint64_t queue_full_ = 0;      // 429s for a full queue
  std::uint64_t rate_limited_ = 0;    // 429s for a key over its rate
  std::uint64_t drain_refusals_ = 0;  // 503s while draining
  Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0}};
  Histogram e2e_{{0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0}};
  Histogram tpot_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5}};
};

}  // namespace clm_server
