// The snapshot store through Engine: record under a sequence's tenant, look up
// a batch, inject what was found (checked against a float64 adapter), report
// outcomes into the blacklist, and the SRC breaker's retrieval counts.
#include <cmath>

#include <catch2/catch.hpp>

#include "clm/engine.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::Engine;
using clm::SnapshotLevel;
using clm::SuffixRef;

namespace {

constexpr int kDim = 16, kHidden = 24, kLayers = 4;

std::unique_ptr<Engine> make_engine(clm::SnapshotStoreConfig store) {
  clm::EngineConfig config;
  config.pool.num_pages = 64;
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  config.snapshot_store = std::move(store);
  std::unique_ptr<Engine> engine;
  const clm::Status s = Engine::create(config, engine);
  INFO(s.message());
  REQUIRE(s.ok());
  return engine;
}

clm::SnapshotStoreConfig store_config() {
  clm::SnapshotStoreConfig c;
  c.path = ":memory:";
  c.num_shards = 2;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.blacklist_min_reports = 4;
  c.lookup_timeout_us = 2'000'000;  // no busy misses on a loaded CI machine
  return c;
}

clm::SequenceId admit(Engine& engine, std::string_view salt, std::int32_t first_token) {
  clm::Admission a;
  const std::vector<std::int32_t> prompt = {first_token, 2, 3, 4, 5};
  REQUIRE(engine.admit(prompt, {.cache_salt = salt}, a).ok());
  return a.seq;
}

}  // namespace

