// examples/server/server.cpp: routes, streaming, limits, drain and metrics of clm_server (server.hpp).
#include "server.hpp"

#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "completion_text.hpp"
#include "connections.hpp"

namespace clm_server {

namespace {

constexpr std::string_view kChatPath = "/v1/chat/completions";
constexpr std::string_view kModelsPath = "/v1/models";
constexpr std::size_t kMaxTenantBytes = 256;
// How often a waiting request looks whether its client is still there.
constexpr auto kStreamPoll = std::chrono::milliseconds(200);
// Headers beyond these are 431: httplib bounds each line, not their number.
constexpr std::size_t kMaxHeaders = 100;
constexpr std::size_t kMaxHeaderBytes = 32 * 1024;
using Clock = std::chrono::steady_clock;

std::string retry_after_value(double seconds) {
  return std::to_string(static_cast<long long>(std::max(1.0, std::ceil(seconds))));
}

// One completion on its way from the generator's loop thread (on_token,
// on_done) to the handler thread that answers it.
struct Completion {
  Completion(std::vector<std::string> stop, CompletionText::TokenBytes token_bytes)
      : text(std::move(stop), std::move(token_bytes)) {}
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
bool is_get_route(const std::string& path) {
  return path == "/metrics" || path == "/health" || path == "/health/ready" || path == "/health/live" ||
         path == kModelsPath || path == "/debug/engine" || path == "/debug/cache";
}

std::string route_of(const std::string& path) { return path == kChatPath || is_get_route(path) ? path : "other"; }

const char* allowed_methods(const std::string& path) {
  if (path == kChatPath) return "POST";
  if (is_get_route(path)) return "GET, HEAD";
  return nullptr;
}

void reply_error(httplib::Response& response, const ApiError& error) {
  response.status = error.http_status;
  if (error.retry_after_s > 0) response.set_header("Retry-After", retry_after_value(error.retry_after_s));
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
  if (c.result.finish_reason == "timeout") {
    return server_error(504, "the request's deadline passed before its answer was complete", "timeout");
  }
  if (c.result.finish_reason == "cancelled" && !c.text.stopped()) {
    return server_error(503, "the server is shutting down", "shutting_down");
  }
  return std::nullopt;
}

CompletionUsage usage_of(const tiny_llama::GenerationResult& r, bool clm) {
  CompletionUsage u{.prompt_tokens = r.prompt_tokens,
                    .completion_tokens = static_cast<std::int32_t>(r.tokens.size()),
                    .cached_tokens = r.cached_tokens,
                    .host_tokens = r.host_tokens,
                    .storage_tokens = r.storage_tokens,
                    .queue_seconds = r.queue_seconds,
                    .ttft_seconds = r.ttft_seconds,
                    .total_seconds = r.total_seconds};
  if (clm) {
    u.clm = CompletionUsage::Clm{.hits_exact = r.clm.hits_exact,
                                 .hits_ann = r.clm.hits_ann,
                                 .hits_fallback = r.clm.hits_fallback,
                                 .misses = r.clm.misses,
                                 .injected_steps = r.clm.injected_steps,
                                 .recorded = r.clm.recorded,
                                 .key = r.clm.key};
  }
  return u;
}

// A stop string cut the answer short: the generator reports that as cancelled.
std::string finish_reason_of(const Completion& c) { return c.text.stopped() ? "stop" : c.result.finish_reason; }

}  // namespace

nlohmann::ordered_json engine_summary_json(const clm::Engine& engine) {
  const clm::Status invariants = engine.check_invariants();
  const clm::EngineMetrics m = engine.metrics();
  return {{"invariants", invariants.ok() ? "ok" : invariants.message()},
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
          {"host_hit_tokens", m.tiers.host_hit_tokens},
          {"storage_hit_tokens", m.tiers.storage_hit_tokens},
          {"stored_pages", m.tiers.stored_pages},
          {"kv_events_published", m.kv_events.published_events}};
}

nlohmann::ordered_json clm_anomalies_json(const clm::ClmAnomalyReport& report) {
  nlohmann::ordered_json keys = nlohmann::ordered_json::array(), events = nlohmann::ordered_json::array();
  for (const clm::LowSrcKey& k : report.low_src_keys) {
    keys.push_back({{"tenant", k.tenant},
                    {"adapter_id", k.adapter_id},
                    {"key", k.key},
                    {"sightings", k.sightings},
                    {"median_src", k.median_src}});
  }
  for (const clm::ClmEvent& e : report.events) events.push_back(nlohmann::ordered_json::parse(clm::clm_event_json(e)));
  return {{"enabled", true},           {"window_ms", report.window_ms},   {"min_sightings", report.min_sightings},
          {"low_src", report.low_src}, {"low_src_keys", std::move(keys)}, {"events", std::move(events)}};
}

nlohmann::ordered_json ChatServer::divergence_json(const clm::DivergenceReport& report) const {
  auto text = [this](const std::vector<std::int32_t>& tokens) {
    std::string out;
    if (const clm_tokenizer::HfTokenizer* tokenizer = options_.tokenizer) {
      if (!tokenizer->decode(tokens, out).ok()) out.clear();
      return out;
    }
    return tiny_llama::ByteTokenizer::decode(tokens);
  };
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const clm::BranchPoint& p : report.points) {
    points.push_back({{"tenant", p.tenant},
                      {"adapter_id", p.adapter_id},
                      {"depth_tokens", p.depth},
                      {"branches", p.branches},
                      {"hits", p.hits},
                      {"overcount", p.overcount},
                      {"before", p.before},
                      {"after", p.after},
                      {"cached_after", p.cached_after},
                      {"before_text", text(p.before)},
                      {"after_text", text(p.after)},
                      {"cached_after_text", text(p.cached_after)}});
  }
  return {{"enabled", report.enabled}, {"window_ms", report.window_ms}, {"points", std::move(points)}};
}

// The server itself: HTTPS when a certificate and key are given (bind() says
// when they do not load).
std::unique_ptr<httplib::Server> make_http_server(const ServerOptions& options) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) return std::make_unique<httplib::Server>();
  return std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(), options.tls_key_file.c_str());
}

