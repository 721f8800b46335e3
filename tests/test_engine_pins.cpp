// clm::Engine's pinned prefixes (pin_prefix, unpin) and priorities that
// expire (hint_prefix). A pinned prefix stays
// cached through a flood that evicts an unpinned one of the same size, pins
// share a budget and one past it is refused with nothing pinned, a pin
// expires by itself and a hit on its whole prefix restarts its time, and bad
// calls get clear statuses. A hinted prefix outlives (under the priority
// policy) a flood that evicts an unhinted one, a hint under the same key
// replaces the earlier one without setting anything back, and an expired
// hint leaves its prefix to be evicted. The engine's page accounting holds
// after every step.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "clm/engine.hpp"
#include "test_random.hpp"

using clm::Engine;
using clm::StatusCode;
using Tokens = std::vector<std::int32_t>;

namespace {

constexpr std::int32_t kPage = 4, kPages = 64;

std::unique_ptr<Engine> make_engine(double budget = 0.25, clm::EvictionPolicy policy = clm::EvictionPolicy::lru,
                                    std::int32_t max_hints = 4096) {
  clm::EngineConfig config;
  config.eviction_policy = policy;
  config.max_priority_hints = max_hints;
  config.pool.num_pages = kPages;
  config.pool.page_size = kPage;
  config.pool.memory = clm::MemoryKind::none;
  config.pin_budget_fraction = budget;
  config.max_pin_ttl = std::chrono::hours(1);
  std::unique_ptr<Engine> engine;
  REQUIRE(Engine::create(config, engine).ok());
  return engine;
}

void check(Engine& engine) {
  const clm::Status s = engine.check_invariants();
  INFO(s.message());
  REQUIRE(s.ok());
}

// Admits `prompt`, extends nothing, finishes: its pages are cached.
void serve(Engine& engine, const Tokens& prompt) {
  clm::Admission a;
  REQUIRE(engine.admit(prompt, {}, a).ok());
  REQUIRE(engine.finish(a.seq).ok());
  check(engine);
}

std::int32_t cached(Engine& engine, const Tokens& prompt) {
  clm::AdmissionPlan plan;
  REQUIRE(engine.plan_admission(prompt, {}, plan).ok());
  return plan.cached_tokens;
}

// Distinct prompts enough to fill the pool several times over.
void flood(Engine& engine, std::mt19937& rng) {
  for (int i = 0; i < 3 * kPages / 8; ++i) serve(engine, clm_test::random_tokens(rng, 8 * kPage + 1, 50000));
}

}  // namespace

TEST_CASE("a pinned prefix survives a flood that evicts an unpinned one, and unpin lets it go", "[engine][pins]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine();
  const Tokens pinned = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  const Tokens unpinned = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  serve(*engine, pinned);
  serve(*engine, unpinned);
  REQUIRE(cached(*engine, pinned) == 10 * kPage);
  REQUIRE(cached(*engine, unpinned) == 10 * kPage);
  clm::PinResult pin;
  REQUIRE(engine->pin_prefix(pinned, {}, std::chrono::minutes(5), pin).ok());
  CHECK(pin.pin != 0);
  CHECK(pin.pinned_tokens == 10 * kPage);
  check(*engine);
  flood(*engine, rng);
  CHECK(cached(*engine, pinned) == 10 * kPage);
  CHECK(cached(*engine, unpinned) == 0);  // the control: the flood does evict
  clm::EngineMetrics m = engine->metrics();
  CHECK(m.pins_active == 1);
  CHECK(m.pinned_pages == 10);
  CHECK(m.pin_budget_pages == kPages / 4);
  CHECK(m.pins_created == 1);

  REQUIRE(engine->unpin(pin.pin).ok());
  CHECK(engine->unpin(pin.pin).code() == StatusCode::not_found);
  check(*engine);
  flood(*engine, rng);
  CHECK(cached(*engine, pinned) == 0);
  CHECK(engine->metrics().pins_active == 0);
}

