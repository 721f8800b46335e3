//! CLM anomalies (docs/observability.md, clm.h "CLM anomalies"): what an
//! operator watches of CLM suffix reuse. Suffix keys looked up often while
//! the SRC head keeps scoring their sequences low (a sign of a bad keyer rule
//! or a bad head), and what the snapshot store did to keys: blacklisted or
//! let go and why, versions created, drift.
//!
//! Each snapshot lookup ([`Engine::lookup_snapshots`]) records its
//! sequence's last SRC score with the key, once per sequence and key. A key
//! is *low-SRC* when, in the window, it was seen at least
//! [`crate::EngineOptions::clm_watch_min_sightings`] times with a median
//! score below [`crate::EngineOptions::clm_watch_low_src`] (scores go into
//! bins of 0.025: the median is known to 0.0125).
//!
//! ```no_run
//! use clmcache::{ClmWatchSink, Engine, EngineOptions};
//! let mut options = EngineOptions::new(4096);
//! options.snapshot_store_path = Some("/var/lib/clm/store".into());
//! // Each event, and each key turning low-SRC, as one JSON line (on the
//! // thread of the engine call that caused it: return quickly).
//! options.clm_watch_sink = Some(ClmWatchSink::new(|line| eprintln!("{}", line)));
//! let engine = Engine::new(&options)?;
//! // ... traffic: src_step, lookup_snapshots, record_snapshot ...
//! let report = engine.clm_anomalies()?;
//! for k in &report.low_src_keys {
//!     println!("{} {}: seen {} times, median SRC {:.3}", k.tenant, k.key, k.sightings, k.median_src);
//! }
//! for e in &report.events {
//!     println!("{}", e.json);
//! }
//! # Ok::<(), clmcache::Error>(())
//! ```
//!
//! [`Engine::lookup_snapshots`]: crate::Engine::lookup_snapshots
use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::{c_slice, check, sys, Engine, Error, ErrorCode, Result};

/// What happened to a key ([`ClmEvent::kind`], `CLM_WATCH_EVENT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClmEventKind {
    /// Blacklisted by the outcome breaker or an administrator:
    /// [`ClmEvent::reason`], [`ClmEvent::until_ms`], [`ClmEvent::by_breaker`].
    Blacklisted,
    /// Let go by an administrator.
    Unblacklisted,
    /// A record stored the key's first or a new version: [`ClmEvent::version`].
    VersionCreated,
    /// A version started because the key's records drifted: [`ClmEvent::version`].
    Drift,
    /// The key turned low-SRC: [`ClmEvent::sightings`], [`ClmEvent::median_src`].
    LowSrc,
    /// A kind this binding does not know (a newer library's): never read as
    /// one of the above.
    Other(i32),
}

impl ClmEventKind {
    /// The C constant. The first four index
    /// [`crate::Metrics::clm_watch_key_events`].
    pub fn raw(self) -> i32 {
        match self {
            ClmEventKind::Blacklisted => sys::CLM_WATCH_EVENT_BLACKLISTED,
            ClmEventKind::Unblacklisted => sys::CLM_WATCH_EVENT_UNBLACKLISTED,
            ClmEventKind::VersionCreated => sys::CLM_WATCH_EVENT_VERSION_CREATED,
            ClmEventKind::Drift => sys::CLM_WATCH_EVENT_DRIFT,
            ClmEventKind::LowSrc => sys::CLM_WATCH_EVENT_LOW_SRC,
            ClmEventKind::Other(raw) => raw,
        }
    }

    /// The kind of a C constant ([`ClmEventKind::Other`] for one this binding
    /// does not know).
    pub fn from_raw(raw: i32) -> ClmEventKind {
        match raw {
            sys::CLM_WATCH_EVENT_BLACKLISTED => ClmEventKind::Blacklisted,
            sys::CLM_WATCH_EVENT_UNBLACKLISTED => ClmEventKind::Unblacklisted,
            sys::CLM_WATCH_EVENT_VERSION_CREATED => ClmEventKind::VersionCreated,
            sys::CLM_WATCH_EVENT_DRIFT => ClmEventKind::Drift,
            sys::CLM_WATCH_EVENT_LOW_SRC => ClmEventKind::LowSrc,
            other => ClmEventKind::Other(other),
        }
    }
}

/// A key seen often with a low SRC score (`clm_low_src_key`), copied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LowSrcKey {
    /// The tenant's name as admitted ([`crate::AdmitOptions::tenant`]), else
    /// `"salt:"` and 32 hex digits of its salt's SHA-256 (never the salt), ""
    /// for no salt. A name that is not UTF-8 (from a C host) is converted
    /// lossily, as is the key.
    pub tenant: String,
    pub adapter_id: i32,
    /// The suffix key.
    pub key: String,
    /// Sightings in the window (one per sequence that looked the key up).
    pub sightings: u64,
    /// The middle of the 0.025 bin holding the (lower) median score: within
    /// 0.0125 of it.
    pub median_src: f32,
}

