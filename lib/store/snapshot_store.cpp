// lib/store/snapshot_store.cpp: the snapshot store's policy
// (clm/store/snapshot_store.hpp): routing to shards, the three retrieval
// levels, admission, versions and drift, the breakers, eviction, and the
// background index rebuild. Storage itself is StoreShard's (store_shard.cpp);
// the state they share is SnapshotStore::Impl (snapshot_store_impl.hpp);
// administration by hand is snapshot_store_admin.cpp.
#include "clm/store/snapshot_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "snapshot_store_impl.hpp"

namespace clm {

using store_detail::kStoreFormat;
using namespace store_impl;  // NOLINT(google-build-using-namespace): the store's own helpers

Status check_snapshot_vector(std::span<const float> v, std::int32_t dim, std::string_view what) {
  double norm = 0;
  return checked_squared_norm(v, dim, what, norm);
}

const char* snapshot_level_name(SnapshotLevel level) {
  switch (level) {
    case SnapshotLevel::miss:
      return "miss";
    case SnapshotLevel::exact:
      return "exact";
    case SnapshotLevel::ann:
      return "ann";
    case SnapshotLevel::fallback:
      return "fallback";
  }
  return "unknown";
}

const char* record_result_name(RecordResult result) {
  switch (result) {
    case RecordResult::counted:
      return "counted";
    case RecordResult::admitted:
      return "admitted";
    case RecordResult::confirmed:
      return "confirmed";
    case RecordResult::new_version:
      return "new_version";
    case RecordResult::drifted:
      return "drifted";
    case RecordResult::not_written:
      return "not_written";
    case RecordResult::abstained:
      return "abstained";
  }
  return "unknown";
}

void SnapshotStore::Impl::stop_rebuilds() {
  {
    std::lock_guard lock(rebuild_mutex);
    stopping = true;
  }
  rebuild_cv.notify_all();
  if (rebuild_thread.joinable()) rebuild_thread.join();
}

SnapshotStore::SnapshotStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->owner = this; }

SnapshotStore::~SnapshotStore() {
  impl_->stop_rebuilds();  // before the flush, so that no rebuild changes an index while it is saved
  // A destructor cannot report: what failed to save is rebuilt at the next open.
  if (!impl_->config.read_only) (void)flush();
}

const SnapshotStoreConfig& SnapshotStore::config() const { return impl_->config; }
const SuffixKeyer& SnapshotStore::keyer() const { return *impl_->keyer; }

std::int32_t SnapshotStore::shard_of(std::string_view tenant, const SuffixKey& key) const {
  return impl_->shard_of(tenant, key.group);
}

