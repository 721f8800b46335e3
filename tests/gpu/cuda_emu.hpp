// tests/gpu/cuda_emu.hpp: a small CPU emulator for clmcache's CUDA kernels
// (cuda/kernels/kernels.cuh), so that their indexing, bounds, shared-memory use and
// synchronisation are tested on machines without a GPU.
//
// Each thread of a block is a fiber (ucontext) on the calling OS thread.
// Fibers run until they reach a barrier: __syncthreads (block_sync) or the
// exchange points of a warp shuffle. A barrier is released only when every
// thread it concerns has arrived; anything else (a shuffle reached by part of
// a warp, __syncthreads reached by part of a block, a thread exiting while
// others wait) is reported as a deadlock and aborts. Within a round the fibers
// run in a random order, so code that reads shared memory another thread
// writes without a barrier in between sees stale data and fails the test.
// `__shared__` variables are function statics: blocks run one at a time.
//
// Fibers switch with a few instructions on x86-64 (callee-saved registers and
// the stack pointer); elsewhere, and under sanitizers, with ucontext.
#pragma once

#define CLM_CUDA_EMULATION 1

#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CLM_EMU_FAST_SWITCH 1
#else
#define CLM_EMU_FAST_SWITCH 0
#endif

namespace clm_emu {

#if CLM_EMU_FAST_SWITCH
// Saves the callee-saved registers on the current stack, stores the stack
// pointer in *save, and resumes the stack `to` (saved the same way).
__attribute__((naked, noinline)) static void switch_stack(void** /*save*/, void* /*to*/) {
  asm volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
#endif

struct Dim {
  unsigned x = 1, y = 1, z = 1;
};

enum class Wait : std::uint8_t { running, block_barrier, warp_barrier, done };

struct Fiber {
  ucontext_t ctx{};
  void* sp = nullptr;  // fast switch: saved stack pointer
  std::vector<unsigned char> stack;
  Wait state = Wait::running;
};

struct State {
  std::vector<Fiber> fibers;
  ucontext_t scheduler{};
  void* scheduler_sp = nullptr;
  int current = -1;
  Dim block_idx;
  unsigned threads = 0;
  const std::function<void()>* body = nullptr;
  std::vector<std::uint32_t> slots;  // one exchange slot per thread, for shuffles
  std::mt19937 rng{20240611u};
  std::uint64_t blocks_run = 0;
  std::uint64_t switches = 0;
};

inline State& state() {
  static State s;
  return s;
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u, thread %d)\n", what, state().block_idx.x,
               state().block_idx.y, state().block_idx.z, state().current);
  std::abort();
}

inline unsigned thread_x() {
  if (state().current < 0) fail("threadIdx read outside a kernel");
  return static_cast<unsigned>(state().current);
}
inline unsigned block_x() { return state().block_idx.x; }
inline unsigned block_y() { return state().block_idx.y; }

inline void check_aligned(const void* p, std::size_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) fail("misaligned vector access");
}

inline void wait(Wait why) {
  State& s = state();
  Fiber& f = s.fibers[static_cast<std::size_t>(s.current)];
  f.state = why;
  ++s.switches;
#if CLM_EMU_FAST_SWITCH
  switch_stack(&f.sp, s.scheduler_sp);
#else
  swapcontext(&f.ctx, &s.scheduler);
#endif
}

inline void sync_block() { wait(Wait::block_barrier); }

inline float exchange(float v, unsigned src_lane) {
  State& s = state();
  const auto tid = static_cast<unsigned>(s.current);
  const unsigned warp_base = tid & ~31u;
  if (src_lane > 31 || warp_base + src_lane >= s.threads) fail("shuffle from a lane outside the block");
  s.slots[tid] = std::bit_cast<std::uint32_t>(v);
  wait(Wait::warp_barrier);  // every lane has written its slot
  const float r = std::bit_cast<float>(s.slots[warp_base + src_lane]);
  wait(Wait::warp_barrier);  // every lane has read before any slot is reused
  return r;
}
inline float shfl_xor(float v, int lane_mask) {
  if (lane_mask < 0 || lane_mask > 31) fail("bad shuffle lane mask");
  return exchange(v, (static_cast<unsigned>(state().current) & 31u) ^ static_cast<unsigned>(lane_mask));
}
inline float shfl_idx(float v, int src_lane) {
  if (src_lane < 0 || src_lane > 31) fail("bad shuffle source lane");
  return exchange(v, static_cast<unsigned>(src_lane));
}

