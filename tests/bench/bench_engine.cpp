// bench_engine: the request lifecycle through clm::Engine, through the C ABI,
// and from two threads at once. One JSON object per figure:
//   engine/capi_vs_cpp   gsp replay via clm_* calls; baseline: the same via the C++ Engine
//   engine/threads       requests/s with 2 threads on one Engine; baseline: 1 thread
//   engine/spin          requests/s and CPU time a request with 2 and 4 threads on one
//                        Engine, for each count of PAUSEs the lock spins before it
//                        sleeps (detail/spin_mutex.hpp); baseline: the default count
//   engine/admit_cached  microseconds an admit (then abort) of a prompt whose every
//                        page is cached takes, 2k and 32k tokens; baseline: the
//                        tree's match_prefix, lock and unlock of it alone (what
//                        admit must do; the rest is the Engine's own cost)
// Each request: admit(prompt), extend(its 256 output tokens), finish.
// CLM_BENCH_SMOKE=1: one run of each, one spin round of 2 passes.
#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "clm.h"
#include "clm/detail/spin_mutex.hpp"
#include "clm/engine.hpp"
#include "workload.hpp"

namespace {

using clm_bench::Clock;
using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
using clm_bench::seconds_since;

constexpr std::string_view kBench = "engine";
constexpr std::int32_t kPageSize = 16;
constexpr std::int32_t kPages = (1 << 20) / kPageSize;  // 1M tokens: no eviction on gsp
constexpr int kRuns = 5;

std::unique_ptr<clm::Engine> make_engine() {
  clm::EngineConfig config;
  config.pool.num_pages = kPages;
  config.pool.page_size = kPageSize;
  config.pool.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::Engine> engine;
  if (clm::Status s = clm::Engine::create(config, engine); !s.ok()) die(s.message());
  return engine;
}

// Requests [begin, end) with stride `step` through the C++ Engine.
void replay_cpp(clm::Engine& engine, const clm::replay::Workload& w, std::size_t begin, std::size_t step) {
  clm::Admission admission;
  std::vector<std::int64_t> slots;
  for (std::size_t i = begin; i < w.requests.size(); i += step) {
    const clm::replay::Request& r = w.requests[i];
    const auto all = w.prompt_and_output(r);
    clm::Status s = engine.admit(w.prompt(r), {}, admission);
    if (s.ok()) s = engine.extend(admission.seq, all.subspan(static_cast<std::size_t>(r.prompt_tokens)), slots);
    if (s.ok()) s = engine.finish(admission.seq);
    if (!s.ok()) die(s.message());
  }
}

double run_cpp(const clm::replay::Workload& w) {
  auto engine = make_engine();
  const auto start = Clock::now();
  replay_cpp(*engine, w, 0, 1);
  return seconds_since(start);
}

double run_capi(const clm::replay::Workload& w) {
  clm_engine_options options;
  clm_engine_options_init(&options, sizeof options);
  options.num_pages = kPages;
  options.page_size = kPageSize;
  options.memory = CLM_MEMORY_NONE;
  clm_engine* engine = nullptr;
  if (clm_engine_create(&engine, &options) != CLM_OK) die(clm_last_error());
  const auto start = Clock::now();
  for (const clm::replay::Request& r : w.requests) {
    const auto all = w.prompt_and_output(r);
    clm_seq* seq = nullptr;
    if (clm_engine_admit(&seq, engine, all.data(), static_cast<size_t>(r.prompt_tokens), nullptr) != CLM_OK ||
        clm_seq_extend(seq, all.data() + r.prompt_tokens, static_cast<size_t>(r.output_tokens)) != CLM_OK ||
        clm_seq_finish(seq) != CLM_OK) {
      die(clm_last_error());
    }
    clm_seq_free(seq);
  }
  const double wall = seconds_since(start);
  clm_engine_free(engine);
  return wall;
}

double run_threads(const clm::replay::Workload& w, int threads) {
  auto engine = make_engine();
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(
        [&, t] { replay_cpp(*engine, w, static_cast<std::size_t>(t), static_cast<std::size_t>(threads)); });
  }
  for (auto& t : pool) t.join();
  return seconds_since(start);
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

struct SpinRun {
  double wall_s, cpu_s;
};

// `passes` passes of the workload from `threads` threads on one Engine whose
// lock spins `spins` PAUSEs before sleeping.
SpinRun run_spins(const clm::replay::Workload& w, int threads, int spins, int passes) {
  clm::detail::spins_before_sleep.store(spins);
  auto engine = make_engine();
  const double cpu_start = cpu_seconds();
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int pass = 0; pass < passes; ++pass) {
        replay_cpp(*engine, w, static_cast<std::size_t>(t), static_cast<std::size_t>(threads));
      }
    });
  }
  for (auto& t : pool) t.join();
  const SpinRun run{seconds_since(start), cpu_seconds() - cpu_start};
  clm::detail::spins_before_sleep.store(clm::detail::kDefaultSpinsBeforeSleep);
  return run;
}

}  // namespace

