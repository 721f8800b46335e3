// clm/tiers/tier_config.hpp: how an Engine's tiered KV cache is set up
// (EngineConfig::tiers), and what it counts (EngineMetrics::tiers).
//
//   clm::EngineConfig config;                       // L1: config.pool, as always
//   config.tiers.host_pages = 4 * config.pool.num_pages;   // L2: host memory
//   config.tiers.write_policy = clm::WritePolicy::write_through_selective;
//   config.tiers.storage_url = "redis://127.0.0.1:6379/0?prefix=clm:&ttl=3600";  // L3
//   config.model_id = "llama-3-8b@sha256:9f2c...";  // required with L3: pages are this model's
//   config.tiers.page_secret_file = "/etc/clm/page.key";  // optional: pages signed (AES-256-GMAC)
//   config.tiers.prefetch_policy = clm::PrefetchPolicy::timeout;
//
// L1 is the Engine's pool; L2 a host-memory pool of host_pages pages of the
// same layout (pinned when L1 is on a GPU); L3 a storage backend
// (storage_backend.hpp) shared by every instance pointed at it. See
// docs/tiers.md for the policies and what happens on failures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "clm/tiers/storage_backend.hpp"

namespace clm {

// When a cached page gets its host (L2) copy. Host copies go on to storage
// (L3), when there is one, once they are complete.
enum class WritePolicy : std::uint8_t {
  write_through = 0,            // on a prefix's first hit (default)
  write_through_selective = 1,  // once it has been hit twice (in one stay on the device)
  write_back = 2,               // only when the device evicts it
};

// How long admit() waits for pages it found in storage.
enum class PrefetchPolicy : std::uint8_t {
  best_effort = 0,    // not at all: what has arrived is used, the rest lands for later requests
  wait_complete = 1,  // until every page found is in
  timeout = 2,        // up to prefetch_timeout_ms + prefetch_timeout_per_1k_tokens_ms per 1000 tokens fetched
};

// The policies' command-line names ("write_through", "best_effort", ...),
// and back (nullopt for a name that is none of them).
inline const char* write_policy_name(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::write_through:
      return "write_through";
    case WritePolicy::write_through_selective:
      return "write_through_selective";
    case WritePolicy::write_back:
      return "write_back";
  }
  return "unknown";
}
inline std::optional<WritePolicy> parse_write_policy(std::string_view name) {
  for (WritePolicy p : {WritePolicy::write_through, WritePolicy::write_through_selective, WritePolicy::write_back}) {
    if (name == write_policy_name(p)) return p;
  }
  return std::nullopt;
}
inline const char* prefetch_policy_name(PrefetchPolicy policy) {
  switch (policy) {
    case PrefetchPolicy::best_effort:
      return "best_effort";
    case PrefetchPolicy::wait_complete:
      return "wait_complete";
    case PrefetchPolicy::timeout:
      return "timeout";
  }
  return "unknown";
}
inline std::optional<PrefetchPolicy> parse_prefetch_policy(std::string_view name) {
  for (PrefetchPolicy p : {PrefetchPolicy::best_effort, PrefetchPolicy::wait_complete, PrefetchPolicy::timeout}) {
    if (name == prefetch_policy_name(p)) return p;
  }
  return std::nullopt;
}

struct TierConfig {
  std::int32_t host_pages = 0;  // L2 size in pages; 0: no tiers
  WritePolicy write_policy = WritePolicy::write_through;
  std::string storage_url;  // L3 (file://... or redis://...); empty: none. Needs L2.
  PrefetchPolicy prefetch_policy = PrefetchPolicy::timeout;
  double prefetch_timeout_ms = 20.0;
  double prefetch_timeout_per_1k_tokens_ms = 10.0;
  std::int32_t storage_workers = 2;       // threads that talk to storage
  std::int32_t storage_batch_pages = 32;  // pages per get/set call
  // The deployment secret that signs every stored page (page_seal.hpp): a
  // file (that everyone may not read) or the name of an environment
  // variable, at most one; neither: pages are not signed, and signed ones are
  // refused. Never a URL option, never printed.
  std::string page_secret_file;
  std::string page_secret_env;
  // Bounded work (docs/tiers.md). At most max_queued_fetches fetches wait for
  // a storage worker: past that the oldest one no admission waits for (a
  // prefetch) is dropped, or the new one. An admission waits for storage at
  // most admission_deadline_ms, whatever the prefetch policy. After
  // breaker_failures failed storage calls in a row storage is not asked for
  // breaker_open_ms, then one call probes it (storage_breaker.hpp).
  std::int32_t max_queued_fetches = 64;
  std::int32_t breaker_failures = 3;
  double admission_deadline_ms = 2000.0;
  double breaker_open_ms = 5000.0;
};

struct TierMetrics {
  // Cached tokens admissions used, by where they were found.
  std::uint64_t device_hit_tokens = 0;
  std::uint64_t host_hit_tokens = 0;
  std::uint64_t storage_hit_tokens = 0;
  std::uint64_t load_backs = 0;         // admissions that copied host pages to the device
  std::uint64_t loaded_pages = 0;       // pages copied host -> device
  std::uint64_t backed_up_pages = 0;    // pages copied device -> host (write policies)
  std::uint64_t stored_pages = 0;       // pages written to storage
  std::uint64_t fetched_pages = 0;      // pages read from storage into the host tier
  std::uint64_t prefetch_timeouts = 0;  // admissions that stopped waiting for storage
  std::uint64_t storage_errors = 0;     // storage calls that failed (the admission recomputed)
  std::uint64_t dropped_backups = 0;    // copies given up: no room on the host, or a failed copy
  std::uint64_t worker_failures = 0;    // tier jobs given up for want of host memory (std::bad_alloc)
  std::uint64_t dropped_fetches = 0;    // fetches dropped for the queue's cap (prefetches first)
  std::uint64_t merged_fetches = 0;     // fetches that joined one in flight or queued for the same prefix
  std::uint64_t breaker_trips = 0;      // times the storage breaker opened
  std::uint64_t breaker_skips = 0;      // storage jobs not run, fetches not queued, while it was open
  std::int64_t queued_fetches = 0;      // fetches waiting for a storage worker now
  std::int32_t breaker_state = 0;       // StorageBreaker::State: 0 closed, 1 open, 2 half-open
  bool signed_pages = false;            // stored pages are signed with a deployment secret
  std::int64_t host_pages_used = 0;
  std::int64_t host_pages_total = 0;
  bool has_storage = false;
  StorageStats storage;  // the backend's own counts
};

}  // namespace clm
