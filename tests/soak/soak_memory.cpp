// tests/soak/soak_memory.cpp: does memory stay bounded over a long run? Drives
// one Engine (device pool, host tier, snapshot store) through many requests of
// a workload (gsp or the Mooncake trace, repeated until --requests), and
// samples the process's resident set (RSS), the tree's metadata and the
// store's files as it goes.
//
//   soak_memory --workload gsp --requests 1000000 --csv rss.csv
//   soak_memory --workload mooncake:../shared/traces/mooncake/conversation_trace.jsonl --requests 1000000
//
// Per request: admit the prompt (under a tenant salt: each pass over the
// workload is one of three tenants, and one request in 16 has a salt of its
// own, as a privacy mode would), extend it by its output, and finish it (one
// in 32 is aborted instead) when it leaves the window of 4 running
// sequences. One in 16 records a snapshot of its suffix (a closed set of 128
// keys, each a fixed direction plus noise) and looks one up. One in 8 probes
// with a salt never seen before (admit, then abort: a scanner's path).
//
// Fails (exit 1) when, after the warm-up (the first --warmup fraction of the
// requests):
//   - RSS rises above its value at the end of the warm-up by more than
//     max(8 MiB, 3%): a leak grows without bound, and a million requests make
//     even a few bytes a request visible;
//   - the tree's metadata exceeds its budget, 24 bytes per token of the pool
//     (nodes are at most one per page: ~210 bytes a node over 16 tokens plus
//     4 bytes a token id), or the engine's invariants break;
//   - the namespaces outnumber what the cache can hold: one per cached page at
//     most, plus the running sequences and the tree's remembered miss roots.
// --no-rss-check reports RSS without checking it (under ASan, whose quarantine
// keeps freed memory resident). Exit 2: bad arguments or a workload that cannot be read; 77 (with
// --missing-is-skip) when the workload file is not there.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "clm/engine.hpp"
#include "store/store_test_support.hpp"
#include "workload.hpp"

namespace {

struct Options {
  std::string workload = "gsp";
  std::int64_t requests = 100000;
  double warmup = 0.2;
  std::int64_t capacity_tokens = 0;  // 0: by workload (gsp 131072, Mooncake 1M)
  std::string csv;
  std::uint64_t seed = 1;
  bool missing_is_skip = false;  // a workload file that is not there: exit 77 (ctest's skip)
  bool check_rss = true;         // off under a sanitizer, whose quarantine holds freed memory
};

constexpr std::int32_t kPageSize = 16;
constexpr std::size_t kWindow = 4;  // running sequences
constexpr int kSnapshotDim = 32;
constexpr int kSnapshotKeys = 128;
constexpr double kTreeBytesPerPoolToken = 24.0;

std::int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }
double ratio(std::int64_t part, std::int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

std::int64_t directory_bytes(const std::filesystem::path& dir) {
  std::int64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) total += static_cast<std::int64_t>(entry.file_size(ec));
  }
  return total;
}

int usage(const std::string& why) {
  fmt::print(stderr,
             "soak_memory: {}\nusage: soak_memory [--workload gsp|mooncake:FILE|FILE.jsonl] [--requests N] "
             "[--warmup FRACTION] [--capacity TOKENS] [--csv FILE] [--seed S] [--missing-is-skip] [--no-rss-check]\n",
             why);
  return 2;
}

bool parse(int argc, char** argv, Options& o, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--missing-is-skip") {
      o.missing_is_skip = true;
      continue;
    }
    if (arg == "--no-rss-check") {
      o.check_rss = false;
      continue;
    }
    if (i + 1 >= argc) {
      error = fmt::format("{}: needs a value", arg);
      return false;
    }
    const std::string value = argv[++i];
    try {
      if (arg == "--workload") {
        o.workload = value;
      } else if (arg == "--requests") {
        o.requests = std::stoll(value);
      } else if (arg == "--warmup") {
        o.warmup = std::stod(value);
      } else if (arg == "--capacity") {
        o.capacity_tokens = std::stoll(value);
      } else if (arg == "--csv") {
        o.csv = value;
      } else if (arg == "--seed") {
        o.seed = std::stoull(value);
      } else {
        error = fmt::format("unknown option {}", arg);
        return false;
      }
    } catch (const std::exception&) {
      error = fmt::format("{}: not a number: '{}'", arg, value);
      return false;
    }
  }
  if (o.requests < 100) error = "--requests: at least 100";
  if (!(o.warmup > 0 && o.warmup < 1)) error = "--warmup: a fraction in (0, 1)";
  if (o.capacity_tokens < 0) error = "--capacity: must be >= 0";
  return error.empty();
}

struct Sample {
  std::int64_t requests, rss, tree_bytes, cached_tokens, namespaces, store_bytes;
};

