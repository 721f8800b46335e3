// CPU attention and KV kernels (clm/kernels/attention.hpp) against a float64 dense
// reference, on fresh random inputs each run (the seed is printed on failure).
//
// Reference: dense softmax attention in double over the K/V values *as stored*
// (rounded to the pool's dtype with detail/half.hpp, itself checked in the
// first test). Bounds: ||out - ref|| / ||ref|| <= 1e-5 for every dtype against
// that reference, and for f16/bf16 also <= 1e-2 against the reference over
// the original f32 values. Outputs are NaN-poisoned before each call; unused
// pool bytes are 0xff (NaN in every dtype), so a read of a wrong slot shows.
// Every kernel runs with the scalar and (where the machine has it) the AVX2
// code, with 1 and all threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>

#include "child_process.hpp"
#endif

#include "alloc_fault.hpp"
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "../lib/kernels/attention_cpu_prefetch.hpp"  // the decode's prefetch stream (x86 kernels only)
#define CLM_TEST_PREFETCH_STREAM 1
#endif
#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"
#include "clm/engine.hpp"
#include "clm/kernels/attention.hpp"
#include "test_support.hpp"

using clm::KvDType;
using clm::PagedKvView;
using clm::StatusCode;

namespace {

constexpr int kShrink = clm_test::kUnderAsan ? 2 : 1;  // ASan: shorter sequences, same coverage
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A fresh seed per test case; CLM_TEST_SEED=<n> replays a failure.
std::uint64_t fresh_seed() {
  if (const char* env = std::getenv("CLM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  // Uniform in [-a, a], never exactly 0.
  float uniform(float a) {
    for (;;) {
      const float x = std::uniform_real_distribution<float>(-a, a)(gen);
      if (x != 0.0f) return x;
    }
  }
  int range(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  std::vector<float> vec(std::size_t n, float a) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(a);
    return v;
  }
};

// Restores the automatic ISA and chunking when a test ends.
struct KernelSettings {
  ~KernelSettings() {
    (void)clm::detail::set_cpu_isa(clm::detail::cpu_isa_best());
    clm::detail::set_decode_chunk_tokens(0);
    clm::detail::set_prefill_route(clm::detail::PrefillRoute::automatic);
  }
  void isa(clm::detail::CpuIsa isa) { REQUIRE(clm::detail::set_cpu_isa(isa).ok()); }
};

float round_to(KvDType dtype, float x) {
  switch (dtype) {
    case KvDType::f16: return clm::detail::f16_to_f32(clm::detail::f32_to_f16(x));
    case KvDType::bf16: return clm::detail::bf16_to_f32(clm::detail::f32_to_bf16(x));
    case KvDType::f32: break;
  }
  return x;
}

struct TestPool {
  std::unique_ptr<clm::PagedKvPool> pool;
  PagedKvView view;
};

TestPool make_pool(std::int32_t pages, std::int32_t page_size, std::int32_t layers, std::int32_t kv_heads,
                   std::int32_t head_dim, KvDType dtype) {
  clm::PagedKvPoolConfig c;
  c.num_pages = pages;
  c.page_size = page_size;
  c.num_layers = layers;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.memory = clm::MemoryKind::host;
  TestPool t;
  REQUIRE(clm::PagedKvPool::create(c, t.pool).ok());
  std::memset(t.pool->data(), 0xff, t.pool->storage_bytes());  // NaN in f32, f16 and bf16
  t.view = PagedKvView::of(*t.pool);
  return t;
}

// One sequence's K/V as f32 [len][kv_heads][head_dim], and its pages.
struct Seq {
  std::int32_t len = 0;
  std::vector<float> k, v;
  std::vector<std::int32_t> pages;
};

std::vector<std::int64_t> slots_of(const std::vector<std::int32_t>& pages, std::int32_t page_size, std::int32_t begin,
                                   std::int32_t end) {
  std::vector<std::int64_t> slots;
  for (std::int32_t t = begin; t < end; ++t) {
    slots.push_back(static_cast<std::int64_t>(pages[static_cast<std::size_t>(t / page_size)]) * page_size + t % page_size);
  }
  return slots;
}

// Writes tokens [begin, end) of seq into its pages.
void write_seq(const PagedKvView& kv, std::int32_t layer, const Seq& s, std::int32_t begin, std::int32_t end) {
  const std::size_t row = static_cast<std::size_t>(kv.kv_heads) * static_cast<std::size_t>(kv.head_dim);
  const auto slots = slots_of(s.pages, kv.page_size, begin, end);
  const clm::Status st = clm::write_kv(kv, layer, s.k.data() + static_cast<std::size_t>(begin) * row,
                                       s.v.data() + static_cast<std::size_t>(begin) * row, slots);
  REQUIRE(st.ok());
}

// Dense attention in double: queries are the last nq tokens of a sequence of
// len tokens with K/V [len][H][D] (rounded to `dtype` first unless f32).
std::vector<double> reference(const std::vector<float>& q, int nq, const Seq& s, int kv_heads, int q_heads, int dim,
                              float scale, int window, KvDType dtype) {
  const int group = q_heads / kv_heads;
  std::vector<double> out(static_cast<std::size_t>(nq) * q_heads * dim);
  std::vector<double> k(s.k.size()), v(s.v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = round_to(dtype, s.k[i]);
    v[i] = round_to(dtype, s.v[i]);
  }
  std::vector<double> w(static_cast<std::size_t>(s.len));
  for (int i = 0; i < nq; ++i) {
    const int pos = s.len - nq + i;
    const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int hq = 0; hq < q_heads; ++hq) {
      const int h = hq / group;
      const float* qv = q.data() + (static_cast<std::size_t>(i) * q_heads + hq) * dim;
      double mx = -std::numeric_limits<double>::infinity();
      for (int t = lo; t <= pos; ++t) {
        const double* kr = k.data() + (static_cast<std::size_t>(t) * kv_heads + h) * dim;
        double dot = 0;
        for (int d = 0; d < dim; ++d) dot += static_cast<double>(qv[d]) * kr[d];
        w[static_cast<std::size_t>(t)] = dot * scale;
        mx = std::max(mx, w[static_cast<std::size_t>(t)]);
      }
      double sum = 0;
      for (int t = lo; t <= pos; ++t) sum += (w[static_cast<std::size_t>(t)] = std::exp(w[static_cast<std::size_t>(t)] - mx));
      double* o = out.data() + (static_cast<std::size_t>(i) * q_heads + hq) * dim;
      for (int t = lo; t <= pos; ++t) {
        const double* vr = v.data() + (static_cast<std::size_t>(t) * kv_heads + h) * dim;
        const double p = w[static_cast<std::size_t>(t)] / sum;
        for (int d = 0; d < dim; ++d) o[d] += p * vr[d];
      }
    }
  }
  return out;
}

double rel_error(const float* out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = static_cast<double>(out[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);  // NaN if out has a NaN: fails every <= check
}

// Checks out (rows of several sequences concatenated) against the references.
void check_close(const std::vector<float>& out, const std::vector<double>& ref_rounded,
                 const std::vector<double>& ref_original, KvDType dtype) {
  const double e = rel_error(out.data(), ref_rounded);
  INFO("relative error vs dtype-rounded reference: " << e);
  CHECK(e <= 1e-5);
  if (dtype != KvDType::f32) {
    const double e2 = rel_error(out.data(), ref_original);
    INFO("relative error vs f32-original reference: " << e2);
    CHECK(e2 <= 1e-2);
  }
}

Seq random_seq(Rng& rng, int len, int kv_heads, int dim) {
  Seq s;
  s.len = len;
  const std::size_t n = static_cast<std::size_t>(len) * kv_heads * dim;
  s.k = rng.vec(n, 1.0f);
  s.v = rng.vec(n, 1.0f);
  return s;
}

// Hands out distinct pages in random order (the last pool page included).
struct PageDealer {
  std::vector<std::int32_t> free;
  PageDealer(std::int32_t pages, Rng& rng) : free(static_cast<std::size_t>(pages)) {
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), rng.gen);
    // The last page of the pool goes first: a read past a page would leave it.
    std::iter_swap(free.begin(), std::find(free.begin(), free.end(), pages - 1));
    std::reverse(free.begin(), free.end());
  }
  std::vector<std::int32_t> take(std::size_t n) {
    REQUIRE(free.size() >= n);
    std::vector<std::int32_t> out(free.end() - static_cast<std::ptrdiff_t>(n), free.end());
    free.resize(free.size() - n);
    std::reverse(out.begin(), out.end());
    return out;
  }
};

// Deals each sequence its pages, writes its K/V there (layer `layer`), and
// returns the batch's page table in FlashInfer's CSR form.
clm::PagedBatch place_seqs(const TestPool& p, std::int32_t layer, std::vector<Seq>& seqs, PageDealer& dealer,
                           std::int32_t page_size) {
  clm::PagedBatch pb;
  pb.indptr.push_back(0);
  for (Seq& s : seqs) {
    s.pages = dealer.take(static_cast<std::size_t>((s.len + page_size - 1) / page_size));
    write_seq(p.view, layer, s, 0, s.len);
    pb.indices.insert(pb.indices.end(), s.pages.begin(), s.pages.end());
    pb.indptr.push_back(static_cast<std::int32_t>(pb.indices.size()));
    pb.last_page_len.push_back(s.len - (static_cast<std::int32_t>(s.pages.size()) - 1) * page_size);
  }
  return pb;
}

const KvDType kDtypes[] = {KvDType::f32, KvDType::f16, KvDType::bf16};

// One prefill of n_new new tokens over a cached prefix of random K/V, in a
// pool of a page or two more than it needs, dealt at random, checked against
// float64 attention (over the dtype-rounded K/V, and loosely the originals).
void check_prefill(Rng& rng, KvDType dtype, int page_size, int kv_heads, int q_heads, int dim, int prefix, int n_new,
                   int window, int threads) {
  const int len = prefix + n_new;
  Seq s = random_seq(rng, len, kv_heads, dim);
  const auto npages = static_cast<std::size_t>((len + page_size - 1) / page_size);
  TestPool p = make_pool(static_cast<std::int32_t>(npages) + rng.range(0, 2), page_size, 1, kv_heads, dim, dtype);
  PageDealer dealer(p.view.num_pages, rng);
  s.pages = dealer.take(npages);
  write_seq(p.view, 0, s, 0, prefix);    // the cached prefix
  write_seq(p.view, 0, s, prefix, len);  // the new tokens
  const auto q = rng.vec(static_cast<std::size_t>(n_new) * q_heads * dim, 3.0f);
  std::vector<float> out(q.size(), kNaN);
  clm::AttentionParams params;
  params.num_q_heads = q_heads;
  params.sliding_window = window;
  params.num_threads = threads;
  const clm::Status st = clm::paged_prefill_attention(p.view, params, q.data(), n_new, s.pages, len, out.data());
  INFO(st.message());
  REQUIRE(st.ok());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<double> ref_orig;
  if (dtype != KvDType::f32) ref_orig = reference(q, n_new, s, kv_heads, q_heads, dim, scale, window, KvDType::f32);
  check_close(out, reference(q, n_new, s, kv_heads, q_heads, dim, scale, window, dtype), ref_orig, dtype);
}

// On every ISA, runs call(out) with allocation n = 0, 1, ... failing, until a
// run allocates nothing that fails: each failed run must give out_of_memory
// and leave out untouched, the last must match ref (float64), and at least one
// allocation must have been made to fail. Kernels on one thread, so that every
// allocation is on this one.
template <class Call>
void check_every_allocation_failure(KernelSettings& settings, std::size_t out_size, const std::vector<double>& ref,
                                    Call call) {
  constexpr float kUntouched = 12345.0f;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    INFO(clm::detail::cpu_isa_name(isa));
    long failures = 0;
    for (long n = 0;; ++n) {
      INFO("allocation " << n << " fails");
      std::vector<float> out(out_size, kUntouched);
      clm::Status status;
      bool fired = false;
      {  // no Catch macro while armed: its own allocations would count
        clm_test::FailAllocation fail(n);
        status = call(out.data());
        fired = fail.fired();
      }
      if (!fired) {
        REQUIRE(status.ok());
        const double e = rel_error(out.data(), ref);
        INFO("relative error " << e);
        CHECK(e <= 1e-5);
        break;
      }
      ++failures;
      CHECK(status.code() == clm::StatusCode::out_of_memory);
      CHECK(std::all_of(out.begin(), out.end(), [&](float x) { return x == kUntouched; }));
    }
    CHECK(failures > 0);
  }
}

}  // namespace

