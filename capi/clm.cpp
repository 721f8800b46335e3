// capi/clm.cpp: the extern "C" layer over clm::Engine. It only converts:
// checks pointers and struct sizes, copies arrays, turns a clm::Status into a
// clm_status plus the thread-local message, and never lets an exception out.
#include "clm.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/engine.hpp"
#if CLM_HAVE_CUDA
#include "clm/device/cuda_clm.hpp"
#endif

#include "capi_internal.hpp"

using namespace clm_capi;

extern "C" {

int clm_version(void) { return CLM_VERSION_NUMBER; }

const char* clm_version_string(void) {
#define CLM_STR2(x) #x
#define CLM_STR(x) CLM_STR2(x)
  return CLM_STR(CLM_VERSION_MAJOR) "." CLM_STR(CLM_VERSION_MINOR) "." CLM_STR(CLM_VERSION_PATCH);
}

const char* clm_status_name(clm_status status) {
  if (status > 0 || status < CLM_ERR_IO) return "unknown";
  return clm::status_code_name(static_cast<clm::StatusCode>(status));
}

const char* clm_last_error(void) { return clm_capi::last_error_message().c_str(); }

namespace {
clm_engine_options default_engine_options() {
  const clm::EngineConfig defaults;
  clm_engine_options o{};
  o.struct_size = sizeof o;
  o.num_pages = 0;
  o.page_size = defaults.pool.page_size;
  o.num_layers = defaults.pool.num_layers;
  o.kv_heads = defaults.pool.kv_heads;
  o.head_dim = defaults.pool.head_dim;
  o.kv_dtype = static_cast<int32_t>(defaults.pool.dtype);
  o.memory = static_cast<int32_t>(defaults.pool.memory);
  o.device = defaults.pool.device;
  o.eviction_policy = static_cast<int32_t>(defaults.eviction_policy);
  o.slru_protected_fraction = defaults.slru_protected_fraction;
  o.src_daily_requests = defaults.src_gate.daily_requests;
  o.src_threshold = defaults.src_gate.threshold_override;
  o.src_breaker_score = defaults.src_gate.breaker_score;
  o.src_breaker_steps = defaults.src_gate.breaker_steps;
  o.special_token_ids = nullptr;
  o.n_special_token_ids = 0;
  const clm::SnapshotStoreConfig& store = defaults.snapshot_store;
  o.snapshot_store_path = nullptr;
  o.snapshot_store_shards = store.num_shards;
  o.snapshot_dim = store.snapshot_dim;
  o.snapshot_min_usage = store.min_usage_threshold;
  o.snapshot_version_cosine = store.version_cosine;
  o.snapshot_similarity_floor = store.similarity_floor;
  o.snapshot_ann_ef_search = store.ann_ef_search;
  o.snapshot_lookup_timeout_us = store.lookup_timeout_us;
  o.snapshot_read_only = store.read_only ? 1 : 0;
  o.snapshot_maintenance_interval_ms = store.maintenance_interval_ms;
  const clm::TierConfig& tiers = defaults.tiers;
  o.host_pages = tiers.host_pages;
  o.write_policy = static_cast<int32_t>(tiers.write_policy);
  o.storage_url = nullptr;
  o.prefetch_policy = static_cast<int32_t>(tiers.prefetch_policy);
  o.prefetch_timeout_ms = tiers.prefetch_timeout_ms;
  o.prefetch_timeout_per_1k_tokens_ms = tiers.prefetch_timeout_per_1k_tokens_ms;
  o.storage_workers = tiers.storage_workers;
  o.storage_batch_pages = tiers.storage_batch_pages;
  o.model_id = nullptr;
  o.page_secret_file = nullptr;
  o.page_secret_env = nullptr;
  o.max_queued_fetches = tiers.max_queued_fetches;
  o.breaker_failures = tiers.breaker_failures;
  o.admission_deadline_ms = tiers.admission_deadline_ms;
  o.breaker_open_ms = tiers.breaker_open_ms;
  const clm::KvEventsConfig& events = defaults.kv_events;
  o.kv_events = events.enabled ? 1 : 0;
  o.kv_events_bind = static_cast<int32_t>(events.bind);
  o.kv_events_endpoint = nullptr;
  o.kv_events_replay_endpoint = nullptr;
  o.kv_events_topic = nullptr;
  o.kv_events_callback = nullptr;
  o.kv_events_callback_data = nullptr;
  o.kv_events_layout = static_cast<int32_t>(events.layout);
  o.kv_events_batch_interval_ms = events.batch_interval_ms;
  o.kv_events_max_batch_events = events.max_batch_events;
  o.kv_events_queue_events = events.queue_events;
  o.kv_events_buffer_batches = events.buffer_batches;
  o.kv_events_send_hwm = events.send_hwm;
  o.kv_events_data_parallel_rank = events.data_parallel_rank;
  o.kv_events_token_ids = events.token_ids ? 1 : 0;
  const clm::DivergenceConfig& divergence = defaults.divergence;
  o.divergence = divergence.enabled ? 1 : 0;
  o.divergence_branch_points = divergence.branch_points;
  o.divergence_window_ms = static_cast<int32_t>(divergence.window_ms);
  o.divergence_context_tokens = divergence.context_tokens;
  const clm::ClmWatchConfig& watch = defaults.clm_watch;
  o.clm_watch = watch.enabled ? 1 : 0;
  o.clm_watch_max_keys = watch.max_keys;
  o.clm_watch_window_ms = watch.window_ms;
  o.clm_watch_min_sightings = watch.min_sightings;
  o.clm_watch_low_src = watch.low_src;
  o.clm_watch_max_events = watch.max_events;
  o.clm_watch_callback = nullptr;
  o.clm_watch_callback_data = nullptr;
  return o;
}

constexpr std::size_t kMaxStorePathBytes = 4096;   // PATH_MAX on Linux
constexpr std::size_t kMaxModelIdBytes = 4096;     // a model id, a secret file's path, a variable's name
constexpr std::size_t kMaxStorageUrlBytes = 8192;  // a path and a few options
}  // namespace

clm_status clm_engine_options_init(clm_engine_options* options, size_t struct_size) {
  if (!options) return null_argument("clm_engine_options_init", "options");
  if (clm_status s = check_struct_size<clm_engine_options>(
          struct_size,
          {kEngineOptionsV1, kEngineOptionsV2, kEngineOptionsV3, kEngineOptionsV4, kEngineOptionsV5, kEngineOptionsV6,
           kEngineOptionsV7, kEngineOptionsV8},
          "clm_engine_options_init")) {
    return s;
  }
  clm_engine_options defaults = default_engine_options();
  defaults.struct_size = static_cast<uint32_t>(struct_size);
  std::memcpy(options, &defaults, struct_size);  // only the fields the caller's version has
  return CLM_OK;
}

clm_status clm_engine_create(clm_engine** out, const clm_engine_options* options) {
  return guarded([&]() -> clm_status {
    if (!out) return null_argument("clm_engine_create", "out");
    *out = nullptr;
    if (!options) return null_argument("clm_engine_create", "options (num_pages has no default)");
    if (clm_status s = check_struct_size<clm_engine_options>(
            options->struct_size,
            {kEngineOptionsV1, kEngineOptionsV2, kEngineOptionsV3, kEngineOptionsV4, kEngineOptionsV5, kEngineOptionsV6,
             kEngineOptionsV7, kEngineOptionsV8},
            "clm_engine_create")) {
      return s;
    }
    const clm_engine_options widened = widen(options, options->struct_size, default_engine_options());
    options = &widened;
    if (options->kv_dtype < CLM_KV_F32 || options->kv_dtype > CLM_KV_BF16) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("clm_engine_create: unknown kv_dtype {}", options->kv_dtype));
    }
    if (options->memory < CLM_MEMORY_NONE || options->memory > CLM_MEMORY_DEVICE) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("clm_engine_create: unknown memory {}", options->memory));
    }
    // 5 is clm::EvictionPolicy::belady, which has no CLM_EVICT_* name: it needs
    // every future request, so only the replay tool can run it.
    if (options->eviction_policy == static_cast<int32_t>(clm::EvictionPolicy::belady)) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  "clm_engine_create: eviction_policy 5 (belady) is an offline reference that needs every future "
                  "request: only the replay tool (examples/replay, --policy belady) can run it");
    }
    if (options->eviction_policy < CLM_EVICT_LRU || options->eviction_policy > CLM_EVICT_GHOST_SLRU) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: unknown eviction_policy {}", options->eviction_policy));
    }
    clm::EngineConfig config;
    config.pool.num_pages = options->num_pages;
    config.pool.page_size = options->page_size;
    config.pool.num_layers = options->num_layers;
    config.pool.kv_heads = options->kv_heads;
    config.pool.head_dim = options->head_dim;
    config.pool.dtype = static_cast<clm::KvDType>(options->kv_dtype);
    config.pool.memory = static_cast<clm::MemoryKind>(options->memory);
    config.pool.device = options->device;
    config.eviction_policy = static_cast<clm::EvictionPolicy>(options->eviction_policy);
    config.slru_protected_fraction = options->slru_protected_fraction;
    config.src_gate.daily_requests = options->src_daily_requests;
    config.src_gate.threshold_override = options->src_threshold;
    config.src_gate.breaker_score = options->src_breaker_score;
    config.src_gate.breaker_steps = options->src_breaker_steps;
    if (!options->special_token_ids && options->n_special_token_ids > 0) {
      return null_argument("clm_engine_create", "options->special_token_ids (with n_special_token_ids > 0)");
    }
    if (options->n_special_token_ids > (std::size_t{1} << 20)) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: n_special_token_ids {} is too large", options->n_special_token_ids));
    }
    if (options->n_special_token_ids > 0) {
      config.special_token_ids.assign(options->special_token_ids,
                                      options->special_token_ids + options->n_special_token_ids);
    }
    if (options->snapshot_store_path) {  // NULL or "": no store (the store checks the rest of its settings)
      const std::size_t n = strnlen(options->snapshot_store_path, kMaxStorePathBytes + 1);
      if (n > kMaxStorePathBytes) {
        return fail(CLM_ERR_INVALID_ARGUMENT,
                    fmt::format("clm_engine_create: snapshot_store_path is longer than {} bytes", kMaxStorePathBytes));
      }
      config.snapshot_store.path.assign(options->snapshot_store_path, n);
    }
    config.snapshot_store.num_shards = options->snapshot_store_shards;
    config.snapshot_store.snapshot_dim = options->snapshot_dim;
    config.snapshot_store.min_usage_threshold = options->snapshot_min_usage;
    config.snapshot_store.version_cosine = options->snapshot_version_cosine;
    config.snapshot_store.similarity_floor = options->snapshot_similarity_floor;
    config.snapshot_store.ann_ef_search = options->snapshot_ann_ef_search;
    config.snapshot_store.lookup_timeout_us = options->snapshot_lookup_timeout_us;
    if (options->snapshot_read_only != 0 && options->snapshot_read_only != 1) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: snapshot_read_only is {} (0 or 1)", options->snapshot_read_only));
    }
    config.snapshot_store.read_only = options->snapshot_read_only == 1;
    config.snapshot_store.maintenance_interval_ms = options->snapshot_maintenance_interval_ms;
    if (options->write_policy < CLM_WRITE_THROUGH || options->write_policy > CLM_WRITE_BACK) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: unknown write_policy {}", options->write_policy));
    }
    if (options->prefetch_policy < CLM_PREFETCH_BEST_EFFORT || options->prefetch_policy > CLM_PREFETCH_TIMEOUT) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: unknown prefetch_policy {}", options->prefetch_policy));
    }
    config.tiers.host_pages = options->host_pages;
    config.tiers.write_policy = static_cast<clm::WritePolicy>(options->write_policy);
    if (options->storage_url) {  // NULL or "": no storage tier (the tiers check the rest)
      const std::size_t n = strnlen(options->storage_url, kMaxStorageUrlBytes + 1);
      if (n > kMaxStorageUrlBytes) {
        return fail(CLM_ERR_INVALID_ARGUMENT,
                    fmt::format("clm_engine_create: storage_url is longer than {} bytes", kMaxStorageUrlBytes));
      }
      config.tiers.storage_url.assign(options->storage_url, n);
    }
    config.tiers.prefetch_policy = static_cast<clm::PrefetchPolicy>(options->prefetch_policy);
    config.tiers.prefetch_timeout_ms = options->prefetch_timeout_ms;
    config.tiers.prefetch_timeout_per_1k_tokens_ms = options->prefetch_timeout_per_1k_tokens_ms;
    config.tiers.storage_workers = options->storage_workers;
    config.tiers.storage_batch_pages = options->storage_batch_pages;
    config.tiers.max_queued_fetches = options->max_queued_fetches;
    config.tiers.breaker_failures = options->breaker_failures;
    config.tiers.admission_deadline_ms = options->admission_deadline_ms;
    config.tiers.breaker_open_ms = options->breaker_open_ms;
    // NULL or "": none (the engine says when one is needed, and checks the rest).
    const std::pair<const char*, std::string*> strings[] = {{options->model_id, &config.model_id},
                                                            {options->page_secret_file, &config.tiers.page_secret_file},
                                                            {options->page_secret_env, &config.tiers.page_secret_env}};
    const char* const names[] = {"model_id", "page_secret_file", "page_secret_env"};
    for (std::size_t i = 0; i < std::size(strings); ++i) {
      if (!strings[i].first) continue;
      const std::size_t n = strnlen(strings[i].first, kMaxModelIdBytes + 1);
      if (n > kMaxModelIdBytes) {
        return fail(CLM_ERR_INVALID_ARGUMENT,
                    fmt::format("clm_engine_create: {} is longer than {} bytes", names[i], kMaxModelIdBytes));
      }
      strings[i].second->assign(strings[i].first, n);
    }
    if (clm_status s = kv_events_config(*options, config.kv_events)) return s;
    if (options->divergence != 0 && options->divergence != 1) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: divergence is {} (0 or 1)", options->divergence));
    }
    config.divergence.enabled = options->divergence == 1;
    config.divergence.branch_points = options->divergence_branch_points;
    config.divergence.window_ms = options->divergence_window_ms;
    config.divergence.context_tokens = options->divergence_context_tokens;
    if (options->clm_watch != 0 && options->clm_watch != 1) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("clm_engine_create: clm_watch is {} (0 or 1)", options->clm_watch));
    }
    config.clm_watch.enabled = options->clm_watch == 1;
    config.clm_watch.max_keys = options->clm_watch_max_keys;
    config.clm_watch.window_ms = options->clm_watch_window_ms;
    config.clm_watch.min_sightings = options->clm_watch_min_sightings;
    config.clm_watch.low_src = options->clm_watch_low_src;
    config.clm_watch.max_events = options->clm_watch_max_events;
    if (clm_watch_line_callback callback = options->clm_watch_callback) {
      void* data = options->clm_watch_callback_data;
      // A NUL-terminated copy: the library's for the call only.
      config.clm_watch.on_line = [callback, data](std::string_view line) {
        const std::string terminated(line);
        callback(terminated.c_str(), terminated.size(), data);
      };
    }
    auto state = std::make_shared<EngineState>();
    if (clm_status s = report(clm::Engine::create(config, state->engine))) return s;
