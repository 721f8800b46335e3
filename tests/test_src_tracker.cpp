// Tests of the SRC gate (src_gate.hpp), the step-by-step tracker
// (src_tracker.hpp) and their wiring into Engine: running means against a
// float64 reference over each sequence's whole history, the threshold formula,
// the breaker against a naive model, and all-or-nothing errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "clm/engine.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/src_gate.hpp"
#include "clm/model/src_tracker.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kEot = 7;  // the special id used here
using clm_test::fresh_seed;

clm::SrcHeadWeights random_weights(int32_t hidden, std::mt19937& rng, float b2 = 0.0f) {
  const auto h = static_cast<std::size_t>(hidden);
  std::normal_distribution<float> n1(0.0f, 1.0f / std::sqrt(static_cast<float>(h)));
  std::normal_distribution<float> n2(0.0f, 1.5f / std::sqrt(static_cast<float>(h / 4)));
  clm::SrcHeadWeights w;
  w.hidden = hidden;
  w.w1.resize(h / 4 * h);
  for (float& v : w.w1) v = n1(rng);
  w.b1.assign(h / 4, 0.1f);
  w.w2.resize(h / 4);
  for (float& v : w.w2) v = n2(rng);
  w.b2 = b2;
  return w;
}

std::shared_ptr<const clm::SrcHead> make_head(const clm::SrcHeadWeights& w) {
  std::unique_ptr<clm::SrcHead> head;
  REQUIRE(clm::SrcHead::create(w, clm::Gelu::tanh, head).ok());
  return std::shared_ptr<const clm::SrcHead>(std::move(head));
}

// float64 head on a mean.
double reference_score(const clm::SrcHeadWeights& w, const std::vector<double>& mean) {
  const auto h = static_cast<std::size_t>(w.hidden);
  double logit = w.b2;
  for (std::size_t i = 0; i < h / 4; ++i) {
    double z = w.b1[i];
    for (std::size_t c = 0; c < h; ++c) z += static_cast<double>(w.w1[i * h + c]) * mean[c];
    logit +=
        static_cast<double>(w.w2[i]) * 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
  }
  return 1.0 / (1.0 + std::exp(-logit));
}

// A step's input: new rows per sequence, ~20% special.
struct Step {
  std::vector<float> rows;
  std::vector<int32_t> ids;
  std::vector<int32_t> indptr{0};
};

Step random_step(int32_t hidden, std::size_t batch, std::mt19937& rng, int max_rows = 3) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> rows(0, max_rows);
  std::bernoulli_distribution special(0.2);
  Step s;
  for (std::size_t b = 0; b < batch; ++b) {
    const int k = rows(rng);
    for (int r = 0; r < k; ++r) {
      for (int32_t c = 0; c < hidden; ++c) s.rows.push_back(n(rng) + 0.3f * static_cast<float>(b % 3));
      s.ids.push_back(special(rng) ? kEot : 100 + r);
    }
    s.indptr.push_back(s.indptr.back() + k);
  }
  return s;
}

clm::ConstActivationView view_of(const Step& s, int32_t hidden) {
  return {s.rows.data(), clm::ActDType::f32, static_cast<std::int64_t>(s.ids.size()), hidden};
}

}  // namespace

