// clm/io/safetensors.hpp: reading and writing .safetensors weight files.
//
// The format: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON (may
// end in padding spaces) mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} plus an optional "__metadata__" object of
// string -> string, then the byte buffer the offsets index (relative to its
// start). The header parser is our own strict parser of exactly that subset;
// every malformed file yields invalid_argument (io_error when the file cannot
// be read) with a message saying what is wrong, never a crash or a read out of
// bounds.
//
//   clm::SafetensorsFile file;
//   CLM_RETURN_IF_ERROR(clm::SafetensorsFile::open("head.safetensors", file));
//   const clm::TensorView* w = nullptr;
//   const std::int64_t shape[] = {1024, 4096};
//   CLM_RETURN_IF_ERROR(file.get("proj.weight", clm::TensorDType::f32, shape, w));
//   const float* data = reinterpret_cast<const float*>(w->bytes.data());
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm {

// Element types of safetensors tensors. Named TensorDType so as not to clash
// with KvDType. The file spells them "F64", "F32", "F16", "BF16", "I64", ...
enum class TensorDType : std::uint8_t {
  f64 = 0,
  f32 = 1,
  f16 = 2,
  bf16 = 3,
  i64 = 4,
  i32 = 5,
  i16 = 6,
  i8 = 7,
  u64 = 8,
  u32 = 9,
  u16 = 10,
  u8 = 11,
  boolean = 12,  // "BOOL", one byte per element
};

// Bytes per element.
std::size_t tensor_dtype_bytes(TensorDType dtype);
// The name the file uses ("F32", "BF16", ...).
const char* tensor_dtype_name(TensorDType dtype);
// The dtype the file name `name` stands for; nullopt when unknown.
std::optional<TensorDType> parse_tensor_dtype(std::string_view name);

// One tensor of a loaded file. `bytes` points into the file's buffer: it stays
// valid as long as the SafetensorsFile does (moves included), and is not
// aligned beyond what the file gives (files we write align each tensor to its
// element size).
struct TensorView {
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;

  std::int64_t numel() const;
};

// One tensor to write: `bytes` must hold exactly product(shape) elements of
// `dtype`, in row-major order, little-endian.
struct TensorToWrite {
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
};

// A loaded safetensors file: owns its bytes, hands out views into them.
class SafetensorsFile {
 public:
  // Header lengths above this are refused as absurd.
  static constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;  // the views point into bytes_
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Reads and validates the file at `path`. On error `out` is left unchanged.
  static Status open(const std::string& path, SafetensorsFile& out);
  // Validates `bytes` (a whole file) and takes them over.
  static Status parse(std::vector<std::byte> bytes, SafetensorsFile& out);

  // The tensor called `name`, or nullptr.
  const TensorView* find(std::string_view name) const;
  // The tensor called `name`, checked: not_found when absent, invalid_argument
  // naming the tensor and the expected and actual dtype / shape when they
  // differ. An expected extent of -1 matches any extent.
  Status get(std::string_view name, TensorDType expected_dtype,
             std::span<const std::int64_t> expected_shape, const TensorView*& out) const;

  // The tensor called `name`, which must be f32, f16 or bf16 and match
  // expected_shape (as get), converted to f32 row-major into `values`; its
  // shape into `shape` when given. NaN/Inf elements are invalid_argument
  // (weights with them are broken). On error the outputs are unchanged.
  Status get_f32(std::string_view name, std::span<const std::int64_t> expected_shape, std::vector<float>& values,
                 std::vector<std::int64_t>* shape = nullptr) const;

  // All tensors, sorted by name.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  std::size_t size() const { return tensors_.size(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Length of the JSON header (N) and of the data buffer after it.
  std::uint64_t header_bytes() const { return header_bytes_; }
  std::uint64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  std::vector<std::byte> bytes_;
  std::vector<TensorView> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
  std::uint64_t header_bytes_ = 0;
  std::uint64_t buffer_bytes_ = 0;
};

// Serializes `tensors` into the bytes of a safetensors file: header keys
// sorted ("__metadata__" first, when there is metadata), the header padded
// with spaces so the buffer starts at a multiple of 8, and the data laid out
// as the reference implementation does (by element size, largest first, then
// by name), so every tensor is aligned to its element size. invalid_argument
// on duplicate or empty names, negative extents, or a byte count that is not
// product(shape) * element size.
Status serialize_safetensors(std::span<const TensorToWrite> tensors,
                             const std::map<std::string, std::string>& metadata,
                             std::vector<std::byte>& out);

// serialize_safetensors, then writes the bytes to `path` (through a temporary
// file renamed into place). io_error when the file cannot be written.
Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace clm
