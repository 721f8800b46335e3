// lib/store/shard_mutex.hpp: the lock of a snapshot-store shard. A lookup
// waits for it only until its deadline (SnapshotStoreConfig::lookup_timeout_us,
// then a busy miss), so it is a timed mutex; writers and maintenance lock it
// plainly. Internal to lib/store.
//
//   ShardMutex m;
//   std::unique_lock lock(m, std::defer_lock);
//   if (!lock.try_lock_until(deadline)) return busy();
//
// Why not std::timed_mutex: libstdc++ implements its timed lock with glibc's
// pthread_mutex_clocklock, which ThreadSanitizer does not intercept
// (llvm-project issue 62623), so under `make test-tsan` every timed lock
// looks absent and its unlock an error. A mutex, a flag and a condition
// variable (whose timed wait TSan does see) behave the same and cost a
// little more only when the lock is contended.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace clm::store_detail {

class ShardMutex {
 public:
  void lock() {
    std::unique_lock guard(state_);
    released_.wait(guard, [this] { return !held_; });
    held_ = true;
  }
  bool try_lock() {
    std::lock_guard guard(state_);
    if (held_) return false;
    held_ = true;
    return true;
  }
  template <class Clock, class Duration>
  bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    std::unique_lock guard(state_);
    if (!released_.wait_until(guard, deadline, [this] { return !held_; })) return false;
    held_ = true;
    return true;
  }
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
    return try_lock_until(std::chrono::steady_clock::now() + timeout);
  }
  void unlock() {
    {
      std::lock_guard guard(state_);
      held_ = false;
    }
    released_.notify_one();
  }

 private:
  std::mutex state_;  // guards held_
  std::condition_variable released_;
  bool held_ = false;
};

}  // namespace clm::store_detail
