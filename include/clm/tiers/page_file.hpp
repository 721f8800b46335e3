// clm/tiers/page_file.hpp: the stored form of ONE KV page in a storage tier
// (clm/tiers/storage_backend.hpp), the same for every backend: a fixed
// 152-byte header, then the page's bytes. A file of the file backend and a
// value of the Redis backend are exactly this, so a page is written whole or
// not at all, and one that was torn, flipped, written for another key,
// layout or model, or not signed with the deployment's secret is refused
// rather than served.
//
//   clm::PageHeaderBytes header;
//   CLM_RETURN_IF_ERROR(clm::encode_page_header(key, layout, seal, payload, header));
//   // ... store header then payload as one value; later, read it back whole:
//   std::span<const std::byte> payload_back;
//   clm::PageFault fault;
//   CLM_RETURN_IF_ERROR(clm::decode_page(value, key, layout, seal, payload_back, fault));  // points into value
//
// Header (little-endian):
//    0  8 bytes magic "CLMKVPG1"     8  u32 format (3)       12  32 bytes PageKey
//   44  i32 page_size               48  i32 num_layers      52  i32 kv_heads
//   56  i32 head_dim                60  u32 dtype (KvDType)  64  u64 payload bytes
//   72  32 bytes model digest (PageSeal::model)             104  u32 flags (bit 0: signed)
//  108  u32 0                      112  12 bytes nonce, 124  16 bytes tag
//  140  u32 0                      144  u64 checksum         152  payload
// The nonce and tag are the page's signature (PageSigner, page_seal.hpp;
// zeros when unsigned): tag = AES-256-GMAC under the page's own key, over
// header bytes 0..112 || payload (the key, the layout, the model, the flags
// and every payload byte).
// checksum = fast_checksum(payload, seed = fast_checksum(header bytes 0..144)):
// a cheap check for torn and flipped pages, run first, with no copy of the
// payload. A reader refuses: other formats (1: no model; 2: HMAC-SHA256
// signatures), another model's digest, an unsigned page when it has a
// secret, a signed one when it has none, and a wrong signature.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "clm/detail/fast_checksum.hpp"
#include "clm/status.hpp"
#include "clm/tiers/page_key.hpp"
#include "clm/tiers/page_seal.hpp"
#include "clm/tiers/storage_backend.hpp"

