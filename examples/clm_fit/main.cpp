// examples/clm_fit/main.cpp: the `clm_fit` command. Fits the CLM parts from
// the host's own data in .safetensors files (docs/clm.md, "Fitting"):
//
//   clm_fit src-head   --data train.safetensors --out head.safetensors [options]
//   clm_fit adapter    --data pairs.safetensors --out adapter.safetensors [options]
//   clm_fit labels     --tokens conv.safetensors --n 4 --out labels.safetensors
//   clm_fit projection --data samples.safetensors --dim 256 --out projection.safetensors
//
// Prints one JSON line on stdout. Exit status: 0 ok, 2 any error (bad flags,
// unreadable or malformed files, data the fit refuses), with a message on
// stderr.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/io/safetensors.hpp"
#include "clm/model/adapter_fit.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_head.hpp"
#include "clm/model/src_head_training.hpp"
#include "clm/model/src_labels.hpp"

namespace {

constexpr int kExitError = 2;

constexpr std::string_view kUsage =
    "usage: clm_fit src-head --data FILE --out FILE [--labels FILE] [--epochs N] [--lr X] [--batch B]\n"
    "                        [--seed S] [--gelu tanh|erf] [--holdout F] [--patience P] [--weight-decay W]\n"
    "       clm_fit adapter --data FILE --out FILE [--projection FILE] [--lambda L] [--residual-scale S]\n"
    "       clm_fit labels --tokens FILE --n N --out FILE\n"
    "       clm_fit projection --data FILE --dim D --out FILE\n"
    "\n"
    "  src-head  --data holds features [n, hidden] (F32/F16/BF16) and labels [n] (U8/BOOL/I32/I64/F32,\n"
    "            0 or 1); writes src_head.w1/b1/w2/b2 (F32, metadata gelu). Defaults: 20 epochs, lr 1e-3,\n"
    "            batch 64, seed 0, gelu tanh, holdout 0, patience 0 (no early stopping), weight decay 0.\n"
    "            With --labels (the output of clm_fit labels), --data holds positions [n] (I32/I64)\n"
    "            instead of labels: row i gets the label at positions[i]; rows labelled 255 are left out\n"
    "  adapter   --data holds snapshots [n, dim] and deltas [n, hidden] (F32/F16/BF16); ridge fit of\n"
    "            residual_scale * (W s + b) ~ delta; writes adapter.weight/bias (F32).\n"
    "            With --projection (snapshot.* tensors), --data holds hidden [n, hidden] instead of\n"
    "            snapshots: hidden states that are projected into snapshots first.\n"
    "            Defaults: lambda 1e-3, residual scale 0.3\n"
    "  projection --data holds samples [n, hidden] (F32/F16/BF16): hidden states; PCA to D dimensions\n"
    "            (1 <= D <= min(hidden, n - 1)); writes snapshot.mean/components/explained_variance (F32)\n"
    "  labels    --tokens holds tokens [L] (I32/I64), generated [L] (0/1) and optionally indptr\n"
    "            [conversations + 1] (I32/I64; absent = one conversation); writes labels [L] U8:\n"
    "            1 repeated suffix, 0 not, 255 prompt position (not scored)\n";

// Any error: the message goes to stderr, main exits 2.
struct Failure {
  std::string message;
};

// `context` prefixes messages that do not say which file they are about.
void check(const clm::Status& s, std::string_view context = {}) {
  if (s.ok()) return;
  throw Failure{context.empty() ? s.message() : fmt::format("{}: {}", context, s.message())};
}

// --flag value pairs after the command.
class Flags {
 public:
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; i += 2) {
      const std::string_view flag = argv[i];
      if (flag.substr(0, 2) != "--") throw Failure{fmt::format("unexpected argument '{}'", flag)};
      if (i + 1 >= argc) throw Failure{fmt::format("{} needs a value", flag)};
      if (!values_.emplace(std::string(flag), argv[i + 1]).second) {
        throw Failure{fmt::format("{} given twice", flag)};
      }
    }
  }

  std::string text(const std::string& flag) {
    const auto it = values_.find(flag);
    if (it == values_.end()) throw Failure{fmt::format("{} is required", flag)};
    used_.push_back(flag);
    return it->second;
  }
  std::string text(const std::string& flag, const std::string& fallback) {
    return values_.count(flag) ? text(flag) : fallback;
  }
  template <class T>
  T number(const std::string& flag, T fallback) {
    if (!values_.count(flag)) return fallback;
    const std::string s = text(flag);
    T value{};
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (error != std::errc() || end != s.data() + s.size()) {
      throw Failure{fmt::format("{}: '{}' is not a valid number", flag, s)};
    }
    return value;
  }
  // Flags given but never asked for are typos: refuse them.
  void check_all_used() const {
    for (const auto& [flag, value] : values_) {
      if (std::find(used_.begin(), used_.end(), flag) == used_.end()) {
        throw Failure{fmt::format("unknown flag {} for this command", flag)};
      }
    }
  }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> used_;
};

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

