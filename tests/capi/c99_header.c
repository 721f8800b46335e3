/*
 * tests/capi/c99_header.c: clm.h is a C99 header. Compiled with -std=c99
 * -pedantic -Wall -Wextra -Werror (and clmcache's own warnings); it names every
 * type, macro and function of clm.h, checks each function's prototype by
 * assigning it to a pointer of the exact documented type, and its main()
 * checks that each static initialiser (CLM_ENGINE_OPTIONS_INIT, ...) equals
 * what its init function writes, then creates and frees an engine against the
 * shared library.
 */
#include "clm.h"
#include "clm.h" /* the include guard works */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifndef CLM_H
#error "clm.h defines no include guard CLM_H"
#endif
#ifndef CLM_API
#error "clm.h defines no CLM_API"
#endif

/* ---- macros: integer constants usable by the preprocessor ---------------- */
#if CLM_VERSION_NUMBER != CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH
#error "CLM_VERSION_NUMBER disagrees with its parts"
#endif
#if CLM_OK != 0 || CLM_ERR_INVALID_ARGUMENT != -1 || CLM_ERR_OUT_OF_MEMORY != -2 || CLM_ERR_NOT_FOUND != -3 || \
    CLM_ERR_FAILED_PRECONDITION != -4 || CLM_ERR_UNSUPPORTED != -5 || CLM_ERR_INTERNAL != -6 || CLM_ERR_IO != -7
#error "status codes changed: they are ABI"
#endif
#if CLM_KV_F32 != 0 || CLM_KV_F16 != 1 || CLM_KV_BF16 != 2
#error "kv dtypes changed: they are ABI"
#endif
#if CLM_MEMORY_NONE != 0 || CLM_MEMORY_HOST != 1 || CLM_MEMORY_DEVICE != 2
#error "memory kinds changed: they are ABI"
#endif
#if CLM_EVICT_LRU != 0 || CLM_EVICT_LFU != 1 || CLM_EVICT_SLRU != 2 || CLM_EVICT_PRIORITY != 3 || \
    CLM_EVICT_GHOST_SLRU != 4
#error "eviction policies changed: they are ABI"
#endif
#if CLM_PRIORITY_RAISE != 0 || CLM_PRIORITY_SET != 1
#error "priority updates changed: they are ABI"
#endif
#if CLM_GELU_TANH != 0 || CLM_GELU_ERF != 1
#error "gelu modes changed: they are ABI"
#endif
#if CLM_DTYPE_F32 != 0 || CLM_DTYPE_F16 != 1 || CLM_DTYPE_BF16 != 2
#error "activation dtypes changed: they are ABI"
#endif
#if CLM_SUFFIX_TEXT != 0 || CLM_SUFFIX_KEY != 1
#error "suffix kinds changed: they are ABI"
#endif
#if CLM_SNAPSHOT_MISS != 0 || CLM_SNAPSHOT_EXACT != 1 || CLM_SNAPSHOT_ANN != 2 || CLM_SNAPSHOT_FALLBACK != 3
#error "snapshot levels changed: they are ABI"
#endif
#if CLM_RECORD_COUNTED != 0 || CLM_RECORD_ADMITTED != 1 || CLM_RECORD_CONFIRMED != 2 || \
    CLM_RECORD_NEW_VERSION != 3 || CLM_RECORD_DRIFTED != 4
#error "record results changed: they are ABI"
#endif
#if CLM_SNAPSHOT_KEY_BYTES != 264
#error "CLM_SNAPSHOT_KEY_BYTES changed: it sizes clm_snapshot_hit, an array element"
#endif

/* C99 has no _Static_assert: a negative array size fails the build. */
#define C99_STATIC_ASSERT(cond, name) typedef char c99_static_assert_##name[(cond) ? 1 : -1]

/* ---- types ---------------------------------------------------------------- */
C99_STATIC_ASSERT(sizeof(clm_status) == 4, clm_status_is_int32);
C99_STATIC_ASSERT((clm_status)-1 < 0, clm_status_is_signed);
C99_STATIC_ASSERT(offsetof(clm_engine_options, struct_size) == 0, engine_options_size_first);
C99_STATIC_ASSERT(offsetof(clm_admit_options, struct_size) == 0, admit_options_size_first);
C99_STATIC_ASSERT(offsetof(clm_metrics, struct_size) == 0, metrics_size_first);
C99_STATIC_ASSERT(offsetof(clm_kv_layout, struct_size) == 0, kv_layout_size_first);
C99_STATIC_ASSERT(offsetof(clm_adapter_options, struct_size) == 0, adapter_options_size_first);
C99_STATIC_ASSERT(offsetof(clm_attention_params, struct_size) == 0, attention_params_size_first);
/* Version 2 appends: the version-1 fields keep their places. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, src_daily_requests) >=
                      offsetof(clm_engine_options, slru_protected_fraction) + sizeof(double),
                  engine_options_v2_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, src_threshold) >= offsetof(clm_metrics, metadata_bytes) + sizeof(uint64_t),
                  metrics_v2_appended);
C99_STATIC_ASSERT(sizeof(clm_src_decision) == 2 * sizeof(float) + 4, src_decision_is_packed_plain_data);
/* Version 3 appends too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, snapshot_store_path) >=
                      offsetof(clm_engine_options, n_special_token_ids) + sizeof(size_t),
                  engine_options_v3_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, store_lookups) >= offsetof(clm_metrics, src_injections) + sizeof(uint64_t),
                  metrics_v3_appended);
/* Version 4 (the tiers) appends too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, host_pages) >=
                      offsetof(clm_engine_options, snapshot_lookup_timeout_us) + sizeof(int32_t),
                  engine_options_v4_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, has_tiers) >= offsetof(clm_metrics, has_snapshot_store) + sizeof(int32_t),
                  metrics_v4_appended);
/* Version 5 (the store's reader and maintenance) appends too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, snapshot_read_only) >=
                      offsetof(clm_engine_options, storage_batch_pages) + sizeof(int32_t),
                  engine_options_v5_appended);
/* Version 6 (pages safe to share) and 7 (KV events) append too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, model_id) >=
                      offsetof(clm_engine_options, snapshot_maintenance_interval_ms) + sizeof(int64_t),
                  engine_options_v6_appended);
C99_STATIC_ASSERT(offsetof(clm_engine_options, kv_events) >=
                      offsetof(clm_engine_options, breaker_open_ms) + sizeof(double),
                  engine_options_v7_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, has_kv_events) >= offsetof(clm_metrics, queued_fetches) + sizeof(int64_t),
                  metrics_v6_appended);
/* Version 8 (divergence) of the engine options, 7 of the metrics and 3 of
 * the admit options append too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, divergence) >=
                      offsetof(clm_engine_options, kv_events_token_ids) + sizeof(int32_t),
                  engine_options_v8_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, diverged_lookups) >=
                      offsetof(clm_metrics, kv_events_next_sequence) + sizeof(uint64_t),
                  metrics_v7_appended);
C99_STATIC_ASSERT(offsetof(clm_admit_options, tenant) >= offsetof(clm_admit_options, priority_update) + sizeof(int32_t),
                  admit_options_v3_appended);
/* Version 9 (CLM anomalies) of the engine options and 8 of the metrics append too. */
C99_STATIC_ASSERT(offsetof(clm_engine_options, clm_watch) >=
                      offsetof(clm_engine_options, divergence_context_tokens) + sizeof(int32_t),
                  engine_options_v9_appended);
C99_STATIC_ASSERT(offsetof(clm_metrics, clm_watch_sightings) >=
                      offsetof(clm_metrics, match_depth_sum_tokens) + sizeof(uint64_t),
                  metrics_v8_appended);
/* No padding at the end of the newest versions: a later version's fields
 * would land on it. */
C99_STATIC_ASSERT(sizeof(clm_engine_options) ==
                      offsetof(clm_engine_options, clm_watch_callback_data) + sizeof(void *),
                  engine_options_end_on_a_field);
C99_STATIC_ASSERT(sizeof(clm_metrics) == offsetof(clm_metrics, clm_watch_low_src_keys) + sizeof(int64_t),
                  metrics_end_on_a_field);
C99_STATIC_ASSERT(sizeof(clm_low_src_key) == offsetof(clm_low_src_key, reserved) + sizeof(int32_t),
                  low_src_key_end_on_a_field);
C99_STATIC_ASSERT(sizeof(clm_watch_event) == offsetof(clm_watch_event, sightings) + sizeof(uint64_t),
                  watch_event_end_on_a_field);
#if CLM_WATCH_EVENT_BLACKLISTED != 0 || CLM_WATCH_EVENT_UNBLACKLISTED != 1 || CLM_WATCH_EVENT_VERSION_CREATED != 2 || \
    CLM_WATCH_EVENT_DRIFT != 3 || CLM_WATCH_EVENT_LOW_SRC != 4
