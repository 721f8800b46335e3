// lib/tiers/storage_backends.hpp: the backends open_storage_backend
// (storage_url.cpp) dispatches to, each in its own file. Internal to
// clmcache_core: hosts open a backend by URL.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "clm/status.hpp"
#include "clm/tiers/page_file.hpp"
#include "clm/tiers/storage_backend.hpp"
#include "clm/tiers/storage_url.hpp"

namespace clm::tiers_detail {

// StorageStats kept by concurrent calls.
struct StorageCounters {
  std::atomic<std::uint64_t> pages_read{0}, pages_written{0}, pages_checked{0}, pages_missing{0}, corrupt_pages{0},
      foreign_model_pages{0}, unsigned_pages{0}, forged_pages{0}, repaired_pages{0}, errors{0}, dropped_writes{0},
      evicted_pages{0}, bytes_read{0}, bytes_written{0};

  // One refused value, by why (page_file.hpp).
  void count_refusal(PageFault fault) {
    corrupt_pages.fetch_add(1, std::memory_order_relaxed);
    if (fault == PageFault::foreign_model) foreign_model_pages.fetch_add(1, std::memory_order_relaxed);
    if (fault == PageFault::unsigned_page) unsigned_pages.fetch_add(1, std::memory_order_relaxed);
    if (fault == PageFault::forged) forged_pages.fetch_add(1, std::memory_order_relaxed);
  }

  StorageStats load() const {
    StorageStats s;
    s.pages_read = pages_read.load(std::memory_order_relaxed);
    s.pages_written = pages_written.load(std::memory_order_relaxed);
    s.pages_checked = pages_checked.load(std::memory_order_relaxed);
    s.pages_missing = pages_missing.load(std::memory_order_relaxed);
    s.corrupt_pages = corrupt_pages.load(std::memory_order_relaxed);
    s.foreign_model_pages = foreign_model_pages.load(std::memory_order_relaxed);
    s.unsigned_pages = unsigned_pages.load(std::memory_order_relaxed);
    s.forged_pages = forged_pages.load(std::memory_order_relaxed);
    s.repaired_pages = repaired_pages.load(std::memory_order_relaxed);
    s.errors = errors.load(std::memory_order_relaxed);
    s.dropped_writes = dropped_writes.load(std::memory_order_relaxed);
    s.evicted_pages = evicted_pages.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read.load(std::memory_order_relaxed);
    s.bytes_written = bytes_written.load(std::memory_order_relaxed);
    return s;
  }
};

// invalid_argument unless the spans of one batched call agree: one flag and
// one page pointer per key.
inline Status check_batch(std::string_view what, std::size_t keys, std::size_t flags, std::size_t pages) {
  if (flags != keys) return invalid_argument(fmt::format("{}: {} keys but {} flags", what, keys, flags));
  if (pages != keys) return invalid_argument(fmt::format("{}: {} keys but {} pages", what, keys, pages));
  return {};
}

// Runs `body`, turning an allocation failure into out_of_memory: nothing
// throws out of a backend.
template <typename Body>
Status guard_alloc(std::string_view what, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("{}: out of memory", what));
  }
}

// file_backend.cpp: creates the directory when missing; io_error when it
// cannot be created or written.
Status open_file_backend(const StorageUrl& parsed, std::string url, const PageLayout& layout, const PageSeal& seal,
                         std::unique_ptr<StorageBackend>& out);

// redis_backend.cpp: connects lazily (the server may be down at open).
Status open_redis_backend(const StorageUrl& parsed, std::string url, const PageLayout& layout, const PageSeal& seal,
                          std::unique_ptr<StorageBackend>& out);

}  // namespace clm::tiers_detail
