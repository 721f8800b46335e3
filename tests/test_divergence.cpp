// Divergence hot spots (clm/cache/divergence.hpp): the tree's branch points,
// hits and match depths against a naive model that keeps every cached prompt
// in a list and compares token by token; a timestamp planted at a known depth
// of one tenant's system prompt, found first through the Engine; the window,
// the sketch's bound, and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "clm/cache/radix_tree.hpp"
#include "clm/engine.hpp"

using Tokens = std::vector<std::int32_t>;

namespace {

// The model: every prompt inserted (page-aligned), per tenant, never evicted.
struct NaiveDivergence {
  std::int32_t page = 1;
  std::map<std::string, std::vector<Tokens>> cached;
  std::map<std::pair<std::string, std::int32_t>, std::uint64_t> branches, hits;
  std::set<std::pair<std::string, Tokens>> recorded;  // branch points split at: (tenant, prefix)
  std::uint64_t diverged = 0;
  clm::MatchDepthHistogram depths;

  static std::size_t common(const Tokens& a, const Tokens& b, std::size_t limit) {
    std::size_t n = 0;
    while (n < limit && n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
  }
  // Distinct cached pages that follow prompt[0, depth).
  std::size_t continuations(const std::string& tenant, const Tokens& prompt, std::int32_t depth) {
    std::set<Tokens> next;
    const auto d = static_cast<std::size_t>(depth);
    for (const Tokens& q : cached[tenant]) {
      if (q.size() < d + static_cast<std::size_t>(page) || common(q, prompt, d) < d) continue;
      next.emplace(q.begin() + depth, q.begin() + depth + page);
    }
    return next.size();
  }

  void admit(const std::string& tenant, const Tokens& prompt) {
    const auto limit = prompt.size() - 1;
    std::int32_t matched = 0;
    for (const Tokens& q : cached[tenant]) {
      matched = std::max(matched, static_cast<std::int32_t>(common(prompt, q, limit)) / page * page);
    }
    const bool split =
        matched > 0 && static_cast<std::int32_t>(limit) - matched >= page && continuations(tenant, prompt, matched) > 0;
    if (split) {
      ++diverged;
      ++branches[{tenant, matched}];
      recorded.emplace(tenant, Tokens(prompt.begin(), prompt.begin() + matched));
    }
    for (std::int32_t d = matched - page; d > 0; d -= page) {  // the deepest branch point passed
      if (continuations(tenant, prompt, d) < 2) continue;
      if (recorded.count({tenant, Tokens(prompt.begin(), prompt.begin() + d)})) ++hits[{tenant, d}];
      break;
    }
    depths.record(matched);
    Tokens stored(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(prompt.size() / page * page));
    if (!stored.empty()) cached[tenant].push_back(std::move(stored));
  }
};

std::string name_of_salt(std::string_view salt) { return "digest-of-" + std::string(salt); }

}  // namespace

TEST_CASE("divergence: branch points, hits and depths equal a naive model on random conversations", "[divergence]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (std::int32_t page : {1, 4, 16}) {
    INFO("page " << page);
    clm::PagedKvPoolConfig pc;
    pc.num_pages = 1 << 16;
    pc.page_size = page;
    pc.memory = clm::MemoryKind::none;
    std::unique_ptr<clm::PagedKvPool> pool;
    REQUIRE(clm::PagedKvPool::create(pc, pool).ok());
    clm::RadixTree tree(*pool);
    REQUIRE(tree.set_divergence({.branch_points = 65536}).ok());  // never full: no point displaced
    NaiveDivergence model;
    model.page = page;
    const std::vector<std::string> tenants = {"a", "b", "c"};
    std::map<std::string, Tokens> systems;
    for (const auto& t : tenants) {
      Tokens s(std::uniform_int_distribution<std::size_t>(8, 80)(rng));
      for (auto& x : s) x = std::uniform_int_distribution<std::int32_t>(0, 50)(rng);
      systems[t] = s;
    }
    std::vector<std::pair<std::string, Tokens>> conversations;
    auto random_tokens = [&](std::size_t n, std::int32_t vocab) {
      Tokens out(n);
      for (auto& x : out) x = std::uniform_int_distribution<std::int32_t>(0, vocab)(rng);
      return out;
    };
    // At least 400 steps, and more until the workload did what the test is about: with pages of 16 a
    // run of 400 diverged only 14 times once (CI, seed 2830730845).
    for (int step = 0; step < 400 || (model.diverged <= 20 && step < 20000); ++step) {
      std::string tenant;
      Tokens prompt;
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind < 4 || conversations.empty()) {  // a new conversation: the system prompt and a first message
        tenant = tenants[std::uniform_int_distribution<std::size_t>(0, tenants.size() - 1)(rng)];
        prompt = systems[tenant];
        // Small vocabularies: messages often share their first pages.
        const Tokens message =
            random_tokens(std::uniform_int_distribution<std::size_t>(1, 40)(rng), kind == 0 ? 2 : 50);
        prompt.insert(prompt.end(), message.begin(), message.end());
        conversations.emplace_back(tenant, prompt);
      } else {  // the next turn of one: what it had, an answer, a message; or the same turn regenerated
        auto& [t, history] =
            conversations[std::uniform_int_distribution<std::size_t>(0, conversations.size() - 1)(rng)];
        tenant = t;
        prompt = history;
        if (kind == 9 && prompt.size() > 4) prompt.resize(prompt.size() - 3);
        const Tokens more = random_tokens(std::uniform_int_distribution<std::size_t>(1, 30)(rng), 50);
        prompt.insert(prompt.end(), more.begin(), more.end());
        history = prompt;
      }
      clm::PrefixMatch match;
      REQUIRE(tree.match_prefix(prompt, {.salt = tenant, .tenant = tenant}, match).ok());
      model.admit(tenant, prompt);
      const std::size_t whole = prompt.size() / static_cast<std::size_t>(page);
      std::vector<std::int32_t> pages = match.pages;
      std::vector<std::int32_t> fresh(whole - pages.size());
      REQUIRE(tree.allocate_pages(fresh).ok());
      pages.insert(pages.end(), fresh.begin(), fresh.end());
      clm::InsertOutcome done;
      REQUIRE(tree.insert(prompt, pages, {.salt = tenant}, done).ok());
      REQUIRE(tree.check_invariants().ok());
      const clm::RadixTreeMetrics m = tree.metrics();
      REQUIRE(m.diverged_matches == model.diverged);
      REQUIRE(m.match_depth.counts == model.depths.counts);
      REQUIRE(m.match_depth.sum_tokens == model.depths.sum_tokens);
    }
    REQUIRE(model.diverged > 20);  // the workload did what the test is about
    CHECK(!model.hits.empty());
    clm::DivergenceReport report;
    REQUIRE(tree.divergence_report({.top_per_tenant = 100000, .min_branches = 1}, name_of_salt, report).ok());
    std::map<std::pair<std::string, std::int32_t>, std::uint64_t> got_branches, got_hits;
    for (const clm::BranchPoint& p : report.points) {
      INFO(p.tenant << " depth " << p.depth);
      CHECK(got_branches.emplace(std::make_pair(p.tenant, p.depth), p.branches).second);  // one point per depth
      if (p.hits) got_hits[{p.tenant, p.depth}] = p.hits;
      CHECK(p.overcount == 0);  // the sketch never filled
      CHECK(p.depth % page == 0);
      CHECK(p.before.size() == static_cast<std::size_t>(std::min(p.depth, 8)));
    }
    CHECK(got_branches == model.branches);
    CHECK(got_hits == model.hits);
    // Each tenant's points come together, most unreused first.
    for (std::size_t i = 1; i < report.points.size(); ++i) {
      const auto& a = report.points[i - 1];
      const auto& b = report.points[i];
      if (a.tenant == b.tenant) CHECK(a.unreused() >= b.unreused());
    }
  }
}

