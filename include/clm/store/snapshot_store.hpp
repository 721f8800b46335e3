// clm/store/snapshot_store.hpp: CLM's semantic snapshot store
// (docs/snapshot-store.md). It keeps the snapshots a host makes of repeated
// suffixes (snapshot_projection.hpp) in SQLite, finds them again by suffix key
// or by similarity (hnswlib), and hands them to the adapter for injection.
//
//   clm::SnapshotStoreConfig config;
//   config.path = "/var/lib/chatbot/snapshots";   // a directory; ":memory:" for tests
//   config.snapshot_dim = 256;
//   std::unique_ptr<clm::SnapshotStore> store;
//   CLM_RETURN_IF_ERROR(clm::SnapshotStore::open(config, store));
//
//   clm::SuffixKey key;
//   CLM_RETURN_IF_ERROR(store->keyer().make_key("订单789现在啥情况？", key));
//   clm::RecordOutcome rec;                        // offline or after a turn
//   CLM_RETURN_IF_ERROR(store->record("tenant-7", key, snapshot, rec));
//   clm::SnapshotHit hit;                          // online, when the SRC head says reuse
//   std::vector<float> injected(256);
//   CLM_RETURN_IF_ERROR(store->lookup("tenant-7", key, query_snapshot, hit, injected));
//   if (hit.level != clm::SnapshotLevel::miss) { /* inject `injected` */ }
//
// Retrieval runs three levels and stops at the first that answers:
//  1. exact: the key's newest stable version (a version is stable once
//     `stable_confirmations` later records agreed with it; with none stable,
//     the newest version, flagged unstable);
//  2. ann: the query vector's nearest stored snapshots (hnswlib, inner product
//     over unit vectors = cosine), the top `ann_top_k` above
//     `similarity_floor` whose key's group equals the query's (a keyed
//     text's group is its whole key, so this serves host keys that name a
//     shared group: SuffixKeyer::from_host_key), each
//     key's served version only (its newest stable one, else its newest);
//     the best one is returned, all are listed;
//  3. fallback: for a low-information suffix (greetings, thanks, any key the
//     keyer abstained on), the generic snapshot set for its key (or for "*")
//     with set_fallback.
// A low-information key never reaches levels 1 and 2: it says too little to
// pick one stored answer. A tenant (the cache salt) sees only its own rows,
// fallbacks and index at every level. A blacklisted key is never served at
// any level. A key whose version an administrator pinned (pin_version) is
// served that version at levels 1 and 2, and nothing while it is unreadable.
//
// Writing: record() of a low-information key stores and counts nothing
// (RecordResult::abstained, metrics().abstained). Otherwise it counts a key's
// sightings and stores nothing until it has been seen min_usage_threshold
// times (admission). After that, a snapshot
// whose cosine to the newest version is below version_cosine becomes a new
// version; one at or above confirms it (a key keeps at most
// max_versions_per_key versions: a new one past that deletes the oldest one
// not pinned). Over the last drift_window records of
// a key, a total variance (mean squared distance from the window's mean)
// above drift_variance, or a window mean whose cosine to the version the
// records confirmed fell below drift_mean_cosine (each record close enough
// to confirm it, all leaning one way), starts a new version too (drift).
// Windows live in memory only: after a restart a key's window fills again
// before drift can be seen. Snapshots are
// stored f16 in a self-describing, checksummed BLOB (snapshot_blob.hpp); a
// row whose checksum fails is skipped and counted, never returned.
//
// Keys are versioned with their rules. A row keeps the text its key was made
// of (source_text; none for a host's key), and every shard's store_meta
// records the keyer's rules_fingerprint() (key_rules) the keys were made
// under. open() refuses (failed_precondition, naming both fingerprints) a
// store made under other rules, since the same text would now get another
// key and silently miss, or hit another text's snapshot; it refuses a store
// of format 1 (made before keys kept their text) and one whose rekey was
// interrupted. A refused open writes nothing. rekey() (`clm_store rekey DIR`)
// rebuilds every key from its text under the current rules, or with adopt
// (`clm_store rekey --adopt DIR`) records the current rules and keeps the keys.
//
// Shards: num_shards SQLite databases (shard-NN.db in `path`), each with one
// HNSW index per tenant beside it (shard-NN.<tenant>.hnsw). A key lives in
// the shard that consistent hashing (consistent_hash.hpp) assigns to its
// route, a hash of its tenant and group: every candidate level 2 may return
// for a query sits in the query's own shard, so a lookup touches one shard.
// Each database: WAL, synchronous=NORMAL, incremental auto-vacuum, prepared
// statements only (no SQL text is ever built from input).
//
// Breakers: (a) a lookup waits at most lookup_timeout_us for a busy shard
// (its lock or SQLite's), and a level-2 search and the reads of its
// candidates end by the same deadline; past it the lookup answers miss
// (counted as busy_misses);
// writes wait write_busy_timeout_ms and then fail with io_error. (b)
// report_outcome feeds an accuracy per (query key, served key) over
// blacklist_window_ms (at most the last 512 reports; at most
// blacklist_tracked_pairs pairs, the least recently reported forgotten
// first). Below blacklist_accuracy (with at least blacklist_min_reports
// reports): a key served for itself (level 1) is blacklisted for
// blacklist_duration_ms, persisted in its shard, and skipped before any
// lookup; a key served for another (level 2, a fallback) is refused to that
// query key only for as long (in memory: a restart forgets it), since a wrong
// answer to another question says nothing of its own exact hits; a key
// refused to 8 query keys at once is blacklisted. (c) a missing, stale-beyond-repair or corrupt index file
// is rebuilt from the database on a background thread; level 1 keeps serving
// and level 2 answers miss for that shard and tenant until it is done.
//
// Durability: a record returns once its transaction committed (WAL). Index
// files are written on flush(), evict(), rebuild and close (copied in memory
// under the shard's lock, then written to a temporary file, fsynced and
// renamed, with a checksum trailer, without it); rows committed after the last save are
// added to the index when the store opens. A process killed at any point
// loses no committed snapshot. Usage counts of lookups (usage_count, and
// last_used: each row's latest lookup time) are batched in memory and written
// by flush(), evict() and close, or by the background thread once 4,096 rows
// of a shard wait, on a database connection of its own and without the
// shard's lock: a lookup never writes and never waits for that write (a
// write of the store's own waits for it, without the shard's lock, so
// lookups go on meanwhile). A crash may lose those counts, never a snapshot.
// A writer remembers which row level 1 served each key (cleared by every
// write to the key) and reads that row by its rowid the next time.
//
// Thread safety: every method may be called from any thread at once; each
// shard has its own lock, and lookups of different shards run in parallel.
// One writer opens a store at a time: open() takes an exclusive lock on
// `path`/LOCK (flock) and refuses a store another writer (another process,
// or another open in this one) holds, since two writers would each save
// index files that miss the other's rows.
//
// Reading beside a writer (config.read_only): any number of readers open a
// store a writer holds (or none does). A reader takes no lock, opens the
// shard databases read-only (WAL lets it read while the writer commits) and
// loads the index files without writing them (a missing or corrupt one is
// rebuilt in memory). Level 2 sees the rows committed up to its open (its
// indexes are made then; reopen to see later ones); level 1 reads each
// key's rows as they are at the lookup; the blacklist, pins and fallbacks
// are reloaded every read_only_refresh_ms on a background thread, so a key
// the writer blacklists stops being served by a reader within that time.
// Lookups count no usage. A reader refuses a store that needs migrating,
// a rekey, or is not there (not_found): the writer must open it first.
//
// Errors (Status, never exceptions): invalid_argument for a vector of the
// wrong dimension, NaN/Inf or zero length, an empty key, a bad config;
// io_error for a database or file that cannot be opened, read or written
// (a corrupt database, a full disk, a database locked past the write
// timeout); failed_precondition for a store opened with another shard count
// or snapshot_dim than it was created with, under other key rules, of an
// older format, or with a rekey left unfinished; out_of_memory when host memory
// runs out (an allocation that fails inside a call is caught there, and its
// transaction rolled back), internal for any other exception. Nothing
// committed changes on error, and a failed batch writes none of its rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"
#include "clm/store/suffix_key.hpp"

