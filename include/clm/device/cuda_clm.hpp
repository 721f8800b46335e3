// clm/device/cuda_clm.hpp: the CLM model side on an NVIDIA GPU (library clmcache_cuda,
// built from cuda/ when nvcc is found; sm_80 and sm_90): the SRC head
// (clm/model/src_head.hpp) and the snapshot adapter's injection
// (clm/model/snapshot_adapter.hpp), over cuBLAS plus small fused kernels.
// A plain C++ header (no CUDA headers): streams are void* (a cudaStream_t; null
// is the default stream), device buffers are plain pointers, activations are
// clm::ActivationView / ConstActivationView whose `data` is a DEVICE pointer.
//
//   std::unique_ptr<clm::cuda::DeviceSrcHead> head;
//   CLM_RETURN_IF_ERROR(clm::cuda::DeviceSrcHead::create(/*device=*/0, weights, clm::Gelu::tanh, head));
//   clm::ConstActivationView attn{d_attn_out, clm::ActDType::bf16, total_tokens, hidden};
//   // device pipeline, no host wait: scores land in d_scores [batch] (device)
//   CLM_RETURN_IF_ERROR(head->score_async(attn, d_token_ids, indptr, special_ids, d_scores, stream));
//   CLM_RETURN_IF_ERROR(head->check(stream));  // waits; NaN/Inf, all-special -> invalid_argument
//   // or in one synchronous call, scores into host memory:
//   CLM_RETURN_IF_ERROR(head->score(attn, d_token_ids, indptr, special_ids, host_scores, stream));
//
//   std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
//   CLM_RETURN_IF_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, adapter_weights, adapter_config, adapter));
//   CLM_RETURN_IF_ERROR(adapter->prepare(d_snapshots, batch, stream));   // once per step: the deltas
//   for (int layer = 0; layer < L; ++layer) {
//     ...
//     clm::ActivationView hs{d_hidden, clm::ActDType::bf16, total_tokens, hidden};
//     CLM_RETURN_IF_ERROR(adapter->apply(hs, indptr, apply_mask, layer, stream));  // no-op at other layers
//   }
//   CLM_RETURN_IF_ERROR(adapter->check(stream));  // waits; a NaN/Inf delta -> invalid_argument, nothing added
//
// Semantics are the CPU ones (src_head.hpp, snapshot_adapter.hpp); the
// differences, all because the data is on the device, are listed below and in
// docs/cuda.md.
//
// Validation. Every call first checks on the host: shapes and dtypes, indptr
// (starts at 0, never decreases, ends at the view's rows), sizes of the
// host arrays, that device buffers are device memory of the object's device
// (cudaPointerGetAttributes of their first and last byte), and launches
// nothing when a check fails (invalid_argument, or failed_precondition for a
// call out of order). What only the device can see (NaN/Inf in attn_out, a
// sequence whose tokens are all special, a non-finite logit; a NaN/Inf
// adapter delta) is flagged by the kernels in a device status record that the
// host reads back: check() (or the synchronous score()) turns it into
// invalid_argument. CUDA and cuBLAS errors
// become a Status with the library's error text (out_of_memory for allocation
// failures, unsupported without a usable device, internal otherwise). No call
// throws.
//
// Threads and streams. An object is not thread-safe: use one per host thread
// (or serialise). Calls may use different streams: each call waits (on the
// device) for the object's previous call, so they execute in call order.
// Device buffers passed to a call must stay valid until it completes on the
// device; host arrays (indptr, special ids, masks) may be reused as soon as it
// returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "clm/kernels/activations.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/src_head.hpp"
#include "clm/model/src_tracker.hpp"
#include "clm/status.hpp"

namespace clm::cuda {

// ---- SRC head ---------------------------------------------------------------------
// The weights live on the device (uploaded once by create, f32); the object
// owns a cuBLAS handle, its workspace and the scratch of the calls (means,
// GEMM output, logits), which grows on demand and never shrinks.
//
// Per sequence b (tokens indptr[b] .. indptr[b+1]-1 of attn_out):
//   h = mean of attn_out rows whose token id is not special   (masked-mean kernel, f32 sums)
//   Z = H W1^T                                                 (cuBLAS GEMM, f32 compute, no TF32)
//   score = sigmoid(w2 . GELU(Z_b + b1) + b2)                  (one fused kernel)
class DeviceSrcHead {
 public:
  // Validates the weights as SrcHead::create does (invalid_argument before any
  // device work), then uploads them. unsupported without a usable device.
  static Status create(int device, const SrcHeadWeights& weights, Gelu gelu, std::unique_ptr<DeviceSrcHead>& out);
  // The weights of a CPU head (already validated).
  static Status create(int device, const SrcHead& head, std::unique_ptr<DeviceSrcHead>& out);
  ~DeviceSrcHead();
  DeviceSrcHead(const DeviceSrcHead&) = delete;
  DeviceSrcHead& operator=(const DeviceSrcHead&) = delete;

