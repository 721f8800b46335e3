// lib/store/snapshot_store_impl.hpp: what the snapshot store's sources
// share (internal to lib/store): SnapshotStore::Impl, the state behind the
// public class (shards, drift windows, breakers, fallbacks, metrics, the
// rebuild thread), and the small helpers its parts use. snapshot_store.cpp
// holds retrieval, records, eviction and the rebuild thread;
// snapshot_store_admin.cpp holds what an administrator does by hand.
//
//   Status SnapshotStore::delete_key(...) try {
//     Impl& im = *impl_;                                      // this header
//     StoreShard& shard = im.shard_for(tenant, key.group);
//     ...
//   } catch (...) { return store_impl::current_exception_status("delete_key"); }
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "clm/detail/half.hpp"
#include "clm/store/consistent_hash.hpp"
#include "clm/store/snapshot_store.hpp"
#include "hnsw_index.hpp"
#include "outcome_breaker.hpp"
#include "store_shard.hpp"

namespace clm {

namespace store_impl {

using store_detail::choice_key;
using store_detail::HnswIndex;
using store_detail::LabelInfo;
using store_detail::SnapshotRow;
using store_detail::StoreShard;
using store_detail::TenantIndex;

// The squared norm of a vector the store accepts (check_snapshot_vector).
inline Status checked_squared_norm(std::span<const float> v, std::int32_t dim, std::string_view what, double& norm) {
  if (v.size() != static_cast<std::size_t>(dim)) {
    return invalid_argument(fmt::format("{}: {} values where the store's snapshot_dim is {}", what, v.size(), dim));
  }
  norm = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return invalid_argument(fmt::format("{}: value {} is not finite", what, i));
    norm += static_cast<double>(v[i]) * v[i];
  }
  if (!(norm > 0) || !std::isfinite(norm))
    return invalid_argument(fmt::format("{}: the vector has no direction", what));
  return {};
}

// A salt names a tenant (the C ABI takes up to 64 KiB), plus what Engine appends (the adapter id).
constexpr std::size_t kMaxTenantBytes = (std::size_t{1} << 16) + 64;
constexpr std::size_t kMaxNameBytes = 256;
constexpr std::size_t kUsageFlushRows = 4096;  // pending usage rows that ask the background thread to write

inline std::int64_t system_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// tenant bytes, NUL, then the fallback's name: one map key per (tenant, name).
inline std::string fallback_key(std::string_view tenant, std::string_view name) {
  std::string k(tenant);
  k.push_back('\0');
  k.append(name);
  return k;
}

// Rows last used before this (Unix seconds) are old enough for evict().
inline std::int64_t eviction_cutoff_s(std::int64_t now_ms, double evict_after_days) {
  return static_cast<std::int64_t>(static_cast<double>(now_ms / 1000) - evict_after_days * 86400.0);
}

// tenant bytes, NUL, then the key's fingerprint: one map key per (tenant, key).
inline std::string tenant_key(std::string_view tenant, std::uint64_t fp) {
  std::string k(tenant);
  k.push_back('\0');
  for (int b = 0; b < 8; ++b) k.push_back(static_cast<char>(fp >> (8 * b)));
  return k;
}

// Copies v normalised to unit length into out; invalid_argument for the wrong
// size, NaN/Inf or a zero vector.
inline Status unit_copy(std::span<const float> v, std::int32_t dim, const char* what, std::vector<float>& out) {
  double norm = 0;
  CLM_RETURN_IF_ERROR(checked_squared_norm(v, dim, what, norm));
  const double inv = 1.0 / std::sqrt(norm);
  out.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i] * inv);
  return {};
}

// As the store keeps it: rounded through f16, so what is indexed and compared
// is exactly what a lookup serves.
inline void round_f16(std::vector<float>& v) {
  for (float& x : v) x = detail::f16_to_f32(detail::f32_to_f16(x));
}

inline float dot(std::span<const float> a, std::span<const float> b) {
  return store_detail::dot_product(a.data(), b.data(), a.size());
}
// A cosine of unit vectors stored in f16 can pass 1 by a rounding error.
inline float clamp_cosine(float c) { return std::clamp(c, -1.0f, 1.0f); }

