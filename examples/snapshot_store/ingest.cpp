// examples/snapshot_store/ingest.cpp: `clm_store ingest`: JSON lines of texts or keys and snapshots, recorded into a
// store in batches.
#include "commands.hpp"

namespace clm_store_cli {

// ---- ingest --------------------------------------------------------------------

const std::string_view kIngestUsage =
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

}  // namespace clm_store_cli