ChatServer::ChatServer(tiny_llama::Generator& generator, clm::Engine& engine, const ServerOptions& options)
    : generator_(generator),
      engine_(engine),
      options_(options),
      http_(make_http_server(options)),
      id_prefix_(std::random_device{}()) {
  const std::size_t threads = static_cast<std::size_t>(std::max(1, options_.http_threads));
  const std::size_t pending = static_cast<std::size_t>(std::max(1, options_.max_pending_connections));
  http_->new_task_queue = [threads, pending] { return new BoundedTaskQueue(threads, pending); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_tcp_nodelay(true);  // stream chunks are small: send each at once

  http_->Post(std::string(kChatPath),
              [this](const httplib::Request& request, httplib::Response& response,
                     const httplib::ContentReader& content_reader) { handle_chat(request, response, content_reader); });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_text(), std::string(clm::kMetricsContentType));
  });
  // Readiness (a load balancer's): 503 once a drain starts. Liveness: 200 while serving.
  const auto ready = [this](const httplib::Request&, httplib::Response& response) {
    if (draining_) {
      response.status = 503;
      response.set_header("Retry-After", retry_after_value(options_.retry_after_s));
      response.set_content("{\"status\":\"draining\"}", "application/json");
      return;
    }
    response.set_content("{\"status\":\"ok\"}", "application/json");
  };
  http_->Get("/health", ready);
  http_->Get("/health/ready", ready);
  http_->Get("/health/live", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("{\"status\":\"ok\"}", "application/json");
  });
  // OpenAI's model list: the one model this server serves, and its context.
  http_->Get(std::string(kModelsPath), [this](const httplib::Request& request, httplib::Response& response) {
    std::string salt;
    bool admin = false;
    if (auto error = authenticate(request, salt, admin)) return reply_refusal(response, *error);
    const nlohmann::json list = {{"object", "list"},
                                 {"data",
                                  {{{"id", options_.model_name},
                                    {"object", "model"},
                                    {"created", started_unix_},
                                    {"owned_by", "clmcache"},
                                    {"max_model_len", options_.limits.context_tokens}}}}};
    response.set_content(list.dump(), "application/json");
  });
  // The engine's own check and counts, for an operator (an admin key's, with API keys).
  http_->Get("/debug/engine", [this](const httplib::Request& request, httplib::Response& response) {
    std::string salt;
    bool admin = false;
    if (auto error = authenticate(request, salt, admin)) return reply_refusal(response, *error);
    if (options_.api_keys != nullptr && !admin) {
      return reply_error(response, {.http_status = 403,
                                    .message = "/debug/engine needs an admin key",
                                    .type = "invalid_request_error",
                                    .code = "forbidden"});
    }
    response.set_content(engine_summary_json(engine_).dump(), "application/json");
  });
  // Where the cache breaks (docs/observability.md), for an admin key with API
  // keys: per tenant the branch points most split at and least reached again.
  // ?top=N points a tenant (1..100, default 5), ?tenant=NAME one tenant's.
  http_->Get("/debug/cache", [this](const httplib::Request& request, httplib::Response& response) {
    std::string salt;
    bool admin = false;
    if (auto error = authenticate(request, salt, admin)) return reply_refusal(response, *error);
    if (options_.api_keys != nullptr && !admin) {
      return reply_error(response, {.http_status = 403,
                                    .message = "/debug/cache needs an admin key",
                                    .type = "invalid_request_error",
                                    .code = "forbidden"});
    }
    clm::DivergenceReportOptions report_options;
    if (request.has_param("top")) {
      const std::string top = request.get_param_value("top");
      int value = 0;
      const auto [end, error] = std::from_chars(top.data(), top.data() + top.size(), value);
      if (error != std::errc() || end != top.data() + top.size() || value < 1 || value > 100) {
        return reply_error(response, {.http_status = 400,
                                      .message = fmt::format("top must be a number in [1, 100], got '{}'", top),
                                      .code = "invalid_value"});
      }
      report_options.top_per_tenant = value;
    }
    const std::string tenant = request.get_param_value("tenant");
    report_options.tenant = tenant;
    nlohmann::ordered_json body;
    clm::DivergenceReport report;
    if (const clm::Status s = engine_.divergence_report(report_options, report); s.ok()) {
      body["divergence"] = divergence_json(report);
    } else {
      body["divergence"] = {{"enabled", false}, {"message", s.message()}};
    }
    clm::ClmAnomalyReport clm_report;
    if (const clm::Status s = engine_.clm_anomalies(clm_report); s.ok()) {
      body["clm"] = clm_anomalies_json(clm_report);
    } else {
      body["clm"] = {{"enabled", false}, {"message", s.message()}};
    }
    response.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  });
  // Limits httplib does not keep: the number of headers and their total size.
  http_->set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (ConnectionWatchdog* w = watchdog_.get()) w->busy(request.remote_addr, request.remote_port, true);
    std::size_t bytes = 0;
    for (const auto& [name, value] : request.headers) bytes += name.size() + value.size() + 4;
    if (request.headers.size() <= kMaxHeaders && bytes <= kMaxHeaderBytes) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    reply_error(response,
                {.http_status = 431,
                 .message = fmt::format("the request's headers are over {} or {} bytes", kMaxHeaders, kMaxHeaderBytes),
                 .code = "headers_too_large"});
    return httplib::Server::HandlerResponse::Handled;
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
  // finds it counted. While draining, connections are not kept alive: the
  // client's next request goes to another instance.
  // Called once a response is written: the connection waits for its next request head.
  http_->set_logger([this](const httplib::Request& request, const httplib::Response&) {
    if (ConnectionWatchdog* w = watchdog_.get()) w->busy(request.remote_addr, request.remote_port, false);
  });
  http_->set_post_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    count_response(route_of(request.path), response.status);
    if (draining_) response.set_header("Connection", "close");
  });
}

