// examples/tiny_llama/cuda/llama_kernel_args.hpp: the plain arguments of the
// CUDA decoder's own kernels (llama_kernels.cuh) and their launch constants,
// shared by the device code, the host side (cuda_llama_model.cpp) and the
// CPU emulator's launches (tests/gpu/emulated_llama_launch.cpp). No CUDA
// includes.
//
//   tiny_llama::cuda_detail::RmsNormArgs args{x, weight, h, hidden, eps};
//   launch_rms_norm(Dims{rows, 1, 1}, args, stream);   // llama_launch.hpp
#pragma once

#include <cstdint>

#include "kernels/kernel_args.hpp"  // cuda/: Dims

namespace tiny_llama::cuda_detail {

using clm::cuda::detail::Dims;

inline constexpr int kRowThreads = 128;          // one block per row: embedding, RMSNorm, q/k/v split, row copies
inline constexpr int kElementwiseThreads = 256;  // SiLU(gate) * up, residual add
inline constexpr std::int64_t kElementsPerBlock = 8192;

// out[r] = table[tokens[r]], rows of `cols`.
struct EmbedArgs {
  const float* table;
  const std::int32_t* tokens;
  float* out;
  std::int32_t cols;
};

// out[r] = in[r] / sqrt(mean(in[r]^2) + eps) * weight, the mean in double
// over a fixed tree: a row's result never depends on the batch. out may be in.
struct RmsNormArgs {
  const float* in;
  const float* weight;
  float* out;
  std::int32_t cols;
  float eps;
};

// One row of the fused q/k/v projection, qkv [rows][q_heads + 2 kv_heads][head_dim]
// (q's heads, then k's, then v's), split into q [rows][q_heads][head_dim] and
// k, v [rows][kv_heads][head_dim], with rotate-half RoPE applied to q and k at
// positions[r] (cos/sin table [max_position][head_dim / 2]).
struct SplitQkvArgs {
  const float* qkv;
  const std::int32_t* positions;
  const float* cos;
  const float* sin;
  float* q;
  float* k;
  float* v;
  std::int32_t q_heads;
  std::int32_t kv_heads;
  std::int32_t head_dim;
};

// dst[dst_rows ? dst_rows[j] : j] = src[src_rows ? src_rows[j] : j], rows of
// `cols`, for j in [0, grid.x).
struct CopyRowsArgs {
  const float* src;
  const std::int32_t* src_rows;
  float* dst;
  const std::int32_t* dst_rows;
  std::int32_t cols;
};

// Elementwise over n values, block b taking [b * kElementsPerBlock, ...).
// silu_mul: out [rows][inter] = SiLU(gate) * up, from the fused projection
// gate_up [rows][2 * inter] (gate's columns, then up's); n = rows * inter.
// add: x += y.
struct SiluMulArgs {
  const float* gate_up;
  float* out;
  std::int64_t n;
  std::int32_t inter;
};
struct AddArgs {
  float* x;
  const float* y;
  std::int64_t n;
};

inline unsigned elementwise_blocks(std::int64_t n) {
  return static_cast<unsigned>((n + kElementsPerBlock - 1) / kElementsPerBlock);
}

}  // namespace tiny_llama::cuda_detail
