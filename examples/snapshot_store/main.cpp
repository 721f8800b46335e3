// examples/snapshot_store/main.cpp: `clm_store`, the command-line tool for
// CLM's semantic snapshot store (clm/store/snapshot_store.hpp). With it a
// person sees which key a text gets, loads snapshots into a store, asks a
// store what it would serve for a suffix, and looks after a store on disk:
// row counts and file sizes, eviction, index rebuilds, integrity checks, and
// corrects it by hand (admin.cpp: versions, pins, rollback, deletion, the
// blacklist), and draws a key's vectors to see whether it holds one meaning
// or two (plot.cpp). The commands live by concept in text_keys.cpp,
// ingest.cpp, lookup.cpp, maintenance.cpp, rekey.cpp and plot.cpp
// (commands.hpp); this file
// dispatches. A
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
//   $ clm_store plot --store snaps --key REFUND --group after-sale --top 6 --out refund.png
//   clm_store plot: REFUND (shard 3): 10 rows, versions 1..10 -> refund.png
//     PC1   96.4% of the variance (0.6204)      # look at the picture: one cluster, or two?
//   ...
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
// stats, check, evict --dry-run, plot) open the store read-only, so they run beside
// a server that holds it; the others take the store's lock.
#include "admin.hpp"
#include "commands.hpp"

namespace {

using namespace clm_store_cli;  // NOLINT(google-build-using-namespace): the tool's own helpers

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
    "  plot           a PNG of a key's vectors on their two principal axes, by version, with\n"
    "                 its nearest other keys: one cluster, or two meanings under one key\n"
    "  anomalies      what a server's CLM watch saw (its --clm-events JSON lines): keys seen\n"
    "                 often with a low SRC, blacklists and why, versions and drift\n"
    "\n"
    "  versions       a key's versions: usage, confirmations, which one is served\n"
    "  pin, unpin     serve one version of a key whatever is recorded later; lift that\n"
    "  rollback       delete a key's versions newer than one\n"
    "  delete-key     delete every version of a key\n"
    "  delete-tenant  delete everything of a tenant\n"
    "  blacklist      refuse a key at every level for a while, with a reason (--list: the entries)\n"
    "  unblacklist    lift a key's blacklist entry\n"
    "\n"
    "A store is a directory (--store DIR) of shard-NN.db files, their usage counts\n"
    "(shard-NN.usage.db) and their index files. Its shard count and snapshot_dim are read\n"
    "from it (--shards / --dim, if given, must agree), so only `ingest` into a new\n"
    "directory needs --dim. It records the key rules its keys were\n"
    "made under (this clmcache's, and the lexicons of --lexicons DIR, default built-in), and\n"
    "every command must open it with the same --lexicons (and --replace-lexicons, which uses\n"
    "DIR's lexicons instead of the built-in ones), or rekey it. The reading commands (key, lookup,\n"
    "versions, blacklist --list, stats, check, evict --dry-run, plot, anomalies) open a store\n"
    "read-only and run beside the server that holds it; the others take its lock: run them while\n"
    "no server has it open (they are refused, \"already open\", while one has).\n"
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
      {"plot",
       kPlotUsage,
       flags(kStoreFlags, {"--text", "--key", "--group", "--tenant", "--top", "--out", "--points"}),
       {"--replace-lexicons"},
       cmd_plot},
      {"anomalies",
       kAnomaliesUsage,
       flags(kStoreFlags, {"--events", "--hours"}),
       {"--json", "--replace-lexicons"},
       cmd_anomalies},
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
