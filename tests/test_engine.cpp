// clm::Engine: the request lifecycle over pool + tree, its errors, its CSR
// page tables, and many threads at once against page accounting invariants.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <sys/mman.h>

#include "clm/engine.hpp"
#include "temp_dir.hpp"
#include "test_random.hpp"

using clm::Admission;
using clm::Engine;
using clm::StatusCode;
using clm_test::random_tokens;
using Tokens = std::vector<std::int32_t>;

namespace {

std::unique_ptr<Engine> make_engine(std::int32_t pages, std::int32_t page_size,
                                    clm::EvictionPolicy policy = clm::EvictionPolicy::lru) {
  clm::EngineConfig config;
  config.pool.num_pages = pages;
  config.pool.page_size = page_size;
  config.pool.memory = clm::MemoryKind::none;
  config.eviction_policy = policy;
  std::unique_ptr<Engine> engine;
  REQUIRE(Engine::create(config, engine).ok());
  return engine;
}

constexpr std::int32_t kVocab = 50000;  // prompts' ids are in [0, kVocab) unless a test says otherwise

// Checks what an admission promises: the page table covers the prompt, the
// slots address the uncached tokens in order, and cached pages come first.
void check_admission(const Admission& a, std::size_t prompt_len, std::int32_t page_size) {
  const auto ps = static_cast<std::size_t>(page_size);
  REQUIRE(a.page_table.size() == (prompt_len + ps - 1) / ps);
  REQUIRE(a.cached_tokens % page_size == 0);
  REQUIRE(static_cast<std::size_t>(a.cached_tokens) <= prompt_len - 1);
  REQUIRE(a.slots.size() == prompt_len - static_cast<std::size_t>(a.cached_tokens));
  for (std::size_t i = 0; i < a.slots.size(); ++i) {
    const std::size_t t = static_cast<std::size_t>(a.cached_tokens) + i;
    REQUIRE(a.slots[i] ==
            static_cast<std::int64_t>(a.page_table[t / ps]) * page_size + static_cast<std::int64_t>(t % ps));
  }
  REQUIRE(std::set<std::int32_t>(a.page_table.begin(), a.page_table.end()).size() == a.page_table.size());
}

// kMaxTokens + 1 token ids that cannot be read (PROT_NONE, nothing
// committed): a call that read one would crash the test.
class UnreadableLongPrompt {
 public:
  UnreadableLongPrompt()
      : region_(::mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) {}
  ~UnreadableLongPrompt() {
    if (region_ != MAP_FAILED) ::munmap(region_, kBytes);
  }
  UnreadableLongPrompt(const UnreadableLongPrompt&) = delete;
  UnreadableLongPrompt& operator=(const UnreadableLongPrompt&) = delete;
  bool mapped() const { return region_ != MAP_FAILED; }
  std::span<const std::int32_t> tokens() const { return {static_cast<const std::int32_t*>(region_), kTokens}; }

 private:
  static constexpr std::size_t kTokens = Engine::kMaxTokens + 1;
  static constexpr std::size_t kBytes = kTokens * sizeof(std::int32_t);
  void* region_;
};

}  // namespace

