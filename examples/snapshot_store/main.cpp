// examples/snapshot_store/main.cpp: `clm_store`, the command-line tool for
// CLM's semantic snapshot store (clm/store/snapshot_store.hpp). With it a
// person sees which key a text gets, loads snapshots into a store, asks a
// store what it would serve for a suffix, and looks after a store on disk:
// row counts and file sizes, eviction, index rebuilds, integrity checks, and
// corrects it by hand (admin.cpp: versions, pins, rollback, deletion, the
// blacklist). A
// store is a directory of shard-NN.db files and their index files; its shard
// count and snapshot_dim are read from it, so only `ingest` into a new
// directory needs --dim. A session:
//
//   $ printf '%s\n' 'Please check the status of order 789' "Don't check order 789" "what's the weather" | clm_store key
//   QUERY-ORDER-789-STATUS	386c341078d6679e
//   NOT-QUERY-ORDER-789	241298e0efc7b771
//   QUERY	3329356e41b93ca3	abstained: unknown word "weather"
//   $ head -1 turns.jsonl
//   {"text":"Please check the status of order 789","snapshot":[0.106,0.202,0.304,0.404,0.503,0.601,0.706,0.809]}
//   $ clm_store ingest --store snaps --dim 8 --shards 4 --min-usage 2 --input turns.jsonl
//   clm_store ingest: 12 records from turns.jsonl into snaps (4 shards, dim 8) in 0.24 s
//     counted              3
//     admitted             3
//     confirmed            6
//     new_version          0
//     drifted              0
//     rows                 3 (was 0)
//   $ clm_store lookup --store snaps "What's the status of order #789?"
//   query key     QUERY-ORDER-789-STATUS  (fingerprint 386c341078d6679e, shard 1)
//   level         exact
//   similarity    1.000000
//   key           QUERY-ORDER-789-STATUS
//   ...
//   $ clm_store lookup --store snaps --key faq-99 --group orders --query '[0.12,0.2,0.29,0.41,0.5,0.6,0.68,0.8]'
//   query key     faq-99  (fingerprint 6d5dc60faf62f8c8, shard 0)
//   level         ann
//   similarity    0.999728
//   key           faq-12
//   ...
//   $ clm_store stats --store snaps            # rows, keys, file sizes per shard; metrics
//   $ clm_store evict --store snaps --older-than-days 30 --list
//   clm_store evict: deleted 0 rows (unused for 30 days, usage below 5): rows 5 -> 5
//   ...
//   $ clm_store rebuild-index --store snaps
//   clm_store rebuild-index: rebuilt 4 indexes of 5 rows in 0.167 s (0.320 s with opening); 4 index files
//   $ clm_store check --store snaps
//   clm_store check: ok: 4 shards, 5 rows, 0 fallbacks
//   $ clm_store lookup --store snaps --lexicons my-lexicons "order 789?"   # other key rules: refused
//   clm_store lookup: cannot open the store at snaps: failed_precondition: ... Run `clm_store rekey snaps` ...
//   $ clm_store rekey --lexicons my-lexicons snaps   # keys made again from their texts
//   $ clm_store rekey --adopt old-store              # a store of before keys kept their text: keep its keys
//
// `clm_store COMMAND --help` tells each command's options. Exit status: 0 ok;
// 1 a problem found (key: some lines failed; check: damage); 2 an error (bad
// flags or input, a store that cannot be opened or written), with a message
// on stderr. Everything goes through the store's API (no SQL of its own):
// the commands that only read (key, lookup, versions, blacklist --list,
// stats, check, evict --dry-run) open the store read-only, so they run beside
// a server that holds it; the others take the store's lock.
#include "admin.hpp"
#include "cli.hpp"