namespace clm {

// What changed in the store that an operator watches (engine/clm_watch.hpp,
// docs/observability.md): a key blacklisted (by the outcome breaker or an
// administrator) or let go, a version created (admission, cosine or drift).
struct SnapshotStoreEvent {
  enum class Kind : std::uint8_t { blacklisted, unblacklisted, version_created, drift };
  Kind kind = Kind::version_created;
  std::string_view tenant;  // the store's tenant (Engine::snapshot_tenant: salt and adapter)
  std::string_view key;
  std::string_view reason;    // blacklisted: why ("breaker: ..." or the administrator's words)
  std::int64_t until_ms = 0;  // blacklisted: until when (ms since the epoch)
  std::int32_t version = 0;   // version_created, drift: the new version
  bool by_breaker = false;    // blacklisted: the outcome breaker, not an administrator
};
const char* snapshot_store_event_name(SnapshotStoreEvent::Kind kind);

struct SnapshotStoreConfig {
  std::string path;  // directory (created if missing); ":memory:" keeps everything in memory
  // Opens an existing store beside its writer, for lookups and inspection
  // only: no directory lock, the databases read-only, no index file written
  // ("Reading beside a writer" below). Every call that writes answers
  // failed_precondition and changes nothing.
  bool read_only = false;
  std::int32_t read_only_refresh_ms = 1000;  // a reader reloads the blacklist, pins and fallbacks this often (>= 1)
  std::int32_t num_shards = 16;              // 1..256, fixed when the store is created
  std::int32_t snapshot_dim = 256;           // 1..4096, fixed when the store is created
  SuffixKeyerConfig keyer;                   // how text becomes keys (suffix_key.hpp)

