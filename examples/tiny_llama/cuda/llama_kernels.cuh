// examples/tiny_llama/cuda/llama_kernels.cuh: the device code of the CUDA
// decoder besides cuBLAS's GEMMs and the library's attention: embedding
// gather, RMSNorm, the split of the fused q/k/v rows with RoPE, row copies,
// SiLU(gate) * up, residual add. Compiled
// by nvcc in llama_kernels.cu and by the host compiler over the CPU emulator
// in tests/gpu/emulated_llama_launch.cpp, through cuda/kernels/kernel_common.cuh's
// wrappers (threadIdx, blockIdx, __syncthreads, __shared__). Every index
// used here was checked on the host (cuda_llama_model.cpp).
//
//   launch one block of kRowThreads per row: rms_norm_kernel<<<rows, kRowThreads>>>(args);
#pragma once

#include "kernels/kernel_common.cuh"
#include "llama_kernel_args.hpp"

namespace tiny_llama::cuda_detail {

using clm::cuda::detail::bid_x;
using clm::cuda::detail::block_sync;
using clm::cuda::detail::tid_x;

CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kRowThreads) embed_kernel(EmbedArgs a) {
  const std::int64_t row = bid_x();
  const float* src = a.table + std::int64_t{a.tokens[row]} * a.cols;
  float* dst = a.out + row * a.cols;
  for (int c = static_cast<int>(tid_x()); c < a.cols; c += kRowThreads) dst[c] = src[c];
}

// The sum of squares in double, each thread over a fixed stride, then a fixed
// tree in shared memory: the same order for a row in every batch.
CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kRowThreads) rms_norm_kernel(RmsNormArgs a) {
  CLM_SHARED double partial[kRowThreads];
  const std::int64_t row = bid_x();
  const int t = static_cast<int>(tid_x());
  const float* in = a.in + row * a.cols;
  float* out = a.out + row * a.cols;
  double sum = 0.0;
  for (int c = t; c < a.cols; c += kRowThreads) sum += double(in[c]) * in[c];
  partial[t] = sum;
  block_sync();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    block_sync();
  }
  const auto scale = static_cast<float>(1.0 / sqrt(partial[0] / double(a.cols) + double(a.eps)));
  for (int c = t; c < a.cols; c += kRowThreads) out[c] = in[c] * scale * a.weight[c];
}

CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kRowThreads) split_qkv_kernel(SplitQkvArgs a) {
  const std::int64_t row = bid_x();
  const int half = a.head_dim / 2;
  const float* cos = a.cos + std::int64_t{a.positions[row]} * half;
  const float* sin = a.sin + std::int64_t{a.positions[row]} * half;
  const float* in = a.qkv + row * (a.q_heads + 2 * a.kv_heads) * a.head_dim;
  float* q = a.q + row * a.q_heads * a.head_dim;
  float* k = a.k + row * a.kv_heads * a.head_dim;
  // q's and k's heads, rotated pair by pair.
  for (int j = static_cast<int>(tid_x()); j < (a.q_heads + a.kv_heads) * half; j += kRowThreads) {
    const int head = j / half, i = j % half;
    const float* x = in + head * a.head_dim;
    float* y = head < a.q_heads ? q + head * a.head_dim : k + (head - a.q_heads) * a.head_dim;
    const float x1 = x[i], x2 = x[i + half];
    y[i] = x1 * cos[i] - x2 * sin[i];
    y[i + half] = x2 * cos[i] + x1 * sin[i];
  }
  // v's, as they are.
  const float* v_in = in + (a.q_heads + a.kv_heads) * a.head_dim;
  float* v = a.v + row * a.kv_heads * a.head_dim;
  for (int c = static_cast<int>(tid_x()); c < a.kv_heads * a.head_dim; c += kRowThreads) v[c] = v_in[c];
}

CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kRowThreads) copy_rows_kernel(CopyRowsArgs a) {
  const std::int32_t j = static_cast<std::int32_t>(bid_x());
  const std::int64_t src_row = a.src_rows ? a.src_rows[j] : j;
  const std::int64_t dst_row = a.dst_rows ? a.dst_rows[j] : j;
  const float* src = a.src + src_row * a.cols;
  float* dst = a.dst + dst_row * a.cols;
  for (int c = static_cast<int>(tid_x()); c < a.cols; c += kRowThreads) dst[c] = src[c];
}

CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kElementwiseThreads) silu_mul_kernel(SiluMulArgs a) {
  const std::int64_t begin = std::int64_t{bid_x()} * kElementsPerBlock;
  const std::int64_t end = begin + kElementsPerBlock < a.n ? begin + kElementsPerBlock : a.n;
  for (std::int64_t i = begin + tid_x(); i < end; i += kElementwiseThreads) {
    const std::int64_t row = i / a.inter, col = i - row * a.inter;
    const float* gate_up = a.gate_up + row * 2 * a.inter;
    const float g = gate_up[col];
    a.out[i] = g / (1.0f + expf(-g)) * gate_up[a.inter + col];
  }
}

CLM_GLOBAL void CLM_LAUNCH_BOUNDS(kElementwiseThreads) add_kernel(AddArgs a) {
  const std::int64_t begin = std::int64_t{bid_x()} * kElementsPerBlock;
  const std::int64_t end = begin + kElementsPerBlock < a.n ? begin + kElementsPerBlock : a.n;
  for (std::int64_t i = begin + tid_x(); i < end; i += kElementwiseThreads) a.x[i] += a.y[i];
}

}  // namespace tiny_llama::cuda_detail
