// device_allocate / device_free (lib/device/device_memory.cpp) over the fake CUDA
// runtime (tests/gpu/fake_cudart.cpp) with two devices: they work on the
// device they are given and leave the calling thread's current device as they
// found it, also when they fail, and when the runtime cannot tell them the
// thread's device (then they switch nothing). And device or pinned allocations
// that fail (the fake's fault hook): a clear status, nothing left allocated,
// and the next try works.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <thread>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/device/device_memory.hpp"
#include "clm/engine.hpp"
#include "clm/tiers/page_copier.hpp"

extern "C" void clm_fake_cuda_set_device_count(int count);
extern "C" void clm_fake_cuda_fail_allocation(long skip);
extern "C" int clm_fake_cuda_allocation_failed();
extern "C" long clm_fake_cuda_live_allocations();
extern "C" void clm_fake_cuda_fail_get_device(int error);
extern "C" long clm_fake_cuda_live_streams();

namespace {

int current_device() {
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  return device;
}

}  // namespace

TEST_CASE("device_allocate and device_free leave the thread's current device as it was", "[gpu][device]") {
  clm_fake_cuda_set_device_count(2);
  REQUIRE(clm::cuda_device_count() == 2);
  for (int mine : {0, 1}) {
    for (int target : {0, 1}) {
      INFO("current device " << mine << ", allocating on " << target);
      REQUIRE(cudaSetDevice(mine) == cudaSuccess);
      void* p = nullptr;
      REQUIRE(clm::device_allocate(4096, target, &p).ok());
      REQUIRE(p != nullptr);
      CHECK(current_device() == mine);
      clm::device_free(p, target);
      CHECK(current_device() == mine);
    }
    // Refused: no device 2; the current one stays.
    void* p = reinterpret_cast<void*>(0x1);
    CHECK(clm::device_allocate(4096, 2, &p).code() == clm::StatusCode::unsupported);
    CHECK(p == nullptr);
    CHECK(current_device() == mine);
  }
  // A device pool on the other device, made and dropped.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  clm::PagedKvPoolConfig config;
  config.num_pages = 8;
  config.page_size = 4;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.memory = clm::MemoryKind::device;
  config.device = 1;
  {
    std::unique_ptr<clm::PagedKvPool> pool;
    REQUIRE(clm::PagedKvPool::create(config, pool).ok());
    CHECK(current_device() == 0);
  }
  CHECK(current_device() == 0);
  // Each thread has its own current device: another thread's choice is not ours.
  std::thread other([] {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    void* p = nullptr;
    REQUIRE(clm::device_allocate(64, 0, &p).ok());
    clm::device_free(p, 0);
    CHECK(current_device() == 1);
  });
  other.join();
  CHECK(current_device() == 0);
  clm_fake_cuda_set_device_count(1);
}

// A thread whose current device cudaGetDevice cannot tell: device_allocate
// is refused, naming the call, rather than make the device current and leave
// it so (the device guard could not restore the thread's own); nothing is
// allocated and the error is not left for the host's next cudaGetLastError.
// device_free still frees, from the thread's current device.
TEST_CASE("a failing cudaGetDevice: device_allocate is refused and no device is switched", "[gpu][device][faults]") {
  clm_fake_cuda_set_device_count(2);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const long live_before = clm_fake_cuda_live_allocations();
  void* kept = nullptr;
  REQUIRE(clm::device_allocate(4096, 1, &kept).ok());

  clm_fake_cuda_fail_get_device(cudaErrorNoDevice);
  void* p = reinterpret_cast<void*>(0x1);
  const clm::Status refused = clm::device_allocate(4096, 1, &p);
  const cudaError_t left_by_allocate = cudaGetLastError();
  clm::device_free(kept, 1);
  const cudaError_t left_by_free = cudaGetLastError();
  clm_fake_cuda_fail_get_device(cudaSuccess);

  INFO(refused.message());
  CHECK(refused.code() == clm::StatusCode::unsupported);
  CHECK_THAT(refused.message(), Catch::Contains("cudaGetDevice"));
  CHECK(p == nullptr);
  CHECK(left_by_allocate == cudaSuccess);
  CHECK(left_by_free == cudaSuccess);
  CHECK(current_device() == 0);
  CHECK(clm_fake_cuda_live_allocations() == live_before);
  // The runtime working again, so does device_allocate.
  REQUIRE(clm::device_allocate(4096, 1, &p).ok());
  clm::device_free(p, 1);
  CHECK(current_device() == 0);
  CHECK(clm_fake_cuda_live_allocations() == live_before);
  clm_fake_cuda_set_device_count(1);
}