Status SnapshotStore::open(const SnapshotStoreConfig& config, std::unique_ptr<SnapshotStore>& out) {
  CLM_RETURN_IF_ERROR(check_config(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->ring = ConsistentHashRing(config.num_shards);
  impl->breaker = std::make_unique<store_impl::OutcomeBreaker>(
      store_impl::BreakerSettings{config.blacklist_accuracy, config.blacklist_window_ms, config.blacklist_min_reports,
                                  config.blacklist_duration_ms, config.blacklist_tracked_pairs});
  CLM_RETURN_IF_ERROR(SuffixKeyer::create(config.keyer, impl->keyer));
  const bool memory = config.path == ":memory:";
  if (config.read_only) {
    std::error_code ec;
    if (!std::filesystem::is_directory(config.path, ec)) {
      return not_found(fmt::format("snapshot store {}: no store to open read-only", config.path));
    }
  } else if (!memory) {
    std::error_code ec;
    std::filesystem::create_directories(config.path, ec);
    if (ec) {
      return {StatusCode::io_error, fmt::format("snapshot store: cannot create {}: {}", config.path, ec.message())};
    }
    CLM_RETURN_IF_ERROR(impl->dir_lock.acquire(config.path));
  }
  // Every shard is checked before any is written to: a store refused here
  // (another shape, format or key rules) is left exactly as it was.
  for (std::int32_t s = 0; s < config.num_shards; ++s) {
    std::unique_ptr<StoreShard> shard;
    CLM_RETURN_IF_ERROR(StoreShard::open(shard_settings(config, s, impl->keyer->rules_fingerprint()), shard));
    CLM_RETURN_IF_ERROR(shard->check_shape());
    impl->shards.push_back(std::move(shard));
  }
  // What to run about it: an old format first, then an unfinished rekey (its
  // shards' rules differ from each other), then other rules.
  for (const auto& shard : impl->shards) {
    if (!shard->fresh() && shard->format() == 1) CLM_RETURN_IF_ERROR(shard->check_serving());
  }
  for (const auto& shard : impl->shards) {
    if (shard->meta_value("rekey_to")) CLM_RETURN_IF_ERROR(shard->check_serving());
  }
  for (const auto& shard : impl->shards) CLM_RETURN_IF_ERROR(shard->check_serving());
  for (auto& shard : impl->shards) CLM_RETURN_IF_ERROR(shard->start(true));
  Impl& im = *impl;
  CLM_RETURN_IF_ERROR(im.load_admin_state());
  for (auto& shard : im.shards) {
    std::lock_guard lock(shard->mutex);
    std::int64_t rows = 0;
    CLM_RETURN_IF_ERROR(shard->count_rows(rows));
    im.m.snapshots += rows;
  }
  for (std::int32_t s = 0; s < config.num_shards; ++s) CLM_RETURN_IF_ERROR(im.open_indexes(s));
  const bool background = config.read_only || config.maintenance_interval_ms > 0;
  out.reset(new SnapshotStore(std::move(impl)));
  // A reader's refresh of the blacklist, pins and fallbacks; a writer's maintenance.
  if (background) out->impl_->start_background();
  return {};
}

void SnapshotStore::Impl::run_maintenance() {
  SnapshotStore* store = owner.load();
  if (store == nullptr) return;
  EvictionReport report;
  Status s = store->evict(report);
  if (s.ok()) s = store->flush();
  count([&](SnapshotStoreMetrics& x) {
    ++x.maintenance_runs;
    x.maintenance_failures += s.ok() ? 0 : 1;
  });
  std::lock_guard lock(maintenance_mutex);
  maintenance_status = std::move(s);
}

Status SnapshotStore::last_maintenance() const {
  std::lock_guard lock(impl_->maintenance_mutex);
  return impl_->maintenance_status;
}

Status SnapshotStore::Impl::load_admin_state() {
  const std::int64_t now = now_ms();
  std::unordered_map<std::string, std::int64_t> new_blacklist;
  std::unordered_map<std::string, std::int32_t> new_pins;
  std::unordered_map<std::string, std::vector<float>> new_fallbacks;
  std::uint64_t corrupt = 0;
  for (auto& shard : shards) {
    std::lock_guard lock(shard->mutex);
    CLM_RETURN_IF_ERROR(shard->load_blacklist([&](std::string_view tenant, std::uint64_t fp, std::int64_t until) {
      if (until >= now) new_blacklist[tenant_key(tenant, fp)] = until;
    }));
    CLM_RETURN_IF_ERROR(shard->load_pins([&](std::string_view tenant, std::uint64_t fp, std::int32_t version) {
      new_pins[tenant_key(tenant, fp)] = version;
    }));
    CLM_RETURN_IF_ERROR(
        shard->load_fallbacks([&](std::string_view tenant, std::string_view name,
                                  std::vector<float>& v) { new_fallbacks[fallback_key(tenant, name)] = v; },
                              corrupt));
  }
  {
    std::lock_guard lock(breaker_mutex);
    blacklist = std::move(new_blacklist);
    blacklist_size = blacklist.size();
  }
  {
    std::lock_guard lock(pin_mutex);
    pins = std::move(new_pins);
    pins_size = pins.size();
  }
  {
    std::lock_guard lock(fallback_mutex);
    fallbacks = std::move(new_fallbacks);
  }
  if (!loaded_admin_state_once) {  // counted once: a reader's refresh reads the same rows again
    loaded_admin_state_once = true;
    count([&](SnapshotStoreMetrics& x) { x.corrupt_skipped += corrupt; });
  }
  return {};
}

// Loads each tenant's index of shard s and adds the rows committed after it
// was saved; an index that cannot be loaded is rebuilt.
Status SnapshotStore::Impl::open_indexes(std::int32_t s) {
  StoreShard& shard = *shards[static_cast<std::size_t>(s)];
  std::vector<std::string> tenants;
  {
    std::lock_guard lock(shard.mutex);
    CLM_RETURN_IF_ERROR(shard.tenants(tenants));
  }
  for (const std::string& tenant : tenants) {
    std::unique_ptr<HnswIndex> index;
    const bool loaded =
        !shard.settings().dir.empty() && HnswIndex::load(shard.index_path(tenant), shard.settings().hnsw, index).ok();
    if (!loaded) {
      count([](SnapshotStoreMetrics& x) { ++x.index_rebuilds; });
      if (config.rebuild_in_background) {
        std::lock_guard lock(shard.mutex);
        shard.tenant_index(tenant).rebuilding = true;
        queue_rebuild(s, tenant);
      } else {
        CLM_RETURN_IF_ERROR(build_index(s, tenant));
      }
      continue;
    }
    std::lock_guard lock(shard.mutex);
    TenantIndex& t = shard.tenant_index(tenant);
    const std::int64_t indexed = index->max_label();
    // Rows the file holds need only their labels (a row corrupted since is
    // caught when a lookup reads it); rows after it are read whole and added.
    CLM_RETURN_IF_ERROR(shard.tenant_labels(tenant, -1, [&](std::int64_t id, const LabelInfo& info) {
      if (id <= indexed) t.labels[id] = info;
    }));
    Status added;
    CLM_RETURN_IF_ERROR(
        shard.tenant_rows(tenant, indexed, [&](std::int64_t id, const LabelInfo& info, std::vector<float>& v) {
          if (v.empty() || !added.ok()) return;  // a corrupt row is never indexed, never served
          t.labels[id] = info;
          added = index->add(v, id);
          t.dirty = true;
        }));
    CLM_RETURN_IF_ERROR(added);
    t.index = std::move(index);
  }
  return {};
}

// Builds tenant's index of shard s from its database: rows are read under the
// shard lock, the graph is built outside it, and rows committed meanwhile are
// added under the lock before the index goes live.
Status SnapshotStore::Impl::build_index(std::int32_t s, const std::string& tenant, bool keep_serving) {
  StoreShard& shard = *shards[static_cast<std::size_t>(s)];
  std::vector<std::pair<std::int64_t, std::vector<float>>> rows;
  std::unordered_map<std::int64_t, LabelInfo> labels;
  std::int64_t last = -1;
  {
    std::lock_guard lock(shard.mutex);
    shard.set_write_deadline();
    if (!keep_serving) shard.tenant_index(tenant).rebuilding = true;
    CLM_RETURN_IF_ERROR(
        shard.tenant_rows(tenant, -1, [&](std::int64_t id, const LabelInfo& info, std::vector<float>& v) {
          last = id;
          if (v.empty()) return;
          labels[id] = info;
          rows.emplace_back(id, std::move(v));
          v.clear();
        }));
  }
  std::unique_ptr<HnswIndex> index;
  CLM_RETURN_IF_ERROR(HnswIndex::create(shard.settings().hnsw, index));
  for (const auto& [id, v] : rows) {
    if (stopping) return failed_precondition("snapshot store: closing");
    CLM_RETURN_IF_ERROR(index->add(v, id));
  }
  rows.clear();
  std::unique_lock lock(shard.mutex);
  shard.set_write_deadline();
  TenantIndex& t = shard.tenant_index(tenant);
  Status added;
  CLM_RETURN_IF_ERROR(
      shard.tenant_rows(tenant, last, [&](std::int64_t id, const LabelInfo& info, std::vector<float>& v) {
        if (v.empty() || !added.ok()) return;
        labels[id] = info;
        added = index->add(v, id);
      }));
  CLM_RETURN_IF_ERROR(added);
  t.labels = std::move(labels);
  t.index = std::move(index);
  t.rebuilding = false;
  t.dirty = !config.read_only;  // a reader keeps its rebuilt index in memory
  std::vector<HnswIndex::PendingSave> saves;
  CLM_RETURN_IF_ERROR(shard.begin_index_saves(true, saves));
  lock.unlock();
  return shard.finish_saves(saves);
}

void SnapshotStore::Impl::queue_usage_flush(std::int32_t s) {
  std::lock_guard lock(rebuild_mutex);
  if (stopping) return;
  const bool queued = std::any_of(rebuild_queue.begin(), rebuild_queue.end(),
                                  [&](const RebuildJob& j) { return j.flush_usage && j.shard == s; });
  if (queued) return;
  rebuild_queue.push_back({s, std::string(), false, true});
  if (!rebuild_thread.joinable()) rebuild_thread = std::thread([this] { rebuild_loop(); });
  rebuild_cv.notify_all();
}

void SnapshotStore::Impl::queue_rebuild(std::int32_t s, const std::string& tenant, bool keep_serving) {
  std::lock_guard lock(rebuild_mutex);
  rebuild_queue.push_back({s, tenant, keep_serving, false});
  if (!rebuild_thread.joinable()) rebuild_thread = std::thread([this] { rebuild_loop(); });
  rebuild_cv.notify_all();
}

void SnapshotStore::Impl::start_background() {
  std::lock_guard lock(rebuild_mutex);
  if (!rebuild_thread.joinable()) rebuild_thread = std::thread([this] { rebuild_loop(); });
}

// The background thread: queued rebuilds and usage flushes, and on a timer a
// reader's refresh and a writer's scheduled maintenance.
void SnapshotStore::Impl::rebuild_loop() {
  using Clock = std::chrono::steady_clock;
  const std::int64_t period_ms = config.read_only ? config.read_only_refresh_ms : config.maintenance_interval_ms;
  Clock::time_point next_tick = Clock::now() + std::chrono::milliseconds(period_ms);
  std::unique_lock lock(rebuild_mutex);
  while (true) {
    auto ready = [&] { return stopping || !rebuild_queue.empty(); };
    if (period_ms > 0) {
      rebuild_cv.wait_until(lock, next_tick, ready);
    } else {
      rebuild_cv.wait(lock, ready);
    }
    if (stopping) return;
    if (period_ms > 0 && Clock::now() >= next_tick) {
      ++rebuilds_running;
      lock.unlock();
      if (config.read_only) {
        (void)load_admin_state();  // a busy or failing database keeps the state it had; tried again next tick
      } else {
        run_maintenance();
      }
      next_tick = Clock::now() + std::chrono::milliseconds(period_ms);
      lock.lock();
      --rebuilds_running;
      rebuild_cv.notify_all();
      continue;
    }
    if (rebuild_queue.empty()) continue;
    const RebuildJob job = rebuild_queue.front();
    rebuild_queue.pop_front();
    ++rebuilds_running;
    lock.unlock();
    const std::int32_t s = job.shard;
    if (job.flush_usage) {
      StoreShard& shard = *shards[static_cast<std::size_t>(s)];
      std::lock_guard usage_lock(shard.writer_mutex);
      StoreShard::UsageBatch batch;
      {
        std::lock_guard shard_lock(shard.mutex);
        batch = shard.take_pending_usage();
      }
      // Written without the shard's lock: the lookups go on meanwhile.
      const Status written = shard.write_usage_aside(batch);
      if (!written.ok()) {
        std::lock_guard shard_lock(shard.mutex);
        shard.return_pending_usage(batch);   // kept for the next write or flush
        if (shard.settings().dir.empty()) {  // in memory: one connection, written under the lock
          shard.set_write_deadline();
          (void)shard.flush_usage();
        }
      }
      lock.lock();
      --rebuilds_running;
      rebuild_cv.notify_all();
      continue;
    }
    const std::string& tenant = job.tenant;
    const Status built = build_index(s, tenant, job.keep_serving);
    if (!built.ok() && !stopping && !job.keep_serving) {
      // Leave level 2 off for this tenant and shard (exact lookups still serve);
      // the next open tries again.
      StoreShard& shard = *shards[static_cast<std::size_t>(s)];
      std::lock_guard shard_lock(shard.mutex);
      shard.tenant_index(tenant).rebuilding = true;
    }
    lock.lock();
    --rebuilds_running;
    rebuild_cv.notify_all();
  }
}

void SnapshotStore::wait_for_rebuilds() {
  std::unique_lock lock(impl_->rebuild_mutex);
  impl_->rebuild_cv.wait(lock, [&] { return impl_->rebuild_queue.empty() && impl_->rebuilds_running == 0; });
}

Status SnapshotStore::rebuild_indexes() try {
  CLM_RETURN_IF_ERROR(impl_->writable("rebuild_indexes"));
  wait_for_rebuilds();
  for (std::int32_t s = 0; s < impl_->config.num_shards; ++s) {
    StoreShard& shard = *impl_->shards[static_cast<std::size_t>(s)];
    std::vector<std::string> tenants;
    {
      std::lock_guard lock(shard.mutex);
      CLM_RETURN_IF_ERROR(shard.tenants(tenants));
    }
    for (const std::string& tenant : tenants) {
      CLM_RETURN_IF_ERROR(impl_->build_index(s, tenant));
      impl_->count([](SnapshotStoreMetrics& x) { ++x.index_rebuilds; });
    }
  }
  return {};
} catch (...) {
  return current_exception_status("rebuild_indexes");
}

void SnapshotStore::Impl::unindex(std::int32_t s, const std::string& tenant, const std::vector<std::int64_t>& ids) {
  StoreShard& shard = *shards[static_cast<std::size_t>(s)];
  const auto found = shard.indexes.find(tenant);
  if (found == shard.indexes.end()) return;
  TenantIndex& t = found->second;
  for (std::int64_t id : ids) {
    t.labels.erase(id);
    if (t.index) t.index->remove(id);
  }
  t.dirty = true;
  if (t.rebuilding) return;  // the rebuild reads the database: deleted rows stay out
  if (t.labels.empty()) {    // the tenant has no rows left here: no index, no files
    if (!shard.settings().dir.empty()) {
      std::error_code ec;
      std::filesystem::remove(shard.index_path(tenant), ec);
      std::filesystem::remove(shard.index_path(tenant) + ".meta", ec);
    }
    shard.indexes.erase(found);
  } else if (t.index && t.index->deleted() > t.index->size()) {
    queue_rebuild(s, tenant, true);  // more dead entries than live ones: a fresh graph is smaller and faster
  }
}

// ---- lookup -------------------------------------------------------------

Status SnapshotStore::lookup(std::string_view tenant, const SuffixKey& key, std::span<const float> query,
                             SnapshotHit& hit, std::span<float> snapshot_out) try {
  Impl& im = *impl_;
  const std::int32_t dim = im.config.snapshot_dim;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "snapshot lookup"));
  if (snapshot_out.size() != static_cast<std::size_t>(dim)) {
    return invalid_argument(
        fmt::format("snapshot lookup: output of {} values, snapshot_dim is {}", snapshot_out.size(), dim));
  }
  std::vector<float> q;
  if (!query.empty()) CLM_RETURN_IF_ERROR(unit_copy(query, dim, "snapshot lookup: query", q));
  hit = SnapshotHit{};
  im.count([](SnapshotStoreMetrics& x) { ++x.lookups; });
  auto miss = [&]() -> Status {
    im.count([](SnapshotStoreMetrics& x) { ++x.misses; });
    return {};
  };
  // Level 3: the generic snapshot of a low-information suffix.
  auto fallback_or_miss = [&]() -> Status {
    if (!key.low_information) return miss();
    std::lock_guard fallback_lock(im.fallback_mutex);
    for (std::string_view name : {std::string_view(key.key), std::string_view("*")}) {
      const auto it = im.fallbacks.find(fallback_key(tenant, name));
      if (it == im.fallbacks.end()) continue;
      if (im.blacklisted(tenant, key_fingerprint(name))) {  // a fallback is refused like any key
        im.count([](SnapshotStoreMetrics& x) { ++x.blacklisted_skips; });
        continue;
      }
      if (im.breaker->pair_blocked(tenant, key.fingerprint, key_fingerprint(name), im.now_ms())) {
        im.count([](SnapshotStoreMetrics& x) { ++x.blocked_pair_skips; });
        continue;
      }
      std::copy(it->second.begin(), it->second.end(), snapshot_out.begin());
      hit.level = SnapshotLevel::fallback;
      hit.similarity = q.empty() ? 0.0f : clamp_cosine(dot(q, it->second));
      hit.key.assign(name);
      hit.fingerprint = key_fingerprint(name);
      im.count([](SnapshotStoreMetrics& x) { ++x.hits_fallback; });
      return {};
    }
    return miss();
  };
  if (im.blacklisted(tenant, key.fingerprint)) {
    im.count([](SnapshotStoreMetrics& x) { ++x.blacklisted_skips; });
    return miss();
  }

  // An abstained key says too little to pick one stored answer: only a
  // fallback the host registered for it may serve.
  if (key.low_information) return fallback_or_miss();

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(im.config.lookup_timeout_us);
  StoreShard& shard = *im.shards[static_cast<std::size_t>(im.shard_of(tenant, key.group))];
  std::unique_lock lock(shard.mutex, std::defer_lock);
  auto busy = [&]() -> Status {
    im.count([](SnapshotStoreMetrics& x) { ++x.busy_misses; });
    return miss();
  };
  if (!lock.try_lock_until(deadline)) return busy();
  shard.set_busy_deadline(deadline);

  // Level 1: the pinned version, else the newest stable one, else the newest
  // readable one.
  const std::int32_t pinned = im.pinned_version(tenant, key.fingerprint);
  SnapshotRow chosen, newest;
  std::uint64_t corrupt = 0;
  Status read;
  // The row this key was served last time, by rowid (a writer's cache: a
  // reader does not see the writes that would make it stale).
  const bool cacheable = pinned == 0 && !im.config.read_only;
  const std::string choice_key = cacheable ? tenant_key(tenant, key.fingerprint) : std::string();
  if (cacheable) {
    if (const std::int64_t* id = shard.cached_choice(choice_key)) {
      bool found = false;
      read = shard.key_row(*id, tenant, key, chosen, found);
      if (!read.ok()) return shard.is_busy(read) ? busy() : read;
      if (!found || chosen.vector.empty()) {  // gone, or unreadable now: the versions decide again
        chosen = SnapshotRow{};
        shard.forget_choice(choice_key);
      }
    }
  }
  if (chosen.vector.empty())
    read = shard.versions(tenant, key, [&](SnapshotRow& r) {
      if (r.vector.empty()) {
        ++corrupt;
        return true;
      }
      if (pinned != 0) {
        if (r.version != pinned) return true;
        chosen = std::move(r);
        return false;
      }
      if (newest.vector.empty()) newest = r;
      if (r.confirmations >= im.config.stable_confirmations) {
        chosen = std::move(r);
        return false;
      }
      return true;
    });
  if (corrupt) im.count([&](SnapshotStoreMetrics& x) { x.corrupt_skipped += corrupt; });
  if (!read.ok()) return shard.is_busy(read) ? busy() : read;
  const bool stable = !chosen.vector.empty() && chosen.confirmations >= im.config.stable_confirmations;
  if (pinned == 0 && chosen.vector.empty() && !newest.vector.empty()) chosen = std::move(newest);
  if (cacheable && !chosen.vector.empty()) shard.remember_choice(choice_key, chosen.id);
  if (!chosen.vector.empty()) {
    std::copy(chosen.vector.begin(), chosen.vector.end(), snapshot_out.begin());
    hit.level = SnapshotLevel::exact;
    hit.similarity = q.empty() ? 1.0f : clamp_cosine(dot(q, chosen.vector));
    hit.key = key.key;
    hit.fingerprint = key.fingerprint;
    hit.version = chosen.version;
    hit.stable = stable;
    hit.pinned = pinned != 0;
    im.note_usage(shard, chosen.id, im.shard_of(tenant, key.group));
    im.count([](SnapshotStoreMetrics& x) { ++x.hits_exact; });
    return {};
  }

  // Level 2: neighbours in this tenant's index whose group agrees.
  if (!q.empty()) {
    const auto found = shard.indexes.find(std::string(tenant));
    if (found != shard.indexes.end() && found->second.rebuilding) {
      im.count([](SnapshotStoreMetrics& x) { ++x.ann_unavailable; });
    } else if (found != shard.indexes.end() && found->second.index) {
      TenantIndex& t = found->second;
      std::vector<std::pair<float, std::int64_t>> near;
      const auto ef = static_cast<std::size_t>(im.config.ann_ef_search);
      CLM_RETURN_IF_ERROR(t.index->search(q, ef, ef, near));
      // The deadline covers level 2 too: a search (or the reads of its
      // candidates below) that ran past it answers miss, as a busy shard does.
      if (std::chrono::steady_clock::now() > deadline) return busy();
      std::unordered_set<std::uint64_t> keys_seen;
      std::vector<std::int64_t> ids;
      std::uint64_t refused = 0, refused_pairs = 0;
      // Only a key's served version (the pinned one, else its newest stable
      // one, else its newest) is a candidate: an older version a key has
      // moved on from is no answer, however near its vector lies.
      std::unordered_map<std::uint64_t, std::int32_t> served_versions;
      auto served_version = [&](const LabelInfo& label, std::int32_t& version) -> Status {
        const auto known = served_versions.find(label.fingerprint);
        if (known != served_versions.end()) {
          version = known->second;
          return {};
        }
        if (const std::int32_t pin = im.pinned_version(tenant, label.fingerprint); pin != 0) {
          version = pin;
          served_versions.emplace(label.fingerprint, version);
          return {};
        }
        SuffixKey other;
        other.key = label.key;
        other.fingerprint = label.fingerprint;
        std::int32_t stable_version = 0, newest_version = 0;
        CLM_RETURN_IF_ERROR(shard.versions(tenant, other, [&](SnapshotRow& r) {
          if (r.vector.empty()) {  // unreadable: skipped and counted, as at level 1
            im.count([](SnapshotStoreMetrics& x) { ++x.corrupt_skipped; });
            return true;
          }
          if (newest_version == 0) newest_version = r.version;
          if (r.confirmations < im.config.stable_confirmations) return true;
          stable_version = r.version;
          return false;
        }));
        version = stable_version != 0 ? stable_version : newest_version;
        served_versions.emplace(label.fingerprint, version);
        return {};
      };
      for (const auto& [similarity, id] : near) {
        if (similarity < im.config.similarity_floor) break;  // best first
        if (std::chrono::steady_clock::now() > deadline) return busy();
        const auto info = t.labels.find(id);
        if (info == t.labels.end() || info->second.group != key.group) continue;
        if (keys_seen.count(info->second.fingerprint) != 0) continue;  // one candidate per key
        std::int32_t served = 0;
        read = served_version(info->second, served);
        if (!read.ok()) return shard.is_busy(read) ? busy() : read;
        if (info->second.version != served) continue;
        keys_seen.insert(info->second.fingerprint);
        if (im.blacklisted(tenant, info->second.fingerprint)) {
          ++refused;
          continue;
        }
        if (im.breaker->pair_blocked(tenant, key.fingerprint, info->second.fingerprint, im.now_ms())) {
          ++refused_pairs;
          continue;
        }
        hit.candidates.push_back(
            {info->second.key, info->second.fingerprint, info->second.version, clamp_cosine(similarity)});
        ids.push_back(id);
        if (hit.candidates.size() == static_cast<std::size_t>(im.config.ann_top_k)) break;
      }
      if (refused || refused_pairs) {
        im.count([&](SnapshotStoreMetrics& x) {
          x.blacklisted_skips += refused;
          x.blocked_pair_skips += refused_pairs;
        });
      }
      for (std::size_t c = 0; c < ids.size(); ++c) {
        SnapshotRow r;
        bool exists = false;
        read = shard.row(ids[c], r, exists);
        if (!read.ok()) return shard.is_busy(read) ? busy() : read;
        if (!exists) continue;  // evicted since the index was saved
        if (r.vector.empty()) {
          im.count([](SnapshotStoreMetrics& x) { ++x.corrupt_skipped; });
          continue;
        }
        std::copy(r.vector.begin(), r.vector.end(), snapshot_out.begin());
        hit.level = SnapshotLevel::ann;
        hit.similarity = hit.candidates[c].similarity;
        hit.key = hit.candidates[c].key;
        hit.fingerprint = hit.candidates[c].fingerprint;
        hit.version = hit.candidates[c].version;
        hit.pinned = im.pinned_version(tenant, hit.fingerprint) == hit.version;
        hit.candidates.erase(hit.candidates.begin(), hit.candidates.begin() + static_cast<std::ptrdiff_t>(c));
        im.note_usage(shard, r.id, im.shard_of(tenant, key.group));
        im.count([](SnapshotStoreMetrics& x) { ++x.hits_ann; });
        return {};
      }
      hit.candidates.clear();
    }
  }
  lock.unlock();
  return fallback_or_miss();
} catch (...) {
  hit = SnapshotHit{};  // a lookup that failed part way serves nothing, whatever it had filled in
  return current_exception_status("lookup");
}

