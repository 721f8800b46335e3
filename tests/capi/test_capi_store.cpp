// tests/capi/test_capi_store.cpp: the snapshot store through the C ABI, as a
// host sees it (only clm.h and libclmcache.so.0): record then lookup against
// an independent float64 normalisation (the store keeps f16), suffix keys of
// paraphrases, the three levels, tenant isolation (salt and adapter id), the
// apply flags feeding clm_engine_inject_snapshots, outcome reports, the
// version-3 options and metrics next to the old struct sizes, every bad
// input, and the store by hand (versions, pins, rollback, blacklist, deletion).
#include "clm.h"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"

namespace {

constexpr int32_t kDim = 16;

// FNV-1a 64, written out here so that the fingerprints the library returns
// are checked against an independent computation.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::vector<float> random_vector(std::mt19937& rng, float scale) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> v(kDim);
  for (float& x : v) x = n(rng);
  return v;
}

// v / |v| in float64: what the store serves, before its f16 rounding.
std::vector<double> unit64(const std::vector<float>& v) {
  double norm = 0.0;
  for (float x : v) norm += static_cast<double>(x) * x;
  std::vector<double> out;
  for (float x : v) out.push_back(x / std::sqrt(norm));
  return out;
}

double cosine64(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// The largest difference between a served snapshot and the float64 unit vector.
double max_error(const float* served, const std::vector<double>& want) {
  double e = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) e = std::max(e, std::abs(served[i] - want[i]));
  return e;
}

clm_engine_options store_options(const char* path = ":memory:") {
  clm_engine_options o;
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = 64;
  o.page_size = 4;
  o.memory = CLM_MEMORY_NONE;
  o.snapshot_store_path = path;
  o.snapshot_store_shards = 2;
  o.snapshot_dim = kDim;
  o.snapshot_min_usage = 1;
  o.snapshot_similarity_floor = 0.5f;
  o.snapshot_lookup_timeout_us = 2'000'000;  // no busy misses (level 2 included) on a loaded machine
  return o;
}

EnginePtr create(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  return EnginePtr(e);
}

EnginePtr store_engine() { return create(store_options()); }

SeqPtr admit(clm_engine* e, const std::string& salt, int32_t adapter_id = 0) {
  const int32_t prompt[] = {1, 2, 3, 4, 5};
  clm_admit_options a;
  REQUIRE(clm_admit_options_init(&a, sizeof a) == CLM_OK);
  a.cache_salt = salt.data();
  a.cache_salt_len = salt.size();
  a.adapter_id = adapter_id;
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, prompt, 5, &a));
  return SeqPtr(s);
}

std::string key_of(clm_engine* e, const std::string& text, uint64_t* fingerprint = nullptr) {
  char key[CLM_SNAPSHOT_KEY_BYTES];
  size_t len = 0;
  REQUIRE_OK(clm_suffix_key(key, sizeof key, &len, fingerprint, e, text.data(), text.size()));
  REQUIRE(std::strlen(key) == len);
  return std::string(key, len);
}

// One sequence's lookup (a batch of one).
struct One {
  clm_snapshot_hit hit;
  std::vector<float> snapshot = std::vector<float>(kDim, -9.0f);
  uint8_t apply = 7;
};

One lookup(clm_engine* e, clm_seq* seq, const std::string& suffix, int32_t kind, const char* group = nullptr,
           const std::vector<float>* query = nullptr) {
  One r;
  std::memset(&r.hit, 0xAB, sizeof r.hit);
  clm_seq* seqs[] = {seq};
  const char* suffixes[] = {suffix.data()};
  const size_t lens[] = {suffix.size()};
  const char* groups[] = {group};
  const size_t group_lens[] = {group ? std::strlen(group) : 0};
  REQUIRE_OK(clm_engine_lookup_snapshots(&r.hit, r.snapshot.data(), kDim, &r.apply, e, seqs, 1, suffixes, lens,
                                         group ? groups : nullptr, group ? group_lens : nullptr, kind,
                                         query ? query->data() : nullptr, query ? query->size() : 0));
  return r;
}

int32_t record(clm_engine* e, clm_seq* seq, const std::string& suffix, int32_t kind, const char* group,
               const std::vector<float>& v, int32_t* version = nullptr) {
  int32_t result = -1, ver = -1;
  REQUIRE_OK(clm_engine_record_snapshot(&result, &ver, e, seq, suffix.data(), suffix.size(), group,
                                        group ? std::strlen(group) : 0, kind, v.data(), v.size()));
  if (version) *version = ver;
  return result;
}

clm_metrics metrics(clm_engine* e) {
  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

void check_miss(const One& r) {
  CHECK(r.hit.level == CLM_SNAPSHOT_MISS);
  CHECK(r.apply == 0);
  CHECK(r.hit.key[0] == '\0');
  CHECK(r.hit.key_len == 0);
  CHECK(r.hit.fingerprint == 0);
  for (float x : r.snapshot) CHECK(x == 0.0f);
}

}  // namespace

