// lib/kernels/attention_cpu_drivers.hpp: the CPU attention drivers
// (attention_cpu_drivers.cpp), which split a validated call of
// clm/kernels/attention.hpp into tasks for the thread pool and run each on
// the ISA's kernels; the entry points (attention_cpu.cpp) call them after
// their checks. Internal to lib/kernels; not installed.
#pragma once

#include <cstdint>
#include <vector>

#include "clm/detail/attention_cpu.hpp"
#include "clm/status.hpp"

namespace clm::detail {

struct Sequence {
  const std::int32_t* pages;
  std::int64_t begin;  // first visible key (sliding window)
  std::int64_t end;    // kv_len
};

// out [seq][Hq][D] = attention of each sequence's query over its keys
// [begin, end) (begin < end), split into chunks over the threads
// (flash-decoding). The kernels report no error but memory; the API never throws.
Status decode(const KvLayer& kv, const AttnShape& shape, const float* q, const std::vector<Sequence>& seqs, float* out,
              int requested_threads, const char* what);

// Whether paged_prefill_attention takes prefill_few (a few new tokens over a
// long cached prefix) rather than prefill_tiles.
bool prefill_few_applies(const KvLayer& kv, const AttnShape& shape, std::int32_t n_new, std::int64_t kv_len,
                         std::int32_t window);

// The n_new new tokens of a prefill as one decode over the keys they all see,
// then each token's own few keys.
Status prefill_few(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                   const std::int32_t* pages, std::int64_t kv_len, std::int32_t window, float* out, int threads,
                   const char* what);

// The n_new new tokens of a prefill in tiles of queries, per kv head.
Status prefill_tiles(const KvLayer& kv, const AttnShape& shape, const float* q, std::int32_t n_new,
                     const std::int32_t* pages, std::int32_t kv_len, std::int32_t window, float* out,
                     int requested_threads, const char* what);

}  // namespace clm::detail
