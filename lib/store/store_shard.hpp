// lib/store/store_shard.hpp: one shard of the snapshot store: a SQLite
// database (shard-NN.db) with its schema and prepared statements, the HNSW
// index of each tenant in it, and what the indexes' labels stand for.
// Internal: SnapshotStore (snapshot_store.cpp) holds the policy (levels,
// versions, breakers); a shard only stores, reads and indexes. Every member
// but open() expects the caller to hold `mutex`.
//
// Opening is two steps, so that a store refused at open is left as it was:
// open() connects to an existing database file and reads its store_meta
// (creating nothing: a missing file is `fresh`), check_serving() says whether
// it may serve under this keyer's rules, and only then start() creates a fresh
// database (schema and store_meta in one transaction) and prepares the
// statements. The maintenance members at the end (rekey, adopt) run on a shard
// started with serving = false, in the store's rekey (snapshot_store.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "clm/status.hpp"
#include "clm/store/consistent_hash.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/store/suffix_key.hpp"
#include "hnsw_index.hpp"
#include "shard_mutex.hpp"
#include "sqlite_db.hpp"

namespace clm::store_detail {

struct ShardSettings {
  std::string dir;  // empty: an in-memory database and no index files
  std::int32_t index = 0;
  std::int32_t num_shards = 1;
  std::int32_t dim = 0;
  HnswParams hnsw;
  std::int32_t write_busy_timeout_ms = 5000;
  std::uint64_t key_rules = 0;  // the keyer's rules_fingerprint(): recorded in a new shard, checked in an old one
  bool read_only = false;       // the database opened read-only: nothing created, migrated or written
};

// The store format this library writes (store_meta `format`): 2 since the
// keys carry their text (source_text) and the rules they were made under
// (store_meta `key_rules`); 3 since a blacklist entry says why and who put it
// there (reason, by_hand) and an administrator may pin a key's version
// (pinned_versions); 4 since a row's usage count and latest use live in a
// table of their own (snapshot_usage), so that counting a lookup no longer
// rewrites the snapshot's page. A format-2 or -3 shard is migrated in place
// when it starts; a format-1 store is adopted with `clm_store rekey --adopt`.
inline constexpr std::int64_t kStoreFormat = 4;

// Level 1's cache key of a tenant's key (StoreShard::cached_choice): a hash,
// without allocating; a collision costs a cache miss (key_row checks the row).
inline std::uint64_t choice_key(std::string_view tenant, std::uint64_t fingerprint) {
  return mix64(key_fingerprint(tenant) ^ mix64(fingerprint));
}

// One version of a key as an administrator sees it (list_versions).
struct VersionRow {
  std::int64_t id = 0;
  std::int32_t version = 0;
  std::int64_t created_at_s = 0, last_used_s = 0, usage_count = 0, confirmations = 0;
  bool readable = false;  // the BLOB passes its checks
};

// One blacklist entry as stored.
struct BlacklistRow {
  std::string tenant, key;
  std::uint64_t fingerprint = 0;
  std::int64_t until_ms = 0;
  std::string reason;
  bool by_hand = false;
};

// What deleting a tenant removed from one shard.
struct TenantDeletion {
  std::vector<std::int64_t> row_ids;
  std::int64_t sightings = 0, blacklist = 0, pins = 0, fallbacks = 0;
};

// A row as rekey reads it: what decides its new key.
struct RekeyRow {
  std::int64_t id = 0;
  std::string tenant;
  std::string key;
  std::uint64_t fingerprint = 0;
  std::uint64_t group = 0;
  std::optional<std::string> text;  // source_text; none for a host key
};

// A row in transit between shards (rekey's outbox): all of it.
struct MovedRow {
  std::int64_t id = 0;  // its id in the shard it left
  std::int64_t version = 0, created_at = 0, last_used = 0, usage_count = 0, dim = 0, checksum = 0, confirmations = 0;
  std::vector<std::uint8_t> snapshot;
  std::string tenant, key, dtype, text;
};

// One stored row as the store reads it back.
struct SnapshotRow {
  std::int64_t id = 0;
  std::int32_t version = 0;
  std::int64_t confirmations = 0;
  std::vector<float> vector;  // decoded; empty when the BLOB failed its checks
};

// What an index label (= row id) stands for: enough to filter level-2
// candidates without touching the database.
struct LabelInfo {
  std::uint64_t group = 0;
  std::uint64_t fingerprint = 0;
  std::int32_t version = 0;
  std::string key;
};

struct TenantIndex {
  std::string tenant;
  std::unique_ptr<HnswIndex> index;  // null while a rebuild runs
  bool rebuilding = false;
  bool dirty = false;  // changed since the last save
  std::unordered_map<std::int64_t, LabelInfo> labels;
};

class StoreShard {
 public:
  // Connects to shard settings.index's database if its file exists and reads
  // its store_meta; writes and creates nothing. io_error for a file SQLite
  // cannot read.
  static Status open(const ShardSettings& settings, std::unique_ptr<StoreShard>& out);
  // Whether this shard may serve under settings().key_rules: ok, or
  // failed_precondition saying why (another shape, another format, other key
  // rules, an interrupted rekey) and what to run.
  Status check_serving() const;
  // What maintenance needs: a snapshot store shard of format 1 or 2 with this
  // shard number, shard count and snapshot_dim.
  Status check_shape() const;
  // Creates a fresh database (schema and store_meta in one transaction) and
  // sets the connection's pragmas; serving: prepares every statement (a
  // format-2 shard only), else only those of transactions.
  Status start(bool serving);