TEST_CASE("divergence: a timestamp planted in one tenant's system prompt is the first hot spot", "[divergence]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (std::int32_t page : {8, 16, 32}) {
    clm::EngineConfig config;
    config.pool.num_pages = 3000;
    config.pool.page_size = page;
    config.pool.num_layers = 1;
    config.pool.kv_heads = 1;
    config.pool.head_dim = 8;
    config.pool.memory = clm::MemoryKind::none;
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(config, engine).ok());
    const std::int32_t planted = std::uniform_int_distribution<std::int32_t>(40, 600)(rng);
    INFO("page " << page << ", timestamp at token " << planted);
    auto random_tokens = [&](std::size_t n) {
      Tokens out(n);
      for (auto& x : out) x = std::uniform_int_distribution<std::int32_t>(100, 30000)(rng);
      return out;
    };
    // Four tenants chat; "acme"'s system prompt says the time at token `planted`.
    const std::vector<std::string> tenants = {"acme", "globex", "initech", "umbrella"};
    std::map<std::string, Tokens> systems;
    for (const auto& t : tenants)
      systems[t] = random_tokens(t == "acme" ? 700 : std::uniform_int_distribution<std::size_t>(50, 700)(rng));
    std::vector<std::pair<std::string, Tokens>> chats;  // a conversation's messages so far (no system prompt)
    int clock_seconds = 36000;
    auto system_prompt = [&](const std::string& tenant) {
      Tokens s = systems[tenant];
      if (tenant == "acme") {
        const int t = clock_seconds++;  // a second a request: "HH:MM:SS" as six digit tokens
        const int digits[6] = {t / 36000 % 10, t / 3600 % 10, t / 600 % 6, t / 60 % 10, t / 10 % 6, t % 10};
        for (int i = 0; i < 6; ++i) s[static_cast<std::size_t>(planted + i)] = digits[i];
      }
      return s;
    };
    for (int step = 0; step < 1200; ++step) {
      if (chats.size() < 40 || std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
        chats.emplace_back(tenants[static_cast<std::size_t>(step) % tenants.size()], random_tokens(20));
      }
      auto& [tenant, messages] = chats[std::uniform_int_distribution<std::size_t>(0, chats.size() - 1)(rng)];
      Tokens prompt = system_prompt(tenant);
      prompt.insert(prompt.end(), messages.begin(), messages.end());
      clm::Admission a;
      clm::Status s = engine->admit(prompt, {.cache_salt = "salt-" + tenant, .tenant = tenant}, a);
      if (s.code() == clm::StatusCode::out_of_memory) {  // a full pool: the oldest chats go
        chats.erase(chats.begin(), chats.begin() + static_cast<std::ptrdiff_t>(chats.size() / 2));
        continue;
      }
      REQUIRE(s.ok());
      const Tokens answer = random_tokens(12);
      std::vector<std::int64_t> slots;
      REQUIRE(engine->extend(a.seq, answer, slots).ok());
      REQUIRE(engine->finish(a.seq).ok());
      messages.insert(messages.end(), answer.begin(), answer.end());
      const Tokens next = random_tokens(10);
      messages.insert(messages.end(), next.begin(), next.end());
      if (messages.size() > 300) messages.resize(20);  // a conversation starts over, keeping its first message
    }
    clm::DivergenceReport report;
    REQUIRE(engine->divergence_report({.top_per_tenant = 3}, report).ok());
    REQUIRE(!report.points.empty());
    const clm::BranchPoint& top = report.points.front();
    INFO("top: " << top.tenant << " at " << top.depth << ", " << top.branches << " branches, " << top.hits << " hits");
    CHECK(top.tenant == "acme");
    CHECK(std::abs(top.depth - planted) <= page);
    CHECK(top.branches > 100);
    CHECK(top.hits * 10 < top.branches);
    // Its context shows the clock: the request's digits after the split differ from the cached path's.
    REQUIRE(!top.after.empty());
    REQUIRE(top.before.size() == 8);
    for (const auto& p : report.points) CHECK(p.tenant.find("salt-") == std::string::npos);
    // The other tenants' chats come back: their points, if any, are reached again.
    for (const auto& p : report.points) {
      if (p.tenant != "acme") CHECK(p.unreused() < top.unreused());
    }
    const clm::EngineMetrics m = engine->metrics();
    CHECK(m.cache.diverged_matches >= top.branches);
  }
}