TEST_CASE("half: f16 and bf16 conversions round to nearest even", "[attention][half]") {
  using namespace clm::detail;
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(bits_float(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(f32_to_bf16(bits_float(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(f32_to_bf16(bits_float(0x3f808001u)) == 0x3f81);
  CHECK(f32_to_bf16(bits_float(0x7f7fffffu)) == 0x7f80);  // max float rounds to inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  CHECK(f32_to_f16(1.0f) == 0x3c00);
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);  // halfway to 2^16: rounds (to even) to inf
  CHECK(f32_to_f16(-2.0f) == 0xc000);
  CHECK(f32_to_f16(5.9604644775390625e-8f) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16(2.98023223876953125e-8f) == 0x0000);  // half of it: tie to even (0)
  CHECK(f32_to_f16(8.940696716308594e-8f) == 0x0002);   // 1.5 ulp: tie to even (2)
  CHECK(std::isnan(f16_to_f32(f32_to_f16(kNaN))));
  // Every f16 round-trips through f32.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16(f) == h);
  }
  // Random floats against an independent rounding: the nearer neighbour, ties to even.
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(rng.uniform(1.0f), rng.range(-30, 17));
    const std::uint16_t b = f32_to_bf16(x);
    const double lo = bf16_to_f32(static_cast<std::uint16_t>(float_bits(x) >> 16));
    const double hi = bf16_to_f32(static_cast<std::uint16_t>((float_bits(x) >> 16) + 1));
    const double dl = std::abs(x - lo), dh = std::abs(hi - x);
    const std::uint16_t want =
        static_cast<std::uint16_t>((float_bits(x) >> 16) + ((dh < dl || (dh == dl && ((float_bits(x) >> 16) & 1))) ? 1 : 0));
    REQUIRE(b == want);
#if defined(__FLT16_MAX__)
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t hb;
    std::memcpy(&hb, &h, 2);
    REQUIRE(f32_to_f16(x) == hb);
#endif
  }
}

TEST_CASE("write_kv scatters rows into their slots, converting to the pool's dtype", "[attention][write_kv]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (KvDType dtype : kDtypes) {
    for (std::int32_t page_size : {1, 16, 64}) {
      INFO(clm::kv_dtype_name(dtype) << " page_size " << page_size);
      const int heads = 2, dim = 64, layers = 2;
      TestPool p = make_pool(std::max(4, 256 / page_size), page_size, layers, heads, dim, dtype);
      const std::int64_t slot_count = static_cast<std::int64_t>(p.view.num_pages) * page_size;
      std::vector<std::int64_t> all(static_cast<std::size_t>(slot_count));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng.gen);
      const std::size_t n = all.size() / 2;
      std::vector<std::int64_t> slots(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
      slots.push_back(slot_count - 1);  // the very last slot of the pool
      if (std::count(slots.begin(), slots.end(), slot_count - 1) > 1) slots.pop_back();
      const std::size_t row = static_cast<std::size_t>(heads) * dim;
      const auto k = rng.vec(slots.size() * row, 4.0f);
      const auto v = rng.vec(slots.size() * row, 4.0f);
      REQUIRE(clm::write_kv(p.view, 1, k.data(), v.data(), slots).ok());

      const std::size_t e = clm::kv_dtype_bytes(dtype);
      auto element = [&](const char* at) {
        if (dtype == KvDType::f32) {
          float f;
          std::memcpy(&f, at, 4);
          return f;
        }
        std::uint16_t h;
        std::memcpy(&h, at, 2);
        return dtype == KvDType::f16 ? clm::detail::f16_to_f32(h) : clm::detail::bf16_to_f32(h);
      };
      std::vector<char> written(static_cast<std::size_t>(slot_count), 0);
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const auto page = static_cast<std::int32_t>(slots[i] / page_size);
        const auto r = static_cast<std::size_t>(slots[i] % page_size);
        written[static_cast<std::size_t>(slots[i])] = 1;
        const char* kd = static_cast<const char*>(p.pool->k_data(page, 1)) + r * row * e;
        const char* vd = static_cast<const char*>(p.pool->v_data(page, 1)) + r * row * e;
        for (std::size_t j = 0; j < row; ++j) {
          REQUIRE(element(kd + j * e) == round_to(dtype, k[i * row + j]));
          REQUIRE(element(vd + j * e) == round_to(dtype, v[i * row + j]));
        }
      }
      // Layer 0 and the unwritten slots of layer 1 are untouched.
      for (std::int32_t page = 0; page < p.view.num_pages; ++page) {
        const auto* l0 = static_cast<const unsigned char*>(p.pool->k_data(page, 0));
        REQUIRE(std::all_of(l0, l0 + p.view.layer_bytes, [](unsigned char b) { return b == 0xff; }));
        for (std::int32_t r = 0; r < page_size; ++r) {
          if (written[static_cast<std::size_t>(page) * page_size + r]) continue;
          const auto* kd = static_cast<const unsigned char*>(p.pool->k_data(page, 1)) + static_cast<std::size_t>(r) * row * e;
          const auto* vd = static_cast<const unsigned char*>(p.pool->v_data(page, 1)) + static_cast<std::size_t>(r) * row * e;
          REQUIRE(std::all_of(kd, kd + row * e, [](unsigned char b) { return b == 0xff; }));
          REQUIRE(std::all_of(vd, vd + row * e, [](unsigned char b) { return b == 0xff; }));
        }
      }
    }
  }
}

