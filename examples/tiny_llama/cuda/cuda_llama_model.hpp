// examples/tiny_llama/cuda/cuda_llama_model.hpp: the Llama decoder of
// llama_model.hpp on an NVIDIA GPU, over an engine whose pool is device
// memory (MemoryKind::device). Built when CMake found CUDA; make_decoder
// (decoder.hpp) picks it for a device pool.
//
//   clm::EngineConfig e;
//   e.pool = tiny_llama::kv_pool_for(config, 16, 65536, clm::KvDType::bf16);
//   e.pool.memory = clm::MemoryKind::device;
//   CLM_RETURN_IF_ERROR(clm::Engine::create(e, engine));
//   std::unique_ptr<tiny_llama::CudaLlamaModel> model;
//   CLM_RETURN_IF_ERROR(tiny_llama::CudaLlamaModel::create(config, std::move(weights), *engine, {}, model));
//   CLM_RETURN_IF_ERROR(model->forward(batch, host_logits));  // as LlamaModel::forward
//
// The weights are uploaded once (f32). A forward runs on the model's own
// stream: embedding gather, per layer RMSNorm, Q/K/V GEMMs, RoPE (the CPU
// model's cos/sin table, uploaded), K/V into the pool (clm::cuda::write_kv),
// attention (clm::cuda::paged_prefill_attention per prefilling sequence, one
// decode_plan per forward and decode_run per layer for the one-row
// sequences), o_proj, residual add, RMSNorm, gate/up GEMMs, SiLU(gate) * up,
// down GEMM, residual add; then the last rows, the final norm and lm_head.
// GEMMs are cuBLAS's in f32 without TF32 (CUBLAS_COMPUTE_32F, default math
// mode), and RMSNorm reduces each row in a fixed order, so a row's result
// depends on the batch around it only through cuBLAS's choice of algorithm
// for the batch's row count: reuse and recompute agree to f32 rounding.
// The logits come back to the host; forward() returns when they are there.
//
// Observers (CLM in the loop) are the slow path: with one installed, each
// hook copies its rows to the host and waits, and after_layer copies the
// residual stream back. Without one nothing leaves the device but the logits.
//
// The same checks as the CPU model run before anything is launched
// (check_decoder_setup, check_forward_batch). The CUDA attention supports
// head_dim 64 and 128: other head sizes are unsupported at create(). One
// model per host thread (it owns one stream, one cuBLAS handle, one
// clm::cuda::Workspace).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "decoder.hpp"

namespace tiny_llama {

class CudaLlamaModel final : public Decoder {
 public:
  // The engine's pool must have the model's layers, KV heads and head_dim and
  // live in device memory (MemoryKind::device; else unsupported), on the
  // device the model then runs on. options.threads is not used. The engine
  // must outlive the model.
  static clm::Status create(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                            const ModelOptions& options, std::unique_ptr<CudaLlamaModel>& out);
  ~CudaLlamaModel() override;
  CudaLlamaModel(const CudaLlamaModel&) = delete;
  CudaLlamaModel& operator=(const CudaLlamaModel&) = delete;

  const LlamaConfig& config() const override;
  clm::Engine& engine() const override;
  clm::Status forward(const ForwardBatch& batch, std::span<float> host_logits) override;
  void set_observer(LayerObserver* observer) override;

  // Device memory held: weights, scratch, cuBLAS workspace (not the KV pool).
  std::size_t device_bytes() const;

  struct Impl;

 private:
  explicit CudaLlamaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tiny_llama
