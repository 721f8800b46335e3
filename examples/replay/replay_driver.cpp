// examples/replay/replay_driver.cpp: the replay loops (the RadixTree one and
// the tiered one through an Engine), their leak and invariant checks, and the
// memcmp bandwidth probe.
#include "replay_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/cache/paged_kv_pool.hpp"
#include "clm/cache/radix_tree.hpp"
#include "clm/detail/token_ops.hpp"
#include "clm/engine.hpp"

namespace clm::replay {
namespace {

using Clock = std::chrono::steady_clock;

Status with_context(std::size_t request, const Status& status) {
  return {status.code(), fmt::format("request {}: {}", request, status.message())};
}

// Belady's next uses: for each request, for each whole page of what it
// inserts (the prompt, plus the output for gsp/JSONL), the index of the next
// request whose match can reach that page (the same salt and the same tokens
// up to the page's end, within its first len-1 prompt tokens); kNeverUsedAgain
// when none does. Worked out backwards over the whole workload with one
// 64-bit hash per page prefix, before the timed loop.
class NextUses {
 public:
  NextUses(const Workload& workload, std::int32_t page_size) {
    const auto page = static_cast<std::size_t>(page_size);
    offsets_.resize(workload.requests.size() + 1, 0);
    for (std::size_t i = 0; i < workload.requests.size(); ++i) {
      offsets_[i + 1] = offsets_[i] + stored_tokens(workload, workload.requests[i]) / page;
    }
    uses_.resize(offsets_.back(), kNeverUsedAgain);
    std::unordered_map<std::uint64_t, std::uint32_t> next_request;  // page prefix hash -> next request reaching it
    std::vector<std::uint64_t> prefix_hashes;
    for (std::size_t i = workload.requests.size(); i-- > 0;) {
      const Request& request = workload.requests[i];
      const std::span<const std::int32_t> tokens =
          workload.output_cached ? workload.prompt_and_output(request) : workload.prompt(request);
      const std::size_t pages = offsets_[i + 1] - offsets_[i];
      std::uint64_t h = std::hash<std::string_view>{}(workload.salt(request));
      prefix_hashes.resize(pages);
      for (std::size_t j = 0; j < pages; ++j) {
        h = detail::mix64(h ^ detail::hash_page(tokens.data() + j * page, page));
        prefix_hashes[j] = h;
        if (auto it = next_request.find(h); it != next_request.end()) uses_[offsets_[i] + j] = it->second;
      }
      const std::size_t matchable = (static_cast<std::size_t>(request.prompt_tokens) - 1) / page;
      for (std::size_t j = 0; j < std::min(matchable, pages); ++j) {
        next_request[prefix_hashes[j]] = static_cast<std::uint32_t>(i);
      }
    }
  }
  std::span<const std::uint32_t> of(std::size_t request) const {
    return std::span(uses_).subspan(offsets_[request], offsets_[request + 1] - offsets_[request]);
  }

 private:
  static std::size_t stored_tokens(const Workload& workload, const Request& r) {
    return static_cast<std::size_t>(r.prompt_tokens) +
           (workload.output_cached ? static_cast<std::size_t>(r.output_tokens) : 0);
  }
  std::vector<std::size_t> offsets_;
  std::vector<std::uint32_t> uses_;
};

// One request's walk through the protocol, cached with `priority` (meeting the
// cached priorities as `update` says). Returns ok
// with `failed` set when the pool cannot hold it even after evicting every
// unlocked prefix. With
// `next_uses` (belady) it tells the tree the next use of every node it
// touched, after the match and after each insert.
class RequestReplayer {
 public:
  RequestReplayer(const Workload& workload, RadixTree& tree, PagedKvPool& pool, const NextUses* next_uses = nullptr)
      : workload_(workload),
        tree_(tree),
        pool_(pool),
        page_size_(static_cast<std::size_t>(tree.page_size())),
        next_uses_(next_uses) {}

