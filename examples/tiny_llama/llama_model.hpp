// examples/tiny_llama/llama_model.hpp: a Llama-architecture decoder whose KV
// lives in a clm::Engine's paged pool: RMSNorm, RoPE (Hugging Face's
// rotate-half), grouped-query attention through the library's own paged
// kernels (clm/kernels/attention.hpp), SwiGLU MLP, lm_head. CPU, f32 activations.
//
//   std::unique_ptr<tiny_llama::LlamaModel> model;
//   CLM_RETURN_IF_ERROR(tiny_llama::LlamaModel::create(config, std::move(weights), *engine, {}, model));
//   clm::Admission a;
//   CLM_RETURN_IF_ERROR(engine->admit(prompt, {}, a));
//   // the uncached part of the prompt, one sequence (a ragged batch of one)
//   tiny_llama::ForwardBatch batch;
//   batch.add(a.seq, std::span(prompt).subspan(a.cached_tokens), a.cached_tokens, a.slots, a.page_table);
//   std::vector<float> logits(config.vocab_size);
//   CLM_RETURN_IF_ERROR(model->forward(batch, logits));  // logits of the last prompt token
//
// One forward() runs a ragged batch: sequence i brings rows indptr[i] ..
// indptr[i+1]-1 (new tokens at positions first_position[i] ...), whose K/V
// go to `slots`, and whose page tables (covering first_position + rows
// tokens) are page_indptr / page_indices, FlashInfer's CSR form.
// Sequences with one new row (decode) share one paged_decode_attention call;
// the others run paged_prefill_attention each. Logits come out for the last
// row of each sequence. Sequences may join and leave between calls:
// continuous batching is the caller's scheduling (see generator.hpp).
//
// A LayerObserver sees each layer's attention output and may change the
// hidden states after each layer (the CLM hooks: SRC head, snapshot injection).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "clm/engine.hpp"
#include "clm/kernels/dense_gemm.hpp"
#include "decoder.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "parallel_for.hpp"

namespace tiny_llama {

// Seconds the forward passes spent in each part, summed since creation or the
// last reset (wall clock of the calling thread, which waits for the workers),
// apart for forwards with a prefill row (a sequence bringing more than one
// token) and forwards of decode rows only.
struct ForwardSeconds {
  double gemm = 0;       // the projections, the MLP and lm_head (clm::gemm_nt)
  double attention = 0;  // write_kv and the paged attention kernels
  double other = 0;      // norms, RoPE, activations, residual adds, embedding
  std::int64_t forwards = 0;
  std::int64_t rows = 0;
  double total() const { return gemm + attention + other; }
};
struct ForwardProfile {
  ForwardSeconds prefill, decode;
};

class LlamaModel final : public Decoder {
 public:
  // The engine's pool must have the model's layers, KV heads and head_dim, and
  // hold f32, f16 or bf16 KV on the host. The engine must outlive the model.
  static clm::Status create(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                            const ModelOptions& options, std::unique_ptr<LlamaModel>& out);

  const LlamaConfig& config() const override { return config_; }
  clm::Engine& engine() const override { return engine_; }

  // Runs the batch; logits [B][vocab] of each sequence's last row. Checks
  // every shape, position and token first: on such an error nothing is
  // written. An observer's error stops the pass with the new rows' K/V
  // partly written (they are the sequences' own slots: rerun or abort them).
  clm::Status forward(const ForwardBatch& batch, std::span<float> logits) override;

  // Installs hooks (nullptr removes them); the observer must outlive its use.
  void set_observer(LayerObserver* observer) override { observer_ = observer; }

  const ForwardProfile& profile() const { return profile_; }
  void reset_profile() { profile_ = {}; }

 private:
  LlamaModel(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine, const ModelOptions& options);
  // c [m][n] = a [m][k] * w [n][k]^T, split between the pool's threads.
  void matmul(const float* a, std::int64_t m, const clm::PackedWeight& w, float* c);
  // Runs body(begin, end) over row ranges covering [0, rows): split between
  // the pool's threads when there are enough rows to pay for waking them.
  void for_rows(std::int64_t rows, const std::function<void(std::int64_t, std::int64_t)>& body);
  // Grows the scratch to hold `rows` rows; it never shrinks, so a long
  // prompt after many decode steps does not clear its buffers again.
  void reserve_rows(std::int64_t rows);
  void rms_norm(const float* x, std::int64_t begin, std::int64_t end, const std::vector<float>& weight,
                float* out) const;
  void rope_row(float* x, std::int32_t heads, std::int32_t position) const;
  clm::Status attention(std::int32_t layer, const ForwardBatch& batch, const float* q, float* out);

  LlamaConfig config_;
  LlamaWeights weights_;
  clm::Engine& engine_;
  int threads_;
  WorkerPool workers_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_position][head_dim / 2]
  struct LayerWeights {
    clm::PackedWeight qkv;      // q_proj, k_proj, v_proj stacked: [q_dim + 2 kv_dim][hidden]
    clm::PackedWeight o;        // o_proj [hidden][q_dim]
    clm::PackedWeight gate_up;  // gate_proj, up_proj stacked: [2 intermediate][hidden]
    clm::PackedWeight down;     // down_proj [hidden][intermediate]
  };
  std::vector<LayerWeights> packed_;
  clm::PackedWeight lm_head_;
  LayerObserver* observer_ = nullptr;
  ForwardProfile profile_;
  double gemm_seconds_ = 0;  // of the forward in progress
  // Scratch, reused across calls (reserve_rows).
  std::int64_t reserved_rows_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, wide_, last_;
  std::vector<std::int32_t> positions_;
};

}  // namespace tiny_llama