namespace {

using namespace clm_store_cli;  // NOLINT(google-build-using-namespace): the tool's own helpers

// ---- key ---------------------------------------------------------------------

constexpr std::string_view kKeyUsage =
    "usage: clm_store key [--json] [--lexicons DIR [--replace-lexicons]] < lines.txt\n"
    "\n"
    "Prints, for each line of UTF-8 text on stdin, its suffix key and the key's fingerprint\n"
    "(FNV-1a 64, hex), tab-separated, and for a key that abstained (low information: never\n"
    "served at levels 1 and 2) a third column \"abstained: <why>\". A line the keyer refuses (invalid UTF-8, no "
    "content,\n"
    "over 16 KiB) gets its error on stderr and an empty line on stdout, so output lines match\n"
    "input lines; the other lines go on, and the exit status is 1 at the end.\n"
    "\n"
    "  --json          one JSON object per line: line, key, fingerprint, group, entity, action,\n"
    "                  object, details, low_information, abstain_reason (a failed line: line,\n"
    "                  error, code)\n"
    "  --lexicons DIR  a directory of *.tsv lexicons added to the built-in ones\n"
    "  --replace-lexicons  DIR's lexicons instead of the built-in ones\n";

int cmd_key(const Args& args) {
  args.no_positionals();
  const bool json = args.has("--json");
  std::unique_ptr<clm::SuffixKeyer> keyer;
  check(clm::SuffixKeyer::create(keyer_config(args), keyer), "cannot load the lexicons");

  std::string line;
  std::size_t n = 0, failed = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    clm::SuffixKey k;
    const clm::Status s = keyer->make_key(line, k);
    if (!s.ok()) {
      ++failed;
      std::fflush(stdout);  // keeps stdout and stderr in order on a terminal
      fmt::print(stderr, "clm_store key: line {}: {}: {}\n", n, s.code_name(), s.message());
      if (json) {
        fmt::print("{}\n", dump(Json{{"line", n}, {"error", s.message()}, {"code", s.code_name()}}));
      } else {
        fmt::print("\n");
      }
      continue;
    }
    if (json) {
      Json j;
      j["line"] = n;
      j["key"] = k.key;
      j["fingerprint"] = hex(k.fingerprint);
      j["group"] = hex(k.group);
      j["entity"] = k.entity;
      j["action"] = k.action;
      j["object"] = k.object;
      j["details"] = k.details;
      j["low_information"] = k.low_information;
      j["abstain_reason"] = k.abstain_reason;
      fmt::print("{}\n", dump(j));
    } else {
      // A third column for an abstained key: the store never serves it at levels 1 and 2.
      if (k.low_information) {
        fmt::print("{}\t{}\tabstained: {}\n", k.key, hex(k.fingerprint), k.abstain_reason);
      } else {
        fmt::print("{}\t{}\n", k.key, hex(k.fingerprint));
      }
    }
  }
  if (std::cin.bad()) throw Failure{"reading stdin failed"};
  if (failed) {
    std::fflush(stdout);
    fmt::print(stderr, "clm_store key: {} of {} lines failed\n", failed, n);
    return kExitProblem;
  }
  return 0;
}

// ---- ingest --------------------------------------------------------------------

constexpr std::string_view kIngestUsage =
    "usage: clm_store ingest --store DIR [--input FILE] [--tenant T] [--dim N] [--shards N]\n"
    "                        [--min-usage N] [--version-cosine C] [--batch N] [--lexicons DIR]\n"
    "                        [--json] [--quiet]\n"
    "\n"
    "Records snapshots into the store at DIR, creating it when DIR holds none (--dim is then\n"
    "required). Input: JSON lines, from FILE or stdin, each one of\n"
    "  {\"text\": \"...\", \"snapshot\": [numbers]}                 keyed by the suffix keyer\n"
    "  {\"key\": \"...\", \"group\": \"...\", \"snapshot\": [numbers]}  a host's own key (group optional)\n"
    "with an optional \"tenant\" (default: --tenant). Blank lines are skipped; other fields are\n"
    "an error. The whole input is read and checked before anything is written (it is held in\n"
    "memory: about 4 x dim bytes a record): a malformed line, a snapshot of the wrong length,\n"
    "a value that is not a finite float, an all-zero snapshot or text without content is\n"
    "reported with its line number, and the store is left as it was. Then the records go\n"
    "to the store in batches (record_batch: one transaction per shard touched), with\n"
    "progress on stderr for long inputs, and a summary by outcome is printed. A text the\n"
    "keyer abstains on (low information: a greeting, ...) is not stored: `abstained`.\n"
    "\n"
    "  --input FILE        the JSON lines (default and \"-\": stdin)\n"
    "  --tenant T          the tenant of lines without \"tenant\" (default: empty)\n"
    "  --dim N             snapshot_dim of a new store, 1..4096 (an existing one: must agree)\n"
    "  --shards N          shard count of a new store, 1..256 (default 16; an existing one: must agree)\n"
    "  --min-usage N       sightings before a key is stored (default 50; 1 stores each key at\n"
    "                      once). The store keeps the counts, so they add up over runs\n"
    "  --version-cosine C  below this cosine to the key's newest version, a new version\n"
    "                      (default 0.95)\n"
    "  --batch N           records per record_batch call (default 512)\n"
    "  --lexicons DIR      lexicons for \"text\" lines; a store records them (its key rules),\n"
    "                      so every later command on it must give the same ones\n"
    "  --json              the summary as one JSON object\n"
    "  --quiet             no progress on stderr\n";

struct IngestRecord {
  std::size_t line = 0;
  std::string tenant;
  clm::SuffixKey key;
  std::vector<float> snapshot;
};

constexpr std::size_t kMaxTenantBytes = std::size_t{1} << 16;  // the store's limit

