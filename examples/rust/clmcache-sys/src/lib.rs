//! Raw, hand-written bindings to clmcache's stable C ABI (`clm.h`).
//!
//! Every function, struct and constant of the header is declared here, with
//! the same names. The structs are `#[repr(C)]` and laid out exactly as the C
//! compiler lays them out; `tests/layout.rs` checks that against the installed
//! header at test time. Nothing here is safe to call without reading `clm.h`;
//! the `clmcache` crate is the safe wrapper.
//!
//! Linking: `build.rs` finds `libclmcache` under `$CLMCACHE_PREFIX/lib` or via
//! `pkg-config clmcache`, links it dynamically, and exports the directory to
//! dependents as `DEP_CLMCACHE_LIBDIR` (and the header's as
//! `DEP_CLMCACHE_INCLUDE`).
#![allow(non_camel_case_types)]

use std::marker::{PhantomData, PhantomPinned};
// core::ffi::c_char and friends need Rust 1.64; std::os::raw has the same
// types and works on 1.63.
pub use std::os::raw::{c_char, c_int, c_void};

// ---- version ----------------------------------------------------------------
pub const CLM_VERSION_MAJOR: c_int = 0;
pub const CLM_VERSION_MINOR: c_int = 1;
pub const CLM_VERSION_PATCH: c_int = 0;
pub const CLM_VERSION_NUMBER: c_int = CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH;

// ---- status codes -------------------------------------------------------------
pub type clm_status = i32;
pub const CLM_OK: clm_status = 0;
pub const CLM_ERR_INVALID_ARGUMENT: clm_status = -1;
pub const CLM_ERR_OUT_OF_MEMORY: clm_status = -2;
pub const CLM_ERR_NOT_FOUND: clm_status = -3;
pub const CLM_ERR_FAILED_PRECONDITION: clm_status = -4;
pub const CLM_ERR_UNSUPPORTED: clm_status = -5;
pub const CLM_ERR_INTERNAL: clm_status = -6;
pub const CLM_ERR_IO: clm_status = -7;

