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
    "PRAGMA foreign_keys = OFF;"
    "PRAGMA mmap_size = 268435456;";  // reads map the file: no read() and copy per page (address space only)

// The design's table (docs/snapshot-store.md) plus the tenant, the readable
// key, the group level 2 filters on, the BLOB's dim, dtype and checksum, the
// confirmations that make a version stable, and the text the key was made of
// (NULL for a host's key: rekey keeps those as they are). Times are Unix
// seconds. A fresh database gets it in one transaction with its store_meta.
constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS semantic_snapshots ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  suffix_hash INTEGER NOT NULL,"
    "  version INTEGER NOT NULL DEFAULT 1,"
    "  snapshot BLOB NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  tenant BLOB NOT NULL,"
    "  suffix_key TEXT NOT NULL,"
    "  group_hash INTEGER NOT NULL,"
    "  dim INTEGER NOT NULL,"
    "  dtype TEXT NOT NULL,"
    "  checksum INTEGER NOT NULL,"
    "  confirmations INTEGER NOT NULL DEFAULT 0,"
    "  source_text TEXT);"
    "CREATE INDEX IF NOT EXISTS idx_hash_version ON semantic_snapshots(suffix_hash, version);"
    "CREATE INDEX IF NOT EXISTS idx_tenant_id ON semantic_snapshots(tenant, id);"
    "CREATE TABLE IF NOT EXISTS suffix_sightings ("
    "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL,"
    "  seen INTEGER NOT NULL, last_seen INTEGER NOT NULL,"
    "  PRIMARY KEY (tenant, suffix_hash, suffix_key)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS blacklist ("
    "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL, until_ms INTEGER NOT NULL,"
    "  reason TEXT NOT NULL DEFAULT '', by_hand INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (tenant, suffix_hash)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS pinned_versions ("
    "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL, version INTEGER NOT NULL,"
    "  pinned_at INTEGER NOT NULL, PRIMARY KEY (tenant, suffix_hash)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS fallback_snapshots ("
    "  tenant BLOB NOT NULL, name TEXT NOT NULL, snapshot BLOB NOT NULL, dim INTEGER NOT NULL,"
    "  checksum INTEGER NOT NULL, PRIMARY KEY (tenant, name)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS store_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;";

// A row's use (format 4) lives in a database of its own beside the shard's
// (shard-NN.usage.db, attached as `usage`): the background thread writes the
// counts there on its own connection, and a write to the shard's own file
// would make every lookup of that connection start over (SQLite drops a
// connection's page cache and map when another connection commits to its
// file). A row without a usage row was never used: its last use is its
// creation. Row ids are never reused (AUTOINCREMENT), so a usage row whose
// snapshot row is gone counts for nothing; evict() sweeps them.
constexpr const char* kUsageSchema =
    "PRAGMA usage.auto_vacuum = INCREMENTAL;"
    "PRAGMA usage.journal_mode = WAL;"
    "PRAGMA usage.synchronous = NORMAL;"
    "CREATE TABLE IF NOT EXISTS usage.snapshot_usage ("
    "  id INTEGER PRIMARY KEY, usage_count INTEGER NOT NULL, last_used INTEGER NOT NULL);";

// Adds lookups to a row's usage (the table of whichever schema is named).
constexpr const char* kUsageUpsert =
    "INSERT INTO {}snapshot_usage (id, usage_count, last_used) VALUES (?1, ?2, ?3)"
    " ON CONFLICT (id) DO UPDATE SET usage_count = usage_count + excluded.usage_count,"
    " last_used = max(last_used, excluded.last_used)";

// Rekey's tables, there only while a rekey runs (store_meta rekey_to marks
// it): rows leaving this shard for another (their old id kept), and the
// (shard, id) of rows received from another's outbox, so that a rekey run
// again after a crash never delivers a row twice.
constexpr const char* kRekeySchema =
    "CREATE TABLE IF NOT EXISTS rekey_outbox ("
    "  id INTEGER PRIMARY KEY, suffix_hash INTEGER NOT NULL, version INTEGER NOT NULL, snapshot BLOB NOT NULL,"
    "  created_at INTEGER NOT NULL, last_used INTEGER NOT NULL, usage_count INTEGER NOT NULL, tenant BLOB NOT NULL,"
    "  suffix_key TEXT NOT NULL, group_hash INTEGER NOT NULL, dim INTEGER NOT NULL, dtype TEXT NOT NULL,"
    "  checksum INTEGER NOT NULL, confirmations INTEGER NOT NULL, source_text TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS rekey_inbox ("
    "  shard INTEGER NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (shard, id)) WITHOUT ROWID;";

std::int64_t as_signed(std::uint64_t v) { return static_cast<std::int64_t>(v); }  // SQLite stores i64

std::string tenant_file_tag(std::string_view tenant) { return fmt::format("{:016x}", key_fingerprint(tenant)); }

std::string hex(std::int64_t v) { return fmt::format("{:016x}", static_cast<std::uint64_t>(v)); }

}  // namespace