/// One thing that happened to a key (`clm_watch_event`), copied, with its
/// JSON line.
#[derive(Clone, Debug, PartialEq)]
pub struct ClmEvent {
    pub kind: ClmEventKind,
    /// Milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// As [`LowSrcKey::tenant`].
    pub tenant: String,
    pub adapter_id: i32,
    pub key: String,
    /// Blacklisted: why (the breaker's figures or the administrator's words);
    /// else "".
    pub reason: String,
    /// Blacklisted: until when (milliseconds since the Unix epoch); else 0.
    pub until_ms: i64,
    /// Blacklisted: by the outcome breaker (false: by an administrator).
    pub by_breaker: bool,
    /// Version created, drift: the key's version; else 0.
    pub version: i32,
    /// Low-SRC: the key's sightings in the window when it turned; else 0.
    pub sightings: u64,
    /// Low-SRC: its median score then (to 0.0125); else 0.
    pub median_src: f32,
    /// The event as the JSON line a [`ClmWatchSink`] got
    /// (`clm_anomaly_report_event_json`; no newline).
    pub json: String,
}

/// [`Engine::clm_anomalies`]: the low-SRC keys (the most seen first) and the
/// newest [`crate::EngineOptions::clm_watch_max_events`] events (oldest
/// first), with the settings they were made with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClmAnomalyReport {
    pub low_src_keys: Vec<LowSrcKey>,
    pub events: Vec<ClmEvent>,
    /// How far back sightings count ([`crate::EngineOptions::clm_watch_window_ms`]).
    pub window_ms: i64,
    /// [`crate::EngineOptions::clm_watch_min_sightings`].
    pub min_sightings: i64,
    /// [`crate::EngineOptions::clm_watch_low_src`].
    pub low_src: f32,
}

/// The host's receiver of CLM anomalies as JSON lines
/// ([`crate::EngineOptions::clm_watch_sink`]), e.g.
/// `{"time_ms":1796544000123,"event":"low_src","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER","sightings":20,"median_src":0.0625}`.
///
/// Called synchronously on the thread of the engine call that caused the
/// event (a snapshot lookup, record, outcome report, blacklist), in order,
/// under the engine's locks: it must return quickly and must not call the
/// engine (that deadlocks). Never called once the engine is dropped. A panic
/// in it must not unwind into C: it is caught and printed to stderr, and that
/// line is lost to the host (the engine and its report go on).
#[derive(Clone)]
pub struct ClmWatchSink(Arc<dyn Fn(&str) + Send + Sync>);

impl ClmWatchSink {
    pub fn new<F: Fn(&str) + Send + Sync + 'static>(f: F) -> ClmWatchSink {
        ClmWatchSink(Arc::new(f))
    }
}

impl fmt::Debug for ClmWatchSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClmWatchSink(..)")
    }
}

impl PartialEq for ClmWatchSink {
    /// The same closure.
    fn eq(&self, other: &ClmWatchSink) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The C callback: `user_data` is the engine's boxed [`ClmWatchSink`].
pub(crate) unsafe extern "C" fn watch_trampoline(line: *const c_char, line_len: usize, user_data: *mut c_void) {
    if user_data.is_null() {
        return;
    }
    // Nothing may unwind into C: the conversion and the sink both run inside
    // catch_unwind.
    let delivered = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: user_data is the Box<ClmWatchSink> the engine owns and keeps
        // until clm_engine_free has returned (after which no call comes);
        // line is line_len bytes of the library's, valid for the call.
        let sink = unsafe { &*(user_data as *const ClmWatchSink) };
        let bytes = unsafe { c_slice(line as *const u8, line_len) };
        let text: Cow<'_, str> = String::from_utf8_lossy(bytes);
        (sink.0)(&text)
    }));
    if delivered.is_err() {
        let _ = writeln!(std::io::stderr(), "clmcache: a CLM watch sink panicked; a JSON line is lost");
    }
}

/// The library's report, freed on drop (after the copies, or on an error).
struct RawReport(NonNull<sys::clm_anomaly_report>);

impl Drop for RawReport {
    fn drop(&mut self) {
        // SAFETY: we own the report, and no pointer into it is left.
        unsafe { sys::clm_anomaly_report_free(self.0.as_ptr()) }
    }
}

/// Bytes owned by the report as a String (lossily, should a C host have
/// passed a name that is not UTF-8).
///
/// # Safety
/// `p` is NULL or points to `len` bytes that live for the call.
unsafe fn owned(p: *const c_char, len: usize) -> String {
    // SAFETY: per the contract above.
    String::from_utf8_lossy(unsafe { c_slice(p as *const u8, len) }).into_owned()
}

/// # Safety
/// The pointers of `k` are a live report's.
unsafe fn low_src_key_from_raw(k: &sys::clm_low_src_key) -> LowSrcKey {
    LowSrcKey {
        // SAFETY (both): clm.h's entry: tenant_len and key_len bytes, owned by the report.
        tenant: unsafe { owned(k.tenant, k.tenant_len) },
        adapter_id: k.adapter_id,
        key: unsafe { owned(k.key, k.key_len) },
        sightings: k.sightings,
        median_src: k.median_src,
    }
}

