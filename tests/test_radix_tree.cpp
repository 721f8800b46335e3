// RadixTree: directed scenarios for each rule of the prefix cache (the random
// differential test against a naive model is test_radix_tree_property.cpp).
#include <catch2/catch.hpp>

#include <pthread.h>

#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "alloc_fault.hpp"
#include "clm/cache/radix_tree.hpp"

using clm::CacheNamespace;
using clm::EvictionPolicy;
using clm::InsertOutcome;
using clm::PrefixMatch;
using clm::RadixTree;
using Tokens = std::vector<std::int32_t>;

namespace {

struct Fixture {
  explicit Fixture(std::int32_t page_size, std::int32_t pages = 1024, EvictionPolicy policy = EvictionPolicy::lru) {
    clm::PagedKvPoolConfig config;
    config.num_pages = pages;
    config.page_size = page_size;
    config.memory = clm::MemoryKind::none;
    REQUIRE(clm::PagedKvPool::create(config, pool).ok());
    tree = std::make_unique<RadixTree>(*pool, policy);
  }
  ~Fixture() { CHECK(tree->check_invariants().ok()); }

  // Caches `tokens` the way a request does: match, allocate the rest, insert.
  InsertOutcome cache(const Tokens& tokens, const CacheNamespace& ns = {}, int priority = 0,
                      clm::PriorityUpdate update = clm::PriorityUpdate::raise) {
    PrefixMatch hit;
    REQUIRE(tree->match_prefix(tokens, ns, hit).ok());
    Tokens pages = hit.pages;
    const std::size_t needed = tokens.size() / static_cast<std::size_t>(pool->page_size());
    std::vector<std::int32_t> fresh(needed - pages.size());
    REQUIRE(tree->allocate_pages(fresh).ok());
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    InsertOutcome out;
    REQUIRE(tree->insert(tokens, pages, ns, out, priority, update).ok());
    REQUIRE(tree->check_invariants().ok());
    return out;
  }
  std::int32_t hit(const Tokens& tokens, const CacheNamespace& ns = {}) {
    PrefixMatch m;
    REQUIRE(tree->match_prefix(tokens, ns, m).ok());
    REQUIRE(m.pages.size() * static_cast<std::size_t>(pool->page_size()) == static_cast<std::size_t>(m.cached_tokens));
    return m.cached_tokens;
  }

  std::unique_ptr<clm::PagedKvPool> pool;
  std::unique_ptr<RadixTree> tree;
};

Tokens iota(std::int32_t n, std::int32_t first = 0) {
  Tokens t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}
Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("match returns the longest cached prefix, capped at len-1", "[tree]") {
  Fixture f(1);
  f.cache(iota(10));
  CHECK(f.hit(iota(10)) == 9);              // the last token is always recomputed
  CHECK(f.hit(iota(20)) == 10);             // longer query: the whole cached sequence
  CHECK(f.hit(concat(iota(4), {99, 98})) == 4);  // diverges after 4
  CHECK(f.hit({5, 6, 7}) == 0);             // no common first token
  CHECK(f.hit({0}) == 0);
  CHECK(f.tree->cached_tokens() == 10);
}

TEST_CASE("matches and inserts are page-aligned", "[tree]") {
  Fixture f(4);
  InsertOutcome out = f.cache(iota(10));   // only 8 tokens (2 pages) are stored
  CHECK(out.stored_tokens == 8);
  CHECK(f.tree->cached_tokens() == 8);
  CHECK(f.hit(iota(9)) == 8);
  CHECK(f.hit(iota(8)) == 4);                    // capped at 7, aligned down to 4
  CHECK(f.hit(concat(iota(6), {77, 78, 79})) == 4);  // mismatch inside page 2
}

TEST_CASE("a match ending inside a node splits it and returns exactly the matched pages", "[tree]") {
  Fixture f(2);
  const Tokens a = iota(12);
  Tokens a_pages;
  {
    PrefixMatch m;
    REQUIRE(f.tree->match_prefix(a, {}, m).ok());
    a_pages.resize(6);
    REQUIRE(f.tree->allocate_pages(a_pages).ok());
    InsertOutcome out;
    REQUIRE(f.tree->insert(a, a_pages, {}, out).ok());
  }
  PrefixMatch m;
  REQUIRE(f.tree->match_prefix(concat(iota(6), {100, 101}), {}, m).ok());
  CHECK(m.cached_tokens == 6);
  CHECK(m.pages == Tokens(a_pages.begin(), a_pages.begin() + 3));
  CHECK(f.tree->metrics().nodes == 2);  // split into [0,6) and [6,12)
  // The full sequence still matches through both halves.
  PrefixMatch whole;
  REQUIRE(f.tree->match_prefix(concat(a, {1}), {}, whole).ok());
  CHECK(whole.pages == a_pages);
  CHECK(f.tree->check_invariants().ok());
}

TEST_CASE("insert releases duplicate pages and hands back the tree's ids", "[tree]") {
  Fixture f(1, 64);
  const Tokens seq = iota(8);
  f.cache(seq);
  const std::int32_t used_before = f.pool->used_pages();
  // A second request computed the same 8 tokens into its own pages, plus 4 more.
  Tokens pages(12);
  REQUIRE(f.pool->allocate(pages).ok());
  const Tokens mine = pages;
  InsertOutcome out;
  REQUIRE(f.tree->insert(concat(seq, {50, 51, 52, 53}), pages, {}, out).ok());
  CHECK(out.cached_tokens == 8);
  CHECK(out.stored_tokens == 12);
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(pages[i] != mine[i]);
    CHECK(f.pool->ref_count(mine[i]) == 0);  // duplicates went back to the pool
  }
  CHECK(Tokens(pages.begin() + 8, pages.end()) == Tokens(mine.begin() + 8, mine.end()));
  CHECK(f.pool->used_pages() == used_before + 4);
  CHECK(f.tree->cached_tokens() == 12);
}

