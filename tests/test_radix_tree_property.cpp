// Property tests for RadixTree + PagedKvPool: long random operation sequences
// checked step by step against a naive reference model (tests/radix_tree_model.hpp,
// which says what is checked), plus bad-input tests.
//
// Configurations: page size 1, 16, 64 x lru, lfu, slru, priority, ghost_slru;
// pools of 192, 128, 64 pages. ghost_slru's ghost remembers one pool's worth
// of evictions (default 4), so that it overflows and trims often.
//
// Seeds: fresh from std::random_device each run, printed on failure; set
// CLM_TEST_SEED=<n> to replay one. CLM_PROPERTY_OPS=<n> sets the number of
// operations per configuration (default 100000: ~8 s for all fifteen in a
// release build, ~20 s under ASan+UBSan). CLM_PROPERTY_STATS=1 prints what
// each run exercised.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "clm/cache/radix_tree.hpp"
#include "radix_tree_model.hpp"

namespace {

using namespace clm_test::radix_model;

// ---- seeds, sizes ------------------------------------------------------------

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::strtoull(value, nullptr, 0);
}

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    std::random_device device;
    const std::uint64_t fresh = (std::uint64_t{device()} << 32) ^ device();
    return env_u64("CLM_TEST_SEED", fresh);
  }();
  return seed;
}

std::int64_t ops_per_config() { return static_cast<std::int64_t>(env_u64("CLM_PROPERTY_OPS", 100000)); }

void run_config(std::int32_t page_size, EvictionPolicy policy) {
  Config config{page_size, policy, 0, 0};
  // SLRU's protected segment: small enough to overflow often.
  switch (page_size) {
    case 1: config.num_pages = 192, config.max_pages = 24, config.protected_fraction = 0.25; break;
    case 16: config.num_pages = 128, config.max_pages = 8, config.protected_fraction = 0.2; break;
    default: config.num_pages = 64, config.max_pages = 6, config.protected_fraction = 0.3; break;
  }
  config.ghost_memory = 1.0;
  const std::uint64_t seed = base_seed();
  const std::uint64_t run_seed = mix(seed ^ (static_cast<std::uint64_t>(page_size) << 8) ^
                                     static_cast<std::uint64_t>(policy));
  const std::int64_t ops = ops_per_config();
  INFO("CLM_TEST_SEED=" << seed << " (page_size " << page_size << ", policy " << clm::eviction_policy_name(policy)
                        << ", run seed " << run_seed << ", " << ops << " ops)");
  PropertyRun run(config, run_seed, [](const std::string& what) { FAIL(what); });
  run.run(ops);
  // Not a check, but a run that never evicts or never refuses tests little.
  if (std::getenv("CLM_PROPERTY_STATS") != nullptr) fmt::print(stderr, "{}\n", run.stats());
  CHECK(run.evicted_total() > 0);
  CHECK(run.inserts_ok() > 0);
  CHECK(run.hits() > 0);
  if (ops >= 10000) CHECK(run.inserts_refused() > 0);
}

}  // namespace

TEST_CASE("property: page_size 1 lru", "[property]") { run_config(1, EvictionPolicy::lru); }
TEST_CASE("property: page_size 1 lfu", "[property]") { run_config(1, EvictionPolicy::lfu); }
TEST_CASE("property: page_size 1 slru", "[property]") { run_config(1, EvictionPolicy::slru); }
TEST_CASE("property: page_size 1 priority", "[property]") { run_config(1, EvictionPolicy::priority); }
TEST_CASE("property: page_size 16 lru", "[property]") { run_config(16, EvictionPolicy::lru); }
TEST_CASE("property: page_size 16 lfu", "[property]") { run_config(16, EvictionPolicy::lfu); }
TEST_CASE("property: page_size 16 slru", "[property]") { run_config(16, EvictionPolicy::slru); }
TEST_CASE("property: page_size 16 priority", "[property]") { run_config(16, EvictionPolicy::priority); }
TEST_CASE("property: page_size 64 lru", "[property]") { run_config(64, EvictionPolicy::lru); }
TEST_CASE("property: page_size 64 lfu", "[property]") { run_config(64, EvictionPolicy::lfu); }
TEST_CASE("property: page_size 64 slru", "[property]") { run_config(64, EvictionPolicy::slru); }
TEST_CASE("property: page_size 64 priority", "[property]") { run_config(64, EvictionPolicy::priority); }
TEST_CASE("property: page_size 1 ghost_slru", "[property]") { run_config(1, EvictionPolicy::ghost_slru); }
TEST_CASE("property: page_size 16 ghost_slru", "[property]") { run_config(16, EvictionPolicy::ghost_slru); }
TEST_CASE("property: page_size 64 ghost_slru", "[property]") { run_config(64, EvictionPolicy::ghost_slru); }

