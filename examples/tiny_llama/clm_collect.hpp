// examples/tiny_llama/clm_collect.hpp: the training data of CLM in the loop,
// collected from the decoder's own conversations while it runs with CLM off
// (docs/clm.md, "In the loop"). A ClmCollector is the model's LayerObserver
// and the generator's RequestListener; write() leaves in a directory what
// train_clm.sh feeds to clm_fit.
//
//   tiny_llama::ClmCollectConfig config;
//   config.snapshot_dim = 256;                 // the store's
//   std::unique_ptr<tiny_llama::ClmCollector> collector;
//   CLM_RETURN_IF_ERROR(tiny_llama::ClmCollector::create(model->config(), engine->config().special_token_ids,
//                                                        config, collector));
//   collector->install(*model, generator);
//   ... submit the conversations (use_clm = false), run_until_idle() ...
//   collector->uninstall(*model, generator);
//   CLM_RETURN_IF_ERROR(collector->write("clm-collect"));
//   // then: train_clm.sh build/examples/clm_fit/clm_fit clm-collect clm-trained
//
// Each request that ends well is one conversation (its prompt holds the
// earlier turns). What is written:
//  - conversations.safetensors: tokens [L] I32 (prompt + answer of each
//    request), generated [L] U8 (1 = the model's token), indptr [C+1] I64:
//    for `clm_fit labels`;
//  - src_features.safetensors: features [m, hidden] F32, the running mean of
//    the SRC layer's attention-output rows a request computed (special tokens
//    left out: what Engine::src_step pools), taken at each generated token the
//    request fed back in, and positions [m] I64, that token's index in
//    conversations' tokens: for `clm_fit src-head --labels`;
//  - hidden_samples.safetensors: samples [s, hidden] F32, final hidden states
//    (after the final norm) of the forwards' last rows, a uniform sample of
//    at most max_hidden_samples: for `clm_fit projection`;
//  - adapter_pairs.safetensors: hidden [p, hidden] and deltas [p, hidden] F32.
//    When a request's suffix (keyed as ClmLoop keys it) was seen in an
//    earlier request, one pair: that earlier request's prefill final hidden
//    state (what its snapshot is made of; `clm_fit adapter --projection`
//    projects it), and (x_earlier - x_now) / k, the difference of the residual
//    streams of the two prefills' last rows after the last injecting layer,
//    over k = the number of injecting layers: the adapter adds its delta at
//    each of the k layers, and the stream carries every addition to the end,
//    so k of them move the current state to where the earlier occurrence was;
//  - clm_collect.txt: key=value lines (snapshot_dim, label_ngram,
//    residual_scale, hidden, layers, counts) that train_clm.sh reads.
// Not thread-safe apart from stats(): the stepping thread calls the rest.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "clm/store/suffix_key.hpp"
#include "clm_loop.hpp"

namespace tiny_llama {

struct ClmCollectConfig {
  ClmLayers layers;                 // as the ClmLoop will run
  std::int32_t snapshot_dim = 256;  // the store's (clm_fit projection --dim)
  std::int32_t label_ngram = 4;     // clm_fit labels --n
  float residual_scale = 0.3f;      // the adapter's (clm_fit adapter --residual-scale)
  std::int64_t max_hidden_samples = 20000;
  ClmSuffixOptions suffix;
  clm::SuffixKeyerConfig keyer;  // as the store's: finds the repeated suffixes
};

struct ClmCollectStats {
  std::int64_t conversations = 0;
  std::int64_t tokens = 0;
  std::int64_t generated_tokens = 0;
  std::int64_t feature_rows = 0;
  std::int64_t hidden_samples = 0;  // kept (at most max_hidden_samples)
  std::int64_t adapter_pairs = 0;
  std::int64_t dropped_requests = 0;  // ended with an error or cancelled: not written
};

class ClmCollector final : public LayerObserver, public RequestListener {
 public:
  // special_ids: the engine's EngineConfig::special_token_ids (left out of the means).
  static clm::Status create(const LlamaConfig& model, std::span<const std::int32_t> special_ids,
                            const ClmCollectConfig& config, std::unique_ptr<ClmCollector>& out);

  void install(Decoder& model, Generator& generator);
  void uninstall(Decoder& model, Generator& generator);

  // Writes the files above into `dir` (created if missing). failed_precondition
  // when there is not enough to train on (no conversation, no generated token
  // fed back, fewer hidden samples than snapshot_dim + 1, no repeated suffix),
  // io_error when a file cannot be written.
  clm::Status write(const std::string& dir) const;
  ClmCollectStats stats() const;

  // LayerObserver
  clm::Status on_attention_output(std::int32_t layer, const ForwardBatch& batch, const float* rows) override;
  clm::Status after_layer(std::int32_t layer, const ForwardBatch& batch, float* hidden) override;
  clm::Status on_final_hidden(const ForwardBatch& batch, const float* last_rows) override;
  // RequestListener
  void on_admitted(clm::SequenceId seq, std::span<const std::int32_t> prompt, const GenerateOptions& options) override;
  void on_retired(clm::SequenceId seq, GenerationResult& result) override;

 private:
  struct Request {
    std::vector<std::int32_t> prompt;
    std::string key;                  // the suffix key ("" without a suffix)
    std::vector<double> sum;          // running sum of the SRC layer's non-special rows
    std::int64_t count = 0;           // ... and how many
    std::vector<float> features;      // [rows][hidden]
    std::vector<std::int64_t> where;  // each feature row's position in prompt + answer
    std::vector<float> residual;      // the prefill's last row after the last injecting layer
    std::int32_t forwards = 0;
  };
  struct Occurrence {  // a suffix's latest prefill
    std::vector<float> final_hidden, residual;
  };

  ClmCollector(const LlamaConfig& model, std::span<const std::int32_t> special_ids, const ClmCollectConfig& config,
               std::unique_ptr<clm::SuffixKeyer> keyer);
  bool special(std::int32_t token) const;

  std::int32_t hidden_;
  std::vector<std::int32_t> special_ids_;
  ClmCollectConfig config_;
  std::unique_ptr<clm::SuffixKeyer> keyer_;
  std::unordered_map<clm::SequenceId, Request> requests_;
  std::map<std::string, Occurrence> occurrences_;
  std::mt19937_64 sampler_{0x5eed};  // reservoir sampling of the hidden states
  std::int64_t samples_seen_ = 0;

  mutable std::mutex mutex_;  // guards what write() and stats() read
  std::vector<std::int32_t> tokens_;
  std::vector<std::uint8_t> generated_;
  std::vector<std::int64_t> indptr_{0};
  std::vector<float> features_;
  std::vector<std::int64_t> positions_;
  std::vector<float> samples_;
  std::vector<float> pair_hidden_, pair_deltas_;
  ClmCollectStats stats_;
};

}  // namespace tiny_llama