int StoreShard::busy_handler(void* self, int /*count*/) {
  auto* shard = static_cast<StoreShard*>(self);
  if (std::chrono::steady_clock::now() >= shard->busy_deadline_) return 0;  // give up: SQLITE_BUSY
  std::this_thread::sleep_for(std::chrono::microseconds(50));
  return 1;
}

std::string StoreShard::db_path() const {
  return settings_.dir.empty() ? std::string(":memory:")
                               : fmt::format("{}/shard-{:02}.db", settings_.dir, settings_.index);
}

std::string StoreShard::usage_path() const {
  return settings_.dir.empty() ? std::string(":memory:")
                               : fmt::format("{}/shard-{:02}.usage.db", settings_.dir, settings_.index);
}

Status StoreShard::attach_usage() {
  const std::string path = usage_path();  // bound, not copied: kept until the step
  std::error_code ec;
  if (settings_.read_only && !std::filesystem::exists(path, ec)) {  // a writer's start makes it
    return failed_precondition(
        fmt::format("shard {} has no usage database ({}): open the store once read-write", settings_.index, path));
  }
  Statement attach;
  CLM_RETURN_IF_ERROR(db_.prepare("ATTACH DATABASE ?1 AS usage", attach));
  attach.bind_text(1, path);
  CLM_RETURN_IF_ERROR(done(attach.step(), "attaching the usage database"));
  if (settings_.read_only) return {};
  return db_.exec(kUsageSchema);
}

Status StoreShard::copy_usage_out() {
  // Only the rows ever used: a row without usage was last used when made.
  return run(
      "INSERT OR REPLACE INTO usage.snapshot_usage (id, usage_count, last_used)"
      " SELECT id, usage_count, last_used FROM main.semantic_snapshots"
      " WHERE usage_count > 0 OR last_used > created_at",
      "migrating: the usage counts");
}

Status StoreShard::connect() {
  CLM_RETURN_IF_ERROR(db_.open(db_path(), settings_.read_only));
  connected_ = true;
  sqlite3_busy_handler(db_.handle(), &StoreShard::busy_handler, this);
  set_write_deadline();
  return {};
}

Status StoreShard::open(const ShardSettings& settings, std::unique_ptr<StoreShard>& out) {
  std::unique_ptr<StoreShard> shard(new StoreShard(settings));
  const std::string path = shard->db_path();
  std::error_code ec;
  if (settings.dir.empty() || !std::filesystem::exists(path, ec)) {  // made by start(), after every check
    if (settings.read_only) {
      return not_found(fmt::format("snapshot store {}: no shard {} to open read-only", settings.dir, settings.index));
    }
    out = std::move(shard);
    return {};
  }
  auto failed = [&](const Status& s) -> Status {
    return {s.code(), fmt::format("snapshot store {}: {}", path, s.message())};
  };
  if (Status s = shard->connect(); !s.ok()) return failed(s);
  // Reads only: a database with no table yet (a creation that did not
  // commit) is fresh; one without store_meta is not a store's.
  Statement tables;
  if (Status s = shard->db_.prepare("SELECT count(*), coalesce(sum(name = 'store_meta' AND type = 'table'), 0)"
                                    " FROM sqlite_master",
                                    tables);
      !s.ok()) {
    return failed(s);
  }
  const int rc = tables.step();
  if (rc != SQLITE_ROW) return failed(shard->db_.error(rc, "reading the schema"));
  const std::int64_t n_tables = tables.column_int(0), has_meta = tables.column_int(1);
  tables.reset();
  shard->fresh_ = n_tables == 0;
  if (!shard->fresh_) {
    if (!has_meta) {
      return failed_precondition(
          fmt::format("snapshot store {}: not a snapshot store shard (no store_meta table)", path));
    }
    Statement meta;
    if (Status s = shard->db_.prepare("SELECT name, value FROM store_meta", meta); !s.ok()) return failed(s);
    int m;
    while ((m = meta.step()) == SQLITE_ROW) shard->meta_[std::string(meta.column_text(0))] = meta.column_int(1);
    if (m != SQLITE_DONE) return failed(shard->db_.error(m, "reading store_meta"));
  }
  out = std::move(shard);
  return {};
}

std::optional<std::int64_t> StoreShard::meta_value(const std::string& name) const {
  const auto it = meta_.find(name);
  if (it == meta_.end()) return std::nullopt;
  return it->second;
}

Status StoreShard::check_shape() const {
  if (fresh_) return {};
  const std::string path = db_path();
  const std::int64_t format = this->format();
  if (format < 1) return failed_precondition(fmt::format("snapshot store {}: store_meta has no valid format", path));
  if (format > kStoreFormat) {
    return failed_precondition(
        fmt::format("snapshot store {}: store format {}, made by a newer clmcache (this one reads format {} at most)",
                    path, format, kStoreFormat));
  }
  const std::pair<const char*, std::int64_t> expected[] = {
      {"shard", settings_.index}, {"num_shards", settings_.num_shards}, {"snapshot_dim", settings_.dim}};
  for (const auto& [name, value] : expected) {
    const std::optional<std::int64_t> stored = meta_value(name);
    if (!stored) return failed_precondition(fmt::format("snapshot store {}: store_meta lacks {}", path, name));
    if (*stored != value) {
      return failed_precondition(fmt::format("snapshot store shard {}: it was created with {} = {}, opened with {}",
                                             settings_.index, name, *stored, value));
    }
  }
  return {};
}