// ---- engine -------------------------------------------------------------------
/// Opaque engine handle (`clm_engine`); only ever used behind a pointer.
#[repr(C)]
pub struct clm_engine {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
/// Opaque sequence handle (`clm_seq`); only ever used behind a pointer.
#[repr(C)]
pub struct clm_seq {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

pub const CLM_KV_F32: i32 = 0;
pub const CLM_KV_F16: i32 = 1;
pub const CLM_KV_BF16: i32 = 2;

pub const CLM_MEMORY_NONE: i32 = 0;
pub const CLM_MEMORY_HOST: i32 = 1;
pub const CLM_MEMORY_DEVICE: i32 = 2;

pub const CLM_EVICT_LRU: i32 = 0;
pub const CLM_EVICT_LFU: i32 = 1;
pub const CLM_EVICT_SLRU: i32 = 2;
pub const CLM_EVICT_PRIORITY: i32 = 3;
pub const CLM_EVICT_GHOST_SLRU: i32 = 4;

/// How an admission's priority meets the priority cached along its prompt:
/// each node keeps the highest (the default) ...
pub const CLM_PRIORITY_RAISE: i32 = 0;
/// ... or takes this admission's, the host's latest word.
pub const CLM_PRIORITY_SET: i32 = 1;

/// When a cached page gets its host-tier copy (then, with a storage tier, its
/// stored copy): on its first hit.
pub const CLM_WRITE_THROUGH: i32 = 0;
/// ... once it has been hit twice.
pub const CLM_WRITE_THROUGH_SELECTIVE: i32 = 1;
/// ... only when the device tier evicts it.
pub const CLM_WRITE_BACK: i32 = 2;

/// How long `clm_engine_admit` waits for pages found in storage: not at all.
pub const CLM_PREFETCH_BEST_EFFORT: i32 = 0;
/// ... until every page found is in.
pub const CLM_PREFETCH_WAIT_COMPLETE: i32 = 1;
/// ... up to `prefetch_timeout_ms + prefetch_timeout_per_1k_tokens_ms * tokens / 1000`.
pub const CLM_PREFETCH_TIMEOUT: i32 = 2;

// ---- KV events for cache-aware routers (docs/fleet.md) ------------------------
/// Pages cached on a tier.
pub const CLM_KV_EVENT_BLOCK_STORED: i32 = 0;
/// Pages that left it.
pub const CLM_KV_EVENT_BLOCK_REMOVED: i32 = 1;
/// Nothing is cached (a new engine, or a resync follows).
pub const CLM_KV_EVENT_ALL_BLOCKS_CLEARED: i32 = 2;
/// The engine's pool, wherever its memory lives.
pub const CLM_KV_MEDIUM_GPU: i32 = 0;
/// The host tier.
pub const CLM_KV_MEDIUM_CPU: i32 = 1;
pub const CLM_KV_EVENTS_BIND_AUTO: i32 = 0;
pub const CLM_KV_EVENTS_BIND: i32 = 1;
pub const CLM_KV_EVENTS_CONNECT: i32 = 2;
pub const CLM_KV_EVENTS_LAYOUT_ARRAY: i32 = 0;
pub const CLM_KV_EVENTS_LAYOUT_LEGACY: i32 = 1;
pub const CLM_KV_EVENTS_LAYOUT_MAP: i32 = 2;

/// One change to the cache, as the callback gets it; every pointer is the
/// library's and valid only during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_kv_event {
    pub kind: i32,
    pub medium: i32,
    pub block_hashes: *const u64,
    pub n_block_hashes: usize,
    pub has_parent: i32,
    pub block_size: i32,
    pub parent_block_hash: u64,
    pub token_ids: *const i32,
    pub n_token_ids: usize,
    pub lora_id: i32,
    pub reserved: i32,
    /// NUL-terminated: the tenant's salt digest, "" for the default tenant.
    pub extra_key: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_kv_event_batch {
    pub struct_size: u32,
    pub data_parallel_rank: i32,
    pub sequence: u64,
    pub ts: f64,
    pub events: *const clm_kv_event,
    pub n_events: usize,
}

/// Called on one thread of the library's, one batch at a time, in order; it
/// must not call the engine that publishes.
pub type clm_kv_event_callback = Option<unsafe extern "C" fn(batch: *const clm_kv_event_batch, user_data: *mut c_void)>;

// ---- CLM anomalies' JSON lines (docs/observability.md) --------------------------
/// Each CLM anomaly as one JSON line: `line_len` bytes at `line` (no
/// newline, NUL-terminated), the library's for the call only. Called on the
/// thread of the engine call that caused it (a snapshot lookup, record,
/// outcome report, blacklist), in order, under the engine's locks: it must
/// return quickly and never call the engine. Never called once
/// `clm_engine_free` returns.
pub type clm_watch_line_callback =
    Option<unsafe extern "C" fn(line: *const c_char, line_len: usize, user_data: *mut c_void)>;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
// kv_events_callback and clm_watch_callback compare by address, which is
// what equality of two option structs means here.
#[allow(unknown_lints, unpredictable_function_pointer_comparisons)]
pub struct clm_engine_options {
    pub struct_size: u32,
    pub num_pages: i32,
    pub page_size: i32,
    pub num_layers: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub kv_dtype: i32,
    pub memory: i32,
    pub device: i32,
    pub eviction_policy: i32,
    pub slru_protected_fraction: f64,
    // -- version 2: CLM suffix reuse --
    pub src_daily_requests: f64,
    pub src_threshold: f32,
    pub src_breaker_score: f32,
    pub src_breaker_steps: i32,
    /// Copied by `clm_engine_create`; NULL for none.
    pub special_token_ids: *const i32,
    pub n_special_token_ids: usize,
    // -- version 3: the semantic snapshot store --
    /// NUL-terminated, copied by `clm_engine_create`; NULL or "" for no store.
    pub snapshot_store_path: *const c_char,
    pub snapshot_store_shards: i32,
    pub snapshot_dim: i32,
    pub snapshot_min_usage: i64,
    pub snapshot_version_cosine: f32,
    pub snapshot_similarity_floor: f32,
    pub snapshot_ann_ef_search: i32,
    pub snapshot_lookup_timeout_us: i32,
    // -- version 4: the tiered KV cache (docs/tiers.md) --
    /// Host-tier pages of the pool's layout; 0 for no tiers.
    pub host_pages: i32,
    /// `CLM_WRITE_*`.
    pub write_policy: i32,
    /// NUL-terminated, copied by `clm_engine_create`; NULL or "" for no
    /// storage tier (needs `host_pages > 0`).
    pub storage_url: *const c_char,
    /// `CLM_PREFETCH_*`.
    pub prefetch_policy: i32,
    pub prefetch_timeout_ms: f64,
    pub prefetch_timeout_per_1k_tokens_ms: f64,
    pub storage_workers: i32,
    pub storage_batch_pages: i32,
    // -- version 5
    pub snapshot_read_only: i32,
    pub snapshot_maintenance_interval_ms: i64,
    // -- version 6: pages safe to share
    /// NUL-terminated, copied by `clm_engine_create`: the host's fingerprint
    /// of its model; required with a storage tier.
    pub model_id: *const c_char,
    /// NUL-terminated path of the file holding the page secret; NULL or "": none.
    pub page_secret_file: *const c_char,
    /// NUL-terminated name of the environment variable holding it; NULL or "": none.
    pub page_secret_env: *const c_char,
    pub max_queued_fetches: i32,
    pub breaker_failures: i32,
    pub admission_deadline_ms: f64,
    pub breaker_open_ms: f64,
    // -- version 7: KV events (NUL-terminated strings, copied by `clm_engine_create`)
    pub kv_events: i32,
    pub kv_events_bind: i32,
    pub kv_events_endpoint: *const c_char,
    pub kv_events_replay_endpoint: *const c_char,
    pub kv_events_topic: *const c_char,
    pub kv_events_callback: clm_kv_event_callback,
    pub kv_events_callback_data: *mut c_void,
    pub kv_events_layout: i32,
    pub kv_events_batch_interval_ms: i32,
    pub kv_events_max_batch_events: i32,
    pub kv_events_queue_events: i32,
    pub kv_events_buffer_batches: i32,
    pub kv_events_send_hwm: i32,
    pub kv_events_data_parallel_rank: i32,
    pub kv_events_token_ids: i32,
    // -- version 8: divergence hot spots (docs/observability.md)
    /// 1: count where prompts split off the cached paths (default 1).
    pub divergence: i32,
    /// Branch points kept, 16..65536 (default 256).
    pub divergence_branch_points: i32,
    /// A report counts this far back, >= 2 (default 3600000: an hour).
    pub divergence_window_ms: i32,
    /// Tokens kept either side of a split, 0..64 (default 8).
    pub divergence_context_tokens: i32,
    // -- version 9: CLM anomalies (docs/observability.md; with a snapshot store only)
    /// 1: watch snapshot lookups' SRC scores and the store's key events
    /// (`clm_engine_clm_anomalies`) (default 1).
    pub clm_watch: i32,
    /// Keys watched at once, 1..2^20 (default 4096).
    pub clm_watch_max_keys: i32,
    /// A key's sightings count this far back, >= 2 (default 3600000).
    pub clm_watch_window_ms: i64,
    /// A key is low-SRC once seen this often in the window ... (default 20).
    pub clm_watch_min_sightings: i64,
    /// ... with a median SRC below this, (0, 1] (default 0.2).
    pub clm_watch_low_src: f32,
    /// Events a report keeps, the newest, 0..2^20 (default 1024).
    pub clm_watch_max_events: i32,
    /// Each event, and each key turning low-SRC, as one JSON line (default NULL).
    pub clm_watch_callback: clm_watch_line_callback,
    /// Passed to the callback as it is (default NULL).
    pub clm_watch_callback_data: *mut c_void,
}

impl Default for clm_engine_options {
    /// All zero (NULL `special_token_ids`), as `memset(0)` in C; not the
    /// library's defaults: `clm_engine_options_init` gives those.
    fn default() -> Self {
        clm_engine_options {
            struct_size: 0,
            num_pages: 0,
            page_size: 0,
            num_layers: 0,
            kv_heads: 0,
            head_dim: 0,
            kv_dtype: 0,
            memory: 0,
            device: 0,
            eviction_policy: 0,
            slru_protected_fraction: 0.0,
            src_daily_requests: 0.0,
            src_threshold: 0.0,
            src_breaker_score: 0.0,
            src_breaker_steps: 0,
            special_token_ids: std::ptr::null(),
            n_special_token_ids: 0,
            snapshot_store_path: std::ptr::null(),
            snapshot_store_shards: 0,
            snapshot_dim: 0,
            snapshot_min_usage: 0,
            snapshot_version_cosine: 0.0,
            snapshot_similarity_floor: 0.0,
            snapshot_ann_ef_search: 0,
            snapshot_lookup_timeout_us: 0,
            host_pages: 0,
            write_policy: 0,
            storage_url: std::ptr::null(),
            prefetch_policy: 0,
            prefetch_timeout_ms: 0.0,
            prefetch_timeout_per_1k_tokens_ms: 0.0,
            storage_workers: 0,
            storage_batch_pages: 0,
            snapshot_read_only: 0,
            snapshot_maintenance_interval_ms: 0,
            model_id: std::ptr::null(),
            page_secret_file: std::ptr::null(),
            page_secret_env: std::ptr::null(),
            max_queued_fetches: 0,
            breaker_failures: 0,
            admission_deadline_ms: 0.0,
            breaker_open_ms: 0.0,
            kv_events: 0,
            kv_events_bind: 0,
            kv_events_endpoint: std::ptr::null(),
            kv_events_replay_endpoint: std::ptr::null(),
            kv_events_topic: std::ptr::null(),
            kv_events_callback: None,
            kv_events_callback_data: std::ptr::null_mut(),
            kv_events_layout: 0,
            kv_events_batch_interval_ms: 0,
            kv_events_max_batch_events: 0,
            kv_events_queue_events: 0,
            kv_events_buffer_batches: 0,
            kv_events_send_hwm: 0,
            kv_events_data_parallel_rank: 0,
            kv_events_token_ids: 0,
            divergence: 0,
            divergence_branch_points: 0,
            divergence_window_ms: 0,
            divergence_context_tokens: 0,
            clm_watch: 0,
            clm_watch_max_keys: 0,
            clm_watch_window_ms: 0,
            clm_watch_min_sightings: 0,
            clm_watch_low_src: 0.0,
            clm_watch_max_events: 0,
            clm_watch_callback: None,
            clm_watch_callback_data: std::ptr::null_mut(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_kv_layout {
    /// Set by the caller before `clm_engine_kv_layout`: sizeof as compiled.
    pub struct_size: u32,
    pub base: *mut c_void,
    pub page_bytes: usize,
    pub layer_bytes: usize,
    pub num_pages: i32,
    pub page_size: i32,
    pub num_layers: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub kv_dtype: i32,
    pub memory: i32,
}

// ---- requests -----------------------------------------------------------------
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_admission_plan {
    /// Set by the caller before `clm_engine_plan_admission`: sizeof as compiled.
    pub struct_size: u32,
    pub cached_tokens: i32,
    pub new_pages: i32,
    pub unlocked_pages: i32,
    pub pages_free: i32,
    pub evictable_tokens: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_admit_options {
    pub struct_size: u32,
    pub cache_salt: *const c_char,
    pub cache_salt_len: usize,
    pub adapter_id: i32,
    pub priority: i32,
    // version 2
    pub priority_update: i32,
    // version 3
    /// The tenant's name in divergence reports, bytes `[0, tenant_len)`; NULL
    /// for none (a report names the salt's digest). Not part of the namespace.
    pub tenant: *const c_char,
    pub tenant_len: usize,
}

// ---- metrics ------------------------------------------------------------------
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct clm_metrics {
    pub struct_size: u32,
    pub tokens_queried: u64,
    pub tokens_hit: u64,
    pub hit_rate: f64,
    pub cached_tokens: i64,
    pub evictable_tokens: i64,
    pub protected_tokens: i64,
    pub pages_used: i32,
    pub pages_free: i32,
    pub evicted_tokens: u64,
    pub evictions: u64,
    pub inserted_tokens: u64,
    pub admitted: u64,
    pub finished: u64,
    pub aborted: u64,
    pub rejected: u64,
    pub active_sequences: i64,
    pub metadata_bytes: u64,
    // -- version 2: the SRC head, its threshold and breaker --
    pub src_threshold: f64,
    pub src_steps: u64,
    pub src_unscored_steps: u64,
    pub src_reuse_decisions: u64,
    pub src_retrievals_found: u64,
    pub src_retrievals_failed: u64,
    pub src_breaker_trips: u64,
    pub src_baseline_sequences: i64,
    pub src_injections: u64,
    // -- version 3: the snapshot store (all 0 without one) --
    pub store_lookups: u64,
    pub store_hits_exact: u64,
    pub store_hits_ann: u64,
    pub store_hits_fallback: u64,
    pub store_misses: u64,
    pub store_busy_misses: u64,
    pub store_blacklisted_skips: u64,
    pub store_ann_unavailable: u64,
    pub store_records: u64,
    pub store_counted: u64,
    pub store_admissions: u64,
    pub store_confirmations: u64,
    pub store_versions: u64,
    pub store_drift_versions: u64,
    pub store_evictions: u64,
    pub store_corrupt_skipped: u64,
    pub store_index_rebuilds: u64,
    pub store_outcome_reports: u64,
    pub store_snapshots: i64,
    pub store_blacklisted_keys: i64,
    pub has_snapshot_store: i32,
    // -- version 4: the tiered KV cache (all 0 without tiers) --
    pub has_tiers: i32,
    pub has_storage: i32,
    pub device_hit_tokens: u64,
    pub host_hit_tokens: u64,
    pub storage_hit_tokens: u64,
    pub load_backs: u64,
    pub loaded_pages: u64,
    pub backed_up_pages: u64,
    pub stored_pages: u64,
    pub fetched_pages: u64,
    pub prefetch_timeouts: u64,
    pub storage_errors: u64,
    pub dropped_backups: u64,
    pub host_cached_tokens: i64,
    pub host_pages_used: i64,
    pub host_pages_total: i64,
    pub storage_corrupt_pages: u64,
    pub storage_dropped_writes: u64,
    pub storage_evicted_pages: u64,
    // -- version 5: pages safe to share
    pub storage_foreign_model_pages: u64,
    pub storage_unsigned_pages: u64,
    pub storage_forged_pages: u64,
    pub storage_repaired_pages: u64,
    pub tier_worker_failures: u64,
    pub signed_pages: i32,
    pub storage_breaker_state: i32,
    pub storage_breaker_trips: u64,
    pub storage_breaker_skips: u64,
    pub dropped_fetches: u64,
    pub merged_fetches: u64,
    pub queued_fetches: i64,
    // -- version 6: KV events (all 0 when off)
    pub has_kv_events: i32,
    pub kv_events_resync_pending: i32,
    pub kv_events_recorded: u64,
    pub kv_events_published: u64,
    pub kv_events_published_batches: u64,
    pub kv_events_dropped: u64,
    pub kv_events_resyncs: u64,
    pub kv_events_replay_requests: u64,
    pub kv_events_replay_refused: u64,
    pub kv_events_send_failures: u64,
    pub kv_events_queued: i64,
    pub kv_events_next_sequence: u64,
    // -- version 7: where lookups stop matching (all 0 with divergence counting off)
    /// Lookups that split off a longer cached path, a page or more left.
    pub diverged_lookups: u64,
    /// Lookups by the tokens they matched: upper bounds 0, 16, 32, ..., 2^20
    /// (buckets 0..17), then above (18).
    pub match_depth_counts: [u64; 19],
    /// Tokens matched, summed over those lookups.
    pub match_depth_sum_tokens: u64,
    // -- version 8: CLM anomalies (all 0 without a snapshot store, or with clm_watch 0)
    /// Snapshot lookups recorded with their sequence's SRC score.
    pub clm_watch_sightings: u64,
    /// Times a key turned low-SRC.
    pub clm_watch_low_src_turns: u64,
    /// The store's key events, by `CLM_WATCH_EVENT_BLACKLISTED` ..
    /// `CLM_WATCH_EVENT_DRIFT`.
    pub clm_watch_key_events: [u64; 4],
    /// Keys watched now.
    pub clm_watch_watched_keys: i64,
    /// ... of them low-SRC as of their last sighting.
    pub clm_watch_low_src_keys: i64,
}

// ---- divergence hot spots (docs/observability.md) -------------------------------
/// Opaque report handle (`clm_divergence_report`), from
/// `clm_engine_divergence_report`, freed by `clm_divergence_report_free`.
#[repr(C)]
pub struct clm_divergence_report {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// One branch point of a report (`clm_divergence_report_point`); every
/// pointer belongs to the report and is valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_branch_point {
    /// Set by the caller: sizeof as compiled.
    pub struct_size: u32,
    /// Not NUL-terminated: the tenant's name, else "salt:" and 32 hex digits
    /// of its salt's SHA-256, "" for no salt.
    pub tenant: *const c_char,
    pub tenant_len: usize,
    pub adapter_id: i32,
    /// Tokens from the prompt's start to the split (whole pages).
    pub depth: i32,
    /// Admissions that split off here, in the window.
    pub branches: u64,
    /// Admissions that went on past it into a cached branch, in the window.
    pub hits: u64,
    /// `branches` may count up to this many splits of points it displaced.
    pub overcount: u64,
    pub before: *const i32,
    pub n_before: usize,
    pub after: *const i32,
    pub n_after: usize,
    pub cached_after: *const i32,
    pub n_cached_after: usize,
}

impl Default for clm_branch_point {
    /// `CLM_BRANCH_POINT_INIT`: this struct's size, everything else zero/NULL.
    fn default() -> Self {
        clm_branch_point {
            struct_size: std::mem::size_of::<clm_branch_point>() as u32,
            tenant: std::ptr::null(),
            tenant_len: 0,
            adapter_id: 0,
            depth: 0,
            branches: 0,
            hits: 0,
            overcount: 0,
            before: std::ptr::null(),
            n_before: 0,
            after: std::ptr::null(),
            n_after: 0,
            cached_after: std::ptr::null(),
            n_cached_after: 0,
        }
    }
}

// ---- CLM anomalies (docs/observability.md) -------------------------------------
/// A key was blacklisted, by the outcome breaker or an administrator:
/// `reason`, `until_ms`, `by_breaker`.
pub const CLM_WATCH_EVENT_BLACKLISTED: i32 = 0;
/// A key was let go by an administrator.
pub const CLM_WATCH_EVENT_UNBLACKLISTED: i32 = 1;
/// A record stored a key's first or a new version: `version`.
pub const CLM_WATCH_EVENT_VERSION_CREATED: i32 = 2;
/// A version started because the key's records drifted: `version`.
pub const CLM_WATCH_EVENT_DRIFT: i32 = 3;
/// A key turned low-SRC: `sightings`, `median_src`.
pub const CLM_WATCH_EVENT_LOW_SRC: i32 = 4;

/// Opaque report handle (`clm_anomaly_report`), from
/// `clm_engine_clm_anomalies`, freed by `clm_anomaly_report_free`.
#[repr(C)]
pub struct clm_anomaly_report {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// One low-SRC key of a report (`clm_anomaly_report_low_src_key`); its
/// pointers belong to the report and are valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_low_src_key {
    /// Set by the caller: sizeof as compiled.
    pub struct_size: u32,
    pub adapter_id: i32,
    /// Not NUL-terminated: the tenant's name, else "salt:" and 32 hex digits
    /// of its salt's SHA-256, "" for no salt.
    pub tenant: *const c_char,
    pub tenant_len: usize,
    /// The suffix key; not NUL-terminated.
    pub key: *const c_char,
    pub key_len: usize,
    /// In the window.
    pub sightings: u64,
    /// The middle of the 0.025 bin holding the median.
    pub median_src: f32,
    /// 0.
    pub reserved: i32,
}

impl Default for clm_low_src_key {
    /// `CLM_LOW_SRC_KEY_INIT`: this struct's size, everything else zero/NULL.
    fn default() -> Self {
        clm_low_src_key {
            struct_size: std::mem::size_of::<clm_low_src_key>() as u32,
            adapter_id: 0,
            tenant: std::ptr::null(),
            tenant_len: 0,
            key: std::ptr::null(),
            key_len: 0,
            sightings: 0,
            median_src: 0.0,
            reserved: 0,
        }
    }
}

/// One event of a report (`clm_anomaly_report_event`); its pointers belong
/// to the report and are valid until it is freed. None is NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clm_watch_event {
    /// Set by the caller: sizeof as compiled.
    pub struct_size: u32,
    /// `CLM_WATCH_EVENT_*`.
    pub kind: i32,
    /// Milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// As `clm_low_src_key.tenant`.
    pub tenant: *const c_char,
    pub tenant_len: usize,
    pub key: *const c_char,
    pub key_len: usize,
    /// Blacklisted: why (the breaker's figures or the administrator's words).
    pub reason: *const c_char,
    pub reason_len: usize,
    /// Blacklisted: until when (milliseconds since the Unix epoch).
    pub until_ms: i64,
    pub adapter_id: i32,
    /// Version created, drift.
    pub version: i32,
    /// Blacklisted: 1 by the outcome breaker, 0 by an administrator.
    pub by_breaker: i32,
    /// Low-SRC.
    pub median_src: f32,
    /// Low-SRC.
    pub sightings: u64,
}

impl Default for clm_watch_event {
    /// `CLM_WATCH_EVENT_INIT`: this struct's size, everything else zero/NULL.
    fn default() -> Self {
        clm_watch_event {
            struct_size: std::mem::size_of::<clm_watch_event>() as u32,
            kind: 0,
            time_ms: 0,
            tenant: std::ptr::null(),
            tenant_len: 0,
            key: std::ptr::null(),
            key_len: 0,
            reason: std::ptr::null(),
            reason_len: 0,
            until_ms: 0,
            adapter_id: 0,
            version: 0,
            by_breaker: 0,
            median_src: 0.0,
            sightings: 0,
        }
    }
}

// ---- CLM suffix reuse: the SRC head ---------------------------------------------
pub const CLM_GELU_TANH: i32 = 0;
pub const CLM_GELU_ERF: i32 = 1;
pub const CLM_GELU_FROM_FILE: i32 = -1;

pub const CLM_DTYPE_F32: i32 = 0;
pub const CLM_DTYPE_F16: i32 = 1;
pub const CLM_DTYPE_BF16: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct clm_src_decision {
    pub score: f32,
    pub threshold: f32,
    pub scored: u8,
    pub reuse: u8,
    pub baseline: u8,
    pub reserved: u8,
}

// ---- CLM suffix reuse: snapshots ------------------------------------------------
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct clm_adapter_options {
    pub struct_size: u32,
    pub num_layers: i32,
    /// Copied by the set/load calls; NULL with `n_layers` 0 for the last 3.
    pub layers: *const i32,
    pub n_layers: usize,
    pub residual_scale: f32,
}

// ---- CLM suffix reuse: the snapshot store ---------------------------------------
pub const CLM_SUFFIX_TEXT: i32 = 0;
pub const CLM_SUFFIX_KEY: i32 = 1;

pub const CLM_SNAPSHOT_MISS: i32 = 0;
pub const CLM_SNAPSHOT_EXACT: i32 = 1;
pub const CLM_SNAPSHOT_ANN: i32 = 2;
pub const CLM_SNAPSHOT_FALLBACK: i32 = 3;

pub const CLM_RECORD_COUNTED: i32 = 0;
pub const CLM_RECORD_ADMITTED: i32 = 1;
pub const CLM_RECORD_CONFIRMED: i32 = 2;
pub const CLM_RECORD_NEW_VERSION: i32 = 3;
pub const CLM_RECORD_DRIFTED: i32 = 4;
pub const CLM_RECORD_ABSTAINED: i32 = 6;

pub const CLM_SNAPSHOT_KEY_BYTES: usize = 264;

/// One sequence's lookup result: an output array element of fixed size (no
/// `struct_size`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct clm_snapshot_hit {
    pub level: i32,
    pub similarity: f32,
    pub version: i32,
    pub key_len: u32,
    pub fingerprint: u64,
    pub stable: u8,
    pub key_truncated: u8,
    pub reserved: [u8; 30],
    /// NUL-terminated.
    pub key: [c_char; CLM_SNAPSHOT_KEY_BYTES],
}

/// One version of a key (`clm_engine_snapshot_versions`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct clm_snapshot_version {
    pub version: i32,
    pub readable: u8,
    pub stable: u8,
    pub pinned: u8,
    pub served: u8,
    pub created_at: i64,
    pub last_used: i64,
    pub usage_count: i64,
    pub confirmations: i64,
    pub reserved: [u8; 24],
}

/// One key refused at every level (`clm_engine_snapshot_blacklist`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct clm_snapshot_blacklist_entry {
    pub until_ms: i64,
    pub fingerprint: u64,
    pub adapter_id: i32,
    pub salt_len: u32,
    pub key_len: u32,
    pub reason_len: u32,
    pub by_hand: u8,
    pub salt_truncated: u8,
    pub key_truncated: u8,
    pub reason_truncated: u8,
    pub reserved: [u8; 20],
    /// NUL-terminated, as are `key` and `reason`.
    pub salt: [c_char; CLM_SNAPSHOT_KEY_BYTES],
    pub key: [c_char; CLM_SNAPSHOT_KEY_BYTES],
    pub reason: [c_char; CLM_SNAPSHOT_KEY_BYTES],
}

impl Default for clm_snapshot_blacklist_entry {
    /// All zero: empty strings.
    fn default() -> Self {
        clm_snapshot_blacklist_entry {
            until_ms: 0,
            fingerprint: 0,
            adapter_id: 0,
            salt_len: 0,
            key_len: 0,
            reason_len: 0,
            by_hand: 0,
            salt_truncated: 0,
            key_truncated: 0,
            reason_truncated: 0,
            reserved: [0; 20],
            salt: [0; CLM_SNAPSHOT_KEY_BYTES],
            key: [0; CLM_SNAPSHOT_KEY_BYTES],
            reason: [0; CLM_SNAPSHOT_KEY_BYTES],
        }
    }
}

impl Default for clm_snapshot_hit {
    /// All zero: a miss with an empty key.
    fn default() -> Self {
        clm_snapshot_hit {
            level: 0,
            similarity: 0.0,
            version: 0,
            key_len: 0,
            fingerprint: 0,
            stable: 0,
            key_truncated: 0,
            reserved: [0; 30],
            key: [0; CLM_SNAPSHOT_KEY_BYTES],
        }
    }
}

// ---- attention and KV kernels ---------------------------------------------------
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct clm_attention_params {
    pub struct_size: u32,
    pub layer: i32,
    pub num_q_heads: i32,
    pub softmax_scale: f32,
    pub sliding_window: i32,
    pub num_threads: i32,
    /// A `cudaStream_t` for device pools; NULL is the default stream.
    pub stream: *mut c_void,
}

extern "C" {
    pub fn clm_version() -> c_int;
    pub fn clm_version_string() -> *const c_char;

    pub fn clm_status_name(status: clm_status) -> *const c_char;
    pub fn clm_last_error() -> *const c_char;

    pub fn clm_engine_options_init(options: *mut clm_engine_options, struct_size: usize) -> clm_status;
    pub fn clm_engine_create(out: *mut *mut clm_engine, options: *const clm_engine_options) -> clm_status;
    pub fn clm_engine_free(engine: *mut clm_engine);
    pub fn clm_engine_kv_layout(out: *mut clm_kv_layout, engine: *const clm_engine) -> clm_status;

    pub fn clm_admit_options_init(options: *mut clm_admit_options, struct_size: usize) -> clm_status;
    pub fn clm_engine_admit(
        out: *mut *mut clm_seq,
        engine: *mut clm_engine,
        tokens: *const i32,
        n_tokens: usize,
        options: *const clm_admit_options,
    ) -> clm_status;
    pub fn clm_engine_plan_admission(
        out: *mut clm_admission_plan,
        engine: *const clm_engine,
        tokens: *const i32,
        n_tokens: usize,
        options: *const clm_admit_options,
    ) -> clm_status;
    pub fn clm_engine_pin_prefix(
        engine: *mut clm_engine,
        tokens: *const i32,
        n_tokens: usize,
        options: *const clm_admit_options,
        ttl_ms: i64,
        pin_id: *mut u64,
        pinned_tokens: *mut i32,
    ) -> clm_status;
    pub fn clm_engine_unpin(engine: *mut clm_engine, pin_id: u64) -> clm_status;
    pub fn clm_engine_hint_prefix(
        engine: *mut clm_engine,
        key: *const c_char,
        key_len: usize,
        tokens: *const i32,
        n_tokens: usize,
        options: *const clm_admit_options,
        priority: i32,
        ttl_ms: i64,
        reached_tokens: *mut i32,
    ) -> clm_status;
    pub fn clm_seq_extend(seq: *mut clm_seq, tokens: *const i32, n_tokens: usize) -> clm_status;
    pub fn clm_seq_finish(seq: *mut clm_seq) -> clm_status;
    pub fn clm_seq_abort(seq: *mut clm_seq) -> clm_status;
    pub fn clm_seq_free(seq: *mut clm_seq);

    pub fn clm_seq_cached_tokens(seq: *const clm_seq) -> i32;
    pub fn clm_seq_host_tokens(seq: *const clm_seq) -> i32;
    pub fn clm_seq_storage_tokens(seq: *const clm_seq) -> i32;

    pub fn clm_engine_prefetch(
        engine: *mut clm_engine,
        tokens: *const i32,
        n_tokens: usize,
        options: *const clm_admit_options,
    ) -> clm_status;
    pub fn clm_engine_wait_for_tiers(engine: *mut clm_engine) -> clm_status;

    pub fn clm_seq_page_table(seq: *const clm_seq, n_pages: *mut usize) -> *const i32;
    pub fn clm_seq_slots(seq: *const clm_seq, n_slots: *mut usize) -> *const i64;

    pub fn clm_engine_batch_page_table(
        indptr: *mut i32,
        indices: *mut i32,
        indices_capacity: usize,
        n_indices: *mut usize,
        last_page_len: *mut i32,
        engine: *mut clm_engine,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
    ) -> clm_status;

    pub fn clm_engine_metrics(out: *mut clm_metrics, engine: *const clm_engine) -> clm_status;
    pub fn clm_engine_metrics_text(
        text: *mut c_char,
        text_capacity: usize,
        text_len: *mut usize,
        engine: *const clm_engine,
    ) -> clm_status;

    pub fn clm_engine_divergence_report(
        out: *mut *mut clm_divergence_report,
        engine: *mut clm_engine,
        top_per_tenant: i32,
        min_branches: u64,
        tenant: *const c_char,
        tenant_len: usize,
    ) -> clm_status;
    pub fn clm_divergence_report_count(report: *const clm_divergence_report) -> usize;
    pub fn clm_divergence_report_window_ms(report: *const clm_divergence_report) -> i64;
    pub fn clm_divergence_report_point(
        out: *mut clm_branch_point,
        report: *const clm_divergence_report,
        index: usize,
    ) -> clm_status;
    pub fn clm_divergence_report_free(report: *mut clm_divergence_report);

    pub fn clm_engine_clm_anomalies(out: *mut *mut clm_anomaly_report, engine: *const clm_engine) -> clm_status;
    pub fn clm_anomaly_report_low_src_count(report: *const clm_anomaly_report) -> usize;
    pub fn clm_anomaly_report_event_count(report: *const clm_anomaly_report) -> usize;
    pub fn clm_anomaly_report_window_ms(report: *const clm_anomaly_report) -> i64;
    pub fn clm_anomaly_report_min_sightings(report: *const clm_anomaly_report) -> i64;
    pub fn clm_anomaly_report_low_src(report: *const clm_anomaly_report) -> f32;
    pub fn clm_anomaly_report_low_src_key(
        out: *mut clm_low_src_key,
        report: *const clm_anomaly_report,
        index: usize,
    ) -> clm_status;
    pub fn clm_anomaly_report_event(
        out: *mut clm_watch_event,
        report: *const clm_anomaly_report,
        index: usize,
    ) -> clm_status;
    pub fn clm_anomaly_report_event_json(
        line: *mut c_char,
        line_capacity: usize,
        line_len: *mut usize,
        report: *const clm_anomaly_report,
        index: usize,
    ) -> clm_status;
    pub fn clm_anomaly_report_free(report: *mut clm_anomaly_report);

    pub fn clm_engine_flush_kv_events(engine: *mut clm_engine, timeout_ms: i32) -> clm_status;
    pub fn clm_engine_kv_event_blocks(
        hashes: *mut u64,
        capacity: usize,
        count: *mut usize,
        engine: *const clm_engine,
        medium: i32,
    ) -> clm_status;
    pub fn clm_engine_kv_events_endpoint(
        text: *mut c_char,
        text_capacity: usize,
        len: *mut usize,
        engine: *const clm_engine,
        replay: i32,
    ) -> clm_status;

    pub fn clm_engine_load_src_head(engine: *mut clm_engine, path: *const c_char, gelu: i32) -> clm_status;
    pub fn clm_engine_set_src_head(
        engine: *mut clm_engine,
        hidden: i32,
        w1: *const f32,
        b1: *const f32,
        w2: *const f32,
        b2: f32,
        gelu: i32,
    ) -> clm_status;
    pub fn clm_engine_src_step(
        decisions: *mut clm_src_decision,
        engine: *mut clm_engine,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
        attn_out: *const c_void,
        dtype: i32,
        n_rows: usize,
        hidden: i32,
        token_ids: *const i32,
        indptr: *const i32,
    ) -> clm_status;
    pub fn clm_engine_report_retrieval(
        engine: *mut clm_engine,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
        found: *const u8,
    ) -> clm_status;

    pub fn clm_engine_load_snapshot_projection(engine: *mut clm_engine, path: *const c_char) -> clm_status;
    pub fn clm_engine_set_snapshot_projection(
        engine: *mut clm_engine,
        hidden: i32,
        snapshot_dim: i32,
        mean: *const f32,
        components: *const f32,
    ) -> clm_status;
    pub fn clm_engine_make_snapshots(
        snapshots: *mut f32,
        snapshots_len: usize,
        engine: *mut clm_engine,
        rows: *const c_void,
        dtype: i32,
        n_rows: usize,
        hidden: i32,
    ) -> clm_status;
    pub fn clm_adapter_options_init(options: *mut clm_adapter_options, struct_size: usize) -> clm_status;
    pub fn clm_engine_load_snapshot_adapter(
        engine: *mut clm_engine,
        path: *const c_char,
        options: *const clm_adapter_options,
    ) -> clm_status;
    pub fn clm_engine_set_snapshot_adapter(
        engine: *mut clm_engine,
        snapshot_dim: i32,
        hidden: i32,
        weight: *const f32,
        bias: *const f32,
        options: *const clm_adapter_options,
    ) -> clm_status;
    pub fn clm_engine_inject_snapshots(
        engine: *mut clm_engine,
        hidden_states: *mut c_void,
        dtype: i32,
        n_rows: usize,
        hidden: i32,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
        indptr: *const i32,
        snapshots: *const f32,
        snapshot_dim: i32,
        apply: *const u8,
        layer: i32,
    ) -> clm_status;

    pub fn clm_suffix_key(
        key: *mut c_char,
        key_capacity: usize,
        key_len: *mut usize,
        fingerprint: *mut u64,
        engine: *const clm_engine,
        text: *const c_char,
        text_len: usize,
    ) -> clm_status;
    pub fn clm_engine_lookup_snapshots(
        hits: *mut clm_snapshot_hit,
        snapshots: *mut f32,
        snapshots_len: usize,
        apply: *mut u8,
        engine: *mut clm_engine,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
        suffixes: *const *const c_char,
        suffix_lens: *const usize,
        groups: *const *const c_char,
        group_lens: *const usize,
        suffix_kind: i32,
        queries: *const f32,
        queries_len: usize,
    ) -> clm_status;
    pub fn clm_engine_record_snapshot(
        result: *mut i32,
        version: *mut i32,
        engine: *mut clm_engine,
        seq: *mut clm_seq,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
        snapshot: *const f32,
        snapshot_len: usize,
    ) -> clm_status;
    pub fn clm_engine_report_snapshot_outcome(
        engine: *mut clm_engine,
        seqs: *const *mut clm_seq,
        n_seqs: usize,
        correct: *const u8,
    ) -> clm_status;
    pub fn clm_engine_set_fallback_snapshot(
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        name: *const c_char,
        name_len: usize,
        snapshot: *const f32,
        snapshot_len: usize,
    ) -> clm_status;
    pub fn clm_engine_flush_snapshot_store(engine: *mut clm_engine) -> clm_status;
    pub fn clm_engine_evict_snapshots(deleted: *mut i64, engine: *mut clm_engine) -> clm_status;

    pub fn clm_engine_snapshot_versions(
        versions: *mut clm_snapshot_version,
        capacity: usize,
        count: *mut usize,
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
    ) -> clm_status;
    pub fn clm_engine_pin_snapshot_version(
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
        version: i32,
    ) -> clm_status;
    pub fn clm_engine_unpin_snapshot_version(
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
    ) -> clm_status;
    pub fn clm_engine_roll_back_snapshot_key(
        deleted: *mut i64,
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
        version: i32,
    ) -> clm_status;
    pub fn clm_engine_delete_snapshot_key(
        deleted: *mut i64,
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
    ) -> clm_status;
    pub fn clm_engine_delete_snapshot_tenant(
        deleted_rows: *mut i64,
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
    ) -> clm_status;
    pub fn clm_engine_blacklist_snapshot_key(
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
        reason: *const c_char,
        reason_len: usize,
        until_ms: i64,
    ) -> clm_status;
    pub fn clm_engine_snapshot_blacklist(
        entries: *mut clm_snapshot_blacklist_entry,
        capacity: usize,
        count: *mut usize,
        engine: *mut clm_engine,
    ) -> clm_status;
    pub fn clm_engine_unblacklist_snapshot_key(
        engine: *mut clm_engine,
        tenant_salt: *const c_char,
        salt_len: usize,
        adapter_id: i32,
        suffix: *const c_char,
        suffix_len: usize,
        group: *const c_char,
        group_len: usize,
        suffix_kind: i32,
    ) -> clm_status;

    pub fn clm_attention_params_init(params: *mut clm_attention_params, struct_size: usize) -> clm_status;
    pub fn clm_engine_write_kv(
        engine: *mut clm_engine,
        layer: i32,
        slots: *const i64,
        n_slots: usize,
        k: *const f32,
        v: *const f32,
        kv_len: usize,
        stream: *mut c_void,
    ) -> clm_status;
    pub fn clm_engine_paged_prefill_attention(
        out: *mut f32,
        out_len: usize,
        engine: *const clm_engine,
        params: *const clm_attention_params,
        q: *const f32,
        q_len: usize,
        n_new: i32,
        pages: *const i32,
        n_pages: usize,
        kv_len: i32,
    ) -> clm_status;
    pub fn clm_engine_paged_decode_attention(
        out: *mut f32,
        out_len: usize,
        engine: *const clm_engine,
        params: *const clm_attention_params,
        q: *const f32,
        q_len: usize,
        indptr: *const i32,
        indices: *const i32,
        n_indices: usize,
        last_page_len: *const i32,
        n_seqs: usize,
    ) -> clm_status;
    pub fn clm_engine_copy_pages(
        dst: *mut clm_engine,
        dst_pages: *const i32,
        src: *const clm_engine,
        src_pages: *const i32,
        n_pages: usize,
        stream: *mut c_void,
    ) -> clm_status;
    pub fn clm_engine_gather_pages(
        buffer: *mut c_void,
        buffer_len: usize,
        engine: *const clm_engine,
        pages: *const i32,
        n_pages: usize,
        stream: *mut c_void,
    ) -> clm_status;
    pub fn clm_engine_scatter_pages(
        engine: *mut clm_engine,
        pages: *const i32,
        n_pages: usize,
        buffer: *const c_void,
        buffer_len: usize,
        stream: *mut c_void,
    ) -> clm_status;
}