TEST_CASE("snapshot store through the C ABI: record, the three levels, tenants, metrics", "[capi][store]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  EnginePtr engine = store_engine();
  clm_engine* e = engine.get();
  SeqPtr a = admit(e, "tenant-a");
  SeqPtr b = admit(e, "tenant-b");
  SeqPtr a7 = admit(e, "tenant-a", 7);  // the same salt under another adapter: another tenant

  // ---- level 1: a host key, recorded then found; f16 within 1e-3 of float64 ----
  const std::vector<float> v = random_vector(rng, 3.0f);  // not unit length: the store normalises
  int32_t version = -1;
  CHECK(record(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1", v, &version) == CLM_RECORD_ADMITTED);
  CHECK(version == 1);
  One r = lookup(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1");
  CHECK(r.hit.level == CLM_SNAPSHOT_EXACT);
  CHECK(r.apply == 1);
  CHECK(r.hit.version == 1);
  CHECK(r.hit.stable == 0);  // no later record has confirmed version 1 yet
  CHECK(r.hit.similarity == 1.0f);
  CHECK(std::string(r.hit.key) == "ORDER-1");
  CHECK(r.hit.key_len == 7);
  CHECK(r.hit.key_truncated == 0);
  CHECK(r.hit.fingerprint == fnv1a("ORDER-1"));
  for (uint8_t byte : r.hit.reserved) CHECK(byte == 0);
  CHECK(max_error(r.snapshot.data(), unit64(v)) <= 1e-3);
  // The same direction again confirms it: stable from then on.
  std::vector<float> twice = v;
  for (float& x : twice) x *= 0.5f;
  CHECK(record(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1", twice, &version) == CLM_RECORD_CONFIRMED);
  CHECK(version == 1);
  r = lookup(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1");
  CHECK(r.hit.level == CLM_SNAPSHOT_EXACT);
  CHECK(r.hit.stable == 1);
  // An orthogonal snapshot is a new version, unstable: the stable version 1 is still served.
  std::vector<float> other = random_vector(rng, 1.0f);
  {
    const std::vector<double> u = unit64(v);
    double d = 0;
    for (std::size_t i = 0; i < other.size(); ++i) d += other[i] * u[i];
    for (std::size_t i = 0; i < other.size(); ++i) other[i] -= static_cast<float>(d * u[i]);
  }
  CHECK(record(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1", other, &version) == CLM_RECORD_NEW_VERSION);
  CHECK(version == 2);
  r = lookup(e, a.get(), "ORDER-1", CLM_SUFFIX_KEY, "g1");
  CHECK(r.hit.version == 1);
  CHECK(max_error(r.snapshot.data(), unit64(v)) <= 1e-3);

  // ---- text: paraphrases share a key; record one, find it by the other ----------
  uint64_t fp1 = 0, fp2 = 0;
  const std::string text1 = "Please check the status of order 789";
  const std::string text2 = "What's the status of order #789?";
  const std::string key1 = key_of(e, text1, &fp1);
  CHECK(key1 == "QUERY-ORDER-789-STATUS");
  CHECK(key_of(e, text2, &fp2) == key1);
  CHECK(fp1 == fnv1a(key1));
  CHECK(fp2 == fp1);
  CHECK(key_of(e, "Don't check order 789") != key1);  // the opposite question never shares it
  const std::vector<float> w = random_vector(rng, 1.0f);
  CHECK(record(e, a.get(), text1, CLM_SUFFIX_TEXT, nullptr, w) == CLM_RECORD_ADMITTED);
  r = lookup(e, a.get(), text2, CLM_SUFFIX_TEXT);
  CHECK(r.hit.level == CLM_SNAPSHOT_EXACT);
  CHECK(std::string(r.hit.key) == key1);
  CHECK(max_error(r.snapshot.data(), unit64(w)) <= 1e-3);

  // ---- level 2: another key of the same group, near in direction ---------------
  std::vector<float> query = w;  // w plus a little noise
  std::normal_distribution<float> noise(0.0f, 0.02f);
  for (float& x : query) x += noise(rng);
  const std::vector<float> near_v = random_vector(rng, 1.0f);
  CHECK(record(e, a.get(), "K-NEAR", CLM_SUFFIX_KEY, "grp", near_v) == CLM_RECORD_ADMITTED);
  std::vector<float> near_query = near_v;
  for (float& x : near_query) x += noise(rng);
  r = lookup(e, a.get(), "K-QUERY", CLM_SUFFIX_KEY, "grp", &near_query);
  CHECK(r.hit.level == CLM_SNAPSHOT_ANN);
  CHECK(r.apply == 1);
  CHECK(std::string(r.hit.key) == "K-NEAR");
  CHECK(r.hit.fingerprint == fnv1a("K-NEAR"));
  CHECK(r.hit.version == 1);
  CHECK(r.hit.similarity == Approx(cosine64(near_query, near_v)).margin(2e-3));
  CHECK(max_error(r.snapshot.data(), unit64(near_v)) <= 1e-3);
  check_miss(lookup(e, a.get(), "K-QUERY", CLM_SUFFIX_KEY, "other-group", &near_query));  // groups must agree
  check_miss(lookup(e, a.get(), "K-QUERY", CLM_SUFFIX_KEY, "grp"));                       // no query: no level 2
  // A level-1 hit with a query reports the query's cosine.
  r = lookup(e, a.get(), "K-NEAR", CLM_SUFFIX_KEY, "grp", &near_query);
  CHECK(r.hit.level == CLM_SNAPSHOT_EXACT);
  CHECK(r.hit.similarity == Approx(cosine64(near_query, near_v)).margin(2e-3));

  // ---- level 3: a greeting's fallback, set for tenant A only --------------------
  // Text the keyer abstains on (here an action with no object or entity) still has a key, but it is
  // neither counted nor stored and never served at level 1 or 2.
  CHECK(key_of(e, "cancel it") == "CANCEL");
  CHECK(record(e, a.get(), "cancel it", CLM_SUFFIX_TEXT, nullptr, w, &version) == CLM_RECORD_ABSTAINED);
  CHECK(version == 0);
  check_miss(lookup(e, a.get(), "cancel it", CLM_SUFFIX_TEXT, nullptr, &query));
  const std::string hello = "Hi there";
  CHECK(key_of(e, hello) == "GREETING");
  check_miss(lookup(e, a.get(), hello, CLM_SUFFIX_TEXT));
  const std::vector<float> greeting = random_vector(rng, 2.0f);
  const std::string salt_a = "tenant-a";
  REQUIRE_OK(clm_engine_set_fallback_snapshot(e, salt_a.data(), salt_a.size(), 0, "GREETING", 8, greeting.data(),
                                              greeting.size()));
  r = lookup(e, a.get(), hello, CLM_SUFFIX_TEXT);
  CHECK(r.hit.level == CLM_SNAPSHOT_FALLBACK);
  CHECK(r.apply == 1);
  CHECK(std::string(r.hit.key) == "GREETING");
  CHECK(r.hit.fingerprint == fnv1a("GREETING"));
  CHECK(r.hit.version == 0);
  CHECK(max_error(r.snapshot.data(), unit64(greeting)) <= 1e-3);

  // ---- tenant isolation: B and A-with-adapter-7 see nothing of A's, at any level ----
  for (clm_seq* stranger : {b.get(), a7.get()}) {
    INFO((stranger == b.get() ? "tenant-b" : "tenant-a, adapter 7"));
    check_miss(lookup(e, stranger, "ORDER-1", CLM_SUFFIX_KEY, "g1", &near_query));
    check_miss(lookup(e, stranger, text2, CLM_SUFFIX_TEXT, nullptr, &query));
    check_miss(lookup(e, stranger, "K-QUERY", CLM_SUFFIX_KEY, "grp", &near_query));
    check_miss(lookup(e, stranger, hello, CLM_SUFFIX_TEXT, nullptr, &query));
  }
  // A fallback "*" for salt "tenant-a" under adapter 7 reaches a7, and only a7.
  const std::vector<float> star = random_vector(rng, 1.0f);
  REQUIRE_OK(clm_engine_set_fallback_snapshot(e, salt_a.data(), salt_a.size(), 7, "*", 1, star.data(), star.size()));
  r = lookup(e, a7.get(), "thanks!", CLM_SUFFIX_TEXT);
  CHECK(r.hit.level == CLM_SNAPSHOT_FALLBACK);
  CHECK(std::string(r.hit.key) == "*");
  CHECK(max_error(r.snapshot.data(), unit64(star)) <= 1e-3);
  check_miss(lookup(e, b.get(), "thanks!", CLM_SUFFIX_TEXT));
  check_miss(lookup(e, a.get(), "thanks!", CLM_SUFFIX_TEXT));  // A has a GREETING fallback, not "*" or THANKS

  // ---- a batch: the apply flags feed clm_engine_inject_snapshots ----------------
  constexpr int hidden = 8;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> weight(hidden * kDim), bias(hidden);
  for (float& x : weight) x = n(rng);
  for (float& x : bias) x = n(rng);
  clm_adapter_options ao;
  REQUIRE_OK(clm_adapter_options_init(&ao, sizeof ao));
  ao.num_layers = 1;
  const int32_t layer_0[] = {0};
  ao.layers = layer_0;
  ao.n_layers = 1;
  ao.residual_scale = 0.5f;
  REQUIRE_OK(clm_engine_set_snapshot_adapter(e, kDim, hidden, weight.data(), bias.data(), &ao));
  clm_seq* batch[] = {a.get(), b.get()};
  const char* suffixes[] = {"ORDER-1", "ORDER-1"};
  const size_t lens[] = {7, 7};
  clm_snapshot_hit hits[2];
  std::vector<float> snaps(2 * kDim, -1.0f);
  uint8_t apply[2] = {9, 9};
  REQUIRE_OK(clm_engine_lookup_snapshots(hits, snaps.data(), snaps.size(), apply, e, batch, 2, suffixes, lens, nullptr,
                                         nullptr, CLM_SUFFIX_KEY, nullptr, 0));
  CHECK(hits[0].level == CLM_SNAPSHOT_EXACT);
  CHECK(hits[1].level == CLM_SNAPSHOT_MISS);
  CHECK(apply[0] == 1);
  CHECK(apply[1] == 0);
  std::vector<float> hs(2 * hidden);
  for (float& x : hs) x = n(rng);
  const std::vector<float> before = hs;
  const int32_t indptr[] = {0, 1, 2};
  REQUIRE_OK(clm_engine_inject_snapshots(e, hs.data(), CLM_DTYPE_F32, 2, hidden, batch, 2, indptr, snaps.data(), kDim,
                                         apply, 0));
  for (int ch = 0; ch < hidden; ++ch) {
    double delta = bias[static_cast<std::size_t>(ch)];
    for (int k = 0; k < kDim; ++k) {
      delta +=
          static_cast<double>(weight[static_cast<std::size_t>(ch * kDim + k)]) * snaps[static_cast<std::size_t>(k)];
    }
    const double want = before[static_cast<std::size_t>(ch)] + 0.5 * delta;
    CHECK(std::abs(hs[static_cast<std::size_t>(ch)] - want) <= 1e-5 * (1.0 + std::abs(want)));
    CHECK(hs[static_cast<std::size_t>(hidden + ch)] == before[static_cast<std::size_t>(hidden + ch)]);  // b missed
  }

  // ---- outcomes: a served sequence reports; one served nothing cannot ------------
  clm_seq* only_a[] = {a.get()};
  const uint8_t right[] = {1};
  REQUIRE_OK(clm_engine_report_snapshot_outcome(e, only_a, 1, right));
  clm_seq* only_b[] = {b.get()};
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_report_snapshot_outcome(e, only_b, 1, right));

  REQUIRE_OK(clm_engine_flush_snapshot_store(e));
  int64_t deleted = -1;
  REQUIRE_OK(clm_engine_evict_snapshots(&deleted, e));
  CHECK(deleted == 0);  // nothing is 30 days old

  // ---- the version-3 metrics: what this test did ---------------------------------
  // Lookups: level 1 x6 (ORDER-1 x3, the text, K-NEAR, the batch's a), level 2
  // x1, level 3 x2 (a's greeting, a7's "*"); misses: 4 of a's (another group,
  // no query, "cancel it", the greeting before its fallback), 8 of the
  // strangers, 2 "thanks!" (b, a), the batch's b = 15. Records: 5 and the
  // abstained "cancel it", which is neither counted nor stored.
  const clm_metrics m = metrics(e);
  CHECK(m.has_snapshot_store == 1);
  CHECK(m.store_hits_exact == 6);
  CHECK(m.store_hits_ann == 1);
  CHECK(m.store_hits_fallback == 2);
  CHECK(m.store_misses == 15);
  CHECK(m.store_lookups == 6 + 1 + 2 + 15);
  CHECK(m.store_busy_misses == 0);
  CHECK(m.store_blacklisted_skips == 0);
  CHECK(m.store_records == 6);
  CHECK(m.store_counted == 0);
  CHECK(m.store_admissions == 3);
  CHECK(m.store_confirmations == 1);
  CHECK(m.store_versions == 1);
  CHECK(m.store_drift_versions == 0);
  CHECK(m.store_evictions == 0);
  CHECK(m.store_corrupt_skipped == 0);
  CHECK(m.store_outcome_reports == 1);
  CHECK(m.store_snapshots == 4);  // ORDER-1 v1 and v2, the text's key, K-NEAR
  CHECK(m.store_blacklisted_keys == 0);
  // Every lookup was reported to the SRC breaker as a retrieval.
  CHECK(m.src_retrievals_found == 9);
  CHECK(m.src_retrievals_failed == 15);
}

TEST_CASE("snapshot store C ABI: admission below snapshot_min_usage, and a directory store persists", "[capi][store]") {
  std::mt19937 rng(std::random_device{}());
  char dir[] = "/tmp/clm-capi-store-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/snapshots";  // created by the store
  const std::vector<float> v = random_vector(rng, 1.0f);
  clm_engine_options o = store_options(path.c_str());
  o.snapshot_min_usage = 3;
  {
    EnginePtr engine = create(o);
    SeqPtr s = admit(engine.get(), "t");
    int32_t version = -1;
    CHECK(record(engine.get(), s.get(), "KEY", CLM_SUFFIX_KEY, nullptr, v, &version) == CLM_RECORD_COUNTED);
    CHECK(version == 0);
    CHECK(record(engine.get(), s.get(), "KEY", CLM_SUFFIX_KEY, nullptr, v) == CLM_RECORD_COUNTED);
    check_miss(lookup(engine.get(), s.get(), "KEY", CLM_SUFFIX_KEY));
    CHECK(record(engine.get(), s.get(), "KEY", CLM_SUFFIX_KEY, nullptr, v, &version) == CLM_RECORD_ADMITTED);
    CHECK(version == 1);
    const clm_metrics m = metrics(engine.get());
    CHECK(m.store_records == 3);
    CHECK(m.store_counted == 2);
    CHECK(m.store_admissions == 1);
    CHECK(m.store_snapshots == 1);
    CHECK(m.store_misses == 1);
    // The store closes with the engine's last handle: the sequence is freed
    // first (it is declared after the engine), then the engine.
  }
  {
    EnginePtr engine = create(o);  // the same directory: the snapshot is still there
    SeqPtr s = admit(engine.get(), "t");
    const One r = lookup(engine.get(), s.get(), "KEY", CLM_SUFFIX_KEY);
    CHECK(r.hit.level == CLM_SNAPSHOT_EXACT);
    CHECK(max_error(r.snapshot.data(), unit64(v)) <= 1e-3);
    CHECK(metrics(engine.get()).store_snapshots == 1);
  }
  // A store is created with its shard count and dimension for good.
  clm_engine_options other = o;
  other.snapshot_store_shards = 3;
  clm_engine* e = nullptr;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_create(&e, &other));
  other = o;
  other.snapshot_dim = kDim * 2;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_create(&e, &other));
  CHECK(e == nullptr);
  const std::string rm = "rm -rf '" + std::string(dir) + "'";
  REQUIRE(std::system(rm.c_str()) == 0);
}

TEST_CASE("snapshot store C ABI: a read-only engine beside the writer, and version-4 options stay writers",
          "[capi][store][read_only]") {
  std::mt19937 rng(std::random_device{}());
  char dir[] = "/tmp/clm-capi-reader-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/snapshots";
  const std::vector<float> v = random_vector(rng, 1.0f);
  clm_engine_options o = store_options(path.c_str());
  clm_engine_options defaults;
  REQUIRE_OK(clm_engine_options_init(&defaults, sizeof defaults));
  CHECK(defaults.snapshot_read_only == 0);
  CHECK(defaults.snapshot_maintenance_interval_ms == 0);
  {
    EnginePtr writer = create(o);
    SeqPtr w = admit(writer.get(), "t");
    CHECK(record(writer.get(), w.get(), "KEY", CLM_SUFFIX_KEY, nullptr, v) == CLM_RECORD_ADMITTED);
    REQUIRE_OK(clm_engine_flush_snapshot_store(writer.get()));

    // A second writer is refused; the version-4 layout of the options (no
    // snapshot_read_only) opens a writer too.
    clm_engine* e = nullptr;
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_create(&e, &o));
    clm_engine_options v4 = o;
    v4.struct_size = static_cast<uint32_t>(offsetof(clm_engine_options, storage_batch_pages) + sizeof(int32_t));
    v4.snapshot_read_only = 1;  // past the caller's struct: not read
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_create(&e, &v4));
    clm_engine_options bad = o;
    bad.snapshot_read_only = 2;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
    bad = o;
    bad.snapshot_maintenance_interval_ms = -5;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &bad));
    CHECK(e == nullptr);

    clm_engine_options ro = o;
    ro.snapshot_read_only = 1;
    EnginePtr reader = create(ro);
    SeqPtr r = admit(reader.get(), "t");
    const One hit = lookup(reader.get(), r.get(), "KEY", CLM_SUFFIX_KEY);
    CHECK(hit.hit.level == CLM_SNAPSHOT_EXACT);
    CHECK(max_error(hit.snapshot.data(), unit64(v)) <= 1e-3);
    int32_t result = -1, version = -1;
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
                 clm_engine_record_snapshot(&result, &version, reader.get(), r.get(), "KEY", 3, nullptr, 0,
                                            CLM_SUFFIX_KEY, v.data(), v.size()));
    CHECK(std::string(clm_last_error()).find("read-only") != std::string::npos);
    int64_t deleted = -1;
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_evict_snapshots(&deleted, reader.get()));
    CHECK(metrics(writer.get()).store_snapshots == 1);
  }
  const std::string rm = "rm -rf '" + std::string(dir) + "'";
  REQUIRE(std::system(rm.c_str()) == 0);
}