// ---- bad input ---------------------------------------------------------------------
// Each refused call must return the right code with a message, keep the tree's
// invariants, and change nothing observable: cached/evictable/protected
// tokens, every page's reference count and owner, and what matches return.

namespace {

struct Fixture {
  explicit Fixture(std::int32_t page_size = 4, std::int32_t num_pages = 32, EvictionPolicy policy = EvictionPolicy::lru) {
    clm::PagedKvPoolConfig pc;
    pc.num_pages = num_pages;
    pc.page_size = page_size;
    pc.memory = clm::MemoryKind::none;
    const clm::Status created = clm::PagedKvPool::create(pc, pool);
    REQUIRE(created.ok());
    tree = std::make_unique<clm::RadixTree>(*pool, policy);
  }

  std::int32_t ps() const { return pool->page_size(); }

  Pages allocate(std::size_t n) {
    Pages pages(n);
    const clm::Status s = tree->allocate_pages(pages);
    REQUIRE(s.ok());
    return pages;
  }

  // Inserts with fresh pages throughout (duplicates of the cached part are
  // released by the tree); returns the outcome and the tree's pages.
  std::pair<clm::InsertOutcome, Pages> insert(const Tokens& t, clm::CacheNamespace ns = {}, int priority = 0) {
    Pages pages = allocate(t.size() / static_cast<std::size_t>(ps()));
    clm::InsertOutcome out;
    const clm::Status s = tree->insert(t, pages, ns, out, priority);
    REQUIRE(s.ok());
    return {out, pages};
  }

  clm::PrefixMatch match(const Tokens& t, clm::CacheNamespace ns = {}) {
    clm::PrefixMatch m;
    const clm::Status s = tree->match_prefix(t, ns, m);
    REQUIRE(s.ok());
    return m;
  }