#if CLM_HAVE_CUDA
    // A pool in device memory: the SRC running sums live on its device too
    // (clm_engine_src_step_device).
    if (config.pool.memory == clm::MemoryKind::device) {
      std::shared_ptr<clm::cuda::CudaSrcSums> sums;
      if (clm_status s = report(clm::cuda::CudaSrcSums::create(config.pool.device, sums))) return s;
      state->engine->set_device_src_sums(std::move(sums));
    }
#endif
    *out = new clm_engine{std::move(state)};
    return CLM_OK;
  });
}

void clm_engine_free(clm_engine* engine) {
  if (!engine) return;
  engine->state->closed = true;
  engine->state->engine->abort_all();
  // Sequence handles may keep the engine alive: the host's KV-event callback
  // must not be called once this returns.
  engine->state->engine->stop_kv_events();
  delete engine;  // the pool's memory goes with the last sequence handle
}

clm_status clm_engine_kv_layout(clm_kv_layout* out, const clm_engine* engine) {
  if (!out) return null_argument("clm_engine_kv_layout", "out");
  if (!engine) return null_argument("clm_engine_kv_layout", "engine");
  if (clm_status s = check_struct_size<clm_kv_layout>(out->struct_size, {kKvLayoutV1}, "clm_engine_kv_layout"))
    return s;
  const clm::PagedKvPool& pool = engine->state->engine->pool();
  const clm::PagedKvPoolConfig& c = pool.config();
  const clm_kv_layout full{out->struct_size,
                           pool.data(),
                           pool.page_bytes(),
                           pool.layer_bytes(),
                           c.num_pages,
                           c.page_size,
                           c.num_layers,
                           c.kv_heads,
                           c.head_dim,
                           static_cast<int32_t>(c.dtype),
                           static_cast<int32_t>(c.memory)};
  std::memcpy(out, &full, out->struct_size);
  return CLM_OK;
}

