// examples/replay/main.cpp: the `replay` command. Parses flags, loads the
// workload, replays it through PagedKvPool + RadixTree (or, with tier flags,
// through a clm::Engine with a host tier and storage) and prints the figures
// (see replay_driver.hpp for the protocol, ../shared/workloads.md for the
// workloads).
//
// Exit status: 0 ok, 1 the replay failed a check (page leak, broken tree
// invariant, a tier serving wrong K/V bytes), 2 bad input (flags, files,
// malformed lines, a storage URL the Engine refuses or cannot open).
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "clm/cache/eviction_policy.hpp"
#include "clm/tiers/storage_url.hpp"
#include "replay_driver.hpp"
#include "workload.hpp"

namespace {

using clm::replay::ReplayConfig;
using clm::replay::ReplayResult;
using clm::replay::Workload;

constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;

constexpr std::string_view kUsage =
    "usage: replay --workload gsp|FILE.jsonl|mooncake:FILE --page-size N --capacity TOKENS\n"
    "              [--policy lru|lfu|slru|priority|ghost_slru|belady] [--protected-fraction F]\n"
    "              [--ghost-memory M] [--hint-next-turn-within S [--hint-recall R]\n"
    "               [--hint-false-rate Q] [--hint-update raise|set]] [--json] [--repeat K] [--seed S]\n"
    "              [--no-divergence]\n"
    "              [--l2-capacity TOKENS [--storage URL --model-id ID]\n"
    "               [--write-policy write_through|write_through_selective|write_back]\n"
    "               [--prefetch best_effort|wait_complete|timeout]\n"
    "               [--kv-events ENDPOINT --model-id ID [--kv-events-replay ENDPOINT]\n"
    "                [--kv-events-buffer BATCHES] [--kv-events-linger SECONDS]]]\n"
    "       replay --write-gsp FILE [--seed S]   (then replays too when --workload is given)\n"
    "\n"
    "  --workload   gsp: SGLang's generated-shared-prefix workload (64 groups x 16 prompts,\n"
    "               2048-token system prompts, 128-token questions, 256-token outputs);\n"
    "               FILE: JSONL, one {\"prompt\":[..],\"output\":[..],\"salt\":\"..\"} per line;\n"
    "               mooncake:FILE: a Mooncake trace (512-token hash blocks)\n"
    "  --page-size  tokens per KV page\n"
    "  --capacity   pool size in tokens (num_pages = capacity / page size)\n"
    "  --policy     eviction policy (default lru); belady is the offline optimum (MIN): the leaf\n"
    "               whose next use is farthest goes first, from the whole workload known ahead\n"
    "               (replay only, not with tiers)\n"
    "  --protected-fraction\n"
    "               slru and ghost_slru: the protected segment's cap, a fraction of the pool in\n"
    "               [0, 1] (default 0.2 for slru, 0.9 for ghost_slru)\n"
    "  --ghost-memory\n"
    "               ghost_slru: how many pool capacities of evicted prefixes the ghost remembers,\n"
    "               in [0, 64] (default 4)\n"
    "  --hint-next-turn-within\n"
    "               ghost_slru and priority, Mooncake traces with timestamps: cache a request\n"
    "               with priority 1 when its conversation's next turn comes within S seconds\n"
    "               (an oracle, read from the trace: what a host's hint would be worth)\n"
    "  --hint-recall, --hint-false-rate\n"
    "               the hint's errors: the share of requests whose next turn comes in time\n"
    "               that are hinted (default 1), and of the others (default 0); drawn from\n"
    "               a hash of the request's index, the same in every run\n"
    "  --hint-update\n"
    "               how a request's priority meets the priority cached along its prompt:\n"
    "               raise (default) keeps the highest, so a conversation once hinted stays\n"
    "               hinted; set replaces it, so a hint ends when the next turn comes unhinted\n"
    "  --json       one JSON object on stdout instead of text\n"
    "  --repeat     replays on a fresh pool and tree; times are their median (default 1)\n"
    "  --no-divergence\n"
    "               switch off the branch points and match-depth counting (docs/observability.md),\n"
    "               the baseline of their cost\n"
    "  --seed       gsp generator seed (default 42)\n"
    "  --write-gsp  write the gsp workload of --seed as JSONL to FILE\n"
    "\n"
    "Tiers (the replay then runs each request through a clm::Engine with a tiered cache:\n"
    "admit, decode the output, finish, and a wait for the tiers' copies and storage calls):\n"
    "  --l2-capacity   host tier (L2) size in tokens; --capacity is then the device tier (L1).\n"
    "                  0 or absent: no tiers (the plain replay above)\n"
    "  --storage       storage tier (L3) URL, needs --l2-capacity: file:///DIR?capacity_mb=N or\n"
    "                  redis://HOST:PORT/DB?prefix=P&ttl=S. Stored pages need KV bytes, so with\n"
    "                  storage L1 is host memory of a tiny page (1 layer, 1 KV head, head_dim 8,\n"
    "                  f16: 256 bytes a token) whose rows the replay writes and checks on every\n"
    "                  hit; without it, page ids only. Runs once (no --repeat): a repeat would\n"
    "                  find the first run's pages in storage\n"
    "  --model-id      the model the stored pages are of (required with --storage): pages stored\n"
    "                  under one id are never served under another\n"
    "  --write-policy  when L1 pages get host copies (default write_through)\n"
    "  --prefetch      how long an admission waits for storage (default wait_complete, so that\n"
    "                  a run's hits do not depend on timing)\n"
    "  The figures then split hits by tier: hit_rate = hit_rate_device + hit_rate_host +\n"
    "  hit_rate_storage (tokens served from each / prompt tokens).\n"
    "\n"
    "KV events (docs/fleet.md; on the tiered path, with --model-id):\n"
    "  --kv-events         publish the run's KV events on ENDPOINT (ZeroMQ PUB, e.g.\n"
    "                      tcp://127.0.0.1:5557); every event is published before the figures\n"
    "  --kv-events-replay  a replay socket on ENDPOINT (ZeroMQ ROUTER)\n"
    "  --kv-events-buffer  batches the replay socket keeps (default 10000)\n"
    "  --kv-events-linger  seconds the engine and its replay socket stay after the figures are\n"
    "                      printed, for subscribers that join late (default 0)\n"
    "  The figures then add the events' counters and cached_pages {device, host}: the pages\n"
    "  on each tier at the end, what a subscriber that missed nothing holds.\n";

struct Options {
  std::string workload;
  std::optional<std::int64_t> page_size;
  std::optional<std::int64_t> capacity;
  clm::EvictionPolicy policy = clm::EvictionPolicy::lru;
  std::optional<double> protected_fraction;
  std::optional<double> ghost_memory;
  std::optional<double> hint_next_turn_within;
  std::optional<double> hint_recall;
  std::optional<double> hint_false_rate;
  std::optional<clm::PriorityUpdate> hint_update;
  bool json = false;
  int repeat = 1;
  std::uint64_t seed = clm::replay::GspParams{}.seed;
  std::string write_gsp;
  std::optional<std::int64_t> l2_capacity;
  std::string storage_url;
  std::string model_id;
  std::optional<clm::WritePolicy> write_policy;
  std::optional<clm::PrefetchPolicy> prefetch_policy;
  std::string kv_events, kv_events_replay;
  std::optional<std::int32_t> kv_events_buffer;
  double kv_events_linger_s = 0;
  bool divergence = true;
  bool tiered() const { return l2_capacity && *l2_capacity > 0; }
};

// Thrown only inside flag parsing, turned into exit status 2 by main.
struct UsageError {
  std::string message;
};

template <class Int>
Int parse_int(std::string_view flag, std::string_view text, Int min_value) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw UsageError{fmt::format("{}: '{}' is not an integer (or is out of range)", flag, text)};
  }
  if (value < min_value) throw UsageError{fmt::format("{}: must be >= {}, got {}", flag, min_value, value)};
  return value;
}

