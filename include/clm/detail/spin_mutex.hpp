// clm/detail/spin_mutex.hpp: the Engine's lock. Its critical sections last a
// microsecond or two, far less than a futex sleep and wake-up, so a waiter
// spins a while first and only then blocks (C++20 atomic wait, a futex on
// Linux). Meets the Lockable requirements, for std::lock_guard.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace clm::detail {

class SpinThenBlockMutex {
 public:
  void lock() {
    for (int spin = 0; spin < kSpins; ++spin) {
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
  static constexpr int kSpins = 4000;  // a few microseconds
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
