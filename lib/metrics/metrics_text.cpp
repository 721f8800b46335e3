// The Prometheus text of EngineMetrics (clm/metrics/metrics_text.hpp). The families
// here are the list docs/metrics.md documents: change both together.
#include "clm/metrics/metrics_text.hpp"

#include <cmath>
#include <concepts>
#include <iterator>

#include <fmt/format.h>

#include "clm/engine.hpp"

namespace clm {
namespace {

constexpr std::string_view kPrefix = "clm_";

class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(text_), "# HELP {}{} {}\n# TYPE {}{} {}\n", kPrefix, name, help, kPrefix, name,
                   type);
  }
  // `labels` as they go between the braces (label="value", ...), or empty.
  template <class Value>
  void sample(std::string_view name, std::string_view labels, Value value) {
    fmt::format_to(std::back_inserter(text_), "{}{}", kPrefix, name);
    if (!labels.empty()) fmt::format_to(std::back_inserter(text_), "{{{}}}", labels);
    if constexpr (std::integral<Value>) {
      fmt::format_to(std::back_inserter(text_), " {}\n", value);
    } else {
      fmt::format_to(std::back_inserter(text_), " {}\n", number(static_cast<double>(value)));
    }
  }
  template <class Value>
  void counter(std::string_view name, std::string_view help, Value value) {
    family(name, "counter", help);
    sample(name, {}, value);
  }
  template <class Value>
  void gauge(std::string_view name, std::string_view help, Value value) {
    family(name, "gauge", help);
    sample(name, {}, value);
  }
  void histogram(std::string_view name, std::string_view help, const DurationHistogram& h) {
    cumulative_histogram(
        name, help, h.counts, [&](std::size_t i) { return number(h.kBounds[i]); }, h.sum_seconds);
  }
  void histogram(std::string_view name, std::string_view help, const MatchDepthHistogram& h) {
    cumulative_histogram(
        name, help, h.counts, [](std::size_t i) { return fmt::format("{}", MatchDepthHistogram::bound(i)); },
        h.sum_tokens);
  }

  std::string take() { return std::move(text_); }

 private:
  // A histogram's family: counts[i] for the finite bounds (labelled by
  // bound(i)), the last one above them; buckets cumulated as the format wants.
  template <class Counts, class Bound, class Sum>
  void cumulative_histogram(std::string_view name, std::string_view help, const Counts& counts, Bound&& bound,
                            Sum sum) {
    family(name, "histogram", help);
    const std::string bucket = fmt::format("{}_bucket", name);
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
      cumulative += counts[i];
      sample(bucket, fmt::format("le=\"{}\"", bound(i)), cumulative);
    }
    cumulative += counts.back();
    sample(bucket, "le=\"+Inf\"", cumulative);
    sample(fmt::format("{}_sum", name), {}, sum);
    sample(fmt::format("{}_count", name), {}, cumulative);
  }

  // Shortest round-trip decimal; the format's spellings of the non-finite.
  static std::string number(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    return fmt::format("{}", v);
  }

  std::string text_;
};

void prefix_cache(Exposition& out, const EngineMetrics& m) {
  const RadixTreeMetrics& c = m.cache;
  const TierMetrics& t = m.tiers;
  // The device part is counted where the tree matched it (rejected admissions
  // included, as vLLM counts); the host and storage parts once loaded back.
  out.counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", c.tokens_queried);
  out.counter("prefix_cache_hits_total",
              "Prompt tokens found in the cache: matched on the device, or loaded back from the host tier or storage.",
              c.tokens_hit + t.host_hit_tokens + t.storage_hit_tokens);
  out.family("cached_tokens_total", "counter", "Prompt tokens found in the cache, by the tier that held them.");
  out.sample("cached_tokens_total", "source=\"device\"", c.tokens_hit);
  out.sample("cached_tokens_total", "source=\"host\"", t.host_hit_tokens);
  out.sample("cached_tokens_total", "source=\"storage\"", t.storage_hit_tokens);
  out.counter("prefix_cache_lookups_total", "Prefix cache lookups (one per admission).", c.match_calls);
  out.histogram(
      "prefix_match_depth_tokens",
      "Where prefix-cache lookups stopped matching, in tokens from the prompt's start (divergence counting on).",
      c.match_depth);
  out.counter("prefix_diverged_lookups_total",
              "Lookups that split off a longer cached path with a page or more of the prompt left (a branch point).",
              c.diverged_matches);
  out.counter("inserted_tokens_total", "Tokens newly stored in the prefix cache.", c.inserted_tokens);
  out.counter("evicted_tokens_total", "Tokens evicted from the device.", c.evicted_tokens);
  out.counter("evictions_total", "Cached prefixes (tree leaves) evicted from the device.", c.evictions);
  out.histogram("eviction_duration_seconds", "Time of each page allocation that evicted cached prefixes.",
                m.eviction_duration);
  out.gauge("prefix_cache_tokens", "Tokens cached on the device now (evictable + protected).", c.cached_tokens);
  out.gauge("evictable_tokens", "Cached tokens no running sequence uses: evicted first when pages run short.",
            c.evictable_tokens);
  out.gauge("protected_tokens", "Cached tokens locked by running sequences.", c.protected_tokens);
  out.gauge("prefix_cache_nodes", "Nodes of the prefix tree.", c.nodes);
  out.gauge("prefix_cache_namespaces", "Namespaces (cache salt x adapter) in the prefix tree.", c.namespaces);
  out.gauge("prefix_cache_metadata_bytes", "Host memory the prefix tree's bookkeeping takes (no KV).",
            c.metadata_bytes);
  out.family("kv_pool_pages", "gauge", "Pages of the device KV pool, in use or free.");
  out.sample("kv_pool_pages", "state=\"used\"", c.pages_used);
  out.sample("kv_pool_pages", "state=\"free\"", c.pages_free);
}

