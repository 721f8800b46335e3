//! Divergence hot spots (docs/observability.md, clm.h "divergence hot
//! spots"): where admissions' prompts split off a longer cached path. A
//! timestamp or a random id early in a system prompt makes every request
//! leave the cache at the same depth; the report shows that depth, per
//! tenant, with the tokens on either side.
//!
//! ```no_run
//! use clmcache::{AdmitOptions, Engine, EngineOptions};
//! let engine = Engine::new(&EngineOptions::new(4096))?;
//! let prompt: Vec<i32> = (0..100).collect();
//! let named = AdmitOptions { tenant: Some("support-bot"), ..AdmitOptions::salted(b"key-7") };
//! engine.admit_with(&prompt, &named)?.finish()?;
//! // ... more traffic ...
//! let report = engine.divergence_report(3, 2, None)?;
//! for p in &report.points {
//!     println!("{}: {} splits at token {}, {} hits", p.tenant, p.branches, p.depth, p.hits);
//! }
//! # Ok::<(), clmcache::Error>(())
//! ```
use std::os::raw::c_char;
use std::ptr::{self, NonNull};

use crate::{c_slice, check, sys, Engine, Error, ErrorCode, Result};

/// One branch point of a [`DivergenceReport`] (`clm_branch_point`), copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BranchPoint {
    /// The tenant's name as admitted ([`crate::AdmitOptions::tenant`]), else
    /// `"salt:"` and 32 hex digits of its salt's SHA-256 (never the salt), ""
    /// for no salt. A name that is not UTF-8 (from a C host) is converted
    /// lossily.
    pub tenant: String,
    pub adapter_id: i32,
    /// Tokens from the prompt's start to the split (whole pages).
    pub depth: i32,
    /// Admissions that split off here, in the window.
    pub branches: u64,
    /// Admissions that went on past it into a cached branch, in the window.
    pub hits: u64,
    /// `branches` may count up to this many splits of points this one
    /// displaced in the library's bounded table (0 for one never displaced).
    pub overcount: u64,
    /// The prompt's tokens just before the split (up to
    /// [`crate::EngineOptions::divergence_context_tokens`]).
    pub before: Vec<i32>,
    /// ... and just after it, of the request that split off.
    pub after: Vec<i32>,
    /// The cached path's tokens after it: what the request did not match.
    pub cached_after: Vec<i32>,
}

impl BranchPoint {
    /// Splits no later request came back past: `branches - hits`, at least
    /// 0. The report orders each tenant's points by it.
    pub fn unreused(&self) -> u64 {
        self.branches.saturating_sub(self.hits)
    }
}

/// [`Engine::divergence_report`]: per tenant, the points with the most
/// unreused splits first (then the most splits, then the deepest); tenants
/// in the order of their first point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DivergenceReport {
    pub points: Vec<BranchPoint>,
    /// How far back the counts go ([`crate::EngineOptions::divergence_window_ms`]).
    pub window_ms: i64,
}

/// The library's report, freed on drop (after the copy, or on an error).
struct RawReport(NonNull<sys::clm_divergence_report>);

impl Drop for RawReport {
    fn drop(&mut self) {
        // SAFETY: we own the report, and no pointer into it is left.
        unsafe { sys::clm_divergence_report_free(self.0.as_ptr()) }
    }
}

/// # Safety
/// The pointers of `p` are a live report's (valid for this call).
unsafe fn branch_point_from_raw(p: &sys::clm_branch_point) -> BranchPoint {
    // SAFETY (each block): clm.h's point: tenant_len bytes at tenant, and
    // n_* tokens at each array, owned by the report.
    let tenant = unsafe { c_slice(p.tenant as *const u8, p.tenant_len) };
    BranchPoint {
        tenant: String::from_utf8_lossy(tenant).into_owned(),
        adapter_id: p.adapter_id,
        depth: p.depth,
        branches: p.branches,
        hits: p.hits,
        overcount: p.overcount,
        before: unsafe { c_slice(p.before, p.n_before) }.to_vec(),
        after: unsafe { c_slice(p.after, p.n_after) }.to_vec(),
        cached_after: unsafe { c_slice(p.cached_after, p.n_cached_after) }.to_vec(),
    }
}

impl Engine {
    /// Where admissions' prompts split off the cached paths, over the window
    /// ending now (`clm_engine_divergence_report`): at most `top_per_tenant`
    /// (>= 1) points per tenant, those with at least `min_branches` splits;
    /// `tenant` keeps one tenant's (its name, or `"salt:..."` for one
    /// admitted without a name; `None` or `Some("")`: every tenant).
    ///
    /// `FailedPrecondition` on an engine created with
    /// [`crate::EngineOptions::divergence`] off; `InvalidArgument` for
    /// `top_per_tenant < 1`.
    pub fn divergence_report(
        &self,
        top_per_tenant: i32,
        min_branches: u64,
        tenant: Option<&str>,
    ) -> Result<DivergenceReport> {
        let tenant = tenant.unwrap_or("");
        let tenant_ptr = if tenant.is_empty() { ptr::null() } else { tenant.as_ptr() as *const c_char };
        let mut out: *mut sys::clm_divergence_report = ptr::null_mut();
        // SAFETY: out is writable; tenant_ptr is NULL or tenant.len() bytes
        // borrowed for the call; the engine is live and thread-safe.
        check(unsafe {
            sys::clm_engine_divergence_report(
                &mut out,
                self.as_raw(),
                top_per_tenant,
                min_branches,
                tenant_ptr,
                tenant.len(),
            )
        })?;
        let report = match NonNull::new(out) {
            Some(report) => RawReport(report),
            None => {
                return Err(Error::new(ErrorCode::Internal, "clm_engine_divergence_report returned OK and no report"))
            }
        };
        // SAFETY: the report is live until `report` drops, after the copies.
        let (count, window_ms) = unsafe {
            (
                sys::clm_divergence_report_count(report.0.as_ptr()),
                sys::clm_divergence_report_window_ms(report.0.as_ptr()),
            )
        };
        let mut points = Vec::with_capacity(count);
        for index in 0..count {
            let mut raw = sys::clm_branch_point::default(); // struct_size set
                                                            // SAFETY: raw is writable for struct_size bytes; the report is live.
            check(unsafe { sys::clm_divergence_report_point(&mut raw, report.0.as_ptr(), index) })?;
            // SAFETY: raw's pointers are the live report's.
            points.push(unsafe { branch_point_from_raw(&raw) });
        }
        Ok(DivergenceReport { points, window_ms })
    }
}