// One line of ingest's input, checked; the reason in `error` when it is refused.
bool parse_ingest_line(std::string_view text, const clm::SuffixKeyer& keyer, std::int32_t dim,
                       const std::string& default_tenant, IngestRecord& out, std::string& error) {
  Json j;
  if (!parse_json(text, j, error)) return false;
  if (!j.is_object()) {
    error = fmt::format("expected a JSON object, got {}", j.type_name());
    return false;
  }
  for (const auto& [name, value] : j.items()) {
    if (name != "text" && name != "key" && name != "group" && name != "snapshot" && name != "tenant") {
      error = fmt::format("unknown field \"{}\" (fields: text or key, group, snapshot, tenant)", name);
      return false;
    }
    if (name != "snapshot" && !value.is_string()) {
      error = fmt::format("\"{}\" must be a string, not {}", name, value.type_name());
      return false;
    }
  }
  const bool has_text = j.contains("text"), has_key = j.contains("key");
  if (has_text == has_key) {
    error = has_text ? "give \"text\" or \"key\", not both" : "needs \"text\" or \"key\"";
    return false;
  }
  if (has_text && j.contains("group")) {
    error = "\"group\" goes with \"key\" (a text's group comes from its key)";
    return false;
  }
  if (!j.contains("snapshot")) {
    error = "needs \"snapshot\"";
    return false;
  }
  if (!json_vector(j["snapshot"], dim, "snapshot", out.snapshot, error)) return false;
  out.tenant = j.contains("tenant") ? j["tenant"].get<std::string>() : default_tenant;
  if (out.tenant.size() > kMaxTenantBytes) {
    error = fmt::format("tenant of {} bytes (at most {})", out.tenant.size(), kMaxTenantBytes);
    return false;
  }
  const clm::Status s =
      has_text ? keyer.make_key(j["text"].get<std::string>(), out.key)
               : clm::SuffixKeyer::from_host_key(j["key"].get<std::string>(), j.value("group", std::string()), out.key);
  if (!s.ok()) {
    error = fmt::format("{}: {}", has_text ? "text" : "key", s.message());
    return false;
  }
  return true;
}

// A line of progress on stderr at most every `every` seconds.
class Progress {
 public:
  Progress(bool quiet, double every = 2.0) : quiet_(quiet), every_(every) {}
  template <class... T>
  void maybe(fmt::format_string<T...> format, T&&... values) {
    if (quiet_) return;
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_).count() < every_) return;
    last_ = now;
    fmt::print(stderr, format, std::forward<T>(values)...);
  }

 private:
  bool quiet_;
  double every_;
  Clock::time_point last_ = Clock::now();
};

