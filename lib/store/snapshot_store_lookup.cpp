// lib/store/snapshot_store_lookup.cpp: the snapshot store's retrieval
// (clm/store/snapshot_store.hpp, levels 1-3): the remembered row or the key's
// versions, then the group-filtered neighbours, then the fallback, within
// the lookup's deadline.
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
  const std::int64_t now = im.now_ms();  // one time for the lookup's breaker checks and its usage
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
      if (im.breaker->pair_blocked(tenant, key.fingerprint, key_fingerprint(name), now)) {
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
  const std::uint64_t choice = cacheable ? choice_key(tenant, key.fingerprint) : 0;
  if (cacheable) {
    if (const std::int64_t* id = shard.cached_choice(choice)) {
      bool found = false;
      read = shard.key_row(*id, tenant, key, chosen, found);
      if (!read.ok()) return shard.is_busy(read) ? busy() : read;
      if (!found || chosen.vector.empty()) {  // gone, or unreadable now: the versions decide again
        chosen = SnapshotRow{};
        shard.forget_choice(choice);
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
  if (cacheable && !chosen.vector.empty()) shard.remember_choice(choice, chosen.id);
  if (!chosen.vector.empty()) {
    std::copy(chosen.vector.begin(), chosen.vector.end(), snapshot_out.begin());
    hit.level = SnapshotLevel::exact;
    hit.similarity = q.empty() ? 1.0f : clamp_cosine(dot(q, chosen.vector));
    hit.key = key.key;
    hit.fingerprint = key.fingerprint;
    hit.version = chosen.version;
    hit.stable = stable;
    hit.pinned = pinned != 0;
    im.note_usage(shard, chosen.id, im.shard_of(tenant, key.group), now);
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
        if (im.breaker->pair_blocked(tenant, key.fingerprint, info->second.fingerprint, now)) {
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
        im.note_usage(shard, r.id, im.shard_of(tenant, key.group), now);
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

}  // namespace clm
