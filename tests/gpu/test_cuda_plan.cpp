// Host-side checks and split-K planning of the CUDA kernels (cuda/kernels/plan.cpp):
// every entry point of clm/device/cuda_kernels.hpp runs these before it launches
// anything, so they are tested here, without a GPU.
#include <catch2/catch.hpp>

#include <limits>

#include "kernel_reference.hpp"
#include "kernels/half_bits.hpp"
#include "kernels/plan.hpp"

namespace {

using namespace clm::cuda::detail;
using clm::AttentionParams;
using clm::KvDType;
using clm::MemoryKind;
using clm::PagedKvView;
using clm::StatusCode;

// A view over fake (never dereferenced) device memory.
PagedKvView device_view(std::int32_t num_pages = 64, std::int32_t page_size = 16, std::int32_t head_dim = 128,
                        KvDType dtype = KvDType::bf16, std::int32_t kv_heads = 2, std::int32_t num_layers = 2) {
  clm_test::Geometry g;
  g.num_pages = 1;  // the HostPool is only used for the byte sizes
  g.page_size = page_size;
  g.head_dim = head_dim;
  g.dtype = dtype;
  g.kv_heads = kv_heads;
  g.num_layers = num_layers;
  clm_test::HostPool sizes(g);
  PagedKvView v = sizes.view(MemoryKind::device, reinterpret_cast<void*>(std::uintptr_t{1} << 40));
  v.num_pages = num_pages;
  return v;
}

AttentionParams heads(std::int32_t num_q_heads, std::int32_t window = 0) {
  AttentionParams p;
  p.num_q_heads = num_q_heads;
  p.sliding_window = window;
  return p;
}

StatusCode plan_code(const PagedKvView& kv, const AttentionParams& p, std::vector<std::int32_t> indptr,
                     std::vector<std::int32_t> indices, std::vector<std::int32_t> last_page_len,
                     std::int32_t chunk = 0) {
  DecodePlan plan;
  DecodeTuning tuning;
  tuning.chunk_tokens = chunk;
  return plan_decode(kv, p, indptr, indices, last_page_len, tuning, plan).code();
}

}  // namespace

TEST_CASE("views are validated before anything runs", "[cuda][plan]") {
  PagedKvView kv = device_view();
  CHECK(validate_kernel_view(kv, 0).ok());
  CHECK(validate_kernel_view(kv, 1).ok());
  CHECK(validate_kernel_view(kv, 2).code() == StatusCode::invalid_argument);  // layer out of range
  CHECK(validate_kernel_view(kv, -1).code() == StatusCode::invalid_argument);

  PagedKvView bad = kv;
  bad.base = nullptr;
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);
  bad = kv;
  bad.memory = MemoryKind::host;
  CHECK(validate_kernel_view(bad, 0).code() == StatusCode::unsupported);  // as the CPU kernels answer a device pool
  bad.memory = MemoryKind::none;
  CHECK(validate_kernel_view(bad, 0).code() == StatusCode::failed_precondition);
  bad = kv;
  bad.page_bytes += 16;  // inconsistent with the geometry
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);
  bad = kv;
  bad.layer_bytes /= 2;
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);
  bad = kv;
  bad.kv_heads = 0;
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);
  bad = kv;
  bad.dtype = static_cast<KvDType>(7);
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);
  bad = kv;
  bad.base = static_cast<char*>(kv.base) + 8;  // misaligned
  CHECK(validate_kernel_view(bad, 0).code() == StatusCode::invalid_argument);
  bad = kv;
  bad.num_pages = std::numeric_limits<std::int32_t>::max();
  bad.base = reinterpret_cast<void*>(~std::uintptr_t{0} - 4096);  // wraps around the address space
  CHECK(validate_view(bad, "kv").code() == StatusCode::invalid_argument);

  const PagedKvView d96 = device_view(64, 16, 96);
  CHECK(validate_view(d96, "kv").ok());  // a valid pool...
  CHECK(validate_kernel_view(d96, 0).code() == StatusCode::unsupported);  // ...the attention kernels don't cover
}