  std::unique_ptr<clm::PagedKvPool> pool;
  std::unique_ptr<clm::RadixTree> tree;
};

struct Snapshot {
  std::int64_t cached, evictable, locked;
  std::int32_t free;
  std::vector<std::int32_t> refs;
  std::vector<bool> owned;
  std::vector<std::pair<std::int32_t, Pages>> matches;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(Fixture& f, const std::vector<std::pair<Tokens, clm::CacheNamespace>>& probes) {
  Snapshot s{f.tree->cached_tokens(), f.tree->evictable_tokens(), f.tree->protected_tokens(), f.pool->free_pages(),
             {}, {}, {}};
  for (std::int32_t p = 0; p < f.pool->num_pages(); ++p) {
    s.refs.push_back(f.pool->ref_count(p));
    s.owned.push_back(f.tree->owns_page(p));
  }
  for (const auto& [t, ns] : probes) {
    const clm::PrefixMatch m = f.match(t, ns);
    s.matches.emplace_back(m.cached_tokens, m.pages);
  }
  return s;
}

// Runs `call`, which must be refused with `code`, and checks that nothing changed.
template <class Call>
void expect_refused(Fixture& f, const std::vector<std::pair<Tokens, clm::CacheNamespace>>& probes, StatusCode code,
                    Call&& call) {
  const Snapshot before = snapshot(f, probes);
  const clm::Status s = call();
  INFO("status " << s.code_name() << ": " << s.message());
  CHECK(s.code() == code);
  CHECK_FALSE(s.message().empty());
  const clm::Status inv = f.tree->check_invariants();
  INFO(inv.message());
  CHECK(inv.ok());
  CHECK(snapshot(f, probes) == before);
}

Tokens seq(std::int32_t first, std::size_t n) {
  Tokens t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<std::int32_t>(i);
  return t;
}

Tokens plus(Tokens t, const Tokens& more) {
  t.insert(t.end(), more.begin(), more.end());
  return t;
}

}  // namespace

TEST_CASE("bad input: negative token ids and empty sequences", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 12);
  f.insert(a);
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(a, {0}), {}}, {seq(1, 6), {}}};
  Tokens in_cached = plus(a, seq(50, 4));  // a negative id where the cache has a valid one
  in_cached[5] = -1;
  // (Sequences shorter than a page: see "insert validates token ids when shorter than a page".)
  for (const Tokens& bad :
       {Tokens{1, 2, -1, 4, 5}, Tokens{std::numeric_limits<std::int32_t>::min(), 1, 2, 3, 4}, plus(a, {-2}),
        plus(a, {7, 7, 7, -9}), in_cached, plus(seq(1, 5), {-1})}) {
    for (const clm::CacheNamespace ns : {clm::CacheNamespace{}, clm::CacheNamespace{.salt = "never-seen"}}) {
      INFO("tokens " << fmt::format("{}", bad) << " in salt '" << ns.salt << "'");
      clm::PrefixMatch m;
      m.cached_tokens = 77;
      expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->match_prefix(bad, ns, m); });
      Pages pages = f.allocate(bad.size() / 4 + 1);
      const Pages given = pages;
      clm::InsertOutcome out;
      expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->insert(bad, pages, ns, out); });
      CHECK(pages == given);
      REQUIRE(f.pool->release(pages).ok());
    }
  }
  clm::PrefixMatch m;
  expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->match_prefix({}, {}, m); });
  Pages pages = f.allocate(2);
  clm::InsertOutcome out;
  expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->insert({}, pages, {}, out); });
  REQUIRE(f.pool->release(pages).ok());
}

TEST_CASE("bad input: unlock without lock", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 8);
  const Tokens ab = plus(a, seq(100, 8));
  // The nodes by name: lambdas may not capture structured bindings before clang 16.
  const auto node_a = f.insert(a).first.node;
  const auto node_ab = f.insert(ab).first.node;
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(ab, {0}), {}}};

  // Never locked.
  expect_refused(f, probes, StatusCode::failed_precondition, [&] { return f.tree->unlock(node_a); });
  // Locked once, unlocked twice.
  REQUIRE(f.tree->lock(node_ab).ok());
  CHECK(f.tree->protected_tokens() == 16);
  REQUIRE(f.tree->unlock(node_ab).ok());
  expect_refused(f, probes, StatusCode::failed_precondition, [&] { return f.tree->unlock(node_ab); });
  // An ancestor of a locked node is protected, but holds no lock of its own.
  REQUIRE(f.tree->lock(node_ab).ok());
  expect_refused(f, probes, StatusCode::failed_precondition, [&] { return f.tree->unlock(node_a); });
  REQUIRE(f.tree->unlock(node_ab).ok());
  // A namespace root (the node of a miss) is not locked either.
  const clm::PrefixMatch miss = f.match(seq(500, 9), {.salt = "x"});
  REQUIRE(miss.cached_tokens == 0);
  expect_refused(f, probes, StatusCode::failed_precondition, [&] { return f.tree->unlock(miss.node); });
  CHECK(f.tree->protected_tokens() == 0);
  CHECK(f.tree->check_invariants().ok());
}

