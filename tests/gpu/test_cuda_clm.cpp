// The CLM model side on a GPU (clm/device/cuda_clm.hpp): the device SRC head and the
// snapshot adapter against float64 references on fresh random inputs, f32 /
// f16 / bf16 activations, vector and scalar (unaligned) access paths, ragged
// batches with long sequences split across blocks, special tokens really left
// out of the mean, the device-side data errors (NaN/Inf, all-special
// sequences, overflowing logits) turned into invalid_argument with the output
// left untouched, and the host-side validation. Outputs are poisoned before
// every run. Without a usable CUDA device the GPU tests print
// "SKIPPED (no usable CUDA device: ...)", which ctest reports as skipped.
//
// The same file is built as test_cuda_clm_emulated over a fake CUDA runtime
// (fake_cudart.cpp), a test-only fake cuBLAS (fake_cublas.cpp: a CPU GEMM) and
// the CPU emulator running the real kernel source (emulated_clm_launch.cpp),
// with smaller shapes (CLM_TEST_EMULATED_GPU): the public API end to end
// without a GPU.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "clm/device/cuda_clm.hpp"
#include "clm/device/device_memory.hpp"
#include "gpu_test_support.hpp"
#include "kernel_reference.hpp"

namespace {

using clm_test::kFull;
using clm_test::skip_without_gpu;

using clm::ActDType;
using clm::Gelu;
using clm::StatusCode;

// Device bytes (cudaMalloc), with host copies in and out.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t n) : n_(n) { CLM_CUDA_OK(cudaMalloc(&p_, std::max<std::size_t>(n, 1))); }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& host) : DeviceBytes(host.size() * sizeof(T)) {
    upload(host);
  }
  ~DeviceBytes() { cudaFree(p_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  template <class T>
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() * sizeof(T) <= n_);
    if (!host.empty()) CLM_CUDA_OK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <class T>
  std::vector<T> download(std::size_t count) const {
    std::vector<T> host(count);
    if (count) CLM_CUDA_OK(cudaMemcpy(host.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CLM_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Activations in a dtype on the host: bytes, and their exact values.
struct HostAct {
  ActDType dtype;
  std::int64_t rows;
  std::int32_t cols;
  std::vector<unsigned char> bytes;
  HostAct(ActDType d, std::int64_t r, std::int32_t c)
      : dtype(d), rows(r), cols(c), bytes(static_cast<std::size_t>(r) * c * clm::kv_dtype_bytes(d)) {}
  std::size_t index(std::int64_t r, std::int32_t c) const { return static_cast<std::size_t>(r) * cols + c; }
  void set(std::int64_t r, std::int32_t c, float v) {
    const std::uint32_t bits = clm_test::to_bits(dtype, v);
    if (dtype == ActDType::f32) {
      std::memcpy(bytes.data() + 4 * index(r, c), &bits, 4);
    } else {
      const auto h = static_cast<std::uint16_t>(bits);
      std::memcpy(bytes.data() + 2 * index(r, c), &h, 2);
    }
  }
  double get(std::int64_t r, std::int32_t c) const { return get_from(bytes, r, c); }
  double get_from(const std::vector<unsigned char>& b, std::int64_t r, std::int32_t c) const {
    if (dtype == ActDType::f32) {
      float f;
      std::memcpy(&f, b.data() + 4 * index(r, c), 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, b.data() + 2 * index(r, c), 2);
    return dtype == ActDType::f16 ? clm::cuda::soft::f16_to_float(h) : clm::cuda::soft::bf16_to_float(h);
  }
};

// A device copy of activations, optionally `offset_elems` elements past a
// 256-byte aligned allocation (element aligned, not 16-byte aligned: the
// kernels' scalar path).
struct DeviceAct {
  DeviceBytes mem;
  std::size_t offset;
  DeviceAct(const HostAct& a, std::size_t offset_elems)
      : mem(a.bytes.size() + offset_elems * clm::kv_dtype_bytes(a.dtype)),
        offset(offset_elems * clm::kv_dtype_bytes(a.dtype)) {
    if (!a.bytes.empty()) {
      CLM_CUDA_OK(
          cudaMemcpy(mem.get<unsigned char>() + offset, a.bytes.data(), a.bytes.size(), cudaMemcpyHostToDevice));
    }
  }
  void* data() const { return mem.get<unsigned char>() + offset; }
  std::vector<unsigned char> download(std::size_t n) const {
    std::vector<unsigned char> b(n);
    if (n) CLM_CUDA_OK(cudaMemcpy(b.data(), data(), n, cudaMemcpyDeviceToHost));
    return b;
  }
};

std::vector<float> uniform(std::size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<std::int32_t> indptr_of(const std::vector<std::int32_t>& lens) {
  std::vector<std::int32_t> indptr{0};
  for (std::int32_t l : lens) indptr.push_back(indptr.back() + l);
  return indptr;
}

// ============================================================================
// SRC head
// ============================================================================
clm::SrcHeadWeights random_head(std::int32_t hidden, std::mt19937_64& rng) {
  clm::SrcHeadWeights w;
  w.hidden = hidden;
  const auto inner = static_cast<std::size_t>(hidden / 4);
  const float s1 = 2.0f / std::sqrt(static_cast<float>(hidden));
  w.w1 = uniform(inner * hidden, -s1, s1, rng);
  w.b1 = uniform(inner, -0.2f, 0.2f, rng);
  const float s2 = 3.0f / std::sqrt(static_cast<float>(inner));
  w.w2 = uniform(inner, -s2, s2, rng);
  w.b2 = 0.1f;
  return w;
}

// float64 reference of the head over the activations' exact values.
std::vector<double> reference_scores(const clm::SrcHeadWeights& w, Gelu gelu, const HostAct& x,
                                     const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& indptr,
                                     const std::vector<std::int32_t>& special) {
  const auto h = static_cast<std::size_t>(w.hidden);
  const std::size_t inner = h / 4;
  std::vector<double> scores;
  std::vector<double> mean(h);
  for (std::size_t b = 0; b + 1 < indptr.size(); ++b) {
    std::fill(mean.begin(), mean.end(), 0.0);
    std::size_t n = 0;
    for (std::int32_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      if (std::find(special.begin(), special.end(), ids[static_cast<std::size_t>(t)]) != special.end()) continue;
      for (std::size_t c = 0; c < h; ++c) mean[c] += x.get(t, static_cast<std::int32_t>(c));
      ++n;
    }
    for (double& m : mean) m /= static_cast<double>(n);
    double logit = w.b2;
    for (std::size_t j = 0; j < inner; ++j) {
      double z = w.b1[j];
      for (std::size_t c = 0; c < h; ++c) z += static_cast<double>(w.w1[j * h + c]) * mean[c];
      const double g = gelu == Gelu::tanh
                           ? 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)))
                           : 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
      logit += g * static_cast<double>(w.w2[j]);
    }
    scores.push_back(1.0 / (1.0 + std::exp(-logit)));
  }
  return scores;
}

constexpr float kSpecialValue = 1000.0f;  // special rows: would move any mean they were let into

// A ragged batch: per-sequence offset + noise, token ids in [0, 50) with the
// special ids {3, 7, 42} among them (rows of special tokens hold kSpecialValue),
// at least one non-special token per sequence.
struct SrcBatch {
  HostAct x;
  std::vector<std::int32_t> ids, indptr;
  std::vector<std::int32_t> special = {42, 7, 3, 7};  // any order, a duplicate
  SrcBatch(ActDType dtype, std::int32_t hidden, const std::vector<std::int32_t>& lens, std::mt19937_64& rng)
      : x(dtype, indptr_of(lens).back(), hidden), indptr(indptr_of(lens)) {
    std::uniform_int_distribution<std::int32_t> id(0, 49);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t b = 0; b < lens.size(); ++b) {
      const std::vector<float> offset = uniform(static_cast<std::size_t>(hidden), -1.0f, 1.0f, rng);
      const std::int32_t keep = indptr[b] + static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(lens[b]));
      for (std::int32_t t = indptr[b]; t < indptr[b + 1]; ++t) {
        std::int32_t tok = id(rng);
        if (t % 5 == 0) tok = special[static_cast<std::size_t>(t) % special.size()];  // plenty of special ones
        if (t == keep) tok = 10;
        ids.push_back(tok);
        const bool sp = tok == 3 || tok == 7 || tok == 42;
        for (std::int32_t c = 0; c < hidden; ++c) {
          x.set(t, c, sp ? kSpecialValue : offset[static_cast<std::size_t>(c)] + 0.5f * u(rng));
        }
      }
    }
  }
};

struct HeadCase {
  ActDType dtype;
  std::int32_t hidden;
  Gelu gelu;
  std::vector<std::int32_t> lens;
  std::size_t offset_elems;  // 0: 16-byte aligned base
};

void run_head_case(const HeadCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  INFO(clm::kv_dtype_name(c.dtype) << " hidden=" << c.hidden << " gelu=" << (c.gelu == Gelu::tanh ? "tanh" : "erf")
                                   << " batch=" << c.lens.size() << " offset=" << c.offset_elems);
  const clm::SrcHeadWeights weights = random_head(c.hidden, rng);
  std::unique_ptr<clm::cuda::DeviceSrcHead> head;
  REQUIRE_OK(clm::cuda::DeviceSrcHead::create(0, weights, c.gelu, head));
  CHECK(head->hidden() == c.hidden);
  CHECK(head->inner() == c.hidden / 4);
  Stream stream;
  for (int run = 0; run < 2; ++run) {  // fresh data each run, same head
    const SrcBatch batch(c.dtype, c.hidden, c.lens, rng);
    const std::vector<double> ref = reference_scores(weights, c.gelu, batch.x, batch.ids, batch.indptr, batch.special);
    DeviceAct dx(batch.x, c.offset_elems);
    DeviceBytes dids(batch.ids);
    const clm::ConstActivationView view{dx.data(), c.dtype, batch.x.rows, c.hidden};
    const std::size_t n = c.lens.size();
    const double tol = clm_test::tolerance(c.dtype);

    // asynchronous: scores in device memory, then check()
    DeviceBytes dscores(n * sizeof(float));
    CLM_CUDA_OK(cudaMemset(dscores.get(), 0xff, n * sizeof(float)));  // NaN
    REQUIRE_OK(
        head->score_async(view, dids.get<std::int32_t>(), batch.indptr, batch.special, dscores.get<float>(), stream.s));
    REQUIRE_OK(head->check(stream.s));
    const std::vector<float> async_scores = dscores.download<float>(n);
    const double err_async = clm_test::relative_error(async_scores, ref);
    INFO("run " << run << " async rel err " << err_async);
    CHECK(err_async <= tol);

    // synchronous: scores in host memory
    std::vector<float> host_scores(n, std::numeric_limits<float>::quiet_NaN());
    REQUIRE_OK(head->score(view, dids.get<std::int32_t>(), batch.indptr, batch.special, host_scores, stream.s));
    const double err_sync = clm_test::relative_error(host_scores, ref);
    INFO("run " << run << " sync rel err " << err_sync);
    CHECK(err_sync <= tol);
    CHECK(std::memcmp(host_scores.data(), async_scores.data(), n * sizeof(float)) == 0);

    // the CPU head (f64 means) on the same f32 values agrees too
    if (c.dtype == ActDType::f32) {
      std::unique_ptr<clm::SrcHead> cpu;
      REQUIRE_OK(clm::SrcHead::create(weights, c.gelu, cpu));
      std::vector<float> cpu_scores(n);
      std::vector<float> values(batch.x.bytes.size() / 4);
      std::memcpy(values.data(), batch.x.bytes.data(), batch.x.bytes.size());
      REQUIRE_OK(cpu->score(values, batch.ids, batch.indptr, batch.special, cpu_scores));
      std::vector<double> cpu_ref(cpu_scores.begin(), cpu_scores.end());
      CHECK(clm_test::relative_error(host_scores, cpu_ref) <= tol);
    }
  }
}

std::vector<std::int32_t> lens_of(std::size_t n, std::int32_t len) { return std::vector<std::int32_t>(n, len); }

}  // namespace

