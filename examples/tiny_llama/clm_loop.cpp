// examples/tiny_llama/clm_loop.cpp: CLM suffix reuse in the decoder's loop.
#include "clm_loop.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "byte_tokenizer.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_head.hpp"

namespace tiny_llama {

namespace {

clm::Status with_context(const clm::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return {s.code(), fmt::format("{}: {}", context, s.message())};
}

// A trained file that exists but lacks a tensor is malformed, not missing:
// not_found is kept for files that are not there at all.
clm::Status file_error(const clm::Status& s, std::string_view context) {
  const clm::Status named = with_context(s, context);
  if (named.code() != clm::StatusCode::not_found) return named;
  return clm::invalid_argument(named.message());
}

bool byte_token(std::int32_t t) { return t >= 0 && t < 256; }

}  // namespace

bool ClmFiles::present() const {
  std::error_code ec;
  return std::filesystem::exists(head, ec) && std::filesystem::exists(projection, ec) &&
         std::filesystem::exists(adapter, ec);
}

clm::Status ClmLayers::resolve(std::int32_t num_layers) {
  if (num_layers < 2) {
    return clm::invalid_argument(fmt::format(
        "CLM layers: a model of {} layer(s) has no room for the SRC head below an injecting layer", num_layers));
  }
  if (inject.empty()) {
    const std::int32_t count = std::min(3, num_layers - 1);
    for (std::int32_t l = num_layers - count; l < num_layers; ++l) inject.push_back(l);
  }
  std::sort(inject.begin(), inject.end());
  for (std::size_t i = 0; i < inject.size(); ++i) {
    if (inject[i] < 0 || inject[i] >= num_layers) {
      return clm::invalid_argument(
          fmt::format("CLM layers: injecting layer {} is outside the model's [0, {})", inject[i], num_layers));
    }
    if (i > 0 && inject[i] == inject[i - 1]) {
      return clm::invalid_argument(fmt::format("CLM layers: injecting layer {} listed twice", inject[i]));
    }
  }
  if (src == -1) src = inject.front() - 1;
  if (src < 0 || src >= inject.front()) {
    return clm::invalid_argument(fmt::format(
        "CLM layers: the SRC layer must be in [0, {}) (below the first injecting layer), got {}", inject.front(), src));
  }
  return {};
}

std::string clm_suffix_text(std::span<const std::int32_t> prompt, const GenerateOptions& options,
                            const ClmSuffixOptions& suffix_options) {
  if (!options.clm_suffix.empty()) return options.clm_suffix;
  // The last "<|start_header_id|>user<|end_header_id|>\n\n" and what follows it up to <|eot_id|>.
  std::vector<std::int32_t> header{ByteTokenizer::kStartHeader};
  ByteTokenizer::encode("user", header);
  header.push_back(ByteTokenizer::kEndHeader);
  ByteTokenizer::encode("\n\n", header);
  const auto found = std::find_end(prompt.begin(), prompt.end(), header.begin(), header.end());
  std::string text;
  if (found != prompt.end()) {
    for (auto it = found + static_cast<std::ptrdiff_t>(header.size());
         it != prompt.end() && *it != ByteTokenizer::kEndOfTurn; ++it) {
      if (byte_token(*it)) text.push_back(static_cast<char>(*it));
    }
    if (!text.empty()) return text;
  }
  const auto recent = static_cast<std::size_t>(std::max(0, suffix_options.recent_tokens));
  for (std::size_t i = prompt.size() - std::min(prompt.size(), recent); i < prompt.size(); ++i) {
    if (byte_token(prompt[i])) text.push_back(static_cast<char>(prompt[i]));
  }
  return text;
}

clm::Status make_clm_suffix(const clm::SuffixKeyer& keyer, const std::string& text,
                            const ClmSuffixOptions& suffix_options, ClmSuffix& out, clm::SuffixKey* key) {
  if (text.empty()) return clm::invalid_argument("CLM suffix: the request has no suffix text");
  clm::SuffixKey k;
  const clm::Status keyed = keyer.make_key(text, k);
  if (keyed.ok()) {
    out = {text, "", false};
  } else if (keyed.code() == clm::StatusCode::invalid_argument) {
    // Text the lexicons cannot key (random bytes, another language): its hash,
    // so that the same text still meets its own snapshot.
    const std::string host = fmt::format("TEXT-{:016X}", clm::key_fingerprint(text));
    CLM_RETURN_IF_ERROR(clm::SuffixKeyer::from_host_key(host, suffix_options.hashed_suffix_group, k));
    out = {host, suffix_options.hashed_suffix_group, true};
  } else {
    return keyed;
  }
  if (key != nullptr) *key = std::move(k);
  return {};
}

double ClmLoopStats::score_quantile(double q) const {
  std::uint64_t total = 0;
  for (std::uint64_t n : score_histogram) total += n;
  if (total == 0) return 0.0;
  const double target = std::clamp(q, 0.0, 1.0) * static_cast<double>(total);
  double below = 0.0;
  for (std::size_t b = 0; b < score_histogram.size(); ++b) {
    const auto n = static_cast<double>(score_histogram[b]);
    if (n > 0 && below + n >= target) return (static_cast<double>(b) + (target - below) / n) / 100.0;
    below += n;
  }
  return 1.0;
}

std::string format_clm_stats(const ClmLoopStats& s) {
  const auto percent = [](std::uint64_t part, std::uint64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  };
  std::string out;
  out += fmt::format("requests     CLM on {} (hashed suffixes {}, no suffix {}), baseline {}\n", s.requests,
                     s.hashed_suffixes, s.unkeyed_requests, s.baseline_requests);
  out += fmt::format("SRC scores   {} scored: p10 {:.3f}  p50 {:.3f}  p90 {:.3f}  p99 {:.3f}  ({} unscored)\n",
                     s.src_steps, s.score_quantile(0.10), s.score_quantile(0.50), s.score_quantile(0.90),
                     s.score_quantile(0.99), s.unscored_steps);
  out += fmt::format("decisions    reuse {} ({:.1f}%), kept off by the breaker {}\n", s.reuse_decisions,
                     percent(s.reuse_decisions, s.src_steps), s.breaker_baseline);
  out += fmt::format("lookups      {}: exact {}  ann {}  fallback {}  miss {}  (hit rate {:.1f}%, {} with a query)\n",
                     s.lookups(), s.hits_exact, s.hits_ann, s.hits_fallback, s.misses, percent(s.hits(), s.lookups()),
                     s.lookups_with_query);
  out += fmt::format("injections   {} sequence-forwards\n", s.injected_steps);
  out += fmt::format("records      {}:", s.records);
  for (std::size_t r = 0; r < s.record_results.size(); ++r) {
    const auto result = static_cast<clm::RecordResult>(r);
    // not_written is record_batch's; the spare room of the array has no name.
    if (result == clm::RecordResult::not_written ||
        (s.record_results[r] == 0 && std::string_view(clm::record_result_name(result)) == "unknown")) {
      continue;
    }
    out += fmt::format(" {} {}", clm::record_result_name(result), s.record_results[r]);
  }
  out += fmt::format(", errors {}", s.record_errors);
  if (s.record_errors > 0) out += fmt::format(" (the last: {})", s.last_record_error);
  out += "\n";
  return out;
}

ClmLoop::ClmLoop(clm::Engine& engine, const LlamaConfig& model, const ClmLoopConfig& config, std::int32_t snapshot_dim)
    : engine_(engine),
      hidden_(model.hidden),
      dim_(snapshot_dim),
      config_(config),
      injects_at_(static_cast<std::size_t>(model.num_layers), 0) {
  for (std::int32_t l : config_.layers.inject) injects_at_[static_cast<std::size_t>(l)] = 1;
}

clm::Status ClmLoop::create(clm::Engine& engine, const LlamaConfig& model, const ClmFiles& files,
                            const ClmLoopConfig& config_in, std::unique_ptr<ClmLoop>& out) {
  const clm::SnapshotStore* store = engine.snapshot_store();
  if (store == nullptr) {
    return clm::failed_precondition(
        "ClmLoop: the engine has no snapshot store (set EngineConfig::snapshot_store.path)");
  }
  ClmLoopConfig config = config_in;
  CLM_RETURN_IF_ERROR(with_context(config.layers.resolve(model.num_layers), "ClmLoop"));
  const std::int32_t dim = store->config().snapshot_dim;
  for (const auto& [what, path] :
       {std::pair{"SRC head", &files.head}, std::pair{"snapshot projection", &files.projection},
        std::pair{"snapshot adapter", &files.adapter}}) {
    std::error_code ec;
    if (!std::filesystem::exists(*path, ec)) {
      return clm::not_found(fmt::format("ClmLoop: no trained {} at '{}' (train_clm.sh makes it)", what, *path));
    }
  }
  // Everything is loaded and checked before anything is installed.
  clm::SrcHeadWeights head_weights;
  clm::Gelu gelu = clm::Gelu::tanh;
  const std::string head_context = fmt::format("ClmLoop: SRC head '{}'", files.head);
  CLM_RETURN_IF_ERROR(file_error(clm::load_src_head(files.head, std::nullopt, head_weights, gelu), head_context));
  if (head_weights.hidden != model.hidden) {
    return clm::invalid_argument(
        fmt::format("{}: hidden size {}, the model's is {}", head_context, head_weights.hidden, model.hidden));
  }
  std::unique_ptr<clm::SrcHead> head;
  CLM_RETURN_IF_ERROR(with_context(clm::SrcHead::create(std::move(head_weights), gelu, head), head_context));

  clm::SnapshotProjectionWeights projection_weights;
  const std::string projection_context = fmt::format("ClmLoop: snapshot projection '{}'", files.projection);
  CLM_RETURN_IF_ERROR(
      file_error(clm::read_snapshot_projection(files.projection, projection_weights), projection_context));
  if (projection_weights.hidden != model.hidden || projection_weights.snapshot_dim != dim) {
    return clm::invalid_argument(
        fmt::format("{}: hidden {} and snapshot_dim {}; the model's hidden is {} and the store's snapshot_dim {}",
                    projection_context, projection_weights.hidden, projection_weights.snapshot_dim, model.hidden, dim));
  }
  std::unique_ptr<clm::SnapshotProjection> projection;
  CLM_RETURN_IF_ERROR(
      with_context(clm::SnapshotProjection::create(std::move(projection_weights), projection), projection_context));

  clm::SnapshotAdapterWeights adapter_weights;
  const std::string adapter_context = fmt::format("ClmLoop: snapshot adapter '{}'", files.adapter);
  CLM_RETURN_IF_ERROR(file_error(clm::read_snapshot_adapter(files.adapter, adapter_weights), adapter_context));
  if (adapter_weights.hidden != model.hidden || adapter_weights.snapshot_dim != dim) {
    return clm::invalid_argument(
        fmt::format("{}: hidden {} and snapshot_dim {}; the model's hidden is {} and the store's snapshot_dim {}",
                    adapter_context, adapter_weights.hidden, adapter_weights.snapshot_dim, model.hidden, dim));
  }
  std::unique_ptr<clm::SnapshotAdapter> adapter;
  CLM_RETURN_IF_ERROR(with_context(
      clm::SnapshotAdapter::create(
          std::move(adapter_weights),
          {.num_layers = model.num_layers, .layers = config.layers.inject, .residual_scale = config.residual_scale},
          adapter),
      adapter_context));

  engine.set_src_head(std::move(head));
  engine.set_snapshot_projection(std::move(projection));
  engine.set_snapshot_adapter(std::move(adapter));
  out.reset(new ClmLoop(engine, model, config, dim));
  return {};
}

void ClmLoop::install(Decoder& model, Generator& generator) {
  requests_.clear();
  hit_ids_.clear();
  model.set_observer(this);
  generator.set_request_listener(this);
}

void ClmLoop::uninstall(Decoder& model, Generator& generator) {
  model.set_observer(nullptr);
  generator.set_request_listener(nullptr);
  requests_.clear();
  hit_ids_.clear();
}

ClmLoopStats ClmLoop::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ClmLoop::on_admitted(clm::SequenceId seq, std::span<const std::int32_t> prompt, const GenerateOptions& options) {
  if (!options.use_clm) {
    std::lock_guard lock(stats_mutex_);
    ++stats_.baseline_requests;
    return;
  }
  Request request;
  const clm::Status keyed =
      make_clm_suffix(engine_.snapshot_store()->keyer(), clm_suffix_text(prompt, options, config_.suffix),
                      config_.suffix, request.suffix);
  // The key the store looks up and records under, for the request's result.
  if (clm::SuffixKey key; keyed.ok() && engine_.suffix_key(request.suffix.ref(), key).ok()) {
    request.counts.key = key.key;
  }
  std::lock_guard lock(stats_mutex_);
  ++stats_.requests;
  if (!keyed.ok()) {  // nothing to look up or record under
    ++stats_.unkeyed_requests;
    return;
  }
  if (request.suffix.is_key) ++stats_.hashed_suffixes;
  requests_[seq] = std::move(request);
}

void ClmLoop::on_retired(clm::SequenceId seq, GenerationResult& result) {
  const auto it = requests_.find(seq);
  if (it == requests_.end()) return;
  Request& r = it->second;
  const bool ended_well = result.status.ok() && (result.finish_reason == "stop" || result.finish_reason == "length");
  if (ended_well && !r.record_snapshot.empty()) {
    clm::RecordOutcome outcome;
    const clm::Status recorded = engine_.record_snapshot(seq, r.suffix.ref(), r.record_snapshot, outcome);
    std::lock_guard lock(stats_mutex_);
    const auto slot = static_cast<std::size_t>(outcome.result);
    if (recorded.ok() && slot >= stats_.record_results.size()) {
      ++stats_.record_errors;
      stats_.last_record_error = fmt::format("record result {} is beyond ClmLoopStats::record_results", slot);
    } else if (recorded.ok()) {
      ++stats_.records;
      ++stats_.record_results[slot];
      r.counts.recorded = true;
      r.counts.record_result = outcome.result;
      r.counts.record_version = outcome.version;
    } else {  // the answer stands; the store just learns nothing from it
      ++stats_.record_errors;
      stats_.last_record_error = recorded.message();
    }
  }
  result.clm = r.counts;
  requests_.erase(it);
}

clm::Status ClmLoop::on_attention_output(std::int32_t layer, const ForwardBatch& batch, const float* rows) {
  if (layer != config_.layers.src) return {};
  hit_ids_.clear();
  hit_rows_.clear();
  hit_snapshots_.clear();
  // The sequences of this batch with CLM on, as their own ragged batch.
  std::vector<clm::SequenceId> ids;
  std::vector<Request*> requests;
  std::vector<std::int32_t> last_rows;
  std::vector<std::int32_t> indptr{0}, tokens;
  const auto h = static_cast<std::size_t>(hidden_);
  scratch_.clear();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto it = requests_.find(batch.ids[i]);
    if (it == requests_.end()) continue;
    it->second.hit_now = false;
    ids.push_back(batch.ids[i]);
    requests.push_back(&it->second);
    last_rows.push_back(batch.indptr[i + 1] - 1);
    const auto begin = static_cast<std::size_t>(batch.indptr[i]), end = static_cast<std::size_t>(batch.indptr[i + 1]);
    tokens.insert(tokens.end(), batch.tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                  batch.tokens.begin() + static_cast<std::ptrdiff_t>(end));
    scratch_.insert(scratch_.end(), rows + begin * h, rows + end * h);
    indptr.push_back(static_cast<std::int32_t>(tokens.size()));
  }
  if (ids.empty()) return {};
  std::vector<clm::SrcDecision> decisions(ids.size());
  CLM_RETURN_IF_ERROR(
      engine_.src_step(ids, clm::ConstActivationView::f32(scratch_, static_cast<std::int64_t>(tokens.size()), hidden_),
                       tokens, indptr, decisions));
  std::vector<Lookup> by_key, by_query;  // who looks up: by key only, or with a level-2 query too
  {
    std::lock_guard lock(stats_mutex_);
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const clm::SrcDecision& d = decisions[j];
      Request& r = *requests[j];
      if (d.scored == 0) {
        ++stats_.unscored_steps;
        continue;
      }
      ++stats_.src_steps;
      ++stats_.score_histogram[std::min<std::size_t>(99, static_cast<std::size_t>(d.score * 100.0f))];
      ++r.counts.src_steps;
      r.counts.max_src_score = std::max(r.counts.max_src_score, d.score);
      if (d.baseline != 0) ++stats_.breaker_baseline;
      if (d.reuse == 0) continue;
      ++stats_.reuse_decisions;
      ++r.counts.reuse_decisions;
      (r.query.empty() ? by_key : by_query).push_back({ids[j], &r, last_rows[j]});
    }
  }
  CLM_RETURN_IF_ERROR(look_up(by_key, false));
  return look_up(by_query, true);
}

