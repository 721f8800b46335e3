// lib/store/store_shard.cpp: one shard of the snapshot store (store_shard.hpp):
// its SQLite schema, pragmas and prepared statements, and its index files.
#include "store_shard.hpp"

#include <algorithm>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "clm/store/snapshot_blob.hpp"

namespace clm::store_detail {

namespace {

// auto_vacuum must be set before the first table exists; it is a no-op on an
// existing database, whose mode was fixed when it was made.
constexpr const char* kPragmas =
    "PRAGMA auto_vacuum = INCREMENTAL;"
    "PRAGMA journal_mode = WAL;"
    "PRAGMA synchronous = NORMAL;"
    "PRAGMA foreign_keys = OFF;";

// The design's table (docs/snapshot-store.md) plus the tenant, the readable
// key, the group level 2 filters on, the BLOB's dim, dtype and checksum, and
// the confirmations that make a version stable. Times are Unix seconds.
constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS semantic_snapshots ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  suffix_hash INTEGER NOT NULL,"
    "  version INTEGER NOT NULL DEFAULT 1,"
    "  snapshot BLOB NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  last_used INTEGER NOT NULL,"
    "  usage_count INTEGER NOT NULL DEFAULT 0,"
    "  tenant BLOB NOT NULL,"
    "  suffix_key TEXT NOT NULL,"
    "  group_hash INTEGER NOT NULL,"
    "  dim INTEGER NOT NULL,"
    "  dtype TEXT NOT NULL,"
    "  checksum INTEGER NOT NULL,"
    "  confirmations INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS idx_hash_version ON semantic_snapshots(suffix_hash, version);"
    "CREATE INDEX IF NOT EXISTS idx_tenant_id ON semantic_snapshots(tenant, id);"
    "CREATE TABLE IF NOT EXISTS suffix_sightings ("
    "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL,"
    "  seen INTEGER NOT NULL, last_seen INTEGER NOT NULL,"
    "  PRIMARY KEY (tenant, suffix_hash, suffix_key)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS blacklist ("
    "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL, until_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (tenant, suffix_hash)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS fallback_snapshots ("
    "  tenant BLOB NOT NULL, name TEXT NOT NULL, snapshot BLOB NOT NULL, dim INTEGER NOT NULL,"
    "  checksum INTEGER NOT NULL, PRIMARY KEY (tenant, name)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS store_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;";

constexpr std::int64_t kFormat = 1;

std::int64_t as_signed(std::uint64_t v) { return static_cast<std::int64_t>(v); }  // SQLite stores i64

std::string tenant_file_tag(std::string_view tenant) { return fmt::format("{:016x}", key_fingerprint(tenant)); }

}  // namespace

int StoreShard::busy_handler(void* self, int /*count*/) {
  auto* shard = static_cast<StoreShard*>(self);
  if (std::chrono::steady_clock::now() >= shard->busy_deadline_) return 0;  // give up: SQLITE_BUSY
  std::this_thread::sleep_for(std::chrono::microseconds(50));
  return 1;
}

Status StoreShard::open(const ShardSettings& settings, std::unique_ptr<StoreShard>& out) {
  std::unique_ptr<StoreShard> shard(new StoreShard(settings));
  const std::string path =
      settings.dir.empty() ? std::string(":memory:") : fmt::format("{}/shard-{:02}.db", settings.dir, settings.index);
  Status s = shard->db_.open(path);
  if (s.ok()) {
    sqlite3_busy_handler(shard->db_.handle(), &StoreShard::busy_handler, shard.get());
    shard->set_write_deadline();
    s = shard->db_.exec(kPragmas);
  }
  if (s.ok()) s = shard->db_.exec(kSchema);
  if (s.ok()) s = shard->prepare_all();
  if (s.ok()) s = shard->check_meta();
  if (!s.ok()) return {s.code(), fmt::format("snapshot store {}: {}", path, s.message())};
  out = std::move(shard);
  return {};
}

Status StoreShard::prepare_all() {
  struct {
    const char* sql;
    Statement* stmt;
  } const all[] = {
      {"SELECT id, version, confirmations, snapshot, checksum FROM semantic_snapshots"
       " WHERE suffix_hash = ?1 AND tenant = ?2 AND suffix_key = ?3 ORDER BY version DESC",
       &versions_},
      {"SELECT version, confirmations, snapshot, checksum FROM semantic_snapshots WHERE id = ?1", &row_},
      {"SELECT DISTINCT tenant FROM semantic_snapshots", &tenants_},
      {"SELECT id, suffix_hash, group_hash, version, suffix_key, snapshot, checksum FROM semantic_snapshots"
       " WHERE tenant = ?1 AND id > ?2 ORDER BY id",
       &tenant_rows_},
      {"SELECT id, suffix_hash, group_hash, version, suffix_key FROM semantic_snapshots"
       " WHERE tenant = ?1 AND id > ?2 ORDER BY id",
       &tenant_labels_},
      {"SELECT count(*) FROM semantic_snapshots", &count_rows_},
      {"BEGIN IMMEDIATE", &begin_},
      {"COMMIT", &commit_},
      {"ROLLBACK", &rollback_},
      {"INSERT INTO suffix_sightings (tenant, suffix_hash, suffix_key, seen, last_seen) VALUES (?1, ?2, ?3, 1, ?4)"
       " ON CONFLICT DO UPDATE SET seen = seen + 1, last_seen = excluded.last_seen RETURNING seen",
       &see_},
      {"DELETE FROM suffix_sightings WHERE tenant = ?1 AND suffix_hash = ?2 AND suffix_key = ?3", &forget_},
      {"INSERT INTO semantic_snapshots (suffix_hash, version, snapshot, created_at, last_used, usage_count, tenant,"
       " suffix_key, group_hash, dim, dtype, checksum, confirmations)"
       " VALUES (?1, ?2, ?3, ?4, ?4, 0, ?5, ?6, ?7, ?8, 'f16', ?9, 0)",
       &insert_},
      {"UPDATE semantic_snapshots SET confirmations = confirmations + 1 WHERE id = ?1", &confirm_},
      {"UPDATE semantic_snapshots SET usage_count = usage_count + ?2, last_used = max(last_used, ?3) WHERE id = ?1",
       &usage_},
      {"INSERT OR REPLACE INTO blacklist (tenant, suffix_hash, suffix_key, until_ms) VALUES (?1, ?2, ?3, ?4)",
       &blacklist_put_},
      {"SELECT tenant, suffix_hash, until_ms FROM blacklist", &blacklist_all_},
      {"INSERT OR REPLACE INTO fallback_snapshots (tenant, name, snapshot, dim, checksum) VALUES (?1, ?2, ?3, ?4, ?5)",
       &fallback_put_},
      {"SELECT tenant, name, snapshot, dim, checksum FROM fallback_snapshots", &fallback_all_},
      {"SELECT id, tenant FROM semantic_snapshots WHERE last_used < ?1 AND usage_count < ?2", &evictable_},
      {"DELETE FROM semantic_snapshots WHERE id = ?1", &delete_},
      {"DELETE FROM suffix_sightings WHERE last_seen < ?1", &prune_seen_},
      {"DELETE FROM blacklist WHERE until_ms < ?1", &prune_blacklist_},
  };
  for (const auto& s : all) CLM_RETURN_IF_ERROR(db_.prepare(s.sql, *s.stmt));
  return {};
}

Status StoreShard::check_meta() {
  Statement get, put;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT value FROM store_meta WHERE name = ?1", get));
  CLM_RETURN_IF_ERROR(db_.prepare("INSERT OR IGNORE INTO store_meta (name, value) VALUES (?1, ?2)", put));
  const std::pair<const char*, std::int64_t> expected[] = {{"format", kFormat},
                                                           {"shard", settings_.index},
                                                           {"num_shards", settings_.num_shards},
                                                           {"snapshot_dim", settings_.dim}};
  for (const auto& [name, value] : expected) {
    put.bind_text(1, name);
    put.bind_int(2, value);
    const int rc = put.step();
    put.reset();
    if (rc != SQLITE_DONE) return db_.error(rc, "cannot write store_meta");
    get.bind_text(1, name);
    const int got = get.step();
    const std::int64_t stored = got == SQLITE_ROW ? get.column_int(0) : -1;
    get.reset();
    if (got != SQLITE_ROW) return db_.error(got, "cannot read store_meta");
    if (stored != value) {
      return failed_precondition(fmt::format("snapshot store shard {}: it was created with {} = {}, opened with {}",
                                             settings_.index, name, stored, value));
    }
  }
  return {};
}

std::string StoreShard::index_path(std::string_view tenant) const {
  return fmt::format("{}/shard-{:02}.{}.hnsw", settings_.dir, settings_.index, tenant_file_tag(tenant));
}

Status StoreShard::done(int rc, std::string_view what) {
  last_rc_busy_ = db_.is_busy(rc);
  if (rc == SQLITE_DONE || rc == SQLITE_OK) return {};
  return db_.error(rc, what);
}

namespace {
// Decodes a row's BLOB; an empty vector when its checks fail.
void decode_into(std::span<const std::uint8_t> blob, std::int32_t dim, std::uint64_t checksum,
                 std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(dim));
  if (!decode_snapshot_blob(blob, dim, checksum, out).ok()) out.clear();
}
}  // namespace

