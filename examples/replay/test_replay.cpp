// examples/replay/test_replay.cpp: checks of the replay tool: the gsp workload
// and its unbounded optimum, the JSONL round trip, Mooncake token expansion,
// the leak and invariant checks under eviction and failed requests, the
// tiered path (an Engine with a host tier and storage in a temporary
// directory), and clean errors (exit status 2 from the binary) on bad input.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "replay_driver.hpp"
#include "temp_dir.hpp"
#include "workload.hpp"

namespace {

using clm_test::TempDir;

using clm::replay::ReplayConfig;
using clm::replay::ReplayResult;
using clm::replay::Workload;

// A file in the temp directory, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& name, const std::string& contents = {})
      : path_(std::filesystem::temp_directory_path() / ("clm_test_replay_" + std::to_string(::getpid()) + "_" + name)) {
    if (!contents.empty()) std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// One replay that must succeed.
ReplayResult replay(const Workload& workload, const ReplayConfig& config) {
  ReplayResult result;
  const clm::Status status = clm::replay::run_replay(workload, config, result);
  INFO(status.message());
  REQUIRE(status.ok());
  return result;
}

ReplayResult replay(const Workload& workload, std::int32_t page_size, std::int64_t capacity,
                    clm::EvictionPolicy policy = clm::EvictionPolicy::lru) {
  ReplayConfig config;
  config.page_size = page_size;
  config.capacity_tokens = capacity;
  config.policy = policy;
  return replay(workload, config);
}

// A replay of `policy` on pages of 16 in a pool of `capacity` tokens, with the
// next-turn hint `within` seconds (NaN: none), on the tiered path with a host
// tier of `host_capacity` tokens when that is > 0.
ReplayConfig hint_config(clm::EvictionPolicy policy, std::int64_t capacity, double within,
                         std::int64_t host_capacity = 0) {
  ReplayConfig config;
  config.page_size = 16;
  config.capacity_tokens = capacity;
  config.policy = policy;
  config.hint_next_turn_within_s = within;
  config.host_capacity_tokens = host_capacity;
  return config;
}

// One replay that must be refused as invalid_argument with a message that
// says `says`, and leave its result untouched.
void check_refused(const Workload& workload, const ReplayConfig& config, const std::string& says) {
  ReplayResult result;
  result.hit_tokens = 12345;  // must stay: a refused replay writes no result
  const clm::Status s = clm::replay::run_replay(workload, config, result);
  INFO(s.message());
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains(says));
  CHECK(result.hit_tokens == 12345);
}

// The tiered path: an Engine with a host tier of `host_capacity` tokens.
ReplayResult tiered_replay(const Workload& workload, std::int32_t page_size, std::int64_t capacity,
                           std::int64_t host_capacity,
                           clm::WritePolicy write_policy = clm::WritePolicy::write_through_selective,
                           const std::string& storage_url = {}, const std::string& model_id = "replay-test-model") {
  ReplayConfig config;
  config.page_size = page_size;
  config.capacity_tokens = capacity;
  config.host_capacity_tokens = host_capacity;
  config.write_policy = write_policy;
  config.storage_url = storage_url;
  config.model_id = model_id;
  const ReplayResult result = replay(workload, config);
  REQUIRE(result.tiered);
  return result;
}

// What every tiered replay must account for: the tiers' hits add up to the
// hits, the replay's split agrees with the Engine's own counters, and each
// host hit token came in through a loaded page.
void check_tier_accounting(const ReplayResult& r) {
  REQUIRE(r.hit_tokens == r.device_hit_tokens + r.host_hit_tokens + r.storage_hit_tokens);
  REQUIRE(r.hit_rate() == Approx(r.device_hit_rate() + r.host_hit_rate() + r.storage_hit_rate()).margin(1e-12));
  REQUIRE(r.tiers.device_hit_tokens == r.device_hit_tokens);
  REQUIRE(r.tiers.host_hit_tokens == r.host_hit_tokens);
  REQUIRE(r.tiers.storage_hit_tokens == r.storage_hit_tokens);
  REQUIRE(r.tiers.loaded_pages * static_cast<std::uint64_t>(r.page_size) == r.host_hit_tokens + r.storage_hit_tokens);
  REQUIRE(r.tiers.storage_errors == 0);
}

// A short gsp: 8 groups of 4 prompts (256-token system prompts), small
// enough for storage tests with real bytes.
Workload small_gsp() {
  clm::replay::GspParams params;
  params.groups = 8;
  params.prompts_per_group = 4;
  params.system_prompt_tokens = 256;
  params.question_tokens = 32;
  params.output_tokens = 32;
  return clm::replay::generate_gsp(params);
}

// The value of a number field of a one-line JSON object ("key":value), or -1.
double json_field(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const std::size_t at = json.find(needle);
  if (at == std::string::npos) return -1;
  return std::stod(json.substr(at + needle.size()));
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

Workload parse_jsonl(const std::string& text) {
  Workload workload;
  const clm::Status status = clm::replay::parse_jsonl_workload(text, "test.jsonl", workload);
  INFO(status.message());
  REQUIRE(status.ok());
  return workload;
}

Workload parse_mooncake(const std::string& text) {
  Workload workload;
  const clm::Status status = clm::replay::parse_mooncake_trace(text, "trace.jsonl", workload);
  INFO(status.message());
  REQUIRE(status.ok());
  return workload;
}

// Exit status of the replay binary run with `args`; stdout goes to
// `stdout_path`, stderr to `stderr_path`.
int run_replay_binary(const std::string& args, const std::string& stdout_path = "/dev/null",
                      const std::string& stderr_path = "/dev/null") {
  const std::string command = std::string(CLM_REPLAY_BINARY) + " " + args + " >" + stdout_path + " 2>" + stderr_path;
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// An independent model of LRU in the plain replay, page by page: a trie of
// cached pages (a page: its tokens below its parent page, one root per salt),
// each with the request that used it last. A request matches the longest run
// of cached pages of its prompt (at most prompt - 1 tokens) and uses them;
// makes room for the rest of its prompt and its output by evicting leaf pages
// (no cached child) that it did not match, least recently used first; then
// caches its prompt and output pages. That is the tree's LRU, which evicts
// whole leaves but splits the last one it needs and keeps its head: here two
// leaves never tie (a request makes one new leaf), so the order is exact.
// Returns the matched prompt tokens.
std::uint64_t naive_lru_hit_tokens(const Workload& workload, std::int32_t page_size, std::int64_t capacity) {
  REQUIRE(workload.output_cached);
  struct Page {
    std::int64_t parent = -1;
    std::size_t last_use = 0;
    int children = 0;
    std::vector<std::int32_t> tokens;
  };
  std::vector<Page> pages;
  std::vector<std::int64_t> free_ids;
  std::map<std::pair<std::int64_t, std::vector<std::int32_t>>, std::int64_t> child_of;
  std::set<std::pair<std::size_t, std::int64_t>> leaves;  // (last use, page): the eviction order
  std::map<std::string, std::int64_t, std::less<>> roots;
  const std::int64_t pool_pages = capacity / page_size;
  std::int64_t cached = 0;
  auto is_root = [&](std::int64_t id) { return pages[static_cast<std::size_t>(id)].parent < 0; };
  auto page = [&](std::int64_t id) -> Page& { return pages[static_cast<std::size_t>(id)]; };
  auto new_page = [&](std::int64_t parent, std::vector<std::int32_t> tokens) {
    std::int64_t id;
    if (free_ids.empty()) {
      id = static_cast<std::int64_t>(pages.size());
      pages.emplace_back();
    } else {
      id = free_ids.back();
      free_ids.pop_back();
    }
    page(id) = Page{parent, 0, 0, std::move(tokens)};
    return id;
  };
  auto use = [&](std::int64_t id, std::size_t now) {  // touches a page, keeping `leaves` in step
    Page& p = page(id);
    if (p.children == 0) leaves.erase(std::make_pair(p.last_use, id));
    p.last_use = now;
    if (p.children == 0) leaves.insert(std::make_pair(now, id));
  };
  std::uint64_t hit_tokens = 0;
  for (std::size_t now = 1; now <= workload.requests.size(); ++now) {
    const clm::replay::Request& request = workload.requests[now - 1];
    const std::string_view salt = workload.salt(request);
    auto root = roots.find(salt);
    if (root == roots.end()) root = roots.emplace(std::string(salt), new_page(-1, {})).first;
    const auto prompt = workload.prompt(request);
    const auto all = workload.prompt_and_output(request);
    auto page_tokens = [&](std::size_t i) {
      return std::vector<std::int32_t>(all.begin() + static_cast<std::ptrdiff_t>(i) * page_size,
                                       all.begin() + static_cast<std::ptrdiff_t>(i + 1) * page_size);
    };
    // Match: whole pages, at most prompt - 1 tokens.
    const std::size_t max_match = (prompt.size() - 1) / static_cast<std::size_t>(page_size);
    std::set<std::int64_t> matched;
    std::int64_t at = root->second;
    for (std::size_t i = 0; i < max_match; ++i) {
      const auto it = child_of.find(std::make_pair(at, page_tokens(i)));
      if (it == child_of.end()) break;
      at = it->second;
      matched.insert(at);
      use(at, now);
    }
    hit_tokens += matched.size() * static_cast<std::size_t>(page_size);
    // Room for the rest of the prompt and the output.
    const auto total_pages = static_cast<std::int64_t>(all.size()) / page_size;
    const std::int64_t fresh = total_pages - static_cast<std::int64_t>(matched.size());
    while (pool_pages - cached < fresh) {
      auto victim = leaves.begin();
      while (victim != leaves.end() && matched.count(victim->second) != 0) ++victim;
      REQUIRE(victim != leaves.end());
      const std::int64_t id = victim->second;
      leaves.erase(victim);
      const std::int64_t parent = page(id).parent;
      child_of.erase(std::make_pair(parent, page(id).tokens));
      free_ids.push_back(id);
      --cached;
      if (--page(parent).children == 0 && !is_root(parent))
        leaves.insert(std::make_pair(page(parent).last_use, parent));
    }
    // Finish: the prompt and the output are cached.
    at = root->second;
    for (std::int64_t i = 0; i < total_pages; ++i) {
      std::vector<std::int32_t> tokens = page_tokens(static_cast<std::size_t>(i));
      const auto it = child_of.find(std::make_pair(at, tokens));
      if (it != child_of.end()) {
        at = it->second;
        use(at, now);
        continue;
      }
      if (page(at).children++ == 0 && !is_root(at)) leaves.erase(std::make_pair(page(at).last_use, at));
      const std::int64_t id = new_page(at, tokens);
      child_of.emplace(std::pair{at, std::move(tokens)}, id);
      page(id).last_use = now;
      leaves.insert({now, id});
      ++cached;
      at = id;
    }
  }
  return hit_tokens;
}

const std::string& gsp_jsonl_path() {  // written once, shared by the tests that need it
  static TempFile file("gsp.jsonl");
  static const bool written = clm::replay::write_jsonl_workload(clm::replay::generate_gsp(), file.path()).ok();
  REQUIRE(written);
  static const std::string path = file.path();
  return path;
}

}  // namespace

TEST_CASE("gsp has SGLang's default shape") {
  const Workload gsp = clm::replay::generate_gsp();
  REQUIRE(gsp.requests.size() == 1024);
  REQUIRE(gsp.total_prompt_tokens() == 2228224);
  std::set<std::vector<std::int32_t>> system_prompts;
  std::set<std::vector<std::int32_t>> distinct_requests;
  for (const auto& r : gsp.requests) {
    REQUIRE(r.prompt_tokens == 2176);
    REQUIRE(r.output_tokens == 256);
    const auto prompt = gsp.prompt(r);
    system_prompts.emplace(prompt.begin(), prompt.begin() + 2048);
    const auto all = gsp.prompt_and_output(r);
    distinct_requests.emplace(all.begin(), all.end());
    for (const std::int32_t id : all) REQUIRE((id >= 0 && id < 128256));
  }
  REQUIRE(system_prompts.size() == 64);
  REQUIRE(distinct_requests.size() == 1024);
  // Shuffled: the first 16 requests do not all share one system prompt.
  std::set<std::vector<std::int32_t>> first_sixteen;
  for (std::size_t i = 0; i < 16; ++i) {
    const auto prompt = gsp.prompt(gsp.requests[i]);
    first_sixteen.emplace(prompt.begin(), prompt.begin() + 2048);
  }
  REQUIRE(first_sixteen.size() > 1);
  // Deterministic per seed, different across seeds.
  REQUIRE(clm::replay::generate_gsp().tokens == gsp.tokens);
  clm::replay::GspParams other;
  other.seed = 7;
  REQUIRE(clm::replay::generate_gsp(other).tokens != gsp.tokens);
}

TEST_CASE("gsp with an unbounded cache reaches the optimum hit rate") {
  // Only the 15 later prompts of each group can hit, on the system prompt alone.
  const double optimum = 64.0 * 15 * 2048 / (1024.0 * 2176);
  const Workload gsp = clm::replay::generate_gsp();
  for (const std::int32_t page_size : {1, 16}) {
    const ReplayResult r = replay(gsp, page_size, 1048576 * 4);
    INFO("page size " << page_size);
    REQUIRE(r.hit_rate() == Approx(optimum).margin(1e-4));
    REQUIRE(r.hit_rate() == Approx(0.8824).margin(1e-4));
    REQUIRE(r.failed_requests == 0);
    REQUIRE(r.evicted_tokens == 0);
    // Everything distinct is cached: 64 system prompts + 1024 questions and outputs.
    REQUIRE(r.final_cached_tokens == 64 * 2048 + 1024 * (128 + 256));
  }
}

TEST_CASE("a bounded cache evicts and still leaks no page", "[leak]") {
  const Workload gsp = clm::replay::generate_gsp();
  for (const auto policy :
       {clm::EvictionPolicy::lru, clm::EvictionPolicy::lfu, clm::EvictionPolicy::slru, clm::EvictionPolicy::priority,
        clm::EvictionPolicy::ghost_slru, clm::EvictionPolicy::belady}) {
    for (const std::int32_t page_size : {1, 16}) {
      INFO(clm::eviction_policy_name(policy) << ", page size " << page_size);
      const ReplayResult r = replay(gsp, page_size, 131072, policy);  // run_replay checks leaks + invariants
      REQUIRE(r.evicted_tokens > 0);
      REQUIRE(r.failed_requests == 0);
      if (policy == clm::EvictionPolicy::lru) {
        // Exactly what the naive page-by-page model of LRU predicts.
        REQUIRE(r.hit_tokens == naive_lru_hit_tokens(gsp, page_size, 131072));
      }
      REQUIRE(r.hit_rate() > 0.3);
      REQUIRE(r.hit_rate() < 0.8824);  // below the unbounded optimum
      REQUIRE(r.final_cached_tokens <= 131072);
    }
  }
}

// Conversations in the shape of the Mooncake trace: each turn's prompt is the
// previous turn's prompt and output plus a new message, and turns of many
// conversations interleave, with one-off prompts in between.
static Workload generate_conversations(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string jsonl;
  auto tokens = [&](std::vector<std::int32_t>& out, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<std::int32_t>(rng() % 50000));
  };
  std::vector<std::vector<std::int32_t>> histories(24);
  for (auto& h : histories) tokens(h, 200 + static_cast<int>(rng() % 400));
  auto json = [](const std::vector<std::int32_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); };
  for (int request = 0; request < 600; ++request) {
    std::vector<std::int32_t> prompt, output;
    if (rng() % 3 == 0) {  // a one-off prompt
      tokens(prompt, 100 + static_cast<int>(rng() % 600));
    } else {
      // Conversations differ in how often they come back.
      auto& h = histories[std::min<std::size_t>(rng() % histories.size(), rng() % histories.size())];
      tokens(h, 30 + static_cast<int>(rng() % 100));
      prompt = h;
      tokens(output, 20 + static_cast<int>(rng() % 60));
      h.insert(h.end(), output.begin(), output.end());
      if (h.size() > 3000) h.resize(400);  // a new topic, the same system prompt
    }
    jsonl += fmt::format("{{\"prompt\":{},\"output\":{}}}\n", json(prompt), json(output));
  }
  return parse_jsonl(jsonl);
}

