// examples/tiny_llama/decoder.hpp: what the generator, CLM in the loop and the
// hosts see of a Llama decoder over a clm::Engine, whichever processor runs
// it: the batch it takes (ForwardBatch), the hooks it calls (LayerObserver),
// the interface (Decoder), the validation every implementation shares, and
// make_decoder, which picks the implementation by where the engine's pool
// lives: host memory -> LlamaModel (CPU, llama_model.hpp); device memory ->
// CudaLlamaModel (cuda/cuda_llama_model.hpp, built when CMake found CUDA).
//
//   clm::EngineConfig e;
//   e.pool = tiny_llama::kv_pool_for(config, 16, 65536, clm::KvDType::f32);
//   e.pool.memory = clm::MemoryKind::device;  // the GPU decoder; host (the default): the CPU one
//   CLM_RETURN_IF_ERROR(clm::Engine::create(e, engine));
//   std::unique_ptr<tiny_llama::Decoder> decoder;
//   CLM_RETURN_IF_ERROR(tiny_llama::make_decoder(config, std::move(weights), *engine, {}, decoder));
//   tiny_llama::Generator generator(*decoder, {});
//
// One forward() runs a ragged batch: sequence i brings rows indptr[i] ..
// indptr[i+1]-1 (new tokens at positions first_position[i] ...), whose K/V
// go to `slots`, and whose page tables (covering first_position + rows
// tokens) are page_indptr / page_indices, FlashInfer's CSR form. Logits come
// out, on the host, for the last row of each sequence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "clm/engine.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"

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
// indptr[i] .. indptr[i+1]-1), in host memory; returning an error stops the
// forward.
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
// `tokens` rounded up to whole pages, in host memory (set `memory` for a
// device pool).
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
  int threads = 0;  // CPU decoder: GEMM and attention threads; 0 = the hardware's
  // CPU decoder: rows of scratch allocated, and touched, at creation (a
  // server passes the most rows one step brings: its prefill token budget
  // plus its batch), so that the first long prompt
  // does not pay the operating system's first touch of every page (a tenth
  // of a second at 2,000 rows of the default model). 0: grown on demand.
  std::int64_t workspace_rows = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;

  virtual const LlamaConfig& config() const = 0;
  virtual clm::Engine& engine() const = 0;

  // Runs the batch; host_logits [B][vocab] gets each sequence's last row's
  // logits. Checks every shape, position, token, slot and page id first
  // (check_forward_batch): on such an error nothing is written. An
  // observer's error stops the pass with the new rows' K/V partly written
  // (they are the sequences' own slots: rerun or abort them).
  virtual clm::Status forward(const ForwardBatch& batch, std::span<float> host_logits) = 0;

  // Installs hooks (nullptr removes them); the observer must outlive its use.
  virtual void set_observer(LayerObserver* observer) = 0;
};

// What every decoder checks at creation: the config, the engine's pool
// shaped for it (layers, KV heads, head_dim), and every weight tensor's size.
// invalid_argument naming what is wrong. Where the pool lives is each
// decoder's own check.
clm::Status check_decoder_setup(const LlamaConfig& config, const LlamaWeights& weights,
                                const clm::PagedKvPoolConfig& pool);

// What every decoder checks before a forward: offsets, rows, positions inside
// the context, pages enough for each sequence's tokens, page ids and slots
// inside the pool, tokens inside the vocabulary, the logits' size.
// invalid_argument naming the first problem.
clm::Status check_forward_batch(const LlamaConfig& config, const clm::PagedKvPoolConfig& pool,
                                const ForwardBatch& batch, std::span<const float> logits);

// RoPE's rotation table, cos and sin [max_position][head_dim / 2] (rotate-half
// pairs i and i + head_dim / 2 at angle position * theta^(-2i / head_dim)),
// computed in double and rounded once: a position's rotation is the same in
// every batch it appears in, and on every decoder, which the equality of
// reuse rests on.
void rope_table(const LlamaConfig& config, std::vector<float>& cos, std::vector<float>& sin);

// The decoder for the engine's pool: LlamaModel for MemoryKind::host,
// CudaLlamaModel for MemoryKind::device (unsupported when clmcache was built
// without CUDA), unsupported for a pool that keeps no KV bytes. The engine
// must outlive the decoder.
clm::Status make_decoder(const LlamaConfig& config, LlamaWeights weights, clm::Engine& engine,
                         const ModelOptions& options, std::unique_ptr<Decoder>& out);

// Whether make_decoder can make a decoder for device pools (built with CUDA).
bool cuda_decoder_built();

}  // namespace tiny_llama