// Every device or pinned allocation of an Engine with a device pool and a
// pinned host tier fails in turn: each attempt is refused with out_of_memory
// naming the CUDA call, leaves nothing allocated and the thread's device as it
// was, and the attempt after the fault hook is spent makes a working engine.
TEST_CASE("a failed device or pinned allocation: a clear status, nothing left, and the retry works",
          "[gpu][device][faults]") {
  clm::EngineConfig config;
  config.pool.num_pages = 16;
  config.pool.page_size = 4;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.memory = clm::MemoryKind::device;
  config.tiers.host_pages = 32;  // under a device pool: pinned host memory
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const long live_before = clm_fake_cuda_live_allocations();
  long failures = 0;
  std::unique_ptr<clm::Engine> engine;
  for (long skip = 0;; ++skip) {
    INFO("the allocation after " << skip << " fails");
    clm_fake_cuda_fail_allocation(skip);
    const clm::Status created = clm::Engine::create(config, engine);
    const bool fired = clm_fake_cuda_allocation_failed() != 0;
    clm_fake_cuda_fail_allocation(-1);
    if (!fired) {
      INFO(created.message());
      REQUIRE(created.ok());
      break;
    }
    ++failures;
    CHECK(created.code() == clm::StatusCode::out_of_memory);
    CHECK_THAT(created.message(), Catch::Contains("cuda"));
    CHECK(engine == nullptr);
    CHECK(clm_fake_cuda_live_allocations() == live_before);
    CHECK(current_device() == 0);
    CHECK(cudaGetLastError() == cudaSuccess);  // reported once, by the status: not left for the host's next check
  }
  CHECK(failures >= 2);  // the device pool and the pinned host tier at least
  // The engine made after the faults works: a prompt is admitted, cached and found again.
  const std::vector<std::int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  clm::Admission first, second;
  REQUIRE(engine->admit(prompt, {}, first).ok());
  REQUIRE(engine->finish(first.seq).ok());
  REQUIRE(engine->admit(prompt, {}, second).ok());
  CHECK(second.cached_tokens == 8);
  REQUIRE(engine->finish(second.seq).ok());
  REQUIRE(engine->check_invariants().ok());
  engine.reset();
  CHECK(clm_fake_cuda_live_allocations() == live_before);
}

TEST_CASE("PageCopier copies to and from a pool on device 1, keeps one stream, and restores the thread's device",
          "[gpu][device][tiers]") {
  clm_fake_cuda_set_device_count(2);
  clm::PagedKvPoolConfig config;
  config.num_pages = 8;
  config.page_size = 4;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.num_layers = 2;
  config.dtype = clm::KvDType::f32;
  config.memory = clm::MemoryKind::device;
  config.device = 1;
  std::unique_ptr<clm::PagedKvPool> device_pool, host_pool;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(clm::PagedKvPool::create(config, device_pool).ok());
  config.memory = clm::MemoryKind::host;
  config.device = 0;
  REQUIRE(clm::PagedKvPool::create(config, host_pool).ok());
  const long streams_before = clm_fake_cuda_live_streams();
  {
    std::unique_ptr<clm::PageCopier> copier;
    REQUIRE(clm::PageCopier::create(*device_pool, *host_pool, copier).ok());
    const std::size_t bytes = host_pool->page_bytes();
    for (int mine : {0, 1, 0}) {  // the admitting thread's device, whatever it is
      INFO("current device " << mine);
      REQUIRE(cudaSetDevice(mine) == cudaSuccess);
      // Host pages 0-2 (a pattern) -> device pages 5, 6, 3 -> host pages 4, 5, 7.
      for (int p = 0; p < 3; ++p) {
        auto* h = static_cast<unsigned char*>(host_pool->page_data(p));
        for (std::size_t b = 0; b < bytes; ++b) h[b] = static_cast<unsigned char>(b * 7 + p * 31 + mine);
      }
      const std::int32_t host_src[] = {0, 1, 2}, device_pages[] = {5, 6, 3}, host_dst[] = {4, 5, 7};
      REQUIRE(copier->to_device(host_src, device_pages).ok());
      CHECK(current_device() == mine);
      REQUIRE(copier->to_host(device_pages, host_dst).ok());
      CHECK(current_device() == mine);
      for (int k = 0; k < 3; ++k) {
        CHECK(std::memcmp(host_pool->page_data(host_src[k]), host_pool->page_data(host_dst[k]), bytes) == 0);
      }
      CHECK(clm_fake_cuda_live_streams() == streams_before + 1);  // one stream, made once
    }
  }
  CHECK(clm_fake_cuda_live_streams() == streams_before);  // the copier's stream goes with it
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}
