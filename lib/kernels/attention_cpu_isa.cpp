// lib/kernels/attention_cpu_isa.cpp: the ISA dispatch of the CPU attention
// kernels (clm/detail/attention_cpu.hpp): the best ISA this machine and build
// have (detected once), the one in use, and the switch tests and benchmarks
// force it with. The drivers (attention_cpu_drivers.cpp) pick each ISA's
// kernels by cpu_isa().
#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <fmt/format.h>

#include "clm/detail/attention_cpu.hpp"

namespace clm {
namespace detail {
namespace {

// ---- dispatch ---------------------------------------------------------------------

std::atomic<int> g_isa{-1};

CpuIsa detect_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // F16C by CPUID (leaf 1, ecx bit 29): not every compiler's __builtin_cpu_supports
  // knows it. AVX2 implies the OS saves the YMM state F16C needs.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  if (avx2_kernels_built() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
    // (__builtin_cpu_supports also checks that the OS saves the YMM and ZMM state)
    if (avx512_kernels_built() && __builtin_cpu_supports("avx512f")) return CpuIsa::avx512;
    return CpuIsa::avx2;
  }
#endif
  return CpuIsa::scalar;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::scalar:
      break;
  }
  return "scalar";
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = detect_isa();
  return best;
}

CpuIsa cpu_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(cpu_isa_best());
    g_isa.store(isa, std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(isa);
}

Status set_cpu_isa(CpuIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(cpu_isa_best())) {
    return unsupported(fmt::format("set_cpu_isa: this machine (or build) has no {} (best: {})", cpu_isa_name(isa),
                                   cpu_isa_name(cpu_isa_best())));
  }
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return {};
}

}  // namespace detail
}  // namespace clm
