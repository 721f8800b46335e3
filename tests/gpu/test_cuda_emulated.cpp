// The CUDA kernels of cuda/kernels/kernels.cuh, compiled for the CPU and run on the
// fiber emulator (cuda_emu.hpp) against float64 references: this tests their
// indexing, bounds, shared memory and barriers on machines without a GPU,
// through the same host validation and planning (cuda/kernels/plan.cpp) as the real
// launches. What it cannot test: the CUDA intrinsics themselves, the memory
// model beyond barriers, performance (tests/gpu/run.sh does, on a GPU).
//
// Outputs and workspaces are poisoned with NaN before every run; the emulated
// "device" buffers are exact-size heap allocations, so an ASan build of this
// test catches any out-of-bounds access.
#include "cuda_emu.hpp"  // first: the kernels compile over it

#include <catch2/catch.hpp>

#include <cstdio>
#include <limits>

#include "kernel_reference.hpp"
#include "kernels/kernels.cuh"
#include "kernels/plan.hpp"

namespace {

using namespace clm::cuda::detail;
using clm::AttentionParams;
using clm::KvDType;
using clm::MemoryKind;
using clm_test::Batch;
using clm_test::Geometry;
using clm_test::HostPool;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

clm_emu::Dim emu_dim(Dims d) { return clm_emu::Dim{d.x, d.y, d.z}; }

// The emulated kernels compute exactly what the GPU ones do, in f32, from the
// pool's exact values: the reference uses the same values, so f16/bf16 pools
// are held to f32 accuracy here too.
constexpr double kEmuTolerance = 1e-5;

clm::Status emu_decode(const HostPool& pool, const AttentionParams& params, const std::vector<float>& q,
                       const Batch& b, std::int32_t chunk_tokens, std::vector<float>& out, DecodePlan& plan) {
  const clm::PagedKvView kv = pool.view(MemoryKind::device);  // the emulator's "device" is host memory
  DecodeTuning tuning;
  tuning.sm_count = 4;
  tuning.blocks_per_sm = 2;
  tuning.chunk_tokens = chunk_tokens;
  CLM_RETURN_IF_ERROR(plan_decode(kv, params, b.indptr, b.indices, b.last_page_len, tuning, plan));
  CLM_RETURN_IF_ERROR(check_decode_run(plan, kv, params));
  std::vector<float> partial(decode_partial_floats(plan), kNaN);
  float* partial_out = partial.data();
  float* partial_lse = partial_out + plan.items.size() * static_cast<std::size_t>(plan.num_q_heads) * plan.head_dim;
  const DecodeArgs args =
      make_decode_args(plan, kv, params, b.indices.data(), plan.items.data(), q.data(), partial_out, partial_lse);
  const int launched = with_decode_kernel(static_cast<int>(kv.dtype), kv.head_dim, plan.heads.heads_per_block,
                                          [&](DecodeKernel kernel) {
                                            clm_emu::launch(emu_dim(plan.decode_grid), kDecodeThreads, kernel, args);
                                            return 0;
                                          });
  REQUIRE(launched == 0);
  const MergeArgs merge = make_merge_args(plan, plan.merge_indptr.data(), partial_out, partial_lse, out.data());
  REQUIRE(with_merge_kernel(kv.head_dim, [&](MergeKernel kernel) {
            clm_emu::launch(emu_dim(plan.merge_grid), static_cast<unsigned>(kv.head_dim), kernel, merge);
            return 0;
          }) == 0);
  return {};
}

struct DecodeCase {
  KvDType dtype;
  std::int32_t head_dim;
  std::int32_t group;
  std::int32_t page_size;
  std::int32_t chunk_tokens;  // 0: auto
  std::int32_t window;
};

void run_decode_case(const DecodeCase& c, std::vector<std::int32_t> lens, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Geometry g;
  g.dtype = c.dtype;
  g.head_dim = c.head_dim;
  g.kv_heads = 2;
  g.page_size = c.page_size;
  g.num_layers = 2;
  g.num_pages = clm_test::pages_needed(lens, c.page_size) + 3;  // a few pages no sequence uses
  HostPool pool(g);
  pool.fill_random(rng);
  const Batch b = clm_test::make_batch(lens, g.page_size, g.num_pages, rng);
  AttentionParams params;
  params.layer = 1;
  params.num_q_heads = g.kv_heads * c.group;
  params.sliding_window = c.window;
  const std::vector<float> q =
      clm_test::random_floats(lens.size() * static_cast<std::size_t>(params.num_q_heads) * g.head_dim, rng);
  std::vector<float> out(q.size(), kNaN);
  DecodePlan plan;
  INFO(clm_test::describe(g) << " group=" << c.group << " chunk=" << c.chunk_tokens << " window=" << c.window);
  const clm::Status st = emu_decode(pool, params, q, b, c.chunk_tokens, out, plan);
  REQUIRE(st.ok());
  const std::vector<double> ref = clm_test::reference_decode(pool, params, q, b);
  const double err = clm_test::relative_error(out, ref);
  INFO("items " << plan.items.size() << ", chunk " << plan.chunk_tokens << ", rel err " << err);
  CHECK(err <= kEmuTolerance);
}

}  // namespace