TEST_CASE("namespaces never share cached pages", "[tree]") {
  Fixture f(16);
  const Tokens prompt = iota(64);
  f.cache(prompt, {.salt = "tenant-a"});
  CHECK(f.hit(prompt, {.salt = "tenant-a"}) == 48);
  CHECK(f.hit(prompt, {.salt = "tenant-b"}) == 0);
  CHECK(f.hit(prompt, {}) == 0);
  CHECK(f.hit(prompt, {.salt = "tenant-a", .adapter_id = 3}) == 0);
  f.cache(prompt, {.salt = "tenant-b"});
  CHECK(f.tree->cached_tokens() == 128);  // stored twice, once per tenant
  CHECK(f.tree->metrics().namespaces == 4);
}

TEST_CASE("locks protect nodes from eviction and keep sizes exact", "[tree]") {
  Fixture f(1, 64);
  InsertOutcome a = f.cache(iota(10, 0));
  InsertOutcome b = f.cache(iota(10, 100));
  REQUIRE(f.tree->lock(a.node).ok());
  CHECK(f.tree->protected_tokens() == 10);
  CHECK(f.tree->evictable_tokens() == 10);
  std::int64_t evicted = 0;
  REQUIRE(f.tree->evict(1000, &evicted).ok());
  CHECK(evicted == 10);  // only b could go
  CHECK(f.hit(iota(11, 0)) == 10);
  CHECK(f.hit(iota(11, 100)) == 0);
  CHECK(f.tree->lock(b.node).code() == clm::StatusCode::not_found);  // b was evicted: stale handle
  REQUIRE(f.tree->unlock(a.node).ok());
  CHECK(f.tree->unlock(a.node).code() == clm::StatusCode::failed_precondition);
  CHECK(f.tree->evictable_tokens() == 10);
  CHECK(f.tree->protected_tokens() == 0);
}

TEST_CASE("locking a descendant protects its ancestors", "[tree]") {
  Fixture f(1, 64);
  f.cache(iota(8));
  InsertOutcome child = f.cache(concat(iota(8), {40, 41, 42}));
  REQUIRE(f.tree->lock(child.node).ok());
  CHECK(f.tree->protected_tokens() == 11);
  std::int64_t evicted = 0;
  REQUIRE(f.tree->evict(100, &evicted).ok());
  CHECK(evicted == 0);
  REQUIRE(f.tree->unlock(child.node).ok());
  REQUIRE(f.tree->evict(100, &evicted).ok());
  CHECK(evicted == 11);  // the leaf first, then its parent, which became a leaf
  CHECK(f.tree->cached_tokens() == 0);
  CHECK(f.pool->used_pages() == 0);
}

TEST_CASE("LRU evicts the least recently used leaf first", "[tree][policy]") {
  Fixture f(1, 64, EvictionPolicy::lru);
  f.cache(iota(5, 0));
  f.cache(iota(5, 100));
  f.cache(iota(5, 200));
  f.hit(iota(6, 0));  // touch the oldest: now 100 is the LRU
  REQUIRE(f.tree->evict(5).ok());  // one leaf's worth
  CHECK(f.hit(iota(6, 100)) == 0);
  CHECK(f.hit(iota(6, 0)) == 5);
  CHECK(f.hit(iota(6, 200)) == 5);
}

TEST_CASE("LFU evicts the least hit leaf, ties by recency", "[tree][policy]") {
  Fixture f(1, 64, EvictionPolicy::lfu);
  f.cache(iota(5, 0));
  f.cache(iota(5, 100));
  f.cache(iota(5, 200));
  for (int i = 0; i < 3; ++i) f.hit(iota(6, 0));
  f.hit(iota(6, 200));
  // 100 was never hit; then 200 (one hit) goes before 0 (three hits).
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.tree->cached_tokens() == 10);
  CHECK(f.hit(iota(6, 100)) == 0);
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.hit(iota(6, 0)) == 5);
  CHECK(f.hit(iota(6, 200)) == 0);
}

