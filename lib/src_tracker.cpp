// SrcTracker (include/clm/src_tracker.hpp): running sums per sequence, the
// head on their means, and the gate; validate, compute outside the lock, then
// commit all or nothing.
#include "clm/src_tracker.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>
#include <utility>

namespace clm {

SrcTracker::SrcTracker(SrcGateConfig config, std::vector<std::int32_t> special_ids)
    : config_(config), threshold_(src_threshold(config)), special_ids_([&special_ids] {
        std::sort(special_ids.begin(), special_ids.end());
        special_ids.erase(std::unique(special_ids.begin(), special_ids.end()), special_ids.end());
        return std::move(special_ids);
      }()) {
  metrics_.threshold = threshold_;
}

void SrcTracker::set_head(std::shared_ptr<const SrcHead> head) {
  std::lock_guard lock(mutex_);
  const int32_t old_hidden = head_ ? head_->hidden() : -1;
  head_ = std::move(head);
  if (!head_ || head_->hidden() != old_hidden) {
    for (auto& [id, state] : states_) {
      state.sum.clear();
      state.count = 0;
      state.version = next_version_++;
    }
  }
}

std::shared_ptr<const SrcHead> SrcTracker::head() const {
  std::lock_guard lock(mutex_);
  return head_;
}

void SrcTracker::add(SeqId id) {
  std::lock_guard lock(mutex_);
  const auto [it, added] = states_.try_emplace(id);
  if (added) it->second.version = next_version_++;
}

void SrcTracker::remove(SeqId id) {
  std::lock_guard lock(mutex_);
  states_.erase(id);
}

bool SrcTracker::in_baseline(SeqId id) const {
  std::lock_guard lock(mutex_);
  const auto it = states_.find(id);
  return it != states_.end() && it->second.gate.baseline;
}

Status SrcTracker::baseline_flags(std::span<const SeqId> ids, std::vector<std::uint8_t>& baseline_out) const {
  std::vector<std::uint8_t> flags(ids.size());
  std::lock_guard lock(mutex_);
  CLM_RETURN_IF_ERROR(baseline_flags_locked(ids, flags));
  baseline_out = std::move(flags);
  return Status::success();
}

void SrcTracker::count_injections(std::uint64_t n) {
  std::lock_guard lock(mutex_);
  metrics_.injections += n;
}

SrcMetrics SrcTracker::metrics() const {
  std::lock_guard lock(mutex_);
  SrcMetrics m = metrics_;
  m.tracked_sequences = static_cast<std::int64_t>(states_.size());
  m.baseline_sequences = 0;
  for (const auto& [id, state] : states_) m.baseline_sequences += state.gate.baseline ? 1 : 0;
  return m;
}

Status SrcTracker::step(std::span<const SeqId> ids, ConstActivationView attn_out,
                        std::span<const std::int32_t> token_ids, std::span<const std::int32_t> indptr,
                        std::span<SrcDecision> decisions_out) {
  const std::size_t batch = ids.size();
  if (indptr.size() != batch + 1) {
    return invalid_argument("src_step: indptr has " + std::to_string(indptr.size()) + " entries, expected " +
                            std::to_string(batch + 1) + " (one more than the sequences)");
  }
  if (decisions_out.size() != batch) {
    return invalid_argument("src_step: decisions_out has " + std::to_string(decisions_out.size()) +
                            " entries, expected " + std::to_string(batch));
  }
  if (indptr[0] != 0) return invalid_argument("src_step: indptr[0] must be 0");
  for (std::size_t i = 0; i < batch; ++i) {
    if (indptr[i + 1] < indptr[i]) return invalid_argument("src_step: indptr decreases at " + std::to_string(i + 1));
  }
  {
    std::unordered_set<SeqId> seen;
    for (SeqId id : ids) {
      if (!seen.insert(id).second) {
        return invalid_argument("src_step: sequence " + std::to_string(id) + " appears twice in one step");
      }
    }
  }

  // ---- snapshot of the states we extend -----------------------------------
  std::shared_ptr<const SrcHead> head;
  std::vector<std::vector<double>> sums(batch);
  std::vector<std::int64_t> counts(batch);
  std::vector<std::uint64_t> versions(batch);
  {
    std::lock_guard lock(mutex_);
    if (!head_) return failed_precondition("src_step: no SRC head is installed");
    head = head_;
    for (std::size_t i = 0; i < batch; ++i) {
      const auto it = states_.find(ids[i]);
      if (it == states_.end()) return not_found("src_step: sequence " + std::to_string(ids[i]) + " is not running");
      sums[i] = it->second.sum;
      counts[i] = it->second.count;
      versions[i] = it->second.version;
    }
  }

  const int32_t hidden = head->hidden();
  const auto h = static_cast<std::size_t>(hidden);
  CLM_RETURN_IF_ERROR(check_activation_view(attn_out, hidden, "src_step: attn_out"));
  const auto total = static_cast<std::size_t>(attn_out.rows);
  if (token_ids.size() != total) {
    return invalid_argument("src_step: token_ids has " + std::to_string(token_ids.size()) + " entries, attn_out has " +
                            std::to_string(total) + " rows");
  }
  if (static_cast<std::size_t>(indptr[batch]) != total) {
    return invalid_argument("src_step: indptr ends at " + std::to_string(indptr[batch]) + ", attn_out has " +
                            std::to_string(total) + " rows");
  }

  // ---- extend the sums (outside the lock) ----------------------------------
  std::vector<float> row(h);
  for (std::size_t i = 0; i < batch; ++i) {
    if (sums[i].empty()) sums[i].assign(h, 0.0);
    for (auto t = static_cast<std::size_t>(indptr[i]); t < static_cast<std::size_t>(indptr[i + 1]); ++t) {
      attn_out.load_row(static_cast<std::int64_t>(t), row.data());
      for (std::size_t c = 0; c < h; ++c) {
        if (!std::isfinite(row[c])) {
          return invalid_argument("src_step: attn_out holds a NaN or Inf (row " + std::to_string(t) + ", channel " +
                                  std::to_string(c) + ")");
        }
      }
      if (std::binary_search(special_ids_.begin(), special_ids_.end(), token_ids[t])) continue;
      for (std::size_t c = 0; c < h; ++c) sums[i][c] += static_cast<double>(row[c]);
      ++counts[i];
    }
  }

  // ---- score the sequences that have something to average -------------------
  std::vector<std::size_t> scored;
  for (std::size_t i = 0; i < batch; ++i) {
    if (counts[i] > 0) scored.push_back(i);
  }
  std::vector<float> means(scored.size() * h);
  for (std::size_t k = 0; k < scored.size(); ++k) {
    const std::size_t i = scored[k];
    const double inv = 1.0 / static_cast<double>(counts[i]);
    for (std::size_t c = 0; c < h; ++c) means[k * h + c] = static_cast<float>(sums[i][c] * inv);
  }
  std::vector<float> scores(scored.size());
  CLM_RETURN_IF_ERROR(head->score_pooled(means, scores));

  // ---- commit all or nothing -------------------------------------------------
  std::lock_guard lock(mutex_);
  if (head_ != head) return failed_precondition("src_step: the SRC head was replaced during the step");
  std::vector<SequenceState*> states(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    const auto it = states_.find(ids[i]);
    if (it == states_.end())
      return not_found("src_step: sequence " + std::to_string(ids[i]) + " ended during the step");
    if (it->second.version != versions[i]) {
      return failed_precondition("src_step: sequence " + std::to_string(ids[i]) + " was stepped concurrently");
    }
    states[i] = &it->second;
  }
  std::size_t k = 0;
  for (std::size_t i = 0; i < batch; ++i) {
    SequenceState& state = *states[i];
    state.sum = std::move(sums[i]);
    state.count = counts[i];
    state.version = next_version_++;
    SrcDecision d;
    d.threshold = threshold_;
    if (k < scored.size() && scored[k] == i) {
      d.score = scores[k++];
      d.scored = 1;
      d.reuse = src_gate_decide(config_, threshold_, d.score, state.gate) ? 1 : 0;
      ++metrics_.steps;
      metrics_.reuse_decisions += d.reuse;
    } else {
      ++metrics_.unscored_steps;
    }
    d.baseline = state.gate.baseline ? 1 : 0;
    decisions_out[i] = d;
  }
  return Status::success();
}

Status SrcTracker::report_retrieval(std::span<const SeqId> ids, std::span<const std::uint8_t> found) {
  if (found.size() != ids.size()) {
    return invalid_argument("report_retrieval: " + std::to_string(ids.size()) + " sequences but " +
                            std::to_string(found.size()) + " outcomes");
  }
  {
    std::unordered_set<SeqId> seen;
    for (SeqId id : ids) {
      if (!seen.insert(id).second) {
        return invalid_argument("report_retrieval: sequence " + std::to_string(id) + " appears twice");
      }
    }
  }
  std::lock_guard lock(mutex_);
  std::vector<SequenceState*> states(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = states_.find(ids[i]);
    if (it == states_.end())
      return not_found("report_retrieval: sequence " + std::to_string(ids[i]) + " is not running");
    states[i] = &it->second;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const bool ok = found[i] != 0;
    ++(ok ? metrics_.retrievals_found : metrics_.retrievals_failed);
    if (src_gate_report(config_, ok, states[i]->gate)) ++metrics_.breaker_trips;
  }
  return Status::success();
}

}  // namespace clm