inline Status check_key(const SuffixKey& key, std::string_view tenant, const char* what) {
  if (key.key.empty()) return invalid_argument(fmt::format("{}: the key is empty", what));
  if (tenant.size() > kMaxTenantBytes) {
    return invalid_argument(fmt::format("{}: tenant of {} bytes (at most {})", what, tenant.size(), kMaxTenantBytes));
  }
  if (key.fingerprint != key_fingerprint(key.key)) {
    return invalid_argument(fmt::format("{}: the key's fingerprint does not match \"{}\"", what, key.key));
  }
  return {};
}

inline Status check_config(const SnapshotStoreConfig& c) {
  auto bad = [](std::string m) { return invalid_argument("snapshot store config: " + std::move(m)); };
  if (c.path.empty()) return bad("path is empty (a directory, or \":memory:\")");
  if (c.read_only && c.path == ":memory:") return bad("read_only needs a store directory, not \":memory:\"");
  if (c.read_only_refresh_ms < 1) return bad("read_only_refresh_ms must be >= 1");
  if (c.maintenance_interval_ms < 0) return bad("maintenance_interval_ms must be >= 0 (0: off)");
  if (c.num_shards < 1 || c.num_shards > 256) return bad(fmt::format("num_shards {} is not in [1, 256]", c.num_shards));
  if (c.snapshot_dim < 1 || c.snapshot_dim > 4096)
    return bad(fmt::format("snapshot_dim {} is not in [1, 4096]", c.snapshot_dim));
  if (c.min_usage_threshold < 1) return bad("min_usage_threshold must be >= 1");
  if (!(c.version_cosine > 0.0f && c.version_cosine <= 1.0f)) return bad("version_cosine must be in (0, 1]");
  if (c.stable_confirmations < 0) return bad("stable_confirmations must be >= 0");
  if (c.drift_window < 2) return bad("drift_window must be >= 2");
  if (!(c.drift_variance > 0.0f) || !std::isfinite(c.drift_variance)) return bad("drift_variance must be > 0");
  if (!(c.drift_mean_cosine > 0.0f && c.drift_mean_cosine <= 1.0f)) return bad("drift_mean_cosine must be in (0, 1]");
  if (c.drift_tracked_keys < 1) return bad("drift_tracked_keys must be >= 1");
  if (c.max_versions_per_key < 1 || c.max_versions_per_key > 1024)
    return bad("max_versions_per_key must be in [1, 1024]");
  if (c.ann_top_k < 1 || c.ann_top_k > 64) return bad("ann_top_k must be in [1, 64]");
  if (!(c.similarity_floor >= -1.0f && c.similarity_floor <= 1.0f)) return bad("similarity_floor must be in [-1, 1]");
  if (c.ann_ef_search < c.ann_top_k || c.ann_ef_search > 100000)
    return bad("ann_ef_search must be in [ann_top_k, 1e5]");
  if (c.ann_m < 2 || c.ann_m > 100) return bad("ann_m must be in [2, 100]");
  if (c.ann_ef_construction < 1 || c.ann_ef_construction > 100000)
    return bad("ann_ef_construction must be in [1, 1e5]");
  if (!(c.evict_after_days >= 0) || !std::isfinite(c.evict_after_days)) return bad("evict_after_days must be >= 0");
  if (c.lookup_timeout_us < 0 || c.write_busy_timeout_ms < 0) return bad("timeouts must be >= 0");
  if (!(c.blacklist_accuracy >= 0 && c.blacklist_accuracy <= 1)) return bad("blacklist_accuracy must be in [0, 1]");
  if (c.blacklist_window_ms < 1 || c.blacklist_duration_ms < 0 || c.blacklist_min_reports < 1 ||
      c.blacklist_min_reports > static_cast<std::int32_t>(store_impl::OutcomeBreaker::kMaxReportsPerWindow)) {
    return bad("blacklist_window_ms >= 1, blacklist_duration_ms >= 0 and blacklist_min_reports in 1..512 are required");
  }
  if (c.blacklist_tracked_pairs < 1 || c.blacklist_tracked_pairs > (1 << 20)) {
    return bad("blacklist_tracked_pairs must be in 1..1048576");
  }
  return {};
}

