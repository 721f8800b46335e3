// examples/tiny_llama/clm_loop.hpp: CLM suffix reuse in the decoder's loop
// (docs/clm.md, "In the loop"). A ClmLoop is the model's LayerObserver and
// the generator's RequestListener: per forward it runs the engine's SRC head
// on one layer's attention output, looks up a snapshot for each sequence whose
// score passes the gate, injects the snapshots it finds through the adapter
// at the last layers, and, when a request ends, records a snapshot of its
// prefill's final hidden state in the engine's snapshot store.
//
//   clm::EngineConfig e = ...;                  // with e.snapshot_store.path set
//   std::unique_ptr<tiny_llama::ClmLoop> clm_loop;
//   CLM_RETURN_IF_ERROR(tiny_llama::ClmLoop::create(*engine, model->config(),
//                                                   tiny_llama::ClmFiles::in("clm-trained"), {}, clm_loop));
//   clm_loop->install(*model, generator);        // uninstall() for the baseline
//   tiny_llama::GenerateOptions o;
//   o.use_clm = true;                            // per request; false = baseline
//   o.clm_suffix = "How do I upgrade?";          // or empty: the prompt's last user message
//   generator.submit(prompt, o, nullptr, on_done);  // GenerationResult::clm: what CLM did
//   tiny_llama::ClmLoopStats s = clm_loop->stats();  // SRC scores, lookups by level, ...
//
// The suffix of a request is `clm_suffix`, else the content of the prompt's
// last user message (ByteTokenizer's chat template), else its last
// `recent_tokens` byte tokens. It is keyed by the store's SuffixKeyer; text
// the keyer refuses (invalid UTF-8, no content) gets a host key
// "TEXT-<FNV-1a 64 of its bytes>" in the group `hashed_suffix_group` (empty:
// its own), so exact repeats still match; level 2 looks across such keys
// only when a host names a shared group, since the texts have nothing in
// common but their vectors. Text the keyer abstains on is not stored.
//
// A forward, for the sequences of requests with use_clm:
//  - at src_layer's attention output: Engine::src_step over their new rows;
//  - for each decision that says reuse: Engine::lookup_snapshots under the
//    request's suffix, with the query = the snapshot of the sequence's latest
//    final hidden state (the previous forward's), so level 2 compares it with
//    stored snapshots of the same kind; a prefill has no such state yet and
//    looks up by key only (levels 1 and 3);
//  - after each of the adapter's layers: Engine::inject_snapshots into the
//    last row of each sequence that got one (the row whose logits come out);
//  - at the final norm: that row's snapshot becomes the next query, and the
//    prefill's is what the request records when it ends well (recorded at the
//    end, so a request never finds its own snapshot).
// GenerationResult::clm says what CLM did for the request: besides counts,
// its suffix's key, what its record did (result, version), and each snapshot
// it was served (level, key, version, similarity, forward), which is how
// examples/demo names the question whose snapshot a request got.
// Injected rows carry changed K/V, so requests with use_clm cache their pages
// under their own adapter id (generator.hpp); requests without it, and a
// model with no ClmLoop installed, compute exactly what they would without CLM.
//
// Not thread-safe apart from stats(): the generator's stepping thread calls
// everything else.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "clm/engine.hpp"
#include "decoder.hpp"
#include "generator.hpp"
#include "llama_config.hpp"

namespace tiny_llama {

// The trained CLM parts, as train_clm.sh leaves them.
struct ClmFiles {
  std::string head;        // src_head.* (clm_fit src-head)
  std::string projection;  // snapshot.* (clm_fit projection)
  std::string adapter;     // adapter.* (clm_fit adapter)

  static ClmFiles in(const std::string& dir) {
    return {dir + "/head.safetensors", dir + "/projection.safetensors", dir + "/adapter.safetensors"};
  }
  // Whether all three files exist (the demo trains when they do not).
  bool present() const;
};

// Where CLM acts in the model; ClmLoop and ClmCollector must agree.
struct ClmLayers {
  // Layers after which the adapter injects; empty: the last min(3, layers - 1).
  std::vector<std::int32_t> inject;
  // The layer whose attention output the SRC head reads; -1: the one just
  // below the first injecting layer. It must be below every injecting layer,
  // so that a decision is injected in the same forward.
  std::int32_t src = -1;

