// tests/capi/capi_engine.hpp: what the C ABI's engine tests share (the
// lifecycle, options and bad-input programs): an engine of small pools (page
// ids only, head_dim 8), admissions, the sequence's page table and slots as
// vectors, token runs, and the accounting every idle engine must satisfy.
// Only clm.h, as a host sees it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "clm.h"

#if defined(__has_include)
#if __has_include("clm/engine.hpp")
#error "the C ABI tests must see only clm.h, as a host linking libclmcache.so does"
#endif
#endif

inline clm_engine_options engine_options(int32_t num_pages, int32_t page_size, int32_t memory = CLM_MEMORY_NONE) {
  clm_engine_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE(clm_engine_options_init(&o, sizeof o) == CLM_OK);
  o.num_pages = num_pages;
  o.page_size = page_size;
  o.memory = memory;
  o.head_dim = 8;  // small pools: these tests are about page ids
  return o;
}

inline EnginePtr make_engine(const clm_engine_options& o) {
  clm_engine* e = nullptr;
  REQUIRE_OK(clm_engine_create(&e, &o));
  REQUIRE(e != nullptr);
  return EnginePtr(e);
}
inline EnginePtr make_engine(int32_t num_pages, int32_t page_size) {
  return make_engine(engine_options(num_pages, page_size));
}

inline clm_admit_options admit_options() {
  clm_admit_options o;
  std::memset(&o, 0xAB, sizeof o);
  REQUIRE(clm_admit_options_init(&o, sizeof o) == CLM_OK);
  return o;
}

inline SeqPtr admit(clm_engine* e, const std::vector<int32_t>& tokens, const clm_admit_options* o = nullptr) {
  clm_seq* s = nullptr;
  REQUIRE_OK(clm_engine_admit(&s, e, tokens.data(), tokens.size(), o));
  REQUIRE(s != nullptr);
  return SeqPtr(s);
}

inline SeqPtr admit_salted(clm_engine* e, const std::vector<int32_t>& tokens, const std::string& salt,
                           int32_t adapter = 0) {
  clm_admit_options o = admit_options();
  o.cache_salt = salt.data();
  o.cache_salt_len = salt.size();
  o.adapter_id = adapter;
  return admit(e, tokens, &o);
}

inline clm_metrics metrics(const clm_engine* e) {
  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

inline std::vector<int32_t> page_table(const clm_seq* s) {
  size_t n = 12345;
  const int32_t* p = clm_seq_page_table(s, &n);
  REQUIRE((p != nullptr || n == 0));
  return p ? std::vector<int32_t>(p, p + n) : std::vector<int32_t>{};
}

inline std::vector<int64_t> slots(const clm_seq* s) {
  size_t n = 12345;
  const int64_t* p = clm_seq_slots(s, &n);
  REQUIRE((p != nullptr || n == 0));
  return p ? std::vector<int64_t>(p, p + n) : std::vector<int64_t>{};
}

inline std::vector<int32_t> tokens_from(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline int32_t pages_for(size_t tokens, int32_t page_size) {
  return static_cast<int32_t>((tokens + static_cast<size_t>(page_size) - 1) / static_cast<size_t>(page_size));
}

// Slots of token positions [begin, end) of a sequence with this page table.
inline std::vector<int64_t> expected_slots(const std::vector<int32_t>& table, size_t begin, size_t end,
                                           int32_t page_size) {
  std::vector<int64_t> out;
  const auto ps = static_cast<size_t>(page_size);
  for (size_t t = begin; t < end; ++t) {
    out.push_back(int64_t{table.at(t / ps)} * page_size + static_cast<int64_t>(t % ps));
  }
  return out;
}

// Every pool page is free, the cache's, or held by running sequences; with no
// sequence running, every used page is the cache's, and nothing stays locked.
inline void check_idle_accounting(const clm_engine* e, int32_t num_pages, int32_t page_size) {
  const clm_metrics m = metrics(e);
  CHECK(m.active_sequences == 0);
  CHECK(m.pages_used + m.pages_free == num_pages);
  CHECK(int64_t{m.pages_used} * page_size == m.cached_tokens);
  CHECK(m.evictable_tokens == m.cached_tokens);
  CHECK(m.protected_tokens == 0);
}

// A finished or aborted sequence keeps its cached-token count, and has no
// pages or slots any more (they belong to the cache or to other sequences).
inline void check_ended_accessors(const clm_seq* s, int32_t cached) {
  CHECK(clm_seq_cached_tokens(s) == cached);
  size_t n = 77;
  CHECK(clm_seq_page_table(s, &n) == nullptr);
  CHECK(n == 0);
  n = 77;
  CHECK(clm_seq_slots(s, &n) == nullptr);
  CHECK(n == 0);
}