TEST_CASE("SRC threshold follows 0.8 + 0.05 log10(daily / 10000), clamped to [0.7, 0.95]") {
  for (double daily : {1.0, 10.0, 100.0, 999.0, 1000.0, 3162.0, 10000.0, 31623.0, 1e5, 1e6, 5e6, 1e7, 1e9}) {
    const double expected = std::min(0.95, std::max(0.7, 0.8 + 0.05 * std::log10(daily / 1e4)));
    INFO("daily " << daily);
    CHECK(std::abs(clm::src_threshold_for_traffic(daily) - expected) < 1e-6);
  }
  CHECK(clm::src_threshold_for_traffic(0.0) == Approx(0.7f));
  clm::SrcGateConfig c;
  CHECK(clm::src_threshold(c) == Approx(0.8f));
  c.daily_requests = 1e6;
  CHECK(clm::src_threshold(c) == Approx(0.9f));
  c.threshold_override = 0.6f;
  CHECK(clm::src_threshold(c) == 0.6f);
  CHECK(clm::check_src_gate_config(c).ok());
  using Breaker = void (*)(clm::SrcGateConfig&);
  for (Breaker bad : std::initializer_list<Breaker>{
           [](clm::SrcGateConfig& g) { g.daily_requests = 0; }, [](clm::SrcGateConfig& g) { g.daily_requests = -5; },
           [](clm::SrcGateConfig& g) { g.daily_requests = NAN; },
           [](clm::SrcGateConfig& g) { g.threshold_override = 1.5f; },
           [](clm::SrcGateConfig& g) { g.breaker_score = NAN; }, [](clm::SrcGateConfig& g) { g.breaker_steps = 0; }}) {
    clm::SrcGateConfig g;
    bad(g);
    CHECK(clm::check_src_gate_config(g).code() == clm::StatusCode::invalid_argument);
  }
}

TEST_CASE("SRC breaker agrees with a naive model over random histories") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> score_dist(0.6f, 1.0f);
  std::bernoulli_distribution found_dist(0.4), report_dist(0.9);
  for (int trial = 0; trial < 2000; ++trial) {
    clm::SrcGateConfig config;
    config.breaker_steps = 1 + trial % 4;
    const float threshold = 0.8f;
    clm::SrcGateState state;
    // Naive model: the history of (passed, score, reported, found) per step.
    struct Event {
      bool passed;
      float score;
      bool reported;
      bool found;
    };
    std::vector<Event> history;
    bool tripped_at_report = false;
    for (int step = 0; step < 30; ++step) {
      const float score = score_dist(rng);
      const bool passed = clm::src_gate_decide(config, threshold, score, state);
      // naive baseline: some run of breaker_steps consecutive events, each a
      // pass with score > 0.95 reported failed, ended before this step.
      auto naive_baseline = [&] {
        int run = 0;
        for (const Event& e : history) {
          if (e.passed && e.score > config.breaker_score && e.reported && !e.found) {
            if (++run >= config.breaker_steps) return true;
          } else if (!(e.passed && e.score > config.breaker_score && !e.reported)) {
            run = 0;  // an unreported high pass neither counts nor breaks the streak
          }
        }
        return false;
      };
      const bool was_baseline = naive_baseline();
      REQUIRE(state.baseline == was_baseline);
      REQUIRE(passed == (!was_baseline && score >= threshold));
      Event e{passed, score, false, false};
      if (passed && report_dist(rng)) {
        e.reported = true;
        e.found = found_dist(rng);
        tripped_at_report = clm::src_gate_report(config, e.found, state);
      }
      history.push_back(e);
      if (tripped_at_report) {
        REQUIRE(naive_baseline());
        REQUIRE(state.baseline);
        tripped_at_report = false;
      }
    }
  }
}