Status StoreShard::check_serving() const {
  CLM_RETURN_IF_ERROR(check_shape());
  if (fresh_) return {};
  const std::string& dir = settings_.dir;
  const std::string rules = hex(static_cast<std::int64_t>(settings_.key_rules));
  if (format() == 1) {
    return failed_precondition(fmt::format(
        "snapshot store {}: made by an older clmcache (store format 1, shard {}): its keys carry neither their text "
        "nor the key rules they were made under, so this keyer (rules {}) may not match them. Run `clm_store rekey "
        "--adopt {}` to keep its keys under the current rules (check a few lookups afterwards)",
        dir, settings_.index, rules, dir));
  }
  if (const auto to = meta_value("rekey_to")) {
    return failed_precondition(fmt::format(
        "snapshot store {}: a rekey (to key rules {}) was interrupted: shard {} is half done. Run `clm_store rekey "
        "{}` again to finish it",
        dir, hex(*to), settings_.index, dir));
  }
  const std::optional<std::int64_t> recorded = meta_value("key_rules");
  if (!recorded) {
    return failed_precondition(fmt::format(
        "snapshot store {}: shard {} records no key rules. Run `clm_store rekey --adopt {}` to record the current "
        "ones ({})",
        dir, settings_.index, dir, rules));
  }
  if (static_cast<std::uint64_t>(*recorded) != settings_.key_rules) {
    return failed_precondition(fmt::format(
        "snapshot store {}: its keys were made under key rules {}, this keyer's are {} (other lexicons, entity "
        "patterns or clmcache version): the same text would get another key. Run `clm_store rekey {}` to rebuild "
        "the keys from their texts, or `clm_store rekey --adopt {}` to keep the old keys",
        dir, hex(*recorded), rules, dir, dir));
  }
  return {};
}

Status StoreShard::start(bool serving) {
  const std::string path = db_path();
  auto failed = [&](const Status& s) -> Status {
    return {s.code(), fmt::format("snapshot store {}: {}", path, s.message())};
  };
  if (!connected_) {
    if (Status s = connect(); !s.ok()) return failed(s);
  }
  if (settings_.read_only) {
    if (fresh_) return not_found(fmt::format("snapshot store {}: shard {} holds no store yet", path, settings_.index));
    if (format() < kStoreFormat) {
      return failed_precondition(fmt::format(
          "snapshot store {}: store format {} must be migrated first: open it once read-write", path, format()));
    }
    if (Status s = attach_usage(); !s.ok()) return failed(s);
    // No pragma that could write: query_only makes any write an error too.
    if (Status s = db_.exec("PRAGMA query_only = ON; PRAGMA mmap_size = 268435456;"); !s.ok()) return failed(s);
    if (serving) {
      if (Status s = prepare_all(); !s.ok()) return failed(s);
    }
    return {};
  }
  // auto_vacuum must be set before the first table exists (a no-op on an
  // existing database); journal_mode cannot change inside a transaction.
  if (Status s = db_.exec(kPragmas); !s.ok()) return failed(s);
  if (Status s = attach_usage(); !s.ok()) return failed(s);
  usage_upsert_ = fmt::format(kUsageUpsert, "usage.");
  if (Status s = db_.prepare("BEGIN IMMEDIATE", begin_); !s.ok()) return failed(s);
  if (Status s = db_.prepare("COMMIT", commit_); !s.ok()) return failed(s);
  if (Status s = db_.prepare("ROLLBACK", rollback_); !s.ok()) return failed(s);
  if (fresh_) {
    ShardTransaction tx(*this);
    Status s = tx.begin();
    if (s.ok()) s = db_.exec(kSchema);
    const std::pair<const char*, std::int64_t> meta[] = {{"format", kStoreFormat},
                                                         {"shard", settings_.index},
                                                         {"num_shards", settings_.num_shards},
                                                         {"snapshot_dim", settings_.dim},
                                                         {"key_rules", as_signed(settings_.key_rules)}};
    for (const auto& [name, value] : meta) {
      if (s.ok()) s = put_meta(name, value);
      if (s.ok()) meta_[name] = value;
    }
    if (s.ok()) s = tx.commit();
    if (!s.ok()) return failed(s);
    fresh_ = false;
  } else if (format() < kStoreFormat) {
    {  // formats 1-3 keep the counts in their rows: copied out first, committed on their own
      ShardTransaction tx(*this);
      Status s = tx.begin();
      if (s.ok()) s = copy_usage_out();
      if (s.ok()) s = tx.commit();
      if (!s.ok()) return failed(s);
    }
    if (format() >= 2) {  // a format-1 store migrates when adopted
      ShardTransaction tx(*this);
      Status s = tx.begin();
      if (s.ok()) s = migrate();
      if (s.ok()) s = tx.commit();
      if (!s.ok()) return failed(s);
    }
  }
  if (serving) {
    if (Status s = prepare_all(); !s.ok()) return failed(s);
  }
  return {};
}