TEST_CASE("engine + store: record, batch lookup, inject, per-tenant", "[store][engine]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine(store_config());
  REQUIRE(engine->snapshot_store() != nullptr);

  // The adapter, and its float64 reference.
  clm::SnapshotAdapterWeights w;
  w.hidden = kHidden;
  w.snapshot_dim = kDim;
  std::normal_distribution<float> n(0.0f, 0.3f);
  w.weight.resize(kHidden * kDim);
  w.bias.resize(kHidden);
  for (float& x : w.weight) x = n(rng);
  for (float& x : w.bias) x = n(rng);
  const clm::SnapshotAdapterWeights reference = w;
  std::unique_ptr<clm::SnapshotAdapter> adapter;
  clm::SnapshotAdapterConfig adapter_config;
  adapter_config.num_layers = kLayers;  // injects at the last 3 layers, residual_scale 0.3
  REQUIRE(clm::SnapshotAdapter::create(std::move(w), adapter_config, adapter).ok());
  engine->set_snapshot_adapter(std::shared_ptr<const clm::SnapshotAdapter>(std::move(adapter)));

  const clm::SequenceId alice = admit(*engine, "alice", 1), bob = admit(*engine, "bob", 1);
  const std::vector<float> snap = clm_test::random_unit(rng, kDim);
  clm::RecordOutcome outcome;
  REQUIRE(engine->record_snapshot(alice, {.text = "ORDER-1", .is_key = true, .group = "orders"}, snap, outcome).ok());
  CHECK(outcome.result == clm::RecordResult::admitted);

  const clm::SequenceId ids[] = {alice, bob};
  const SuffixRef suffixes[] = {{.text = "ORDER-1", .is_key = true, .group = "orders"},
                                {.text = "ORDER-1", .is_key = true, .group = "orders"}};
  std::vector<float> queries(2 * kDim);
  std::copy(snap.begin(), snap.end(), queries.begin());
  std::copy(snap.begin(), snap.end(), queries.begin() + kDim);
  clm::SnapshotHit hits[2];
  std::vector<float> found(2 * kDim, -1.0f);
  std::uint8_t apply[2] = {9, 9};
  REQUIRE(engine->lookup_snapshots(ids, suffixes, queries, hits, found, apply).ok());
  CHECK(hits[0].level == SnapshotLevel::exact);
  CHECK(apply[0] == 1);
  CHECK(hits[1].level == SnapshotLevel::miss);  // bob is another tenant
  CHECK(apply[1] == 0);
  for (int i = 0; i < kDim; ++i) {
    CHECK(found[static_cast<std::size_t>(i)] == Approx(snap[static_cast<std::size_t>(i)]).margin(2e-3));
    CHECK(found[static_cast<std::size_t>(kDim + i)] == 0.0f);
  }
  // The SRC breaker heard of both lookups.
  CHECK(engine->metrics().src.retrievals_found == 1);
  CHECK(engine->metrics().src.retrievals_failed == 1);

  // Inject into 3 + 2 rows at the last layer: alice's rows move by the adapter's delta, bob's do not.
  std::vector<float> hidden(5 * kHidden);
  for (float& x : hidden) x = n(rng);
  const std::vector<float> before = hidden;
  const std::int32_t indptr[] = {0, 3, 5};
  REQUIRE(engine->inject_snapshots(ids, clm::ActivationView::f32(hidden, 5, kHidden), indptr, found, apply, kLayers - 1)
              .ok());
  for (int r = 0; r < 5; ++r) {
    for (int h = 0; h < kHidden; ++h) {
      double delta = 0;
      if (r < 3) {
        double ws = reference.bias[static_cast<std::size_t>(h)];
        for (int d = 0; d < kDim; ++d) {
          ws += static_cast<double>(reference.weight[static_cast<std::size_t>(h * kDim + d)]) *
                found[static_cast<std::size_t>(d)];
        }
        delta = 0.3 * ws;
      }
      const std::size_t at = static_cast<std::size_t>(r * kHidden + h);
      CHECK(hidden[at] == Approx(before[at] + delta).margin(1e-5));
    }
  }

  // Level 2 through the engine: another key of the same group.
  const SuffixRef similar[] = {{.text = "ORDER-2", .is_key = true, .group = "orders"}};
  REQUIRE(engine
              ->lookup_snapshots(std::span(ids, 1), similar, std::span(queries).first(kDim), std::span(hits, 1),
                                 std::span(found).first(kDim), std::span(apply, 1))
              .ok());
  CHECK(hits[0].level == SnapshotLevel::ann);
  CHECK(hits[0].key == "ORDER-1");

  // A wrong level-2 serve counts against the pair (ORDER-2 asked, ORDER-1
  // served), never against ORDER-1's own exact hits: three wrong exact
  // reuses leave ORDER-1 served (3 of its own reports < 4), the fourth
  // blacklists it, for alice only. Each served snapshot is reported once.
  const std::uint8_t wrong[] = {0};
  REQUIRE(engine->report_snapshot_outcome(std::span(ids, 1), wrong).ok());  // the ann hit above, ORDER-1
  CHECK(engine->report_snapshot_outcome(std::span(ids, 1), wrong).code() == clm::StatusCode::failed_precondition);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(engine
                ->lookup_snapshots(std::span(ids, 1), std::span(suffixes, 1), std::span(queries).first(kDim),
                                   std::span(hits, 1), std::span(found).first(kDim), std::span(apply, 1))
                .ok());
    REQUIRE(hits[0].level == SnapshotLevel::exact);
    REQUIRE(engine->report_snapshot_outcome(std::span(ids, 1), wrong).ok());
    CHECK(engine->metrics().store.blacklisted_keys == (i == 3 ? 1 : 0));
  }
  REQUIRE(engine
              ->lookup_snapshots(std::span(ids, 1), std::span(suffixes, 1), std::span(queries).first(kDim),
                                 std::span(hits, 1), std::span(found).first(kDim), std::span(apply, 1))
              .ok());
  CHECK(hits[0].level == SnapshotLevel::miss);
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.has_snapshot_store);
  CHECK(m.store.blacklisted_keys == 1);
  CHECK(m.store.blocked_pairs == 0);  // one wrong level-2 report: below min_reports
  CHECK(m.store.lookups == 8);
  CHECK(m.store.hits_exact == 5);
  CHECK(m.store.hits_ann == 1);
  CHECK(m.store.misses == 2);
  CHECK(m.store.outcome_reports == 5);
  REQUIRE(engine->finish(alice).ok());
  REQUIRE(engine->finish(bob).ok());
}