  Status replay(std::size_t index, const Request& request, int priority, PriorityUpdate update,
                std::uint64_t& hit_tokens, bool& failed) {
    const std::span<const std::int32_t> prompt = workload_.prompt(request);
    const CacheNamespace ns{workload_.salt(request), 0};
    CLM_RETURN_IF_ERROR(tree_.match_prefix(prompt, ns, match_));
    CLM_RETURN_IF_ERROR(tree_.lock(match_.node));
    const std::span<const std::uint32_t> next_uses =
        next_uses_ ? next_uses_->of(index) : std::span<const std::uint32_t>();
    if (next_uses_ && prompt.size() >= page_size_) CLM_RETURN_IF_ERROR(tree_.set_next_use(prompt, ns, next_uses));
    hit_tokens += static_cast<std::uint64_t>(match_.cached_tokens);

    // The request's pages, in token order: the cached prefix's (the tree's),
    // then fresh ones for the rest of the prompt and the whole output.
    std::vector<std::int32_t>& pages = match_.pages;
    const std::size_t cached_pages = pages.size();
    const std::size_t total_tokens =
        static_cast<std::size_t>(request.prompt_tokens) + static_cast<std::size_t>(request.output_tokens);
    pages.resize((total_tokens + page_size_ - 1) / page_size_);
    const Status allocated = tree_.allocate_pages(std::span(pages).subspan(cached_pages));
    if (!allocated.ok()) {
      if (allocated.code() != StatusCode::out_of_memory) return allocated;
      failed = true;
      return tree_.unlock(match_.node);  // nothing was allocated: all or nothing
    }
    failed = false;

    // From here on the tree owns the first stored_tokens / page_size pages and
    // may have swapped duplicate ids in `pages` for its own.
    CLM_RETURN_IF_ERROR(tree_.insert(prompt, pages, ns, prompt_done_, priority, update));
    if (next_uses_ && prompt.size() >= page_size_) CLM_RETURN_IF_ERROR(tree_.set_next_use(prompt, ns, next_uses));
    CLM_RETURN_IF_ERROR(tree_.lock(prompt_done_.node));
    CLM_RETURN_IF_ERROR(tree_.unlock(match_.node));
    std::int32_t stored_tokens = prompt_done_.stored_tokens;
    if (workload_.output_cached) {  // the request finished: its output is reusable too
      const std::span<const std::int32_t> all = workload_.prompt_and_output(request);
      CLM_RETURN_IF_ERROR(tree_.insert(all, pages, ns, request_done_, priority, update));
      if (next_uses_ && all.size() >= page_size_) CLM_RETURN_IF_ERROR(tree_.set_next_use(all, ns, next_uses));
      stored_tokens = request_done_.stored_tokens;
    }
    CLM_RETURN_IF_ERROR(tree_.unlock(prompt_done_.node));
    const std::size_t taken = static_cast<std::size_t>(stored_tokens) / page_size_;
    return pool_.release(std::span(pages).subspan(taken));
  }

