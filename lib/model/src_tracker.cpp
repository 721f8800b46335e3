// SrcTracker (include/clm/model/src_tracker.hpp): running sums per sequence, the
// head on their means, and the gate; validate, compute outside the lock, then
// commit all or nothing. step keeps the sums on the host, step_device in a
// DeviceSrcSums (two rows per sequence, so that committing is a flip).
#include "clm/model/src_tracker.hpp"

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
      state.sums_on = SumsOn::none;
      state.version = next_version_++;
    }
  }
}

void SrcTracker::set_device_sums(std::shared_ptr<DeviceSrcSums> sums) {
  std::lock_guard device_lock(device_step_mutex_);
  std::lock_guard lock(mutex_);
  device_sums_ = std::move(sums);
  for (auto& [id, state] : states_) {
    if (state.sums_on != SumsOn::device) continue;
    state.count = 0;
    state.sums_on = SumsOn::none;
    state.version = next_version_++;
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
  const auto it = states_.find(id);
  if (it == states_.end()) return;
  if (it->second.slot >= 0) free_slots_.push_back(it->second.slot);
  states_.erase(it);
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

Status SrcTracker::check_step_call(std::span<const SeqId> ids, std::span<const std::int32_t> indptr,
                                   std::span<SrcDecision> decisions_out, const char* what) {
  const std::string fn = what;
  const std::size_t batch = ids.size();
  if (indptr.size() != batch + 1) {
    return invalid_argument(fn + ": indptr has " + std::to_string(indptr.size()) + " entries, expected " +
                            std::to_string(batch + 1) + " (one more than the sequences)");
  }
  if (decisions_out.size() != batch) {
    return invalid_argument(fn + ": decisions_out has " + std::to_string(decisions_out.size()) + " entries, expected " +
                            std::to_string(batch));
  }
  if (indptr[0] != 0) return invalid_argument(fn + ": indptr[0] must be 0");
  for (std::size_t i = 0; i < batch; ++i) {
    if (indptr[i + 1] < indptr[i]) return invalid_argument(fn + ": indptr decreases at " + std::to_string(i + 1));
  }
  std::unordered_set<SeqId> seen;
  for (SeqId id : ids) {
    if (!seen.insert(id).second) {
      return invalid_argument(fn + ": sequence " + std::to_string(id) + " appears twice in one step");
    }
  }
  return Status::success();
}

bool SrcTracker::last_score(SeqId id, float& score) const {
  std::lock_guard lock(mutex_);
  const auto it = states_.find(id);
  if (it == states_.end() || !it->second.has_score) return false;
  score = it->second.last_score;
  return true;
}

SrcDecision SrcTracker::decide_locked(SequenceState& state, bool scored, float score) {
  SrcDecision d;
  d.threshold = threshold_;
  if (scored) {
    d.score = score;
    d.scored = 1;
    state.last_score = score;
    state.has_score = true;
    d.reuse = src_gate_decide(config_, threshold_, d.score, state.gate) ? 1 : 0;
    ++metrics_.steps;
    metrics_.reuse_decisions += d.reuse;
  } else {
    ++metrics_.unscored_steps;
  }
  d.baseline = state.gate.baseline ? 1 : 0;
  return d;
}

Status SrcTracker::step(std::span<const SeqId> ids, ConstActivationView attn_out,
                        std::span<const std::int32_t> token_ids, std::span<const std::int32_t> indptr,
                        std::span<SrcDecision> decisions_out) {
  const std::size_t batch = ids.size();
  CLM_RETURN_IF_ERROR(check_step_call(ids, indptr, decisions_out, "src_step"));

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
      if (it->second.sums_on == SumsOn::device) {
        return failed_precondition("src_step: sequence " + std::to_string(ids[i]) +
                                   " keeps its running sum on the device (step it with step_device)");
      }
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
    if (state.count > 0) state.sums_on = SumsOn::host;
    state.version = next_version_++;
    const bool is_scored = k < scored.size() && scored[k] == i;
    decisions_out[i] = decide_locked(state, is_scored, is_scored ? scores[k++] : 0.0f);
  }
  return Status::success();
}

Status SrcTracker::step_device(std::span<const SeqId> ids, ConstActivationView attn_out, const std::int32_t* token_ids,
                               std::span<const std::int32_t> indptr, std::span<SrcDecision> decisions_out,
                               void* stream) {
  const std::size_t batch = ids.size();
  CLM_RETURN_IF_ERROR(check_step_call(ids, indptr, decisions_out, "src_step_device"));
  // One device step at a time: the device rows a step writes are its own
  // until it commits or fails.
  std::lock_guard device_lock(device_step_mutex_);

  // ---- snapshot: the head, the device, each sequence's rows and count ---------
  std::shared_ptr<const SrcHead> head;
  std::shared_ptr<DeviceSrcSums> device;
  std::vector<SrcSumRows> rows(batch);
  std::vector<std::int64_t> counts(batch);
  std::vector<std::uint64_t> versions(batch);
  {
    std::lock_guard lock(mutex_);
    if (!device_sums_) {
      return failed_precondition(
          "src_step_device: no device for the SRC running sums (set_device_sums; a C host gets one with a pool in "
          "device memory)");
    }
    if (!head_) return failed_precondition("src_step_device: no SRC head is installed");
    head = head_;
    device = device_sums_;
    std::vector<SequenceState*> states(batch);
    for (std::size_t i = 0; i < batch; ++i) {
      const auto it = states_.find(ids[i]);
      if (it == states_.end()) {
        return not_found("src_step_device: sequence " + std::to_string(ids[i]) + " is not running");
      }
      if (it->second.sums_on == SumsOn::host) {
        return failed_precondition("src_step_device: sequence " + std::to_string(ids[i]) +
                                   " keeps its running sum on the host (step it with step)");
      }
      states[i] = &it->second;
    }
    // Every sequence checked: only now are slots handed out.
    for (std::size_t i = 0; i < batch; ++i) {
      SequenceState& state = *states[i];
      if (state.slot < 0) {  // a slot for life: kept even when this step fails
        if (free_slots_.empty()) {
          state.slot = next_slot_++;
        } else {
          state.slot = free_slots_.back();
          free_slots_.pop_back();
        }
      }
      const std::int32_t base = 2 * state.slot;
      rows[i] = {state.count > 0 ? base + state.parity : -1, base + (1 - state.parity)};
      counts[i] = state.count;
      versions[i] = state.version;
    }
  }
  if (attn_out.cols != head->hidden()) {
    return invalid_argument("src_step_device: attn_out has " + std::to_string(attn_out.cols) +
                            " columns, the SRC head " + std::to_string(head->hidden()));
  }

  // ---- the device: new sums into the write rows, scores of the means ----------
  std::vector<std::int32_t> added(batch);
  std::vector<float> scores(batch);
  CLM_RETURN_IF_ERROR(
      device->step(head, rows, counts, attn_out, token_ids, indptr, special_ids_, added, scores, stream));

  // ---- commit all or nothing: flip each sequence to the row just written -------
  std::lock_guard lock(mutex_);
  if (head_ != head) return failed_precondition("src_step_device: the SRC head was replaced during the step");
  std::vector<SequenceState*> states(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    const auto it = states_.find(ids[i]);
    if (it == states_.end()) {
      return not_found("src_step_device: sequence " + std::to_string(ids[i]) + " ended during the step");
    }
    if (it->second.version != versions[i]) {
      return failed_precondition("src_step_device: sequence " + std::to_string(ids[i]) + " was stepped concurrently");
    }
    states[i] = &it->second;
  }
  for (std::size_t i = 0; i < batch; ++i) {
    SequenceState& state = *states[i];
    state.count += added[i];
    if (state.count > 0) {
      state.sums_on = SumsOn::device;
      state.parity = static_cast<std::uint8_t>(1 - state.parity);
    }
    state.version = next_version_++;
    decisions_out[i] = decide_locked(state, state.count > 0, scores[i]);
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
