// The SRC running mean on a GPU (SrcTracker::step_device over
// clm::cuda::CudaSrcSums): a device tracker and a CPU tracker (the reference)
// step the same sequences in lockstep on fresh random data, sequences joining
// and leaving between steps, with prefill-sized and decode-sized steps,
// special tokens, a NaN step (refused by both, nothing committed), breaker
// reports, and head replacements (same width: the sums stay; another width:
// they reset). A float64 model of every sequence's history checks both. Then
// the Engine's entry point and the bad input a GPU host can give.
//
// Built into test_cuda_clm (SKIPPED without a GPU) and test_cuda_clm_emulated
// (the fake CUDA runtime, fake cuBLAS and the CPU emulator).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "clm/device/cuda_clm.hpp"
#include "clm/engine.hpp"
#include "clm/model/src_tracker.hpp"
#include "gpu_test_support.hpp"
#include "kernel_reference.hpp"

namespace {

using clm::ActDType;
using clm::StatusCode;
using clm_test::kFull;
using clm_test::skip_without_gpu;
using SeqId = clm::SrcTracker::SeqId;

// A device copy of host bytes.
struct DeviceCopy {
  void* p = nullptr;
  explicit DeviceCopy(const void* host, std::size_t n) {
    CLM_CUDA_OK(cudaMalloc(&p, std::max<std::size_t>(n, 16)));
    if (n) CLM_CUDA_OK(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(p); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CLM_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

std::shared_ptr<const clm::SrcHead> random_head(std::int32_t hidden, clm::Gelu gelu, std::mt19937_64& rng) {
  clm::SrcHeadWeights w;
  w.hidden = hidden;
  const auto inner = static_cast<std::size_t>(hidden / 4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float s1 = 2.0f / std::sqrt(static_cast<float>(hidden));
  const float s2 = 3.0f / std::sqrt(static_cast<float>(inner));
  for (std::size_t i = 0; i < inner * static_cast<std::size_t>(hidden); ++i) w.w1.push_back(s1 * u(rng));
  for (std::size_t i = 0; i < inner; ++i) w.b1.push_back(0.2f * u(rng));
  for (std::size_t i = 0; i < inner; ++i) w.w2.push_back(s2 * u(rng));
  w.b2 = 0.1f;
  std::unique_ptr<clm::SrcHead> head;
  REQUIRE(clm::SrcHead::create(w, gelu, head).ok());
  return std::shared_ptr<const clm::SrcHead>(std::move(head));
}

// float64 model: the head on the mean of every non-special row so far.
double reference_score(const clm::SrcHead& head, const std::vector<std::vector<double>>& rows) {
  const clm::SrcHeadWeights& w = head.weights();
  const auto h = static_cast<std::size_t>(w.hidden);
  std::vector<double> mean(h, 0.0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < h; ++c) mean[c] += r[c];
  }
  for (double& m : mean) m /= static_cast<double>(rows.size());
  double logit = w.b2;
  for (std::size_t j = 0; j < h / 4; ++j) {
    double z = w.b1[j];
    for (std::size_t c = 0; c < h; ++c) z += static_cast<double>(w.w1[j * h + c]) * mean[c];
    const double g = head.gelu() == clm::Gelu::tanh
                         ? 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)))
                         : 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    logit += g * static_cast<double>(w.w2[j]);
  }
  return 1.0 / (1.0 + std::exp(-logit));
}

constexpr std::int32_t kSpecialA = 3;
constexpr std::int32_t kSpecialB = 7;

// One step's input: rows for each stepped sequence, in the dtype, on the host.
struct StepInput {
  ActDType dtype;
  std::int32_t hidden;
  std::vector<SeqId> ids;
  std::vector<std::int32_t> indptr;
  std::vector<std::int32_t> tokens;
  std::vector<unsigned char> bytes;
  std::vector<std::vector<double>> values;  // exact value of every row, as stored

  StepInput(ActDType d, std::int32_t h, std::vector<SeqId> seqs = {}, std::vector<std::int32_t> ptr = {0})
      : dtype(d), hidden(h), ids(std::move(seqs)), indptr(std::move(ptr)) {}

