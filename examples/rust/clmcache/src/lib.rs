//! Safe Rust wrapper over clmcache's C ABI (`clm.h`), an embeddable KV-cache
//! library for LLM inference: prefix reuse over a paged KV pool.
//!
//! ```no_run
//! use clmcache::{Engine, EngineOptions};
//!
//! let engine = Engine::new(&EngineOptions { page_size: 16, ..EngineOptions::new(4096) })?;
//! let prompt: Vec<i32> = (0..100).collect();
//! let mut seq = engine.admit(&prompt)?;
//! let cached = seq.cached_tokens(); // prompt[..cached] is already in the pool
//! // ... write the K/V of prompt[cached..] into seq.slots() ...
//! let slots = seq.extend(&[42])?; // a decode step: where token 42's K/V goes
//! assert_eq!(slots.len(), 1);
//! seq.finish()?; // publish prompt + output for later requests
//! # Ok::<(), clmcache::Error>(())
//! ```
//!
//! Threading follows the C ABI: an [`Engine`] may be used from many threads at
//! once (`Send + Sync`; share it with `Arc`). A [`Sequence`] must not be used
//! by two threads at the same time, so it is `Send` but not `Sync`.
//!
//! Errors are [`Error`]s: the status code plus the message of
//! `clm_last_error()`, copied on the calling thread right after the call
//! that failed.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::os::raw::{c_char, c_void};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::slice;

pub use clmcache_sys as sys;

// ---- errors -----------------------------------------------------------------

/// What went wrong, as a `clm_status` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Malformed input: bad lengths, bad ids, bad options.
    InvalidArgument,
    /// No free KV pages, even after eviction (or no host memory).
    OutOfMemory,
    /// No such handle or sequence.
    NotFound,
    /// A valid call in the wrong state (e.g. finish after abort).
    FailedPrecondition,
    /// Not in this build or on this machine (e.g. no GPU).
    Unsupported,
    /// A bug in clmcache.
    Internal,
    /// A file, socket or database call failed.
    Io,
    /// A code this wrapper does not know (a newer library).
    Unknown(i32),
}

impl ErrorCode {
    /// The code for a failed `clm_status`; `None` for `CLM_OK`.
    pub fn from_raw(status: sys::clm_status) -> Option<ErrorCode> {
        Some(match status {
            sys::CLM_OK => return None,
            sys::CLM_ERR_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            sys::CLM_ERR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            sys::CLM_ERR_NOT_FOUND => ErrorCode::NotFound,
            sys::CLM_ERR_FAILED_PRECONDITION => ErrorCode::FailedPrecondition,
            sys::CLM_ERR_UNSUPPORTED => ErrorCode::Unsupported,
            sys::CLM_ERR_INTERNAL => ErrorCode::Internal,
            sys::CLM_ERR_IO => ErrorCode::Io,
            other => ErrorCode::Unknown(other),
        })
    }

    /// The `clm_status` value.
    pub fn raw(self) -> sys::clm_status {
        match self {
            ErrorCode::InvalidArgument => sys::CLM_ERR_INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => sys::CLM_ERR_OUT_OF_MEMORY,
            ErrorCode::NotFound => sys::CLM_ERR_NOT_FOUND,
            ErrorCode::FailedPrecondition => sys::CLM_ERR_FAILED_PRECONDITION,
            ErrorCode::Unsupported => sys::CLM_ERR_UNSUPPORTED,
            ErrorCode::Internal => sys::CLM_ERR_INTERNAL,
            ErrorCode::Io => sys::CLM_ERR_IO,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// The library's static name for the code ("invalid_argument", ...).
    pub fn name(self) -> &'static str {
        // SAFETY: clm_status_name accepts any value and returns a static string.
        unsafe { static_str(sys::clm_status_name(self.raw())) }.unwrap_or("unknown")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed clmcache call: its status code and `clm_last_error()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    /// Builds the error of a failed call. Must run on the thread that made
    /// the call, before any other clm_* call there (the message is
    /// thread-local and only valid until the next call).
    fn last(status: sys::clm_status) -> Error {
        // SAFETY: clm_last_error returns a NUL-terminated thread-local string
        // that stays valid until the next clm_* call on this thread; it is
        // copied before any.
        let message = unsafe {
            let p = sys::clm_last_error();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error { code: ErrorCode::from_raw(status).unwrap_or(ErrorCode::Unknown(status)), message }
    }

    fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    /// The status code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The library's description of the failure.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "clmcache: {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with clmcache's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn check(status: sys::clm_status) -> Result<()> {
    if status == sys::CLM_OK {
        Ok(())
    } else {
        Err(Error::last(status))
    }
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string that lives forever.
unsafe fn static_str(p: *const c_char) -> Option<&'static str> {
    if p.is_null() {
        None
    } else {
        // SAFETY: per the contract above.
        unsafe { CStr::from_ptr(p) }.to_str().ok()
    }
}

/// A slice over an array owned by the C side; an empty one for NULL.
///
/// # Safety
/// When `p` is non-NULL it must point to `n` initialized values that stay
/// unchanged for `'a`.
unsafe fn c_slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: per the contract above.
        unsafe { slice::from_raw_parts(p, n) }
    }
}

/// The text a `clm_*` call writes into a caller's buffer with its NUL
/// (`fill(text, capacity, &mut length)`): a sizing call first (capacity 0),
/// then the text, in a buffer `spare` bytes larger than needed, again while
/// the text outgrows it (a too-small buffer is `CLM_ERR_INVALID_ARGUMENT` with
/// the length needed, and nothing written).
pub(crate) fn sized_text(
    function: &str,
    spare: usize,
    mut fill: impl FnMut(*mut c_char, usize, *mut usize) -> sys::clm_status,
) -> Result<String> {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let mut length = 0usize;
        let text = if buffer.is_empty() { ptr::null_mut() } else { buffer.as_mut_ptr() as *mut c_char };
        let status = fill(text, buffer.len(), &mut length);
        if status == sys::CLM_ERR_INVALID_ARGUMENT && length >= buffer.len() {
            buffer.resize(length + 1 + spare, 0); // and the NUL
            continue;
        }
        check(status)?;
        buffer.truncate(length);
        return String::from_utf8(buffer)
            .map_err(|_| Error::new(ErrorCode::Internal, format!("{} returned text that is not UTF-8", function)));
    }
}

// ---- version ------------------------------------------------------------------

/// The library's version as `major * 10000 + minor * 100 + patch`.
pub fn version() -> i32 {
    // SAFETY: no arguments, no state.
    unsafe { sys::clm_version() }
}

/// The library's version as "major.minor.patch".
pub fn version_string() -> &'static str {
    // SAFETY: returns a static string.
    unsafe { static_str(sys::clm_version_string()) }.unwrap_or("")
}

/// Whether the loaded library has the version these bindings were written
/// against (`CLM_VERSION_NUMBER` of clm.h).
pub fn version_matches() -> bool {
    version() == sys::CLM_VERSION_NUMBER
}

// ---- options ------------------------------------------------------------------

macro_rules! raw_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:path,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }
        impl $name {
            /// The C constant.
            pub fn raw(self) -> i32 {
                match self {
                    $($name::$variant => $value,)*
                }
            }
            /// The variant for a C constant, if it is one this wrapper knows.
            pub fn from_raw(value: i32) -> Option<$name> {
                $(if value == $value { return Some($name::$variant); })*
                None
            }
        }
    };
}

raw_enum!(
    /// Element type of the K/V pool (`CLM_KV_*`).
    KvDtype {
        F32 = sys::CLM_KV_F32,
        F16 = sys::CLM_KV_F16,
        Bf16 = sys::CLM_KV_BF16,
    }
);

raw_enum!(
    /// Where the pool keeps the K/V bytes (`CLM_MEMORY_*`).
    MemoryKind {
        /// Page ids only: the host keeps the KV tensors.
        None = sys::CLM_MEMORY_NONE,
        /// Host memory.
        Host = sys::CLM_MEMORY_HOST,
        /// CUDA device memory.
        Device = sys::CLM_MEMORY_DEVICE,
    }
);

raw_enum!(
    /// Which unlocked prefixes are evicted first (`CLM_EVICT_*`).
    EvictionPolicy {
        Lru = sys::CLM_EVICT_LRU,
        Lfu = sys::CLM_EVICT_LFU,
        Slru = sys::CLM_EVICT_SLRU,
        Priority = sys::CLM_EVICT_PRIORITY,
        GhostSlru = sys::CLM_EVICT_GHOST_SLRU,
    }
);

raw_enum!(
    /// How an admission's priority meets the priority already cached along
    /// its prompt (`CLM_PRIORITY_*`).
    PriorityUpdate {
        /// Each cached node keeps the highest priority it was given
        /// (`CLM_PRIORITY_RAISE`, the default): a shared system prompt stays
        /// at the priority it was admitted with once.
        Raise = sys::CLM_PRIORITY_RAISE,
        /// The whole prefix takes this admission's priority
        /// (`CLM_PRIORITY_SET`): a hint that a conversation comes back soon
        /// ends when it is admitted again without one.
        Set = sys::CLM_PRIORITY_SET,
    }
);