clm::SafetensorsFile open_file(const std::string& path) {
  clm::SafetensorsFile file;
  check(clm::SafetensorsFile::open(path, file));
  return file;
}

const clm::TensorView& tensor(const clm::SafetensorsFile& file, const std::string& path, std::string_view name) {
  const clm::TensorView* t = file.find(name);
  if (t == nullptr) throw Failure{fmt::format("{}: no tensor '{}'", path, name)};
  return *t;
}

// Element i of an integer / float tensor as a double (memcpy: the file need
// not align its tensors).
double element(const clm::TensorView& t, std::size_t i) {
  const std::byte* p = t.bytes.data() + i * clm::tensor_dtype_bytes(t.dtype);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  };
  switch (t.dtype) {
    case clm::TensorDType::u8:
    case clm::TensorDType::boolean:
      return load(std::uint8_t{});
    case clm::TensorDType::i32:
      return load(std::int32_t{});
    case clm::TensorDType::i64:
      return load(std::int64_t{});
    case clm::TensorDType::f32:
      return load(float{});
    default:
      break;
  }
  return std::nan("");
}

std::size_t vector_length(const clm::TensorView& t, const std::string& path) {
  if (t.shape.size() != 1) throw Failure{fmt::format("{}: '{}' must be 1-D", path, t.name)};
  return static_cast<std::size_t>(t.shape[0]);
}

// A 1-D tensor of 0/1 values in U8, BOOL, I32, I64 or F32.
std::vector<std::uint8_t> read_binary(const clm::SafetensorsFile& file, const std::string& path,
                                      std::string_view name) {
  const clm::TensorView& t = tensor(file, path, name);
  using D = clm::TensorDType;
  if (t.dtype != D::u8 && t.dtype != D::boolean && t.dtype != D::i32 && t.dtype != D::i64 && t.dtype != D::f32) {
    throw Failure{
        fmt::format("{}: '{}' is {}, expected U8, BOOL, I32, I64 or F32", path, name, clm::tensor_dtype_name(t.dtype))};
  }
  std::vector<std::uint8_t> out(vector_length(t, path));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double v = element(t, i);
    if (v != 0.0 && v != 1.0) throw Failure{fmt::format("{}: {}[{}] is {}, must be 0 or 1", path, name, i, v)};
    out[i] = v == 1.0 ? 1 : 0;
  }
  return out;
}

// A 1-D I32 or I64 tensor whose values fit in T.
template <class T>
std::vector<T> read_ints(const clm::SafetensorsFile& file, const std::string& path, std::string_view name) {
  const clm::TensorView& t = tensor(file, path, name);
  if (t.dtype != clm::TensorDType::i32 && t.dtype != clm::TensorDType::i64) {
    throw Failure{fmt::format("{}: '{}' is {}, expected I32 or I64", path, name, clm::tensor_dtype_name(t.dtype))};
  }
  std::vector<T> out(vector_length(t, path));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int64_t v = 0;
    if (t.dtype == clm::TensorDType::i32) {
      std::int32_t v32 = 0;
      std::memcpy(&v32, t.bytes.data() + i * 4, 4);
      v = v32;
    } else {
      std::memcpy(&v, t.bytes.data() + i * 8, 8);
    }
    if (!std::in_range<T>(v)) throw Failure{fmt::format("{}: {}[{}] = {} is out of range", path, name, i, v)};
    out[i] = static_cast<T>(v);
  }
  return out;
}

