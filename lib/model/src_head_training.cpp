// Training the SRC head (include/clm/model/src_head_training.hpp): Adam on the mean
// BCE, minibatch forward/backward as Eigen GEMMs. The math is a template on
// the scalar so that training runs in f32 and the gradient check in f64 go
// through the same code.
#include "clm/model/src_head_training.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include <Eigen/Core>

namespace clm {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <class T>
struct Params {
  Mat<T> w1;  // [inner][hidden]
  Vec<T> b1;  // [inner]
  Vec<T> w2;  // [inner]
  T b2 = 0;

  void zeros_like(const Params& p) {
    w1.setZero(p.w1.rows(), p.w1.cols());
    b1.setZero(p.b1.size());
    w2.setZero(p.w2.size());
    b2 = 0;
  }
};

// Activations of one minibatch, kept from the forward pass for the backward.
template <class T>
struct Work {
  Mat<T> a;  // pre-activation W1 h + b1, [rows][inner]
  Mat<T> z;  // GELU(a)
  Mat<T> dz;
  Vec<T> logit, dlogit;
};

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kGeluC = 0.044715;

template <class T>
T gelu(T x, Gelu mode) {
  if (mode == Gelu::erf) return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
  return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x)));
}

template <class T>
T gelu_grad(T x, Gelu mode) {
  if (mode == Gelu::erf) {  // d/dx x Phi(x) = Phi(x) + x phi(x)
    return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
  }
  const T t = std::tanh(T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kGeluC) * x * x);
}

template <class T>
T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

// BCE on the logit, stable for any |l|.
double bce(double logit, double y) { return std::max(logit, 0.0) - logit * y + std::log1p(std::exp(-std::abs(logit))); }

template <class T>
void forward(const Params<T>& p, Gelu mode, const Mat<T>& x, Work<T>& w) {
  w.a.noalias() = x * p.w1.transpose();
  w.a.rowwise() += p.b1.transpose();
  w.z = w.a.unaryExpr([mode](T v) { return gelu(v, mode); });
  w.logit.noalias() = w.z * p.w2;
  w.logit.array() += p.b2;
}

// Sum over the rows of the BCE (no decay term), in f64.
template <class T>
double loss_sum(const Vec<T>& logit, const T* y) {
  double sum = 0.0;
  for (Eigen::Index i = 0; i < logit.size(); ++i) sum += bce(static_cast<double>(logit[i]), static_cast<double>(y[i]));
  return sum;
}

// Gradient of mean-over-rows BCE + weight_decay/2 (|W1|^2 + |w2|^2), after forward.
template <class T>
void backward(const Params<T>& p, Gelu mode, const Mat<T>& x, const T* y, T weight_decay, Work<T>& w, Params<T>& grad) {
  const Eigen::Index rows = x.rows();
  const T inv_rows = T(1) / static_cast<T>(rows);
  w.dlogit.resize(rows);
  for (Eigen::Index i = 0; i < rows; ++i) w.dlogit[i] = (sigmoid(w.logit[i]) - y[i]) * inv_rows;
  grad.w2.noalias() = w.z.transpose() * w.dlogit;
  grad.w2 += weight_decay * p.w2;
  grad.b2 = w.dlogit.sum();
  w.dz.noalias() = w.dlogit * p.w2.transpose();
  w.dz.array() *= w.a.unaryExpr([mode](T v) { return gelu_grad(v, mode); }).array();
  grad.w1.noalias() = w.dz.transpose() * x;
  grad.w1 += weight_decay * p.w1;
  grad.b1 = w.dz.colwise().sum().transpose();
}

// SplitMix64: our own generator, so a seed means the same numbers everywhere
// (std:: distributions differ between standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  template <class V>
  void shuffle(V& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }

 private:
  std::uint64_t state_;
};

// PyTorch's nn.Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
Params<float> init_params(std::int32_t hidden, Rng& rng) {
  const Eigen::Index h = hidden, inner = hidden / 4;
  Params<float> p;
  p.w1.resize(inner, h);
  p.b1.resize(inner);
  p.w2.resize(inner);
  const double k1 = 1.0 / std::sqrt(static_cast<double>(h));
  const double k2 = 1.0 / std::sqrt(static_cast<double>(inner));
  for (Eigen::Index i = 0; i < p.w1.size(); ++i) p.w1.data()[i] = static_cast<float>(rng.uniform(-k1, k1));
  for (Eigen::Index i = 0; i < inner; ++i) p.b1[i] = static_cast<float>(rng.uniform(-k1, k1));
  for (Eigen::Index i = 0; i < inner; ++i) p.w2[i] = static_cast<float>(rng.uniform(-k2, k2));
  p.b2 = static_cast<float>(rng.uniform(-k2, k2));
  return p;
}

