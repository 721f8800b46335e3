// clm/model/src_tracker.hpp: the SRC head run step by step over running sequences.
// Keeps each sequence's running sum of its non-special attention-output rows,
// so a decode step costs one row per sequence (not the whole history), scores
// the means with the SrcHead, and passes each score through the gate and
// breaker of src_gate.hpp. Engine owns one (Engine::src_step); hosts without
// an Engine may use it directly.
//
//   clm::SrcTracker tracker(config, {128009});       // <|eot_id|> is not averaged
//   tracker.set_head(head);                           // std::shared_ptr<const SrcHead>
//   tracker.add(seq);                                 // when the sequence starts
//   // each step: the new rows of a layer's attention output, CSR over `seqs`
//   std::vector<clm::SrcDecision> d(seqs.size());
//   CLM_RETURN_IF_ERROR(tracker.step(seqs, attn_out, token_ids, indptr, d));
//   // for each d[i].reuse: look up a snapshot, then
//   CLM_RETURN_IF_ERROR(tracker.report_retrieval(seqs, found));
//   tracker.remove(seq);                              // when it ends
//
// A step validates everything first (shapes, NaN/Inf, unknown or duplicate
// sequences, the head's arithmetic) and only then commits the new sums and
// gate states: a failed step changes nothing. Steps of different sequences may
// run concurrently; the heavy part (the head's GEMM) runs outside the lock.
// Two steps of the same sequence at once are refused (failed_precondition).
//
// On a GPU host, attn_out is in device memory: step_device keeps the sums
// there too (a DeviceSrcSums, e.g. clm::cuda::CudaSrcSums of cuda_clm.hpp),
// so that a step copies only the batch's scores to the host:
//
//   tracker.set_device_sums(sums);                    // once
//   CLM_RETURN_IF_ERROR(tracker.step_device(seqs, d_attn_out, d_token_ids, indptr, d, stream));
//
// A sequence's sum lives where its first scored step put it: on the host
// (step) or on the device (step_device); the other call refuses it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "clm/kernels/activations.hpp"
#include "clm/model/src_gate.hpp"
#include "clm/model/src_head.hpp"
#include "clm/status.hpp"

namespace clm {

namespace detail {
// Tests only: when set, called by SrcTracker::with_baseline_flags right after
// it has read the flags, before it acts on them (under the tracker's lock).
inline void (*inject_after_baseline_read)() = nullptr;
}  // namespace detail

// What one step says about one sequence.
struct SrcDecision {
  float score = 0.0f;         // SRC in [0, 1]; 0 when not scored
  float threshold = 0.0f;     // the threshold it was compared with
  std::uint8_t scored = 0;    // 0: no non-special position yet, nothing to average
  std::uint8_t reuse = 0;     // look up a snapshot and inject it
  std::uint8_t baseline = 0;  // the breaker has switched this sequence off
};

// The rows of a sequence's sum in a DeviceSrcSums: the committed one (read;
// -1 before its first row) and the one a step writes. A step that is not
// committed leaves the read row as it was.
struct SrcSumRows {
  std::int32_t read = -1;
  std::int32_t write = 0;
};

// Running sums kept in device memory, for SrcTracker::step_device (the
// interface lets the core library drive CUDA code it does not link).
class DeviceSrcSums {
 public:
  virtual ~DeviceSrcSums() = default;
  // For each sequence b of the batch (rows indptr[b] .. indptr[b+1]-1 of
  // attn_out and token_ids, both DEVICE memory; the rest host memory):
  //   sums[rows[b].write] = (rows[b].read < 0 ? 0 : sums[rows[b].read])
  //                         + the f64 sum of its rows whose id is not special,
  //   added_out[b] = how many rows that was, and, for every b with
  //   counts[b] + added_out[b] > 0, scores_out[b] = head.score_pooled(the mean).
  // special_ids: sorted and distinct (as the tracker keeps them).
  // Returns after the device is done. invalid_argument for bad shapes, host
  // memory where device memory is expected, or a NaN/Inf in any row.
  virtual Status step(const std::shared_ptr<const SrcHead>& head, std::span<const SrcSumRows> rows,
                      std::span<const std::int64_t> counts, const ConstActivationView& attn_out,
                      const std::int32_t* token_ids, std::span<const std::int32_t> indptr,
                      std::span<const std::int32_t> special_ids, std::span<std::int32_t> added_out,
                      std::span<float> scores_out, void* stream) = 0;
};

struct SrcMetrics {
  float threshold = 0.0f;               // the threshold in force
  std::uint64_t steps = 0;              // sequence-steps scored
  std::uint64_t unscored_steps = 0;     // sequence-steps with nothing to average yet
  std::uint64_t reuse_decisions = 0;    // steps that passed the gate
  std::uint64_t retrievals_found = 0;   // reported lookups that found a snapshot
  std::uint64_t retrievals_failed = 0;  // ... that found none
  std::uint64_t breaker_trips = 0;      // sequences switched to baseline, ever
  std::uint64_t injections = 0;         // sequence-layers that received a snapshot (Engine::inject_snapshots)
  std::int64_t baseline_sequences = 0;  // tracked sequences in baseline mode now
  std::int64_t tracked_sequences = 0;
};

class SrcTracker {
 public:
  using SeqId = std::uint64_t;

  // config must pass check_src_gate_config (Engine::create checks it).
  SrcTracker(SrcGateConfig config, std::vector<std::int32_t> special_ids);

  // Installs (or, with nullptr, removes) the head. A head of another hidden
  // size clears every sequence's running sum (their gate states stay).
  void set_head(std::shared_ptr<const SrcHead> head);
  std::shared_ptr<const SrcHead> head() const;