TEST_CASE("belady's hit rate is at least every online policy's", "[belady]") {
  const std::vector<std::pair<std::string, Workload>> workloads = {{"gsp", clm::replay::generate_gsp()},
                                                                   {"conversations", generate_conversations(7)}};
  for (const auto& [name, workload] : workloads) {
    for (const std::int64_t capacity : {16384, 65536, 131072}) {
      const ReplayResult belady = replay(workload, 16, capacity, clm::EvictionPolicy::belady);
      REQUIRE(belady.failed_requests == 0);
      for (const auto policy : {clm::EvictionPolicy::lru, clm::EvictionPolicy::lfu, clm::EvictionPolicy::slru,
                                clm::EvictionPolicy::priority, clm::EvictionPolicy::ghost_slru}) {
        INFO(name << " at " << capacity << " tokens: " << clm::eviction_policy_name(policy));
        const ReplayResult online = replay(workload, 16, capacity, policy);
        CHECK(belady.hit_tokens >= online.hit_tokens);
      }
    }
  }
}

// The segmented policies' parameters, checked where policies coincide: slru
// with no protected segment is LRU, and ghost_slru with no ghost is slru with
// the same protected fraction (a ghost of 0 tokens never remembers a prefix,
// so nothing comes back protected without a hit). On the plain path (a
// RadixTree) and the tiered one (an Engine, whose config carries them).
TEST_CASE("policy parameters: slru at 0 is lru, ghost_slru without a ghost is slru", "[policy-parameters]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("conversations seed " << seed);
  const Workload workload = generate_conversations(seed);
  auto run = [&](clm::EvictionPolicy policy, double protected_fraction, double ghost_memory, bool tiered) {
    ReplayConfig config;
    config.page_size = 16;
    config.capacity_tokens = 16384;
    config.policy = policy;
    config.protected_fraction = protected_fraction;
    config.ghost_memory = ghost_memory;
    if (tiered) config.host_capacity_tokens = 16384;
    const ReplayResult result = replay(workload, config);
    REQUIRE(result.failed_requests == 0);
    return result;
  };
  const double none = std::numeric_limits<double>::quiet_NaN();
  for (const bool tiered : {false, true}) {
    INFO((tiered ? "tiered" : "plain") << " path");
    const ReplayResult lru = run(clm::EvictionPolicy::lru, none, none, tiered);
    const ReplayResult slru0 = run(clm::EvictionPolicy::slru, 0.0, none, tiered);
    CHECK(slru0.protected_fraction == 0.0);
    CHECK(slru0.hit_tokens == lru.hit_tokens);
    CHECK(slru0.evicted_tokens == lru.evicted_tokens);
    CHECK(slru0.final_cached_tokens == lru.final_cached_tokens);
    for (const double fraction : {0.0, 0.3, 0.9}) {
      INFO("protected fraction " << fraction);
      const ReplayResult slru = run(clm::EvictionPolicy::slru, fraction, none, tiered);
      const ReplayResult no_ghost = run(clm::EvictionPolicy::ghost_slru, fraction, 0.0, tiered);
      CHECK(no_ghost.ghost_memory == 0.0);
      CHECK(no_ghost.hit_tokens == slru.hit_tokens);
      CHECK(no_ghost.evicted_tokens == slru.evicted_tokens);
      CHECK(no_ghost.evictions == slru.evictions);
    }
  }
  // The defaults, spelled out, are the defaults; and the parameters do reach
  // the tree: without its protected segment and ghost, ghost_slru is LRU,
  // which hits differently on gsp at this size (the pool holds 6 of its
  // 64 system prompts).
  const Workload gsp = clm::replay::generate_gsp();
  ReplayConfig config;
  config.page_size = 16;
  config.capacity_tokens = 16384;
  config.policy = clm::EvictionPolicy::ghost_slru;
  ReplayResult defaults, explicit_defaults, lru_like;
  REQUIRE(clm::replay::run_replay(gsp, config, defaults).ok());
  CHECK(defaults.protected_fraction == clm::kDefaultGhostSlruProtectedFraction);
  CHECK(defaults.ghost_memory == clm::kDefaultGhostMemory);
  config.protected_fraction = clm::kDefaultGhostSlruProtectedFraction;
  config.ghost_memory = clm::kDefaultGhostMemory;
  REQUIRE(clm::replay::run_replay(gsp, config, explicit_defaults).ok());
  CHECK(explicit_defaults.hit_tokens == defaults.hit_tokens);
  CHECK(explicit_defaults.evicted_tokens == defaults.evicted_tokens);
  config.protected_fraction = 0.0;
  config.ghost_memory = 0.0;
  REQUIRE(clm::replay::run_replay(gsp, config, lru_like).ok());
  CHECK(lru_like.hit_tokens == replay(gsp, 16, 16384).hit_tokens);
  CHECK(lru_like.hit_tokens != defaults.hit_tokens);
}