Status StoreShard::put_meta(std::string_view name, std::int64_t value) {
  Statement put;
  CLM_RETURN_IF_ERROR(db_.prepare("INSERT OR REPLACE INTO store_meta (name, value) VALUES (?1, ?2)", put));
  put.bind_text(1, name);
  put.bind_int(2, value);
  return done(put.step(), "writing store_meta");
}

Status StoreShard::run(const char* sql, std::string_view what) {
  Statement stmt;
  CLM_RETURN_IF_ERROR(db_.prepare(sql, stmt));
  int rc;
  while ((rc = stmt.step()) == SQLITE_ROW) {
  }
  return done(rc, what);
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
      {"SELECT version, confirmations, snapshot, checksum, suffix_hash, tenant, suffix_key FROM semantic_snapshots"
       " WHERE id = ?1",
       &key_row_},
      {"SELECT DISTINCT tenant FROM semantic_snapshots", &tenants_},
      {"SELECT id, suffix_hash, group_hash, version, suffix_key, snapshot, checksum FROM semantic_snapshots"
       " WHERE tenant = ?1 AND id > ?2 ORDER BY id",
       &tenant_rows_},
      {"SELECT id, suffix_hash, group_hash, version, suffix_key FROM semantic_snapshots"
       " WHERE tenant = ?1 AND id > ?2 ORDER BY id",
       &tenant_labels_},
      {"SELECT count(*) FROM semantic_snapshots", &count_rows_},
      {"INSERT INTO suffix_sightings (tenant, suffix_hash, suffix_key, seen, last_seen) VALUES (?1, ?2, ?3, 1, ?4)"
       " ON CONFLICT DO UPDATE SET seen = seen + 1, last_seen = excluded.last_seen RETURNING seen",
       &see_},
      {"DELETE FROM suffix_sightings WHERE tenant = ?1 AND suffix_hash = ?2 AND suffix_key = ?3", &forget_},
      {"INSERT INTO semantic_snapshots (suffix_hash, version, snapshot, created_at, tenant,"
       " suffix_key, group_hash, dim, dtype, checksum, confirmations, source_text)"
       " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'f16', ?9, 0, ?10)",
       &insert_},
      {"UPDATE semantic_snapshots SET confirmations = confirmations + 1 WHERE id = ?1", &confirm_},
      {usage_upsert_.c_str(), &usage_},
      {"INSERT OR REPLACE INTO blacklist (tenant, suffix_hash, suffix_key, until_ms, reason, by_hand)"
       " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
       &blacklist_put_},
      {"SELECT tenant, suffix_hash, version FROM pinned_versions", &pins_all_},
      {"SELECT tenant, suffix_hash, until_ms FROM blacklist", &blacklist_all_},
      {"INSERT OR REPLACE INTO fallback_snapshots (tenant, name, snapshot, dim, checksum) VALUES (?1, ?2, ?3, ?4, ?5)",
       &fallback_put_},
      {"SELECT tenant, name, snapshot, dim, checksum FROM fallback_snapshots", &fallback_all_},
      {"SELECT s.id, s.tenant FROM semantic_snapshots s LEFT JOIN usage.snapshot_usage u ON u.id = s.id"
       " WHERE coalesce(u.last_used, s.created_at) < ?1 AND coalesce(u.usage_count, 0) < ?2",
       &evictable_},
      {"DELETE FROM semantic_snapshots WHERE id = ?1", &delete_},
      {"DELETE FROM suffix_sightings WHERE last_seen < ?1", &prune_seen_},
      {"DELETE FROM blacklist WHERE until_ms < ?1", &prune_blacklist_},
      {"DELETE FROM usage.snapshot_usage WHERE id NOT IN (SELECT id FROM main.semantic_snapshots)", &prune_usage_},
  };
  for (const auto& s : all) CLM_RETURN_IF_ERROR(db_.prepare(s.sql, *s.stmt));
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

Status StoreShard::key_row(std::int64_t id, std::string_view tenant, const SuffixKey& key, SnapshotRow& out,
                           bool& found) {
  const ResetOnExit reset_on_exit(key_row_);
  key_row_.bind_int(1, id);
  const int rc = key_row_.step();
  found = false;
  if (rc != SQLITE_ROW) return done(rc, "reading a row");
  const auto t = key_row_.column_blob(5);
  if (static_cast<std::uint64_t>(key_row_.column_int(4)) != key.fingerprint ||
      std::string_view(reinterpret_cast<const char*>(t.data()), t.size()) != tenant ||
      key_row_.column_text(6) != key.key) {
    return {};
  }
  found = true;
  out.id = id;
  out.version = static_cast<std::int32_t>(key_row_.column_int(0));
  out.confirmations = key_row_.column_int(1);
  decode_into(key_row_.column_blob(2), settings_.dim, static_cast<std::uint64_t>(key_row_.column_int(3)), out.vector);
  return {};
}