  // Enqueues the head on `stream`; returns without waiting for the device.
  //   attn_out:    device, [total_tokens][hidden], f32 / f16 / bf16
  //   token_ids:   device, [total_tokens] int32 (may be null when total_tokens == 0)
  //   indptr:      HOST, [batch + 1]: indptr[0] == 0, non-decreasing, ends at total_tokens;
  //                every sequence has at least one token
  //   special_ids: HOST, any order, duplicates allowed: token ids left out of the mean
  //   scores:      device, [batch] f32. Written only when every sequence of the call is
  //                valid; on a data error it is left untouched (a score is never NaN).
  // Data errors (NaN/Inf anywhere in attn_out, special positions included; a
  // sequence whose tokens are all special; a non-finite logit) are recorded
  // on the device and reported by the next check(). batch == 0 does nothing.
  Status score_async(const ConstActivationView& attn_out, const std::int32_t* token_ids,
                     std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids, float* scores,
                     void* stream);

  // Waits for `stream` and reports the data errors of every score_async since
  // the previous check() (or score()): invalid_argument naming the first
  // failing call's first bad token / sequence. Resets the record.
  Status check(void* stream);

  // The head on means already pooled (SrcHead::score_pooled on the device):
  //   means:  device, [batch][hidden] f32
  //   scores: device, [batch] f32, written only when every logit is finite
  // A non-finite logit is recorded on the device and reported by the next
  // check(), like score_async's data errors. batch == 0 does nothing.
  Status score_pooled_async(const float* means, std::int32_t batch, float* scores, void* stream);

  // Synchronous: score_async into the head's own buffer, then the verdict and
  // the scores are read back together (one wait). scores_out: HOST, [batch];
  // left untouched on any error. Also reports unchecked errors of earlier
  // score_async calls.
  Status score(const ConstActivationView& attn_out, const std::int32_t* token_ids, std::span<const std::int32_t> indptr,
               std::span<const std::int32_t> special_ids, std::span<float> scores_out, void* stream);

  std::int32_t hidden() const;
  std::int32_t inner() const;  // hidden / 4
  Gelu gelu() const;
  int device() const;
  std::size_t device_bytes() const;  // device memory held (weights, cuBLAS workspace, scratch)

  struct Impl;

