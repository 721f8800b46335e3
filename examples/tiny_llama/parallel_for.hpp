// examples/tiny_llama/parallel_for.hpp: a fixed set of worker threads that
// run the tasks [0, n) of one call, and return when all are done. The decoder
// splits its GEMMs with it; the attention kernels have their own threads.
//
//   tiny_llama::WorkerPool pool(2);
//   pool.run(8, [&](std::int64_t task) { work(task); });
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tiny_llama {

class WorkerPool {
 public:
  // `threads` includes the caller; 0 = the hardware's threads.
  explicit WorkerPool(int threads) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(t) for t in [0, tasks); the caller takes tasks too. Not reentrant.
  void run(std::int64_t tasks, const std::function<void(std::int64_t)>& body) {
    if (tasks <= 1 || workers_.empty()) {
      for (std::int64_t t = 0; t < tasks; ++t) body(t);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      body_ = &body;
      tasks_ = tasks;
      next_ = 0;
      pending_ = tasks;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    body_ = nullptr;
  }

 private:
  // Takes tasks until none is left.
  void drain() {
    for (;;) {
      std::int64_t task;
      const std::function<void(std::int64_t)>* body;
      {
        std::lock_guard lock(mutex_);
        if (body_ == nullptr || next_ >= tasks_) return;
        task = next_++;
        body = body_;
      }
      (*body)(task);
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t)>* body_ = nullptr;
  std::int64_t tasks_ = 0, next_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace tiny_llama