// The medians, in microseconds, of admit + abort of a fully cached prompt of
// `tokens` tokens on an Engine, and of match_prefix + lock + unlock of it on
// a bare RadixTree, interleaved in blocks of `reps`.
clm_bench::PairedMedians admit_cached_us(std::size_t tokens, int runs, int reps) {
  std::vector<std::int32_t> prompt(tokens);
  for (std::size_t i = 0; i < tokens; ++i) prompt[i] = static_cast<std::int32_t>((i * 7919 + tokens) % 150000);
  auto engine = make_engine();
  clm::Admission admission;
  if (clm::Status s = engine->admit(prompt, {}, admission); !s.ok()) die(s.message());
  if (clm::Status s = engine->finish(admission.seq); !s.ok()) die(s.message());

  clm::PagedKvPoolConfig pool_config;
  pool_config.num_pages = kPages;
  pool_config.page_size = kPageSize;
  pool_config.memory = clm::MemoryKind::none;
  std::unique_ptr<clm::PagedKvPool> pool;
  clm_bench::check(clm::PagedKvPool::create(pool_config, pool), "PagedKvPool::create");
  clm::RadixTree tree(*pool, clm::EvictionPolicy::lru);
  std::vector<std::int32_t> pages(tokens / kPageSize);
  clm_bench::check(pool->allocate(pages), "allocate");
  clm::InsertOutcome inserted;
  clm_bench::check(tree.insert(prompt, pages, {}, inserted), "insert");
  clm::PrefixMatch match;

  return clm_bench::interleaved_medians(
      runs,
      [&] {
        const auto start = Clock::now();
        for (int r = 0; r < reps; ++r) {
          if (!engine->admit(prompt, {}, admission).ok() || !engine->abort(admission.seq).ok()) die("admit");
        }
        return 1e6 * seconds_since(start) / reps;
      },
      [&] {
        const auto start = Clock::now();
        for (int r = 0; r < reps; ++r) {
          if (!tree.match_prefix(prompt, {}, match).ok() || !tree.lock(match.node).ok() ||
              !tree.unlock(match.node).ok()) {
            die("match_prefix");
          }
        }
        return 1e6 * seconds_since(start) / reps;
      });
}

int main() {
  const bool smoke = clm_bench::smoke_run();
  const int runs = smoke ? 1 : kRuns;
  const clm::replay::Workload gsp = clm::replay::generate_gsp();
  const double requests = static_cast<double>(gsp.requests.size());

  // Interleaved, so that drift of the shared machine hits both sides alike.
  std::vector<double> cpp, capi, one, two;
  for (int run = 0; run < runs; ++run) {
    cpp.push_back(run_cpp(gsp));
    capi.push_back(run_capi(gsp));
  }
  print_figure(kBench, "capi_vs_cpp/gsp/page=16", "requests_per_s", requests / median(capi), "requests/s",
               "cpp_engine_requests_per_s", requests / median(cpp));

  for (int run = 0; run < runs; ++run) {
    one.push_back(run_threads(gsp, 1));
    two.push_back(run_threads(gsp, 2));
  }
  print_figure(kBench, "threads/gsp/page=16", "requests_per_s_2_threads", requests / median(two), "requests/s",
               "requests_per_s_1_thread", requests / median(one));

  // The lock's spin count: the rounds interleave every count, so that the
  // shared machine's drift hits each alike. 4 threads on 2 cores is where a
  // spinning waiter can take the core its lock's holder needs.
  const int spin_rounds = smoke ? 1 : 9, passes = smoke ? 2 : 16;
  const std::vector<int> spin_counts = {0, 64, clm::detail::kDefaultSpinsBeforeSleep, 4000, 16000};
  for (int threads : {2, 4}) {
    std::vector<std::vector<double>> wall(spin_counts.size()), cpu(spin_counts.size());
    for (int round = 0; round < spin_rounds; ++round) {
      for (std::size_t k = 0; k < spin_counts.size(); ++k) {
        const SpinRun r = run_spins(gsp, threads, spin_counts[k], passes);
        wall[k].push_back(r.wall_s);
        cpu[k].push_back(r.cpu_s);
      }
    }
    const auto base = static_cast<std::size_t>(
        std::find(spin_counts.begin(), spin_counts.end(), clm::detail::kDefaultSpinsBeforeSleep) - spin_counts.begin());
    const double total = requests * passes;
    for (std::size_t k = 0; k < spin_counts.size(); ++k) {
      const std::string name = fmt::format("spin/{}_threads/spins={}", threads, spin_counts[k]);
      print_figure(kBench, name, "requests_per_s", total / median(wall[k]), "requests/s",
                   fmt::format("requests_per_s_spins={}", spin_counts[base]), total / median(wall[base]));
      print_figure(kBench, name, "cpu_us_per_request", 1e6 * median(cpu[k]) / total, "us",
                   fmt::format("cpu_us_per_request_spins={}", spin_counts[base]), 1e6 * median(cpu[base]) / total);
    }
  }

  for (const std::size_t tokens : {std::size_t{2048}, std::size_t{32768}}) {
    const clm_bench::PairedMedians us = admit_cached_us(tokens, smoke ? 1 : 15, smoke ? 10 : 300);
    print_figure(kBench, fmt::format("admit_cached/{}_tokens/page=16", tokens), "us_per_admit", us.part, "us",
                 "tree_match_lock_unlock_us", us.baseline);
  }
  return 0;
}
