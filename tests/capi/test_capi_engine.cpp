// tests/capi/test_capi_engine.cpp: an engine's life through the C ABI as a
// host sees it (only clm.h and libclmcache.so.0): admit, extend, finish and
// abort with their page tables and slots, cache hits, tenant isolation,
// eviction and priorities, admission plans, the host pool's layout, metrics,
// FlashInfer CSR arrays, and many threads on one engine.
#include "clm.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "capi_engine.hpp"

// =============================================================================
// Lifecycle
// =============================================================================

TEST_CASE("admit, extend, finish: page table and slots stay consistent", "[capi][lifecycle]") {
  constexpr int32_t kPages = 64, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  const std::vector<int32_t> prompt = tokens_from(100, 10);

  SeqPtr seq = admit(engine.get(), prompt);
  CHECK(clm_seq_cached_tokens(seq.get()) == 0);
  std::vector<int32_t> table = page_table(seq.get());
  REQUIRE(table.size() == 3);  // ceil(10 / 4)
  CHECK(std::set<int32_t>(table.begin(), table.end()).size() == table.size());
  for (int32_t p : table) CHECK((p >= 0 && p < kPages));
  CHECK(slots(seq.get()) == expected_slots(table, 0, 10, kPs));

  {
    clm_metrics m = metrics(engine.get());
    CHECK(m.admitted == 1);
    CHECK(m.active_sequences == 1);
    CHECK(m.pages_used == 3);
    CHECK(m.pages_free == kPages - 3);
    CHECK(m.tokens_queried == 10);
    CHECK(m.tokens_hit == 0);
    CHECK(m.cached_tokens == 0);
  }

  // Decode: one token fills row 2 of the last page; the next two need a page.
  const std::vector<int32_t> out1 = {7};
  REQUIRE_OK(clm_seq_extend(seq.get(), out1.data(), out1.size()));
  CHECK(page_table(seq.get()) == table);
  CHECK(slots(seq.get()) == expected_slots(table, 10, 11, kPs));

  const std::vector<int32_t> out2 = {8, 9};
  REQUIRE_OK(clm_seq_extend(seq.get(), out2.data(), out2.size()));
  const std::vector<int32_t> grown = page_table(seq.get());
  REQUIRE(grown.size() == 4);
  CHECK(std::equal(table.begin(), table.end(), grown.begin()));  // old pages keep their places
  CHECK(slots(seq.get()) == expected_slots(grown, 11, 13, kPs));
  CHECK(metrics(engine.get()).pages_used == 4);

  // Every slot handed out lies in a page of the table.
  for (int64_t slot : slots(seq.get())) {
    CHECK(std::find(grown.begin(), grown.end(), static_cast<int32_t>(slot / kPs)) != grown.end());
  }

  // An empty extend is fine and hands out no slots.
  REQUIRE_OK(clm_seq_extend(seq.get(), nullptr, 0));
  CHECK(slots(seq.get()).empty());
  CHECK(page_table(seq.get()) == grown);

  REQUIRE_OK(clm_seq_finish(seq.get()));
  {
    clm_metrics m = metrics(engine.get());
    CHECK(m.finished == 1);
    CHECK(m.active_sequences == 0);
    CHECK(m.cached_tokens == 12);  // 13 tokens: the page-aligned part is published
    CHECK(m.inserted_tokens == 12);
    CHECK(m.pages_used == 3);  // the partial last page went back to the pool
  }
  check_idle_accounting(engine.get(), kPages, kPs);
  check_ended_accessors(seq.get(), 0);
  seq.reset();

  // Prompt + output is reusable.
  const std::vector<int32_t> full = concat(prompt, {7, 8, 9});
  SeqPtr again = admit(engine.get(), full);
  CHECK(clm_seq_cached_tokens(again.get()) == 12);
  const std::vector<int32_t> again_table = page_table(again.get());
  REQUIRE(again_table.size() == 4);
  CHECK(std::equal(again_table.begin(), again_table.begin() + 3, grown.begin()));
  CHECK(slots(again.get()) == expected_slots(again_table, 12, 13, kPs));
  REQUIRE_OK(clm_seq_abort(again.get()));
  check_ended_accessors(again.get(), 12);
  CHECK(metrics(engine.get()).aborted == 1);
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("cached tokens of a repeated prompt: page-aligned, at most len-1", "[capi][lifecycle]") {
  for (int32_t ps : {1, 4, 16}) {
    constexpr size_t kLen = 40;
    EnginePtr engine = make_engine(256, ps);
    const std::vector<int32_t> cached = tokens_from(1, kLen);
    {
      SeqPtr first = admit(engine.get(), cached);
      REQUIRE_OK(clm_seq_finish(first.get()));
    }
    const int64_t stored = static_cast<int64_t>(kLen) / ps * ps;
    CHECK(metrics(engine.get()).cached_tokens == stored);

    uint64_t queried = kLen, hit = 0;
    for (size_t len = 1; len <= kLen + 5; ++len) {
      // A prefix of the cached prompt (and, past kLen, new tokens after it).
      std::vector<int32_t> prompt = tokens_from(1, len);
      const int64_t expected = std::min<int64_t>(stored, static_cast<int64_t>(len - 1) / ps * ps);
      SeqPtr s = admit(engine.get(), prompt);
      INFO("page_size " << ps << ", prompt length " << len);
      CHECK(clm_seq_cached_tokens(s.get()) == expected);
      const std::vector<int32_t> table = page_table(s.get());
      CHECK(static_cast<int32_t>(table.size()) == pages_for(len, ps));
      CHECK(slots(s.get()) == expected_slots(table, static_cast<size_t>(expected), len, ps));
      REQUIRE_OK(clm_seq_abort(s.get()));  // abort: the cache stays as it was
      queried += len;
      hit += static_cast<uint64_t>(expected);
    }
    const clm_metrics m = metrics(engine.get());
    CHECK(m.tokens_queried == queried);
    CHECK(m.tokens_hit == hit);
    CHECK(m.hit_rate == Approx(static_cast<double>(hit) / static_cast<double>(queried)));
    CHECK(m.admitted == 1 + kLen + 5);
    CHECK(m.finished == 1);
    CHECK(m.aborted == kLen + 5);
    CHECK(m.cached_tokens == stored);
    check_idle_accounting(engine.get(), 256, ps);
  }
}

TEST_CASE("a changed token ends the reuse at its page", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(64, 4);
  const std::vector<int32_t> base = tokens_from(1, 20);
  SeqPtr first = admit(engine.get(), base);
  REQUIRE_OK(clm_seq_finish(first.get()));
  for (size_t changed = 0; changed < 20; ++changed) {
    std::vector<int32_t> prompt = base;
    prompt[changed] = 999;
    SeqPtr s = admit(engine.get(), prompt);
    INFO("token " << changed << " changed");
    CHECK(clm_seq_cached_tokens(s.get()) == static_cast<int32_t>(changed / 4 * 4));
  }
}

TEST_CASE("tenants are isolated by cache salt and adapter", "[capi][lifecycle][salt]") {
  EnginePtr engine = make_engine(128, 4);
  const std::vector<int32_t> prompt = tokens_from(50, 17);
  {
    SeqPtr a = admit_salted(engine.get(), prompt, "tenant-a");
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-a").get()) == 16);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-b").get()) == 0);
  CHECK(clm_seq_cached_tokens(admit(engine.get(), prompt).get()) == 0);  // no salt is a tenant of its own
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-a", 3).get()) == 0);  // other adapter
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, std::string("tenant-a\0x", 10)).get()) == 0);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "tenant-").get()) == 0);

  // The salt is bytes [0, len): embedded NULs count, and it is copied at admit.
  {
    std::string salt("t\0z", 3);
    SeqPtr a = admit_salted(engine.get(), prompt, salt);
    salt.assign("xxx");
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, std::string("t\0z", 3)).get()) == 16);
  CHECK(clm_seq_cached_tokens(admit_salted(engine.get(), prompt, "t").get()) == 0);

  // A NULL salt with length 0 is "no salt".
  {
    SeqPtr none = admit(engine.get(), prompt);
    REQUIRE_OK(clm_seq_finish(none.get()));
  }
  clm_admit_options o = admit_options();
  o.cache_salt = nullptr;
  o.cache_salt_len = 0;
  CHECK(clm_seq_cached_tokens(admit(engine.get(), prompt, &o).get()) == 16);
  check_idle_accounting(engine.get(), 128, 4);
}

