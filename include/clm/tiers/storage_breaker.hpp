// clm/tiers/storage_breaker.hpp: a circuit breaker in front of a storage
// tier. A storage server that hangs (SIGSTOPped, a full disk that blocks)
// still accepts connections, so each call waits its whole timeout; after
// `failures_to_open` failed calls in a row the breaker stops asking storage
// (every job is skipped at once) for `open_for`, then lets ONE call through
// as a probe (half-open): its success closes the breaker, its failure opens
// it again.
//
//   clm::StorageBreaker breaker(3, std::chrono::milliseconds(5000));
//   if (breaker.allow(now)) {
//     const bool ok = storage_call().ok();
//     breaker.report(ok, now);
//   }                                   // else: skipped, counted in breaker.skips()
//
// Not thread-safe: the TierManager calls it under its queue lock.
#pragma once

#include <chrono>
#include <cstdint>

namespace clm {

class StorageBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State : std::uint8_t { closed = 0, open = 1, half_open = 2 };

  // failures_to_open >= 1; open_for >= 0.
  StorageBreaker(int failures_to_open, std::chrono::milliseconds open_for)
      : failures_to_open_(failures_to_open), open_for_(open_for) {}

  // Whether a storage call may start at `now`. Open: no, until open_for has
  // passed since it opened; then this one call is the probe (half-open) and
  // every other call waits for its report.
  bool allow(Clock::time_point now) {
    if (state_ == State::closed) return true;
    if (state_ == State::open && now - opened_at_ >= open_for_) {
      state_ = State::half_open;
      return true;  // the probe
    }
    ++skips_;
    return false;
  }

  // Whether a call would be refused now, without starting a probe (for a
  // caller that need not queue a job at all).
  bool refusing(Clock::time_point now) const {
    return state_ == State::half_open || (state_ == State::open && now - opened_at_ < open_for_);
  }

  // The outcome of a call allow() let through.
  void report(bool ok, Clock::time_point now) {
    if (ok) {
      consecutive_failures_ = 0;
      state_ = State::closed;
      return;
    }
    ++consecutive_failures_;
    if (state_ == State::half_open || (state_ == State::closed && consecutive_failures_ >= failures_to_open_)) {
      state_ = State::open;
      opened_at_ = now;
      ++trips_;
    }
  }

  State state() const { return state_; }
  std::uint64_t trips() const { return trips_; }  // times it opened (a failed probe opens it again)
  std::uint64_t skips() const { return skips_; }  // calls refused while open
  // A call refused without allow() (refusing() said so), counted as a skip.
  void count_skip() { ++skips_; }

 private:
  const int failures_to_open_;
  const std::chrono::milliseconds open_for_;
  State state_ = State::closed;
  int consecutive_failures_ = 0;
  Clock::time_point opened_at_{};
  std::uint64_t trips_ = 0;
  std::uint64_t skips_ = 0;
};

}  // namespace clm
