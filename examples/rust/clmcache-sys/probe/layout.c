/* Compiled and run by build.rs against the installed clm.h: prints, as Rust
 * source, the size and alignment of each struct, the offset and size of each
 * field, and the value of each macro, so tests/layout.rs can compare them
 * with the #[repr(C)] declarations of src/lib.rs. */
#include <stddef.h>
#include <stdio.h>

#include "clm.h"

#define TYPE(T) printf("    (\"%s\", %zu, %zu),\n", #T, sizeof(T), (size_t)_Alignof(T))
#define FIELD(T, f) printf("    (\"%s.%s\", %zu, %zu),\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))
#define CONST(c) printf("    (\"%s\", %lld),\n", #c, (long long)(c))

int main(void) {
  printf("pub const C_TYPES: &[(&str, usize, usize)] = &[\n");
  TYPE(clm_status);
  TYPE(clm_engine_options);
  TYPE(clm_kv_layout);
  TYPE(clm_admit_options);
  TYPE(clm_admission_plan);
  TYPE(clm_metrics);
  TYPE(clm_src_decision);
  TYPE(clm_adapter_options);
  TYPE(clm_attention_params);
  TYPE(clm_snapshot_hit);
  TYPE(clm_snapshot_version);
  printf("];\n");

  printf("pub const C_FIELDS: &[(&str, usize, usize)] = &[\n");
  FIELD(clm_engine_options, struct_size);
  FIELD(clm_engine_options, num_pages);
  FIELD(clm_engine_options, page_size);
  FIELD(clm_engine_options, num_layers);
  FIELD(clm_engine_options, kv_heads);
  FIELD(clm_engine_options, head_dim);
  FIELD(clm_engine_options, kv_dtype);
  FIELD(clm_engine_options, memory);
  FIELD(clm_engine_options, device);
  FIELD(clm_engine_options, eviction_policy);
  FIELD(clm_engine_options, slru_protected_fraction);
  FIELD(clm_engine_options, src_daily_requests);
  FIELD(clm_engine_options, src_threshold);
  FIELD(clm_engine_options, src_breaker_score);
  FIELD(clm_engine_options, src_breaker_steps);
  FIELD(clm_engine_options, special_token_ids);
  FIELD(clm_engine_options, n_special_token_ids);
  FIELD(clm_engine_options, snapshot_store_path);
  FIELD(clm_engine_options, snapshot_store_shards);
  FIELD(clm_engine_options, snapshot_dim);
  FIELD(clm_engine_options, snapshot_min_usage);
  FIELD(clm_engine_options, snapshot_version_cosine);
  FIELD(clm_engine_options, snapshot_similarity_floor);
  FIELD(clm_engine_options, snapshot_ann_ef_search);
  FIELD(clm_engine_options, snapshot_lookup_timeout_us);
  FIELD(clm_engine_options, host_pages);
  FIELD(clm_engine_options, write_policy);
  FIELD(clm_engine_options, storage_url);
  FIELD(clm_engine_options, prefetch_policy);
  FIELD(clm_engine_options, prefetch_timeout_ms);
  FIELD(clm_engine_options, prefetch_timeout_per_1k_tokens_ms);
  FIELD(clm_engine_options, storage_workers);
  FIELD(clm_engine_options, storage_batch_pages);

  FIELD(clm_kv_layout, struct_size);
  FIELD(clm_kv_layout, base);
  FIELD(clm_kv_layout, page_bytes);
  FIELD(clm_kv_layout, layer_bytes);
  FIELD(clm_kv_layout, num_pages);
  FIELD(clm_kv_layout, page_size);
  FIELD(clm_kv_layout, num_layers);
  FIELD(clm_kv_layout, kv_heads);
  FIELD(clm_kv_layout, head_dim);
  FIELD(clm_kv_layout, kv_dtype);
  FIELD(clm_kv_layout, memory);

  FIELD(clm_admit_options, struct_size);
  FIELD(clm_admit_options, cache_salt);
  FIELD(clm_admit_options, cache_salt_len);
  FIELD(clm_admit_options, adapter_id);
  FIELD(clm_admit_options, priority);
  FIELD(clm_admit_options, priority_update);
  FIELD(clm_admission_plan, struct_size);
  FIELD(clm_admission_plan, cached_tokens);
  FIELD(clm_admission_plan, new_pages);
  FIELD(clm_admission_plan, unlocked_pages);
  FIELD(clm_admission_plan, pages_free);
  FIELD(clm_admission_plan, evictable_tokens);

  FIELD(clm_metrics, struct_size);
  FIELD(clm_metrics, tokens_queried);
  FIELD(clm_metrics, tokens_hit);
  FIELD(clm_metrics, hit_rate);
  FIELD(clm_metrics, cached_tokens);
  FIELD(clm_metrics, evictable_tokens);
  FIELD(clm_metrics, protected_tokens);
  FIELD(clm_metrics, pages_used);
  FIELD(clm_metrics, pages_free);
  FIELD(clm_metrics, evicted_tokens);
  FIELD(clm_metrics, evictions);
  FIELD(clm_metrics, inserted_tokens);
  FIELD(clm_metrics, admitted);
  FIELD(clm_metrics, finished);
  FIELD(clm_metrics, aborted);
  FIELD(clm_metrics, rejected);
  FIELD(clm_metrics, active_sequences);
  FIELD(clm_metrics, metadata_bytes);
  FIELD(clm_metrics, src_threshold);
  FIELD(clm_metrics, src_steps);
  FIELD(clm_metrics, src_unscored_steps);
  FIELD(clm_metrics, src_reuse_decisions);
  FIELD(clm_metrics, src_retrievals_found);
  FIELD(clm_metrics, src_retrievals_failed);
  FIELD(clm_metrics, src_breaker_trips);
  FIELD(clm_metrics, src_baseline_sequences);
  FIELD(clm_metrics, src_injections);
  FIELD(clm_metrics, store_lookups);
  FIELD(clm_metrics, store_hits_exact);
  FIELD(clm_metrics, store_hits_ann);
  FIELD(clm_metrics, store_hits_fallback);
  FIELD(clm_metrics, store_misses);
  FIELD(clm_metrics, store_busy_misses);
  FIELD(clm_metrics, store_blacklisted_skips);
  FIELD(clm_metrics, store_ann_unavailable);
  FIELD(clm_metrics, store_records);
  FIELD(clm_metrics, store_counted);
  FIELD(clm_metrics, store_admissions);
  FIELD(clm_metrics, store_confirmations);
  FIELD(clm_metrics, store_versions);
  FIELD(clm_metrics, store_drift_versions);
  FIELD(clm_metrics, store_evictions);
  FIELD(clm_metrics, store_corrupt_skipped);
  FIELD(clm_metrics, store_index_rebuilds);
  FIELD(clm_metrics, store_outcome_reports);
  FIELD(clm_metrics, store_snapshots);
  FIELD(clm_metrics, store_blacklisted_keys);
  FIELD(clm_metrics, has_snapshot_store);
  FIELD(clm_metrics, has_tiers);
  FIELD(clm_metrics, has_storage);
  FIELD(clm_metrics, device_hit_tokens);
  FIELD(clm_metrics, host_hit_tokens);
  FIELD(clm_metrics, storage_hit_tokens);
  FIELD(clm_metrics, load_backs);
  FIELD(clm_metrics, loaded_pages);
  FIELD(clm_metrics, backed_up_pages);
  FIELD(clm_metrics, stored_pages);
  FIELD(clm_metrics, fetched_pages);
  FIELD(clm_metrics, prefetch_timeouts);
  FIELD(clm_metrics, storage_errors);
  FIELD(clm_metrics, dropped_backups);
  FIELD(clm_metrics, host_cached_tokens);
  FIELD(clm_metrics, host_pages_used);
  FIELD(clm_metrics, host_pages_total);
  FIELD(clm_metrics, storage_corrupt_pages);
  FIELD(clm_metrics, storage_dropped_writes);
  FIELD(clm_metrics, storage_evicted_pages);

  FIELD(clm_src_decision, score);
  FIELD(clm_src_decision, threshold);
  FIELD(clm_src_decision, scored);
  FIELD(clm_src_decision, reuse);
  FIELD(clm_src_decision, baseline);
  FIELD(clm_src_decision, reserved);

  FIELD(clm_adapter_options, struct_size);
  FIELD(clm_adapter_options, num_layers);
  FIELD(clm_adapter_options, layers);
  FIELD(clm_adapter_options, n_layers);
  FIELD(clm_adapter_options, residual_scale);

  FIELD(clm_attention_params, struct_size);
  FIELD(clm_attention_params, layer);
  FIELD(clm_attention_params, num_q_heads);
  FIELD(clm_attention_params, softmax_scale);
  FIELD(clm_attention_params, sliding_window);
  FIELD(clm_attention_params, num_threads);
  FIELD(clm_attention_params, stream);

  FIELD(clm_snapshot_hit, level);
  FIELD(clm_snapshot_hit, similarity);
  FIELD(clm_snapshot_hit, version);
  FIELD(clm_snapshot_hit, key_len);
  FIELD(clm_snapshot_hit, fingerprint);
  FIELD(clm_snapshot_hit, stable);
  FIELD(clm_snapshot_hit, key_truncated);
  FIELD(clm_snapshot_hit, reserved);
  FIELD(clm_snapshot_hit, key);
  FIELD(clm_snapshot_version, version);
  FIELD(clm_snapshot_version, readable);
  FIELD(clm_snapshot_version, stable);
  FIELD(clm_snapshot_version, pinned);
  FIELD(clm_snapshot_version, served);
  FIELD(clm_snapshot_version, created_at);
  FIELD(clm_snapshot_version, last_used);
  FIELD(clm_snapshot_version, usage_count);
  FIELD(clm_snapshot_version, confirmations);
  FIELD(clm_snapshot_version, reserved);
  printf("];\n");

  printf("pub const C_CONSTANTS: &[(&str, i64)] = &[\n");
  CONST(CLM_VERSION_MAJOR);
  CONST(CLM_VERSION_MINOR);
  CONST(CLM_VERSION_PATCH);
  CONST(CLM_VERSION_NUMBER);
  CONST(CLM_OK);
  CONST(CLM_ERR_INVALID_ARGUMENT);
  CONST(CLM_ERR_OUT_OF_MEMORY);
  CONST(CLM_ERR_NOT_FOUND);
  CONST(CLM_ERR_FAILED_PRECONDITION);
  CONST(CLM_ERR_UNSUPPORTED);
  CONST(CLM_ERR_INTERNAL);
  CONST(CLM_ERR_IO);
  CONST(CLM_KV_F32);
  CONST(CLM_KV_F16);
  CONST(CLM_KV_BF16);
  CONST(CLM_MEMORY_NONE);
  CONST(CLM_MEMORY_HOST);
  CONST(CLM_MEMORY_DEVICE);
  CONST(CLM_EVICT_LRU);
  CONST(CLM_EVICT_LFU);
  CONST(CLM_EVICT_SLRU);
  CONST(CLM_EVICT_PRIORITY);
  CONST(CLM_EVICT_GHOST_SLRU);
  CONST(CLM_WRITE_THROUGH);
  CONST(CLM_WRITE_THROUGH_SELECTIVE);
  CONST(CLM_WRITE_BACK);
  CONST(CLM_PREFETCH_BEST_EFFORT);
  CONST(CLM_PREFETCH_WAIT_COMPLETE);
  CONST(CLM_PREFETCH_TIMEOUT);
  CONST(CLM_GELU_TANH);
  CONST(CLM_GELU_ERF);
  CONST(CLM_DTYPE_F32);
  CONST(CLM_DTYPE_F16);
  CONST(CLM_DTYPE_BF16);
  CONST(CLM_SUFFIX_TEXT);
  CONST(CLM_SUFFIX_KEY);
  CONST(CLM_SNAPSHOT_MISS);
  CONST(CLM_SNAPSHOT_EXACT);
  CONST(CLM_SNAPSHOT_ANN);
  CONST(CLM_SNAPSHOT_FALLBACK);
  CONST(CLM_RECORD_COUNTED);
  CONST(CLM_RECORD_ADMITTED);
  CONST(CLM_RECORD_CONFIRMED);
  CONST(CLM_RECORD_NEW_VERSION);
  CONST(CLM_RECORD_DRIFTED);
  CONST(CLM_RECORD_ABSTAINED);
  CONST(CLM_SNAPSHOT_KEY_BYTES);
  printf("];\n");
  return 0;
}