// A 2-D F32/F16/BF16 tensor as f32 rows.
struct Matrix {
  std::vector<float> values;
  std::int64_t rows = 0;
  std::int32_t cols = 0;
  clm::ConstActivationView view() const { return clm::ConstActivationView::f32(values, rows, cols); }
};

Matrix read_matrix(const clm::SafetensorsFile& file, const std::string& path, std::string_view name) {
  Matrix m;
  std::vector<std::int64_t> shape;
  const std::int64_t any2[] = {-1, -1};
  check(file.get_f32(name, any2, m.values, &shape), path);
  if (shape[1] > (std::int64_t{1} << 30)) throw Failure{fmt::format("{}: '{}' has too many columns", path, name)};
  m.rows = shape[0];
  m.cols = static_cast<std::int32_t>(shape[1]);
  return m;
}

// labels[i] = the label at positions[i] of clm_fit labels' output; rows at an
// unscored position (255: a prompt token) are dropped from `features`.
void pick_labels(const clm::SafetensorsFile& data_file, const std::string& data_path, const std::string& labels_path,
                 Matrix& features, std::vector<std::uint8_t>& labels, std::int64_t& not_scored) {
  const std::vector<std::int64_t> positions = read_ints<std::int64_t>(data_file, data_path, "positions");
  if (positions.size() != static_cast<std::size_t>(features.rows)) {
    throw Failure{fmt::format("{}: {} positions for {} feature rows", data_path, positions.size(), features.rows)};
  }
  const clm::SafetensorsFile labels_file = open_file(labels_path);
  const clm::TensorView& all = tensor(labels_file, labels_path, "labels");
  if (all.dtype != clm::TensorDType::u8) {
    throw Failure{fmt::format("{}: 'labels' is {}, expected U8 (clm_fit labels writes it)", labels_path,
                              clm::tensor_dtype_name(all.dtype))};
  }
  const std::size_t length = vector_length(all, labels_path);
  const auto cols = static_cast<std::size_t>(features.cols);
  std::vector<float> kept;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0 || static_cast<std::size_t>(positions[i]) >= length) {
      throw Failure{fmt::format("{}: positions[{}] = {} is outside the {} labels of {}", data_path, i, positions[i],
                                length, labels_path)};
    }
    const auto label = static_cast<std::uint8_t>(all.bytes[static_cast<std::size_t>(positions[i])]);
    if (label == clm::kLabelNotScored) {
      ++not_scored;
      continue;
    }
    if (label > 1) {
      throw Failure{fmt::format("{}: labels[{}] is {}, must be 0, 1 or 255", labels_path, positions[i], label)};
    }
    labels.push_back(label);
    kept.insert(kept.end(), features.values.begin() + static_cast<std::ptrdiff_t>(i * cols),
                features.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * cols));
  }
  features.values = std::move(kept);
  features.rows = static_cast<std::int64_t>(labels.size());
}