SrcHeadWeights to_weights(const Params<float>& p) {
  SrcHeadWeights w;
  w.hidden = static_cast<std::int32_t>(p.w1.cols());
  w.w1.assign(p.w1.data(), p.w1.data() + p.w1.size());
  w.b1.assign(p.b1.data(), p.b1.data() + p.b1.size());
  w.w2.assign(p.w2.data(), p.w2.data() + p.w2.size());
  w.b2 = p.b2;
  return w;
}

Params<float> from_weights(const SrcHeadWeights& w) {
  const Eigen::Index h = w.hidden, inner = w.hidden / 4;
  Params<float> p;
  p.w1 = Eigen::Map<const Mat<float>>(w.w1.data(), inner, h);
  p.b1 = Eigen::Map<const Vec<float>>(w.b1.data(), inner);
  p.w2 = Eigen::Map<const Vec<float>>(w.w2.data(), inner);
  p.b2 = w.b2;
  return p;
}

// One Adam step on a parameter block (bias corrections folded into the rate).
struct Adam {
  static constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
  Params<float> m, v;
  std::int64_t step = 0;

  template <class P, class G, class M, class V>
  static void update(P& param, const G& g, M& m1, V& m2, float rate, float correction2) {
    m1 = kBeta1 * m1 + (1.0f - kBeta1) * g;
    m2 = kBeta2 * m2 + (1.0f - kBeta2) * g.cwiseProduct(g);
    param.array() -= rate * m1.array() / ((m2.array() / correction2).sqrt() + kEps);
  }

  void apply(Params<float>& p, const Params<float>& g, double lr) {
    ++step;
    const double c1 = 1.0 - std::pow(double{kBeta1}, static_cast<double>(step));
    const double c2 = 1.0 - std::pow(double{kBeta2}, static_cast<double>(step));
    const auto rate = static_cast<float>(lr / c1);
    const auto corr2 = static_cast<float>(c2);
    update(p.w1, g.w1, m.w1, v.w1, rate, corr2);
    update(p.b1, g.b1, m.b1, v.b1, rate, corr2);
    update(p.w2, g.w2, m.w2, v.w2, rate, corr2);
    m.b2 = kBeta1 * m.b2 + (1.0f - kBeta1) * g.b2;
    v.b2 = kBeta2 * v.b2 + (1.0f - kBeta2) * g.b2 * g.b2;
    p.b2 -= rate * m.b2 / (std::sqrt(v.b2 / corr2) + kEps);
  }
};

// Copies rows `idx` of the view into x (f32).
void gather(const ConstActivationView& view, std::span<const std::int64_t> idx, Mat<float>& x) {
  x.resize(static_cast<Eigen::Index>(idx.size()), view.cols);
  for (std::size_t i = 0; i < idx.size(); ++i)
    view.load_row(idx[i], x.data() + i * static_cast<std::size_t>(view.cols));
}

struct Evaluation {
  double loss = 0.0;  // mean BCE
  double auc = 0.0;
  bool finite = true;
};

Evaluation evaluate(const Params<float>& p, Gelu mode, const ConstActivationView& view,
                    std::span<const std::int64_t> idx, std::span<const std::uint8_t> labels) {
  constexpr std::size_t kChunk = 1024;
  Mat<float> x;
  Work<float> w;
  std::vector<float> scores(idx.size());
  std::vector<std::uint8_t> y(idx.size());
  double sum = 0.0;
  Evaluation e;
  for (std::size_t begin = 0; begin < idx.size(); begin += kChunk) {
    const std::size_t count = std::min(kChunk, idx.size() - begin);
    gather(view, idx.subspan(begin, count), x);
    forward(p, mode, x, w);
    for (std::size_t i = 0; i < count; ++i) {
      const float logit = w.logit[static_cast<Eigen::Index>(i)];
      if (!std::isfinite(logit)) e.finite = false;
      const std::uint8_t label = labels[static_cast<std::size_t>(idx[begin + i])];
      sum += bce(static_cast<double>(logit), label);
      scores[begin + i] = logit;  // the AUC only needs the order: logits keep it, sigmoids may tie at 0/1
      y[begin + i] = label;
    }
  }
  e.loss = sum / static_cast<double>(idx.size());
  e.auc = roc_auc(scores, y);
  return e;
}

