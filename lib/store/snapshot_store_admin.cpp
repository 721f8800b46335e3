// lib/store/snapshot_store_admin.cpp: what an administrator does to a
// snapshot store by hand (clm/store/snapshot_store.hpp, "administration"):
// list a key's versions, delete a key or a tenant, blacklist and unblacklist
// a key, pin a version, roll a key back. Each call checks its arguments,
// changes the database in one transaction per shard, and only then the
// memory (blacklist, pins, drift windows, indexes), so a failed call changes
// nothing.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/store/snapshot_store.hpp"
#include "snapshot_store_impl.hpp"

namespace clm {

using namespace store_impl;  // NOLINT(google-build-using-namespace): the store's own helpers

namespace {
constexpr std::size_t kMaxReasonBytes = 1024;

// The shard lock and SQLite's write timeout, for one administrative call.
// An administration call's locks (store_shard.hpp, WriteLocks): its writes,
// and its reads of usage counts, never meet the background thread's.
using ShardWrite = store_detail::WriteLocks;
}  // namespace

Status SnapshotStore::list_versions(std::string_view tenant, const SuffixKey& key,
                                    std::vector<SnapshotVersionInfo>& out) try {
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "list_versions"));
  out.clear();
  std::vector<store_detail::VersionRow> rows;
  {
    StoreShard& shard = im.shard_for(tenant, key.group);
    const ShardWrite write(shard);
    CLM_RETURN_IF_ERROR(shard.version_rows(tenant, key, rows));
  }
  if (rows.empty()) return not_found(fmt::format("list_versions: key \"{}\" has no stored version", key.key));
  const std::int32_t pinned = im.pinned_version(tenant, key.fingerprint);
  // The served version, as lookup picks it: the pinned one (if readable),
  // else the newest stable readable one, else the newest readable one.
  std::int32_t served = 0;
  if (pinned != 0) {
    for (const auto& r : rows) served = r.version == pinned && r.readable ? pinned : served;
  } else {
    for (const auto& r : rows) {
      if (!r.readable) continue;
      if (served == 0) served = r.version;
      if (r.confirmations >= im.config.stable_confirmations) {
        served = r.version;
        break;
      }
    }
  }
  for (const auto& r : rows) {
    SnapshotVersionInfo v;
    v.version = r.version;
    v.created_at_s = r.created_at_s;
    v.last_used_s = r.last_used_s;
    v.usage_count = r.usage_count;
    v.confirmations = r.confirmations;
    v.readable = r.readable;
    v.stable = r.confirmations >= im.config.stable_confirmations;
    v.pinned = r.version == pinned;
    v.served = r.version == served;
    out.push_back(v);
  }
  return {};
} catch (...) {
  out.clear();
  return current_exception_status("list_versions");
}

Status SnapshotStore::delete_key(std::string_view tenant, const SuffixKey& key, std::int64_t& rows_deleted) try {
  CLM_RETURN_IF_ERROR(impl_->writable("delete_key"));
  Impl& im = *impl_;
  rows_deleted = 0;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "delete_key"));
  const std::int32_t s = im.shard_of(tenant, key.group);
  StoreShard& shard = *im.shards[static_cast<std::size_t>(s)];
  std::vector<std::int64_t> ids;
  std::vector<HnswIndex::PendingSave> saves;
  {
    ShardWrite write(shard);
    shard.forget_choice(choice_key(tenant, key.fingerprint));  // what level 1 serves changes
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    CLM_RETURN_IF_ERROR(shard.delete_key_rows(tenant, key, 0, ids));
    if (ids.empty()) return not_found(fmt::format("delete_key: key \"{}\" has no stored version", key.key));
    CLM_RETURN_IF_ERROR(tx.commit());
    im.unindex(s, std::string(tenant), ids);
    CLM_RETURN_IF_ERROR(shard.begin_index_saves(true, saves));
  }
  const std::string k = tenant_key(tenant, key.fingerprint);
  {
    std::lock_guard lock(im.breaker_mutex);
    im.blacklist.erase(k);
    im.blacklist_size = im.blacklist.size();
  }
  im.breaker->forget_key(tenant, key.fingerprint);
  {
    std::lock_guard lock(im.pin_mutex);
    im.pins.erase(k);
    im.pins_size = im.pins.size();
  }
  im.forget_drift(k);
  rows_deleted = static_cast<std::int64_t>(ids.size());
  im.count([&](SnapshotStoreMetrics& x) { x.snapshots -= rows_deleted; });
  return shard.finish_saves(saves);  // the rows are gone either way; an unsaved index is caught up at open
} catch (...) {
  return current_exception_status("delete_key");
}