TEST_CASE("decode: a ragged batch matches dense float64 attention", "[attention][decode]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : kDtypes) {
      for (std::int32_t page_size : {1, 16, 64}) {
        for (int ratio_case : {1, 4, 8, 0}) {  // 0: one of the other ratios
          const int ratio = ratio_case != 0 ? ratio_case : std::array<int, 4>{2, 3, 6, 16}[static_cast<std::size_t>(rng.range(0, 3))];
          for (int dim : {64, 128}) {
            for (bool windowed : {false, true}) {
              const int kv_heads = rng.range(1, 2);
              const int q_heads = kv_heads * ratio;
              const int batch = rng.range(1, 5);
              const int window = windowed ? rng.range(1, 64) : 0;
              const int threads = rng.range(0, 2);
              const float scale = rng.range(0, 1) ? 0.0f : 0.05f + std::abs(rng.uniform(0.2f));
              INFO(clm::detail::cpu_isa_name(isa) << " " << clm::kv_dtype_name(dtype) << " page_size " << page_size
                   << " kv_heads " << kv_heads << " q_heads " << q_heads << " dim " << dim << " batch " << batch
                   << " window " << window << " threads " << threads << " scale " << scale);
              std::vector<Seq> seqs;
              std::int32_t total_pages = 0;
              for (int b = 0; b < batch; ++b) {
                seqs.push_back(random_seq(rng, rng.range(1, 240 / kShrink), kv_heads, dim));
                total_pages += (seqs.back().len + page_size - 1) / page_size;
              }
              TestPool p = make_pool(total_pages + rng.range(0, 3), page_size, 2, kv_heads, dim, dtype);
              PageDealer dealer(p.view.num_pages, rng);
              const clm::PagedBatch pb = place_seqs(p, 1, seqs, dealer, page_size);
              const std::size_t row = static_cast<std::size_t>(q_heads) * dim;
              const auto q = rng.vec(static_cast<std::size_t>(batch) * row, 3.0f);
              std::vector<float> out(q.size(), kNaN);
              clm::AttentionParams params;
              params.layer = 1;
              params.num_q_heads = q_heads;
              params.softmax_scale = scale;
              params.sliding_window = window;
              params.num_threads = threads;
              const clm::Status st =
                  clm::paged_decode_attention(p.view, params, q.data(), pb.indptr, pb.indices, pb.last_page_len, out.data());
              INFO(st.message());
              REQUIRE(st.ok());
              const float s = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(dim));
              std::vector<double> ref, ref_orig;
              for (int b = 0; b < batch; ++b) {
                const std::vector<float> qb(q.begin() + static_cast<std::ptrdiff_t>(b * row),
                                            q.begin() + static_cast<std::ptrdiff_t>((b + 1) * row));
                const auto r = reference(qb, 1, seqs[static_cast<std::size_t>(b)], kv_heads, q_heads, dim, s, window, dtype);
                ref.insert(ref.end(), r.begin(), r.end());
                if (dtype != KvDType::f32) {
                  const auto r2 =
                      reference(qb, 1, seqs[static_cast<std::size_t>(b)], kv_heads, q_heads, dim, s, window, KvDType::f32);
                  ref_orig.insert(ref_orig.end(), r2.begin(), r2.end());
                }
              }
              check_close(out, ref, ref_orig, dtype);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("decode: long sequences split into chunks and merged by log-sum-exp", "[attention][decode]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : {KvDType::f32, KvDType::bf16}) {
      // 0: automatic (splits only with > 1 thread); odd sizes cross block and page edges.
      for (std::int32_t chunk : {0, 37, 256, 1000}) {
        clm::detail::set_decode_chunk_tokens(chunk);
        const int kv_heads = 2, q_heads = 8, dim = 128, page_size = 16;
        const int window = rng.range(0, 1) ? rng.range(300, 900) : 0;
        INFO(clm::detail::cpu_isa_name(isa) << " " << clm::kv_dtype_name(dtype) << " chunk " << chunk << " window "
                                            << window);
        std::vector<Seq> seqs;
        seqs.push_back(random_seq(rng, rng.range(1500, 3000) / kShrink, kv_heads, dim));
        seqs.push_back(random_seq(rng, rng.range(1, 40), kv_heads, dim));
        std::int32_t pages = 0;
        for (const Seq& s : seqs) pages += (s.len + page_size - 1) / page_size;
        TestPool p = make_pool(pages, page_size, 1, kv_heads, dim, dtype);
        PageDealer dealer(pages, rng);
        const clm::PagedBatch pb = place_seqs(p, 0, seqs, dealer, page_size);
        const std::size_t row = static_cast<std::size_t>(q_heads) * dim;
        const auto q = rng.vec(2 * row, 3.0f);
        std::vector<float> out(q.size(), kNaN);
        clm::AttentionParams params;
        params.num_q_heads = q_heads;
        params.sliding_window = window;
        REQUIRE(clm::paged_decode_attention(p.view, params, q.data(), pb.indptr, pb.indices, pb.last_page_len, out.data())
                    .ok());
        const float s = 1.0f / std::sqrt(static_cast<float>(dim));
        std::vector<double> ref, ref_orig;
        for (std::size_t b = 0; b < 2; ++b) {
          const std::vector<float> qb(q.begin() + static_cast<std::ptrdiff_t>(b * row),
                                      q.begin() + static_cast<std::ptrdiff_t>((b + 1) * row));
          const auto r = reference(qb, 1, seqs[b], kv_heads, q_heads, dim, s, window, dtype);
          ref.insert(ref.end(), r.begin(), r.end());
          const auto r2 = reference(qb, 1, seqs[b], kv_heads, q_heads, dim, s, window, KvDType::f32);
          ref_orig.insert(ref_orig.end(), r2.begin(), r2.end());
        }
        check_close(out, ref, ref_orig, dtype);
      }
    }
  }
}

#if defined(CLM_TEST_PREFETCH_STREAM)
TEST_CASE("decode prefetch stream: every row the walk reads, in its order, a fixed lead ahead", "[attention][decode]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (int round = 0; round < 200; ++round) {
    // A made-up pool layout over a plain buffer: two layers a page, the stream on layer 1.
    const std::int32_t page_size = std::array<int, 4>{1, 3, 16, 64}[static_cast<std::size_t>(rng.range(0, 3))];
    const int kv_heads = rng.range(1, 3);
    const int dim = rng.range(0, 1) != 0 ? 64 : 8;
    const std::size_t elem = rng.range(0, 1) != 0 ? 2 : 4;
    clm::detail::KvLayer kv;
    kv.page_size = page_size;
    kv.kv_heads = kv_heads;
    kv.head_dim = dim;
    kv.head_bytes = static_cast<std::size_t>(dim) * elem;
    kv.row_bytes = static_cast<std::size_t>(kv_heads) * kv.head_bytes;
    kv.v_offset = static_cast<std::size_t>(page_size) * kv.row_bytes;
    const std::size_t layer_bytes = 2 * kv.v_offset;
    kv.page_stride = 2 * layer_bytes;
    const int num_pages = rng.range(1, 12);
    std::vector<char> memory(static_cast<std::size_t>(num_pages) * kv.page_stride);
    kv.base = memory.data() + layer_bytes;
    std::vector<std::int32_t> pages(static_cast<std::size_t>(num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng.gen);
    const std::int64_t tokens = static_cast<std::int64_t>(num_pages) * page_size;
    const std::int64_t begin = rng.range(0, static_cast<int>(tokens) - 1);
    const std::int64_t end = rng.range(static_cast<int>(begin) + 1, static_cast<int>(tokens));
    const int block = rng.range(0, 1) != 0 ? 64 : rng.range(1, 9);
    INFO("page_size " << page_size << " kv_heads " << kv_heads << " dim " << dim << " elem " << elem << " pages "
                      << num_pages << " tokens [" << begin << ", " << end << ") block " << block);

    // What the walk reads, in its order: per block, each token's K row, then each token's V row;
    // rows of one page that follow each other make one run, cut into 64-byte lines.
    std::vector<std::pair<const char*, std::int64_t>> expected;
    auto add_run = [&](const char* at, std::int64_t bytes) {
      for (std::int64_t off = 0; off < bytes; off += 64)
        expected.emplace_back(at + off, std::min<std::int64_t>(64, bytes - off));
    };
    std::int64_t total = 0;
    for (std::int64_t b = begin; b < end; b += block) {
      const std::int64_t block_end = std::min<std::int64_t>(end, b + block);
      for (std::size_t half : {std::size_t{0}, kv.v_offset}) {
        const char* run = nullptr;
        std::int64_t run_bytes = 0;
        for (std::int64_t t = b; t < block_end; ++t) {
          const char* row = kv.token_row(pages.data(), t) + half;
          if (run != nullptr && row == run + run_bytes) {
            run_bytes += static_cast<std::int64_t>(kv.row_bytes);
            continue;
          }
          if (run != nullptr) add_run(run, run_bytes);
          run = row;
          run_bytes = static_cast<std::int64_t>(kv.row_bytes);
        }
        add_run(run, run_bytes);
        total += (block_end - b) * static_cast<std::int64_t>(kv.row_bytes);
      }
    }

    // Pacing, with every line the stream sends recorded: the first catch_up sends kLeadBytes; then
    // never more than one line past what the walk allowed, all of it once allowed, and the lines
    // sent are the expected ones, in order, as many as the bytes it counts, each inside the pool.
    constexpr std::int64_t lead = clm::detail::PrefetchStream::kLeadBytes;
    std::vector<const char*> sent;
    struct Record {
      std::vector<const char*>* lines;
      void operator()(const char* at) const { lines->push_back(at); }
    };
    clm::detail::BasicPrefetchStream<Record> pf(kv, pages.data(), begin, end, block, Record{&sent});
    REQUIRE(pf.issued() == 0);
    REQUIRE(sent.empty());
    pf.catch_up();
    std::int64_t allowed = lead;
    std::size_t checked = 0;  // lines of `sent` compared with `expected` so far
    std::int64_t sent_bytes = 0;
    auto check = [&](bool caught_up) {
      INFO("allowed " << allowed << " issued " << pf.issued() << " total " << total);
      REQUIRE(pf.issued() <= std::min(total, allowed + 63));
      if (caught_up) REQUIRE(pf.issued() >= std::min(total, allowed));
      REQUIRE(sent.size() <= expected.size());
      for (; checked < sent.size(); ++checked) {
        REQUIRE(sent[checked] == expected[checked].first);
        REQUIRE(sent[checked] >= kv.base);
        REQUIRE(sent[checked] + expected[checked].second <= memory.data() + memory.size());
        sent_bytes += expected[checked].second;
      }
      REQUIRE(sent_bytes == pf.issued());
    };
    check(true);
    while (allowed < total + lead) {
      const std::int64_t step = rng.range(1, 3000);
      allowed += step;
      pf.consume(step);
      check(false);
      pf.pace(rng.range(0, 2 * static_cast<int>(step)));  // P V may read more than was consumed
      check(false);
      if (rng.range(0, 3) == 0) {
        pf.catch_up();
        check(true);
      }
    }
    pf.catch_up();
    check(true);
    REQUIRE(pf.issued() == total);
    REQUIRE(sent.size() == expected.size());
  }
}
#endif

TEST_CASE("decode: out of host memory at any allocation, nothing is written to out", "[attention][decode][errors]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  clm::detail::set_decode_chunk_tokens(64);  // the long sequences split into chunks, the short one does not
  const int kv_heads = 2, q_heads = 4, dim = 64, page_size = 16;
  std::vector<Seq> seqs;
  for (int len : {300, 10, 200}) seqs.push_back(random_seq(rng, len + rng.range(0, 20), kv_heads, dim));
  std::int32_t pages = 0;
  for (const Seq& s : seqs) pages += (s.len + page_size - 1) / page_size;
  TestPool p = make_pool(pages, page_size, 1, kv_heads, dim, KvDType::f32);
  PageDealer dealer(pages, rng);
  const clm::PagedBatch pb = place_seqs(p, 0, seqs, dealer, page_size);
  const std::size_t row = static_cast<std::size_t>(q_heads) * dim;
  const auto q = rng.vec(seqs.size() * row, 3.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<double> ref;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const std::vector<float> qb(q.begin() + static_cast<std::ptrdiff_t>(b * row),
                                q.begin() + static_cast<std::ptrdiff_t>((b + 1) * row));
    const auto r = reference(qb, 1, seqs[b], kv_heads, q_heads, dim, scale, 0, KvDType::f32);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  clm::AttentionParams params;
  params.num_q_heads = q_heads;
  params.num_threads = 1;  // every allocation on this thread, so each can be made to fail
  check_every_allocation_failure(settings, q.size(), ref, [&](float* out) {
    return clm::paged_decode_attention(p.view, params, q.data(), pb.indptr, pb.indices, pb.last_page_len, out);
  });
}

TEST_CASE("prefill: new tokens over a cached prefix match dense float64 attention", "[attention][prefill]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : kDtypes) {
      for (std::int32_t page_size : {1, 16, 64}) {
        for (int ratio_case : {1, 4, 8, 0}) {  // 0: one of the other ratios
          const int ratio = ratio_case != 0 ? ratio_case : std::array<int, 4>{2, 3, 6, 16}[static_cast<std::size_t>(rng.range(0, 3))];
          for (int dim : {64, 128}) {
            for (bool windowed : {false, true}) {
              const int kv_heads = rng.range(1, 2);
              const int q_heads = kv_heads * ratio;
              const int n_new = rng.range(0, 3) == 0 ? rng.range(1, 3) : rng.range(1, 100 / kShrink);
              const int prefix = rng.range(0, 2) == 0 ? 0 : rng.range(1, 160 / kShrink);
              const int window = windowed ? rng.range(1, 80) : 0;
              const int threads = rng.range(0, 2);
              INFO(clm::detail::cpu_isa_name(isa) << " " << clm::kv_dtype_name(dtype) << " page_size " << page_size
                   << " kv_heads " << kv_heads << " q_heads " << q_heads << " dim " << dim << " prefix " << prefix
                   << " n_new " << n_new << " window " << window << " threads " << threads);
              check_prefill(rng, dtype, page_size, kv_heads, q_heads, dim, prefix, n_new, window, threads);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("prefill: a few new tokens, in tiles or as one decode over the shared prefix, match dense float64 attention",
          "[attention][prefill]") {
  // The decode route runs the keys every new token sees once, for all of
  // them, then each token's own tail (and, with a window, the keys only the
  // earlier tokens still see): every edge of those ranges is drawn here, with
  // the shared part split into chunks or not.
  using clm::detail::PrefillRoute;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : kDtypes) {
      for (PrefillRoute route : {PrefillRoute::automatic, PrefillRoute::tiles, PrefillRoute::decode}) {
        for (int trial = 0; trial < 12; ++trial) {
          clm::detail::set_prefill_route(route);
          const int page_size = std::array<int, 3>{1, 16, 64}[static_cast<std::size_t>(rng.range(0, 2))];
          const int kv_heads = rng.range(1, 3);
          const int group = std::array<int, 5>{1, 2, 4, 6, 8}[static_cast<std::size_t>(rng.range(0, 4))];
          const int q_heads = kv_heads * group;
          const int dim = rng.range(0, 1) == 0 ? 64 : 128;
          const int n_new = rng.range(2, 20);
          const int prefix = rng.range(0, 3) == 0 ? rng.range(0, 2) : rng.range(3, 400 / kShrink);
          const int len = prefix + n_new;
          // No window, one shorter than n_new (the tiles then), exactly n_new, or any.
          const int window = std::array<int, 4>{0, rng.range(1, n_new - 1), n_new,
                                                rng.range(1, len + 8)}[static_cast<std::size_t>(rng.range(0, 3))];
          const int chunk = rng.range(0, 1) == 0 ? 0 : rng.range(1, 96);
          clm::detail::set_decode_chunk_tokens(chunk);
          const int threads = rng.range(0, 2);
          INFO(clm::detail::cpu_isa_name(isa)
               << " " << clm::kv_dtype_name(dtype) << " route " << static_cast<int>(route) << " page_size " << page_size
               << " kv_heads " << kv_heads << " q_heads " << q_heads << " dim " << dim << " prefix " << prefix
               << " n_new " << n_new << " window " << window << " chunk " << chunk << " threads " << threads);
          check_prefill(rng, dtype, page_size, kv_heads, q_heads, dim, prefix, n_new, window, threads);
        }
      }
    }
  }
}

TEST_CASE("prefill as one decode: out of host memory at any allocation, nothing is written to out",
          "[attention][prefill][errors]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  clm::detail::set_prefill_route(clm::detail::PrefillRoute::decode);
  clm::detail::set_decode_chunk_tokens(64);  // the shared prefix in chunks: a state each
  const int kv_heads = 2, q_heads = 8, dim = 64, page_size = 16, n_new = 5, window = 200;
  const int len = 300 + rng.range(0, 40);
  Seq s = random_seq(rng, len, kv_heads, dim);
  const auto npages = static_cast<std::size_t>((len + page_size - 1) / page_size);
  TestPool p = make_pool(static_cast<std::int32_t>(npages), page_size, 1, kv_heads, dim, KvDType::f32);
  PageDealer dealer(p.view.num_pages, rng);
  s.pages = dealer.take(npages);
  write_seq(p.view, 0, s, 0, len);
  const auto q = rng.vec(static_cast<std::size_t>(n_new) * q_heads * dim, 3.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const auto ref = reference(q, n_new, s, kv_heads, q_heads, dim, scale, window, KvDType::f32);
  clm::AttentionParams params;
  params.num_q_heads = q_heads;
  params.sliding_window = window;
  params.num_threads = 1;  // every allocation on this thread, so each can be made to fail
  check_every_allocation_failure(settings, q.size(), ref, [&](float* out) {
    return clm::paged_prefill_attention(p.view, params, q.data(), n_new, s.pages, len, out);
  });
}

TEST_CASE("prefill and decode: head_dim outside the AVX2 shapes uses the scalar kernels", "[attention]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (int dim : {8, 80, 96}) {
    INFO("dim " << dim);
    const int kv_heads = 2, q_heads = 6, page_size = 16, len = 70, n_new = 20;
    Seq s = random_seq(rng, len, kv_heads, dim);
    TestPool p = make_pool(5, page_size, 1, kv_heads, dim, KvDType::f16);
    PageDealer dealer(5, rng);
    s.pages = dealer.take(5);
    write_seq(p.view, 0, s, 0, len);
    const auto q = rng.vec(static_cast<std::size_t>(n_new) * q_heads * dim, 3.0f);
    std::vector<float> out(q.size(), kNaN);
    clm::AttentionParams params;
    params.num_q_heads = q_heads;
    REQUIRE(clm::paged_prefill_attention(p.view, params, q.data(), n_new, s.pages, len, out.data()).ok());
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    check_close(out, reference(q, n_new, s, kv_heads, q_heads, dim, scale, 0, KvDType::f16),
                reference(q, n_new, s, kv_heads, q_heads, dim, scale, 0, KvDType::f32), KvDType::f16);
  }
}

TEST_CASE("prefix reuse: attention over pages another sequence wrote equals dense attention over the whole sequence",
          "[attention][engine]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : kDtypes) {
      for (std::int32_t page_size : {1, 16, 64}) {
        const int ratio = std::array<int, 3>{1, 4, 8}[static_cast<std::size_t>(rng.range(0, 2))];
        const int dim = rng.range(0, 1) ? 64 : 128;
        const int kv_heads = rng.range(1, 2);
        const int q_heads = kv_heads * ratio;
        const int window = rng.range(0, 1) ? rng.range(8, 100) : 0;
        INFO(clm::detail::cpu_isa_name(isa) << " " << clm::kv_dtype_name(dtype) << " page_size " << page_size
             << " q_heads " << q_heads << " kv_heads " << kv_heads << " dim " << dim << " window " << window);
        clm::EngineConfig config;
        config.pool.num_pages = 2048 / page_size + 64;
        config.pool.page_size = page_size;
        config.pool.num_layers = 2;
        config.pool.kv_heads = kv_heads;
        config.pool.head_dim = dim;
        config.pool.dtype = dtype;
        config.pool.memory = clm::MemoryKind::host;
        std::unique_ptr<clm::Engine> engine;
        REQUIRE(clm::Engine::create(config, engine).ok());
        const PagedKvView kv = PagedKvView::of(engine->pool());
        const int layer = 1;

        // The K/V of a token depend on its position and what precedes it, so a
        // shared prompt prefix has the same K/V in every sequence. Sequence A:
        // prefix + its own tail; B: prefix + another tail, then decode steps.
        const int prefix = rng.range(page_size + 1, std::max(page_size + 2, 300 / kShrink));
        const int tail_a = rng.range(1, 50), tail_b = rng.range(1, 60), steps = 3;
        std::vector<std::int32_t> prompt_a, prompt_b;
        for (int i = 0; i < prefix; ++i) prompt_a.push_back(rng.range(0, 30000));
        prompt_b = prompt_a;
        for (int i = 0; i < tail_a; ++i) prompt_a.push_back(rng.range(0, 30000));
        for (int i = 0; i < tail_b; ++i) prompt_b.push_back(30001 + rng.range(0, 1000));  // differs from A's tail
        Seq a = random_seq(rng, prefix + tail_a, kv_heads, dim);
        Seq b = random_seq(rng, prefix + tail_b + steps, kv_heads, dim);
        const std::size_t row = static_cast<std::size_t>(kv_heads) * dim;
        std::copy(a.k.begin(), a.k.begin() + static_cast<std::ptrdiff_t>(prefix * row), b.k.begin());
        std::copy(a.v.begin(), a.v.begin() + static_cast<std::ptrdiff_t>(prefix * row), b.v.begin());

        clm::AttentionParams params;
        params.layer = layer;
        params.num_q_heads = q_heads;
        params.sliding_window = window;
        const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
        const std::size_t qrow = static_cast<std::size_t>(q_heads) * dim;

        clm::Admission adm_a;
        REQUIRE(engine->admit(prompt_a, {}, adm_a).ok());
        REQUIRE(adm_a.cached_tokens == 0);
        REQUIRE(clm::write_kv(kv, layer, a.k.data(), a.v.data(), adm_a.slots).ok());
        {  // A's own prefill, as a host would run it
          const auto q = rng.vec(static_cast<std::size_t>(a.len) * qrow, 3.0f);
          std::vector<float> out(q.size(), kNaN);
          REQUIRE(clm::paged_prefill_attention(kv, params, q.data(), a.len, adm_a.page_table, a.len, out.data()).ok());
          std::vector<double> orig;
          if (dtype != KvDType::f32) orig = reference(q, a.len, a, kv_heads, q_heads, dim, scale, window, KvDType::f32);
          check_close(out, reference(q, a.len, a, kv_heads, q_heads, dim, scale, window, dtype), orig, dtype);
        }
        const std::vector<std::int32_t> pages_a = adm_a.page_table;
        REQUIRE(engine->finish(adm_a.seq).ok());

        clm::Admission adm_b;
        REQUIRE(engine->admit(prompt_b, {}, adm_b).ok());
        REQUIRE(adm_b.cached_tokens == prefix / page_size * page_size);
        REQUIRE(adm_b.cached_tokens > 0);
        const std::size_t shared = static_cast<std::size_t>(adm_b.cached_tokens / page_size);
        REQUIRE(std::equal(adm_b.page_table.begin(), adm_b.page_table.begin() + static_cast<std::ptrdiff_t>(shared),
                           pages_a.begin()));
        // B writes only what is not cached, at the slots the engine gave.
        const int len_b = prefix + tail_b;
        REQUIRE(clm::write_kv(kv, layer, b.k.data() + static_cast<std::size_t>(adm_b.cached_tokens) * row,
                              b.v.data() + static_cast<std::size_t>(adm_b.cached_tokens) * row, adm_b.slots)
                    .ok());
        const int n_new = len_b - adm_b.cached_tokens;
        Seq b_now = b;
        b_now.len = len_b;
        b_now.k.resize(static_cast<std::size_t>(len_b) * row);
        b_now.v.resize(static_cast<std::size_t>(len_b) * row);
        {
          const auto q = rng.vec(static_cast<std::size_t>(n_new) * qrow, 3.0f);
          std::vector<float> out(q.size(), kNaN);
          REQUIRE(clm::paged_prefill_attention(kv, params, q.data(), n_new, adm_b.page_table, len_b, out.data()).ok());
          std::vector<double> orig;
          if (dtype != KvDType::f32) orig = reference(q, n_new, b_now, kv_heads, q_heads, dim, scale, window, KvDType::f32);
          check_close(out, reference(q, n_new, b_now, kv_heads, q_heads, dim, scale, window, dtype), orig, dtype);
        }

        // Decode steps of B, batched with a third sequence C that also reuses the prefix.
        std::vector<std::int32_t> prompt_c(prompt_a.begin(), prompt_a.begin() + prefix);
        prompt_c.push_back(40000);
        Seq c = random_seq(rng, prefix + 1, kv_heads, dim);
        std::copy(a.k.begin(), a.k.begin() + static_cast<std::ptrdiff_t>(prefix * row), c.k.begin());
        std::copy(a.v.begin(), a.v.begin() + static_cast<std::ptrdiff_t>(prefix * row), c.v.begin());
        clm::Admission adm_c;
        REQUIRE(engine->admit(prompt_c, {}, adm_c).ok());
        REQUIRE(adm_c.cached_tokens > 0);
        REQUIRE(clm::write_kv(kv, layer, c.k.data() + static_cast<std::size_t>(adm_c.cached_tokens) * row,
                              c.v.data() + static_cast<std::size_t>(adm_c.cached_tokens) * row, adm_c.slots)
                    .ok());
        for (int step = 0; step < steps; ++step) {
          std::vector<std::int64_t> slots;
          const std::int32_t token = 50000 + step;
          REQUIRE(engine->extend(adm_b.seq, {&token, 1}, slots).ok());
          const std::size_t t = static_cast<std::size_t>(len_b + step);
          REQUIRE(clm::write_kv(kv, layer, b.k.data() + t * row, b.v.data() + t * row, slots).ok());
          clm::PagedBatch batch;
          const clm::SequenceId ids[] = {adm_c.seq, adm_b.seq};
          REQUIRE(engine->batch_page_table(ids, batch).ok());
          const auto q = rng.vec(2 * qrow, 3.0f);
          std::vector<float> out(q.size(), kNaN);
          REQUIRE(clm::paged_decode_attention(kv, params, q.data(), batch.indptr, batch.indices, batch.last_page_len,
                                              out.data())
                      .ok());
          b_now = b;
          b_now.len = static_cast<std::int32_t>(t) + 1;
          b_now.k.resize((t + 1) * row);
          b_now.v.resize((t + 1) * row);
          const std::vector<float> qc(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(qrow));
          const std::vector<float> qb(q.begin() + static_cast<std::ptrdiff_t>(qrow), q.end());
          auto ref = reference(qc, 1, c, kv_heads, q_heads, dim, scale, window, dtype);
          const auto ref_b = reference(qb, 1, b_now, kv_heads, q_heads, dim, scale, window, dtype);
          ref.insert(ref.end(), ref_b.begin(), ref_b.end());
          std::vector<double> orig;
          if (dtype != KvDType::f32) {
            orig = reference(qc, 1, c, kv_heads, q_heads, dim, scale, window, KvDType::f32);
            const auto o2 = reference(qb, 1, b_now, kv_heads, q_heads, dim, scale, window, KvDType::f32);
            orig.insert(orig.end(), o2.begin(), o2.end());
          }
          check_close(out, ref, orig, dtype);
        }
        REQUIRE(engine->finish(adm_b.seq).ok());
        REQUIRE(engine->finish(adm_c.seq).ok());
        REQUIRE(engine->check_invariants().ok());
      }
    }
  }
}

TEST_CASE("copy_pages, gather_pages and scatter_pages move whole pages", "[attention][pages]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  for (KvDType dtype : kDtypes) {
    TestPool a = make_pool(12, 16, 3, 2, 64, dtype);
    TestPool b = make_pool(9, 16, 3, 2, 64, dtype);
    auto* bytes = static_cast<unsigned char*>(a.pool->data());
    for (std::size_t i = 0; i < a.pool->storage_bytes(); ++i) bytes[i] = static_cast<unsigned char>(rng.gen());
    const std::size_t pb = a.view.page_bytes;
    auto page = [&](const TestPool& t, std::int32_t p) { return static_cast<const unsigned char*>(t.pool->page_data(p)); };

    const std::vector<std::int32_t> src = {11, 0, 5, 7}, dst = {8, 3, 0, 1};
    REQUIRE(clm::copy_pages(b.view, dst, a.view, src).ok());
    for (std::size_t i = 0; i < src.size(); ++i) REQUIRE(std::memcmp(page(b, dst[i]), page(a, src[i]), pb) == 0);
    const auto* untouched = page(b, 2);
    REQUIRE(std::all_of(untouched, untouched + pb, [](unsigned char x) { return x == 0xff; }));

    std::vector<unsigned char> buffer(3 * pb);
    const std::vector<std::int32_t> some = {7, 11, 2};
    REQUIRE(clm::gather_pages(buffer.data(), a.view, some).ok());
    for (std::size_t i = 0; i < some.size(); ++i) REQUIRE(std::memcmp(buffer.data() + i * pb, page(a, some[i]), pb) == 0);
    const std::vector<std::int32_t> to = {4, 8, 5};
    REQUIRE(clm::scatter_pages(b.view, to, buffer.data()).ok());
    for (std::size_t i = 0; i < to.size(); ++i) REQUIRE(std::memcmp(page(b, to[i]), page(a, some[i]), pb) == 0);

    // Within one pool: page 3 <- 3 is a no-op, 2 <- 6.
    const std::vector<unsigned char> six(page(a, 6), page(a, 6) + pb);
    REQUIRE(clm::copy_pages(a.view, std::vector<std::int32_t>{3, 2}, a.view, std::vector<std::int32_t>{3, 6}).ok());
    REQUIRE(std::memcmp(page(a, 2), six.data(), pb) == 0);
  }
}

TEST_CASE("bad input gives a clear Status and touches nothing", "[attention][errors]") {
  TestPool p = make_pool(8, 16, 2, 2, 64, KvDType::bf16);
  const PagedKvView kv = p.view;
  const std::size_t row = 2 * 64;
  std::vector<float> k(4 * row, 0.5f), v(4 * row, 0.25f);
  const std::vector<unsigned char> before(static_cast<unsigned char*>(p.pool->data()),
                                          static_cast<unsigned char*>(p.pool->data()) + p.pool->storage_bytes());
  auto pool_untouched = [&] {
    return std::memcmp(before.data(), p.pool->data(), before.size()) == 0;
  };
  auto expect = [](const clm::Status& s, StatusCode code, const char* fragment) {
    INFO(s.code_name() << ": " << s.message());
    CHECK(s.code() == code);
    CHECK(s.message().find(fragment) != std::string::npos);
  };

  // write_kv
  const std::vector<std::int64_t> slots_bad_hi = {0, 1, 8 * 16};
  const std::vector<std::int64_t> slots_neg = {3, -1};
  const std::vector<std::int64_t> slots_ok = {0, 17, 127};
  expect(clm::write_kv(kv, 0, k.data(), v.data(), slots_bad_hi), StatusCode::invalid_argument, "slot 128");
  expect(clm::write_kv(kv, 0, k.data(), v.data(), slots_neg), StatusCode::invalid_argument, "slot -1");
  expect(clm::write_kv(kv, 2, k.data(), v.data(), slots_ok), StatusCode::invalid_argument, "layer 2");
  expect(clm::write_kv(kv, -1, k.data(), v.data(), slots_ok), StatusCode::invalid_argument, "layer -1");
  expect(clm::write_kv(kv, 0, nullptr, v.data(), slots_ok), StatusCode::invalid_argument, "null");
  CHECK(pool_untouched());
  REQUIRE(clm::write_kv(kv, 0, k.data(), v.data(), slots_ok).ok());

  // decode
  const std::int32_t q_heads = 4;
  std::vector<float> q(2 * q_heads * 64, 0.5f);
  std::vector<float> out(q.size(), 12345.0f);
  auto out_untouched = [&] { return std::all_of(out.begin(), out.end(), [](float x) { return x == 12345.0f; }); };
  clm::AttentionParams params;
  params.num_q_heads = q_heads;
  const std::vector<std::int32_t> indptr = {0, 2, 3}, indices = {0, 5, 7}, last = {16, 1};
  auto decode = [&](const PagedKvView& view, const clm::AttentionParams& pr, std::vector<std::int32_t> ip,
                    std::vector<std::int32_t> ix, std::vector<std::int32_t> lp, const float* qq = nullptr) {
    return clm::paged_decode_attention(view, pr, qq ? qq : q.data(), ip, ix, lp, out.data());
  };
  REQUIRE(decode(kv, params, indptr, indices, last).ok());
  std::fill(out.begin(), out.end(), 12345.0f);
  expect(decode(kv, params, {0, 2}, indices, last), StatusCode::invalid_argument, "indptr has 2 entries");
  expect(decode(kv, params, {0, 2, 5}, indices, last), StatusCode::invalid_argument, "past the 3 indices");
  expect(decode(kv, params, {0, 3, 2}, indices, last), StatusCode::invalid_argument, "indptr");
  expect(decode(kv, params, {0, 0, 3}, indices, last), StatusCode::invalid_argument, ">= 1 page");
  expect(decode(kv, params, {-1, 2, 3}, indices, last), StatusCode::invalid_argument, "indptr");
  expect(decode(kv, params, {0, 100, 3}, indices, last), StatusCode::invalid_argument, "indptr");  // no read past indices
  expect(decode(kv, params, indptr, {0, 8, 7}, last), StatusCode::invalid_argument, "page id 8");
  expect(decode(kv, params, indptr, {0, -3, 7}, last), StatusCode::invalid_argument, "page id -3");
  expect(decode(kv, params, indptr, indices, {17, 1}), StatusCode::invalid_argument, "last_page_len[0] = 17");
  expect(decode(kv, params, indptr, indices, {16, 0}), StatusCode::invalid_argument, "last_page_len[1] = 0");
  clm::AttentionParams bad = params;
  bad.num_q_heads = 3;  // not a multiple of 2 kv heads
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "num_q_heads 3");
  bad.num_q_heads = 0;
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "num_q_heads 0");
  bad = params;
  bad.layer = 2;
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "layer 2");
  bad = params;
  bad.sliding_window = -1;
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "sliding_window");
  bad = params;
  bad.softmax_scale = std::numeric_limits<float>::infinity();
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "softmax_scale");
  bad = params;
  bad.num_threads = -2;
  expect(decode(kv, bad, indptr, indices, last), StatusCode::invalid_argument, "num_threads");
  std::vector<float> q_nan = q;
  q_nan[77] = kNaN;
  expect(decode(kv, params, indptr, indices, last, q_nan.data()), StatusCode::invalid_argument, "q[77]");
  q_nan[77] = std::numeric_limits<float>::infinity();
  expect(decode(kv, params, indptr, indices, last, q_nan.data()), StatusCode::invalid_argument, "q[77]");
  expect(clm::paged_decode_attention(kv, params, q.data(), indptr, indices, last, q.data() + 1),
         StatusCode::invalid_argument, "overlaps");
  expect(clm::paged_decode_attention(kv, params, nullptr, indptr, indices, last, out.data()),
         StatusCode::invalid_argument, "null");
  PagedKvView v2 = kv;
  v2.memory = clm::MemoryKind::device;
  expect(decode(v2, params, indptr, indices, last), StatusCode::unsupported, "device");
  v2 = kv;
  v2.memory = clm::MemoryKind::none;
  expect(decode(v2, params, indptr, indices, last), StatusCode::failed_precondition, "no KV bytes");
  v2 = kv;
  v2.page_bytes += 2;
  expect(decode(v2, params, indptr, indices, last), StatusCode::invalid_argument, "page_bytes");
  v2 = kv;
  v2.base = nullptr;
  expect(decode(v2, params, indptr, indices, last), StatusCode::invalid_argument, "base");
  v2 = kv;
  v2.dtype = static_cast<KvDType>(7);
  expect(decode(v2, params, indptr, indices, last), StatusCode::invalid_argument, "dtype");
  CHECK(out_untouched());
  REQUIRE(decode(kv, params, {0}, {}, {}).ok());  // an empty batch is fine

  // prefill
  const std::vector<std::int32_t> pages = {3, 1};
  auto prefill = [&](std::int32_t n_new, std::vector<std::int32_t> pg, std::int32_t len, const float* qq = nullptr) {
    return clm::paged_prefill_attention(kv, params, qq ? qq : q.data(), n_new, pg, len, out.data());
  };
  REQUIRE(prefill(2, pages, 20).ok());
  std::fill(out.begin(), out.end(), 12345.0f);
  expect(prefill(2, pages, 33), StatusCode::invalid_argument, "need 3 pages, got 2");
  expect(prefill(3, pages, 2), StatusCode::invalid_argument, "n_new 3");
  expect(prefill(-1, pages, 20), StatusCode::invalid_argument, "n_new -1");
  expect(prefill(2, {3, 8}, 20), StatusCode::invalid_argument, "page id 8");
  expect(prefill(2, {-1, 2}, 20), StatusCode::invalid_argument, "page id -1");
  q_nan = q;
  q_nan[3] = kNaN;
  expect(prefill(2, pages, 20, q_nan.data()), StatusCode::invalid_argument, "q[3]");
  bad = params;
  bad.num_q_heads = 5;
  expect(clm::paged_prefill_attention(kv, bad, q.data(), 1, pages, 20, out.data()), StatusCode::invalid_argument,
         "num_q_heads 5");
  CHECK(out_untouched());

  // pages
  TestPool other = make_pool(8, 16, 2, 2, 64, KvDType::f16);
  TestPool small = make_pool(4, 16, 2, 2, 64, KvDType::bf16);
  const std::vector<std::int32_t> two = {1, 2}, one = {1}, out_of_pool = {1, 8}, negative = {-1};
  expect(clm::copy_pages(other.view, two, kv, two), StatusCode::invalid_argument, "layouts");
  expect(clm::copy_pages(small.view, two, kv, one), StatusCode::invalid_argument, "1 source pages");
  expect(clm::copy_pages(small.view, std::vector<std::int32_t>{1, 4}, kv, two), StatusCode::invalid_argument, "page id 4");
  expect(clm::copy_pages(small.view, two, kv, out_of_pool), StatusCode::invalid_argument, "page id 8");
  std::vector<unsigned char> buffer(2 * kv.page_bytes);
  expect(clm::gather_pages(buffer.data(), kv, out_of_pool), StatusCode::invalid_argument, "page id 8");
  expect(clm::gather_pages(nullptr, kv, two), StatusCode::invalid_argument, "null");
  expect(clm::scatter_pages(kv, negative, buffer.data()), StatusCode::invalid_argument, "page id -1");
  expect(clm::scatter_pages(kv, two, nullptr), StatusCode::invalid_argument, "null");
}

