// clm/store/snapshot_blob.hpp: the bytes of one stored snapshot, as the
// snapshot store keeps them in SQLite (docs/snapshot-store.md). A BLOB is a
// 16-byte header and the vector in f16; its 64-bit checksum over the whole
// BLOB is kept in its own column, so a flipped bit anywhere is caught.
//
//   std::vector<std::uint8_t> blob;
//   clm::encode_snapshot_blob(unit_vector, blob);          // f16, little-endian
//   const std::uint64_t sum = clm::snapshot_checksum(blob);
//   std::vector<float> back(dim);
//   CLM_RETURN_IF_ERROR(clm::decode_snapshot_blob(blob, dim, sum, back));
//
// Layout (little-endian):
//   0  u32 magic "CLMS"   4  u16 format (1 or 2)   6  u16 dtype (1 = f16)
//   8  u32 dim           12  u32 reserved (0)      16  dim x u16 f16 values
// The format names the checksum (the bytes are otherwise the same):
//   1  FNV-1a 64, byte by byte (what the store wrote until store format 4);
//   2  FNV-1a 64's step on 8-byte little-endian words (the last one padded
//      with zeros), word i into lane i % 4, the four lanes then the length
//      folded in the same way and finished with clm::mix64 (splitmix64's
//      finaliser, clm/store/consistent_hash.hpp). Every step is a bijection
//      of the state, so a change within one word always changes the
//      checksum; the lanes run in parallel (528 bytes: 33 ns, against 561 ns
//      byte by byte, on the 2-core build machine).
// encode writes format 2 unless told 1; decode reads both. decode refuses
// (invalid_argument, naming what) a short or long BLOB, a wrong magic,
// format, dtype or dim, a checksum that differs, and a value that is not
// finite; `out` is untouched then. It reads nothing outside the span: it is
// safe on any bytes (the fuzzers of issue 13 feed it). On x86-64 with F16C
// it converts eight values an instruction (lib/store/snapshot_blob.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "clm/status.hpp"

namespace clm {

inline constexpr std::uint32_t kSnapshotBlobMagic = 0x534d4c43u;             // "CLMS" read as little-endian u32
inline constexpr std::uint16_t kSnapshotBlobBytewise = 1;                    // FNV-1a 64 byte by byte
inline constexpr std::uint16_t kSnapshotBlobWordwise = 2;                    // four lanes of 8-byte words
inline constexpr std::uint16_t kSnapshotBlobFormat = kSnapshotBlobWordwise;  // what encode writes
inline constexpr std::uint16_t kSnapshotBlobF16 = 1;
inline constexpr std::size_t kSnapshotBlobHeader = 16;

// The checksum the BLOB's own format field names (bytes 4-5; format 1 for a
// BLOB too short to have one, or of another format: decode refuses those).
std::uint64_t snapshot_checksum(std::span<const std::uint8_t> blob);

// format: kSnapshotBlobWordwise or kSnapshotBlobBytewise (anything else: the default).
void encode_snapshot_blob(std::span<const float> vector, std::vector<std::uint8_t>& out,
                          std::uint16_t format = kSnapshotBlobFormat);

Status decode_snapshot_blob(std::span<const std::uint8_t> blob, std::int32_t dim, std::uint64_t checksum,
                            std::span<float> out);

}  // namespace clm
