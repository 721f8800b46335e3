// examples/tiny_llama/clm_collect.cpp: collecting CLM's training data from the decoder's own conversations.
#include "clm_collect.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "clm/io/safetensors.hpp"

namespace tiny_llama {

namespace {

template <class T>
clm::TensorToWrite tensor(std::string name, clm::TensorDType dtype, std::vector<std::int64_t> shape,
                          const std::vector<T>& values) {
  return {std::move(name), dtype, std::move(shape), std::as_bytes(std::span(values))};
}

}  // namespace

ClmCollector::ClmCollector(const LlamaConfig& model, std::span<const std::int32_t> special_ids,
                           const ClmCollectConfig& config, std::unique_ptr<clm::SuffixKeyer> keyer)
    : hidden_(model.hidden),
      special_ids_(special_ids.begin(), special_ids.end()),
      config_(config),
      keyer_(std::move(keyer)) {}

clm::Status ClmCollector::create(const LlamaConfig& model, std::span<const std::int32_t> special_ids,
                                 const ClmCollectConfig& config_in, std::unique_ptr<ClmCollector>& out) {
  ClmCollectConfig config = config_in;
  CLM_RETURN_IF_ERROR(config.layers.resolve(model.num_layers));
  if (config.snapshot_dim < 1 || config.snapshot_dim > model.hidden) {
    return clm::invalid_argument(fmt::format("ClmCollector: snapshot_dim must be in [1, {}] (the hidden size), got {}",
                                             model.hidden, config.snapshot_dim));
  }
  if (config.label_ngram < 1) return clm::invalid_argument("ClmCollector: label_ngram must be >= 1");
  if (!(config.residual_scale > 0.0f) || !std::isfinite(config.residual_scale)) {
    return clm::invalid_argument("ClmCollector: residual_scale must be a finite number > 0");
  }
  if (config.max_hidden_samples <= config.snapshot_dim) {
    return clm::invalid_argument("ClmCollector: max_hidden_samples must exceed snapshot_dim");
  }
  std::unique_ptr<clm::SuffixKeyer> keyer;
  CLM_RETURN_IF_ERROR(clm::SuffixKeyer::create(config.keyer, keyer));
  out.reset(new ClmCollector(model, special_ids, config, std::move(keyer)));
  return {};
}

void ClmCollector::install(Decoder& model, Generator& generator) {
  requests_.clear();
  model.set_observer(this);
  generator.set_request_listener(this);
}

void ClmCollector::uninstall(Decoder& model, Generator& generator) {
  model.set_observer(nullptr);
  generator.set_request_listener(nullptr);
  requests_.clear();
}

bool ClmCollector::special(std::int32_t token) const {
  return std::find(special_ids_.begin(), special_ids_.end(), token) != special_ids_.end();
}

ClmCollectStats ClmCollector::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void ClmCollector::on_admitted(clm::SequenceId seq, std::span<const std::int32_t> prompt,
                               const GenerateOptions& options) {
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.sum.assign(static_cast<std::size_t>(hidden_), 0.0);
  ClmSuffix suffix;
  clm::SuffixKey key;
  if (make_clm_suffix(*keyer_, clm_suffix_text(prompt, options, config_.suffix), config_.suffix, suffix, &key).ok()) {
    r.key = key.key;
  }
  requests_[seq] = std::move(r);
}

void ClmCollector::on_retired(clm::SequenceId seq, GenerationResult& result) {
  const auto it = requests_.find(seq);
  if (it == requests_.end()) return;
  Request& r = it->second;
  std::lock_guard lock(mutex_);
  if (!result.status.ok() || (result.finish_reason != "stop" && result.finish_reason != "length")) {
    ++stats_.dropped_requests;
    requests_.erase(it);
    return;
  }
  const auto base = static_cast<std::int64_t>(tokens_.size());
  tokens_.insert(tokens_.end(), r.prompt.begin(), r.prompt.end());
  tokens_.insert(tokens_.end(), result.tokens.begin(), result.tokens.end());
  generated_.insert(generated_.end(), r.prompt.size(), 0);
  generated_.insert(generated_.end(), result.tokens.size(), 1);
  indptr_.push_back(static_cast<std::int64_t>(tokens_.size()));
  features_.insert(features_.end(), r.features.begin(), r.features.end());
  for (std::int64_t w : r.where) positions_.push_back(base + w);
  ++stats_.conversations;
  stats_.tokens = static_cast<std::int64_t>(tokens_.size());
  stats_.generated_tokens += static_cast<std::int64_t>(result.tokens.size());
  stats_.feature_rows = static_cast<std::int64_t>(positions_.size());
  requests_.erase(it);
}

clm::Status ClmCollector::on_attention_output(std::int32_t layer, const ForwardBatch& batch, const float* rows) {
  if (layer != config_.layers.src) return {};
  const auto h = static_cast<std::size_t>(hidden_);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto it = requests_.find(batch.ids[i]);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    for (auto row = static_cast<std::size_t>(batch.indptr[i]); row < static_cast<std::size_t>(batch.indptr[i + 1]);
         ++row) {
      if (special(batch.tokens[row])) continue;
      for (std::size_t c = 0; c < h; ++c) r.sum[c] += rows[row * h + c];
      ++r.count;
    }
    // A decode forward feeds back generated token forwards-1: the mean so far
    // is what the SRC head sees when it scores the suffix ending there.
    if (r.forwards == 0 || r.count == 0) continue;
    for (std::size_t c = 0; c < h; ++c) r.features.push_back(static_cast<float>(r.sum[c] / double(r.count)));
    r.where.push_back(static_cast<std::int64_t>(r.prompt.size()) + r.forwards - 1);
  }
  return {};
}