class Soak {
 public:
  Soak(const clm::replay::Workload& workload, std::uint64_t seed, clm::Engine& engine)
      : workload_(workload), engine_(engine), rng_(seed) {
    std::normal_distribution<float> normal;
    key_directions_.resize(static_cast<std::size_t>(kSnapshotKeys) * kSnapshotDim);
    for (float& x : key_directions_) x = normal(rng_);
  }

  // One request; false (with `error`) when a call that must work did not.
  bool step(std::int64_t i, std::string& error) {
    const auto& request = workload_.requests[static_cast<std::size_t>(i) % workload_.requests.size()];
    const std::int64_t pass = i / static_cast<std::int64_t>(workload_.requests.size());
    std::string salt = (i % 16 == 5) ? fmt::format("one-off-{}", i) : fmt::format("tenant-{}", pass % 3);
    if (i % 8 == 3 && !probe(i, error)) return false;

    clm::Admission admission;
    clm::Status s = engine_.admit(workload_.prompt(request), {.cache_salt = salt}, admission);
    while (s.code() == clm::StatusCode::out_of_memory && !running_.empty()) {
      if (!retire(error)) return false;  // make room, as a server would wait for one to end
      s = engine_.admit(workload_.prompt(request), {.cache_salt = salt}, admission);
    }
    if (!s.ok()) {
      ++refused_;
      return true;  // a prompt larger than the whole pool: refused cleanly
    }
    prompt_tokens_ += request.prompt_tokens;
    cached_tokens_ += admission.cached_tokens;
    if (!extend(admission.seq, request, error)) return false;
    if (i % 16 == 9 && !snapshots(admission.seq, i, error)) return false;
    running_.push_back({admission.seq, i % 32 == 17});
    while (running_.size() > kWindow) {
      if (!retire(error)) return false;
    }
    return true;
  }

  bool drain(std::string& error) {
    while (!running_.empty()) {
      if (!retire(error)) return false;
    }
    return true;
  }

  std::int64_t prompt_tokens() const { return prompt_tokens_; }
  std::int64_t cached_tokens() const { return cached_tokens_; }
  std::int64_t refused() const { return refused_; }
  std::int64_t store_lookups() const { return store_lookups_; }
  std::int64_t store_hits() const { return store_hits_; }

 private:
  struct Running {
    clm::SequenceId seq;
    bool abort;
  };

  bool extend(clm::SequenceId seq, const clm::replay::Request& request, std::string& error) {
    if (request.output_tokens == 0) return true;
    output_.clear();
    if (workload_.output_cached) {
      const auto all = workload_.prompt_and_output(request);
      output_.assign(all.begin() + request.prompt_tokens, all.end());
    } else {  // Mooncake: no output ids; made-up ones, unique to the request
      for (std::int32_t k = 0; k < request.output_tokens; ++k)
        output_.push_back(static_cast<std::int32_t>(rng_() >> 34));
    }
    clm::Status s = engine_.extend(seq, output_, slots_);
    if (s.code() == clm::StatusCode::out_of_memory) {
      ++refused_;  // no room for the output: the host would stop it
      return true;
    }
    return check(s, "extend", error);
  }

  bool snapshots(clm::SequenceId seq, std::int64_t i, std::string& error) {
    const int key = static_cast<int>(i / 16 % kSnapshotKeys);
    const std::string text = fmt::format("ORDER-{}", key);
    const clm::SuffixRef suffix{.text = text, .is_key = true, .group = "orders"};
    std::vector<float> snapshot(key_directions_.begin() + key * kSnapshotDim,
                                key_directions_.begin() + (key + 1) * kSnapshotDim);
    std::normal_distribution<float> noise(0.0f, 0.02f);
    for (float& x : snapshot) x += noise(rng_);
    clm::RecordOutcome recorded;
    if (!check(engine_.record_snapshot(seq, suffix, snapshot, recorded), "record_snapshot", error)) return false;
    clm::SnapshotHit hit;
    std::vector<float> found(kSnapshotDim);
    std::uint8_t apply = 0;
    const clm::Status looked = engine_.lookup_snapshots(std::span(&seq, 1), std::span(&suffix, 1), snapshot,
                                                        std::span(&hit, 1), found, std::span(&apply, 1));
    if (!check(looked, "lookup_snapshots", error)) return false;
    ++store_lookups_;
    if (hit.level != clm::SnapshotLevel::miss) ++store_hits_;
    return true;
  }

