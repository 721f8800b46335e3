// StorageBreaker (clm/tiers/storage_breaker.hpp) against a naive model of its
// rules, on fresh random sequences of calls, outcomes and clock steps, with
// the state, trips and skips compared after every step.
#include <chrono>
#include <cstdint>
#include <random>

#include <catch2/catch.hpp>

#include "clm/tiers/storage_breaker.hpp"
#include "test_support.hpp"

namespace {

using Clock = clm::StorageBreaker::Clock;
using State = clm::StorageBreaker::State;

// The rules as the header states them, written out plainly.
struct NaiveBreaker {
  int failures_to_open;
  std::int64_t open_ms;
  State state = State::closed;
  int failures_in_a_row = 0;
  std::int64_t opened_at_ms = 0;
  std::uint64_t trips = 0, skips = 0;

  bool allow(std::int64_t now_ms) {
    if (state == State::closed) return true;
    if (state == State::open && now_ms - opened_at_ms >= open_ms) {
      state = State::half_open;
      return true;
    }
    ++skips;
    return false;
  }
  void report(bool ok, std::int64_t now_ms) {
    if (ok) {
      failures_in_a_row = 0;
      state = State::closed;
      return;
    }
    ++failures_in_a_row;
    const bool opens = state == State::half_open || (state == State::closed && failures_in_a_row >= failures_to_open);
    if (opens) {
      state = State::open;
      opened_at_ms = now_ms;
      ++trips;
    }
  }
};

}  // namespace

TEST_CASE("storage breaker: opens after N failures in a row, probes once after open_for, closes on success",
          "[tiers][breaker]") {
  clm::StorageBreaker b(3, std::chrono::milliseconds(100));
  const Clock::time_point t0 = Clock::now();
  auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  CHECK(b.allow(at(0)));
  b.report(false, at(0));
  b.report(false, at(1));
  b.report(true, at(2));  // a success in between: the count starts again
  b.report(false, at(3));
  b.report(false, at(4));
  CHECK(b.state() == State::closed);
  b.report(false, at(5));
  CHECK(b.state() == State::open);
  CHECK(b.trips() == 1);
  CHECK_FALSE(b.allow(at(50)));
  CHECK(b.refusing(at(104)));
  CHECK_FALSE(b.refusing(at(105)));
  CHECK(b.allow(at(105)));  // the probe
  CHECK(b.state() == State::half_open);
  CHECK_FALSE(b.allow(at(106)));  // one probe at a time
  CHECK(b.refusing(at(106)));
  b.report(false, at(110));  // the probe failed: open again, for open_for from now
  CHECK(b.state() == State::open);
  CHECK(b.trips() == 2);
  CHECK_FALSE(b.allow(at(200)));
  CHECK(b.allow(at(210)));
  b.report(true, at(211));
  CHECK(b.state() == State::closed);
  CHECK(b.allow(at(212)));
  CHECK(b.skips() == 3);
}

TEST_CASE("storage breaker: random calls, outcomes and clock steps match the naive model", "[tiers][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int failures = 1 + static_cast<int>(rng() % 5);
    const std::int64_t open_ms = static_cast<std::int64_t>(rng() % 50);
    clm::StorageBreaker b(failures, std::chrono::milliseconds(open_ms));
    NaiveBreaker model{failures, open_ms};
    const Clock::time_point t0 = Clock::now();
    std::int64_t now = 0;
    const double fail_rate = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    for (int step = 0; step < 300; ++step) {
      now += static_cast<std::int64_t>(rng() % 20);
      const Clock::time_point t = t0 + std::chrono::milliseconds(now);
      INFO("trial " << trial << " step " << step);
      REQUIRE(b.refusing(t) ==
              (model.state == State::half_open || (model.state == State::open && now - model.opened_at_ms < open_ms)));
      const bool allowed = b.allow(t);
      REQUIRE(allowed == model.allow(now));
      // An allowed call reports (at once or a little later); a refused one may still see a late report
      // of an earlier call.
      if (allowed || rng() % 8 == 0) {
        const bool ok = std::uniform_real_distribution<double>(0.0, 1.0)(rng) >= fail_rate;
        now += static_cast<std::int64_t>(rng() % 5);
        b.report(ok, t0 + std::chrono::milliseconds(now));
        model.report(ok, now);
      }
      REQUIRE(b.state() == model.state);
      REQUIRE(b.trips() == model.trips);
      REQUIRE(b.skips() == model.skips);
    }
  }
}