int cmd_ingest(const Args& args) {
  args.no_positionals();
  clm::SnapshotStoreConfig config = store_config(args, true);
  config.min_usage_threshold =
      args.integer<std::int64_t>("--min-usage", 1, std::int64_t{1} << 40).value_or(config.min_usage_threshold);
  config.version_cosine =
      static_cast<float>(args.real("--version-cosine", 1e-6, 1.0).value_or(static_cast<double>(config.version_cosine)));
  const auto batch_size = args.integer<std::size_t>("--batch", 1, 1000000).value_or(512);
  const std::string tenant = args.get("--tenant").value_or("");
  if (tenant.size() > kMaxTenantBytes) throw UsageError{"--tenant: too long"};
  const bool json = args.has("--json"), quiet = args.has("--quiet");
  const std::string input = args.get("--input").value_or("-");
  const std::string source = input == "-" ? "stdin" : input;

  std::ifstream file;
  if (input != "-") {
    file.open(input, std::ios::binary);
    if (!file) throw Failure{fmt::format("cannot open {}: {}", input, std::strerror(errno))};
  }
  std::istream& in = input == "-" ? std::cin : file;

  // 1. Read and check everything.
  std::unique_ptr<clm::SuffixKeyer> keyer;
  check(clm::SuffixKeyer::create(config.keyer, keyer), "cannot load the lexicons");
  const auto t0 = Clock::now();
  Progress progress(quiet);
  std::vector<IngestRecord> records;
  std::size_t line_no = 0, bad = 0;
  constexpr std::size_t kErrorsShown = 20;
  std::string line, error;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    IngestRecord r;
    r.line = line_no;
    if (!parse_ingest_line(line, *keyer, config.snapshot_dim, tenant, r, error)) {
      if (++bad <= kErrorsShown) fmt::print(stderr, "clm_store ingest: {}:{}: {}\n", source, line_no, error);
      continue;
    }
    if (bad == 0) records.push_back(std::move(r));
    progress.maybe("clm_store ingest: read {} lines\n", line_no);
  }
  if (in.bad()) throw Failure{fmt::format("reading {} failed", source)};
  if (bad) {
    if (bad > kErrorsShown) fmt::print(stderr, "clm_store ingest: ... and {} more\n", bad - kErrorsShown);
    throw Failure{fmt::format("{} of the lines of {} refused: nothing was written", bad, source)};
  }

  // 2. Write.
  std::unique_ptr<clm::SnapshotStore> store = open_store(config);
  const std::int64_t rows_before = store->metrics().snapshots;
  std::uint64_t by_result[7] = {};  // by clm::RecordResult
  std::vector<clm::SnapshotRecord> batch;
  std::vector<clm::RecordOutcome> outcomes;
  const auto t_write = Clock::now();
  for (std::size_t start = 0; start < records.size(); start += batch_size) {
    const std::size_t end = std::min(records.size(), start + batch_size);
    batch.clear();
    for (std::size_t i = start; i < end; ++i)
      batch.push_back({records[i].tenant, &records[i].key, records[i].snapshot});
    outcomes.assign(batch.size(), {});
    const clm::Status s = store->record_batch(batch, outcomes);
    if (!s.ok()) {
      throw Failure{fmt::format(
          "recording the batch of lines {}..{} failed: {}: {}\n  the {} records before line {} were committed; of this "
          "batch, the records of shards that committed before the failing one were kept (record_batch commits per "
          "shard)",
          records[start].line, records[end - 1].line, s.code_name(), s.message(), start, records[start].line)};
    }
    for (const clm::RecordOutcome& o : outcomes) ++by_result[static_cast<std::size_t>(o.result)];
    const double elapsed = seconds_since(t_write);
    progress.maybe("clm_store ingest: recorded {}/{} ({:.0f}%), {:.0f} records/s\n", end, records.size(),
                   100.0 * static_cast<double>(end) / static_cast<double>(records.size()),
                   static_cast<double>(end) / std::max(elapsed, 1e-9));
  }
  check(store->flush(), "saving the index files");
  const std::int64_t rows_after = store->metrics().snapshots;
  const double seconds = seconds_since(t0);

  const clm::RecordResult results[] = {clm::RecordResult::counted,   clm::RecordResult::admitted,
                                       clm::RecordResult::confirmed, clm::RecordResult::new_version,
                                       clm::RecordResult::drifted,   clm::RecordResult::abstained};
  if (json) {
    Json j;
    j["store"] = config.path;
    j["input"] = source;
    j["records"] = records.size();
    for (const auto r : results) j[clm::record_result_name(r)] = by_result[static_cast<std::size_t>(r)];
    j["rows_before"] = rows_before;
    j["rows_after"] = rows_after;
    j["seconds"] = seconds;
    fmt::print("{}\n", dump(j));
  } else {
    fmt::print("clm_store ingest: {} records from {} into {} ({} shards, dim {}) in {:.2f} s\n", records.size(), source,
               config.path, config.num_shards, config.snapshot_dim, seconds);
    for (const auto r : results) {
      fmt::print("  {:<12} {:>9}\n", clm::record_result_name(r), by_result[static_cast<std::size_t>(r)]);
    }
    fmt::print("  {:<12} {:>9} (was {})\n", "rows", rows_after, rows_before);
  }
  return 0;
}

// ---- lookup ----------------------------------------------------------------------

constexpr std::string_view kLookupUsage =
    "usage: clm_store lookup --store DIR (TEXT | --text TEXT | --key K [--group G])\n"
    "                        [--query JSON | --query-file FILE] [--tenant T] [--print-snapshot]\n"
    "                        [--json] [--similarity-floor F] [--top-k K] [--no-wait] [--lexicons DIR]\n"
    "\n"
    "Asks the store what it would serve for one suffix, and prints the level (exact: the key's\n"
    "newest stable version, else its newest one, not stable; ann: the most similar snapshot of\n"
    "the same group to the query vector; fallback: a greeting's generic snapshot; or miss),\n"
    "similarity, key, fingerprint, version, stable, and the level-2 candidates.\n"
    "\n"
    "  TEXT, --text TEXT      the user's text, keyed as ingest keys it\n"
    "  --key K [--group G]    a host's own key and group, as ingested\n"
    "  --query JSON           the query snapshot: a JSON array of dim numbers (level 2 needs one)\n"
    "  --query-file FILE      the same from FILE (\"-\": stdin): a JSON array, or an object with\n"
    "                         \"snapshot\" (a line of ingest's input)\n"
    "  --tenant T             the tenant (default: empty)\n"
    "  --print-snapshot       print the served snapshot too (unit length, f16 precision)\n"
    "  --json                 one JSON object\n"
    "  --similarity-floor F   the cosine a level-2 candidate needs (default 0.80)\n"
    "  --top-k K              level-2 candidates, 1..64 (default 3)\n"
    "  --no-wait              answer at once, as a server just opened would: level 2 answers miss\n"
    "                         for a shard whose index is still being rebuilt, and a lookup past\n"
    "                         2 ms is a miss. Without it, a missing or stale index is rebuilt\n"
    "                         before the lookup, and the lookup may take up to 10 s\n"
    "  --lexicons DIR         the lexicons the store was made with (ingest's; default: built-in)\n"
    "\n"
    "A hit counts as a use of its row (usage_count, last_used), as a server's lookup does.\n"
    "Exit status 0 for a hit and for a miss alike.\n";