TEST_CASE("head counts, scale and window are validated", "[cuda][plan]") {
  const PagedKvView kv = device_view();  // 2 kv heads
  CHECK(validate_heads(kv, heads(2)).ok());
  CHECK(validate_heads(kv, heads(16)).ok());
  CHECK(validate_heads(kv, heads(0)).code() == StatusCode::invalid_argument);
  CHECK(validate_heads(kv, heads(3)).code() == StatusCode::invalid_argument);
  CHECK(validate_heads(kv, heads(-2)).code() == StatusCode::invalid_argument);
  CHECK(validate_heads(kv, heads(70000)).code() == StatusCode::invalid_argument);  // grid limit
  CHECK(validate_heads(kv, heads(4, -1)).code() == StatusCode::invalid_argument);
  AttentionParams p = heads(4);
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  CHECK(validate_heads(kv, p).code() == StatusCode::invalid_argument);
  p.softmax_scale = std::numeric_limits<float>::infinity();
  CHECK(validate_heads(kv, p).code() == StatusCode::invalid_argument);
  p.softmax_scale = 0.0f;
  CHECK(effective_scale(p, 128) == Approx(1.0 / std::sqrt(128.0)));
  p.softmax_scale = 0.25f;
  CHECK(effective_scale(p, 128) == 0.25f);
}

TEST_CASE("decode batches are validated on the host", "[cuda][plan]") {
  const PagedKvView kv = device_view(64, 16);
  const AttentionParams p = heads(8);
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 7}, {16, 1}) == StatusCode::ok);
  CHECK(plan_code(kv, p, {0}, {}, {}) == StatusCode::ok);  // empty batch
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 7, 99}, {16, 1}) == StatusCode::ok);  // unused trailing indices
  // indptr size, start, monotonicity, empty sequences, length vs indices
  CHECK(plan_code(kv, p, {0, 2}, {5, 6, 7}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {}, {}, {}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {1, 2, 3}, {5, 6, 7}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 2}, {5, 6, 7}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 1}, {5, 6, 7}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 4}, {5, 6, 7}, {16, 1}) == StatusCode::invalid_argument);
  // page ids
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, -1, 7}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 64}, {16, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 63}, {16, 1}) == StatusCode::ok);
  // last_page_len in [1, page_size]
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 7}, {0, 1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 2, 3}, {5, 6, 7}, {17, 1}) == StatusCode::invalid_argument);
  // heads and chunk
  CHECK(plan_code(kv, heads(3), {0, 1}, {5}, {1}) == StatusCode::invalid_argument);
  CHECK(plan_code(kv, p, {0, 1}, {5}, {1}, -5) == StatusCode::invalid_argument);
  // a sequence longer than the kernels' limit (2^30 tokens)
  const PagedKvView big = device_view(4, 65536, 64, KvDType::bf16, 1, 1);
  std::vector<std::int32_t> many(16385, 3);
  CHECK(plan_code(big, heads(1), {0, 16384}, many, {65536}) == StatusCode::ok);
  CHECK(plan_code(big, heads(1), {0, 16385}, many, {1}) == StatusCode::invalid_argument);
}

TEST_CASE("decode plans cover every token once, in chunks", "[cuda][plan]") {
  const PagedKvView kv = device_view(1000, 16);
  std::mt19937_64 rng(7);
  const std::vector<std::int32_t> lens = {1, 16, 17, 250, 1000, 4097};
  const clm_test::Batch b = clm_test::make_batch(lens, 16, 1000, rng);
  for (std::int32_t window : {0, 100}) {
    for (std::int32_t chunk : {0, 1, 100, 256, 5000}) {
      DecodePlan plan;
      DecodeTuning tuning;
      tuning.sm_count = 132;
      tuning.blocks_per_sm = 3;
      tuning.chunk_tokens = chunk;
      REQUIRE(plan_decode(kv, heads(8, window), b.indptr, b.indices, b.last_page_len, tuning, plan).ok());
      INFO("window " << window << " chunk " << chunk << " -> " << plan.chunk_tokens);
      if (chunk > 0) CHECK(plan.chunk_tokens == chunk);
      REQUIRE(plan.merge_indptr.size() == lens.size() + 1);
      CHECK(plan.merge_indptr[0] == 0);
      CHECK(static_cast<std::size_t>(plan.merge_indptr.back()) == plan.items.size());
      for (std::size_t i = 0; i < lens.size(); ++i) {
        const std::int32_t first = window > 0 ? std::max(0, lens[i] - window) : 0;
        std::int32_t next = first;
        REQUIRE(plan.merge_indptr[i + 1] > plan.merge_indptr[i]);
        for (std::int32_t it = plan.merge_indptr[i]; it < plan.merge_indptr[i + 1]; ++it) {
          const DecodeItem& item = plan.items[static_cast<std::size_t>(it)];
          CHECK(item.seq == static_cast<std::int32_t>(i));
          CHECK(item.page_begin == b.indptr[i]);
          CHECK(item.tok_begin == next);
          CHECK(item.tok_end > item.tok_begin);
          CHECK(item.tok_end - item.tok_begin <= plan.chunk_tokens);
          next = item.tok_end;
        }
        CHECK(next == lens[i]);
      }
      CHECK(plan.decode_grid.x == plan.items.size());
      CHECK(plan.decode_grid.y == 2u);  // 2 kv heads, group 4 -> one block of 4 heads each
      CHECK(plan.merge_grid.x == lens.size());
      CHECK(plan.merge_grid.y == 8u);
      CHECK(decode_partial_floats(plan) == plan.items.size() * 8 * 129);
    }
  }
}