// A finite number; its range is the replay's to check (run_replay).
double parse_number(std::string_view flag, std::string_view text) {
  double value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    throw UsageError{fmt::format("{}: '{}' is not a number", flag, text)};
  }
  return value;
}

Options parse_flags(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> inline_value;  // --flag=value
    if (const auto eq = arg.find('='); arg.substr(0, 2) == "--" && eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError{fmt::format("{} needs a value", arg)};
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) throw UsageError{fmt::format("{} takes no value", arg)};
    };
    if (arg == "--workload") {
      options.workload = value();
      if (options.workload.empty()) throw UsageError{"--workload: empty"};
    } else if (arg == "--page-size") {
      options.page_size = parse_int<std::int64_t>(arg, value(), 1);
      if (*options.page_size > std::numeric_limits<std::int32_t>::max()) throw UsageError{"--page-size: too large"};
    } else if (arg == "--capacity") {
      options.capacity = parse_int<std::int64_t>(arg, value(), 1);
    } else if (arg == "--policy") {
      const std::string_view name = value();
      const auto policy = clm::parse_eviction_policy(name);
      if (!policy) {
        throw UsageError{
            fmt::format("--policy: unknown policy '{}' (lru, lfu, slru, priority, ghost_slru, belady)", name)};
      }
      options.policy = *policy;
    } else if (arg == "--protected-fraction") {
      options.protected_fraction = parse_number(arg, value());
    } else if (arg == "--ghost-memory") {
      options.ghost_memory = parse_number(arg, value());
    } else if (arg == "--hint-next-turn-within") {
      options.hint_next_turn_within = parse_number(arg, value());
    } else if (arg == "--hint-recall") {
      options.hint_recall = parse_number(arg, value());
    } else if (arg == "--hint-false-rate") {
      options.hint_false_rate = parse_number(arg, value());
    } else if (arg == "--hint-update") {
      const std::string_view name = value();
      options.hint_update = clm::parse_priority_update(name);
      if (!options.hint_update) throw UsageError{fmt::format("--hint-update: unknown update '{}' (raise, set)", name)};
    } else if (arg == "--json") {
      no_value();
      options.json = true;
    } else if (arg == "--no-divergence") {
      no_value();
      options.divergence = false;
    } else if (arg == "--repeat") {
      options.repeat = parse_int<int>(arg, value(), 1);
    } else if (arg == "--seed") {
      options.seed = parse_int<std::uint64_t>(arg, value(), 0);
    } else if (arg == "--write-gsp") {
      options.write_gsp = value();
      if (options.write_gsp.empty()) throw UsageError{"--write-gsp: empty file name"};
    } else if (arg == "--l2-capacity") {
      options.l2_capacity = parse_int<std::int64_t>(arg, value(), 0);
    } else if (arg == "--storage") {
      options.storage_url = value();
      if (options.storage_url.empty()) throw UsageError{"--storage: empty URL"};
    } else if (arg == "--model-id") {
      options.model_id = value();
      if (options.model_id.empty()) throw UsageError{"--model-id: empty id"};
    } else if (arg == "--write-policy") {
      const std::string_view name = value();
      options.write_policy = clm::parse_write_policy(name);
      if (!options.write_policy) {
        throw UsageError{fmt::format(
            "--write-policy: unknown policy '{}' (write_through, write_through_selective, write_back)", name)};
      }
    } else if (arg == "--kv-events") {
      options.kv_events = value();
      if (options.kv_events.empty()) throw UsageError{"--kv-events: empty endpoint"};
    } else if (arg == "--kv-events-replay") {
      options.kv_events_replay = value();
      if (options.kv_events_replay.empty()) throw UsageError{"--kv-events-replay: empty endpoint"};
    } else if (arg == "--kv-events-buffer") {
      options.kv_events_buffer = parse_int<std::int32_t>(arg, value(), 1);
    } else if (arg == "--kv-events-linger") {
      const std::string_view text = value();
      options.kv_events_linger_s = parse_number(arg, text);
      if (options.kv_events_linger_s < 0 || options.kv_events_linger_s > 3600) {
        throw UsageError{fmt::format("--kv-events-linger: must be in [0, 3600] seconds, got {}", text)};
      }
    } else if (arg == "--prefetch") {
      const std::string_view name = value();
      options.prefetch_policy = clm::parse_prefetch_policy(name);
      if (!options.prefetch_policy) {
        throw UsageError{fmt::format("--prefetch: unknown policy '{}' (best_effort, wait_complete, timeout)", name)};
      }
    } else {
      throw UsageError{fmt::format("unknown argument '{}'", argv[i])};
    }
  }
  if (options.workload.empty() && options.write_gsp.empty()) throw UsageError{"--workload is required"};
  if (!options.workload.empty()) {
    if (!options.page_size) throw UsageError{"--page-size is required"};
    if (!options.capacity) throw UsageError{"--capacity is required"};
  }
  if (!options.storage_url.empty() && !options.tiered()) {
    throw UsageError{"--storage needs a host tier: --l2-capacity TOKENS (> 0)"};
  }
  if (!options.storage_url.empty() && options.model_id.empty()) {
    throw UsageError{"--storage needs --model-id ID: stored pages are one model's, never served to another"};
  }
  if (!options.model_id.empty() && options.storage_url.empty() && options.kv_events.empty()) {
    throw UsageError{"--model-id names the stored pages' (or the KV events') model: it needs --storage or --kv-events"};
  }
  if (!options.kv_events.empty() && !options.tiered()) {
    throw UsageError{"--kv-events runs on the tiered path (an Engine): it needs --l2-capacity TOKENS (> 0)"};
  }
  if (!options.kv_events.empty() && options.model_id.empty()) {
    throw UsageError{"--kv-events needs --model-id ID: the block hashes name the model"};
  }
  if (options.kv_events.empty() &&
      (!options.kv_events_replay.empty() || options.kv_events_buffer || options.kv_events_linger_s > 0)) {
    throw UsageError{"--kv-events-replay, --kv-events-buffer and --kv-events-linger need --kv-events"};
  }
  if (!options.kv_events.empty() && options.repeat > 1) {
    throw UsageError{"--kv-events runs once (no --repeat): each repeat is a new engine, its stream from 0"};
  }
  if (options.policy == clm::EvictionPolicy::belady && options.tiered()) {
    throw UsageError{"--policy belady runs on the plain replay only (no --l2-capacity): the Engine refuses it"};
  }
  if ((options.write_policy || options.prefetch_policy) && !options.l2_capacity) {
    throw UsageError{"--write-policy and --prefetch need --l2-capacity"};
  }
  if (!options.storage_url.empty() && options.repeat > 1) {
    throw UsageError{"--storage runs once (no --repeat): a repeat would find the first run's pages in storage"};
  }
  return options;
}

