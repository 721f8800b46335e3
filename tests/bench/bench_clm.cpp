// bench_clm: the CLM model side on the CPU against baselines measured in the
// same run, single-threaded (as the head runs inside one host thread). One JSON
// object per figure:
//   clm/head_b{64,512}         SrcHead::score over 64 / 512 sequences, one new
//                              attention-output row each (a decode step of the
//                              batch), hidden 4096: value = the head's GEMM
//                              FLOP (2 x batch x 4096 x 1024) / time of the
//                              whole call (validation, masked means, GEMM,
//                              GELU, sigmoid); baseline = Eigen's f32 GEMM at
//                              the same shape ([batch x 4096] x [4096 x 1024]),
//                              this file compiled with -mavx2 -mfma
//   clm/step_b64               Engine::src_step (running means + head + gate)
//                              for 64 running sequences, same baseline
//   clm/head_gemv_b1_{warm,cold}
//                              one decode step of one sequence: value = bytes
//                              of W1 (16 MiB) / time of score_pooled; baseline
//                              = bytes / time of one AVX2 read pass over the
//                              same W1 buffer. cold: a 256 MiB buffer is read
//                              before each timed run (of both), so W1 comes
//                              from DRAM as it would between a model's layers
//   clm/project_b64            SnapshotProjection::project of 64 hidden rows to
//                              snapshot_dim 256 (centre, GEMM, L2-normalise):
//                              value = GEMM FLOP / time; baseline = Eigen's
//                              GEMM [64 x 4096] x [4096 x 256]
//   clm/inject_b64             SnapshotAdapter::inject_batch of 64 snapshots
//                              into one row each (a decode step): value = GEMM
//                              FLOP / time; baseline = Eigen's GEMM
//                              [64 x 256] x [256 x 4096]
// Every figure is the median of kRuns runs, candidate and baseline interleaved.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <Eigen/Dense>

#include "bench_common.hpp"
#include "clm/engine.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_head.hpp"
#include "read_pass.hpp"

namespace {

using clm_bench::check;
using clm_bench::Clock;
using clm_bench::die;
using clm_bench::interleaved_medians;
using clm_bench::PairedMedians;
using clm_bench::print_figure;
using clm_bench::read_pass;
using clm_bench::seconds_since;

constexpr std::string_view kBench = "clm";
constexpr int kRuns = 15;
constexpr std::int32_t kHidden = 4096;
constexpr std::int32_t kInner = kHidden / 4;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::vector<float> random_floats(std::size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

clm::SrcHeadWeights random_weights(std::mt19937& rng) {
  clm::SrcHeadWeights w;
  w.hidden = kHidden;
  w.w1 = random_floats(static_cast<std::size_t>(kInner) * kHidden, 1.0f / 64.0f, rng);
  w.b1 = random_floats(kInner, 0.1f, rng);
  w.w2 = random_floats(kInner, 1.0f / 32.0f, rng);
  w.b2 = 0.1f;
  return w;
}

// Eigen's GEMM at the head's shape, on its own copy of the weights.
struct EigenBaseline {
  RowMatrix x, w, z;
  EigenBaseline(int batch, std::mt19937& rng)
      : x(RowMatrix::Random(batch, kHidden)), w(RowMatrix::Random(kInner, kHidden)), z(batch, kInner) {
    (void)rng;
  }
  double seconds() {
    const auto start = Clock::now();
    z.noalias() = x * w.transpose();
    return seconds_since(start);
  }
};

void bench_head_batch(const clm::SrcHead& head, int batch, std::mt19937& rng) {
  const std::vector<float> attn = random_floats(static_cast<std::size_t>(batch) * kHidden, 1.0f, rng);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch), 17), indptr(static_cast<std::size_t>(batch) + 1);
  std::iota(indptr.begin(), indptr.end(), 0);
  const std::int32_t special[] = {128009};
  std::vector<float> scores(static_cast<std::size_t>(batch));
  EigenBaseline gemm(batch, rng);
  const PairedMedians t = interleaved_medians(
      kRuns,
      [&] {
        const auto start = Clock::now();
        check(head.score(attn, ids, indptr, special, scores));
        return seconds_since(start);
      },
      [&] { return gemm.seconds(); });
  const double flop = 2.0 * batch * kHidden * kInner;
  print_figure(kBench, fmt::format("head_b{}", batch), "gemm_rate", flop / t.part / 1e9, "GFLOP/s", "eigen_gemm_rate",
               flop / t.baseline / 1e9);
}

