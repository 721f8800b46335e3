// tests/events/kv_events_workload.hpp: what the KV-event tests
// (test_kv_events) and kv_events_driver (for the Python subscriber) share:
// an Engine whose pool is small enough to evict into a host tier written
// back to, with events on, and a random workload over it (four system
// prompts, three tenants, two adapters, some requests aborted).
//
//   clm::EngineConfig config = clm_test::kv_events_config("m", "tcp://127.0.0.1:*", "");
//   std::vector<clm_test::FinishedPrompt> finished;
//   CLM_RETURN_IF_ERROR(clm_test::run_kv_events_workload(*engine, rng, 300, finished));
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "clm/engine.hpp"
#include "test_random.hpp"

namespace clm_test {

inline constexpr std::int32_t kEventsPageSize = 4;

inline clm::EngineConfig kv_events_config(const std::string& model_id, const std::string& endpoint,
                                          const std::string& replay_endpoint) {
  clm::EngineConfig config;
  config.pool.num_pages = 48;
  config.pool.page_size = kEventsPageSize;
  config.pool.num_layers = 1;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.dtype = clm::KvDType::f32;
  config.tiers.host_pages = 64;
  config.tiers.write_policy = clm::WritePolicy::write_back;
  config.model_id = model_id;
  config.kv_events.enabled = true;
  config.kv_events.endpoint = endpoint;
  config.kv_events.replay_endpoint = replay_endpoint;
  config.kv_events.batch_interval_ms = 2;
  config.kv_events.max_batch_events = 16;
  return config;
}

// A prompt the workload finished (cached), with its namespace.
struct FinishedPrompt {
  std::vector<std::int32_t> tokens;
  std::string salt;
  std::int32_t adapter = 0;
};

// `requests` admissions, each finished (7 in 8) or aborted; then the tiers'
// copies are waited for. The first status an engine call fails with, but
// out_of_memory (an admission the pool cannot take: skipped).
inline clm::Status run_kv_events_workload(clm::Engine& engine, std::mt19937& rng, int requests,
                                          std::vector<FinishedPrompt>& finished) {
  std::vector<std::vector<std::int32_t>> systems;
  for (int i = 0; i < 4; ++i) systems.push_back(random_tokens(rng, 8 + rng() % 24, 5000));
  const char* salts[] = {"", "tenant-b", "tenant-c"};
  for (int r = 0; r < requests; ++r) {
    FinishedPrompt f;
    f.tokens = systems[rng() % systems.size()];
    const auto tail = random_tokens(rng, 1 + rng() % 20, 5000);
    f.tokens.insert(f.tokens.end(), tail.begin(), tail.end());
    f.salt = salts[rng() % 3];
    f.adapter = static_cast<std::int32_t>(rng() % 2);
    clm::Admission a;
    const clm::Status s = engine.admit(f.tokens, {.cache_salt = f.salt, .adapter_id = f.adapter}, a);
    if (s.code() == clm::StatusCode::out_of_memory) continue;
    CLM_RETURN_IF_ERROR(s);
    if (rng() % 8 == 0) {
      CLM_RETURN_IF_ERROR(engine.abort(a.seq));
    } else {
      CLM_RETURN_IF_ERROR(engine.finish(a.seq));
      finished.push_back(std::move(f));
    }
  }
  engine.wait_for_tiers();
  return {};
}

}  // namespace clm_test
