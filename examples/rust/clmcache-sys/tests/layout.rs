//! Checks the #[repr(C)] declarations of src/lib.rs against the C compiler's
//! view of the installed clm.h (measured by probe/layout.c, see build.rs), and
//! against the sizes worked out by hand for LP64 targets.
use clmcache_sys::*;
use std::mem::{align_of, size_of, size_of_val, MaybeUninit};

mod c {
    include!(concat!(env!("OUT_DIR"), "/c_layout.rs"));
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

// (offset, size) of a field; std::mem::offset_of! needs Rust 1.77.
macro_rules! field {
    ($t:ident, $f:ident) => {{
        let value = MaybeUninit::<$t>::uninit();
        let base = value.as_ptr();
        // SAFETY: addr_of! only computes the address; nothing is read.
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        (concat!(stringify!($t), ".", stringify!($f)), field as usize - base as usize, size_of_pointee(field))
    }};
}

macro_rules! ty {
    ($t:ident) => {
        (stringify!($t), size_of::<$t>(), align_of::<$t>())
    };
}

macro_rules! constant {
    ($c:ident) => {
        (stringify!($c), $c as i64)
    };
}

fn rust_types() -> Vec<(&'static str, usize, usize)> {
    vec![
        ty!(clm_status),
        ty!(clm_engine_options),
        ty!(clm_kv_layout),
        ty!(clm_admit_options),
        ty!(clm_admission_plan),
        ty!(clm_metrics),
        ty!(clm_src_decision),
        ty!(clm_adapter_options),
        ty!(clm_attention_params),
        ty!(clm_snapshot_hit),
        ty!(clm_snapshot_version),
        ty!(clm_snapshot_blacklist_entry),
        ty!(clm_kv_event),
        ty!(clm_kv_event_batch),
        ty!(clm_branch_point),
        ty!(clm_low_src_key),
        ty!(clm_watch_event),
    ]
}

fn rust_fields() -> Vec<(&'static str, usize, usize)> {
    vec![
        field!(clm_engine_options, struct_size),
        field!(clm_engine_options, num_pages),
        field!(clm_engine_options, page_size),
        field!(clm_engine_options, num_layers),
        field!(clm_engine_options, kv_heads),
        field!(clm_engine_options, head_dim),
        field!(clm_engine_options, kv_dtype),
        field!(clm_engine_options, memory),
        field!(clm_engine_options, device),
        field!(clm_engine_options, eviction_policy),
        field!(clm_engine_options, slru_protected_fraction),
        field!(clm_engine_options, src_daily_requests),
        field!(clm_engine_options, src_threshold),
        field!(clm_engine_options, src_breaker_score),
        field!(clm_engine_options, src_breaker_steps),
        field!(clm_engine_options, special_token_ids),
        field!(clm_engine_options, n_special_token_ids),
        field!(clm_engine_options, snapshot_store_path),
        field!(clm_engine_options, snapshot_store_shards),
        field!(clm_engine_options, snapshot_dim),
        field!(clm_engine_options, snapshot_min_usage),
        field!(clm_engine_options, snapshot_version_cosine),
        field!(clm_engine_options, snapshot_similarity_floor),
        field!(clm_engine_options, snapshot_ann_ef_search),
        field!(clm_engine_options, snapshot_lookup_timeout_us),
        field!(clm_engine_options, host_pages),
        field!(clm_engine_options, write_policy),
        field!(clm_engine_options, storage_url),
        field!(clm_engine_options, prefetch_policy),
        field!(clm_engine_options, prefetch_timeout_ms),
        field!(clm_engine_options, prefetch_timeout_per_1k_tokens_ms),
        field!(clm_engine_options, storage_workers),
        field!(clm_engine_options, storage_batch_pages),
        field!(clm_engine_options, snapshot_read_only),
        field!(clm_engine_options, snapshot_maintenance_interval_ms),
        field!(clm_engine_options, model_id),
        field!(clm_engine_options, page_secret_file),
        field!(clm_engine_options, page_secret_env),
        field!(clm_engine_options, max_queued_fetches),
        field!(clm_engine_options, breaker_failures),
        field!(clm_engine_options, admission_deadline_ms),
        field!(clm_engine_options, breaker_open_ms),
        field!(clm_engine_options, kv_events),
        field!(clm_engine_options, kv_events_bind),
        field!(clm_engine_options, kv_events_endpoint),
        field!(clm_engine_options, kv_events_replay_endpoint),
        field!(clm_engine_options, kv_events_topic),
        field!(clm_engine_options, kv_events_callback),
        field!(clm_engine_options, kv_events_callback_data),
        field!(clm_engine_options, kv_events_layout),
        field!(clm_engine_options, kv_events_batch_interval_ms),
        field!(clm_engine_options, kv_events_max_batch_events),
        field!(clm_engine_options, kv_events_queue_events),
        field!(clm_engine_options, kv_events_buffer_batches),
        field!(clm_engine_options, kv_events_send_hwm),
        field!(clm_engine_options, kv_events_data_parallel_rank),
        field!(clm_engine_options, kv_events_token_ids),
        field!(clm_engine_options, divergence),
        field!(clm_engine_options, divergence_branch_points),
        field!(clm_engine_options, divergence_window_ms),
        field!(clm_engine_options, divergence_context_tokens),
        field!(clm_engine_options, clm_watch),
        field!(clm_engine_options, clm_watch_max_keys),
        field!(clm_engine_options, clm_watch_window_ms),
        field!(clm_engine_options, clm_watch_min_sightings),
        field!(clm_engine_options, clm_watch_low_src),
        field!(clm_engine_options, clm_watch_max_events),
        field!(clm_engine_options, clm_watch_callback),
        field!(clm_engine_options, clm_watch_callback_data),
        field!(clm_kv_layout, struct_size),
        field!(clm_kv_layout, base),
        field!(clm_kv_layout, page_bytes),
        field!(clm_kv_layout, layer_bytes),
        field!(clm_kv_layout, num_pages),
        field!(clm_kv_layout, page_size),
        field!(clm_kv_layout, num_layers),
        field!(clm_kv_layout, kv_heads),
        field!(clm_kv_layout, head_dim),
        field!(clm_kv_layout, kv_dtype),
        field!(clm_kv_layout, memory),
        field!(clm_admit_options, struct_size),
        field!(clm_admit_options, cache_salt),
        field!(clm_admit_options, cache_salt_len),
        field!(clm_admit_options, adapter_id),
        field!(clm_admit_options, priority),
        field!(clm_admit_options, priority_update),
        field!(clm_admit_options, tenant),
        field!(clm_admit_options, tenant_len),
        field!(clm_admission_plan, struct_size),
        field!(clm_admission_plan, cached_tokens),
        field!(clm_admission_plan, new_pages),
        field!(clm_admission_plan, unlocked_pages),
        field!(clm_admission_plan, pages_free),
        field!(clm_admission_plan, evictable_tokens),
        field!(clm_metrics, struct_size),
        field!(clm_metrics, tokens_queried),
        field!(clm_metrics, tokens_hit),
        field!(clm_metrics, hit_rate),
        field!(clm_metrics, cached_tokens),
        field!(clm_metrics, evictable_tokens),
        field!(clm_metrics, protected_tokens),
        field!(clm_metrics, pages_used),
        field!(clm_metrics, pages_free),
        field!(clm_metrics, evicted_tokens),
        field!(clm_metrics, evictions),
        field!(clm_metrics, inserted_tokens),
        field!(clm_metrics, admitted),
        field!(clm_metrics, finished),
        field!(clm_metrics, aborted),
        field!(clm_metrics, rejected),
        field!(clm_metrics, active_sequences),
        field!(clm_metrics, metadata_bytes),
        field!(clm_metrics, src_threshold),
        field!(clm_metrics, src_steps),
        field!(clm_metrics, src_unscored_steps),
        field!(clm_metrics, src_reuse_decisions),
        field!(clm_metrics, src_retrievals_found),
        field!(clm_metrics, src_retrievals_failed),
        field!(clm_metrics, src_breaker_trips),
        field!(clm_metrics, src_baseline_sequences),
        field!(clm_metrics, src_injections),
        field!(clm_metrics, store_lookups),
        field!(clm_metrics, store_hits_exact),
        field!(clm_metrics, store_hits_ann),
        field!(clm_metrics, store_hits_fallback),
        field!(clm_metrics, store_misses),
        field!(clm_metrics, store_busy_misses),
        field!(clm_metrics, store_blacklisted_skips),
        field!(clm_metrics, store_ann_unavailable),
        field!(clm_metrics, store_records),
        field!(clm_metrics, store_counted),
        field!(clm_metrics, store_admissions),
        field!(clm_metrics, store_confirmations),
        field!(clm_metrics, store_versions),
        field!(clm_metrics, store_drift_versions),
        field!(clm_metrics, store_evictions),
        field!(clm_metrics, store_corrupt_skipped),
        field!(clm_metrics, store_index_rebuilds),
        field!(clm_metrics, store_outcome_reports),
        field!(clm_metrics, store_snapshots),
        field!(clm_metrics, store_blacklisted_keys),
        field!(clm_metrics, has_snapshot_store),
        field!(clm_metrics, has_tiers),
        field!(clm_metrics, has_storage),
        field!(clm_metrics, device_hit_tokens),
        field!(clm_metrics, host_hit_tokens),
        field!(clm_metrics, storage_hit_tokens),
        field!(clm_metrics, load_backs),
        field!(clm_metrics, loaded_pages),
        field!(clm_metrics, backed_up_pages),
        field!(clm_metrics, stored_pages),
        field!(clm_metrics, fetched_pages),
        field!(clm_metrics, prefetch_timeouts),
        field!(clm_metrics, storage_errors),
        field!(clm_metrics, dropped_backups),
        field!(clm_metrics, host_cached_tokens),
        field!(clm_metrics, host_pages_used),
        field!(clm_metrics, host_pages_total),
        field!(clm_metrics, storage_corrupt_pages),
        field!(clm_metrics, storage_dropped_writes),
        field!(clm_metrics, storage_evicted_pages),
        field!(clm_metrics, storage_foreign_model_pages),
        field!(clm_metrics, storage_unsigned_pages),
        field!(clm_metrics, storage_forged_pages),
        field!(clm_metrics, storage_repaired_pages),
        field!(clm_metrics, tier_worker_failures),
        field!(clm_metrics, signed_pages),
        field!(clm_metrics, storage_breaker_state),
        field!(clm_metrics, storage_breaker_trips),
        field!(clm_metrics, storage_breaker_skips),
        field!(clm_metrics, dropped_fetches),
        field!(clm_metrics, merged_fetches),
        field!(clm_metrics, queued_fetches),
        field!(clm_metrics, has_kv_events),
        field!(clm_metrics, kv_events_resync_pending),
        field!(clm_metrics, kv_events_recorded),
        field!(clm_metrics, kv_events_published),
        field!(clm_metrics, kv_events_published_batches),
        field!(clm_metrics, kv_events_dropped),
        field!(clm_metrics, kv_events_resyncs),
        field!(clm_metrics, kv_events_replay_requests),
        field!(clm_metrics, kv_events_replay_refused),
        field!(clm_metrics, kv_events_send_failures),
        field!(clm_metrics, kv_events_queued),
        field!(clm_metrics, kv_events_next_sequence),
        field!(clm_metrics, diverged_lookups),
        field!(clm_metrics, match_depth_counts),
        field!(clm_metrics, match_depth_sum_tokens),
        field!(clm_metrics, clm_watch_sightings),
        field!(clm_metrics, clm_watch_low_src_turns),
        field!(clm_metrics, clm_watch_key_events),
        field!(clm_metrics, clm_watch_watched_keys),
        field!(clm_metrics, clm_watch_low_src_keys),
        field!(clm_kv_event, kind),
        field!(clm_kv_event, medium),
        field!(clm_kv_event, block_hashes),
        field!(clm_kv_event, n_block_hashes),
        field!(clm_kv_event, has_parent),
        field!(clm_kv_event, block_size),
        field!(clm_kv_event, parent_block_hash),
        field!(clm_kv_event, token_ids),
        field!(clm_kv_event, n_token_ids),
        field!(clm_kv_event, lora_id),
        field!(clm_kv_event, reserved),
        field!(clm_kv_event, extra_key),
        field!(clm_kv_event_batch, struct_size),
        field!(clm_kv_event_batch, data_parallel_rank),
        field!(clm_kv_event_batch, sequence),
        field!(clm_kv_event_batch, ts),
        field!(clm_kv_event_batch, events),
        field!(clm_kv_event_batch, n_events),
        field!(clm_branch_point, struct_size),
        field!(clm_branch_point, tenant),
        field!(clm_branch_point, tenant_len),
        field!(clm_branch_point, adapter_id),
        field!(clm_branch_point, depth),
        field!(clm_branch_point, branches),
        field!(clm_branch_point, hits),
        field!(clm_branch_point, overcount),
        field!(clm_branch_point, before),
        field!(clm_branch_point, n_before),
        field!(clm_branch_point, after),
        field!(clm_branch_point, n_after),
        field!(clm_branch_point, cached_after),
        field!(clm_branch_point, n_cached_after),
        field!(clm_low_src_key, struct_size),
        field!(clm_low_src_key, adapter_id),
        field!(clm_low_src_key, tenant),
        field!(clm_low_src_key, tenant_len),
        field!(clm_low_src_key, key),
        field!(clm_low_src_key, key_len),
        field!(clm_low_src_key, sightings),
        field!(clm_low_src_key, median_src),
        field!(clm_low_src_key, reserved),
        field!(clm_watch_event, struct_size),
        field!(clm_watch_event, kind),
        field!(clm_watch_event, time_ms),
        field!(clm_watch_event, tenant),
        field!(clm_watch_event, tenant_len),
        field!(clm_watch_event, key),
        field!(clm_watch_event, key_len),
        field!(clm_watch_event, reason),
        field!(clm_watch_event, reason_len),
        field!(clm_watch_event, until_ms),
        field!(clm_watch_event, adapter_id),
        field!(clm_watch_event, version),
        field!(clm_watch_event, by_breaker),
        field!(clm_watch_event, median_src),
        field!(clm_watch_event, sightings),
        field!(clm_src_decision, score),
        field!(clm_src_decision, threshold),
        field!(clm_src_decision, scored),
        field!(clm_src_decision, reuse),
        field!(clm_src_decision, baseline),
        field!(clm_src_decision, reserved),
        field!(clm_adapter_options, struct_size),
        field!(clm_adapter_options, num_layers),
        field!(clm_adapter_options, layers),
        field!(clm_adapter_options, n_layers),
        field!(clm_adapter_options, residual_scale),
        field!(clm_attention_params, struct_size),
        field!(clm_attention_params, layer),
        field!(clm_attention_params, num_q_heads),
        field!(clm_attention_params, softmax_scale),
        field!(clm_attention_params, sliding_window),
        field!(clm_attention_params, num_threads),
        field!(clm_attention_params, stream),
        field!(clm_snapshot_hit, level),
        field!(clm_snapshot_hit, similarity),
        field!(clm_snapshot_hit, version),
        field!(clm_snapshot_hit, key_len),
        field!(clm_snapshot_hit, fingerprint),
        field!(clm_snapshot_hit, stable),
        field!(clm_snapshot_hit, key_truncated),
        field!(clm_snapshot_hit, reserved),
        field!(clm_snapshot_hit, key),
        field!(clm_snapshot_version, version),
        field!(clm_snapshot_version, readable),
        field!(clm_snapshot_version, stable),
        field!(clm_snapshot_version, pinned),
        field!(clm_snapshot_version, served),
        field!(clm_snapshot_version, created_at),
        field!(clm_snapshot_version, last_used),
        field!(clm_snapshot_version, usage_count),
        field!(clm_snapshot_version, confirmations),
        field!(clm_snapshot_version, reserved),
        field!(clm_snapshot_blacklist_entry, until_ms),
        field!(clm_snapshot_blacklist_entry, fingerprint),
        field!(clm_snapshot_blacklist_entry, adapter_id),
        field!(clm_snapshot_blacklist_entry, salt_len),
        field!(clm_snapshot_blacklist_entry, key_len),
        field!(clm_snapshot_blacklist_entry, reason_len),
        field!(clm_snapshot_blacklist_entry, by_hand),
        field!(clm_snapshot_blacklist_entry, salt_truncated),
        field!(clm_snapshot_blacklist_entry, key_truncated),
        field!(clm_snapshot_blacklist_entry, reason_truncated),
        field!(clm_snapshot_blacklist_entry, reserved),
        field!(clm_snapshot_blacklist_entry, salt),
        field!(clm_snapshot_blacklist_entry, key),
        field!(clm_snapshot_blacklist_entry, reason),
    ]
}

fn rust_constants() -> Vec<(&'static str, i64)> {
    vec![
        constant!(CLM_VERSION_MAJOR),
        constant!(CLM_VERSION_MINOR),
        constant!(CLM_VERSION_PATCH),
        constant!(CLM_VERSION_NUMBER),
        constant!(CLM_OK),
        constant!(CLM_ERR_INVALID_ARGUMENT),
        constant!(CLM_ERR_OUT_OF_MEMORY),
        constant!(CLM_ERR_NOT_FOUND),
        constant!(CLM_ERR_FAILED_PRECONDITION),
        constant!(CLM_ERR_UNSUPPORTED),
        constant!(CLM_ERR_INTERNAL),
        constant!(CLM_ERR_IO),
        constant!(CLM_KV_F32),
        constant!(CLM_KV_F16),
        constant!(CLM_KV_BF16),
        constant!(CLM_MEMORY_NONE),
        constant!(CLM_MEMORY_HOST),
        constant!(CLM_MEMORY_DEVICE),
        constant!(CLM_EVICT_LRU),
        constant!(CLM_EVICT_LFU),
        constant!(CLM_EVICT_SLRU),
        constant!(CLM_EVICT_PRIORITY),
        constant!(CLM_EVICT_GHOST_SLRU),
        constant!(CLM_WRITE_THROUGH),
        constant!(CLM_WRITE_THROUGH_SELECTIVE),
        constant!(CLM_WRITE_BACK),
        constant!(CLM_PREFETCH_BEST_EFFORT),
        constant!(CLM_PREFETCH_WAIT_COMPLETE),
        constant!(CLM_PREFETCH_TIMEOUT),
        constant!(CLM_KV_EVENT_BLOCK_STORED),
        constant!(CLM_KV_EVENT_BLOCK_REMOVED),
        constant!(CLM_KV_EVENT_ALL_BLOCKS_CLEARED),
        constant!(CLM_KV_MEDIUM_GPU),
        constant!(CLM_KV_MEDIUM_CPU),
        constant!(CLM_KV_EVENTS_BIND_AUTO),
        constant!(CLM_KV_EVENTS_BIND),
        constant!(CLM_KV_EVENTS_CONNECT),
        constant!(CLM_KV_EVENTS_LAYOUT_ARRAY),
        constant!(CLM_KV_EVENTS_LAYOUT_LEGACY),
        constant!(CLM_KV_EVENTS_LAYOUT_MAP),
        constant!(CLM_WATCH_EVENT_BLACKLISTED),
        constant!(CLM_WATCH_EVENT_UNBLACKLISTED),
        constant!(CLM_WATCH_EVENT_VERSION_CREATED),
        constant!(CLM_WATCH_EVENT_DRIFT),
        constant!(CLM_WATCH_EVENT_LOW_SRC),
        constant!(CLM_GELU_TANH),
        constant!(CLM_GELU_ERF),
        constant!(CLM_DTYPE_F32),
        constant!(CLM_DTYPE_F16),
        constant!(CLM_DTYPE_BF16),
        constant!(CLM_SUFFIX_TEXT),
        constant!(CLM_SUFFIX_KEY),
        constant!(CLM_SNAPSHOT_MISS),
        constant!(CLM_SNAPSHOT_EXACT),
        constant!(CLM_SNAPSHOT_ANN),
        constant!(CLM_SNAPSHOT_FALLBACK),
        constant!(CLM_RECORD_COUNTED),
        constant!(CLM_RECORD_ADMITTED),
        constant!(CLM_RECORD_CONFIRMED),
        constant!(CLM_RECORD_NEW_VERSION),
        constant!(CLM_RECORD_DRIFTED),
        constant!(CLM_RECORD_ABSTAINED),
        constant!(CLM_SNAPSHOT_KEY_BYTES),
    ]
}

// Both tables must list the same names with the same values, so a field or
// macro added to clm.h but not here (or the reverse) fails too.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, c: &[(&str, T)], rust: &[(&str, T)]) {
    let mut problems = Vec::new();
    for (name, value) in c {
        match rust.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{} missing on the Rust side (C: {:?})", name, value)),
            Some((_, v)) if v != value => problems.push(format!("{}: C {:?}, Rust {:?}", name, value, v)),
            Some(_) => {}
        }
    }
    for (name, _) in rust {
        if !c.iter().any(|(n, _)| n == name) {
            problems.push(format!("{} is not measured by probe/layout.c", name));
        }
    }
    assert!(problems.is_empty(), "{} differ from clm.h:\n  {}", what, problems.join("\n  "));
}

