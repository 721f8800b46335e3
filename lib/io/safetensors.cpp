// The safetensors reader and writer of clm/io/safetensors.hpp, with a strict
// parser of the header's JSON subset (no JSON library).
#include "clm/io/safetensors.hpp"

#include <fmt/format.h>

#include "clm/detail/half.hpp"
#include "clm/detail/json_string.hpp"
#include "clm/detail/utf8.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace clm {

namespace {

struct DTypeInfo {
  TensorDType dtype;
  const char* name;
  std::size_t bytes;
};

constexpr DTypeInfo kDTypes[] = {
    {TensorDType::f64, "F64", 8},      {TensorDType::f32, "F32", 4}, {TensorDType::f16, "F16", 2},
    {TensorDType::bf16, "BF16", 2},    {TensorDType::i64, "I64", 8}, {TensorDType::i32, "I32", 4},
    {TensorDType::i16, "I16", 2},      {TensorDType::i8, "I8", 1},   {TensorDType::u64, "U64", 8},
    {TensorDType::u32, "U32", 4},      {TensorDType::u16, "U16", 2}, {TensorDType::u8, "U8", 1},
    {TensorDType::boolean, "BOOL", 1},
};

constexpr std::string_view kMetadataKey = "__metadata__";

std::string shape_string(std::span<const std::int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Product of the extents times `elem`, or nullopt when an extent is negative
// or the product overflows int64.
std::optional<std::uint64_t> checked_nbytes(std::span<const std::int64_t> shape, std::size_t elem, std::string& why) {
  std::uint64_t n = 1;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::int64_t d : shape) {
    if (d < 0) {
      why = fmt::format("negative extent {}", d);
      return std::nullopt;
    }
    std::uint64_t next = 0;
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &next) || next > kMax) {
      why = "element count overflows";
      return std::nullopt;
    }
    n = next;
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(elem), &bytes) || bytes > kMax) {
    why = "byte count overflows";
    return std::nullopt;
  }
  return bytes;
}

// Checks that `s` is well-formed UTF-8 (no overlong forms, no surrogates, at
// most U+10FFFF). Returns the offset of the first bad byte, or npos.
std::size_t find_bad_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = detail::utf8_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

struct RawTensor {
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// A strict recursive-descent parser of the header subset. Every method returns
// a Status; the nesting is fixed (at most three levels), so input cannot make
// it recurse deeply.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  Status parse(std::vector<RawTensor>& tensors, std::map<std::string, std::string>& metadata) {
    skip_ws();
    CLM_RETURN_IF_ERROR(expect('{', "the header"));
    skip_ws();
    bool seen_metadata = false;
    std::map<std::string, bool, std::less<>> names;
    if (!consume('}')) {
      while (true) {
        skip_ws();
        std::string key;
        CLM_RETURN_IF_ERROR(parse_string(key, "a header key"));
        skip_ws();
        CLM_RETURN_IF_ERROR(expect(':', fmt::format("after key \"{}\"", key)));
        skip_ws();
        if (key == kMetadataKey) {
          if (seen_metadata) return error("duplicate \"__metadata__\"");
          seen_metadata = true;
          CLM_RETURN_IF_ERROR(parse_metadata(metadata));
        } else {
          if (key.empty()) return error("empty tensor name");
          if (!names.emplace(key, true).second) return error(fmt::format("duplicate tensor name \"{}\"", key));
          RawTensor t;
          t.name = std::move(key);
          CLM_RETURN_IF_ERROR(parse_tensor(t));
          tensors.push_back(std::move(t));
        }
        skip_ws();
        if (consume(',')) continue;
        CLM_RETURN_IF_ERROR(expect('}', "to close the header (or ',')"));
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size()) return error("trailing characters after the header object");
    return Status::success();
  }

 private:
  Status error(std::string_view what) const {
    return invalid_argument(fmt::format("safetensors: malformed header at byte {}: {}", pos_, what));
  }

