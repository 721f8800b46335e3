// clm/cache/paged_kv_pool.hpp: a fixed budget of KV pages with O(1) alloc/free and
// reference counts.
//
// A page holds the K and V of `page_size` consecutive tokens for every layer.
// Page ids are int32 in [0, num_pages). Allocation is all-or-nothing: when the
// pool is short, nothing is taken and StatusCode::out_of_memory is returned.
//
//   clm::PagedKvPoolConfig config;
//   config.num_pages = 4096; config.page_size = 16;
//   config.num_layers = 32; config.kv_heads = 8; config.head_dim = 128;
//   config.dtype = clm::KvDType::bf16;
//   std::unique_ptr<clm::PagedKvPool> pool;
//   CLM_RETURN_IF_ERROR(clm::PagedKvPool::create(config, pool));
//   int32_t pages[4];
//   CLM_RETURN_IF_ERROR(pool->allocate(pages));     // ref count 1 each
//   void* k = pool->k_data(pages[0], /*layer=*/3);   // NHD rows, see below
//   CLM_RETURN_IF_ERROR(pool->release(pages));      // back to the free list
//
// Byte layout (host and device alike), so that a host's kernels can address
// the pages themselves. Let E = bytes per element, T = page_size,
// H = kv_heads, D = head_dim:
//
//   page p starts at     data() + p * page_bytes()
//   layer l of page p at page + l * layer_bytes(),  layer_bytes() = 2*T*H*D*E
//   K of layer l          at layer + 0             [T][H][D]  (NHD rows)
//   V of layer l          at layer + T*H*D*E       [T][H][D]
//   token slot t, head h: K at layer + ((t*H + h)*D) * E
//
// Per layer this is FlashInfer's paged NHD layout [num_pages][2][T][H][D] with
// a page stride of page_bytes() instead of layer_bytes().
//
// Not thread-safe: the Engine serialises access (see engine.hpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/device/device_memory.hpp"
#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"

namespace clm {

struct PagedKvPoolConfig {
  std::int32_t num_pages = 0;
  std::int32_t page_size = 16;  // tokens per page
  std::int32_t num_layers = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 128;
  KvDType dtype = KvDType::f16;
  MemoryKind memory = MemoryKind::host;
  int device = 0;  // CUDA device for MemoryKind::device
  // MemoryKind::host only: page-locked (cudaHostAlloc), so that copies to and
  // from a GPU are asynchronous DMA (a host tier under a device pool).
  bool pinned = false;
};

class PagedKvPool {
 public:
  static Status create(const PagedKvPoolConfig& config, std::unique_ptr<PagedKvPool>& out) {
    CLM_RETURN_IF_ERROR(validate(config));
    std::unique_ptr<PagedKvPool> pool(new PagedKvPool(config));
    CLM_RETURN_IF_ERROR(pool->allocate_storage());
    out = std::move(pool);
    return {};
  }

  ~PagedKvPool() {
    if (config_.memory == MemoryKind::device) {
      device_free(data_, config_.device);
    } else if (config_.pinned) {
      pinned_host_free(data_);
    } else {
      std::free(data_);
    }
  }
  PagedKvPool(const PagedKvPool&) = delete;
  PagedKvPool& operator=(const PagedKvPool&) = delete;

  // ---- allocation ---------------------------------------------------------
  // Takes out.size() pages, each with reference count 1, or none at all.
  Status allocate(std::span<std::int32_t> out) {
    const std::size_t count = out.size();
    if (count > free_count_) {
      return out_of_memory(
          fmt::format("KV pool exhausted: {} pages asked, {} free of {}", count, free_count_, free_stack_.size()));
    }
    const std::int32_t* top = free_stack_.data() + (free_count_ - count);
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = top[i];
      ref_counts_[static_cast<std::size_t>(top[i])] = 1;
    }
    free_count_ -= count;
    return {};
  }

