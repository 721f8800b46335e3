//! KV events for cache-aware routers (docs/fleet.md, clm.h "KV events"): an
//! engine created with [`crate::EngineOptions::kv_events`] publishes every
//! page that enters or leaves its pool ([`KvMedium::Gpu`]) or its host tier
//! ([`KvMedium::Cpu`]) as vLLM's KV events: on a ZeroMQ PUB socket by
//! default, or to a closure of the host's ([`KvEventSink`]) for a bus of its
//! own (NATS, Kafka).
//!
//! ```no_run
//! use clmcache::{Engine, EngineOptions, KvEventSink};
//! let mut options = EngineOptions::new(1024);
//! options.model_id = Some("llama-3-8b@sha256:ab12".into());
//! options.kv_events = true;
//! options.kv_events_sink = Some(KvEventSink::new(|batch| {
//!     println!("batch {}: {} events", batch.sequence, batch.events.len());
//! }));
//! let engine = Engine::new(&options).unwrap();
//! engine.flush_kv_events(std::time::Duration::from_secs(1)).unwrap();
//! ```
use std::ffi::CStr;
use std::fmt;
use std::io::Write;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::{c_slice, check, sized_text, sys, Engine, Result};

/// Whether the publisher binds its endpoint or connects to a router that does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEventsBind {
    /// A wildcard, loopback, `ipc://` or `inproc://` endpoint binds; others connect.
    Auto,
    Bind,
    Connect,
}

impl KvEventsBind {
    pub(crate) fn raw(self) -> i32 {
        match self {
            KvEventsBind::Auto => sys::CLM_KV_EVENTS_BIND_AUTO,
            KvEventsBind::Bind => sys::CLM_KV_EVENTS_BIND,
            KvEventsBind::Connect => sys::CLM_KV_EVENTS_CONNECT,
        }
    }
    pub(crate) fn from_raw(raw: i32) -> Option<KvEventsBind> {
        match raw {
            sys::CLM_KV_EVENTS_BIND_AUTO => Some(KvEventsBind::Auto),
            sys::CLM_KV_EVENTS_BIND => Some(KvEventsBind::Bind),
            sys::CLM_KV_EVENTS_CONNECT => Some(KvEventsBind::Connect),
            _ => None,
        }
    }
}

/// How each event is laid out on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEventsLayout {
    /// vLLM's tagged arrays (llm-d, AIBrix, Dynamo).
    Array,
    /// The shorter arrays llm-d-kv-cache-manager up to 2025 needs.
    Legacy,
    /// `{"type": tag, field: value}` as vLLM sends since mid-2026.
    Map,
}

impl KvEventsLayout {
    pub(crate) fn raw(self) -> i32 {
        match self {
            KvEventsLayout::Array => sys::CLM_KV_EVENTS_LAYOUT_ARRAY,
            KvEventsLayout::Legacy => sys::CLM_KV_EVENTS_LAYOUT_LEGACY,
            KvEventsLayout::Map => sys::CLM_KV_EVENTS_LAYOUT_MAP,
        }
    }
    pub(crate) fn from_raw(raw: i32) -> Option<KvEventsLayout> {
        match raw {
            sys::CLM_KV_EVENTS_LAYOUT_ARRAY => Some(KvEventsLayout::Array),
            sys::CLM_KV_EVENTS_LAYOUT_LEGACY => Some(KvEventsLayout::Legacy),
            sys::CLM_KV_EVENTS_LAYOUT_MAP => Some(KvEventsLayout::Map),
            _ => None,
        }
    }
}

/// The tier a block is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvMedium {
    /// The engine's pool, wherever its memory lives (vLLM's name for its own cache).
    Gpu,
    /// The host tier.
    Cpu,
}

impl KvMedium {
    fn raw(self) -> i32 {
        match self {
            KvMedium::Gpu => sys::CLM_KV_MEDIUM_GPU,
            KvMedium::Cpu => sys::CLM_KV_MEDIUM_CPU,
        }
    }
}

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEventKind {
    /// Pages cached on a tier.
    BlockStored,
    /// Pages that left it.
    BlockRemoved,
    /// Nothing is cached (a new engine, or a resync follows).
    AllBlocksCleared,
    /// A kind this binding does not know (a newer library's): never read as
    /// one of the above.
    Other(i32),
}

/// One change to the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEvent {
    pub kind: KvEventKind,
    pub medium: KvMedium,
    /// One per page, in path order (stored, removed).
    pub block_hashes: Vec<u64>,
    /// Stored: the page before the first; `None` at a prefix's start.
    pub parent_block_hash: Option<u64>,
    /// Stored: every page's token ids, or none (`kv_events_token_ids` off).
    pub token_ids: Vec<i32>,
    /// Stored: tokens per page.
    pub block_size: i32,
    /// Stored: the adapter, 0 for none.
    pub lora_id: i32,
    /// Stored: the tenant's salt digest (`"salt:"` and 32 hex digits), empty
    /// for the default tenant; never the salt itself.
    pub extra_key: String,
}

/// A batch of events, in the order the cache changed.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// 0, 1, 2, ... per engine, with no gaps.
    pub sequence: u64,
    /// Seconds since the epoch.
    pub ts: f64,
    pub data_parallel_rank: i32,
    pub events: Vec<KvEvent>,
}

/// The host's receiver of KV events, instead of the ZeroMQ socket. Called on
/// one thread of the library's, one batch at a time, in order; never after
/// the engine is dropped. It must not call the engine that publishes. A
/// panic in it must not unwind into C: it is caught and printed to stderr,
/// and that batch is lost to the host.
#[derive(Clone)]
pub struct KvEventSink(Arc<dyn Fn(&KvEventBatch) + Send + Sync>);

