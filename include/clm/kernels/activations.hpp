// clm/kernels/activations.hpp: typed views of a host's activations (hidden states,
// attention outputs), row-major [rows][cols] in f32, f16 or bf16. The CLM parts
// (SRC head, snapshot projection, adapter) read and write through these, so a
// host hands over its own buffers without converting them first.
//
//   std::vector<std::uint16_t> hidden_bf16(tokens * hidden);
//   clm::ActivationView hs{hidden_bf16.data(), clm::ActDType::bf16, tokens, hidden};
//   CLM_RETURN_IF_ERROR(adapter->inject(hs, snapshot, layer));
//
// Views do not own memory; the caller keeps it alive for the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "clm/detail/half.hpp"
#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"

namespace clm {

// Activation element types are the KV element types: f32, f16, bf16.
using ActDType = KvDType;

struct ConstActivationView {
  const void* data = nullptr;
  ActDType dtype = ActDType::f32;
  std::int64_t rows = 0;
  std::int32_t cols = 0;

  static ConstActivationView f32(std::span<const float> values, std::int64_t rows, std::int32_t cols) {
    return {values.data(), ActDType::f32, rows, cols};
  }
  std::size_t elements() const { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }
  std::size_t bytes() const { return elements() * kv_dtype_bytes(dtype); }

  // Element (r, c) as f32. No bounds check.
  float at(std::int64_t r, std::int32_t c) const {
    const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c);
    switch (dtype) {
      case ActDType::f32:
        return static_cast<const float*>(data)[i];
      case ActDType::f16:
        return detail::f16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
      case ActDType::bf16:
        return detail::bf16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    }
    return 0.0f;
  }
  // Row r converted to f32 into dst[0 .. cols).
  void load_row(std::int64_t r, float* dst) const {
    for (std::int32_t c = 0; c < cols; ++c) dst[c] = at(r, c);
  }
};

struct ActivationView {
  void* data = nullptr;
  ActDType dtype = ActDType::f32;
  std::int64_t rows = 0;
  std::int32_t cols = 0;

  static ActivationView f32(std::span<float> values, std::int64_t rows, std::int32_t cols) {
    return {values.data(), ActDType::f32, rows, cols};
  }
  operator ConstActivationView() const { return {data, dtype, rows, cols}; }
  std::size_t elements() const { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }

  // Stores v at (r, c), rounded to nearest even for f16 / bf16. No bounds check.
  void store(std::int64_t r, std::int32_t c, float v) const {
    const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c);
    switch (dtype) {
      case ActDType::f32:
        static_cast<float*>(data)[i] = v;
        return;
      case ActDType::f16:
        static_cast<std::uint16_t*>(data)[i] = detail::f32_to_f16(v);
        return;
      case ActDType::bf16:
        static_cast<std::uint16_t*>(data)[i] = detail::f32_to_bf16(v);
        return;
    }
  }
};

// invalid_argument (prefixed with `what`) unless the view has a known dtype,
// rows >= 0, cols == expected_cols (when expected_cols >= 0) and data != null
// whenever it has elements.
inline Status check_activation_view(const ConstActivationView& view, std::int32_t expected_cols, const char* what) {
  if (view.dtype != ActDType::f32 && view.dtype != ActDType::f16 && view.dtype != ActDType::bf16) {
    return invalid_argument(std::string(what) + ": unknown activation dtype");
  }
  if (view.rows < 0 || view.cols < 0) return invalid_argument(std::string(what) + ": negative rows or cols");
  // rows * cols * element size must fit: elements() and bytes() would wrap.
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(view.rows), static_cast<std::size_t>(view.cols), &bytes) ||
      __builtin_mul_overflow(bytes, kv_dtype_bytes(view.dtype), &bytes) ||
      bytes > static_cast<std::size_t>(PTRDIFF_MAX)) {
    return invalid_argument(std::string(what) + ": " + std::to_string(view.rows) + " x " + std::to_string(view.cols) +
                            " elements do not fit in memory");
  }
  if (expected_cols >= 0 && view.cols != expected_cols) {
    return invalid_argument(std::string(what) + ": has " + std::to_string(view.cols) + " columns, expected " +
                            std::to_string(expected_cols));
  }
  if (view.elements() != 0 && view.data == nullptr) return invalid_argument(std::string(what) + ": data is null");
  return Status::success();
}

}  // namespace clm