 private:
  const Workload& workload_;
  RadixTree& tree_;
  PagedKvPool& pool_;
  const std::size_t page_size_;
  const NextUses* next_uses_;
  PrefixMatch match_;  // kept across requests, so that its page vector keeps its capacity
  InsertOutcome prompt_done_;
  InsertOutcome request_done_;
};

Status validate(const ReplayConfig& config) {
  if (config.page_size <= 0) return invalid_argument(fmt::format("page size must be > 0, got {}", config.page_size));
  if (config.capacity_tokens < config.page_size) {
    return invalid_argument(
        fmt::format("capacity {} tokens is less than one page of {} tokens", config.capacity_tokens, config.page_size));
  }
  if (config.capacity_tokens / config.page_size > std::numeric_limits<std::int32_t>::max()) {
    return invalid_argument(fmt::format("capacity {} tokens is more than 2^31-1 pages of {} tokens",
                                        config.capacity_tokens, config.page_size));
  }
  if (config.metadata_sample_interval <= 0) return invalid_argument("metadata sample interval must be > 0");
  if (config.host_capacity_tokens < 0) {
    return invalid_argument(fmt::format("host tier capacity must be >= 0 tokens, got {}", config.host_capacity_tokens));
  }
  if (config.host_capacity_tokens > 0 && config.host_capacity_tokens < config.page_size) {
    return invalid_argument(fmt::format("host tier capacity {} tokens is less than one page of {} tokens",
                                        config.host_capacity_tokens, config.page_size));
  }
  if (config.host_capacity_tokens / config.page_size > std::numeric_limits<std::int32_t>::max()) {
    return invalid_argument(fmt::format("host tier capacity {} tokens is more than 2^31-1 pages of {} tokens",
                                        config.host_capacity_tokens, config.page_size));
  }
  if (!config.storage_url.empty() && config.host_capacity_tokens == 0) {
    return invalid_argument("a storage tier needs a host tier (host capacity > 0): storage pages pass through it");
  }
  if (config.write_policy > WritePolicy::write_back) return invalid_argument("unknown write policy");
  if (config.prefetch_policy > PrefetchPolicy::timeout) return invalid_argument("unknown prefetch policy");
  if (config.policy > EvictionPolicy::belady) return invalid_argument("unknown eviction policy");
  if (config.policy == EvictionPolicy::belady && config.tiered()) {
    return invalid_argument("belady runs on the plain replay only: the tiered path's Engine refuses it");
  }
  if (!std::isnan(config.protected_fraction)) {
    if (!is_segmented(config.policy)) {
      return invalid_argument(fmt::format("a protected fraction is a parameter of slru and ghost_slru, not of {}",
                                          eviction_policy_name(config.policy)));
    }
    if (!(config.protected_fraction >= 0.0 && config.protected_fraction <= 1.0)) {
      return invalid_argument(fmt::format("protected fraction must be in [0, 1], got {}", config.protected_fraction));
    }
  }
  if (!std::isnan(config.ghost_memory)) {
    if (config.policy != EvictionPolicy::ghost_slru) {
      return invalid_argument(
          fmt::format("ghost memory is a parameter of ghost_slru, not of {}", eviction_policy_name(config.policy)));
    }
    if (!(config.ghost_memory >= 0.0 && config.ghost_memory <= kMaxGhostMemory)) {
      return invalid_argument(
          fmt::format("ghost memory must be in [0, {}] pool capacities, got {}", kMaxGhostMemory, config.ghost_memory));
    }
  }
  return {};
}

// The next-turn hint needs the trace's timing and a policy that reads priorities.
Status validate_hint(const Workload& workload, const ReplayConfig& config) {
  const double within = config.hint_next_turn_within_s;
  if (std::isnan(within)) {
    if (config.hint_recall == 1.0 && config.hint_false_rate == 0.0 && config.hint_update == PriorityUpdate::raise) {
      return {};
    }
    return invalid_argument("a hint's recall, false rate and priority update need a next-turn hint");
  }
  if (!is_priority_update(static_cast<int>(config.hint_update))) {
    return invalid_argument(fmt::format("the next-turn hint's priority update must be raise or set, got {}",
                                        static_cast<int>(config.hint_update)));
  }
  for (const auto& [name, value] : {std::pair{"recall", config.hint_recall}, {"false rate", config.hint_false_rate}}) {
    if (!(value >= 0.0 && value <= 1.0)) {
      return invalid_argument(fmt::format("the next-turn hint's {} must be in [0, 1], got {}", name, value));
    }
  }
  if (config.policy != EvictionPolicy::ghost_slru && config.policy != EvictionPolicy::priority) {
    return invalid_argument(
        fmt::format("a next-turn hint is an insert priority, which ghost_slru and priority read; "
                    "{} ignores it",
                    eviction_policy_name(config.policy)));
  }
  if (!(within >= 0.0 && std::isfinite(within))) {
    return invalid_argument(fmt::format("the next-turn hint needs a finite number of seconds >= 0, got {}", within));
  }
  if (!workload.has_turn_timing) {
    return invalid_argument(
        fmt::format("{} has no turn timing for a next-turn hint (a Mooncake trace whose every line "
                    "has a timestamp, in order, has)",
                    workload.name));
  }
  return {};
}

// The priority each request is cached with, worked out before the clock
// starts: the hint, with its errors drawn from a hash of the request's index
// (the same in every run). Records the hint and how many it hinted in `result`.
std::vector<std::uint8_t> plan_hints(const Workload& workload, const ReplayConfig& config, ReplayResult& result) {
  result.hint_next_turn_within_s = config.hint_next_turn_within_s;
  result.hint_recall = config.hint_recall;
  result.hint_false_rate = config.hint_false_rate;
  result.hint_update = config.hint_update;
  std::vector<std::uint8_t> priorities(workload.requests.size(), 0);
  if (std::isnan(config.hint_next_turn_within_s)) return priorities;
  for (std::size_t i = 0; i < priorities.size(); ++i) {
    const std::uint64_t z = detail::mix64(static_cast<std::uint64_t>(i) + 0x9e3779b97f4a7c15ull);  // splitmix64
    const double draw = static_cast<double>(z >> 11) * 0x1.0p-53;                                  // uniform in [0, 1)
    const bool comes_back = workload.requests[i].seconds_to_next_turn <= config.hint_next_turn_within_s;
    if (draw < (comes_back ? config.hint_recall : config.hint_false_rate)) {
      priorities[i] = kNextTurnHintPriority;
      ++result.hinted_requests;
    }
  }
  return priorities;
}

bool same_counts(const ReplayResult& a, const ReplayResult& b) {
  return a.requests == b.requests && a.failed_requests == b.failed_requests && a.prompt_tokens == b.prompt_tokens &&
         a.hit_tokens == b.hit_tokens && a.inserted_tokens == b.inserted_tokens &&
         a.evicted_tokens == b.evicted_tokens && a.evictions == b.evictions && a.hinted_requests == b.hinted_requests &&
         a.final_cached_tokens == b.final_cached_tokens && a.device_hit_tokens == b.device_hit_tokens &&
         a.host_hit_tokens == b.host_hit_tokens && a.storage_hit_tokens == b.storage_hit_tokens &&
         a.tiers.loaded_pages == b.tiers.loaded_pages && a.tiers.backed_up_pages == b.tiers.backed_up_pages &&
         a.tiers.stored_pages == b.tiers.stored_pages && a.tiers.fetched_pages == b.tiers.fetched_pages;
}

// ---- the tiered path ------------------------------------------------------

// The K/V bytes the replay writes for each token, and checks when a tier
// serves them back: a hash of (salt, tokens [0, t]), so that a row from
// another prefix, another namespace or a stale page never matches.
class PrefixRows {
 public:
  explicit PrefixRows(const PagedKvPool& pool)
      : pool_(pool),
        page_size_(static_cast<std::size_t>(pool.page_size())),
        row_bytes_(static_cast<std::size_t>(pool.config().kv_heads) * static_cast<std::size_t>(pool.config().head_dim) *
                   kv_dtype_bytes(pool.config().dtype)) {}

