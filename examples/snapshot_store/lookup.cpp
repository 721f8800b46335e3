// examples/snapshot_store/lookup.cpp: `clm_store lookup`: what a store serves for a text or a key (levels exact, ann,
// fallback), opened read-only.
#include "commands.hpp"

namespace clm_store_cli {

// ---- lookup ----------------------------------------------------------------------

const std::string_view kLookupUsage =
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

}  // namespace clm_store_cli