TEST_CASE("automatic split-K fills the device with whole-tile chunks", "[cuda][plan]") {
  // The benchmark's shape: 32 sequences of 32k tokens, 8 kv heads, 32 q heads, bf16, D = 128.
  const PagedKvView kv = device_view(65536, 16, 128, KvDType::bf16, 8, 1);
  std::vector<std::int32_t> indptr{0}, indices, lpl;
  for (int s = 0; s < 32; ++s) {
    for (int i = 0; i < 2048; ++i) indices.push_back(s * 2048 + i);
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
    lpl.push_back(16);
  }
  DecodePlan plan;
  DecodeTuning tuning;
  tuning.sm_count = 132;
  tuning.blocks_per_sm = 3;
  REQUIRE(plan_decode(kv, heads(32), indptr, indices, lpl, tuning, plan).ok());
  const std::int32_t tile = decode_tile_tokens(KvDType::bf16, 128);
  CHECK(tile == 64);
  CHECK(plan.chunk_tokens % tile == 0);
  CHECK(plan.chunk_tokens >= 256);
  const std::uint64_t blocks = std::uint64_t{plan.decode_grid.x} * plan.decode_grid.y;
  CHECK(blocks >= 132u * 3u * 4u);   // several waves
  CHECK(blocks <= 132u * 3u * 16u);  // not absurdly many partial outputs
  // short sequences are not split
  DecodePlan small;
  REQUIRE(plan_decode(kv, heads(32), std::vector<std::int32_t>{0, 4}, indices, std::vector<std::int32_t>{16}, tuning,
                      small)
              .ok());
  CHECK(small.items.size() == 1);
}

TEST_CASE("a decode plan only runs on the geometry it was made for", "[cuda][plan]") {
  const PagedKvView kv = device_view(64, 16);
  DecodePlan plan;
  REQUIRE(plan_decode(kv, heads(8), std::vector<std::int32_t>{0, 1}, std::vector<std::int32_t>{3},
                      std::vector<std::int32_t>{4}, DecodeTuning{}, plan)
              .ok());
  AttentionParams p = heads(8);
  p.layer = 1;
  CHECK(check_decode_run(plan, kv, p).ok());
  CHECK(check_decode_run(plan, device_view(65, 16), p).code() == StatusCode::invalid_argument);
  CHECK(check_decode_run(plan, device_view(64, 32), p).code() == StatusCode::invalid_argument);
  CHECK(check_decode_run(plan, device_view(64, 16, 64), p).code() == StatusCode::invalid_argument);
  CHECK(check_decode_run(plan, device_view(64, 16, 128, KvDType::f16), p).code() == StatusCode::invalid_argument);
  CHECK(check_decode_run(plan, kv, heads(4)).code() == StatusCode::invalid_argument);
  CHECK(check_decode_run(plan, kv, heads(8, 5)).code() == StatusCode::invalid_argument);
  p.layer = 2;
  CHECK(check_decode_run(plan, kv, p).code() == StatusCode::invalid_argument);
}

