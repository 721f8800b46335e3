// clm/engine/engine_metrics.hpp: EngineMetrics, one consistent reading of an
// Engine's counters: the prefix cache's, the request lifecycle's, the
// eviction times, the SRC head's, and the snapshot store's and tiers' when
// the Engine has them. Engine::metrics() takes it; metrics_text.hpp turns it
// into Prometheus text:
//
//   const clm::EngineMetrics m = engine->metrics();
//   double hit_rate = m.cache.hit_rate();
//   std::string page = engine->metrics_text();  // the same, for /metrics
#pragma once

#include <cstdint>

#include "clm/cache/radix_tree_types.hpp"
#include "clm/engine/clm_watch.hpp"
#include "clm/events/kv_events_config.hpp"
#include "clm/metrics/metrics_text.hpp"
#include "clm/model/src_tracker.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/tiers/tier_config.hpp"

namespace clm {

struct EngineMetrics {
  RadixTreeMetrics cache;
  std::uint64_t admitted = 0;
  std::uint64_t finished = 0;
  std::uint64_t aborted = 0;
  std::uint64_t rejected = 0;  // admissions refused for lack of pages
  std::int64_t active_sequences = 0;
  // Pinned prefixes (Engine::pin_prefix).
  std::int64_t pins_active = 0;
  std::int64_t pinned_pages = 0;  // counted per pin (pins that share pages count them each)
  std::int64_t pin_budget_pages = 0;
  std::uint64_t pins_created = 0, pins_refused = 0, pins_expired = 0, pins_refreshed = 0;
  // Priorities that expire (Engine::hint_prefix).
  std::int64_t priority_hints_active = 0;
  std::uint64_t priority_hints_created = 0, priority_hints_replaced = 0, priority_hints_expired = 0;
  // How long the allocations that evicted cached prefixes took, each timed whole.
  DurationHistogram eviction_duration;
  SrcMetrics src;  // the SRC head's steps, the threshold and the breaker
  bool has_snapshot_store = false;
  SnapshotStoreMetrics store;  // all zero without a store
  ClmWatchMetrics clm_watch;   // the CLM watch's counts (engine/clm_watch.hpp)
  bool has_tiers = false;
  TierMetrics tiers;          // all zero without tiers
  KvEventsMetrics kv_events;  // all zero (enabled false) without KV events
};

}  // namespace clm
