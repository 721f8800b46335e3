// clm/engine/engine_config.hpp: EngineConfig, everything an Engine is set up
// from in one struct: the KV pool, the eviction policy and its parameters,
// the CLM parts, the snapshot store and the tiers. Engine::create checks it
// (engine.hpp, which includes this header, has the whole lifecycle):
//
//   clm::EngineConfig config;
//   config.pool.num_pages = 65536; config.pool.page_size = 16;
//   config.pool.num_layers = 32; config.pool.kv_heads = 8; config.pool.head_dim = 128;
//   config.eviction_policy = clm::EvictionPolicy::ghost_slru;
//   std::unique_ptr<clm::Engine> engine;
//   CLM_RETURN_IF_ERROR(clm::Engine::create(config, engine));
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "clm/cache/divergence.hpp"
#include "clm/cache/eviction_policy.hpp"
#include "clm/cache/paged_kv_pool.hpp"
#include "clm/engine/clm_watch.hpp"
#include "clm/events/kv_events_config.hpp"
#include "clm/model/src_gate.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/tiers/tier_config.hpp"

namespace clm {

struct EngineConfig {
  PagedKvPoolConfig pool;
  EvictionPolicy eviction_policy = EvictionPolicy::lru;
  double slru_protected_fraction = kDefaultSlruProtectedFraction;
  // ghost_slru (eviction_policy.hpp): its protected segment, a fraction of the
  // pool in [0, 1], and how many pool capacities of evicted prefixes its ghost
  // remembers, in [0, 64] (0: none, then it is SLRU with a large segment).
  double ghost_slru_protected_fraction = kDefaultGhostSlruProtectedFraction;
  double ghost_slru_memory = kDefaultGhostMemory;
  // CLM suffix reuse (docs/clm.md): when an SRC score means "inject", and the
  // token ids (e.g. <|eot_id|>) left out of the SRC head's mean.
  SrcGateConfig src_gate;
  std::vector<std::int32_t> special_token_ids;
  // The semantic snapshot store (store/snapshot_store.hpp): the Engine opens
  // and owns it when snapshot_store.path is set (":memory:" for tests).
  SnapshotStoreConfig snapshot_store;
  // The tiered KV cache (tiers/tier_config.hpp): a host tier when
  // tiers.host_pages > 0, and a storage tier when tiers.storage_url is set.
  TierConfig tiers;
  // The host's fingerprint of its model (weights + config), e.g. the SHA-256
  // of the weights file: hashed into every stored page's key and written in
  // its header, so that no other model is ever served these pages. Required
  // with a storage tier (up to 4096 bytes); change it whenever the weights
  // change, even in place.
  std::string model_id;
  // KV events for cache-aware routers (events/kv_events_config.hpp,
  // docs/fleet.md): every page the pool or the host tier takes or gives up,
  // published over ZeroMQ as vLLM does. Off by default; needs model_id (the
  // block hashes name the model).
  KvEventsConfig kv_events;
  // Pinned prefixes (Engine::pin_prefix): at most this share of the pool's
  // pages pinned at once (0 disables pins), each for at most max_pin_ttl.
  double pin_budget_fraction = 0.25;
  std::chrono::milliseconds max_pin_ttl{std::chrono::hours(24)};  // (and of priority hints)
  // Priorities that expire (Engine::hint_prefix): at most this many held.
  std::int32_t max_priority_hints = 4096;
  // Where prompts split off the cached paths (cache/divergence.hpp,
  // Engine::divergence_report): on by default, bounded memory.
  DivergenceConfig divergence;
  // What an operator watches of CLM (engine/clm_watch.hpp): keys seen often
  // with a low SRC score, the store's blacklists, versions and drift; on by
  // default, as JSON lines through clm_watch.on_line when set.
  ClmWatchConfig clm_watch;
};

}  // namespace clm