bool bad_double(double v) { return !std::isfinite(v); }

Status check_options(const SrcHeadTrainOptions& o) {
  if (o.gelu != Gelu::tanh && o.gelu != Gelu::erf) return invalid_argument("train_src_head: unknown gelu mode");
  if (o.epochs < 1) return invalid_argument("train_src_head: epochs must be >= 1, got " + std::to_string(o.epochs));
  if (o.batch_size < 1) {
    return invalid_argument("train_src_head: batch_size must be >= 1, got " + std::to_string(o.batch_size));
  }
  if (bad_double(o.learning_rate) || o.learning_rate <= 0.0) {
    return invalid_argument("train_src_head: learning_rate must be finite and > 0");
  }
  if (bad_double(o.weight_decay) || o.weight_decay < 0.0) {
    return invalid_argument("train_src_head: weight_decay must be finite and >= 0");
  }
  if (!(o.holdout_fraction >= 0.0 && o.holdout_fraction < 1.0)) {
    return invalid_argument("train_src_head: holdout_fraction must be in [0, 1)");
  }
  if (o.patience < 0) return invalid_argument("train_src_head: patience must be >= 0");
  return Status::success();
}

Status check_features(const ConstActivationView& features, const char* what) {
  CLM_RETURN_IF_ERROR(check_activation_view(features, -1, what));
  for (std::int64_t r = 0; r < features.rows; ++r) {
    for (std::int32_t c = 0; c < features.cols; ++c) {
      if (!std::isfinite(features.at(r, c))) {
        return invalid_argument(std::string(what) + ": NaN or Inf at row " + std::to_string(r) + ", column " +
                                std::to_string(c));
      }
    }
  }
  return Status::success();
}

Status check_weights(const SrcHeadWeights& w) {
  const std::int32_t h = w.hidden;
  if (h < 4 || h % 4 != 0) return invalid_argument("predict_src_head: hidden must be >= 4 and divisible by 4");
  const auto inner = static_cast<std::size_t>(h / 4);
  if (w.w1.size() != inner * static_cast<std::size_t>(h) || w.b1.size() != inner || w.w2.size() != inner) {
    return invalid_argument("predict_src_head: weight sizes do not match hidden " + std::to_string(h));
  }
  auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  if (!finite(w.w1) || !finite(w.b1) || !finite(w.w2) || !std::isfinite(w.b2)) {
    return invalid_argument("predict_src_head: the weights hold a NaN or Inf");
  }
  return Status::success();
}

// Stratified split: round(fraction * count) of each class goes to validation.
void split(std::span<const std::uint8_t> labels, double fraction, Rng& rng, std::vector<std::int64_t>& train,
           std::vector<std::int64_t>& validation) {
  std::vector<std::int64_t> by_class[2];
  for (std::size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<std::int64_t>(i));
  for (auto& rows : by_class) {
    rng.shuffle(rows);
    const auto held = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(rows.size())));
    validation.insert(validation.end(), rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(held));
    train.insert(train.end(), rows.begin() + static_cast<std::ptrdiff_t>(held), rows.end());
  }
  std::sort(train.begin(), train.end());  // the epoch shuffles start from a fixed order
  std::sort(validation.begin(), validation.end());
}

bool both_classes(std::span<const std::int64_t> rows, std::span<const std::uint8_t> labels) {
  bool seen[2] = {false, false};
  for (std::int64_t r : rows) seen[labels[static_cast<std::size_t>(r)]] = true;
  return seen[0] && seen[1];
}

}  // namespace

