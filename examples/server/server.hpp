// examples/server/server.hpp: clm_server's HTTP side (cpp-httplib) over one
// tiny_llama::Generator and its Engine: routes, streaming, tenants and the
// server's own metrics. main.cpp owns the model and the signals.
//
//   clm_server::ChatServer server(generator, engine, {.limits = {.context_tokens = 8192}});
//   int port = 0;
//   CLM_RETURN_IF_ERROR(server.bind(0, port));  // 127.0.0.1, any free port
//   std::thread serving([&] { server.serve(); });
//   ...
//   server.shutdown();  // stop accepting, cancel what runs, release the handlers
//   serving.join();
//
// Routes:
//   POST /v1/chat/completions  OpenAI-style (chat_api.hpp); "stream": true
//                              answers with server-sent events
//   GET  /metrics              Prometheus text: the engine's metrics_text()
//                              and the clm_server_* families below
//   GET  /health               200 {"status":"ok"}
// Other paths are 404, other methods on these paths 405, bodies over
// max_body_bytes 413; every error has OpenAI's {"error": {...}} shape.
//
// Tenants: the X-Tenant header names the tenant (absent: the default tenant
// ""). It is the request's cache salt, so tenants never share cached pages.
//
// Threads: httplib's handler threads submit to the generator, whose loop
// thread runs on_token / on_done; each request hands its text over through
// its own mutex and condition variable, and nothing calls into the generator
// while holding one. A stream whose client has gone (a write fails, or the
// socket is closed) makes on_token return false: the generator cancels the
// request and releases its pages.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "chat_api.hpp"
#include "clm/engine.hpp"
#include "generator.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace clm_server {

struct ServerOptions {
  RequestLimits limits;
  std::size_t max_body_bytes = std::size_t{1} << 20;
  int http_threads = 16;                  // requests served at once (each waits for its answer)
  std::string model_name = "tiny-llama";  // what GET /v1/models lists
};

class ChatServer {
 public:
  ChatServer(tiny_llama::Generator& generator, clm::Engine& engine, const ServerOptions& options);
  ~ChatServer();  // shuts down first
  ChatServer(const ChatServer&) = delete;
  ChatServer& operator=(const ChatServer&) = delete;

  // Binds 127.0.0.1:port (0: a free port) and sets bound_port.
  clm::Status bind(int port, int& bound_port);
  // Serves until shutdown(); false when the listening socket failed.
  bool serve();
  // Stops accepting (new requests get 503), stops the generator (cancelling
  // what runs and waits), so serve() returns once the handlers have answered.
  // Call it from another thread than serve()'s; calls after the first do nothing.
  void shutdown();

  // The engine's metrics_text() followed by the server's families.
  std::string metrics_text() const;

 private:
  void handle_chat(const httplib::Request& request, httplib::Response& response,
                   const httplib::ContentReader& content_reader);
  // Queues a request unless shutting down; false: answer 503.
  bool submit(std::vector<std::int32_t> prompt, tiny_llama::GenerateOptions options, tiny_llama::TokenCallback on_token,
              tiny_llama::DoneCallback on_done);
  void count_response(const std::string& path, int status);
  void count_generation(const tiny_llama::GenerationResult& result);
  void count_disconnect();
  std::string next_completion_id();

  tiny_llama::Generator& generator_;
  clm::Engine& engine_;
  ServerOptions options_;
  const std::int64_t started_unix_ = static_cast<std::int64_t>(std::time(nullptr));  // /v1/models' "created"
  std::unique_ptr<httplib::Server> http_;

  std::mutex accepting_mutex_;  // submit() and serve() against shutdown()
  bool accepting_ = true;
  bool bound_ = false;
  std::atomic<bool> serving_{false};

  const std::uint32_t id_prefix_;
  std::atomic<std::uint64_t> next_id_{1};

  // Time to first token, Prometheus histogram buckets (seconds) and +Inf.
  static constexpr std::array<double, 12> kTtftBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                         0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
  mutable std::mutex metrics_mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> responses_;  // (path, status) -> count
  std::uint64_t streams_ = 0;
  std::uint64_t disconnects_ = 0;
  std::uint64_t completion_tokens_ = 0;
  std::array<std::uint64_t, kTtftBounds.size() + 1> ttft_counts_{};
  double ttft_sum_ = 0.0;
};

}  // namespace clm_server