Status StoreShard::warm_choices(std::int64_t stable_confirmations) {
  struct Choice {
    std::int64_t newest_version = -1, newest_id = 0, stable_version = -1, stable_id = 0;
  };
  std::unordered_map<std::uint64_t, Choice> found;
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT id, tenant, suffix_hash, version, confirmations FROM semantic_snapshots", q));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    const auto t = q.column_blob(1);
    const std::uint64_t k = choice_key(std::string_view(reinterpret_cast<const char*>(t.data()), t.size()),
                                       static_cast<std::uint64_t>(q.column_int(2)));
    // Keys whose choice_key collides share an entry. Its row is then another
    // key's (key_row refuses it: a cache miss) or the key's own choice: a row
    // of the key that is the newest stable of all of them, or the newest with
    // none stable, is the newest stable of its own, or its newest.
    Choice& c = found[k];
    const std::int64_t id = q.column_int(0), version = q.column_int(3);
    if (version > c.newest_version) c.newest_version = version, c.newest_id = id;
    if (q.column_int(4) >= stable_confirmations && version > c.stable_version)
      c.stable_version = version, c.stable_id = id;
  }
  CLM_RETURN_IF_ERROR(done(rc, "reading every key's versions"));
  for (const auto& [k, c] : found) {
    if (choices_.size() >= kMaxChoices) break;
    choices_[k] = c.stable_version >= 0 ? c.stable_id : c.newest_id;
  }
  return {};
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
  if (!key.source.empty()) insert_.bind_text(10, key.source);  // else NULL: a host's key
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