TEST_CASE("snapshot store C ABI: old struct sizes still work, and version-3 defaults", "[capi][store]") {
  // Version 3's defaults are SnapshotStoreConfig's.
  clm_engine_options full;
  REQUIRE_OK(clm_engine_options_init(&full, sizeof full));
  CHECK(full.snapshot_store_path == nullptr);
  CHECK(full.snapshot_store_shards == 16);
  CHECK(full.snapshot_dim == 256);
  CHECK(full.snapshot_min_usage == 50);
  CHECK(full.snapshot_version_cosine == Approx(0.95f));
  CHECK(full.snapshot_similarity_floor == Approx(0.80f));
  CHECK(full.snapshot_ann_ef_search == 128);
  CHECK(full.snapshot_lookup_timeout_us == 2000);

  // Versions 1 and 2 of clm_engine_options: init writes only their bytes, and
  // create gives the fields they lack their defaults: no store.
  const size_t v1 = offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double);
  const size_t v2 = offsetof(clm_engine_options, n_special_token_ids) + sizeof(size_t);
  for (size_t size : {v1, v2}) {
    INFO("clm_engine_options of " << size << " bytes");
    clm_engine_options o;
    std::memset(&o, 0xCD, sizeof o);
    REQUIRE_OK(clm_engine_options_init(&o, size));
    CHECK(o.struct_size == size);
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(&o) + size;
    for (size_t i = 0; i < sizeof o - size; ++i) CHECK(tail[i] == 0xCD);
    o.num_pages = 16;
    o.memory = CLM_MEMORY_NONE;
    // The bytes past `size` stay 0xCD: a library reading them would open a store at a garbage path.
    clm_engine* e = nullptr;
    REQUIRE_OK(clm_engine_create(&e, &o));
    EnginePtr engine(e);
    const clm_metrics m = metrics(e);
    CHECK(m.has_snapshot_store == 0);
    CHECK(m.store_lookups == 0);
    int64_t deleted = 0;
    CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_evict_snapshots(&deleted, e));
  }

  // Versions 1 and 2 of clm_metrics get their fields only.
  EnginePtr engine = store_engine();
  SeqPtr s = admit(engine.get(), "t");
  std::mt19937 rng(7);
  (void)record(engine.get(), s.get(), "K", CLM_SUFFIX_KEY, nullptr, random_vector(rng, 1.0f));
  const size_t m1 = offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t);
  const size_t m2 = offsetof(clm_metrics, src_injections) + sizeof(uint64_t);
  for (size_t size : {m1, m2}) {
    INFO("clm_metrics of " << size << " bytes");
    clm_metrics m;
    std::memset(&m, 0xCD, sizeof m);
    m.struct_size = static_cast<uint32_t>(size);
    REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
    CHECK(m.admitted == 1);
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(&m) + size;
    for (size_t i = 0; i < sizeof m - size; ++i) CHECK(tail[i] == 0xCD);
  }
  const clm_metrics m3 = metrics(engine.get());
  CHECK(m3.has_snapshot_store == 1);
  CHECK(m3.store_records == 1);
  // One byte more than this library's struct is a size it does not know.
  clm_metrics big[2];
  big[0].struct_size = sizeof(clm_metrics) + 1;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_metrics(&big[0], engine.get()));
}

