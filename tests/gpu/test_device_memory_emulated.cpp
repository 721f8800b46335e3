// device_allocate / device_free (lib/device_memory.cpp) over the fake CUDA
// runtime (tests/gpu/fake_cudart.cpp) with two devices: they work on the
// device they are given and leave the calling thread's current device as they
// found it, also when they fail.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <thread>

#include "clm/device_memory.hpp"
#include "clm/paged_kv_pool.hpp"

extern "C" void clm_fake_cuda_set_device_count(int count);

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
