// tests/capi/test_capi_clm.cpp: the C ABI of CLM suffix reuse as a host sees
// it (only clm.h and libclmcache.so.0): the SRC head from host memory and from
// a safetensors file built here byte by byte, scores against a float64
// reference over each sequence's running mean, the breaker and the version-2
// metrics, old struct sizes, and every bad input.
#include "clm.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <stdlib.h>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "temp_dir.hpp"

namespace {

using clm_test::TempDir;

constexpr int32_t kHidden = 8;
constexpr int32_t kInner = kHidden / 4;
constexpr int32_t kEot = 2;

struct Head {
  std::vector<float> w1, b1, w2;
  float b2 = 0.0f;
};

Head random_head(std::mt19937& rng, float b2) {
  std::normal_distribution<float> n(0.0f, 0.5f);
  Head h;
  h.w1.resize(kInner * kHidden);
  for (float& v : h.w1) v = n(rng);
  h.b1 = {n(rng), n(rng)};
  h.w2 = {n(rng), n(rng)};
  h.b2 = b2;
  return h;
}

double reference(const Head& h, const std::vector<double>& mean, bool erf_gelu) {
  double logit = h.b2;
  for (int i = 0; i < kInner; ++i) {
    double z = h.b1[static_cast<std::size_t>(i)];
    for (int c = 0; c < kHidden; ++c)
      z += static_cast<double>(h.w1[static_cast<std::size_t>(i * kHidden + c)]) * mean[static_cast<std::size_t>(c)];
    const double g = erf_gelu ? 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)))
                              : 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    logit += static_cast<double>(h.w2[static_cast<std::size_t>(i)]) * g;
  }
  return 1.0 / (1.0 + std::exp(-logit));
}

EnginePtr make_engine(const int32_t* special, size_t n_special, double daily = 10000.0) {
  clm_engine_options o;
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = 64;
  o.page_size = 4;
  o.memory = CLM_MEMORY_NONE;
  o.special_token_ids = special;
  o.n_special_token_ids = n_special;
  o.src_daily_requests = daily;
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  return EnginePtr(e);
}

SeqPtr admit(clm_engine* e, int32_t first) {
  const int32_t prompt[] = {first, 5, 6, 7, 8};
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, prompt, 5, nullptr));
  return SeqPtr(s);
}

void append_bytes(std::vector<unsigned char>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  out.insert(out.end(), b, b + n);
}

// Writes the head as a safetensors file built byte by byte (F32 tensors, the
// header's keys sorted as the format asks, `metadata` the inside of a
// "__metadata__" object or empty) at `path` (in a TempDir) and returns it.
std::string write_head_file(const Head& h, const std::string& metadata, const std::string& path) {
  char tensors[512];
  std::snprintf(tensors, sizeof tensors,
                "\"src_head.b1\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
                "\"src_head.b2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]},"
                "\"src_head.w1\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%d,%d]},"
                "\"src_head.w2\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}",
                kInner, 4 * kInner, 4 * kInner, 4 * kInner + 4, kInner, kHidden, 4 * kInner + 4,
                4 * kInner + 4 + 4 * kInner * kHidden, kInner, 4 * kInner + 4 + 4 * kInner * kHidden,
                8 * kInner + 4 + 4 * kInner * kHidden);
  std::string header = "{";  // appended piece by piece: GCC 12 warns falsely on a chain of operator+
  if (!metadata.empty()) header.append("\"__metadata__\":{").append(metadata).append("},");
  header.append(tensors);
  std::vector<unsigned char> file;
  const uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) file.push_back(static_cast<unsigned char>((n >> (8 * k)) & 0xFF));
  append_bytes(file, header.data(), n);
  append_bytes(file, h.b1.data(), 4 * h.b1.size());
  append_bytes(file, &h.b2, 4);
  append_bytes(file, h.w1.data(), 4 * h.w1.size());
  append_bytes(file, h.w2.data(), 4 * h.w2.size());
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  REQUIRE(std::fwrite(file.data(), 1, file.size(), f) == file.size());
  std::fclose(f);
  return path;
}

