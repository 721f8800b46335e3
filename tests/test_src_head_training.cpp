// Tests of SRC head training (include/clm/model/src_head_training.hpp): the backward
// pass against finite differences, learning a known synthetic task, agreement
// with clm::SrcHead, determinism, roc_auc against pair counting, bad inputs.
// Fresh random data each run (the seed is printed on failure).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "clm/detail/half.hpp"
#include "clm/model/src_head.hpp"
#include "clm/model/src_head_training.hpp"

namespace {

std::uint32_t fresh_seed() { return std::random_device{}(); }

// O(n^2) AUC by definition: positive-negative pairs ordered right, ties half.
double pair_count_auc(const std::vector<float>& scores, const std::vector<std::uint8_t>& labels) {
  double good = 0.0, pairs = 0.0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] != 1) continue;
    for (std::size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0) continue;
      pairs += 1.0;
      good += scores[i] > scores[j] ? 1.0 : (scores[i] == scores[j] ? 0.5 : 0.0);
    }
  }
  return good / pairs;
}

std::vector<float> unit_vector(int dim, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(dim));
  double norm = 0.0;
  for (float& x : v) {
    x = n(rng);
    norm += static_cast<double>(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

// label = [v . x + a (u . x)^2 > t], x ~ N(0, I): a known non-linear function
// of the features, which the head can only fit through its GELU layer.
struct Task {
  int hidden;
  std::vector<float> v, u;
  float a = 1.0f, t = 1.0f;

  Task(int h, std::mt19937& rng) : hidden(h), v(unit_vector(h, rng)), u(unit_vector(h, rng)) {}

  void sample(std::size_t rows, std::mt19937& rng, std::vector<float>& x, std::vector<std::uint8_t>& y) const {
    std::normal_distribution<float> n(0.0f, 1.0f);
    const auto h = static_cast<std::size_t>(hidden);
    x.resize(rows * h);
    y.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      double pv = 0.0, pu = 0.0;
      for (std::size_t c = 0; c < h; ++c) {
        const float value = n(rng);
        x[r * h + c] = value;
        pv += static_cast<double>(v[c]) * value;
        pu += static_cast<double>(u[c]) * value;
      }
      y[r] = pv + a * pu * pu > t ? 1 : 0;
    }
  }
};

clm::ConstActivationView view_of(const std::vector<float>& x, int hidden) {
  return clm::ConstActivationView::f32(x, static_cast<std::int64_t>(x.size()) / hidden, hidden);
}

clm::SrcHeadWeights train(const std::vector<float>& x, const std::vector<std::uint8_t>& y, int hidden,
                          const clm::SrcHeadTrainOptions& options, clm::SrcHeadTrainReport* report = nullptr) {
  clm::SrcHeadWeights w;
  const clm::Status s = clm::train_src_head(view_of(x, hidden), y, options, w, report);
  INFO(s.message());
  REQUIRE(s.ok());
  return w;
}

// Scores from clm::SrcHead: each row is a one-token sequence, its own mean.
std::vector<float> head_scores(const clm::SrcHeadWeights& w, clm::Gelu gelu, const std::vector<float>& x) {
  std::unique_ptr<clm::SrcHead> head;
  REQUIRE(clm::SrcHead::create(w, gelu, head).ok());
  const std::size_t rows = x.size() / static_cast<std::size_t>(w.hidden);
  std::vector<std::int32_t> ids(rows, 7), indptr(rows + 1);
  for (std::size_t i = 0; i <= rows; ++i) indptr[i] = static_cast<std::int32_t>(i);
  std::vector<float> scores(rows);
  const clm::Status s = head->score(std::span<const float>(x), ids, indptr, {}, scores);
  INFO(s.message());
  REQUIRE(s.ok());
  return scores;
}

}  // namespace