TEST_CASE("SrcTracker: running means over every step equal a float64 head over the whole history") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (clm::ActDType dtype : {clm::ActDType::f32, clm::ActDType::bf16}) {
    const int32_t hidden = 64;
    const auto h = static_cast<std::size_t>(hidden);
    const clm::SrcHeadWeights w = random_weights(hidden, rng);
    clm::SrcTracker tracker({}, {kEot, kEot});
    tracker.set_head(make_head(w));
    const std::vector<std::uint64_t> ids = {11, 4, 90, 23, 5};
    for (auto id : ids) tracker.add(id);
    std::map<std::uint64_t, std::vector<double>> sums;
    std::map<std::uint64_t, int> counts;
    for (int step = 0; step < 40; ++step) {
      // a random subset of the sequences, in a random order
      std::vector<std::uint64_t> batch = ids;
      std::shuffle(batch.begin(), batch.end(), rng);
      batch.resize(1 + rng() % ids.size());
      Step s = random_step(hidden, batch.size(), rng);
      std::vector<std::uint16_t> half;
      clm::ConstActivationView view = view_of(s, hidden);
      if (dtype == clm::ActDType::bf16) {
        for (float& v : s.rows)
          v = clm::detail::bf16_to_f32(clm::detail::f32_to_bf16(v));  // the reference sees the rounded rows
        for (float v : s.rows) half.push_back(clm::detail::f32_to_bf16(v));
        view = {half.data(), dtype, view.rows, hidden};
      }
      std::vector<clm::SrcDecision> d(batch.size());
      const clm::Status st = tracker.step(batch, view, s.ids, s.indptr, d);
      INFO(st.message());
      REQUIRE(st.ok());
      for (std::size_t b = 0; b < batch.size(); ++b) {
        auto& sum = sums[batch[b]];
        sum.resize(h, 0.0);
        for (auto t = static_cast<std::size_t>(s.indptr[b]); t < static_cast<std::size_t>(s.indptr[b + 1]); ++t) {
          if (s.ids[t] == kEot) continue;
          for (std::size_t c = 0; c < h; ++c) sum[c] += s.rows[t * h + c];
          ++counts[batch[b]];
        }
        INFO("step " << step << ", sequence " << batch[b]);
        if (counts[batch[b]] == 0) {
          CHECK(d[b].scored == 0);
          CHECK(d[b].reuse == 0);
          continue;
        }
        std::vector<double> mean = sum;
        for (double& v : mean) v /= counts[batch[b]];
        const double ref = reference_score(w, mean);
        REQUIRE(d[b].scored == 1);
        CHECK(std::abs(d[b].score - ref) <= 1e-5 * ref);
        CHECK(d[b].threshold == Approx(0.8f));
        CHECK(d[b].reuse == (d[b].score >= 0.8f ? 1 : 0));
      }
    }
    const clm::SrcMetrics m = tracker.metrics();
    CHECK(m.tracked_sequences == 5);
    CHECK(m.steps + m.unscored_steps > 40);
  }
}

TEST_CASE("SrcTracker: a failed step changes nothing, and bad input is refused") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t hidden = 32;
  const clm::SrcHeadWeights w = random_weights(hidden, rng);
  clm::SrcTracker tracker({}, {kEot});
  clm::SrcTracker twin({}, {kEot});  // sees only the good steps
  const std::vector<std::uint64_t> ids = {1, 2, 3};
  std::vector<clm::SrcDecision> d(3);
  Step first = random_step(hidden, 3, rng);
  CHECK(tracker.step(ids, view_of(first, hidden), first.ids, first.indptr, d).code() ==
        clm::StatusCode::failed_precondition);  // no head yet
  tracker.set_head(make_head(w));
  twin.set_head(make_head(w));
  CHECK(tracker.step(ids, view_of(first, hidden), first.ids, first.indptr, d).code() ==
        clm::StatusCode::not_found);  // not added
  for (auto id : ids) {
    tracker.add(id);
    twin.add(id);
  }
  std::vector<clm::SrcDecision> dt(3);
  REQUIRE(tracker.step(ids, view_of(first, hidden), first.ids, first.indptr, d).ok());
  REQUIRE(twin.step(ids, view_of(first, hidden), first.ids, first.indptr, dt).ok());

  Step bad = random_step(hidden, 3, rng, 4);
  bad.rows.resize(bad.rows.size() + static_cast<std::size_t>(hidden), 1.0f);  // one more row for sequence 2
  bad.ids.push_back(100);
  bad.indptr[3] += 1;
  bad.rows[bad.rows.size() - 3] = NAN;
  const std::vector<clm::SrcDecision> poison(3, clm::SrcDecision{-1.0f, -1.0f, 9, 9, 9});
  d = poison;
  CHECK(tracker.step(ids, view_of(bad, hidden), bad.ids, bad.indptr, d).code() == clm::StatusCode::invalid_argument);
  CHECK(d[0].score == -1.0f);
  const std::vector<std::uint64_t> dup = {1, 2, 1};
  CHECK(tracker.step(dup, view_of(first, hidden), first.ids, first.indptr, d).code() ==
        clm::StatusCode::invalid_argument);
  std::vector<int32_t> short_ids(first.ids.begin(), first.ids.end());
  short_ids.push_back(1);
  CHECK(tracker.step(ids, view_of(first, hidden), short_ids, first.indptr, d).code() ==
        clm::StatusCode::invalid_argument);
  std::vector<int32_t> bad_indptr = first.indptr;
  bad_indptr[1] = bad_indptr[2] + 1;
  CHECK(tracker.step(ids, view_of(first, hidden), first.ids, bad_indptr, d).code() ==
        clm::StatusCode::invalid_argument);
  clm::ConstActivationView wrong_cols = view_of(first, hidden);
  wrong_cols.cols = hidden / 2;
  CHECK(tracker.step(ids, wrong_cols, first.ids, first.indptr, d).code() == clm::StatusCode::invalid_argument);
  std::vector<clm::SrcDecision> two(2);
  CHECK(tracker.step(ids, view_of(first, hidden), first.ids, first.indptr, two).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(tracker.report_retrieval(ids, std::vector<std::uint8_t>{1, 0}).code() == clm::StatusCode::invalid_argument);
  CHECK(tracker.report_retrieval(std::vector<std::uint64_t>{1, 99}, std::vector<std::uint8_t>{0, 0}).code() ==
        clm::StatusCode::not_found);
  CHECK(tracker.metrics().retrievals_failed == 0);

  // After the refused calls, both trackers score the next step the same.
  Step next = random_step(hidden, 3, rng);
  REQUIRE(tracker.step(ids, view_of(next, hidden), next.ids, next.indptr, d).ok());
  REQUIRE(twin.step(ids, view_of(next, hidden), next.ids, next.indptr, dt).ok());
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(d[i].scored == dt[i].scored);
    CHECK(d[i].score == dt[i].score);
  }
}