// One step of one fresh sequence whose only row is `row`: its score.
float score_one_row(clm_engine* engine, int32_t first_token, const std::vector<float>& row) {
  SeqPtr s = admit(engine, first_token);
  clm_seq* seqs[] = {s.get()};
  const int32_t ids[] = {9}, indptr[] = {0, 1};
  clm_src_decision d;
  REQUIRE_OK(clm_engine_src_step(&d, engine, seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  REQUIRE(d.scored == 1);
  return d.score;
}

}  // namespace

TEST_CASE("SRC head from host memory: running-mean scores match float64, across steps", "[capi][clm]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int32_t special[] = {kEot};
  EnginePtr engine = make_engine(special, 1);
  const Head h = random_head(rng, 0.0f);
  REQUIRE_OK(clm_engine_set_src_head(engine.get(), kHidden, h.w1.data(), h.b1.data(), h.w2.data(), h.b2, CLM_GELU_ERF));
  SeqPtr a = admit(engine.get(), 1), b = admit(engine.get(), 3);
  clm_seq* seqs[] = {a.get(), b.get()};
  std::vector<double> sum_a(kHidden, 0.0), sum_b(kHidden, 0.0);
  int count_a = 0, count_b = 0;
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int step = 0; step < 6; ++step) {
    // a: two rows (the second special at odd steps); b: one row.
    std::vector<float> rows(3 * kHidden);
    for (float& v : rows) v = n(rng);
    const int32_t ids[] = {10, step % 2 ? kEot : 11, 12};
    const int32_t indptr[] = {0, 2, 3};
    for (int r = 0; r < 3; ++r) {
      if (ids[r] == kEot) continue;
      auto& sum = r < 2 ? sum_a : sum_b;
      for (int c = 0; c < kHidden; ++c)
        sum[static_cast<std::size_t>(c)] += rows[static_cast<std::size_t>(r * kHidden + c)];
      ++(r < 2 ? count_a : count_b);
    }
    clm_src_decision d[2];
    std::memset(d, 0xFF, sizeof d);
    REQUIRE_OK(clm_engine_src_step(d, engine.get(), seqs, 2, rows.data(), CLM_DTYPE_F32, 3, kHidden, ids, indptr));
    for (int i = 0; i < 2; ++i) {
      std::vector<double> mean = i == 0 ? sum_a : sum_b;
      for (double& v : mean) v /= (i == 0 ? count_a : count_b);
      const double ref = reference(h, mean, true);
      INFO("step " << step << " seq " << i);
      CHECK(d[i].scored == 1);
      CHECK(std::abs(d[i].score - ref) <= 1e-5 * ref);
      CHECK(d[i].threshold == Approx(0.8f));
      CHECK(d[i].reuse == (d[i].score >= d[i].threshold ? 1 : 0));
      CHECK(d[i].baseline == 0);
    }
  }
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
  CHECK(m.src_steps == 12);
  CHECK(m.src_threshold == Approx(0.8));
}

TEST_CASE("SRC head from a safetensors file built byte by byte, and the breaker, and v1 structs", "[capi][clm]") {
  std::mt19937 rng(std::random_device{}());
  // b2 = 40: every score is 1, above the breaker's 0.95.
  const Head h = random_head(rng, 40.0f);
  const TempDir dir;
  const std::string path = write_head_file(h, "", dir.file("capi_src_head.safetensors"));

  EnginePtr engine = make_engine(nullptr, 0, 1e6);  // threshold 0.9
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_load_src_head(engine.get(), path.c_str(), 7));
  REQUIRE_OK(clm_engine_load_src_head(engine.get(), path.c_str(), CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_IO, clm_engine_load_src_head(engine.get(), "/nonexistent/x.safetensors", CLM_GELU_TANH));

  SeqPtr s = admit(engine.get(), 1);
  clm_seq* seqs[] = {s.get()};
  std::vector<float> row(kHidden, 0.5f);
  const int32_t ids[] = {9}, indptr[] = {0, 1};
  const uint8_t failed[] = {0};
  for (int step = 0; step < 4; ++step) {
    clm_src_decision d;
    REQUIRE_OK(clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
    INFO("step " << step);
    CHECK(d.score > 0.95f);
    CHECK(d.threshold == Approx(0.9f));
    CHECK(d.reuse == (step < 3 ? 1 : 0));
    CHECK(d.baseline == (step < 3 ? 0 : 1));
    if (d.reuse) REQUIRE_OK(clm_engine_report_retrieval(engine.get(), seqs, 1, failed));
  }
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
  CHECK(m.src_breaker_trips == 1);
  CHECK(m.src_baseline_sequences == 1);
  CHECK(m.src_retrievals_failed == 3);
  CHECK(m.src_reuse_decisions == 3);
  // A caller compiled against version 1 of clm_metrics gets its fields only.
  const size_t v1 = offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t);
  clm_metrics old;
  std::memset(&old, 0xCD, sizeof old);
  old.struct_size = static_cast<uint32_t>(v1);
  REQUIRE_OK(clm_engine_metrics(&old, engine.get()));
  CHECK(old.admitted == 1);
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&old) + v1;
  for (size_t i = 0; i < sizeof old - v1; ++i) CHECK(tail[i] == 0xCD);

  // A caller compiled against version 1 of clm_engine_options gets the SRC defaults.
  clm_engine_options o1;
  const size_t o1_size = offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double);
  REQUIRE_OK(clm_engine_options_init(&o1, o1_size));
  o1.num_pages = 16;
  clm_engine* e1 = nullptr;
  REQUIRE_OK(clm_engine_create(&e1, &o1));
  EnginePtr old_engine(e1);
  clm_metrics m1;
  m1.struct_size = sizeof m1;
  REQUIRE_OK(clm_engine_metrics(&m1, old_engine.get()));
  CHECK(m1.src_threshold == Approx(0.8));
}