clm::Status ClmLoop::look_up(std::span<const Lookup> who, bool with_query) {
  if (who.empty()) return {};
  const std::size_t n = who.size(), dim = static_cast<std::size_t>(dim_);
  std::vector<clm::SequenceId> ids(n);
  std::vector<clm::SuffixRef> suffixes(n);
  std::vector<float> queries(with_query ? n * dim : 0), snapshots(n * dim);
  std::vector<clm::SnapshotHit> hits(n);
  std::vector<std::uint8_t> apply(n);
  for (std::size_t k = 0; k < n; ++k) {
    ids[k] = who[k].id;
    suffixes[k] = who[k].request->suffix.ref();
    if (with_query) std::copy(who[k].request->query.begin(), who[k].request->query.end(), queries.begin() + k * dim);
  }
  CLM_RETURN_IF_ERROR(engine_.lookup_snapshots(ids, suffixes, queries, hits, snapshots, apply));
  std::lock_guard lock(stats_mutex_);
  if (with_query) stats_.lookups_with_query += n;
  for (std::size_t k = 0; k < n; ++k) {
    Request& r = *who[k].request;
    switch (hits[k].level) {
      case clm::SnapshotLevel::exact:
        ++stats_.hits_exact;
        ++r.counts.hits_exact;
        break;
      case clm::SnapshotLevel::ann:
        ++stats_.hits_ann;
        ++r.counts.hits_ann;
        break;
      case clm::SnapshotLevel::fallback:
        ++stats_.hits_fallback;
        ++r.counts.hits_fallback;
        break;
      case clm::SnapshotLevel::miss:
        ++stats_.misses;
        ++r.counts.misses;
        break;
    }
    if (hits[k].level != clm::SnapshotLevel::miss) {
      r.counts.served.push_back({hits[k].level, hits[k].key, hits[k].version, hits[k].similarity, r.forwards});
    }
    if (apply[k] == 0) continue;
    r.hit_now = true;
    hit_ids_.push_back(ids[k]);
    hit_rows_.push_back(who[k].last_row);
    hit_snapshots_.insert(hit_snapshots_.end(), snapshots.begin() + static_cast<std::ptrdiff_t>(k * dim),
                          snapshots.begin() + static_cast<std::ptrdiff_t>((k + 1) * dim));
  }
  return {};
}