#error "CLM_WATCH_EVENT_* changed: they are ABI"
#endif
C99_STATIC_ASSERT(CLM_MATCH_DEPTH_BUCKETS == 19, match_depth_buckets_are_19);
C99_STATIC_ASSERT(sizeof(clm_admit_options) == offsetof(clm_admit_options, tenant_len) + sizeof(size_t),
                  admit_options_end_on_a_field);
C99_STATIC_ASSERT(sizeof(clm_branch_point) == offsetof(clm_branch_point, n_cached_after) + sizeof(size_t),
                  branch_point_end_on_a_field);
#if CLM_KV_EVENT_BLOCK_STORED != 0 || CLM_KV_EVENT_BLOCK_REMOVED != 1 || CLM_KV_EVENT_ALL_BLOCKS_CLEARED != 2 || \
    CLM_KV_MEDIUM_GPU != 0 || CLM_KV_MEDIUM_CPU != 1
#error "CLM_KV_EVENT_* / CLM_KV_MEDIUM_* changed: they are ABI"
#endif
#if CLM_KV_EVENTS_BIND_AUTO != 0 || CLM_KV_EVENTS_BIND != 1 || CLM_KV_EVENTS_CONNECT != 2 || \
    CLM_KV_EVENTS_LAYOUT_ARRAY != 0 || CLM_KV_EVENTS_LAYOUT_LEGACY != 1 || CLM_KV_EVENTS_LAYOUT_MAP != 2
#error "CLM_KV_EVENTS_* changed: they are ABI"
#endif
#if CLM_WRITE_THROUGH != 0 || CLM_WRITE_THROUGH_SELECTIVE != 1 || CLM_WRITE_BACK != 2
#error "CLM_WRITE_* changed"
#endif
#if CLM_PREFETCH_BEST_EFFORT != 0 || CLM_PREFETCH_WAIT_COMPLETE != 1 || CLM_PREFETCH_TIMEOUT != 2
#error "CLM_PREFETCH_* changed"
#endif
/* clm_snapshot_hit is an array element with no struct_size: its layout is fixed. */
C99_STATIC_ASSERT(offsetof(clm_snapshot_hit, fingerprint) == 16, snapshot_hit_fingerprint_at_16);
C99_STATIC_ASSERT(offsetof(clm_snapshot_hit, key) == 56, snapshot_hit_key_at_56);
C99_STATIC_ASSERT(sizeof(clm_snapshot_hit) == 56 + CLM_SNAPSHOT_KEY_BYTES, snapshot_hit_is_320_bytes);
C99_STATIC_ASSERT(sizeof(clm_snapshot_version) == 64, snapshot_version_is_64_bytes);
C99_STATIC_ASSERT(sizeof(clm_snapshot_blacklist_entry) == 56 + 3 * CLM_SNAPSHOT_KEY_BYTES,
                  snapshot_blacklist_entry_is_848_bytes);