clm_status clm_admit_options_init(clm_admit_options* options, size_t struct_size) {
  if (!options) return null_argument("clm_admit_options_init", "options");
  if (clm_status s = check_struct_size<clm_admit_options>(struct_size, {kAdmitOptionsV1, kAdmitOptionsV2},
                                                          "clm_admit_options_init")) {
    return s;
  }
  std::memset(options, 0, struct_size);  // every default is zero
  options->struct_size = static_cast<uint32_t>(struct_size);
  return CLM_OK;
}

namespace {
// The caller's admit options (NULL: the defaults) as the Engine's; the salt stays the caller's bytes.
clm_status admit_options_of(const clm_admit_options* options, const char* fn, clm::AdmitOptions& admit) {
  if (!options) return CLM_OK;
  if (clm_status s =
          check_struct_size<clm_admit_options>(options->struct_size, {kAdmitOptionsV1, kAdmitOptionsV2}, fn)) {
    return s;
  }
  const clm_admit_options widened = widen(options, options->struct_size, clm_admit_options{});
  if (!widened.cache_salt && widened.cache_salt_len > 0) {
    return null_argument(fn, "options->cache_salt (with cache_salt_len > 0)");
  }
  if (widened.cache_salt_len > kMaxSaltBytes) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: cache_salt_len {} exceeds {} bytes", fn, widened.cache_salt_len, kMaxSaltBytes));
  }
  if (widened.cache_salt) admit.cache_salt = std::string_view(widened.cache_salt, widened.cache_salt_len);
  admit.adapter_id = widened.adapter_id;
  admit.priority = widened.priority;
  if (!clm::is_priority_update(widened.priority_update)) {
    return fail(
        CLM_ERR_INVALID_ARGUMENT,
        fmt::format("{}: options->priority_update must be CLM_PRIORITY_RAISE (0) or CLM_PRIORITY_SET (1), got {}", fn,
                    widened.priority_update));
  }
  admit.priority_update = static_cast<clm::PriorityUpdate>(widened.priority_update);
  if (!widened.tenant && widened.tenant_len > 0) return null_argument(fn, "options->tenant (with tenant_len > 0)");
  if (widened.tenant_len > kMaxSaltBytes) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: tenant_len {} exceeds {} bytes", fn, widened.tenant_len, kMaxSaltBytes));
  }
  if (widened.tenant) admit.tenant = std::string_view(widened.tenant, widened.tenant_len);
  return CLM_OK;
}

