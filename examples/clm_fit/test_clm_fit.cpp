// Tests of the clm_fit command: small synthetic datasets written here, the real
// binary run on them, its output files loaded back through the library. The
// fits themselves are tested in tests/test_src_head_training.cpp,
// tests/test_adapter_fit.cpp and tests/test_src_labels.cpp.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "clm/detail/half.hpp"
#include "clm/io/safetensors.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "clm/model/src_head.hpp"
#include "clm/model/src_labels.hpp"
#include "temp_dir.hpp"

namespace {

using clm_test::TempDir;

struct Run {
  int exit_code = -1;
  std::string out;  // stdout
};

Run run_clm_fit(const TempDir& dir, const std::string& args) {
  const std::string out_path = dir.file("stdout.txt");
  const std::string command = std::string(CLM_FIT_BINARY) + " " + args + " >" + out_path + " 2>/dev/null";
  const int status = std::system(command.c_str());
  Run r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  return r;
}

// The number after "key": in the one-line JSON summary (NaN when absent/null).
double json_field(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const std::size_t at = json.find(needle);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + at + needle.size(), nullptr);
}

template <class T>
clm::TensorToWrite tensor(const std::string& name, clm::TensorDType dtype, std::vector<std::int64_t> shape,
                          const std::vector<T>& values) {
  return {name, dtype, std::move(shape), std::as_bytes(std::span(values))};
}

void write(const std::string& path, const std::vector<clm::TensorToWrite>& tensors) {
  const clm::Status s = clm::write_safetensors(path, tensors);
  INFO(s.message());
  REQUIRE(s.ok());
}

}  // namespace

TEST_CASE("clm_fit src-head trains on a file and writes a head SrcHead loads") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int hidden = 32, rows = 1500;
  // label = [x0 + (x1 + x2)^2 / 2 > 0.5]: a non-linear function of the features.
  std::vector<std::uint16_t> features(static_cast<std::size_t>(rows * hidden));  // bf16
  std::vector<std::int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> x(hidden);
    for (int c = 0; c < hidden; ++c) {
      features[static_cast<std::size_t>(r * hidden + c)] = clm::detail::f32_to_bf16(n(rng));
      x[static_cast<std::size_t>(c)] = clm::detail::bf16_to_f32(features[static_cast<std::size_t>(r * hidden + c)]);
    }
    labels[static_cast<std::size_t>(r)] = x[0] + 0.5f * (x[1] + x[2]) * (x[1] + x[2]) > 0.5f ? 1 : 0;
  }
  const std::string data = dir.file("train.safetensors"), head_path = dir.file("head.safetensors");
  write(data, {tensor("features", clm::TensorDType::bf16, {rows, hidden}, features),
               tensor("labels", clm::TensorDType::i32, {rows}, labels)});

  const Run run = run_clm_fit(dir, "src-head --data " + data + " --out " + head_path +
                                       " --epochs 30 --lr 3e-3 --batch 32 --seed 5 --gelu erf --holdout 0.2"
                                       " --patience 5");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(json_field(run.out, "rows") == rows);
  CHECK(json_field(run.out, "hidden") == hidden);
  CHECK(json_field(run.out, "validation_rows") == Approx(0.2 * rows).margin(1));
  CHECK(json_field(run.out, "validation_auc") > 0.9);
  CHECK(json_field(run.out, "train_loss") < std::log(2.0));

  clm::SafetensorsFile file;
  REQUIRE(clm::SafetensorsFile::open(head_path, file).ok());
  CHECK(file.metadata().at("gelu") == "erf");
  clm::SrcHeadWeights weights;
  const clm::Status read = clm::read_src_head(file, weights);
  INFO(read.message());
  REQUIRE(read.ok());
  CHECK(weights.hidden == hidden);
  std::optional<clm::Gelu> recorded;
  REQUIRE(clm::read_src_head_gelu(file, recorded).ok());
  CHECK(recorded == clm::Gelu::erf);  // load_src_head follows it
  std::unique_ptr<clm::SrcHead> head;
  REQUIRE(clm::SrcHead::create(std::move(weights), clm::Gelu::erf, head).ok());
}

