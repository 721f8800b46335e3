// examples/tiny_llama/generator.cpp: the continuous-batching loop.
#include "generator.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tiny_llama {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Generator::Generator(Decoder& model, const GeneratorOptions& options)
    : model_(model), engine_(model.engine()), options_(options) {
  options_.max_batch = std::max(1, options_.max_batch);
  options_.prefill_token_budget = std::max(1, options_.prefill_token_budget);
}

Generator::~Generator() { stop(); }

std::uint64_t Generator::submit(std::vector<std::int32_t> prompt, GenerateOptions options, TokenCallback on_token,
                                DoneCallback on_done) {
  auto request = std::make_unique<Request>();
  request->prompt = std::move(prompt);
  request->options = std::move(options);
  request->on_token = std::move(on_token);
  request->on_done = std::move(on_done);
  request->submitted = Clock::now();
  request->result.prompt_tokens = static_cast<std::int32_t>(request->prompt.size());
  const LlamaConfig& config = model_.config();
  clm::Status invalid;
  if (request->prompt.empty()) {
    invalid = clm::invalid_argument("the prompt is empty");
  } else if (request->prompt.size() >= static_cast<std::size_t>(config.max_position)) {
    invalid = clm::invalid_argument(fmt::format("the prompt has {} tokens; the context holds {} (prompt + answer)",
                                                request->prompt.size(), config.max_position));
  } else if (request->options.max_new_tokens < 1) {
    invalid = clm::invalid_argument("max_new_tokens must be >= 1");
  } else if (!(request->options.temperature >= 0.0f) || !std::isfinite(request->options.temperature)) {
    invalid = clm::invalid_argument("temperature must be a finite number >= 0");
  } else if (!(request->options.top_p > 0.0f && request->options.top_p <= 1.0f)) {
    invalid = clm::invalid_argument("top_p must be in (0, 1]");
  } else if (request->options.top_k < 0) {
    invalid = clm::invalid_argument("top_k must be >= 0 (0: no cut)");
  } else if (!(std::abs(request->options.presence_penalty) <= 2.0f) ||
             !(std::abs(request->options.frequency_penalty) <= 2.0f)) {
    invalid = clm::invalid_argument("presence_penalty and frequency_penalty must be in [-2, 2]");
  } else {
    const auto bad = std::find_if(request->prompt.begin(), request->prompt.end(),
                                  [&](std::int32_t t) { return t < 0 || t >= config.vocab_size; });
    if (bad != request->prompt.end()) {
      invalid = clm::invalid_argument(fmt::format("token {} at position {} is outside the vocabulary [0, {})", *bad,
                                                  bad - request->prompt.begin(), config.vocab_size));
    }
  }
  std::uint64_t id;
  {
    std::lock_guard lock(queue_mutex_);
    id = next_id_++;
    request->id = request->result.request = id;
    if (invalid.ok()) waiting_.push_back(std::move(request));
  }
  if (!invalid.ok()) {
    request->result.status = invalid;
    request->result.finish_reason = "error";
    if (request->on_done) request->on_done(request->result);
    return id;
  }
  wake_.notify_all();
  return id;
}

std::size_t Generator::pending() const {
  std::lock_guard lock(queue_mutex_);
  return waiting_.size() + running_count_.load();
}

std::size_t Generator::waiting() const {
  std::lock_guard lock(queue_mutex_);
  return waiting_.size();
}

std::size_t Generator::running() const { return running_count_.load(); }

