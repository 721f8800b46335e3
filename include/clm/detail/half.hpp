// clm/detail/half.hpp: f32 <-> f16 / bf16 by bit manipulation (portable; the
// AVX2 kernels use F16C and shifts for the same conversions).
//
// f32 -> f16 and f32 -> bf16 round to nearest, ties to even. Overflow gives
// +-inf; NaN stays NaN (quiet); f16 subnormals are produced and read back.
#pragma once

#include <cstdint>
#include <cstring>

namespace clm::detail {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_f32(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // ties to even; carries into the exponent
  return static_cast<std::uint16_t>(rounded >> 16);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = float_bits(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint32_t out;
  if (u >= 0x47800000u) {  // >= 65536 (rounds to inf), inf or NaN
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below 2^-14: f16 subnormal or zero
    // Adding 0.5 aligns the f16 subnormal grid with the f32 ulp, so the FPU
    // rounds (to nearest even) for us.
    const std::uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    out = float_bits(bits_float(u) + bits_float(magic)) - magic;
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round to nearest even
    out = u >> 13;
  }
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

}  // namespace clm::detail