TEST_CASE("bad input: stale and made-up node handles", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 8);
  const auto [out_a, pages_a] = f.insert(a);
  // A handle survives splits of its node...
  const clm::PrefixMatch half = f.match(seq(1, 5));
  REQUIRE(half.cached_tokens == 4);
  REQUIRE(f.tree->lock(out_a.node).ok());
  REQUIRE(f.tree->unlock(out_a.node).ok());
  // ...but not eviction.
  std::int64_t evicted = 0;
  REQUIRE(f.tree->evict(std::numeric_limits<std::int64_t>::max(), &evicted).ok());
  REQUIRE(evicted == 8);
  REQUIRE(f.tree->cached_tokens() == 0);
  const auto [again, pages_again] = f.insert(a);  // the same prefix again: a new node
  const Tokens b = seq(40, 8);
  f.insert(b);
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(a, {0}), {}}, {plus(b, {0}), {}}};
  for (const NodeRef stale : {out_a.node, half.node}) {
    expect_refused(f, probes, StatusCode::not_found, [&] { return f.tree->lock(stale); });
    expect_refused(f, probes, StatusCode::not_found, [&] { return f.tree->unlock(stale); });
  }
  for (const NodeRef made_up : {NodeRef{}, NodeRef{-1, 1}, NodeRef{1 << 30, 1}, NodeRef{again.node.index, 0},
                                NodeRef{again.node.index, again.node.generation + 1}}) {
    expect_refused(f, probes, StatusCode::not_found, [&] { return f.tree->lock(made_up); });
    expect_refused(f, probes, StatusCode::not_found, [&] { return f.tree->unlock(made_up); });
  }
  REQUIRE(f.tree->lock(again.node).ok());
  REQUIRE(f.tree->unlock(again.node).ok());
}

TEST_CASE("bad input: insert with too few pages", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 8);
  f.insert(a);
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(a, {0}), {}}};
  const Tokens t = plus(a, seq(50, 6));  // 14 tokens: 3 pages
  for (std::size_t n : {0, 1, 2}) {
    Pages pages = f.allocate(n);
    const Pages given = pages;
    clm::InsertOutcome out;
    expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->insert(t, pages, {}, out); });
    CHECK(pages == given);
    REQUIRE(f.pool->release(pages).ok());
  }
  // Shorter than a page: nothing to store, no pages needed.
  Pages none;
  clm::InsertOutcome out;
  REQUIRE(f.tree->insert(seq(7, 3), none, {}, out).ok());
  CHECK(out.stored_tokens == 0);
  CHECK(out.cached_tokens == 0);
}

TEST_CASE("bad input: insert with pages that are not the caller's to give", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 8);  // 2 pages
  const auto [out_a, pages_a] = f.insert(a);
  const Tokens b = seq(60, 8);
  const auto [out_b, pages_b] = f.insert(b);
  const Tokens ax = plus(a, seq(200, 8));  // a's 2 cached pages + 2 new
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(ax, {0}), {}}, {plus(b, {0}), {}}};
  std::int32_t free_page = -1;
  for (std::int32_t p = 0; p < f.pool->num_pages(); ++p) {
    if (f.pool->ref_count(p) == 0) free_page = p;
  }
  REQUIRE(free_page >= 0);
  Pages fresh = f.allocate(4);
  const std::int32_t f0 = fresh[0], f1 = fresh[1], f2 = fresh[2], f3 = fresh[3];
  const std::int32_t a0 = pages_a[0], a1 = pages_a[1], b0 = pages_b[0];

  struct Case {
    const char* what;
    Pages pages;
  };
  const std::vector<Case> cases = {
      {"new page not allocated (free)", {a0, a1, f0, free_page}},
      {"new page -1", {a0, a1, -1, f1}},
      {"new page past the pool", {a0, a1, f0, f.pool->num_pages()}},
      {"new page INT32_MAX", {a0, a1, std::numeric_limits<std::int32_t>::max(), f1}},
      {"new page already cached under another prefix", {a0, a1, f0, b0}},
      {"new page already cached in this very prefix", {a0, a1, f0, a0}},
      {"cached position given another cached page", {a1, a0, f0, f1}},
      {"cached position given a page of another prefix", {b0, a1, f0, f1}},
      {"cached position given a free page", {free_page, a1, f0, f1}},
      {"new page passed twice", {a0, a1, f0, f0}},
      {"duplicate equal to a new page", {f0, a1, f0, f1}},
      {"duplicate passed twice", {f2, f2, f0, f1}},
      {"duplicate passed twice, new pages fine", {f3, f3, f0, f1}},
  };
  for (const Case& c : cases) {
    INFO(c.what << ": " << fmt::format("{}", c.pages));
    Pages pages = c.pages;
    clm::InsertOutcome out;
    expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->insert(ax, pages, {}, out); });
    CHECK(pages == c.pages);
  }
  // Our four pages are still ours, untouched.
  for (std::int32_t p : fresh) {
    CHECK(f.pool->ref_count(p) == 1);
    CHECK_FALSE(f.tree->owns_page(p));
  }
  // And a good insert after all that: duplicates f2, f3 are released, f0, f1 kept.
  Pages pages = {f2, f3, f0, f1};
  clm::InsertOutcome out;
  REQUIRE(f.tree->insert(ax, pages, {}, out).ok());
  CHECK(out.cached_tokens == 8);
  CHECK(out.stored_tokens == 16);
  CHECK(pages == Pages{a0, a1, f0, f1});
  CHECK(f.pool->ref_count(f2) == 0);
  CHECK(f.pool->ref_count(f3) == 0);
  CHECK(f.tree->owns_page(f0));
  CHECK(f.tree->owns_page(f1));
  CHECK(f.tree->check_invariants().ok());
}

