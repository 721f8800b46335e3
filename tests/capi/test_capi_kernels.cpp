// tests/capi/test_capi_kernels.cpp: the C ABI of the attention and KV kernels
// over the engine's pool as a host sees it (only clm.h and libclmcache.so.0):
// a host that brings its own "model" (K/V and queries from a hash of token and
// position) writes the K/V of the uncached tokens at clm_seq_slots, runs
// prefill over the reused prefix pages + the new tokens and decode over a
// ragged batch, and compares with dense float64 attention computed here; page
// copies between engines; and one status check per bad input.
//
// Tolerances: ||out - ref|| / ||ref|| <= 1e-5 against the reference over the
// K/V as stored (bf16: rounded here to nearest even), and for bf16 also
// <= 1e-2 against the reference over the original f32 values.
#include "clm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#if defined(__has_include)
#if __has_include("clm/engine.hpp")
#error "test_capi_kernels must see only clm.h, as a host linking libclmcache.so does"
#endif
#endif

#include "capi_checks.hpp"

#if CLM_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr int32_t kPageSize = 16;
constexpr int32_t kLayers = 2;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kQHeads = 8;  // GQA ratio 4
constexpr int32_t kHeadDim = 64;
constexpr int32_t kPages = 64;
constexpr size_t kRow = static_cast<size_t>(kKvHeads) * kHeadDim;  // floats per token in k or v
constexpr size_t kQRow = static_cast<size_t>(kQHeads) * kHeadDim;  // floats per token in q or out
const float kNaN = std::numeric_limits<float>::quiet_NaN();

clm_engine_options engine_options(int32_t kv_dtype, int32_t memory = CLM_MEMORY_HOST) {
  clm_engine_options o;
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = kPages;
  o.page_size = kPageSize;
  o.num_layers = kLayers;
  o.kv_heads = kKvHeads;
  o.head_dim = kHeadDim;
  o.kv_dtype = kv_dtype;
  o.memory = memory;
  return o;
}

EnginePtr make_engine(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  REQUIRE(e != nullptr);
  return EnginePtr(e);
}
EnginePtr make_engine(int32_t kv_dtype) { return make_engine(engine_options(kv_dtype)); }

SeqPtr admit(clm_engine* e, const std::vector<int32_t>& tokens) {
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, tokens.data(), tokens.size(), nullptr));
  REQUIRE(s != nullptr);
  return SeqPtr(s);
}

std::vector<int32_t> page_table(const clm_seq* s) {
  size_t n = 0;
  const int32_t* p = clm_seq_page_table(s, &n);
  REQUIRE(p != nullptr);
  return {p, p + n};
}

std::vector<int64_t> slots(const clm_seq* s) {
  size_t n = 0;
  const int64_t* p = clm_seq_slots(s, &n);
  REQUIRE((p != nullptr || n == 0));
  return p ? std::vector<int64_t>(p, p + n) : std::vector<int64_t>{};
}

std::vector<int32_t> tokens_from(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

clm_attention_params params(int32_t layer) {
  clm_attention_params p;
  std::memset(&p, 0xAB, sizeof p);
  REQUIRE_OK(clm_attention_params_init(&p, sizeof p));
  p.layer = layer;
  p.num_q_heads = kQHeads;
  return p;
}

// ---- the host's "model": K/V of (layer, token, position) from a hash --------
std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
float unit(std::uint64_t h) {  // in [-1, 1)
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

// K and V rows [n][kv_heads][head_dim] of positions [begin, end) of `tokens` at `layer`.
void model_kv(const std::vector<int32_t>& tokens, int32_t layer, size_t begin, size_t end, std::vector<float>& k,
              std::vector<float>& v) {
  k.assign((end - begin) * kRow, 0.0f);
  v.assign((end - begin) * kRow, 0.0f);
  for (size_t t = begin; t < end; ++t) {
    const std::uint64_t key = mix((static_cast<std::uint64_t>(layer) << 56) ^ (static_cast<std::uint64_t>(t) << 32) ^
                                  static_cast<std::uint32_t>(tokens[t]));
    for (size_t j = 0; j < kRow; ++j) {
      k[(t - begin) * kRow + j] = unit(mix(key ^ (j << 1)));
      v[(t - begin) * kRow + j] = unit(mix(key ^ ((j << 1) | 1)));
    }
  }
}

// Writes the K/V of the tokens at the sequence's slots (its last admit/extend) for every layer.
void write_new_kv(clm_engine* e, const clm_seq* s, const std::vector<int32_t>& tokens) {
  const std::vector<int64_t> sl = slots(s);
  const size_t begin = tokens.size() - sl.size();
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> k, v;
    model_kv(tokens, layer, begin, tokens.size(), k, v);
    REQUIRE_OK(clm_engine_write_kv(e, layer, sl.data(), sl.size(), k.data(), v.data(), k.size(), nullptr));
  }
}

float round_bf16(float x) {  // round to nearest even, as the pool stores it
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float r = 0;
  std::memcpy(&r, &bits, 4);
  return r;
}

// Dense attention in double: the queries q [nq][Hq][D] are the last nq of the
// len tokens whose K/V are k, v [len][H][D] (rounded to bf16 first if asked).
std::vector<double> dense(const std::vector<float>& q, size_t nq, const std::vector<float>& kf,
                          const std::vector<float>& vf, size_t len, bool bf16, double scale, size_t window = 0) {
  std::vector<double> k(kf.size()), v(vf.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = bf16 ? round_bf16(kf[i]) : kf[i];
    v[i] = bf16 ? round_bf16(vf[i]) : vf[i];
  }
  constexpr size_t group = kQHeads / kKvHeads;
  std::vector<double> out(nq * kQRow, 0.0), w(len);
  for (size_t i = 0; i < nq; ++i) {
    const size_t pos = len - nq + i;
    const size_t lo = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    for (size_t hq = 0; hq < static_cast<size_t>(kQHeads); ++hq) {
      const size_t h = hq / group;
      const float* qv = q.data() + i * kQRow + hq * kHeadDim;
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t t = lo; t <= pos; ++t) {
        double dot = 0;
        for (size_t d = 0; d < static_cast<size_t>(kHeadDim); ++d)
          dot += double{qv[d]} * k[t * kRow + h * kHeadDim + d];
        w[t] = dot * scale;
        mx = std::max(mx, w[t]);
      }
      double sum = 0;
      for (size_t t = lo; t <= pos; ++t) sum += (w[t] = std::exp(w[t] - mx));
      double* o = out.data() + i * kQRow + hq * kHeadDim;
      for (size_t t = lo; t <= pos; ++t) {
        for (size_t d = 0; d < static_cast<size_t>(kHeadDim); ++d) o[d] += w[t] / sum * v[t * kRow + h * kHeadDim + d];
      }
    }
  }
  return out;
}