ChatServer::~ChatServer() {
  shutdown();
  watchdog_.reset();
}

clm::Status ChatServer::bind(int port, int& bound_port) {
  if (!http_->is_valid()) {
    return clm::invalid_argument(
        fmt::format("cannot load the TLS certificate {} or its key {}", options_.tls_cert_file, options_.tls_key_file));
  }
  const std::string& host = options_.host;
  bound_port = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound_port < 0) return clm::io_error(fmt::format("cannot listen on {}:{}", host, port));
  bound_ = true;
  watchdog_ = std::make_unique<ConnectionWatchdog>(
      bound_port, std::chrono::milliseconds(static_cast<std::int64_t>(options_.header_timeout_s * 1000)));
  return {};
}

bool ChatServer::serve() {
  {
    std::lock_guard lock(accepting_mutex_);
    if (!bound_ || shut_down_) return bound_;
    serving_ = true;
  }
  const bool served = http_->listen_after_bind();
  serving_ = false;
  return served;
}

bool ChatServer::drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(accepting_mutex_);
    accepting_ = false;
    draining_ = true;
  }
  const auto deadline = Clock::now() + grace;
  while (generator_.pending() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void ChatServer::shutdown() {
  {
    std::lock_guard lock(accepting_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    accepting_ = false;
  }
  // httplib's stop() stops only a server already in its accept loop.
  while (serving_ && !http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();      // the listening socket closes; serve() waits for the handlers
  generator_.stop();  // cancels what runs and waits: every handler gets its on_done
}

std::optional<std::uint64_t> ChatServer::submit(std::vector<std::int32_t> prompt, tiny_llama::GenerateOptions options,
                                                tiny_llama::TokenCallback on_token, tiny_llama::DoneCallback on_done) {
  std::lock_guard lock(accepting_mutex_);  // after shutdown's stop(), no request could end
  if (!accepting_) return std::nullopt;
  return generator_.submit(std::move(prompt), std::move(options), std::move(on_token), std::move(on_done));
}

void ChatServer::reply_refusal(httplib::Response& response, const ApiError& error) {
  if (error.http_status == 401) response.set_header("WWW-Authenticate", "Bearer");
  reply_error(response, error);
}

std::optional<ApiError> ChatServer::authenticate(const httplib::Request& request, std::string& salt, bool& admin) {
  salt.clear();
  admin = false;
  if (options_.api_keys != nullptr) {
    const std::string authorization = request.get_header_value("Authorization");
    const std::string_view token = bearer_token(authorization);
    if (token.empty()) {
      return ApiError{.http_status = 401,
                      .message = "this server needs an API key: send Authorization: Bearer KEY",
                      .type = "invalid_request_error",
                      .code = "missing_api_key"};
    }
    const ApiKey* key = options_.api_keys->find(token);
    if (key == nullptr) {
      return ApiError{.http_status = 401,
                      .message = "the API key is not known here",  // never the key itself
                      .type = "invalid_request_error",
                      .code = "invalid_api_key"};
    }
    salt = key->tenant;
    admin = key->admin;
    double retry_after = 0;
    // The keys' buckets change under their own lock: the table itself is read-only.
    if (!const_cast<ApiKeys*>(options_.api_keys)->take_request(*key, Clock::now(), retry_after)) {
      {
        std::lock_guard lock(metrics_mutex_);
        ++rate_limited_;
      }
      return ApiError{.http_status = 429,
                      .message = fmt::format("this key's rate limit ({} requests a minute) is reached; retry in {} s",
                                             key->requests_per_minute, retry_after_value(retry_after)),
                      .type = "requests",
                      .code = "rate_limit_exceeded",
                      .retry_after_s = retry_after};
    }
  }
  if (request.has_header("X-Tenant")) {
    const std::string tenant = request.get_header_value("X-Tenant");
    if (!options_.trust_x_tenant) {
      return ApiError{.message =
                          "X-Tenant is not trusted by this server (the tenant comes from the API key; "
                          "--trust-x-tenant lets a gateway in front set it)",
                      .param = "X-Tenant",
                      .code = "untrusted_header"};
    }
    if (tenant.empty() || tenant.size() > kMaxTenantBytes) {
      return ApiError{.message = fmt::format("X-Tenant must be 1 to {} bytes", kMaxTenantBytes),
                      .param = "X-Tenant",
                      .code = "invalid_value"};
    }
    // Within the key's tenant: a unit separator no tenant name holds keeps the pairs apart.
    salt = options_.api_keys != nullptr ? salt + '\x1f' + tenant : tenant;
  }
  return std::nullopt;
}

void ChatServer::handle_chat(const httplib::Request& request, httplib::Response& response,
                             const httplib::ContentReader& content_reader) {
  const Clock::time_point received = Clock::now();
  // Without a length or chunks, httplib would read until the client closes.
  if (!request.has_header("Content-Length") && request.get_header_value("Transfer-Encoding") != "chunked") {
    return reply_error(response, {.http_status = 411,
                                  .message = "the request needs a body with a Content-Length (or chunked)",
                                  .code = "length_required"});
  }
  std::string body;
  bool too_large = false, too_slow = false;
  const auto body_deadline =
      received + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.body_timeout_s));
  const bool read = content_reader([&](const char* data, std::size_t size) {
    too_large = body.size() + size > options_.max_body_bytes;  // a chunked body has no Content-Length to check
    too_slow = Clock::now() > body_deadline;                   // one byte a second holds no thread for long
    if (!too_large && !too_slow) body.append(data, size);
    return !too_large && !too_slow;
  });
  if (too_large || response.status == 413) {
    return reply_error(response, {.http_status = 413,
                                  .message = fmt::format("the request body is over {} bytes", options_.max_body_bytes),
                                  .code = "payload_too_large"});
  }
  if (too_slow || (!read && Clock::now() > body_deadline)) {
    response.set_header("Connection", "close");
    return reply_error(response,
                       {.http_status = 408,
                        .message = fmt::format("the request body did not arrive within {} s", options_.body_timeout_s),
                        .code = "request_timeout"});
  }
  if (!read) return reply_error(response, {.message = "could not read the request body", .code = "bad_body"});

  // The deadline: the server's, or the one the client asks for (up to the server's maximum).
  double timeout_s = options_.request_timeout_s;
  if (request.has_header("X-Request-Timeout")) {
    const std::string value = request.get_header_value("X-Request-Timeout");
    char* end = nullptr;
    const double asked = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(asked) || asked <= 0 ||
        asked > options_.max_request_timeout_s) {
      return reply_error(response, {.message = fmt::format("X-Request-Timeout must be seconds in (0, {}]",
                                                           options_.max_request_timeout_s),
                                    .param = "X-Request-Timeout",
                                    .code = "invalid_value"});
    }
    timeout_s = asked;
  }
  const auto deadline =
      received + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));

  std::string tenant;
  bool admin = false;
  if (auto error = authenticate(request, tenant, admin)) return reply_refusal(response, *error);
  ChatRequest chat;
  if (auto error = parse_chat_request(body, options_.limits, chat)) return reply_error(response, *error);
  std::vector<std::int32_t> prompt;
  if (auto error = template_prompt(chat.messages, true, prompt)) return reply_error(response, *error);
  if (auto error = check_prompt_length(prompt.size(), options_.limits)) return reply_error(response, *error);

  // What the request asks to keep cached after its answer: the whole prompt
  // for a day (prompt_cache_retention "24h"), and the prompt up to each
  // message marked with cache_control. Checked against the pin budget now,
  // so that a request that cannot be pinned is refused before it runs.
  std::vector<PlannedPin> pins;
  if (chat.prompt_cache_retention == "24h") {
    pins.push_back({prompt.size(), std::chrono::hours(24), "prompt_cache_retention"});
  }
  for (const CacheBreakpoint& b : chat.cache_breakpoints) {
    const std::vector<tiny_llama::ChatMessage> head(chat.messages.begin(),
                                                    chat.messages.begin() + static_cast<std::ptrdiff_t>(b.message) + 1);
    std::vector<std::int32_t> head_tokens;
    if (auto error = template_prompt(head, false, head_tokens)) return reply_error(response, *error);
    pins.push_back({head_tokens.size(), std::chrono::seconds(b.ttl_seconds),
                    fmt::format("messages[{}].cache_control", b.message)});
  }
  if (auto error = check_pin_budget(pins)) return reply_error(response, *error);
  // A conversation its client names (prompt_cache_key, or X-Session-Id) and
  // says will continue (X-Session-Continues: true) keeps a priority for a
  // while after each answer (Engine::hint_prefix); no hint without that word.
  std::string hint_key;
  if (auto error = conversation_hint_key(request, chat, tenant, hint_key)) return reply_error(response, *error);
  std::vector<std::int32_t> pin_tokens;
  if (!pins.empty() || !hint_key.empty()) pin_tokens = prompt;

  if (generator_.waiting() >= options_.max_waiting) {
    {
      std::lock_guard lock(metrics_mutex_);
      ++queue_full_;
    }
    return reply_error(response,
                       {.http_status = 429,
                        .message = fmt::format("{} requests are waiting already; retry later", options_.max_waiting),
                        .type = "requests",
                        .code = "queue_full",
                        .retry_after_s = options_.retry_after_s});
  }

  tiny_llama::GenerateOptions generate;
  generate.max_new_tokens = chat.max_tokens;
  generate.temperature = chat.temperature;
  generate.top_p = chat.top_p;
  generate.top_k = chat.top_k;
  generate.presence_penalty = chat.presence_penalty;
  generate.frequency_penalty = chat.frequency_penalty;
  generate.seed = chat.seed.value_or(std::random_device{}());
  if (!chat.ignore_eos) {
    generate.stop_tokens = {options_.tokenizer ? options_.tokenizer->end_of_turn_id()
                                               : tiny_llama::ByteTokenizer::kEndOfTurn};
  }
  generate.cache_salt = tenant;
  generate.tenant = tenant;  // the API key's tenant: its name in reports is its salt
  generate.use_cache = options_.prefix_cache;
  generate.use_clm = options_.clm;

  CompletionText::TokenBytes token_bytes;
  if (const clm_tokenizer::HfTokenizer* tokenizer = options_.tokenizer) {
    token_bytes = [tokenizer](std::int32_t token, std::string& out) {
      if (!tokenizer->is_special(token)) (void)tokenizer->decode_bytes(std::span(&token, 1), out);
    };
  }
  auto completion = std::make_shared<Completion>(chat.stop, std::move(token_bytes));
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
  const std::optional<std::uint64_t> id =
      submit(std::move(prompt), std::move(generate), std::move(on_token), std::move(on_done));
  if (!id) {
    {
      std::lock_guard lock(metrics_mutex_);
      ++drain_refusals_;
    }
    ApiError error = server_error(503, "the server is draining; retry on another instance", "draining");
    error.retry_after_s = options_.retry_after_s;
    return reply_error(response, error);
  }
  const CompletionHeader header{.id = next_completion_id(),
                                .created = static_cast<std::int64_t>(std::time(nullptr)),
                                .model = chat.model,
                                .include_usage = chat.stream && chat.include_usage};

  if (!chat.stream) {
    // Wait for the answer, watching the deadline and the client's socket
    // (found once the answer takes a while): either ends the generation.
    int fd = -2;  // not looked for yet
    bool cancelled = false;
    std::unique_lock lock(completion->mutex);
    while (!completion->done) {
      completion->changed.wait_until(lock, std::min(deadline, Clock::now() + kStreamPoll),
                                     [&] { return completion->done; });
      if (completion->done || cancelled) continue;
      lock.unlock();  // nothing calls into the generator under a completion's lock
      if (Clock::now() >= deadline) {
        generator_.cancel(*id, "timeout");
        cancelled = true;
      } else {
        if (fd == -2) fd = connection_fd(request);
        if (fd >= 0 && peer_closed(fd)) {
          generator_.cancel(*id, "cancelled");
          count_disconnect();
          cancelled = true;
        }
      }
      lock.lock();
    }
    if (auto error = generation_error(*completion)) return reply_error(response, *error);
    if (!pins.empty()) {
      const std::string outcome = apply_pins(pins, pin_tokens, tenant);
      response.set_header("X-Clm-Pins", outcome);
    }
    if (!hint_key.empty()) apply_hint(hint_key, pin_tokens, completion->result.tokens, tenant);
    response.set_content(completion_json(header, completion->unsent, finish_reason_of(*completion),
                                         usage_of(completion->result, options_.clm)),
                         "application/json");
    return;
  }

  {
    std::lock_guard lock(metrics_mutex_);
    ++streams_;
  }
  response.set_header("Cache-Control", "no-cache");
  // httplib calls the provider again and again until sink.done(); each call
  // waits for text (or a while, to look at the socket and the deadline) and sends it.
  auto provide = [this, completion, header, deadline, id = *id, sent_role = false, timed_out = false,
                  pins = std::move(pins), pin_tokens = std::move(pin_tokens), hint_key = std::move(hint_key),
                  tenant](std::size_t, httplib::DataSink& sink) mutable {
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
      completion->changed.wait_until(lock, std::min(deadline, Clock::now() + kStreamPoll),
                                     [&] { return completion->done || !completion->unsent.empty(); });
      piece.swap(completion->unsent);
      done = completion->done;
    }
    if (!done && !timed_out && Clock::now() >= deadline) {
      generator_.cancel(id, "timeout");  // its on_done ends the stream with the error
      timed_out = true;
    }
    if (!piece.empty() && !send(sse_event(chunk_json(header, {.content = piece})))) return false;
    if (!done) return !piece.empty() || sink.is_writable() || client_left();
    // `result` is final once done: no lock needed to read it.
    if (auto error = generation_error(*completion)) {
      if (!send(sse_event(error_json(*error)))) return false;
    } else {
      if (!pins.empty()) (void)apply_pins(pins, pin_tokens, tenant);  // counted in the engine's pin metrics
      if (!hint_key.empty()) apply_hint(hint_key, pin_tokens, completion->result.tokens, tenant);
      const std::string reason = finish_reason_of(*completion);
      if (!send(sse_event(chunk_json(header, {.finish_reason = reason})))) return false;
      const CompletionUsage usage = usage_of(completion->result, options_.clm);
      if (header.include_usage && !send(sse_event(chunk_json(header, {.usage = &usage})))) return false;
    }
    if (!send(std::string(kSseDone))) return false;
    sink.done();
    return true;
  };
  // The response ends (the client went away, or the server stops) before the
  // generation did: cancel it.
  auto release = [this, completion, id = *id](bool) {
    {
      std::lock_guard lock(completion->mutex);
      if (completion->done) return;
      completion->client_gone = true;
    }
    generator_.cancel(id, "cancelled");  // it may still be waiting, with no token to refuse
  };
  response.set_chunked_content_provider("text/event-stream", std::move(provide), std::move(release));
}