void sequences(Exposition& out, const EngineMetrics& m) {
  out.counter("sequences_admitted_total", "Sequences admitted.", m.admitted);
  out.counter("sequences_finished_total", "Sequences finished (their tokens cached).", m.finished);
  out.counter("sequences_aborted_total", "Sequences aborted (nothing cached).", m.aborted);
  out.counter("admissions_rejected_total", "Admissions refused for lack of free pages.", m.rejected);
  out.gauge("active_sequences", "Sequences running now.", m.active_sequences);
  out.gauge("pins_active", "Pinned prefixes now (Engine::pin_prefix).", m.pins_active);
  out.gauge("pinned_pages", "Pool pages the pins hold (counted per pin).", m.pinned_pages);
  out.gauge("pin_budget_pages", "Pool pages pins may hold at once.", m.pin_budget_pages);
  out.family("pins_total", "counter", "Pin events: created, refused (over the budget), expired, refreshed (a hit).");
  out.sample("pins_total", "event=\"created\"", m.pins_created);
  out.sample("pins_total", "event=\"refused\"", m.pins_refused);
  out.sample("pins_total", "event=\"expired\"", m.pins_expired);
  out.sample("pins_total", "event=\"refreshed\"", m.pins_refreshed);
  out.gauge("priority_hints_active", "Priorities that expire held now (Engine::hint_prefix).", m.priority_hints_active);
  out.family("priority_hints_total", "counter", "Priority hints: created, replaced (by the same key's next), expired.");
  out.sample("priority_hints_total", "event=\"created\"", m.priority_hints_created);
  out.sample("priority_hints_total", "event=\"replaced\"", m.priority_hints_replaced);
  out.sample("priority_hints_total", "event=\"expired\"", m.priority_hints_expired);
}

void src(Exposition& out, const SrcMetrics& s) {
  out.gauge("src_threshold", "The SRC score threshold in force.", s.threshold);
  out.counter("src_scored_steps_total", "Sequence-steps the SRC head scored.", s.steps);
  out.counter("src_unscored_steps_total", "Sequence-steps with no non-special row to score yet.", s.unscored_steps);
  out.counter("src_reuse_decisions_total", "Sequence-steps whose SRC score passed the threshold.", s.reuse_decisions);
  out.family("src_retrievals_total", "counter", "Snapshot lookups reported to the SRC breaker, by result.");
  out.sample("src_retrievals_total", "result=\"found\"", s.retrievals_found);
  out.sample("src_retrievals_total", "result=\"failed\"", s.retrievals_failed);
  out.counter("src_breaker_trips_total", "Sequences the breaker switched to baseline mode.", s.breaker_trips);
  out.counter("src_injections_total", "Sequence-layers that received a snapshot.", s.injections);
  out.gauge("src_baseline_sequences", "Tracked sequences in baseline mode now.", s.baseline_sequences);
  out.gauge("src_tracked_sequences", "Sequences the SRC tracker follows now.", s.tracked_sequences);
}

void clm_watch(Exposition& out, const ClmWatchMetrics& w) {
  out.counter("snapshot_src_sightings_total",
              "Snapshot lookups the CLM watch recorded with the sequence's SRC score (once per sequence and key).",
              w.sightings);
  out.gauge("snapshot_watched_keys", "Suffix keys the CLM watch counts sightings of.", w.watched_keys);
  out.gauge("snapshot_low_src_keys",
            "Watched keys seen often in the window with a median SRC below the threshold (as of their last sighting).",
            w.low_src_keys);
  out.counter("snapshot_low_src_turns_total", "Times a key turned low-SRC (seen often, median SRC low).",
              w.low_src_turns);
  out.family("snapshot_key_events_total", "counter",
             "What the snapshot store did to keys: blacklisted, unblacklisted, version_created, drift.");
  for (std::size_t k = 0; k < w.store_events.size(); ++k) {
    out.sample("snapshot_key_events_total",
               fmt::format("event=\"{}\"", snapshot_store_event_name(static_cast<SnapshotStoreEvent::Kind>(k))),
               w.store_events[k]);
  }
}