  // Fills the defaults for a model of `num_layers` and checks the result.
  clm::Status resolve(std::int32_t num_layers);
};

// How a request's suffix is found and keyed (shared by loop and collector).
struct ClmSuffixOptions {
  std::int32_t recent_tokens = 64;  // the suffix of a prompt with no user message
  std::string hashed_suffix_group;  // level-2 group of the host keys of unkeyable text (empty: each its own)
};

// A request's suffix, ready to be a SuffixRef (which only views it).
struct ClmSuffix {
  std::string text;   // the text, or the host key
  std::string group;  // the host key's group
  bool is_key = false;
  clm::SuffixRef ref() const { return {text, is_key, group}; }
};

// The suffix text of a request (see the top of this file).
std::string clm_suffix_text(std::span<const std::int32_t> prompt, const GenerateOptions& options,
                            const ClmSuffixOptions& suffix_options);
// Keys `text` with `keyer`: the text itself when it has a key, else the
// hashed host key; invalid_argument for empty text.
clm::Status make_clm_suffix(const clm::SuffixKeyer& keyer, const std::string& text,
                            const ClmSuffixOptions& suffix_options, ClmSuffix& out, clm::SuffixKey* key = nullptr);

struct ClmLoopConfig {
  ClmLayers layers;
  float residual_scale = 0.3f;  // the adapter's (clm_fit adapter --residual-scale)
  ClmSuffixOptions suffix;
};

struct ClmLoopStats {
  std::uint64_t requests = 0;            // admitted with use_clm
  std::uint64_t baseline_requests = 0;   // admitted without it
  std::uint64_t unkeyed_requests = 0;    // use_clm, but no suffix: nothing looked up or recorded
  std::uint64_t hashed_suffixes = 0;     // suffixes keyed by their hash (no lexicon key)
  std::uint64_t src_steps = 0;           // sequence-forwards scored by the SRC head
  std::uint64_t unscored_steps = 0;      // ... with no non-special row yet to average
  std::uint64_t reuse_decisions = 0;     // scores that passed the gate: each one a lookup
  std::uint64_t breaker_baseline = 0;    // sequence-forwards the breaker kept from looking up
  std::uint64_t lookups_with_query = 0;  // lookups that could use level 2
  std::uint64_t hits_exact = 0, hits_ann = 0, hits_fallback = 0, misses = 0;
  std::uint64_t injected_steps = 0;  // sequence-forwards whose last row got a snapshot (at every adapter layer)
  std::uint64_t records = 0;         // record_snapshot calls that succeeded
  // By clm::RecordResult, with room to spare for values added to it (the
  // largest today: abstained = 6); one beyond the room counts as an error.
  std::array<std::uint64_t, 8> record_results{};
  std::uint64_t record_errors = 0;  // failed records (the request itself is not failed)
  std::string last_record_error;
  // SRC scores of scored steps: 100 bins of 0.01 over [0, 1].
  std::array<std::uint64_t, 100> score_histogram{};

  std::uint64_t lookups() const { return hits_exact + hits_ann + hits_fallback + misses; }
  std::uint64_t hits() const { return hits_exact + hits_ann + hits_fallback; }
  // The q-quantile (0..1) of the scores, interpolated within a bin; 0 without scores.
  double score_quantile(double q) const;
};

// A few lines of text for a demo's table: scores, decisions, lookups by level, injections, records.
std::string format_clm_stats(const ClmLoopStats& stats);

class ClmLoop final : public LayerObserver, public RequestListener {
 public:
  // Loads the three files, checks them against the model and the engine's
  // store (hidden size, snapshot_dim), and installs head, projection and
  // adapter in the engine. The engine needs a snapshot store
  // (failed_precondition). A missing file is not_found naming it; a file that
  // is not what it should be, invalid_argument or io_error naming it; in
  // both cases nothing is installed. The engine must outlive the loop.
  static clm::Status create(clm::Engine& engine, const LlamaConfig& model, const ClmFiles& files,
                            const ClmLoopConfig& config, std::unique_ptr<ClmLoop>& out);

  // Becomes the model's observer and the generator's request listener (or
  // stops being them); while nothing runs.
  void install(Decoder& model, Generator& generator);
  void uninstall(Decoder& model, Generator& generator);

  const ClmLayers& layers() const { return config_.layers; }
  ClmLoopStats stats() const;
  // The sequences that get a snapshot in the forward under way (tests).
  std::span<const clm::SequenceId> injecting() const { return hit_ids_; }

  // LayerObserver
  clm::Status on_attention_output(std::int32_t layer, const ForwardBatch& batch, const float* rows) override;
  clm::Status after_layer(std::int32_t layer, const ForwardBatch& batch, float* hidden) override;
  clm::Status on_final_hidden(const ForwardBatch& batch, const float* last_rows) override;
  // RequestListener
  void on_admitted(clm::SequenceId seq, std::span<const std::int32_t> prompt, const GenerateOptions& options) override;
  void on_retired(clm::SequenceId seq, GenerationResult& result) override;

 private:
  struct Request {
    ClmSuffix suffix;
    std::vector<float> query;            // snapshot of the latest final hidden state; empty before
    std::vector<float> record_snapshot;  // the prefill's
    std::int32_t forwards = 0;
    bool hit_now = false;  // gets a snapshot in the forward under way
    ClmRequestCounts counts;
  };

  struct Lookup {  // a sequence whose score passed the gate
    clm::SequenceId id;
    Request* request;
    std::int32_t last_row;  // in the batch
  };

  ClmLoop(clm::Engine& engine, const LlamaConfig& model, const ClmLoopConfig& config, std::int32_t snapshot_dim);
  // One lookup_snapshots over `who`; the hits become this forward's injections.
  clm::Status look_up(std::span<const Lookup> who, bool with_query);

  clm::Engine& engine_;
  std::int32_t hidden_;
  std::int32_t dim_;
  ClmLoopConfig config_;
  std::vector<std::uint8_t> injects_at_;                   // [num_layers]
  std::unordered_map<clm::SequenceId, Request> requests_;  // requests with use_clm and a suffix
  // The forward under way: who gets which snapshot.
  std::vector<clm::SequenceId> hit_ids_;
  std::vector<std::int32_t> hit_rows_;  // batch row of each one's last row
  std::vector<float> hit_snapshots_;    // [hits][dim]
  std::vector<float> scratch_;
  mutable std::mutex stats_mutex_;
  ClmLoopStats stats_;
};

}  // namespace tiny_llama