std::optional<ApiError> ChatServer::template_prompt(const std::vector<tiny_llama::ChatMessage>& messages,
                                                    bool add_generation_prompt, std::vector<std::int32_t>& out) const {
  out.clear();
  if (options_.tokenizer == nullptr) {
    out = tiny_llama::ByteTokenizer::apply_chat_template(messages, add_generation_prompt);
    return std::nullopt;
  }
  std::vector<clm_tokenizer::ChatMessage> chat;
  chat.reserve(messages.size());
  for (const tiny_llama::ChatMessage& m : messages) chat.push_back({m.role, m.content});
  const clm::Status s = options_.tokenizer->apply_chat_template(chat, out, add_generation_prompt);
  if (s.ok()) return std::nullopt;
  return ApiError{.message = fmt::format("the messages cannot be tokenized: {}", s.message()),
                  .param = "messages",
                  .code = "invalid_value"};
}

std::optional<ApiError> ChatServer::conversation_hint_key(const httplib::Request& request, const ChatRequest& chat,
                                                          const std::string& tenant, std::string& key) const {
  key.clear();
  if (!request.has_header("X-Session-Continues")) return std::nullopt;
  const std::string continues = request.get_header_value("X-Session-Continues");
  if (continues != "true" && continues != "false") {
    return ApiError{.message = "X-Session-Continues must be true or false",
                    .param = "X-Session-Continues",
                    .code = "invalid_value"};
  }
  if (continues == "false") return std::nullopt;
  const std::string session = request.get_header_value("X-Session-Id");
  const std::string& name = !chat.prompt_cache_key.empty() ? chat.prompt_cache_key : session;
  if (name.empty() || name.size() > 1024) {
    return ApiError{.message =
                        "X-Session-Continues: true needs the conversation's name (prompt_cache_key or "
                        "X-Session-Id, 1 to 1024 bytes)",
                    .param = "X-Session-Continues",
                    .code = "invalid_value"};
  }
  if (!options_.prefix_cache) return std::nullopt;            // nothing cached to keep
  key = fmt::format("{}:{}{}", tenant.size(), tenant, name);  // within the tenant; the length keeps pairs apart
  return std::nullopt;
}

