// cuda/kernels/kernel_common.cuh: what the kernels use from CUDA, behind small
// wrappers, so that the same kernel source compiles with nvcc (for the GPU)
// and with a plain C++ compiler over tests/gpu/cuda_emu.hpp (a CPU emulator
// that runs every thread of a block as a fiber, for the tests).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_args.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CLM_DEVICE __device__ __forceinline__
#define CLM_GLOBAL __global__
#define CLM_SHARED __shared__
#define CLM_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#define CLM_UNROLL _Pragma("unroll")

namespace clm::cuda::detail {
using U4 = uint4;
CLM_DEVICE unsigned tid_x() { return threadIdx.x; }
CLM_DEVICE unsigned bid_x() { return blockIdx.x; }
CLM_DEVICE unsigned bid_y() { return blockIdx.y; }
CLM_DEVICE void block_sync() { __syncthreads(); }
CLM_DEVICE float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
CLM_DEVICE float shfl_idx(float v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }
// Read-only 16-byte load (the pool is not written while a kernel reads it).
CLM_DEVICE U4 load16_ro(const unsigned char* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
CLM_DEVICE U4 load16(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
CLM_DEVICE void store16(unsigned char* p, U4 v) { *reinterpret_cast<uint4*>(p) = v; }
CLM_DEVICE float as_float(std::uint32_t u) { return __uint_as_float(u); }
CLM_DEVICE float2 f16x2_to_float2(std::uint32_t u) {
  return __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(u & 0xffffu)),
                                       __ushort_as_half(static_cast<unsigned short>(u >> 16))));
}
CLM_DEVICE void store_f32(unsigned char* row, int e, float x) { reinterpret_cast<float*>(row)[e] = x; }
CLM_DEVICE void store_u16(unsigned char* row, int e, std::uint16_t x) {
  reinterpret_cast<std::uint16_t*>(row)[e] = x;
}
CLM_DEVICE std::uint16_t float_to_f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
CLM_DEVICE std::uint16_t float_to_bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
}  // namespace clm::cuda::detail

#else  // CPU emulation

#ifndef CLM_CUDA_EMULATION
#error "kernel_common.cuh: compile with nvcc, or include tests/gpu/cuda_emu.hpp first"
#endif
#include <bit>

#include "half_bits.hpp"

#define CLM_DEVICE inline
#define CLM_GLOBAL
#define CLM_SHARED static
#define CLM_LAUNCH_BOUNDS(threads)
#define CLM_UNROLL

namespace clm::cuda::detail {
struct U4 {
  std::uint32_t x, y, z, w;
};
struct float2 {
  float x, y;
};
inline unsigned tid_x() { return ::clm_emu::thread_x(); }
inline unsigned bid_x() { return ::clm_emu::block_x(); }
inline unsigned bid_y() { return ::clm_emu::block_y(); }
inline void block_sync() { ::clm_emu::sync_block(); }
inline float shfl_xor(float v, int lane_mask) { return ::clm_emu::shfl_xor(v, lane_mask); }
inline float shfl_idx(float v, int src_lane) { return ::clm_emu::shfl_idx(v, src_lane); }
inline U4 load16(const unsigned char* p) {
  ::clm_emu::check_aligned(p, 16);
  U4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline U4 load16_ro(const unsigned char* p) { return load16(p); }
inline void store16(unsigned char* p, U4 v) {
  ::clm_emu::check_aligned(p, 16);
  std::memcpy(p, &v, sizeof(v));
}
inline float as_float(std::uint32_t u) { return std::bit_cast<float>(u); }
inline float2 f16x2_to_float2(std::uint32_t u) {
  return {soft::f16_to_float(static_cast<std::uint16_t>(u & 0xffffu)), soft::f16_to_float(static_cast<std::uint16_t>(u >> 16))};
}
inline std::uint16_t float_to_f16_bits(float x) { return soft::float_to_f16(x); }
inline void store_f32(unsigned char* row, int e, float x) {
  ::clm_emu::check_aligned(row + 4 * e, 4);
  std::memcpy(row + 4 * e, &x, sizeof(x));
}
inline void store_u16(unsigned char* row, int e, std::uint16_t x) {
  ::clm_emu::check_aligned(row + 2 * e, 2);
  std::memcpy(row + 2 * e, &x, sizeof(x));
}
inline std::uint16_t float_to_bf16_bits(float x) { return soft::float_to_bf16(x); }
}  // namespace clm::cuda::detail
#endif

namespace clm::cuda::detail {

CLM_DEVICE int imin(int a, int b) { return a < b ? a : b; }
CLM_DEVICE int imax(int a, int b) { return a > b ? a : b; }

// Element-type tags. kVec elements fill one 16-byte load.
struct KvF32 {
  static constexpr int kBytes = 4;
  static constexpr int kVec = 4;
};
struct KvF16 {
  static constexpr int kBytes = 2;
  static constexpr int kVec = 8;
};
struct KvBF16 {
  static constexpr int kBytes = 2;
  static constexpr int kVec = 8;
};

// 16 loaded bytes -> kVec floats (exact for all three types).
CLM_DEVICE void unpack(KvF32, const U4& u, float* f) {
  f[0] = as_float(u.x);
  f[1] = as_float(u.y);
  f[2] = as_float(u.z);
  f[3] = as_float(u.w);
}
CLM_DEVICE void unpack_bf16x2(std::uint32_t w, float* f) {
  f[0] = as_float(w << 16);           // element 0 is the low half (little endian)
  f[1] = as_float(w & 0xffff0000u);
}
CLM_DEVICE void unpack(KvBF16, const U4& u, float* f) {
  unpack_bf16x2(u.x, f);
  unpack_bf16x2(u.y, f + 2);
  unpack_bf16x2(u.z, f + 4);
  unpack_bf16x2(u.w, f + 6);
}
CLM_DEVICE void unpack_f16x2(std::uint32_t w, float* f) {
  const float2 p = f16x2_to_float2(w);
  f[0] = p.x;
  f[1] = p.y;
}
CLM_DEVICE void unpack(KvF16, const U4& u, float* f) {
  unpack_f16x2(u.x, f);
  unpack_f16x2(u.y, f + 2);
  unpack_f16x2(u.z, f + 4);
  unpack_f16x2(u.w, f + 6);
}

// Stores element e of a row, converting from f32 (round to nearest even).
CLM_DEVICE void store_elem(KvF32, unsigned char* row, int e, float x) { store_f32(row, e, x); }
CLM_DEVICE void store_elem(KvF16, unsigned char* row, int e, float x) { store_u16(row, e, float_to_f16_bits(x)); }
CLM_DEVICE void store_elem(KvBF16, unsigned char* row, int e, float x) { store_u16(row, e, float_to_bf16_bits(x)); }

}  // namespace clm::cuda::detail