TEST_CASE("two sequences with the same prompt publish once and leak nothing", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(32, 4);
  const std::vector<int32_t> prompt = tokens_from(1, 12);
  SeqPtr a = admit(engine.get(), prompt);
  SeqPtr b = admit(engine.get(), prompt);
  CHECK(metrics(engine.get()).pages_used == 6);
  REQUIRE_OK(clm_seq_finish(a.get()));
  REQUIRE_OK(clm_seq_finish(b.get()));  // b's pages duplicate a's: they go back
  const clm_metrics m = metrics(engine.get());
  CHECK(m.cached_tokens == 12);
  CHECK(m.inserted_tokens == 12);
  CHECK(m.finished == 2);
  check_idle_accounting(engine.get(), 32, 4);
}

TEST_CASE("clm_seq_free aborts a running sequence", "[capi][lifecycle]") {
  EnginePtr engine = make_engine(16, 4);
  SeqPtr s = admit(engine.get(), tokens_from(1, 9));
  CHECK(metrics(engine.get()).pages_used == 3);
  s.reset();
  const clm_metrics m = metrics(engine.get());
  CHECK(m.aborted == 1);
  CHECK(m.finished == 0);
  CHECK(m.cached_tokens == 0);
  check_idle_accounting(engine.get(), 16, 4);
}

