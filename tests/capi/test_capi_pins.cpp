// Pinned prefixes through the C ABI (clm.h, "Pinned prefixes"), as a host
// sees them: a pinned prompt stays cached through a flood that evicts an
// unpinned one of the same size, clm_engine_unpin lets it go, the budget
// refuses a pin past it, the text metrics count the pins, and bad calls get
// their status and a message. Only clm.h.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "capi_checks.hpp"
#include "clm.h"
#include "test_random.hpp"

namespace {

constexpr int32_t kPage = 4, kPages = 64;  // a budget of 16 pages

struct Engine {
  clm_engine* engine = nullptr;
  explicit Engine(int32_t eviction_policy = CLM_EVICT_LRU) {
    clm_engine_options o;
    REQUIRE_OK(clm_engine_options_init(&o, sizeof o));
    o.eviction_policy = eviction_policy;
    o.num_pages = kPages;
    o.page_size = kPage;
    o.num_layers = 1;
    o.kv_heads = 1;
    o.head_dim = 4;
    o.kv_dtype = CLM_KV_F32;
    REQUIRE_OK(clm_engine_create(&engine, &o));
  }
  ~Engine() { clm_engine_free(engine); }
  void serve(const std::vector<int32_t>& prompt) const {
    clm_seq* seq = nullptr;
    REQUIRE_OK(clm_engine_admit(&seq, engine, prompt.data(), prompt.size(), nullptr));
    REQUIRE_OK(clm_seq_finish(seq));
    clm_seq_free(seq);
  }
  int32_t cached(const std::vector<int32_t>& prompt) const {
    clm_admission_plan plan;
    plan.struct_size = sizeof plan;
    REQUIRE_OK(clm_engine_plan_admission(&plan, engine, prompt.data(), prompt.size(), nullptr));
    return plan.cached_tokens;
  }
  std::string metrics() const {
    size_t length = 0;
    (void)clm_engine_metrics_text(nullptr, 0, &length, engine);  // sizing
    std::string text(length + 4096, '\0');
    REQUIRE_OK(clm_engine_metrics_text(text.data(), text.size(), &length, engine));
    text.resize(length);
    return text;
  }
};

}  // namespace

TEST_CASE("C ABI: a pinned prefix outlives a flood, unpin lets it go, the budget refuses", "[capi][pins]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Engine e;
  const auto pinned = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  const auto unpinned = clm_test::random_tokens(rng, 10 * kPage + 1, 50000);
  e.serve(pinned);
  e.serve(unpinned);
  uint64_t pin = 0;
  int32_t tokens = 0;
  REQUIRE_OK(clm_engine_pin_prefix(e.engine, pinned.data(), pinned.size(), nullptr, 60000, &pin, &tokens));
  CHECK(pin != 0);
  CHECK(tokens == 10 * kPage);
  uint64_t refused = 7;
  CHECK_STATUS(CLM_ERR_OUT_OF_MEMORY,
               clm_engine_pin_prefix(e.engine, unpinned.data(), unpinned.size(), nullptr, 60000, &refused, nullptr));
  CHECK(refused == 0);
  for (int i = 0; i < 30; ++i) e.serve(clm_test::random_tokens(rng, 8 * kPage + 1, 50000));
  CHECK(e.cached(pinned) == 10 * kPage);
  CHECK(e.cached(unpinned) == 0);
  const std::string text = e.metrics();
  CHECK_THAT(text, Catch::Contains("\nclm_pins_active 1\n"));
  CHECK_THAT(text, Catch::Contains("\nclm_pinned_pages 10\n"));
  CHECK_THAT(text, Catch::Contains("clm_pins_total{event=\"refused\"} 1\n"));
  REQUIRE_OK(clm_engine_unpin(e.engine, pin));
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_unpin(e.engine, pin));
  for (int i = 0; i < 30; ++i) e.serve(clm_test::random_tokens(rng, 8 * kPage + 1, 50000));
  CHECK(e.cached(pinned) == 0);
}

TEST_CASE("C ABI: bad pin calls get their status and a message", "[capi][pins]") {
  std::mt19937 rng(clm_test::fresh_seed());
  Engine e;
  const auto prompt = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  uint64_t pin = 0;
  CHECK_STATUS(CLM_ERR_NOT_FOUND,
               clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, 1000, &pin, nullptr));
  e.serve(prompt);
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, 0, &pin, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, 86400001, &pin, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, -5, &pin, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_pin_prefix(e.engine, nullptr, 3, nullptr, 1000, &pin, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_pin_prefix(nullptr, prompt.data(), prompt.size(), nullptr, 1000, &pin, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, 1000, nullptr, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_unpin(nullptr, 1));
  CHECK_STATUS(CLM_ERR_NOT_FOUND, clm_engine_unpin(e.engine, 99));
  REQUIRE_OK(clm_engine_pin_prefix(e.engine, prompt.data(), prompt.size(), nullptr, 86400000, &pin, nullptr));
  CHECK(pin != 0);
}

TEST_CASE("C ABI: a priority hint keeps a prefix through a flood until it expires", "[capi][hints]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Engine e(CLM_EVICT_PRIORITY);
  const auto hinted = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  const auto unhinted = clm_test::random_tokens(rng, 6 * kPage + 1, 50000);
  e.serve(hinted);
  e.serve(unhinted);
  const std::string key = "tenant/conversation-1";
  int32_t reached = -1;
  REQUIRE_OK(clm_engine_hint_prefix(e.engine, key.data(), key.size(), hinted.data(), hinted.size(), nullptr, 1, 800,
                                    &reached));
  CHECK(reached == 6 * kPage);
  for (int i = 0; i < 30; ++i) e.serve(clm_test::random_tokens(rng, 8 * kPage + 1, 50000));
  CHECK(e.cached(hinted) == 6 * kPage);
  CHECK(e.cached(unhinted) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  for (int i = 0; i < 30; ++i) e.serve(clm_test::random_tokens(rng, 8 * kPage + 1, 50000));
  CHECK(e.cached(hinted) == 0);
  CHECK_THAT(e.metrics(), Catch::Contains("clm_priority_hints_total{event=\"expired\"} 1\n"));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_hint_prefix(e.engine, nullptr, 3, hinted.data(), hinted.size(), nullptr, 1, 800, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT,
               clm_engine_hint_prefix(e.engine, "", 0, hinted.data(), hinted.size(), nullptr, 1, 800, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_hint_prefix(e.engine, key.data(), key.size(), hinted.data(),
                                                                hinted.size(), nullptr, 0, 800, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_hint_prefix(e.engine, key.data(), key.size(), hinted.data(),
                                                                hinted.size(), nullptr, 1, 0, nullptr));
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_hint_prefix(nullptr, key.data(), key.size(), hinted.data(),
                                                                hinted.size(), nullptr, 1, 800, nullptr));
}