  // Admission and versions.
  std::int64_t min_usage_threshold = 50;   // sightings before a key is stored (>= 1)
  float version_cosine = 0.95f;            // below: a new version (0, 1]
  std::int32_t stable_confirmations = 1;   // confirmations that make a version stable (>= 0)
  std::int32_t drift_window = 100;         // records per key in the drift window (>= 2)
  float drift_variance = 0.08f;            // window variance above which a new version starts (> 0)
  float drift_mean_cosine = 0.98f;         // the window mean's cosine to its version below which one starts (0, 1]
  std::int32_t drift_tracked_keys = 256;   // keys whose windows are kept in memory (LRU; >= 1)
  std::int32_t max_versions_per_key = 16;  // 1..1024: a new version past it deletes the oldest unpinned one

  // Level 2 (hnswlib).
  std::int32_t ann_top_k = 3;        // 1..64
  float similarity_floor = 0.80f;    // cosine, [-1, 1]
  std::int32_t ann_ef_search = 128;  // >= ann_top_k
  std::int32_t ann_m = 16;           // 2..100
  std::int32_t ann_ef_construction = 200;

  // Eviction: rows unused for evict_after_days with usage_count < evict_min_usage.
  double evict_after_days = 30.0;
  std::int64_t evict_min_usage = 5;

  // Breakers.
  std::int32_t lookup_timeout_us = 2000;      // (a) a busy shard answers miss after this
  std::int32_t write_busy_timeout_ms = 5000;  // (a) a write waits this long for SQLite's lock
  double blacklist_accuracy = 0.95;           // (b)
  std::int64_t blacklist_window_ms = 5 * 60 * 1000;
  std::int64_t blacklist_duration_ms = 24 * 60 * 60 * 1000;
  std::int32_t blacklist_min_reports = 20;      // 1..512
  std::int32_t blacklist_tracked_pairs = 4096;  // (query key, served key) windows kept (LRU; 1..1048576)
  bool rebuild_in_background = true;            // (c) false: open() rebuilds before it returns