TEST_CASE("SRC C ABI: bad input gets a status and a message", "[capi][clm][bad]") {
  std::mt19937 rng(std::random_device{}());
  EnginePtr engine = make_engine(nullptr, 0);
  EnginePtr other = make_engine(nullptr, 0);
  const Head h = random_head(rng, 0.0f);
  SeqPtr s = admit(engine.get(), 1);
  SeqPtr foreign = admit(other.get(), 1);
  clm_seq* seqs[] = {s.get()};
  std::vector<float> row(kHidden, 0.25f);
  const int32_t ids[] = {9}, indptr[] = {0, 1};
  clm_src_decision d;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  {
    // The device step on a host pool: no device sums (or no CUDA at all), and
    // the host rows are never read.
    const clm_status device_step = clm_engine_src_step_device(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1,
                                                              kHidden, ids, indptr, nullptr);
    CHECK((device_step == CLM_ERR_FAILED_PRECONDITION || device_step == CLM_ERR_UNSUPPORTED));
    const std::string message = clm_last_error();
    CHECK((message.find("device") != std::string::npos || message.find("CUDA") != std::string::npos));
  }
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_src_head(nullptr, kHidden, h.w1.data(), h.b1.data(), h.w2.data(), 0.0f, CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_src_head(engine.get(), 6, h.w1.data(), h.b1.data(), h.w2.data(), 0.0f, CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_src_head(engine.get(), kHidden, nullptr, h.b1.data(), h.w2.data(), 0.0f, CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_set_src_head(engine.get(), kHidden, h.w1.data(), h.b1.data(),
                                                                 h.w2.data(), NAN, CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_load_src_head(engine.get(), nullptr, CLM_GELU_TANH));
  REQUIRE_OK(
      clm_engine_set_src_head(engine.get(), kHidden, h.w1.data(), h.b1.data(), h.w2.data(), 0.0f, CLM_GELU_TANH));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(nullptr, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), seqs, 1, nullptr, CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), 3, 1, kHidden, ids, indptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden / 2, ids, indptr));
  const int32_t bad_indptr[] = {0, 2};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, bad_indptr));
  clm_seq* twice[] = {s.get(), s.get()};
  const int32_t indptr2[] = {0, 1, 1};
  clm_src_decision d2[2];
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(d2, engine.get(), twice, 2, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr2));
  clm_seq* mixed[] = {foreign.get()};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), mixed, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  row[3] = INFINITY;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_report_retrieval(engine.get(), seqs, 1, nullptr));
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
  CHECK(m.src_steps == 0);  // nothing was applied
  REQUIRE_OK(clm_seq_finish(s.get()));
  row[3] = 0.0f;
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_src_step(&d, engine.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, indptr));

  clm_engine_options o;
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = 16;
  clm_engine* e = nullptr;
  o.n_special_token_ids = 3;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  o.n_special_token_ids = 0;
  o.src_breaker_steps = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  o.src_breaker_steps = 3;
  o.src_daily_requests = -1.0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
  CHECK(e == nullptr);
}

