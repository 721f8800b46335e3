// lib/kernels/attention_cpu_threads.cpp: the threads of the CPU attention
// kernels (clm/kernels/attention.hpp): the thread pool that runs the drivers'
// tasks (attention_cpu_threads.hpp), the thread count a kernel uses
// (cpu_kernel_threads) and the kernels' per-thread scratch (scratch_floats).
#include "attention_cpu_threads.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__unix__)
#include <unistd.h>
#endif

#include "clm/detail/attention_cpu.hpp"

namespace clm {
namespace detail {
namespace {

// ---- threads --------------------------------------------------------------------

int hardware_threads() {
  static const int count = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      const int n = CPU_COUNT(&set);
      if (n > 0) return n;
    }
#endif
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
  }();
  return count;
}

// A fixed set of workers that run one parallel loop at a time; the calling
// thread takes part. A call that finds the pool busy (another host thread is
// in a kernel) runs its loop on its own thread rather than wait.
class ThreadPool {
 public:
  using Body = void (*)(void* context, std::int64_t task);

  static ThreadPool& instance() {
    static ThreadPool pool;
    return pool;
  }

  ~ThreadPool() {
    if (forked()) {                                       // the workers are the parent's: nothing to stop or join here
      new std::vector<std::thread>(std::move(workers_));  // never destroyed (joinable)
      return;
    }
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // Runs body(context, t) for every t in [0, tasks) on up to `threads`
  // threads. False if a task threw (the rest still ran).
  bool run(std::int64_t tasks, int threads, Body body, void* context) {
    if (tasks <= 0) return true;
    threads = static_cast<int>(std::min<std::int64_t>(threads, tasks));
    if (threads > 1 && forked()) threads = 1;  // a forked child has none of the workers
    std::unique_lock run_lock(run_mutex_, std::try_to_lock);
    if (threads > 1 && run_lock.owns_lock()) threads = 1 + ensure_workers(threads - 1);
    if (threads <= 1 || !run_lock.owns_lock()) {
      bool ok = true;
      for (std::int64_t t = 0; t < tasks; ++t) ok &= call(body, context, t);
      return ok;
    }
    {
      std::lock_guard lock(mutex_);
      body_ = body;
      context_ = context;
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      helpers_ = threads - 1;
      active_ = helpers_;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    return !failed_.load(std::memory_order_relaxed);
  }

 private:
  ThreadPool() = default;

  // True in a child forked after the workers started (they exist only in the
  // parent; its locks may be held). The child runs every loop on its own thread.
  // Reads no workers_: another thread may be adding workers (under run_mutex_).
  bool forked() const {
#if defined(__unix__)
    return started_.load(std::memory_order_acquire) && getpid() != owner_;
#else
    return false;
#endif
  }

  static bool call(Body body, void* context, std::int64_t task) {
    try {
      body(context, task);
      return true;
    } catch (...) {  // std::bad_alloc from scratch memory: reported as a Status
      return false;
    }
  }

  void work() {
    for (;;) {
      const std::int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= tasks_) return;
      if (!call(body_, context_, t)) failed_.store(true, std::memory_order_relaxed);
    }
  }

  // Starts workers up to `wanted` (or as many as the system gives); returns how many there are.
  int ensure_workers(int wanted) {
    wanted = std::min(wanted, hardware_threads() - 1);
    while (static_cast<int>(workers_.size()) < wanted) {
      try {
        const int index = static_cast<int>(workers_.size());
        workers_.emplace_back([this, index] { worker_loop(index); });
        started_.store(true, std::memory_order_release);
      } catch (...) {
        break;
      }
    }
    return std::min(wanted, static_cast<int>(workers_.size()));
  }

  void worker_loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= helpers_) continue;  // not needed for this loop
      }
      work();
      {
        std::lock_guard lock(mutex_);
        if (--active_ == 0) done_.notify_one();
      }
    }
  }

#if defined(__unix__)
  const pid_t owner_ = getpid();
#endif
  std::mutex run_mutex_;  // one loop at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;  // grown under run_mutex_
  std::atomic<bool> started_{false};  // workers_ is not empty
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  int helpers_ = 0;
  int active_ = 0;
  Body body_ = nullptr;
  void* context_ = nullptr;
  std::int64_t tasks_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<bool> failed_{false};
};

// ---- per-thread scratch -----------------------------------------------------------

struct Scratch {
  static constexpr int kSlots = 8;
  float* data[kSlots] = {};
  std::size_t size[kSlots] = {};
  ~Scratch() {
    for (float* p : data) std::free(p);
  }
};
thread_local Scratch t_scratch;

}  // namespace

bool run_tasks(std::int64_t tasks, int threads, TaskBody body, void* context) {
  return ThreadPool::instance().run(tasks, threads, body, context);
}

int cpu_kernel_threads(int requested) {
  const int hw = hardware_threads();
  return requested <= 0 ? hw : std::min(requested, hw);
}

float* scratch_floats(int slot, std::size_t count) {
  Scratch& s = t_scratch;
  const std::size_t i = static_cast<std::size_t>(slot);
  if (s.size[i] < count) {
    const std::size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::free(s.data[i]);
    s.data[i] = static_cast<float*>(p);
    s.size[i] = bytes / sizeof(float);
  }
  return s.data[i];
}

}  // namespace detail
}  // namespace clm
