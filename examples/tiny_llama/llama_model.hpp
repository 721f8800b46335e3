// examples/tiny_llama/llama_model.hpp: a Llama-architecture decoder whose KV
// lives in a clm::Engine's paged pool: RMSNorm, RoPE (Hugging Face's
// rotate-half), grouped-query attention through the library's own paged
// kernels (clm/attention.hpp), SwiGLU MLP, lm_head. CPU, f32 activations.
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
#include <memory>
#include <span>
#include <vector>

#include "clm/engine.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "parallel_for.hpp"

namespace tiny_llama {

struct ForwardBatch {
  std::vector<clm::SequenceId> ids;
  std::vector<std::int32_t> indptr{0};       // [B + 1] row offsets
  std::vector<std::int32_t> tokens;          // [rows]
  std::vector<std::int32_t> first_position;  // [B]
  std::vector<std::int64_t> slots;           // [rows]
  std::vector<std::int32_t> page_indptr{0};  // [B + 1]: sequence i's pages are
  std::vector<std::int32_t> page_indices;    // page_indices[page_indptr[i] .. page_indptr[i+1])

  std::size_t size() const { return ids.size(); }
  std::int32_t rows() const { return indptr.back(); }
  // Appends sequence `id` with new tokens at [first, first + tokens.size()).
  void add(clm::SequenceId id, std::span<const std::int32_t> new_tokens, std::int32_t first,
           std::span<const std::int64_t> new_slots, std::span<const std::int32_t> page_table);
};

// Hooks into the forward pass. Rows are those of the batch (sequence i owns
// indptr[i] .. indptr[i+1]-1); returning an error stops the forward.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // The attention block's output (after o_proj) of `layer`, [rows][hidden].
  virtual clm::Status on_attention_output(std::int32_t layer, const ForwardBatch& batch, const float* rows) = 0;
  // The residual stream after `layer`, [rows][hidden]; may be changed in place.
  virtual clm::Status after_layer(std::int32_t layer, const ForwardBatch& batch, float* hidden) = 0;
  // The final hidden state (after the final norm) of each sequence's last row, [B][hidden].
  virtual clm::Status on_final_hidden(const ForwardBatch& batch, const float* last_rows) = 0;
};

// A KV pool laid out for `config` (its layers, KV heads and head_dim), of
// `tokens` rounded up to whole pages, on the host.
inline clm::PagedKvPoolConfig kv_pool_for(const LlamaConfig& config, std::int32_t page_size, std::int64_t tokens,
                                          clm::KvDType dtype) {
  clm::PagedKvPoolConfig pool;
  pool.page_size = page_size;
  pool.num_pages = static_cast<std::int32_t>((tokens + page_size - 1) / std::max(1, page_size));
  pool.num_layers = config.num_layers;
  pool.kv_heads = config.num_kv_heads;
  pool.head_dim = config.head_dim;
  pool.dtype = dtype;
  return pool;
}

struct ModelOptions {
  int threads = 0;  // GEMM and attention threads; 0 = the hardware's
};

class LlamaModel {
 public:
  // The engine's pool must have the model's layers, KV heads and head_dim, and
  // hold f32, f16 or bf16 KV on the host. The engine must outlive the model.
  static clm::Status create(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                            const ModelOptions& options, std::unique_ptr<LlamaModel>& out);

  const LlamaConfig& config() const { return config_; }
  clm::Engine& engine() const { return engine_; }

  // Runs the batch; logits [B][vocab] of each sequence's last row. Checks
  // every shape, position and token first: on such an error nothing is
  // written. An observer's error stops the pass with the new rows' K/V
  // partly written (they are the sequences' own slots: rerun or abort them).
  clm::Status forward(const ForwardBatch& batch, std::span<float> logits);

  // Installs hooks (nullptr removes them); the observer must outlive its use.
  void set_observer(LayerObserver* observer) { observer_ = observer; }

 private:
  LlamaModel(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine, const ModelOptions& options);
  clm::Status check(const ForwardBatch& batch, std::span<float> logits) const;
  // c [m][n] = a [m][k] * w [n][k]^T, split between the pool's threads.
  void matmul(const float* a, std::int64_t m, std::int64_t k, const std::vector<float>& w, std::int64_t n, float* c);
  void rms_norm(const float* x, std::int64_t rows, const std::vector<float>& weight, float* out) const;
  void rope(float* x, std::int64_t rows, std::int32_t heads, std::span<const std::int32_t> positions) const;
  clm::Status attention(std::int32_t layer, const ForwardBatch& batch, const float* q, float* out);

  LlamaConfig config_;
  LlamaWeights weights_;
  clm::Engine& engine_;
  int threads_;
  WorkerPool workers_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_position][head_dim / 2]
  LayerObserver* observer_ = nullptr;
  // Scratch, reused across calls.
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_, last_, panel_;
  std::vector<std::int32_t> positions_;
};

}  // namespace tiny_llama