TEST_CASE("kernels called from several host threads at once", "[attention][threads]") {
  // The pool serves one call at a time; a call that finds it busy runs on its
  // own thread. Either way every result must be right.
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  constexpr int kThreads = 4;
  std::vector<double> errors(kThreads, -1.0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      Rng rng(seed + static_cast<std::uint64_t>(id));
      const int kv_heads = 2, q_heads = 8, dim = 128, page_size = 16, len = 2000 / kShrink;
      clm::PagedKvPoolConfig c;
      c.num_pages = len / page_size + 1;
      c.page_size = page_size;
      c.kv_heads = kv_heads;
      c.head_dim = dim;
      c.dtype = KvDType::f32;
      std::unique_ptr<clm::PagedKvPool> pool;
      if (!clm::PagedKvPool::create(c, pool).ok()) return;
      const PagedKvView kv = PagedKvView::of(*pool);
      Seq s = random_seq(rng, len, kv_heads, dim);
      s.pages.resize(static_cast<std::size_t>(c.num_pages));
      std::iota(s.pages.begin(), s.pages.end(), 0);
      const auto slots = slots_of(s.pages, page_size, 0, len);
      if (!clm::write_kv(kv, 0, s.k.data(), s.v.data(), slots).ok()) return;
      const auto q = rng.vec(static_cast<std::size_t>(q_heads) * dim, 3.0f);
      std::vector<float> out(q.size(), kNaN);
      clm::AttentionParams params;
      params.num_q_heads = q_heads;
      double worst = 0;
      for (int rep = 0; rep < 5; ++rep) {
        std::fill(out.begin(), out.end(), kNaN);
        if (!clm::paged_prefill_attention(kv, params, q.data(), 1, s.pages, len, out.data()).ok()) return;
        const auto ref = reference(q, 1, s, kv_heads, q_heads, dim, 1.0f / std::sqrt(static_cast<float>(dim)), 0,
                                   KvDType::f32);
        const double e = rel_error(out.data(), ref);
        worst = std::isnan(e) ? e : std::max(worst, e);
      }
      errors[static_cast<std::size_t>(id)] = worst;
    });
  }
  for (auto& t : threads) t.join();
  for (double e : errors) {
    INFO("relative error " << e);
    CHECK(e >= 0.0);
    CHECK(e <= 1e-5);
  }
}