// ---- record -------------------------------------------------------------

DriftState SnapshotStore::Impl::drift_push(const std::string& k, std::span<const float> v, bool reset,
                                           std::span<const float> version) {
  std::lock_guard lock(drift_mutex);
  auto it = drift.find(k);
  if (it == drift.end()) {
    drift_order.push_front(k);
    try {
      it = drift.emplace(k, std::make_pair(DriftWindow{}, drift_order.begin())).first;
    } catch (...) {
      drift_order.pop_front();  // no list entry without its window
      throw;
    }
    while (drift.size() > static_cast<std::size_t>(config.drift_tracked_keys)) {
      drift.erase(drift_order.back());
      drift_order.pop_back();
    }
  } else {
    drift_order.splice(drift_order.begin(), drift_order, it->second.second);
  }
  DriftWindow& w = it->second.first;
  if (reset) w.clear();
  DriftState state;
  state.variance = w.push(v, config.drift_window);
  if (state.variance >= 0 && !version.empty()) state.mean_cosine = w.mean_cosine(version);
  return state;
}

Status SnapshotStore::Impl::record_in_shard(StoreShard& shard, std::string_view tenant, const SuffixKey& key,
                                            std::vector<float>& unit, RecordOutcome& outcome,
                                            std::vector<IndexAdd>& adds, std::vector<IndexRemoval>& removals) {
  const std::int64_t now_s = now_ms() / 1000;
  shard.forget_choice(store_impl::tenant_key(tenant, key.fingerprint));  // what level 1 serves may change
  SnapshotRow current;
  std::int32_t top_version = 0;
  std::vector<std::pair<std::int32_t, std::int64_t>> all;  // (version, id), newest first
  CLM_RETURN_IF_ERROR(shard.versions(tenant, key, [&](SnapshotRow& r) {
    top_version = std::max(top_version, r.version);
    all.emplace_back(r.version, r.id);
    if (r.vector.empty() || !current.vector.empty()) return true;  // corrupt: look at older versions
    current = std::move(r);
    return true;
  }));
  auto store_version = [&](std::int32_t version) -> Status {
    std::int64_t id = 0;
    CLM_RETURN_IF_ERROR(shard.insert(tenant, key, version, unit, now_s, id));
    adds.push_back({std::string(tenant), id, LabelInfo{key.group, key.fingerprint, version, key.key}, unit});
    outcome.version = version;
    // At most max_versions_per_key versions: the oldest unpinned ones go.
    const std::int32_t pinned = pinned_version(tenant, key.fingerprint);
    std::size_t kept = all.size() + 1;
    for (auto it = all.rbegin(); it != all.rend() && kept > static_cast<std::size_t>(config.max_versions_per_key);
         ++it) {
      if (it->first == pinned) continue;
      CLM_RETURN_IF_ERROR(shard.delete_row(it->second));
      removals.push_back({std::string(tenant), it->second});
      --kept;
    }
    return {};
  };
  const std::string k = tenant_key(tenant, key.fingerprint);
  if (top_version == 0) {  // not stored yet: admission
    std::int64_t seen = 0;
    CLM_RETURN_IF_ERROR(shard.count_sighting(tenant, key, now_s, seen));
    outcome.seen = seen;
    if (seen < config.min_usage_threshold) {
      outcome.result = RecordResult::counted;
      return {};
    }
    CLM_RETURN_IF_ERROR(shard.forget_sightings(tenant, key));
    CLM_RETURN_IF_ERROR(store_version(1));
    outcome.result = RecordResult::admitted;
    (void)drift_push(k, unit, true);
    return {};
  }
  if (current.vector.empty() || dot(unit, current.vector) < config.version_cosine) {
    CLM_RETURN_IF_ERROR(store_version(top_version + 1));
    outcome.result = RecordResult::new_version;
    (void)drift_push(k, unit, true);
    return {};
  }
  CLM_RETURN_IF_ERROR(shard.confirm(current.id));
  // Drift: the window's records spread too far apart, or, each close enough
  // to confirm the version, all lean away from it together.
  const DriftState window = drift_push(k, unit, false, current.vector);
  if (window.variance > static_cast<double>(config.drift_variance) ||
      (window.mean_cosine >= 0 && window.mean_cosine < static_cast<double>(config.drift_mean_cosine))) {
    CLM_RETURN_IF_ERROR(store_version(top_version + 1));
    outcome.result = RecordResult::drifted;
    (void)drift_push(k, unit, true);
    return {};
  }
  outcome.result = RecordResult::confirmed;
  outcome.version = current.version;
  return {};
}