  bool fresh() const { return fresh_; }  // no database yet (or one with no tables)
  std::int64_t format() const { return meta_value("format").value_or(0); }
  std::optional<std::int64_t> meta_value(const std::string& name) const;
  std::string db_path() const;
  // The database of the rows' usage counts beside it (format 4):
  // shard-NN.usage.db, attached to the shard's connection as `usage`.
  std::string usage_path() const;

  ShardMutex mutex;  // the shard lock: SQLite connection, indexes, labels

  const ShardSettings& settings() const { return settings_; }
  std::string index_path(std::string_view tenant) const;

  // SQLite waits for a lock held by another connection until this deadline
  // (then SQLITE_BUSY): lookups set a short one, writes a long one.
  void set_busy_deadline(std::chrono::steady_clock::time_point deadline) { busy_deadline_ = deadline; }
  void set_write_deadline() {
    busy_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(settings_.write_busy_timeout_ms);
  }
  bool is_busy(const Status& s) const { return s.code() == StatusCode::io_error && last_rc_busy_; }

  // ---- reads --------------------------------------------------------------
  // The key's versions, newest first; rows whose BLOB fails come with an empty
  // vector (the caller counts and skips them). `each` returns false to stop.
  Status versions(std::string_view tenant, const SuffixKey& key, const std::function<bool(SnapshotRow&)>& each);
  Status row(std::int64_t id, SnapshotRow& out, bool& found);
  // Row `id` if it is still one of the key's (found false otherwise: deleted,
  // or its rowid taken by another key's row since).
  Status key_row(std::int64_t id, std::string_view tenant, const SuffixKey& key, SnapshotRow& out, bool& found);

  // Level 1's choice per key (choice_key(tenant, fingerprint) -> the row it
  // served), so that the next lookup of the key reads that row by rowid, one
  // B-tree descent, instead of the key's versions through the index. Under
  // `mutex`. Every write that touches a key forgets its choice
  // (forget_choice), and the rare writes of many keys forget them all; a
  // choice whose row is not the key's (stale, or another key's whose
  // choice_key collides) is caught by key_row, so it costs a miss of the
  // cache, never a wrong row.
  const std::int64_t* cached_choice(std::uint64_t choice_key) const {
    const auto it = choices_.find(choice_key);
    return it == choices_.end() ? nullptr : &it->second;
  }
  void remember_choice(std::uint64_t choice_key, std::int64_t id) {
    if (choices_.size() >= kMaxChoices) choices_.clear();  // bounded; refilled by the next lookups
    choices_[choice_key] = id;
  }
  void forget_choice(std::uint64_t choice_key) { choices_.erase(choice_key); }
  // Fills the cache from every row (at open, before any lookup or write): a
  // key's newest version with at least stable_confirmations, else its newest,
  // as lookup chooses; an unreadable one is caught by key_row, and a pinned
  // key never reads the cache. Up to the cache's bound.
  Status warm_choices(std::int64_t stable_confirmations);
  void forget_choices() { choices_.clear(); }
  Status tenants(std::vector<std::string>& out);
  // Rows of one tenant with id > after_id, in id order (index rebuild, catch-up).
  Status tenant_rows(std::string_view tenant, std::int64_t after_id,
                     const std::function<void(std::int64_t id, const LabelInfo&, std::vector<float>&)>& each);
  // The same without the snapshots (no BLOB read or decoded): the labels of
  // rows an index loaded from its file already holds.
  Status tenant_labels(std::string_view tenant, std::int64_t after_id,
                       const std::function<void(std::int64_t id, const LabelInfo&)>& each);
  Status count_rows(std::int64_t& out);
  Status integrity_check();

