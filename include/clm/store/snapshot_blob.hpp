// clm/store/snapshot_blob.hpp: the bytes of one stored snapshot, as the
// snapshot store keeps them in SQLite (docs/snapshot-store.md). A BLOB is a
// 16-byte header and the vector in f16; its checksum (FNV-1a 64 over the whole
// BLOB) is kept in its own column, so a flipped bit anywhere is caught.
//
//   std::vector<std::uint8_t> blob;
//   clm::encode_snapshot_blob(unit_vector, blob);          // f16, little-endian
//   const std::uint64_t sum = clm::snapshot_checksum(blob);
//   std::vector<float> back(dim);
//   CLM_RETURN_IF_ERROR(clm::decode_snapshot_blob(blob, dim, sum, back));
//
// Layout (little-endian):
//   0  u32 magic "CLMS"   4  u16 format (1)   6  u16 dtype (1 = f16)
//   8  u32 dim           12  u32 reserved (0)  16  dim x u16 f16 values
// decode refuses (invalid_argument, naming what) a short or long BLOB, a
// wrong magic, format, dtype or dim, a checksum that differs, and a value
// that is not finite; `out` is untouched then. It reads nothing outside the
// span: it is safe on any bytes (the fuzzers of issue 13 feed it).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "clm/detail/half.hpp"
#include "clm/status.hpp"
#include "clm/store/suffix_key.hpp"  // key_fingerprint: FNV-1a 64

namespace clm {

inline constexpr std::uint32_t kSnapshotBlobMagic = 0x534d4c43u;  // "CLMS" read as little-endian u32
inline constexpr std::uint16_t kSnapshotBlobFormat = 1;
inline constexpr std::uint16_t kSnapshotBlobF16 = 1;
inline constexpr std::size_t kSnapshotBlobHeader = 16;

inline std::uint64_t snapshot_checksum(std::span<const std::uint8_t> blob) {
  return key_fingerprint(std::string_view(reinterpret_cast<const char*>(blob.data()), blob.size()));
}

inline void encode_snapshot_blob(std::span<const float> vector, std::vector<std::uint8_t>& out) {
  out.assign(kSnapshotBlobHeader + 2 * vector.size(), 0);
  auto put = [&](std::size_t at, std::uint64_t value, int bytes) {
    for (int b = 0; b < bytes; ++b) out[at + static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(value >> (8 * b));
  };
  put(0, kSnapshotBlobMagic, 4);
  put(4, kSnapshotBlobFormat, 2);
  put(6, kSnapshotBlobF16, 2);
  put(8, vector.size(), 4);
  for (std::size_t i = 0; i < vector.size(); ++i) put(kSnapshotBlobHeader + 2 * i, detail::f32_to_f16(vector[i]), 2);
}

inline Status decode_snapshot_blob(std::span<const std::uint8_t> blob, std::int32_t dim, std::uint64_t checksum,
                                   std::span<float> out) {
  auto get = [&](std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int b = 0; b < bytes; ++b) v |= static_cast<std::uint64_t>(blob[at + static_cast<std::size_t>(b)]) << (8 * b);
    return v;
  };
  if (dim < 1 || out.size() != static_cast<std::size_t>(dim)) {
    return invalid_argument(fmt::format("snapshot blob: dim {} with an output of {}", dim, out.size()));
  }
  const std::size_t want = kSnapshotBlobHeader + 2 * static_cast<std::size_t>(dim);
  if (blob.size() != want)
    return invalid_argument(fmt::format("snapshot blob: {} bytes, expected {}", blob.size(), want));
  if (get(0, 4) != kSnapshotBlobMagic) return invalid_argument("snapshot blob: bad magic");
  if (get(4, 2) != kSnapshotBlobFormat) return invalid_argument(fmt::format("snapshot blob: format {}", get(4, 2)));
  if (get(6, 2) != kSnapshotBlobF16) return invalid_argument(fmt::format("snapshot blob: dtype {}", get(6, 2)));
  if (get(8, 4) != static_cast<std::uint64_t>(dim)) {
    return invalid_argument(fmt::format("snapshot blob: dim {} where {} was expected", get(8, 4), dim));
  }
  if (snapshot_checksum(blob) != checksum) return invalid_argument("snapshot blob: checksum mismatch");
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float v = detail::f16_to_f32(static_cast<std::uint16_t>(get(kSnapshotBlobHeader + 2 * i, 2)));
    if (!std::isfinite(v)) return invalid_argument(fmt::format("snapshot blob: value {} is not finite", i));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = detail::f16_to_f32(static_cast<std::uint16_t>(get(kSnapshotBlobHeader + 2 * i, 2)));
  }
  return {};
}

}  // namespace clm