/* Every field, with its type (a wrong type warns, and warnings are errors). */
static void use_types(clm_engine_options *eo, clm_admit_options *ao, clm_kv_layout *kl, clm_metrics *m,
                      clm_src_decision *sd, clm_adapter_options *ad, clm_attention_params *ap, clm_snapshot_hit *sh,
                      clm_kv_event_batch *kb, clm_kv_event *ke, clm_low_src_key *lk, clm_watch_event *we) {
  uint32_t *u32;
  int32_t *i32;
  int64_t *i64;
  uint64_t *u64;
  uint8_t *u8;
  float *f32;
  double *f64;
  size_t *sz;
  const char **str;
  char *chars;
  const int32_t **ids;
  void **ptr;
  clm_kv_event_callback *callback;
  clm_watch_line_callback *watch_callback;
  const clm_kv_event **events;
  const uint64_t **hashes;
  clm_engine *engine = NULL; /* opaque: only pointers to them exist */
  clm_seq *seq = NULL;

  u32 = &eo->struct_size;
  i32 = &eo->num_pages;
  i32 = &eo->page_size;
  i32 = &eo->num_layers;
  i32 = &eo->kv_heads;
  i32 = &eo->head_dim;
  i32 = &eo->kv_dtype;
  i32 = &eo->memory;
  i32 = &eo->device;
  i32 = &eo->eviction_policy;
  f64 = &eo->slru_protected_fraction;
  f64 = &eo->src_daily_requests;
  f32 = &eo->src_threshold;
  f32 = &eo->src_breaker_score;
  i32 = &eo->src_breaker_steps;
  ids = &eo->special_token_ids;
  sz = &eo->n_special_token_ids;
  str = &eo->snapshot_store_path;
  i32 = &eo->snapshot_store_shards;
  i32 = &eo->snapshot_dim;
  i64 = &eo->snapshot_min_usage;
  f32 = &eo->snapshot_version_cosine;
  f32 = &eo->snapshot_similarity_floor;
  i32 = &eo->host_pages;
  i32 = &eo->write_policy;
  str = &eo->storage_url;
  i32 = &eo->prefetch_policy;
  f64 = &eo->prefetch_timeout_ms;
  f64 = &eo->prefetch_timeout_per_1k_tokens_ms;
  i32 = &eo->storage_workers;
  i32 = &eo->storage_batch_pages;
  i32 = &eo->snapshot_read_only;
  i64 = &eo->snapshot_maintenance_interval_ms;
  i32 = &eo->snapshot_ann_ef_search;
  i32 = &eo->snapshot_lookup_timeout_us;
  str = &eo->model_id;
  str = &eo->page_secret_file;
  str = &eo->page_secret_env;
  i32 = &eo->max_queued_fetches;
  i32 = &eo->breaker_failures;
  f64 = &eo->admission_deadline_ms;
  f64 = &eo->breaker_open_ms;
  i32 = &eo->kv_events;
  i32 = &eo->kv_events_bind;
  str = &eo->kv_events_endpoint;
  str = &eo->kv_events_replay_endpoint;
  str = &eo->kv_events_topic;
  callback = &eo->kv_events_callback;
  ptr = &eo->kv_events_callback_data;
  i32 = &eo->kv_events_layout;
  i32 = &eo->kv_events_batch_interval_ms;
  i32 = &eo->kv_events_max_batch_events;
  i32 = &eo->kv_events_queue_events;
  i32 = &eo->kv_events_buffer_batches;
  i32 = &eo->kv_events_send_hwm;
  i32 = &eo->kv_events_data_parallel_rank;
  i32 = &eo->kv_events_token_ids;
  i32 = &eo->divergence;
  i32 = &eo->divergence_branch_points;
  i32 = &eo->divergence_window_ms;
  i32 = &eo->divergence_context_tokens;
  i32 = &eo->clm_watch;
  i32 = &eo->clm_watch_max_keys;
  i64 = &eo->clm_watch_window_ms;
  i64 = &eo->clm_watch_min_sightings;
  f32 = &eo->clm_watch_low_src;
  i32 = &eo->clm_watch_max_events;
  watch_callback = &eo->clm_watch_callback;
  ptr = &eo->clm_watch_callback_data;

  u32 = &ao->struct_size;
  str = &ao->cache_salt;
  sz = &ao->cache_salt_len;
  i32 = &ao->adapter_id;
  i32 = &ao->priority;
  i32 = &ao->priority_update;
  str = &ao->tenant;
  sz = &ao->tenant_len;

  u32 = &kl->struct_size;
  ptr = &kl->base;
  sz = &kl->page_bytes;
  sz = &kl->layer_bytes;
  i32 = &kl->num_pages;
  i32 = &kl->page_size;
  i32 = &kl->num_layers;
  i32 = &kl->kv_heads;
  i32 = &kl->head_dim;
  i32 = &kl->kv_dtype;
  i32 = &kl->memory;

  u32 = &m->struct_size;
  u64 = &m->tokens_queried;
  u64 = &m->tokens_hit;
  f64 = &m->hit_rate;
  i64 = &m->cached_tokens;
  i64 = &m->evictable_tokens;
  i64 = &m->protected_tokens;
  i32 = &m->pages_used;
  i32 = &m->pages_free;
  u64 = &m->evicted_tokens;
  u64 = &m->evictions;
  u64 = &m->inserted_tokens;
  u64 = &m->admitted;
  u64 = &m->finished;
  u64 = &m->aborted;
  u64 = &m->rejected;
  i64 = &m->active_sequences;
  u64 = &m->metadata_bytes;
  f64 = &m->src_threshold;
  u64 = &m->src_steps;
  u64 = &m->src_unscored_steps;
  u64 = &m->src_reuse_decisions;
  u64 = &m->src_retrievals_found;
  u64 = &m->src_retrievals_failed;
  u64 = &m->src_breaker_trips;
  i64 = &m->src_baseline_sequences;
  u64 = &m->src_injections;
  u64 = &m->store_lookups;
  u64 = &m->store_hits_exact;
  u64 = &m->store_hits_ann;
  u64 = &m->store_hits_fallback;
  u64 = &m->store_misses;
  u64 = &m->store_busy_misses;
  u64 = &m->store_blacklisted_skips;
  u64 = &m->store_ann_unavailable;
  u64 = &m->store_records;
  u64 = &m->store_counted;
  u64 = &m->store_admissions;
  u64 = &m->store_confirmations;
  u64 = &m->store_versions;
  u64 = &m->store_drift_versions;
  u64 = &m->store_evictions;
  u64 = &m->store_corrupt_skipped;
  u64 = &m->store_index_rebuilds;
  u64 = &m->store_outcome_reports;
  i64 = &m->store_snapshots;
  i64 = &m->store_blacklisted_keys;
  i32 = &m->has_snapshot_store;
  i32 = &m->has_tiers;
  i32 = &m->has_storage;
  u64 = &m->device_hit_tokens;
  u64 = &m->host_hit_tokens;
  u64 = &m->storage_hit_tokens;
  u64 = &m->load_backs;
  u64 = &m->loaded_pages;
  u64 = &m->backed_up_pages;
  u64 = &m->stored_pages;
  u64 = &m->fetched_pages;
  u64 = &m->prefetch_timeouts;
  u64 = &m->storage_errors;
  u64 = &m->dropped_backups;
  i64 = &m->host_cached_tokens;
  i64 = &m->host_pages_used;
  i64 = &m->host_pages_total;
  u64 = &m->storage_corrupt_pages;
  u64 = &m->storage_dropped_writes;
  u64 = &m->storage_evicted_pages;
  u64 = &m->storage_foreign_model_pages;
  u64 = &m->storage_unsigned_pages;
  u64 = &m->storage_forged_pages;
  u64 = &m->storage_repaired_pages;
  u64 = &m->tier_worker_failures;
  i32 = &m->signed_pages;
  i32 = &m->storage_breaker_state;
  u64 = &m->storage_breaker_trips;
  u64 = &m->storage_breaker_skips;
  u64 = &m->dropped_fetches;
  u64 = &m->merged_fetches;
  i64 = &m->queued_fetches;
  i32 = &m->has_kv_events;
  i32 = &m->kv_events_resync_pending;
  u64 = &m->kv_events_recorded;
  u64 = &m->kv_events_published;
  u64 = &m->kv_events_published_batches;
  u64 = &m->kv_events_dropped;
  u64 = &m->kv_events_resyncs;
  u64 = &m->kv_events_replay_requests;
  u64 = &m->kv_events_replay_refused;
  u64 = &m->kv_events_send_failures;
  i64 = &m->kv_events_queued;
  u64 = &m->kv_events_next_sequence;
  u64 = &m->diverged_lookups;
  u64 = &m->match_depth_counts[CLM_MATCH_DEPTH_BUCKETS - 1];
  u64 = &m->match_depth_sum_tokens;
  u64 = &m->clm_watch_sightings;
  u64 = &m->clm_watch_low_src_turns;
  u64 = &m->clm_watch_key_events[CLM_WATCH_EVENT_DRIFT];
  i64 = &m->clm_watch_watched_keys;
  i64 = &m->clm_watch_low_src_keys;

  u32 = &kb->struct_size;
  i32 = &kb->data_parallel_rank;
  u64 = &kb->sequence;
  f64 = &kb->ts;
  events = &kb->events;
  sz = &kb->n_events;
  i32 = &ke->kind;
  i32 = &ke->medium;
  hashes = &ke->block_hashes;
  sz = &ke->n_block_hashes;
  i32 = &ke->has_parent;
  i32 = &ke->block_size;
  u64 = &ke->parent_block_hash;
  ids = &ke->token_ids;
  sz = &ke->n_token_ids;
  i32 = &ke->lora_id;
  i32 = &ke->reserved;
  str = &ke->extra_key;

  f32 = &sd->score;
  f32 = &sd->threshold;
  u8 = &sd->scored;
  u8 = &sd->reuse;
  u8 = &sd->baseline;
  u8 = &sd->reserved;

  u32 = &ad->struct_size;
  i32 = &ad->num_layers;
  ids = &ad->layers;
  sz = &ad->n_layers;
  f32 = &ad->residual_scale;

  u32 = &ap->struct_size;
  i32 = &ap->layer;
  i32 = &ap->num_q_heads;
  f32 = &ap->softmax_scale;
  i32 = &ap->sliding_window;
  i32 = &ap->num_threads;
  ptr = &ap->stream;

  i32 = &sh->level;
  f32 = &sh->similarity;
  i32 = &sh->version;
  u32 = &sh->key_len;
  u64 = &sh->fingerprint;
  u8 = &sh->stable;
  u8 = &sh->key_truncated;
  u8 = sh->reserved;
  chars = sh->key;

  u32 = &lk->struct_size;
  str = &lk->tenant;
  sz = &lk->tenant_len;
  i32 = &lk->adapter_id;
  i32 = &lk->reserved;
  str = &lk->key;
  sz = &lk->key_len;
  u64 = &lk->sightings;
  f32 = &lk->median_src;

  u32 = &we->struct_size;
  i32 = &we->kind;
  i64 = &we->time_ms;
  str = &we->tenant;
  sz = &we->tenant_len;
  str = &we->key;
  sz = &we->key_len;
  str = &we->reason;
  sz = &we->reason_len;
  i64 = &we->until_ms;
  i32 = &we->adapter_id;
  i32 = &we->version;
  i32 = &we->by_breaker;
  u64 = &we->sightings;
  f32 = &we->median_src;

  (void)u32, (void)i32, (void)i64, (void)u64, (void)u8, (void)f32, (void)f64, (void)sz, (void)str, (void)chars,
      (void)ids, (void)ptr, (void)callback, (void)watch_callback, (void)events, (void)hashes;
  (void)engine, (void)seq;
}

/* ---- functions: each prototype, exactly as documented --------------------- */
static int (*const p_version)(void) = clm_version;
static const char *(*const p_version_string)(void) = clm_version_string;
static const char *(*const p_status_name)(clm_status) = clm_status_name;
static const char *(*const p_last_error)(void) = clm_last_error;
static clm_status (*const p_engine_options_init)(clm_engine_options *, size_t) = clm_engine_options_init;
static clm_status (*const p_engine_create)(clm_engine **, const clm_engine_options *) = clm_engine_create;
static void (*const p_engine_free)(clm_engine *) = clm_engine_free;
static clm_status (*const p_engine_kv_layout)(clm_kv_layout *, const clm_engine *) = clm_engine_kv_layout;
static clm_status (*const p_admit_options_init)(clm_admit_options *, size_t) = clm_admit_options_init;
static clm_status (*const p_engine_admit)(clm_seq **, clm_engine *, const int32_t *, size_t,
                                          const clm_admit_options *) = clm_engine_admit;
static clm_status (*const p_seq_extend)(clm_seq *, const int32_t *, size_t) = clm_seq_extend;
static clm_status (*const p_seq_finish)(clm_seq *) = clm_seq_finish;
static clm_status (*const p_seq_abort)(clm_seq *) = clm_seq_abort;
static void (*const p_seq_free)(clm_seq *) = clm_seq_free;
static int32_t (*const p_seq_cached_tokens)(const clm_seq *) = clm_seq_cached_tokens;
static int32_t (*const p_seq_host_tokens)(const clm_seq *) = clm_seq_host_tokens;
static int32_t (*const p_seq_storage_tokens)(const clm_seq *) = clm_seq_storage_tokens;
static clm_status (*const p_engine_prefetch)(clm_engine *, const int32_t *, size_t, const clm_admit_options *) =
    clm_engine_prefetch;
static clm_status (*const p_engine_wait_for_tiers)(clm_engine *) = clm_engine_wait_for_tiers;
static const int32_t *(*const p_seq_page_table)(const clm_seq *, size_t *) = clm_seq_page_table;
static const int64_t *(*const p_seq_slots)(const clm_seq *, size_t *) = clm_seq_slots;
static clm_status (*const p_engine_batch_page_table)(int32_t *, int32_t *, size_t, size_t *, int32_t *, clm_engine *,
                                                     clm_seq *const *, size_t) = clm_engine_batch_page_table;
static clm_status (*const p_engine_metrics)(clm_metrics *, const clm_engine *) = clm_engine_metrics;
static clm_status (*const p_engine_metrics_text)(char *, size_t, size_t *, const clm_engine *) =
    clm_engine_metrics_text;

