// clm/model/src_head_training.hpp: fitting the SRC head (clm/model/src_head.hpp) on the
// host's own data, without a Python stack (lib/model/src_head_training.cpp,
// docs/clm.md).
//
//   // features [n][hidden]: the pooled means h the head sees; labels [n] 0/1
//   // (e.g. repeated-suffix labels, clm/model/src_labels.hpp).
//   clm::SrcHeadTrainOptions options;
//   options.holdout_fraction = 0.1;
//   clm::SrcHeadWeights weights;
//   clm::SrcHeadTrainReport report;
//   CLM_RETURN_IF_ERROR(clm::train_src_head(features, labels, options, weights, &report));
//   CLM_RETURN_IF_ERROR(clm::SrcHead::create(std::move(weights), options.gelu, head));
//
// The model is exactly the head's: logit = w2 . GELU(W1 h + b1) + b2. Training
// minimises the mean binary cross-entropy on the logit (the stable form
// max(l, 0) - l y + log1p(exp(-|l|))) plus weight_decay/2 (|W1|^2 + |w2|^2)
// (biases are not decayed), with Adam (beta1 0.9, beta2 0.999, eps 1e-8, bias
// corrected) over shuffled minibatches, forward and backward as Eigen f32
// GEMMs. Init as PyTorch's nn.Linear: every weight and bias uniform in
// +-1/sqrt(fan_in). Everything random (init, the held-out split, the shuffles)
// comes from `seed` through our own generator, so a seed gives the same weights
// on every run and platform that computes the same floats.
//
// Held-out data: holdout_fraction of each class (stratified, rounded) is kept
// out of training and scored after each epoch. With patience > 0, training
// stops once the held-out loss has not improved for `patience` epochs, and the
// weights of the best epoch are returned.
//
// Errors (invalid_argument; `out` and `*report` untouched): a features view
// that is malformed or has hidden < 4 / not divisible by 4, a NaN/Inf feature,
// labels not of size n or not 0/1, fewer than 2 rows, one class only (in the
// data or, with a holdout, in either split), bad options (epochs or batch_size
// < 1, learning rate not finite > 0, weight_decay not finite >= 0,
// holdout_fraction not in [0, 1), patience < 0, unknown gelu), or a loss that
// turns non-finite (diverged: lower the learning rate).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "clm/kernels/activations.hpp"
#include "clm/model/src_head.hpp"
#include "clm/status.hpp"

namespace clm {

struct SrcHeadTrainOptions {
  Gelu gelu = Gelu::tanh;  // must match the SrcHead the weights go to
  std::int32_t epochs = 20;
  std::int32_t batch_size = 64;
  double learning_rate = 1e-3;
  double weight_decay = 0.0;  // L2 on W1 and w2
  std::uint64_t seed = 0;
  double holdout_fraction = 0.0;  // in [0, 1)
  std::int32_t patience = 0;      // early stopping on the held-out loss; 0 = off
};

struct SrcHeadTrainReport {
  double train_loss = 0.0;  // mean BCE over the training rows, final weights (no decay term)
  double train_auc = 0.0;
  double validation_loss = 0.0;  // NaN without a holdout
  double validation_auc = 0.0;   // NaN without a holdout
  std::int32_t epochs_run = 0;
  std::int32_t best_epoch = 0;  // 1-based epoch whose weights were returned
  std::int64_t train_rows = 0;
  std::int64_t validation_rows = 0;
};

Status train_src_head(ConstActivationView features, std::span<const std::uint8_t> labels,
                      const SrcHeadTrainOptions& options, SrcHeadWeights& out, SrcHeadTrainReport* report = nullptr);

// The trainer's own forward pass (f32, as in training): scores_out[i] =
// sigmoid(logit of row i). invalid_argument on weights SrcHead::create would
// refuse, features.cols != hidden, scores_out size != rows, NaN/Inf features.
Status predict_src_head(const SrcHeadWeights& weights, Gelu gelu, ConstActivationView features,
                        std::span<float> scores_out);

// Area under the ROC curve: the probability that a random positive scores
// above a random negative, ties counted half (O(n log n), by mid-ranks).
// NaN when the sizes differ, a label is not 0/1, a score is NaN, or a class
// is missing.
double roc_auc(std::span<const float> scores, std::span<const std::uint8_t> labels);

namespace detail {

// The head's parameters in f64, same layout as SrcHeadWeights.
struct SrcHeadParamsF64 {
  std::int32_t hidden = 0;
  std::vector<double> w1, b1, w2;
  double b2 = 0.0;
};

// The training objective in f64 (the code path training runs in f32): the
// mean BCE over rows x [rows][hidden] with labels y, plus the decay term; its
// gradient into `grad` (resized) when not null. For tests (a gradient check).
// NaN (and grad untouched) when the sizes do not match each other.
double src_head_loss_f64(const SrcHeadParamsF64& params, Gelu gelu, std::span<const double> x,
                         std::span<const std::uint8_t> y, double weight_decay, SrcHeadParamsF64* grad);

}  // namespace detail

}  // namespace clm
