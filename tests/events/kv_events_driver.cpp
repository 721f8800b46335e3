// tests/events/kv_events_driver.cpp: an Engine with KV events on, driven by
// kv_events_subscriber.py. It prints {"endpoint", "replay"} (one JSON line),
// waits for a line on stdin, runs a random workload (evictions, host-tier
// moves, three tenants, two adapters), flushes, prints {"gpu": [...],
// "cpu": [...]} (the engine's own block lists, one JSON line), and keeps
// serving replays until stdin closes.
//
//   kv_events_driver ENDPOINT REPLAY_ENDPOINT SEED REQUESTS
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "clm/engine.hpp"
#include "test_random.hpp"

namespace {

int fail(const std::string& what, const clm::Status& s) {
  std::cerr << "kv_events_driver: " << what << ": " << s.message() << "\n";
  return 1;
}

void print_list(const char* name, const std::vector<std::uint64_t>& blocks, bool last) {
  std::cout << "\"" << name << "\": [";
  for (std::size_t i = 0; i < blocks.size(); ++i) std::cout << (i ? ", " : "") << blocks[i];
  std::cout << "]" << (last ? "" : ", ");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: kv_events_driver ENDPOINT REPLAY_ENDPOINT SEED REQUESTS\n";
    return 2;
  }
  clm::EngineConfig config;
  config.pool.num_pages = 48;
  config.pool.page_size = 4;
  config.pool.num_layers = 1;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.dtype = clm::KvDType::f32;
  config.tiers.host_pages = 64;
  config.tiers.write_policy = clm::WritePolicy::write_back;
  config.model_id = "driver-model";
  config.kv_events.enabled = true;
  config.kv_events.endpoint = argv[1];
  config.kv_events.replay_endpoint = argv[2];
  config.kv_events.topic = "kv@driver@driver-model";
  config.kv_events.batch_interval_ms = 2;
  config.kv_events.max_batch_events = 16;
  std::unique_ptr<clm::Engine> engine;
  if (const clm::Status s = clm::Engine::create(config, engine); !s.ok()) return fail("create", s);
  std::cout << "{\"endpoint\": \"" << engine->kv_events_endpoint() << "\", \"replay\": \""
            << engine->kv_events_replay_endpoint() << "\"}" << std::endl;

  std::string line;
  if (!std::getline(std::cin, line)) return 0;
  std::mt19937 rng(static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10)));
  const int requests = std::atoi(argv[4]);
  std::vector<std::vector<std::int32_t>> systems;
  for (int i = 0; i < 4; ++i) systems.push_back(clm_test::random_tokens(rng, 8 + rng() % 24, 5000));
  const char* salts[] = {"", "tenant-b", "tenant-c"};
  for (int r = 0; r < requests; ++r) {
    std::vector<std::int32_t> prompt = systems[rng() % systems.size()];
    const auto tail = clm_test::random_tokens(rng, 1 + rng() % 20, 5000);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    clm::Admission a;
    const clm::Status s =
        engine->admit(prompt, {.cache_salt = salts[rng() % 3], .adapter_id = static_cast<std::int32_t>(rng() % 2)}, a);
    if (s.code() == clm::StatusCode::out_of_memory) continue;
    if (!s.ok()) return fail("admit", s);
    if (const clm::Status f = rng() % 8 ? engine->finish(a.seq) : engine->abort(a.seq); !f.ok()) return fail("end", f);
  }
  engine->wait_for_tiers();
  if (const clm::Status s = engine->flush_kv_events(std::chrono::seconds(20)); !s.ok()) return fail("flush", s);
  std::vector<std::uint64_t> gpu, cpu;
  if (const clm::Status s = engine->kv_event_blocks(clm::KvMedium::gpu, gpu); !s.ok()) return fail("blocks", s);
  if (const clm::Status s = engine->kv_event_blocks(clm::KvMedium::cpu, cpu); !s.ok()) return fail("blocks", s);
  const clm::EngineMetrics m = engine->metrics();
  std::cout << "{";
  print_list("gpu", gpu, false);
  print_list("cpu", cpu, false);
  std::cout << "\"batches\": " << m.kv_events.published_batches << ", \"evictions\": " << m.cache.evictions
            << ", \"loaded_pages\": " << m.tiers.loaded_pages << "}" << std::endl;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