// The last drift_window snapshots of a key (f16), with running sums for the
// total variance: mean |x|^2 - |mean x|^2.
struct DriftWindow {
  std::vector<std::uint16_t> rows;  // [window][dim]
  std::vector<double> sum;          // [dim]
  double sum_sq = 0;
  std::int32_t count = 0, next = 0;

  void clear() {
    std::fill(sum.begin(), sum.end(), 0.0);
    sum_sq = 0;
    count = next = 0;
  }
  // Adds a row, evicting the oldest when full; returns the variance once full, else -1.
  double push(std::span<const float> v, std::int32_t window) {
    const std::size_t dim = v.size();
    if (rows.empty()) {  // both or neither: a bad_alloc between them would leave `sum` short
      std::vector<std::uint16_t> new_rows(static_cast<std::size_t>(window) * dim, 0);
      std::vector<double> new_sum(dim, 0.0);
      rows.swap(new_rows);
      sum.swap(new_sum);
    }
    std::uint16_t* slot = rows.data() + static_cast<std::size_t>(next) * dim;
    if (count == window) {
      for (std::size_t i = 0; i < dim; ++i) {
        const double old = detail::f16_to_f32(slot[i]);
        sum[i] -= old;
        sum_sq -= old * old;
      }
    } else {
      ++count;
    }
    for (std::size_t i = 0; i < dim; ++i) {
      slot[i] = detail::f32_to_f16(v[i]);
      const double x = detail::f16_to_f32(slot[i]);
      sum[i] += x;
      sum_sq += x * x;
    }
    next = (next + 1) % window;
    if (count < window) return -1;
    double mean_sq = 0;
    for (double s : sum) mean_sq += (s / count) * (s / count);
    return std::max(0.0, sum_sq / count - mean_sq);
  }
  // The cosine between the window's mean and `ref` (a unit vector): 1 while
  // the records scatter around ref, lower once they all lean one way.
  double mean_cosine(std::span<const float> ref) const {
    double dot = 0, norm = 0;
    for (std::size_t i = 0; i < sum.size() && i < ref.size(); ++i) {
      dot += sum[i] * ref[i];
      norm += sum[i] * sum[i];
    }
    return norm > 0 ? dot / std::sqrt(norm) : 1.0;
  }
};

// What a key's drift window says after a record: both -1 until it is full.
struct DriftState {
  double variance = -1;
  double mean_cosine = -1;  // of the window's mean and the version it confirmed
};

// The Status of the exception in flight, for a catch (...) of a public call
// that writes: the header promises Status, never exceptions, and a bad_alloc
// between BEGIN and COMMIT was rolled back by ShardTransaction on its way.
inline Status current_exception_status(const char* what) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return out_of_memory(fmt::format("snapshot store: {}: out of host memory", what));
  } catch (const std::exception& e) {
    return {StatusCode::internal, fmt::format("snapshot store: {}: {}", what, e.what())};
  } catch (...) {
    return {StatusCode::internal, fmt::format("snapshot store: {}: an unknown exception", what)};
  }
}

// The shard of a key: consistent hashing of its group and tenant.
inline std::int32_t route(const ConsistentHashRing& ring, std::string_view tenant, std::uint64_t group) {
  return ring.shard_of(group ^ mix64(key_fingerprint(tenant)));
}

inline store_detail::ShardSettings shard_settings(const SnapshotStoreConfig& config, std::int32_t s,
                                                  std::uint64_t rules) {
  store_detail::ShardSettings settings;
  settings.dir = config.path == ":memory:" ? std::string() : config.path;
  settings.index = s;
  settings.num_shards = config.num_shards;
  settings.dim = config.snapshot_dim;
  settings.hnsw = {config.snapshot_dim, config.ann_m, config.ann_ef_construction};
  settings.write_busy_timeout_ms = config.write_busy_timeout_ms;
  settings.key_rules = rules;
  settings.read_only = config.read_only;
  return settings;
}

