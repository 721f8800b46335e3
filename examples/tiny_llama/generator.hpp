// examples/tiny_llama/generator.hpp: continuous batching over a Decoder (the
// CPU LlamaModel or the CUDA one, decoder.hpp) and its Engine. Requests wait
// in a queue; each step admits what fits (the engine matches each prompt's
// cached prefix, so only the rest is prefilled), runs one forward over every
// admitted request's new rows and every running request's last token,
// samples, and retires what is done (finish publishes prompt + answer into
// the cache). Sequences join and leave between steps.
//
//   tiny_llama::Generator gen(*decoder, {});
//   tiny_llama::GenerateOptions opts;
//   opts.max_new_tokens = 32; opts.cache_salt = "tenant-7";
//   gen.submit(prompt, opts, /*on_token=*/nullptr, [](const tiny_llama::GenerationResult& r) { ... });
//   CLM_RETURN_IF_ERROR(gen.run_until_idle());
//
// Or a loop thread (start()/stop()) serving submit() calls from any thread,
// as examples/server does. Callbacks run on the thread that calls step().
// use_cache = false is the baseline: the request's prompt is matched against
// nothing (a salt of its own) and its pages are released, never published.
// A RequestListener (set_request_listener) hears each request start and end:
// how CLM in the loop (clm_loop.hpp) learns each sequence's request.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "decoder.hpp"
#include "llama_model.hpp"  // LlamaModel, for the hosts that include only this header
#include "sampling.hpp"

namespace tiny_llama {

struct GenerateOptions {
  std::int32_t max_new_tokens = 32;
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  std::uint64_t seed = 0;    // temperature sampling is a function of (seed, step)
  // sampling.hpp: nucleus and top-k cuts of a draw, penalties on tokens already generated.
  float top_p = 1.0f;
  std::int32_t top_k = 0;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::int32_t> stop_tokens;
  std::string cache_salt;  // tenants with different salts never share pages
  std::string tenant;      // the tenant's name in reports (clm::AdmitOptions::tenant); not part of the namespace
  bool use_cache = true;
  bool keep_logits = false;  // GenerationResult::logits gets every step's logits (tests)
  // CLM in the loop (clm_loop.hpp): whether an installed ClmLoop acts on this
  // request, and its suffix text (empty: the prompt's last user message).
  // Requests with use_clm cache their pages apart (adapter id kClmAdapterId):
  // an injected snapshot changes the K/V of the rows it touches, which a
  // request without CLM must never reuse.
  bool use_clm = false;
  std::string clm_suffix;
};

inline constexpr std::int32_t kClmAdapterId = 1;

// One snapshot the store served a request: a lookup that hit.
struct ClmServed {
  clm::SnapshotLevel level = clm::SnapshotLevel::miss;
  std::string key;           // the served snapshot's key (SnapshotHit::key: the fallback's name at level 3)
  std::int32_t version = 0;  // 0 at level 3
  float similarity = 0.0f;   // cosine between the query and the snapshot (1 for exact without a query)
  std::int32_t forward = 0;  // the request's forward that got it: 0 its prefill, k its k-th decode step
};

// What a ClmLoop did for one request; all zero without one.
struct ClmRequestCounts {
  std::int32_t src_steps = 0;        // forwards whose SRC head scored the request
  std::int32_t reuse_decisions = 0;  // ... whose score passed the gate (each one a lookup)
  std::int32_t hits_exact = 0, hits_ann = 0, hits_fallback = 0, misses = 0;
  std::int32_t injected_steps = 0;        // forwards whose last row got a snapshot
  std::int32_t first_injected_step = -1;  // index into tokens / logits of the first of them
  float max_src_score = 0.0f;
  bool recorded = false;  // its snapshot went to the store when it ended
  std::string key;        // the store's key of its suffix (what it looked up and recorded under); empty: none
  clm::RecordResult record_result = clm::RecordResult::not_written;  // when recorded: what the store did
  std::int32_t record_version = 0;  // when recorded: the key's newest version afterwards (0 while counted)
  std::vector<ClmServed> served;    // every hit, in order (hits_exact + hits_ann + hits_fallback of them)
};

struct GenerationResult {
  std::uint64_t request = 0;
  clm::Status status;
  std::vector<std::int32_t> tokens;  // generated, the stop token included
  std::string finish_reason;         // "stop", "length", "cancelled", "error"
  std::int32_t prompt_tokens = 0;
  std::int32_t cached_tokens = 0;  // of the prompt, found in the cache (all tiers)
  std::int32_t host_tokens = 0;    // ... copied in from the host tier
  std::int32_t storage_tokens = 0;
  double queue_seconds = 0;    // submit to admission
  double ttft_seconds = 0;     // submit to the first token
  double prefill_seconds = 0;  // the forward that prefilled the prompt (shared with its batch)
  double total_seconds = 0;
  std::vector<float> logits;  // [steps][vocab] when keep_logits
  ClmRequestCounts clm;
};

// Returns false to cancel the request (a client that went away).
using TokenCallback = std::function<bool(std::int32_t token)>;
using DoneCallback = std::function<void(const GenerationResult&)>;

// Hears requests start and end, on the stepping thread: on_admitted once the
// request has its sequence (before its prefill), on_retired when it ends,
// before the engine finishes or aborts the sequence (the listener may still
// use it, and may fill result.clm).
class RequestListener {
 public:
  virtual ~RequestListener() = default;
  virtual void on_admitted(clm::SequenceId seq, std::span<const std::int32_t> prompt,
                           const GenerateOptions& options) = 0;
  virtual void on_retired(clm::SequenceId seq, GenerationResult& result) = 0;
};

struct GeneratorOptions {
  std::int32_t max_batch = 32;               // running sequences at once
  std::int32_t prefill_token_budget = 4096;  // new prompt rows admitted per step
};

class Generator {
 public:
  Generator(Decoder& model, const GeneratorOptions& options);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Queues a request and returns its id. A prompt that is empty, holds ids
  // outside the vocabulary, or leaves no room for one new token in the
  // context is answered at once through on_done with invalid_argument.
  std::uint64_t submit(std::vector<std::int32_t> prompt, GenerateOptions options, TokenCallback on_token,
                       DoneCallback on_done);