  // A salt never seen before: admit (a miss that creates the namespace), abort.
  bool probe(std::int64_t i, std::string& error) {
    const auto& request = workload_.requests[static_cast<std::size_t>(i * 7919) % workload_.requests.size()];
    const auto prompt = workload_.prompt(request).first(std::min<std::size_t>(64, request.prompt_tokens));
    const std::string salt = fmt::format("probe-{}", i);
    clm::Admission admission;
    const clm::Status s = engine_.admit(prompt, {.cache_salt = salt}, admission);
    if (s.code() == clm::StatusCode::out_of_memory) return true;
    if (!check(s, "probe admit", error)) return false;
    if (admission.cached_tokens != 0) {
      error = fmt::format("probe {}: a salt never seen before got {} cached tokens", i, admission.cached_tokens);
      return false;
    }
    return check(engine_.abort(admission.seq), "probe abort", error);
  }

  bool retire(std::string& error) {
    const Running r = running_.front();
    running_.pop_front();
    return r.abort ? check(engine_.abort(r.seq), "abort", error) : check(engine_.finish(r.seq), "finish", error);
  }

  static bool check(const clm::Status& s, const char* what, std::string& error) {
    if (s.ok()) return true;
    error = fmt::format("{}: {}", what, s.message());
    return false;
  }

  const clm::replay::Workload& workload_;
  clm::Engine& engine_;
  std::mt19937_64 rng_;
  std::vector<float> key_directions_;
  std::deque<Running> running_;
  std::vector<std::int32_t> output_;
  std::vector<std::int64_t> slots_;
  std::int64_t prompt_tokens_ = 0, cached_tokens_ = 0, refused_ = 0, store_lookups_ = 0, store_hits_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  std::string error;
  if (!parse(argc, argv, options, error)) return usage(error);
  clm::replay::Workload workload;
  const std::string file = options.workload.rfind("mooncake:", 0) == 0 ? options.workload.substr(9) : options.workload;
  if (options.missing_is_skip && file != "gsp" && !std::filesystem::exists(file)) {
    fmt::print(stderr, "soak_memory: SKIPPED: no workload file {}\n", file);
    return 77;
  }
  if (const clm::Status s = clm::replay::load_workload(options.workload, 42, workload); !s.ok()) {
    return usage(fmt::format("--workload: {}", s.message()));
  }
  const bool mooncake = options.workload.rfind("mooncake:", 0) == 0;
  const std::int64_t capacity = options.capacity_tokens > 0 ? options.capacity_tokens : (mooncake ? 1 << 20 : 131072);

  clm_test::TempDir store_dir;
  clm::EngineConfig config;
  config.pool.num_pages = static_cast<std::int32_t>(capacity / kPageSize);
  config.pool.page_size = kPageSize;
  config.pool.num_layers = 1;  // real bytes (copied to the host tier), but few: 512 a page
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.dtype = clm::KvDType::f16;
  config.tiers.host_pages = 2 * config.pool.num_pages;
  config.snapshot_store.path = store_dir.path().string();
  config.snapshot_store.num_shards = 4;
  config.snapshot_store.snapshot_dim = kSnapshotDim;
  config.snapshot_store.min_usage_threshold = 3;
  config.snapshot_store.lookup_timeout_us = 2'000'000;  // no busy misses on a loaded machine
  std::unique_ptr<clm::Engine> engine;
  if (const clm::Status s = clm::Engine::create(config, engine); !s.ok()) {
    fmt::print(stderr, "soak_memory: engine: {}\n", s.message());
    return 1;
  }

  fmt::print(stderr, "soak_memory: {} requests of {} ({} in the workload), pool {} tokens, host tier {} tokens\n",
             options.requests, options.workload, workload.requests.size(), capacity, 2 * capacity);
  Soak soak(workload, options.seed, *engine);
  const std::int64_t sample_every = std::max<std::int64_t>(1, options.requests / 400);
  const std::int64_t warmup_end = static_cast<std::int64_t>(options.warmup * static_cast<double>(options.requests));
  std::vector<Sample> samples;
  auto sample = [&](std::int64_t done) {
    const clm::EngineMetrics m = engine->metrics();
    samples.push_back({done, rss_bytes(), static_cast<std::int64_t>(m.cache.metadata_bytes), m.cache.cached_tokens,
                       m.cache.namespaces, directory_bytes(store_dir.path())});
  };
  std::int64_t max_namespaces = 0, worst_namespace_margin = 1 << 30;
  const auto started = std::chrono::steady_clock::now();
  int shown_percent = -1;
  for (std::int64_t i = 0; i < options.requests; ++i) {
    if (!soak.step(i, error)) {
      fmt::print(stderr, "\nsoak_memory: request {}: {}\n", i, error);
      return 1;
    }
    if (i % 64 == 0) {  // the namespace bound, checked often (metrics() is cheap)
      const clm::EngineMetrics m = engine->metrics();
      const std::int64_t bound = m.cache.cached_tokens / kPageSize + static_cast<std::int64_t>(kWindow) + 1 +
                                 static_cast<std::int64_t>(clm::RadixTree::kMissRoots);
      max_namespaces = std::max(max_namespaces, m.cache.namespaces);
      worst_namespace_margin = std::min(worst_namespace_margin, bound - m.cache.namespaces);
    }
    if ((i + 1) % sample_every == 0) sample(i + 1);
    const int percent = static_cast<int>(100 * (i + 1) / options.requests);
    if (percent != shown_percent && isatty(STDERR_FILENO)) {
      shown_percent = percent;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      fmt::print(stderr, "\r  {:3d}%  {:>9} requests  RSS {:6.1f} MiB  {:6.0f} s", percent, i + 1, mib(rss_bytes()), s);
    } else if (percent != shown_percent && percent % 10 == 0) {
      shown_percent = percent;
      fmt::print(stderr, "  {}% ({} requests), RSS {:.1f} MiB\n", percent, i + 1, mib(rss_bytes()));
    }
  }
  if (!soak.drain(error)) {
    fmt::print(stderr, "\nsoak_memory: drain: {}\n", error);
    return 1;
  }
  engine->wait_for_tiers();
  sample(options.requests);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (isatty(STDERR_FILENO)) fmt::print(stderr, "\n");