TEST_CASE("a full pool evicts unlocked prefixes, never locked ones", "[capi][lifecycle][eviction]") {
  constexpr int32_t kPages = 4, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  {
    SeqPtr a = admit(engine.get(), tokens_from(1, 8));  // 2 pages, cached at finish
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  CHECK(metrics(engine.get()).cached_tokens == 8);
  // 16 new tokens need all 4 pages: the cached 2 are evicted.
  {
    SeqPtr b = admit(engine.get(), tokens_from(100, 16));
    const clm_metrics m = metrics(engine.get());
    CHECK(m.evicted_tokens == 8);
    CHECK(m.evictions >= 1);
    CHECK(m.cached_tokens == 0);
    CHECK(m.pages_free == 0);
  }
  // A running sequence's cached prefix is locked: not evictable.
  {
    SeqPtr c = admit(engine.get(), tokens_from(1, 8));
    REQUIRE_OK(clm_seq_finish(c.get()));
  }
  SeqPtr d = admit(engine.get(), tokens_from(1, 9));  // reuses the 8, locks them, 1 new page
  CHECK(clm_seq_cached_tokens(d.get()) == 8);
  clm_seq* e = nullptr;
  const std::vector<int32_t> big = tokens_from(500, 9);  // 3 pages: only 1 free, 0 evictable
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_engine_admit(&e, engine.get(), big.data(), big.size(), nullptr));
  CHECK(e == nullptr);
  CHECK(clm_seq_cached_tokens(d.get()) == 8);
  REQUIRE_OK(clm_seq_abort(d.get()));
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("plan_admission says what admit takes from the pool, and changes nothing", "[capi][lifecycle][plan]") {
  constexpr int32_t kPages = 4, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  auto plan = [&](const std::vector<int32_t>& t) {
    clm_admission_plan p;
    p.struct_size = sizeof p;
    p.cached_tokens = -1;
    const clm_metrics before = metrics(engine.get());
    REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), t.data(), t.size(), nullptr));
    const clm_metrics after = metrics(engine.get());
    CHECK(after.tokens_queried == before.tokens_queried);
    CHECK(after.tokens_hit == before.tokens_hit);
    CHECK(after.evictable_tokens == before.evictable_tokens);
    CHECK(p.pages_free == before.pages_free);
    CHECK(p.evictable_tokens == before.evictable_tokens);
    return p;
  };
  {
    SeqPtr a = admit(engine.get(), tokens_from(1, 8));  // 2 pages, cached at finish
    REQUIRE_OK(clm_seq_finish(a.get()));
  }
  // 9 tokens that start with the cached 8: reuses 2 unlocked pages, allocates 1.
  clm_admission_plan p = plan(tokens_from(1, 9));
  CHECK(p.cached_tokens == 8);
  CHECK(p.new_pages == 1);
  CHECK(p.unlocked_pages == 2);
  CHECK(p.pages_free == 2);
  CHECK(p.evictable_tokens == 8);
  SeqPtr d = admit(engine.get(), tokens_from(1, 9));
  CHECK(clm_seq_cached_tokens(d.get()) == p.cached_tokens);
  clm_metrics m = metrics(engine.get());
  CHECK(m.pages_free == 1);
  CHECK(m.evictable_tokens == 0);
  // The same prefix again: its pages are locked by d now, so nothing comes off the evictable.
  p = plan(tokens_from(1, 12));
  CHECK(p.cached_tokens == 8);
  CHECK(p.new_pages == 1);
  CHECK(p.unlocked_pages == 0);
  // 9 new tokens need 3 pages: 1 free, 0 evictable, so admit would fail, as it does.
  p = plan(tokens_from(500, 9));
  CHECK(p.cached_tokens == 0);
  CHECK(p.new_pages + p.unlocked_pages > p.pages_free + p.evictable_tokens / kPs);
  clm_seq* e = nullptr;
  const std::vector<int32_t> big = tokens_from(500, 9);
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY, clm_engine_admit(&e, engine.get(), big.data(), big.size(), nullptr));
  // A tenant of its own matches nothing.
  clm_admit_options o = admit_options();
  o.cache_salt = "tenant 2";
  o.cache_salt_len = 8;
  p.struct_size = sizeof p;
  REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), big.data(), 9, &o));
  CHECK(p.cached_tokens == 0);
  REQUIRE_OK(clm_seq_abort(d.get()));
  check_idle_accounting(engine.get(), kPages, kPs);
}

