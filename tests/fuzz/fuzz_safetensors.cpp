// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target for our strict
// .safetensors reader (clm::SafetensorsFile::parse, clm/io/safetensors.hpp) on
// arbitrary bytes: the 8-byte header length, the JSON header and the buffer.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_safetensors tests/fuzz/corpus/safetensors
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//
// Checks: no crash, leak or read outside the file (ASan, UBSan); a refusal is
// invalid_argument with a message and leaves the output file as it was; an
// accepted file's tensors lie inside the buffer, hold exactly numel x element
// bytes, are found by name, and convert to f32 (get_f32) or are refused with a
// message; and writing the parsed tensors and metadata with our writer
// (serialize_safetensors) and parsing that again gives the same tensors and
// metadata (names, dtypes, shapes, bytes), so reader and writer agree on
// every name the reader accepts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "clm/io/safetensors.hpp"
#include "fuzz/fuzz_support.hpp"

namespace {

void check_same(const clm::SafetensorsFile& a, const clm::SafetensorsFile& b) {
  FUZZ_CHECK(a.size() == b.size(), "{} tensors became {}", a.size(), b.size());
  FUZZ_CHECK(a.metadata() == b.metadata(), "metadata changed in the round trip");
  for (std::size_t i = 0; i < a.size(); ++i) {
    const clm::TensorView& x = a.tensors()[i];
    const clm::TensorView& y = b.tensors()[i];
    FUZZ_CHECK(x.name == y.name && x.dtype == y.dtype && x.shape == y.shape, "tensor '{}' changed in the round trip",
               x.name);
    FUZZ_CHECK(x.bytes.size() == y.bytes.size() &&
                   (x.bytes.empty() || std::memcmp(x.bytes.data(), y.bytes.data(), x.bytes.size()) == 0),
               "tensor '{}': bytes changed in the round trip", x.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size != 0) std::memcpy(bytes.data(), data, size);
  const std::byte* const begin = bytes.data();  // parse takes the vector over: its buffer stays put

  // A file parsed before, to see that a refusal leaves it alone.
  clm::SafetensorsFile file;
  const std::int64_t marker_shape[] = {1};
  const float marker = 7.0f;
  const clm::TensorToWrite marker_tensor{
      "marker", clm::TensorDType::f32, {1}, {reinterpret_cast<const std::byte*>(&marker), sizeof marker}};
  std::vector<std::byte> marker_bytes;
  FUZZ_CHECK(clm::serialize_safetensors({&marker_tensor, 1}, {}, marker_bytes).ok(), "cannot write the marker");
  FUZZ_CHECK(clm::SafetensorsFile::parse(std::move(marker_bytes), file).ok(), "cannot read the marker");

  const clm::Status s = clm::SafetensorsFile::parse(std::move(bytes), file);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "refused with {}: '{}'",
               s.code_name(), s.message());
    const clm::TensorView* kept = nullptr;
    FUZZ_CHECK(file.size() == 1 && file.get("marker", clm::TensorDType::f32, marker_shape, kept).ok(),
               "a refused file changed the output");
    return 0;
  }

  FUZZ_CHECK(file.header_bytes() + 8 + file.buffer_bytes() == size, "header {} + buffer {} != {} bytes",
             file.header_bytes(), file.buffer_bytes(), size);
  const std::byte* const buffer = begin + 8 + file.header_bytes();
  std::vector<clm::TensorToWrite> to_write;
  for (const clm::TensorView& t : file.tensors()) {
    FUZZ_CHECK(t.numel() >= 0, "tensor '{}': numel {}", t.name, t.numel());
    FUZZ_CHECK(static_cast<std::uint64_t>(t.numel()) * clm::tensor_dtype_bytes(t.dtype) == t.bytes.size(),
               "tensor '{}': {} bytes for {} elements", t.name, t.bytes.size(), t.numel());
    FUZZ_CHECK(t.bytes.empty() || (t.bytes.data() >= buffer && t.bytes.data() + t.bytes.size() <= begin + size),
               "tensor '{}' outside the buffer", t.name);
    FUZZ_CHECK(file.find(t.name) == &t, "find('{}') does not find it", t.name);
    std::vector<float> values;
    std::vector<std::int64_t> shape;
    const clm::Status f = file.get_f32(t.name, t.shape, values, &shape);
    if (f.ok()) {
      FUZZ_CHECK(values.size() == static_cast<std::size_t>(t.numel()) && shape == t.shape, "get_f32('{}') size",
                 t.name);
      for (float v : values) FUZZ_CHECK(std::isfinite(v), "get_f32('{}') gave {}", t.name, v);
    } else {
      FUZZ_CHECK(f.code() == clm::StatusCode::invalid_argument && !f.message().empty(), "get_f32: {} '{}'",
                 f.code_name(), f.message());
    }
    to_write.push_back({t.name, t.dtype, t.shape, t.bytes});
  }

  std::vector<std::byte> written;
  const clm::Status w = clm::serialize_safetensors(to_write, file.metadata(), written);
  FUZZ_CHECK(w.ok(), "the writer refuses what the reader accepted: {}", w.message());
  clm::SafetensorsFile again;
  const clm::Status r = clm::SafetensorsFile::parse(std::move(written), again);
  FUZZ_CHECK(r.ok(), "the reader refuses what the writer wrote: {}", r.message());
  check_same(file, again);
  return 0;
}