raw_enum!(
    /// When a cached page gets its host-tier copy, and then, with a storage
    /// tier, its stored copy (`CLM_WRITE_*`).
    WritePolicy {
        /// On its first hit (`CLM_WRITE_THROUGH`, the default).
        Through = sys::CLM_WRITE_THROUGH,
        /// Once it has been hit twice (`CLM_WRITE_THROUGH_SELECTIVE`).
        ThroughSelective = sys::CLM_WRITE_THROUGH_SELECTIVE,
        /// Only when the device tier evicts it (`CLM_WRITE_BACK`).
        Back = sys::CLM_WRITE_BACK,
    }
);

raw_enum!(
    /// How long an admission waits for the pages it found in storage
    /// (`CLM_PREFETCH_*`).
    PrefetchPolicy {
        /// Not at all: what has arrived is used, the rest lands for later
        /// requests (`CLM_PREFETCH_BEST_EFFORT`).
        BestEffort = sys::CLM_PREFETCH_BEST_EFFORT,
        /// Until every page found is in (`CLM_PREFETCH_WAIT_COMPLETE`).
        WaitComplete = sys::CLM_PREFETCH_WAIT_COMPLETE,
        /// Up to `prefetch_timeout_ms + prefetch_timeout_per_1k_tokens_ms *
        /// tokens / 1000` (`CLM_PREFETCH_TIMEOUT`, the default).
        Timeout = sys::CLM_PREFETCH_TIMEOUT,
    }
);

/// A NUL-terminated copy of an optional option string (`None` or empty: NULL
/// in the C struct); a NUL byte inside is `InvalidArgument`.
fn optional_cstring(name: &str, value: &Option<String>) -> Result<Option<CString>> {
    match value {
        Some(v) if !v.is_empty() => {
            Ok(Some(CString::new(v.as_bytes()).map_err(|_| {
                crate::clm::invalid("clm_engine_create", format!("{} {:?} contains a NUL byte", name, v))
            })?))
        }
        _ => Ok(None),
    }
}

fn known<T>(value: Option<T>, what: &str, raw: i32) -> Result<T> {
    value.ok_or_else(|| Error::new(ErrorCode::Internal, format!("clmcache returned an unknown {} {}", what, raw)))
}

/// Engine settings (`clm_engine_options`). Defaults come from the library's
/// `clm_engine_options_init`; `num_pages` has none and must be set.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Pool budget, in pages (required, > 0).
    pub num_pages: i32,
    /// Tokens per page.
    pub page_size: i32,
    pub num_layers: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub kv_dtype: KvDtype,
    pub memory: MemoryKind,
    /// CUDA device for [`MemoryKind::Device`].
    pub device: i32,
    pub eviction_policy: EvictionPolicy,
    /// In [0, 1], for [`EvictionPolicy::Slru`].
    pub slru_protected_fraction: f64,
    /// Expected requests per day; sets the SRC threshold (`0.8 + 0.05 *
    /// log10(daily / 10000)`, clamped to [0.7, 0.95]) when `src_threshold < 0`.
    pub src_daily_requests: f64,
    /// In [0, 1] fixes the SRC threshold; < 0 derives it from
    /// `src_daily_requests`.
    pub src_threshold: f32,
    /// Scores above this whose snapshot retrieval failed count toward the breaker.
    pub src_breaker_score: f32,
    /// Consecutive such steps that switch a sequence to baseline mode (>= 1).
    pub src_breaker_steps: i32,
    /// Token ids left out of the SRC head's running mean (copied at creation).
    pub special_token_ids: Vec<i32>,
    /// The semantic snapshot store's directory (`":memory:"` keeps it in
    /// memory, for tests); `None` or an empty path: no store. See
    /// [`Engine::lookup_snapshots`].
    pub snapshot_store_path: Option<PathBuf>,
    /// SQLite shards, 1..256, fixed when the store is created.
    pub snapshot_store_shards: i32,
    /// Floats per snapshot, 1..4096, fixed when the store is created.
    pub snapshot_dim: i32,
    /// Sightings of a suffix before it is stored (>= 1).
    pub snapshot_min_usage: i64,
    /// In (0, 1]: a record below this cosine to the newest version is a new version.
    pub snapshot_version_cosine: f32,
    /// In [-1, 1]: level 2 serves nothing below this cosine.
    pub snapshot_similarity_floor: f32,
    /// Level 2's search breadth.
    pub snapshot_ann_ef_search: i32,
    /// A lookup waits this long for a busy shard, then misses.
    pub snapshot_lookup_timeout_us: i32,
    /// The tiered KV cache (docs/tiers.md): pages of the pool's layout in a
    /// host-memory tier that evicted pages move down to and load back from
    /// (>= 0; 0: no tiers). See [`Sequence::host_tokens`].
    pub host_pages: i32,
    /// When a cached page gets its host copy.
    pub write_policy: WritePolicy,
    /// The storage tier below the host tier (needs `host_pages > 0`):
    /// `"file:///var/cache/clm?capacity_mb=4096"` or
    /// `"redis://127.0.0.1:6379/0?prefix=clm:&ttl=3600"`. `None` or an empty
    /// URL: no storage tier. See [`Engine::prefetch`].
    pub storage_url: Option<String>,
    /// How long an admission waits for pages found in storage.
    pub prefetch_policy: PrefetchPolicy,
    /// [`PrefetchPolicy::Timeout`]: the base wait, in milliseconds.
    pub prefetch_timeout_ms: f64,
    /// ... plus this many milliseconds per 1000 tokens fetched.
    pub prefetch_timeout_per_1k_tokens_ms: f64,
    /// Threads that talk to storage, 1..64.
    pub storage_workers: i32,
    /// Pages per storage call, 1..4096.
    pub storage_batch_pages: i32,
    /// Open the snapshot store read-only beside the process that writes it:
    /// lookups only (records, outcomes, evictions and administration fail
    /// with `FailedPrecondition`).
    pub snapshot_read_only: bool,
    /// `> 0`: evict and flush the snapshot store on a background thread this
    /// often, in milliseconds (0: off, the host evicts).
    pub snapshot_maintenance_interval_ms: i64,
    /// The host's fingerprint of its model (weights + config), e.g. the
    /// SHA-256 of its weights file: hashed into every stored page's key and
    /// header, so that no other model is served them. Required with a
    /// storage tier.
    pub model_id: Option<String>,
    /// A file (not readable by everyone) holding the deployment secret that
    /// signs every stored page (AES-256-GMAC).
    pub page_secret_file: Option<PathBuf>,
    /// ... or the name of the environment variable holding it (at most one).
    pub page_secret_env: Option<String>,
    /// Fetches waiting for a storage worker, 1..2^20: past it the oldest
    /// prefetch (or the new fetch) is dropped.
    pub max_queued_fetches: i32,
    /// Failed storage calls in a row that stop storage being asked.
    pub breaker_failures: i32,
    /// An admission waits for storage at most this many milliseconds, whatever the policy.
    pub admission_deadline_ms: f64,
    /// How long storage is not asked, in milliseconds, before one call probes it.
    pub breaker_open_ms: f64,
    /// Publish the cache's changes as vLLM's KV events, for cache-aware
    /// routers (docs/fleet.md; needs `model_id`). See [`KvEventSink`].
    pub kv_events: bool,
    pub kv_events_bind: KvEventsBind,
    /// The PUB socket; `None`: `"tcp://127.0.0.1:5557"`.
    pub kv_events_endpoint: Option<String>,
    /// A ROUTER socket (always bound) that sends missed batches again on request.
    pub kv_events_replay_endpoint: Option<String>,
    /// Every message's first frame, up to 256 bytes (llm-d's `kv@<pod>@<model>`).
    pub kv_events_topic: Option<String>,
    /// Batches to this closure instead of a socket (no replay endpoint then).
    pub kv_events_sink: Option<KvEventSink>,
    pub kv_events_layout: KvEventsLayout,
    /// A batch goes out this often, in milliseconds ...
    pub kv_events_batch_interval_ms: i32,
    /// ... or as soon as it holds this many events.
    pub kv_events_max_batch_events: i32,
    /// Events not yet published, at most: past it they are dropped, counted,
    /// and a resync (all cleared, then every cached page) follows.
    pub kv_events_queue_events: i32,
    /// Batches the replay socket can send again.
    pub kv_events_buffer_batches: i32,
    /// The PUB socket's high-water mark, in messages.
    pub kv_events_send_hwm: i32,
    /// Each batch's third field.
    pub kv_events_data_parallel_rank: i32,
    /// `false`: stored events carry no token ids (for routers that key on our hashes).
    pub kv_events_token_ids: bool,
    /// Count where prompts split off the cached paths (docs/observability.md):
    /// branch points for [`Engine::divergence_report`] and the match-depth
    /// counters of [`Metrics`]. Off, the report is `FailedPrecondition` and
    /// those counters stay 0.
    pub divergence: bool,
    /// Branch points kept, 16..65536.
    pub divergence_branch_points: i32,
    /// A report counts this far back, in milliseconds (>= 2).
    pub divergence_window_ms: i32,
    /// Tokens kept either side of a split, 0..64 ([`BranchPoint::before`], ...).
    pub divergence_context_tokens: i32,
    /// Watch CLM suffix reuse (docs/observability.md; with a snapshot store
    /// only): each snapshot lookup's SRC score with its key, and the store's
    /// key events, for [`Engine::clm_anomalies`] and the `clm_watch_*`
    /// counters of [`Metrics`]. Off, the report is `FailedPrecondition`,
    /// those counters stay 0 and the sink is never called.
    pub clm_watch: bool,
    /// Keys watched at once, 1..2^20 (a full watch drops its least seen keys
    /// for new ones).
    pub clm_watch_max_keys: i32,
    /// A key's sightings count this far back, in milliseconds (>= 2).
    pub clm_watch_window_ms: i64,
    /// A key is low-SRC once seen this often in the window (>= 1) ...
    pub clm_watch_min_sightings: i64,
    /// ... with a median SRC below this, in (0, 1].
    pub clm_watch_low_src: f32,
    /// Events a report keeps, the newest, 0..2^20 (0: none; the sink still
    /// gets every line).
    pub clm_watch_max_events: i32,
    /// Each event, and each key turning low-SRC, as one JSON line to this
    /// closure, on the thread of the engine call that caused it (see
    /// [`ClmWatchSink`]). `None`: the lines are only in the report.
    pub clm_watch_sink: Option<ClmWatchSink>,
}