clm::Status ClmCollector::after_layer(std::int32_t layer, const ForwardBatch& batch, float* hidden) {
  if (layer != config_.layers.inject.back()) return {};
  const auto h = static_cast<std::size_t>(hidden_);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto it = requests_.find(batch.ids[i]);
    if (it == requests_.end() || it->second.forwards != 0) continue;
    const float* last = hidden + static_cast<std::size_t>(batch.indptr[i + 1] - 1) * h;
    it->second.residual.assign(last, last + h);
  }
  return {};
}

clm::Status ClmCollector::on_final_hidden(const ForwardBatch& batch, const float* last_rows) {
  const auto h = static_cast<std::size_t>(hidden_);
  const auto capacity = static_cast<std::size_t>(config_.max_hidden_samples);
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const float* row = last_rows + i * h;
    // Reservoir sampling: every forward's row is kept with the same chance.
    ++samples_seen_;
    if (samples_.size() < capacity * h) {
      samples_.insert(samples_.end(), row, row + h);
    } else {
      const std::uint64_t slot = sampler_() % static_cast<std::uint64_t>(samples_seen_);
      if (slot < capacity) std::copy(row, row + h, samples_.begin() + static_cast<std::ptrdiff_t>(slot * h));
    }
    const auto it = requests_.find(batch.ids[i]);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    if (r.forwards++ != 0 || r.key.empty() || r.residual.size() != h) continue;
    auto [earlier, first] = occurrences_.try_emplace(r.key);
    if (!first) {
      const auto k = static_cast<float>(config_.layers.inject.size());
      pair_hidden_.insert(pair_hidden_.end(), earlier->second.final_hidden.begin(), earlier->second.final_hidden.end());
      for (std::size_t c = 0; c < h; ++c) pair_deltas_.push_back((earlier->second.residual[c] - r.residual[c]) / k);
    }
    earlier->second.final_hidden.assign(row, row + h);
    earlier->second.residual = r.residual;
  }
  stats_.hidden_samples = static_cast<std::int64_t>(samples_.size() / h);
  stats_.adapter_pairs = static_cast<std::int64_t>(pair_deltas_.size() / h);
  return {};
}