TEST_CASE("snapshot store C ABI: bad input gets a status and a message, and changes nothing", "[capi][store][bad]") {
  std::mt19937 rng(std::random_device{}());
  EnginePtr engine = store_engine();
  EnginePtr other = store_engine();
  clm_engine* e = engine.get();
  SeqPtr a = admit(e, "tenant-a");
  SeqPtr b = admit(e, "tenant-b");
  SeqPtr foreign = admit(other.get(), "tenant-a");
  const std::vector<float> v = random_vector(rng, 1.0f);
  CHECK(record(e, a.get(), "K", CLM_SUFFIX_KEY, "g", v) == CLM_RECORD_ADMITTED);
  const clm_metrics before = metrics(e);

  // ---- clm_suffix_key ------------------------------------------------------------
  const std::string text = "Please check the status of order 789";
  char key[CLM_SNAPSHOT_KEY_BYTES];
  size_t key_len = 0;
  uint64_t fp = 0;
  std::memset(key, 'x', sizeof key);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, 4, &key_len, &fp, e, text.data(), text.size()));
  CHECK(key_len == std::strlen("QUERY-ORDER-789-STATUS"));  // the size needed, without the NUL
  CHECK(std::string(clm_last_error()).find(std::to_string(key_len + 1)) != std::string::npos);
  CHECK(key[0] == 'x');  // nothing written
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, key_len, &key_len, &fp, e, text.data(), text.size()));
  key_len = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(nullptr, 0, &key_len, nullptr, e, text.data(), text.size()));
  CHECK(key_len == 22);                                                                          // a sizing call
  REQUIRE_OK(clm_suffix_key(key, key_len + 1, &key_len, nullptr, e, text.data(), text.size()));  // exactly enough
  CHECK(std::string(key) == "QUERY-ORDER-789-STATUS");
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, sizeof key, nullptr, &fp, e, text.data(), text.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_suffix_key(key, sizeof key, &key_len, &fp, nullptr, text.data(), text.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, sizeof key, &key_len, &fp, e, nullptr, 3));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, sizeof key, &key_len, &fp, e, "", 0));  // no content
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, sizeof key, &key_len, &fp, e, "\xff\xfe order", 8));
  const std::string huge(17 * 1024, 'a');
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_suffix_key(key, sizeof key, &key_len, &fp, e, huge.data(), huge.size()));

  // ---- clm_engine_lookup_snapshots -------------------------------------------------
  clm_seq* seqs[] = {a.get(), b.get()};
  const char* suffixes[] = {"K", "K"};
  const size_t lens[] = {1, 1};
  const char* groups[] = {"g", "g"};
  const size_t group_lens[] = {1, 1};
  clm_snapshot_hit hits[2];
  std::vector<float> snaps(2 * kDim, -1.0f);
  uint8_t apply[2] = {9, 9};
  std::vector<float> queries(2 * kDim);
  for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = v[i % kDim];
  auto lookup2 = [&](clm_snapshot_hit* h, float* sn, size_t sn_len, uint8_t* ap, clm_engine* en, clm_seq* const* sq,
                     const char* const* sf, const size_t* sl, const char* const* gr, const size_t* gl, int32_t kind,
                     const float* q, size_t q_len) {
    return clm_engine_lookup_snapshots(h, sn, sn_len, ap, en, sq, 2, sf, sl, gr, gl, kind, q, q_len);
  };
  const size_t n_snaps = snaps.size(), n_q = queries.size();
  float* sn = snaps.data();
  const float* q = queries.data();
  REQUIRE_OK(lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens, CLM_SUFFIX_KEY, q, n_q));
  const clm_metrics after_good = metrics(e);
  CHECK(after_good.store_lookups == before.store_lookups + 2);
  std::fill(snaps.begin(), snaps.end(), -1.0f);
  apply[0] = apply[1] = 9;
  std::memset(hits, 0xAB, sizeof hits);
  const std::vector<unsigned char> hits_before(reinterpret_cast<unsigned char*>(hits),
                                               reinterpret_cast<unsigned char*>(hits) + sizeof hits);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(nullptr, sn, n_snaps, apply, e, seqs, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, nullptr, n_snaps, apply, e, seqs, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, nullptr, e, seqs, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, nullptr, seqs, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, nullptr, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               lookup2(hits, sn, n_snaps, apply, e, seqs, nullptr, lens, groups, group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, nullptr, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, nullptr, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens,
                                                 CLM_SUFFIX_KEY, nullptr, n_q));
  const char* null_suffix[] = {"K", nullptr};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, null_suffix, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  const char* null_group[] = {"g", nullptr};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, null_group,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  // Wrong lengths.
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps - 1, apply, e, seqs, suffixes, lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens,
                                                 CLM_SUFFIX_KEY, q, n_q - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens,
                                                 CLM_SUFFIX_KEY, q, 0));  // queries, but none of them
  // Wrong suffix kinds; groups with text.
  for (int32_t kind : {-1, 2}) {
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens, kind, q, n_q));
  }
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens, CLM_SUFFIX_TEXT, q, n_q));
  // Bad keys: the second of the batch; the first was never looked up.
  const char* bad_keys[] = {"K", "not printable\n"};
  const size_t bad_lens[] = {1, 14};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, bad_keys, bad_lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  const std::string long_key(300, 'k');
  const char* long_keys[] = {"K", long_key.c_str()};
  const size_t long_lens[] = {1, long_key.size()};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, long_keys, long_lens, groups,
                                                 group_lens, CLM_SUFFIX_KEY, q, n_q));
  const char* empty_text[] = {"Please check order 789", ""};
  const size_t empty_lens[] = {22, 0};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, empty_text, empty_lens, nullptr,
                                                 nullptr, CLM_SUFFIX_TEXT, q, n_q));
  // A NaN or zero query in the second sequence: nothing was looked up.
  std::vector<float> bad_q = queries;
  bad_q[kDim + 3] = NAN;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens,
                                                 CLM_SUFFIX_KEY, bad_q.data(), n_q));
  bad_q = queries;
  std::fill(bad_q.begin() + kDim, bad_q.end(), 0.0f);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens,
                                                 CLM_SUFFIX_KEY, bad_q.data(), n_q));
  // A sequence listed twice, or of another engine.
  clm_seq* twice[] = {a.get(), a.get()};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               lookup2(hits, sn, n_snaps, apply, e, twice, suffixes, lens, groups, group_lens, CLM_SUFFIX_KEY, q, n_q));
  clm_seq* mixed[] = {a.get(), foreign.get()};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               lookup2(hits, sn, n_snaps, apply, e, mixed, suffixes, lens, groups, group_lens, CLM_SUFFIX_KEY, q, n_q));
  // Nothing was written, and nothing was counted or reported.
  for (float x : snaps) CHECK(x == -1.0f);
  CHECK(apply[0] == 9);
  CHECK(apply[1] == 9);
  CHECK(std::memcmp(hits, hits_before.data(), sizeof hits) == 0);
  clm_metrics now = metrics(e);
  CHECK(now.store_lookups == after_good.store_lookups);
  CHECK(now.src_retrievals_found == after_good.src_retrievals_found);
  CHECK(now.src_retrievals_failed == after_good.src_retrievals_failed);

  // ---- clm_engine_record_snapshot ----------------------------------------------------
  int32_t result = -1, version = -1;
  const std::string k = "K2";
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(nullptr, &version, e, a.get(), k.data(), k.size(),
                                                                    nullptr, 0, CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, nullptr, e, a.get(), k.data(), k.size(),
                                                                    nullptr, 0, CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, nullptr, a.get(), k.data(), k.size(), nullptr, 0,
                                          CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, nullptr, k.data(), k.size(),
                                                                    nullptr, 0, CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, a.get(), nullptr, 2, nullptr,
                                                                    0, CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(),
                                                                    nullptr, 3, CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(),
                                                                    nullptr, 0, CLM_SUFFIX_KEY, nullptr, v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(), nullptr, 0, CLM_SUFFIX_KEY,
                                          v.data(), v.size() - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(),
                                                                    nullptr, 0, 5, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, a.get(), text.data(), text.size(), "g", 1,
                                          CLM_SUFFIX_TEXT, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, foreign.get(), k.data(), k.size(), nullptr, 0,
                                          CLM_SUFFIX_KEY, v.data(), v.size()));
  std::vector<float> nan_v = v;
  nan_v[5] = NAN;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(), nullptr, 0, CLM_SUFFIX_KEY,
                                          nan_v.data(), nan_v.size()));
  nan_v[5] = INFINITY;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(), nullptr, 0, CLM_SUFFIX_KEY,
                                          nan_v.data(), nan_v.size()));
  const std::vector<float> zero(kDim, 0.0f);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_record_snapshot(&result, &version, e, a.get(), k.data(), k.size(), nullptr, 0, CLM_SUFFIX_KEY,
                                          zero.data(), zero.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_record_snapshot(&result, &version, e, a.get(), "", 0, nullptr, 0,
                                                                    CLM_SUFFIX_TEXT, v.data(), v.size()));
  CHECK(result == -1);
  CHECK(version == -1);
  now = metrics(e);
  CHECK(now.store_records == before.store_records);
  CHECK(now.store_snapshots == before.store_snapshots);

  // ---- outcomes ------------------------------------------------------------------------
  const uint8_t correct[] = {1, 1};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_snapshot_outcome(nullptr, seqs, 2, correct));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_snapshot_outcome(e, nullptr, 2, correct));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_snapshot_outcome(e, seqs, 2, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_snapshot_outcome(e, twice, 2, correct));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_snapshot_outcome(e, mixed, 2, correct));
  // b's last lookup (the good one above) missed: it was served nothing.
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_report_snapshot_outcome(e, seqs, 2, correct));
  CHECK(metrics(e).store_outcome_reports == before.store_outcome_reports);

  // ---- fallbacks -----------------------------------------------------------------------
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(nullptr, "t", 1, 0, "GREETING", 8, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, nullptr, 1, 0, "GREETING", 8, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, "t", 1, 0, nullptr, 8, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_set_fallback_snapshot(e, "t", 1, 0, "", 0, v.data(), v.size()));
  const std::string long_name(257, 'N');
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, "t", 1, 0, long_name.data(), long_name.size(), v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, "t", 1, 0, "GREETING", 8, nullptr, v.size()));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, "t", 1, 0, "GREETING", 8, v.data(), v.size() + 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_fallback_snapshot(e, "t", 1, 0, "GREETING", 8, nan_v.data(), nan_v.size()));
  const std::string huge_salt((std::size_t{1} << 16) + 1, 's');
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_set_fallback_snapshot(e, huge_salt.data(), huge_salt.size(), 0,
                                                                          "GREETING", 8, v.data(), v.size()));

  // ---- flush, evict ----------------------------------------------------------------------
  int64_t deleted = -1;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_flush_snapshot_store(nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_evict_snapshots(nullptr, e));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_evict_snapshots(&deleted, nullptr));
  CHECK(deleted == -1);

  // ---- an ended sequence --------------------------------------------------------------------
  REQUIRE_OK(clm_seq_finish(b.get()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               lookup2(hits, sn, n_snaps, apply, e, seqs, suffixes, lens, groups, group_lens, CLM_SUFFIX_KEY, q, n_q));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_record_snapshot(&result, &version, e, b.get(), k.data(), k.size(), nullptr, 0, CLM_SUFFIX_KEY,
                                          v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_report_snapshot_outcome(e, seqs, 2, correct));
  CHECK(metrics(e).store_lookups == after_good.store_lookups);

  // ---- an engine without a store: every call is CLM_ERR_FAILED_PRECONDITION -----------------
  clm_engine_options o;
  REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
  o.num_pages = 16;
  o.memory = CLM_MEMORY_NONE;
  o.snapshot_store_path = "";  // "" is no store, as NULL is
  EnginePtr plain = create(o);
  clm_engine* p = plain.get();
  SeqPtr ps = admit(p, "t");
  clm_seq* pseqs[] = {ps.get()};
  clm_snapshot_hit ph;
  float psnap[kDim];
  uint8_t papply = 0;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_suffix_key(key, sizeof key, &key_len, &fp, p, text.data(), text.size()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_lookup_snapshots(&ph, psnap, kDim, &papply, p, pseqs, 1, suffixes, lens, nullptr, nullptr,
                                           CLM_SUFFIX_KEY, nullptr, 0));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_record_snapshot(&result, &version, p, ps.get(), k.data(), k.size(), nullptr, 0,
                                          CLM_SUFFIX_KEY, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_report_snapshot_outcome(p, pseqs, 1, correct));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_set_fallback_snapshot(p, "t", 1, 0, "GREETING", 8, v.data(), v.size()));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_flush_snapshot_store(p));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_evict_snapshots(&deleted, p));
  const clm_metrics pm = metrics(p);
  CHECK(pm.has_snapshot_store == 0);
  CHECK(pm.store_lookups == 0);
  CHECK(pm.store_snapshots == 0);

  // ---- bad store options: refused at create ---------------------------------------------------
  clm_engine* bad = nullptr;
  clm_engine_options bo = store_options();
  bo.snapshot_dim = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  bo.snapshot_store_shards = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  bo.snapshot_min_usage = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  bo.snapshot_version_cosine = 1.5f;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  bo.snapshot_similarity_floor = NAN;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  bo.snapshot_ann_ef_search = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options();
  const std::string long_path(5000, 'p');
  bo.snapshot_store_path = long_path.c_str();
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&bad, &bo));
  bo = store_options("/dev/null/snapshots");  // a directory that cannot be made
  CHECK_STATUS(CLM_ERR_IO, clm_engine_create(&bad, &bo));
  CHECK(bad == nullptr);
}