  // The hash of every prefix of `tokens` under `salt`.
  void hash_prefixes(std::string_view salt, std::span<const std::int32_t> tokens) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : salt) h = mix(h, static_cast<unsigned char>(c));
    h = mix(h, salt.size());  // "ab" + [1] and "a" + [..] differ
    hashes_.resize(tokens.size());
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      h = mix(h, static_cast<std::uint32_t>(tokens[t]));
      hashes_[t] = h;
    }
  }

  // Writes the rows of tokens [first, first + slots.size()) (every layer, K and V).
  void write(std::size_t first, std::span<const std::int64_t> slots) {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      fill_row(hashes_[first + i]);
      for (std::int32_t layer = 0; layer < pool_.config().num_layers; ++layer) {
        std::memcpy(row(slots[i], layer, false), expected_.data(), row_bytes_);
        std::memcpy(row(slots[i], layer, true), expected_.data() + row_bytes_, row_bytes_);
      }
    }
  }

  // Tokens in [0, cached_tokens) whose rows in `page_table` differ from what
  // their prefix wrote.
  std::uint64_t wrong_rows(std::int32_t cached_tokens, std::span<const std::int32_t> page_table) {
    std::uint64_t wrong = 0;
    for (std::size_t t = 0; t < static_cast<std::size_t>(cached_tokens); ++t) {
      fill_row(hashes_[t]);
      const std::int64_t slot =
          static_cast<std::int64_t>(page_table[t / page_size_]) * static_cast<std::int64_t>(page_size_) +
          static_cast<std::int64_t>(t % page_size_);
      bool same = true;
      for (std::int32_t layer = 0; layer < pool_.config().num_layers; ++layer) {
        same = same && std::memcmp(row(slot, layer, false), expected_.data(), row_bytes_) == 0 &&
               std::memcmp(row(slot, layer, true), expected_.data() + row_bytes_, row_bytes_) == 0;
      }
      wrong += same ? 0 : 1;
    }
    return wrong;
  }

 private:
  static std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
  }
  // K then V bytes of one row: splitmix64 from the prefix hash.
  void fill_row(std::uint64_t h) {
    expected_.resize(2 * row_bytes_);
    for (std::size_t i = 0; i < expected_.size(); i += sizeof(std::uint64_t)) {
      h += 0x9e3779b97f4a7c15ull;
      const std::uint64_t z = detail::mix64(h);
      std::memcpy(expected_.data() + i, &z, std::min(sizeof z, expected_.size() - i));
    }
  }
  unsigned char* row(std::int64_t slot, std::int32_t layer, bool value) const {
    const auto page = static_cast<std::int32_t>(slot / static_cast<std::int64_t>(page_size_));
    void* base = value ? pool_.v_data(page, layer) : pool_.k_data(page, layer);
    return static_cast<unsigned char*>(base) +
           static_cast<std::size_t>(slot % static_cast<std::int64_t>(page_size_)) * row_bytes_;
  }

  const PagedKvPool& pool_;
  const std::size_t page_size_;
  const std::size_t row_bytes_;
  std::vector<std::uint64_t> hashes_;
  std::vector<unsigned char> expected_;
};

