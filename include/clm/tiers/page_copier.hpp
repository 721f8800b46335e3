// clm/tiers/page_copier.hpp: copies whole KV pages between two pools of one
// page layout: the device tier (L1) and the host tier (L2) of a tiered cache.
// Host to host is memcpy; with a pool in GPU memory it is cudaMemcpyAsync per
// run of consecutive pages on the copier's own CUDA stream, then a wait on
// that stream (so the host pages must be pinned: a host tier under a device
// pool is allocated with cudaHostAlloc, see PagedKvPoolConfig::pinned).
//
//   std::unique_ptr<clm::PageCopier> copier;
//   CLM_RETURN_IF_ERROR(clm::PageCopier::create(device_pool, host_pool, copier));
//   CLM_RETURN_IF_ERROR(copier->to_host(device_pages, host_pages));  // L1 -> L2
//   CLM_RETURN_IF_ERROR(copier->to_device(host_pages, device_pages)); // L2 -> L1
//
// Pools with MemoryKind::none hold no bytes: copies are no-ops (a replay
// counts pages, it does not move them). Thread safety: each call is
// independent (the CUDA stream is per call); page ids are checked first.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/status.hpp"

namespace clm {

class PageCopier {
 public:
  // invalid_argument when the pools' page layouts differ.
  static Status create(const PagedKvPool& device, const PagedKvPool& host, std::unique_ptr<PageCopier>& out);
  ~PageCopier();
  PageCopier(const PageCopier&) = delete;
  PageCopier& operator=(const PageCopier&) = delete;

  // host_pages[i] <- device_pages[i], all layers.
  Status to_host(std::span<const std::int32_t> device_pages, std::span<const std::int32_t> host_pages);
  // device_pages[i] <- host_pages[i].
  Status to_device(std::span<const std::int32_t> host_pages, std::span<const std::int32_t> device_pages);

 private:
  PageCopier(const PagedKvPool& device, const PagedKvPool& host) : device_(device), host_(host) {}
  Status copy(const PagedKvPool& dst, std::span<const std::int32_t> dst_pages, const PagedKvPool& src,
              std::span<const std::int32_t> src_pages);
  const PagedKvPool& device_;
  const PagedKvPool& host_;
  // GPU copies: one stream, made on the pool's device at the first copy and
  // kept; copies take turns on it (they share one PCIe link anyway).
  std::mutex stream_mutex_;
  [[maybe_unused]] void* stream_ = nullptr;  // cudaStream_t (unused in a build without CUDA)
  [[maybe_unused]] int stream_device_ = 0;
};

}  // namespace clm