namespace clm {
// Tests only (a friend of RadixTree): a node's hit count, set without 2^32 real matches.
struct RadixTreeTestAccess {
  static std::uint32_t hits(const RadixTree& tree, NodeRef node) {
    return tree.nodes_[static_cast<std::size_t>(node.index)].hits;
  }
  static void set_hits(RadixTree& tree, NodeRef node, std::uint32_t hits) {
    tree.nodes_[static_cast<std::size_t>(node.index)].hits = hits;
    tree.refresh_heap_key(node.index);
  }
};
}  // namespace clm

TEST_CASE("LFU: the hottest prefix stays the hottest past 2^32 hits", "[tree][policy]") {
  using Access = clm::RadixTreeTestAccess;
  Fixture f(1, 64, EvictionPolicy::lfu);
  f.cache(iota(5, 0));    // hot
  f.cache(iota(5, 100));  // cold: three hits
  for (int i = 0; i < 3; ++i) f.hit(iota(6, 100));
  PrefixMatch hot;
  REQUIRE(f.tree->match_prefix(iota(6, 0), {}, hot).ok());
  REQUIRE(hot.cached_tokens == 5);
  const std::uint32_t max = std::numeric_limits<std::uint32_t>::max();
  Access::set_hits(*f.tree, hot.node, max - 2);
  for (int i = 0; i < 5; ++i) f.hit(iota(6, 0));  // 2^32 + 2 hits in all: the count stays at its top
  CHECK(Access::hits(*f.tree, hot.node) == max);
  REQUIRE(f.tree->check_invariants().ok());
  // The cold prefix goes first, not the hot one.
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.tree->cached_tokens() == 5);
  CHECK(f.hit(iota(6, 100)) == 0);
  CHECK(f.hit(iota(6, 0)) == 5);
  CHECK(Access::hits(*f.tree, hot.node) == max);
}

TEST_CASE("evict takes only the pages it needs from the last leaf's tail, and its head still serves",
          "[tree][policy]") {
  for (const EvictionPolicy policy : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::slru,
                                      EvictionPolicy::priority, EvictionPolicy::ghost_slru, EvictionPolicy::belady}) {
    INFO(clm::eviction_policy_name(policy));
    Fixture f(4, 64, policy);
    f.cache(iota(20, 0));  // one leaf of 5 pages
    std::int64_t evicted = 0;
    REQUIRE(f.tree->evict(5, &evicted).ok());
    CHECK(evicted == 8);  // 5 tokens need 2 pages: the last two
    CHECK(f.tree->cached_tokens() == 12);
    CHECK(f.tree->metrics().evicted_tokens == 8);
    CHECK(f.pool->used_pages() == 3);
    CHECK(f.hit(iota(21, 0)) == 12);
    REQUIRE(f.tree->check_invariants().ok());
    // The head is a leaf like any other: it goes when more is needed.
    REQUIRE(f.tree->evict(100, &evicted).ok());
    CHECK(evicted == 12);
    CHECK(f.tree->cached_tokens() == 0);
    CHECK(f.pool->used_pages() == 0);
  }
}

TEST_CASE("ghost_slru: a leaf's evicted tail is remembered below its head and comes back protected",
          "[tree][policy][ghost]") {
  Fixture f(4, 64, EvictionPolicy::ghost_slru);
  f.cache(iota(20, 0));
  REQUIRE(f.tree->evict(8).ok());  // the tail's two pages, from probation
  CHECK(f.tree->ghost_tokens() == 8);
  CHECK(f.hit(iota(21, 0)) == 12);
  const InsertOutcome back = f.cache(iota(20, 0));  // the head matches, the tail comes back
  CHECK(f.tree->in_protected_segment(back.node));
  CHECK(f.tree->ghost_tokens() == 0);
}

TEST_CASE("evict takes the whole last leaf when splitting it fails, or with a host tier", "[tree][errors]") {
  {
    clm::detail::tree_block_allocation_fault = &clm_test::allocation_fails;
    struct Unhook {
      ~Unhook() { clm::detail::tree_block_allocation_fault = nullptr; }
    } unhook;
    for (long n = 0;; ++n) {  // the split's allocations fail in turn
      INFO("allocation " << n << " fails");
      Fixture f(4, 64);
      f.cache(iota(20, 0));
      std::int64_t evicted = 0;
      bool fired = false;
      {
        clm_test::FailAllocation fail(n);
        REQUIRE(f.tree->evict(4, &evicted).ok());
        fired = fail.fired();
      }
      REQUIRE(f.tree->check_invariants().ok());
      CHECK(evicted == (fired ? 20 : 4));
      CHECK(f.tree->cached_tokens() == 20 - evicted);
      CHECK(f.pool->used_pages() == (20 - evicted) / 4);
      if (!fired) break;
    }
  }
  clm::PagedKvPoolConfig config;
  config.num_pages = 64;
  config.page_size = 4;
  config.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::PagedKvPool> device, host;
  REQUIRE(clm::PagedKvPool::create(config, device).ok());
  REQUIRE(clm::PagedKvPool::create(config, host).ok());
  RadixTree tree(*device, EvictionPolicy::lru, std::numeric_limits<double>::quiet_NaN(), host.get());
  Tokens pages(5);
  REQUIRE(tree.allocate_pages(pages).ok());
  InsertOutcome out;
  REQUIRE(tree.insert(iota(20, 0), pages, {}, out).ok());
  std::int64_t evicted = 0;
  REQUIRE(tree.evict(4, &evicted).ok());
  CHECK(evicted == 20);  // a host copy is a node's: whole leaves move down
  REQUIRE(tree.check_invariants().ok());
}