  // Scheduled maintenance: > 0 runs evict() (pending usage counts written,
  // old rows deleted, vacuum, index files saved) and flush() every this many
  // ms on the background thread; 0 (the default) leaves them to the host.
  // A failed run is counted (maintenance_failures) and its status kept
  // (last_maintenance); the next one tries again.
  std::int64_t maintenance_interval_ms = 0;

  // Milliseconds since the Unix epoch; tests pass their own clock.
  std::function<std::int64_t()> clock_ms;  // empty: the system clock

  // Told of each SnapshotStoreEvent once it is committed, on the thread that
  // made it; must not throw or call back into the store. Empty: none.
  std::function<void(const SnapshotStoreEvent&)> on_event;
};

// What the store accepts as a snapshot or query: `dim` finite values with a
// direction (not all zero). invalid_argument naming `what` otherwise. Hosts
// (and Engine) may check a whole batch with it before they look anything up.
Status check_snapshot_vector(std::span<const float> v, std::int32_t dim, std::string_view what);

enum class SnapshotLevel : std::uint8_t { miss = 0, exact = 1, ann = 2, fallback = 3 };
const char* snapshot_level_name(SnapshotLevel level);

struct SnapshotCandidate {
  std::string key;
  std::uint64_t fingerprint = 0;
  std::int32_t version = 0;
  float similarity = 0.0f;
};

struct SnapshotHit {
  SnapshotLevel level = SnapshotLevel::miss;
  float similarity = 0.0f;  // cosine between query and snapshot (1 for exact without a query)
  std::string key;          // the served snapshot's key (the fallback's name at level 3)
  std::uint64_t fingerprint = 0;
  std::int32_t version = 0;                   // 0 at levels 0 and 3
  bool stable = false;                        // level 1: the version is stable
  bool pinned = false;                        // levels 1 and 2: the version an administrator pinned
  std::vector<SnapshotCandidate> candidates;  // level 2: up to ann_top_k, best first
};

enum class RecordResult : std::uint8_t {
  counted = 0,      // seen fewer than min_usage_threshold times: counted, not stored
  admitted = 1,     // stored as version 1
  confirmed = 2,    // agrees with the newest version (cosine >= version_cosine)
  new_version = 3,  // cosine below version_cosine: stored as a new version
  drifted = 4,      // the drift window's variance passed drift_variance: a new version
  not_written = 5,  // record_batch failed before this record's shard committed
  abstained = 6,    // a low-information key: neither stored nor counted
};
const char* record_result_name(RecordResult result);

struct RecordOutcome {
  RecordResult result = RecordResult::counted;
  std::int64_t seen = 0;     // sightings so far (while counted)
  std::int32_t version = 0;  // the key's newest version afterwards (0 while counted)
};

// One record of a batch.
struct SnapshotRecord {
  std::string_view tenant;
  const SuffixKey* key = nullptr;
  std::span<const float> snapshot;
};

struct SnapshotStoreMetrics {
  std::uint64_t lookups = 0;
  std::uint64_t hits_exact = 0;
  std::uint64_t hits_ann = 0;
  std::uint64_t hits_fallback = 0;
  std::uint64_t misses = 0;
  std::uint64_t busy_misses = 0;        // lookups answered miss by breaker (a)
  std::uint64_t blacklisted_skips = 0;  // lookups or candidates refused by breaker (b)
  std::uint64_t ann_unavailable = 0;    // level-2 lookups while the index was rebuilt (c)
  std::uint64_t records = 0;
  std::uint64_t counted = 0;     // records below the admission threshold
  std::uint64_t abstained = 0;   // records of low-information keys: not stored
  std::uint64_t admissions = 0;  // keys stored for the first time
  std::uint64_t confirmations = 0;
  std::uint64_t versions = 0;          // new versions of existing keys (cosine or drift)
  std::uint64_t drift_versions = 0;    // ... of them by drift
  std::uint64_t versions_dropped = 0;  // oldest versions deleted past max_versions_per_key
  std::uint64_t evictions = 0;         // rows deleted by evict()
  std::uint64_t corrupt_skipped = 0;   // rows whose checksum or header failed
  std::uint64_t index_rebuilds = 0;    // index files rebuilt from the database
  std::uint64_t outcome_reports = 0;
  std::uint64_t maintenance_runs = 0;      // scheduled maintenance runs (maintenance_interval_ms)
  std::uint64_t maintenance_failures = 0;  // ... of them that failed (last_maintenance says why)
  std::uint64_t blocked_pair_skips = 0;    // level-2 candidates and fallbacks refused to one query key by (b)
  std::int64_t snapshots = 0;              // rows stored now
  std::int64_t blacklisted_keys = 0;       // keys blacklisted now
  std::int64_t blocked_pairs = 0;          // (query key, served key) pairs refused now by (b)
};

struct EvictionReport {
  std::int64_t deleted = 0;
  std::int64_t pages_vacuumed = 0;
};

// What SnapshotStore::rekey did. Row counts are of this run (a rekey run
// again after an interruption counts what it still had to do).
struct RekeyReport {
  std::uint64_t old_rules = 0;  // the key rules the store recorded (0: none, a format-1 store)
  std::uint64_t new_rules = 0;  // the keyer's (config.keyer), recorded now
  std::int32_t old_format = 0;  // the store format found: 1 to 4
  bool adopted = false;         // adopt: the keys were kept as they were
  bool resumed = false;         // an interrupted rekey was found and finished
  std::int64_t rows_before = 0;
  std::int64_t rows_after = 0;
  std::int64_t rekeyed = 0;              // rows with text whose key was made again under the new rules
  std::int64_t changed = 0;              // ... of them with a key other than before
  std::int64_t moved = 0;                // ... of them moved to another shard (their new group routes there)
  std::int64_t kept = 0;                 // rows kept with their key: host keys (no text); every row with adopt
  std::int64_t dropped = 0;              // rows whose text makes no servable key now: deleted (see drops)
  std::int64_t versions_renumbered = 0;  // rows whose version changed (keys that became one)
  std::int64_t sightings_dropped = 0;    // admission counts of old keys (all: they have no text)
  std::int64_t blacklist_dropped = 0;    // blacklist entries of keys that changed (their pins go too)
  std::int64_t indexes_rebuilt = 0;      // tenant indexes rebuilt afterwards
  struct Drop {
    std::string reason;  // "abstained: ..." (low_information) or the keyer's error
    std::int64_t rows = 0;
    std::string example;  // one text dropped for this reason
  };
  std::vector<Drop> drops;  // by reason, most rows first
};

// One version of a key, as list_versions reports it.
struct SnapshotVersionInfo {
  std::int32_t version = 0;
  std::int64_t created_at_s = 0;   // Unix seconds
  std::int64_t last_used_s = 0;    // Unix seconds (written with the usage counts)
  std::int64_t usage_count = 0;    // lookups that served it, those not yet written included
  std::int64_t confirmations = 0;  // records that agreed with it
  bool readable = false;           // its BLOB passes its checks (an unreadable one is never served)
  bool stable = false;             // confirmations >= stable_confirmations
  bool pinned = false;             // pinned by pin_version
  bool served = false;             // the version level 1 serves now (none while a pinned version is unreadable)
};

// One key refused at every level, by hand or by breaker (b).
struct BlacklistEntry {
  std::string tenant;
  std::string key;
  std::uint64_t fingerprint = 0;
  std::int64_t until_ms = 0;  // in force until (ms since the Unix epoch)
  std::string reason;         // what blacklist_key was told, or what the breaker saw
  bool by_hand = false;       // blacklist_key; false: breaker (b)
};

// What delete_tenant removed, summed over the shards.
struct TenantDeletionReport {
  std::int64_t rows = 0;       // snapshots, all versions
  std::int64_t sightings = 0;  // admission counts of keys not stored yet
  std::int64_t blacklist = 0;
  std::int64_t pins = 0;
  std::int64_t fallbacks = 0;
};

// A store's shape, read from its first shard without opening the store (no
// lock taken, nothing written): what a tool needs before it opens one.
struct StoreLayout {
  std::int32_t num_shards = 0;
  std::int32_t snapshot_dim = 0;
  std::int32_t format = 0;      // the store format (1..3 today)
  std::uint64_t key_rules = 0;  // the rules its keys were made under (0: none recorded)
};

// One shard, as shard_statistics reports it.
struct ShardStatistics {
  std::int32_t shard = 0;
  std::int64_t rows = 0;          // snapshots, all versions
  std::int64_t keys = 0;          // distinct (tenant, key)
  std::int64_t tenants = 0;       // distinct tenants with rows
  std::int64_t max_version = 0;   // the highest version of any key
  std::int64_t sightings = 0;     // keys counting toward admission, not stored yet
  std::int64_t blacklisted = 0;   // blacklist entries in force
  std::int64_t fallbacks = 0;     // level-3 snapshots
  std::int64_t indexed = 0;       // live entries of its level-2 indexes in memory
  std::int64_t index_files = 0;   // index files on disk (one per tenant once saved)
  std::uint64_t db_bytes = 0;     // the shard's database files: its rows' and its usage counts'
  std::uint64_t wal_bytes = 0;    // their WAL files
  std::uint64_t index_bytes = 0;  // its index files (.hnsw and .meta)
};

// What verify found.
struct VerifyReport {
  std::int64_t rows = 0;
  std::int64_t fallbacks = 0;
  std::int64_t damaged = 0;  // rows and fallbacks whose key, dim, header or checksum fails
  bool integrity_ok = true;  // PRAGMA integrity_check of every shard
  // One line per problem: integrity failures, then damaged rows (the first
  // 20; "... and N more").
  std::vector<std::string> problems;
};

// A row evict() would delete now.
struct EvictionCandidate {
  std::int32_t shard = 0;
  std::string tenant;
  std::string key;
  std::int32_t version = 0;
  std::int64_t usage_count = 0;  // lookups not yet written included
  std::int64_t last_used_s = 0;  // Unix seconds, the latest lookup not yet written included
};

// One stored row of a key with its snapshot, as key_vectors reports it.
struct SnapshotRowVector {
  std::int64_t id = 0;  // the row's id in its shard
  std::int32_t version = 0;
  std::int64_t created_at_s = 0;  // Unix seconds
  std::int64_t confirmations = 0;
  std::vector<float> vector;  // [snapshot_dim], as stored: unit length to f16 precision
};

// Another key of the tenant near a key's rows (key_vectors).
struct NeighbourKeyVectors {
  std::string key;
  std::uint64_t fingerprint = 0;
  std::int32_t shard = 0;
  float similarity = 0.0f;              // the highest cosine between one of its rows and one of the key's
  std::vector<SnapshotRowVector> rows;  // every readable row (version) of it, oldest version first
};

// A key's rows and its nearest other keys' rows: what `clm_store plot` draws.
struct KeyVectors {
  std::string key;
  std::uint64_t fingerprint = 0;
  std::int32_t shard = 0;
  bool blacklisted = false;             // refused at every level now (its rows are reported all the same)
  std::vector<SnapshotRowVector> rows;  // every readable row (version), oldest version first
  std::int64_t unreadable = 0;          // rows whose BLOB fails its checks: left out
  // Nearest first, at most the number asked for. False when an index was
  // being rebuilt (breaker (c)): the neighbours of that shard are missing.
  bool neighbours_complete = true;
  std::vector<NeighbourKeyVectors> neighbours;
};

class SnapshotStore {
 public:
  // The shape of the store at `path`. not_found when it holds none;
  // failed_precondition for a database that is no store's shard; io_error
  // for one that cannot be read.
  static Status read_layout(const std::string& path, StoreLayout& out);