TEST_CASE("policy parameters out of range, or for a policy without them, are refused", "[policy-parameters][cli]") {
  struct Case {
    clm::EvictionPolicy policy;
    double protected_fraction;
    double ghost_memory;
    const char* says;
  };
  const double none = std::numeric_limits<double>::quiet_NaN();
  for (const Case& c :
       {Case{clm::EvictionPolicy::lru, 0.5, none, "not of lru"},
        Case{clm::EvictionPolicy::belady, 0.5, none, "not of belady"},
        Case{clm::EvictionPolicy::slru, none, 2.0, "not of slru"}, Case{clm::EvictionPolicy::slru, 1.5, none, "[0, 1]"},
        Case{clm::EvictionPolicy::ghost_slru, -0.1, none, "[0, 1]"},
        Case{clm::EvictionPolicy::ghost_slru, std::numeric_limits<double>::infinity(), none, "[0, 1]"},
        Case{clm::EvictionPolicy::ghost_slru, none, 64.5, "[0, 64]"},
        Case{clm::EvictionPolicy::ghost_slru, none, -1.0, "[0, 64]"}}) {
    for (const bool tiered : {false, true}) {
      if (tiered && c.policy == clm::EvictionPolicy::belady) continue;
      ReplayConfig config;
      config.page_size = 16;
      config.capacity_tokens = 16384;
      config.policy = c.policy;
      config.protected_fraction = c.protected_fraction;
      config.ghost_memory = c.ghost_memory;
      if (tiered) config.host_capacity_tokens = 16384;
      check_refused(clm::replay::generate_gsp(), config, c.says);
    }
  }
  const std::string gsp = "--workload gsp --page-size 16 --capacity 16384 ";
  for (const char* flags : {"--policy lru --protected-fraction 0.5", "--policy slru --ghost-memory 1",
                            "--policy ghost_slru --protected-fraction 1.01", "--policy ghost_slru --ghost-memory 65",
                            "--policy ghost_slru --protected-fraction nan", "--policy ghost_slru --ghost-memory 4x",
                            "--policy ghost_slru --ghost-memory", "--policy ghost_slru --protected-fraction="}) {
    INFO(flags);
    CHECK(run_replay_binary(gsp + flags, "/dev/null") == 2);
  }
  CHECK(run_replay_binary(gsp + "--policy ghost_slru --protected-fraction 0.5 --ghost-memory 2", "/dev/null") == 0);
}

// ---- the next-turn hint (ReplayConfig::hint_next_turn_within_s) ----------

// A Mooncake trace of random conversations with what the parser must find:
// block 0 is everyone's, the other blocks a conversation's own; turn k+1's
// prompt is turn k's blocks and one to three new ones; requests are sorted by
// arrival. `next_gap_s[i]`: seconds to request i's next turn (infinity: none).
struct TimedConversations {
  std::string jsonl;
  std::vector<double> next_gap_s;
};
TimedConversations generate_timed_conversations(std::uint64_t seed, int conversations = 60) {
  std::mt19937_64 rng(seed);
  struct Turn {
    std::int64_t at_ms;
    std::vector<std::int32_t> blocks;
    std::int32_t input_length;
    double next_gap_s;
  };
  std::vector<Turn> turns;
  std::int32_t next_block = 1;
  for (int c = 0; c < conversations; ++c) {
    std::vector<std::int32_t> blocks{0};
    std::int64_t at = static_cast<std::int64_t>(rng() % 1000000);
    const int count = 1 + static_cast<int>(rng() % 5);
    for (int k = 0; k < count; ++k) {
      for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) blocks.push_back(next_block++);
      const auto full = static_cast<std::int32_t>(blocks.size()) * clm::replay::kMooncakeBlockTokens;
      const std::int64_t gap_ms = 1 + static_cast<std::int64_t>(rng() % 300000);
      turns.push_back(
          Turn{at, blocks, full - static_cast<std::int32_t>(rng() % 512),
               k + 1 < count ? static_cast<double>(gap_ms) / 1000.0 : std::numeric_limits<double>::infinity()});
      at += gap_ms;
    }
  }
  std::stable_sort(turns.begin(), turns.end(), [](const Turn& a, const Turn& b) { return a.at_ms < b.at_ms; });
  TimedConversations out;
  for (const Turn& t : turns) {
    out.jsonl += fmt::format("{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}\n",
                             t.at_ms, t.input_length, rng() % 200, fmt::join(t.blocks, ", "));
    out.next_gap_s.push_back(t.next_gap_s);
  }
  return out;
}