/* KV events. */
static clm_status (*const p_engine_flush_kv_events)(clm_engine *, int32_t) = clm_engine_flush_kv_events;
static clm_status (*const p_engine_kv_event_blocks)(uint64_t *, size_t, size_t *, const clm_engine *, int32_t) =
    clm_engine_kv_event_blocks;
static clm_status (*const p_engine_kv_events_endpoint)(char *, size_t, size_t *, const clm_engine *, int32_t) =
    clm_engine_kv_events_endpoint;

/* Divergence hot spots. */
static clm_status (*const p_engine_divergence_report)(clm_divergence_report **, clm_engine *, int32_t, uint64_t,
                                                      const char *, size_t) = clm_engine_divergence_report;
static size_t (*const p_divergence_report_count)(const clm_divergence_report *) = clm_divergence_report_count;
static int64_t (*const p_divergence_report_window_ms)(const clm_divergence_report *) =
    clm_divergence_report_window_ms;
static clm_status (*const p_divergence_report_point)(clm_branch_point *, const clm_divergence_report *, size_t) =
    clm_divergence_report_point;
static void (*const p_divergence_report_free)(clm_divergence_report *) = clm_divergence_report_free;
static clm_status (*const p_engine_clm_anomalies)(clm_anomaly_report **, const clm_engine *) = clm_engine_clm_anomalies;
static size_t (*const p_anomaly_report_low_src_count)(const clm_anomaly_report *) = clm_anomaly_report_low_src_count;
static size_t (*const p_anomaly_report_event_count)(const clm_anomaly_report *) = clm_anomaly_report_event_count;
static int64_t (*const p_anomaly_report_window_ms)(const clm_anomaly_report *) = clm_anomaly_report_window_ms;
static int64_t (*const p_anomaly_report_min_sightings)(const clm_anomaly_report *) =
    clm_anomaly_report_min_sightings;
static float (*const p_anomaly_report_low_src)(const clm_anomaly_report *) = clm_anomaly_report_low_src;
static clm_status (*const p_anomaly_report_low_src_key)(clm_low_src_key *, const clm_anomaly_report *, size_t) =
    clm_anomaly_report_low_src_key;
static clm_status (*const p_anomaly_report_event)(clm_watch_event *, const clm_anomaly_report *, size_t) =
    clm_anomaly_report_event;
static clm_status (*const p_anomaly_report_event_json)(char *, size_t, size_t *, const clm_anomaly_report *, size_t) =
    clm_anomaly_report_event_json;
static void (*const p_anomaly_report_free)(clm_anomaly_report *) = clm_anomaly_report_free;

/* CLM suffix reuse: the SRC head. */
static clm_status (*const p_engine_load_src_head)(clm_engine *, const char *, int32_t) = clm_engine_load_src_head;
static clm_status (*const p_engine_set_src_head)(clm_engine *, int32_t, const float *, const float *, const float *,
                                                 float, int32_t) = clm_engine_set_src_head;
static clm_status (*const p_engine_src_step)(clm_src_decision *, clm_engine *, clm_seq *const *, size_t, const void *,
                                             int32_t, size_t, int32_t, const int32_t *,
                                             const int32_t *) = clm_engine_src_step;
static clm_status (*const p_engine_report_retrieval)(clm_engine *, clm_seq *const *, size_t,
                                                     const uint8_t *) = clm_engine_report_retrieval;

/* CLM suffix reuse: snapshots. */
static clm_status (*const p_engine_load_snapshot_projection)(clm_engine *,
                                                             const char *) = clm_engine_load_snapshot_projection;
static clm_status (*const p_engine_set_snapshot_projection)(clm_engine *, int32_t, int32_t, const float *,
                                                            const float *) = clm_engine_set_snapshot_projection;
static clm_status (*const p_engine_make_snapshots)(float *, size_t, clm_engine *, const void *, int32_t, size_t,
                                                   int32_t) = clm_engine_make_snapshots;
static clm_status (*const p_adapter_options_init)(clm_adapter_options *, size_t) = clm_adapter_options_init;
static clm_status (*const p_engine_load_snapshot_adapter)(clm_engine *, const char *,
                                                          const clm_adapter_options *) = clm_engine_load_snapshot_adapter;
static clm_status (*const p_engine_set_snapshot_adapter)(clm_engine *, int32_t, int32_t, const float *, const float *,
                                                         const clm_adapter_options *) = clm_engine_set_snapshot_adapter;
static clm_status (*const p_engine_inject_snapshots)(clm_engine *, void *, int32_t, size_t, int32_t, clm_seq *const *,
                                                     size_t, const int32_t *, const float *, int32_t, const uint8_t *,
                                                     int32_t) = clm_engine_inject_snapshots;

/* CLM suffix reuse: the snapshot store. */
static clm_status (*const p_suffix_key)(char *, size_t, size_t *, uint64_t *, const clm_engine *, const char *,
                                        size_t) = clm_suffix_key;
static clm_status (*const p_engine_lookup_snapshots)(clm_snapshot_hit *, float *, size_t, uint8_t *, clm_engine *,
                                                     clm_seq *const *, size_t, const char *const *, const size_t *,
                                                     const char *const *, const size_t *, int32_t, const float *,
                                                     size_t) = clm_engine_lookup_snapshots;
static clm_status (*const p_engine_record_snapshot)(int32_t *, int32_t *, clm_engine *, clm_seq *, const char *,
                                                    size_t, const char *, size_t, int32_t, const float *,
                                                    size_t) = clm_engine_record_snapshot;
static clm_status (*const p_engine_report_snapshot_outcome)(clm_engine *, clm_seq *const *, size_t,
                                                            const uint8_t *) = clm_engine_report_snapshot_outcome;
static clm_status (*const p_engine_set_fallback_snapshot)(clm_engine *, const char *, size_t, int32_t, const char *,
                                                          size_t, const float *,
                                                          size_t) = clm_engine_set_fallback_snapshot;
static clm_status (*const p_engine_flush_snapshot_store)(clm_engine *) = clm_engine_flush_snapshot_store;
static clm_status (*const p_engine_evict_snapshots)(int64_t *, clm_engine *) = clm_engine_evict_snapshots;

/* The snapshot store by hand. */
static clm_status (*const p_engine_snapshot_versions)(clm_snapshot_version*, size_t, size_t*, clm_engine*, const char*,
                                                      size_t, int32_t, const char*, size_t, const char*, size_t,
                                                      int32_t) = clm_engine_snapshot_versions;
static clm_status (*const p_engine_pin_snapshot_version)(clm_engine*, const char*, size_t, int32_t, const char*, size_t,
                                                         const char*, size_t, int32_t,
                                                         int32_t) = clm_engine_pin_snapshot_version;
static clm_status (*const p_engine_unpin_snapshot_version)(clm_engine*, const char*, size_t, int32_t, const char*,
                                                           size_t, const char*, size_t,
                                                           int32_t) = clm_engine_unpin_snapshot_version;
static clm_status (*const p_engine_roll_back_snapshot_key)(int64_t*, clm_engine*, const char*, size_t, int32_t,
                                                           const char*, size_t, const char*, size_t, int32_t,
                                                           int32_t) = clm_engine_roll_back_snapshot_key;
static clm_status (*const p_engine_delete_snapshot_key)(int64_t*, clm_engine*, const char*, size_t, int32_t,
                                                        const char*, size_t, const char*, size_t,
                                                        int32_t) = clm_engine_delete_snapshot_key;
static clm_status (*const p_engine_delete_snapshot_tenant)(int64_t*, clm_engine*, const char*, size_t,
                                                           int32_t) = clm_engine_delete_snapshot_tenant;
static clm_status (*const p_engine_blacklist_snapshot_key)(clm_engine*, const char*, size_t, int32_t, const char*,
                                                           size_t, const char*, size_t, int32_t, const char*, size_t,
                                                           int64_t) = clm_engine_blacklist_snapshot_key;
static clm_status (*const p_engine_snapshot_blacklist)(clm_snapshot_blacklist_entry *, size_t, size_t *,
                                                       clm_engine *) = clm_engine_snapshot_blacklist;
static clm_status (*const p_engine_unblacklist_snapshot_key)(clm_engine*, const char*, size_t, int32_t, const char*,
                                                             size_t, const char*, size_t,
                                                             int32_t) = clm_engine_unblacklist_snapshot_key;

/* Attention and KV kernels. */
static clm_status (*const p_attention_params_init)(clm_attention_params *, size_t) = clm_attention_params_init;
static clm_status (*const p_engine_write_kv)(clm_engine *, int32_t, const int64_t *, size_t, const float *,
                                             const float *, size_t, void *) = clm_engine_write_kv;
