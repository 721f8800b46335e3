// The CUDA kernels (clm/device/cuda_kernels.hpp) on a GPU, against float64
// references on fresh random inputs: decode (split-K + merge), prefill,
// write_kv, page copies, and the host-side validation of the public API.
// Outputs are poisoned with NaN before every run. Without a usable CUDA device
// every test prints "SKIPPED (no usable CUDA device: ...)", which ctest
// reports as skipped.
//
// The same file is also built as test_cuda_kernels_emulated, over a fake CUDA
// runtime (fake_cudart.cpp) and the CPU kernel emulator (emulated_launch.cpp),
// with smaller shapes (CLM_TEST_EMULATED_GPU): that runs the public API's host
// code end to end without a GPU.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <iostream>
#include <limits>
#include <string>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/device/cuda_kernels.hpp"
#include "clm/device/device_memory.hpp"
#include "gpu_test_support.hpp"
#include "kernel_reference.hpp"

namespace {

using clm_test::kFull;
using clm_test::skip_without_gpu;

using clm::AttentionParams;
using clm::KvDType;
using clm::MemoryKind;
using clm::StatusCode;
using clm_test::Batch;
using clm_test::Geometry;
using clm_test::HostPool;

// A device copy of a host vector (or of n elements).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) { CLM_CUDA_OK(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T))); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return static_cast<T*>(p_); }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CLM_CUDA_OK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CLM_CUDA_OK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() { CLM_CUDA_OK(cudaMemset(p_, 0xff, n_ * sizeof(T))); }  // NaN for floats

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

// A pool's bytes on the device (same layout as the HostPool it mirrors).
class DevicePool {
 public:
  explicit DevicePool(const HostPool& host) : host_(host) {
    CLM_CUDA_OK(cudaMalloc(&p_, host.total_bytes()));
    CLM_CUDA_OK(cudaMemcpy(p_, host.data(), host.total_bytes(), cudaMemcpyHostToDevice));
  }
  ~DevicePool() { cudaFree(p_); }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  clm::PagedKvView view() const { return host_.view(MemoryKind::device, p_); }
  void* data() { return p_; }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> bytes(host_.total_bytes());
    CLM_CUDA_OK(cudaMemcpy(bytes.data(), p_, bytes.size(), cudaMemcpyDeviceToHost));
    return bytes;
  }

 private:
  const HostPool& host_;
  void* p_ = nullptr;
};

struct Gpu {
  std::unique_ptr<clm::cuda::Workspace> ws;
  cudaStream_t stream = nullptr;
  Gpu() {
    const clm::Status st = clm::cuda::Workspace::create(0, ws);
    INFO(st.message());
    REQUIRE(st.ok());
    CLM_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Gpu() { cudaStreamDestroy(stream); }
  void sync() {
    const clm::Status st = clm::cuda::synchronize(stream);
    INFO(st.message());
    REQUIRE(st.ok());
  }
};

bool all_nan(const std::vector<float>& x) {
  for (float f : x) {
    if (!std::isnan(f)) return false;
  }
  return true;
}

void decode_case(Gpu& gpu, KvDType dtype, std::int32_t head_dim, std::int32_t group, std::int32_t page_size,
                 std::int32_t chunk, std::int32_t window, const std::vector<std::int32_t>& lens, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Geometry g;
  g.dtype = dtype;
  g.head_dim = head_dim;
  g.kv_heads = 2;
  g.page_size = page_size;
  g.num_layers = 2;
  g.num_pages = clm_test::pages_needed(lens, page_size) + 5;
  HostPool host(g);
  host.fill_random(rng);
  DevicePool pool(host);
  const Batch b = clm_test::make_batch(lens, page_size, g.num_pages, rng);
  AttentionParams params;
  params.num_q_heads = g.kv_heads * group;
  params.sliding_window = window;
  const std::size_t n = lens.size() * static_cast<std::size_t>(params.num_q_heads) * head_dim;
  INFO(clm_test::describe(g) << " group=" << group << " chunk=" << chunk << " window=" << window);
  clm::cuda::DecodeOptions options;
  options.chunk_tokens = chunk;
  REQUIRE_OK(
      clm::cuda::decode_plan(*gpu.ws, pool.view(), params, b.indptr, b.indices, b.last_page_len, gpu.stream, options));
  for (std::int32_t layer : {1, 0}) {  // one plan, both layers
    params.layer = layer;
    const std::vector<float> q = clm_test::random_floats(n, rng);
    DeviceArray<float> dq(q), dout(n);
    dout.poison();
    REQUIRE_OK(clm::cuda::decode_run(*gpu.ws, pool.view(), params, dq.get(), dout.get(), gpu.stream));
    gpu.sync();
    const std::vector<float> out = dout.download();
    const double err = clm_test::relative_error(out, clm_test::reference_decode(host, params, q, b));
    INFO("layer " << layer << " rel err " << err);
    CHECK(err <= clm_test::tolerance(dtype));
  }
}

}  // namespace