clm::Status ClmLoop::after_layer(std::int32_t layer, const ForwardBatch& /*batch*/, float* hidden) {
  if (hit_ids_.empty() || layer < 0 || static_cast<std::size_t>(layer) >= injects_at_.size() ||
      injects_at_[static_cast<std::size_t>(layer)] == 0) {
    return {};
  }
  // Only each sequence's last row: the one whose logits come out of this forward.
  const std::size_t k = hit_ids_.size(), h = static_cast<std::size_t>(hidden_);
  scratch_.resize(k * h);
  for (std::size_t j = 0; j < k; ++j) {
    std::memcpy(scratch_.data() + j * h, hidden + static_cast<std::size_t>(hit_rows_[j]) * h, h * sizeof(float));
  }
  std::vector<std::int32_t> indptr(k + 1);
  for (std::size_t j = 0; j <= k; ++j) indptr[j] = static_cast<std::int32_t>(j);
  const std::vector<std::uint8_t> apply(k, 1);
  CLM_RETURN_IF_ERROR(
      engine_.inject_snapshots(hit_ids_, clm::ActivationView::f32(scratch_, static_cast<std::int64_t>(k), hidden_),
                               indptr, hit_snapshots_, apply, layer));
  for (std::size_t j = 0; j < k; ++j) {
    std::memcpy(hidden + static_cast<std::size_t>(hit_rows_[j]) * h, scratch_.data() + j * h, h * sizeof(float));
  }
  return {};
}