  // ---- writes (inside begin() .. commit()) -------------------------------
  Status begin();
  Status commit();
  void rollback();
  Status count_sighting(std::string_view tenant, const SuffixKey& key, std::int64_t now_s, std::int64_t& seen);
  Status forget_sightings(std::string_view tenant, const SuffixKey& key);
  Status insert(std::string_view tenant, const SuffixKey& key, std::int32_t version, std::span<const float> unit,
                std::int64_t now_s, std::int64_t& id);
  Status confirm(std::int64_t id);
  Status put_blacklist(std::string_view tenant, const SuffixKey& key, std::int64_t until_ms, std::string_view reason,
                       bool by_hand);
  Status put_fallback(std::string_view tenant, std::string_view name, std::span<const float> unit);
  // Rows to evict; then delete_rows in the same transaction.
  Status eviction_candidates(std::int64_t unused_before_s, std::int64_t min_usage,
                             std::vector<std::pair<std::int64_t, std::string>>& out);
  Status delete_row(std::int64_t id);
  Status prune(std::int64_t seen_before_s, std::int64_t now_ms);
  Status vacuum(std::int64_t& pages);

  Status load_blacklist(const std::function<void(std::string_view tenant, std::uint64_t fp, std::int64_t until)>& each);
  Status load_pins(const std::function<void(std::string_view tenant, std::uint64_t fp, std::int32_t version)>& each);
  Status load_fallbacks(
      const std::function<void(std::string_view tenant, std::string_view name, std::vector<float>&)>& each,
      std::uint64_t& corrupt);

  // Usage of served rows, batched: written by flush_usage (its own
  // transaction), each row with the time of its latest lookup (last_used).
  void note_usage(std::int64_t id, std::int64_t now_s) {
    PendingUsage& use = pending_usage_[id];
    ++use.count;
    use.last_s = std::max(use.last_s, now_s);
  }
  std::size_t pending_usage() const { return pending_usage_.size(); }
  Status flush_usage();

  // Writes and the lock: everything that writes the database takes
  // writer_mutex before `mutex` (WriteLocks), never after, so that no write
  // waits for SQLite's lock while it holds `mutex` (a lookup would wait
  // behind it). The background thread's write of the usage counts holds
  // writer_mutex only: take_pending_usage under `mutex`, then
  // write_usage_aside without it, on a connection of its own (WAL: the
  // lookups' reads go on meanwhile); a failed write gives the counts back
  // (return_pending_usage, under `mutex`). An in-memory shard has no second
  // connection: write_usage_aside answers failed_precondition and the
  // caller writes under `mutex` (flush_usage). What acts on the counts
  // (evict, list_versions, eviction_candidates) holds writer_mutex too, so
  // no count is in flight while it looks.
  std::mutex writer_mutex;
  struct PendingUsage {
    std::int64_t count = 0;
    std::int64_t last_s = 0;
  };
  using UsageBatch = std::unordered_map<std::int64_t, PendingUsage>;
  UsageBatch take_pending_usage() { return std::exchange(pending_usage_, {}); }
  void return_pending_usage(const UsageBatch& batch) {
    for (const auto& [id, use] : batch) {
      PendingUsage& mine = pending_usage_[id];
      mine.count += use.count;
      mine.last_s = std::max(mine.last_s, use.last_s);
    }
  }
  Status write_usage_aside(const UsageBatch& batch);