// Where the pages of outputs that are never cached (Mooncake) are held: an
// admission in a namespace no workload uses, aborted at the end of the request.
constexpr std::string_view kOutputPagesSalt = "\x01replay: output pages (never cached)";

// One request through the Engine (see replay_driver.hpp). Returns ok with
// `failed` set when the Engine refuses the pages (out_of_memory).
class TieredRequestReplayer {
 public:
  TieredRequestReplayer(const Workload& workload, Engine& engine, bool kv_bytes)
      : workload_(workload),
        engine_(engine),
        page_size_(static_cast<std::size_t>(engine.page_size())),
        rows_(kv_bytes ? std::make_unique<PrefixRows>(engine.pool()) : nullptr) {}

  Status replay(const Request& request, int priority, PriorityUpdate update, ReplayResult& result, bool& failed) {
    failed = false;
    const std::string_view salt = workload_.salt(request);
    const std::span<const std::int32_t> prompt = workload_.prompt(request);
    const Status admitted =
        engine_.admit(prompt, {.cache_salt = salt, .priority = priority, .priority_update = update}, admission_);
    if (admitted.code() == StatusCode::out_of_memory) {
      failed = true;
      return {};
    }
    CLM_RETURN_IF_ERROR(admitted);
    const auto cached = static_cast<std::uint64_t>(admission_.cached_tokens);
    const auto host = static_cast<std::uint64_t>(admission_.host_tokens);
    const auto storage = static_cast<std::uint64_t>(admission_.storage_tokens);
    result.hit_tokens += cached;
    result.device_hit_tokens += cached - host;
    result.host_hit_tokens += host - storage;
    result.storage_hit_tokens += storage;
    if (rows_) {
      rows_->hash_prefixes(salt, workload_.output_cached ? workload_.prompt_and_output(request) : prompt);
      if (const std::uint64_t wrong = rows_->wrong_rows(admission_.cached_tokens, admission_.page_table); wrong) {
        (void)engine_.abort(admission_.seq);
        return {StatusCode::internal,
                fmt::format("{} of {} cached tokens came back with K/V rows of another prefix ({} from the host "
                            "tier, {} of those from storage)",
                            wrong, cached, host, storage)};
      }
      rows_->write(static_cast<std::size_t>(admission_.cached_tokens), admission_.slots);
    }
    if (request.output_tokens > 0) {
      const Status held = workload_.output_cached ? decode_output(request) : hold_output_pages(request);
      if (!held.ok()) {
        (void)engine_.abort(admission_.seq);
        if (held.code() != StatusCode::out_of_memory) return held;
        failed = true;
        engine_.wait_for_tiers();
        return {};
      }
    }
    CLM_RETURN_IF_ERROR(engine_.finish(admission_.seq));
    engine_.wait_for_tiers();
    return {};
  }

 private:
  // gsp/JSONL: the output is decoded into the sequence, so finish() caches it.
  Status decode_output(const Request& request) {
    const std::span<const std::int32_t> all = workload_.prompt_and_output(request);
    const std::size_t prompt_tokens = static_cast<std::size_t>(request.prompt_tokens);
    CLM_RETURN_IF_ERROR(engine_.extend(admission_.seq, all.subspan(prompt_tokens), slots_));
    if (rows_) rows_->write(prompt_tokens, slots_);
    return {};
  }

  // Mooncake: the output's pages are taken for the request's lifetime, as
  // extend() would take them, but through an admission that is aborted, so
  // finish() caches the prompt alone.
  Status hold_output_pages(const Request& request) {
    const std::size_t prompt_pages = (static_cast<std::size_t>(request.prompt_tokens) + page_size_ - 1) / page_size_;
    const std::size_t all_pages = (static_cast<std::size_t>(request.prompt_tokens) +
                                   static_cast<std::size_t>(request.output_tokens) + page_size_ - 1) /
                                  page_size_;
    if (all_pages == prompt_pages) return {};
    placeholder_.assign((all_pages - prompt_pages) * page_size_, 0);
    Admission held;
    CLM_RETURN_IF_ERROR(engine_.admit(placeholder_, {.cache_salt = kOutputPagesSalt}, held));
    return engine_.abort(held.seq);
  }

  const Workload& workload_;
  Engine& engine_;
  const std::size_t page_size_;
  std::unique_ptr<PrefixRows> rows_;
  Admission admission_;  // kept across requests, so that its vectors keep their capacity
  std::vector<std::int64_t> slots_;
  std::vector<std::int32_t> placeholder_;
};