TEST_CASE("CUDA SRC head matches the float64 reference", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::uint64_t seed = 1;
  // ragged batch with long sequences (split across blocks), and one without any split
  const std::vector<std::int32_t> ragged =
      kFull ? std::vector<std::int32_t>{1, 7, 300, 33, 2000, 64, 5} : std::vector<std::int32_t>{1, 7, 300, 33, 5};
  const std::vector<std::int32_t> short_ones = {1, 1, 2, 1, 3};
  for (ActDType dtype : {ActDType::f32, ActDType::f16, ActDType::bf16}) {
    const std::int32_t h = kFull ? 256 : 64;
    run_head_case({dtype, h, Gelu::tanh, ragged, 0}, seed++);
    run_head_case({dtype, h, Gelu::erf, short_ones, 0}, seed++);
    // rows not 16-byte multiples for f16/bf16 (68 * 2 bytes), and an unaligned base: the scalar path
    run_head_case({dtype, 68, Gelu::erf, ragged, 0}, seed++);
    run_head_case({dtype, h, Gelu::tanh, short_ones, 1}, seed++);
    // inner = 260 > kHeadThreads: every warp of the finish kernel holds a share of the dot product
    run_head_case({dtype, 1040, Gelu::tanh, short_ones, 0}, seed++);
  }
  if (!kFull) return;
  // the benchmark's shapes: hidden 4096, decode (one token per sequence) and prefill
  run_head_case({ActDType::bf16, 4096, Gelu::tanh, lens_of(64, 1), 0}, seed++);
  run_head_case({ActDType::f32, 4096, Gelu::erf, lens_of(8, 512), 0}, seed++);
  run_head_case({ActDType::bf16, 4096, Gelu::tanh, lens_of(512, 1), 0}, seed++);
}