  // ---- administration (store_shard_admin.cpp; writes inside begin() .. commit())
  // A key's versions with their usage (pending usage included), newest first.
  Status version_rows(std::string_view tenant, const SuffixKey& key, std::vector<VersionRow>& out);
  // Deletes the key's rows with a version above `above` (0: all of them) and
  // returns their ids; with above == 0 also its sightings, blacklist entry and pin.
  Status delete_key_rows(std::string_view tenant, const SuffixKey& key, std::int32_t above,
                         std::vector<std::int64_t>& ids);
  Status delete_tenant(std::string_view tenant, TenantDeletion& out);
  Status remove_blacklist(std::string_view tenant, std::uint64_t fingerprint, bool& removed);
  Status blacklist_rows(const std::function<void(BlacklistRow&)>& each);
  Status put_pin(std::string_view tenant, const SuffixKey& key, std::int32_t version, std::int64_t now_s);
  Status remove_pin(std::string_view tenant, std::uint64_t fingerprint, bool& removed);
  std::int64_t pending_usage_of(std::int64_t id) const {
    const auto it = pending_usage_.find(id);
    return it == pending_usage_.end() ? 0 : it->second.count;
  }
  void forget_pending_usage(std::int64_t id) { pending_usage_.erase(id); }

  // ---- inspection (store_shard_inspect.cpp; reads only) -------------------
  struct Counts {
    std::int64_t rows = 0, keys = 0, tenants = 0, max_version = 0, sightings = 0, blacklisted = 0, fallbacks = 0;
  };
  Status counts(std::int64_t now_ms, Counts& out);
  // Reads every row and fallback; `damaged` gets a line for each whose key's
  // fingerprint, dim, BLOB header or checksum fails.
  Status verify_rows(const std::function<void(std::string)>& damaged, std::int64_t& rows, std::int64_t& fallbacks);
  struct EvictionRow {
    std::string tenant, key;
    std::int32_t version = 0;
    std::int64_t usage_count = 0, last_used_s = 0;
  };
  // The rows evict() would delete (pending usage counted), oldest use first.
  Status eviction_rows(std::int64_t unused_before_s, std::int64_t min_usage, std::vector<EvictionRow>& out);
  // A key's readable rows with their snapshots, oldest version first; rows
  // whose BLOB fails its checks are counted in `unreadable` and left out.
  Status key_row_vectors(std::string_view tenant, const SuffixKey& key, std::vector<SnapshotRowVector>& out,
                         std::int64_t& unreadable);

  // ---- maintenance (rekey, adopt; inside begin() .. commit()) --------------
  // Records key_rules (and kStoreFormat, adding the source_text column to a
  // format-1 shard and migrating): the keys are kept as they are.
  Status adopt(std::uint64_t key_rules);
  // Brings a format-2 or -3 shard to kStoreFormat, a step at a time: (2 -> 3)
  // the blacklist's reason and by_hand columns and the pinned_versions table;
  // (3 -> 4) the usage columns dropped, their counts copied out by start().
  Status migrate();
  // Marks the shard as being rekeyed to `to` (rekey_to; rekey_from keeps the
  // rules it had, when first marked) and creates the outbox and inbox tables.
  Status begin_rekey(std::uint64_t from, std::uint64_t to);
  Status rekey_rows(std::int64_t after_id, std::size_t limit, std::vector<RekeyRow>& out);
  Status rekey_update(std::int64_t id, const SuffixKey& key);
  Status rekey_to_outbox(std::int64_t id);  // moves the row to the outbox
  Status rekey_delete(std::int64_t id);
  // Rows stored, and rows in the outbox (in transit to another shard).
  Status rekey_counts(std::int64_t& rows, std::int64_t& in_outbox);
  // Drops the blacklist entry and the pin of a key whose rows changed key.
  Status drop_blacklisted(std::string_view tenant, std::uint64_t fingerprint, std::int64_t& dropped);
  Status drop_sightings(std::int64_t& dropped);
  Status outbox_rows(std::int64_t after_id, std::size_t limit, std::vector<MovedRow>& out);
  Status outbox_delete(std::int64_t id);
  // (shard, id) of every row this shard received from an outbox.
  Status inbox(std::vector<std::pair<std::int32_t, std::int64_t>>& out);
  Status receive(const MovedRow& row, std::int32_t from_shard, const SuffixKey& key);
  Status record_arrival(std::int32_t from_shard, std::int64_t id);  // the inbox's note of a received row
  // Numbers each (tenant, key)'s versions 1.. by created_at where they are
  // not strictly increasing in that order (two old keys became one).
  Status renumber_versions(std::int64_t& renumbered);
  // Records key_rules and drops the marks and the outbox and inbox.
  Status finish_rekey(std::uint64_t key_rules);