double roc_auc(std::span<const float> scores, std::span<const std::uint8_t> labels) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (scores.size() != labels.size()) return kNaN;
  double positives = 0.0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] > 1 || std::isnan(scores[i])) return kNaN;
    positives += labels[i];
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0.0 || negatives == 0.0) return kNaN;
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' 1-based ranks, tied groups sharing their mean rank.
  double rank_sum = 0.0;
  for (std::size_t begin = 0; begin < order.size();) {
    std::size_t end = begin + 1;
    while (end < order.size() && scores[order[end]] == scores[order[begin]]) ++end;
    const double mean_rank = 0.5 * static_cast<double>(begin + 1 + end);
    for (std::size_t k = begin; k < end; ++k) rank_sum += labels[order[k]] * mean_rank;
    begin = end;
  }
  return (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives);
}

Status predict_src_head(const SrcHeadWeights& weights, Gelu gelu_mode, ConstActivationView features,
                        std::span<float> scores_out) {
  CLM_RETURN_IF_ERROR(check_weights(weights));
  if (gelu_mode != Gelu::tanh && gelu_mode != Gelu::erf) return invalid_argument("predict_src_head: unknown gelu mode");
  CLM_RETURN_IF_ERROR(check_activation_view(features, weights.hidden, "predict_src_head: features"));
  if (scores_out.size() != static_cast<std::size_t>(features.rows)) {
    return invalid_argument("predict_src_head: scores_out has " + std::to_string(scores_out.size()) +
                            " entries, features have " + std::to_string(features.rows) + " rows");
  }
  CLM_RETURN_IF_ERROR(check_features(features, "predict_src_head: features"));
  const Params<float> p = from_weights(weights);
  Mat<float> x;
  Work<float> w;
  std::vector<std::int64_t> idx;
  constexpr std::int64_t kChunk = 1024;
  for (std::int64_t begin = 0; begin < features.rows; begin += kChunk) {
    idx.resize(static_cast<std::size_t>(std::min(kChunk, features.rows - begin)));
    std::iota(idx.begin(), idx.end(), begin);
    gather(features, idx, x);
    forward(p, gelu_mode, x, w);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      scores_out[static_cast<std::size_t>(begin) + i] = sigmoid(w.logit[static_cast<Eigen::Index>(i)]);
    }
  }
  return Status::success();
}

Status train_src_head(ConstActivationView features, std::span<const std::uint8_t> labels,
                      const SrcHeadTrainOptions& options, SrcHeadWeights& out, SrcHeadTrainReport* report) {
  CLM_RETURN_IF_ERROR(check_options(options));
  CLM_RETURN_IF_ERROR(check_activation_view(features, -1, "train_src_head: features"));
  if (features.cols < 4 || features.cols % 4 != 0) {
    return invalid_argument("train_src_head: hidden (features.cols) must be >= 4 and divisible by 4, got " +
                            std::to_string(features.cols));
  }
  if (labels.size() != static_cast<std::size_t>(features.rows)) {
    return invalid_argument("train_src_head: " + std::to_string(labels.size()) + " labels for " +
                            std::to_string(features.rows) + " feature rows");
  }
  if (features.rows < 2) return invalid_argument("train_src_head: needs at least 2 rows");
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] > 1) {
      return invalid_argument("train_src_head: labels[" + std::to_string(i) + "] is " + std::to_string(labels[i]) +
                              ", must be 0 or 1");
    }
  }
  CLM_RETURN_IF_ERROR(check_features(features, "train_src_head: features"));

  Rng rng(options.seed);
  std::vector<std::int64_t> train_rows, validation_rows;
  split(labels, options.holdout_fraction, rng, train_rows, validation_rows);
  if (!both_classes(train_rows, labels)) {
    return invalid_argument("train_src_head: the training rows hold one class only (labels all 0 or all 1)");
  }
  const bool holdout = !validation_rows.empty();
  if (options.holdout_fraction > 0.0 && !both_classes(validation_rows, labels)) {
    return invalid_argument("train_src_head: the held-out rows lack a class (too few rows for holdout_fraction)");
  }

  Params<float> params = init_params(features.cols, rng);
  Adam adam;
  adam.m.zeros_like(params);
  adam.v.zeros_like(params);
  Params<float> grad, best = params;
  grad.zeros_like(params);
  Work<float> work;
  Mat<float> x;
  std::vector<float> y;
  const auto batch = static_cast<std::size_t>(options.batch_size);
  const auto decay = static_cast<float>(options.weight_decay);
  double best_loss = std::numeric_limits<double>::infinity();
  std::int32_t best_epoch = 0, epoch = 0;

  while (epoch < options.epochs) {
    ++epoch;
    rng.shuffle(train_rows);
    for (std::size_t begin = 0; begin < train_rows.size(); begin += batch) {
      const std::span<const std::int64_t> rows =
          std::span<const std::int64_t>(train_rows).subspan(begin, std::min(batch, train_rows.size() - begin));
      gather(features, rows, x);
      y.resize(rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) y[i] = labels[static_cast<std::size_t>(rows[i])];
      forward(params, options.gelu, x, work);
      if (!std::isfinite(loss_sum(work.logit, y.data()))) {
        return invalid_argument("train_src_head: the loss diverged in epoch " + std::to_string(epoch) +
                                " (lower the learning rate)");
      }
      backward(params, options.gelu, x, y.data(), decay, work, grad);
      adam.apply(params, grad, options.learning_rate);
    }
    if (!holdout) continue;
    const Evaluation e = evaluate(params, options.gelu, features, validation_rows, labels);
    if (!e.finite) return invalid_argument("train_src_head: the held-out logits diverged (lower the learning rate)");
    if (e.loss < best_loss) {
      best_loss = e.loss;
      best_epoch = epoch;
      if (options.patience > 0) best = params;
    } else if (options.patience > 0 && epoch - best_epoch >= options.patience) {
      break;
    }
  }
  if (holdout && options.patience > 0) {
    params = std::move(best);
  } else {
    best_epoch = epoch;
  }

  const Evaluation train_eval = evaluate(params, options.gelu, features, train_rows, labels);
  if (!train_eval.finite) return invalid_argument("train_src_head: the final logits are not finite");
  if (report != nullptr) {
    SrcHeadTrainReport r;
    r.train_loss = train_eval.loss;
    r.train_auc = train_eval.auc;
    r.validation_loss = r.validation_auc = std::numeric_limits<double>::quiet_NaN();
    if (holdout) {
      const Evaluation v = evaluate(params, options.gelu, features, validation_rows, labels);
      r.validation_loss = v.loss;
      r.validation_auc = v.auc;
    }
    r.epochs_run = epoch;
    r.best_epoch = best_epoch;
    r.train_rows = static_cast<std::int64_t>(train_rows.size());
    r.validation_rows = static_cast<std::int64_t>(validation_rows.size());
    *report = r;
  }
  out = to_weights(params);
  return Status::success();
}