TEST_CASE("kv_layout describes the host pool and its pages can be written", "[capi][lifecycle][layout]") {
  struct Case {
    int32_t dtype;
    size_t element;
  };
  for (Case c : {Case{CLM_KV_F32, 4}, Case{CLM_KV_F16, 2}, Case{CLM_KV_BF16, 2}}) {
    clm_engine_options o = engine_options(6, 4, CLM_MEMORY_HOST);
    o.num_layers = 3;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.kv_dtype = c.dtype;
    EnginePtr engine = make_engine(o);
    clm_kv_layout l;
    std::memset(&l, 0xAB, sizeof l);
    l.struct_size = sizeof l;
    REQUIRE_OK(clm_engine_kv_layout(&l, engine.get()));
    CHECK(l.struct_size == sizeof l);
    INFO("dtype " << c.dtype);
    REQUIRE(l.base != nullptr);
    CHECK(l.layer_bytes == 2 * size_t{4} * 2 * 8 * c.element);
    CHECK(l.page_bytes == 3 * l.layer_bytes);
    CHECK(l.num_pages == 6);
    CHECK(l.page_size == 4);
    CHECK(l.num_layers == 3);
    CHECK(l.kv_heads == 2);
    CHECK(l.head_dim == 8);
    CHECK(l.kv_dtype == c.dtype);
    CHECK(l.memory == CLM_MEMORY_HOST);
    // The whole pool is addressable (ASan checks the bounds).
    std::memset(l.base, 0x5A, l.page_bytes * static_cast<size_t>(l.num_pages));
    // K and V of one token of every layer, at the slots the engine hands out.
    SeqPtr s = admit(engine.get(), tokens_from(1, 6));
    const size_t block = l.layer_bytes / 2;
    for (int64_t slot : slots(s.get())) {
      const auto page = static_cast<size_t>(slot / l.page_size), row = static_cast<size_t>(slot % l.page_size);
      for (size_t layer = 0; layer < static_cast<size_t>(l.num_layers); ++layer) {
        char* k = static_cast<char*>(l.base) + page * l.page_bytes + layer * l.layer_bytes +
                  row * static_cast<size_t>(l.kv_heads * l.head_dim) * c.element;
        std::memset(k, 1, static_cast<size_t>(l.kv_heads * l.head_dim) * c.element);
        std::memset(k + block, 2, static_cast<size_t>(l.kv_heads * l.head_dim) * c.element);
      }
    }
  }
  // CLM_MEMORY_NONE keeps no bytes.
  EnginePtr none = make_engine(6, 4);
  clm_kv_layout l;
  l.struct_size = sizeof l;
  REQUIRE_OK(clm_engine_kv_layout(&l, none.get()));
  CHECK(l.base == nullptr);
  CHECK(l.memory == CLM_MEMORY_NONE);
  CHECK(l.num_pages == 6);
}