  void skip_ws() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Status expect(char c, std::string_view where) {
    if (consume(c)) return Status::success();
    if (pos_ >= text_.size()) return error(fmt::format("expected '{}' {}, found the end of the header", c, where));
    return error(fmt::format("expected '{}' {}, found '{}'", c, where, printable(text_[pos_])));
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) return std::string(1, c);
    return fmt::format("\\x{:02x}", u);
  }

  Status parse_hex4(std::uint32_t& out) {
    if (text_.size() - pos_ < 4) return error("truncated \\u escape");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_++];
      std::uint32_t v = 0;
      if (c >= '0' && c <= '9') {
        v = static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v = static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v = static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        return error("bad hex digit in \\u escape");
      }
      out = (out << 4) | v;
    }
    return Status::success();
  }

  Status parse_string(std::string& out, std::string_view what) {
    if (!consume('"')) {
      if (pos_ >= text_.size()) return error(fmt::format("expected {} (a string), found the end of the header", what));
      return error(fmt::format("expected {} (a string), found '{}'", what, printable(text_[pos_])));
    }
    out.clear();
    while (true) {
      if (pos_ >= text_.size()) return error("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return Status::success();
      if (static_cast<unsigned char>(c) < 0x20) return error("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          std::uint32_t cp = 0;
          CLM_RETURN_IF_ERROR(parse_hex4(cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return error("lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!(consume('\\') && consume('u'))) return error("lone high surrogate in \\u escape");
            std::uint32_t lo = 0;
            CLM_RETURN_IF_ERROR(parse_hex4(lo));
            if (lo < 0xDC00 || lo > 0xDFFF) return error("bad low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          detail::append_utf8(out, cp);
          break;
        }
        default:
          return error(fmt::format("bad escape '\\{}'", printable(e)));
      }
    }
  }

  // A non-negative integer, at most INT64_MAX, in JSON form (no leading zeros,
  // no sign, no fraction or exponent).
  Status parse_uint(std::uint64_t& out, std::string_view what) {
    if (pos_ < text_.size() && text_[pos_] == '-') return error(fmt::format("{} is negative", what));
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9')
      return error(fmt::format("expected {} (a non-negative integer)", what));
    if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
      return error(fmt::format("{} has a leading zero", what));
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    out = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto d = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (out > (kMax - d) / 10) return error(fmt::format("{} is too large", what));
      out = out * 10 + d;
      ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      return error(fmt::format("{} is not an integer", what));
    return Status::success();
  }

  // '[' int (',' int)* ']' or '[' ']'.
  Status parse_uint_array(std::vector<std::uint64_t>& out, std::string_view what) {
    CLM_RETURN_IF_ERROR(expect('[', fmt::format("to open {}", what)));
    skip_ws();
    out.clear();
    if (consume(']')) return Status::success();
    while (true) {
      skip_ws();
      std::uint64_t v = 0;
      CLM_RETURN_IF_ERROR(parse_uint(v, fmt::format("an element of {}", what)));
      out.push_back(v);
      skip_ws();
      if (consume(',')) continue;
      return expect(']', fmt::format("to close {}", what));
    }
  }

  Status parse_tensor(RawTensor& t) {
    CLM_RETURN_IF_ERROR(expect('{', fmt::format("to open the entry of tensor \"{}\"", t.name)));
    bool have_dtype = false, have_shape = false, have_offsets = false;
    skip_ws();
    if (!consume('}')) {
      while (true) {
        skip_ws();
        std::string key;
        CLM_RETURN_IF_ERROR(parse_string(key, "a tensor field name"));
        skip_ws();
        CLM_RETURN_IF_ERROR(expect(':', fmt::format("after field \"{}\"", key)));
        skip_ws();
        if (key == "dtype") {
          if (have_dtype) return error(fmt::format("tensor \"{}\": duplicate \"dtype\"", t.name));
          have_dtype = true;
          std::string name;
          CLM_RETURN_IF_ERROR(parse_string(name, "the dtype"));
          const auto dtype = parse_tensor_dtype(name);
          if (!dtype) return error(fmt::format("tensor \"{}\": unknown dtype \"{}\"", t.name, name));
          t.dtype = *dtype;
        } else if (key == "shape") {
          if (have_shape) return error(fmt::format("tensor \"{}\": duplicate \"shape\"", t.name));
          have_shape = true;
          std::vector<std::uint64_t> dims;
          CLM_RETURN_IF_ERROR(parse_uint_array(dims, fmt::format("the shape of \"{}\"", t.name)));
          t.shape.clear();
          for (std::uint64_t d : dims) t.shape.push_back(static_cast<std::int64_t>(d));
        } else if (key == "data_offsets") {
          if (have_offsets) return error(fmt::format("tensor \"{}\": duplicate \"data_offsets\"", t.name));
          have_offsets = true;
          std::vector<std::uint64_t> offsets;
          CLM_RETURN_IF_ERROR(parse_uint_array(offsets, fmt::format("the data_offsets of \"{}\"", t.name)));
          if (offsets.size() != 2)
            return error(fmt::format("tensor \"{}\": data_offsets has {} elements, not 2", t.name, offsets.size()));
          t.begin = offsets[0];
          t.end = offsets[1];
        } else {
          return error(fmt::format("tensor \"{}\": unknown field \"{}\"", t.name, key));
        }
        skip_ws();
        if (consume(',')) continue;
        CLM_RETURN_IF_ERROR(expect('}', fmt::format("to close the entry of \"{}\"", t.name)));
        break;
      }
    }
    if (!have_dtype) return error(fmt::format("tensor \"{}\" has no \"dtype\"", t.name));
    if (!have_shape) return error(fmt::format("tensor \"{}\" has no \"shape\"", t.name));
    if (!have_offsets) return error(fmt::format("tensor \"{}\" has no \"data_offsets\"", t.name));
    return Status::success();
  }

  Status parse_metadata(std::map<std::string, std::string>& metadata) {
    CLM_RETURN_IF_ERROR(expect('{', "to open \"__metadata__\" (an object of strings)"));
    skip_ws();
    if (consume('}')) return Status::success();
    while (true) {
      skip_ws();
      std::string key, value;
      CLM_RETURN_IF_ERROR(parse_string(key, "a metadata key"));
      skip_ws();
      CLM_RETURN_IF_ERROR(expect(':', fmt::format("after metadata key \"{}\"", key)));
      skip_ws();
      CLM_RETURN_IF_ERROR(parse_string(value, fmt::format("the value of metadata \"{}\"", key)));
      if (!metadata.emplace(std::move(key), std::move(value)).second) return error("duplicate metadata key");
      skip_ws();
      if (consume(',')) continue;
      return expect('}', "to close \"__metadata__\"");
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

std::size_t tensor_dtype_bytes(TensorDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.bytes;
  return 0;
}

const char* tensor_dtype_name(TensorDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "unknown";
}

std::optional<TensorDType> parse_tensor_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

Status SafetensorsFile::parse(std::vector<std::byte> bytes, SafetensorsFile& out) {
  const std::size_t size = bytes.size();
  if (size < 8)
    return invalid_argument(fmt::format("safetensors: file is {} bytes, too short for the 8-byte header length", size));
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(k)]);
  if (n > kMaxHeaderBytes)
    return invalid_argument(
        fmt::format("safetensors: header length {} is absurd (more than {} bytes)", n, kMaxHeaderBytes));
  if (n > size - 8)
    return invalid_argument(
        fmt::format("safetensors: header length {} is larger than the {} bytes after the length", n, size - 8));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  if (const std::size_t bad = find_bad_utf8(text); bad != std::string_view::npos)
    return invalid_argument(fmt::format("safetensors: header is not UTF-8 (byte {})", bad));

  std::vector<RawTensor> raw;
  std::map<std::string, std::string> metadata;
  CLM_RETURN_IF_ERROR(HeaderParser(text).parse(raw, metadata));

  const std::size_t buffer_start = 8 + static_cast<std::size_t>(n);
  const std::uint64_t buffer_size = size - buffer_start;
  for (const RawTensor& t : raw) {
    std::string why;
    const auto nbytes = checked_nbytes(t.shape, tensor_dtype_bytes(t.dtype), why);
    if (!nbytes)
      return invalid_argument(
          fmt::format("safetensors: tensor \"{}\" shape {}: {}", t.name, shape_string(t.shape), why));
    if (t.end < t.begin)
      return invalid_argument(
          fmt::format("safetensors: tensor \"{}\": data_offsets [{}, {}] end before begin", t.name, t.begin, t.end));
    if (t.end > buffer_size)
      return invalid_argument(
          fmt::format("safetensors: tensor \"{}\": data_offsets [{}, {}] past the end of the {}-byte buffer", t.name,
                      t.begin, t.end, buffer_size));
    if (t.end - t.begin != *nbytes)
      return invalid_argument(
          fmt::format("safetensors: tensor \"{}\": data_offsets [{}, {}] span {} bytes, but {} {} needs {}", t.name,
                      t.begin, t.end, t.end - t.begin, tensor_dtype_name(t.dtype), shape_string(t.shape), *nbytes));
  }
  // Overlaps: in order of begin, each non-empty tensor must start at or after
  // the end of every earlier one.
  std::vector<const RawTensor*> by_offset;
  for (const RawTensor& t : raw)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const RawTensor* a, const RawTensor* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const RawTensor& a = *by_offset[i - 1];
    const RawTensor& b = *by_offset[i];
    if (b.begin < a.end)
      return invalid_argument(fmt::format("safetensors: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap", a.name,
                                          a.begin, a.end, b.name, b.begin, b.end));
  }

  SafetensorsFile file;
  file.bytes_ = std::move(bytes);
  file.metadata_ = std::move(metadata);
  file.header_bytes_ = n;
  file.buffer_bytes_ = buffer_size;
  const std::byte* buffer = file.bytes_.data() + buffer_start;
  file.tensors_.reserve(raw.size());
  for (RawTensor& t : raw) {
    TensorView v;
    v.name = std::move(t.name);
    v.dtype = t.dtype;
    v.shape = std::move(t.shape);
    v.bytes = std::span<const std::byte>(buffer + t.begin, static_cast<std::size_t>(t.end - t.begin));
    file.tensors_.push_back(std::move(v));
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  out = std::move(file);
  return Status::success();
}

Status SafetensorsFile::open(const std::string& path, SafetensorsFile& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return {StatusCode::io_error, fmt::format("safetensors: cannot open \"{}\": {}", path, std::strerror(errno))};
  std::vector<std::byte> bytes;
  std::byte chunk[1 << 16];
  while (true) {
    const std::size_t got = std::fread(chunk, 1, sizeof chunk, f);
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (got < sizeof chunk) break;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return {StatusCode::io_error, fmt::format("safetensors: cannot read \"{}\"", path)};
  Status s = parse(std::move(bytes), out);
  if (!s.ok()) return {s.code(), fmt::format("{} (in \"{}\")", s.message(), path)};
  return s;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const TensorView& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

Status SafetensorsFile::get(std::string_view name, TensorDType expected_dtype,
                            std::span<const std::int64_t> expected_shape, const TensorView*& out) const {
  const TensorView* t = find(name);
  if (t == nullptr) return not_found(fmt::format("safetensors: no tensor \"{}\"", name));
  if (t->dtype != expected_dtype)
    return invalid_argument(fmt::format("safetensors: tensor \"{}\": expected dtype {}, got {}", name,
                                        tensor_dtype_name(expected_dtype), tensor_dtype_name(t->dtype)));
  bool match = expected_shape.size() == t->shape.size();
  for (std::size_t i = 0; match && i < expected_shape.size(); ++i)
    match = expected_shape[i] == -1 || expected_shape[i] == t->shape[i];
  if (!match)
    return invalid_argument(fmt::format("safetensors: tensor \"{}\": expected shape {}, got {}", name,
                                        shape_string(expected_shape), shape_string(t->shape)));
  out = t;
  return Status::success();
}

Status SafetensorsFile::get_f32(std::string_view name, std::span<const std::int64_t> expected_shape,
                                std::vector<float>& values, std::vector<std::int64_t>* shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) return not_found(fmt::format("safetensors: no tensor \"{}\"", name));
  if (t->dtype != TensorDType::f32 && t->dtype != TensorDType::f16 && t->dtype != TensorDType::bf16)
    return invalid_argument(fmt::format("safetensors: tensor \"{}\": expected dtype F32, F16 or BF16, got {}", name,
                                        tensor_dtype_name(t->dtype)));
  CLM_RETURN_IF_ERROR(get(name, t->dtype, expected_shape, t));
  const auto n = static_cast<std::size_t>(t->numel());
  std::vector<float> converted(n);
  const std::byte* src = t->bytes.data();
  for (std::size_t i = 0; i < n; ++i) {
    float v;
    if (t->dtype == TensorDType::f32) {
      std::memcpy(&v, src + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      v = t->dtype == TensorDType::f16 ? detail::f16_to_f32(h) : detail::bf16_to_f32(h);
    }
    if (!std::isfinite(v))
      return invalid_argument(fmt::format("safetensors: tensor \"{}\" holds a NaN or Inf at element {}", name, i));
    converted[i] = v;
  }
  values = std::move(converted);
  if (shape) *shape = t->shape;
  return Status::success();
}

Status serialize_safetensors(std::span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata,
                             std::vector<std::byte>& out) {
  std::vector<const TensorToWrite*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty()) return invalid_argument("safetensors: a tensor has an empty name");
    if (t.name == kMetadataKey) return invalid_argument("safetensors: a tensor may not be called \"__metadata__\"");
    const std::size_t elem = tensor_dtype_bytes(t.dtype);
    if (elem == 0) return invalid_argument(fmt::format("safetensors: tensor \"{}\": bad dtype", t.name));
    std::string why;
    const auto nbytes = checked_nbytes(t.shape, elem, why);
    if (!nbytes)
      return invalid_argument(
          fmt::format("safetensors: tensor \"{}\" shape {}: {}", t.name, shape_string(t.shape), why));
    if (*nbytes != t.bytes.size())
      return invalid_argument(fmt::format("safetensors: tensor \"{}\": {} bytes given, but {} {} needs {}", t.name,
                                          t.bytes.size(), tensor_dtype_name(t.dtype), shape_string(t.shape), *nbytes));
    sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->name == sorted[i - 1]->name)
      return invalid_argument(fmt::format("safetensors: duplicate tensor name \"{}\"", sorted[i]->name));

  // Data layout: largest element size first, then by name.
  std::vector<const TensorToWrite*> layout = sorted;
  std::stable_sort(layout.begin(), layout.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return tensor_dtype_bytes(a->dtype) > tensor_dtype_bytes(b->dtype);
  });
  std::map<const TensorToWrite*, std::pair<std::size_t, std::size_t>> offsets;
  std::size_t offset = 0;
  for (const TensorToWrite* t : layout) {
    offsets[t] = {offset, offset + t->bytes.size()};
    offset += t->bytes.size();
  }

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_kv = true;
    for (const auto& [k, v] : metadata) {
      if (!first_kv) header.push_back(',');
      first_kv = false;
      detail::append_json_string(header, k);
      header.push_back(':');
      detail::append_json_string(header, v);
    }
    header.push_back('}');
    first = false;
  }
  for (const TensorToWrite* t : sorted) {
    if (!first) header.push_back(',');
    first = false;
    detail::append_json_string(header, t->name);
    const auto [b, e] = offsets[t];
    header += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", tensor_dtype_name(t->dtype),
                          fmt::join(t->shape, ","), b, e);
  }
  header.push_back('}');
  if (const std::size_t bad = find_bad_utf8(header); bad != std::string_view::npos)
    return invalid_argument("safetensors: a tensor name or metadata string is not UTF-8");
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  if (header.size() > SafetensorsFile::kMaxHeaderBytes)
    return invalid_argument("safetensors: header would exceed 100 MB");

  out.clear();
  out.reserve(8 + header.size() + offset);
  const auto n = static_cast<std::uint64_t>(header.size());
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<std::byte>((n >> (8 * k)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (const TensorToWrite* t : layout) out.insert(out.end(), t->bytes.begin(), t->bytes.end());
  return Status::success();
}

Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<std::byte> bytes;
  CLM_RETURN_IF_ERROR(serialize_safetensors(tensors, metadata, bytes));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    return {StatusCode::io_error, fmt::format("safetensors: cannot create \"{}\": {}", tmp, std::strerror(errno))};
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed) {
    std::remove(tmp.c_str());
    return {StatusCode::io_error, fmt::format("safetensors: cannot write \"{}\"", tmp)};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return {StatusCode::io_error,
            fmt::format("safetensors: cannot rename \"{}\" to \"{}\": {}", tmp, path, std::strerror(err))};
  }
  return Status::success();
}

}  // namespace clm