double rel_error(const float* out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double{out[i]} - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);  // NaN if out kept a poisoned value: fails every <= check
}

// out against dense attention over the stored values (and the original ones for bf16).
void check_attention(const std::vector<float>& out, size_t offset, const std::vector<float>& q, size_t nq,
                     const std::vector<float>& k, const std::vector<float>& v, size_t len, bool bf16,
                     double scale = 1.0 / std::sqrt(double{kHeadDim}), size_t window = 0) {
  const double stored = rel_error(out.data() + offset, dense(q, nq, k, v, len, bf16, scale, window));
  INFO("len " << len << ", queries " << nq << ", bf16 " << bf16 << ", window " << window);
  CHECK(stored <= 1e-5);
  if (bf16) CHECK(rel_error(out.data() + offset, dense(q, nq, k, v, len, false, scale, window)) <= 1e-2);
}

std::vector<float> random_q(std::mt19937& rng, size_t rows) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> q(rows * kQRow);
  for (float& x : q) x = n(rng);
  return q;
}

#if CLM_TEST_CUDA
// Device buffers the test uploads host vectors into (each upload its own
// allocation, freed with the object) and reads the last one back from.
class DeviceFloats {
 public:
  DeviceFloats() = default;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() {
    for (void* p : buffers_) cudaFree(p);
  }
  float* upload(const std::vector<float>& host) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, host.size() * sizeof(float)) == cudaSuccess);
    buffers_.push_back(p);
    REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    last_ = static_cast<float*>(p);
    return last_;
  }
  void download(std::vector<float>& host) const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), last_, host.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  }

 private:
  std::vector<void*> buffers_;
  float* last_ = nullptr;
};
#endif

bool all_nan(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float f) { return std::isnan(f); });
}

}  // namespace