TEST_CASE("bad input: priority outside [0, 100], or an unknown priority update", "[bad_input]") {
  Fixture f(4, 32, EvictionPolicy::priority);
  const Tokens a = seq(1, 8);
  f.insert(a);
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(a, {0}), {}}};
  const Tokens t = plus(a, seq(30, 4));
  for (int priority : {-1, 101, 255, 256, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    INFO("priority " << priority);
    Pages pages = f.allocate(3);
    const Pages given = pages;
    clm::InsertOutcome out;
    expect_refused(f, probes, StatusCode::invalid_argument,
                   [&] { return f.tree->insert(t, pages, {.salt = "p"}, out, priority); });
    CHECK(pages == given);
    REQUIRE(f.pool->release(pages).ok());
  }
  for (int update : {2, 255}) {  // neither raise nor set
    INFO("priority update " << update);
    Pages pages = f.allocate(3);
    const Pages given = pages;
    clm::InsertOutcome out;
    expect_refused(f, probes, StatusCode::invalid_argument, [&] {
      return f.tree->insert(t, pages, {.salt = "p"}, out, 1, static_cast<clm::PriorityUpdate>(update));
    });
    CHECK(pages == given);
    REQUIRE(f.pool->release(pages).ok());
  }
  for (int priority : {0, 100}) {
    const auto [out, pages] = f.insert(t, {}, priority);
    CHECK(out.stored_tokens == 12);
  }
}

TEST_CASE("bad input: evict a negative number of tokens", "[bad_input]") {
  Fixture f;
  const Tokens a = seq(1, 8);
  f.insert(a);
  const std::vector<std::pair<Tokens, clm::CacheNamespace>> probes = {{plus(a, {0}), {}}};
  for (std::int64_t n : {std::int64_t{-1}, std::numeric_limits<std::int64_t>::min()}) {
    std::int64_t evicted = 12345;
    expect_refused(f, probes, StatusCode::invalid_argument, [&] { return f.tree->evict(n, &evicted); });
  }
  std::int64_t evicted = -1;
  REQUIRE(f.tree->evict(0, &evicted).ok());
  CHECK(evicted == 0);
  CHECK(f.tree->cached_tokens() == 8);
}

TEST_CASE("bad input: allocate_pages while everything is locked", "[bad_input]") {
  Fixture f(4, 8);
  // Fill the pool: four prefixes of two pages, all locked.
  std::vector<Tokens> prefixes;
  for (std::int32_t i = 0; i < 4; ++i) {
    prefixes.push_back(seq(10 * i + 1, 8));
    const auto [out, pages] = f.insert(prefixes.back());
    REQUIRE(f.tree->lock(out.node).ok());
  }
  REQUIRE(f.pool->free_pages() == 0);
  REQUIRE(f.tree->evictable_tokens() == 0);
  std::vector<std::pair<Tokens, clm::CacheNamespace>> probes;
  for (const Tokens& t : prefixes) probes.push_back({plus(t, {0}), {}});
  for (std::size_t n : {1, 2, 8, 9}) {
    Pages out(n, -7);
    expect_refused(f, probes, StatusCode::out_of_memory, [&] { return f.tree->allocate_pages(out); });
    CHECK(std::all_of(out.begin(), out.end(), [](std::int32_t p) { return p == -7; }));
  }
  // One prefix unlocked: 2 pages evictable. Asking for 3 evicts nothing.
  const clm::PrefixMatch m = f.match(plus(prefixes[0], {0}));
  REQUIRE(m.cached_tokens == 8);
  REQUIRE(f.tree->unlock(m.node).ok());
  REQUIRE(f.tree->evictable_tokens() == 8);
  Pages three(3, -7);
  expect_refused(f, probes, StatusCode::out_of_memory, [&] { return f.tree->allocate_pages(three); });
  // Asking for 2 evicts it.
  Pages two(2, -7);
  REQUIRE(f.tree->allocate_pages(two).ok());
  CHECK(f.tree->cached_tokens() == 24);
  CHECK(f.match(plus(prefixes[0], {0})).cached_tokens == 0);
  REQUIRE(f.pool->release(two).ok());
}