TEST_CASE("SRC head training: the backward pass matches central finite differences (f64)") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  const int hidden = 8, inner = 2, rows = 7;
  std::vector<double> x(static_cast<std::size_t>(rows * hidden));
  for (double& v : x) v = n(rng);
  std::vector<std::uint8_t> y = {1, 0, 0, 1, 1, 0, 1};
  for (clm::Gelu gelu : {clm::Gelu::tanh, clm::Gelu::erf}) {
    for (double decay : {0.0, 0.3}) {
      INFO("gelu " << (gelu == clm::Gelu::tanh ? "tanh" : "erf") << ", weight decay " << decay);
      clm::detail::SrcHeadParamsF64 p;
      p.hidden = hidden;
      p.w1.resize(inner * hidden);
      p.b1.resize(inner);
      p.w2.resize(inner);
      for (double& v : p.w1) v = 0.6 * n(rng);
      for (double& v : p.b1) v = 0.5 * n(rng);
      for (double& v : p.w2) v = n(rng);
      p.b2 = 0.5 * n(rng);
      clm::detail::SrcHeadParamsF64 grad;
      clm::detail::src_head_loss_f64(p, gelu, x, y, decay, &grad);

      // Every parameter, nudged both ways.
      std::vector<std::pair<double*, double>> params;
      for (std::size_t i = 0; i < p.w1.size(); ++i) params.emplace_back(&p.w1[i], grad.w1[i]);
      for (std::size_t i = 0; i < p.b1.size(); ++i) params.emplace_back(&p.b1[i], grad.b1[i]);
      for (std::size_t i = 0; i < p.w2.size(); ++i) params.emplace_back(&p.w2[i], grad.w2[i]);
      params.emplace_back(&p.b2, grad.b2);
      REQUIRE(params.size() == static_cast<std::size_t>(inner * hidden + 2 * inner + 1));
      const double eps = 1e-6;
      for (std::size_t k = 0; k < params.size(); ++k) {
        double* value = params[k].first;
        const double saved = *value;
        *value = saved + eps;
        const double up = clm::detail::src_head_loss_f64(p, gelu, x, y, decay, nullptr);
        *value = saved - eps;
        const double down = clm::detail::src_head_loss_f64(p, gelu, x, y, decay, nullptr);
        *value = saved;
        const double numeric = (up - down) / (2.0 * eps);
        INFO("parameter " << k << ": analytic " << params[k].second << ", numeric " << numeric);
        CHECK(std::abs(numeric - params[k].second) <= 1e-8 + 1e-6 * std::abs(numeric));
      }
    }
  }
}

TEST_CASE("SRC head training learns a known non-linear task (SrcHead scores held-out data with AUC >= 0.95)") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& [hidden, gelu] : {std::pair{64, clm::Gelu::tanh}, std::pair{128, clm::Gelu::erf}}) {
    INFO("hidden " << hidden);
    const Task task(hidden, rng);
    std::vector<float> x, x_test;
    std::vector<std::uint8_t> y, y_test;
    task.sample(8000, rng, x, y);
    task.sample(1500, rng, x_test, y_test);

    clm::SrcHeadTrainOptions options;
    options.gelu = gelu;
    options.epochs = 40;
    options.learning_rate = 3e-3;
    options.holdout_fraction = 0.1;
    options.patience = 5;
    options.seed = rng();
    clm::SrcHeadTrainReport report;
    const clm::SrcHeadWeights w = train(x, y, hidden, options, &report);
    INFO("epochs " << report.epochs_run << " (best " << report.best_epoch << "), train loss " << report.train_loss
                   << " auc " << report.train_auc << ", validation loss " << report.validation_loss << " auc "
                   << report.validation_auc);
    CHECK(report.epochs_run >= 1);
    CHECK(report.epochs_run <= options.epochs);
    CHECK(report.best_epoch >= 1);
    CHECK(report.best_epoch <= report.epochs_run);
    CHECK(report.train_rows + report.validation_rows == 8000);
    CHECK(std::abs(static_cast<double>(report.validation_rows) - 800.0) <= 1.0);
    CHECK(report.validation_auc >= 0.95);
    CHECK(report.train_loss < std::log(2.0));  // better than a constant 0.5

    const std::vector<float> scores = head_scores(w, gelu, x_test);
    const double auc = clm::roc_auc(scores, y_test);
    INFO("held-out AUC " << auc);
    CHECK(auc >= 0.95);
    CHECK(std::abs(auc - pair_count_auc(scores, y_test)) <= 1e-12);

    // SrcHead and the trainer's own forward pass agree.
    std::vector<float> own(scores.size());
    REQUIRE(clm::predict_src_head(w, gelu, view_of(x_test, hidden), own).ok());
    for (std::size_t i = 0; i < own.size(); ++i) {
      INFO("row " << i << ": SrcHead " << scores[i] << ", trainer " << own[i]);
      REQUIRE(std::abs(own[i] - scores[i]) <= 1e-6f + 1e-5f * scores[i]);
    }
  }
}