TEST_CASE("SLRU keeps reused prefixes over a scan of one-off ones", "[tree][policy]") {
  Fixture f(1, 64, EvictionPolicy::slru);
  f.cache(iota(5, 0));
  f.hit(iota(6, 0));  // reused once: protected
  for (std::int32_t i = 1; i <= 5; ++i) f.cache(iota(5, 100 * i));  // a scan of newer one-off prompts
  REQUIRE(f.tree->evict(25).ok());
  CHECK(f.hit(iota(6, 0)) == 5);  // survived although it is the oldest
  CHECK(f.tree->cached_tokens() == 5);
}

TEST_CASE("ghost_slru keeps a reused prefix over a scan of one-off prompts, LRU loses it", "[tree][policy][ghost]") {
  for (const EvictionPolicy policy : {EvictionPolicy::lru, EvictionPolicy::ghost_slru}) {
    INFO(clm::eviction_policy_name(policy));
    Fixture f(1, 64, policy);
    f.cache(iota(5, 0));
    f.hit(iota(6, 0));                                                  // reused once
    for (std::int32_t i = 1; i <= 40; ++i) f.cache(iota(5, 1000 * i));  // 200 tokens of one-off prompts
    CHECK(f.tree->metrics().evicted_tokens >= 140);
    CHECK(f.hit(iota(6, 0)) == (policy == EvictionPolicy::lru ? 0 : 5));
  }
}

TEST_CASE("ghost_slru: a prefix evicted from probation that comes back enters protected, a new one does not",
          "[tree][policy][ghost]") {
  Fixture f(1, 64, EvictionPolicy::ghost_slru);
  f.cache(iota(5, 0));
  REQUIRE(f.tree->evict(5).ok());  // evicted from probation: remembered
  CHECK(f.tree->ghost_tokens() == 5);
  const InsertOutcome back = f.cache(iota(5, 0));
  CHECK(f.tree->in_protected_segment(back.node));
  CHECK(f.tree->ghost_tokens() == 0);  // a prefix comes back once
  CHECK(f.tree->protected_segment_tokens() == 5);
  const InsertOutcome fresh = f.cache(iota(5, 100));
  CHECK_FALSE(f.tree->in_protected_segment(fresh.node));
  // Below a cached parent: keyed by the parent node and the first page.
  f.cache(concat(iota(5, 100), iota(3, 500)));
  REQUIRE(f.tree->evict(3).ok());  // the 3-token leaf below 100..104 (the LRU probationary leaf)
  CHECK(f.hit(iota(6, 100)) == 5);
  const InsertOutcome child = f.cache(concat(iota(5, 100), iota(3, 500)));
  CHECK(f.tree->in_protected_segment(child.node));
  // A prefix evicted from the protected segment is not remembered: it had its chance there.
  Fixture g(1, 64, EvictionPolicy::ghost_slru);
  g.cache(iota(5, 0));
  g.hit(iota(6, 0));
  REQUIRE(g.tree->evict(5).ok());
  CHECK(g.tree->ghost_tokens() == 0);
  CHECK_FALSE(g.tree->in_protected_segment(g.cache(iota(5, 0)).node));
}

TEST_CASE("ghost_slru: a namespace emptied by eviction still recognises its returning prefix",
          "[tree][policy][ghost]") {
  // The tree drops a namespace's root when its last prefix is evicted; the
  // ghost names top-level prefixes by the namespace, not by that root.
  Fixture f(1, 64, EvictionPolicy::ghost_slru);
  const CacheNamespace tenant{"tenant-a", 3};
  f.cache(iota(5, 0), tenant);
  REQUIRE(f.tree->evict(5).ok());
  REQUIRE(f.tree->metrics().namespaces == 0);
  CHECK_FALSE(f.tree->in_protected_segment(f.cache(iota(5, 0)).node));  // another namespace: new
  CHECK(f.tree->in_protected_segment(f.cache(iota(5, 0), tenant).node));
}

