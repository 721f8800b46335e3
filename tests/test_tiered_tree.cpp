// The radix tree with a host tier (L2): random request streams that load
// back, back up (write-through and write-back), fetch pages "from storage"
// into the host tier, and evict both tiers, checked after every step.
//
// Independent of the tree's bookkeeping, every page's bytes carry a
// fingerprint of the prefix it ends (FNV over namespace + tokens, computed by
// the test from the prompt). Every page a match returns, device or host, must
// carry the fingerprint of exactly its prefix: a page that was freed and
// reused, copied to the wrong place, or matched under another tenant fails
// here. Pages move between tiers only through the test's own memcpy copier,
// as the Engine's would. After every step: check_invariants() (both tiers'
// ownership bits, the two tier rules, heaps, counts), and every pool page is
// the tree's, the test's, or free. Right after a request finishes, or pages
// are put on the host, matching them again must find them (nothing can have
// evicted them in between).
//
// Seeds: fresh each run, printed on failure; CLM_TEST_SEED=<n> replays one.
// CLM_PROPERTY_OPS=<n> sets operations per configuration.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "alloc_fault.hpp"
#include "clm/cache/radix_tree.hpp"

namespace {

using clm::CacheNamespace;
using clm::EvictionPolicy;
using clm::InsertOutcome;
using clm::NodeRef;
using clm::PagedKvPool;
using clm::PagedKvPoolConfig;
using clm::PrefixMatch;
using clm::RadixTree;

std::uint64_t seed_from_env() {
  if (const char* s = std::getenv("CLM_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}
int ops_from_env(int fallback) {
  if (const char* s = std::getenv("CLM_PROPERTY_OPS")) return std::max(1, std::atoi(s));
  return fallback;
}

std::unique_ptr<PagedKvPool> make_pool(std::int32_t pages, std::int32_t page_size) {
  PagedKvPoolConfig config;
  config.num_pages = pages;
  config.page_size = page_size;
  config.num_layers = 1;
  config.kv_heads = 1;
  config.head_dim = 2;
  config.dtype = clm::KvDType::f32;
  std::unique_ptr<PagedKvPool> pool;
  REQUIRE(PagedKvPool::create(config, pool).ok());
  return pool;
}

struct Tenant {
  std::string salt;
  std::int32_t adapter = 0;
  CacheNamespace ns() const { return {salt, adapter}; }
};

// FNV-1a over the namespace and the first `tokens` ids: what page (tokens /
// page_size - 1) of this prompt must hold.
std::uint64_t fingerprint(const Tenant& t, std::span<const std::int32_t> prompt, std::size_t tokens) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (char c : t.salt) mix(static_cast<unsigned char>(c));
  mix(0xabcdef ^ static_cast<std::uint64_t>(t.adapter));
  for (std::size_t i = 0; i < tokens; ++i) mix(static_cast<std::uint32_t>(prompt[i]));
  return h;
}

void stamp(PagedKvPool& pool, std::int32_t page, std::uint64_t fp) {
  std::memcpy(pool.page_data(page), &fp, sizeof fp);
}
std::uint64_t stamp_of(const PagedKvPool& pool, std::int32_t page) {
  std::uint64_t fp = 0;
  std::memcpy(&fp, pool.page_data(page), sizeof fp);
  return fp;
}

void copy_pages(PagedKvPool& dst, std::span<const std::int32_t> dst_pages, const PagedKvPool& src,
                std::span<const std::int32_t> src_pages) {
  REQUIRE(dst_pages.size() == src_pages.size());
  for (std::size_t i = 0; i < dst_pages.size(); ++i) {
    std::memcpy(dst.page_data(dst_pages[i]), src.page_data(src_pages[i]), src.page_bytes());
  }
}

enum class Policy { write_through, write_through_selective, write_back, none };

struct Config {
  std::int32_t page_size;
  std::int32_t device_pages;
  std::int32_t host_pages;
  Policy policy;
  EvictionPolicy eviction = EvictionPolicy::lru;
};

class Harness {
 public:
  Harness(const Config& c, std::uint64_t seed)
      : config_(c),
        rng_(seed),
        device_(make_pool(c.device_pages, c.page_size)),
        host_(make_pool(c.host_pages, c.page_size)),
        tree_(*device_, c.eviction, 0.5, host_.get()) {
    tenants_ = {{"", 0}, {"a", 0}, {"ab", 0}, {"a", 7}};
    for (int i = 0; i < 6; ++i) {  // shared prefixes, as in a chatbot
      std::vector<std::int32_t> p(static_cast<std::size_t>(c.page_size) * (1 + rng_() % 5));
      for (auto& t : p) t = static_cast<std::int32_t>(rng_() % 50);
      prefixes_.push_back(std::move(p));
    }
    if (c.policy == Policy::write_back) {
      tree_.set_write_back([this](std::span<const std::int32_t> from, std::span<const std::int32_t> to) {
        ++write_backs_;
        copy_pages(*host_, to, *device_, from);
        return clm::Status{};
      });
    }
  }

  void run(int ops) {
    for (int op = 0; op < ops; ++op) {
      const unsigned kind = static_cast<unsigned>(rng_() % 100);
      if (kind < 70) {
        request();
      } else if (kind < 85) {
        fetch();
      } else if (kind < 93) {
        std::int64_t evicted = 0;
        REQUIRE(tree_.evict(static_cast<std::int64_t>(rng_() % 64), &evicted).ok());
      } else {
        squeeze_host();
      }
      check();
    }
    INFO(
        fmt::format("{} load-backs, {} backups, {} write-backs, {} fetches", loads_, backups_, write_backs_, fetches_));
    CHECK(requests_ > 0);
  }

  std::uint64_t loads_ = 0, backups_ = 0, write_backs_ = 0, fetches_ = 0, requests_ = 0;

 private:
  const Tenant& tenant() { return tenants_[rng_() % tenants_.size()]; }
  std::vector<std::int32_t> prompt() {
    std::vector<std::int32_t> p = prefixes_[rng_() % prefixes_.size()];
    const std::size_t extra = 1 + rng_() % (3 * static_cast<std::size_t>(config_.page_size));
    for (std::size_t i = 0; i < extra; ++i) p.push_back(static_cast<std::int32_t>(rng_() % 50));
    return p;
  }

  // Every page a match returns carries its prefix's fingerprint.
  void verify(const Tenant& t, std::span<const std::int32_t> p, const PrefixMatch& m) {
    const auto page = static_cast<std::size_t>(config_.page_size);
    for (std::size_t i = 0; i < m.pages.size(); ++i) {
      INFO("device page " << i);
      REQUIRE(stamp_of(*device_, m.pages[i]) == fingerprint(t, p, (i + 1) * page));
    }
    for (std::size_t i = 0; i < m.host_pages.size(); ++i) {
      INFO("host page " << i);
      REQUIRE(stamp_of(*host_, m.host_pages[i]) == fingerprint(t, p, m.pages.size() * page + (i + 1) * page));
    }
    REQUIRE(m.cached_tokens + m.host_tokens <= static_cast<std::int32_t>(p.size()) - 1);
    REQUIRE(m.host_backed_tokens <= m.cached_tokens + m.host_tokens);
  }

  // storage_coverage (one walk, for a storage fetch) against coverage() over the same whole pages and a
  // token no prompt has, and each node it lists against its own path from the root.
  void check_storage_coverage(const Tenant& t, std::span<const std::int32_t> p) {
    const auto page = static_cast<std::size_t>(config_.page_size);
    const std::span<const std::int32_t> whole_pages = p.first(p.size() / page * page);
    if (whole_pages.empty()) return;
    std::int32_t cached = 0, host_backed = 0;
    std::vector<std::pair<NodeRef, std::int32_t>> nodes;
    tree_.storage_coverage(whole_pages, t.ns(), cached, host_backed, nodes);
    std::vector<std::int32_t> sentinel(whole_pages.begin(), whole_pages.end());
    sentinel.push_back(-1);
    std::int32_t want_cached = 0, want_host = 0;
    tree_.coverage(sentinel, t.ns(), want_cached, want_host);
    REQUIRE(cached == want_cached);
    REQUIRE(host_backed == want_host);
    std::int32_t previous = 0;
    for (const auto& [node, end] : nodes) {
      REQUIRE(end > previous);
      REQUIRE(end <= cached);
      std::vector<std::int32_t> path;
      std::string salt;
      std::int32_t adapter = 0;
      REQUIRE(tree_.node_path(node, path, nullptr, salt, adapter).ok());
      REQUIRE(path.size() == static_cast<std::size_t>(end));
      REQUIRE(std::equal(path.begin(), path.end(), whole_pages.begin()));
      REQUIRE(salt == t.ns().salt);
      previous = end;
    }
  }

  // The Engine's admit + finish: match, load host pages back, compute the rest, publish.
  void request() {
    ++requests_;
    const Tenant& t = tenant();
    const std::vector<std::int32_t> p = prompt();
    check_storage_coverage(t, p);
    const auto page = static_cast<std::size_t>(config_.page_size);
    // What admit() is planned by: peek_prefix, touching nothing, finds what the match finds,
    // and locking takes exactly its unlocked tokens off the evictable ones.
    clm::PrefixPeek peek;
    REQUIRE(tree_.peek_prefix(p, t.ns(), peek).ok());
    PrefixMatch m;
    REQUIRE(tree_.match_prefix(p, t.ns(), m).ok());
    verify(t, p, m);
    REQUIRE(peek.cached_tokens == m.cached_tokens);
    REQUIRE(peek.host_tokens == m.host_tokens);
    const std::int64_t evictable_before_lock = tree_.evictable_tokens();
    REQUIRE(tree_.lock(m.node).ok());
    REQUIRE(evictable_before_lock - tree_.evictable_tokens() == peek.unlocked_tokens);
    const bool pinned = m.host_tokens > 0;
    if (pinned) REQUIRE(tree_.host_pin(m.host_node).ok());
    std::vector<std::int32_t> pages = m.pages;
    const std::size_t total = (p.size() + page - 1) / page;
    const std::size_t tree_pages = m.pages.size() + m.host_pages.size();
    pages.resize(total);
    if (!tree_.allocate_pages(std::span(pages).subspan(m.pages.size())).ok()) {
      if (pinned) REQUIRE(tree_.host_unpin(m.host_node).ok());
      REQUIRE(tree_.unlock(m.node).ok());
      return;  // rejected: every page locked
    }
    if (pinned) {  // load-back: host pages into the fresh device pages
      ++loads_;
      copy_pages(*device_, std::span(pages).subspan(m.pages.size(), m.host_pages.size()), *host_, m.host_pages);
    }
    for (std::size_t i = tree_pages; i < total; ++i) stamp(*device_, pages[i], fingerprint(t, p, (i + 1) * page));
    NodeRef locked = m.node;
    if (pinned) {
      InsertOutcome loaded;
      const std::span<const std::int32_t> head(p.data(), tree_pages * page);
      REQUIRE(tree_.insert(head, std::span(pages).first(tree_pages), t.ns(), loaded).ok());
      REQUIRE(tree_.lock(loaded.node).ok());
      REQUIRE(tree_.unlock(locked).ok());
      REQUIRE(tree_.host_unpin(m.host_node).ok());
      locked = loaded.node;
    }
    InsertOutcome done;
    REQUIRE(tree_.insert(p, pages, t.ns(), done).ok());
    REQUIRE(device_->release(std::span(pages).subspan(static_cast<std::size_t>(done.stored_tokens) / page)).ok());
    REQUIRE(tree_.unlock(locked).ok());
    check();
    // Just published: all of it is on the device now.
    PrefixMatch again;
    REQUIRE(tree_.match_prefix(p, t.ns(), again).ok());
    verify(t, p, again);
    REQUIRE(static_cast<std::size_t>(again.cached_tokens) == (p.size() - 1) / page * page);
    if (config_.policy == Policy::write_through || config_.policy == Policy::write_through_selective) {
      write_through(again.node, config_.policy == Policy::write_through ? 1u : 2u);
    }
  }

  // The write-through: host copies of the hit path's nodes, copied while the node is locked.
  void write_through(NodeRef node, std::uint32_t min_hits) {
    std::int32_t first_page = 0;
    NodeRef last;
    std::vector<std::int32_t> device_pages;
    tree_.backup_candidates(node, min_hits, first_page, last, device_pages);
    if (device_pages.empty()) return;
    REQUIRE(tree_.lock(last).ok());
    std::vector<std::int32_t> host_pages(device_pages.size());
    if (!tree_.allocate_host_pages(host_pages).ok()) {
      REQUIRE(tree_.unlock(last).ok());
      return;
    }
    copy_pages(*host_, host_pages, *device_, device_pages);
    std::vector<std::int32_t> tokens;
    std::string salt;
    std::int32_t adapter = 0;
    REQUIRE(tree_.node_path(last, tokens, nullptr, salt, adapter).ok());
    InsertOutcome out;
    REQUIRE(tree_.insert_host(tokens, host_pages, first_page, {salt, adapter}, out).ok());
    REQUIRE(tree_.unlock(last).ok());
    ++backups_;
  }

  // Pages "from storage": the prompt's pages past its host-backed part, stamped, into host pages.
  void fetch() {
    const Tenant& t = tenant();
    const std::vector<std::int32_t> p = prompt();
    const auto page = static_cast<std::size_t>(config_.page_size);
    PrefixMatch m;
    REQUIRE(tree_.match_prefix(p, t.ns(), m).ok());
    verify(t, p, m);
    const std::size_t first = static_cast<std::size_t>(m.host_backed_tokens) / page;
    const std::size_t last = p.size() / page;  // whole pages only
    if (first >= last) return;
    NodeRef pin;
    if (m.host_backed_tokens > 0) {  // keep the host path we hang below
      PrefixMatch head;
      REQUIRE(tree_.match_prefix(std::span(p).first(first * page + 1), t.ns(), head).ok());
      pin = head.host_tokens > 0 ? head.host_node : head.node;
      REQUIRE(tree_.host_pin(pin).ok());
    }
    std::vector<std::int32_t> host_pages(last - first);
    const bool room = tree_.allocate_host_pages(host_pages).ok();
    if (room) {
      for (std::size_t i = 0; i < host_pages.size(); ++i) {
        stamp(*host_, host_pages[i], fingerprint(t, p, (first + i + 1) * page));
      }
      InsertOutcome out;
      REQUIRE(tree_.insert_host(p, host_pages, static_cast<std::int32_t>(first), t.ns(), out).ok());
      ++fetches_;
    }
    if (pin.index >= 0) REQUIRE(tree_.host_unpin(pin).ok());
    if (!room) return;
    check();
    PrefixMatch again;  // nothing evicted since: all of it is cached somewhere
    REQUIRE(tree_.match_prefix(p, t.ns(), again).ok());
    verify(t, p, again);
    REQUIRE(static_cast<std::size_t>(again.cached_tokens + again.host_tokens) >=
            std::min(last, (p.size() - 1) / page) * page);
  }

  // Takes host pages and gives them back: forces host eviction.
  void squeeze_host() {
    std::vector<std::int32_t> pages(static_cast<std::size_t>(rng_() % static_cast<std::uint64_t>(config_.host_pages)));
    if (tree_.allocate_host_pages(pages).ok()) REQUIRE(host_->release(pages).ok());
  }

  void check() {
    const clm::Status s = tree_.check_invariants();
    INFO(s.message());
    REQUIRE(s.ok());
    const clm::RadixTreeMetrics m = tree_.metrics();
    // Nothing is held between steps: every used page is the tree's.
    REQUIRE(device_->used_pages() == m.cached_tokens / config_.page_size);
    REQUIRE(host_->used_pages() == m.host_cached_tokens / config_.page_size);
  }

  Config config_;
  std::mt19937_64 rng_;
  std::unique_ptr<PagedKvPool> device_;
  std::unique_ptr<PagedKvPool> host_;
  RadixTree tree_;
  std::vector<Tenant> tenants_;
  std::vector<std::vector<std::int32_t>> prefixes_;
};

void run_config(const Config& c) {
  const std::uint64_t seed = seed_from_env();
  INFO("seed " << seed << " (CLM_TEST_SEED), page_size " << c.page_size << ", device " << c.device_pages
               << " pages, host " << c.host_pages << " pages");
  Harness h(c, seed);
  h.run(ops_from_env(20000));
  if (std::getenv("CLM_PROPERTY_STATS")) {
    fmt::print("page_size {}: {} requests, {} load-backs, {} write-through backups, {} write-backs, {} fetches\n",
               c.page_size, h.requests_, h.loads_, h.backups_, h.write_backs_, h.fetches_);
  }
  if (c.policy == Policy::write_back) CHECK(h.write_backs_ > 0);
  if (c.policy == Policy::write_through || c.policy == Policy::write_through_selective) CHECK(h.backups_ > 0);
  CHECK(h.loads_ > 0);
  CHECK(h.fetches_ > 0);
}

}  // namespace

TEST_CASE("tiered tree: write-through, small device tier", "[tiers]") {
  run_config({4, 24, 96, Policy::write_through});
}
TEST_CASE("tiered tree: selective write-through, page_size 1", "[tiers]") {
  run_config({1, 48, 192, Policy::write_through_selective});
}
TEST_CASE("tiered tree: write-back, small host tier", "[tiers]") { run_config({4, 24, 40, Policy::write_back}); }
TEST_CASE("tiered tree: write-back with slru", "[tiers]") {
  run_config({2, 32, 64, Policy::write_back, EvictionPolicy::slru});
}
TEST_CASE("tiered tree: fetches only (no write policy)", "[tiers]") { run_config({4, 24, 64, Policy::none}); }

TEST_CASE("tiered tree: bad input to the host-tier calls changes nothing", "[tiers]") {
  auto device = make_pool(16, 2);
  auto host = make_pool(16, 2);
  RadixTree tree(*device, EvictionPolicy::lru, 0.5, host.get());
  const std::vector<std::int32_t> tokens{1, 2, 3, 4, 5, 6};
  std::vector<std::int32_t> pages(2);
  REQUIRE(tree.allocate_host_pages(pages).ok());
  InsertOutcome out;
  // Pages past the tokens, a first page with no host copy before it, pages not allocated, a page twice.
  CHECK(tree.insert_host(tokens, std::vector<std::int32_t>{pages[0], pages[1], 9, 10}, 0, {}, out).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(tree.insert_host(tokens, pages, 1, {}, out).code() == clm::StatusCode::failed_precondition);
  CHECK(tree.insert_host(tokens, std::vector<std::int32_t>{pages[0], 15}, 0, {}, out).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(tree.insert_host(tokens, std::vector<std::int32_t>{pages[0], pages[0]}, 0, {}, out).code() ==
        clm::StatusCode::invalid_argument);
  REQUIRE(tree.check_invariants().ok());
  CHECK(tree.metrics().host_cached_tokens == 0);
  CHECK(host->used_pages() == 2);  // still the caller's
  REQUIRE(tree.insert_host(tokens, pages, 0, {}, out).ok());
  CHECK(tree.metrics().host_cached_tokens == 4);
  // A host-only node cannot be locked; pins must balance.
  CHECK(tree.lock(out.node).code() == clm::StatusCode::failed_precondition);
  CHECK(tree.host_unpin(out.node).code() == clm::StatusCode::failed_precondition);
  REQUIRE(tree.host_pin(out.node).ok());
  std::vector<std::int32_t> all(16);
  CHECK(tree.allocate_host_pages(all).code() == clm::StatusCode::out_of_memory);  // the pinned copy stays
  REQUIRE(tree.host_unpin(out.node).ok());
  REQUIRE(tree.allocate_host_pages(all).ok());  // now it may go
  CHECK(tree.metrics().host_cached_tokens == 0);
  REQUIRE(tree.check_invariants().ok());
  REQUIRE(host->release(all).ok());
  // Without a host tier the calls are refused.
  RadixTree plain(*device);
  CHECK(plain.allocate_host_pages(pages).code() == clm::StatusCode::failed_precondition);
  CHECK(plain.insert_host(tokens, pages, 0, {}, out).code() == clm::StatusCode::failed_precondition);
}

TEST_CASE("insert_host that runs out of host memory changes nothing", "[tiers][errors]") {
  REQUIRE(clm_test::kAllocationFaults);
  // Every allocation of the call fails in turn (operator new, and the nodes' blocks through the tree's hook).
  clm::detail::tree_block_allocation_fault = &clm_test::allocation_fails;
  struct Unhook {
    ~Unhook() { clm::detail::tree_block_allocation_fault = nullptr; }
  } unhook;
  const std::string salt(40, 's');  // longer than the small-string buffer: its copy allocates
  struct Case {
    const char* what;
    std::vector<std::int32_t> tokens;
    CacheNamespace ns;
    std::int32_t first_page;  // pages before it are on the host already
    std::int64_t new_host_tokens;
  };
  auto iota = [](std::int32_t n, std::int32_t from) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = from + i;
    return v;
  };
  auto concat = [](std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const Case cases[] = {
      {"a split of the host-only node and a new leaf, duplicates released", concat(iota(8, 0), iota(6, 900)), {}, 0, 6},
      {"a new namespace", iota(8, 500), {salt, 7}, 0, 8},
      {"a leaf below the host-only node, from its end", concat(iota(20, 0), iota(6, 300)), {}, 10, 6},
      {"host copies of a device node, and a leaf", concat(iota(10, 1000), iota(4, 50)), {}, 0, 14},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto device = make_pool(64, 2);
    auto host = make_pool(64, 2);
    RadixTree tree(*device, EvictionPolicy::lru, 0.5, host.get());
    {  // the tree before: 20 tokens on the host only, 10 on the device only
      std::vector<std::int32_t> pages(10);
      REQUIRE(tree.allocate_host_pages(pages).ok());
      InsertOutcome out;
      REQUIRE(tree.insert_host(iota(20, 0), pages, 0, {}, out).ok());
      std::vector<std::int32_t> device_pages(5);
      REQUIRE(tree.allocate_pages(device_pages).ok());
      REQUIRE(tree.insert(iota(10, 1000), device_pages, {}, out).ok());
    }
    const std::size_t n_pages = c.tokens.size() / 2 - static_cast<std::size_t>(c.first_page);
    std::vector<std::int32_t> pages(n_pages);
    REQUIRE(tree.allocate_host_pages(pages).ok());
    const auto before = tree.metrics();
    const std::int32_t host_used = host->used_pages();
    long failures = 0;
    for (long n = 0;; ++n) {
      INFO("allocation " << n << " fails");
      InsertOutcome out;
      clm::Status status;
      bool threw = false, fired = false;
      {  // no Catch macro while armed: its own allocations would count
        clm_test::FailAllocation fail(n);
        try {
          status = tree.insert_host(c.tokens, pages, c.first_page, c.ns, out);
        } catch (const std::bad_alloc&) {
          threw = true;
        }
        fired = fail.fired();
      }
      REQUIRE(threw == fired);
      if (!threw) {
        INFO(status.message());
        REQUIRE(status.ok());
        break;
      }
      ++failures;
      // Nothing changed: the tree's accounting, and the caller's pages are still the caller's.
      REQUIRE(tree.check_invariants().ok());
      const auto after = tree.metrics();
      CHECK(after.host_cached_tokens == before.host_cached_tokens);
      CHECK(after.cached_tokens == before.cached_tokens);
      CHECK(after.nodes == before.nodes);
      CHECK(after.namespaces == before.namespaces);
      CHECK(host->used_pages() == host_used);
      for (std::int32_t p : pages) CHECK(host->is_allocated(p));
    }
    CHECK(failures > 0);
    REQUIRE(tree.check_invariants().ok());
    CHECK(tree.metrics().host_cached_tokens == before.host_cached_tokens + c.new_host_tokens);
  }
}

TEST_CASE("a write-back eviction that runs out of memory drops its copy, and leaves the tree whole",
          "[tiers][errors]") {
  REQUIRE(clm_test::kAllocationFaults);
  clm::detail::tree_block_allocation_fault = &clm_test::allocation_fails;
  struct Unhook {
    ~Unhook() { clm::detail::tree_block_allocation_fault = nullptr; }
  } unhook;
  auto iota = [](std::int32_t n, std::int32_t from) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = from + i;
    return v;
  };
  long failures = 0;
  bool copied_once = false;
  for (long n = 0;; ++n) {
    INFO("allocation " << n << " fails");
    // 8 device pages: A (4 pages) and B, which shares A's first 2 pages (2 more): 2 free. Taking 4 evicts a
    // leaf, and write-back copies it (and the node above it) to the host first.
    auto device = make_pool(8, 2);
    auto host = make_pool(16, 2);
    RadixTree tree(*device, EvictionPolicy::lru, 0.5, host.get());
    int copies = 0;
    tree.set_write_back([&](std::span<const std::int32_t> from, std::span<const std::int32_t> to) {
      ++copies;
      copy_pages(*host, to, *device, from);
      return clm::Status{};
    });
    InsertOutcome out;
    std::vector<std::int32_t> a_pages(4), b_pages(2);
    REQUIRE(tree.allocate_pages(a_pages).ok());
    REQUIRE(tree.insert(iota(8, 0), a_pages, {}, out).ok());
    std::vector<std::int32_t> b = iota(4, 0);
    const std::vector<std::int32_t> b_tail = iota(4, 100);
    b.insert(b.end(), b_tail.begin(), b_tail.end());
    REQUIRE(tree.allocate_pages(b_pages).ok());
    std::vector<std::int32_t> b_all = {a_pages[0], a_pages[1], b_pages[0], b_pages[1]};  // A's first 2, then B's
    REQUIRE(tree.insert(b, b_all, {}, out).ok());
    REQUIRE(device->free_pages() == 2);
    std::vector<std::int32_t> wanted(4, -1);
    clm::Status status;
    bool threw = false, fired = false;
    {  // no Catch macro while armed: its own allocations would count
      clm_test::FailAllocation fail(n);
      try {
        status = tree.allocate_pages(wanted);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      fired = fail.fired();
    }
    // Whatever failed, the tree is whole: every page is the tree's, the caller's or free, once.
    const clm::Status invariants = tree.check_invariants();
    INFO(invariants.message());
    REQUIRE(invariants.ok());
    if (fired) ++failures;
    if (!threw && status.ok()) {
      CHECK(device->free_pages() == 0);  // the caller holds the 4 pages
      copied_once = copied_once || copies > 0;
    }
    if (!fired) {
      REQUIRE(status.ok());
      CHECK(copies == 1);  // without a fault the leaf is copied
      CHECK(tree.metrics().host_cached_tokens > 0);
      break;
    }
  }
  CHECK(failures > 0);
  CHECK(copied_once);
}