TEST_CASE("kernels: write_kv at clm_seq_slots, then prefill over reused prefix pages equals dense attention",
          "[capi][kernels]") {
  const int32_t dtype = GENERATE(CLM_KV_F32, CLM_KV_BF16);
  const bool bf16 = dtype == CLM_KV_BF16;
  INFO("kv_dtype " << dtype);
  std::mt19937 rng(1234);
  EnginePtr e = make_engine(dtype);
  const int32_t layer = 1;
  const clm_attention_params p = params(layer);

  // Request A: 40 prompt tokens, nothing cached; write all of them and prefill.
  const std::vector<int32_t> a = tokens_from(1000, 40);
  SeqPtr sa = admit(e.get(), a);
  REQUIRE(clm_seq_cached_tokens(sa.get()) == 0);
  REQUIRE(slots(sa.get()).size() == a.size());
  write_new_kv(e.get(), sa.get(), a);
  std::vector<float> ka, va;
  model_kv(a, layer, 0, a.size(), ka, va);
  {
    const std::vector<int32_t> table = page_table(sa.get());
    const std::vector<float> q = random_q(rng, a.size());
    std::vector<float> out(q.size(), kNaN);
    REQUIRE_OK(clm_engine_paged_prefill_attention(out.data(), out.size(), e.get(), &p, q.data(), q.size(), 40,
                                                  table.data(), table.size(), 40));
    check_attention(out, 0, q, a.size(), ka, va, a.size(), bf16);
  }
  const std::vector<int32_t> a_table = page_table(sa.get());
  REQUIRE_OK(clm_seq_finish(sa.get()));

  // Request B shares A's 40 tokens and adds 30: the two full pages (32 tokens)
  // are reused; the host writes only the other 38 and prefills them.
  std::vector<int32_t> b = a;
  const std::vector<int32_t> more = tokens_from(5000, 30);
  b.insert(b.end(), more.begin(), more.end());
  SeqPtr sb = admit(e.get(), b);
  const int32_t cached = clm_seq_cached_tokens(sb.get());
  REQUIRE(cached == 32);
  const std::vector<int32_t> b_table = page_table(sb.get());
  REQUIRE(b_table.size() == 5);
  CHECK(b_table[0] == a_table[0]);  // the reused pages are A's
  CHECK(b_table[1] == a_table[1]);
  REQUIRE(slots(sb.get()).size() == b.size() - static_cast<size_t>(cached));
  write_new_kv(e.get(), sb.get(), b);

  std::vector<float> kb, vb;
  model_kv(b, layer, 0, b.size(), kb, vb);
  const size_t n_new = b.size() - static_cast<size_t>(cached);
  const std::vector<float> q = random_q(rng, n_new);
  std::vector<float> out(q.size(), kNaN);
  REQUIRE_OK(clm_engine_paged_prefill_attention(out.data(), out.size(), e.get(), &p, q.data(), q.size(),
                                                static_cast<int32_t>(n_new), b_table.data(), b_table.size(),
                                                static_cast<int32_t>(b.size())));
  check_attention(out, 0, q, n_new, kb, vb, b.size(), bf16);  // over the whole sequence

  SECTION("a sliding window and an explicit softmax scale") {
    clm_attention_params pw = p;
    pw.sliding_window = 20;
    pw.softmax_scale = 0.07f;
    std::fill(out.begin(), out.end(), kNaN);
    REQUIRE_OK(clm_engine_paged_prefill_attention(out.data(), out.size(), e.get(), &pw, q.data(), q.size(),
                                                  static_cast<int32_t>(n_new), b_table.data(), b_table.size(),
                                                  static_cast<int32_t>(b.size())));
    check_attention(out, 0, q, n_new, kb, vb, b.size(), bf16, double{0.07f}, 20);
  }
  SECTION("one new token (the decode path of prefill), at the other layer") {
    const clm_attention_params p0 = params(0);
    std::vector<float> k0, v0;
    model_kv(b, 0, 0, b.size(), k0, v0);
    const std::vector<float> q1(q.end() - static_cast<std::ptrdiff_t>(kQRow), q.end());
    std::vector<float> out1(kQRow, kNaN);
    REQUIRE_OK(clm_engine_paged_prefill_attention(out1.data(), out1.size(), e.get(), &p0, q1.data(), q1.size(), 1,
                                                  b_table.data(), b_table.size(), static_cast<int32_t>(b.size())));
    check_attention(out1, 0, q1, 1, k0, v0, b.size(), bf16);
  }
}