// JSON has no inf or nan.
std::string json_number(double x) { return std::isfinite(x) ? fmt::format("{}", x) : "null"; }

// A JSON string (nlohmann-json's escaping; bytes that are not UTF-8 become U+FFFD).
std::string json_string(std::string_view s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The KV events' fields (with a leading comma), or nothing.
std::string kv_events_json(const ReplayResult& r) {
  if (!r.kv_events.enabled) return {};
  const clm::KvEventsMetrics& k = r.kv_events;
  return fmt::format(
      ",\"kv_events\":{{\"endpoint\":{},\"replay_endpoint\":{},\"published_events\":{},\"published_batches\":{},"
      "\"dropped_events\":{},\"resyncs\":{}}},\"cached_pages\":{{\"device\":{},\"host\":{}}}",
      json_string(r.kv_events_endpoint), json_string(r.kv_events_replay_endpoint), k.published_events,
      k.published_batches, k.dropped_events, k.resyncs, r.cached_pages_device, r.cached_pages_host);
}

// The tiered path's fields (with a leading comma), or nothing.
std::string tier_json(const Options& options, const ReplayResult& r) {
  if (!r.tiered) return {};
  const clm::TierMetrics& t = r.tiers;
  return fmt::format(
             ",\"l2_capacity\":{},\"host_pages\":{},\"storage\":{},\"write_policy\":\"{}\",\"prefetch\":\"{}\","
             "\"kv_bytes_checked\":{},\"hit_rate_device\":{},\"hit_rate_host\":{},\"hit_rate_storage\":{},"
             "\"device_hit_tokens\":{},\"host_hit_tokens\":{},\"storage_hit_tokens\":{},\"load_backs\":{},"
             "\"loaded_pages\":{},\"backed_up_pages\":{},\"dropped_backups\":{},\"stored_pages\":{},"
             "\"fetched_pages\":{},\"prefetch_timeouts\":{},\"storage_errors\":{},\"storage_corrupt_pages\":{},"
             "\"storage_dropped_writes\":{}",
             *options.l2_capacity, r.host_pages,
             options.storage_url.empty() ? "null" : json_string(clm::redact_storage_url(options.storage_url)),
             clm::write_policy_name(options.write_policy.value_or(clm::replay::ReplayConfig{}.write_policy)),
             clm::prefetch_policy_name(options.prefetch_policy.value_or(clm::replay::ReplayConfig{}.prefetch_policy)),
             r.has_kv_bytes ? "true" : "false", json_number(r.device_hit_rate()), json_number(r.host_hit_rate()),
             json_number(r.storage_hit_rate()), r.device_hit_tokens, r.host_hit_tokens, r.storage_hit_tokens,
             t.load_backs, t.loaded_pages, t.backed_up_pages, t.dropped_backups, t.stored_pages, t.fetched_pages,
             t.prefetch_timeouts, t.storage_errors, t.storage.corrupt_pages, t.storage.dropped_writes) +
         kv_events_json(r);
}

// The divergence fields (with a leading comma): `null` when switched off.
std::string divergence_json(const Options& options, const ReplayResult& r) {
  if (!options.divergence) return ",\"divergence\":null";
  const clm::BranchPoint& b = r.top_branch_point;
  return fmt::format(
      ",\"divergence\":{{\"diverged_lookups\":{},\"top_branch_point\":{{\"tenant\":{},\"depth\":{},\"branches\":{},"
      "\"hits\":{}}}}}",
      r.diverged_lookups, json_string(b.tenant), b.depth, b.branches, b.hits);
}

void print_json(const Options& options, const ReplayResult& r, double memcmp_gbps) {
  std::string runs;
  for (const double w : r.wall_s_runs) {
    if (!runs.empty()) runs.push_back(',');
    runs.append(json_number(w));
  }
  fmt::print(
      "{{\"workload\":{},\"policy\":\"{}\",\"protected_fraction\":{},\"ghost_memory\":{},"
      "\"hint_next_turn_within_s\":{},\"hint_recall\":{},\"hint_false_rate\":{},\"hint_update\":\"{}\","
      "\"hinted_requests\":{},"
      "\"page_size\":{},\"capacity\":{},\"num_pages\":{},\"seed\":{},"
      "\"requests\":{},\"failed_requests\":{},\"prompt_tokens\":{},\"hit_tokens\":{},\"hit_rate\":{},"
      "\"inserted_tokens\":{},\"evicted_tokens\":{},\"evictions\":{},\"repeat\":{},\"wall_s\":{},"
      "\"wall_s_runs\":[{}],\"requests_per_s\":{},"
      "\"metadata_bytes_per_token\":{},\"metadata_sampled_at\":\"peak cached tokens, sampled every 64 requests\","
      "\"peak_cached_tokens\":{},\"metadata_bytes_at_peak\":{},"
      "\"metadata_bytes_per_token_end\":{},\"cached_tokens_end\":{},\"metadata_bytes_end\":{},"
      "\"touched_bytes\":{},\"memcmp_gbps\":{},\"memory_bound_fraction\":{}{}}}\n",
      json_string(options.workload), clm::eviction_policy_name(options.policy), json_number(r.protected_fraction),
      json_number(r.ghost_memory), json_number(r.hint_next_turn_within_s), json_number(r.hint_recall),
      json_number(r.hint_false_rate), clm::priority_update_name(r.hint_update), r.hinted_requests, r.page_size,
      *options.capacity, r.num_pages, options.seed, r.requests, r.failed_requests, r.prompt_tokens, r.hit_tokens,
      json_number(r.hit_rate()), r.inserted_tokens, r.evicted_tokens, r.evictions, options.repeat,
      json_number(r.wall_s), runs, json_number(r.requests_per_s()), json_number(r.metadata_bytes_per_token()),
      r.peak_cached_tokens, r.metadata_bytes_at_peak, json_number(r.final_metadata_bytes_per_token()),
      r.final_cached_tokens, r.final_metadata_bytes, r.touched_bytes(), json_number(memcmp_gbps),
      json_number(r.memory_bound_fraction(memcmp_gbps)), tier_json(options, r) + divergence_json(options, r));
}

void print_text(const Options& options, const ReplayResult& r, double memcmp_gbps) {
  fmt::print("workload          {} ({} requests, {} prompt tokens)\n", options.workload, r.requests, r.prompt_tokens);
  std::string parameters;
  if (std::isfinite(r.protected_fraction)) parameters += fmt::format(" (protected {}", r.protected_fraction);
  if (std::isfinite(r.ghost_memory)) parameters += fmt::format(", ghost {} pool capacities", r.ghost_memory);
  if (!parameters.empty()) parameters += ")";
  if (std::isfinite(r.hint_next_turn_within_s)) {
    parameters += fmt::format(", {} requests hinted (next turn within {} s; recall {}, false rate {}; {})",
                              r.hinted_requests, r.hint_next_turn_within_s, r.hint_recall, r.hint_false_rate,
                              clm::priority_update_name(r.hint_update));
  }
  fmt::print("cache             {}{}, page size {}, capacity {} tokens ({} pages)\n",
             clm::eviction_policy_name(options.policy), parameters, r.page_size, *options.capacity, r.num_pages);
  fmt::print("hit rate          {:.4f} ({} of {} prompt tokens), {} failed requests\n", r.hit_rate(), r.hit_tokens,
             r.prompt_tokens, r.failed_requests);
  fmt::print("stored / evicted  {} tokens stored, {} tokens evicted in {} leaves\n", r.inserted_tokens,
             r.evicted_tokens, r.evictions);
  if (options.divergence) {
    const clm::BranchPoint& b = r.top_branch_point;
    fmt::print("divergence        {} lookups split off a longer cached path", r.diverged_lookups);
    if (b.branches > 0) {
      fmt::print("; top branch point at token {} ({} splits, {} hits past it)", b.depth, b.branches, b.hits);
    }
    fmt::print("\n");
  }
  if (r.tiered) {
    const clm::TierMetrics& t = r.tiers;
    fmt::print("tiers             L1 {} tokens, L2 {} tokens ({} pages), storage {}; {}, prefetch {}\n",
               *options.capacity, *options.l2_capacity, r.host_pages,
               options.storage_url.empty() ? std::string("none") : options.storage_url,
               clm::write_policy_name(options.write_policy.value_or(ReplayConfig{}.write_policy)),
               clm::prefetch_policy_name(options.prefetch_policy.value_or(ReplayConfig{}.prefetch_policy)));
    fmt::print("hits by tier      device {:.4f}, host {:.4f}, storage {:.4f}{}\n", r.device_hit_rate(),
               r.host_hit_rate(), r.storage_hit_rate(), r.has_kv_bytes ? " (every cached K/V row checked)" : "");
    fmt::print("tier copies       {} pages loaded to L1 in {} load-backs, {} backed up to L2 ({} dropped)\n",
               t.loaded_pages, t.load_backs, t.backed_up_pages, t.dropped_backups);
    if (!options.storage_url.empty()) {
      fmt::print("storage           {} pages stored, {} fetched, {} errors, {} prefetch timeouts\n", t.stored_pages,
                 t.fetched_pages, t.storage_errors, t.prefetch_timeouts);
    }
    if (r.kv_events.enabled) {
      fmt::print("KV events         {} events in {} batches on {} ({} dropped); {} device and {} host pages cached\n",
                 r.kv_events.published_events, r.kv_events.published_batches, r.kv_events_endpoint,
                 r.kv_events.dropped_events, r.cached_pages_device, r.cached_pages_host);
    }
  }
  fmt::print("time              {:.4f} s ({}), {:.0f} requests/s\n", r.wall_s,
             options.repeat > 1 ? fmt::format("median of {}", options.repeat) : std::string("one run"),
             r.requests_per_s());
  fmt::print("tree metadata     {:.1f} bytes/token at the peak of {} cached tokens; {:.1f} at the end ({} tokens)\n",
             r.metadata_bytes_per_token(), r.peak_cached_tokens, r.final_metadata_bytes_per_token(),
             r.final_cached_tokens);
  fmt::print("memory bound      memcmp {:.1f} GB/s; {:.1f} MB touched: memory-bound fraction {:.3f}\n", memcmp_gbps,
             static_cast<double>(r.touched_bytes()) / 1e6, r.memory_bound_fraction(memcmp_gbps));
}

int run(const Options& options) {
  if (!options.write_gsp.empty()) {
    clm::replay::GspParams params;
    params.seed = options.seed;
    const clm::Status written = clm::replay::write_jsonl_workload(clm::replay::generate_gsp(params), options.write_gsp);
    if (!written.ok()) {
      fmt::print(stderr, "replay: {}\n", written.message());
      return kExitBadInput;
    }
    if (!options.json)
      fmt::print(stderr, "replay: wrote the gsp workload (seed {}) to {}\n", options.seed, options.write_gsp);
    if (options.workload.empty()) return 0;
  }

  Workload workload;
  if (const clm::Status loaded = clm::replay::load_workload(options.workload, options.seed, workload); !loaded.ok()) {
    fmt::print(stderr, "replay: {}\n", loaded.message());
    return kExitBadInput;
  }
  ReplayConfig config;
  config.page_size = static_cast<std::int32_t>(*options.page_size);
  config.capacity_tokens = *options.capacity;
  config.policy = options.policy;
  if (options.protected_fraction) config.protected_fraction = *options.protected_fraction;
  if (options.ghost_memory) config.ghost_memory = *options.ghost_memory;
  if (options.hint_next_turn_within) config.hint_next_turn_within_s = *options.hint_next_turn_within;
  if (options.hint_recall) config.hint_recall = *options.hint_recall;
  if (options.hint_false_rate) config.hint_false_rate = *options.hint_false_rate;
  if (options.hint_update) config.hint_update = *options.hint_update;
  if (options.tiered()) {
    config.host_capacity_tokens = *options.l2_capacity;
    config.storage_url = options.storage_url;
    config.model_id = options.model_id;
    if (options.write_policy) config.write_policy = *options.write_policy;
    if (options.prefetch_policy) config.prefetch_policy = *options.prefetch_policy;
    if (!options.kv_events.empty()) {
      config.kv_events.enabled = true;
      config.kv_events.endpoint = options.kv_events;
      config.kv_events.replay_endpoint = options.kv_events_replay;
      if (options.kv_events_buffer) config.kv_events.buffer_batches = *options.kv_events_buffer;
      config.keep_engine = options.kv_events_linger_s > 0;
    }
  }
  config.divergence = options.divergence;
  ReplayResult result;
  if (const clm::Status replayed = clm::replay::run_replays(workload, config, options.repeat, result); !replayed.ok()) {
    fmt::print(stderr, "replay: {}: {}\n", replayed.code_name(), replayed.message());
    // io_error: a storage directory that cannot be created (the workload was read above).
    const bool bad_input =
        replayed.code() == clm::StatusCode::invalid_argument || replayed.code() == clm::StatusCode::io_error;
    return bad_input ? kExitBadInput : kExitCheckFailed;
  }
  if (result.tiered && result.tiers.storage_errors > 0) {
    // Not a failure (the Engine recomputes what storage could not give), but
    // the storage figures then say little.
    fmt::print(stderr, "replay: warning: {} storage calls failed (is {} reachable?)\n", result.tiers.storage_errors,
               options.storage_url);
  }
  const double memcmp_gbps = clm::replay::measure_memcmp_gbps();
  if (options.json) {
    print_json(options, result, memcmp_gbps);
  } else {
    print_text(options, result, memcmp_gbps);
  }
  if (result.engine) {
    // The figures are out; the replay socket serves subscribers that join late.
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(options.kv_events_linger_s));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    if (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
      fmt::print("{}", kUsage);
      return 0;
    }
    options = parse_flags(argc, argv);
  } catch (const UsageError& error) {
    fmt::print(stderr, "replay: {}\n{}", error.message, kUsage);
    return kExitBadInput;
  }
  try {
    return run(options);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "replay: out of memory\n");
    return kExitCheckFailed;
  }
}
