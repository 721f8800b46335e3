// examples/snapshot_store/rekey.cpp: `clm_store rekey`: a store brought under the current key rules (or adopting them).
#include "commands.hpp"

namespace clm_store_cli {

// ---- rekey ---------------------------------------------------------------------

const std::string_view kRekeyUsage =
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

}  // namespace clm_store_cli