TEST_CASE("roc_auc equals pair counting, ties counted half") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int levels : {2, 5, 1000000}) {  // few levels: many ties
    std::uniform_int_distribution<int> level(0, levels - 1);
    std::bernoulli_distribution positive(0.3);
    std::vector<float> scores(500);
    std::vector<std::uint8_t> labels(500);
    for (std::size_t i = 0; i < scores.size(); ++i) {
      labels[i] = positive(rng) ? 1 : 0;
      scores[i] = static_cast<float>(level(rng) + (labels[i] ? levels / 3 : 0));
    }
    INFO("levels " << levels);
    CHECK(std::abs(clm::roc_auc(scores, labels) - pair_count_auc(scores, labels)) <= 1e-12);
  }
  const std::vector<float> s = {0.1f, 0.4f, 0.35f, 0.8f};
  CHECK(clm::roc_auc(s, std::vector<std::uint8_t>{0, 0, 1, 1}) == Approx(0.75));
  CHECK(clm::roc_auc(std::vector<float>{0.5f, 0.5f}, std::vector<std::uint8_t>{0, 1}) == 0.5);
  CHECK(std::isnan(clm::roc_auc(s, std::vector<std::uint8_t>{1, 1, 1, 1})));
  CHECK(std::isnan(clm::roc_auc(s, std::vector<std::uint8_t>{0, 1, 1})));
  CHECK(std::isnan(clm::roc_auc(s, std::vector<std::uint8_t>{0, 2, 1, 1})));
}

TEST_CASE("SRC head training is deterministic for a seed, and reads f16/bf16 features as their f32 values") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int hidden = 32;
  const Task task(hidden, rng);
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  task.sample(600, rng, x, y);
  clm::SrcHeadTrainOptions options;
  options.epochs = 3;
  options.batch_size = 50;
  options.holdout_fraction = 0.2;
  options.weight_decay = 1e-3;
  options.seed = rng();
  clm::SrcHeadTrainReport r1, r2;
  const clm::SrcHeadWeights a = train(x, y, hidden, options, &r1);
  const clm::SrcHeadWeights b = train(x, y, hidden, options, &r2);
  CHECK(a.w1 == b.w1);
  CHECK(a.b1 == b.b1);
  CHECK(a.w2 == b.w2);
  CHECK(a.b2 == b.b2);
  CHECK(r1.train_loss == r2.train_loss);
  CHECK(r1.validation_auc == r2.validation_auc);
  options.seed += 1;
  const clm::SrcHeadWeights c = train(x, y, hidden, options);
  CHECK(c.w1 != a.w1);

  // A bf16 view trains exactly as the f32 view of the bf16-rounded values.
  std::vector<std::uint16_t> bf16(x.size());
  std::vector<float> rounded(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    bf16[i] = clm::detail::f32_to_bf16(x[i]);
    rounded[i] = clm::detail::bf16_to_f32(bf16[i]);
  }
  clm::SrcHeadWeights from_bf16;
  const clm::ConstActivationView view{bf16.data(), clm::ActDType::bf16, 600, hidden};
  REQUIRE(clm::train_src_head(view, y, options, from_bf16).ok());
  const clm::SrcHeadWeights from_rounded = train(rounded, y, hidden, options);
  CHECK(from_bf16.w1 == from_rounded.w1);
  CHECK(from_bf16.b2 == from_rounded.b2);
}