Status StoreShard::put_blacklist(std::string_view tenant, const SuffixKey& key, std::int64_t until_ms,
                                 std::string_view reason, bool by_hand) {
  blacklist_put_.bind_blob(1, tenant);
  blacklist_put_.bind_int(2, as_signed(key.fingerprint));
  blacklist_put_.bind_text(3, key.key);
  blacklist_put_.bind_int(4, until_ms);
  blacklist_put_.bind_text(5, reason);
  blacklist_put_.bind_int(6, by_hand ? 1 : 0);
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
  CLM_RETURN_IF_ERROR(done(rc, "pruning the blacklist"));
  rc = prune_usage_.step();
  prune_usage_.reset();
  return done(rc, "pruning the usage of deleted rows");
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

Status StoreShard::load_pins(
    const std::function<void(std::string_view tenant, std::uint64_t fp, std::int32_t version)>& each) {
  const ResetOnExit reset_on_exit(pins_all_);
  int rc;
  while ((rc = pins_all_.step()) == SQLITE_ROW) {
    const auto t = pins_all_.column_blob(0);
    each(std::string_view(reinterpret_cast<const char*>(t.data()), t.size()),
         static_cast<std::uint64_t>(pins_all_.column_int(1)), static_cast<std::int32_t>(pins_all_.column_int(2)));
  }
  return done(rc, "reading the pinned versions");
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

Status StoreShard::flush_usage() {
  if (pending_usage_.empty()) return {};
  ShardTransaction tx(*this);
  CLM_RETURN_IF_ERROR(tx.begin());
  for (const auto& [id, use] : pending_usage_) {
    usage_.bind_int(1, id);
    usage_.bind_int(2, use.count);
    usage_.bind_int(3, use.last_s);  // the lookup's time, not the flush's
    const int rc = usage_.step();
    usage_.reset();
    if (rc != SQLITE_DONE) return done(rc, "writing usage counts");
  }
  CLM_RETURN_IF_ERROR(tx.commit());
  pending_usage_.clear();
  return {};
}

Status StoreShard::write_usage_aside(const UsageBatch& batch) {
  if (settings_.dir.empty()) return failed_precondition("an in-memory shard has one connection");
  if (batch.empty()) return {};
  if (!usage_db_open_) {
    CLM_RETURN_IF_ERROR(usage_db_.open(usage_path()));
    sqlite3_busy_timeout(usage_db_.handle(), settings_.write_busy_timeout_ms);
    const std::string upsert = fmt::format(kUsageUpsert, "");
    CLM_RETURN_IF_ERROR(usage_db_.prepare(upsert.c_str(), usage_aside_));
    usage_db_open_ = true;
  }
  CLM_RETURN_IF_ERROR(usage_db_.exec("BEGIN IMMEDIATE"));
  for (const auto& [id, use] : batch) {
    usage_aside_.bind_int(1, id);
    usage_aside_.bind_int(2, use.count);
    usage_aside_.bind_int(3, use.last_s);
    const int rc = usage_aside_.step();
    usage_aside_.reset();
    if (rc != SQLITE_DONE) {
      Status failed = usage_db_.error(rc, "writing usage counts");
      (void)usage_db_.exec("ROLLBACK");
      return failed;
    }
  }
  if (Status s = usage_db_.exec("COMMIT"); !s.ok()) {
    (void)usage_db_.exec("ROLLBACK");
    return s;
  }
  // Copied back into the database file now (PASSIVE: no reader waits), so
  // that the WAL stays short for the lookups that search it.
  (void)sqlite3_wal_checkpoint_v2(usage_db_.handle(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  return {};
}

// ---- maintenance: adopt and rekey ------------------------------------------

Status StoreShard::adopt(std::uint64_t key_rules) {
  if (format() == 1) {
    CLM_RETURN_IF_ERROR(run("ALTER TABLE semantic_snapshots ADD COLUMN source_text TEXT", "adding source_text"));
    CLM_RETURN_IF_ERROR(put_meta("format", 2));
    meta_["format"] = 2;
  }
  CLM_RETURN_IF_ERROR(migrate());
  CLM_RETURN_IF_ERROR(put_meta("key_rules", as_signed(key_rules)));
  meta_["key_rules"] = as_signed(key_rules);
  return {};
}

Status StoreShard::migrate() {
  auto now_format = [&](std::int64_t format) -> Status {
    CLM_RETURN_IF_ERROR(put_meta("format", format));
    meta_["format"] = format;
    return {};
  };
  if (format() == 2) {
    CLM_RETURN_IF_ERROR(run("ALTER TABLE blacklist ADD COLUMN reason TEXT NOT NULL DEFAULT ''", "migrating: reason"));
    CLM_RETURN_IF_ERROR(
        run("ALTER TABLE blacklist ADD COLUMN by_hand INTEGER NOT NULL DEFAULT 0", "migrating: by_hand"));
    CLM_RETURN_IF_ERROR(
        run("CREATE TABLE IF NOT EXISTS pinned_versions ("
            "  tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL,"
            "  version INTEGER NOT NULL, pinned_at INTEGER NOT NULL,"
            "  PRIMARY KEY (tenant, suffix_hash)) WITHOUT ROWID",
            "migrating: pinned_versions"));
    CLM_RETURN_IF_ERROR(now_format(3));
  }
  if (format() == 3) {  // the counts are in the usage database (start()): their columns go
    CLM_RETURN_IF_ERROR(run("ALTER TABLE semantic_snapshots DROP COLUMN usage_count", "migrating: usage_count"));
    CLM_RETURN_IF_ERROR(run("ALTER TABLE semantic_snapshots DROP COLUMN last_used", "migrating: last_used"));
    CLM_RETURN_IF_ERROR(now_format(4));
  }
  return {};
}

Status StoreShard::begin_rekey(std::uint64_t from, std::uint64_t to) {
  if (!meta_value("rekey_from")) {
    CLM_RETURN_IF_ERROR(put_meta("rekey_from", as_signed(from)));
    meta_["rekey_from"] = as_signed(from);
  }
  CLM_RETURN_IF_ERROR(put_meta("rekey_to", as_signed(to)));
  meta_["rekey_to"] = as_signed(to);
  return db_.exec(kRekeySchema);
}

Status StoreShard::rekey_rows(std::int64_t after_id, std::size_t limit, std::vector<RekeyRow>& out) {
  out.clear();
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT id, tenant, suffix_key, suffix_hash, group_hash, source_text IS NULL, source_text"
                  " FROM semantic_snapshots"
                  " WHERE id > ?1 ORDER BY id LIMIT ?2",
                  q));
  q.bind_int(1, after_id);
  q.bind_int(2, static_cast<std::int64_t>(limit));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    RekeyRow r;
    r.id = q.column_int(0);
    const auto t = q.column_blob(1);
    r.tenant.assign(reinterpret_cast<const char*>(t.data()), t.size());
    r.key.assign(q.column_text(2));
    r.fingerprint = static_cast<std::uint64_t>(q.column_int(3));
    r.group = static_cast<std::uint64_t>(q.column_int(4));
    if (q.column_int(5) == 0) r.text = std::string(q.column_text(6));
    out.push_back(std::move(r));
  }
  return done(rc, "reading rows to rekey");
}

Status StoreShard::rekey_update(std::int64_t id, const SuffixKey& key) {
  Statement q;
  CLM_RETURN_IF_ERROR(
      db_.prepare("UPDATE semantic_snapshots SET suffix_key = ?2, suffix_hash = ?3, group_hash = ?4 WHERE id = ?1", q));
  q.bind_int(1, id);
  q.bind_text(2, key.key);
  q.bind_int(3, as_signed(key.fingerprint));
  q.bind_int(4, as_signed(key.group));
  return done(q.step(), "updating a row's key");
}

Status StoreShard::rekey_to_outbox(std::int64_t id) {
  Statement copy, remove;
  CLM_RETURN_IF_ERROR(db_.prepare(
      "INSERT OR REPLACE INTO rekey_outbox (id, suffix_hash, version, snapshot, created_at, last_used, usage_count,"
      " tenant, suffix_key, group_hash, dim, dtype, checksum, confirmations, source_text)"
      " SELECT s.id, s.suffix_hash, s.version, s.snapshot, s.created_at, coalesce(u.last_used, s.created_at),"
      " coalesce(u.usage_count, 0), s.tenant, s.suffix_key, s.group_hash, s.dim, s.dtype, s.checksum,"
      " s.confirmations, s.source_text FROM semantic_snapshots s LEFT JOIN usage.snapshot_usage u ON u.id = s.id"
      " WHERE s.id = ?1",
      copy));
  copy.bind_int(1, id);
  CLM_RETURN_IF_ERROR(done(copy.step(), "moving a row to the outbox"));
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM semantic_snapshots WHERE id = ?1", remove));
  remove.bind_int(1, id);
  return done(remove.step(), "moving a row to the outbox");
}

Status StoreShard::rekey_delete(std::int64_t id) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM semantic_snapshots WHERE id = ?1", q));
  q.bind_int(1, id);
  return done(q.step(), "deleting a row");
}