TEST_CASE("emulated decode kernel matches the float64 reference", "[cuda][emulated]") {
  // Every dtype x head_dim, with GQA 1/4/8 and page sizes 1/16/64 rotated
  // through them; ragged lengths (1 token, a partial page, several tiles),
  // chunks forced to 100 tokens (not a page or tile multiple) and automatic.
  const std::vector<std::int32_t> lens = {1, 17, 130, 300};
  const std::int32_t groups[] = {1, 4, 8};
  const std::int32_t page_sizes[] = {16, 64, 1};
  std::uint64_t seed = 1;
  int rotation = 0;
  for (KvDType dtype : {KvDType::f32, KvDType::f16, KvDType::bf16}) {
    for (std::int32_t head_dim : {64, 128}) {
      for (int k = 0; k < 3; ++k) {
        const std::int32_t group = groups[(rotation + k) % 3];
        const std::int32_t page = page_sizes[k];
        run_decode_case({dtype, head_dim, group, page, 100, 0}, lens, seed++);
      }
      ++rotation;
    }
  }
  // automatic split (no split for these lengths), and odd group sizes
  run_decode_case({KvDType::bf16, 128, 4, 16, 0, 0}, lens, seed++);
  run_decode_case({KvDType::f16, 64, 3, 16, 64, 0}, {5, 200}, seed++);
  run_decode_case({KvDType::f32, 128, 12, 16, 64, 0}, {70, 3}, seed++);
}

TEST_CASE("emulated decode with a sliding window and long chunks", "[cuda][emulated]") {
  run_decode_case({KvDType::bf16, 128, 4, 16, 0, 100}, {1, 99, 100, 101, 350}, 101);
  run_decode_case({KvDType::f32, 64, 1, 1, 37, 50}, {3, 120}, 102);
  // one long sequence split automatically into several chunks
  run_decode_case({KvDType::f16, 128, 8, 64, 0, 0}, {1500}, 103);
}

namespace {

struct PrefillCase {
  KvDType dtype;
  std::int32_t head_dim;
  std::int32_t group;
  std::int32_t page_size;
  std::int32_t kv_len;
  std::int32_t n_new;
  std::int32_t window;
};

void run_prefill_case(const PrefillCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Geometry g;
  g.dtype = c.dtype;
  g.head_dim = c.head_dim;
  g.kv_heads = 2;
  g.page_size = c.page_size;
  g.num_layers = 2;
  g.num_pages = clm_test::pages_for(c.kv_len, c.page_size) + 2;
  HostPool pool(g);
  pool.fill_random(rng);
  const std::vector<std::int32_t> lens = {c.kv_len};
  const Batch b = clm_test::make_batch(lens, g.page_size, g.num_pages, rng);
  AttentionParams params;
  params.layer = 1;
  params.num_q_heads = g.kv_heads * c.group;
  params.sliding_window = c.window;
  params.softmax_scale = 0.07f;
  const std::vector<float> q =
      clm_test::random_floats(static_cast<std::size_t>(c.n_new) * params.num_q_heads * g.head_dim, rng);
  std::vector<float> out(q.size(), kNaN);
  INFO(clm_test::describe(g) << " group=" << c.group << " kv_len=" << c.kv_len << " n_new=" << c.n_new
                             << " window=" << c.window);
  const clm::PagedKvView kv = pool.view(MemoryKind::device);
  REQUIRE(validate_prefill(kv, params, c.n_new, b.indices, c.kv_len).ok());
  const PrefillArgs args = make_prefill_args(kv, params, c.n_new, c.kv_len, b.indices.data(), q.data(), out.data());
  REQUIRE(with_prefill_kernel(static_cast<int>(kv.dtype), kv.head_dim, [&](PrefillKernel kernel) {
            clm_emu::launch(emu_dim(prefill_grid(kv, params, c.n_new)), kPrefillThreads, kernel, args);
            return 0;
          }) == 0);
  const std::vector<double> ref = clm_test::reference_prefill(pool, params, q, c.n_new, b.indices, c.kv_len);
  const double err = clm_test::relative_error(out, ref);
  INFO("rel err " << err);
  CHECK(err <= kEmuTolerance);
}

}  // namespace

TEST_CASE("emulated prefill kernel matches the float64 reference", "[cuda][emulated]") {
  std::uint64_t seed = 200;
  // all new tokens; a cached prefix; one new token; GQA 1/4/8; pages 1/16/64
  run_prefill_case({KvDType::f32, 128, 1, 16, 37, 37, 0}, seed++);
  run_prefill_case({KvDType::bf16, 128, 4, 64, 100, 21, 0}, seed++);
  run_prefill_case({KvDType::f16, 64, 8, 1, 45, 7, 0}, seed++);
  run_prefill_case({KvDType::f32, 64, 4, 16, 70, 1, 0}, seed++);
  run_prefill_case({KvDType::bf16, 64, 1, 1, 1, 1, 0}, seed++);
  run_prefill_case({KvDType::f16, 128, 3, 16, 50, 50, 0}, seed++);
  // sliding window, smaller than and larger than the sequence
  run_prefill_case({KvDType::f32, 128, 4, 16, 90, 30, 20}, seed++);
  run_prefill_case({KvDType::bf16, 64, 2, 64, 40, 40, 33}, seed++);
  run_prefill_case({KvDType::f16, 64, 1, 16, 20, 20, 1000}, seed++);
}