  static Status open(const SnapshotStoreConfig& config, std::unique_ptr<SnapshotStore>& out);

  // Brings the closed store at config.path under the rules of config.keyer
  // (config.num_shards and snapshot_dim must be the store's).
  //
  // Without adopt: every row with text gets its key made again (a row whose
  // new group routes to another shard moves there, in its tenant); host keys
  // (rows without text) are kept; a row whose text makes no servable key now
  // (low_information, or refused) is deleted and counted by reason. Where
  // keys became one, that key's versions are numbered again 1.. in created_at
  // order. Blacklist entries and pins of keys that changed and every admission count
  // (sightings: they keep no text) are dropped. The index files are deleted
  // first and rebuilt at the end. Each shard's rows change in one
  // transaction; rows move through an outbox, so none is lost or doubled by
  // a crash. The store is marked (store_meta rekey_to) before anything
  // changes and key_rules is recorded only once every shard is done: an
  // interrupted rekey makes open() refuse the store until rekey runs again
  // (with any keyer), and finishes it. A format-1 store is refused (its rows
  // have no text): adopt it.
  //
  // With adopt: records the keyer's rules and keeps every key; a format-1
  // store gets the source_text column (empty for its rows), and any older
  // store the current format (3).
  // Refused for a store with an interrupted rekey: finish that first.
  //
  // Errors: invalid_argument for a bad config or ":memory:"; not_found for a
  // missing directory or one with no store; failed_precondition for another
  // shape, a format this library does not know, a store open elsewhere;
  // io_error for a database that cannot be read or written (that shard's
  // transaction rolled back: run rekey again).
  static Status rekey(const SnapshotStoreConfig& config, bool adopt, RekeyReport& report);