static clm_status (*const p_engine_paged_prefill_attention)(float *, size_t, const clm_engine *,
                                                            const clm_attention_params *, const float *, size_t,
                                                            int32_t, const int32_t *, size_t,
                                                            int32_t) = clm_engine_paged_prefill_attention;
static clm_status (*const p_engine_paged_decode_attention)(float *, size_t, const clm_engine *,
                                                           const clm_attention_params *, const float *, size_t,
                                                           const int32_t *, const int32_t *, size_t, const int32_t *,
                                                           size_t) = clm_engine_paged_decode_attention;
static clm_status (*const p_engine_copy_pages)(clm_engine *, const int32_t *, const clm_engine *, const int32_t *,
                                               size_t, void *) = clm_engine_copy_pages;
static clm_status (*const p_engine_gather_pages)(void *, size_t, const clm_engine *, const int32_t *, size_t,
                                                 void *) = clm_engine_gather_pages;
static clm_status (*const p_engine_scatter_pages)(clm_engine *, const int32_t *, size_t, const void *, size_t,
                                                  void *) = clm_engine_scatter_pages;

static int fail(const char *what, clm_status status) {
  fprintf(stderr, "c99_header: %s: %s (%d): %s\n", what, p_status_name(status), (int)status, p_last_error());
  return 1;
}

/* ---- static initialisers: each equals its init function's result ---------- */
/* The bytes of one field (a double or a pointer as much as an integer), named when they differ. */
static int same_bytes(const char *macro, const char *field, const void *from_macro, const void *from_init, size_t n) {
  if (memcmp(from_macro, from_init, n) == 0) return 1;
  fprintf(stderr, "c99_header: %s: %s differs from what its init function writes\n", macro, field);
  return 0;
}
#define SAME_FIELD(macro, m, i, field) same_bytes(macro, #field, &(m).field, &(i).field, sizeof(m).field)
/* Then the whole struct, which catches a field the list misses: its padding is
 * zero on both sides (a static object's; the init functions copy a
 * zero-initialised struct, or zero it). */
#define SAME_STRUCT(macro, m, i) same_bytes(macro, "the whole struct", &(m), &(i), sizeof(m))

static int engine_options_init_macro(void) {
  static const clm_engine_options m = CLM_ENGINE_OPTIONS_INIT;
  clm_engine_options i;
  const char *name = "CLM_ENGINE_OPTIONS_INIT";
  int same = 1;
  memset(&i, 0, sizeof i);
  if (p_engine_options_init(&i, sizeof i) != CLM_OK) return 0;
  same &= SAME_FIELD(name, m, i, struct_size);
  same &= SAME_FIELD(name, m, i, num_pages);
  same &= SAME_FIELD(name, m, i, page_size);
  same &= SAME_FIELD(name, m, i, num_layers);
  same &= SAME_FIELD(name, m, i, kv_heads);
  same &= SAME_FIELD(name, m, i, head_dim);
  same &= SAME_FIELD(name, m, i, kv_dtype);
  same &= SAME_FIELD(name, m, i, memory);
  same &= SAME_FIELD(name, m, i, device);
  same &= SAME_FIELD(name, m, i, eviction_policy);
  same &= SAME_FIELD(name, m, i, slru_protected_fraction);
  same &= SAME_FIELD(name, m, i, src_daily_requests);
  same &= SAME_FIELD(name, m, i, src_threshold);
  same &= SAME_FIELD(name, m, i, src_breaker_score);
  same &= SAME_FIELD(name, m, i, src_breaker_steps);
  same &= SAME_FIELD(name, m, i, special_token_ids);
  same &= SAME_FIELD(name, m, i, n_special_token_ids);
  same &= SAME_FIELD(name, m, i, snapshot_store_path);
  same &= SAME_FIELD(name, m, i, snapshot_store_shards);
  same &= SAME_FIELD(name, m, i, snapshot_dim);
  same &= SAME_FIELD(name, m, i, snapshot_min_usage);
  same &= SAME_FIELD(name, m, i, snapshot_version_cosine);
  same &= SAME_FIELD(name, m, i, snapshot_similarity_floor);
  same &= SAME_FIELD(name, m, i, snapshot_ann_ef_search);
  same &= SAME_FIELD(name, m, i, snapshot_lookup_timeout_us);
  same &= SAME_FIELD(name, m, i, host_pages);
  same &= SAME_FIELD(name, m, i, write_policy);
  same &= SAME_FIELD(name, m, i, storage_url);
  same &= SAME_FIELD(name, m, i, prefetch_policy);
  same &= SAME_FIELD(name, m, i, prefetch_timeout_ms);
  same &= SAME_FIELD(name, m, i, prefetch_timeout_per_1k_tokens_ms);
  same &= SAME_FIELD(name, m, i, storage_workers);
  same &= SAME_FIELD(name, m, i, storage_batch_pages);
  same &= SAME_FIELD(name, m, i, snapshot_read_only);
  same &= SAME_FIELD(name, m, i, snapshot_maintenance_interval_ms);
  same &= SAME_FIELD(name, m, i, model_id);
  same &= SAME_FIELD(name, m, i, page_secret_file);
  same &= SAME_FIELD(name, m, i, page_secret_env);
  same &= SAME_FIELD(name, m, i, max_queued_fetches);
  same &= SAME_FIELD(name, m, i, breaker_failures);
  same &= SAME_FIELD(name, m, i, admission_deadline_ms);
  same &= SAME_FIELD(name, m, i, breaker_open_ms);
  same &= SAME_FIELD(name, m, i, kv_events);
  same &= SAME_FIELD(name, m, i, kv_events_bind);
  same &= SAME_FIELD(name, m, i, kv_events_endpoint);
  same &= SAME_FIELD(name, m, i, kv_events_replay_endpoint);
  same &= SAME_FIELD(name, m, i, kv_events_topic);
  same &= SAME_FIELD(name, m, i, kv_events_callback);
  same &= SAME_FIELD(name, m, i, kv_events_callback_data);
  same &= SAME_FIELD(name, m, i, kv_events_layout);
  same &= SAME_FIELD(name, m, i, kv_events_batch_interval_ms);
  same &= SAME_FIELD(name, m, i, kv_events_max_batch_events);
  same &= SAME_FIELD(name, m, i, kv_events_queue_events);
  same &= SAME_FIELD(name, m, i, kv_events_buffer_batches);
  same &= SAME_FIELD(name, m, i, kv_events_send_hwm);
  same &= SAME_FIELD(name, m, i, kv_events_data_parallel_rank);
  same &= SAME_FIELD(name, m, i, kv_events_token_ids);
  same &= SAME_FIELD(name, m, i, divergence);
  same &= SAME_FIELD(name, m, i, divergence_branch_points);
  same &= SAME_FIELD(name, m, i, divergence_window_ms);
  same &= SAME_FIELD(name, m, i, divergence_context_tokens);
  same &= SAME_FIELD(name, m, i, clm_watch);
  same &= SAME_FIELD(name, m, i, clm_watch_max_keys);
  same &= SAME_FIELD(name, m, i, clm_watch_window_ms);
  same &= SAME_FIELD(name, m, i, clm_watch_min_sightings);
  same &= SAME_FIELD(name, m, i, clm_watch_low_src);
  same &= SAME_FIELD(name, m, i, clm_watch_max_events);
  same &= SAME_FIELD(name, m, i, clm_watch_callback);
  same &= SAME_FIELD(name, m, i, clm_watch_callback_data);
  return same & SAME_STRUCT(name, m, i);
}

static int admit_options_init_macro(void) {
  static const clm_admit_options m = CLM_ADMIT_OPTIONS_INIT;
  clm_admit_options i;
  const char *name = "CLM_ADMIT_OPTIONS_INIT";
  int same = 1;
  memset(&i, 0, sizeof i);
  if (p_admit_options_init(&i, sizeof i) != CLM_OK) return 0;
  same &= SAME_FIELD(name, m, i, struct_size);
  same &= SAME_FIELD(name, m, i, cache_salt);
  same &= SAME_FIELD(name, m, i, cache_salt_len);
  same &= SAME_FIELD(name, m, i, adapter_id);
  same &= SAME_FIELD(name, m, i, priority);
  same &= SAME_FIELD(name, m, i, priority_update);
  same &= SAME_FIELD(name, m, i, tenant);
  same &= SAME_FIELD(name, m, i, tenant_len);
  return same & SAME_STRUCT(name, m, i);
}