namespace {

// A random [dim][hidden] matrix with orthonormal rows (Gram-Schmidt in f64).
std::vector<float> orthonormal_rows(int dim, int hidden, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<std::vector<double>> rows;
  while (static_cast<int>(rows.size()) < dim) {
    std::vector<double> v(static_cast<std::size_t>(hidden));
    for (double& x : v) x = n(rng);
    for (const auto& r : rows) {
      double d = 0;
      for (int c = 0; c < hidden; ++c) d += v[static_cast<std::size_t>(c)] * r[static_cast<std::size_t>(c)];
      for (int c = 0; c < hidden; ++c) v[static_cast<std::size_t>(c)] -= d * r[static_cast<std::size_t>(c)];
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    norm = std::sqrt(norm);
    for (double& x : v) x /= norm;
    rows.push_back(v);
  }
  std::vector<float> out;
  for (const auto& r : rows) {
    for (double x : r) out.push_back(static_cast<float>(x));
  }
  return out;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("snapshots: projection and adapter through the C ABI, against float64", "[capi][clm][snapshot]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int hidden = 16, dim = 4, layers = 6;
  std::normal_distribution<float> n(0.0f, 1.0f);
  EnginePtr engine = make_engine(nullptr, 0);

  // ---- projection: snapshot = normalize(C (x - mean)) -------------------------
  const std::vector<float> comps = orthonormal_rows(dim, hidden, rng);
  std::vector<float> mean(hidden);
  for (float& v : mean) v = n(rng);
  std::vector<float> rows(3 * hidden);
  for (float& v : rows) v = n(rng);
  std::vector<float> snaps(3 * dim, -7.0f);
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_make_snapshots(snaps.data(), snaps.size(), engine.get(),
                                                                      rows.data(), CLM_DTYPE_F32, 3, hidden));
  REQUIRE_OK(clm_engine_set_snapshot_projection(engine.get(), hidden, dim, mean.data(), comps.data()));
  REQUIRE_OK(
      clm_engine_make_snapshots(snaps.data(), snaps.size(), engine.get(), rows.data(), CLM_DTYPE_F32, 3, hidden));
  for (int r = 0; r < 3; ++r) {
    std::vector<double> y(dim, 0.0);
    double norm = 0.0;
    for (int k = 0; k < dim; ++k) {
      for (int c = 0; c < hidden; ++c) {
        y[static_cast<std::size_t>(k)] +=
            static_cast<double>(comps[static_cast<std::size_t>(k * hidden + c)]) *
            (rows[static_cast<std::size_t>(r * hidden + c)] - static_cast<double>(mean[static_cast<std::size_t>(c)]));
      }
      norm += y[static_cast<std::size_t>(k)] * y[static_cast<std::size_t>(k)];
    }
    for (int k = 0; k < dim; ++k) {
      const double ref = y[static_cast<std::size_t>(k)] / std::sqrt(norm);
      CHECK(std::abs(snaps[static_cast<std::size_t>(r * dim + k)] - ref) <= 1e-5);
    }
  }
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_make_snapshots(snaps.data(), snaps.size() - 1, engine.get(),
                                                                   rows.data(), CLM_DTYPE_F32, 3, hidden));

  // ---- adapter: default layers (the last 3), residual_scale 0.3 --------------
  std::vector<float> weight(hidden * dim), bias(hidden);
  for (float& v : weight) v = n(rng);
  for (float& v : bias) v = n(rng);
  clm_adapter_options ao;
  REQUIRE_OK(clm_adapter_options_init(&ao, sizeof ao));
  CHECK(ao.residual_scale == Approx(0.3f));
  ao.num_layers = layers;
  REQUIRE_OK(clm_engine_set_snapshot_adapter(engine.get(), dim, hidden, weight.data(), bias.data(), &ao));

  // Three sequences: a (1 row, apply), b (2 rows, apply=0), c (2 rows, apply, but in baseline).
  SeqPtr a = admit(engine.get(), 1), b = admit(engine.get(), 3), c = admit(engine.get(), 4);
  {  // trip c's breaker: a head that always says 1, three failed lookups
    Head h = random_head(rng, 40.0f);
    REQUIRE_OK(
        clm_engine_set_src_head(engine.get(), kHidden, h.w1.data(), h.b1.data(), h.w2.data(), h.b2, CLM_GELU_TANH));
    clm_seq* only_c[] = {c.get()};
    std::vector<float> row(kHidden, 1.0f);
    const int32_t ids[] = {9}, ip[] = {0, 1};
    const uint8_t failed[] = {0};
    for (int i = 0; i < 3; ++i) {
      clm_src_decision d;
      REQUIRE_OK(clm_engine_src_step(&d, engine.get(), only_c, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, ids, ip));
      REQUIRE_OK(clm_engine_report_retrieval(engine.get(), only_c, 1, failed));
    }
  }
  clm_seq* seqs[] = {a.get(), b.get(), c.get()};
  const int32_t indptr[] = {0, 1, 3, 5};
  const uint8_t apply[] = {1, 0, 1};
  std::vector<float> hs(5 * hidden);
  for (float& v : hs) v = n(rng);
  for (int layer = 0; layer < layers; ++layer) {
    std::vector<float> before = hs;
    REQUIRE_OK(clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, indptr,
                                           snaps.data(), dim, apply, layer));
    for (int r = 0; r < 5; ++r) {
      for (int ch = 0; ch < hidden; ++ch) {
        double expected = before[static_cast<std::size_t>(r * hidden + ch)];
        if (layer >= layers - 3 && r == 0) {  // only sequence a, only the last 3 layers
          double delta = bias[static_cast<std::size_t>(ch)];
          for (int k = 0; k < dim; ++k)
            delta += static_cast<double>(weight[static_cast<std::size_t>(ch * dim + k)]) *
                     snaps[static_cast<std::size_t>(k)];
          expected += 0.3 * delta;
        }
        INFO("layer " << layer << " row " << r << " channel " << ch);
        CHECK(std::abs(hs[static_cast<std::size_t>(r * hidden + ch)] - expected) <= 1e-5 * (1.0 + std::abs(expected)));
      }
    }
  }
  clm_metrics m;
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, engine.get()));
  CHECK(m.src_injections == 3);

  // bf16 hidden states: within 1e-2 of the float64 result.
  std::vector<uint16_t> hb(5 * hidden);
  std::vector<float> hb_f(5 * hidden);
  for (std::size_t i = 0; i < hb.size(); ++i) {
    hb[i] = to_bf16(n(rng));
    hb_f[i] = from_bf16(hb[i]);
  }
  REQUIRE_OK(clm_engine_inject_snapshots(engine.get(), hb.data(), CLM_DTYPE_BF16, 5, hidden, seqs, 3, indptr,
                                         snaps.data(), dim, apply, layers - 1));
  double err = 0, ref_norm = 0;
  for (int ch = 0; ch < hidden; ++ch) {
    double delta = bias[static_cast<std::size_t>(ch)];
    for (int k = 0; k < dim; ++k)
      delta += static_cast<double>(weight[static_cast<std::size_t>(ch * dim + k)]) * snaps[static_cast<std::size_t>(k)];
    const double expected = hb_f[static_cast<std::size_t>(ch)] + 0.3 * delta;
    err += std::pow(from_bf16(hb[static_cast<std::size_t>(ch)]) - expected, 2);
    ref_norm += expected * expected;
  }
  CHECK(std::sqrt(err / ref_norm) <= 1e-2);

  // ---- bad input: nothing changes ---------------------------------------------
  std::vector<float> keep = hs;
  std::vector<float> bad_snaps = snaps;
  bad_snaps[1] = NAN;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, indptr,
                                           bad_snaps.data(), dim, apply, layers - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, indptr,
                                           snaps.data(), dim + 1, apply, layers - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden / 2, seqs, 3, indptr,
                                           snaps.data(), dim, apply, layers - 1));
  const int32_t bad_indptr[] = {0, 1, 6, 5};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, bad_indptr,
                                           snaps.data(), dim, apply, layers - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, indptr,
                                           snaps.data(), dim, nullptr, layers - 1));
  CHECK(hs == keep);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_snapshot_adapter(engine.get(), dim, hidden, weight.data(), bias.data(), nullptr));
  clm_adapter_options bad = ao;
  const int32_t out_of_range[] = {layers};
  bad.layers = out_of_range;
  bad.n_layers = 1;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_snapshot_adapter(engine.get(), dim, hidden, weight.data(), bias.data(), &bad));
  bad = ao;
  bad.struct_size = 3;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_snapshot_adapter(engine.get(), dim, hidden, weight.data(), bias.data(), &bad));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_adapter_options_init(&bad, 5));
  CHECK_STATUS(CLM_ERR_IO, clm_engine_load_snapshot_adapter(engine.get(), "/nonexistent/a.safetensors", &ao));
  CHECK_STATUS(CLM_ERR_IO, clm_engine_load_snapshot_projection(engine.get(), "/nonexistent/p.safetensors"));
  std::vector<float> nan_mean = mean;
  nan_mean[0] = NAN;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_set_snapshot_projection(engine.get(), hidden, dim, nan_mean.data(), comps.data()));
  // the installed parts still work after the refused replacements
  REQUIRE_OK(clm_engine_inject_snapshots(engine.get(), hs.data(), CLM_DTYPE_F32, 5, hidden, seqs, 3, indptr,
                                         snaps.data(), dim, apply, 0));
  CHECK(hs == keep);  // layer 0 does not inject
}

