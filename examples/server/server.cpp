// examples/server/server.cpp: routes, streaming and metrics of clm_server (server.hpp).
#include "server.hpp"

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "completion_text.hpp"

namespace clm_server {

namespace {

constexpr std::string_view kChatPath = "/v1/chat/completions";
constexpr std::string_view kModelsPath = "/v1/models";
constexpr std::size_t kMaxTenantBytes = 256;
// How often a waiting stream looks whether its client is still there.
constexpr auto kStreamPoll = std::chrono::milliseconds(200);

// One completion on its way from the generator's loop thread (on_token,
// on_done) to the handler thread that answers it.
struct Completion {
  explicit Completion(std::vector<std::string> stop) : text(std::move(stop)) {}
  std::mutex mutex;
  std::condition_variable changed;
  CompletionText text;
  std::string unsent;        // text not yet sent (all of it, for an answer in one piece)
  bool done = false;         // `result` is final
  bool client_gone = false;  // on_token returns false: the generator cancels
  tiny_llama::GenerationResult result;
};

// The path label of the server's metrics: one of the routes, or "other", so
// that random paths cannot make series without bound.
std::string route_of(const std::string& path) {
  return path == kChatPath || path == "/metrics" || path == "/health" || path == kModelsPath ? path : "other";
}

const char* allowed_methods(const std::string& path) {
  if (path == kChatPath) return "POST";
  if (path == "/metrics" || path == "/health" || path == kModelsPath) return "GET, HEAD";
  return nullptr;
}

void reply_error(httplib::Response& response, const ApiError& error) {
  response.status = error.http_status;
  response.set_content(error_json(error), "application/json");
}

ApiError server_error(int status, std::string message, std::string code) {
  return ApiError{
      .http_status = status, .message = std::move(message), .type = "server_error", .code = std::move(code)};
}

// The error a finished generation answers with, if it did not end well.
std::optional<ApiError> generation_error(const Completion& c) {
  const clm::Status& status = c.result.status;
  if (status.code() == clm::StatusCode::invalid_argument) return ApiError{.message = status.message()};
  if (status.code() == clm::StatusCode::out_of_memory) {
    return server_error(503, "the KV cache has no room for this request now; retry later", "kv_cache_full");
  }
  if (!status.ok()) return server_error(500, status.message(), "generation_failed");
  if (c.result.finish_reason == "cancelled" && !c.text.stopped()) {
    return server_error(503, "the server is shutting down", "shutting_down");
  }
  return std::nullopt;
}

CompletionUsage usage_of(const tiny_llama::GenerationResult& r) {
  return {.prompt_tokens = r.prompt_tokens,
          .completion_tokens = static_cast<std::int32_t>(r.tokens.size()),
          .cached_tokens = r.cached_tokens,
          .host_tokens = r.host_tokens,
          .storage_tokens = r.storage_tokens,
          .queue_seconds = r.queue_seconds,
          .ttft_seconds = r.ttft_seconds,
          .total_seconds = r.total_seconds};
}

// A stop string cut the answer short: the generator reports that as cancelled.
std::string finish_reason_of(const Completion& c) { return c.text.stopped() ? "stop" : c.result.finish_reason; }

}  // namespace

ChatServer::ChatServer(tiny_llama::Generator& generator, clm::Engine& engine, const ServerOptions& options)
    : generator_(generator),
      engine_(engine),
      options_(options),
      http_(std::make_unique<httplib::Server>()),
      id_prefix_(std::random_device{}()) {
  const std::size_t threads = static_cast<std::size_t>(std::max(1, options_.http_threads));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_tcp_nodelay(true);  // stream chunks are small: send each at once

  http_->Post(std::string(kChatPath),
              [this](const httplib::Request& request, httplib::Response& response,
                     const httplib::ContentReader& content_reader) { handle_chat(request, response, content_reader); });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_text(), std::string(clm::kMetricsContentType));
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("{\"status\":\"ok\"}", "application/json");
  });
  // OpenAI's model list: the one model this server serves, and its context.
  http_->Get(std::string(kModelsPath), [this](const httplib::Request&, httplib::Response& response) {
    const nlohmann::json list = {{"object", "list"},
                                 {"data",
                                  {{{"id", options_.model_name},
                                    {"object", "model"},
                                    {"created", started_unix_},
                                    {"owned_by", "clmcache"},
                                    {"max_model_len", options_.limits.context_tokens}}}}};
    response.set_content(list.dump(), "application/json");
  });
  // httplib's own errors (no route, a body over the limit, a malformed
  // request line) in OpenAI's shape; a known path with another method is 405.
  // (A HandlerWithResponse: a plain lambda would fit both overloads.)
  http_->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours, already shaped
        ApiError error{.http_status = response.status};
        if (response.status == 404 && allowed_methods(request.path)) {
          response.status = error.http_status = 405;
          response.set_header("Allow", allowed_methods(request.path));
          error.message =
              fmt::format("{} {} is not allowed; use {}", request.method, request.path, allowed_methods(request.path));
          error.code = "method_not_allowed";
        } else if (response.status == 404) {
          error.message = fmt::format("no such path: {} {}", request.method, request.path);
          error.code = "unknown_url";
        } else if (response.status == 413) {
          error.message = "the request body is too large";
          error.code = "payload_too_large";
        } else {
          error.message = fmt::format("the request could not be handled (HTTP {})", response.status);
        }
        reply_error(response, error);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(response, server_error(500, what, "internal_error"));
  });
  // Counted before the response is written, so a client that has its answer
  // finds it counted.
  http_->set_post_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    count_response(route_of(request.path), response.status);
  });
}