TEST_CASE("Mooncake timestamps give each request the gap to its conversation's next turn", "[hint]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const TimedConversations trace = generate_timed_conversations(seed);
  const Workload w = parse_mooncake(trace.jsonl);
  REQUIRE(w.has_turn_timing);
  REQUIRE(w.requests.size() == trace.next_gap_s.size());
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    INFO("request " << i);
    CHECK(w.requests[i].seconds_to_next_turn == trace.next_gap_s[i]);
  }
  // Without every timestamp, or out of order, there is no timing (and no error).
  const std::string a = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 1]}\n";
  const std::string b = "{\"timestamp\": 9, \"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}\n";
  CHECK(parse_mooncake(a + b).has_turn_timing);
  CHECK(parse_mooncake(a + b).requests[0].seconds_to_next_turn == 0.004);
  CHECK_FALSE(parse_mooncake(b + a).has_turn_timing);
  CHECK_FALSE(
      parse_mooncake(a + "{\"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}\n").has_turn_timing);
  CHECK_FALSE(parse_jsonl("{\"prompt\":[1,2,3]}\n").has_turn_timing);
}

// Three 1024-token first turns, then the first conversation's second turn,
// 100 s later, in a pool of 2048 tokens: the third request must evict one of
// the first two. LRU's choice is the first, so the second turn misses; with
// the hint the first outlives the second, and the second turn hits 1024 on
// the device. (On the tiered path nothing reaches the host tier here: it
// copies pages once they are hit.)
constexpr std::string_view kHintScenario =
    "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [10, 11]}\n"
    "{\"timestamp\": 1000, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [20, 21]}\n"
    "{\"timestamp\": 2000, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [30, 31]}\n"
    "{\"timestamp\": 100000, \"input_length\": 1536, \"output_length\": 0, \"hash_ids\": [10, 11, 12]}\n";

TEST_CASE("the next-turn hint keeps the conversation that comes back, on both paths", "[hint]") {
  const Workload w = parse_mooncake(std::string(kHintScenario));
  const double none = std::numeric_limits<double>::quiet_NaN();
  for (const auto policy : {clm::EvictionPolicy::ghost_slru, clm::EvictionPolicy::priority}) {
    for (const bool tiered : {false, true}) {
      for (const double within : {none, 99.999, 100.0}) {
        INFO(clm::eviction_policy_name(policy) << (tiered ? " tiered" : " plain") << ", hint within " << within);
        const ReplayResult r = replay(w, hint_config(policy, 2048, within, tiered ? 4096 : 0));
        const bool hinted = within >= 100.0;
        CHECK(r.hinted_requests == (hinted ? 1u : 0u));
        CHECK((tiered ? r.device_hit_tokens : r.hit_tokens) == (hinted ? 1024u : 0u));
        if (!tiered) {  // one first turn, then room for the second turn: 512 tokens, or all 1536 after a miss
          CHECK(r.evicted_tokens == (hinted ? 1024u + 512u : 1024u + 1536u));
        }
      }
    }
  }
}

// Conversation A's first turn is hinted (its second turn comes 10 s later,
// within the 15 s window); nothing after it is. B comes back twice, 20 s and
// 160 s apart, unhinted. Pool: 5 blocks of 512 tokens. B's second turn
// evicts A's tail; then C, a first turn of 2 blocks, must evict 2 more. Under
// raise A's head keeps its priority 1 and B gives up its tail and one block of
// its head; under set A's second turn dropped A to 0, and the oldest prefix
// goes: A's head, wholly under `priority`, and under ghost_slru after B's
// probationary tail. B's third turn then hits 512 tokens (raise) or 1536
// (priority, set) or 1024 (ghost_slru, set), besides the 2048 that A's and
// B's second turns hit every time. On the tiered path whole leaves go.
constexpr std::string_view kExpiringHintScenario =
    "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [10, 11]}\n"
    "{\"timestamp\": 10000, \"input_length\": 1536, \"output_length\": 0, \"hash_ids\": [10, 11, 12]}\n"
    "{\"timestamp\": 20000, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [20, 21]}\n"
    "{\"timestamp\": 40000, \"input_length\": 1536, \"output_length\": 0, \"hash_ids\": [20, 21, 22]}\n"
    "{\"timestamp\": 50000, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [30, 31]}\n"
    "{\"timestamp\": 200000, \"input_length\": 2048, \"output_length\": 0, \"hash_ids\": [20, 21, 22, 23]}\n";

TEST_CASE("a hint that expires: set drops a conversation's priority when its next turn comes unhinted", "[hint]") {
  const Workload w = parse_mooncake(std::string(kExpiringHintScenario));
  struct Case {
    clm::EvictionPolicy policy;
    clm::PriorityUpdate update;
    std::uint64_t third_turn_hit, third_turn_device_hit_tiered;
  };
  for (const Case& c : {Case{clm::EvictionPolicy::priority, clm::PriorityUpdate::raise, 512, 0},
                        Case{clm::EvictionPolicy::priority, clm::PriorityUpdate::set, 1536, 1536},
                        Case{clm::EvictionPolicy::ghost_slru, clm::PriorityUpdate::raise, 512, 0},
                        Case{clm::EvictionPolicy::ghost_slru, clm::PriorityUpdate::set, 1024, 1024}}) {
    for (const bool tiered : {false, true}) {
      INFO(clm::eviction_policy_name(c.policy)
           << ", " << clm::priority_update_name(c.update) << (tiered ? ", tiered" : ", plain"));
      ReplayConfig config = hint_config(c.policy, 2560, 15, tiered ? 8192 : 0);
      config.hint_update = c.update;
      const ReplayResult r = replay(w, config);
      CHECK(r.hinted_requests == 1);
      CHECK(r.hint_update == c.update);
      if (tiered) {
        CHECK(r.device_hit_tokens == 2048 + c.third_turn_device_hit_tiered);
      } else {
        CHECK(r.hit_tokens == 2048 + c.third_turn_hit);
      }
    }
  }
}