  void add_row(std::int32_t token, const std::vector<float>& row) {
    tokens.push_back(token);
    std::vector<double> exact(row.size());
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::uint32_t bits = clm_test::to_bits(dtype, row[c]);
      if (dtype == ActDType::f32) {
        const std::size_t at = bytes.size();
        bytes.resize(at + 4);
        std::memcpy(bytes.data() + at, &bits, 4);
        float f;
        std::memcpy(&f, &bits, 4);
        exact[c] = f;
      } else {
        const auto half = static_cast<std::uint16_t>(bits);
        const std::size_t at = bytes.size();
        bytes.resize(at + 2);
        std::memcpy(bytes.data() + at, &half, 2);
        exact[c] = dtype == ActDType::f16 ? clm::cuda::soft::f16_to_float(half) : clm::cuda::soft::bf16_to_float(half);
      }
    }
    values.push_back(std::move(exact));
  }
  clm::ConstActivationView host_view() const {
    return {bytes.data(), dtype, static_cast<std::int64_t>(tokens.size()), hidden};
  }
};

struct Lockstep {
  clm::SrcTracker cpu;
  clm::SrcTracker gpu;
  std::shared_ptr<clm::cuda::CudaSrcSums> sums;
  std::map<SeqId, std::vector<std::vector<double>>> history;  // non-special rows so far
  std::map<SeqId, bool> diverged;                             // a decision on the threshold's edge
  std::shared_ptr<const clm::SrcHead> head;
  Stream stream;
  int compared = 0;

  explicit Lockstep(const clm::SrcGateConfig& gate)
      : cpu(gate, {kSpecialA, kSpecialB}), gpu(gate, {kSpecialB, kSpecialA, kSpecialB}) {
    REQUIRE(clm::cuda::CudaSrcSums::create(0, sums).ok());
    gpu.set_device_sums(sums);
  }
  void set_head(std::shared_ptr<const clm::SrcHead> h) {
    if (!head || head->hidden() != h->hidden()) {
      for (auto& [id, rows] : history) rows.clear();
    }
    head = h;
    cpu.set_head(h);
    gpu.set_head(h);
  }
  void add(SeqId id) {
    cpu.add(id);
    gpu.add(id);
    history[id];
  }
  void remove(SeqId id) {
    cpu.remove(id);
    gpu.remove(id);
    history.erase(id);
    diverged.erase(id);
  }

  // Steps both; returns the GPU status (the CPU's must have the same code).
  clm::Status step(const StepInput& in) {
    std::vector<clm::SrcDecision> want(in.ids.size()), got(in.ids.size());
    const clm::Status cs = cpu.step(in.ids, in.host_view(), in.tokens, in.indptr, want);
    DeviceCopy dx(in.bytes.data(), in.bytes.size());
    DeviceCopy dt(in.tokens.data(), in.tokens.size() * sizeof(std::int32_t));
    const clm::ConstActivationView dview{dx.p, in.dtype, static_cast<std::int64_t>(in.tokens.size()), in.hidden};
    const clm::Status gs =
        gpu.step_device(in.ids, dview, static_cast<const std::int32_t*>(dt.p), in.indptr, got, stream.s);
    INFO("cpu: " << cs.message() << " | gpu: " << gs.message());
    REQUIRE(cs.code() == gs.code());
    if (!gs.ok()) return gs;
    for (std::size_t i = 0; i < in.ids.size(); ++i) {
      auto& rows = history[in.ids[i]];
      for (auto t = in.indptr[i]; t < in.indptr[i + 1]; ++t) {
        const std::int32_t tok = in.tokens[static_cast<std::size_t>(t)];
        if (tok != kSpecialA && tok != kSpecialB) rows.push_back(in.values[static_cast<std::size_t>(t)]);
      }
      INFO("sequence " << in.ids[i] << " after " << rows.size() << " rows");
      REQUIRE(got[i].scored == want[i].scored);
      REQUIRE(got[i].scored == (rows.empty() ? 0 : 1));
      CHECK(got[i].threshold == want[i].threshold);
      if (!got[i].scored) continue;
      const double ref = reference_score(*head, rows);
      CHECK(std::abs(got[i].score - ref) <= 2e-5);
      CHECK(std::abs(want[i].score - ref) <= 2e-5);
      CHECK(std::abs(got[i].score - want[i].score) <= 2e-5);
      ++compared;
      // The gate is the same host code in both: the decisions agree unless a
      // score sits on the threshold, after which the two breakers may differ.
      if (std::abs(want[i].score - want[i].threshold) < 1e-4f) diverged[in.ids[i]] = true;
      if (!diverged[in.ids[i]]) {
        CHECK(got[i].reuse == want[i].reuse);
        CHECK(got[i].baseline == want[i].baseline);
      }
    }
    // Failed lookups after some reuse decisions, the same on both sides.
    std::vector<SeqId> asked;
    std::vector<std::uint8_t> found;
    for (std::size_t i = 0; i < in.ids.size(); ++i) {
      if (want[i].reuse && got[i].reuse) {
        asked.push_back(in.ids[i]);
        found.push_back(static_cast<std::uint8_t>(in.ids[i] % 3 == 0 ? 1 : 0));
      }
    }
    REQUIRE(cpu.report_retrieval(asked, found).ok());
    REQUIRE(gpu.report_retrieval(asked, found).ok());
    return gs;
  }
};

