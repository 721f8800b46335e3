// lib/store/snapshot_store_background.cpp: the snapshot store's indexes and
// its background thread (clm/store/snapshot_store.hpp, breaker (c),
// "Durability", scheduled maintenance, a reader's refresh): loading and
// building the per-tenant HNSW indexes, the queue of rebuilds and usage
// writes, and the timer of maintenance and refresh.
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

void SnapshotStore::Impl::stop_rebuilds() {
  {
    std::lock_guard lock(rebuild_mutex);
    stopping = true;
  }
  rebuild_cv.notify_all();
  if (rebuild_thread.joinable()) rebuild_thread.join();
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

}  // namespace clm
