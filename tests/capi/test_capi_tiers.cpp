// tests/capi/test_capi_tiers.cpp: the tiered KV cache through the C ABI, as a
// host sees it (only clm.h and libclmcache.so.0): a host tier that loads
// evicted pages back byte for byte, a directory storage tier shared by two
// engines (the second's pages are the first's, per source counts), tenant
// isolation, the version-4 options and metrics beside the old struct sizes,
// and bad input.
#include "clm.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "kv_reference.hpp"
#include "temp_dir.hpp"
#include "test_random.hpp"

namespace {

using clm_test::random_tokens;
using clm_test::TempDir;

constexpr int32_t kPage = 4;
constexpr int32_t kVocab = 50000;  // prompts' ids are in [0, kVocab)

clm_engine_options tier_options(int32_t pages, int32_t host_pages, const char* storage_url) {
  clm_engine_options o;
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  o.num_pages = pages;
  o.page_size = kPage;
  o.num_layers = 2;
  o.kv_heads = 1;
  o.head_dim = 4;
  o.kv_dtype = CLM_KV_F32;
  o.host_pages = host_pages;
  o.write_policy = CLM_WRITE_THROUGH;
  o.storage_url = storage_url;
  o.prefetch_policy = CLM_PREFETCH_WAIT_COMPLETE;
  o.model_id = "capi-test-model";
  return o;
}

EnginePtr make(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  return EnginePtr(e);
}

clm_metrics metrics_of(const clm_engine* e) {
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

// The pool's K/V rows as the host sees them (clm_engine_kv_layout): the rows
// of tests/kv_reference.hpp's reference.
struct Layout {
  clm_kv_layout kv;
  explicit Layout(const clm_engine* e) {
    kv.struct_size = sizeof kv;
    REQUIRE_OK(clm_engine_kv_layout(&kv, e));
  }
  int width() const { return kv.kv_heads * kv.head_dim; }
  // The floats of the K (kv 0) or V (kv 1) row of slot `slot` in `layer`.
  float* row(int64_t slot, int layer, int kv_half) const {
    auto* page = static_cast<char*>(kv.base) + static_cast<size_t>(slot / kv.page_size) * kv.page_bytes;
    auto* rows = reinterpret_cast<float*>(page + static_cast<size_t>(layer) * kv.layer_bytes +
                                          static_cast<size_t>(kv_half) * kv.layer_bytes / 2);
    return rows + static_cast<size_t>(slot % kv.page_size) * static_cast<size_t>(width());
  }
};

// Admits, checks the cached rows, writes the rest, finishes. Returns {cached, host, storage} tokens.
std::vector<int32_t> serve(clm_engine* e, const std::string& salt, const std::vector<int32_t>& prompt) {
  clm_admit_options ao;
  REQUIRE_OK(clm_admit_options_init(&ao, sizeof ao));
  ao.cache_salt = salt.data();
  ao.cache_salt_len = salt.size();
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, prompt.data(), prompt.size(), &ao));
  SeqPtr seq(s);
  const Layout layout(e);
  auto row = [&](int64_t slot, int layer, int kv) { return layout.row(slot, layer, kv); };
  size_t n_pages = 0;
  const int32_t* table = clm_seq_page_table(s, &n_pages);
  const int32_t cached = clm_seq_cached_tokens(s);
  CHECK(clm_test::wrong_reference_rows(row, layout.kv.num_layers, layout.width(), salt, prompt, {table, n_pages}, kPage,
                                       cached) == 0);
  size_t n_slots = 0;
  const int64_t* slots = clm_seq_slots(s, &n_slots);
  clm_test::write_reference_rows(row, layout.kv.num_layers, layout.width(), salt, prompt, static_cast<size_t>(cached),
                                 {slots, n_slots});
  const std::vector<int32_t> counts{cached, clm_seq_host_tokens(s), clm_seq_storage_tokens(s)};
  REQUIRE_OK(clm_seq_finish(s));
  return counts;
}

}  // namespace

TEST_CASE("tiers through the C ABI: host tier load-back, exact bytes, metrics", "[capi][tiers]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  EnginePtr engine = make(tier_options(16, 64, nullptr));  // 64 tokens on the device
  const std::vector<int32_t> a = random_tokens(rng, 41, kVocab);
  serve(engine.get(), "t", a);
  serve(engine.get(), "t", a);  // the hit: a host copy (write-through)
  REQUIRE_OK(clm_engine_wait_for_tiers(engine.get()));
  for (int i = 0; i < 4; ++i) serve(engine.get(), "t", random_tokens(rng, 41, kVocab));  // evict a from the device
  const std::vector<int32_t> again = serve(engine.get(), "t", a);
  CHECK(again[0] == 40);
  CHECK(again[1] > 0);  // copied back from the host tier
  CHECK(again[2] == 0);
  REQUIRE_OK(clm_engine_wait_for_tiers(engine.get()));
  const clm_metrics m = metrics_of(engine.get());
  CHECK(m.has_tiers == 1);
  CHECK(m.has_storage == 0);
  CHECK(m.host_hit_tokens == static_cast<uint64_t>(again[1]));
  CHECK(m.loaded_pages * kPage == m.host_hit_tokens);
  CHECK(m.backed_up_pages >= 10);
  CHECK(m.host_pages_total == 64);
  CHECK(m.host_pages_used > 0);
  CHECK(m.host_cached_tokens == m.host_pages_used * kPage);
  // Another tenant shares nothing.
  CHECK(serve(engine.get(), "u", a)[0] == 0);
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_prefetch(engine.get(), a.data(), a.size(), nullptr));
}