void bench_engine_step(std::shared_ptr<const clm::SrcHead> head, int batch, std::mt19937& rng) {
  clm::EngineConfig config;
  config.pool.num_pages = 4096;
  config.pool.page_size = 16;
  config.pool.memory = clm::MemoryKind::none;
  config.special_token_ids = {128009};
  std::unique_ptr<clm::Engine> engine;
  check(clm::Engine::create(config, engine));
  engine->set_src_head(std::move(head));
  std::vector<clm::SequenceId> ids;
  for (int i = 0; i < batch; ++i) {
    clm::Admission a;
    const std::vector<std::int32_t> prompt = {i, 1, 2, 3};
    check(engine->admit(prompt, {}, a));
    ids.push_back(a.seq);
  }
  const std::vector<float> attn = random_floats(static_cast<std::size_t>(batch) * kHidden, 1.0f, rng);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch), 17), indptr(static_cast<std::size_t>(batch) + 1);
  std::iota(indptr.begin(), indptr.end(), 0);
  std::vector<clm::SrcDecision> decisions(static_cast<std::size_t>(batch));
  const clm::ConstActivationView view{attn.data(), clm::ActDType::f32, batch, kHidden};
  EigenBaseline gemm(batch, rng);
  const PairedMedians t = interleaved_medians(
      kRuns,
      [&] {
        const auto start = Clock::now();
        check(engine->src_step(ids, view, tokens, indptr, decisions));
        return seconds_since(start);
      },
      [&] { return gemm.seconds(); });
  const double flop = 2.0 * batch * kHidden * kInner;
  print_figure(kBench, fmt::format("step_b{}", batch), "gemm_rate", flop / t.part / 1e9, "GFLOP/s", "eigen_gemm_rate",
               flop / t.baseline / 1e9);
}

void bench_gemv(const clm::SrcHead& head, bool cold, std::mt19937& rng) {
  const std::vector<float> mean = random_floats(kHidden, 1.0f, rng);
  std::vector<float> score(1);
  const std::vector<float>& w1 = head.weights().w1;  // the very buffer the head reads
  std::vector<float> flush(cold ? (std::size_t{256} << 20) / sizeof(float) : 0, 1.0f);
  float sink = 0.0f;
  const PairedMedians t = interleaved_medians(
      kRuns,
      [&] {
        if (cold) sink += read_pass(flush.data(), flush.size());
        const auto start = Clock::now();
        check(head.score_pooled(mean, score));
        return seconds_since(start);
      },
      [&] {
        if (cold) sink += read_pass(flush.data(), flush.size());
        const auto start = Clock::now();
        sink += read_pass(w1.data(), w1.size());
        return seconds_since(start);
      });
  if (!std::isfinite(sink)) die("read pass gave a non-finite sum");
  const double bytes = static_cast<double>(w1.size() * sizeof(float));
  print_figure(kBench, cold ? "head_gemv_b1_cold" : "head_gemv_b1_warm", "weight_bandwidth", bytes / t.part / 1e9,
               "GB/s", "weight_read_bandwidth", bytes / t.baseline / 1e9);
}

// Eigen's GEMM C [m x n] = A [m x k] B [n x k]^T, the shape of a CLM part.
double eigen_gemm_seconds(RowMatrix& c, const RowMatrix& a, const RowMatrix& b) {
  const auto start = Clock::now();
  c.noalias() = a * b.transpose();
  return seconds_since(start);
}

constexpr std::int32_t kSnapshotDim = 256;