TEST_CASE("Engine: src_step, the breaker and the metrics, with concurrent sequences", "[threads]") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::EngineConfig config;
  config.pool.num_pages = 256;
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  config.src_gate.daily_requests = 1e6;  // threshold 0.9
  config.special_token_ids = {kEot};
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(config, engine).ok());
  const int32_t hidden = 16;
  // b2 = 30: every score is ~1, above the breaker's 0.95.
  engine->set_src_head(make_head(random_weights(hidden, rng, 30.0f)));

  std::vector<clm::SequenceId> seqs;
  for (int i = 0; i < 4; ++i) {
    clm::Admission a;
    const std::vector<int32_t> prompt = {1, 2, 3, i + 10, 5};
    REQUIRE(engine->admit(prompt, {}, a).ok());
    seqs.push_back(a.seq);
  }
  // Sequence 0's lookups fail three times in a row: it trips. Sequence 1's
  // fail twice, then succeed: it does not. 2 and 3 run on other threads.
  std::atomic<int> thread_failures{0};
  auto worker = [&](clm::SequenceId id, uint32_t s) {
    std::mt19937 r(s);
    for (int step = 0; step < 50; ++step) {
      Step st = random_step(hidden, 1, r, 2);
      std::vector<clm::SrcDecision> d(1);
      const clm::SequenceId one[] = {id};
      if (!engine->src_step(one, view_of(st, hidden), st.ids, st.indptr, d).ok()) ++thread_failures;
      if (d[0].reuse && !engine->report_snapshot_retrieval(one, std::vector<std::uint8_t>{1}).ok()) ++thread_failures;
    }
  };
  std::thread t2(worker, seqs[2], seed + 2), t3(worker, seqs[3], seed + 3);
  const std::vector<clm::SequenceId> pair = {seqs[0], seqs[1]};
  for (int step = 0; step < 5; ++step) {
    // One row each at step 0; after that no new rows: the step scores the running mean again.
    Step st;
    if (step == 0) {
      for (int b = 0; b < 2; ++b) {
        for (int32_t c = 0; c < hidden; ++c) st.rows.push_back(1.0f);
        st.ids.push_back(50);
        st.indptr.push_back(st.indptr.back() + 1);
      }
    } else {
      st.indptr = {0, 0, 0};
    }
    std::vector<clm::SrcDecision> d(2);
    REQUIRE(engine->src_step(pair, view_of(st, hidden), st.ids, st.indptr, d).ok());
    INFO("step " << step);
    REQUIRE(d[0].scored == 1);
    CHECK(d[0].score > 0.95f);
    CHECK(d[0].reuse == (step < 3 ? 1 : 0));
    CHECK(d[0].baseline == (step >= 3 ? 1 : 0));
    CHECK(d[1].reuse == 1);
    std::vector<std::uint8_t> found = {0, static_cast<std::uint8_t>(step == 2 ? 1 : 0)};
    if (step < 3) {
      REQUIRE(engine->report_snapshot_retrieval(pair, found).ok());
    } else {
      REQUIRE(
          engine->report_snapshot_retrieval(std::vector<clm::SequenceId>{seqs[1]}, std::vector<std::uint8_t>{1}).ok());
    }
  }
  t2.join();
  t3.join();
  CHECK(thread_failures == 0);
  CHECK(engine->src_baseline(seqs[0]));
  CHECK(!engine->src_baseline(seqs[1]));
  clm::EngineMetrics m = engine->metrics();
  CHECK(m.src.threshold == Approx(0.9f));
  CHECK(m.src.breaker_trips == 1);
  CHECK(m.src.baseline_sequences == 1);
  CHECK(m.src.tracked_sequences == 4);
  CHECK(m.src.retrievals_failed == 5);
  CHECK(m.src.steps >= 10);
  // Ended sequences are forgotten; a step on them is not_found.
  REQUIRE(engine->finish(seqs[0]).ok());
  REQUIRE(engine->abort(seqs[1]).ok());
  m = engine->metrics();
  CHECK(m.src.tracked_sequences == 2);
  CHECK(m.src.baseline_sequences == 0);
  Step st = random_step(hidden, 1, rng, 1);
  std::vector<clm::SrcDecision> d(1);
  const clm::SequenceId ended[] = {seqs[0]};
  CHECK(engine->src_step(ended, view_of(st, hidden), st.ids, st.indptr, d).code() == clm::StatusCode::not_found);
  engine->abort_all();
  CHECK(engine->metrics().src.tracked_sequences == 0);
  REQUIRE(engine->check_invariants().ok());

  clm::EngineConfig bad = config;
  bad.src_gate.breaker_steps = 0;
  std::unique_ptr<clm::Engine> refused;
  CHECK(clm::Engine::create(bad, refused).code() == clm::StatusCode::invalid_argument);
  bad = config;
  bad.special_token_ids = {kEot, -1};
  CHECK(clm::Engine::create(bad, refused).code() == clm::StatusCode::invalid_argument);
  CHECK(refused == nullptr);
}