fn probed() {
    if let Err(why) = c::C_PROBE {
        panic!("the C layout probe did not run ({}); see build.rs", why);
    }
}

#[test]
fn struct_sizes_and_alignments_match_c() {
    probed();
    let c: Vec<_> = c::C_TYPES.iter().map(|&(n, s, a)| (n, (s, a))).collect();
    let rust: Vec<_> = rust_types().into_iter().map(|(n, s, a)| (n, (s, a))).collect();
    same("sizes/alignments", &c, &rust);
}

#[test]
fn field_offsets_and_sizes_match_c() {
    probed();
    let c: Vec<_> = c::C_FIELDS.iter().map(|&(n, o, s)| (n, (o, s))).collect();
    let rust: Vec<_> = rust_fields().into_iter().map(|(n, o, s)| (n, (o, s))).collect();
    same("field offsets/sizes", &c, &rust);
}

#[test]
fn constants_match_c() {
    probed();
    same("constants", c::C_CONSTANTS, &rust_constants());
}

// Worked out by hand for LP64 (8-byte pointers, size_t and double, 4-byte int):
// engine options: u32 + 9 x i32 = 40, then the double at 40: 48 (version 1);
// version 2 appends a double at 48, two floats at 56 and 60, an i32 at 64,
// 4 bytes of padding, the pointer at 72 and the size_t at 80: 88; version 3
// the path pointer at 88, two i32 at 96 and 100, the i64 at 104, two floats
// at 112 and 116, two i32 at 120 and 124: 128; version 4 two i32 at 128 and
// 132, the URL pointer at 136, an i32 at 144, 4 bytes of padding, two
// doubles at 152 and 160, two i32 at 168 and 172: 176; version 5 an i32 at
// 176, 4 bytes of padding, the i64 at 184: 192; version 6 three pointers at
// 192..216, two i32 at 216 and 220, two doubles at 224 and 232: 240;
// version 7 two i32 at 240, five pointers (three strings, the callback, its
// data) at 248..288, eight i32 at 288..320: 320; version 8 four i32 at
// 320..336: 336; version 9 two i32 at 336 and 340, two i64 at 344 and 352,
// a float at 360, an i32 at 364, two pointers (the callback, its data) at
// 368..384: 384.
// kv layout: u32 at 0, pointer at 8, 2 x size_t -> 32, 7 x i32 = 28 -> 60,
// padded to 64.
// admit options: u32 at 0, pointer at 8, size_t at 16, 2 x i32 at 24: 32;
// version 2 an i32 at 32, padded to 40; version 3 the tenant pointer at 40
// and its size_t at 48: 56.
// metrics: u32 at 0, 6 x 8-byte fields at 8..56, 2 x i32 at 56, 7 x u64 at
// 64..120, i64 at 120, u64 at 128: 136 (version 1); version 2 appends nine
// 8-byte fields at 136..208: 208; version 3 twenty 8-byte fields at
// 208..368 and an i32 at 368, padded to 376; version 4 two i32 at 372 and
// 376, 4 bytes of padding, seventeen 8-byte fields at 384..520: 520;
// version 5 five u64 at 520..560, two i32 at 560 and 564, five 8-byte
// fields at 568..608: 608; version 6 two i32 at 608 and 612, ten 8-byte
// fields at 616..696: 696; version 7 a u64 at 696, nineteen u64 at 704..856
// and a u64 at 856: 864; version 8 two u64 at 864 and 872, four u64 at
// 880..912, two i64 at 912 and 920: 928.
// branch point: u32 at 0, pointer at 8, size_t at 16, two i32 at 24 and 28,
// three u64 at 32..56, three (pointer, size_t) pairs at 56..104: 104.
// low-SRC key: u32 at 0, pointer at 8, size_t at 16, two i32 at 24 and 28,
// pointer at 32, size_t at 40, u64 at 48, float at 56, padded to 64.
// watch event: u32 and i32 at 0 and 4, i64 at 8, three (pointer, size_t)
// pairs at 16..64, i64 at 64, four i32 at 72..88, u64 at 88, float at 96,
// padded to 104.
// snapshot hit: i32, f32, i32, u32 at 0..16, the u64 at 16, two u8 at 24
// and 25, 30 reserved bytes to 56, the key's 264 bytes: 320, aligned to 8.
// src decision: two floats at 0 and 4, four u8 at 8..12: 12, aligned to 4.
// adapter options: u32 at 0, i32 at 4, pointer at 8, size_t at 16, float at
// 24, padded to 32.
// attention params: u32 at 0, 5 x 4-byte fields at 4..24, pointer at 24: 32.
#[cfg(all(target_pointer_width = "64", not(windows)))]
#[test]
fn lp64_sizes_worked_out_by_hand() {
    assert_eq!(field!(clm_engine_options, slru_protected_fraction).1, 40);
    assert_eq!(field!(clm_engine_options, src_daily_requests).1, 48);
    assert_eq!(field!(clm_engine_options, src_threshold).1, 56);
    assert_eq!(field!(clm_engine_options, src_breaker_score).1, 60);
    assert_eq!(field!(clm_engine_options, src_breaker_steps).1, 64);
    assert_eq!(field!(clm_engine_options, special_token_ids).1, 72);
    assert_eq!(field!(clm_engine_options, n_special_token_ids).1, 80);
    assert_eq!(field!(clm_engine_options, snapshot_store_path).1, 88);
    assert_eq!(field!(clm_engine_options, snapshot_min_usage).1, 104);
    assert_eq!(field!(clm_engine_options, snapshot_lookup_timeout_us).1, 124);
    assert_eq!(size_of::<clm_engine_options>(), 384);
    assert_eq!(field!(clm_engine_options, host_pages).1, 128);
    assert_eq!(field!(clm_engine_options, storage_url).1, 136);
    assert_eq!(field!(clm_engine_options, prefetch_policy).1, 144);
    assert_eq!(field!(clm_engine_options, prefetch_timeout_ms).1, 152);
    assert_eq!(field!(clm_engine_options, storage_batch_pages).1, 172);
    assert_eq!(field!(clm_engine_options, snapshot_read_only).1, 176);
    assert_eq!(field!(clm_engine_options, snapshot_maintenance_interval_ms).1, 184);
    assert_eq!(field!(clm_engine_options, model_id).1, 192);
    assert_eq!(field!(clm_engine_options, page_secret_env).1, 208);
    assert_eq!(field!(clm_engine_options, max_queued_fetches).1, 216);
    assert_eq!(field!(clm_engine_options, breaker_open_ms).1, 232);
    assert_eq!(field!(clm_engine_options, kv_events).1, 240);
    assert_eq!(field!(clm_engine_options, kv_events_endpoint).1, 248);
    assert_eq!(field!(clm_engine_options, kv_events_callback).1, 272);
    assert_eq!(field!(clm_engine_options, kv_events_callback_data).1, 280);
    assert_eq!(field!(clm_engine_options, kv_events_layout).1, 288);
    assert_eq!(field!(clm_engine_options, kv_events_token_ids).1, 316);
    assert_eq!(field!(clm_engine_options, divergence).1, 320);
    assert_eq!(field!(clm_engine_options, divergence_branch_points).1, 324);
    assert_eq!(field!(clm_engine_options, divergence_window_ms).1, 328);
    assert_eq!(field!(clm_engine_options, divergence_context_tokens).1, 332);
    assert_eq!(field!(clm_engine_options, clm_watch).1, 336);
    assert_eq!(field!(clm_engine_options, clm_watch_max_keys).1, 340);
    assert_eq!(field!(clm_engine_options, clm_watch_window_ms).1, 344);
    assert_eq!(field!(clm_engine_options, clm_watch_min_sightings).1, 352);
    assert_eq!(field!(clm_engine_options, clm_watch_low_src).1, 360);
    assert_eq!(field!(clm_engine_options, clm_watch_max_events).1, 364);
    assert_eq!(field!(clm_engine_options, clm_watch_callback).1, 368);
    assert_eq!(field!(clm_engine_options, clm_watch_callback_data).1, 376);
    assert_eq!(size_of::<clm_kv_layout>(), 64);
    assert_eq!(field!(clm_kv_layout, base).1, 8);
    assert_eq!(field!(clm_kv_layout, memory).1, 56);
    assert_eq!(size_of::<clm_admit_options>(), 56);
    assert_eq!(field!(clm_admit_options, cache_salt).1, 8);
    assert_eq!(field!(clm_admit_options, priority).1, 28);
    assert_eq!(field!(clm_admit_options, priority_update).1, 32);
    assert_eq!(field!(clm_admit_options, tenant).1, 40);
    assert_eq!(field!(clm_admit_options, tenant_len).1, 48);
    assert_eq!(size_of::<clm_metrics>(), 928);
    assert_eq!(field!(clm_metrics, pages_used).1, 56);
    assert_eq!(field!(clm_metrics, evicted_tokens).1, 64);
    assert_eq!(field!(clm_metrics, active_sequences).1, 120);
    assert_eq!(field!(clm_metrics, metadata_bytes).1, 128);
    assert_eq!(field!(clm_metrics, src_threshold).1, 136);
    assert_eq!(field!(clm_metrics, src_baseline_sequences).1, 192);
    assert_eq!(field!(clm_metrics, src_injections).1, 200);
    assert_eq!(field!(clm_metrics, store_lookups).1, 208);
    assert_eq!(field!(clm_metrics, store_blacklisted_keys).1, 360);
    assert_eq!(field!(clm_metrics, has_snapshot_store).1, 368);
    assert_eq!(field!(clm_metrics, has_tiers).1, 372);
    assert_eq!(field!(clm_metrics, has_storage).1, 376);
    assert_eq!(field!(clm_metrics, device_hit_tokens).1, 384);
    assert_eq!(field!(clm_metrics, host_cached_tokens).1, 472);
    assert_eq!(field!(clm_metrics, storage_evicted_pages).1, 512);
    assert_eq!(field!(clm_metrics, tier_worker_failures).1, 552);
    assert_eq!(field!(clm_metrics, signed_pages).1, 560);
    assert_eq!(field!(clm_metrics, storage_breaker_state).1, 564);
    assert_eq!(field!(clm_metrics, queued_fetches).1, 600);
    assert_eq!(field!(clm_metrics, has_kv_events).1, 608);
    assert_eq!(field!(clm_metrics, kv_events_recorded).1, 616);
    assert_eq!(field!(clm_metrics, kv_events_next_sequence).1, 688);
    assert_eq!(field!(clm_metrics, diverged_lookups).1, 696);
    assert_eq!(field!(clm_metrics, match_depth_counts), ("clm_metrics.match_depth_counts", 704, 152));
    assert_eq!(field!(clm_metrics, match_depth_sum_tokens).1, 856);
    assert_eq!(field!(clm_metrics, clm_watch_sightings).1, 864);
    assert_eq!(field!(clm_metrics, clm_watch_low_src_turns).1, 872);
    assert_eq!(field!(clm_metrics, clm_watch_key_events), ("clm_metrics.clm_watch_key_events", 880, 32));
    assert_eq!(field!(clm_metrics, clm_watch_watched_keys).1, 912);
    assert_eq!(field!(clm_metrics, clm_watch_low_src_keys).1, 920);
    assert_eq!((size_of::<clm_kv_event>(), align_of::<clm_kv_event>()), (72, 8));
    assert_eq!(field!(clm_kv_event, parent_block_hash).1, 32);
    assert_eq!(field!(clm_kv_event, extra_key).1, 64);
    assert_eq!((size_of::<clm_kv_event_batch>(), align_of::<clm_kv_event_batch>()), (40, 8));
    assert_eq!(field!(clm_kv_event_batch, ts).1, 16);
    assert_eq!(field!(clm_kv_event_batch, n_events).1, 32);
    assert_eq!((size_of::<clm_branch_point>(), align_of::<clm_branch_point>()), (104, 8));
    assert_eq!(field!(clm_branch_point, tenant).1, 8);
    assert_eq!(field!(clm_branch_point, tenant_len).1, 16);
    assert_eq!(field!(clm_branch_point, adapter_id).1, 24);
    assert_eq!(field!(clm_branch_point, depth).1, 28);
    assert_eq!(field!(clm_branch_point, branches).1, 32);
    assert_eq!(field!(clm_branch_point, overcount).1, 48);
    assert_eq!(field!(clm_branch_point, before).1, 56);
    assert_eq!(field!(clm_branch_point, cached_after).1, 88);
    assert_eq!(field!(clm_branch_point, n_cached_after).1, 96);
    // No padding: a later version's fields go at the end.
    assert_eq!((size_of::<clm_low_src_key>(), align_of::<clm_low_src_key>()), (56, 8));
    assert_eq!(field!(clm_low_src_key, adapter_id).1, 4);
    assert_eq!(field!(clm_low_src_key, tenant).1, 8);
    assert_eq!(field!(clm_low_src_key, key).1, 24);
    assert_eq!(field!(clm_low_src_key, sightings).1, 40);
    assert_eq!(field!(clm_low_src_key, median_src).1, 48);
    assert_eq!(field!(clm_low_src_key, reserved).1, 52);
    assert_eq!((size_of::<clm_watch_event>(), align_of::<clm_watch_event>()), (96, 8));
    assert_eq!(field!(clm_watch_event, kind).1, 4);
    assert_eq!(field!(clm_watch_event, time_ms).1, 8);
    assert_eq!(field!(clm_watch_event, tenant).1, 16);
    assert_eq!(field!(clm_watch_event, reason_len).1, 56);
    assert_eq!(field!(clm_watch_event, until_ms).1, 64);
    assert_eq!(field!(clm_watch_event, adapter_id).1, 72);
    assert_eq!(field!(clm_watch_event, by_breaker).1, 80);
    assert_eq!(field!(clm_watch_event, median_src).1, 84);
    assert_eq!(field!(clm_watch_event, sightings).1, 88);
    assert_eq!((size_of::<clm_snapshot_hit>(), align_of::<clm_snapshot_hit>()), (320, 8));
    assert_eq!(field!(clm_snapshot_hit, fingerprint).1, 16);
    assert_eq!(field!(clm_snapshot_hit, stable).1, 24);
    assert_eq!(field!(clm_snapshot_hit, key).1, 56);
    assert_eq!((size_of::<clm_src_decision>(), align_of::<clm_src_decision>()), (12, 4));
    assert_eq!(field!(clm_src_decision, scored).1, 8);
    assert_eq!(field!(clm_src_decision, reserved).1, 11);
    assert_eq!((size_of::<clm_adapter_options>(), align_of::<clm_adapter_options>()), (32, 8));
    assert_eq!(field!(clm_adapter_options, layers).1, 8);
    assert_eq!(field!(clm_adapter_options, n_layers).1, 16);
    assert_eq!(field!(clm_adapter_options, residual_scale).1, 24);
    assert_eq!((size_of::<clm_attention_params>(), align_of::<clm_attention_params>()), (32, 8));
    assert_eq!(field!(clm_attention_params, softmax_scale).1, 12);
    assert_eq!(field!(clm_attention_params, num_threads).1, 20);
    assert_eq!(field!(clm_attention_params, stream).1, 24);
}

