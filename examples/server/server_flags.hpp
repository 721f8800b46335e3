// examples/server/server_flags.hpp: clm_server's flags (grouped in --help)
// and the engine configuration they make, from the command line and from
// one --server-config JSON file (its keys are the flags' names without the
// dashes; the command line wins over the file).
//
//   clm_server::ServerFlags flags;
//   if (std::string error = clm_server::parse_server_flags(argc, argv, flags); !error.empty()) fail(error);
//   if (flags.help) { std::fputs(clm_server::server_usage().c_str(), stdout); return 0; }
//   clm::EngineConfig config = clm_server::engine_config_from(flags, pool);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "clm/engine.hpp"

namespace clm_server {

struct ServerFlags {
  bool help = false;
  // The server.
  int port = 8000;
  int http_threads = 16;
  std::int32_t max_batch = 32;
  std::int32_t default_max_tokens = 256;
  std::int64_t max_body_bytes = 1 << 20;
  std::string served_model_name = "tiny-llama";  // what GET /v1/models lists
  std::string host = "127.0.0.1";
  std::string tls_cert, tls_key;
  double request_timeout_s = 600, max_request_timeout_s = 3600, body_timeout_s = 30, header_timeout_s = 10;
  double drain_grace_s = 30;
  std::int64_t max_waiting = 256;
  int max_pending_connections = 64;
  // Tenants.
  std::string api_keys;  // the keys file; empty: no keys
  bool trust_x_tenant = false;
  // The model.
  std::string weights, config;
  std::string tokenizer;  // a Hugging Face tokenizer.json; empty: the byte tokenizer
  int threads = 0;        // the model's compute threads; 0 = the hardware's
  std::string model_id;
  // The cache.
  std::int32_t page_size = 16;
  std::int64_t pool_tokens = 32768;
  clm::EvictionPolicy eviction_policy = clm::EvictionPolicy::ghost_slru;  // the one that honours hints
  bool prefix_cache = true;  // off: every request computed afresh, nothing published (the baseline)
  bool divergence = true;    // where prompts split off the cache (GET /debug/cache)
  double pin_budget_fraction = 0.25;
  double hint_ttl_s = 120;  // X-Session-Continues: the conversation's priority lasts this long  // of the pool, for
                            // prompt_cache_retention and cache_control pins
  // The tiers.
  std::int64_t host_tokens = 0;  // 0: no host tier
  clm::WritePolicy write_policy = clm::WritePolicy::write_through;
  clm::PrefetchPolicy prefetch_policy = clm::PrefetchPolicy::timeout;
  std::string storage_url, page_secret_file, page_secret_env;
  // The snapshot store and CLM in the loop.
  std::string snapshot_store;  // its SQLite file; empty: none
  std::int64_t snapshot_min_usage = 50;
  std::string lexicons;                // the suffix keyer's domain words (a folder of lexicon files)
  std::string clm_events;              // a JSON-lines file the CLM watch's events are appended to; empty: none
  std::string clm_dir;                 // trained parts (head, projection, adapter .safetensors); needs --snapshot-store
  std::optional<float> src_threshold;  // the SRC gate's threshold, over the head's own
  // KV events for a cache-aware router.
  clm::KvEventsConfig kv_events;  // enabled by --kv-events
};

// Reads --server-config FILE first (anywhere on the line), then the other
// flags. An empty string, or what is wrong (naming the flag or the file's key).
std::string parse_server_flags(int argc, char** argv, ServerFlags& flags);

// --help: every flag, grouped (server, model, cache, tiers, KV events).
std::string server_usage();

// The engine the flags ask for, over `pool` (the model's page layout).
clm::EngineConfig engine_config_from(const ServerFlags& flags, const clm::PagedKvPoolConfig& pool);

}  // namespace clm_server