namespace {
std::int64_t fake_now_ms = 0;
std::int64_t fake_clock() { return fake_now_ms; }

struct SmallTree {
  explicit SmallTree(clm::DivergenceConfig config = {}) {
    clm::PagedKvPoolConfig pc;
    pc.num_pages = 1 << 14;
    pc.page_size = 4;
    pc.memory = clm::MemoryKind::none;
    REQUIRE(clm::PagedKvPool::create(pc, pool).ok());
    tree = std::make_unique<clm::RadixTree>(*pool);
    REQUIRE(tree->set_divergence(config).ok());
    tree->set_divergence_clock(&fake_clock);
  }
  void request(const Tokens& prompt, std::string_view salt = {}) {
    clm::PrefixMatch match;
    REQUIRE(tree->match_prefix(prompt, {.salt = salt}, match).ok());
    std::vector<std::int32_t> pages = match.pages;
    std::vector<std::int32_t> fresh(prompt.size() / 4 - pages.size());
    REQUIRE(tree->allocate_pages(fresh).ok());
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    clm::InsertOutcome done;
    REQUIRE(tree->insert(prompt, pages, {.salt = salt}, done).ok());
  }
  clm::DivergenceReport report(clm::DivergenceReportOptions options = {.top_per_tenant = 1000, .min_branches = 1}) {
    clm::DivergenceReport r;
    REQUIRE(tree->divergence_report(options, name_of_salt, r).ok());
    return r;
  }
  std::unique_ptr<clm::PagedKvPool> pool;
  std::unique_ptr<clm::RadixTree> tree;
};

// An engine of page ids only, pages of 4 tokens.
clm::EngineConfig small_engine_config(std::int32_t pages) {
  clm::EngineConfig config;
  config.pool.num_pages = pages;
  config.pool.page_size = 4;
  config.pool.num_layers = 1;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 4;
  config.pool.memory = clm::MemoryKind::none;
  return config;
}

Tokens with_tail(std::int32_t shared, std::int32_t tail_first, std::int32_t length = 32) {
  Tokens t(static_cast<std::size_t>(length));
  std::iota(t.begin(), t.end(), 0);
  for (std::size_t i = static_cast<std::size_t>(shared); i < t.size(); ++i)
    t[i] = tail_first + static_cast<std::int32_t>(i);
  return t;
}
}  // namespace