impl EngineOptions {
    /// The library's defaults with a pool of `num_pages` pages.
    pub fn new(num_pages: i32) -> EngineOptions {
        EngineOptions { num_pages, ..EngineOptions::default() }
    }

    /// The library's defaults (`clm_engine_options_init`), or the error it
    /// gives when it does not know this wrapper's struct size.
    pub fn library_defaults() -> Result<EngineOptions> {
        let raw = raw_engine_options()?;
        Ok(EngineOptions {
            num_pages: raw.num_pages,
            page_size: raw.page_size,
            num_layers: raw.num_layers,
            kv_heads: raw.kv_heads,
            head_dim: raw.head_dim,
            kv_dtype: known(KvDtype::from_raw(raw.kv_dtype), "kv_dtype", raw.kv_dtype)?,
            memory: known(MemoryKind::from_raw(raw.memory), "memory kind", raw.memory)?,
            device: raw.device,
            eviction_policy: known(
                EvictionPolicy::from_raw(raw.eviction_policy),
                "eviction policy",
                raw.eviction_policy,
            )?,
            slru_protected_fraction: raw.slru_protected_fraction,
            src_daily_requests: raw.src_daily_requests,
            src_threshold: raw.src_threshold,
            src_breaker_score: raw.src_breaker_score,
            src_breaker_steps: raw.src_breaker_steps,
            special_token_ids: Vec::new(),
            snapshot_store_path: None,
            snapshot_store_shards: raw.snapshot_store_shards,
            snapshot_dim: raw.snapshot_dim,
            snapshot_min_usage: raw.snapshot_min_usage,
            snapshot_version_cosine: raw.snapshot_version_cosine,
            snapshot_similarity_floor: raw.snapshot_similarity_floor,
            snapshot_ann_ef_search: raw.snapshot_ann_ef_search,
            snapshot_lookup_timeout_us: raw.snapshot_lookup_timeout_us,
            host_pages: raw.host_pages,
            write_policy: known(WritePolicy::from_raw(raw.write_policy), "write policy", raw.write_policy)?,
            storage_url: None,
            prefetch_policy: known(
                PrefetchPolicy::from_raw(raw.prefetch_policy),
                "prefetch policy",
                raw.prefetch_policy,
            )?,
            prefetch_timeout_ms: raw.prefetch_timeout_ms,
            prefetch_timeout_per_1k_tokens_ms: raw.prefetch_timeout_per_1k_tokens_ms,
            storage_workers: raw.storage_workers,
            storage_batch_pages: raw.storage_batch_pages,
            snapshot_read_only: raw.snapshot_read_only != 0,
            snapshot_maintenance_interval_ms: raw.snapshot_maintenance_interval_ms,
            model_id: None,
            page_secret_file: None,
            page_secret_env: None,
            max_queued_fetches: raw.max_queued_fetches,
            breaker_failures: raw.breaker_failures,
            admission_deadline_ms: raw.admission_deadline_ms,
            breaker_open_ms: raw.breaker_open_ms,
            kv_events: raw.kv_events != 0,
            kv_events_bind: known(KvEventsBind::from_raw(raw.kv_events_bind), "kv_events_bind", raw.kv_events_bind)?,
            kv_events_endpoint: None,
            kv_events_replay_endpoint: None,
            kv_events_topic: None,
            kv_events_sink: None,
            kv_events_layout: known(
                KvEventsLayout::from_raw(raw.kv_events_layout),
                "kv_events_layout",
                raw.kv_events_layout,
            )?,
            kv_events_batch_interval_ms: raw.kv_events_batch_interval_ms,
            kv_events_max_batch_events: raw.kv_events_max_batch_events,
            kv_events_queue_events: raw.kv_events_queue_events,
            kv_events_buffer_batches: raw.kv_events_buffer_batches,
            kv_events_send_hwm: raw.kv_events_send_hwm,
            kv_events_data_parallel_rank: raw.kv_events_data_parallel_rank,
            kv_events_token_ids: raw.kv_events_token_ids != 0,
            divergence: raw.divergence != 0,
            divergence_branch_points: raw.divergence_branch_points,
            divergence_window_ms: raw.divergence_window_ms,
            divergence_context_tokens: raw.divergence_context_tokens,
            clm_watch: raw.clm_watch != 0,
            clm_watch_max_keys: raw.clm_watch_max_keys,
            clm_watch_window_ms: raw.clm_watch_window_ms,
            clm_watch_min_sightings: raw.clm_watch_min_sightings,
            clm_watch_low_src: raw.clm_watch_low_src,
            clm_watch_max_events: raw.clm_watch_max_events,
            clm_watch_sink: None,
        })
    }

    /// Whether these options create an engine with a snapshot store.
    pub fn has_snapshot_store(&self) -> bool {
        self.snapshot_store_path.as_ref().map_or(false, |p| !p.as_os_str().is_empty())
    }

    /// Whether these options create an engine with tiers (a host tier).
    pub fn has_tiers(&self) -> bool {
        self.host_pages > 0
    }

    /// Whether these options name a storage tier (which also needs a host
    /// tier: without one, [`Engine::new`] refuses them).
    pub fn has_storage(&self) -> bool {
        self.storage_url.as_ref().map_or(false, |url| !url.is_empty())
    }

    /// [`EngineOptions::to_raw`] with `snapshot_store_path` set too: the C
    /// struct points into the returned NUL-terminated copy of the path
    /// (`None` without a store), so it must outlive neither `self` nor that
    /// copy. A path with a NUL byte is `InvalidArgument`. `storage_url`
    /// stays NULL: [`EngineOptions::to_raw_owned`] sets both strings.
    pub fn to_raw_with_path(&self) -> Result<(sys::clm_engine_options, Option<CString>)> {
        let mut raw = self.to_raw()?;
        let path = self.store_path_cstring()?;
        // The CString's bytes live on the heap: moving it keeps the pointer valid.
        raw.snapshot_store_path = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        Ok((raw, path))
    }