/// # Safety
/// The pointers of `e` are a live report's.
unsafe fn event_from_raw(e: &sys::clm_watch_event, json: String) -> ClmEvent {
    ClmEvent {
        kind: ClmEventKind::from_raw(e.kind),
        time_ms: e.time_ms,
        // SAFETY (each): clm.h's event: *_len bytes at each pointer, owned by the report.
        tenant: unsafe { owned(e.tenant, e.tenant_len) },
        adapter_id: e.adapter_id,
        key: unsafe { owned(e.key, e.key_len) },
        reason: unsafe { owned(e.reason, e.reason_len) },
        until_ms: e.until_ms,
        by_breaker: e.by_breaker != 0,
        version: e.version,
        sightings: e.sightings,
        median_src: e.median_src,
        json,
    }
}

/// Event `index`'s JSON line (`clm_anomaly_report_event_json`): a sizing
/// call, then the line (a report does not change, so one fill is enough).
fn event_json(report: *const sys::clm_anomaly_report, index: usize) -> Result<String> {
    const F: &str = "clm_anomaly_report_event_json";
    let mut len = 0usize;
    // SAFETY: a sizing call (NULL, 0): only len is written; the report is live.
    let status = unsafe { sys::clm_anomaly_report_event_json(ptr::null_mut(), 0, &mut len, report, index) };
    // The sizing call answers InvalidArgument with the length; a line is never empty.
    if status != sys::CLM_ERR_INVALID_ARGUMENT || len == 0 {
        check(status)?;
        return Err(Error::new(ErrorCode::Internal, format!("{}: a sizing call returned OK", F)));
    }
    let mut buffer = vec![0u8; len + 1]; // and the NUL
    let mut written = 0usize;
    // SAFETY: buffer is writable for its length; the report is live.
    check(unsafe {
        sys::clm_anomaly_report_event_json(
            buffer.as_mut_ptr() as *mut c_char,
            buffer.len(),
            &mut written,
            report,
            index,
        )
    })?;
    if written != len {
        return Err(Error::new(ErrorCode::Internal, format!("{}: {} bytes, then {}", F, len, written)));
    }
    buffer.truncate(written);
    Ok(match String::from_utf8(buffer) {
        Ok(line) => line,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

impl Engine {
    /// The CLM anomalies as of now (`clm_engine_clm_anomalies`): the low-SRC
    /// keys (the most seen first) and the newest events (oldest first), each
    /// with its JSON line. Owned copies; the library's report is freed before
    /// this returns, on errors too.
    ///
    /// `FailedPrecondition` for an engine without a snapshot store, or
    /// created with [`crate::EngineOptions::clm_watch`] off.
    pub fn clm_anomalies(&self) -> Result<ClmAnomalyReport> {
        let mut out: *mut sys::clm_anomaly_report = ptr::null_mut();
        // SAFETY: out is writable; the engine is live and thread-safe.
        check(unsafe { sys::clm_engine_clm_anomalies(&mut out, self.as_raw()) })?;
        let report = match NonNull::new(out) {
            Some(report) => RawReport(report),
            None => return Err(Error::new(ErrorCode::Internal, "clm_engine_clm_anomalies returned OK and no report")),
        };
        let r = report.0.as_ptr() as *const sys::clm_anomaly_report;
        // SAFETY: the report is live until `report` drops, after the copies.
        let (n_keys, n_events, window_ms, min_sightings, low_src) = unsafe {
            (
                sys::clm_anomaly_report_low_src_count(r),
                sys::clm_anomaly_report_event_count(r),
                sys::clm_anomaly_report_window_ms(r),
                sys::clm_anomaly_report_min_sightings(r),
                sys::clm_anomaly_report_low_src(r),
            )
        };
        let mut low_src_keys = Vec::with_capacity(n_keys);
        for index in 0..n_keys {
            let mut raw = sys::clm_low_src_key::default(); // struct_size set
                                                           // SAFETY: raw is writable for struct_size bytes; the report is live.
            check(unsafe { sys::clm_anomaly_report_low_src_key(&mut raw, r, index) })?;
            // SAFETY: raw's pointers are the live report's.
            low_src_keys.push(unsafe { low_src_key_from_raw(&raw) });
        }
        let mut events = Vec::with_capacity(n_events);
        for index in 0..n_events {
            let mut raw = sys::clm_watch_event::default(); // struct_size set
                                                           // SAFETY: raw is writable for struct_size bytes; the report is live.
            check(unsafe { sys::clm_anomaly_report_event(&mut raw, r, index) })?;
            let json = event_json(r, index)?;
            // SAFETY: raw's pointers are the live report's.
            events.push(unsafe { event_from_raw(&raw, json) });
        }
        Ok(ClmAnomalyReport { low_src_keys, events, window_ms, min_sightings, low_src })
    }
}