  ~SnapshotStore();  // saves the index files and waits for a rebuild in progress
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  const SnapshotStoreConfig& config() const;
  const SuffixKeyer& keyer() const;

  // Levels 1-3 for one suffix. query may be empty (level 2 is then skipped).
  // snapshot_out: [snapshot_dim], written on a hit (unit length to f16 rounding), untouched
  // on a miss. A miss is ok(); errors are for bad arguments only.
  Status lookup(std::string_view tenant, const SuffixKey& key, std::span<const float> query, SnapshotHit& hit,
                std::span<float> snapshot_out);

  // Counts and, once admitted, stores one snapshot of the suffix `key`.
  Status record(std::string_view tenant, const SuffixKey& key, std::span<const float> snapshot, RecordOutcome& outcome);
  // Many records: everything is validated first (a bad record writes
  // nothing), then one transaction per shard touched. A shard that fails to
  // commit (a full disk, a lock held past write_busy_timeout_ms) is rolled
  // back and its error returned; shards committed before it stay committed
  // (SQLite cannot commit atomically across WAL databases), and every record
  // not committed says not_written. outcomes: [records.size()].
  Status record_batch(std::span<const SnapshotRecord> records, std::span<RecordOutcome> outcomes);

  // Breaker (b): whether what a lookup of `query` served was right. served:
  // that lookup's hit (its key and fingerprint; at level 2 or 3 another
  // key's). failed_precondition for a miss.
  Status report_outcome(std::string_view tenant, const SuffixKey& query, const SnapshotHit& served, bool correct);
  // The same for a key served for itself (level 1).
  Status report_outcome(std::string_view tenant, const SuffixKey& key, bool correct);
  bool is_blacklisted(std::string_view tenant, const SuffixKey& key);