int cmd_lookup(const Args& args) {
  clm::SnapshotStoreConfig config = store_config(args, false);
  const bool no_wait = args.has("--no-wait");
  config.rebuild_in_background = no_wait;
  // A person asking what the store serves wants the answer, not the breaker's
  // miss of a busy machine: without --no-wait the lookup (level 2 included)
  // may take up to 10 s.
  if (!no_wait) config.lookup_timeout_us = 10'000'000;
  config.similarity_floor = static_cast<float>(
      args.real("--similarity-floor", -1.0, 1.0).value_or(static_cast<double>(config.similarity_floor)));
  config.ann_top_k = args.integer<std::int32_t>("--top-k", 1, 64).value_or(config.ann_top_k);
  config.ann_ef_search = std::max(config.ann_ef_search, config.ann_top_k);
  const std::string tenant = args.get("--tenant").value_or("");
  const bool json = args.has("--json"), print_snapshot = args.has("--print-snapshot");

  const NamedSuffix suffix = named_suffix(args);

  std::vector<float> query;
  if (args.has("--query") && args.has("--query-file")) throw UsageError{"give --query or --query-file, not both"};
  if (args.has("--query") || args.has("--query-file")) {
    std::string source = "--query", body;
    if (const auto q = args.get("--query")) {
      body = *q;
    } else {
      const std::string path = *args.get("--query-file");
      source = path == "-" ? "stdin" : path;
      std::ifstream file;
      if (path != "-") {
        file.open(path, std::ios::binary);
        if (!file) throw Failure{fmt::format("cannot open {}: {}", path, std::strerror(errno))};
      }
      std::istream& in = path == "-" ? std::cin : file;
      body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (in.bad()) throw Failure{fmt::format("reading {} failed", source)};
    }
    Json j;
    std::string error;
    if (!parse_json(body, j, error)) throw Failure{fmt::format("{}: {}", source, error)};
    if (j.is_object()) {
      if (!j.contains("snapshot")) throw Failure{fmt::format("{}: an object needs \"snapshot\"", source)};
      j = Json(j["snapshot"]);
    }
    if (!json_vector(j, config.snapshot_dim, "the query", query, error)) {
      throw Failure{fmt::format("{}: {}", source, error)};
    }
  }

  std::unique_ptr<clm::SnapshotStore> store = open_reader(config);  // beside a server; writes nothing
  const clm::SuffixKey key = key_of(suffix, *store);
  const std::int32_t shard = store->shard_of(tenant, key);
  clm::SnapshotHit hit;
  std::vector<float> snapshot(static_cast<std::size_t>(config.snapshot_dim));
  check(store->lookup(tenant, key, query, hit, snapshot), "lookup");
  const clm::SnapshotStoreMetrics m = store->metrics();

  if (!no_wait && m.index_rebuilds > 0) {
    fmt::print(stderr, "clm_store lookup: note: {} index file(s) were missing or unreadable and were rebuilt first\n",
               m.index_rebuilds);
  }
  if (m.ann_unavailable > 0) {
    fmt::print(stderr, "clm_store lookup: note: level 2 was off: shard {}'s index is being rebuilt (--no-wait)\n",
               shard);
  }
  if (m.busy_misses > 0)
    fmt::print(stderr, "clm_store lookup: note: shard {} was busy: the miss is the breaker's\n", shard);
  if (m.blacklisted_skips > 0) fmt::print(stderr, "clm_store lookup: note: blacklisted keys were skipped\n");
  const bool hit_level = hit.level != clm::SnapshotLevel::miss;
  if (json) {
    Json j;
    j["query_key"] = key.key;
    j["query_fingerprint"] = hex(key.fingerprint);
    j["query_group"] = hex(key.group);
    j["low_information"] = key.low_information;
    j["tenant"] = printable(tenant);
    j["shard"] = shard;
    j["level"] = clm::snapshot_level_name(hit.level);
    j["similarity"] = tidy(hit.similarity);
    j["key"] = hit.key;
    j["fingerprint"] = hex(hit.fingerprint);
    j["version"] = hit.version;
    j["stable"] = hit.stable;
    Json candidates = Json::array();
    for (const auto& c : hit.candidates) {
      candidates.push_back(Json{{"key", c.key},
                                {"fingerprint", hex(c.fingerprint)},
                                {"version", c.version},
                                {"similarity", tidy(c.similarity)}});
    }
    j["candidates"] = candidates;
    if (print_snapshot && hit_level) j["snapshot"] = json_floats(snapshot);
    fmt::print("{}\n", dump(j));
    return 0;
  }
  fmt::print("{:<13} {}  (fingerprint {}, shard {}{})\n", "query key", key.key, hex(key.fingerprint), shard,
             key.low_information ? ", low information" : "");
  fmt::print("{:<13} {}\n", "level", clm::snapshot_level_name(hit.level));
  if (hit_level) {
    fmt::print("{:<13} {:.6f}\n", "similarity", hit.similarity);
    fmt::print("{:<13} {}\n", "key", hit.key);
    fmt::print("{:<13} {}\n", "fingerprint", hex(hit.fingerprint));
    fmt::print("{:<13} {}\n", "version", hit.version);
    fmt::print("{:<13} {}\n", "stable", hit.stable ? "yes" : "no");
  }
  fmt::print("{:<13} {}\n", "candidates", hit.candidates.size());
  for (std::size_t i = 0; i < hit.candidates.size(); ++i) {
    const auto& c = hit.candidates[i];
    fmt::print("  {:>2}. {:.6f}  {}  v{}  ({})\n", i + 1, c.similarity, c.key, c.version, hex(c.fingerprint));
  }
  if (print_snapshot && hit_level) fmt::print("{:<13} {}\n", "snapshot", dump(json_floats(snapshot)));
  return 0;
}

