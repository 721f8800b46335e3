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
//
// With a host tier (ReplayConfig::host_capacity_tokens > 0) the replay runs
// through a real clm::Engine with EngineConfig::tiers instead (the tiered
// path): per request admit(prompt); extend(output) for gsp/JSONL (Mooncake
// outputs hold pages through a second admission in a private namespace that
// is aborted, so they are never cached); finish; then wait_for_tiers(), so
// that every copy and storage call a request started is done before the next
// one and the run is deterministic. L1 is the Engine's pool: page ids only
// (MemoryKind::none) without storage; with storage the pages need bytes, so
// L1 is host memory of a tiny layout (kTieredKvLayout) whose rows the replay
// writes from a hash of (salt, tokens so far), and every cached row an
// admission returns, from whichever tier, is checked against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "clm/cache/divergence.hpp"
#include "clm/cache/eviction_policy.hpp"
#include "clm/events/kv_events_config.hpp"
#include "clm/kernels/kv_dtype.hpp"
#include "clm/status.hpp"
#include "clm/tiers/tier_config.hpp"
#include "workload.hpp"

namespace clm {
class Engine;
}  // namespace clm

namespace clm::replay {

struct ReplayConfig {
  std::int32_t page_size = 16;
  std::int64_t capacity_tokens = 1 << 20;  // pool size; num_pages = capacity / page_size
  EvictionPolicy policy = EvictionPolicy::lru;
  // The policy's parameters (EngineConfig has their meaning); NaN: the
  // policy's default. protected_fraction, in [0, 1], for slru and ghost_slru;
  // ghost_memory, in [0, kMaxGhostMemory] pool capacities, for ghost_slru.
  // Set for another policy, run_replay refuses them rather than ignore them.
  double protected_fraction = std::numeric_limits<double>::quiet_NaN();
  double ghost_memory = std::numeric_limits<double>::quiet_NaN();
  // A host hint, known here from the trace (an oracle, like belady): a
  // request whose conversation's next turn comes within this many seconds is
  // cached with priority kNextTurnHintPriority instead of 0, which ghost_slru
  // protects and the priority policy evicts last. NaN: no hint. Needs a
  // workload with turn timing (Mooncake with timestamps) and one of those two
  // policies; run_replay refuses it otherwise.
  double hint_next_turn_within_s = std::numeric_limits<double>::quiet_NaN();
  // A host's hint errs: a request whose next turn does come within the time
  // is hinted with probability hint_recall, one whose next turn does not
  // with hint_false_rate (both in [0, 1]; the draw is a hash of the request's
  // index, the same in every run). Refused without the hint.
  double hint_recall = 1.0;
  double hint_false_rate = 0.0;
  // How a request's priority meets its prefix's cached priority (a request
  // not hinted is cached with 0): raise keeps the highest, so a conversation
  // once hinted stays hinted; set replaces it, so the hint expires when the
  // next turn comes without one (eviction_policy.hpp). Refused without the hint.
  PriorityUpdate hint_update = PriorityUpdate::raise;
  // Requests between samples of the tree's metadata size (taken inside the
  // timed loop: metadata_bytes() is O(namespaces), so this costs next to nothing).
  std::int32_t metadata_sample_interval = 64;

  // The tiered path (see above): a host tier (L2) of host_capacity_tokens
  // (host pages = host_capacity_tokens / page_size) when > 0, and a storage
  // tier (L3) at storage_url when not empty (needs the host tier).
  std::int64_t host_capacity_tokens = 0;
  std::string storage_url;
  std::string model_id;  // required with storage_url: the stored pages' model (EngineConfig::model_id)
  WritePolicy write_policy = WritePolicy::write_through;
  // wait_complete: an admission waits for every page storage has, so that
  // the hits of a run do not depend on timing.
  PrefetchPolicy prefetch_policy = PrefetchPolicy::wait_complete;
  // The tiered path: KV events (docs/fleet.md) published as the run goes
  // (needs model_id); every event is published before the run's result.
  // With keep_engine, the result keeps the Engine (its replay socket serves
  // on) until the caller lets it go.
  KvEventsConfig kv_events;
  bool keep_engine = false;
  // Divergence counting (cache/divergence.hpp: branch points, the match-depth
  // histogram), on as in an Engine; off for the baseline of its cost.
  bool divergence = true;

