//! The tiered KV cache (docs/tiers.md, clm.h "Tiered KV cache"): an engine
//! created with [`crate::EngineOptions::host_pages`] keeps copies of cached
//! pages in a host-memory tier, and with
//! [`crate::EngineOptions::storage_url`] in a storage tier below it (a
//! directory or Redis, which several engines may share). Pages the device
//! evicts stay in the lower tiers; an admission that finds them copies them
//! back ([`crate::Sequence::host_tokens`], [`crate::Sequence::storage_tokens`]).
//! Pages are keyed by their whole prefix, cache salt and adapter, so no
//! tenant reads another's pages at any tier.
use crate::{check, sys, AdmitOptions, Engine, Result};

impl Engine {
    /// Starts fetching the pages of `tokens` that only storage has into the
    /// host tier, and returns at once (`clm_engine_prefetch`): call it when a
    /// request is queued, and its admission finds them there. The options'
    /// salt and adapter name the tenant, as in [`Engine::admit_with`].
    ///
    /// [`crate::ErrorCode::FailedPrecondition`] without a storage tier;
    /// [`crate::ErrorCode::InvalidArgument`] for an empty prompt or a token
    /// id outside `[0, 2^31)`.
    pub fn prefetch(&self, tokens: &[i32], options: &AdmitOptions<'_>) -> Result<()> {
        let raw = options.to_raw()?;
        // SAFETY: tokens is a live slice of tokens.len() ids; raw and the
        // salt it points to are borrowed for the call; the engine is
        // thread-safe, so a shared borrow may pass it as mutable.
        check(unsafe { sys::clm_engine_prefetch(self.as_raw(), tokens.as_ptr(), tokens.len(), &raw) })
    }

    /// Waits until the tiers' copies and the storage reads and writes queued
    /// so far are done (`clm_engine_wait_for_tiers`); returns at once without
    /// tiers.
    pub fn wait_for_tiers(&self) -> Result<()> {
        // SAFETY: the engine is live and thread-safe.
        check(unsafe { sys::clm_engine_wait_for_tiers(self.as_raw()) })
    }
}