TEST_CASE("CUDA SRC head reports NaN/Inf, all-special sequences and overflow, and writes no score",
          "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 rng(77);
  const std::int32_t hidden = 64;
  const clm::SrcHeadWeights weights = random_head(hidden, rng);
  std::unique_ptr<clm::cuda::DeviceSrcHead> head;
  REQUIRE_OK(clm::cuda::DeviceSrcHead::create(0, weights, Gelu::tanh, head));
  Stream stream;
  const std::vector<std::int32_t> lens = {4, 40, 3};  // the 40 is split across blocks
  constexpr float kPoison = -7.0f;                    // "untouched": still the poison afterwards

  const auto expect_error = [&](SrcBatch& batch, const char* part) {
    DeviceAct dx(batch.x, 0);
    DeviceBytes dids(batch.ids);
    const clm::ConstActivationView view{dx.data(), batch.x.dtype, batch.x.rows, hidden};
    std::vector<float> host_scores(lens.size(), kPoison);
    REQUIRE_ERROR(head->score(view, dids.get<std::int32_t>(), batch.indptr, batch.special, host_scores, stream.s),
                  StatusCode::invalid_argument, part);
    for (float s : host_scores) CHECK(s == kPoison);
    DeviceBytes dscores(std::vector<float>(lens.size(), kPoison));
    REQUIRE_OK(
        head->score_async(view, dids.get<std::int32_t>(), batch.indptr, batch.special, dscores.get<float>(), stream.s));
    REQUIRE_ERROR(head->check(stream.s), StatusCode::invalid_argument, part);
    for (float s : dscores.download<float>(lens.size())) CHECK(s == kPoison);
    REQUIRE_OK(head->check(stream.s));  // the record was reset
  };
  const auto non_special_row = [](const SrcBatch& b, std::int32_t seq) {
    for (std::int32_t t = b.indptr[static_cast<std::size_t>(seq)]; t < b.indptr[static_cast<std::size_t>(seq) + 1];
         ++t) {
      const std::int32_t id = b.ids[static_cast<std::size_t>(t)];
      if (id != 3 && id != 7 && id != 42) return t;
    }
    return -1;
  };
  for (ActDType dtype : {ActDType::f32, ActDType::bf16}) {
    INFO(clm::kv_dtype_name(dtype));
    {  // NaN in a non-special row of the split sequence
      SrcBatch b(dtype, hidden, lens, rng);
      const std::int32_t t = non_special_row(b, 1);
      b.x.set(t, 5, std::numeric_limits<float>::quiet_NaN());
      expect_error(b, fmt::format("token {}, sequence 1", t).c_str());
    }
    {  // Inf in a special row: still an error (as on the CPU)
      SrcBatch b(dtype, hidden, lens, rng);
      b.ids[5] = 7;
      b.x.set(5, 0, std::numeric_limits<float>::infinity());
      expect_error(b, "NaN or Inf (token 5, sequence 1)");
    }
    {  // a sequence whose tokens are all special
      SrcBatch b(dtype, hidden, lens, rng);
      for (std::int32_t t = b.indptr[2]; t < b.indptr[3]; ++t) b.ids[static_cast<std::size_t>(t)] = 42;
      expect_error(b, "sequence 2 has no non-special position");
    }
    {  // ... also when it is split across blocks
      SrcBatch b(dtype, hidden, lens, rng);
      for (std::int32_t t = b.indptr[1]; t < b.indptr[2]; ++t) b.ids[static_cast<std::size_t>(t)] = 3;
      expect_error(b, "sequence 1 has no non-special position");
    }
  }
  {  // logits that overflow f32: a non-finite logit, no score
    clm::SrcHeadWeights big = weights;
    std::fill(big.w1.begin(), big.w1.end(), 1.0f);
    std::unique_ptr<clm::cuda::DeviceSrcHead> big_head;
    REQUIRE_OK(clm::cuda::DeviceSrcHead::create(0, big, Gelu::tanh, big_head));
    SrcBatch b(ActDType::f32, hidden, {1, 1}, rng);
    b.ids = {10, 10};
    for (std::int32_t c = 0; c < hidden; ++c) {
      b.x.set(0, c, 3e38f);
      b.x.set(1, c, -3e38f);
    }
    DeviceAct dx(b.x, 0);
    DeviceBytes dids(b.ids);
    std::vector<float> out(2, kPoison);
    REQUIRE_ERROR(big_head->score({dx.data(), ActDType::f32, 2, hidden}, dids.get<std::int32_t>(), b.indptr, b.special,
                                  out, stream.s),
                  StatusCode::invalid_argument, "sequence 0 gives a non-finite logit");
    CHECK(out[0] == kPoison);
  }
  {  // two failed asynchronous calls before one check: the first is named, both counted; valid calls still work
    SrcBatch bad(ActDType::f32, hidden, lens, rng);
    bad.x.set(0, 0, std::numeric_limits<float>::quiet_NaN());
    bad.ids[0] = 10;
    DeviceAct dx(bad.x, 0);
    DeviceBytes dids(bad.ids);
    DeviceBytes dscores(lens.size() * sizeof(float));
    const clm::ConstActivationView view{dx.data(), ActDType::f32, bad.x.rows, hidden};
    REQUIRE_OK(
        head->score_async(view, dids.get<std::int32_t>(), bad.indptr, bad.special, dscores.get<float>(), stream.s));
    REQUIRE_OK(
        head->score_async(view, dids.get<std::int32_t>(), bad.indptr, bad.special, dscores.get<float>(), stream.s));
    REQUIRE_ERROR(head->check(stream.s), StatusCode::invalid_argument, "(and 1 more failed calls)");
    SrcBatch good(ActDType::f32, hidden, lens, rng);
    DeviceAct gx(good.x, 0);
    DeviceBytes gids(good.ids);
    std::vector<float> out(lens.size());
    REQUIRE_OK(head->score({gx.data(), ActDType::f32, good.x.rows, hidden}, gids.get<std::int32_t>(), good.indptr,
                           good.special, out, stream.s));
    CHECK(clm_test::relative_error(
              out, reference_scores(weights, Gelu::tanh, good.x, good.ids, good.indptr, good.special)) <= 1e-5);
  }
}