void ChatServer::apply_hint(const std::string& key, const std::vector<std::int32_t>& prompt,
                            const std::vector<std::int32_t>& answer, const std::string& tenant) {
  std::vector<std::int32_t> conversation = prompt;
  conversation.insert(conversation.end(), answer.begin(), answer.end());
  std::int32_t reached = 0;
  (void)engine_.hint_prefix(
      key, conversation, {.cache_salt = tenant, .adapter_id = cache_adapter()}, 1,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(options_.hint_ttl_s)),
      reached);  // the engine's hint metrics count it
}

std::optional<ApiError> ChatServer::check_pin_budget(const std::vector<PlannedPin>& pins) const {
  if (pins.empty()) return std::nullopt;
  if (!options_.prefix_cache) {
    return ApiError{.message = "this server runs with --prefix-cache off: nothing can be kept cached",
                    .param = pins.front().param,
                    .code = "unsupported_parameter"};
  }
  std::int64_t needed = 0;
  for (const PlannedPin& p : pins) needed += static_cast<std::int64_t>(p.tokens) / engine_.page_size();
  const std::int64_t left = engine_.pin_pages_left();
  if (needed <= left) return std::nullopt;
  return ApiError{
      .message = fmt::format("the pin budget has {} pages left; keeping this prompt cached needs {}", left, needed),
      .param = pins.front().param,
      .code = "pin_budget_exceeded"};
}

