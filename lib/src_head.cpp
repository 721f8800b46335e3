// The CPU SRC head (include/clm/src_head.hpp): masked means, then two Eigen
// GEMMs over the head's weights, GELU and a sigmoid.
#include "clm/src_head.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wpedantic"
#include <Eigen/Core>
#pragma GCC diagnostic pop

namespace clm {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMatrix>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

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

float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

float gelu_erf(float x) {
  constexpr float inv_sqrt2 = 0.7071067811865476f;
  return 0.5f * x * (1.0f + std::erf(x * inv_sqrt2));
}

float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

}  // namespace

Status SrcHead::create(SrcHeadWeights weights, Gelu gelu, std::unique_ptr<SrcHead>& out) {
  const int32_t hidden = weights.hidden;
  if (hidden < 4 || hidden % 4 != 0) {
    return invalid_argument("SrcHead: hidden must be >= 4 and divisible by 4, got " +
                            std::to_string(hidden));
  }
  if (gelu != Gelu::tanh && gelu != Gelu::erf) return invalid_argument("SrcHead: unknown Gelu mode");
  const std::size_t h = static_cast<std::size_t>(hidden);
  const std::size_t inner = h / 4;
  if (weights.w1.size() != inner * h) {
    return invalid_argument("SrcHead: w1 must hold hidden/4 * hidden = " + std::to_string(inner * h) +
                            " floats, got " + std::to_string(weights.w1.size()));
  }
  if (weights.b1.size() != inner) {
    return invalid_argument("SrcHead: b1 must hold hidden/4 = " + std::to_string(inner) +
                            " floats, got " + std::to_string(weights.b1.size()));
  }
  if (weights.w2.size() != inner) {
    return invalid_argument("SrcHead: w2 must hold hidden/4 = " + std::to_string(inner) +
                            " floats, got " + std::to_string(weights.w2.size()));
  }
  if (!all_finite(weights.w1) || !all_finite(weights.b1) || !all_finite(weights.w2) ||
      !std::isfinite(weights.b2)) {
    return invalid_argument("SrcHead: the weights hold a NaN or Inf");
  }
  out.reset(new SrcHead(std::move(weights), gelu));
  return Status::success();
}

Status SrcHead::score(std::span<const float> attn_out, std::span<const int32_t> token_ids,
                      std::span<const int32_t> indptr, std::span<const int32_t> special_ids,
                      std::span<float> scores_out) const {
  const std::size_t h = static_cast<std::size_t>(weights_.hidden);
  const std::size_t inner = h / 4;

  // ---- shapes --------------------------------------------------------------
  if (attn_out.size() % h != 0) {
    return invalid_argument("SrcHead::score: attn_out size " + std::to_string(attn_out.size()) +
                            " is not a multiple of hidden " + std::to_string(h));
  }
  const std::size_t total_tokens = attn_out.size() / h;
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
    return invalid_argument("SrcHead::score: indptr ends at " + std::to_string(indptr[batch]) +
                            ", attn_out has " + std::to_string(total_tokens) + " tokens");
  }
  if (const std::size_t bad = first_non_finite(attn_out); bad != attn_out.size()) {
    return invalid_argument("SrcHead::score: attn_out holds a NaN or Inf (token " +
                            std::to_string(bad / h) + ", channel " + std::to_string(bad % h) + ")");
  }
  if (batch == 0) return Status::success();

  std::vector<int32_t> special(special_ids.begin(), special_ids.end());
  std::sort(special.begin(), special.end());
  auto is_special = [&special](int32_t id) {
    return std::binary_search(special.begin(), special.end(), id);
  };

  // ---- masked means: H [batch x hidden] --------------------------------------
  RowMatrix means(static_cast<Eigen::Index>(batch), static_cast<Eigen::Index>(h));
  std::vector<double> acc(h);
  for (std::size_t b = 0; b < batch; ++b) {
    std::fill(acc.begin(), acc.end(), 0.0);
    std::size_t count = 0;
    for (auto t = static_cast<std::size_t>(indptr[b]); t < static_cast<std::size_t>(indptr[b + 1]); ++t) {
      if (is_special(token_ids[t])) continue;
      const float* row = attn_out.data() + t * h;
      for (std::size_t c = 0; c < h; ++c) acc[c] += static_cast<double>(row[c]);
      ++count;
    }
    if (count == 0) {
      return invalid_argument("SrcHead::score: sequence " + std::to_string(b) +
                              " has no non-special position to average (" +
                              std::to_string(indptr[b + 1] - indptr[b]) + " tokens, all special)");
    }
    const double inv = 1.0 / static_cast<double>(count);
    float* dst = means.data() + b * h;
    for (std::size_t c = 0; c < h; ++c) dst[c] = static_cast<float>(acc[c] * inv);
  }

  // ---- Z = GELU(H W1^T + b1), logits = Z w2 + b2 ------------------------------
  const auto ei = static_cast<Eigen::Index>(inner);
  const ConstRowMap w1(weights_.w1.data(), ei, static_cast<Eigen::Index>(h));
  const ConstVecMap b1(weights_.b1.data(), ei);
  const ConstVecMap w2(weights_.w2.data(), ei);

  RowMatrix z = means * w1.transpose();
  z.rowwise() += b1.transpose();
  if (gelu_ == Gelu::tanh) {
    z = z.unaryExpr([](float x) { return gelu_tanh(x); });
  } else {
    z = z.unaryExpr([](float x) { return gelu_erf(x); });
  }
  Eigen::VectorXf logits = z * w2;
  logits.array() += weights_.b2;

  for (std::size_t b = 0; b < batch; ++b) {
    if (!std::isfinite(logits[static_cast<Eigen::Index>(b)])) {
      return invalid_argument("SrcHead::score: sequence " + std::to_string(b) +
                              " gives a non-finite logit (the activations overflow f32)");
    }
  }
  for (std::size_t b = 0; b < batch; ++b) scores_out[b] = sigmoid(logits[static_cast<Eigen::Index>(b)]);
  return Status::success();
}

}  // namespace clm