TEST_CASE("pins share a budget: one past it is refused and pins nothing", "[engine][pins]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine();  // 16 pages
  const Tokens first = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  const Tokens second = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  serve(*engine, first);
  serve(*engine, second);
  clm::PinResult a, b;
  REQUIRE(engine->pin_prefix(first, {}, std::chrono::minutes(5), a).ok());
  const clm::Status refused = engine->pin_prefix(second, {}, std::chrono::minutes(5), b);
  CHECK(refused.code() == StatusCode::out_of_memory);
  CHECK_THAT(refused.message(), Catch::Contains("pin budget is 16 pages, 10 are pinned"));
  CHECK(engine->metrics().pins_refused == 1);
  check(*engine);
  flood(*engine, rng);
  CHECK(cached(*engine, first) == 10 * kPage);
  CHECK(cached(*engine, second) == 0);  // the refused pin held nothing
  // A pin of a shorter prefix of the first fits what is left.
  const Tokens head(first.begin(), first.begin() + 4 * kPage + 1);
  REQUIRE(engine->pin_prefix(head, {}, std::chrono::minutes(5), b).ok());
  CHECK(b.pinned_tokens == 4 * kPage);
  CHECK(engine->metrics().pinned_pages == 14);
  check(*engine);
}

TEST_CASE("a pin expires by itself, and a hit on its prefix restarts its time", "[engine][pins]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine();
  const Tokens prompt = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  const Tokens other = clm_test::random_tokens(rng, 2 * kPage + 1, 50000);
  serve(*engine, prompt);
  clm::PinResult pin;
  REQUIRE(engine->pin_prefix(prompt, {}, std::chrono::milliseconds(1000), pin).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  serve(*engine, prompt);  // a hit on the whole prefix: 1000 ms again from here
  CHECK(engine->metrics().pins_refreshed == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // 1300 ms after the pin, 700 after the hit
  serve(*engine, other);                                        // (expiry is looked at by admissions)
  CHECK(engine->metrics().pins_active == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // 1600 ms after the hit
  serve(*engine, other);
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.pins_active == 0);
  CHECK(m.pins_expired == 1);
  CHECK(m.pinned_pages == 0);
  CHECK(engine->unpin(pin.pin).code() == StatusCode::not_found);
  flood(*engine, rng);
  CHECK(cached(*engine, prompt) == 0);
  check(*engine);
}

TEST_CASE("pin_prefix refuses bad calls with a clear status and pins nothing", "[engine][pins]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine();
  const Tokens prompt = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  clm::PinResult pin;
  CHECK(engine->pin_prefix(prompt, {}, std::chrono::minutes(1), pin).code() == StatusCode::not_found);
  serve(*engine, prompt);
  CHECK(engine->pin_prefix(prompt, {}, std::chrono::milliseconds(0), pin).code() == StatusCode::invalid_argument);
  CHECK(engine->pin_prefix(prompt, {}, std::chrono::hours(2), pin).code() == StatusCode::invalid_argument);
  CHECK(engine->pin_prefix(Tokens{}, {}, std::chrono::minutes(1), pin).code() == StatusCode::invalid_argument);
  CHECK(engine->pin_prefix(Tokens{1, -5, 3}, {}, std::chrono::minutes(1), pin).code() == StatusCode::invalid_argument);
  // Another tenant's salt finds nothing of this prompt to pin.
  CHECK(engine->pin_prefix(prompt, {.cache_salt = "other"}, std::chrono::minutes(1), pin).code() ==
        StatusCode::not_found);
  CHECK(engine->unpin(12345).code() == StatusCode::not_found);
  CHECK(engine->metrics().pins_active == 0);
  auto no_pins = make_engine(0.0);
  serve(*no_pins, prompt);
  CHECK(no_pins->pin_prefix(prompt, {}, std::chrono::minutes(1), pin).code() == StatusCode::out_of_memory);
  clm::EngineConfig bad;
  bad.pool.num_pages = 8;
  bad.pool.memory = clm::MemoryKind::none;
  bad.pin_budget_fraction = 1.5;
  std::unique_ptr<Engine> refused;
  CHECK(Engine::create(bad, refused).code() == StatusCode::invalid_argument);
  check(*engine);
}

TEST_CASE("a priority that expires: a hinted prefix outlives a flood until its time, a later hint replaces it",
          "[engine][hints]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine(0.25, clm::EvictionPolicy::priority);
  Tokens hinted = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  const Tokens unhinted = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  serve(*engine, hinted);
  serve(*engine, unhinted);
  std::int32_t reached = 0;
  REQUIRE(engine->hint_prefix("conversation-1", hinted, {}, 1, std::chrono::milliseconds(1500), reached).ok());
  CHECK(reached == 6 * kPage);
  flood(*engine, rng);
  CHECK(cached(*engine, hinted) == 6 * kPage);
  CHECK(cached(*engine, unhinted) == 0);  // the control: the flood does evict

  // The next turn: the conversation grows, and its hint replaces the first.
  const Tokens more = clm_test::random_tokens(rng, 2 * kPage, 50000);
  hinted.insert(hinted.end() - 1, more.begin(), more.end());
  serve(*engine, hinted);
  REQUIRE(engine->hint_prefix("conversation-1", hinted, {}, 1, std::chrono::milliseconds(2500), reached).ok());
  CHECK(reached == 8 * kPage);
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));  // past the first hint's time
  flood(*engine, rng);
  CHECK(cached(*engine, hinted) == 8 * kPage);
  clm::EngineMetrics m = engine->metrics();
  CHECK(m.priority_hints_active == 1);
  CHECK(m.priority_hints_replaced == 1);
  CHECK(m.priority_hints_expired == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // past the second's
  flood(*engine, rng);
  CHECK(cached(*engine, hinted) == 0);
  m = engine->metrics();
  CHECK(m.priority_hints_active == 0);
  CHECK(m.priority_hints_expired == 1);
}

TEST_CASE("priority hints: bad calls refused, and the oldest expires early past the capacity", "[engine][hints]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto engine = make_engine(0.25, clm::EvictionPolicy::priority, 2);
  const Tokens prompt = clm_test::random_tokens(rng, 4 * kPage + 1, 50000);
  serve(*engine, prompt);
  std::int32_t reached = 0;
  const auto ttl = std::chrono::minutes(1);
  CHECK(engine->hint_prefix("", prompt, {}, 1, ttl, reached).code() == StatusCode::invalid_argument);
  CHECK(engine->hint_prefix("k", prompt, {}, 0, ttl, reached).code() == StatusCode::invalid_argument);
  CHECK(engine->hint_prefix("k", prompt, {}, 101, ttl, reached).code() == StatusCode::invalid_argument);
  CHECK(engine->hint_prefix("k", prompt, {}, 1, std::chrono::milliseconds(0), reached).code() ==
        StatusCode::invalid_argument);
  CHECK(engine->hint_prefix("k", Tokens{1, -2}, {}, 1, ttl, reached).code() == StatusCode::invalid_argument);
  CHECK(engine->metrics().priority_hints_active == 0);
  // Nothing cached under another salt: accepted, reaching nothing.
  REQUIRE(engine->hint_prefix("a", prompt, {.cache_salt = "other"}, 1, ttl, reached).ok());
  CHECK(reached == 0);
  REQUIRE(engine->hint_prefix("b", prompt, {}, 1, ttl, reached).ok());
  CHECK(reached == 4 * kPage);
  REQUIRE(engine->hint_prefix("c", prompt, {}, 1, ttl, reached).ok());
  const clm::EngineMetrics m = engine->metrics();
  CHECK(m.priority_hints_active == 2);
  CHECK(m.priority_hints_expired == 1);
  check(*engine);
}
