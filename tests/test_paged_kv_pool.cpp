// PagedKvPool: allocation, reference counts, exhaustion, byte layout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "clm/cache/paged_kv_pool.hpp"

using clm::PagedKvPool;
using clm::PagedKvPoolConfig;

namespace {
std::unique_ptr<PagedKvPool> make_pool(std::int32_t pages, clm::MemoryKind memory = clm::MemoryKind::none) {
  PagedKvPoolConfig config;
  config.num_pages = pages;
  config.page_size = 16;
  config.head_dim = 8;
  config.memory = memory;
  std::unique_ptr<PagedKvPool> pool;
  REQUIRE(PagedKvPool::create(config, pool).ok());
  return pool;
}
}  // namespace

TEST_CASE("pool hands out distinct pages and takes them back", "[pool]") {
  auto pool = make_pool(100);
  std::vector<std::int32_t> pages(100);
  REQUIRE(pool->allocate(pages).ok());
  REQUIRE(std::set<std::int32_t>(pages.begin(), pages.end()).size() == 100);
  for (std::int32_t p : pages) REQUIRE((p >= 0 && p < 100 && pool->ref_count(p) == 1));
  REQUIRE(pool->free_pages() == 0);
  REQUIRE(pool->used_pages() == 100);
  REQUIRE(pool->release(pages).ok());
  REQUIRE(pool->free_pages() == 100);
}

TEST_CASE("pool exhaustion is all-or-nothing", "[pool]") {
  auto pool = make_pool(10);
  std::vector<std::int32_t> seven(7), four(4, -5);
  REQUIRE(pool->allocate(seven).ok());
  clm::Status s = pool->allocate(four);
  REQUIRE(s.code() == clm::StatusCode::out_of_memory);
  REQUIRE(s.message().find("exhausted") != std::string::npos);
  REQUIRE(pool->free_pages() == 3);
  REQUIRE(std::all_of(four.begin(), four.end(), [](std::int32_t p) { return p == -5; }));
}

TEST_CASE("pool reference counts", "[pool]") {
  auto pool = make_pool(4);
  std::int32_t page[1] = {-1};
  REQUIRE(pool->allocate(page).ok());
  REQUIRE(pool->retain(page).ok());
  REQUIRE(pool->ref_count(page[0]) == 2);
  REQUIRE(pool->release(page).ok());
  REQUIRE(pool->free_pages() == 3);  // still held once
  REQUIRE(pool->release(page).ok());
  REQUIRE(pool->free_pages() == 4);
  // Released more often than held: an error, and nothing changes.
  REQUIRE(pool->release(page).code() == clm::StatusCode::invalid_argument);
  REQUIRE(pool->retain(page).code() == clm::StatusCode::invalid_argument);
  REQUIRE(pool->free_pages() == 4);
}

TEST_CASE("pool release is atomic on bad ids", "[pool]") {
  auto pool = make_pool(8);
  std::vector<std::int32_t> pages(4);
  REQUIRE(pool->allocate(pages).ok());
  for (std::vector<std::int32_t> bad : {std::vector<std::int32_t>{pages[0], pages[1], 99},
                                        std::vector<std::int32_t>{pages[2], -1},
                                        std::vector<std::int32_t>{pages[3], pages[3]}}) {
    REQUIRE(pool->release(bad).code() == clm::StatusCode::invalid_argument);
    REQUIRE(pool->free_pages() == 4);
    for (std::int32_t p : pages) REQUIRE(pool->ref_count(p) == 1);
  }
  // The free list is intact: the remaining four pages are the unallocated ones.
  std::vector<std::int32_t> rest(4);
  REQUIRE(pool->allocate(rest).ok());
  std::set<std::int32_t> all(pages.begin(), pages.end());
  all.insert(rest.begin(), rest.end());
  REQUIRE(all.size() == 8);
}

TEST_CASE("pool random alloc/retain/release against a model", "[pool]") {
  std::mt19937 rng(std::random_device{}());
  auto pool = make_pool(257);
  std::vector<std::int32_t> model(257, 0);  // reference counts
  std::vector<std::int32_t> held;           // one entry per reference held
  for (int step = 0; step < 200000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      std::vector<std::int32_t> got(rng() % 20);
      const auto free_before = std::count(model.begin(), model.end(), 0);
      clm::Status s = pool->allocate(got);
      REQUIRE(s.ok() == (static_cast<long>(got.size()) <= free_before));
      if (s.ok()) {
        for (std::int32_t p : got) {
          REQUIRE(model[p] == 0);
          model[p] = 1;
          held.push_back(p);
        }
      }
    } else if (op == 1 && !held.empty()) {
      std::int32_t p = held[rng() % held.size()];
      REQUIRE(pool->retain({&p, 1}).ok());
      ++model[p];
      held.push_back(p);
    } else if (!held.empty()) {
      std::size_t k = rng() % held.size();
      std::int32_t p = held[k];
      held[k] = held.back();
      held.pop_back();
      REQUIRE(pool->release({&p, 1}).ok());
      --model[p];
    }
    REQUIRE(pool->free_pages() == std::count(model.begin(), model.end(), 0));
    if (step % 1000 == 0) {
      for (std::int32_t p = 0; p < 257; ++p) REQUIRE(pool->ref_count(p) == model[p]);
    }
  }
}

TEST_CASE("pool byte layout is NHD per layer, page-major", "[pool]") {
  PagedKvPoolConfig config;
  config.num_pages = 3;
  config.page_size = 4;
  config.num_layers = 2;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.dtype = clm::KvDType::bf16;
  std::unique_ptr<PagedKvPool> pool;
  REQUIRE(PagedKvPool::create(config, pool).ok());
  const std::size_t block = 4 * 2 * 8 * 2;
  REQUIRE(pool->block_bytes() == block);
  REQUIRE(pool->page_bytes() == 2 * 2 * block);
  auto* base = static_cast<char*>(pool->data());
  REQUIRE(static_cast<char*>(pool->k_data(2, 1)) == base + 2 * pool->page_bytes() + 2 * block);
  REQUIRE(static_cast<char*>(pool->v_data(2, 1)) == base + 2 * pool->page_bytes() + 3 * block);
  // Every byte of every page is addressable (ASan checks the bounds).
  std::memset(pool->data(), 0x5a, pool->storage_bytes());
}

TEST_CASE("pool rejects bad configurations", "[pool]") {
  std::unique_ptr<PagedKvPool> pool;
  PagedKvPoolConfig config;
  config.num_pages = 0;
  REQUIRE(PagedKvPool::create(config, pool).code() == clm::StatusCode::invalid_argument);
  config.num_pages = 4;
  config.page_size = 0;
  REQUIRE(PagedKvPool::create(config, pool).code() == clm::StatusCode::invalid_argument);
  config.page_size = 16;
  config.head_dim = -1;
  REQUIRE(PagedKvPool::create(config, pool).code() == clm::StatusCode::invalid_argument);
  REQUIRE(pool == nullptr);
}