    /// The C struct with every string (`snapshot_store_path`, `storage_url`,
    /// `model_id`, the page secret's source, the `kv_events_*` endpoints and
    /// topic) pointing into NUL-terminated copies that the returned value
    /// owns; it borrows `special_token_ids` from `self`. The two things it
    /// leaves out are `kv_events_sink` and `clm_watch_sink`: a callback needs
    /// an owner that outlives the engine, which only [`Engine::new`] is (with
    /// the struct alone, events go to the socket and CLM anomalies only to
    /// the report). A string with a NUL byte is `InvalidArgument`.
    pub fn to_raw_owned(&self) -> Result<RawEngineOptions<'_>> {
        let mut raw = self.to_raw()?;
        let snapshot_store_path = self.store_path_cstring()?;
        let storage_url = optional_cstring("storage_url", &self.storage_url)?;
        let model_id = optional_cstring("model_id", &self.model_id)?;
        let page_secret_file = match &self.page_secret_file {
            Some(p) if !p.as_os_str().is_empty() => Some(crate::clm::path_cstring("clm_engine_create", p)?),
            _ => None,
        };
        let page_secret_env = optional_cstring("page_secret_env", &self.page_secret_env)?;
        let kv_events_endpoint = optional_cstring("kv_events_endpoint", &self.kv_events_endpoint)?;
        let kv_events_replay_endpoint = optional_cstring("kv_events_replay_endpoint", &self.kv_events_replay_endpoint)?;
        let kv_events_topic = optional_cstring("kv_events_topic", &self.kv_events_topic)?;
        // The CStrings' bytes live on the heap: moving them keeps the pointers valid.
        let pointer = |s: &Option<CString>| s.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        raw.snapshot_store_path = pointer(&snapshot_store_path);
        raw.storage_url = pointer(&storage_url);
        raw.model_id = pointer(&model_id);
        raw.page_secret_file = pointer(&page_secret_file);
        raw.page_secret_env = pointer(&page_secret_env);
        raw.kv_events_endpoint = pointer(&kv_events_endpoint);
        raw.kv_events_replay_endpoint = pointer(&kv_events_replay_endpoint);
        raw.kv_events_topic = pointer(&kv_events_topic);
        Ok(RawEngineOptions {
            raw,
            _strings: [
                snapshot_store_path,
                storage_url,
                model_id,
                page_secret_file,
                page_secret_env,
                kv_events_endpoint,
                kv_events_replay_endpoint,
                kv_events_topic,
            ],
            _options: PhantomData,
        })
    }

    fn store_path_cstring(&self) -> Result<Option<CString>> {
        match &self.snapshot_store_path {
            Some(p) if !p.as_os_str().is_empty() => Ok(Some(crate::clm::path_cstring("clm_engine_create", p)?)),
            _ => Ok(None),
        }
    }

    /// The C struct: the library's defaults overwritten by every field here
    /// but the strings (`snapshot_store_path`, `storage_url`, `model_id`, the
    /// page secret's source, the `kv_events_*` endpoints and topic), which
    /// stay NULL (no store, no storage tier, the default endpoint), and the
    /// KV-event and CLM-watch sinks (no callbacks): the struct cannot own the
    /// NUL-terminated copies they need ([`EngineOptions::to_raw_owned`] gives
    /// the strings).
    /// It borrows `special_token_ids`, so it must not outlive `self`.
    pub fn to_raw(&self) -> Result<sys::clm_engine_options> {
        let mut raw = raw_engine_options()?;
        raw.num_pages = self.num_pages;
        raw.page_size = self.page_size;
        raw.num_layers = self.num_layers;
        raw.kv_heads = self.kv_heads;
        raw.head_dim = self.head_dim;
        raw.kv_dtype = self.kv_dtype.raw();
        raw.memory = self.memory.raw();
        raw.device = self.device;
        raw.eviction_policy = self.eviction_policy.raw();
        raw.slru_protected_fraction = self.slru_protected_fraction;
        raw.src_daily_requests = self.src_daily_requests;
        raw.src_threshold = self.src_threshold;
        raw.src_breaker_score = self.src_breaker_score;
        raw.src_breaker_steps = self.src_breaker_steps;
        raw.special_token_ids =
            if self.special_token_ids.is_empty() { ptr::null() } else { self.special_token_ids.as_ptr() };
        raw.n_special_token_ids = self.special_token_ids.len();
        raw.snapshot_store_path = ptr::null();
        raw.snapshot_store_shards = self.snapshot_store_shards;
        raw.snapshot_dim = self.snapshot_dim;
        raw.snapshot_min_usage = self.snapshot_min_usage;
        raw.snapshot_version_cosine = self.snapshot_version_cosine;
        raw.snapshot_similarity_floor = self.snapshot_similarity_floor;
        raw.snapshot_ann_ef_search = self.snapshot_ann_ef_search;
        raw.snapshot_lookup_timeout_us = self.snapshot_lookup_timeout_us;
        raw.host_pages = self.host_pages;
        raw.write_policy = self.write_policy.raw();
        raw.storage_url = ptr::null();
        raw.prefetch_policy = self.prefetch_policy.raw();
        raw.prefetch_timeout_ms = self.prefetch_timeout_ms;
        raw.prefetch_timeout_per_1k_tokens_ms = self.prefetch_timeout_per_1k_tokens_ms;
        raw.storage_workers = self.storage_workers;
        raw.storage_batch_pages = self.storage_batch_pages;
        raw.snapshot_read_only = i32::from(self.snapshot_read_only);
        raw.snapshot_maintenance_interval_ms = self.snapshot_maintenance_interval_ms;
        raw.model_id = ptr::null();
        raw.page_secret_file = ptr::null();
        raw.page_secret_env = ptr::null();
        raw.max_queued_fetches = self.max_queued_fetches;
        raw.breaker_failures = self.breaker_failures;
        raw.admission_deadline_ms = self.admission_deadline_ms;
        raw.breaker_open_ms = self.breaker_open_ms;
        raw.kv_events = i32::from(self.kv_events);
        raw.kv_events_bind = self.kv_events_bind.raw();
        raw.kv_events_endpoint = ptr::null();
        raw.kv_events_replay_endpoint = ptr::null();
        raw.kv_events_topic = ptr::null();
        // The sink is the engine's to own: Engine::new sets the callback.
        raw.kv_events_callback = None;
        raw.kv_events_callback_data = ptr::null_mut();
        raw.kv_events_layout = self.kv_events_layout.raw();
        raw.kv_events_batch_interval_ms = self.kv_events_batch_interval_ms;
        raw.kv_events_max_batch_events = self.kv_events_max_batch_events;
        raw.kv_events_queue_events = self.kv_events_queue_events;
        raw.kv_events_buffer_batches = self.kv_events_buffer_batches;
        raw.kv_events_send_hwm = self.kv_events_send_hwm;
        raw.kv_events_data_parallel_rank = self.kv_events_data_parallel_rank;
        raw.kv_events_token_ids = i32::from(self.kv_events_token_ids);
        raw.divergence = i32::from(self.divergence);
        raw.divergence_branch_points = self.divergence_branch_points;
        raw.divergence_window_ms = self.divergence_window_ms;
        raw.divergence_context_tokens = self.divergence_context_tokens;
        raw.clm_watch = i32::from(self.clm_watch);
        raw.clm_watch_max_keys = self.clm_watch_max_keys;
        raw.clm_watch_window_ms = self.clm_watch_window_ms;
        raw.clm_watch_min_sightings = self.clm_watch_min_sightings;
        raw.clm_watch_low_src = self.clm_watch_low_src;
        raw.clm_watch_max_events = self.clm_watch_max_events;
        // The sink is the engine's to own: Engine::new sets the callback.
        raw.clm_watch_callback = None;
        raw.clm_watch_callback_data = ptr::null_mut();
        Ok(raw)
    }
}

/// A complete `clm_engine_options` ([`EngineOptions::to_raw_owned`]) with
/// the NUL-terminated strings it points to; it borrows the [`EngineOptions`]
/// it was made from (their `special_token_ids`).
#[derive(Debug)]
pub struct RawEngineOptions<'a> {
    raw: sys::clm_engine_options,
    _strings: [Option<CString>; 8],
    _options: PhantomData<&'a EngineOptions>,
}

impl RawEngineOptions<'_> {
    /// The C struct; its pointers are valid while `self` lives.
    pub fn as_raw(&self) -> &sys::clm_engine_options {
        &self.raw
    }
}

impl Default for EngineOptions {
    /// The library's defaults (with `num_pages` 0, which the engine rejects).
    ///
    /// # Panics
    /// If the loaded library does not know this wrapper's struct size (a
    /// library/bindings version skew); use [`EngineOptions::library_defaults`]
    /// to get that as an error.
    fn default() -> EngineOptions {
        match EngineOptions::library_defaults() {
            Ok(options) => options,
            Err(e) => panic!("clmcache: clm_engine_options_init failed: {}", e),
        }
    }
}

fn raw_engine_options() -> Result<sys::clm_engine_options> {
    let mut raw = MaybeUninit::<sys::clm_engine_options>::zeroed();
    // SAFETY: raw is a zeroed (valid) struct of exactly the size passed.
    check(unsafe { sys::clm_engine_options_init(raw.as_mut_ptr(), size_of::<sys::clm_engine_options>()) })?;
    // SAFETY: zeroed is a valid value of this plain-data struct, and init filled it.
    Ok(unsafe { raw.assume_init() })
}

/// Per-request options (`clm_admit_options`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmitOptions<'a> {
    /// Tenant isolation: requests with different salts never share pages.
    /// `None` (or an empty salt) is the shared, unsalted cache.
    pub cache_salt: Option<&'a [u8]>,
    /// LoRA adapter the KV is computed with; different adapters never share.
    pub adapter_id: i32,
    /// 0-100, for [`EvictionPolicy::Priority`] and [`EvictionPolicy::GhostSlru`].
    pub priority: i32,
    /// How `priority` meets the priority already cached along the prompt.
    pub priority_update: PriorityUpdate,
    /// The tenant's name in divergence reports ([`Engine::divergence_report`]),
    /// e.g. an API key's tenant. `None` (or empty): a report names the salt's
    /// digest (`"salt:"` and 32 hex digits), never the salt. Not part of the
    /// namespace: only `cache_salt` keeps tenants apart.
    pub tenant: Option<&'a str>,
}

impl<'a> AdmitOptions<'a> {
    /// Defaults with the given cache salt.
    pub fn salted(salt: &'a [u8]) -> AdmitOptions<'a> {
        AdmitOptions { cache_salt: Some(salt), ..AdmitOptions::default() }
    }

    /// The library's defaults (`clm_admit_options_init`).
    pub fn library_defaults() -> Result<AdmitOptions<'static>> {
        let raw = raw_admit_options()?;
        Ok(AdmitOptions {
            cache_salt: None,
            adapter_id: raw.adapter_id,
            priority: raw.priority,
            priority_update: known(
                PriorityUpdate::from_raw(raw.priority_update),
                "priority update",
                raw.priority_update,
            )?,
            tenant: None,
        })
    }