void bench_projection(int batch, std::mt19937& rng) {
  // Orthonormal components: the QR of a random matrix.
  const RowMatrix random = RowMatrix::Random(kHidden, kSnapshotDim);
  const Eigen::MatrixXf q =
      Eigen::HouseholderQR<Eigen::MatrixXf>(random).householderQ() * Eigen::MatrixXf::Identity(kHidden, kSnapshotDim);
  clm::SnapshotProjectionWeights w;
  w.hidden = kHidden;
  w.snapshot_dim = kSnapshotDim;
  w.mean = random_floats(kHidden, 0.1f, rng);
  w.components.resize(static_cast<std::size_t>(kHidden) * kSnapshotDim);
  for (int k = 0; k < kSnapshotDim; ++k) {
    for (int c = 0; c < kHidden; ++c) w.components[static_cast<std::size_t>(k) * kHidden + c] = q(c, k);
  }
  std::unique_ptr<clm::SnapshotProjection> projection;
  check(clm::SnapshotProjection::create(std::move(w), projection));
  const std::vector<float> rows = random_floats(static_cast<std::size_t>(batch) * kHidden, 1.0f, rng);
  std::vector<float> out(static_cast<std::size_t>(batch) * kSnapshotDim);
  RowMatrix a = RowMatrix::Random(batch, kHidden), b = RowMatrix::Random(kSnapshotDim, kHidden), c(batch, kSnapshotDim);
  const PairedMedians t = interleaved_medians(
      kRuns,
      [&] {
        const auto start = Clock::now();
        check(projection->project(clm::ConstActivationView{rows.data(), clm::ActDType::f32, batch, kHidden}, out));
        return seconds_since(start);
      },
      [&] { return eigen_gemm_seconds(c, a, b); });
  const double flop = 2.0 * batch * kHidden * kSnapshotDim;
  print_figure(kBench, fmt::format("project_b{}", batch), "gemm_rate", flop / t.part / 1e9, "GFLOP/s",
               "eigen_gemm_rate", flop / t.baseline / 1e9);
}

void bench_inject(int batch, std::mt19937& rng) {
  clm::SnapshotAdapterWeights w;
  w.snapshot_dim = kSnapshotDim;
  w.hidden = kHidden;
  w.weight = random_floats(static_cast<std::size_t>(kHidden) * kSnapshotDim, 1.0f / 16.0f, rng);
  w.bias = random_floats(kHidden, 0.1f, rng);
  clm::SnapshotAdapterConfig config;
  config.num_layers = 32;
  std::unique_ptr<clm::SnapshotAdapter> adapter;
  check(clm::SnapshotAdapter::create(std::move(w), config, adapter));
  std::vector<float> hidden = random_floats(static_cast<std::size_t>(batch) * kHidden, 1.0f, rng);
  const std::vector<float> snapshots = random_floats(static_cast<std::size_t>(batch) * kSnapshotDim, 0.06f, rng);
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(batch) + 1);
  std::iota(indptr.begin(), indptr.end(), 0);
  const std::vector<std::uint8_t> apply(static_cast<std::size_t>(batch), 1);
  RowMatrix a = RowMatrix::Random(batch, kSnapshotDim), b = RowMatrix::Random(kHidden, kSnapshotDim), c(batch, kHidden);
  const PairedMedians t = interleaved_medians(
      kRuns,
      [&] {
        const auto start = Clock::now();
        check(adapter->inject_batch(clm::ActivationView{hidden.data(), clm::ActDType::f32, batch, kHidden}, indptr,
                                    snapshots, apply, 31));
        return seconds_since(start);
      },
      [&] { return eigen_gemm_seconds(c, a, b); });
  const double flop = 2.0 * batch * kHidden * kSnapshotDim;
  print_figure(kBench, fmt::format("inject_b{}", batch), "gemm_rate", flop / t.part / 1e9, "GFLOP/s", "eigen_gemm_rate",
               flop / t.baseline / 1e9);
}

}  // namespace

int main() {
  std::mt19937 rng(std::random_device{}());
  std::unique_ptr<clm::SrcHead> owned;
  check(clm::SrcHead::create(random_weights(rng), clm::Gelu::tanh, owned));
  std::shared_ptr<const clm::SrcHead> head(std::move(owned));
  bench_head_batch(*head, 64, rng);
  bench_head_batch(*head, 512, rng);
  bench_engine_step(head, 64, rng);
  bench_gemv(*head, false, rng);
  bench_gemv(*head, true, rng);
  bench_projection(64, rng);
  bench_inject(64, rng);
  return 0;
}