Status SnapshotStore::delete_tenant(std::string_view tenant, TenantDeletionReport& report) try {
  CLM_RETURN_IF_ERROR(impl_->writable("delete_tenant"));
  Impl& im = *impl_;
  report = {};
  if (tenant.size() > kMaxTenantBytes) return invalid_argument("delete_tenant: tenant too long");
  const std::string prefix = std::string(tenant) + '\0';
  bool any_fallback = false;
  {
    std::lock_guard lock(im.fallback_mutex);
    for (const auto& [name, v] : im.fallbacks) any_fallback = any_fallback || name.starts_with(prefix);
  }
  for (std::size_t s = 0; s < im.shards.size(); ++s) {
    StoreShard& shard = *im.shards[s];
    store_detail::TenantDeletion gone;
    {
      ShardWrite write(shard);
      shard.forget_choices();
      store_detail::ShardTransaction tx(shard);
      CLM_RETURN_IF_ERROR(tx.begin());
      CLM_RETURN_IF_ERROR(shard.delete_tenant(tenant, gone));
      CLM_RETURN_IF_ERROR(tx.commit());
      im.unindex(static_cast<std::int32_t>(s), std::string(tenant), gone.row_ids);
      const auto left = shard.indexes.find(std::string(tenant));
      if (left != shard.indexes.end() && !left->second.rebuilding) {
        // Rows the index file held that the database no longer has.
        if (!shard.settings().dir.empty()) {
          {
            // A save serialized before this (a flush finishing without the
            // shard lock) must not bring the file back.
            std::lock_guard save_lock(shard.save_mutex);
            shard.published_generation[shard.index_path(tenant)] = ++shard.save_generation;
          }
          std::error_code ec;
          std::filesystem::remove(shard.index_path(tenant), ec);
          std::filesystem::remove(shard.index_path(tenant) + ".meta", ec);
        }
        shard.indexes.erase(left);
      }
    }
    report.rows += static_cast<std::int64_t>(gone.row_ids.size());
    report.sightings += gone.sightings;
    report.blacklist += gone.blacklist;
    report.pins += gone.pins;
    report.fallbacks += gone.fallbacks;
  }
  auto of_tenant = [&](const auto& entry) { return entry.first.starts_with(prefix); };
  {
    std::lock_guard lock(im.breaker_mutex);
    std::erase_if(im.blacklist, of_tenant);
    im.blacklist_size = im.blacklist.size();
  }
  {
    std::lock_guard lock(im.pin_mutex);
    std::erase_if(im.pins, of_tenant);
    im.pins_size = im.pins.size();
  }
  {
    std::lock_guard lock(im.fallback_mutex);
    std::erase_if(im.fallbacks, of_tenant);
  }
  im.forget_drift_of_tenant(prefix);
  im.breaker->forget_tenant(tenant);
  im.count([&](SnapshotStoreMetrics& x) { x.snapshots -= report.rows; });
  if (report.rows + report.sightings + report.blacklist + report.pins + report.fallbacks == 0 && !any_fallback) {
    return not_found("delete_tenant: the store holds nothing of this tenant");
  }
  return {};
} catch (...) {
  return current_exception_status("delete_tenant");
}