void SnapshotStore::Impl::install_adds(StoreShard& shard, std::vector<IndexAdd>& adds) {
  for (IndexAdd& a : adds) {
    // An add that fails (out of memory) leaves the row reachable by level 1
    // only; the next rebuild indexes it. Nothing may throw here: the rows
    // are committed, and the caller must say so.
    try {
      TenantIndex& t = shard.tenant_index(a.tenant);
      if (t.rebuilding) continue;  // the rebuild's catch-up adds it
      if (!t.index && !HnswIndex::create(shard.settings().hnsw, t.index).ok()) continue;
      if (t.index->add(a.vector, a.id).ok()) {
        t.labels[a.id] = std::move(a.info);
        t.dirty = true;
      }
    } catch (const std::bad_alloc&) {
    }
  }
}

Status SnapshotStore::record(std::string_view tenant, const SuffixKey& key, std::span<const float> snapshot,
                             RecordOutcome& outcome) {
  const SnapshotRecord one{tenant, &key, snapshot};
  return record_batch(std::span(&one, 1), std::span(&outcome, 1));
}

Status SnapshotStore::record_batch(std::span<const SnapshotRecord> records, std::span<RecordOutcome> outcomes) try {
  CLM_RETURN_IF_ERROR(impl_->writable("record_batch"));
  Impl& im = *impl_;
  if (outcomes.size() != records.size()) {
    return invalid_argument(fmt::format("record_batch: {} records but {} outcomes", records.size(), outcomes.size()));
  }
  // Everything is checked before anything is written.
  std::vector<std::vector<float>> units(records.size());
  std::vector<std::vector<std::size_t>> by_shard(im.shards.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const SnapshotRecord& r = records[i];
    if (!r.key) return invalid_argument(fmt::format("record_batch: record {} has no key", i));
    CLM_RETURN_IF_ERROR(check_key(*r.key, r.tenant, "snapshot record"));
    CLM_RETURN_IF_ERROR(unit_copy(r.snapshot, im.config.snapshot_dim, "snapshot record", units[i]));
    round_f16(units[i]);
    if (r.key->low_information) continue;  // abstained: never stored, never counted toward admission
    by_shard[static_cast<std::size_t>(im.shard_of(r.tenant, r.key->group))].push_back(i);
  }
  std::uint64_t abstained = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const bool abstain = records[i].key->low_information;
    abstained += abstain ? 1 : 0;
    outcomes[i] = RecordOutcome{abstain ? RecordResult::abstained : RecordResult::not_written, 0, 0};
  }
  if (abstained) {
    im.count([&](SnapshotStoreMetrics& x) {
      x.records += abstained;
      x.abstained += abstained;
    });
  }
  for (std::size_t s = 0; s < im.shards.size(); ++s) {
    if (by_shard[s].empty()) continue;
    StoreShard& shard = *im.shards[s];
    const store_detail::WriteLocks locks(shard);
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    std::vector<IndexAdd> adds;
    std::vector<IndexRemoval> removals;
    std::vector<RecordOutcome> local(by_shard[s].size());
    Status failed;
    for (std::size_t j = 0; j < by_shard[s].size() && failed.ok(); ++j) {
      const std::size_t i = by_shard[s][j];
      failed = im.record_in_shard(shard, records[i].tenant, *records[i].key, units[i], local[j], adds, removals);
    }
    if (failed.ok()) failed = tx.commit();
    if (!failed.ok()) return failed;
    im.install_adds(shard, adds);
    for (const IndexRemoval& r : removals) im.unindex(static_cast<std::int32_t>(s), r.tenant, {r.id});
    SnapshotStoreMetrics delta;
    for (std::size_t j = 0; j < by_shard[s].size(); ++j) {
      outcomes[by_shard[s][j]] = local[j];
      ++delta.records;
      switch (local[j].result) {
        case RecordResult::counted:
          ++delta.counted;
          break;
        case RecordResult::admitted:
          ++delta.admissions;
          break;
        case RecordResult::confirmed:
          ++delta.confirmations;
          break;
        case RecordResult::new_version:
          ++delta.versions;
          break;
        case RecordResult::drifted:
          ++delta.versions;
          ++delta.drift_versions;
          break;
        case RecordResult::not_written:
        case RecordResult::abstained:
          break;
      }
    }
    im.count([&](SnapshotStoreMetrics& x) {
      x.records += delta.records;
      x.counted += delta.counted;
      x.admissions += delta.admissions;
      x.confirmations += delta.confirmations;
      x.versions += delta.versions;
      x.drift_versions += delta.drift_versions;
      x.snapshots += static_cast<std::int64_t>(adds.size()) - static_cast<std::int64_t>(removals.size());
      x.versions_dropped += removals.size();
    });
  }
  return {};
} catch (...) {
  return current_exception_status("record_batch");
}