namespace detail {

double src_head_loss_f64(const SrcHeadParamsF64& params, Gelu gelu_mode, std::span<const double> x,
                         std::span<const std::uint8_t> y, double weight_decay, SrcHeadParamsF64* grad) {
  const Eigen::Index h = params.hidden, inner = params.hidden / 4;
  const auto rows = static_cast<Eigen::Index>(y.size());
  const auto uh = static_cast<std::size_t>(h), ui = static_cast<std::size_t>(inner);
  if (h < 4 || rows == 0 || params.w1.size() != ui * uh || params.b1.size() != ui || params.w2.size() != ui ||
      x.size() != y.size() * uh) {
    return std::numeric_limits<double>::quiet_NaN();  // sizes that do not match: nothing to evaluate
  }
  Params<double> p;
  p.w1 = Eigen::Map<const Mat<double>>(params.w1.data(), inner, h);
  p.b1 = Eigen::Map<const Vec<double>>(params.b1.data(), inner);
  p.w2 = Eigen::Map<const Vec<double>>(params.w2.data(), inner);
  p.b2 = params.b2;
  const Mat<double> xs = Eigen::Map<const Mat<double>>(x.data(), rows, h);
  std::vector<double> yd(y.begin(), y.end());
  Work<double> w;
  forward(p, gelu_mode, xs, w);
  const double loss = loss_sum(w.logit, yd.data()) / static_cast<double>(rows) +
                      0.5 * weight_decay * (p.w1.squaredNorm() + p.w2.squaredNorm());
  if (grad != nullptr) {
    Params<double> g;
    backward(p, gelu_mode, xs, yd.data(), weight_decay, w, g);
    grad->hidden = params.hidden;
    grad->w1.assign(g.w1.data(), g.w1.data() + g.w1.size());
    grad->b1.assign(g.b1.data(), g.b1.data() + g.b1.size());
    grad->w2.assign(g.w2.data(), g.w2.data() + g.w2.size());
    grad->b2 = g.b2;
  }
  return loss;
}

}  // namespace detail

}  // namespace clm