    /// The C struct; it borrows `cache_salt` and `tenant`, so it must not
    /// outlive `self`.
    pub fn to_raw(&self) -> Result<sys::clm_admit_options> {
        let mut raw = raw_admit_options()?;
        let salt = self.cache_salt.unwrap_or(&[]);
        raw.cache_salt = if salt.is_empty() { ptr::null() } else { salt.as_ptr() as *const c_char };
        raw.cache_salt_len = salt.len();
        raw.adapter_id = self.adapter_id;
        raw.priority = self.priority;
        raw.priority_update = self.priority_update.raw();
        let tenant = self.tenant.unwrap_or("");
        raw.tenant = if tenant.is_empty() { ptr::null() } else { tenant.as_ptr() as *const c_char };
        raw.tenant_len = tenant.len();
        Ok(raw)
    }
}

impl Default for AdmitOptions<'_> {
    /// The library's defaults: no salt, adapter 0, priority 0, raised, no tenant name.
    ///
    /// # Panics
    /// On a library/bindings version skew, as [`EngineOptions::default`].
    fn default() -> Self {
        match AdmitOptions::library_defaults() {
            Ok(options) => options,
            Err(e) => panic!("clmcache: clm_admit_options_init failed: {}", e),
        }
    }
}

fn raw_admit_options() -> Result<sys::clm_admit_options> {
    let mut raw = MaybeUninit::<sys::clm_admit_options>::zeroed();
    // SAFETY: raw is a zeroed (valid: NULL salt) struct of exactly the size passed.
    check(unsafe { sys::clm_admit_options_init(raw.as_mut_ptr(), size_of::<sys::clm_admit_options>()) })?;
    // SAFETY: as above.
    Ok(unsafe { raw.assume_init() })
}

// ---- engine -------------------------------------------------------------------

/// A pinned prefix ([`Engine::pin_prefix`]): its id, and the tokens it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub id: u64,
    pub pinned_tokens: i32,
}

/// What [`Engine::admit`] would take from the pool ([`Engine::plan_admission`]).
/// Admitting takes `new_pages + unlocked_pages` off `pages_free` plus the
/// pages of `evictable_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionPlan {
    /// On the device now: `admit` reuses them (it may load more from the host tier).
    pub cached_tokens: i32,
    /// Pages `admit` allocates: the prompt's, less the cached ones.
    pub new_pages: i32,
    /// Cached pages no sequence holds: `admit` locks them, so they stop being evictable.
    pub unlocked_pages: i32,
    /// The pool at the same instant.
    pub pages_free: i32,
    pub evictable_tokens: i64,
}

/// The pool's memory and layout (`clm_kv_layout`): page `p`, layer `l` has K
/// at `base + p * page_bytes + l * layer_bytes` and V `layer_bytes / 2`
/// further, each `[page_size][kv_heads][head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvLayout {
    /// Start of the pool; NULL with [`MemoryKind::None`], a device pointer
    /// with [`MemoryKind::Device`]. It stays valid while the engine or any of
    /// its sequences is alive; writing to it is up to the host's own
    /// synchronization (a page belongs to the sequence whose table holds it).
    pub base: *mut c_void,
    pub page_bytes: usize,
    pub layer_bytes: usize,
    pub num_pages: i32,
    pub page_size: i32,
    pub num_layers: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub kv_dtype: KvDtype,
    pub memory: MemoryKind,
}

/// The engine's counters (`clm_metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Prompt tokens looked up at admission.
    pub tokens_queried: u64,
    /// Of those, tokens found cached.
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
    /// Admissions refused for lack of pages.
    pub rejected: u64,
    pub active_sequences: i64,
    pub metadata_bytes: u64,
    /// The SRC threshold in force.
    pub src_threshold: f64,
    /// Sequence-steps scored by [`Engine::src_step`].
    pub src_steps: u64,
    /// Sequence-steps with no non-special row yet.
    pub src_unscored_steps: u64,
    /// Steps whose score passed the threshold.
    pub src_reuse_decisions: u64,
    /// Reported snapshot lookups that found one.
    pub src_retrievals_found: u64,
    /// Reported snapshot lookups that found none.
    pub src_retrievals_failed: u64,
    /// Sequences switched to baseline mode, ever.
    pub src_breaker_trips: u64,
    /// Running sequences in baseline mode now.
    pub src_baseline_sequences: i64,
    /// Sequence-layers that received a snapshot.
    pub src_injections: u64,
    /// The engine has a snapshot store (the `store_*` counters are 0 without one).
    pub has_snapshot_store: bool,
    /// Suffixes looked up ([`Engine::lookup_snapshots`]).
    pub store_lookups: u64,
    /// ... answered at level 1 (the key's own snapshot).
    pub store_hits_exact: u64,
    /// ... at level 2 (a neighbour of the same group).
    pub store_hits_ann: u64,
    /// ... at level 3 (a greeting's fallback).
    pub store_hits_fallback: u64,
    /// ... not answered (including busy and blacklisted ones).
    pub store_misses: u64,
    /// Misses because a shard stayed busy past `snapshot_lookup_timeout_us`.
    pub store_busy_misses: u64,
    /// Lookups or level-2 candidates refused for a blacklisted key.
    pub store_blacklisted_skips: u64,
    /// Level-2 lookups while the index was being rebuilt.
    pub store_ann_unavailable: u64,
    /// Snapshots recorded ([`Engine::record_snapshot`]).
    pub store_records: u64,
    /// ... only counted: below `snapshot_min_usage`.
    pub store_counted: u64,
    /// Suffixes stored for the first time.
    pub store_admissions: u64,
    /// Records that agreed with the newest version.
    pub store_confirmations: u64,
    /// New versions of stored suffixes (cosine or drift).
    pub store_versions: u64,
    /// ... of them started by drift.
    pub store_drift_versions: u64,
    /// Rows deleted by [`Engine::evict_snapshots`].
    pub store_evictions: u64,
    /// Rows skipped because their checksum or header failed.
    pub store_corrupt_skipped: u64,
    /// Similarity indexes rebuilt from the database.
    pub store_index_rebuilds: u64,
    /// Outcomes reported ([`Engine::report_snapshot_outcome`]).
    pub store_outcome_reports: u64,
    /// Rows stored now.
    pub store_snapshots: i64,
    /// Keys blacklisted now.
    pub store_blacklisted_keys: i64,
    /// The engine has a host tier (the tier counters are 0 without one).
    pub has_tiers: bool,
    /// The engine has a storage tier.
    pub has_storage: bool,
    /// Cached tokens that admissions found on the device.
    pub device_hit_tokens: u64,
    /// ... copied in from the host tier.
    pub host_hit_tokens: u64,
    /// ... fetched from storage for the admission.
    pub storage_hit_tokens: u64,
    /// Admissions that copied host pages to the device.
    pub load_backs: u64,
    /// Pages copied host -> device.
    pub loaded_pages: u64,
    /// Pages copied device -> host (the write policy).
    pub backed_up_pages: u64,
    /// Pages written to storage.
    pub stored_pages: u64,
    /// Pages read from storage into the host tier.
    pub fetched_pages: u64,
    /// Admissions that stopped waiting for storage.
    pub prefetch_timeouts: u64,
    /// Storage calls that failed (the admission recomputed).
    pub storage_errors: u64,
    /// Host copies given up (no room, failed copy).
    pub dropped_backups: u64,
    /// Tokens with a host copy now.
    pub host_cached_tokens: i64,
    /// Host-tier pages in use now.
    pub host_pages_used: i64,
    /// Host-tier pages in all.
    pub host_pages_total: i64,
    /// Stored values refused (checksum, layout, size).
    pub storage_corrupt_pages: u64,
    /// Pages storage could not write (full disk, ...).
    pub storage_dropped_writes: u64,
    /// Pages the file backend removed for its size cap.
    pub storage_evicted_pages: u64,
    /// Stored values refused because another model wrote them.
    pub storage_foreign_model_pages: u64,
    /// ... because they were not signed, where this engine has a page secret.
    pub storage_unsigned_pages: u64,
    /// ... because this engine's secret does not make their signature.
    pub storage_forged_pages: u64,
    /// Refused values deleted, so that the next store writes them again.
    pub storage_repaired_pages: u64,
    /// Tier jobs given up for want of host memory.
    pub tier_worker_failures: u64,
    /// Whether stored pages are signed.
    pub signed_pages: bool,
    /// The storage breaker: 0 closed, 1 open (storage not asked), 2 half-open.
    pub storage_breaker_state: i32,
    /// Times the storage breaker opened.
    pub storage_breaker_trips: u64,
    /// Storage jobs skipped, fetches not queued, while it was open.
    pub storage_breaker_skips: u64,
    /// Fetches dropped for `max_queued_fetches` (prefetches first).
    pub dropped_fetches: u64,
    /// Fetches that joined one queued or running for the same prefix.
    pub merged_fetches: u64,
    /// Fetches waiting for a storage worker now.
    pub queued_fetches: i64,
    /// Whether the engine publishes KV events (the rest are 0 when not).
    pub has_kv_events: bool,
    /// Events are being dropped until a resync.
    pub kv_events_resync_pending: bool,
    /// Events the cache's changes made.
    pub kv_events_recorded: u64,
    /// Events sent in a batch (to the socket or the sink).
    pub kv_events_published: u64,
    pub kv_events_published_batches: u64,
    /// Recorded while the queue was full: lost, then resynced.
    pub kv_events_dropped: u64,
    pub kv_events_resyncs: u64,
    pub kv_events_replay_requests: u64,
    pub kv_events_replay_refused: u64,
    pub kv_events_send_failures: u64,
    /// Recorded, not yet published, now.
    pub kv_events_queued: i64,
    /// The sequence number the next batch gets.
    pub kv_events_next_sequence: u64,
    /// Lookups that split off a longer cached path with a page or more of
    /// the prompt left (0 with [`EngineOptions::divergence`] off, as the two
    /// below).
    pub diverged_lookups: u64,
    /// Lookups by the tokens they matched: `match_depth_counts[i]` counts
    /// depths in `(MATCH_DEPTH_BOUNDS[i - 1], MATCH_DEPTH_BOUNDS[i]]` (bucket
    /// 0: nothing matched), the last those above 2^20.
    pub match_depth_counts: [u64; 19],
    /// Tokens matched, summed over those lookups.
    pub match_depth_sum_tokens: u64,
    /// Snapshot lookups recorded with their sequence's SRC score (once per
    /// sequence and key; 0 without a snapshot store or with
    /// [`EngineOptions::clm_watch`] off, as the four below).
    pub clm_watch_sightings: u64,
    /// Times a key turned low-SRC.
    pub clm_watch_low_src_turns: u64,
    /// The store's key events, indexed by [`ClmEventKind::raw`]:
    /// blacklisted, unblacklisted, version created, drift.
    pub clm_watch_key_events: [u64; 4],
    /// Keys watched now.
    pub clm_watch_watched_keys: i64,
    /// ... of them low-SRC as of their last sighting.
    pub clm_watch_low_src_keys: i64,
}