 private:
  friend class CudaSrcSums;  // runs its running sums in the head's call order and scratch
  explicit DeviceSrcHead(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- the SRC running sums of SrcTracker::step_device --------------------------------
// The device half of src_tracker.hpp's running mean for GPU hosts: each
// running sequence's sum of attention-output rows stays in device memory (f64,
// two rows per sequence: the committed one and the one the next step writes),
// so a decode step moves only the batch's scores to the host, never attn_out.
// The means equal the CPU tracker's bit for bit (same f64 sums in the same
// order); the head's GEMM is cuBLAS f32 (no TF32), so scores agree with the CPU
// head to rounding. An Engine uses it for SrcTracker::step_device; a C host
// gets one for every engine whose pool is in device memory.
//
//   std::shared_ptr<clm::cuda::CudaSrcSums> sums;
//   CLM_RETURN_IF_ERROR(clm::cuda::CudaSrcSums::create(/*device=*/0, sums));
//   engine.set_device_src_sums(sums);
//   CLM_RETURN_IF_ERROR(engine.src_step_device(ids, attn, d_token_ids, indptr, decisions, stream));
//
// The head's weights are uploaded at the first step that sees a head (and
// again when the tracker's head is replaced). Not thread-safe: the tracker
// serialises its device steps.
class CudaSrcSums final : public DeviceSrcSums {
 public:
  // unsupported without a usable device `device`. Allocates nothing on it yet.
  static Status create(int device, std::shared_ptr<CudaSrcSums>& out);
  ~CudaSrcSums() override;
  CudaSrcSums(const CudaSrcSums&) = delete;
  CudaSrcSums& operator=(const CudaSrcSums&) = delete;

  // DeviceSrcSums::step (src_tracker.hpp): attn_out and token_ids are device
  // memory of this object's device, the other arrays host memory. Waits for
  // `stream`. On any error nothing committed changes (only rows[i].write).
  Status step(const std::shared_ptr<const SrcHead>& head, std::span<const SrcSumRows> rows,
              std::span<const std::int64_t> counts, const ConstActivationView& attn_out, const std::int32_t* token_ids,
              std::span<const std::int32_t> indptr, std::span<const std::int32_t> special_ids,
              std::span<std::int32_t> added_out, std::span<float> scores_out, void* stream) override;

  int device() const;
  std::size_t device_bytes() const;  // the sums, the head's weights and scratch

  struct Impl;

 private:
  explicit CudaSrcSums(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- snapshot adapter --------------------------------------------------------------
// delta_b = residual_scale * (W s_b + b) for each sequence's snapshot s_b
// (cuBLAS GEMM over the batch, f32), added to every row of that sequence's
// hidden states at the layers the config allows (one fused kernel per layer,
// rounding to the activations' dtype). The deltas do not depend on the layer:
// prepare() computes them once per step, apply() adds them at each layer.
class DeviceSnapshotAdapter {
 public:
  // Validates weights (snapshot_dim, hidden > 0, sizes, finite) and config
  // (num_layers > 0, layers in range and listed once; empty = the last 3,
  // clamped; finite residual_scale) as SnapshotAdapter::create does, then
  // uploads the weights. unsupported without a device.
  static Status create(int device, const SnapshotAdapterWeights& weights, const SnapshotAdapterConfig& config,
                       std::unique_ptr<DeviceSnapshotAdapter>& out);
  // The weights and config of a CPU adapter (already validated).
  static Status create(int device, const SnapshotAdapter& adapter, std::unique_ptr<DeviceSnapshotAdapter>& out);
  ~DeviceSnapshotAdapter();
  DeviceSnapshotAdapter(const DeviceSnapshotAdapter&) = delete;
  DeviceSnapshotAdapter& operator=(const DeviceSnapshotAdapter&) = delete;

  // The layers that inject (sorted, distinct), and whether `layer` is one.
  const std::vector<std::int32_t>& layers() const;
  bool injects_at(std::int32_t layer) const;

  // Computes the deltas of `batch` snapshots (device, [batch][snapshot_dim]
  // f32) into the adapter's buffer, for the apply() calls that follow (until
  // the next prepare), and checks them on the device: when any delta holds a
  // NaN/Inf (a NaN/Inf snapshot, or W s overflowing f32) the applies of this
  // prepare add nothing at all, and check() says which sequence. Unlike
  // inject_batch on the CPU, the snapshots of masked-out sequences are read
  // and checked too (prepare does not know the mask): give them finite values
  // (zeros).
  Status prepare(const float* snapshots, std::int32_t batch, void* stream);

  // Waits for `stream` and reports the last prepare's device check:
  // invalid_argument (naming the first bad sequence) when its deltas were
  // refused, so that the applies since added nothing; failed_precondition
  // without a successful prepare.
  Status check(void* stream);

  // hidden_states (device, [total_tokens][hidden]): adds delta_b to rows
  // [indptr[b], indptr[b+1]) of every sequence b with apply_mask[b] != 0
  // (empty mask: all), when `layer` injects; at other layers (and for an
  // all-zero mask) it validates and returns without launching. indptr (HOST,
  // [batch + 1]) must describe the batch of the last prepare()
  // (failed_precondition without one); layer in [0, num_layers).
  Status apply(const ActivationView& hidden_states, std::span<const std::int32_t> indptr,
               std::span<const std::uint8_t> apply_mask, std::int32_t layer, void* stream);

  // prepare + apply in one call (prepare is skipped at layers that do not inject;
  // check() tells whether the deltas were refused).
  Status inject(const ActivationView& hidden_states, std::span<const std::int32_t> indptr, const float* snapshots,
                std::span<const std::uint8_t> apply_mask, std::int32_t layer, void* stream);

  std::int32_t hidden() const;
  std::int32_t snapshot_dim() const;
  std::int32_t num_layers() const;
  float residual_scale() const;
  int device() const;
  std::size_t device_bytes() const;

  struct Impl;

 private:
  explicit DeviceSnapshotAdapter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace clm::cuda
