// tests/fuzz/fuzz_snapshot_blob.cpp: libFuzzer target for the snapshot store's
// BLOB decoder (clm::decode_snapshot_blob, clm/store/snapshot_blob.hpp) on
// arbitrary bytes: the BLOB, the dim asked for and the stored checksum.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_snapshot_blob tests/fuzz/corpus/snapshot_blob
//   tests/fuzz/run.sh build-fuzz 30     (every target, on a copy of its corpus)
//
// Input: byte 0 picks the dim (the BLOB's own when even, else from byte 1);
// byte 2 whether the checksum is the BLOB's true one (so the fuzzer gets past
// it to the value checks) or the next 8 bytes; the rest is the BLOB. Checks:
// no crash or read outside the BLOB (ASan); a refusal is invalid_argument with
// a message and leaves the output untouched; an accepted BLOB has only finite
// values, and encoding them again in its format (1 or 2: two checksums) gives
// the same bytes (the 4 reserved header bytes aside: the decoder does not read
// them).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "clm/store/snapshot_blob.hpp"
#include "fuzz/fuzz_support.hpp"

namespace {

constexpr float kUntouched = -1234.5f;
constexpr std::size_t kReservedAt = 12;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::uint8_t dim_mode = data[0], dim_byte = data[1], sum_mode = data[2];
  std::span<const std::uint8_t> rest(data + 3, size - 3);
  std::uint64_t given_sum = 0;
  if (sum_mode & 1) {
    if (rest.size() < 8) return 0;
    for (int b = 0; b < 8; ++b) given_sum |= static_cast<std::uint64_t>(rest[static_cast<std::size_t>(b)]) << (8 * b);
    rest = rest.subspan(8);
  }
  const std::span<const std::uint8_t> blob = rest;
  std::int32_t dim;
  if ((dim_mode & 1) == 0 && blob.size() >= clm::kSnapshotBlobHeader) {
    dim = static_cast<std::int32_t>(blob.size() - clm::kSnapshotBlobHeader) / 2;  // what the size says
  } else {
    dim = static_cast<std::int32_t>(dim_byte) - 2;  // -2..253: bad dims too
  }
  const std::uint64_t checksum = (sum_mode & 1) ? given_sum : clm::snapshot_checksum(blob);

  // The output may be any size (a wrong one is refused): mostly dim.
  const std::size_t out_size = dim >= 1 && (dim_mode & 2) == 0 ? static_cast<std::size_t>(dim) : dim_mode % 7;
  std::vector<float> out(out_size, kUntouched);
  const clm::Status s = clm::decode_snapshot_blob(blob, dim, checksum, out);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument, "refused with {}: {}", s.code_name(), s.message());
    FUZZ_CHECK(!s.message().empty(), "refused without a message");
    for (float v : out) FUZZ_CHECK(v == kUntouched, "a refused BLOB wrote the output");
    return 0;
  }
  FUZZ_CHECK(dim >= 1 && out.size() == static_cast<std::size_t>(dim), "accepted dim {} with {} outputs", dim,
             out.size());
  FUZZ_CHECK(blob.size() == clm::kSnapshotBlobHeader + 2 * out.size(), "accepted a BLOB of {} bytes for dim {}",
             blob.size(), dim);
  FUZZ_CHECK(checksum == clm::snapshot_checksum(blob), "accepted a wrong checksum");
  for (float v : out) FUZZ_CHECK(std::isfinite(v), "accepted a value that is not finite: {}", v);
  std::vector<std::uint8_t> again;  // in the BLOB's own format (the decoder accepted it: 1 or 2)
  clm::encode_snapshot_blob(out, again, static_cast<std::uint16_t>(blob[4] | (blob[5] << 8)));
  FUZZ_CHECK(again.size() == blob.size(), "re-encoded to {} bytes from {}", again.size(), blob.size());
  std::vector<std::uint8_t> expected(blob.begin(), blob.end());
  std::memset(expected.data() + kReservedAt, 0, 4);
  FUZZ_CHECK(again == expected, "decode then encode changed the BLOB");
  return 0;
}