// ---- breakers, fallbacks, eviction ---------------------------------------

Status SnapshotStore::report_outcome(std::string_view tenant, const SuffixKey& key, bool correct) {
  SnapshotHit served;
  served.level = SnapshotLevel::exact;
  served.key = key.key;
  served.fingerprint = key.fingerprint;
  return report_outcome(tenant, key, served, correct);
}

Status SnapshotStore::report_outcome(std::string_view tenant, const SuffixKey& query, const SnapshotHit& served,
                                     bool correct) try {
  CLM_RETURN_IF_ERROR(impl_->writable("report_outcome"));
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(query, tenant, "report_outcome"));
  if (served.level == SnapshotLevel::miss || served.key.empty()) {
    return failed_precondition("report_outcome: a miss served nothing to report on");
  }
  if (served.fingerprint != key_fingerprint(served.key)) {
    return invalid_argument(fmt::format("report_outcome: the served fingerprint does not match \"{}\"", served.key));
  }
  const std::int64_t now = im.now_ms();
  // Outcomes are counted per (query key, served key): a wrong level-2 serve
  // blames the neighbour for this query only, never its own exact hits.
  const auto trip = im.breaker->report(tenant, query.fingerprint, served.fingerprint, correct, now);
  im.count([](SnapshotStoreMetrics& x) { ++x.outcome_reports; });
  if (!trip || !trip->whole_key) return {};
  SuffixKey blamed = query;  // its shard: the query's group routes to it (level 2 serves from that shard)
  blamed.key = served.key;
  blamed.fingerprint = served.fingerprint;
  {
    std::lock_guard lock(im.breaker_mutex);
    if (im.blacklist.count(tenant_key(tenant, served.fingerprint))) return {};
    im.blacklist[tenant_key(tenant, served.fingerprint)] = trip->until_ms;
    im.blacklist_size = im.blacklist.size();
  }
  StoreShard& shard = *im.shards[static_cast<std::size_t>(im.shard_of(tenant, query.group))];
  const store_detail::WriteLocks locks(shard);
  // In force in memory either way.
  return shard.put_blacklist(tenant, blamed, trip->until_ms, trip->reason, false);
} catch (...) {
  return current_exception_status("report_outcome");
}

