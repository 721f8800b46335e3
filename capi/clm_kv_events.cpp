// capi/clm_kv_events.cpp: the C ABI of KV events for cache-aware routers
// (clm.h, "KV events"): version 7 of clm_engine_options as a
// clm::KvEventsConfig, the host's callback as the config's sink, and the
// engine's flush, block list and endpoints. Conversion only; the logic is in
// clm::KvEventRecorder and clm::KvEventPublisher.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi_internal.hpp"

using namespace clm_capi;

namespace {

constexpr std::size_t kMaxEndpointBytes = 4096;

clm_status kv_events_off(const char* fn) {
  return fail(CLM_ERR_FAILED_PRECONDITION,
              fmt::format("{}: the engine publishes no KV events (clm_engine_options.kv_events is 0)", fn));
}

// The host's callback as the publisher's sink: each batch as plain structs
// that point into it, alive for the call.
struct CallbackSink {
  clm_kv_event_callback callback;
  void* user_data;

  void operator()(std::uint64_t sequence, const clm::KvEventBatch& batch) const {
    std::vector<clm_kv_event> events(batch.events.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
      const clm::KvEvent& e = batch.events[i];
      clm_kv_event& c = events[i];
      std::memset(&c, 0, sizeof c);
      c.kind = e.kind == clm::KvEventKind::block_stored    ? CLM_KV_EVENT_BLOCK_STORED
               : e.kind == clm::KvEventKind::block_removed ? CLM_KV_EVENT_BLOCK_REMOVED
                                                           : CLM_KV_EVENT_ALL_BLOCKS_CLEARED;
      c.medium = e.medium == clm::KvMedium::cpu ? CLM_KV_MEDIUM_CPU : CLM_KV_MEDIUM_GPU;
      c.block_hashes = e.block_hashes.data();
      c.n_block_hashes = e.block_hashes.size();
      c.has_parent = e.parent_block_hash ? 1 : 0;
      c.parent_block_hash = e.parent_block_hash.value_or(0);
      c.block_size = e.block_size;
      c.token_ids = e.token_ids.data();
      c.n_token_ids = e.token_ids.size();
      c.lora_id = e.lora_id.value_or(0);
      c.extra_key = e.extra_key.c_str();
    }
    clm_kv_event_batch c{};
    c.struct_size = static_cast<uint32_t>(kKvEventBatchV1);
    c.data_parallel_rank = batch.data_parallel_rank.value_or(0);
    c.sequence = sequence;
    c.ts = batch.ts;
    c.events = events.data();
    c.n_events = events.size();
    callback(&c, user_data);
  }
};

clm_status copy_string(const char* from, const char* name, std::string& to) {
  if (!from || !*from) return CLM_OK;  // the default
  const std::size_t n = strnlen(from, kMaxEndpointBytes + 1);
  if (n > kMaxEndpointBytes) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("clm_engine_create: {} is longer than {} bytes", name, kMaxEndpointBytes));
  }
  to.assign(from, n);
  return CLM_OK;
}

clm_status check_flag(int32_t value, const char* name) {
  if (value == 0 || value == 1) return CLM_OK;
  return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("clm_engine_create: {} is {} (0 or 1)", name, value));
}

}  // namespace

