// PageCopier: memcpy between host pools, cudaMemcpyAsync when a pool is on a GPU.
#include "clm/tiers/page_copier.hpp"

#include <cstring>

#include <fmt/format.h>

#if CLM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "device/device_guard.hpp"  // cuda/: the one guard of the thread's current device
#endif

namespace clm {

Status PageCopier::create(const PagedKvPool& device, const PagedKvPool& host, std::unique_ptr<PageCopier>& out) {
  if (device.page_bytes() != host.page_bytes() || device.page_size() != host.page_size() ||
      device.config().dtype != host.config().dtype) {
    return invalid_argument(fmt::format("page copier: page layouts differ ({} and {} bytes a page)",
                                        device.page_bytes(), host.page_bytes()));
  }
  if (host.config().memory == MemoryKind::device) return invalid_argument("page copier: the host tier is on a GPU");
  out.reset(new PageCopier(device, host));
  return {};
}

PageCopier::~PageCopier() {
#if CLM_HAVE_CUDA
  if (stream_) {
    cuda::detail::DeviceGuard guard;
    if (guard.enter_device(stream_device_) == cudaSuccess) {
      cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    }
  }
#endif
}

Status PageCopier::to_host(std::span<const std::int32_t> device_pages, std::span<const std::int32_t> host_pages) {
  return copy(host_, host_pages, device_, device_pages);
}

Status PageCopier::to_device(std::span<const std::int32_t> host_pages, std::span<const std::int32_t> device_pages) {
  return copy(device_, device_pages, host_, host_pages);
}

Status PageCopier::copy(const PagedKvPool& dst, std::span<const std::int32_t> dst_pages, const PagedKvPool& src,
                        std::span<const std::int32_t> src_pages) {
  if (dst_pages.size() != src_pages.size()) {
    return invalid_argument(
        fmt::format("page copy: {} destination pages for {} sources", dst_pages.size(), src_pages.size()));
  }
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {
    if (!dst.valid_id(dst_pages[i]) || !src.valid_id(src_pages[i])) {
      return invalid_argument(fmt::format("page copy: page {} -> {} is outside a pool", src_pages[i], dst_pages[i]));
    }
  }
  if (dst.config().memory == MemoryKind::none || src.config().memory == MemoryKind::none) return {};
  const std::size_t bytes = dst.page_bytes();
  const bool on_gpu = dst.config().memory == MemoryKind::device || src.config().memory == MemoryKind::device;
  // Runs of consecutive ids on both sides become one copy each.
  auto for_each_run = [&](auto&& fn) {
    std::size_t i = 0;
    while (i < dst_pages.size()) {
      std::size_t n = 1;
      while (i + n < dst_pages.size() && dst_pages[i + n] == dst_pages[i] + static_cast<std::int32_t>(n) &&
             src_pages[i + n] == src_pages[i] + static_cast<std::int32_t>(n)) {
        ++n;
      }
      fn(dst.page_data(dst_pages[i]), src.page_data(src_pages[i]), n * bytes);
      i += n;
    }
  };
  if (!on_gpu) {
    for_each_run([](void* to, const void* from, std::size_t size) { std::memcpy(to, from, size); });
    return {};
  }
#if CLM_HAVE_CUDA
  const int device = dst.config().memory == MemoryKind::device ? dst.config().device : src.config().device;
  // The calling thread's current device is its own (the admitting thread's,
  // the engine's): switched for the copy only, and put back.
  cuda::detail::DeviceGuard guard;
  if (cudaError_t err = guard.enter_device(device); err != cudaSuccess) {
    return unsupported(fmt::format("page copy: {}({}): {}", guard.failed_call(), device, cudaGetErrorString(err)));
  }
  std::lock_guard lock(stream_mutex_);
  if (!stream_) {
    cudaStream_t made = nullptr;
    if (cudaError_t err = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking); err != cudaSuccess) {
      return Status(StatusCode::internal, fmt::format("page copy: cudaStreamCreate: {}", cudaGetErrorString(err)));
    }
    stream_ = made;
    stream_device_ = device;
  }
  const auto stream = static_cast<cudaStream_t>(stream_);
  cudaError_t failed = cudaSuccess;
  for_each_run([&](void* to, const void* from, std::size_t size) {
    if (failed == cudaSuccess) failed = cudaMemcpyAsync(to, from, size, cudaMemcpyDefault, stream);
  });
  const cudaError_t waited = cudaStreamSynchronize(stream);
  if (failed == cudaSuccess) failed = waited;
  if (failed != cudaSuccess) {
    return Status(StatusCode::internal, fmt::format("page copy: {}", cudaGetErrorString(failed)));
  }
  return {};
#else
  return unsupported("page copy: clmcache was built without CUDA");
#endif
}

}  // namespace clm