Status SnapshotStore::blacklist_key(std::string_view tenant, const SuffixKey& key, std::string_view reason,
                                    std::int64_t until_ms) try {
  CLM_RETURN_IF_ERROR(impl_->writable("blacklist_key"));
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "blacklist_key"));
  if (reason.empty() || reason.size() > kMaxReasonBytes) {
    return invalid_argument(fmt::format("blacklist_key: the reason must have 1..{} bytes", kMaxReasonBytes));
  }
  const std::int64_t now = im.now_ms();
  if (until_ms <= now) {
    return invalid_argument(fmt::format("blacklist_key: until {} ms is not after now ({} ms)", until_ms, now));
  }
  StoreShard& shard = im.shard_for(tenant, key.group);
  {
    const ShardWrite write(shard);
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    CLM_RETURN_IF_ERROR(shard.put_blacklist(tenant, key, until_ms, reason, true));
    CLM_RETURN_IF_ERROR(tx.commit());
  }
  {
    std::lock_guard lock(im.breaker_mutex);
    im.blacklist[tenant_key(tenant, key.fingerprint)] = until_ms;
    im.blacklist_size = im.blacklist.size();
  }
  if (im.config.on_event) {
    SnapshotStoreEvent e;
    e.kind = SnapshotStoreEvent::Kind::blacklisted;
    e.tenant = tenant;
    e.key = key.key;
    e.reason = reason;
    e.until_ms = until_ms;
    im.config.on_event(e);
  }
  return {};
} catch (...) {
  return current_exception_status("blacklist_key");
}

Status SnapshotStore::unblacklist_key(std::string_view tenant, const SuffixKey& key) try {
  CLM_RETURN_IF_ERROR(impl_->writable("unblacklist_key"));
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "unblacklist_key"));
  if (!im.blacklisted(tenant, key.fingerprint)) {
    // Refused to some query keys only (breaker (b)'s pair blocks): lift those.
    // With none in force, not_found changes nothing (its outcomes stay counted).
    if (im.breaker->blocked_queries(tenant, key.fingerprint, im.now_ms()) == 0) {
      return not_found(fmt::format("unblacklist_key: key \"{}\" is not blacklisted", key.key));
    }
    im.breaker->forget_key(tenant, key.fingerprint);
    return {};
  }
  StoreShard& shard = im.shard_for(tenant, key.group);
  {
    const ShardWrite write(shard);
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    bool removed = false;
    CLM_RETURN_IF_ERROR(shard.remove_blacklist(tenant, key.fingerprint, removed));
    CLM_RETURN_IF_ERROR(tx.commit());
  }
  const std::string k = tenant_key(tenant, key.fingerprint);
  {
    std::lock_guard lock(im.breaker_mutex);
    im.blacklist.erase(k);
    im.blacklist_size = im.blacklist.size();
    im.breaker->forget_key(tenant, key.fingerprint);  // the outcomes that tripped it would trip it again
  }
  if (im.config.on_event) {
    SnapshotStoreEvent e;
    e.kind = SnapshotStoreEvent::Kind::unblacklisted;
    e.tenant = tenant;
    e.key = key.key;
    im.config.on_event(e);
  }
  return {};
} catch (...) {
  return current_exception_status("unblacklist_key");
}

Status SnapshotStore::list_blacklist(std::vector<BlacklistEntry>& out) try {
  Impl& im = *impl_;
  out.clear();
  const std::int64_t now = im.now_ms();
  for (auto& shard : im.shards) {
    const ShardWrite write(*shard);
    CLM_RETURN_IF_ERROR(shard->blacklist_rows([&](store_detail::BlacklistRow& r) {
      if (r.until_ms < now) return;  // expired: no longer in force
      out.push_back({std::move(r.tenant), std::move(r.key), r.fingerprint, r.until_ms, std::move(r.reason), r.by_hand});
    }));
  }
  std::sort(out.begin(), out.end(), [](const BlacklistEntry& a, const BlacklistEntry& b) {
    return std::tie(a.tenant, a.key) < std::tie(b.tenant, b.key);
  });
  return {};
} catch (...) {
  out.clear();
  return current_exception_status("list_blacklist");
}

Status SnapshotStore::pin_version(std::string_view tenant, const SuffixKey& key, std::int32_t version) try {
  CLM_RETURN_IF_ERROR(impl_->writable("pin_version"));
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "pin_version"));
  StoreShard& shard = im.shard_for(tenant, key.group);
  {
    const ShardWrite write(shard);
    shard.forget_choice(choice_key(tenant, key.fingerprint));  // what level 1 serves changes
    std::vector<store_detail::VersionRow> rows;
    CLM_RETURN_IF_ERROR(shard.version_rows(tenant, key, rows));
    const auto it =
        std::find_if(rows.begin(), rows.end(), [&](const store_detail::VersionRow& r) { return r.version == version; });
    if (it == rows.end()) {
      return not_found(fmt::format("pin_version: key \"{}\" has no version {}", key.key, version));
    }
    if (!it->readable) {
      return failed_precondition(
          fmt::format("pin_version: version {} of key \"{}\" is unreadable (its checksum fails)", version, key.key));
    }
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    CLM_RETURN_IF_ERROR(shard.put_pin(tenant, key, version, im.now_ms() / 1000));
    CLM_RETURN_IF_ERROR(tx.commit());
    // Set under the shard lock: no lookup of this key sees the old choice after the commit.
    std::lock_guard lock(im.pin_mutex);
    im.pins[tenant_key(tenant, key.fingerprint)] = version;
    im.pins_size = im.pins.size();
  }
  return {};
} catch (...) {
  return current_exception_status("pin_version");
}