TEST_CASE("the next-turn hint: its errors, and hints that change nothing", "[hint]") {
  const std::uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const TimedConversations trace = generate_timed_conversations(seed, 200);
  const Workload w = parse_mooncake(trace.jsonl);
  const double within = 60;
  const auto truly = static_cast<std::uint64_t>(
      std::count_if(trace.next_gap_s.begin(), trace.next_gap_s.end(), [&](double gap) { return gap <= within; }));
  auto run = [&](clm::EvictionPolicy policy, double hint, double recall, double false_rate,
                 clm::PriorityUpdate update = clm::PriorityUpdate::raise) {
    ReplayConfig config = hint_config(policy, 65536, hint);
    config.hint_recall = recall;
    config.hint_false_rate = false_rate;
    config.hint_update = update;
    const ReplayResult r = replay(w, config);
    REQUIRE(r.evicted_tokens > 0);  // the pool is too small for the trace: eviction decides
    return r;
  };
  const double none = std::numeric_limits<double>::quiet_NaN();
  for (const auto policy : {clm::EvictionPolicy::ghost_slru, clm::EvictionPolicy::priority}) {
    INFO(clm::eviction_policy_name(policy));
    const ReplayResult plain = run(policy, none, 1, 0);
    CHECK(plain.hinted_requests == 0);
    const ReplayResult exact = run(policy, within, 1, 0);
    CHECK(exact.hinted_requests == truly);
    CHECK(exact.hint_recall == 1.0);
    // Errors drawn per request: recall drops true hints only, a false rate adds false ones only
    // (strictly: with dozens of requests on each side, a fair draw sparing all of them is 2^-20 or less).
    REQUIRE(truly >= 20);
    REQUIRE(w.requests.size() - truly >= 20);
    const ReplayResult half = run(policy, within, 0.5, 0);
    CHECK(half.hinted_requests > 0);
    CHECK(half.hinted_requests < truly);
    CHECK(run(policy, within, 0.5, 0).hinted_requests == half.hinted_requests);  // the same draws every run
    const ReplayResult noisy = run(policy, within, 1, 0.5);
    CHECK(noisy.hinted_requests > truly);
    CHECK(noisy.hinted_requests < w.requests.size());
    // Nobody hinted is no hint, whether priorities are raised or set.
    for (const auto update : {clm::PriorityUpdate::raise, clm::PriorityUpdate::set}) {
      const ReplayResult silent = run(policy, within, 0, 0, update);
      CHECK(silent.hinted_requests == 0);
      CHECK(silent.hit_tokens == plain.hit_tokens);
      CHECK(silent.evicted_tokens == plain.evicted_tokens);
    }
  }
  // Under priority everyone hinted is everyone equal: LRU, raised or set.
  const ReplayResult lru = replay(w, 16, 65536);
  for (const auto update : {clm::PriorityUpdate::raise, clm::PriorityUpdate::set}) {
    const ReplayResult everyone = run(clm::EvictionPolicy::priority, within, 1, 1, update);
    CHECK(everyone.hinted_requests == w.requests.size());
    CHECK(everyone.hit_tokens == lru.hit_tokens);
    CHECK(everyone.evicted_tokens == lru.evicted_tokens);
  }
}

TEST_CASE("a next-turn hint without timing, for a policy that ignores it, or out of range is refused", "[hint][cli]") {
  const Workload timed = parse_mooncake(std::string(kHintScenario));
  const double none = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    bool timed;
    clm::EvictionPolicy policy;
    double within, recall, false_rate;
    const char* says;
    clm::PriorityUpdate update = clm::PriorityUpdate::raise;
  };
  for (const Case& c : {
           Case{false, clm::EvictionPolicy::ghost_slru, 60, 1, 0, "no turn timing"},
           Case{true, clm::EvictionPolicy::lru, 60, 1, 0, "lru ignores it"},
           Case{true, clm::EvictionPolicy::slru, 60, 1, 0, "slru ignores it"},
           Case{true, clm::EvictionPolicy::belady, 60, 1, 0, "belady ignores it"},
           Case{true, clm::EvictionPolicy::ghost_slru, -1, 1, 0, ">= 0"},
           Case{true, clm::EvictionPolicy::ghost_slru, std::numeric_limits<double>::infinity(), 1, 0, ">= 0"},
           Case{true, clm::EvictionPolicy::ghost_slru, 60, 1.5, 0, "recall must be in [0, 1]"},
           Case{true, clm::EvictionPolicy::ghost_slru, 60, 1, -0.1, "false rate must be in [0, 1]"},
           Case{true, clm::EvictionPolicy::priority, 60, none, 0, "recall must be in [0, 1]"},
           Case{true, clm::EvictionPolicy::ghost_slru, none, 0.5, 0, "need a next-turn hint"},
           Case{true, clm::EvictionPolicy::ghost_slru, none, 1, 0.2, "need a next-turn hint"},
           Case{true, clm::EvictionPolicy::ghost_slru, none, 1, 0, "need a next-turn hint", clm::PriorityUpdate::set},
           Case{true, clm::EvictionPolicy::priority, 60, 1, 0, "must be raise or set", clm::PriorityUpdate{2}},
       }) {
    for (const bool tiered : {false, true}) {
      if (tiered && c.policy == clm::EvictionPolicy::belady) continue;
      INFO(c.says << (tiered ? ", tiered" : ", plain"));
      ReplayConfig config = hint_config(c.policy, 2048, c.within, tiered ? 4096 : 0);
      config.hint_recall = c.recall;
      config.hint_false_rate = c.false_rate;
      config.hint_update = c.update;
      check_refused(c.timed ? timed : clm::replay::generate_gsp(), config, c.says);
    }
  }
  TempFile trace("hint_scenario.jsonl", std::string(kHintScenario));
  const std::string base = "--workload mooncake:" + trace.path() + " --page-size 16 --capacity 2048 ";
  for (const char* flags :
       {"--policy lru --hint-next-turn-within 60", "--policy ghost_slru --hint-next-turn-within -5",
        "--policy ghost_slru --hint-next-turn-within nan", "--policy ghost_slru --hint-next-turn-within",
        "--policy ghost_slru --hint-recall 0.5", "--policy ghost_slru --hint-next-turn-within 60 --hint-recall 2",
        "--policy ghost_slru --hint-next-turn-within 60 --hint-false-rate x", "--policy ghost_slru --hint-update set",
        "--policy ghost_slru --hint-next-turn-within 60 --hint-update max",
        "--policy ghost_slru --hint-next-turn-within 60 --hint-update"}) {
    INFO(flags);
    CHECK(run_replay_binary(base + flags) == 2);
  }
  CHECK(run_replay_binary("--workload gsp --page-size 16 --capacity 16384 --policy ghost_slru "
                          "--hint-next-turn-within 60") == 2);
  TempFile output("hint.json");
  REQUIRE(run_replay_binary(
              base + "--policy ghost_slru --hint-next-turn-within 100 --hint-recall 1 --hint-update set --json",
              output.path()) == 0);
  std::ifstream in(output.path());
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* key : {"\"hint_next_turn_within_s\":100", "\"hint_recall\":1", "\"hint_false_rate\":0",
                          "\"hint_update\":\"set\"", "\"hinted_requests\":1", "\"hit_tokens\":1024"}) {
    CHECK_THAT(json, Catch::Contains(key));
  }
}