/// The upper bounds, in tokens, of [`Metrics::match_depth_counts`]' buckets
/// 0..17: 0 (nothing matched), 16, 32, 64, ..., 2^20; bucket 18 is above.
pub const MATCH_DEPTH_BOUNDS: [u64; 18] =
    [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1 << 20];

impl From<sys::clm_metrics> for Metrics {
    fn from(m: sys::clm_metrics) -> Metrics {
        Metrics {
            tokens_queried: m.tokens_queried,
            tokens_hit: m.tokens_hit,
            hit_rate: m.hit_rate,
            cached_tokens: m.cached_tokens,
            evictable_tokens: m.evictable_tokens,
            protected_tokens: m.protected_tokens,
            pages_used: m.pages_used,
            pages_free: m.pages_free,
            evicted_tokens: m.evicted_tokens,
            evictions: m.evictions,
            inserted_tokens: m.inserted_tokens,
            admitted: m.admitted,
            finished: m.finished,
            aborted: m.aborted,
            rejected: m.rejected,
            active_sequences: m.active_sequences,
            metadata_bytes: m.metadata_bytes,
            src_threshold: m.src_threshold,
            src_steps: m.src_steps,
            src_unscored_steps: m.src_unscored_steps,
            src_reuse_decisions: m.src_reuse_decisions,
            src_retrievals_found: m.src_retrievals_found,
            src_retrievals_failed: m.src_retrievals_failed,
            src_breaker_trips: m.src_breaker_trips,
            src_baseline_sequences: m.src_baseline_sequences,
            src_injections: m.src_injections,
            has_snapshot_store: m.has_snapshot_store != 0,
            store_lookups: m.store_lookups,
            store_hits_exact: m.store_hits_exact,
            store_hits_ann: m.store_hits_ann,
            store_hits_fallback: m.store_hits_fallback,
            store_misses: m.store_misses,
            store_busy_misses: m.store_busy_misses,
            store_blacklisted_skips: m.store_blacklisted_skips,
            store_ann_unavailable: m.store_ann_unavailable,
            store_records: m.store_records,
            store_counted: m.store_counted,
            store_admissions: m.store_admissions,
            store_confirmations: m.store_confirmations,
            store_versions: m.store_versions,
            store_drift_versions: m.store_drift_versions,
            store_evictions: m.store_evictions,
            store_corrupt_skipped: m.store_corrupt_skipped,
            store_index_rebuilds: m.store_index_rebuilds,
            store_outcome_reports: m.store_outcome_reports,
            store_snapshots: m.store_snapshots,
            store_blacklisted_keys: m.store_blacklisted_keys,
            has_tiers: m.has_tiers != 0,
            has_storage: m.has_storage != 0,
            device_hit_tokens: m.device_hit_tokens,
            host_hit_tokens: m.host_hit_tokens,
            storage_hit_tokens: m.storage_hit_tokens,
            load_backs: m.load_backs,
            loaded_pages: m.loaded_pages,
            backed_up_pages: m.backed_up_pages,
            stored_pages: m.stored_pages,
            fetched_pages: m.fetched_pages,
            prefetch_timeouts: m.prefetch_timeouts,
            storage_errors: m.storage_errors,
            dropped_backups: m.dropped_backups,
            host_cached_tokens: m.host_cached_tokens,
            host_pages_used: m.host_pages_used,
            host_pages_total: m.host_pages_total,
            storage_corrupt_pages: m.storage_corrupt_pages,
            storage_dropped_writes: m.storage_dropped_writes,
            storage_evicted_pages: m.storage_evicted_pages,
            storage_foreign_model_pages: m.storage_foreign_model_pages,
            storage_unsigned_pages: m.storage_unsigned_pages,
            storage_forged_pages: m.storage_forged_pages,
            storage_repaired_pages: m.storage_repaired_pages,
            tier_worker_failures: m.tier_worker_failures,
            signed_pages: m.signed_pages != 0,
            storage_breaker_state: m.storage_breaker_state,
            storage_breaker_trips: m.storage_breaker_trips,
            storage_breaker_skips: m.storage_breaker_skips,
            dropped_fetches: m.dropped_fetches,
            merged_fetches: m.merged_fetches,
            queued_fetches: m.queued_fetches,
            has_kv_events: m.has_kv_events != 0,
            kv_events_resync_pending: m.kv_events_resync_pending != 0,
            kv_events_recorded: m.kv_events_recorded,
            kv_events_published: m.kv_events_published,
            kv_events_published_batches: m.kv_events_published_batches,
            kv_events_dropped: m.kv_events_dropped,
            kv_events_resyncs: m.kv_events_resyncs,
            kv_events_replay_requests: m.kv_events_replay_requests,
            kv_events_replay_refused: m.kv_events_replay_refused,
            kv_events_send_failures: m.kv_events_send_failures,
            kv_events_queued: m.kv_events_queued,
            kv_events_next_sequence: m.kv_events_next_sequence,
            diverged_lookups: m.diverged_lookups,
            match_depth_counts: m.match_depth_counts,
            match_depth_sum_tokens: m.match_depth_sum_tokens,
            clm_watch_sightings: m.clm_watch_sightings,
            clm_watch_low_src_turns: m.clm_watch_low_src_turns,
            clm_watch_key_events: m.clm_watch_key_events,
            clm_watch_watched_keys: m.clm_watch_watched_keys,
            clm_watch_low_src_keys: m.clm_watch_low_src_keys,
        }
    }
}

/// FlashInfer's paged-KV CSR description of a batch: sequence `i` uses pages
/// `indices[indptr[i]..indptr[i + 1]]` and rows `0..last_page_len[i]` of its
/// last page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PagedBatch {
    pub indptr: Vec<i32>,
    pub indices: Vec<i32>,
    pub last_page_len: Vec<i32>,
}

/// A clmcache engine: the KV pool and the prefix cache (`clm_engine`).
///
/// Thread-safe: share it between threads with `Arc<Engine>`. Dropping it
/// ends every running sequence as an abort; [`Sequence`]s that outlive it
/// stay safe to drop, and their other calls fail with
/// [`ErrorCode::FailedPrecondition`].
#[derive(Debug)]
pub struct Engine {
    raw: NonNull<sys::clm_engine>,
    // The pool's shape, read once at creation, for the length checks of the
    // kernels (kernels.rs).
    layout: KvLayout,
    // The snapshot store's snapshot_dim as created, 0 without a store (store.rs).
    snapshot_dim: usize,
    // The host's KV-event sink, the C callback's user data: freed after the
    // engine (clm_engine_free returns only once no callback can come).
    _kv_event_sink: Option<Box<KvEventSink>>,
    // The host's CLM-watch sink, likewise.
    _clm_watch_sink: Option<Box<ClmWatchSink>>,
}

// SAFETY: clm.h: "an engine may be used from many threads at once"; every
// engine call locks internally, and clm_engine_free needs ownership.
unsafe impl Send for Engine {}
// SAFETY: as above.
unsafe impl Sync for Engine {}