Status run_tiered_replay(const Workload& workload, const ReplayConfig& config, ReplayResult& out) {
  EngineConfig engine_config;
  engine_config.pool.page_size = config.page_size;
  engine_config.pool.num_pages = static_cast<std::int32_t>(config.capacity_tokens / config.page_size);
  const bool kv_bytes = !config.storage_url.empty();
  if (kv_bytes) {
    engine_config.pool.memory = MemoryKind::host;
    engine_config.pool.num_layers = kTieredKvLayout.num_layers;
    engine_config.pool.kv_heads = kTieredKvLayout.kv_heads;
    engine_config.pool.head_dim = kTieredKvLayout.head_dim;
    engine_config.pool.dtype = kTieredKvLayout.dtype;
  } else {
    engine_config.pool.memory = MemoryKind::none;
  }
  engine_config.eviction_policy = config.policy;
  if (config.policy == EvictionPolicy::ghost_slru) {
    engine_config.ghost_slru_protected_fraction = config.effective_protected_fraction();
    engine_config.ghost_slru_memory = config.effective_ghost_memory();
  } else if (config.policy == EvictionPolicy::slru) {
    engine_config.slru_protected_fraction = config.effective_protected_fraction();
  }
  engine_config.tiers.host_pages = static_cast<std::int32_t>(config.host_capacity_tokens / config.page_size);
  engine_config.tiers.write_policy = config.write_policy;
  engine_config.tiers.storage_url = config.storage_url;
  engine_config.model_id = config.model_id;
  engine_config.tiers.prefetch_policy = config.prefetch_policy;
  // The replay counts hits: no admission deadline may cut a slow fetch short
  // and make them depend on the machine's load.
  engine_config.tiers.admission_deadline_ms = 3.6e6;
  engine_config.kv_events = config.kv_events;
  engine_config.divergence.enabled = config.divergence;
  std::unique_ptr<Engine> engine;
  CLM_RETURN_IF_ERROR(Engine::create(engine_config, engine));

  ReplayResult result;
  result.tiered = true;
  result.has_kv_bytes = kv_bytes;
  result.page_size = config.page_size;
  result.num_pages = engine_config.pool.num_pages;
  result.protected_fraction = config.effective_protected_fraction();
  result.ghost_memory = config.effective_ghost_memory();
  result.host_pages = engine_config.tiers.host_pages;
  const std::vector<std::uint8_t> priorities = plan_hints(workload, config, result);
  TieredRequestReplayer replayer(workload, *engine, kv_bytes);
  auto sample_metadata = [&] {
    const RadixTreeMetrics cache = engine->metrics().cache;
    if (cache.cached_tokens > result.peak_cached_tokens) {
      result.peak_cached_tokens = cache.cached_tokens;
      result.metadata_bytes_at_peak = cache.metadata_bytes;
    }
  };
  const auto interval = static_cast<std::size_t>(config.metadata_sample_interval);

  const Clock::time_point start = Clock::now();
  for (std::size_t i = 0; i < workload.requests.size(); ++i) {
    bool failed = false;
    const Status status = replayer.replay(workload.requests[i], priorities[i], config.hint_update, result, failed);
    if (!status.ok()) return with_context(i, status);
    result.failed_requests += failed;
    if ((i + 1) % interval == 0) sample_metadata();
  }
  const Clock::time_point stop = Clock::now();
  sample_metadata();

  result.wall_s = std::chrono::duration<double>(stop - start).count();
  result.wall_s_runs = {result.wall_s};
  result.requests = workload.requests.size();
  result.prompt_tokens = workload.total_prompt_tokens();
  const EngineMetrics metrics = engine->metrics();
  result.inserted_tokens = metrics.cache.inserted_tokens;
  result.evicted_tokens = metrics.cache.evicted_tokens;
  result.evictions = metrics.cache.evictions;
  result.final_cached_tokens = metrics.cache.cached_tokens;
  result.final_metadata_bytes = metrics.cache.metadata_bytes;
  result.diverged_lookups = metrics.cache.diverged_matches;
  if (config.divergence) {
    DivergenceReport report;
    CLM_RETURN_IF_ERROR(engine->divergence_report({.top_per_tenant = 1}, report));
    if (!report.points.empty()) result.top_branch_point = report.points.front();
  }
  result.tiers = metrics.tiers;
  if (metrics.active_sequences != 0) {
    return {StatusCode::internal, fmt::format("{} sequences still running at the end", metrics.active_sequences)};
  }
  // Every device page is free or the tree's (no sequence holds one now).
  CLM_RETURN_IF_ERROR(engine->check_invariants());
  if (config.kv_events.enabled) {
    CLM_RETURN_IF_ERROR(engine->flush_kv_events(std::chrono::seconds(60)));
    std::vector<std::uint64_t> blocks;
    CLM_RETURN_IF_ERROR(engine->kv_event_blocks(KvMedium::gpu, blocks));
    result.cached_pages_device = blocks.size();
    CLM_RETURN_IF_ERROR(engine->kv_event_blocks(KvMedium::cpu, blocks));
    result.cached_pages_host = blocks.size();
    result.kv_events = engine->metrics().kv_events;
    result.kv_events_endpoint = engine->kv_events_endpoint();
    result.kv_events_replay_endpoint = engine->kv_events_replay_endpoint();
  }
  if (config.keep_engine) result.engine = std::move(engine);
  out = std::move(result);
  return {};
}

}  // namespace

