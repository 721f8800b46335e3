// tests/bench/bench_prefix_cache.cpp: benchmarks of the prefix cache, each
// figure printed as one JSON line beside a baseline measured in the same run:
//
//   pool_alloc_free   PagedKvPool allocate+release, ns per page, against a
//                     bare std::vector<int32_t> free list: pop_back/push_back
//                     per id (no reference counts, no checks, no Status).
//   gsp_replay        requests/s of the gsp replay, against the requests/s a
//                     replay would reach if it only streamed the bytes it must
//                     touch at memcmp bandwidth (ratio = memory_bound_fraction).
//   gsp_hit_rate      hit rate, against the unbounded optimum 0.8824.
//   tree_metadata     tree bytes per cached token, against 4 (raw token ids).
//   mooncake_hit_rate hit rate per policy and capacity on the Mooncake trace,
//                     against LRU's in the same run (skipped without the trace).
//
// CLM_BENCH_SMOKE=1: one run of each, the trace's first 500 requests.
//
// The trace is looked for at --shared DIR, $CLM_SHARED_DIR, or a shared/
// folder beside any ancestor of the executable or of the working directory.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "clm/cache/eviction_policy.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "replay_driver.hpp"
#include "workload.hpp"

namespace {

namespace fs = std::filesystem;
using clm::replay::ReplayConfig;
using clm::replay::ReplayResult;
using clm::replay::Workload;
using clm_bench::Clock;
using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
using clm_bench::seconds_since;

constexpr std::string_view kBench = "prefix_cache";
constexpr std::string_view kTracePath = "traces/mooncake/conversation_trace.jsonl";

// The plainest free list: ids popped off and pushed back onto a
// std::vector<int32_t> one at a time, with no reference counts, no checks and
// no Status. What handing out page ids costs at the least without batching.
class VectorFreeList {
 public:
  explicit VectorFreeList(std::int32_t pages) {
    for (std::int32_t p = pages - 1; p >= 0; --p) free_.push_back(p);
  }
  bool allocate(std::span<std::int32_t> out) {
    if (out.size() > free_.size()) return false;
    for (std::int32_t& page : out) {
      page = free_.back();
      free_.pop_back();
    }
    return true;
  }
  void release(std::span<const std::int32_t> pages) {
    for (const std::int32_t page : pages) free_.push_back(page);
  }

 private:
  std::vector<std::int32_t> free_;
};

// ns per page of `rounds` allocate+release cycles of `batch` pages.
template <class Allocate, class Release>
double time_alloc_free(std::size_t batch, std::size_t rounds, Allocate&& allocate, Release&& release) {
  std::vector<std::int32_t> pages(batch);
  std::int64_t checksum = 0;  // uses the ids, so that no cycle is optimised away
  const Clock::time_point start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) {
    if (!allocate(std::span(pages))) std::abort();
    checksum += pages[r % batch];
    release(std::span<const std::int32_t>(pages));
  }
  const double s = seconds_since(start);
  if (checksum < 0) std::abort();
  return s * 1e9 / static_cast<double>(batch * rounds);
}

void bench_pool_alloc_free() {
  constexpr std::int32_t kPoolPages = 65536;
  const std::size_t pages_per_run = std::size_t{1} << (clm_bench::smoke_run() ? 18 : 22);
  const int runs = clm_bench::smoke_run() ? 1 : 7;
  clm::PagedKvPoolConfig config;
  config.num_pages = kPoolPages;
  config.page_size = 16;
  config.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::PagedKvPool> pool;
  if (!clm::PagedKvPool::create(config, pool).ok()) std::abort();
  VectorFreeList free_list(kPoolPages);
  for (const std::size_t batch : {std::size_t{1}, std::size_t{16}, std::size_t{256}}) {
    const std::size_t rounds = pages_per_run / batch;
    std::vector<double> pool_ns, list_ns;
    for (int run = 0; run < runs; ++run) {
      pool_ns.push_back(time_alloc_free(
          batch, rounds, [&](std::span<std::int32_t> out) { return pool->allocate(out).ok(); },
          [&](std::span<const std::int32_t> in) {
            if (!pool->release(in).ok()) std::abort();
          }));
      list_ns.push_back(time_alloc_free(
          batch, rounds, [&](std::span<std::int32_t> out) { return free_list.allocate(out); },
          [&](std::span<const std::int32_t> in) { free_list.release(in); }));
    }
    print_figure(kBench, fmt::format("pool_alloc_free/batch={}", batch), "ns_per_page", median(pool_ns), "ns",
                 "vector_free_list_ns_per_page", median(list_ns));
  }
}