// A row record() deleted (a version past max_versions_per_key): out of its
// tenant's index once the transaction committed.
struct IndexRemoval {
  std::string tenant;
  std::int64_t id;
};

struct IndexAdd {
  std::string tenant;
  std::int64_t id;
  LabelInfo info;
  std::vector<float> vector;
};

// The store directory's LOCK file, held (flock) while the store is open.
// First member of Impl, so it is released last, after the databases close.
struct DirectoryLock {
  int fd = -1;
  DirectoryLock() = default;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() {
    if (fd >= 0) ::close(fd);
  }
  Status acquire(const std::string& dir) {
    const std::string path = dir + "/LOCK";
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return {StatusCode::io_error, fmt::format("snapshot store: cannot open {}: {}", path, std::strerror(errno))};
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      return failed_precondition(fmt::format(
          "snapshot store {}: already open (in another process, or another SnapshotStore of this one)", dir));
    }
    return {};
  }
};

}  // namespace store_impl

struct SnapshotStore::Impl {
  store_impl::DirectoryLock dir_lock;
  SnapshotStoreConfig config;
  std::unique_ptr<SuffixKeyer> keyer;
  ConsistentHashRing ring{1};
  std::vector<std::unique_ptr<store_impl::StoreShard>> shards;

  std::mutex drift_mutex;
  std::list<std::string> drift_order;  // most recent first
  std::unordered_map<std::string, std::pair<store_impl::DriftWindow, std::list<std::string>::iterator>> drift;

  std::mutex breaker_mutex;
  std::unordered_map<std::string, std::int64_t> blacklist;  // tenant_key -> until (ms)
  // blacklist.size(), kept under breaker_mutex: a lookup (and each level-2
  // candidate) skips the lock and the key's string when nothing is blacklisted.
  std::atomic<std::size_t> blacklist_size{0};
  std::unique_ptr<store_impl::OutcomeBreaker> breaker;  // outcome windows and pair blocks (open() makes it)

  std::mutex pin_mutex;
  std::unordered_map<std::string, std::int32_t> pins;  // tenant_key -> pinned version
  std::atomic<std::size_t> pins_size{0};               // pins.size(), read without the lock

  std::mutex fallback_mutex;
  std::unordered_map<std::string, std::vector<float>> fallbacks;  // tenant NUL name -> unit vector

  mutable std::mutex metrics_mutex;
  SnapshotStoreMetrics m;

  std::mutex rebuild_mutex;
  std::condition_variable rebuild_cv;
  struct RebuildJob {
    std::int32_t shard;
    std::string tenant;
    bool keep_serving;  // compaction: the old index serves until the new one is in
    bool flush_usage;   // not a rebuild: write the shard's pending usage counts
  };
  std::deque<RebuildJob> rebuild_queue;
  std::int32_t rebuilds_running = 0;
  std::atomic<bool> stopping{false};  // set under rebuild_mutex; read by a build in progress without it
  std::thread rebuild_thread;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // An open() that fails after queueing a rebuild destroys Impl without a
  // SnapshotStore: the thread must not outlive the shards it reads.
  ~Impl() { stop_rebuilds(); }
  void stop_rebuilds();

  std::int64_t now_ms() const { return config.clock_ms ? config.clock_ms() : store_impl::system_clock_ms(); }

  // Counts a lookup's use of row `id` (written by the background thread once
  // kUsageFlushRows wait, never by the lookup); a reader counts nothing.
  // A lookup at at_ms (its one clock reading) served row `id` of shard s.
  void note_usage(store_impl::StoreShard& shard, std::int64_t id, std::int32_t s, std::int64_t at_ms) {
    if (config.read_only) return;
    shard.note_usage(id, at_ms / 1000);
    if (shard.pending_usage() >= store_impl::kUsageFlushRows) queue_usage_flush(s);
  }
  // failed_precondition for a write on a read-only store.
  Status writable(const char* what) const {
    if (!config.read_only) return {};
    return failed_precondition(fmt::format("{}: the snapshot store {} is open read-only", what, config.path));
  }
  // Reads every shard's blacklist, pins and fallbacks into memory (open, and
  // a reader's refresh): the maps are replaced whole, so a lookup sees the
  // old or the new state, never half of one.
  Status load_admin_state();