Status StoreShard::rekey_counts(std::int64_t& rows, std::int64_t& in_outbox) {
  rows = in_outbox = 0;
  if (fresh_) return {};
  Statement q, outbox;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT count(*) FROM semantic_snapshots", q));
  int rc = q.step();
  if (rc != SQLITE_ROW) return done(rc, "counting rows");
  rows = q.column_int(0);
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'rekey_outbox'", outbox));
  rc = outbox.step();
  if (rc != SQLITE_ROW) return done(rc, "reading the schema");
  if (outbox.column_int(0) == 0) return {};
  Statement n;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT count(*) FROM rekey_outbox", n));
  rc = n.step();
  if (rc != SQLITE_ROW) return done(rc, "counting the outbox");
  in_outbox = n.column_int(0);
  return {};
}

Status StoreShard::drop_blacklisted(std::string_view tenant, std::uint64_t fingerprint, std::int64_t& dropped) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM blacklist WHERE tenant = ?1 AND suffix_hash = ?2", q));
  q.bind_blob(1, tenant);
  q.bind_int(2, as_signed(fingerprint));
  CLM_RETURN_IF_ERROR(done(q.step(), "dropping a blacklist entry"));
  dropped += sqlite3_changes(db_.handle());
  if (format() < 3) return {};  // no pins before format 3
  bool unpinned = false;
  return remove_pin(tenant, fingerprint, unpinned);
}

Status StoreShard::drop_sightings(std::int64_t& dropped) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM suffix_sightings", q));
  CLM_RETURN_IF_ERROR(done(q.step(), "dropping sightings"));
  dropped += sqlite3_changes(db_.handle());
  return {};
}

Status StoreShard::outbox_rows(std::int64_t after_id, std::size_t limit, std::vector<MovedRow>& out) {
  out.clear();
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare(
      "SELECT id, version, created_at, last_used, usage_count, dim, checksum, confirmations, snapshot, tenant,"
      " suffix_key, dtype, source_text FROM rekey_outbox WHERE id > ?1 ORDER BY id LIMIT ?2",
      q));
  q.bind_int(1, after_id);
  q.bind_int(2, static_cast<std::int64_t>(limit));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    MovedRow r;
    r.id = q.column_int(0);
    r.version = q.column_int(1);
    r.created_at = q.column_int(2);
    r.last_used = q.column_int(3);
    r.usage_count = q.column_int(4);
    r.dim = q.column_int(5);
    r.checksum = q.column_int(6);
    r.confirmations = q.column_int(7);
    const auto blob = q.column_blob(8);
    r.snapshot.assign(blob.begin(), blob.end());
    const auto t = q.column_blob(9);
    r.tenant.assign(reinterpret_cast<const char*>(t.data()), t.size());
    r.key.assign(q.column_text(10));
    r.dtype.assign(q.column_text(11));
    r.text.assign(q.column_text(12));
    out.push_back(std::move(r));
  }
  return done(rc, "reading the outbox");
}

Status StoreShard::outbox_delete(std::int64_t id) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("DELETE FROM rekey_outbox WHERE id = ?1", q));
  q.bind_int(1, id);
  return done(q.step(), "emptying the outbox");
}

Status StoreShard::inbox(std::vector<std::pair<std::int32_t, std::int64_t>>& out) {
  Statement q;
  CLM_RETURN_IF_ERROR(db_.prepare("SELECT shard, id FROM rekey_inbox", q));
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) out.emplace_back(static_cast<std::int32_t>(q.column_int(0)), q.column_int(1));
  return done(rc, "reading the inbox");
}