void bench_gsp(double memcmp_gbps) {
  const Workload gsp = clm::replay::generate_gsp();
  const double optimum = 64.0 * 15 * 2048 / (1024.0 * 2176);
  for (const std::int32_t page_size : {1, 16}) {
    for (const std::int64_t capacity : {std::int64_t{131072}, std::int64_t{1048576}}) {
      ReplayConfig config;
      config.page_size = page_size;
      config.capacity_tokens = capacity;
      ReplayResult r;
      if (const clm::Status s = clm::replay::run_replays(gsp, config, clm_bench::smoke_run() ? 1 : 5, r); !s.ok()) {
        die(fmt::format("gsp replay failed: {}", s.message()));
      }
      const std::string name = fmt::format("gsp/page={}/capacity={}", page_size, capacity);
      const double bound_rps =
          static_cast<double>(r.requests) * memcmp_gbps * 1e9 / static_cast<double>(r.touched_bytes());
      print_figure(kBench, name, "requests_per_s", r.requests_per_s(), "requests/s", "memcmp_bound_requests_per_s",
                   bound_rps);
      print_figure(kBench, name, "hit_rate", r.hit_rate(), "fraction", "unbounded_optimum_hit_rate", optimum);
      print_figure(kBench, name, "metadata_bytes_per_token", r.metadata_bytes_per_token(), "bytes/token",
                   "raw_token_id_bytes_per_token", 4.0);
    }
  }
}

std::optional<fs::path> find_trace(int argc, char** argv) {
  std::vector<fs::path> shared_dirs;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) == "--shared") shared_dirs.emplace_back(argv[i + 1]);
  }
  if (const char* env = std::getenv("CLM_SHARED_DIR")) shared_dirs.emplace_back(env);
  std::error_code error;
  for (fs::path start : {fs::absolute(argv[0], error).parent_path(), fs::current_path(error)}) {
    for (fs::path dir = start; !dir.empty(); dir = dir.parent_path()) {
      shared_dirs.push_back(dir / "shared");
      if (dir == dir.parent_path()) break;
    }
  }
  for (const fs::path& dir : shared_dirs) {
    if (fs::is_regular_file(dir / kTracePath, error)) return dir / kTracePath;
  }
  return std::nullopt;
}

void bench_mooncake(const fs::path& trace_path) {
  Workload trace;
  if (const clm::Status s = clm::replay::read_mooncake_trace(trace_path.string(), trace); !s.ok()) {
    die(s.message());
  }
  std::vector<std::int64_t> capacities{100000, 1000000, 3000000};
  if (clm_bench::smoke_run()) {  // the trace's first 500 requests (as the report's smoke sweep)
    if (trace.requests.size() > 500) trace.requests.resize(500);
    capacities.pop_back();
  }
  for (const std::int64_t capacity : capacities) {
    double lru_hit_rate = 0;
    // belady: the offline optimum, the replay computing every page's next use (docs/eviction.md).
    for (const auto policy : {clm::EvictionPolicy::lru, clm::EvictionPolicy::lfu, clm::EvictionPolicy::slru,
                              clm::EvictionPolicy::ghost_slru, clm::EvictionPolicy::belady}) {
      ReplayConfig config;
      config.page_size = 16;
      config.capacity_tokens = capacity;
      config.policy = policy;
      ReplayResult r;
      if (const clm::Status s = clm::replay::run_replay(trace, config, r); !s.ok()) {
        die(fmt::format("mooncake replay failed: {}", s.message()));
      }
      if (policy == clm::EvictionPolicy::lru) lru_hit_rate = r.hit_rate();
      print_figure(kBench,
                   fmt::format("mooncake/page=16/capacity={}/policy={}", capacity, clm::eviction_policy_name(policy)),
                   "hit_rate", r.hit_rate(), "fraction", "lru_hit_rate", lru_hit_rate);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench_pool_alloc_free();
  bench_gsp(clm::replay::measure_memcmp_gbps());
  if (const auto trace = find_trace(argc, argv)) {
    bench_mooncake(*trace);
  } else {
    fmt::print(stderr,
               "bench_prefix_cache: skipping the Mooncake cases: no {} under --shared, $CLM_SHARED_DIR or a shared/ "
               "folder beside the executable's or working directory's ancestors\n",
               kTracePath);
  }
  return 0;
}