TEST_CASE("belady is refused with tiers, by the library and by the binary", "[belady][cli]") {
  ReplayConfig config;
  config.page_size = 16;
  config.capacity_tokens = 32768;
  config.host_capacity_tokens = 65536;
  config.policy = clm::EvictionPolicy::belady;
  ReplayResult result;
  const clm::Status s = clm::replay::run_replay(clm::replay::generate_gsp(), config, result);
  CHECK(s.code() == clm::StatusCode::invalid_argument);
  CHECK(s.message().find("belady") != std::string::npos);
  TempFile stderr_file("stderr.txt");
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 32768 --l2-capacity 65536 --policy belady",
                            "/dev/null", stderr_file.path()) == 2);
  std::ifstream err(stderr_file.path());
  const std::string message((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  CHECK(message.find("belady") != std::string::npos);
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 32768 --policy belady", "/dev/null") == 0);
}

TEST_CASE("page sizes that do not divide the lengths leak nothing") {
  const Workload gsp = clm::replay::generate_gsp();
  for (const std::int32_t page_size : {3, 7, 100}) {
    INFO("page size " << page_size);
    const ReplayResult r = replay(gsp, page_size, 70000);
    REQUIRE(r.failed_requests == 0);
    REQUIRE(r.hit_tokens % static_cast<std::uint64_t>(page_size) == 0);
  }
}

TEST_CASE("requests too big for the pool fail cleanly") {
  // 40 tokens of prompt+output on 32 token slots: never fits. The small one does.
  const Workload w = parse_jsonl(
      "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30],"
      "\"output\":[1,2,3,4,5,6,7,8,9,10]}\n"
      "{\"prompt\":[1,2,3,4,5],\"output\":[6]}\n"
      "{\"prompt\":[1,2,3,4,5,6,7],\"output\":[8]}\n");
  const ReplayResult r = replay(w, 4, 32);
  REQUIRE(r.failed_requests == 1);
  REQUIRE(r.hit_tokens == 4);  // the third request reuses the second's first page
  REQUIRE(r.prompt_tokens == 42);
}

TEST_CASE("JSONL round trip replays exactly like gsp") {
  const Workload generated = clm::replay::generate_gsp();
  Workload read;
  const clm::Status status = clm::replay::read_jsonl_workload(gsp_jsonl_path(), read);
  INFO(status.message());
  REQUIRE(status.ok());
  REQUIRE(read.tokens == generated.tokens);
  REQUIRE(read.requests.size() == generated.requests.size());
  for (const auto& [page_size, capacity] : {std::pair{1, 131072}, std::pair{16, 131072}, std::pair{16, 1048576}}) {
    const ReplayResult a = replay(generated, page_size, capacity);
    const ReplayResult b = replay(read, page_size, capacity);
    REQUIRE(a.hit_tokens == b.hit_tokens);
    REQUIRE(a.prompt_tokens == b.prompt_tokens);
    REQUIRE(a.inserted_tokens == b.inserted_tokens);
    REQUIRE(a.evicted_tokens == b.evicted_tokens);
    REQUIRE(a.evictions == b.evictions);
    REQUIRE(a.final_cached_tokens == b.final_cached_tokens);
  }
}

TEST_CASE("the binary writes gsp as JSONL and replays it the same", "[cli]") {
  TempFile written("written.jsonl");
  REQUIRE(run_replay_binary("--write-gsp " + written.path()) == 0);
  Workload from_binary;
  REQUIRE(clm::replay::read_jsonl_workload(written.path(), from_binary).ok());
  REQUIRE(from_binary.tokens == clm::replay::generate_gsp().tokens);
}

TEST_CASE("JSONL salts are namespaces, and other keys are ignored") {
  const Workload w = parse_jsonl(
      "{\"prompt\":[5,6,7,8],\"output\":[9],\"salt\":\"a\"}\n"
      "\n"
      "  {\"extra\":{\"x\":[1,2.5e3,true,null]},\"salt\":\"b\",\"prompt\":[5,6,7,8]}\r\n"
      "{\"prompt\":[5,6,7,8],\"salt\":\"a\"}\n"
      "{\"prompt\":[5,6,7,8],\"salt\":\"\\u00e9\\\"\\ud83d\\ude00\"}\n"
      "{\"prompt\":[5,6,7,8],\"salt\":null,\"nested\":[[[[1]]]]}\n");
  REQUIRE(w.requests.size() == 5);
  REQUIRE(w.salt(w.requests[4]).empty());
  REQUIRE(w.salt(w.requests[0]) == "a");
  REQUIRE(w.salt(w.requests[1]) == "b");
  REQUIRE(w.requests[0].salt == w.requests[2].salt);
  REQUIRE(w.salt(w.requests[3]) == "\xc3\xa9\"\xf0\x9f\x98\x80");
  REQUIRE(w.requests[1].output_tokens == 0);
  const ReplayResult r = replay(w, 1, 1000);
  REQUIRE(r.hit_tokens == 3);  // only the third request, in namespace "a", hits (capped at len-1)
}

TEST_CASE("a salt that is not UTF-8 has no JSONL form: a clear error, no exception") {
  Workload w = parse_jsonl("{\"prompt\":[5,6],\"output\":[7],\"salt\":\"a\"}\n");
  w.salts[static_cast<std::size_t>(w.requests[0].salt)] = "\xff";
  clm_test::TempDir dir("replay");
  const clm::Status s = clm::replay::write_jsonl_workload(w, dir.file("w.jsonl"));
  REQUIRE(s.code() == clm::StatusCode::invalid_argument);
  REQUIRE_THAT(s.message(), Catch::Contains("UTF-8"));
  REQUIRE_FALSE(std::filesystem::exists(dir.file("w.jsonl")));  // nothing half-written
}

TEST_CASE("Mooncake blocks expand to the expected token ids") {
  const Workload w = parse_mooncake(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [3, 7]}\n"
      "{\"timestamp\": 12.5, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [3]}\n"
      "{\"hash_ids\": [0], \"input_length\": 1, \"output_length\": 2}\n");
  REQUIRE_FALSE(w.output_cached);
  REQUIRE(w.requests.size() == 3);
  REQUIRE(w.requests[0].prompt_tokens == 600);
  REQUIRE(w.requests[0].output_tokens == 5);
  const auto first = w.prompt(w.requests[0]);
  for (std::int32_t t = 0; t < 512; ++t) REQUIRE(first[static_cast<std::size_t>(t)] == 3 * 512 + t);
  for (std::int32_t t = 0; t < 88; ++t) REQUIRE(first[static_cast<std::size_t>(512 + t)] == 7 * 512 + t);
  const auto second = w.prompt(w.requests[1]);
  REQUIRE(std::vector<std::int32_t>(second.begin(), second.end()) ==
          std::vector<std::int32_t>(first.begin(), first.begin() + 512));
  const auto third = w.prompt(w.requests[2]);
  REQUIRE(third.size() == 1);
  REQUIRE(third[0] == 0);
}

TEST_CASE("Mooncake replay inserts prompts only") {
  const Workload w = parse_mooncake(
      "{\"input_length\": 1000, \"output_length\": 300, \"hash_ids\": [0, 1]}\n"
      "{\"input_length\": 700, \"output_length\": 10, \"hash_ids\": [0, 2]}\n"
      "{\"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [0, 1]}\n");
  const ReplayResult r = replay(w, 16, 100000);
  // Request 2 reuses block 0; request 3 its whole prompt but the last page
  // (992 tokens: the prompt's stored part, capped at len-1 and page-aligned).
  REQUIRE(r.hit_tokens == 512 + 992);
  // Prompts stored page-aligned: 992 + (688 - 512) new tokens; outputs never.
  REQUIRE(r.inserted_tokens == 992 + 176);
  REQUIRE(r.final_cached_tokens == 992 + 176);
  // 64 pages: the first request (82 pages) fails; the third fits only by
  // evicting the second's unshared tail.
  const ReplayResult tight = replay(w, 16, 1024);
  REQUIRE(tight.failed_requests == 1);
  REQUIRE(tight.hit_tokens == 512);
  REQUIRE(tight.evicted_tokens == 176);
}

TEST_CASE("the real Mooncake trace, when present, replays without leaks", "[mooncake]") {
  const char* dir = std::getenv("CLM_SHARED_DIR");
  const std::string path =
      std::string(dir ? dir : CLM_DEFAULT_SHARED_DIR) + "/traces/mooncake/conversation_trace.jsonl";
  if (!std::filesystem::exists(path)) {
    std::cout << "SKIPPED (no trace at " << path << ")\n";  // ctest: skipped, not passed
    return;
  }
  Workload trace;
  REQUIRE(clm::replay::read_mooncake_trace(path, trace).ok());
  REQUIRE(trace.requests.size() == 12031);
  const ReplayResult r = replay(trace, 16, 1000000);
  REQUIRE(r.hit_rate() > 0.02);
  REQUIRE(r.hit_rate() < 0.374);
}

