package clm

/*
#include <clm.h>

// As clmgo_admit (clm.go): the salt travels as its own argument, since the
// options struct may not carry a Go pointer into C.
static clm_status clmgo_prefetch(clm_engine *engine, const int32_t *tokens, size_t n_tokens, int use_options,
                                 clm_admit_options options, const char *salt, size_t salt_len) {
  options.cache_salt = salt;
  options.cache_salt_len = salt_len;
  return clm_engine_prefetch(engine, tokens, n_tokens, use_options ? &options : NULL);
}
*/
import "C"

// The tiered KV cache (clm.h "Tiered KV cache", docs/tiers.md): an engine
// created with EngineOptions.HostPages keeps copies of cached pages in a
// host-memory tier, and with EngineOptions.StorageURL in a storage tier below
// it (a directory or Redis, which several engines may share). Pages the
// device evicts stay in the lower tiers; an admission that finds them copies
// them back (Seq.HostTokens, Seq.StorageTokens). Pages are keyed by their
// whole prefix, cache salt and adapter, so no tenant reads another's pages at
// any tier.

// WritePolicy says when a cached page gets its host-tier copy and then, with
// a storage tier, its stored copy (CLM_WRITE_*).
type WritePolicy int32

const (
	// WriteThrough copies a page on its first hit (the default).
	WriteThrough WritePolicy = C.CLM_WRITE_THROUGH
	// WriteThroughSelective copies a page once it has been hit twice.
	WriteThroughSelective WritePolicy = C.CLM_WRITE_THROUGH_SELECTIVE
	// WriteBack copies a page only when the device tier evicts it.
	WriteBack WritePolicy = C.CLM_WRITE_BACK
)

// PrefetchPolicy says how long an admission waits for the pages it found in
// storage (CLM_PREFETCH_*).
type PrefetchPolicy int32

const (
	// PrefetchBestEffort does not wait: what has arrived is used, the rest
	// lands for later requests.
	PrefetchBestEffort PrefetchPolicy = C.CLM_PREFETCH_BEST_EFFORT
	// PrefetchWaitComplete waits until every page found is in.
	PrefetchWaitComplete PrefetchPolicy = C.CLM_PREFETCH_WAIT_COMPLETE
	// PrefetchTimeout waits up to PrefetchTimeoutMS +
	// PrefetchTimeoutPer1KTokensMS * tokens / 1000 (the default).
	PrefetchTimeout PrefetchPolicy = C.CLM_PREFETCH_TIMEOUT
)

// Prefetch starts fetching the pages of tokens that only storage has into
// the host tier and returns at once (clm_engine_prefetch): call it when a
// request is queued, and its Admit finds them there. The options' CacheSalt
// and AdapterID name the tenant, as in Admit; opts may be nil. Without a
// storage tier it fails with FailedPrecondition.
func (e *Engine) Prefetch(tokens []int32, opts *AdmitOptions) error {
	return e.callWithPrompt("clm_engine_prefetch", tokens, opts, func(ep *C.clm_engine, p *C.int32_t, n C.size_t,
		use C.int, copts C.clm_admit_options, salt *C.char, saltLen C.size_t) C.clm_status {
		return C.clmgo_prefetch(ep, p, n, use, copts, salt, saltLen)
	})
}

// WaitForTiers waits until the tiers' copies and the storage reads and writes
// queued so far are done (clm_engine_wait_for_tiers); without tiers it
// returns at once.
func (e *Engine) WaitForTiers() error {
	const op = "clm_engine_wait_for_tiers"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return call(op, func() C.clm_status { return C.clm_engine_wait_for_tiers(ep) })
}
