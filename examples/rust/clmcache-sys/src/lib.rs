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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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
pub struct clm_admit_options {
    pub struct_size: u32,
    pub cache_salt: *const c_char,
    pub cache_salt_len: usize,
    pub adapter_id: i32,
    pub priority: i32,
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
    pub fn clm_seq_extend(seq: *mut clm_seq, tokens: *const i32, n_tokens: usize) -> clm_status;
    pub fn clm_seq_finish(seq: *mut clm_seq) -> clm_status;
    pub fn clm_seq_abort(seq: *mut clm_seq) -> clm_status;
    pub fn clm_seq_free(seq: *mut clm_seq);

    pub fn clm_seq_cached_tokens(seq: *const clm_seq) -> i32;
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
}