impl Engine {
    /// Creates an engine (`clm_engine_create`).
    pub fn new(options: &EngineOptions) -> Result<Engine> {
        let mut raw = options.to_raw_owned()?;
        let kv_event_sink = options.kv_events_sink.clone().map(Box::new);
        if let Some(sink) = &kv_event_sink {
            raw.raw.kv_events_callback = Some(crate::events::sink_trampoline);
            raw.raw.kv_events_callback_data = &**sink as *const KvEventSink as *mut c_void;
        }
        let clm_watch_sink = options.clm_watch_sink.clone().map(Box::new);
        if let Some(sink) = &clm_watch_sink {
            raw.raw.clm_watch_callback = Some(crate::anomalies::watch_trampoline);
            raw.raw.clm_watch_callback_data = &**sink as *const ClmWatchSink as *mut c_void;
        }
        let mut out: *mut sys::clm_engine = ptr::null_mut();
        // SAFETY: out and raw are valid for the call; raw.struct_size is ours;
        // the strings and token ids raw points to live until after the call.
        check(unsafe { sys::clm_engine_create(&mut out, raw.as_raw()) })?;
        drop(raw);
        let raw = match NonNull::new(out) {
            Some(raw) => raw,
            None => return Err(Error::new(ErrorCode::Internal, "clm_engine_create returned OK and no engine")),
        };
        let layout = KvLayout {
            base: ptr::null_mut(),
            page_bytes: 0,
            layer_bytes: 0,
            num_pages: 0,
            page_size: 0,
            num_layers: 0,
            kv_heads: 0,
            head_dim: 0,
            kv_dtype: KvDtype::F32,
            memory: MemoryKind::None,
        };
        let snapshot_dim = if options.has_snapshot_store() { options.snapshot_dim.max(0) as usize } else { 0 };
        let mut engine =
            Engine { raw, layout, snapshot_dim, _kv_event_sink: kv_event_sink, _clm_watch_sink: clm_watch_sink };
        engine.layout = engine.kv_layout()?; // on error, Drop frees the engine
        Ok(engine)
    }

    /// Admits a prompt with default options (`clm_engine_admit`): matches the
    /// longest cached prefix (page-aligned, at most `tokens.len() - 1`),
    /// locks it, and allocates pages for the rest. Token ids must lie in
    /// `[0, 2^31)`.
    pub fn admit(&self, tokens: &[i32]) -> Result<Sequence> {
        self.admit_raw(tokens, ptr::null())
    }

    /// [`Engine::admit`] with options.
    pub fn admit_with(&self, tokens: &[i32], options: &AdmitOptions<'_>) -> Result<Sequence> {
        let raw = options.to_raw()?;
        self.admit_raw(tokens, &raw)
    }

    fn admit_raw(&self, tokens: &[i32], options: *const sys::clm_admit_options) -> Result<Sequence> {
        let mut out: *mut sys::clm_seq = ptr::null_mut();
        // SAFETY: tokens is a live slice of tokens.len() ids; options is NULL
        // or a struct (and salt) borrowed for the call; the engine is
        // thread-safe, so a shared borrow may pass it as mutable.
        check(unsafe { sys::clm_engine_admit(&mut out, self.raw.as_ptr(), tokens.as_ptr(), tokens.len(), options) })?;
        match NonNull::new(out) {
            Some(raw) => Ok(Sequence { raw }),
            None => Err(Error::new(ErrorCode::Internal, "clm_engine_admit returned OK and no sequence")),
        }
    }

    /// What [`Engine::admit`] would take from the pool now, found without
    /// admitting (`clm_engine_plan_admission`): nothing is counted, touched,
    /// locked, allocated or evicted. A scheduler that admits only what can run
    /// to the end asks this first, so that a waiting request leaves the cache
    /// alone. The errors are `admit`'s.
    pub fn plan_admission(&self, tokens: &[i32], options: Option<&AdmitOptions<'_>>) -> Result<AdmissionPlan> {
        let raw_options = options.map(AdmitOptions::to_raw).transpose()?;
        let options_ptr = raw_options.as_ref().map_or(ptr::null(), |o| o as *const sys::clm_admit_options);
        let mut raw = sys::clm_admission_plan {
            struct_size: size_of::<sys::clm_admission_plan>() as u32,
            cached_tokens: 0,
            new_pages: 0,
            unlocked_pages: 0,
            pages_free: 0,
            evictable_tokens: 0,
        };
        // SAFETY: raw is writable for struct_size bytes; tokens is a live slice
        // of tokens.len() ids; options_ptr is NULL or a struct (and salt)
        // borrowed for the call; the engine is live.
        check(unsafe {
            sys::clm_engine_plan_admission(&mut raw, self.raw.as_ptr(), tokens.as_ptr(), tokens.len(), options_ptr)
        })?;
        Ok(AdmissionPlan {
            cached_tokens: raw.cached_tokens,
            new_pages: raw.new_pages,
            unlocked_pages: raw.unlocked_pages,
            pages_free: raw.pages_free,
            evictable_tokens: raw.evictable_tokens,
        })
    }

    /// Keeps the cached part of `tokens`' prefix (whole pages on the pool,
    /// under `options`' salt and adapter) from eviction for `ttl`
    /// (`clm_engine_pin_prefix`): each admission covering the whole prefix
    /// restarts its time; it ends by itself, or with [`Engine::unpin`]. Pins
    /// share a budget of a quarter of the pool's pages: past it the pin is
    /// `OutOfMemory` and nothing is pinned. `NotFound` when nothing of the
    /// prefix is cached; `InvalidArgument` for a bad prompt or a `ttl` outside
    /// [1 ms, 24 h].
    pub fn pin_prefix(
        &self,
        tokens: &[i32],
        options: Option<&AdmitOptions<'_>>,
        ttl: std::time::Duration,
    ) -> Result<Pin> {
        let raw_options = options.map(AdmitOptions::to_raw).transpose()?;
        let options_ptr = raw_options.as_ref().map_or(ptr::null(), |o| o as *const sys::clm_admit_options);
        // Past i64 milliseconds is past the 24 h maximum: the library refuses it.
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let (mut id, mut pinned) = (0u64, 0i32);
        // SAFETY: tokens is a live slice of tokens.len() ids; options_ptr is
        // NULL or a struct (and salt) borrowed for the call; id and pinned are
        // writable; the engine is live and thread-safe.
        check(unsafe {
            sys::clm_engine_pin_prefix(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                tokens.len(),
                options_ptr,
                ttl_ms,
                &mut id,
                &mut pinned,
            )
        })?;
        Ok(Pin { id, pinned_tokens: pinned })
    }

    /// A priority that expires (`clm_engine_hint_prefix`): sets `priority`
    /// (1 to 100) along the cached prefix of `tokens` now and back to 0 after
    /// `ttl`, unless a later hint under the same `key` (a conversation's name)
    /// replaced it. Returns the tokens of the prefix found cached.
    /// `InvalidArgument` for an empty key, a bad prompt, a priority outside
    /// [1, 100] or a `ttl` outside [1 ms, 24 h].
    pub fn hint_prefix(
        &self,
        key: &[u8],
        tokens: &[i32],
        options: Option<&AdmitOptions<'_>>,
        priority: i32,
        ttl: std::time::Duration,
    ) -> Result<i32> {
        let raw_options = options.map(AdmitOptions::to_raw).transpose()?;
        let options_ptr = raw_options.as_ref().map_or(ptr::null(), |o| o as *const sys::clm_admit_options);
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let mut reached = 0i32;
        // SAFETY: key and tokens are live slices of their lengths; options_ptr
        // is NULL or a struct (and salt) borrowed for the call; reached is
        // writable; the engine is live and thread-safe.
        check(unsafe {
            sys::clm_engine_hint_prefix(
                self.raw.as_ptr(),
                key.as_ptr().cast(),
                key.len(),
                tokens.as_ptr(),
                tokens.len(),
                options_ptr,
                priority,
                ttl_ms,
                &mut reached,
            )
        })?;
        Ok(reached)
    }

    /// Ends a pin (`clm_engine_unpin`); `NotFound` when it has ended or expired.
    pub fn unpin(&self, pin: &Pin) -> Result<()> {
        // SAFETY: the engine is live and thread-safe.
        check(unsafe { sys::clm_engine_unpin(self.raw.as_ptr(), pin.id) })
    }

    /// The pool's memory and layout (`clm_engine_kv_layout`).
    pub fn kv_layout(&self) -> Result<KvLayout> {
        // SAFETY: all-zero is a valid clm_kv_layout (NULL base).
        let mut raw: sys::clm_kv_layout = unsafe { MaybeUninit::zeroed().assume_init() };
        raw.struct_size = size_of::<sys::clm_kv_layout>() as u32;
        // SAFETY: raw is writable for struct_size bytes; the engine is live.
        check(unsafe { sys::clm_engine_kv_layout(&mut raw, self.raw.as_ptr()) })?;
        Ok(KvLayout {
            base: raw.base,
            page_bytes: raw.page_bytes,
            layer_bytes: raw.layer_bytes,
            num_pages: raw.num_pages,
            page_size: raw.page_size,
            num_layers: raw.num_layers,
            kv_heads: raw.kv_heads,
            head_dim: raw.head_dim,
            kv_dtype: known(KvDtype::from_raw(raw.kv_dtype), "kv_dtype", raw.kv_dtype)?,
            memory: known(MemoryKind::from_raw(raw.memory), "memory kind", raw.memory)?,
        })
    }