int fit_src_head(Flags& flags) {
  const std::string data = flags.text("--data");
  const std::string out = flags.text("--out");
  clm::SrcHeadTrainOptions options;
  options.epochs = flags.number("--epochs", options.epochs);
  options.learning_rate = flags.number("--lr", options.learning_rate);
  options.batch_size = flags.number("--batch", options.batch_size);
  options.seed = flags.number("--seed", options.seed);
  options.holdout_fraction = flags.number("--holdout", options.holdout_fraction);
  options.patience = flags.number("--patience", options.patience);
  options.weight_decay = flags.number("--weight-decay", options.weight_decay);
  const std::string gelu = flags.text("--gelu", "tanh");
  if (gelu != "tanh" && gelu != "erf") throw Failure{"--gelu must be tanh or erf"};
  options.gelu = gelu == "erf" ? clm::Gelu::erf : clm::Gelu::tanh;
  const std::string labels_path = flags.text("--labels", "");
  flags.check_all_used();

  const clm::SafetensorsFile file = open_file(data);
  Matrix features = read_matrix(file, data, "features");
  std::vector<std::uint8_t> labels;
  std::int64_t not_scored = 0;
  if (labels_path.empty()) {
    labels = read_binary(file, data, "labels");
  } else {
    pick_labels(file, data, labels_path, features, labels, not_scored);
  }
  clm::SrcHeadWeights weights;
  clm::SrcHeadTrainReport report;
  check(clm::train_src_head(features.view(), labels, options, weights, &report));
  check(clm::write_src_head(out, weights, options.gelu, {{"written_by", "clm_fit"}}), out);
  fmt::print(
      "{{\"command\":\"src-head\",\"rows\":{},\"not_scored\":{},\"hidden\":{},\"train_rows\":{},"
      "\"validation_rows\":{},\"epochs_run\":{},\"best_epoch\":{},\"train_loss\":{},\"train_auc\":{},"
      "\"validation_loss\":{},\"validation_auc\":{},\"gelu\":\"{}\",\"out\":{}}}\n",
      features.rows, not_scored, features.cols, report.train_rows, report.validation_rows, report.epochs_run,
      report.best_epoch, json_number(report.train_loss), json_number(report.train_auc),
      json_number(report.validation_loss), json_number(report.validation_auc), gelu, json_string(out));
  return 0;
}

int fit_adapter(Flags& flags) {
  const std::string data = flags.text("--data");
  const std::string out = flags.text("--out");
  const double lambda = flags.number("--lambda", 1e-3);
  const float scale = flags.number("--residual-scale", clm::kDefaultResidualScale);
  const std::string projection_path = flags.text("--projection", "");
  flags.check_all_used();

  const clm::SafetensorsFile file = open_file(data);
  Matrix snapshots;
  if (projection_path.empty()) {
    snapshots = read_matrix(file, data, "snapshots");
  } else {
    // Hidden states, made into snapshots exactly as the host makes them.
    clm::SnapshotProjectionWeights projection_weights;
    check(clm::read_snapshot_projection(projection_path, projection_weights), projection_path);
    std::unique_ptr<clm::SnapshotProjection> projection;
    check(clm::SnapshotProjection::create(std::move(projection_weights), projection), projection_path);
    const Matrix hidden = read_matrix(file, data, "hidden");
    if (hidden.cols != projection->hidden()) {
      throw Failure{
          fmt::format("{}: 'hidden' has {} columns, the projection takes {}", data, hidden.cols, projection->hidden())};
    }
    snapshots.rows = hidden.rows;
    snapshots.cols = projection->snapshot_dim();
    snapshots.values.resize(static_cast<std::size_t>(snapshots.rows) * static_cast<std::size_t>(snapshots.cols));
    check(projection->project(hidden.view(), snapshots.values), data);
  }
  const Matrix deltas = read_matrix(file, data, "deltas");
  clm::SnapshotAdapterWeights weights;
  clm::AdapterFitReport report;
  check(clm::fit_snapshot_adapter(snapshots.view(), deltas.view(), lambda, scale, weights, &report));
  check(clm::write_snapshot_adapter(out, weights), out);
  fmt::print(
      "{{\"command\":\"adapter\",\"rows\":{},\"snapshot_dim\":{},\"hidden\":{},\"lambda\":{},"
      "\"residual_scale\":{},\"r2\":{},\"projected\":{},\"out\":{}}}\n",
      report.rows, weights.snapshot_dim, weights.hidden, json_number(lambda), json_number(scale),
      json_number(report.r2), projection_path.empty() ? "false" : "true", json_string(out));
  return 0;
}