TEST_CASE("the first kernel calls of a process come from several host threads at once", "[attention][threads]") {
  // Every caller asks the pool whether it runs in a forked child while the
  // first one starts the workers: the check must not read the workers' list
  // (a data race; TSan runs this too). Each test case is its own process, so
  // these are the process's first calls.
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  constexpr int kCallers = 6;
  const int kv_heads = 2, q_heads = 4, dim = 128, page_size = 16, len = 1024;  // 1 MiB of K/V: worth threads
  Rng rng(seed);
  TestPool p = make_pool(len / page_size, page_size, 1, kv_heads, dim, KvDType::f32);
  Seq s = random_seq(rng, len, kv_heads, dim);
  s.pages.resize(static_cast<std::size_t>(len / page_size));
  std::iota(s.pages.begin(), s.pages.end(), 0);
  write_seq(p.view, 0, s, 0, len);
  const std::vector<std::int32_t> indptr = {0, len / page_size}, last = {page_size};
  std::vector<std::vector<float>> queries;
  std::vector<std::vector<double>> refs;
  for (int c = 0; c < kCallers; ++c) {
    queries.push_back(rng.vec(static_cast<std::size_t>(q_heads) * dim, 3.0f));
    refs.push_back(reference(queries.back(), 1, s, kv_heads, q_heads, dim, 1.0f / std::sqrt(static_cast<float>(dim)), 0,
                             KvDType::f32));
  }
  std::atomic<int> ready{0};
  std::vector<double> errors(kCallers, -1.0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      ready.fetch_add(1);
      while (ready.load() < kCallers) std::this_thread::yield();
      clm::AttentionParams params;
      params.num_q_heads = q_heads;  // num_threads 0: every hardware thread
      std::vector<float> out(queries[static_cast<std::size_t>(c)].size(), kNaN);
      double worst = 0;
      for (int rep = 0; rep < 3; ++rep) {
        if (!clm::paged_decode_attention(p.view, params, queries[static_cast<std::size_t>(c)].data(), indptr, s.pages,
                                         last, out.data())
                 .ok()) {
          return;
        }
        const double e = rel_error(out.data(), refs[static_cast<std::size_t>(c)]);
        worst = std::isnan(e) ? e : std::max(worst, e);
      }
      errors[static_cast<std::size_t>(c)] = worst;
    });
  }
  for (auto& t : callers) t.join();
  for (double e : errors) {
    INFO("relative error " << e);
    CHECK(e >= 0.0);
    CHECK(e <= 1e-5);
  }
}

