// examples/snapshot_store/maintenance.cpp: `clm_store stats`, `evict`, `rebuild-index` and `check`: looking after a
// store on disk through the store's inspection API (stats, check and evict --dry-run open it read-only).
#include "commands.hpp"

namespace clm_store_cli {

// ---- stats ---------------------------------------------------------------------

const std::string_view kStatsUsage =
    "usage: clm_store stats --store DIR [--json] [--lexicons DIR]\n"
    "\n"
    "Per shard: rows (snapshots stored, all versions), keys (distinct tenant and key),\n"
    "tenants, the highest version, keys still counting toward admission, blacklisted keys,\n"
    "fallback snapshots, rows in the level-2 indexes, and the sizes of the database, its WAL\n"
    "and its index files (an index file per tenant: fewer files than tenants means some are\n"
    "missing; the store rebuilds them when it opens). Then the store's metrics; its counters\n"
    "(lookups, records, ...) cover this process only, which has just opened the store.\n"
    "Opens the store read-only: it runs beside a server that holds the store.\n"
    "\n"
    "  --json           one JSON object\n"
    "  --lexicons DIR   the lexicons the store was made with (default: built-in)\n";

Json metrics_json(const clm::SnapshotStoreMetrics& m) {
  return Json{{"lookups", m.lookups},
              {"hits_exact", m.hits_exact},
              {"hits_ann", m.hits_ann},
              {"hits_fallback", m.hits_fallback},
              {"misses", m.misses},
              {"busy_misses", m.busy_misses},
              {"blacklisted_skips", m.blacklisted_skips},
              {"ann_unavailable", m.ann_unavailable},
              {"records", m.records},
              {"counted", m.counted},
              {"abstained", m.abstained},
              {"admissions", m.admissions},
              {"confirmations", m.confirmations},
              {"versions", m.versions},
              {"drift_versions", m.drift_versions},
              {"versions_dropped", m.versions_dropped},
              {"evictions", m.evictions},
              {"corrupt_skipped", m.corrupt_skipped},
              {"index_rebuilds", m.index_rebuilds},
              {"outcome_reports", m.outcome_reports},
              {"blocked_pair_skips", m.blocked_pair_skips},
              {"maintenance_runs", m.maintenance_runs},
              {"maintenance_failures", m.maintenance_failures},
              {"snapshots", m.snapshots},
              {"blacklisted_keys", m.blacklisted_keys},
              {"blocked_pairs", m.blocked_pairs}};
}

int cmd_stats(const Args& args) {
  args.no_positionals();
  clm::SnapshotStoreConfig config = store_config(args, false);
  const bool json = args.has("--json");
  std::unique_ptr<clm::SnapshotStore> store = open_reader(config);
  std::vector<clm::ShardStatistics> shards;
  check(store->shard_statistics(shards), "shard_statistics");
  const clm::SnapshotStoreMetrics m = store->metrics();
  store.reset();  // a rebuild the open started stops here

  clm::ShardStatistics total;
  for (const clm::ShardStatistics& s : shards) {
    total.rows += s.rows;
    total.keys += s.keys;
    total.tenants += s.tenants;
    total.max_version = std::max(total.max_version, s.max_version);
    total.sightings += s.sightings;
    total.blacklisted += s.blacklisted;
    total.fallbacks += s.fallbacks;
    total.indexed += s.indexed;
    total.db_bytes += s.db_bytes;
    total.wal_bytes += s.wal_bytes;
    total.index_files += s.index_files;
    total.index_bytes += s.index_bytes;
  }
  const std::int64_t missing = std::max<std::int64_t>(0, total.tenants - total.index_files);
  if (json) {
    auto shard_json = [](const clm::ShardStatistics& s) {
      return Json{{"shard", s.shard},
                  {"rows", s.rows},
                  {"keys", s.keys},
                  {"tenants", s.tenants},
                  {"max_version", s.max_version},
                  {"counting", s.sightings},
                  {"blacklisted", s.blacklisted},
                  {"fallbacks", s.fallbacks},
                  {"indexed", s.indexed},
                  {"db_bytes", s.db_bytes},
                  {"wal_bytes", s.wal_bytes},
                  {"index_files", s.index_files},
                  {"index_bytes", s.index_bytes}};
    };
    Json j;
    j["store"] = config.path;
    j["num_shards"] = config.num_shards;
    j["snapshot_dim"] = config.snapshot_dim;
    j["rows"] = total.rows;
    j["keys"] = total.keys;
    j["counting"] = total.sightings;
    j["indexed"] = total.indexed;
    j["db_bytes"] = total.db_bytes;
    j["wal_bytes"] = total.wal_bytes;
    j["index_files"] = total.index_files;
    j["index_bytes"] = total.index_bytes;
    j["shard_tenants"] = total.tenants;
    Json per_shard = Json::array();
    for (const clm::ShardStatistics& s : shards) per_shard.push_back(shard_json(s));
    j["shards"] = per_shard;
    j["metrics"] = metrics_json(m);
    fmt::print("{}\n", dump(j));
    return 0;
  }
  fmt::print("store {}: {} shards, snapshot_dim {}\n\n", config.path, config.num_shards, config.snapshot_dim);
  fmt::print("{:>5} {:>9} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6} {:>9} {:>10} {:>10} {:>7} {:>10}\n", "shard", "rows",
             "keys", "tenants", "max_ver", "counting", "black", "fallbk", "indexed", "db", "wal", "indexes",
             "index size");
  auto row = [](const std::string& name, const clm::ShardStatistics& s) {
    fmt::print("{:>5} {:>9} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6} {:>9} {:>10} {:>10} {:>7} {:>10}\n", name, s.rows,
               s.keys, s.tenants, s.max_version, s.sightings, s.blacklisted, s.fallbacks, s.indexed,
               human_bytes(s.db_bytes), human_bytes(s.wal_bytes), s.index_files, human_bytes(s.index_bytes));
  };
  for (const clm::ShardStatistics& s : shards) row(fmt::format("{:02}", s.shard), s);
  row("total", total);
  if (missing > 0) {
    fmt::print(
        "\n{} tenant index file(s) missing: the store rebuilds them when it opens (or: clm_store rebuild-index)\n",
        missing);
  }
  fmt::print("\nmetrics (counters cover this process, which has just opened the store):\n");
  const Json metrics = metrics_json(m);
  for (const auto& [name, value] : metrics.items()) fmt::print("  {:<18} {}\n", name, value.dump());
  return 0;
}

// ---- evict ---------------------------------------------------------------------

const std::string_view kEvictUsage =
    "usage: clm_store evict --store DIR [--older-than-days D] [--below-usage N] [--list] [--dry-run] [--json]\n"
    "                       [--lexicons DIR]\n"
    "\n"
    "Deletes the rows unused (last_used) for more than D days whose usage_count is below N,\n"
    "with their index entries, and sightings not seen for D days and expired blacklist\n"
    "entries; then vacuums each shard (incremental auto-vacuum). Prints what was deleted and\n"
    "how much was vacuumed.\n"
    "\n"
    "  --older-than-days D   default 30 (0: every row not used in this very second)\n"
    "  --below-usage N       default 5\n"
    "  --list                list the rows to delete (tenant, key, version, usage, last used)\n"
    "  --dry-run             list them and delete nothing\n"
    "  --json                one JSON object (with --list: the rows too)\n"
    "  --lexicons DIR        the lexicons the store was made with (default: built-in)\n";

std::string utc(std::int64_t unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int cmd_evict(const Args& args) {
  args.no_positionals();
  clm::SnapshotStoreConfig config = store_config(args, false);
  config.evict_after_days = args.real("--older-than-days", 0.0, 1e6).value_or(config.evict_after_days);
  config.evict_min_usage = args.integer<std::int64_t>("--below-usage", 0, std::numeric_limits<std::int64_t>::max())
                               .value_or(config.evict_min_usage);
  const bool list = args.has("--list") || args.has("--dry-run"), dry_run = args.has("--dry-run");
  const bool json = args.has("--json");

  // What the store will delete: the library's own dry run, by evict()'s rule.
  struct Totals {
    std::int64_t rows = 0, sightings = 0;
    std::uint64_t bytes = 0;
  };
  auto totals = [](clm::SnapshotStore& store) {
    std::vector<clm::ShardStatistics> shards;
    check(store.shard_statistics(shards), "shard_statistics");
    Totals t;
    for (const clm::ShardStatistics& s : shards) {
      t.rows += s.rows;
      t.sightings += s.sightings;
      t.bytes += s.db_bytes + s.wal_bytes;
    }
    return t;
  };
  std::vector<clm::EvictionCandidate> victims;
  Totals before, after;
  clm::EvictionReport report;
  if (dry_run) {
    std::unique_ptr<clm::SnapshotStore> store = open_reader(config);
    check(store->eviction_candidates(victims), "eviction_candidates");
    before = after = totals(*store);
  } else {
    {
      std::unique_ptr<clm::SnapshotStore> store = open_store(config);
      check(store->eviction_candidates(victims), "eviction_candidates");
      before = totals(*store);
      check(store->evict(report), "evict");
      check(store->flush(), "saving the index files");
    }  // closed: the WAL is checkpointed, so the sizes below are the files'
    after = totals(*open_reader(config));
  }
  const std::int64_t rows_before = before.rows, rows_after = after.rows;
  const std::int64_t counting_before = before.sightings, counting_after = after.sightings;
  const std::uint64_t bytes_before = before.bytes, bytes_after = after.bytes;

  if (json) {
    Json j;
    j["store"] = config.path;
    j["dry_run"] = dry_run;
    j["older_than_days"] = config.evict_after_days;
    j["below_usage"] = config.evict_min_usage;
    j["matched"] = victims.size();
    j["deleted"] = report.deleted;
    j["pages_vacuumed"] = report.pages_vacuumed;
    j["rows_before"] = rows_before;
    j["rows_after"] = rows_after;
    j["sightings_before"] = counting_before;
    j["sightings_after"] = counting_after;
    j["db_bytes_before"] = bytes_before;
    j["db_bytes_after"] = bytes_after;
    if (list) {
      Json rows = Json::array();
      for (const clm::EvictionCandidate& r : victims) {
        rows.push_back(Json{{"shard", r.shard},
                            {"tenant", printable(r.tenant)},
                            {"key", r.key},
                            {"version", r.version},
                            {"usage_count", r.usage_count},
                            {"last_used", utc(r.last_used_s)}});
      }
      j["rows"] = rows;
    }
    fmt::print("{}\n", dump(j));
    return 0;
  }
  if (list) {
    for (const clm::EvictionCandidate& r : victims) {
      fmt::print("{}  shard {:02}  tenant \"{}\"  {}  v{}  used {} time(s), last {}\n",
                 dry_run ? "would delete" : "delete", r.shard, printable(r.tenant), r.key, r.version, r.usage_count,
                 utc(r.last_used_s));
    }
  }
  const std::string rule =
      fmt::format("unused for {} days, usage below {}", config.evict_after_days, config.evict_min_usage);
  if (dry_run) {
    fmt::print("clm_store evict: {} of {} rows match ({}); --dry-run: nothing deleted\n", victims.size(), rows_before,
               rule);
    return 0;
  }
  fmt::print("clm_store evict: deleted {} rows ({}): rows {} -> {}\n", report.deleted, rule, rows_before, rows_after);
  fmt::print("  sightings pruned: {} -> {}\n", counting_before, counting_after);
  fmt::print("  vacuumed {} free pages: database files {} -> {}\n", report.pages_vacuumed, human_bytes(bytes_before),
             human_bytes(bytes_after));
  if (static_cast<std::size_t>(report.deleted) != victims.size()) {
    fmt::print(stderr,
               "clm_store evict: note: {} rows matched when listed, {} were deleted (used or added meanwhile)\n",
               victims.size(), report.deleted);
  }
  return 0;
}

// ---- rebuild-index ----------------------------------------------------------------

const std::string_view kRebuildUsage =
    "usage: clm_store rebuild-index --store DIR [--json] [--quiet] [--lexicons DIR]\n"
    "\n"
    "Rebuilds every HNSW index (one per shard and tenant) from the databases and saves it,\n"
    "as the store does in the background for a missing or corrupt index file. Progress (index\n"
    "files written) on stderr, then the time taken.\n"
    "\n"
    "  --json           the summary as one JSON object\n"
    "  --quiet          no progress on stderr\n"
    "  --lexicons DIR   the lexicons the store was made with (default: built-in)\n";

// Inode of each index file: a save writes a new file and renames it over the old one.
std::map<std::string, std::uint64_t> index_inodes(const std::string& dir) {
  std::map<std::string, std::uint64_t> out;
  for (const auto& [shard, files] : index_files(dir)) {
    for (const auto& [path, bytes] : files) {
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0) out[path] = static_cast<std::uint64_t>(st.st_ino);
    }
  }
  return out;
}

int cmd_rebuild(const Args& args) {
  args.no_positionals();
  clm::SnapshotStoreConfig config = store_config(args, false);
  const bool json = args.has("--json"), quiet = args.has("--quiet");
  std::int64_t indexes = 0, rows = 0;
  const auto t0 = Clock::now();
  config.rebuild_in_background = false;  // what is missing is rebuilt by open(), before the count starts
  std::unique_ptr<clm::SnapshotStore> store = open_store(config);
  const double open_s = seconds_since(t0);
  {
    std::vector<clm::ShardStatistics> shards;
    check(store->shard_statistics(shards), "shard_statistics");
    for (const clm::ShardStatistics& s : shards) {
      indexes += s.tenants;
      rows += s.rows;
    }
  }
  const std::uint64_t rebuilt_at_open = store->metrics().index_rebuilds;
  if (!quiet) {
    fmt::print(stderr, "clm_store rebuild-index: {} indexes ({} rows, {} shards) to rebuild{}\n", indexes, rows,
               config.num_shards,
               rebuilt_at_open ? fmt::format("; {} missing or unreadable were rebuilt while opening ({:.2f} s)",
                                             rebuilt_at_open, open_s)
                               : std::string());
  }

  const auto start_inodes = index_inodes(config.path);
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  clm::Status result;
  const auto t1 = Clock::now();
  std::thread worker([&] {
    clm::Status s;
    try {
      s = store->rebuild_indexes();
    } catch (const std::exception& e) {  // bad_alloc
      s = clm::Status(clm::StatusCode::out_of_memory, e.what());
    }
    std::lock_guard lock(mutex);
    result = s;
    done = true;
    cv.notify_all();
  });
  std::size_t reported = 0;
  auto last_print = Clock::now();
  {
    std::unique_lock lock(mutex);
    while (!cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return done; })) {
      if (quiet || Clock::now() - last_print < std::chrono::seconds(1)) continue;
      std::size_t written = 0;
      for (const auto& [path, inode] : index_inodes(config.path)) {
        const auto it = start_inodes.find(path);
        written += it == start_inodes.end() || it->second != inode ? 1 : 0;
      }
      if (written != reported) {
        reported = written;
        last_print = Clock::now();
        fmt::print(stderr, "clm_store rebuild-index: {}/{} index files written, {:.1f} s\n", written, indexes,
                   seconds_since(t1));
      }
    }
  }
  worker.join();
  check(result, "rebuild-index");
  check(store->flush(), "saving the index files");
  const double rebuild_s = seconds_since(t1);
  store.reset();
  const double total_s = seconds_since(t0);
  std::int64_t files = 0;
  for (const auto& [shard, f] : index_files(config.path)) files += static_cast<std::int64_t>(f.size());

  if (json) {
    Json j;
    j["store"] = config.path;
    j["indexes"] = indexes;
    j["rows"] = rows;
    j["rebuilt_at_open"] = rebuilt_at_open;
    j["index_files"] = files;
    j["open_seconds"] = open_s;
    j["rebuild_seconds"] = rebuild_s;
    j["seconds"] = total_s;
    fmt::print("{}\n", dump(j));
  } else {
    fmt::print(
        "clm_store rebuild-index: rebuilt {} indexes of {} rows in {:.3f} s ({:.3f} s with opening); {} index files\n",
        indexes, rows, rebuild_s, total_s, files);
  }
  return 0;
}