// The prompt and options of clm_engine_admit, _prefetch and _plan_admission:
// checked, and the options as the Engine's.
clm_status prompt_args_of(const int32_t* tokens, size_t n_tokens, const clm_admit_options* options, const char* fn,
                          clm::AdmitOptions& admit) {
  if (!tokens && n_tokens > 0) return null_argument(fn, "tokens (with n_tokens > 0)");
  if (n_tokens > kMaxTokens)
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_tokens {} is too large", fn, n_tokens));
  return admit_options_of(options, fn, admit);
}
}  // namespace

clm_status clm_engine_prefetch(clm_engine* engine, const int32_t* tokens, size_t n_tokens,
                               const clm_admit_options* options) {
  return guarded([&]() -> clm_status {
    if (!engine) return null_argument("clm_engine_prefetch", "engine");
    clm::AdmitOptions admit;
    if (clm_status s = prompt_args_of(tokens, n_tokens, options, "clm_engine_prefetch", admit)) return s;
    return report(engine->state->engine->prefetch({tokens, n_tokens}, admit));
  });
}

clm_status clm_engine_wait_for_tiers(clm_engine* engine) {
  return guarded([&]() -> clm_status {
    if (!engine) return null_argument("clm_engine_wait_for_tiers", "engine");
    engine->state->engine->wait_for_tiers();
    return CLM_OK;
  });
}