inline void fiber_entry() {
  State& s = state();
  (*s.body)();
  Fiber& f = s.fibers[static_cast<std::size_t>(s.current)];
  f.state = Wait::done;
#if CLM_EMU_FAST_SWITCH
  switch_stack(&f.sp, s.scheduler_sp);  // never resumed
  std::abort();
#endif
  // ucontext: returning resumes uc_link, the scheduler
}

inline void run_block() {
  State& s = state();
  const unsigned n = s.threads;
  constexpr std::size_t kStack = 256 * 1024;
  if (s.fibers.size() < n) s.fibers.resize(n);
  s.slots.assign(n, 0);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = s.fibers[i];
    if (f.stack.empty()) f.stack.resize(kStack);
#if CLM_EMU_FAST_SWITCH
    // Initial frame: six zeroed callee-saved registers, then fiber_entry as
    // the return address, then a null fake return address for fiber_entry
    // (rsp % 16 == 8 on entry, as after a call).
    auto top = reinterpret_cast<std::uintptr_t>(f.stack.data() + f.stack.size()) & ~std::uintptr_t{15};
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&fiber_entry);
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &s.scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
    f.state = Wait::running;
  }
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  const unsigned warps = (n + 31) / 32;
  std::vector<char> runs(warps);
  for (;;) {
    std::shuffle(order.begin(), order.end(), s.rng);
    // Each round advances a random subset of the warps, so warps drift apart
    // as far as the barriers allow.
    bool any_ready = false, any_chosen = false;
    for (unsigned w = 0; w < warps; ++w) runs[w] = static_cast<char>(s.rng() & 1u);
    for (unsigned i = 0; i < n; ++i) {
      if (s.fibers[i].state != Wait::running) continue;
      any_ready = true;
      any_chosen = any_chosen || runs[i / 32];
    }
    if (any_ready && !any_chosen) std::fill(runs.begin(), runs.end(), char{1});
    for (unsigned i : order) {
      if (s.fibers[i].state != Wait::running || !runs[i / 32]) continue;
      s.current = static_cast<int>(i);
#if CLM_EMU_FAST_SWITCH
      switch_stack(&s.scheduler_sp, s.fibers[i].sp);
#else
      swapcontext(&s.scheduler, &s.fibers[i].ctx);
#endif
    }
    s.current = -1;
    unsigned done = 0, at_block = 0, ready = 0;
    for (unsigned i = 0; i < n; ++i) {
      done += s.fibers[i].state == Wait::done;
      at_block += s.fibers[i].state == Wait::block_barrier;
      ready += s.fibers[i].state == Wait::running;
    }
    if (done == n) break;
    bool released = false;
    for (unsigned w = 0; w * 32 < n; ++w) {
      const unsigned end = std::min(n, w * 32 + 32);
      bool all = true;
      for (unsigned i = w * 32; i < end; ++i) all = all && s.fibers[i].state == Wait::warp_barrier;
      if (!all) continue;
      for (unsigned i = w * 32; i < end; ++i) s.fibers[i].state = Wait::running;
      released = true;
    }
    if (released || ready > 0) continue;
    if (at_block == n) {
      for (unsigned i = 0; i < n; ++i) s.fibers[i].state = Wait::running;
      continue;
    }
    std::fprintf(stderr, "cuda_emu: %u of %u threads exited, %u wait at __syncthreads, the rest at a shuffle\n",
                 done, n, at_block);
    fail("deadlock: a barrier or shuffle not reached by all the threads it needs");
  }
  ++s.blocks_run;
}

// Runs kernel(args) over the grid, one block at a time, `threads` threads each.
template <class Kernel, class Args>
void launch(Dim grid, unsigned threads, Kernel kernel, const Args& args) {
  State& s = state();
  const std::function<void()> body = [&] { kernel(args); };
  s.body = &body;
  s.threads = threads;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        s.block_idx = Dim{x, y, z};
        run_block();
      }
    }
  }
  s.body = nullptr;
}

}  // namespace clm_emu
