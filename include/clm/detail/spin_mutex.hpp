// clm/detail/spin_mutex.hpp: the Engine's lock. Its critical sections last a
// microsecond or two, far less than a futex sleep and wake-up, so a waiter
// spins a while (512 PAUSEs) first and only then blocks (C++20 atomic wait, a futex on
// Linux). Meets the Lockable requirements, for std::lock_guard.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace clm::detail {

// PAUSEs a waiter spins before it sleeps. Chosen by bench_engine's spin case
// (docs/reliability.md): sleeping at once costs 20-35% of the throughput of 2
// and 4 threads on 2 cores, 64 spins up to 9%; from 512 to 16,000 it is flat
// within the noise, so the fewest of those, which also bound the waste when
// the holder is descheduled (4,000 before). A variable, read once per lock,
// so that the bench compares counts in one run.
inline constexpr int kDefaultSpinsBeforeSleep = 512;
inline std::atomic<int> spins_before_sleep{kDefaultSpinsBeforeSleep};

class SpinThenBlockMutex {
 public:
  void lock() {
    const int spins = spins_before_sleep.load(std::memory_order_relaxed);
    for (int spin = 0; spin < spins; ++spin) {
      if (state_.load(std::memory_order_relaxed) == kFree && try_lock()) return;
      relax();
    }
    // Contended: announce a waiter and sleep until the holder hands over.
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
    }
  }
  bool try_lock() {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (state_.exchange(kFree, std::memory_order_release) == kContended) state_.notify_one();
  }

 private:
  static constexpr int kFree = 0, kLocked = 1, kContended = 2;
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }
  std::atomic<int> state_{kFree};
};

}  // namespace clm::detail