void snapshot_store(Exposition& out, const SnapshotStoreMetrics& s) {
  out.family("snapshot_lookups_total", "counter", "Snapshot lookups, by the level that answered (miss: none).");
  out.sample("snapshot_lookups_total", "level=\"exact\"", s.hits_exact);
  out.sample("snapshot_lookups_total", "level=\"ann\"", s.hits_ann);
  out.sample("snapshot_lookups_total", "level=\"fallback\"", s.hits_fallback);
  out.sample("snapshot_lookups_total", "level=\"miss\"", s.misses);
  out.counter("snapshot_busy_misses_total", "Lookups answered miss because a shard stayed busy.", s.busy_misses);
  out.counter("snapshot_blacklisted_skips_total", "Lookups or level-2 candidates refused for a blacklisted key.",
              s.blacklisted_skips);
  out.counter("snapshot_blocked_pair_skips_total",
              "Level-2 candidates and fallbacks refused to one query key (the pair's accuracy fell).",
              s.blocked_pair_skips);
  out.counter("snapshot_ann_unavailable_total", "Level-2 lookups while the similarity index was rebuilt.",
              s.ann_unavailable);
  out.counter("snapshot_records_total", "Snapshots recorded.", s.records);
  out.counter("snapshot_counted_records_total", "Records only counted: below the admission threshold.", s.counted);
  out.counter("snapshot_abstained_records_total", "Records neither stored nor counted: the key abstained.",
              s.abstained);
  out.counter("snapshot_admissions_total", "Suffixes stored for the first time.", s.admissions);
  out.counter("snapshot_confirmations_total", "Records that agreed with the newest version.", s.confirmations);
  out.counter("snapshot_versions_total", "New versions of stored suffixes (cosine or drift).", s.versions);
  out.counter("snapshot_drift_versions_total", "New versions started by drift.", s.drift_versions);
  out.counter("snapshot_versions_dropped_total", "Oldest versions deleted: a key past its version cap.",
              s.versions_dropped);
  out.counter("snapshot_evictions_total", "Snapshot rows deleted by eviction.", s.evictions);
  out.counter("snapshot_corrupt_skipped_total", "Snapshot rows skipped: checksum or header failed.", s.corrupt_skipped);
  out.counter("snapshot_index_rebuilds_total", "Similarity indexes rebuilt from the database.", s.index_rebuilds);
  out.counter("snapshot_outcome_reports_total", "Outcomes reported for served snapshots.", s.outcome_reports);
  out.gauge("stored_snapshots", "Snapshot rows stored now.", s.snapshots);
  out.gauge("blacklisted_keys", "Suffix keys blacklisted now.", s.blacklisted_keys);
  out.gauge("blocked_snapshot_pairs", "(query key, served key) pairs refused now.", s.blocked_pairs);
}

