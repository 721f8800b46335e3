// examples/replay/replay_driver.cpp: the replay loop, its leak and invariant
// checks, and the memcmp bandwidth probe.
#include "replay_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "clm/paged_kv_pool.hpp"
#include "clm/radix_tree.hpp"

namespace clm::replay {
namespace {

using Clock = std::chrono::steady_clock;

Status with_context(std::size_t request, const Status& status) {
  return {status.code(), fmt::format("request {}: {}", request, status.message())};
}

// One request's walk through the protocol. Returns ok with `failed` set when
// the pool cannot hold it even after evicting every unlocked prefix.
class RequestReplayer {
 public:
  RequestReplayer(const Workload& workload, RadixTree& tree, PagedKvPool& pool)
      : workload_(workload), tree_(tree), pool_(pool), page_size_(static_cast<std::size_t>(tree.page_size())) {}

  Status replay(const Request& request, std::uint64_t& hit_tokens, bool& failed) {
    const std::span<const std::int32_t> prompt = workload_.prompt(request);
    const CacheNamespace ns{workload_.salt(request), 0};
    CLM_RETURN_IF_ERROR(tree_.match_prefix(prompt, ns, match_));
    CLM_RETURN_IF_ERROR(tree_.lock(match_.node));
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
    CLM_RETURN_IF_ERROR(tree_.insert(prompt, pages, ns, prompt_done_));
    CLM_RETURN_IF_ERROR(tree_.lock(prompt_done_.node));
    CLM_RETURN_IF_ERROR(tree_.unlock(match_.node));
    std::int32_t stored_tokens = prompt_done_.stored_tokens;
    if (workload_.output_cached) {  // the request finished: its output is reusable too
      CLM_RETURN_IF_ERROR(tree_.insert(workload_.prompt_and_output(request), pages, ns, request_done_));
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
  PrefixMatch match_;  // kept across requests, so that its page vector keeps its capacity
  InsertOutcome prompt_done_;
  InsertOutcome request_done_;
};

Status validate(const ReplayConfig& config) {
  if (config.page_size <= 0) return invalid_argument(fmt::format("page size must be > 0, got {}", config.page_size));
  if (config.capacity_tokens < config.page_size) {
    return invalid_argument(fmt::format("capacity {} tokens is less than one page of {} tokens",
                                        config.capacity_tokens, config.page_size));
  }
  if (config.capacity_tokens / config.page_size > std::numeric_limits<std::int32_t>::max()) {
    return invalid_argument(fmt::format("capacity {} tokens is more than 2^31-1 pages of {} tokens",
                                        config.capacity_tokens, config.page_size));
  }
  if (config.metadata_sample_interval <= 0) return invalid_argument("metadata sample interval must be > 0");
  return {};
}

bool same_counts(const ReplayResult& a, const ReplayResult& b) {
  return a.requests == b.requests && a.failed_requests == b.failed_requests && a.prompt_tokens == b.prompt_tokens &&
         a.hit_tokens == b.hit_tokens && a.inserted_tokens == b.inserted_tokens &&
         a.evicted_tokens == b.evicted_tokens && a.evictions == b.evictions &&
         a.final_cached_tokens == b.final_cached_tokens;
}

}  // namespace

double ReplayResult::hit_rate() const {
  return prompt_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens) : 0.0;
}
double ReplayResult::requests_per_s() const { return wall_s > 0 ? static_cast<double>(requests) / wall_s : 0.0; }
double ReplayResult::metadata_bytes_per_token() const {
  return peak_cached_tokens > 0 ? static_cast<double>(metadata_bytes_at_peak) / static_cast<double>(peak_cached_tokens)
                                : 0.0;
}
double ReplayResult::final_metadata_bytes_per_token() const {
  return final_cached_tokens > 0
             ? static_cast<double>(final_metadata_bytes) / static_cast<double>(final_cached_tokens)
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
  PagedKvPoolConfig pool_config;
  pool_config.page_size = config.page_size;
  pool_config.num_pages = static_cast<std::int32_t>(config.capacity_tokens / config.page_size);
  pool_config.memory = MemoryKind::none;
  std::unique_ptr<PagedKvPool> pool;
  CLM_RETURN_IF_ERROR(PagedKvPool::create(pool_config, pool));

  ReplayResult result;
  result.page_size = config.page_size;
  result.num_pages = pool_config.num_pages;
  {
    RadixTree tree(*pool, config.policy);
    RequestReplayer replayer(workload, tree, *pool);
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
      const Status status = replayer.replay(workload.requests[i], result.hit_tokens, failed);
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

    // Every page in use must be a cached one: requests gave back the rest.
    const std::int64_t used_tokens = static_cast<std::int64_t>(pool->used_pages()) * config.page_size;
    if (used_tokens != tree.cached_tokens()) {
      return {StatusCode::internal,
              fmt::format("page leak: {} pages ({} tokens) in use, but the tree caches {} tokens", pool->used_pages(),
                          used_tokens, tree.cached_tokens())};
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
  ReplayResult first;
  std::vector<double> walls;
  for (int run = 0; run < repeats; ++run) {
    ReplayResult result;
    CLM_RETURN_IF_ERROR(run_replay(workload, config, result));
    if (run == 0) {
      first = result;
    } else if (!same_counts(first, result)) {
      return {StatusCode::internal, fmt::format("run {} counted differently from run 1: the replay is not deterministic",
                                                run + 1)};
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
