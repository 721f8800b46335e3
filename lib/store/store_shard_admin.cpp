// lib/store/store_shard_admin.cpp: what an administrator does to one shard
// (store_shard.hpp, "administration"): a key's versions, deleting a key, its
// newer versions or a whole tenant, the blacklist by hand, pinned versions.
// Rare calls: each prepares its statements when it runs.
#include <fmt/format.h>

#include "clm/store/snapshot_blob.hpp"
#include "store_shard.hpp"

namespace clm::store_detail {

namespace {
std::int64_t as_signed(std::uint64_t v) { return static_cast<std::int64_t>(v); }  // SQLite stores i64
std::string blob_string(std::span<const std::uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }
}  // namespace

Status StoreShard::version_rows(std::string_view tenant, const SuffixKey& key, std::vector<VersionRow>& out) {
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT s.id, s.version, s.created_at, coalesce(u.last_used, s.created_at),"
                  " coalesce(u.usage_count, 0), s.confirmations, s.snapshot, s.checksum"
                  " FROM semantic_snapshots s LEFT JOIN usage.snapshot_usage u ON u.id = s.id"
                  " WHERE s.suffix_hash = ?1 AND s.tenant = ?2 AND s.suffix_key = ?3 ORDER BY s.version DESC",
                  q));
  q.bind_int(1, as_signed(key.fingerprint));
  q.bind_blob(2, tenant);
  q.bind_text(3, key.key);
  out.clear();
  std::vector<float> scratch(static_cast<std::size_t>(settings_.dim));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    VersionRow r;
    r.id = q.column_int(0);
    r.version = static_cast<std::int32_t>(q.column_int(1));
    r.created_at_s = q.column_int(2);
    r.last_used_s = q.column_int(3);
    r.usage_count = q.column_int(4) + pending_usage_of(r.id);
    r.confirmations = q.column_int(5);
    r.readable =
        decode_snapshot_blob(q.column_blob(6), settings_.dim, static_cast<std::uint64_t>(q.column_int(7)), scratch)
            .ok();
    out.push_back(r);
  }
  return done(rc, "reading a key's versions");
}

Status StoreShard::delete_key_rows(std::string_view tenant, const SuffixKey& key, std::int32_t above,
                                   std::vector<std::int64_t>& ids) {
  Statement find, erase;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT id FROM semantic_snapshots WHERE suffix_hash = ?1 AND tenant = ?2 AND "
                  "suffix_key = ?3 AND version > ?4",
                  find));
  find.bind_int(1, as_signed(key.fingerprint));
  find.bind_blob(2, tenant);
  find.bind_text(3, key.key);
  find.bind_int(4, above);
  ids.clear();
  int rc;
  while ((rc = find.step()) == SQLITE_ROW) ids.push_back(find.column_int(0));
  CLM_RETURN_IF_ERROR(done(rc, "finding a key's rows"));
  CLM_RETURN_IF_ERROR(
      db_.prepare("DELETE FROM semantic_snapshots WHERE suffix_hash = ?1 AND tenant = ?2 AND "
                  "suffix_key = ?3 AND version > ?4",
                  erase));
  erase.bind_int(1, as_signed(key.fingerprint));
  erase.bind_blob(2, tenant);
  erase.bind_text(3, key.key);
  erase.bind_int(4, above);
  CLM_RETURN_IF_ERROR(done(erase.step(), "deleting a key's rows"));
  for (std::int64_t id : ids) forget_pending_usage(id);
  if (above > 0) return {};
  CLM_RETURN_IF_ERROR(forget_sightings(tenant, key));
  std::int64_t dropped = 0;
  return drop_blacklisted(tenant, key.fingerprint, dropped);  // and the pin
}

Status StoreShard::delete_tenant(std::string_view tenant, TenantDeletion& out) {
  out = {};
  Statement find;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT id FROM semantic_snapshots WHERE tenant = ?1", find));
  find.bind_blob(1, tenant);
  int rc;
  while ((rc = find.step()) == SQLITE_ROW) out.row_ids.push_back(find.column_int(0));
  CLM_RETURN_IF_ERROR(done(rc, "finding a tenant's rows"));
  const std::pair<const char*, std::int64_t*> tables[] = {
      {"DELETE FROM semantic_snapshots WHERE tenant = ?1", nullptr},
      {"DELETE FROM suffix_sightings WHERE tenant = ?1", &out.sightings},
      {"DELETE FROM blacklist WHERE tenant = ?1", &out.blacklist},
      {"DELETE FROM pinned_versions WHERE tenant = ?1", &out.pins},
      {"DELETE FROM fallback_snapshots WHERE tenant = ?1", &out.fallbacks},
  };
  for (const auto& [sql, count] : tables) {
    Statement q;
    CLM_RETURN_IF_ERROR(db_.prepare(sql, q));
    q.bind_blob(1, tenant);
    CLM_RETURN_IF_ERROR(done(q.step(), "deleting a tenant"));
    if (count) *count = sqlite3_changes(db_.handle());
  }
  for (std::int64_t id : out.row_ids) forget_pending_usage(id);
  return {};
}

Status StoreShard::remove_blacklist(std::string_view tenant, std::uint64_t fingerprint, bool& removed) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM blacklist WHERE tenant = ?1 AND suffix_hash = ?2", q));
  q.bind_blob(1, tenant);
  q.bind_int(2, as_signed(fingerprint));
  CLM_RETURN_IF_ERROR(done(q.step(), "removing a blacklist entry"));
  removed = sqlite3_changes(db_.handle()) > 0;
  return {};
}

Status StoreShard::blacklist_rows(const std::function<void(BlacklistRow&)>& each) {
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT tenant, suffix_hash, suffix_key, until_ms, reason, by_hand FROM blacklist", q));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    BlacklistRow r;
    r.tenant = blob_string(q.column_blob(0));
    r.fingerprint = static_cast<std::uint64_t>(q.column_int(1));
    r.key.assign(q.column_text(2));
    r.until_ms = q.column_int(3);
    r.reason.assign(q.column_text(4));
    r.by_hand = q.column_int(5) != 0;
    each(r);
  }
  return done(rc, "reading the blacklist");
}

Status StoreShard::put_pin(std::string_view tenant, const SuffixKey& key, std::int32_t version, std::int64_t now_s) {
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("INSERT OR REPLACE INTO pinned_versions (tenant, suffix_hash, suffix_key, version, "
                  "pinned_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                  q));
  q.bind_blob(1, tenant);
  q.bind_int(2, as_signed(key.fingerprint));
  q.bind_text(3, key.key);
  q.bind_int(4, version);
  q.bind_int(5, now_s);
  return done(q.step(), "pinning a version");
}

Status StoreShard::remove_pin(std::string_view tenant, std::uint64_t fingerprint, bool& removed) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM pinned_versions WHERE tenant = ?1 AND suffix_hash = ?2", q));
  q.bind_blob(1, tenant);
  q.bind_int(2, as_signed(fingerprint));
  CLM_RETURN_IF_ERROR(done(q.step(), "unpinning a version"));
  removed = sqlite3_changes(db_.handle()) > 0;
  return {};
}

}  // namespace clm::store_detail