TEST_CASE("snapshot adapter from a safetensors file built byte by byte", "[capi][clm][snapshot]") {
  constexpr int hidden = 3, dim = 2;
  const float weight[hidden * dim] = {1.0f, 0.5f, -2.0f, 0.25f, 0.0f, 3.0f};
  const float bias[hidden] = {0.125f, -1.0f, 2.0f};
  const char header[] =
      "{\"adapter.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
      "\"adapter.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[12,36]}}";
  std::vector<unsigned char> file;
  const uint64_t n = std::strlen(header);
  for (int k = 0; k < 8; ++k) file.push_back(static_cast<unsigned char>((n >> (8 * k)) & 0xFF));
  append_bytes(file, header, n);
  append_bytes(file, bias, sizeof bias);
  append_bytes(file, weight, sizeof weight);
  const TempDir dir;
  const std::string path = dir.file("capi_adapter.safetensors");
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  REQUIRE(std::fwrite(file.data(), 1, file.size(), f) == file.size());
  std::fclose(f);
  EnginePtr engine = make_engine(nullptr, 0);
  clm_adapter_options ao;
  REQUIRE_OK(clm_adapter_options_init(&ao, sizeof ao));
  ao.num_layers = 2;
  const int32_t only_layer_0[] = {0};
  ao.layers = only_layer_0;
  ao.n_layers = 1;
  ao.residual_scale = 0.5f;
  const clm_status s = clm_engine_load_snapshot_adapter(engine.get(), path.c_str(), &ao);
  INFO(clm_last_error());
  REQUIRE(s == CLM_OK);
  SeqPtr seq = admit(engine.get(), 1);
  clm_seq* seqs[] = {seq.get()};
  float hs[hidden] = {1.0f, 1.0f, 1.0f};
  const float snap[dim] = {2.0f, -1.0f};
  const int32_t indptr[] = {0, 1};
  const uint8_t apply[] = {1};
  REQUIRE_OK(
      clm_engine_inject_snapshots(engine.get(), hs, CLM_DTYPE_F32, 1, hidden, seqs, 1, indptr, snap, dim, apply, 1));
  CHECK(hs[0] == 1.0f);  // layer 1 does not inject
  REQUIRE_OK(
      clm_engine_inject_snapshots(engine.get(), hs, CLM_DTYPE_F32, 1, hidden, seqs, 1, indptr, snap, dim, apply, 0));
  for (int ch = 0; ch < hidden; ++ch) {
    const double delta = weight[ch * dim] * 2.0 - weight[ch * dim + 1] + bias[ch];
    CHECK(hs[ch] == Approx(1.0 + 0.5 * delta).epsilon(1e-6));
  }
}

