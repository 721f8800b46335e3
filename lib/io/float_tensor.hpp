// Internal to lib/: reads an F32 / F16 / BF16 safetensors tensor as f32, for
// the CLM weight readers (snapshot projection, adapter).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clm/io/safetensors.hpp"
#include "clm/status.hpp"

namespace clm::detail {

inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s.append(i ? ", " : "").append(std::to_string(shape[i]));
  return s.append("]");
}

// Tensor `name` of `file` as f32 `values` (SafetensorsFile::get_f32), its
// extents in `shape`. invalid_argument, prefixed with `what`, when it is
// absent, not F32/F16/BF16, not of rank `rank`, has a zero extent or holds a
// NaN/Inf: every bad weight file gets the same code. The outputs are written
// only on success.
inline Status load_float_tensor(const SafetensorsFile& file, std::string_view what, std::string_view name,
                                std::size_t rank, std::vector<std::int64_t>& shape, std::vector<float>& values) {
  const std::vector<std::int64_t> any_shape(rank, -1);
  std::vector<std::int64_t> got_shape;
  std::vector<float> got;
  if (Status s = file.get_f32(name, any_shape, got, &got_shape); !s.ok()) {
    return invalid_argument(std::string(what) + ": " + s.message());
  }
  for (std::int64_t d : got_shape) {
    if (d <= 0) {
      return invalid_argument(std::string(what) + ": tensor \"" + std::string(name) + "\" has shape " +
                              shape_text(got_shape) + " with an empty extent");
    }
  }
  shape = std::move(got_shape);
  values = std::move(got);
  return Status::success();
}

}  // namespace clm::detail