Status StoreShard::versions(std::string_view tenant, const SuffixKey& key,
                            const std::function<bool(SnapshotRow&)>& each) {
  const ResetOnExit reset_on_exit(versions_);
  versions_.bind_int(1, as_signed(key.fingerprint));
  versions_.bind_blob(2, tenant);
  versions_.bind_text(3, key.key);
  SnapshotRow r;
  int rc;
  while ((rc = versions_.step()) == SQLITE_ROW) {
    r.id = versions_.column_int(0);
    r.version = static_cast<std::int32_t>(versions_.column_int(1));
    r.confirmations = versions_.column_int(2);
    decode_into(versions_.column_blob(3), settings_.dim, static_cast<std::uint64_t>(versions_.column_int(4)), r.vector);
    if (!each(r)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  return done(rc, "reading a key's versions");
}

Status StoreShard::row(std::int64_t id, SnapshotRow& out, bool& found) {
  const ResetOnExit reset_on_exit(row_);
  row_.bind_int(1, id);
  const int rc = row_.step();
  found = rc == SQLITE_ROW;
  if (found) {
    out.id = id;
    out.version = static_cast<std::int32_t>(row_.column_int(0));
    out.confirmations = row_.column_int(1);
    decode_into(row_.column_blob(2), settings_.dim, static_cast<std::uint64_t>(row_.column_int(3)), out.vector);
  }
  return done(found ? SQLITE_DONE : rc, "reading a row");
}

Status StoreShard::tenants(std::vector<std::string>& out) {
  const ResetOnExit reset_on_exit(tenants_);
  out.clear();
  int rc;
  while ((rc = tenants_.step()) == SQLITE_ROW) {
    const auto b = tenants_.column_blob(0);
    out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return done(rc, "listing tenants");
}

namespace {
// Columns 1-4 of tenant_rows_ and tenant_labels_: what an index label stands for.
void read_label(const Statement& row, LabelInfo& info) {
  info.fingerprint = static_cast<std::uint64_t>(row.column_int(1));
  info.group = static_cast<std::uint64_t>(row.column_int(2));
  info.version = static_cast<std::int32_t>(row.column_int(3));
  info.key.assign(row.column_text(4));
}
}  // namespace

Status StoreShard::tenant_rows(std::string_view tenant, std::int64_t after_id,
                               const std::function<void(std::int64_t, const LabelInfo&, std::vector<float>&)>& each) {
  const ResetOnExit reset_on_exit(tenant_rows_);
  tenant_rows_.bind_blob(1, tenant);
  tenant_rows_.bind_int(2, after_id);
  LabelInfo info;
  std::vector<float> v;
  int rc;
  while ((rc = tenant_rows_.step()) == SQLITE_ROW) {
    read_label(tenant_rows_, info);
    decode_into(tenant_rows_.column_blob(5), settings_.dim, static_cast<std::uint64_t>(tenant_rows_.column_int(6)), v);
    each(tenant_rows_.column_int(0), info, v);
  }
  return done(rc, "reading a tenant's rows");
}

Status StoreShard::tenant_labels(std::string_view tenant, std::int64_t after_id,
                                 const std::function<void(std::int64_t, const LabelInfo&)>& each) {
  const ResetOnExit reset_on_exit(tenant_labels_);
  tenant_labels_.bind_blob(1, tenant);
  tenant_labels_.bind_int(2, after_id);
  LabelInfo info;
  int rc;
  while ((rc = tenant_labels_.step()) == SQLITE_ROW) {
    read_label(tenant_labels_, info);
    each(tenant_labels_.column_int(0), info);
  }
  return done(rc, "reading a tenant's labels");
}

Status StoreShard::count_rows(std::int64_t& out) {
  const int rc = count_rows_.step();
  out = rc == SQLITE_ROW ? count_rows_.column_int(0) : 0;
  count_rows_.reset();
  return done(rc == SQLITE_ROW ? SQLITE_DONE : rc, "counting rows");
}

Status StoreShard::integrity_check() {
  Statement check;
  CLM_RETURN_IF_ERROR(db_.prepare("PRAGMA integrity_check", check));
  std::string report;
  int rc;
  while ((rc = check.step()) == SQLITE_ROW) {
    if (!report.empty()) report += "; ";
    report += check.column_text(0);
  }
  CLM_RETURN_IF_ERROR(done(rc, "PRAGMA integrity_check"));
  if (report != "ok") {
    return {StatusCode::io_error, fmt::format("snapshot store shard {}: integrity_check: {}", settings_.index, report)};
  }
  return {};
}

Status StoreShard::begin() {
  const int rc = begin_.step();
  begin_.reset();
  return done(rc, "BEGIN");
}

Status StoreShard::commit() {
  const int rc = commit_.step();
  commit_.reset();
  return done(rc, "COMMIT");
}

void StoreShard::rollback() {
  if (!sqlite3_get_autocommit(db_.handle())) {
    (void)rollback_.step();
    rollback_.reset();
  }
}

Status StoreShard::count_sighting(std::string_view tenant, const SuffixKey& key, std::int64_t now_s,
                                  std::int64_t& seen) {
  see_.bind_blob(1, tenant);
  see_.bind_int(2, as_signed(key.fingerprint));
  see_.bind_text(3, key.key);
  see_.bind_int(4, now_s);
  int rc = see_.step();
  if (rc == SQLITE_ROW) {
    seen = see_.column_int(0);
    rc = see_.step();
  }
  see_.reset();
  return done(rc, "counting a sighting");
}

Status StoreShard::forget_sightings(std::string_view tenant, const SuffixKey& key) {
  forget_.bind_blob(1, tenant);
  forget_.bind_int(2, as_signed(key.fingerprint));
  forget_.bind_text(3, key.key);
  const int rc = forget_.step();
  forget_.reset();
  return done(rc, "forgetting sightings");
}

Status StoreShard::insert(std::string_view tenant, const SuffixKey& key, std::int32_t version,
                          std::span<const float> unit, std::int64_t now_s, std::int64_t& id) {
  encode_snapshot_blob(unit, blob_);
  insert_.bind_int(1, as_signed(key.fingerprint));
  insert_.bind_int(2, version);
  insert_.bind_blob(3, std::span<const std::uint8_t>(blob_));
  insert_.bind_int(4, now_s);
  insert_.bind_blob(5, tenant);
  insert_.bind_text(6, key.key);
  insert_.bind_int(7, as_signed(key.group));
  insert_.bind_int(8, settings_.dim);
  insert_.bind_int(9, as_signed(snapshot_checksum(blob_)));
  const int rc = insert_.step();
  insert_.reset();
  id = sqlite3_last_insert_rowid(db_.handle());
  return done(rc, "inserting a snapshot");
}

Status StoreShard::confirm(std::int64_t id) {
  confirm_.bind_int(1, id);
  const int rc = confirm_.step();
  confirm_.reset();
  return done(rc, "confirming a version");
}

Status StoreShard::put_blacklist(std::string_view tenant, const SuffixKey& key, std::int64_t until_ms) {
  blacklist_put_.bind_blob(1, tenant);
  blacklist_put_.bind_int(2, as_signed(key.fingerprint));
  blacklist_put_.bind_text(3, key.key);
  blacklist_put_.bind_int(4, until_ms);
  const int rc = blacklist_put_.step();
  blacklist_put_.reset();
  return done(rc, "writing the blacklist");
}

Status StoreShard::put_fallback(std::string_view tenant, std::string_view name, std::span<const float> unit) {
  encode_snapshot_blob(unit, blob_);
  fallback_put_.bind_blob(1, tenant);
  fallback_put_.bind_text(2, name);
  fallback_put_.bind_blob(3, std::span<const std::uint8_t>(blob_));
  fallback_put_.bind_int(4, settings_.dim);
  fallback_put_.bind_int(5, as_signed(snapshot_checksum(blob_)));
  const int rc = fallback_put_.step();
  fallback_put_.reset();
  return done(rc, "writing a fallback snapshot");
}

Status StoreShard::eviction_candidates(std::int64_t unused_before_s, std::int64_t min_usage,
                                       std::vector<std::pair<std::int64_t, std::string>>& out) {
  const ResetOnExit reset_on_exit(evictable_);
  evictable_.bind_int(1, unused_before_s);
  evictable_.bind_int(2, min_usage);
  int rc;
  while ((rc = evictable_.step()) == SQLITE_ROW) {
    const auto t = evictable_.column_blob(1);
    out.emplace_back(evictable_.column_int(0), std::string(reinterpret_cast<const char*>(t.data()), t.size()));
  }
  return done(rc, "finding rows to evict");
}

Status StoreShard::delete_row(std::int64_t id) {
  delete_.bind_int(1, id);
  const int rc = delete_.step();
  delete_.reset();
  return done(rc, "deleting a row");
}

Status StoreShard::prune(std::int64_t seen_before_s, std::int64_t now_ms) {
  prune_seen_.bind_int(1, seen_before_s);
  int rc = prune_seen_.step();
  prune_seen_.reset();
  CLM_RETURN_IF_ERROR(done(rc, "pruning sightings"));
  prune_blacklist_.bind_int(1, now_ms);
  rc = prune_blacklist_.step();
  prune_blacklist_.reset();
  return done(rc, "pruning the blacklist");
}

Status StoreShard::vacuum(std::int64_t& pages) {
  Statement free_pages, vacuum;
  CLM_RETURN_IF_ERROR(db_.prepare("PRAGMA freelist_count", free_pages));
  const int rc = free_pages.step();
  pages = rc == SQLITE_ROW ? free_pages.column_int(0) : 0;
  CLM_RETURN_IF_ERROR(done(rc == SQLITE_ROW ? SQLITE_DONE : rc, "PRAGMA freelist_count"));
  CLM_RETURN_IF_ERROR(db_.prepare("PRAGMA incremental_vacuum", vacuum));
  int v;
  while ((v = vacuum.step()) == SQLITE_ROW) {
  }
  return done(v, "PRAGMA incremental_vacuum");
}

Status StoreShard::load_blacklist(
    const std::function<void(std::string_view tenant, std::uint64_t fp, std::int64_t until)>& each) {
  const ResetOnExit reset_on_exit(blacklist_all_);
  int rc;
  while ((rc = blacklist_all_.step()) == SQLITE_ROW) {
    const auto t = blacklist_all_.column_blob(0);
    each(std::string_view(reinterpret_cast<const char*>(t.data()), t.size()),
         static_cast<std::uint64_t>(blacklist_all_.column_int(1)), blacklist_all_.column_int(2));
  }
  return done(rc, "reading the blacklist");
}

Status StoreShard::load_fallbacks(
    const std::function<void(std::string_view tenant, std::string_view name, std::vector<float>&)>& each,
    std::uint64_t& corrupt) {
  const ResetOnExit reset_on_exit(fallback_all_);
  std::vector<float> v;
  int rc;
  while ((rc = fallback_all_.step()) == SQLITE_ROW) {
    const auto t = fallback_all_.column_blob(0);
    decode_into(fallback_all_.column_blob(2), settings_.dim, static_cast<std::uint64_t>(fallback_all_.column_int(4)),
                v);
    if (v.empty()) {
      ++corrupt;
      continue;
    }
    each(std::string_view(reinterpret_cast<const char*>(t.data()), t.size()), fallback_all_.column_text(1), v);
  }
  return done(rc, "reading fallback snapshots");
}

Status StoreShard::flush_usage(std::int64_t now_s) {
  if (pending_usage_.empty()) return {};
  ShardTransaction tx(*this);
  CLM_RETURN_IF_ERROR(tx.begin());
  for (const auto& [id, n] : pending_usage_) {
    usage_.bind_int(1, id);
    usage_.bind_int(2, n);
    usage_.bind_int(3, now_s);
    const int rc = usage_.step();
    usage_.reset();
    if (rc != SQLITE_DONE) return done(rc, "writing usage counts");
  }
  CLM_RETURN_IF_ERROR(tx.commit());
  pending_usage_.clear();
  return {};
}

TenantIndex& StoreShard::tenant_index(std::string_view tenant) {
  auto it = indexes.find(std::string(tenant));
  if (it == indexes.end()) {
    it = indexes.emplace(std::string(tenant), TenantIndex{}).first;
    it->second.tenant.assign(tenant);
  }
  return it->second;
}

Status StoreShard::begin_index_saves(bool only_dirty, std::vector<HnswIndex::PendingSave>& out) {
  if (settings_.dir.empty()) return {};
  for (auto& [tenant, t] : indexes) {
    if (!t.index || t.rebuilding || (only_dirty && !t.dirty)) continue;
    HnswIndex::PendingSave save;
    CLM_RETURN_IF_ERROR(t.index->write_unsynced(index_path(tenant), save));
    out.push_back(std::move(save));
    t.dirty = false;  // set again by the next change; a failed publish is repaired at the next open
  }
  return {};
}

Status StoreShard::finish_saves(const std::vector<HnswIndex::PendingSave>& saves) {
  std::lock_guard lock(save_mutex);
  Status first;
  for (const auto& save : saves) {
    Status s = HnswIndex::publish(save);
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace clm::store_detail