#if defined(__unix__)
TEST_CASE("a child forked after the workers started still runs the kernels", "[attention][threads]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  const int kv_heads = 2, q_heads = 8, dim = 128, page_size = 16, len = 4000;
  TestPool p = make_pool(len / page_size, page_size, 1, kv_heads, dim, KvDType::f32);
  Seq s = random_seq(rng, len, kv_heads, dim);
  s.pages.resize(static_cast<std::size_t>(len / page_size));
  std::iota(s.pages.begin(), s.pages.end(), 0);
  write_seq(p.view, 0, s, 0, len);
  const auto q = rng.vec(static_cast<std::size_t>(q_heads) * dim, 3.0f);
  const auto ref = reference(q, 1, s, kv_heads, q_heads, dim, 1.0f / std::sqrt(static_cast<float>(dim)), 0, KvDType::f32);
  clm::AttentionParams params;
  params.num_q_heads = q_heads;
  std::vector<float> out(q.size(), kNaN);
  REQUIRE(clm::paged_prefill_attention(p.view, params, q.data(), 1, s.pages, len, out.data()).ok());  // workers start
  REQUIRE(rel_error(out.data(), ref) <= 1e-5);
  clm_test::ChildProcess child([&](int) {
    std::fill(out.begin(), out.end(), kNaN);
    const bool ok = clm::paged_prefill_attention(p.view, params, q.data(), 1, s.pages, len, out.data()).ok() &&
                    rel_error(out.data(), ref) <= 1e-5;
    return ok ? 0 : 1;
  });
  CHECK(child.exit_code() == 0);
}
#endif