clm::Status Generator::admit_waiting(ForwardBatch& batch, std::vector<Request*>& rows_of) {
  std::int32_t budget = options_.prefill_token_budget;
  while (static_cast<std::int32_t>(running_.size()) < options_.max_batch) {
    std::unique_ptr<Request> request;
    {
      std::lock_guard lock(queue_mutex_);
      if (waiting_.empty()) break;
      // The first admission of a step always goes in, however long its prompt.
      if (static_cast<std::int32_t>(waiting_.front()->prompt.size()) > budget && !batch.ids.empty()) break;
      request = std::move(waiting_.front());
      waiting_.pop_front();
    }
    Request& r = *request;
    // The baseline matches against nothing: a salt no other request has.
    const std::string salt = r.options.use_cache ? r.options.cache_salt : fmt::format("\x01nocache/{}", r.id);
    const std::int32_t adapter_id = r.options.use_clm ? kClmAdapterId : 0;
    const clm::AdmitOptions admit_options{.cache_salt = salt, .adapter_id = adapter_id, .tenant = r.options.tenant};
    const bool first = running_.empty() && batch.ids.empty();
    // Admit only what the pool can carry to the end: the pages every running
    // request may still need must stay free or evictable, or a later extend()
    // would find the pool dry with nothing to evict. Planned before admitting,
    // so that a request that waits leaves the cache and its counts alone.
    clm::AdmissionPlan plan;
    if (!first && engine_.plan_admission(r.prompt, admit_options, plan).ok() && !fits_to_the_end(r, plan)) {
      std::lock_guard lock(queue_mutex_);
      waiting_.push_front(std::move(request));
      break;
    }
    clm::Admission a;
    clm::Status admitted = engine_.admit(r.prompt, admit_options, a);
    if (admitted.code() == clm::StatusCode::out_of_memory && !first) {
      std::lock_guard lock(queue_mutex_);  // the pool is busy: wait for running requests to leave
      waiting_.push_front(std::move(request));
      break;
    }
    if (!admitted.ok()) {
      r.result.status = admitted;
      r.result.finish_reason = "error";
      r.result.total_seconds = seconds_between(r.submitted, Clock::now());
      if (r.on_done) r.on_done(r.result);
      continue;
    }
    r.seq = a.seq;
    if (listener_) listener_->on_admitted(r.seq, r.prompt, r.options);
    r.result.cached_tokens = a.cached_tokens;
    r.result.host_tokens = a.host_tokens;
    r.result.storage_tokens = a.storage_tokens;
    r.result.queue_seconds = seconds_between(r.submitted, Clock::now());
    r.length = static_cast<std::int32_t>(r.prompt.size());
    const auto fresh = std::span(r.prompt).subspan(static_cast<std::size_t>(a.cached_tokens));
    batch.add(a.seq, fresh, a.cached_tokens, a.slots, a.page_table);
    budget -= static_cast<std::int32_t>(fresh.size());
    rows_of.push_back(&r);
    running_.push_back(std::move(request));
    running_count_.store(running_.size());
  }
  return {};
}

bool Generator::fits_to_the_end(const Request& candidate, const clm::AdmissionPlan& plan) const {
  const std::int64_t page = engine_.page_size();
  const std::int64_t context = model_.config().max_position;
  const auto pages_to_grow = [&](std::int64_t now, std::int64_t final_length) {
    const std::int64_t end = std::min<std::int64_t>(final_length, context);
    return std::max<std::int64_t>(0, (end + page - 1) / page - (now + page - 1) / page);
  };
  const auto prompt = static_cast<std::int64_t>(candidate.prompt.size());
  // The admission itself: its new pages, and its cached pages that locking takes off the evictable ones.
  std::int64_t needed = plan.new_pages + plan.unlocked_pages;
  needed += pages_to_grow(prompt, prompt + candidate.options.max_new_tokens);
  for (const auto& running : running_) {
    const std::int64_t length = running->length + (running->result.tokens.empty() ? 0 : 1);
    needed += pages_to_grow(length, running->length + running->options.max_new_tokens);
  }
  return needed <= plan.pages_free + plan.evictable_tokens / page;
}

void Generator::cancel(std::uint64_t id, std::string reason) {
  {
    std::lock_guard lock(queue_mutex_);
    cancels_.emplace_back(id, std::move(reason));
  }
  wake_.notify_all();
}

void Generator::apply_cancels() {
  std::vector<std::pair<std::uint64_t, std::string>> cancels;
  {
    std::lock_guard lock(queue_mutex_);
    if (cancels_.empty()) return;
    cancels.swap(cancels_);
  }
  for (const auto& cancel : cancels) {
    const std::uint64_t id = cancel.first;  // (a plain variable: clang 14 cannot capture a structured binding)
    const std::string& reason = cancel.second;
    const auto running =
        std::find_if(running_.begin(), running_.end(), [&](const std::unique_ptr<Request>& r) { return r->id == id; });
    if (running != running_.end()) {
      retire(**running, reason.c_str());
      continue;
    }
    std::unique_ptr<Request> waiting;
    {
      std::lock_guard lock(queue_mutex_);
      const auto it = std::find_if(waiting_.begin(), waiting_.end(),
                                   [&](const std::unique_ptr<Request>& r) { return r->id == id; });
      if (it == waiting_.end()) continue;  // ended already
      waiting = std::move(*it);
      waiting_.erase(it);
    }
    waiting->result.finish_reason = reason;
    waiting->result.total_seconds = seconds_between(waiting->submitted, Clock::now());
    if (waiting->on_done) waiting->on_done(waiting->result);
  }
}