TEST_CASE("clm_fit adapter fits pairs from a file and writes an adapter that loads") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int dim = 8, hidden = 12, rows = 200;
  const float scale = 0.5f;
  std::vector<float> w(static_cast<std::size_t>(hidden * dim)), b(hidden);
  for (float& v : w) v = n(rng);
  for (float& v : b) v = n(rng);
  std::vector<float> snapshots(static_cast<std::size_t>(rows * dim)), deltas(static_cast<std::size_t>(rows * hidden));
  for (float& v : snapshots) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < hidden; ++o) {
      double y = b[static_cast<std::size_t>(o)];
      for (int k = 0; k < dim; ++k) {
        y += double{w[static_cast<std::size_t>(o * dim + k)]} * snapshots[static_cast<std::size_t>(r * dim + k)];
      }
      deltas[static_cast<std::size_t>(r * hidden + o)] = static_cast<float>(scale * y);
    }
  }
  const std::string data = dir.file("pairs.safetensors"), out = dir.file("adapter.safetensors");
  write(data, {tensor("snapshots", clm::TensorDType::f32, {rows, dim}, snapshots),
               tensor("deltas", clm::TensorDType::f32, {rows, hidden}, deltas)});

  const Run run = run_clm_fit(dir, "adapter --data " + data + " --out " + out + " --lambda 0 --residual-scale 0.5");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(json_field(run.out, "r2") > 1.0 - 1e-6);
  CHECK(json_field(run.out, "snapshot_dim") == dim);

  clm::SnapshotAdapterWeights fitted;
  const clm::Status read = clm::read_snapshot_adapter(out, fitted);
  INFO(read.message());
  REQUIRE(read.ok());
  REQUIRE(fitted.weight.size() == w.size());
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(fitted.weight[i] == Approx(w[i]).margin(1e-4));
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(fitted.bias[i] == Approx(b[i]).margin(1e-4));
}

TEST_CASE("clm_fit labels writes the repeated-suffix labels of a token file") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::int32_t> token(0, 5);
  std::vector<std::int32_t> tokens(300);
  std::vector<std::uint8_t> generated(300);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = token(rng);
    generated[i] = (i / 10) % 2 ? 1 : 0;
  }
  const std::vector<std::int64_t> indptr = {0, 120, 120, 300};
  const std::string data = dir.file("conv.safetensors"), out = dir.file("labels.safetensors");
  write(data, {tensor("tokens", clm::TensorDType::i32, {300}, tokens),
               tensor("generated", clm::TensorDType::u8, {300}, generated),
               tensor("indptr", clm::TensorDType::i64, {4}, indptr)});

  const Run run = run_clm_fit(dir, "labels --tokens " + data + " --n 3 --out " + out);
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(json_field(run.out, "positions") == 300);
  CHECK(json_field(run.out, "conversations") == 3);
  CHECK(json_field(run.out, "scored") == 150);

  std::vector<std::uint8_t> expected(300);
  REQUIRE(clm::label_repeated_suffixes_batch(tokens, generated, indptr, 3, expected).ok());
  clm::SafetensorsFile file;
  REQUIRE(clm::SafetensorsFile::open(out, file).ok());
  const clm::TensorView* labels = nullptr;
  const std::int64_t shape[] = {300};
  REQUIRE(file.get("labels", clm::TensorDType::u8, shape, labels).ok());
  const auto* got = reinterpret_cast<const std::uint8_t*>(labels->bytes.data());
  CHECK(std::vector<std::uint8_t>(got, got + 300) == expected);
  std::size_t repeated = 0;
  for (std::uint8_t v : expected) repeated += v == 1;
  CHECK(json_field(run.out, "repeated") == static_cast<double>(repeated));
}

TEST_CASE("clm_fit projection fits the PCA of a file's samples and writes a projection that loads") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int hidden = 24, rows = 400, dim = 4;
  // Four strong directions plus a little noise: four components keep almost all of the variance.
  std::vector<float> basis(static_cast<std::size_t>(dim * hidden)), samples(static_cast<std::size_t>(rows * hidden));
  for (float& v : basis) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < dim; ++k) {
      const float a = 3.0f * n(rng);
      for (int c = 0; c < hidden; ++c) {
        samples[static_cast<std::size_t>(r * hidden + c)] += a * basis[static_cast<std::size_t>(k * hidden + c)];
      }
    }
    for (int c = 0; c < hidden; ++c) samples[static_cast<std::size_t>(r * hidden + c)] += 0.01f * n(rng) + 2.0f;
  }
  const std::string data = dir.file("samples.safetensors"), out = dir.file("projection.safetensors");
  write(data, {tensor("samples", clm::TensorDType::f32, {rows, hidden}, samples)});

  const Run run = run_clm_fit(dir, "projection --data " + data + " --dim " + std::to_string(dim) + " --out " + out);
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(json_field(run.out, "rows") == rows);
  CHECK(json_field(run.out, "snapshot_dim") == dim);
  CHECK(json_field(run.out, "explained_fraction") > 0.99);

  clm::SnapshotProjectionWeights fitted, expected;
  const clm::Status read = clm::read_snapshot_projection(out, fitted);
  INFO(read.message());
  REQUIRE(read.ok());
  REQUIRE(clm::fit_pca(clm::ConstActivationView::f32(samples, rows, hidden), dim, expected).ok());
  CHECK(fitted.snapshot_dim == dim);
  REQUIRE(fitted.components.size() == expected.components.size());
  for (std::size_t i = 0; i < expected.components.size(); ++i) {
    CHECK(fitted.components[i] == Approx(expected.components[i]).margin(1e-6));
  }
  for (std::size_t i = 0; i < expected.mean.size(); ++i) CHECK(fitted.mean[i] == Approx(expected.mean[i]));
}