  // Level 3: the generic snapshot for a low-information key ("GREETING",
  // "THANKS") or for all of them ("*"). Persisted.
  Status set_fallback(std::string_view tenant, std::string_view name, std::span<const float> snapshot);

  // Deletes rows with last_used older than evict_after_days and usage_count
  // below evict_min_usage, with their index entries; then vacuums.
  Status evict(EvictionReport& report);

  // Writes pending usage counts and saves every index file.
  Status flush();
  // Rebuilds every index from its database (blocking), as breaker (c) does in the background.
  Status rebuild_indexes();
  // Waits until no background rebuild is running.
  void wait_for_rebuilds();
  // PRAGMA integrity_check of every shard; io_error naming the first that fails.
  Status check_integrity();

  SnapshotStoreMetrics metrics() const;
  // What the last scheduled maintenance run returned (ok before the first).
  Status last_maintenance() const;

  // ---- administration (by hand; every call is one transaction of one shard,
  // but delete_tenant, one per shard) ----------------------------------------
  // A key's versions, newest first. not_found when the key has no row.
  Status list_versions(std::string_view tenant, const SuffixKey& key, std::vector<SnapshotVersionInfo>& out);
  // Deletes every version of a key, with its index entries, admission count,
  // blacklist entry and pin. not_found (nothing changed) when it has no row.
  Status delete_key(std::string_view tenant, const SuffixKey& key, std::int64_t& rows_deleted);
  // Deletes everything of a tenant in every shard: rows, index files,
  // admission counts, blacklist entries, pins, fallbacks. not_found when the
  // store holds nothing of it. A shard that fails keeps its part (io_error):
  // run it again.
  Status delete_tenant(std::string_view tenant, TenantDeletionReport& report);
  // Refuses a key at every level until until_ms (ms since the epoch, after
  // now), persisted with the reason (1..1024 bytes); replaces an entry the
  // key already has. The key need not be stored yet.
  Status blacklist_key(std::string_view tenant, const SuffixKey& key, std::string_view reason, std::int64_t until_ms);
  // Lifts a key's blacklist entry (by hand or breaker), the refusals of it
  // to single query keys (breaker (b)'s pair blocks), and forgets the
  // outcomes reported for it. not_found when it has none in force.
  Status unblacklist_key(std::string_view tenant, const SuffixKey& key);
  // The entries in force, by tenant and key.
  Status list_blacklist(std::vector<BlacklistEntry>& out);
  // Serves `version` of the key at levels 1 and 2 from now on, stable or
  // not, whatever newer versions record() adds (they wait until
  // unpin_version). not_found when the key has no such version,
  // failed_precondition when that version's BLOB is unreadable.
  Status pin_version(std::string_view tenant, const SuffixKey& key, std::int32_t version);
  // Lifts the pin: the newest stable version is served again. not_found when
  // the key has no pin.
  Status unpin_version(std::string_view tenant, const SuffixKey& key);
  // Deletes the key's versions newer than `version` (their rows and index
  // entries) and its drift window; a pin on a deleted version is lifted.
  // not_found when the key has no such version.
  Status roll_back(std::string_view tenant, const SuffixKey& key, std::int32_t version, std::int64_t& rows_deleted);