TEST_CASE("emulated write_kv stores rounded rows in their slots only", "[cuda][emulated]") {
  std::uint64_t seed = 300;
  for (KvDType dtype : {KvDType::f32, KvDType::f16, KvDType::bf16}) {
    std::mt19937_64 rng(seed++);
    Geometry g;
    g.dtype = dtype;
    g.head_dim = 64;
    g.kv_heads = 3;
    g.page_size = 16;
    g.num_layers = 3;
    g.num_pages = 5;
    HostPool pool(g);
    pool.fill_random(rng);
    HostPool expected(g);
    std::memcpy(expected.data(), pool.data(), pool.total_bytes());
    std::vector<std::int64_t> slots = {0, 17, 79, 33, 50, 5};
    const std::int32_t layer = 2;
    const std::size_t row = static_cast<std::size_t>(g.kv_heads) * g.head_dim;
    const std::vector<float> k = clm_test::random_floats(slots.size() * row, rng);
    const std::vector<float> v = clm_test::random_floats(slots.size() * row, rng);
    for (std::size_t n = 0; n < slots.size(); ++n) {
      const auto page = static_cast<std::int32_t>(slots[n] / g.page_size);
      const auto r = static_cast<std::int32_t>(slots[n] % g.page_size);
      for (std::int32_t h = 0; h < g.kv_heads; ++h) {
        for (std::int32_t d = 0; d < g.head_dim; ++d) {
          const std::size_t src = n * row + static_cast<std::size_t>(h) * g.head_dim + d;
          expected.store(expected.element_index(page, layer, false, r, h, d), k[src]);
          expected.store(expected.element_index(page, layer, true, r, h, d), v[src]);
        }
      }
    }
    const clm::PagedKvView kv = pool.view(MemoryKind::device);
    REQUIRE(validate_write_kv(kv, layer, slots).ok());
    const WriteKvArgs args = make_write_kv_args(kv, layer, slots.data(), k.data(), v.data());
    REQUIRE(with_write_kv_kernel(static_cast<int>(dtype), [&](WriteKvKernel kernel) {
              clm_emu::launch(clm_emu::Dim{static_cast<unsigned>(slots.size()), 1, 1}, kWriteKvThreads, kernel, args);
              return 0;
            }) == 0);
    INFO(clm_test::describe(g));
    CHECK(std::memcmp(pool.data(), expected.data(), pool.total_bytes()) == 0);
  }
}

TEST_CASE("emulated page copy kernel moves whole pages", "[cuda][emulated]") {
  std::mt19937_64 rng(400);
  Geometry g;
  g.dtype = KvDType::bf16;
  g.head_dim = 64;
  g.kv_heads = 2;
  g.page_size = 16;
  g.num_layers = 5;  // 40 KiB pages: several 16 KiB blocks per page, the last one partial
  g.num_pages = 9;
  HostPool src(g), dst(g), expected(g);
  src.fill_random(rng);
  dst.fill_random(rng);
  std::memcpy(expected.data(), dst.data(), dst.total_bytes());
  const std::vector<std::int32_t> src_pages = {3, 0, 8, 4};
  const std::vector<std::int32_t> dst_pages = {1, 2, 3, 8};
  for (std::size_t i = 0; i < src_pages.size(); ++i) {
    std::memcpy(expected.data() + static_cast<std::size_t>(dst_pages[i]) * expected.page_bytes(),
                src.data() + static_cast<std::size_t>(src_pages[i]) * src.page_bytes(), src.page_bytes());
  }
  REQUIRE(validate_copy(dst.view(MemoryKind::device), dst_pages, src.view(MemoryKind::host), src_pages).ok());
  REQUIRE(copy_kernel_supports(src.page_bytes()));
  std::vector<std::int32_t> pairs;
  for (std::size_t i = 0; i < src_pages.size(); ++i) {
    pairs.push_back(src_pages[i]);
    pairs.push_back(dst_pages[i]);
  }
  CopyArgs args{};
  args.src = src.data();
  args.dst = dst.data();
  args.page_bytes = src.page_bytes();
  args.units = src.page_bytes() / 16;
  args.pairs = pairs.data();
  clm_emu::launch(emu_dim(copy_grid(src_pages.size(), src.page_bytes())), kCopyThreads, &copy_pages_kernel, args);
  CHECK(std::memcmp(dst.data(), expected.data(), dst.total_bytes()) == 0);
}