clm::Status ClmLoop::on_final_hidden(const ForwardBatch& batch, const float* last_rows) {
  const std::size_t h = static_cast<std::size_t>(hidden_), dim = static_cast<std::size_t>(dim_);
  std::vector<Request*> requests;
  scratch_.clear();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto it = requests_.find(batch.ids[i]);
    if (it == requests_.end()) continue;
    requests.push_back(&it->second);
    scratch_.insert(scratch_.end(), last_rows + i * h, last_rows + (i + 1) * h);
  }
  hit_ids_.clear();
  if (requests.empty()) return {};
  const std::size_t n = requests.size();
  std::vector<float> snapshots(n * dim);
  std::vector<std::uint8_t> made(n, 1);
  if (!engine_.make_snapshots(clm::ConstActivationView::f32(scratch_, static_cast<std::int64_t>(n), hidden_), snapshots)
           .ok()) {
    // A row with no direction after the projection (it equals the PCA mean):
    // that sequence just has no query next time.
    for (std::size_t j = 0; j < n; ++j) {
      made[j] = engine_.make_snapshots(clm::ConstActivationView::f32(std::span(scratch_).subspan(j * h, h), 1, hidden_),
                                       std::span(snapshots).subspan(j * dim, dim))
                        .ok()
                    ? 1
                    : 0;
    }
  }
  std::lock_guard lock(stats_mutex_);
  for (std::size_t j = 0; j < n; ++j) {
    Request& r = *requests[j];
    if (made[j] != 0) {
      r.query.assign(snapshots.begin() + static_cast<std::ptrdiff_t>(j * dim),
                     snapshots.begin() + static_cast<std::ptrdiff_t>((j + 1) * dim));
    } else {
      r.query.clear();
    }
    if (r.forwards == 0) r.record_snapshot = r.query;
    if (r.hit_now) {
      ++stats_.injected_steps;
      ++r.counts.injected_steps;
      if (r.counts.first_injected_step < 0) r.counts.first_injected_step = r.forwards;
      r.hit_now = false;
    }
    ++r.forwards;
  }
  return {};
}

}  // namespace tiny_llama