#if defined(__unix__)
namespace {
// Memory whose first or last byte sits against an inaccessible page: a read or
// write past that end faults in any build, whatever instruction does it.
class Guarded {
 public:
  explicit Guarded(std::size_t bytes) : bytes_(bytes) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    span_ = (bytes + page - 1) / page * page + 2 * page;
    void* m = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    map_ = static_cast<char*>(m);
    REQUIRE(mprotect(map_, page, PROT_NONE) == 0);
    REQUIRE(mprotect(map_ + span_ - page, page, PROT_NONE) == 0);
    data_ = map_ + span_ - page - bytes;  // ends at the trailing guard (front(): starts at the leading one)
  }
  ~Guarded() { munmap(map_, span_); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  char* data() const { return data_; }
  // The same bytes moved to start right after the leading guard.
  char* front() {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    std::memmove(map_ + page, data_, bytes_);
    data_ = map_ + page;
    return data_;
  }

 private:
  std::size_t bytes_, span_;
  char* map_ = nullptr;
  char* data_ = nullptr;
};
}  // namespace

TEST_CASE("kernels read and write nothing outside the pool and the caller's buffers (guard pages)",
          "[attention][bounds]") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Rng rng(seed);
  KernelSettings settings;
  for (auto isa : clm_test::cpu_isas()) {
    settings.isa(isa);
    for (KvDType dtype : kDtypes) {
      for (std::int32_t page_size : {1, 16, 64}) {
        for (bool at_front : {false, true}) {
          const int kv_heads = 2, q_heads = 8, dim = 64;
          const int len = rng.range(2 * page_size + 1, 3 * page_size + 40);
          const std::int32_t num_pages = (len + page_size - 1) / page_size;
          INFO(clm::detail::cpu_isa_name(isa) << " " << clm::kv_dtype_name(dtype) << " page_size " << page_size
               << " len " << len << (at_front ? " front" : " back"));
          TestPool shape = make_pool(num_pages, page_size, 2, kv_heads, dim, dtype);  // for the byte sizes
          PagedKvView kv = shape.view;
          Guarded pool(kv.page_bytes * static_cast<std::size_t>(num_pages));
          kv.base = at_front ? pool.front() : pool.data();
          std::memset(kv.base, 0, kv.page_bytes * static_cast<std::size_t>(num_pages));
          // Every page, in reverse: the sequence's last token is in page 0, its first in the last page.
          Seq s = random_seq(rng, len, kv_heads, dim);
          for (std::int32_t i = num_pages - 1; i >= 0; --i) s.pages.push_back(i);
          write_seq(kv, 1, s, 0, len);
          write_seq(kv, 0, s, 0, len);

          const int n_new = rng.range(1, std::min(len, 40));
          const std::size_t qn = static_cast<std::size_t>(n_new) * q_heads * dim;
          Guarded qbuf(qn * sizeof(float)), obuf(qn * sizeof(float));
          float* q = reinterpret_cast<float*>(at_front ? qbuf.front() : qbuf.data());
          float* out = reinterpret_cast<float*>(at_front ? obuf.front() : obuf.data());
          const auto qv = rng.vec(qn, 3.0f);
          std::copy(qv.begin(), qv.end(), q);
          clm::AttentionParams params;
          params.layer = 1;
          params.num_q_heads = q_heads;
          params.sliding_window = rng.range(0, 1) ? 0 : rng.range(1, 50);
          const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
          const auto ref = reference(qv, n_new, s, kv_heads, q_heads, dim, scale, params.sliding_window, dtype);
          using clm::detail::PrefillRoute;
          for (PrefillRoute route : {PrefillRoute::tiles, PrefillRoute::decode}) {  // both, whatever the sizes
            INFO("prefill route " << static_cast<int>(route) << " n_new " << n_new << " window "
                                  << params.sliding_window);
            clm::detail::set_prefill_route(route);
            std::fill(out, out + qn, kNaN);
            REQUIRE(clm::paged_prefill_attention(kv, params, q, n_new, s.pages, len, out).ok());
            CHECK(rel_error(out, ref) <= 1e-5);
          }
          clm::detail::set_prefill_route(PrefillRoute::automatic);

          // Decode: a batch of the same sequence twice; q and out of 2 rows.
          const std::size_t dn = 2 * static_cast<std::size_t>(q_heads) * dim;
          Guarded dq(dn * sizeof(float)), dout(dn * sizeof(float));
          float* q2 = reinterpret_cast<float*>(at_front ? dq.front() : dq.data());
          float* out2 = reinterpret_cast<float*>(at_front ? dout.front() : dout.data());
          const auto q2v = rng.vec(dn, 3.0f);
          std::copy(q2v.begin(), q2v.end(), q2);
          std::fill(out2, out2 + dn, kNaN);
          std::vector<std::int32_t> indptr = {0, num_pages, 2 * num_pages}, indices = s.pages;
          indices.insert(indices.end(), s.pages.begin(), s.pages.end());
          const std::int32_t last = len - (num_pages - 1) * page_size;
          const std::vector<std::int32_t> last_len = {last, last};
          REQUIRE(clm::paged_decode_attention(kv, params, q2, indptr, indices, last_len, out2).ok());
          const std::size_t row = static_cast<std::size_t>(q_heads) * dim;
          for (std::size_t b = 0; b < 2; ++b) {
            const std::vector<float> qb(q2v.begin() + static_cast<std::ptrdiff_t>(b * row),
                                        q2v.begin() + static_cast<std::ptrdiff_t>((b + 1) * row));
            CHECK(rel_error(out2 + b * row, reference(qb, 1, s, kv_heads, q_heads, dim, scale, params.sliding_window, dtype)) <=
                  1e-5);
          }
        }
      }
    }
  }
}
#endif