bool SnapshotStore::is_blacklisted(std::string_view tenant, const SuffixKey& key) {
  return impl_->blacklisted(tenant, key.fingerprint);
}

Status SnapshotStore::set_fallback(std::string_view tenant, std::string_view name,
                                   std::span<const float> snapshot) try {
  CLM_RETURN_IF_ERROR(impl_->writable("set_fallback"));
  Impl& im = *impl_;
  if (name.empty() || name.size() > kMaxNameBytes) {
    return invalid_argument(fmt::format("set_fallback: the name must have 1..{} bytes", kMaxNameBytes));
  }
  if (tenant.size() > kMaxTenantBytes) return invalid_argument("set_fallback: tenant too long");
  std::vector<float> unit;
  CLM_RETURN_IF_ERROR(unit_copy(snapshot, im.config.snapshot_dim, "set_fallback", unit));
  round_f16(unit);
  StoreShard& shard = *im.shards[static_cast<std::size_t>(im.shard_of(tenant, key_fingerprint(name)))];
  {
    const store_detail::WriteLocks locks(shard);
    CLM_RETURN_IF_ERROR(shard.put_fallback(tenant, name, unit));
  }
  std::lock_guard lock(im.fallback_mutex);
  im.fallbacks[fallback_key(tenant, name)] = std::move(unit);
  return {};
} catch (...) {
  return current_exception_status("set_fallback");
}