std::string ChatServer::apply_pins(const std::vector<PlannedPin>& pins, const std::vector<std::int32_t>& tokens,
                                   const std::string& tenant) {
  std::string outcome;
  for (const PlannedPin& p : pins) {
    clm::PinResult pinned;
    const clm::Status s = engine_.pin_prefix(std::span(tokens.data(), std::min(p.tokens, tokens.size())),
                                             {.cache_salt = tenant, .adapter_id = cache_adapter()}, p.ttl, pinned);
    if (!outcome.empty()) outcome += ", ";
    outcome += s.ok() ? fmt::format("{}={} tokens for {} s", p.param, pinned.pinned_tokens,
                                    std::chrono::duration_cast<std::chrono::seconds>(p.ttl).count())
                      : fmt::format("{}=refused ({})", p.param, s.code_name());
  }
  return outcome;
}

std::string ChatServer::next_completion_id() {
  return fmt::format("chatcmpl-{:08x}{:08x}", id_prefix_, next_id_.fetch_add(1));
}

void ChatServer::count_response(const std::string& path, int status) {
  std::lock_guard lock(metrics_mutex_);
  ++responses_[{path, status}];
}

void ChatServer::Histogram::observe(double seconds) {
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), seconds);
  ++counts[static_cast<std::size_t>(bucket - bounds.begin())];
  sum += seconds;
}

