// lib/kernels/attention_cpu_threads.hpp: the CPU attention drivers' way to run
// a loop of tasks on the kernels' thread pool (attention_cpu_threads.cpp).
// Internal to lib/kernels; not installed.
#pragma once

#include <cstdint>

namespace clm::detail {

using TaskBody = void (*)(void* context, std::int64_t task);

// Runs body(context, t) for every t in [0, tasks) on up to `threads` threads
// of the pool (the calling thread takes part). False if a task threw (the rest
// still ran).
bool run_tasks(std::int64_t tasks, int threads, TaskBody body, void* context);

template <typename F>
bool parallel_for(std::int64_t tasks, int threads, F& f) {
  return run_tasks(
      tasks, threads, [](void* context, std::int64_t t) { (*static_cast<F*>(context))(t); }, &f);
}

}  // namespace clm::detail