  // ---- indexes -----------------------------------------------------------
  std::unordered_map<std::string, TenantIndex> indexes;  // by tenant bytes
  TenantIndex& tenant_index(std::string_view tenant);    // created empty (no HNSW yet) when absent
  // Index saves in two steps (hnsw_index.hpp): begin under `mutex`, then
  // finish_saves after releasing it, so lookups never wait for an fsync.
  Status begin_index_saves(bool only_dirty, std::vector<HnswIndex::PendingSave>& out);
  Status finish_saves(const std::vector<HnswIndex::PendingSave>& saves);
  std::mutex save_mutex;              // orders finish_saves of this shard (taken without `mutex`)
  std::uint64_t save_generation = 0;  // under `mutex`: serialize calls so far
  std::unordered_map<std::string, std::uint64_t> published_generation;  // under save_mutex, by index path

 private:
  explicit StoreShard(const ShardSettings& settings) : settings_(settings) {}
  Status connect();
  // Attaches the usage database (a writer creates it and its table; a reader
  // without one is refused: failed_precondition).
  Status attach_usage();
  // Copies the used rows' counts of a shard of formats 1-3 into the usage database
  // (INSERT OR REPLACE: run twice, the same counts).
  Status copy_usage_out();
  Status prepare_all();
  Status put_meta(std::string_view name, std::int64_t value);
  Status run(const char* sql, std::string_view what);  // a constant statement, stepped to its end
  Status done(int rc, std::string_view what);          // SQLITE_DONE -> ok, else the error
  static int busy_handler(void* self, int count);

  ShardSettings settings_;
  SqliteDb db_;
  bool connected_ = false;
  bool fresh_ = true;
  std::map<std::string, std::int64_t, std::less<>> meta_;  // store_meta as read by open()
  std::chrono::steady_clock::time_point busy_deadline_{};
  bool last_rc_busy_ = false;
  UsageBatch pending_usage_;
  SqliteDb usage_db_;  // write_usage_aside's connection, opened on first use (under writer_mutex)
  Statement usage_aside_;
  std::string usage_upsert_;  // usage_'s SQL, kept while it is prepared
  bool usage_db_open_ = false;
  std::vector<std::uint8_t> blob_;  // scratch

  Statement versions_, row_, tenants_, tenant_rows_, tenant_labels_, count_rows_;
  Statement begin_, commit_, rollback_;
  Statement see_, forget_, insert_, confirm_, usage_;
  Statement blacklist_put_, blacklist_all_, pins_all_, fallback_put_, fallback_all_;
  Statement evictable_, delete_, prune_seen_, prune_blacklist_, prune_usage_;
  Statement key_row_;
  static constexpr std::size_t kMaxChoices = std::size_t{1} << 20;
  std::unordered_map<std::uint64_t, std::int64_t> choices_;
};

// A write transaction of a shard that rolls back in its destructor unless it
// committed: an exception (bad_alloc) between begin and commit would
// otherwise leave the connection inside the transaction, where every later
// BEGIN fails and the shard's reads see rows that were never committed.
//
//   ShardTransaction tx(shard);
//   CLM_RETURN_IF_ERROR(tx.begin());
//   CLM_RETURN_IF_ERROR(shard.insert(...));  // an early return rolls back
//   CLM_RETURN_IF_ERROR(tx.commit());
class ShardTransaction {
 public:
  explicit ShardTransaction(StoreShard& shard) : shard_(shard) {}
  ~ShardTransaction() {
    if (open_) shard_.rollback();
  }
  ShardTransaction(const ShardTransaction&) = delete;
  ShardTransaction& operator=(const ShardTransaction&) = delete;

  Status begin() {
    CLM_RETURN_IF_ERROR(shard_.begin());
    open_ = true;
    return {};
  }
  Status commit() {
    CLM_RETURN_IF_ERROR(shard_.commit());
    open_ = false;
    return {};
  }

 private:
  StoreShard& shard_;
  bool open_ = false;
};

// A write's locks, in their order: writer_mutex, then the shard's lock.
struct WriteLocks {
  std::unique_lock<std::mutex> writer;
  std::unique_lock<ShardMutex> shard;
  explicit WriteLocks(StoreShard& s) : writer(s.writer_mutex), shard(s.mutex) { s.set_write_deadline(); }
};

}  // namespace clm::store_detail