TEST_CASE("CUDA SRC head validates its calls on the host", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 rng(88);
  const std::int32_t hidden = 64;
  std::unique_ptr<clm::cuda::DeviceSrcHead> head;
  REQUIRE_OK(clm::cuda::DeviceSrcHead::create(0, random_head(hidden, rng), Gelu::erf, head));
  Stream stream;
  SrcBatch b(ActDType::bf16, hidden, {3, 2}, rng);
  DeviceAct dx(b.x, 0);
  DeviceBytes dids(b.ids);
  DeviceBytes dscores(2 * sizeof(float));
  const std::int32_t* ids = dids.get<std::int32_t>();
  float* scores = dscores.get<float>();
  const clm::ConstActivationView ok{dx.data(), ActDType::bf16, 5, hidden};
  const auto bad = [&](clm::ConstActivationView v, std::vector<std::int32_t> indptr, const std::int32_t* token_ids,
                       float* out, const char* part) {
    REQUIRE_ERROR(head->score_async(v, token_ids, indptr, b.special, out, stream.s), StatusCode::invalid_argument,
                  part);
  };
  bad({dx.data(), ActDType::bf16, 5, hidden + 4}, b.indptr, ids, scores, "columns");
  bad({dx.data(), static_cast<ActDType>(9), 5, hidden}, b.indptr, ids, scores, "dtype");
  bad(ok, {0, 3, 4}, ids, scores, "ends at 4");
  bad(ok, {0, 3, 2, 5}, ids, scores, "decreases");
  bad(ok, {1, 3, 5}, ids, scores, "indptr[0]");
  bad(ok, {}, ids, scores, "empty");
  bad(ok, {0, 3, 3, 5}, ids, scores, "sequence 1 has no non-special position to average (0 tokens)");
  bad(ok, b.indptr, nullptr, scores, "token_ids: null");
  bad(ok, b.indptr, ids, nullptr, "scores: null");
  std::vector<unsigned char> host_copy = b.x.bytes;
  bad({host_copy.data(), ActDType::bf16, 5, hidden}, b.indptr, ids, scores, "must be device memory");
  // far more rows than the allocation holds (its last byte is not device memory)
  bad({dx.data(), ActDType::bf16, 1 << 22, hidden}, {0, 3, 1 << 22}, ids, scores, "attn_out");
  std::vector<float> wrong(3);
  REQUIRE_ERROR(head->score(ok, ids, b.indptr, b.special, wrong, stream.s), StatusCode::invalid_argument, "scores_out");
  // none of that reached the device: no error recorded, a valid call still works
  REQUIRE_OK(head->check(stream.s));
  REQUIRE_OK(head->score_async(ok, ids, b.indptr, b.special, scores, stream.s));
  REQUIRE_OK(head->check(stream.s));
  // batch 0: nothing to do
  REQUIRE_OK(head->score_async({dx.data(), ActDType::bf16, 0, hidden}, ids, std::vector<std::int32_t>{0}, b.special,
                               scores, stream.s));
}