TEST_CASE("CUDA decode matches the float64 reference", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  const std::vector<std::int32_t> lens =
      kFull ? std::vector<std::int32_t>{1, 15, 16, 17, 300, 1000, 2500} : std::vector<std::int32_t>{1, 17, 130};
  std::uint64_t seed = 1;
  for (KvDType dtype : {KvDType::f32, KvDType::f16, KvDType::bf16}) {
    for (std::int32_t head_dim : {64, 128}) {
      for (std::int32_t group : {1, 4, 8}) {
        for (std::int32_t page : {1, 16, 64}) {
          for (std::int32_t chunk : {0, 100}) decode_case(gpu, dtype, head_dim, group, page, chunk, 0, lens, seed++);
        }
      }
    }
  }
}

#if CLM_TEST_EMULATED_GPU
extern "C" void clm_fake_cuda_fail_allocation(long skip);
extern "C" int clm_fake_cuda_allocation_failed();

// The fake runtime fails each device or pinned allocation of a decode_plan
// that must grow the workspace, in turn: the plan is refused with
// out_of_memory, decode_run then refuses to run the half-made plan (it never
// reads a freed buffer), and once the faults stop the same batch plans, runs
// and matches the reference.
TEST_CASE("CUDA decode_plan whose workspace cannot grow: a clear status, no half plan, the retry works",
          "[cuda][gpu][faults]") {
  Gpu gpu;
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::int32_t> small = {3, 17}, large(24, 200);
  const Geometry g{.num_pages = clm_test::pages_needed(large, 16) + 2,
                   .page_size = 16,
                   .num_layers = 1,
                   .kv_heads = 2,
                   .head_dim = 64,
                   .dtype = KvDType::f16};
  HostPool host(g);
  host.fill_random(rng);
  DevicePool pool(host);
  AttentionParams params;
  params.num_q_heads = g.kv_heads * 4;
  const Batch first = clm_test::make_batch(small, g.page_size, g.num_pages, rng);
  REQUIRE_OK(clm::cuda::decode_plan(*gpu.ws, pool.view(), params, first.indptr, first.indices, first.last_page_len,
                                    gpu.stream));
  const Batch b = clm_test::make_batch(large, g.page_size, g.num_pages, rng);
  const std::size_t n = large.size() * static_cast<std::size_t>(params.num_q_heads) * g.head_dim;
  const std::vector<float> q = clm_test::random_floats(n, rng);
  DeviceArray<float> dq(q), dout(n);
  long failures = 0;
  for (long skip = 0;; ++skip) {
    INFO("the allocation after " << skip << " fails");
    clm_fake_cuda_fail_allocation(skip);
    const clm::Status planned =
        clm::cuda::decode_plan(*gpu.ws, pool.view(), params, b.indptr, b.indices, b.last_page_len, gpu.stream);
    const bool fired = clm_fake_cuda_allocation_failed() != 0;
    clm_fake_cuda_fail_allocation(-1);
    if (!fired) {
      REQUIRE_OK(planned);
      break;
    }
    ++failures;
    CHECK(planned.code() == StatusCode::out_of_memory);
    dout.poison();
    CHECK(clm::cuda::decode_run(*gpu.ws, pool.view(), params, dq.get(), dout.get(), gpu.stream).code() ==
          StatusCode::failed_precondition);
    CHECK(all_nan(dout.download()));  // nothing written
  }
  CHECK(failures >= 1);
  dout.poison();
  REQUIRE_OK(clm::cuda::decode_run(*gpu.ws, pool.view(), params, dq.get(), dout.get(), gpu.stream));
  gpu.sync();
  const double err = clm_test::relative_error(dout.download(), clm_test::reference_decode(host, params, q, b));
  INFO("rel err " << err);
  CHECK(err <= clm_test::tolerance(KvDType::f16));
}
#endif