static int adapter_options_init_macro(void) {
  static const clm_adapter_options m = CLM_ADAPTER_OPTIONS_INIT;
  clm_adapter_options i;
  const char *name = "CLM_ADAPTER_OPTIONS_INIT";
  int same = 1;
  memset(&i, 0, sizeof i);
  if (p_adapter_options_init(&i, sizeof i) != CLM_OK) return 0;
  same &= SAME_FIELD(name, m, i, struct_size);
  same &= SAME_FIELD(name, m, i, num_layers);
  same &= SAME_FIELD(name, m, i, layers);
  same &= SAME_FIELD(name, m, i, n_layers);
  same &= SAME_FIELD(name, m, i, residual_scale);
  return same & SAME_STRUCT(name, m, i);
}

static int attention_params_init_macro(void) {
  static const clm_attention_params m = CLM_ATTENTION_PARAMS_INIT;
  clm_attention_params i;
  const char *name = "CLM_ATTENTION_PARAMS_INIT";
  int same = 1;
  memset(&i, 0, sizeof i);
  if (p_attention_params_init(&i, sizeof i) != CLM_OK) return 0;
  same &= SAME_FIELD(name, m, i, struct_size);
  same &= SAME_FIELD(name, m, i, layer);
  same &= SAME_FIELD(name, m, i, num_q_heads);
  same &= SAME_FIELD(name, m, i, softmax_scale);
  same &= SAME_FIELD(name, m, i, sliding_window);
  same &= SAME_FIELD(name, m, i, num_threads);
  same &= SAME_FIELD(name, m, i, stream);
  return same & SAME_STRUCT(name, m, i);
}

