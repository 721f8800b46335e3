// bench_divergence: what divergence counting (clm/cache/divergence.hpp: branch
// points, hits past them, the match-depth histogram) costs the prefix cache,
// on the gsp workload (workloads.md: 64 groups of 16 prompts, a 2048-token
// system prompt each, so every prompt splits off after its system prompt):
//
//   divergence/tree_gsp    requests/s of the gsp replay on a bare RadixTree
//                          (examples/replay's plain path), counting on,
//                          against counting off in the same run
//   divergence/engine_gsp  requests/s of gsp through an Engine (admit, extend,
//                          finish; a pool of an eighth of what gsp writes, so
//                          it evicts), warm (it replayed gsp once under another
//                          tenant), counting on against off
//
// Each figure is the median of pairs whose order alternates (on first, then
// off first). CLM_BENCH_SMOKE=1: a short gsp, one pair each.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "clm/engine.hpp"
#include "engine_replay.hpp"
#include "replay_driver.hpp"
#include "workload.hpp"

namespace {

using clm_bench::Clock;
using clm_bench::die;
using clm_bench::median;
using clm_bench::print_figure;
using clm_bench::replay_pass;
using clm_bench::seconds_since;

constexpr std::int32_t kPageSize = 16;

double tree_requests_per_s(const clm::replay::Workload& w, bool divergence, int repeat) {
  clm::replay::ReplayConfig config;
  config.page_size = kPageSize;
  config.capacity_tokens = 1 << 20;
  config.divergence = divergence;
  clm::replay::ReplayResult r;
  if (const clm::Status s = clm::replay::run_replays(w, config, repeat, r); !s.ok()) die(s.message());
  if (divergence && r.diverged_lookups == 0) die("gsp split off nowhere with divergence counting on");
  return r.requests_per_s();
}

double engine_requests_per_s(const clm::replay::Workload& w, bool divergence, std::int32_t pages) {
  clm::EngineConfig c;
  c.pool.num_pages = pages;
  c.pool.page_size = kPageSize;
  c.pool.memory = clm::MemoryKind::none;
  c.divergence.enabled = divergence;
  std::unique_ptr<clm::Engine> engine;
  if (const clm::Status s = clm::Engine::create(c, engine); !s.ok()) die(s.message());
  replay_pass(*engine, w, "warm-up", "bench");
  const auto start = Clock::now();
  replay_pass(*engine, w, "", "bench");
  const double wall = seconds_since(start);
  if (divergence && engine->metrics().cache.diverged_matches == 0) die("no lookup split off");
  return static_cast<double>(w.requests.size()) / wall;
}

template <class Run>
void pairs(const char* what, int count, Run run, std::vector<double>& on, std::vector<double>& off) {
  for (int i = 0; i < 2 * count; ++i) {
    const bool on_first = i % 2 == 0;
    const double first = run(on_first);
    const double second = run(!on_first);
    on.push_back(on_first ? first : second);
    off.push_back(on_first ? second : first);
    std::fprintf(stderr, "bench_divergence: %s pair %d of %d: %.0f requests/s counting, %.0f not\n", what, i + 1,
                 2 * count, on.back(), off.back());
  }
}

}  // namespace

int main() {
  const bool smoke = clm_bench::smoke_run();
  const clm::replay::Workload gsp = clm_bench::bench_gsp(smoke);
  const std::int32_t pages = clm_bench::eighth_pool_pages(gsp, kPageSize);
  const int count = smoke ? 1 : 15;

  std::vector<double> on, off;
  pairs(
      "tree", count, [&](bool divergence) { return tree_requests_per_s(gsp, divergence, smoke ? 1 : 5); }, on, off);
  print_figure("divergence", fmt::format("tree_gsp/page={}", kPageSize), "requests_per_s", median(on), "requests/s",
               "requests_per_s_divergence_off", median(off));
  on.clear();
  off.clear();
  pairs(
      "engine", count, [&](bool divergence) { return engine_requests_per_s(gsp, divergence, pages); }, on, off);
  print_figure("divergence", fmt::format("engine_gsp/page={}/pool={}", kPageSize, pages), "requests_per_s", median(on),
               "requests/s", "requests_per_s_divergence_off", median(off));
  return 0;
}