void tiers(Exposition& out, const EngineMetrics& m) {
  const RadixTreeMetrics& c = m.cache;
  const TierMetrics& t = m.tiers;
  out.family("host_tier_pages", "gauge", "Pages of the host tier, in use or free.");
  out.sample("host_tier_pages", "state=\"used\"", c.host_pages_used);
  out.sample("host_tier_pages", "state=\"free\"", c.host_pages_free);
  out.gauge("host_tier_cached_tokens", "Cached tokens with a host copy now.", c.host_cached_tokens);
  out.counter("host_tier_matched_tokens_total", "Tokens matched past the device part, on the host only.",
              c.host_tokens_hit);
  out.counter("host_tier_evicted_tokens_total", "Host copies dropped for room, in tokens.", c.host_evicted_tokens);
  out.counter("host_tier_backed_up_tokens_total", "Tokens given a host copy.", c.backed_up_tokens);
  out.counter("host_tier_backed_up_pages_total", "Pages copied device -> host.", t.backed_up_pages);
  out.counter("host_tier_load_backs_total", "Admissions that copied host pages to the device.", t.load_backs);
  out.counter("host_tier_loaded_pages_total", "Pages copied host -> device.", t.loaded_pages);
  out.counter("host_tier_dropped_backups_total", "Host copies given up: no room on the host, or a failed copy.",
              t.dropped_backups);
  out.counter("tier_worker_failures_total", "Tier jobs given up for want of host memory.", t.worker_failures);
  out.counter("storage_stored_pages_total", "Pages written to storage.", t.stored_pages);
  out.counter("storage_fetched_pages_total", "Pages read from storage into the host tier.", t.fetched_pages);
  out.counter("storage_prefetch_timeouts_total", "Admissions that stopped waiting for storage.", t.prefetch_timeouts);
  out.counter("storage_errors_total", "Storage calls that failed (the admission recomputed).", t.storage_errors);
  out.counter("storage_dropped_fetches_total", "Fetches dropped for the queue's cap (prefetches first).",
              t.dropped_fetches);
  out.counter("storage_merged_fetches_total", "Fetches that joined one queued or running for the same prefix.",
              t.merged_fetches);
  out.gauge("storage_queued_fetches", "Fetches waiting for a storage worker.", t.queued_fetches);
  out.counter("storage_breaker_trips_total", "Times the storage breaker opened.", t.breaker_trips);
  out.counter("storage_breaker_skips_total", "Storage jobs skipped and fetches not queued while it was open.",
              t.breaker_skips);
  out.gauge("storage_breaker_state", "The storage breaker: 0 closed, 1 open (storage not asked), 2 half-open.",
            t.breaker_state);
  const StorageStats& s = t.storage;
  out.counter("storage_backend_read_pages_total", "Pages the storage backend returned.", s.pages_read);
  out.counter("storage_backend_written_pages_total", "Pages the storage backend stored.", s.pages_written);
  out.counter("storage_backend_checked_pages_total", "Keys the storage backend was asked whether it holds.",
              s.pages_checked);
  out.counter("storage_backend_missing_pages_total", "Keys the storage backend did not find.", s.pages_missing);
  out.counter("storage_backend_corrupt_pages_total",
              "Stored values refused: magic, key, layout, size, checksum, model or signature.", s.corrupt_pages);
  out.counter("storage_backend_foreign_model_pages_total", "Stored values refused: written for another model.",
              s.foreign_model_pages);
  out.counter("storage_backend_unsigned_pages_total", "Stored values refused: not signed, where pages must be.",
              s.unsigned_pages);
  out.counter("storage_backend_forged_pages_total",
              "Stored values refused: a signature this instance's secret does not make.", s.forged_pages);
  out.counter("storage_backend_repaired_pages_total", "Refused stored values the backend deleted.", s.repaired_pages);
  out.counter("storage_backend_dropped_writes_total", "Pages the storage backend could not store (full disk, ...).",
              s.dropped_writes);
  out.counter("storage_backend_evicted_pages_total", "Pages the storage backend removed for its size cap.",
              s.evicted_pages);
  out.counter("storage_backend_errors_total", "Storage backend calls that failed (connection, I/O).", s.errors);
  out.counter("storage_backend_read_bytes_total", "Bytes read from storage.", s.bytes_read);
  out.counter("storage_backend_written_bytes_total", "Bytes written to storage.", s.bytes_written);
}

void kv_events(Exposition& out, const KvEventsMetrics& k) {
  out.counter("kv_events_recorded_total", "KV events the cache's changes made.", k.recorded_events);
  out.counter("kv_events_published_total", "KV events sent in a batch.", k.published_events);
  out.counter("kv_event_batches_published_total", "KV event batches sent.", k.published_batches);
  out.counter("kv_events_dropped_total", "KV events dropped for a full queue (a resync follows).", k.dropped_events);
  out.counter("kv_event_resyncs_total", "Resyncs sent: AllBlocksCleared, then every cached page.", k.resyncs);
  out.counter("kv_event_replay_requests_total", "Replay requests served.", k.replay_requests);
  out.counter("kv_event_replay_refused_total", "Malformed replay requests.", k.replay_refused);
  out.counter("kv_event_send_failures_total", "KV event messages ZeroMQ would not take.", k.send_failures);
  out.gauge("kv_events_queued", "KV events recorded and not yet sent.", k.queued_events);
}

}  // namespace

std::string format_metrics_text(const EngineMetrics& m) {
  Exposition out;
  out.family("component_enabled", "gauge", "1 for each part this engine was created with.");
  out.sample("component_enabled", "component=\"snapshot_store\"", m.has_snapshot_store ? 1 : 0);
  out.sample("component_enabled", "component=\"host_tier\"", m.has_tiers ? 1 : 0);
  out.sample("component_enabled", "component=\"storage_tier\"", m.tiers.has_storage ? 1 : 0);
  out.sample("component_enabled", "component=\"kv_events\"", m.kv_events.enabled ? 1 : 0);
  prefix_cache(out, m);
  sequences(out, m);
  src(out, m.src);
  snapshot_store(out, m.store);
  clm_watch(out, m.clm_watch);
  tiers(out, m);
  kv_events(out, m.kv_events);
  return out.take();
}

}  // namespace clm
