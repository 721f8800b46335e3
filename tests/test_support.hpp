// tests/test_support.hpp: small helpers the core tests share: a fresh seed per
// run (printed by each test on failure) and random prompts (test_random.hpp,
// which the C ABI's tests and the benches include on its own), f32 -> f16 /
// bf16 rounding, and safetensors files built byte by byte (the JSON header
// written here, never by the library's own writer, so the reader is tested
// against independent bytes).
//
//   const uint32_t seed = clm_test::fresh_seed();
//   INFO("seed " << seed);
//   const auto bytes = clm_test::safetensors_bytes({{"w", "F32", {2, 2}, clm_test::raw_bytes(values)}});
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "clm/detail/attention_cpu.hpp"
#include "clm/detail/half.hpp"
#include "clm/kernels/activations.hpp"
#include "test_random.hpp"

// Whether this program runs under AddressSanitizer (GCC defines the first
// macro, clang answers __has_feature), for tests that shrink or skip there.
#if defined(__SANITIZE_ADDRESS__)
#define CLM_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CLM_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef CLM_TEST_UNDER_ASAN
#define CLM_TEST_UNDER_ASAN 0
#endif

namespace clm_test {

inline constexpr bool kUnderAsan = CLM_TEST_UNDER_ASAN != 0;

// The CPU kernel ISAs this machine runs (scalar, then AVX2 and AVX-512 where
// present), for tests that run every kernel on each (clm::detail::set_cpu_isa).
inline std::vector<clm::detail::CpuIsa> cpu_isas() {
  std::vector<clm::detail::CpuIsa> out;
  for (auto isa : {clm::detail::CpuIsa::scalar, clm::detail::CpuIsa::avx2, clm::detail::CpuIsa::avx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(clm::detail::cpu_isa_best())) out.push_back(isa);
  }
  return out;
}

// Each value rounded to nearest even in `dtype` (f16 or bf16), as bits.
inline std::vector<std::uint16_t> to_half(const std::vector<float>& values, clm::ActDType dtype) {
  std::vector<std::uint16_t> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    out[i] = dtype == clm::ActDType::f16 ? clm::detail::f32_to_f16(values[i]) : clm::detail::f32_to_bf16(values[i]);
  }
  return out;
}

// The bytes of `values` as they lie in memory (little-endian here).
template <typename T>
std::vector<std::byte> raw_bytes(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A safetensors file from its parts: the 8-byte little-endian header length,
// `json` as given (malformed on purpose, if the test wants), then `data`.
inline std::vector<std::byte> file_bytes(const std::string& json, const std::vector<std::byte>& data = {}) {
  std::vector<std::byte> out;
  const auto n = static_cast<std::uint64_t>(json.size());
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<std::byte>((n >> (8 * k)) & 0xFF));
  for (char c : json) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// One tensor of a hand-built file: dtype as the file spells it ("F32", "BF16", ...).
struct RawTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

// A well-formed file holding `tensors` back to back, in the given order.
inline std::vector<std::byte> safetensors_bytes(const std::vector<RawTensor>& tensors) {
  std::string json = "{";
  std::vector<std::byte> data;
  for (const RawTensor& t : tensors) {
    if (json.size() > 1) json += ",";
    json.append("\"").append(t.name).append("\":{\"dtype\":\"").append(t.dtype).append("\",\"shape\":[");
    for (std::size_t i = 0; i < t.shape.size(); ++i) json.append(i ? "," : "").append(std::to_string(t.shape[i]));
    json.append("],\"data_offsets\":[").append(std::to_string(data.size())).append(",");
    json.append(std::to_string(data.size() + t.bytes.size())).append("]}");
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  json += "}";
  return file_bytes(json, data);
}

}  // namespace clm_test