  // ---- inspection (reads only: a read-only store answers them) -------------
  // Counts and file sizes of every shard.
  Status shard_statistics(std::vector<ShardStatistics>& out);
  // Runs integrity_check on every shard and reads every row and fallback:
  // its key's fingerprint, dim, BLOB header and checksum. ok() with the
  // findings in `report`; an error only when a shard cannot be read.
  Status verify(VerifyReport& report);
  // The rows evict() would delete now (evict_after_days, evict_min_usage;
  // usage not yet written counted), oldest use first. Deletes nothing.
  Status eviction_candidates(std::vector<EvictionCandidate>& out);
  // A key's rows with their snapshots (blacklisted keys too), and the rows
  // of up to max_neighbour_keys (0..64) other keys of the tenant whose rows
  // lie nearest to them: each row's nearest entries in the tenant's level-2
  // index of every shard (not only the key's group), the keys ranked by their
  // best cosine to any of the key's rows. not_found when the key has no row;
  // invalid_argument for a bad key or count.
  Status key_vectors(std::string_view tenant, const SuffixKey& key, std::int32_t max_neighbour_keys, KeyVectors& out);

  // The shard a key lives in (for tools and tests).
  std::int32_t shard_of(std::string_view tenant, const SuffixKey& key) const;

 private:
  struct Impl;
  explicit SnapshotStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace clm