// ---- stats ---------------------------------------------------------------------

constexpr std::string_view kStatsUsage =
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

constexpr std::string_view kEvictUsage =
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

constexpr std::string_view kRebuildUsage =
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

constexpr std::string_view kCheckUsage =
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

// ---- rekey ---------------------------------------------------------------------

constexpr std::string_view kRekeyUsage =
    "usage: clm_store rekey [--adopt] [--lexicons DIR [--replace-lexicons]] [--json] (DIR | --store DIR)\n"
    "\n"
    "Brings a store under the key rules of this clmcache (and of --lexicons, the lexicons\n"
    "its users key with). A store records the rules its keys were made under, and refuses to\n"
    "open under others: the same text would get another key.\n"
    "\n"
    "Without --adopt: every row's key is made again from the text it was made of; a row whose\n"
    "new key routes to another shard moves there; rows of a host's own key (no text) are\n"
    "kept; a row whose text makes no key now (the keyer abstains, or refuses it) is deleted,\n"
    "and listed by reason. Versions of keys that became one are numbered again by age;\n"
    "blacklist entries of changed keys and every admission count are dropped; the index\n"
    "files are rebuilt. Each shard changes in one transaction; a rekey that is interrupted\n"
    "leaves the store refusing to open until it is run again, which finishes it.\n"
    "\n"
    "  --adopt          keep every key as it is and record the current rules: for a store made\n"
    "                   before keys kept their text (format 1), or to keep the old keys on purpose\n"
    "  --lexicons DIR   the lexicons the store's users key with (default: the built-in ones)\n"
    "  --replace-lexicons  DIR's lexicons instead of the built-in ones (default: added to them)\n"
    "  --json           the report as one JSON object\n"
    "\n"
    "Run it while no server has the store open (it takes the store's lock). A store refused\n"
    "because --lexicons was left out needs the flag, not a rekey: a rekey to other lexicons\n"
    "changes keys and deletes the rows whose texts those lexicons cannot key.\n";