TEST_CASE("tiers through the C ABI: a storage directory shared by two engines", "[capi][tiers]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  TempDir dir;
  const std::string url = "file://" + dir.str();
  const std::vector<int32_t> p = random_tokens(rng, 57, kVocab);
  {
    EnginePtr first = make(tier_options(64, 64, url.c_str()));
    serve(first.get(), "acme", p);
    serve(first.get(), "acme", p);
    REQUIRE_OK(clm_engine_wait_for_tiers(first.get()));
    CHECK(metrics_of(first.get()).stored_pages == 56 / kPage);
  }
  EnginePtr second = make(tier_options(64, 64, url.c_str()));
  REQUIRE_OK(clm_engine_prefetch(second.get(), p.data(), p.size(), nullptr));  // a queued request
  REQUIRE_OK(clm_engine_wait_for_tiers(second.get()));
  const std::vector<int32_t> got = serve(second.get(), "acme", p);  // checks every cached row
  CHECK(got[0] == 56);
  CHECK(got[1] == 56);  // from the host tier, where the prefetch put it
  const clm_metrics m = metrics_of(second.get());
  CHECK(m.has_storage == 1);
  CHECK(m.fetched_pages == 56 / kPage);
  CHECK(m.storage_corrupt_pages == 0);
  CHECK(serve(second.get(), "acme-2", p)[0] == 0);  // the salt is in every key
}

TEST_CASE("tiers C ABI: version-4 defaults, and old struct sizes, and bad input", "[capi][tiers][bad]") {
  clm_engine_options full;
  REQUIRE_OK(clm_engine_options_init(&full, sizeof full));
  CHECK(full.host_pages == 0);
  CHECK(full.write_policy == CLM_WRITE_THROUGH);
  CHECK(full.storage_url == nullptr);
  CHECK(full.prefetch_policy == CLM_PREFETCH_TIMEOUT);
  CHECK(full.storage_workers == 2);
  CHECK(full.storage_batch_pages == 32);

  // Version 3 of the options: create gives the tier fields their defaults (no tiers).
  const size_t v3 = offsetof(clm_engine_options, snapshot_lookup_timeout_us) + sizeof(int32_t);
  clm_engine_options o;
  std::memset(&o, 0xCD, sizeof o);
  REQUIRE_OK(clm_engine_options_init(&o, v3));
  o.num_pages = 8;
  o.memory = CLM_MEMORY_NONE;
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  EnginePtr old(e);
  // Version 3 of the metrics gets its fields only.
  const size_t m3 = offsetof(clm_metrics, has_snapshot_store) + sizeof(int32_t);
  clm_metrics m;
  std::memset(&m, 0xCD, sizeof m);
  m.struct_size = static_cast<uint32_t>(m3);
  REQUIRE_OK(clm_engine_metrics(&m, old.get()));
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&m) + m3;
  for (size_t i = 0; i < sizeof m - m3; ++i) CHECK(tail[i] == 0xCD);
  CHECK(metrics_of(old.get()).has_tiers == 0);

  clm_engine_options bad = tier_options(8, 8, nullptr);
  bad.write_policy = 3;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = tier_options(8, 8, nullptr);
  bad.prefetch_policy = -1;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = tier_options(8, 0, "file:///tmp/clm-capi-never");
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));  // storage without a host tier
  bad = tier_options(8, 8, "redis://[::1");
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = tier_options(8, 8, "s3://bucket/x");
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = tier_options(8, -1, nullptr);  // no tiers is 0, not a negative size
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = tier_options(8, 8, nullptr);
  bad.storage_workers = 0;
  bad.storage_url = "file:///tmp/clm-capi-never";
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  const std::string long_url(10000, 'x');
  bad = tier_options(8, 8, long_url.c_str());
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  // A Redis that is not there is not an error at create: admissions just miss.
  bad = tier_options(8, 8, "redis://127.0.0.1:1/0?timeout_ms=50");
  REQUIRE_OK(clm_engine_create(&e, &bad));
  EnginePtr unreachable(e);
  const std::vector<int32_t> p{1, 2, 3, 4, 5, 6, 7, 8, 9};
  CHECK(serve(unreachable.get(), "", p)[0] == 0);
  CHECK(metrics_of(unreachable.get()).storage_errors > 0);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_prefetch(nullptr, p.data(), p.size(), nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_prefetch(unreachable.get(), nullptr, 3, nullptr));
  const std::vector<int32_t> negative{1, -5, 3};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_prefetch(unreachable.get(), negative.data(), negative.size(), nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_wait_for_tiers(nullptr));
  CHECK(clm_seq_host_tokens(nullptr) == 0);
  CHECK(clm_seq_storage_tokens(nullptr) == 0);
}