TEST_CASE("SRC head training: bad inputs give invalid_argument and leave the outputs untouched") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int hidden = 16;
  const Task task(hidden, rng);
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  task.sample(200, rng, x, y);

  clm::SrcHeadWeights sentinel;
  sentinel.hidden = -5;
  clm::SrcHeadTrainReport report_sentinel;
  report_sentinel.epochs_run = -9;
  auto refused = [&](clm::ConstActivationView features, const std::vector<std::uint8_t>& labels,
                     const clm::SrcHeadTrainOptions& options) {
    clm::SrcHeadWeights out = sentinel;
    clm::SrcHeadTrainReport report = report_sentinel;
    const clm::Status s = clm::train_src_head(features, labels, options, out, &report);
    INFO(s.message());
    return s.code() == clm::StatusCode::invalid_argument && !s.message().empty() && out.hidden == -5 &&
           out.w1.empty() && report.epochs_run == -9;
  };
  const clm::SrcHeadTrainOptions good;
  const auto view = view_of(x, hidden);

  SECTION("data") {
    std::vector<float> nan_x = x;
    nan_x[std::uniform_int_distribution<std::size_t>(0, x.size() - 1)(rng)] = std::numeric_limits<float>::quiet_NaN();
    CHECK(refused(view_of(nan_x, hidden), y, good));
    std::vector<float> inf_x = x;
    inf_x[3] = std::numeric_limits<float>::infinity();
    CHECK(refused(view_of(inf_x, hidden), y, good));
    std::vector<std::uint8_t> bad_y = y;
    bad_y[5] = 2;
    CHECK(refused(view, bad_y, good));
    CHECK(refused(view, std::vector<std::uint8_t>(y.begin(), y.end() - 1), good));
    CHECK(refused(view, std::vector<std::uint8_t>(y.size(), 1), good));
    CHECK(refused(view, std::vector<std::uint8_t>(y.size(), 0), good));
    CHECK(refused(clm::ConstActivationView::f32(x, 1, hidden), {1}, good));
    CHECK(refused(clm::ConstActivationView::f32(x, 40, 6), std::vector<std::uint8_t>(y.begin(), y.begin() + 40), good));
    CHECK(refused(clm::ConstActivationView{nullptr, clm::ActDType::f32, 200, hidden}, y, good));
    // One positive: a 0.5 holdout leaves the training rows without one.
    std::vector<std::uint8_t> one_positive(y.size(), 0);
    one_positive[17] = 1;
    clm::SrcHeadTrainOptions held = good;
    held.holdout_fraction = 0.5;
    CHECK(refused(view, one_positive, held));
  }
  SECTION("options") {
    std::vector<clm::SrcHeadTrainOptions> bad(9, good);
    bad[0].epochs = 0;
    bad[1].batch_size = 0;
    bad[2].learning_rate = 0.0;
    bad[3].learning_rate = std::numeric_limits<double>::quiet_NaN();
    bad[4].weight_decay = -1e-4;
    bad[5].holdout_fraction = 1.0;
    bad[6].holdout_fraction = -0.1;
    bad[7].patience = -1;
    bad[8].gelu = static_cast<clm::Gelu>(7);
    for (std::size_t i = 0; i < bad.size(); ++i) {
      INFO("bad option set " << i);
      CHECK(refused(view, y, bad[i]));
    }
  }
  SECTION("predict_src_head") {
    clm::SrcHeadWeights w = train(x, y, hidden, good);
    std::vector<float> scores(200, -1.0f);
    CHECK(clm::predict_src_head(w, clm::Gelu::tanh, view, std::span(scores).first(199)).code() ==
          clm::StatusCode::invalid_argument);
    CHECK(clm::predict_src_head(w, clm::Gelu::tanh, clm::ConstActivationView::f32(x, 100, 32),
                                std::span(scores).first(100))
              .code() == clm::StatusCode::invalid_argument);
    w.b1.pop_back();
    CHECK(clm::predict_src_head(w, clm::Gelu::tanh, view, scores).code() == clm::StatusCode::invalid_argument);
    CHECK(scores == std::vector<float>(200, -1.0f));
  }
}