clm_status clm_engine_admit(clm_seq** out, clm_engine* engine, const int32_t* tokens, size_t n_tokens,
                            const clm_admit_options* options) {
  return guarded([&]() -> clm_status {
    if (!out) return null_argument("clm_engine_admit", "out");
    *out = nullptr;
    if (!engine) return null_argument("clm_engine_admit", "engine");
    clm::AdmitOptions admit;
    if (clm_status s = prompt_args_of(tokens, n_tokens, options, "clm_engine_admit", admit)) return s;
    auto seq = std::make_unique<clm_seq>();
    seq->state = engine->state;
    if (clm_status s = report(engine->state->engine->admit({tokens, n_tokens}, admit, seq->admission))) return s;
    *out = seq.release();
    return CLM_OK;
  });
}

clm_status clm_engine_pin_prefix(clm_engine* engine, const int32_t* tokens, size_t n_tokens,
                                 const clm_admit_options* options, int64_t ttl_ms, uint64_t* pin_id,
                                 int32_t* pinned_tokens) {
  return guarded([&]() -> clm_status {
    if (!pin_id) return null_argument("clm_engine_pin_prefix", "pin_id");
    *pin_id = 0;
    if (!engine) return null_argument("clm_engine_pin_prefix", "engine");
    clm::AdmitOptions admit;
    if (clm_status s = prompt_args_of(tokens, n_tokens, options, "clm_engine_pin_prefix", admit)) return s;
    clm::PinResult pin;
    if (clm_status s = report(
            engine->state->engine->pin_prefix({tokens, n_tokens}, admit, std::chrono::milliseconds(ttl_ms), pin))) {
      return s;
    }
    *pin_id = pin.pin;
    if (pinned_tokens) *pinned_tokens = pin.pinned_tokens;
    return CLM_OK;
  });
}

