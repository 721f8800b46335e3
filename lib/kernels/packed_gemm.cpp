// clm::PackedWeight and clm::gemm_nt's packed form (clm/kernels/dense_gemm.hpp): the
// packing, the portable micro-kernel, and the loop that walks the blocks.
//
// Blocking: the panels of b are taken in groups of about 256 KiB (they stay
// in L2 while every block of kPackedRowBlock rows of a runs over them); a
// block of rows stays in L1 while it runs over the panels of the group. b is
// thus read from memory once per call, in address order, which the hardware
// prefetchers follow: with few rows of a (a cached prefix's new tokens) the
// product is not held back by packing b again, as Eigen does on every call.
#include <algorithm>

#include "clm/detail/attention_cpu.hpp"
#include "packed_gemm.hpp"

namespace clm {

PackedWeight::PackedWeight(const float* b, std::int64_t n, std::int64_t k) : n_(n), k_(k) {
  data_.assign(static_cast<std::size_t>(panels() * k * kPanel), 0.0f);
  for (std::int64_t j = 0; j < n; ++j) {
    float* column = data_.data() + (j / kPanel) * k * kPanel + j % kPanel;
    for (std::int64_t i = 0; i < k; ++i) column[i * kPanel] = b[j * k + i];
  }
}

namespace detail {
namespace {

// The same sum in the same order as the AVX2 kernel (one product added per
// step of k), in plain C++.
void packed_gemm_nt_portable(const float* a, std::int64_t lda, int rows, const float* panel, std::int64_t k, float* c,
                             std::int64_t ldc, int from, int to, const float* /*prefetch*/) {
  constexpr int kPanel = static_cast<int>(PackedWeight::kPanel);
  float acc[kPackedRowBlock][kPanel] = {};
  for (std::int64_t i = 0; i < k; ++i) {
    const float* w = panel + i * kPanel;
    for (int r = 0; r < rows; ++r) {
      const float x = a[r * lda + i];
      for (int j = 0; j < kPanel; ++j) acc[r][j] += x * w[j];
    }
  }
  for (int r = 0; r < rows; ++r) std::copy(acc[r] + from, acc[r] + to, c + r * ldc + from);
}

}  // namespace
}  // namespace detail

void gemm_nt(const float* a, std::int64_t m, const PackedWeight& b, float* c, std::int64_t ldc, std::int64_t begin,
             std::int64_t end) {
  if (end < 0) end = b.n();
  const std::int64_t k = b.k(), panel_bytes = k * PackedWeight::kPanel * static_cast<std::int64_t>(sizeof(float));
  if (m <= 0 || begin >= end) return;
  const detail::PackedMicroKernel kernel =
      detail::cpu_isa() != detail::CpuIsa::scalar ? &detail::packed_gemm_nt_avx2 : &detail::packed_gemm_nt_portable;
  const std::int64_t group = std::max<std::int64_t>(1, (256 << 10) / panel_bytes);
  const std::int64_t first_panel = begin / PackedWeight::kPanel, last_panel = (end - 1) / PackedWeight::kPanel;
  // Blocks of rows as even as can be (13 rows: 5 + 4 + 4, not 6 + 6 + 1): a
  // block of 1 to 3 rows has too few accumulators to hide the FMA latency and
  // costs about what a full one does.
  const std::int64_t blocks = (m + detail::kPackedRowBlock - 1) / detail::kPackedRowBlock;
  const std::int64_t base_rows = m / blocks, longer_blocks = m % blocks;
  for (std::int64_t g = first_panel; g <= last_panel; g += group) {
    const std::int64_t g_end = std::min(last_panel + 1, g + group);
    for (std::int64_t block = 0, r = 0; block < blocks; ++block) {
      const int rows = static_cast<int>(base_rows + (block < longer_blocks ? 1 : 0));
      for (std::int64_t p = g; p < g_end; ++p) {
        const std::int64_t column = p * PackedWeight::kPanel;
        const int from = static_cast<int>(std::max<std::int64_t>(0, begin - column));
        const int to = static_cast<int>(std::min<std::int64_t>(PackedWeight::kPanel, end - column));
        // The first block of rows brings the next group's panels into L2 as
        // it goes, so that with few rows (a cached prefix's new tokens) the
        // weights' trip from memory overlaps arithmetic instead of preceding it.
        const float* next = r == 0 && p + group <= last_panel ? b.panel(p + group) : nullptr;
        kernel(a + r * k, k, rows, b.panel(p), k, c + r * ldc + column, ldc, from, to, next);
      }
      r += rows;
    }
  }
}

}  // namespace clm