clm::Status ClmCollector::write(const std::string& dir) const {
  std::lock_guard lock(mutex_);
  const auto h = static_cast<std::int64_t>(hidden_);
  const auto rows = [h](const std::vector<float>& v) { return static_cast<std::int64_t>(v.size()) / h; };
  if (stats_.conversations == 0) {
    return clm::failed_precondition("ClmCollector: no conversation ended well: nothing to train on");
  }
  if (positions_.empty()) {
    return clm::failed_precondition(
        "ClmCollector: no generated token was fed back (max_new_tokens >= 2 gives the SRC head rows to learn from)");
  }
  if (rows(samples_) <= config_.snapshot_dim) {
    return clm::failed_precondition(
        fmt::format("ClmCollector: {} hidden samples; the projection to {} dimensions needs more than that",
                    rows(samples_), config_.snapshot_dim));
  }
  if (pair_deltas_.empty()) {
    return clm::failed_precondition(
        "ClmCollector: no suffix was asked twice: the adapter has no (snapshot, delta) pair to learn from");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return clm::io_error(fmt::format("ClmCollector: cannot create '{}': {}", dir, ec.message()));
  const std::string at = dir + "/";
  using D = clm::TensorDType;
  const std::vector<clm::TensorToWrite> conversations = {
      tensor("tokens", D::i32, {static_cast<std::int64_t>(tokens_.size())}, tokens_),
      tensor("generated", D::u8, {static_cast<std::int64_t>(generated_.size())}, generated_),
      tensor("indptr", D::i64, {static_cast<std::int64_t>(indptr_.size())}, indptr_)};
  CLM_RETURN_IF_ERROR(clm::write_safetensors(at + "conversations.safetensors", conversations,
                                             {{"written_by", "tiny_llama::ClmCollector"}}));
  const std::vector<clm::TensorToWrite> features = {
      tensor("features", D::f32, {rows(features_), h}, features_),
      tensor("positions", D::i64, {static_cast<std::int64_t>(positions_.size())}, positions_)};
  CLM_RETURN_IF_ERROR(clm::write_safetensors(at + "src_features.safetensors", features,
                                             {{"src_layer", std::to_string(config_.layers.src)}}));
  const std::vector<clm::TensorToWrite> samples = {tensor("samples", D::f32, {rows(samples_), h}, samples_)};
  CLM_RETURN_IF_ERROR(clm::write_safetensors(at + "hidden_samples.safetensors", samples));
  const std::vector<clm::TensorToWrite> pairs = {tensor("hidden", D::f32, {rows(pair_hidden_), h}, pair_hidden_),
                                                 tensor("deltas", D::f32, {rows(pair_deltas_), h}, pair_deltas_)};
  CLM_RETURN_IF_ERROR(clm::write_safetensors(at + "adapter_pairs.safetensors", pairs));

  const std::string layers = fmt::format("{}", fmt::join(config_.layers.inject, ","));
  std::ofstream manifest(at + "clm_collect.txt", std::ios::trunc);
  manifest << "# written by tiny_llama::ClmCollector; read by train_clm.sh\n"
           << "snapshot_dim=" << config_.snapshot_dim << "\n"
           << "label_ngram=" << config_.label_ngram << "\n"
           << "residual_scale=" << fmt::format("{}", config_.residual_scale) << "\n"
           << "hidden=" << hidden_ << "\n"
           << "src_layer=" << config_.layers.src << "\n"
           << "inject_layers=" << layers << "\n"
           << "conversations=" << stats_.conversations << "\n"
           << "feature_rows=" << positions_.size() << "\n"
           << "hidden_samples=" << rows(samples_) << "\n"
           << "adapter_pairs=" << rows(pair_deltas_) << "\n";
  manifest.close();
  if (!manifest) return clm::io_error(fmt::format("ClmCollector: cannot write '{}clm_collect.txt'", at));
  return {};
}

}  // namespace tiny_llama