TEST_CASE("engine + store: errors are statuses and change nothing", "[store][engine][errors]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  {
    clm::EngineConfig plain;
    plain.pool.num_pages = 8;
    plain.pool.memory = clm::MemoryKind::none;
    std::unique_ptr<Engine> engine;
    REQUIRE(Engine::create(plain, engine).ok());
    CHECK(engine->snapshot_store() == nullptr);
    clm::RecordOutcome o;
    const std::vector<float> v(kDim, 0.25f);
    CHECK(engine->record_snapshot(1, {.text = "x"}, v, o).code() == clm::StatusCode::failed_precondition);
    CHECK_FALSE(engine->metrics().has_snapshot_store);
  }
  {
    clm::SnapshotStoreConfig bad = store_config();
    bad.num_shards = 0;
    clm::EngineConfig config;
    config.pool.num_pages = 8;
    config.pool.memory = clm::MemoryKind::none;
    config.snapshot_store = bad;
    std::unique_ptr<Engine> engine;
    CHECK(Engine::create(config, engine).code() == clm::StatusCode::invalid_argument);
    CHECK_FALSE(engine);
  }
  auto engine = make_engine(store_config());
  const clm::SequenceId s = admit(*engine, "t", 7);
  const std::vector<float> v = clm_test::random_unit(rng, kDim);
  clm::RecordOutcome o;
  CHECK(engine->record_snapshot(s + 100, {.text = "K", .is_key = true}, v, o).code() == clm::StatusCode::not_found);
  CHECK(engine->record_snapshot(s, {.text = "", .is_key = true}, v, o).code() == clm::StatusCode::invalid_argument);
  CHECK(engine->record_snapshot(s, {.text = "K", .is_key = true}, std::span(v).first(3), o).code() ==
        clm::StatusCode::invalid_argument);
  const clm::SequenceId ids[] = {s};
  const SuffixRef suffixes[] = {{.text = "K", .is_key = true}};
  clm::SnapshotHit hits[1];
  std::vector<float> out(kDim);
  std::uint8_t apply[1];
  CHECK(engine->lookup_snapshots(ids, suffixes, {}, hits, std::span(out).first(kDim - 1), apply).code() ==
        clm::StatusCode::invalid_argument);
  const std::uint8_t correct[] = {1};
  CHECK(engine->report_snapshot_outcome(ids, correct).code() == clm::StatusCode::failed_precondition);
  // Everything is checked before the first lookup: a repeated sequence, a NaN or zero query.
  const clm::SequenceId twice[] = {s, s};
  const SuffixRef two[] = {{.text = "K", .is_key = true}, {.text = "K", .is_key = true}};
  clm::SnapshotHit two_hits[2];
  std::vector<float> two_out(2 * kDim);
  std::uint8_t two_apply[2];
  CHECK(engine->lookup_snapshots(twice, two, {}, two_hits, two_out, two_apply).code() ==
        clm::StatusCode::invalid_argument);
  std::vector<float> bad_query(kDim, 0.0f);
  CHECK(engine->lookup_snapshots(ids, suffixes, bad_query, hits, out, apply).code() ==
        clm::StatusCode::invalid_argument);
  bad_query[3] = std::nanf("");
  CHECK(engine->lookup_snapshots(ids, suffixes, bad_query, hits, out, apply).code() ==
        clm::StatusCode::invalid_argument);
  const std::uint8_t both[] = {1, 1};
  CHECK(engine->report_snapshot_outcome(twice, both).code() == clm::StatusCode::invalid_argument);
  // A salt as long as the C ABI allows (64 KiB) is a tenant the store takes.
  const clm::SequenceId long_salt = admit(*engine, std::string(std::size_t{1} << 16, 's'), 9);
  REQUIRE(engine->record_snapshot(long_salt, {.text = "K", .is_key = true}, v, o).ok());
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.store.records == 1);  // the long salt's
  CHECK(m.store.lookups == 0);
  CHECK(m.src.retrievals_failed == 0);
  REQUIRE(engine->check_invariants().ok());
}