clm_status clm_engine_hint_prefix(clm_engine* engine, const char* key, size_t key_len, const int32_t* tokens,
                                  size_t n_tokens, const clm_admit_options* options, int32_t priority, int64_t ttl_ms,
                                  int32_t* reached_tokens) {
  return guarded([&]() -> clm_status {
    if (!engine) return null_argument("clm_engine_hint_prefix", "engine");
    if (!key && key_len > 0) return null_argument("clm_engine_hint_prefix", "key (with key_len > 0)");
    clm::AdmitOptions admit;
    if (clm_status s = prompt_args_of(tokens, n_tokens, options, "clm_engine_hint_prefix", admit)) return s;
    std::int32_t reached = 0;
    if (clm_status s =
            report(engine->state->engine->hint_prefix(std::string_view(key ? key : "", key_len), {tokens, n_tokens},
                                                      admit, priority, std::chrono::milliseconds(ttl_ms), reached))) {
      return s;
    }
    if (reached_tokens) *reached_tokens = reached;
    return CLM_OK;
  });
}

clm_status clm_engine_unpin(clm_engine* engine, uint64_t pin_id) {
  return guarded([&]() -> clm_status {
    if (!engine) return null_argument("clm_engine_unpin", "engine");
    return report(engine->state->engine->unpin(pin_id));
  });
}

clm_status clm_engine_plan_admission(clm_admission_plan* out, const clm_engine* engine, const int32_t* tokens,
                                     size_t n_tokens, const clm_admit_options* options) {
  return guarded([&]() -> clm_status {
    if (!out) return null_argument("clm_engine_plan_admission", "out");
    if (clm_status s =
            check_struct_size<clm_admission_plan>(out->struct_size, {kAdmissionPlanV1}, "clm_engine_plan_admission")) {
      return s;
    }
    if (!engine) return null_argument("clm_engine_plan_admission", "engine");
    clm::AdmitOptions admit;
    if (clm_status s = prompt_args_of(tokens, n_tokens, options, "clm_engine_plan_admission", admit)) return s;
    clm::AdmissionPlan plan;
    if (clm_status s = report(engine->state->engine->plan_admission({tokens, n_tokens}, admit, plan))) return s;
    const clm_admission_plan full{out->struct_size,    plan.cached_tokens, plan.new_pages,
                                  plan.unlocked_pages, plan.pages_free,    plan.evictable_tokens};
    std::memcpy(out, &full, out->struct_size);
    return CLM_OK;
  });
}

namespace {

// clm_seq_finish and clm_seq_abort: the same checks, the engine's call, and
// the handle then counts as ended (`how`: "finished" or "aborted").
clm_status end_seq(clm_seq* seq, const char* function, clm::Status (clm::Engine::*end)(clm::SequenceId),
                   const char* how) {
  return guarded([&]() -> clm_status {
    if (clm_status s = check_running(seq, function)) return s;
    if (clm_status s = report(((*seq->state->engine).*end)(seq->admission.seq))) return s;
    seq->ended = true;
    seq->ended_by = how;
    return CLM_OK;
  });
}

}  // namespace

clm_status clm_seq_extend(clm_seq* seq, const int32_t* tokens, size_t n_tokens) {
  return guarded([&]() -> clm_status {
    if (clm_status s = check_running(seq, "clm_seq_extend")) return s;
    if (!tokens && n_tokens > 0) return null_argument("clm_seq_extend", "tokens (with n_tokens > 0)");
    if (n_tokens > kMaxTokens) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("clm_seq_extend: n_tokens {} is too large", n_tokens));
    }
    // The borrowed page table is refreshed here, so that reading it stays a pure read.
    if (clm_status s = report(seq->state->engine->extend(seq->admission.seq, {tokens, n_tokens}, seq->slots,
                                                         &seq->admission.page_table))) {
      return s;
    }
    seq->extended = true;
    return CLM_OK;
  });
}

clm_status clm_seq_finish(clm_seq* seq) { return end_seq(seq, "clm_seq_finish", &clm::Engine::finish, "finished"); }

clm_status clm_seq_abort(clm_seq* seq) { return end_seq(seq, "clm_seq_abort", &clm::Engine::abort, "aborted"); }

void clm_seq_free(clm_seq* seq) {
  if (!seq) return;
  if (!seq->ended && !seq->state->closed) (void)seq->state->engine->abort(seq->admission.seq);
  delete seq;
}

int32_t clm_seq_cached_tokens(const clm_seq* seq) { return seq ? seq->admission.cached_tokens : 0; }
int32_t clm_seq_host_tokens(const clm_seq* seq) { return seq ? seq->admission.host_tokens : 0; }
int32_t clm_seq_storage_tokens(const clm_seq* seq) { return seq ? seq->admission.storage_tokens : 0; }

// Pages and slots of an ended sequence belong to the cache or to other
// sequences by now: an ended sequence has none.
static bool has_live_pages(const clm_seq* seq) { return seq && !seq->ended && !seq->state->closed; }