  std::int32_t shard_of(std::string_view tenant, std::uint64_t group) const {
    return store_impl::route(ring, tenant, group);
  }

  template <class F>
  void count(F&& f) {
    std::lock_guard lock(metrics_mutex);
    f(m);
  }

  bool blacklisted(std::string_view tenant, std::uint64_t fp) {
    if (blacklist_size.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard lock(breaker_mutex);
    const auto it = blacklist.find(store_impl::tenant_key(tenant, fp));
    if (it == blacklist.end()) return false;
    if (it->second < now_ms()) {
      blacklist.erase(it);
      blacklist_size = blacklist.size();
      return false;
    }
    return true;
  }

  // The version an administrator pinned for the key, or 0.
  std::int32_t pinned_version(std::string_view tenant, std::uint64_t fp) {
    if (pins_size.load(std::memory_order_relaxed) == 0) return 0;
    std::lock_guard lock(pin_mutex);
    const auto it = pins.find(store_impl::tenant_key(tenant, fp));
    return it == pins.end() ? 0 : it->second;
  }
  // Drops a key's drift window (tenant_key), or every window of a tenant
  // (its bytes and NUL).
  void forget_drift(const std::string& k) {
    std::lock_guard lock(drift_mutex);
    const auto it = drift.find(k);
    if (it == drift.end()) return;
    drift_order.erase(it->second.second);
    drift.erase(it);
  }
  void forget_drift_of_tenant(const std::string& prefix) {
    std::lock_guard lock(drift_mutex);
    for (auto it = drift.begin(); it != drift.end();) {
      if (it->first.starts_with(prefix)) {
        drift_order.erase(it->second.second);
        it = drift.erase(it);
      } else {
        ++it;
      }
    }
  }
  store_impl::StoreShard& shard_for(std::string_view tenant, std::uint64_t group) {
    return *shards[static_cast<std::size_t>(shard_of(tenant, group))];
  }
  // Takes deleted rows out of a tenant's index of shard s (under its lock);
  // a tenant left with no row loses its index and files.
  void unindex(std::int32_t s, const std::string& tenant, const std::vector<std::int64_t>& ids);

  Status open_indexes(std::int32_t s);
  Status build_index(std::int32_t s, const std::string& tenant, bool keep_serving = false);
  // Asks the background thread to write shard s's pending usage counts
  // (once: a request already queued covers later lookups too).
  void queue_usage_flush(std::int32_t s);
  void queue_rebuild(std::int32_t s, const std::string& tenant, bool keep_serving = false);
  void rebuild_loop();
  void start_background();                     // the background thread, for a reader's refresh or scheduled maintenance
  void run_maintenance();                      // flush, evict (with its vacuum); counted in metrics
  std::atomic<SnapshotStore*> owner{nullptr};  // the public object (maintenance calls its evict and flush)
  mutable std::mutex maintenance_mutex;
  Status maintenance_status;  // the last run's
  bool loaded_admin_state_once = false;
  Status record_in_shard(store_impl::StoreShard& shard, std::string_view tenant, const SuffixKey& key,
                         std::vector<float>& unit, RecordOutcome& outcome, std::vector<store_impl::IndexAdd>& adds,
                         std::vector<store_impl::IndexRemoval>& removals);
  // Adds v to key k's window (emptied first with reset); `version` is the
  // version v confirmed (empty: none).
  store_impl::DriftState drift_push(const std::string& k, std::span<const float> v, bool reset,
                                    std::span<const float> version = {});
  void install_adds(store_impl::StoreShard& shard, std::vector<store_impl::IndexAdd>& adds);
};

}  // namespace clm