ChatServer::~ChatServer() { shutdown(); }

clm::Status ChatServer::bind(int port, int& bound_port) {
  bound_port = port == 0 ? http_->bind_to_any_port("127.0.0.1") : (http_->bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound_port < 0) return clm::io_error(fmt::format("cannot listen on 127.0.0.1:{}", port));
  bound_ = true;
  return {};
}

bool ChatServer::serve() {
  {
    std::lock_guard lock(accepting_mutex_);
    if (!bound_ || !accepting_) return bound_;
    serving_ = true;
  }
  const bool served = http_->listen_after_bind();
  serving_ = false;
  return served;
}

void ChatServer::shutdown() {
  {
    std::lock_guard lock(accepting_mutex_);
    if (!accepting_) return;
    accepting_ = false;
  }
  // httplib's stop() stops only a server already in its accept loop.
  while (serving_ && !http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();      // the listening socket closes; serve() waits for the handlers
  generator_.stop();  // cancels what runs and waits: every handler gets its on_done
}

bool ChatServer::submit(std::vector<std::int32_t> prompt, tiny_llama::GenerateOptions options,
                        tiny_llama::TokenCallback on_token, tiny_llama::DoneCallback on_done) {
  std::lock_guard lock(accepting_mutex_);  // after shutdown's stop(), no request could end
  if (!accepting_) return false;
  generator_.submit(std::move(prompt), std::move(options), std::move(on_token), std::move(on_done));
  return true;
}

void ChatServer::handle_chat(const httplib::Request& request, httplib::Response& response,
                             const httplib::ContentReader& content_reader) {
  // Without a length or chunks, httplib would read until the client closes.
  if (!request.has_header("Content-Length") && request.get_header_value("Transfer-Encoding") != "chunked") {
    return reply_error(response, {.http_status = 411,
                                  .message = "the request needs a body with a Content-Length (or chunked)",
                                  .code = "length_required"});
  }
  std::string body;
  bool too_large = false;
  const bool read = content_reader([&](const char* data, std::size_t size) {
    too_large = body.size() + size > options_.max_body_bytes;  // a chunked body has no Content-Length to check
    if (!too_large) body.append(data, size);
    return !too_large;
  });
  if (too_large || response.status == 413) {
    return reply_error(response, {.http_status = 413,
                                  .message = fmt::format("the request body is over {} bytes", options_.max_body_bytes),
                                  .code = "payload_too_large"});
  }
  if (!read) return reply_error(response, {.message = "could not read the request body", .code = "bad_body"});

  const std::string tenant = request.get_header_value("X-Tenant");
  if (tenant.size() > kMaxTenantBytes) {
    return reply_error(response, {.message = fmt::format("X-Tenant is over {} bytes", kMaxTenantBytes),
                                  .param = "X-Tenant",
                                  .code = "invalid_value"});
  }
  ChatRequest chat;
  if (auto error = parse_chat_request(body, options_.limits, chat)) return reply_error(response, *error);
  std::vector<std::int32_t> prompt = tiny_llama::ByteTokenizer::apply_chat_template(chat.messages);
  if (auto error = check_prompt_length(prompt.size(), options_.limits)) return reply_error(response, *error);

  tiny_llama::GenerateOptions generate;
  generate.max_new_tokens = chat.max_tokens;
  generate.temperature = chat.temperature;
  generate.seed = chat.seed.value_or(std::random_device{}());
  if (!chat.ignore_eos) generate.stop_tokens = {tiny_llama::ByteTokenizer::kEndOfTurn};
  generate.cache_salt = tenant;

  auto completion = std::make_shared<Completion>(chat.stop);
  auto on_token = [completion](std::int32_t token) {
    std::lock_guard lock(completion->mutex);
    if (completion->client_gone) return false;
    completion->unsent += completion->text.push(token);
    completion->changed.notify_all();
    return !completion->text.stopped();
  };
  auto on_done = [this, completion](const tiny_llama::GenerationResult& result) {
    count_generation(result);
    std::lock_guard lock(completion->mutex);
    completion->result = result;
    completion->unsent += completion->text.finish();
    completion->done = true;
    completion->changed.notify_all();
  };
  if (!submit(std::move(prompt), std::move(generate), std::move(on_token), std::move(on_done))) {
    return reply_error(response, server_error(503, "the server is shutting down", "shutting_down"));
  }
  const CompletionHeader header{.id = next_completion_id(),
                                .created = static_cast<std::int64_t>(std::time(nullptr)),
                                .model = chat.model,
                                .include_usage = chat.stream && chat.include_usage};

  if (!chat.stream) {
    std::unique_lock lock(completion->mutex);
    completion->changed.wait(lock, [&] { return completion->done; });
    if (auto error = generation_error(*completion)) return reply_error(response, *error);
    response.set_content(
        completion_json(header, completion->unsent, finish_reason_of(*completion), usage_of(completion->result)),
        "application/json");
    return;
  }

  {
    std::lock_guard lock(metrics_mutex_);
    ++streams_;
  }
  response.set_header("Cache-Control", "no-cache");
  // httplib calls the provider again and again until sink.done(); each call
  // waits for text (or a while, to look at the socket) and sends it.
  auto provide = [this, completion, header, sent_role = false](std::size_t, httplib::DataSink& sink) mutable {
    const auto client_left = [&] {
      {
        std::lock_guard lock(completion->mutex);
        completion->client_gone = true;
      }
      count_disconnect();
      return false;
    };
    const auto send = [&](const std::string& event) {
      return (sink.is_writable() && sink.write(event.data(), event.size())) || client_left();
    };
    if (!sent_role) {
      sent_role = true;
      if (!send(sse_event(chunk_json(header, {.role = true})))) return false;
    }
    std::string piece;
    bool done = false;
    {
      std::unique_lock lock(completion->mutex);
      completion->changed.wait_for(lock, kStreamPoll, [&] { return completion->done || !completion->unsent.empty(); });
      piece.swap(completion->unsent);
      done = completion->done;
    }
    if (!piece.empty() && !send(sse_event(chunk_json(header, {.content = piece})))) return false;
    if (!done) return !piece.empty() || sink.is_writable() || client_left();
    // `result` is final once done: no lock needed to read it.
    if (auto error = generation_error(*completion)) {
      if (!send(sse_event(error_json(*error)))) return false;
    } else {
      const std::string reason = finish_reason_of(*completion);
      if (!send(sse_event(chunk_json(header, {.finish_reason = reason})))) return false;
      const CompletionUsage usage = usage_of(completion->result);
      if (header.include_usage && !send(sse_event(chunk_json(header, {.usage = &usage})))) return false;
    }
    if (!send(std::string(kSseDone))) return false;
    sink.done();
    return true;
  };
  // The response ends (the client went away, or the server stops) before the
  // generation did: cancel it.
  auto release = [completion](bool) {
    std::lock_guard lock(completion->mutex);
    if (!completion->done) completion->client_gone = true;
  };
  response.set_chunked_content_provider("text/event-stream", std::move(provide), std::move(release));
}

std::string ChatServer::next_completion_id() {
  return fmt::format("chatcmpl-{:08x}{:08x}", id_prefix_, next_id_.fetch_add(1));
}

void ChatServer::count_response(const std::string& path, int status) {
  std::lock_guard lock(metrics_mutex_);
  ++responses_[{path, status}];
}

void ChatServer::count_generation(const tiny_llama::GenerationResult& result) {
  std::lock_guard lock(metrics_mutex_);
  completion_tokens_ += result.tokens.size();
  if (result.tokens.empty()) return;  // no first token
  const auto bucket = std::lower_bound(kTtftBounds.begin(), kTtftBounds.end(), result.ttft_seconds);
  ++ttft_counts_[static_cast<std::size_t>(bucket - kTtftBounds.begin())];
  ttft_sum_ += result.ttft_seconds;
}

void ChatServer::count_disconnect() {
  std::lock_guard lock(metrics_mutex_);
  ++disconnects_;
}

std::string ChatServer::metrics_text() const {
  // One snapshot of the engine for its families and for the ones below.
  const clm::EngineMetrics m = engine_.metrics();
  std::string out = clm::format_metrics_text(m);
  // What a fleet scheduler reads (vLLM's num_requests_running/_waiting and
  // kv_cache_usage_perc): the pool's share no eviction can free, pages of
  // running requests and protected ones, not cached pages free to go.
  const std::int64_t pages = m.cache.pages_used + m.cache.pages_free;
  const std::int64_t held = m.cache.pages_used - m.cache.evictable_tokens / engine_.page_size();
  const double usage =
      pages > 0 ? static_cast<double>(std::max<std::int64_t>(held, 0)) / static_cast<double>(pages) : 0;
  const std::size_t running = generator_.running(), waiting = generator_.waiting();
  std::lock_guard lock(metrics_mutex_);
  const auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  family("clm_server_num_requests_running", "gauge", "Requests admitted: prefilling or decoding.");
  out += fmt::format("clm_server_num_requests_running {}\n", running);
  family("clm_server_num_requests_waiting", "gauge", "Requests queued, not yet admitted.");
  out += fmt::format("clm_server_num_requests_waiting {}\n", waiting);
  family("clm_kv_cache_usage_ratio", "gauge",
         "Share of the KV pool no eviction can free (running requests' and protected pages), 0 to 1.");
  out += fmt::format("clm_kv_cache_usage_ratio {}\n", usage);
  family("clm_server_requests_total", "counter", "HTTP responses, by route (or other) and status code.");
  for (const auto& [key, count] : responses_) {
    out += fmt::format("clm_server_requests_total{{path=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, count);
  }
  family("clm_server_streaming_requests_total", "counter", "Chat completions answered with server-sent events.");
  out += fmt::format("clm_server_streaming_requests_total {}\n", streams_);
  family("clm_server_client_disconnects_total", "counter",
         "Streams whose client went away before the end (the generation is cancelled).");
  out += fmt::format("clm_server_client_disconnects_total {}\n", disconnects_);
  family("clm_server_completion_tokens_total", "counter", "Tokens generated for chat completions.");
  out += fmt::format("clm_server_completion_tokens_total {}\n", completion_tokens_);
  family("clm_server_time_to_first_token_seconds", "histogram",
         "From a chat completion's submission to the generator to its first token.");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kTtftBounds.size(); ++i) {
    cumulative += ttft_counts_[i];
    out += fmt::format("clm_server_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n", kTtftBounds[i], cumulative);
  }
  cumulative += ttft_counts_.back();
  out += fmt::format("clm_server_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", cumulative);
  out += fmt::format("clm_server_time_to_first_token_seconds_sum {}\n", ttft_sum_);
  out += fmt::format("clm_server_time_to_first_token_seconds_count {}\n", cumulative);
  return out;
}

}  // namespace clm_server