  // One scheduling step (see above). An error of the forward pass ends every
  // request of that step with it; the generator stays usable.
  clm::Status step();
  // Steps until nothing waits or runs.
  clm::Status run_until_idle();
  std::size_t pending() const;
  std::size_t waiting() const;  // queued, not yet admitted
  std::size_t running() const;  // admitted: prefilling or decoding

  // A loop thread that steps while there is work and sleeps otherwise.
  void start();
  void stop();  // ends the loop; requests still queued or running are cancelled

  // Ends request `id` at the next step, waiting or running, with
  // finish_reason `reason` ("cancelled", or "timeout" for a deadline missed);
  // its pages are released, never published. From any thread; an id that has
  // already ended is ignored. (on_done runs on the stepping thread, as ever.)
  void cancel(std::uint64_t id, std::string reason = "cancelled");

  // nullptr removes it; set it while nothing runs. It must outlive its use.
  void set_request_listener(RequestListener* listener) { listener_ = listener; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Request {
    std::uint64_t id = 0;
    std::vector<std::int32_t> prompt;
    GenerateOptions options;
    TokenCallback on_token;
    DoneCallback on_done;
    Clock::time_point submitted;
    clm::SequenceId seq = 0;
    std::int32_t length = 0;  // tokens whose K/V are in the sequence's pages
    GenerationResult result;
  };

  clm::Status admit_waiting(ForwardBatch& batch, std::vector<Request*>& rows_of);
  void apply_cancels();
  void retire(Request& request, const char* reason, clm::Status status = {});
  // Whether the pool can carry `candidate`, admitted as `plan` says, and every
  // running request to their max_new_tokens.
  bool fits_to_the_end(const Request& candidate, const clm::AdmissionPlan& plan) const;
  std::int32_t sample(const Request& request, std::span<const float> logits) const;
  void loop();

  Decoder& model_;
  clm::Engine& engine_;
  GeneratorOptions options_;
  mutable std::mutex queue_mutex_;  // guards waiting_, cancels_, next_id_, stop_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::pair<std::uint64_t, std::string>> cancels_;  // (id, reason), for the next step
  std::uint64_t next_id_ = 1;
  bool stop_ = false;
  std::vector<std::unique_ptr<Request>> running_;  // the stepping thread's only
  std::atomic<std::size_t> running_count_{0};
  std::vector<float> logits_;
  RequestListener* listener_ = nullptr;
  std::thread loop_;
};

}  // namespace tiny_llama