TEST_CASE("CUDA SRC head and adapter validate their weights before touching a device", "[cuda][clm]") {
  std::mt19937_64 rng(99);
  std::unique_ptr<clm::cuda::DeviceSrcHead> head;
  clm::SrcHeadWeights w = random_head(64, rng);
  clm::SrcHeadWeights odd = w;
  odd.hidden = 66;
  REQUIRE_ERROR(clm::cuda::DeviceSrcHead::create(0, odd, Gelu::tanh, head), StatusCode::invalid_argument, "divisible");
  clm::SrcHeadWeights nan = w;
  nan.w2[3] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_ERROR(clm::cuda::DeviceSrcHead::create(0, nan, Gelu::tanh, head), StatusCode::invalid_argument, "NaN");
  clm::SrcHeadWeights small = w;
  small.w1.pop_back();
  REQUIRE_ERROR(clm::cuda::DeviceSrcHead::create(0, small, Gelu::tanh, head), StatusCode::invalid_argument, "w1");

  std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
  clm::SnapshotAdapterWeights aw;
  aw.snapshot_dim = 4;
  aw.hidden = 8;
  aw.weight = uniform(32, -1, 1, rng);
  aw.bias = uniform(8, -1, 1, rng);
  clm::SnapshotAdapterConfig cfg;
  cfg.num_layers = 4;
  clm::SnapshotAdapterConfig bad_layer = cfg;
  bad_layer.layers = {1, 4};
  REQUIRE_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, aw, bad_layer, adapter), StatusCode::invalid_argument,
                "layer 4");
  clm::SnapshotAdapterConfig no_layers = cfg;
  no_layers.num_layers = 0;
  REQUIRE_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, aw, no_layers, adapter), StatusCode::invalid_argument,
                "num_layers");
  clm::SnapshotAdapterConfig nan_scale = cfg;
  nan_scale.residual_scale = std::numeric_limits<float>::infinity();
  REQUIRE_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, aw, nan_scale, adapter), StatusCode::invalid_argument,
                "residual_scale");
  clm::SnapshotAdapterWeights short_bias = aw;
  short_bias.bias.pop_back();
  REQUIRE_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, short_bias, cfg, adapter), StatusCode::invalid_argument,
                "bias");
  // valid weights: created on a device, or unsupported without one
  const clm::Status st = clm::cuda::DeviceSrcHead::create(0, w, Gelu::tanh, head);
  const clm::Status st2 = clm::cuda::DeviceSnapshotAdapter::create(0, aw, cfg, adapter);
  if (clm::cuda_device_count() > 0) {
    CHECK(st.ok());
    REQUIRE(st2.ok());
    CHECK(adapter->layers() == std::vector<std::int32_t>{1, 2, 3});  // empty = the last 3
    CHECK(adapter->injects_at(3));
    CHECK_FALSE(adapter->injects_at(0));
  } else {
    CHECK(st.code() == StatusCode::unsupported);
    CHECK(st2.code() == StatusCode::unsupported);
  }
}

// ============================================================================
// snapshot adapter
// ============================================================================
namespace {

struct AdapterCase {
  ActDType dtype;
  std::int32_t hidden;
  std::int32_t snapshot_dim;
  std::vector<std::int32_t> lens;
  std::vector<std::uint8_t> mask;  // empty: all
  std::size_t offset_elems;
};

// residual_scale * (W s_b + b) in float64.
std::vector<double> reference_delta(const clm::SnapshotAdapterWeights& w, float scale, const std::vector<float>& snaps,
                                    std::size_t batch) {
  const auto h = static_cast<std::size_t>(w.hidden);
  const auto s = static_cast<std::size_t>(w.snapshot_dim);
  std::vector<double> d(batch * h);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t i = 0; i < h; ++i) {
      double acc = w.bias[i];
      for (std::size_t k = 0; k < s; ++k) acc += static_cast<double>(w.weight[i * s + k]) * snaps[b * s + k];
      d[b * h + i] = static_cast<double>(scale) * acc;
    }
  }
  return d;
}