Status SnapshotStore::evict(EvictionReport& report) try {
  CLM_RETURN_IF_ERROR(impl_->writable("evict"));
  Impl& im = *impl_;
  report = {};
  const std::int64_t now_ms = im.now_ms();
  const std::int64_t cutoff_s = store_impl::eviction_cutoff_s(now_ms, im.config.evict_after_days);
  for (auto& shard_ptr : im.shards) {
    StoreShard& shard = *shard_ptr;
    store_detail::WriteLocks locks(shard);
    shard.forget_choices();  // rows of many keys may go
    CLM_RETURN_IF_ERROR(shard.flush_usage());
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    std::vector<std::pair<std::int64_t, std::string>> victims;
    Status s = shard.eviction_candidates(cutoff_s, im.config.evict_min_usage, victims);
    for (std::size_t i = 0; i < victims.size() && s.ok(); ++i) s = shard.delete_row(victims[i].first);
    if (s.ok()) s = shard.prune(cutoff_s, now_ms);
    if (s.ok()) s = tx.commit();
    if (!s.ok()) return s;
    std::map<std::string, std::vector<std::int64_t>> by_tenant;
    for (const auto& [id, tenant] : victims) by_tenant[tenant].push_back(id);
    for (const auto& [tenant, ids] : by_tenant)
      im.unindex(static_cast<std::int32_t>(&shard_ptr - im.shards.data()), tenant, ids);
    report.deleted += static_cast<std::int64_t>(victims.size());
    std::int64_t pages = 0;
    CLM_RETURN_IF_ERROR(shard.vacuum(pages));
    report.pages_vacuumed += pages;
    std::vector<HnswIndex::PendingSave> saves;
    CLM_RETURN_IF_ERROR(shard.begin_index_saves(true, saves));
    locks.shard.unlock();
    locks.writer.unlock();
    CLM_RETURN_IF_ERROR(shard.finish_saves(saves));
  }
  im.count([&](SnapshotStoreMetrics& x) {
    x.evictions += static_cast<std::uint64_t>(report.deleted);
    x.snapshots -= report.deleted;
  });
  return {};
} catch (...) {
  return current_exception_status("evict");
}

Status SnapshotStore::flush() try {
  CLM_RETURN_IF_ERROR(impl_->writable("flush"));
  for (auto& shard : impl_->shards) {
    std::vector<HnswIndex::PendingSave> saves;
    {
      const store_detail::WriteLocks locks(*shard);
      CLM_RETURN_IF_ERROR(shard->flush_usage());
      CLM_RETURN_IF_ERROR(shard->begin_index_saves(true, saves));
    }
    CLM_RETURN_IF_ERROR(shard->finish_saves(saves));  // fsyncs without the shard lock
  }
  return {};
} catch (...) {
  return current_exception_status("flush");
}

Status SnapshotStore::check_integrity() {
  for (auto& shard : impl_->shards) {
    std::lock_guard lock(shard->mutex);
    shard->set_write_deadline();
    CLM_RETURN_IF_ERROR(shard->integrity_check());
  }
  return {};
}

// ---- rekey ------------------------------------------------------------------

namespace {

constexpr std::size_t kRekeyChunk = 1024;  // rows read at a time

using Shards = std::vector<std::unique_ptr<StoreShard>>;

// Deletes every index file of the store (shard-NN.<tenant>.hnsw, its .meta,
// temporary files): their labels name the old keys, and moved rows left them.
Status remove_index_files(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("shard-", 0) == 0 && name.find(".hnsw") != std::string::npos) doomed.push_back(entry.path());
  }
  if (ec) return io_error(fmt::format("rekey: cannot list {}: {}", dir, ec.message()));
  for (const auto& path : doomed) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return io_error(fmt::format("rekey: cannot delete the index file {}: {}", path.string(), ec.message()));
    }
  }
  return {};
}

// The key a row's text makes now, or why it makes none that may be served.
bool rekey_text(const SuffixKeyer& keyer, const std::string& text, SuffixKey& key, std::string& why) {
  const Status made = keyer.make_key(text, key);
  if (!made.ok()) {
    why = fmt::format("{}: {}", made.code_name(), made.message());
    return false;
  }
  if (key.low_information) {
    why = key.abstain_reason.empty() ? fmt::format("abstained: low information ({})", key.key)
                                     : fmt::format("abstained: {}", key.abstain_reason);
    return false;
  }
  return true;
}

struct RekeyRun {
  const SnapshotStoreConfig& config;
  const SuffixKeyer& keyer;
  Shards& shards;
  RekeyReport& report;
  ConsistentHashRing ring;
  std::map<std::string, RekeyReport::Drop> drops;

  void drop(const std::string& why, const std::string& text) {
    RekeyReport::Drop& d = drops[why];
    if (d.rows++ == 0) {
      d.reason = why;
      d.example = text;
    }
    ++report.dropped;
  }

  // Rows of shard s: new keys in place, rows of other shards to the outbox,
  // rows without a servable key deleted; one transaction.
  Status rows_of(std::int32_t s) {
    StoreShard& shard = *shards[static_cast<std::size_t>(s)];
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    std::vector<store_detail::RekeyRow> rows;
    std::int64_t after = 0;
    SuffixKey key;
    std::string why;
    do {
      CLM_RETURN_IF_ERROR(shard.rekey_rows(after, kRekeyChunk, rows));
      for (const store_detail::RekeyRow& row : rows) {
        after = row.id;
        if (!row.text) {
          ++report.kept;
          continue;
        }
        if (!rekey_text(keyer, *row.text, key, why)) {
          CLM_RETURN_IF_ERROR(shard.rekey_delete(row.id));
          CLM_RETURN_IF_ERROR(shard.drop_blacklisted(row.tenant, row.fingerprint, report.blacklist_dropped));
          drop(why, *row.text);
          continue;
        }
        ++report.rekeyed;
        const bool changed = key.key != row.key || key.fingerprint != row.fingerprint;
        if (changed) {
          ++report.changed;
          CLM_RETURN_IF_ERROR(shard.drop_blacklisted(row.tenant, row.fingerprint, report.blacklist_dropped));
        }
        if (route(ring, row.tenant, key.group) != s) {
          ++report.moved;
          CLM_RETURN_IF_ERROR(shard.rekey_to_outbox(row.id));  // its key is made again on delivery
        } else if (changed || key.group != row.group) {
          CLM_RETURN_IF_ERROR(shard.rekey_update(row.id, key));
        }
      }
    } while (rows.size() == kRekeyChunk);
    CLM_RETURN_IF_ERROR(shard.drop_sightings(report.sightings_dropped));
    return tx.commit();
  }

  // Delivers shard s's outbox: each row into its new shard (with the
  // (shard, id) it came from in that shard's inbox), then out of the outbox.
  // Rows some shard's inbox already holds (delivered before a crash) are only
  // taken out.
  Status deliver(std::int32_t s, const std::set<std::pair<std::int32_t, std::int64_t>>& delivered) {
    StoreShard& source = *shards[static_cast<std::size_t>(s)];
    std::vector<store_detail::MovedRow> rows;
    SuffixKey key;
    std::string why;
    do {
      CLM_RETURN_IF_ERROR(source.outbox_rows(0, kRekeyChunk, rows));
      std::map<std::int32_t, std::vector<std::pair<const store_detail::MovedRow*, SuffixKey>>> by_target;
      for (const store_detail::MovedRow& row : rows) {
        if (delivered.count({s, row.id})) continue;
        if (!rekey_text(keyer, row.text, key, why)) {  // possible when a rerun has other rules than the first run
          drop(why, row.text);
          continue;
        }
        by_target[route(ring, row.tenant, key.group)].emplace_back(&row, key);
      }
      for (const auto& [t, batch] : by_target) {
        StoreShard& target = *shards[static_cast<std::size_t>(t)];
        store_detail::ShardTransaction tx(target);
        CLM_RETURN_IF_ERROR(tx.begin());
        for (const auto& [row, new_key] : batch) CLM_RETURN_IF_ERROR(target.receive(*row, s, new_key));
        CLM_RETURN_IF_ERROR(tx.commit());
      }
      store_detail::ShardTransaction tx(source);
      CLM_RETURN_IF_ERROR(tx.begin());
      for (const store_detail::MovedRow& row : rows) CLM_RETURN_IF_ERROR(source.outbox_delete(row.id));
      CLM_RETURN_IF_ERROR(tx.commit());
    } while (!rows.empty());
    return {};
  }