TEST_CASE("GQA heads are blocked by powers of two up to 8", "[cuda][plan]") {
  const std::pair<std::int32_t, HeadBlocking> cases[] = {
      {1, {1, 1}}, {2, {2, 1}}, {3, {4, 1}}, {4, {4, 1}}, {5, {8, 1}}, {8, {8, 1}}, {12, {8, 2}}, {16, {8, 2}}, {17, {8, 3}}};
  for (const auto& [group, expected] : cases) {
    const HeadBlocking h = choose_head_blocking(group);
    INFO("group " << group);
    CHECK(h.heads_per_block == expected.heads_per_block);
    CHECK(h.blocks_per_kv_head == expected.blocks_per_kv_head);
    CHECK(h.heads_per_block * h.blocks_per_kv_head >= group);
    CHECK(h.heads_per_block * (h.blocks_per_kv_head - 1) < group);  // no block without a head
  }
  CHECK(page_shift(1) == 0);
  CHECK(page_shift(16) == 4);
  CHECK(page_shift(64) == 6);
  CHECK(page_shift(24) == -1);
}

TEST_CASE("prefill arguments are validated", "[cuda][plan]") {
  const PagedKvView kv = device_view(64, 16);
  const std::vector<std::int32_t> pages = {3, 9, 12};
  const AttentionParams p = heads(8);
  CHECK(validate_prefill(kv, p, 40, pages, 40).ok());
  CHECK(validate_prefill(kv, p, 1, pages, 48).ok());
  CHECK(validate_prefill(kv, p, 0, pages, 0).ok());
  CHECK(validate_prefill(kv, p, 0, {}, 0).ok());
  CHECK(validate_prefill(kv, p, 41, pages, 40).code() == StatusCode::invalid_argument);  // n_new > kv_len
  CHECK(validate_prefill(kv, p, -1, pages, 40).code() == StatusCode::invalid_argument);
  CHECK(validate_prefill(kv, p, 1, pages, 49).code() == StatusCode::invalid_argument);  // needs 4 pages
  const std::vector<std::int32_t> bad = {3, 64, 12};
  CHECK(validate_prefill(kv, p, 1, bad, 40).code() == StatusCode::invalid_argument);
  CHECK(validate_prefill(kv, p, 1, bad, 16).ok());  // only the first page is used
  CHECK(validate_prefill(kv, heads(5), 1, pages, 40).code() == StatusCode::invalid_argument);
  AttentionParams layer = p;
  layer.layer = 2;
  CHECK(validate_prefill(kv, layer, 1, pages, 40).code() == StatusCode::invalid_argument);
  const Dims grid = prefill_grid(kv, p, 40);  // 40 tokens x 4 heads per kv head = 160 rows
  CHECK(grid.x == 10u);
  CHECK(grid.y == 2u);
}

TEST_CASE("write_kv slots are validated", "[cuda][plan]") {
  const PagedKvView kv = device_view(4, 16);  // 64 slots
  CHECK(validate_write_kv(kv, 0, std::vector<std::int64_t>{0, 63, 17}).ok());
  CHECK(validate_write_kv(kv, 1, std::vector<std::int64_t>{}).ok());
  CHECK(validate_write_kv(kv, 0, std::vector<std::int64_t>{64}).code() == StatusCode::invalid_argument);
  CHECK(validate_write_kv(kv, 0, std::vector<std::int64_t>{-1}).code() == StatusCode::invalid_argument);
  CHECK(validate_write_kv(kv, 0, std::vector<std::int64_t>{5, 9, 5}).code() == StatusCode::invalid_argument);
  CHECK(validate_write_kv(kv, 2, std::vector<std::int64_t>{5}).code() == StatusCode::invalid_argument);
  PagedKvView host = kv;
  host.memory = MemoryKind::host;
  CHECK(validate_write_kv(host, 0, std::vector<std::int64_t>{5}).code() == StatusCode::unsupported);
  CHECK(validate_write_kv(device_view(4, 16, 96), 0, std::vector<std::int64_t>{5}).ok());  // any head_dim
}

