// examples/replay/replay_driver.hpp: replays a Workload through a PagedKvPool
// (MemoryKind::none: page ids and reference counts, no KV bytes) and a
// RadixTree, one request at a time, with the protocol of workloads.md, and
// measures what it costs.
//
// Per request: match_prefix(prompt) and lock the match; allocate pages for
// the rest of prompt+output (evicting when short; a request that cannot get
// them because everything left is locked fails and is skipped); insert the
// prompt, lock its node and unlock the match; for gsp/JSONL insert
// prompt+output; unlock; release the pages the tree did not take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "clm/eviction_policy.hpp"
#include "clm/status.hpp"
#include "workload.hpp"

namespace clm::replay {

struct ReplayConfig {
  std::int32_t page_size = 16;
  std::int64_t capacity_tokens = 1 << 20;  // pool size; num_pages = capacity / page_size
  EvictionPolicy policy = EvictionPolicy::lru;
  // Requests between samples of the tree's metadata size (taken inside the
  // timed loop: metadata_bytes() is O(namespaces), so this costs next to nothing).
  std::int32_t metadata_sample_interval = 64;
};

struct ReplayResult {
  std::uint64_t requests = 0;
  std::uint64_t failed_requests = 0;  // no pages even after evicting everything unlocked
  std::uint64_t prompt_tokens = 0;    // of all requests, failed ones included
  std::uint64_t hit_tokens = 0;       // matched prompt tokens, failed requests included
  std::uint64_t inserted_tokens = 0;  // tokens newly stored by inserts
  std::uint64_t evicted_tokens = 0;
  std::uint64_t evictions = 0;        // leaves evicted
  // Tree metadata, sampled every metadata_sample_interval requests and at the
  // end: the sample with the most cached tokens (the first such), and the end.
  std::int64_t peak_cached_tokens = 0;
  std::size_t metadata_bytes_at_peak = 0;
  std::int64_t final_cached_tokens = 0;
  std::size_t final_metadata_bytes = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;
  double wall_s = 0;                  // the replay loop alone (the median with repeats)
  std::vector<double> wall_s_runs;    // every run's, in run order

  double hit_rate() const;
  double requests_per_s() const;
  double metadata_bytes_per_token() const;        // at the peak sample
  double final_metadata_bytes_per_token() const;  // at the end
  // The least memory traffic the replay implies: 8 bytes per hit token
  // (comparing both sides), 4 per newly stored token, 4 per page id returned
  // by a match or stored by an insert.
  std::uint64_t touched_bytes() const;
  // (touched_bytes / wall_s) / memcmp bandwidth: 1.0 would be a replay that
  // does nothing but stream the bytes it must touch.
  double memory_bound_fraction(double memcmp_gbps) const;
};

// One replay on a fresh pool and tree. Fails with StatusCode::internal when a
// page leaked (pool pages in use != cached tokens / page size, or pages still
// in use once the tree is gone) or an invariant of the tree broke.
Status run_replay(const Workload& workload, const ReplayConfig& config, ReplayResult& out);

// `repeats` replays, each on a fresh pool and tree; wall_s is their median.
// Every count must come out the same in each run (the replay is deterministic).
Status run_replays(const Workload& workload, const ReplayConfig& config, int repeats, ReplayResult& out);

// memcmp of two equal buffers of `buffer_bytes`, best of `passes`, counting
// 2 * buffer_bytes per pass; in GB/s (1e9 bytes).
double measure_memcmp_gbps(std::size_t buffer_bytes = std::size_t{64} << 20, int passes = 5);

}  // namespace clm::replay