  Status run(std::uint64_t rules) {
    // 1. Mark every shard (and create its outbox and inbox) before any row
    // changes: from here until step 5, open() refuses the store.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      const auto from = static_cast<std::uint64_t>(shard->meta_value("key_rules").value_or(0));
      CLM_RETURN_IF_ERROR(shard->begin_rekey(from, rules));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    CLM_RETURN_IF_ERROR(remove_index_files(config.path));
    // 2. New keys, shard by shard.
    for (std::int32_t s = 0; s < config.num_shards; ++s) CLM_RETURN_IF_ERROR(rows_of(s));
    // 3. Rows that change shards.
    std::set<std::pair<std::int32_t, std::int64_t>> delivered;
    for (auto& shard : shards) {
      std::vector<std::pair<std::int32_t, std::int64_t>> inbox;
      CLM_RETURN_IF_ERROR(shard->inbox(inbox));
      delivered.insert(inbox.begin(), inbox.end());
    }
    for (std::int32_t s = 0; s < config.num_shards; ++s) CLM_RETURN_IF_ERROR(deliver(s, delivered));
    // 4. Versions of keys that became one.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      CLM_RETURN_IF_ERROR(shard->renumber_versions(report.versions_renumbered));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    // 5. The new rules, once every shard is done.
    for (auto& shard : shards) {
      store_detail::ShardTransaction tx(*shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      CLM_RETURN_IF_ERROR(shard->finish_rekey(rules));
      CLM_RETURN_IF_ERROR(tx.commit());
    }
    for (auto& [why, d] : drops) report.drops.push_back(std::move(d));
    std::stable_sort(report.drops.begin(), report.drops.end(),
                     [](const RekeyReport::Drop& a, const RekeyReport::Drop& b) { return a.rows > b.rows; });
    return {};
  }
};

}  // namespace

Status SnapshotStore::rekey(const SnapshotStoreConfig& config, bool adopt, RekeyReport& report) try {
  report = RekeyReport{};
  CLM_RETURN_IF_ERROR(check_config(config));
  const std::string& dir = config.path;
  if (dir == ":memory:") return invalid_argument("rekey: a \":memory:\" store keeps nothing to rekey");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return not_found(fmt::format("rekey: no snapshot store at {} (no such directory)", dir));
  }
  if (!std::filesystem::exists(dir + "/shard-00.db", ec)) {
    return not_found(fmt::format("rekey: no snapshot store at {} (no shard-00.db)", dir));
  }
  std::unique_ptr<SuffixKeyer> keyer;
  CLM_RETURN_IF_ERROR(SuffixKeyer::create(config.keyer, keyer));
  const std::uint64_t rules = keyer->rules_fingerprint();
  report.new_rules = rules;
  report.adopted = adopt;
  {
    DirectoryLock lock;  // declared first: released after the shards close
    CLM_RETURN_IF_ERROR(lock.acquire(dir));
    Shards shards;
    // Read and check every shard before anything is written.
    for (std::int32_t s = 0; s < config.num_shards; ++s) {
      std::unique_ptr<StoreShard> shard;
      CLM_RETURN_IF_ERROR(StoreShard::open(shard_settings(config, s, rules), shard));
      if (s == 0 && shard->fresh()) {
        return not_found(fmt::format("rekey: no snapshot store at {} (shard-00.db holds none)", dir));
      }
      CLM_RETURN_IF_ERROR(shard->check_shape());
      shards.push_back(std::move(shard));
    }
    report.old_format = static_cast<std::int32_t>(kStoreFormat);
    for (const auto& shard : shards) {
      if (shard->fresh()) continue;
      report.old_format = std::min(report.old_format, static_cast<std::int32_t>(shard->format()));
      if (shard->meta_value("rekey_to")) report.resumed = true;
    }
    // The rules the keys had: those of the first shard an interrupted rekey
    // marked (it recorded them), else shard 0's.
    report.old_rules = static_cast<std::uint64_t>(shards[0]->meta_value("key_rules").value_or(0));
    for (const auto& shard : shards) {
      if (const auto from = shard->meta_value("rekey_from")) {
        report.old_rules = static_cast<std::uint64_t>(*from);
        break;
      }
    }
    if (adopt && report.resumed) {
      return failed_precondition(fmt::format(
          "rekey --adopt: a rekey of {} was interrupted, and some of its keys are new already: run `clm_store rekey "
          "{}` (without --adopt) to finish it",
          dir, dir));
    }
    if (!adopt && report.old_format < 2) {
      return failed_precondition(fmt::format(
          "rekey: {} is a format-1 store: its rows keep no text to make keys from. Run `clm_store rekey --adopt "
          "{}` to keep its keys under the current rules",
          dir, dir));
    }
    for (auto& shard : shards) {
      CLM_RETURN_IF_ERROR(shard->start(false));
      std::int64_t rows = 0, in_transit = 0;
      CLM_RETURN_IF_ERROR(shard->rekey_counts(rows, in_transit));
      report.rows_before += rows + in_transit;
    }
    if (adopt) {
      for (auto& shard : shards) {
        store_detail::ShardTransaction tx(*shard);
        CLM_RETURN_IF_ERROR(tx.begin());
        CLM_RETURN_IF_ERROR(shard->adopt(rules));
        CLM_RETURN_IF_ERROR(tx.commit());
      }
      report.kept = report.rows_before;
    } else {
      RekeyRun run{config, *keyer, shards, report, ConsistentHashRing(config.num_shards), {}};
      CLM_RETURN_IF_ERROR(run.run(rules));
    }
  }  // the directory lock is released: the store may open
  // Opening rebuilds the index files rekey deleted, and checks the result.
  SnapshotStoreConfig reopen = config;
  reopen.rebuild_in_background = false;
  std::unique_ptr<SnapshotStore> store;
  const Status opened = open(reopen, store);
  if (!opened.ok()) {
    return {opened.code(),
            fmt::format("rekey: the keys are done, but the store does not open: {} (its index files are rebuilt at "
                        "the next open)",
                        opened.message())};
  }
  const SnapshotStoreMetrics m = store->metrics();
  report.indexes_rebuilt = static_cast<std::int64_t>(m.index_rebuilds);
  report.rows_after = m.snapshots;
  return {};
} catch (...) {
  return current_exception_status("rekey");
}

SnapshotStoreMetrics SnapshotStore::metrics() const {
  SnapshotStoreMetrics out;
  {
    std::lock_guard lock(impl_->metrics_mutex);
    out = impl_->m;
  }
  std::lock_guard lock(impl_->breaker_mutex);
  const std::int64_t now = impl_->now_ms();
  for (const auto& [k, until] : impl_->blacklist) out.blacklisted_keys += until >= now ? 1 : 0;
  out.blocked_pairs = static_cast<std::int64_t>(impl_->breaker->blocked_pairs(now));
  return out;
}

}  // namespace clm