int cmd_rekey(const Args& args) {
  if (args.positionals().size() > 1) throw UsageError{"give one store directory"};
  if (args.has("--store") && !args.positionals().empty()) throw UsageError{"give the directory once"};
  clm::SnapshotStoreConfig config;
  if (args.positionals().empty()) {
    config.path = args.required("--store");
  } else {
    config.path = args.positionals()[0];
  }
  if (config.path.empty()) throw UsageError{"the store directory is empty"};
  if (config.path == ":memory:") throw UsageError{":memory: keeps nothing to rekey: give a directory"};
  const std::optional<Layout> layout = read_layout(config.path);
  if (!layout) {
    throw Failure{fmt::format("no snapshot store at {} (no {})", config.path, shard_path(config.path, 0))};
  }
  config.num_shards = layout->shards;
  config.snapshot_dim = layout->dim;
  config.keyer = keyer_config(args);
  const bool adopt = args.has("--adopt"), json = args.has("--json");

  const auto t0 = Clock::now();
  clm::RekeyReport r;
  check(clm::SnapshotStore::rekey(config, adopt, r), fmt::format("rekey of {}", config.path));
  const double seconds = seconds_since(t0);
  constexpr std::size_t kReasonsShown = 20;

  if (json) {
    Json j;
    j["store"] = config.path;
    j["adopted"] = r.adopted;
    j["resumed"] = r.resumed;
    j["old_format"] = r.old_format;
    j["old_rules"] = hex(r.old_rules);
    j["new_rules"] = hex(r.new_rules);
    j["rows_before"] = r.rows_before;
    j["rows_after"] = r.rows_after;
    j["rekeyed"] = r.rekeyed;
    j["changed"] = r.changed;
    j["moved"] = r.moved;
    j["kept"] = r.kept;
    j["dropped"] = r.dropped;
    j["versions_renumbered"] = r.versions_renumbered;
    j["sightings_dropped"] = r.sightings_dropped;
    j["blacklist_dropped"] = r.blacklist_dropped;
    j["indexes_rebuilt"] = r.indexes_rebuilt;
    Json drops = Json::array();
    for (const auto& d : r.drops) drops.push_back(Json{{"reason", d.reason}, {"rows", d.rows}, {"example", d.example}});
    j["drops"] = drops;
    j["seconds"] = seconds;
    fmt::print("{}\n", dump(j));
    return 0;
  }
  if (r.adopted) {
    fmt::print(
        "clm_store rekey --adopt: {} (format {}, key rules {}) now records key rules {}; its {} rows keep "
        "their keys\n",
        config.path, r.old_format, r.old_format < 2 ? std::string("none") : hex(r.old_rules), hex(r.new_rules),
        r.rows_after);
    return 0;
  }
  fmt::print("clm_store rekey: {} rekeyed from key rules {} to {}{} in {:.2f} s\n", config.path, hex(r.old_rules),
             hex(r.new_rules), r.resumed ? " (an interrupted rekey, finished)" : "", seconds);
  fmt::print("  {:<20} {} -> {}\n", "rows", r.rows_before, r.rows_after);
  fmt::print("  {:<20} {} (key changed: {}, moved to another shard: {})\n", "rekeyed from text", r.rekeyed, r.changed,
             r.moved);
  fmt::print("  {:<20} {}\n", "kept (host keys)", r.kept);
  fmt::print("  {:<20} {}\n", "dropped", r.dropped);
  for (std::size_t i = 0; i < r.drops.size() && i < kReasonsShown; ++i) {
    fmt::print("    {:>6}  {}  (e.g. \"{}\")\n", r.drops[i].rows, r.drops[i].reason, r.drops[i].example);
  }
  if (r.drops.size() > kReasonsShown) fmt::print("    ... and {} more reasons\n", r.drops.size() - kReasonsShown);
  fmt::print("  {:<20} {}\n", "versions renumbered", r.versions_renumbered);
  fmt::print("  {:<20} sightings {}, blacklist entries {}\n", "dropped state", r.sightings_dropped,
             r.blacklist_dropped);
  fmt::print("  {:<20} {}\n", "indexes rebuilt", r.indexes_rebuilt);
  return 0;
}

// ---- main ------------------------------------------------------------------------

constexpr std::string_view kUsage =
    "usage: clm_store COMMAND [options]        (clm_store COMMAND --help: its options)\n"
    "\n"
    "  key            the suffix key and fingerprint of each line of text on stdin\n"
    "  ingest         record JSON lines {\"text\" or \"key\", \"snapshot\"} into a store\n"
    "  lookup         what a store serves for a text or key (levels exact, ann, fallback)\n"
    "  stats          rows, keys and file sizes per shard, and the store's metrics\n"
    "  evict          delete rows unused for a while, then vacuum\n"
    "  rebuild-index  rebuild every HNSW index from the databases\n"
    "  check          integrity_check of every shard, and every snapshot's checksum\n"
    "  rekey          rebuild a store's keys from their texts under the current key rules\n"
    "                 (--adopt: keep the keys, record the rules)\n"
    "\n"
    "  versions       a key's versions: usage, confirmations, which one is served\n"
    "  pin, unpin     serve one version of a key whatever is recorded later; lift that\n"
    "  rollback       delete a key's versions newer than one\n"
    "  delete-key     delete every version of a key\n"
    "  delete-tenant  delete everything of a tenant\n"
    "  blacklist      refuse a key at every level for a while, with a reason (--list: the entries)\n"
    "  unblacklist    lift a key's blacklist entry\n"
    "\n"
    "A store is a directory (--store DIR) of shard-NN.db files and their index files. Its\n"
    "shard count and snapshot_dim are read from it (--shards / --dim, if given, must agree),\n"
    "so only `ingest` into a new directory needs --dim. It records the key rules its keys were\n"
    "made under (this clmcache's, and the lexicons of --lexicons DIR, default built-in), and\n"
    "every command must open it with the same --lexicons (and --replace-lexicons, which uses\n"
    "DIR's lexicons instead of the built-in ones), or rekey it. A store serves one process at a time:\n"
    "run ingest, evict and rebuild-index while no server has it open (the server's indexes in\n"
    "memory would not see the changes, and the index files it saves would drop them).\n"
    "Exit status: 0 ok; 1 a problem found (key: some lines failed; check: damage);\n"
    "2 an error (bad flags or input, a store that cannot be opened or written).\n";