/* Creates an engine, runs one request through every call, frees it. */
int main(void) {
  clm_engine_options options;
  clm_admit_options admit;
  clm_kv_layout layout;
  clm_metrics metrics;
  clm_src_decision decision;
  clm_adapter_options adapter;
  clm_attention_params params;
  clm_engine *engine = NULL;
  clm_seq *seq = NULL;
  clm_seq *batch[1];
  const int32_t prompt[5] = {1, 2, 3, 4, 5};
  const int32_t decoded[1] = {6};
  int32_t indptr[2], indices[4], last_page_len[1];
  size_t n_indices = 0, n_pages = 0, n_slots = 0;
  size_t text_len = 0, again_len = 0;
  char text[16];
  static char whole_text[65536];
  const int32_t *pages;
  const int64_t *slots;
  clm_status s;
  const int kinds[] = {CLM_KV_F32,           CLM_KV_F16,         CLM_KV_BF16,     CLM_MEMORY_NONE, CLM_MEMORY_HOST,
                       CLM_MEMORY_DEVICE,    CLM_EVICT_LRU,      CLM_EVICT_LFU,   CLM_EVICT_SLRU,  CLM_EVICT_PRIORITY,
                       CLM_EVICT_GHOST_SLRU, CLM_PRIORITY_RAISE, CLM_PRIORITY_SET};
  const clm_status codes[] = {CLM_OK, CLM_ERR_INVALID_ARGUMENT, CLM_ERR_OUT_OF_MEMORY, CLM_ERR_NOT_FOUND,
                              CLM_ERR_FAILED_PRECONDITION, CLM_ERR_UNSUPPORTED, CLM_ERR_INTERNAL, CLM_ERR_IO};
  const int modes[] = {CLM_GELU_TANH, CLM_GELU_ERF, CLM_DTYPE_F32, CLM_DTYPE_F16, CLM_DTYPE_BF16};
  /* A hidden-4 SRC head, projection (snapshot_dim 1) and adapter. */
  const float w1[4] = {0.5f, -0.25f, 0.125f, 1.0f}, b1[1] = {0.0f}, w2[1] = {1.0f};
  const float mean[4] = {0.0f, 0.0f, 0.0f, 0.0f}, components[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  const float weight[4] = {1.0f, 2.0f, 3.0f, 4.0f}, bias[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int32_t adapter_layers[1] = {0}, row_ids[1] = {7}, row_indptr[2] = {0, 1};
  const uint8_t found[1] = {1}, apply[1] = {1};
  float rows[4] = {1.0f, 2.0f, 3.0f, 4.0f}, snapshot[1] = {0.0f}, q[1] = {0.0f}, out[1] = {0.0f};
  const int64_t kv_slots[1] = {0};
  const int32_t kv_pages[1] = {0}, kv_indptr[2] = {0, 1}, kv_last[1] = {1};
  unsigned char page_buffer[1];
  /* The snapshot store: a second engine, in memory, 2-float snapshots. */
  clm_engine* store_engine = NULL;
  clm_seq* store_seq = NULL;
  clm_snapshot_hit hit;
  clm_kv_event_batch kv_batch;
  clm_kv_event kv_event;
  clm_low_src_key low_key = CLM_LOW_SRC_KEY_INIT;
  clm_watch_event watch_event = CLM_WATCH_EVENT_INIT;
  const char *suffixes[1] = {"C99-KEY"};
  const size_t suffix_lens[1] = {7};
  const float stored[2] = {3.0f, 4.0f};
  float served[2] = {0.0f, 0.0f};
  uint8_t served_apply[1] = {0};
  const uint8_t correct[1] = {1};
  char key[CLM_SNAPSHOT_KEY_BYTES];
  size_t key_len = 0;
  uint64_t fingerprint = 0;
  int32_t record_result = -1, record_version = -1;
  int64_t deleted = -1;
  clm_snapshot_version versions[2];
  clm_snapshot_blacklist_entry blacklisted[1];
  size_t n_versions = 0;
  size_t i;

  use_types(&options, &admit, &layout, &metrics, &decision, &adapter, &params, &hit, &kv_batch, &kv_event, &low_key,
            &watch_event);
  (void)kinds;
  (void)modes;
  for (i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    if (strcmp(p_status_name(codes[i]), "unknown") == 0) return fail("status name", codes[i]);
  }
  {
    /* each runs in full, so that a failure names every field that differs */
    const int engine_ok = engine_options_init_macro(), admit_ok = admit_options_init_macro();
    const int adapter_ok = adapter_options_init_macro(), params_ok = attention_params_init_macro();
    if (!engine_ok || !admit_ok || !adapter_ok || !params_ok) {
      fprintf(stderr, "c99_header: a static initialiser (CLM_*_INIT) is not its init function's defaults\n");
      return 1;
    }
  }
  if (p_version() != CLM_VERSION_NUMBER) {
    fprintf(stderr, "c99_header: library %d (%s), header %d\n", p_version(), p_version_string(), CLM_VERSION_NUMBER);
    return 1;
  }

  if ((s = p_engine_options_init(&options, sizeof options)) != CLM_OK) return fail("engine_options_init", s);
  options.num_pages = 8;
  options.page_size = 4;
  options.memory = CLM_MEMORY_NONE;
  options.eviction_policy = CLM_EVICT_LRU;
  if ((s = p_engine_create(&engine, &options)) != CLM_OK) return fail("engine_create", s);
  memset(&layout, 0, sizeof layout);
  layout.struct_size = sizeof layout;
  if ((s = p_engine_kv_layout(&layout, engine)) != CLM_OK) return fail("engine_kv_layout", s);
  if (layout.base != NULL || layout.num_pages != 8 || layout.memory != CLM_MEMORY_NONE) {
    return fail("kv_layout contents", CLM_ERR_INTERNAL);
  }

  if ((s = p_admit_options_init(&admit, sizeof admit)) != CLM_OK) return fail("admit_options_init", s);
  admit.cache_salt = "c99";
  admit.cache_salt_len = 3;
  if ((s = p_engine_admit(&seq, engine, prompt, 5, &admit)) != CLM_OK) return fail("engine_admit", s);
  if (p_seq_cached_tokens(seq) != 0) return fail("seq_cached_tokens", CLM_ERR_INTERNAL);
  if (p_seq_host_tokens(seq) != 0 || p_seq_storage_tokens(seq) != 0) return fail("seq sources", CLM_ERR_INTERNAL);
  /* No tiers here: a prefetch is refused, and there is nothing to wait for. */
  if ((s = p_engine_prefetch(engine, prompt, 5, &admit)) != CLM_ERR_FAILED_PRECONDITION) return fail("prefetch", s);
  if ((s = p_engine_wait_for_tiers(engine)) != CLM_OK) return fail("wait_for_tiers", s);
  pages = p_seq_page_table(seq, &n_pages);
  slots = p_seq_slots(seq, &n_slots);
  if (!pages || n_pages != 2 || !slots || n_slots != 5) return fail("page table / slots", CLM_ERR_INTERNAL);
  if ((s = p_seq_extend(seq, decoded, 1)) != CLM_OK) return fail("seq_extend", s);
  batch[0] = seq;
  s = p_engine_batch_page_table(indptr, indices, 4, &n_indices, last_page_len, engine, batch, 1);
  if (s != CLM_OK) return fail("engine_batch_page_table", s);
  if (indptr[0] != 0 || indptr[1] != 2 || n_indices != 2 || last_page_len[0] != 2) {
    return fail("batch page table contents", CLM_ERR_INTERNAL);
  }

  /* CLM suffix reuse on the running sequence. */
  if ((s = p_engine_set_src_head(engine, 4, w1, b1, w2, 0.0f, CLM_GELU_ERF)) != CLM_OK) return fail("set_src_head", s);
  if ((s = p_engine_load_src_head(engine, "/nonexistent/head.safetensors", CLM_GELU_TANH)) != CLM_ERR_IO) {
    return fail("load_src_head of a missing file", s);
  }
  s = p_engine_src_step(&decision, engine, batch, 1, rows, CLM_DTYPE_F32, 1, 4, row_ids, row_indptr);
  if (s != CLM_OK) return fail("src_step", s);
  if (decision.scored != 1 || !(decision.score > 0.0f && decision.score < 1.0f)) {
    return fail("src_step decision", CLM_ERR_INTERNAL);
  }
  if ((s = p_engine_report_retrieval(engine, batch, 1, found)) != CLM_OK) return fail("report_retrieval", s);
  if ((s = p_engine_set_snapshot_projection(engine, 4, 1, mean, components)) != CLM_OK) {
    return fail("set_snapshot_projection", s);
  }
  if ((s = p_engine_load_snapshot_projection(engine, "/nonexistent/p.safetensors")) != CLM_ERR_IO) {
    return fail("load_snapshot_projection of a missing file", s);
  }
  s = p_engine_make_snapshots(snapshot, 1, engine, rows, CLM_DTYPE_F32, 1, 4);
  if (s != CLM_OK) return fail("make_snapshots", s);
  if (snapshot[0] != 1.0f) return fail("make_snapshots contents", CLM_ERR_INTERNAL);
  if ((s = p_adapter_options_init(&adapter, sizeof adapter)) != CLM_OK) return fail("adapter_options_init", s);
  adapter.num_layers = 1;
  adapter.layers = adapter_layers;
  adapter.n_layers = 1;
  adapter.residual_scale = 1.0f;
  if ((s = p_engine_set_snapshot_adapter(engine, 1, 4, weight, bias, &adapter)) != CLM_OK) {
    return fail("set_snapshot_adapter", s);
  }
  if ((s = p_engine_load_snapshot_adapter(engine, "/nonexistent/a.safetensors", &adapter)) != CLM_ERR_IO) {
    return fail("load_snapshot_adapter of a missing file", s);
  }
  s = p_engine_inject_snapshots(engine, rows, CLM_DTYPE_F32, 1, 4, batch, 1, row_indptr, snapshot, 1, apply, 0);
  if (s != CLM_OK) return fail("inject_snapshots", s);
  if (rows[0] != 2.0f || rows[3] != 8.0f) return fail("inject_snapshots contents", CLM_ERR_INTERNAL);

  /* The kernels: this pool keeps no KV bytes (CLM_MEMORY_NONE). */
  if ((s = p_attention_params_init(&params, sizeof params)) != CLM_OK) return fail("attention_params_init", s);
  params.num_q_heads = 1;
  if (params.stream != NULL) return fail("attention_params_init stream", CLM_ERR_INTERNAL);
  if ((s = p_engine_write_kv(engine, 0, kv_slots, 1, q, q, 1, NULL)) != CLM_ERR_FAILED_PRECONDITION) {
    return fail("write_kv without KV bytes", s);
  }
  s = p_engine_paged_prefill_attention(out, 1, engine, &params, q, 1, 1, kv_pages, 1, 1);
  if (s != CLM_ERR_FAILED_PRECONDITION) return fail("paged_prefill_attention without KV bytes", s);
  s = p_engine_paged_decode_attention(out, 1, engine, &params, q, 1, kv_indptr, kv_pages, 1, kv_last, 1);
  if (s != CLM_ERR_FAILED_PRECONDITION) return fail("paged_decode_attention without KV bytes", s);
  if ((s = p_engine_copy_pages(engine, kv_pages, engine, kv_pages, 1, NULL)) != CLM_ERR_FAILED_PRECONDITION) {
    return fail("copy_pages without KV bytes", s);
  }
  s = p_engine_gather_pages(page_buffer, sizeof page_buffer, engine, kv_pages, 1, NULL);
  if (s != CLM_ERR_FAILED_PRECONDITION) return fail("gather_pages without KV bytes", s);
  s = p_engine_scatter_pages(engine, kv_pages, 1, page_buffer, sizeof page_buffer, NULL);
  if (s != CLM_ERR_FAILED_PRECONDITION) return fail("scatter_pages without KV bytes", s);

  /* This engine has no snapshot store. */
  if ((s = p_engine_flush_snapshot_store(engine)) != CLM_ERR_FAILED_PRECONDITION) {
    return fail("flush_snapshot_store without a store", s);
  }

  if ((s = p_seq_finish(seq)) != CLM_OK) return fail("seq_finish", s);
  if ((s = p_seq_abort(seq)) != CLM_ERR_FAILED_PRECONDITION) return fail("seq_abort after finish", s);
  p_seq_free(seq);

  memset(&metrics, 0, sizeof metrics);
  metrics.struct_size = sizeof metrics;
  if ((s = p_engine_metrics(&metrics, engine)) != CLM_OK) return fail("engine_metrics", s);
  if (metrics.admitted != 1 || metrics.finished != 1 || metrics.cached_tokens != 4 || metrics.src_steps != 1 ||
      metrics.src_retrievals_found + metrics.src_retrievals_failed > 1 || metrics.src_injections != 1) {
    return fail("metrics contents", CLM_ERR_INTERNAL);
  }
  /* The metrics as Prometheus text: a sizing call, a buffer too small (left untouched), then room enough. */
  s = p_engine_metrics_text(NULL, 0, &text_len, engine);
  if (s != CLM_ERR_INVALID_ARGUMENT || text_len == 0) return fail("engine_metrics_text sizing call", s);
  memset(text, 'x', sizeof text);
  s = p_engine_metrics_text(text, sizeof text, &again_len, engine);
  if (s != CLM_ERR_INVALID_ARGUMENT || again_len != text_len || text[0] != 'x' || text[sizeof text - 1] != 'x') {
    return fail("engine_metrics_text into a buffer too small", s);
  }
  if (text_len >= sizeof whole_text) return fail("metrics text size", CLM_ERR_INTERNAL);
  if ((s = p_engine_metrics_text(whole_text, sizeof whole_text, &again_len, engine)) != CLM_OK) {
    return fail("engine_metrics_text", s);
  }
  if (again_len != text_len || strlen(whole_text) != text_len || strncmp(whole_text, "# HELP clm_", 11) != 0) {
    return fail("metrics text contents", CLM_ERR_INTERNAL);
  }
  /* KV events: this engine publishes none, and each call says so. */
  if ((s = p_engine_flush_kv_events(engine, 0)) != CLM_ERR_FAILED_PRECONDITION) return fail("flush_kv_events", s);
  if ((s = p_engine_kv_event_blocks(NULL, 0, &again_len, engine, CLM_KV_MEDIUM_GPU)) != CLM_ERR_FAILED_PRECONDITION) {
    return fail("kv_event_blocks", s);
  }
  if ((s = p_engine_kv_events_endpoint(text, sizeof text, &again_len, engine, 0)) != CLM_ERR_FAILED_PRECONDITION) {
    return fail("kv_events_endpoint", s);
  }
  if (metrics.has_kv_events != 0 || metrics.kv_events_published != 0) return fail("kv event metrics", CLM_ERR_INTERNAL);
  {
    /* Divergence: on by default; one request split nowhere, so no point. */
    clm_divergence_report *report = NULL;
    clm_branch_point point = CLM_BRANCH_POINT_INIT;
    if ((s = p_engine_divergence_report(&report, engine, 3, 1, NULL, 0)) != CLM_OK) return fail("divergence_report", s);
    if (p_divergence_report_count(report) != 0 || p_divergence_report_window_ms(report) != 3600000) {
      p_divergence_report_free(report);
      return fail("divergence report contents", CLM_ERR_INTERNAL);
    }
    s = p_divergence_report_point(&point, report, 0);
    p_divergence_report_free(report);
    if (s != CLM_ERR_INVALID_ARGUMENT) return fail("divergence_report_point past the end", s);
    if (metrics.match_depth_counts[0] != 1 || metrics.diverged_lookups != 0) {
      return fail("match depth metrics", CLM_ERR_INTERNAL);
    }
  }
  {
    /* CLM anomalies: this engine has no snapshot store, so no report. */
    clm_anomaly_report *report = NULL;
    size_t line_len = 0;
    if ((s = p_engine_clm_anomalies(&report, engine)) != CLM_ERR_FAILED_PRECONDITION || report != NULL) {
      return fail("clm_anomalies without a store", s);
    }
    if (p_anomaly_report_low_src_count(NULL) != 0 || p_anomaly_report_event_count(NULL) != 0 ||
        p_anomaly_report_window_ms(NULL) != 0 || p_anomaly_report_min_sightings(NULL) != 0 ||
        p_anomaly_report_low_src(NULL) != 0.0f) {
      return fail("anomaly report of NULL", CLM_ERR_INTERNAL);
    }
    if ((s = p_anomaly_report_low_src_key(&low_key, NULL, 0)) != CLM_ERR_INVALID_ARGUMENT) {
      return fail("low_src_key", s);
    }
    if ((s = p_anomaly_report_event(&watch_event, NULL, 0)) != CLM_ERR_INVALID_ARGUMENT) return fail("event", s);
    if ((s = p_anomaly_report_event_json(NULL, 0, &line_len, NULL, 0)) != CLM_ERR_INVALID_ARGUMENT) {
      return fail("event_json", s);
    }
    p_anomaly_report_free(NULL);
    if (metrics.clm_watch_sightings != 0 || metrics.clm_watch_watched_keys != 0) {
      return fail("clm watch metrics", CLM_ERR_INTERNAL);
    }
  }
  p_engine_free(engine);

  /* The snapshot store: record a host key, find it again at level 1. */
  if ((s = p_engine_options_init(&options, sizeof options)) != CLM_OK) return fail("engine_options_init", s);
  options.num_pages = 8;
  options.memory = CLM_MEMORY_NONE;
  options.snapshot_store_path = ":memory:";
  options.snapshot_store_shards = 1;
  options.snapshot_dim = 2;
  options.snapshot_min_usage = 1;
  if ((s = p_engine_create(&store_engine, &options)) != CLM_OK) return fail("engine_create with a store", s);
  if ((s = p_engine_admit(&store_seq, store_engine, prompt, 5, &admit)) != CLM_OK) return fail("engine_admit", s);
  s = p_engine_record_snapshot(&record_result, &record_version, store_engine, store_seq, suffixes[0], suffix_lens[0],
                               NULL, 0, CLM_SUFFIX_KEY, stored, 2);
  if (s != CLM_OK) return fail("engine_record_snapshot", s);
  if (record_result != CLM_RECORD_ADMITTED || record_version != 1) return fail("record result", CLM_ERR_INTERNAL);
  s = p_engine_lookup_snapshots(&hit, served, 2, served_apply, store_engine, &store_seq, 1, suffixes, suffix_lens, NULL,
                                NULL, CLM_SUFFIX_KEY, NULL, 0);
  if (s != CLM_OK) return fail("engine_lookup_snapshots", s);
  /* 3/5 and 4/5 are within f16's rounding of 0.6 and 0.8. */
  if (hit.level != CLM_SNAPSHOT_EXACT || served_apply[0] != 1 || strcmp(hit.key, "C99-KEY") != 0 ||
      hit.key_len != 7 || served[0] < 0.599f || served[0] > 0.601f || served[1] < 0.799f || served[1] > 0.801f) {
    return fail("lookup contents", CLM_ERR_INTERNAL);
  }
  if ((s = p_engine_report_snapshot_outcome(store_engine, &store_seq, 1, correct)) != CLM_OK) {
    return fail("engine_report_snapshot_outcome", s);
  }
  s = p_suffix_key(key, sizeof key, &key_len, &fingerprint, store_engine, "thanks", 6);
  if (s != CLM_OK) return fail("suffix_key", s);
  if (strcmp(key, "THANKS") != 0 || key_len != 6 || fingerprint == 0) return fail("suffix_key contents", s);
  s = p_engine_set_fallback_snapshot(store_engine, admit.cache_salt, admit.cache_salt_len, 0, "*", 1, stored, 2);
  if (s != CLM_OK) return fail("engine_set_fallback_snapshot", s);
  if ((s = p_engine_flush_snapshot_store(store_engine)) != CLM_OK) return fail("engine_flush_snapshot_store", s);
  if ((s = p_engine_evict_snapshots(&deleted, store_engine)) != CLM_OK) return fail("engine_evict_snapshots", s);
  memset(&metrics, 0, sizeof metrics);
  metrics.struct_size = sizeof metrics;
  if ((s = p_engine_metrics(&metrics, store_engine)) != CLM_OK) return fail("engine_metrics", s);
  if (deleted != 0 || metrics.has_snapshot_store != 1 || metrics.store_records != 1 || metrics.store_hits_exact != 1 ||
      metrics.store_snapshots != 1 || metrics.store_outcome_reports != 1) {
    return fail("store metrics contents", CLM_ERR_INTERNAL);
  }
  /* The store by hand: the key's one version, pinned and unpinned,
     blacklisted for an hour and lifted, then deleted. */
  s = p_engine_snapshot_versions(versions, 2, &n_versions, store_engine, admit.cache_salt, admit.cache_salt_len, 0,
                                 suffixes[0], suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY);
  if (s != CLM_OK) return fail("engine_snapshot_versions", s);
  if (n_versions != 1 || versions[0].version != 1 || versions[0].served != 1 || versions[0].readable != 1) {
    return fail("snapshot versions contents", CLM_ERR_INTERNAL);
  }
  s = p_engine_pin_snapshot_version(store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                    suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY, 1);
  if (s != CLM_OK) return fail("engine_pin_snapshot_version", s);
  s = p_engine_unpin_snapshot_version(store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                      suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY);
  if (s != CLM_OK) return fail("engine_unpin_snapshot_version", s);
  s = p_engine_blacklist_snapshot_key(store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                      suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY, "c99", 3,
                                      (int64_t)time(NULL) * 1000 + 3600000);
  if (s != CLM_OK) return fail("engine_blacklist_snapshot_key", s);
  s = p_engine_snapshot_blacklist(blacklisted, 1, &n_versions, store_engine);
  if (s != CLM_OK || n_versions != 1 || strcmp(blacklisted[0].key, "C99-KEY") != 0 || blacklisted[0].by_hand != 1) {
    return fail("engine_snapshot_blacklist", s);
  }
  s = p_engine_unblacklist_snapshot_key(store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                        suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY);
  if (s != CLM_OK) return fail("engine_unblacklist_snapshot_key", s);
  {
    /* CLM anomalies: the record (version 1), the blacklist, the unblacklist, in order. */
    clm_anomaly_report *report = NULL;
    char line[512];
    size_t line_len = 0;
    if ((s = p_engine_clm_anomalies(&report, store_engine)) != CLM_OK) return fail("engine_clm_anomalies", s);
    s = p_anomaly_report_event(&watch_event, report, 1);
    if (s == CLM_OK) s = p_anomaly_report_event_json(line, sizeof line, &line_len, report, 1);
    if (s == CLM_OK && p_anomaly_report_low_src_key(&low_key, report, 0) != CLM_ERR_INVALID_ARGUMENT) {
      s = CLM_ERR_INTERNAL;
    }
    if (s != CLM_OK || p_anomaly_report_event_count(report) != 3 || p_anomaly_report_low_src_count(report) != 0 ||
        p_anomaly_report_min_sightings(report) != 20 || watch_event.kind != CLM_WATCH_EVENT_BLACKLISTED ||
        watch_event.reason_len != 3 || strncmp(watch_event.reason, "c99", 3) != 0 || strlen(line) != line_len ||
        strstr(line, "\"event\":\"blacklisted\"") == NULL) {
      p_anomaly_report_free(report);
      return fail("clm anomaly report", s == CLM_OK ? CLM_ERR_INTERNAL : s);
    }
    p_anomaly_report_free(report);
  }
  s = p_engine_roll_back_snapshot_key(&deleted, store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                      suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY, 1);
  if (s != CLM_OK || deleted != 0) return fail("engine_roll_back_snapshot_key", s);
  s = p_engine_delete_snapshot_key(&deleted, store_engine, admit.cache_salt, admit.cache_salt_len, 0, suffixes[0],
                                   suffix_lens[0], NULL, 0, CLM_SUFFIX_KEY);
  if (s != CLM_OK || deleted != 1) return fail("engine_delete_snapshot_key", s);
  s = p_engine_delete_snapshot_tenant(&deleted, store_engine, admit.cache_salt, admit.cache_salt_len, 0);
  if (s != CLM_OK || deleted != 0) return fail("engine_delete_snapshot_tenant (its fallback)", s);
  p_seq_free(store_seq);
  p_engine_free(store_engine);
  printf("c99_header: clmcache %s, C99 header ok\n", p_version_string());
  return 0;
}