TEST_CASE("engine: a finished conversation turn is reused by the next", "[engine]") {
  std::mt19937 rng(std::random_device{}());
  for (std::int32_t page_size : {1, 16, 64}) {
    auto engine = make_engine(4096, page_size);
    const Tokens system = random_tokens(rng, 300, kVocab);
    Tokens history = system;
    Tokens user = random_tokens(rng, 1 + rng() % 50, kVocab);
    history.insert(history.end(), user.begin(), user.end());
    for (int turn = 0; turn < 4; ++turn) {
      Admission a;
      REQUIRE(engine->admit(history, {.cache_salt = "t"}, a).ok());
      check_admission(a, history.size(), page_size);
      if (turn > 0) {
        // Everything the previous turn finished with is cached (page-aligned).
        const std::size_t previous = history.size() - user.size();
        const auto expected =
            std::min(previous / static_cast<std::size_t>(page_size) * static_cast<std::size_t>(page_size),
                     (history.size() - 1) / static_cast<std::size_t>(page_size) * static_cast<std::size_t>(page_size));
        REQUIRE(static_cast<std::size_t>(a.cached_tokens) == expected);
      }
      // Decode one token at a time, as a host would.
      const Tokens output = random_tokens(rng, 1 + rng() % 40, kVocab);
      std::vector<std::int64_t> slots;
      for (std::int32_t token : output) {
        REQUIRE(engine->extend(a.seq, {&token, 1}, slots).ok());
        REQUIRE(slots.size() == 1);
        std::vector<std::int32_t> table;
        std::int32_t length = 0;
        REQUIRE(engine->page_table(a.seq, table, &length).ok());
        REQUIRE(slots[0] ==
                static_cast<std::int64_t>(table[static_cast<std::size_t>((length - 1) / page_size)]) * page_size +
                    (length - 1) % page_size);
      }
      REQUIRE(engine->finish(a.seq).ok());
      REQUIRE(engine->check_invariants().ok());
      history.insert(history.end(), output.begin(), output.end());
      user = random_tokens(rng, 1 + rng() % 50, kVocab);
      history.insert(history.end(), user.begin(), user.end());
    }
    const clm::EngineMetrics m = engine->metrics();
    CHECK(m.admitted == 4);
    CHECK(m.finished == 4);
    CHECK(m.active_sequences == 0);
  }
}

TEST_CASE("engine: salts and adapters isolate tenants", "[engine]") {
  std::mt19937 rng(std::random_device{}());
  auto engine = make_engine(1024, 16);
  const Tokens prompt = random_tokens(rng, 200, kVocab);
  Admission a;
  REQUIRE(engine->admit(prompt, {.cache_salt = "alice"}, a).ok());
  REQUIRE(engine->finish(a.seq).ok());
  for (clm::AdmitOptions other : {clm::AdmitOptions{.cache_salt = "bob"}, clm::AdmitOptions{},
                                  clm::AdmitOptions{.cache_salt = "alice", .adapter_id = 2}}) {
    REQUIRE(engine->admit(prompt, other, a).ok());
    CHECK(a.cached_tokens == 0);
    REQUIRE(engine->abort(a.seq).ok());
  }
  REQUIRE(engine->admit(prompt, {.cache_salt = "alice"}, a).ok());
  CHECK(a.cached_tokens == 192);
  REQUIRE(engine->finish(a.seq).ok());
  REQUIRE(engine->check_invariants().ok());
}

TEST_CASE("engine: abort caches nothing and returns the pages", "[engine]") {
  std::mt19937 rng(std::random_device{}());
  auto engine = make_engine(64, 4);
  const Tokens prompt = random_tokens(rng, 41, kVocab);
  Admission a;
  REQUIRE(engine->admit(prompt, {}, a).ok());
  CHECK(engine->metrics().cache.pages_used == 11);
  REQUIRE(engine->abort(a.seq).ok());
  CHECK(engine->metrics().cache.pages_used == 0);
  REQUIRE(engine->admit(prompt, {}, a).ok());
  CHECK(a.cached_tokens == 0);
  REQUIRE(engine->finish(a.seq).ok());
  CHECK(engine->metrics().cache.cached_tokens == 40);  // the partial last page went back
  CHECK(engine->metrics().cache.pages_used == 10);
}