struct Command {
  std::string_view name;
  std::string_view usage;
  std::vector<std::string_view> value_flags;
  std::vector<std::string_view> switches;
  int (*run)(const Args&);
};

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"key", kKeyUsage, {"--lexicons"}, {"--json", "--replace-lexicons"}, cmd_key},
      {"ingest",
       kIngestUsage,
       flags(kStoreFlags, {"--input", "--tenant", "--min-usage", "--version-cosine", "--batch"}),
       {"--json", "--quiet", "--replace-lexicons"},
       cmd_ingest},
      {"lookup",
       kLookupUsage,
       flags(kStoreFlags,
             {"--text", "--key", "--group", "--query", "--query-file", "--tenant", "--similarity-floor", "--top-k"}),
       {"--print-snapshot", "--json", "--no-wait", "--replace-lexicons"},
       cmd_lookup},
      {"stats", kStatsUsage, kStoreFlags, {"--json", "--replace-lexicons"}, cmd_stats},
      {"evict",
       kEvictUsage,
       flags(kStoreFlags, {"--older-than-days", "--below-usage"}),
       {"--list", "--dry-run", "--json", "--replace-lexicons"},
       cmd_evict},
      {"rebuild-index", kRebuildUsage, kStoreFlags, {"--json", "--quiet", "--replace-lexicons"}, cmd_rebuild},
      {"check", kCheckUsage, kStoreFlags, {"--json", "--replace-lexicons"}, cmd_check},
      {"rekey", kRekeyUsage, {"--store", "--lexicons"}, {"--adopt", "--json", "--replace-lexicons"}, cmd_rekey},
      {"versions", kVersionsUsage, kKeyFlags, {"--json", "--replace-lexicons"}, cmd_versions},
      {"pin", kPinUsage, flags(kKeyFlags, {"--version"}), {"--replace-lexicons"}, cmd_pin},
      {"unpin", kUnpinUsage, kKeyFlags, {"--replace-lexicons"}, cmd_unpin},
      {"rollback", kRollbackUsage, flags(kKeyFlags, {"--to"}), {"--json", "--replace-lexicons"}, cmd_rollback},
      {"delete-key", kDeleteKeyUsage, kKeyFlags, {"--json", "--replace-lexicons"}, cmd_delete_key},
      {"delete-tenant",
       kDeleteTenantUsage,
       flags(kStoreFlags, {"--tenant"}),
       {"--json", "--replace-lexicons"},
       cmd_delete_tenant},
      {"blacklist",
       kBlacklistUsage,
       flags(kKeyFlags, {"--reason", "--hours"}),
       {"--list", "--json", "--replace-lexicons"},
       cmd_blacklist},
      {"unblacklist", kUnblacklistUsage, kKeyFlags, {"--replace-lexicons"}, cmd_unblacklist},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  std::string prefix = "clm_store";
  std::string help_hint = "clm_store --help";
  try {
    if (argc < 2) {
      fmt::print(stderr, "{}", kUsage);
      return kExitError;
    }
    const std::string_view name = argv[1];
    if (name == "--help" || name == "-h" || name == "help") {
      fmt::print("{}", kUsage);
      return 0;
    }
    const auto& all = commands();
    const auto command = std::find_if(all.begin(), all.end(), [&](const Command& c) { return c.name == name; });
    if (command == all.end()) throw UsageError{fmt::format("unknown command '{}'", name)};
    prefix = fmt::format("clm_store {}", name);
    help_hint = fmt::format("clm_store {} --help", name);
    for (int i = 2; i < argc && std::string_view(argv[i]) != "--"; ++i) {
      if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
        fmt::print("{}", command->usage);
        return 0;
      }
    }
    const Args args(argc, argv, 2, command->value_flags, command->switches, command->name);
    const int rc = command->run(args);
    std::fflush(stdout);
    if (std::ferror(stdout)) {
      fmt::print(stderr, "{}: writing stdout failed\n", prefix);
      return kExitError;
    }
    return rc;
  } catch (const UsageError& e) {
    fmt::print(stderr, "{}: {}\n({} for usage)\n", prefix, e.message, help_hint);
  } catch (const Failure& e) {
    fmt::print(stderr, "{}: {}\n", prefix, e.message);
  } catch (const std::exception& e) {  // bad_alloc, a JSON type error missed above
    fmt::print(stderr, "{}: {}\n", prefix, e.what());
  }
  return kExitError;
}