TEST_CASE("ghost_slru: the ghost stays within its cap over many evictions", "[tree][policy][ghost]") {
  clm::PagedKvPoolConfig config;
  config.num_pages = 64;
  config.page_size = 4;
  config.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::PagedKvPool> pool;
  REQUIRE(clm::PagedKvPool::create(config, pool).ok());
  RadixTree tree(*pool, EvictionPolicy::ghost_slru, std::numeric_limits<double>::quiet_NaN(), nullptr, 2.0);
  REQUIRE(tree.ghost_capacity() == 2 * 64 * 4);
  std::size_t bytes_after_warmup = 0;
  for (std::int32_t i = 0; i < 20000; ++i) {
    // One-off prompts, and every third one a prompt evicted earlier coming back
    // (a ghost hit: its FIFO entry dies where it stands).
    const Tokens prompt = iota(4 * (1 + i % 3), 16 * (i % 3 == 2 ? i / 2 : i));
    PrefixMatch hit;
    REQUIRE(tree.match_prefix(prompt, {}, hit).ok());
    std::vector<std::int32_t> pages = hit.pages;
    std::vector<std::int32_t> fresh(prompt.size() / 4 - pages.size());
    REQUIRE(tree.allocate_pages(fresh).ok());
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    InsertOutcome out;
    REQUIRE(tree.insert(prompt, pages, {}, out).ok());
    REQUIRE(tree.ghost_tokens() <= tree.ghost_capacity());
    if (i == 2000) bytes_after_warmup = tree.metadata_bytes();
  }
  REQUIRE(tree.check_invariants().ok());
  CHECK(tree.metrics().evicted_tokens > 100 * static_cast<std::uint64_t>(tree.ghost_capacity()));
  CHECK(tree.metadata_bytes() <= bytes_after_warmup * 2);
}

TEST_CASE("GhostList: bounded by tokens, a key comes back once, dead entries do not pile up", "[ghost]") {
  clm::detail::GhostList ghost;
  ghost.set_capacity(100);
  for (std::uint64_t k = 0; k < 50; ++k) ghost.remember(k, 10);
  CHECK(ghost.tokens() == 100);
  CHECK(ghost.size() == 10);
  CHECK_FALSE(ghost.forget(39));  // the oldest went first
  CHECK(ghost.forget(40));
  CHECK_FALSE(ghost.forget(40));  // once
  CHECK(ghost.tokens() == 90);
  ghost.remember(41, 25);  // refreshed: now the newest, with its new size; 42, the oldest, makes room
  CHECK(ghost.tokens() == 95);
  CHECK_FALSE(ghost.forget(42));
  CHECK(ghost.well_formed());
  // The oldest entry stays live while every newer one is remembered and then
  // forgotten (a prefix that keeps coming back): the FIFO must not keep one
  // dead entry per round.
  const std::size_t bytes = ghost.memory_bytes();
  for (std::uint64_t k = 1000; k < 200000; ++k) {
    ghost.remember(k, 1);
    REQUIRE(ghost.forget(k));
  }
  CHECK(ghost.well_formed());
  CHECK(ghost.forget(43));  // still remembered: nothing pushed it out
  CHECK(ghost.memory_bytes() <= bytes + 4096);
  // No capacity: remembers nothing.
  clm::detail::GhostList none;
  none.remember(1, 1);
  CHECK(none.size() == 0);
  CHECK_FALSE(none.forget(1));
}

TEST_CASE("belady evicts the leaf whose next use is farthest", "[tree][policy][belady]") {
  Fixture f(1, 64, EvictionPolicy::belady);
  f.cache(iota(5, 0));
  f.cache(iota(5, 100));
  f.cache(iota(5, 200));
  f.cache(iota(5, 300));
  const auto set = [&](std::int32_t first, std::uint32_t next_use) {
    const std::vector<std::uint32_t> uses(5, next_use);
    REQUIRE(f.tree->set_next_use(iota(5, first), {}, uses).ok());
  };
  set(0, 10);
  set(100, 30);
  set(200, 20);
  set(300, 40);
  f.cache(iota(5, 400));  // no next use given: never used again
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.tree->cached_tokens() == 20);
  CHECK(f.hit(iota(6, 400)) == 0);
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.hit(iota(6, 300)) == 0);  // next use 40: the farthest
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.hit(iota(6, 100)) == 0);  // 30
  CHECK(f.tree->cached_tokens() == 10);
  // Only a belady tree takes next uses.
  Fixture lru(1, 64, EvictionPolicy::lru);
  lru.cache(iota(5, 0));
  const std::vector<std::uint32_t> uses(5, 1);
  CHECK(lru.tree->set_next_use(iota(5, 0), {}, uses).code() == clm::StatusCode::failed_precondition);
  CHECK(f.tree->set_next_use(iota(5, 0), {}, std::vector<std::uint32_t>(2, 1)).code() ==
        clm::StatusCode::invalid_argument);
}