TEST_CASE("engine: lifecycle errors are statuses", "[engine][errors]") {
  auto engine = make_engine(16, 4);
  Admission a;
  std::vector<std::int64_t> slots;
  const Tokens prompt = {1, 2, 3, 4, 5, 6};
  CHECK(engine->admit(Tokens{}, {}, a).code() == StatusCode::invalid_argument);
  CHECK(engine->admit(Tokens{1, -1}, {}, a).code() == StatusCode::invalid_argument);
  CHECK(engine->admit(prompt, {.cache_salt = "", .adapter_id = 0, .priority = 101}, a).code() ==
        StatusCode::invalid_argument);
  const clm::Status update = engine->admit(
      prompt, {.cache_salt = "", .adapter_id = 0, .priority = 1, .priority_update = clm::PriorityUpdate{2}}, a);
  CHECK(update.code() == StatusCode::invalid_argument);
  CHECK(update.message().find("priority_update") != std::string::npos);
  CHECK(engine->metrics().admitted == 0);
  REQUIRE(engine->admit(prompt, {}, a).ok());
  const Tokens bad = {7, -3};
  CHECK(engine->extend(a.seq, bad, slots).code() == StatusCode::invalid_argument);
  REQUIRE(engine->abort(a.seq).ok());
  CHECK(engine->finish(a.seq).code() == StatusCode::failed_precondition);
  CHECK(engine->abort(a.seq).code() == StatusCode::failed_precondition);
  CHECK(engine->extend(a.seq, prompt, slots).code() == StatusCode::failed_precondition);
  REQUIRE(engine->admit(prompt, {}, a).ok());
  REQUIRE(engine->finish(a.seq).ok());
  CHECK(engine->finish(a.seq).code() == StatusCode::failed_precondition);
  CHECK(engine->finish(987654).code() == StatusCode::not_found);
  CHECK(engine->finish(0).code() == StatusCode::not_found);
  std::unique_ptr<Engine> none;
  clm::EngineConfig config;
  CHECK(Engine::create(config, none).code() == StatusCode::invalid_argument);  // num_pages 0
  config.pool.num_pages = 4;
  config.slru_protected_fraction = std::nan("");
  CHECK(Engine::create(config, none).code() == StatusCode::invalid_argument);
  CHECK(engine->check_invariants().ok());
}

TEST_CASE("engine: ghost_slru parameters out of range and belady are refused with a clear message",
          "[engine][errors][eviction]") {
  std::unique_ptr<Engine> engine;
  auto refused = [&](const clm::EngineConfig& config, const std::string& names) {
    const clm::Status s = Engine::create(config, engine);
    INFO(s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find(names) != std::string::npos);
    CHECK(engine == nullptr);
  };
  clm::EngineConfig config;
  config.pool.num_pages = 16;
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  config.eviction_policy = clm::EvictionPolicy::ghost_slru;
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    clm::EngineConfig c = config;
    c.ghost_slru_protected_fraction = bad;
    refused(c, "ghost_slru_protected_fraction must be in [0, 1]");
  }
  for (const double bad : {-1.0, clm::kMaxGhostMemory + 1, std::nan(""), std::numeric_limits<double>::infinity()}) {
    clm::EngineConfig c = config;
    c.ghost_slru_memory = bad;
    refused(c, "ghost_slru_memory must be in [0, 64]");
  }
  clm::EngineConfig belady = config;
  belady.eviction_policy = clm::EvictionPolicy::belady;
  refused(belady, "only the replay tool");
  // The edges of the ranges are fine, and so are the defaults.
  for (const auto& [fraction, memory] :
       {std::pair{0.0, 0.0}, std::pair{1.0, clm::kMaxGhostMemory},
        std::pair{clm::kDefaultGhostSlruProtectedFraction, clm::kDefaultGhostMemory}}) {
    clm::EngineConfig c = config;
    c.ghost_slru_protected_fraction = fraction;
    c.ghost_slru_memory = memory;
    REQUIRE(Engine::create(c, engine).ok());
    CHECK(engine->check_invariants().ok());
  }
}