std::vector<float> random_row(std::int32_t hidden, const std::vector<float>& offset, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> row(static_cast<std::size_t>(hidden));
  for (std::size_t c = 0; c < row.size(); ++c) row[c] = offset[c] + 0.5f * u(rng);
  return row;
}

void run_lockstep(ActDType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  INFO("dtype " << clm::kv_dtype_name(dtype) << " seed " << seed);
  clm::SrcGateConfig gate;
  gate.threshold_override = 0.5f;  // random heads score on both sides of it
  gate.breaker_steps = 3;
  gate.breaker_score = 0.0f;  // every failed lookup counts towards the breaker
  Lockstep ls(gate);
  const std::int32_t hidden = kFull ? 256 : 64;
  ls.set_head(random_head(hidden, clm::Gelu::tanh, rng));
  std::map<SeqId, std::vector<float>> offsets;  // each sequence drifts around its own point
  SeqId next_id = 1;
  const int steps = kFull ? 60 : 24;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    // sequences join (a prefill of up to 24 rows next) and leave
    const int joins = offsets.size() < 3 ? 3 : static_cast<int>(rng() % 3);
    std::vector<SeqId> fresh;
    for (int j = 0; j < joins; ++j) {
      const SeqId id = next_id++;
      ls.add(id);
      std::vector<float> off(static_cast<std::size_t>(ls.head->hidden()));
      for (float& x : off) x = u(rng);
      offsets[id] = off;
      fresh.push_back(id);
    }
    for (auto it = offsets.begin(); it != offsets.end();) {
      if (std::find(fresh.begin(), fresh.end(), it->first) == fresh.end() && rng() % 6 == 0) {
        ls.remove(it->first);
        it = offsets.erase(it);
      } else {
        ++it;
      }
    }
    // the head: replaced by one of the same width (sums stay), once by a wider one (they reset)
    if (step == steps / 3) ls.set_head(random_head(ls.head->hidden(), clm::Gelu::erf, rng));
    if (step == 2 * steps / 3) {
      ls.set_head(random_head(ls.head->hidden() + 4, clm::Gelu::tanh, rng));
      for (auto& [id, off] : offsets) off.resize(static_cast<std::size_t>(ls.head->hidden()), 0.25f);
    }
    StepInput in(dtype, ls.head->hidden());
    for (const auto& [id, off] : offsets) {
      if (rng() % 5 == 0) continue;  // not every sequence every step
      in.ids.push_back(id);
      const bool is_new = std::find(fresh.begin(), fresh.end(), id) != fresh.end();
      const int rows = is_new ? 1 + static_cast<int>(rng() % 24) : static_cast<int>(rng() % 3);
      for (int r = 0; r < rows; ++r) {
        const std::int32_t token = static_cast<std::int32_t>(rng() % 10);  // 3 and 7 are special
        std::vector<float> row = random_row(in.hidden, off, rng);
        if (token == kSpecialA || token == kSpecialB) std::fill(row.begin(), row.end(), 1000.0f);
        in.add_row(token, row);
      }
      in.indptr.push_back(static_cast<std::int32_t>(in.tokens.size()));
    }
    std::shuffle(in.ids.begin(), in.ids.end(), rng);  // any order of sequences in a step
    if (step % 7 == 5 && !in.tokens.empty()) {
      // a NaN (or Inf) in one row, special or not: both refuse, nothing is committed
      StepInput bad = in;
      const std::size_t row = rng() % bad.tokens.size();
      std::vector<float> poisoned(static_cast<std::size_t>(bad.hidden), 0.5f);
      poisoned[rng() % poisoned.size()] = step % 2 ? std::nanf("") : INFINITY;
      StepInput rebuilt(dtype, bad.hidden, bad.ids, bad.indptr);
      for (std::size_t t = 0; t < bad.tokens.size(); ++t) {
        std::vector<float> r(bad.values[t].begin(), bad.values[t].end());
        rebuilt.add_row(bad.tokens[t], t == row ? poisoned : r);
      }
      const clm::Status refused = ls.step(rebuilt);
      CHECK(refused.code() == StatusCode::invalid_argument);
      CHECK(refused.message().find("NaN or Inf") != std::string::npos);
    }
    REQUIRE(ls.step(in).ok());
  }
  CHECK(ls.compared > (kFull ? 100 : 30));
  const clm::SrcMetrics mc = ls.cpu.metrics(), mg = ls.gpu.metrics();
  CHECK(mg.steps == mc.steps);
  CHECK(mg.unscored_steps == mc.unscored_steps);
  CHECK(mg.tracked_sequences == mc.tracked_sequences);
  CHECK(ls.sums->device_bytes() > 0);
}

}  // namespace