TEST_CASE("SRC head file's gelu metadata: CLM_GELU_FROM_FILE follows it, a contradicting request is refused",
          "[capi][clm]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const Head first = random_head(rng, 0.0f);
  // The two GELU forms differ by at most ~5e-4, so the second head is built to
  // show it: random W1 and row, b1 placing the inner units at +-z where the
  // forms differ most (the gap is even in z, GELU itself nearly odd there, so
  // the logit stays small and f32 keeps it exact), w2 = 5, and b2 centring the
  // erf logit at 0 (steepest sigmoid).
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> row(kHidden);
  for (float& v : row) v = n(rng);
  const std::vector<double> mean(row.begin(), row.end());
  const auto gelu_gap = [](double z) {
    return 0.5 * z * (std::erf(z / std::sqrt(2.0)) - std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
  };
  double widest = 0.0;
  for (double z = -5.0; z <= 5.0; z += 1e-3) widest = std::abs(gelu_gap(z)) > std::abs(gelu_gap(widest)) ? z : widest;
  Head second = random_head(rng, 0.0f);
  second.w2 = {5.0f, 5.0f};
  double logit_erf = 0.0;
  for (int i = 0; i < kInner; ++i) {
    double dot = 0.0;
    for (int c = 0; c < kHidden; ++c)
      dot +=
          static_cast<double>(second.w1[static_cast<std::size_t>(i * kHidden + c)]) * row[static_cast<std::size_t>(c)];
    second.b1[static_cast<std::size_t>(i)] = static_cast<float>((i % 2 == 0 ? widest : -widest) - dot);
    const double z = second.b1[static_cast<std::size_t>(i)] + dot;
    logit_erf += 5.0 * 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
  }
  second.b2 = static_cast<float>(-logit_erf);
  const double ref_erf = reference(second, mean, true), ref_tanh = reference(second, mean, false);
  INFO("GELU forms differ most at z = " << widest << "; scores erf " << ref_erf << ", tanh " << ref_tanh);
  REQUIRE(std::abs(ref_erf - ref_tanh) > 5e-4 * ref_erf);  // 50 times the scores' tolerance
  const TempDir dir;
  const std::string erf_file =
      write_head_file(second, "\"gelu\":\"erf\",\"written_by\":\"test\"", dir.file("capi_head_erf.safetensors"));
  const std::string silent_file = write_head_file(second, "", dir.file("capi_head_silent.safetensors"));
  const std::string odd_file = write_head_file(second, "\"gelu\":\"relu\"", dir.file("capi_head_odd.safetensors"));

  EnginePtr engine = make_engine(nullptr, 0);
  REQUIRE_OK(clm_engine_set_src_head(engine.get(), kHidden, first.w1.data(), first.b1.data(), first.w2.data(), first.b2,
                                     CLM_GELU_TANH));
  // Each refusal names the problem and leaves the first head installed.
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_load_src_head(engine.get(), erf_file.c_str(), CLM_GELU_TANH));
  CHECK(std::string(clm_last_error()).find("erf") != std::string::npos);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_load_src_head(engine.get(), silent_file.c_str(), CLM_GELU_FROM_FILE));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_load_src_head(engine.get(), odd_file.c_str(), CLM_GELU_ERF));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_load_src_head(engine.get(), erf_file.c_str(), -2));
  const double ref_first = reference(first, mean, false);
  CHECK(std::abs(score_one_row(engine.get(), 1, row) - ref_first) <= 1e-5 * ref_first);

  // FROM_FILE takes the file's erf; naming it explicitly agrees; a silent file takes what it is told.
  REQUIRE_OK(clm_engine_load_src_head(engine.get(), erf_file.c_str(), CLM_GELU_FROM_FILE));
  CHECK(std::abs(score_one_row(engine.get(), 3, row) - ref_erf) <= 1e-5 * ref_erf);
  REQUIRE_OK(clm_engine_load_src_head(engine.get(), erf_file.c_str(), CLM_GELU_ERF));
  CHECK(std::abs(score_one_row(engine.get(), 4, row) - ref_erf) <= 1e-5 * ref_erf);
  REQUIRE_OK(clm_engine_load_src_head(engine.get(), silent_file.c_str(), CLM_GELU_TANH));
  CHECK(std::abs(score_one_row(engine.get(), 5, row) - ref_tanh) <= 1e-5 * ref_tanh);
}

TEST_CASE("the files a test writes go with their temporary folder, also when the test fails midway", "[capi][clm]") {
  std::mt19937 rng(std::random_device{}());
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::path folder, file;
  try {
    const TempDir dir;
    folder = dir.path();
    file = write_head_file(random_head(rng, 0.0f), "", dir.file("capi_fails_midway.safetensors"));
    REQUIRE(std::filesystem::is_regular_file(file));
    throw std::runtime_error("fails midway");  // as a failed REQUIRE does (Catch throws)
  } catch (const std::runtime_error&) {
  }
  CHECK(folder.parent_path() == std::filesystem::temp_directory_path());
  CHECK(file.parent_path() == folder);
  CHECK_FALSE(std::filesystem::exists(file));
  CHECK_FALSE(std::filesystem::exists(folder));
  // Nothing in the working directory either.
  CHECK_FALSE(std::filesystem::exists(cwd / file.filename()));
}