TEST_CASE("engine: exhaustion while everything is locked fails whole", "[engine][errors]") {
  std::mt19937 rng(std::random_device{}());
  auto engine = make_engine(8, 4);
  Admission a, b;
  REQUIRE(engine->admit(random_tokens(rng, 20, kVocab), {}, a).ok());  // 5 pages, locked while running
  const auto before = engine->metrics();
  clm::Status s = engine->admit(random_tokens(rng, 16, kVocab), {}, b);  // 4 more: only 3 left
  CHECK(s.code() == StatusCode::out_of_memory);
  CHECK(!s.message().empty());
  std::vector<std::int64_t> slots;
  CHECK(engine->extend(a.seq, random_tokens(rng, 13, kVocab), slots).code() == StatusCode::out_of_memory);
  const auto after = engine->metrics();
  CHECK(after.cache.pages_used == before.cache.pages_used);
  CHECK(after.rejected == 1);
  CHECK(engine->check_invariants().ok());
  REQUIRE(engine->extend(a.seq, random_tokens(rng, 12, kVocab), slots).ok());  // exactly the 3 left
  REQUIRE(engine->finish(a.seq).ok());
  REQUIRE(engine->admit(random_tokens(rng, 16, kVocab), {}, b).ok());  // evicts the finished one
  CHECK(engine->check_invariants().ok());
}

TEST_CASE("engine: plan_admission says what admit takes from the pool, and changes nothing", "[engine]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const clm::EvictionPolicy policy : {clm::EvictionPolicy::lru, clm::EvictionPolicy::ghost_slru}) {
    constexpr std::int32_t kPageSize = 4;
    auto engine = make_engine(48, kPageSize, policy);
    std::vector<Tokens> history;  // prompts seen, so that new ones share their prefixes
    std::vector<clm::SequenceId> running;
    for (int step = 0; step < 400; ++step) {
      Tokens prompt;
      if (!history.empty() && rng() % 4 != 0) {
        const Tokens& earlier = history[rng() % history.size()];
        prompt.assign(earlier.begin(), earlier.begin() + static_cast<std::ptrdiff_t>(rng() % earlier.size() + 1));
      }
      const Tokens tail = random_tokens(rng, 1 + rng() % 40, 60);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const std::string salt = rng() % 3 == 0 ? "other tenant" : "";
      const clm::AdmitOptions options{.cache_salt = salt};
      const clm::EngineMetrics before = engine->metrics();
      clm::AdmissionPlan plan;
      REQUIRE(engine->plan_admission(prompt, options, plan).ok());
      const clm::EngineMetrics planned = engine->metrics();
      CHECK(planned.cache.match_calls == before.cache.match_calls);
      CHECK(planned.cache.tokens_queried == before.cache.tokens_queried);
      CHECK(planned.cache.evictable_tokens == before.cache.evictable_tokens);
      CHECK(planned.cache.protected_tokens == before.cache.protected_tokens);
      CHECK(planned.cache.namespaces == before.cache.namespaces);
      CHECK(plan.pages_free == before.cache.pages_free);
      CHECK(plan.evictable_tokens == before.cache.evictable_tokens);
      const std::int64_t room = plan.pages_free + plan.evictable_tokens / kPageSize;
      Admission a;
      const clm::Status admitted = engine->admit(prompt, options, a);
      if (plan.new_pages + plan.unlocked_pages > room) {
        CHECK(admitted.code() == StatusCode::out_of_memory);
      } else {
        // What it found, what it allocated, and what it took off the pages free or evictable.
        REQUIRE(admitted.ok());
        check_admission(a, prompt.size(), kPageSize);
        CHECK(a.cached_tokens == plan.cached_tokens);
        CHECK(static_cast<std::int32_t>(a.page_table.size()) - a.cached_tokens / kPageSize == plan.new_pages);
        const clm::EngineMetrics after = engine->metrics();
        CHECK(room - (after.cache.pages_free + after.cache.evictable_tokens / kPageSize) ==
              plan.new_pages + plan.unlocked_pages);
        running.push_back(a.seq);
        history.push_back(prompt);
      }
      // Some running sequences end: finished (cached) or aborted.
      while (!running.empty() && rng() % 3 != 0) {
        const std::size_t k = rng() % running.size();
        REQUIRE((rng() % 4 == 0 ? engine->abort(running[k]) : engine->finish(running[k])).ok());
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
      }
      REQUIRE(engine->check_invariants().ok());
    }
    // Bad input: the errors admit() gives, before anything is read or changed.
    clm::AdmissionPlan plan;
    const Tokens bad{1, 2, -7, 4, 5};
    const clm::Status negative = engine->plan_admission(bad, {}, plan);
    CHECK(negative.code() == StatusCode::invalid_argument);
    CHECK(!negative.message().empty());
    const clm::Status priority =
        engine->plan_admission(Tokens{1, 2, 3}, {.cache_salt = "", .adapter_id = 0, .priority = 101}, plan);
    CHECK(priority.code() == StatusCode::invalid_argument);
    CHECK(priority.message().find("priority") != std::string::npos);
    CHECK(engine->plan_admission(Tokens{}, {}, plan).code() == StatusCode::invalid_argument);
  }
}