double ReplayConfig::effective_protected_fraction() const {
  if (!std::isnan(protected_fraction)) return protected_fraction;
  if (policy == EvictionPolicy::ghost_slru) return kDefaultGhostSlruProtectedFraction;
  if (policy == EvictionPolicy::slru) return kDefaultSlruProtectedFraction;
  return std::numeric_limits<double>::quiet_NaN();  // the policy has none
}

double ReplayConfig::effective_ghost_memory() const {
  if (policy != EvictionPolicy::ghost_slru) return std::numeric_limits<double>::quiet_NaN();
  return std::isnan(ghost_memory) ? kDefaultGhostMemory : ghost_memory;
}

double ReplayResult::hit_rate() const {
  return prompt_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double ReplayResult::device_hit_rate() const {
  if (!tiered) return hit_rate();
  return prompt_tokens ? static_cast<double>(device_hit_tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double ReplayResult::host_hit_rate() const {
  return prompt_tokens ? static_cast<double>(host_hit_tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double ReplayResult::storage_hit_rate() const {
  return prompt_tokens ? static_cast<double>(storage_hit_tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double ReplayResult::requests_per_s() const { return wall_s > 0 ? static_cast<double>(requests) / wall_s : 0.0; }
double ReplayResult::metadata_bytes_per_token() const {
  return peak_cached_tokens > 0 ? static_cast<double>(metadata_bytes_at_peak) / static_cast<double>(peak_cached_tokens)
                                : 0.0;
}
double ReplayResult::final_metadata_bytes_per_token() const {
  return final_cached_tokens > 0 ? static_cast<double>(final_metadata_bytes) / static_cast<double>(final_cached_tokens)
                                 : 0.0;
}
std::uint64_t ReplayResult::touched_bytes() const {
  const auto page = static_cast<std::uint64_t>(std::max(page_size, 1));
  return 8 * hit_tokens + 4 * inserted_tokens + 4 * (hit_tokens / page + inserted_tokens / page);
}
double ReplayResult::memory_bound_fraction(double memcmp_gbps) const {
  if (wall_s <= 0 || memcmp_gbps <= 0) return 0.0;
  return static_cast<double>(touched_bytes()) / wall_s / (memcmp_gbps * 1e9);
}

Status run_replay(const Workload& workload, const ReplayConfig& config, ReplayResult& out) {
  CLM_RETURN_IF_ERROR(validate(config));
  CLM_RETURN_IF_ERROR(validate_hint(workload, config));
  if (config.tiered()) return run_tiered_replay(workload, config, out);
  PagedKvPoolConfig pool_config;
  pool_config.page_size = config.page_size;
  pool_config.num_pages = static_cast<std::int32_t>(config.capacity_tokens / config.page_size);
  pool_config.memory = MemoryKind::none;
  std::unique_ptr<PagedKvPool> pool;
  CLM_RETURN_IF_ERROR(PagedKvPool::create(pool_config, pool));

  ReplayResult result;
  result.page_size = config.page_size;
  result.num_pages = pool_config.num_pages;
  result.protected_fraction = config.effective_protected_fraction();
  result.ghost_memory = config.effective_ghost_memory();
  const std::vector<std::uint8_t> priorities = plan_hints(workload, config, result);
  // Belady knows the future: worked out before the clock starts.
  std::unique_ptr<NextUses> next_uses;
  if (config.policy == EvictionPolicy::belady) next_uses = std::make_unique<NextUses>(workload, config.page_size);
  {
    RadixTree tree(*pool, config.policy, config.effective_protected_fraction(), nullptr,
                   config.effective_ghost_memory());
    CLM_RETURN_IF_ERROR(tree.set_divergence({.enabled = config.divergence}));
    RequestReplayer replayer(workload, tree, *pool, next_uses.get());
    auto sample_metadata = [&] {
      const std::int64_t cached = tree.cached_tokens();
      if (cached > result.peak_cached_tokens) {
        result.peak_cached_tokens = cached;
        result.metadata_bytes_at_peak = tree.metadata_bytes();
      }
    };
    const auto interval = static_cast<std::size_t>(config.metadata_sample_interval);

    const Clock::time_point start = Clock::now();
    for (std::size_t i = 0; i < workload.requests.size(); ++i) {
      bool failed = false;
      const Status status =
          replayer.replay(i, workload.requests[i], priorities[i], config.hint_update, result.hit_tokens, failed);
      if (!status.ok()) return with_context(i, status);
      result.failed_requests += failed;
      if ((i + 1) % interval == 0) sample_metadata();
    }
    const Clock::time_point stop = Clock::now();
    sample_metadata();

    result.wall_s = std::chrono::duration<double>(stop - start).count();
    result.wall_s_runs = {result.wall_s};
    result.requests = workload.requests.size();
    result.prompt_tokens = workload.total_prompt_tokens();
    const RadixTreeMetrics metrics = tree.metrics();
    result.inserted_tokens = metrics.inserted_tokens;
    result.evicted_tokens = metrics.evicted_tokens;
    result.evictions = metrics.evictions;
    result.final_cached_tokens = tree.cached_tokens();
    result.final_metadata_bytes = tree.metadata_bytes();
    result.diverged_lookups = metrics.diverged_matches;
    if (config.divergence) {
      DivergenceReport report;
      CLM_RETURN_IF_ERROR(tree.divergence_report({.top_per_tenant = 1}, &KvEventRecorder::salt_digest, report));
      if (!report.points.empty()) result.top_branch_point = report.points.front();
    }

    // Every page in use must be a cached one: requests gave back the rest.
    const std::int64_t used_tokens = static_cast<std::int64_t>(pool->used_pages()) * config.page_size;
    if (used_tokens != tree.cached_tokens()) {
      return {StatusCode::internal, fmt::format("page leak: {} pages ({} tokens) in use, but the tree caches {} tokens",
                                                pool->used_pages(), used_tokens, tree.cached_tokens())};
    }
    CLM_RETURN_IF_ERROR(tree.check_invariants());
  }
  if (pool->used_pages() != 0) {
    return {StatusCode::internal,
            fmt::format("page leak: {} pages still in use after the tree released its own", pool->used_pages())};
  }
  out = std::move(result);
  return {};
}

Status run_replays(const Workload& workload, const ReplayConfig& config, int repeats, ReplayResult& out) {
  if (repeats < 1) return invalid_argument(fmt::format("repeat count must be >= 1, got {}", repeats));
  if (repeats > 1 && !config.storage_url.empty()) {
    return invalid_argument("a replay with a storage tier runs once: a repeat would find the first run's pages there");
  }
  ReplayResult first;
  std::vector<double> walls;
  for (int run = 0; run < repeats; ++run) {
    ReplayResult result;
    CLM_RETURN_IF_ERROR(run_replay(workload, config, result));
    if (run == 0) {
      first = result;
    } else if (!same_counts(first, result)) {
      return {StatusCode::internal,
              fmt::format("run {} counted differently from run 1: the replay is not deterministic", run + 1)};
    }
    walls.push_back(result.wall_s);
  }
  std::vector<double> sorted = walls;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t mid = sorted.size() / 2;
  first.wall_s = sorted.size() % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  first.wall_s_runs = std::move(walls);
  out = std::move(first);
  return {};
}

double measure_memcmp_gbps(std::size_t buffer_bytes, int passes) {
  // Both buffers are written first, so that no pass pays for page faults.
  const std::vector<unsigned char> a(buffer_bytes, 0x5a);
  const std::vector<unsigned char> b(buffer_bytes, 0x5a);
  volatile int sink = 0;  // keeps the comparisons from being optimised away
  double best_s = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < passes; ++pass) {
    const Clock::time_point start = Clock::now();
    const int order = std::memcmp(a.data(), b.data(), buffer_bytes);
    const Clock::time_point stop = Clock::now();
    sink = sink + order;
    best_s = std::min(best_s, std::chrono::duration<double>(stop - start).count());
  }
  return best_s > 0 ? 2.0 * static_cast<double>(buffer_bytes) / best_s / 1e9 : 0.0;
}

}  // namespace clm::replay