TEST_CASE("kernels: decode over a ragged batch of 3 sequences equals dense attention", "[capi][kernels]") {
  const int32_t dtype = GENERATE(CLM_KV_F32, CLM_KV_BF16);
  const bool bf16 = dtype == CLM_KV_BF16;
  INFO("kv_dtype " << dtype);
  std::mt19937 rng(99);
  EnginePtr e = make_engine(dtype);
  const int32_t layer = 1;
  const clm_attention_params p = params(layer);

  // Prompts of 17, 40 and 5 tokens, then one decoded token each: lengths 18,
  // 41 and 6 (last pages of 2, 9 and 6 rows).
  const size_t lengths[3] = {17, 40, 5};
  std::vector<std::vector<int32_t>> tokens(3);
  std::vector<SeqPtr> seqs;
  for (size_t i = 0; i < 3; ++i) {
    tokens[i] = tokens_from(static_cast<int32_t>(10000 * (i + 1)), lengths[i]);
    seqs.push_back(admit(e.get(), tokens[i]));
    write_new_kv(e.get(), seqs[i].get(), tokens[i]);
    const int32_t next = static_cast<int32_t>(777 + i);
    REQUIRE_OK(clm_seq_extend(seqs[i].get(), &next, 1));
    tokens[i].push_back(next);
    REQUIRE(slots(seqs[i].get()).size() == 1);
    write_new_kv(e.get(), seqs[i].get(), tokens[i]);
  }
  clm_seq* handles[3] = {seqs[0].get(), seqs[1].get(), seqs[2].get()};
  int32_t indptr[4];
  int32_t indices[16];
  int32_t last_page_len[3];
  size_t n_indices = 0;
  REQUIRE_OK(clm_engine_batch_page_table(indptr, indices, 16, &n_indices, last_page_len, e.get(), handles, 3));
  REQUIRE(n_indices == 6);
  CHECK(last_page_len[0] == 2);
  CHECK(last_page_len[1] == 9);
  CHECK(last_page_len[2] == 6);

  const std::vector<float> q = random_q(rng, 3);
  std::vector<float> out(q.size(), kNaN);
  REQUIRE_OK(clm_engine_paged_decode_attention(out.data(), out.size(), e.get(), &p, q.data(), q.size(), indptr, indices,
                                               n_indices, last_page_len, 3));
  for (size_t i = 0; i < 3; ++i) {
    std::vector<float> k, v;
    model_kv(tokens[i], layer, 0, tokens[i].size(), k, v);
    const std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * kQRow),
                                q.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow));
    check_attention(out, i * kQRow, qi, 1, k, v, tokens[i].size(), bf16);
  }

  SECTION("with a sliding window, on one thread") {
    clm_attention_params pw = p;
    pw.sliding_window = 7;
    pw.num_threads = 1;
    std::fill(out.begin(), out.end(), kNaN);
    REQUIRE_OK(clm_engine_paged_decode_attention(out.data(), out.size(), e.get(), &pw, q.data(), q.size(), indptr,
                                                 indices, n_indices, last_page_len, 3));
    for (size_t i = 0; i < 3; ++i) {
      std::vector<float> k, v;
      model_kv(tokens[i], layer, 0, tokens[i].size(), k, v);
      const std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * kQRow),
                                  q.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow));
      check_attention(out, i * kQRow, qi, 1, k, v, tokens[i].size(), bf16, 1.0 / std::sqrt(double{kHeadDim}), 7);
    }
  }
  SECTION("an empty batch writes nothing") {
    const int32_t zero = 0;
    REQUIRE_OK(clm_engine_paged_decode_attention(nullptr, 0, e.get(), &p, nullptr, 0, &zero, nullptr, 0, nullptr, 0));
  }
}

TEST_CASE("kernels: copy, gather and scatter whole pages between engines", "[capi][kernels]") {
  std::mt19937 rng(7);
  EnginePtr src = make_engine(CLM_KV_F32);
  EnginePtr dst = make_engine(CLM_KV_F32);
  const std::vector<int32_t> t = tokens_from(300, 40);
  SeqPtr s = admit(src.get(), t);
  write_new_kv(src.get(), s.get(), t);
  const std::vector<int32_t> src_table = page_table(s.get());

  // Pages in dst held by a sequence of other tokens: copy src's pages into them.
  SeqPtr d = admit(dst.get(), tokens_from(9000, 40));
  const std::vector<int32_t> dst_table = page_table(d.get());
  REQUIRE(dst_table.size() == src_table.size());
  REQUIRE_OK(
      clm_engine_copy_pages(dst.get(), dst_table.data(), src.get(), src_table.data(), src_table.size(), nullptr));

  const clm_attention_params p = params(1);
  const std::vector<float> q = random_q(rng, 40);
  std::vector<float> out_src(q.size(), kNaN), out_dst(q.size(), kNaN);
  REQUIRE_OK(clm_engine_paged_prefill_attention(out_src.data(), out_src.size(), src.get(), &p, q.data(), q.size(), 40,
                                                src_table.data(), src_table.size(), 40));
  REQUIRE_OK(clm_engine_paged_prefill_attention(out_dst.data(), out_dst.size(), dst.get(), &p, q.data(), q.size(), 40,
                                                dst_table.data(), dst_table.size(), 40));
  CHECK(std::memcmp(out_src.data(), out_dst.data(), out_src.size() * sizeof(float)) == 0);

  // gather: the pages' bytes as clm_engine_kv_layout addresses them; scatter back elsewhere.
  clm_kv_layout layout;
  layout.struct_size = sizeof layout;
  REQUIRE_OK(clm_engine_kv_layout(&layout, src.get()));
  std::vector<unsigned char> buffer(src_table.size() * layout.page_bytes + 8, 0xCD);
  REQUIRE_OK(
      clm_engine_gather_pages(buffer.data(), buffer.size(), src.get(), src_table.data(), src_table.size(), nullptr));
  for (size_t i = 0; i < src_table.size(); ++i) {
    const auto* page =
        static_cast<const unsigned char*>(layout.base) + static_cast<size_t>(src_table[i]) * layout.page_bytes;
    CHECK(std::memcmp(buffer.data() + i * layout.page_bytes, page, layout.page_bytes) == 0);
  }
  CHECK(buffer.back() == 0xCD);  // nothing past n_pages * page_bytes

  SeqPtr d2 = admit(dst.get(), tokens_from(20000, 40));
  const std::vector<int32_t> d2_table = page_table(d2.get());
  REQUIRE_OK(
      clm_engine_scatter_pages(dst.get(), d2_table.data(), d2_table.size(), buffer.data(), buffer.size(), nullptr));
  std::fill(out_dst.begin(), out_dst.end(), kNaN);
  REQUIRE_OK(clm_engine_paged_prefill_attention(out_dst.data(), out_dst.size(), dst.get(), &p, q.data(), q.size(), 40,
                                                d2_table.data(), d2_table.size(), 40));
  CHECK(std::memcmp(out_src.data(), out_dst.data(), out_src.size() * sizeof(float)) == 0);
}