Status SnapshotStore::unpin_version(std::string_view tenant, const SuffixKey& key) try {
  CLM_RETURN_IF_ERROR(impl_->writable("unpin_version"));
  Impl& im = *impl_;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "unpin_version"));
  if (im.pinned_version(tenant, key.fingerprint) == 0) {
    return not_found(fmt::format("unpin_version: key \"{}\" has no pinned version", key.key));
  }
  StoreShard& shard = im.shard_for(tenant, key.group);
  const ShardWrite write(shard);
  shard.forget_choice(choice_key(tenant, key.fingerprint));  // what level 1 serves changes
  store_detail::ShardTransaction tx(shard);
  CLM_RETURN_IF_ERROR(tx.begin());
  bool removed = false;
  CLM_RETURN_IF_ERROR(shard.remove_pin(tenant, key.fingerprint, removed));
  CLM_RETURN_IF_ERROR(tx.commit());
  std::lock_guard lock(im.pin_mutex);
  im.pins.erase(tenant_key(tenant, key.fingerprint));
  im.pins_size = im.pins.size();
  return {};
} catch (...) {
  return current_exception_status("unpin_version");
}

Status SnapshotStore::roll_back(std::string_view tenant, const SuffixKey& key, std::int32_t version,
                                std::int64_t& rows_deleted) try {
  CLM_RETURN_IF_ERROR(impl_->writable("roll_back"));
  Impl& im = *impl_;
  rows_deleted = 0;
  CLM_RETURN_IF_ERROR(check_key(key, tenant, "roll_back"));
  const std::int32_t s = im.shard_of(tenant, key.group);
  StoreShard& shard = *im.shards[static_cast<std::size_t>(s)];
  const std::string k = tenant_key(tenant, key.fingerprint);
  std::vector<std::int64_t> ids;
  std::vector<HnswIndex::PendingSave> saves;
  {
    ShardWrite write(shard);
    shard.forget_choice(choice_key(tenant, key.fingerprint));  // what level 1 serves changes
    std::vector<store_detail::VersionRow> rows;
    CLM_RETURN_IF_ERROR(shard.version_rows(tenant, key, rows));
    if (std::none_of(rows.begin(), rows.end(), [&](const auto& r) { return r.version == version; })) {
      return not_found(fmt::format("roll_back: key \"{}\" has no version {}", key.key, version));
    }
    const std::int32_t pinned = im.pinned_version(tenant, key.fingerprint);
    store_detail::ShardTransaction tx(shard);
    CLM_RETURN_IF_ERROR(tx.begin());
    CLM_RETURN_IF_ERROR(shard.delete_key_rows(tenant, key, version, ids));
    bool unpinned = false;
    if (pinned > version) CLM_RETURN_IF_ERROR(shard.remove_pin(tenant, key.fingerprint, unpinned));
    CLM_RETURN_IF_ERROR(tx.commit());
    if (unpinned) {
      std::lock_guard lock(im.pin_mutex);
      im.pins.erase(k);
      im.pins_size = im.pins.size();
    }
    im.unindex(s, std::string(tenant), ids);
    CLM_RETURN_IF_ERROR(shard.begin_index_saves(true, saves));
  }
  im.forget_drift(k);  // the window described the versions rolled back
  rows_deleted = static_cast<std::int64_t>(ids.size());
  im.count([&](SnapshotStoreMetrics& x) { x.snapshots -= rows_deleted; });
  return shard.finish_saves(saves);
} catch (...) {
  return current_exception_status("roll_back");
}

}  // namespace clm