// A host's priority under ghost_slru: an insert above 0 enters the protected
// segment (as a prefix the ghost remembers does), and priorities order the
// leaves before the segments do. Protected cap 10 tokens, so that it overflows.
TEST_CASE("ghost_slru: a prefix inserted with a priority is protected and outlives those without",
          "[tree][policy][ghost]") {
  Fixture f(1, 64, EvictionPolicy::ghost_slru);
  f.tree = std::make_unique<RadixTree>(*f.pool, EvictionPolicy::ghost_slru, 10.0 / 64);
  auto cached = [&](const Tokens& tokens) {
    clm::PrefixPeek peek;
    REQUIRE(f.tree->peek_prefix(concat(tokens, {9999}), {}, peek).ok());  // looks without touching
    return peek.cached_tokens;
  };
  const Tokens a = iota(5, 0), b = iota(5, 100), c = iota(5, 200), d = iota(5, 300), e = iota(5, 500);
  const InsertOutcome in_a = f.cache(a, {}, 1);
  CHECK(f.tree->in_protected_segment(in_a.node));
  const InsertOutcome in_b = f.cache(b, {}, 1);
  CHECK(f.tree->in_protected_segment(in_b.node));
  const InsertOutcome in_e = f.cache(e);
  CHECK_FALSE(f.tree->in_protected_segment(in_e.node));  // priority 0: probation, as before
  const InsertOutcome in_c = f.cache(c, {}, 1);          // 15 protected tokens: a, the LRU, falls back
  CHECK_FALSE(f.tree->in_protected_segment(in_a.node));
  CHECK(f.tree->in_protected_segment(in_c.node));
  const InsertOutcome in_d = f.cache(d);
  CHECK(f.hit(concat(d, {9999})) == 5);  // a hit protects d; b falls back
  CHECK(f.tree->in_protected_segment(in_d.node));
  CHECK_FALSE(f.tree->in_protected_segment(in_b.node));
  CHECK(f.tree->protected_segment_tokens() == 10);
  // Priority 0 first (probation, then protected), then priority 1 (the same).
  const std::vector<Tokens> order = {e, d, a, b, c};
  for (std::size_t gone = 0; gone < order.size(); ++gone) {
    INFO("after " << gone << " evictions");
    for (std::size_t k = 0; k < order.size(); ++k) CHECK(cached(order[k]) == (k < gone ? 0 : 5));
    REQUIRE(f.tree->evict(5).ok());
  }
  CHECK(f.tree->cached_tokens() == 0);
  CHECK(f.tree->ghost_tokens() == 15);  // e, a and b left probation; d left the protected segment
}

TEST_CASE("priority evicts the lowest priority first, ties by LRU", "[tree][policy]") {
  Fixture f(1, 64, EvictionPolicy::priority);
  f.cache(iota(5, 0), {}, 90);
  f.cache(iota(5, 100), {}, 10);
  f.cache(iota(5, 200), {}, 10);
  f.hit(iota(6, 100));
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.hit(iota(6, 200)) == 0);  // priority 10, older than 100
  REQUIRE(f.tree->evict(5).ok());
  CHECK(f.hit(iota(6, 100)) == 0);
  CHECK(f.hit(iota(6, 0)) == 5);
}

// A conversation cached with priority 1 (its next turn is expected), then
// again with 0 (that turn came; no other is expected). Under raise its first
// turn keeps 1 and outlives a newer prefix; under set the second insert drops
// the whole path to 0 and the first turn goes by LRU. Both policies that read
// priorities. The newer prefix is hit once, so that under ghost_slru it is
// protected like the first turn (which its second turn hit) and the two are
// ordered by priority, then LRU, as under `priority`.
TEST_CASE("an insert's priority update: raise keeps the highest, set takes the latest", "[tree][policy]") {
  for (const EvictionPolicy policy : {EvictionPolicy::priority, EvictionPolicy::ghost_slru}) {
    for (const clm::PriorityUpdate update : {clm::PriorityUpdate::raise, clm::PriorityUpdate::set}) {
      INFO(clm::eviction_policy_name(policy) << ", " << clm::priority_update_name(update));
      Fixture f(1, 64, policy);
      auto cached = [&](const Tokens& tokens) {
        clm::PrefixPeek peek;
        REQUIRE(f.tree->peek_prefix(concat(tokens, {9999}), {}, peek).ok());
        return peek.cached_tokens;
      };
      const Tokens first_turn = iota(5, 0), second_turn = concat(first_turn, iota(5, 50));
      const Tokens older = iota(5, 100), newer = iota(5, 200);
      f.cache(first_turn, {}, 1, update);
      f.cache(older, {}, 0, update);
      f.cache(second_turn, {}, 0, update);
      f.cache(newer, {}, 0, update);
      REQUIRE(f.hit(concat(newer, {9999})) == 5);
      // The second turn's own tail is a new leaf at 0 either way; below it the
      // first turn's node is at 1 (raise) or 0 (set).
      std::vector<std::pair<Tokens, std::int32_t>> order;  // a prompt, and what stays cached of it
      if (update == clm::PriorityUpdate::raise) {
        order = {{older, 0}, {second_turn, 5}, {newer, 0}, {first_turn, 0}};
      } else {
        order = {{older, 0}, {second_turn, 5}, {first_turn, 0}, {newer, 0}};
      }
      for (const auto& [gone, left] : order) {
        REQUIRE(f.tree->evict(5).ok());
        REQUIRE(f.tree->check_invariants().ok());
        CHECK(cached(gone) == left);
      }
      CHECK(f.tree->cached_tokens() == 0);
    }
  }
}