namespace clm {

inline constexpr std::array<char, 8> kPageMagic = {'C', 'L', 'M', 'K', 'V', 'P', 'G', '1'};
inline constexpr std::uint32_t kPageFormat = 3;
inline constexpr std::size_t kPageHeaderSize = 152;
inline constexpr std::size_t kPageModelOffset = 72;
inline constexpr std::size_t kPageFlagsOffset = 104;
inline constexpr std::size_t kPageMacOffset = 112;
inline constexpr std::size_t kPageChecksumOffset = 144;
inline constexpr std::uint32_t kPageFlagSigned = 1;
static_assert(kPageMacOffset + sizeof(PageSignature) + 4 == kPageChecksumOffset);

// Why a stored value was refused, for the backends' counts (StorageStats).
enum class PageFault : std::uint8_t {
  none = 0,
  damaged,        // short, torn, flipped, another key or layout, bad magic or format
  foreign_model,  // written for another model (PageSeal::model)
  unsigned_page,  // not signed, where this reader has a secret
  forged,         // signed, but not with this reader's secret (or it has none)
};
// No page is larger (a Redis value holds at most 512 MiB): a layout that asks
// for more is a mistake, and page_bytes() must not overflow.
inline constexpr std::size_t kMaxPageBytes = std::size_t{1} << 30;

using PageHeaderBytes = std::array<std::byte, kPageHeaderSize>;

namespace page_file_detail {
inline void put_le(std::byte* at, std::uint64_t value, int bytes) {
  for (int b = 0; b < bytes; ++b) at[b] = static_cast<std::byte>(value >> (8 * b));
}
inline std::uint64_t get_le(const std::byte* at, int bytes) {
  std::uint64_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<std::uint64_t>(at[b]) << (8 * b);
  return v;
}
inline std::uint64_t checksum(std::span<const std::byte> header, std::span<const std::byte> payload) {
  const std::uint64_t header_sum = detail::fast_checksum(header.data(), kPageChecksumOffset);
  return detail::fast_checksum(payload.data(), payload.size(), header_sum);
}
}  // namespace page_file_detail

// invalid_argument, naming the field, for a layout no page can have: a field
// below 1, an unknown dtype, or pages over kMaxPageBytes.
inline Status check_page_layout(const PageLayout& layout) {
  const std::pair<const char*, std::int32_t> fields[] = {{"page_size", layout.page_size},
                                                         {"num_layers", layout.num_layers},
                                                         {"kv_heads", layout.kv_heads},
                                                         {"head_dim", layout.head_dim}};
  for (const auto& [name, value] : fields) {
    if (value < 1) return invalid_argument(fmt::format("page layout: {} is {}, must be at least 1", name, value));
  }
  if (layout.dtype != KvDType::f32 && layout.dtype != KvDType::f16 && layout.dtype != KvDType::bf16) {
    return invalid_argument(fmt::format("page layout: unknown dtype {}", static_cast<int>(layout.dtype)));
  }
  // Multiplied in steps against the cap, so no product overflows.
  std::size_t bytes = 2 * kv_dtype_bytes(layout.dtype);
  for (const auto& [name, value] : fields) {
    if (static_cast<std::size_t>(value) > kMaxPageBytes / bytes) {
      return invalid_argument(fmt::format("page layout: pages over {} bytes", kMaxPageBytes));
    }
    bytes *= static_cast<std::size_t>(value);
  }
  return {};
}

// The header of `payload` stored under `key`, sealed with `seal`. internal
// only when libcrypto fails to sign (out of memory); `out` is untouched then.
inline Status encode_page_header(const PageKey& key, const PageLayout& layout, const PageSeal& seal,
                                 std::span<const std::byte> payload, PageHeaderBytes& out) {
  using page_file_detail::put_le;
  PageHeaderBytes h{};
  std::memcpy(h.data(), kPageMagic.data(), kPageMagic.size());
  put_le(h.data() + 8, kPageFormat, 4);
  std::memcpy(h.data() + 12, key.bytes.data(), key.bytes.size());
  put_le(h.data() + 44, static_cast<std::uint32_t>(layout.page_size), 4);
  put_le(h.data() + 48, static_cast<std::uint32_t>(layout.num_layers), 4);
  put_le(h.data() + 52, static_cast<std::uint32_t>(layout.kv_heads), 4);
  put_le(h.data() + 56, static_cast<std::uint32_t>(layout.head_dim), 4);
  put_le(h.data() + 60, static_cast<std::uint32_t>(layout.dtype), 4);
  put_le(h.data() + 64, payload.size(), 8);
  std::memcpy(h.data() + kPageModelOffset, seal.model.data(), seal.model.size());
  if (seal.signer) {
    put_le(h.data() + kPageFlagsOffset, kPageFlagSigned, 4);
    PageSignature signature;
    CLM_RETURN_IF_ERROR(seal.signer->sign(std::span(h).first(kPageMacOffset), payload, signature));
    std::memcpy(h.data() + kPageMacOffset, signature.data(), signature.size());
  }
  put_le(h.data() + kPageChecksumOffset, page_file_detail::checksum(h, payload), 8);
  out = h;
  return {};
}

// Checks a header (exactly kPageHeaderSize bytes) against the key, layout and
// seal expected, everything but the checksum and the signature: for a reader
// that reads the header and the payload separately (the file backend reads
// the payload straight into the caller's buffer) and then calls
// check_page_body. `fault` says why a header was refused.
inline Status check_page_header(std::span<const std::byte> header, const PageKey& expected_key,
                                const PageLayout& expected_layout, const PageSeal& seal, PageFault& fault) {
  using page_file_detail::get_le;
  fault = PageFault::damaged;
  if (header.size() != kPageHeaderSize) {
    return invalid_argument(fmt::format("page: header of {} bytes, expected {}", header.size(), kPageHeaderSize));
  }
  if (std::memcmp(header.data(), kPageMagic.data(), kPageMagic.size()) != 0) {
    return invalid_argument("page: bad magic (not a clmcache page)");
  }
  if (const std::uint64_t format = get_le(header.data() + 8, 4); format != kPageFormat) {
    return invalid_argument(fmt::format("page: format {}, expected {}{}", format, kPageFormat,
                                        format == 1   ? " (format 1 pages name no model)"
                                        : format == 2 ? " (format 2 pages are signed with HMAC-SHA256)"
                                                      : ""));
  }
  if (std::memcmp(header.data() + 12, expected_key.bytes.data(), expected_key.bytes.size()) != 0) {
    return invalid_argument("page: stored under another key");
  }
  const std::pair<const char*, std::int64_t> fields[] = {{"page_size", expected_layout.page_size},
                                                         {"num_layers", expected_layout.num_layers},
                                                         {"kv_heads", expected_layout.kv_heads},
                                                         {"head_dim", expected_layout.head_dim},
                                                         {"dtype", static_cast<std::int64_t>(expected_layout.dtype)}};
  for (std::size_t i = 0; i < std::size(fields); ++i) {
    const auto stored = static_cast<std::int64_t>(
        static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(header.data() + 44 + 4 * i, 4))));
    if (stored != fields[i].second) {
      return invalid_argument(
          fmt::format("page: {} {} where {} was expected", fields[i].first, stored, fields[i].second));
    }
  }
  const std::uint64_t payload_bytes = get_le(header.data() + 64, 8);
  if (payload_bytes != expected_layout.page_bytes()) {
    return invalid_argument(
        fmt::format("page: {} payload bytes where the layout has {}", payload_bytes, expected_layout.page_bytes()));
  }
  const std::uint64_t flags = get_le(header.data() + kPageFlagsOffset, 4);
  if ((flags & ~std::uint64_t{kPageFlagSigned}) != 0 || get_le(header.data() + kPageFlagsOffset + 4, 4) != 0 ||
      get_le(header.data() + kPageMacOffset + sizeof(PageSignature), 4) != 0) {
    return invalid_argument(fmt::format("page: unknown flags {:#x}, or reserved bytes set", flags));
  }
  if (std::memcmp(header.data() + kPageModelOffset, seal.model.data(), seal.model.size()) != 0) {
    fault = PageFault::foreign_model;
    return invalid_argument("page: written for another model");
  }
  const bool is_signed = (flags & kPageFlagSigned) != 0;
  if (seal.signer && !is_signed) {
    fault = PageFault::unsigned_page;
    return invalid_argument("page: not signed, and this reader requires signed pages");
  }
  if (!seal.signer && is_signed) {
    fault = PageFault::forged;
    return invalid_argument("page: signed, and this reader has no secret to check it");
  }
  fault = PageFault::none;
  return {};
}

