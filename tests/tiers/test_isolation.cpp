// Tenant isolation through every tier: tenant A caches a secret prompt (and a
// snapshot of its suffix); tenant B, with another cache salt, probes with the
// same tokens and the same suffix key. B must get nothing from the device
// tier (L1), the host tier (L2), the storage tier (a directory, or a real
// redis-server) or the snapshot store, and each of B's lookups must take the
// miss path: the hit counters do not move, and storage is asked under B's own
// keys and answers "missing". A, probing again at each step, still hits:
// the secret really is in the tier being probed. A second engine sharing the
// storage (a restarted instance: empty L1 and L2) repeats the storage probe.
// Whether B's probe *latency* tells a cached prefix from an uncached one is
// measured by bench_isolation (docs/reliability.md).
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/engine.hpp"
#include "store/store_test_support.hpp"
#include "test_random.hpp"
#include "tiers/redis_server.hpp"

namespace {

using clm::Admission;
using clm::Engine;
using clm_test::random_tokens;
using Tokens = std::vector<std::int32_t>;

constexpr std::int32_t kPage = 4;
constexpr int kDim = 8;
const char* const kTenantA = "tenant-a";
const char* const kTenantB = "tenant-b";

constexpr std::int32_t kVocab = 30000;  // prompts' ids are in [0, kVocab)

clm::EngineConfig tiered_config(const std::string& storage_url, const std::string& store_dir) {
  clm::EngineConfig c;
  c.pool.num_pages = 48;  // small: other traffic pushes the secret out of L1
  c.pool.page_size = kPage;
  c.pool.num_layers = 2;
  c.pool.kv_heads = 1;
  c.pool.head_dim = 8;
  c.pool.dtype = clm::KvDType::f32;
  c.tiers.host_pages = 256;
  c.tiers.write_policy = clm::WritePolicy::write_through;
  c.tiers.storage_url = storage_url;
  c.model_id = "test-model";  // storage pages are one model's
  c.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  c.snapshot_store.path = store_dir;
  c.snapshot_store.num_shards = 2;
  c.snapshot_store.snapshot_dim = kDim;
  c.snapshot_store.min_usage_threshold = 1;
  c.snapshot_store.lookup_timeout_us = 2'000'000;
  return c;
}

std::unique_ptr<Engine> make_engine(const clm::EngineConfig& c) {
  std::unique_ptr<Engine> e;
  const clm::Status s = Engine::create(c, e);
  INFO(s.message());
  REQUIRE(s.ok());
  return e;
}

// Admits `prompt` as `tenant`, then finishes (caching it) or aborts.
Admission request(Engine& e, const char* tenant, const Tokens& prompt, bool finish) {
  Admission a;
  const clm::Status s = e.admit(prompt, {.cache_salt = tenant}, a);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE((finish ? e.finish(a.seq) : e.abort(a.seq)).ok());
  e.wait_for_tiers();
  return a;
}

// B's probe of `secret`: no cached token from any tier, and no hit counted anywhere.
void probe_as_b(Engine& e, const Tokens& secret, const char* where) {
  INFO("B probes " << where);
  const clm::EngineMetrics before = e.metrics();
  const Admission b = request(e, kTenantB, secret, false);
  CHECK(b.cached_tokens == 0);
  CHECK(b.host_tokens == 0);
  CHECK(b.storage_tokens == 0);
  const clm::EngineMetrics after = e.metrics();
  CHECK(after.cache.tokens_hit == before.cache.tokens_hit);
  CHECK(after.cache.host_tokens_hit == before.cache.host_tokens_hit);
  CHECK(after.tiers.device_hit_tokens == before.tiers.device_hit_tokens);
  CHECK(after.tiers.host_hit_tokens == before.tiers.host_hit_tokens);
  CHECK(after.tiers.storage_hit_tokens == before.tiers.storage_hit_tokens);
  CHECK(after.tiers.fetched_pages == before.tiers.fetched_pages);  // nothing came back from storage
  CHECK(after.tiers.load_backs == before.tiers.load_backs);
  CHECK(after.cache.match_calls == before.cache.match_calls + 1);  // B did look, and missed
}

// The snapshot store: B's lookup of A's suffix key (and A's exact vector as
// the similarity query) misses; A's hits at level 1.
void probe_store(Engine& e, const std::vector<float>& snapshot) {
  const clm::SuffixRef suffix{.text = "SECRET-ORDER-4411", .is_key = true, .group = "orders"};
  Admission a, b;
  REQUIRE(e.admit(Tokens{1, 2, 3, 4, 5}, {.cache_salt = kTenantA}, a).ok());
  REQUIRE(e.admit(Tokens{1, 2, 3, 4, 5}, {.cache_salt = kTenantB}, b).ok());
  const clm::SequenceId ids[] = {a.seq, b.seq};
  const clm::SuffixRef suffixes[] = {suffix, suffix};
  std::vector<float> queries(snapshot);
  queries.insert(queries.end(), snapshot.begin(), snapshot.end());
  clm::SnapshotHit hits[2];
  std::vector<float> found(2 * kDim, -1.0f);
  std::uint8_t apply[2] = {9, 9};
  const std::uint64_t misses_before = e.metrics().store.misses;
  REQUIRE(e.lookup_snapshots(ids, suffixes, queries, hits, found, apply).ok());
  CHECK(hits[0].level == clm::SnapshotLevel::exact);  // A: the snapshot is there
  CHECK(hits[1].level == clm::SnapshotLevel::miss);   // B: nothing, by key or by similarity
  CHECK(apply[1] == 0);
  CHECK(std::all_of(found.begin() + kDim, found.end(), [](float x) { return x == 0.0f; }));
  CHECK(e.metrics().store.misses == misses_before + 1);
  REQUIRE(e.abort(a.seq).ok());
  REQUIRE(e.abort(b.seq).ok());
}

void run_isolation(const std::string& storage_url) {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed << ", storage " << storage_url);
  std::mt19937_64 rng(seed);
  clm_test::TempDir store_dir;
  const clm::EngineConfig config = tiered_config(storage_url, store_dir.str());
  const Tokens secret = random_tokens(rng, 10 * kPage + 3, kVocab);
  const std::int32_t cacheable = 10 * kPage;  // whole pages before the last token
  {
    auto e = make_engine(config);
    request(*e, kTenantA, secret, true);
    // L1: the secret is on the device.
    probe_as_b(*e, secret, "L1");
    CHECK(request(*e, kTenantA, secret, true).cached_tokens == cacheable);

    // L2: other traffic evicts the secret from the device; its copy stays on the host.
    for (int i = 0; i < 6; ++i) request(*e, "traffic", random_tokens(rng, 40, kVocab), true);
    probe_as_b(*e, secret, "L2 (the host tier)");
    const Admission again = request(*e, kTenantA, secret, true);
    CHECK(again.cached_tokens == cacheable);
    CHECK(again.host_tokens > 0);  // it came back from the host

    // The snapshot store.
    std::mt19937 vector_rng(static_cast<std::uint32_t>(seed));
    const std::vector<float> snapshot = clm_test::random_unit(vector_rng, kDim);
    clm::Admission a;
    REQUIRE(e->admit(secret, {.cache_salt = kTenantA}, a).ok());
    clm::RecordOutcome outcome;
    REQUIRE(
        e->record_snapshot(a.seq, {.text = "SECRET-ORDER-4411", .is_key = true, .group = "orders"}, snapshot, outcome)
            .ok());
    REQUIRE(outcome.result == clm::RecordResult::admitted);
    REQUIRE(e->finish(a.seq).ok());
    probe_store(*e, snapshot);
    e->wait_for_tiers();
    REQUIRE(e->check_invariants().ok());
  }
  // Storage (L3), from a restarted instance: nothing on its device or host.
  auto e = make_engine(config);
  probe_as_b(*e, secret, "L3 (storage) from a fresh engine");
  CHECK(e->metrics().tiers.storage_errors == 0);
  const Admission from_storage = request(*e, kTenantA, secret, true);
  CHECK(from_storage.cached_tokens == cacheable);
  CHECK(from_storage.storage_tokens == cacheable);
  // The store's files survive the restart too: B still misses, A still hits.
  std::vector<float> snapshot_unknown(kDim, 0.0f);
  snapshot_unknown[0] = 1.0f;
  const clm::SuffixRef suffix{.text = "SECRET-ORDER-4411", .is_key = true, .group = "orders"};
  Admission b;
  REQUIRE(e->admit(Tokens{9, 9, 9}, {.cache_salt = kTenantB}, b).ok());
  clm::SnapshotHit hit;
  std::vector<float> out(kDim);
  std::uint8_t apply = 9;
  REQUIRE(e->lookup_snapshots(std::span(&b.seq, 1), std::span(&suffix, 1), snapshot_unknown, std::span(&hit, 1), out,
                              std::span(&apply, 1))
              .ok());
  CHECK(hit.level == clm::SnapshotLevel::miss);
  REQUIRE(e->abort(b.seq).ok());
  REQUIRE(e->check_invariants().ok());
}

}  // namespace

TEST_CASE("isolation: another tenant gets nothing of a secret prompt from L1, L2, a storage directory or the store",
          "[isolation][tiers]") {
  clm_test::TempDir storage;
  run_isolation("file://" + storage.str());
}

TEST_CASE("isolation: another tenant gets nothing of a secret prompt from L1, L2, redis or the store",
          "[isolation][tiers][redis]") {
  clm_test::RedisServer redis;
  redis.start();
  run_isolation(redis.url("iso:"));
}