TEST_CASE("allocate_pages evicts when short and fails cleanly when all is locked", "[tree]") {
  Fixture f(4, 8);
  InsertOutcome a = f.cache(iota(16, 0));   // 4 pages
  f.cache(iota(16, 100));                   // 4 pages: pool full
  CHECK(f.pool->free_pages() == 0);
  REQUIRE(f.tree->lock(a.node).ok());
  Tokens three(3);
  REQUIRE(f.tree->allocate_pages(three).ok());  // evicts the three pages it needs from b's tail
  CHECK(f.tree->cached_tokens() == 20);
  CHECK(f.hit(iota(17, 100)) == 4);  // b's first page still serves its prefix
  REQUIRE(f.pool->release(three).ok());
  REQUIRE(f.tree->lock(f.cache(iota(16, 200)).node).ok());  // everything cached is locked now
  Tokens one(1, -7);
  clm::Status s = f.tree->allocate_pages(one);
  CHECK(s.code() == clm::StatusCode::out_of_memory);
  CHECK(s.message().find("locked") != std::string::npos);
  CHECK(one[0] == -7);
  CHECK(f.tree->cached_tokens() == 32);  // nothing was evicted for a failed allocation
}

namespace {
// Runs fn on a thread with a small stack, where recursion over a deep tree
// would overflow at once.
template <class Fn>
void run_on_small_stack(Fn fn) {
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, 256 * 1024) == 0);
  pthread_t thread;
  auto trampoline = [](void* arg) -> void* {
    (*static_cast<Fn*>(arg))();
    return nullptr;
  };
  REQUIRE(pthread_create(&thread, &attr, trampoline, &fn) == 0);
  REQUIRE(pthread_join(thread, nullptr) == 0);
  pthread_attr_destroy(&attr);
}
}  // namespace

TEST_CASE("a deep tree evicts and tears down without recursion", "[tree]") {
  const std::int32_t depth = 8192;
  Fixture f(1, depth + 8);
  // Each insert extends the previous sequence by one token: a chain of nodes.
  Tokens seq;
  Tokens pages;
  for (std::int32_t i = 0; i < depth; ++i) {
    seq.push_back(i % 7);
    pages.push_back(0);
    REQUIRE(f.pool->allocate({&pages.back(), 1}).ok());
    InsertOutcome out;
    REQUIRE(f.tree->insert(seq, pages, {}, out).ok());
    REQUIRE(out.cached_tokens == i);
  }
  CHECK(f.tree->metrics().nodes == depth);
  CHECK(f.hit(concat(seq, {1})) == depth);
  std::int64_t evicted = 0;
  bool evict_ok = false;
  run_on_small_stack([&] { evict_ok = f.tree->evict(depth / 2, &evicted).ok(); });
  CHECK(evict_ok);
  CHECK(evicted == depth / 2);
  CHECK(f.hit(concat(seq, {1})) == depth / 2);
  run_on_small_stack([&] { f.tree.reset(); });  // the destructor walks the rest
  CHECK(f.pool->used_pages() == 0);
  f.tree = std::make_unique<RadixTree>(*f.pool);
}

TEST_CASE("bad input gives a status and changes nothing", "[tree][errors]") {
  Fixture f(2, 16);
  f.cache(iota(6));
  const auto before = f.tree->metrics();
  PrefixMatch m;
  InsertOutcome out;
  Tokens pages(8);
  CHECK(f.tree->match_prefix(Tokens{}, {}, m).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->match_prefix(Tokens{1, -2, 3}, {}, m).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->insert(Tokens{}, pages, {}, out).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->insert(Tokens{0, 1, -5, 3}, pages, {}, out).code() == clm::StatusCode::invalid_argument);
  Tokens four(4), unallocated(5, 9);
  CHECK(f.tree->insert(iota(10), four, {}, out).code() == clm::StatusCode::invalid_argument);  // 5 needed
  CHECK(f.tree->insert(iota(10), unallocated, {}, out).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->insert(iota(4, 50), pages, {}, out, 101).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->evict(-1).code() == clm::StatusCode::invalid_argument);
  CHECK(f.tree->lock(clm::NodeRef{}).code() == clm::StatusCode::not_found);
  CHECK(f.tree->unlock(clm::NodeRef{12345, 1}).code() == clm::StatusCode::not_found);
  // A page the tree already owns cannot be inserted again under another prefix.
  PrefixMatch hit;
  REQUIRE(f.tree->match_prefix(iota(7), {}, hit).ok());
  Tokens stolen = {hit.pages[0], hit.pages[1]};
  clm::Status s = f.tree->insert(Tokens{70, 71, 72, 73}, stolen, {}, out);
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  CHECK(!s.message().empty());
  const auto after = f.tree->metrics();
  CHECK(after.cached_tokens == before.cached_tokens);
  CHECK(after.pages_used == before.pages_used);
  CHECK(after.nodes == before.nodes);
}