TEST_CASE("namespaces never share a hit", "[namespaces]") {
  Fixture f(2, 64);
  const Tokens t = seq(5, 10);
  using namespace std::string_view_literals;
  const std::vector<clm::CacheNamespace> all = {
      {"", 0}, {"", 1}, {"", -1}, {"a", 0}, {"a", 1}, {"b", 0}, {"a\0"sv, 0}, {"\0"sv, 0}, {"A", 0}};
  for (std::size_t i = 0; i < all.size(); ++i) {
    f.insert(t, all[i]);
    for (std::size_t j = 0; j < all.size(); ++j) {
      INFO("inserted in " << i << ", matched in " << j);
      CHECK(f.match(plus(t, {0}), all[j]).cached_tokens == (j <= i ? 10 : 0));
    }
  }
  CHECK(f.tree->metrics().namespaces == static_cast<std::int64_t>(all.size()));
}

// ---- regressions: refused calls leave no trace, retained pages ----

// A refused call in a namespace never seen before must not create it
// (metrics().namespaces and metadata_bytes() would grow for good).
TEST_CASE("a refused call leaves no new namespace behind", "[bad_input]") {
  Fixture f(1, 8);
  auto expect_no_trace = [&](const char* what, auto&& call) {
    INFO(what);
    const clm::RadixTreeMetrics before = f.tree->metrics();
    const clm::Status s = call();
    REQUIRE(s.code() == StatusCode::invalid_argument);
    const clm::RadixTreeMetrics after = f.tree->metrics();
    CHECK(after.namespaces == before.namespaces);
    CHECK(after.metadata_bytes == before.metadata_bytes);
  };
  expect_no_trace("insert with a page that is not allocated", [&] {
    Pages pages = {-1, 3};
    clm::InsertOutcome out;
    return f.tree->insert(Tokens{1, 2}, pages, {.salt = "tenant 1"}, out);
  });
  expect_no_trace("insert with a negative token id", [&] {
    Pages pages = {0, 1};
    clm::InsertOutcome out;
    return f.tree->insert(Tokens{1, -2}, pages, {.salt = "tenant 2"}, out);
  });
  expect_no_trace("match with a negative token id", [&] {
    clm::PrefixMatch m;
    return f.tree->match_prefix(Tokens{1, -2}, {.salt = "tenant 3"}, m);
  });
}