TEST_CASE("every eviction policy and every priority from 0 to 100 work", "[capi][lifecycle][eviction]") {
  for (int32_t policy : {CLM_EVICT_LRU, CLM_EVICT_LFU, CLM_EVICT_SLRU, CLM_EVICT_PRIORITY, CLM_EVICT_GHOST_SLRU}) {
    clm_engine_options o = engine_options(8, 2);
    o.eviction_policy = policy;
    o.slru_protected_fraction = 0.5;
    EnginePtr engine = make_engine(o);
    for (int32_t priority : {0, 1, 50, 100}) {
      clm_admit_options a = admit_options();
      a.priority = priority;
      const std::vector<int32_t> prompt = tokens_from(priority * 10, 5);  // 3 pages: forces eviction
      SeqPtr s = admit(engine.get(), prompt, &a);
      REQUIRE_OK(clm_seq_finish(s.get()));
    }
    INFO("policy " << policy);
    CHECK(metrics(engine.get()).finished == 4);
    check_idle_accounting(engine.get(), 8, 2);
  }
}

// A conversation admitted at priority 1 (its next turn expected), then at 0
// (that turn came). With CLM_PRIORITY_RAISE its first turn keeps 1 and
// outlives a newer prompt; with CLM_PRIORITY_SET the second admission drops it
// to 0, and it goes first. A V1-sized struct (no priority_update) raises.
TEST_CASE("priority_update: raise keeps the highest priority, set the latest", "[capi][lifecycle][eviction]") {
  constexpr size_t kV1 = offsetof(clm_admit_options, priority) + sizeof(int32_t);
  for (const int32_t update : {CLM_PRIORITY_RAISE, CLM_PRIORITY_SET, -1}) {  // -1: a V1 caller
    INFO("priority_update " << update);
    clm_engine_options eo = engine_options(8, 4);
    eo.eviction_policy = CLM_EVICT_PRIORITY;
    EnginePtr engine = make_engine(eo);
    auto run = [&](const std::vector<int32_t>& prompt, int32_t priority) {
      clm_admit_options a = admit_options();
      a.priority = priority;
      if (update >= 0) {
        a.priority_update = update;
      } else {
        a.struct_size = static_cast<uint32_t>(kV1);
        a.priority_update = 0x7ead;  // past a V1 struct: never read
      }
      SeqPtr s = admit(engine.get(), prompt, &a);
      REQUIRE_OK(clm_seq_finish(s.get()));
    };
    auto cached = [&](std::vector<int32_t> prompt) {
      prompt.push_back(9999);
      clm_admission_plan p;
      p.struct_size = sizeof p;
      REQUIRE_OK(clm_engine_plan_admission(&p, engine.get(), prompt.data(), prompt.size(), nullptr));
      return p.cached_tokens;
    };
    const std::vector<int32_t> first_turn = tokens_from(0, 8), older = tokens_from(100, 8), newer = tokens_from(200, 8);
    std::vector<int32_t> second_turn = first_turn;
    for (int32_t t : tokens_from(50, 8)) second_turn.push_back(t);
    run(first_turn, 1);
    run(older, 0);
    run(second_turn, 0);
    run(newer, 0);
    CHECK(metrics(engine.get()).pages_free == 0);
    SeqPtr probe = admit(engine.get(), tokens_from(300, 24));  // 6 pages: evicts three 2-page leaves
    const bool set = update == CLM_PRIORITY_SET;
    CHECK(cached(older) == 0);
    CHECK(cached(second_turn) == (set ? 0 : 8));  // its own tail went; set: its first turn too
    CHECK(cached(first_turn) == (set ? 0 : 8));
    CHECK(cached(newer) == (set ? 8 : 0));
    REQUIRE_OK(clm_seq_abort(probe.get()));
  }
}

