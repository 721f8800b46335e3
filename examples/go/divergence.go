package clm

/*
#include <stdint.h>
#include <clm.h>
*/
import "C"

import (
	"math"
	"unsafe"
)

// Divergence hot spots (clm.h "divergence hot spots", docs/observability.md):
// where admissions' prompts split off a longer cached path. A timestamp or a
// random id early in a system prompt makes every request leave the cache at
// the same depth, and the hit rate collapses with nothing to say why; the
// report shows that depth, per tenant, with the tokens on either side.
//
//	seq, err := engine.Admit(prompt, &clm.AdmitOptions{CacheSalt: key, Tenant: "support-bot"})
//	...
//	report, err := engine.DivergenceReport(3, 2, "") // every tenant
//	for _, p := range report.Points {
//		fmt.Printf("%s: %d splits at token %d, %d hits\n", p.Tenant, p.Branches, p.Depth, p.Hits)
//	}

// MatchDepthBounds are the upper bounds, in tokens, of the buckets 0..17 of
// Metrics.MatchDepthCounts: 0 (nothing matched), 16, 32, 64, ..., 2^20;
// bucket 18 counts the lookups above.
var MatchDepthBounds = [18]uint64{0, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12,
	1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20}

// BranchPoint is one point of a DivergenceReport (clm_branch_point), copied
// into Go memory.
type BranchPoint struct {
	// Tenant is the tenant's name as admitted (AdmitOptions.Tenant), else
	// "salt:" and 32 hex digits of its salt's SHA-256 (never the salt), ""
	// for no salt.
	Tenant    string
	AdapterID int32
	// Depth is the number of tokens from the prompt's start to the split
	// (whole pages).
	Depth int32
	// Branches counts the admissions that split off here, in the window.
	Branches uint64
	// Hits counts the admissions that went on past it into a cached branch,
	// in the window.
	Hits uint64
	// Overcount: Branches may count up to this many splits of points this
	// one displaced in the library's bounded table (0 for one never
	// displaced).
	Overcount uint64
	// Before is the prompt's tokens just before the split (up to
	// EngineOptions.DivergenceContextTokens), After those just after it, of
	// the request that split off, and CachedAfter the cached path's tokens
	// after it: what the request did not match.
	Before      []int32
	After       []int32
	CachedAfter []int32
}

// Unreused is the number of splits no later request came back past:
// Branches - Hits, at least 0. A report orders each tenant's points by it.
func (p BranchPoint) Unreused() uint64 {
	if p.Branches > p.Hits {
		return p.Branches - p.Hits
	}
	return 0
}

// DivergenceReport is Engine.DivergenceReport's answer: per tenant, the
// points with the most unreused splits first (then the most splits, then
// the deepest); tenants in the order of their first point.
type DivergenceReport struct {
	Points []BranchPoint
	// WindowMS is how far back the counts go (EngineOptions.DivergenceWindowMS).
	WindowMS int64
}

// DivergenceReport lists where admissions' prompts split off the cached
// paths over the window ending now (clm_engine_divergence_report): at most
// topPerTenant (>= 1) points per tenant, those with at least minBranches
// splits; tenant keeps one tenant's (its name, or "salt:..." for one
// admitted without a name; "" is every tenant). The points are Go copies;
// the library's report is freed before it returns. FailedPrecondition on an
// engine created with Divergence off; InvalidArgument for topPerTenant < 1.
func (e *Engine) DivergenceReport(topPerTenant int, minBranches uint64, tenant string) (*DivergenceReport, error) {
	const op = "clm_engine_divergence_report"
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	top := topPerTenant // out of int32's range: the nearest value, which the library judges
	if top > math.MaxInt32 {
		top = math.MaxInt32
	} else if top < math.MinInt32 {
		top = math.MinInt32
	}
	var report *C.clm_divergence_report
	err = call(op, func() C.clm_status {
		return C.clm_engine_divergence_report(&report, ep, C.int32_t(top), C.uint64_t(minBranches),
			stringPtr(tenant), C.size_t(len(tenant)))
	})
	if err != nil {
		return nil, err
	}
	defer C.clm_divergence_report_free(report)
	count := int(C.clm_divergence_report_count(report))
	out := &DivergenceReport{WindowMS: int64(C.clm_divergence_report_window_ms(report))}
	if count > 0 {
		out.Points = make([]BranchPoint, count)
	}
	for i := range out.Points {
		var p C.clm_branch_point
		p.struct_size = C.uint32_t(C.sizeof_clm_branch_point)
		err := call("clm_divergence_report_point", func() C.clm_status {
			return C.clm_divergence_report_point(&p, report, C.size_t(i))
		})
		if err != nil {
			return nil, err
		}
		out.Points[i] = branchPointFromC(&p)
	}
	return out, nil
}

// branchPointFromC copies a point whose pointers are a live report's.
func branchPointFromC(p *C.clm_branch_point) BranchPoint {
	out := BranchPoint{
		AdapterID:   int32(p.adapter_id),
		Depth:       int32(p.depth),
		Branches:    uint64(p.branches),
		Hits:        uint64(p.hits),
		Overcount:   uint64(p.overcount),
		Before:      tokensFromC(p.before, p.n_before),
		After:       tokensFromC(p.after, p.n_after),
		CachedAfter: tokensFromC(p.cached_after, p.n_cached_after),
	}
	if p.tenant != nil && p.tenant_len > 0 {
		out.Tenant = string(unsafe.Slice((*byte)(unsafe.Pointer(p.tenant)), int(p.tenant_len)))
	}
	return out
}

// tokensFromC is a Go copy of n tokens at p (nil for none).
func tokensFromC(p *C.int32_t, n C.size_t) []int32 {
	if p == nil || n == 0 {
		return nil
	}
	out := make([]int32, int(n))
	copy(out, unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n)))
	return out
}