TEST_CASE("engine: batch page table in FlashInfer's CSR form", "[engine]") {
  std::mt19937 rng(std::random_device{}());
  auto engine = make_engine(512, 16);
  std::vector<clm::SequenceId> ids;
  std::vector<std::size_t> lengths;
  for (int i = 0; i < 6; ++i) {
    Admission a;
    const std::size_t len = 1 + rng() % 100;
    REQUIRE(engine->admit(random_tokens(rng, len, kVocab), {}, a).ok());
    ids.push_back(a.seq);
    lengths.push_back(len);
  }
  clm::PagedBatch batch;
  REQUIRE(engine->batch_page_table(ids, batch).ok());
  REQUIRE(batch.indptr.size() == ids.size() + 1);
  REQUIRE(batch.indptr.front() == 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::vector<std::int32_t> table;
    REQUIRE(engine->page_table(ids[i], table).ok());
    REQUIRE(Tokens(batch.indices.begin() + batch.indptr[i], batch.indices.begin() + batch.indptr[i + 1]) == table);
    REQUIRE(batch.last_page_len[i] >= 1);
    REQUIRE(batch.last_page_len[i] <= 16);
    REQUIRE(static_cast<std::size_t>((batch.indptr[i + 1] - batch.indptr[i] - 1) * 16 + batch.last_page_len[i]) ==
            lengths[i]);
  }
  std::vector<clm::SequenceId> with_bad = ids;
  with_bad.push_back(424242);
  CHECK(engine->batch_page_table(with_bad, batch).code() == StatusCode::not_found);
}

TEST_CASE("engine: a batch names each sequence once, and refusals leave the table as it was", "[engine][errors]") {
  std::mt19937 rng(std::random_device{}());
  auto engine = make_engine(64, 4);
  std::vector<clm::SequenceId> ids;
  for (int i = 0; i < 3; ++i) {
    Admission a;
    REQUIRE(engine->admit(random_tokens(rng, 1 + rng() % 20, kVocab), {}, a).ok());
    ids.push_back(a.seq);
  }
  clm::PagedBatch batch;
  batch.indptr = {7, 7};
  batch.indices = {-3};
  batch.last_page_len = {9};
  const clm::PagedBatch untouched = batch;
  for (const std::vector<clm::SequenceId>& bad : std::vector<std::vector<clm::SequenceId>>{
           {ids[0], ids[0]}, {ids[1], ids[2], ids[0], ids[2]}, {ids[0], 424242}}) {
    const clm::Status s = engine->batch_page_table(bad, batch);
    CHECK(s.code() == (bad.back() == 424242 ? StatusCode::not_found : StatusCode::invalid_argument));
    CHECK(!s.message().empty());
    CHECK(batch.indptr == untouched.indptr);
    CHECK(batch.indices == untouched.indices);
    CHECK(batch.last_page_len == untouched.last_page_len);
  }
  REQUIRE(engine->batch_page_table(ids, batch).ok());
  CHECK(batch.indptr.size() == 4);
}