// ---- check ---------------------------------------------------------------------

const std::string_view kCheckUsage =
    "usage: clm_store check --store DIR [--json] [--lexicons DIR]\n"
    "\n"
    "Runs SQLite's integrity_check on every shard and verifies every stored snapshot and\n"
    "fallback (its BLOB's header, dim and checksum, and its key's fingerprint), and counts\n"
    "index files missing or unreadable (a warning: the store rebuilds those). Exit status 1\n"
    "when a shard or a row is damaged.\n"
    "\n"
    "  --json           one JSON object\n"
    "  --lexicons DIR   the lexicons the store was made with (default: built-in)\n";

int cmd_check(const Args& args) {
  args.no_positionals();
  clm::SnapshotStoreConfig config = store_config(args, false);
  const bool json = args.has("--json");
  std::vector<std::string> problems;
  clm::VerifyReport report;
  std::uint64_t index_rebuilds = 0;
  {
    std::unique_ptr<clm::SnapshotStore> store;
    config.read_only = true;  // beside a server that holds the store; writes nothing
    const clm::Status opened = clm::SnapshotStore::open(config, store);
    if (!opened.ok()) {
      problems.push_back(fmt::format("the store does not open: {}: {}{}", opened.code_name(), opened.message(),
                                     key_rules_hint(opened, config)));
    } else {
      index_rebuilds = store->metrics().index_rebuilds;
      check(store->verify(report), "verify");
      problems.insert(problems.end(), report.problems.begin(), report.problems.end());
    }
  }

  if (json) {
    Json j;
    j["store"] = config.path;
    j["ok"] = problems.empty();
    j["shards"] = config.num_shards;
    j["rows"] = report.rows;
    j["fallbacks"] = report.fallbacks;
    j["damaged_rows"] = report.damaged;
    j["indexes_rebuilt_at_open"] = index_rebuilds;
    j["problems"] = problems;
    fmt::print("{}\n", dump(j));
  } else {
    for (const std::string& p : problems) fmt::print("problem: {}\n", p);
    if (index_rebuilds > 0) {
      fmt::print(
          "warning: {} index file(s) missing or unreadable (the store rebuilds them; or: clm_store rebuild-index)\n",
          index_rebuilds);
    }
    fmt::print("clm_store check: {}: {} shards, {} rows, {} fallbacks{}\n", problems.empty() ? "ok" : "DAMAGED",
               config.num_shards, report.rows, report.fallbacks,
               report.damaged ? fmt::format(", {} damaged rows", report.damaged) : "");
  }
  return problems.empty() ? 0 : kExitProblem;
}

}  // namespace clm_store_cli