TEST_CASE("divergence: counts leave the report after the window, in half windows", "[divergence]") {
  fake_now_ms = 1'000'000;
  SmallTree t({.window_ms = 1000});
  for (int i = 0; i < 5; ++i) t.request(with_tail(16, 1000 * (i + 1)));  // four splits at 16
  auto r = t.report();
  REQUIRE(r.points.size() == 1);
  CHECK(r.points[0].branches == 4);
  CHECK(r.points[0].depth == 16);
  CHECK(r.window_ms == 1000);
  fake_now_ms += 500;  // the next half window: still counted
  t.request(with_tail(16, 9000));
  r = t.report();
  REQUIRE(r.points.size() == 1);
  CHECK(r.points[0].branches == 5);
  fake_now_ms += 500;  // the first four are now a window old
  r = t.report();
  REQUIRE(r.points.size() == 1);
  CHECK(r.points[0].branches == 1);
  fake_now_ms += 5000;
  CHECK(t.report().points.empty());
  // The depth histogram is a counter for good: the window is the report's.
  CHECK(t.tree->metrics().diverged_matches == 5);
}

TEST_CASE("divergence: a full sketch keeps the heavy point, its count within Space-Saving's bound", "[divergence]") {
  fake_now_ms = 0;
  SmallTree t({.branch_points = 16});
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uint64_t heavy = 0;
  for (int i = 0; i < 2000; ++i) {
    if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
      // A split at 12 under one shared prefix: the hot spot.
      t.request(with_tail(12, 100000 + 100 * i));
      ++heavy;
    } else {  // a prefix of its own, asked twice: one split at 8 each, never split again
      for (std::int32_t tail : {500000, 600000}) {
        Tokens p = with_tail(8, tail + 100 * i);
        t.request(p,
                  "light-" + std::to_string(i));  // a tenant of its own: the report merges a tenant's points by depth
      }
    }
  }
  CHECK(t.tree->divergence_config().branch_points == 16);
  const auto r = t.report({.top_per_tenant = 1, .min_branches = 1, .tenant = "digest-of-"});
  REQUIRE(r.points.size() == 1);
  const auto& top = r.points[0];
  CHECK(top.depth == 12);
  // The first request made the prefix; every later one split at 12.
  CHECK(top.branches >= heavy - 1);
  CHECK(top.branches - top.overcount <= heavy - 1);
}

