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
#include "events/kv_events_workload.hpp"

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
  clm::EngineConfig config = clm_test::kv_events_config("driver-model", argv[1], argv[2]);
  config.kv_events.topic = "kv@driver@driver-model";
  std::unique_ptr<clm::Engine> engine;
  if (const clm::Status s = clm::Engine::create(config, engine); !s.ok()) return fail("create", s);
  std::cout << "{\"endpoint\": \"" << engine->kv_events_endpoint() << "\", \"replay\": \""
            << engine->kv_events_replay_endpoint() << "\"}" << std::endl;

  std::string line;
  if (!std::getline(std::cin, line)) return 0;
  std::mt19937 rng(static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10)));
  const int requests = std::atoi(argv[4]);
  std::vector<clm_test::FinishedPrompt> finished;
  if (const clm::Status s = clm_test::run_kv_events_workload(*engine, rng, requests, finished); !s.ok()) {
    return fail("workload", s);
  }
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