TEST_CASE("snapshot store by hand through the C ABI: versions, pin, rollback, blacklist, deletion, bad input",
          "[capi][store][admin]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  EnginePtr engine = store_engine();
  clm_engine* e = engine.get();
  const std::string salt = "tenant-admin";
  SeqPtr a = admit(e, salt);
  SeqPtr other = admit(e, "someone-else");
  const std::vector<float> v1 = random_vector(rng, 1.0f), v2 = random_vector(rng, 1.0f);
  CHECK(record(e, a.get(), "FAQ-1", CLM_SUFFIX_KEY, "g", v1) == CLM_RECORD_ADMITTED);
  CHECK(record(e, a.get(), "FAQ-1", CLM_SUFFIX_KEY, "g", v1) == CLM_RECORD_CONFIRMED);
  CHECK(record(e, a.get(), "FAQ-1", CLM_SUFFIX_KEY, "g", v2) == CLM_RECORD_NEW_VERSION);
  CHECK(record(e, other.get(), "FAQ-1", CLM_SUFFIX_KEY, "g", v2) == CLM_RECORD_ADMITTED);
  const char* key = "FAQ-1";
  const char* group = "g";

  // Versions: a sizing call, then the two, newest first; version 1 (stable) served.
  size_t count = 99;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_snapshot_versions(nullptr, 0, &count, e, salt.data(), salt.size(),
                                                                      0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK(count == 2);
  clm_snapshot_version versions[3];
  std::memset(versions, 0xAB, sizeof versions);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_snapshot_versions(versions, 1, &count, e, salt.data(), salt.size(),
                                                                      0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK(count == 2);
  CHECK(versions[0].version != 2);  // nothing written when the array is too small
  REQUIRE_OK(clm_engine_snapshot_versions(versions, 3, &count, e, salt.data(), salt.size(), 0, key, 5, group, 1,
                                          CLM_SUFFIX_KEY));
  REQUIRE(count == 2);
  CHECK(versions[0].version == 2);
  CHECK(versions[0].served == 0);
  CHECK(versions[0].stable == 0);
  CHECK(versions[1].version == 1);
  CHECK(versions[1].served == 1);
  CHECK(versions[1].stable == 1);
  CHECK(versions[1].confirmations == 1);
  for (const auto& v : versions[0].reserved) CHECK(v == 0);

  // Pin version 2: served; unpin: version 1 again.
  REQUIRE_OK(clm_engine_pin_snapshot_version(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY, 2));
  One r = lookup(e, a.get(), key, CLM_SUFFIX_KEY, group);
  CHECK(r.hit.version == 2);
  CHECK(max_error(r.snapshot.data(), unit64(v2)) <= 1e-3);
  REQUIRE_OK(clm_engine_unpin_snapshot_version(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK(lookup(e, a.get(), key, CLM_SUFFIX_KEY, group).hit.version == 1);
  CHECK_STATUS(CLM_ERR_NOT_FOUND,
               clm_engine_unpin_snapshot_version(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY));

  // Blacklist for an hour: a miss for this tenant only; lifted: served again.
  const int64_t hour_from_now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() +
      3'600'000;
  REQUIRE_OK(clm_engine_blacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY,
                                               "wrong answer", 12, hour_from_now));
  check_miss(lookup(e, a.get(), key, CLM_SUFFIX_KEY, group));
  CHECK(lookup(e, other.get(), key, CLM_SUFFIX_KEY, group).hit.level == CLM_SNAPSHOT_EXACT);
  size_t listed = 99;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_snapshot_blacklist(nullptr, 0, &listed, e));  // sizing
  CHECK(listed == 1);
  std::vector<clm_snapshot_blacklist_entry> entries(2);
  REQUIRE_OK(clm_engine_snapshot_blacklist(entries.data(), entries.size(), &listed, e));
  REQUIRE(listed == 1);
  CHECK(std::string(entries[0].salt, entries[0].salt_len) == salt);
  CHECK(entries[0].adapter_id == 0);
  CHECK(std::string(entries[0].key) == "FAQ-1");
  CHECK(entries[0].fingerprint == fnv1a("FAQ-1"));
  CHECK(std::string(entries[0].reason) == "wrong answer");
  CHECK(entries[0].until_ms == hour_from_now);
  CHECK(entries[0].by_hand == 1);
  CHECK((entries[0].salt_truncated | entries[0].key_truncated | entries[0].reason_truncated) == 0);
  for (uint8_t byte : entries[0].reserved) CHECK(byte == 0);
  REQUIRE_OK(clm_engine_unblacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK(lookup(e, a.get(), key, CLM_SUFFIX_KEY, group).hit.level == CLM_SNAPSHOT_EXACT);

  // Roll back to 1: version 2 deleted.
  int64_t deleted = -1;
  REQUIRE_OK(
      clm_engine_roll_back_snapshot_key(&deleted, e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY, 1));
  CHECK(deleted == 1);
  REQUIRE_OK(clm_engine_snapshot_versions(versions, 3, &count, e, salt.data(), salt.size(), 0, key, 5, group, 1,
                                          CLM_SUFFIX_KEY));
  CHECK(count == 1);

  // Bad input: a clear status, nothing changed.
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_snapshot_versions(nullptr, 0, nullptr, e, salt.data(), salt.size(),
                                                                      0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_pin_snapshot_version(e, salt.data(), salt.size(), 0, key, 5, group,
                                                                         1, 42, 1));  // suffix_kind
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_pin_snapshot_version(nullptr, salt.data(), salt.size(), 0, key, 5,
                                                                         group, 1, CLM_SUFFIX_KEY, 1));
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_pin_snapshot_version(e, salt.data(), salt.size(), 0, key, 5, group, 1,
                                                                  CLM_SUFFIX_KEY, 2));  // rolled back
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_roll_back_snapshot_key(&deleted, e, salt.data(), salt.size(), 0, key, 5,
                                                                    group, 1, CLM_SUFFIX_KEY, 7));
  CHECK_STATUS(CLM_ERR_NOT_FOUND,
               clm_engine_unblacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_blacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY,
                                                 "too late", 8, hour_from_now - 7'200'000));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_blacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY,
                                                 nullptr, 3, hour_from_now));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_blacklist_snapshot_key(e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY, "",
                                                 0, hour_from_now));
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_delete_snapshot_key(&deleted, e, salt.data(), salt.size(), 0, "NOPE", 4,
                                                                 group, 1, CLM_SUFFIX_KEY));
  // A text whose key abstains names nothing stored.
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_delete_snapshot_key(&deleted, e, salt.data(), salt.size(), 0, "thanks", 6,
                                                                 nullptr, 0, CLM_SUFFIX_TEXT));
  CHECK(lookup(e, a.get(), key, CLM_SUFFIX_KEY, group).hit.version == 1);  // still served

  // Deletion: the key, then the other tenant whole.
  REQUIRE_OK(
      clm_engine_delete_snapshot_key(&deleted, e, salt.data(), salt.size(), 0, key, 5, group, 1, CLM_SUFFIX_KEY));
  CHECK(deleted == 1);
  check_miss(lookup(e, a.get(), key, CLM_SUFFIX_KEY, group));
  REQUIRE_OK(clm_engine_delete_snapshot_tenant(&deleted, e, "someone-else", 12, 0));
  CHECK(deleted == 1);
  check_miss(lookup(e, other.get(), key, CLM_SUFFIX_KEY, group));
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_delete_snapshot_tenant(&deleted, e, "someone-else", 12, 0));
  CHECK(metrics(e).store_snapshots == 0);

  // An engine without a store.
  clm_engine_options plain;
  REQUIRE(clm_engine_options_init(&plain, sizeof plain) == CLM_OK);
  plain.num_pages = 8;
  plain.memory = CLM_MEMORY_NONE;
  EnginePtr bare = create(plain);
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_delete_snapshot_tenant(&deleted, bare.get(), salt.data(), salt.size(), 0));
}