  // Installs (or, with nullptr, removes) the device sums of step_device.
  // Replacing them forgets every sum kept on the device (those sequences
  // start again from their next step).
  void set_device_sums(std::shared_ptr<DeviceSrcSums> sums);

  // Starts / ends tracking a sequence. add of a tracked id is a no-op.
  void add(SeqId id);
  void remove(SeqId id);

  // One step: attn_out [total_tokens][hidden] holds the new rows of every
  // sequence, ids[i] owning rows indptr[i] .. indptr[i+1]-1 (indptr has
  // ids.size() + 1 entries, starting at 0, ending at total_tokens; a sequence
  // may have 0 new rows). decisions_out: [ids.size()].
  // failed_precondition without a head; not_found for an untracked id;
  // invalid_argument for bad shapes, duplicate ids, NaN/Inf rows.
  Status step(std::span<const SeqId> ids, ConstActivationView attn_out, std::span<const std::int32_t> token_ids,
              std::span<const std::int32_t> indptr, std::span<SrcDecision> decisions_out);

  // step with attn_out and token_ids in device memory (token_ids: [attn_out.rows]
  // on the device; indptr and the decisions on the host), on `stream` (a
  // cudaStream_t; null: the default stream), through the device sums. Waits
  // for the device. Also failed_precondition without device sums, or for a
  // sequence whose sum is on the host. Device steps run one at a time.
  Status step_device(std::span<const SeqId> ids, ConstActivationView attn_out, const std::int32_t* token_ids,
                     std::span<const std::int32_t> indptr, std::span<SrcDecision> decisions_out, void* stream);

  // found[i] != 0: the lookup for ids[i] (after a step with reuse) found a
  // snapshot. Feeds the breaker. not_found for an untracked id; nothing
  // changes on error.
  Status report_retrieval(std::span<const SeqId> ids, std::span<const std::uint8_t> found);

  // The score of the sequence's last scored step (into `score`); false when
  // it is untracked or no step has scored it yet. (The CLM watch records it
  // with each snapshot lookup: engine/clm_watch.hpp.)
  bool last_score(SeqId id, float& score) const;
  // Whether the breaker has switched the sequence to baseline (false when untracked).
  bool in_baseline(SeqId id) const;
  // baseline_out[i] = in_baseline(ids[i]); not_found for an untracked id.
  Status baseline_flags(std::span<const SeqId> ids, std::vector<std::uint8_t>& baseline_out) const;
  // Counts snapshot injections into the metrics.
  void count_injections(std::uint64_t n);
  // Runs act(baseline) with baseline[i] = in_baseline(ids[i]) under the
  // tracker's lock, so that no breaker trip lands between reading the flags
  // and acting on them (Engine::inject_snapshots). act returns a Status and
  // sets its std::uint64_t& argument to the injections to count (counted
  // only on success); it must not call back into the tracker.
  template <class Act>
  Status with_baseline_flags(std::span<const SeqId> ids, Act&& act) {
    std::vector<std::uint8_t> flags(ids.size());
    std::lock_guard lock(mutex_);
    CLM_RETURN_IF_ERROR(baseline_flags_locked(ids, flags));
    if (detail::inject_after_baseline_read) detail::inject_after_baseline_read();
    std::uint64_t injections = 0;
    Status done = act(std::span<const std::uint8_t>(flags), injections);
    if (done.ok()) metrics_.injections += injections;
    return done;
  }

  SrcMetrics metrics() const;
  const SrcGateConfig& config() const { return config_; }

 private:
  // flags[i] = the baseline flag of ids[i]; mutex_ held.
  Status baseline_flags_locked(std::span<const SeqId> ids, std::span<std::uint8_t> flags) const {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto it = states_.find(ids[i]);
      if (it == states_.end()) return not_found("sequence " + std::to_string(ids[i]) + " is not running");
      flags[i] = it->second.gate.baseline ? 1 : 0;
    }
    return Status::success();
  }

  enum class SumsOn : std::uint8_t { none, host, device };
  struct SequenceState {
    std::vector<double> sum;  // [hidden] over non-special rows so far; empty until the first step
    std::int64_t count = 0;
    std::uint64_t version = 0;  // from next_version_, renewed by each commit: detects concurrent steps
    SrcGateState gate;
    float last_score = 0.0f;  // of the last scored step
    bool has_score = false;
    SumsOn sums_on = SumsOn::none;  // where the running sum lives (count > 0)
    std::int32_t slot = -1;         // device: rows 2 * slot and 2 * slot + 1 of the device sums
    std::uint8_t parity = 0;        // device: which of the two rows is committed
  };

  // The shape checks both steps make before looking at any state.
  static Status check_step_call(std::span<const SeqId> ids, std::span<const std::int32_t> indptr,
                                std::span<SrcDecision> decisions_out, const char* what);
  // Counts a scored (or unscored) sequence-step and passes the score through
  // the gate; mutex_ held.
  SrcDecision decide_locked(SequenceState& state, bool scored, float score);

  const SrcGateConfig config_;
  const float threshold_;
  const std::vector<std::int32_t> special_ids_;  // sorted, unique

  mutable std::mutex mutex_;
  std::shared_ptr<const SrcHead> head_;
  std::unordered_map<SeqId, SequenceState> states_;
  std::shared_ptr<DeviceSrcSums> device_sums_;
  std::vector<std::int32_t> free_slots_;  // device slots of removed sequences
  std::int32_t next_slot_ = 0;
  std::mutex device_step_mutex_;  // taken before mutex_: device steps one at a time
  // Tracker-wide, so an id removed and added again never matches a version a
  // step in flight saw before.
  std::uint64_t next_version_ = 1;
  SrcMetrics metrics_;
};

}  // namespace clm