TEST_CASE("Engine: admit racing abort_all never leaves a dead sequence tracked", "[threads]") {
  clm::EngineConfig config;
  config.pool.num_pages = 4096;
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(config, engine).ok());
  std::atomic<bool> done{false};
  std::thread aborter([&] {
    while (!done) engine->abort_all();
  });
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  int admitted = 0, other_errors = 0;
  for (int i = 0; i < 20000; ++i) {
    clm::Admission a;
    const clm::Status s = engine->admit(prompt, {}, a);
    // The pool runs out when the aborter falls behind: that is fine here.
    if (s.ok()) {
      ++admitted;
    } else if (s.code() != clm::StatusCode::out_of_memory) {
      ++other_errors;
    }
  }
  done = true;
  aborter.join();
  CHECK(other_errors == 0);
  CHECK(admitted > 0);
  engine->abort_all();
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.active_sequences == 0);
  CHECK(m.src.tracked_sequences == 0);
  REQUIRE(engine->check_invariants().ok());
}

TEST_CASE("Engine: a breaker trip never lands between reading the baseline flags and injecting", "[threads]") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::EngineConfig config;
  config.pool.num_pages = 64;
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  config.src_gate.breaker_steps = 1;  // one failed retrieval trips
  config.special_token_ids = {kEot};
  std::unique_ptr<clm::Engine> engine;
  REQUIRE(clm::Engine::create(config, engine).ok());
  const int32_t hidden = 16, dim = 4;
  engine->set_src_head(make_head(random_weights(hidden, rng, 30.0f)));  // every score ~1: reuse, above 0.95
  clm::SnapshotAdapterWeights w;
  w.hidden = hidden;
  w.snapshot_dim = dim;
  w.weight.assign(static_cast<std::size_t>(hidden * dim), 0.5f);
  w.bias.assign(static_cast<std::size_t>(hidden), 1.0f);
  std::unique_ptr<clm::SnapshotAdapter> adapter;
  REQUIRE(clm::SnapshotAdapter::create(std::move(w), clm::SnapshotAdapterConfig{1, {0}, 1.0f}, adapter).ok());
  engine->set_snapshot_adapter(std::shared_ptr<const clm::SnapshotAdapter>(std::move(adapter)));

  clm::Admission a;
  REQUIRE(engine->admit(std::vector<int32_t>{1, 2, 3}, {}, a).ok());
  const clm::SequenceId ids[] = {a.seq};
  Step st;  // one non-special row: scored, ~1, above the threshold and the breaker's 0.95
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int32_t c = 0; c < hidden; ++c) st.rows.push_back(n(rng));
  st.ids.push_back(50);
  st.indptr.push_back(1);
  std::vector<clm::SrcDecision> d(1);
  REQUIRE(engine->src_step(ids, view_of(st, hidden), st.ids, st.indptr, d).ok());
  REQUIRE(d[0].reuse == 1);  // the next failed report trips the breaker

  // Another thread reports the lookup failed while inject_snapshots sits
  // between reading the flags and injecting; wait up to 200 ms for the trip.
  static std::function<void()> on_read;
  std::thread tripper;
  bool trip_done_before_inject = false;
  on_read = [&] {
    std::promise<void> done;
    std::future<void> finished = done.get_future();
    tripper = std::thread([&, p = std::move(done)]() mutable {
      CHECK(engine->report_snapshot_retrieval(ids, std::vector<std::uint8_t>{0}).ok());
      p.set_value();
    });
    trip_done_before_inject = finished.wait_for(std::chrono::milliseconds(200)) == std::future_status::ready;
  };
  clm::detail::inject_after_baseline_read = [] { on_read(); };
  std::vector<float> rows(static_cast<std::size_t>(2 * hidden), 0.0f);
  const std::vector<float> snapshot(static_cast<std::size_t>(dim), 1.0f);
  const int32_t indptr[] = {0, 2};
  const std::uint8_t apply[] = {1};
  const clm::Status injected =
      engine->inject_snapshots(ids, clm::ActivationView::f32(rows, 2, hidden), indptr, snapshot, apply, 0);
  clm::detail::inject_after_baseline_read = nullptr;
  tripper.join();
  REQUIRE(injected.ok());
  REQUIRE(engine->src_baseline(a.seq));  // the trip happened, before or after
  const bool delta_added = std::any_of(rows.begin(), rows.end(), [](float x) { return x != 0.0f; });
  INFO("trip finished before the injection: " << trip_done_before_inject << ", delta added: " << delta_added);
  CHECK_FALSE((trip_done_before_inject && delta_added));  // a tripped sequence got a snapshot
  CHECK(engine->metrics().src.injections == (delta_added ? 1u : 0u));

  // Once tripped, nothing more is injected.
  std::fill(rows.begin(), rows.end(), 0.0f);
  REQUIRE(engine->inject_snapshots(ids, clm::ActivationView::f32(rows, 2, hidden), indptr, snapshot, apply, 0).ok());
  CHECK(std::all_of(rows.begin(), rows.end(), [](float x) { return x == 0.0f; }));
  REQUIRE(engine->finish(a.seq).ok());
  REQUIRE(engine->check_invariants().ok());
}