TEST_CASE("metrics count what the host did", "[capi][metrics]") {
  constexpr int32_t kPages = 32, kPs = 4;
  EnginePtr engine = make_engine(kPages, kPs);
  clm_metrics m0 = metrics(engine.get());
  CHECK(m0.struct_size == sizeof(clm_metrics));
  CHECK(m0.admitted == 0);
  CHECK(m0.pages_used == 0);
  CHECK(m0.pages_free == kPages);
  CHECK(m0.hit_rate == 0.0);
  CHECK(m0.metadata_bytes > 0);

  const std::vector<int32_t> p = tokens_from(1, 10);
  SeqPtr a = admit(engine.get(), p);                     // queried 10, hit 0
  REQUIRE_OK(clm_seq_finish(a.get()));                   // inserts 8
  SeqPtr b = admit(engine.get(), p);                     // queried 10, hit 8
  SeqPtr c = admit(engine.get(), tokens_from(1000, 5));  // queried 5
  REQUIRE_OK(clm_seq_abort(c.get()));
  clm_seq* rejected = nullptr;
  const std::vector<int32_t> too_big = tokens_from(2000, 200);  // 50 pages > 32
  REQUIRE(clm_engine_admit(&rejected, engine.get(), too_big.data(), too_big.size(), nullptr) ==
          CLM_ERR_OUT_OF_MEMORY);  // queried 200, rejected
  const std::vector<int32_t> bad = {1, -1};
  REQUIRE(clm_engine_admit(&rejected, engine.get(), bad.data(), bad.size(), nullptr) == CLM_ERR_INVALID_ARGUMENT);

  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == 3);
  CHECK(m.finished == 1);
  CHECK(m.aborted == 1);
  CHECK(m.rejected == 1);
  CHECK(m.active_sequences == 1);
  CHECK(m.tokens_queried == 10 + 10 + 5 + 200);
  CHECK(m.tokens_hit == 8);
  CHECK(m.hit_rate == Approx(8.0 / 225.0));
  CHECK(m.inserted_tokens == 8);
  CHECK(m.cached_tokens == 8);
  CHECK(m.protected_tokens == 8);  // b locks them
  CHECK(m.evictable_tokens == 0);
  CHECK(m.pages_used == 3);  // 2 cached + b's third page
  CHECK(m.pages_used + m.pages_free == kPages);
  CHECK(m.evictions == 0);
  CHECK(m.evicted_tokens == 0);

  // Only struct_size bytes are written.
  struct {
    clm_metrics m;
    unsigned char after[8];
  } padded;
  std::memset(&padded, 0xCD, sizeof padded);
  padded.m.struct_size = sizeof(clm_metrics);
  REQUIRE_OK(clm_engine_metrics(&padded.m, engine.get()));
  for (unsigned char byte : padded.after) CHECK(byte == 0xCD);
  CHECK(padded.m.admitted == 3);
}