void ChatServer::Histogram::append_text(std::string& out, std::string_view name) const {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], cumulative);
  }
  cumulative += counts.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n", name, sum);
  out += fmt::format("{}_count {}\n", name, cumulative);
}

void ChatServer::count_generation(const tiny_llama::GenerationResult& result) {
  std::lock_guard lock(metrics_mutex_);
  ++finished_[result.finish_reason];
  completion_tokens_ += result.tokens.size();
  prompt_tokens_ += static_cast<std::uint64_t>(result.prompt_tokens);
  // cached_tokens counts every tier; host_tokens and storage_tokens are the parts copied in.
  cached_host_tokens_ += static_cast<std::uint64_t>(result.host_tokens);
  cached_storage_tokens_ += static_cast<std::uint64_t>(result.storage_tokens);
  cached_device_tokens_ +=
      static_cast<std::uint64_t>(std::max(0, result.cached_tokens - result.host_tokens - result.storage_tokens));
  if (result.tokens.empty()) return;  // no first token
  ttft_.observe(result.ttft_seconds);
  e2e_.observe(result.total_seconds);
  if (result.tokens.size() > 1) {
    tpot_.observe((result.total_seconds - result.ttft_seconds) / static_cast<double>(result.tokens.size() - 1));
  }
}

void ChatServer::count_disconnect() {
  std::lock_guard lock(metrics_mutex_);
  ++disconnects_;
}