TEST_CASE("kernels: clm_attention_params_init fills defaults and checks struct_size", "[capi][kernels][errors]") {
  clm_attention_params p;
  std::memset(&p, 0xAB, sizeof p);
  REQUIRE_OK(clm_attention_params_init(&p, sizeof p));
  CHECK(p.struct_size == sizeof p);
  CHECK(p.layer == 0);
  CHECK(p.num_q_heads == 0);
  CHECK(p.softmax_scale == 0.0f);
  CHECK(p.sliding_window == 0);
  CHECK(p.num_threads == 0);
  CHECK(p.stream == nullptr);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_attention_params_init(nullptr, sizeof p));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_attention_params_init(&p, 0));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_attention_params_init(&p, sizeof p - 1));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_attention_params_init(&p, sizeof p + 8));
}

TEST_CASE("kernels: every bad input gives a status, a message, and writes nothing", "[capi][kernels][errors]") {
  EnginePtr e = make_engine(CLM_KV_F32);
  const std::vector<int32_t> t = tokens_from(42, 40);
  SeqPtr s = admit(e.get(), t);
  write_new_kv(e.get(), s.get(), t);
  const std::vector<int32_t> table = page_table(s.get());
  const std::vector<int64_t> sl = slots(s.get());
  std::vector<float> k, v;
  model_kv(t, 0, 0, t.size(), k, v);
  std::mt19937 rng(5);
  const std::vector<float> q = random_q(rng, 40);
  std::vector<float> out(q.size(), kNaN);
  const clm_attention_params p = params(0);
  const int32_t n = 40;
  clm_engine* E = e.get();

  SECTION("write_kv") {
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(nullptr, 0, sl.data(), sl.size(), k.data(), v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, nullptr, sl.size(), k.data(), v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, sl.data(), sl.size(), nullptr, v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, sl.data(), sl.size(), k.data(), nullptr, k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, sl.data(), sl.size(), k.data(), v.data(), k.size() - 1, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, sl.data(), sl.size() - 1, k.data(), v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, sl.data(), SIZE_MAX / 2, k.data(), v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, kLayers, sl.data(), sl.size(), k.data(), v.data(), k.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, -1, sl.data(), sl.size(), k.data(), v.data(), k.size(), nullptr));
    std::vector<int64_t> bad = sl;
    bad.back() = int64_t{kPages} * kPageSize;  // one past the pool
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, bad.data(), bad.size(), k.data(), v.data(), k.size(), nullptr));
    bad.back() = -1;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_write_kv(E, 0, bad.data(), bad.size(), k.data(), v.data(), k.size(), nullptr));
    // Nothing to write: fine with NULL arrays.
    REQUIRE_OK(clm_engine_write_kv(E, 0, nullptr, 0, nullptr, nullptr, 0, nullptr));
  }

  SECTION("prefill") {
    const int32_t* pg = table.data();
    const size_t np = table.size();
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), nullptr, &p,
                                                                              q.data(), q.size(), n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(nullptr, out.size(), E, &p, q.data(), q.size(), n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, nullptr,
                                                                              q.data(), q.size(), n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, nullptr, q.size(), n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n, nullptr, np, n));
    // struct_size this library does not know
    clm_attention_params bad = p;
    bad.struct_size = 0;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    bad.struct_size = sizeof bad + 4;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    // head counts: 0, negative, and ones kv_heads (2) does not divide (q sized for them)
    bad = p;
    bad.num_q_heads = 0;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    bad.num_q_heads = -8;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    bad.num_q_heads = 5;
    const size_t len5 = size_t{40} * 5 * kHeadDim;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), len5, E, &bad, q.data(), len5, n, pg, np, n));
    // other params
    bad = p;
    bad.layer = kLayers;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    bad = p;
    bad.sliding_window = -1;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    bad = p;
    bad.softmax_scale = kNaN;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &bad, q.data(), q.size(), n, pg, np, n));
    // lengths that do not match the shape
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size() - 1, n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size() - kQRow, E, &p,
                                                                              q.data(), q.size(), n, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n - 1, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n, pg, np, n - 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(), q.size(), -1, pg, np, n));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n, pg, np - 1, n));
    // page ids outside the pool (a hand-made page table)
    std::vector<int32_t> pages = table;
    pages[1] = kPages;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n, pages.data(), np, n));
    pages[1] = -1;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(),
                                                                              q.size(), n, pages.data(), np, n));
    // non-finite queries, and out overlapping q
    std::vector<float> qnan = q;
    qnan[1234] = kNaN;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p,
                                                                              qnan.data(), qnan.size(), n, pg, np, n));
    qnan[1234] = std::numeric_limits<float>::infinity();
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p,
                                                                              qnan.data(), qnan.size(), n, pg, np, n));
    std::vector<float> inplace = q;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_prefill_attention(inplace.data(), inplace.size(), E, &p, inplace.data(),
                                                    inplace.size(), n, pg, np, n));
    CHECK(inplace == q);
  }

  SECTION("decode") {
    clm_seq* h[1] = {s.get()};
    int32_t indptr[2];
    int32_t indices[8];
    int32_t last[1];
    size_t ni = 0;
    REQUIRE_OK(clm_engine_batch_page_table(indptr, indices, 8, &ni, last, E, h, 1));
    const std::vector<float> q1(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(kQRow));
    std::vector<float> o1(kQRow, kNaN);
    const size_t nq = q1.size();
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, nullptr, &p, q1.data(), nq,
                                                                             indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_decode_attention(nullptr, nq, E, &p, q1.data(), nq, indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, nullptr, q1.data(), nq,
                                                                             indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_decode_attention(o1.data(), nq, E, &p, nullptr, nq, indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq, nullptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq, indptr, nullptr, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni, nullptr, 1));
    clm_attention_params bad = p;
    bad.struct_size = 3;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &bad, q1.data(), nq,
                                                                             indptr, indices, ni, last, 1));
    bad = p;
    bad.num_q_heads = 3;  // kv_heads 2 does not divide it
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_paged_decode_attention(o1.data(), 3 * kHeadDim, E, &bad, q1.data(), 3 * kHeadDim, indptr,
                                                   indices, ni, last, 1));
    // lengths
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq + 1,
                                                                             indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq - 1, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni - 1, last, 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni, last, SIZE_MAX / 4));
    // malformed CSR arrays
    int32_t bad_indptr[2] = {indptr[1], indptr[0]};  // decreasing
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             bad_indptr, indices, ni, last, 1));
    int32_t bad_last[1] = {0};
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni, bad_last, 1));
    bad_last[0] = kPageSize + 1;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, indices, ni, bad_last, 1));
    // page ids outside the pool (a hand-made indices array)
    int32_t bad_indices[8];
    std::copy(indices, indices + ni, bad_indices);
    bad_indices[ni - 1] = kPages;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, bad_indices, ni, last, 1));
    bad_indices[0] = -3;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, q1.data(), nq,
                                                                             indptr, bad_indices, ni, last, 1));
    // a NaN query
    std::vector<float> qnan = q1;
    qnan[7] = kNaN;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_paged_decode_attention(o1.data(), nq, E, &p, qnan.data(), nq,
                                                                             indptr, indices, ni, last, 1));
    CHECK(all_nan(o1));
  }

  SECTION("copy, gather, scatter") {
    const size_t np = table.size();
    clm_kv_layout layout;
    layout.struct_size = sizeof layout;
    REQUIRE_OK(clm_engine_kv_layout(&layout, E));
    std::vector<unsigned char> buffer(np * layout.page_bytes);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(nullptr, table.data(), E, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(E, table.data(), nullptr, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(E, nullptr, E, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(E, table.data(), E, nullptr, np, nullptr));
    std::vector<int32_t> outside = table;
    outside[0] = kPages;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(E, outside.data(), E, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(E, table.data(), E, outside.data(), np, nullptr));
    clm_engine_options other = engine_options(CLM_KV_BF16);  // another layout
    EnginePtr e2 = make_engine(other);
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_copy_pages(e2.get(), table.data(), E, table.data(), np, nullptr));

    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(nullptr, buffer.size(), E, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(buffer.data(), buffer.size(), nullptr, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(buffer.data(), buffer.size(), E, nullptr, np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(buffer.data(), buffer.size() - 1, E, table.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(buffer.data(), buffer.size(), E, table.data(), SIZE_MAX / 2, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_gather_pages(buffer.data(), buffer.size(), E, outside.data(), np, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_scatter_pages(nullptr, table.data(), np, buffer.data(), buffer.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_scatter_pages(E, nullptr, np, buffer.data(), buffer.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_scatter_pages(E, table.data(), np, nullptr, buffer.size(), nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_scatter_pages(E, table.data(), np, buffer.data(), buffer.size() - 1, nullptr));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
                 clm_engine_scatter_pages(E, outside.data(), np, buffer.data(), buffer.size(), nullptr));
  }

  // The pool still holds what write_new_kv wrote: prefill matches dense attention.
  REQUIRE_OK(clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(), q.size(), n, table.data(),
                                                table.size(), n));
  check_attention(out, 0, q, 40, k, v, 40, false);
}

TEST_CASE("kernels: an engine without KV bytes (CLM_MEMORY_NONE) is a failed precondition", "[capi][kernels][errors]") {
  EnginePtr e = make_engine(engine_options(CLM_KV_F32, CLM_MEMORY_NONE));
  const std::vector<int32_t> t = tokens_from(1, 20);
  SeqPtr s = admit(e.get(), t);
  const std::vector<int32_t> table = page_table(s.get());
  const std::vector<int64_t> sl = slots(s.get());
  std::vector<float> k, v;
  model_kv(t, 0, 0, t.size(), k, v);
  std::mt19937 rng(3);
  const std::vector<float> q = random_q(rng, 20);
  std::vector<float> out(q.size(), kNaN);
  const clm_attention_params p = params(0);
  clm_engine* E = e.get();
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_write_kv(E, 0, sl.data(), sl.size(), k.data(), v.data(), k.size(), nullptr));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_paged_prefill_attention(out.data(), out.size(), E, &p, q.data(), q.size(), 20, table.data(),
                                                  table.size(), 20));
  clm_seq* h[1] = {s.get()};
  int32_t indptr[2];
  int32_t indices[4];
  int32_t last[1];
  size_t ni = 0;
  REQUIRE_OK(clm_engine_batch_page_table(indptr, indices, 4, &ni, last, E, h, 1));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_paged_decode_attention(out.data(), kQRow, E, &p, q.data(), kQRow,
                                                                              indptr, indices, ni, last, 1));
  EnginePtr host = make_engine(CLM_KV_F32);
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_copy_pages(E, table.data(), host.get(), table.data(), table.size(), nullptr));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_copy_pages(host.get(), table.data(), E, table.data(), table.size(), nullptr));
  std::vector<unsigned char> buffer(1 << 20);
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_gather_pages(buffer.data(), buffer.size(), E, table.data(), table.size(), nullptr));
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION,
               clm_engine_scatter_pages(E, table.data(), table.size(), buffer.data(), buffer.size(), nullptr));
  CHECK(all_nan(out));
}

