// lib/store/snapshot_blob.cpp: a stored snapshot's bytes
// (clm/store/snapshot_blob.hpp): the two checksums, and the f16 decode, eight
// values an instruction where the CPU has F16C (detected once at run time:
// the library is built for any x86-64).
#include "clm/store/snapshot_blob.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "clm/detail/half.hpp"
#include "clm/store/consistent_hash.hpp"  // mix64

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CLM_BLOB_F16C 1
#endif

namespace clm {
namespace {

static_assert(std::endian::native == std::endian::little, "checksum_wordwise reads words in host order");

constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ull;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

std::uint64_t get_le(std::span<const std::uint8_t> bytes, std::size_t at, int count) {
  std::uint64_t v = 0;
  for (int b = 0; b < count; ++b) v |= static_cast<std::uint64_t>(bytes[at + static_cast<std::size_t>(b)]) << (8 * b);
  return v;
}

std::uint64_t checksum_bytewise(std::span<const std::uint8_t> blob) {
  std::uint64_t h = kFnvBasis;
  for (std::uint8_t b : blob) h = (h ^ b) * kFnvPrime;
  return h;
}

std::uint64_t checksum_wordwise(std::span<const std::uint8_t> blob) {
  std::uint64_t lane[4] = {kFnvBasis, kFnvBasis ^ 1, kFnvBasis ^ 2, kFnvBasis ^ 3};
  const std::size_t words = blob.size() / 8;
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    for (std::size_t l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, blob.data() + 8 * (i + l), 8);
      lane[l] = (lane[l] ^ w) * kFnvPrime;
    }
  }
  for (; i < words; ++i) lane[i % 4] = (lane[i % 4] ^ get_le(blob, 8 * i, 8)) * kFnvPrime;
  if (const std::size_t tail = blob.size() % 8; tail != 0) {
    lane[i % 4] = (lane[i % 4] ^ get_le(blob, 8 * i, static_cast<int>(tail))) * kFnvPrime;
  }
  std::uint64_t h = kFnvBasis;
  for (std::uint64_t l : lane) h = (h ^ l) * kFnvPrime;
  h = (h ^ static_cast<std::uint64_t>(blob.size())) * kFnvPrime;
  return mix64(h);  // a bijection: the length's fold and every lane survive it
}

// dim halves (little-endian bytes) to floats.
void halves_scalar(const std::uint8_t* src, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = detail::f16_to_f32(static_cast<std::uint16_t>(src[2 * i] | (src[2 * i + 1] << 8)));
  }
}

#ifdef CLM_BLOB_F16C
__attribute__((target("avx2,f16c"))) void halves_f16c(const std::uint8_t* src, std::size_t n, float* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  halves_scalar(src + 2 * i, n - i, out + i);
}

bool cpu_has_f16c() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // F16C by CPUID (leaf 1, ecx bit 29); AVX2 says the OS saves the YMM state.
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  return f16c && __builtin_cpu_supports("avx2");
}
#endif

void halves_to_floats(const std::uint8_t* src, std::size_t n, float* out) {
#ifdef CLM_BLOB_F16C
  static const bool f16c = cpu_has_f16c();
  if (f16c) return halves_f16c(src, n, out);
#endif
  halves_scalar(src, n, out);
}

// The first value whose f16 exponent is all ones (inf or NaN), or n.
std::size_t first_not_finite(const std::uint8_t* src, std::size_t n) {
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) any |= (src[2 * i + 1] & 0x7c) == 0x7c;  // branch-free: vectorised
  if (!any) return n;
  for (std::size_t i = 0; i < n; ++i)
    if ((src[2 * i + 1] & 0x7c) == 0x7c) return i;
  return n;
}

}  // namespace

std::uint64_t snapshot_checksum(std::span<const std::uint8_t> blob) {
  if (blob.size() >= 6 && get_le(blob, 4, 2) == kSnapshotBlobWordwise) return checksum_wordwise(blob);
  return checksum_bytewise(blob);
}

void encode_snapshot_blob(std::span<const float> vector, std::vector<std::uint8_t>& out, std::uint16_t format) {
  if (format != kSnapshotBlobBytewise) format = kSnapshotBlobWordwise;
  out.assign(kSnapshotBlobHeader + 2 * vector.size(), 0);
  auto put = [&](std::size_t at, std::uint64_t value, int bytes) {
    for (int b = 0; b < bytes; ++b) out[at + static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(value >> (8 * b));
  };
  put(0, kSnapshotBlobMagic, 4);
  put(4, format, 2);
  put(6, kSnapshotBlobF16, 2);
  put(8, vector.size(), 4);
  for (std::size_t i = 0; i < vector.size(); ++i) put(kSnapshotBlobHeader + 2 * i, detail::f32_to_f16(vector[i]), 2);
}

Status decode_snapshot_blob(std::span<const std::uint8_t> blob, std::int32_t dim, std::uint64_t checksum,
                            std::span<float> out) {
  if (dim < 1 || out.size() != static_cast<std::size_t>(dim)) {
    return invalid_argument(fmt::format("snapshot blob: dim {} with an output of {}", dim, out.size()));
  }
  const std::size_t want = kSnapshotBlobHeader + 2 * static_cast<std::size_t>(dim);
  if (blob.size() != want)
    return invalid_argument(fmt::format("snapshot blob: {} bytes, expected {}", blob.size(), want));
  if (get_le(blob, 0, 4) != kSnapshotBlobMagic) return invalid_argument("snapshot blob: bad magic");
  const std::uint64_t format = get_le(blob, 4, 2);
  if (format != kSnapshotBlobBytewise && format != kSnapshotBlobWordwise) {
    return invalid_argument(fmt::format("snapshot blob: format {}", format));
  }
  if (get_le(blob, 6, 2) != kSnapshotBlobF16) {
    return invalid_argument(fmt::format("snapshot blob: dtype {}", get_le(blob, 6, 2)));
  }
  if (get_le(blob, 8, 4) != static_cast<std::uint64_t>(dim)) {
    return invalid_argument(fmt::format("snapshot blob: dim {} where {} was expected", get_le(blob, 8, 4), dim));
  }
  if (snapshot_checksum(blob) != checksum) return invalid_argument("snapshot blob: checksum mismatch");
  const std::uint8_t* values = blob.data() + kSnapshotBlobHeader;
  if (const std::size_t bad = first_not_finite(values, out.size()); bad < out.size()) {
    return invalid_argument(fmt::format("snapshot blob: value {} is not finite", bad));
  }
  halves_to_floats(values, out.size(), out.data());
  return {};
}

}  // namespace clm