void run_adapter_case(const AdapterCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  INFO(clm::kv_dtype_name(c.dtype) << " hidden=" << c.hidden << " S=" << c.snapshot_dim << " batch=" << c.lens.size()
                                   << " offset=" << c.offset_elems);
  clm::SnapshotAdapterWeights w;
  w.snapshot_dim = c.snapshot_dim;
  w.hidden = c.hidden;
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.snapshot_dim));
  w.weight = uniform(static_cast<std::size_t>(c.hidden) * c.snapshot_dim, -ws, ws, rng);
  w.bias = uniform(static_cast<std::size_t>(c.hidden), -0.5f, 0.5f, rng);
  clm::SnapshotAdapterConfig cfg;
  cfg.num_layers = 6;
  cfg.residual_scale = 0.3f;
  std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
  REQUIRE_OK(clm::cuda::DeviceSnapshotAdapter::create(0, w, cfg, adapter));
  REQUIRE(adapter->layers() == std::vector<std::int32_t>{3, 4, 5});
  Stream stream;
  const std::size_t batch = c.lens.size();
  const std::vector<std::int32_t> indptr = indptr_of(c.lens);
  const std::int64_t rows = indptr.back();
  const auto applies = [&](std::size_t b) { return c.mask.empty() || c.mask[b] != 0; };

  // hidden states in, expected out
  const auto check_layer = [&](std::int32_t layer, bool use_inject, const std::vector<float>& snaps,
                               const DeviceBytes& dsnaps) {
    HostAct x(c.dtype, rows, c.hidden);
    const std::vector<float> v = uniform(x.bytes.size() / clm::kv_dtype_bytes(c.dtype), -2.0f, 2.0f, rng);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int32_t col = 0; col < c.hidden; ++col) x.set(r, col, v[x.index(r, col)]);
    }
    DeviceAct dx(x, c.offset_elems);
    const clm::ActivationView view{dx.data(), c.dtype, rows, c.hidden};
    if (use_inject) {
      REQUIRE_OK(adapter->inject(view, indptr, dsnaps.get<float>(), c.mask, layer, stream.s));
    } else {
      REQUIRE_OK(adapter->apply(view, indptr, c.mask, layer, stream.s));
    }
    CLM_CUDA_OK(cudaStreamSynchronize(stream.s));
    const std::vector<unsigned char> out = dx.download(x.bytes.size());
    INFO("layer " << layer << (use_inject ? " inject" : " apply"));
    if (!adapter->injects_at(layer)) {
      CHECK(out == x.bytes);
      return;
    }
    const std::vector<double> delta = reference_delta(w, cfg.residual_scale, snaps, batch);
    std::vector<float> got, got_delta;
    std::vector<double> want, want_delta;
    bool untouched_ok = true;
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::int32_t r = indptr[b]; r < indptr[b + 1]; ++r) {
        for (std::int32_t col = 0; col < c.hidden; ++col) {
          const double in = x.get(r, col);
          const double o = x.get_from(out, r, col);
          if (!applies(b)) {
            untouched_ok = untouched_ok && std::memcmp(&out[x.index(r, col) * clm::kv_dtype_bytes(c.dtype)],
                                                       &x.bytes[x.index(r, col) * clm::kv_dtype_bytes(c.dtype)],
                                                       clm::kv_dtype_bytes(c.dtype)) == 0;
            continue;
          }
          const double d = delta[b * static_cast<std::size_t>(c.hidden) + static_cast<std::size_t>(col)];
          got.push_back(static_cast<float>(o));
          want.push_back(in + d);
          got_delta.push_back(static_cast<float>(o - in));
          want_delta.push_back(d);
        }
      }
    }
    CHECK(untouched_ok);  // rows of masked-out sequences: byte for byte
    {                     // the CPU adapter on the same input agrees (and the device copy of its weights too)
      std::unique_ptr<clm::SnapshotAdapter> cpu;
      REQUIRE_OK(clm::SnapshotAdapter::create(w, cfg, cpu));
      std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> from_cpu;
      REQUIRE_OK(clm::cuda::DeviceSnapshotAdapter::create(0, *cpu, from_cpu));
      CHECK(from_cpu->layers() == adapter->layers());
      std::vector<unsigned char> cpu_out = x.bytes;
      REQUIRE_OK(cpu->inject_batch({cpu_out.data(), c.dtype, rows, c.hidden}, indptr, snaps,
                                   c.mask.empty() ? std::vector<std::uint8_t>(batch, 1) : c.mask, layer));
      std::vector<float> gpu_values;
      std::vector<double> cpu_values;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int32_t col = 0; col < c.hidden; ++col) {
          gpu_values.push_back(static_cast<float>(x.get_from(out, r, col)));
          cpu_values.push_back(x.get_from(cpu_out, r, col));
        }
      }
      CHECK(clm_test::relative_error(gpu_values, cpu_values) <= clm_test::tolerance(c.dtype));
    }
    const double err = clm_test::relative_error(got, want);
    INFO("rel err " << err);
    CHECK(err <= clm_test::tolerance(c.dtype));
    if (c.dtype == ActDType::f32) {  // the delta itself, at f32 accuracy
      const double derr = clm_test::relative_error(got_delta, want_delta);
      INFO("delta rel err " << derr);
      CHECK(derr <= 1e-5);
    }
  };

  const std::vector<float> snaps = uniform(batch * static_cast<std::size_t>(c.snapshot_dim), -1.0f, 1.0f, rng);
  DeviceBytes dsnaps(snaps);
  REQUIRE_OK(adapter->prepare(dsnaps.get<float>(), static_cast<std::int32_t>(batch), stream.s));
  check_layer(4, false, snaps, dsnaps);
  check_layer(1, false, snaps, dsnaps);  // not an injecting layer: untouched
  check_layer(5, false, snaps, dsnaps);  // the same deltas at another layer
  const std::vector<float> snaps2 = uniform(snaps.size(), -1.0f, 1.0f, rng);
  DeviceBytes dsnaps2(snaps2);
  check_layer(3, true, snaps2, dsnaps2);  // inject = prepare + apply
  check_layer(0, true, snaps2, dsnaps2);
}

}  // namespace