TEST_CASE("clm_fit src-head --labels takes each row's label at its position and leaves out the unscored") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int hidden = 16, length = 900;
  // labels as clm_fit labels writes them: 255 for prompt positions, else x0 > 0 of the row that points there.
  std::vector<std::uint8_t> labels(length, clm::kLabelNotScored);
  std::vector<float> features;
  std::vector<std::int64_t> positions;
  std::int64_t scored = 0;
  for (int p = 0; p < length; ++p) {
    std::vector<float> x(hidden);
    for (float& v : x) v = n(rng);
    if (p % 3 != 0) {
      labels[static_cast<std::size_t>(p)] = x[0] > 0.0f ? 1 : 0;
      ++scored;
    }
    features.insert(features.end(), x.begin(), x.end());
    positions.push_back(p);
  }
  std::shuffle(positions.begin(), positions.end(), rng);  // rows point anywhere: reorder the features with them
  std::vector<float> shuffled;
  for (std::int64_t p : positions) {
    shuffled.insert(shuffled.end(), features.begin() + p * hidden, features.begin() + (p + 1) * hidden);
  }
  const std::string data = dir.file("features.safetensors"), labels_path = dir.file("labels.safetensors");
  const std::string out = dir.file("head.safetensors");
  write(data, {tensor("features", clm::TensorDType::f32, {length, hidden}, shuffled),
               tensor("positions", clm::TensorDType::i64, {length}, positions)});
  write(labels_path, {tensor("labels", clm::TensorDType::u8, {length}, labels)});

  const Run run = run_clm_fit(dir, "src-head --data " + data + " --labels " + labels_path + " --out " + out +
                                       " --epochs 40 --lr 1e-2 --seed 3");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(json_field(run.out, "rows") == static_cast<double>(scored));
  CHECK(json_field(run.out, "not_scored") == static_cast<double>(length - scored));
  CHECK(json_field(run.out, "train_auc") > 0.95);  // only right if each row got its own label
  clm::SrcHeadWeights weights;
  REQUIRE(clm::read_src_head(out, weights).ok());
  CHECK(weights.hidden == hidden);
}

TEST_CASE("clm_fit adapter --projection projects hidden states into snapshots first") {
  const TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int hidden = 12, dim = 5, rows = 300;
  const float scale = 0.3f;
  std::vector<float> samples(static_cast<std::size_t>(rows * hidden));
  for (float& v : samples) v = n(rng);
  clm::SnapshotProjectionWeights projection_weights;
  REQUIRE(clm::fit_pca(clm::ConstActivationView::f32(samples, rows, hidden), dim, projection_weights).ok());
  const std::string projection_path = dir.file("projection.safetensors");
  REQUIRE(clm::write_snapshot_projection(projection_path, projection_weights).ok());
  std::unique_ptr<clm::SnapshotProjection> projection;
  REQUIRE(clm::SnapshotProjection::create(projection_weights, projection).ok());
  std::vector<float> snapshots(static_cast<std::size_t>(rows * dim));
  REQUIRE(projection->project(clm::ConstActivationView::f32(samples, rows, hidden), snapshots).ok());
  std::vector<float> w(static_cast<std::size_t>(hidden * dim)), b(hidden),
      deltas(static_cast<std::size_t>(rows * hidden));
  for (float& v : w) v = n(rng);
  for (float& v : b) v = n(rng);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < hidden; ++o) {
      double y = b[static_cast<std::size_t>(o)];
      for (int k = 0; k < dim; ++k) {
        y += double{w[static_cast<std::size_t>(o * dim + k)]} * snapshots[static_cast<std::size_t>(r * dim + k)];
      }
      deltas[static_cast<std::size_t>(r * hidden + o)] = static_cast<float>(scale * y);
    }
  }
  const std::string data = dir.file("pairs.safetensors"), out = dir.file("adapter.safetensors");
  write(data, {tensor("hidden", clm::TensorDType::f32, {rows, hidden}, samples),
               tensor("deltas", clm::TensorDType::f32, {rows, hidden}, deltas)});

  const Run run =
      run_clm_fit(dir, "adapter --data " + data + " --projection " + projection_path + " --out " + out + " --lambda 0");
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("\"projected\":true") != std::string::npos);
  CHECK(json_field(run.out, "r2") > 1.0 - 1e-6);
  CHECK(json_field(run.out, "snapshot_dim") == dim);
  clm::SnapshotAdapterWeights fitted;
  REQUIRE(clm::read_snapshot_adapter(out, fitted).ok());
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(fitted.weight[i] == Approx(w[i]).margin(1e-3));
}