// A miss in a namespace never seen before creates its root (the node a caller
// locks). Probes on fresh salts that never lock or insert (a scanner, a
// per-request salt) must not pile them up: the tree keeps the last kMissRoots.
TEST_CASE("misses in unseen namespaces leave a bounded number of roots", "[namespaces]") {
  Fixture f(4, 64);
  std::mt19937_64 rng(base_seed());
  const Tokens cached = seq(100 + static_cast<std::int32_t>(rng() % 1000), 16);
  f.insert(cached, {.salt = "owner"});
  auto probe = [&](std::int64_t i) {
    return f.match(plus(cached, {0}),
                   {.salt = fmt::format("probe-{}", i), .adapter_id = static_cast<std::int32_t>(i % 3)});
  };
  constexpr auto kCap = static_cast<std::int64_t>(clm::RadixTree::kMissRoots);
  // A root locked right after its miss, and one inserted under, outlive the window.
  const clm::PrefixMatch locked_miss = f.match(plus(cached, {0}), {.salt = "locked"});
  REQUIRE(locked_miss.cached_tokens == 0);
  REQUIRE(f.tree->lock(locked_miss.node).ok());
  (void)f.match(plus(cached, {0}), {.salt = "inserted"});
  f.insert(cached, {.salt = "inserted"});
  // A root kept only by its handle: valid until the window passes it.
  const clm::PrefixMatch idle_miss = probe(-1);
  std::size_t bytes_at_window = 0;
  const std::int64_t probes = 20 * kCap + static_cast<std::int64_t>(rng() % 1000);
  for (std::int64_t i = 0; i < probes; ++i) {
    const clm::PrefixMatch m = probe(i);
    REQUIRE(m.cached_tokens == 0);
    // owner, locked, inserted, and at most the window of probe roots.
    REQUIRE(f.tree->metrics().namespaces <= 3 + kCap);
    if (i == 2 * kCap) bytes_at_window = f.tree->metrics().metadata_bytes;
    if (i > 2 * kCap) REQUIRE(f.tree->metrics().metadata_bytes <= bytes_at_window);
    if (i % 97 == 0) REQUIRE(f.tree->check_invariants().ok());
  }
  REQUIRE(f.tree->check_invariants().ok());
  CHECK(f.tree->metrics().namespaces == 3 + kCap);
  // The idle root's handle is now stale: a clear status, not a crash.
  CHECK(f.tree->lock(idle_miss.node).code() == StatusCode::not_found);
  // The others kept their cache and their lock.
  CHECK(f.match(plus(cached, {0}), {.salt = "owner"}).cached_tokens == 16);
  CHECK(f.match(plus(cached, {0}), {.salt = "inserted"}).cached_tokens == 16);
  const std::int64_t before_unlock = f.tree->metrics().namespaces;
  REQUIRE(f.tree->unlock(locked_miss.node).ok());
  CHECK(f.tree->metrics().namespaces == before_unlock - 1);  // unlocked with nothing under it: gone
  REQUIRE(f.tree->check_invariants().ok());
}

// An insert shorter than one page stores nothing, but its ids are still checked.
TEST_CASE("insert validates token ids when shorter than a page", "[bad_input]") {
  Fixture f;
  for (const Tokens& bad : {Tokens{-1}, Tokens{std::numeric_limits<std::int32_t>::min()}, Tokens{1, 2, -3}}) {
    INFO("tokens " << fmt::format("{}", bad));
    Pages none;
    clm::InsertOutcome out;
    const clm::Status s = f.tree->insert(bad, none, {}, out);
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK_FALSE(s.message().empty());
  }
}

// An evicted page returns to the pool only when nobody else holds a reference
// (PagedKvPool::retain). When the host retained the cached pages, eviction
// cannot make room: allocate_pages reports out_of_memory, allocates nothing,
// and leaves a consistent tree (the eviction itself may stand, as documented).
TEST_CASE("allocate_pages with retained cached pages fails cleanly", "[bad_input]") {
  Fixture f(1, 4);
  const auto [out, pages] = f.insert(Tokens{5, 6});  // 2 cached pages
  Pages rest = f.allocate(2);                         // the pool is now full
  REQUIRE(f.pool->retain(pages).ok());                // the host holds the cached pages too
  REQUIRE(f.tree->evictable_tokens() == 2);
  Pages want(1, -7);
  const clm::Status s = f.tree->allocate_pages(want);
  CHECK(s.code() == StatusCode::out_of_memory);
  CHECK_FALSE(s.message().empty());
  CHECK(want[0] == -7);
  CHECK(f.pool->free_pages() == 0);
  CHECK(f.tree->check_invariants().ok());
  // The eviction stands: the tree gave up the one page it needed, the tail,
  // whose only reference now is the host's; the head stays cached.
  CHECK(f.tree->cached_tokens() == 1);
  CHECK(f.pool->ref_count(pages[0]) == 2);
  CHECK(f.pool->ref_count(pages[1]) == 1);
  REQUIRE(f.pool->release(pages).ok());
  REQUIRE(f.pool->release(rest).ok());
}
