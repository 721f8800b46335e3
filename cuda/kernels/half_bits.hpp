// cuda/kernels/half_bits.hpp: f16 and bf16 <-> f32 conversions in plain C++ (round to
// nearest even, as __float2half_rn / __float2bfloat16_rn). Used by the CPU
// emulation of the kernels and by the tests' references; the device code uses
// the CUDA intrinsics.
#pragma once

#include <bit>
#include <cstdint>

namespace clm::cuda::soft {

inline float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      std::uint32_t e = 113;  // 127 - 15 + 1
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t float_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 itself ties to even 0)
    const std::uint32_t e = abs >> 23;   // 102..112
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24: value = mant * 2^(e-150), unit 2^-24
    const std::uint32_t half_bits = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    std::uint32_t r = half_bits;
    if (rem > halfway || (rem == halfway && (half_bits & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
}

}  // namespace clm::cuda::soft