Status StoreShard::receive(const MovedRow& row, std::int32_t from_shard, const SuffixKey& key) {
  Statement insert, usage;
  CLM_RETURN_IF_ERROR(
      db_.prepare("INSERT INTO semantic_snapshots (suffix_hash, version, snapshot, created_at, tenant,"
                  " suffix_key, group_hash, dim, dtype, checksum, confirmations, source_text)"
                  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                  insert));
  insert.bind_int(1, as_signed(key.fingerprint));
  insert.bind_int(2, row.version);
  insert.bind_blob(3, std::span<const std::uint8_t>(row.snapshot));
  insert.bind_int(4, row.created_at);
  insert.bind_blob(5, row.tenant);
  insert.bind_text(6, key.key);
  insert.bind_int(7, as_signed(key.group));
  insert.bind_int(8, row.dim);
  insert.bind_text(9, row.dtype);
  insert.bind_int(10, row.checksum);
  insert.bind_int(11, row.confirmations);
  insert.bind_text(12, row.text);
  CLM_RETURN_IF_ERROR(done(insert.step(), "receiving a row"));
  // The row keeps its use under its new id.
  const std::int64_t id = sqlite3_last_insert_rowid(db_.handle());
  if (row.usage_count == 0 && row.last_used <= row.created_at) return record_arrival(from_shard, row.id);
  const std::string upsert = fmt::format(kUsageUpsert, "usage.");
  CLM_RETURN_IF_ERROR(db_.prepare(upsert.c_str(), usage));
  usage.bind_int(1, id);
  usage.bind_int(2, row.usage_count);
  usage.bind_int(3, row.last_used);
  CLM_RETURN_IF_ERROR(done(usage.step(), "receiving a row's usage"));
  return record_arrival(from_shard, row.id);
}

Status StoreShard::record_arrival(std::int32_t from_shard, std::int64_t id) {
  Statement note;
  CLM_RETURN_IF_ERROR(db_.prepare("INSERT OR IGNORE INTO rekey_inbox (shard, id) VALUES (?1, ?2)", note));
  note.bind_int(1, from_shard);
  note.bind_int(2, id);
  return done(note.step(), "receiving a row");
}

Status StoreShard::renumber_versions(std::int64_t& renumbered) {
  struct Version {
    std::int64_t id, version;
  };
  Statement q, update;
  CLM_RETURN_IF_ERROR(
      db_.prepare("SELECT id, tenant, suffix_key, version FROM semantic_snapshots"
                  " ORDER BY tenant, suffix_key, created_at, version, id",
                  q));
  CLM_RETURN_IF_ERROR(db_.prepare("UPDATE semantic_snapshots SET version = ?2 WHERE id = ?1", update));
  std::vector<Version> key_rows, changes;
  std::string tenant, key;
  auto settle = [&] {  // key_rows: one key's versions in created order
    bool increasing = true;
    for (std::size_t i = 1; i < key_rows.size() && increasing; ++i)
      increasing = key_rows[i].version > key_rows[i - 1].version;
    if (increasing) return;
    for (std::size_t i = 0; i < key_rows.size(); ++i) {
      const auto v = static_cast<std::int64_t>(i + 1);
      if (key_rows[i].version != v) changes.push_back({key_rows[i].id, v});
    }
  };
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    const auto t = q.column_blob(1);
    const std::string_view row_tenant(reinterpret_cast<const char*>(t.data()), t.size());
    const std::string_view row_key = q.column_text(2);
    if (key_rows.empty() || row_tenant != tenant || row_key != key) {
      settle();
      key_rows.clear();
      tenant.assign(row_tenant);
      key.assign(row_key);
    }
    key_rows.push_back({q.column_int(0), q.column_int(3)});
  }
  CLM_RETURN_IF_ERROR(done(rc, "reading versions"));
  settle();
  for (const Version& c : changes) {
    update.bind_int(1, c.id);
    update.bind_int(2, c.version);
    const int u = update.step();
    update.reset();
    CLM_RETURN_IF_ERROR(done(u, "renumbering versions"));
  }
  renumbered += static_cast<std::int64_t>(changes.size());
  return {};
}

Status StoreShard::finish_rekey(std::uint64_t key_rules) {
  CLM_RETURN_IF_ERROR(run("DROP TABLE IF EXISTS rekey_outbox", "dropping the outbox"));
  CLM_RETURN_IF_ERROR(run("DROP TABLE IF EXISTS rekey_inbox", "dropping the inbox"));
  CLM_RETURN_IF_ERROR(put_meta("key_rules", as_signed(key_rules)));
  CLM_RETURN_IF_ERROR(
      run("DELETE FROM store_meta WHERE name IN ('rekey_from', 'rekey_to')", "clearing the rekey mark"));
  meta_["key_rules"] = as_signed(key_rules);
  meta_.erase("rekey_from");
  meta_.erase("rekey_to");
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
  if (settings_.dir.empty() || settings_.read_only) return {};  // a reader writes no index file
  for (auto& [tenant, t] : indexes) {
    if (!t.index || t.rebuilding || (only_dirty && !t.dirty)) continue;
    HnswIndex::PendingSave save;
    CLM_RETURN_IF_ERROR(t.index->serialize(index_path(tenant), save));
    save.generation = ++save_generation;
    out.push_back(std::move(save));
    t.dirty = false;  // set again by the next change; a failed publish is repaired at the next open
  }
  return {};
}

Status StoreShard::finish_saves(const std::vector<HnswIndex::PendingSave>& saves) {
  std::lock_guard lock(save_mutex);
  Status first;
  for (const auto& save : saves) {
    // Two flushes may finish in the other order than they began: the
    // later copy of an index stays on disk.
    std::uint64_t& published = published_generation[save.path];
    if (save.generation < published) continue;
    published = save.generation;
    Status s = HnswIndex::publish(save);
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace clm::store_detail