  bool tiered() const { return host_capacity_tokens > 0 || !storage_url.empty(); }
  // The parameters the policy runs with (the defaults for NaN).
  double effective_protected_fraction() const;
  double effective_ghost_memory() const;
};

// The page layout of L1 on the tiered path when storage needs KV bytes: one
// layer, one KV head of 8 f16 values (256 bytes a token, K and V), so that
// pages are real bytes, but small.
struct TieredKvLayout {
  std::int32_t num_layers = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 8;
  KvDType dtype = KvDType::f16;
};
inline constexpr TieredKvLayout kTieredKvLayout{};

// The priority a hinted request is cached with (ReplayConfig::hint_next_turn_within_s).
inline constexpr int kNextTurnHintPriority = 1;

struct ReplayResult {
  std::uint64_t requests = 0;
  std::uint64_t failed_requests = 0;  // no pages even after evicting everything unlocked
  std::uint64_t prompt_tokens = 0;    // of all requests, failed ones included
  std::uint64_t hit_tokens = 0;       // matched prompt tokens, failed requests included
                                      // (tiered path: cached tokens from all tiers; a
                                      // refused admission has none)
  std::uint64_t inserted_tokens = 0;  // tokens newly stored by inserts
  std::uint64_t evicted_tokens = 0;
  std::uint64_t evictions = 0;  // leaves evicted
  // Tree metadata, sampled every metadata_sample_interval requests and at the
  // end: the sample with the most cached tokens (the first such), and the end.
  std::int64_t peak_cached_tokens = 0;
  std::size_t metadata_bytes_at_peak = 0;
  std::int64_t final_cached_tokens = 0;
  std::size_t final_metadata_bytes = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;
  double protected_fraction = std::numeric_limits<double>::quiet_NaN();  // as run; NaN: the policy has none
  double ghost_memory = std::numeric_limits<double>::quiet_NaN();
  double hint_next_turn_within_s = std::numeric_limits<double>::quiet_NaN();  // as run; NaN: no hint
  double hint_recall = 1.0;
  double hint_false_rate = 0.0;
  PriorityUpdate hint_update = PriorityUpdate::raise;
  std::uint64_t hinted_requests = 0;  // cached with kNextTurnHintPriority
  // Divergence (with ReplayConfig::divergence): lookups that split off a
  // longer cached path, and the run's branch point with the most splits no
  // later request reached a branch of (depth 0 and no branches: none).
  std::uint64_t diverged_lookups = 0;
  BranchPoint top_branch_point;
  double wall_s = 0;                // the replay loop alone (the median with repeats)
  std::vector<double> wall_s_runs;  // every run's, in run order

  // The tiered path only (all zero otherwise). hit_tokens is split by the
  // tier each cached token was served from (Admission::host_tokens,
  // storage_tokens), and `tiers` holds the Engine's tier counters at the end
  // (copies, storage reads and writes, errors).
  bool tiered = false;
  bool has_kv_bytes = false;  // L1 held real bytes (storage on) and every cached row was checked
  std::uint64_t device_hit_tokens = 0;
  std::uint64_t host_hit_tokens = 0;
  std::uint64_t storage_hit_tokens = 0;
  std::int32_t host_pages = 0;
  TierMetrics tiers;
  // KV events (ReplayConfig::kv_events): their counters, the endpoints as
  // bound, and the pages cached on each tier at the end (what a subscriber
  // that missed nothing holds); the Engine when keep_engine.
  KvEventsMetrics kv_events;
  std::string kv_events_endpoint, kv_events_replay_endpoint;
  std::uint64_t cached_pages_device = 0, cached_pages_host = 0;
  std::shared_ptr<Engine> engine;

  double hit_rate() const;  // all tiers: the sum of the three below on the tiered path
  double device_hit_rate() const;
  double host_hit_rate() const;
  double storage_hit_rate() const;
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

// One replay on a fresh pool and tree (tiered path: a fresh Engine). Fails
// with StatusCode::internal when a page leaked (pool pages in use != cached
// tokens / page size, or pages still in use once the tree is gone), an
// invariant of the tree broke, or (tiered path, with storage) a cached row
// differed from what its prefix wrote. invalid_argument for a bad config,
// including a storage URL the Engine refuses; io_error for a storage
// directory that cannot be created.
Status run_replay(const Workload& workload, const ReplayConfig& config, ReplayResult& out);

// `repeats` replays, each on a fresh pool and tree; wall_s is their median.
// Every count must come out the same in each run (the replay is deterministic).
// With storage, repeats must be 1: a later run would find the pages of the
// earlier ones there.
Status run_replays(const Workload& workload, const ReplayConfig& config, int repeats, ReplayResult& out);

// memcmp of two equal buffers of `buffer_bytes`, best of `passes`, counting
// 2 * buffer_bytes per pass; in GB/s (1e9 bytes).
double measure_memcmp_gbps(std::size_t buffer_bytes = std::size_t{64} << 20, int passes = 5);

}  // namespace clm::replay