TEST_CASE("tiers C ABI version 6: a model id and a page secret, and another model or secret gets nothing",
          "[capi][tiers]") {
  const uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  TempDir dir;
  const std::string url = "file://" + dir.str();
  const std::vector<int32_t> p = random_tokens(rng, 41, kVocab);  // 10 whole pages
  ::setenv("CLM_CAPI_TEST_PAGE_SECRET", "capi test deployment secret", 1);
  ::setenv("CLM_CAPI_TEST_OTHER_SECRET", "another deployment's secret", 1);
  clm_engine_options sealed = tier_options(64, 64, url.c_str());
  sealed.page_secret_env = "CLM_CAPI_TEST_PAGE_SECRET";
  {
    EnginePtr writer = make(sealed);
    serve(writer.get(), "t", p);
    serve(writer.get(), "t", p);
    REQUIRE_OK(clm_engine_wait_for_tiers(writer.get()));
    const clm_metrics m = metrics_of(writer.get());
    CHECK(m.stored_pages == 10);
    CHECK(m.signed_pages == 1);
  }
  clm_engine_options other_model = sealed;
  other_model.model_id = "capi-other-model";
  clm_engine_options other_secret = sealed;
  other_secret.page_secret_env = "CLM_CAPI_TEST_OTHER_SECRET";
  clm_engine_options unsigned_reader = sealed;
  unsigned_reader.page_secret_env = nullptr;
  for (const clm_engine_options* o : {&other_model, &other_secret, &unsigned_reader}) {
    EnginePtr stranger = make(*o);
    CHECK(serve(stranger.get(), "t", p)[2] == 0);
    CHECK(metrics_of(stranger.get()).fetched_pages == 0);
  }
  EnginePtr reader = make(sealed);
  CHECK(serve(reader.get(), "t", p)[2] == 40);
  const clm_metrics m = metrics_of(reader.get());
  CHECK(m.signed_pages == 1);
  CHECK(m.storage_foreign_model_pages + m.storage_unsigned_pages + m.storage_forged_pages == 0);
  CHECK(m.storage_repaired_pages == 0);
  CHECK(m.tier_worker_failures == 0);
  ::unsetenv("CLM_CAPI_TEST_OTHER_SECRET");

  // Bad input: no model id with storage; a secret from a file and a variable; an unset variable.
  clm_engine* e = nullptr;
  clm_engine_options bad = sealed;
  bad.model_id = nullptr;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  CHECK_THAT(std::string(clm_last_error()), Catch::Contains("model id"));
  bad = sealed;
  bad.model_id = "";
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = sealed;
  bad.page_secret_file = "/nonexistent/page.key";
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  bad = sealed;
  bad.page_secret_env = "CLM_CAPI_TEST_OTHER_SECRET";  // unset now
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_create(&e, &bad));
  // The bounds on storage work: their defaults, and values outside their ranges.
  clm_engine_options defaults;
  REQUIRE_OK(clm_engine_options_init(&defaults, sizeof defaults));
  CHECK(defaults.max_queued_fetches == 64);
  CHECK(defaults.breaker_failures == 3);
  CHECK(defaults.admission_deadline_ms == 2000.0);
  CHECK(defaults.breaker_open_ms == 5000.0);
  for (int field = 0; field < 6; ++field) {
    bad = sealed;
    if (field == 0) bad.max_queued_fetches = 0;
    if (field == 1) bad.breaker_failures = 0;
    if (field == 2) bad.admission_deadline_ms = -1.0;
    if (field == 3) bad.breaker_open_ms = std::numeric_limits<double>::quiet_NaN();
    if (field == 4) bad.max_queued_fetches = (1 << 20) + 1;
    if (field == 5) bad.admission_deadline_ms = 4e6;
    INFO("field " << field);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  }
  const std::string long_id(5000, 'm');
  bad = sealed;
  bad.model_id = long_id.c_str();
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
  CHECK(e == nullptr);
  ::unsetenv("CLM_CAPI_TEST_PAGE_SECRET");

  // Version 5 of the options (no model id) and of the metrics still work without storage.
  const size_t v5 = offsetof(clm_engine_options, snapshot_maintenance_interval_ms) + sizeof(int64_t);
  clm_engine_options o;
  REQUIRE_OK(clm_engine_options_init(&o, v5));
  o.num_pages = 8;
  REQUIRE_OK(clm_engine_create(&e, &o));
  EnginePtr old(e);
  const size_t m4 = offsetof(clm_metrics, storage_evicted_pages) + sizeof(uint64_t);
  clm_metrics old_metrics;
  std::memset(&old_metrics, 0xCD, sizeof old_metrics);
  old_metrics.struct_size = static_cast<uint32_t>(m4);
  REQUIRE_OK(clm_engine_metrics(&old_metrics, old.get()));
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&old_metrics) + m4;
  for (size_t i = 0; i < sizeof old_metrics - m4; ++i) CHECK(tail[i] == 0xCD);
}
