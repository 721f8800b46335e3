// Tests of clm/io/safetensors.hpp: hand-built files, writer/reader round trips,
// every malformed case, and a mutation loop that must never crash.
#include "clm/io/safetensors.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>  // getpid

#include "test_support.hpp"

namespace {

using clm::StatusCode;
using clm::TensorDType;

using clm_test::raw_bytes;

template <typename T>
std::vector<T> values_of(const clm::TensorView& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("clm_test_safetensors_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void require_error(const clm::Status& s, StatusCode code) {
  INFO("status " << s.code_name() << ": " << s.message());
  REQUIRE(s.code() == code);
  REQUIRE(!s.message().empty());
}

}  // namespace

TEST_CASE("a hand-built file parses to the right values") {
  const std::vector<float> w = {1.0f, -2.5f, 3.25f, 4.0f, 0.5f, -0.125f};
  const std::vector<std::int32_t> ids = {7, -8, 9};
  std::vector<std::byte> data = raw_bytes(w);
  const std::vector<std::byte> id_bytes = raw_bytes(ids);
  data.insert(data.end(), id_bytes.begin(), id_bytes.end());
  // Keys out of order, whitespace between tokens, escapes, trailing padding.
  const std::string json =
      "{ \"ids\" : {\"dtype\":\"I32\", \"shape\":[3], \"data_offsets\":[24, 36]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"note\": \"a \\\"q\\\" \\u00e9\\n\"},\n"
      "  \"proj.weight\": {\"shape\": [2, 3], \"data_offsets\": [0, 24], \"dtype\": \"F32\"},\n"
      "  \"empty\": {\"dtype\":\"F16\",\"shape\":[0, 4],\"data_offsets\":[36,36]}}     ";
  clm::SafetensorsFile file;
  const clm::Status s = clm::SafetensorsFile::parse(clm_test::file_bytes(json, data), file);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(file.size() == 3);
  REQUIRE(file.header_bytes() == json.size());
  REQUIRE(file.buffer_bytes() == 36);
  REQUIRE(file.metadata().size() == 2);
  REQUIRE(file.metadata().at("format") == "pt");
  REQUIRE(file.metadata().at("note") == "a \"q\" \xc3\xa9\n");

  const clm::TensorView* p = file.find("proj.weight");
  REQUIRE(p != nullptr);
  REQUIRE(p->dtype == TensorDType::f32);
  REQUIRE(p->shape == std::vector<std::int64_t>{2, 3});
  REQUIRE(p->numel() == 6);
  REQUIRE(values_of<float>(*p) == w);

  const std::int64_t ids_shape[] = {3};
  const clm::TensorView* t = nullptr;
  REQUIRE(file.get("ids", TensorDType::i32, ids_shape, t).ok());
  REQUIRE(values_of<std::int32_t>(*t) == ids);

  const clm::TensorView* e = file.find("empty");
  REQUIRE(e != nullptr);
  REQUIRE(e->bytes.empty());
  REQUIRE(e->numel() == 0);
  REQUIRE(file.find("missing") == nullptr);
  REQUIRE(file.find("__metadata__") == nullptr);

  // A scalar (shape []) and an empty header object are fine too.
  const std::vector<double> one = {6.5};
  clm::SafetensorsFile scalar;
  REQUIRE(clm::SafetensorsFile::parse(
              clm_test::file_bytes("{\"x\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", raw_bytes(one)),
              scalar)
              .ok());
  REQUIRE(values_of<double>(*scalar.find("x")) == one);
  clm::SafetensorsFile none;
  REQUIRE(clm::SafetensorsFile::parse(clm_test::file_bytes("{}"), none).ok());
  REQUIRE(none.size() == 0);
}

TEST_CASE("get reports the tensor, the expected and the actual dtype and shape") {
  const std::vector<float> w(6, 1.0f);
  clm::SafetensorsFile file;
  REQUIRE(clm::SafetensorsFile::parse(
              clm_test::file_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", raw_bytes(w)),
              file)
              .ok());
  const clm::TensorView* out = nullptr;
  const std::int64_t good[] = {2, 3};
  const std::int64_t wild[] = {-1, 3};
  const std::int64_t bad[] = {3, 2};
  const std::int64_t rank1[] = {6};
  REQUIRE(file.get("w", TensorDType::f32, good, out).ok());
  REQUIRE(out == file.find("w"));
  REQUIRE(file.get("w", TensorDType::f32, wild, out).ok());

  clm::Status s = file.get("nope", TensorDType::f32, good, out);
  require_error(s, StatusCode::not_found);
  REQUIRE(s.message().find("nope") != std::string::npos);

  s = file.get("w", TensorDType::f16, good, out);
  require_error(s, StatusCode::invalid_argument);
  REQUIRE(s.message().find("\"w\"") != std::string::npos);
  REQUIRE(s.message().find("F16") != std::string::npos);
  REQUIRE(s.message().find("F32") != std::string::npos);

  s = file.get("w", TensorDType::f32, bad, out);
  require_error(s, StatusCode::invalid_argument);
  REQUIRE(s.message().find("[3, 2]") != std::string::npos);
  REQUIRE(s.message().find("[2, 3]") != std::string::npos);
  require_error(file.get("w", TensorDType::f32, rank1, out), StatusCode::invalid_argument);
}

TEST_CASE("writer and reader round trip random tensors of several dtypes") {
  std::mt19937_64 rng(1234);
  const TensorDType dtypes[] = {TensorDType::f32, TensorDType::f16, TensorDType::bf16, TensorDType::f64,
                                TensorDType::i32, TensorDType::i64, TensorDType::u8,   TensorDType::boolean};
  for (int round = 0; round < 20; ++round) {
    const int count = static_cast<int>(rng() % 8);
    std::vector<std::vector<std::byte>> storage;
    std::vector<clm::TensorToWrite> tensors;
    storage.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      clm::TensorToWrite t;
      t.name = "layer." + std::to_string(rng() % 1000) + ".w" + std::to_string(i);
      t.dtype = dtypes[rng() % std::size(dtypes)];
      const std::size_t rank = rng() % 4;
      std::size_t numel = 1;
      for (std::size_t d = 0; d < rank; ++d) {
        const auto extent = static_cast<std::int64_t>(rng() % 6);
        t.shape.push_back(extent);
        numel *= static_cast<std::size_t>(extent);
      }
      std::vector<std::byte> bytes(numel * clm::tensor_dtype_bytes(t.dtype));
      for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
      storage.push_back(std::move(bytes));
      t.bytes = storage.back();
      tensors.push_back(std::move(t));
    }
    std::map<std::string, std::string> metadata;
    if (round % 2 == 0) metadata = {{"format", "pt"}, {"quote\"s\\", "ctl\x01\ttab \xe2\x82\xac"}};

    const std::string path = temp_path("round_trip.safetensors");
    const clm::Status w = clm::write_safetensors(path, tensors, metadata);
    INFO(w.message());
    REQUIRE(w.ok());
    clm::SafetensorsFile file;
    const clm::Status r = clm::SafetensorsFile::open(path, file);
    INFO(r.message());
    REQUIRE(r.ok());
    std::remove(path.c_str());

    REQUIRE((8 + file.header_bytes()) % 8 == 0);
    REQUIRE(file.metadata() == metadata);
    REQUIRE(file.size() == tensors.size());
    for (const auto& t : tensors) {
      const clm::TensorView* v = nullptr;
      REQUIRE(file.get(t.name, t.dtype, t.shape, v).ok());
      REQUIRE(v->bytes.size() == t.bytes.size());
      REQUIRE(std::equal(v->bytes.begin(), v->bytes.end(), t.bytes.begin()));
    }

    // The same tensors through serialize_safetensors: the buffer keeps its
    // address when parse takes it over, so offsets can be checked.
    std::vector<std::byte> bytes;
    REQUIRE(clm::serialize_safetensors(tensors, metadata, bytes).ok());
    const std::byte* base = bytes.data();
    const std::string header(reinterpret_cast<const char*>(base) + 8, file.header_bytes());
    clm::SafetensorsFile again;
    REQUIRE(clm::SafetensorsFile::parse(std::move(bytes), again).ok());
    const std::byte* buffer = base + 8 + again.header_bytes();
    std::size_t last_key = 0;
    for (const clm::TensorView& v : again.tensors()) {  // sorted by name
      if (!v.bytes.empty()) {
        const auto offset = static_cast<std::size_t>(v.bytes.data() - buffer);
        REQUIRE(offset % clm::tensor_dtype_bytes(v.dtype) == 0);
      }
      const std::size_t key = header.find("\"" + v.name + "\":{\"dtype\"");
      REQUIRE(key != std::string::npos);
      REQUIRE(key >= last_key);  // header keys are sorted
      last_key = key;
    }
  }
}