TEST_CASE("CUDA decode with sliding windows, odd groups, long and batched sequences", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  decode_case(gpu, KvDType::bf16, 128, 4, 16, 0, 100, {1, 99, 100, 101, 350}, 101);
  decode_case(gpu, KvDType::f32, 64, 1, 1, 37, 50, {3, 120}, 102);
  decode_case(gpu, KvDType::f16, 64, 3, 16, 0, 0, {5, 200, 777}, 103);
  decode_case(gpu, KvDType::f32, 128, 12, 16, 64, 0, {70, 3}, 104);
  if (!kFull) return;
  decode_case(gpu, KvDType::bf16, 128, 4, 16, 0, 0, {16384, 9000, 1}, 105);  // automatic split-K
  std::vector<std::int32_t> many;
  std::mt19937_64 rng(106);
  for (int i = 0; i < 64; ++i) many.push_back(static_cast<std::int32_t>(1 + rng() % 2000));
  decode_case(gpu, KvDType::bf16, 128, 8, 16, 0, 0, many, 107);
}

TEST_CASE("CUDA prefill matches the float64 reference", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  struct Shape {
    std::int32_t kv_len, n_new;
  };
  // n_new up to clm::cuda::detail::kSmallPrefillRows (8) runs as a decode batch.
  const std::vector<Shape> shapes = kFull ? std::vector<Shape>{{1, 1}, {37, 37}, {300, 45}, {700, 1}, {700, 5}, {9, 8}}
                                          : std::vector<Shape>{{1, 1}, {37, 37}, {90, 21}, {70, 1}, {70, 5}, {9, 8}};
  const std::int32_t groups[] = {1, 4, 8};
  const std::int32_t pages[] = {16, 64, 1};
  std::uint64_t seed = 200;
  int rotation = 0;
  for (KvDType dtype : {KvDType::f32, KvDType::f16, KvDType::bf16}) {
    for (std::int32_t head_dim : {64, 128}) {
      for (int k = 0; k < 3; ++k, ++rotation) {
        const std::int32_t group = groups[(rotation + k) % 3];
        const std::int32_t page_size = pages[k];
        for (const Shape& s : shapes) {
          for (std::int32_t window : {0, 64}) {
            std::mt19937_64 rng(seed++);
            Geometry g;
            g.dtype = dtype;
            g.head_dim = head_dim;
            g.kv_heads = 2;
            g.page_size = page_size;
            g.num_layers = 2;
            g.num_pages = clm_test::pages_for(s.kv_len, page_size) + 3;
            HostPool host(g);
            host.fill_random(rng);
            DevicePool pool(host);
            const std::vector<std::int32_t> lens = {s.kv_len};
            const Batch b = clm_test::make_batch(lens, page_size, g.num_pages, rng);
            AttentionParams params;
            params.layer = 1;
            params.num_q_heads = g.kv_heads * group;
            params.sliding_window = window;
            const std::vector<float> q =
                clm_test::random_floats(static_cast<std::size_t>(s.n_new) * params.num_q_heads * head_dim, rng);
            DeviceArray<float> dq(q), dout(q.size());
            dout.poison();
            INFO(clm_test::describe(g) << " group=" << group << " kv_len=" << s.kv_len << " n_new=" << s.n_new
                                       << " window=" << window);
            REQUIRE_OK(clm::cuda::paged_prefill_attention(*gpu.ws, pool.view(), params, dq.get(), s.n_new, b.indices,
                                                          s.kv_len, dout.get(), gpu.stream));
            gpu.sync();
            const std::vector<float> out = dout.download();
            const double err = clm_test::relative_error(
                out, clm_test::reference_prefill(host, params, q, s.n_new, b.indices, s.kv_len));
            INFO("rel err " << err);
            CHECK(err <= clm_test::tolerance(dtype));
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA prefill of a few tokens between decode_plan and decode_run leaves the host's plan alone",
          "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  std::mt19937_64 rng(321);
  Geometry g;
  g.dtype = KvDType::bf16;
  g.head_dim = 64;
  g.kv_heads = 2;
  g.page_size = 16;
  g.num_layers = 2;
  const std::vector<std::int32_t> lens = {40, 75, 3};
  g.num_pages = clm_test::pages_needed(lens, g.page_size) + clm_test::pages_for(60, g.page_size) + 5;
  HostPool host(g);
  host.fill_random(rng);
  DevicePool pool(host);
  const Batch b = clm_test::make_batch(lens, g.page_size, g.num_pages, rng);
  AttentionParams params;
  params.layer = 1;
  params.num_q_heads = 8;
  REQUIRE_OK(clm::cuda::decode_plan(*gpu.ws, pool.view(), params, b.indptr, b.indices, b.last_page_len, gpu.stream));
  // The prefill: 3 new tokens over 60, on pages of their own.
  const std::vector<std::int32_t> prefill_lens = {60};
  const Batch p = clm_test::make_batch(prefill_lens, g.page_size, g.num_pages, rng);
  const std::vector<float> pq = clm_test::random_floats(std::size_t{3} * 8 * 64, rng);
  DeviceArray<float> dpq(pq), dpout(pq.size());
  REQUIRE_OK(clm::cuda::paged_prefill_attention(*gpu.ws, pool.view(), params, dpq.get(), 3, p.indices, 60, dpout.get(),
                                                gpu.stream));
  // The host's plan runs as planned.
  const std::vector<float> q = clm_test::random_floats(lens.size() * 8 * 64, rng);
  DeviceArray<float> dq(q), dout(q.size());
  dout.poison();
  REQUIRE_OK(clm::cuda::decode_run(*gpu.ws, pool.view(), params, dq.get(), dout.get(), gpu.stream));
  gpu.sync();
  CHECK(clm_test::relative_error(dout.download(), clm_test::reference_decode(host, params, q, b)) <=
        clm_test::tolerance(g.dtype));
  CHECK(clm_test::relative_error(dpout.download(), clm_test::reference_prefill(host, params, pq, 3, p.indices, 60)) <=
        clm_test::tolerance(g.dtype));
}

TEST_CASE("CUDA write_kv stores rounded rows in their slots only", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  std::uint64_t seed = 300;
  for (KvDType dtype : {KvDType::f32, KvDType::f16, KvDType::bf16}) {
    for (std::int32_t page_size : {1, 16, 64}) {
      std::mt19937_64 rng(seed++);
      Geometry g;
      g.dtype = dtype;
      g.head_dim = 128;
      g.kv_heads = 4;
      g.page_size = page_size;
      g.num_layers = 3;
      g.num_pages = 400 / page_size + 2;
      HostPool host(g), expected(g);
      host.fill_random(rng);
      std::memcpy(expected.data(), host.data(), host.total_bytes());
      DevicePool pool(host);
      std::vector<std::int64_t> all(static_cast<std::size_t>(g.num_pages) * page_size);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<std::int64_t> slots(all.begin(), all.begin() + 97);
      const std::int32_t layer = 1;
      const std::size_t row = static_cast<std::size_t>(g.kv_heads) * g.head_dim;
      std::vector<float> k = clm_test::random_floats(slots.size() * row, rng);
      std::vector<float> v = clm_test::random_floats(slots.size() * row, rng);
      k[0] = 1.0f + 1.0f / 2048;  // f16 ties round to even
      k[1] = 1.00390625f;         // bf16 tie
      for (std::size_t n = 0; n < slots.size(); ++n) {
        const auto page = static_cast<std::int32_t>(slots[n] / page_size);
        const auto r = static_cast<std::int32_t>(slots[n] % page_size);
        for (std::int32_t h = 0; h < g.kv_heads; ++h) {
          for (std::int32_t d = 0; d < g.head_dim; ++d) {
            const std::size_t src = n * row + static_cast<std::size_t>(h) * g.head_dim + d;
            expected.store(expected.element_index(page, layer, false, r, h, d), k[src]);
            expected.store(expected.element_index(page, layer, true, r, h, d), v[src]);
          }
        }
      }
      DeviceArray<float> dk(k), dv(v);
      INFO(clm_test::describe(g));
      REQUIRE_OK(clm::cuda::write_kv(*gpu.ws, pool.view(), layer, dk.get(), dv.get(), slots, gpu.stream));
      gpu.sync();
      const std::vector<unsigned char> bytes = pool.download();
      CHECK(std::memcmp(bytes.data(), expected.data(), bytes.size()) == 0);
    }
  }
}

TEST_CASE("CUDA page copies between host and device pools", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  using clm::cuda::CopyMethod;
  std::mt19937_64 rng(400);
  Geometry g;
  g.dtype = KvDType::bf16;
  g.head_dim = 128;
  g.kv_heads = 2;
  g.page_size = 16;
  g.num_layers = 3;  // 48 KiB pages
  g.num_pages = 40;
  HostPool host(g), host_dst(g);
  host.fill_random(rng);
  host_dst.fill_bytes(0x5a);
  REQUIRE_OK(clm::cuda::pin_host_memory(host.data(), host.total_bytes()));
  REQUIRE_OK(clm::cuda::pin_host_memory(host_dst.data(), host_dst.total_bytes()));
  HostPool zeros(g);
  zeros.fill_bytes(0);
  DevicePool dev(zeros), dev2(zeros);
  const std::vector<std::int32_t> src_pages = {3, 4, 5, 17, 0, 39, 22};
  const std::vector<std::int32_t> dst_pages = {10, 11, 12, 1, 39, 0, 30};
  const std::size_t pb = host.page_bytes();
  auto expect_pages = [&](const std::vector<unsigned char>& got, const unsigned char* want, const char* what) {
    INFO(what);
    for (std::size_t i = 0; i < src_pages.size(); ++i) {
      INFO("page " << i);
      CHECK(std::memcmp(got.data() + static_cast<std::size_t>(dst_pages[i]) * pb,
                        want + static_cast<std::size_t>(src_pages[i]) * pb, pb) == 0);
    }
  };
  for (CopyMethod method : {CopyMethod::memcpy, CopyMethod::kernel, CopyMethod::automatic}) {
    INFO("method " << static_cast<int>(method));
    clm::cuda::CopyOptions options;
    options.method = method;
    // host -> device
    REQUIRE_OK(clm::cuda::copy_pages(*gpu.ws, dev.view(), dst_pages, host.view(MemoryKind::host), src_pages, gpu.stream,
                                     options));
    gpu.sync();
    expect_pages(dev.download(), host.data(), "h2d");
    // device -> device
    REQUIRE_OK(clm::cuda::copy_pages(*gpu.ws, dev2.view(), src_pages, dev.view(), dst_pages, gpu.stream, options));
    gpu.sync();
    const std::vector<unsigned char> d2 = dev2.download();
    for (std::int32_t p : src_pages) {
      CHECK(std::memcmp(d2.data() + static_cast<std::size_t>(p) * pb, host.data() + static_cast<std::size_t>(p) * pb,
                        pb) == 0);
    }
    // device -> host
    host_dst.fill_bytes(0x5a);
    REQUIRE_OK(clm::cuda::copy_pages(*gpu.ws, host_dst.view(MemoryKind::host), src_pages, dev.view(), dst_pages,
                                     gpu.stream, options));
    gpu.sync();
    for (std::int32_t p : src_pages) {
      CHECK(std::memcmp(host_dst.data() + static_cast<std::size_t>(p) * pb,
                        host.data() + static_cast<std::size_t>(p) * pb, pb) == 0);
    }
    // gather into a contiguous device buffer and a pinned host buffer, scatter back
    DeviceArray<unsigned char> packed(src_pages.size() * pb);
    REQUIRE_OK(
        clm::cuda::gather_pages(*gpu.ws, packed.get(), host.view(MemoryKind::host), src_pages, gpu.stream, options));
    gpu.sync();
    const std::vector<unsigned char> pk = packed.download();
    for (std::size_t i = 0; i < src_pages.size(); ++i) {
      CHECK(std::memcmp(pk.data() + i * pb, host.data() + static_cast<std::size_t>(src_pages[i]) * pb, pb) == 0);
    }
    DevicePool dev3(zeros);
    REQUIRE_OK(clm::cuda::scatter_pages(*gpu.ws, dev3.view(), dst_pages, packed.get(), gpu.stream, options));
    gpu.sync();
    expect_pages(dev3.download(), host.data(), "scatter");
  }
  // Pageable host memory: memcpy works, the kernel cannot read it.
  HostPool pageable(g);
  pageable.fill_random(rng);
  clm::cuda::CopyOptions kernel;
  kernel.method = CopyMethod::kernel;
  CHECK(clm::cuda::copy_pages(*gpu.ws, dev.view(), dst_pages, pageable.view(MemoryKind::host), src_pages, gpu.stream,
                              kernel)
            .code() == StatusCode::unsupported);
  REQUIRE_OK(
      clm::cuda::copy_pages(*gpu.ws, dev.view(), dst_pages, pageable.view(MemoryKind::host), src_pages, gpu.stream));
  gpu.sync();
  expect_pages(dev.download(), pageable.data(), "pageable h2d");
  REQUIRE_OK(clm::cuda::unpin_host_memory(host.data()));
  REQUIRE_OK(clm::cuda::unpin_host_memory(host_dst.data()));
}

TEST_CASE("CUDA kernels work on a device-resident PagedKvPool", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  clm::PagedKvPoolConfig config;
  config.num_pages = 64;
  config.page_size = 16;
  config.num_layers = 2;
  config.kv_heads = 8;
  config.head_dim = 128;
  config.dtype = KvDType::bf16;
  config.memory = MemoryKind::device;
  std::unique_ptr<clm::PagedKvPool> pool;
  REQUIRE_OK(clm::PagedKvPool::create(config, pool));
  const clm::PagedKvView kv = clm::PagedKvView::of(*pool);
  std::vector<std::int32_t> pages(3);
  REQUIRE_OK(pool->allocate(pages));
  // write 40 tokens of K/V, then decode the last one and prefill all of them
  std::mt19937_64 rng(500);
  const std::int32_t len = 40;
  std::vector<std::int64_t> slots;
  for (std::int32_t t = 0; t < len; ++t)
    slots.push_back(std::int64_t{pages[static_cast<std::size_t>(t / 16)]} * 16 + t % 16);
  const std::size_t row = 8 * 128;
  std::vector<float> k = clm_test::random_floats(len * row, rng), v = clm_test::random_floats(len * row, rng);
  DeviceArray<float> dk(k), dv(v);
  REQUIRE_OK(clm::cuda::write_kv(*gpu.ws, kv, 1, dk.get(), dv.get(), slots, gpu.stream));
  // the same values, as the reference sees them
  Geometry g;
  g.num_pages = 64;
  g.page_size = 16;
  g.num_layers = 2;
  g.kv_heads = 8;
  g.head_dim = 128;
  g.dtype = KvDType::bf16;
  HostPool host(g);
  host.fill_bytes(0);
  for (std::int32_t t = 0; t < len; ++t) {
    for (std::size_t e = 0; e < row; ++e) {
      const auto h = static_cast<std::int32_t>(e / 128), d = static_cast<std::int32_t>(e % 128);
      host.store(host.element_index(pages[static_cast<std::size_t>(t / 16)], 1, false, t % 16, h, d), k[t * row + e]);
      host.store(host.element_index(pages[static_cast<std::size_t>(t / 16)], 1, true, t % 16, h, d), v[t * row + e]);
    }
  }
  AttentionParams params;
  params.layer = 1;
  params.num_q_heads = 32;
  const std::vector<float> q = clm_test::random_floats(static_cast<std::size_t>(len) * 32 * 128, rng);
  DeviceArray<float> dq(q), dout(q.size());
  dout.poison();
  REQUIRE_OK(
      clm::cuda::paged_prefill_attention(*gpu.ws, kv, params, dq.get(), len, pages, len, dout.get(), gpu.stream));
  gpu.sync();
  CHECK(clm_test::relative_error(dout.download(), clm_test::reference_prefill(host, params, q, len, pages, len)) <=
        1e-2);
  Batch b;
  b.lens = {len};
  b.indptr = {0, 3};
  b.indices = pages;
  b.last_page_len = {len - 32};
  const std::vector<float> q1(q.begin(), q.begin() + 32 * 128);
  DeviceArray<float> dq1(q1), dout1(q1.size());
  dout1.poison();
  REQUIRE_OK(clm::cuda::paged_decode_attention(*gpu.ws, kv, params, dq1.get(), b.indptr, b.indices, b.last_page_len,
                                               dout1.get(), gpu.stream));
  gpu.sync();
  CHECK(clm_test::relative_error(dout1.download(), clm_test::reference_decode(host, params, q1, b)) <= 1e-2);
  REQUIRE_OK(pool->release(pages));
}

TEST_CASE("CUDA entry points reject bad arguments before launching", "[cuda][gpu]") {
  if (skip_without_gpu()) return;
  Gpu gpu;
  std::unique_ptr<clm::cuda::Workspace> none;
  CHECK(clm::cuda::Workspace::create(-1, none).code() == StatusCode::unsupported);
  CHECK(clm::cuda::Workspace::create(1 << 20, none).code() == StatusCode::unsupported);

  std::mt19937_64 rng(600);
  Geometry g;
  g.dtype = KvDType::f16;
  g.head_dim = 64;
  g.kv_heads = 2;
  g.page_size = 16;
  g.num_layers = 1;
  g.num_pages = 8;
  HostPool host(g);
  host.fill_random(rng);
  DevicePool pool(host);
  AttentionParams params;
  params.num_q_heads = 4;
  const std::vector<float> q = clm_test::random_floats(2 * 4 * 64, rng);
  DeviceArray<float> dq(q), dout(q.size());
  dout.poison();
  const std::vector<std::int32_t> indptr = {0, 2, 3}, lpl = {5, 16};
  // a fresh workspace has no plan
  std::unique_ptr<clm::cuda::Workspace> fresh;
  REQUIRE_OK(clm::cuda::Workspace::create(0, fresh));
  CHECK(clm::cuda::decode_run(*fresh, pool.view(), params, dq.get(), dout.get(), gpu.stream).code() ==
        StatusCode::failed_precondition);
  // page id out of range: nothing runs, and the plan is dropped
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, pool.view(), params, dq.get(), indptr,
                                          std::vector<std::int32_t>{1, 2, 8}, lpl, dout.get(), gpu.stream)
            .code() == StatusCode::invalid_argument);
  CHECK(clm::cuda::decode_run(*gpu.ws, pool.view(), params, dq.get(), dout.get(), gpu.stream).code() ==
        StatusCode::failed_precondition);
  // host memory where device memory is needed
  std::vector<float> host_out(q.size());
  const std::vector<std::int32_t> indices = {1, 2, 3};
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, pool.view(), params, q.data(), indptr, indices, lpl, dout.get(),
                                          gpu.stream)
            .code() == StatusCode::invalid_argument);
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, pool.view(), params, dq.get(), indptr, indices, lpl, host_out.data(),
                                          gpu.stream)
            .code() == StatusCode::invalid_argument);
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, host.view(MemoryKind::device), params, dq.get(), indptr, indices,
                                          lpl, dout.get(), gpu.stream)
            .code() == StatusCode::invalid_argument);  // the view lies about its memory
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, host.view(MemoryKind::host), params, dq.get(), indptr, indices, lpl,
                                          dout.get(), gpu.stream)
            .code() == StatusCode::unsupported);  // a host pool: the CPU kernels' job
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, pool.view(), params, dq.get(), indptr, indices, lpl, dq.get(),
                                          gpu.stream)
            .code() == StatusCode::invalid_argument);  // out overlaps q
  // head counts, layer, prefill pages, write_kv slots
  AttentionParams bad = params;
  bad.num_q_heads = 3;
  CHECK(clm::cuda::paged_decode_attention(*gpu.ws, pool.view(), bad, dq.get(), indptr, indices, lpl, dout.get(),
                                          gpu.stream)
            .code() == StatusCode::invalid_argument);
  bad = params;
  bad.layer = 1;
  CHECK(clm::cuda::paged_prefill_attention(*gpu.ws, pool.view(), bad, dq.get(), 2, indices, 20, dout.get(), gpu.stream)
            .code() == StatusCode::invalid_argument);
  CHECK(clm::cuda::paged_prefill_attention(*gpu.ws, pool.view(), params, dq.get(), 2, std::vector<std::int32_t>{1}, 20,
                                           dout.get(), gpu.stream)
            .code() == StatusCode::invalid_argument);
  DeviceArray<float> dk(std::vector<float>(2 * 2 * 64, 1.0f));
  CHECK(clm::cuda::write_kv(*gpu.ws, pool.view(), 0, dk.get(), dk.get(), std::vector<std::int64_t>{3, 128}, gpu.stream)
            .code() == StatusCode::invalid_argument);
  CHECK(clm::cuda::write_kv(*gpu.ws, pool.view(), 0, dk.get(), dk.get(), std::vector<std::int64_t>{3, 3}, gpu.stream)
            .code() == StatusCode::invalid_argument);
  gpu.sync();
  CHECK(all_nan(dout.download()));  // nothing wrote the output
  CHECK(pool.download() == std::vector<unsigned char>(host.data(), host.data() + host.total_bytes()));
  // head_dim 96: a valid pool the attention kernels do not cover
  Geometry g96 = g;
  g96.head_dim = 96;
  HostPool host96(g96);
  host96.fill_random(rng);
  DevicePool pool96(host96);
  CHECK(clm::cuda::paged_prefill_attention(*gpu.ws, pool96.view(), params, dq.get(), 1, indices, 1, dout.get(),
                                           gpu.stream)
            .code() == StatusCode::unsupported);
}
