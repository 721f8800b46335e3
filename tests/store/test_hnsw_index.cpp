// The store's HNSW index saves (lib/store/hnsw_index.hpp): serialize touches
// no file (it runs under the shard lock), and what publish writes is
// hnswlib's own format: hnswlib loads it and saves it back byte for byte.
// On fresh random vectors, with deletions.
#define NO_MANUAL_VECTORIZATION 1  // as hnsw_index.cpp: no SIMD kernels of hnswlib here either

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <hnswlib/hnswlib.h>
#include <catch2/catch.hpp>

#include "store/hnsw_index.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::store_detail::HnswIndex;
using clm::store_detail::HnswParams;

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::size_t files_in(const std::filesystem::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

TEST_CASE("hnsw index: serialize writes no file, and publish writes hnswlib's format byte for byte", "[store][hnsw]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  constexpr int kDim = 24;
  for (const int rows : {0, 1, 37, 900}) {
    INFO("rows " << rows);
    HnswParams params;
    params.dim = kDim;
    std::unique_ptr<HnswIndex> index;
    REQUIRE(HnswIndex::create(params, index).ok());
    std::vector<std::vector<float>> vs;
    for (int i = 0; i < rows; ++i) {
      vs.push_back(clm_test::random_unit(rng, kDim));
      REQUIRE(index->add(vs.back(), i * 3 + 1).ok());
    }
    for (int i = 0; i < rows; i += 7) index->remove(i * 3 + 1);

    const std::filesystem::path path = dir.path() / fmt::format("t{}.hnsw", rows);
    HnswIndex::PendingSave save;
    const std::size_t before = files_in(dir.path());
    REQUIRE(index->serialize(path.string(), save).ok());
    CHECK(files_in(dir.path()) == before);  // memory only: nothing for the shard lock to wait on
    REQUIRE(HnswIndex::publish(save).ok());
    const std::string ours = read_all(path);
    CHECK(ours == save.bytes);
    CHECK(std::filesystem::exists(path.string() + ".meta"));

    // hnswlib reads it and writes it back unchanged (but an empty one: its
    // loader sets the capacity of an empty index to 0).
    hnswlib::InnerProductSpace space(kDim);
    hnswlib::HierarchicalNSW<float> theirs(&space, path.string(), false, 0);
    CHECK(theirs.cur_element_count == static_cast<std::size_t>(rows));
    if (rows > 0) {
      const std::filesystem::path again = dir.path() / fmt::format("t{}.again", rows);
      theirs.saveIndex(again.string());
      CHECK(read_all(again) == ours);
    }

    // And our loader finds every live row where it was.
    std::unique_ptr<HnswIndex> loaded;
    const clm::Status s = HnswIndex::load(path.string(), params, loaded);
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(loaded->size() == index->size());  // hnswlib's loader miscounted deletions (fixed in load)
    CHECK(loaded->deleted() == index->deleted());
    for (int i = 1; i < rows; i += 11) {
      if (i % 7 == 0) continue;
      std::vector<std::pair<float, std::int64_t>> near;
      REQUIRE(loaded->search(vs[static_cast<std::size_t>(i)], 1, 64, near).ok());
      REQUIRE(near.size() == 1);
      CHECK(near[0].second == i * 3 + 1);
    }
  }
}

TEST_CASE("hnsw index: a save of other bytes is refused and replaces nothing", "[store][hnsw]") {
  clm_test::TempDir dir;
  HnswParams params;
  params.dim = 8;
  std::unique_ptr<HnswIndex> index;
  REQUIRE(HnswIndex::create(params, index).ok());
  std::vector<float> v(8, 0.0f);
  v[0] = 1.0f;
  REQUIRE(index->add(v, 5).ok());
  HnswIndex::PendingSave save;
  const std::string path = (dir.path() / "x.hnsw").string();
  REQUIRE(index->serialize(path, save).ok());
  REQUIRE(HnswIndex::publish(save).ok());
  const std::string good = read_all(path);
  save.bytes.pop_back();  // truncated
  CHECK(HnswIndex::publish(save).code() == clm::StatusCode::internal);
  save.bytes = good;
  save.dim = 9;  // another shape
  CHECK_FALSE(HnswIndex::publish(save).ok());
  CHECK(read_all(path) == good);
  CHECK(files_in(dir.path()) == 2);  // the index and its .meta; no temporary left
}
