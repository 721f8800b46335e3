// The CPU SRC head (include/clm/model/src_head.hpp): validation, masked means in
// f64, then the head on the means (dense_kernels.hpp: Eigen GEMM or GEMV,
// GELU, the output row; AVX2 + FMA when the CPU has them) and a sigmoid.
#include "clm/model/src_head.hpp"

#include "kernels/eigen_avx2.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

#include "kernels/dense_kernels.hpp"

namespace clm {
namespace {

bool all_finite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

std::size_t first_non_finite(std::span<const float> values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return values.size();
}

float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

Status check_weights(const SrcHeadWeights& weights) {
  const int32_t hidden = weights.hidden;
  if (hidden < 4 || hidden % 4 != 0) {
    return invalid_argument("SrcHead: hidden must be >= 4 and divisible by 4, got " + std::to_string(hidden));
  }
  const std::size_t h = static_cast<std::size_t>(hidden);
  const std::size_t inner = h / 4;
  if (weights.w1.size() != inner * h) {
    return invalid_argument("SrcHead: w1 must hold hidden/4 * hidden = " + std::to_string(inner * h) + " floats, got " +
                            std::to_string(weights.w1.size()));
  }
  if (weights.b1.size() != inner) {
    return invalid_argument("SrcHead: b1 must hold hidden/4 = " + std::to_string(inner) + " floats, got " +
                            std::to_string(weights.b1.size()));
  }
  if (weights.w2.size() != inner) {
    return invalid_argument("SrcHead: w2 must hold hidden/4 = " + std::to_string(inner) + " floats, got " +
                            std::to_string(weights.w2.size()));
  }
  if (!all_finite(weights.w1) || !all_finite(weights.b1) || !all_finite(weights.w2) || !std::isfinite(weights.b2)) {
    return invalid_argument("SrcHead: the weights hold a NaN or Inf");
  }
  return Status::success();
}

constexpr std::string_view kGeluMetadataKey = "gelu";

std::string_view gelu_name(Gelu gelu) { return gelu == Gelu::erf ? "erf" : "tanh"; }

std::optional<Gelu> gelu_from_name(std::string_view name) {
  if (name == "tanh") return Gelu::tanh;
  if (name == "erf") return Gelu::erf;
  return std::nullopt;
}

}  // namespace

Status SrcHead::create(SrcHeadWeights weights, Gelu gelu, std::unique_ptr<SrcHead>& out) {
  if (gelu != Gelu::tanh && gelu != Gelu::erf) return invalid_argument("SrcHead: unknown Gelu mode");
  CLM_RETURN_IF_ERROR(check_weights(weights));
  out.reset(new SrcHead(std::move(weights), gelu));
  return Status::success();
}

Status SrcHead::score(std::span<const float> attn_out, std::span<const int32_t> token_ids,
                      std::span<const int32_t> indptr, std::span<const int32_t> special_ids,
                      std::span<float> scores_out) const {
  const std::size_t h = static_cast<std::size_t>(weights_.hidden);
  if (attn_out.size() % h != 0) {
    return invalid_argument("SrcHead::score: attn_out size " + std::to_string(attn_out.size()) +
                            " is not a multiple of hidden " + std::to_string(h));
  }
  const ConstActivationView view{attn_out.data(), ActDType::f32, static_cast<std::int64_t>(attn_out.size() / h),
                                 weights_.hidden};
  return score(view, token_ids, indptr, special_ids, scores_out);
}

Status SrcHead::score(ConstActivationView attn_out, std::span<const int32_t> token_ids, std::span<const int32_t> indptr,
                      std::span<const int32_t> special_ids, std::span<float> scores_out) const {
  const std::size_t h = static_cast<std::size_t>(weights_.hidden);

  // ---- shapes --------------------------------------------------------------
  CLM_RETURN_IF_ERROR(check_activation_view(attn_out, weights_.hidden, "SrcHead::score: attn_out"));
  const auto total_tokens = static_cast<std::size_t>(attn_out.rows);
  if (token_ids.size() != total_tokens) {
    return invalid_argument("SrcHead::score: token_ids has " + std::to_string(token_ids.size()) +
                            " entries, attn_out has " + std::to_string(total_tokens) + " tokens");
  }
  if (indptr.empty()) return invalid_argument("SrcHead::score: indptr is empty (needs batch + 1 entries)");
  const std::size_t batch = indptr.size() - 1;
  if (scores_out.size() != batch) {
    return invalid_argument("SrcHead::score: scores_out has " + std::to_string(scores_out.size()) +
                            " entries, indptr gives a batch of " + std::to_string(batch));
  }
  if (indptr[0] != 0) return invalid_argument("SrcHead::score: indptr[0] must be 0");
  for (std::size_t b = 0; b < batch; ++b) {
    if (indptr[b + 1] < indptr[b]) {
      return invalid_argument("SrcHead::score: indptr decreases at " + std::to_string(b + 1));
    }
  }
  if (static_cast<std::size_t>(indptr[batch]) != total_tokens) {
    return invalid_argument("SrcHead::score: indptr ends at " + std::to_string(indptr[batch]) + ", attn_out has " +
                            std::to_string(total_tokens) + " tokens");
  }
  if (batch == 0) return Status::success();

  std::vector<int32_t> special(special_ids.begin(), special_ids.end());
  std::sort(special.begin(), special.end());
  auto is_special = [&special](int32_t id) { return std::binary_search(special.begin(), special.end(), id); };

  // ---- masked means: H [batch x hidden], accumulated in f64 -------------------
  // One pass over the rows (indptr covers every one): each is converted once,
  // checked for NaN/Inf (special rows too: a bad value means an upstream bug),
  // and added unless special. A lone row is its own mean (a decode step).
  std::vector<float> means(batch * h);
  std::vector<double> acc(h);
  std::vector<float> row(h);
  for (std::size_t b = 0; b < batch; ++b) {
    float* dst = means.data() + b * h;
    std::size_t count = 0;
    for (auto t = static_cast<std::size_t>(indptr[b]); t < static_cast<std::size_t>(indptr[b + 1]); ++t) {
      const float* values = row.data();
      if (attn_out.dtype == ActDType::f32) {
        values = static_cast<const float*>(attn_out.data) + t * h;
      } else {
        attn_out.load_row(static_cast<std::int64_t>(t), row.data());
      }
      if (const std::size_t bad = first_non_finite({values, h}); bad != h) {
        return invalid_argument("SrcHead::score: attn_out holds a NaN or Inf (token " + std::to_string(t) +
                                ", channel " + std::to_string(bad) + ")");
      }
      if (is_special(token_ids[t])) continue;
      if (count == 0) {
        std::copy(values, values + h, dst);
      } else {
        if (count == 1) {
          for (std::size_t c = 0; c < h; ++c) acc[c] = static_cast<double>(dst[c]);
        }
        for (std::size_t c = 0; c < h; ++c) acc[c] += static_cast<double>(values[c]);
      }
      ++count;
    }
    if (count == 0) {
      return invalid_argument("SrcHead::score: sequence " + std::to_string(b) +
                              " has no non-special position to average (" + std::to_string(indptr[b + 1] - indptr[b]) +
                              " tokens, all special)");
    }
    if (count == 1) continue;
    const double inv = 1.0 / static_cast<double>(count);
    for (std::size_t c = 0; c < h; ++c) dst[c] = static_cast<float>(acc[c] * inv);
  }
  return score_pooled(means, scores_out);
}

Status SrcHead::score_pooled(std::span<const float> means, std::span<float> scores_out) const {
  const std::size_t h = static_cast<std::size_t>(weights_.hidden);
  const std::size_t batch = scores_out.size();
  if (means.size() != batch * h) {
    return invalid_argument("SrcHead::score_pooled: means has " + std::to_string(means.size()) +
                            " floats, expected batch " + std::to_string(batch) + " x hidden " + std::to_string(h));
  }
  if (const std::size_t bad = first_non_finite(means); bad != means.size()) {
    return invalid_argument("SrcHead::score_pooled: means hold a NaN or Inf (row " + std::to_string(bad / h) +
                            ", channel " + std::to_string(bad % h) + ")");
  }
  if (batch == 0) return Status::success();

  // ---- logits = w2 . GELU(H W1^T + b1) + b2, AVX2 + FMA when the CPU has them --
  std::vector<float> logits(batch);
  if (detail::eigen_avx2_usable()) {
    detail::src_head_pooled_logits_avx2(means.data(), static_cast<std::int64_t>(batch), weights_.hidden,
                                        weights_.w1.data(), weights_.b1.data(), weights_.w2.data(), weights_.b2,
                                        gelu_ == Gelu::tanh, logits.data());
  } else {
    detail::src_head_pooled_logits(means.data(), static_cast<std::int64_t>(batch), weights_.hidden, weights_.w1.data(),
                                   weights_.b1.data(), weights_.w2.data(), weights_.b2, gelu_ == Gelu::tanh,
                                   logits.data());
  }

  for (std::size_t b = 0; b < batch; ++b) {
    if (!std::isfinite(logits[b])) {
      return invalid_argument("SrcHead::score: sequence " + std::to_string(b) +
                              " gives a non-finite logit (the activations overflow f32)");
    }
  }
  for (std::size_t b = 0; b < batch; ++b) scores_out[b] = sigmoid(logits[b]);
  return Status::success();
}

Status read_src_head(const SafetensorsFile& file, SrcHeadWeights& out) {
  SrcHeadWeights w;
  std::vector<std::int64_t> shape;
  const std::int64_t any2[] = {-1, -1};
  CLM_RETURN_IF_ERROR(file.get_f32("src_head.w1", any2, w.w1, &shape));
  const std::int64_t inner = shape[0];
  const std::int64_t hidden = shape[1];
  if (hidden < 4 || hidden % 4 != 0 || inner != hidden / 4 || hidden > (std::int64_t{1} << 20)) {
    return invalid_argument(
        "read_src_head: src_head.w1 must be [hidden/4, hidden] with hidden a multiple of 4 in [4, 2^20], got [" +
        std::to_string(inner) + ", " + std::to_string(hidden) + "]");
  }
  const std::int64_t b1_shape[] = {inner};
  CLM_RETURN_IF_ERROR(file.get_f32("src_head.b1", b1_shape, w.b1));
  const TensorView* w2 = file.find("src_head.w2");
  if (w2 != nullptr && w2->shape.size() == 2) {
    const std::int64_t w2_shape[] = {1, inner};
    CLM_RETURN_IF_ERROR(file.get_f32("src_head.w2", w2_shape, w.w2));
  } else {
    const std::int64_t w2_shape[] = {inner};
    CLM_RETURN_IF_ERROR(file.get_f32("src_head.w2", w2_shape, w.w2));
  }
  std::vector<float> b2;
  const TensorView* b2_view = file.find("src_head.b2");
  if (b2_view != nullptr && b2_view->shape.empty()) {
    CLM_RETURN_IF_ERROR(file.get_f32("src_head.b2", {}, b2));
  } else {
    const std::int64_t b2_shape[] = {1};
    CLM_RETURN_IF_ERROR(file.get_f32("src_head.b2", b2_shape, b2));
  }
  w.hidden = static_cast<int32_t>(hidden);
  w.b2 = b2[0];
  out = std::move(w);
  return Status::success();
}

Status read_src_head(const std::string& path, SrcHeadWeights& out) {
  SafetensorsFile file;
  CLM_RETURN_IF_ERROR(SafetensorsFile::open(path, file));
  return read_src_head(file, out);
}

Status read_src_head_gelu(const SafetensorsFile& file, std::optional<Gelu>& out) {
  const auto it = file.metadata().find(std::string(kGeluMetadataKey));
  if (it == file.metadata().end()) {
    out.reset();
    return Status::success();
  }
  const std::optional<Gelu> gelu = gelu_from_name(it->second);
  if (!gelu) {
    return invalid_argument("read_src_head_gelu: metadata \"gelu\" is \"" + it->second +
                            "\", expected \"tanh\" or \"erf\"");
  }
  out = gelu;
  return Status::success();
}

Status load_src_head(const std::string& path, std::optional<Gelu> requested, SrcHeadWeights& weights, Gelu& gelu) {
  if (requested && *requested != Gelu::tanh && *requested != Gelu::erf) {
    return invalid_argument("load_src_head: unknown Gelu mode");
  }
  SafetensorsFile file;
  CLM_RETURN_IF_ERROR(SafetensorsFile::open(path, file));
  std::optional<Gelu> in_file;
  CLM_RETURN_IF_ERROR(read_src_head_gelu(file, in_file));
  if (!requested && !in_file) {
    return invalid_argument("load_src_head: " + path +
                            " does not say which GELU its head uses (no \"gelu\" metadata); name it (tanh or erf)");
  }
  if (requested && in_file && *requested != *in_file) {
    return invalid_argument("load_src_head: " + path + " holds a head trained with the " +
                            std::string(gelu_name(*in_file)) + " GELU, but " + std::string(gelu_name(*requested)) +
                            " was asked for");
  }
  SrcHeadWeights read;
  CLM_RETURN_IF_ERROR(read_src_head(file, read));
  weights = std::move(read);
  gelu = requested ? *requested : *in_file;
  return Status::success();
}

Status write_src_head(const std::string& path, const SrcHeadWeights& weights, Gelu gelu,
                      const std::map<std::string, std::string>& metadata) {
  CLM_RETURN_IF_ERROR(check_weights(weights));  // a file we write must load
  if (gelu != Gelu::tanh && gelu != Gelu::erf) return invalid_argument("write_src_head: unknown Gelu mode");
  std::map<std::string, std::string> all = metadata;
  const auto [it, added] = all.emplace(std::string(kGeluMetadataKey), std::string(gelu_name(gelu)));
  if (!added && it->second != gelu_name(gelu)) {
    return invalid_argument("write_src_head: metadata \"gelu\" is \"" + it->second + "\" but the head uses " +
                            std::string(gelu_name(gelu)));
  }
  const std::int64_t hidden = weights.hidden;
  const std::int64_t inner = hidden / 4;
  auto bytes = [](std::span<const float> v) { return std::as_bytes(v); };
  const float b2[] = {weights.b2};
  const TensorToWrite tensors[] = {
      {"src_head.w1", TensorDType::f32, {inner, hidden}, bytes(weights.w1)},
      {"src_head.b1", TensorDType::f32, {inner}, bytes(weights.b1)},
      {"src_head.w2", TensorDType::f32, {inner}, bytes(weights.w2)},
      {"src_head.b2", TensorDType::f32, {1}, bytes(b2)},
  };
  return write_safetensors(path, tensors, all);
}

}  // namespace clm
