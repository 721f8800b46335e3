// lib/store/hnsw_index.hpp: one hnswlib HNSW index over unit vectors, as the
// snapshot store keeps one per shard and tenant. Internal (not installed):
// hnswlib's header defines non-inline functions, so only hnsw_index.cpp
// includes it, and nothing of hnswlib shows here.
//
// Similarity is the inner product (cosine over unit vectors); the distance
// function is ours, AVX2+FMA where the CPU has it (chosen at run time: the
// library runs on any x86-64), so hnswlib's own SIMD, which reads past the
// end of a vector, never runs. Labels are the database's row ids.
//
// Files: hnswlib's saveIndex format, and beside it a .meta line ("CLMHNSW1",
// dim, size, FNV-1a 64 of the index file). A save (serialize, then
// publish) writes temporary files, fsyncs them and renames them over the old
// ones; load verifies size, checksum and hnswlib's layout before hnswlib reads
// a byte, so a corrupt or truncated file is an error, never a crash. Not
// thread-safe: the store's shard lock guards each index.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clm/status.hpp"

namespace clm::store_detail {

struct HnswParams {
  std::int32_t dim = 0;
  std::int32_t m = 16;
  std::int32_t ef_construction = 200;
};

class HnswIndex {
 public:
  static Status create(const HnswParams& params, std::unique_ptr<HnswIndex>& out);
  // io_error for a missing file, invalid_argument (naming the problem) for a
  // corrupt one or one of another dimension.
  static Status load(const std::string& path, const HnswParams& params, std::unique_ptr<HnswIndex>& out);
  ~HnswIndex();

  // Saving in two steps, so that the caller's lock covers only the first:
  // serialize copies the graph into memory (what must not race with changes
  // to the index; no file is touched), publish checks the bytes whole,
  // writes them and the .meta to temporary files, fsyncs and renames both
  // (all the I/O, which needs no lock). The bytes are hnswlib's own
  // saveIndex format, byte for byte (tests/store/test_hnsw_index.cpp): a
  // save costs one copy of the index in memory while it is written.
  struct PendingSave {
    std::string path;
    std::string bytes;
    std::int32_t dim = 0;
    std::uint64_t generation = 0;  // the caller's order of serialize calls: an older save never replaces a newer
  };
  Status serialize(const std::string& path, PendingSave& out) const;
  static Status publish(const PendingSave& save);
  // Adds (or, for a label already present, replaces) a unit vector.
  Status add(std::span<const float> unit_vector, std::int64_t label);
  void remove(std::int64_t label);  // unknown labels are ignored
  // The k most similar live entries, best first: (similarity, label).
  Status search(std::span<const float> query, std::size_t k, std::size_t ef,
                std::vector<std::pair<float, std::int64_t>>& out) const;

  std::size_t size() const;        // live entries
  std::size_t deleted() const;     // entries removed but still in the graph (space a rebuild frees)
  std::int64_t max_label() const;  // -1 when empty; rows above it are not indexed

 private:
  struct Impl;
  explicit HnswIndex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The inner product of two float vectors (AVX2+FMA when the CPU has it).
float dot_product(const float* a, const float* b, std::size_t n);

}  // namespace clm::store_detail