#[test]
fn links_and_agrees_on_the_version() {
    // SAFETY: both functions take nothing and return static data.
    let (number, string) = unsafe { (clm_version(), std::ffi::CStr::from_ptr(clm_version_string())) };
    assert_eq!(number, CLM_VERSION_NUMBER, "header/library version skew");
    let expected = format!("{}.{}.{}", CLM_VERSION_MAJOR, CLM_VERSION_MINOR, CLM_VERSION_PATCH);
    assert_eq!(string.to_str().unwrap(), expected);
}

#[test]
fn init_functions_accept_our_struct_sizes() {
    // The size of version 1 of clm_engine_options (up to slru_protected_fraction).
    let v1 = field!(clm_engine_options, slru_protected_fraction).1 + size_of::<f64>();
    // ... and of version 2 (up to n_special_token_ids).
    let v2 = field!(clm_engine_options, n_special_token_ids).1 + size_of::<usize>();
    // ... and of version 3 (up to snapshot_lookup_timeout_us).
    let v3 = field!(clm_engine_options, snapshot_lookup_timeout_us).1 + size_of::<i32>();
    // ... and of version 7 (up to kv_events_token_ids).
    let v7 = field!(clm_engine_options, kv_events_token_ids).1 + size_of::<i32>();
    // ... and of version 8 (up to divergence_context_tokens).
    let v8 = field!(clm_engine_options, divergence_context_tokens).1 + size_of::<i32>();
    // Version 2 of clm_admit_options (up to priority_update), padded to its alignment.
    let admit_v2 = (field!(clm_admit_options, priority_update).1 + size_of::<i32>() + 7) / 8 * 8;
    // SAFETY: each pointer is to a live, properly sized value.
    unsafe {
        let mut engine = MaybeUninit::<clm_engine_options>::zeroed().assume_init();
        assert_eq!(clm_engine_options_init(&mut engine, size_of::<clm_engine_options>()), CLM_OK);
        assert_eq!(engine.struct_size as usize, size_of::<clm_engine_options>());
        let mut admit = MaybeUninit::<clm_admit_options>::zeroed().assume_init();
        assert_eq!(clm_admit_options_init(&mut admit, size_of::<clm_admit_options>()), CLM_OK);
        assert_eq!(admit.struct_size as usize, size_of::<clm_admit_options>());
        assert_eq!((admit.tenant, admit.tenant_len), (std::ptr::null(), 0));
        // Version 2 of the admit options: the tenant (version 3) stays untouched.
        let name = b"x";
        let mut old_admit = clm_admit_options { tenant: name.as_ptr().cast(), tenant_len: 1, ..admit };
        assert_eq!(clm_admit_options_init(&mut old_admit, admit_v2), CLM_OK);
        assert_eq!((old_admit.struct_size as usize, old_admit.tenant_len), (admit_v2, 1));
        assert_eq!(old_admit.tenant, name.as_ptr().cast());
        let mut adapter = MaybeUninit::<clm_adapter_options>::zeroed().assume_init();
        assert_eq!(clm_adapter_options_init(&mut adapter, size_of::<clm_adapter_options>()), CLM_OK);
        assert_eq!(adapter.struct_size as usize, size_of::<clm_adapter_options>());
        assert_eq!((adapter.layers, adapter.n_layers, adapter.residual_scale), (std::ptr::null(), 0, 0.3));
        let mut params = MaybeUninit::<clm_attention_params>::zeroed().assume_init();
        assert_eq!(clm_attention_params_init(&mut params, size_of::<clm_attention_params>()), CLM_OK);
        assert_eq!(params.struct_size as usize, size_of::<clm_attention_params>());
        assert!(params.stream.is_null());
        // Version 1 of clm_engine_options (up to slru_protected_fraction) is
        // still a size the library knows: old callers keep working.
        // src_breaker_steps lies beyond v1: it must stay untouched.
        let mut old = clm_engine_options { src_breaker_steps: -7, ..clm_engine_options::default() };
        assert_eq!(clm_engine_options_init(&mut old, v1), CLM_OK);
        assert_eq!((old.struct_size as usize, old.page_size, old.src_breaker_steps), (v1, 16, -7));
        assert_eq!(engine.src_breaker_steps, 3);
        assert_eq!(engine.src_threshold, -1.0);
        assert_eq!(engine.src_daily_requests, 10000.0);
        // Version 3: the store's defaults, and no store unless a path is set.
        assert!(engine.snapshot_store_path.is_null());
        assert_eq!((engine.snapshot_store_shards, engine.snapshot_dim, engine.snapshot_min_usage), (16, 256, 50));
        assert_eq!((engine.snapshot_version_cosine, engine.snapshot_similarity_floor), (0.95, 0.8));
        assert_eq!((engine.snapshot_ann_ef_search, engine.snapshot_lookup_timeout_us), (128, 2000));
        // Version 2 (up to n_special_token_ids) too: the version-3 fields stay untouched.
        let mut old2 = clm_engine_options { snapshot_dim: -7, ..clm_engine_options::default() };
        assert_eq!(clm_engine_options_init(&mut old2, v2), CLM_OK);
        assert_eq!((old2.struct_size as usize, old2.src_breaker_steps, old2.snapshot_dim), (v2, 3, -7));
        // Version 4: no tiers by default, and the tiers' defaults.
        assert_eq!((engine.host_pages, engine.write_policy), (0, CLM_WRITE_THROUGH));
        assert!(engine.storage_url.is_null());
        assert_eq!(engine.prefetch_policy, CLM_PREFETCH_TIMEOUT);
        assert_eq!((engine.prefetch_timeout_ms, engine.prefetch_timeout_per_1k_tokens_ms), (20.0, 10.0));
        assert_eq!((engine.storage_workers, engine.storage_batch_pages), (2, 32));
        assert_eq!((engine.snapshot_read_only, engine.snapshot_maintenance_interval_ms), (0, 0));
        // Version 3 (up to snapshot_lookup_timeout_us): the version-4 fields stay untouched.
        let mut old3 = clm_engine_options { host_pages: -7, ..clm_engine_options::default() };
        assert_eq!(clm_engine_options_init(&mut old3, v3), CLM_OK);
        assert_eq!((old3.struct_size as usize, old3.snapshot_dim, old3.host_pages), (v3, 256, -7));
        // Version 8: divergence counting on, and its defaults.
        assert_eq!((engine.divergence, engine.divergence_branch_points), (1, 256));
        assert_eq!((engine.divergence_window_ms, engine.divergence_context_tokens), (3600000, 8));
        // Version 7 (up to kv_events_token_ids): the version-8 fields stay untouched.
        let mut old7 = clm_engine_options { divergence: -7, divergence_context_tokens: -7, ..Default::default() };
        assert_eq!(clm_engine_options_init(&mut old7, v7), CLM_OK);
        assert_eq!((old7.struct_size as usize, old7.kv_events_token_ids), (v7, 1));
        assert_eq!((old7.divergence, old7.divergence_context_tokens), (-7, -7));
        // Version 9: the CLM watch on, its defaults, no callback.
        assert_eq!((engine.clm_watch, engine.clm_watch_max_keys, engine.clm_watch_max_events), (1, 4096, 1024));
        assert_eq!((engine.clm_watch_window_ms, engine.clm_watch_min_sightings), (3600000, 20));
        assert_eq!(engine.clm_watch_low_src, 0.2);
        assert!(engine.clm_watch_callback.is_none() && engine.clm_watch_callback_data.is_null());
        // Version 8 (up to divergence_context_tokens): the version-9 fields stay untouched.
        let mut old8 = clm_engine_options { clm_watch: -7, clm_watch_max_events: -7, ..Default::default() };
        assert_eq!(clm_engine_options_init(&mut old8, v8), CLM_OK);
        assert_eq!((old8.struct_size as usize, old8.divergence_context_tokens), (v8, 8));
        assert_eq!((old8.clm_watch, old8.clm_watch_max_events), (-7, -7));
        // One byte more than ours, or one byte short of version 1, is a size
        // this library does not know (any size from version 1's to ours is
        // accepted, so older callers keep working).
        let mut big = [0u64; 64]; // room for the size passed, should the library write it
        assert!(size_of_val(&big) > size_of::<clm_engine_options>());
        let big_ptr = big.as_mut_ptr() as *mut clm_engine_options;
        assert_eq!(clm_engine_options_init(big_ptr, size_of::<clm_engine_options>() + 1), CLM_ERR_INVALID_ARGUMENT);
        assert_eq!(clm_engine_options_init(&mut engine, v1 - 1), CLM_ERR_INVALID_ARGUMENT);
        assert!(!std::ffi::CStr::from_ptr(clm_last_error()).to_bytes().is_empty());
    }
}
