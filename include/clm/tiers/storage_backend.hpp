// clm/tiers/storage_backend.hpp: the storage tier (L3) of the tiered KV cache:
// a place outside the process that keeps whole KV pages by PageKey, shared by
// every instance pointed at it (docs/tiers.md).
//
//   clm::PageLayout layout = clm::PageLayout::of(pool.config());
//   clm::PageSeal seal;                                  // page_seal.hpp: model id, secret
//   CLM_RETURN_IF_ERROR(clm::PageSeal::create(model_id, secret, seal));
//   std::unique_ptr<clm::StorageBackend> storage;
//   CLM_RETURN_IF_ERROR(clm::open_storage_backend("redis://127.0.0.1:6379/0?prefix=clm:&ttl=3600",
//                                                 layout, seal, storage));
//   std::vector<std::uint8_t> found(keys.size());
//   CLM_RETURN_IF_ERROR(storage->exists(keys, found));
//   CLM_RETURN_IF_ERROR(storage->get_pages(keys, page_pointers, found));  // one per key
//
// URLs:
//   file:///var/cache/clm?capacity_mb=4096     one checksummed file per page;
//                                              the least recently used go past the cap
//                                              (8192 unless given; 0 = no cap)
//   redis://host:port/db?prefix=clm:&ttl=3600&timeout_ms=200
//                                              hiredis, pipelined (ttl 86400 unless
//                                              given; 0 = no expiry)
//
// Every page value is self-describing: a header (magic, format, the key, the
// layout, payload size, the model, the signature, a checksum of header and
// payload; page_file.hpp) and the payload, in
// ONE file or ONE Redis value, so a half-written or foreign page is never
// read as a page: get() reports it as not found (and counts it in
// StorageStats::corrupt_pages), never fills the buffer with it, and deletes
// it (StorageStats::repaired_pages): exists() would count it as stored, and
// the tier would never store that page again.
//
// Thread safety: every method may be called from several threads at once (the
// tier's workers do). Calls block on I/O; the Engine never calls them under
// its lock. A backend that cannot be reached returns io_error from each call
// (quickly, after its connect timeout) and serves again once it is back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"
#include "clm/tiers/page_key.hpp"
#include "clm/tiers/page_seal.hpp"

namespace clm {

// What a page's bytes mean: pages of another layout are never served.
struct PageLayout {
  std::int32_t page_size = 0;
  std::int32_t num_layers = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  KvDType dtype = KvDType::f16;

  static PageLayout of(const PagedKvPoolConfig& c) {
    return {c.page_size, c.num_layers, c.kv_heads, c.head_dim, c.dtype};
  }
  // Bytes of one page: 2 (K and V) * page_size * kv_heads * head_dim * num_layers * dtype bytes.
  std::size_t page_bytes() const {
    return 2 * static_cast<std::size_t>(page_size) * static_cast<std::size_t>(kv_heads) *
           static_cast<std::size_t>(head_dim) * static_cast<std::size_t>(num_layers) * kv_dtype_bytes(dtype);
  }
  bool operator==(const PageLayout&) const = default;
};

struct StorageStats {
  std::uint64_t pages_read = 0;           // pages get() returned
  std::uint64_t pages_written = 0;        // pages set() stored
  std::uint64_t pages_checked = 0;        // keys exists() was asked about
  std::uint64_t pages_missing = 0;        // keys get() or exists() did not find
  std::uint64_t corrupt_pages = 0;        // values refused: bad magic, key, layout, size, checksum, model or signature
  std::uint64_t foreign_model_pages = 0;  // ... of them written for another model
  std::uint64_t unsigned_pages = 0;       // ... not signed, where this instance has a secret
  std::uint64_t forged_pages = 0;         // ... with a signature this instance's secret does not make
  std::uint64_t repaired_pages = 0;       // refused values the backend deleted, so the next store writes them again
  std::uint64_t errors = 0;               // calls that failed (connection, I/O)
  std::uint64_t dropped_writes = 0;       // pages set() could not store (disk full, no permission)
  std::uint64_t evicted_pages = 0;        // pages the backend removed for its size cap
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
};

class StorageBackend {
 public:
  virtual ~StorageBackend() = default;

  // found[i] = 1 when a page is stored under keys[i] (a value that get()
  // would then refuse still counts: exists() does not read it).
  virtual Status exists(std::span<const PageKey> keys, std::span<std::uint8_t> found) = 0;

  // Reads the pages of `keys` into pages[i] (page_bytes of host memory each:
  // a host-tier page, read in place). found[i] = 1 for a page read and
  // verified; 0 for a missing or refused one, whose bytes are unspecified.
  // io_error when the backend cannot be asked at all.
  virtual Status get_pages(std::span<const PageKey> keys, std::span<std::byte* const> pages,
                           std::span<std::uint8_t> found) = 0;

  // Stores pages[i] (page_bytes each) under keys[i]. written[i] = 1 for each
  // page stored (a page whose write failed, e.g. on a full disk, is 0 and
  // counted in dropped_writes; the call still succeeds). io_error when the
  // backend cannot be asked at all.
  virtual Status set_pages(std::span<const PageKey> keys, std::span<const std::byte* const> pages,
                           std::span<std::uint8_t> written) = 0;

  // The same over one buffer of keys.size() consecutive pages.
  Status get(std::span<const PageKey> keys, std::span<std::byte> buffer, std::span<std::uint8_t> found) {
    std::vector<std::byte*> pages;
    CLM_RETURN_IF_ERROR(split_buffer("storage get", keys.size(), buffer, pages));
    return get_pages(keys, pages, found);
  }
  Status set(std::span<const PageKey> keys, std::span<const std::byte> buffer, std::span<std::uint8_t> written) {
    std::vector<std::byte*> pages;
    CLM_RETURN_IF_ERROR(
        split_buffer("storage set", keys.size(), {const_cast<std::byte*>(buffer.data()), buffer.size()}, pages));
    return set_pages(keys, std::span<const std::byte* const>(pages.data(), pages.size()), written);
  }

  virtual const PageLayout& layout() const = 0;
  // The model and secret its pages are written and checked with.
  virtual const PageSeal& seal() const = 0;
  virtual StorageStats stats() const = 0;
  // The URL it was opened with (for logs and metrics).
  virtual const std::string& url() const = 0;

 private:
  Status split_buffer(const char* what, std::size_t keys, std::span<std::byte> buffer,
                      std::vector<std::byte*>& pages) const {
    const std::size_t page = layout().page_bytes();
    if (buffer.size() != keys * page) {
      return invalid_argument(
          fmt::format("{}: a buffer of {} bytes for {} pages of {} bytes", what, buffer.size(), keys, page));
    }
    pages.resize(keys);
    for (std::size_t i = 0; i < keys; ++i) pages[i] = buffer.data() + i * page;
    return {};
  }
};

// Opens the backend a URL names (see above), for pages of `layout` sealed
// with `seal` (written with it; read only when they carry it).
// invalid_argument for a URL that does not parse (unknown scheme, bad port,
// unknown or malformed option); io_error for a directory that cannot be
// created or written. A Redis server that is down is NOT an error here: the
// backend connects lazily, and its calls report io_error until it is up.
Status open_storage_backend(std::string_view url, const PageLayout& layout, const PageSeal& seal,
                            std::unique_ptr<StorageBackend>& out);

}  // namespace clm