TEST_CASE("bad workload files are reported, not crashed on") {
  Workload w;
  SECTION("missing file") {
    const clm::Status s = clm::replay::read_jsonl_workload("/nonexistent/workload.jsonl", w);
    REQUIRE(s.code() == clm::StatusCode::io_error);
    REQUIRE_THAT(s.message(), Catch::Contains("/nonexistent/workload.jsonl"));
    REQUIRE(clm::replay::read_mooncake_trace("/nonexistent/trace", w).code() == clm::StatusCode::io_error);
    REQUIRE(clm::replay::load_workload("mooncake:", 42, w).code() == clm::StatusCode::invalid_argument);
  }
  SECTION("a directory") {
    REQUIRE_FALSE(clm::replay::read_jsonl_workload(std::filesystem::temp_directory_path().string(), w).ok());
  }
  SECTION("malformed JSONL lines") {
    const std::vector<std::string> bad = {
        "not json",
        "{\"prompt\":[1,2,3]",
        "{\"prompt\":[1,2,3]} trailing",
        "{\"output\":[1]}",
        "{\"prompt\":[]}",
        "{\"prompt\":[1,-2]}",
        "{\"prompt\":[1,2.5]}",
        "{\"prompt\":[1,2e3]}",
        "{\"prompt\":[2147483648]}",
        "{\"prompt\":[99999999999999999999999999]}",
        "{\"prompt\":[1,,2]}",
        "{\"prompt\":[1],\"prompt\":[2]}",
        "{\"prompt\":[1],\"salt\":5}",
        "{\"prompt\":[1],\"salt\":\"unterminated}",
        "{\"prompt\":[1],\"salt\":\"\\x\"}",
        "{\"prompt\":[1],\"salt\":\"\\ud800\"}",
        "{\"prompt\":\"1 2 3\"}",
        "[1,2,3]",
        "{\"prompt\":[1] \"output\":[2]}",
        "{\"prompt\":[1],\"x\":tru}",
        "{\"prompt\":[1],\"x\":" + std::string(100, '[') + std::string(100, ']') + "}",
        "{\"prompt\":[1],\"x\":{\"a\":1,\"a\":2}}",
        "{\"prompt\":[1],\"output\":{\"0\":1}}",
    };
    for (const std::string& line : bad) {
      INFO(line);
      const clm::Status s = clm::replay::parse_jsonl_workload("{\"prompt\":[7]}\n" + line + "\n", "w.jsonl", w);
      REQUIRE(s.code() == clm::StatusCode::invalid_argument);
      REQUIRE_THAT(s.message(), Catch::StartsWith("w.jsonl:2:"));
    }
  }
  SECTION("empty workload") {
    REQUIRE(clm::replay::parse_jsonl_workload("\n\n", "empty.jsonl", w).code() == clm::StatusCode::invalid_argument);
  }
  SECTION("malformed Mooncake lines") {
    const std::vector<std::string> bad = {
        "{\"input_length\": 600, \"output_length\": 5}",
        "{\"input_length\": 600, \"hash_ids\": [1, 2]}",
        "{\"output_length\": 5, \"hash_ids\": [1, 2]}",
        "{\"input_length\": 1025, \"output_length\": 5, \"hash_ids\": [1, 2]}",
        "{\"input_length\": 512, \"output_length\": 5, \"hash_ids\": [1, 2]}",
        "{\"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}",
        "{\"input_length\": 10, \"output_length\": -1, \"hash_ids\": [1]}",
        "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-1]}",
        "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [4194304]}",
        "{\"input_length\": 10.5, \"output_length\": 1, \"hash_ids\": [1]}",
        "{\"input_length\": 10, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
        "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": \"1\"}",
        "{\"input_length\": null, \"output_length\": 1, \"hash_ids\": [1]}",
        "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]} {}",
        "{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
        "{\"timestamp\": \"3\", \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
        "{\"timestamp\": null, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}",
    };
    for (const std::string& line : bad) {
      INFO(line);
      const clm::Status s = clm::replay::parse_mooncake_trace(line + "\n", "t.jsonl", w);
      REQUIRE(s.code() == clm::StatusCode::invalid_argument);
      REQUIRE_THAT(s.message(), Catch::StartsWith("t.jsonl:1:"));
    }
  }
}

TEST_CASE("the binary exits 2 on KV-event flags that cannot work", "[cli]") {
  const std::string tiered = "--workload gsp --page-size 16 --capacity 32768 --l2-capacity 65536 ";
  const std::string ok = tiered + "--model-id m --kv-events tcp://127.0.0.1:* ";
  CHECK(run_replay_binary("--workload gsp --page-size 16 --capacity 32768 --model-id m --kv-events "
                          "tcp://127.0.0.1:*") == 2);                           // no Engine: no tiers
  CHECK(run_replay_binary(tiered + "--kv-events tcp://127.0.0.1:*") == 2);      // no model id
  CHECK(run_replay_binary(tiered + "--model-id m --kv-events-linger 5") == 2);  // no --kv-events
  CHECK(run_replay_binary(tiered + "--model-id m --kv-events-replay tcp://127.0.0.1:*") == 2);
  CHECK(run_replay_binary(ok + "--repeat 2") == 2);
  CHECK(run_replay_binary(ok + "--kv-events-linger -1") == 2);
  CHECK(run_replay_binary(ok + "--kv-events-linger nan") == 2);
  CHECK(run_replay_binary(ok + "--kv-events-buffer 0") == 2);
  CHECK(run_replay_binary(tiered + "--model-id m --kv-events tcp://no-port") == 2);  // the Engine refuses it
}

TEST_CASE("the binary exits 2 on bad input", "[cli]") {
  TempFile malformed("malformed.jsonl", "{\"prompt\":[1,2,3]}\n{\"prompt\":[1,\n");
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 131072 --bogus") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size 16") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size 0 --capacity 131072") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size x --capacity 131072") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 8") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 131072 --policy fifo") == 2);
  REQUIRE(run_replay_binary("--workload gsp --page-size 16 --capacity 131072 --repeat 0") == 2);
  REQUIRE(run_replay_binary("--workload /nonexistent.jsonl --page-size 16 --capacity 131072") == 2);
  REQUIRE(run_replay_binary("--workload mooncake:/nonexistent --page-size 16 --capacity 131072") == 2);
  REQUIRE(run_replay_binary("--workload " + malformed.path() + " --page-size 16 --capacity 131072") == 2);
  REQUIRE(run_replay_binary("--workload") == 2);
  REQUIRE(run_replay_binary("") == 2);
}

TEST_CASE("the binary's --json output is one object with the figures", "[cli]") {
  TempFile output("out.json");
  REQUIRE(run_replay_binary("--workload " + gsp_jsonl_path() + " --page-size 16 --capacity 1048576 --json --repeat 2",
                            output.path()) == 0);
  std::ifstream in(output.path());
  std::string line, extra;
  REQUIRE(std::getline(in, line));
  REQUIRE_FALSE(std::getline(in, extra));
  REQUIRE(line.front() == '{');
  REQUIRE(line.back() == '}');
  for (const char* key :
       {"\"workload\":", "\"policy\":\"lru\"", "\"page_size\":16", "\"capacity\":1048576", "\"requests\":1024",
        "\"failed_requests\":0", "\"prompt_tokens\":2228224", "\"hit_tokens\":1966080", "\"hit_rate\":0.88235",
        "\"evicted_tokens\":0", "\"evictions\":0", "\"wall_s\":", "\"requests_per_s\":",
        "\"metadata_bytes_per_token\":", "\"memcmp_gbps\":", "\"memory_bound_fraction\":"}) {
    INFO(key);
    REQUIRE_THAT(line, Catch::Contains(key));
  }
}

TEST_CASE("tiers: a host tier 4x the device tier beats the device tier alone on gsp", "[tiers]") {
  const Workload gsp = clm::replay::generate_gsp();
  // 32768 tokens hold 13 of gsp's 2432-token requests: the device tier alone thrashes.
  const ReplayResult alone = replay(gsp, 16, 32768);
  for (const auto policy :
       {clm::WritePolicy::write_through, clm::WritePolicy::write_through_selective, clm::WritePolicy::write_back}) {
    INFO("write policy " << clm::write_policy_name(policy));
    const ReplayResult tiered = tiered_replay(gsp, 16, 32768, 4 * 32768, policy);
    INFO("all tiers " << tiered.hit_rate() << " (host " << tiered.host_hit_rate() << ") vs the device alone "
                      << alone.hit_rate());
    check_tier_accounting(tiered);
    REQUIRE(tiered.hit_rate() >= alone.hit_rate());
    REQUIRE(tiered.host_hit_tokens > 0);
    REQUIRE(tiered.storage_hit_tokens == 0);
    REQUIRE(tiered.tiers.backed_up_pages > 0);
    REQUIRE(tiered.failed_requests == 0);
    REQUIRE(tiered.hit_rate() < 0.8824 + 1e-9);
  }
}