// Whether a header that check_page_header passed belongs with `payload`: its
// checksum, then (with a secret) its signature, compared in constant time.
inline Status check_page_body(std::span<const std::byte> header, std::span<const std::byte> payload,
                              const PageSeal& seal, PageFault& fault) {
  fault = PageFault::damaged;
  if (header.size() != kPageHeaderSize) return invalid_argument("page: header of the wrong size");
  const std::uint64_t stored = page_file_detail::get_le(header.data() + kPageChecksumOffset, 8);
  if (page_file_detail::checksum(header, payload) != stored) return invalid_argument("page: checksum mismatch");
  if (seal.signer) {
    bool matches = false;
    CLM_RETURN_IF_ERROR(seal.signer->verify(header.first(kPageMacOffset), payload,
                                            header.subspan(kPageMacOffset, sizeof(PageSignature)), matches));
    if (!matches) {
      fault = PageFault::forged;
      return invalid_argument("page: signature mismatch (forged, or signed with another secret)");
    }
  }
  fault = PageFault::none;
  return {};
}

// Checks a whole stored value (header + payload) and points `payload` at its
// payload. invalid_argument naming what is wrong: short or long value, magic,
// format, key, layout field, payload size, model, flags, checksum, signature;
// `payload` is untouched then and `fault` says why. Reads nothing outside
// `value`: safe on any bytes.
inline Status decode_page(std::span<const std::byte> value, const PageKey& expected_key,
                          const PageLayout& expected_layout, const PageSeal& seal, std::span<const std::byte>& payload,
                          PageFault& fault) {
  fault = PageFault::damaged;
  if (value.size() < kPageHeaderSize) {
    return invalid_argument(
        fmt::format("page: {} bytes, shorter than its {}-byte header", value.size(), kPageHeaderSize));
  }
  const std::span<const std::byte> header = value.first(kPageHeaderSize);
  CLM_RETURN_IF_ERROR(check_page_header(header, expected_key, expected_layout, seal, fault));
  const std::size_t want = kPageHeaderSize + expected_layout.page_bytes();
  if (value.size() != want) {
    fault = PageFault::damaged;
    return invalid_argument(fmt::format("page: {} bytes, expected {}", value.size(), want));
  }
  const std::span<const std::byte> body = value.subspan(kPageHeaderSize);
  CLM_RETURN_IF_ERROR(check_page_body(header, body, seal, fault));
  payload = body;
  return {};
}

}  // namespace clm
