// lib/store/snapshot_store.cpp: the snapshot store's policy
// (clm/store/snapshot_store.hpp): opening, admission, versions and drift,
// the breakers' writes, fallbacks, eviction, flush and metrics. Beside it:
// retrieval (snapshot_store_lookup.cpp), the indexes and the background
// thread (snapshot_store_background.cpp), rekey (snapshot_store_rekey.cpp),
// administration by hand (snapshot_store_admin.cpp) and inspection
// (snapshot_store_inspect.cpp). Storage itself is StoreShard's
// (store_shard.cpp); the state they share is SnapshotStore::Impl
// (snapshot_store_impl.hpp).
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

const char* snapshot_store_event_name(SnapshotStoreEvent::Kind kind) {
  switch (kind) {
    case SnapshotStoreEvent::Kind::blacklisted:
      return "blacklisted";
    case SnapshotStoreEvent::Kind::unblacklisted:
      return "unblacklisted";
    case SnapshotStoreEvent::Kind::version_created:
      return "version_created";
    case SnapshotStoreEvent::Kind::drift:
      return "drift";
  }
  return "unknown";
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
  if (!config.read_only) {  // a reader keeps no choices: it does not see the writes that would make them stale
    for (auto& shard : im.shards) {
      std::lock_guard lock(shard->mutex);
      CLM_RETURN_IF_ERROR(shard->warm_choices(config.stable_confirmations));
    }
  }
  const bool background = config.read_only || config.maintenance_interval_ms > 0;
  out.reset(new SnapshotStore(std::move(impl)));
  // A reader's refresh of the blacklist, pins and fallbacks; a writer's maintenance.
  if (background) out->impl_->start_background();
  return {};
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
  shard.forget_choice(store_impl::choice_key(tenant, key.fingerprint));  // what level 1 serves may change
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
      const RecordResult result = local[j].result;
      if (im.config.on_event && (result == RecordResult::admitted || result == RecordResult::new_version ||
                                 result == RecordResult::drifted)) {
        const SnapshotRecord& r = records[by_shard[s][j]];
        SnapshotStoreEvent e;
        e.kind = result == RecordResult::drifted ? SnapshotStoreEvent::Kind::drift
                                                 : SnapshotStoreEvent::Kind::version_created;
        e.tenant = r.tenant;
        e.key = r.key->key;
        e.version = local[j].version;
        im.config.on_event(e);
      }
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
  if (im.config.on_event) {  // in force in memory from here, whatever the write below does
    SnapshotStoreEvent e;
    e.kind = SnapshotStoreEvent::Kind::blacklisted;
    e.tenant = tenant;
    e.key = served.key;
    e.reason = trip->reason;
    e.until_ms = trip->until_ms;
    e.by_breaker = true;
    im.config.on_event(e);
  }
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