TEST_CASE("tiers: with room on the device the tiered path hits exactly like the plain replay", "[tiers]") {
  // Same protocol (outputs decoded and cached, namespaces apart), so the same hits, all on the device.
  const Workload gsp = clm::replay::generate_gsp();
  const ReplayResult plain = replay(gsp, 16, 1048576);
  const ReplayResult tiered = tiered_replay(gsp, 16, 1048576, 65536);
  check_tier_accounting(tiered);
  REQUIRE(tiered.hit_tokens == plain.hit_tokens);
  REQUIRE(tiered.device_hit_tokens == plain.hit_tokens);
  REQUIRE(tiered.final_cached_tokens == plain.final_cached_tokens);
  REQUIRE(tiered.inserted_tokens == plain.inserted_tokens);

  const Workload salted = parse_jsonl(
      "{\"prompt\":[5,6,7,8],\"output\":[9],\"salt\":\"a\"}\n"
      "{\"prompt\":[5,6,7,8],\"salt\":\"b\"}\n"
      "{\"prompt\":[5,6,7,8],\"salt\":\"a\"}\n");
  REQUIRE(tiered_replay(salted, 1, 1000, 4000).hit_tokens == replay(salted, 1, 1000).hit_tokens);

  // Mooncake: outputs hold pages while the request runs, and are never cached.
  const Workload trace = parse_mooncake(
      "{\"input_length\": 1000, \"output_length\": 300, \"hash_ids\": [0, 1]}\n"
      "{\"input_length\": 700, \"output_length\": 10, \"hash_ids\": [0, 2]}\n"
      "{\"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [0, 1]}\n");
  const ReplayResult moon = tiered_replay(trace, 16, 100000, 400000);
  check_tier_accounting(moon);
  REQUIRE(moon.hit_tokens == 512 + 992);
  REQUIRE(moon.inserted_tokens == 992 + 176);
  REQUIRE(moon.final_cached_tokens == 992 + 176);
  // 64 pages: the first request (82 pages with its output) is refused, as on the plain path.
  REQUIRE(tiered_replay(trace, 16, 1024, 4096).failed_requests == 1);
}

TEST_CASE("tiers: the tiered path is deterministic across repeats", "[tiers]") {
  const Workload gsp = small_gsp();
  ReplayConfig config;
  config.page_size = 16;
  config.capacity_tokens = 1024;
  config.host_capacity_tokens = 4096;
  config.write_policy = clm::WritePolicy::write_back;
  ReplayResult result;
  const clm::Status status = clm::replay::run_replays(gsp, config, 3, result);  // fails if two runs count differently
  INFO(status.message());
  REQUIRE(status.ok());
  REQUIRE(result.wall_s_runs.size() == 3);
  REQUIRE(result.host_hit_tokens > 0);
}

TEST_CASE("tiers: storage in a directory gives a second replay in a fresh engine its hits", "[tiers][storage]") {
  const Workload gsp = small_gsp();
  TempDir dir("storage");
  const std::string url = "file://" + dir.str();
  // Every cached K/V row is checked against its prefix inside the replay (an internal error otherwise).
  const ReplayResult first = tiered_replay(gsp, 16, 1024, 4096, clm::WritePolicy::write_through_selective, url);
  check_tier_accounting(first);
  REQUIRE(first.has_kv_bytes);
  REQUIRE(first.tiers.stored_pages > 0);
  const ReplayResult second = tiered_replay(gsp, 16, 1024, 4096, clm::WritePolicy::write_through_selective, url);
  check_tier_accounting(second);
  REQUIRE(second.storage_hit_tokens > 0);
  REQUIRE(second.tiers.fetched_pages > 0);
  REQUIRE(second.hit_rate() >= first.hit_rate());
}

TEST_CASE("tiers: the binary replays with storage twice, the second process hits storage", "[tiers][cli]") {
  TempFile workload("small_gsp.jsonl");
  REQUIRE(clm::replay::write_jsonl_workload(small_gsp(), workload.path()).ok());
  TempDir dir("cli_storage");
  TempFile first("first.json");
  TempFile second("second.json");
  const std::string args = "--workload " + workload.path() + " --page-size 16 --capacity 1024 --l2-capacity 4096 " +
                           "--storage 'file://" + dir.str() + "?capacity_mb=64' --json";  // quoted: '?' is a glob
  REQUIRE(run_replay_binary(args + " --model-id model-a", first.path()) == 0);
  // Another model on the same pages: no storage hits at all (and no refusals: its keys differ).
  TempFile stranger("stranger.json");
  REQUIRE(run_replay_binary(args + " --model-id model-b", stranger.path()) == 0);
  const std::string s = first_line(stranger.path());
  INFO(s);
  REQUIRE(json_field(s, "storage_hit_tokens") == 0);
  REQUIRE(json_field(s, "fetched_pages") == 0);
  REQUIRE(json_field(s, "storage_corrupt_pages") == 0);
  REQUIRE(run_replay_binary(args + " --model-id model-a", second.path()) == 0);
  const std::string a = first_line(first.path());
  const std::string b = first_line(second.path());
  INFO(a << "\n" << b);
  for (const char* key :
       {"\"hit_rate\":", "\"hit_rate_device\":", "\"hit_rate_host\":", "\"hit_rate_storage\":", "\"loaded_pages\":",
        "\"backed_up_pages\":", "\"stored_pages\":", "\"fetched_pages\":", "\"storage_errors\":0",
        "\"write_policy\":\"write_through\"", "\"prefetch\":\"wait_complete\"", "\"kv_bytes_checked\":true"}) {
    INFO(key);
    REQUIRE_THAT(a, Catch::Contains(key));
    REQUIRE_THAT(b, Catch::Contains(key));
  }
  REQUIRE(json_field(a, "stored_pages") > 0);
  REQUIRE(json_field(b, "storage_hit_tokens") > 0);
  REQUIRE(json_field(b, "hit_rate_storage") > 0);
  REQUIRE(json_field(b, "hit_rate") ==
          Approx(json_field(b, "hit_rate_device") + json_field(b, "hit_rate_host") + json_field(b, "hit_rate_storage"))
              .margin(1e-9));
}

TEST_CASE("tiers: the plain replay's JSON has no tier fields", "[tiers][cli]") {
  TempFile output("plain.json");
  REQUIRE(run_replay_binary("--workload " + gsp_jsonl_path() + " --page-size 16 --capacity 131072 --json",
                            output.path()) == 0);
  const std::string line = first_line(output.path());
  // The binary's hit rate is the library's replay of the same workload.
  REQUIRE(json_field(line, "hit_rate") == Approx(replay(clm::replay::generate_gsp(), 16, 131072).hit_rate()));
  REQUIRE_THAT(line, !Catch::Contains("hit_rate_host"));
  // --l2-capacity 0 is "no host tier": the plain replay.
  REQUIRE(run_replay_binary("--workload " + gsp_jsonl_path() +
                                " --page-size 16 --capacity 131072 --json "
                                "--l2-capacity 0 --write-policy write_back",
                            output.path()) == 0);
  REQUIRE(first_line(output.path()).find("hit_rate_host") == std::string::npos);
}

TEST_CASE("tiers: bad tier flags exit 2 with a message, never a crash", "[tiers][cli]") {
  TempDir dir("bad_flags");
  TempFile stderr_file("stderr.txt");
  const std::string base = "--workload " + gsp_jsonl_path() + " --page-size 16 --capacity 32768 ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--storage file://" + dir.str(), "--l2-capacity"},
      {"--l2-capacity 0 --storage file://" + dir.str(), "--l2-capacity"},
      {"--l2-capacity -16", "--l2-capacity"},
      {"--l2-capacity x", "--l2-capacity"},
      {"--l2-capacity 8", "less than one page"},
      {"--l2-capacity 65536 --write-policy write_sometimes", "--write-policy"},
      {"--l2-capacity 65536 --prefetch eventually", "--prefetch"},
      {"--write-policy write_back", "--l2-capacity"},
      {"--prefetch timeout", "--l2-capacity"},
      {"--l2-capacity 65536 --storage", "--storage"},
      {"--l2-capacity 65536 --storage gopher://example.com/x --model-id m", "gopher"},
      {"--l2-capacity 65536 --storage redis://127.0.0.1:99999/0 --model-id m", "99999"},
      {"--l2-capacity 65536 --storage 'file://" + dir.str() + "?capacity_mb=lots' --model-id m", "capacity_mb"},
      {"--l2-capacity 65536 --storage file:///proc/clm-replay-cannot-create-this --model-id m",
       "clm-replay-cannot-create-this"},
      {"--l2-capacity 65536 --storage file://" + dir.str() + " --model-id m --repeat 2", "--repeat"},
      {"--l2-capacity 65536 --storage file://" + dir.str(), "--model-id"},
      {"--l2-capacity 65536 --model-id m", "--storage"},
      {"--l2-capacity 65536 --storage file://" + dir.str() + " --model-id", "--model-id"},
  };
  for (const auto& [flags, message] : bad) {
    INFO(flags);
    REQUIRE(run_replay_binary(base + flags, "/dev/null", stderr_file.path()) == 2);
    std::ifstream in(stderr_file.path());
    std::stringstream text;
    text << in.rdbuf();
    REQUIRE_THAT(text.str(), Catch::Contains(message));
  }
}