TEST_CASE("engine: a prompt longer than kMaxTokens is refused before it is read", "[engine][errors]") {
  const UnreadableLongPrompt unreadable;
  REQUIRE(unreadable.mapped());
  auto engine = make_engine(64, 4);
  const std::span<const std::int32_t> prompt = unreadable.tokens();
  Admission a;
  const clm::Status s = engine->admit(prompt, {}, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("longer") != std::string::npos);
  clm::AdmissionPlan plan;
  const clm::Status planned = engine->plan_admission(prompt, {}, plan);
  CHECK(planned.code() == StatusCode::invalid_argument);
  CHECK(planned.message().find("longer") != std::string::npos);
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.admitted == 0);
  CHECK(m.active_sequences == 0);
  CHECK(m.cache.pages_used == 0);
  CHECK(m.cache.tokens_queried == 0);
}

// admit, plan_admission and prefetch share one check of the prompt and its
// options (Engine::check_admission): each bad prompt is refused by all
// three, with the same code and before anything is read, matched, counted
// or fetched; each good one passes all three.
TEST_CASE("engine: admit, plan_admission and prefetch refuse the same prompts", "[engine][errors][tiers]") {
  clm_test::TempDir storage("engine-prompts");
  clm::EngineConfig config;
  config.pool.num_pages = 32;
  config.pool.page_size = 4;
  config.pool.num_layers = 1;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.dtype = clm::KvDType::f32;
  config.tiers.host_pages = 32;
  config.tiers.storage_url = "file://" + storage.str();  // prefetch needs a storage tier to look at the prompt
  config.model_id = "test-model";                        // storage pages are one model's
  std::unique_ptr<Engine> engine;
  REQUIRE(Engine::create(config, engine).ok());
  const UnreadableLongPrompt unreadable;
  REQUIRE(unreadable.mapped());

  const Tokens good{1, 2, 3, 4, 5, 6, 7, 8, 9};
  Tokens negative_last = good;
  negative_last.back() = std::numeric_limits<std::int32_t>::min();
  Tokens negative_in_page = good;
  negative_in_page[5] = -1;
  auto options = [](int priority, clm::PriorityUpdate update = clm::PriorityUpdate::raise) {
    clm::AdmitOptions o;
    o.priority = priority;
    o.priority_update = update;
    return o;
  };
  struct Bad {
    const char* what;
    std::span<const std::int32_t> prompt;
    clm::AdmitOptions options;
  };
  const std::vector<Bad> bad{
      {"an empty prompt", {}, options(0)},
      {"a prompt longer than kMaxTokens", unreadable.tokens(), options(0)},
      {"a negative id inside the whole pages", negative_in_page, options(0)},
      {"a negative id as the last token", negative_last, options(0)},
      {"a priority below 0", good, options(-1)},
      {"a priority above kMaxPriority", good, options(clm::kMaxPriority + 1)},
      {"an unknown priority update", good, options(0, static_cast<clm::PriorityUpdate>(2))},
  };
  for (const Bad& c : bad) {
    INFO(c.what);
    Admission a;
    clm::AdmissionPlan plan;
    const clm::Status admitted = engine->admit(c.prompt, c.options, a);
    const clm::Status planned = engine->plan_admission(c.prompt, c.options, plan);
    const clm::Status prefetched = engine->prefetch(c.prompt, c.options);
    CHECK(admitted.code() == StatusCode::invalid_argument);
    CHECK(planned.code() == admitted.code());
    CHECK(prefetched.code() == admitted.code());
    CHECK(admitted.message().starts_with("admit: "));
    CHECK(planned.message().starts_with("plan_admission: "));
    CHECK(prefetched.message().starts_with("prefetch: "));
  }
  engine->wait_for_tiers();
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.admitted == 0);
  CHECK(m.rejected == 0);
  CHECK(m.cache.match_calls == 0);
  CHECK(m.cache.pages_used == 0);
  CHECK(m.tiers.storage.pages_missing == 0);  // nothing asked storage for a bad prompt's pages
  CHECK(m.tiers.storage_errors == 0);
  REQUIRE(engine->check_invariants().ok());

  // The edges of what is allowed pass all three.
  for (const clm::AdmitOptions& allowed : {options(0), options(clm::kMaxPriority, clm::PriorityUpdate::set)}) {
    for (const Tokens& prompt : {Tokens{0}, good}) {
      clm::AdmissionPlan plan;
      REQUIRE(engine->plan_admission(prompt, allowed, plan).ok());
      REQUIRE(engine->prefetch(prompt, allowed).ok());
      Admission a;
      REQUIRE(engine->admit(prompt, allowed, a).ok());
      REQUIRE(engine->abort(a.seq).ok());
    }
  }
  engine->wait_for_tiers();
  CHECK(engine->check_invariants().ok());
  // Without a storage tier prefetch has nothing to check a prompt for.
  auto plain = make_engine(16, 4);
  CHECK(plain->prefetch(Tokens{}, {}).code() == StatusCode::failed_precondition);
  // There the tree checks the ids (only past what it matched), under the
  // engine call's name: the same refusals, with a cached prefix in front too.
  Admission cached;
  REQUIRE(plain->admit(good, {}, cached).ok());
  REQUIRE(plain->finish(cached.seq).ok());
  for (const Bad& c : bad) {
    INFO(c.what << ", no storage tier");
    Admission a;
    clm::AdmissionPlan plan;
    const clm::Status admitted = plain->admit(c.prompt, c.options, a);
    const clm::Status planned = plain->plan_admission(c.prompt, c.options, plan);
    CHECK(admitted.code() == StatusCode::invalid_argument);
    CHECK(planned.code() == admitted.code());
    CHECK(admitted.message().starts_with("admit: "));
    CHECK(planned.message().starts_with("plan_admission: "));
  }
  CHECK(plain->metrics().admitted == 1);
  REQUIRE(plain->check_invariants().ok());
}