int fit_projection(Flags& flags) {
  const std::string data = flags.text("--data");
  const std::string out = flags.text("--out");
  const auto dim = flags.number<std::int32_t>("--dim", 0);
  if (dim < 1) throw Failure{"--dim is required and must be >= 1"};
  flags.check_all_used();

  const clm::SafetensorsFile file = open_file(data);
  const Matrix samples = read_matrix(file, data, "samples");
  clm::SnapshotProjectionWeights weights;
  check(clm::fit_pca(samples.view(), dim, weights), data);
  check(clm::write_snapshot_projection(out, weights), out);
  // The share of the samples' variance the components keep.
  const auto cols = static_cast<std::size_t>(samples.cols);
  std::vector<double> mean(cols, 0.0);
  for (std::size_t i = 0; i < samples.values.size(); ++i) mean[i % cols] += samples.values[i];
  for (double& m : mean) m /= static_cast<double>(samples.rows);
  double total = 0.0, kept = 0.0;
  for (std::size_t i = 0; i < samples.values.size(); ++i) {
    const double d = samples.values[i] - mean[i % cols];
    total += d * d;
  }
  total /= static_cast<double>(samples.rows - 1);
  for (float v : weights.explained_variance) kept += v;
  fmt::print(
      "{{\"command\":\"projection\",\"rows\":{},\"hidden\":{},\"snapshot_dim\":{},"
      "\"explained_fraction\":{},\"out\":{}}}\n",
      samples.rows, samples.cols, dim, json_number(total > 0.0 ? kept / total : std::nan("")), json_string(out));
  return 0;
}

int make_labels(Flags& flags) {
  const std::string path = flags.text("--tokens");
  const std::string out = flags.text("--out");
  const auto n = flags.number<std::int32_t>("--n", 0);
  if (n < 1) throw Failure{"--n is required and must be >= 1"};
  flags.check_all_used();

  const clm::SafetensorsFile file = open_file(path);
  const std::vector<std::int32_t> tokens = read_ints<std::int32_t>(file, path, "tokens");
  const std::vector<std::uint8_t> generated = read_binary(file, path, "generated");
  std::vector<std::int64_t> indptr = {0, static_cast<std::int64_t>(tokens.size())};
  if (file.find("indptr") != nullptr) indptr = read_ints<std::int64_t>(file, path, "indptr");
  std::vector<std::uint8_t> labels(tokens.size());
  check(clm::label_repeated_suffixes_batch(tokens, generated, indptr, n, labels), path);

  std::size_t scored = 0, repeated = 0;
  for (std::uint8_t v : labels) {
    scored += v != clm::kLabelNotScored;
    repeated += v == 1;
  }
  const clm::TensorToWrite tensors[] = {
      {"labels", clm::TensorDType::u8, {static_cast<std::int64_t>(labels.size())}, std::as_bytes(std::span(labels))}};
  check(clm::write_safetensors(out, tensors, {{"n", std::to_string(n)}, {"not_scored", "255"}}), out);
  fmt::print(
      "{{\"command\":\"labels\",\"positions\":{},\"conversations\":{},\"n\":{},\"scored\":{},\"repeated\":{},"
      "\"repeat_rate\":{},\"out\":{}}}\n",
      labels.size(), indptr.size() - 1, n, scored, repeated,
      json_number(scored ? static_cast<double>(repeated) / static_cast<double>(scored) : std::nan("")),
      json_string(out));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw Failure{"missing command"};
    const std::string_view command = argv[1];
    if (command == "--help" || command == "-h" || command == "help") {
      fmt::print("{}", kUsage);
      return 0;
    }
    Flags flags(argc, argv, 2);
    if (command == "src-head") return fit_src_head(flags);
    if (command == "adapter") return fit_adapter(flags);
    if (command == "labels") return make_labels(flags);
    if (command == "projection") return fit_projection(flags);
    throw Failure{fmt::format("unknown command '{}'", command)};
  } catch (const Failure& f) {
    fmt::print(stderr, "clm_fit: {}\n(clm_fit --help for usage)\n", f.message);
  } catch (const std::exception& e) {  // e.g. bad_alloc on absurd sizes
    fmt::print(stderr, "clm_fit: {}\n", e.what());
  }
  return kExitError;
}