const int32_t* clm_seq_page_table(const clm_seq* seq, size_t* n_pages) {
  if (n_pages) *n_pages = 0;
  if (!has_live_pages(seq)) return nullptr;
  if (n_pages) *n_pages = seq->admission.page_table.size();
  return seq->admission.page_table.data();
}

const int64_t* clm_seq_slots(const clm_seq* seq, size_t* n_slots) {
  if (n_slots) *n_slots = 0;
  if (!has_live_pages(seq)) return nullptr;
  const std::vector<std::int64_t>& slots = seq->extended ? seq->slots : seq->admission.slots;
  if (n_slots) *n_slots = slots.size();
  return slots.data();
}

clm_status clm_engine_batch_page_table(int32_t* indptr, int32_t* indices, size_t indices_capacity, size_t* n_indices,
                                       int32_t* last_page_len, clm_engine* engine, clm_seq* const* seqs,
                                       size_t n_seqs) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_batch_page_table";
    if (!indptr) return null_argument(fn, "indptr");
    if (!n_indices) return null_argument(fn, "n_indices");
    if (!last_page_len && n_seqs > 0) return null_argument(fn, "last_page_len");
    if (!engine) return null_argument(fn, "engine");
    if (n_seqs >= static_cast<size_t>(INT32_MAX)) {  // indptr holds int32 offsets
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_seqs {} is too large", fn, n_seqs));
    }
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
    clm::PagedBatch batch;
    if (clm_status s = report(engine->state->engine->batch_page_table(ids, batch))) return s;
    *n_indices = batch.indices.size();
    if (batch.indices.size() > indices_capacity || (!indices && !batch.indices.empty())) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: {} page ids need room, indices holds {}", fn,
                                                        batch.indices.size(), indices ? indices_capacity : 0));
    }
    std::copy(batch.indptr.begin(), batch.indptr.end(), indptr);
    std::copy(batch.indices.begin(), batch.indices.end(), indices);
    std::copy(batch.last_page_len.begin(), batch.last_page_len.end(), last_page_len);
    return CLM_OK;
  });
}