TEST_CASE("engine: many threads admit, extend, finish and abort at once", "[engine][threads]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  auto engine = make_engine(600, 16, clm::EvictionPolicy::slru);
  // Shared prompts so that threads hit, split and evict each other's prefixes.
  std::mt19937 setup(seed);
  std::vector<Tokens> prefixes;
  for (int i = 0; i < 8; ++i) prefixes.push_back(random_tokens(setup, 64 + setup() % 200, 64));
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> finished{0};
  auto worker = [&](std::uint32_t thread_seed) {
    std::mt19937 rng(thread_seed);
    for (int step = 0; step < 1500; ++step) {
      Tokens prompt = prefixes[rng() % prefixes.size()];
      const Tokens suffix = random_tokens(rng, 1 + rng() % 80, 64);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      Admission a;
      clm::Status s = engine->admit(prompt, {.cache_salt = (rng() % 4) ? "" : "other"}, a);
      if (s.code() == StatusCode::out_of_memory) continue;
      if (!s.ok()) {
        ++failures;
        continue;
      }
      std::vector<std::int64_t> slots;
      const Tokens output = random_tokens(rng, rng() % 40, 64);
      s = engine->extend(a.seq, output, slots);
      if (!s.ok() && s.code() != StatusCode::out_of_memory) ++failures;
      s = (rng() % 5) ? engine->finish(a.seq) : engine->abort(a.seq);
      if (!s.ok()) ++failures;
      finished += s.ok();
    }
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, seed + t + 1);
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(finished > 1000);
  const clm::Status s = engine->check_invariants();
  INFO(s.message());
  CHECK(s.ok());
  CHECK(engine->metrics().active_sequences == 0);
}