  // Adds one reference to each page (all must be allocated).
  Status retain(std::span<const std::int32_t> pages) {
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (!is_allocated(pages[i])) {
        undo_retain(pages.first(i));
        return invalid_argument(fmt::format("retain: page {} is not allocated", pages[i]));
      }
      ++ref_counts_[static_cast<std::size_t>(pages[i])];
    }
    return {};
  }

  // Drops one reference from each page; a page whose count reaches 0 returns
  // to the free list. Atomic: an invalid id (or one released more often than
  // it was held, within this call) changes nothing.
  Status release(std::span<const std::int32_t> pages) {
    const std::size_t free_before = free_count_;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (!is_allocated(pages[i])) {
        undo_release(pages.first(i));
        free_count_ = free_before;  // the pages freed so far are held again
        return invalid_argument(
            fmt::format("release: page {} is not allocated (freed twice, or never allocated)", pages[i]));
      }
      if (--ref_counts_[static_cast<std::size_t>(pages[i])] == 0) free_stack_[free_count_++] = pages[i];
    }
    return {};
  }

  // ---- counts ---------------------------------------------------------------
  std::int32_t num_pages() const { return config_.num_pages; }
  std::int32_t page_size() const { return config_.page_size; }
  std::int32_t free_pages() const { return static_cast<std::int32_t>(free_count_); }
  std::int32_t used_pages() const { return config_.num_pages - free_pages(); }
  std::int32_t ref_count(std::int32_t page) const {
    return valid_id(page) ? ref_counts_[static_cast<std::size_t>(page)] : 0;
  }
  bool valid_id(std::int32_t page) const { return page >= 0 && page < config_.num_pages; }
  bool is_allocated(std::int32_t page) const {
    return valid_id(page) && ref_counts_[static_cast<std::size_t>(page)] > 0;
  }

  // ---- bytes ----------------------------------------------------------------
  const PagedKvPoolConfig& config() const { return config_; }
  std::size_t element_bytes() const { return kv_dtype_bytes(config_.dtype); }
  std::size_t block_bytes() const {  // one of K or V, one layer, one page
    return static_cast<std::size_t>(config_.page_size) * config_.kv_heads * config_.head_dim * element_bytes();
  }
  std::size_t layer_bytes() const { return 2 * block_bytes(); }
  std::size_t page_bytes() const { return layer_bytes() * static_cast<std::size_t>(config_.num_layers); }
  std::size_t storage_bytes() const {
    return config_.memory == MemoryKind::none ? 0 : page_bytes() * static_cast<std::size_t>(config_.num_pages);
  }
  // Null when the pool keeps no KV bytes (MemoryKind::none).
  void* data() const { return data_; }
  void* page_data(std::int32_t page) const { return offset(page, 0); }
  void* k_data(std::int32_t page, std::int32_t layer) const {
    return offset(page, static_cast<std::size_t>(layer) * layer_bytes());
  }
  void* v_data(std::int32_t page, std::int32_t layer) const {
    return offset(page, static_cast<std::size_t>(layer) * layer_bytes() + block_bytes());
  }

  // Bytes of bookkeeping (reference counts and the free list), not KV.
  std::size_t metadata_bytes() const {
    return ref_counts_.capacity() * sizeof(std::int32_t) + free_stack_.capacity() * sizeof(std::int32_t);
  }

 private:
  explicit PagedKvPool(const PagedKvPoolConfig& config)
      : config_(config),
        ref_counts_(static_cast<std::size_t>(config.num_pages), 0),
        free_stack_(static_cast<std::size_t>(config.num_pages)),
        free_count_(static_cast<std::size_t>(config.num_pages)) {
    // Low ids on top, so a fresh pool hands out 0, 1, 2, ...
    for (std::size_t i = 0; i < free_count_; ++i) {
      free_stack_[i] = static_cast<std::int32_t>(free_count_ - 1 - i);
    }
  }

  static Status validate(const PagedKvPoolConfig& c) {
    if (c.num_pages <= 0) return invalid_argument(fmt::format("num_pages must be > 0, got {}", c.num_pages));
    constexpr std::int32_t kMaxDimension = 1 << 16;  // far beyond any model; keeps products in range
    if (c.page_size <= 0 || c.page_size > kMaxDimension) {
      return invalid_argument(fmt::format("page_size must be in [1, {}], got {}", kMaxDimension, c.page_size));
    }
    if (c.num_layers <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.num_layers > kMaxDimension ||
        c.kv_heads > kMaxDimension || c.head_dim > kMaxDimension) {
      return invalid_argument(fmt::format("num_layers, kv_heads and head_dim must be in [1, {}], got {}, {}, {}",
                                          kMaxDimension, c.num_layers, c.kv_heads, c.head_dim));
    }
    if (c.dtype != KvDType::f32 && c.dtype != KvDType::f16 && c.dtype != KvDType::bf16) {
      return invalid_argument("unknown KV dtype");
    }
    if (c.memory != MemoryKind::none && c.memory != MemoryKind::host && c.memory != MemoryKind::device) {
      return invalid_argument("unknown memory kind");
    }
    // page_bytes * num_pages must fit in size_t.
    const double bytes = 2.0 * c.page_size * c.kv_heads * c.head_dim * static_cast<double>(kv_dtype_bytes(c.dtype)) *
                         c.num_layers * c.num_pages;
    if (c.memory != MemoryKind::none && bytes > static_cast<double>(std::numeric_limits<std::size_t>::max() / 2)) {
      return invalid_argument("pool size overflows");
    }
    return {};
  }

  Status allocate_storage() {
    const std::size_t bytes = storage_bytes();
    if (config_.memory == MemoryKind::host && config_.pinned) {
      CLM_RETURN_IF_ERROR(pinned_host_allocate(bytes, &data_));
    } else if (config_.memory == MemoryKind::host) {
      constexpr std::size_t kAlign = 256;
      data_ = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
      if (!data_) return out_of_memory(fmt::format("cannot allocate {} bytes of host KV memory", bytes));
    } else if (config_.memory == MemoryKind::device) {
      CLM_RETURN_IF_ERROR(device_allocate(bytes, config_.device, &data_));
    }
    return {};
  }

  void* offset(std::int32_t page, std::size_t within) const {
    if (!data_) return nullptr;
    return static_cast<char*>(data_) + static_cast<std::size_t>(page) * page_bytes() + within;
  }
  void undo_retain(std::span<const std::int32_t> done) {
    for (std::int32_t page : done) --ref_counts_[static_cast<std::size_t>(page)];
  }
  void undo_release(std::span<const std::int32_t> done) {
    for (std::int32_t page : done) ++ref_counts_[static_cast<std::size_t>(page)];
  }

  PagedKvPoolConfig config_;
  std::vector<std::int32_t> ref_counts_;
  std::vector<std::int32_t> free_stack_;  // [0, free_count_) are free page ids
  std::size_t free_count_;
  void* data_ = nullptr;
};

}  // namespace clm