std::string ChatServer::metrics_text() const {
  // The generator's counts first: a request counts as running only once the
  // engine has admitted it, so the engine's snapshot taken next holds its
  // pages (the other order could show it running with none held).
  const std::size_t running = generator_.running(), waiting = generator_.waiting();
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
  family("clm_server_slow_connections_closed_total", "counter",
         "Connections closed for sending no complete request head within --header-timeout.");
  out += fmt::format("clm_server_slow_connections_closed_total {}\n", watchdog_ ? watchdog_->closed() : 0);
  family("clm_server_draining", "gauge", "1 once a drain has started (new requests get 503), else 0.");
  out += fmt::format("clm_server_draining {}\n", draining_ ? 1 : 0);
  family("clm_server_prompt_tokens_total", "counter", "Prompt tokens of the chat completions that ended.");
  out += fmt::format("clm_server_prompt_tokens_total {}\n", prompt_tokens_);
  family("clm_server_prompt_tokens_cached_total", "counter",
         "Prompt tokens found in the cache, by where they were: device (the pool), host, storage.");
  out += fmt::format("clm_server_prompt_tokens_cached_total{{source=\"device\"}} {}\n", cached_device_tokens_);
  out += fmt::format("clm_server_prompt_tokens_cached_total{{source=\"host\"}} {}\n", cached_host_tokens_);
  out += fmt::format("clm_server_prompt_tokens_cached_total{{source=\"storage\"}} {}\n", cached_storage_tokens_);
  family("clm_server_completion_tokens_total", "counter", "Tokens generated for chat completions.");
  out += fmt::format("clm_server_completion_tokens_total {}\n", completion_tokens_);
  family("clm_server_request_finished_total", "counter",
         "Generations that ended, by finish reason (stop, length, cancelled, timeout, error).");
  for (const auto& [reason, count] : finished_) {
    out += fmt::format("clm_server_request_finished_total{{finished_reason=\"{}\"}} {}\n", reason, count);
  }
  family("clm_server_rejected_requests_total", "counter",
         "Requests refused for load: queue_full and rate_limited (429), draining (503).");
  out += fmt::format("clm_server_rejected_requests_total{{reason=\"queue_full\"}} {}\n", queue_full_);
  out += fmt::format("clm_server_rejected_requests_total{{reason=\"rate_limited\"}} {}\n", rate_limited_);
  out += fmt::format("clm_server_rejected_requests_total{{reason=\"draining\"}} {}\n", drain_refusals_);
  family("clm_server_time_to_first_token_seconds", "histogram",
         "From a chat completion's submission to the generator to its first token.");
  ttft_.append_text(out, "clm_server_time_to_first_token_seconds");
  family("clm_server_e2e_request_latency_seconds", "histogram",
         "From a chat completion's submission to its last token (those with one).");
  e2e_.append_text(out, "clm_server_e2e_request_latency_seconds");
  family("clm_server_time_per_output_token_seconds", "histogram",
         "Each chat completion's mean time between its output tokens after the first (two or more tokens).");
  tpot_.append_text(out, "clm_server_time_per_output_token_seconds");
  return out;
}

}  // namespace clm_server