TEST_CASE("an insert that runs out of host memory changes nothing", "[tree][errors]") {
  // Every allocation of the insert fails in turn (operator new, and the nodes' blocks through the tree's hook).
  clm::detail::tree_block_allocation_fault = &clm_test::allocation_fails;
  struct Unhook {
    ~Unhook() { clm::detail::tree_block_allocation_fault = nullptr; }
  } unhook;
  const std::string salt(40, 's');  // longer than the small-string buffer: its copy allocates
  for (EvictionPolicy policy : {EvictionPolicy::lru, EvictionPolicy::slru}) {
    INFO(clm::eviction_policy_name(policy));
    Fixture f(2, 64, policy);
    f.cache(iota(20));  // one node of 10 pages
    f.hit(iota(21));    // SLRU: now in the protected segment
    struct Case {
      const char* what;
      Tokens tokens;
      CacheNamespace ns;
      bool tree_pages;  // the caller passes the tree's ids for the cached part (else its own: duplicates)
      std::int64_t new_tokens;
    };
    const Case cases[] = {
        {"a split of the cached node and a new leaf, duplicates released",
         concat(iota(10), iota(6, 900)),
         {},
         false,
         6},
        {"a new namespace", iota(8, 500), {salt, 7}, false, 8},
        {"a leaf below the cached node", concat(iota(20), iota(6, 300)), {}, true, 6},
    };
    for (const Case& c : cases) {
      INFO(c.what);
      const std::size_t n_pages = c.tokens.size() / 2;
      Tokens pages;
      if (c.tree_pages) {
        PrefixMatch hit;
        REQUIRE(f.tree->match_prefix(c.tokens, c.ns, hit).ok());
        pages = hit.pages;
      }
      Tokens fresh(n_pages - pages.size());
      REQUIRE(f.tree->allocate_pages(fresh).ok());
      pages.insert(pages.end(), fresh.begin(), fresh.end());
      const auto before = f.tree->metrics();
      long failures = 0;
      for (long n = 0;; ++n) {
        INFO("allocation " << n << " fails");
        InsertOutcome out;
        Tokens attempt = pages;
        clm::Status status;
        bool threw = false, fired = false;
        {  // no Catch macro while armed: its own allocations would count
          clm_test::FailAllocation fail(n);
          try {
            status = f.tree->insert(c.tokens, attempt, c.ns, out);
          } catch (const std::bad_alloc&) {
            threw = true;
          }
          fired = fail.fired();
        }
        REQUIRE(threw == fired);
        if (!threw) {
          REQUIRE(status.ok());
          break;
        }
        ++failures;
        // Nothing changed: the tree's own accounting, its sizes, and the caller's pages.
        REQUIRE(f.tree->check_invariants().ok());
        const auto after = f.tree->metrics();
        CHECK(after.cached_tokens == before.cached_tokens);
        CHECK(after.evictable_tokens == before.evictable_tokens);
        CHECK(after.nodes == before.nodes);
        CHECK(after.namespaces == before.namespaces);
        CHECK(after.inserted_tokens == before.inserted_tokens);
        CHECK(after.pages_used == before.pages_used);
        CHECK(attempt == pages);
        for (std::int32_t p : pages) CHECK(f.pool->is_allocated(p));
      }
      CHECK(failures > 0);
      REQUIRE(f.tree->check_invariants().ok());
      CHECK(f.tree->metrics().cached_tokens == before.cached_tokens + c.new_tokens);
      CHECK(f.hit(concat(c.tokens, {1}), c.ns) == static_cast<std::int32_t>(c.tokens.size()));
    }
    // Every page is the tree's or free: the duplicates went back to the pool.
    CHECK(f.tree->metrics().pages_used * 2 == f.tree->metrics().cached_tokens);
  }
}

TEST_CASE("metrics count queries, hits and evictions exactly", "[tree][metrics]") {
  Fixture f(1, 32);
  f.cache(iota(10));                  // queried 10, hit 0
  f.hit(iota(10));                    // queried 10, hit 9
  f.cache(concat(iota(10), {5, 6}));  // queried 12, hit 10
  REQUIRE(f.tree->evict(2).ok());
  auto m = f.tree->metrics();
  CHECK(m.match_calls == 3);
  CHECK(m.tokens_queried == 32);
  CHECK(m.tokens_hit == 19);
  CHECK(m.hit_rate() == Approx(19.0 / 32.0));
  CHECK(m.evicted_tokens == 2);
  CHECK(m.evictions == 1);
  CHECK(m.cached_tokens == 10);
  CHECK(m.pages_used == 10);
  CHECK(m.pages_free == 22);
  CHECK(m.inserted_tokens == 12);
  CHECK(m.metadata_bytes > 0);
}