TEST_CASE("CUDA snapshot adapter adds residual_scale * (W s + b) at its layers", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::uint64_t seed = 500;
  const std::vector<std::int32_t> lens = {3, 1, 20, 0, 37};
  const std::vector<std::uint8_t> mask = {1, 1, 0, 1, 1};
  for (ActDType dtype : {ActDType::f32, ActDType::f16, ActDType::bf16}) {
    run_adapter_case({dtype, kFull ? 512 : 64, 16, lens, mask, 0}, seed++);
    run_adapter_case({dtype, 68, 8, lens, {}, 0}, seed++);    // f16/bf16 rows of 136 bytes: scalar path
    run_adapter_case({dtype, 64, 8, lens, mask, 1}, seed++);  // unaligned base: scalar path
  }
  if (!kFull) return;
  run_adapter_case({ActDType::bf16, 4096, 256, lens_of(64, 1), {}, 0}, seed++);
  run_adapter_case({ActDType::bf16, 4096, 256, lens_of(8, 512), {}, 0}, seed++);
}

TEST_CASE("CUDA snapshot adapter validates its calls", "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 rng(600);
  clm::SnapshotAdapterWeights w;
  w.snapshot_dim = 8;
  w.hidden = 32;
  w.weight = uniform(256, -1, 1, rng);
  w.bias = uniform(32, -1, 1, rng);
  clm::SnapshotAdapterConfig cfg;
  cfg.num_layers = 4;
  cfg.layers = {2, 0, 2};
  std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
  REQUIRE_ERROR(clm::cuda::DeviceSnapshotAdapter::create(0, w, cfg, adapter), StatusCode::invalid_argument,
                "layer 2 is listed twice");
  cfg.layers = {2, 0};
  REQUIRE_OK(clm::cuda::DeviceSnapshotAdapter::create(0, w, cfg, adapter));
  CHECK(adapter->layers() == std::vector<std::int32_t>{0, 2});
  CHECK(adapter->num_layers() == 4);
  Stream stream;
  HostAct x(ActDType::f32, 5, 32);
  DeviceAct dx(x, 0);
  const clm::ActivationView view{dx.data(), ActDType::f32, 5, 32};
  const std::vector<std::int32_t> indptr = {0, 2, 5};
  DeviceBytes snaps(std::vector<float>(16, 0.5f));
  REQUIRE_ERROR(adapter->apply(view, indptr, {}, 2, stream.s), StatusCode::failed_precondition, "prepare");
  REQUIRE_ERROR(adapter->prepare(snaps.get<float>(), 1 << 20, stream.s), StatusCode::invalid_argument, "snapshots");
  REQUIRE_OK(adapter->prepare(snaps.get<float>(), 2, stream.s));
  REQUIRE_ERROR(adapter->apply(view, std::vector<std::int32_t>{0, 5}, {}, 2, stream.s), StatusCode::invalid_argument,
                "last prepare() had 2");
  REQUIRE_ERROR(adapter->apply(view, indptr, {}, 4, stream.s), StatusCode::invalid_argument, "layer 4");
  REQUIRE_ERROR(adapter->apply(view, indptr, std::vector<std::uint8_t>{1}, 2, stream.s), StatusCode::invalid_argument,
                "apply_mask");
  REQUIRE_ERROR(adapter->apply({dx.data(), ActDType::f32, 5, 16}, indptr, {}, 2, stream.s),
                StatusCode::invalid_argument, "columns");
  REQUIRE_ERROR(adapter->apply(view, std::vector<std::int32_t>{0, 2, 4}, {}, 2, stream.s), StatusCode::invalid_argument,
                "ends at 4");
  std::vector<float> host(5 * 32);
  REQUIRE_ERROR(adapter->apply({host.data(), ActDType::f32, 5, 32}, indptr, {}, 2, stream.s),
                StatusCode::invalid_argument, "device memory");
  REQUIRE_ERROR(adapter->inject(view, indptr, nullptr, {}, 0, stream.s), StatusCode::invalid_argument, "null");
  // a layer that does not inject validates, and changes nothing
  REQUIRE_OK(adapter->inject(view, indptr, nullptr, {}, 1, stream.s));
  REQUIRE_OK(adapter->prepare(snaps.get<float>(), 2, stream.s));  // the failed inject dropped the last one
  REQUIRE_OK(adapter->apply(view, indptr, std::vector<std::uint8_t>{0, 0}, 2, stream.s));  // nothing applies
  CLM_CUDA_OK(cudaStreamSynchronize(stream.s));
  CHECK(dx.download(x.bytes.size()) == x.bytes);
}