TEST_CASE("CUDA SRC running mean equals the CPU tracker's, step by step", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::uint64_t seed = std::random_device{}();
  for (ActDType dtype : {ActDType::f32, ActDType::bf16, ActDType::f16}) run_lockstep(dtype, seed++);
}

TEST_CASE("CUDA SRC running mean: a sequence's sum lives on one side, and bad input is refused", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 rng(std::random_device{}());
  clm::SrcTracker tracker(clm::SrcGateConfig{}, {kSpecialA});
  const std::int32_t hidden = 64;
  const SeqId ids[] = {1, 2};
  std::vector<clm::SrcDecision> d(2);
  StepInput in(ActDType::f32, hidden, {1, 2});
  const std::vector<float> off(hidden, 0.1f);
  in.add_row(5, random_row(hidden, off, rng));
  in.indptr.push_back(1);
  in.add_row(6, random_row(hidden, off, rng));
  in.indptr.push_back(2);
  DeviceCopy dx(in.bytes.data(), in.bytes.size());
  DeviceCopy dt(in.tokens.data(), in.tokens.size() * sizeof(std::int32_t));
  const clm::ConstActivationView dview{dx.p, ActDType::f32, 2, hidden};
  const auto* dtok = static_cast<const std::int32_t*>(dt.p);
  Stream stream;

  tracker.add(1);
  tracker.add(2);
  // no device sums, then no head
  REQUIRE_ERROR(tracker.step_device(ids, dview, dtok, in.indptr, d, stream.s), StatusCode::failed_precondition,
                "device");
  std::shared_ptr<clm::cuda::CudaSrcSums> sums;
  REQUIRE_OK(clm::cuda::CudaSrcSums::create(0, sums));
  tracker.set_device_sums(sums);
  REQUIRE_ERROR(tracker.step_device(ids, dview, dtok, in.indptr, d, stream.s), StatusCode::failed_precondition,
                "no SRC head");
  tracker.set_head(random_head(hidden, clm::Gelu::tanh, rng));

  // host memory where device memory is expected: refused before any launch
  const clm::ConstActivationView host_view = in.host_view();
  REQUIRE_ERROR(tracker.step_device(ids, host_view, dtok, in.indptr, d, stream.s), StatusCode::invalid_argument,
                "device memory");
  REQUIRE_ERROR(tracker.step_device(ids, dview, in.tokens.data(), in.indptr, d, stream.s), StatusCode::invalid_argument,
                "token_ids");
  // a row count that runs past the buffer
  const clm::ConstActivationView too_long{dx.p, ActDType::f32, 3, hidden};
  const std::vector<std::int32_t> indptr3 = {0, 1, 3};
  REQUIRE_ERROR(tracker.step_device(ids, too_long, dtok, indptr3, d, stream.s), StatusCode::invalid_argument,
                "attn_out");
  // a head of another width than the rows
  const clm::ConstActivationView narrow{dx.p, ActDType::f32, 2, hidden / 2};
  REQUIRE_ERROR(tracker.step_device(ids, narrow, dtok, in.indptr, d, stream.s), StatusCode::invalid_argument,
                "attn_out");
  // an unknown sequence, one listed twice
  const SeqId unknown[] = {1, 9};
  REQUIRE_ERROR(tracker.step_device(unknown, dview, dtok, in.indptr, d, stream.s), StatusCode::not_found, "9");
  const SeqId twice[] = {1, 1};
  REQUIRE_ERROR(tracker.step_device(twice, dview, dtok, in.indptr, d, stream.s), StatusCode::invalid_argument, "twice");
  CHECK(tracker.metrics().steps == 0);
  // the device sums directly: special ids must come sorted and distinct, as the tracker keeps them
  {
    const clm::SrcSumRows rows[] = {{-1, 0}, {-1, 2}};
    const std::int64_t counts[] = {0, 0};
    std::int32_t added[2];
    float scores[2];
    const std::int32_t unsorted[] = {7, 3};
    REQUIRE_ERROR(sums->step(tracker.head(), rows, counts, dview, dtok, in.indptr, unsorted, added, scores, stream.s),
                  StatusCode::invalid_argument, "sorted and distinct");
    const std::int32_t repeated[] = {3, 3};
    REQUIRE_ERROR(sums->step(tracker.head(), rows, counts, dview, dtok, in.indptr, repeated, added, scores, stream.s),
                  StatusCode::invalid_argument, "sorted and distinct");
  }

  // a good step; then the host step refuses sequence 1, whose sum is on the device
  REQUIRE_OK(tracker.step_device(ids, dview, dtok, in.indptr, d, stream.s));
  CHECK(d[0].scored == 1);
  CHECK(d[1].scored == 1);
  std::vector<clm::SrcDecision> one(1);
  const SeqId first[] = {1};
  const std::vector<std::int32_t> indptr1 = {0, 1};
  const clm::ConstActivationView host_one{in.bytes.data(), ActDType::f32, 1, hidden};
  const std::vector<std::int32_t> tok1 = {5};
  REQUIRE_ERROR(tracker.step(first, host_one, tok1, indptr1, one), StatusCode::failed_precondition, "device");
  // and the other way round: a sequence stepped on the host is refused on the device
  tracker.add(3);
  const SeqId third[] = {3};
  REQUIRE_OK(tracker.step(third, host_one, tok1, indptr1, one));
  REQUIRE_ERROR(tracker.step_device(third, clm::ConstActivationView{dx.p, ActDType::f32, 1, hidden}, dtok, indptr1, one,
                                    stream.s),
                StatusCode::failed_precondition, "host");
  CHECK(tracker.metrics().steps == 3);

  // the Engine's entry point: refused without device sums, then routed to them
  clm::EngineConfig config;
  config.pool.num_pages = 8;
  config.pool.page_size = 4;
  config.pool.num_layers = 1;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.special_token_ids = {kSpecialA};
  std::unique_ptr<clm::Engine> engine;
  REQUIRE_OK(clm::Engine::create(config, engine));
  engine->set_src_head(tracker.head());
  const std::vector<std::int32_t> prompt = {1, 2, 3, 4, 5};
  clm::Admission a;
  REQUIRE_OK(engine->admit(prompt, {}, a));
  const clm::SequenceId seq[] = {a.seq};
  REQUIRE_ERROR(engine->src_step_device(seq, host_one, dtok, indptr1, one, stream.s), StatusCode::failed_precondition,
                "device");
  std::shared_ptr<clm::cuda::CudaSrcSums> engine_sums;  // one per tracker: the rows are the tracker's
  REQUIRE_OK(clm::cuda::CudaSrcSums::create(0, engine_sums));
  engine->set_device_src_sums(engine_sums);
  REQUIRE_OK(engine->src_step_device(seq, clm::ConstActivationView{dx.p, ActDType::f32, 1, hidden}, dtok, indptr1, one,
                                     stream.s));
  CHECK(one[0].scored == 1);
  CHECK(engine->metrics().src.steps == 1);
  REQUIRE_OK(engine->finish(a.seq));
  CHECK(engine->check_invariants().ok());
}