TEST_CASE("clm_fit: bad flags and bad files exit 2 and write nothing") {
  const TempDir dir;
  const std::string out = dir.file("out.safetensors");
  const std::string garbage = dir.file("garbage.safetensors");
  std::ofstream(garbage) << "this is not a safetensors file";
  const std::string one_class = dir.file("one_class.safetensors");
  const std::vector<float> features(8 * 4, 1.0f);
  const std::vector<std::uint8_t> zeros(8, 0), twos(8, 2);
  write(one_class, {tensor("features", clm::TensorDType::f32, {8, 4}, features),
                    tensor("labels", clm::TensorDType::u8, {8}, zeros)});
  const std::string bad_labels = dir.file("bad_labels.safetensors");
  write(bad_labels, {tensor("features", clm::TensorDType::f32, {8, 4}, features),
                     tensor("labels", clm::TensorDType::u8, {8}, twos)});
  const std::string samples = dir.file("samples.safetensors");
  write(samples, {tensor("samples", clm::TensorDType::f32, {8, 4}, features)});
  const std::string positioned = dir.file("positioned.safetensors"), short_labels = dir.file("short.safetensors");
  const std::vector<std::int64_t> positions = {0, 1, 2, 3, 4, 5, 6, 7};
  write(positioned, {tensor("features", clm::TensorDType::f32, {8, 4}, features),
                     tensor("positions", clm::TensorDType::i64, {8}, positions)});
  write(short_labels, {tensor("labels", clm::TensorDType::u8, {4}, std::vector<std::uint8_t>{0, 1, 0, 1})});

  const std::vector<std::string> bad_args = {
      "",
      "frobnicate --data " + one_class + " --out " + out,
      "src-head --out " + out,
      "src-head --data " + dir.file("missing.safetensors") + " --out " + out,
      "src-head --data " + garbage + " --out " + out,
      "src-head --data " + one_class + " --out " + out,
      "src-head --data " + bad_labels + " --out " + out,
      "src-head --data " + one_class + " --out " + out + " --epochs many",
      "src-head --data " + one_class + " --out " + out + " --gelu relu",
      "src-head --data " + one_class + " --out " + out + " --colour blue",
      "src-head --data " + one_class + " --out " + out + " --epochs",
      "adapter --data " + one_class + " --out " + out,             // no snapshots / deltas tensors
      "labels --tokens " + one_class + " --out " + out,            // no --n
      "labels --tokens " + one_class + " --n 2 --out " + out,      // no tokens tensor
      "projection --data " + one_class + " --out " + out,          // no --dim
      "projection --data " + one_class + " --dim 2 --out " + out,  // no samples tensor
      "projection --data " + samples + " --dim 9 --out " + out,    // more dimensions than samples allow
      "src-head --data " + one_class + " --labels " + garbage + " --out " + out,
      "src-head --data " + positioned + " --labels " + dir.file("missing.safetensors") + " --out " + out,
      "src-head --data " + positioned + " --labels " + short_labels + " --out " + out,  // positions past the end
      "adapter --data " + one_class + " --projection " + garbage + " --out " + out,
  };
  for (const std::string& args : bad_args) {
    INFO("clm_fit " << args);
    CHECK(run_clm_fit(dir, args).exit_code == 2);
    CHECK(!std::filesystem::exists(out));
  }
}