impl KvEventSink {
    pub fn new<F: Fn(&KvEventBatch) + Send + Sync + 'static>(f: F) -> KvEventSink {
        KvEventSink(Arc::new(f))
    }
}

impl fmt::Debug for KvEventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KvEventSink(..)")
    }
}

impl PartialEq for KvEventSink {
    /// The same closure.
    fn eq(&self, other: &KvEventSink) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// # Safety
/// `batch` is a batch as clm.h describes it, valid for the call.
unsafe fn batch_from_raw(batch: &sys::clm_kv_event_batch) -> KvEventBatch {
    // SAFETY (this block and the ones below): clm.h's batch: n_events events,
    // each pointing to its own counts of values and a NUL-terminated key.
    let raw_events = unsafe { c_slice(batch.events, batch.n_events) };
    let events = raw_events
        .iter()
        .map(|e| KvEvent {
            kind: match e.kind {
                sys::CLM_KV_EVENT_BLOCK_STORED => KvEventKind::BlockStored,
                sys::CLM_KV_EVENT_BLOCK_REMOVED => KvEventKind::BlockRemoved,
                sys::CLM_KV_EVENT_ALL_BLOCKS_CLEARED => KvEventKind::AllBlocksCleared,
                other => KvEventKind::Other(other),
            },
            medium: if e.medium == sys::CLM_KV_MEDIUM_CPU { KvMedium::Cpu } else { KvMedium::Gpu },
            block_hashes: unsafe { c_slice(e.block_hashes, e.n_block_hashes) }.to_vec(),
            parent_block_hash: if e.has_parent != 0 { Some(e.parent_block_hash) } else { None },
            token_ids: unsafe { c_slice(e.token_ids, e.n_token_ids) }.to_vec(),
            block_size: e.block_size,
            lora_id: e.lora_id,
            extra_key: if e.extra_key.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(e.extra_key) }.to_string_lossy().into_owned()
            },
        })
        .collect();
    KvEventBatch { sequence: batch.sequence, ts: batch.ts, data_parallel_rank: batch.data_parallel_rank, events }
}

/// The C callback: `user_data` is the engine's boxed [`KvEventSink`].
pub(crate) unsafe extern "C" fn sink_trampoline(batch: *const sys::clm_kv_event_batch, user_data: *mut c_void) {
    if batch.is_null() || user_data.is_null() {
        return;
    }
    // Nothing may unwind into C: the copy (which allocates) and the sink
    // both run inside catch_unwind.
    let delivered = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: user_data is the Box<KvEventSink> the engine owns and keeps
        // until clm_engine_free has returned (after which no call comes);
        // batch is the library's, valid for the call.
        let sink = unsafe { &*(user_data as *const KvEventSink) };
        let batch = unsafe { batch_from_raw(&*batch) };
        (sink.0)(&batch)
    }));
    if delivered.is_err() {
        // SAFETY: batch is the library's, valid for the call.
        let sequence = unsafe { (*batch).sequence };
        let _ = writeln!(std::io::stderr(), "clmcache: a KV event sink panicked; batch {} is lost", sequence);
    }
}

impl Engine {
    /// Returns once every event recorded so far is published
    /// (`clm_engine_flush_kv_events`); `FailedPrecondition` after `timeout`,
    /// or on an engine without KV events.
    pub fn flush_kv_events(&self, timeout: Duration) -> Result<()> {
        // Rounded up: a timeout under a millisecond still waits.
        let ms = i32::try_from((timeout.as_nanos() + 999_999) / 1_000_000).unwrap_or(i32::MAX);
        // SAFETY: the engine is live and thread-safe.
        check(unsafe { sys::clm_engine_flush_kv_events(self.as_raw(), ms) })
    }

    /// The hashes of every page now on `medium`, parents first
    /// (`clm_engine_kv_event_blocks`): what a subscriber that missed nothing
    /// holds for this engine.
    pub fn kv_event_blocks(&self, medium: KvMedium) -> Result<Vec<u64>> {
        let mut hashes: Vec<u64> = Vec::new();
        loop {
            let mut count = 0usize;
            let out = if hashes.is_empty() { std::ptr::null_mut() } else { hashes.as_mut_ptr() };
            // SAFETY: out is NULL with capacity 0, or writable for hashes.len() values.
            let status =
                unsafe { sys::clm_engine_kv_event_blocks(out, hashes.len(), &mut count, self.as_raw(), medium.raw()) };
            if status == sys::CLM_ERR_INVALID_ARGUMENT && count > hashes.len() {
                hashes.resize(count + 64, 0); // the cache may grow before the next call
                continue;
            }
            check(status)?;
            hashes.truncate(count);
            return Ok(hashes);
        }
    }

    /// The PUB socket's endpoint as bound (`"tcp://127.0.0.1:40123"` for a
    /// `*` port); `""` with a sink.
    pub fn kv_events_endpoint(&self) -> Result<String> {
        self.endpoint(0)
    }

    /// The replay socket's endpoint as bound; `""` without one.
    pub fn kv_events_replay_endpoint(&self) -> Result<String> {
        self.endpoint(1)
    }

    fn endpoint(&self, replay: i32) -> Result<String> {
        sized_text("clm_engine_kv_events_endpoint", 0, |text, capacity, length| {
            // SAFETY: text is NULL with capacity 0, or writable for capacity
            // bytes; the engine is live.
            unsafe { sys::clm_engine_kv_events_endpoint(text, capacity, length, self.as_raw(), replay) }
        })
    }
}