TEST_CASE("kernels: a device pool is unsupported where CUDA or a GPU is missing", "[capi][kernels]") {
  clm_engine* e = nullptr;
  const clm_engine_options o = engine_options(CLM_KV_F32, CLM_MEMORY_DEVICE);
  const clm_status created = clm_engine_create(&e, &o);
  if (created == CLM_OK) {
    clm_engine_free(e);
    std::cout << "SKIPPED (a usable CUDA device is here: the next case runs the kernels on it)\n";
    return;
  }
  CHECK(created == CLM_ERR_UNSUPPORTED);
  CHECK(e == nullptr);
}

// The same host flow as the first case, on a device pool: K/V and queries in
// device memory (copied there with the CUDA runtime, as a host with its own
// weights on the GPU has them), page tables and slots on the host.
TEST_CASE("kernels: a device pool runs the CUDA kernels: write_kv, prefill over reused pages, decode",
          "[capi][kernels][cuda]") {
#if !CLM_TEST_CUDA
  std::cout << "SKIPPED (no usable CUDA device: this build has no CUDA)\n";
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::cout << "SKIPPED (no usable CUDA device: cudaGetDeviceCount found none)\n";
    return;
  }
  const int32_t dtype = GENERATE(CLM_KV_F32, CLM_KV_BF16);
  const bool bf16 = dtype == CLM_KV_BF16;
  INFO("kv_dtype " << dtype);
  std::mt19937 rng(4321);
  EnginePtr e = make_engine(engine_options(dtype, CLM_MEMORY_DEVICE));
  const int32_t layer = 1;
  const clm_attention_params p = params(layer);
  DeviceFloats dk, dv, dq, dout;

  // Request A: 40 tokens, written and prefilled, then finished (cached).
  const std::vector<int32_t> a = tokens_from(2000, 40);
  SeqPtr sa = admit(e.get(), a);
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<float> k, v;
    model_kv(a, l, 0, a.size(), k, v);
    const std::vector<int64_t> sl = slots(sa.get());
    REQUIRE_OK(clm_engine_write_kv(e.get(), l, sl.data(), sl.size(), dk.upload(k), dv.upload(v), k.size(), nullptr));
  }
  REQUIRE_OK(clm_seq_finish(sa.get()));

  // Request B reuses A's two full pages and adds 30 tokens.
  std::vector<int32_t> b = a;
  const std::vector<int32_t> more = tokens_from(6000, 30);
  b.insert(b.end(), more.begin(), more.end());
  SeqPtr sb = admit(e.get(), b);
  const int32_t cached = clm_seq_cached_tokens(sb.get());
  REQUIRE(cached == 32);
  const std::vector<int64_t> sl = slots(sb.get());
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<float> k, v;
    model_kv(b, l, static_cast<size_t>(cached), b.size(), k, v);
    REQUIRE_OK(clm_engine_write_kv(e.get(), l, sl.data(), sl.size(), dk.upload(k), dv.upload(v), k.size(), nullptr));
  }
  std::vector<float> kb, vb;
  model_kv(b, layer, 0, b.size(), kb, vb);
  const std::vector<int32_t> table = page_table(sb.get());
  const size_t n_new = b.size() - static_cast<size_t>(cached);
  const std::vector<float> q = random_q(rng, n_new);
  std::vector<float> out(q.size(), kNaN);
  float* d_out = dout.upload(out);
  REQUIRE_OK(clm_engine_paged_prefill_attention(d_out, out.size(), e.get(), &p, dq.upload(q), q.size(),
                                                static_cast<int32_t>(n_new), table.data(), table.size(),
                                                static_cast<int32_t>(b.size())));
  dout.download(out);
  check_attention(out, 0, q, n_new, kb, vb, b.size(), bf16);

  // Decode: one query at the last position, through the batched entry point.
  const std::vector<float> q1(q.end() - static_cast<std::ptrdiff_t>(kQRow), q.end());
  const int32_t indptr[] = {0, static_cast<int32_t>(table.size())};
  const int32_t last_page_len[] = {static_cast<int32_t>(b.size()) -
                                   (static_cast<int32_t>(table.size()) - 1) * kPageSize};
  std::vector<float> out1(kQRow, kNaN);
  float* d_out1 = dout.upload(out1);
  REQUIRE_OK(clm_engine_paged_decode_attention(d_out1, out1.size(), e.get(), &p, dq.upload(q1), q1.size(), indptr,
                                               table.data(), table.size(), last_page_len, 1));
  dout.download(out1);
  check_attention(out1, 0, q1, 1, kb, vb, b.size(), bf16);

  // Host activations for a device pool are refused (never read as device memory).
  std::vector<float> k_host, v_host;
  model_kv(b, 0, static_cast<size_t>(cached), b.size(), k_host, v_host);
  const clm_status refused =
      clm_engine_write_kv(e.get(), 0, sl.data(), sl.size(), k_host.data(), v_host.data(), k_host.size(), nullptr);
  CHECK((refused == CLM_ERR_INVALID_ARGUMENT || refused == CLM_ERR_UNSUPPORTED));

  // The SRC running mean on the device (clm_engine_src_step_device) equals
  // the host step of an engine with a host pool, step after step: a prefill
  // of 5 rows (one special), then single decode rows.
  constexpr int32_t kSrcHidden = 64;
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  std::vector<float> w1(kSrcHidden / 4 * kSrcHidden), b1(kSrcHidden / 4), w2(kSrcHidden / 4);
  for (std::vector<float>* w : {&w1, &b1, &w2}) {
    for (float& x : *w) x = u(rng);
  }
  EnginePtr host = make_engine(engine_options(CLM_KV_F32, CLM_MEMORY_HOST));
  for (clm_engine* en : {e.get(), host.get()}) {
    REQUIRE_OK(clm_engine_set_src_head(en, kSrcHidden, w1.data(), b1.data(), w2.data(), 0.1f, CLM_GELU_TANH));
  }
  SeqPtr on_device = admit(e.get(), tokens_from(9000, 8));
  SeqPtr on_host = admit(host.get(), tokens_from(9000, 8));
  clm_seq* device_seqs[] = {on_device.get()};
  clm_seq* host_seqs[] = {on_host.get()};
  DeviceFloats d_attn;
  int32_t* d_ids = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d_ids), 8 * sizeof(int32_t)) == cudaSuccess);
  clm_src_decision got{}, want{};
  for (int step = 0; step < 4; ++step) {
    const int32_t rows = step == 0 ? 5 : 1;
    std::vector<float> attn(static_cast<size_t>(rows) * kSrcHidden);
    for (float& x : attn) x = u(rng);
    std::vector<int32_t> ids(static_cast<size_t>(rows), 11);
    REQUIRE(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
    const int32_t step_indptr[] = {0, rows};
    REQUIRE_OK(clm_engine_src_step_device(&got, e.get(), device_seqs, 1, d_attn.upload(attn), CLM_DTYPE_F32,
                                          static_cast<size_t>(rows), kSrcHidden, d_ids, step_indptr, nullptr));
    REQUIRE_OK(clm_engine_src_step(&want, host.get(), host_seqs, 1, attn.data(), CLM_DTYPE_F32,
                                   static_cast<size_t>(rows), kSrcHidden, ids.data(), step_indptr));
    CHECK(got.scored == 1);
    CHECK(std::abs(got.score - want.score) <= 2e-5f);
    CHECK(got.reuse == want.reuse);
  }
  // host rows for the device step, and the device sequence on the host step: refused
  std::vector<float> one_row(kSrcHidden, 0.1f);
  const int32_t one_indptr[] = {0, 1};
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_src_step_device(&got, e.get(), device_seqs, 1, one_row.data(), CLM_DTYPE_F32, 1, kSrcHidden,
                                          d_ids, one_indptr, nullptr));
  const int32_t host_id[] = {11};
  CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_src_step(&got, e.get(), device_seqs, 1, one_row.data(),
                                                                CLM_DTYPE_F32, 1, kSrcHidden, host_id, one_indptr));
  cudaFree(d_ids);
#endif
}