    /// A snapshot of the counters (`clm_engine_metrics`).
    pub fn metrics(&self) -> Result<Metrics> {
        let mut raw = sys::clm_metrics { struct_size: size_of::<sys::clm_metrics>() as u32, ..Default::default() };
        // SAFETY: raw is writable for struct_size bytes; the engine is live.
        check(unsafe { sys::clm_engine_metrics(&mut raw, self.raw.as_ptr()) })?;
        Ok(raw.into())
    }

    /// The metrics as Prometheus text, exposition format 0.0.4
    /// (`clm_engine_metrics_text`; the names are in `docs/metrics.md`), for
    /// a host's `GET /metrics`.
    pub fn metrics_text(&self) -> Result<String> {
        // The counters may grow between the sizing call and the next: room to spare.
        sized_text("clm_engine_metrics_text", 256, |text, capacity, length| {
            // SAFETY: text is NULL with capacity 0, or writable for capacity
            // bytes; the engine is live.
            unsafe { sys::clm_engine_metrics_text(text, capacity, length, self.raw.as_ptr()) }
        })
    }

    /// The page tables of running sequences of this engine in FlashInfer's
    /// CSR form (`clm_engine_batch_page_table`).
    pub fn batch_page_table(&self, seqs: &[&Sequence]) -> Result<PagedBatch> {
        let handles: Vec<*mut sys::clm_seq> = seqs.iter().map(|s| s.raw.as_ptr()).collect();
        let mut batch =
            PagedBatch { indptr: vec![0; seqs.len() + 1], indices: Vec::new(), last_page_len: vec![0; seqs.len()] };
        // A first guess at the page count; the library says how many it needs.
        let mut capacity = seqs.len() * 8;
        loop {
            batch.indices.resize(capacity, 0);
            let mut needed = 0usize;
            // SAFETY: every buffer is writable for the length passed (indptr
            // n + 1, last_page_len n, indices `capacity`); the handles are
            // live sequences borrowed for the call, and since Sequence is not
            // Sync no other thread uses them meanwhile.
            let status = unsafe {
                sys::clm_engine_batch_page_table(
                    batch.indptr.as_mut_ptr(),
                    batch.indices.as_mut_ptr(),
                    capacity,
                    &mut needed,
                    batch.last_page_len.as_mut_ptr(),
                    self.raw.as_ptr(),
                    handles.as_ptr(),
                    handles.len(),
                )
            };
            if status == sys::CLM_ERR_INVALID_ARGUMENT && needed > capacity {
                // Too small (nothing was written): retry with the size needed.
                capacity = needed;
                continue;
            }
            check(status)?;
            batch.indices.truncate(needed);
            return Ok(batch);
        }
    }

    /// The C handle, for calls this wrapper does not cover. It stays owned
    /// by `self`.
    pub fn as_raw(&self) -> *mut sys::clm_engine {
        self.raw.as_ptr()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: we own the handle, and no borrow of self is left.
        unsafe { sys::clm_engine_free(self.raw.as_ptr()) }
    }
}

// ---- sequences ----------------------------------------------------------------

/// One request (`clm_seq`): admitted by [`Engine::admit`], extended while
/// decoding, then finished (published to the cache) or aborted. Dropping a
/// running sequence aborts it.
///
/// `Send` but not `Sync`: clm.h allows moving a sequence handle between
/// threads but not using it from two at once. Calls that change it take
/// `&mut self`, so slices borrowed from it ([`Sequence::slots`]) cannot
/// outlive the arrays they view.
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<clmcache::Sequence>();
/// ```
///
/// ```compile_fail,E0502
/// # fn f(engine: &clmcache::Engine) -> clmcache::Result<()> {
/// let mut seq = engine.admit(&[1, 2, 3])?;
/// let slots = seq.slots();
/// seq.extend(&[4])?; // would invalidate `slots`
/// println!("{:?}", slots);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Sequence {
    raw: NonNull<sys::clm_seq>,
}

// SAFETY: clm.h: "a sequence handle must not be used by two threads at the
// same time": moving it is fine (and its engine is thread-safe), sharing is
// not, which NonNull's !Sync already keeps out.
unsafe impl Send for Sequence {}

impl Sequence {
    /// Prompt tokens that were cached at admission: their K/V is already in
    /// the pool.
    pub fn cached_tokens(&self) -> usize {
        // SAFETY: the handle is live.
        let n = unsafe { sys::clm_seq_cached_tokens(self.raw.as_ptr()) };
        n.max(0) as usize
    }

    /// Of [`Sequence::cached_tokens`], how many the admission copied in from
    /// the host tier (the rest were on the device); 0 without tiers.
    pub fn host_tokens(&self) -> usize {
        // SAFETY: the handle is live.
        let n = unsafe { sys::clm_seq_host_tokens(self.raw.as_ptr()) };
        n.max(0) as usize
    }

    /// Of [`Sequence::host_tokens`], how many the host tier had just fetched
    /// from storage for this admission (pages that an earlier
    /// [`Engine::prefetch`] had already brought in are host tokens only).
    pub fn storage_tokens(&self) -> usize {
        // SAFETY: the handle is live.
        let n = unsafe { sys::clm_seq_storage_tokens(self.raw.as_ptr()) };
        n.max(0) as usize
    }

    /// Slots (`page * page_size + row`) of the tokens added by the admission
    /// or the last [`Sequence::extend`]: where the host writes their K/V.
    /// Empty once the sequence has ended.
    pub fn slots(&self) -> &[i64] {
        let mut n = 0usize;
        // SAFETY: the handle is live. The array belongs to the sequence and
        // only changes on extend/finish/abort/free, all of which need
        // `&mut self` (or ownership), so it outlives this borrow unchanged.
        unsafe { c_slice(sys::clm_seq_slots(self.raw.as_ptr(), &mut n), n) }
    }

    /// The page table: `ceil(length / page_size)` page ids, copied.
    ///
    /// Empty once the sequence has ended (finished, aborted, or its engine
    /// dropped): its pages belong to the cache or to other sequences then.
    ///
    /// A copy, not a borrow: earlier builds of the library refreshed the
    /// array in place on each call after an extend (through a `const`
    /// handle), which would write under a slice handed out earlier.
    pub fn page_table(&self) -> Vec<i32> {
        let mut out = Vec::new();
        self.page_table_into(&mut out);
        out
    }

    /// [`Sequence::page_table`] into a caller's buffer (cleared first).
    pub fn page_table_into(&self, out: &mut Vec<i32>) {
        let mut n = 0usize;
        // SAFETY: the handle is live; the array is copied before any other
        // call on this sequence.
        let pages = unsafe { c_slice(sys::clm_seq_page_table(self.raw.as_ptr(), &mut n), n) };
        out.clear();
        out.extend_from_slice(pages);
    }

    /// Appends decoded tokens whose K/V the host will write
    /// (`clm_seq_extend`); returns their slots (as [`Sequence::slots`]).
    pub fn extend(&mut self, tokens: &[i32]) -> Result<&[i64]> {
        // SAFETY: the handle is live and exclusively borrowed; tokens is a
        // live slice of tokens.len() ids.
        check(unsafe { sys::clm_seq_extend(self.raw.as_ptr(), tokens.as_ptr(), tokens.len()) })?;
        Ok(self.slots())
    }

    /// Publishes prompt + output into the cache and ends the sequence
    /// (`clm_seq_finish`). A second finish, or one after abort, is
    /// [`ErrorCode::FailedPrecondition`].
    pub fn finish(&mut self) -> Result<()> {
        // SAFETY: the handle is live and exclusively borrowed.
        check(unsafe { sys::clm_seq_finish(self.raw.as_ptr()) })
    }

    /// Ends the sequence without caching what it computed (`clm_seq_abort`).
    pub fn abort(&mut self) -> Result<()> {
        // SAFETY: the handle is live and exclusively borrowed.
        check(unsafe { sys::clm_seq_abort(self.raw.as_ptr()) })
    }

    /// The C handle, for calls this wrapper does not cover. It stays owned
    /// by `self`; don't use it from another thread while `self` is in use.
    pub fn as_raw(&self) -> *mut sys::clm_seq {
        self.raw.as_ptr()
    }
}

impl Drop for Sequence {
    fn drop(&mut self) {
        // SAFETY: we own the handle; a running sequence is aborted first.
        unsafe { sys::clm_seq_free(self.raw.as_ptr()) }
    }
}

mod anomalies;
mod clm;
mod divergence;
mod events;
mod kernels;
mod store;
mod store_admin;
mod tiers;

pub use crate::anomalies::{ClmAnomalyReport, ClmEvent, ClmEventKind, ClmWatchSink, LowSrcKey};
pub use crate::clm::{ActDtype, Activations, ActivationsMut, AdapterOptions, Gelu, SrcDecision, SrcHeadWeights};
pub use crate::divergence::{BranchPoint, DivergenceReport};
pub use crate::events::{KvEvent, KvEventBatch, KvEventKind, KvEventSink, KvEventsBind, KvEventsLayout, KvMedium};
pub use crate::kernels::AttentionParams;
pub use crate::store::{RecordOutcome, RecordResult, SnapshotHit, SnapshotLevel, SnapshotLookup, Suffix, SuffixKey};
pub use crate::store_admin::{BlacklistEntry, SnapshotVersion};