TEST_CASE("kernel dispatch reports what it runs", "[attention]") {
  const auto best = clm::detail::cpu_isa_best();
  INFO("best ISA: " << clm::detail::cpu_isa_name(best));
  CHECK(clm::detail::cpu_isa() == best);
  // Every ISA up to the best one can be chosen, none above it.
  for (auto isa : {clm::detail::CpuIsa::scalar, clm::detail::CpuIsa::avx2, clm::detail::CpuIsa::avx512}) {
    INFO(clm::detail::cpu_isa_name(isa));
    const bool supported = static_cast<int>(isa) <= static_cast<int>(best);
    CHECK(clm::detail::set_cpu_isa(isa).code() == (supported ? StatusCode::ok : StatusCode::unsupported));
    CHECK(clm::detail::cpu_isa() == (supported ? isa : clm::detail::CpuIsa::scalar));
    REQUIRE(clm::detail::set_cpu_isa(clm::detail::CpuIsa::scalar).ok());
  }
  REQUIRE(clm::detail::set_cpu_isa(best).ok());
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // The dispatch follows the CPU's features (the kernels are built on x86-64).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(best == clm::detail::CpuIsa::avx512);
  } else if (!__builtin_cpu_supports("avx2")) {
    CHECK(best == clm::detail::CpuIsa::scalar);
  }
#endif
  CHECK(clm::detail::cpu_kernel_threads(0) >= 1);
  CHECK(clm::detail::cpu_kernel_threads(1) == 1);
}
