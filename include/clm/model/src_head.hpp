// clm/model/src_head.hpp: the SRC head (Suffix Reuse Confidence) of CLM, on the CPU
// (lib/model/src_head.cpp, docs/clm.md). It turns one layer's attention output for a
// ragged batch of sequences into one score per sequence: how confident the
// model is that a cached suffix can be reused.
//
//   std::unique_ptr<clm::SrcHead> head;
//   CLM_RETURN_IF_ERROR(clm::SrcHead::create(std::move(weights), clm::Gelu::tanh, head));
//   // attn_out [total_tokens][hidden], token_ids [total_tokens], indptr [batch + 1]
//   const int32_t special[] = {128009};  // <|eot_id|>
//   CLM_RETURN_IF_ERROR(head->score(attn_out, token_ids, indptr, special, scores));
//
// Per sequence b (positions indptr[b] .. indptr[b+1]-1 of attn_out):
//   h     = mean of attn_out rows whose token id is not in special_ids   [hidden]
//   z     = GELU(W1 h + b1)                                              [hidden/4]
//   score = sigmoid(w2 . z + b2)                                         in [0, 1]
// The batch is computed as two GEMMs ([batch x hidden] x W1^T, then x w2) over
// the head's own weights (moved in by create, never copied per call).
// The score is in (0, 1) mathematically; in f32 it saturates to exactly 0 or 1
// once |logit| exceeds about 17 (resp. 88).
//
// Weights come from the host: in memory (SrcHeadWeights), or from a
// safetensors file (read_src_head; names in docs/clm.md: src_head.w1 [inner,
// hidden], src_head.b1 [inner], src_head.w2 [inner] or [1, inner], src_head.b2
// [] or [1]; f32, f16 or bf16, converted to f32 on load). write_src_head
// also records the GELU form in the file's metadata ("gelu": "tanh" or "erf",
// as clm_fit writes it); read_src_head_gelu reads it back, so that a head is
// never run with another GELU than the one it was trained with.
//
// Decode: the host (or Engine::src_step) keeps a running sum per sequence and
// calls score_pooled on the means, so a step costs one row per sequence.
//
// Errors (Status, never exceptions), all StatusCode::invalid_argument:
//   - create: hidden < 4 or not divisible by 4, weight sizes that do not match
//     hidden, a NaN/Inf weight;
//   - score: attn_out size not total_tokens * hidden, token_ids size not
//     total_tokens, indptr empty, not starting at 0, decreasing or not ending
//     at total_tokens, scores_out size not batch, a sequence with no
//     non-special position (empty, or all special: there is nothing to average,
//     and no neutral score is made up for it), a NaN/Inf anywhere in attn_out
//     (special positions included: it means an upstream bug), or a non-finite
//     intermediate value (activations so large that the f32 GEMMs overflow).
// On any error scores_out is left untouched; a score is never NaN.
// score is const and keeps no state: concurrent calls on one head are safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clm/io/safetensors.hpp"
#include "clm/kernels/activations.hpp"
#include "clm/status.hpp"

namespace clm {

// Row-major f32 weights of the head. inner = hidden / 4.
struct SrcHeadWeights {
  int32_t hidden = 0;
  std::vector<float> w1;  // [inner][hidden]
  std::vector<float> b1;  // [inner]
  std::vector<float> w2;  // [inner] (the single output row)
  float b2 = 0.0f;
};

enum class Gelu {
  tanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  erf,   // 0.5 x (1 + erf(x / sqrt(2))), the exact form
};

class SrcHead {
 public:
  // Validates `weights` (see above) and takes ownership of them.
  static Status create(SrcHeadWeights weights, Gelu gelu, std::unique_ptr<SrcHead>& out);

  // attn_out: [total_tokens][hidden] row-major; token_ids: [total_tokens];
  // indptr: [batch + 1] CSR offsets into the tokens; special_ids: token ids
  // masked out of the mean (any order, duplicates allowed); scores_out: [batch].
  // batch == 0 (indptr == {0}, no tokens) is valid and writes nothing.
  Status score(std::span<const float> attn_out, std::span<const int32_t> token_ids, std::span<const int32_t> indptr,
               std::span<const int32_t> special_ids, std::span<float> scores_out) const;
  // The same over attention outputs in f32, f16 or bf16 (attn_out.cols must be
  // hidden; the means are accumulated in f64).
  Status score(ConstActivationView attn_out, std::span<const int32_t> token_ids, std::span<const int32_t> indptr,
               std::span<const int32_t> special_ids, std::span<float> scores_out) const;
  // The head on already pooled vectors: means [batch][hidden] -> scores [batch].
  Status score_pooled(std::span<const float> means, std::span<float> scores_out) const;

  int32_t hidden() const { return weights_.hidden; }
  int32_t inner() const { return weights_.hidden / 4; }
  Gelu gelu() const { return gelu_; }
  const SrcHeadWeights& weights() const { return weights_; }

 private:
  SrcHead(SrcHeadWeights weights, Gelu gelu) : weights_(std::move(weights)), gelu_(gelu) {}

  SrcHeadWeights weights_;
  Gelu gelu_;
};

// The head's tensors from a loaded file (names above; f32/f16/bf16; shapes
// checked against each other). `hidden` is taken from src_head.w1.
Status read_src_head(const SafetensorsFile& file, SrcHeadWeights& out);
Status read_src_head(const std::string& path, SrcHeadWeights& out);
// The GELU form a file says its head uses (metadata "gelu": "tanh" or "erf");
// nullopt when the file does not say (files written by other tools). Any
// other value is invalid_argument.
Status read_src_head_gelu(const SafetensorsFile& file, std::optional<Gelu>& out);
// Reads a head file and settles its GELU: `requested` (nullopt: the file's
// own) must agree with the file's "gelu" metadata when it has one
// (invalid_argument otherwise, naming both); a file that does not say needs
// `requested`. Nothing is written to the outputs on an error.
Status load_src_head(const std::string& path, std::optional<Gelu> requested, SrcHeadWeights& weights, Gelu& gelu);
// Writes the head as f32 tensors under the names above, with metadata "gelu"
// set to `gelu` and the host's own entries (a "gelu" entry among them that
// says otherwise is invalid_argument).
Status write_src_head(const std::string& path, const SrcHeadWeights& weights, Gelu gelu,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace clm