TEST_CASE("page copies are validated", "[cuda][plan]") {
  const PagedKvView a = device_view(8, 16);
  PagedKvView b = a;
  b.base = static_cast<char*>(a.base) + a.page_bytes * 64;  // another pool, after a
  b.memory = MemoryKind::host;
  using V = std::vector<std::int32_t>;
  CHECK(validate_copy(b, V{0, 1, 7}, a, V{7, 7, 0}).ok());  // a source page may be read twice
  CHECK(validate_copy(b, V{}, a, V{}).ok());
  CHECK(validate_copy(b, V{0, 1}, a, V{7}).code() == StatusCode::invalid_argument);
  CHECK(validate_copy(b, V{0, 8}, a, V{1, 2}).code() == StatusCode::invalid_argument);
  CHECK(validate_copy(b, V{0, 1}, a, V{1, -2}).code() == StatusCode::invalid_argument);
  CHECK(validate_copy(b, V{3, 3}, a, V{1, 2}).code() == StatusCode::invalid_argument);  // dst twice
  CHECK(validate_copy(a, V{0, 1}, a, V{2, 3}).ok());                                     // within one pool
  CHECK(validate_copy(a, V{0, 1}, a, V{1, 2}).code() == StatusCode::invalid_argument);  // page 1 read and written
  PagedKvView overlap = a;
  overlap.base = static_cast<char*>(a.base) + a.page_bytes;  // shifted by one page
  CHECK(validate_copy(overlap, V{0}, a, V{5}).code() == StatusCode::invalid_argument);
  const PagedKvView other_layout = device_view(8, 32);
  CHECK(validate_copy(other_layout, V{0}, a, V{1}).code() == StatusCode::invalid_argument);
  CHECK(validate_copy(device_view(8, 16, 128, KvDType::f16), V{0}, a, V{1}).code() == StatusCode::invalid_argument);

  PagedKvView none = b;
  none.memory = MemoryKind::none;
  CHECK(validate_copy(none, V{0}, a, V{1}).code() == StatusCode::failed_precondition);
  float buffer[64];
  CHECK(check_no_overlap(buffer, buffer + 32, 32 * sizeof(float), "t").ok());
  CHECK(check_no_overlap(buffer, buffer + 31, 32 * sizeof(float), "t").code() == StatusCode::invalid_argument);
  CHECK(check_no_overlap(buffer, buffer, 32 * sizeof(float), "t").code() == StatusCode::invalid_argument);

  const std::vector<CopyRun> runs = coalesce_runs(V{4, 5, 6, 0, 2, 3}, V{10, 11, 12, 13, 20, 21});
  REQUIRE(runs.size() == 3);
  CHECK((runs[0].src == 10 && runs[0].dst == 4 && runs[0].count == 3));
  CHECK((runs[1].src == 13 && runs[1].dst == 0 && runs[1].count == 1));
  CHECK((runs[2].src == 20 && runs[2].dst == 2 && runs[2].count == 2));
  CHECK(copy_kernel_supports(65536));
  CHECK(!copy_kernel_supports(65536 + 8));
  const Dims grid = copy_grid(5, 40960);  // 2560 units of 16 bytes -> 3 blocks of 1024
  CHECK(grid.x == 5u);
  CHECK(grid.y == 3u);
}

TEST_CASE("software f16 and bf16 conversions round to nearest even", "[cuda][plan]") {
  using namespace clm::cuda::soft;
  CHECK(float_to_f16(1.0f) == 0x3c00);
  CHECK(float_to_f16(-2.0f) == 0xc000);
  CHECK(float_to_f16(65504.0f) == 0x7bff);
  CHECK(float_to_f16(65520.0f) == 0x7c00);          // rounds to inf
  CHECK(float_to_f16(1.0f + 1.0f / 2048) == 0x3c00);  // tie -> even
  CHECK(float_to_f16(1.0f + 3.0f / 2048) == 0x3c02);  // tie -> even (up)
  CHECK(float_to_f16(5.9604645e-8f) == 0x0001);      // smallest subnormal
  CHECK(float_to_f16(2.9802322e-8f) == 0x0000);      // half of it: tie -> 0
  CHECK(float_to_f16(6.1035156e-5f) == 0x0400);      // smallest normal
  CHECK(f16_to_float(0x0001) == 5.9604645e-8f);
  CHECK(f16_to_float(0x3555) == Approx(0.333251953125f));
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.00390625f) == 0x3f80);  // tie -> even
  CHECK(float_to_bf16(1.01171875f) == 0x3f82);  // tie -> even (up)
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  // f16 round trip of every finite value
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;
    const auto bits = static_cast<std::uint16_t>(h);
    REQUIRE(float_to_f16(f16_to_float(bits)) == bits);
  }
}