TEST_CASE("batch_page_table gives FlashInfer CSR arrays", "[capi][batch]") {
  constexpr int32_t kPs = 4;
  EnginePtr engine = make_engine(64, kPs);
  // Prompts of 1, 4, 5, 8, 13 tokens, then decode steps: 1, 4, 5+3, 8+1, 13+2 tokens,
  // whose last pages hold 1, 4 (full), 4 (filled by decoding), 1 (a new page) and 3 rows.
  std::vector<SeqPtr> owned;
  std::vector<size_t> lengths;
  for (size_t len : {size_t{1}, size_t{4}, size_t{5}, size_t{8}, size_t{13}}) {
    owned.push_back(admit(engine.get(), tokens_from(static_cast<int32_t>(len) * 100, len)));
    lengths.push_back(len);
  }
  const std::vector<int32_t> decode = {3};
  REQUIRE_OK(clm_seq_extend(owned[3].get(), decode.data(), decode.size()));
  lengths[3] += 1;
  const std::vector<int32_t> decode3 = {4, 5, 6};
  REQUIRE_OK(clm_seq_extend(owned[2].get(), decode3.data(), decode3.size()));
  lengths[2] += 3;
  const std::vector<int32_t> decode2 = {7, 8};
  REQUIRE_OK(clm_seq_extend(owned[4].get(), decode2.data(), decode2.size()));
  lengths[4] += 2;

  std::vector<clm_seq*> seqs;
  for (auto& s : owned) seqs.push_back(s.get());
  const size_t n = seqs.size();
  std::vector<int32_t> indptr(n + 1, -7), last(n, -7), indices(64, -7);
  size_t n_indices = 999;
  REQUIRE_OK(clm_engine_batch_page_table(indptr.data(), indices.data(), indices.size(), &n_indices, last.data(),
                                         engine.get(), seqs.data(), n));
  CHECK(indptr[0] == 0);
  CHECK(static_cast<size_t>(indptr[n]) == n_indices);
  for (size_t i = 0; i < n; ++i) {
    INFO("sequence " << i << " of length " << lengths[i]);
    const std::vector<int32_t> table = page_table(seqs[i]);
    CHECK(static_cast<int32_t>(table.size()) == pages_for(lengths[i], kPs));
    REQUIRE(indptr[i + 1] - indptr[i] == static_cast<int32_t>(table.size()));
    CHECK(std::equal(table.begin(), table.end(), indices.begin() + indptr[i]));
    CHECK(last[i] >= 1);
    CHECK(last[i] <= kPs);
    CHECK(last[i] == static_cast<int32_t>(lengths[i]) - (static_cast<int32_t>(table.size()) - 1) * kPs);
  }
  CHECK(last == std::vector<int32_t>{1, 4, 4, 1, 3});
  for (size_t k = n_indices; k < indices.size(); ++k) CHECK(indices[k] == -7);  // nothing past n_indices

  SECTION("a sequence named twice is refused, and nothing is written") {
    std::vector<clm_seq*> twice = {seqs[4], seqs[1], seqs[4]};
    std::vector<int32_t> ip(4, -7), lp(3, -7), ix(16, -7);
    size_t ni = 999;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(ip.data(), ix.data(), ix.size(), &ni, lp.data(),
                                                                       engine.get(), twice.data(), twice.size()));
    CHECK(std::string(clm_last_error()).find("more than once") != std::string::npos);
    CHECK(ip == std::vector<int32_t>(4, -7));
    CHECK(lp == std::vector<int32_t>(3, -7));
    CHECK(ix == std::vector<int32_t>(16, -7));
  }
  SECTION("an empty batch") {
    int32_t ip[1] = {-7};
    size_t ni = 999;
    REQUIRE_OK(clm_engine_batch_page_table(ip, nullptr, 0, &ni, nullptr, engine.get(), nullptr, 0));
    CHECK(ip[0] == 0);
    CHECK(ni == 0);
  }
  SECTION("too small an indices buffer: an error, n_indices says the size, indices untouched") {
    const size_t needed = n_indices;
    for (size_t capacity : {size_t{0}, needed / 2, needed - 1}) {
      std::vector<int32_t> ix(needed + 4, -7);
      size_t ni = 0;
      INFO("capacity " << capacity);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(indptr.data(), ix.data(), capacity, &ni,
                                                                         last.data(), engine.get(), seqs.data(), n));
      CHECK(ni == needed);
      CHECK(std::all_of(ix.begin(), ix.end(), [](int32_t v) { return v == -7; }));
    }
    // Sizing call: indices NULL, capacity 0.
    size_t ni = 0;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_batch_page_table(indptr.data(), nullptr, 0, &ni, last.data(),
                                                                       engine.get(), seqs.data(), n));
    CHECK(ni == needed);
    // Exactly enough is enough.
    std::vector<int32_t> exact(needed);
    REQUIRE_OK(clm_engine_batch_page_table(indptr.data(), exact.data(), exact.size(), &ni, last.data(), engine.get(),
                                           seqs.data(), n));
    CHECK(std::equal(exact.begin(), exact.end(), indices.begin()));
  }
}

TEST_CASE("an engine serves many threads at once", "[capi][threads]") {
  constexpr int32_t kPages = 256, kPs = 4;
  constexpr int kThreads = 4, kRequests = 150;
  EnginePtr engine = make_engine(kPages, kPs);
  const std::vector<int32_t> system = tokens_from(1, 32);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRequests; ++r) {
        // A shared system prompt, then a tail shared by every 3rd request of this thread.
        std::vector<int32_t> prompt = concat(system, tokens_from(10000 * (t + 1) + 100 * (r % 3), 9));
        clm_seq* s = nullptr;
        if (clm_engine_admit(&s, engine.get(), prompt.data(), prompt.size(), nullptr) != CLM_OK) {
          ++failures;
          continue;
        }
        size_t n = 0;
        const int64_t* sl = clm_seq_slots(s, &n);
        if (n != prompt.size() - static_cast<size_t>(clm_seq_cached_tokens(s)) || (n > 0 && sl == nullptr)) ++failures;
        const int32_t out[2] = {r, t};
        if (clm_seq_extend(s, out, 2) != CLM_OK) ++failures;
        if ((r % 4 == 3 ? clm_seq_abort(s) : clm_seq_finish(s)) != CLM_OK) ++failures;
        clm_seq_free(s);
        if (r % 10 == 0) {
          clm_metrics m;
          m.struct_size = sizeof m;
          if (clm_engine_metrics(&m, engine.get()) != CLM_OK) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  const clm_metrics m = metrics(engine.get());
  CHECK(m.admitted == uint64_t{kThreads} * kRequests);
  CHECK(m.finished + m.aborted == m.admitted);
  CHECK(m.tokens_hit > 0);
  check_idle_accounting(engine.get(), kPages, kPs);
}
