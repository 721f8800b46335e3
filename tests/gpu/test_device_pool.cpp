// A pool in device memory: works where a CUDA device exists, and otherwise
// fails cleanly with StatusCode::unsupported (the test then says it skipped).
#include <catch2/catch.hpp>

#include <iostream>

#include "clm/cache/paged_kv_pool.hpp"

TEST_CASE("device-resident pool", "[gpu]") {
  clm::PagedKvPoolConfig config;
  config.num_pages = 64;
  config.page_size = 16;
  config.num_layers = 2;
  config.kv_heads = 8;
  config.head_dim = 128;
  config.memory = clm::MemoryKind::device;
  std::unique_ptr<clm::PagedKvPool> pool;
  std::string reason;
  if (clm::cuda_device_count(&reason) == 0) {
    REQUIRE(clm::PagedKvPool::create(config, pool).code() == clm::StatusCode::unsupported);
    std::cout << "SKIPPED (no usable CUDA device: " << reason << ")\n";
    return;
  }
  REQUIRE(clm::PagedKvPool::create(config, pool).ok());
  REQUIRE(pool->data() != nullptr);
  std::vector<std::int32_t> pages(64);
  REQUIRE(pool->allocate(pages).ok());
  REQUIRE(pool->release(pages).ok());
}