TEST_CASE("malformed files are refused with the right status") {
  const std::vector<std::byte> data(64, std::byte{0});
  const auto t = [](const std::string& fields) { return "{\"t\":{" + fields + "}}"; };
  struct Case {
    const char* what;
    std::vector<std::byte> bytes;
  };
  std::vector<Case> cases = {
      {"empty file", {}},
      {"shorter than the length", {std::byte{2}, std::byte{0}}},
      {"header longer than the file", clm_test::file_bytes("{}", {})},
      {"absurd header length", {}},
      {"header not an object", clm_test::file_bytes("[]", data)},
      {"unterminated object", clm_test::file_bytes("{\"t\":{\"dtype\":\"F32\"", data)},
      {"missing colon", clm_test::file_bytes("{\"t\" {}}", data)},
      {"trailing comma",
       clm_test::file_bytes("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", data)},
      {"trailing garbage",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + " x", data)},
      {"single quotes", clm_test::file_bytes("{'t':{}}", data)},
      {"bad escape", clm_test::file_bytes("{\"t\\q\":{}}", data)},
      {"lone surrogate", clm_test::file_bytes("{\"\\ud800\":{}}", data)},
      {"control character", clm_test::file_bytes("{\"a\nb\":{}}", data)},
      {"not UTF-8", clm_test::file_bytes("{\"\xff\":{}}", data)},
      {"unknown dtype", clm_test::file_bytes(t("\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]"), data)},
      {"dtype not a string", clm_test::file_bytes(t("\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]"), data)},
      {"missing dtype", clm_test::file_bytes(t("\"shape\":[1],\"data_offsets\":[0,4]"), data)},
      {"missing shape", clm_test::file_bytes(t("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), data)},
      {"missing offsets", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1]"), data)},
      {"unknown field",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1"), data)},
      {"duplicate field",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"), data)},
      {"negative extent", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), data)},
      {"fractional extent", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]"), data)},
      {"leading zero", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]"), data)},
      {"extent too large",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]"), data)},
      {"shape product overflow",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]"), data)},
      {"byte count overflow",
       clm_test::file_bytes(t("\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]"), data)},
      {"offsets not a pair", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]"), data)},
      {"end before begin", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]"), data)},
      {"offsets past the buffer",
       clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[64,68]"), data)},
      {"offsets past the buffer (huge)",
       clm_test::file_bytes(
           t("\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775806,9223372036854775807]"), data)},
      {"byte count mismatch", clm_test::file_bytes(t("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"), data)},
      {"overlapping tensors", clm_test::file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                                                   data)},
      {"duplicate names", clm_test::file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                               data)},
      {"duplicate metadata", clm_test::file_bytes("{\"__metadata__\":{},\"__metadata__\":{}}", data)},
      {"duplicate metadata key", clm_test::file_bytes("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", data)},
      {"metadata value not a string", clm_test::file_bytes("{\"__metadata__\":{\"a\":1}}", data)},
      {"metadata not an object", clm_test::file_bytes("{\"__metadata__\":\"x\"}", data)},
  };
  // Header length larger than the file: claim 100 bytes, hold 2.
  cases[2].bytes[0] = std::byte{100};
  // Header length absurd: 2^40, with a file that is short anyway.
  cases[3].bytes = clm_test::file_bytes("{}", data);
  cases[3].bytes[5] = std::byte{1};
  for (const Case& c : cases) {
    INFO(c.what);
    clm::SafetensorsFile file;
    const clm::Status s = clm::SafetensorsFile::parse(c.bytes, file);
    require_error(s, StatusCode::invalid_argument);
    REQUIRE(file.size() == 0);  // `out` untouched
  }
  // The absurd length is reported as such, not as "larger than the file".
  clm::SafetensorsFile file;
  const clm::Status s = clm::SafetensorsFile::parse(cases[3].bytes, file);
  REQUIRE(s.message().find("absurd") != std::string::npos);
}

TEST_CASE("open and write report io errors, and the writer refuses bad tensors") {
  clm::SafetensorsFile file;
  require_error(clm::SafetensorsFile::open(temp_path("does_not_exist"), file), StatusCode::io_error);
  require_error(clm::SafetensorsFile::open("/", file), StatusCode::io_error);
  require_error(clm::write_safetensors("/nonexistent_dir_clm/x.safetensors", {}), StatusCode::io_error);

  // A malformed file on disk: invalid_argument, naming the path.
  const std::string path = temp_path("malformed.safetensors");
  {
    const auto bytes = clm_test::file_bytes("{\"t\":", {});
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
  }
  const clm::Status s = clm::SafetensorsFile::open(path, file);
  require_error(s, StatusCode::invalid_argument);
  REQUIRE(s.message().find(path) != std::string::npos);
  std::remove(path.c_str());

  const std::vector<float> four(4, 1.0f);
  const auto bytes = raw_bytes(four);
  std::vector<std::byte> out;
  const auto one = [&](clm::TensorToWrite t) {
    return clm::serialize_safetensors(std::span<const clm::TensorToWrite>(&t, 1), {}, out);
  };
  require_error(one({"w", TensorDType::f32, {3}, bytes}), StatusCode::invalid_argument);
  require_error(one({"w", TensorDType::f32, {-4}, bytes}), StatusCode::invalid_argument);
  require_error(one({"", TensorDType::f32, {4}, bytes}), StatusCode::invalid_argument);
  require_error(one({"__metadata__", TensorDType::f32, {4}, bytes}), StatusCode::invalid_argument);
  REQUIRE(one({"w", TensorDType::f32, {2, 2}, bytes}).ok());
  const std::vector<clm::TensorToWrite> dup = {{"w", TensorDType::f32, {4}, bytes},
                                               {"w", TensorDType::u8, {16}, bytes}};
  require_error(clm::serialize_safetensors(dup, {}, out), StatusCode::invalid_argument);
}

TEST_CASE("truncated and mutated files never crash the reader") {
  std::mt19937_64 rng(99);
  std::vector<std::vector<std::byte>> storage;
  std::vector<clm::TensorToWrite> tensors;
  storage.reserve(4);
  const std::pair<TensorDType, std::vector<std::int64_t>> specs[] = {
      {TensorDType::f32, {3, 4}}, {TensorDType::bf16, {5}}, {TensorDType::i64, {2, 1, 2}}, {TensorDType::u8, {7}}};
  int i = 0;
  for (const auto& [dtype, shape] : specs) {
    std::size_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::size_t>(d);
    std::vector<std::byte> b(numel * clm::tensor_dtype_bytes(dtype));
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xFF);
    storage.push_back(std::move(b));
    std::string name = "t";  // (not "t" + ...: a GCC 12 -Wrestrict false positive)
    name += std::to_string(i++);
    tensors.push_back({name, dtype, shape, storage.back()});
  }
  std::vector<std::byte> valid;
  REQUIRE(clm::serialize_safetensors(tensors, {{"k", "v"}}, valid).ok());

  const char interesting[] = "{}[]\":,0123456789-. \\u";
  int accepted = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<std::byte> bytes = valid;
    const auto kind = rng() % 4;
    if (kind == 0) {
      bytes.resize(rng() % bytes.size());
    } else {
      const auto edits = 1 + rng() % 4;
      for (std::uint64_t e = 0; e < edits; ++e) {
        // Mostly the header (where the parser is), sometimes the length.
        const std::size_t at = (rng() % 8 == 0) ? rng() % 8 : rng() % bytes.size();
        bytes[at] = (kind == 1) ? static_cast<std::byte>(rng() & 0xFF)
                                : static_cast<std::byte>(interesting[rng() % (sizeof interesting - 1)]);
      }
    }
    clm::SafetensorsFile file;
    const clm::Status s = clm::SafetensorsFile::parse(std::move(bytes), file);
    if (!s.ok()) {
      REQUIRE(s.code() == StatusCode::invalid_argument);
      REQUIRE(!s.message().empty());
      continue;
    }
    ++accepted;
    // Every view lies inside the buffer; touching every byte must be safe.
    unsigned sum = 0;
    for (const clm::TensorView& v : file.tensors()) {
      REQUIRE(v.bytes.size() == static_cast<std::size_t>(v.numel()) * clm::tensor_dtype_bytes(v.dtype));
      for (std::byte b : v.bytes) sum += std::to_integer<unsigned>(b);
    }
    (void)sum;
  }
  REQUIRE(accepted > 0);  // some mutations (data bytes, spaces) keep the file valid
}