  if (!options.csv.empty()) {
    std::ofstream csv(options.csv);
    csv << "requests,rss_bytes,tree_bytes,cached_tokens,namespaces,store_bytes\n";
    for (const Sample& s : samples) {
      csv << fmt::format("{},{},{},{},{},{}\n", s.requests, s.rss, s.tree_bytes, s.cached_tokens, s.namespaces,
                         s.store_bytes);
    }
  }

  // The checks.
  std::vector<std::string> failures;
  if (const clm::Status s = engine->check_invariants(); !s.ok()) failures.push_back("invariants: " + s.message());
  const auto at_warmup =
      std::find_if(samples.begin(), samples.end(), [&](const Sample& s) { return s.requests >= warmup_end; });
  std::int64_t rss_warm = at_warmup->rss, rss_max_after = 0, tree_max = 0, store_max = 0;
  for (auto it = at_warmup; it != samples.end(); ++it) rss_max_after = std::max(rss_max_after, it->rss);
  for (const Sample& s : samples) {
    tree_max = std::max(tree_max, s.tree_bytes);
    store_max = std::max(store_max, s.store_bytes);
  }
  const std::int64_t rss_allowed = std::max<std::int64_t>(8 << 20, rss_warm * 3 / 100);
  if (options.check_rss && rss_max_after - rss_warm > rss_allowed) {
    failures.push_back(
        fmt::format("RSS grew after the warm-up: {:.1f} MiB at request {}, then up to {:.1f} MiB "
                    "(allowed: +{:.1f} MiB)",
                    mib(rss_warm), at_warmup->requests, mib(rss_max_after), mib(rss_allowed)));
  }
  const auto tree_budget = static_cast<std::int64_t>(kTreeBytesPerPoolToken * static_cast<double>(capacity));
  if (tree_max > tree_budget) {
    failures.push_back(fmt::format("tree metadata {} B past its budget {} B", tree_max, tree_budget));
  }
  if (worst_namespace_margin < 0) {
    failures.push_back(fmt::format("namespaces past their bound (by {})", -worst_namespace_margin));
  }
  rusage self_usage{};
  getrusage(RUSAGE_SELF, &self_usage);
  fmt::print(
      "{{\"soak\": \"memory\", \"workload\": \"{}\", \"requests\": {}, \"wall_s\": {:.1f}, \"pool_tokens\": {}, "
      "\"prompt_hit_rate\": {:.4f}, \"refused\": {}, \"rss_at_warmup_mib\": {:.1f}, \"rss_max_after_warmup_mib\": "
      "{:.1f}, \"rss_growth_allowed_mib\": {:.1f}, \"max_rss_mib\": {:.1f}, \"tree_max_bytes\": {}, "
      "\"tree_budget_bytes\": {}, \"max_namespaces\": {}, \"store_max_bytes\": {}, \"workload_mib\": {:.1f}, "
      "\"snapshot_lookups\": {}, "
      "\"snapshot_hits\": {}, \"ok\": {}}}\n",
      options.workload, options.requests, wall_s, capacity, ratio(soak.cached_tokens(), soak.prompt_tokens()),
      soak.refused(), mib(rss_warm), mib(rss_max_after), mib(rss_allowed), mib(self_usage.ru_maxrss * 1024), tree_max,
      tree_budget, max_namespaces, store_max,
      mib(static_cast<std::int64_t>(workload.tokens.capacity() * sizeof(std::int32_t))), soak.store_lookups(),
      soak.store_hits(), failures.empty() ? "true" : "false");
  for (const std::string& f : failures) fmt::print(stderr, "soak_memory: FAILED: {}\n", f);
  return failures.empty() ? 0 : 1;
}