TEST_CASE("CUDA snapshot adapter refuses NaN/Inf snapshots and overflowing deltas on the device, adding nothing",
          "[cuda][gpu][clm]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 rng(700);
  clm::SnapshotAdapterWeights w;
  w.snapshot_dim = 8;
  w.hidden = 32;
  w.weight = uniform(256, 0.5f, 1.0f, rng);  // one sign: huge snapshots overflow instead of cancelling
  w.bias = uniform(32, -1, 1, rng);
  clm::SnapshotAdapterConfig cfg;
  cfg.num_layers = 4;  // injects at 1, 2, 3
  cfg.residual_scale = 1.0f;
  std::unique_ptr<clm::cuda::DeviceSnapshotAdapter> adapter;
  REQUIRE_OK(clm::cuda::DeviceSnapshotAdapter::create(0, w, cfg, adapter));
  Stream stream;
  REQUIRE_ERROR(adapter->check(stream.s), StatusCode::failed_precondition, "prepare");
  std::vector<std::pair<std::size_t, float>> huge;  // sequence 2: W s >= 8 * 0.5 * 3e38, past FLT_MAX however summed
  for (std::size_t k = 0; k < 8; ++k) huge.emplace_back(16 + k, 3e38f);

  const std::vector<std::int32_t> indptr = {0, 2, 3, 5};
  HostAct x(ActDType::bf16, 5, 32);
  const std::vector<float> v = uniform(5 * 32, -2.0f, 2.0f, rng);
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int32_t col = 0; col < 32; ++col) x.set(r, col, v[x.index(r, col)]);
  }
  DeviceAct dx(x, 0);
  const clm::ActivationView view{dx.data(), ActDType::bf16, 5, 32};
  const std::vector<float> good = uniform(3 * 8, -1.0f, 1.0f, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  struct Bad {
    const char* what;
    std::vector<std::pair<std::size_t, float>> values;  // (index into [3][8], value)
    std::vector<std::uint8_t> mask;
    const char* message;
  };
  const Bad cases[] = {
      {"NaN in sequence 1", {{8 + 3, nan}}, {}, "sequence 1"},
      {"Inf in sequence 2 and NaN in sequence 1: the first is named", {{16, inf}, {9, nan}}, {}, "sequence 1"},
      {"-Inf in sequence 0", {{7, -inf}}, {}, "sequence 0"},
      {"finite snapshot whose W s overflows f32", huge, {}, "sequence 2"},
      {"NaN in a masked-out sequence: prepare does not know the mask", {{8, nan}}, {1, 0, 1}, "sequence 1"},
  };
  for (const Bad& c : cases) {
    INFO(c.what);
    std::vector<float> snaps = good;
    for (const auto& [i, value] : c.values) snaps[i] = value;
    DeviceBytes dsnaps(snaps);
    REQUIRE_OK(adapter->prepare(dsnaps.get<float>(), 3, stream.s));  // the host cannot see device data
    for (std::int32_t layer : {1, 2, 3}) REQUIRE_OK(adapter->apply(view, indptr, c.mask, layer, stream.s));
    REQUIRE_ERROR(adapter->check(stream.s), StatusCode::invalid_argument, c.message);
    CHECK(dx.download(x.bytes.size()) == x.bytes);                                     // nothing added, byte for byte
    REQUIRE_ERROR(adapter->check(stream.s), StatusCode::invalid_argument, c.message);  // until the next prepare
  }
  // inject = prepare + apply: refused the same way; at a layer that does not inject nothing is prepared.
  std::vector<float> nan_snaps = good;
  nan_snaps[20] = nan;
  DeviceBytes dnan(nan_snaps);
  REQUIRE_OK(adapter->inject(view, indptr, dnan.get<float>(), {}, 3, stream.s));
  REQUIRE_ERROR(adapter->check(stream.s), StatusCode::invalid_argument, "sequence 2");
  CHECK(dx.download(x.bytes.size()) == x.bytes);
  DeviceBytes dgood(good);
  REQUIRE_OK(adapter->inject(view, indptr, dgood.get<float>(), {}, 0, stream.s));  // layer 0: no prepare
  REQUIRE_ERROR(adapter->check(stream.s), StatusCode::invalid_argument, "sequence 2");
  // Good snapshots again: check passes and the deltas land (compared with the CPU adapter).
  REQUIRE_OK(adapter->inject(view, indptr, dgood.get<float>(), {}, 3, stream.s));
  REQUIRE_OK(adapter->check(stream.s));
  std::unique_ptr<clm::SnapshotAdapter> cpu;
  REQUIRE_OK(clm::SnapshotAdapter::create(w, cfg, cpu));
  std::vector<unsigned char> cpu_out = x.bytes;
  REQUIRE_OK(
      cpu->inject_batch({cpu_out.data(), ActDType::bf16, 5, 32}, indptr, good, std::vector<std::uint8_t>(3, 1), 3));
  const std::vector<unsigned char> out = dx.download(x.bytes.size());
  CHECK(out != x.bytes);
  std::vector<float> gpu_values;
  std::vector<double> cpu_values;
  for (std::int64_t r = 0; r < 5; ++r) {
    for (std::int32_t col = 0; col < 32; ++col) {
      gpu_values.push_back(static_cast<float>(x.get_from(out, r, col)));
      cpu_values.push_back(x.get_from(cpu_out, r, col));
    }
  }
  CHECK(clm_test::relative_error(gpu_values, cpu_values) <= clm_test::tolerance(ActDType::bf16));
}