TEST_CASE("divergence: names, off switch and bad input", "[divergence]") {
  SECTION("a namespace without a tenant name is named by its salt's digest, never the salt") {
    clm::EngineConfig config = small_engine_config(256);
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(config, engine).ok());
    for (int i = 0; i < 4; ++i) {
      for (std::string_view salt : {"secret-salt-of-tenant-9", ""}) {
        clm::Admission a;
        REQUIRE(engine->admit(with_tail(16, 1000 * (i + 1)), {.cache_salt = salt}, a).ok());
        REQUIRE(engine->finish(a.seq).ok());
      }
    }
    clm::DivergenceReport r;
    REQUIRE(engine->divergence_report({}, r).ok());
    REQUIRE(r.points.size() == 2);
    std::set<std::string> names;
    for (const auto& p : r.points) {
      CHECK(p.tenant.find("secret") == std::string::npos);
      CHECK(p.branches == 3);
      names.insert(p.tenant);
    }
    CHECK(names.count(""));  // the default namespace
    CHECK(names.count(clm::KvEventRecorder::salt_digest("secret-salt-of-tenant-9")));
    REQUIRE(engine->divergence_report({.tenant = ""}, r).ok());  // empty: every tenant
    CHECK(r.points.size() == 2);
    REQUIRE(engine->divergence_report({.tenant = "nobody"}, r).ok());
    CHECK(r.points.empty());
    CHECK(engine->divergence_report({.top_per_tenant = 0}, r).code() == clm::StatusCode::invalid_argument);
  }
  SECTION("off: no points, no counters, and the report says so") {
    clm::EngineConfig config = small_engine_config(256);
    config.divergence.enabled = false;
    std::unique_ptr<clm::Engine> engine;
    REQUIRE(clm::Engine::create(config, engine).ok());
    for (int i = 0; i < 4; ++i) {
      clm::Admission a;
      REQUIRE(engine->admit(with_tail(16, 1000 * (i + 1)), {}, a).ok());
      REQUIRE(engine->finish(a.seq).ok());
    }
    const clm::EngineMetrics m = engine->metrics();
    CHECK(m.cache.diverged_matches == 0);
    CHECK(m.cache.match_depth.sum_tokens == 0);
    CHECK(m.cache.match_calls == 4);
    clm::DivergenceReport r;
    const clm::Status s = engine->divergence_report({}, r);
    CHECK(s.code() == clm::StatusCode::failed_precondition);
    CHECK(s.message().find("off") != std::string::npos);
  }
  SECTION("configurations out of range are refused, naming the field") {
    for (const auto& [bad, field] :
         std::vector<std::pair<clm::DivergenceConfig, std::string>>{{{.branch_points = 15}, "branch_points"},
                                                                    {{.branch_points = 65537}, "branch_points"},
                                                                    {{.window_ms = 0}, "window_ms"},
                                                                    {{.window_ms = -5}, "window_ms"},
                                                                    {{.context_tokens = -1}, "context_tokens"},
                                                                    {{.context_tokens = 65}, "context_tokens"}}) {
      clm::EngineConfig config = small_engine_config(16);
      config.divergence = bad;
      std::unique_ptr<clm::Engine> engine;
      const clm::Status s = clm::Engine::create(config, engine);
      CHECK(s.code() == clm::StatusCode::invalid_argument);
      CHECK(s.message().find(field) != std::string::npos);
      CHECK(!engine);
    }
  }
}