namespace clm_capi {

clm_status kv_events_config(const clm_engine_options& o, clm::KvEventsConfig& config) {
  if (clm_status s = check_flag(o.kv_events, "kv_events")) return s;
  if (clm_status s = check_flag(o.kv_events_token_ids, "kv_events_token_ids")) return s;
  if (o.kv_events_bind < CLM_KV_EVENTS_BIND_AUTO || o.kv_events_bind > CLM_KV_EVENTS_CONNECT) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("clm_engine_create: unknown kv_events_bind {}", o.kv_events_bind));
  }
  if (o.kv_events_layout < CLM_KV_EVENTS_LAYOUT_ARRAY || o.kv_events_layout > CLM_KV_EVENTS_LAYOUT_MAP) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("clm_engine_create: unknown kv_events_layout {}", o.kv_events_layout));
  }
  if (!o.kv_events_callback && o.kv_events_callback_data) {
    return fail(CLM_ERR_INVALID_ARGUMENT, "clm_engine_create: kv_events_callback_data without kv_events_callback");
  }
  config.enabled = o.kv_events == 1;
  config.bind = static_cast<clm::KvEventsBind>(o.kv_events_bind);
  if (clm_status s = copy_string(o.kv_events_endpoint, "kv_events_endpoint", config.endpoint)) return s;
  if (clm_status s = copy_string(o.kv_events_replay_endpoint, "kv_events_replay_endpoint", config.replay_endpoint)) {
    return s;
  }
  // The topic's own limit (256 bytes) is the publisher's to name.
  if (clm_status s = copy_string(o.kv_events_topic, "kv_events_topic", config.topic)) return s;
  config.layout = static_cast<clm::KvEventLayout>(o.kv_events_layout);
  config.batch_interval_ms = o.kv_events_batch_interval_ms;
  config.max_batch_events = o.kv_events_max_batch_events;
  config.queue_events = o.kv_events_queue_events;
  config.buffer_batches = o.kv_events_buffer_batches;
  config.send_hwm = o.kv_events_send_hwm;
  config.data_parallel_rank = o.kv_events_data_parallel_rank;
  config.token_ids = o.kv_events_token_ids == 1;
  if (o.kv_events_callback) config.sink = CallbackSink{o.kv_events_callback, o.kv_events_callback_data};
  return CLM_OK;
}

}  // namespace clm_capi

extern "C" {

clm_status clm_engine_flush_kv_events(clm_engine* engine, int32_t timeout_ms) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_flush_kv_events";
    if (!engine) return null_argument(fn, "engine");
    if (timeout_ms < 0) return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: timeout_ms {} < 0", fn, timeout_ms));
    clm::Engine& e = *engine->state->engine;
    if (!e.kv_events_enabled()) return kv_events_off(fn);
    return report(e.flush_kv_events(std::chrono::milliseconds(timeout_ms)));
  });
}

clm_status clm_engine_kv_event_blocks(uint64_t* hashes, size_t capacity, size_t* count, const clm_engine* engine,
                                      int32_t medium) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_kv_event_blocks";
    if (!count) return null_argument(fn, "count");
    *count = 0;
    if (!engine) return null_argument(fn, "engine");
    if (!hashes && capacity > 0) return null_argument(fn, "hashes (with capacity > 0)");
    if (medium != CLM_KV_MEDIUM_GPU && medium != CLM_KV_MEDIUM_CPU) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: unknown medium {} (CLM_KV_MEDIUM_GPU or _CPU)", fn, medium));
    }
    std::vector<std::uint64_t> blocks;
    const clm::Status s = engine->state->engine->kv_event_blocks(
        medium == CLM_KV_MEDIUM_CPU ? clm::KvMedium::cpu : clm::KvMedium::gpu, blocks);
    if (s.code() == clm::StatusCode::failed_precondition) return kv_events_off(fn);
    if (clm_status r = report(s)) return r;
    *count = blocks.size();
    if (blocks.size() > capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: {} hashes, hashes holds {}", fn, blocks.size(), capacity));
    }
    if (!blocks.empty()) std::memcpy(hashes, blocks.data(), blocks.size() * sizeof(std::uint64_t));
    return CLM_OK;
  });
}

clm_status clm_engine_kv_events_endpoint(char* text, size_t text_capacity, size_t* len, const clm_engine* engine,
                                         int32_t replay) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_kv_events_endpoint";
    if (!len) return null_argument(fn, "len");
    *len = 0;
    if (!engine) return null_argument(fn, "engine");
    if (replay != 0 && replay != 1) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: replay is {} (0 or 1)", fn, replay));
    }
    const clm::Engine& e = *engine->state->engine;
    if (!e.kv_events_enabled()) return kv_events_off(fn);
    const std::string endpoint = replay ? e.kv_events_replay_endpoint() : e.kv_events_endpoint();
    *len = endpoint.size();
    if (!text || endpoint.size() >= text_capacity) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: the endpoint needs {} bytes with its NUL, text holds {}",
                                                        fn, endpoint.size() + 1, text ? text_capacity : 0));
    }
    std::memcpy(text, endpoint.data(), endpoint.size());
    text[endpoint.size()] = '\0';
    return CLM_OK;
  });
}

}  // extern "C"