clm::Status Generator::step() {
  apply_cancels();
  ForwardBatch batch;
  std::vector<Request*> rows_of;
  std::vector<std::int32_t> table;
  std::vector<std::int64_t> slots;
  // Running requests first: each brings its last sampled token.
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    const std::int32_t token = r.result.tokens.back();
    clm::Status extended = engine_.extend(r.seq, std::span(&token, 1), slots, &table);
    if (!extended.ok()) {
      retire(r, "error", extended);
      --i;
      continue;
    }
    batch.add(r.seq, std::span(&token, 1), r.length, slots, table);
    rows_of.push_back(&r);
  }
  CLM_RETURN_IF_ERROR(admit_waiting(batch, rows_of));
  if (batch.ids.empty()) return {};
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  logits_.resize(batch.ids.size() * vocab);
  const Clock::time_point begin = Clock::now();
  const clm::Status forwarded = model_.forward(batch, logits_);
  const Clock::time_point end = Clock::now();
  if (!forwarded.ok()) {
    for (Request* r : rows_of) retire(*r, "error", forwarded);
    return forwarded;
  }
  std::vector<Request*> done;
  for (std::size_t i = 0; i < rows_of.size(); ++i) {
    Request& r = *rows_of[i];
    const std::span<const float> logits(logits_.data() + i * vocab, vocab);
    const std::int32_t rows = batch.indptr[i + 1] - batch.indptr[i];
    const bool first = r.result.tokens.empty();
    if (!first) r.length += rows;  // the prompt's rows were counted at admission
    if (r.options.keep_logits) r.result.logits.insert(r.result.logits.end(), logits.begin(), logits.end());
    const std::int32_t token = sample(r, logits);
    r.result.tokens.push_back(token);
    if (first) {
      r.result.prefill_seconds = seconds_between(begin, end);
      r.result.ttft_seconds = seconds_between(r.submitted, end);
    }
    const bool keep_going = !r.on_token || r.on_token(token);
    const auto& stops = r.options.stop_tokens;
    if (!keep_going) {
      r.result.finish_reason = "cancelled";
    } else if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      r.result.finish_reason = "stop";
    } else if (static_cast<std::int32_t>(r.result.tokens.size()) >= r.options.max_new_tokens ||
               r.length + 1 >= model_.config().max_position) {
      r.result.finish_reason = "length";
    } else {
      continue;
    }
    done.push_back(&r);
  }
  for (Request* r : done) retire(*r, r->result.finish_reason.c_str());
  return {};
}

void Generator::retire(Request& r, const char* reason, clm::Status status) {
  r.result.finish_reason = reason;
  r.result.status = std::move(status);
  if (listener_) listener_->on_retired(r.seq, r.result);
  // Only a cached request that ended well is published; the rest (cancelled, timed out, failed) release their pages.
  const bool publish = r.options.use_cache && r.result.status.ok() &&
                       (r.result.finish_reason == "stop" || r.result.finish_reason == "length");
  const clm::Status ended = publish ? engine_.finish(r.seq) : engine_.abort(r.seq);
  if (r.result.status.ok() && !ended.ok()) r.result.status = ended;
  r.result.total_seconds = seconds_between(r.submitted, Clock::now());
  if (r.on_done) r.on_done(r.result);
  const auto it =
      std::find_if(running_.begin(), running_.end(), [&](const std::unique_ptr<Request>& p) { return p.get() == &r; });
  if (it != running_.end()) running_.erase(it);
  running_count_.store(running_.size());
}

std::int32_t Generator::sample(const Request& r, std::span<const float> logits) const {
  const SamplingParams params{.temperature = r.options.temperature,
                              .top_p = r.options.top_p,
                              .top_k = r.options.top_k,
                              .presence_penalty = r.options.presence_penalty,
                              .frequency_penalty = r.options.frequency_penalty};
  // One uniform draw from (seed, step).
  const std::uint64_t bits = mix(r.options.seed ^ mix(r.result.tokens.size() + 1));
  return sample_token(logits, r.result.tokens, params, static_cast<double>(bits >> 11) * 0x1.0p-53);
}

clm::Status Generator::run_until_idle() {
  while (pending() > 0) CLM_RETURN_IF_ERROR(step());
  return {};
}

void Generator::start() {
  if (loop_.joinable()) return;
  {
    std::lock_guard lock(queue_mutex_);
    stop_ = false;
  }
  loop_ = std::thread([this] { loop(); });
}

void Generator::loop() {
  for (;;) {
    {
      std::unique_lock lock(queue_mutex_);
      wake_.wait(lock, [&] { return stop_ || !waiting_.empty() || !cancels_.empty() || running_count_.load() > 0; });
      if (stop_) return;
    }
    (void)step();  // a failed forward has ended its requests with the status
  }
}

void Generator::stop() {
  {
    std::lock_guard lock(queue_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
  while (!running_.empty()) retire(*running_.back(), "cancelled");
  std::deque<std::unique_ptr<Request>> waiting;
  {
    std::lock_guard lock(queue_mutex_);
    waiting.swap(waiting_);
  }
  for (auto& r : waiting) {
    r->result.finish_reason = "cancelled";
    if (r->on_done) r->on_done(r->result);
  }
}

}  // namespace tiny_llama