clm_status clm_engine_metrics(clm_metrics* out, const clm_engine* engine) {
  return guarded([&]() -> clm_status {
    if (!out) return null_argument("clm_engine_metrics", "out");
    if (!engine) return null_argument("clm_engine_metrics", "engine");
    if (clm_status s = check_struct_size<clm_metrics>(
            out->struct_size, {kMetricsV1, kMetricsV2, kMetricsV3, kMetricsV4, kMetricsV5, kMetricsV6, kMetricsV7},
            "clm_engine_metrics"))
      return s;
    const clm::EngineMetrics m = engine->state->engine->metrics();
    clm_metrics full{};
    full.struct_size = out->struct_size;
    full.tokens_queried = m.cache.tokens_queried;
    full.tokens_hit = m.cache.tokens_hit;
    full.hit_rate = m.cache.hit_rate();
    full.cached_tokens = m.cache.cached_tokens;
    full.evictable_tokens = m.cache.evictable_tokens;
    full.protected_tokens = m.cache.protected_tokens;
    full.pages_used = m.cache.pages_used;
    full.pages_free = m.cache.pages_free;
    full.evicted_tokens = m.cache.evicted_tokens;
    full.evictions = m.cache.evictions;
    full.inserted_tokens = m.cache.inserted_tokens;
    full.admitted = m.admitted;
    full.finished = m.finished;
    full.aborted = m.aborted;
    full.rejected = m.rejected;
    full.active_sequences = m.active_sequences;
    full.metadata_bytes = m.cache.metadata_bytes;
    full.src_threshold = m.src.threshold;
    full.src_steps = m.src.steps;
    full.src_unscored_steps = m.src.unscored_steps;
    full.src_reuse_decisions = m.src.reuse_decisions;
    full.src_retrievals_found = m.src.retrievals_found;
    full.src_retrievals_failed = m.src.retrievals_failed;
    full.src_breaker_trips = m.src.breaker_trips;
    full.src_baseline_sequences = m.src.baseline_sequences;
    full.src_injections = m.src.injections;
    const clm::SnapshotStoreMetrics& st = m.store;
    full.store_lookups = st.lookups;
    full.store_hits_exact = st.hits_exact;
    full.store_hits_ann = st.hits_ann;
    full.store_hits_fallback = st.hits_fallback;
    full.store_misses = st.misses;
    full.store_busy_misses = st.busy_misses;
    full.store_blacklisted_skips = st.blacklisted_skips;
    full.store_ann_unavailable = st.ann_unavailable;
    full.store_records = st.records;
    full.store_counted = st.counted;
    full.store_admissions = st.admissions;
    full.store_confirmations = st.confirmations;
    full.store_versions = st.versions;
    full.store_drift_versions = st.drift_versions;
    full.store_evictions = st.evictions;
    full.store_corrupt_skipped = st.corrupt_skipped;
    full.store_index_rebuilds = st.index_rebuilds;
    full.store_outcome_reports = st.outcome_reports;
    full.store_snapshots = st.snapshots;
    full.store_blacklisted_keys = st.blacklisted_keys;
    full.has_snapshot_store = m.has_snapshot_store ? 1 : 0;
    const clm::TierMetrics& t = m.tiers;
    full.has_tiers = m.has_tiers ? 1 : 0;
    full.has_storage = t.has_storage ? 1 : 0;
    full.device_hit_tokens = t.device_hit_tokens;
    full.host_hit_tokens = t.host_hit_tokens;
    full.storage_hit_tokens = t.storage_hit_tokens;
    full.load_backs = t.load_backs;
    full.loaded_pages = t.loaded_pages;
    full.backed_up_pages = t.backed_up_pages;
    full.stored_pages = t.stored_pages;
    full.fetched_pages = t.fetched_pages;
    full.prefetch_timeouts = t.prefetch_timeouts;
    full.storage_errors = t.storage_errors;
    full.dropped_backups = t.dropped_backups;
    full.host_cached_tokens = m.cache.host_cached_tokens;
    full.host_pages_used = t.host_pages_used;
    full.host_pages_total = t.host_pages_total;
    full.storage_corrupt_pages = t.storage.corrupt_pages;
    full.storage_dropped_writes = t.storage.dropped_writes;
    full.storage_evicted_pages = t.storage.evicted_pages;
    full.storage_foreign_model_pages = t.storage.foreign_model_pages;
    full.storage_unsigned_pages = t.storage.unsigned_pages;
    full.storage_forged_pages = t.storage.forged_pages;
    full.storage_repaired_pages = t.storage.repaired_pages;
    full.tier_worker_failures = t.worker_failures;
    full.signed_pages = t.signed_pages ? 1 : 0;
    full.storage_breaker_state = t.breaker_state;
    full.storage_breaker_trips = t.breaker_trips;
    full.storage_breaker_skips = t.breaker_skips;
    full.dropped_fetches = t.dropped_fetches;
    full.merged_fetches = t.merged_fetches;
    full.queued_fetches = t.queued_fetches;
    const clm::KvEventsMetrics& e = m.kv_events;
    full.has_kv_events = e.enabled ? 1 : 0;
    full.kv_events_resync_pending = e.resync_pending ? 1 : 0;
    full.kv_events_recorded = e.recorded_events;
    full.kv_events_published = e.published_events;
    full.kv_events_published_batches = e.published_batches;
    full.kv_events_dropped = e.dropped_events;
    full.kv_events_resyncs = e.resyncs;
    full.kv_events_replay_requests = e.replay_requests;
    full.kv_events_replay_refused = e.replay_refused;
    full.kv_events_send_failures = e.send_failures;
    full.kv_events_queued = e.queued_events;
    full.kv_events_next_sequence = e.next_sequence;
    full.diverged_lookups = m.cache.diverged_matches;
    static_assert(std::size(decltype(full.match_depth_counts){}) ==
                  std::tuple_size_v<decltype(m.cache.match_depth.counts)>);
    std::copy(m.cache.match_depth.counts.begin(), m.cache.match_depth.counts.end(), full.match_depth_counts);
    full.match_depth_sum_tokens = m.cache.match_depth.sum_tokens;
    const clm::ClmWatchMetrics& w = m.clm_watch;
    full.clm_watch_sightings = w.sightings;
    full.clm_watch_low_src_turns = w.low_src_turns;
    static_assert(std::size(decltype(full.clm_watch_key_events){}) == std::tuple_size_v<decltype(w.store_events)>);
    std::copy(w.store_events.begin(), w.store_events.end(), full.clm_watch_key_events);
    full.clm_watch_watched_keys = w.watched_keys;
    full.clm_watch_low_src_keys = w.low_src_keys;
    std::memcpy(out, &full, out->struct_size);
    return CLM_OK;
  });
}

clm_status clm_engine_metrics_text(char* text, size_t text_capacity, size_t* text_len, const clm_engine* engine) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_metrics_text";
    if (!text_len) return null_argument(fn, "text_len");
    if (!engine) return null_argument(fn, "engine");
    const std::string made = engine->state->engine->metrics_text();
    *text_len = made.size();
    if (!text || made.size() >= text_capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: the text needs {} bytes with its NUL, text holds {}", fn,
                                                        made.size() + 1, text ? text_capacity : 0));
    }
    std::memcpy(text, made.data(), made.size());
    text[made.size()] = '\0';
    return CLM_OK;
  });
}

}  // extern "C"
