// tests/bench/engine_replay.hpp: a replay workload's requests through an
// Engine, one after another (admit, extend by the output, finish), what the
// benches that time an Engine on gsp share (bench_events, bench_divergence),
// with that workload and the pool they size for it.
//
//   clm_bench::replay_pass(*engine, gsp, "tenant-salt", "tenant-name");
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "bench_common.hpp"
#include "clm/engine.hpp"
#include "workload.hpp"

namespace clm_bench {

// Every request of `w` under one salt (and tenant name): a request the pool
// cannot hold is skipped; any other failure ends the bench. Then waits for
// the tiers' copies, so that the next pass starts from a settled engine.
inline void replay_pass(clm::Engine& engine, const clm::replay::Workload& w, std::string_view salt,
                        std::string_view tenant = {}) {
  clm::Admission a;
  std::vector<std::int64_t> slots;
  for (const clm::replay::Request& r : w.requests) {
    const auto all = w.prompt_and_output(r);
    clm::Status s = engine.admit(w.prompt(r), {.cache_salt = salt, .tenant = tenant}, a);
    if (s.code() == clm::StatusCode::out_of_memory) continue;
    if (s.ok()) s = engine.extend(a.seq, all.subspan(static_cast<std::size_t>(r.prompt_tokens)), slots);
    if (s.ok()) s = engine.finish(a.seq);
    if (!s.ok()) die(s.message());
  }
  engine.wait_for_tiers();
}

// The gsp workload of the Engine benches (4 groups in a smoke run).
inline clm::replay::Workload bench_gsp(bool smoke) {
  clm::replay::GspParams params;
  if (smoke) params.groups = 4;
  return clm::replay::generate_gsp(params);
}

// A pool of an eighth of what `w` writes (prompts and outputs), at least 256
// pages: a replay of it evicts from its first minutes on.
inline std::int32_t eighth_pool_pages(const clm::replay::Workload& w, std::int32_t page_size) {
  std::uint64_t tokens = 0;
  for (const auto& r : w.requests) tokens += static_cast<std::uint64_t>(r.prompt_tokens + r.output_tokens);
  return static_cast<std::int32_t>(std::max<std::uint64_t>(256, tokens / static_cast<std::uint64_t>(page_size) / 8));
}

}  // namespace clm_bench
