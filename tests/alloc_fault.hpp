// tests/alloc_fault.hpp: a test program's global operator new that fails on
// demand, so a test can run out of host memory at every allocation of a call
// in turn. Include it in exactly one source file of the program (it defines
// the replacement operators).
//
//   for (long n = 0;; ++n) {
//     clm_test::FailAllocation fail(n);  // this thread's n-th allocation from now throws std::bad_alloc
//     ... the call under test ...
//     if (!fail.fired()) break;          // the call allocated fewer than n + 1 times: done
//   }
//
// Only the arming thread's allocations count; others are never failed.
//
// Under ThreadSanitizer, whose runtime defines operator new itself, nothing
// is replaced and kAllocationFaults is false: a fault test there would fail
// nothing, so it REQUIREs kAllocationFaults (make test-tsan runs only the
// [threads] cases, which never arm a fault).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_THREAD__)
#define CLM_TEST_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CLM_TEST_THREAD_SANITIZER 1
#endif
#endif
#ifndef CLM_TEST_THREAD_SANITIZER
#define CLM_TEST_THREAD_SANITIZER 0
#endif

namespace clm_test {

// False where this header cannot replace operator new (ThreadSanitizer).
inline constexpr bool kAllocationFaults = !CLM_TEST_THREAD_SANITIZER;

// The allocations this thread lets through before failing one (-1: none fails).
inline thread_local long t_alloc_countdown = -1;
inline thread_local bool t_alloc_fired = false;

// Counts one allocation; true when it is the one to fail (only one fails).
inline bool allocation_fails() {
  if (t_alloc_countdown < 0) return false;
  if (t_alloc_countdown-- > 0) return false;
  t_alloc_fired = true;
  return true;
}

class FailAllocation {
 public:
  explicit FailAllocation(long n) {
    t_alloc_countdown = n;
    t_alloc_fired = false;
  }
  ~FailAllocation() { t_alloc_countdown = -1; }
  FailAllocation(const FailAllocation&) = delete;
  FailAllocation& operator=(const FailAllocation&) = delete;
  bool fired() const { return t_alloc_fired; }
};

}  // namespace clm_test

#if !CLM_TEST_THREAD_SANITIZER
// GCC sees free() of what operator new returned once it inlines these
// replacements: they are that pair here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t bytes) {
  if (clm_test::allocation_fails()) throw std::bad_alloc();
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
void* operator new(std::size_t bytes, std::align_val_t align) {
  if (clm_test::allocation_fails()) throw std::bad_alloc();
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a + (bytes == 0 ? a : 0))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes, std::align_val_t align) { return ::operator new(bytes, align); }
// The nothrow forms too: every allocation of the program is this file's, so
// that each delete below frees what one of these allocated.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  if (clm_test::allocation_fails()) return nullptr;
  return std::malloc(bytes ? bytes : 1);
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept { return ::operator new(bytes, tag); }
void* operator new(std::size_t bytes, std::align_val_t align, const std::nothrow_t&) noexcept {
  if (clm_test::allocation_fails()) return nullptr;
  const auto a = static_cast<std::size_t>(align);
  return std::aligned_alloc(a, (bytes + a - 1) / a * a + (bytes == 0 ? a : 0));
}
void* operator new[](std::size_t bytes, std::align_val_t align, const std::nothrow_t& tag) noexcept {
  return ::operator new(bytes, align, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif  // !CLM_TEST_THREAD_SANITIZER
